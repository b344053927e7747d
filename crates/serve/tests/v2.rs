//! `subscribeEvents` where the store's state matters, in process on loopback: the retention
//! floor (`CursorTooOld`, `#info OutdatedCursor` after a clamped timestamp, compressed or not),
//! the terminal `ConsumerTooSlow` error frame, and shutdown. The wire against v1 on the real
//! capture is `crates/cli/tests/serve_v2.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use riptide_firehose::corpus::split_frames;
use riptide_identity::DidDocs;
use riptide_serve::{
    ingest, App, Dictionary, Event, IngestConfig, Keys, Log, Metrics, ServerConfig, SlowPolicy,
    Store, TailLimits,
};
use serde_json::Value;
use tokio_tungstenite::tungstenite::Message;

const T: Duration = Duration::from_secs(60);
const V2: &str = "/xrpc/network.bsky.jetstream.subscribeEvents";

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

fn v2_dictionary() -> Dictionary {
    let dir = riptide_testdata::corpus().unwrap();
    Dictionary::load(&dir.join("jetstream-dictionaries/subscribe_events_20260811.zdict")).unwrap()
}

async fn serve(app: Arc<App>) -> SocketAddr {
    common::listen(app).await
}

/// The real capture ingested (verified) and served, with the v2 dictionary.
async fn capture(dir: &std::path::Path) -> Option<(SocketAddr, Arc<App>)> {
    let corpus = riptide_testdata::corpus()?;
    let file = std::fs::read(corpus.join("jetstream-2026-07/firehose-frames.bin")).unwrap();
    let frames: Vec<Bytes> = split_frames(&file)
        .unwrap()
        .iter()
        .map(|f| Bytes::copy_from_slice(f.bytes))
        .collect();
    let keys =
        Keys::from_docs(DidDocs::load(&corpus.join("jetstream-2026-07/did_docs.json")).unwrap());
    let (store, resume) = Store::open(dir, 0).unwrap();
    let log = Arc::new(Log::new(store, resume.next_seq, TailLimits::default()));
    let metrics = Arc::new(Metrics::default());
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let h = ingest::spawn(
        IngestConfig::verifying(keys),
        log.clone(),
        metrics.clone(),
        resume,
        rx,
    )
    .unwrap();
    for (i, f) in frames.into_iter().enumerate() {
        tx.send((i as u64 + 1, f).into()).await.unwrap();
    }
    drop(tx);
    let summary = tokio::task::spawn_blocking(move || h.join())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(summary.events, 152);
    let config = ServerConfig {
        v2_dictionary: Some(v2_dictionary()),
        ..ServerConfig::default()
    };
    let app = App::new(log, metrics, config);
    Some((serve(app.clone()).await, app))
}

async fn http_get(addr: SocketAddr, path: &str) -> (u16, Value) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.unwrap();
    let text = String::from_utf8(raw).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    (
        head[9..12].parse().unwrap(),
        serde_json::from_str(body).unwrap(),
    )
}

async fn connect(addr: SocketAddr, query: &str) -> Ws {
    tokio_tungstenite::connect_async(format!("ws://{addr}{V2}?{query}"))
        .await
        .unwrap()
        .0
}

/// The next `n` frames as JSON (decompressed with the v2 dictionary when `zstd`).
async fn frames(ws: &mut Ws, n: usize, zstd: bool) -> Vec<Value> {
    let dict = v2_dictionary();
    let mut d = zstd::bulk::Decompressor::with_dictionary(dict.bytes()).unwrap();
    let mut out = Vec::new();
    while out.len() < n {
        let m = tokio::time::timeout(T, ws.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        let text = match (m, zstd) {
            (Message::Text(t), false) => t.as_bytes().to_vec(),
            (Message::Binary(b), true) => d.decompress(&b, 1 << 24).unwrap(),
            (Message::Ping(_), _) => continue,
            (m, _) => panic!("unexpected {m:?}"),
        };
        out.push(serde_json::from_slice(&text).unwrap());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_retention_floor_refuses_seqs_and_clamps_timestamps_with_an_info_frame() {
    let dir = tempfile::tempdir().unwrap();
    let Some((addr, app)) = capture(dir.path()).await else {
        return;
    };
    // Expire the first 50 events: the floor is seq 51.
    let mut first = Vec::new();
    let all = riptide_serve::ReadLimit {
        events: 1000,
        bytes: 1 << 30,
    };
    app.log.read(1, all, &mut first).unwrap();
    assert_eq!(first.len(), 152);
    let t51 = first[50].time_us();
    let t1 = first[0].time_us();
    assert!(t1 < first[49].time_us() && first[49].time_us() < t51);
    let x = app
        .log
        .store()
        .expire(t51, Duration::from_secs(3600))
        .unwrap();
    assert_eq!(x.floor, 51);

    // A seq below the floor: 400 CursorTooOld carrying the floor, before any upgrade.
    for c in [0, 1, 50] {
        let (status, e) = http_get(addr, &format!("{V2}?cursor={c}")).await;
        assert_eq!(status, 400, "cursor {c}");
        assert_eq!(e["error"], "CursorTooOld");
        assert!(e["message"].as_str().unwrap().contains("51"), "{e}");
    }
    // With sealed segments reaching the floor, the floor means "plan from the archive first":
    // still 400 CursorTooOld carrying the floor, and the message says where the archive ends.
    let rows: Vec<riptide_segment::Row<'_>> = (1..=60u64)
        .map(|seq| riptide_segment::Row {
            seq,
            witnessed_at: first[seq as usize - 1].time_us(),
            indexed_at: 0,
            kind: riptide_segment::Kind::Identity,
            did: "did:plc:a",
            collection: "",
            rkey: "",
            rev: "",
            payload: b"",
        })
        .collect();
    let blocks: Vec<&[riptide_segment::Row<'_>]> = rows.chunks(20).collect();
    let seg = dir.path().join("seg_0000000000.jss");
    std::fs::write(&seg, riptide_segment::write_segment(&blocks).unwrap()).unwrap();
    app.archive.segments().add(&seg).unwrap();
    for c in [0, 10, 50] {
        let (status, e) = http_get(addr, &format!("{V2}?cursor={c}")).await;
        assert_eq!(
            (status, e["error"].as_str()),
            (400, Some("CursorTooOld")),
            "{e}"
        );
        let m = e["message"].as_str().unwrap();
        assert!(
            m.contains("live floor 51")
                && m.contains("plan from the archive first")
                && m.contains("sealed through seq 60"),
            "{m}"
        );
    }
    // At the floor: served from it, no #info.
    let mut ws = connect(addr, "cursor=51").await;
    let f = frames(&mut ws, 1, false).await;
    assert_eq!(f[0]["payload"]["seq"], 51);

    // A timestamp below the floor: #info OutdatedCursor first (no seq), then the floor onwards;
    // compressed, the info frame is a zstd frame too.
    for zstd in [false, true] {
        let q = if zstd {
            format!("cursor={t1}&zstdDictionary=20260811")
        } else {
            format!("cursor={t1}")
        };
        let mut ws = connect(addr, &q).await;
        let f = frames(&mut ws, 103, zstd).await;
        let info = &f[0]["payload"];
        assert_eq!(f[0]["$type"], "message");
        assert_eq!(info["$type"], "network.bsky.jetstream.subscribeEvents#info");
        assert_eq!(info["name"], "OutdatedCursor");
        assert!(info["message"].as_str().unwrap().contains("seq 51"));
        assert!(info.get("seq").is_none());
        let seqs: Vec<u64> = f[1..]
            .iter()
            .map(|m| m["payload"]["seq"].as_u64().unwrap())
            .collect();
        assert_eq!(seqs, (51..=152).collect::<Vec<_>>());
    }
    // A timestamp inside the window: no #info.
    let mut ws = connect(addr, &format!("cursor={}", first[60].time_us())).await;
    let f = frames(&mut ws, 1, false).await;
    assert_eq!(f[0]["payload"]["seq"], 61);
    assert!(
        app.v2
            .metrics
            .info_frames
            .load(std::sync::atomic::Ordering::Relaxed)
            == 2
    );
}

/// A v1-shaped commit of ~16 KiB.
fn big_commit(i: u64) -> Event {
    common::v1_commit(i, &"x".repeat(16 << 10))
}

/// Events in [`big_log`]: far more than a stalled subscriber's buffers hold.
const STALL_EVENTS: u64 = 2000;

/// A fresh store at `dir` holding [`STALL_EVENTS`] big commits (seqs 1 to 2,000).
fn big_log(dir: &std::path::Path) -> Arc<Log> {
    let log = common::open_log(dir);
    log.publish(&(1..=STALL_EVENTS).map(big_commit).collect::<Vec<_>>());
    log
}

/// The slow-consumer rule scaled down (as in serve.rs's v1 test): more than 100 events behind
/// and reading under 5 events/s over a second.
fn scaled_down_slow() -> SlowPolicy {
    SlowPolicy {
        max_behind: 100,
        min_rate: 5.0,
        window: Duration::from_secs(1),
    }
}

/// Waits (at most [`T`]) until `app` has dropped a v2 subscriber for being behind.
async fn wait_dropped_behind(app: &App) {
    let until = tokio::time::Instant::now() + T;
    while app
        .v2
        .metrics
        .slow_drop_count(riptide_serve::metrics::SlowDrop::Behind)
        < 1
    {
        assert!(tokio::time::Instant::now() < until, "not dropped");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_v2_subscriber_gets_consumer_too_slow() {
    // The slow-consumer rule scaled down (as in serve.rs's v1 test); the write timeout is long,
    // so only the rule drops, and a client that reads again soon gets the terminal frame.
    let dir = tempfile::tempdir().unwrap();
    let config = ServerConfig {
        write_timeout: Duration::from_secs(30),
        slow: scaled_down_slow(),
        ..ServerConfig::default()
    };
    let app = App::new(big_log(dir.path()), Arc::new(Metrics::default()), config);
    let addr = serve(app.clone()).await;
    let mut stalled = connect(addr, "cursor=1").await;
    wait_dropped_behind(&app).await;
    // What was buffered arrives in order, then the error frame, then the close.
    let mut seqs = Vec::new();
    let error = loop {
        let m = tokio::time::timeout(T, stalled.next()).await.unwrap();
        let Some(Ok(Message::Text(t))) = m else {
            panic!("{m:?}")
        };
        let v: Value = serde_json::from_str(t.as_str()).unwrap();
        if v["$type"] == "error" {
            break v;
        }
        seqs.push(v["payload"]["seq"].as_u64().unwrap());
    };
    assert_eq!(error["error"], "ConsumerTooSlow");
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>());
    assert!(seqs.len() < STALL_EVENTS as usize - 100);
    match tokio::time::timeout(T, stalled.next()).await.unwrap() {
        Some(Ok(Message::Close(Some(f)))) => assert_eq!(u16::from(f.code), 1008),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        app.metrics
            .slow_drop_count(riptide_serve::metrics::SlowDrop::Behind),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_v2_subscriber_dropped_behind_gives_its_connection_back_at_once() {
    // Issue 40: a subscriber dropped by the slow rule that never reads again kept its connection
    // (and its place in the connection budget) for the write timeout, 120 s, while the server
    // waited to write it the terminal frame. Now it is given `TERMINAL_GRACE`.
    let dir = tempfile::tempdir().unwrap();
    let config = ServerConfig {
        slow: scaled_down_slow(),
        ..ServerConfig::default()
    };
    assert_eq!(config.write_timeout, Duration::from_secs(120));
    let app = App::new(big_log(dir.path()), Arc::new(Metrics::default()), config);
    let addr = common::listen_limited(app.clone(), riptide_serve::ConnLimits::default()).await;
    let _stalled = connect(addr, "cursor=1").await;
    wait_dropped_behind(&app).await;
    let dropped = tokio::time::Instant::now();
    let gone = |app: &App| {
        app.metrics.connections.load(Relaxed) == 0 && app.metrics.subscribers.load(Relaxed) == 0
    };
    while !gone(&app) {
        assert!(
            dropped.elapsed() < riptide_serve::v2::TERMINAL_GRACE + Duration::from_secs(3),
            "the dropped subscriber still holds its connection"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_closes_v2_subscribers_with_1001() {
    let (addr, app, _dir) = common::serve_events(&[], ServerConfig::default()).await;
    let mut ws = connect(addr, "").await;
    // Without a dictionary, compression is refused, clearly.
    let (status, e) = http_get(addr, &format!("{V2}?zstdDictionary=20260811")).await;
    assert_eq!(
        (status, e["error"].as_str()),
        (400, Some("UnknownZstdDictionary"))
    );
    assert!(e["message"]
        .as_str()
        .unwrap()
        .contains("--zstd-dictionary-v2"));
    let (status, e) = http_get(addr, "/xrpc/network.bsky.jetstream.getZstdDictionary").await;
    assert_eq!(
        (status, e["error"].as_str()),
        (404, Some("DictionaryNotFound"))
    );
    let until = tokio::time::Instant::now() + T;
    while app
        .v2
        .metrics
        .subscribers
        .load(std::sync::atomic::Ordering::Relaxed)
        < 1
    {
        assert!(tokio::time::Instant::now() < until);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    app.shutdown();
    match tokio::time::timeout(T, ws.next()).await.unwrap() {
        Some(Ok(Message::Close(Some(f)))) => assert_eq!(u16::from(f.code), 1001),
        other => panic!("{other:?}"),
    }
}

/// A WebSocket handshake by hand (a client library cannot send a target over 65,534 bytes: the
/// `http` crate's `Uri` limit): the status, and the stream when it is 101.
async fn raw_handshake(
    addr: SocketAddr,
    target: &str,
) -> (
    u16,
    Option<tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "GET {target} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    );
    // The server may answer (and close) before it has read everything.
    let _ = s.write_all(head.as_bytes()).await;
    let mut buf = Vec::new();
    let mut b = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        match tokio::time::timeout(T, s.read(&mut b)).await.unwrap() {
            Ok(1) => buf.push(b[0]),
            _ => break,
        }
    }
    let status = String::from_utf8_lossy(&buf)
        .get(9..12)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    if status != 101 {
        return (status, None);
    }
    let ws = tokio_tungstenite::WebSocketStream::from_raw_socket(
        s,
        tokio_tungstenite::tungstenite::protocol::Role::Client,
        None,
    )
    .await;
    (status, Some(ws))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_dids_fit_in_the_query_string() {
    // Issue 40: hyper answered 414 from about 1,700 DIDs (a URI holds at most 65,534 bytes);
    // the lexicon allows 10,000 (protocol §1.2, on both wires).
    let did = |i: usize| format!("did:plc:{i:0>24}");
    let dir = tempfile::tempdir().unwrap();
    let log = common::open_log(dir.path());
    let evs: Vec<Event> = [did(0), "did:plc:other".into(), did(9_999), did(10_000)]
        .iter()
        .zip(1u64..)
        .map(|(d, i)| {
            let json = format!(
                r#"{{"did":"{d}","time_us":{i},"cursor":{i},"kind":"commit","commit":{{"rev":"3l3qo2vutsw2b","operation":"create","collection":"a.b.c","rkey":"k{i}","record":{{"pad":"x"}},"cid":"bafyreib"}}}}"#
            );
            Event::encode(
                i,
                i as i64,
                riptide_jetstream::EventKind::Commit,
                d,
                "a.b.c",
                json.as_bytes(),
                b"",
            )
        })
        .collect();
    log.publish(&evs);
    let app = App::new(log, Arc::new(Metrics::default()), ServerConfig::default());
    let addr = common::listen_limited(app.clone(), riptide_serve::ConnLimits::default()).await;
    let query = |name: &str, n: usize| {
        let mut q = String::from("cursor=1");
        for i in 0..n {
            q.push_str(&format!("&{name}={}", did(i)));
        }
        q
    };
    for (path, name) in [(V2, "dids"), ("/subscribe", "wantedDids")] {
        let q = query(name, 10_000);
        assert!(q.len() > 350_000, "{}", q.len());
        let (status, ws) = raw_handshake(addr, &format!("{path}?{q}")).await;
        assert_eq!(status, 101, "{path}");
        let mut ws = ws.unwrap();
        // Only the events of listed DIDs: seqs 1 and 3.
        let mut seqs = Vec::new();
        while seqs.len() < 2 {
            let m = tokio::time::timeout(T, ws.next()).await.unwrap().unwrap();
            let Message::Text(t) = m.unwrap() else {
                continue;
            };
            let v: Value = serde_json::from_str(t.as_str()).unwrap();
            seqs.push(if path == V2 {
                v["payload"]["seq"].as_u64().unwrap()
            } else {
                v["time_us"].as_u64().unwrap()
            });
        }
        assert_eq!(seqs, [1, 3], "{path}");
        let quiet = tokio::time::timeout(Duration::from_millis(300), ws.next()).await;
        assert!(
            matches!(quiet, Err(_) | Ok(Some(Ok(Message::Ping(_))))),
            "{path}: {quiet:?}"
        );
        // One DID more than the limit is the server's own refusal, not the transport's.
        let (status, _) = raw_handshake(addr, &format!("{path}?{}", query(name, 10_001))).await;
        assert_eq!(status, 400, "{path}");
    }
    // Still bounded: a line over `MAX_REQUEST_LINE` is refused (by hyper), and the server goes on.
    let q = query("dids", 30_000);
    assert!(q.len() > riptide_serve::limits::MAX_REQUEST_LINE);
    let (status, _) = raw_handshake(addr, &format!("{V2}?{q}")).await;
    assert!(
        (400..500).contains(&status) || status == 0,
        "status {status}"
    );
    let (status, _) = raw_handshake(addr, &format!("{V2}?{}", query("dids", 3))).await;
    assert_eq!(status, 101);
}
