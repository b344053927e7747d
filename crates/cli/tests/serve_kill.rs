//! `riptide serve` killed with SIGKILL mid-ingest, then restarted: seqs continue, nothing durable
//! is lost, nothing is duplicated, and ingest resumes from the stored upstream cursor.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::Value;
use tokio_tungstenite::tungstenite::Message;

const REPEAT: u64 = 100;

fn spawn(data: &std::path::Path, corpus: &std::path::Path) -> (Child, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_riptide"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--ingest-repeat",
            &REPEAT.to_string(),
            "--ingest-rate",
            "4000",
        ])
        .arg("--data")
        .arg(data)
        .arg("--did-docs")
        .arg(corpus.join("jetstream-2026-07/did_docs.json"))
        .arg("--zstd-dictionary")
        .arg(corpus.join("jetstream-dictionaries/legacy_subscribe.zdict"))
        .arg("--ingest-file")
        .arg(corpus.join("jetstream-2026-07/firehose-frames.bin"))
        .env("RUST_LOG", "warn")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let addr = loop {
        let l = lines.next().expect("server exited").unwrap();
        if let Some(rest) = l.strip_prefix("riptide serve: ws://") {
            break rest.trim_end_matches("/subscribe").to_string();
        }
    };
    std::thread::spawn(move || for _ in lines {});
    (child, addr)
}

fn metric(addr: &str, name: &str) -> f64 {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).unwrap();
    body.lines()
        .find_map(|l| {
            l.strip_prefix(name)
                .and_then(|r| r.strip_prefix(' '))
                .map(|v| v.parse().unwrap())
        })
        .unwrap_or_else(|| panic!("no metric {name}"))
}

#[test]
fn kill_9_mid_ingest_then_restart() {
    let Some(corpus) = riptide_testdata::corpus() else {
        return;
    };
    let data = tempfile::tempdir().unwrap();
    let (mut child, addr) = spawn(data.path(), &corpus);
    let deadline = Instant::now() + Duration::from_secs(120);
    while metric(&addr, "riptide_events_stored_total") < 2000.0 {
        assert!(Instant::now() < deadline, "ingest did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let (mut child, addr) = spawn(data.path(), &corpus);
    let resumed = metric(&addr, "riptide_log_next_seq") as u64;
    assert!(
        resumed > 2000,
        "durable events were lost: next seq {resumed}"
    );
    while metric(&addr, "riptide_ingest_finished") < 1.0 {
        assert!(Instant::now() < deadline, "ingest did not finish");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        metric(&addr, "riptide_upstream_frames_duplicate_total"),
        0.0
    );
    let total = 152 * REPEAT;
    assert_eq!(metric(&addr, "riptide_log_next_seq") as u64, total + 1);

    // Every event exactly once, in order: the capture's 152 events, REPEAT times.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let got = rt.block_on(async {
        let (mut ws, _) =
            tokio_tungstenite::connect_async(format!("ws://{addr}/subscribe?cursor=0"))
                .await
                .unwrap();
        let mut out = Vec::new();
        while out.len() < total as usize {
            let m = tokio::time::timeout(Duration::from_secs(60), ws.next())
                .await
                .unwrap()
                .unwrap()
                .unwrap();
            if let Message::Text(t) = m {
                out.push(serde_json::from_str::<Value>(&t).unwrap());
            }
        }
        out
    });
    let mut last_time = 0;
    for (i, v) in got.iter().enumerate() {
        assert_eq!(v["cursor"].as_u64(), Some(i as u64 + 1));
        let t = v["time_us"].as_i64().unwrap();
        assert!(t > last_time, "time_us not strictly increasing at {i}");
        last_time = t;
        let first = &got[i % 152];
        assert_eq!(
            (&v["did"], &v["commit"], &v["identity"], &v["account"]),
            (
                &first["did"],
                &first["commit"],
                &first["identity"],
                &first["account"]
            ),
            "event {i}"
        );
    }
    child.kill().unwrap();
    child.wait().unwrap();
}
