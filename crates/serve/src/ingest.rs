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
//! answers in order), assigns seq and `time_us = max(now, prev + 1)`, renders the final JSON and,
//! while `compress=true` subscribers want it (`crate::log`), its zstd frame once, and appends a batch — events, the account states its frames changed, and
//! the upstream cursor — to the store in one durable write before publishing it to subscribers.
//! So global order is upstream order, per-DID order holds a fortiori, and after a crash the
//! frames after the stored cursor are verified again against exactly the state they were first
//! verified against.
//!
//! **When a thread fails.** Every pipeline thread runs under `supervised`: a panic or an error
//! that ends it is logged once at error with the thread's name and cause, sets
//! `riptide_ingest_failed` (so `/healthz` and `/readyz` answer 503 at once), and is announced on
//! [`IngestHandle::failed`], which `riptide serve` waits on beside its source so that it stops
//! and exits non-zero even when the upstream is quiet. Before, a panicked writer left the
//! dispatcher and the workers running until their channels filled, and a quiet upstream never
//! filled them: the process looked healthy for as long as nobody sent a frame.
//!
//! Frames cross threads in chunks of up to [`CHUNK`] (whatever the source has ready), and a
//! worker renders a chunk's events into one buffer: handing frames over one by one spent a fifth
//! of ingest's CPU in wake-ups. Latency is observed per frame (`riptide_ingest_verify_seconds`,
//! `riptide_ingest_publish_seconds`) and per batch (`riptide_store_append_seconds`).

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::ops::Range;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use riptide_cbor::{write_json_int, Arena};
use riptide_firehose::verify::{peek, Verdict, Verifier};
use riptide_firehose::{DecodeOptions, FrameDecoder};
use riptide_jetstream::{EventKind, Projection, Projector};
use riptide_segment::{Kind, Row};
use riptide_throttle::{Say, Throttle};
use tokio::sync::mpsc;

use riptide_firehose::chain::{AccountState, ChainStore, SyncStatus, Tip};

use crate::backfill::{BackfillHold, BackfillJob, BackfillRepo};
use crate::chain::{max_in_flight, ServeChain};
use crate::compress::{compress_into, DictError, Dictionary};
use crate::keys::Keys;
use crate::log::Log;
use crate::metrics::Metrics;
use crate::resync::{Held, Holds, Landing, ResyncWiring};
use crate::Event;
use riptide_store::store::PendingChange;
use riptide_store::store::{Resume, StoreError};

/// The lines that say a frame was refused, per verdict: a few in full, then a summary a minute
/// (a looped capture or a broken relay refuses every frame; `riptide_verdicts_total` counts
/// them all).
static REFUSED: std::sync::LazyLock<Throttle> = std::sync::LazyLock::new(Throttle::default);

/// One upstream frame: the relay's seq (the cursor to resume from) and the message bytes.
pub type UpstreamFrame = (u64, Bytes);

/// What a source hands ingest.
///
/// Why an enum: the cursor reset used to travel as a frame with no bytes, so a source that could
/// deliver an empty frame (a corpus file with a zero-length record, `serve --ingest-file`)
/// silently reset the cursor instead of having the frame counted as malformed.
#[derive(Clone, Debug)]
pub enum Upstream {
    /// A frame, whatever its bytes (an empty one is malformed, and counted so).
    Frame(UpstreamFrame),
    /// The relay's numbering went backwards: the frames that follow, from this seq on, are new
    /// even if the stored cursor is higher (see `upstream.rs`, "Seqs that go backwards"). The
    /// stored cursor then follows the relay.
    CursorReset(u64),
    /// A backfill runs from here on (`serve --backfill`, [`crate::backfill`]): the frames of the
    /// accounts it says are held until their repository lands.
    BackfillStart(BackfillHold),
    /// A verified repository of the backfill, to land between the frames around it.
    Backfill(Arc<BackfillRepo>),
    /// No repository of this account will land in this crawl (it failed, or landed before a
    /// restart): its held frames are verified and released; the store's next seq is sent once
    /// that is durable (the crawl's status commits after it).
    BackfillSettled(Box<str>, std::sync::mpsc::SyncSender<u64>),
    /// The backfill is over: the frames still held for it are verified and released.
    BackfillOver,
}

impl Upstream {
    /// The seq it carries: the frame's, or the one the relay's new numbering starts at.
    pub fn seq(&self) -> u64 {
        match self {
            Upstream::Frame((seq, _)) | Upstream::CursorReset(seq) => *seq,
            Upstream::BackfillStart(_)
            | Upstream::Backfill(_)
            | Upstream::BackfillSettled(..)
            | Upstream::BackfillOver => 0,
        }
    }
}

impl From<UpstreamFrame> for Upstream {
    fn from(f: UpstreamFrame) -> Upstream {
        Upstream::Frame(f)
    }
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
    /// Dictionary for the zstd form of events, made at ingest while `compress=true` subscribers
    /// want it (`crate::log`; `None`: JSON only).
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
    failed: tokio::sync::watch::Receiver<Option<String>>,
}

impl IngestHandle {
    /// Says (with the cause) when a pipeline thread has failed for good: ingest has stopped,
    /// whatever the source does. A server waits on it beside its source (module docs).
    pub fn failed(&self) -> tokio::sync::watch::Receiver<Option<String>> {
        self.failed.clone()
    }

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

/// Runs one pipeline thread's body; a panic or an error that ends it is a failure of ingest:
/// logged once, `riptide_ingest_failed` set, and announced on `failed` (module docs, "When a
/// thread fails"). A panic becomes [`IngestError::Panicked`].
fn supervised<T>(
    thread: &str,
    metrics: &Metrics,
    failed: &tokio::sync::watch::Sender<Option<String>>,
    body: impl FnOnce() -> Result<T, IngestError>,
) -> Result<T, IngestError> {
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body));
    let (r, why) = match r {
        Ok(Ok(v)) => return Ok(v),
        Ok(Err(e)) => {
            let why = format!("{thread}: {e}");
            (Err(e), why)
        }
        Err(panic) => {
            let msg = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "(no message)".to_owned());
            (
                Err(IngestError::Panicked),
                format!("{thread} panicked: {msg}"),
            )
        }
    };
    // The first failure is the cause; the others follow from it and are not said again.
    if !metrics.ingest_failed.swap(true, Relaxed) {
        tracing::error!(
            cause = %why,
            "ingest failed: nothing more is stored; the server stops (and exits non-zero)"
        );
        failed.send_replace(Some(why));
    }
    r
}

/// Most frames the dispatcher hands a worker at once (and the writer takes back at once).
/// Frames cross threads in chunks: one wake-up per chunk, not one per frame (per-frame hand-offs
/// cost a fifth of ingest's CPU in futex wake-ups and context switches). A chunk is cut short
/// whenever the source has nothing more ready, so a trickle of live frames is not held back.
pub const CHUNK: usize = 64;

struct Job {
    /// The upstream seq (for a landing: the cursor when it was dispatched).
    seq: u64,
    bytes: Bytes,
    received_us: i64,
    /// Where the frame's DID is in `bytes`, and whether it is a `#sync`, as the dispatcher's
    /// peek read them: a worker holding frames for a resyncing account needs both, and need not
    /// read the frame again.
    route: Route,
    /// A verified repository for a resyncing account (`crate::resync`), instead of a frame.
    landing: Option<Box<Landing>>,
    /// The backfill's part (`crate::backfill`), instead of a frame.
    backfill: Option<BackfillJob>,
}

/// What the dispatcher's peek found: the DID's byte range in the frame (`None`: unreadable)
/// and whether the frame is a `#sync`.
#[derive(Clone, Default)]
struct Route {
    did: Option<Range<usize>>,
    sync: bool,
}

impl Route {
    fn of(p: &riptide_firehose::verify::Peek<'_>, bytes: &[u8]) -> Route {
        Route {
            // `peek` returns the DID as a slice of `bytes`.
            did: p
                .did
                .and_then(|d| riptide_firehose::verify::range_within(bytes, d.as_bytes())),
            sync: p.kind == "sync",
        }
    }

    fn did<'b>(&self, bytes: &'b [u8]) -> Option<&'b str> {
        let r = self.did.clone()?;
        std::str::from_utf8(bytes.get(r)?).ok()
    }
}

/// One event of a worker's answer: its columns and its JSON around `time_us` and the cursor, in
/// the answer's buffer.
#[derive(Clone)]
pub(crate) struct Part {
    pub(crate) kind: EventKind,
    did: Range<usize>,
    collection: Range<usize>,
    pub(crate) head: Range<usize>,
    pub(crate) tail: Range<usize>,
    /// The event's `.jss` row, which the store keeps instead of its JSON once sealed
    /// (`riptide_store`, "Row blocks"); `None` if its frame's rows could not be told apart.
    pub(crate) row: Option<RowAt>,
}

/// Where the columns of an event's row lie in its chunk's buffer, beside its DID and collection
/// (the row's own); its seq and time are the writer's to assign.
#[derive(Clone)]
pub(crate) struct RowAt {
    pub(crate) kind: Kind,
    rkey: Range<usize>,
    rev: Range<usize>,
    payload: Range<usize>,
}

/// One frame's outcome: its events are `parts[parts]` of its chunk, the account states it
/// changed `states[states]`.
struct Done {
    seq: u64,
    received_us: i64,
    parts: Range<usize>,
    states: Range<usize>,
    /// Changes to the resync partition, in order.
    pending: Range<usize>,
    /// Accounts to hand the resync service once this is durable.
    queued: Range<usize>,
    /// Whether `seq` is an upstream frame's (the cursor moves to it); not for a landing.
    moves_cursor: bool,
    /// Entries of the store's `backfill` partition (a landed repository's), in this batch.
    progress: Range<usize>,
    /// Told the store's next seq once this is durable (a landed repository's sink waits).
    ack: Option<std::sync::mpsc::SyncSender<u64>>,
    /// A repository that replaced its account's earlier rows with this job's events.
    replaced: Option<crate::replace::Replaced>,
}

/// A worker's answer to one chunk of jobs, in job order; all the events' bytes in one buffer.
#[derive(Default)]
pub(crate) struct DoneChunk {
    frames: Vec<Done>,
    pub(crate) parts: Vec<Part>,
    pub(crate) buf: Vec<u8>,
    states: Vec<(Box<str>, AccountState)>,
    pending: Vec<PendingChange>,
    queued: Vec<Box<str>>,
    progress: Vec<(Box<str>, Vec<u8>)>,
    /// What the job being answered replaced (`crate::replace`), moved into its [`Done`].
    pub(crate) replaced: Option<crate::replace::Replaced>,
}

/// Chunks a worker's answer channel holds.
const ANSWER_CHUNKS: usize = 32;

/// The writer ends a batch once it holds this many bytes of events (JSON), whatever
/// [`IngestConfig::max_batch`] allows: a landing's pieces are each their own batch.
const BATCH_BYTES: usize = 16 << 20;

/// Starts the pipeline on `rx`, continuing from `resume` (what [`crate::Store::open`] returned).
/// Chain breaks are not repaired: the breaking commit re-establishes the chain
/// (`riptide_firehose::chain`); [`spawn_with_resync`] repairs them.
pub fn spawn(
    cfg: IngestConfig,
    log: Arc<Log>,
    metrics: Arc<Metrics>,
    resume: Resume,
    rx: mpsc::Receiver<Upstream>,
) -> Result<IngestHandle, IngestError> {
    spawn_with(cfg, log, metrics, resume, rx, None, None)
}

/// The worker that owns `did`'s frames (and its chain state), of `workers`.
fn owner(did: &str, workers: usize) -> usize {
    if workers <= 1 {
        return 0;
    }
    let mut h = std::collections::hash_map::DefaultHasher::new();
    did.hash(&mut h);
    (h.finish() % workers as u64) as usize
}

/// [`spawn`], with every batch handed to `publisher` before it is stored
/// ([`crate::publish`]: the scale-out ingest node).
pub fn spawn_publishing(
    cfg: IngestConfig,
    log: Arc<Log>,
    metrics: Arc<Metrics>,
    resume: Resume,
    rx: mpsc::Receiver<Upstream>,
    publisher: Option<Box<dyn crate::publish::Publish>>,
) -> Result<IngestHandle, IngestError> {
    spawn_with(cfg, log, metrics, resume, rx, None, publisher)
}

/// [`spawn`], resyncing accounts whose chain breaks through `resync` (`crate::resync`; needs
/// verification and chain state: with `--no-verify` or `--stateless` it is not used). Accounts
/// the store says await resync are queued again, and their held frames reloaded, first.
pub fn spawn_with_resync(
    cfg: IngestConfig,
    log: Arc<Log>,
    metrics: Arc<Metrics>,
    resume: Resume,
    rx: mpsc::Receiver<Upstream>,
    resync: Option<ResyncWiring>,
) -> Result<IngestHandle, IngestError> {
    spawn_with(cfg, log, metrics, resume, rx, resync, None)
}

/// [`spawn`] with resync ([`spawn_with_resync`]) and a publisher ([`spawn_publishing`]), each
/// optional.
pub fn spawn_with(
    cfg: IngestConfig,
    log: Arc<Log>,
    metrics: Arc<Metrics>,
    resume: Resume,
    mut rx: mpsc::Receiver<Upstream>,
    resync: Option<ResyncWiring>,
    publisher: Option<Box<dyn crate::publish::Publish>>,
) -> Result<IngestHandle, IngestError> {
    let workers = cfg.workers.clamp(1, 255);
    let resync = resync.filter(|_| cfg.stateful && cfg.keys.is_some());
    let (mut holds, queue, landings) = match resync {
        Some(w) => {
            let (holds, again) = crate::resync::load_pending(
                log.store(),
                &w.limits,
                workers,
                |d| owner(d, workers),
                &metrics,
            )?;
            if !again.is_empty() {
                tracing::info!(
                    accounts = again.len(),
                    "accounts awaiting resync at start: queued again"
                );
            }
            for did in again {
                let _ = w.queue.send(did);
            }
            (
                holds.into_iter().map(Some).collect(),
                Some(w.queue),
                Some((w.landings, w.stopped)),
            )
        }
        None => ((0..workers).map(|_| None).collect::<Vec<_>>(), None, None),
    };
    let (order_tx, order_rx) = sync_channel::<Vec<u8>>(64);
    let (failed_tx, failed) = tokio::sync::watch::channel(None);
    let failed_tx = Arc::new(failed_tx);
    let mut job_txs = Vec::new();
    let mut done_rxs = Vec::new();
    let mut others = Vec::new();
    for (w, h) in holds.iter_mut().enumerate() {
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
        let h = h.take();
        let f = failed_tx.clone();
        let name = format!("ingest-verify-{w}");
        others.push(
            std::thread::Builder::new()
                .name(name.clone())
                .spawn(move || {
                    supervised(&name, &m.clone(), &f, || {
                        Worker::new(keys, chain, h, m).run(job_rx, done_tx)
                    })
                })
                .map_err(|_| IngestError::Panicked)?,
        );
    }
    let m = metrics.clone();
    let start_cursor = resume.upstream_cursor;
    // The gauge says where the store is from the start, not only after the first batch.
    metrics
        .upstream_seq
        .store(start_cursor.unwrap_or(0), Relaxed);
    let f = failed_tx.clone();
    others.push(
        std::thread::Builder::new()
            .name("ingest-dispatch".into())
            .spawn(move || {
                supervised("ingest-dispatch", &m, &f, || {
                    dispatch(&mut rx, landings, start_cursor, &m, &job_txs, &order_tx);
                    Ok(())
                })
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
            let m = metrics.clone();
            supervised("ingest-write", &m, &failed_tx, || {
                write(
                    log, metrics, resume, compressor, max_batch, order_rx, done_rxs, queue,
                    publisher,
                )
            })
        })
        .map_err(|_| IngestError::Panicked)?;
    Ok(IngestHandle {
        writer,
        others,
        failed,
    })
}

/// Routes frames to workers by DID, in chunks, and each landed resync to its account's worker
/// between them; sends the writer, per chunk, which worker has each job (worker ids fit a byte:
/// [`IngestConfig::workers`] is capped at 255). Ends when the upstream channel closes.
fn dispatch(
    rx: &mut mpsc::Receiver<Upstream>,
    landings: Option<(mpsc::UnboundedReceiver<Landing>, Arc<AtomicBool>)>,
    cursor: Option<u64>,
    metrics: &Metrics,
    jobs: &[SyncSender<Vec<Job>>],
    order: &SyncSender<Vec<u8>>,
) {
    // Two sources (frames, and landed resyncs when resync is on): a small runtime of this
    // thread's own waits on whichever is ready. (Without resync this costs what a blocking
    // receive does: tokio's `blocking_recv_many` is the same future run the same way.)
    let Ok(rt) = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
    else {
        tracing::error!("ingest dispatcher: no runtime");
        return;
    };
    let (mut landings, stopped) = match landings {
        Some((l, s)) => (Some(l), s),
        None => (None, Arc::default()),
    };
    rt.block_on(async {
        let mut d = Dispatch::new(cursor, metrics, jobs, order);
        let mut frames: Vec<Upstream> = Vec::with_capacity(CHUNK);
        let mut open = landings.is_some();
        loop {
            tokio::select! {
                // Whatever is ready, up to a chunk, in one go: the channel's permits go back to
                // the source together (one wake-up of a waiting sender per chunk, not per frame).
                n = rx.recv_many(&mut frames, CHUNK) => {
                    if n == 0 {
                        if let Some(l) = landings.as_mut() {
                            d.finish_resyncs(l, &stopped).await;
                        }
                        return;
                    }
                    // What is still waiting: ingest's backlog (`riptide_ingest_queue_frames`;
                    // subscribers step aside while it is high, see `server.rs`).
                    metrics.ingest_queue.store(rx.len() as i64, Relaxed);
                    if !d.frames(&mut frames) {
                        return;
                    }
                }
                l = async {
                    match landings.as_mut() {
                        Some(l) => l.recv().await,
                        None => std::future::pending().await,
                    }
                }, if open => match l {
                    Some(l) => {
                        if !d.landing(l) {
                            return;
                        }
                    }
                    None => open = false,
                },
            }
        }
    });
}

/// The dispatcher's state: the cursor, and jobs not yet sent.
struct Dispatch<'a> {
    cursor: Option<u64>,
    metrics: &'a Metrics,
    jobs: &'a [SyncSender<Vec<Job>>],
    order: &'a SyncSender<Vec<u8>>,
    arena: Arena,
    pending: Vec<Vec<Job>>,
    ids: Vec<u8>,
}

impl<'a> Dispatch<'a> {
    fn new(
        cursor: Option<u64>,
        metrics: &'a Metrics,
        jobs: &'a [SyncSender<Vec<Job>>],
        order: &'a SyncSender<Vec<u8>>,
    ) -> Self {
        Dispatch {
            cursor,
            metrics,
            jobs,
            order,
            arena: Arena::new(),
            pending: jobs.iter().map(|_| Vec::new()).collect(),
            ids: Vec::with_capacity(CHUNK),
        }
    }

    /// Routes a chunk of frames; `false` once the pipeline is gone.
    fn frames(&mut self, frames: &mut Vec<Upstream>) -> bool {
        for up in frames.drain(..) {
            let (seq, bytes) = match up {
                Upstream::Frame(f) => f,
                Upstream::CursorReset(seq) => {
                    // Counted and logged by the source.
                    self.cursor = seq.checked_sub(1);
                    continue;
                }
                Upstream::Backfill(r) => {
                    let w = owner(&r.did, self.jobs.len());
                    self.job(w, BackfillJob::Repo(r));
                    continue;
                }
                Upstream::BackfillStart(hold) => {
                    (0..self.jobs.len())
                        .for_each(|w| self.job(w, BackfillJob::Start(hold.clone())));
                    continue;
                }
                Upstream::BackfillSettled(did, ack) => {
                    let w = owner(&did, self.jobs.len());
                    self.job(w, BackfillJob::Settled(did, ack));
                    continue;
                }
                Upstream::BackfillOver => {
                    (0..self.jobs.len()).for_each(|w| self.job(w, BackfillJob::Over));
                    continue;
                }
            };
            let received_us = crate::now_us();
            self.metrics.frames_in.fetch_add(1, Relaxed);
            self.metrics.upstream_last_us.store(received_us, Relaxed);
            if self.cursor.is_some_and(|c| seq <= c) {
                self.metrics.frames_duplicate.fetch_add(1, Relaxed);
                continue;
            }
            self.cursor = Some(seq);
            let p = peek(&mut self.arena, &bytes);
            let w = p.did.map_or(0, |did| owner(did, self.jobs.len()));
            let route = Route::of(&p, &bytes);
            self.pending[w].push(Job {
                seq,
                bytes,
                received_us,
                route,
                landing: None,
                backfill: None,
            });
            self.ids.push(w as u8);
        }
        self.flush()
    }

    /// Queues the backfill's `job` for worker `w`, after the frames dispatched before it.
    fn job(&mut self, w: usize, job: BackfillJob) {
        self.pending[w].push(Job {
            seq: self.cursor.unwrap_or(0),
            bytes: Bytes::new(),
            received_us: crate::now_us(),
            route: Route::default(),
            landing: None,
            backfill: Some(job),
        });
        self.ids.push(w as u8);
    }

    /// The source has ended (a file): before ingest ends, the resyncs it caused land. Waits
    /// until everything dispatched is durable (so every chain break has been queued) and no
    /// account awaits resync, routing landings meanwhile. A resync that keeps failing keeps
    /// ingest from ending: said once, with the count.
    async fn finish_resyncs(
        &mut self,
        landings: &mut mpsc::UnboundedReceiver<Landing>,
        stopped: &AtomicBool,
    ) {
        let mut said = false;
        // A failed pipeline never makes anything durable again: nothing to wait for.
        while !stopped.load(Relaxed) && !self.metrics.ingest_failed.load(Relaxed) {
            let durable = self.metrics.upstream_seq.load(Relaxed) == self.cursor.unwrap_or(0);
            let waiting = self.metrics.resync_accounts.load(Relaxed);
            if durable && waiting == 0 {
                return;
            }
            if durable && !said {
                said = true;
                tracing::info!(
                    accounts = waiting,
                    "the source has ended; ingest ends once the resyncs it caused have landed"
                );
            }
            match tokio::time::timeout(Duration::from_millis(50), landings.recv()).await {
                Ok(Some(l)) => {
                    if !self.landing(l) {
                        return;
                    }
                }
                Ok(None) => return,
                Err(_) => {}
            }
        }
    }

    /// Routes a landed resync to its account's worker, after the frames dispatched before it.
    fn landing(&mut self, l: Landing) -> bool {
        let w = owner(&l.resynced.did, self.jobs.len());
        self.pending[w].push(Job {
            seq: self.cursor.unwrap_or(0),
            bytes: Bytes::new(),
            received_us: crate::now_us(),
            route: Route::default(),
            landing: Some(Box::new(l)),
            backfill: None,
        });
        self.ids.push(w as u8);
        self.flush()
    }

    fn flush(&mut self) -> bool {
        if self.ids.is_empty() {
            return true;
        }
        // Jobs before the order that names them: the writer waits only for sent work.
        for (w, p) in self.pending.iter_mut().enumerate() {
            if !p.is_empty() && self.jobs[w].send(std::mem::take(p)).is_err() {
                return false;
            }
        }
        self.order
            .send(std::mem::replace(&mut self.ids, Vec::with_capacity(CHUNK)))
            .is_ok()
    }
}

/// A frame's verdict, kind and DID, as the verifier reported them.
type Checked<'b> = (Verdict, &'static str, Option<&'b str>);

/// One verification thread: its verifier (with the chain state of its accounts), and the
/// frames it holds for accounts awaiting resync.
struct Worker {
    verifier: Option<Verifier<Keys, ServeChain>>,
    decoder: FrameDecoder,
    projector: Projector,
    metrics: Arc<Metrics>,
    /// `Some` when chain breaks are repaired by resync.
    holds: Option<Holds>,
    arena: Arena,
    /// A backfill runs: frames of accounts with no verified commit are held
    /// (`crate::backfill`).
    backfilling: bool,
    /// ...those the crawl is fetching (all of them with `--backfill-hold in-flight`)...
    fetching: Option<Arc<riptide_backfill::Fetching>>,
    /// ...and, with `--backfill-hold all`, every account with no verified commit.
    hold_unknown: bool,
    /// Repositories landing in pieces whose last piece has not come (their accounts' frames
    /// are held meanwhile).
    landings: HashMap<Box<str>, InLanding>,
    /// Resyncs landing in pieces (`crate::resync`, "In pieces"): the account's state once the
    /// last piece lands.
    resync_landings: HashMap<Box<str>, AccountState>,
}

/// A repository of the backfill landing in pieces, between its first piece and its last
/// (`crate::backfill`, "In pieces").
struct InLanding {
    /// Its progress entry so far (`superseded`: no rows).
    landed: riptide_backfill::Landed,
    /// The commit landing (its CID).
    commit: String,
    /// The account's chain state once the last piece lands.
    next: Option<AccountState>,
    /// Its account is resynced instead: its frames are the resync's.
    resynced: bool,
}

impl Worker {
    fn new(
        keys: Option<Keys>,
        chain: ServeChain,
        holds: Option<Holds>,
        metrics: Arc<Metrics>,
    ) -> Worker {
        let verifier = keys.map(|k| Verifier::with_chain(k, chain));
        // Without a verifier (`--no-verify`) the frame is decoded here, block CIDs checked.
        // With one, the verifier's own decoding is reused (`check_then`): each frame is decoded
        // once. Records are decoded one by one by the projector (one bad record drops one op).
        // (With a verifier this decoder only reads the rev of a frame that failed, for the log,
        // and the `#sync` frames of landed resyncs.)
        let mut opts = DecodeOptions {
            decode_blocks: false,
            ..DecodeOptions::default()
        };
        opts.car.verify = verifier.is_none();
        Worker {
            holds: holds.filter(|_| verifier.is_some()),
            verifier,
            decoder: FrameDecoder::with_options(opts),
            // `#sync` too: stored for v2's subscribeEvents, skipped by v1's /subscribe (`v2.rs`).
            projector: Projector::with_sync(),
            metrics,
            arena: Arena::new(),
            backfilling: false,
            fetching: None,
            hold_unknown: false,
            landings: HashMap::new(),
            resync_landings: HashMap::new(),
        }
    }

    fn run(
        mut self,
        jobs: Receiver<Vec<Job>>,
        done: SyncSender<DoneChunk>,
    ) -> Result<(), IngestError> {
        let mut capacity = 0;
        for chunk in jobs {
            let mut out = DoneChunk {
                frames: Vec::with_capacity(chunk.len()),
                parts: Vec::with_capacity(chunk.len() * 2),
                buf: Vec::with_capacity(capacity),
                ..DoneChunk::default()
            };
            for job in chunk {
                let first = out.parts.len();
                let first_state = out.states.len();
                let first_pending = out.pending.len();
                let first_queued = out.queued.len();
                let first_progress = out.progress.len();
                let moves_cursor = job.landing.is_none() && job.backfill.is_none();
                let mut ack = None;
                let r = match (job.landing, job.backfill) {
                    (Some(l), _) => self.land(&l, job.seq, &mut out),
                    (None, Some(b)) => {
                        ack = match &b {
                            BackfillJob::Repo(r) => Some(r.ack.clone()),
                            BackfillJob::Settled(_, told) => Some(told.clone()),
                            _ => None,
                        };
                        self.backfill(b, job.seq, &mut out)
                    }
                    (None, None) => self.frame(job.seq, &job.bytes, Some(&job.route), &mut out),
                };
                if let Err(e) = r {
                    // This frame was checked against no state: it and what follows are not
                    // stored (module docs of crate::chain). What came before is.
                    out.parts.truncate(first);
                    out.pending.truncate(first_pending);
                    out.queued.truncate(first_queued);
                    out.progress.truncate(first_progress);
                    let _ = done.send(out);
                    return Err(e);
                }
                out.frames.push(Done {
                    seq: job.seq,
                    received_us: job.received_us,
                    parts: first..out.parts.len(),
                    states: first_state..out.states.len(),
                    pending: first_pending..out.pending.len(),
                    queued: first_queued..out.queued.len(),
                    moves_cursor,
                    progress: first_progress..out.progress.len(),
                    ack,
                    replaced: out.replaced.take(),
                });
            }
            // The next chunk's buffer starts as large as the largest so far, up to 1 MiB (one
            // huge frame should not make every later chunk reserve megabytes).
            capacity = capacity.max(out.buf.len()).min(1 << 20);
            if done.send(out).is_err() {
                return Ok(());
            }
        }
        Ok(())
    }

    /// An upstream frame (or a held one being released): held if its account awaits resync,
    /// otherwise verified, checked against its chain, and projected. `route` is the
    /// dispatcher's reading of the frame (a released frame has none and is read again).
    fn frame(
        &mut self,
        seq: u64,
        bytes: &Bytes,
        route: Option<&Route>,
        out: &mut DoneChunk,
    ) -> Result<(), IngestError> {
        if self
            .holds
            .as_ref()
            .is_some_and(|h| h.any() || self.backfilling || !self.landings.is_empty())
        {
            let (did, sync) = match route {
                Some(r) => (r.did(bytes), r.sync),
                None => {
                    let p = peek(&mut self.arena, bytes);
                    (p.did, p.kind == "sync")
                }
            };
            let did = did.filter(|_| !sync).map(Box::<str>::from);
            if let Some(did) = did.filter(|d| self.awaits(d)) {
                let held = Held {
                    seq,
                    frame: bytes.clone(),
                };
                if let Some(holds) = self.holds.as_mut() {
                    if holds.hold(&did, held, &self.metrics) {
                        out.pending.push(PendingChange::Hold {
                            did,
                            seq,
                            frame: bytes.clone(),
                        });
                    }
                }
                return Ok(());
            }
        }
        let first_part = out.parts.len();
        let checked = self.check(seq, bytes, out)?;
        if let (Some((verdict, kind, Some(did))), true) = (checked, self.holds.is_some()) {
            if verdict == Verdict::ChainBreak {
                self.start_resync(did, out);
            } else if verdict == Verdict::Ok && kind == "sync" {
                // The upstream's `#sync` says the account's repository is now its commit: the
                // repository is fetched, and lands as replacement rows (`crate::resync`, step
                // 5). Its own event is not stored: a `#sync` with no records after it would
                // tell a v2 subscriber to drop the account and give it nothing back.
                out.parts.truncate(first_part);
                self.start_resync(did, out);
            }
        }
        Ok(())
    }

    /// Whether `did`'s frames are held: its resync is in flight, or a backfill runs and the
    /// account has no verified commit yet (or frames held already, kept in order).
    fn awaits(&mut self, did: &str) -> bool {
        let Some(holds) = self.holds.as_ref() else {
            return false;
        };
        if holds.is_resyncing(did) || self.landings.contains_key(did) {
            return true;
        }
        if !self.backfilling {
            return false;
        }
        if holds.holds_any(did) {
            return true;
        }
        if self.fetching.as_ref().is_some_and(|f| f.contains(did)) {
            return true;
        }
        self.hold_unknown
            && self
                .verifier
                .as_mut()
                .is_some_and(|v| v.chain_mut().get(did).and_then(|s| s.tip).is_none())
    }

    /// The backfill's part of the stream (`crate::backfill`).
    fn backfill(
        &mut self,
        job: BackfillJob,
        upstream_seq: u64,
        out: &mut DoneChunk,
    ) -> Result<(), IngestError> {
        match job {
            BackfillJob::Start(hold) => {
                self.backfilling = true;
                (self.fetching, self.hold_unknown) = match hold {
                    BackfillHold::All => (None, true),
                    BackfillHold::AllFetching(f) => (Some(f), true),
                    BackfillHold::InFlight(f) => (Some(f), false),
                };
                Ok(())
            }
            BackfillJob::Repo(r) => self.land_repo(&r, upstream_seq, out),
            BackfillJob::Settled(did, _) => {
                if let Some(f) = &self.fetching {
                    f.end(&did);
                }
                match self.holds.as_ref() {
                    Some(h) if h.holds_any(&did) && !h.is_resyncing(&did) => {
                        self.release(&did, out)
                    }
                    _ => Ok(()),
                }
            }
            BackfillJob::Over => {
                self.backfilling = false;
                self.fetching = None;
                self.hold_unknown = false;
                // A crawl that stopped mid-landing: its pieces stay, with their partial entry
                // (a restart resumes them); its frames are released with the rest.
                self.landings.clear();
                let waiting = self
                    .holds
                    .as_ref()
                    .map(Holds::awaiting_backfill)
                    .unwrap_or_default();
                for did in waiting {
                    self.release(&did, out)?;
                }
                Ok(())
            }
        }
    }

    /// A piece of a verified repository of the backfill lands (`crate::backfill`, "In
    /// pieces"): its records as creates at its rev (over an account with earlier rows, as
    /// replacement rows: `crate::replace`), with the landing's progress entry; with the last
    /// piece, the account's chain state taken from it, its plain entry, then its held frames
    /// verified on top (`crate::backfill`, "What a subscriber sees"). The account's frames are
    /// held from the first piece to the last.
    fn land_repo(
        &mut self,
        r: &BackfillRepo,
        upstream_seq: u64,
        out: &mut DoneChunk,
    ) -> Result<(), IngestError> {
        if self.verifier.is_none() {
            // `serve --backfill` verifies (refused with --no-verify): nothing to land on.
            return Ok(());
        }
        if r.piece.first {
            let l = self.begin_landing(r, upstream_seq, out);
            self.landings.insert(r.did.clone(), l);
        }
        let Some(mut l) = self.landings.remove(&r.did) else {
            // The landing's first piece went to this worker before it: a bug, said.
            tracing::error!(did = %r.did, rev = %r.rev, "backfill: a piece of a landing that did not begin here: not served");
            return Ok(());
        };
        if l.landed.superseded.is_none() {
            let at = out.buf.len();
            out.buf.extend_from_slice(&r.buf);
            if l.landed.replaced {
                out.parts
                    .extend(r.parts.iter().map(|p| p.shifted(at).replacement()));
                let mut done = out.replaced.take().unwrap_or_default();
                done.records += r.parts.len() as u64;
                done.dropped += r.dropped;
                out.replaced = Some(done);
            } else {
                out.parts.extend(r.parts.iter().map(|p| p.shifted(at)));
            }
            l.landed.records += r.parts.len() as u64;
            l.landed.dropped += r.dropped;
        }
        if !r.piece.last {
            if l.landed.superseded.is_none() {
                out.progress.push((
                    r.did.clone(),
                    // `serve --backfill` keeps every collection: the filter's key is empty.
                    l.landed
                        .piece(&l.commit, r.piece.after.clone(), "")
                        .to_vec(),
                ));
            }
            self.landings.insert(r.did.clone(), l);
            self.metrics.backfill.pieces.fetch_add(1, Relaxed);
            return Ok(());
        }
        if let Some(f) = &self.fetching {
            f.end(&r.did);
        }
        match &l.landed.superseded {
            None => {
                if let (Some(next), Some(v)) = (l.next, self.verifier.as_mut()) {
                    v.chain_mut().put(&r.did, next);
                }
                self.metrics.backfill.landed.fetch_add(1, Relaxed);
                tracing::debug!(did = %r.did, rev = %r.rev, records = l.landed.records, replaced = l.landed.replaced, "backfill: the repository landed");
            }
            Some(_) => {
                self.metrics.backfill.superseded.fetch_add(1, Relaxed);
            }
        }
        self.drain_chain(out)?;
        out.progress.push((r.did.clone(), l.landed.to_vec()));
        let _ = r.outcome.set(riptide_backfill::Written {
            records: l.landed.records,
            dropped: l.landed.dropped,
        });
        if l.resynced {
            // Its frames are the resync's now.
            return Ok(());
        }
        self.release(&r.did, out)
    }

    /// How the repository of `r`, the first piece of a landing here, lands: decided against
    /// the account's chain state (`crate::backfill`), its `#sync` pushed into `out` if it
    /// replaces earlier rows.
    fn begin_landing(
        &mut self,
        r: &BackfillRepo,
        upstream_seq: u64,
        out: &mut DoneChunk,
    ) -> InLanding {
        let mut l = InLanding {
            landed: r
                .piece
                .resumed
                .clone()
                .unwrap_or_else(|| riptide_backfill::Landed::new(&r.rev)),
            commit: r.commit.to_string(),
            next: None,
            resynced: false,
        };
        let Some(v) = self.verifier.as_mut() else {
            return l;
        };
        let chain = v.chain_mut();
        let before = chain.get(&r.did);
        let (checked, next) = riptide_firehose::chain::check_sync(
            before.as_ref(),
            &r.rev,
            r.commit.as_cid(),
            r.data.as_cid(),
            crate::now_us().max(0) as u64,
        );
        let served = before.as_ref().is_some_and(|s| s.tip.is_some());
        let resumed = r.piece.resumed.as_ref();
        let why = match (checked, resumed) {
            (Err(why), None) => {
                tracing::warn!(
                    did = %r.did, rev = %r.rev, why = ?why,
                    "backfill: the store already holds a newer commit of this account; its repository is not served"
                );
                l.landed.superseded = Some(format!("{why:?}"));
                return l;
            }
            (Err(why), Some(_)) => format!("{why:?}"),
            // Pieces of creates, then live commits of the account (served after a restart,
            // before its fetch began again): the rest cannot follow them.
            (Ok(()), Some(p)) if !p.replaced && served => "LiveAfterPieces".to_owned(),
            (Ok(()), resumed) => {
                // The same commit as the stored tip changes nothing but where the tip came
                // from: frames at or below it are then inside the repository (`superseded`).
                l.next = next.or_else(|| {
                    let mut s = before?;
                    s.tip.as_mut()?.from_repo = true;
                    Some(s)
                });
                if resumed.is_none() {
                    // Commits of the account were served: its records replace them.
                    l.landed.replaced = r.earlier_pieces || served;
                    if l.landed.replaced {
                        let repo = crate::replace::Repository {
                            did: &r.did,
                            rev: &r.rev,
                            commit: &r.commit,
                            commit_block: &r.commit_block,
                        };
                        let time = crate::v2::rfc3339_micros(crate::now_us());
                        crate::replace::push_sync(
                            &mut self.projector,
                            &repo,
                            upstream_seq,
                            &time,
                            out,
                        );
                        out.replaced = Some(crate::replace::Replaced {
                            sync: true,
                            ..Default::default()
                        });
                    }
                }
                return l;
            }
        };
        // The pieces of an interrupted landing cannot be completed: the account's current
        // repository replaces them and what followed (`crate::resync`).
        tracing::warn!(
            did = %r.did, rev = %r.rev, why,
            "backfill: an interrupted landing of this account cannot go on (commits of it were stored after its pieces): the account is resynced"
        );
        l.landed.superseded = Some(why);
        l.resynced = true;
        self.start_resync(&r.did, out);
        l
    }

    /// Verifies and projects one frame; its verdict, kind and DID (`None` without a verifier).
    fn check<'b>(
        &mut self,
        seq: u64,
        bytes: &'b Bytes,
        out: &mut DoneChunk,
    ) -> Result<Option<Checked<'b>>, IngestError> {
        let metrics = &*self.metrics;
        let projector = &mut self.projector;
        let t0 = Instant::now();
        let Some(v) = self.verifier.as_mut() else {
            match self.decoder.decode(bytes) {
                Err(e) => {
                    let v = Verdict::of_frame_error(&e);
                    metrics.verdict(v);
                    match REFUSED.say(v.as_str()) {
                        Say::Quiet => {}
                        Say::Full => {
                            tracing::warn!(seq, verdict = %v, error = %e, "frame does not decode: not served")
                        }
                        Say::Summary { suppressed, total } => tracing::warn!(
                            seq,
                            verdict = %v,
                            error = %e,
                            "frames do not decode ({v}): {suppressed} more not served since the last line, {total} in all (riptide_verdicts_total)"
                        ),
                    }
                }
                Ok(frame) => project(projector, &frame, seq, metrics, out),
            }
            return Ok(None);
        };
        let (report, verified) = v.check_then(bytes, |frame| {
            metrics.verify_seconds.observe(t0.elapsed());
            project(projector, frame, seq, metrics, out);
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
            match REFUSED.say(report.verdict.as_str()) {
                Say::Quiet => {}
                Say::Full => {
                    let rev = self
                        .decoder
                        .decode(bytes)
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
                Say::Summary { suppressed, total } => tracing::warn!(
                    verdict = %report.verdict,
                    suppressed,
                    total,
                    did = report.did.unwrap_or("?"),
                    seq = report.seq.unwrap_or(-1),
                    "frames failed verification ({}): {suppressed} more not served since the last line, {total} in all \
                     (riptide_verdicts_total; each is said in full only the first {} times)",
                    report.verdict,
                    Throttle::FIRST,
                ),
            }
        }
        self.drain_chain(out)?;
        Ok(Some((report.verdict, report.kind, report.did)))
    }

    /// Moves the chain state changes made so far into `out`; a store read that failed ends the
    /// worker (module docs of `crate::chain`).
    fn drain_chain(&mut self, out: &mut DoneChunk) -> Result<(), IngestError> {
        if let Some(v) = self.verifier.as_mut() {
            let chain = v.chain_mut();
            if let Some(e) = chain.take_error() {
                return Err(IngestError::ChainState(e));
            }
            chain.drain_into(&mut out.states);
        }
        Ok(())
    }

    /// `did`'s chain broke, or the upstream sent its `#sync`: it awaits resync from now on
    /// (`crate::resync`, steps 1 and 5).
    fn start_resync(&mut self, did: &str, out: &mut DoneChunk) {
        let (Some(v), Some(holds)) = (self.verifier.as_mut(), self.holds.as_mut()) else {
            return;
        };
        let chain = v.chain_mut();
        let state = chain.get(did).unwrap_or_default();
        chain.put(
            did,
            AccountState {
                sync: SyncStatus::Resyncing,
                ..state
            },
        );
        chain.drain_into(&mut out.states);
        holds.start(did, &self.metrics);
        out.pending.push(crate::resync::mark(did));
        out.queued.push(did.into());
    }

    /// A piece of a verified repository for its account landed (`crate::resync`, step 4, and
    /// "In pieces"): the first checked for staleness and carrying the `#sync`, each its records
    /// as replacement rows, the last the account's new state and the release of its frames.
    fn land(
        &mut self,
        l: &Landing,
        upstream_seq: u64,
        out: &mut DoneChunk,
    ) -> Result<(), IngestError> {
        let r = &*l.resynced;
        let did = r.did.as_str();
        let (Some(v), Some(holds)) = (self.verifier.as_mut(), self.holds.as_ref()) else {
            return Ok(());
        };
        if l.piece.first {
            if !holds.is_resyncing(did) {
                self.metrics.resync_stale.fetch_add(1, Relaxed);
                tracing::info!(did, rev = %r.rev, "resync landed after the account was resynchronized: ignored");
                return Ok(());
            }
            let chain = v.chain_mut();
            let state = chain.get(did).unwrap_or_default();
            let rev = riptide_syntax::tid_value(&r.rev);
            let stale = match (rev, state.tip) {
                (None, _) => true,
                (Some(rev), Some(tip)) => rev < tip.rev,
                (Some(_), None) => false,
            };
            let Some(rev) = rev.filter(|_| !stale) else {
                self.metrics.resync_stale.fetch_add(1, Relaxed);
                self.metrics
                    .resync_failed(crate::metrics::ResyncFailure::Stale);
                tracing::warn!(
                    did, rev = %r.rev, stored = ?state.tip.map(|t| t.rev_string()),
                    "resynced repository is older than a commit already seen: queued again"
                );
                out.queued.push(did.into());
                return self.drain_chain(out);
            };
            // The account's state once the last piece lands (until then it awaits resync, its
            // frames held).
            let next = AccountState {
                tip: Some(Tip {
                    rev,
                    commit: r.commit,
                    data: r.data,
                    from_repo: true,
                }),
                hosting: state.hosting,
                sync: SyncStatus::Synchronized,
            };
            self.resync_landings.insert(did.into(), next);
        }
        let Some(next) = self.resync_landings.get(did).copied() else {
            // Its first piece was stale or came after the account was resynchronized.
            return Ok(());
        };
        // Its records replace the account's earlier rows (`crate::replace`), in this answer.
        let repo = crate::replace::Repository {
            did,
            rev: &r.rev,
            commit: &r.commit,
            commit_block: &r.commit_block,
        };
        let time = crate::v2::rfc3339_micros(crate::now_us());
        let done = crate::replace::land_over_earlier_rows(
            &mut self.projector,
            &repo,
            (upstream_seq, l.piece.first),
            &time,
            out,
            |each| {
                if let Some(index) = &l.index {
                    let from = l.piece.skip.min(index.len());
                    let to = from.saturating_add(l.piece.take).min(index.len());
                    crate::replace::car_records(&r.car, &index[from..to], each);
                }
                l.unread
            },
        );
        if !l.piece.last {
            tracing::debug!(did, rev = %r.rev, skip = l.piece.skip, records = done.records, "resync: a piece landed");
            return Ok(());
        }
        self.resync_landings.remove(did);
        if let Some(v) = self.verifier.as_mut() {
            v.chain_mut().put(did, next);
        }
        self.drain_chain(out)?;
        self.metrics.resync_landed.fetch_add(1, Relaxed);
        tracing::info!(did, rev = %r.rev, records = r.records, "resync landed: the account is synchronized, its records replace its earlier rows");
        self.release(did, out)
    }

    /// Ends `did`'s resync: its held frames are checked, in order, against its new state.
    fn release(&mut self, did: &str, out: &mut DoneChunk) -> Result<(), IngestError> {
        let Some(holds) = self.holds.as_mut() else {
            return Ok(());
        };
        let held = holds.finish(did, &self.metrics);
        out.pending.push(PendingChange::Release {
            did: did.into(),
            seq: 0,
        });
        for h in held {
            out.pending.push(PendingChange::Release {
                did: did.into(),
                seq: h.seq,
            });
            // Held again if an earlier one broke the chain anew (then Hold follows Release).
            self.frame(h.seq, &h.frame, None, out)?;
        }
        Ok(())
    }
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
    // Nothing is lost without them: the events are then sealed as JSON.
    let rows = p
        .stored_rows(frame)
        .inspect_err(|e| tracing::debug!(seq, error = %e, "frame's events kept without rows"))
        .ok();
    push_parts(
        p,
        |i| rows.as_ref().and_then(|r| r.get(i)).map(|r| r.row(0, 0)),
        out,
    );
}

/// Pushes the events of `p` into `out`, each with its `.jss` row (`row(i)`, seq and time for the
/// writer to assign) when there is one.
pub(crate) fn push_parts<'r>(
    p: &Projection,
    row: impl Fn(usize) -> Option<Row<'r>>,
    out: &mut DoneChunk,
) {
    for i in 0..p.len() {
        push_event(&mut out.buf, &mut out.parts, p, i, row(i));
    }
}

/// Appends event `i` of `p` to `buf` and `parts`: its DID, collection, its JSON in two pieces
/// around the `time_us` value and cursor (the writer's to stamp), and its `.jss` row.
pub(crate) fn push_event(
    buf: &mut Vec<u8>,
    parts: &mut Vec<Part>,
    p: &riptide_jetstream::Projection,
    i: usize,
    row: Option<Row<'_>>,
) {
    let did = push(buf, p.did(i).as_bytes());
    let collection = push(buf, p.collection(i).as_bytes());
    let head = push_with(buf, |b| p.render_head(i, b));
    let tail = push_with(buf, |b| p.render_tail(i, b));
    // A replacement's record (a `create-resync` row) is a commit v1 never sends.
    let kind = match row.map(|r| EventKind::of_row(r.kind)) {
        Some(EventKind::Replacement) => EventKind::Replacement,
        _ => p.kind(i),
    };
    // A column past a `.jss` row's width (a collection or record key over 255 bytes, which
    // their syntax allows) keeps its event as JSON.
    let row = row.filter(|r| r.validate().is_ok()).map(|r| RowAt {
        kind: r.kind,
        rkey: push(buf, r.rkey.as_bytes()),
        rev: push(buf, r.rev.as_bytes()),
        payload: push(buf, r.payload),
    });
    parts.push(Part {
        kind,
        did,
        collection,
        head,
        tail,
        row,
    });
}

impl Part {
    /// This part as a replacement's record (`crate::replace`): an event v1 never sends, its
    /// row a `create-resync`.
    pub(crate) fn replacement(mut self) -> Part {
        self.kind = EventKind::Replacement;
        if let Some(r) = self.row.as_mut().filter(|r| r.kind == Kind::Create) {
            r.kind = Kind::CreateResync;
        }
        self
    }

    /// This part with its ranges moved `by` bytes on (copied to the end of another buffer).
    pub(crate) fn shifted(&self, by: usize) -> Part {
        let m = |r: &Range<usize>| r.start + by..r.end + by;
        Part {
            kind: self.kind,
            did: m(&self.did),
            collection: m(&self.collection),
            head: m(&self.head),
            tail: m(&self.tail),
            row: self.row.as_ref().map(|r| RowAt {
                kind: r.kind,
                rkey: m(&r.rkey),
                rev: m(&r.rev),
                payload: m(&r.payload),
            }),
        }
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
    queue: Option<mpsc::UnboundedSender<String>>,
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
    // The batch's rows, one per event while every event has one: their columns in `row_buf`.
    let mut row_at: Vec<(Kind, [Range<usize>; 5])> = Vec::new();
    let mut row_buf: Vec<u8> = Vec::new();
    let mut all_rows;
    // The batch's account states, the last per DID (a batch holds one write per key).
    let mut states: HashMap<Box<str>, AccountState> = HashMap::new();
    let mut state_list: Vec<(Box<str>, AccountState)> = Vec::new();
    // The batch's changes to the resync partition, the last per key (in batch order), and the
    // accounts to queue once it is durable.
    let mut pending: std::collections::BTreeMap<(Box<str>, u64), Option<Bytes>> =
        std::collections::BTreeMap::new();
    let mut pending_list: Vec<PendingChange> = Vec::new();
    let mut queued: Vec<Box<str>> = Vec::new();
    // Landed repositories' progress entries, and their sinks to tell once durable.
    let mut progress: Vec<(Box<str>, Vec<u8>)> = Vec::new();
    let mut acks: Vec<std::sync::mpsc::SyncSender<u64>> = Vec::new();
    // The batch's replacements (`crate::replace`), counted once they are durable.
    let mut replaced: Vec<crate::replace::Replaced> = Vec::new();
    let mut received: Vec<i64> = Vec::with_capacity(max_batch);
    let mut json = Vec::with_capacity(1 << 14);
    let mut zbuf = Vec::new();
    // A worker that is gone (it panicked: `join` reports it) ends the run after what came before
    // it is stored.
    let mut worker_gone = false;
    while let Ok(first) = order.recv() {
        events.clear();
        received.clear();
        row_at.clear();
        row_buf.clear();
        all_rows = true;
        let mut batch_bytes = 0;
        // Asked once a batch: a subscriber that arrives meanwhile gets the batch's frames
        // compressed when they are sent (`crate::log`).
        let zstd_wanted = log.zstd_demand().wanted();
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
                for p in &d.pending[frame.pending.clone()] {
                    match p {
                        PendingChange::Hold { did, seq, frame } => {
                            pending.insert((did.clone(), *seq), Some(frame.clone()))
                        }
                        PendingChange::Release { did, seq } => {
                            pending.insert((did.clone(), *seq), None)
                        }
                    };
                }
                queued.extend_from_slice(&d.queued[frame.queued.clone()]);
                progress.extend_from_slice(&d.progress[frame.progress.clone()]);
                acks.extend(frame.ack.clone());
                for p in &d.parts[frame.parts.clone()] {
                    let seq = resume.next_seq;
                    let time_us = crate::now_us().max(resume.last_time_us + 1);
                    json.clear();
                    json.extend_from_slice(&d.buf[p.head.clone()]);
                    write_json_int(&mut json, time_us);
                    json.extend_from_slice(b",\"cursor\":");
                    write_json_int(&mut json, seq as i64);
                    json.extend_from_slice(&d.buf[p.tail.clone()]);
                    let z: &[u8] = match compressor.as_mut().filter(|_| zstd_wanted) {
                        Some(c) => compress_into(c, &json, &mut zbuf).map_err(DictError::Zstd)?,
                        None => &[],
                    };
                    let did = std::str::from_utf8(&d.buf[p.did.clone()]).unwrap_or_default();
                    let coll =
                        std::str::from_utf8(&d.buf[p.collection.clone()]).unwrap_or_default();
                    batch_bytes += json.len();
                    events.push(Event::encode(seq, time_us, p.kind, did, coll, &json, z));
                    match &p.row {
                        Some(r) if all_rows => {
                            let mut col =
                                |at: &Range<usize>| push(&mut row_buf, &d.buf[at.clone()]);
                            let cols = [
                                col(&p.did),
                                col(&p.collection),
                                col(&r.rkey),
                                col(&r.rev),
                                col(&r.payload),
                            ];
                            row_at.push((r.kind, cols));
                        }
                        _ => all_rows = false,
                    }
                    resume.next_seq += 1;
                    resume.last_time_us = time_us;
                }
                if frame.moves_cursor {
                    resume.upstream_cursor = Some(frame.seq);
                }
                if let Some(r) = frame.replaced {
                    replaced.push(r);
                }
            }
            // A batch also ends at BATCH_BYTES of events: pieces of a landing (each its own
            // job) are not gathered back into one huge batch.
            if received.len() < max_batch && batch_bytes < BATCH_BYTES {
                ids = order.try_recv().ok();
            }
        }
        let t0 = Instant::now();
        state_list.clear();
        state_list.extend(states.drain());
        pending_list.clear();
        pending_list.extend(pending.iter().map(|((did, seq), f)| match f {
            Some(frame) => PendingChange::Hold {
                did: did.clone(),
                seq: *seq,
                frame: frame.clone(),
            },
            None => PendingChange::Release {
                did: did.clone(),
                seq: *seq,
            },
        }));
        pending.clear();
        crate::faults::ingest_panic();
        let rows: Option<Vec<Row<'_>>> = all_rows.then(|| {
            let text = |r: &Range<usize>| std::str::from_utf8(&row_buf[r.clone()]).unwrap_or("");
            events
                .iter()
                .zip(&row_at)
                .map(|(e, (kind, [did, coll, rkey, rev, payload]))| Row {
                    seq: e.seq(),
                    witnessed_at: e.time_us(),
                    indexed_at: 0,
                    kind: *kind,
                    did: text(did),
                    collection: text(coll),
                    rkey: text(rkey),
                    rev: text(rev),
                    payload: &row_buf[payload.clone()],
                })
                .collect()
        });
        if let Some(p) = publisher.as_mut() {
            // Before the store: the external log is never behind it (crate::publish).
            p.publish(
                &events,
                rows.as_deref(),
                &state_list,
                &pending_list,
                &progress,
                &resume,
            )?;
        }
        append_until_stored(
            &log,
            &metrics,
            &events,
            rows.as_deref(),
            &state_list,
            &pending_list,
            &progress,
            &resume,
        )?;
        progress.clear();
        for a in acks.drain(..) {
            // A sink that stopped waiting is gone: nothing to tell.
            let _ = a.try_send(resume.next_seq);
        }
        if let Some(q) = &queue {
            for did in queued.drain(..) {
                metrics.resync_queued.fetch_add(1, Relaxed);
                crate::said::say("chain break", "riptide_resync_queued_total", || {
                    tracing::warn!(did = %did, "chain break or upstream #sync: account queued for resync; its frames are held until it lands");
                });
                let _ = q.send(did.into());
            }
        }
        queued.clear();
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
        for r in replaced.drain(..) {
            metrics.replaced(r);
        }
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
#[allow(clippy::too_many_arguments)]
fn append_until_stored(
    log: &Log,
    metrics: &Metrics,
    events: &[Event],
    rows: Option<&[Row<'_>]>,
    accounts: &[(Box<str>, AccountState)],
    pending: &[PendingChange],
    progress: &[(Box<str>, Vec<u8>)],
    resume: &Resume,
) -> Result<(), StoreError> {
    let mut wait = STORE_RETRY_FIRST;
    let mut failures = 0u64;
    let mut poisoned = false;
    let mut rows = rows;
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
            None => log
                .store()
                .append_all(events, rows, accounts, pending, progress, resume),
        };
        match r {
            // Not the disk's doing, so not retried as it is: a bug between the rows and the
            // events, said; the batch is stored as JSON, nothing lost.
            Err(e @ StoreError::Rows { .. }) => {
                tracing::error!(error = %e, "the batch's rows were refused: stored as JSON");
                rows = None;
            }
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

#[cfg(test)]
mod tests {
    use super::*;
    use riptide_firehose::corpus::split_frames;

    /// A worker reads a frame's DID and kind from its `Route` instead of peeking again: on every
    /// frame of the real capture, and on a frame that does not decode, the two agree.
    #[test]
    fn route_reads_what_peek_reads() {
        let Some(data) = riptide_testdata::read("jetstream-2026-07/firehose-frames.bin") else {
            return;
        };
        let frames = split_frames(&data).expect("the capture splits");
        assert_eq!(frames.len(), 150);
        let mut arena = Arena::new();
        let mut with_did = 0;
        for f in frames.iter().map(|f| f.bytes) {
            let p = peek(&mut arena, f);
            let route = Route::of(&p, f);
            assert_eq!(route.did(f), p.did);
            assert_eq!(route.sync, p.kind == "sync");
            with_did += usize::from(p.did.is_some());
        }
        assert!(with_did >= 148, "only {with_did} frames had a DID");
        let garbage = [0xffu8; 8];
        let p = peek(&mut arena, &garbage);
        let route = Route::of(&p, &garbage);
        assert_eq!((route.did(&garbage), route.sync), (None, false));
    }
}
