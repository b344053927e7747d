//! The shared event log every subscriber reads at its own cursor: the store, fronted by an
//! in-memory tail of the most recent events.
//!
//! Why no per-subscriber queue: a queue per connection must either grow without bound or drop
//! events when a client is slow. Here a subscriber is only a cursor (`next seq`); it copies
//! reference-counted [`Event`]s out of the tail, and when it has fallen behind the tail (or is
//! replaying old history) it reads the same events from the store. Replay and live are one loop,
//! so nothing is lost or reordered at the seam.
//!
//! Events enter the tail with their `subscribeEvents` frame made ([`Event::with_v2_frame`]):
//! made once per event rather than once per v2 subscriber, it lets v2 replay and fan-out from
//! memory send shared bytes as v1 does. It costs ~0.2 µs of ingest per event and, on the
//! capture, ~700 bytes beside the ~900 of the stored value; the tail's byte bound counts both.
//!
//! Only durable events enter the tail ([`Log::publish`] is called after [`Store::append`]
//! returns), so a subscriber never sees an event a crash could take back.

use std::collections::VecDeque;
use std::sync::RwLock;

use tokio::sync::watch;

use crate::event::Event;
use crate::store::{Store, StoreError};

/// The tail's bounds (whichever is reached first evicts the oldest events).
#[derive(Clone, Copy, Debug)]
pub struct TailLimits {
    /// Most events kept in memory.
    pub max_events: usize,
    /// Most bytes kept in memory (stored values and their `subscribeEvents` frames).
    pub max_bytes: usize,
}

impl Default for TailLimits {
    fn default() -> Self {
        TailLimits {
            max_events: 65_536,
            // The capture's events take ~1.6 KB each with their v2 frames: room for the 65,536.
            max_bytes: 104 << 20,
        }
    }
}

/// How much one subscriber read may return: at most `events` events and, past the first event,
/// at most `bytes` bytes of stored values. The byte cap is what keeps a subscriber's memory
/// constant: a read from the store copies every value it returns, and a subscriber holds its
/// batch until the socket has taken it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadLimit {
    /// Most events.
    pub events: usize,
    /// Most bytes of stored values (JSON + zstd); a single larger event is still returned.
    pub bytes: usize,
}

impl Default for ReadLimit {
    /// 256 events or 16 KiB: a replay read fills about two WebSocket write buffers. A subscriber
    /// that has fallen out of the tail is the only holder of its batch, so this is most of what
    /// a lagging subscriber costs (at 64 KiB, 1,000 lagging subscribers took 100+ MB).
    fn default() -> Self {
        ReadLimit {
            events: 256,
            bytes: 16 << 10,
        }
    }
}

impl ReadLimit {
    /// Whether `out` (which had `start` entries before this read) is full.
    pub(crate) fn full(&self, out: &[Event], start: usize, bytes: usize) -> bool {
        let n = out.len() - start;
        n >= self.events.max(1) || (n > 0 && bytes >= self.bytes)
    }
}

#[derive(Debug, Default)]
struct Tail {
    events: VecDeque<Event>,
    bytes: usize,
}

/// The log. Share it in an `Arc`.
#[derive(Debug)]
pub struct Log {
    store: Store,
    tail: RwLock<Tail>,
    limits: TailLimits,
    /// The next seq to be published (one past the newest event).
    next: watch::Sender<u64>,
}

/// Where a read was served from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadFrom {
    /// The in-memory tail.
    Tail,
    /// The store.
    Store,
    /// Nothing to read yet: the cursor is at the tip.
    Tip,
}

impl Log {
    /// A log over `store`, whose next seq is `next_seq`.
    pub fn new(store: Store, next_seq: u64, limits: TailLimits) -> Log {
        Log {
            store,
            tail: RwLock::new(Tail::default()),
            limits,
            next: watch::Sender::new(next_seq),
        }
    }

    /// The store behind the log.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The next seq to be published: a live subscriber starts here.
    pub fn next_seq(&self) -> u64 {
        *self.next.borrow()
    }

    /// Watches [`Log::next_seq`].
    pub fn watch(&self) -> watch::Receiver<u64> {
        self.next.subscribe()
    }

    /// Appends durable events (consecutive seqs, continuing [`Log::next_seq`]) and wakes readers.
    pub fn publish(&self, events: &[Event]) {
        let Some(last) = events.last() else { return };
        // Each event's `subscribeEvents` frame, made once here (outside the lock) rather than
        // once per v2 subscriber and send (`v2.rs`).
        let events: Vec<Event> = events.iter().map(Event::with_v2_frame).collect();
        {
            let mut t = self.tail.write().unwrap_or_else(|p| p.into_inner());
            for e in events {
                t.bytes += e.memory_len();
                t.events.push_back(e);
            }
            while t.events.len() > self.limits.max_events || t.bytes > self.limits.max_bytes {
                match t.events.pop_front() {
                    Some(e) => t.bytes -= e.memory_len(),
                    None => break,
                }
            }
        }
        self.next.send_replace(last.seq() + 1);
    }

    /// Events in memory and their bytes.
    pub fn tail_size(&self) -> (usize, usize) {
        let t = self.tail.read().unwrap_or_else(|p| p.into_inner());
        (t.events.len(), t.bytes)
    }

    /// Events with seq ≥ `from` (and ≥ the store's retention floor) into `out`, within `limit`:
    /// from the tail when it still holds `from`, otherwise from the store (blocking I/O: call
    /// from a blocking context, or check [`Log::in_tail`] first).
    pub fn read(
        &self,
        from: u64,
        limit: ReadLimit,
        out: &mut Vec<Event>,
    ) -> Result<ReadFrom, StoreError> {
        // Nothing below the retention floor is served, from memory either.
        let from = from.max(self.store.floor());
        if from >= self.next_seq() {
            return Ok(ReadFrom::Tip);
        }
        if self.read_tail(from, limit, out) {
            return Ok(ReadFrom::Tail);
        }
        self.store.read_from(from, limit, out)?;
        Ok(ReadFrom::Store)
    }

    /// [`Log::read`] without I/O (for async tasks): `None` when it would have to load a block
    /// of the store ([`Store::read_cached`]).
    pub fn read_cached(
        &self,
        from: u64,
        limit: ReadLimit,
        out: &mut Vec<Event>,
    ) -> Result<Option<ReadFrom>, StoreError> {
        let from = from.max(self.store.floor());
        if from >= self.next_seq() {
            return Ok(Some(ReadFrom::Tip));
        }
        if self.read_tail(from, limit, out) {
            return Ok(Some(ReadFrom::Tail));
        }
        Ok(self
            .store
            .read_cached(from, limit, out)?
            .then_some(ReadFrom::Store))
    }

    /// Whether `from` is in the tail (a read will not touch the disk).
    pub fn in_tail(&self, from: u64) -> bool {
        let t = self.tail.read().unwrap_or_else(|p| p.into_inner());
        t.events.front().is_some_and(|e| e.seq() <= from)
    }

    fn read_tail(&self, from: u64, limit: ReadLimit, out: &mut Vec<Event>) -> bool {
        let t = self.tail.read().unwrap_or_else(|p| p.into_inner());
        let Some(first) = t.events.front().map(Event::seq) else {
            return false;
        };
        if from < first {
            return false;
        }
        let skip = (from - first) as usize;
        let (start, mut bytes) = (out.len(), 0);
        for e in t.events.range(skip.min(t.events.len())..) {
            if limit.full(out, start, bytes) {
                break;
            }
            bytes += e.raw().len();
            out.push(e.clone());
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use riptide_jetstream::EventKind;

    #[test]
    fn tail_then_store() {
        let dir = tempfile::tempdir().unwrap();
        let (s, r) = Store::open(dir.path(), 0).unwrap();
        let log = Log::new(
            s.clone(),
            r.next_seq,
            TailLimits {
                max_events: 4,
                max_bytes: 1 << 20,
            },
        );
        let evs: Vec<_> = (1..=10)
            .map(|i| {
                Event::encode(
                    i,
                    i as i64,
                    EventKind::Commit,
                    "did:plc:a",
                    "a.b.c",
                    b"{}",
                    b"",
                )
            })
            .collect();
        s.append(
            &evs,
            &Resume {
                next_seq: 11,
                last_time_us: 10,
                upstream_cursor: None,
            },
        )
        .unwrap();
        log.publish(&evs);
        let mut out = Vec::new();
        let n = |events| ReadLimit {
            events,
            bytes: 1 << 20,
        };
        assert_eq!(log.read(11, n(5), &mut out).unwrap(), ReadFrom::Tip);
        assert_eq!(log.read(8, n(5), &mut out).unwrap(), ReadFrom::Tail);
        assert_eq!(out.iter().map(Event::seq).collect::<Vec<_>>(), [8, 9, 10]);
        out.clear();
        assert_eq!(log.read(2, n(3), &mut out).unwrap(), ReadFrom::Store);
        assert_eq!(out.iter().map(Event::seq).collect::<Vec<_>>(), [2, 3, 4]);
        assert_eq!(log.tail_size().0, 4);
        // The byte cap: every event is the same size; two and a half of them fit two, and a cap
        // below one event still returns one (from the tail and from the store alike).
        let size = evs[0].raw().len();
        for from in [2, 8] {
            for (bytes, want) in [(size * 5 / 2, 3), (1, 1), (0, 1)] {
                out.clear();
                log.read(from, ReadLimit { events: 100, bytes }, &mut out)
                    .unwrap();
                assert_eq!(out.len(), want, "from {from}, cap {bytes}");
            }
        }
        // Retention: past the floor nothing is served, from the store or from the tail.
        s.expire(9, std::time::Duration::from_secs(3600)).unwrap();
        for from in [1, 7] {
            out.clear();
            log.read(from, n(5), &mut out).unwrap();
            assert_eq!(out.iter().map(Event::seq).collect::<Vec<_>>(), [9, 10]);
        }
    }
    use crate::store::Resume;
}
