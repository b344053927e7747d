//! The planner's figure of issue 38: `planSnapshot` for 10,000 DIDs over 1,000 sealed segments
//! (target ≤ 50 ms). Each segment holds 16 blocks of 1,024 commit rows from 5,000 DIDs of its
//! own, so almost every requested DID is absent from almost every segment and the time is the
//! DID blooms' (segment bloom first, block blooms for the DIDs that pass).
//!
//! ```sh
//! cargo run --release -p riptide-segment --example plan_bench -- [PASSES] [SEGMENTS]
//! ```
//!
//! Prints the median, min and max wall time of a plan over the passes, and the plan's counts
//! (so that a faster planner that plans less shows up).

#![allow(clippy::unwrap_used, clippy::print_stdout)]

use std::time::Instant;

use riptide_segment::plan::{plan, PlanRequest};
use riptide_segment::{write_segment, Kind, Row, SegmentMeta};

const BLOCKS: usize = 16;
const ROWS: usize = 1_024;
const DIDS_PER_SEGMENT: usize = 5_000;
const WANTED: usize = 10_000;
/// Of the wanted DIDs, how many have rows in the archive (the rest are absent everywhere).
const PRESENT: usize = 10;

fn did(n: usize) -> String {
    format!("did:plc:{n:024}")
}

/// One segment's metadata: header and footer only, as the server keeps it.
fn segment(index: usize) -> SegmentMeta {
    let dids: Vec<String> = (0..DIDS_PER_SEGMENT)
        .map(|i| did(index * DIDS_PER_SEGMENT + i))
        .collect();
    let base = (index * BLOCKS * ROWS) as u64;
    let rows: Vec<Row<'_>> = (0..BLOCKS * ROWS)
        .map(|i| Row {
            seq: base + i as u64 + 1,
            witnessed_at: (base + i as u64) as i64,
            indexed_at: 0,
            kind: Kind::Create,
            did: &dids[i % DIDS_PER_SEGMENT],
            collection: "app.bsky.feed.post",
            rkey: "3l2kuhrxsdd2c",
            rev: "3l2kuhrxsdd2c",
            payload: b"\xa0",
        })
        .collect();
    let blocks: Vec<&[Row<'_>]> = rows.chunks(ROWS).collect();
    SegmentMeta::from_file(&write_segment(&blocks).unwrap()).unwrap()
}

/// The process's CPU time (user + system, all threads) in ms, from `/proc/self/stat` (Linux;
/// `None` elsewhere). Under load, CPU per plan moves less than wall time does.
fn cpu_ms() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which may hold spaces) end at the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    // USER_HZ is 100 on every Linux this runs on.
    Some(ticks * 10.0)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let passes: usize = args.next().map_or(9, |a| a.parse().unwrap());
    let count: usize = args.next().map_or(1_000, |a| a.parse().unwrap());
    let t = Instant::now();
    let segments: Vec<SegmentMeta> = (0..count).map(segment).collect();
    println!(
        "built {count} segments of {BLOCKS}x{ROWS} rows in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    // PRESENT DIDs spread over the archive, the rest absent from every segment.
    let total = count * DIDS_PER_SEGMENT;
    let mut wanted: Vec<String> = (0..PRESENT).map(|i| did(i * total / PRESENT)).collect();
    wanted.extend((PRESENT..WANTED).map(|i| did(total + i)));
    let req = PlanRequest::new(&[] as &[&str], &wanted, &[] as &[&str], None, None).unwrap();
    let mut times = Vec::with_capacity(passes);
    let mut last = None;
    let cpu_before = cpu_ms();
    for _ in 0..passes {
        let t = Instant::now();
        let p = plan(
            segments.iter().enumerate().map(|(i, m)| (i as u64, m)),
            &req,
            100_000,
        );
        times.push(t.elapsed().as_secs_f64() * 1e3);
        last = Some(p);
    }
    let cpu = cpu_before.zip(cpu_ms()).map_or_else(
        || "?".to_string(),
        |(a, b)| format!("{:.0}", (b - a) / passes as f64),
    );
    let p = last.unwrap();
    times.sort_by(f64::total_cmp);
    println!(
        "plan: {WANTED} DIDs ({PRESENT} present) over {count} segments: median {:.1} ms \
         (min {:.1}, max {:.1}) over {passes} passes, {cpu} CPU-ms per plan; segments matched {}, \
         blocks matched {}, entries {}",
        times[passes / 2],
        times[0],
        times[passes - 1],
        p.stats.segments_matched,
        p.stats.blocks_matched,
        p.stats.entries
    );
}
