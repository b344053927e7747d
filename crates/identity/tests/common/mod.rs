//! Locating the shared corpus: `RIPTIDE_CORPUS`, else `../shared/corpus` beside the checkout.
#![allow(dead_code)]

use std::path::PathBuf;

/// The corpus directory, or `None` (with a note) when it is absent outside CI. Under CI a missing
/// corpus is a failure: a test that silently skips proves nothing.
pub fn corpus() -> Option<PathBuf> {
    let dir = match std::env::var_os("RIPTIDE_CORPUS") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/corpus"),
    };
    if dir.join("README.md").exists() {
        return Some(dir);
    }
    if std::env::var_os("CI").is_some() {
        panic!("shared corpus not found at {} (set RIPTIDE_CORPUS)", dir.display());
    }
    eprintln!("note: shared corpus not found at {}; skipping", dir.display());
    None
}

pub fn read(rel: &str) -> Option<Vec<u8>> {
    let dir = corpus()?;
    let p = dir.join(rel);
    Some(std::fs::read(&p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display())))
}
