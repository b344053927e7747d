//! `verify_car` on real and generated repositories: the records kept are exactly those the
//! repository holds (against indigo's `goat` listing of a real export), each block as signed;
//! every way a repository can be wrong is its own failure kind.

#![allow(clippy::unwrap_used, clippy::expect_used)]
use riptide_backfill::{verify_car, Collections, FailKind};
use riptide_cbor::{CidBuf, DAG_CBOR};
use riptide_sim::fixture;

const DID: &str = "did:plc:53iucmf5ldftgqyf2ac7hmhd";

#[test]
fn the_real_export_gives_goats_records_with_their_signed_bytes() {
    let Some(car) = riptide_testdata::read("jetstream-2026-07/repo.car") else {
        return;
    };
    let expected =
        riptide_testdata::read_string("jetstream-2026-07/car_expected_records.tsv").unwrap();
    let commit =
        riptide_testdata::read_string("jetstream-2026-07/car_expected_commit.txt").unwrap();
    let len = car.len();
    // The export's document is not in the corpus: the signature is checked in the generated
    // cases below; here everything else is.
    let v = verify_car(Box::new(car), DID, None, &Collections::all(), "corpus").unwrap();
    assert_eq!(v.bytes, len as u64);
    assert!(commit.contains(&format!("Revision: {}", v.rev)));
    assert!(commit.contains(&format!("Data CID: {}", v.data)));
    let got: Vec<String> = v
        .records()
        .map(|r| {
            // Each record's bytes hash to its CID: the bytes as signed, not a re-encoding.
            assert_eq!(&CidBuf::sha256(DAG_CBOR, r.bytes), r.cid);
            format!("{}/{}\t{}", r.collection, r.rkey, r.cid)
        })
        .collect();
    let want: Vec<&str> = expected.lines().collect();
    assert_eq!(want.len(), 23);
    assert_eq!(got, want);
    assert_eq!(v.total_records, 23);
    // The commit block a replacement's `#sync` carries: the block that hashes to the commit.
    let block = v.commit_block().unwrap();
    assert_eq!(CidBuf::sha256(DAG_CBOR, block), v.commit);

    // Only the collections asked for.
    let keep = Collections::parse(["app.bsky.feed.*", "app.bsky.actor.profile"]).unwrap();
    let car = riptide_testdata::read("jetstream-2026-07/repo.car").unwrap();
    let v = verify_car(Box::new(car), DID, None, &keep, "corpus").unwrap();
    let kept: Vec<String> = v
        .records()
        .map(|r| format!("{}/{}", r.collection, r.rkey))
        .collect();
    let want_kept: Vec<&str> = want
        .iter()
        .map(|l| l.split('\t').next().unwrap())
        .filter(|k| k.starts_with("app.bsky.feed.") || k.starts_with("app.bsky.actor.profile/"))
        .collect();
    assert_eq!(kept, want_kept);
    assert_eq!(kept.len(), 20);
    assert_eq!(v.total_records, 23);

    // None kept: the walk still found the commit block.
    let none = Collections::parse(["com.example.nothing.*"]).unwrap();
    let car = riptide_testdata::read("jetstream-2026-07/repo.car").unwrap();
    let v = verify_car(Box::new(car), DID, None, &none, "corpus").unwrap();
    assert_eq!(v.kept(), 0);
    assert_eq!(
        CidBuf::sha256(DAG_CBOR, v.commit_block().unwrap()),
        v.commit
    );

    // Someone else's repository.
    let car = riptide_testdata::read("jetstream-2026-07/repo.car").unwrap();
    let e = verify_car(Box::new(car), "did:plc:someoneelse", None, &keep, "corpus").unwrap_err();
    assert_eq!(e.kind, FailKind::WrongDid);
}

#[test]
fn each_broken_repository_fails_with_its_own_reason() {
    let a = fixture::account(3, "carol.test", 40);
    let key = a.key.public_key();
    let other = fixture::key_for(4).public_key();
    let all = Collections::all();
    let check = |car: Vec<u8>, key: &riptide_crypto::PublicKey| {
        verify_car(Box::new(car), &a.did, Some(key), &all, "test").map(|v| v.kept())
    };
    assert_eq!(check(a.car.to_vec(), &key), Ok(40));
    let kind = |r: Result<usize, riptide_backfill::Failure>| r.unwrap_err().kind;
    assert_eq!(kind(check(a.car.to_vec(), &other)), FailKind::BadSignature);
    assert_eq!(
        kind(check(fixture::tamper_last_block(&a.car), &key)),
        FailKind::BadCid
    );
    assert_eq!(
        kind(check(a.car[..a.car.len() - 7].to_vec(), &key)),
        FailKind::Truncated
    );
    // A header that is not a CAR header.
    // Another account's repository: its commit names the other DID (and is signed with the
    // other key): reported as the wrong DID, not as a bad signature.
    let other_account = fixture::account(5, "dave.test", 3);
    assert_eq!(
        kind(check(other_account.car.to_vec(), &key)),
        FailKind::WrongDid
    );
    assert_eq!(kind(check(b"\x04nope".to_vec(), &key)), FailKind::BadCar);
    // A record block left out (the last block is a record): the CAR ends at a block boundary.
    let mut reader = riptide_car::CarReader::new();
    let parsed = reader
        .read(&a.car, &riptide_car::CarOptions::repository())
        .unwrap();
    let blocks: Vec<_> = parsed.blocks().map(|b| (b.cid, b.data)).collect();
    let roots: Vec<CidBuf> = parsed.roots().map(|r| r.to_buf()).collect();
    let cut = riptide_car::write_car(&roots, blocks[..blocks.len() - 1].iter().copied());
    assert_eq!(kind(check(cut, &key)), FailKind::MissingBlock);
}
