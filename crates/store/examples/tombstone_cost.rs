//! What writing tombstones in the ingest batch costs (issue 38, `riptide_store::folding`): a
//! generated stream's events with their rows appended through [`Store::append_rows`] (layout 5,
//! row blocks) in ingest-sized batches, and, over the same batches, the tombstone derivation
//! alone ([`derive_each`], plus [`Tombstones::write`] into a batch that is dropped). CPU time of
//! the calling thread (`/proc/thread-self/schedstat`, ns; fjall's flush threads excluded, as the
//! writer thread is what ingest waits on) and of the process (`/proc/self/stat`), per event.
//!
//! `cargo run --release -p riptide-store --example tombstone_cost -- [ACCOUNTS] [EVENTS] [BATCH]`
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Instant;

use riptide_firehose::FrameDecoder;
use riptide_jetstream::Projector;
use riptide_segment::{OwnedRow, Row};
use riptide_store::tombstones::{derive_each, Tombstones};
use riptide_store::{Event, Resume, Store, Utf8Text};

/// CPU ns of this thread.
fn thread_ns() -> u64 {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap();
    s.split_whitespace().next().unwrap().parse().unwrap()
}

/// CPU ns of the process (user + system, all threads; clock ticks of 10 ms).
fn process_ns() -> u64 {
    let s = std::fs::read_to_string("/proc/self/stat").unwrap();
    let after = &s[s.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    ticks * 10_000_000
}

fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .map(|a| a.parse().unwrap())
        .collect();
    let accounts = args.first().copied().unwrap_or(200) as usize;
    let events = args.get(1).copied().unwrap_or(200_000);
    let batch = args.get(2).copied().unwrap_or(512) as usize;

    let mut config = riptide_gen::Config::new(38, accounts, events);
    config.initial_records = (5, 40);
    let mut net = riptide_gen::Network::new(config).unwrap();
    let mut frames = Vec::new();
    net.run(|f: &[u8]| -> Result<(), riptide_gen::GenError> {
        frames.push(f.to_vec());
        Ok(())
    })
    .unwrap();
    let (mut dec, mut proj) = (FrameDecoder::new(), Projector::with_sync());
    let (mut evs, mut json): (Vec<(Event, OwnedRow)>, Vec<u8>) = (Vec::new(), Vec::new());
    for f in &frames {
        let Ok(frame) = dec.decode(f) else { continue };
        let p = proj.project(&frame);
        for r in &p.stored_rows(&frame).unwrap() {
            let seq = evs.len() as u64 + 1;
            let t = 1_764_000_000_000_000 + seq as i64;
            let e = Event::from_row(&mut proj, r, seq, t, &mut json).unwrap();
            evs.push((e, r.row(seq, t).to_owned_row()));
        }
    }
    let n = evs.len() as f64;

    let dir = tempfile::tempdir().unwrap();
    let (s, _) = Store::<Utf8Text>::open(dir.path(), 0).unwrap();
    let (t0, p0, w0) = (thread_ns(), process_ns(), Instant::now());
    for chunk in evs.chunks(batch) {
        let events: Vec<Event> = chunk.iter().map(|(e, _)| e.clone()).collect();
        let rows: Vec<Row<'_>> = chunk.iter().map(|(_, r)| r.as_row()).collect();
        let last = &events[events.len() - 1];
        let resume = Resume {
            next_seq: last.seq() + 1,
            last_time_us: last.time_us(),
            upstream_cursor: Some(last.seq()),
        };
        s.append_rows(&events, &rows, &[], &[], &resume).unwrap();
    }
    let (t1, p1, w1) = (thread_ns(), process_ns(), w0.elapsed());
    let held = s.tombstones().len().unwrap();
    drop(s);

    // The derivation and the batch inserts alone, over the same batches.
    let dir2 = tempfile::tempdir().unwrap();
    let ks = fjall::Config::new(dir2.path()).open().unwrap();
    let t = Tombstones::open(&ks).unwrap();
    let (mut written, t2) = (0usize, thread_ns());
    for chunk in evs.chunks(batch) {
        let rows: Vec<Row<'_>> = chunk.iter().map(|(_, r)| r.as_row()).collect();
        let ts = derive_each(&rows, |e| panic!("{e}"));
        let mut b = ks.batch();
        t.write(&mut b, &ts);
        written += ts.len();
        drop(b);
    }
    let t3 = thread_ns();

    let us = |ns: u64| ns as f64 / 1e3 / n;
    println!(
        "{{\"events\": {n}, \"batch\": {batch}, \"tombstones_written\": {written}, \
         \"tombstones_held\": {held}, \"append_thread_cpu_us_per_event\": {:.3}, \
         \"append_process_cpu_us_per_event\": {:.3}, \"append_wall_us_per_event\": {:.3}, \
         \"tombstones_thread_cpu_us_per_event\": {:.3}}}",
        us(t1 - t0),
        us(p1 - p0),
        w1.as_secs_f64() * 1e6 / n,
        us(t3 - t2),
    );
}
