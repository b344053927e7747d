//! atproto interop test vectors (bluesky-social/atproto-interop-tests): MST key heights, common
//! prefixes, example keys, and Sync 1.1 commit-proof fixtures.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::{BTreeSet, HashMap};

use riptide_cbor::CidBuf;
use riptide_repo::mst::{self, invert};
use riptide_repo::{Action, ProofOp, Tree};

#[test]
fn key_heights() {
    let Some(v) = common::json("interop/mst/key_heights.json") else {
        return;
    };
    let cases = v.as_array().expect("array");
    assert!(cases.len() >= 9);
    for c in cases {
        let key = c["key"].as_str().expect("key");
        let want = c["height"].as_u64().expect("height") as u32;
        assert_eq!(mst::key_height(key.as_bytes()), want, "{key:?}");
    }
}

#[test]
fn common_prefixes() {
    let Some(v) = common::json("interop/mst/common_prefix.json") else {
        return;
    };
    let cases = v.as_array().expect("array");
    assert!(cases.len() >= 13);
    for c in cases {
        let (l, r) = (
            c["left"].as_str().expect("left"),
            c["right"].as_str().expect("right"),
        );
        let want = c["len"].as_u64().expect("len") as usize;
        assert_eq!(
            mst::common_prefix_len(l.as_bytes(), r.as_bytes()),
            want,
            "{l:?} {r:?}"
        );
    }
}

/// `example_keys.txt`: 156 keys named `<letter><height>/<digits>`; the digit is the key's height.
#[test]
fn example_keys() {
    let Some(bytes) = common::read("interop/mst/example_keys.txt") else {
        return;
    };
    let text = String::from_utf8(bytes).expect("utf-8");
    let keys: Vec<&str> = text.lines().filter(|l| !l.is_empty()).collect();
    assert_eq!(keys.len(), 156);
    for k in &keys {
        let want = u32::from(k.as_bytes()[1] - b'0');
        assert_eq!(mst::key_height(k.as_bytes()), want, "{k}");
        assert!(mst::is_valid_key(k.as_bytes()));
    }
    // All of them in one tree: build, walk back, and compare with incremental insertion.
    let leaf = CidBuf::sha256(riptide_cbor::DAG_CBOR, b"leaf");
    let leaves: Vec<(String, CidBuf)> = keys.iter().map(|k| (k.to_string(), leaf)).collect();
    let (root, blocks) = mst::build(&leaves).unwrap();
    let store: HashMap<CidBuf, Vec<u8>> = blocks.into_iter().collect();
    let mut walked = Vec::new();
    let stats = mst::walk(&store, root.as_cid(), |k, _, h| {
        walked.push((String::from_utf8(k.to_vec()).unwrap(), h))
    })
    .unwrap();
    assert_eq!(stats.records, 156);
    assert_eq!(stats.root_layer, 5);
    assert_eq!(
        walked.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(),
        keys
    );
    let mut tree = Tree::new();
    for k in keys.iter().rev() {
        tree.insert(&riptide_repo::NoBlocks, k.as_bytes(), leaf)
            .unwrap();
    }
    assert_eq!(tree.root_cid().unwrap(), root);
}

fn leaves_of(keys: &BTreeSet<String>, leaf: CidBuf) -> Vec<(String, CidBuf)> {
    keys.iter().map(|k| (k.clone(), leaf)).collect()
}

/// `commit-proof-fixtures.json`: for each case, build the trees before and after the commit and
/// check both roots; then, from *only* the proof blocks listed, load the new tree, check the ops
/// forward and invert them back to the old root. Also check that the nodes our inversion loads
/// are exactly the listed proof blocks (so the fixture proofs are minimal for our algorithm too).
#[test]
fn commit_proof_fixtures() {
    let Some(v) = common::json("interop/firehose/commit-proof-fixtures.json") else {
        return;
    };
    let cases = v.as_array().expect("array");
    assert_eq!(cases.len(), 6);
    for c in cases {
        let name = c["comment"].as_str().expect("comment");
        let leaf = CidBuf::parse(c["leafValue"].as_str().unwrap()).unwrap();
        let strs = |f: &str| -> Vec<String> {
            c[f].as_array()
                .unwrap()
                .iter()
                .map(|s| s.as_str().unwrap().to_owned())
                .collect()
        };
        let before: BTreeSet<String> = strs("keys").into_iter().collect();
        let adds = strs("adds");
        let dels = strs("dels");
        let mut after = before.clone();
        for d in &dels {
            assert!(after.remove(d), "{name}: deleting absent {d}");
        }
        for a in &adds {
            assert!(after.insert(a.clone()), "{name}: adding present {a}");
        }
        let root_before = CidBuf::parse(c["rootBeforeCommit"].as_str().unwrap()).unwrap();
        let root_after = CidBuf::parse(c["rootAfterCommit"].as_str().unwrap()).unwrap();
        assert_eq!(
            mst::root_cid(&leaves_of(&before, leaf)).unwrap(),
            root_before,
            "{name}: before"
        );
        let (built, blocks) = mst::build(&leaves_of(&after, leaf)).unwrap();
        assert_eq!(built, root_after, "{name}: after");

        let all: HashMap<CidBuf, Vec<u8>> = blocks.into_iter().collect();
        let listed: BTreeSet<CidBuf> = c["blocksInProof"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| CidBuf::parse(s.as_str().unwrap()).unwrap())
            .collect();
        let proof: HashMap<CidBuf, Vec<u8>> = listed
            .iter()
            .map(|cid| {
                (
                    *cid,
                    all.get(cid)
                        .unwrap_or_else(|| panic!("{name}: {cid} is not a node of the new tree"))
                        .clone(),
                )
            })
            .collect();

        let mut ops: Vec<ProofOp<'_>> = adds
            .iter()
            .map(|k| ProofOp {
                action: Action::Create,
                path: k,
                cid: Some(leaf),
                prev: None,
            })
            .collect();
        ops.extend(dels.iter().map(|k| ProofOp {
            action: Action::Delete,
            path: k,
            cid: None,
            prev: Some(leaf),
        }));
        invert::check_ops(&ops).unwrap();

        let mut tree = Tree::load(root_after);
        invert::check_forward(&mut tree, &proof, &ops)
            .unwrap_or_else(|e| panic!("{name}: forward: {e}"));
        invert::invert(&mut tree, &proof, &ops).unwrap_or_else(|e| panic!("{name}: invert: {e}"));
        assert_eq!(
            tree.root_cid().unwrap(),
            root_before,
            "{name}: inverted root"
        );

        // What does our algorithm need, given every block of the new tree? Never more than the
        // fixture lists; sometimes less (when a delete merges a subtree with nothing, the subtree
        // is not opened).
        let mut probe = Tree::load(root_after);
        invert::check_forward(&mut probe, &all, &ops).unwrap();
        invert::invert(&mut probe, &all, &ops).unwrap();
        let needed: BTreeSet<CidBuf> = probe.loaded().iter().copied().collect();
        assert!(
            needed.is_subset(&listed),
            "{name}: needs {needed:?}, fixture lists {listed:?}"
        );
        assert_eq!(needed.len(), expect_needed(name), "{name}: {needed:?}");

        // Each needed block is necessary: without it, MissingBlock naming it. Listed blocks we do
        // not need can go without changing the result.
        for drop in &listed {
            let mut fewer = proof.clone();
            fewer.remove(drop);
            let mut t = Tree::load(root_after);
            let r = invert::check_forward(&mut t, &fewer, &ops)
                .and_then(|_| invert::invert(&mut t, &fewer, &ops));
            if needed.contains(drop) {
                assert_eq!(
                    r,
                    Err(riptide_repo::ProofError::MissingBlock(*drop)),
                    "{name}: without {drop}"
                );
            } else {
                r.unwrap();
                assert_eq!(t.root_cid().unwrap(), root_before, "{name}: without {drop}");
            }
        }
    }
}

/// How many of the fixture's proof blocks our inversion loads, per case.
fn expect_needed(name: &str) -> usize {
    match name {
        "two deep split" => 5,
        "two deep leafless split" => 5,
        // Deleting D2 from the root merges B2's right subtree with nothing: the two nodes below
        // the root (C0's path) are listed but not opened.
        "add on edge with neighbor two layers down" => 1,
        "merge and split in multi-op commit" => 5,
        "complex multi-op commit" => 7,
        "split with earlier leaves on same layer" => 3,
        other => panic!("unknown case {other}"),
    }
}
