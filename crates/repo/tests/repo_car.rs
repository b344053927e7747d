//! A real repository export (`jetstream-2026-07/repo.car`, from `com.atproto.sync.getRepo`)
//! against what indigo's `goat` lists for it.
#![allow(clippy::unwrap_used)]

mod common;

use riptide_car::{CarOptions, CarReader};
use riptide_cbor::CidBuf;
use riptide_repo::{inspect, list_records, verify_repo, RepoError};

#[test]
fn records_match_goat() {
    let (Some(car), Some(tsv)) = (
        common::read("jetstream-2026-07/repo.car"),
        common::read("jetstream-2026-07/car_expected_records.tsv"),
    ) else {
        return;
    };
    let expected: Vec<(String, CidBuf)> = String::from_utf8(tsv)
        .unwrap()
        .lines()
        .filter(|l| !l.is_empty())
        .map(|l| {
            let (k, c) = l.split_once('\t').expect("tab");
            (k.to_owned(), CidBuf::parse(c).expect("cid"))
        })
        .collect();
    assert_eq!(expected.len(), 23);
    let mut reader = CarReader::new();
    let parsed = reader.read(&car, &CarOptions::repository()).unwrap();
    let got = list_records(&parsed).unwrap();
    assert_eq!(got, expected); // same records, same order
}

#[test]
fn commit_matches_goat() {
    let (Some(car), Some(txt)) = (
        common::read("jetstream-2026-07/repo.car"),
        common::read("jetstream-2026-07/car_expected_commit.txt"),
    ) else {
        return;
    };
    let txt = String::from_utf8(txt).unwrap();
    let field = |name: &str| {
        txt.lines()
            .find_map(|l| l.strip_prefix(name).map(|v| v.trim().to_owned()))
            .unwrap_or_else(|| panic!("no {name} in car_expected_commit.txt"))
    };
    let mut reader = CarReader::new();
    let parsed = reader.read(&car, &CarOptions::repository()).unwrap();
    let info = inspect(&parsed).unwrap();
    assert_eq!(info.did, field("DID:"));
    assert_eq!(info.data.to_string(), field("Data CID:"));
    assert_eq!(info.rev, field("Revision:"));
    assert_eq!(field("Prev CID:"), "<nil>");
    assert_eq!(info.prev, None);
    assert_eq!(
        info.version.to_string(),
        field("ATProto Repo Spec Version:")
    );
    assert_eq!(info.did, "did:plc:53iucmf5ldftgqyf2ac7hmhd");
}

#[test]
fn verifies_and_rebuilds() {
    let (Some(car), Some(tsv)) = (
        common::read("jetstream-2026-07/repo.car"),
        common::read("jetstream-2026-07/car_expected_records.tsv"),
    ) else {
        return;
    };
    let lines = String::from_utf8(tsv)
        .unwrap()
        .lines()
        .filter(|l| !l.is_empty())
        .count();
    let report = verify_repo(&car, None).unwrap();
    assert_eq!(report.records, lines);
    assert_eq!(report.missing_records, 0);
    assert_eq!(
        report.data.to_string(),
        "bafyreidigqr65jj2zsmitco3fcuag6pi7std6quxa2bcp2xrpin44ikzsy"
    );
    assert_eq!(report.bytes, car.len());
    assert!(report.blocks > report.records);
    assert!(!report.signature_checked);
    eprintln!("{report:#?}");
}

#[test]
fn a_flipped_byte_is_caught() {
    let Some(car) = common::read("jetstream-2026-07/repo.car") else {
        return;
    };
    // Every single-byte corruption of the block area fails somewhere, never panics.
    let start = car.len() / 3;
    for pos in (start..car.len()).step_by(97) {
        let mut bad = car.clone();
        bad[pos] ^= 0x20;
        assert!(
            verify_repo(&bad, None).is_err(),
            "flip at {pos} went unnoticed"
        );
    }
    // Flipping the codec byte of a record's section CID (0x71 → 0x51) keeps the digest, so the
    // CAR hash check passes, but the record is no longer there under its real CID.
    let records = {
        let mut reader = CarReader::new();
        let parsed = reader.read(&car, &CarOptions::repository()).unwrap();
        list_records(&parsed).unwrap()
    };
    let codec_at = {
        let mut reader = CarReader::new();
        let parsed = reader.read(&car, &CarOptions::repository()).unwrap();
        let b = parsed
            .blocks()
            .find(|b| b.cid.to_buf() == records[0].1)
            .unwrap();
        b.offset - b.cid.as_bytes().len() + 1
    };
    assert_eq!(car[codec_at], 0x71);
    let mut bad = car.clone();
    bad[codec_at] ^= 0x20;
    assert!(
        matches!(verify_repo(&bad, None), Err(RepoError::MissingRecord { cid, .. }) if cid == records[0].1)
    );
    let lenient = riptide_repo::RepoOptions {
        allow_missing_records: true,
    };
    assert_eq!(
        riptide_repo::verify_repo_with(&bad, None, &lenient)
            .unwrap()
            .missing_records,
        1
    );
    // A CAR with the commit block dropped: the root is missing.
    let mut reader = CarReader::new();
    let parsed = reader.read(&car, &CarOptions::repository()).unwrap();
    let root = parsed.roots().next().unwrap();
    let blocks: Vec<_> = parsed
        .blocks()
        .filter(|b| b.cid != root)
        .map(|b| (b.cid, b.data))
        .collect();
    let without = riptide_car::write_car(&[root.to_buf()], blocks);
    assert_eq!(
        verify_repo(&without, None).unwrap_err(),
        RepoError::MissingCommit(root.to_buf())
    );
}

#[test]
fn block_order_does_not_change_the_verdict() {
    // The real export lists its blocks in its own order (records not in key order); rewritten
    // as a tree walker writes it (commit, nodes, records in key order) the record check takes
    // its in-order path. Both orders give the same report, and with any one record dropped,
    // the same error naming that record.
    let Some(car) = common::read("jetstream-2026-07/repo.car") else {
        return;
    };
    let mut reader = CarReader::new();
    let parsed = reader.read(&car, &CarOptions::repository()).unwrap();
    let records = list_records(&parsed).unwrap();
    assert_eq!(records.len(), 23);
    let (commit_cid, commit) = riptide_repo::commit_of(&parsed).unwrap();
    let mut nodes = Vec::new();
    riptide_repo::mst::Walker::new()
        .walk_nodes(
            &parsed,
            commit.data(),
            |_, _, _| {},
            |c, _| nodes.push(c.to_buf()),
        )
        .unwrap();
    let data = |c: &CidBuf| parsed.get(c.as_cid()).unwrap();
    let root = parsed.roots().next().unwrap().to_buf();
    let write = |skip: Option<&CidBuf>, in_key_order: bool| {
        let order: Vec<CidBuf> = if in_key_order {
            let mut v = vec![commit_cid];
            v.extend(nodes.iter().rev().copied());
            v.extend(records.iter().map(|(_, c)| *c));
            v
        } else {
            parsed.blocks().map(|b| b.cid.to_buf()).collect()
        };
        let mut seen = std::collections::HashSet::new();
        let blocks: Vec<(CidBuf, &[u8])> = order
            .into_iter()
            .filter(|c| Some(c) != skip && seen.insert(*c))
            .map(|c| (c, data(&c)))
            .collect();
        riptide_car::write_car(&[root], blocks.iter().map(|(c, d)| (c.as_cid(), *d)))
    };
    let same = |a: riptide_repo::RepoReport, b: riptide_repo::RepoReport| {
        let strip = |r: riptide_repo::RepoReport| riptide_repo::RepoReport {
            timings: Default::default(),
            bytes: 0,
            ..r
        };
        assert_eq!(strip(a), strip(b));
    };
    same(
        verify_repo(&car, None).unwrap(),
        verify_repo(&write(None, true), None).unwrap(),
    );
    same(
        verify_repo(&write(None, false), None).unwrap(),
        verify_repo(&car, None).unwrap(),
    );
    for (key, cid) in &records {
        for in_key_order in [false, true] {
            match verify_repo(&write(Some(cid), in_key_order), None) {
                Err(RepoError::MissingRecord { key: k, cid: c }) => {
                    assert_eq!((&k, &c), (key, cid), "{in_key_order}")
                }
                other => panic!("{key} {in_key_order}: {other:?}"),
            }
        }
    }
}
