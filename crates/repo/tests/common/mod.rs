//! Shared helpers for the integration tests: locating the corpus, decoding test vectors.
#![allow(dead_code)]

use std::path::PathBuf;

/// The shared corpus directory: `$RIPTIDE_CORPUS`, else `../../../shared/corpus` from this crate.
/// `None` (with a note) when it is absent, unless `CI` is set, in which case this panics so a CI
/// run cannot pass on an empty corpus.
pub fn corpus() -> Option<PathBuf> {
    let dir = match std::env::var_os("RIPTIDE_CORPUS") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/corpus"),
    };
    if dir.is_dir() {
        return Some(dir);
    }
    if std::env::var_os("CI").is_some() {
        panic!("corpus not found at {} (set RIPTIDE_CORPUS)", dir.display());
    }
    eprintln!("note: corpus not found at {}; skipping", dir.display());
    None
}

/// Reads a corpus file (panics if the corpus exists but the file does not).
pub fn read(rel: &str) -> Option<Vec<u8>> {
    let dir = corpus()?;
    let p = dir.join(rel);
    Some(std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
}

/// Reads a corpus JSON file.
pub fn json(rel: &str) -> Option<serde_json::Value> {
    let bytes = read(rel)?;
    Some(serde_json::from_slice(&bytes).expect("valid JSON"))
}

/// Decodes atproto JSON `{"$bytes": base64}` (unpadded standard base64).
pub fn bytes_field(v: &serde_json::Value) -> Vec<u8> {
    let s = v["$bytes"].as_str().expect("$bytes");
    data_encoding::BASE64_NOPAD
        .decode(s.trim_end_matches('=').as_bytes())
        .expect("base64")
}

/// Decodes atproto JSON `{"$link": cid}` (or null).
pub fn link_field(v: &serde_json::Value) -> Option<riptide_cbor::CidBuf> {
    if v.is_null() {
        return None;
    }
    Some(riptide_cbor::CidBuf::parse(v["$link"].as_str().expect("$link")).expect("CID"))
}
