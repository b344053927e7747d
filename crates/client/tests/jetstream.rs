//! The Jetstream client against a small loopback server that speaks the protocol: query filters,
//! options_update, zstd with the legacy dictionary, cursor on reconnect. Plus the per-DID helper.

#![allow(clippy::unwrap_used, clippy::result_large_err)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use riptide_client::{
    Backoff, ClientConfig, JetstreamClient, JetstreamConfig, JetstreamOptions, PerDid,
};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::handshake::server::{Request, Response};
use tokio_tungstenite::tungstenite::Message;

const T: Duration = Duration::from_secs(60);

/// What the test server saw on one connection.
#[derive(Debug)]
enum Seen {
    Query(String),
    Text(String),
}

/// Serves `events` (JSON lines) on each connection, compressed with `dict` when the query says
/// `compress=true`, then keeps the connection open, reporting queries and client texts. With
/// `drop_after`, the first connection is dropped after that many events.
async fn server(
    events: Vec<String>,
    dict: Vec<u8>,
    drop_after: Option<usize>,
) -> (String, mpsc::UnboundedReceiver<Seen>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut conn = 0;
        loop {
            let (sock, _) = listener.accept().await.unwrap();
            conn += 1;
            let mut query = String::new();
            let cb = |req: &Request, resp: Response| {
                assert_eq!(req.uri().path(), "/subscribe");
                query = req.uri().query().unwrap_or("").to_string();
                Ok(resp)
            };
            let mut ws = tokio_tungstenite::accept_hdr_async(sock, cb).await.unwrap();
            tx.send(Seen::Query(query.clone())).unwrap();
            let compress = query.split('&').any(|p| p == "compress=true");
            if query.contains("requireHello=true") {
                // Nothing until the hello.
                match ws.next().await {
                    Some(Ok(Message::Text(t))) => tx.send(Seen::Text(t.to_string())).unwrap(),
                    other => panic!("{other:?}"),
                }
            }
            let mut c = zstd::bulk::Compressor::with_dictionary(3, &dict).unwrap();
            c.include_checksum(true).unwrap();
            let limit = if conn == 1 {
                drop_after.unwrap_or(usize::MAX)
            } else {
                usize::MAX
            };
            for e in events.iter().take(limit) {
                let msg = if compress {
                    Message::Binary(c.compress(e.as_bytes()).unwrap().into())
                } else {
                    Message::text(e.clone())
                };
                ws.send(msg).await.unwrap();
            }
            if limit != usize::MAX {
                continue; // drop the connection
            }
            let tx = tx.clone();
            tokio::spawn(async move {
                while let Some(Ok(m)) = ws.next().await {
                    if let Message::Text(t) = m {
                        let _ = tx.send(Seen::Text(t.to_string()));
                    }
                }
            });
        }
    });
    (format!("ws://{addr}"), rx)
}

fn golden() -> Option<(Vec<String>, Vec<u8>)> {
    let lines = riptide_testdata::read_string("jetstream-golden/golden_v1.jsonl")?;
    let dict = riptide_testdata::read("jetstream-dictionaries/legacy_subscribe.zdict")?;
    Some((lines.lines().map(str::to_string).collect(), dict))
}

fn config(host: String) -> ClientConfig {
    ClientConfig {
        backoff: Backoff {
            base: Duration::from_millis(5),
            max: Duration::from_millis(50),
            ..Backoff::default()
        },
        ..ClientConfig::with_hosts([host])
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compressed_filtered_stream_with_options_update_and_resume() {
    let Some((events, dict)) = golden() else {
        return;
    };
    let (host, mut seen) = server(events.clone(), dict.clone(), Some(4)).await;
    let cfg = JetstreamConfig {
        client: config(host),
        options: JetstreamOptions {
            wanted_collections: vec!["app.bsky.feed.post".into(), "app.bsky.graph.*".into()],
            wanted_dids: vec!["did:plc:abc".into()],
            max_message_size_bytes: 0,
        },
        dictionary: Some(dict),
        require_hello: false,
    };
    let mut c = JetstreamClient::new(cfg).unwrap();
    let sender = c.options_sender();
    let mut got = Vec::new();
    for _ in 0..events.len() + 4 {
        got.push(tokio::time::timeout(T, c.next()).await.unwrap());
    }
    // First connection: the filters and compression in the query.
    let Some(Seen::Query(q)) = seen.recv().await else {
        panic!()
    };
    assert_eq!(q, "wantedCollections=app.bsky.feed.post&wantedCollections=app.bsky.graph.*&wantedDids=did:plc:abc&compress=true");
    // Dropped after 4 events; the reconnect resumes at the 4th event's time_us (inclusive).
    let Some(Seen::Query(q2)) = seen.recv().await else {
        panic!()
    };
    let t4: serde_json::Value = serde_json::from_str(&events[3]).unwrap();
    assert!(q2.contains(&format!("cursor={}", t4["time_us"])), "{q2}");
    // Decompressed bytes are exactly what the server sent; typed fields parsed.
    let expect: Vec<&String> = events[..4].iter().chain(events.iter()).collect();
    for (g, e) in got.iter().zip(&expect) {
        assert_eq!(std::str::from_utf8(&g.raw).unwrap(), e.as_str());
        let v: serde_json::Value = serde_json::from_str(e).unwrap();
        assert_eq!(g.event.did, v["did"].as_str().unwrap());
        assert_eq!(g.event.kind, v["kind"].as_str().unwrap());
        if let Some(commit) = &g.event.commit {
            assert_eq!(commit.rkey, v["commit"]["rkey"].as_str().unwrap());
            assert_eq!(commit.record.as_ref(), v["commit"].get("record"));
        }
    }
    assert!(got.iter().any(|g| g
        .event
        .commit
        .as_ref()
        .is_some_and(|c| c.operation == "delete" && c.record.is_none())));
    assert_eq!(c.stats().snapshot().decode_errors, 0);
    assert_eq!(c.stats().snapshot().reconnects, 1);

    // options_update goes out on the live connection and replaces the filter.
    let new = JetstreamOptions {
        wanted_collections: vec!["app.bsky.feed.like".into()],
        ..JetstreamOptions::default()
    };
    sender.update(new).await.unwrap();
    let pump = tokio::spawn(async move {
        let _ = tokio::time::timeout(Duration::from_secs(5), c.next()).await;
    });
    let Some(Seen::Text(t)) = tokio::time::timeout(T, seen.recv()).await.unwrap() else {
        panic!()
    };
    let v: serde_json::Value = serde_json::from_str(&t).unwrap();
    assert_eq!(v["type"], "options_update");
    assert_eq!(
        v["payload"]["wantedCollections"],
        serde_json::json!(["app.bsky.feed.like"])
    );
    assert_eq!(v["payload"]["wantedDids"], serde_json::json!([]));
    pump.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn require_hello_sends_the_filters_first() {
    let Some((events, dict)) = golden() else {
        return;
    };
    let (host, mut seen) = server(events.clone(), dict, None).await;
    let dids: Vec<String> = (0..150).map(|i| format!("did:plc:{i:024}")).collect();
    let cfg = JetstreamConfig {
        client: config(host),
        options: JetstreamOptions {
            wanted_dids: dids.clone(),
            ..JetstreamOptions::default()
        },
        dictionary: None,
        require_hello: false, // implied by the long DID list
    };
    let mut c = JetstreamClient::new(cfg).unwrap();
    let first = tokio::time::timeout(T, c.next()).await.unwrap();
    assert_eq!(std::str::from_utf8(&first.raw).unwrap(), events[0]);
    let Some(Seen::Query(q)) = seen.recv().await else {
        panic!()
    };
    assert_eq!(q, "requireHello=true", "DIDs too many for the URL");
    let Some(Seen::Text(t)) = seen.recv().await else {
        panic!()
    };
    let v: serde_json::Value = serde_json::from_str(&t).unwrap();
    assert_eq!(v["payload"]["wantedDids"].as_array().unwrap().len(), 150);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_did_keeps_each_did_in_order_and_runs_dids_in_parallel() {
    let log: Arc<Mutex<HashMap<String, Vec<u32>>>> = Arc::default();
    let active = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let pool = PerDid::new(4, 2, {
        let (log, active, peak) = (log.clone(), active.clone(), peak.clone());
        move |(did, i): (String, u32)| {
            let (log, active, peak) = (log.clone(), active.clone(), peak.clone());
            async move {
                let now = active.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_micros(200 * u64::from(i % 3))).await;
                log.lock().unwrap().entry(did).or_default().push(i);
                active.fetch_sub(1, Ordering::SeqCst);
            }
        }
    });
    let dids: Vec<String> = (0..16).map(|d| format!("did:plc:{d}")).collect();
    for i in 0..100u32 {
        for d in &dids {
            pool.submit(d, (d.clone(), i)).await.unwrap();
        }
    }
    pool.finish().await;
    let log = log.lock().unwrap();
    assert_eq!(log.len(), 16);
    for d in &dids {
        assert_eq!(log[d], (0..100).collect::<Vec<_>>(), "{d}");
    }
    assert!(peak.load(Ordering::SeqCst) >= 2, "DIDs ran in parallel");
}
