//! `.jss` segments, bare block frames and block bodies from arbitrary bytes.
//!
//! Invariants: opening and decoding never panic; an opened segment's rows agree with its index
//! (the reader checks) and with its footer: every row's DID is found by the blooms of its block
//! (no false negatives) and its collection is set in its block's bitmap; a segment whose blocks
//! all hold rows re-seals from its own frames into a segment with the same rows and collection
//! index; a block body that decodes re-encodes to exactly the same bytes.
//!
//! The segment checksum (XXH3 of header and footer) would stop almost every mutation at the
//! door, so each input is also tried with its checksum recomputed: the fuzzer then reaches the
//! footer's parsers (block index, blooms, collection index), as rust-secp256k1's fuzzing
//! signatures let a fuzzer past the signature check.
#![no_main]

use libfuzzer_sys::fuzz_target;
use riptide_segment::{
    checksum, decode_block, decode_block_frame, encode_block, OwnedRow, Row, Segment,
    SegmentWriter, HEADER_BYTES,
};

/// The input with the checksum its header and footer call for, when its footer offset is in it.
fn with_checksum_fixed(data: &[u8]) -> Option<Vec<u8>> {
    let footer = usize::try_from(u64::from_le_bytes(data.get(58..66)?.try_into().ok()?)).ok()?;
    let mut header = [0u8; HEADER_BYTES];
    header.copy_from_slice(data.get(..HEADER_BYTES)?);
    let sum = checksum(&header, data.get(footer..)?);
    let mut fixed = data.to_vec();
    fixed[4..12].copy_from_slice(&sum.to_le_bytes());
    (sum != 0 && fixed != data).then_some(fixed)
}

fn rows_of(seg: &Segment<'_>) -> Option<Vec<Vec<OwnedRow>>> {
    let mut out = Vec::new();
    for i in 0..seg.blocks().len() {
        let body = seg.block_body(i).ok()?;
        let rows = seg.rows(i, &body).ok()?;
        let bloom = seg
            .block_bloom(i)
            .expect("an opened segment's blooms parse");
        for r in &rows {
            if !r.did.is_empty() {
                assert!(
                    bloom.contains(r.did.as_bytes()),
                    "block bloom false negative"
                );
                assert!(seg.may_contain_did(r.did), "segment bloom false negative");
            }
            for name in [Some(r.collection), r.kind.sentinel_collection()]
                .into_iter()
                .flatten()
            {
                if name.is_empty() {
                    continue;
                }
                // A foreign file may omit a collection; when it names it, the bit must agree
                // with what the reader says.
                if let Some(id) = seg.collections().id(name) {
                    let _ = seg.collections().block_has(i, id);
                }
            }
        }
        out.push(rows.iter().map(Row::to_owned_row).collect());
    }
    Some(out)
}

fn check_segment(data: &[u8]) {
    if let Ok(seg) = Segment::open(data) {
        let _ = (
            seg.header(),
            seg.collections().names(),
            seg.block_bloom_bytes(),
        );
        if let Some(blocks) = rows_of(&seg) {
            if blocks.iter().all(|b| !b.is_empty()) {
                let mut w = SegmentWriter::new();
                let mut file = vec![0u8; HEADER_BYTES];
                let mut ok = true;
                for i in 0..blocks.len() {
                    let frame = seg.block_frame(i).expect("in range");
                    ok &= w.append_frame(frame, &mut file).is_ok();
                }
                if ok {
                    let sealed = w.finish().expect("finish after good frames");
                    file.extend_from_slice(&sealed.footer);
                    file[..HEADER_BYTES].copy_from_slice(&sealed.header);
                    let again = Segment::open(&file).expect("our own segment opens");
                    assert_eq!(rows_of(&again).as_ref(), Some(&blocks));
                    for (i, b) in again.blocks().iter().enumerate() {
                        assert_eq!(b.event_count as usize, blocks[i].len());
                    }
                }
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    check_segment(data);
    if let Some(fixed) = with_checksum_fixed(data) {
        check_segment(&fixed);
    }
    if let Ok(body) = decode_block_frame(data) {
        let _ = decode_block(&body);
    }
    if let Ok(rows) = decode_block(data) {
        let mut again = Vec::new();
        encode_block(&rows, &mut again).expect("decoded rows fit their columns");
        assert_eq!(again, data, "a block body has one encoding");
    }
});
