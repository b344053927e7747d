//! `riptide serve` killed with SIGKILL mid-ingest, then restarted: seqs continue, nothing durable
//! is lost, nothing is duplicated, and ingest resumes from the stored upstream cursor.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;

use common::{metric, wait_for, KillOnDrop};

const REPEAT: u64 = 100;

/// `riptide serve` ingesting the capture `REPEAT` times into `data`, with its address.
fn spawn(data: &Path, capture: &Path, dictionary: &Path) -> (KillOnDrop, String) {
    common::spawn_serve(
        common::serve_command(data)
            .args([
                "--ingest-repeat",
                &REPEAT.to_string(),
                "--ingest-rate",
                "4000",
            ])
            .arg("--did-docs")
            .arg(capture.join("did_docs.json"))
            .arg("--zstd-dictionary")
            .arg(dictionary)
            .arg("--ingest-file")
            .arg(capture.join("firehose-frames.bin")),
    )
}

#[test]
fn kill_9_mid_ingest_then_restart() {
    let Some(corpus) = riptide_testdata::corpus() else {
        return;
    };
    let capture = corpus.join("jetstream-2026-07");
    let dictionary = corpus.join("jetstream-dictionaries/legacy_subscribe.zdict");
    let data = tempfile::tempdir().unwrap();
    let (server, addr) = spawn(data.path(), &capture, &dictionary);
    // Ingest started: 2000 events stored.
    wait_for(&addr, "riptide_events_stored_total", 2000.0);
    server.kill(); // SIGKILL
    let (_server, addr) = spawn(data.path(), &capture, &dictionary);
    let resumed = metric(&addr, "riptide_log_next_seq") as u64;
    assert!(
        resumed > 2000,
        "durable events were lost: next seq {resumed}"
    );
    wait_for(&addr, "riptide_ingest_finished", 1.0);
    assert_eq!(
        metric(&addr, "riptide_upstream_frames_duplicate_total"),
        0.0
    );
    let total = 152 * REPEAT;
    assert_eq!(metric(&addr, "riptide_log_next_seq") as u64, total + 1);

    // Every event exactly once, in order: the capture's 152 events, REPEAT times.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let got = rt.block_on(common::events_from_start(&addr, total as usize));
    let mut last_time = 0;
    for (i, v) in got.iter().enumerate() {
        assert_eq!(v["cursor"].as_u64(), Some(i as u64 + 1));
        let t = v["time_us"].as_i64().unwrap();
        assert!(t > last_time, "time_us not strictly increasing at {i}");
        last_time = t;
        let first = &got[i % 152];
        assert_eq!(
            (&v["did"], &v["commit"], &v["identity"], &v["account"]),
            (
                &first["did"],
                &first["commit"],
                &first["identity"],
                &first["account"]
            ),
            "event {i}"
        );
    }
}
