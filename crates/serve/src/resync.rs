//! Resync in `riptide serve`: a desynchronized account's repository fetched and verified, its
//! frames held meanwhile, and its chain carried on from the verified state.
//!
//! Why: a chain break (`riptide_firehose::chain`) means commits of the account are missing
//! between its stored state and the frame that arrived. `riptide verify` can only note it; a
//! server can repair it, as the sync spec asks: fetch the account's current repository, verify it
//! whole, and take its commit as the new state. [`riptide_resolver::Resyncer`] does the fetch and
//! the verification under the peers' limits; this module decides when, and what happens to the
//! account's frames around it.
//!
//! **The life of a resync.**
//! 1. A worker meets a chain break (`ingest.rs`). The breaking commit is refused as always, the
//!    account's state becomes `resyncing`, and a queue mark is written to the store's `pending`
//!    partition in the same batch as the state (so a crash cannot lose the queue entry).
//! 2. Once that batch is durable, the writer hands the DID to the [`ResyncService`], which
//!    fetches and verifies the repository (at most [`ResyncLimits::concurrency`] at once, never
//!    on ingest's threads: a huge repository stalls no one else). A failed attempt is a
//!    `resync-failed` verdict (counted, logged at warn with every source's reason) and is retried
//!    with backoff, doubling from [`ResyncLimits::first_retry`] to [`ResyncLimits::max_retry`],
//!    for as long as the account still needs it; the per-account rate limit (5 a minute) is
//!    waited out, not counted as a failure. A resync task that dies (a panic) is caught at its
//!    boundary: `resync-failed` (reason `panicked`), logged at error, and run again with the
//!    same backoff, so its account never stays "in flight" with no one working on it.
//! 3. Meanwhile every frame of the account except `#sync` (commits, `#identity`, `#account`, in
//!    upstream order) is **held**: in the worker's memory and, in the same batch as the upstream
//!    cursor that passes it, in the `resync` partition. Nothing of the account is served. The
//!    hold is bounded per account ([`ResyncLimits::per_account_frames`]) and in bytes across all
//!    accounts ([`ResyncLimits::total_bytes`]); a frame over either bound is dropped with the
//!    verdict `resync-overflow` (its account's chain will break again after the resync, and be
//!    resynced again: bounded memory, nothing silent).
//! 4. The verified repository lands: it goes to the account's worker through the dispatcher, in
//!    upstream order with the frames. Its commit becomes the account's state (`synchronized`),
//!    unless it is older than the account's stored tip (a stale mirror). The resolver is told
//!    that tip before each attempt and skips a source whose repository is older, asking the next
//!    (relays, then the PDS); an attempt where no source had a recent enough one is
//!    `resync-failed` (reason `stale`, once per stale answer, even when a later source had a
//!    good one) and retried with backoff. One that still lands stale (the
//!    tip moved meanwhile) is counted in `riptide_resync_stale_total` and as `resync-failed`
//!    (`stale`), and the account is queued again. The held frames are then
//!    verified against the new state in their order — those the repository already covers are
//!    `superseded` (inside the repository: [`riptide_firehose::chain::Tip::from_repo`]), those
//!    that continue it are `ok` and served — and released from the store,
//!    in one batch with the events they produce.
//! 5. A `#sync` frame from upstream that verifies (its commit signed by the account's key, its
//!    rev past the account's) starts a resync the same way, whether or not one is under way: its
//!    commit becomes the account's tip (so a repository older than it is stale), the account's
//!    later frames are held, and its repository is fetched; the upstream `#sync` itself is not
//!    stored, since the landing brings its own (a `#sync` with no records after it would tell a
//!    v2 subscriber to drop the account and give it nothing back). Jetstream v2 does the same: its
//!    verifier resyncs the repository on every `#sync` and archives the records after it.
//!
//! **In pieces.** A repository of more than [`ResyncLimits::landing_records`] records lands in
//! pieces of at most that many ([`Landing::pieces`]), each its own ingest job and so its own
//! store batch (the writer also ends a batch at 16 MiB of events): what one landing renders at
//! once is a piece, not the repository (the verified CAR itself is shared by the pieces). The
//! first piece carries the `#sync` and is checked for staleness (a stale one drops the rest);
//! the account stays `resyncing`, its frames held, until the last piece, which carries its new
//! state and the release. After `kill -9` between pieces the account is still marked and is
//! resynced again at the next start: a new `#sync`, then the whole repository, so a v2
//! subscriber that drops the account at each `#sync` holds exactly the repository.
//!
//! **What subscribers see.** A resync that lands replaces the account's earlier rows
//! (`crate::replace`): a `#sync` event carrying the verified commit (a `#sync` frame riptide
//! builds: the commit block in a CAR, the account's DID and rev, the upstream seq at which the new
//! state took effect, the time it landed), then one `create-resync` row per record of the
//! repository, in MST key order, at its rev — in the same batch as the new state. Jetstream v2's
//! `subscribeEvents` sends the `#sync` (its lexicon: "broken commit chain; consumers should
//! resync the repo") and each record as a `#commit` with `operation: "create"`, as Jetstream
//! does: a consumer that drops the account at the `#sync` and applies the creates holds exactly
//! the repository. The frozen v1 `/subscribe` never sends `#sync` (Jetstream's rule) but sends
//! the records as `create` commits (where Jetstream's v1 wire skips them: `docs/archive.md`,
//! "Replacement rows", says why): a v1 consumer gets every record of the repository, but is not
//! told of records deleted in the gap. Commits of the gap the repository covers are counted as
//! `superseded`.
//!
//! **Crashes.** Everything above that matters is in the store and written atomically with the
//! upstream cursor: the `resyncing` state, the queue mark, every held frame, and their release
//! with the events they produced. After `kill -9` the next start reloads the held frames into
//! the workers that own their accounts and queues every marked account again
//! (`load_pending`); frames after the cursor are verified again as always. A resync in flight
//! at the crash is simply done again.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use riptide_firehose::chain::SyncStatus;
use riptide_firehose::verify::Verdict;
use riptide_resolver::{ResyncError, Resynced, Resyncer};
use tokio::sync::{mpsc, Semaphore};

use crate::metrics::{Metrics, ResyncFailure};
use crate::Store;
use riptide_store::store::{PendingChange, StoreError};

/// Resync bounds.
#[derive(Clone, Debug)]
pub struct ResyncLimits {
    /// Frames held for one account awaiting resync (default 1,000).
    pub per_account_frames: usize,
    /// Bytes of frames held across all accounts (default 256 MiB), shared evenly by the
    /// verification workers.
    pub total_bytes: usize,
    /// Resyncs fetched and verified at once (default 8; per host the resolver's limit holds).
    pub concurrency: usize,
    /// Wait before retrying a failed resync (default 30 s), doubling each time...
    pub first_retry: Duration,
    /// ...up to this (default 10 min).
    pub max_retry: Duration,
    /// Records per landing piece (default 10,000, `--landing-records`'s; module docs, "In
    /// pieces").
    pub landing_records: usize,
}

impl Default for ResyncLimits {
    fn default() -> ResyncLimits {
        ResyncLimits {
            per_account_frames: 1000,
            total_bytes: 256 << 20,
            concurrency: 8,
            first_retry: Duration::from_secs(30),
            max_retry: Duration::from_secs(600),
            landing_records: riptide_backfill::landing::PIECE_RECORDS,
        }
    }
}

/// A piece of a verified repository on its way to the account's worker (module docs, "In
/// pieces").
#[derive(Debug)]
pub struct Landing {
    /// What the resolver fetched and verified (shared by its pieces).
    pub resynced: Arc<Resynced>,
    /// Its records, found once for all its pieces (`None`: its CAR did not read).
    pub(crate) index: Option<Arc<Vec<crate::replace::RecordAt>>>,
    /// Records whose key is not `collection/rkey` (not emitted; the first piece counts them).
    pub(crate) unread: u64,
    /// Which of its records this piece lands.
    pub piece: LandingPiece,
}

/// Where a [`Landing`] lies in its repository: its records `skip..skip + take` in MST key
/// order, and whether it is the first (the `#sync`, the staleness check) or the last (the
/// account's new state, the release of its held frames).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LandingPiece {
    /// The first piece.
    pub first: bool,
    /// The last piece.
    pub last: bool,
    /// Records before this piece's.
    pub skip: usize,
    /// Records in this piece (the last: the rest).
    pub take: usize,
}

impl Landing {
    /// `resynced` in pieces of at most `records` records (at least 1; one piece for a
    /// repository that has no more, or none).
    pub fn pieces(resynced: Resynced, records: usize) -> Vec<Landing> {
        let per = records.max(1);
        let (index, unread) = match crate::replace::car_index(&resynced.car) {
            Ok((index, unread)) => (Some(Arc::new(index)), unread),
            Err(e) => {
                tracing::error!(did = %resynced.did, error = %e, "a resynced repository's records do not read: none emitted");
                (None, resynced.records as u64)
            }
        };
        let n = index.as_ref().map_or(0, |i| i.len()).div_ceil(per).max(1);
        let resynced = Arc::new(resynced);
        (0..n)
            .map(|i| Landing {
                resynced: resynced.clone(),
                index: index.clone(),
                unread: if i == 0 { unread } else { 0 },
                piece: LandingPiece {
                    first: i == 0,
                    last: i + 1 == n,
                    skip: i * per,
                    take: if i + 1 == n { usize::MAX } else { per },
                },
            })
            .collect()
    }
}

/// How ingest reaches the resync service and hears back from it ([`ResyncService::start`]).
#[derive(Debug)]
pub struct ResyncWiring {
    /// DIDs to resync (sent by ingest's writer once the queue mark is durable).
    pub queue: mpsc::UnboundedSender<String>,
    /// Verified repositories, for the dispatcher.
    pub landings: mpsc::UnboundedReceiver<Landing>,
    /// The bounds of held frames.
    pub limits: ResyncLimits,
    /// Set by [`ResyncStop::stop`].
    pub(crate) stopped: Arc<AtomicBool>,
}

impl ResyncWiring {
    /// A handle that stops the service and lets ingest end without waiting for the resyncs a
    /// finite source caused (they resume from the store at the next start).
    pub fn stopper(&self) -> ResyncStop {
        ResyncStop(self.stopped.clone())
    }
}

/// Stops a [`ResyncService`] ([`ResyncWiring::stopper`]).
#[derive(Clone, Debug)]
pub struct ResyncStop(Arc<AtomicBool>);

impl ResyncStop {
    /// No more resyncs; ingest no longer waits for them.
    pub fn stop(&self) {
        self.0.store(true, Relaxed);
    }
}

/// The resync service: a task that resyncs the accounts ingest queues.
#[derive(Debug)]
pub struct ResyncService;

impl ResyncService {
    /// Starts the service on the current tokio runtime: accounts are fetched from `relays`
    /// (their `subscribeRepos` URLs) and then their PDS, verified by `resyncer`. A retry asks
    /// `store` first whether the account still awaits resync.
    pub fn start(
        resyncer: Resyncer,
        relays: Vec<String>,
        limits: ResyncLimits,
        store: Store,
        metrics: Arc<Metrics>,
    ) -> ResyncWiring {
        let (queue, mut dids) = mpsc::unbounded_channel::<String>();
        let (landed, landings) = mpsc::unbounded_channel();
        let slots = Arc::new(Semaphore::new(limits.concurrency.max(1)));
        let in_flight: Arc<Mutex<HashSet<String>>> = Arc::default();
        let cfg = limits.clone();
        let stopped = Arc::new(AtomicBool::new(false));
        let stop = stopped.clone();
        tokio::spawn(async move {
            while let Some(did) = dids.recv().await {
                if !lock(&in_flight).insert(did.clone()) {
                    continue; // already being resynced
                }
                let job = Job {
                    resyncer: resyncer.clone(),
                    relays: relays.clone(),
                    limits: cfg.clone(),
                    store: store.clone(),
                    metrics: metrics.clone(),
                    landed: landed.clone(),
                    slots: slots.clone(),
                    in_flight: in_flight.clone(),
                    stopped: stop.clone(),
                };
                tokio::spawn(job.supervise(did));
            }
        });
        ResyncWiring {
            queue,
            landings,
            limits,
            stopped,
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[derive(Clone)]
struct Job {
    resyncer: Resyncer,
    relays: Vec<String>,
    limits: ResyncLimits,
    store: Store,
    metrics: Arc<Metrics>,
    landed: mpsc::UnboundedSender<Landing>,
    slots: Arc<Semaphore>,
    in_flight: Arc<Mutex<HashSet<String>>>,
    stopped: Arc<AtomicBool>,
}

impl Job {
    /// Runs the account's resync on its own task, and again (with backoff) if that task dies.
    async fn supervise(self, did: String) {
        let job = self.clone();
        supervise(
            &did,
            &self.limits,
            &self.stopped,
            &self.metrics,
            &self.in_flight,
            move |d| job.clone().run(d),
        )
        .await;
    }

    async fn run(self, did: String) {
        let mut wait = self.limits.first_retry;
        let mut first = true;
        while !self.stopped.load(Relaxed) {
            // Still needed? A `#sync` may have resynchronized the account meanwhile. (The first
            // time it is: ingest queued it once its state was durable.) And since when: a
            // repository older than the stored tip is stale, and the next source is asked.
            let store = self.store.clone();
            let d = did.clone();
            let state = match tokio::task::spawn_blocking(move || store.account(&d)).await {
                Ok(Ok(s)) => s,
                _ => break,
            };
            let resyncing = state.is_some_and(|s| s.sync == SyncStatus::Resyncing);
            if !first && !resyncing {
                break;
            }
            first = false;
            // (Resynchronized before the first attempt: its tip says nothing about this resync,
            // which lands "after the account was resynchronized" and is ignored, as ever.)
            let min_rev = state
                .filter(|_| resyncing)
                .and_then(|s| s.tip)
                .map(|t| t.rev);
            let outcome = {
                let Ok(_slot) = self.slots.acquire().await else {
                    break;
                };
                // A guard, not a pair of adds: the gauge comes down even if the resync panics.
                let _busy = Busy::new(&self.metrics.resync_in_flight);
                self.resyncer
                    .resync_since(&did, &self.relays, min_rev)
                    .await
            };
            match outcome {
                Ok(resynced) => {
                    // Each stale answer is a failure, even when a later source did better.
                    for _ in 0..resynced.stale_sources {
                        self.metrics.resync_failed(ResyncFailure::Stale);
                    }
                    self.metrics.resync_bytes.fetch_add(resynced.bytes, Relaxed);
                    self.metrics
                        .resync_records
                        .fetch_add(resynced.records as u64, Relaxed);
                    tracing::info!(
                        did, rev = %resynced.rev, records = resynced.records, bytes = resynced.bytes,
                        source = %resynced.source, "resync verified"
                    );
                    // Out of the in-flight set first: a stale landing queues the account again.
                    lock(&self.in_flight).remove(&did);
                    for piece in Landing::pieces(resynced, self.limits.landing_records) {
                        let _ = self.landed.send(piece);
                    }
                    return;
                }
                Err(ResyncError::RateLimited { retry_in, .. }) => {
                    tokio::time::sleep(retry_in).await;
                }
                Err(e) => {
                    match e.stale_sources() {
                        0 => self.metrics.resync_failed(ResyncFailure::Sources),
                        n => (0..n).for_each(|_| self.metrics.resync_failed(ResyncFailure::Stale)),
                    }
                    crate::said::say("resync failed", "riptide_resync_failed_total", || {
                        tracing::warn!(
                            did, error = %e, retry_in = ?wait,
                            "resync failed: the account's frames stay held, none served"
                        );
                    });
                    tokio::time::sleep(wait).await;
                    wait = wait.saturating_mul(2).min(self.limits.max_retry);
                }
            }
        }
        lock(&self.in_flight).remove(&did);
    }
}

/// One more on a gauge for as long as it lives.
struct Busy<'a>(&'a AtomicU64);

impl<'a> Busy<'a> {
    fn new(gauge: &'a AtomicU64) -> Busy<'a> {
        gauge.fetch_add(1, Relaxed);
        Busy(gauge)
    }
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
}

/// Runs `attempt(did)` on a task of its own until it returns, at the task boundary catching its
/// death: a resync task that panics (issue 40: an input-fed `Instant + Duration` overflowed) is
/// a `resync-failed` (`panicked`), logged at error (the first time; warn after), and run again
/// after backoff as a failed fetch would be. The account leaves `in_flight` when the attempt
/// does not (a panic, the runtime ending, the service stopped), so it can always be queued
/// again; an attempt that returns has removed it itself (before its landing is sent).
async fn supervise<F, Fut>(
    did: &str,
    limits: &ResyncLimits,
    stopped: &AtomicBool,
    metrics: &Metrics,
    in_flight: &Mutex<HashSet<String>>,
    mut attempt: F,
) where
    F: FnMut(String) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let mut wait = limits.first_retry;
    let mut deaths = 0u64;
    loop {
        let died = match tokio::spawn(attempt(did.to_owned())).await {
            Ok(()) => return,
            Err(e) if e.is_panic() => e.into_panic(),
            Err(_) => break, // cancelled: the runtime is shutting down
        };
        deaths += 1;
        metrics.resync_failed(ResyncFailure::Panicked);
        let why = died
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| died.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        if deaths == 1 {
            tracing::error!(did, panic = %why, retry_in = ?wait, "resync task died: retried after backoff; its frames stay held");
        } else {
            tracing::warn!(did, panic = %why, deaths, retry_in = ?wait, "resync task died again");
        }
        tokio::time::sleep(wait).await;
        wait = wait.saturating_mul(2).min(limits.max_retry);
        if stopped.load(Relaxed) {
            break;
        }
    }
    lock(in_flight).remove(did);
}

/// A frame held for an account awaiting resync.
#[derive(Clone, Debug)]
pub(crate) struct Held {
    pub seq: u64,
    pub frame: Bytes,
}

/// One worker's held frames and the accounts it is resyncing (module docs, step 3).
#[derive(Debug, Default)]
pub(crate) struct Holds {
    resyncing: HashSet<Box<str>>,
    held: HashMap<Box<str>, VecDeque<Held>>,
    bytes: usize,
    max_bytes: usize,
    per_account: usize,
    /// Accounts whose overflow was already logged in this resync (said once).
    overflowed: HashSet<Box<str>>,
}

impl Holds {
    /// Holds within `limits`, this worker's share of the bytes being `1/workers`.
    pub fn new(limits: &ResyncLimits, workers: usize) -> Holds {
        Holds {
            max_bytes: limits.total_bytes / workers.max(1),
            per_account: limits.per_account_frames,
            ..Holds::default()
        }
    }

    /// Whether any account of this worker awaits resync (if not, no frame needs looking at).
    pub fn any(&self) -> bool {
        !self.resyncing.is_empty()
    }

    /// Whether `did` awaits resync.
    pub fn is_resyncing(&self, did: &str) -> bool {
        self.resyncing.contains(did)
    }

    /// Whether frames of `did` are held (for its resync or, with `serve --backfill`, its
    /// repository: `crate::backfill`).
    pub fn holds_any(&self, did: &str) -> bool {
        self.held.contains_key(did)
    }

    /// The accounts with frames held that await no resync: those held for the backfill
    /// (`crate::backfill`), including those reloaded at start.
    pub fn awaiting_backfill(&self) -> Vec<Box<str>> {
        let mut v: Vec<Box<str>> = self
            .held
            .keys()
            .filter(|d| !self.resyncing.contains(*d))
            .cloned()
            .collect();
        v.sort();
        v
    }

    /// `did` awaits resync from now on.
    pub fn start(&mut self, did: &str, metrics: &Metrics) {
        if self.resyncing.insert(did.into()) {
            metrics.resync_accounts.fetch_add(1, Relaxed);
        }
    }

    /// Holds a frame of `did`; `false` if a bound is reached (`resync-overflow`, logged once per
    /// resync of the account).
    pub fn hold(&mut self, did: &str, h: Held, metrics: &Metrics) -> bool {
        let q = Self::queue(&mut self.held, did, metrics);
        if q.len() >= self.per_account || self.bytes + h.frame.len() > self.max_bytes {
            metrics.verdict(Verdict::ResyncOverflow);
            if self.overflowed.insert(did.into()) {
                tracing::warn!(
                    did, seq = h.seq, held = q.len(), held_bytes = self.bytes,
                    "resync buffer full: frame dropped (resync-overflow); the account will be resynced again"
                );
            }
            return false;
        }
        self.bytes += h.frame.len();
        metrics.resync_held.fetch_add(1, Relaxed);
        q.push_back(h);
        true
    }

    /// Ends `did`'s resync: its held frames, in upstream order.
    pub fn finish(&mut self, did: &str, metrics: &Metrics) -> VecDeque<Held> {
        if self.resyncing.remove(did) {
            metrics.resync_accounts.fetch_sub(1, Relaxed);
        }
        self.overflowed.remove(did);
        let q = match self.held.remove(did) {
            Some(q) => {
                metrics.resync_held_accounts.fetch_sub(1, Relaxed);
                q
            }
            None => VecDeque::new(),
        };
        self.bytes -= q.iter().map(|h| h.frame.len()).sum::<usize>();
        metrics.resync_held.fetch_sub(q.len() as u64, Relaxed);
        q
    }

    /// `did`'s queue of held frames, made (and counted) if it has none.
    fn queue<'h>(
        held: &'h mut HashMap<Box<str>, VecDeque<Held>>,
        did: &str,
        metrics: &Metrics,
    ) -> &'h mut VecDeque<Held> {
        held.entry(did.into()).or_insert_with(|| {
            metrics.resync_held_accounts.fetch_add(1, Relaxed);
            VecDeque::new()
        })
    }
}

/// What the store's `resync` partition held at start, split by worker: each worker's
/// [`Holds`], and the accounts to queue again.
pub(crate) fn load_pending(
    store: &Store,
    limits: &ResyncLimits,
    workers: usize,
    owner: impl Fn(&str) -> usize,
    metrics: &Metrics,
) -> Result<(Vec<Holds>, Vec<String>), StoreError> {
    let mut holds: Vec<Holds> = (0..workers).map(|_| Holds::new(limits, workers)).collect();
    let mut queue = Vec::new();
    for (did, seq, frame) in store.held()? {
        let h = &mut holds[owner(&did).min(workers - 1)];
        if seq == 0 {
            h.start(&did, metrics);
            queue.push(did);
        } else {
            // Held before the crash, so within the bounds then; kept whatever the bounds now.
            h.bytes += frame.len();
            metrics.resync_held.fetch_add(1, Relaxed);
            Holds::queue(&mut h.held, &did, metrics).push_back(Held { seq, frame });
        }
    }
    Ok((holds, queue))
}

/// The queue mark of `did` (module docs, step 1).
pub(crate) fn mark(did: &str) -> PendingChange {
    PendingChange::Hold {
        did: did.into(),
        seq: 0,
        frame: Bytes::new(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[tokio::test]
    async fn a_resync_task_that_dies_is_counted_and_run_again() {
        let limits = ResyncLimits {
            first_retry: Duration::from_millis(10),
            max_retry: Duration::from_millis(20),
            ..ResyncLimits::default()
        };
        let metrics = Metrics::default();
        let in_flight: Arc<Mutex<HashSet<String>>> = Arc::default();
        lock(&in_flight).insert("did:plc:a".to_owned());
        let runs = Arc::new(AtomicUsize::new(0));
        let (r, f) = (runs.clone(), in_flight.clone());
        supervise(
            "did:plc:a",
            &limits,
            &AtomicBool::new(false),
            &metrics,
            &in_flight,
            move |did| {
                let (r, f) = (r.clone(), f.clone());
                async move {
                    if r.fetch_add(1, Relaxed) < 2 {
                        panic!("deliberately, in a test");
                    }
                    // A run that returns leaves the in-flight set itself.
                    lock(&f).remove(&did);
                }
            },
        )
        .await;
        assert_eq!(runs.load(Relaxed), 3, "run again after each death");
        assert_eq!(metrics.resync_failure_count(ResyncFailure::Panicked), 2);
        assert_eq!(metrics.verdict_count(Verdict::ResyncFailed), 2);
        assert!(lock(&in_flight).is_empty());

        // Stopped meanwhile: not run again, and the account leaves the in-flight set.
        lock(&in_flight).insert("did:plc:b".to_owned());
        supervise(
            "did:plc:b",
            &limits,
            &AtomicBool::new(true),
            &metrics,
            &in_flight,
            |_| async { panic!("deliberately, in a test") },
        )
        .await;
        assert!(lock(&in_flight).is_empty(), "released");
        assert_eq!(metrics.resync_failure_count(ResyncFailure::Panicked), 3);
        assert!(metrics
            .render(&[])
            .contains("riptide_resync_failed_total{reason=\"panicked\"} 3"));
    }
}
