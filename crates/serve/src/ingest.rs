//! Ingest: upstream frames in, durable v1 events out.
//!
//! Source-agnostic: anything that can send `(upstream seq, frame bytes)` in order on a tokio
//! channel feeds it (the firehose client, a corpus file, a benchmark). Pipeline, on OS threads:
//!
//! ```text
//!  channel ─► dispatcher ──(hash of DID)──► worker 0..W: verify, project ──► writer
//!                 └──────── order of workers (which worker has frame i) ────────┘
//! ```
//!
//! The dispatcher skips frames at or below the stored upstream cursor (counted as duplicates),
//! then routes each frame to a worker by its DID, so every DID stays on one verifier (the
//! verifier's key cache and chain state are per DID, and `#identity` invalidates the key in
//! order). Workers verify (`--no-verify`: decode only, block CIDs still checked), check the
//! frame against its account's chain state ([`crate::chain`]; `--stateless` skips it), and
//! project the frame the verifier decoded (`Verifier::check_then`: one decode per frame); a frame
//! that fails is counted by verdict and logged with did/seq/rev, and produces nothing (though a
//! chain break still moves the account's state: `riptide_firehose::chain`). The writer takes
//! results back in upstream order (it reads the worker ids in dispatch order, and each worker
//! answers in order), assigns seq and `time_us = max(now, prev + 1)`, renders the final JSON and
//! its zstd frame once, and appends a batch — events, the account states its frames changed, and
//! the upstream cursor — to the store in one durable write before publishing it to subscribers.
//! So global order is upstream order, per-DID order holds a fortiori, and after a crash the
//! frames after the stored cursor are verified again against exactly the state they were first
//! verified against.
//!
//! Frames cross threads in chunks of up to [`CHUNK`] (whatever the source has ready), and a
//! worker renders a chunk's events into one buffer: handing frames over one by one spent a fifth
//! of ingest's CPU in wake-ups. Latency is observed per frame (`riptide_ingest_verify_seconds`,
//! `riptide_ingest_publish_seconds`) and per batch (`riptide_store_append_seconds`).

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::ops::Range;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use riptide_cbor::{write_json_int, Arena};
use riptide_firehose::verify::{peek, Verdict, Verifier};
use riptide_firehose::{DecodeOptions, FrameDecoder};
use riptide_jetstream::{EventKind, Projector};
use tokio::sync::mpsc;

use riptide_firehose::chain::AccountState;

use crate::chain::{max_in_flight, ServeChain};
use crate::compress::{DictError, Dictionary};
use crate::event::Event;
use crate::keys::Keys;
use crate::log::Log;
use crate::metrics::Metrics;
use crate::store::{Resume, StoreError};

/// One upstream frame: the relay's seq (the cursor to resume from) and the message bytes. A frame
/// with no bytes is not a frame but [`cursor_reset`].
pub type UpstreamFrame = (u64, Bytes);

/// The message that tells ingest the relay's numbering went backwards: the frames that follow,
/// from `seq` on, are new even if the stored cursor is higher (see `upstream.rs`, "Seqs that go
/// backwards"). The stored cursor then follows the relay. (No real frame is empty.)
pub fn cursor_reset(seq: u64) -> UpstreamFrame {
    (seq, Bytes::new())
}

/// How ingest runs.
#[derive(Clone, Debug)]
pub struct IngestConfig {
    /// Keys to verify with; `None` = `--no-verify` (trust the relay, as Jetstream does).
    pub keys: Option<Keys>,
    /// Verification threads (default [`default_workers`]; at most 255).
    pub workers: usize,
    /// Most frames per durable store batch (give or take a chunk of 64).
    pub max_batch: usize,
    /// Dictionary for the zstd form of every event (`None`: JSON only).
    pub dictionary: Option<Dictionary>,
    /// Check every frame against its account's chain state (`false`: `--stateless`).
    pub stateful: bool,
}

impl IngestConfig {
    /// Verifying with `keys`, [`default_workers`], batches of up to 4,096 frames, no dictionary.
    pub fn verifying(keys: Keys) -> IngestConfig {
        IngestConfig {
            keys: Some(keys),
            workers: default_workers(),
            max_batch: 4096,
            dictionary: None,
            stateful: true,
        }
    }

    /// Trusting the relay (`--no-verify`).
    pub fn trusting() -> IngestConfig {
        IngestConfig {
            keys: None,
            workers: default_workers(),
            max_batch: 4096,
            dictionary: None,
            stateful: false,
        }
    }
}

/// Verification threads by default: two per core (at least 2, at most 64).
///
/// Frames go to workers by a hash of their DID, a static partition: with one worker per core, a
/// partition that draws more of the work (a busy account, a burst, a small corpus) keeps its
/// core busy while the other idles. With twice as many workers as cores no single worker holds
/// the pipeline to one core's pace, and the OS scheduler keeps both cores full. Measured on the
/// capture repeated (149 DIDs split 69/81 between two workers): see
/// `bench/results/2026-11-22-vm/serve-3.md`.
pub fn default_workers() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (2 * cores).clamp(2, 64)
}

/// Ingest stopped on a local failure (never on bad upstream data).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IngestError {
    /// The store failed: events after the last durable batch were not stored.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The dictionary could not be loaded into zstd.
    #[error(transparent)]
    Dictionary(#[from] DictError),
    /// A pipeline thread panicked.
    #[error("ingest thread panicked")]
    Panicked,
    /// A verifier could not read an account's chain state from the store (nothing after the
    /// last durable batch was stored).
    #[error("reading account chain state: {0}")]
    ChainState(StoreError),
    /// The publish hook ([`spawn_publishing`]) failed for good: the batch was not stored.
    #[error(transparent)]
    Publish(#[from] crate::publish::PublishError),
}

/// What an ingest run did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IngestSummary {
    /// Frames handed to workers (duplicates excluded).
    pub frames: u64,
    /// Events stored.
    pub events: u64,
    /// Where the store stands now.
    pub resume: Resume,
}

/// A running ingest pipeline. Drop every sender of its channel to stop it, then [`join`].
///
/// [`join`]: IngestHandle::join
#[derive(Debug)]
pub struct IngestHandle {
    writer: JoinHandle<Result<IngestSummary, IngestError>>,
    others: Vec<JoinHandle<Result<(), IngestError>>>,
}

impl IngestHandle {
    /// Waits for the pipeline to drain and stop.
    pub fn join(self) -> Result<IngestSummary, IngestError> {
        let mut panicked = false;
        let mut failed = None;
        for h in self.others {
            match h.join() {
                Err(_) => panicked = true,
                Ok(Err(e)) => failed = failed.or(Some(e)),
                Ok(Ok(())) => {}
            }
        }
        let r = self.writer.join().map_err(|_| IngestError::Panicked)?;
        if panicked {
            return Err(IngestError::Panicked);
        }
        match failed {
            Some(e) => Err(e),
            None => r,
        }
    }
}

/// Most frames the dispatcher hands a worker at once (and the writer takes back at once).
/// Frames cross threads in chunks: one wake-up per chunk, not one per frame (per-frame hand-offs
/// cost a fifth of ingest's CPU in futex wake-ups and context switches). A chunk is cut short
/// whenever the source has nothing more ready, so a trickle of live frames is not held back.
pub const CHUNK: usize = 64;

struct Job {
    seq: u64,
    bytes: Bytes,
    received_us: i64,
}

struct Part {
    kind: EventKind,
    did: Range<usize>,
    collection: Range<usize>,
    head: Range<usize>,
    tail: Range<usize>,
}

/// One frame's outcome: its events are `parts[parts]` of its chunk, the account states it
/// changed `states[states]`.
struct Done {
    seq: u64,
    received_us: i64,
    parts: Range<usize>,
    states: Range<usize>,
}

/// A worker's answer to one chunk of jobs, in job order; all the events' bytes in one buffer.
#[derive(Default)]
struct DoneChunk {
    frames: Vec<Done>,
    parts: Vec<Part>,
    buf: Vec<u8>,
    states: Vec<(Box<str>, AccountState)>,
}

/// Chunks a worker's answer channel holds.
const ANSWER_CHUNKS: usize = 32;

/// Starts the pipeline on `rx`, continuing from `resume` (what [`crate::Store::open`] returned).
pub fn spawn(
    cfg: IngestConfig,
    log: Arc<Log>,
    metrics: Arc<Metrics>,
    resume: Resume,
    rx: mpsc::Receiver<UpstreamFrame>,
) -> Result<IngestHandle, IngestError> {
    spawn_publishing(cfg, log, metrics, resume, rx, None)
}

/// [`spawn`], with every batch handed to `publisher` before it is stored
/// ([`crate::publish`]: the scale-out ingest node).
pub fn spawn_publishing(
    cfg: IngestConfig,
    log: Arc<Log>,
    metrics: Arc<Metrics>,
    resume: Resume,
    mut rx: mpsc::Receiver<UpstreamFrame>,
    publisher: Option<Box<dyn crate::publish::Publish>>,
) -> Result<IngestHandle, IngestError> {
    let workers = cfg.workers.clamp(1, 255);
    let (order_tx, order_rx) = sync_channel::<Vec<u8>>(64);
    let mut job_txs = Vec::new();
    let mut done_rxs = Vec::new();
    let mut others = Vec::new();
    for w in 0..workers {
        let (job_tx, job_rx) = sync_channel::<Vec<Job>>(32);
        let (done_tx, done_rx) = sync_channel::<DoneChunk>(ANSWER_CHUNKS);
        job_txs.push(job_tx);
        done_rxs.push(done_rx);
        let keys = cfg.keys.clone();
        let m = metrics.clone();
        // Twice the frames in flight (module docs of crate::chain), at least 16,384 accounts.
        let generation =
            (2 * max_in_flight(cfg.max_batch.max(1), ANSWER_CHUNKS, CHUNK)).max(1 << 14);
        let chain = ServeChain::new(log.store().clone(), cfg.stateful, generation);
        others.push(
            std::thread::Builder::new()
                .name(format!("ingest-verify-{w}"))
                .spawn(move || work(keys, chain, m, job_rx, done_tx))
                .map_err(|_| IngestError::Panicked)?,
        );
    }
    let m = metrics.clone();
    let start_cursor = resume.upstream_cursor;
    // The gauge says where the store is from the start, not only after the first batch.
    metrics
        .upstream_seq
        .store(start_cursor.unwrap_or(0), Relaxed);
    others.push(
        std::thread::Builder::new()
            .name("ingest-dispatch".into())
            .spawn(move || {
                dispatch(&mut rx, start_cursor, &m, &job_txs, &order_tx);
                Ok(())
            })
            .map_err(|_| IngestError::Panicked)?,
    );
    let compressor = match &cfg.dictionary {
        Some(d) => Some(d.compressor()?),
        None => None,
    };
    let max_batch = cfg.max_batch.max(1);
    let writer = std::thread::Builder::new()
        .name("ingest-write".into())
        .spawn(move || {
            write(
                log, metrics, resume, compressor, max_batch, order_rx, done_rxs, publisher,
            )
        })
        .map_err(|_| IngestError::Panicked)?;
    Ok(IngestHandle { writer, others })
}

/// Routes frames to workers by DID, in chunks; sends the writer, per chunk, which worker has
/// each frame (worker ids fit a byte: [`IngestConfig::workers`] is capped at 255).
fn dispatch(
    rx: &mut mpsc::Receiver<UpstreamFrame>,
    mut cursor: Option<u64>,
    metrics: &Metrics,
    jobs: &[SyncSender<Vec<Job>>],
    order: &SyncSender<Vec<u8>>,
) {
    let mut arena = Arena::new();
    let mut pending: Vec<Vec<Job>> = jobs.iter().map(|_| Vec::new()).collect();
    let mut ids: Vec<u8> = Vec::with_capacity(CHUNK);
    let mut frames: Vec<UpstreamFrame> = Vec::with_capacity(CHUNK);
    // Whatever is ready, up to a chunk, in one go: the channel's permits go back to the source
    // together (one wake-up of a waiting sender per chunk, not per frame).
    while rx.blocking_recv_many(&mut frames, CHUNK) > 0 {
        // What is still waiting: ingest's backlog (`riptide_ingest_queue_frames`; subscribers
        // step aside while it is high, see `server.rs`). Reaches 0 when the queue is drained.
        metrics.ingest_queue.store(rx.len() as i64, Relaxed);
        for (seq, bytes) in frames.drain(..) {
            if bytes.is_empty() {
                // `cursor_reset`: counted and logged by the source.
                cursor = seq.checked_sub(1);
                continue;
            }
            let received_us = crate::now_us();
            metrics.frames_in.fetch_add(1, Relaxed);
            metrics.upstream_last_us.store(received_us, Relaxed);
            if cursor.is_some_and(|c| seq <= c) {
                metrics.frames_duplicate.fetch_add(1, Relaxed);
                continue;
            }
            cursor = Some(seq);
            let w = match peek(&mut arena, &bytes).did {
                Some(did) if jobs.len() > 1 => {
                    let mut h = std::collections::hash_map::DefaultHasher::new();
                    did.hash(&mut h);
                    (h.finish() % jobs.len() as u64) as usize
                }
                _ => 0,
            };
            pending[w].push(Job {
                seq,
                bytes,
                received_us,
            });
            ids.push(w as u8);
        }
        if ids.is_empty() {
            continue;
        }
        // Jobs before the order that names them: the writer waits only for sent work.
        for (w, p) in pending.iter_mut().enumerate() {
            if !p.is_empty() && jobs[w].send(std::mem::take(p)).is_err() {
                return;
            }
        }
        if order
            .send(std::mem::replace(&mut ids, Vec::with_capacity(CHUNK)))
            .is_err()
        {
            return;
        }
    }
}

fn work(
    keys: Option<Keys>,
    chain: ServeChain,
    metrics: Arc<Metrics>,
    jobs: Receiver<Vec<Job>>,
    done: SyncSender<DoneChunk>,
) -> Result<(), IngestError> {
    let mut verifier = keys.map(|k| Verifier::with_chain(k, chain));
    // Without a verifier (`--no-verify`) the frame is decoded here, block CIDs checked. With
    // one, the verifier's own decoding is reused (`check_then`): each frame is decoded once.
    // Records are decoded one by one by the projector (one bad record drops one op).
    // (With a verifier this decoder only reads the rev of a frame that failed, for the log.)
    let mut opts = DecodeOptions {
        decode_blocks: false,
        ..DecodeOptions::default()
    };
    opts.car.verify = verifier.is_none();
    let mut decoder = FrameDecoder::with_options(opts);
    // `#sync` too: stored for v2's subscribeEvents, skipped by v1's /subscribe (`v2.rs`).
    let mut projector = Projector::with_sync();
    let mut capacity = 0;
    for chunk in jobs {
        let mut out = DoneChunk {
            frames: Vec::with_capacity(chunk.len()),
            parts: Vec::with_capacity(chunk.len() * 2),
            buf: Vec::with_capacity(capacity),
            states: Vec::new(),
        };
        for job in &chunk {
            let first = out.parts.len();
            let first_state = out.states.len();
            let t0 = Instant::now();
            match verifier.as_mut() {
                Some(v) => {
                    let (report, verified) = v.check_then(&job.bytes, |frame| {
                        metrics.verify_seconds.observe(t0.elapsed());
                        project(&mut projector, frame, job.seq, &metrics, &mut out);
                    });
                    metrics.verdict(report.verdict);
                    if verified.is_none() {
                        metrics.verify_seconds.observe(t0.elapsed());
                        if report.verdict == Verdict::UnknownKey {
                            // Not remembered: the account's next frame looks its key up again.
                            if let Some(did) = report.did {
                                v.forget_key(did);
                            }
                        }
                        let rev = decoder
                            .decode(&job.bytes)
                            .ok()
                            .and_then(|f| match f.body() {
                                riptide_firehose::Body::Commit(c) => Some(c.rev.to_string()),
                                _ => None,
                            });
                        tracing::warn!(
                            did = report.did.unwrap_or("?"),
                            seq = report.seq.unwrap_or(-1),
                            rev = rev.as_deref().unwrap_or("?"),
                            kind = report.kind,
                            verdict = %report.verdict,
                            reason = %report.failure.as_ref().map(ToString::to_string).unwrap_or_default(),
                            "frame failed verification: not served"
                        );
                    }
                }
                None => match decoder.decode(&job.bytes) {
                    Err(e) => {
                        let v = Verdict::of_frame_error(&e);
                        metrics.verdict(v);
                        tracing::warn!(seq = job.seq, verdict = %v, error = %e, "frame does not decode: not served");
                    }
                    Ok(frame) => project(&mut projector, &frame, job.seq, &metrics, &mut out),
                },
            }
            if let Some(v) = verifier.as_mut() {
                let chain = v.chain_mut();
                if let Some(e) = chain.take_error() {
                    // This frame was checked against no state: it and what follows are not
                    // stored (module docs of crate::chain). What came before is.
                    out.parts.truncate(first);
                    let _ = done.send(out);
                    return Err(IngestError::ChainState(e));
                }
                chain.drain_into(&mut out.states);
            }
            out.frames.push(Done {
                seq: job.seq,
                received_us: job.received_us,
                parts: first..out.parts.len(),
                states: first_state..out.states.len(),
            });
        }
        // The next chunk's buffer starts as large as the largest so far, up to 1 MiB (one huge
        // frame should not make every later chunk reserve megabytes).
        capacity = capacity.max(out.buf.len()).min(1 << 20);
        if done.send(out).is_err() {
            return Ok(());
        }
    }
    Ok(())
}

/// Projects a decoded frame into `out`: each event's DID, collection and JSON, the JSON in two
/// pieces around the `time_us` value and cursor, which the writer stamps in upstream order.
fn project(
    projector: &mut Projector,
    frame: &riptide_firehose::Frame<'_>,
    seq: u64,
    metrics: &Metrics,
    out: &mut DoneChunk,
) {
    let time = match *frame.body() {
        riptide_firehose::Body::Commit(c) => Some(c.time),
        riptide_firehose::Body::Sync(s) => Some(s.time),
        riptide_firehose::Body::Identity(i) => Some(i.time),
        riptide_firehose::Body::Account(a) => Some(a.time),
        _ => None,
    };
    // The latest, not the largest: one frame claiming a far-future time must not pin the gauge.
    if let Some(t) = time.and_then(|t| riptide_syntax::Datetime::parse(t).ok()) {
        metrics
            .upstream_event_time_us
            .store(t.timestamp_micros(), Relaxed);
    }
    let p = projector.project(frame);
    for &(op, why) in p.drops() {
        metrics.drop_op(why);
        tracing::debug!(seq, op, reason = why.as_str(), "op dropped");
    }
    for i in 0..p.len() {
        let did = push(&mut out.buf, p.did(i).as_bytes());
        let collection = push(&mut out.buf, p.collection(i).as_bytes());
        let head = push_with(&mut out.buf, |b| p.render_head(i, b));
        let tail = push_with(&mut out.buf, |b| p.render_tail(i, b));
        out.parts.push(Part {
            kind: p.kind(i),
            did,
            collection,
            head,
            tail,
        });
    }
}

fn push(buf: &mut Vec<u8>, s: &[u8]) -> Range<usize> {
    push_with(buf, |b| b.extend_from_slice(s))
}

/// Appends what `write` writes to `buf`; where it went.
fn push_with(buf: &mut Vec<u8>, write: impl FnOnce(&mut Vec<u8>)) -> Range<usize> {
    let start = buf.len();
    write(buf);
    start..buf.len()
}

/// The next result of each worker, chunk by chunk.
struct Results {
    done: Vec<Receiver<DoneChunk>>,
    current: Vec<(DoneChunk, usize)>,
}

impl Results {
    /// Worker `w`'s next frame: (its chunk, the frame's index in it).
    fn next(&mut self, w: usize) -> Option<(&DoneChunk, usize)> {
        let (chunk, at) = &mut self.current[w];
        if *at == chunk.frames.len() {
            *chunk = self.done[w].recv().ok()?;
            *at = 0;
        }
        *at += 1;
        Some((&*chunk, *at - 1))
    }
}

#[allow(clippy::too_many_arguments)]
fn write(
    log: Arc<Log>,
    metrics: Arc<Metrics>,
    mut resume: Resume,
    mut compressor: Option<zstd::bulk::Compressor<'static>>,
    max_batch: usize,
    order: Receiver<Vec<u8>>,
    done: Vec<Receiver<DoneChunk>>,
    mut publisher: Option<Box<dyn crate::publish::Publish>>,
) -> Result<IngestSummary, IngestError> {
    let mut summary = IngestSummary {
        resume,
        ..IngestSummary::default()
    };
    let mut results = Results {
        current: done.iter().map(|_| (DoneChunk::default(), 0)).collect(),
        done,
    };
    let mut events: Vec<Event> = Vec::new();
    // The batch's account states, the last per DID (a batch holds one write per key).
    let mut states: HashMap<Box<str>, AccountState> = HashMap::new();
    let mut state_list: Vec<(Box<str>, AccountState)> = Vec::new();
    let mut received: Vec<i64> = Vec::with_capacity(max_batch);
    let mut json = Vec::with_capacity(1 << 14);
    let mut zbuf = Vec::new();
    // A worker that is gone (it panicked: `join` reports it) ends the run after what came before
    // it is stored.
    let mut worker_gone = false;
    while let Ok(first) = order.recv() {
        events.clear();
        received.clear();
        let mut ids = Some(first);
        'chunks: while let Some(chunk) = ids.take() {
            for w in chunk {
                let Some((d, i)) = results.next(w as usize) else {
                    worker_gone = true;
                    break 'chunks;
                };
                let frame = &d.frames[i];
                received.push(frame.received_us);
                for (did, st) in &d.states[frame.states.clone()] {
                    match states.get_mut(did) {
                        Some(s) => *s = *st,
                        None => {
                            states.insert(did.clone(), *st);
                        }
                    }
                }
                for p in &d.parts[frame.parts.clone()] {
                    let seq = resume.next_seq;
                    let time_us = crate::now_us().max(resume.last_time_us + 1);
                    json.clear();
                    json.extend_from_slice(&d.buf[p.head.clone()]);
                    write_json_int(&mut json, time_us);
                    json.extend_from_slice(b",\"cursor\":");
                    write_json_int(&mut json, seq as i64);
                    json.extend_from_slice(&d.buf[p.tail.clone()]);
                    let z: &[u8] = match compressor.as_mut() {
                        Some(c) => {
                            zbuf.clear();
                            zbuf.reserve(zstd::zstd_safe::compress_bound(json.len()));
                            c.compress_to_buffer(&json, &mut zbuf)
                                .map_err(DictError::Zstd)?;
                            &zbuf
                        }
                        None => &[],
                    };
                    let did = std::str::from_utf8(&d.buf[p.did.clone()]).unwrap_or_default();
                    let coll =
                        std::str::from_utf8(&d.buf[p.collection.clone()]).unwrap_or_default();
                    events.push(Event::encode(seq, time_us, p.kind, did, coll, &json, z));
                    resume.next_seq += 1;
                    resume.last_time_us = time_us;
                }
                resume.upstream_cursor = Some(frame.seq);
            }
            if received.len() < max_batch {
                ids = order.try_recv().ok();
            }
        }
        let t0 = Instant::now();
        state_list.clear();
        state_list.extend(states.drain());
        if let Some(p) = publisher.as_mut() {
            // Before the store: the external log is never behind it (crate::publish).
            p.publish(&events, &state_list, &resume)?;
        }
        append_until_stored(&log, &metrics, &events, &state_list, &resume)?;
        metrics.store_append_seconds.observe(t0.elapsed());
        log.publish(&events);
        let now = crate::now_us();
        for &r in &received {
            metrics
                .publish_seconds
                .observe(Duration::from_micros((now - r).max(0) as u64));
        }
        summary.frames += received.len() as u64;
        summary.events += events.len() as u64;
        metrics
            .events_stored
            .fetch_add(events.len() as u64, Relaxed);
        metrics
            .upstream_seq
            .store(resume.upstream_cursor.unwrap_or(0), Relaxed);
        let oldest = received.iter().copied().min().unwrap_or(now);
        metrics.ingest_lag_us.store(now - oldest, Relaxed);
        if worker_gone {
            break;
        }
    }
    summary.resume = resume;
    Ok(summary)
}

/// How long ingest waits before retrying a store write that failed (doubling up to a minute).
const STORE_RETRY_FIRST: Duration = Duration::from_millis(500);

/// Appends one batch, retrying until it is stored: a full or read-only disk pauses ingest (the
/// upstream channel fills and the source stops reading) while subscribers go on reading what is
/// stored. The pause is loud — `riptide_ingest_paused` 1, `/readyz` 503, one error line, then one
/// every ten failures — and ends by itself when a write succeeds again. Nothing is published
/// until it is durable, so nothing is lost or duplicated across the pause.
///
/// fjall poisons its keyspace after a failed journal write: then no retry can succeed, and the
/// store must be reopened. Ingest stays paused until a probe file can be written to the data
/// directory again (space is back), and then ends with [`StoreError::NeedsReopen`]; `riptide
/// serve` restarts itself on it (a restart reopens the store; what was durable is kept).
fn append_until_stored(
    log: &Log,
    metrics: &Metrics,
    events: &[Event],
    accounts: &[(Box<str>, AccountState)],
    resume: &Resume,
) -> Result<(), StoreError> {
    let mut wait = STORE_RETRY_FIRST;
    let mut failures = 0u64;
    let mut poisoned = false;
    loop {
        if poisoned {
            if space_is_back(log.store().dir()) {
                return Err(StoreError::NeedsReopen {
                    path: log.store().dir().display().to_string(),
                });
            }
            std::thread::sleep(wait);
            wait = (wait * 2).min(Duration::from_secs(10));
            continue;
        }
        let r = match crate::faults::store_write() {
            Some(e) => Err(e),
            None => log.store().append_with_accounts(events, accounts, resume),
        };
        match r {
            Ok(()) => {
                if failures > 0 {
                    metrics.ingest_paused.store(false, Relaxed);
                    tracing::warn!(failures, "store writable again: ingest resumed");
                }
                return Ok(());
            }
            Err(e) => {
                poisoned |= e.is_poisoned();
                metrics.store_write_failures.fetch_add(1, Relaxed);
                metrics.ingest_paused.store(true, Relaxed);
                if failures.is_multiple_of(10) {
                    tracing::error!(
                        error = %e, failures = failures + 1, retry_in = ?wait,
                        "store write failed (disk full or read-only?): ingest paused, still serving reads"
                    );
                }
                failures += 1;
                std::thread::sleep(wait);
                wait = (wait * 2).min(Duration::from_secs(60));
            }
        }
    }
}

/// Whether 4 MiB can be written and synced in `dir` again (then removed).
fn space_is_back(dir: &std::path::Path) -> bool {
    use std::io::Write;
    let p = dir.join(".riptide-space-probe");
    let ok = std::fs::File::create(&p)
        .and_then(|mut f| {
            f.write_all(&vec![0u8; 4 << 20])?;
            f.sync_all()
        })
        .is_ok();
    let _ = std::fs::remove_file(&p);
    ok
}
