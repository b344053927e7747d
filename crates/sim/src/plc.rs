//! The simulator's PLC directory log: `GET /export?count=N&after=SEQ`, operations consistent
//! with the documents `GET /did:plc:…` serves.
//!
//! Why: a crawl resolves its DIDs from a local copy of the directory (`riptide plc mirror`,
//! issue 37), and that copy is filled from `/export`; testing it end to end needs a directory
//! whose log folds to the very documents the simulator serves.
//!
//! What the log is: per account with a document, a signed `plc_operation` genesis (in DID
//! order), with the account's `#atproto` key, handle and PDS endpoint (its host's URL, as the
//! served document says). Every fourth account's genesis names a stale handle and the endpoint
//! `https://pds.invalid`, and a second operation, after every genesis (so usually pages later),
//! moves it to the real ones: a copy that did not fold `prev` chains would send a crawl to the
//! wrong PDS. Operations are signed with one rotation key, [`rotation_key`] (as a PDS holds
//! its accounts' rotation key), so every signature is real and checked.
//!
//! What it cannot be: the generator drew each account's DID before any operation existed, so
//! no genesis operation here derives its DID (`did:plc:` + base32 of the SHA-256 of the signed
//! genesis). A mirror of this directory must be told so (`riptide plc mirror
//! --sim-dids`), which applies such operations and counts them (`did_underived`) instead of
//! refusing them.

use riptide_crypto::{Curve, PrivateKey};
use riptide_identity::plc::sign_op;
use riptide_syntax::{format_utc, Precision};
use serde_json::{json, Value};

use crate::network::Network;

/// The log's first `createdAt` (2024-01-01T00:00:00Z); each operation is a second later.
const EPOCH_MICROS: u64 = 1_704_067_200_000_000;

/// The endpoint every fourth account's genesis names before its update fixes it.
pub const STALE_PDS: &str = "https://pds.invalid";

/// The rotation key every operation of the simulated directory is signed with.
pub fn rotation_key() -> PrivateKey {
    // Any 32 bytes below the curve order are a key; these are.
    PrivateKey::from_bytes(Curve::Secp256k1, &[0x51; 32])
        .unwrap_or_else(|e| panic!("sim rotation key: {e}"))
}

/// The `#atproto` key of a served document as a `did:key`, if it has one.
fn atproto_did_key(doc: &Value) -> Option<String> {
    let vms = doc.get("verificationMethod")?.as_array()?;
    vms.iter()
        .find(|vm| {
            vm.get("id")
                .and_then(Value::as_str)
                .is_some_and(|id| id.ends_with("#atproto"))
        })
        .and_then(|vm| vm.get("publicKeyMultibase")?.as_str())
        .map(|mb| format!("did:key:{mb}"))
}

fn operation(prev: Option<&str>, doc: &Value, aka: Value, pds: &str) -> Value {
    let vms = match atproto_did_key(doc) {
        Some(k) => json!({ "atproto": k }),
        None => json!({}),
    };
    json!({
        "type": "plc_operation",
        "prev": prev,
        "rotationKeys": [rotation_key().public_key().to_did_key()],
        "verificationMethods": vms,
        "alsoKnownAs": aka,
        "services": {"atproto_pds": {"type": "AtprotoPersonalDataServer", "endpoint": pds}},
    })
}

/// The log as export lines (JSON text, `seq` from 1), for a network whose PDS URL for a DID
/// is `pds_of(did)`.
pub(crate) fn export_lines(net: &Network, pds_of: impl Fn(&str) -> String) -> Vec<String> {
    let key = rotation_key();
    let mut lines = Vec::new();
    let mut updates = Vec::new();
    let push = |lines: &mut Vec<String>, did: &str, op: &Value| -> Option<String> {
        let (signed, cid) = sign_op(op, &key).ok()?;
        let seq = lines.len() as u64 + 1;
        let line = json!({
            "type": "sequenced_op",
            "seq": seq,
            "did": did,
            "operation": signed,
            "cid": cid.to_string(),
            "nullified": false,
            "createdAt": format_utc(EPOCH_MICROS + seq * 1_000_000, Precision::Millis),
        });
        lines.push(line.to_string());
        Some(cid.to_string())
    };
    for (i, (did, a)) in net.accounts.iter().enumerate() {
        if a.doc.is_null() {
            continue;
        }
        let aka = a.doc.get("alsoKnownAs").cloned().unwrap_or(json!([]));
        let pds = pds_of(did);
        if i % 4 == 1 {
            let stale = json!([format!("at://stale-{i}.invalid")]);
            let Some(cid) = push(&mut lines, did, &operation(None, &a.doc, stale, STALE_PDS))
            else {
                continue;
            };
            updates.push((did.clone(), operation(Some(&cid), &a.doc, aka, &pds)));
        } else {
            push(&mut lines, did, &operation(None, &a.doc, aka, &pds));
        }
    }
    for (did, op) in updates {
        push(&mut lines, &did, &op);
    }
    lines
}

/// The lines after `after` (a `seq`), at most `count`, as one body.
pub(crate) fn page(lines: &[String], after: u64, count: usize) -> String {
    let start = usize::try_from(after)
        .unwrap_or(usize::MAX)
        .min(lines.len());
    let mut body = String::new();
    for l in lines[start..].iter().take(count) {
        body.push_str(l);
        body.push('\n');
    }
    body
}
