//! Where the shared test corpus is, for every crate's tests.
//!
//! Why a crate: seven test suites need the same rule, and a copy per crate drifts. The rule: the
//! corpus is `$RIPTIDE_CORPUS`, else `../shared/corpus` beside the checkout. Tests read the files
//! in place (they are never copied into the repository). When the corpus is absent, a test prints a
//! note and passes — except under `CI`, where a missing corpus is a failure: a test that silently
//! skips proves nothing.

use std::path::PathBuf;

/// The corpus directory, or `None` (with a note) when it is absent outside CI.
///
/// # Panics
/// Under `CI` when the corpus is missing.
pub fn corpus() -> Option<PathBuf> {
    let dir = match std::env::var_os("RIPTIDE_CORPUS") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/corpus"),
    };
    if dir.join("README.md").exists() {
        return Some(dir);
    }
    if std::env::var_os("CI").is_some() {
        panic!(
            "shared corpus not found at {} (set RIPTIDE_CORPUS)",
            dir.display()
        );
    }
    eprintln!(
        "note: shared corpus not found at {}; skipping",
        dir.display()
    );
    None
}

/// The bytes of a corpus file (path relative to the corpus directory).
///
/// # Panics
/// When the corpus is present but the file cannot be read.
pub fn read(rel: &str) -> Option<Vec<u8>> {
    let p = corpus()?.join(rel);
    Some(std::fs::read(&p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display())))
}

/// A corpus file as UTF-8 text.
///
/// # Panics
/// When the file is present but not UTF-8.
pub fn read_string(rel: &str) -> Option<String> {
    read(rel).map(|b| String::from_utf8(b).unwrap_or_else(|e| panic!("{rel} is not UTF-8: {e}")))
}
