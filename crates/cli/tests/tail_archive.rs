//! Jetstream v2's archive read by riptide's own client (`riptide_client::archive`, and `riptide
//! tail --snapshot | --replay` on it) against a real `riptide serve` on loopback.
//!
//! The server is set up as `oracles/jetstream-v2/archive_check.py` sets it up for the `atproto`
//! SDK: its archive holds the real capture's first 100 frames' events (`riptide corpus segments`,
//! 8 rows a block, 5 blocks a segment), its live store all of the capture (`--ingest-file`), both
//! numbered 1.. in frame order, so a replay must switch at the archive's last seq. The expected
//! events are not read from the segments: they are `riptide jetstream`'s v1 projection of the
//! capture (seq n is its n-th line), whose `cid` comes from the CAR, so every archive row's CID,
//! computed by the client from the row's payload, is checked against an independent source. How
//! many events the archive holds is counted separately, by decoding the segment files on disk.
//! The interruption test puts a proxy that cuts connections mid-response between the client and
//! the server.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use common::{json_lines, riptide, s, stderr, wait_for};
use riptide_client::{ArchiveConfig, Snapshot};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// What identifies an event across wires: seq, kind, DID, and for a commit its operation,
/// collection, rkey and CID.
type Key = (u64, String, String, String, String, String, String);

fn v1_key(seq: u64, e: &Value) -> Key {
    let c = &e["commit"];
    let st = |v: &Value| v.as_str().unwrap_or("").to_owned();
    (
        seq,
        st(&e["kind"]),
        st(&e["did"]),
        st(&c["operation"]),
        st(&c["collection"]),
        st(&c["rkey"]),
        st(&c["cid"]),
    )
}

/// A v2 payload (as `tail --json` prints archive rows and live messages alike).
fn v2_key(p: &Value) -> Key {
    let st = |v: &Value| v.as_str().unwrap_or("").to_owned();
    let ty = st(&p["$type"]);
    (
        p["seq"].as_u64().unwrap(),
        ty.rsplit_once('#').unwrap().1.to_owned(),
        st(&p["did"]),
        st(&p["operation"]),
        st(&p["collection"]),
        st(&p["rkey"]),
        st(&p["cid"]),
    )
}

struct Setup {
    _data: tempfile::TempDir,
    _server: common::KillOnDrop,
    addr: String,
    /// The capture's events by seq (the v1 projection).
    events: Vec<(Key, Value)>,
    /// The archive's last seq, from the segment files decoded here.
    sealed: u64,
}

/// The capture's first `n` frames, in the corpus file format (u32 count, then u32-prefixed frames).
fn head_frames(frames: &Path, n: u32, out: &Path) {
    let raw = std::fs::read(frames).unwrap();
    let mut at = 4;
    for _ in 0..n {
        let len = u32::from_be_bytes(raw[at..at + 4].try_into().unwrap()) as usize;
        at += 4 + len;
    }
    let mut head = n.to_be_bytes().to_vec();
    head.extend_from_slice(&raw[4..at]);
    std::fs::write(out, head).unwrap();
}

fn setup() -> Option<Setup> {
    let capture = common::capture_dir()?;
    let frames = capture.join("firehose-frames.bin");
    let projection = riptide(&["jetstream", s(&frames)]);
    assert!(projection.status.success(), "{}", stderr(&projection));
    let events: Vec<(Key, Value)> = json_lines(&projection)
        .into_iter()
        .enumerate()
        .map(|(i, e)| (v1_key(i as u64 + 1, &e), e))
        .collect();
    assert_eq!(events.len(), 152);

    let data = tempfile::tempdir().unwrap();
    let head = data.path().join("head.bin");
    head_frames(&frames, 100, &head);
    let segments = data.path().join("segments");
    let out = riptide(&[
        "corpus",
        "segments",
        s(&head),
        "--out",
        s(&segments),
        "--block-rows",
        "8",
        "--segment-blocks",
        "5",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    // The archive's rows, counted from the files (seqs 1..=sealed, each once).
    let mut seqs = Vec::new();
    let mut names: Vec<_> = std::fs::read_dir(&segments)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    names.sort();
    for p in names {
        let bytes = std::fs::read(p).unwrap();
        let seg = riptide_segment::Segment::open(&bytes).unwrap();
        for i in 0..seg.blocks().len() {
            let body = seg.block_body(i).unwrap();
            seqs.extend(seg.rows(i, &body).unwrap().iter().map(|r| r.seq));
        }
    }
    let sealed = seqs.len() as u64;
    assert!(sealed > 50 && sealed < 152, "{sealed} archived rows");
    assert_eq!(seqs, (1..=sealed).collect::<Vec<_>>());

    let (server, addr) = common::spawn_serve(
        common::serve_command(data.path())
            .args(["--no-verify", "--ingest-file"])
            .arg(&frames),
    );
    wait_for(&addr, "riptide_ingest_finished", 1.0);
    Some(Setup {
        _data: data,
        _server: server,
        addr,
        events,
        sealed,
    })
}

/// `riptide tail --json ARGS` against the server: its events' keys, and its stderr.
fn tail(addr: &str, args: &[&str]) -> (Vec<Key>, String) {
    let url = format!("http://{addr}");
    let mut all = vec!["tail", "--jetstream", &url, "--json"];
    all.extend_from_slice(args);
    let out = riptide(&all);
    assert!(out.status.success(), "tail {args:?}: {}", stderr(&out));
    (json_lines(&out).iter().map(v2_key).collect(), stderr(&out))
}

#[test]
fn snapshot_and_replay_deliver_every_event_once_with_and_without_filters() {
    let Some(t) = setup() else {
        return;
    };
    let want = |pred: &dyn Fn(&Key) -> bool, upto: u64| -> Vec<Key> {
        t.events
            .iter()
            .map(|(k, _)| k.clone())
            .filter(|k| k.0 <= upto && pred(k))
            .collect()
    };
    // The account with the most events.
    let mut per_did = BTreeMap::<&str, usize>::new();
    for (k, _) in &t.events {
        *per_did.entry(k.2.as_str()).or_default() += 1;
    }
    let did = per_did
        .iter()
        .max_by_key(|(_, n)| **n)
        .unwrap()
        .0
        .to_string();

    type Case<'a> = (Vec<&'a str>, Box<dyn Fn(&Key) -> bool>);
    let cases: Vec<Case> = vec![
        (vec![], Box::new(|_| true)),
        (vec!["--did", &did], {
            let d = did.clone();
            Box::new(move |k| k.2 == d)
        }),
        (
            vec!["--kind", "commit", "--collection", "app.bsky.feed.like"],
            Box::new(|k| k.1 == "commit" && k.4 == "app.bsky.feed.like"),
        ),
        (
            vec!["--collection", "app.bsky.graph.*"],
            Box::new(|k| k.1 != "commit" || k.4.starts_with("app.bsky.graph.")),
        ),
        (
            vec!["--kind", "identity", "--kind", "account"],
            Box::new(|k| k.1 != "commit"),
        ),
    ];
    for (args, pred) in &cases {
        // The archive alone: exactly its matching events, each once, in order.
        let mut a = vec!["--snapshot"];
        a.extend(args);
        let (got, err) = tail(&t.addr, &a);
        assert_eq!(
            got,
            want(pred.as_ref(), t.sealed),
            "snapshot {args:?}: {err}"
        );

        // The archive, then live: every matching event of the capture once across the switch.
        let exp = want(pred.as_ref(), u64::MAX);
        let n = exp.len().to_string();
        let mut a = vec!["--replay", "--count", &n];
        a.extend(args);
        let (got, err) = tail(&t.addr, &a);
        assert_eq!(got, exp, "replay {args:?}: {err}");
        let archived = exp.iter().filter(|k| k.0 <= t.sealed).count();
        assert!(
            err.contains(&format!("archive: {archived} events")),
            "replay {args:?}: {err}"
        );
    }

    // A window: --cursor is the first seq wanted, --before-seq the last.
    let (got, _) = tail(
        &t.addr,
        &["--snapshot", "--cursor", "38", "--before-seq", "90"],
    );
    assert_eq!(got, want(&|k| k.0 >= 38, 90));
    let exp = want(&|k| k.0 >= 60, u64::MAX);
    let n = exp.len().to_string();
    let (got, _) = tail(&t.addr, &["--replay", "--cursor", "60", "--count", &n]);
    assert_eq!(got, exp);

    // A blocks plan was read with getBlock, whole segments with getSegment.
    let m = |e: &str| {
        common::metric(
            &t.addr,
            &format!("riptide_archive_requests_total{{endpoint=\"{e}\"}}"),
        )
    };
    assert!(m("getBlock") >= 1.0 && m("getSegment") >= 1.0);

    // A request the planner would refuse is refused before asking, once, as a usage error.
    let url = format!("http://{}", t.addr);
    let out = riptide(&["tail", "--jetstream", &url, "--snapshot", "--kind", "nope"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("invalid kind"), "{}", stderr(&out));
}

/// A proxy in front of `upstream` that cuts the first `cuts` connections after `budget` bytes of
/// response; the connections it cut.
async fn cutting_proxy(upstream: String, cuts: usize, budget: usize) -> (String, Arc<AtomicUsize>) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let cut = Arc::new(AtomicUsize::new(0));
    let seen = Arc::new(AtomicUsize::new(0));
    let cut2 = cut.clone();
    tokio::spawn(async move {
        loop {
            let (mut down, _) = l.accept().await.unwrap();
            let mut up = tokio::net::TcpStream::connect(&upstream).await.unwrap();
            let n = seen.fetch_add(1, Ordering::SeqCst);
            let cut = cut2.clone();
            tokio::spawn(async move {
                if n >= cuts {
                    let _ = tokio::io::copy_bidirectional(&mut down, &mut up).await;
                    return;
                }
                let (mut dr, mut dw) = down.split();
                let (mut ur, mut uw) = up.split();
                let to_server = tokio::io::copy(&mut dr, &mut uw);
                let to_client = async {
                    let mut buf = vec![0u8; 512];
                    let mut sent = 0;
                    while sent < budget {
                        let k = ur.read(&mut buf).await.unwrap_or(0);
                        if k == 0 {
                            return;
                        }
                        let k = k.min(budget - sent);
                        dw.write_all(&buf[..k]).await.unwrap();
                        sent += k;
                    }
                    cut.fetch_add(1, Ordering::SeqCst);
                };
                tokio::select! {
                    _ = to_server => {}
                    _ = to_client => {}
                }
                // Dropping both halves closes both connections mid-response.
            });
        }
    });
    (addr, cut)
}

#[test]
fn a_download_cut_mid_response_is_resumed_with_ranges() {
    let Some(t) = setup() else {
        return;
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let read = |url: String| async move {
            let mut cfg = ArchiveConfig::new(url);
            // Small ranges, so that a segment takes several requests.
            cfg.range_bytes = 2048;
            let mut snap = Snapshot::new(cfg).unwrap();
            let mut got = Vec::new();
            while let Some(e) = snap.next().await.unwrap() {
                got.push(e);
            }
            (got, snap.stats())
        };
        let (direct, clean) = read(format!("http://{}", t.addr)).await;
        assert_eq!(direct.len() as u64, t.sealed);
        assert_eq!((clean.retries, clean.interrupted), (0, 0));
        // Each event's CID is the one the v1 projection took from the CAR.
        for e in &direct {
            let (k, _) = &t.events[e.seq() as usize - 1];
            assert_eq!(e.cid.map(|c| c.to_string()).unwrap_or_default(), k.6);
            assert_eq!(e.row.did, k.2);
        }

        let gets = || {
            common::metric(
                &t.addr,
                "riptide_archive_requests_total{endpoint=\"getSegment\"}",
            )
        };
        let before = gets();
        // Cuts land inside range bodies (a range answer is ~2.3 KB with its head).
        let (proxy, cut) = cutting_proxy(t.addr.clone(), 4, 3000).await;
        let (resumed, stats) = read(format!("http://{proxy}")).await;
        assert!(cut.load(Ordering::SeqCst) >= 1);
        assert_eq!(resumed, direct, "the resumed read differs");
        assert!(stats.retries >= 1, "{stats:?}");
        assert!(stats.interrupted >= 1, "{stats:?}");
        assert_eq!(stats.restarts, 0, "{stats:?}");
        assert!(gets() - before > clean.segments as f64, "{stats:?}");
    });
}
