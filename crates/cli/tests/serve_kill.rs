//! `riptide serve` killed with SIGKILL mid-ingest (twice: before and after the store has sealed
//! blocks), then restarted: seqs continue, nothing durable is lost, nothing is duplicated, and ingest resumes from the stored upstream cursor; with chain
//! state, the accounts' states after kills and restarts are those of a run without a crash (and
//! those `riptide verify` computes).
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
                // The capture repeated is all replays to chain state.
                "--stateless",
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
    let (server, addr) = spawn(data.path(), &capture, &dictionary);
    let resumed = metric(&addr, "riptide_log_next_seq") as u64;
    assert!(
        resumed > 2000,
        "durable events were lost: next seq {resumed}"
    );
    // Again once blocks have been sealed (every 4,096 events: `store.rs`), so the restart finds
    // sealed blocks and unsealed events both.
    wait_for(&addr, "riptide_events_stored_total", 5000.0);
    server.kill();
    let (_server, addr) = spawn(data.path(), &capture, &dictionary);
    let again = metric(&addr, "riptide_log_next_seq") as u64;
    assert!(
        again > resumed + 5000,
        "durable events were lost: next seq {again} after {resumed}"
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

/// `riptide serve` ingesting a generated stream at `rate` frames/s into `data`, without resync
/// (a chain break re-establishes the chain, as `riptide verify` does).
fn spawn_gen(data: &Path, net: &Path, rate: u32) -> (KillOnDrop, String) {
    common::spawn_serve(
        common::serve_command(data)
            .args(["--ingest-rate", &rate.to_string(), "--workers", "3"])
            .arg("--no-resync")
            .arg("--did-docs")
            .arg(net.join("did_docs.json"))
            .arg("--ingest-file")
            .arg(net.join("firehose-frames.bin")),
    )
}

/// Every account state in a store (the server stopped).
fn store_accounts(data: &Path) -> Vec<(String, riptide_firehose::chain::AccountState)> {
    let (store, _) = riptide_serve::Store::open_any(data).unwrap();
    store.accounts().map(Result::unwrap).collect()
}

#[test]
fn kill_9_with_chain_state_resumes_the_same_chain() {
    let tmp = common::scratch();
    let net = tmp.path().join("net");
    let out = common::riptide(&[
        "gen",
        "--seed",
        "9",
        "--accounts",
        "40",
        "--events",
        "6000",
        "--adversarial",
        "0.01",
        "--out",
        common::s(&net),
    ]);
    assert!(out.status.success(), "{}", common::stderr(&out));

    // What `riptide verify` computes, and what an uninterrupted server stores.
    let state = tmp.path().join("verify-state");
    let out = common::riptide(&[
        "verify",
        common::s(&net.join("firehose-frames.bin")),
        "--did-docs",
        common::s(&net.join("did_docs.json")),
        "--state",
        common::s(&state),
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", common::stderr(&out));
    let verified = riptide_firehose::chain::SharedChain::decode(
        &std::fs::read(state.join("chain-state")).unwrap(),
    )
    .unwrap()
    .to_sorted();
    assert!(verified.len() >= 40);

    let clean = tmp.path().join("clean");
    let (server, addr) = spawn_gen(&clean, &net, 100_000);
    wait_for(&addr, "riptide_ingest_finished", 1.0);
    let clean_next = metric(&addr, "riptide_log_next_seq") as u64;
    let refused = metric(&addr, "riptide_verdicts_total{verdict=\"chain-break\"}");
    assert!(refused > 0.0, "the stream has stream-level defects");
    server.kill();
    assert_eq!(store_accounts(&clean), verified);

    // Killed three times mid-ingest, restarted each time. At 500 frames/s the last kill has
    // ~4 s of ingest left after it (at 1,000 it had ~2 s, which a loaded machine's metric polls
    // could take: one kill in three landed after the end, with a load of 4).
    let data = tmp.path().join("killed");
    let mut mid_ingest = 0;
    for at in [800.0, 2500.0, 4200.0] {
        let (server, addr) = spawn_gen(&data, &net, 500);
        wait_for(&addr, "riptide_log_next_seq", at);
        if (metric(&addr, "riptide_log_next_seq") as u64) < clean_next {
            mid_ingest += 1;
        }
        server.kill(); // SIGKILL
    }
    assert!(
        mid_ingest >= 2,
        "the kills landed mid-ingest ({mid_ingest} of 3)"
    );
    let (server, addr) = spawn_gen(&data, &net, 100_000);
    wait_for(&addr, "riptide_ingest_finished", 1.0);
    assert_eq!(metric(&addr, "riptide_log_next_seq") as u64, clean_next);
    assert_eq!(
        metric(&addr, "riptide_upstream_frames_duplicate_total"),
        0.0
    );
    server.kill();
    assert_eq!(store_accounts(&data), verified);
}

/// `riptide serve` ingesting a generated stream at `rate` frames/s into `data`, resyncing broken
/// accounts from the sim at `sim` (its PLC directory and PDS).
fn spawn_resyncing(data: &Path, net: &Path, sim: &str, rate: u32) -> (KillOnDrop, String) {
    common::spawn_serve(
        common::serve_command(data)
            .args(["--ingest-rate", &rate.to_string(), "--workers", "3"])
            .arg("--did-docs")
            .arg(common::docs_with_pds(net, sim))
            .arg("--ingest-file")
            .arg(net.join("firehose-frames.bin")),
    )
}

/// Waits until ingest is done and no account awaits resync.
fn wait_settled(addr: &str) {
    wait_for(addr, "riptide_ingest_finished", 1.0);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while metric(addr, "riptide_resync_accounts") > 0.0 {
        assert!(
            std::time::Instant::now() < deadline,
            "resyncs never finished"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

#[test]
fn kill_9_during_resync_then_restart() {
    let tmp = common::scratch();
    let net = tmp.path().join("net");
    let out = common::riptide(&[
        "gen",
        "--seed",
        "11",
        "--accounts",
        "30",
        "--events",
        "3000",
        "--adversarial",
        "0.01",
        "--repos",
        "--out",
        common::s(&net),
    ]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    // A slow host: each resync takes seconds, so the kills land during one.
    let (_sim, sim) = common::spawn_printing_url(
        std::process::Command::new(env!("CARGO_BIN_EXE_riptide"))
            .args(["sim", "--from", common::s(&net), "--listen", "127.0.0.1:0"])
            .args(["--fault-delay-ms", "700"])
            .stderr(std::process::Stdio::inherit()),
    );

    let clean = tmp.path().join("clean");
    let (server, addr) = spawn_resyncing(&clean, &net, &sim, 100_000);
    wait_settled(&addr);
    let breaks = metric(&addr, "riptide_verdicts_total{verdict=\"chain-break\"}");
    assert!(breaks > 0.0, "the stream has chain breaks");
    assert!(
        metric(&addr, "riptide_resync_landed_total") + metric(&addr, "riptide_resync_stale_total")
            > 0.0
    );
    assert_eq!(
        metric(&addr, "riptide_verdicts_total{verdict=\"resync-failed\"}"),
        0.0
    );
    server.kill();
    let want = store_accounts(&clean);
    assert!(want.len() >= 30);
    assert!(want
        .iter()
        .all(|(_, s)| s.sync == riptide_firehose::chain::SyncStatus::Synchronized));

    // Killed three times while accounts await resync, restarted each time.
    let data = tmp.path().join("killed");
    let mut during = 0;
    for _ in 0..3 {
        let (server, addr) = spawn_resyncing(&data, &net, &sim, 1000);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while metric(&addr, "riptide_resync_accounts") < 1.0
            && metric(&addr, "riptide_ingest_finished") < 1.0
        {
            assert!(std::time::Instant::now() < deadline, "no resync began");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        if metric(&addr, "riptide_resync_accounts") >= 1.0 {
            during += 1;
        }
        server.kill(); // SIGKILL
    }
    assert!(
        during >= 2,
        "the kills landed during a resync ({during} of 3)"
    );
    let (server, addr) = spawn_resyncing(&data, &net, &sim, 100_000);
    wait_settled(&addr);
    assert_eq!(
        metric(&addr, "riptide_upstream_frames_duplicate_total"),
        0.0
    );
    server.kill();
    assert_eq!(
        store_accounts(&data),
        want,
        "the same chains as without the crashes"
    );
    let (store, _) = riptide_serve::Store::open_any(&data).unwrap();
    assert!(store.held().unwrap().is_empty(), "nothing left held");
}
