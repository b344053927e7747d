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

/// Writes frames `range` of a corpus file as a corpus file of their own.
fn corpus_slice(bytes: &[u8], range: std::ops::Range<usize>) -> Vec<u8> {
    let frames = riptide_firehose::corpus::split_frames(bytes).unwrap();
    let mut out = (range.len() as u32).to_be_bytes().to_vec();
    for f in &frames[range] {
        out.extend_from_slice(&(f.bytes.len() as u32).to_be_bytes());
        out.extend_from_slice(f.bytes);
    }
    out
}

fn verdicts(out: &std::process::Output) -> Vec<String> {
    json_lines(out)
        .iter()
        .map(|l| l["verdict"].as_str().unwrap().to_owned())
        .collect()
}

/// Chain state in `riptide verify`: every stream-level defect of `riptide gen` gets its verdict
/// (on two threads, so an account's state is shared across them), `--stateless` passes them all,
/// and `--state DIR` carries the chain from one file to the next: the stream verified in two
/// halves gives the verdicts of the whole, and a half verified again is all replays.
#[test]
fn verify_keeps_chain_state_across_frames_and_runs() {
    let tmp = scratch();
    let dir = tmp.path().join("net");
    let out = riptide(&[
        "gen",
        "--seed",
        "5",
        "--accounts",
        "10",
        "--events",
        "800",
        "--out",
        s(&dir),
        "--adversarial",
        "0.06",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let frames = dir.join("firehose-frames.bin");
    let docs = dir.join("did_docs.json");
    let adversarial: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("adversarial.json")).unwrap()).unwrap();
    let labels: HashMap<usize, (String, String)> = adversarial
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["index"].as_u64().unwrap() as usize,
                (
                    e["defect"].as_str().unwrap().to_owned(),
                    e["expected_verdict"].as_str().unwrap().to_owned(),
                ),
            )
        })
        .collect();
    let stream_level = [
        "replayed-commit",
        "dropped-commit",
        "future-rev",
        "commit-after-deactivation",
        "sync-after-gap",
    ];
    for d in stream_level {
        assert!(
            labels.values().any(|(x, _)| x == d),
            "{d} generated: {labels:?}"
        );
    }

    let whole = riptide(&[
        "verify",
        s(&frames),
        "--did-docs",
        s(&docs),
        "--json",
        "--threads",
        "2",
    ]);
    assert_eq!(whole.status.code(), Some(1), "{}", stderr(&whole));
    let whole = verdicts(&whole);
    assert_eq!(whole.len(), 800);
    for (i, v) in whole.iter().enumerate() {
        let want = labels.get(&i).map_or("ok", |(_, v)| v.as_str());
        assert_eq!(v, want, "frame {i} {:?}", labels.get(&i));
    }

    let out = riptide(&[
        "verify",
        s(&frames),
        "--did-docs",
        s(&docs),
        "--json",
        "--stateless",
    ]);
    for (i, v) in verdicts(&out).iter().enumerate() {
        let want = match labels.get(&i) {
            Some((d, _)) if stream_level.contains(&d.as_str()) => "ok",
            Some((_, v)) => v.as_str(),
            None => "ok",
        };
        assert_eq!(v, want, "frame {i} {:?}", labels.get(&i));
    }

    // Two halves, one chain.
    let bytes = std::fs::read(&frames).unwrap();
    let a = common::write(&tmp, "a.bin", &corpus_slice(&bytes, 0..400));
    let b = common::write(&tmp, "b.bin", &corpus_slice(&bytes, 400..800));
    let state = tmp.path().join("state");
    let run = |f: &std::path::Path| {
        verdicts(&riptide(&[
            "verify",
            s(f),
            "--did-docs",
            s(&docs),
            "--json",
            "--state",
            s(&state),
        ]))
    };
    let mut halves = run(&a);
    assert!(state.join("chain-state").is_file());
    halves.extend(run(&b));
    assert_eq!(halves, whole);
    // The first half again, after the whole chain: every commit that passed is now a replay.
    let again = run(&a);
    let replays = again.iter().filter(|v| *v == "rev-regression").count();
    let commits_ok = whole[..400]
        .iter()
        .zip(&again)
        .filter(|(w, _)| *w == "ok")
        .filter(|(_, a)| *a != "ok")
        .count();
    assert!(replays > 300, "{replays}");
    assert!(commits_ok >= replays, "{commits_ok} {replays}");

    // A corrupt state file is an error naming it, not a silent fresh start.
    std::fs::write(state.join("chain-state"), b"junk").unwrap();
    let out = riptide(&[
        "verify",
        s(&a),
        "--did-docs",
        s(&docs),
        "--state",
        s(&state),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("chain-state"), "{}", stderr(&out));
    // --stateless and --state together are a usage error.
    let out = riptide(&[
        "verify",
        s(&a),
        "--did-docs",
        s(&docs),
        "--state",
        s(&state),
        "--stateless",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}

/// Issue 39: `gen` killed part-way left a frames file whose header claimed more frames than it
/// held, and no DID documents. Now the frames file is the mark of a complete directory: killed
/// at any moment, a directory has either no `firehose-frames.bin` or a whole one, and only
/// `.NAME.tmp` files beside it otherwise; a complete run leaves no temporary file.
#[test]
fn gen_killed_part_way_leaves_no_frames_file() {
    let tmp = scratch();
    let dir = tmp.path().join("net");
    let mut child = std::process::Command::new(common::BIN)
        .args([
            "gen",
            "--seed",
            "9",
            "--accounts",
            "300",
            "--events",
            "2000000",
        ])
        .args(["--out", s(&dir)])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Until the frames are being written, then a little more.
    let tmp_frames = dir.join(".firehose-frames.bin.tmp");
    let start = std::time::Instant::now();
    while std::fs::metadata(&tmp_frames).map_or(0, |m| m.len()) < 1 << 20 {
        assert!(start.elapsed() < common::PATIENCE, "gen wrote no frames");
        assert!(
            child.try_wait().unwrap().is_none(),
            "gen ended before it was killed"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(!dir.join("firehose-frames.bin").exists());
    assert!(!dir.join("did_docs.json").exists());
    // `verify` on it says what is missing instead of reading a half-written stream.
    let out = riptide(&["verify", s(&dir.join("firehose-frames.bin"))]);
    assert!(!out.status.success());

    // A complete run into the same directory: whole files, no temporary ones left.
    let out = riptide(&[
        "gen",
        "--seed",
        "9",
        "--accounts",
        "20",
        "--events",
        "200",
        "--out",
        s(&dir),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(
        names.contains(&"firehose-frames.bin".to_owned()),
        "{names:?}"
    );
    assert!(names.contains(&"did_docs.json".to_owned()), "{names:?}");
    assert!(names.iter().all(|n| !n.ends_with(".tmp")), "{names:?}");
    let verified = riptide(&[
        "verify",
        s(&dir.join("firehose-frames.bin")),
        "--did-docs",
        s(&dir.join("did_docs.json")),
        "--json",
    ]);
    assert!(verified.status.success(), "{}", stderr(&verified));
}

/// Issue 39: a long `gen` said nothing until it ended. With stderr not a terminal (a log, CI)
/// it prints a progress line per interval (here 10 ms, to keep the test short; 10 s by
/// default): counts that rise to the total, never a line per frame, then the summary.
#[test]
fn gen_reports_progress_on_long_runs() {
    let tmp = scratch();
    let dir = tmp.path().join("net");
    let events = 3_000u64;
    let out = riptide(&[
        "gen",
        "--seed",
        "3",
        "--accounts",
        "5",
        "--events",
        &events.to_string(),
        "--out",
        s(&dir),
        "--progress-every",
        "0.01",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let e = stderr(&out);
    let done: Vec<u64> = e
        .lines()
        .filter_map(|l| l.strip_prefix("gen: "))
        .filter_map(|l| l.split_once('/'))
        .map(|(n, rest)| {
            assert!(
                rest.starts_with(&format!("{events} frames (")) && rest.contains("frames/s"),
                "{rest}"
            );
            n.parse().unwrap()
        })
        .collect();
    assert!(!done.is_empty(), "no progress line: {e}");
    assert!(done.windows(2).all(|w| w[0] < w[1]), "{done:?}");
    assert!(done
        .iter()
        .all(|&n| n <= events && n % 1024 == 0 || n == events));
    // At most one line per 1,024 frames, whatever the interval.
    assert!(
        done.len() as u64 <= events / 1024 + 1,
        "{} lines",
        done.len()
    );
    assert!(
        e.lines()
            .last()
            .unwrap()
            .starts_with(&format!("wrote {events} frames")),
        "{e}"
    );
    // The default interval on a short run: no progress line at all.
    let out = riptide(&[
        "gen",
        "--seed",
        "3",
        "--accounts",
        "5",
        "--events",
        "50",
        "--out",
        s(&dir),
    ]);
    assert!(out.status.success());
    assert!(!stderr(&out).contains("gen: "), "{}", stderr(&out));
    // A non-positive interval is a usage error.
    let out = riptide(&[
        "gen",
        "--seed",
        "3",
        "--accounts",
        "5",
        "--events",
        "50",
        "--out",
        s(&dir),
        "--progress-every",
        "0",
    ]);
    assert_eq!(out.status.code(), Some(2));
}
