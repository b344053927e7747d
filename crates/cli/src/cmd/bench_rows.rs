//! `riptide bench rows`: what the store would cost with Jetstream v2's `.jss` rows as its only
//! block format (issue 38; `docs/archive.md`, "One copy of the data"), measured before switching.
//!
//! The frames of `FILE` (a corpus, or `riptide gen`'s stream) are decoded with every CAR block
//! checked against its CID and projected as ingest projects them (`#sync` included); each event
//! gets a seq and a `time_us`, and its v1 JSON is made exactly as ingest makes it. Then, from the
//! same events:
//!
//! - **today's store**: the events appended to a fresh store (`riptide-store`, layout 4: zstd
//!   level-2 blocks of 4,096 events, v1 JSON only), flushed; bytes of its segment files per event
//!   (`v1_store_bytes_per_event`, what `bench serve` reports as `store_bytes_per_event`: blocks,
//!   time index, the `recent` partition's leftovers, meta: `v1_recent_bytes_per_event` says how
//!   much of it is values of unsealed events flushed before their block was sealed, which
//!   compaction drops later) and of its `blocks` partition alone (`v1_block_bytes_per_event`, what
//!   the rows replace: `rows_to_v1_block_bytes`);
//! - **rows**: the same events as `.jss` rows — a commit's record as its DAG-CBOR as signed, an
//!   identity, account or sync event's payload as the upstream event's DAG-CBOR — in blocks of
//!   4,096 (one zstd frame each, `riptide_segment`), and sealed into one segment (header, blocks,
//!   footer with its DID blooms and collection bitmaps): `rows_block_bytes_per_event` (frames and
//!   their length prefixes) and `rows_segment_bytes_per_event` (the whole file);
//! - **rendering**: v1 JSON made again from every row ([`riptide_jetstream::Projector::project_row`]:
//!   the record's DAG-CBOR to JSON, its CID by hashing it) and compared with what ingest made, byte
//!   for byte; any difference fails the run. Timed three ways, each a median of passes with min
//!   and max: from rows in memory (`render_rows`), from the block frames (decompress, decode,
//!   render: `replay_rows`, what a replay from disk would do minus the socket; `replay_blocks`,
//!   the same a block at a time with the block's record CIDs hashed together, as the store
//!   renders a block once into its cache), and beside them
//!   today's read of the same events back from the store's blocks (`replay_v1_store`: decompress
//!   through the block cache, no rendering) and the same read from a store given the rows too
//!   (`replay_rows_store`: layout 5's row blocks, each rendered as it is loaded into the cache),
//!   all in this process, on one thread;
//! - **the store with rows**: the same events appended with their rows (`Store::append_rows`),
//!   read back once and checked against ingest's JSON, and the bytes of its row blocks per event
//!   (`rows_store_block_bytes_per_event`, to set beside `v1_block_bytes_per_event`).
//!
//! The replay figures carry no socket: compare them with each other, not with `bench serve`'s
//! replay rates (which do).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context;
use riptide_firehose::FrameDecoder;
use riptide_jetstream::{EventKind, Projector, StoredRow};
use riptide_segment::{
    decode_block, decode_block_frame, encode_block_frame, OwnedRow, Row, SegmentWriter,
    HEADER_BYTES,
};
use riptide_store::{Event, Resume, Store, StoreOptions, Utf8Text};

use super::bench::{Passes, Stats};

#[derive(clap::Args, Debug)]
pub struct RowsArgs {
    /// Frames (a corpus file, or `riptide gen`'s firehose-frames.bin).
    file: PathBuf,
    #[command(flatten)]
    runs: Passes,
    /// Repeat the frames this many times (a small corpus fills no block otherwise).
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// Rows per block (Jetstream's 4,096), and events per block of today's store.
    #[arg(long, default_value_t = 4096)]
    block_rows: usize,
    /// One JSON object on stdout.
    #[arg(long)]
    json: bool,
}

/// One event: its v1 JSON as ingest made it, and its row.
struct Made {
    json: Vec<u8>,
    row: OwnedRow,
}

pub fn run(a: RowsArgs) -> anyhow::Result<ExitCode> {
    a.runs.check()?;
    anyhow::ensure!(a.block_rows > 0, "--block-rows must be at least 1");
    let file = std::fs::read(&a.file).with_context(|| a.file.display().to_string())?;
    let frames = super::corpus_frames(&a.file, &file)?;
    let made = project(&frames, a.repeat.max(1))?;
    anyhow::ensure!(!made.is_empty(), "{}: no events", a.file.display());
    let n = made.len() as f64;
    eprintln!(
        "{} frames × {}: {} events",
        frames.len(),
        a.repeat.max(1),
        made.len()
    );

    // Today's store.
    let dir = tempfile::tempdir()?;
    let opts = StoreOptions {
        block_events: a.block_rows,
        ..StoreOptions::default()
    };
    let (store, _) = Store::<Utf8Text>::open_with(dir.path(), 0, opts)?;
    let events: Vec<Event> = made
        .iter()
        .map(|m| {
            let r = m.row.as_row();
            let kind = EventKind::of_row(r.kind);
            Event::encode(
                r.seq,
                r.witnessed_at,
                kind,
                r.did,
                r.collection,
                &m.json,
                b"",
            )
        })
        .collect();
    for chunk in events.chunks(1000) {
        let last = &chunk[chunk.len() - 1];
        let resume = Resume {
            next_seq: last.seq() + 1,
            last_time_us: last.time_us(),
            upstream_cursor: Some(last.seq()),
        };
        store.append(chunk, &resume)?;
    }
    store.flush()?;
    let disk = store.disk_usage();

    // The store with rows (layout 5): the same events appended with their rows, sealed as row
    // blocks.
    let rows_dir = tempfile::tempdir()?;
    let (rows_store, _) = Store::<Utf8Text>::open_with(rows_dir.path(), 0, opts)?;
    for (chunk, made) in events.chunks(1000).zip(made.chunks(1000)) {
        let last = &chunk[chunk.len() - 1];
        let resume = Resume {
            next_seq: last.seq() + 1,
            last_time_us: last.time_us(),
            upstream_cursor: Some(last.seq()),
        };
        let rows: Vec<Row<'_>> = made.iter().map(|m| m.row.as_row()).collect();
        rows_store.append_rows(chunk, &rows, &[], &[], &resume)?;
    }
    rows_store.flush()?;
    let rows_disk = rows_store.disk_usage();
    let mut back = Vec::new();
    read_back(&rows_store, &mut back)?;
    anyhow::ensure!(
        back.len() == events.len() && back.iter().zip(&events).all(|(b, e)| b.json() == e.json()),
        "the store with rows read back {} events, not the {} appended as ingest made them",
        back.len(),
        events.len()
    );

    // Rows: block frames, and one sealed segment of them.
    let rows: Vec<Row<'_>> = made.iter().map(|m| m.row.as_row()).collect();
    let mut frames_out = Vec::new();
    let mut block_bytes = 0u64;
    for chunk in rows.chunks(a.block_rows) {
        let f = encode_block_frame(chunk)?;
        block_bytes += 8 + f.len() as u64;
        frames_out.push(f);
    }
    let mut w = SegmentWriter::new();
    let mut seg = vec![0u8; HEADER_BYTES];
    for chunk in rows.chunks(a.block_rows) {
        w.append_rows(chunk, &mut seg)?;
    }
    let sealed = w.finish()?;
    let segment_bytes = seg.len() as u64 + sealed.footer.len() as u64;

    // Rendering, checked once against ingest's JSON, then timed.
    let mut proj = Projector::new();
    let mut out = Vec::new();
    for m in &made {
        render(&mut proj, &m.row.as_row(), &mut out)?;
        anyhow::ensure!(
            out == m.json,
            "seq {}: rendered from the row\n  {}\nbut ingest made\n  {}",
            m.row.seq,
            String::from_utf8_lossy(&out),
            String::from_utf8_lossy(&m.json)
        );
    }
    let mut sink = 0usize;
    let render_rows = Stats::of(a.runs.time(|| {
        let t = Instant::now();
        for r in &rows {
            if render(&mut proj, r, &mut out).is_ok() {
                sink += out.len();
            }
        }
        n / t.elapsed().as_secs_f64()
    }));
    let replay_rows = Stats::of(a.runs.time(|| {
        let t = Instant::now();
        for f in &frames_out {
            let Ok(body) = decode_block_frame(f) else {
                continue;
            };
            let Ok(rows) = decode_block(&body) else {
                continue;
            };
            for r in &rows {
                if render(&mut proj, r, &mut out).is_ok() {
                    sink += out.len();
                }
            }
        }
        n / t.elapsed().as_secs_f64()
    }));
    // The same, a block at a time as the store renders a block into its cache: the block's
    // record CIDs hashed together (`Projector::project_rows`).
    let replay_blocks = Stats::of(a.runs.time(|| {
        let t = Instant::now();
        for f in &frames_out {
            let Ok(body) = decode_block_frame(f) else {
                continue;
            };
            let Ok(rows) = decode_block(&body) else {
                continue;
            };
            let stored: Vec<StoredRow<'_>> = rows.iter().map(StoredRow::from_row).collect();
            proj.project_rows(&stored, |i, p| {
                if let Ok(p) = p {
                    out.clear();
                    p.render(0, rows[i].display_time_us(), Some(rows[i].seq), &mut out);
                    sink += out.len();
                }
            });
        }
        n / t.elapsed().as_secs_f64()
    }));
    // Today's replay from disk: every event read back through the block cache (cold for the
    // first read of each block: the cache holds 8 blocks, the store more).
    let mut got = Vec::new();
    let replay_v1 = Stats::of(a.runs.time(|| {
        let t = Instant::now();
        sink += read_back(&store, &mut got).unwrap_or(0);
        n / t.elapsed().as_secs_f64()
    }));
    // The same from the store with rows: each block rendered as it is loaded into the cache.
    let replay_rows_store = Stats::of(a.runs.time(|| {
        let t = Instant::now();
        sink += read_back(&rows_store, &mut got).unwrap_or(0);
        n / t.elapsed().as_secs_f64()
    }));
    std::hint::black_box(sink);

    let per = |b: u64| b as f64 / n;
    let report = serde_json::json!({
        "bench": "rows",
        "file": a.file.display().to_string(),
        "repeat": a.repeat.max(1),
        "events": made.len(),
        "block_rows": a.block_rows,
        "v1_store_bytes_per_event": per(disk.segment_bytes),
        "v1_block_bytes_per_event": per(disk.block_bytes),
        "v1_recent_bytes_per_event": per(disk.recent_bytes),
        "rows_block_bytes_per_event": per(block_bytes),
        "rows_segment_bytes_per_event": per(segment_bytes),
        "rows_to_v1_block_bytes": per(block_bytes) / per(disk.block_bytes),
        "rows_store_block_bytes_per_event": per(rows_disk.block_bytes),
        "render_rows_events_per_s": render_rows.json(),
        "replay_rows_events_per_s": replay_rows.json(),
        "replay_blocks_events_per_s": replay_blocks.json(),
        "replay_v1_store_events_per_s": replay_v1.json(),
        "replay_rows_store_events_per_s": replay_rows_store.json(),
        "rendered_identical": made.len(),
        "machine": super::bench::machine(),
        "date": super::bench::utc_now(),
    });
    if a.json {
        println!("{report}");
    } else {
        println!("{}", serde_json::to_string_pretty(&report)?);
    }
    Ok(ExitCode::SUCCESS)
}

/// Every event of `store` read as a replay reads it (256 at a time, through the block cache),
/// into `out` (cleared); how many.
fn read_back(store: &Store<Utf8Text>, out: &mut Vec<Event>) -> anyhow::Result<usize> {
    out.clear();
    let mut got = Vec::new();
    let mut from = 0;
    let limit = riptide_store::ReadLimit {
        events: 256,
        bytes: 1 << 20,
    };
    loop {
        got.clear();
        store.read_from(from, limit, &mut got)?;
        match got.last() {
            Some(e) => from = e.seq() + 1,
            None => return Ok(out.len()),
        }
        out.append(&mut got);
    }
}

/// v1 JSON of `row` into `out` (cleared), as [`riptide_jetstream::Projection::render`] stamps it.
fn render(proj: &mut Projector, row: &Row<'_>, out: &mut Vec<u8>) -> anyhow::Result<()> {
    let stored = StoredRow::from_row(row);
    let p = proj.project_row(&stored)?;
    out.clear();
    p.render(0, row.display_time_us(), Some(row.seq), out);
    Ok(())
}

/// Every event of `frames` (`repeat` times), with its v1 JSON made as ingest makes it and its row
/// ([`riptide_jetstream::Projection::stored_rows`]).
fn project(
    frames: &[riptide_firehose::corpus::CorpusFrame<'_>],
    repeat: usize,
) -> anyhow::Result<Vec<Made>> {
    let mut dec = FrameDecoder::new();
    let mut proj = Projector::with_sync();
    let mut made = Vec::new();
    let mut seq = 0u64;
    let t0 = 1_750_000_000_000_000i64;
    for _ in 0..repeat {
        for f in frames {
            // A frame that does not decode makes no event at ingest either.
            let Ok(frame) = dec.decode(f.bytes) else {
                continue;
            };
            let p = proj.project(&frame);
            for (i, r) in p.stored_rows(&frame)?.iter().enumerate() {
                seq += 1;
                let time_us = t0 + seq as i64;
                let mut json = Vec::new();
                p.render(i, time_us, Some(seq), &mut json);
                made.push(Made {
                    json,
                    row: r.row(seq, time_us).to_owned_row(),
                });
            }
        }
    }
    Ok(made)
}
