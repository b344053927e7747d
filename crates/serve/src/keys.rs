//! Account signing keys for the verifier, behind a trait object so the source can change:
//! a static `--did-docs` file now, PLC / did:web resolution later (any `KeyLookup + Send + Sync`).

use std::sync::Arc;

use riptide_crypto::PublicKey;
use riptide_firehose::verify::{KeyLookup, KeyUnavailable};
use riptide_identity::{DidDocs, ResolveError};

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

/// A static set of DID documents (`--did-docs FILE`) as a key source.
#[derive(Debug, Clone)]
pub struct DocKeys(pub DidDocs);

impl KeyLookup for DocKeys {
    fn key(&self, did: &str) -> Result<PublicKey, KeyUnavailable> {
        match self.0.signing_key(did) {
            Ok(k) => Ok(k),
            Err(ResolveError::NotFound(_)) => Err(KeyUnavailable::Unknown),
            Err(ResolveError::Doc { error, .. }) => {
                Err(KeyUnavailable::Unusable(error.to_string()))
            }
            Err(other) => Err(KeyUnavailable::Unusable(other.to_string())),
        }
    }
}

impl Keys {
    /// Keys from a set of DID documents.
    pub fn from_docs(docs: DidDocs) -> Keys {
        Keys(Arc::new(DocKeys(docs)))
    }
}
