//! What the folding tests share (`fold.rs`: the pass alone; `folding.rs`: the store running it):
//! the `#account` payloads that delete accounts, and segment files made of rows as sealing makes
//! them.
#![allow(dead_code, clippy::unwrap_used)]

use std::path::Path;

use riptide_cbor::{write_bool, write_int, write_map_header, write_text};
use riptide_segment::{write_segment, Row, Segment};
use riptide_store::catalog::SegmentEntry;

/// An `#account` payload in DAG-CBOR's key order (did, seq, time, active, status).
pub fn account(did: &str, active: bool, status: &str) -> Vec<u8> {
    let mut out = Vec::new();
    write_map_header(&mut out, 5);
    write_text(&mut out, "did");
    write_text(&mut out, did);
    write_text(&mut out, "seq");
    write_int(&mut out, 1);
    write_text(&mut out, "time");
    write_text(&mut out, "2026-11-28T00:00:00Z");
    write_text(&mut out, "active");
    write_bool(&mut out, active);
    write_text(&mut out, "status");
    write_text(&mut out, status);
    out
}

/// Writes `rows` as segment files `seg_{first}…` in `segments` (`block_rows` a block,
/// `segment_blocks` blocks a file), calling `put` with each file's entry; returns each file's
/// bytes.
pub fn write_segments(
    segments: &Path,
    rows: &[Row<'_>],
    first: u32,
    (block_rows, segment_blocks): (usize, usize),
    mut put: impl FnMut(&SegmentEntry),
) -> Vec<Vec<u8>> {
    std::fs::create_dir_all(segments).unwrap();
    let mut files = Vec::new();
    for (i, seg_rows) in rows.chunks(block_rows * segment_blocks).enumerate() {
        let blocks: Vec<&[Row<'_>]> = seg_rows.chunks(block_rows).collect();
        let file = write_segment(&blocks).unwrap();
        let seg = Segment::open(&file).unwrap();
        let entry = SegmentEntry::from_header(first + i as u32, seg.header(), 0);
        std::fs::write(segments.join(entry.name()), &file).unwrap();
        put(&entry);
        files.push(file);
    }
    files
}
