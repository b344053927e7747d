//! A real repository export (`jetstream-2026-07/repo.car`, `com.atproto.sync.getRepo` of one
//! account) read with verification on, checked against what indigo's `goat` listed for it
//! (`car_expected_commit.txt`, `car_expected_records.tsv`), and then attacked: every flipped data
//! byte, every truncation, absurd section lengths.
//!
//! Why: a CAR is where content addressing is enforced. The reader must find every block by CID,
//! name the exact block whose bytes do not hash to its CID, and turn any malformed input into a
//! typed error rather than a panic or an allocation sized by an attacker.
#![allow(clippy::unwrap_used)]

use riptide_testdata as common;

use riptide_car::{verify_block, write_car, CarError, CarErrorKind, CarOptions, CarReader};
use riptide_cbor::{encode_value, write_varint, Arena, Cid, CidBuf, Options, DAG_CBOR};

struct Expected {
    did: String,
    data: CidBuf,
    rev: String,
    version: i64,
    records: Vec<(String, CidBuf)>,
}

fn expected() -> Option<Expected> {
    let commit = common::read_string("jetstream-2026-07/car_expected_commit.txt")?;
    let field = |name: &str| -> String {
        commit
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .unwrap_or_else(|| panic!("car_expected_commit.txt has no {name:?} line"))
            .trim()
            .to_string()
    };
    let records = common::read_string("jetstream-2026-07/car_expected_records.tsv")?
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let (path, cid) = l.split_once('\t').unwrap();
            (path.to_string(), CidBuf::parse(cid.trim()).unwrap())
        })
        .collect();
    Some(Expected {
        did: field("DID:"),
        data: CidBuf::parse(&field("Data CID:")).unwrap(),
        rev: field("Revision:"),
        version: field("ATProto Repo Spec Version:").parse().unwrap(),
        records,
    })
}

fn repo() -> Option<Vec<u8>> {
    common::read("jetstream-2026-07/repo.car")
}

/// (CID, data offset, data length) of every block of the unmodified CAR.
fn layout(car: &[u8]) -> Vec<(CidBuf, usize, usize)> {
    let mut r = CarReader::new();
    let c = r.read(car, &CarOptions::default()).unwrap();
    c.blocks()
        .map(|b| (b.cid.to_buf(), b.offset, b.data.len()))
        .collect()
}

#[test]
fn reads_verified_and_matches_goat() {
    let (Some(car), Some(want)) = (repo(), expected()) else {
        return;
    };
    let mut reader = CarReader::new();
    let c = reader
        .read(&car, &CarOptions::default())
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(!c.is_empty());

    // One root: the signed commit, whose fields are what goat reported.
    let roots: Vec<Cid<'_>> = c.roots().collect();
    assert_eq!(roots.len(), 1);
    let root = roots[0];
    assert_eq!(root.codec(), DAG_CBOR);
    let commit_bytes = c.get(root).expect("the root block is in the CAR");
    let mut arena = Arena::new();
    let mut tape = arena.tape(commit_bytes);
    let item = tape
        .decode(0..commit_bytes.len(), &Options::strict())
        .unwrap();
    let commit = tape.value(item);
    assert_eq!(
        commit
            .get("data")
            .and_then(|v| v.as_link())
            .map(|c| c.to_buf()),
        Some(want.data)
    );
    assert_eq!(
        want.data.to_string(),
        "bafyreidigqr65jj2zsmitco3fcuag6pi7std6quxa2bcp2xrpin44ikzsy",
        "the fixture names this MST root"
    );
    assert_eq!(
        commit.get("did").and_then(|v| v.as_str()),
        Some(want.did.as_str())
    );
    assert_eq!(
        commit.get("rev").and_then(|v| v.as_str()),
        Some(want.rev.as_str())
    );
    assert_eq!(
        commit.get("version").and_then(|v| v.as_i64()),
        Some(want.version)
    );
    assert!(commit
        .get("sig")
        .and_then(|v| v.as_bytes())
        .is_some_and(|s| s.len() == 64));
    // The MST root block is present too.
    assert!(c.get(want.data.as_cid()).is_some());

    // Every record goat listed is a block here (its hash was checked while reading).
    assert!(!want.records.is_empty());
    for (path, cid) in &want.records {
        let data = c
            .get(cid.as_cid())
            .unwrap_or_else(|| panic!("record {path} ({cid}) missing"));
        assert_eq!(CidBuf::sha256(cid.as_cid().codec(), data), *cid, "{path}");
    }
    eprintln!(
        "repo.car: {} blocks, {} records listed by goat",
        c.len(),
        want.records.len()
    );
    // Records + MST nodes + the commit: at least one block per record, plus the commit and root.
    assert!(
        c.len() >= want.records.len() + 2,
        "{} blocks for {} records",
        c.len(),
        want.records.len()
    );
}

#[test]
fn every_block_round_trips_by_cid_and_decodes_canonically() {
    let Some(car) = repo() else { return };
    let mut reader = CarReader::new();
    let c = reader.read(&car, &CarOptions::default()).unwrap();
    let blocks: Vec<_> = c.blocks().collect();
    assert_eq!(blocks.len(), c.len());
    let mut arena = Arena::new();
    let mut dag_cbor = 0;
    for (i, b) in blocks.iter().enumerate() {
        // Independent re-hash (not through the reader).
        assert_eq!(
            CidBuf::sha256(b.cid.codec(), b.data),
            b.cid.to_buf(),
            "block {i}"
        );
        assert_eq!(c.block(i), Some(*b));
        let first = blocks.iter().position(|x| x.cid == b.cid).unwrap();
        assert_eq!(c.position(b.cid), Some(first), "block {i}");
        assert_eq!(c.get(b.cid), Some(b.data), "block {i}");
        // A CidBuf copy finds it too (lookup does not depend on where the CID bytes live).
        assert_eq!(c.get(b.cid.to_buf().as_cid()), Some(b.data));
        assert_eq!(&car[b.offset..b.offset + b.data.len()], b.data);
        // Real records, MST nodes and the commit are canonical DAG-CBOR.
        if b.cid.codec() == DAG_CBOR {
            let mut tape = arena.tape(b.data);
            let item = tape
                .decode(0..b.data.len(), &Options::strict())
                .unwrap_or_else(|e| panic!("block {i}: {e}"));
            let mut again = Vec::new();
            encode_value(tape.value(item), &mut again).unwrap();
            assert_eq!(again, b.data, "block {i}");
            dag_cbor += 1;
        }
    }
    assert_eq!(
        dag_cbor,
        blocks.len(),
        "a repository export holds only DAG-CBOR blocks"
    );
    // CIDs that are not in the CAR: another digest, and the same digest under another codec.
    assert_eq!(
        c.get(CidBuf::sha256(DAG_CBOR, b"not a block").as_cid()),
        None
    );
    let raw_twin = CidBuf::from_sha256_digest(riptide_cbor::RAW, blocks[0].cid.digest());
    assert_eq!(c.get(raw_twin.as_cid()), None);

    // Writing the blocks back gives the same bytes (the export is canonical CAR v1).
    let roots: Vec<CidBuf> = c.roots().map(|r| r.to_buf()).collect();
    let rewritten = write_car(&roots, blocks.iter().map(|b| (b.cid, b.data)));
    assert_eq!(rewritten, car);
}

#[test]
fn a_flipped_data_byte_is_a_hash_mismatch_naming_its_block() {
    let Some(car) = repo() else { return };
    let blocks = layout(&car);
    let mut reader = CarReader::new();
    let mut bytes = car.clone();
    let mut flips = 0;
    for (i, &(cid, start, len)) in blocks.iter().enumerate() {
        for at in start..start + len {
            bytes[at] ^= 0x01;
            let e = reader
                .read(&bytes, &CarOptions::default())
                .expect_err("tampered block accepted");
            assert_eq!(
                e.kind(),
                &CarErrorKind::HashMismatch { cid },
                "byte {at} of block {i}"
            );
            assert_eq!(e.block(), Some(i), "byte {at}");
            assert!(e.is_hash_mismatch());
            // The offset is that of the block's section, before the flipped byte.
            assert!(
                e.offset() < start && e.offset() <= at,
                "offset {} for block {i}",
                e.offset()
            );
            flips += 1;
            // The named opt-out reads it anyway, with the tampered bytes in place.
            if at == start {
                let opts = CarOptions {
                    verify: false,
                    ..CarOptions::default()
                };
                let c = reader.read(&bytes, &opts).unwrap();
                assert_eq!(c.len(), blocks.len());
                assert_ne!(CidBuf::sha256(DAG_CBOR, c.block(i).unwrap().data), cid);
            }
            bytes[at] ^= 0x01;
        }
    }
    assert_eq!(bytes, car);
    eprintln!(
        "{flips} flipped data bytes across {} blocks, each a HashMismatch naming its block",
        blocks.len()
    );
    assert!(flips > 1000, "{flips} flips");
}

#[test]
fn any_flipped_byte_anywhere_is_handled() {
    // Header, varints, CIDs and data alike: an error or a CAR whose blocks all verify.
    let Some(car) = repo() else { return };
    let mut reader = CarReader::new();
    let mut bytes = car.clone();
    let mut errors = 0;
    for at in 0..bytes.len() {
        for x in [0x01u8, 0x80, 0xff] {
            bytes[at] ^= x;
            match reader.read(&bytes, &CarOptions::default()) {
                Ok(c) => {
                    for b in c.blocks() {
                        verify_block(b.cid, b.data).unwrap();
                    }
                }
                Err(e) => {
                    let _ = e.to_string();
                    errors += 1;
                }
            }
            let _ = reader.read(
                &bytes,
                &CarOptions {
                    verify: false,
                    ..CarOptions::default()
                },
            );
            bytes[at] ^= x;
        }
    }
    assert!(errors > car.len(), "{errors} errors");
}

#[test]
fn every_truncation_is_an_error_or_a_shorter_valid_car() {
    let Some(car) = repo() else { return };
    let blocks = layout(&car);
    // Where each section ends: the only places a cut leaves a valid CAR.
    let header_end = blocks[0].1 - blocks[0].0.as_bytes().len() - {
        let mut v = Vec::new();
        write_varint(&mut v, (blocks[0].0.as_bytes().len() + blocks[0].2) as u64);
        v.len()
    };
    let boundaries: Vec<usize> = std::iter::once(header_end)
        .chain(blocks.iter().map(|b| b.1 + b.2))
        .collect();
    let mut reader = CarReader::new();
    let mut shorter = 0;
    for cut in 0..car.len() {
        for verify in [true, false] {
            match reader.read(
                &car[..cut],
                &CarOptions {
                    verify,
                    ..CarOptions::default()
                },
            ) {
                Ok(c) => {
                    let n = c.len();
                    assert_eq!(
                        boundaries.get(n),
                        Some(&cut),
                        "cut at {cut} read as {n} blocks"
                    );
                    for (i, b) in c.blocks().enumerate() {
                        assert_eq!((b.cid.to_buf(), b.offset, b.data.len()), blocks[i]);
                    }
                    assert_eq!(c.roots().count(), 1);
                    shorter += 1;
                }
                Err(e) => {
                    assert!(
                        !boundaries.contains(&cut),
                        "cut at boundary {cut} refused: {e}"
                    );
                    assert!(e.offset() <= cut, "cut {cut}: {e}");
                }
            }
        }
    }
    eprintln!(
        "{} truncations: {shorter} valid shorter CARs (verify on and off), the rest errors",
        car.len()
    );
    // Every boundary but the full length (not a strict prefix) gave a valid, shorter CAR.
    assert_eq!(shorter, 2 * (boundaries.len() - 1));
    assert_eq!(*boundaries.last().unwrap(), car.len());
}

fn header_only(car: &[u8]) -> Vec<u8> {
    let (hlen, n) = riptide_cbor::read_varint(car).unwrap();
    car[..n + hlen as usize].to_vec()
}

fn read_err(bytes: &[u8], opts: &CarOptions) -> CarError {
    CarReader::new()
        .read(bytes, opts)
        .expect_err("malformed CAR accepted")
}

#[test]
fn absurd_section_and_header_lengths_are_typed_errors() {
    let Some(car) = repo() else { return };
    let header = header_only(&car);
    let block_count = layout(&car).len();
    let opts = CarOptions::default();
    let unverified = CarOptions {
        verify: false,
        ..opts
    };
    let big = CarOptions::repository();
    // The largest lengths a (nine-byte, multiformats) varint can state.
    for claim in [
        1u64 << 60,
        (1 << 32) + 1,
        u64::from(u32::MAX),
        (1 << 63) - 1,
    ] {
        let mut len = Vec::new();
        write_varint(&mut len, claim);
        // As the first section, after the header.
        let bytes = [&header[..], &len, &[0x01, 0x71, 0x12, 0x20], &[0u8; 40]].concat();
        for o in [&opts, &unverified, &big] {
            let e = read_err(&bytes, o);
            assert_eq!(e.kind(), &CarErrorKind::BadSectionLength, "claim {claim}");
            assert_eq!((e.block(), e.offset()), (Some(0), header.len()));
        }
        // After every real block.
        let bytes = [&car[..], &len, &[0u8; 8]].concat();
        let e = read_err(&bytes, &opts);
        assert_eq!(e.kind(), &CarErrorKind::BadSectionLength);
        assert_eq!((e.block(), e.offset()), (Some(block_count), car.len()));
        // As the header length.
        let bytes = [&len[..], &car[header.len()..]].concat();
        assert_eq!(
            read_err(&bytes, &big).kind(),
            &CarErrorKind::Truncated,
            "header claim {claim}"
        );
    }
    // 2^63 needs a ten-byte varint: malformed, not a huge number.
    let mut len = Vec::new();
    write_varint(&mut len, 1 << 63);
    assert_eq!(len.len(), 10);
    let bytes = [&header[..], &len, &[0u8; 40]].concat();
    let e = read_err(&bytes, &opts);
    assert_eq!((e.kind(), e.block()), (&CarErrorKind::BadVarint, Some(0)));
    // Ten bytes of 0xff…01 (more than 64 bits' worth).
    let bytes = [&header[..], &[0xff; 9], &[0x01], &[0u8; 40]].concat();
    assert_eq!(read_err(&bytes, &opts).kind(), &CarErrorKind::BadVarint);
    let bytes = [&[0xffu8; 9][..], &[0x01], &car[header.len()..]].concat();
    assert_eq!(read_err(&bytes, &opts).kind(), &CarErrorKind::BadVarint);
    // A non-minimal varint (1 written as 81 00).
    let bytes = [&header[..], &[0x81, 0x00]].concat();
    assert_eq!(read_err(&bytes, &opts).kind(), &CarErrorKind::BadVarint);
    // A varint cut short at the end of the input.
    let bytes = [&header[..], &[0x80]].concat();
    assert_eq!(read_err(&bytes, &opts).kind(), &CarErrorKind::Truncated);
    // A zero-length section.
    let bytes = [&header[..], &[0x00]].concat();
    assert_eq!(
        read_err(&bytes, &opts).kind(),
        &CarErrorKind::BadSectionLength
    );
    // A section too short for its CID.
    let bytes = [&header[..], &[0x03, 0x01, 0x71, 0x12]].concat();
    assert_eq!(read_err(&bytes, &opts).kind(), &CarErrorKind::BadCid);
    // Empty input and a zero header length.
    assert_eq!(read_err(&[], &opts).kind(), &CarErrorKind::Truncated);
    assert_eq!(read_err(&[0x00], &opts).kind(), &CarErrorKind::Truncated);
}

#[test]
fn limits_refuse_before_work() {
    let Some(car) = repo() else { return };
    let n = layout(&car).len();
    let mut reader = CarReader::new();
    let small = CarOptions {
        max_bytes: car.len() - 1,
        ..CarOptions::default()
    };
    assert_eq!(
        reader.read(&car, &small).unwrap_err().kind(),
        &CarErrorKind::TooLarge
    );
    let exact = CarOptions {
        max_bytes: car.len(),
        ..CarOptions::default()
    };
    assert_eq!(reader.read(&car, &exact).unwrap().len(), n);
    let few = CarOptions {
        max_blocks: n - 1,
        ..CarOptions::default()
    };
    let e = reader.read(&car, &few).unwrap_err();
    assert_eq!(
        (e.kind(), e.block()),
        (&CarErrorKind::TooManyBlocks, Some(n - 1))
    );
    let enough = CarOptions {
        max_blocks: n,
        ..CarOptions::default()
    };
    assert_eq!(reader.read(&car, &enough).unwrap().len(), n);
}

#[test]
fn hostile_headers_are_typed_errors() {
    let Some(car) = repo() else { return };
    let body = &car[header_only(&car).len()..];
    let root = layout(&car)[0].0;
    let with_header = |h: &[u8]| -> Vec<u8> {
        let mut v = Vec::new();
        write_varint(&mut v, h.len() as u64);
        v.extend_from_slice(h);
        v.extend_from_slice(body);
        v
    };
    let link = {
        let mut l = Vec::new();
        riptide_cbor::write_link(&mut l, root.as_cid());
        l
    };
    let opts = CarOptions::default();
    // {"roots": [root], "version": v}
    let header = |v: u8| {
        [
            &[0xa2, 0x65][..],
            b"roots",
            &[0x81],
            &link,
            &[0x67],
            b"version",
            &[v],
        ]
        .concat()
    };
    let v2 = header(2);
    assert_eq!(
        read_err(&with_header(&v2), &opts).kind(),
        &CarErrorKind::BadHeader("version is not 1")
    );
    // {"version": 1}: no roots.
    let no_roots = [&[0xa1, 0x67][..], b"version", &[0x01]].concat();
    assert_eq!(
        read_err(&with_header(&no_roots), &opts).kind(),
        &CarErrorKind::BadHeader("no roots array")
    );
    // {"roots": ["x"], "version": 1}
    let text_root = [
        &[0xa2, 0x65][..],
        b"roots",
        &[0x81, 0x61, b'x', 0x67],
        b"version",
        &[0x01],
    ]
    .concat();
    assert_eq!(
        read_err(&with_header(&text_root), &opts).kind(),
        &CarErrorKind::BadHeader("root is not a CID")
    );
    // An array, not a map.
    assert_eq!(
        read_err(&with_header(&[0x80]), &opts).kind(),
        &CarErrorKind::BadHeader("not a map")
    );
    // Keys out of canonical order: not DAG-CBOR.
    let unsorted = [
        &[0xa2, 0x67][..],
        b"version",
        &[0x01, 0x65],
        b"roots",
        &[0x81],
        &link,
    ]
    .concat();
    assert_eq!(
        read_err(&with_header(&unsorted), &opts).kind(),
        &CarErrorKind::HeaderCbor(riptide_cbor::ErrorKind::KeyOrder)
    );
    // A header nested deeper than the CBOR limit.
    let mut deep = vec![0x81u8; 100];
    deep.push(0x00);
    assert_eq!(
        read_err(&with_header(&deep), &opts).kind(),
        &CarErrorKind::HeaderCbor(riptide_cbor::ErrorKind::DepthLimit)
    );
    // The canonical header itself reads back.
    let good = header(1);
    assert_eq!(with_header(&good), car);
}
