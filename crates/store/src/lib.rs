//! riptide's event store: what `riptide serve --data DIR` keeps on disk, and how it is read back.
//!
//! Why a crate: the store is the part of the server that outlives a process — its layout, its
//! durability point, its checksums and its retention are a format, and the archive of Jetstream
//! v2 (issue 38: sealed `.jss` segments, folding, the planner) is built on it. Kept apart from
//! `riptide-serve`, it has no HTTP and no async runtime: `serve` (both wires), `riptide store
//! check|repair`, the benchmarks and the Kafka follower all open the same store through this
//! crate, and the server crate stops being the place where everything meets. Dependencies run
//! one way: `riptide-serve` → `riptide-store` → `riptide-firehose` (account chain state) and
//! `riptide-jetstream` (event kinds).
//!
//! - [`event`]: one stored v1 event, the store's value format;
//! - [`store`]: the fjall partitions, blocks, checksums, durability point and retention;
//! - [`lock`]: one process per data directory;
//! - [`tombstones`], [`catalog`], [`compact`]: folding the sealed `.jss` segments (issue 38): the
//!   tombstones an ingest batch writes, the `segments` entries, and the compaction pass;
//! - [`folding`]: where the store runs them: tombstones in the ingest batch, the writer's
//!   pruning, the compaction thread and its counters;
//! - `testing` (feature `testing`, for dev-dependencies): what tests of the store and of its
//!   users share.

pub mod catalog;
pub mod compact;
pub mod event;
pub mod folding;
pub mod lock;
mod rows;
pub mod store;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod tombstones;

pub use event::{CorruptEvent, Event, Text, Utf8Text};
pub use lock::{DirLock, LockError};
pub use store::{
    read_segment_meta, LandingRow, Resume, SealPoint, Store, StoreError, StoreOptions,
};

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
    pub fn full<E>(&self, out: &[E], start: usize, bytes: usize) -> bool {
        let n = out.len() - start;
        n >= self.events.max(1) || (n > 0 && bytes >= self.bytes)
    }
}
