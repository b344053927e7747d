//! `riptide doctor` on what it diagnoses: the real corpus (complete) and a copy of it with a
//! frames file cut short (incomplete), a store written for one dictionary checked against
//! others and while another process holds it, a reachable PLC directory (`riptide sim`) and an
//! unreachable relay. Each check is one line; a failed one makes the exit code 1.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::process::Output;

use common::{riptide, s, scratch, start_sim, stderr};
use serde_json::Value;

/// `riptide doctor ARGS… --json`: the exit code and the checks by name.
fn doctor(args: &[&str]) -> (Output, Value) {
    let mut all = vec!["doctor", "--json"];
    all.extend(args);
    let out = riptide(&all);
    let v: Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", stderr(&out)));
    // The exit code follows the failures, whatever this machine's disk or Java.
    let fails = v["fail"].as_u64().unwrap();
    assert_eq!(out.status.code(), Some(i32::from(fails > 0)), "{v}");
    let n = v["checks"].as_array().unwrap().len() as u64;
    assert_eq!(
        v["ok"].as_u64().unwrap() + v["warn"].as_u64().unwrap() + fails,
        n
    );
    (out, v)
}

/// The check called `name`: (status, detail).
fn get(v: &Value, name: &str) -> (String, String) {
    let c = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["check"] == name)
        .unwrap_or_else(|| panic!("no {name} check in {v}"));
    (
        c["status"].as_str().unwrap().to_owned(),
        c["detail"].as_str().unwrap().to_owned(),
    )
}

/// A loopback port nothing listens on.
fn dead_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn doctor_checks_the_corpus_against_its_manifest() {
    let Some(corpus) = riptide_testdata::corpus() else {
        return;
    };
    let (_, v) = doctor(&["--offline", "--corpus", s(&corpus)]);
    let (status, detail) = get(&v, "corpus");
    assert_eq!(status, "ok", "{detail}");
    assert!(
        detail.contains("150 frames") && detail.contains("23 records"),
        "{detail}"
    );
    for name in ["disk", "fd-limit", "java", "mvn"] {
        get(&v, name);
    }
    assert!(v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .all(|c| c["check"] != "upstream"));

    // A copy whose frames file holds 100 of the manifest's 150 frames (the rest linked).
    let tmp = scratch();
    let copy = tmp.path();
    std::os::unix::fs::symlink(corpus.join("README.md"), copy.join("README.md")).unwrap();
    std::os::unix::fs::symlink(
        corpus.join("jetstream-dictionaries"),
        copy.join("jetstream-dictionaries"),
    )
    .unwrap();
    let cap = copy.join("jetstream-2026-07");
    std::fs::create_dir(&cap).unwrap();
    for f in std::fs::read_dir(corpus.join("jetstream-2026-07")).unwrap() {
        let f = f.unwrap();
        if f.file_name() != "firehose-frames.bin" {
            std::os::unix::fs::symlink(f.path(), cap.join(f.file_name())).unwrap();
        }
    }
    let file = std::fs::read(corpus.join("jetstream-2026-07/firehose-frames.bin")).unwrap();
    let frames = riptide_firehose::corpus::split_frames(&file).unwrap();
    let cut = riptide_firehose::corpus::write_frames(frames[..100].iter().map(|f| f.bytes));
    std::fs::write(cap.join("firehose-frames.bin"), cut).unwrap();
    let (out, v) = doctor(&["--offline", "--corpus", s(copy)]);
    assert_eq!(out.status.code(), Some(1));
    let (status, detail) = get(&v, "corpus");
    assert_eq!(status, "fail");
    assert!(
        detail.contains("100 frames, the manifest says 150"),
        "{detail}"
    );

    // A corpus named but absent: a failure (when looked for by default, a warning).
    let (out, v) = doctor(&["--offline", "--corpus", s(&copy.join("nothing"))]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(get(&v, "corpus").0, "fail");

    // The text form: one line per check, each starting with its status.
    let out = riptide(&["doctor", "--offline", "--corpus", s(&corpus)]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(text.lines().count(), 5, "{text}");
    assert!(text
        .lines()
        .all(|l| ["ok ", "warn ", "fail "].iter().any(|p| l.starts_with(p))));
    assert!(text.starts_with("ok    corpus: "), "{text}");
}

#[test]
fn doctor_checks_a_stores_dictionary_and_the_network() {
    let Some(corpus) = riptide_testdata::corpus() else {
        return;
    };
    let legacy = corpus.join("jetstream-dictionaries/legacy_subscribe.zdict");
    let v2 = corpus.join("jetstream-dictionaries/subscribe_events_20260811.zdict");
    let data = scratch();
    drop(riptide_serve::Store::open(data.path(), 1_612_007_021).unwrap());
    let store = |dict: Option<&Path>| {
        let mut args = vec![
            "--offline",
            "--corpus",
            s(&corpus),
            "--data",
            s(data.path()),
        ];
        if let Some(d) = dict {
            args.extend(["--zstd-dictionary", s(d)]);
        }
        get(&doctor(&args).1, "store")
    };
    let (status, detail) = store(Some(&legacy));
    assert_eq!(status, "ok", "{detail}");
    assert!(detail.contains("1612007021"), "{detail}");
    let (status, detail) = store(Some(&v2));
    assert_eq!(status, "fail");
    assert!(
        detail.contains("1612007021") && detail.contains("20260811"),
        "{detail}"
    );
    let (status, detail) = store(None);
    assert_eq!(status, "fail");
    assert!(detail.contains("none is given"), "{detail}");
    // While another process holds the directory: said, not opened.
    let held = riptide_serve::Store::open_any(data.path()).unwrap();
    let (status, detail) = store(Some(&legacy));
    assert_eq!(status, "warn", "{detail}");
    assert!(detail.contains("in use"), "{detail}");
    drop(held);
    // An empty directory is not made a store.
    let empty = scratch();
    let (_, v) = doctor(&["--offline", "--data", s(empty.path())]);
    assert!(get(&v, "store").1.contains("empty"));
    assert_eq!(std::fs::read_dir(empty.path()).unwrap().count(), 0);
    // Nor a directory of other files.
    std::fs::write(empty.path().join("notes.txt"), "mine").unwrap();
    let (_, v) = doctor(&["--offline", "--data", s(empty.path())]);
    let (status, detail) = get(&v, "store");
    assert_eq!(status, "warn", "{detail}");
    assert!(detail.contains("holds no store"), "{detail}");
    assert_eq!(std::fs::read_dir(empty.path()).unwrap().count(), 1);

    // The network: a PLC directory that answers (the sim), a relay that does not.
    let net = scratch();
    std::fs::create_dir(net.path().join("repos")).unwrap();
    std::fs::write(net.path().join("did_docs.json"), "{}").unwrap();
    let (_sim, base) = start_sim(net.path());
    let dead = format!("ws://127.0.0.1:{}", dead_port());
    let (out, v) = doctor(&["--upstream", &dead, "--plc-url", &base, "--timeout", "30"]);
    assert_eq!(out.status.code(), Some(1));
    let (status, detail) = get(&v, "plc");
    assert_eq!(status, "ok", "{detail}");
    assert!(
        detail.contains(&format!("{base}/_health: HTTP ")),
        "{detail}"
    );
    let (status, detail) = get(&v, "upstream");
    assert_eq!(status, "fail", "{detail}");
    assert!(detail.contains("/xrpc/_health"), "{detail}");
}
