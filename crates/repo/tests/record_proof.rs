//! Record proofs (`com.atproto.sync.getRecord`) built from a real repository export
//! (`jetstream-2026-07/repo.car`) and checked, against what indigo's `goat` lists for it: every
//! record's proof leads to goat's CID, an absent key proves nothing present, and a proof with a
//! block taken out is refused with the block's kind.
#![allow(clippy::unwrap_used)]

mod common;

use riptide_car::{CarOptions, CarReader};
use riptide_cbor::{CidBuf, DAG_CBOR};
use riptide_repo::{record_proof, verify_record_proof, MstError, RepoError};

/// `(collection/rkey, record CID)` per record.
type Listing = Vec<(String, CidBuf)>;

/// The export and goat's listing of it.
fn goat_listing() -> Option<(Vec<u8>, Listing)> {
    let car = common::read("jetstream-2026-07/repo.car")?;
    let tsv = common::read("jetstream-2026-07/car_expected_records.tsv")?;
    let listing = String::from_utf8(tsv)
        .unwrap()
        .lines()
        .filter(|l| !l.is_empty())
        .map(|l| {
            let (k, c) = l.split_once('\t').unwrap();
            (k.to_owned(), CidBuf::parse(c).unwrap())
        })
        .collect();
    Some((car, listing))
}

/// The blocks of a CAR, in order, and its root.
fn blocks(car: &[u8]) -> (CidBuf, Vec<(CidBuf, Vec<u8>)>) {
    let mut r = CarReader::new();
    let c = r.read(car, &CarOptions::default()).unwrap();
    let root = c.roots().next().unwrap().to_buf();
    let bl = c
        .blocks()
        .map(|b| (b.cid.to_buf(), b.data.to_vec()))
        .collect();
    (root, bl)
}

#[test]
fn every_record_of_a_real_repository_proves_goats_cid() {
    let Some((car, listing)) = goat_listing() else {
        return;
    };
    assert_eq!(listing.len(), 23);
    let mut reader = CarReader::new();
    let repo = reader.read(&car, &CarOptions::repository()).unwrap();
    let repo_blocks = repo.blocks().count();
    for (key, cid) in &listing {
        let proof = record_proof(&repo, key).unwrap().unwrap();
        let mut pr = CarReader::new();
        let parsed = pr.read(&proof, &CarOptions::default()).unwrap();
        // The commit, the path's nodes and the record: a few blocks, not the repository.
        let n = parsed.blocks().count();
        assert!((3..repo_blocks).contains(&n), "{key}: {n} blocks");
        let got = verify_record_proof(&parsed, key, None).unwrap().unwrap();
        assert_eq!(&got.cid, cid, "{key}");
        assert_eq!(got.did, "did:plc:53iucmf5ldftgqyf2ac7hmhd");
        assert_eq!(CidBuf::sha256(DAG_CBOR, got.record), *cid);
    }
    // A key the repository does not hold: no proof to build.
    assert_eq!(
        record_proof(&repo, "app.bsky.feed.post/2222222222222").unwrap(),
        None
    );
}

#[test]
fn a_proof_missing_a_block_is_refused_by_kind() {
    let Some((car, listing)) = goat_listing() else {
        return;
    };
    let mut reader = CarReader::new();
    let repo = reader.read(&car, &CarOptions::repository()).unwrap();
    let (key, cid) = &listing[listing.len() / 2];
    let proof = record_proof(&repo, key).unwrap().unwrap();
    let (root, all) = blocks(&proof);
    let without = |skip: usize| {
        riptide_car::write_car(
            &[root],
            all.iter()
                .enumerate()
                .filter(|(i, _)| *i != skip)
                .map(|(_, (c, b))| (c.as_cid(), b.as_slice())),
        )
    };
    let check = |bytes: &[u8]| {
        let mut r = CarReader::new();
        let c = r.read(bytes, &CarOptions::default()).unwrap();
        verify_record_proof(&c, key, None).map(|p| p.map(|p| p.cid))
    };
    // Whole: the record.
    assert_eq!(check(&proof).unwrap(), Some(*cid));
    // The root node of the tree (block 1, after the commit): the lookup cannot start.
    let e = check(&without(1)).unwrap_err();
    assert!(
        matches!(e, RepoError::Mst(MstError::MissingBlock(c)) if c == all[1].0),
        "{e}"
    );
    // The record (the last block): its CID is proven, its bytes are not there.
    let e = check(&without(all.len() - 1)).unwrap_err();
    assert!(
        matches!(&e, RepoError::MissingRecord { key: k, cid: c } if k == key && c == cid),
        "{e}"
    );
    // The commit: nothing to start from.
    let e = check(&without(0)).unwrap_err();
    assert!(matches!(e, RepoError::MissingCommit(_)), "{e}");
    // Asked of another key, a proof never answers: the other key's nodes or record are not in
    // it (never a false "absent" for a key the repository holds).
    let mut missing_nodes = 0;
    for (other, other_cid) in listing.iter().filter(|(k, _)| k != key) {
        let mut r = CarReader::new();
        let c = r.read(&proof, &CarOptions::default()).unwrap();
        match verify_record_proof(&c, other, None) {
            Err(RepoError::Mst(MstError::MissingBlock(_))) => missing_nodes += 1,
            Err(RepoError::MissingRecord { cid: c, .. }) => assert_eq!(&c, other_cid),
            r => panic!("{other}: {r:?}"),
        }
    }
    assert!(missing_nodes > 0, "every key on one path: a one-node tree?");
}
