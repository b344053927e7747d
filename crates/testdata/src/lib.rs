//! Where the shared test corpus is, for every crate's tests.
//!
//! Why a crate: seven test suites need the same rule, and a copy per crate drifts. The rule: the
//! corpus is `$RIPTIDE_CORPUS`, else `../shared/corpus` beside the checkout. Tests read the files
//! in place (they are never copied into the repository). When the corpus is absent, a test prints a
//! note and passes — except under `CI`, where a missing corpus is a failure: a test that silently
//! skips proves nothing. The note goes straight to the process's stderr, once per test binary, so
//! that `cargo test` shows it (the test harness hides what a passing test prints with
//! `eprintln!`); it says where the corpus comes from.

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
    static NOTE: std::sync::Once = std::sync::Once::new();
    NOTE.call_once(|| {
        use std::io::Write;
        // Not `eprintln!`: the harness captures that for passing tests.
        let _ = writeln!(
            std::io::stderr(),
            "note: the shared corpus is not at {}: tests that need it pass without checking \
             anything. It is the `shared/corpus` directory distributed beside this repository \
             (see the README, \"The shared corpus\"); put it at ../shared/corpus or set \
             RIPTIDE_CORPUS.",
            dir.display()
        );
    });
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
