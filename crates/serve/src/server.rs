//! The HTTP side: `/subscribe` (Jetstream v1, protocol §1–2), `/metrics`, `/healthz`, `/readyz`
//! (and the status page at `/`, `page.rs`);
//! Jetstream v2's `subscribeEvents` (`v2.rs`) shares this module's read path (`read_batch`),
//! writer deadlines and slow-consumer rule.
//!
//! Each subscriber is one task pulling from the shared [`Log`] at its own cursor (see `log.rs`),
//! plus a reader task for client messages. Shutdown closes every subscriber with 1001
//! `server shutting down`.
//!
//! **One loop for both wires.** `/subscribe` and `subscribeEvents` (`v2.rs`) run the same
//! subscriber loop (`stream`): read a batch, write it, flush, step aside, slow rule, control,
//! keepalive. They differ only in which events a subscriber gets and how an event becomes a
//! message (`Frames`), so a change to the loop (a pause, a rule, a read) reaches both.
//!
//! **Memory per subscriber is constant and small**, whatever the event rate and however far
//! behind the subscriber is: a 4 KiB WebSocket read buffer ([`WS_READ_BUFFER`]; clients send
//! little), a write buffer of [`WS_WRITE_BUFFER`] plus one event, and one read batch of at most
//! [`ServerConfig::read`] (256 events or 16 KiB of stored values). A batch from the in-memory
//! tail shares the tail's events, until the tail evicts them; a batch from the store is a copy
//! out of a decompressed block, which the store keeps in a small cache shared by every reader
//! (`store.rs`). A store read that finds its block cached (or in the store's unsealed events) is
//! served on the spot, like a tail read; one that must load a block goes to the blocking pool,
//! at most [`ServerConfig::store_readers`] at a time, and the readers behind it find the block
//! cached. Nothing is held across a socket write but the subscriber's own batch: a subscriber
//! whose socket drains slowly delays only itself (a permit held until a batch was written let 32
//! slow sockets starve every other reader behind the tail: `bench/results/2026-11-24-vm/saturation.md`).
//!
//! **Fair shares.** When the cores cannot keep every subscriber at the tip, what they can do
//! is shared out a batch at a time: a subscriber with more to read yields after each batch it
//! writes, so every subscriber ready to write gets one batch (at most [`ServerConfig::read`])
//! per round. (One at the tip does not: it waits for news anyway, and a yield per small live
//! batch cost ~10% of what 1,000 live subscribers were delivered.) Without
//! it a subscriber whose socket kept taking data wrote until tokio's cooperative budget ran out
//! (about a megabyte), and under saturation a few subscribers got tens of thousands of events
//! while most got a few hundred.
//!
//! **Slow consumers** (see `slow.rs`): a subscriber has no queue, so a slow one only falls behind
//! — to the in-memory tail, then to the store — and costs no more memory. It is dropped (TCP
//! closed, no close frame, counted by reason) when it is more than 100,000 events behind and its
//! cursor moved under 5 events/s for 60 s (Jetstream v2's rule, [`ServerConfig::slow`]), when a
//! single write makes no progress at all for [`ServerConfig::write_timeout`] (120 s: the peer is
//! gone), or when a ping goes unanswered for [`ServerConfig::pong_timeout`] on a connection that
//! sent no events for the write timeout (a ping waits behind what the socket holds, so on a busy
//! one the pong may take up to the write timeout: `Writer::keepalive`). A write that blocks for
//! seconds only slows that subscriber: on a loaded host, replaying readers block often, and
//! cutting them (as a 5 s write timeout did) dropped readers that were making progress.
//!
//! **Ingest comes first.** Readers and ingest share the cores. When ingest falls behind (more than
//! [`INGEST_PRESSURE`] upstream frames queued, `riptide_ingest_queue_frames`), each subscriber
//! pauses a few milliseconds after each batch it writes: fan-out does the same work in larger
//! batches and leaves CPU to verification, so the verified stream is not held back by its readers
//! (`riptide_upstream_event_age_seconds` shows how far behind the network it is).
//!
//! **Protocol violations** by a client (text that is not UTF-8, unmasked frames, reserved bits or
//! opcodes, oversized pings, a close code that is not allowed) are answered with the close code
//! RFC 6455 asks for (1007, 1002, 1009), counted in `riptide_client_errors_total`. Both wires read
//! their clients with the same task (`reader`); they differ only in what a data frame means.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket, WebSocketUpgrade};
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use futures_util::{FutureExt, SinkExt, StreamExt};
use tokio::sync::{mpsc, watch, Semaphore};
use tokio::time::Instant;

use crate::log::{Log, ReadFrom, ReadLimit};
use crate::metrics::{Metrics, SlowDrop};
use crate::options::{parse_client_message, ClientMessage, Cursor, Filter, SubscribeOptions};
use crate::slow::{SlowPolicy, SlowWatch};
use crate::Event;

/// Largest client message (v2 closes with 1009 above it).
pub const MAX_CLIENT_MESSAGE: usize = 10_000_000;

/// Bytes of outgoing frames gathered before a socket write. Big enough that replay writes about
/// ten events per syscall, small enough that 1,000 subscribers cost little: the buffer stays
/// allocated for the connection's life, and grows to this plus one frame, rounded up by `Vec`'s
/// doubling (at 16 KiB it averaged 26 KB per connection).
pub const WS_WRITE_BUFFER: usize = 8 << 10;

/// The WebSocket read buffer. tungstenite's default (128 KiB) is zero-filled on every read, so
/// it is resident for every connection: at 1,000 subscribers that alone was 125 MiB. Clients send
/// a few small messages; a large one (up to [`MAX_CLIENT_MESSAGE`]) still arrives whole, the
/// buffer growing for it.
pub const WS_READ_BUFFER: usize = 4 << 10;

/// Most bytes a connection may buffer (one write buffer plus one event of any size we store).
/// Past it a write fails and the subscriber is dropped; it never grows towards it in normal
/// operation because every batch is flushed (with the write timeout) before the next is read.
pub const WS_MAX_WRITE_BUFFER: usize = 64 << 20;

/// Events kept in a subscriber's read buffer between batches when it is at the tip (replay
/// grows it to [`ServerConfig::read`]; a live subscriber gives the memory back).
pub(crate) const IDLE_BATCH_CAPACITY: usize = 16;

/// Upstream frames waiting for ingest above which subscribers pause between batches
/// (`PRESSURE_PAUSE`): a quarter of the upstream channel (`riptide serve` uses 4096).
pub const INGEST_PRESSURE: i64 = 1024;

/// How long a subscriber pauses after a batch while ingest is under pressure.
const PRESSURE_PAUSE: Duration = Duration::from_millis(5);

/// Environment variable overriding `PRESSURE_PAUSE`, in milliseconds (0: no pause). For
/// benchmarks (`riptide bench serve --pressure-pause-ms`); not a contract of `riptide serve`.
pub const PRESSURE_PAUSE_ENV: &str = "RIPTIDE_BENCH_PRESSURE_PAUSE_MS";

/// [`PRESSURE_PAUSE`], or what [`PRESSURE_PAUSE_ENV`] says (read once).
fn pressure_pause() -> Duration {
    static PAUSE: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *PAUSE.get_or_init(|| {
        std::env::var(PRESSURE_PAUSE_ENV)
            .ok()
            .and_then(|v| v.parse().ok())
            .map_or(PRESSURE_PAUSE, Duration::from_millis)
    })
}

/// How often a blocked write stops to apply the slow-consumer rule.
const SLOW_CHECK_EVERY: Duration = Duration::from_secs(1);

/// Server settings.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Ping interval.
    pub ping_interval: Duration,
    /// Drop a subscriber whose pong is this late.
    pub pong_timeout: Duration,
    /// Drop a subscriber when one write makes no progress for this long (the connection is
    /// dead, or the client stopped reading). Shorter stalls only slow the subscriber: while a
    /// write is blocked the slow-consumer rule is applied, which drops a subscriber only when it
    /// is far behind *and* slow for a sustained window.
    pub write_timeout: Duration,
    /// How much one read (from the in-memory tail or the store) may return (events and bytes).
    pub read: ReadLimit,
    /// Store reads that must load (decompress) a block, running at once on the blocking pool.
    pub store_readers: usize,
    /// When a subscriber far behind the tip is dropped.
    pub slow: SlowPolicy,
    /// `/readyz` fails when no upstream frame arrived for this long (`None`: never for
    /// idleness). See [`readiness`].
    pub ready_max_idle: Option<Duration>,
    /// The v1 dictionary (`--zstd-dictionary`); `None`: `compress=true` is refused. An event
    /// without its zstd form (read from the store's sealed blocks, which keep only the JSON,
    /// `store.rs`, or ingested while no `compress=true` subscriber wanted the form, `crate::log`)
    /// is compressed with it when a `compress=true` subscriber is sent it.
    pub v1_dictionary: Option<crate::compress::Dictionary>,
    /// The dictionary of `/xrpc/network.bsky.jetstream.subscribeEvents`'s compression
    /// (`--zstd-dictionary-v2`); `None`: `zstdDictionary` is refused (see `v2.rs`).
    pub v2_dictionary: Option<crate::compress::Dictionary>,
    /// The archive endpoints' state (`archive.rs`); `None`: an archive with nothing sealed.
    pub archive: Option<Arc<crate::archive::Archive>>,
    /// What the server ingests from, as the status page says it (`wss://…` relays, a file, a
    /// Kafka topic); empty: nothing said.
    pub sources: Vec<String>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            ping_interval: Duration::from_secs(30),
            pong_timeout: Duration::from_secs(5),
            write_timeout: Duration::from_secs(120),
            read: ReadLimit::default(),
            store_readers: 2,
            slow: SlowPolicy::default(),
            ready_max_idle: Some(Duration::from_secs(120)),
            v1_dictionary: None,
            v2_dictionary: None,
            archive: None,
            sources: Vec::new(),
        }
    }
}

/// Shared server state.
#[derive(Debug)]
pub struct App {
    /// The log subscribers read.
    pub log: Arc<Log>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Settings.
    pub config: ServerConfig,
    /// Ready to serve (store open, ingest running).
    pub ready: AtomicBool,
    /// Set when ingest from a finite source has finished (a gauge, for tests and operators).
    pub ingest_finished: AtomicBool,
    /// The v2 endpoint's state (frame cache, compressors, its metrics).
    pub v2: crate::v2::V2,
    /// The archive endpoints' state: sealed segments, authorization, quota (`archive.rs`).
    pub archive: Arc<crate::archive::Archive>,
    /// When this state was made (the server's uptime on the status page).
    pub started: std::time::Instant,
    /// The status page's rate windows (`status::Recent`).
    pub recent: crate::status::Recent,
    pub(crate) shutdown: watch::Sender<bool>,
    store_reads: Arc<Semaphore>,
    /// Compressors of `config.v1_dictionary` (see there).
    v1_compressors: Option<crate::compress::CompressorPool>,
    /// zstd frames made when sent ([`v1_zstd`]).
    v1_zstd_at_send: AtomicU64,
    /// Subscribers whose last read came from the store (`read_ahead`).
    replaying: AtomicUsize,
}

impl App {
    /// New state.
    pub fn new(log: Arc<Log>, metrics: Arc<Metrics>, config: ServerConfig) -> Arc<App> {
        let store_reads = Arc::new(Semaphore::new(config.store_readers.max(1)));
        let v2 = crate::v2::V2::new(config.v2_dictionary.clone());
        let archive = config.archive.clone().unwrap_or_else(|| {
            Arc::new(crate::archive::Archive::new(
                Arc::new(crate::archive::SealedSegments::empty()),
                crate::archive::ArchiveConfig::default(),
            ))
        });
        let v1_compressors = config
            .v1_dictionary
            .clone()
            .map(crate::compress::CompressorPool::new);
        Arc::new(App {
            v1_compressors,
            v1_zstd_at_send: AtomicU64::new(0),
            replaying: AtomicUsize::new(0),
            v2,
            archive,
            store_reads,
            log,
            metrics,
            config,
            started: std::time::Instant::now(),
            recent: crate::status::Recent::new(tokio::time::Instant::now()),
            ready: AtomicBool::new(true),
            ingest_finished: AtomicBool::new(false),
            shutdown: watch::Sender::new(false),
        })
    }

    /// Tells every subscriber to close with 1001.
    pub fn shutdown(&self) {
        self.shutdown.send_replace(true);
    }

    /// Resolves once [`App::shutdown`] has been called: a server's graceful-shutdown signal.
    pub async fn shut_down(&self) {
        let mut rx = self.shutdown.subscribe();
        let _ = rx.wait_for(|stop| *stop).await;
    }

    /// Waits until no subscriber is connected, up to `limit`.
    pub async fn drained(&self, limit: Duration) {
        let until = crate::deadline_after(tokio::time::Instant::now(), limit);
        while self.metrics.subscribers.load(Relaxed) > 0 && tokio::time::Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// The router: the status page at `/` (`page.rs`), `/subscribe`, the v2 endpoints (`v2.rs`),
/// the archive (`archive.rs`), `/metrics`, `/healthz`, `/readyz`; behind [`crate::limits::guard`], which keeps connections of
/// the probes' reserve (and of a probes listener) to the last three.
pub fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/", get(crate::page::index))
        .route("/subscribe", get(subscribe))
        .merge(crate::v2::routes())
        .merge(crate::archive::routes())
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .layer(axum::middleware::from_fn_with_state(
            app.metrics.clone(),
            crate::limits::guard,
        ))
        .with_state(app)
}

/// Alive unless ingest has failed for good: a process whose ingest thread died must not look
/// healthy to a liveness probe (it exits soon after, but a probe may ask first).
async fn healthz(State(app): State<Arc<App>>) -> Response {
    if app.metrics.ingest_failed.load(Relaxed) {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "ingest failed: see the log; the server is exiting\n",
        )
            .into_response();
    }
    "ok".into_response()
}

async fn readyz(State(app): State<Arc<App>>) -> Response {
    match readiness(&app) {
        Ok(()) => "ready".into_response(),
        Err(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {why}\n"),
        )
            .into_response(),
    }
}

/// A Kafka publish (`serve --publish`) trying this long without a commit makes `/readyz` fail.
pub const KAFKA_PUBLISH_STALL: Duration = Duration::from_secs(15);

/// Whether the server is ready to serve a fresh, verified stream, and if not, why (the body of a
/// 503 from `/readyz`). Not ready while: the store is not open; ingest is paused because the
/// store cannot be written; an edge has not read its Kafka topic to the end yet; a Kafka publish has not
/// committed for [`KAFKA_PUBLISH_STALL`]; an upstream source is configured and not connected (the reason is
/// the client's last error, with its host); the relay said our cursor is in its future
/// (`FutureCursor`); or no upstream frame arrived for [`ServerConfig::ready_max_idle`].
/// Subscribers are still served while not ready: stored history stays readable.
pub fn readiness(app: &App) -> Result<(), String> {
    if !app.ready.load(Relaxed) {
        return Err("starting".into());
    }
    let m = &app.metrics;
    if m.ingest_failed.load(Relaxed) {
        return Err("ingest failed: see the log".into());
    }
    if m.ingest_paused.load(Relaxed) {
        return Err("ingest paused: the store cannot be written (disk full or read-only?)".into());
    }
    if m.kafka.role() == crate::KafkaRole::Edge && !m.kafka.following.load(Relaxed) {
        return Err(
            "waiting to catch up with the Kafka topic (brokers down, or still reading it)".into(),
        );
    }
    let stalled = m.kafka.publish_stalled_us(crate::now_us());
    if stalled > KAFKA_PUBLISH_STALL.as_micros() as i64 {
        return Err(format!(
            "Kafka publishing has not committed for {:.0}s (brokers down, or too few in sync?): ingest waits for it",
            stalled as f64 / 1e6
        ));
    }
    let Some(client) = m.upstream_client.get() else {
        return Ok(());
    };
    if !client.snapshot().connected {
        return Err(format!(
            "upstream not connected: {}",
            client.last_error().unwrap_or_else(|| "connecting".into())
        ));
    }
    if m.upstream_behind.load(Relaxed) {
        return Err(
            "the relay is behind our stored upstream cursor (FutureCursor): see the log".into(),
        );
    }
    if let Some(max) = app.config.ready_max_idle {
        let last = m
            .upstream_last_us
            .load(Relaxed)
            .max(m.upstream_started_us.load(Relaxed));
        let idle = (crate::now_us() - last).max(0) as u64;
        if idle > max.as_micros() as u64 {
            return Err(format!(
                "no upstream frame for {:.0}s (limit {}s)",
                idle as f64 / 1e6,
                max.as_secs()
            ));
        }
    }
    Ok(())
}

async fn metrics(State(app): State<Arc<App>>) -> Response {
    let (n, bytes) = app.log.tail_size();
    let next = app.log.next_seq();
    let zstd_help = format!(
        "1 while ingest makes each event's zstd form (a compress=true subscriber is connected or left within the last {} s); 0: it is made when sent.",
        crate::log::ZSTD_GRACE.as_secs()
    );
    let mut text = app.metrics.render(&[
        (
            "riptide_log_next_seq",
            "The next seq to be assigned.",
            next as f64,
        ),
        ("riptide_tail_events", "Events held in memory.", n as f64),
        ("riptide_tail_bytes", "Bytes held in memory.", bytes as f64),
        (
            "riptide_ingest_finished",
            "1 when a finite ingest source is exhausted.",
            app.ingest_finished.load(Relaxed) as u8 as f64,
        ),
        (
            "riptide_v1_compressed_subscribers",
            "Connected /subscribe subscribers with compress=true.",
            app.log.zstd_demand().subscribers() as f64,
        ),
        (
            "riptide_v1_zstd_at_ingest",
            &zstd_help,
            app.log.zstd_demand().wanted() as u8 as f64,
        ),
    ]);
    let cache = app.log.store().block_cache_stats();
    for (name, kind, help, v) in [
        (
            "riptide_block_cache_hits_total",
            "counter",
            "Store reads that found their block decompressed in the shared cache.",
            cache.hits,
        ),
        (
            "riptide_block_cache_loads_total",
            "counter",
            "Store blocks decompressed (reads that did not find their block cached).",
            cache.loads,
        ),
        (
            "riptide_block_cache_ahead_total",
            "counter",
            "Of the store blocks decompressed, those loaded ahead of a reader replaying them in order.",
            cache.ahead,
        ),
        (
            "riptide_block_cache_bytes",
            "gauge",
            "Bytes of decompressed store blocks held by the shared cache.",
            cache.bytes,
        ),
        (
            "riptide_v1_zstd_at_send_total",
            "counter",
            "zstd frames of /subscribe events made when sent (events without the form made at ingest).",
            app.v1_zstd_at_send.load(Relaxed),
        ),
    ] {
        crate::metrics::sample(&mut text, name, kind, help, v);
    }
    crate::metrics::render_store_integrity(&mut text, app.log.store().integrity_stats());
    crate::metrics::render_store_folding(&mut text, app.log.store().folding_stats());
    app.v2.render_metrics(&app.metrics, &mut text);
    app.archive.render_metrics(&mut text);
    ([("content-type", "text/plain; version=0.0.4")], text).into_response()
}

fn bad_request(msg: String) -> Response {
    (
        StatusCode::BAD_REQUEST,
        [("content-type", "text/plain; charset=utf-8")],
        msg,
    )
        .into_response()
}

async fn subscribe(
    State(app): State<Arc<App>>,
    RawQuery(query): RawQuery,
    long: Option<axum::Extension<crate::limits::LongQuery>>,
    headers: HeaderMap,
    ws: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> Response {
    // A query too long for a URI comes beside the request (`crate::limits`, "Long queries").
    let query = long.map(|axum::Extension(q)| q.0).or(query);
    let enc = headers.get("socket-encoding").and_then(|v| v.to_str().ok());
    let opts = match SubscribeOptions::parse(query.as_deref().unwrap_or(""), enc) {
        Ok(o) => o,
        Err(e) => return bad_request(e.to_string()),
    };
    if opts.compress && app.config.v1_dictionary.is_none() {
        return bad_request(
            "compress=true (or Socket-Encoding: zstd) is not available: this server was started without a zstd dictionary (--zstd-dictionary)".into(),
        );
    }
    let ws = match ws {
        Ok(ws) => ws,
        Err(r) => return r.into_response(),
    };
    if !app.ready.load(Relaxed) {
        return (StatusCode::SERVICE_UNAVAILABLE, "not ready").into_response();
    }
    // Resolve a replay cursor now (§2: replay starts from the cursor resolved at connect time).
    let start = match opts.cursor {
        Cursor::Live => None,
        c => {
            let log = app.log.clone();
            match tokio::task::spawn_blocking(move || resolve(&log, c)).await {
                Ok(Ok(s)) => s,
                _ => {
                    return (StatusCode::SERVICE_UNAVAILABLE, "cannot resolve the cursor")
                        .into_response()
                }
            }
        }
    };
    // Small per-connection buffers (tungstenite defaults to 128 KiB each way, which at 1,000
    // subscribers was most of the server's memory): see `WS_WRITE_BUFFER`, `WS_READ_BUFFER`.
    ws.max_message_size(MAX_CLIENT_MESSAGE)
        .max_frame_size(MAX_CLIENT_MESSAGE)
        .read_buffer_size(WS_READ_BUFFER)
        .write_buffer_size(WS_WRITE_BUFFER)
        .max_write_buffer_size(WS_MAX_WRITE_BUFFER)
        .on_upgrade(move |socket| run(app, socket, opts, start))
}

/// Resolves a cursor to a start seq (`None` = live), §4.3: inclusive; below the retention floor
/// it simply starts at the oldest retained event; in the future, live.
fn resolve(log: &Log, c: Cursor) -> Result<Option<u64>, riptide_store::store::StoreError> {
    let next = log.next_seq();
    Ok(match c {
        Cursor::Live => None,
        Cursor::Seq(n) if n >= next => None,
        Cursor::Seq(n) => Some(n.max(1)),
        Cursor::Time(t) if t > crate::now_us() => None,
        Cursor::Time(t) => Some(log.store().seq_at_time(t)?.unwrap_or(next).min(next)),
    })
}

/// The close frame (RFC 6455 §7.4.1) for a client's protocol violation, from tungstenite's error
/// text (axum hands the error over as text): 1009 for a message over the limit, 1007 for text
/// that is not UTF-8, 1002 for the rest (unmasked frames, reserved bits or opcodes, oversized or
/// fragmented control frames). `None` for the peer simply going away.
fn violation_close(error: &str) -> Option<(u16, &'static str)> {
    if error.contains("Space limit") || error.contains("too long") {
        Some((1009, "message too big"))
    } else if error.contains("UTF-8") {
        Some((1007, "invalid UTF-8 in a text message"))
    } else if error.contains("protocol error") && !error.contains("reset without closing") {
        Some((1002, "protocol error"))
    } else {
        None
    }
}

pub(crate) enum Ctl {
    /// Close with a code and reason.
    Close(u16, String),
    /// The peer went away (or the transport failed): just stop.
    Gone,
}

async fn run(app: Arc<App>, socket: WebSocket, opts: SubscribeOptions, start: Option<u64>) {
    app.metrics.subscribers.fetch_add(1, Relaxed);
    let (mut sink, stream) = socket.split();
    let (filter_tx, mut filter_rx) = watch::channel(Arc::new(opts.filter.clone()));
    let (ctl_tx, mut ctl_rx) = mpsc::channel::<Ctl>(2);
    let last_pong = Arc::new(AtomicI64::new(crate::now_us()));
    let pong = last_pong.clone();
    let metrics = app.metrics.clone();
    // Client messages update the filter; bad ones close the connection.
    let reader = reader(
        stream,
        ctl_tx,
        pong,
        move || {
            metrics.client_errors.fetch_add(1, Relaxed);
        },
        move |msg| match msg {
            Message::Text(t) => match parse_client_message(t.as_bytes()) {
                Ok(ClientMessage::Update(f)) => {
                    filter_tx.send_replace(Arc::new(f));
                    Ok(())
                }
                Ok(ClientMessage::Ignored) => Ok(()),
                Err(e) => Err((e.code, e.reason)),
            },
            _ => Ok(()),
        },
    );
    let mut shutdown = app.shutdown.subscribe();
    let outcome = serve(
        &app,
        &mut sink,
        opts,
        start,
        &mut filter_rx,
        &mut ctl_rx,
        &mut shutdown,
        &last_pong,
    )
    .await;
    let gone = matches!(outcome, Outcome::Gone);
    match outcome {
        Outcome::Close(code, reason) => close(&app, &mut sink, &mut ctl_rx, code, reason).await,
        Outcome::Drop(why) => {
            app.metrics.slow_drop(why);
            tracing::info!(reason = why.as_str(), "slow subscriber dropped");
        }
        Outcome::Gone => {}
    }
    end_reader(reader, gone).await;
    app.metrics.subscribers.fetch_sub(1, Relaxed);
}

/// The reader task of a subscriber connection, the same on both wires: a client's Close is
/// answered ([`answer_close`]); pongs are noted in `pong`; a protocol violation (as tungstenite
/// reports it) is closed with its RFC 6455 code ([`violation_close`]); a data frame goes to
/// `on_data`, which takes it (`Ok`) or asks for a close (`Err((code, reason))`). Every close
/// asked for is counted by `client_error` and sent to the subscriber loop as [`Ctl::Close`]; the
/// peer going away is [`Ctl::Gone`]. After asking for a close it keeps reading (and ignoring)
/// until the client's own Close arrives: a socket closed with the client's close reply still
/// unread makes the kernel send a reset, which can destroy our close frame before the client
/// reads it (seen as a flaky test).
pub(crate) fn reader(
    mut stream: futures_util::stream::SplitStream<WebSocket>,
    ctl_tx: mpsc::Sender<Ctl>,
    pong: Arc<AtomicI64>,
    client_error: impl Fn() + Send + 'static,
    mut on_data: impl FnMut(Message) -> Result<(), (u16, String)> + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut closing = false;
        while let Some(msg) = stream.next().await {
            match msg {
                Ok(Message::Close(_)) => {
                    answer_close(&mut stream).await;
                    break;
                }
                Ok(_) if closing => {}
                Ok(Message::Pong(_)) => pong.store(crate::now_us(), Relaxed),
                Ok(Message::Ping(_)) => {}
                Ok(m) => {
                    if let Err((code, reason)) = on_data(m) {
                        client_error();
                        let _ = ctl_tx.send(Ctl::Close(code, reason)).await;
                        closing = true;
                    }
                }
                Err(e) => {
                    if let Some((code, reason)) =
                        violation_close(&e.to_string()).filter(|_| !closing)
                    {
                        client_error();
                        let _ = ctl_tx.send(Ctl::Close(code, reason.into())).await;
                        // What follows the violation cannot be read: nothing more to wait for.
                        return;
                    }
                    break;
                }
            }
        }
        let _ = ctl_tx.send(Ctl::Gone).await;
    })
}

/// Sends a close frame, bounded by the write timeout (at most 5 s): a socket that stopped taking
/// writes gets none.
pub(crate) async fn send_close(app: &App, sink: &mut Sink, code: u16, reason: String) {
    let frame = CloseFrame {
        code,
        reason: Utf8Bytes::from(reason),
    };
    let _ = tokio::time::timeout(
        app.config.write_timeout.min(Duration::from_secs(5)),
        sink.send(Message::Close(Some(frame))),
    )
    .await;
}

/// Ends a connection the server closes ([`Outcome::Close`]), the same on both wires: the close
/// frame ([`send_close`]), then a moment (at most 1 s) for the client to read it, until the reader
/// says the client has gone, before the socket is dropped.
pub(crate) async fn close(
    app: &App,
    sink: &mut Sink,
    ctl_rx: &mut mpsc::Receiver<Ctl>,
    code: u16,
    reason: String,
) {
    send_close(app, sink, code, reason).await;
    let _ = tokio::time::timeout(Duration::from_secs(1), ctl_rx.recv()).await;
}

/// A client's Close, read: tungstenite has queued its reply (an echo, or 1002 for a code that is
/// not allowed, e.g. 999), and from now on refuses to send anything else, so the subscriber loop
/// stops at its next write. One more read sends the reply (a read writes what is queued first)
/// and sees the client hang up; bounded, for a client that does not.
pub(crate) async fn answer_close(stream: &mut futures_util::stream::SplitStream<WebSocket>) {
    let _ = tokio::time::timeout(Duration::from_secs(1), stream.next()).await;
}

/// The end of a connection's reader task. When the connection ended because its socket refused
/// a write ([`Outcome::Gone`]), the reader may be answering a client's Close ([`answer_close`]):
/// it is given the second that takes rather than aborted, or the client would get no reply. (A
/// reader whose peer went away ends at once.) Otherwise it is aborted.
pub(crate) async fn end_reader(mut reader: tokio::task::JoinHandle<()>, gone: bool) {
    if gone {
        let _ = tokio::time::timeout(Duration::from_secs(1), &mut reader).await;
    }
    reader.abort();
}

pub(crate) enum Outcome {
    Close(u16, String),
    Drop(SlowDrop),
    Gone,
}

pub(crate) type Sink = futures_util::stream::SplitSink<WebSocket, Message>;

/// One write to the socket.
pub(crate) enum Op {
    Feed(Message),
    Flush,
}

/// When the last ping went out and whether its pong is awaited.
#[derive(Debug)]
pub(crate) struct Keepalive {
    last: i64,
    out: bool,
}

impl Keepalive {
    pub(crate) fn new() -> Keepalive {
        Keepalive {
            last: crate::now_us(),
            out: false,
        }
    }
}

/// The sending half with its deadlines: every write is bounded by the write timeout, and while
/// one is blocked the slow-consumer rule is applied once a second.
pub(crate) struct Writer<'a> {
    pub(crate) sink: &'a mut Sink,
    pub(crate) app: &'a App,
    pub(crate) slow: SlowWatch,
    /// When the socket last took a batch of events (unix µs; 0: never): see
    /// [`Writer::keepalive`].
    events_flushed_us: i64,
}

impl<'a> Writer<'a> {
    /// A writer for a subscriber on `sink`.
    pub(crate) fn new(sink: &'a mut Sink, app: &'a App) -> Writer<'a> {
        Writer {
            sink,
            app,
            slow: SlowWatch::new(app.config.slow),
            events_flushed_us: 0,
        }
    }

    /// Does `op` for a subscriber whose next seq is `cursor`. The waiting (for room in the write
    /// buffer, or for a flush to complete) may be dropped half-way and redone: a feed hands its
    /// message over only once there is room, whole and without a copy (a clone per attempt made
    /// every v2 frame made at send time allocate again to be shared), and a flush keeps what it
    /// has not written.
    pub(crate) async fn run(&mut self, op: Op, cursor: u64) -> Result<(), Outcome> {
        let (msg, flush) = match op {
            Op::Feed(m) => (Some(m), false),
            Op::Flush => (None, true),
        };
        // Most writes complete at once (the write buffer has room): those need no deadline,
        // whose clock reads and timer were a tenth of a replay's CPU. One that would wait is
        // done again below, under the deadline.
        match std::future::poll_fn(|cx| wait_for(self.sink, flush, cx)).now_or_never() {
            Some(Ok(())) => return self.hand_over(msg),
            Some(Err(_)) => return Err(Outcome::Gone),
            None => {}
        }
        let deadline = crate::deadline_after(Instant::now(), self.app.config.write_timeout);
        loop {
            let wait = deadline
                .saturating_duration_since(Instant::now())
                .min(SLOW_CHECK_EVERY);
            let waiting = std::future::poll_fn(|cx| wait_for(self.sink, flush, cx));
            match tokio::time::timeout(wait, waiting).await {
                Ok(Ok(())) => return self.hand_over(msg),
                Ok(Err(_)) => return Err(Outcome::Gone),
                Err(_) if Instant::now() >= deadline => {
                    return Err(Outcome::Drop(SlowDrop::WriteTimeout))
                }
                Err(_) => self.check_slow(cursor)?,
            }
        }
    }

    /// Gives the sink a message it is ready for (a feed's second half: [`Writer::run`]).
    fn hand_over(&mut self, msg: Option<Message>) -> Result<(), Outcome> {
        match msg {
            Some(m) => self.sink.start_send_unpin(m).map_err(|_| Outcome::Gone),
            None => Ok(()),
        }
    }

    /// The end of a batch, the same on both wires: flush what was fed; step aside while ingest
    /// is behind (module docs, "Ingest comes first"); the slow-consumer rule; then control
    /// messages and shutdown, without waiting.
    pub(crate) async fn end_batch(
        &mut self,
        sent: bool,
        cursor: u64,
        ctl_rx: &mut mpsc::Receiver<Ctl>,
        shutdown: &watch::Receiver<bool>,
    ) -> Result<(), Outcome> {
        if sent {
            self.run(Op::Flush, cursor).await?;
            self.events_flushed_us = crate::now_us();
            let pause = pressure_pause();
            if self.app.metrics.ingest_queue.load(Relaxed) > INGEST_PRESSURE && !pause.is_zero() {
                // Each subscriber's next batch is the larger for it (fewer wake-ups and writes
                // per event); nothing is skipped.
                tokio::time::sleep(pause).await;
            } else if cursor < self.app.log.next_seq() {
                // Behind, with more to read: one batch per turn, the others waiting for a core
                // get theirs before this subscriber's next (module docs, "Fair shares"). At the
                // tip it waits for news anyway.
                tokio::task::yield_now().await;
            }
        }
        self.check_slow(cursor)?;
        if let Ok(c) = ctl_rx.try_recv() {
            return Err(ctl_outcome(Some(c)));
        }
        if *shutdown.borrow() {
            return Err(Outcome::Close(1001, "server shutting down".into()));
        }
        Ok(())
    }

    /// Keepalive, the same on both wires: a ping every `ping_interval`, and the subscriber
    /// dropped when a ping goes unanswered for `pong_timeout` — if the connection was idle.
    ///
    /// A ping waits behind whatever the socket's buffers still hold (megabytes, on a busy
    /// connection), so a reader working through a backlog answers it only once it has read all
    /// that: seconds late, while making progress. Under saturation that dropped readers that were
    /// reading (`pong-timeout`; on `subscribeEvents`, where frames are larger and readers further
    /// behind, nearly every one of 1,000 live subscribers). The server cannot see how much the
    /// socket still holds, so when events went out within `write_timeout` before the ping (or
    /// after it), the pong may take up to `write_timeout`, the time a connection that takes no
    /// data at all is given. A dead peer is still found: in `pong_timeout` on a connection with
    /// no events for that long, in `write_timeout` otherwise.
    pub(crate) async fn keepalive(
        &mut self,
        ping: &mut Keepalive,
        last_pong: &AtomicI64,
        cursor: u64,
    ) -> Result<(), Outcome> {
        let now = crate::now_us();
        let config = &self.app.config;
        if ping.out && last_pong.load(Relaxed) < ping.last {
            let write_timeout = config.write_timeout.as_micros() as i64;
            let busy = self.events_flushed_us > 0
                && self.events_flushed_us >= ping.last.saturating_sub(write_timeout);
            let limit = if busy {
                write_timeout
            } else {
                config.pong_timeout.as_micros() as i64
            };
            if now - ping.last > limit {
                return Err(Outcome::Drop(SlowDrop::PongTimeout));
            }
        } else if now - ping.last > config.ping_interval.as_micros() as i64 {
            ping.last = now;
            ping.out = true;
            self.run(Op::Feed(Message::Ping(bytes::Bytes::new())), cursor)
                .await?;
            self.run(Op::Flush, cursor).await?;
        }
        Ok(())
    }

    /// The slow-consumer rule, now.
    pub(crate) fn check_slow(&mut self, cursor: u64) -> Result<(), Outcome> {
        if self
            .slow
            .too_slow(crate::now_us(), cursor, self.app.log.next_seq())
        {
            return Err(Outcome::Drop(SlowDrop::Behind));
        }
        Ok(())
    }
}

/// What a write waits for: room for one more message (a feed), or everything fed written out
/// (a flush).
fn wait_for(
    sink: &mut Sink,
    flush: bool,
    cx: &mut std::task::Context<'_>,
) -> std::task::Poll<Result<(), axum::Error>> {
    if flush {
        sink.poll_flush_unpin(cx)
    } else {
        sink.poll_ready_unpin(cx)
    }
}

#[allow(clippy::too_many_arguments)]
async fn serve(
    app: &App,
    sink: &mut Sink,
    opts: SubscribeOptions,
    start: Option<u64>,
    filter_rx: &mut watch::Receiver<Arc<Filter>>,
    ctl_rx: &mut mpsc::Receiver<Ctl>,
    shutdown: &mut watch::Receiver<bool>,
    last_pong: &AtomicI64,
) -> Outcome {
    if *shutdown.borrow() {
        return Outcome::Close(1001, "server shutting down".into());
    }
    if opts.require_hello {
        // Nothing is sent until the first valid options_update (§2).
        tokio::select! {
            r = filter_rx.changed() => if r.is_err() { return Outcome::Gone },
            c = ctl_rx.recv() => return ctl_outcome(c),
            _ = shutdown.changed() => return Outcome::Close(1001, "server shutting down".into()),
        }
    }
    let next = start.unwrap_or_else(|| app.log.next_seq());
    let filter = filter_rx.borrow().clone();
    // Ingest makes the zstd form of new events while this is held (`crate::log`).
    let _wants_zstd = opts.compress.then(|| app.log.zstd_demand().join());
    let mut frames = V1Frames {
        filter,
        filter_rx,
        compress: opts.compress,
    };
    let mut w = Writer::new(sink, app);
    stream(app, &mut w, &mut frames, next, ctl_rx, shutdown, last_pong).await
}

/// What differs between `/subscribe` and `subscribeEvents` once a subscriber streams: which
/// events it gets and how each becomes a message (module docs). Everything else is [`stream`]'s.
pub(crate) trait Frames {
    /// Before each batch (`/subscribe` picks up an `options_update` here).
    fn batch(&mut self, app: &App);
    /// The message for `e` and its payload's length; `Ok(None)` when this subscriber does not
    /// get `e` (counted here), `Err` to end the connection.
    fn frame(&mut self, app: &App, e: &Event) -> Result<Option<(Message, usize)>, Outcome>;
    /// `events` messages of `bytes` bytes in all went out (the server-wide counts are
    /// [`stream`]'s).
    fn sent(&mut self, _app: &App, _events: u64, _bytes: u64) {}
    /// At the tip, waiting: let go of what is kept between batches.
    fn idle(&mut self) {}
}

/// `/subscribe`'s frames: the stored JSON as is, or its zstd frame (`compress=true`).
struct V1Frames<'a> {
    filter_rx: &'a mut watch::Receiver<Arc<Filter>>,
    filter: Arc<Filter>,
    compress: bool,
}

impl Frames for V1Frames<'_> {
    fn batch(&mut self, _app: &App) {
        self.filter = self.filter_rx.borrow_and_update().clone();
    }

    fn frame(&mut self, app: &App, e: &Event) -> Result<Option<(Message, usize)>, Outcome> {
        let m = &app.metrics;
        // `#sync` and a replacement's records are stored for v2 and never sent on v1 (protocol
        // §4.1, §7 item 8); both are counted, as Jetstream counts them.
        match e.kind() {
            riptide_jetstream::EventKind::Sync => {
                m.v1_skipped_sync.fetch_add(1, Relaxed);
                return Ok(None);
            }
            riptide_jetstream::EventKind::Replacement => {
                m.v1_skipped_replacement.fetch_add(1, Relaxed);
                return Ok(None);
            }
            _ => {}
        }
        if !self.filter.wants(e) {
            m.events_filtered.fetch_add(1, Relaxed);
            return Ok(None);
        }
        if self.filter.max_size > 0 && e.json_len() > self.filter.max_size as usize {
            m.events_oversize.fetch_add(1, Relaxed);
            return Ok(None);
        }
        if self.compress {
            let z = v1_zstd(app, e)?;
            let len = z.len();
            return Ok(Some((Message::Binary(z), len)));
        }
        match e.text() {
            Some(t) => Ok(Some((Message::Text(t.0.clone()), e.json_len()))),
            None => {
                unsendable(app, e, "stored JSON is not UTF-8");
                Ok(None)
            }
        }
    }
}

/// Counts and logs an event that cannot be sent (never expected: `Metrics::events_unsendable`).
pub(crate) fn unsendable(app: &App, e: &Event, why: &str) {
    app.metrics.events_unsendable.fetch_add(1, Relaxed);
    crate::said::say("event not sent", "riptide_events_unsendable_total", || {
        tracing::error!(seq = e.seq(), "{why}; event not sent");
    });
}

/// The subscriber loop of both wires (module docs), from seq `next` until the connection ends.
pub(crate) async fn stream<F: Frames>(
    app: &App,
    w: &mut Writer<'_>,
    frames: &mut F,
    mut next: u64,
    ctl_rx: &mut mpsc::Receiver<Ctl>,
    shutdown: &mut watch::Receiver<bool>,
    last_pong: &AtomicI64,
) -> Outcome {
    let mut tip = app.log.watch();
    let mut batch: Vec<Event> = Vec::with_capacity(IDLE_BATCH_CAPACITY);
    let mut tick = tokio::time::interval(app.config.ping_interval.min(app.config.pong_timeout));
    let mut ping = Keepalive::new();
    let m = &app.metrics;
    let mut replaying = Replaying {
        app,
        counted: false,
    };
    loop {
        batch.clear();
        if let Err(o) = read_batch(app, next, &mut batch, &mut replaying).await {
            return o;
        }
        if batch.is_empty() {
            batch.shrink_to(IDLE_BATCH_CAPACITY);
            frames.idle();
            // At the tip: wait for news, client control, shutdown or the ping timer.
            tokio::select! {
                r = tip.changed() => if r.is_err() { return Outcome::Close(1001, "server shutting down".into()) },
                c = ctl_rx.recv() => return ctl_outcome(c),
                _ = shutdown.changed() => return Outcome::Close(1001, "server shutting down".into()),
                _ = tick.tick() => {}
            }
        } else {
            frames.batch(app);
            // Counted once a batch: a thousand subscribers adding to the same counters for
            // every event was contention for nothing.
            let (mut events, mut bytes) = (0u64, 0u64);
            for e in batch.drain(..) {
                next = e.seq() + 1;
                let (msg, len) = match frames.frame(app, &e) {
                    Ok(Some(f)) => f,
                    Ok(None) => continue,
                    Err(o) => return o,
                };
                // The message's bytes are copied into the write buffer: drop our reference
                // now, so a store batch is freed while the socket drains.
                drop(e);
                if let Err(o) = w.run(Op::Feed(msg), next).await {
                    m.events_out.fetch_add(events, Relaxed);
                    m.bytes_out.fetch_add(bytes, Relaxed);
                    frames.sent(app, events, bytes);
                    return o;
                }
                events += 1;
                bytes += len as u64;
            }
            if events > 0 {
                m.events_out.fetch_add(events, Relaxed);
                m.bytes_out.fetch_add(bytes, Relaxed);
                frames.sent(app, events, bytes);
            }
            if let Err(o) = w.end_batch(events > 0, next, ctl_rx, shutdown).await {
                return o;
            }
        }
        if let Err(o) = w.keepalive(&mut ping, last_pong, next).await {
            return o;
        }
    }
}

/// The v1 zstd frame of `e`: the one made at ingest, or (an event ingested while no
/// `compress=true` subscriber wanted the form, `crate::log`, or read from a sealed block, which
/// keeps only the JSON, `store.rs`) one made now with `--zstd-dictionary`, byte for byte what
/// ingest makes (the same compressor settings).
fn v1_zstd(app: &App, e: &Event) -> Result<bytes::Bytes, Outcome> {
    if e.zstd_len() > 0 {
        return Ok(e.zstd());
    }
    app.v1_zstd_at_send.fetch_add(1, Relaxed);
    let made = match &app.v1_compressors {
        Some(pool) => pool.compress(&e.json()).map_err(|e| e.to_string()),
        None => Err("no --zstd-dictionary to compress a stored event with".into()),
    };
    made.map(bytes::Bytes::from).map_err(|why| {
        crate::said::say(
            "stored event not compressed",
            "riptide_events_unsendable_total",
            || {
                tracing::error!(seq = e.seq(), error = %why, "cannot compress a stored event");
            },
        );
        Outcome::Close(1011, "internal error".into())
    })
}

/// Reads the next batch for a subscriber whose next seq is `next` into `batch`, within
/// [`ServerConfig::read`]: from the in-memory tail, or from the store — on the spot when its
/// block is cached, else on the blocking pool, at most [`ServerConfig::store_readers`] at a time
/// (module docs). Counts the read.
async fn read_batch(
    app: &App,
    next: u64,
    batch: &mut Vec<Event>,
    replaying: &mut Replaying<'_>,
) -> Result<(), Outcome> {
    let m = &app.metrics;
    let limit = app.config.read;
    let from = match app.log.read_cached(next, limit, batch) {
        Ok(Some(r)) => Ok(r),
        Ok(None) => {
            // Its block must be loaded: on the blocking pool, rationed.
            let Ok(_reading) = app.store_reads.acquire().await else {
                return Err(Outcome::Close(1001, "server shutting down".into()));
            };
            // Loaded meanwhile by the reader before us?
            match app.log.read_cached(next, limit, batch) {
                Ok(Some(r)) => Ok(r),
                Err(e) => Err(e),
                Ok(None) => {
                    let log = app.log.clone();
                    let mut b = std::mem::take(batch);
                    match tokio::task::spawn_blocking(move || {
                        log.read(next, limit, &mut b).map(|r| (r, b))
                    })
                    .await
                    {
                        Ok(Ok((r, b))) => {
                            *batch = b;
                            Ok(r)
                        }
                        Ok(Err(e)) => Err(e),
                        Err(_) => return Err(Outcome::Close(1011, "internal error".into())),
                    }
                }
            }
        }
        Err(e) => Err(e),
    };
    match from {
        Err(e) => {
            app.metrics.store_read_failures.fetch_add(1, Relaxed);
            crate::said::say(
                "store read failed",
                "riptide_store_read_failures_total",
                || {
                    tracing::error!(error = %e, "store read failed");
                },
            );
            return Err(Outcome::Close(1011, "internal error".into()));
        }
        Ok(ReadFrom::Store) => {
            m.replay_reads.fetch_add(1, Relaxed);
            replaying.set(true);
            read_ahead(app, batch.last().map_or(next, |e| e.seq() + 1));
        }
        Ok(ReadFrom::Tail) => {
            m.tail_reads.fetch_add(1, Relaxed);
            replaying.set(false);
        }
        Ok(ReadFrom::Tip) => replaying.set(false),
    }
    Ok(())
}

/// Counts a subscriber in [`App::replaying`] while its reads come from the store.
struct Replaying<'a> {
    app: &'a App,
    counted: bool,
}

impl Replaying<'_> {
    fn set(&mut self, on: bool) {
        if on != self.counted {
            if on {
                self.app.replaying.fetch_add(1, Relaxed);
            } else {
                self.app.replaying.fetch_sub(1, Relaxed);
            }
            self.counted = on;
        }
    }
}

impl Drop for Replaying<'_> {
    fn drop(&mut self) {
        self.set(false);
    }
}

/// Loads the block after the one a store reader is in, on the blocking pool, if a store-reader
/// permit is free (a load ahead never waits for one; it holds one while it loads): the reader
/// sends what it has meanwhile, and its next read finds the block cached (`store.rs`,
/// "Read-ahead"). Only while few subscribers read the store ([`App::replaying`]): with more,
/// loads ahead evict the blocks the others are reading.
fn read_ahead(app: &App, next: u64) {
    // The permit first: without one there is nothing to claim (a claim taken and dropped at
    // once only cost the cache lock).
    let Ok(permit) = app.store_reads.clone().try_acquire_owned() else {
        return;
    };
    let readers = app.replaying.load(Relaxed);
    if let Some(ahead) = app.log.store().claim_ahead(next, readers) {
        tokio::task::spawn_blocking(move || {
            ahead.load();
            drop(permit);
        });
    }
}

pub(crate) fn ctl_outcome(c: Option<Ctl>) -> Outcome {
    match c {
        Some(Ctl::Close(code, reason)) => Outcome::Close(code, reason),
        Some(Ctl::Gone) | None => Outcome::Gone,
    }
}
