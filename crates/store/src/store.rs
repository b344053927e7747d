//! The event store: fjall partitions under `--data DIR`.
//!
//! Partitions: `blocks` (first seq, big-endian u64 → a sealed [block](#blocks) of events),
//! `recent` (seq → one [`Event`] value, both forms, for the events not yet sealed), `times`
//! (time_us, big-endian → seq), `accounts` (DID → the account's chain state,
//! `riptide_firehose::chain::encode_state`) and `meta` (next seq, last time_us, upstream cursor,
//! dictionary id, retention floor, layout version). `accounts` is an ordinary LSM tree (leveled
//! compaction, bloom filters): it is rewritten in place and read by point lookups, one per
//! account the verifiers do not hold in memory. A data directory from before chain state simply
//! has no `accounts` yet: each account's first commit after the upgrade establishes its state. `resync` (`did 0x00 seq` → frame) holds what
//! `crate::resync` needs to survive a crash: the accounts queued for resync (seq 0, empty) and
//! the frames held for them until their resync lands; it is small (bounded by the resync
//! buffers) and written in the same batches as everything else. `backfill` (DID → the
//! backfill's progress for that repository, opaque here: `riptide_backfill`'s store sink writes
//! and reads it) is written in the batch that holds the repository's rows and its account's chain
//! state ([`Store::append_with_progress`]), so a repository lands whole and once across crashes.
//!
//! <a id="blocks"></a>**Blocks** (layout 3; checksummed since layout 4). Every event used to be stored with both of its forms
//! (v1 JSON and its own zstd frame): ~900 bytes an event on a generated stream, where Jetstream v2
//! keeps ~250 in columnar blocks of 4,096 events. Now events are sealed in blocks of
//! [`StoreOptions::block_events`] (4,096) events, at most [`StoreOptions::block_bytes`] (4 MiB)
//! before compression: one zstd frame (level 2, no dictionary: a block is large enough to be its
//! own) of the events' stored values *without* their zstd form. Level 2, not zstd's default 3: on
//! 2.2 MB blocks of the generated stream's JSON it compresses ~1.6× as fast (~400 against ~250
//! MB/s, `zstd -b2`/`-b3 -B2200K`, Zen 3, session 12) for ~1% more bytes (138.0 against 136.4
//! bytes/event in `bench serve`). Issue 20 had the store well inside its target (254) and ingest
//! CPU short of its own, and sealing runs on the single writer thread. Only the JSON is kept; the
//! zstd form is derived again when a `compress=true` subscriber reads a sealed event from disk
//! (`server.rs`), and Jetstream v2's frames are derived from the JSON anyway (`v2.rs`). Reading a
//! block decompresses it whole (~1 GB/s, ~3 ms for a block of the capture's events), so the most
//! recently used blocks are kept decompressed ([`StoreOptions::block_cache`], 8 by default, shared
//! by every reader): a replay reads each block in many small reads and decompresses it once, and a
//! thousand subscribers that fell out of the in-memory tail together share the blocks they read
//! instead of decompressing each a thousand times. A read that finds its block cached needs no I/O,
//! so the server serves it on the spot ([`Store::read_cached`]); only a read that must load a block
//! goes to the blocking pool. Hits, loads and the cache's bytes are in `/metrics`
//! (`riptide_block_cache_*`). Events leave a cached block as copies, as they left fjall's blocks
//! before: the byte cap of a read still bounds what a subscriber's batch holds.
//!
//! <a id="checksums"></a>**Checksums** (layout 4). A block is stored with the xxh3-64 of its
//! whole value — header (count, first seq, last time_us, raw length) and zstd frame — as its last
//! 8 bytes (block format 2), verified every time the block is read from disk, before anything is
//! decompressed. Neither fjall 2 nor the block's own zstd frame did this: lsm-tree writes a
//! checksum into each of its data blocks but only checks it in an explicit `verify`, and blocks
//! were sealed without zstd's content checksum, so one flipped bit in a stopped store's segment
//! files was served as an altered event (11 of 16 trials in issue 40), or failed the frame and
//! closed every replay that reached it with 1011. Why a checksum of the stored bytes rather than
//! zstd's content checksum: zstd's covers only the decompressed content, so a flip in our header
//! (the count or length fields) or one that still decompresses into a different length went
//! unseen or was found only after the work of decompressing; one hash over the value covers
//! everything and costs little: xxh3 (the hash fjall's journal uses) took 13–41 µs for a
//! 190 KB block of 4,096 JSON events, against 0.9–2.1 ms to decompress it and 3.9–9.4 ms to seal
//! it (release build, development VM under other builds, issue 40): 1.4–2% of a load, under
//! 0.5% of a seal. A block that fails (its checksum, or for a block
//! sealed before checksums its frame, lengths or an event's format) is a [`DamagedBlock`]: logged
//! at error once (not once per reader), counted (`riptide_store_corrupt_blocks_total`,
//! `riptide_store_corrupt_events_total`), remembered, and **skipped** by every read from then on
//! without touching the disk: a replay that meets it goes on with the next block's events, on both
//! wires, instead of closing. Its seqs are taken to end where the next block begins (its own
//! header is not to be trusted). `riptide store check` walks every block and lists the damage;
//! `riptide store repair` removes damaged blocks and records the seqs they held in `meta`, so a
//! restarted server does not meet them again. Blocks sealed by layout 3 (format 1, no checksum)
//! are still read: they leave the store with retention; until then a flip inside one is caught
//! only where it breaks the format. The layout is recorded as 4 when such a directory is opened:
//! an older riptide cannot read a checksummed block and would fail every one as corrupt, so it is
//! refused at open instead ([`StoreError::NewerLayout`] is what this one says of a later layout).
//!
//! <a id="row-blocks"></a>**Row blocks** (layout 5, issue 38: `docs/archive.md`, "One copy of the
//! data"). A writer that hands each event's Jetstream v2 `.jss` row with it
//! ([`Store::append_rows`]; the rows of a frame's events are
//! [`riptide_jetstream::Projection::stored_rows`]) has its events sealed as *row blocks*
//! (format 3): the same header and checksum around one `.jss` block frame of at most 4,096 rows
//! (zstd level 3 with its content checksum, as `riptide_segment` writes it and the archive serves
//! it), where a commit's record is its DAG-CBOR as signed rather than its JSON: 0.59 of a JSON
//! block's bytes on the generated stream (`bench rows`). Until a block is sealed its rows wait in
//! `recent_rows` (seq → a one-row block body) beside the events in `recent`, in the same batches.
//! Row blocks are sealed whole: where more than 4,096 events with rows are unsealed, the ones past
//! the last whole block of 4,096 stay unsealed (in `recent` and `recent_rows`) for the next
//! sealing, since a row block cannot take up to twice a block's worth as a JSON block does.
//! A backfill's landing hands rows without events ([`Store::append_landing`], module
//! `landing`): the blocks are the same, the rows sealed at once are never made into events,
//! and only those past the last whole block wait as above.
//! A block is a row block only if every one of its events came with its row; otherwise (a
//! writer that hands none, or a batch without rows among them) it is sealed as JSON, as before,
//! and both kinds read alike. Reading a row block renders it (`crate::rows`: its rows through
//! [`riptide_jetstream::Projector::project_rows`], the code that renders a frame's events at
//! ingest, so each event is byte for byte the JSON ingest made) into the block cache, in the
//! same form as a JSON block's: rendered once for every reader, on the blocking pool when it is
//! loaded ahead of a replay. A row that does not render is a damaged block ("Checksums"). A
//! layout-4 directory is read as it is and recorded as 5 at open (an older riptide cannot read
//! a row block); its JSON blocks leave with retention.
//!
//! <a id="read-ahead"></a>**Read-ahead.** A replay reads blocks in order, and decompressing one
//! took about half of a replay's time per event on the reader's own path: the subscriber waited
//! for each block, then sent it. Now a reader of a cached block claims the next block not cached
//! (up to `AHEAD` blocks on, [`Store::claim_ahead`]) and the server loads it on the blocking
//! pool while the reader sends (`server::read_ahead`, only when a store reader is free). A
//! reader that catches up with its load ahead waits for it (`Claim`) rather than decompressing
//! the block again. It is for a few replays: when the subscribers
//! reading the store, with the blocks each would keep, outnumber the cache, loads ahead would
//! evict blocks the others are in (200 concurrent replays took 15% longer), so there are none. Measured on the 2-vCPU VM, replay to one
//! consumer from disk (`replay_loop`): v1 1.13M → 1.38M events/s, v2 1.00M → 1.16M
//! (`bench/results/2026-11-25-vm/readahead-s8.md`).
//!
//! Events are durable before they are sealed: an ingest batch's events go to `recent` (with both
//! forms, so nothing changes for them), and the batch that brings the unsealed events to a block's
//! worth also writes the block and removes them from `recent` — all in the same atomic batch, so
//! an event is at every instant in exactly one of the two. The few events past the block's worth
//! go into the same block (a block holds [`StoreOptions::block_events`] events and fewer than
//! as many again, within [`StoreOptions::block_bytes`]); until session 8 they made a block of
//! their own, so every other block held ~100 events: those compressed worse and cost a replay a
//! block load each. The unsealed events are also kept in
//! memory (at most one block's worth), which is where reads of them are served from; `recent` is
//! only read at open. `recent` is a small leveled tree: its values are mostly removed before its
//! memtable is flushed, so flushes write little more than tombstones, and compaction drops them.
//!
//! **Durability point.** [`Store::append_with_accounts`] writes a whole ingest batch — its
//! events, their time index entries, the chain state of every account the batch's frames changed,
//! the next seq, the last time_us and the upstream cursor that covers them, and any block sealed —
//! as ONE fjall batch committed with `PersistMode::SyncAll` (journal written and fsynced) before
//! it returns. Events are published to subscribers only after that. So after `kill -9` (or power
//! loss, given honest disks) the store holds exactly the batches whose `append` returned: every
//! event a subscriber could have seen survives; the upstream cursor matches the events and the
//! account states, so resuming from it neither loses nor duplicates a frame, and re-verifies the
//! frames after it against exactly the state they were first verified against; and the next seq /
//! time_us restart above everything stored, so no seq or time_us is reused.
//!
//! <a id="journal"></a>**Journal.** That holds while the journal holds what was fsynced. fjall 2
//! (2.11) recovers a journal whose tail it cannot read — cut short, or a batch that fails its
//! checksum or is incomplete — by truncating it to the last whole batch, logged at debug level
//! and reported nowhere (its `RecoveryMode` has one mode, `TolerateCorruptTail`): right after a
//! crash mid-write that is the batch whose append never returned, but a journal damaged or cut
//! afterwards loses acknowledged batches the same way (issue 40: half a stopped store's journal
//! cut, 5,593 events gone, nothing above INFO, and the seqs given out again). So the store keeps
//! a high-water mark of what it acknowledged outside fjall: `riptide-acked` beside fjall's files
//! holds the next seq and last time_us after the last batch whose append returned (24 bytes with
//! their xxh3), rewritten in place after each append, **not fsynced**: ~2 µs a batch, where an
//! fsync of it cost ~3.8 ms on the development VM, as much again as the batch's own. Written only
//! after the batch's fsync, it never says more than the journal held durably, so it cannot raise
//! a false alarm; unsynced, a power loss can leave it behind (a loss after that goes unnoticed),
//! but a process crash or a stop cannot (the kernel has it). At open, a mark above what the
//! partitions hold means acknowledged batches were lost: logged at error with the seq range and
//! why, counted (`riptide_store_journal_lost_events`), recorded in `meta` ([`LostRange`], listed
//! by `riptide store check`), and the next seq and time_us move past the mark so that no seq or
//! time_us a subscriber saw is given to another event (the unsealed events are sealed first: a
//! block holds consecutive seqs). The upstream cursor, written in the same batches, goes back
//! with them, so ingest fetches those frames again from the relay if it still has them, as new
//! seqs. Without the mark (a directory from before it) the only sign is events on disk past the
//! next seq `meta` recorded (a partition flushed before the cut), also logged at error.
//!
//! **Why FIFO compaction.** `blocks` and `times` are append-only logs under monotonic keys: no
//! key is ever written twice, so an LSM tree's merging has nothing to merge. Leveled compaction
//! (fjall's default) still rewrote every byte on its way down the levels: its compactor took
//! 9–12% of the server's CPU once ingest reached steady state. With FIFO the flushed segments stay
//! as they are (their key ranges are disjoint, so a range read opens only the segments it needs)
//! and retention drops whole segment files. Nothing reads these partitions by point lookup, so
//! they have no bloom filters either; `blocks` is not compressed again by fjall (its values are
//! zstd frames already).
//!
//! **Retention** has two halves. [`Store::expire`] moves the *floor*: the first seq whose
//! `time_us` is inside the window. Reads never go below it, so retention is exact to the event
//! whatever the segment boundaries. Then it drops every segment file created longer ago than the
//! window (fjall's FIFO time-to-live, run with the window given now, so a restart with another
//! `--retention` takes effect): every event in such a file was written before the file, so it is
//! below the floor already. Disk space thus comes back one segment (a flushed memtable, 64 MiB of
//! blocks) at a time, a little after the window has passed. The floor is stored without fsync: a
//! floor lost in a crash is recomputed by the next pass. No tombstones are written to the logs, so
//! their segments stay disjoint and nothing is ever merged.
//!
//! **The cost of never merging**: one segment file per flushed memtable, so their number grows
//! with the window. fjall 2 checks a level's files for overlap pairwise (lsm-tree's
//! `KeyRange::is_disjoint`) whenever the level changes and at start, so both grow with the square
//! of the count: measured on the development VM, a flush took ~14 ms longer with 3,000 files and
//! reopening 4,000 took 7 s; each file also holds ~2.4 KB of memory. Hence 64 MiB memtables
//! (fjall's default is 16 MiB); with blocks a 64 MiB segment holds ~20 times more events than it
//! did (`bench/results/2026-11-22-vm/serve-5.md` for the old figures). A much longer window or a
//! much faster network would need segments merged once (not yet done).
//!
//! **Sealed segments** (issue 38, module `seal`). With [`StoreOptions::segment_bytes`] (`serve
//! --segment-bytes`), the row blocks above the newest segment move into a `.jss` file under
//! `DIR/segments/` once they hold that many bytes ([`Store::seal_segments`], on a background
//! thread), named by the `segments` catalog; reads find old seqs there. Such a store deletes
//! nothing by age: [`Store::expire`] only moves the floor, which is the *live floor*
//! (`Catalog::live_floor`: never above the newest segment's first seq), and runs no
//! time-to-live on `blocks` (a block leaves it when it is sealed).
//!
//! **Older layouts.** A data directory written by layout 1 (leveled partitions, deletes by
//! tombstone) or layout 2 (one `events` value per event, both forms) is refused with
//! [`StoreError::OldLayout`], which says what to do: `riptide serve --migrate-store` rewrites a
//! layout-2 directory into blocks in place ([`Store::migrate`]); layout 1 needs a new `--data`
//! directory.

use std::collections::{BTreeMap, VecDeque};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use fjall::compaction::{Fifo, Strategy};
use fjall::{
    AbstractTree, CompressionType, Config, Keyspace, PartitionCreateOptions, PartitionHandle,
    PersistMode,
};
use xxhash_rust::xxh3::xxh3_64;

use riptide_firehose::chain::{decode_state, encode_state, AccountState, CorruptState};

use riptide_segment::{compress as compress_block, encode_block, Row};

use crate::event::{CorruptEvent, Event, Text, Utf8Text};
use crate::ReadLimit;

mod landing;
mod seal;

pub use landing::LandingRow;
pub use seal::{read_segment_meta, SealPoint};

/// The sealed files' index and the block cache, shared with folding's thread
/// ([`Store::readers_of_segments`]) without a clone of the store.
pub(crate) struct SegmentReaders {
    files: Arc<std::sync::RwLock<seal::Files>>,
    cache: Arc<Mutex<VecDeque<Arc<Block>>>>,
}

impl SegmentReaders {
    /// Folding rewrote the file of `entry` at `path`: readers take it (`seal::refresh_file`).
    pub(crate) fn refresh(&self, entry: &crate::catalog::SegmentEntry, path: &Path) {
        seal::refresh_file(&self.files, &self.cache, entry, path);
    }
}

/// Most files the store keeps open (fjall's descriptor cache; its default is 900). Kept small
/// and fixed so the connection budget can leave room for it (`limits.rs`): a store that cannot
/// open its next journal file is poisoned.
pub const STORE_MAX_OPEN_FILES: usize = 256;

/// A store failure.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// fjall failed (I/O or its own corruption).
    #[error("store at {path}: {source}")]
    Fjall {
        /// The data directory.
        path: String,
        /// The cause.
        source: fjall::Error,
    },
    /// A fault injected by a test hook (`faults.rs`), standing for an I/O failure.
    #[error("injected fault: {source}")]
    Injected {
        /// The failure it stands for.
        source: std::io::Error,
    },
    /// The store was written while its disk was full and must be reopened (fjall poisons a
    /// keyspace after a failed journal write). Raised by ingest once space is back.
    #[error("the store at {path} failed a write and must be reopened (space is available again): restart the server")]
    NeedsReopen {
        /// The data directory.
        path: String,
    },
    /// A stored value is corrupt.
    #[error(transparent)]
    Corrupt(#[from] CorruptEvent),
    /// A block could not be compressed as it was sealed (zstd refused: out of memory). Nothing
    /// of the batch was written.
    #[error("sealing the block at seq {first}: zstd compression failed: {source}")]
    Seal {
        /// The block's first seq.
        first: u64,
        /// zstd's error.
        source: std::io::Error,
    },
    /// The rows handed with a batch ([`Store::append_rows`]) do not pair with its events, or one
    /// cannot be a `.jss` row. Nothing of the batch was written.
    #[error("the row of event {seq}: {what}")]
    Rows {
        /// The event's seq.
        seq: u64,
        /// What is wrong.
        what: &'static str,
    },
    /// A stored block is corrupt (its checksum, or the format of a block from before checksums).
    /// Reads do not return it: they record the block as a [`DamagedBlock`] and skip it (module
    /// docs, "Checksums").
    #[error("stored block at seq {first}: corrupt ({what})")]
    CorruptBlock {
        /// The block's first seq.
        first: u64,
        /// What is wrong.
        what: &'static str,
    },
    /// A stored account state is corrupt.
    #[error("account {did}: {source}")]
    CorruptAccount {
        /// The account.
        did: String,
        /// What is wrong.
        source: CorruptState,
    },
    /// A key of the resync partition is not `did 0x00 seq`: our own corruption.
    #[error("corrupt resync entry {key:?}")]
    CorruptPending {
        /// The key, lossily as text.
        key: String,
    },
    /// Sealing live blocks into a segment file, or reading one back, failed on a file
    /// (`seal`: `docs/archive.md`, "Sealing"). Nothing was removed from `blocks`.
    #[error("segment file {path}: {source}")]
    SegmentIo {
        /// The file or directory.
        path: std::path::PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A segment file does not verify (at open, adopting a file renamed before its entry, or
    /// writing one).
    #[error("segment file {path}: {source}")]
    Segment {
        /// The file.
        path: std::path::PathBuf,
        /// What is wrong.
        source: riptide_segment::Error,
    },
    /// The `segments` catalog could not be read.
    #[error(transparent)]
    Catalog(#[from] crate::catalog::CatalogError),
    /// A test's seal crash point was reached ([`Store::seal_crash_at`]).
    #[error("sealing stopped at {0:?} (test crash point)")]
    SealCrashed(SealPoint),
    /// The data directory was written with another zstd dictionary.
    #[error("the data directory holds events compressed with zstd dictionary {stored}, but the server was started with {given} (0 = none); use the same --zstd-dictionary or a new --data directory")]
    DictionaryMismatch {
        /// The id in the store.
        stored: u32,
        /// The id given.
        given: u32,
    },
    /// Another process holds the data directory (`crate::lock`).
    #[error(transparent)]
    Locked(#[from] crate::lock::LockError),
    /// The data directory was written by a newer riptide (a store layout this one does not know).
    #[error("the data directory {path} was written by a newer riptide (store layout {found}, this one reads up to {LAYOUT_VERSION}): run that riptide, or start with a new --data directory")]
    NewerLayout {
        /// The data directory.
        path: String,
        /// The layout found.
        found: u64,
    },
    /// Folding could not be set up at open, or its thread started (`crate::folding`).
    #[error(transparent)]
    Folding(#[from] crate::compact::CompactError),
    /// The data directory was written by an older riptide whose store layout this one does not
    /// read as it is.
    #[error("the data directory {path} was written by an older riptide (store layout {found}, this one writes {LAYOUT_VERSION}); {}", if *found == 2 { "convert it once with `riptide serve --migrate-store` (same --data; rewrites its events into compressed blocks) or start with a new --data directory" } else { "start with a new --data directory" })]
    OldLayout {
        /// The data directory.
        path: String,
        /// The layout found (1 = before layouts were recorded; 2 = one value per event).
        found: u64,
    },
}

/// Wraps a fjall error with the store's directory.
fn fjall_at(dir: &Path) -> impl Fn(fjall::Error) -> StoreError + Copy + '_ {
    move |source| StoreError::Fjall {
        path: dir.display().to_string(),
        source,
    }
}

impl StoreError {
    /// Whether no write can succeed on this store handle again (fjall poisons its keyspace after
    /// a failed journal write): only reopening the store recovers.
    pub fn is_poisoned(&self) -> bool {
        matches!(
            self,
            StoreError::Fjall {
                source: fjall::Error::Poisoned,
                ..
            }
        )
    }
}

/// Where the store stood when it was opened: what the next batch continues from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Resume {
    /// The next seq to assign (1 on a new store).
    pub next_seq: u64,
    /// The last `time_us` assigned (0 on a new store).
    pub last_time_us: i64,
    /// The upstream seq of the last frame the store covers, if any.
    pub upstream_cursor: Option<u64>,
}

/// How events are sealed into blocks (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoreOptions {
    /// Events per block: a block is sealed once this many are unsealed, and the last of the
    /// blocks sealed together also takes the fewer than this many left after it (module docs).
    pub block_events: usize,
    /// Most bytes of stored values (without their zstd forms) in one block before compression.
    pub block_bytes: usize,
    /// Decompressed blocks kept for reads (module docs): at most this many times `block_bytes`
    /// of memory, shared by every reader.
    pub block_cache: usize,
    /// Seal the row blocks into a `.jss` segment file once they hold this many bytes
    /// (`serve --segment-bytes`; [`Store::seal_segments`], module `seal`). `None`: this store
    /// never seals segments (tools, the Kafka follower) and retention works as before.
    pub segment_bytes: Option<u64>,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            block_events: 4096,
            block_bytes: 4 << 20,
            block_cache: 8,
            segment_bytes: None,
        }
    }
}

/// One decompressed block: `[u32 len][value]…`, the events' stored values (without zstd forms).
///
/// Its events' seqs are increasing but need not be consecutive: a segment block folded by
/// compaction keeps its index entry's bounds and only the rows that survived (`docs/archive.md`,
/// "Folding"). A cursor inside a gap starts at the next event present.
#[derive(Debug)]
struct Block {
    /// The first seq of its index entry (its key in `blocks`, `min_seq` in a segment): what a
    /// damage is recorded under.
    first: u64,
    /// The lowest seq the block answers for: `first`, or lower when the segment blocks just
    /// before it were emptied by folding (they hold nothing, so a reader there goes on here,
    /// and finds this block cached rather than loading it again).
    from: u64,
    /// The last seq of its index entry.
    last: u64,
    data: Vec<u8>,
    /// Where each event's value starts in `data` (its length prefix is the 4 bytes before).
    starts: Vec<u32>,
    /// Each event's seq, increasing.
    seqs: Vec<u64>,
}

impl Block {
    fn count(&self) -> u64 {
        self.starts.len() as u64
    }

    /// The seq after the block's range (its entry's last seq + 1).
    fn end(&self) -> u64 {
        self.last + 1
    }

    /// Whether `seq` is in the block's range (held, or in a gap of it).
    fn holds(&self, seq: u64) -> bool {
        self.from <= seq && seq <= self.last
    }

    /// The index of the first event with a seq ≥ `seq` (the count if there is none).
    fn index_of(&self, seq: u64) -> usize {
        self.seqs.partition_point(|&s| s < seq)
    }

    /// The value of the block's `i`th event.
    fn value(&self, i: usize) -> &[u8] {
        let start = self.starts[i] as usize;
        let end = match self.starts.get(i + 1) {
            Some(&next) => next as usize - 4,
            None => self.data.len(),
        };
        &self.data[start..end]
    }

    /// The bytes from the `i`th event's value to the end of the `j - 1`th's (the length
    /// prefixes between them included).
    fn span(&self, i: usize, j: usize) -> std::ops::Range<usize> {
        let end = match self.starts.get(j) {
            Some(&next) => next as usize - 4,
            None => self.data.len(),
        };
        self.starts[i] as usize..end
    }
}

/// How many blocks a reader's loads ahead keep ahead of it (`Self::claim_ahead`).
const AHEAD: usize = 2;

/// A claim on loading the block at a seq ahead of its reader: while it is held, a reader that
/// needs that block waits for it ([`Self::block_at`]) instead of decompressing it a second
/// time. Released (and the waiters woken) when dropped.
#[derive(Debug)]
struct Claim<T: Text> {
    store: Store<T>,
    seq: u64,
}

impl<T: Text> Claim<T> {
    /// Claims `seq`, unless it is claimed already.
    fn take(store: &Store<T>, seq: u64) -> Option<Self> {
        let mut claims = lock(&store.loading.0);
        if claims.contains(&seq) {
            return None;
        }
        claims.push(seq);
        Some(Claim {
            store: store.clone(),
            seq,
        })
    }
}

impl<T: Text> Drop for Claim<T> {
    fn drop(&mut self) {
        let (claims, loaded) = &*self.store.loading;
        lock(claims).retain(|&s| s != self.seq);
        loaded.notify_all();
    }
}

/// A block to load ahead of its reader ([`Store::claim_ahead`]).
#[derive(Debug)]
pub struct Ahead<T: Text>(Claim<T>);

impl<T: Text> Ahead<T> {
    /// Decompresses the block into the shared cache (blocking I/O and ~2 ms of CPU: for the
    /// blocking pool). A damaged block is recorded (module docs, "Checksums"); another failure is
    /// not said here: the reader's own read of the block meets it and says it.
    pub fn load(self) {
        let store = &self.0.store;
        if store.is_cached(self.0.seq) {
            return;
        }
        match store.load_block(self.0.seq) {
            Ok(Some(_)) => {
                store.cache_stats.ahead.fetch_add(1, Relaxed);
            }
            // Recorded now, so that neither the reader nor the next load ahead reads it again.
            Err(StoreError::CorruptBlock { first, what }) => {
                store.note_damaged(first, what);
            }
            _ => {}
        }
    }
}

/// The unsealed events, in seq order (module docs), and their bytes without zstd forms.
#[derive(Debug)]
struct Pending<T> {
    events: Vec<Event<T>>,
    bytes: usize,
    /// Every unsealed event's row (`crate::rows::encode_row`), when every one came with one: they
    /// are then sealed as row blocks. `None` once one came without.
    rows: Option<Vec<Bytes>>,
    /// Whether `recent_rows` holds rows of the unsealed events (removed when they are sealed).
    rows_stored: bool,
}

impl<T> Default for Pending<T> {
    fn default() -> Self {
        Pending {
            events: Vec::new(),
            bytes: 0,
            rows: Some(Vec::new()),
            rows_stored: false,
        }
    }
}

impl<T> Pending<T> {
    /// Empty again, after its events were sealed.
    fn sealed(&mut self) {
        self.events.clear();
        self.bytes = 0;
        self.rows = Some(Vec::new());
        self.rows_stored = false;
    }

    /// The unsealed events' rows, decoded, if every one has one.
    fn decoded_rows(&self) -> Option<Vec<Row<'_>>> {
        let rows = self.rows.as_ref()?;
        rows.iter().map(|r| crate::rows::decode_row(r)).collect()
    }
}

/// The partitions of this layout (module docs).
struct Partitions {
    blocks: PartitionHandle,
    recent: PartitionHandle,
    recent_rows: PartitionHandle,
    times: PartitionHandle,
    accounts: PartitionHandle,
    resync: PartitionHandle,
    backfill: PartitionHandle,
}

/// The event store. Cheap to share (`Arc`); all methods take `&self`. `T` is the text type its
/// events carry ([`Text`]).
#[derive(Clone)]
pub struct Store<T = Utf8Text> {
    path: String,
    ks: Keyspace,
    blocks: PartitionHandle,
    recent: PartitionHandle,
    /// The rows of the unsealed events in `recent`, when the writer hands rows (module docs,
    /// "Row blocks"): seq → `crate::rows::encode_row`.
    recent_rows: PartitionHandle,
    times: PartitionHandle,
    accounts: PartitionHandle,
    /// Accounts awaiting resync and the frames held for them (`crate::resync`).
    resync: PartitionHandle,
    /// The backfill's per-repository progress (module docs).
    backfill: PartitionHandle,
    meta: PartitionHandle,
    /// The retention floor: no read returns a seq below it.
    floor: Arc<AtomicU64>,
    /// One past the last sealed seq (1 when nothing is sealed).
    sealed_end: Arc<AtomicU64>,
    pending: Arc<Mutex<Pending<T>>>,
    /// Held by a writer for the whole of an append (one writer at a time).
    writing: Arc<Mutex<()>>,
    /// Decompressed blocks, least recently used first.
    cache: Arc<Mutex<VecDeque<Arc<Block>>>>,
    /// The buffer of the block last evicted from `cache`, for the next one.
    spare: Arc<Mutex<Vec<u8>>>,
    /// What the block cache did (module docs).
    cache_stats: Arc<BlockCacheCounts>,
    /// The seqs whose blocks are being loaded (`Claim`), and the signal that one was.
    loading: Arc<(Mutex<Vec<u64>>, Condvar)>,
    /// Sealed blocks found damaged since the store was opened, by first seq (module docs,
    /// "Checksums"): every read skips them without touching the disk again.
    damaged: Arc<Mutex<BTreeMap<u64, DamagedBlock>>>,
    /// The unsealed events found damaged at open, by seq.
    damaged_unsealed: Arc<Mutex<Vec<u64>>>,
    /// What was found damaged or lost, for `/metrics`.
    integrity: Arc<IntegrityCounts>,
    /// The acknowledged high-water mark's file (module docs, "Journal").
    acked: Arc<Acked>,
    options: StoreOptions,
    /// The sealed segment files reads find old seqs in (module `seal`), by first seq.
    segments: Arc<std::sync::RwLock<seal::Files>>,
    /// The `segments` partition: which files are sealed.
    catalog: crate::catalog::Catalog,
    /// Held by a sealer for the whole of a seal (one at a time), with the tests' crash hook.
    sealing: Arc<Mutex<seal::Sealing>>,
    /// Bytes of the row blocks in `blocks` above the newest segment (what the next seals take).
    live_row_bytes: Arc<AtomicU64>,
    /// Tombstones, pruning and the compaction thread (`crate::folding`); before `_lock`, so that
    /// the thread is joined before the directory is released.
    pub(crate) folding: Arc<crate::folding::Folding>,
    /// This process's hold on the data directory (`crate::lock`), released with the last clone.
    _lock: Arc<crate::lock::DirLock>,
}

/// A sealed block that failed its checks: the seqs `first..end` it held (`end` is where the next
/// block starts, or the end of the sealed events: a damaged header's count cannot be trusted),
/// none of which a read returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DamagedBlock {
    /// The block's first seq (its key).
    pub first: u64,
    /// One past the last seq it can have held.
    pub end: u64,
    /// What failed: `checksum`, `header`, `format`, `zstd frame`, `length`, `value`, `count`,
    /// `event` (a value that is not an event, in a block from before checksums).
    pub what: &'static str,
}

impl DamagedBlock {
    /// The seqs lost with it (at most: seqs never written, a gap left by a migration, count too).
    pub fn events(&self) -> u64 {
        self.end.saturating_sub(self.first)
    }
}

/// What [`Store::check`] found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Checked {
    /// Sealed blocks.
    pub blocks: u64,
    /// Of them, blocks with a checksum (sealed by layout 4, damaged or not); the others are from
    /// before checksums.
    pub checksummed: u64,
    /// Of them, row blocks (layout 5, module docs "Row blocks"), each frame decoded and every
    /// row rendered.
    pub row_blocks: u64,
    /// Sealed segment files (module `seal`), every block of each decoded and rendered as a
    /// row block is; their blocks are not counted in `blocks`.
    pub segments: u64,
    /// Blocks in those files.
    pub segment_blocks: u64,
    /// Events in the blocks (and segment blocks) that read whole.
    pub events: u64,
    /// The blocks that did not.
    pub damaged: Vec<DamagedBlock>,
    /// Unsealed events (read from `recent` at open).
    pub unsealed: u64,
    /// Unsealed events whose stored value is damaged, by seq.
    pub damaged_unsealed: Vec<u64>,
    /// Acknowledged seqs found missing from the journal when the store was opened for this check.
    pub journal_lost_at_open: u64,
    /// Every range recorded as lost, this time or before.
    pub lost: Vec<LostRange>,
}

impl Checked {
    /// Whether anything is damaged now, or was lost at this open.
    pub fn is_damaged(&self) -> bool {
        !self.damaged.is_empty()
            || !self.damaged_unsealed.is_empty()
            || self.journal_lost_at_open > 0
    }
}

/// Counters of damage found (module docs, "Checksums").
#[derive(Debug, Default)]
struct IntegrityCounts {
    corrupt_blocks: AtomicU64,
    corrupt_events: AtomicU64,
    journal_lost: AtomicU64,
}

/// What the store found damaged or lost since it was opened, for `/metrics`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IntegrityStats {
    /// Sealed blocks found damaged (each counted once, when a read or a check first meets it).
    pub corrupt_blocks: u64,
    /// The seqs those blocks held: skipped by every reader.
    pub corrupt_events: u64,
    /// Seqs acknowledged by an earlier run that were missing at open (a journal cut short).
    pub journal_lost_events: u64,
}

/// Counters of the decompressed-block cache (its bytes are summed when asked for).
#[derive(Debug, Default)]
struct BlockCacheCounts {
    hits: AtomicU64,
    loads: AtomicU64,
    ahead: AtomicU64,
}

/// What the decompressed-block cache did, for `/metrics`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockCacheStats {
    /// Reads of a sealed block that found it decompressed.
    pub hits: u64,
    /// Blocks decompressed (a read that did not find its block, or a load ahead).
    pub loads: u64,
    /// Of `loads`, the blocks loaded ahead of their readers ([`Store::claim_ahead`]).
    pub ahead: u64,
    /// Bytes of decompressed blocks held by the cache now.
    pub bytes: u64,
}

impl<T> std::fmt::Debug for Store<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("path", &self.path).finish()
    }
}

const NEXT_SEQ: &[u8] = b"next_seq";
const LAST_TIME: &[u8] = b"last_time_us";
const UPSTREAM: &[u8] = b"upstream_cursor";
const DICT_ID: &[u8] = b"dict_id";
const FLOOR: &[u8] = b"retention_floor";
const LAYOUT: &[u8] = b"layout";
/// `lost` + first seq (be64) → end (be64) and why (u8, [`LostRange::why`]): seqs the store once
/// held or acknowledged and no longer has (module docs, "Journal").
const LOST: &[u8] = b"lost";

/// The file beside fjall's that says how far the last run acknowledged (module docs, "Journal").
const ACKED_FILE: &str = "riptide-acked";

/// Seqs the store acknowledged or held and lost, recorded in `meta` ([`Store::lost_ranges`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LostRange {
    /// The first seq lost.
    pub first: u64,
    /// One past the last.
    pub end: u64,
    /// Why: `journal` (acknowledged batches missing at open), `corrupt block` (a damaged block
    /// removed by `riptide store repair`) or `corrupt event` (a damaged unsealed value, removed
    /// by `repair` or when the events around it were sealed).
    pub why: &'static str,
}

impl LostRange {
    fn why_byte(why: &str) -> u8 {
        match why {
            "journal" => 1,
            "corrupt event" => 3,
            _ => 2,
        }
    }

    fn why_of(b: u8) -> &'static str {
        match b {
            1 => "journal",
            3 => "corrupt event",
            _ => "corrupt block",
        }
    }

    fn key(&self) -> Vec<u8> {
        [LOST, &self.first.to_be_bytes()[..]].concat()
    }

    fn value(&self) -> Vec<u8> {
        let mut v = self.end.to_be_bytes().to_vec();
        v.push(Self::why_byte(self.why));
        v
    }
}

/// The acknowledged high-water mark (module docs, "Journal"): the next seq and last time_us after
/// the last batch whose append returned, with their xxh3, in a small file rewritten in place
/// after every append and never fsynced.
#[derive(Debug)]
struct Acked(Mutex<Option<std::fs::File>>);

impl Acked {
    /// Opens (creating) the file in `dir` and reads what it says, if it says anything whole.
    fn open(dir: &Path) -> (Acked, Option<(u64, i64)>) {
        use std::io::Read;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(dir.join(ACKED_FILE));
        let Ok(mut file) = file else {
            tracing::warn!(dir = %dir.display(), "cannot open {ACKED_FILE}: acknowledged events lost from the journal will not be detected");
            return (Acked(Mutex::new(None)), None);
        };
        let mut b = Vec::new();
        let said = match file.read_to_end(&mut b) {
            Ok(24) if xxh3_64(&b[..16]) == be64(&b[16..]) => {
                Some((be64(&b[..8]), be64(&b[8..16]) as i64))
            }
            _ => None,
        };
        (Acked(Mutex::new(Some(file))), said)
    }

    /// Records that everything below `next_seq` (and up to `last_time_us`) is acknowledged. A
    /// failure only weakens the check at the next open: it is not the durability point.
    fn record(&self, next_seq: u64, last_time_us: i64) {
        use std::io::{Seek, Write};
        let mut f = lock(&self.0);
        let Some(file) = f.as_mut() else { return };
        let mut b = [0u8; 24];
        b[..8].copy_from_slice(&next_seq.to_be_bytes());
        b[8..16].copy_from_slice(&(last_time_us as u64).to_be_bytes());
        let sum = xxh3_64(&b[..16]);
        b[16..].copy_from_slice(&sum.to_be_bytes());
        let written = file
            .seek(std::io::SeekFrom::Start(0))
            .and_then(|_| file.write_all(&b));
        if let Err(e) = written {
            tracing::warn!(error = %e, "cannot write {ACKED_FILE}; acknowledged events lost from the journal will not be detected");
            *f = None;
        }
    }
}

/// The store layout this code writes: 5 = blocks of `.jss` rows where the writer hands the
/// events' rows ([`Store::append_rows`]), blocks of JSON where it does not (module docs, "Row
/// blocks"). (4 = checksummed blocks of JSON only, and 3 = the same without checksums: both read
/// as they are and recorded as 5 at open; 2 = FIFO log partitions with a retention floor, one
/// value per event.)
pub const LAYOUT_VERSION: u64 = 5;

/// Layout 3: blocks without checksums, which this layout reads as they are (module docs).
const LAYOUT_UNCHECKED: u64 = 3;

/// Layout 4: checksummed blocks of JSON only, which this layout reads as they are.
const LAYOUT_JSON: u64 = 4;

/// Memtable size of `blocks`, hence the size of its segment files (see the module docs on the
/// cost of never merging).
const BLOCKS_MEMTABLE: u32 = 64 << 20;

/// Memtable size of `recent`: room for several blocks' worth of unsealed values, so most are
/// removed before they are flushed.
const RECENT_MEMTABLE: u32 = 32 << 20;

/// The block value's format byte and header: format, event count, first seq, last time_us,
/// length of the values before compression; then one zstd frame of `[u32 len][value]…`; then
/// (format 2, module docs "Checksums") the xxh3-64 of everything before it, big-endian.
pub(crate) const BLOCK_FORMAT: u8 = 2;
/// Blocks sealed before checksums (layout 3): the same without the trailing checksum.
const BLOCK_FORMAT_1: u8 = 1;
/// Row blocks (layout 5, module docs "Row blocks"): the same header and checksum, the length
/// before compression being the `.jss` block body's, around one `.jss` block frame (zstd level
/// 3 with its content checksum, as `riptide_segment` writes and the archive serves it).
pub(crate) const BLOCK_FORMAT_ROWS: u8 = 3;
/// The most rows in a row block: Jetstream v2's blocks hold at most 4,096, and clients plan
/// and fetch by block.
const MAX_BLOCK_ROWS: usize = 4096;
const BLOCK_HEADER: usize = 1 + 4 + 8 + 8 + 4;
const BLOCK_CHECKSUM: usize = 8;

/// zstd level of blocks (see the module docs).
const BLOCK_LEVEL: i32 = 2;

/// Options of the two log partitions (`blocks`, `times`); see the module docs.
fn log_partition() -> PartitionCreateOptions {
    PartitionCreateOptions::default()
        .compaction_strategy(Strategy::Fifo(Fifo::new(u64::MAX, None)))
        .bloom_filter_bits(None)
}

/// What one retention pass did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Expired {
    /// Events newly below the floor.
    pub events: u64,
    /// The floor after the pass.
    pub floor: u64,
}

/// The store's size on disk.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DiskUsage {
    /// Bytes of segment files and journals.
    pub bytes: u64,
    /// Segment files of the log partitions.
    pub segments: usize,
    /// Bytes of segment files alone (journals excluded: a journal file is preallocated, 32 MiB
    /// however little it holds, and is deleted once what it holds is flushed).
    pub segment_bytes: u64,
    /// Bytes of the `blocks` partition's segment files (what the event log itself costs).
    pub block_bytes: u64,
    /// Bytes of the `recent` partition's segment files (the unsealed events, and the
    /// tombstones of those sealed since, until compaction drops them).
    pub recent_bytes: u64,
}

/// What [`Store::migrate`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Migrated {
    /// The layout found.
    pub from: u64,
    /// Events rewritten into blocks.
    pub events: u64,
    /// Blocks written.
    pub blocks: u64,
}

/// A change to the resync partition, written with an ingest batch ([`Store::append_with_pending`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PendingChange {
    /// Hold `frame` (upstream `seq`) for `did` until its resync lands; seq 0 with an empty frame
    /// marks the account as queued for resync.
    Hold {
        /// The account.
        did: Box<str>,
        /// The frame's upstream seq (0: the queue mark).
        seq: u64,
        /// The frame.
        frame: Bytes,
    },
    /// Forget what [`PendingChange::Hold`] held under (`did`, `seq`).
    Release {
        /// The account.
        did: Box<str>,
        /// The upstream seq (0: the queue mark).
        seq: u64,
    },
}

/// `did 0x00 seq(be64)`: an account's entries together, in upstream order (a DID has no NUL).
fn pending_key(did: &str, seq: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(did.len() + 9);
    k.extend_from_slice(did.as_bytes());
    k.push(0);
    k.extend_from_slice(&seq.to_be_bytes());
    k
}

fn be64(v: &[u8]) -> u64 {
    v.try_into().map(u64::from_be_bytes).unwrap_or(0)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// An event's stored value without its zstd form (what a block keeps).
fn sealed_value<T: Text>(e: &Event<T>) -> &[u8] {
    &e.raw()[..e.raw().len() - e.zstd_len()]
}

/// What [`seal`] reads of each event it seals: an [`Event`], or a landing's row that has no
/// event made (`landing`), which is only ever sealed into a row block.
trait Sealable {
    fn seq(&self) -> u64;
    fn time_us(&self) -> i64;
    /// The length of its stored value without its zstd form (what a loaded block holds).
    fn value_len(&self) -> usize;
    /// That value, for a JSON block; `None` if there is none.
    fn value(&self) -> Option<&[u8]>;
}

impl<T: Text> Sealable for Event<T> {
    fn seq(&self) -> u64 {
        Event::seq(self)
    }
    fn time_us(&self) -> i64 {
        Event::time_us(self)
    }
    fn value_len(&self) -> usize {
        sealed_value(self).len()
    }
    fn value(&self) -> Option<&[u8]> {
        Some(sealed_value(self))
    }
}

/// Seals `events` (consecutive seqs) into blocks: (first seq, value). A block holds
/// `opts.block_events` events, and the last one also the fewer than that left after it, all
/// within `opts.block_bytes`: sealing all the unsealed events once a block's worth has come
/// used to leave the batch's last few (~100) as a block of their own, every other block, which
/// compressed worse and cost a replay a load each.
///
/// With `rows` (each event's, in the same order: module docs, "Row blocks"), the blocks are row
/// blocks of at most [`MAX_BLOCK_ROWS`] rows (a block's worth past that is cut in equal parts);
/// their events are still counted against `opts.block_bytes` by their JSON, which is what a
/// loaded block holds.
fn seal<E: Sealable>(
    events: &[E],
    rows: Option<&[Row<'_>]>,
    opts: StoreOptions,
) -> Result<Vec<(u64, Vec<u8>)>, StoreError> {
    let per = opts.block_events.max(1);
    let mut out = Vec::new();
    let mut rest = events;
    while let Some(first) = rest.first() {
        // A block's worth, or all that is left if that is less than two blocks' worth.
        let mut want = if rest.len() < 2 * per {
            rest.len()
        } else {
            per
        };
        if rows.is_some() && want > MAX_BLOCK_ROWS {
            want = want.div_ceil(want.div_ceil(MAX_BLOCK_ROWS));
        }
        let (mut n, mut bytes) = (0, 0);
        while n < want {
            let len = rest[n].value_len();
            if n > 0 && bytes + len > opts.block_bytes {
                break;
            }
            // A block holds consecutive seqs: a gap (a damaged unsealed value dropped at open)
            // starts the next one.
            if n > 0 && rest[n].seq() != rest[n - 1].seq() + 1 {
                break;
            }
            bytes += len + 4;
            n += 1;
        }
        let at = events.len() - rest.len();
        let (these, tail) = rest.split_at(n);
        rest = tail;
        let last_time = these.last().map_or(0, E::time_us);
        let seal_err = |source| StoreError::Seal {
            first: first.seq(),
            source,
        };
        let mut raw = Vec::with_capacity(bytes);
        let (format, z) = match rows {
            Some(rows) => {
                let rows = &rows[at..at + n];
                encode_block(rows, &mut raw).map_err(|e| seal_err(std::io::Error::other(e)))?;
                let z = compress_block(&raw).map_err(|e| seal_err(std::io::Error::other(e)))?;
                (BLOCK_FORMAT_ROWS, z)
            }
            None => {
                for e in these {
                    let v = e.value().ok_or_else(|| {
                        seal_err(std::io::Error::other("an event without its value"))
                    })?;
                    raw.extend_from_slice(&(v.len() as u32).to_be_bytes());
                    raw.extend_from_slice(v);
                }
                let z = zstd::bulk::compress(&raw, BLOCK_LEVEL).map_err(seal_err)?;
                (BLOCK_FORMAT, z)
            }
        };
        let mut v = Vec::with_capacity(BLOCK_HEADER + z.len() + BLOCK_CHECKSUM);
        v.push(format);
        v.extend_from_slice(&(these.len() as u32).to_be_bytes());
        v.extend_from_slice(&first.seq().to_be_bytes());
        v.extend_from_slice(&last_time.to_be_bytes());
        v.extend_from_slice(&(raw.len() as u32).to_be_bytes());
        v.extend_from_slice(&z);
        let sum = xxh3_64(&v);
        v.extend_from_slice(&sum.to_be_bytes());
        out.push((first.seq(), v));
    }
    Ok(out)
}

/// A sealed block value's bytes if it is a row block (what a segment takes), else 0.
fn row_block_bytes(v: &[u8]) -> u64 {
    if v.first() == Some(&BLOCK_FORMAT_ROWS) {
        v.len() as u64
    } else {
        0
    }
}

/// A block value's header, checked.
#[derive(Clone, Copy, Debug)]
struct BlockHeader {
    /// [`BLOCK_FORMAT`], [`BLOCK_FORMAT_1`] or [`BLOCK_FORMAT_ROWS`].
    format: u8,
    count: u64,
    first: u64,
    last_time: i64,
    raw_len: usize,
    /// Where the zstd frame ends (the checksum, if any, follows).
    frame_end: usize,
}

/// A block value's header, with its checksum verified (format 2: over the whole value, header
/// included, so a flip anywhere in it is found here, before anything is decompressed).
fn block_header(key: u64, v: &[u8]) -> Result<BlockHeader, StoreError> {
    let bad = |what| StoreError::CorruptBlock { first: key, what };
    if v.len() < BLOCK_HEADER {
        return Err(bad("header"));
    }
    let frame_end = match v[0] {
        BLOCK_FORMAT | BLOCK_FORMAT_ROWS => {
            let end = v.len() - BLOCK_CHECKSUM;
            if end < BLOCK_HEADER {
                return Err(bad("header"));
            }
            if xxh3_64(&v[..end]) != be64(&v[end..]) {
                return Err(bad("checksum"));
            }
            end
        }
        BLOCK_FORMAT_1 => v.len(),
        _ => return Err(bad("format")),
    };
    let count = u32::from_be_bytes([v[1], v[2], v[3], v[4]]) as u64;
    let first = be64(&v[5..13]);
    let last_time = be64(&v[13..21]) as i64;
    let raw_len = u32::from_be_bytes([v[21], v[22], v[23], v[24]]) as usize;
    if first != key || count == 0 {
        return Err(bad("header"));
    }
    Ok(BlockHeader {
        format: v[0],
        count,
        first,
        last_time,
        raw_len,
        frame_end,
    })
}

/// Decompresses and indexes a block value whose header `h` was checked ([`block_header`]), into
/// `buf` (the buffer of an evicted block, reused: a fresh multi-megabyte allocation per block is
/// fresh pages the kernel must zero).
fn open_block(h: &BlockHeader, v: &[u8], mut buf: Vec<u8>) -> Result<Block, StoreError> {
    let bad = |what| StoreError::CorruptBlock {
        first: h.first,
        what,
    };
    buf.clear();
    if h.format == BLOCK_FORMAT_ROWS {
        // Rendered once, here, for every reader of the cache (module docs, "Row blocks").
        let mut body = Vec::with_capacity(h.raw_len);
        decompress(v, h, &mut body)?;
        let mut starts = Vec::with_capacity(h.count as usize);
        let mut seqs = Vec::with_capacity(h.count as usize);
        let bounds = (h.first, h.first + h.count - 1);
        crate::rows::render_rows(bounds, h.count, &body, &mut buf, &mut starts, &mut seqs)
            .map_err(bad)?;
        return Ok(Block {
            first: h.first,
            from: h.first,
            last: bounds.1,
            data: buf,
            starts,
            seqs,
        });
    }
    buf.reserve(h.raw_len);
    decompress(v, h, &mut buf)?;
    let data = buf;
    let mut starts = Vec::with_capacity(h.count as usize);
    let mut pos = 0;
    while pos < data.len() {
        let len = data
            .get(pos..pos + 4)
            .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize)
            .ok_or_else(|| bad("value length"))?;
        if pos + 4 + len > data.len() {
            return Err(bad("value"));
        }
        starts.push((pos + 4) as u32);
        pos += 4 + len;
    }
    if starts.len() as u64 != h.count {
        return Err(bad("count"));
    }
    Ok(Block {
        first: h.first,
        from: h.first,
        last: h.first + h.count - 1,
        data,
        starts,
        seqs: (h.first..h.first + h.count).collect(),
    })
}

/// Decompresses the frame of the block value `v` (header `h`) into `buf`, which must come out
/// exactly the length the header says.
fn decompress(v: &[u8], h: &BlockHeader, buf: &mut Vec<u8>) -> Result<(), StoreError> {
    let bad = |what| StoreError::CorruptBlock {
        first: h.first,
        what,
    };
    let n = zstd::bulk::Decompressor::new()
        .and_then(|mut d| d.decompress_to_buffer(&v[BLOCK_HEADER..h.frame_end], buf))
        .map_err(|_| bad("zstd frame"))?;
    if n != h.raw_len || buf.len() != h.raw_len {
        return Err(bad("length"));
    }
    Ok(())
}

/// What the previous layout (2: one value per event, both forms, in a FIFO partition with
/// fjall's lz4 blocks, plus the time index) keeps on disk for `events` (with their zstd forms),
/// written into a fresh keyspace at `dir` and flushed: bytes of segment files. For
/// `riptide bench serve`'s before/after figure in one run.
pub fn layout2_bytes<T: Text>(dir: &Path, events: &[Event<T>]) -> Result<u64, StoreError> {
    let fj = fjall_at(dir);
    let (ks, _lock) = Store::<T>::keyspace(dir)?;
    let old = ks
        .open_partition("events", log_partition().max_memtable_size(BLOCKS_MEMTABLE))
        .map_err(fj)?;
    let times = ks.open_partition("times", log_partition()).map_err(fj)?;
    for chunk in events.chunks(4096) {
        let mut b = ks.batch();
        for e in chunk {
            b.insert(&old, e.seq().to_be_bytes(), e.raw().clone());
            b.insert(
                &times,
                (e.time_us() as u64).to_be_bytes(),
                e.seq().to_be_bytes(),
            );
        }
        b.commit().map_err(fj)?;
    }
    for p in [&old, &times] {
        p.rotate_memtable_and_wait().map_err(fj)?;
    }
    Ok(old.disk_space() + times.disk_space())
}

impl<T: Text> Store<T> {
    fn err(&self, source: fjall::Error) -> StoreError {
        StoreError::Fjall {
            path: self.path.clone(),
            source,
        }
    }

    /// Opens (or creates) the store under `dir`. `dict_id` is the zstd dictionary id events are
    /// compressed with (0 = none); a store written with another is refused.
    pub fn open(dir: &Path, dict_id: u32) -> Result<(Self, Resume), StoreError> {
        Self::open_inner(dir, Some(dict_id), StoreOptions::default())
    }

    /// [`Self::open`] with other block sizes (tests seal small blocks).
    pub fn open_with(
        dir: &Path,
        dict_id: u32,
        options: StoreOptions,
    ) -> Result<(Self, Resume), StoreError> {
        Self::open_inner(dir, Some(dict_id), options)
    }

    /// Opens an existing store whatever its dictionary (for reading: `riptide dict train`).
    pub fn open_any(dir: &Path) -> Result<(Self, Resume), StoreError> {
        Self::open_inner(dir, None, StoreOptions::default())
    }

    /// The zstd dictionary id the directory's events were written for (0: none), as
    /// [`Store::open`] compares it; `None` before a server first opened it (`riptide doctor`).
    pub fn dict_id(&self) -> Result<Option<u32>, StoreError> {
        let v = self.meta.get(DICT_ID).map_err(|e| self.err(e))?;
        Ok(v.map(|v| be64(&v) as u32))
    }

    /// Locks `dir` for this process (`crate::lock`), then opens its keyspace (made whole first
    /// if the directory has none: [`Self::create_whole`]).
    fn keyspace(dir: &Path) -> Result<(Keyspace, crate::lock::DirLock), StoreError> {
        let lock = crate::lock::DirLock::acquire(dir)?;
        if !dir.join("version").exists() {
            Self::create_whole(dir)?;
        }
        Self::keyspace_config(dir)
            .open()
            .map_err(fjall_at(dir))
            .map(|ks| (ks, lock))
    }

    fn keyspace_config(dir: &Path) -> Config {
        // Durability is chosen per batch (`append`); no background fsync timer is needed. The
        // write buffer has room for a `blocks` memtable filling while the last one flushes
        // (fjall flushes the largest memtables once the buffer is half full).
        Config::new(dir)
            .max_write_buffer_size(3 * u64::from(BLOCKS_MEMTABLE))
            .max_open_files(STORE_MAX_OPEN_FILES)
    }

    /// Makes a new directory's keyspace whole or not at all. fjall writes `version` first and
    /// then creates each partition in several steps, so a `kill -9` during a first start left a
    /// directory it could not open again (found by the backfill's kill test). Here every
    /// partition and the layout are made under `DIR/keyspace.creating`, made durable, and moved
    /// into `DIR` with `version` last: a directory without `version` never held a commit, so
    /// what an interrupted creation left is removed and the creation starts again.
    fn create_whole(dir: &Path) -> Result<(), StoreError> {
        let fj = fjall_at(dir);
        let io = |e: std::io::Error| StoreError::Fjall {
            path: dir.display().to_string(),
            source: fjall::Error::Io(e),
        };
        let tmp = dir.join("keyspace.creating");
        for leftover in [tmp.clone(), dir.join("journals"), dir.join("partitions")] {
            if leftover.exists() {
                std::fs::remove_dir_all(&leftover).map_err(io)?;
            }
        }
        {
            let ks = Self::keyspace_config(&tmp).open().map_err(fj)?;
            let meta = ks
                .open_partition("meta", PartitionCreateOptions::default())
                .map_err(fj)?;
            Self::partitions(&ks).map_err(fj)?;
            meta.insert(LAYOUT, LAYOUT_VERSION.to_be_bytes())
                .map_err(fj)?;
            ks.persist(PersistMode::SyncAll).map_err(fj)?;
        }
        for name in ["partitions", "journals", "version"] {
            std::fs::rename(tmp.join(name), dir.join(name)).map_err(io)?;
        }
        std::fs::remove_dir_all(&tmp).map_err(io)?;
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(io)
    }

    /// Opens the keyspace under `dir` and its `meta` partition, and reads which layout the
    /// directory holds (`None` for a new one).
    #[allow(clippy::type_complexity)]
    fn open_dir(
        dir: &Path,
    ) -> Result<(Keyspace, PartitionHandle, Option<u64>, crate::lock::DirLock), StoreError> {
        let fj = fjall_at(dir);
        let (ks, lock) = Self::keyspace(dir)?;
        let meta = ks
            .open_partition("meta", PartitionCreateOptions::default())
            .map_err(fj)?;
        let existed = ks.partition_exists("events") || ks.partition_exists("blocks");
        let layout = meta.get(LAYOUT).map_err(fj)?.map_or(1, |v| be64(&v));
        Ok((ks, meta, existed.then_some(layout), lock))
    }

    fn open_inner(
        dir: &Path,
        dict_id: Option<u32>,
        options: StoreOptions,
    ) -> Result<(Self, Resume), StoreError> {
        let path = dir.display().to_string();
        let fj = fjall_at(dir);
        let (ks, meta, layout, dir_lock) = Self::open_dir(dir)?;
        // A partition keeps the options it was created with: an old directory would stay as it
        // was.
        match layout {
            Some(LAYOUT_VERSION) => {}
            Some(found) if found > LAYOUT_VERSION => {
                return Err(StoreError::NewerLayout { path, found })
            }
            // Its blocks read as they are; the ones sealed from now on carry checksums (and may
            // be row blocks), which an older riptide cannot read: recorded, so that one refuses
            // the directory at open.
            Some(LAYOUT_UNCHECKED | LAYOUT_JSON) => {
                meta.insert(LAYOUT, LAYOUT_VERSION.to_be_bytes())
                    .map_err(fj)?;
                ks.persist(PersistMode::SyncAll).map_err(fj)?;
            }
            Some(found) => return Err(StoreError::OldLayout { path, found }),
            None => {
                // Before the partitions exist: a crash in between leaves a directory that opens.
                meta.insert(LAYOUT, LAYOUT_VERSION.to_be_bytes())
                    .map_err(fj)?;
                ks.persist(PersistMode::SyncAll).map_err(fj)?;
            }
        }
        // A migration that stopped after recording the new layout leaves the old partition.
        if ks.partition_exists("events") {
            let old = ks
                .open_partition("events", PartitionCreateOptions::default())
                .map_err(fj)?;
            ks.delete_partition(old).map_err(fj)?;
        }
        let Partitions {
            blocks,
            recent,
            recent_rows,
            times,
            accounts,
            resync,
            backfill,
        } = Self::partitions(&ks).map_err(fj)?;
        let floor = meta.get(FLOOR).map_err(fj)?.map_or(0, |v| be64(&v));
        let (acked, said) = Acked::open(dir);
        let ks_catalog = ks.clone();
        let folding = Arc::new(crate::folding::Folding::open(&ks, dir)?);
        let store = Store {
            path,
            ks,
            blocks,
            recent,
            recent_rows,
            times,
            accounts,
            resync,
            backfill,
            meta,
            floor: Arc::new(AtomicU64::new(floor)),
            sealed_end: Arc::new(AtomicU64::new(1)),
            pending: Arc::default(),
            writing: Arc::default(),
            cache: Arc::default(),
            spare: Arc::default(),
            cache_stats: Arc::default(),
            loading: Arc::default(),
            damaged: Arc::default(),
            damaged_unsealed: Arc::default(),
            integrity: Arc::default(),
            acked: Arc::new(acked),
            options,
            segments: Arc::default(),
            catalog: crate::catalog::Catalog::open(&ks_catalog)?,
            sealing: Arc::default(),
            live_row_bytes: Arc::default(),
            folding,
            _lock: Arc::new(dir_lock),
        };
        let get = |k: &[u8]| store.meta.get(k).map_err(|e| store.err(e));
        match (get(DICT_ID)?, dict_id) {
            (_, None) => {}
            (Some(v), Some(dict_id)) => {
                let stored = be64(&v) as u32;
                if stored != dict_id {
                    return Err(StoreError::DictionaryMismatch {
                        stored,
                        given: dict_id,
                    });
                }
            }
            (None, Some(dict_id)) => {
                store
                    .meta
                    .insert(DICT_ID, (dict_id as u64).to_be_bytes())
                    .map_err(|e| store.err(e))?;
                store
                    .ks
                    .persist(PersistMode::SyncAll)
                    .map_err(|e| store.err(e))?;
            }
        }
        let mut resume = Resume {
            next_seq: get(NEXT_SEQ)?.map_or(1, |v| be64(&v)).max(1),
            last_time_us: get(LAST_TIME)?.map_or(0, |v| be64(&v) as i64),
            upstream_cursor: get(UPSTREAM)?.map(|v| be64(&v)),
        };
        // The segment files first (a seal cut short is finished or undone: module `seal`).
        let sealed_through = store.open_segments()?;
        if let Some((max_seq, max_time)) = sealed_through {
            store.sealed_end.store(max_seq + 1, Relaxed);
            resume.next_seq = resume.next_seq.max(max_seq + 1);
            resume.last_time_us = resume.last_time_us.max(max_time);
        }
        // Where the blocks end, and the unsealed events (module docs).
        // A last block whose header is damaged: where it ends is found below.
        let mut damaged_last = None;
        if let Some((k, v)) = store.blocks.last_key_value().map_err(|e| store.err(e))? {
            match block_header(be64(&k), &v) {
                Ok(h) => {
                    // (A JSON block left below the segments does not end the sealed seqs.)
                    store.sealed_end.fetch_max(h.first + h.count, Relaxed);
                    // Belt and braces: never restart below an event that is on disk.
                    resume.next_seq = resume.next_seq.max(h.first + h.count);
                    resume.last_time_us = resume.last_time_us.max(h.last_time);
                }
                Err(StoreError::CorruptBlock { first, what }) => {
                    store.sealed_end.fetch_max(first + 1, Relaxed);
                    damaged_last = Some((first, what));
                }
                Err(e) => return Err(e),
            }
        }
        {
            let sealed_end = store.sealed_end.load(Relaxed);
            let mut p = lock(&store.pending);
            for kv in store.recent.iter() {
                let (k, v) = kv.map_err(|e| store.err(e))?;
                let e = match Event::<T>::decode(be64(&k), Bytes::from(v)) {
                    Ok(e) => e,
                    Err(bad) => {
                        store.note_damaged_unsealed(bad);
                        continue;
                    }
                };
                if e.seq() < sealed_end {
                    continue;
                }
                resume.next_seq = resume.next_seq.max(e.seq() + 1);
                resume.last_time_us = resume.last_time_us.max(e.time_us());
                p.bytes += sealed_value(&e).len();
                p.events.push(e);
            }
            // Their rows, if every one has its row (module docs, "Row blocks"); else they are
            // sealed as JSON.
            let mut rows = BTreeMap::new();
            for kv in store.recent_rows.iter() {
                let (k, v) = kv.map_err(|e| store.err(e))?;
                rows.insert(be64(&k), Bytes::from(v));
            }
            p.rows_stored = !rows.is_empty();
            p.rows = p
                .events
                .iter()
                .map(|e| {
                    rows.remove(&e.seq())
                        .filter(|r| crate::rows::decode_row(r).is_some_and(|r| r.seq == e.seq()))
                })
                .collect();
            if let Some((first, what)) = damaged_last {
                // It ends where the unsealed events start (they follow it in the same batch),
                // or at the next seq when none are left.
                let end = p.events.first().map_or(resume.next_seq, Event::seq);
                store.sealed_end.store(end.max(first + 1), Relaxed);
                drop(p);
                store.note_damaged(first, what);
            }
        }
        let meta_next = get(NEXT_SEQ)?.map_or(1, |v| be64(&v)).max(1);
        if meta_next < resume.next_seq {
            // Only a journal that lost batches leaves events on disk past what `meta` says
            // (they are written together): whatever came after them is gone too.
            tracing::error!(
                store = %store.path,
                meta_next_seq = meta_next,
                stored_end = resume.next_seq,
                "the store holds events past the next seq it recorded: its journal lost \
                 acknowledged batches (cut short or damaged); the events after seq {} may be \
                 lost",
                resume.next_seq - 1
            );
        }
        if let Some((acked_next, acked_time)) = said {
            if acked_next > resume.next_seq {
                store.journal_lost(&mut resume, acked_next, acked_time)?;
            }
        }
        Ok((store, resume))
    }

    /// At open: the last run acknowledged the seqs below `acked_next`, and the store holds only
    /// those below `resume.next_seq` (module docs, "Journal"). Says so loudly, counts it, records
    /// the lost range, and moves the next seq and time_us past what was acknowledged, so that no
    /// seq or time_us a subscriber may have seen is given to another event. The unsealed events
    /// are sealed first (in the same durable write): a block and the unsealed events hold
    /// consecutive seqs.
    fn journal_lost(
        &self,
        resume: &mut Resume,
        acked_next: u64,
        acked_time: i64,
    ) -> Result<(), StoreError> {
        let lost = LostRange {
            first: resume.next_seq,
            end: acked_next,
            why: "journal",
        };
        let events = lost.end - lost.first;
        tracing::error!(
            store = %self.path,
            seqs = %format_args!("{}..={}", lost.first, lost.end - 1),
            events,
            upstream_cursor = ?resume.upstream_cursor,
            "{events} acknowledged events are missing from the store: the last run acknowledged \
             seqs up to {} ({ACKED_FILE}) but the store's journal ends at {} (the journal was \
             cut short or damaged; fjall drops a journal tail it cannot read, silently). Their \
             seqs are not reused: the next event gets seq {}. Ingest resumes from the store's \
             upstream cursor, before the lost batches, so their frames are fetched again from the \
             relay if it still holds them (as new seqs). `riptide store check` lists the range.",
            lost.end - 1,
            lost.first.saturating_sub(1),
            lost.end
        );
        self.integrity.journal_lost.fetch_add(events, Relaxed);
        resume.next_seq = acked_next;
        resume.last_time_us = resume.last_time_us.max(acked_time);
        let mut b = self.ks.batch().durability(Some(PersistMode::SyncAll));
        let mut p = lock(&self.pending);
        let mut row_bytes = 0;
        for (first, v) in seal(&p.events, p.decoded_rows().as_deref(), self.options)? {
            row_bytes += row_block_bytes(&v);
            b.insert(&self.blocks, first.to_be_bytes(), v);
        }
        for e in &p.events {
            b.remove(&self.recent, e.seq().to_be_bytes());
            if p.rows_stored {
                b.remove(&self.recent_rows, e.seq().to_be_bytes());
            }
        }
        b.insert(&self.meta, lost.key(), lost.value());
        b.insert(&self.meta, NEXT_SEQ, resume.next_seq.to_be_bytes());
        b.insert(
            &self.meta,
            LAST_TIME,
            (resume.last_time_us as u64).to_be_bytes(),
        );
        b.commit().map_err(|e| self.err(e))?;
        self.live_row_bytes.fetch_add(row_bytes, Relaxed);
        if let Some(last) = p.events.last() {
            self.sealed_end.store(last.seq() + 1, Relaxed);
        }
        p.sealed();
        Ok(())
    }

    /// Reads and verifies every sealed block (checksum, frame, every event's format) and counts
    /// the unsealed events: what `riptide store check` prints. A damaged block is recorded as a
    /// read would record it (logged, counted, skipped from then on). Blocking: a whole pass over
    /// the store's blocks.
    pub fn check(&self) -> Result<Checked, StoreError> {
        let mut c = Checked::default();
        for kv in self.blocks.iter() {
            let (k, v) = kv.map_err(|e| self.err(e))?;
            let key = be64(&k);
            c.blocks += 1;
            c.checksummed += u64::from(matches!(
                v.first(),
                Some(&(BLOCK_FORMAT | BLOCK_FORMAT_ROWS))
            ));
            c.row_blocks += u64::from(v.first() == Some(&BLOCK_FORMAT_ROWS));
            let opened = block_header(key, &v)
                .and_then(|h| Self::check_events(&open_block(&h, &v, Vec::new())?));
            match opened {
                Ok(events) => c.events += events,
                Err(StoreError::CorruptBlock { first, what }) => {
                    self.note_damaged(first, what);
                }
                Err(e) => return Err(e),
            }
        }
        for (blocks, opened) in self.check_segments() {
            c.segments += 1;
            c.segment_blocks += blocks;
            for o in opened {
                match o {
                    Ok(events) => c.events += events,
                    Err(StoreError::CorruptBlock { first, what }) => {
                        self.note_damaged(first, what);
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        c.damaged = self.damaged_blocks();
        c.unsealed = lock(&self.pending).events.len() as u64;
        c.damaged_unsealed = lock(&self.damaged_unsealed).clone();
        c.journal_lost_at_open = self.integrity.journal_lost.load(Relaxed);
        c.lost = self.lost_ranges()?;
        Ok(c)
    }

    /// Every stored event of a block decodes: its number, or the block is corrupt.
    fn check_events(b: &Block) -> Result<u64, StoreError> {
        for i in 0..b.starts.len() {
            let raw = Bytes::copy_from_slice(b.value(i));
            Event::<T>::decode(b.seqs[i], raw).map_err(|_| StoreError::CorruptBlock {
                first: b.first,
                what: "event",
            })?;
        }
        Ok(b.count())
    }

    /// Removes what [`Self::check`] finds damaged — the damaged blocks and unsealed values — and
    /// records the seqs they held as lost ([`Self::lost_ranges`]), in one durable write, so that
    /// a server started on the store does not meet them again (`riptide store repair`). Returns
    /// what was removed. (A server cannot have the directory open meanwhile: `crate::lock`.)
    pub fn repair(&self) -> Result<Vec<LostRange>, StoreError> {
        let c = self.check()?;
        let mut removed = Vec::new();
        let _writing = lock(&self.writing);
        let mut b = self.ks.batch().durability(Some(PersistMode::SyncAll));
        for d in &c.damaged {
            b.remove(&self.blocks, d.first.to_be_bytes());
            removed.push(LostRange {
                first: d.first,
                end: d.end,
                why: "corrupt block",
            });
        }
        for &seq in &c.damaged_unsealed {
            b.remove(&self.recent, seq.to_be_bytes());
            removed.push(LostRange {
                first: seq,
                end: seq + 1,
                why: "corrupt event",
            });
        }
        for l in &removed {
            b.insert(&self.meta, l.key(), l.value());
        }
        b.commit().map_err(|e| self.err(e))?;
        lock(&self.damaged_unsealed).clear();
        Ok(removed)
    }

    /// The seqs recorded as lost (module docs, "Journal" and "Checksums"), in seq order.
    pub fn lost_ranges(&self) -> Result<Vec<LostRange>, StoreError> {
        let mut out = Vec::new();
        for kv in self.meta.prefix(LOST) {
            let (k, v) = kv.map_err(|e| self.err(e))?;
            if k.len() != LOST.len() + 8 || v.len() != 9 {
                continue;
            }
            out.push(LostRange {
                first: be64(&k[LOST.len()..]),
                end: be64(&v[..8]),
                why: LostRange::why_of(v[8]),
            });
        }
        Ok(out)
    }

    /// Opens (creating as needed) the partitions of this layout, all of them: `open` and
    /// `migrate` see the same set.
    fn partitions(ks: &Keyspace) -> Result<Partitions, fjall::Error> {
        Ok(Partitions {
            blocks: ks.open_partition(
                "blocks",
                log_partition()
                    .max_memtable_size(BLOCKS_MEMTABLE)
                    .compression(CompressionType::None),
            )?,
            recent: ks.open_partition(
                "recent",
                PartitionCreateOptions::default().max_memtable_size(RECENT_MEMTABLE),
            )?,
            recent_rows: ks.open_partition(
                "recent_rows",
                PartitionCreateOptions::default().max_memtable_size(RECENT_MEMTABLE),
            )?,
            times: ks.open_partition("times", log_partition())?,
            accounts: ks.open_partition("accounts", PartitionCreateOptions::default())?,
            resync: ks.open_partition("resync", PartitionCreateOptions::default())?,
            backfill: ks.open_partition("backfill", PartitionCreateOptions::default())?,
        })
    }

    /// Rewrites a layout-2 data directory (one `events` value per event, both forms) into this
    /// layout: its events sealed into blocks, in order; `times`, `accounts` and `meta` kept. A
    /// directory already in this layout is left alone (`from` = [`LAYOUT_VERSION`], nothing
    /// written). Interrupted, it can be run again: the new layout is recorded only once every
    /// block is durable, and the old partition is dropped after that.
    pub fn migrate(dir: &Path) -> Result<Migrated, StoreError> {
        let path = dir.display().to_string();
        let fj = fjall_at(dir);
        let (ks, meta, layout, _lock) = Self::open_dir(dir)?;
        let from = match layout {
            None | Some(LAYOUT_VERSION | LAYOUT_JSON | LAYOUT_UNCHECKED) => {
                return Ok(Migrated {
                    from: LAYOUT_VERSION,
                    ..Migrated::default()
                })
            }
            Some(2) => 2,
            Some(found) => return Err(StoreError::OldLayout { path, found }),
        };
        // What a run that stopped half-way wrote is written again from the start.
        for name in ["blocks", "recent"] {
            if ks.partition_exists(name) {
                let p = ks
                    .open_partition(name, PartitionCreateOptions::default())
                    .map_err(fj)?;
                ks.delete_partition(p).map_err(fj)?;
            }
        }
        let events = ks.open_partition("events", log_partition()).map_err(fj)?;
        let blocks = Self::partitions(&ks).map_err(fj)?.blocks;
        let opts = StoreOptions::default();
        let mut done = Migrated {
            from,
            ..Migrated::default()
        };
        let mut chunk: Vec<Event<T>> = Vec::with_capacity(opts.block_events);
        let mut bytes = 0;
        let flush = |chunk: &mut Vec<Event<T>>, done: &mut Migrated| -> Result<(), StoreError> {
            for (first, v) in seal(chunk, None, opts)? {
                blocks.insert(first.to_be_bytes(), v).map_err(fj)?;
                done.blocks += 1;
            }
            done.events += chunk.len() as u64;
            chunk.clear();
            Ok(())
        };
        for kv in events.iter() {
            let (k, v) = kv.map_err(fj)?;
            let e = Event::<T>::decode(be64(&k), Bytes::from(v))?;
            if chunk.last().is_some_and(|l| l.seq() + 1 != e.seq()) {
                // Blocks hold consecutive seqs; a gap (never written) starts a new one.
                flush(&mut chunk, &mut done)?;
                bytes = 0;
            }
            bytes += sealed_value(&e).len();
            chunk.push(e);
            if chunk.len() >= opts.block_events || bytes >= opts.block_bytes {
                flush(&mut chunk, &mut done)?;
                bytes = 0;
            }
        }
        flush(&mut chunk, &mut done)?;
        ks.persist(PersistMode::SyncAll).map_err(fj)?;
        meta.insert(LAYOUT, LAYOUT_VERSION.to_be_bytes())
            .map_err(fj)?;
        ks.persist(PersistMode::SyncAll).map_err(fj)?;
        ks.delete_partition(events).map_err(fj)?;
        Ok(done)
    }

    /// Writes one ingest batch atomically and durably (see the module docs). `events` are in seq
    /// order; `resume` is the state after them.
    pub fn append(&self, events: &[Event<T>], resume: &Resume) -> Result<(), StoreError> {
        self.append_with_accounts(events, &[], resume)
    }

    /// [`Self::append_with_accounts`], with changes to the resync partition in the same
    /// atomic, durable write: accounts queued for resync, the frames held for them, and those
    /// released.
    pub fn append_with_pending(
        &self,
        events: &[Event<T>],
        accounts: &[(Box<str>, AccountState)],
        resync: &[PendingChange],
        resume: &Resume,
    ) -> Result<(), StoreError> {
        self.append_all(events, None, accounts, resync, &[], resume)
    }

    /// [`Self::append_with_pending`], with each event's `.jss` row (`rows[i]` is `events[i]`'s,
    /// same seq; its time is the event's): the events are then sealed as row blocks, the store
    /// keeping the rows and not the JSON (module docs, "Row blocks"), and read back rendered from
    /// them, byte for byte the JSON given here when the rows are the events'
    /// ([`riptide_jetstream::Projection::stored_rows`]). A batch whose rows do not pair with its
    /// events is refused whole ([`StoreError::Rows`]), nothing written.
    pub fn append_rows(
        &self,
        events: &[Event<T>],
        rows: &[Row<'_>],
        accounts: &[(Box<str>, AccountState)],
        resync: &[PendingChange],
        resume: &Resume,
    ) -> Result<(), StoreError> {
        self.append_all(events, Some(rows), accounts, resync, &[], resume)
    }

    /// Everything in the resync partition, in DID order and, per DID, upstream order: `(did,
    /// seq, frame)`, where seq 0 with an empty frame is the mark of an account queued for resync.
    pub fn held(&self) -> Result<Vec<(String, u64, Bytes)>, StoreError> {
        let mut out = Vec::new();
        for kv in self.resync.iter() {
            let (k, v) = kv.map_err(|e| self.err(e))?;
            let Some(at) = k.len().checked_sub(9).filter(|&i| k[i] == 0) else {
                return Err(StoreError::CorruptPending {
                    key: String::from_utf8_lossy(&k).into_owned(),
                });
            };
            let did = String::from_utf8_lossy(&k[..at]).into_owned();
            out.push((did, be64(&k[at + 1..]), Bytes::from(v)));
        }
        Ok(out)
    }

    /// [`Self::append`], with the chain state of the accounts the batch's frames changed, in
    /// the same atomic, durable write (at most one state per DID: the last).
    pub fn append_with_accounts(
        &self,
        events: &[Event<T>],
        accounts: &[(Box<str>, AccountState)],
        resume: &Resume,
    ) -> Result<(), StoreError> {
        self.append_all(events, None, accounts, &[], &[], resume)
    }

    /// [`Self::append_with_accounts`], with the backfill's progress in the same atomic, durable
    /// write: `progress` is (key, value) pairs for the `backfill` partition, which the store
    /// keeps and does not read (`riptide_backfill`'s store sink owns their meaning). A
    /// repository's rows, its account's chain state and its progress land together or not at
    /// all, so a crash can neither lose nor repeat one. With `rows` (one per event, as
    /// [`Self::append_rows`] takes them) the events are sealed as row blocks, as ingest's are.
    pub fn append_with_progress(
        &self,
        events: &[Event<T>],
        rows: Option<&[Row<'_>]>,
        accounts: &[(Box<str>, AccountState)],
        progress: &[(Box<str>, Vec<u8>)],
        resume: &Resume,
    ) -> Result<(), StoreError> {
        self.append_all(events, rows, accounts, &[], progress, resume)
    }

    /// The backfill's progress stored under `key` ([`Self::append_with_progress`]).
    pub fn progress(&self, key: &str) -> Result<Option<Bytes>, StoreError> {
        Ok(self
            .backfill
            .get(key)
            .map_err(|e| self.err(e))?
            .map(|v| Bytes::from(v.to_vec())))
    }

    /// How many progress entries the store holds (the repositories a backfill landed).
    pub fn progress_len(&self) -> Result<usize, StoreError> {
        let mut n = 0;
        for kv in self.backfill.keys() {
            kv.map_err(|e| self.err(e))?;
            n += 1;
        }
        Ok(n)
    }

    /// Everything one batch can carry, in one atomic, durable write: events (with their rows,
    /// or as JSON), account states, changes to the resync partition and the backfill's
    /// progress. Ingest's writer with `riptide serve --backfill`, where live frames, held ones
    /// and landed repositories share a batch.
    pub fn append_all(
        &self,
        events: &[Event<T>],
        rows: Option<&[Row<'_>]>,
        accounts: &[(Box<str>, AccountState)],
        resync: &[PendingChange],
        progress: &[(Box<str>, Vec<u8>)],
        resume: &Resume,
    ) -> Result<(), StoreError> {
        // Each row encoded as `recent_rows` keeps it, checked against its event first.
        let rows: Option<Vec<(Row<'_>, Bytes)>> = match rows {
            None => None,
            Some(rows) => {
                if rows.len() != events.len() {
                    return Err(StoreError::Rows {
                        seq: events.first().map_or(0, Event::seq),
                        what: "not one row per event",
                    });
                }
                let mut out = Vec::with_capacity(rows.len());
                for (r, e) in rows.iter().zip(events) {
                    let bad = |what| StoreError::Rows { seq: e.seq(), what };
                    if r.seq != e.seq() || r.display_time_us() != e.time_us() {
                        return Err(bad("row seq or time differs from its event's"));
                    }
                    let encoded =
                        crate::rows::encode_row(r).ok_or_else(|| bad("a column too long"))?;
                    out.push((*r, Bytes::from(encoded)));
                }
                Some(out)
            }
        };
        let _writing = lock(&self.writing);
        let mut b = self.batch();
        if let Some(rows) = &rows {
            let rows: Vec<Row<'_>> = rows.iter().map(|(r, _)| *r).collect();
            self.folding.write_tombstones(&mut b, &rows);
        }
        self.write_beside(&mut b, accounts, resync, progress);
        // Whether this batch seals (module docs): then the unsealed events and this batch's go
        // into blocks, and the unsealed ones leave `recent`.
        let added: usize = events.iter().map(|e| sealed_value(e).len()).sum();
        let (unsealed, rows_stored) = {
            let p = lock(&self.pending);
            let sealing = p.events.len() + events.len() >= self.options.block_events.max(1)
                || p.bytes + added >= self.options.block_bytes;
            // Only this writer changes `pending`: the copy is what it holds until the commit.
            // The rows go with it only if every unsealed event and every new one has its row.
            let rows = match (&p.rows, &rows) {
                (Some(old), Some(new)) => Some(
                    old.iter()
                        .cloned()
                        .chain(new.iter().map(|(_, b)| b.clone()))
                        .collect::<Vec<_>>(),
                ),
                _ => None,
            };
            (sealing.then(|| (p.events.clone(), rows)), p.rows_stored)
        };
        let mut sealed_end = None;
        // Bytes of the row blocks this batch seals (what the next segment takes: module `seal`).
        let mut row_bytes = 0;
        // Events past the last whole row block, left unsealed (module docs, "Row blocks").
        let mut left: Option<(Vec<Event<T>>, Vec<Bytes>)> = None;
        if let Some((unsealed, all_rows)) = unsealed {
            let mut all: Vec<Event<T>> = unsealed.iter().chain(events).cloned().collect();
            let decoded: Option<Vec<Row<'_>>> = all_rows
                .as_ref()
                .and_then(|r| r.iter().map(|b| crate::rows::decode_row(b)).collect());
            // Rows seal in whole blocks of 4,096 where there are more: what a JSON block takes
            // beyond a block's worth (up to twice) would make a row block too large to hold it.
            let split = match &decoded {
                Some(_) if all.len() > MAX_BLOCK_ROWS => all.len() - all.len() % MAX_BLOCK_ROWS,
                _ => all.len(),
            };
            for (first, v) in seal(
                &all[..split],
                decoded.as_ref().map(|d| &d[..split]),
                self.options,
            )? {
                row_bytes += row_block_bytes(&v);
                b.insert(&self.blocks, first.to_be_bytes(), v);
            }
            for e in unsealed.iter().take(split) {
                b.remove(&self.recent, e.seq().to_be_bytes());
                if rows_stored {
                    b.remove(&self.recent_rows, e.seq().to_be_bytes());
                }
            }
            if split < all.len() {
                // `decoded` holds every row here (`split` is short of `all` only then).
                let left_rows: Vec<Bytes> = all_rows
                    .as_ref()
                    .map_or(Vec::new(), |r| r[split..].to_vec());
                let from_batch = split.max(unsealed.len());
                for (e, r) in all[from_batch..]
                    .iter()
                    .zip(&left_rows[from_batch - split..])
                {
                    b.insert(&self.recent, e.seq().to_be_bytes(), e.raw().clone());
                    b.insert(&self.recent_rows, e.seq().to_be_bytes(), r.clone());
                }
                left = Some((all.split_off(split), left_rows));
            }
            self.drop_damaged_unsealed(&mut b);
            sealed_end = all.last().map(|e| e.seq() + 1);
        } else {
            for e in events {
                b.insert(&self.recent, e.seq().to_be_bytes(), e.raw().clone());
            }
            for (r, encoded) in rows.iter().flatten() {
                b.insert(&self.recent_rows, r.seq.to_be_bytes(), encoded.clone());
            }
        }
        self.commit_batch(
            b,
            events.iter().map(|e| (e.seq(), e.time_us())),
            resume,
            row_bytes,
        )?;
        // Durable: now the in-memory view follows.
        let mut p = lock(&self.pending);
        match sealed_end {
            Some(end) => {
                // Readers of the sealed seqs find them in blocks from here on.
                self.sealed_end.store(end, Relaxed);
                lock(&self.damaged_unsealed).clear();
                p.sealed();
                if let Some((events, rows)) = left {
                    p.bytes = events.iter().map(|e| sealed_value(e).len()).sum();
                    p.events = events;
                    p.rows = Some(rows);
                    p.rows_stored = true;
                }
            }
            None => {
                p.events.extend(events.iter().cloned());
                p.bytes += added;
                match (&mut p.rows, rows) {
                    (Some(old), Some(new)) => {
                        old.extend(new.into_iter().map(|(_, b)| b));
                        p.rows_stored = true;
                    }
                    (old, _) => *old = None,
                }
            }
        }
        Ok(())
    }

    /// A new durable batch, after the folding's pruning (between batches, on the writer's
    /// side: `crate::folding`).
    fn batch(&self) -> fjall::Batch {
        self.folding.prune();
        self.ks.batch().durability(Some(PersistMode::SyncAll))
    }

    /// Into `b`: what a batch carries beside its events (account states, the resync
    /// partition's changes, the backfill's progress).
    fn write_beside(
        &self,
        b: &mut fjall::Batch,
        accounts: &[(Box<str>, AccountState)],
        resync: &[PendingChange],
        progress: &[(Box<str>, Vec<u8>)],
    ) {
        for (k, v) in progress {
            b.insert(&self.backfill, k.as_bytes(), v.as_slice());
        }
        for p in resync {
            match p {
                PendingChange::Hold { did, seq, frame } => {
                    b.insert(&self.resync, pending_key(did, *seq), frame.clone())
                }
                PendingChange::Release { did, seq } => {
                    b.remove(&self.resync, pending_key(did, *seq))
                }
            }
        }
        let mut buf = Vec::with_capacity(96);
        for (did, state) in accounts {
            buf.clear();
            encode_state(state, &mut buf);
            b.insert(&self.accounts, did.as_bytes(), buf.as_slice());
        }
    }

    /// Into a sealing batch `b`: the damaged unsealed values found at open leave with the
    /// events around them, recorded as lost.
    fn drop_damaged_unsealed(&self, b: &mut fjall::Batch) {
        for &seq in lock(&self.damaged_unsealed).iter() {
            b.remove(&self.recent, seq.to_be_bytes());
            let lost = LostRange {
                first: seq,
                end: seq + 1,
                why: "corrupt event",
            };
            b.insert(&self.meta, lost.key(), lost.value());
        }
    }

    /// Ends a batch: the time index of its new events (`(seq, time_us)`), `resume`, then the
    /// durable commit and the acknowledged mark (module docs, "Journal"); `row_bytes` of row
    /// blocks sealed.
    fn commit_batch(
        &self,
        mut b: fjall::Batch,
        new: impl Iterator<Item = (u64, i64)>,
        resume: &Resume,
        row_bytes: u64,
    ) -> Result<(), StoreError> {
        for (seq, time_us) in new {
            b.insert(
                &self.times,
                (time_us as u64).to_be_bytes(),
                seq.to_be_bytes(),
            );
        }
        b.insert(&self.meta, NEXT_SEQ, resume.next_seq.to_be_bytes());
        b.insert(
            &self.meta,
            LAST_TIME,
            (resume.last_time_us as u64).to_be_bytes(),
        );
        if let Some(c) = resume.upstream_cursor {
            b.insert(&self.meta, UPSTREAM, c.to_be_bytes());
        }
        b.commit().map_err(|e| self.err(e))?;
        self.acked.record(resume.next_seq, resume.last_time_us);
        self.live_row_bytes.fetch_add(row_bytes, Relaxed);
        Ok(())
    }

    /// The stored chain state of `did`, if any.
    pub fn account(&self, did: &str) -> Result<Option<AccountState>, StoreError> {
        let Some(v) = self.accounts.get(did).map_err(|e| self.err(e))? else {
            return Ok(None);
        };
        decode_state(&v)
            .map(Some)
            .map_err(|source| StoreError::CorruptAccount {
                did: did.to_owned(),
                source,
            })
    }

    /// Every stored account state, in DID order.
    pub fn accounts(
        &self,
    ) -> impl Iterator<Item = Result<(String, AccountState), StoreError>> + '_ {
        self.accounts.iter().map(|kv| {
            let (k, v) = kv.map_err(|e| self.err(e))?;
            let did = String::from_utf8_lossy(&k).into_owned();
            match decode_state(&v) {
                Ok(s) => Ok((did, s)),
                Err(source) => Err(StoreError::CorruptAccount { did, source }),
            }
        })
    }

    /// Writes raw bytes as an account's state (tests of corruption handling, here and in the
    /// server's chain cache: the `testing` feature).
    #[cfg(any(test, feature = "testing"))]
    pub fn put_raw_account_for_tests(&self, did: &str, value: &[u8]) {
        #[allow(clippy::expect_used)]
        self.accounts.insert(did, value).expect("insert");
    }

    /// The data directory.
    pub fn dir(&self) -> &Path {
        Path::new(&self.path)
    }

    /// Replaces the stored upstream cursor (`None`: forget it, so the next start follows the
    /// relay from `--upstream-cursor` or live), durably. The operator's way out when the relay
    /// this store followed was reset or replaced (`riptide serve --reset-upstream-cursor`).
    pub fn set_upstream_cursor(&self, cursor: Option<u64>) -> Result<(), StoreError> {
        let mut b = self.ks.batch().durability(Some(PersistMode::SyncAll));
        match cursor {
            Some(c) => b.insert(&self.meta, UPSTREAM, c.to_be_bytes()),
            None => b.remove(&self.meta, UPSTREAM),
        }
        b.commit().map_err(|e| self.err(e))
    }

    /// The retention floor: the oldest seq a read may return (0 before any retention pass).
    pub fn floor(&self) -> u64 {
        self.floor.load(Relaxed)
    }

    /// Raises the retention floor to `seq` (durably) if it is below: for a store that starts
    /// above seq 1 (a Kafka edge whose topic's retention removed the start), so that cursors
    /// below it behave as after a retention pass.
    pub fn raise_floor(&self, seq: u64) -> Result<(), StoreError> {
        if seq <= self.floor() {
            return Ok(());
        }
        let mut b = self.ks.batch().durability(Some(PersistMode::SyncAll));
        b.insert(&self.meta, FLOOR, seq.to_be_bytes());
        b.commit().map_err(|e| self.err(e))?;
        self.floor.store(seq, Relaxed);
        Ok(())
    }

    /// What the decompressed-block cache did, and the bytes it holds now.
    pub fn block_cache_stats(&self) -> BlockCacheStats {
        let bytes = lock(&self.cache)
            .iter()
            .map(|b| b.data.capacity() as u64)
            .sum();
        BlockCacheStats {
            hits: self.cache_stats.hits.load(Relaxed),
            loads: self.cache_stats.loads.load(Relaxed),
            ahead: self.cache_stats.ahead.load(Relaxed),
            bytes,
        }
    }

    /// What the store found damaged or lost since it was opened (module docs, "Checksums").
    pub fn integrity_stats(&self) -> IntegrityStats {
        let c = &self.integrity;
        IntegrityStats {
            corrupt_blocks: c.corrupt_blocks.load(Relaxed),
            corrupt_events: c.corrupt_events.load(Relaxed),
            journal_lost_events: c.journal_lost.load(Relaxed),
        }
    }

    /// The sealed blocks found damaged since the store was opened, in seq order.
    pub fn damaged_blocks(&self) -> Vec<DamagedBlock> {
        lock(&self.damaged).values().copied().collect()
    }

    /// An unsealed event whose stored value is not an event (found at open): logged at error,
    /// counted with the damaged blocks' events, left out (module docs, "Checksums").
    fn note_damaged_unsealed(&self, bad: CorruptEvent) {
        tracing::error!(
            store = %self.path,
            seq = bad.seq,
            what = bad.what,
            "a stored unsealed event is corrupt: it is not served (the events before and after \
             it are); `riptide store repair --data DIR` removes it (with the server stopped)"
        );
        self.integrity.corrupt_events.fetch_add(1, Relaxed);
        lock(&self.damaged_unsealed).push(bad.seq);
    }

    /// Where the damaged block holding `seq` ends, if `seq` is in one.
    fn damaged_end(&self, seq: u64) -> Option<u64> {
        let d = lock(&self.damaged);
        let (_, b) = d.range(..=seq).next_back()?;
        (seq < b.end).then_some(b.end)
    }

    /// Records the block at `first` as damaged (once: logged at error and counted the first
    /// time) and returns it. Its seqs end where the next block starts, or at the end of the
    /// sealed events: its own header is not to be trusted.
    fn note_damaged(&self, first: u64, what: &'static str) -> DamagedBlock {
        if let Some(b) = lock(&self.damaged).get(&first) {
            return *b;
        }
        let sealed_end = self.sealed_end.load(Relaxed);
        let end = match self.blocks.range((first + 1).to_be_bytes()..).next() {
            Some(Ok((k, _))) => be64(&k),
            Some(Err(_)) => first + 1,
            None => sealed_end,
        };
        let end = self
            .next_segment_block(first)
            .map_or(end, |s| s.min(end))
            .max(first + 1);
        let b = DamagedBlock { first, end, what };
        let mut d = lock(&self.damaged);
        if d.insert(first, b).is_none() {
            self.integrity.corrupt_blocks.fetch_add(1, Relaxed);
            self.integrity.corrupt_events.fetch_add(b.events(), Relaxed);
            tracing::error!(
                store = %self.path,
                block = first,
                seqs = %format_args!("{first}..={}", end - 1),
                events = b.events(),
                what,
                "a stored block is corrupt: its events are skipped by every reader (the events \
                 before and after it are served); `riptide store check --data DIR` lists the \
                 damage, `riptide store repair` drops it (with the server stopped)"
            );
        }
        drop(d);
        // Never served from the cache either.
        lock(&self.cache).retain(|c| c.first != first);
        b
    }

    /// The cached block holding `seq`, made the most recently used.
    fn cached_block(&self, seq: u64) -> Option<Arc<Block>> {
        let mut c = lock(&self.cache);
        let i = c.iter().rposition(|b| b.holds(seq))?;
        let b = c.remove(i)?;
        c.push_back(b.clone());
        self.cache_stats.hits.fetch_add(1, Relaxed);
        Some(b)
    }

    /// The sealed block holding `seq`, or the first one after it; `None` past the last block.
    /// A reader that finds its block being loaded ahead (it caught up with its load ahead)
    /// waits for that load rather than decompressing the block a second time. Other loads are
    /// not claimed: with many readers, the server's store-reader permits already let one load
    /// a block while the others wait and then find it cached (`server::read_batch`), and a
    /// reader waiting here on another's load would hold a permit that a third could use (200
    /// concurrent v2 replays were ~8% slower with every load claimed).
    fn block_at(&self, seq: u64) -> Result<Option<Arc<Block>>, StoreError> {
        if let Some(b) = self.cached_block(seq) {
            return Ok(Some(b));
        }
        let (claims, loaded) = &*self.loading;
        let mut c = lock(claims);
        let claimed = c.contains(&seq);
        while c.contains(&seq) {
            c = loaded.wait(c).unwrap_or_else(|p| p.into_inner());
        }
        drop(c);
        // After a wait, the load it waited for put the block in the cache (unless it failed).
        match claimed.then(|| self.cached_block(seq)).flatten() {
            Some(b) => Ok(Some(b)),
            None => self.load_block(seq),
        }
    }

    /// What folding's thread needs to switch readers to a rewritten file
    /// (`seal::refresh_file`) without holding a clone of the store.
    pub(crate) fn readers_of_segments(&self) -> SegmentReaders {
        SegmentReaders {
            files: self.segments.clone(),
            cache: self.cache.clone(),
        }
    }

    /// Whether the block holding `seq` is cached (not counted as a hit).
    fn is_cached(&self, seq: u64) -> bool {
        lock(&self.cache).iter().any(|b| b.holds(seq))
    }

    /// Decompresses the sealed block holding `seq` (or the first after it) into the cache;
    /// `None` past the last block.
    fn load_block(&self, seq: u64) -> Result<Option<Arc<Block>>, StoreError> {
        let key = seq.to_be_bytes();
        let found = match self.blocks.range(..=key).next_back() {
            Some(kv) => {
                let (k, v) = kv.map_err(|e| self.err(e))?;
                let h = block_header(be64(&k), &v)?;
                (seq < h.first + h.count).then_some((h, v))
            }
            None => None,
        };
        let found = match found {
            Some(hv) => Some(hv),
            None => match self.blocks.range(key..).next() {
                Some(kv) => {
                    let (k, v) = kv.map_err(|e| self.err(e))?;
                    Some((block_header(be64(&k), &v)?, v))
                }
                None => None,
            },
        };
        // A sealed file's block (module `seal`), looked up after `blocks`: a seal adds its file
        // to the index before its blocks leave `blocks`, so a block is always in one of them.
        let in_file = self.segment_block(seq).filter(|s| {
            found
                .as_ref()
                .is_none_or(|(h, _)| h.first > seq && (s.holds(seq) || s.first() < h.first))
        });
        let spare = std::mem::take(&mut *lock(&self.spare));
        let block = match (in_file, found) {
            (Some(s), _) => {
                let block = Arc::new(self.open_segment_block(&s, spare)?);
                // Folding replaced the file meanwhile: this reader has its block, but the cache
                // takes only the current generation's (module `seal`, `refresh_file`).
                if !s.is_current(&self.files()) {
                    self.cache_stats.loads.fetch_add(1, Relaxed);
                    return Ok(Some(block));
                }
                block
            }
            (None, Some((h, v))) => Arc::new(open_block(&h, &v, spare)?),
            (None, None) => return Ok(None),
        };
        self.cache_stats.loads.fetch_add(1, Relaxed);
        let mut c = lock(&self.cache);
        // Another reader may have loaded the same block meanwhile: keep one copy.
        if let Some(i) = c.iter().position(|b| b.first == block.first) {
            c.remove(i);
        }
        while c.len() >= self.options.block_cache.max(1) {
            let Some(old) = c.pop_front() else { break };
            // Its buffer serves the next block, unless a reader still holds it.
            if let Ok(old) = Arc::try_unwrap(old) {
                *lock(&self.spare) = old.data;
            }
        }
        c.push_back(block.clone());
        Ok(Some(block))
    }

    /// For a reader of sealed blocks whose next seq is `next`: the next block after the one it
    /// is reading that is not cached, up to `AHEAD` blocks on, to be loaded now
    /// ([`Ahead::load`], on the blocking pool) while the reader sends what it has, so that its
    /// next reads find their blocks cached instead of waiting for the decompression (module
    /// docs, "Read-ahead"). `None` when those blocks are cached already, the one to load is
    /// being loaded or is not sealed, or the reader's own block is not cached (it is not
    /// reading sealed blocks in order), and when `readers` (the readers of sealed blocks now,
    /// this one included) and the blocks each would keep (its own and those ahead) do not fit
    /// in the cache: loads ahead would then evict blocks other readers are reading (measured:
    /// 200 concurrent replays took 15% longer). Claimed until the [`Ahead`] is loaded or dropped.
    pub fn claim_ahead(&self, next: u64, readers: usize) -> Option<Ahead<T>> {
        // One block ahead in a cache too small to hold a reader's block and two more besides
        // others'.
        let depth = AHEAD.min(self.options.block_cache / 4).max(1);
        if readers.max(1) * (1 + depth) > self.options.block_cache {
            return None;
        }
        let sealed_end = self.sealed_end.load(Relaxed);
        let c = lock(&self.cache);
        // The block the reader is in, or the one it just finished.
        let mut target = c.iter().find(|b| b.first <= next && next <= b.end())?.end();
        // The first block not cached among the next `depth` (blocks are claimed one at a time,
        // so the loads stay up to that many blocks ahead).
        for _ in 0..depth {
            // A damaged block is not loaded again: the one after it is next.
            if let Some(end) = self.damaged_end(target) {
                target = end;
            }
            match c.iter().find(|b| b.holds(target)) {
                Some(b) => target = b.end(),
                None if target < sealed_end => {
                    drop(c);
                    return Claim::take(self, target).map(Ahead);
                }
                None => return None,
            }
        }
        None
    }

    /// Events with seq ≥ `from` (and ≥ the floor) within `limit`, in order (fewer, or none, at
    /// the end of the store). The values a read returns from a block share one copy out of it
    /// (no more than the read returns): the byte cap bounds the memory a read costs. Sealed events come without their zstd form
    /// ([`Event::zstd`] is empty: the module docs).
    pub fn read_from(
        &self,
        from: u64,
        limit: ReadLimit,
        out: &mut Vec<Event<T>>,
    ) -> Result<(), StoreError> {
        self.read_inner(from, limit, out, true).map(|_| ())
    }

    /// [`Self::read_from`] without I/O: `false` (and nothing read) when the first event wanted
    /// is in a sealed block that is not cached. Otherwise it reads what the cache and the
    /// unsealed events hold (possibly fewer events than a full read, none at the end of the
    /// store) and says `true`. For the server's async tasks (module docs).
    pub fn read_cached(
        &self,
        from: u64,
        limit: ReadLimit,
        out: &mut Vec<Event<T>>,
    ) -> Result<bool, StoreError> {
        self.read_inner(from, limit, out, false)
    }

    fn read_inner(
        &self,
        from: u64,
        limit: ReadLimit,
        out: &mut Vec<Event<T>>,
        load: bool,
    ) -> Result<bool, StoreError> {
        let (start, mut bytes) = (out.len(), 0);
        let mut from = from.max(self.floor());
        loop {
            loop {
                let sealed_end = self.sealed_end.load(Relaxed);
                if from >= sealed_end {
                    break;
                }
                // A block found damaged is skipped: the reader goes on with the next one.
                if let Some(end) = self.damaged_end(from) {
                    from = end;
                    continue;
                }
                let block = if load {
                    match self.block_at(from) {
                        Ok(b) => b,
                        Err(StoreError::CorruptBlock { first, what }) => {
                            from = self.note_damaged(first, what).end.max(from + 1);
                            continue;
                        }
                        Err(e) => return Err(e),
                    }
                } else {
                    match self.cached_block(from) {
                        Some(b) => Some(b),
                        // Not cached: what was read so far, or ask for a loading read.
                        None => return Ok(out.len() > start),
                    }
                };
                let Some(block) = block else {
                    // No block at or after `from` (retention dropped them): nothing sealed left.
                    from = sealed_end;
                    break;
                };
                // The events that fit, copied out in one piece (their values are back to back
                // in the block), each a slice of it: one allocation per read, not per event.
                // By seq: a folded block's seqs have gaps (a cursor in one starts after it).
                let skip = block.index_of(from);
                let mut end = skip;
                while end < block.starts.len() {
                    let n = out.len() - start + (end - skip);
                    if n >= limit.events.max(1) || (n > 0 && bytes >= limit.bytes) {
                        break;
                    }
                    bytes += block.value(end).len();
                    end += 1;
                }
                if end > skip {
                    let span = block.span(skip, end);
                    let base = span.start;
                    let copy = Bytes::copy_from_slice(&block.data[span]);
                    let mark = out.len();
                    for i in skip..end {
                        let at = block.starts[i] as usize - base;
                        let raw = copy.slice(at..at + block.value(i).len());
                        match Event::<T>::decode(block.seqs[i], raw) {
                            Ok(e) => out.push(e),
                            // Only in a block from before checksums (a checksummed one holds
                            // what was sealed): none of its events is served from here on.
                            Err(_) => {
                                out.truncate(mark);
                                from = self.note_damaged(block.first, "event").end;
                                break;
                            }
                        }
                    }
                    if out.len() == mark {
                        continue;
                    }
                }
                if end < block.starts.len() {
                    return Ok(true);
                }
                from = block.end();
            }
            let p = lock(&self.pending);
            // Sealed meanwhile (the writer moves `sealed_end` under this lock): read the blocks.
            if from < self.sealed_end.load(Relaxed) {
                continue;
            }
            // By seq, not by offset: a damaged value dropped at open leaves a gap.
            let skip = p.events.partition_point(|e| e.seq() < from);
            for e in p.events.iter().skip(skip) {
                if limit.full(out, start, bytes) {
                    break;
                }
                bytes += e.raw().len();
                out.push(e.clone());
            }
            return Ok(true);
        }
    }

    /// The seq of the first retained event with `time_us` ≥ `t`, if any.
    pub fn seq_at_time(&self, t: i64) -> Result<Option<u64>, StoreError> {
        match self.time_index(t)? {
            // Below the floor (an old `t`): the answer is the first retained event.
            Some(seq) if seq < self.floor() => self.first_seq(),
            found => Ok(found),
        }
    }

    /// The time index's seq for the first `time_us` ≥ `t`, below the floor or not.
    fn time_index(&self, t: i64) -> Result<Option<u64>, StoreError> {
        match self.times.range((t.max(0) as u64).to_be_bytes()..).next() {
            Some(kv) => Ok(Some(be64(&kv.map_err(|e| self.err(e))?.1))),
            None => Ok(None),
        }
    }

    /// The oldest retained event's seq, if any.
    pub fn first_seq(&self) -> Result<Option<u64>, StoreError> {
        let floor = self.floor();
        let mut from = floor;
        while from < self.sealed_end.load(Relaxed) {
            if let Some(end) = self.damaged_end(from) {
                from = end;
                continue;
            }
            match self.block_at(from) {
                Ok(Some(b)) => match b.seqs.get(b.index_of(from)) {
                    Some(&seq) => return Ok(Some(seq)),
                    // Past its last event (a folded block's tail): the next block's.
                    None => from = b.end().max(from + 1),
                },
                Ok(None) => break,
                Err(StoreError::CorruptBlock { first, what }) => {
                    from = self.note_damaged(first, what).end.max(from + 1);
                }
                Err(e) => return Err(e),
            }
        }
        let p = lock(&self.pending);
        Ok(p.events.iter().map(Event::seq).find(|&s| s >= floor))
    }

    /// One past the newest stored event's seq (`None`: nothing stored).
    fn end(&self) -> Option<u64> {
        let p = lock(&self.pending);
        match p.events.last() {
            Some(e) => Some(e.seq() + 1),
            None => Some(self.sealed_end.load(Relaxed)).filter(|&s| s > 1),
        }
    }

    /// One retention pass: raises the floor to the first event with `time_us` ≥ `cutoff_us`
    /// (past every stored event if there is none), then drops the log's segment files created
    /// more than `window` ago. See the module docs.
    pub fn expire(&self, cutoff_us: i64, window: Duration) -> Result<Expired, StoreError> {
        let old = self.floor();
        let next = match self.time_index(cutoff_us)? {
            Some(seq) => seq,
            None => self.end().unwrap_or(old),
        };
        // A sealing store deletes nothing (module `seal`): the floor is the live floor, never
        // above the newest segment's first seq, and it may come down to it.
        let sealing = self.options.segment_bytes.is_some();
        let floor = if sealing {
            self.catalog.live_floor(next.max(old))?
        } else {
            next.max(old)
        };
        if floor != old {
            self.meta
                .insert(FLOOR, floor.to_be_bytes())
                .map_err(|e| self.err(e))?;
            self.floor.store(floor, Relaxed);
        }
        // FIFO's time-to-live counts whole seconds and is off at 0: round up, at least 1 s.
        let ttl = window.as_secs() + u64::from(window.subsec_nanos() > 0);
        let drop_old = Arc::new(Fifo::new(u64::MAX, Some(ttl.max(1))));
        // A sealing store's blocks leave `blocks` when sealed, never by age: one not yet sealed
        // must reach its segment.
        let logs: &[&PartitionHandle] = if sealing {
            &[&self.times]
        } else {
            &[&self.blocks, &self.times]
        };
        for p in logs {
            // Threshold 0: the strategy only drops whole files; should it merge (segments that
            // overlap, which this layout never makes) it keeps every version.
            p.tree
                .compact(drop_old.clone(), 0)
                .map_err(|e| self.err(e.into()))?;
        }
        // Blocks the files took with them must not be served from the cache.
        lock(&self.cache).clear();
        Ok(Expired {
            // Seqs are consecutive, so the floor's rise is the number of events it passed.
            events: floor.saturating_sub(old.max(1)),
            floor,
        })
    }

    /// The number of sealed blocks (a scan of their keys: for tests and tools, not a hot path).
    pub fn block_count(&self) -> Result<usize, StoreError> {
        self.blocks.len().map_err(|e| self.err(e))
    }

    /// The store's size on disk: bytes of segment files and journals, and the log's segments.
    pub fn disk_usage(&self) -> DiskUsage {
        let parts = [
            &self.blocks,
            &self.recent,
            &self.recent_rows,
            &self.times,
            &self.accounts,
            &self.meta,
        ];
        DiskUsage {
            bytes: self.ks.disk_space(),
            segments: self.blocks.segment_count() + self.times.segment_count(),
            segment_bytes: parts.iter().map(|p| p.disk_space()).sum(),
            block_bytes: self.blocks.disk_space(),
            recent_bytes: self.recent.disk_space() + self.recent_rows.disk_space(),
        }
    }

    /// Flushes every memtable to its segment files and waits (so [`Self::disk_usage`] counts
    /// what the store keeps, not what its journals hold until the next flush: `bench serve`).
    pub fn flush(&self) -> Result<(), StoreError> {
        for p in [
            &self.blocks,
            &self.recent,
            &self.recent_rows,
            &self.times,
            &self.accounts,
            &self.meta,
        ] {
            p.rotate_memtable_and_wait().map_err(|e| self.err(e))?;
        }
        Ok(())
    }

    /// Every stored event's JSON, oldest first, up to `max_bytes` in total (dictionary training).
    pub fn sample_json(&self, max_bytes: usize) -> Result<Vec<Bytes>, StoreError> {
        let mut out = Vec::new();
        let mut total = 0;
        let mut from = self.floor();
        let mut batch = Vec::new();
        loop {
            batch.clear();
            let limit = ReadLimit {
                events: 4096,
                bytes: 4 << 20,
            };
            self.read_from(from, limit, &mut batch)?;
            let Some(last) = batch.last() else {
                return Ok(out);
            };
            from = last.seq() + 1;
            for e in &batch {
                total += e.json_len();
                if total > max_bytes {
                    return Ok(out);
                }
                out.push(e.json());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use riptide_jetstream::EventKind;

    use crate::testing::{cut_journals, flip_block};

    /// The store of these tests: its events carry [`Utf8Text`].
    type Store = super::Store<Utf8Text>;

    fn ev(seq: u64, t: i64) -> Event {
        Event::encode(
            seq,
            t,
            EventKind::Commit,
            "did:plc:a",
            "app.bsky.feed.post",
            b"{}",
            b"",
        )
    }

    fn resume(next_seq: u64, last_time_us: i64, cursor: u64) -> Resume {
        Resume {
            next_seq,
            last_time_us,
            upstream_cursor: Some(cursor),
        }
    }

    fn seqs(s: &Store, from: u64) -> Vec<u64> {
        let mut out = Vec::new();
        let limit = ReadLimit {
            events: 100,
            bytes: 1 << 20,
        };
        s.read_from(from, limit, &mut out).unwrap();
        out.iter().map(Event::seq).collect()
    }

    /// Every event from `from` on, read `per_read` at a time as a replaying subscriber would.
    fn read_every(s: &Store, from: u64, per_read: usize) -> Vec<Event> {
        let (mut out, mut from) = (Vec::new(), from);
        let l = ReadLimit {
            events: per_read,
            bytes: 1 << 30,
        };
        loop {
            let n = out.len();
            s.read_from(from, l, &mut out).unwrap();
            match out.last() {
                Some(e) if out.len() > n => from = e.seq() + 1,
                _ => break,
            }
        }
        out
    }

    /// What a `kill -9` during a first start leaves (a half-made partition, no `version`, a
    /// leftover `.creating`) is made again whole; the directory then opens and keeps what it
    /// is given.
    #[test]
    fn a_first_start_cut_short_is_made_again() {
        let dir = tempfile::tempdir().unwrap();
        for half in ["partitions/listings", "keyspace.creating/partitions/meta"] {
            let p = dir.path().join(half);
            std::fs::create_dir_all(&p).unwrap();
            std::fs::write(p.join("config"), b"").unwrap();
        }
        {
            let (s, r) = Store::open(dir.path(), 0).unwrap();
            assert_eq!(r.next_seq, 1);
            s.append(&[ev(1, 10)], &resume(2, 10, 5)).unwrap();
        }
        assert!(!dir.path().join("keyspace.creating").exists());
        assert!(!dir.path().join("partitions/listings").exists());
        let (s, r) = Store::open(dir.path(), 0).unwrap();
        assert_eq!(r, resume(2, 10, 5));
        assert_eq!(seqs(&s, 1), [1]);
    }

    #[test]
    fn progress_lands_with_its_events_and_survives_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (s, _) = Store::open(dir.path(), 0).unwrap();
            assert_eq!(s.progress("did:plc:a").unwrap(), None);
            let evs: Vec<_> = (1..=3).map(|i| ev(i, 100 + i as i64)).collect();
            let progress = [("did:plc:a".into(), b"rev-a".to_vec())];
            let state = AccountState::default();
            s.append_with_progress(
                &evs,
                None,
                &[("did:plc:a".into(), state)],
                &progress,
                &resume(4, 103, 0),
            )
            .unwrap();
            assert_eq!(
                s.progress("did:plc:a").unwrap().as_deref(),
                Some(&b"rev-a"[..])
            );
        }
        let (s, r) = Store::open(dir.path(), 0).unwrap();
        assert_eq!(r.next_seq, 4);
        assert_eq!(seqs(&s, 1), [1, 2, 3]);
        assert_eq!(
            s.progress("did:plc:a").unwrap().as_deref(),
            Some(&b"rev-a"[..])
        );
        assert_eq!(s.progress("did:plc:b").unwrap(), None);
        assert_eq!(s.progress_len().unwrap(), 1);
        assert!(s.account("did:plc:a").unwrap().is_some());
    }

    #[test]
    fn append_reopen_expire() {
        let dir = tempfile::tempdir().unwrap();
        let day = Duration::from_secs(86_400);
        {
            let (s, r) = Store::open(dir.path(), 0).unwrap();
            assert_eq!(
                r,
                Resume {
                    next_seq: 1,
                    ..Resume::default()
                }
            );
            let evs: Vec<_> = (1..=10).map(|i| ev(i, 1000 + i as i64)).collect();
            s.append(&evs, &resume(11, 1010, 77)).unwrap();
        }
        let (s, r) = Store::open(dir.path(), 0).unwrap();
        assert_eq!(r, resume(11, 1010, 77));
        let mut out = Vec::new();
        let three = ReadLimit {
            events: 3,
            bytes: 1 << 20,
        };
        s.read_from(4, three, &mut out).unwrap();
        assert_eq!(out.iter().map(Event::seq).collect::<Vec<_>>(), [4, 5, 6]);
        assert_eq!(s.seq_at_time(1005).unwrap(), Some(5));
        assert_eq!(s.seq_at_time(2000).unwrap(), None);

        // Events 1..=3 fall out of the window: the floor rises past them, exactly.
        let x = s.expire(1004, day).unwrap();
        assert_eq!(
            x,
            Expired {
                events: 3,
                floor: 4
            }
        );
        assert_eq!(s.first_seq().unwrap(), Some(4));
        assert_eq!(s.seq_at_time(0).unwrap(), Some(4));
        assert_eq!(s.seq_at_time(1003).unwrap(), Some(4));
        assert_eq!(s.seq_at_time(1006).unwrap(), Some(6));
        assert_eq!(seqs(&s, 1), (4..=10).collect::<Vec<_>>());
        assert_eq!(s.sample_json(1 << 20).unwrap().len(), 7);
        // A second pass with the same cutoff expires nothing more.
        assert_eq!(
            s.expire(1004, day).unwrap(),
            Expired {
                events: 0,
                floor: 4
            }
        );
        drop(s);

        // The floor survives a restart; everything expired leaves nothing to read.
        let (s, _) = Store::open(dir.path(), 0).unwrap();
        assert_eq!(s.floor(), 4);
        assert_eq!(seqs(&s, 0), (4..=10).collect::<Vec<_>>());
        assert_eq!(
            s.expire(5000, day).unwrap(),
            Expired {
                events: 7,
                floor: 11
            }
        );
        assert_eq!(s.first_seq().unwrap(), None);
        assert_eq!(s.seq_at_time(0).unwrap(), None);
        assert!(seqs(&s, 1).is_empty());
        drop(s);
        assert!(matches!(
            Store::open(dir.path(), 5),
            Err(StoreError::DictionaryMismatch {
                stored: 0,
                given: 5
            })
        ));
    }

    #[test]
    fn expire_drops_old_segment_files() {
        let dir = tempfile::tempdir().unwrap();
        // Blocks of 10 events: the 100 are all sealed.
        let small = small(10, 2);
        let (s, _) = Store::open_with(dir.path(), 0, small).unwrap();
        let evs: Vec<_> = (1..=100).map(|i| ev(i, 1000 + i as i64)).collect();
        s.append(&evs, &resume(101, 1100, 100)).unwrap();
        s.blocks.rotate_memtable_and_wait().unwrap();
        s.times.rotate_memtable_and_wait().unwrap();
        let before = s.disk_usage();
        assert_eq!(before.segments, 2);
        assert!(before.bytes > 100 * 50, "{before:?}");
        // Within the window: the files stay.
        let x = s.expire(1050, Duration::from_secs(3600)).unwrap();
        assert_eq!(
            x,
            Expired {
                events: 49,
                floor: 50
            }
        );
        assert_eq!(s.disk_usage().segments, 2);
        // Once a file is older than the window, it goes (FIFO counts whole seconds).
        std::thread::sleep(Duration::from_millis(2100));
        s.expire(2000, Duration::from_secs(1)).unwrap();
        // Segments gone, and their bytes (`bytes` also counts the journals, which stay).
        let after = s.disk_usage();
        assert_eq!(after.segments, 0);
        assert!(after.bytes < before.bytes, "{before:?} -> {after:?}");
        assert!(seqs(&s, 0).is_empty());
        // New events still land and are read above the floor.
        let evs: Vec<_> = (101..=102).map(|i| ev(i, 3000 + i as i64)).collect();
        s.append(&evs, &resume(103, 3102, 102)).unwrap();
        assert_eq!(seqs(&s, 0), [101, 102]);
    }

    #[test]
    fn old_layout_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        {
            // What riptide wrote before layouts: leveled partitions, no layout key.
            let ks = Config::new(dir.path()).open().unwrap();
            let events = ks
                .open_partition("events", PartitionCreateOptions::default())
                .unwrap();
            events.insert(1u64.to_be_bytes(), b"x").unwrap();
            ks.persist(PersistMode::SyncAll).unwrap();
        }
        match Store::open(dir.path(), 0) {
            Err(StoreError::OldLayout { found: 1, .. }) => {}
            other => panic!("{other:?}"),
        }
    }

    /// An event with a JSON body of `seq` and a zstd form, as ingest makes them.
    fn ev_z(seq: u64) -> Event {
        let json = format!(
            "{{\"did\":\"did:plc:a\",\"cursor\":{seq},\"pad\":\"{}\"}}",
            "x".repeat(seq as usize % 7)
        );
        Event::encode(
            seq,
            1000 + seq as i64,
            EventKind::Commit,
            "did:plc:a",
            "app.bsky.feed.post",
            json.as_bytes(),
            b"zstd-form",
        )
    }

    /// Every read from every `from`, under several limits, returns the right events in order.
    /// Blocks of `block_events` events (bytes never the limit), `block_cache` of them cached.
    fn small(block_events: usize, block_cache: usize) -> StoreOptions {
        StoreOptions {
            block_events,
            block_bytes: 1 << 20,
            block_cache,
            segment_bytes: None,
        }
    }

    /// A store in `dir` with `opts`, holding events 1..=`n` (`ev_z`) appended in one batch.
    fn filled(dir: &Path, opts: StoreOptions, n: u64) -> Store {
        let (s, _) = Store::open_with(dir, 0, opts).unwrap();
        let evs: Vec<_> = (1..=n).map(ev_z).collect();
        s.append(&evs, &resume(n + 1, 1000 + n as i64, n)).unwrap();
        s
    }

    fn check_reads(s: &Store, n: u64, sealed_below: u64) {
        for from in 0..=n + 2 {
            for limit in [1, 3, 7, 100] {
                let mut out = Vec::new();
                let l = ReadLimit {
                    events: limit,
                    bytes: 1 << 20,
                };
                s.read_from(from, l, &mut out).unwrap();
                let want: Vec<u64> = (from.max(1)..=n).take(limit).collect();
                assert_eq!(
                    out.iter().map(Event::seq).collect::<Vec<_>>(),
                    want,
                    "from {from}, limit {limit}"
                );
                for e in &out {
                    let want = ev_z(e.seq());
                    assert_eq!(e.json(), want.json());
                    assert_eq!((e.did(), e.collection()), (want.did(), want.collection()));
                    assert_eq!((e.time_us(), e.kind()), (want.time_us(), want.kind()));
                    // Sealed events keep no zstd form; unsealed ones keep theirs.
                    let z: &[u8] = if e.seq() < sealed_below {
                        b""
                    } else {
                        b"zstd-form"
                    };
                    assert_eq!(&e.zstd()[..], z, "seq {}", e.seq());
                }
            }
        }
    }

    #[test]
    fn events_are_sealed_in_blocks_and_read_back_across_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let small = small(4, 2);
        let mut next = 1;
        {
            let (s, _) = Store::open_with(dir.path(), 0, small).unwrap();
            // Batches of 1, 2, 5 (seals all 8), 1, 1, 1, 9 (seals 12), 2 (left unsealed).
            for size in [1, 2, 5, 1, 1, 1, 9, 2] {
                let evs: Vec<_> = (next..next + size).map(ev_z).collect();
                next += size;
                s.append(&evs, &resume(next, 1000 + next as i64 - 1, next - 1))
                    .unwrap();
            }
            // 22 events: 8 + 12 sealed (1..=20), 21 and 22 unsealed.
            assert_eq!(s.sealed_end.load(Relaxed), 21);
            // Blocks of at most 4: 8 = 4 + 4, then 12 = 4 + 4 + 4.
            assert_eq!(s.blocks.len().unwrap(), 5);
        }
        let (s, r) = Store::open_with(dir.path(), 0, small).unwrap();
        assert_eq!(r.next_seq, 23);
        check_reads(&s, 22, 21);
        assert_eq!(s.seq_at_time(1005).unwrap(), Some(5));
        assert_eq!(s.first_seq().unwrap(), Some(1));
        // A floor inside a block: reads start exactly there.
        s.expire(1006, Duration::from_secs(3600)).unwrap();
        assert_eq!(s.first_seq().unwrap(), Some(6));
        assert_eq!(seqs(&s, 0)[..2], [6, 7]);
        assert_eq!(s.sample_json(1 << 20).unwrap().len(), 17);
    }

    #[test]
    fn a_sealing_batch_leaves_no_small_block() {
        // A batch that brings the unsealed events past a block's worth seals them all; what is
        // left after the last whole block goes into that block, not into a small one of its own
        // (which compressed worse and cost a replay a load).
        let dir = tempfile::tempdir().unwrap();
        let small = small(4, 2);
        let (s, _) = Store::open_with(dir.path(), 0, small).unwrap();
        let mut next = 1;
        // 3 unsealed, then 6: 9 sealed as 4 + 5; then 4, sealed as one; then 11 as 4 + 7.
        for size in [3, 6, 4, 11] {
            let evs: Vec<_> = (next..next + size).map(ev_z).collect();
            next += size;
            s.append(&evs, &resume(next, 1000 + next as i64 - 1, next - 1))
                .unwrap();
        }
        assert_eq!(s.sealed_end.load(Relaxed), 25);
        assert_eq!(s.recent.len().unwrap(), 0);
        let mut counts = Vec::new();
        for kv in s.blocks.iter() {
            let (k, v) = kv.unwrap();
            counts.push(block_header(be64(&k), &v).unwrap().count);
        }
        assert_eq!(counts, [4, 5, 4, 4, 7]);
        assert_eq!(s.block_count().unwrap(), 5);
        check_reads(&s, 24, 25);
    }

    #[test]
    fn a_reader_loads_ahead_and_a_block_is_loaded_once() {
        let dir = tempfile::tempdir().unwrap();
        let small = small(10, 8);
        let s = filled(dir.path(), small, 45);
        // Blocks 1, 11, 21 and 31..=45.
        assert_eq!(s.block_count().unwrap(), 4);
        assert_eq!(s.sealed_end.load(Relaxed), 46);
        let three = ReadLimit {
            events: 3,
            bytes: 1 << 20,
        };
        // Nothing cached: nothing to load ahead of.
        assert!(s.claim_ahead(1, 1).is_none());
        let mut out = Vec::new();
        s.read_from(1, three, &mut out).unwrap();
        // Reading block 1: block 11 is next, claimed once; not while three read the store (a
        // cache of 8 holds two readers' blocks and two more each).
        assert!(s.claim_ahead(4, 3).is_none());
        let ahead = s.claim_ahead(4, 2).unwrap();
        assert!(s.claim_ahead(4, 1).is_none(), "claimed twice");
        ahead.load();
        let stats = s.block_cache_stats();
        assert_eq!((stats.loads, stats.ahead), (2, 1));
        // Block 11 cached: the one after it is next, and then nothing (two ahead).
        s.claim_ahead(4, 1).unwrap().load();
        assert!(s.claim_ahead(4, 1).is_none());
        assert_eq!(s.block_cache_stats().ahead, 2);
        // The reader's next reads need no load.
        out.clear();
        assert!(s.read_cached(11, three, &mut out).unwrap());
        assert_eq!(out.iter().map(Event::seq).collect::<Vec<_>>(), [11, 12, 13]);
        // In the last sealed block there is nothing more to load.
        let mut all = Vec::new();
        let every = ReadLimit {
            events: 100,
            bytes: 1 << 20,
        };
        s.read_from(1, every, &mut all).unwrap();
        assert_eq!(all.len(), 45);
        assert!(s.claim_ahead(41, 1).is_none());
        assert_eq!(s.block_cache_stats().loads, 4);

        // A reader that needs a block being loaded waits for that load rather than loading it
        // again: hold a claim on block 1 (evicted by a cache of one), read it from a thread,
        // then load it under the claim. (One store per directory at a time: `crate::lock`.)
        drop(s);
        let (s, _) = Store::open_with(
            dir.path(),
            0,
            StoreOptions {
                block_cache: 1,
                ..small
            },
        )
        .unwrap();
        let claim = Claim::take(&s, 1).unwrap();
        let reader = {
            let s = s.clone();
            std::thread::spawn(move || {
                let mut out = Vec::new();
                s.read_from(1, three, &mut out).unwrap();
                out.iter().map(Event::seq).collect::<Vec<_>>()
            })
        };
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(s.block_cache_stats().loads, 0, "the reader did not wait");
        s.load_block(1).unwrap();
        drop(claim);
        assert_eq!(reader.join().unwrap(), [1, 2, 3]);
        assert_eq!(s.block_cache_stats().loads, 1);
    }

    #[test]
    fn a_block_is_cut_at_its_byte_cap() {
        let dir = tempfile::tempdir().unwrap();
        let one = ev_z(1).raw().len();
        let small = StoreOptions {
            block_events: 100,
            block_bytes: one * 3,
            block_cache: 2,
            segment_bytes: None,
        };
        let s = filled(dir.path(), small, 10);
        assert_eq!(s.sealed_end.load(Relaxed), 11);
        assert!(s.blocks.len().unwrap() >= 4, "{}", s.blocks.len().unwrap());
        check_reads(&s, 10, 11);
    }

    /// Every event a read from 0 returns (all of them, in reads of 7), checked against what was
    /// stored (`ev_z`): a damaged block may be skipped, never served altered.
    fn read_all(s: &Store) -> Vec<u64> {
        let out = read_every(s, 0, 7);
        for e in &out {
            assert_eq!(e.json(), ev_z(e.seq()).json(), "seq {}", e.seq());
        }
        out.iter().map(Event::seq).collect()
    }

    #[test]
    fn a_flipped_bit_in_a_stopped_store_is_found_named_counted_and_skipped() {
        let small = small(10, 8);
        // Blocks 1, 11, 21, 31..=45. A bit flipped in block 11: in its count, its first seq, its
        // raw length, inside its zstd frame, and in its checksum.
        for at in [3, 10, 22, 40, usize::MAX] {
            let dir = tempfile::tempdir().unwrap();
            let s = filled(dir.path(), small, 45);
            let len = s.blocks.get(11u64.to_be_bytes()).unwrap().unwrap().len();
            s.flush().unwrap();
            drop(s);
            let at = at.min(len - 1);
            flip_block(dir.path(), 10, 11, at);
            let (s, r) = Store::open_with(dir.path(), 0, small).unwrap();
            assert_eq!(r.next_seq, 46);
            // The events before and after it, exactly as stored; none of its own.
            let want: Vec<u64> = (1..=10).chain(21..=45).collect();
            assert_eq!(read_all(&s), want, "bit flipped at {at}");
            let d = s.damaged_blocks();
            assert_eq!(d.len(), 1, "{d:?}");
            assert_eq!((d[0].first, d[0].end, d[0].events()), (11, 21, 10));
            assert_eq!(d[0].what, "checksum", "bit flipped at {at}");
            // Counted once, however many reads meet it.
            assert_eq!(read_all(&s), want);
            let st = s.integrity_stats();
            assert_eq!((st.corrupt_blocks, st.corrupt_events), (1, 10));
            // A read from inside it starts after it; the cache-only read skips it too.
            assert_eq!(seqs(&s, 15)[0], 21);
            let mut out = Vec::new();
            let l = ReadLimit {
                events: 3,
                bytes: 1 << 20,
            };
            assert!(s.read_cached(12, l, &mut out).unwrap());
            assert_eq!(out.iter().map(Event::seq).collect::<Vec<_>>(), [21, 22, 23]);
            assert_eq!(s.first_seq().unwrap(), Some(1));
        }
    }

    /// Event `seq` with its row: a delete by `did:plc:a`, its JSON rendered from the row as
    /// ingest renders it.
    fn row_ev(seq: u64) -> (Event, riptide_segment::OwnedRow) {
        let rkey = format!("k{seq}");
        let row = Row {
            seq,
            witnessed_at: 1_000 + seq as i64,
            indexed_at: 0,
            kind: riptide_segment::Kind::Delete,
            did: "did:plc:a",
            collection: "a.b.c",
            rkey: &rkey,
            rev: "3l3qo2vutsw2b",
            payload: b"",
        };
        let mut proj = riptide_jetstream::Projector::new();
        let p = proj
            .project_row(&riptide_jetstream::StoredRow::from_row(&row))
            .unwrap();
        let mut json = Vec::new();
        p.render(0, row.witnessed_at, Some(seq), &mut json);
        let kind = EventKind::Commit;
        let e = Event::encode(
            seq,
            row.witnessed_at,
            kind,
            "did:plc:a",
            "a.b.c",
            &json,
            b"",
        );
        (e, row.to_owned_row())
    }

    #[test]
    fn progress_with_rows_lands_as_row_blocks() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open_with(dir.path(), 0, small(10, 8)).unwrap().0;
        let evs: Vec<_> = (1..=25).map(row_ev).collect();
        let events: Vec<Event> = evs.iter().map(|(e, _)| e.clone()).collect();
        let rows: Vec<Row<'_>> = evs.iter().map(|(_, r)| r.as_row()).collect();
        let progress = [("did:plc:a".into(), b"landed".to_vec())];
        s.append_with_progress(&events, Some(&rows), &[], &progress, &resume(26, 1_025, 25))
            .unwrap();
        let c = s.check().unwrap();
        assert!(c.blocks >= 2 && c.row_blocks == c.blocks, "{c:?}");
        assert_eq!(c.events + c.unsealed, 25, "{c:?}");
        assert_eq!(
            s.progress("did:plc:a").unwrap().as_deref(),
            Some(&b"landed"[..])
        );
        // Rows that do not pair with the events: refused whole, progress included.
        let more: Vec<_> = (26..=27).map(row_ev).collect();
        let events: Vec<Event> = more.iter().map(|(e, _)| e.clone()).collect();
        let one = [more[0].1.as_row()];
        let progress = [("did:plc:b".into(), b"x".to_vec())];
        assert!(matches!(
            s.append_with_progress(&events, Some(&one), &[], &progress, &resume(28, 1_027, 27)),
            Err(StoreError::Rows { .. })
        ));
        assert_eq!(s.progress("did:plc:b").unwrap(), None);
    }

    #[test]
    fn a_flipped_bit_in_a_row_block_is_found_and_skipped_like_any_block() {
        let small = small(10, 8);
        let evs: Vec<_> = (1..=45).map(row_ev).collect();
        // Blocks 1, 11, 21, 31, and 41..=45 unsealed. A bit flipped in block 11: in its count,
        // inside its frame, and in its checksum.
        for at in [3, 40, usize::MAX] {
            let dir = tempfile::tempdir().unwrap();
            let s = Store::open_with(dir.path(), 0, small).unwrap().0;
            for chunk in evs.chunks(5) {
                let events: Vec<Event> = chunk.iter().map(|(e, _)| e.clone()).collect();
                let rows: Vec<Row<'_>> = chunk.iter().map(|(_, r)| r.as_row()).collect();
                let last = events[events.len() - 1].seq();
                let r = resume(last + 1, 1_000 + last as i64, last);
                s.append_rows(&events, &rows, &[], &[], &r).unwrap();
            }
            let c = s.check().unwrap();
            let counts = (c.blocks, c.row_blocks, c.events, c.unsealed);
            assert_eq!(counts, (4, 4, 40, 5), "{c:?}");
            let len = s.blocks.get(11u64.to_be_bytes()).unwrap().unwrap().len();
            s.flush().unwrap();
            drop(s);
            flip_block(dir.path(), 10, 11, at.min(len - 1));
            let (s, _) = Store::open_with(dir.path(), 0, small).unwrap();
            // The sound row blocks and the unsealed rows read back as their events were
            // appended; none of the damaged block's.
            let out = read_every(&s, 1, 7);
            let want: Vec<u64> = (1..=10).chain(21..=45).collect();
            let got: Vec<u64> = out.iter().map(Event::seq).collect();
            assert_eq!(got, want, "bit flipped at {at}");
            for e in &out {
                assert_eq!(e.json(), evs[e.seq() as usize - 1].0.json());
            }
            let d = s.damaged_blocks();
            let first = (d.len(), d[0].first, d[0].end, d[0].what);
            assert_eq!(first, (1, 11, 21, "checksum"), "bit flipped at {at}");
        }
    }

    #[test]
    fn rows_seal_in_whole_blocks_of_4096_and_the_rest_waits_unsealed() {
        let evs: Vec<_> = (1..=8_300).map(row_ev).collect();
        let dir = tempfile::tempdir().unwrap();
        let append = |s: &Store, from: usize, to: usize| {
            let events: Vec<Event> = evs[from..to].iter().map(|(e, _)| e.clone()).collect();
            let rows: Vec<Row<'_>> = evs[from..to].iter().map(|(_, r)| r.as_row()).collect();
            let last = to as u64;
            let r = resume(last + 1, 1_000 + last as i64, last);
            s.append_rows(&events, &rows, &[], &[], &r).unwrap();
        };
        let json_of = |s: &Store| {
            let out = read_every(s, 1, 1000);
            out.iter().map(|e| (e.seq(), e.json())).collect::<Vec<_>>()
        };
        let want = |n: usize| {
            evs[..n]
                .iter()
                .map(|(e, _)| (e.seq(), e.json()))
                .collect::<Vec<_>>()
        };
        {
            let s = Store::open(dir.path(), 0).unwrap().0;
            append(&s, 0, 4_000);
            // 4,200 unsealed: one block of 4,096, 104 left.
            append(&s, 4_000, 4_200);
            let c = s.check().unwrap();
            let counts = (c.blocks, c.row_blocks, c.events, c.unsealed);
            assert_eq!(counts, (1, 1, 4_096, 104), "{c:?}");
            assert_eq!(json_of(&s), want(4_200));
        }
        // The 104 come back from `recent` and `recent_rows`, and seal as rows with the next.
        let (s, r) = Store::open(dir.path(), 0).unwrap();
        assert_eq!(r.next_seq, 4_201);
        assert_eq!(json_of(&s), want(4_200));
        append(&s, 4_200, 8_300);
        let c = s.check().unwrap();
        let counts = (c.blocks, c.row_blocks, c.events, c.unsealed);
        assert_eq!(counts, (2, 2, 8_192, 108), "{c:?}");
        assert_eq!(json_of(&s), want(8_300));
    }

    #[test]
    fn a_damaged_block_is_loaded_ahead_once_then_passed_over() {
        let dir = tempfile::tempdir().unwrap();
        let small = small(10, 8);
        let s = filled(dir.path(), small, 45);
        s.flush().unwrap();
        drop(s);
        flip_block(dir.path(), 10, 11, 30);
        let (s, _) = Store::open_with(dir.path(), 0, small).unwrap();
        let three = ReadLimit {
            events: 3,
            bytes: 1 << 20,
        };
        let mut out = Vec::new();
        s.read_from(1, three, &mut out).unwrap();
        // The load ahead of block 11 finds it damaged and records it.
        let ahead = s.claim_ahead(4, 1).unwrap();
        assert_eq!(ahead.0.seq, 11);
        ahead.load();
        assert_eq!(s.integrity_stats().corrupt_blocks, 1);
        // The next load ahead is of the block after it, not of it again.
        let ahead = s.claim_ahead(4, 1).unwrap();
        assert_eq!(ahead.0.seq, 21);
        ahead.load();
        assert_eq!(s.block_cache_stats().ahead, 1);
        out.clear();
        let l = ReadLimit {
            events: 100,
            bytes: 1 << 20,
        };
        s.read_from(4, l, &mut out).unwrap();
        let want: Vec<u64> = (4..=10).chain(21..=45).collect();
        assert_eq!(out.iter().map(Event::seq).collect::<Vec<_>>(), want);
        assert_eq!(s.integrity_stats().corrupt_blocks, 1);
    }

    #[test]
    fn a_damaged_first_or_last_block_is_skipped_and_the_store_opens() {
        let small = small(10, 8);
        for (first, count) in [(1u64, 10u32), (31, 15)] {
            let dir = tempfile::tempdir().unwrap();
            let s = filled(dir.path(), small, 45);
            // Two unsealed events after the blocks.
            s.append(&[ev_z(46), ev_z(47)], &resume(48, 1047, 47))
                .unwrap();
            s.flush().unwrap();
            drop(s);
            // The header's count: the last block's end cannot be read from it.
            flip_block(dir.path(), count, first, 4);
            let (s, r) = Store::open_with(dir.path(), 0, small).unwrap();
            assert_eq!(r.next_seq, 48);
            let lost = first..first + u64::from(count);
            let want: Vec<u64> = (1..=47).filter(|q| !lost.contains(q)).collect();
            assert_eq!(read_all(&s), want, "block {first} damaged");
            assert_eq!(s.integrity_stats().corrupt_events, u64::from(count));
            assert_eq!(
                s.first_seq().unwrap(),
                Some(if first == 1 { 11 } else { 1 })
            );
            // Ingest goes on after it.
            let evs: Vec<_> = (48..=60).map(ev_z).collect();
            s.append(&evs, &resume(61, 1060, 60)).unwrap();
            assert_eq!(read_all(&s).last(), Some(&60));
        }
    }

    #[test]
    fn a_block_from_before_checksums_still_reads() {
        let dir = tempfile::tempdir().unwrap();
        let small = small(10, 8);
        let s = filled(dir.path(), small, 25);
        // Block 11 as layout 3 sealed it: format 1, no checksum.
        let mut v = s.blocks.get(11u64.to_be_bytes()).unwrap().unwrap().to_vec();
        v.truncate(v.len() - BLOCK_CHECKSUM);
        v[0] = BLOCK_FORMAT_1;
        s.blocks.insert(11u64.to_be_bytes(), &v).unwrap();
        lock(&s.cache).clear();
        assert_eq!(read_all(&s), (1..=25).collect::<Vec<_>>());
        // What such a block cannot say (no checksum) is still caught where it breaks the format:
        // a value that is not an event is not served, nor is the rest of its block.
        let at = v.len() - 10;
        v[at] ^= 0xff;
        s.blocks.insert(11u64.to_be_bytes(), &v).unwrap();
        lock(&s.cache).clear();
        let got = read_all(&s);
        assert!(!got.iter().any(|q| (11..21).contains(q)), "{got:?}");
        assert_eq!(s.damaged_blocks().len(), 1);
    }

    #[test]
    fn acknowledged_events_cut_from_the_journal_are_said_counted_and_not_reused() {
        let dir = tempfile::tempdir().unwrap();
        let small = small(10, 8);
        {
            let (s, _) = Store::open_with(dir.path(), 0, small).unwrap();
            // Batches of 3: blocks are sealed at 12, 24 and 36; 37..=39 stay unsealed.
            for first in (1..=37).step_by(3) {
                let evs: Vec<_> = (first..first + 3).map(ev_z).collect();
                let next = first + 3;
                s.append(&evs, &resume(next, 1000 + next as i64 - 1, next - 1))
                    .unwrap();
            }
            assert_eq!(lock(&s.pending).events.len(), 3);
        }
        cut_journals(dir.path());
        let (s, r) = Store::open_with(dir.path(), 0, small).unwrap();
        let lost = s.lost_ranges().unwrap();
        assert_eq!(lost.len(), 1, "{lost:?}");
        let kept = lost[0].first;
        assert!(kept > 1 && kept < 40, "{lost:?}");
        // The unsealed events left were sealed before the gap.
        assert_eq!(s.sealed_end.load(Relaxed), kept);
        assert_eq!((lost[0].end, lost[0].why), (40, "journal"));
        assert_eq!(s.integrity_stats().journal_lost_events, 40 - kept);
        // No seq or time_us the last run gave out is given again.
        assert_eq!((r.next_seq, r.last_time_us), (40, 1039));
        // What is left reads, and ingest goes on above the gap.
        assert_eq!(read_all(&s), (1..kept).collect::<Vec<_>>());
        let evs: Vec<_> = (40..=55).map(ev_z).collect();
        s.append(&evs, &resume(56, 1055, 55)).unwrap();
        let want: Vec<u64> = (1..kept).chain(40..=55).collect();
        assert_eq!(read_all(&s), want);
        drop(s);
        // Said once: the next open finds the store where it was left, the range still recorded.
        let (s, r) = Store::open_with(dir.path(), 0, small).unwrap();
        assert_eq!(r.next_seq, 56);
        assert_eq!(s.integrity_stats().journal_lost_events, 0);
        assert_eq!(s.lost_ranges().unwrap(), lost);
        assert_eq!(read_all(&s), want);
    }

    #[test]
    fn check_lists_the_damage_and_repair_removes_it_for_good() {
        let dir = tempfile::tempdir().unwrap();
        let small = small(10, 8);
        {
            let s = filled(dir.path(), small, 45);
            s.append(&[ev_z(46), ev_z(47), ev_z(48)], &resume(49, 1048, 48))
                .unwrap();
            s.flush().unwrap();
            // An unsealed value that is not an event.
            s.recent
                .insert(47u64.to_be_bytes(), b"\x07garbage")
                .unwrap();
            s.ks.persist(PersistMode::SyncAll).unwrap();
        }
        flip_block(dir.path(), 10, 11, 30);
        let (s, r) = Store::open_with(dir.path(), 0, small).unwrap();
        assert_eq!(r.next_seq, 49);
        let c = s.check().unwrap();
        assert!(c.is_damaged());
        assert_eq!((c.blocks, c.checksummed, c.events), (4, 4, 35));
        assert_eq!(
            c.damaged,
            [DamagedBlock {
                first: 11,
                end: 21,
                what: "checksum"
            }]
        );
        assert_eq!((c.unsealed, &c.damaged_unsealed[..]), (2, &[47][..]));
        // Until repaired, reads skip both.
        let want: Vec<u64> = (1..=10).chain(21..=46).chain([48]).collect();
        assert_eq!(read_all(&s), want);
        let removed = s.repair().unwrap();
        assert_eq!(
            removed,
            [
                LostRange {
                    first: 11,
                    end: 21,
                    why: "corrupt block"
                },
                LostRange {
                    first: 47,
                    end: 48,
                    why: "corrupt event"
                }
            ]
        );
        drop(s);
        let (s, r) = Store::open_with(dir.path(), 0, small).unwrap();
        assert_eq!(r.next_seq, 49);
        let c = s.check().unwrap();
        assert!(!c.is_damaged(), "{c:?}");
        assert_eq!((c.blocks, c.events, c.unsealed), (3, 35, 2));
        assert_eq!(c.lost, removed);
        assert_eq!(read_all(&s), want);
        assert_eq!(s.integrity_stats(), IntegrityStats::default());
        // Ingest goes on: the unsealed events on either side of the gap are sealed apart.
        let evs: Vec<_> = (49..=60).map(ev_z).collect();
        s.append(&evs, &resume(61, 1060, 60)).unwrap();
        assert_eq!(s.recent.len().unwrap(), 0);
        let want: Vec<u64> = want.into_iter().chain(49..=60).collect();
        assert_eq!(read_all(&s), want);
        drop(s);
        let (s, _) = Store::open_with(dir.path(), 0, small).unwrap();
        assert_eq!(read_all(&s), want);
        assert!(!s.check().unwrap().is_damaged());
    }

    #[test]
    fn a_layout_3_directory_is_read_and_recorded_as_4() {
        let dir = tempfile::tempdir().unwrap();
        {
            let s = filled(dir.path(), small(10, 8), 15);
            s.meta.insert(LAYOUT, 3u64.to_be_bytes()).unwrap();
            s.ks.persist(PersistMode::SyncAll).unwrap();
        }
        let (s, _) = Store::open_with(dir.path(), 0, small(10, 8)).unwrap();
        assert_eq!(be64(&s.meta.get(LAYOUT).unwrap().unwrap()), LAYOUT_VERSION);
        drop(s);
        {
            let (ks, meta, _, _lock) = Store::open_dir(dir.path()).unwrap();
            meta.insert(LAYOUT, 9u64.to_be_bytes()).unwrap();
            ks.persist(PersistMode::SyncAll).unwrap();
        }
        match Store::open(dir.path(), 0) {
            Err(StoreError::NewerLayout { found: 9, .. }) => {}
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_layout_2_directory_is_refused_then_migrated() {
        let dir = tempfile::tempdir().unwrap();
        let evs: Vec<_> = (1..=5000).map(ev_z).collect();
        {
            // What layout 2 wrote: one `events` value per event (both forms), FIFO logs.
            let ks = Config::new(dir.path()).open().unwrap();
            let meta = ks
                .open_partition("meta", PartitionCreateOptions::default())
                .unwrap();
            meta.insert(LAYOUT, 2u64.to_be_bytes()).unwrap();
            meta.insert(NEXT_SEQ, 5001u64.to_be_bytes()).unwrap();
            meta.insert(LAST_TIME, 6000u64.to_be_bytes()).unwrap();
            meta.insert(UPSTREAM, 5000u64.to_be_bytes()).unwrap();
            let events = ks.open_partition("events", log_partition()).unwrap();
            let times = ks.open_partition("times", log_partition()).unwrap();
            for e in &evs {
                events
                    .insert(e.seq().to_be_bytes(), e.raw().clone())
                    .unwrap();
                times
                    .insert((e.time_us() as u64).to_be_bytes(), e.seq().to_be_bytes())
                    .unwrap();
            }
            ks.persist(PersistMode::SyncAll).unwrap();
        }
        match Store::open(dir.path(), 0) {
            Err(e @ StoreError::OldLayout { found: 2, .. }) => {
                assert!(e.to_string().contains("--migrate-store"), "{e}");
            }
            other => panic!("{other:?}"),
        }
        let m = Store::migrate(dir.path()).unwrap();
        assert_eq!(
            m,
            Migrated {
                from: 2,
                events: 5000,
                blocks: 2
            }
        );
        {
            let (s, r) = Store::open(dir.path(), 0).unwrap();
            assert_eq!(r, resume(5001, 6000, 5000));
            assert!(!s.ks.partition_exists("events"));
            check_reads_sample(&s, &evs);
            assert_eq!(s.seq_at_time(1100).unwrap(), Some(100));
        }
        // Once is enough: a second run finds the new layout and writes nothing.
        assert_eq!(Store::migrate(dir.path()).unwrap().events, 0);
    }

    fn check_reads_sample(s: &Store, evs: &[Event]) {
        let out = read_every(s, 0, 512);
        assert_eq!(out.len(), evs.len());
        for (a, b) in out.iter().zip(evs) {
            assert_eq!((a.seq(), a.json()), (b.seq(), b.json()));
        }
    }
}
