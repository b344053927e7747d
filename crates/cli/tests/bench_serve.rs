//! `riptide bench serve` runs to the end and reports its contract fields, on a generated stream
//! (which, unlike the capture, has `#sync` frames: stored for v2, never sent on v1).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{riptide, s, scratch, stderr, BIN};

/// Longer than the bench needs on a loaded machine; a bench that hangs fails here.
const LIMIT: Duration = Duration::from_secs(600);

#[test]
fn bench_serve_replays_a_stream_with_sync_events() {
    let Some(corpus) = riptide_testdata::corpus() else {
        return;
    };
    let dict = corpus.join("jetstream-dictionaries/legacy_subscribe.zdict");
    let dict_v2 = corpus.join("jetstream-dictionaries/subscribe_events_20260811.zdict");
    let dir = scratch();
    let out = riptide(&[
        "gen",
        "--seed",
        "1",
        "--accounts",
        "30",
        "--events",
        "1500",
        "--out",
        s(dir.path()),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let mut child = Command::new(BIN)
        .args(["bench", "serve"])
        .arg(dir.path().join("firehose-frames.bin"))
        .arg("--did-docs")
        .arg(dir.path().join("did_docs.json"))
        .arg("--zstd-dictionary")
        .arg(&dict)
        .arg("--zstd-dictionary-v2")
        .arg(&dict_v2)
        .args([
            "--repeat",
            "1",
            "--passes",
            "2",
            "--subscribers",
            "0",
            "--chain",
            "off",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > LIMIT {
            child.kill().unwrap();
            let out = child.wait_with_output().unwrap();
            panic!(
                "bench serve still running after {LIMIT:?} (replay hung?): {}",
                stderr(&out)
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    // The plain replays alternate their order: v1 first in pass 0, v2 first in pass 1.
    let log = stderr(&out);
    for (pass, source) in [(0, "memory"), (0, "disk"), (1, "memory"), (1, "disk")] {
        let at = |v2: bool| {
            let line = format!("pass {pass}: {}replay ", if v2 { "v2 " } else { "" });
            log.lines()
                .position(|l| l.starts_with(&line) && l.contains(&format!("from {source}:")))
                .unwrap_or_else(|| panic!("no {line}… from {source}: {log}"))
        };
        assert!(
            at(pass == 1) < at(pass == 0),
            "pass {pass}, {source}: {log}"
        );
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let all = v["events_per_pass"].as_u64().unwrap();
    let v1 = v["events_per_pass_v1"].as_u64().unwrap();
    // The stream has `#sync` events (what the replay used to wait for on v1, for ever).
    assert!(all > v1 && v1 > 1000, "{all} events, {v1} on v1");
    // Nobody asked for compression during ingest (no `--zstd-at-ingest`), and the report says so.
    assert_eq!(v["zstd_at_ingest"], false);
    for k in [
        "replay_memory_events_per_s",
        "replay_disk_events_per_s",
        "replay_memory_compressed_events_per_s",
        "replay_disk_compressed_events_per_s",
        "v2_replay_memory_events_per_s",
        "v2_replay_disk_events_per_s",
        "v2_replay_memory_zstd_events_per_s",
        "v2_replay_disk_zstd_events_per_s",
        "store_bytes_per_event",
        "ingest_cpu_us_per_event",
        "v2_to_v1_replay_memory_paired",
        "v2_to_v1_replay_disk_paired",
    ] {
        assert!(v[k]["median"].as_f64().unwrap() > 0.0, "{k}: {}", v[k]);
    }
    // 1,500 events never fill the in-memory tail (65,536): no steady-state figure, said as null
    // rather than a number measured over the warm-up.
    assert!(v["ingest_steady_cpu_us_per_event"].is_null(), "{v}");
    assert!(!log.contains("once the tail was full"), "{log}");
    // A paired ratio lies between the smallest and the largest per-pass quotient of the rates.
    let rates = |k: &str| v[k]["min"].as_f64().unwrap()..=v[k]["max"].as_f64().unwrap();
    let (v1, v2) = (
        rates("replay_disk_events_per_s"),
        rates("v2_replay_disk_events_per_s"),
    );
    let p = v["v2_to_v1_replay_disk_paired"]["median"].as_f64().unwrap();
    let (lo, hi) = (v2.start() / v1.end(), v2.end() / v1.start());
    assert!(lo - 0.01 <= p && p <= hi + 0.01, "{p} outside {lo}..{hi}");
}
