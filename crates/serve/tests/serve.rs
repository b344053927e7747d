//! `/subscribe` end to end on loopback: the real capture ingested (verified), served by the
//! in-process server on an ephemeral port, read by a tokio-tungstenite client.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use riptide_firehose::corpus::split_frames;
use riptide_firehose::{DecodeOptions, FrameDecoder};
use riptide_identity::DidDocs;
use riptide_jetstream::Projector;
use riptide_serve::{
    ingest, router, App, Dictionary, IngestConfig, Keys, Log, Metrics, ReadLimit, ServerConfig,
    SlowPolicy, Store, TailLimits,
};
use serde_json::Value;
use tokio_tungstenite::tungstenite::Message;

const T: Duration = Duration::from_secs(60);

struct Server {
    addr: SocketAddr,
    app: Arc<App>,
    _dir: Option<tempfile::TempDir>,
}

fn corpus_frames() -> Option<Vec<Vec<u8>>> {
    let file = riptide_testdata::read("jetstream-2026-07/firehose-frames.bin")?;
    Some(
        split_frames(&file)
            .unwrap()
            .iter()
            .map(|f| f.bytes.to_vec())
            .collect(),
    )
}

fn keys() -> Keys {
    let dir = riptide_testdata::corpus().unwrap();
    Keys::from_docs(DidDocs::load(&dir.join("jetstream-2026-07/did_docs.json")).unwrap())
}

fn dictionary() -> Dictionary {
    let dir = riptide_testdata::corpus().unwrap();
    Dictionary::load(&dir.join("jetstream-dictionaries/legacy_subscribe.zdict")).unwrap()
}

/// Ingests `frames` (upstream seqs 1..) into the store at `dir`, then serves it.
async fn start(dir: &Path, frames: Vec<Vec<u8>>, tail: TailLimits) -> (SocketAddr, Arc<App>) {
    start_with(dir, frames, tail, keys()).await
}

async fn start_with(
    dir: &Path,
    frames: Vec<Vec<u8>>,
    tail: TailLimits,
    keys: Keys,
) -> (SocketAddr, Arc<App>) {
    let config = ServerConfig {
        v1_dictionary: Some(dictionary()),
        ..ServerConfig::default()
    };
    start_config(dir, frames, tail, keys, config).await
}

async fn start_config(
    dir: &Path,
    frames: Vec<Vec<u8>>,
    tail: TailLimits,
    keys: Keys,
    config: ServerConfig,
) -> (SocketAddr, Arc<App>) {
    let dict = dictionary();
    let (store, resume) = Store::open(dir, dict.id()).unwrap();
    let log = Arc::new(Log::new(store, resume.next_seq, tail));
    let metrics = Arc::new(Metrics::default());
    let mut cfg = IngestConfig::verifying(keys);
    cfg.dictionary = Some(dict);
    ingest_all(cfg, &log, &metrics, resume, &frames, 1).await;
    let app = App::new(log, metrics, config);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let r = router(app.clone());
    let stop = app.clone();
    tokio::spawn(async move {
        axum::serve(listener, r)
            .with_graceful_shutdown(async move { stop.shut_down().await })
            .await
    });
    (addr, app)
}

/// Runs ingest with `cfg` over `frames` (upstream seqs `first`, `first + 1`, …) into `log` until
/// it has stored them all; what it reports.
async fn ingest_all(
    cfg: IngestConfig,
    log: &Arc<Log>,
    metrics: &Arc<Metrics>,
    resume: riptide_serve::Resume,
    frames: &[Vec<u8>],
    first: u64,
) -> riptide_serve::IngestSummary {
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let h = ingest::spawn(cfg, log.clone(), metrics.clone(), resume, rx).unwrap();
    for (i, f) in frames.iter().enumerate() {
        tx.send((first + i as u64, Bytes::copy_from_slice(f)).into())
            .await
            .unwrap();
    }
    drop(tx);
    tokio::task::spawn_blocking(move || h.join())
        .await
        .unwrap()
        .unwrap()
}

async fn capture() -> Option<Server> {
    let frames = corpus_frames()?;
    let dir = tempfile::tempdir().unwrap();
    let (addr, app) = start(dir.path(), frames, TailLimits::default()).await;
    Some(Server {
        addr,
        app,
        _dir: Some(dir),
    })
}

/// What our projection gives for the capture: one JSON value per event, without time_us/cursor.
fn expected() -> Vec<Value> {
    let mut dec = FrameDecoder::with_options(DecodeOptions {
        decode_blocks: false,
        ..DecodeOptions::default()
    });
    let mut proj = Projector::new();
    let mut out = Vec::new();
    for f in corpus_frames().unwrap() {
        let frame = dec.decode(&f).unwrap();
        let p = proj.project(&frame);
        for i in 0..p.len() {
            let mut buf = Vec::new();
            p.render(i, 0, None, &mut buf);
            let mut v: Value = serde_json::from_slice(&buf).unwrap();
            v.as_object_mut().unwrap().remove("time_us");
            out.push(v);
        }
    }
    out
}

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn connect(addr: SocketAddr, query: &str) -> Ws {
    let (ws, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/subscribe?{query}"))
        .await
        .unwrap();
    ws
}

/// Reads `n` events (decompressing binary frames), stripping time_us and cursor; also returns the
/// cursors.
async fn read_n(ws: &mut Ws, n: usize, dict: Option<&[u8]>) -> (Vec<Value>, Vec<u64>) {
    let mut out = Vec::new();
    let mut cursors = Vec::new();
    while out.len() < n {
        let msg = tokio::time::timeout(T, ws.next())
            .await
            .expect("timed out")
            .unwrap()
            .unwrap();
        let text = match msg {
            Message::Text(t) => t.as_bytes().to_vec(),
            Message::Binary(b) => {
                let mut d = zstd::bulk::Decompressor::with_dictionary(
                    dict.expect("binary without compress"),
                )
                .unwrap();
                d.decompress(&b, 1 << 22).unwrap()
            }
            _ => continue,
        };
        let mut v: Value = serde_json::from_slice(&text).unwrap();
        let o = v.as_object_mut().unwrap();
        assert!(o.remove("time_us").unwrap().as_i64().unwrap() > 1_000_000_000_000_000);
        cursors.push(o.remove("cursor").unwrap().as_u64().unwrap());
        out.push(v);
    }
    (out, cursors)
}

/// Asserts nothing more arrives within a short while (after the expected events).
async fn assert_quiet(ws: &mut Ws) {
    match tokio::time::timeout(Duration::from_millis(300), ws.next()).await {
        Err(_) => {}
        Ok(Some(Ok(Message::Ping(_)))) => {}
        Ok(other) => panic!("unexpected message: {other:?}"),
    }
}

async fn close_code(ws: &mut Ws) -> u16 {
    loop {
        match tokio::time::timeout(T, ws.next()).await.expect("timed out") {
            Some(Ok(Message::Close(Some(f)))) => return f.code.into(),
            Some(Ok(_)) => continue,
            other => panic!("no close frame: {other:?}"),
        }
    }
}

async fn metric(addr: SocketAddr, name: &str) -> f64 {
    let body = http_get(addr, "/metrics").await.1;
    body.lines()
        .find_map(|l| {
            l.strip_prefix(name)
                .and_then(|r| r.strip_prefix(' '))
                .map(|v| v.parse::<f64>().unwrap())
        })
        .unwrap_or_else(|| panic!("no metric {name}"))
}

async fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.unwrap();
    let text = String::from_utf8_lossy(&buf).to_string();
    let code = text[9..12].parse().unwrap();
    let body = text
        .split_once("\r\n\r\n")
        .map(|x| x.1.to_string())
        .unwrap_or_default();
    (code, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_from_zero_plain_and_compressed() {
    let Some(s) = capture().await else { return };
    let want = expected();
    assert_eq!(want.len(), 152);
    let mut ws = connect(s.addr, "cursor=0").await;
    let (got, cursors) = read_n(&mut ws, 152, None).await;
    assert_eq!(got, want);
    assert_eq!(cursors, (1..=152).collect::<Vec<u64>>());
    assert_quiet(&mut ws).await;

    let dict = dictionary();
    let mut ws = connect(s.addr, "cursor=0&compress=true").await;
    let (got, _) = read_n(&mut ws, 152, Some(dict.bytes())).await;
    assert_eq!(got, want);

    // Metrics: every frame verified ok.
    assert_eq!(
        metric(s.addr, "riptide_verdicts_total{verdict=\"ok\"}").await,
        150.0
    );
    assert_eq!(metric(s.addr, "riptide_events_stored_total").await, 152.0);
    // Histograms: one verification and one receive-to-publish latency per frame, at least one
    // durable batch; every frame was published within the +Inf bucket, and the sum is a time.
    for (name, count) in [
        ("riptide_ingest_verify_seconds", Some(150.0)),
        ("riptide_ingest_publish_seconds", Some(150.0)),
        ("riptide_store_append_seconds", None),
    ] {
        let n = metric(s.addr, &format!("{name}_count")).await;
        match count {
            Some(c) => assert_eq!(n, c, "{name}"),
            None => assert!(n >= 1.0, "{name}"),
        }
        let inf = metric(s.addr, &format!("{name}_bucket{{le=\"+Inf\"}}")).await;
        assert_eq!(inf, n, "{name}");
        let sum = metric(s.addr, &format!("{name}_sum")).await;
        assert!(sum > 0.0 && sum < 60.0 * n, "{name}: sum {sum}");
    }
    assert_eq!(http_get(s.addr, "/healthz").await.0, 200);
    assert_eq!(http_get(s.addr, "/readyz").await.0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filters_cursor_and_hello() {
    let Some(s) = capture().await else { return };
    let want = expected();
    let by = |f: &dyn Fn(&Value) -> bool| want.iter().filter(|v| f(v)).cloned().collect::<Vec<_>>();
    let coll = |v: &Value| v["commit"]["collection"].as_str().map(str::to_string);

    // Exact collection: commits of it, plus identity/account (they ignore wantedCollections).
    let w = by(&|v| coll(v).is_none_or(|c| c == "app.bsky.feed.like"));
    assert!(w.len() > 2);
    let mut ws = connect(s.addr, "cursor=0&wantedCollections=app.bsky.feed.like").await;
    assert_eq!(read_n(&mut ws, w.len(), None).await.0, w);
    assert_quiet(&mut ws).await;

    // Prefix.
    let w = by(&|v| coll(v).is_none_or(|c| c.starts_with("app.bsky.graph.")));
    let mut ws = connect(s.addr, "cursor=0&wantedCollections=app.bsky.graph.*").await;
    assert_eq!(read_n(&mut ws, w.len(), None).await.0, w);
    assert_quiet(&mut ws).await;

    // wantedDids: the DID of the identity event.
    let did = want.iter().find(|v| v["kind"] == "identity").unwrap()["did"]
        .as_str()
        .unwrap()
        .to_string();
    let w = by(&|v| v["did"] == did.as_str());
    let mut ws = connect(s.addr, &format!("cursor=0&wantedDids={did}")).await;
    assert_eq!(read_n(&mut ws, w.len(), None).await.0, w);
    assert_quiet(&mut ws).await;

    // A cursor from the middle replays exactly the rest (inclusive).
    let mut ws = connect(s.addr, "cursor=100").await;
    let (got, cursors) = read_n(&mut ws, 53, None).await;
    assert_eq!(got, want[99..]);
    assert_eq!(cursors[0], 100);
    assert_quiet(&mut ws).await;

    // A future seq cursor is live: nothing arrives.
    let mut ws = connect(s.addr, "cursor=999999").await;
    assert_quiet(&mut ws).await;

    // A timestamp cursor before everything replays everything.
    let mut ws = connect(s.addr, "cursor=1000000000000000").await;
    assert_eq!(read_n(&mut ws, 152, None).await.0, want);

    // requireHello: nothing until the update; then its filter applies.
    let mut ws = connect(s.addr, "cursor=0&requireHello=true").await;
    assert_quiet(&mut ws).await;
    let upd = format!(r#"{{"type":"options_update","payload":{{"wantedDids":["{did}"]}}}}"#);
    ws.send(Message::Text(upd.into())).await.unwrap();
    let w = by(&|v| v["did"] == did.as_str());
    assert_eq!(read_n(&mut ws, w.len(), None).await.0, w);
    assert_quiet(&mut ws).await;

    // options_update mid-stream replaces the filter: switching from one DID to a collection
    // takes effect for later events (here: none are left, then a fresh replay shows the rule).
    let upd = r#"{"type":"options_update","payload":{"wantedCollections":["app.bsky.feed.like"]}}"#;
    ws.send(Message::Text(upd.into())).await.unwrap();
    ws.send(Message::Text(r#"{"type":"heartbeat"}"#.into()))
        .await
        .unwrap();
    assert_quiet(&mut ws).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn options_update_mid_stream_live() {
    // A live subscriber changes its filter between two ingests: the first batch arrives whole,
    // the second only as the new filter allows.
    let Some(frames) = corpus_frames() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (addr, app) = start(dir.path(), frames[..75].to_vec(), TailLimits::default()).await;
    let mut ws = connect(addr, "cursor=0").await;
    let want = expected();
    let n1 = app.log.next_seq() as usize - 1;
    assert_eq!(read_n(&mut ws, n1, None).await.0, want[..n1]);
    let upd = r#"{"type":"options_update","payload":{"wantedCollections":["app.bsky.feed.like"]}}"#;
    ws.send(Message::Text(upd.into())).await.unwrap();
    // Give the reader a moment to apply it (the update is asynchronous by nature).
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Second half through the same store and log.
    let mut cfg = IngestConfig::verifying(keys());
    cfg.dictionary = Some(dictionary());
    let r = riptide_serve::Resume {
        next_seq: app.log.next_seq(),
        last_time_us: riptide_serve::now_us(),
        upstream_cursor: Some(75),
    };
    ingest_all(cfg, &app.log, &app.metrics, r, &frames[75..], 76).await;
    let w: Vec<Value> = want[n1..]
        .iter()
        .filter(|v| {
            v["commit"]["collection"]
                .as_str()
                .is_none_or(|c| c == "app.bsky.feed.like")
        })
        .cloned()
        .collect();
    assert!(!w.is_empty() && w.len() < want.len() - n1);
    assert_eq!(read_n(&mut ws, w.len(), None).await.0, w);
    assert_quiet(&mut ws).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_queries_and_client_messages() {
    let Some(s) = capture().await else { return };
    for q in [
        "cursor=abc",
        "cursor=-5",
        "wantedCollections=app.bsky.fo*",
        "wantedCollections=notansid",
        "wantedDids=alice",
    ] {
        let r = tokio_tungstenite::connect_async(format!("ws://{}/subscribe?{q}", s.addr)).await;
        match r {
            Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
                assert_eq!(resp.status(), 400, "{q}");
                let body =
                    String::from_utf8_lossy(resp.body().as_deref().unwrap_or_default()).to_string();
                assert!(body.contains("invalid"), "{q}: {body}");
            }
            other => panic!("{q}: expected 400, got {other:?}"),
        }
    }
    for (query, message, code) in [
        // Not JSON → 1007.
        ("", "{not json", 1007),
        // Wrong payload types → 1007.
        (
            "",
            r#"{"type":"options_update","payload":{"wantedDids":5}}"#,
            1007,
        ),
        // Invalid options → 1008.
        (
            "",
            r#"{"type":"options_update","payload":{"wantedCollections":["nope"]}}"#,
            1008,
        ),
        // Same while waiting for hello.
        (
            "requireHello=true",
            r#"{"type":"options_update","payload":{"wantedDids":["x"]}}"#,
            1008,
        ),
    ] {
        let mut ws = connect(s.addr, query).await;
        ws.send(Message::Text(message.into())).await.unwrap();
        assert_eq!(close_code(&mut ws).await, code, "{query} {message}");
    }
    // Binary frames and unknown types are ignored.
    let mut ws = connect(s.addr, "cursor=150").await;
    ws.send(Message::Binary(Bytes::from_static(b"\x00\x01")))
        .await
        .unwrap();
    ws.send(Message::Text(r#"{"type":"whatever"}"#.into()))
        .await
        .unwrap();
    assert_eq!(read_n(&mut ws, 3, None).await.1, [150, 151, 152]);
    // Too big → 1009. The server refuses as soon as it has read the frame header and closes,
    // while this client may still be writing the other 10 MB: the server's kernel then answers
    // those unread bytes with a reset, which can discard the close frame before the client reads
    // it (TCP, not the server). So: a 1009 if the close frame survives, else a reset — and either
    // way the server must have counted the refusal.
    let errors_before = metric(s.addr, "riptide_client_errors_total").await;
    let mut ws = connect(s.addr, "").await;
    let _ = ws.send(Message::Text("x".repeat(10_000_001).into())).await;
    match tokio::time::timeout(T, ws.next()).await.expect("timed out") {
        Some(Ok(Message::Close(Some(f)))) => assert_eq!(u16::from(f.code), 1009),
        Some(Err(e)) => assert!(e.to_string().contains("reset"), "unexpected error: {e}"),
        other => panic!("neither a close frame nor a reset: {other:?}"),
    }
    let deadline = std::time::Instant::now() + T;
    while metric(s.addr, "riptide_client_errors_total").await <= errors_before {
        assert!(
            std::time::Instant::now() < deadline,
            "oversized message not counted"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    // Graceful shutdown: 1001.
    let mut ws = connect(s.addr, "cursor=0").await;
    read_n(&mut ws, 152, None).await;
    s.app.shutdown();
    assert_eq!(close_code(&mut ws).await, 1001);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compress_without_dictionary_is_refused() {
    let (addr, _app, _dir) = common::serve_events(&[], ServerConfig::default()).await;
    match tokio_tungstenite::connect_async(format!("ws://{addr}/subscribe?compress=true")).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
            assert_eq!(resp.status(), 400);
            let body =
                String::from_utf8_lossy(resp.body().as_deref().unwrap_or_default()).to_string();
            assert!(body.contains("--zstd-dictionary"), "{body}");
        }
        other => panic!("expected 400, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tampered_commits_are_not_served_and_counted() {
    let Some(mut frames) = corpus_frames() else {
        return;
    };
    let want = expected();
    // Frame 0 is a commit: flip a byte in the last bytes of its CAR... instead tamper precisely:
    // find the 64-byte signature's last byte (the `sig` key) and flip it.
    let mut dec = FrameDecoder::new();
    let ops0 = match dec.decode(&frames[0]).unwrap().body() {
        riptide_firehose::Body::Commit(c) => c.op_count(),
        _ => panic!("frame 0 is not a commit"),
    };
    let sig_at = frames[0]
        .windows(5)
        .position(|w| w == b"csig\x58")
        .expect("sig key")
        + 6;
    frames[0][sig_at] ^= 1;
    // The tampered block no longer hashes to its CID: re-hash is not what we want to test, so
    // keep it as a bad-block-cid case; and a wrong key for another commit gives bad-signature.
    let dir = tempfile::tempdir().unwrap();
    let (addr, _app) = start(dir.path(), frames, TailLimits::default()).await;
    let mut ws = connect(addr, "cursor=0").await;
    let (got, _) = read_n(&mut ws, 152 - ops0, None).await;
    assert_eq!(got, want[ops0..]);
    assert_quiet(&mut ws).await;
    assert_eq!(
        metric(addr, "riptide_verdicts_total{verdict=\"ok\"}").await,
        149.0
    );
    assert_eq!(
        metric(addr, "riptide_verdicts_total{verdict=\"bad-block-cid\"}").await,
        1.0
    );
}

/// Gives one account another account's key: its commits are validly formed but not signed by
/// the key we hold, as if the relay forged them.
struct SwappedKey {
    inner: Keys,
    victim: String,
    other: String,
}

impl riptide_firehose::verify::KeyLookup for SwappedKey {
    fn key(
        &self,
        did: &str,
    ) -> Result<riptide_crypto::PublicKey, riptide_firehose::verify::KeyUnavailable> {
        self.inner
            .key(if did == self.victim { &self.other } else { did })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_signatures_are_not_served_and_counted() {
    let Some(frames) = corpus_frames() else {
        return;
    };
    let want = expected();
    let commits = |v: &Value| v["kind"] == "commit";
    let victim = want[0]["did"].as_str().unwrap().to_string();
    let other = want
        .iter()
        .find(|v| commits(v) && v["did"] != victim.as_str())
        .unwrap()["did"]
        .as_str()
        .unwrap()
        .to_string();
    let keys = Keys(Arc::new(SwappedKey {
        inner: keys(),
        victim: victim.clone(),
        other,
    }));
    let dir = tempfile::tempdir().unwrap();
    let (addr, _app) = start_with(dir.path(), frames.clone(), TailLimits::default(), keys).await;
    // Every event of the victim's commits is missing; identity/account events are not commits.
    let w: Vec<Value> = want
        .iter()
        .filter(|v| !(commits(v) && v["did"] == victim.as_str()))
        .cloned()
        .collect();
    let mut dec = FrameDecoder::new();
    let victim_frames = frames
        .iter()
        .filter(|f| matches!(dec.decode(f).unwrap().body(), riptide_firehose::Body::Commit(c) if c.repo == victim))
        .count();
    assert!(victim_frames > 0 && w.len() < want.len());
    let mut ws = connect(addr, "cursor=0").await;
    assert_eq!(read_n(&mut ws, w.len(), None).await.0, w);
    assert_quiet(&mut ws).await;
    assert_eq!(
        metric(addr, "riptide_verdicts_total{verdict=\"bad-signature\"}").await,
        victim_frames as f64
    );
    assert_eq!(
        metric(addr, "riptide_verdicts_total{verdict=\"ok\"}").await,
        150.0 - victim_frames as f64
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_continues_seqs_without_loss_or_duplicates() {
    let Some(frames) = corpus_frames() else {
        return;
    };
    let want = expected();
    let dir = tempfile::tempdir().unwrap();
    {
        let (addr, app) = start(dir.path(), frames[..100].to_vec(), TailLimits::default()).await;
        let _ = addr;
        app.shutdown();
    }
    // Once the first server's tasks have let go of the store (one store per directory).
    let (store, resume) = common::reopen(
        dir.path(),
        dictionary().id(),
        riptide_serve::StoreOptions::default(),
    )
    .await;
    assert_eq!(resume.upstream_cursor, Some(100));
    drop(store);
    // Resend everything: the first 100 frames are duplicates of what is stored.
    let (addr, app) = start(
        dir.path(),
        frames,
        TailLimits {
            max_events: 10,
            max_bytes: 1 << 20,
        },
    )
    .await;
    assert_eq!(
        metric(addr, "riptide_upstream_frames_duplicate_total").await,
        100.0
    );
    assert_eq!(app.log.next_seq(), 153);
    let mut ws = connect(addr, "cursor=0").await;
    let (got, cursors) = read_n(&mut ws, 152, None).await;
    assert_eq!(got, want);
    assert_eq!(cursors, (1..=152).collect::<Vec<u64>>());
    assert_quiet(&mut ws).await;
    assert!(metric(addr, "riptide_replay_reads_total").await >= 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "1,000 connections: slow in debug builds; run with --ignored"]
async fn thousand_subscribers_receive_everything() {
    let Some(frames) = corpus_frames() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (addr, app) = start(dir.path(), Vec::new(), TailLimits::default()).await;
    let mut clients = Vec::new();
    for _ in 0..1000 {
        clients.push(connect(addr, "").await);
    }
    while app
        .metrics
        .subscribers
        .load(std::sync::atomic::Ordering::Relaxed)
        < 1000
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let want = expected();
    let tasks: Vec<_> = clients
        .into_iter()
        .map(|mut ws| tokio::spawn(async move { read_n(&mut ws, 152, None).await.0 }))
        .collect();
    let mut cfg = IngestConfig::verifying(keys());
    cfg.dictionary = Some(dictionary());
    let resume = riptide_serve::Resume {
        next_seq: 1,
        last_time_us: 0,
        upstream_cursor: None,
    };
    ingest_all(cfg, &app.log, &app.metrics, resume, &frames, 1).await;
    for t in tasks {
        assert_eq!(t.await.unwrap(), want);
    }
}

/// Serves a log holding `n` synthetic events of about 16 KiB each (seqs 1..=n), published straight
/// into the in-memory tail.
async fn big_events(n: u64, config: ServerConfig) -> (SocketAddr, Arc<App>, tempfile::TempDir) {
    let pad = "x".repeat(16 << 10);
    common::serve_events(
        &(1..=n).map(|i| common::padded(i, &pad)).collect::<Vec<_>>(),
        config,
    )
    .await
}

/// The `i` of every event until the stream ends, and whether it ended with a close frame.
async fn read_to_end(ws: &mut Ws) -> (Vec<u64>, bool) {
    let mut seen = Vec::new();
    loop {
        match tokio::time::timeout(T, ws.next()).await.expect("timed out") {
            Some(Ok(Message::Text(t))) => {
                let v: Value = serde_json::from_str(t.as_str()).unwrap();
                seen.push(v["i"].as_u64().unwrap());
            }
            Some(Ok(Message::Close(_))) => return (seen, true),
            Some(Ok(_)) => {}
            Some(Err(_)) | None => return (seen, false),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_subscriber_far_behind_is_dropped_and_a_moving_one_is_not() {
    // The v2 rule scaled down: more than 100 events behind, under 5 events/s, for 1 s. The write
    // timeout is far longer, so only the rule can drop anyone.
    let n = 2000;
    let config = ServerConfig {
        write_timeout: Duration::from_secs(600),
        slow: SlowPolicy {
            max_behind: 100,
            min_rate: 5.0,
            window: Duration::from_secs(1),
        },
        ..ServerConfig::default()
    };
    let (addr, app, _dir) = big_events(n, config).await;
    let behind = "riptide_slow_consumer_drops_total{reason=\"behind\"}";
    // A subscriber that reads everything is never dropped, however far behind it starts.
    let mut fast = connect(addr, "cursor=1").await;
    for i in 1..=n {
        let msg = tokio::time::timeout(T, fast.next()).await.unwrap();
        let Some(Ok(Message::Text(t))) = msg else {
            panic!("event {i}: {msg:?}")
        };
        let v: Value = serde_json::from_str(t.as_str()).unwrap();
        assert_eq!(v["i"].as_u64(), Some(i));
    }
    assert_eq!(metric(addr, behind).await, 0.0);
    // One that reads nothing: the socket's buffers fill (some MB), the server's write blocks with
    // ~2,000 × 16 KiB still to send, and the rule drops it.
    let mut stalled = connect(addr, "cursor=1").await;
    let until = tokio::time::Instant::now() + T;
    while metric(addr, behind).await < 1.0 {
        assert!(tokio::time::Instant::now() < until, "not dropped");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // What was buffered before the drop arrives in order; then the connection ends with no close
    // frame (protocol §1.4), having delivered far from everything.
    let (seen, closed) = read_to_end(&mut stalled).await;
    assert!(!closed, "a dropped slow consumer gets no close frame");
    assert_eq!(seen, (1..=seen.len() as u64).collect::<Vec<_>>());
    assert!(
        seen.len() < n as usize - 100,
        "{} of {n} delivered",
        seen.len()
    );
    assert_eq!(metric(addr, behind).await, 1.0);
    assert_eq!(
        metric(
            addr,
            "riptide_slow_consumer_drops_total{reason=\"write-timeout\"}"
        )
        .await,
        0.0
    );
    drop(fast);
    let until = tokio::time::Instant::now() + T;
    while app
        .metrics
        .subscribers
        .load(std::sync::atomic::Ordering::Relaxed)
        > 0
    {
        assert!(
            tokio::time::Instant::now() < until,
            "subscribers never left"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rationed_store_reads_still_deliver_everything_in_order() {
    // No tail, one block load at a time, reads of 7 events or one event's bytes: four
    // concurrent replays share the store's block cache and each still gets the whole capture,
    // in order.
    let Some(frames) = corpus_frames() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let config = ServerConfig {
        read: ReadLimit {
            events: 7,
            bytes: 1,
        },
        store_readers: 1,
        ..ServerConfig::default()
    };
    let none = TailLimits {
        max_events: 0,
        max_bytes: 0,
    };
    let (addr, _app) = start_config(dir.path(), frames, none, keys(), config).await;
    let want = expected();
    let mut clients = Vec::new();
    for _ in 0..4 {
        let mut ws = connect(addr, "cursor=0").await;
        clients.push(tokio::spawn(
            async move { read_n(&mut ws, 152, None).await },
        ));
    }
    for c in clients {
        let (got, cursors) = c.await.unwrap();
        assert_eq!(got, want);
        assert_eq!(cursors, (1..=152).collect::<Vec<u64>>());
    }
    // One event per read (the byte cap), four replays, plus reads that found the tip.
    assert!(metric(addr, "riptide_replay_reads_total").await >= 4.0 * 152.0);
}

/// Ingests the capture into a fresh store with `cfg`; what ingest reports, its metrics, and the
/// stored events as JSON without `time_us` and `cursor` (each cursor checked against its seq).
async fn ingest_capture(
    frames: &[Vec<u8>],
    cfg: IngestConfig,
) -> (riptide_serve::IngestSummary, Arc<Metrics>, Vec<Value>) {
    let dir = tempfile::tempdir().unwrap();
    let (store, resume) = Store::open(dir.path(), 0).unwrap();
    let log = Arc::new(Log::new(store, resume.next_seq, TailLimits::default()));
    let metrics = Arc::new(Metrics::default());
    let s = ingest_all(cfg, &log, &metrics, resume, frames, 1).await;
    let mut got = Vec::new();
    let all = ReadLimit {
        events: 1000,
        bytes: 1 << 30,
    };
    log.read(1, all, &mut got).unwrap();
    let got = got
        .iter()
        .map(|e| {
            let mut v: Value = serde_json::from_slice(&e.json()).unwrap();
            let o = v.as_object_mut().unwrap();
            assert_eq!(o.remove("cursor").unwrap().as_u64(), Some(e.seq()));
            o.remove("time_us");
            v
        })
        .collect();
    (s, metrics, got)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trusting_ingest_serves_the_same_events_and_counts_nothing_verified() {
    let Some(frames) = corpus_frames() else {
        return;
    };
    let (s, metrics, got) = ingest_capture(&frames, IngestConfig::trusting()).await;
    assert_eq!((s.frames, s.events), (150, 152));
    assert_eq!(s.resume.upstream_cursor, Some(150));
    assert_eq!(metrics.verify_seconds.count(), 0);
    assert_eq!(metrics.publish_seconds.count(), 150);
    assert_eq!(got, expected());
}

/// Workers split frames by DID; the writer puts results back in upstream order. Whatever the
/// number of workers (one, fewer than the cores, more, not dividing the DIDs evenly), the store
/// holds the same events in the same order, every frame verified.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_number_of_workers_stores_the_same_events_in_order() {
    let Some(frames) = corpus_frames() else {
        return;
    };
    let want = expected();
    for workers in [1, 3, 8] {
        let mut cfg = IngestConfig::verifying(keys());
        cfg.workers = workers;
        let (s, metrics, got) = ingest_capture(&frames, cfg).await;
        assert_eq!((s.frames, s.events), (150, 152), "{workers} workers");
        assert_eq!(metrics.verify_seconds.count(), 150, "{workers} workers");
        assert_eq!(metrics.publish_seconds.count(), 150, "{workers} workers");
        assert_eq!(got, want, "{workers} workers");
    }
}

/// Serves `n` events of about 16 KiB each in the stored v1 shape (so both `/subscribe` and
/// `subscribeEvents` can send them), published straight into the in-memory tail.
async fn big_v1_events(n: u64, config: ServerConfig) -> (SocketAddr, Arc<App>, tempfile::TempDir) {
    let pad = "x".repeat(16 << 10);
    common::serve_events(
        &(1..=n)
            .map(|i| common::v1_commit(i, &pad))
            .collect::<Vec<_>>(),
        config,
    )
    .await
}

/// Issue 22's saturation finding: 1,000 live `subscribeEvents` subscribers each received nothing
/// in the measured window. Under saturation every reader has megabytes queued in its socket, and
/// the server's ping waits behind them: a reader that is reading, only behind, answered it after
/// the pong timeout and was dropped (`pong-timeout`). Here a reader paced at ~500 events/s works
/// through a 30 MB replay with pings every 50 ms and a 100 ms pong timeout: it must get every
/// event, on both wires. A client that answers nothing on an idle connection is still dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_behind_its_socket_backlog_answers_pings_late_and_is_kept() {
    let n = 2000u64;
    let config = ServerConfig {
        ping_interval: Duration::from_millis(50),
        pong_timeout: Duration::from_millis(100),
        write_timeout: Duration::from_secs(60),
        ..ServerConfig::default()
    };
    let (addr, app, _dir) = big_v1_events(n, config).await;
    let pong = "riptide_slow_consumer_drops_total{reason=\"pong-timeout\"}";
    for (path, seq) in [
        ("/subscribe?cursor=1", "/cursor"),
        (
            "/xrpc/network.bsky.jetstream.subscribeEvents?cursor=1",
            "/payload/seq",
        ),
    ] {
        let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{addr}{path}"))
            .await
            .unwrap();
        let mut i = 0;
        while i < n {
            let msg = tokio::time::timeout(T, ws.next()).await.expect("timed out");
            let t = match msg {
                Some(Ok(Message::Text(t))) => t,
                // Pings (answered by the client as it reads on).
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
                other => panic!(
                    "{path}: after {i} of {n} events: {other:?} (pong-timeout drops: {})",
                    metric(addr, pong).await
                ),
            };
            i += 1;
            let v: Value = serde_json::from_str(t.as_str()).unwrap();
            assert_eq!(v.pointer(seq).and_then(Value::as_u64), Some(i), "{path}");
            if i % 2 == 0 {
                tokio::time::sleep(Duration::from_millis(4)).await;
            }
        }
        assert_eq!(metric(addr, pong).await, 0.0, "{path}");
    }
    // Idle (at the tip, no event ever sent) and never answering: dropped once the pong is late.
    let (_silent, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/subscribe"))
        .await
        .unwrap();
    let until = tokio::time::Instant::now() + T;
    while metric(addr, pong).await < 1.0 {
        assert!(
            tokio::time::Instant::now() < until,
            "a silent idle peer was never dropped"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = app;
}

/// A client's Close ends a replay at once, on both wires, and is answered: the server stops
/// sending events when it reads the Close (RFC 6455 §5.5.1: after a Close, no more data
/// frames), replies with its Close, and the connection ends. `subscribeEvents` used to drop the
/// connection without the reply. The client reads on after its Close, as a client must until
/// the reply; the replay is 32 MB, far more than the socket buffers hold at the Close.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_close_stops_a_replay_at_once() {
    let n = 2000u64;
    let (addr, app, _dir) = big_v1_events(n, ServerConfig::default()).await;
    for path in [
        "/subscribe?cursor=0".to_string(),
        format!("{}?cursor=0", riptide_serve::v2::SUBSCRIBE_EVENTS),
    ] {
        let before = app
            .metrics
            .events_out
            .load(std::sync::atomic::Ordering::Relaxed);
        let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{addr}{path}"))
            .await
            .unwrap();
        let mut got = 0u64;
        while got < 3 {
            match tokio::time::timeout(T, ws.next()).await.expect("timed out") {
                Some(Ok(Message::Text(_))) => got += 1,
                Some(Ok(_)) => {}
                other => panic!("{path}: stream ended: {other:?}"),
            }
        }
        ws.send(Message::Close(None)).await.unwrap();
        let t0 = std::time::Instant::now();
        let mut reply = false;
        // Until the server hangs up (bounded by `T` per message).
        loop {
            match tokio::time::timeout(T, ws.next()).await.expect("timed out") {
                Some(Ok(Message::Text(_))) => got += 1,
                Some(Ok(Message::Close(_))) => reply = true,
                Some(Ok(_)) => {}
                Some(Err(_)) | None => break,
            }
        }
        let sent = app
            .metrics
            .events_out
            .load(std::sync::atomic::Ordering::Relaxed)
            - before;
        eprintln!(
            "{path}: got {got} of {n}, server sent {sent}, took {:?}",
            t0.elapsed()
        );
        assert!(reply, "{path}: the Close was not answered");
        // What the socket buffers held at the Close (a few MB) still arrives; the rest is not
        // sent.
        assert!(
            got >= 3 && got < n / 2,
            "{path}: {got} of {n} events after a Close"
        );
    }
}

/// The next `n` binary messages of `ws`, as they came.
async fn binary_n(ws: &mut Ws, n: usize) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    while out.len() < n {
        match tokio::time::timeout(T, ws.next()).await.expect("timed out") {
            Some(Ok(Message::Binary(b))) => out.push(b.to_vec()),
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => {}
            other => panic!("expected a binary message, got {other:?}"),
        }
    }
    out
}

/// Every stored event of `log` (all in its tail here).
fn logged(log: &Log) -> Vec<riptide_serve::Event> {
    let mut out = Vec::new();
    let all = ReadLimit {
        events: 100_000,
        bytes: usize::MAX,
    };
    log.read(1, all, &mut out).unwrap();
    out
}

/// Issue 20: the v1 zstd form (~2.8 CPU-µs an event with the dictionary) is made at ingest only
/// while a `compress=true` subscriber wants it. Without one, the real capture's events are kept
/// without it and a compressed subscriber gets each frame made when sent, byte for byte what
/// ingest makes (Jetstream's settings); with one connected, ingest makes every event's form once
/// and nothing is compressed at send time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_zstd_form_is_made_at_ingest_only_while_a_compressed_subscriber_wants_it() {
    let Some(frames) = corpus_frames() else {
        return;
    };
    let dict = dictionary();
    let mut compressor = dict.compressor().unwrap();
    let mut expect = |events: &[riptide_serve::Event]| -> Vec<Vec<u8>> {
        events
            .iter()
            .map(|e| compressor.compress(&e.json()).unwrap())
            .collect()
    };

    // Nobody asked: ingest keeps the JSON alone.
    let s = capture().await.unwrap();
    let stored = logged(&s.app.log);
    assert_eq!(stored.len(), 152);
    assert!(stored.iter().all(|e| e.zstd_len() == 0));
    assert_eq!(metric(s.addr, "riptide_v1_zstd_at_ingest").await, 0.0);
    let mut ws = connect(s.addr, "cursor=0&compress=true").await;
    assert_eq!(binary_n(&mut ws, 152).await, expect(&stored));
    assert_eq!(metric(s.addr, "riptide_v1_zstd_at_send_total").await, 152.0);
    assert_eq!(
        metric(s.addr, "riptide_v1_compressed_subscribers").await,
        1.0
    );
    assert_eq!(metric(s.addr, "riptide_v1_zstd_at_ingest").await, 1.0);
    drop(ws);

    // A compressed subscriber is connected while the capture is ingested.
    let dir = tempfile::tempdir().unwrap();
    let (store, resume) = Store::open(dir.path(), dict.id()).unwrap();
    let log = Arc::new(Log::new(store, resume.next_seq, TailLimits::default()));
    let metrics = Arc::new(Metrics::default());
    let config = ServerConfig {
        v1_dictionary: Some(dict.clone()),
        ..ServerConfig::default()
    };
    let app = App::new(log.clone(), metrics.clone(), config);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router(app)).await });
    let mut ws = connect(addr, "compress=true").await;
    let deadline = tokio::time::Instant::now() + T;
    while metric(addr, "riptide_v1_compressed_subscribers").await != 1.0 {
        assert!(tokio::time::Instant::now() < deadline, "never counted");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut cfg = IngestConfig::verifying(keys());
    cfg.dictionary = Some(dict.clone());
    ingest_all(cfg, &log, &metrics, resume, &frames, 1).await;
    let stored = logged(&log);
    assert_eq!(stored.len(), 152);
    let made: Vec<Vec<u8>> = stored.iter().map(|e| e.zstd().to_vec()).collect();
    assert_eq!(made, expect(&stored));
    assert_eq!(binary_n(&mut ws, 152).await, made);
    assert_eq!(metric(addr, "riptide_v1_zstd_at_send_total").await, 0.0);
}
