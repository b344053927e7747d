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
use riptide_identity::DidDocs;
/// DID documents as the firehose verifier's key source.
pub use riptide_resolver::DocKeys;

/// Reads a whole input file, naming it on failure.
pub fn read_file(path: &Path) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("reading {}", path.display()))
}

/// Loads a `did_docs.json` file (DID → DID document).
pub fn load_did_docs(path: &Path) -> anyhow::Result<DidDocs> {
    DidDocs::load(path).with_context(|| format!("loading DID documents from {}", path.display()))
}
