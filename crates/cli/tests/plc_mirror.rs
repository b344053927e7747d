//! `riptide plc mirror` and `riptide backfill --plc-mirror` end to end, as a user runs them: a
//! generated network served by the `riptide sim` binary (its `/export` log and its documents),
//! mirrored, then crawled with the PLC directory pointing nowhere.
//!
//! Oracles: `riptide repo ls` of each repository's CAR (records exactly once, as the backfill
//! tests check), the sim's own `/export` (how many operations there are) and its request
//! counters (`/_sim/stats`: how many pages the mirror asked for, to kill it mid-way).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{riptide, s, scratch, spawn_printing_url, BIN};

fn generate(dir: &Path, seed: u64, accounts: usize) -> Vec<String> {
    let mut cfg = riptide_gen::Config::new(seed, accounts, 100);
    cfg.keep_records = true;
    cfg.initial_records = (5, 40);
    cfg.threads = 2;
    riptide_gen::write_dir(&cfg, dir).unwrap();
    common::repo_dids(dir)
}

fn sim(dir: &Path, extra: &[&str]) -> (common::KillOnDrop, String) {
    spawn_printing_url(
        Command::new(BIN)
            .args(["sim", "--from", s(dir), "--listen", "127.0.0.1:0"])
            .args(extra)
            .stderr(Stdio::null()),
    )
}

fn get(url: &str) -> String {
    let rest = url.strip_prefix("http://").unwrap();
    let (addr, path) = rest.split_at(rest.find('/').unwrap());
    let (code, body) = common::http_get(addr, path);
    assert_eq!(code, 200, "{url}: {body}");
    body
}

/// The sim's whole log: how many operations a complete mirror has read.
fn export_len(base: &str) -> u64 {
    get(&format!("{base}/export?count=1000")).lines().count() as u64
}

fn mirror_cmd(base: &str, data: &Path, page: &str) -> Command {
    let mut c = Command::new(BIN);
    c.args([
        "plc",
        "mirror",
        "--plc-url",
        base,
        "--data",
        s(data),
        "--page",
        page,
        "--sim-dids",
        "--json",
    ]);
    c
}

fn status(data: &Path) -> serde_json::Value {
    let out = riptide(&["plc", "status", "--data", s(data), "--json"]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn a_backfill_from_a_plc_mirror_verifies_every_repository_with_no_directory() {
    let tmp = scratch();
    let net = tmp.path().join("net");
    let dids = generate(&net, 37, 12);
    let (_sim, base) = sim(&net, &[]);
    let total = export_len(&base);
    // 12 genesis operations, and an update for every fourth account.
    assert_eq!(total, 15);

    let data = tmp.path().join("plc");
    let out = mirror_cmd(&base, &data, "4").output().unwrap();
    assert!(out.status.success(), "{}", common::stderr(&out));
    let got: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(got["operations"], total, "{got}");
    assert_eq!(got["applied"], total, "{got}");
    assert_eq!(got["dids"], 12, "{got}");
    assert_eq!(got["did_underived"], 12, "{got}");
    assert_eq!(got["refused"], serde_json::json!({}), "{got}");

    // The directory is nowhere: every key and PDS comes from the mirror.
    let state = tmp.path().join("state");
    let out = backfill_from_mirror(&base, "http://127.0.0.1:9", &data, &state);
    assert!(out.status.success(), "{}", common::stderr(&out));
    common::assert_exactly_once(&net, &dids, std::str::from_utf8(&out.stdout).unwrap());
    assert_eq!(backfill_status(&state)["repos_ok"], 12);
    let stats: serde_json::Value =
        serde_json::from_str(&get(&format!("{base}/_sim/stats"))).unwrap();
    assert_eq!(stats["requests"]["plc"], 0, "{stats}");
}

/// `riptide backfill --jsonl` of the sim at `base`, DID documents from the mirror in `data`,
/// the PLC directory at `plc_url`.
fn backfill_from_mirror(
    base: &str,
    plc_url: &str,
    data: &Path,
    state: &Path,
) -> std::process::Output {
    Command::new(BIN)
        .args([
            "backfill",
            "--relay",
            base,
            "--plc-url",
            plc_url,
            "--plc-mirror",
            s(data),
            "--jsonl",
            "--state",
            s(state),
            "--attempts",
            "2",
            "--retry-backoff-ms",
            "20",
        ])
        .output()
        .unwrap()
}

fn backfill_status(state: &Path) -> serde_json::Value {
    serde_json::from_slice(&riptide(&["backfill", "status", "--state", s(state), "--json"]).stdout)
        .unwrap()
}

#[test]
fn a_stale_mirror_is_looked_past_for_the_accounts_it_fails() {
    let tmp = scratch();
    let net = tmp.path().join("net");
    let dids = generate(&net, 37, 12);
    let (_sim, base) = sim(&net, &[]);
    // The log: 12 genesis operations, then an update for every fourth account that moves it
    // off its genesis's wrong key and `https://pds.invalid`. A copy of the first 12 only is
    // stale for those 3 accounts: its documents name the wrong key and PDS.
    assert_eq!(export_len(&base), 15);
    let data = tmp.path().join("plc");
    let out = mirror_cmd(&base, &data, "4")
        .args(["--max-pages", "3"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", common::stderr(&out));
    assert_eq!(status(&data)["applied"], 12);

    let state = tmp.path().join("state");
    let out = backfill_from_mirror(&base, &base, &data, &state);
    assert!(out.status.success(), "{}", common::stderr(&out));
    // Every repository verified, the 3 with the directory's document, asked of it once each.
    common::assert_exactly_once(&net, &dids, std::str::from_utf8(&out.stdout).unwrap());
    let st = backfill_status(&state);
    assert_eq!(st["repos_ok"], 12, "{st}");
    let stats: serde_json::Value =
        serde_json::from_str(&get(&format!("{base}/_sim/stats"))).unwrap();
    assert_eq!(stats["requests"]["plc"], 3, "{stats}");
    let log = common::stderr(&out);
    assert!(log.contains("rechecked=3 stale=3"), "{log}");
}

/// Waits until the sim has answered `n` more `/export` requests than `from`.
fn wait_exports(base: &str, n: u64) {
    let deadline = Instant::now() + common::PATIENCE;
    loop {
        let stats: serde_json::Value =
            serde_json::from_str(&get(&format!("{base}/_sim/stats"))).unwrap();
        if stats["requests"]["plc_export"].as_u64().unwrap() >= n {
            return;
        }
        assert!(Instant::now() < deadline, "the mirror asked for no page");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_mirror_killed_mid_export_resumes_without_loss_or_repeats() {
    let tmp = scratch();
    let net = tmp.path().join("net");
    generate(&net, 38, 24);
    // Each page waits 40 ms: the mirror is mid-export when it is killed.
    let (_sim, base) = sim(&net, &["--fault-delay-ms", "40"]);
    let total = export_len(&base);
    assert_eq!(total, 30);
    let data = tmp.path().join("plc");
    let mut seen = 1; // export_len's request
    let mut last_ops = 0;
    for round in 0..3 {
        let child = mirror_cmd(&base, &data, "2")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let child = common::KillOnDrop::from_child(child);
        // Three requests of this run answered: its first two pages are committed (the next
        // page is asked for only after the one before is).
        seen += 3;
        wait_exports(&base, seen);
        child.kill();
        let st = status(&data);
        let ops = st["operations"].as_u64().unwrap();
        assert!(ops > last_ops && ops < total, "round {round}: {st}");
        assert_eq!(st["operations"], st["applied"], "round {round}: {st}");
        last_ops = ops;
        let stats: serde_json::Value =
            serde_json::from_str(&get(&format!("{base}/_sim/stats"))).unwrap();
        seen = stats["requests"]["plc_export"].as_u64().unwrap();
    }
    let out = mirror_cmd(&base, &data, "2").output().unwrap();
    assert!(out.status.success(), "{}", common::stderr(&out));
    let st = status(&data);
    // Every operation read once and applied once: a page applied twice would read more
    // (and refuse its repeats as `duplicate`), a lost one fewer.
    assert_eq!(st["operations"], total, "{st}");
    assert_eq!(st["applied"], total, "{st}");
    assert_eq!(st["dids"], 24, "{st}");
    assert_eq!(st["refused"], serde_json::json!({}), "{st}");
    assert_eq!(st["cursor"], total.to_string(), "{st}");
}
