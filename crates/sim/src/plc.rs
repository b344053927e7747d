//! The simulator's PLC directory log: `GET /export?count=N&after=SEQ`, operations consistent
//! with the documents `GET /did:plc:…` serves.
//!
//! Why: a crawl resolves its DIDs from a local copy of the directory (`riptide plc mirror`,
//! issue 37), and that copy is filled from `/export`; testing it end to end needs a directory
//! whose log folds to the very documents the simulator serves.
//!
//! What the log is: per account with a document, a signed `plc_operation` genesis (in DID
//! order), with the account's `#atproto` key, handle and PDS endpoint (its host's URL, as the
//! served document says). Every fourth account's genesis names a stale handle, the endpoint
//! `https://pds.invalid` and a wrong `#atproto` key (the rotation key), and a second operation,
//! after every genesis (so usually pages later), moves it to the real ones: a copy that did not
//! fold `prev` chains would send a crawl to the wrong PDS with the wrong key. Operations are signed with one rotation key, [`rotation_key`] (as a PDS holds
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

/// An operation naming `atproto` (a `did:key`, if any), `aka` and `pds`.
fn operation(prev: Option<&str>, atproto: Option<String>, aka: Value, pds: &str) -> Value {
    let vms = match atproto {
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
            let stale_key = Some(key.public_key().to_did_key());
            let genesis = operation(None, stale_key, stale, STALE_PDS);
            let Some(cid) = push(&mut lines, did, &genesis) else {
                continue;
            };
            let update = operation(Some(&cid), atproto_did_key(&a.doc), aka, &pds);
            updates.push((did.clone(), update));
        } else {
            let genesis = operation(None, atproto_did_key(&a.doc), aka, &pds);
            push(&mut lines, did, &genesis);
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

#[cfg(test)]
mod tests {
    use super::*;
    use riptide_identity::plc::{created_at_ms, Chain, DidCheck, PlcOp};
    use std::collections::BTreeMap;

    /// The log folds, operation by operation through the mirror's checks, to the documents
    /// served (key, handle), with the stale genesis of every fourth account replaced; and
    /// pages cut it at `after` without a gap or an overlap.
    #[test]
    fn the_log_folds_to_the_served_documents_and_pages_cut_it_exactly() {
        let accts: Vec<_> = (1..=9)
            .map(|i| crate::fixture::account(i, &format!("u{i}.test"), 1))
            .collect();
        let net = Network::new(accts.iter().map(|a| a.doc.clone()), []).unwrap();
        let lines = export_lines(&net, |d| format!("http://host-of/{d}"));
        assert_eq!(lines.len(), 9 + 2);
        let mut chains: BTreeMap<String, Chain> = BTreeMap::new();
        for (i, l) in lines.iter().enumerate() {
            let v: Value = serde_json::from_str(l).unwrap();
            assert_eq!(v["seq"], i as u64 + 1);
            let did = v["did"].as_str().unwrap();
            let op = PlcOp::parse(&v["operation"]).unwrap();
            let at = created_at_ms(v["createdAt"].as_str().unwrap()).unwrap();
            let a = chains
                .entry(did.to_owned())
                .or_default()
                .apply(did, &op, v["cid"].as_str().unwrap(), at, DidCheck::Count)
                .unwrap();
            assert_eq!(a.did_underived, op.prev.is_none());
        }
        for a in &accts {
            let doc = chains[&a.did].state().unwrap().to_doc(&a.did).unwrap();
            assert_eq!(doc.signing_key().unwrap(), a.key.public_key());
            assert_eq!(doc.handle().unwrap().as_str(), a.handle);
            assert_eq!(
                doc.pds(),
                Some(format!("http://host-of/{}", a.did).as_str())
            );
        }
        let mut joined = String::new();
        let mut after = 0;
        loop {
            let p = page(&lines, after, 4);
            if p.is_empty() {
                break;
            }
            after += p.lines().count() as u64;
            joined.push_str(&p);
        }
        assert_eq!(joined, page(&lines, 0, 1000));
        assert!(page(&lines, 99, 4).is_empty());
    }
}
