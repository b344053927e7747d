//! The verifiers' account chain state: a bounded in-memory cache over the store's `accounts`
//! partition, and the updates each frame makes, handed to the writer to commit with the events.
//!
//! Why: every commit is checked against its account's previous one (`riptide_firehose::chain`),
//! for tens of millions of accounts, so the state lives on disk ([`Store::account`]) and only the
//! accounts active lately stay in memory. Each ingest worker owns one [`ServeChain`] (each DID is
//! on one worker, so no two caches hold the same account).
//!
//! **Why the cache may not lose an account in flight.** A frame's new state reaches the store
//! only when the writer commits the batch that holds it, a little after the worker verified it.
//! Until then the worker's cache is the only place the new state exists: if it were evicted
//! and the account's next frame read the store, it would be checked against the older state. The
//! cache has two generations ([`ServeChain::new`]): an account touched within the last
//! `generation` insertions is never dropped. A frame makes at most two insertions (a miss and an
//! update), and a worker has at most [`max_in_flight`] frames verified but not yet durable, so a
//! generation of twice that is always enough; [`crate::ingest`] sizes it so.
//!
//! A store read that fails (I/O, or a state that does not decode: our own corruption) is not
//! guessed around: the worker stops with the error, nothing after the last durable batch is
//! stored, and ingest ends loudly (the invariant "crash loud on our own corruption").

use std::collections::HashMap;

use riptide_firehose::chain::{AccountState, ChainStore};

use crate::Store;
use riptide_store::StoreError;

/// The most frames a worker can have verified that the store does not hold yet: its answer
/// channel's chunks, plus the writer's batch being built (`max_batch` frames and one chunk more).
pub fn max_in_flight(max_batch: usize, answer_chunks: usize, chunk: usize) -> usize {
    answer_chunks * chunk + max_batch + chunk
}

/// One worker's chain state: see the module docs.
#[derive(Debug)]
pub struct ServeChain {
    store: Store,
    stateful: bool,
    generation: usize,
    cur: HashMap<Box<str>, AccountState>,
    old: HashMap<Box<str>, AccountState>,
    dirty: Vec<(Box<str>, AccountState)>,
    failed: Option<StoreError>,
    misses: u64,
}

impl ServeChain {
    /// A cache over `store` keeping at least the last `generation` insertions (at most twice
    /// that many accounts). `stateful: false` keeps nothing and skips the chain checks.
    pub fn new(store: Store, stateful: bool, generation: usize) -> ServeChain {
        ServeChain {
            store,
            stateful,
            generation: generation.max(1),
            cur: HashMap::new(),
            old: HashMap::new(),
            dirty: Vec::new(),
            failed: None,
            misses: 0,
        }
    }

    fn remember(&mut self, did: &str, state: AccountState) {
        if let Some(s) = self.cur.get_mut(did) {
            *s = state;
            return;
        }
        if self.cur.len() >= self.generation {
            self.old = std::mem::take(&mut self.cur);
        }
        let key = match self.old.remove_entry(did) {
            Some((k, _)) => k,
            None => did.into(),
        };
        self.cur.insert(key, state);
    }

    /// Moves the updates made since the last call to the end of `out`, in order.
    pub fn drain_into(&mut self, out: &mut Vec<(Box<str>, AccountState)>) {
        out.append(&mut self.dirty);
    }

    /// The store error a lookup met, if any (the worker must stop: module docs).
    pub fn take_error(&mut self) -> Option<StoreError> {
        self.failed.take()
    }

    /// Lookups that went to the store.
    pub fn misses(&self) -> u64 {
        self.misses
    }

    /// Accounts held in memory.
    pub fn cached(&self) -> usize {
        self.cur.len() + self.old.len()
    }
}

impl ChainStore for ServeChain {
    fn get(&mut self, did: &str) -> Option<AccountState> {
        if let Some(s) = self.cur.get(did) {
            return Some(*s);
        }
        if let Some(s) = self.old.get(did).copied() {
            self.remember(did, s);
            return Some(s);
        }
        self.misses += 1;
        match self.store.account(did) {
            Ok(Some(s)) => {
                self.remember(did, s);
                Some(s)
            }
            Ok(None) => None,
            Err(e) => {
                self.failed.get_or_insert(e);
                None
            }
        }
    }

    fn put(&mut self, did: &str, state: AccountState) {
        self.remember(did, state);
        self.dirty.push((did.into(), state));
    }

    fn is_stateless(&self) -> bool {
        !self.stateful
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use riptide_firehose::chain::{Hosting, SyncStatus};
    use riptide_store::store::Resume;

    fn state(h: Hosting) -> AccountState {
        AccountState {
            tip: None,
            hosting: h,
            sync: SyncStatus::Synchronized,
        }
    }

    #[test]
    fn an_account_touched_within_a_generation_is_never_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = Store::open(dir.path(), 0).unwrap();
        let mut c = ServeChain::new(store, true, 4);
        c.put("did:plc:keep", state(Hosting::Deleted));
        for i in 0..3 {
            c.put(&format!("did:plc:{i}"), state(Hosting::Active));
        }
        // Four insertions since: a generation; still held (in the old one), and moved forward.
        assert_eq!(c.get("did:plc:keep"), Some(state(Hosting::Deleted)));
        for i in 3..10 {
            c.put(&format!("did:plc:{i}"), state(Hosting::Active));
        }
        assert!(c.cached() <= 8);
        // Dropped now, and not in the store (nothing was committed): a miss.
        let misses = c.misses();
        assert_eq!(c.get("did:plc:keep"), None);
        assert_eq!(c.misses(), misses + 1);
        let mut out = Vec::new();
        c.drain_into(&mut out);
        assert_eq!(out.len(), 11);
        assert_eq!(&*out[0].0, "did:plc:keep");
        c.drain_into(&mut out);
        assert_eq!(out.len(), 11, "drained once");
    }

    #[test]
    fn misses_read_the_store_and_corruption_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = Store::open(dir.path(), 0).unwrap();
        let resume = Resume {
            next_seq: 1,
            last_time_us: 0,
            upstream_cursor: Some(7),
        };
        store
            .append_with_accounts(
                &[],
                &[("did:plc:a".into(), state(Hosting::Takendown))],
                &resume,
            )
            .unwrap();
        let mut c = ServeChain::new(store.clone(), true, 16);
        assert_eq!(c.get("did:plc:a"), Some(state(Hosting::Takendown)));
        assert_eq!(c.get("did:plc:a"), Some(state(Hosting::Takendown)));
        assert_eq!(c.misses(), 1);
        assert!(c.take_error().is_none());
        assert_eq!(
            store.accounts().map(Result::unwrap).collect::<Vec<_>>(),
            vec![("did:plc:a".to_owned(), state(Hosting::Takendown))]
        );
        drop(c);
        drop(store);
        // Corrupt the stored state: the lookup reports it rather than starting the account over.
        let (store, _) = Store::open(dir.path(), 0).unwrap();
        store.put_raw_account_for_tests("did:plc:a", b"\x09junk");
        let mut c = ServeChain::new(store, true, 16);
        assert_eq!(c.get("did:plc:a"), None);
        let e = c.take_error().expect("an error");
        assert!(e.to_string().contains("did:plc:a"), "{e}");
    }
}
