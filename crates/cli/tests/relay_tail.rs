//! `riptide relay` serving the real capture and `riptide tail --relay` following it, as processes
//! on loopback.

#![allow(clippy::unwrap_used)]

mod common;

use std::process::{Command, Stdio};

use common::{json_lines, riptide, s, stderr, KillOnDrop};

/// Starts `riptide relay` replaying the capture (with `extra` arguments) and returns it with its
/// URL.
fn start_relay(extra: &[&str]) -> Option<(KillOnDrop, String)> {
    let frames = common::capture_dir()?.join("firehose-frames.bin");
    let (relay, url) = common::spawn_printing_url(
        Command::new(common::BIN)
            .args(["relay", "--replay", s(&frames), "--listen", "127.0.0.1:0"])
            .args(extra)
            .stderr(Stdio::null()),
    );
    assert!(
        url.starts_with("ws://127.0.0.1:")
            && url.ends_with("/xrpc/com.atproto.sync.subscribeRepos"),
        "{url}"
    );
    Some((relay, url))
}

#[test]
fn tail_follows_the_relay_and_every_frame_verifies() {
    let Some((_relay, url)) = start_relay(&["--drop-after", "40"]) else {
        return;
    };
    let docs = common::capture_dir().unwrap().join("did_docs.json");
    let out = riptide(&[
        "tail",
        "--relay",
        &url,
        "--cursor",
        "0",
        "--count",
        "150",
        "--json",
        "--verify",
        "--did-docs",
        s(&docs),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let lines = json_lines(&out);
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
    let err = stderr(&out);
    assert!(
        err.contains("150 ok, 0 failed verification") && err.contains("3 reconnects"),
        "{err}"
    );
}

#[test]
fn tail_filters_relay_frames_by_collection() {
    let Some((_relay, url)) = start_relay(&[]) else {
        return;
    };
    let out = riptide(&[
        "tail",
        "--relay",
        &url,
        "--cursor",
        "0",
        "--count",
        "3",
        "--collection",
        "app.bsky.graph.*",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(text.lines().count(), 3);
    for l in text.lines() {
        // Readable view: "SEQ commit DID ACTION app.bsky.graph.…/RKEY".
        let f: Vec<&str> = l.split(' ').collect();
        assert_eq!(f[1], "commit", "{l}");
        assert!(f[4].starts_with("app.bsky.graph."), "{l}");
    }
}
