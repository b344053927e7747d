//! The archive reader against servers that misbehave in the ways a real one can: a planner whose
//! page does not advance, a refusal, a server that stays down, a quota answer with
//! `Retry-After`, a segment replaced between two ranges of one download. The server is a few
//! lines of HTTP/1.1 over a loopback socket, so that each answer is exactly what the test says;
//! the segments are written with `riptide-segment`'s writer. (Reading a real `riptide serve`,
//! with filters, the switch to live and an interrupted download, is `crates/cli/tests/
//! tail_archive.rs`.)
#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use riptide_client::{ArchiveConfig, ArchiveError, Backoff, Snapshot};
use riptide_segment::{write_segment, Kind, Row};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A request as the server saw it.
#[derive(Debug, Clone)]
struct Req {
    /// Method and target.
    line: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Req {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Serves `answer(n, request)` (n counts requests from 0) on a loopback port, one request a
/// connection.
async fn server(
    answer: impl Fn(usize, &Req) -> Vec<u8> + Send + Sync + 'static,
) -> (String, Arc<std::sync::Mutex<Vec<Req>>>) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (answer, seen2, n) = (
        Arc::new(answer),
        seen.clone(),
        Arc::new(AtomicUsize::new(0)),
    );
    tokio::spawn(async move {
        loop {
            let (mut s, _) = l.accept().await.unwrap();
            let (answer, seen, n) = (answer.clone(), seen2.clone(), n.clone());
            tokio::spawn(async move {
                let mut raw = Vec::new();
                let mut buf = [0u8; 4096];
                let end = loop {
                    let k = s.read(&mut buf).await.unwrap();
                    if k == 0 {
                        return;
                    }
                    raw.extend_from_slice(&buf[..k]);
                    if let Some(e) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
                        break e;
                    }
                };
                let head = String::from_utf8(raw[..end].to_vec()).unwrap();
                let mut lines = head.split("\r\n");
                let line = lines.next().unwrap().to_owned();
                let headers: Vec<(String, String)> = lines
                    .map(|l| {
                        let (k, v) = l.split_once(':').unwrap();
                        (k.trim().to_owned(), v.trim().to_owned())
                    })
                    .collect();
                let mut req = Req {
                    line,
                    headers,
                    body: raw[end + 4..].to_vec(),
                };
                let len: usize = req
                    .header("content-length")
                    .map_or(0, |v| v.parse().unwrap());
                while req.body.len() < len {
                    let k = s.read(&mut buf).await.unwrap();
                    req.body.extend_from_slice(&buf[..k]);
                }
                let i = n.fetch_add(1, Ordering::SeqCst);
                let resp = answer(i, &req);
                seen.lock().unwrap().push(req);
                let _ = s.write_all(&resp).await;
            });
        }
    });
    (format!("http://{addr}"), seen)
}

fn resp(status: &str, headers: &[(&str, String)], body: &[u8]) -> Vec<u8> {
    let mut r = format!(
        "HTTP/1.1 {status}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        r.push_str(&format!("{k}: {v}\r\n"));
    }
    r.push_str("\r\n");
    let mut r = r.into_bytes();
    r.extend_from_slice(body);
    r
}

fn json(v: serde_json::Value) -> Vec<u8> {
    resp(
        "200 OK",
        &[("Content-Type", "application/json".into())],
        v.to_string().as_bytes(),
    )
}

fn config(url: &str) -> ArchiveConfig {
    let mut c = ArchiveConfig::new(url);
    c.backoff = Backoff {
        base: Duration::from_millis(5),
        max: Duration::from_millis(20),
        healthy_after: Duration::from_secs(60),
    };
    c.max_attempts = 3;
    c
}

async fn read_all(cfg: ArchiveConfig) -> Result<Vec<u64>, ArchiveError> {
    let mut s = Snapshot::new(cfg)?;
    let mut seqs = Vec::new();
    while let Some(e) = s.next().await? {
        seqs.push(e.seq());
    }
    Ok(seqs)
}

#[tokio::test]
async fn a_planner_that_does_not_advance_is_an_error_not_a_loop() {
    // Always "planned through 5 of 10", nothing to download.
    let (url, seen) = server(|_, _| {
        json(serde_json::json!({
            "plannedThroughSeq": 5, "sealedTipSeq": 10, "segments": [],
            "stats": {"segmentsExamined": 0, "segmentsMatched": 0, "blocksMatched": 0, "entries": 0}
        }))
    })
    .await;
    match read_all(config(&url)).await {
        Err(
            e @ ArchiveError::Stalled {
                after: Some(5),
                planned: 5,
                tip: 10,
            },
        ) => {
            assert!(e.is_permanent())
        }
        other => panic!("{other:?}"),
    }
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 2);
    assert!(seen[1]
        .line
        .starts_with("POST /xrpc/network.bsky.jetstream.planSnapshot "));
    // The second page asked after the first's plannedThroughSeq, pinned to its tip.
    let body: serde_json::Value = serde_json::from_slice(&seen[1].body).unwrap();
    assert_eq!(body, serde_json::json!({"afterSeq": 5, "beforeSeq": 10}));
}

#[tokio::test]
async fn refusals_are_permanent_and_outages_give_up_after_the_attempts() {
    let (url, seen) = server(|_, _| {
        resp(
            "401 Unauthorized",
            &[],
            br#"{"error":"AuthRequired","message":"invalid or missing bearer token"}"#,
        )
    })
    .await;
    let mut cfg = config(&url);
    cfg.token = Some("s3cret".into());
    match read_all(cfg).await {
        Err(ArchiveError::Refused {
            status: 401, error, ..
        }) => assert_eq!(error, "AuthRequired"),
        other => panic!("{other:?}"),
    }
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1, "a refusal was retried");
    assert_eq!(seen[0].header("authorization"), Some("Bearer s3cret"));

    let (url, seen) = server(|_, _| resp("503 Service Unavailable", &[], b"busy")).await;
    match read_all(config(&url)).await {
        Err(e @ ArchiveError::Unavailable { attempts: 3, .. }) => assert!(!e.is_permanent()),
        other => panic!("{other:?}"),
    }
    assert_eq!(seen.lock().unwrap().len(), 3);
}

fn rows(first: u64, n: u64) -> Vec<(u64, Vec<u8>)> {
    // {"v": seq} in DAG-CBOR (seqs below 24 are one byte): a distinct record per row.
    (first..first + n)
        .map(|s| (s, vec![0xa1, 0x61, b'v', s as u8]))
        .collect()
}

fn segment(rows: &[(u64, Vec<u8>)]) -> Vec<u8> {
    let rs: Vec<Row<'_>> = rows
        .iter()
        .map(|(s, p)| Row {
            seq: *s,
            witnessed_at: 1,
            indexed_at: 0,
            kind: Kind::Create,
            did: "did:plc:aaaa",
            collection: "app.bsky.feed.like",
            rkey: "3k",
            rev: "3l",
            payload: p,
        })
        .collect();
    let blocks: Vec<&[Row<'_>]> = rs.chunks(4).collect();
    write_segment(&blocks).unwrap()
}

#[tokio::test]
async fn a_segment_replaced_between_ranges_is_read_whole_again_and_a_429_waited_out() {
    let old = segment(&rows(1, 20));
    // The replacement (a compaction): the same seqs, some folded away.
    let new = segment(
        &rows(1, 20)
            .into_iter()
            .filter(|(s, _)| s % 3 != 0)
            .collect::<Vec<_>>(),
    );
    let plan = serde_json::json!({
        "plannedThroughSeq": 20, "sealedTipSeq": 20,
        "segments": [{"name": "seg_0000000000.jss", "index": 0, "checksum": "00",
                      "minSeq": 1, "maxSeq": 20, "mode": "segment"}],
        "stats": {"segmentsExamined": 1, "segmentsMatched": 1, "blocksMatched": 5, "entries": 1}
    });
    let t0 = Instant::now();
    let (url, seen) = server(move |i, req| match i {
        0 => json(plan.clone()),
        // Over quota first.
        1 => resp(
            "429 Too Many Requests",
            &[("Retry-After", "1".into())],
            b"{}",
        ),
        // The first range of the old file.
        2 => {
            assert!(req.line.starts_with(
                "GET /xrpc/network.bsky.jetstream.getSegment?name=seg_0000000000.jss "
            ));
            assert_eq!(req.header("range"), Some("bytes=0-255"));
            resp(
                "206 Partial Content",
                &[
                    ("Content-Range", format!("bytes 0-255/{}", old.len())),
                    ("ETag", "\"old\"".into()),
                ],
                &old[..256],
            )
        }
        // The file changed: If-Range does not match, the whole new file.
        _ => {
            assert_eq!(req.header("if-range"), Some("\"old\""));
            resp("200 OK", &[("ETag", "\"new\"".into())], &new)
        }
    })
    .await;
    let mut cfg = config(&url);
    cfg.range_bytes = 256;
    let mut s = Snapshot::new(cfg).unwrap();
    let mut seqs = Vec::new();
    while let Some(e) = s.next().await.unwrap() {
        seqs.push(e.seq());
    }
    assert_eq!(seqs, (1..=20).filter(|s| s % 3 != 0).collect::<Vec<_>>());
    let st = s.stats();
    assert_eq!(
        (st.restarts, st.retries, st.segments, st.rows_rejected),
        (1, 1, 1, 0),
        "{st:?}"
    );
    assert!(
        t0.elapsed() >= Duration::from_secs(1),
        "Retry-After not waited out"
    );
    assert_eq!(seen.lock().unwrap().len(), 4);
}

#[tokio::test]
async fn a_server_is_not_trusted_with_memory_a_long_refusal_or_block_is_cut() {
    // A refusal whose body runs to 1 MiB: the error keeps the head of its reason.
    let mut long = br#"{"error":"AuthRequired","message":""#.to_vec();
    long.extend(std::iter::repeat_n(b'x', 1 << 20));
    long.extend_from_slice(br#""}"#);
    let (url, _) = server(move |_, _| resp("401 Unauthorized", &[], &long)).await;
    match read_all(config(&url)).await {
        Err(e @ ArchiveError::Refused { status: 401, .. }) => {
            assert!(
                e.to_string().len() < 8 << 10,
                "{} bytes",
                e.to_string().len()
            )
        }
        other => panic!("{other:?}"),
    }
    // A block's answer longer than the configured bound: refused, not read whole.
    let plan = serde_json::json!({
        "plannedThroughSeq": 2, "sealedTipSeq": 2,
        "segments": [{"name": "seg_0000000001.jss", "index": 1, "checksum": "0000000000000001",
            "minSeq": 1, "maxSeq": 2, "mode": "blocks", "blocks": [{"first": 0, "last": 0}]}],
        "stats": {"segmentsExamined": 1, "segmentsMatched": 1, "blocksMatched": 1, "entries": 1}
    });
    let (url, seen) = server(move |_, r| {
        if r.line.contains("planSnapshot") {
            json(plan.clone())
        } else {
            resp("200 OK", &[], &vec![0u8; 64 << 10])
        }
    })
    .await;
    let mut cfg = config(&url);
    cfg.max_segment_bytes = 16 << 10;
    match read_all(cfg).await {
        Err(
            e @ ArchiveError::TooLarge {
                limit: 16_384,
                bytes,
                ..
            },
        ) => {
            assert!(e.is_permanent());
            assert!(bytes > 16_384 && bytes <= 64 << 10, "{bytes}");
        }
        other => panic!("{other:?}"),
    }
    // Refused once, not retried.
    assert_eq!(
        seen.lock()
            .unwrap()
            .iter()
            .filter(|r| r.line.contains("getBlock"))
            .count(),
        1
    );
}
