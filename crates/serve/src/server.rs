//! The HTTP side: `/subscribe` (Jetstream v1, protocol §1–2), `/metrics`, `/healthz`, `/readyz`.
//!
//! Each subscriber is one task pulling from the shared [`Log`] at its own cursor (see `log.rs`),
//! plus a reader task for client messages. Slow-consumer policy: a subscriber has no queue, so a
//! slow one only falls behind — to the in-memory tail, then to the store — and costs no memory;
//! it is dropped (TCP closed, no close frame, counted) only when a single write blocks for more
//! than [`ServerConfig::write_timeout`] or a ping goes unanswered for
//! [`ServerConfig::pong_timeout`]. Shutdown closes every subscriber with 1001
//! `server shutting down`.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicI64};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket, WebSocketUpgrade};
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use futures_util::{SinkExt, StreamExt};
use tokio::sync::{mpsc, watch};

use crate::event::Event;
use crate::log::{Log, ReadFrom};
use crate::metrics::Metrics;
use crate::options::{parse_client_message, ClientMessage, Cursor, Filter, SubscribeOptions};

/// Largest client message (v2 closes with 1009 above it).
pub const MAX_CLIENT_MESSAGE: usize = 10_000_000;

/// Bytes of outgoing frames gathered before a socket write. Big enough that replay writes many
/// events per syscall, small enough that 1,000 subscribers cost a few MB (the buffer stays
/// allocated for the connection's life).
pub const WS_WRITE_BUFFER: usize = 16 << 10;

/// Most bytes a connection may buffer (one write buffer plus one event of any size we store).
/// Past it a write fails and the subscriber is dropped; it never grows towards it in normal
/// operation because every batch is flushed (with the write timeout) before the next is read.
pub const WS_MAX_WRITE_BUFFER: usize = 64 << 20;

/// Events kept in a subscriber's read buffer between batches when it is at the tip (replay
/// grows it to [`ServerConfig::read_batch`]; a live subscriber gives the memory back).
const IDLE_BATCH_CAPACITY: usize = 16;

/// Server settings.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Whether zstd forms are stored (a dictionary was given): `compress=true` is refused without.
    pub compression: bool,
    /// Ping interval.
    pub ping_interval: Duration,
    /// Drop a subscriber whose pong is this late.
    pub pong_timeout: Duration,
    /// Drop a subscriber when one write blocks this long.
    pub write_timeout: Duration,
    /// Events per read from the log.
    pub read_batch: usize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            compression: false,
            ping_interval: Duration::from_secs(30),
            pong_timeout: Duration::from_secs(5),
            write_timeout: Duration::from_secs(5),
            read_batch: 512,
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
    shutdown: watch::Sender<bool>,
}

impl App {
    /// New state.
    pub fn new(log: Arc<Log>, metrics: Arc<Metrics>, config: ServerConfig) -> Arc<App> {
        Arc::new(App {
            log,
            metrics,
            config,
            ready: AtomicBool::new(true),
            ingest_finished: AtomicBool::new(false),
            shutdown: watch::Sender::new(false),
        })
    }

    /// Tells every subscriber to close with 1001.
    pub fn shutdown(&self) {
        self.shutdown.send_replace(true);
    }

    /// Waits until no subscriber is connected, up to `limit`.
    pub async fn drained(&self, limit: Duration) {
        let until = tokio::time::Instant::now() + limit;
        while self.metrics.subscribers.load(Relaxed) > 0 && tokio::time::Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// The router: `/subscribe`, `/metrics`, `/healthz`, `/readyz`.
pub fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/subscribe", get(subscribe))
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(app)
}

async fn readyz(State(app): State<Arc<App>>) -> Response {
    if app.ready.load(Relaxed) {
        "ready".into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready").into_response()
    }
}

async fn metrics(State(app): State<Arc<App>>) -> Response {
    let (n, bytes) = app.log.tail_size();
    let next = app.log.next_seq();
    let text = app.metrics.render(&[
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
    ]);
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
    headers: HeaderMap,
    ws: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> Response {
    let enc = headers.get("socket-encoding").and_then(|v| v.to_str().ok());
    let opts = match SubscribeOptions::parse(query.as_deref().unwrap_or(""), enc) {
        Ok(o) => o,
        Err(e) => return bad_request(e.to_string()),
    };
    if opts.compress && !app.config.compression {
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
    // subscribers was most of the server's memory): see `WS_WRITE_BUFFER`. The read buffer keeps
    // its default: clients send little, so its pages are barely touched.
    ws.max_message_size(MAX_CLIENT_MESSAGE)
        .max_frame_size(MAX_CLIENT_MESSAGE)
        .write_buffer_size(WS_WRITE_BUFFER)
        .max_write_buffer_size(WS_MAX_WRITE_BUFFER)
        .on_upgrade(move |socket| run(app, socket, opts, start))
}

/// Resolves a cursor to a start seq (`None` = live), §4.3: inclusive; below the retention floor
/// it simply starts at the oldest retained event; in the future, live.
fn resolve(log: &Log, c: Cursor) -> Result<Option<u64>, crate::store::StoreError> {
    let next = log.next_seq();
    Ok(match c {
        Cursor::Live => None,
        Cursor::Seq(n) if n >= next => None,
        Cursor::Seq(n) => Some(n.max(1)),
        Cursor::Time(t) if t > crate::now_us() => None,
        Cursor::Time(t) => Some(log.store().seq_at_time(t)?.unwrap_or(next).min(next)),
    })
}

enum Ctl {
    /// Close with a code and reason.
    Close(u16, String),
    /// The peer went away (or the transport failed): just stop.
    Gone,
}

async fn run(app: Arc<App>, socket: WebSocket, opts: SubscribeOptions, start: Option<u64>) {
    app.metrics.subscribers.fetch_add(1, Relaxed);
    let (mut sink, mut stream) = socket.split();
    let (filter_tx, mut filter_rx) = watch::channel(Arc::new(opts.filter.clone()));
    let (ctl_tx, mut ctl_rx) = mpsc::channel::<Ctl>(2);
    let last_pong = Arc::new(AtomicI64::new(crate::now_us()));
    let pong = last_pong.clone();
    let metrics = app.metrics.clone();
    // The reader: client messages update the filter; bad ones close the connection. After asking
    // for a close it keeps reading (and ignoring) until the client's own Close arrives: a socket
    // closed with the client's close reply still unread makes the kernel send a reset, which can
    // destroy our close frame before the client reads it (seen as a flaky test).
    let reader = tokio::spawn(async move {
        let mut closing = false;
        while let Some(msg) = stream.next().await {
            match msg {
                Ok(Message::Close(_)) => break,
                Ok(_) if closing => {}
                Ok(Message::Text(t)) => match parse_client_message(t.as_bytes()) {
                    Ok(ClientMessage::Update(f)) => {
                        filter_tx.send_replace(Arc::new(f));
                    }
                    Ok(ClientMessage::Ignored) => {}
                    Err(e) => {
                        metrics.client_errors.fetch_add(1, Relaxed);
                        let _ = ctl_tx.send(Ctl::Close(e.code, e.reason)).await;
                        closing = true;
                    }
                },
                Ok(Message::Pong(_)) => pong.store(crate::now_us(), Relaxed),
                Ok(_) => {}
                Err(e) => {
                    let s = e.to_string();
                    if !closing && (s.contains("too long") || s.contains("Space limit")) {
                        metrics.client_errors.fetch_add(1, Relaxed);
                        let _ = ctl_tx
                            .send(Ctl::Close(1009, "message too big".into()))
                            .await;
                        // The rest of the oversized message is unread: nothing more to wait for.
                        return;
                    }
                    break;
                }
            }
        }
        let _ = ctl_tx.send(Ctl::Gone).await;
    });
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
    match outcome {
        Outcome::Close(code, reason) => {
            let frame = CloseFrame {
                code,
                reason: Utf8Bytes::from(reason),
            };
            let _ = tokio::time::timeout(
                app.config.write_timeout,
                sink.send(Message::Close(Some(frame))),
            )
            .await;
            // Give the client a moment to read the close frame before the socket goes.
            let _ = tokio::time::timeout(Duration::from_secs(1), ctl_rx.recv()).await;
        }
        Outcome::Drop => {
            app.metrics.slow_drops.fetch_add(1, Relaxed);
        }
        Outcome::Gone => {}
    }
    reader.abort();
    app.metrics.subscribers.fetch_sub(1, Relaxed);
}

enum Outcome {
    Close(u16, String),
    Drop,
    Gone,
}

type Sink = futures_util::stream::SplitSink<WebSocket, Message>;

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
    let mut next = start.unwrap_or_else(|| app.log.next_seq());
    let mut tip = app.log.watch();
    let mut batch: Vec<Event> = Vec::with_capacity(IDLE_BATCH_CAPACITY);
    let mut tick = tokio::time::interval(app.config.ping_interval.min(app.config.pong_timeout));
    let mut last_ping = crate::now_us();
    let mut ping_out = false;
    let m = &app.metrics;
    loop {
        batch.clear();
        let from = if app.log.in_tail(next) || next >= app.log.next_seq() {
            app.log.read(next, app.config.read_batch, &mut batch)
        } else {
            let log = app.log.clone();
            let max = app.config.read_batch;
            match tokio::task::spawn_blocking(move || {
                let mut b = Vec::with_capacity(max);
                log.read(next, max, &mut b).map(|r| (r, b))
            })
            .await
            {
                Ok(Ok((r, b))) => {
                    batch = b;
                    Ok(r)
                }
                Ok(Err(e)) => Err(e),
                Err(_) => return Outcome::Close(1011, "internal error".into()),
            }
        };
        match from {
            Err(e) => {
                tracing::error!(error = %e, "store read failed");
                return Outcome::Close(1011, "internal error".into());
            }
            Ok(ReadFrom::Store) => {
                m.replay_reads.fetch_add(1, Relaxed);
            }
            Ok(ReadFrom::Tail) => {
                m.tail_reads.fetch_add(1, Relaxed);
            }
            Ok(ReadFrom::Tip) => {}
        }
        if batch.is_empty() {
            batch.shrink_to(IDLE_BATCH_CAPACITY);
            // At the tip: wait for news, client control, shutdown or the ping timer.
            tokio::select! {
                r = tip.changed() => if r.is_err() { return Outcome::Close(1001, "server shutting down".into()) },
                c = ctl_rx.recv() => return ctl_outcome(c),
                _ = shutdown.changed() => return Outcome::Close(1001, "server shutting down".into()),
                _ = tick.tick() => {}
            }
        } else {
            let filter = filter_rx.borrow_and_update().clone();
            let mut sent = false;
            for e in &batch {
                next = e.seq() + 1;
                if !filter.wants(e) {
                    m.events_filtered.fetch_add(1, Relaxed);
                    continue;
                }
                if filter.max_size > 0 && e.json_len() > filter.max_size as usize {
                    m.events_oversize.fetch_add(1, Relaxed);
                    continue;
                }
                let msg = if opts.compress {
                    Message::Binary(e.zstd())
                } else {
                    match Utf8Bytes::try_from(e.json()) {
                        Ok(t) => Message::Text(t),
                        Err(_) => continue,
                    }
                };
                let len = if opts.compress {
                    e.zstd().len()
                } else {
                    e.json_len()
                };
                match tokio::time::timeout(app.config.write_timeout, sink.feed(msg)).await {
                    Ok(Ok(())) => {}
                    Ok(Err(_)) => return Outcome::Gone,
                    Err(_) => return Outcome::Drop,
                }
                sent = true;
                m.events_out.fetch_add(1, Relaxed);
                m.bytes_out.fetch_add(len as u64, Relaxed);
            }
            if sent {
                match tokio::time::timeout(app.config.write_timeout, sink.flush()).await {
                    Ok(Ok(())) => {}
                    Ok(Err(_)) => return Outcome::Gone,
                    Err(_) => return Outcome::Drop,
                }
            }
            // Between batches, look at control messages and shutdown without waiting.
            if let Ok(c) = ctl_rx.try_recv() {
                return ctl_outcome(Some(c));
            }
            if *shutdown.borrow() {
                return Outcome::Close(1001, "server shutting down".into());
            }
        }
        // Keepalive.
        let now = crate::now_us();
        if ping_out && last_pong.load(Relaxed) < last_ping {
            if now - last_ping > app.config.pong_timeout.as_micros() as i64 {
                return Outcome::Drop;
            }
        } else if now - last_ping > app.config.ping_interval.as_micros() as i64 {
            last_ping = now;
            ping_out = true;
            match tokio::time::timeout(
                app.config.write_timeout,
                sink.send(Message::Ping(bytes::Bytes::new())),
            )
            .await
            {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return Outcome::Gone,
                Err(_) => return Outcome::Drop,
            }
        }
    }
}

fn ctl_outcome(c: Option<Ctl>) -> Outcome {
    match c {
        Some(Ctl::Close(code, reason)) => Outcome::Close(code, reason),
        Some(Ctl::Gone) | None => Outcome::Gone,
    }
}
