//! The DID documents of the real capture (`jetstream-2026-07/did_docs.json`, as served by the PLC
//! directory at capture time): every one parses, and every DID with a commit in the capture has a
//! usable signing key.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use riptide_testdata as common;

use riptide_crypto::Curve;
use riptide_identity::DidDocs;

#[test]
fn every_document_parses_and_every_commit_did_has_a_key() {
    let Some(dir) = common::corpus() else { return };
    let dir = dir.join("jetstream-2026-07");
    let docs = DidDocs::load(&dir.join("did_docs.json")).unwrap();
    assert_eq!(docs.len(), 148);

    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap();
    let dids = manifest["commit_dids"].as_array().unwrap();
    assert_eq!(dids.len(), 148);
    let (mut k256, mut p256) = (0, 0);
    for did in dids {
        let did = did.as_str().unwrap();
        let key = docs
            .signing_key(did)
            .unwrap_or_else(|e| panic!("{did}: {e}"));
        match key.curve() {
            Curve::Secp256k1 => k256 += 1,
            Curve::P256 => p256 += 1,
        }
    }
    // Every account of the capture signs with secp256k1 (PLC's default); P-256 is covered by the
    // unit tests and synthetic commits.
    assert_eq!((k256, p256), (148, 0));

    for doc in docs.iter() {
        assert!(doc.handle().is_some(), "{}", doc.did());
        let pds = doc
            .pds()
            .unwrap_or_else(|| panic!("{} has no PDS", doc.did()));
        assert!(pds.starts_with("https://"), "{pds}");
        assert_eq!(doc.key_method().unwrap().vm_type, "Multikey");
    }
}
