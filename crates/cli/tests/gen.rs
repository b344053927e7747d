//! `riptide gen` end to end, as a user runs it: the stream it writes verifies with
//! `riptide verify` using the DID documents it writes, every frame listed in `adversarial.json`
//! gets exactly its expected verdict and every other frame is `ok`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;

use common::{json_lines, riptide, s, scratch, stderr};

#[test]
fn gen_then_verify() {
    let tmp = scratch();
    let dir = tmp.path().join("net");
    let out = riptide(&[
        "gen",
        "--seed",
        "2",
        "--accounts",
        "5",
        "--events",
        "300",
        "--out",
        s(&dir),
        "--adversarial",
        "0.05",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let frames = dir.join("firehose-frames.bin");
    let docs = dir.join("did_docs.json");
    let out = riptide(&["verify", s(&frames), "--did-docs", s(&docs), "--json"]);
    // Exit 1: the adversarial frames fail, as they must.
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let adversarial: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("adversarial.json")).unwrap()).unwrap();
    let expected: HashMap<u64, String> = adversarial
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["index"].as_u64().unwrap(),
                e["expected_verdict"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert!(expected.len() >= 5, "{expected:?}");
    let lines = json_lines(&out);
    assert_eq!(lines.len(), 300);
    for l in &lines {
        let i = l["index"].as_u64().unwrap();
        let want = expected.get(&i).map_or("ok", String::as_str);
        assert_eq!(l["verdict"].as_str().unwrap(), want, "{l}");
    }
}
