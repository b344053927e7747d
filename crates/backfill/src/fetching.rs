//! The accounts whose repository a crawl is fetching: shared with whoever must treat them
//! apart meanwhile.
//!
//! Why: `riptide serve --backfill` serves the live stream while it crawls. On the real network
//! holding every account not yet backfilled for the whole crawl fills any bound in minutes, so
//! it holds live frames only of the accounts whose fetch is in flight (`riptide_serve::backfill`,
//! "hold in flight"): an account enters this set before its `getRepo` is asked (so any commit
//! served before then is in the repository the PDS returns), and the consumer takes it out when
//! the repository lands or the account is settled otherwise ([`crate::Sink::settled`]). The
//! crawl bounds its size: at most `listings_at_once × window` accounts are in flight.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::RwLock;

/// A set of DIDs being fetched (module docs).
#[derive(Debug, Default)]
pub struct Fetching {
    dids: RwLock<HashSet<Box<str>>>,
    /// Its size, read without the lock (a consumer asks for every frame).
    len: AtomicUsize,
}

impl Fetching {
    /// `did`'s fetch begins.
    pub fn start(&self, did: &str) {
        let mut s = self.dids.write().unwrap_or_else(|e| e.into_inner());
        if s.insert(did.into()) {
            self.len.store(s.len(), Relaxed);
        }
    }

    /// `did` is no longer fetched (its repository landed, or it failed); whether it was.
    pub fn end(&self, did: &str) -> bool {
        let mut s = self.dids.write().unwrap_or_else(|e| e.into_inner());
        let was = s.remove(did);
        self.len.store(s.len(), Relaxed);
        was
    }

    /// None is fetched any more (the crawl has ended, or stopped on a local failure with
    /// fetches it will not finish).
    pub fn clear(&self) {
        self.dids.write().unwrap_or_else(|e| e.into_inner()).clear();
        self.len.store(0, Relaxed);
    }

    /// Whether `did` is being fetched.
    pub fn contains(&self, did: &str) -> bool {
        self.len.load(Relaxed) > 0
            && self
                .dids
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .contains(did)
    }

    /// How many accounts are being fetched.
    pub fn len(&self) -> usize {
        self.len.load(Relaxed)
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_account_is_fetched_from_its_start_to_its_end() {
        let f = Fetching::default();
        assert!(f.is_empty() && !f.contains("did:plc:a"));
        f.start("did:plc:a");
        f.start("did:plc:a");
        f.start("did:plc:b");
        assert_eq!(f.len(), 2);
        assert!(f.contains("did:plc:a") && !f.contains("did:plc:c"));
        assert!(f.end("did:plc:a"));
        assert!(!f.end("did:plc:a"), "ended once");
        assert!(!f.contains("did:plc:a"));
        assert_eq!(f.len(), 1);
        f.clear();
        assert!(f.is_empty() && !f.contains("did:plc:b"));
    }
}
