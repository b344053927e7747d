//! Jetstream's own golden `.jss` files, decoded, cross-checked and re-encoded.
//!
//! The expected values are not taken from our reader: each comes from the Jetstream test that
//! produced the file (quoted beside it) or from the corpus files that test derived its input
//! from, and every file is decoded a second time by `common::independent`, a decoder written from
//! the format's description alone.

#![allow(clippy::unwrap_used)]

mod common;

use common::cross_check;
use common::independent;
use riptide_segment::{
    decode_block, decode_block_frame, write_segment, BloomBuilder, Error, Kind, Row, Segment,
    SegmentWriter, FP_RATE, HEADER_BYTES,
};

fn golden(name: &str) -> Option<Vec<u8>> {
    riptide_testdata::read(&format!("jetstream-v2/segments/{name}"))
}

/// Every row of a segment, through the crate's reader.
fn all_rows(seg: &Segment<'_>) -> Vec<riptide_segment::OwnedRow> {
    let mut out = Vec::new();
    for i in 0..seg.blocks().len() {
        let body = seg.block_body(i).expect("block body");
        out.extend(
            seg.rows(i, &body)
                .expect("rows")
                .iter()
                .map(Row::to_owned_row),
        );
    }
    out
}

/// Re-seals a file from its own frames: everything before the collection index's frame must be
/// byte-equal but for the checksum, and the collection index equal once decompressed. (The
/// collection index frame is compressed by our libzstd, Jetstream's by Go's klauspost/compress.)
fn reseal_from_frames(bytes: &[u8]) -> Vec<u8> {
    let seg = Segment::open(bytes).unwrap();
    let mut w = SegmentWriter::new();
    let mut file = vec![0u8; HEADER_BYTES];
    for i in 0..seg.blocks().len() {
        w.append_frame(seg.block_frame(i).unwrap(), &mut file)
            .unwrap();
    }
    let sealed = w.finish().unwrap();
    file.extend_from_slice(&sealed.footer);
    file[..HEADER_BYTES].copy_from_slice(&sealed.header);
    let ours = Segment::open(&file).expect("our reseal opens");
    let coll = seg.header().collection_index_offset as usize;
    assert_eq!(ours.header().collection_index_offset as usize, coll);
    assert_eq!(
        &file[12..HEADER_BYTES],
        &bytes[12..HEADER_BYTES],
        "header fields"
    );
    assert_eq!(
        &file[HEADER_BYTES..coll + 16],
        &bytes[HEADER_BYTES..coll + 16],
        "blocks and footer"
    );
    assert_eq!(ours.collections(), seg.collections());
    cross_check(&file);
    file
}

/// Re-encodes a file's rows from scratch (our zstd for every frame) with its block boundaries:
/// the header and the footer must say the same as Jetstream's, offsets and sizes aside, and every
/// block body must be byte-equal once decompressed.
fn reencode_rows(bytes: &[u8]) {
    let seg = Segment::open(bytes).unwrap();
    let bodies: Vec<Vec<u8>> = (0..seg.blocks().len())
        .map(|i| seg.block_body(i).unwrap())
        .collect();
    let rows: Vec<Vec<Row<'_>>> = bodies.iter().map(|b| decode_block(b).unwrap()).collect();
    let slices: Vec<&[Row<'_>]> = rows.iter().map(Vec::as_slice).collect();
    let file = write_segment(&slices).unwrap();
    let ours = Segment::open(&file).unwrap();
    let (a, b) = (ours.header(), seg.header());
    assert_eq!(
        (
            a.block_count,
            a.event_count,
            a.unique_did_count,
            a.min_seq,
            a.max_seq
        ),
        (
            b.block_count,
            b.event_count,
            b.unique_did_count,
            b.min_seq,
            b.max_seq
        )
    );
    assert_eq!(
        (a.min_witnessed_at, a.max_witnessed_at),
        (b.min_witnessed_at, b.max_witnessed_at)
    );
    for (i, (x, y)) in ours.blocks().iter().zip(seg.blocks()).enumerate() {
        assert_eq!(
            (
                x.uncompressed_size,
                x.event_count,
                x.min_seq,
                x.max_seq,
                x.min_witnessed_at,
                x.max_witnessed_at
            ),
            (
                y.uncompressed_size,
                y.event_count,
                y.min_seq,
                y.max_seq,
                y.min_witnessed_at,
                y.max_witnessed_at
            )
        );
        assert_eq!(ours.block_body(i).unwrap(), bodies[i], "block {i} body");
    }
    // Blooms are functions of the DIDs alone: byte-equal.
    let span = |s: &Segment<'_>, f: &[u8]| {
        let h = s.header();
        f[h.did_bloom_offset as usize..h.collection_index_offset as usize].to_vec()
    };
    assert_eq!(span(&ours, &file), span(&seg, bytes), "blooms");
    assert_eq!(ours.collections(), seg.collections());
    cross_check(&file);
}

#[test]
fn golden_seal_decodes_to_the_rows_jetstream_sealed() {
    let Some(bytes) = golden("golden_seal.bin") else {
        return;
    };
    let seg = Segment::open(&bytes).unwrap();
    let h = seg.header();
    // segment/seal_test.go TestSealGolden: Config{MaxEventsPerBlock: 2}, two events appended
    // (seq 1 at 100 µs, seq 2 at 200 µs with IndexedAt 250), then Seal: one block.
    assert_eq!(
        (h.block_count, h.event_count, h.unique_did_count),
        (1, 2, 2)
    );
    assert_eq!(
        (h.min_seq, h.max_seq, h.min_witnessed_at, h.max_witnessed_at),
        (1, 2, 100, 200)
    );
    assert_eq!(
        h.footer_offset as usize,
        HEADER_BYTES + 8 + seg.blocks()[0].compressed_size as usize
    );
    let rows = all_rows(&seg);
    let want = [
        (
            1,
            100,
            0,
            "did:plc:a",
            "app.bsky.feed.post",
            "k1",
            "v1",
            &b"p1"[..],
        ),
        (
            2,
            200,
            250,
            "did:plc:b",
            "app.bsky.feed.like",
            "k2",
            "v2",
            &b"p2"[..],
        ),
    ];
    assert_eq!(rows.len(), want.len());
    for (r, w) in rows.iter().zip(want) {
        assert_eq!(
            (
                r.seq,
                r.witnessed_at,
                r.indexed_at,
                r.kind,
                r.did.as_str(),
                r.collection.as_str()
            ),
            (w.0, w.1, w.2, Kind::Create, w.3, w.4)
        );
        assert_eq!(
            (r.rkey.as_str(), r.rev.as_str(), r.payload.as_slice()),
            (w.5, w.6, w.7)
        );
    }
    assert_eq!(rows[1].as_row().display_time_us(), 250);
    // First-seen order; each counted once; both in block 0.
    assert_eq!(
        seg.collections().names(),
        ["app.bsky.feed.post", "app.bsky.feed.like"]
    );
    assert_eq!(seg.collections().counts(), [1, 1]);
    assert_eq!(seg.collections().block_ids(0).collect::<Vec<_>>(), [0, 1]);
    // The checksum is the XXH3-64 of header[12..256] ++ footer, recomputed here with the
    // one-shot function rather than the streaming one the crate uses.
    let footer = &bytes[h.footer_offset as usize..];
    let want = xxhash_rust::xxh3::xxh3_64(&[&bytes[12..HEADER_BYTES], footer].concat());
    assert_eq!(h.checksum, want);
    assert!(
        !seg.may_contain_did("did:plc:zzzz-not-here")
            || seg.blocks_with_did("did:plc:zzzz-not-here").is_empty()
    );
    cross_check(&bytes);
}

/// `car_expected_records.tsv` and `car_expected_commit.txt` (Jetstream's
/// `internal/corpus/testdata`, the same files as the corpus's `jetstream-2026-07/`) describe
/// `repo.car`, from which `TestCorpusSegmentGolden` built the segment.
/// (DID, rev, [(collection/rkey, record CID)]).
type CorpusRecords = (String, String, Vec<(String, String)>);

fn corpus_records() -> Option<CorpusRecords> {
    let commit = riptide_testdata::read_string("jetstream-2026-07/car_expected_commit.txt")?;
    let field = |k: &str| {
        commit
            .lines()
            .find_map(|l| l.strip_prefix(k))
            .map(|v| v.trim().to_owned())
            .expect("commit field")
    };
    let tsv = riptide_testdata::read_string("jetstream-2026-07/car_expected_records.tsv")?;
    let records = tsv
        .lines()
        .map(|l| {
            let (k, c) = l.split_once('\t').expect("tsv");
            (k.to_owned(), c.to_owned())
        })
        .collect();
    Some((field("DID:"), field("Revision:"), records))
}

/// A CIDv1 (dag-cbor, sha2-256) in base32, from first principles.
fn cid_of(bytes: &[u8]) -> String {
    use sha2::Digest;
    let mut v = vec![0x01, 0x71, 0x12, 0x20];
    v.extend_from_slice(&sha2::Sha256::digest(bytes));
    format!("b{}", data_encoding::BASE32_NOPAD.encode(&v).to_lowercase())
}

#[test]
fn golden_corpus_segment_decodes_to_repo_car_records() {
    let Some(bytes) = golden("golden_corpus_segment.jss") else {
        return;
    };
    let Some((did, rev, records)) = corpus_records() else {
        return;
    };
    let seg = Segment::open(&bytes).unwrap();
    let h = seg.header();
    // internal/corpus/segment_golden_test.go: one KindCreate per record in MST key order,
    // Seq 1.., WitnessedAt 1_750_000_000_000_000 + seq, MaxEventsPerBlock 8; the corpus README
    // says 3 blocks, 23 events; 23 records in car_expected_records.tsv.
    assert_eq!(records.len(), 23);
    assert_eq!(
        (h.block_count, h.event_count, h.unique_did_count),
        (3, 23, 1)
    );
    assert_eq!((h.min_seq, h.max_seq), (1, 23));
    assert_eq!(
        (h.min_witnessed_at, h.max_witnessed_at),
        (1_750_000_000_000_001, 1_750_000_000_000_023)
    );
    let counts: Vec<u32> = seg.blocks().iter().map(|b| b.event_count).collect();
    assert_eq!(counts, [8, 8, 7]);
    let rows = all_rows(&seg);
    for (i, (r, (key, cid))) in rows.iter().zip(&records).enumerate() {
        let seq = i as u64 + 1;
        assert_eq!(
            (r.seq, r.witnessed_at, r.indexed_at),
            (seq, 1_750_000_000_000_000 + seq as i64, 0)
        );
        assert_eq!(r.kind, Kind::Create);
        assert_eq!(
            (r.did.as_str(), r.rev.as_str()),
            (did.as_str(), rev.as_str())
        );
        assert_eq!(format!("{}/{}", r.collection, r.rkey), *key);
        // The payload is the record block exactly as signed: its hash is the record's CID.
        assert_eq!(cid_of(&r.payload), *cid, "row {i}");
    }
    // Collections in first-seen (key) order, with their row counts.
    let mut want: Vec<(String, u32)> = Vec::new();
    for (key, _) in &records {
        let c = key.split_once('/').unwrap().0;
        match want.iter_mut().find(|(n, _)| n == c) {
            Some((_, n)) => *n += 1,
            None => want.push((c.to_owned(), 1)),
        }
    }
    let got: Vec<(String, u32)> = seg
        .collections()
        .names()
        .iter()
        .cloned()
        .zip(seg.collections().counts().iter().copied())
        .collect();
    assert_eq!(got, want);
    assert_eq!(seg.blocks_with_did(&did), [0, 1, 2]);
    cross_check(&bytes);
}

#[test]
fn legacy_segment_takes_its_bloom_size_from_the_footer() {
    let Some(bytes) = golden("legacy_fixed4096_blooms.jss") else {
        return;
    };
    let seg = Segment::open(&bytes).unwrap();
    let h = seg.header();
    // Corpus README: 2 blocks, 12 events. segment/rewrite_bloom_test.go
    // TestRewriteShrinksLegacyFixedCapacityBlooms: 8,409-byte per-block blooms (capacity 4096);
    // blocks hold 2 and 1 unique DIDs, did:plc:legacy-b0-u0, -b0-u1 and -b1-u0.
    assert_eq!(
        (h.block_count, h.event_count, h.unique_did_count),
        (2, 12, 3)
    );
    assert_eq!(seg.block_bloom_bytes(), 8409);
    let rows = all_rows(&seg);
    assert_eq!(rows.len(), 12);
    let mut per_block: Vec<std::collections::BTreeSet<&str>> = vec![Default::default(); 2];
    let mut at = 0;
    for (i, b) in seg.blocks().iter().enumerate() {
        for r in &rows[at..at + b.event_count as usize] {
            per_block[i].insert(r.did.as_str());
        }
        at += b.event_count as usize;
    }
    assert_eq!(
        per_block[0].iter().copied().collect::<Vec<_>>(),
        ["did:plc:legacy-b0-u0", "did:plc:legacy-b0-u1"]
    );
    assert_eq!(
        per_block[1].iter().copied().collect::<Vec<_>>(),
        ["did:plc:legacy-b1-u0"]
    );
    assert_eq!(seg.blocks_with_did("did:plc:legacy-b1-u0"), [1]);
    // Our bloom sizing (gloom's OptimalParams, a Poisson-weighted estimate in floating point)
    // against Jetstream's at two capacities: the 3 unique DIDs of the segment bloom (rebuilt
    // byte for byte, bits and CRC included) and the legacy fixed capacity 4096 of the per-block
    // blooms (version, k and block count).
    let dids: std::collections::BTreeSet<&str> = rows.iter().map(|r| r.did.as_str()).collect();
    let mut ours = BloomBuilder::new(dids.len() as u64, FP_RATE);
    dids.iter().for_each(|d| ours.insert(d.as_bytes()));
    let theirs = &bytes[h.did_bloom_offset as usize..h.block_did_bloom_offset as usize];
    assert_eq!(ours.to_bytes(), theirs);
    let legacy = BloomBuilder::new(4096, FP_RATE).to_bytes();
    assert_eq!(legacy.len(), 8409);
    let start = h.block_did_bloom_offset as usize + 8;
    assert_eq!(legacy[..13], bytes[start..start + 13]);
    assert!(seg.blocks_with_did("did:plc:legacy-b0-u1").contains(&0));
    cross_check(&bytes);
}

#[test]
fn golden_block_body_is_byte_equal_to_ours() {
    let Some(frame) = golden("golden_block.bin") else {
        return;
    };
    // segment/block_golden_test.go goldenEvents().
    let want = [
        Row {
            seq: 1,
            witnessed_at: 1_700_000_000_000_000,
            indexed_at: 0,
            kind: Kind::Create,
            did: "did:plc:abcdefghijklmnopqrstuvwx",
            collection: "app.bsky.feed.post",
            rkey: "3l3qo2vuowo2b",
            rev: "3l3qo2vutsw2b",
            payload: &[0xA1, 0x65, 0x68, 0x65, 0x6C, 0x6C, 0x6F, 0x05],
        },
        Row {
            seq: 2,
            witnessed_at: 1_700_000_001_000_000,
            indexed_at: 1_700_000_000_500_000,
            kind: Kind::Identity,
            did: "did:web:example.com",
            collection: "",
            rkey: "",
            rev: "",
            payload: &[],
        },
        Row {
            seq: 3,
            witnessed_at: 1_700_000_002_000_000,
            indexed_at: 0,
            kind: Kind::Delete,
            did: "did:plc:zzzzzzzzzzzzzzzzzzzzzzzz",
            collection: "app.bsky.feed.like",
            rkey: "3l3qo2vuowo2c",
            rev: "3l3qo2vutsw2c",
            payload: &[],
        },
    ];
    let body = decode_block_frame(&frame).unwrap();
    assert_eq!(decode_block(&body).unwrap(), want);
    assert_eq!(independent::unzstd(&frame).unwrap(), body);
    let mut ours = Vec::new();
    riptide_segment::encode_block(&want, &mut ours).unwrap();
    assert_eq!(ours, body, "uncompressed block bytes");
    // Our frame is libzstd's, not klauspost's: equal once decompressed.
    let frame2 = riptide_segment::encode_block_frame(&want).unwrap();
    assert_eq!(independent::unzstd(&frame2).unwrap(), body);
}

#[test]
fn resealing_golden_frames_reproduces_jetstreams_bytes() {
    for name in ["golden_seal.bin", "golden_corpus_segment.jss"] {
        let Some(bytes) = golden(name) else { return };
        let ours = reseal_from_frames(&bytes);
        if ours != bytes {
            // Only the collection index frame (and so the checksum) may differ.
            let coll = Segment::open(&bytes)
                .unwrap()
                .header()
                .collection_index_offset as usize;
            assert_eq!(&ours[..4], &bytes[..4]);
            assert_eq!(&ours[12..coll + 16], &bytes[12..coll + 16], "{name}");
        }
    }
}

#[test]
fn reencoding_golden_rows_gives_the_same_segment_after_decompression() {
    for name in [
        "golden_seal.bin",
        "golden_corpus_segment.jss",
        "legacy_fixed4096_blooms.jss",
    ] {
        let Some(bytes) = golden(name) else { return };
        if name.starts_with("legacy") {
            // Its blooms are of the old fixed size, which today's writer (ours and Jetstream's)
            // no longer produces: only the rows and the tables are compared.
            let seg = Segment::open(&bytes).unwrap();
            let bodies: Vec<Vec<u8>> = (0..2).map(|i| seg.block_body(i).unwrap()).collect();
            let rows: Vec<Vec<Row<'_>>> = bodies.iter().map(|b| decode_block(b).unwrap()).collect();
            let slices: Vec<&[Row<'_>]> = rows.iter().map(Vec::as_slice).collect();
            let file = write_segment(&slices).unwrap();
            let ours = Segment::open(&file).unwrap();
            assert_eq!(ours.collections(), seg.collections());
            assert!(
                ours.block_bloom_bytes() < 300,
                "right-sized: {}",
                ours.block_bloom_bytes()
            );
            for (i, body) in bodies.iter().enumerate() {
                assert_eq!(&ours.block_body(i).unwrap(), body);
            }
            continue;
        }
        reencode_rows(&bytes);
    }
}

#[test]
fn an_active_file_is_told_apart_from_a_corrupt_one() {
    let Some(mut bytes) = golden("golden_seal.bin") else {
        return;
    };
    bytes[4..12].fill(0);
    assert_eq!(Segment::open(&bytes).unwrap_err(), Error::Active);
}

/// The footer bound a reader checks before reading a footer into memory admits every real
/// footer: Jetstream's golden files (the legacy one's fixed 4,096-DID block blooms included) and
/// ours at a shape with many DIDs, collections and blocks; and it is far below the file for a
/// header whose counts are small, so that a damaged footer offset is refused.
#[test]
fn every_real_footer_is_within_the_format_bound() {
    let check = |bytes: &[u8]| {
        let seg = Segment::open(bytes).unwrap();
        let h = seg.header();
        let footer = bytes.len() as u64 - h.footer_offset;
        let bound = riptide_segment::max_footer_bytes(h);
        assert!(footer <= bound, "footer {footer} > bound {bound}");
        bound
    };
    for name in [
        "golden_seal.bin",
        "golden_corpus_segment.jss",
        "legacy_fixed4096_blooms.jss",
    ] {
        if let Some(bytes) = golden(name) {
            check(&bytes);
        }
    }
    let dids: Vec<String> = (0..3_000).map(|i| format!("did:plc:{i:024}")).collect();
    let colls: Vec<String> = (0..300).map(|i| format!("com.example.c{i}")).collect();
    let rows: Vec<Row<'_>> = (0..12_000u64)
        .map(|i| Row {
            seq: i + 1,
            witnessed_at: i as i64,
            indexed_at: 0,
            kind: Kind::Create,
            did: &dids[(i as usize * 7) % dids.len()],
            collection: &colls[(i as usize * 13) % colls.len()],
            rkey: "3k",
            rev: "3k",
            payload: b"\xa0",
        })
        .collect();
    let blocks: Vec<&[Row<'_>]> = rows.chunks(100).collect();
    let file = write_segment(&blocks).unwrap();
    let bound = check(&file);
    // 120 blocks of 12,000 rows, 3,000 DIDs: a bound of ~10 MiB (blooms sized for the lowest
    // rate any writer might use, one collection per row allowed), not the file's length.
    assert!(bound < 16 << 20, "{bound}");
    // Jetstream's one-block seal: a few hundred KiB, whatever the file's length.
    let tiny = riptide_segment::max_footer_bytes(&riptide_segment::Header {
        block_count: 1,
        event_count: 2,
        unique_did_count: 1,
        ..Default::default()
    });
    assert!(tiny < 512 << 10, "{tiny}");
}
