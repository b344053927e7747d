//! Shared helpers for the integration tests: locating the corpus, decoding test vectors.
#![allow(dead_code)]

/// Locating the corpus is shared by every crate (`riptide-testdata`).
#[allow(unused_imports)]
pub use riptide_testdata::{corpus, read};

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

/// An op as the tests keep it (owned), and its borrowed form for `verify_commit_proof`.
pub type OwnedOp = (
    riptide_repo::Action,
    String,
    Option<riptide_cbor::CidBuf>,
    Option<riptide_cbor::CidBuf>,
);

/// Borrows owned ops as proof ops.
pub fn proof_ops(ops: &[OwnedOp]) -> Vec<riptide_repo::ProofOp<'_>> {
    ops.iter()
        .map(|(a, p, c, pr)| riptide_repo::ProofOp {
            action: *a,
            path: p,
            cid: *c,
            prev: *pr,
        })
        .collect()
}
