//! Keys from PLC / did:web resolution for the synchronous verifier (`--plc-url`, no
//! `--did-docs`).
//!
//! The verifier's [`KeyLookup`] runs on ingest's OS threads and must not do I/O in the common
//! case: [`crate::upstream`] warms the resolver's cache before each frame is handed on, so this
//! adapter normally answers from the cache ([`ResolverKeys`]). The rare miss — the entry evicted
//! from the bounded LRU, expired, or dropped by an `#identity` between warming and verifying —
//! is resolved here once, blocking this verifier thread on the runtime (never a runtime thread:
//! ingest workers are plain threads), rather than answering "unknown" for a key that exists.

use riptide_crypto::PublicKey;
use riptide_firehose::verify::{KeyLookup, KeyUnavailable};
use riptide_resolver::{Resolver, ResolverKeys};

/// [`ResolverKeys`] with a blocking lookup on a cache miss.
#[derive(Debug)]
pub struct ResolvingKeys {
    keys: ResolverKeys,
    rt: tokio::runtime::Handle,
}

impl ResolvingKeys {
    /// Keys from `resolver`, with misses resolved on `rt`.
    pub fn new(resolver: Resolver, rt: tokio::runtime::Handle) -> ResolvingKeys {
        ResolvingKeys {
            keys: ResolverKeys::new(resolver),
            rt,
        }
    }

    /// The resolver.
    pub fn resolver(&self) -> &Resolver {
        self.keys.resolver()
    }
}

impl KeyLookup for ResolvingKeys {
    fn key(&self, did: &str) -> Result<PublicKey, KeyUnavailable> {
        let res = self.keys.resolver();
        if res.try_get(did).is_none() && tokio::runtime::Handle::try_current().is_err() {
            tracing::debug!(did, "key not cached at verification: resolving");
            let _ = self.rt.block_on(res.resolve_did(did));
        }
        self.keys.key(did)
    }
}
