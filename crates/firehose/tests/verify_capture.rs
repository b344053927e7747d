#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Verification of the real relay capture (`jetstream-2026-07`) with the keys of its DID
//! documents, and one tampered frame per verdict, each built by re-encoding so that only the
//! intended check can fail.

use riptide_testdata as common;

use std::cell::Cell;
use std::collections::{BTreeMap, HashMap};

use riptide_car::{write_car, CarOptions, CarReader};
use riptide_cbor::{Arena, CidBuf, Options, OwnedValue, DAG_CBOR};
use riptide_crypto::{Curve, PrivateKey, PublicKey, VerifyError};
use riptide_firehose::corpus::split_frames;
use riptide_firehose::verify::{
    Failure, KeyLookup, KeyUnavailable, Verdict, VerdictCounts, Verifier, MAX_BLOCKS_BYTES,
    MAX_OPS, MAX_RECORD_BYTES,
};
use riptide_firehose::FrameErrorKind;

type Keys = HashMap<String, PublicKey>;

fn keys() -> Option<Keys> {
    let docs: serde_json::Value =
        serde_json::from_slice(&common::read("jetstream-2026-07/did_docs.json")?).unwrap();
    let mut keys = HashMap::new();
    for (did, doc) in docs.as_object().unwrap() {
        let vm = doc["verificationMethod"]
            .as_array()
            .unwrap()
            .iter()
            .find(|vm| vm["id"].as_str().unwrap().ends_with("#atproto"))
            .unwrap();
        let key = PublicKey::from_verification_method(
            vm["type"].as_str().unwrap(),
            vm["publicKeyMultibase"].as_str().unwrap(),
        )
        .unwrap();
        keys.insert(did.clone(), key);
    }
    Some(keys)
}

fn capture() -> Option<(Vec<Vec<u8>>, Keys)> {
    let file = common::read("jetstream-2026-07/firehose-frames.bin")?;
    let frames = split_frames(&file)
        .unwrap()
        .iter()
        .map(|f| f.bytes.to_vec())
        .collect();
    Some((frames, keys()?))
}

#[test]
fn every_frame_of_the_capture_verifies() {
    let Some((frames, keys)) = capture() else {
        return;
    };
    let mut v = Verifier::new(&keys);
    let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, f) in frames.iter().enumerate() {
        let r = v.check(f);
        assert_eq!(r.verdict, Verdict::Ok, "frame {i}: {:?}", r.failure);
        assert!(r.failure.is_none());
        assert!(r.seq.is_some() && r.did.is_some_and(|d| d.starts_with("did:")));
        *kinds.entry(r.kind).or_default() += 1;
    }
    assert_eq!(v.counts().get(Verdict::Ok), 150);
    assert_eq!(v.counts().failed(), 0);
    assert_eq!(
        kinds,
        BTreeMap::from([("account", 1), ("commit", 148), ("identity", 1)])
    );
    assert_eq!(v.counts().to_string(), "ok 150");
}

/// The capture's commits in relay order, grouped by account: (frame index, did, rev).
fn commits_by_did(frames: &[Vec<u8>]) -> BTreeMap<String, Vec<usize>> {
    let mut arena = Arena::new();
    let mut by: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (i, f) in frames.iter().enumerate() {
        let p = riptide_firehose::verify::peek(&mut arena, f);
        if p.kind == "commit" {
            by.entry(p.did.unwrap().to_owned()).or_default().push(i);
        }
    }
    by
}

/// Chain state on real data: the capture verifies in order (each of its 148 commits is its
/// account's first in the window, so each establishes the account's chain), and the whole capture
/// replayed after itself is 148 rev-regressions; stateless, all of it passes. (Reordered and
/// dropped commits need accounts with several commits: the generated streams test those, in
/// riptide-gen's tests and `riptide verify`'s.)
#[test]
fn replayed_real_commits_are_rev_regressions() {
    let Some((frames, keys)) = capture() else {
        return;
    };
    let by = commits_by_did(&frames);
    assert_eq!(by.values().map(Vec::len).sum::<usize>(), 148);
    let mut v = Verifier::new(&keys);
    let mut s = Verifier::stateless(&keys);
    for f in &frames {
        assert_eq!(v.verify(f), Verdict::Ok);
        assert_eq!(s.verify(f), Verdict::Ok);
    }
    for f in &frames {
        let r = v.check(f);
        let want = if r.kind == "commit" {
            Verdict::RevRegression
        } else {
            Verdict::Ok
        };
        assert_eq!(r.verdict, want, "{:?}", r.failure);
        if let Some(why) = &r.failure {
            assert!(why
                .to_string()
                .contains("not later than the account's stored rev"));
        }
        assert_eq!(s.verify(f), Verdict::Ok);
    }
    assert_eq!(v.counts().get(Verdict::RevRegression), 148);
    assert_eq!(s.counts().get(Verdict::Ok), 300);
    assert_eq!(
        v.chain().len(),
        149,
        "148 committing accounts and the #account one"
    );
}

/// Future revs, judged by a clock set an hour before the capture: every commit is refused, the
/// identity and account frames pass, and nothing is established.
#[test]
fn real_commits_from_the_future_are_future_revs() {
    let Some((frames, keys)) = capture() else {
        return;
    };
    // 2026-07-04T13:40:00Z; the capture is from about 14:39.
    let before = 1_783_172_400_000_000;
    let mut v = Verifier::new(&keys).with_clock_us(before);
    for f in &frames {
        let r = v.check(f);
        let want = if r.kind == "commit" {
            Verdict::FutureRev
        } else {
            Verdict::Ok
        };
        assert_eq!(r.verdict, want);
    }
    assert_eq!(v.counts().get(Verdict::FutureRev), 148);
    assert_eq!(v.chain().iter().filter(|(_, s)| s.tip.is_some()).count(), 0);
    // An hour after: all ok.
    let mut v = Verifier::new(&keys).with_clock_us(before + 2 * 3_600_000_000);
    for f in &frames {
        assert_eq!(v.verify(f), Verdict::Ok);
    }
}

/// The capture's `#account` frame sets its account's hosting status: if it says inactive, a
/// commit of that account afterwards is `account-inactive`.
#[test]
fn the_real_account_frame_sets_the_hosting_status() {
    let Some((frames, keys)) = capture() else {
        return;
    };
    let mut arena = Arena::new();
    let (ai, adid) = frames
        .iter()
        .enumerate()
        .find_map(|(i, f)| {
            let p = riptide_firehose::verify::peek(&mut arena, f);
            (p.kind == "account").then(|| (i, p.did.unwrap().to_owned()))
        })
        .unwrap();
    let mut v = Verifier::new(&keys);
    assert_eq!(v.verify(&frames[ai]), Verdict::Ok);
    let st = v.chain().iter().find(|(d, _)| *d == adid).map(|(_, s)| *s);
    let st = st.expect("the account frame stored a state");
    // Whatever it said, a commit of another account is unaffected, and one of this account
    // (if it has any in the capture) meets the status.
    let by = commits_by_did(&frames);
    let other = by.iter().find(|(d, _)| **d != adid).unwrap().1[0];
    assert_eq!(v.verify(&frames[other]), Verdict::Ok);
    if let Some(own) = by.get(&adid) {
        let want = if st.hosting.is_active() {
            Verdict::Ok
        } else {
            Verdict::AccountInactive
        };
        assert_eq!(v.verify(&frames[own[0]]), want);
    }
}

/// A frame taken apart: header, payload, and its CAR's roots and blocks.
#[derive(Clone)]
struct Parts {
    header: OwnedValue,
    payload: BTreeMap<String, OwnedValue>,
    roots: Vec<CidBuf>,
    blocks: Vec<(CidBuf, Vec<u8>)>,
}

fn split(frame: &[u8]) -> Parts {
    let mut arena = Arena::new();
    let mut tape = arena.tape(frame);
    let (h, end) = tape
        .decode_prefix(0..frame.len(), &Options::strict())
        .unwrap();
    let p = tape.decode(end..frame.len(), &Options::strict()).unwrap();
    let doc = tape.finish();
    let header = OwnedValue::from_value(doc.value(h)).unwrap();
    let OwnedValue::Map(payload) = OwnedValue::from_value(doc.value(p)).unwrap() else {
        panic!()
    };
    let (mut roots, mut blocks) = (Vec::new(), Vec::new());
    if let Some(OwnedValue::Bytes(car)) = payload.get("blocks") {
        let mut reader = CarReader::new();
        let car = reader.read(car, &CarOptions::default()).unwrap();
        roots = car.roots().map(|r| r.to_buf()).collect();
        blocks = car
            .blocks()
            .map(|b| (b.cid.to_buf(), b.data.to_vec()))
            .collect();
    }
    Parts {
        header,
        payload,
        roots,
        blocks,
    }
}

fn join(p: &Parts) -> Vec<u8> {
    let mut payload = p.payload.clone();
    if payload.contains_key("blocks") {
        let car = write_car(
            &p.roots,
            p.blocks.iter().map(|(c, d)| (c.as_cid(), d.as_slice())),
        );
        payload.insert("blocks".into(), OwnedValue::Bytes(car));
    }
    let mut out = p.header.to_cbor();
    OwnedValue::Map(payload).encode(&mut out);
    out
}

fn link(p: &Parts, field: &str) -> CidBuf {
    match p.payload.get(field) {
        Some(OwnedValue::Link(c)) => *c,
        other => panic!("{field}: {other:?}"),
    }
}

fn text(p: &Parts, field: &str) -> String {
    match p.payload.get(field) {
        Some(OwnedValue::Text(s)) => s.clone(),
        other => panic!("{field}: {other:?}"),
    }
}

fn block_map(data: &[u8]) -> BTreeMap<String, OwnedValue> {
    let mut arena = Arena::new();
    let mut tape = arena.tape(data);
    let item = tape.decode(0..data.len(), &Options::strict()).unwrap();
    match OwnedValue::from_value(tape.value(item)).unwrap() {
        OwnedValue::Map(m) => m,
        _ => panic!("not a map"),
    }
}

/// Rewrites the commit block with `f`, then re-addresses it: new CID in the CAR (block and root)
/// and in the frame's `commit`, so every block still hashes to its CID.
fn rewrite_commit(p: &mut Parts, f: impl FnOnce(&mut BTreeMap<String, OwnedValue>)) {
    let old = link(p, "commit");
    let i = p.blocks.iter().position(|(c, _)| *c == old).unwrap();
    let mut m = block_map(&p.blocks[i].1);
    f(&mut m);
    let bytes = OwnedValue::Map(m).to_cbor();
    let new = CidBuf::sha256(DAG_CBOR, &bytes);
    p.blocks[i] = (new, bytes);
    for r in &mut p.roots {
        if *r == old {
            *r = new;
        }
    }
    p.payload.insert("commit".into(), OwnedValue::Link(new));
}

fn sig_mut(m: &mut BTreeMap<String, OwnedValue>) -> &mut Vec<u8> {
    match m.get_mut("sig") {
        Some(OwnedValue::Bytes(s)) => s,
        other => panic!("sig: {other:?}"),
    }
}

/// The first commit frame with at least one create, its parts, and the keys.
fn sample() -> Option<(Parts, Keys, Vec<Vec<u8>>)> {
    let (frames, keys) = capture()?;
    let p = frames
        .iter()
        .map(|f| split(f))
        .find(|p| {
            matches!(&p.header, OwnedValue::Map(h) if h.get("t") == Some(&OwnedValue::Text("#commit".into())))
                && matches!(p.payload.get("ops"), Some(OwnedValue::Array(ops)) if ops.iter().any(|op| op.get("action") == Some(&OwnedValue::Text("create".into()))))
        })
        .unwrap();
    Some((p, keys, frames))
}

fn verdict_of(frame: &[u8], keys: &Keys) -> (Verdict, Option<Failure>) {
    let r = Verifier::new(keys).check(frame);
    (r.verdict, r.failure)
}

#[test]
fn reencoding_untouched_parts_gives_the_same_frame() {
    let Some((p, keys, frames)) = sample() else {
        return;
    };
    let again = join(&p);
    assert!(
        frames.contains(&again),
        "split/join must be the identity on a real frame"
    );
    assert_eq!(verdict_of(&again, &keys).0, Verdict::Ok);
}

#[test]
fn a_changed_block_byte_is_bad_block_cid() {
    let Some((mut p, keys, _)) = sample() else {
        return;
    };
    let last = p.blocks.len() - 1;
    let n = p.blocks[last].1.len();
    p.blocks[last].1[n / 2] ^= 0x01;
    assert_eq!(verdict_of(&join(&p), &keys).0, Verdict::BadBlockCid);
}

#[test]
fn a_changed_signature_byte_readdressed_is_bad_signature() {
    let Some((mut p, keys, _)) = sample() else {
        return;
    };
    rewrite_commit(&mut p, |m| sig_mut(m)[5] ^= 0x01); // a byte of r: s stays low
    let (v, f) = verdict_of(&join(&p), &keys);
    assert_eq!(v, Verdict::BadSignature);
    assert_eq!(f, Some(Failure::Signature(VerifyError::BadSignature)));
}

#[test]
fn another_accounts_key_is_bad_signature() {
    let Some((p, mut keys, _)) = sample() else {
        return;
    };
    let did = text(&p, "repo");
    let other = keys
        .iter()
        .find(|(d, _)| **d != did)
        .map(|(_, k)| k.clone())
        .unwrap();
    keys.insert(did, other);
    assert_eq!(verdict_of(&join(&p), &keys).0, Verdict::BadSignature);
}

#[test]
fn high_s_readdressed_is_bad_signature() {
    // secp256k1 group order n, big-endian; every account of the capture uses secp256k1.
    const N: [u8; 32] = [
        0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
        0xfe, 0xba, 0xae, 0xdc, 0xe6, 0xaf, 0x48, 0xa0, 0x3b, 0xbf, 0xd2, 0x5e, 0x8c, 0xd0, 0x36,
        0x41, 0x41,
    ];
    let Some((mut p, keys, _)) = sample() else {
        return;
    };
    assert_eq!(keys[&text(&p, "repo")].curve(), Curve::Secp256k1);
    rewrite_commit(&mut p, |m| {
        let sig = sig_mut(m);
        let mut borrow = 0i16;
        for i in (0..32).rev() {
            let mut d = i16::from(N[i]) - i16::from(sig[32 + i]) - borrow;
            borrow = i16::from(d < 0);
            if d < 0 {
                d += 256;
            }
            sig[32 + i] = d as u8;
        }
    });
    let (v, f) = verdict_of(&join(&p), &keys);
    assert_eq!(v, Verdict::BadSignature);
    assert_eq!(f, Some(Failure::Signature(VerifyError::HighS)));
}

#[test]
fn dropping_the_mst_root_is_missing_block_and_no_node_drop_is_anything_else() {
    let Some((frames, keys)) = capture() else {
        return;
    };
    let mut dropped_root = 0;
    for f in &frames {
        let p = split(f);
        if !p.payload.contains_key("ops") {
            continue;
        }
        let commit = p
            .blocks
            .iter()
            .find(|(c, _)| *c == link(&p, "commit"))
            .unwrap();
        let OwnedValue::Link(data) = block_map(&commit.1)["data"] else {
            panic!()
        };
        for i in 0..p.blocks.len() {
            let m = block_map(&p.blocks[i].1);
            let is_node = m.contains_key("e") && m.contains_key("l") && m.len() == 2;
            if !is_node {
                continue;
            }
            let mut q = p.clone();
            q.blocks.remove(i);
            let (v, fail) = verdict_of(&join(&q), &keys);
            if p.blocks[i].0 == data {
                assert_eq!(v, Verdict::MissingBlock, "{fail:?}");
                dropped_root += 1;
            } else {
                assert!(
                    matches!(v, Verdict::MissingBlock | Verdict::Ok),
                    "{v}: {fail:?}"
                );
            }
        }
    }
    assert_eq!(dropped_root, 148);
}

#[test]
fn a_dropped_commit_or_record_block_is_missing_block() {
    let Some((p, keys, _)) = sample() else { return };
    let mut q = p.clone();
    q.blocks.retain(|(c, _)| *c != link(&p, "commit"));
    assert_eq!(
        verdict_of(&join(&q), &keys),
        (
            Verdict::MissingBlock,
            Some(Failure::CommitMissing(link(&p, "commit")))
        )
    );
    let OwnedValue::Array(ops) = &p.payload["ops"] else {
        panic!()
    };
    let created = ops.iter().find_map(|op| match op.get("cid") {
        Some(OwnedValue::Link(c)) => Some(*c),
        _ => None,
    });
    let mut q = p.clone();
    q.blocks.retain(|(c, _)| Some(*c) != created);
    assert_eq!(verdict_of(&join(&q), &keys).0, Verdict::MissingBlock);
}

#[test]
fn a_changed_prev_data_is_inversion_mismatch() {
    let Some((mut p, keys, _)) = sample() else {
        return;
    };
    p.payload.insert(
        "prevData".into(),
        OwnedValue::Link(CidBuf::sha256(DAG_CBOR, b"another tree")),
    );
    assert_eq!(verdict_of(&join(&p), &keys).0, Verdict::InversionMismatch);
    p.payload.remove("prevData");
    assert_eq!(
        verdict_of(&join(&p), &keys),
        (Verdict::Malformed, Some(Failure::NoPrevData))
    );
}

#[test]
fn an_unknown_did_is_unknown_key() {
    let Some((frames, _)) = capture() else { return };
    let none: Keys = HashMap::new();
    let mut v = Verifier::new(&none);
    for f in &frames {
        v.verify(f);
    }
    assert_eq!(v.counts().get(Verdict::UnknownKey), 148);
    assert_eq!(v.counts().get(Verdict::Ok), 2); // identity and account need no key
}

#[test]
fn over_the_limits_is_limits() {
    let Some((p, keys, _)) = sample() else { return };
    // 201 ops (well-formed creates of distinct paths).
    let mut q = p.clone();
    let OwnedValue::Array(ops) = &p.payload["ops"] else {
        panic!()
    };
    let op = ops[0].clone();
    let many: Vec<OwnedValue> = (0..=MAX_OPS)
        .map(|i| {
            let OwnedValue::Map(mut m) = op.clone() else {
                panic!()
            };
            m.insert(
                "path".into(),
                OwnedValue::Text(format!("app.bsky.feed.like/3kaaaaaaa{i:04}")),
            );
            OwnedValue::Map(m)
        })
        .collect();
    q.payload.insert("ops".into(), OwnedValue::Array(many));
    assert_eq!(
        verdict_of(&join(&q), &keys),
        (Verdict::Limits, Some(Failure::TooManyOps(MAX_OPS + 1)))
    );
    // A CAR over 2 MiB (an extra, correctly addressed block).
    let mut q = p.clone();
    let big = vec![0x41u8; 2 << 20];
    q.blocks
        .push((CidBuf::sha256(riptide_cbor::RAW, &big), big));
    assert_eq!(verdict_of(&join(&q), &keys).0, Verdict::Limits);
    // The sync spec's limit is 2,000,000 bytes, below 2 MiB: a CAR in between is over it.
    let mut q = p.clone();
    let big = vec![0x41u8; MAX_BLOCKS_BYTES - 1000];
    q.blocks
        .push((CidBuf::sha256(riptide_cbor::RAW, &big), big));
    let frame = join(&q);
    let (verdict, failure) = verdict_of(&frame, &keys);
    let Some(Failure::BlocksTooLarge(n)) = failure else {
        panic!("{verdict:?} {failure:?}")
    };
    assert!(n > MAX_BLOCKS_BYTES && n < 2 << 20, "{n}");
    assert_eq!(verdict, Verdict::Limits);
    // And one block just under it still passes the limits (the extra block is unreferenced).
    let mut q = p.clone();
    let fits = vec![0x41u8; MAX_RECORD_BYTES];
    q.blocks
        .push((CidBuf::sha256(riptide_cbor::RAW, &fits), fits));
    assert_eq!(verdict_of(&join(&q), &keys), (Verdict::Ok, None));
    // A record block over 1,000,000 bytes that an op points to.
    let mut q = p.clone();
    let record = vec![0x41u8; MAX_RECORD_BYTES + 1];
    let cid = CidBuf::sha256(riptide_cbor::RAW, &record);
    q.blocks.push((cid, record));
    let Some(OwnedValue::Array(ops)) = q.payload.get_mut("ops") else {
        panic!()
    };
    let OwnedValue::Map(mut op) = ops[0].clone() else {
        panic!()
    };
    op.insert(
        "path".into(),
        OwnedValue::Text("app.bsky.feed.post/3kbig".into()),
    );
    op.insert("action".into(), OwnedValue::Text("create".into()));
    op.insert("cid".into(), OwnedValue::Link(cid));
    op.remove("prev");
    ops.push(OwnedValue::Map(op));
    assert_eq!(
        verdict_of(&join(&q), &keys),
        (
            Verdict::Limits,
            Some(Failure::RecordTooLarge {
                path: "app.bsky.feed.post/3kbig".into(),
                bytes: MAX_RECORD_BYTES + 1
            })
        )
    );
}

#[test]
fn commit_and_frame_must_agree() {
    let Some((p, keys, _)) = sample() else { return };
    let rev = text(&p, "rev");
    // The frame's rev differs from the (signed) commit's.
    let mut q = p.clone();
    q.payload
        .insert("rev".into(), OwnedValue::Text("2222222222222".into()));
    assert!(matches!(
        verdict_of(&join(&q), &keys),
        (
            Verdict::Malformed,
            Some(Failure::Mismatch { field: "rev", .. })
        )
    ));
    // since not before rev.
    let mut q = p.clone();
    q.payload
        .insert("since".into(), OwnedValue::Text(rev.clone()));
    assert!(matches!(
        verdict_of(&join(&q), &keys),
        (Verdict::Malformed, Some(Failure::RevNotAfterSince { .. }))
    ));
    // A CAR rooted elsewhere than at the commit.
    let mut q = p.clone();
    q.roots = vec![CidBuf::sha256(DAG_CBOR, b"elsewhere")];
    assert_eq!(
        verdict_of(&join(&q), &keys),
        (Verdict::Malformed, Some(Failure::RootNotCommit))
    );
    // The frame names another repo than the commit.
    let mut q = p.clone();
    q.payload.insert(
        "repo".into(),
        OwnedValue::Text("did:plc:aaaaaaaaaaaaaaaaaaaaaaaa".into()),
    );
    assert!(matches!(
        verdict_of(&join(&q), &keys),
        (
            Verdict::Malformed,
            Some(Failure::Mismatch { field: "did", .. })
        )
    ));
}

#[test]
fn sync_frames_check_the_commit_signature() {
    let Some((p, keys, _)) = sample() else { return };
    let commit = link(&p, "commit");
    let block = p.blocks.iter().find(|(c, _)| *c == commit).unwrap().clone();
    let mut payload = BTreeMap::new();
    for k in ["seq", "rev", "time"] {
        payload.insert(k.to_string(), p.payload[k].clone());
    }
    payload.insert("did".into(), p.payload["repo"].clone());
    payload.insert("blocks".into(), OwnedValue::Bytes(Vec::new()));
    let header = OwnedValue::Map(BTreeMap::from([
        ("op".to_string(), OwnedValue::Int(1)),
        ("t".to_string(), OwnedValue::Text("#sync".into())),
    ]));
    let mut s = Parts {
        header,
        payload,
        roots: vec![commit],
        blocks: vec![block],
    };
    let frame = join(&s);
    let r = Verifier::new(&keys).check(&frame);
    assert_eq!(
        (r.kind, r.verdict),
        ("sync", Verdict::Ok),
        "{:?}",
        r.failure
    );
    s.blocks[0].1 = {
        let mut m = block_map(&s.blocks[0].1);
        sig_mut(&mut m)[3] ^= 1;
        OwnedValue::Map(m).to_cbor()
    };
    s.blocks[0].0 = CidBuf::sha256(DAG_CBOR, &s.blocks[0].1);
    s.roots = vec![s.blocks[0].0];
    assert_eq!(verdict_of(&join(&s), &keys).0, Verdict::BadSignature);
}

/// Counts lookups, to see the per-DID cache at work.
struct Counting<'k> {
    keys: &'k Keys,
    calls: Cell<usize>,
}

impl KeyLookup for Counting<'_> {
    fn key(&self, did: &str) -> Result<PublicKey, KeyUnavailable> {
        self.calls.set(self.calls.get() + 1);
        self.keys.key(did)
    }
}

#[test]
fn keys_are_cached_per_did_until_an_identity_frame() {
    let Some((p, keys, _)) = sample() else { return };
    let frame = join(&p);
    let did = text(&p, "repo");
    let lookup = Counting {
        keys: &keys,
        calls: Cell::new(0),
    };
    // The same frame three times: stateless, or the repeats would be replays.
    let mut v = Verifier::stateless(&lookup);
    for _ in 0..3 {
        assert_eq!(v.verify(&frame), Verdict::Ok);
    }
    assert_eq!(lookup.calls.get(), 1);
    assert_eq!(v.cached_keys(), 1);
    let identity = {
        let mut payload = BTreeMap::new();
        payload.insert("seq".to_string(), OwnedValue::Int(1));
        payload.insert("did".to_string(), OwnedValue::Text(did));
        payload.insert(
            "time".to_string(),
            OwnedValue::Text("2026-07-04T14:39:14.000Z".into()),
        );
        let header = OwnedValue::Map(BTreeMap::from([
            ("op".to_string(), OwnedValue::Int(1)),
            ("t".to_string(), OwnedValue::Text("#identity".into())),
        ]));
        join(&Parts {
            header,
            payload,
            roots: vec![],
            blocks: vec![],
        })
    };
    assert_eq!(v.verify(&identity), Verdict::Ok);
    assert_eq!(v.verify(&frame), Verdict::Ok);
    assert_eq!(lookup.calls.get(), 2);
    let mut counts = VerdictCounts::new();
    counts.merge(v.counts());
    counts.merge(v.counts());
    assert_eq!(counts.get(Verdict::Ok), 10);
}

#[test]
fn undecodable_frames_still_report_what_can_be_read() {
    let Some((p, keys, _)) = sample() else { return };
    let frame = join(&p);
    let mut v = Verifier::new(&keys);
    // Truncated inside the payload: the header still says commit.
    let r = v.check(&frame[..frame.len() / 2]);
    assert_eq!((r.kind, r.verdict), ("commit", Verdict::Malformed));
    // A tampered block: everything but the CAR reads.
    let mut q = p.clone();
    q.blocks[0].1[0] ^= 0x20;
    let bad = join(&q);
    let r = v.check(&bad);
    assert_eq!(r.verdict, Verdict::BadBlockCid);
    assert_eq!(r.did, Some(text(&p, "repo").as_str()));
    assert!(r.seq.is_some());
    // Not CBOR at all.
    let r = v.check(&[0xff, 0x00]);
    assert_eq!(
        (r.kind, r.verdict, r.did),
        ("invalid", Verdict::Malformed, None)
    );
    assert_eq!(v.counts().failed(), 3);
}

/// A synthetic P-256 account: one create on an empty repository, built from scratch with the
/// repo crate's MST builder, signed with a P-256 key. The capture has no P-256 account.
#[test]
fn a_synthetic_p256_commit_verifies_and_its_forgery_does_not() {
    let did = "did:plc:p256p256p256p256p256p256";
    let signer = PrivateKey::from_bytes(Curve::P256, &[9; 32]).unwrap();
    let record = OwnedValue::Map(BTreeMap::from([
        (
            "$type".to_string(),
            OwnedValue::Text("app.bsky.feed.like".into()),
        ),
        (
            "createdAt".to_string(),
            OwnedValue::Text("2026-07-04T14:39:14.000Z".into()),
        ),
    ]))
    .to_cbor();
    let record_cid = CidBuf::sha256(DAG_CBOR, &record);
    let path = "app.bsky.feed.like/3lqdkdjpy6t2e";
    let (data, nodes) = riptide_repo::mst::build(&vec![(path.to_string(), record_cid)]).unwrap();
    let (prev_data, _) = riptide_repo::mst::build(&Vec::<(String, CidBuf)>::new()).unwrap();
    let rev = "3migo7fijwi2k";
    let mut commit = BTreeMap::from([
        ("did".to_string(), OwnedValue::Text(did.into())),
        ("version".to_string(), OwnedValue::Int(3)),
        ("data".to_string(), OwnedValue::Link(data)),
        ("rev".to_string(), OwnedValue::Text(rev.into())),
        ("prev".to_string(), OwnedValue::Null),
    ]);
    let unsigned = OwnedValue::Map(commit.clone()).to_cbor();
    commit.insert(
        "sig".into(),
        OwnedValue::Bytes(signer.sign(&unsigned).to_vec()),
    );
    let commit = OwnedValue::Map(commit).to_cbor();
    let commit_cid = CidBuf::sha256(DAG_CBOR, &commit);
    let mut blocks = vec![(commit_cid, commit), (record_cid, record)];
    blocks.extend(nodes);
    let op = OwnedValue::Map(BTreeMap::from([
        ("action".to_string(), OwnedValue::Text("create".into())),
        ("path".to_string(), OwnedValue::Text(path.into())),
        ("cid".to_string(), OwnedValue::Link(record_cid)),
        ("prev".to_string(), OwnedValue::Null),
    ]));
    let payload = BTreeMap::from([
        ("seq".to_string(), OwnedValue::Int(7)),
        ("repo".to_string(), OwnedValue::Text(did.into())),
        ("rev".to_string(), OwnedValue::Text(rev.into())),
        ("since".to_string(), OwnedValue::Null),
        ("commit".to_string(), OwnedValue::Link(commit_cid)),
        (
            "time".to_string(),
            OwnedValue::Text("2026-07-04T14:39:14.000Z".into()),
        ),
        ("tooBig".to_string(), OwnedValue::Bool(false)),
        ("rebase".to_string(), OwnedValue::Bool(false)),
        ("prevData".to_string(), OwnedValue::Link(prev_data)),
        ("blocks".to_string(), OwnedValue::Bytes(Vec::new())),
        ("ops".to_string(), OwnedValue::Array(vec![op])),
        ("blobs".to_string(), OwnedValue::Array(vec![])),
    ]);
    let header = OwnedValue::Map(BTreeMap::from([
        ("op".to_string(), OwnedValue::Int(1)),
        ("t".to_string(), OwnedValue::Text("#commit".into())),
    ]));
    let mut p = Parts {
        header,
        payload,
        roots: vec![commit_cid],
        blocks,
    };
    let keys: Keys = HashMap::from([(did.to_string(), signer.public_key())]);
    let (v, f) = verdict_of(&join(&p), &keys);
    assert_eq!(v, Verdict::Ok, "{f:?}");
    rewrite_commit(&mut p, |m| sig_mut(m)[0] ^= 0x80);
    assert_eq!(verdict_of(&join(&p), &keys).0, Verdict::BadSignature);
}

#[test]
fn a_record_that_is_not_strict_dag_cbor_is_malformed() {
    // The verifier decodes records itself (not through the frame decoder): a created record
    // replaced by a float-bearing map, re-addressed so every block still hashes to its CID, must
    // fail as a block that does not decode, before the proof is looked at.
    let Some((mut p, keys, _)) = sample() else {
        return;
    };
    let OwnedValue::Array(mut ops) = p.payload["ops"].clone() else {
        panic!()
    };
    let op = ops
        .iter_mut()
        .find(|op| op.get("action") == Some(&OwnedValue::Text("create".into())))
        .unwrap();
    let OwnedValue::Map(op) = op else { panic!() };
    let Some(OwnedValue::Link(old)) = op.get("cid").cloned() else {
        panic!()
    };
    // {"$type": "x", "n": 1.5} with a float64: outside the atproto data model.
    let mut bytes = vec![0xa2, 0x61, b'n', 0xfb];
    bytes.extend_from_slice(&1.5f64.to_be_bytes());
    bytes.extend_from_slice(&[0x65, b'$', b't', b'y', b'p', b'e', 0x61, b'x']);
    let new = CidBuf::sha256(DAG_CBOR, &bytes);
    let i = p.blocks.iter().position(|(c, _)| *c == old).unwrap();
    p.blocks[i] = (new, bytes);
    op.insert("cid".into(), OwnedValue::Link(new));
    p.payload.insert("ops".into(), OwnedValue::Array(ops));
    let (verdict, failure) = verdict_of(&join(&p), &keys);
    assert_eq!(verdict, Verdict::Malformed);
    match failure {
        Some(Failure::Frame(e)) => assert_eq!(
            e.kind(),
            &FrameErrorKind::BlockCbor(i, riptide_cbor::ErrorKind::Float)
        ),
        other => panic!("{other:?}"),
    }
}

/// Every real frame kind with its account's DID replaced by something that is not a DID is
/// `malformed`, and the decoder says which field and why: the DID becomes a store key downstream
/// (an empty one once panicked `riptide serve`'s writer), so it is checked where it is decoded.
#[test]
fn a_frame_whose_did_is_not_a_did_is_malformed() {
    let Some((frames, keys)) = capture() else {
        return;
    };
    let mut kinds = BTreeMap::new();
    for f in &frames {
        let p = split(f);
        let OwnedValue::Map(h) = &p.header else {
            continue;
        };
        let Some(OwnedValue::Text(t)) = h.get("t") else {
            continue;
        };
        let field = if t == "#commit" { "repo" } else { "did" };
        if !p.payload.contains_key(field) || kinds.contains_key(t) {
            continue;
        }
        // The frame as it came verifies (or at least decodes), so only the DID can fail it.
        let mut d = riptide_firehose::FrameDecoder::new();
        assert!(d.decode(f).is_ok(), "{t}: the real frame decodes");
        for bad in [
            "",
            "not-a-did",
            "did:plc:",
            "DID:plc:abc",
            "did:plc:a\u{0}b",
        ] {
            let mut q = p.clone();
            q.payload
                .insert(field.into(), OwnedValue::Text(bad.to_owned()));
            let frame = join(&q);
            let e = d.decode(&frame).expect_err(bad);
            assert!(
                matches!(e.kind(), FrameErrorKind::BadDid(name, _) if *name == field),
                "{t} {bad:?}: {e}"
            );
            assert!(e.to_string().contains("not a valid DID"), "{e}");
            let r = Verifier::new(&keys).check(&frame);
            assert_eq!(r.verdict, Verdict::Malformed, "{t} {bad:?}");
        }
        kinds.insert(t.clone(), ());
    }
    // The capture has commits, identity and account frames (and #sync ones).
    for t in ["#commit", "#identity", "#account"] {
        assert!(kinds.contains_key(t), "the capture has a {t} frame");
    }
}
