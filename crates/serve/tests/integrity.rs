//! A bit flipped in a stopped store's block (issue 40), on the wire: a replay over it on either
//! wire gets every event before and after the block, exactly as stored, none of the block's, and
//! is not closed; the block is named in `/metrics` (`store.rs`, "Checksums").
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use riptide_serve::{App, Log, Metrics, ServerConfig, Store, TailLimits};
use riptide_store::testing::{cut_journals, flip_block, resume, SMALL};
use tokio_tungstenite::tungstenite::Message;

const T: Duration = Duration::from_secs(60);

/// Every message of `path` until none comes for a second; panics on a close or an error.
async fn all_messages(addr: SocketAddr, path: &str) -> Vec<String> {
    let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{addr}{path}"))
        .await
        .unwrap();
    let mut out = Vec::new();
    loop {
        match tokio::time::timeout(Duration::from_secs(1), ws.next()).await {
            Err(_) => return out,
            Ok(Some(Ok(Message::Text(t)))) => out.push(t.as_str().to_owned()),
            Ok(Some(Ok(Message::Ping(_) | Message::Pong(_)))) => {}
            other => panic!("after {} messages: {other:?}", out.len()),
        }
    }
}

fn num(v: &serde_json::Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or_else(|| panic!("no {k} in {v}"))
}

/// The seq of each v1 event (its `cursor`).
fn v1_seqs(messages: &[String]) -> Vec<u64> {
    messages
        .iter()
        .map(|m| num(&serde_json::from_str(m).unwrap(), "cursor"))
        .collect()
}

/// The seq of each `subscribeEvents` message (`payload.seq`).
fn v2_seqs(messages: &[String]) -> Vec<u64> {
    messages
        .iter()
        .map(|m| {
            num(
                &serde_json::from_str::<serde_json::Value>(m).unwrap()["payload"],
                "seq",
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_block_is_skipped_on_both_wires_and_named_in_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let evs: Vec<_> = (1..=100).map(|i| common::v1_commit(i, "x")).collect();
    {
        let (store, _) = Store::open_with(dir.path(), 0, SMALL).unwrap();
        store.append(&evs, &resume(101)).unwrap();
        store.flush().unwrap();
    }
    flip_block(dir.path(), 16, 17, 40);

    let (store, resume) = Store::open_with(dir.path(), 0, SMALL).unwrap();
    assert_eq!(resume.next_seq, 101);
    // No tail: every read goes to the store's blocks.
    let log = Arc::new(Log::new(
        store,
        resume.next_seq,
        TailLimits {
            max_events: 0,
            max_bytes: 0,
        },
    ));
    let app = App::new(log, Arc::new(Metrics::default()), ServerConfig::default());
    let addr = common::listen(app).await;
    let want: Vec<u64> = (1..=16).chain(33..=100).collect();

    let v1 = tokio::time::timeout(T, all_messages(addr, "/subscribe?cursor=0"))
        .await
        .unwrap();
    let got = v1_seqs(&v1);
    assert_eq!(got, want);
    // Byte for byte what was stored.
    for (m, &seq) in v1.iter().zip(&want) {
        assert_eq!(m.as_bytes(), &evs[seq as usize - 1].json()[..], "seq {seq}");
    }

    let v2 = tokio::time::timeout(
        T,
        all_messages(
            addr,
            "/xrpc/network.bsky.jetstream.subscribeEvents?cursor=0",
        ),
    )
    .await
    .unwrap();
    let got = v2_seqs(&v2);
    assert_eq!(got, want);

    // Named once in /metrics, though two replays met it.
    let body = metrics(addr).await;
    assert!(
        body.contains("\nriptide_store_corrupt_blocks_total 1\n"),
        "{body}"
    );
    assert!(
        body.contains("\nriptide_store_corrupt_events_total 16\n"),
        "{body}"
    );
}

async fn metrics(addr: SocketAddr) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").await.unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).await.unwrap();
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_journal_cut_short_is_in_metrics_and_its_seqs_are_not_given_again() {
    let dir = tempfile::tempdir().unwrap();
    let evs: Vec<_> = (1..=100).map(|i| common::v1_commit(i, "x")).collect();
    {
        // Ten acknowledged batches, never flushed: all in the journal.
        let (store, _) = Store::open_with(dir.path(), 0, SMALL).unwrap();
        for b in evs.chunks(10) {
            store.append(b, &resume(b[9].seq() + 1)).unwrap();
        }
    }
    cut_journals(dir.path());
    let (store, r) = Store::open_with(dir.path(), 0, SMALL).unwrap();
    // Nothing the last run gave out is given again.
    assert_eq!((r.next_seq, r.last_time_us), (101, 100));
    let kept = store.lost_ranges().unwrap()[0].first;
    let log = Arc::new(Log::new(store, r.next_seq, TailLimits::default()));
    let app = App::new(
        log.clone(),
        Arc::new(Metrics::default()),
        ServerConfig::default(),
    );
    let addr = common::listen(app).await;
    let body = metrics(addr).await;
    assert!(
        body.contains(&format!(
            "\nriptide_store_journal_lost_events {}\n",
            101 - kept
        )),
        "{body}"
    );
    // Ingest goes on at 101; a subscriber whose cursor is in the lost range gets what is left
    // after it, without a stall.
    let more: Vec<_> = (101..=110).map(|i| common::v1_commit(i, "y")).collect();
    log.store().append(&more, &resume(111)).unwrap();
    log.publish(&more);
    let path = format!(
        "/xrpc/network.bsky.jetstream.subscribeEvents?cursor={}",
        kept + 1
    );
    let v2 = tokio::time::timeout(T, all_messages(addr, &path))
        .await
        .unwrap();
    let got = v2_seqs(&v2);
    assert_eq!(got, (101..=110).collect::<Vec<_>>());
    let v1 = tokio::time::timeout(T, all_messages(addr, "/subscribe?cursor=0"))
        .await
        .unwrap();
    let got = v1_seqs(&v1);
    let want: Vec<u64> = (1..kept).chain(101..=110).collect();
    assert_eq!(got, want);
}
