//! The firehose client against the loopback relay: resume without gaps through dropped
//! connections, host rotation past dead and 5xx hosts, a file cursor across a restart, notices.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use riptide_client::{
    Backoff, ClientConfig, ClientError, FileCursorStore, FirehoseClient, FrameKind,
};
use riptide_firehose::corpus::split_frames;
use riptide_relay::{Relay, RelayConfig, RelayHandle};

const T: Duration = Duration::from_secs(60);

fn frames() -> Option<Vec<Bytes>> {
    let file = riptide_testdata::read("jetstream-2026-07/firehose-frames.bin")?;
    Some(
        split_frames(&file)
            .unwrap()
            .iter()
            .map(|f| Bytes::copy_from_slice(f.bytes))
            .collect(),
    )
}

async fn start(cfg: RelayConfig) -> Option<RelayHandle> {
    let (_, r) = Relay::bind("127.0.0.1:0".parse().unwrap(), frames()?, cfg)
        .await
        .unwrap();
    r.wait_for_head(150).await;
    Some(r)
}

fn fast(hosts: Vec<String>) -> ClientConfig {
    ClientConfig {
        backoff: Backoff {
            base: Duration::from_millis(5),
            max: Duration::from_millis(50),
            healthy_after: Duration::from_secs(60),
        },
        start_cursor: Some(0),
        ..ClientConfig::with_hosts(hosts)
    }
}

async fn next_n(c: &mut FirehoseClient, n: usize) -> Vec<riptide_client::FirehoseEvent> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(tokio::time::timeout(T, c.next()).await.expect("timed out"));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_connections_resume_from_the_cursor_with_no_gap() {
    let mut cfg = RelayConfig::default();
    cfg.faults.drop_after = Some(7);
    let Some(relay) = start(cfg).await else {
        return;
    };
    let mut c = FirehoseClient::new(fast(vec![relay.url()])).unwrap();
    let events = next_n(&mut c, 150).await;
    let seqs: Vec<i64> = events.iter().map(|e| e.seq.unwrap()).collect();
    assert_eq!(
        seqs,
        (1..=150).collect::<Vec<_>>(),
        "every seq once, in order"
    );
    assert!(events.iter().all(|e| e.kind == FrameKind::Commit
        || e.kind == FrameKind::Identity
        || e.kind == FrameKind::Account));
    let s = c.stats().snapshot();
    assert!(s.reconnects >= 150 / 7, "{s:?}");
    assert_eq!(s.messages, 150);
    assert_eq!(
        s.bytes,
        events.iter().map(|e| e.bytes.len() as u64).sum::<u64>()
    );
    assert_eq!(s.decode_errors, 0);
    relay.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotation_moves_past_a_dead_host_and_a_5xx_host() {
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    }; // closed again: connections are refused
    let mut bad = RelayConfig::default();
    bad.faults.reject_upgrades = usize::MAX;
    let Some(failing) = start(bad).await else {
        return;
    };
    let Some(good) = start(RelayConfig::default()).await else {
        return;
    };
    let hosts = vec![format!("ws://{dead}"), failing.url(), good.url()];
    let mut c = FirehoseClient::new(fast(hosts)).unwrap();
    let events = next_n(&mut c, 150).await;
    assert!(events.iter().all(|e| e.host == 2));
    assert_eq!(events.last().unwrap().seq, Some(150));
    let s = c.stats().snapshot();
    assert!(s.connect_failures >= 2, "{s:?}");
    assert!(
        failing
            .stats()
            .rejected
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 1
    );
    failing.shutdown().await;
    good.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_cursor_survives_a_restart() {
    let Some(relay) = start(RelayConfig::default()).await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cursor");
    let config = || ClientConfig {
        cursor_store: Some(Arc::new(FileCursorStore::new(&path))),
        persist_every: Duration::ZERO,
        ..fast(vec![relay.url()])
    };
    {
        let mut c = FirehoseClient::new(config()).unwrap();
        for e in next_n(&mut c, 60).await {
            c.ack(e.seq.unwrap()).unwrap();
        }
        // Delivered but not acknowledged: must come again after the restart.
        let unacked = next_n(&mut c, 5).await;
        assert_eq!(unacked[0].seq, Some(61));
    }
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "60\n");
    let mut c = FirehoseClient::new(config()).unwrap();
    assert_eq!(c.cursor(), Some(60));
    let events = next_n(&mut c, 90).await;
    assert_eq!(
        events.iter().map(|e| e.seq.unwrap()).collect::<Vec<_>>(),
        (61..=150).collect::<Vec<_>>()
    );
    relay.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outdated_info_and_error_frames_are_events() {
    let Some(relay) = start(RelayConfig {
        window: 20,
        ..RelayConfig::default()
    })
    .await
    else {
        return;
    };
    let mut c = FirehoseClient::new(fast(vec![relay.url()])).unwrap();
    let e = next_n(&mut c, 21).await;
    assert_eq!(e[0].kind, FrameKind::Info);
    assert_eq!(e[0].notice.as_ref().unwrap().name, "OutdatedCursor");
    assert_eq!(e[1].seq, Some(131));
    assert_eq!(e[20].seq, Some(150));
    relay.shutdown().await;

    let mut cfg = RelayConfig::default();
    cfg.faults.error_after = Some((3, "InternalError".into()));
    let Some(relay2) = start(cfg).await else {
        return;
    };
    let mut c = FirehoseClient::new(fast(vec![relay2.url()])).unwrap();
    let e = next_n(&mut c, 8).await;
    let kinds: Vec<&str> = e.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(kinds[3], "error");
    assert_eq!(e[3].notice.as_ref().unwrap().name, "InternalError");
    // After the error the client reconnects and resumes after seq 3.
    assert_eq!(e[4].seq, Some(4));
    assert_eq!(kinds[7], "error");
    relay2.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_connection_is_detected_and_replaced() {
    // A relay that pauses 3 s before each frame; the client declares the connection dead after
    // 300 ms of silence (pings go unanswered only if the peer is stuck: here the relay task is
    // sleeping, not reading, so no pong comes back).
    let mut cfg = RelayConfig::default();
    cfg.faults.frame_delay = Some(Duration::from_secs(3));
    let Some(relay) = start(cfg).await else {
        return;
    };
    let mut config = fast(vec![relay.url()]);
    config.ping_interval = Duration::from_millis(100);
    config.idle_timeout = Duration::from_millis(300);
    let mut c = FirehoseClient::new(config).unwrap();
    let stats = c.stats();
    let waiter = tokio::spawn(async move { c.next().await });
    tokio::time::timeout(T, async {
        while stats.snapshot().reconnects < 2 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("no reconnect after idle timeouts");
    waiter.abort();
    relay.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_over_the_size_limit_is_counted_not_delivered() {
    let Some(relay) = start(RelayConfig::default()).await else {
        return;
    };
    // Every frame of the capture is larger than this (a DID alone is 32 bytes).
    let mut config = fast(vec![relay.url()]);
    config.max_message_bytes = 64;
    let mut c = FirehoseClient::new(config).unwrap();
    let stats = c.stats();
    let waiter = tokio::spawn(async move { c.next().await });
    tokio::time::timeout(T, async {
        while stats.snapshot().decode_errors < 2 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("oversized messages not counted");
    waiter.abort();
    let s = stats.snapshot();
    assert_eq!(s.messages, 0, "{s:?}");
    assert!(s.reconnects >= 1, "{s:?}");
    relay.shutdown().await;
}

/// Zero copy from the socket to the event, checked by pointer on a real connection: the relay
/// writes the frames back to back, so frames that arrived in one socket read and were handed out
/// without a copy are slices of one buffer, each starting exactly one WebSocket header after the
/// previous one ends (2 bytes for payloads under 126, 4 under 65,536, else 10: server frames are
/// unmasked). A copy per message would put each in its own allocation, whose distance from the
/// previous one is never 2 or 4 bytes (an allocator's chunk header alone is 8), so it would find
/// no adjacent pair. Each socket read starts a new chain (tungstenite allocates a fresh buffer
/// when the old one is still shared with frames the caller holds), so how many pairs are adjacent
/// depends on how many frames each read brought (23 of 149 on an idle machine): the test asks
/// for a few.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_are_slices_of_the_socket_read_buffer() {
    let Some(relay) = start(RelayConfig::default()).await else {
        return;
    };
    let expected = frames().unwrap();
    let mut c = FirehoseClient::new(fast(vec![relay.url()])).unwrap();
    let events = next_n(&mut c, 150).await;
    let ws_header = |len: usize| match len {
        0..=125 => 2,
        126..=65535 => 4,
        _ => 10,
    };
    let mut adjacent = 0;
    for pair in events.windows(2) {
        let (a, b) = (&pair[0].bytes, &pair[1].bytes);
        let end = a.as_ptr() as usize + a.len();
        if b.as_ptr() as usize == end + ws_header(b.len()) {
            adjacent += 1;
        }
    }
    // The frames are the relay's, in order (its seq splice changes only the seq's width).
    for (e, f) in events.iter().zip(&expected) {
        assert!(e.bytes.len().abs_diff(f.len()) <= 8);
        assert_eq!(e.bytes[..24], f[..24]);
    }
    eprintln!(
        "{adjacent} of {} consecutive frames adjacent",
        events.len() - 1
    );
    assert!(
        adjacent >= 5,
        "only {adjacent} of {} consecutive frames share a read buffer",
        events.len() - 1
    );
    relay.shutdown().await;
}

/// Issue 40: a relay that sends an oversized message on every connection got a reconnect loop
/// with no backoff (781 reconnects in 100 s): the oversized message was "not the relay's
/// fault". A connection that ends on a protocol or size error now counts as unhealthy, so the
/// backoff grows. A local server that sends one oversized message per connection, then waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_repeating_an_oversized_message_gets_backoff() {
    use futures_util::{SinkExt, StreamExt};
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
    use tokio_tungstenite::tungstenite::Message;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}", listener.local_addr().unwrap());
    let connections = Arc::new(AtomicUsize::new(0));
    let n = connections.clone();
    let server = tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            n.fetch_add(1, Relaxed);
            tokio::spawn(async move {
                let Ok(mut ws) = tokio_tungstenite::accept_async(tcp).await else {
                    return;
                };
                let _ = ws.send(Message::Binary(vec![0u8; 4096].into())).await;
                while let Some(Ok(_)) = ws.next().await {}
            });
        }
    });
    let config = ClientConfig {
        backoff: Backoff {
            base: Duration::from_millis(100),
            max: Duration::from_millis(400),
            healthy_after: Duration::from_secs(60),
        },
        start_cursor: Some(0),
        max_message_bytes: 1024,
        ..ClientConfig::with_hosts([url])
    };
    let mut c = FirehoseClient::new(config).unwrap();
    let stats = c.stats();
    let waiter = tokio::spawn(async move { c.next().await });
    tokio::time::sleep(Duration::from_millis(2000)).await;
    waiter.abort();
    server.abort();
    let s = stats.snapshot();
    let seen = connections.load(Relaxed);
    // Backoff: delays up to 100, 200, then 400 ms (full jitter): about ten connections in 2 s.
    // Without it, one every few milliseconds.
    assert!(s.decode_errors >= 2, "oversized messages counted: {s:?}");
    assert!(seen <= 40, "{seen} connections in 2 s: no backoff ({s:?})");
}

/// Issue 39: a client told to give up on permanent failures ends with the error once —
/// `FutureCursor` for a cursor past the relay's head, a 4xx at the upgrade — and without that
/// setting sees the same as before (the error frame as an event); a 5xx is retried either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permanent_failures_end_the_stream_when_asked_and_transient_ones_are_retried() {
    let Some(relay) = start(RelayConfig::default()).await else {
        return;
    };
    let past_head = || ClientConfig {
        start_cursor: Some(1_000_000),
        ..fast(vec![relay.url()])
    };
    let mut c = FirehoseClient::new(ClientConfig {
        give_up_on_permanent: true,
        ..past_head()
    })
    .unwrap();
    match tokio::time::timeout(T, c.next_checked()).await.unwrap() {
        Err(ClientError::Relay { name, .. }) => assert_eq!(name, "FutureCursor"),
        other => panic!("{other:?}"),
    }
    let mut c = FirehoseClient::new(past_head()).unwrap();
    let e = tokio::time::timeout(T, c.next_checked())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(e.kind, FrameKind::Error, "an event, as before");
    assert_eq!(e.notice.unwrap().name, "FutureCursor");
    relay.shutdown().await;

    for (status, permanent) in [(404, true), (503, false), (429, false)] {
        let mut cfg = RelayConfig::default();
        cfg.faults.reject_upgrades = usize::MAX;
        cfg.faults.reject_status = status;
        let Some(relay) = start(cfg).await else {
            return;
        };
        let mut c = FirehoseClient::new(ClientConfig {
            give_up_on_permanent: true,
            ..fast(vec![relay.url()])
        })
        .unwrap();
        let r = tokio::time::timeout(Duration::from_secs(2), c.next_checked()).await;
        let failures = c.stats().snapshot().connect_failures;
        if permanent {
            match r {
                Ok(Err(ClientError::Refused { status: s, .. })) => assert_eq!(s, status),
                other => panic!("{status}: {other:?}"),
            }
            assert_eq!(failures, 1, "{status}: not retried");
        } else {
            assert!(r.is_err(), "{status}: still waiting, not ended: {r:?}");
            assert!(failures >= 3, "{status}: retried ({failures} attempts)");
        }
        relay.shutdown().await;
    }
}
