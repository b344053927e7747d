//! The `riptide` command's contracts, run as a user runs them, on the real capture.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::PathBuf;

use common::{json_lines, riptide, s, scratch, stderr, write};
use riptide_firehose::corpus::{split_frames, write_frames};

fn capture() -> Option<PathBuf> {
    Some(common::capture_dir()?.join("firehose-frames.bin"))
}

#[test]
fn decode_summary_counts_the_capture() {
    let Some(file) = capture() else { return };
    let out = riptide(&["decode", s(&file)]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8(out.stdout).unwrap();
    for want in [
        "frames:  150",
        "commit    148",
        "identity  1",
        "account   1",
        "create    144",
        "update    2",
        "delete    4",
        "blocks:  1549 (SHA-256 verified)",
    ] {
        assert!(text.contains(want), "missing {want:?} in:\n{text}");
    }
}

#[test]
fn decode_json_is_one_object_per_frame_with_records() {
    let Some(file) = capture() else { return };
    let out = riptide(&["decode", s(&file), "--json"]);
    assert!(out.status.success());
    let lines = json_lines(&out);
    assert_eq!(lines.len(), 150);
    let records = lines
        .iter()
        .filter(|l| l["kind"] == "commit")
        .flat_map(|l| l["ops"].as_array().unwrap().iter())
        .filter(|op| op["record"].is_object())
        .count();
    assert_eq!(records, 146);
    assert!(lines.iter().enumerate().all(|(i, l)| l["index"] == i));
}

#[test]
fn tampered_and_truncated_frames_are_reported_counted_and_skipped() {
    let Some(file) = capture() else { return };
    let bytes = std::fs::read(&file).unwrap();
    let frames = split_frames(&bytes).unwrap();
    let mut owned: Vec<Vec<u8>> = frames.iter().take(10).map(|f| f.bytes.to_vec()).collect();
    // Frame 3: a byte flipped inside the CAR's last block (its SHA-256 no longer matches its
    // CID); frame 5: truncated.
    common::flip_in_last_block(&mut owned[3]);
    let half = owned[5].len() / 2;
    owned[5].truncate(half);
    let tmp = scratch();
    let path = write(
        &tmp,
        "tampered.bin",
        &write_frames(owned.iter().map(Vec::as_slice)),
    );
    let out = riptide(&["decode", s(&path)]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("frame 3 at byte"), "{err}");
    assert!(err.contains("frame 5 at byte"), "{err}");
    assert!(err.lines().count() >= 1);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("failed"), "{text}");
    assert!(
        text.contains("frames:  10 (") && text.contains("2 failed"),
        "{text}"
    );
    // The opt-out still refuses the truncated frame.
    let out = riptide(&["decode", s(&path), "--no-verify"]);
    assert_eq!(out.status.code(), Some(1));
}

#[test]
fn relay_loop_without_a_rate_is_refused() {
    let Some(cap) = capture() else { return };
    let out = riptide(&[
        "relay",
        "--replay",
        s(&cap),
        "--listen",
        "127.0.0.1:0",
        "--loop",
    ]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("--loop needs --rate"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn garbage_input_is_an_error_not_a_panic() {
    let tmp = scratch();
    let path = write(&tmp, "garbage.bin", &[0xff, 0xff, 0xff, 0xff, 1, 2, 3]);
    let out = riptide(&["decode", s(&path)]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("corpus frame"));
    let out = riptide(&["decode", "/nonexistent/file.bin"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("/nonexistent/file.bin"));
}

#[test]
fn jetstream_emits_production_count_with_increasing_time_and_cursor() {
    let Some(file) = capture() else { return };
    let out = riptide(&["jetstream", s(&file)]);
    assert!(out.status.success());
    let events = json_lines(&out);
    assert_eq!(events.len(), 152);
    for w in events.windows(2) {
        assert!(w[1]["time_us"].as_i64() > w[0]["time_us"].as_i64());
        assert_eq!(
            w[1]["cursor"].as_i64().unwrap(),
            w[0]["cursor"].as_i64().unwrap() + 1
        );
    }
}

#[test]
fn bench_decode_json_has_the_contract_fields() {
    let Some(file) = capture() else { return };
    // The same run, with `extra` flags before `--json`.
    let bench = |extra: &[&str]| {
        let head = [
            "bench",
            "decode",
            s(&file),
            "--warmup",
            "0",
            "--passes",
            "1",
        ];
        riptide(&[&head[..], extra, &["--json"]].concat())
    };
    let out = bench(&[]);
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for k in [
        "frames",
        "bytes",
        "blocks",
        "errors",
        "passes",
        "fps",
        "mbps",
        "sha_bound_fps",
        "ratio_to_sha_bound",
    ] {
        assert!(v.get(k).is_some(), "missing {k}");
    }
    assert_eq!(v["frames"], 150);
    assert_eq!(v["blocks"], 1549);
    assert_eq!(v["errors"], 0);
    for k in ["min", "median", "max"] {
        assert!(v["fps"][k].as_f64().unwrap() > 0.0);
    }
    // One round: the ratio within it is the ratio of the (single-pass) medians.
    let paired = v["ratio_to_sha_bound_paired"]["median"].as_f64().unwrap();
    let ratio = v["ratio_to_sha_bound"].as_f64().unwrap();
    assert!(
        paired > 0.0 && (paired - ratio).abs() < 0.011,
        "{paired} vs {ratio}"
    );
    let out = bench(&["--no-verify"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v.get("sha_bound_fps").is_none());
}

/// `bench rows` (issue 38) on the capture: every event rendered again from its row, checked
/// byte for byte by the command itself (it fails otherwise); in blocks of 64 so that today's
/// store seals blocks to compare with.
#[test]
fn bench_rows_renders_every_event_of_the_capture_and_reports_both_sizes() {
    let Some(file) = capture() else { return };
    let out = riptide(&[
        "bench",
        "rows",
        s(&file),
        "--block-rows",
        "64",
        "--warmup",
        "0",
        "--passes",
        "1",
        "--json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // The manifest's 152 events (148 commits of 150 ops, an identity and an account event).
    assert_eq!(
        (v["events"].as_u64(), v["rendered_identical"].as_u64()),
        (Some(152), Some(152))
    );
    let f = |k: &str| v[k].as_f64().unwrap_or_else(|| panic!("no {k} in {v}"));
    // Blocks of 64 of both kinds; a segment adds its header and footer to its blocks.
    assert!(f("rows_block_bytes_per_event") > 0.0 && f("v1_block_bytes_per_event") > 0.0);
    assert!(f("rows_segment_bytes_per_event") > f("rows_block_bytes_per_event"));
    let ratio = f("rows_block_bytes_per_event") / f("v1_block_bytes_per_event");
    assert!((ratio - f("rows_to_v1_block_bytes")).abs() < 1e-9);
    for k in [
        "render_rows_events_per_s",
        "replay_rows_events_per_s",
        "replay_v1_store_events_per_s",
    ] {
        assert!(v[k]["median"].as_f64().unwrap() > 0.0, "{k}");
    }
}

#[test]
fn the_sha_kernel_cap_is_followed_reported_and_checked() {
    let Some(dir) = capture().and_then(|f| f.parent().map(|d| d.to_path_buf())) else {
        return;
    };
    let car = dir.join("repo.car");
    let run = |cap: &str| {
        std::process::Command::new(common::BIN)
            .args([
                "bench",
                "repo",
                s(&car),
                "--warmup",
                "0",
                "--passes",
                "1",
                "--json",
            ])
            .env("RIPTIDE_SHA_KERNEL", cap)
            .output()
            .unwrap()
    };
    for cap in ["sha2", "shani2", "auto"] {
        let out = run(cap);
        assert!(out.status.success(), "{cap}: {}", stderr(&out));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let k = &v["machine"]["sha_kernels"];
        assert_eq!(k["cap"], cap, "{k}");
        assert!(v["records"].as_u64().unwrap() > 0);
        let paired = v["ratio_to_sha256_bound_paired"]["median"]
            .as_f64()
            .unwrap();
        let ratio = v["ratio_to_sha256_bound"].as_f64().unwrap();
        assert!(
            paired > 0.0 && (paired - ratio).abs() < 0.011,
            "{paired} vs {ratio}"
        );
        match cap {
            "sha2" => assert_eq!(k["large_batches"], "sha2"),
            // No AVX-512: SHA-NI pairs where the CPU has them, else sha2.
            "shani2" => assert_ne!(k["large_batches"], "avx512x16"),
            _ => assert!(k["cpu_has"]
                .as_array()
                .unwrap()
                .contains(&k["large_batches"])),
        }
    }
    let out = run("avx-512");
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("RIPTIDE_SHA_KERNEL=\"avx-512\""),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_record_missing_from_its_car_is_counted_not_silent() {
    let Some(file) = capture() else { return };
    let bytes = std::fs::read(&file).unwrap();
    let frames = split_frames(&bytes).unwrap();
    // Rebuild the first create frame's CAR without its record block (every other block kept).
    let mut dec = riptide_firehose::FrameDecoder::new();
    let mut rebuilt = None;
    for f in &frames {
        let frame = dec.decode(f.bytes).unwrap();
        let riptide_firehose::Body::Commit(c) = frame.body() else {
            continue;
        };
        let Some(record) = c.ops().find_map(|op| op.cid) else {
            continue;
        };
        let car = frame.car().unwrap();
        let roots: Vec<riptide_cbor::CidBuf> = car.roots().map(|r| r.to_buf()).collect();
        let kept = riptide_car::write_car(
            &roots,
            car.blocks()
                .filter(|b| b.cid != record)
                .map(|b| (b.cid, b.data)),
        );
        let mut tape_arena = riptide_cbor::Arena::new();
        let mut tape = tape_arena.tape(f.bytes);
        let (h, end) = tape
            .decode_prefix(0..f.bytes.len(), &riptide_cbor::Options::strict())
            .unwrap();
        let p = tape
            .decode(end..f.bytes.len(), &riptide_cbor::Options::strict())
            .unwrap();
        let header = riptide_cbor::OwnedValue::from_value(tape.value(h)).unwrap();
        let riptide_cbor::OwnedValue::Map(mut payload) =
            riptide_cbor::OwnedValue::from_value(tape.value(p)).unwrap()
        else {
            panic!()
        };
        payload.insert("blocks".into(), riptide_cbor::OwnedValue::Bytes(kept));
        let mut out = header.to_cbor();
        riptide_cbor::OwnedValue::Map(payload).encode(&mut out);
        rebuilt = Some(out);
        break;
    }
    let tmp = scratch();
    let corpus = write_frames([rebuilt.unwrap().as_slice()].into_iter());
    let path = write(&tmp, "missing-record.bin", &corpus);
    let out = riptide(&["decode", s(&path)]);
    assert!(out.status.success(), "the frame itself decodes");
    assert!(String::from_utf8(out.stdout)
        .unwrap()
        .contains("records missing from their CAR: 1"));
    assert!(String::from_utf8(out.stderr)
        .unwrap()
        .contains("record block not in the CAR"));
}

/// `riptide corpus segments` (test fixtures for the archive): the capture's events as sealed
/// segments, counted against the capture's manifest, seqs 1..=152 in order across the files.
#[test]
fn corpus_segments_seal_the_captures_events() {
    let Some(file) = capture() else { return };
    let dir = scratch();
    let out_dir = dir.path().join("segments");
    let out = riptide(&[
        "corpus",
        "segments",
        s(&file),
        "--out",
        s(&out_dir),
        "--block-rows",
        "8",
        "--segment-blocks",
        "5",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let mut names: Vec<String> = std::fs::read_dir(&out_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(
        names,
        (0..4)
            .map(riptide_segment::segment_name)
            .collect::<Vec<_>>()
    );
    let mut kinds = std::collections::BTreeMap::new();
    let mut seq = 0;
    for n in &names {
        let bytes = std::fs::read(out_dir.join(n)).unwrap();
        let seg = riptide_segment::Segment::open(&bytes).unwrap();
        for b in 0..seg.blocks().len() {
            assert!(seg.blocks()[b].event_count <= 8);
            let body = seg.block_body(b).unwrap();
            for r in seg.rows(b, &body).unwrap() {
                seq += 1;
                assert_eq!(r.seq, seq);
                *kinds.entry(r.kind as u8).or_insert(0) += 1;
            }
        }
    }
    // manifest.json: 144 creates, 2 updates, 4 deletes, 1 identity, 1 account.
    assert_eq!(
        kinds.into_iter().collect::<Vec<_>>(),
        [(1, 144), (2, 2), (3, 4), (4, 1), (5, 1)]
    );
}
