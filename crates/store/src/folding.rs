//! Folding wired into the store: tombstones in the ingest batch, the compaction thread, and the
//! pruning of tombstones that have done their work.
//!
//! Why a module: [`crate::tombstones`] and [`crate::compact`] are the parts of folding
//! (`docs/archive.md`, "Folding"); this is where the store runs them, and the only place that
//! knows which thread does what:
//!
//! - **The ingest writer** derives each batch's tombstones from its rows
//!   ([`crate::tombstones::derive_each`]) and writes them into the same atomic batch, so a
//!   tombstone is durable exactly when its row is. A row whose `#account` payload does not decode
//!   is stored as it is and creates no tombstone (its account's earlier rows stay: folding keeps
//!   too much, never too little); the typed error is said (throttled) and counted
//!   (`riptide_store_tombstone_errors_total`). Between its batches the writer also prunes
//!   ([`Tombstones::prune`]) the tombstones at or below the last pass's `compaction_seq`: only
//!   there, under the writer's lock, can no batch raise a key between the prune's read and its
//!   write (a raise the prune did not see would be removed with the old value).
//! - **The compaction thread** ([`Store::start_compaction`]) runs [`Folder::pass`] when asked
//!   ([`Store::request_compaction`]: the sealer calls it after each new segment) and every
//!   `interval` besides (a pass with nothing new to fold reads one partition and stops). It hands
//!   the path of each file a pass rewrote to the server's callback (`SealedSegments::add`). It
//!   never takes the writer's lock, so it never blocks ingest; its writes are its own fjall
//!   batches. A pass that fails is said (throttled) and counted, and the next request or tick
//!   tries again (a pass is idempotent: `docs/archive.md`, "Crash-safety points").
//! - **At open** [`Folder::recover`] runs before anything else touches the segments. If it
//!   fails (a segment file named by an entry cannot be read) the store still opens, the failure
//!   is said and counted, and the thread retries it before each pass, running none until it
//!   succeeds.
//!
//! The counters ([`FoldingStats`]) are kept here and written by the server at `/metrics`.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration;

use fjall::{Batch, Keyspace};
use riptide_segment::Row;
use riptide_throttle::{Say, Throttle};

use crate::catalog::SegmentEntry;
use crate::compact::{CompactError, CrashPoint, Folder};
use crate::event::Text;
use crate::store::{Store, StoreError};
use crate::tombstones::{derive_each, TombstoneError, Tombstones};

/// The segment files' directory under a data directory.
pub const SEGMENTS_DIR: &str = "segments";

/// How the compaction thread runs ([`Store::start_compaction`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CompactionConfig {
    /// A pass every this long even when none is requested (the fallback to
    /// [`Store::request_compaction`]).
    pub interval: Duration,
}

impl Default for CompactionConfig {
    /// A pass a minute at least: a sealed segment holds minutes to hours of the network.
    fn default() -> Self {
        CompactionConfig {
            interval: Duration::from_secs(60),
        }
    }
}

/// What folding did since the store was opened, for `/metrics`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FoldingStats {
    /// Passes that ended (including those with nothing to fold).
    pub passes: u64,
    /// Passes, recoveries and prunes that failed.
    pub failures: u64,
    /// Rows dropped from sealed segments.
    pub rows_dropped: u64,
    /// Segment files rewritten.
    pub segments_rewritten: u64,
    /// `meta.compaction_seq`: every sealed row up to it is folded.
    pub compaction_seq: u64,
    /// Tombstones held (fjall's approximate count, [`Tombstones::approximate_len`]).
    pub tombstones: u64,
    /// Tombstones removed by the writer after a pass.
    pub tombstones_pruned: u64,
    /// Rows whose tombstone could not be derived (an `#account` payload that does not decode).
    pub tombstone_errors: u64,
}

#[derive(Debug, Default)]
struct Counts {
    passes: AtomicU64,
    failures: AtomicU64,
    rows_dropped: AtomicU64,
    segments_rewritten: AtomicU64,
    /// The last pass's `compaction_seq`, published to the writer once the pass is durable.
    compaction_seq: AtomicU64,
    pruned: AtomicU64,
    tombstone_errors: AtomicU64,
}

type OnRewritten = Box<dyn Fn(&SegmentEntry, &Path) + Send + Sync>;
type Pause = Box<dyn Fn(CrashPoint, u32) + Send + Sync>;

/// The thread's wake-up: a pass requested, or the store closing.
#[derive(Debug, Default)]
struct Wake {
    state: Mutex<(bool, bool)>,
    signal: Condvar,
}

impl Wake {
    fn set(&self, request: bool, stop: bool) {
        let mut s = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        s.0 |= request;
        s.1 |= stop;
        self.signal.notify_all();
    }

    /// Waits for a request, the interval or the stop; `false` once stopped.
    fn wait(&self, interval: Duration) -> bool {
        let s = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (mut s, _) = self
            .signal
            .wait_timeout_while(s, interval, |(req, stop)| !*req && !*stop)
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        s.0 = false;
        !s.1
    }
}

struct Worker {
    wake: Arc<Wake>,
    handle: Option<JoinHandle<()>>,
}

/// The store's folding state, shared by every clone of the [`Store`] (dropped with the last,
/// which stops and joins the thread).
pub(crate) struct Folding {
    ks: Keyspace,
    segments: PathBuf,
    tombstones: Tombstones,
    counts: Arc<Counts>,
    /// Whether [`Folder::recover`] has succeeded since open.
    recovered: Arc<AtomicBool>,
    /// The `compaction_seq` the writer last pruned at.
    pruned_through: AtomicU64,
    worker: Mutex<Option<Worker>>,
}

impl std::fmt::Debug for Folding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Folding")
            .field("segments", &self.segments)
            .finish_non_exhaustive()
    }
}

/// Folding's complaints: rare, but a broken segment fails every pass.
fn throttle() -> &'static Throttle {
    static T: OnceLock<Throttle> = OnceLock::new();
    T.get_or_init(Throttle::default)
}

/// Says one failure of `kind` (throttled); the metric counts every one.
fn say(kind: &'static str, counted_in: &'static str, e: &dyn std::fmt::Display) {
    match throttle().say(kind) {
        Say::Full => tracing::error!(error = %e, counted_in, "{kind}"),
        Say::Quiet => {}
        Say::Summary { suppressed, total } => tracing::warn!(
            suppressed,
            total,
            "{kind}: {suppressed} more since the last line, {total} in all ({counted_in})"
        ),
    }
}

impl Folding {
    /// At open: the partitions, `compaction_seq`, and [`Folder::recover`] (module docs).
    pub(crate) fn open(ks: &Keyspace, data: &Path) -> Result<Folding, CompactError> {
        let segments = data.join(SEGMENTS_DIR);
        let folder = Folder::new(ks, &segments)?;
        let counts = Arc::new(Counts::default());
        counts
            .compaction_seq
            .store(folder.compaction_seq()?, Relaxed);
        let f = Folding {
            ks: ks.clone(),
            tombstones: folder.tombstones().clone(),
            segments,
            counts,
            recovered: Arc::default(),
            pruned_through: AtomicU64::new(0),
            worker: Mutex::new(None),
        };
        recover(&folder, &f.counts, &f.recovered);
        Ok(f)
    }

    /// On the writer's thread, holding its lock, before it builds a batch: prunes the
    /// tombstones a pass finished with since the last prune (module docs).
    pub(crate) fn prune(&self) {
        let folded = self.counts.compaction_seq.load(Relaxed);
        if folded <= self.pruned_through.load(Relaxed) {
            return;
        }
        match self.tombstones.prune(&self.ks, folded) {
            Ok(n) => {
                self.pruned_through.store(folded, Relaxed);
                self.counts.pruned.fetch_add(n as u64, Relaxed);
            }
            Err(e) => {
                self.counts.failures.fetch_add(1, Relaxed);
                say(
                    "pruning tombstones failed (retried before the next batch)",
                    "riptide_compaction_failures_total",
                    &e,
                );
            }
        }
    }

    /// Adds the tombstones of a batch's `rows` to `batch` (module docs).
    pub(crate) fn write_tombstones(&self, batch: &mut Batch, rows: &[Row<'_>]) {
        let ts = derive_each(rows, |e: TombstoneError| {
            self.counts.tombstone_errors.fetch_add(1, Relaxed);
            say(
                "a row's tombstone could not be derived; the row is stored, its account not folded",
                "riptide_store_tombstone_errors_total",
                &e,
            );
        });
        self.tombstones.write(batch, &ts);
    }

    fn stats(&self) -> FoldingStats {
        let c = &self.counts;
        FoldingStats {
            passes: c.passes.load(Relaxed),
            failures: c.failures.load(Relaxed),
            rows_dropped: c.rows_dropped.load(Relaxed),
            segments_rewritten: c.segments_rewritten.load(Relaxed),
            compaction_seq: c.compaction_seq.load(Relaxed),
            tombstones: self.tombstones.approximate_len() as u64,
            tombstones_pruned: c.pruned.load(Relaxed),
            tombstone_errors: c.tombstone_errors.load(Relaxed),
        }
    }

    fn start(
        &self,
        config: CompactionConfig,
        on_rewritten: OnRewritten,
        pause: Option<Pause>,
    ) -> Result<(), StoreError> {
        let mut worker = self
            .worker
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if worker.is_some() {
            return Ok(());
        }
        let mut folder = Folder::new(&self.ks, &self.segments)?;
        if let Some(pause) = pause {
            folder.crash_at(move |p, i| {
                pause(p, i);
                false
            });
        }
        let wake = Arc::new(Wake::default());
        let (counts, recovered, w) = (self.counts.clone(), self.recovered.clone(), wake.clone());
        let handle = std::thread::Builder::new()
            .name("riptide-compaction".into())
            .spawn(move || {
                while w.wait(config.interval) {
                    // A bug in a pass must not end folding for the life of the process: it is
                    // said and counted as a failure, and the next request tries again.
                    let once = std::panic::AssertUnwindSafe(|| {
                        run_once(&folder, &counts, &recovered, &on_rewritten)
                    });
                    if std::panic::catch_unwind(once).is_err() {
                        counts.failures.fetch_add(1, Relaxed);
                        say(
                            "compaction pass panicked (retried at the next request or interval)",
                            "riptide_compaction_failures_total",
                            &"see the panic message above",
                        );
                    }
                }
            })
            .map_err(|e| StoreError::Folding(CompactError::Thread(e)))?;
        *worker = Some(Worker {
            wake,
            handle: Some(handle),
        });
        Ok(())
    }

    fn request(&self) {
        if let Some(w) = &*self
            .worker
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
        {
            w.wake.set(true, false);
        }
    }
}

impl Drop for Folding {
    fn drop(&mut self) {
        let worker = self.worker.get_mut().unwrap_or_else(|p| p.into_inner());
        if let Some(mut w) = worker.take() {
            w.wake.set(false, true);
            if let Some(h) = w.handle.take() {
                // The thread holds no store clone, so this is never the thread itself; a pass in
                // progress finishes its current file first.
                let _ = h.join();
            }
        }
    }
}

/// [`Folder::recover`], said and counted if it fails.
fn recover(folder: &Folder, counts: &Counts, recovered: &AtomicBool) {
    match folder.recover() {
        Ok(r) => {
            if r.tmp_removed > 0 || !r.refreshed.is_empty() {
                tracing::warn!(
                    tmp_removed = r.tmp_removed,
                    refreshed = r.refreshed.len(),
                    "compaction: recovered what an interrupted pass left"
                );
            }
            recovered.store(true, Relaxed);
        }
        Err(e) => {
            counts.failures.fetch_add(1, Relaxed);
            say(
                "compaction: recovery at open failed (no pass runs until it succeeds)",
                "riptide_compaction_failures_total",
                &e,
            );
        }
    }
}

/// One wake-up of the thread: recovery if still owed, then a pass.
fn run_once(folder: &Folder, counts: &Counts, recovered: &AtomicBool, on_rewritten: &OnRewritten) {
    if !recovered.load(Relaxed) {
        recover(folder, counts, recovered);
        if !recovered.load(Relaxed) {
            return;
        }
    }
    match folder.pass() {
        Ok(p) => {
            counts.passes.fetch_add(1, Relaxed);
            counts.rows_dropped.fetch_add(p.rows_dropped, Relaxed);
            counts
                .segments_rewritten
                .fetch_add(p.rewritten.len() as u64, Relaxed);
            for e in &p.rewritten {
                on_rewritten(e, &folder.segments_dir().join(e.name()));
            }
            // Last: the writer prunes at this seq from its next batch on.
            counts.compaction_seq.store(p.to_seq, Relaxed);
        }
        Err(e) => {
            counts.failures.fetch_add(1, Relaxed);
            say(
                "compaction pass failed (retried at the next request or interval)",
                "riptide_compaction_failures_total",
                &e,
            );
        }
    }
}

impl<T: Text> Store<T> {
    /// Starts the compaction thread (module docs), once; a second call does nothing.
    /// `on_rewritten(path)` is called on that thread for each segment file a pass rewrote, once
    /// it is in place and named by its entry and the store's own readers have switched to it
    /// (the server re-reads it: `SealedSegments::add`); it must not hold a clone of this store
    /// (the last clone's drop joins the thread).
    pub fn start_compaction(
        &self,
        config: CompactionConfig,
        on_rewritten: impl Fn(&Path) + Send + Sync + 'static,
    ) -> Result<(), StoreError> {
        self.folding
            .start(config, self.rewritten_then(on_rewritten), None)
    }

    /// The thread's callback: the store's readers take the new generation of the file
    /// (`store::seal::refresh_file`), then `then(path)`.
    fn rewritten_then(&self, then: impl Fn(&Path) + Send + Sync + 'static) -> OnRewritten {
        let readers = self.readers_of_segments();
        Box::new(move |entry: &SegmentEntry, path: &Path| {
            readers.refresh(entry, path);
            then(path)
        })
    }

    /// [`Self::start_compaction`] with a test hook called at each of a pass's
    /// [`CrashPoint`]s (with the segment's index), on the thread, before it goes on: a test
    /// holds a pass there to act while it is in progress.
    #[cfg(any(test, feature = "testing"))]
    pub fn start_compaction_paused(
        &self,
        config: CompactionConfig,
        on_rewritten: impl Fn(&Path) + Send + Sync + 'static,
        pause: impl Fn(CrashPoint, u32) + Send + Sync + 'static,
    ) -> Result<(), StoreError> {
        self.folding.start(
            config,
            self.rewritten_then(on_rewritten),
            Some(Box::new(pause)),
        )
    }

    /// Asks the compaction thread for a pass (the sealer, after each new segment). Returns at
    /// once; requests while a pass runs make one more pass after it. Nothing before
    /// [`Self::start_compaction`].
    pub fn request_compaction(&self) {
        self.folding.request();
    }

    /// What folding did since open ([`FoldingStats`]).
    pub fn folding_stats(&self) -> FoldingStats {
        self.folding.stats()
    }

    /// The `tombstones` partition (what ingest wrote and the writer has not pruned).
    pub fn tombstones(&self) -> &Tombstones {
        &self.folding.tombstones
    }

    /// Writes a segment's entry in the `segments` partition (tests that make segments by hand,
    /// as sealing would).
    #[cfg(any(test, feature = "testing"))]
    pub fn put_segment_entry_for_tests(&self, entry: &crate::catalog::SegmentEntry) {
        #[allow(clippy::expect_used)]
        let catalog = crate::catalog::Catalog::open(&self.folding.ks).expect("segments");
        let mut b = self.folding.ks.batch();
        catalog.put(&mut b, entry);
        #[allow(clippy::expect_used)]
        b.commit().expect("commit");
    }
}
