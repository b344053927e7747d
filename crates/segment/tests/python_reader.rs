//! Segments we write, read by the Python `atproto` SDK's own archive reader
//! (`atproto_jetstream.archive`: `iter_block_frames`, `decode_block`), the reader the issue's
//! first client uses. A reader neither we nor Jetstream wrote.
//!
//! Runs when `RIPTIDE_ATPROTO_PYTHON` names a Python with `atproto` installed (the version the
//! v2 oracle pins, `oracles/jetstream-v2/requirements.txt`: `python3 -m venv V && V/bin/pip
//! install atproto==0.0.73`, then `RIPTIDE_ATPROTO_PYTHON=V/bin/python cargo test -p
//! riptide-segment --test python_reader`); without it the test says so and passes, except under
//! `CI`, where `.ci/run` sets it (`oracles/jetstream-v2/check --venv`) and its absence fails.

#![allow(clippy::unwrap_used)]

use std::fmt::Write as _;
use std::process::Command;

use riptide_segment::{compact_segment, decode_block, write_segment, Kind, Row, Segment};

const SCRIPT: &str = r#"
import sys
from atproto_jetstream.archive.downloader import iter_block_frames
from atproto_jetstream.archive.segment import decode_block, read_sealed_header
for path in sys.argv[1:]:
    data = open(path, 'rb').read()
    h = read_sealed_header(data)
    print(f'segment {h.block_count} {h.event_count}')
    for frame in iter_block_frames(data):
        for e in decode_block(frame):
            p = (e.payload or b'').hex()
            print(f'{e.seq}\t{e.witnessed_at}\t{e.indexed_at}\t{e.kind}\t{e.did}\t{e.collection}\t{e.rkey}\t{e.rev}\t{p}')
"#;

fn expected(file: &[u8]) -> String {
    let seg = Segment::open(file).unwrap();
    let h = seg.header();
    let mut out = format!("segment {} {}\n", h.block_count, h.event_count);
    for i in 0..seg.blocks().len() {
        let body = seg.block_body(i).unwrap();
        for r in seg.rows(i, &body).unwrap() {
            let p: String = r.payload.iter().map(|b| format!("{b:02x}")).collect();
            writeln!(
                out,
                "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{p}",
                r.seq,
                r.witnessed_at,
                r.indexed_at,
                r.kind as u8,
                r.did,
                r.collection,
                r.rkey,
                r.rev
            )
            .unwrap();
        }
    }
    out
}

#[test]
fn the_python_sdk_reads_our_segments() {
    let Some(python) = std::env::var_os("RIPTIDE_ATPROTO_PYTHON") else {
        // `.ci/run` sets it (oracles/jetstream-v2/check --venv): under CI a missing SDK is a
        // failure, not a skip.
        assert!(
            std::env::var_os("CI").is_none(),
            "RIPTIDE_ATPROTO_PYTHON is not set under CI: the Python SDK cross-check cannot run"
        );
        eprintln!("note: RIPTIDE_ATPROTO_PYTHON not set: the Python SDK cross-check did not run");
        return;
    };
    let dir = std::env::temp_dir().join(format!("riptide-segment-py-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut files = Vec::new();

    // Jetstream's golden rows, re-encoded by us (our zstd frames, our footer).
    for name in [
        "golden_seal.bin",
        "golden_corpus_segment.jss",
        "legacy_fixed4096_blooms.jss",
    ] {
        let Some(bytes) = riptide_testdata::read(&format!("jetstream-v2/segments/{name}")) else {
            return;
        };
        let seg = Segment::open(&bytes).unwrap();
        let bodies: Vec<Vec<u8>> = (0..seg.blocks().len())
            .map(|i| seg.block_body(i).unwrap())
            .collect();
        let rows: Vec<Vec<Row<'_>>> = bodies.iter().map(|b| decode_block(b).unwrap()).collect();
        let slices: Vec<&[Row<'_>]> = rows.iter().map(Vec::as_slice).collect();
        files.push((name.to_owned(), write_segment(&slices).unwrap()));
    }
    // Every kind, empty and long fields, a payload-less row, several blocks.
    let long = "x".repeat(255);
    let rows: Vec<Row<'_>> = (1..=7u8)
        .map(|k| Row {
            seq: u64::from(k) * 10,
            witnessed_at: -i64::from(k),
            indexed_at: if k % 2 == 0 { 99 } else { 0 },
            kind: Kind::from_u8(k).unwrap(),
            did: "did:plc:ewvi7nxzyoun6zhxrhs64oiz",
            collection: if k <= 3 || k == 7 {
                "app.bsky.feed.post"
            } else {
                ""
            },
            rkey: if k == 1 { &long } else { "3k" },
            rev: "3kabcdefghijk",
            payload: if k == 3 { b"" } else { b"\xa1\x61a\x01" },
        })
        .collect();
    files.push((
        "kinds.jss".into(),
        write_segment(&[&rows[..3], &rows[3..]]).unwrap(),
    ));
    // A compacted segment (issue 38's folding): block 0 emptied (`event_count` 0, body `u32` 0,
    // envelope kept), block 1 untouched (delete, identity and account rows stay), block 2
    // thinned (its create-resync row).
    let folded = compact_segment(
        &Segment::open(&write_segment(&[&rows[..2], &rows[2..5], &rows[5..]]).unwrap()).unwrap(),
        |r| r.seq <= 20 || r.seq == 70,
    )
    .unwrap()
    .unwrap();
    assert_eq!(Segment::open(&folded).unwrap().blocks()[0].event_count, 0);
    files.push(("folded.jss".into(), folded));

    let mut paths = Vec::new();
    let mut want = String::new();
    for (name, file) in &files {
        let path = dir.join(name);
        std::fs::write(&path, file).unwrap();
        paths.push(path);
        want.push_str(&expected(file));
    }
    let out = Command::new(python)
        .arg("-c")
        .arg(SCRIPT)
        .args(&paths)
        .output()
        .unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8(out.stdout).unwrap(), want);
}
