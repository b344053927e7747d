//! Subcommands, one module each.

pub mod bench;
pub mod decode;
pub mod jetstream;

use std::path::Path;

use anyhow::Context;

/// Reads a whole input file, naming it on failure.
pub fn read_file(path: &Path) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("reading {}", path.display()))
}
