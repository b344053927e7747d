//! The upstream source of ingest: relays' `subscribeRepos` through `riptide-client`, with keys
//! resolved before a frame reaches the verifier.
//!
//! Why a module of its own: [`crate::ingest`] is source-agnostic (it takes `(seq, Bytes)` on a
//! channel); this is the one source that talks to the network. It owns three things:
//!
//! - **Connection policy** is the client's ([`riptide_client::FirehoseClient`]): round-robin
//!   host rotation, exponential backoff with full jitter reset after a healthy period, ping and
//!   idle timeout. Each binary message's `Bytes` is moved into the ingest channel unchanged (no
//!   copy between socket and verifier).
//! - **The cursor** is the store's: the client starts at [`crate::Resume::upstream_cursor`] (the
//!   cursor committed atomically with the events it covers) and keeps no cursor file of its own
//!   (`cursor_store: None`). Frames the relay sends again after a reconnect are at or below the
//!   stored cursor and are skipped (and counted) by ingest.
//! - **Warm, then verify** (when keys come from a [`Resolver`]): each frame's DID document is
//!   looked up *before* the frame is handed on, so the verifier's synchronous key lookup finds it
//!   cached. Lookups run concurrently (up to [`UpstreamConfig::lookahead`] frames in flight,
//!   coalesced per DID by the resolver) but frames leave in arrival order. A transient failure
//!   is retried [`UpstreamConfig::lookup_retries`] times; then the frame goes on and the verifier
//!   counts it `unknown-key` (never passed unverified). `#identity` drops the DID's cached
//!   document first, so the next lookup fetches the new one.
//!
//! **Seqs that go backwards.** Within one connection a relay's seqs increase. A seq at or below
//! the previous one on the same connection means the relay's numbering restarted (a relay reset
//! while we were connected, or the previous seq was forged — one frame with seq 2⁶³−1 would
//! otherwise become the cursor and every later frame would be skipped as a duplicate). Policy:
//! follow the relay. The event is counted (`riptide_upstream_seq_resets_total`), logged at error
//! with both seqs, and ingest's cursor is reset ([`crate::ingest::Upstream::CursorReset`]) so
//! the frame and those after it are ingested. Across connections, frames at or below the cursor
//! are what the store already holds (a relay replaying from further back) and are skipped and
//! counted as duplicates, with one warning per connection. A relay behind our cursor says
//! `FutureCursor`: counted (`riptide_upstream_future_cursor_total`), `/readyz` says so, and the
//! error log says what is going on.
//!
//! **A cursor no later frame can pass** (issue 40). One forged seq that is the *last* frame of
//! its connection escapes the rule above: it becomes the cursor, and then either the relay
//! answers every reconnection with `FutureCursor`, or (a relay that ignores cursors) every later
//! frame looks like a duplicate. Both are detected and recovered from without an operator, each
//! counted in `riptide_upstream_cursor_recoveries_total{reason}` and logged at error:
//! - `future-cursor`: the relay has answered `FutureCursor` for
//!   [`UpstreamConfig::future_cursor_grace`] (2 minutes) with no frame between. The client then
//!   resumes from the last *confirmed* seq (one that a higher seq followed on the same
//!   connection: a forged last frame never is), or live when there is none (after a restart),
//!   and ingest's cursor follows the relay from its next frame. A relay that was only briefly
//!   behind (a restart) answers with frames well within the grace.
//! - `live-below-cursor`: a frame at or below our cursor whose relay `time` is later than the
//!   moment we last ingested a new frame, by more than [`UpstreamConfig::clock_slack`] (a
//!   minute, for the relay's clock against ours). Such a frame cannot be one the store holds:
//!   the relay's numbering is below our cursor, and ingest follows it from that frame. The
//!   frames of the connection before it were skipped as duplicates (counted as such); with a
//!   forged cursor that is at most a minute of the relay's events.
//!
//! A negative seq (`-7`) is never a cursor: the client does not resume from it and ingest refuses
//! the frame as unsequenced.
//!
//! **Replays.** A relay that sends the frames it sent before again, on the same connection or
//! another, must not have them served twice: the rules above would take a replay that starts
//! over within a connection for a relay reset and follow it (4,164 duplicate events stored from
//! five passes over 1,000 frames with `--no-verify`, duplicate `#identity`/`#account` events even
//! when verifying, which chain state does not catch). So the fingerprints (xxh3) of the last
//! 65,536 frames handed on are kept by seq: a frame that comes again with the same seq and the
//! same bytes is a replay, counted in `riptide_upstream_replayed_total` (and skipped by ingest as
//! a duplicate), never a reset. A replay from further back than that is caught by the frames'
//! times, as above.
//!
//! `#info` frames and error frames (`FutureCursor`, `ConsumerTooSlow`; the relay closes after
//! them and the client reconnects) are logged and counted in [`Metrics`]; they carry no seq and
//! are not ingested.
//!
//! **Garbage** (frames that are not ingested because they are not frames: they do not decode,
//! or carry no seq) is counted by class where `/metrics` shows it: a frame of a known kind that
//! does not decode is a verdict (`riptide_verdicts_total{verdict="malformed"|"limits"}`, as any
//! frame that fails before verification), whether or not the client could read its seq; a frame
//! that decodes but has no seq, or of a message type this version does not know, is
//! `riptide_upstream_unsequenced_total`. A relay sending millions of them used to write a log
//! line each; now each class (`malformed`, `limits`, `unsequenced`) follows the rule of
//! [`riptide_throttle`] as every repeated warning of riptide does: the first
//! [`Throttle::FIRST`] in full, then at most one summary line a [`Throttle::EVERY`] with the
//! count not said.
//!
//! **`#info OutdatedCursor`** means the relay no longer holds our cursor: it goes on from the
//! oldest event it kept, and what lay between is lost to us. What the server does: it keeps
//! ingesting (stopping or reconnecting would not bring those events back, and would lose the
//! ones that follow too); it marks the gap, so that it is seen rather than silently served
//! around — `riptide_upstream_gaps_total` counts gaps and `riptide_upstream_gap_seqs_total` the
//! upstream seqs skipped (the first seq after the notice minus our cursor, minus one), and one
//! error-level log line names both seqs. Jetstream v1 has no way to tell subscribers (no in-band
//! notices, protocol §7.10); the server's own seqs stay gapless, so the gap is visible only
//! upstream-side. Recovering the lost events needs another source (a backfill), which is out of
//! scope here.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use futures_util::stream::{FuturesOrdered, StreamExt};
use futures_util::FutureExt;
use riptide_cbor::Arena;
use riptide_client::{
    Backoff, ClientConfig, ClientError, ClientStats, FirehoseClient, FirehoseEvent, FrameKind,
};
use riptide_firehose::verify::{peek, Verdict};
use riptide_resolver::Resolver;
use riptide_throttle::{Say, Throttle};
use tokio::sync::mpsc;

use crate::ingest::{Upstream, UpstreamFrame};
use crate::metrics::Metrics;

/// How the upstream source connects and resolves.
#[derive(Clone, Debug)]
pub struct UpstreamConfig {
    /// Relay URLs, tried round-robin (`wss://bsky.network`, `ws://127.0.0.1:PORT`, …).
    pub hosts: Vec<String>,
    /// Reconnect delays.
    pub backoff: Backoff,
    /// Warm this resolver's cache for each frame's DID before handing it on (`None`: keys come
    /// from a static file, or verification is off).
    pub resolver: Option<Resolver>,
    /// Most frames waiting for their DID lookup at once.
    pub lookahead: usize,
    /// Retries of a DID lookup that failed transiently, before the frame goes on (and is counted
    /// `unknown-key` by the verifier if the key is still missing).
    pub lookup_retries: u32,
    /// First delay between lookup retries (doubled each time).
    pub lookup_retry_delay: Duration,
    /// How long the relay may answer `FutureCursor` before our cursor is taken to be
    /// unreachable and the client resumes from the last confirmed seq (module docs).
    pub future_cursor_grace: Duration,
    /// How far ahead of ours the relay's clock may be when its `time` says a frame at or below
    /// our cursor is newer than anything stored (module docs).
    pub clock_slack: Duration,
    /// Unix microseconds (our clock) when the store last took a new frame: its last event's
    /// `time_us` (`Resume::last_time_us`). `None`: when the source starts.
    pub stored_until_us: Option<i64>,
}

impl UpstreamConfig {
    /// Defaults for `hosts`: client backoff, no resolver, 512 lookups in flight, 3 retries from
    /// 200 ms, a 2-minute `FutureCursor` grace and a minute of clock slack.
    pub fn new(hosts: Vec<String>) -> UpstreamConfig {
        UpstreamConfig {
            hosts,
            backoff: Backoff::default(),
            resolver: None,
            lookahead: 512,
            lookup_retries: 3,
            lookup_retry_delay: Duration::from_millis(200),
            future_cursor_grace: Duration::from_secs(120),
            clock_slack: Duration::from_secs(60),
            stored_until_us: None,
        }
    }
}

/// Runs the upstream source until `tx` is closed (ingest stopped). Returns an error only for a
/// configuration the client refuses (no hosts, a bad URL); network trouble is retried forever.
pub async fn run(
    cfg: UpstreamConfig,
    start_cursor: Option<u64>,
    metrics: Arc<Metrics>,
    tx: mpsc::Sender<Upstream>,
) -> Result<(), ClientError> {
    let client_cfg = ClientConfig {
        backoff: cfg.backoff,
        start_cursor: start_cursor.map(|c| c.min(i64::MAX as u64) as i64),
        cursor_store: None,
        ..ClientConfig::with_hosts(cfg.hosts.clone())
    };
    let client = FirehoseClient::new(client_cfg)?;
    tracing::info!(hosts = ?cfg.hosts, cursor = ?start_cursor, "upstream: connecting");
    metrics
        .upstream_start_cursor
        .store(start_cursor.unwrap_or(0), Relaxed);
    let _ = metrics.upstream_client.set(client.stats());
    metrics.upstream_started_us.store(crate::now_us(), Relaxed);
    let seqs = Seqs {
        last: start_cursor,
        fresh_us: cfg.stored_until_us.unwrap_or_else(crate::now_us),
        grace: cfg.future_cursor_grace,
        slack_us: i64::try_from(cfg.clock_slack.as_micros()).unwrap_or(i64::MAX),
        ..Seqs::default()
    };
    let Some(res) = cfg.resolver.clone() else {
        // Nothing to wait for between socket and ingest: read and hand on in one task (a task
        // and a channel between them cost a wake-up and a hand-off per frame).
        forward_direct(client, &metrics, seqs, &tx).await;
        return Ok(());
    };
    // The client is the reader's; a resume point chosen by `admit` reaches it through this.
    let resume: Arc<std::sync::Mutex<Option<Option<u64>>>> = Arc::default();
    let resume_rd = resume.clone();
    // The client runs on a task of its own, so nothing ever cancels it mid-connect (the
    // resolving loop below selects between reading and handing on).
    let (ev_tx, ev_rx) = mpsc::channel::<FirehoseEvent>(cfg.lookahead.max(1));
    let stats_metrics = metrics.clone();
    let reader = tokio::spawn(async move {
        let mut client = client;
        let stats = client.stats();
        loop {
            if let Some(c) = resume_rd
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .take()
            {
                client.resume_from(c.map(|c| c.min(i64::MAX as u64) as i64));
            }
            let ev = next_event(&mut client, &stats, &stats_metrics).await;
            if ev_tx.send(ev).await.is_err() {
                return;
            }
        }
    });
    forward_resolving(&cfg, res, ev_rx, &metrics, seqs, &resume, &tx).await;
    reader.abort();
    Ok(())
}

/// The client's next event, with its connection counters (`stats`, the client's own, taken once:
/// not a reference count per frame) copied into `metrics`.
async fn next_event(
    client: &mut FirehoseClient,
    stats: &ClientStats,
    metrics: &Metrics,
) -> FirehoseEvent {
    let ev = client.next().await;
    let s = stats.snapshot();
    metrics.upstream_connects.store(s.connects, Relaxed);
    metrics
        .upstream_connect_failures
        .store(s.connect_failures, Relaxed);
    ev
}

/// Upstream seqs seen, for spotting the gap an `OutdatedCursor` announces and seqs that go
/// backwards.
#[derive(Debug, Default)]
struct Seqs {
    /// The last upstream seq handed on (or the cursor we started from).
    last: Option<u64>,
    /// An `OutdatedCursor` arrived and the next frame has not yet shown where the relay resumed.
    outdated: bool,
    /// The connection the last frame came on ([`FirehoseEvent::connection`]).
    conn: u64,
    /// The last seq received on that connection.
    prev: Option<u64>,
    /// The highest seq that a higher one followed on the same connection: a resume point the
    /// relay's numbering has confirmed (a forged last frame never is).
    confirmed: Option<u64>,
    /// Our clock when the last new frame (above the cursor) was handed on.
    fresh_us: i64,
    /// When the relay's run of `FutureCursor` answers began (cleared by any frame).
    future_since: Option<std::time::Instant>,
    /// The client was told to resume below the cursor: the next frame at or below it starts the
    /// relay's numbering for ingest.
    follow: bool,
    /// Frames at or below the cursor on this connection so far (said when it ends in a reset).
    below: u64,
    /// [`UpstreamConfig::future_cursor_grace`].
    grace: Duration,
    /// [`UpstreamConfig::clock_slack`] in microseconds.
    slack_us: i64,
    /// A resume point for the client, for its owner to apply ([`FirehoseClient::resume_from`]).
    resume: Option<Option<u64>>,
    /// The frames handed on lately (module docs, "Replays").
    recent: Recent,
    /// What was said about garbage (module docs, "Garbage").
    garbage: Throttle,
    /// Tape storage for reading frames' `time` below the cursor (and, when resolving, their
    /// DIDs), kept here with the loop's state so a relay replaying a long stretch below our
    /// cursor costs no allocation per frame.
    arena: Arena,
}

/// The fingerprints (xxh3 of the bytes) of the last [`Recent::CAP`] frames handed on, by seq:
/// a frame that comes again with the same seq and bytes is a relay's replay, whatever the
/// connection (module docs, "Replays").
#[derive(Debug, Default)]
struct Recent {
    by_seq: std::collections::HashMap<u64, u64>,
    order: std::collections::VecDeque<u64>,
}

impl Recent {
    /// Frames remembered: a relay replaying further back than this is caught by the frames'
    /// times instead (or, for commits, by chain state).
    const CAP: usize = 1 << 16;

    fn fingerprint(bytes: &[u8]) -> u64 {
        xxhash_rust::xxh3::xxh3_64(bytes)
    }

    /// Whether this exact frame was handed on already.
    fn holds(&self, seq: u64, fp: u64) -> bool {
        self.by_seq.get(&seq) == Some(&fp)
    }

    fn insert(&mut self, seq: u64, fp: u64) {
        if self.by_seq.insert(seq, fp).is_none() {
            self.order.push_back(seq);
            if self.order.len() > Self::CAP {
                if let Some(old) = self.order.pop_front() {
                    self.by_seq.remove(&old);
                }
            }
        }
    }
}

/// Says (or counts) one garbage frame of `class` (module docs, "Garbage"), by the rule of
/// [`Throttle`] per class: `full` logs the frame in full, a summary says how many of the class
/// went unsaid. The metrics count every one.
fn say_garbage(throttle: &Throttle, class: &'static str, now: Instant, full: impl FnOnce()) -> Say {
    let say = throttle.say_at(class, now);
    match say {
        Say::Full => full(),
        Say::Quiet => {}
        Say::Summary { suppressed, total } => tracing::warn!(
            class,
            suppressed,
            total,
            "upstream frames not ingested ({class}): {suppressed} more not said since the last line, {total} in all \
             (riptide_verdicts_total, riptide_upstream_unsequenced_total; each class is said in full only the first {} times, \
             then at most once every {} s)",
            Throttle::FIRST,
            Throttle::EVERY.as_secs(),
        ),
    }
    say
}

/// The relay's `time` of a frame, in Unix microseconds, if it has a readable one.
fn frame_time_us(arena: &mut Arena, bytes: &[u8]) -> Option<i64> {
    let t = riptide_firehose::verify::peek_time(arena, bytes)?;
    riptide_syntax::Datetime::parse(t)
        .ok()
        .map(|d| d.timestamp_micros())
}

/// The verdict on a frame that is not ingested because it does not decode (as the decoder
/// classes it); `None` when it does decode.
fn garbage_verdict(bytes: &[u8]) -> Option<Verdict> {
    match riptide_firehose::FrameDecoder::new().decode(bytes) {
        Err(e) => Some(Verdict::of_frame_error(&e)),
        Ok(_) => None,
    }
}

/// What to hand ingest for one event.
type Admitted = Option<(bool, UpstreamFrame)>;

/// What to do with one event: ingest it as `(seq, bytes)`, or not (counted and logged here).
/// `true` with the frame: the relay's numbering went backwards within a connection, and the frame
/// is to be preceded by [`Upstream::CursorReset`] (module docs: "Seqs that go backwards").
fn admit(ev: FirehoseEvent, metrics: &Metrics, seqs: &mut Seqs) -> Admitted {
    match ev.kind {
        FrameKind::Info | FrameKind::Error => {
            let (name, msg) = ev
                .notice
                .as_ref()
                .map(|n| (n.name.as_str(), n.message.as_deref().unwrap_or("")))
                .unwrap_or(("?", ""));
            if ev.kind == FrameKind::Info {
                metrics.upstream_info.fetch_add(1, Relaxed);
                if name == "OutdatedCursor" {
                    metrics.upstream_gaps.fetch_add(1, Relaxed);
                    seqs.outdated = true;
                    tracing::error!(
                        cursor = seqs.last,
                        message = msg,
                        host = ev.host,
                        "upstream: our cursor is older than the relay holds; events are lost, continuing from its oldest"
                    );
                } else {
                    // A relay may send any number of these: said by the garbage rule (issue 39).
                    match seqs.garbage.say("info") {
                        Say::Full => {
                            tracing::warn!(name, message = msg, host = ev.host, "upstream #info")
                        }
                        Say::Summary { suppressed, total } => tracing::warn!(
                            name, message = msg, host = ev.host, suppressed, total,
                            "upstream #info frames: {suppressed} more not said since the last line, \
                             {total} in all (riptide_upstream_info_total)"
                        ),
                        Say::Quiet => {}
                    }
                }
            } else if name == "FutureCursor" {
                metrics.upstream_errors.fetch_add(1, Relaxed);
                metrics.upstream_future_cursor.fetch_add(1, Relaxed);
                metrics.upstream_behind.store(true, Relaxed);
                let first = seqs.future_since.is_none();
                let since = *seqs
                    .future_since
                    .get_or_insert_with(std::time::Instant::now);
                if since.elapsed() >= seqs.grace {
                    // Module docs: "A cursor no later frame can pass".
                    seqs.future_since = None;
                    // Taken once: if the relay is behind even that (a relay reset to a lower
                    // numbering), the next recovery goes live.
                    let to = seqs
                        .confirmed
                        .take()
                        .filter(|&c| seqs.last.is_some_and(|l| c < l));
                    seqs.follow = true;
                    seqs.resume = Some(to);
                    metrics.upstream_cursor_recoveries[0].fetch_add(1, Relaxed);
                    tracing::error!(
                        cursor = seqs.last,
                        resume_from = to,
                        host = ev.host,
                        "the relay has answered FutureCursor for {:?}: our cursor is unreachable (a forged seq, or a relay that lost its history). \
                         Resuming {} and following the relay's numbering from there (riptide_upstream_cursor_recoveries_total{{reason=\"future-cursor\"}})",
                        seqs.grace,
                        to.map_or_else(|| "live (no confirmed seq since start)".to_string(), |c| format!("after seq {c}, the last one the relay confirmed")),
                    );
                } else if first {
                    // Once per run of answers (the client asks again after each, with backoff).
                    tracing::error!(
                        cursor = seqs.last,
                        message = msg,
                        host = ev.host,
                        "the relay is behind our upstream cursor {} (FutureCursor): it was restarted, it is not the relay this store followed, \
                         or a forged seq became our cursor. Nothing is ingested until it catches up; if it still is in {:?}, the cursor is taken \
                         to be unreachable and ingest resumes below it. To follow this relay now, restart with `--reset-upstream-cursor` \
                         (with `--upstream-cursor N` to pick a start, else live), or use a fresh --data directory",
                        seqs.last.map_or_else(|| "?".to_string(), |c| c.to_string()),
                        seqs.grace,
                    );
                }
            } else {
                metrics.upstream_errors.fetch_add(1, Relaxed);
                tracing::warn!(
                    name,
                    message = msg,
                    host = ev.host,
                    "upstream error frame (the relay closes; reconnecting)"
                );
            }
            None
        }
        FrameKind::Invalid => {
            // Not a frame (the client's peek could not read it): classified as the decoder
            // would, so it shows in `riptide_verdicts_total{malformed|limits}` like any other
            // frame that fails before verification.
            let v = garbage_verdict(&ev.bytes).unwrap_or(Verdict::Malformed);
            metrics.verdict(v);
            let after = seqs.last;
            say_garbage(&seqs.garbage, v.as_str(), Instant::now(), || {
                tracing::warn!(
                    verdict = %v,
                    len = ev.bytes.len(),
                    after,
                    "upstream frame does not decode: not ingested"
                )
            });
            None
        }
        _ => match ev.seq.and_then(|s| u64::try_from(s).ok()) {
            Some(seq) => sequenced(seq, ev, metrics, seqs),
            None => {
                // No seq: nothing to resume from and nothing a consumer could place. A frame of a
                // known kind without one does not decode either: a verdict, as above.
                let v = match ev.kind {
                    FrameKind::Unknown => None,
                    _ => garbage_verdict(&ev.bytes),
                };
                match v {
                    Some(v) => metrics.verdict(v),
                    None => {
                        metrics.upstream_unsequenced.fetch_add(1, Relaxed);
                    }
                }
                let class = v.map_or("unsequenced", Verdict::as_str);
                say_garbage(&seqs.garbage, class, Instant::now(), || {
                    tracing::warn!(
                        kind = ev.kind.as_str(),
                        len = ev.bytes.len(),
                        class,
                        "upstream frame without a seq: not ingested"
                    )
                });
                None
            }
        },
    }
}

/// [`admit`] for a frame with a seq: the rules of the module docs ("Seqs that go backwards",
/// "A cursor no later frame can pass", "Replays"), in that order of precedence: a replay is
/// never a reset, a reset within a connection needs no more evidence, and a frame at or below
/// the cursor on a new connection is new only when the client was told to resume below it or its
/// time proves it.
fn sequenced(seq: u64, ev: FirehoseEvent, metrics: &Metrics, seqs: &mut Seqs) -> Admitted {
    metrics.upstream_behind.store(false, Relaxed);
    seqs.future_since = None;
    let new_conn = ev.connection != seqs.conn;
    if new_conn {
        seqs.conn = ev.connection;
        seqs.prev = None;
        seqs.below = 0;
    }
    let below = seqs.last.is_some_and(|c| seq <= c);
    let fp = Recent::fingerprint(&ev.bytes);
    let mut reset = false;
    if seqs.recent.holds(seq, fp) {
        // A replay: the same frame at the same seq, handed on already. Skipped (and
        // counted) by ingest as a duplicate; no reset, whatever went before.
        metrics.upstream_replayed.fetch_add(1, Relaxed);
        if seqs.below == 0 {
            tracing::warn!(
                seq,
                cursor = seqs.last,
                host = ev.host,
                "the relay sent seq {seq} again, byte for byte: skipping its replay (riptide_upstream_replayed_total)"
            );
        }
        seqs.below += 1;
        seqs.prev = Some(seq);
        return Some((false, (seq, ev.bytes)));
    } else if seqs.prev.is_some_and(|p| seq <= p) {
        reset = true;
        metrics.upstream_seq_resets.fetch_add(1, Relaxed);
        tracing::error!(
            seq,
            previous = seqs.prev,
            host = ev.host,
            "upstream seqs went backwards within one connection (the relay was reset, or the previous seq was forged): \
             following the relay's numbering from here (riptide_upstream_seq_resets_total)"
        );
    } else if below && std::mem::take(&mut seqs.follow) {
        // The client resumed below the cursor on purpose (FutureCursor recovery).
        reset = true;
        tracing::warn!(
            seq,
            cursor = seqs.last,
            "following the relay's numbering from seq {seq}"
        );
    } else if below {
        let t = frame_time_us(&mut seqs.arena, &ev.bytes);
        if t.is_some_and(|t| t > seqs.fresh_us.saturating_add(seqs.slack_us)) {
            reset = true;
            metrics.upstream_cursor_recoveries[1].fetch_add(1, Relaxed);
            tracing::error!(
                seq,
                cursor = seqs.last,
                skipped_before = seqs.below,
                host = ev.host,
                "the relay sent seq {seq}, at or below our cursor, for an event newer than anything stored: our cursor is \
                 past the relay's numbering (a forged seq, or another relay). Following the relay from here \
                 (riptide_upstream_cursor_recoveries_total{{reason=\"live-below-cursor\"}})"
            );
        } else {
            if seqs.below == 0 {
                // A relay honouring our cursor sends only seqs after it.
                tracing::warn!(
                    seq,
                    cursor = seqs.last,
                    host = ev.host,
                    "the relay sent seq {seq}, at or below our cursor: skipping what the store already holds \
                     (riptide_upstream_frames_duplicate_total)"
                );
            }
            seqs.below += 1;
        }
    }
    if reset {
        seqs.last = None;
        seqs.follow = false;
    }
    if !new_conn && !reset {
        if let Some(p) = seqs.prev {
            seqs.confirmed = Some(seqs.confirmed.map_or(p, |c| c.max(p)));
        }
    }
    seqs.prev = Some(seq);
    if std::mem::take(&mut seqs.outdated) {
        let skipped = seq.saturating_sub(seqs.last.map_or(1, |c| c + 1));
        metrics.upstream_gap_seqs.fetch_add(skipped, Relaxed);
        tracing::error!(
            after = seqs.last,
            resumed_at = seq,
            skipped,
            "upstream gap: the relay resumed past our cursor"
        );
    }
    if reset || !below {
        seqs.fresh_us = crate::now_us();
        seqs.recent.insert(seq, fp);
    }
    seqs.last = Some(seqs.last.map_or(seq, |l| l.max(seq)));
    Some((reset, (seq, ev.bytes)))
}

/// Reads and hands on until ingest stops. Never cancelled mid-read: it returns only when `tx`
/// is closed.
async fn forward_direct(
    mut client: FirehoseClient,
    metrics: &Metrics,
    mut seqs: Seqs,
    tx: &mpsc::Sender<Upstream>,
) {
    let stats = client.stats();
    loop {
        let ev = next_event(&mut client, &stats, metrics).await;
        let admitted = admit(ev, metrics, &mut seqs);
        if let Some(c) = seqs.resume.take() {
            client.resume_from(c.map(|c| c.min(i64::MAX as u64) as i64));
        }
        if let Some((reset, f)) = admitted {
            if reset && tx.send(Upstream::CursorReset(f.0)).await.is_err() {
                return;
            }
            if tx.send(Upstream::Frame(f)).await.is_err() {
                return;
            }
        }
    }
}

async fn forward_resolving(
    cfg: &UpstreamConfig,
    resolver: Resolver,
    mut rx: mpsc::Receiver<FirehoseEvent>,
    metrics: &Arc<Metrics>,
    mut seqs: Seqs,
    resume: &std::sync::Mutex<Option<Option<u64>>>,
    tx: &mpsc::Sender<Upstream>,
) {
    let mut pending: FuturesOrdered<BoxFuture<'static, Upstream>> = FuturesOrdered::new();
    let depth = cfg.lookahead.max(1);
    let mut open = true;
    // One rule for the lookups' warnings: a PLC directory that does not answer fails the
    // lookup of every account in the stream, and a line per account flooded the journal.
    let said = Arc::new(Throttle::default());
    loop {
        tokio::select! {
            biased;
            Some(f) = pending.next(), if !pending.is_empty() => {
                if tx.send(f).await.is_err() {
                    return;
                }
            }
            ev = rx.recv(), if open && pending.len() < depth => {
                let Some(ev) = ev else { open = false; continue };
                let admitted = admit(ev, metrics, &mut seqs);
                if let Some(c) = seqs.resume.take() {
                    *resume.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(c);
                }
                let Some((reset, (seq, bytes))) = admitted else { continue };
                if reset {
                    pending.push_back(std::future::ready(Upstream::CursorReset(seq)).boxed());
                }
                let p = peek(&mut seqs.arena, &bytes);
                let did = p.did.map(str::to_owned);
                if p.kind == "identity" {
                    if let Some(d) = &did {
                        // In arrival order: lookups of later frames fetch the new document.
                        resolver.invalidate(d);
                    }
                }
                let (res, m, said) = (resolver.clone(), metrics.clone(), said.clone());
                let (retries, delay) = (cfg.lookup_retries, cfg.lookup_retry_delay);
                pending.push_back(
                    async move {
                        if let Some(d) = did {
                            warm(&res, &d, retries, delay, &m, &said).await;
                        }
                        Upstream::Frame((seq, bytes))
                    }
                    .boxed(),
                );
            }
            else => return,
        }
    }
}

/// Resolves `did` into the cache, retrying transient failures. Definite answers (no such DID,
/// unusable document) are cached negatively by the resolver and end the wait at once. A lookup
/// given up is counted (`riptide_key_lookup_failures_total`) and said by the rule of `said`
/// ([`lookup_failed`]).
async fn warm(
    res: &Resolver,
    did: &str,
    retries: u32,
    delay: Duration,
    metrics: &Metrics,
    said: &Throttle,
) {
    if res.try_get(did).is_some() {
        return;
    }
    let mut wait = delay;
    for attempt in 0..=retries {
        match res.resolve_did(did).await {
            Ok(_) => return,
            Err(e) if e.is_definite() => {
                metrics.key_lookup_failures.fetch_add(1, Relaxed);
                lookup_failed(said, "no-usable-document", did, &e, attempt + 1);
                return;
            }
            Err(e) => {
                if attempt == retries {
                    metrics.key_lookup_failures.fetch_add(1, Relaxed);
                    lookup_failed(said, "lookup-failed", did, &e, attempt + 1);
                    return;
                }
                metrics.key_lookup_retries.fetch_add(1, Relaxed);
                tracing::debug!(did, error = %e, attempt, "DID lookup failed; retrying");
                tokio::time::sleep(wait).await;
                wait = wait.saturating_mul(2);
            }
        }
    }
}

/// Says one DID lookup given up, of `kind`: in full the first [`Throttle::FIRST`] times, then a
/// summary at most every [`Throttle::EVERY`] with how many were not said (issue 39).
fn lookup_failed(
    said: &Throttle,
    kind: &'static str,
    did: &str,
    e: &dyn std::fmt::Display,
    attempts: u32,
) {
    match said.say(kind) {
        Say::Full => tracing::warn!(did, error = %e, attempts, kind,
            "DID lookup given up: the frame will be unknown-key"),
        Say::Summary { suppressed, total } => tracing::warn!(did, error = %e, kind, suppressed,
            total, "DID lookups given up ({kind}): {suppressed} more not said since the last line, \
             {total} in all (riptide_key_lookup_failures_total)"),
        Say::Quiet => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn garbage_is_said_in_full_then_summarized_per_class_at_most_once_a_period() {
        let t = Throttle::default();
        let t0 = Instant::now();
        let mut full = 0u64;
        // The throttle's rule, per class: the first few of each class in full.
        for class in ["malformed", "unsequenced"] {
            for _ in 0..Throttle::FIRST {
                assert_eq!(say_garbage(&t, class, t0, || full += 1), Say::Full);
            }
        }
        assert_eq!(full, 2 * Throttle::FIRST);
        // A million more within the period: nothing said, nothing logged in full.
        for i in 0..1_000_000u64 {
            let class = if i % 4 == 0 {
                "unsequenced"
            } else {
                "malformed"
            };
            let at = t0 + Duration::from_secs(59);
            assert_eq!(say_garbage(&t, class, at, || full += 1), Say::Quiet);
        }
        assert_eq!(full, 2 * Throttle::FIRST);
        // A class not seen before is said in full, whatever the others did.
        let at = t0 + Duration::from_secs(59);
        assert_eq!(say_garbage(&t, "limits", at, || full += 1), Say::Full);
        // The first of a class after the period says how many of it went unsaid (this one not
        // included) and how many there were in all.
        let t1 = t0 + Throttle::EVERY;
        assert_eq!(
            say_garbage(&t, "malformed", t1, || full += 1),
            Say::Summary {
                suppressed: 750_000,
                total: Throttle::FIRST + 750_000 + 1
            }
        );
        assert_eq!(
            say_garbage(&t, "unsequenced", t1, || full += 1),
            Say::Summary {
                suppressed: 250_000,
                total: Throttle::FIRST + 250_000 + 1
            }
        );
        // Then quiet again for a period.
        let soon = t1 + Duration::from_secs(1);
        assert_eq!(say_garbage(&t, "malformed", soon, || full += 1), Say::Quiet);
        assert_eq!(
            say_garbage(&t, "malformed", t1 + Throttle::EVERY, || full += 1),
            Say::Summary {
                suppressed: 1,
                total: Throttle::FIRST + 750_000 + 3
            }
        );
        assert_eq!(full, 2 * Throttle::FIRST + 1);
    }
}
