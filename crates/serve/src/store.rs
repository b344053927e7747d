//! The event store: fjall partitions under `--data DIR`.
//!
//! Partitions: `events` (seq, big-endian u64 → [`Event`] value), `times` (time_us, big-endian →
//! seq), `accounts` (DID → the account's chain state, `riptide_firehose::chain::encode_state`)
//! and `meta` (next seq, last time_us, upstream cursor, dictionary id, retention floor, layout
//! version). `accounts` is an ordinary LSM tree (leveled compaction, bloom filters): it is
//! rewritten in place and read by point lookups, one per account the verifiers do not hold in
//! memory. A data directory from before chain state simply has no `accounts` yet: each account's
//! first commit after the upgrade establishes its state. `pending` (`did 0x00 seq` → frame) holds
//! what `crate::resync` needs to survive a crash: the accounts queued for resync (seq 0, empty)
//! and the frames held for them until their resync lands; it is small (bounded by the resync
//! buffers) and written in the same batches as everything else.
//!
//! **Why FIFO compaction.** `events` and `times` are append-only logs under monotonic keys: no
//! key is ever written twice, so an LSM tree's merging has nothing to merge. Leveled compaction
//! (fjall's default) still rewrote every byte on its way down the levels: its compactor took
//! 9–12% of the server's CPU once ingest reached steady state. With FIFO the flushed segments stay
//! as they are (their key ranges are disjoint, so a range read opens only the segments it needs)
//! and retention drops whole segment files. Nothing reads these partitions by point lookup, so
//! they have no bloom filters either.
//!
//! **Durability point.** [`Store::append_with_accounts`] writes a whole ingest batch — its
//! events, their time index entries, the chain state of every account the batch's frames changed,
//! the next seq, the last time_us and the upstream cursor that covers them — as ONE fjall batch committed with `PersistMode::SyncAll` (journal written and fsynced) before it
//! returns. Events are published to subscribers only after that. So after `kill -9` (or power
//! loss, given honest disks) the store holds exactly the batches whose `append` returned: every
//! event a subscriber could have seen survives; the upstream cursor matches the events and the
//! account states, so resuming from it neither loses nor duplicates a frame, and re-verifies the
//! frames after it against exactly the state they were first verified against; and the next seq / time_us restart
//! above everything stored, so no seq or time_us is reused.
//!
//! **Retention** has two halves. [`Store::expire`] moves the *floor*: the first seq whose
//! `time_us` is inside the window. Reads never go below it, so retention is exact to the event
//! whatever the segment boundaries. Then it drops every segment file created longer ago than the
//! window (fjall's FIFO time-to-live, run with the window given now, so a restart with another
//! `--retention` takes effect): every event in such a file was written before the file, so it is
//! below the floor already. Disk space thus comes back one segment (a flushed memtable, 64 MiB of
//! events) at a time, a little after the window has passed. The floor is stored without fsync: a
//! floor lost in a crash is recomputed by the next pass. No tombstones are written, so the
//! segments stay disjoint and nothing is ever merged.
//!
//! **The cost of never merging**: one segment file per flushed `events` memtable, so their
//! number grows with the window. fjall 2 checks a level's files for overlap pairwise (lsm-tree's
//! `KeyRange::is_disjoint`) whenever the level changes and at start, so both grow with the square
//! of the count: measured on the development VM, a flush took ~14 ms longer with 3,000 files and
//! reopening 4,000 took 7 s; each file also holds ~2.4 KB of memory. Hence 64 MiB memtables
//! (fjall's default is 16 MiB): a day of today's network (~1,500 events/s of ~2 KB) is ~4,000
//! files, not 16,000 (`bench/results/2026-11-22-vm/serve-5.md`). A much longer window or a much
//! faster network would need segments merged once (not yet done).
//!
//! A data directory written by the previous layout (leveled partitions, deletes by tombstone) is
//! refused with [`StoreError::OldLayout`] rather than served with a retention that would leak.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use fjall::compaction::{Fifo, Strategy};
use fjall::{AbstractTree, Config, Keyspace, PartitionCreateOptions, PartitionHandle, PersistMode};

use riptide_firehose::chain::{decode_state, encode_state, AccountState, CorruptState};

use crate::event::{CorruptEvent, Event};
use crate::log::ReadLimit;

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
    /// The data directory was written with another zstd dictionary.
    #[error("the data directory holds events compressed with zstd dictionary {stored}, but the server was started with {given} (0 = none); use the same --zstd-dictionary or a new --data directory")]
    DictionaryMismatch {
        /// The id in the store.
        stored: u32,
        /// The id given.
        given: u32,
    },
    /// The data directory was written by an older riptide whose store layout this one does not
    /// read.
    #[error("the data directory {path} was written by an older riptide (store layout {found}, this one writes {LAYOUT_VERSION}); start with a new --data directory")]
    OldLayout {
        /// The data directory.
        path: String,
        /// The layout found (1 = before layouts were recorded).
        found: u64,
    },
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

/// The event store. Cheap to share (`Arc`); all methods take `&self`.
#[derive(Clone)]
pub struct Store {
    path: String,
    ks: Keyspace,
    events: PartitionHandle,
    times: PartitionHandle,
    accounts: PartitionHandle,
    /// Accounts awaiting resync and the frames held for them (`crate::resync`).
    pending: PartitionHandle,
    meta: PartitionHandle,
    /// The retention floor: no read returns a seq below it.
    floor: Arc<AtomicU64>,
}

impl std::fmt::Debug for Store {
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

/// The store layout this code writes: 2 = FIFO log partitions with a retention floor.
pub const LAYOUT_VERSION: u64 = 2;

/// Memtable size of `events`, hence the size of its segment files (see the module docs on the
/// cost of never merging). The memory is mostly not extra: the memtable holds the same
/// reference-counted event buffers as the in-memory tail (64 MB by default).
const EVENTS_MEMTABLE: u32 = 64 << 20;

/// Options of the two log partitions (`events`, `times`); see the module docs.
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

impl Store {
    fn err(&self, source: fjall::Error) -> StoreError {
        StoreError::Fjall {
            path: self.path.clone(),
            source,
        }
    }

    /// Opens (or creates) the store under `dir`. `dict_id` is the zstd dictionary id events are
    /// compressed with (0 = none); a store written with another is refused.
    pub fn open(dir: &Path, dict_id: u32) -> Result<(Store, Resume), StoreError> {
        Store::open_inner(dir, Some(dict_id))
    }

    /// Opens an existing store whatever its dictionary (for reading: `riptide dict train`).
    pub fn open_any(dir: &Path) -> Result<(Store, Resume), StoreError> {
        Store::open_inner(dir, None)
    }

    fn open_inner(dir: &Path, dict_id: Option<u32>) -> Result<(Store, Resume), StoreError> {
        let path = dir.display().to_string();
        let fj = |source| StoreError::Fjall {
            path: path.clone(),
            source,
        };
        // Durability is chosen per batch (`append`); no background fsync timer is needed. The
        // write buffer has room for an `events` memtable filling while the last one flushes
        // (fjall flushes the largest memtables once the buffer is half full).
        let ks = Config::new(dir)
            .max_write_buffer_size(3 * u64::from(EVENTS_MEMTABLE))
            .max_open_files(STORE_MAX_OPEN_FILES)
            .open()
            .map_err(fj)?;
        let existed = ks.partition_exists("events");
        let meta = ks
            .open_partition("meta", PartitionCreateOptions::default())
            .map_err(fj)?;
        // A partition keeps the options it was created with: an old directory would stay leveled.
        let layout = meta.get(LAYOUT).map_err(fj)?.map_or(1, |v| be64(&v));
        if existed && layout != LAYOUT_VERSION {
            return Err(StoreError::OldLayout {
                path,
                found: layout,
            });
        }
        if !existed {
            // Before the partitions exist: a crash in between leaves a directory that opens.
            meta.insert(LAYOUT, LAYOUT_VERSION.to_be_bytes())
                .map_err(fj)?;
            ks.persist(PersistMode::SyncAll).map_err(fj)?;
        }
        let events = ks
            .open_partition("events", log_partition().max_memtable_size(EVENTS_MEMTABLE))
            .map_err(fj)?;
        let times = ks.open_partition("times", log_partition()).map_err(fj)?;
        let accounts = ks
            .open_partition("accounts", PartitionCreateOptions::default())
            .map_err(fj)?;
        let pending = ks
            .open_partition("pending", PartitionCreateOptions::default())
            .map_err(fj)?;
        let floor = meta.get(FLOOR).map_err(fj)?.map_or(0, |v| be64(&v));
        let store = Store {
            path,
            ks,
            events,
            times,
            accounts,
            pending,
            meta,
            floor: Arc::new(AtomicU64::new(floor)),
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
        // Belt and braces: never restart below an event that is on disk.
        if let Some((k, v)) = store.events.last_key_value().map_err(|e| store.err(e))? {
            let seq = be64(&k);
            let e = Event::decode(seq, Bytes::from(v))?;
            resume.next_seq = resume.next_seq.max(seq + 1);
            resume.last_time_us = resume.last_time_us.max(e.time_us());
        }
        Ok((store, resume))
    }

    /// Writes one ingest batch atomically and durably (see the module docs). `events` are in seq
    /// order; `resume` is the state after them.
    pub fn append(&self, events: &[Event], resume: &Resume) -> Result<(), StoreError> {
        self.append_with_accounts(events, &[], resume)
    }

    /// [`Store::append_with_accounts`], with changes to the resync partition (`pending`) in the
    /// same atomic, durable write: accounts queued for resync, the frames held for them, and
    /// those released or dropped.
    pub fn append_with_pending(
        &self,
        events: &[Event],
        accounts: &[(Box<str>, AccountState)],
        pending: &[PendingChange],
        resume: &Resume,
    ) -> Result<(), StoreError> {
        let mut b = self.ks.batch().durability(Some(PersistMode::SyncAll));
        for p in pending {
            match p {
                PendingChange::Hold { did, seq, frame } => {
                    b.insert(&self.pending, pending_key(did, *seq), frame.clone())
                }
                PendingChange::Release { did, seq } => {
                    b.remove(&self.pending, pending_key(did, *seq))
                }
            }
        }
        self.fill_batch(&mut b, events, accounts, resume);
        b.commit().map_err(|e| self.err(e))
    }

    /// Everything in the resync partition, in DID order and, per DID, upstream order: `(did,
    /// seq, frame)`, where seq 0 with an empty frame is the mark of an account queued for resync.
    pub fn pending(&self) -> Result<Vec<(String, u64, Bytes)>, StoreError> {
        let mut out = Vec::new();
        for kv in self.pending.iter() {
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

    /// [`Store::append`], with the chain state of the accounts the batch's frames changed, in
    /// the same atomic, durable write (at most one state per DID: the last).
    pub fn append_with_accounts(
        &self,
        events: &[Event],
        accounts: &[(Box<str>, AccountState)],
        resume: &Resume,
    ) -> Result<(), StoreError> {
        let mut b = self.ks.batch().durability(Some(PersistMode::SyncAll));
        self.fill_batch(&mut b, events, accounts, resume);
        b.commit().map_err(|e| self.err(e))
    }

    fn fill_batch(
        &self,
        b: &mut fjall::Batch,
        events: &[Event],
        accounts: &[(Box<str>, AccountState)],
        resume: &Resume,
    ) {
        let mut buf = Vec::with_capacity(96);
        for (did, state) in accounts {
            buf.clear();
            encode_state(state, &mut buf);
            b.insert(&self.accounts, did.as_bytes(), buf.as_slice());
        }
        for e in events {
            b.insert(&self.events, e.seq().to_be_bytes(), e.raw().clone());
            b.insert(
                &self.times,
                (e.time_us() as u64).to_be_bytes(),
                e.seq().to_be_bytes(),
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

    /// Writes raw bytes as an account's state (tests of corruption handling).
    #[cfg(test)]
    pub(crate) fn put_raw_account_for_tests(&self, did: &str, value: &[u8]) {
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

    /// Events with seq ≥ `from` (and ≥ the floor) within `limit`, in order (fewer, or none, at
    /// the end of the store). Each value returned is a copy out of the store's blocks: the byte
    /// cap bounds the memory a read costs.
    pub fn read_from(
        &self,
        from: u64,
        limit: ReadLimit,
        out: &mut Vec<Event>,
    ) -> Result<(), StoreError> {
        let (start, mut bytes) = (out.len(), 0);
        let from = from.max(self.floor());
        for kv in self.events.range(from.to_be_bytes()..) {
            if limit.full(out, start, bytes) {
                break;
            }
            let (k, v) = kv.map_err(|e| self.err(e))?;
            bytes += v.len();
            out.push(Event::decode(be64(&k), Bytes::from(v))?);
        }
        Ok(())
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
        match self.events.range(self.floor().to_be_bytes()..).next() {
            Some(kv) => Ok(Some(be64(&kv.map_err(|e| self.err(e))?.0))),
            None => Ok(None),
        }
    }

    /// One retention pass: raises the floor to the first event with `time_us` ≥ `cutoff_us`
    /// (past every stored event if there is none), then drops the log's segment files created
    /// more than `window` ago. See the module docs.
    pub fn expire(&self, cutoff_us: i64, window: Duration) -> Result<Expired, StoreError> {
        let old = self.floor();
        let next = match self.time_index(cutoff_us)? {
            Some(seq) => seq,
            None => match self.events.last_key_value().map_err(|e| self.err(e))? {
                Some((k, _)) => be64(&k) + 1,
                None => old,
            },
        };
        let floor = next.max(old);
        if floor > old {
            self.meta
                .insert(FLOOR, floor.to_be_bytes())
                .map_err(|e| self.err(e))?;
            self.floor.store(floor, Relaxed);
        }
        // FIFO's time-to-live counts whole seconds and is off at 0: round up, at least 1 s.
        let ttl = window.as_secs() + u64::from(window.subsec_nanos() > 0);
        let drop_old = Arc::new(Fifo::new(u64::MAX, Some(ttl.max(1))));
        for p in [&self.events, &self.times] {
            // Threshold 0: the strategy only drops whole files; should it merge (segments that
            // overlap, which this layout never makes) it keeps every version.
            p.tree
                .compact(drop_old.clone(), 0)
                .map_err(|e| self.err(e.into()))?;
        }
        Ok(Expired {
            // Seqs are consecutive, so the floor's rise is the number of events it passed.
            events: floor.saturating_sub(old.max(1)),
            floor,
        })
    }

    /// The store's size on disk: bytes of segment files and journals, and the log's segments.
    pub fn disk_usage(&self) -> DiskUsage {
        DiskUsage {
            bytes: self.ks.disk_space(),
            segments: self.events.segment_count() + self.times.segment_count(),
        }
    }

    /// Every stored event's JSON, oldest first, up to `max_bytes` in total (dictionary training).
    pub fn sample_json(&self, max_bytes: usize) -> Result<Vec<Bytes>, StoreError> {
        let mut out = Vec::new();
        let mut total = 0;
        for kv in self.events.range(self.floor().to_be_bytes()..) {
            let (k, v) = kv.map_err(|e| self.err(e))?;
            let e = Event::decode(be64(&k), Bytes::from(v))?;
            total += e.json_len();
            if total > max_bytes {
                break;
            }
            out.push(e.json());
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use riptide_jetstream::EventKind;

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
        let (s, _) = Store::open(dir.path(), 0).unwrap();
        let evs: Vec<_> = (1..=100).map(|i| ev(i, 1000 + i as i64)).collect();
        s.append(&evs, &resume(101, 1100, 100)).unwrap();
        s.events.rotate_memtable_and_wait().unwrap();
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
}
