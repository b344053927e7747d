//! The DID document cache: bounded (LRU), with TTLs, negative entries, invalidation and request
//! coalescing.
//!
//! Why one structure does all four: they interact. A burst of frames from one DID must make one
//! network request (coalescing), whose answer every waiter gets and the cache keeps (for the TTL,
//! or the shorter negative TTL when the answer is "no such DID" or "unusable document"); an
//! `#identity` event must drop the entry *and* any lookup still in flight, or the stale answer of
//! that lookup would be cached after the invalidation. So the LRU and the in-flight table live
//! under one mutex, each flight has an id, and a flight stores its result only if it is still the
//! registered flight for its DID when it completes.
//!
//! Concurrency: the mutex is held only for map operations, never across an `.await`. The fetch
//! itself is a [`Shared`] future: any waiter polls it, so cancelling one waiter does not cancel
//! the lookup for the others.

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures_util::future::{BoxFuture, Shared};
use lru::LruCache;
use riptide_identity::DidDoc;

use crate::error::ResolveError;

/// The outcome of one DID lookup, shared between waiters.
pub type DocResult = Result<Arc<DidDoc>, ResolveError>;

pub(crate) type Flight = Shared<BoxFuture<'static, DocResult>>;

struct Entry {
    value: DocResult,
    expires: Instant,
}

struct State {
    lru: LruCache<String, Entry>,
    inflight: HashMap<String, (u64, Flight)>,
    next_id: u64,
}

/// Counters of the cache, readable at any time.
#[derive(Debug, Default)]
pub struct CacheStats {
    /// Lookups answered from a live entry (positive or negative).
    pub hits: AtomicU64,
    /// Of the hits, those answered by a negative entry.
    pub negative_hits: AtomicU64,
    /// Lookups that joined a fetch already in flight.
    pub coalesced: AtomicU64,
    /// Fetches started (network lookups of DID documents).
    pub fetches: AtomicU64,
    /// Entries dropped by [`crate::Resolver::invalidate`].
    pub invalidations: AtomicU64,
    /// Entries found expired.
    pub expired: AtomicU64,
}

/// A point-in-time copy of `CacheStats`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheCounts {
    /// See `CacheStats::hits`.
    pub hits: u64,
    /// See `CacheStats::negative_hits`.
    pub negative_hits: u64,
    /// See `CacheStats::coalesced`.
    pub coalesced: u64,
    /// See `CacheStats::fetches`.
    pub fetches: u64,
    /// See `CacheStats::invalidations`.
    pub invalidations: u64,
    /// See `CacheStats::expired`.
    pub expired: u64,
}

pub(crate) struct DocCache {
    state: Mutex<State>,
    ttl: Duration,
    negative_ttl: Duration,
    pub(crate) stats: CacheStats,
}

impl std::fmt::Debug for DocCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DocCache")
            .field("ttl", &self.ttl)
            .field("negative_ttl", &self.negative_ttl)
            .finish()
    }
}

/// What a lookup found under the lock.
pub(crate) enum Lookup {
    /// A live entry.
    Cached(DocResult),
    /// A fetch to await (joined or just registered).
    Flight(Flight),
}

impl DocCache {
    pub(crate) fn new(capacity: usize, ttl: Duration, negative_ttl: Duration) -> DocCache {
        let cap = NonZeroUsize::new(capacity.max(1)).unwrap_or(NonZeroUsize::MIN);
        DocCache {
            state: Mutex::new(State {
                lru: LruCache::new(cap),
                inflight: HashMap::new(),
                next_id: 0,
            }),
            ttl,
            negative_ttl,
            stats: CacheStats::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves maps that are still consistent (no invariant
        // spans two operations), so a poisoned lock is used as is.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn live(&self, st: &mut State, did: &str) -> Option<DocResult> {
        let now = Instant::now();
        match st.lru.get(did) {
            Some(e) if e.expires > now => {
                self.stats.hits.fetch_add(1, Ordering::Relaxed);
                if e.value.is_err() {
                    self.stats.negative_hits.fetch_add(1, Ordering::Relaxed);
                }
                Some(e.value.clone())
            }
            Some(_) => {
                st.lru.pop(did);
                self.stats.expired.fetch_add(1, Ordering::Relaxed);
                None
            }
            None => None,
        }
    }

    /// A live entry, without starting anything.
    pub(crate) fn try_get(&self, did: &str) -> Option<DocResult> {
        let mut st = self.lock();
        self.live(&mut st, did)
    }

    /// A live entry, the flight in progress, or a new flight made by `start(id)`.
    pub(crate) fn lookup(&self, did: &str, start: impl FnOnce(u64) -> Flight) -> Lookup {
        let mut st = self.lock();
        if let Some(v) = self.live(&mut st, did) {
            return Lookup::Cached(v);
        }
        if let Some((_, f)) = st.inflight.get(did) {
            self.stats.coalesced.fetch_add(1, Ordering::Relaxed);
            return Lookup::Flight(f.clone());
        }
        let id = st.next_id;
        st.next_id += 1;
        self.stats.fetches.fetch_add(1, Ordering::Relaxed);
        let f = start(id);
        st.inflight.insert(did.to_owned(), (id, f.clone()));
        Lookup::Flight(f)
    }

    /// Called by flight `id` when done: caches its result unless it was invalidated meanwhile.
    /// Transient failures are not cached.
    pub(crate) fn complete(&self, did: &str, id: u64, value: &DocResult) {
        let mut st = self.lock();
        if st.inflight.get(did).map(|(i, _)| *i) != Some(id) {
            return;
        }
        st.inflight.remove(did);
        let ttl = match value {
            Ok(_) => self.ttl,
            Err(e) if e.is_definite() => self.negative_ttl,
            Err(_) => return,
        };
        st.lru.put(
            did.to_owned(),
            Entry {
                value: value.clone(),
                expires: crate::resync::later(Instant::now(), ttl),
            },
        );
    }

    /// Drops the entry of `did` and detaches any flight for it (its result will not be cached).
    pub(crate) fn invalidate(&self, did: &str) {
        let mut st = self.lock();
        let a = st.lru.pop(did).is_some();
        let b = st.inflight.remove(did).is_some();
        if a || b {
            self.stats.invalidations.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Entries held (live or expired-but-not-yet-seen).
    pub(crate) fn len(&self) -> usize {
        self.lock().lru.len()
    }

    pub(crate) fn counts(&self) -> CacheCounts {
        let s = &self.stats;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        CacheCounts {
            hits: l(&s.hits),
            negative_hits: l(&s.negative_hits),
            coalesced: l(&s.coalesced),
            fetches: l(&s.fetches),
            invalidations: l(&s.invalidations),
            expired: l(&s.expired),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::FutureExt;

    fn doc(did: &str) -> DocResult {
        Ok(Arc::new(
            DidDoc::from_json(&format!(r#"{{"id":"{did}"}}"#)).unwrap(),
        ))
    }

    fn ready(v: DocResult) -> Flight {
        async move { v }.boxed().shared()
    }

    #[test]
    fn bounded_lru_evicts_least_recent() {
        let c = DocCache::new(2, Duration::from_secs(60), Duration::from_secs(1));
        for (id, d) in ["did:plc:a", "did:plc:b", "did:plc:c"]
            .into_iter()
            .enumerate()
        {
            assert!(matches!(c.lookup(d, |_| ready(doc(d))), Lookup::Flight(_)));
            c.complete(d, id as u64, &doc(d));
        }
        assert_eq!(c.len(), 2);
        assert!(c.try_get("did:plc:a").is_none());
        assert!(c.try_get("did:plc:c").is_some());
    }

    #[test]
    fn ttls_and_transient_errors() {
        let c = DocCache::new(8, Duration::ZERO, Duration::from_secs(60));
        let _ = c.lookup("did:plc:a", |_| ready(doc("did:plc:a")));
        c.complete("did:plc:a", 0, &doc("did:plc:a"));
        assert!(c.try_get("did:plc:a").is_none(), "zero TTL expires at once");
        assert_eq!(c.counts().expired, 1);

        let neg: DocResult = Err(ResolveError::DidNotFound("did:plc:b".into()));
        let _ = c.lookup("did:plc:b", |_| ready(neg.clone()));
        c.complete("did:plc:b", 1, &neg);
        assert_eq!(c.try_get("did:plc:b"), Some(neg));
        assert_eq!(c.counts().negative_hits, 1);

        let transient: DocResult = Err(ResolveError::Status {
            url: "u".into(),
            status: 503,
        });
        let _ = c.lookup("did:plc:c", |_| ready(transient.clone()));
        c.complete("did:plc:c", 2, &transient);
        assert!(
            c.try_get("did:plc:c").is_none(),
            "transient failures are not cached"
        );
    }

    #[test]
    fn invalidated_flight_is_not_cached() {
        let c = DocCache::new(8, Duration::from_secs(60), Duration::from_secs(60));
        let _ = c.lookup("did:plc:a", |_| ready(doc("did:plc:a")));
        c.invalidate("did:plc:a");
        c.complete("did:plc:a", 0, &doc("did:plc:a"));
        assert!(c.try_get("did:plc:a").is_none());
        assert_eq!(c.counts().invalidations, 1);
    }
}
