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
//! error log says what to do (`riptide serve --reset-upstream-cursor`, or a fresh `--data`).
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
//! line each; the first [`GARBAGE_LINES`] are said in full, then one summary with the counts by
//! class at most every [`GARBAGE_SUMMARY_EVERY`] (`GarbageLog`).
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
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::stream::{FuturesOrdered, StreamExt};
use futures_util::FutureExt;
use riptide_cbor::Arena;
use riptide_client::{
    Backoff, ClientConfig, ClientError, ClientStats, FirehoseClient, FirehoseEvent, FrameKind,
};
use riptide_firehose::verify::{peek, Verdict};
use riptide_resolver::Resolver;
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
}

impl UpstreamConfig {
    /// Defaults for `hosts`: client backoff, no resolver, 512 lookups in flight, 3 retries from
    /// 200 ms.
    pub fn new(hosts: Vec<String>) -> UpstreamConfig {
        UpstreamConfig {
            hosts,
            backoff: Backoff::default(),
            resolver: None,
            lookahead: 512,
            lookup_retries: 3,
            lookup_retry_delay: Duration::from_millis(200),
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
        ..Seqs::default()
    };
    let Some(res) = cfg.resolver.clone() else {
        // Nothing to wait for between socket and ingest: read and hand on in one task (a task
        // and a channel between them cost a wake-up and a hand-off per frame).
        forward_direct(client, &metrics, seqs, &tx).await;
        return Ok(());
    };
    // The client runs on a task of its own, so nothing ever cancels it mid-connect (the
    // resolving loop below selects between reading and handing on).
    let (ev_tx, ev_rx) = mpsc::channel::<FirehoseEvent>(cfg.lookahead.max(1));
    let stats_metrics = metrics.clone();
    let reader = tokio::spawn(async move {
        let mut client = client;
        let stats = client.stats();
        loop {
            let ev = next_event(&mut client, &stats, &stats_metrics).await;
            if ev_tx.send(ev).await.is_err() {
                return;
            }
        }
    });
    forward_resolving(&cfg, res, ev_rx, &metrics, seqs, &tx).await;
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
    /// What was said about garbage (module docs, "Garbage").
    garbage: GarbageLog,
}

/// Garbage frames said in full in the log before `GarbageLog` summarizes.
pub const GARBAGE_LINES: u64 = 10;

/// At most one summary of garbage frames in this long.
pub const GARBAGE_SUMMARY_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

/// How much of the upstream garbage is said in the log (module docs, "Garbage"): the first
/// [`GARBAGE_LINES`] frames in full, then counts by class, said with the first garbage frame
/// [`GARBAGE_SUMMARY_EVERY`] after the last summary. The metrics count every one.
#[derive(Debug, Default)]
struct GarbageLog {
    said: u64,
    /// Not said since the last summary, by class.
    quiet: std::collections::BTreeMap<&'static str, u64>,
    last_summary: Option<std::time::Instant>,
}

/// What to say about one garbage frame.
#[derive(Debug, PartialEq, Eq)]
enum Say {
    /// The frame, in full.
    Full,
    /// Nothing now (counted for the next summary).
    Quiet,
    /// The summary: frames of each class not said since the last one (this one included).
    Summary(Vec<(&'static str, u64)>),
}

impl GarbageLog {
    fn say(&mut self, class: &'static str, now: std::time::Instant) -> Say {
        if self.said < GARBAGE_LINES {
            self.said += 1;
            if self.said == GARBAGE_LINES {
                self.last_summary = Some(now);
            }
            return Say::Full;
        }
        *self.quiet.entry(class).or_default() += 1;
        if self
            .last_summary
            .is_some_and(|t| now.duration_since(t) < GARBAGE_SUMMARY_EVERY)
        {
            return Say::Quiet;
        }
        self.last_summary = Some(now);
        Say::Summary(std::mem::take(&mut self.quiet).into_iter().collect())
    }

    /// Says (or counts) one garbage frame of `class`; `full` logs it in full.
    fn frame(&mut self, class: &'static str, full: impl FnOnce()) {
        match self.say(class, std::time::Instant::now()) {
            Say::Full => full(),
            Say::Quiet => {}
            Say::Summary(counts) => {
                let counts: Vec<String> = counts.iter().map(|(c, n)| format!("{c} {n}")).collect();
                tracing::warn!(
                    "upstream frames not ingested since the last said: {} (riptide_verdicts_total, \
                     riptide_upstream_unsequenced_total; the next summary in {} s at the earliest)",
                    counts.join(", "),
                    GARBAGE_SUMMARY_EVERY.as_secs()
                );
            }
        }
    }
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
                    tracing::warn!(name, message = msg, host = ev.host, "upstream #info");
                }
            } else if name == "FutureCursor" {
                metrics.upstream_errors.fetch_add(1, Relaxed);
                metrics.upstream_future_cursor.fetch_add(1, Relaxed);
                metrics.upstream_behind.store(true, Relaxed);
                tracing::error!(
                    cursor = seqs.last,
                    message = msg,
                    host = ev.host,
                    "the relay is behind our stored upstream cursor {} (FutureCursor): it was restarted from scratch, or it is not the relay this store followed. \
                     Nothing is ingested until it catches up. To follow this relay from its own numbering, restart with \
                     `--reset-upstream-cursor` (with `--upstream-cursor N` to pick a start, else live), or use a fresh --data directory",
                    seqs.last.map_or_else(|| "?".to_string(), |c| c.to_string()),
                );
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
            seqs.garbage.frame(v.as_str(), || {
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
            Some(seq) => {
                metrics.upstream_behind.store(false, Relaxed);
                let mut reset = false;
                if ev.connection != seqs.conn {
                    seqs.conn = ev.connection;
                    if seqs.last.is_some_and(|c| seq <= c) {
                        // A relay honouring our cursor sends only seqs after it.
                        tracing::warn!(
                            seq,
                            cursor = seqs.last,
                            host = ev.host,
                            "the relay sent seq {seq}, at or below our cursor: skipping what the store already holds \
                             (riptide_upstream_frames_duplicate_total). If the relay was reset, see --reset-upstream-cursor"
                        );
                    }
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
                    seqs.last = None;
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
                seqs.last = Some(seqs.last.map_or(seq, |l| l.max(seq)));
                Some((reset, (seq, ev.bytes)))
            }
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
                seqs.garbage.frame(class, || {
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
        if let Some((reset, f)) = admit(ev, metrics, &mut seqs) {
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
    tx: &mpsc::Sender<Upstream>,
) {
    let mut arena = Arena::new();
    let mut pending: FuturesOrdered<BoxFuture<'static, Upstream>> = FuturesOrdered::new();
    let depth = cfg.lookahead.max(1);
    let mut open = true;
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
                let Some((reset, (seq, bytes))) = admit(ev, metrics, &mut seqs) else { continue };
                if reset {
                    pending.push_back(std::future::ready(Upstream::CursorReset(seq)).boxed());
                }
                let p = peek(&mut arena, &bytes);
                let did = p.did.map(str::to_owned);
                if p.kind == "identity" {
                    if let Some(d) = &did {
                        // In arrival order: lookups of later frames fetch the new document.
                        resolver.invalidate(d);
                    }
                }
                let (res, m) = (resolver.clone(), metrics.clone());
                let (retries, delay) = (cfg.lookup_retries, cfg.lookup_retry_delay);
                pending.push_back(
                    async move {
                        if let Some(d) = did {
                            warm(&res, &d, retries, delay, &m).await;
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
/// unusable document) are cached negatively by the resolver and end the wait at once.
async fn warm(res: &Resolver, did: &str, retries: u32, delay: Duration, metrics: &Metrics) {
    if res.try_get(did).is_some() {
        return;
    }
    let mut wait = delay;
    for attempt in 0..=retries {
        match res.resolve_did(did).await {
            Ok(_) => return,
            Err(e) if e.is_definite() => {
                tracing::warn!(did, error = %e, "DID lookup: no usable document (the frame will be unknown-key)");
                metrics.key_lookup_failures.fetch_add(1, Relaxed);
                return;
            }
            Err(e) => {
                if attempt == retries {
                    tracing::warn!(did, error = %e, attempts = retries + 1, "DID lookup failed; giving up (the frame will be unknown-key)");
                    metrics.key_lookup_failures.fetch_add(1, Relaxed);
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn garbage_is_said_in_full_then_summarized_by_class_at_most_once_a_period() {
        let mut g = GarbageLog::default();
        let t0 = Instant::now();
        for _ in 0..GARBAGE_LINES {
            assert_eq!(g.say("malformed", t0), Say::Full);
        }
        // A million more within the period: nothing said.
        for i in 0..1_000_000u64 {
            let class = if i % 4 == 0 {
                "unsequenced"
            } else {
                "malformed"
            };
            assert_eq!(g.say(class, t0 + Duration::from_secs(59)), Say::Quiet);
        }
        // The first after the period says them all, counted by class, this one included.
        assert_eq!(
            g.say("limits", t0 + GARBAGE_SUMMARY_EVERY),
            Say::Summary(vec![
                ("limits", 1),
                ("malformed", 750_000),
                ("unsequenced", 250_000)
            ])
        );
        // Then quiet again for a period.
        let t1 = t0 + GARBAGE_SUMMARY_EVERY;
        assert_eq!(g.say("malformed", t1 + Duration::from_secs(1)), Say::Quiet);
        assert_eq!(
            g.say("malformed", t1 + GARBAGE_SUMMARY_EVERY),
            Say::Summary(vec![("malformed", 2)])
        );
    }
}
