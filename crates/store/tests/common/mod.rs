//! What the store's integration tests share: for the folding tests (`fold.rs`: the pass alone;
//! `folding.rs`: the store running it), the `#account` payloads that delete accounts and segment
//! files made of rows as sealing makes them; for the tests of row blocks and sealing, a generated
//! stream with every kind of row, appended as ingest appends it, read back as a replay reads, and
//! compared byte for byte with what ingest made.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use riptide_cbor::{write_bool, write_int, write_map_header, write_text};
use riptide_firehose::FrameDecoder;
use riptide_jetstream::Projector;
use riptide_segment::{write_segment, OwnedRow, Row, Segment};
use riptide_store::catalog::SegmentEntry;
use riptide_store::{Event, ReadLimit, Resume, Store};

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

/// Every event of a generated stream (every kind of row: creates, updates, deletes, identity,
/// account, `#sync`): its v1 JSON as ingest makes it, and its row. Made once for all the tests.
pub fn generated() -> &'static [(Event, OwnedRow)] {
    static EVENTS: std::sync::OnceLock<Vec<(Event, OwnedRow)>> = std::sync::OnceLock::new();
    EVENTS.get_or_init(generate)
}

pub fn generate() -> Vec<(Event, OwnedRow)> {
    let mut net = riptide_gen::Network::new(riptide_gen::Config::new(5, 100, 1_500)).unwrap();
    let mut frames = Vec::new();
    net.run(|f: &[u8]| -> Result<(), riptide_gen::GenError> {
        frames.push(f.to_vec());
        Ok(())
    })
    .unwrap();
    let (mut dec, mut proj) = (FrameDecoder::new(), Projector::with_sync());
    let mut out = Vec::new();
    let mut json = Vec::new();
    for f in &frames {
        let Ok(frame) = dec.decode(f) else { continue };
        let p = proj.project(&frame);
        for (i, r) in p.stored_rows(&frame).unwrap().iter().enumerate() {
            let seq = out.len() as u64 + 1;
            let time_us = 1_750_000_000_000_000 + 3 * seq as i64;
            json.clear();
            p.render(i, time_us, Some(seq), &mut json);
            let e = Event::encode(
                seq,
                time_us,
                p.kind(i),
                p.did(i),
                p.collection(i),
                &json,
                b"",
            );
            out.push((e, r.row(seq, time_us).to_owned_row()));
        }
    }
    assert!(out.len() >= 1_500, "{} events", out.len());
    out
}

/// Appends `evs` in batches of `batch`, with their rows unless `without_rows(first seq)`.
pub fn append(
    s: &Store,
    evs: &[(Event, OwnedRow)],
    batch: usize,
    without_rows: impl Fn(u64) -> bool,
) {
    for chunk in evs.chunks(batch) {
        let events: Vec<Event> = chunk.iter().map(|(e, _)| e.clone()).collect();
        let last = &events[events.len() - 1];
        let resume = Resume {
            next_seq: last.seq() + 1,
            last_time_us: last.time_us(),
            upstream_cursor: Some(last.seq()),
        };
        if without_rows(events[0].seq()) {
            s.append(&events, &resume).unwrap();
        } else {
            let rows: Vec<_> = chunk.iter().map(|(_, r)| r.as_row()).collect();
            s.append_rows(&events, &rows, &[], &[], &resume).unwrap();
        }
    }
}

/// Every event read back from `from`, in small reads (as a replay reads).
pub fn read_all(s: &Store, from: u64) -> Vec<Event> {
    let (mut all, mut got, mut next) = (Vec::new(), Vec::new(), from);
    let limit = ReadLimit {
        events: 97,
        bytes: 16 << 10,
    };
    loop {
        got.clear();
        s.read_from(next, limit, &mut got).unwrap();
        let Some(last) = got.last() else { break };
        next = last.seq() + 1;
        all.append(&mut got);
    }
    all
}

pub fn same(got: &[Event], want: &[(Event, OwnedRow)]) {
    assert_eq!(got.len(), want.len());
    for (g, (w, _)) in got.iter().zip(want) {
        assert_eq!(g.seq(), w.seq());
        assert_eq!(
            (g.time_us(), g.kind(), g.did(), g.collection()),
            (w.time_us(), w.kind(), w.did(), w.collection()),
            "seq {}",
            w.seq()
        );
        assert!(
            g.json() == w.json(),
            "seq {}: read back\n  {}\nbut ingest made\n  {}",
            w.seq(),
            String::from_utf8_lossy(&g.json()),
            String::from_utf8_lossy(&w.json())
        );
    }
}
