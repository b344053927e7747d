//! Folding run by `riptide serve` (issue 38, docs/archive.md "Folding"): the real capture,
//! ingested 30 times over from a file with `--segment-bytes 1`, is sealed (one segment of a
//! 4,096-row block) and folded by the server's own compaction thread; then the server is killed
//! and restarted on the same data, ingests 30 more copies, seals and folds again, and the writer
//! prunes the tombstones the first fold finished with. After each fold, v1 `/subscribe` and v2
//! `subscribeEvents` from cursor 0 and the archive (`planSnapshot`, then `getSegment` of every
//! planned file) serve exactly the fold this test derives on its own from `riptide jetstream`'s
//! v1 projection of the frames (made without the store): a record's create or update is gone
//! once a later update or delete of it exists and its seq is sealed and folded; everything else,
//! the unsealed tail included, is served as ingested.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::Path;

use common::{metric, wait_for, PATIENCE, V2};
use riptide_firehose::corpus::split_frames;
use riptide_segment::{Kind, Segment};
use serde_json::Value;

/// Events of one copy of the capture (production Jetstream's count for its window).
const EVENTS: usize = 152;
/// Copies of the capture in the end: the second block's tip (8,192) falls in the last copy after
/// every update and delete but one, so most tombstones end at or below the fold (prunable).
const COPIES: usize = 54;
/// Rows in a store block (`riptide_store::StoreOptions::default().block_events`).
const BLOCK: u64 = 4096;

/// `riptide jetstream`'s v1 projection of the capture `copies` times over, with their seqs.
fn projection(capture: &Path, copies: usize, tmp: &Path) -> Vec<Value> {
    let raw = std::fs::read(capture).unwrap();
    let frames = split_frames(&raw).unwrap();
    let mut out = ((frames.len() * copies) as u32).to_be_bytes().to_vec();
    for _ in 0..copies {
        for f in &frames {
            out.extend_from_slice(&(f.bytes.len() as u32).to_be_bytes());
            out.extend_from_slice(f.bytes);
        }
    }
    let file = tmp.join(format!("x{copies}.bin"));
    std::fs::write(&file, out).unwrap();
    let events = common::json_lines(&common::riptide(&["jetstream", common::s(&file)]));
    assert_eq!(events.len(), EVENTS * copies);
    events
        .into_iter()
        .enumerate()
        .map(|(i, mut e)| {
            e["cursor"] = (i as u64 + 1).into();
            e
        })
        .collect()
}

/// A record's key: its DID, collection and rkey.
fn record_key(e: &Value) -> String {
    let c = &e["commit"];
    format!("r {} {} {}", e["did"], c["collection"], c["rkey"])
}

/// The tombstones of `events`, key → the highest seq: a record's (`r …`) for each update or
/// delete, a DID's (`d …`) for each `#account` with `active: false, status: deleted`.
fn tombstones(events: &[Value]) -> HashMap<String, u64> {
    let mut out = HashMap::new();
    for e in events {
        let seq = e["cursor"].as_u64().unwrap();
        let key = match e["commit"]["operation"].as_str() {
            Some("update" | "delete") => record_key(e),
            _ if e["account"]["active"] == false && e["account"]["status"] == "deleted" => {
                format!("d {}", e["did"])
            }
            _ => continue,
        };
        let t = out.entry(key).or_insert(0);
        *t = seq.max(*t);
    }
    out
}

/// The fold, derived here from the rules (docs/archive.md, "Folding") over the v1 projection:
/// the seqs of `events` served once every sealed row up to `folded` is folded with the
/// tombstones of `known` (the events ingested when the pass ran): an update or delete supersedes
/// its record's earlier rows; an `#account` with `active: false, status: deleted` every earlier
/// row of its DID (the capture has no `#sync`).
fn kept(events: &[Value], known: &[Value], folded: u64) -> Vec<u64> {
    let tombstones = tombstones(known);
    events
        .iter()
        .filter(|e| {
            let seq = e["cursor"].as_u64().unwrap();
            let c = &e["commit"];
            let later = |t: Option<&u64>| t.is_some_and(|&t| t > seq);
            let superseded = matches!(c["operation"].as_str(), Some("create" | "update"))
                && (later(tombstones.get(&record_key(e)))
                    || later(tombstones.get(&format!("d {}", e["did"]))));
            !(seq <= folded && superseded)
        })
        .map(|e| e["cursor"].as_u64().unwrap())
        .collect()
}

/// What both wires and the archive must agree on for an event.
fn fields(seq: u64, did: &Value, kind: &str, op: &Value, coll: &Value, rkey: &Value) -> String {
    format!("{seq} {did} {kind} {op} {coll} {rkey}")
}

fn of_v1(e: &Value) -> String {
    let c = &e["commit"];
    let kind = e["kind"].as_str().unwrap();
    fields(
        e["cursor"].as_u64().unwrap(),
        &e["did"],
        kind,
        &c["operation"],
        &c["collection"],
        &c["rkey"],
    )
}

fn of_v2(p: &Value) -> String {
    let kind = p["$type"].as_str().unwrap().rsplit('#').next().unwrap();
    fields(
        p["seq"].as_u64().unwrap(),
        &p["did"],
        kind,
        &p["operation"],
        &p["collection"],
        &p["rkey"],
    )
}

/// An HTTP request's status and body.
fn http(addr: &str, method: &str, path: &str, body: &[u8]) -> (u16, Vec<u8>) {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .unwrap();
    s.write_all(body).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let status = String::from_utf8_lossy(&raw[9..12]).parse().unwrap();
    (status, raw[split + 4..].to_vec())
}

/// Checks v1 and, with `all`, v2 and the archive against `kept(events, known, folded)`, where
/// `folded` is the sealed tip: returns the number of rows folded away.
fn check_served(addr: &str, events: &[Value], known: &[Value], folded: u64, all: bool) -> usize {
    let kept = kept(events, known, folded);
    let by_seq: HashMap<u64, &Value> = events
        .iter()
        .map(|e| (e["cursor"].as_u64().unwrap(), e))
        .collect();
    let want: Vec<String> = kept.iter().map(|s| of_v1(by_seq[s])).collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();

    let v1 = rt.block_on(common::events_from_start(addr, kept.len()));
    let got: Vec<String> = v1.iter().map(of_v1).collect();
    assert!(got == want, "v1 /subscribe does not serve the fold");
    // Byte for byte the record ingest stored, where it is served.
    for e in &v1 {
        let w = by_seq[&e["cursor"].as_u64().unwrap()];
        assert_eq!(e["commit"]["cid"], w["commit"]["cid"]);
        assert_eq!(e["commit"]["record"], w["commit"]["record"]);
    }
    if !all {
        return events.len() - kept.len();
    }

    let frames = rt.block_on(common::v2_frames(addr, "cursor=0", kept.len(), None));
    let got: Vec<String> = frames
        .iter()
        .filter(|f| f["$type"] == "message" && f["payload"]["seq"].is_u64())
        .map(|f| of_v2(&f["payload"]))
        .collect();
    assert!(got == want, "v2 {V2} does not serve the fold");

    // The archive: every sealed seq is planned, and the files hold exactly the fold.
    let (status, body) = http(
        addr,
        "POST",
        "/xrpc/network.bsky.jetstream.planSnapshot",
        b"{}",
    );
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let plan: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(plan["sealedTipSeq"], folded, "{plan}");
    let mut rows = Vec::new();
    for s in plan["segments"].as_array().unwrap() {
        let name = s["name"].as_str().unwrap();
        let (status, file) = http(
            addr,
            "GET",
            &format!("/xrpc/network.bsky.jetstream.getSegment?name={name}"),
            b"",
        );
        assert_eq!(status, 200);
        let seg = Segment::open(&file).unwrap();
        assert_eq!(
            format!("{:016x}", seg.header().checksum),
            s["checksum"].as_str().unwrap()
        );
        for b in 0..seg.blocks().len() {
            let body = seg.block_body(b).unwrap();
            for r in seg.rows(b, &body).unwrap() {
                let op = match r.kind {
                    Kind::Create => "create".into(),
                    Kind::Update => "update".into(),
                    Kind::Delete => "delete".into(),
                    _ => Value::Null,
                };
                let kind = match r.kind {
                    Kind::Create | Kind::Update | Kind::Delete => "commit",
                    Kind::Identity => "identity",
                    Kind::Account => "account",
                    k => panic!("a {k:?} row: the capture has none"),
                };
                let (coll, rkey) = match op {
                    Value::Null => (Value::Null, Value::Null),
                    _ => (r.collection.into(), r.rkey.into()),
                };
                rows.push(fields(r.seq, &r.did.into(), kind, &op, &coll, &rkey));
            }
        }
    }
    let sealed = kept.iter().take_while(|&&s| s <= folded).count();
    assert!(rows == want[..sealed], "the archive does not hold the fold");
    events.len() - kept.len()
}

#[test]
fn serve_folds_what_it_seals_and_every_wire_and_the_archive_serve_the_fold() {
    let Some(dir) = common::capture_dir() else {
        return;
    };
    let capture = dir.join("firehose-frames.bin");
    let tmp = common::scratch();
    let data = tmp.path().join("data");
    let events = projection(&capture, COPIES, tmp.path());
    // Ingest runs with sealing out of reach (a bound no block meets) and the server is then
    // restarted with `--segment-bytes 1`: it seals at start, after ingest, so the pass that
    // follows knows every tombstone and the fold is exactly the derived one (a pass while
    // ingest runs folds with the tombstones written so far; the next pass, with the rest).
    let serve = |copies: &str, segment_bytes: &str| {
        common::spawn_serve(
            common::serve_command(&data)
                .args([
                    "--no-verify",
                    "--segment-bytes",
                    segment_bytes,
                    "--ingest-file",
                ])
                .arg(&capture)
                .args(["--ingest-repeat", copies]),
        )
    };
    let never = "1000000000000";

    // 30 copies ingested; then the first block is sealed and folded by the server.
    let (server, addr) = serve("30", never);
    wait_for(&addr, "riptide_ingest_finished", 1.0);
    drop(server);
    let (server, addr) = serve("30", "1");
    wait_for(&addr, "riptide_compaction_seq", BLOCK as f64);
    let first = &events[..EVENTS * 30];
    let dropped = check_served(&addr, first, first, BLOCK, true);
    assert!(dropped > 50, "{dropped} rows folded away");
    assert_eq!(
        metric(&addr, "riptide_compaction_rows_dropped_total") as usize,
        dropped
    );
    assert_eq!(metric(&addr, "riptide_compaction_failures_total"), 0.0);
    // (fjall's approximate count: a key written again counts again until compacted.)
    assert!(metric(&addr, "riptide_store_tombstones") as usize >= tombstones(first).len());
    drop(server);

    // Killed (SIGKILL) and restarted: 24 more copies ingested, the fold kept, the new rows live
    // and unfolded. The writer's first batch prunes what the fold finished with: nothing here,
    // every key's tombstone was raised above the fold by a later copy.
    let (server, addr) = serve(&COPIES.to_string(), never);
    wait_for(&addr, "riptide_ingest_finished", 1.0);
    check_served(&addr, &events, first, BLOCK, false);
    assert_eq!(metric(&addr, "riptide_store_tombstones_pruned_total"), 0.0);
    drop(server);

    // Restarted sealing: the second block is sealed, and both segments folded with every
    // tombstone (the first again, with those of the later copies).
    let (server, addr) = serve(&COPIES.to_string(), "1");
    wait_for(&addr, "riptide_compaction_seq", (2 * BLOCK) as f64);
    let dropped = check_served(&addr, &events, &events, 2 * BLOCK, true);
    assert!(dropped > 100, "{dropped} rows folded away");
    assert_eq!(metric(&addr, "riptide_compaction_failures_total"), 0.0);
    drop(server);

    // One more copy: the writer's first batch prunes the tombstones at or below the fold (the
    // records whose last update or delete is sealed), and only those.
    let (_server, addr) = serve(&(COPIES + 1).to_string(), never);
    let prunable = tombstones(&events)
        .values()
        .filter(|&&s| s <= 2 * BLOCK)
        .count();
    assert!(prunable >= 3, "{prunable}");
    wait_for(
        &addr,
        "riptide_store_tombstones_pruned_total",
        prunable as f64,
    );
    wait_for(&addr, "riptide_ingest_finished", 1.0);
    assert_eq!(
        metric(&addr, "riptide_store_tombstones_pruned_total") as usize,
        prunable
    );
}
