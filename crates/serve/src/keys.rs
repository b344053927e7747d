//! Account signing keys for the verifier, behind a trait object so the source can change:
//! a static `--did-docs` file ([`Keys::from_docs`]) or PLC / did:web resolution
//! (`riptide_resolver::ResolverKeys`, warmed by [`crate::upstream`]); any
//! `KeyLookup + Send + Sync`.

use std::sync::Arc;

use riptide_crypto::PublicKey;
use riptide_firehose::verify::{KeyLookup, KeyUnavailable};
use riptide_identity::DidDocs;
use riptide_resolver::DocKeys;

/// A shareable key source: what every verification worker holds.
#[derive(Clone)]
pub struct Keys(pub Arc<dyn KeyLookup + Send + Sync>);

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Keys")
    }
}

impl KeyLookup for Keys {
    fn key(&self, did: &str) -> Result<PublicKey, KeyUnavailable> {
        self.0.key(did)
    }
}

/// A static set of DID documents (`--did-docs FILE`), owned for the workers' threads; the answers
/// are [`DocKeys`]'s.
#[derive(Debug)]
struct OwnedDocs(Arc<DidDocs>);

impl KeyLookup for OwnedDocs {
    fn key(&self, did: &str) -> Result<PublicKey, KeyUnavailable> {
        DocKeys(&self.0).key(did)
    }
}

impl Keys {
    /// Keys from a set of DID documents.
    pub fn from_docs(docs: DidDocs) -> Keys {
        Keys::from_shared_docs(Arc::new(docs))
    }

    /// Keys from a set of DID documents shared with others (resync's resolver, so that both
    /// take an account's identity from the same documents).
    pub fn from_shared_docs(docs: Arc<DidDocs>) -> Keys {
        Keys(Arc::new(OwnedDocs(docs)))
    }
}
