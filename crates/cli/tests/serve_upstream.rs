//! `riptide serve --upstream`: real components on loopback — an in-process `riptide-relay`, the
//! `riptide` binary, a `riptide-sim` PLC directory, WebSocket and `JetstreamClient` consumers.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use common::{metric, metrics, wait_for, KillOnDrop};
use riptide_firehose::corpus::split_frames;
use riptide_firehose::{DecodeOptions, FrameDecoder};
use riptide_jetstream::Projector;
use riptide_relay::{Relay, RelayConfig, RelayHandle, SeqSlot};
use serde_json::Value;

/// `riptide serve` from upstream cursor 0 into `data`, with its address.
fn serve(data: &Path, args: &[&str]) -> (KillOnDrop, String) {
    common::spawn_serve(
        common::serve_command(data)
            .args(["--upstream-cursor", "0"])
            .args(args),
    )
}

fn verdicts(addr: &str) -> BTreeMap<String, u64> {
    metrics(addr)
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("riptide_verdicts_total{verdict=\"")?;
            let (v, n) = rest.split_once("\"} ")?;
            let n: u64 = n.parse().ok()?;
            (n > 0).then(|| (v.to_owned(), n))
        })
        .collect()
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// The frames of a corpus file a relay can serve, with their indexes in the file.
fn frames_of(path: &Path) -> Vec<(usize, Bytes)> {
    let file = Bytes::from(std::fs::read(path).unwrap());
    let mut dec = FrameDecoder::with_options(DecodeOptions {
        decode_blocks: false,
        ..DecodeOptions::unverified()
    });
    split_frames(&file)
        .unwrap()
        .iter()
        .enumerate()
        .filter(|(i, f)| SeqSlot::find(&mut dec, *i, f.bytes).is_ok())
        .map(|(i, f)| (i, file.slice(f.offset..f.offset + f.bytes.len())))
        .collect()
}

/// Drops what a relay and a server assign themselves: `time_us`, `cursor`, and the upstream
/// `seq` inside `identity` / `account` (the relay renumbers frames).
fn normalize(v: &mut Value) -> Option<u64> {
    let o = v.as_object_mut().unwrap();
    o.remove("time_us");
    for k in ["identity", "account"] {
        if let Some(inner) = o.get_mut(k).and_then(Value::as_object_mut) {
            inner.remove("seq");
        }
    }
    o.remove("cursor").and_then(|c| c.as_u64())
}

/// Our projection of `frames`, normalized.
fn projection<'a>(frames: impl IntoIterator<Item = &'a Bytes>) -> Vec<Value> {
    let mut dec = FrameDecoder::with_options(DecodeOptions {
        decode_blocks: false,
        ..DecodeOptions::default()
    });
    let mut proj = Projector::new();
    let mut out = Vec::new();
    for f in frames {
        let frame = dec.decode(f).unwrap();
        let p = proj.project(&frame);
        for i in 0..p.len() {
            let mut buf = Vec::new();
            p.render(i, 0, None, &mut buf);
            let mut v: Value = serde_json::from_slice(&buf).unwrap();
            normalize(&mut v);
            out.push(v);
        }
    }
    out
}

/// Every stored event from cursor 0, normalized; the cursors separately.
async fn read_all(addr: &str, n: usize) -> (Vec<Value>, Vec<u64>) {
    let mut out = common::events_from_start(addr, n).await;
    let cursors = out.iter_mut().map(|v| normalize(v).unwrap()).collect();
    (out, cursors)
}

async fn relay(frames: Vec<Bytes>, cfg: RelayConfig) -> RelayHandle {
    Relay::bind("127.0.0.1:0".parse().unwrap(), frames, cfg)
        .await
        .unwrap()
        .1
}

/// (a) + (d): the real capture through a relay and the upstream client, served as our
/// projection; then `JetstreamClient` with a collection filter and zstd with the legacy
/// dictionary.
#[test]
fn capture_through_relay_then_jetstream_client() {
    let Some(corpus) = riptide_testdata::corpus() else {
        return;
    };
    let cap = corpus.join("jetstream-2026-07");
    let frames: Vec<Bytes> = frames_of(&cap.join("firehose-frames.bin"))
        .into_iter()
        .map(|(_, f)| f)
        .collect();
    let want = projection(&frames);
    assert_eq!(want.len(), 152);
    let n_frames = frames.len() as f64;
    let rt = rt();
    let relay = rt.block_on(relay(frames, RelayConfig::default()));
    let data = tempfile::tempdir().unwrap();
    let dict = corpus.join("jetstream-dictionaries/legacy_subscribe.zdict");
    let (server, addr) = serve(
        data.path(),
        &[
            "--upstream",
            &relay.url(),
            "--did-docs",
            cap.join("did_docs.json").to_str().unwrap(),
            "--zstd-dictionary",
            dict.to_str().unwrap(),
        ],
    );
    wait_for(&addr, "riptide_upstream_seq", n_frames);
    assert_eq!(metric(&addr, "riptide_events_stored_total"), 152.0);
    assert_eq!(verdicts(&addr).get("ok").copied(), Some(n_frames as u64));
    let (got, cursors) = rt.block_on(read_all(&addr, 152));
    assert_eq!(cursors, (1..=152).collect::<Vec<u64>>());
    assert_eq!(got, want);

    // JetstreamClient: wantedCollections + compress=true with the legacy dictionary.
    let wanted = "app.bsky.feed.like";
    let want_likes: Vec<&Value> = want
        .iter()
        .filter(|v| v["commit"]["collection"] == wanted)
        .collect();
    assert!(!want_likes.is_empty());
    let got_likes = rt.block_on(async {
        let mut client = riptide_client::JetstreamClient::new(riptide_client::JetstreamConfig {
            client: riptide_client::ClientConfig {
                start_cursor: Some(0),
                ..riptide_client::ClientConfig::with_hosts([format!("ws://{addr}")])
            },
            options: riptide_client::JetstreamOptions {
                wanted_collections: vec![wanted.into()],
                ..Default::default()
            },
            dictionary: Some(std::fs::read(&dict).unwrap()),
            require_hello: false,
        })
        .unwrap();
        let mut out = Vec::new();
        while out.len() < want_likes.len() {
            let e = tokio::time::timeout(Duration::from_secs(60), client.next())
                .await
                .unwrap();
            let mut v: Value = serde_json::from_slice(&e.raw).unwrap();
            normalize(&mut v);
            out.push(v);
        }
        out
    });
    assert_eq!(got_likes.iter().collect::<Vec<_>>(), want_likes);
    assert!(
        metric(&addr, "riptide_events_filtered_total") > 0.0,
        "the filter ran on the server"
    );
    drop(server);
    rt.block_on(relay.shutdown());
}

/// (b): kill -9 during upstream ingest, restart: seqs continue, nothing durable lost or
/// duplicated, and the upstream resumes from the stored cursor (no frame is received twice).
#[test]
fn kill_9_during_upstream_ingest_resumes_from_stored_cursor() {
    let Some(corpus) = riptide_testdata::corpus() else {
        return;
    };
    const REPEAT: usize = 30;
    let cap = corpus.join("jetstream-2026-07");
    let one: Vec<Bytes> = frames_of(&cap.join("firehose-frames.bin"))
        .into_iter()
        .map(|(_, f)| f)
        .collect();
    let per_pass = one.len();
    let frames: Vec<Bytes> = (0..REPEAT).flat_map(|_| one.iter().cloned()).collect();
    let total_frames = frames.len() as f64;
    let rt = rt();
    // The relay paces its log from its start, not per subscriber: slow enough (9 s in all) that
    // the server, started after it, is killed mid-stream even on a loaded machine.
    let relay = rt.block_on(relay(
        frames,
        RelayConfig {
            rate: Some(500.0),
            ..RelayConfig::default()
        },
    ));
    let data = tempfile::tempdir().unwrap();
    let docs = cap.join("did_docs.json");
    let args = [
        "--upstream",
        &relay.url(),
        "--did-docs",
        docs.to_str().unwrap(),
        // The capture repeated is all replays to chain state (tests/serve_kill.rs has the kill
        // test with chain state).
        "--stateless",
    ];
    let (server, addr) = serve(data.path(), &args);
    wait_for(&addr, "riptide_events_stored_total", 1000.0);
    server.kill(); // SIGKILL
    let (server, addr) = serve(data.path(), &args);
    let start = metric(&addr, "riptide_upstream_start_cursor");
    assert!(
        start >= 1000.0 / 152.0 * per_pass as f64 * 0.9,
        "resumed from {start}"
    );
    assert!(
        metric(&addr, "riptide_log_next_seq") > 1000.0,
        "durable events lost"
    );
    wait_for(&addr, "riptide_upstream_seq", total_frames);
    // Asked for cursor = stored value: every frame after it arrived once, none before it.
    assert_eq!(
        metric(&addr, "riptide_upstream_frames_duplicate_total"),
        0.0
    );
    assert_eq!(
        metric(&addr, "riptide_upstream_frames_total"),
        total_frames - start
    );
    let total = 152 * REPEAT;
    assert_eq!(metric(&addr, "riptide_log_next_seq") as usize, total + 1);
    let want = projection(&one);
    let (got, cursors) = rt.block_on(read_all(&addr, total));
    assert_eq!(cursors, (1..=total as u64).collect::<Vec<_>>());
    for (i, v) in got.iter().enumerate() {
        assert_eq!(v, &want[i % 152], "event {i}");
    }
    drop(server);
    rt.block_on(relay.shutdown());
}

/// A small generated network in `dir` (`adversarial` share of broken frames).
fn generate(dir: &Path, adversarial: f64) -> Vec<(usize, Bytes)> {
    let mut cfg = riptide_gen::Config::new(7, 20, 400);
    cfg.adversarial = adversarial;
    cfg.initial_records = (5, 40);
    riptide_gen::write_dir(&cfg, dir).unwrap();
    frames_of(&dir.join("firehose-frames.bin"))
}

/// (c): broken commits from upstream (bad signature, wrong prevData, …) are not served and are
/// counted by verdict; everything else is served exactly.
#[test]
fn adversarial_frames_from_upstream_are_counted_not_served() {
    let gen = tempfile::tempdir().unwrap();
    let frames = generate(gen.path(), 0.06);
    let adv: Vec<Value> =
        serde_json::from_slice(&std::fs::read(gen.path().join("adversarial.json")).unwrap())
            .unwrap();
    let mut planned: BTreeMap<String, u64> = BTreeMap::new();
    let mut rejected = std::collections::HashSet::new();
    for e in &adv {
        let i = e["index"].as_u64().unwrap() as usize;
        let v = e["expected_verdict"].as_str().unwrap();
        if frames.iter().any(|(j, _)| *j == i) && v != "ok" {
            *planned.entry(v.to_owned()).or_default() += 1;
            rejected.insert(i);
        }
    }
    assert!(planned.contains_key("bad-signature") && planned.contains_key("inversion-mismatch"));
    let n = frames.len() as u64;
    let want = projection(
        frames
            .iter()
            .filter(|(i, _)| !rejected.contains(i))
            .map(|(_, f)| f),
    );
    // `#sync` frames are stored too (for Jetstream v2's subscribeEvents), never sent on v1.
    let mut dec = FrameDecoder::with_options(DecodeOptions::unverified());
    let syncs = frames
        .iter()
        .filter(|(i, f)| {
            !rejected.contains(i)
                && matches!(
                    dec.decode(f).map(|f| *f.body()),
                    Ok(riptide_firehose::Body::Sync(_))
                )
        })
        .count();
    let rt = rt();
    let relay = rt.block_on(relay(
        frames.into_iter().map(|(_, f)| f).collect(),
        RelayConfig::default(),
    ));
    let data = tempfile::tempdir().unwrap();
    let docs = gen.path().join("did_docs.json");
    let (server, addr) = serve(
        data.path(),
        &[
            "--upstream",
            &relay.url(),
            "--did-docs",
            docs.to_str().unwrap(),
            // Chain breaks re-establish the chain (nothing to resync from here).
            "--no-resync",
        ],
    );
    wait_for(&addr, "riptide_upstream_seq", n as f64);
    let mut expect = planned.clone();
    expect.insert("ok".into(), n - planned.values().sum::<u64>());
    assert_eq!(verdicts(&addr), expect);
    assert_eq!(
        metric(&addr, "riptide_events_stored_total") as usize,
        want.len() + syncs
    );
    let (got, _) = rt.block_on(read_all(&addr, want.len()));
    assert_eq!(got, want);
    drop(server);
    rt.block_on(relay.shutdown());
}

/// (e): no --did-docs: keys resolved through a riptide-sim PLC directory; 100% ok.
#[test]
fn plc_resolution_verifies_a_generated_stream() {
    let gen = tempfile::tempdir().unwrap();
    let frames = generate(gen.path(), 0.0);
    let n = frames.len() as u64;
    let frames: Vec<Bytes> = frames.into_iter().map(|(_, f)| f).collect();
    let want = projection(&frames);
    let rt = rt();
    let sim = rt.block_on(async {
        let net = riptide_sim::Network::load(gen.path()).unwrap();
        riptide_sim::Sim::spawn(
            net,
            "127.0.0.1:0".parse().unwrap(),
            riptide_sim::Faults::default(),
        )
        .await
        .unwrap()
    });
    let relay = rt.block_on(relay(frames, RelayConfig::default()));
    let data = tempfile::tempdir().unwrap();
    // The sim serves no repositories here: an upstream `#sync` would be resynced (its account
    // held until its repository lands), and this test is about keys.
    let (server, addr) = serve(
        data.path(),
        &[
            "--upstream",
            &relay.url(),
            "--plc-url",
            &sim.base_url(),
            "--no-resync",
        ],
    );
    wait_for(&addr, "riptide_upstream_seq", n as f64);
    assert_eq!(verdicts(&addr), BTreeMap::from([("ok".to_owned(), n)]));
    assert_eq!(metric(&addr, "riptide_key_lookup_failures_total"), 0.0);
    let (got, _) = rt.block_on(read_all(&addr, want.len()));
    assert_eq!(got, want);
    drop(server);
    sim.abort();
    rt.block_on(relay.shutdown());
}

/// A frame with its header and a payload map whose entries are written by `fields` (canonical
/// order is the caller's).
fn hand_frame(t: &str, len: usize, fields: impl FnOnce(&mut Vec<u8>)) -> Bytes {
    let mut out = Vec::new();
    riptide_firehose::encode::write_message_header(&mut out, t);
    riptide_cbor::write_map_header(&mut out, len);
    fields(&mut out);
    Bytes::from(out)
}

/// An `#account` or `#identity` frame for `did` (which need not be a DID).
fn account_like(t: &str, did: &str) -> Bytes {
    use riptide_cbor::{write_bool, write_int, write_text};
    hand_frame(t, 4, |out| {
        write_text(out, "did");
        write_text(out, did);
        write_text(out, "seq");
        write_int(out, 1);
        write_text(out, "time");
        write_text(out, "2026-11-28T08:00:00.000Z");
        if t == "#account" {
            write_text(out, "active");
            write_bool(out, true);
        } else {
            write_text(out, "handle");
            write_text(out, "someone.test");
        }
    })
}

/// Issue 40's first item, as the campaign reproduced it: an `#account` frame with `"did": ""`
/// in the middle of a generated stream once reached the store, whose key-value engine asserts a
/// non-empty key, and panicked ingest's writer for good (every restart met the frame again).
/// Now the frame is refused where it is decoded (`malformed`, counted), with the other
/// frames whose DID is not a DID, and everything after them is served — verifying, trusting
/// (`--no-verify`) and without chain state (`--stateless`).
#[test]
fn frames_whose_did_is_not_a_did_are_refused_and_ingest_goes_on() {
    let gen = tempfile::tempdir().unwrap();
    let good = generate(gen.path(), 0.0);
    let bad = [
        account_like("#account", ""),
        account_like("#identity", ""),
        account_like("#account", "not-a-did"),
        account_like("#identity", "did:plc:"),
    ];
    let mut frames: Vec<Bytes> = good.iter().map(|(_, f)| f.clone()).collect();
    let at = frames.len() / 2;
    for (k, f) in bad.iter().enumerate() {
        frames.insert(at + k, f.clone());
    }
    let want = projection(good.iter().map(|(_, f)| f));
    let mut dec = FrameDecoder::with_options(DecodeOptions::unverified());
    let syncs = good
        .iter()
        .filter(|(_, f)| {
            matches!(
                dec.decode(f).map(|f| *f.body()),
                Ok(riptide_firehose::Body::Sync(_))
            )
        })
        .count();
    let n = frames.len() as u64;
    let docs = gen.path().join("did_docs.json");
    let rt = rt();
    let relay = rt.block_on(relay(frames, RelayConfig::default()));
    for mode in [
        &["--did-docs", docs.to_str().unwrap(), "--no-resync"][..],
        &["--no-verify"][..],
        &["--did-docs", docs.to_str().unwrap(), "--stateless"][..],
    ] {
        let data = tempfile::tempdir().unwrap();
        let mut args = vec!["--upstream", relay.url().leak() as &str];
        args.extend_from_slice(mode);
        let (server, addr) = serve(data.path(), &args);
        wait_for(&addr, "riptide_upstream_seq", n as f64);
        let v = verdicts(&addr);
        assert_eq!(
            v.get("malformed"),
            Some(&(bad.len() as u64)),
            "{mode:?}: {v:?}"
        );
        assert_eq!(metric(&addr, "riptide_ingest_failed"), 0.0, "{mode:?}");
        assert_eq!(
            metric(&addr, "riptide_events_stored_total") as usize,
            want.len() + syncs,
            "{mode:?}"
        );
        let (got, _) = rt.block_on(read_all(&addr, want.len()));
        assert_eq!(got, want, "{mode:?}");
        let (code, _) = common::http_get(&addr, "/healthz");
        assert_eq!(code, 200, "{mode:?}");
        drop(server);
    }
    rt.block_on(relay.shutdown());
}

/// A panic on the ingest path (injected in the writer by `RIPTIDE_FAULT_INGEST_PANIC`) must not
/// leave a process that looks healthy: the upstream here goes quiet after its frames, so nothing
/// but the failure itself can stop ingest. The server says why once and exits non-zero.
#[test]
fn a_panic_on_the_ingest_path_is_loud_and_the_server_exits() {
    let gen = tempfile::tempdir().unwrap();
    let frames: Vec<Bytes> = generate(gen.path(), 0.0)
        .into_iter()
        .map(|(_, f)| f)
        .collect();
    let rt = rt();
    let relay = rt.block_on(relay(frames, RelayConfig::default()));
    let data = tempfile::tempdir().unwrap();
    let flag = data.path().join("panic-now");
    std::fs::write(&flag, b"").unwrap();
    let mut cmd = common::serve_command(&data.path().join("store"));
    cmd.args([
        "--upstream-cursor",
        "0",
        "--upstream",
        &relay.url(),
        "--no-verify",
    ])
    .env("RIPTIDE_FAULT_INGEST_PANIC", &flag)
    .env("RUST_LOG", "error")
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::piped());
    let child = cmd.spawn().unwrap();
    let started = std::time::Instant::now();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "exited {:?}: {err}", out.status);
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "took {:?}",
        started.elapsed()
    );
    assert!(err.contains("ingest failed"), "{err}");
    assert!(
        err.contains("ingest-write panicked: RIPTIDE_FAULT_INGEST_PANIC"),
        "{err}"
    );
    rt.block_on(relay.shutdown());
}

/// Issue 39: a PLC directory that does not answer fails the DID lookup of every frame of the
/// real capture; that flood is said in [`FIRST`] full lines and then summaries whose counts add
/// up exactly (each summary's `total` is the full lines plus every line not said before it),
/// while `/metrics` counts every failure and every commit is `unknown-key`, never passed.
///
/// [`FIRST`]: riptide_throttle::Throttle::FIRST
#[test]
fn a_plc_that_does_not_answer_is_said_a_few_times_not_once_per_frame() {
    use riptide_throttle::Throttle;
    let Some(corpus) = riptide_testdata::corpus() else {
        return;
    };
    let frames: Vec<Bytes> = frames_of(&corpus.join("jetstream-2026-07/firehose-frames.bin"))
        .into_iter()
        .map(|(_, f)| f)
        .collect();
    let n = frames.len() as u64;
    let rt = rt();
    let relay = rt.block_on(relay(frames, RelayConfig::default()));
    let data = tempfile::tempdir().unwrap();
    let log = data.path().join("stderr.log");
    let (server, addr) = common::spawn_serve(
        common::serve_command(&data.path().join("data"))
            .args(["--upstream-cursor", "0", "--upstream", &relay.url()])
            .args(["--plc-url", "http://127.0.0.1:1", "--no-resync"])
            .stderr(std::fs::File::create(&log).unwrap()),
    );
    // Every frame verified (as unknown-key: no key could be had), none passed.
    let deadline = std::time::Instant::now() + common::PATIENCE;
    while verdicts(&addr).values().sum::<u64>() < n {
        assert!(
            std::time::Instant::now() < deadline,
            "{:?}",
            verdicts(&addr)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Only frames with nothing to verify (identity, account) are ok.
    let v = verdicts(&addr);
    assert!(
        v.keys().all(|k| k == "ok" || k == "unknown-key") && v["unknown-key"] > n - 5,
        "{v:?}"
    );
    let failures = metric(&addr, "riptide_key_lookup_failures_total") as u64;
    assert!(failures > 2 * Throttle::FIRST, "not a flood: {failures}");
    drop(server);
    rt.block_on(relay.shutdown());
    let text = std::fs::read_to_string(&log).unwrap();
    said_by_the_rule(
        &text,
        "DID lookup given up:",
        "DID lookups given up",
        failures,
    );
}

/// Checks one kind of warning in a log against the warning rule (`riptide-throttle`): exactly
/// [`Throttle::FIRST`] lines said in full (containing `full`), then summaries (containing
/// `summary`) whose `total` is the full lines plus every occurrence not said before it, this one
/// included; `counted` (the metric) at least as many as were said, and a few summaries at most.
///
/// [`Throttle::FIRST`]: riptide_throttle::Throttle::FIRST
fn said_by_the_rule(text: &str, full: &str, summary: &str, counted: u64) {
    use riptide_throttle::Throttle;
    let full_lines = text.lines().filter(|l| l.contains(full)).count() as u64;
    assert_eq!(full_lines, Throttle::FIRST, "{text}");
    let field = |l: &str, k: &str| -> u64 {
        let at = l.find(&format!("{k}=")).unwrap() + k.len() + 1;
        l[at..]
            .split(|c: char| !c.is_ascii_digit())
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    let mut said = Throttle::FIRST;
    let summaries: Vec<&str> = text.lines().filter(|l| l.contains(summary)).collect();
    for l in &summaries {
        said += field(l, "suppressed") + 1;
        assert_eq!(field(l, "total"), said, "{l}");
    }
    assert!(said <= counted, "{said} > {counted}");
    assert!(summaries.len() <= 3, "{text}");
}

/// Issue 39: a relay that sends a flood of `#info` frames (1,000 here) gets them counted
/// (`riptide_upstream_info_total`) and said by the warning rule, not a line each.
#[test]
fn a_flood_of_info_frames_is_counted_and_said_a_few_times() {
    use futures_util::SinkExt;
    const N: u64 = 1_000;
    let mut info = Vec::new();
    riptide_firehose::encode::write_message_header(&mut info, "#info");
    riptide_cbor::write_map_header(&mut info, 2);
    riptide_cbor::write_text(&mut info, "name");
    riptide_cbor::write_text(&mut info, "Flood");
    riptide_cbor::write_text(&mut info, "message");
    riptide_cbor::write_text(&mut info, "one of many");
    let rt = rt();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let url = format!("ws://{}", listener.local_addr().unwrap());
    // A relay that sends N #info frames on each connection, then holds it open.
    rt.spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            let info = info.clone();
            tokio::spawn(async move {
                let Ok(mut ws) = tokio_tungstenite::accept_async(s).await else {
                    return;
                };
                for _ in 0..N {
                    if ws
                        .send(tokio_tungstenite::tungstenite::Message::binary(
                            info.clone(),
                        ))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
                while let Some(Ok(_)) = futures_util::StreamExt::next(&mut ws).await {}
            });
        }
    });
    let data = tempfile::tempdir().unwrap();
    let log = data.path().join("stderr.log");
    let (server, addr) = common::spawn_serve(
        common::serve_command(&data.path().join("data"))
            .args(["--no-verify", "--upstream", &url])
            .stderr(std::fs::File::create(&log).unwrap()),
    );
    wait_for(&addr, "riptide_upstream_info_total", N as f64);
    let counted = metric(&addr, "riptide_upstream_info_total") as u64;
    drop(server);
    let text = std::fs::read_to_string(&log).unwrap();
    said_by_the_rule(
        &text,
        "upstream #info name=",
        "upstream #info frames:",
        counted,
    );
}
