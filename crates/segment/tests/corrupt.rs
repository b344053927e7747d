//! Damaged segments: every truncation and every flipped byte of Jetstream's golden files gives
//! a typed error (or, where the format cannot see the change, the same rows), never a panic.

#![allow(clippy::unwrap_used)]

use riptide_segment::{decode_block, decode_block_frame, Error, OwnedRow, Row, Segment};

fn golden(name: &str) -> Option<Vec<u8>> {
    riptide_testdata::read(&format!("jetstream-v2/segments/{name}"))
}

/// Opens and decodes everything, as a client would; the rows or the first error.
fn read_all(bytes: &[u8]) -> Result<Vec<OwnedRow>, Error> {
    let seg = Segment::open(bytes)?;
    let mut out = Vec::new();
    for i in 0..seg.blocks().len() {
        let body = seg.block_body(i)?;
        out.extend(seg.rows(i, &body)?.iter().map(Row::to_owned_row));
        // Selection data must also be usable without error on an opened file.
        seg.block_bloom(i)?;
        let _ = seg.collections().block_ids(i).count();
    }
    Ok(out)
}

const FILES: [&str; 3] = [
    "golden_seal.bin",
    "golden_corpus_segment.jss",
    "legacy_fixed4096_blooms.jss",
];

#[test]
fn every_truncation_is_an_error() {
    for name in FILES {
        let Some(bytes) = golden(name) else { return };
        for cut in 0..bytes.len() {
            let err = read_all(&bytes[..cut]).unwrap_err();
            if cut < 256 {
                assert_eq!(err, Error::ShortFile { len: cut }, "{name} cut at {cut}");
            }
        }
        // And one byte appended: the footer (and so the checksum) changes.
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(read_all(&longer).is_err(), "{name} + 1 byte");
    }
}

#[test]
fn every_flipped_byte_is_an_error_where_the_checksums_cover_it() {
    for name in FILES {
        let Some(bytes) = golden(name) else { return };
        let good = read_all(&bytes).unwrap();
        let footer = Segment::open(&bytes).unwrap().header().footer_offset as usize;
        let mut benign = 0;
        // The legacy file's footer is 16 KiB of blooms: every 7th byte of it is enough.
        let step = |at: usize| {
            if at >= footer && bytes.len() > 8192 {
                7
            } else {
                1
            }
        };
        for at in (0..bytes.len()).filter(|&at| at % step(at) == 0) {
            for mask in [0x01u8, 0x80, 0xff] {
                let mut bad = bytes.clone();
                bad[at] ^= mask;
                let got = read_all(&bad);
                match at {
                    0..4 => assert!(matches!(got, Err(Error::BadMagic { .. })), "{name}@{at}"),
                    4..12 => assert!(
                        matches!(got, Err(Error::ChecksumMismatch { .. } | Error::Active)),
                        "{name}@{at}"
                    ),
                    // The header's fields and the whole footer are under the XXH3 checksum.
                    12..256 => assert!(got.is_err(), "{name}@{at}: {got:?}"),
                    a if a >= footer => assert!(
                        matches!(got, Err(Error::ChecksumMismatch { .. })),
                        "{name}@{at}: {got:?}"
                    ),
                    // Blocks: length prefixes are checked against the index, frames carry a
                    // content checksum. A flip the frame format cannot see must leave the rows
                    // exactly as they were.
                    _ => match got {
                        Err(_) => {}
                        Ok(rows) => {
                            assert_eq!(rows, good, "{name}@{at}^{mask:#x}: rows changed silently");
                            benign += 1;
                        }
                    },
                }
            }
        }
        // The segment checksum does not cover the blocks, and zstd's content checksum covers
        // what a frame decodes to, not how it is encoded: a flip in a frame's window
        // descriptor or in a bitstream's padding decodes to the same bytes (golden_seal.bin
        // has 4 such of its 1,155 flips in blocks). Such flips change nothing a reader sees.
        assert!(
            benign * 50 < (footer - 256) * 3,
            "{name}: {benign} benign flips"
        );
    }
}

#[test]
fn a_damaged_bare_block_frame_is_an_error() {
    let Some(frame) = golden("golden_block.bin") else {
        return;
    };
    for cut in 0..frame.len() {
        assert!(decode_block_frame(&frame[..cut]).is_err(), "cut at {cut}");
    }
    for at in 0..frame.len() {
        let mut bad = frame.clone();
        bad[at] ^= 0x01;
        if let Ok(body) = decode_block_frame(&bad) {
            // Only a flip that zstd cannot see may decode, and then its body must still parse
            // or fail cleanly.
            let _ = decode_block(&body);
        }
    }
}

#[test]
fn hostile_sizes_do_not_allocate() {
    let Some(bytes) = golden("golden_corpus_segment.jss") else {
        return;
    };
    // Block count at the limit with the footer offsets unchanged: refused before any
    // allocation (the index would run past the blooms).
    let mut bad = bytes.clone();
    bad[14..18].copy_from_slice(&(1u32 << 20).to_le_bytes());
    assert!(matches!(Segment::open(&bad), Err(Error::Footer(_))));
    bad[14..18].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(matches!(Segment::open(&bad), Err(Error::TooMany { .. })));
    // Offsets past the end of the file.
    let mut bad = bytes.clone();
    bad[58..66].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(Segment::open(&bad), Err(Error::Footer(_))));
    // A block body claiming 2^32 - 1 rows.
    let mut body = vec![0xff; 4];
    body.extend_from_slice(&[0; 64]);
    assert!(matches!(decode_block(&body), Err(Error::Block { .. })));
}

/// A file with 8 bytes between its blocks, indexed and checksummed correctly: Jetstream's reader
/// would serve it, and the Python SDK, walking length prefixes from 256, would misread it.
#[test]
fn a_gap_between_blocks_is_refused() {
    use riptide_segment::{checksum, write_segment, Header, Kind, BLOCK_INDEX_ENTRY, HEADER_BYTES};
    let row = |seq| Row {
        seq,
        witnessed_at: 1,
        indexed_at: 0,
        kind: Kind::Create,
        did: "did:plc:a",
        collection: "a.b.c",
        rkey: "k",
        rev: "r",
        payload: b"p",
    };
    let file = write_segment(&[&[row(1)], &[row(2)]]).unwrap();
    let seg = Segment::open(&file).unwrap();
    let (b1, footer) = (
        seg.blocks()[1].offset as usize,
        seg.header().footer_offset as usize,
    );
    let mut h = *seg.header();
    let mut out = file[..b1].to_vec();
    out.extend_from_slice(&[0; 8]);
    out.extend_from_slice(&file[b1..]);
    let f = footer + 8;
    let entry1 = f + BLOCK_INDEX_ENTRY;
    out[entry1..entry1 + 8].copy_from_slice(&(b1 as u64 + 8).to_le_bytes());
    for o in [
        &mut h.footer_offset,
        &mut h.block_index_offset,
        &mut h.did_bloom_offset,
        &mut h.block_did_bloom_offset,
        &mut h.collection_index_offset,
    ] {
        *o += 8;
    }
    h.checksum = 0;
    h.checksum = checksum(&h.encode(), &out[f..]);
    out[..HEADER_BYTES].copy_from_slice(&h.encode());
    assert_eq!(Header::parse(&out).unwrap(), h);
    assert!(
        matches!(Segment::open(&out), Err(Error::BlockIndex { block: 1, .. })),
        "{:?}",
        Segment::open(&out).err()
    );
}
