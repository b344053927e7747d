//! The event store: fjall partitions under `--data DIR`.
//!
//! Partitions: `events` (seq, big-endian u64 → [`Event`] value), `times` (time_us, big-endian →
//! seq) and `meta` (next seq, last time_us, upstream cursor, dictionary id).
//!
//! **Durability point.** [`Store::append`] writes a whole ingest batch — its events, their time
//! index entries, the next seq, the last time_us and the upstream cursor that covers them — as
//! ONE fjall batch committed with `PersistMode::SyncAll` (journal written and fsynced) before it
//! returns. Events are published to subscribers only after that. So after `kill -9` (or power
//! loss, given honest disks) the store holds exactly the batches whose `append` returned: every
//! event a subscriber could have seen survives; the upstream cursor matches the events, so
//! resuming from it neither loses nor duplicates a frame; and the next seq / time_us restart
//! above everything stored, so no seq or time_us is reused.
//!
//! Retention: [`Store::prune`] deletes events older than the window (time index first, so a
//! timestamp cursor never resolves to a deleted seq) in batches; fjall's compaction then drops the
//! tombstoned data. Deletes need no fsync: a delete lost in a crash is simply redone.

use std::path::Path;

use bytes::Bytes;
use fjall::{Config, Keyspace, PartitionCreateOptions, PartitionHandle, PersistMode};

use crate::event::{CorruptEvent, Event};
use crate::log::ReadLimit;

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
    /// A stored value is corrupt.
    #[error(transparent)]
    Corrupt(#[from] CorruptEvent),
    /// The data directory was written with another zstd dictionary.
    #[error("the data directory holds events compressed with zstd dictionary {stored}, but the server was started with {given} (0 = none); use the same --zstd-dictionary or a new --data directory")]
    DictionaryMismatch {
        /// The id in the store.
        stored: u32,
        /// The id given.
        given: u32,
    },
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
    meta: PartitionHandle,
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
        // Durability is chosen per batch (`append`); no background fsync timer is needed.
        let ks = Config::new(dir).open().map_err(fj)?;
        let events = ks
            .open_partition("events", PartitionCreateOptions::default())
            .map_err(fj)?;
        let times = ks
            .open_partition("times", PartitionCreateOptions::default())
            .map_err(fj)?;
        let meta = ks
            .open_partition("meta", PartitionCreateOptions::default())
            .map_err(fj)?;
        let store = Store {
            path,
            ks,
            events,
            times,
            meta,
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
        let mut b = self.ks.batch().durability(Some(PersistMode::SyncAll));
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
        b.commit().map_err(|e| self.err(e))
    }

    /// Events with seq ≥ `from` within `limit`, in order (fewer, or none, at the end of the
    /// store). Each value returned is a copy out of the store's blocks: the byte cap bounds the
    /// memory a read costs.
    pub fn read_from(
        &self,
        from: u64,
        limit: ReadLimit,
        out: &mut Vec<Event>,
    ) -> Result<(), StoreError> {
        let (start, mut bytes) = (out.len(), 0);
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

    /// The seq of the first event with `time_us` ≥ `t`, if any.
    pub fn seq_at_time(&self, t: i64) -> Result<Option<u64>, StoreError> {
        let from = (t.max(0) as u64).to_be_bytes();
        match self.times.range(from..).next() {
            Some(kv) => Ok(Some(be64(&kv.map_err(|e| self.err(e))?.1))),
            None => Ok(None),
        }
    }

    /// The oldest retained event's seq, if any.
    pub fn first_seq(&self) -> Result<Option<u64>, StoreError> {
        Ok(self
            .events
            .first_key_value()
            .map_err(|e| self.err(e))?
            .map(|(k, _)| be64(&k)))
    }

    /// Deletes every event with `time_us` < `cutoff_us`; returns how many.
    pub fn prune(&self, cutoff_us: i64) -> Result<u64, StoreError> {
        let mut deleted = 0u64;
        loop {
            let mut b = self.ks.batch();
            let mut n = 0;
            for kv in self
                .times
                .range(..(cutoff_us.max(0) as u64).to_be_bytes())
                .take(4096)
            {
                let (t, seq) = kv.map_err(|e| self.err(e))?;
                b.remove(&self.times, t);
                b.remove(&self.events, seq);
                n += 1;
            }
            if n == 0 {
                return Ok(deleted);
            }
            b.commit().map_err(|e| self.err(e))?;
            deleted += n;
        }
    }

    /// Every stored event's JSON, oldest first, up to `max_bytes` in total (dictionary training).
    pub fn sample_json(&self, max_bytes: usize) -> Result<Vec<Bytes>, StoreError> {
        let mut out = Vec::new();
        let mut total = 0;
        for kv in self.events.iter() {
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

    #[test]
    fn append_reopen_prune() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (s, r) = Store::open(dir.path(), 0).unwrap();
            assert_eq!(
                r,
                Resume {
                    next_seq: 1,
                    last_time_us: 0,
                    upstream_cursor: None
                }
            );
            let evs: Vec<_> = (1..=10).map(|i| ev(i, 1000 + i as i64)).collect();
            s.append(
                &evs,
                &Resume {
                    next_seq: 11,
                    last_time_us: 1010,
                    upstream_cursor: Some(77),
                },
            )
            .unwrap();
        }
        let (s, r) = Store::open(dir.path(), 0).unwrap();
        assert_eq!(
            r,
            Resume {
                next_seq: 11,
                last_time_us: 1010,
                upstream_cursor: Some(77)
            }
        );
        let mut out = Vec::new();
        s.read_from(
            4,
            ReadLimit {
                events: 3,
                bytes: 1 << 20,
            },
            &mut out,
        )
        .unwrap();
        assert_eq!(out.iter().map(Event::seq).collect::<Vec<_>>(), [4, 5, 6]);
        assert_eq!(s.seq_at_time(1005).unwrap(), Some(5));
        assert_eq!(s.seq_at_time(2000).unwrap(), None);
        assert_eq!(s.prune(1004).unwrap(), 3);
        assert_eq!(s.first_seq().unwrap(), Some(4));
        assert_eq!(s.seq_at_time(0).unwrap(), Some(4));
        drop(s);
        assert!(matches!(
            Store::open(dir.path(), 5),
            Err(StoreError::DictionaryMismatch {
                stored: 0,
                given: 5
            })
        ));
    }
}
