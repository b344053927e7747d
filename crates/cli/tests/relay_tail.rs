//! `riptide relay` serving the real capture and `riptide tail --relay` following it, as processes
//! on loopback.

#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

struct Relay(Child);
impl Drop for Relay {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_relay(extra: &[&str]) -> Option<(Relay, String)> {
    let corpus = riptide_testdata::corpus()?;
    let frames = corpus.join("jetstream-2026-07/firehose-frames.bin");
    let mut child = Command::new(env!("CARGO_BIN_EXE_riptide"))
        .args([
            "relay",
            "--replay",
            frames.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
        ])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    let url = first.trim().to_string();
    assert!(
        url.starts_with("ws://127.0.0.1:")
            && url.ends_with("/xrpc/com.atproto.sync.subscribeRepos"),
        "{url}"
    );
    Some((Relay(child), url))
}

#[test]
fn tail_follows_the_relay_and_every_frame_verifies() {
    let Some((_relay, url)) = start_relay(&["--drop-after", "40"]) else {
        return;
    };
    let docs = riptide_testdata::corpus()
        .unwrap()
        .join("jetstream-2026-07/did_docs.json");
    let out = Command::new(env!("CARGO_BIN_EXE_riptide"))
        .args([
            "tail", "--relay", &url, "--cursor", "0", "--count", "150", "--json", "--verify",
        ])
        .args(["--did-docs", docs.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 150);
    let seqs: Vec<i64> = lines.iter().map(|l| l["seq"].as_i64().unwrap()).collect();
    assert_eq!(
        seqs,
        (1..=150).collect::<Vec<_>>(),
        "resumed through 3 dropped connections without a gap"
    );
    assert!(lines.iter().all(|l| l["verdict"] == "ok"));
    // The manifest's counts: 148 commits, 1 identity, 1 account; 150 ops in total.
    let kinds = |k: &str| lines.iter().filter(|l| l["kind"] == k).count();
    assert_eq!(
        (kinds("commit"), kinds("identity"), kinds("account")),
        (148, 1, 1)
    );
    let ops: usize = lines
        .iter()
        .filter_map(|l| l["ops"].as_array())
        .map(Vec::len)
        .sum();
    assert_eq!(ops, 150);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("150 ok, 0 failed verification") && stderr.contains("3 reconnects"),
        "{stderr}"
    );
}

#[test]
fn tail_filters_relay_frames_by_collection() {
    let Some((_relay, url)) = start_relay(&[]) else {
        return;
    };
    let out = Command::new(env!("CARGO_BIN_EXE_riptide"))
        .args([
            "tail",
            "--relay",
            &url,
            "--cursor",
            "0",
            "--count",
            "3",
            "--collection",
            "app.bsky.graph.*",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(text.lines().count(), 3);
    for l in text.lines() {
        // Readable view: "SEQ commit DID ACTION app.bsky.graph.…/RKEY".
        let f: Vec<&str> = l.split(' ').collect();
        assert_eq!(f[1], "commit", "{l}");
        assert!(f[4].starts_with("app.bsky.graph."), "{l}");
    }
}
