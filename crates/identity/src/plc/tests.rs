//! Operation checks against a real directory log and against operations signed here.

use super::*;
use riptide_crypto::{Curve, PrivateKey};

/// A did:plc audit log with two recoveries, from did-method-plc/go-didplc,
/// `testdata/log_nullification_nontrivial.json` (commit 1b3ab4e9), as data: real signatures
/// by secp256k1 rotation keys, a genesis whose DID is derived from it, and the `nullified`
/// flags the directory computed. Its second `createdAt` (`2025-07-1T…`) is not RFC 3339 as
/// written; [`fixed_log`] repairs that one field (signatures do not cover `createdAt`).
const NULLIFICATION_LOG: &str = include_str!("log_nullification_nontrivial.json");

fn fixed_log() -> Vec<Value> {
    let mut log: Vec<Value> = serde_json::from_str(NULLIFICATION_LOG).unwrap();
    assert_eq!(log[1]["createdAt"], "2025-07-1T00:00:01.000Z");
    log[1]["createdAt"] = "2025-07-01T00:00:01.000Z".into();
    log
}

fn apply_line(chain: &mut Chain, line: &Value, check: DidCheck) -> Result<Applied, Refusal> {
    let op = PlcOp::parse(&line["operation"])?;
    chain.apply(
        line["did"].as_str().unwrap(),
        &op,
        line["cid"].as_str().unwrap(),
        created_at_ms(line["createdAt"].as_str().unwrap())?,
        check,
    )
}

#[test]
fn a_real_log_folds_to_the_directorys_state_through_two_recoveries() {
    let log = fixed_log();
    let mut chain = Chain::default();
    let mut nullified = 0;
    for line in &log {
        let a = apply_line(&mut chain, line, DidCheck::Strict)
            .unwrap_or_else(|e| panic!("{}: {e}", line["cid"]));
        nullified += a.nullified;
        assert!(!a.did_underived);
    }
    // The directory flagged five operations nullified; op4 by op5, then op2, op3, op5, op6 by
    // op7 (op4 is counted once, by the recovery that removed it).
    let flagged = log.iter().filter(|l| l["nullified"] == true).count();
    assert_eq!(flagged, 5);
    assert_eq!(nullified, 5);
    let head = chain.entries.last().unwrap();
    assert_eq!(head.cid, log[7]["cid"].as_str().unwrap());
    let state = chain.state().unwrap();
    assert_eq!(state.also_known_as, ["at://op7"]);
    assert_eq!(
        state.to_json()["rotationKeys"],
        log[7]["operation"]["rotationKeys"]
    );
    // Every entry the chain kept is a live (not nullified) operation of the log.
    for e in &chain.entries {
        let line = log.iter().find(|l| l["cid"] == e.cid.as_str()).unwrap();
        assert_eq!(line["nullified"], false, "{}", e.cid);
    }
}

#[test]
fn the_genesis_derives_its_did_and_tampering_is_refused_by_reason() {
    let log = fixed_log();
    let genesis = PlcOp::parse(&log[0]["operation"]).unwrap();
    assert_eq!(genesis.derived_did(), log[0]["did"]);
    assert_eq!(genesis.cid.to_string(), log[0]["cid"]);

    // The unrepaired datetime is refused as malformed, not guessed.
    let raw: Vec<Value> = serde_json::from_str(NULLIFICATION_LOG).unwrap();
    let mut chain = Chain::default();
    apply_line(&mut chain, &raw[0], DidCheck::Strict).unwrap();
    let e = apply_line(&mut chain, &raw[1], DidCheck::Strict).unwrap_err();
    assert_eq!(e.reason(), "malformed");

    // A changed field under the export's CID: the CID no longer matches.
    let mut t = log[1].clone();
    t["operation"]["alsoKnownAs"][0] = "at://mallory".into();
    assert_eq!(
        apply_line(&mut chain, &t, DidCheck::Strict)
            .unwrap_err()
            .reason(),
        "cid_mismatch"
    );
    // The same with the CID recomputed: the signature no longer verifies.
    t["cid"] = PlcOp::parse(&t["operation"])
        .unwrap()
        .cid
        .to_string()
        .into();
    assert_eq!(
        apply_line(&mut chain, &t, DidCheck::Strict)
            .unwrap_err()
            .reason(),
        "bad_signature"
    );
    // Replayed: a duplicate. Out of order: an unknown prev. The genesis under another DID.
    assert_eq!(
        apply_line(&mut chain, &log[0], DidCheck::Strict)
            .unwrap_err()
            .reason(),
        "duplicate"
    );
    assert_eq!(
        apply_line(&mut chain, &log[2], DidCheck::Strict)
            .unwrap_err()
            .reason(),
        "unknown_prev"
    );
    let mut other = log[0].clone();
    other["did"] = "did:plc:aaaaaaaaaaaaaaaaaaaaaaaa".into();
    assert_eq!(
        apply_line(&mut Chain::default(), &other, DidCheck::Strict)
            .unwrap_err()
            .reason(),
        "did_mismatch"
    );
    let a = apply_line(&mut Chain::default(), &other, DidCheck::Count).unwrap();
    assert!(a.did_underived);
    // Nothing refused changed the chain.
    assert_eq!(chain.entries.len(), 1);
    assert_eq!(chain.entries[0].cid, log[0]["cid"].as_str().unwrap());
}

fn key(n: u8) -> PrivateKey {
    PrivateKey::from_bytes(Curve::Secp256k1, &[n; 32]).unwrap()
}

fn did_key(k: &PrivateKey) -> String {
    k.public_key().to_did_key()
}

fn update(prev: Option<&str>, rotation: &[&PrivateKey], handle: &str) -> Value {
    json!({
        "type": "plc_operation",
        "prev": prev,
        "rotationKeys": rotation.iter().map(|k| did_key(k)).collect::<Vec<_>>(),
        "verificationMethods": {"atproto": did_key(&key(9))},
        "alsoKnownAs": [format!("at://{handle}")],
        "services": {"atproto_pds": {"type": "AtprotoPersonalDataServer", "endpoint": "https://pds.example"}},
    })
}

const HOUR: i64 = 3600 * 1000;

#[test]
fn forks_need_a_higher_key_within_72_hours_and_tombstones_end_the_log() {
    let (hi, lo) = (key(1), key(2));
    let (g, gcid) = sign_op(&update(None, &[&hi, &lo], "a.example"), &lo).unwrap();
    let g = PlcOp::parse(&g).unwrap();
    let did = g.derived_did();
    let mut chain = Chain::default();
    let gs = gcid.to_string();
    chain.apply(&did, &g, &gs, 0, DidCheck::Strict).unwrap();
    assert_eq!(chain.entries[0].signer, 1);
    // An update signed by the low-priority key.
    let (u, ucid) = sign_op(&update(Some(&gs), &[&hi, &lo], "b.example"), &lo).unwrap();
    let u = PlcOp::parse(&u).unwrap();
    chain
        .apply(&did, &u, &ucid.to_string(), HOUR, DidCheck::Strict)
        .unwrap();
    // A fork from the genesis signed by the same (low) key: refused.
    let (f, fcid) = sign_op(&update(Some(&gs), &[&hi], "c.example"), &lo).unwrap();
    let f = PlcOp::parse(&f).unwrap();
    let e = chain.apply(&did, &f, &fcid.to_string(), 2 * HOUR, DidCheck::Strict);
    assert_eq!(e.unwrap_err().reason(), "fork_priority");
    // By the high key but 73 hours after the update: too late.
    let (f, fcid) = sign_op(&update(Some(&gs), &[&hi], "c.example"), &hi).unwrap();
    let f = PlcOp::parse(&f).unwrap();
    let e = chain.apply(&did, &f, &fcid.to_string(), 74 * HOUR, DidCheck::Strict);
    assert_eq!(e.unwrap_err().reason(), "fork_too_late");
    // In time: the update is nullified.
    let a = chain
        .apply(&did, &f, &fcid.to_string(), 70 * HOUR, DidCheck::Strict)
        .unwrap();
    assert_eq!(a.nullified, 1);
    assert_eq!(chain.state().unwrap().also_known_as, ["at://c.example"]);
    // A tombstone, then nothing but a recovery.
    let head = chain.entries.last().unwrap().cid.clone();
    let (t, tcid) = sign_op(&json!({"type": "plc_tombstone", "prev": head}), &hi).unwrap();
    let t = PlcOp::parse(&t).unwrap();
    chain
        .apply(&did, &t, &tcid.to_string(), 71 * HOUR, DidCheck::Strict)
        .unwrap();
    assert!(chain.tombstoned());
    assert!(chain.state().is_none());
    let (n, ncid) = sign_op(&update(Some(&tcid.to_string()), &[&hi], "d.example"), &hi).unwrap();
    let n = PlcOp::parse(&n).unwrap();
    let e = chain.apply(&did, &n, &ncid.to_string(), 72 * HOUR, DidCheck::Strict);
    assert_eq!(e.unwrap_err().reason(), "after_tombstone");
    // The chain survives its stored form.
    assert_eq!(Chain::from_json(&chain.to_json()).unwrap(), chain);
}

#[test]
fn a_legacy_create_folds_as_the_spec_maps_it() {
    let (signing, recovery) = (key(3), key(4));
    let (op, cid) = sign_op(
        &json!({
            "type": "create",
            "prev": null,
            "signingKey": did_key(&signing),
            "recoveryKey": did_key(&recovery),
            "handle": "old.example",
            "service": "pds.example",
        }),
        &signing,
    )
    .unwrap();
    let op = PlcOp::parse(&op).unwrap();
    let did = op.derived_did();
    let mut chain = Chain::default();
    chain
        .apply(&did, &op, &cid.to_string(), 0, DidCheck::Strict)
        .unwrap();
    let s = chain.state().unwrap();
    assert_eq!(s.rotation_keys, [did_key(&recovery), did_key(&signing)]);
    let doc = s.to_doc(&did).unwrap();
    assert_eq!(doc.handle().unwrap().as_str(), "old.example");
    assert_eq!(doc.pds(), Some("https://pds.example"));
    assert_eq!(doc.signing_key().unwrap(), signing.public_key());
    assert_eq!(doc.did().as_str(), did);
}
