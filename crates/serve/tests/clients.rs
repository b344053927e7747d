//! Hostile and struggling clients against `/subscribe` on loopback: protocol violations get the
//! close codes RFC 6455 asks for (on `subscribeEvents` too), a reader that pauses is slowed rather than cut, and connection
//! limits and the header deadline hold (issue 17, items 1, 7, 10).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use riptide_serve::{App, ConnLimits, Metrics, ServerConfig};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;

const T: Duration = Duration::from_secs(60);

/// Serves `n` events of about `pad` bytes each (seqs 1..=n, in the in-memory tail) behind the
/// connection limits.
async fn serve(
    n: u64,
    pad: usize,
    config: ServerConfig,
    limits: ConnLimits,
) -> (SocketAddr, Arc<App>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let log = common::open_log(dir.path());
    let pad = "x".repeat(pad);
    log.publish(&(1..=n).map(|i| common::padded(i, &pad)).collect::<Vec<_>>());
    let app = App::new(log, Arc::new(Metrics::default()), config);
    (common::listen_limited(app.clone(), limits).await, app, dir)
}

/// A WebSocket handshake by hand on `path`, so that the frames after it can break the rules.
async fn raw_ws_at(addr: SocketAddr, path: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "GET {path} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n\
         Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
         Sec-WebSocket-Version: 13\r\n\r\n"
    );
    s.write_all(head.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    let mut b = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut b).await.unwrap();
        buf.push(b[0]);
    }
    assert!(
        buf.starts_with(b"HTTP/1.1 101"),
        "{}",
        String::from_utf8_lossy(&buf)
    );
    s
}

/// A client frame: `first` (FIN, RSV, opcode), masked unless `unmasked`.
fn frame(first: u8, payload: &[u8], unmasked: bool) -> Vec<u8> {
    let mut f = vec![first];
    let key = [1u8, 2, 3, 4];
    let len = payload.len();
    let mask_bit = if unmasked { 0 } else { 0x80 };
    if len < 126 {
        f.push(mask_bit | len as u8);
    } else {
        f.push(mask_bit | 126);
        f.extend_from_slice(&(len as u16).to_be_bytes());
    }
    if unmasked {
        f.extend_from_slice(payload);
    } else {
        f.extend_from_slice(&key);
        f.extend(payload.iter().enumerate().map(|(i, b)| b ^ key[i % 4]));
    }
    f
}

/// The code of the close frame the server sends (skipping any data frames), or `None` if the
/// connection ends without one.
async fn close_code(s: &mut TcpStream) -> Option<u16> {
    let mut data = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        // Parse what is there.
        let mut at = 0;
        while data.len() >= at + 2 {
            let op = data[at] & 0x0f;
            let mut len = (data[at + 1] & 0x7f) as usize;
            let mut head = 2;
            if len == 126 {
                if data.len() < at + 4 {
                    break;
                }
                len = u16::from_be_bytes([data[at + 2], data[at + 3]]) as usize;
                head = 4;
            } else if len == 127 {
                if data.len() < at + 10 {
                    break;
                }
                len = u64::from_be_bytes(data[at + 2..at + 10].try_into().unwrap()) as usize;
                head = 10;
            }
            if data.len() < at + head + len {
                break;
            }
            if op == 0x8 {
                let p = &data[at + head..at + head + len];
                return Some(u16::from_be_bytes([p[0], p[1]]));
            }
            at += head + len;
        }
        match tokio::time::timeout(T, s.read(&mut buf))
            .await
            .expect("timed out")
        {
            Ok(0) | Err(_) => return None,
            Ok(n) => data.extend_from_slice(&buf[..n]),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protocol_violations_get_rfc6455_close_codes() {
    // The same on both wires: the connection's reader is shared (`server::reader`).
    for path in ["/subscribe", riptide_serve::v2::SUBSCRIBE_EVENTS] {
        protocol_violations_on(path).await;
    }
}

async fn protocol_violations_on(path: &str) {
    let (addr, app, _dir) = serve(0, 0, ServerConfig::default(), ConnLimits::default()).await;
    let cases: [(&str, Vec<u8>, u16); 6] = [
        ("unmasked frame", frame(0x81, b"{}", true), 1002),
        (
            "invalid UTF-8 text",
            frame(0x81, &[0xff, 0xfe, 0xfd], false),
            1007,
        ),
        ("RSV1 set", frame(0xC1, b"{}", false), 1002),
        ("reserved opcode 3", frame(0x83, b"{}", false), 1002),
        ("ping over 125 bytes", frame(0x89, &[0u8; 126], false), 1002),
        (
            "close code 999",
            frame(0x88, &999u16.to_be_bytes(), false),
            1002,
        ),
    ];
    for (what, bytes, want) in cases {
        let mut s = raw_ws_at(addr, path).await;
        s.write_all(&bytes).await.unwrap();
        assert_eq!(close_code(&mut s).await, Some(want), "{path}: {what}");
    }
    assert!(app.metrics.client_errors.load(Relaxed) >= 5, "{path}");
    if path != "/subscribe" {
        assert!(app.v2.metrics.client_errors.load(Relaxed) >= 5, "{path}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaying_reader_that_pauses_is_slowed_not_dropped() {
    // 3,000 events of 16 KiB: far more than the socket buffers hold, so the server's writes
    // block while the reader pauses for 8 s (longer than the old 5 s write timeout) — as a
    // replaying reader on a loaded host does. It is not far behind (the v2 rule's 100,000), so it
    // must get everything.
    let n = 3000;
    let (addr, app, _dir) =
        serve(n, 16 << 10, ServerConfig::default(), ConnLimits::default()).await;
    let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/subscribe?cursor=1"))
        .await
        .unwrap();
    let mut next = 1u64;
    while next <= n {
        let msg = tokio::time::timeout(T, ws.next()).await.expect("timed out");
        let Some(Ok(Message::Text(t))) = msg else {
            panic!("at event {next}: {msg:?}")
        };
        let v: Value = serde_json::from_str(t.as_str()).unwrap();
        assert_eq!(v["i"].as_u64(), Some(next));
        if next == 100 {
            tokio::time::sleep(Duration::from_secs(8)).await;
        }
        next += 1;
    }
    for r in ["write-timeout", "behind", "pong-timeout"] {
        assert_eq!(
            app.metrics.slow_drop_count(
                riptide_serve::metrics::SlowDrop::ALL
                    .into_iter()
                    .find(|d| d.as_str() == r)
                    .unwrap()
            ),
            0,
            "{r}"
        );
    }
}

async fn http_status(s: &mut TcpStream) -> Option<u16> {
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(T, s.read_to_end(&mut buf))
        .await
        .expect("timed out");
    let t = String::from_utf8_lossy(&buf);
    t.get(9..12).and_then(|c| c.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_limits_refuse_before_anything_inside_fails() {
    let limits = ConnLimits {
        max_connections: 6,
        per_ip: 4,
        header_timeout: Duration::from_secs(1),
    };
    let (addr, app, _dir) = serve(10, 10, ServerConfig::default(), limits).await;
    // Slowloris: half-sent requests hold their connections until the header deadline.
    let mut slow = Vec::new();
    for _ in 0..4 {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
            .await
            .unwrap();
        slow.push(s);
    }
    let until = tokio::time::Instant::now() + T;
    while app.metrics.connections.load(Relaxed) < 4 {
        assert!(tokio::time::Instant::now() < until);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // A fifth from the same address is over the per-IP limit: 503 and closed.
    let mut s = TcpStream::connect(addr).await.unwrap();
    assert_eq!(http_status(&mut s).await, Some(503));
    let text = app.metrics.render(&[]);
    assert!(
        text.contains("riptide_connections_refused_total{reason=\"per-ip\"} 1\n"),
        "{text}"
    );
    // The header deadline closes the slow ones; then ordinary requests are served again.
    for mut s in slow {
        let mut buf = Vec::new();
        let r = tokio::time::timeout(T, s.read_to_end(&mut buf))
            .await
            .expect("not closed");
        assert!(
            r.is_err() || buf.is_empty() || buf.starts_with(b"HTTP/1.1 4"),
            "{buf:?}"
        );
    }
    assert_eq!(app.metrics.header_timeouts.load(Relaxed), 4);
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(http_status(&mut s).await, Some(200));
    // Keep-alive: a second request is served, then the deadline holds between requests too. One
    // connection goes idle, one dribbles its third request's headers; both are closed.
    let mut idle = Vec::new();
    for dribble in [false, true] {
        let mut s = TcpStream::connect(addr).await.unwrap();
        for _ in 0..2 {
            s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                .await
                .unwrap();
            let mut buf = [0u8; 1024];
            let n = tokio::time::timeout(T, s.read(&mut buf))
                .await
                .unwrap()
                .unwrap();
            assert!(buf[..n].starts_with(b"HTTP/1.1 200"), "{:?}", &buf[..n]);
        }
        if dribble {
            s.write_all(b"GET /healthz HTTP/1.1\r\n").await.unwrap();
        }
        idle.push(s);
    }
    for mut s in idle {
        let mut buf = Vec::new();
        let r = tokio::time::timeout(T, s.read_to_end(&mut buf))
            .await
            .expect("an idle keep-alive connection was not closed");
        assert!(r.is_err() || buf.is_empty(), "{buf:?}");
    }
    assert_eq!(app.metrics.header_timeouts.load(Relaxed), 6);
    // Subscribers count too, and a complete request is not cut by the header deadline.
    let mut subs = Vec::new();
    for _ in 0..4 {
        let (ws, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/subscribe"))
            .await
            .unwrap();
        subs.push(ws);
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let mut s = TcpStream::connect(addr).await.unwrap();
    assert_eq!(http_status(&mut s).await, Some(503));
    for ws in &mut subs {
        // Still open: nothing but maybe a ping.
        if let Ok(m) = tokio::time::timeout(Duration::from_millis(100), ws.next()).await {
            assert!(matches!(m, Some(Ok(Message::Ping(_)))), "{m:?}");
        }
    }
}

/// A TCP connection to `addr` from the loopback address `from`.
async fn connect_from(from: [u8; 4], addr: SocketAddr) -> TcpStream {
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.bind(SocketAddr::from((from, 0))).unwrap();
    sock.connect(addr).await.unwrap()
}

/// The status of `GET path` on a fresh connection from `from` (`None`: closed unanswered).
async fn get_from(from: [u8; 4], addr: SocketAddr, path: &str) -> Option<u16> {
    let mut s = connect_from(from, addr).await;
    let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    if s.write_all(req.as_bytes()).await.is_err() {
        return None;
    }
    http_status(&mut s).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_answer_when_subscribers_fill_the_budget() {
    use riptide_serve::limits::{PROBE_PATHS, PROBE_RESERVE};
    // Issue 40's 10,000 idle subscribers, 1,000 from each of ten addresses, scaled down: three
    // addresses fill a budget of 12, each inside its per-IP limit of 4.
    let limits = ConnLimits {
        max_connections: 12,
        per_ip: 4,
        header_timeout: Duration::from_secs(5),
    };
    let (addr, app, _dir) = serve(10, 10, ServerConfig::default(), limits).await;
    let probes = common::listen_probes(app.clone(), Duration::from_secs(5)).await;
    let mut subs = Vec::new();
    for host in 2..=4u8 {
        for _ in 0..4 {
            let s = connect_from([127, 0, 0, host], addr).await;
            let (ws, _) = tokio_tungstenite::client_async(format!("ws://{addr}/subscribe"), s)
                .await
                .unwrap();
            subs.push(ws);
        }
    }
    assert_eq!(app.metrics.connections.load(Relaxed), 12);
    // The probes still answer, on the main port (the reserve) and on their own listener.
    for path in PROBE_PATHS {
        assert_eq!(
            get_from([127, 0, 0, 1], addr, path).await,
            Some(200),
            "{path}"
        );
        assert_eq!(
            get_from([127, 0, 0, 1], probes, path).await,
            Some(200),
            "{path}"
        );
        // Also from an address at its per-IP limit: the reserve has its own bound.
        assert_eq!(
            get_from([127, 0, 0, 2], addr, path).await,
            Some(200),
            "{path}"
        );
    }
    // Anything else in the reserve is refused, and counted; the probes listener has nothing else.
    assert_eq!(
        get_from([127, 0, 0, 5], addr, "/subscribe").await,
        Some(503)
    );
    let (status, _) = http_get(addr, "/xrpc/network.bsky.jetstream.subscribeEvents").await;
    assert_eq!(status, 503);
    let text = app.metrics.render(&[]);
    assert!(
        text.contains("riptide_connections_refused_total{reason=\"max-connections\"} 2\n"),
        "{text}"
    );
    assert_eq!(
        get_from([127, 0, 0, 1], probes, "/subscribe").await,
        Some(404)
    );
    // The reserve is bounded: with it held by idle connections (four from each address), the
    // next connection is refused before HTTP.
    let mut held = Vec::new();
    for i in 0..PROBE_RESERVE {
        held.push(connect_from([127, 0, 1, (i / 4) as u8 + 1], addr).await);
    }
    let until = tokio::time::Instant::now() + T;
    while app.metrics.connections.load(Relaxed) < (12 + PROBE_RESERVE) as i64 {
        assert!(tokio::time::Instant::now() < until);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(get_from([127, 0, 0, 1], addr, "/healthz").await, Some(503));
    // ... while the probes listener, outside both, still answers.
    assert_eq!(
        get_from([127, 0, 0, 1], probes, "/healthz").await,
        Some(200)
    );
    // The subscribers were never disturbed.
    for ws in &mut subs {
        if let Ok(m) = tokio::time::timeout(Duration::from_millis(50), ws.next()).await {
            assert!(matches!(m, Some(Ok(Message::Ping(_)))), "{m:?}");
        }
    }
}

/// `GET path` on a fresh connection from 127.0.0.1: the status and the body.
async fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(T, s.read_to_end(&mut buf))
        .await
        .expect("timed out");
    let t = String::from_utf8_lossy(&buf).into_owned();
    let status = t.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = t.split_once("\r\n\r\n").map_or("", |x| x.1).to_owned();
    (status, body)
}
