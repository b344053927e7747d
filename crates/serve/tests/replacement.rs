//! Replacement rows on the wire (protocol §4.1, §7 item 8): a replacement's record (a
//! `create-resync` row, `EventKind::Replacement`) is sent on v2 `subscribeEvents` as a
//! `#commit` create and never on v1 `/subscribe`, which counts it
//! (`riptide_v1_events_skipped_total{reason="resync_replacement"}`) — from the in-memory tail and
//! from sealed row blocks alike. The rows are real: creates of the capture, every third made a
//! replacement's as `riptide_jetstream::replace` makes them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use riptide_firehose::FrameDecoder;
use riptide_jetstream::replace::replacement_row;
use riptide_jetstream::rows::frame_rows;
use riptide_jetstream::{EventKind, Projector, StoredRow};
use riptide_segment::{Kind, OwnedRow, Row};
use riptide_serve::{
    App, Event, Log, Metrics, ReadLimit, Resume, ServerConfig, Store, StoreOptions, TailLimits,
};
use tokio_tungstenite::tungstenite::Message;

const T: Duration = Duration::from_secs(120);

/// Blocks of 4 events: the 18 events below seal into several row blocks.
const SMALL: StoreOptions = StoreOptions {
    block_events: 4,
    block_bytes: 1 << 20,
    block_cache: 2,
    segment_bytes: None,
};

/// The first `n` creates of the capture, as rows.
fn capture_creates(n: usize) -> Option<Vec<OwnedRow>> {
    let file = riptide_testdata::read("jetstream-2026-07/firehose-frames.bin")?;
    let frames = riptide_firehose::corpus::split_frames(&file).unwrap();
    let (mut dec, mut proj) = (FrameDecoder::new(), Projector::new());
    let mut out = Vec::new();
    for f in &frames {
        let frame = dec.decode(f.bytes).unwrap();
        let rows = frame_rows(&mut proj, &frame).unwrap().rows;
        out.extend(
            rows.iter()
                .filter(|r| r.kind == Kind::Create)
                .map(Row::to_owned_row),
        );
        if out.len() >= n {
            out.truncate(n);
            return Some(out);
        }
    }
    panic!("the capture has fewer than {n} creates");
}

/// Events `1..=creates.len()` of `creates`, every third (seq 2, 5, …) a replacement's record:
/// the events, their rows, and which are replacements'.
fn events(creates: &[OwnedRow]) -> (Vec<Event>, Vec<OwnedRow>, Vec<bool>) {
    let (mut proj, mut json) = (Projector::new(), Vec::new());
    let (mut evs, mut rows, mut repl) = (Vec::new(), Vec::new(), Vec::new());
    for (i, c) in creates.iter().enumerate() {
        let (seq, t) = (i as u64 + 1, 1_000_000 + i as i64);
        let row = c.as_row();
        let stored = StoredRow::from_row(&row);
        let replacing = i % 3 == 1;
        let (e, r) = if replacing {
            (
                Event::replacement_from_row(&mut proj, &stored, seq, t, &mut json).unwrap(),
                replacement_row(&stored, seq, t),
            )
        } else {
            (
                Event::from_row(&mut proj, &stored, seq, t, &mut json).unwrap(),
                stored.row(seq, t),
            )
        };
        assert_eq!(r.kind == Kind::CreateResync, replacing);
        assert_eq!(e.kind() == EventKind::Replacement, replacing);
        evs.push(e);
        rows.push(r.to_owned_row());
        repl.push(replacing);
    }
    (evs, rows, repl)
}

async fn serve(log: Arc<Log>) -> (SocketAddr, Arc<App>) {
    let app = App::new(log, Arc::new(Metrics::default()), ServerConfig::default());
    (common::listen(app.clone()).await, app)
}

/// The JSON of the first `n` text messages of `path`, and the socket (still open).
async fn texts(
    addr: SocketAddr,
    path: &str,
    n: usize,
    keep: impl Fn(&serde_json::Value) -> bool,
) -> Vec<serde_json::Value> {
    let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{addr}{path}"))
        .await
        .unwrap();
    let mut out = Vec::new();
    while out.len() < n {
        match tokio::time::timeout(T, ws.next()).await.unwrap() {
            Some(Ok(Message::Text(t))) => {
                let v: serde_json::Value = serde_json::from_str(&t).unwrap();
                if keep(&v) {
                    out.push(v);
                }
            }
            Some(Ok(_)) => {}
            other => panic!("after {} messages: {other:?}", out.len()),
        }
    }
    out
}

/// v1 sends exactly the events that are not replacements' (and counts those it skips); v2 sends
/// every event, a replacement's as a `#commit` create, also to a `kinds=commit` and a
/// `collections` filter.
async fn check_wires(addr: SocketAddr, app: &App, evs: &[Event], repl: &[bool]) {
    let json = |e: &Event| serde_json::from_slice::<serde_json::Value>(&e.json()).unwrap();
    let plain: Vec<serde_json::Value> = evs
        .iter()
        .zip(repl)
        .filter(|(_, r)| !**r)
        .map(|(e, _)| json(e))
        .collect();
    let skipped = repl.iter().filter(|r| **r).count() as u64;
    assert!(skipped >= 4 && plain.len() >= 8);
    let v1 = texts(addr, "/subscribe?cursor=0", plain.len(), |_| true).await;
    let cursors =
        |v: &[serde_json::Value]| v.iter().map(|e| e["cursor"].clone()).collect::<Vec<_>>();
    assert_eq!(
        cursors(&v1),
        cursors(&plain),
        "v1 sends the events that are not replacements'"
    );
    assert_eq!(v1, plain);
    // The last event is not a replacement's: every replacement was skipped before it was sent.
    assert!(!repl.last().unwrap());
    let m = &app.metrics;
    let until = Instant::now() + T;
    while m
        .v1_skipped_replacement
        .load(std::sync::atomic::Ordering::Relaxed)
        < skipped
    {
        assert!(Instant::now() < until, "v1's skips never counted");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let metrics = reqwest_metrics(addr).await;
    assert!(
        metrics.contains(&format!(
            "\nriptide_v1_events_skipped_total{{reason=\"resync_replacement\"}} {skipped}\n"
        )),
        "{metrics}"
    );

    let is_msg = |f: &serde_json::Value| f["$type"] == "message" && f["payload"]["seq"].is_u64();
    let v2_path = "/xrpc/network.bsky.jetstream.subscribeEvents?cursor=0";
    let c0 = json(&evs[1])["commit"]["collection"]
        .as_str()
        .unwrap()
        .to_owned();
    for query in ["", "&kinds=commit", &format!("&collections={c0}")] {
        let by_collection = query.contains("collections");
        let want: Vec<&Event> = evs
            .iter()
            .filter(|e| !by_collection || e.collection() == c0.as_bytes())
            .collect();
        let v2 = texts(addr, &format!("{v2_path}{query}"), want.len(), is_msg).await;
        for (f, e) in v2.iter().zip(&want) {
            let (p, v1) = (&f["payload"], json(e));
            assert_eq!(p["seq"], e.seq(), "{query}: {p}");
            assert!(p["$type"].as_str().unwrap().ends_with("#commit"), "{p}");
            assert_eq!(p["operation"], "create", "{p}");
            for k in ["rev", "collection", "rkey", "cid", "record"] {
                assert_eq!(p[k], v1["commit"][k], "{k}: {p} against {v1}");
            }
        }
    }
}

/// `/metrics`' text.
async fn reqwest_metrics(addr: SocketAddr) -> String {
    tokio::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(T)).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .unwrap();
        let mut body = String::new();
        s.read_to_string(&mut body).unwrap();
        body
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replacement_is_sent_on_v2_and_never_on_v1_from_memory_and_from_disk() {
    let Some(creates) = capture_creates(18) else {
        return;
    };
    let (evs, rows, repl) = events(&creates);
    let dir = tempfile::tempdir().unwrap();
    let (store, resume) = Store::open_with(dir.path(), 0, SMALL).unwrap();
    assert_eq!(resume.next_seq, 1);
    let log = Arc::new(Log::new(store.clone(), 1, TailLimits::default()));
    for (chunk, rchunk) in evs.chunks(4).zip(rows.chunks(4)) {
        let last = chunk.last().unwrap();
        let rs: Vec<Row<'_>> = rchunk.iter().map(OwnedRow::as_row).collect();
        store
            .append_rows(
                chunk,
                &rs,
                &[],
                &[],
                &Resume {
                    next_seq: last.seq() + 1,
                    last_time_us: last.time_us(),
                    upstream_cursor: None,
                },
            )
            .unwrap();
        log.publish(chunk);
    }
    // The store gives a replacement back as one, from its sealed row blocks and unsealed rows.
    let c = store.check().unwrap();
    assert!(c.row_blocks >= 3 && c.row_blocks == c.blocks, "{c:?}");
    let mut back = Vec::new();
    let all = ReadLimit {
        events: 1000,
        bytes: 1 << 30,
    };
    store.read_from(1, all, &mut back).unwrap();
    assert_eq!(back.len(), evs.len());
    for (b, e) in back.iter().zip(&evs) {
        assert_eq!((b.seq(), b.kind()), (e.seq(), e.kind()));
        assert_eq!(b.json(), e.json());
    }

    let (mem, mem_app) = serve(log.clone()).await;
    check_wires(mem, &mem_app, &evs, &repl).await;
    // A log with an empty tail: every read goes to the store (sealed row blocks, rendered).
    let disk_log = Arc::new(Log::new(
        store.clone(),
        evs.len() as u64 + 1,
        TailLimits {
            max_events: 0,
            max_bytes: 0,
        },
    ));
    let (disk, disk_app) = serve(disk_log).await;
    check_wires(disk, &disk_app, &evs, &repl).await;
}
