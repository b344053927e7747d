//! The real capture projected to Jetstream v1: production Jetstream emitted 152 events for these
//! 150 frames (manifest). Every rendered record must encode back to the exact bytes its author
//! signed (JSON → DAG-CBOR → CID equals the op's CID), and every event must have the shape and
//! key order of production's events (`jetstream-golden/golden_v1.jsonl`).

use riptide_testdata as common;

use riptide_cbor::json_to_value;
use riptide_firehose::corpus::split_frames;
use riptide_firehose::{DecodeOptions, FrameDecoder};
use riptide_jetstream::Projector;

fn keys(v: &serde_json::Value) -> Vec<String> {
    v.as_object()
        .map(|o| o.keys().cloned().collect())
        .unwrap_or_default()
}

/// The key order of a JSON object as written (serde_json's map is sorted, so read the raw text).
fn raw_key_order(line: &str, keys: &[&str]) -> Vec<usize> {
    keys.iter()
        .map(|k| line.find(&format!("\"{k}\":")).unwrap_or(usize::MAX))
        .collect()
}

#[test]
fn capture_projects_to_production_event_count_and_lossless_records() {
    let Some(file) = common::read("jetstream-2026-07/firehose-frames.bin") else {
        return;
    };
    let manifest: serde_json::Value =
        serde_json::from_slice(&common::read("jetstream-2026-07/manifest.json").unwrap()).unwrap();
    let frames = split_frames(&file).unwrap();
    let mut dec = FrameDecoder::with_options(DecodeOptions {
        decode_blocks: false,
        ..DecodeOptions::default()
    });
    let mut proj = Projector::new();
    let mut lines = Vec::new();
    let mut cursor = 0u64;
    for f in &frames {
        let frame = dec.decode(f.bytes).unwrap();
        let p = proj.project(&frame);
        assert!(p.drops().is_empty(), "frame {}: {:?}", f.index, p.drops());
        for i in 0..p.len() {
            cursor += 1;
            let mut out = Vec::new();
            p.render(
                i,
                1_700_000_000_000_000 + cursor as i64,
                Some(cursor),
                &mut out,
            );
            lines.push(String::from_utf8(out).unwrap());
        }
    }
    assert_eq!(lines.len() as u64, manifest["v1_events"].as_u64().unwrap());

    let (mut commits, mut identity, mut account, mut records) = (0, 0, 0, 0);
    for line in &lines {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let order = raw_key_order(line, &["did", "time_us", "cursor", "kind"]);
        assert!(
            order.windows(2).all(|w| w[0] < w[1]),
            "envelope order: {line}"
        );
        match v["kind"].as_str().unwrap() {
            "commit" => {
                commits += 1;
                let c = &v["commit"];
                let op = c["operation"].as_str().unwrap();
                if op == "delete" {
                    assert_eq!(keys(c), ["collection", "operation", "rev", "rkey"]);
                } else {
                    records += 1;
                    let record = json_to_value(&c["record"]).unwrap();
                    assert_eq!(
                        record.cid().to_string(),
                        c["cid"].as_str().unwrap(),
                        "{line}"
                    );
                    let inner = &line[line.find("\"commit\":").unwrap()..];
                    let o =
                        raw_key_order(inner, &["rev", "operation", "collection", "rkey", "record"]);
                    assert!(o.windows(2).all(|w| w[0] < w[1]), "commit order: {line}");
                    assert!(
                        line.ends_with(&format!(",\"cid\":\"{}\"}}}}", c["cid"].as_str().unwrap()))
                    );
                }
            }
            "identity" => {
                identity += 1;
                assert_eq!(v["did"], v["identity"]["did"]);
                assert!(v["identity"]["seq"].is_i64() && v["identity"]["time"].is_string());
            }
            "account" => {
                account += 1;
                assert!(v["account"]["active"].is_boolean() && v["account"]["seq"].is_i64());
            }
            other => panic!("kind {other}"),
        }
    }
    let m = |k: &str| manifest[k].as_u64().unwrap() as usize;
    assert_eq!(commits, m("creates") + m("updates") + m("deletes"));
    assert_eq!(records, m("creates") + m("updates"));
    assert_eq!((identity, account), (m("identity"), m("account")));
}

#[test]
fn identity_and_account_shapes_match_production() {
    // Production's own identity/account events: same keys, in the same order, as ours.
    let Some(golden) = common::read("jetstream-golden/golden_v1.jsonl") else {
        return;
    };
    let golden = String::from_utf8(golden).unwrap();
    let mut seen = 0;
    for line in golden.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let kind = v["kind"].as_str().unwrap();
        if kind == "identity" || kind == "account" {
            seen += 1;
            let inner = &v[kind];
            let order: Vec<&str> = if kind == "identity" {
                vec!["did", "handle", "seq", "time"]
            } else {
                vec!["active", "did", "seq", "status", "time"]
            };
            let present: Vec<&str> = order
                .iter()
                .copied()
                .filter(|k| inner.get(*k).is_some())
                .collect();
            let body = &line[line.find(&format!("\"{kind}\":")).unwrap()..];
            let pos = raw_key_order(body, &present);
            assert!(pos.windows(2).all(|w| w[0] < w[1]), "{line}");
        }
    }
    assert!(seen >= 2, "golden file has identity and account events");
}

/// A DID that is not one (here `did:Plc:…`: the method must be lowercase) makes no event, on
/// every kind of the real capture's frames: since issue 40 the decoder refuses the frame
/// (`BadDid`, naming the field), so the projector never sees it (its own `InvalidDid` drop stays,
/// a second line behind the decoder). The DID changed is the frame's own (`repo` / `did`, the
/// first `did:` in the frame: DAG-CBOR orders keys by length, so `repo` comes before `blocks`).
#[test]
fn an_invalid_did_makes_no_event_and_is_counted() {
    use riptide_firehose::{Body, FrameErrorKind};
    let Some(file) = common::read("jetstream-2026-07/firehose-frames.bin") else {
        return;
    };
    let frames = split_frames(&file).unwrap();
    let mut dec = FrameDecoder::new();
    let mut seen = [0usize; 3];
    for f in &frames {
        let (kind, field) = match dec.decode(f.bytes).unwrap().body() {
            Body::Commit(_) => (0, "repo"),
            Body::Identity(_) => (1, "did"),
            Body::Account(_) => (2, "did"),
            _ => continue,
        };
        let mut bad = f.bytes.to_vec();
        let at = bad.windows(4).position(|w| w == b"did:").unwrap() + 4;
        bad[at] = bad[at].to_ascii_uppercase();
        let e = dec.decode(&bad).expect_err("a frame whose DID is not one");
        assert!(
            matches!(e.kind(), FrameErrorKind::BadDid(name, _) if *name == field),
            "frame {}: {e}",
            f.index
        );
        seen[kind] += 1;
    }
    // The capture has every kind (manifest: 150 frames, commits, identity and account events).
    assert!(seen.iter().all(|&n| n > 0), "{seen:?}");
    assert_eq!(seen.iter().sum::<usize>(), 150);
}
