//! Jetstream v2's `subscribeEvents` on `riptide serve`, real components on loopback: the real
//! capture through an in-process `riptide-relay` into the `riptide` binary, read back on v1
//! `/subscribe` and on v2 by a tokio-tungstenite client. v2 must carry exactly v1's events (same
//! records, CIDs, seqs) in v2's shape; every filter, every pre-upgrade 400, compression with
//! Jetstream v2's dictionary (ID 20260811) and the server-push-only rule are checked here.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{Read, Write};
use std::path::Path;

use bytes::Bytes;
use common::{metric, metrics, v2_frames, v2_texts, wait_for, PATIENCE, V2};
use futures_util::{SinkExt, StreamExt};
use riptide_firehose::corpus::split_frames;
use riptide_firehose::{DecodeOptions, FrameDecoder};
use riptide_relay::{Relay, RelayConfig, SeqSlot};
use serde_json::Value;
use tokio_tungstenite::tungstenite::Message;

const NSID: &str = "network.bsky.jetstream.subscribeEvents";
const EVENTS: usize = 152;
const DICT_ID: u32 = 20260811;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn relay_frames(path: &Path) -> Vec<Bytes> {
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
        .map(|(_, f)| file.slice(f.offset..f.offset + f.bytes.len()))
        .collect()
}

/// A plain HTTP GET: (status, content-type, body).
fn http_get(addr: &str, path: &str) -> (u16, String, Vec<u8>) {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = String::from_utf8_lossy(&raw[..split]).to_string();
    let status = head[9..12].parse().unwrap();
    let ctype = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-type")
                .then(|| v.trim().to_owned())
        })
        .unwrap_or_default();
    (status, ctype, raw[split + 4..].to_vec())
}

/// The payloads of message frames with a seq.
fn payloads(frames: &[Value]) -> Vec<&Value> {
    frames
        .iter()
        .filter(|f| f["$type"] == "message" && f["payload"]["seq"].is_u64())
        .map(|f| &f["payload"])
        .collect()
}

/// The v1 event the v2 payload `p` must equal, in v1's shape (commit fields under `commit`,
/// `time_us` from `time`): asserts the v2 shape on the way.
fn as_v1(p: &Value) -> Value {
    let ty = p["$type"].as_str().unwrap();
    let kind = ty.strip_prefix(&format!("{NSID}#")).unwrap();
    let time = p["time"].as_str().unwrap();
    // RFC 3339, UTC, exactly six fractional digits.
    assert_eq!(time.len(), 27, "{time}");
    assert!(time.ends_with('Z') && time.as_bytes()[19] == b'.', "{time}");
    assert!(time[20..26].bytes().all(|b| b.is_ascii_digit()), "{time}");
    let mut v = serde_json::json!({
        "did": p["did"],
        "time_us": time_us(time),
        "cursor": p["seq"],
        "kind": kind,
    });
    let o = p.as_object().unwrap();
    if kind == "commit" {
        let mut c = serde_json::Map::new();
        for k in ["rev", "operation", "collection", "rkey", "record", "cid"] {
            if let Some(x) = o.get(k) {
                c.insert(k.into(), x.clone());
            }
        }
        let delete = p["operation"] == "delete";
        assert_eq!(o.contains_key("record"), !delete, "{p}");
        assert_eq!(o.contains_key("cid"), !delete, "{p}");
        assert_eq!(o.len(), 4 + c.len(), "no other fields: {p}");
        v["commit"] = Value::Object(c);
    } else {
        assert_eq!(o.len(), 5, "{p}");
        v[kind] = p[kind].clone();
    }
    v
}

/// `YYYY-MM-DDTHH:MM:SS.ffffffZ` back to unix µs (days from civil, Hinnant).
fn time_us(t: &str) -> i64 {
    let n = |r: std::ops::Range<usize>| t[r].parse::<i64>().unwrap();
    let (y, m, d) = (n(0..4), n(5..7), n(8..10));
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    ((days * 86_400 + n(11..13) * 3600 + n(14..16) * 60 + n(17..19)) * 1_000_000) + n(20..26)
}

async fn v1_all(addr: &str) -> Vec<Value> {
    common::events_from_start(addr, EVENTS).await
}

#[test]
fn subscribe_events_carries_what_subscribe_carries() {
    let Some(corpus) = riptide_testdata::corpus() else {
        return;
    };
    let cap = corpus.join("jetstream-2026-07");
    let frames = relay_frames(&cap.join("firehose-frames.bin"));
    let n_frames = frames.len() as f64;
    let dict_path = corpus.join("jetstream-dictionaries/subscribe_events_20260811.zdict");
    let dict = std::fs::read(&dict_path).unwrap();
    let rt = rt();
    let relay = rt.block_on(async {
        Relay::bind(
            "127.0.0.1:0".parse().unwrap(),
            frames,
            RelayConfig::default(),
        )
        .await
        .unwrap()
        .1
    });
    let data = tempfile::tempdir().unwrap();
    let (server, addr) = common::spawn_serve(
        common::serve_command(data.path())
            .args(["--upstream-cursor", "0", "--upstream", &relay.url()])
            .arg("--did-docs")
            .arg(cap.join("did_docs.json"))
            .arg("--zstd-dictionary-v2")
            .arg(&dict_path),
    );
    wait_for(&addr, "riptide_upstream_seq", n_frames);
    assert_eq!(metric(&addr, "riptide_events_stored_total"), EVENTS as f64);

    // v1 as it was, and v2 from the start: the same events, seqs, records and CIDs.
    let v1 = rt.block_on(v1_all(&addr));
    let frames = rt.block_on(v2_frames(&addr, "cursor=0", EVENTS, None));
    assert!(frames.iter().all(|f| f["$type"] == "message"));
    let v2: Vec<Value> = payloads(&frames).into_iter().map(as_v1).collect();
    assert_eq!(v2.len(), EVENTS);
    assert_eq!(v2, v1, "v2 carries exactly v1's events");
    let kinds = |k: &str| v1.iter().filter(|e| e["kind"] == k).count();
    assert_eq!(
        (kinds("commit"), kinds("identity"), kinds("account")),
        (150, 1, 1)
    );
    assert!(v1.iter().any(|e| e["commit"]["operation"] == "delete"));

    // Cursors are inclusive; a future seq is live (nothing stored after it).
    let from = rt.block_on(v2_frames(&addr, "cursor=100", EVENTS - 99, None));
    assert_eq!(payloads(&from)[0]["seq"], 100);
    assert_eq!(payloads(&from).len(), EVENTS - 99);
    assert!(rt
        .block_on(v2_frames(&addr, "cursor=5000", 0, None))
        .is_empty());
    // A timestamp cursor: the first event at or after it (none expired, so no #info).
    let t = v1[40]["time_us"].as_i64().unwrap();
    let from = rt.block_on(v2_frames(&addr, &format!("cursor={t}"), EVENTS - 40, None));
    assert_eq!(payloads(&from)[0]["seq"], v1[40]["cursor"]);
    assert!(from
        .iter()
        .all(|f| f["payload"]["$type"] != format!("{NSID}#info")));

    // Every filter, against v1's events filtered by hand.
    let did = v1[10]["did"].as_str().unwrap().to_owned();
    let check = |query: &str, want: &dyn Fn(&Value) -> bool| {
        let want: Vec<&Value> = v1.iter().filter(|e| want(e)).collect();
        assert!(!want.is_empty(), "{query}: empty expectation");
        let got = rt.block_on(v2_frames(&addr, query, want.len(), None));
        let got: Vec<Value> = payloads(&got).into_iter().map(as_v1).collect();
        assert_eq!(got.iter().collect::<Vec<_>>(), want, "{query}");
    };
    let coll = |e: &Value| e["commit"]["collection"].as_str().unwrap_or("").to_owned();
    check("cursor=0&kinds=identity", &|e| e["kind"] == "identity");
    check("cursor=0&kinds=account&kinds=identity", &|e| {
        e["kind"] != "commit"
    });
    check("cursor=0&kinds=commit", &|e| e["kind"] == "commit");
    check(&format!("cursor=0&dids={did}"), &|e| {
        e["did"] == did.as_str()
    });
    // collections constrain commits only.
    check("cursor=0&collections=app.bsky.feed.like", &|e| {
        e["kind"] != "commit" || coll(e) == "app.bsky.feed.like"
    });
    check("cursor=0&kinds=commit&collections=app.bsky.graph.*", &|e| {
        coll(e).starts_with("app.bsky.graph.")
    });
    check(
        &format!("cursor=0&kinds=commit&collections=app.bsky.feed.like&collections=app.bsky.feed.post&dids={did}"),
        &|e| {
            e["did"] == did.as_str()
                && ["app.bsky.feed.like", "app.bsky.feed.post"].contains(&coll(e).as_str())
        },
    );
    // maxMessageSizeBytes: the text frame, envelope included.
    let texts = rt.block_on(v2_texts(&addr, "cursor=0", EVENTS, None));
    let sizes: Vec<usize> = texts.iter().map(String::len).collect();
    let mut sorted = sizes.clone();
    sorted.sort_unstable();
    let cap = sorted[sorted.len() / 2];
    let small: Vec<u64> = frames
        .iter()
        .zip(&sizes)
        .filter(|(_, &s)| s <= cap)
        .map(|(f, _)| f["payload"]["seq"].as_u64().unwrap())
        .collect();
    let got = rt.block_on(v2_frames(
        &addr,
        &format!("cursor=0&maxMessageSizeBytes={cap}"),
        small.len(),
        None,
    ));
    let got: Vec<u64> = payloads(&got)
        .iter()
        .map(|p| p["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(got, small);
    assert!(small.len() < EVENTS && small.len() >= EVENTS / 2);

    // Compression: every frame one zstd frame of exactly the text frame, ID 20260811.
    let z = rt.block_on(v2_frames(
        &addr,
        &format!("cursor=0&zstdDictionary={DICT_ID}"),
        EVENTS,
        Some(&dict),
    ));
    assert_eq!(z, frames);
    rt.block_on(async {
        let (mut ws, _) = tokio_tungstenite::connect_async(format!(
            "ws://{addr}{V2}?cursor=1&zstdDictionary={DICT_ID}"
        ))
        .await
        .unwrap();
        let Some(Ok(Message::Binary(b))) = ws.next().await else {
            panic!("no binary frame")
        };
        // The frame header names the dictionary.
        assert_eq!(&b[..4], &[0x28, 0xB5, 0x2F, 0xFD]);
        let text = zstd::bulk::Decompressor::with_dictionary(&dict)
            .unwrap()
            .decompress(&b, 1 << 20)
            .unwrap();
        assert_eq!(serde_json::from_slice::<Value>(&text).unwrap(), frames[0]);
        assert!(
            zstd::bulk::decompress(&b, 1 << 20).is_err(),
            "needs the dictionary"
        );
    });
    let (status, ctype, body) = http_get(&addr, "/xrpc/network.bsky.jetstream.getZstdDictionary");
    assert_eq!((status, ctype.as_str()), (200, "application/octet-stream"));
    assert_eq!(body, dict);
    let (status, _, body) = http_get(
        &addr,
        &format!("/xrpc/network.bsky.jetstream.getZstdDictionary?id={DICT_ID}"),
    );
    assert_eq!((status, body.len()), (200, dict.len()));
    let (status, _, body) = http_get(&addr, "/xrpc/network.bsky.jetstream.getZstdDictionary?id=7");
    let e: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        (status, e["error"].as_str()),
        (404, Some("DictionaryNotFound"))
    );

    // Every pre-upgrade 400, as an XRPC error envelope.
    for (query, error, says) in [
        ("wantedDids=did:plc:a", "InvalidRequest", "use dids"),
        (
            "wantedCollections=app.bsky.feed.post",
            "InvalidRequest",
            "use collections",
        ),
        ("requireHello=true", "InvalidRequest", "server-push only"),
        ("compress=true", "InvalidRequest", "zstdDictionary"),
        ("kinds=like", "InvalidRequest", "unknown kind"),
        (
            "kinds=commit&kinds=commit&kinds=commit&kinds=commit&kinds=commit",
            "InvalidRequest",
            "too many kinds",
        ),
        (
            "kinds=identity&collections=app.bsky.feed.post",
            "InvalidRequest",
            "excludes commit",
        ),
        ("dids=not-a-did", "InvalidRequest", "invalid DID"),
        (
            "collections=app.bsky.fo*",
            "InvalidRequest",
            "invalid collection",
        ),
        ("collections=bsky.*", "InvalidRequest", "wildcard"),
        (
            "maxMessageSizeBytes=big",
            "InvalidRequest",
            "maxMessageSizeBytes",
        ),
        ("cursor=-5", "InvalidRequest", "negative"),
        (
            "zstdDictionary=1612007021",
            "UnknownZstdDictionary",
            "current dictionary id is 20260811",
        ),
        ("zstdDictionary=0", "InvalidRequest", "positive"),
    ] {
        let (status, ctype, body) = http_get(&addr, &format!("{V2}?{query}"));
        assert_eq!(
            (status, ctype.as_str()),
            (400, "application/json"),
            "{query}"
        );
        let e: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(e["error"], error, "{query}");
        assert!(
            e["message"].as_str().unwrap().contains(says),
            "{query}: {e}"
        );
    }
    let many: String = (0..101).map(|i| format!("collections=a.b.c{i}&")).collect();
    assert_eq!(http_get(&addr, &format!("{V2}?{many}")).0, 400);

    // Server-push only: a client data frame closes the connection with 1008.
    rt.block_on(async {
        let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{addr}{V2}"))
            .await
            .unwrap();
        ws.send(Message::Text("hello".into())).await.unwrap();
        loop {
            match tokio::time::timeout(PATIENCE, ws.next()).await.unwrap() {
                Some(Ok(Message::Close(Some(f)))) => {
                    assert_eq!(u16::from(f.code), 1008);
                    break;
                }
                Some(Ok(Message::Close(None))) | None | Some(Err(_)) => {
                    panic!("closed without 1008")
                }
                Some(Ok(_)) => {}
            }
        }
    });

    // Per-endpoint metrics.
    let m = metrics(&addr);
    let line = |name: &str| {
        m.lines()
            .find_map(|l| {
                l.strip_prefix(name)
                    .map(|v| v.trim().parse::<f64>().unwrap())
            })
            .unwrap_or_else(|| panic!("no {name}"))
    };
    assert_eq!(
        line("riptide_endpoint_events_out_total{endpoint=\"subscribe\"}"),
        EVENTS as f64
    );
    assert!(
        line("riptide_endpoint_events_out_total{endpoint=\"subscribeEvents\"}") > EVENTS as f64
    );
    assert_eq!(
        line("riptide_endpoint_client_errors_total{endpoint=\"subscribeEvents\"}"),
        1.0
    );
    assert!(line("riptide_v2_rejected_total{error=\"InvalidRequest\"}") >= 13.0);
    drop(server);
    rt.block_on(relay.shutdown());
}

/// `#sync`: stored with a seq of its own, sent on v2 (`kinds=sync` too), never on v1, whose
/// other events keep the same seqs on both wires. On a generated network (the capture has none).
#[test]
fn sync_events_are_served_on_v2_only() {
    const FRAMES: u64 = 1500;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = riptide_gen::Config::new(7, 10, FRAMES);
    cfg.threads = 2;
    riptide_gen::write_dir(&cfg, dir.path()).unwrap();
    let file = std::fs::read(dir.path().join("firehose-frames.bin")).unwrap();
    let mut dec = FrameDecoder::with_options(DecodeOptions {
        decode_blocks: false,
        ..DecodeOptions::unverified()
    });
    let syncs: Vec<(String, String)> = split_frames(&file)
        .unwrap()
        .iter()
        .filter_map(|f| match dec.decode(f.bytes).unwrap().body() {
            riptide_firehose::Body::Sync(s) => Some((s.did.to_owned(), s.rev.to_owned())),
            _ => None,
        })
        .collect();
    assert!(syncs.len() >= 2, "{} #sync frames", syncs.len());
    let data = tempfile::tempdir().unwrap();
    // Stored as they came: with resync (the default) an upstream `#sync` is resynced instead,
    // from hosts this test does not run (replacement rows: `backfill::a_catch_up_…`).
    let (server, addr) = common::spawn_serve(
        common::serve_command(data.path())
            .arg("--did-docs")
            .arg(dir.path().join("did_docs.json"))
            .arg("--no-resync")
            .arg("--ingest-file")
            .arg(dir.path().join("firehose-frames.bin")),
    );
    wait_for(&addr, "riptide_ingest_finished", 1.0);
    assert_eq!(
        metric(&addr, "riptide_verdicts_total{verdict=\"ok\"}"),
        FRAMES as f64
    );
    let stored = metric(&addr, "riptide_events_stored_total") as usize;
    let rt = rt();
    let v1 = rt.block_on(common::events_from_start(&addr, stored - syncs.len()));
    let all = rt.block_on(v2_frames(&addr, "cursor=0", stored, None));
    let all = payloads(&all);
    assert_eq!(
        all.iter()
            .map(|p| p["seq"].as_u64().unwrap())
            .collect::<Vec<_>>(),
        (1..=stored as u64).collect::<Vec<_>>()
    );
    let (sync, other): (Vec<&Value>, Vec<&Value>) = all
        .iter()
        .partition(|p| p["$type"] == format!("{NSID}#sync"));
    assert_eq!(other.into_iter().map(as_v1).collect::<Vec<_>>(), v1);
    let got: Vec<(String, String)> = sync
        .iter()
        .map(|p| {
            let s = &p["sync"];
            assert_eq!(s["did"], p["did"]);
            assert!(s["blocks"]["$bytes"].as_str().unwrap().len() > 100);
            assert!(s["seq"].is_i64() && s["time"].is_string());
            (
                s["did"].as_str().unwrap().into(),
                s["rev"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert_eq!(got, syncs);
    // v1's cursors skip exactly the #sync seqs.
    let sync_seqs: Vec<u64> = sync.iter().map(|p| p["seq"].as_u64().unwrap()).collect();
    let v1_seqs: Vec<u64> = v1.iter().map(|e| e["cursor"].as_u64().unwrap()).collect();
    assert!(v1_seqs.iter().all(|s| !sync_seqs.contains(s)));
    assert_eq!(v1_seqs.len() + sync_seqs.len(), stored);
    // Each #sync the v1 subscriber stepped over is counted, as Jetstream counts it.
    let passed = sync_seqs
        .iter()
        .filter(|&&s| s < v1_seqs[v1_seqs.len() - 1])
        .count() as f64;
    let skipped = metric(&addr, "riptide_v1_events_skipped_total{reason=\"sync\"}");
    assert!(
        passed >= 1.0 && skipped >= passed && skipped <= sync_seqs.len() as f64,
        "{skipped} #sync skips counted, {passed} passed by the v1 subscriber"
    );
    let only = rt.block_on(v2_frames(&addr, "cursor=0&kinds=sync", syncs.len(), None));
    assert_eq!(
        payloads(&only)
            .iter()
            .map(|p| p["seq"].as_u64().unwrap())
            .collect::<Vec<_>>(),
        sync_seqs
    );
    drop(server);

    // `riptide dict train --wire v2` on that store: a dictionary the server then compresses
    // with, and a client decodes every frame with.
    let dict = data.path().join("v2.zdict");
    let out = common::riptide(&[
        "dict",
        "train",
        "--data",
        common::s(data.path()),
        "-o",
        common::s(&dict),
        "--wire",
        "v2",
        "--size",
        "16384",
    ]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let bytes = std::fs::read(&dict).unwrap();
    assert_eq!(&bytes[..4], &[0x37, 0xA4, 0x30, 0xEC]);
    let id = u32::from_le_bytes(bytes[4..8].try_into().unwrap());
    let (server, addr) = common::spawn_serve(
        common::serve_command(data.path())
            .arg("--did-docs")
            .arg(dir.path().join("did_docs.json"))
            .arg("--zstd-dictionary-v2")
            .arg(&dict),
    );
    let plain = rt.block_on(v2_frames(&addr, "cursor=0", stored, None));
    let z = rt.block_on(v2_frames(
        &addr,
        &format!("cursor=0&zstdDictionary={id}"),
        stored,
        Some(&bytes),
    ));
    assert_eq!(z, plain);
    drop(server);
}

/// `riptide_client::JetstreamV2Client` (what `tail` uses) across a kill -9 and restart of the
/// server mid-stream: it reconnects from its cursor, drops the inclusive overlap, and delivers
/// every event exactly once, compressed with the 20260811 dictionary.
#[test]
fn the_v2_client_resumes_exactly_once_across_a_server_restart() {
    let Some(corpus) = riptide_testdata::corpus() else {
        return;
    };
    let cap = corpus.join("jetstream-2026-07");
    let dict_path = corpus.join("jetstream-dictionaries/subscribe_events_20260811.zdict");
    let data = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let start = || {
        let mut cmd = std::process::Command::new(common::BIN);
        cmd.args(["serve", "--listen", &format!("127.0.0.1:{port}")])
            .arg("--data")
            .arg(data.path())
            .arg("--did-docs")
            .arg(cap.join("did_docs.json"))
            .arg("--zstd-dictionary-v2")
            .arg(&dict_path)
            .arg("--ingest-file")
            .arg(cap.join("firehose-frames.bin"))
            .args(["--ingest-rate", "30"])
            .env("RUST_LOG", "warn");
        common::spawn_serve(&mut cmd)
    };
    let (server, addr) = start();
    let rt = rt();
    let (seqs, stored_at_kill, reconnects) = rt.block_on(async {
        let mut client =
            riptide_client::JetstreamV2Client::new(riptide_client::JetstreamV2Config {
                client: riptide_client::ClientConfig {
                    start_cursor: Some(0),
                    ..riptide_client::ClientConfig::with_hosts([format!("ws://{addr}")])
                },
                dictionary: Some(std::fs::read(&dict_path).unwrap()),
                ..Default::default()
            })
            .unwrap();
        let mut seqs = Vec::new();
        let mut server = Some(server);
        let mut stored_at_kill = 0.0;
        while seqs.len() < EVENTS {
            let m = tokio::time::timeout(PATIENCE, client.next())
                .await
                .expect("timed out")
                .unwrap();
            seqs.push(m.payload.seq.unwrap());
            if seqs.len() == 40 {
                stored_at_kill = metric(&addr, "riptide_events_stored_total");
                server.take().unwrap().kill();
                server = Some(start().0);
            }
        }
        (seqs, stored_at_kill, client.stats().snapshot().reconnects)
    });
    assert!(
        stored_at_kill < EVENTS as f64,
        "ingest had finished: {stored_at_kill}"
    );
    assert_eq!(seqs, (1..=EVENTS as u64).collect::<Vec<_>>());
    assert!(reconnects >= 1);
}

/// `--segment-bytes` (issue 38): with a size the server seals its row blocks into the archive's
/// segment files; `0` turns that off (the store keeps deleting what `--retention` leaves
/// behind, as before sealing existed). The capture 30 times over (4,560 events) fills one
/// block of 4,096 rows.
#[test]
fn segment_bytes_seals_the_archive_and_zero_turns_it_off() {
    let Some(dir) = common::capture_dir() else {
        return;
    };
    let raw = std::fs::read(dir.join("firehose-frames.bin")).unwrap();
    let frames = split_frames(&raw).unwrap();
    let tmp = common::scratch();
    let file = tmp.path().join("x30.bin");
    let mut out = ((frames.len() * 30) as u32).to_be_bytes().to_vec();
    for _ in 0..30 {
        for f in &frames {
            out.extend_from_slice(&(f.bytes.len() as u32).to_be_bytes());
            out.extend_from_slice(f.bytes);
        }
    }
    std::fs::write(&file, out).unwrap();
    for (bytes, seals) in [("1", true), ("0", false)] {
        let data = tmp.path().join(format!("data-{bytes}"));
        let (_server, addr) = common::spawn_serve(
            common::serve_command(&data)
                .args(["--no-verify", "--segment-bytes", bytes, "--ingest-file"])
                .arg(&file),
        );
        wait_for(&addr, "riptide_ingest_finished", 1.0);
        if seals {
            wait_for(&addr, "riptide_segments_sealed_total", 1.0);
        } else {
            // The seal loop looks every second: three of its rounds find nothing to do.
            std::thread::sleep(std::time::Duration::from_secs(3));
            assert_eq!(metric(&addr, "riptide_segments_sealed_total"), 0.0);
        }
        let files = std::fs::read_dir(data.join("segments"))
            .map(|d| {
                d.filter(|e| {
                    e.as_ref()
                        .is_ok_and(|e| e.file_name().to_string_lossy().ends_with(".jss"))
                })
                .count()
            })
            .unwrap_or(0);
        assert_eq!(
            files > 0,
            seals,
            "--segment-bytes {bytes}: {files} segment files"
        );
    }
}
