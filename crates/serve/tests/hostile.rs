//! The upstream source against a hostile relay on loopback: messages over the size limit, text
//! frames, garbage, seqs that go backwards or are forged, `FutureCursor`, and no relay at all.
//! Each scenario is one that stopped or blinded ingest before (issue 17, items 2, 3, 4, 6).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::result_large_err)]

use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use riptide_cbor::{write_int, write_map_header, write_text};
use riptide_client::Backoff;
use riptide_serve::{
    ingest, upstream, IngestConfig, Log, Metrics, Store, TailLimits, Upstream, UpstreamConfig,
};
use tokio_tungstenite::tungstenite::handshake::server::{Request, Response};
use tokio_tungstenite::tungstenite::Message;

const T: Duration = Duration::from_secs(60);

/// An `#identity` frame with this seq (a real frame as far as ingest is concerned: it projects
/// to one identity event without verification).
fn identity(seq: i64) -> Vec<u8> {
    let mut out = Vec::new();
    riptide_firehose::encode::write_message_header(&mut out, "#identity");
    write_map_header(&mut out, 3);
    write_text(&mut out, "did");
    write_text(&mut out, "did:plc:aaaaaaaaaaaaaaaaaaaaaaaa");
    write_text(&mut out, "seq");
    write_int(&mut out, seq);
    write_text(&mut out, "time");
    write_text(&mut out, "2026-07-04T14:38:07.517Z");
    out
}

/// What the hostile relay sends: each item with the seq it stands at (sent when the client's
/// cursor is below it, or always when the client has none).
#[derive(Clone)]
enum Out {
    Bin(Vec<u8>),
    Text(&'static str),
    /// Close the connection here.
    Close,
}

struct Hostile {
    url: String,
    /// Each connection's cursor (`None`: live).
    cursors: Arc<Mutex<Vec<Option<u64>>>>,
}

/// Accepts a WebSocket upgrade, with the `cursor` its query asked for.
async fn accept(
    s: tokio::net::TcpStream,
) -> Option<(
    tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>,
    Option<u64>,
)> {
    let cursor = Arc::new(Mutex::new(None));
    let c = cursor.clone();
    let cb = move |req: &Request, resp: Response| {
        *c.lock().unwrap() = req.uri().query().and_then(|q| {
            q.split('&')
                .find_map(|kv| kv.strip_prefix("cursor="))
                .and_then(|v| v.parse::<u64>().ok())
        });
        Ok(resp)
    };
    let ws = tokio_tungstenite::accept_hdr_async(s, cb).await.ok()?;
    let cursor = *cursor.lock().unwrap();
    Some((ws, cursor))
}

/// A relay that plays `script` on every connection from the client's cursor, then holds the
/// connection open.
async fn hostile(script: Vec<(u64, Out)>) -> Hostile {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}", l.local_addr().unwrap());
    let cursors: Arc<Mutex<Vec<Option<u64>>>> = Arc::default();
    let seen = cursors.clone();
    let script = Arc::new(script);
    tokio::spawn(async move {
        loop {
            let Ok((s, _)) = l.accept().await else { return };
            let (script, seen) = (script.clone(), seen.clone());
            tokio::spawn(async move {
                let Some((mut ws, cursor)) = accept(s).await else {
                    return;
                };
                seen.lock().unwrap().push(cursor);
                for (seq, out) in script.iter() {
                    if cursor.is_some_and(|c| *seq <= c) {
                        continue;
                    }
                    let r = match out {
                        Out::Bin(b) => ws.send(Message::binary(b.clone())).await,
                        Out::Text(t) => ws.send(Message::text(*t)).await,
                        Out::Close => {
                            let _ = ws.close(None).await;
                            return;
                        }
                    };
                    if r.is_err() {
                        return;
                    }
                }
                while let Some(Ok(_)) = ws.next().await {}
            });
        }
    });
    Hostile { url, cursors }
}

fn fast(hosts: Vec<String>) -> UpstreamConfig {
    let mut c = UpstreamConfig::new(hosts);
    c.backoff = Backoff {
        base: Duration::from_millis(50),
        max: Duration::from_millis(500),
        healthy_after: Duration::from_secs(60),
    };
    c
}

/// Runs the upstream source from `cursor` against `url` and collects what it hands ingest until
/// `done` says enough.
async fn collect(
    url: &str,
    cursor: Option<u64>,
    done: impl Fn(&[(u64, bool)]) -> bool,
) -> (Vec<(u64, bool)>, Arc<Metrics>) {
    collect_with(fast(vec![url.to_owned()]), cursor, done).await
}

/// [`collect`] with the source's configuration.
async fn collect_with(
    cfg: UpstreamConfig,
    cursor: Option<u64>,
    done: impl Fn(&[(u64, bool)]) -> bool,
) -> (Vec<(u64, bool)>, Arc<Metrics>) {
    let metrics = Arc::new(Metrics::default());
    let (tx, mut rx) = tokio::sync::mpsc::channel(16);
    let source = tokio::spawn(upstream::run(cfg, cursor, metrics.clone(), tx));
    let mut got = Vec::new();
    while !done(&got) {
        let up = tokio::time::timeout(T, rx.recv())
            .await
            .unwrap_or_else(|_| panic!("stalled after {got:?}"))
            .unwrap();
        // (seq, is a cursor reset)
        got.push((up.seq(), matches!(up, Upstream::CursorReset(_))));
    }
    source.abort();
    (got, metrics)
}

fn seqs(got: &[(u64, bool)]) -> Vec<u64> {
    got.iter().filter(|g| !g.1).map(|g| g.0).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_over_the_size_limit_is_skipped_counted_and_ingest_goes_on() {
    // Seq 3 is 16 MiB + 1: refused unread by the client. Before, the client reconnected at
    // cursor 2 forever and no metric moved.
    let big = vec![0u8; (16 << 20) + 1];
    let relay = hostile(vec![
        (1, Out::Bin(identity(1))),
        (2, Out::Bin(identity(2))),
        (3, Out::Bin(big)),
        (4, Out::Bin(identity(4))),
        (5, Out::Bin(identity(5))),
    ])
    .await;
    let (got, m) = collect(&relay.url, Some(0), |g| seqs(g).last() == Some(&5)).await;
    assert_eq!(seqs(&got), [1, 2, 4, 5]);
    let text = m.render(&[]);
    assert!(
        text.contains("riptide_upstream_dropped_total{reason=\"oversized\"} 1\n"),
        "{text}"
    );
    // The second connection resumed past the oversized message.
    assert_eq!(*relay.cursors.lock().unwrap(), [Some(0), Some(3)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_frames_and_garbage_are_counted_where_metrics_show_them() {
    let relay = hostile(vec![
        (1, Out::Bin(identity(1))),
        (1, Out::Text("{\"not\":\"a frame\"}")),
        (1, Out::Bin(vec![0xff, 0x00, 0x13])),
        (2, Out::Bin(identity(2))),
    ])
    .await;
    let (got, m) = collect(&relay.url, None, |g| seqs(g).last() == Some(&2)).await;
    assert_eq!(seqs(&got), [1, 2]);
    let text = m.render(&[]);
    assert!(
        text.contains("riptide_upstream_dropped_total{reason=\"text\"} 1\n"),
        "{text}"
    );
    // Garbage is a verdict like any frame that fails before verification, not "unsequenced".
    assert!(
        text.contains("riptide_verdicts_total{verdict=\"malformed\"} 1\n"),
        "{text}"
    );
    assert!(
        text.contains("riptide_upstream_unsequenced_total 0\n"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_of_a_known_kind_without_a_seq_is_a_verdict_not_unsequenced() {
    // Issue 40: a `#commit` header over a body that is not a commit (here: no seq, no repo) was
    // counted only as "unsequenced"; it is a frame that does not decode, like any garbage.
    let mut commit_without_seq = Vec::new();
    riptide_firehose::encode::write_message_header(&mut commit_without_seq, "#commit");
    write_map_header(&mut commit_without_seq, 1);
    write_text(&mut commit_without_seq, "did");
    write_text(&mut commit_without_seq, "did:plc:aaaaaaaaaaaaaaaaaaaaaaaa");
    let mut script = vec![(1, Out::Bin(identity(1)))];
    for _ in 0..50 {
        script.push((1, Out::Bin(commit_without_seq.clone())));
        script.push((1, Out::Bin(vec![0xff, 0x00, 0x13])));
    }
    script.push((2, Out::Bin(identity(2))));
    let relay = hostile(script).await;
    let (got, m) = collect(&relay.url, None, |g| seqs(g).last() == Some(&2)).await;
    assert_eq!(seqs(&got), [1, 2]);
    let text = m.render(&[]);
    assert!(
        text.contains("riptide_verdicts_total{verdict=\"malformed\"} 100\n"),
        "{text}"
    );
    assert!(
        text.contains("riptide_upstream_unsequenced_total 0\n"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_upstream_is_counted_on_every_attempt_and_not_ready() {
    // A port nothing listens on (bound, then dropped).
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let url = format!("ws://127.0.0.1:{port}");
    let metrics = Arc::new(Metrics::default());
    let (tx, _rx) = tokio::sync::mpsc::channel(16);
    let source = tokio::spawn(upstream::run(fast(vec![url]), None, metrics.clone(), tx));
    let until = tokio::time::Instant::now() + T;
    loop {
        let text = metrics.render(&[]);
        let failures = text
            .lines()
            .find_map(|l| l.strip_prefix("riptide_upstream_connect_failures_total "))
            .map(|v| v.parse::<u64>().unwrap())
            .unwrap();
        if failures >= 3 {
            assert!(text.contains("riptide_upstream_connected 0\n"));
            break;
        }
        assert!(tokio::time::Instant::now() < until, "{text}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let dir = tempfile::tempdir().unwrap();
    let (store, r) = Store::open(dir.path(), 0).unwrap();
    let app = riptide_serve::App::new(
        Arc::new(Log::new(store, r.next_seq, TailLimits::default())),
        metrics.clone(),
        riptide_serve::ServerConfig::default(),
    );
    let why = riptide_serve::server::readiness(&app).unwrap_err();
    assert!(
        why.contains("upstream not connected") && why.contains(&format!("127.0.0.1:{port}")),
        "{why}"
    );
    source.abort();
    // A URL that cannot work is refused at start, not retried forever.
    let (tx, _rx) = tokio::sync::mpsc::channel(1);
    let bad = upstream::run(fast(vec!["ws://127.0.0.1:99999".into()]), None, metrics, tx);
    assert!(tokio::time::timeout(T, bad).await.unwrap().is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn future_cursor_is_said_counted_and_not_ready() {
    let relay = hostile(vec![
        (
            u64::MAX,
            Out::Bin(riptide_firehose::encode::error_frame(
                "FutureCursor",
                "Cursor in the future.",
            )),
        ),
        (u64::MAX, Out::Close),
    ])
    .await;
    let metrics = Arc::new(Metrics::default());
    let (tx, _rx) = tokio::sync::mpsc::channel(16);
    let source = tokio::spawn(upstream::run(
        fast(vec![relay.url.clone()]),
        Some(1000),
        metrics.clone(),
        tx,
    ));
    let until = tokio::time::Instant::now() + T;
    while metrics.upstream_future_cursor.load(Relaxed) < 2 {
        assert!(tokio::time::Instant::now() < until);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(metrics.upstream_behind.load(Relaxed));
    source.abort();
}

/// Ingest without verification into a fresh store at `dir`: its log, its metrics, the sender
/// its frames go to, and its handle.
fn start_ingest(
    dir: &std::path::Path,
) -> (
    Arc<Log>,
    Arc<Metrics>,
    tokio::sync::mpsc::Sender<Upstream>,
    riptide_serve::IngestHandle,
) {
    let (store, resume) = Store::open(dir, 0).unwrap();
    let log = Arc::new(Log::new(store, resume.next_seq, TailLimits::default()));
    let metrics = Arc::new(Metrics::default());
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    let cfg = IngestConfig {
        keys: None,
        workers: 2,
        max_batch: 16,
        dictionary: None,
        stateful: false,
    };
    let h = ingest::spawn(cfg, log.clone(), metrics.clone(), resume, rx).unwrap();
    (log, metrics, tx, h)
}

/// Ingest (no verification) from the hostile relay into a fresh store, until `n` frames were
/// stored; the store's resume point afterwards and the metrics.
async fn ingest_from(script: Vec<(u64, Out)>, n: u64) -> (riptide_serve::Resume, Arc<Metrics>) {
    let relay = hostile(script).await;
    let dir = tempfile::tempdir().unwrap();
    let (log, metrics, tx, h) = start_ingest(dir.path());
    let source = tokio::spawn(upstream::run(
        fast(vec![relay.url.clone()]),
        None,
        metrics.clone(),
        tx,
    ));
    let until = tokio::time::Instant::now() + T;
    while metrics.events_stored.load(Relaxed) < n {
        assert!(
            tokio::time::Instant::now() < until,
            "stored {} of {n}",
            metrics.events_stored.load(Relaxed)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    source.abort();
    let _ = source.await;
    let summary = tokio::task::spawn_blocking(move || h.join())
        .await
        .unwrap()
        .unwrap();
    drop(log);
    let (_, resume) = Store::open(dir.path(), 0).unwrap();
    assert_eq!(resume.next_seq, summary.resume.next_seq);
    (resume, metrics)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_seq_does_not_poison_the_cursor() {
    // One frame claims seq 2^63 − 1; the relay's real numbering goes on at 11. Before, 11 and 12
    // were skipped as duplicates and the stored cursor stayed at 2^63 − 1 for ever.
    let forged = i64::MAX;
    let (resume, m) = ingest_from(
        vec![
            (1, Out::Bin(identity(10))),
            (2, Out::Bin(identity(forged))),
            (3, Out::Bin(identity(11))),
            (4, Out::Bin(identity(12))),
        ],
        4,
    )
    .await;
    assert_eq!(resume.upstream_cursor, Some(12));
    assert_eq!(m.frames_duplicate.load(Relaxed), 0);
    assert_eq!(m.upstream_seq_resets.load(Relaxed), 1);
    assert_eq!(m.events_stored.load(Relaxed), 4);
    let text = m.render(&[]);
    assert!(
        text.contains("riptide_upstream_seq_resets_total 1\n"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_reset_mid_connection_is_followed_with_nothing_dropped() {
    // A relay restarted from scratch while the stream ran (as a proxy in front of it would show
    // it): 500, 501, then 1, 2, 3.
    let script: Vec<(u64, Out)> = [500, 501, 1, 2, 3]
        .into_iter()
        .enumerate()
        .map(|(i, s)| (i as u64 + 1, Out::Bin(identity(s))))
        .collect();
    let (resume, m) = ingest_from(script, 5).await;
    assert_eq!(resume.upstream_cursor, Some(3));
    assert_eq!(m.upstream_seq_resets.load(Relaxed), 1);
    assert_eq!(m.frames_duplicate.load(Relaxed), 0);
    // And the gauge says where the store is from the start of the next run.
    assert_eq!(m.upstream_seq.load(Relaxed), 3);
    // Freshness: the relay's time of the latest event (every frame here says 14:38:07.517).
    let text = m.render(&[]);
    assert!(
        text.contains("riptide_upstream_event_time_seconds 1783175887.517\n"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_the_store_holds_are_still_skipped_after_a_reconnect() {
    // Across connections, seqs at or below the cursor are duplicates, not a reset: a relay that
    // replays from further back than asked must not make ingest store anything twice.
    let metrics = Arc::new(Metrics::default());
    let relay = hostile(vec![
        (u64::MAX, Out::Bin(identity(1))),
        (u64::MAX, Out::Bin(identity(2))),
        (u64::MAX, Out::Bin(identity(3))),
    ])
    .await;
    let (tx, mut rx) = tokio::sync::mpsc::channel(16);
    let source = tokio::spawn(upstream::run(
        fast(vec![relay.url.clone()]),
        Some(2),
        metrics.clone(),
        tx,
    ));
    let mut got = Vec::new();
    while got.len() < 3 {
        let up = tokio::time::timeout(T, rx.recv()).await.unwrap().unwrap();
        got.push((up.seq(), matches!(up, Upstream::CursorReset(_))));
    }
    source.abort();
    // Handed on as they came (ingest's dispatcher skips 1 and 2), with no reset among them.
    assert_eq!(got, [(1, false), (2, false), (3, false)]);
    assert_eq!(metrics.upstream_seq_resets.load(Relaxed), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_upstream_seq_gauge_is_the_stores_from_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let (store, mut resume) = Store::open(dir.path(), 0).unwrap();
    resume.upstream_cursor = Some(77);
    let log = Arc::new(Log::new(store, resume.next_seq, TailLimits::default()));
    let metrics = Arc::new(Metrics::default());
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    let h = ingest::spawn(
        IngestConfig {
            keys: None,
            workers: 1,
            max_batch: 1,
            dictionary: None,
            stateful: false,
        },
        log,
        metrics.clone(),
        resume,
        rx,
    )
    .unwrap();
    // Before any frame: not 0, as it was until the first batch.
    assert_eq!(metrics.upstream_seq.load(Relaxed), 77);
    drop(tx);
    tokio::task::spawn_blocking(move || h.join())
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_frame_is_counted_as_malformed_not_taken_for_a_cursor_reset() {
    // A corpus file may hold a zero-length record (`serve --ingest-file` hands it on as a frame).
    // The cursor reset used to travel as a frame with no bytes, so such a record reset the
    // cursor and was neither counted nor said.
    let dir = tempfile::tempdir().unwrap();
    let (_log, metrics, tx, h) = start_ingest(dir.path());
    for (seq, frame) in [(1, identity(1)), (2, Vec::new()), (3, identity(3))] {
        tx.send((seq, bytes::Bytes::from(frame)).into())
            .await
            .unwrap();
    }
    drop(tx);
    let summary = tokio::task::spawn_blocking(move || h.join())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(metrics.frames_in.load(Relaxed), 3);
    assert_eq!(
        metrics.verdict_count(riptide_firehose::verify::Verdict::Malformed),
        1
    );
    assert_eq!(metrics.events_stored.load(Relaxed), 2);
    assert_eq!(summary.resume.upstream_cursor, Some(3));
}

/// An `#identity` frame with this seq and relay `time` (Unix microseconds).
fn identity_at(seq: i64, time_us: i64) -> Vec<u8> {
    let mut out = Vec::new();
    riptide_firehose::encode::write_message_header(&mut out, "#identity");
    write_map_header(&mut out, 3);
    write_text(&mut out, "did");
    write_text(&mut out, "did:plc:aaaaaaaaaaaaaaaaaaaaaaaa");
    write_text(&mut out, "seq");
    write_int(&mut out, seq);
    write_text(&mut out, "time");
    let t = riptide_syntax::format_utc(time_us as u64, riptide_syntax::Precision::Millis);
    write_text(&mut out, &t);
    out
}

/// A relay whose first connection sends `first` and closes (the forged frame last), and whose
/// later connections serve `log` (seq, frame) as a real relay does: after the cursor, or, for a
/// cursor past its head, a `FutureCursor` error frame and a close. `honours_cursor: false`:
/// later connections send all of `log` whatever the cursor (a relay that ignores it).
async fn relay_after_forgery(
    first: Vec<Vec<u8>>,
    log: Vec<(u64, Vec<u8>)>,
    honours_cursor: bool,
) -> Hostile {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}", l.local_addr().unwrap());
    let cursors: Arc<Mutex<Vec<Option<u64>>>> = Arc::default();
    let seen = cursors.clone();
    let (first, log) = (Arc::new(first), Arc::new(log));
    tokio::spawn(async move {
        loop {
            let Ok((s, _)) = l.accept().await else { return };
            let (first, log, seen) = (first.clone(), log.clone(), seen.clone());
            tokio::spawn(async move {
                let Some((mut ws, cursor)) = accept(s).await else {
                    return;
                };
                let n = {
                    let mut s = seen.lock().unwrap();
                    s.push(cursor);
                    s.len()
                };
                if n == 1 {
                    for f in first.iter() {
                        let _ = ws.send(Message::binary(f.clone())).await;
                    }
                    let _ = ws.close(None).await;
                    return;
                }
                let head = log.last().map_or(0, |l| l.0);
                if honours_cursor && cursor.is_some_and(|c| c > head) {
                    let e = riptide_firehose::encode::error_frame(
                        "FutureCursor",
                        "cursor in the future",
                    );
                    let _ = ws.send(Message::binary(e)).await;
                    let _ = ws.close(None).await;
                    return;
                }
                for (seq, f) in log.iter() {
                    if honours_cursor && cursor.is_some_and(|c| *seq <= c) {
                        continue;
                    }
                    if ws.send(Message::binary(f.clone())).await.is_err() {
                        return;
                    }
                }
                while let Some(Ok(_)) = ws.next().await {}
            });
        }
    });
    Hostile { url, cursors }
}

/// The forgery of issue 40 against a relay that honours cursors: the first connection (asked
/// from 8) sends seqs 9, 10 and a forged 2^63 − 1 last, then closes; later connections serve
/// `log` (an `#identity` a seq) after their cursor, or `FutureCursor` past its end. The source
/// runs with a one-second `FutureCursor` grace until the last of `log` arrives: what it handed
/// ingest, its metrics, and the cursor of each connection.
async fn forged_last_seq_then(
    log: std::ops::RangeInclusive<u64>,
) -> (Vec<(u64, bool)>, Arc<Metrics>, Vec<Option<u64>>) {
    let now = riptide_serve::now_us();
    let last = *log.end();
    let relay = relay_after_forgery(
        vec![
            identity_at(9, now),
            identity_at(10, now),
            identity_at(i64::MAX, now),
        ],
        log.map(|s| (s, identity_at(s as i64, now))).collect(),
        true,
    )
    .await;
    let mut cfg = fast(vec![relay.url.clone()]);
    cfg.future_cursor_grace = Duration::from_secs(1);
    let (got, metrics) = collect_with(cfg, Some(8), |g| g.last() == Some(&(last, false))).await;
    let cursors = relay.cursors.lock().unwrap().clone();
    (got, metrics, cursors)
}

/// Issue 40: a forged seq (2^63 − 1) that is the *last* frame of its connection became the cursor,
/// and a real relay then answered every reconnection with `FutureCursor` until an operator reset
/// it. Now, after the grace, the client resumes from the last seq the relay confirmed (10) and
/// ingest follows the relay's numbering from its next frame: nothing after 10 is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_last_seq_answered_with_future_cursor_is_recovered_from() {
    let (got, metrics, cursors) = forged_last_seq_then(9..=14).await;
    let forged = i64::MAX as u64;
    assert_eq!(
        got,
        [
            (9, false),
            (10, false),
            (forged, false),
            (11, true),
            (11, false),
            (12, false),
            (13, false),
            (14, false)
        ]
    );
    assert_eq!(cursors[0], Some(8));
    assert_eq!(
        cursors[1],
        Some(forged),
        "the client first asks from the forged seq"
    );
    assert_eq!(
        cursors.last(),
        Some(&Some(10)),
        "then from the last confirmed one"
    );
    assert!(metrics.upstream_future_cursor.load(Relaxed) >= 1);
    let text = metrics.render(&[]);
    assert!(
        text.contains("riptide_upstream_cursor_recoveries_total{reason=\"future-cursor\"} 1\n"),
        "{text}"
    );
}

/// The same forgery against a relay that ignores cursors (the campaign's): every later frame was
/// a "duplicate" for ever. A frame at or below the cursor whose relay time is newer than anything
/// stored cannot be a duplicate: ingest follows the relay from it. (The relay's clock here is a
/// minute ahead of ours, so its frames are surely newer than the last one stored.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_below_a_forged_cursor_that_are_newer_than_the_store_are_followed() {
    let now = riptide_serve::now_us();
    let later = now + 60_000_000;
    let relay = relay_after_forgery(
        vec![identity_at(10, now), identity_at(i64::MAX, now)],
        (11..=13)
            .map(|s| (s, identity_at(s as i64, later)))
            .collect(),
        false,
    )
    .await;
    let mut cfg = fast(vec![relay.url.clone()]);
    cfg.clock_slack = Duration::from_secs(1);
    let (got, metrics) = collect_with(cfg, None, |g| g.last() == Some(&(13, false))).await;
    let forged = i64::MAX as u64;
    assert_eq!(
        got,
        [
            (10, false),
            (forged, false),
            (11, true),
            (11, false),
            (12, false),
            (13, false)
        ]
    );
    let text = metrics.render(&[]);
    assert!(
        text.contains("riptide_upstream_cursor_recoveries_total{reason=\"live-below-cursor\"} 1\n"),
        "{text}"
    );
}

/// Issue 40: a relay that sends the same frames five times on one connection had each pass taken
/// for a relay reset and stored again (4,164 duplicates from 5 × 1,000 frames without
/// verification). A frame that comes again with the same seq and bytes is a replay: skipped and
/// counted, never a reset. A new frame after the replays is stored as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_replaying_on_one_connection_is_not_served_twice() {
    let mut script = Vec::new();
    for pass in 0..5u64 {
        for s in 1..=3 {
            script.push((pass * 3 + s, Out::Bin(identity(s as i64))));
        }
    }
    script.push((16, Out::Bin(identity(4))));
    let (resume, m) = ingest_from(script, 4).await;
    assert_eq!(resume.upstream_cursor, Some(4));
    assert_eq!(m.events_stored.load(Relaxed), 4);
    assert_eq!(m.upstream_replayed.load(Relaxed), 12);
    assert_eq!(m.frames_duplicate.load(Relaxed), 12);
    assert_eq!(m.upstream_seq_resets.load(Relaxed), 0);
    let text = m.render(&[]);
    assert!(
        text.contains("riptide_upstream_replayed_total 12\n"),
        "{text}"
    );
}

/// When the relay is behind even the last confirmed seq (it was reset to a lower numbering), the
/// second recovery goes live and follows the relay from its first frame.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_behind_the_confirmed_seq_too_is_followed_live() {
    let (got, metrics, cursors) = forged_last_seq_then(1..=5).await;
    let forged = i64::MAX as u64;
    assert_eq!(
        got,
        [
            (9, false),
            (10, false),
            (forged, false),
            (1, true),
            (1, false),
            (2, false),
            (3, false),
            (4, false),
            (5, false)
        ]
    );
    assert!(cursors.contains(&Some(10)), "{cursors:?}");
    assert_eq!(cursors.last(), Some(&None), "{cursors:?}");
    let text = metrics.render(&[]);
    assert!(
        text.contains("riptide_upstream_cursor_recoveries_total{reason=\"future-cursor\"} 2\n"),
        "{text}"
    );
}
