//! `riptide gen` end to end, as a user runs it: the stream it writes verifies with
//! `riptide verify` using the DID documents it writes, every frame listed in `adversarial.json`
//! gets exactly its expected verdict and every other frame is `ok`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::process::Command;

#[test]
fn gen_then_verify() {
    let dir = std::env::temp_dir().join(format!("riptide-cli-gen-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let d = dir.to_str().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_riptide"))
        .args([
            "gen",
            "--seed",
            "2",
            "--accounts",
            "5",
            "--events",
            "300",
            "--out",
            d,
            "--adversarial",
            "0.05",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let frames = dir.join("firehose-frames.bin");
    let docs = dir.join("did_docs.json");
    let out = Command::new(env!("CARGO_BIN_EXE_riptide"))
        .args([
            "verify",
            frames.to_str().unwrap(),
            "--did-docs",
            docs.to_str().unwrap(),
            "--json",
        ])
        .output()
        .unwrap();
    // Exit 1: the adversarial frames fail, as they must.
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
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
    let lines: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 300);
    for l in &lines {
        let i = l["index"].as_u64().unwrap();
        let want = expected.get(&i).map_or("ok", String::as_str);
        assert_eq!(l["verdict"].as_str().unwrap(), want, "{l}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
