//! Whether the store's disk stays bounded with sealing and folding on (issue 38,
//! `docs/archive.md` "Folding"): a stream whose state is bounded — `KEYS` records, each event
//! creating a missing one or updating (70%) or deleting (30%) an existing one, records of
//! `RECORD` random bytes — appended through [`Store::append_rows`] in batches of 512, sealed every
//! 64 batches as `riptide serve`'s seal loop would ([`Store::seal_segments`], `--segment-bytes
//! SEGMENT`), folded by the store's own compaction thread (asked after each seal). Every
//! `EVERY` events it prints the bytes on disk of the data directory, of `segments/`, of fjall's
//! journals and of each partition, with folding's counters.
//!
//! `cargo run -p riptide-store --example fold_disk -- [KEYS] [EVENTS] [SEGMENT] [RECORD] [EVERY]`
//! (defaults 2,000 · 400,000 · 1 MiB · 200 · 50,000). Disk sizes do not depend on the build or
//! the load; the time does.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::{Duration, Instant};

use riptide_jetstream::{Projector, StoredRow};
use riptide_segment::{Kind, Row};
use riptide_store::folding::CompactionConfig;
use riptide_store::{Event, Resume, Store, StoreOptions, Utf8Text};

/// Bytes of the files under `p`.
fn du(p: &Path) -> u64 {
    let Ok(meta) = std::fs::symlink_metadata(p) else {
        return 0;
    };
    if !meta.is_dir() {
        return meta.len();
    }
    std::fs::read_dir(p)
        .map(|d| d.filter_map(Result::ok).map(|e| du(&e.path())).sum())
        .unwrap_or(0)
}

/// xorshift64*: the same stream every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// A DAG-CBOR record `{"text": <len random letters>, "$type": "app.bsky.feed.post"}`.
fn record(rng: &mut Rng, len: usize) -> Vec<u8> {
    let mut out = vec![0xa2, 0x64];
    out.extend_from_slice(b"text");
    match len {
        0..=23 => out.push(0x60 + len as u8),
        24..=255 => out.extend_from_slice(&[0x78, len as u8]),
        _ => {
            out.push(0x79);
            out.extend_from_slice(&(len as u16).to_be_bytes());
        }
    }
    out.extend((0..len).map(|_| b'a' + (rng.next() % 26) as u8));
    out.push(0x65);
    out.extend_from_slice(b"$type");
    out.push(0x72);
    out.extend_from_slice(b"app.bsky.feed.post");
    out
}

fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .map(|a| a.parse().unwrap())
        .collect();
    let keys = args.first().copied().unwrap_or(2_000) as usize;
    let events = args.get(1).copied().unwrap_or(400_000);
    let segment = args.get(2).copied().unwrap_or(1 << 20);
    let record_len = args.get(3).copied().unwrap_or(200) as usize;
    let every = args.get(4).copied().unwrap_or(50_000);

    let dids: Vec<String> = (0..keys.div_ceil(20))
        .map(|i| format!("did:plc:{i:0>24}"))
        .collect();
    let rkeys: Vec<String> = (0..keys).map(|k| format!("3l{k:0>11}")).collect();
    let mut exists = vec![false; keys];

    let dir = tempfile::tempdir().unwrap();
    let options = StoreOptions {
        segment_bytes: Some(segment),
        ..StoreOptions::default()
    };
    let (s, _) = Store::<Utf8Text>::open_with(dir.path(), 0, options).unwrap();
    let config = CompactionConfig {
        interval: Duration::from_secs(60),
    };
    s.start_compaction(config, |_| {}).unwrap();
    println!(
        "{keys} keys, {events} events, --segment-bytes {segment}, records of {record_len} bytes"
    );
    println!(
        "events\tsecs\tdata\tsegments\tsegment_files\tjournals\tpartitions (bytes)\tpasses\tdropped\tcompaction_seq\ttombstones\tpruned"
    );

    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let (mut proj, mut json) = (Projector::new(), Vec::new());
    let t0 = Instant::now();
    let mut seq = 0u64;
    let mut batches = 0u64;
    while seq < events {
        let mut payloads = Vec::with_capacity(512);
        let mut ops = Vec::with_capacity(512);
        for _ in 0..512 {
            let k = (rng.next() % keys as u64) as usize;
            let kind = match (exists[k], rng.next() % 10) {
                (false, _) => Kind::Create,
                (true, 0..=6) => Kind::Update,
                (true, _) => Kind::Delete,
            };
            exists[k] = kind != Kind::Delete;
            payloads.push(match kind {
                Kind::Delete => Vec::new(),
                _ => record(&mut rng, record_len),
            });
            ops.push((k, kind));
        }
        let mut rows = Vec::with_capacity(512);
        let mut evs = Vec::with_capacity(512);
        for ((k, kind), payload) in ops.iter().zip(&payloads) {
            seq += 1;
            let t = 1_764_000_000_000_000 + seq as i64;
            let row = Row {
                seq,
                witnessed_at: t,
                indexed_at: 0,
                kind: *kind,
                did: &dids[k / 20],
                collection: "app.bsky.feed.post",
                rkey: &rkeys[*k],
                rev: "3l3qo2vutsw2b",
                payload,
            };
            let e =
                Event::from_row(&mut proj, &StoredRow::from_row(&row), seq, t, &mut json).unwrap();
            rows.push(row);
            evs.push(e);
        }
        let last = &evs[evs.len() - 1];
        let resume = Resume {
            next_seq: last.seq() + 1,
            last_time_us: last.time_us(),
            upstream_cursor: Some(last.seq()),
        };
        s.append_rows(&evs, &rows, &[], &[], &resume).unwrap();
        batches += 1;
        if batches.is_multiple_of(64) && !s.seal_segments().unwrap().is_empty() {
            s.request_compaction();
        }
        if seq % every < 512 {
            report(&s, dir.path(), seq, t0);
        }
    }
    // The last pass over what was sealed, then one more batch-free look.
    std::thread::sleep(Duration::from_secs(5));
    report(&s, dir.path(), seq, t0);
}

fn report(s: &Store<Utf8Text>, dir: &Path, seq: u64, t0: Instant) {
    let st = s.folding_stats();
    let mut parts: Vec<(String, u64)> = std::fs::read_dir(dir.join("partitions"))
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| (e.file_name().to_string_lossy().into_owned(), du(&e.path())))
                .filter(|(_, b)| *b > 0)
                .collect()
        })
        .unwrap_or_default();
    parts.sort();
    let parts: Vec<String> = parts.iter().map(|(n, b)| format!("{n}={b}")).collect();
    println!(
        "{seq}\t{:.0}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
        t0.elapsed().as_secs_f64(),
        du(dir),
        du(&dir.join("segments")),
        s.segment_entries().len(),
        du(&dir.join("journals")),
        parts.join(" "),
        st.passes,
        st.rows_dropped,
        st.compaction_seq,
        st.tombstones,
        st.tombstones_pruned,
    );
}
