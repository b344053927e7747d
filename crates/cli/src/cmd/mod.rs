//! Subcommands, one module each.

pub mod bench;
pub mod bench_serve;
pub mod corpus;
pub mod decode;
pub mod demo;
pub mod dict;
pub mod gen;
pub mod jetstream;
pub mod relay;
pub mod repo;
pub mod serve;
pub mod sim;
pub mod tail;
pub mod verify;
pub mod verify_handle;

use std::path::Path;

use anyhow::Context;
use riptide_crypto::PublicKey;
use riptide_firehose::verify::{KeyLookup, KeyUnavailable};
use riptide_identity::{DidDocs, ResolveError};

/// Reads a whole input file, naming it on failure.
pub fn read_file(path: &Path) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("reading {}", path.display()))
}

/// Loads a `did_docs.json` file (DID → DID document).
pub fn load_did_docs(path: &Path) -> anyhow::Result<DidDocs> {
    DidDocs::load(path).with_context(|| format!("loading DID documents from {}", path.display()))
}

/// DID documents as the firehose verifier's key source. (The firehose crate knows nothing of DID
/// documents; this is where the two meet.)
#[derive(Debug, Clone, Copy)]
pub struct DocKeys<'d>(pub &'d DidDocs);

impl KeyLookup for DocKeys<'_> {
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
