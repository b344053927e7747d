//! Helpers shared by the integration tests.

#![allow(dead_code, clippy::unwrap_used)]

pub mod independent;

use independent::bloom_has;
use riptide_segment::Segment;

/// The crate's reader and the independent decoder agree on everything a file holds.
pub fn cross_check(bytes: &[u8]) {
    let seg = Segment::open(bytes).expect("open");
    let ind = independent::decode(bytes).expect("independent decode");
    assert!(ind.checksum_ok, "independent checksum");
    let h = seg.header();
    assert_eq!(ind.stored_checksum, h.checksum);
    assert_eq!(
        ind.counts,
        (
            u64::from(h.block_count),
            u64::from(h.event_count),
            u64::from(h.unique_did_count)
        )
    );
    assert_eq!(ind.seq, (h.min_seq, h.max_seq));
    assert_eq!(ind.time, (h.min_witnessed_at, h.max_witnessed_at));
    assert_eq!(
        ind.offsets,
        [
            h.footer_offset,
            h.did_bloom_offset,
            h.block_did_bloom_offset,
            h.collection_index_offset,
            h.block_index_offset
        ]
    );
    assert_eq!(ind.blocks.len(), seg.blocks().len());
    let mut dids = std::collections::BTreeSet::new();
    for (i, (ib, b)) in ind.blocks.iter().zip(seg.blocks()).enumerate() {
        assert_eq!(
            (ib.offset, ib.csize, ib.usize_, ib.count, ib.seq, ib.time),
            (
                b.offset,
                u64::from(b.compressed_size),
                u64::from(b.uncompressed_size),
                u64::from(b.event_count),
                (b.min_seq, b.max_seq),
                (b.min_witnessed_at, b.max_witnessed_at)
            )
        );
        let body = seg.block_body(i).unwrap();
        let rows = seg.rows(i, &body).unwrap();
        assert_eq!(rows.len(), ib.rows.len());
        for (r, ir) in rows.iter().zip(&ib.rows) {
            assert_eq!(
                (r.seq, r.witnessed_at, r.indexed_at, r.kind as u8),
                (ir.seq, ir.witnessed, ir.indexed, ir.kind)
            );
            assert_eq!(r.collection.as_bytes(), ir.collection);
            assert_eq!(r.did.as_bytes(), ir.did);
            assert_eq!(r.rkey.as_bytes(), ir.rkey);
            assert_eq!(r.rev.as_bytes(), ir.rev);
            assert_eq!(r.payload, ir.payload);
            // Both bloom implementations find every DID in its block and its segment (an
            // empty DID is in no bloom and counts as no DID, as Jetstream's seal walk does).
            if !r.did.is_empty() {
                assert!(bloom_has(&ind.block_blooms[i], &ir.did));
                assert!(bloom_has(&ind.seg_bloom, &ir.did));
                assert!(seg.blocks_with_did(r.did).contains(&i));
                dids.insert(r.did.to_owned());
            }
        }
        let names: Vec<String> = seg
            .collections()
            .block_ids(i)
            .map(|id| seg.collections().names()[id as usize].clone())
            .collect();
        assert_eq!(names, ind.block_collections[i]);
    }
    assert_eq!(dids.len() as u32, h.unique_did_count);
    assert_eq!(seg.block_bloom_bytes() as u64, ind.block_bloom_size);
    let colls: Vec<(String, u64)> = seg
        .collections()
        .names()
        .iter()
        .cloned()
        .zip(seg.collections().counts().iter().map(|&c| u64::from(c)))
        .collect();
    assert_eq!(colls, ind.collections);
    assert_eq!(seg.collections().body(), ind.collection_body);
}
