//! Small signed accounts built in memory, for tests that need a network before (or without)
//! `riptide gen`: a DID, a key, a document naming a handle, and a repository export signed with
//! the key (MST built by `riptide-repo`, CAR written by `riptide-car`).
//!
//! Deterministic: the same seed gives the same DID, key and repository. Not for benchmarks
//! (records are tiny); `riptide gen` makes realistic networks.

use std::collections::BTreeMap;

use bytes::Bytes;
use riptide_car::write_car;
use riptide_cbor::{CidBuf, OwnedValue, DAG_CBOR};
use riptide_crypto::{Curve, PrivateKey, PublicKey};
use serde_json::{json, Value};

/// One generated account.
#[derive(Debug, Clone)]
pub struct FixtureAccount {
    /// `did:plc:…`, derived from the seed.
    pub did: String,
    /// The handle its document claims.
    pub handle: String,
    /// Its signing key.
    pub key: PrivateKey,
    /// Its DID document (PDS `https://pds.invalid`, rewritten by the simulator).
    pub doc: Value,
    /// Its repository export.
    pub car: Bytes,
    /// Records in the repository.
    pub records: usize,
}

fn base32(mut v: u64, len: usize) -> String {
    const A: &[u8] = b"234567abcdefghijklmnopqrstuvwxyz";
    let mut s = vec![b'2'; len];
    for c in s.iter_mut().rev() {
        *c = A[(v & 31) as usize];
        v >>= 5;
    }
    String::from_utf8(s).unwrap_or_default()
}

/// The DID of seed `seed`.
pub fn did_for(seed: u8) -> String {
    format!("did:plc:{}", base32(0x5151_0000 + u64::from(seed), 24))
}

/// The signing key of seed `seed` (secp256k1).
pub fn key_for(seed: u8) -> PrivateKey {
    let mut bytes = [7u8; 32];
    bytes[0] = seed.wrapping_add(1);
    // Any 32 bytes below the curve order are a key; these are.
    PrivateKey::from_bytes(Curve::Secp256k1, &bytes).unwrap_or_else(|e| panic!("fixture key: {e}"))
}

/// A DID document for `did` claiming `handle`, with `key` under `#atproto` and a PDS.
pub fn doc(did: &str, handle: &str, key: &PublicKey, pds: &str) -> Value {
    json!({
        "@context": ["https://www.w3.org/ns/did/v1"],
        "id": did,
        "alsoKnownAs": [format!("at://{handle}")],
        "verificationMethod": [{
            "id": format!("{did}#atproto"),
            "type": "Multikey",
            "controller": did,
            "publicKeyMultibase": key.to_multibase(),
        }],
        "service": [{"id": "#atproto_pds", "type": "AtprotoPersonalDataServer", "serviceEndpoint": pds}],
    })
}

/// A repository export of `did` with `records` posts and likes, signed with `key`.
pub fn repo(did: &str, key: &PrivateKey, records: usize) -> Vec<u8> {
    repo_sized(did, key, records, 0)
}

/// [`repo`] with `pad` more bytes of text in every record (to reach a target size: ~`pad` + 150
/// bytes a record with its MST share).
pub fn repo_sized(did: &str, key: &PrivateKey, records: usize, pad: usize) -> Vec<u8> {
    let filler = "lorem ipsum dolor sit amet ".repeat(pad / 27 + 1);
    let filler = &filler[..pad];
    let mut blocks: Vec<(CidBuf, Vec<u8>)> = Vec::with_capacity(records);
    let mut leaves = Vec::with_capacity(records);
    for i in 0..records {
        let coll = if i % 2 == 0 {
            "app.bsky.feed.post"
        } else {
            "app.bsky.feed.like"
        };
        let mut m = BTreeMap::new();
        m.insert("$type".to_owned(), OwnedValue::Text(coll.into()));
        m.insert(
            "createdAt".to_owned(),
            OwnedValue::Text("2026-11-22T00:00:00.000Z".into()),
        );
        m.insert(
            "text".to_owned(),
            OwnedValue::Text(format!("record {i} of {did}{filler}")),
        );
        let bytes = OwnedValue::Map(m).to_cbor();
        let cid = CidBuf::sha256(DAG_CBOR, &bytes);
        leaves.push((
            format!("{coll}/{}", base32((1 << 60) + i as u64 * 7_777_777, 13)),
            cid,
        ));
        blocks.push((cid, bytes));
    }
    leaves.sort();
    let (root, nodes) =
        riptide_repo::mst::build(&leaves).unwrap_or_else(|e| panic!("fixture MST: {e}"));
    let mut c = BTreeMap::new();
    c.insert("did".to_owned(), OwnedValue::Text(did.into()));
    c.insert("version".to_owned(), OwnedValue::Int(3));
    c.insert("data".to_owned(), OwnedValue::Link(root));
    c.insert(
        "rev".to_owned(),
        OwnedValue::Text(base32((1 << 60) + records as u64, 13)),
    );
    c.insert("prev".to_owned(), OwnedValue::Null);
    let sig = key.sign(&OwnedValue::Map(c.clone()).to_cbor());
    c.insert("sig".to_owned(), OwnedValue::Bytes(sig.to_vec()));
    let commit = OwnedValue::Map(c).to_cbor();
    let commit_cid = CidBuf::sha256(DAG_CBOR, &commit);
    let mut all: Vec<(CidBuf, &[u8])> = vec![(commit_cid, &commit)];
    all.extend(nodes.iter().map(|(c, d)| (*c, d.as_slice())));
    all.extend(blocks.iter().map(|(c, d)| (*c, d.as_slice())));
    write_car(&[commit_cid], all.iter().map(|(c, d)| (c.as_cid(), *d)))
}

/// A whole account from a seed.
pub fn account(seed: u8, handle: &str, records: usize) -> FixtureAccount {
    let did = did_for(seed);
    let key = key_for(seed);
    let doc = doc(&did, handle, &key.public_key(), "https://pds.invalid");
    let car = Bytes::from(repo(&did, &key, records));
    FixtureAccount {
        did,
        handle: handle.to_owned(),
        key,
        doc,
        car,
        records,
    }
}

/// `car` with its last byte flipped: the last block (a record) no longer hashes to its CID.
pub fn tamper_last_block(car: &[u8]) -> Vec<u8> {
    let mut v = car.to_vec();
    if let Some(b) = v.last_mut() {
        *b ^= 0x01;
    }
    v
}
