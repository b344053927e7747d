//! Synthetic signed repositories and Sync 1.1 commits: end-to-end verification, and tampering of
//! every kind giving the matching typed error.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::{BTreeMap, HashMap};

use riptide_car::{write_car, CarOptions, CarReader};
use riptide_cbor::{CidBuf, OwnedValue, DAG_CBOR};
use riptide_crypto::{Curve, PrivateKey};
use riptide_repo::mst::{self, invert};
use riptide_repo::{
    verify_commit_proof, verify_repo, Action, MstError, ProofClass, ProofError, ProofOp, RepoError,
    Tree,
};

const DID: &str = "did:plc:aaaaaaaaaaaaaaaaaaaaaaaa";

fn record(n: u64) -> (CidBuf, Vec<u8>) {
    let mut m = BTreeMap::new();
    m.insert(
        "$type".to_string(),
        OwnedValue::Text("app.bsky.feed.like".into()),
    );
    m.insert("n".to_string(), OwnedValue::Int(n as i64));
    let bytes = OwnedValue::Map(m).to_cbor();
    (CidBuf::sha256(DAG_CBOR, &bytes), bytes)
}

fn tid(n: u64) -> String {
    const A: &[u8] = b"234567abcdefghijklmnopqrstuvwxyz";
    let mut v = (1u64 << 60) + n * 1_000_003;
    let mut s = vec![b'2'; 13];
    for i in (0..13).rev() {
        s[i] = A[(v & 31) as usize];
        v >>= 5;
    }
    String::from_utf8(s).unwrap()
}

fn signed_commit(key: &PrivateKey, data: CidBuf, rev: &str) -> (CidBuf, Vec<u8>) {
    let mut m = BTreeMap::new();
    m.insert("did".to_string(), OwnedValue::Text(DID.into()));
    m.insert("version".to_string(), OwnedValue::Int(3));
    m.insert("data".to_string(), OwnedValue::Link(data));
    m.insert("rev".to_string(), OwnedValue::Text(rev.into()));
    m.insert("prev".to_string(), OwnedValue::Null);
    let sig = key.sign(&OwnedValue::Map(m.clone()).to_cbor());
    m.insert("sig".to_string(), OwnedValue::Bytes(sig.to_vec()));
    let bytes = OwnedValue::Map(m).to_cbor();
    (CidBuf::sha256(DAG_CBOR, &bytes), bytes)
}

/// A repository that evolves commit by commit, keeping every block.
struct World {
    key: PrivateKey,
    store: HashMap<CidBuf, Vec<u8>>,
    records: BTreeMap<String, CidBuf>,
    root: CidBuf,
    n: u64,
}

/// One `#commit`: its CAR and the fields a verifier uses.
struct Frame {
    car: Vec<u8>,
    commit: CidBuf,
    ops: Vec<(Action, String, Option<CidBuf>, Option<CidBuf>)>,
    prev_data: CidBuf,
    proof: Vec<CidBuf>,
    records: Vec<CidBuf>,
}

impl Frame {
    fn ops(&self) -> Vec<ProofOp<'_>> {
        common::proof_ops(&self.ops)
    }
}

impl World {
    fn new(initial: u64) -> World {
        let key = PrivateKey::from_bytes(Curve::Secp256k1, &[7; 32]).unwrap();
        let mut w = World {
            key,
            store: HashMap::new(),
            records: BTreeMap::new(),
            root: mst::empty_root_cid(),
            n: 0,
        };
        for i in 0..initial {
            let (cid, bytes) = record(i);
            w.store.insert(cid, bytes);
            w.records
                .insert(format!("app.bsky.feed.like/{}", tid(i)), cid);
        }
        w.n = initial;
        let leaves: Vec<(String, CidBuf)> =
            w.records.iter().map(|(k, v)| (k.clone(), *v)).collect();
        let (root, blocks) = mst::build(&leaves).unwrap();
        w.store.extend(blocks);
        w.root = root;
        w
    }

    fn next_record(&mut self) -> CidBuf {
        self.n += 1;
        let (cid, bytes) = record(self.n + 1_000_000);
        self.store.insert(cid, bytes);
        cid
    }

    /// Applies `ops` (action, key) and returns the frame a PDS would emit.
    fn commit(&mut self, spec: &[(Action, String)]) -> Frame {
        let prev_data = self.root;
        let mut tree = Tree::load(self.root);
        let mut ops = Vec::new();
        let mut records = Vec::new();
        for (action, path) in spec {
            match action {
                Action::Create | Action::Update => {
                    let cid = self.next_record();
                    let prev = tree.insert(&self.store, path.as_bytes(), cid).unwrap();
                    assert_eq!(prev.is_some(), *action == Action::Update, "{path}");
                    self.records.insert(path.clone(), cid);
                    records.push(cid);
                    ops.push((*action, path.clone(), Some(cid), prev));
                }
                Action::Delete => {
                    let prev = tree.delete(&self.store, path.as_bytes()).unwrap();
                    assert!(prev.is_some());
                    self.records.remove(path);
                    ops.push((Action::Delete, path.clone(), None, prev));
                }
            }
        }
        let mut new_blocks = Vec::new();
        let root = tree.root_cid_with_blocks(&mut new_blocks).unwrap();
        self.store.extend(new_blocks);
        // The incremental result is the canonical tree of the new key set.
        let leaves: Vec<(String, CidBuf)> =
            self.records.iter().map(|(k, v)| (k.clone(), *v)).collect();
        assert_eq!(mst::root_cid(&leaves).unwrap(), root);
        self.root = root;

        let (commit, commit_bytes) = signed_commit(&self.key, root, &tid(self.n));
        let pops: Vec<ProofOp<'_>> = common::proof_ops(&ops);
        let proof = invert::proof_nodes(root, &self.store, &pops).unwrap();
        let mut blocks: Vec<(CidBuf, &[u8])> = vec![(commit, &commit_bytes)];
        for c in records.iter().chain(&proof) {
            blocks.push((*c, &self.store[c]));
        }
        let car = write_car(&[commit], blocks.iter().map(|(c, d)| (c.as_cid(), *d)));
        Frame {
            car,
            commit,
            ops,
            prev_data,
            proof,
            records,
        }
    }

    fn repo_car(&self) -> Vec<u8> {
        let (commit, bytes) = signed_commit(&self.key, self.root, &tid(self.n));
        let mut blocks: Vec<(CidBuf, &[u8])> = vec![(commit, &bytes)];
        let mut src = self.store.clone();
        // Only reachable blocks: the current tree's nodes and records.
        let leaves: Vec<(String, CidBuf)> =
            self.records.iter().map(|(k, v)| (k.clone(), *v)).collect();
        let (_, nodes) = mst::build(&leaves).unwrap();
        src.extend(nodes.iter().cloned());
        let mut cids: Vec<CidBuf> = nodes.iter().map(|(c, _)| *c).collect();
        cids.extend(self.records.values().copied());
        for c in &cids {
            blocks.push((*c, &src[c]));
        }
        write_car(&[commit], blocks.iter().map(|(c, d)| (c.as_cid(), *d)))
    }
}

fn key(n: u64) -> String {
    format!("app.bsky.feed.like/{}", tid(n))
}

fn verify(frame: &Frame, prev: Option<CidBuf>, car: &[u8]) -> Result<CidBuf, ProofError> {
    let mut reader = CarReader::new();
    let parsed = reader.read(car, &CarOptions::default()).unwrap();
    let ops = frame.ops();
    verify_commit_proof(
        &parsed,
        frame.commit.as_cid(),
        &ops,
        prev.as_ref().map(|c| c.as_cid()),
    )
    .map(|v| v.prev_data)
}

fn car_without(frame: &Frame, drop: CidBuf) -> Vec<u8> {
    let mut reader = CarReader::new();
    let parsed = reader.read(&frame.car, &CarOptions::default()).unwrap();
    let blocks: Vec<_> = parsed
        .blocks()
        .filter(|b| b.cid != drop.as_cid())
        .map(|b| (b.cid, b.data))
        .collect();
    write_car(&[frame.commit], blocks)
}

/// A run of mixed commits: each verifies, its signature checks, and its CAR is minimal.
#[test]
fn chain_of_commits_verifies() {
    let mut w = World::new(400);
    let pubkey = w.key.public_key();
    let mut next = 10_000;
    for round in 0..40u64 {
        let mut spec = Vec::new();
        // Creates of fresh keys, updates and deletes of existing ones.
        for _ in 0..(round % 3 + 1) {
            next += 1;
            spec.push((Action::Create, key(next)));
        }
        let existing: Vec<String> = w.records.keys().cloned().collect();
        if round % 2 == 0 {
            spec.push((
                Action::Update,
                existing[(round as usize * 37) % existing.len()].clone(),
            ));
        }
        if round % 3 != 1 {
            let d = existing[(round as usize * 101 + 13) % existing.len()].clone();
            if !spec.iter().any(|(_, k)| *k == d) {
                spec.push((Action::Delete, d));
            }
        }
        let f = w.commit(&spec);
        assert_eq!(
            verify(&f, Some(f.prev_data), &f.car).unwrap(),
            f.prev_data,
            "round {round}"
        );
        let mut reader = CarReader::new();
        let parsed = reader.read(&f.car, &CarOptions::default()).unwrap();
        assert_eq!(parsed.len(), 1 + f.records.len() + f.proof.len());
        let c = riptide_repo::Commit::decode(parsed.get(f.commit.as_cid()).unwrap()).unwrap();
        c.verify_signature(&pubkey).unwrap();
    }
    // The whole repository at the end verifies too, signature included.
    let car = w.repo_car();
    let report = verify_repo(&car, Some(&pubkey)).unwrap();
    assert_eq!(report.records, w.records.len());
    assert!(report.signature_checked);
    let other = PrivateKey::from_bytes(Curve::P256, &[9; 32])
        .unwrap()
        .public_key();
    assert!(matches!(
        verify_repo(&car, Some(&other)),
        Err(RepoError::Signature(_))
    ));
}

#[test]
fn changed_prev_data_is_an_inversion_mismatch() {
    let mut w = World::new(200);
    let f = w.commit(&[(Action::Create, key(5000))]);
    let wrong = record(42).0;
    let e = verify(&f, Some(wrong), &f.car).unwrap_err();
    assert_eq!(e, ProofError::inversion_mismatch(wrong, f.prev_data));
    assert_eq!(e.class(), ProofClass::InversionMismatch);
    // Without prevData the inversion still runs and reports the root it found.
    assert_eq!(verify(&f, None, &f.car).unwrap(), f.prev_data);
}

#[test]
fn dropped_proof_node_is_a_missing_block() {
    let mut w = World::new(300);
    // Single-op commits of each kind: every proof node is necessary.
    let existing: Vec<String> = w.records.keys().cloned().collect();
    for spec in [
        vec![(Action::Create, key(7000))],
        vec![(Action::Update, existing[10].clone())],
        vec![(Action::Delete, existing[20].clone())],
    ] {
        let f = w.commit(&spec);
        assert!(!f.proof.is_empty());
        for node in &f.proof {
            let car = car_without(&f, *node);
            let e = verify(&f, Some(f.prev_data), &car).unwrap_err();
            assert_eq!(e, ProofError::MissingBlock(*node), "{spec:?}");
            assert_eq!(e.class(), ProofClass::MissingBlock);
        }
        // The created/updated record block is required too.
        for r in &f.records {
            assert_eq!(
                verify(&f, Some(f.prev_data), &car_without(&f, *r)).unwrap_err(),
                ProofError::MissingBlock(*r)
            );
        }
        assert_eq!(
            verify(&f, Some(f.prev_data), &car_without(&f, f.commit)).unwrap_err(),
            ProofError::MissingBlock(f.commit)
        );
    }
    // Multi-op: dropping a node gives MissingBlock, or (if another op order does without it)
    // still the right answer, never a wrong one.
    let existing: Vec<String> = w.records.keys().cloned().collect();
    let f = w.commit(&[
        (Action::Create, key(7100)),
        (Action::Create, key(7101)),
        (Action::Delete, existing[3].clone()),
        (Action::Update, existing[30].clone()),
    ]);
    for node in &f.proof {
        match verify(&f, Some(f.prev_data), &car_without(&f, *node)) {
            Err(ProofError::MissingBlock(_)) => {}
            Ok(root) => assert_eq!(root, f.prev_data),
            Err(e) => panic!("{e}"),
        }
    }
}

#[test]
fn ops_that_lie_are_caught() {
    let mut w = World::new(150);
    let existing: Vec<String> = w.records.keys().cloned().collect();
    let f = w.commit(&[
        (Action::Create, key(8000)),
        (Action::Update, existing[5].clone()),
    ]);
    let mut reader = CarReader::new();
    let car = reader.read(&f.car, &CarOptions::default()).unwrap();
    let good = f.ops();
    let check = |ops: &[ProofOp<'_>]| {
        verify_commit_proof(&car, f.commit.as_cid(), ops, Some(f.prev_data.as_cid())).map(|_| ())
    };
    check(&good).unwrap();

    // A create whose CID is not what the tree holds.
    let mut bad = good.clone();
    bad[0].cid = Some(record(1).0);
    assert!(matches!(check(&bad), Err(ProofError::OpMismatch(_))));
    // An update whose prev is wrong: inverts to another tree.
    let mut bad = good.clone();
    bad[1].prev = Some(record(2).0);
    assert!(matches!(check(&bad), Err(ProofError::InversionMismatch(_))));
    // An op left out: inverts to another tree.
    assert!(matches!(
        check(&good[..1]),
        Err(ProofError::InversionMismatch(_))
    ));
    // A delete that did not happen: the key is still there.
    let mut bad = good.clone();
    bad.push(ProofOp {
        action: Action::Delete,
        path: &existing[40],
        cid: None,
        prev: Some(record(3).0),
    });
    assert!(matches!(
        check(&bad),
        Err(ProofError::OpMismatch(_)) | Err(ProofError::MissingBlock(_))
    ));
    // Malformed ops.
    let mut bad = good.clone();
    bad[1].prev = None;
    assert!(matches!(check(&bad), Err(ProofError::InvalidOp { .. })));
    let dup = [good[0], good[0]];
    assert!(matches!(check(&dup), Err(ProofError::InvalidOp { .. })));
}

/// Builds a one-commit repository CAR around hand-made MST node blocks.
fn repo_with_nodes(
    root: CidBuf,
    nodes: Vec<(CidBuf, Vec<u8>)>,
    records: &[(CidBuf, Vec<u8>)],
) -> Vec<u8> {
    let key = PrivateKey::from_bytes(Curve::Secp256k1, &[7; 32]).unwrap();
    let (commit, bytes) = signed_commit(&key, root, &tid(1));
    let mut blocks: Vec<(CidBuf, &[u8])> = vec![(commit, &bytes)];
    for (c, d) in nodes.iter().chain(records) {
        blocks.push((*c, d));
    }
    write_car(&[commit], blocks.iter().map(|(c, d)| (c.as_cid(), *d)))
}

#[test]
fn bad_msts_give_typed_errors() {
    let (rec, rec_bytes) = record(1);
    let records = [(rec, rec_bytes)];
    let of_height = |h: u32, n: usize| -> Vec<String> {
        (0..100_000u64)
            .map(key)
            .filter(|k| mst::key_height(k.as_bytes()) == h)
            .take(n)
            .collect()
    };
    let h0 = of_height(0, 5000);
    let h1 = [of_height(1, 20)[10].clone()];

    let node = |left: Option<CidBuf>, keys: &[&String]| -> (CidBuf, Vec<u8>) {
        let entries: Vec<(&[u8], riptide_cbor::Cid<'_>, Option<riptide_cbor::Cid<'_>>)> = keys
            .iter()
            .map(|k| (k.as_bytes(), rec.as_cid(), None))
            .collect();
        let mut out = Vec::new();
        mst::encode_node(&mut out, left.as_ref().map(|c| c.as_cid()), &entries);
        (CidBuf::sha256(DAG_CBOR, &out), out)
    };

    // Out of order within a node.
    let (root, bytes) = node(None, &[&h0[1], &h0[0]]);
    let car = repo_with_nodes(root, vec![(root, bytes)], &records);
    assert!(matches!(
        verify_repo(&car, None),
        Err(RepoError::Mst(MstError::KeyOrder { .. }))
    ));

    // Wrong layer: a height-0 and a height-1 key side by side.
    let mut pair = [&h0[0], &h1[0]];
    pair.sort();
    let (root, bytes) = node(None, &pair);
    let car = repo_with_nodes(root, vec![(root, bytes)], &records);
    assert!(matches!(
        verify_repo(&car, None),
        Err(RepoError::Mst(MstError::WrongLayer { .. }))
    ));

    // Out of order across nodes: a left subtree holding a key above its parent's.
    let bigger = h0.iter().find(|k| **k > h1[0]).unwrap();
    let (child, child_bytes) = node(None, &[bigger]);
    let (root, bytes) = node(Some(child), &[&h1[0]]);
    let car = repo_with_nodes(root, vec![(root, bytes), (child, child_bytes)], &records);
    assert!(matches!(
        verify_repo(&car, None),
        Err(RepoError::Mst(MstError::KeyOrder { .. }))
    ));

    // A missing MST node.
    let smaller = h0.iter().find(|k| **k < h1[0]).unwrap();
    let (child, _) = node(None, &[smaller]);
    let (root, bytes) = node(Some(child), &[&h1[0]]);
    let car = repo_with_nodes(root, vec![(root, bytes)], &records);
    assert_eq!(
        verify_repo(&car, None).unwrap_err(),
        RepoError::Mst(MstError::MissingBlock(child))
    );

    // A well-formed tree that is still accepted, for contrast.
    let (child, child_bytes) = node(None, &[smaller]);
    let (root, bytes) = node(Some(child), &[&h1[0]]);
    let car = repo_with_nodes(root, vec![(root, bytes), (child, child_bytes)], &records);
    assert_eq!(verify_repo(&car, None).unwrap().records, 2);
}
