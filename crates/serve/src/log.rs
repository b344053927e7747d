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
//! Events enter the tail *without* their v1 zstd form unless a `compress=true` subscriber wants
//! it ([`ZstdDemand`]): compressing each event with the dictionary cost ~2.8 CPU-µs at ingest,
//! 5% of an event's whole pipeline, for subscribers that are often not there. While one is
//! connected (and for [`ZSTD_GRACE`] after the last leaves, so that a reconnecting crowd finds
//! the form made), ingest makes the form once per event as before and every compressed
//! subscriber shares it; an event without it is compressed when it is sent, exactly as ingest
//! would have (`server.rs`), as events read from sealed blocks always were.
//!
//! Only durable events enter the tail ([`Log::publish`] is called after [`Store::append`]
//! returns), so a subscriber never sees an event a crash could take back.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::RwLock;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::Event;
use crate::Store;
pub use riptide_store::ReadLimit;
use riptide_store::StoreError;

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

#[derive(Debug, Default)]
struct Tail {
    events: VecDeque<Event>,
    bytes: usize,
}

/// How long after the last `compress=true` subscriber left ingest still makes the v1 zstd form
/// (module docs): long enough for clients that lost their connection to come back, so that
/// they do not each compress what was ingested meanwhile.
pub const ZSTD_GRACE: Duration = Duration::from_secs(600);

/// Whether anyone wants the v1 zstd form of new events (module docs): the `compress=true`
/// subscribers connected, and when the last one left.
#[derive(Debug)]
pub struct ZstdDemand {
    subscribers: AtomicUsize,
    /// Milliseconds from `start` to when the last subscriber left, plus one (0: none has).
    left_ms: AtomicU64,
    start: Instant,
}

impl Default for ZstdDemand {
    fn default() -> Self {
        ZstdDemand {
            subscribers: AtomicUsize::new(0),
            left_ms: AtomicU64::new(0),
            start: Instant::now(),
        }
    }
}

impl ZstdDemand {
    /// A `compress=true` subscriber, counted until the guard drops.
    pub fn join(&self) -> ZstdSubscriber<'_> {
        self.subscribers.fetch_add(1, Ordering::AcqRel);
        ZstdSubscriber(self)
    }

    /// `compress=true` subscribers connected now.
    pub fn subscribers(&self) -> usize {
        self.subscribers.load(Ordering::Acquire)
    }

    /// Whether ingest should make the zstd form of the events it writes now: a subscriber is
    /// connected, or the last left less than [`ZSTD_GRACE`] ago.
    pub fn wanted(&self) -> bool {
        self.wanted_at(self.ms_now())
    }

    /// [`ZstdDemand::wanted`] at `now` (milliseconds since this was made).
    fn wanted_at(&self, now: u64) -> bool {
        if self.subscribers() > 0 {
            return true;
        }
        match self.left_ms.load(Ordering::Acquire) {
            0 => false,
            left => now.saturating_sub(left - 1) < ZSTD_GRACE.as_millis() as u64,
        }
    }

    fn ms_now(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }
}

/// A connected `compress=true` subscriber ([`ZstdDemand::join`]).
#[derive(Debug)]
pub struct ZstdSubscriber<'a>(&'a ZstdDemand);

impl Drop for ZstdSubscriber<'_> {
    fn drop(&mut self) {
        // The time first: whoever sees the count fall to zero sees when.
        self.0.left_ms.store(self.0.ms_now() + 1, Ordering::Release);
        self.0.subscribers.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The log. Share it in an `Arc`.
#[derive(Debug)]
pub struct Log {
    store: Store,
    tail: RwLock<Tail>,
    limits: TailLimits,
    /// The next seq to be published (one past the newest event).
    next: watch::Sender<u64>,
    zstd: ZstdDemand,
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
            zstd: ZstdDemand::default(),
        }
    }

    /// Who wants the v1 zstd form of new events (module docs).
    pub fn zstd_demand(&self) -> &ZstdDemand {
        &self.zstd
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
        let events: Vec<Event> = events
            .iter()
            .map(|e| e.with_v2_frame(crate::v2::render))
            .collect();
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
    fn the_zstd_form_is_wanted_while_compressed_subscribers_are_and_for_the_grace_after() {
        let d = ZstdDemand::default();
        let grace = ZSTD_GRACE.as_millis() as u64;
        // Nobody has ever asked.
        assert!(!d.wanted_at(0) && !d.wanted_at(10 * grace));
        let a = d.join();
        let b = d.join();
        assert_eq!(d.subscribers(), 2);
        assert!(d.wanted_at(10 * grace));
        drop(a);
        assert!(d.wanted_at(10 * grace), "one is still connected");
        drop(b);
        assert_eq!(d.subscribers(), 0);
        let left = d.left_ms.load(Ordering::Acquire) - 1;
        assert!(d.wanted_at(left) && d.wanted_at(left + grace - 1));
        assert!(!d.wanted_at(left + grace) && !d.wanted_at(left + 10 * grace));
        // The real clock: it has just left.
        assert!(d.wanted());
    }

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
    use riptide_store::store::Resume;
}
