//! The verification commands' contracts (`verify`, `repo`, `corpus sigs`, `bench sigs|repo`), run
//! as a user runs them, on the real capture, goat's listing of a real repository, and tampered
//! copies of both.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;

use common::{json_lines, riptide, s, scratch, stderr, write};
use riptide_car::{write_car, CarOptions, CarReader};
use riptide_cbor::{Arena, CidBuf, Options, OwnedValue, DAG_CBOR};
use riptide_crypto::{Curve, PrivateKey};
use riptide_firehose::corpus::{split_frames, write_frames};

#[test]
fn verify_the_capture_json_fields_order_and_exit_code() {
    let Some(d) = common::capture_dir() else {
        return;
    };
    let (frames, docs) = (d.join("firehose-frames.bin"), d.join("did_docs.json"));
    let one = riptide(&["verify", s(&frames), "--did-docs", s(&docs), "--json"]);
    assert_eq!(one.status.code(), Some(0), "{}", stderr(&one));
    let lines = json_lines(&one);
    assert_eq!(lines.len(), 150);
    for (i, l) in lines.iter().enumerate() {
        let keys: Vec<&str> = l.as_object().unwrap().keys().map(|k| k.as_str()).collect();
        let mut want = vec!["did", "index", "kind", "reason", "seq", "verdict"];
        want.sort();
        let mut keys = keys;
        keys.sort();
        assert_eq!(keys, want);
        assert_eq!(l["index"], i);
        assert_eq!(l["verdict"], "ok", "{l}");
        assert!(l["reason"].is_null());
        assert!(l["seq"].is_i64());
        assert!(l["did"].as_str().unwrap().starts_with("did:plc:"));
    }
    let kinds: BTreeMap<String, usize> = lines.iter().fold(BTreeMap::new(), |mut m, l| {
        *m.entry(l["kind"].as_str().unwrap().to_string())
            .or_default() += 1;
        m
    });
    assert_eq!(
        kinds,
        BTreeMap::from([
            ("account".into(), 1),
            ("commit".into(), 148),
            ("identity".into(), 1)
        ])
    );
    assert!(stderr(&one).contains("ok 150"), "{}", stderr(&one));

    // Two threads: the same output, in the same order.
    let two = riptide(&[
        "verify",
        s(&frames),
        "--did-docs",
        s(&docs),
        "--json",
        "--threads",
        "2",
    ]);
    assert_eq!(two.status.code(), Some(0));
    assert_eq!(two.stdout, one.stdout);

    // Without --json: nothing on stdout, the summary on stderr.
    let plain = riptide(&["verify", s(&frames), "--did-docs", s(&docs)]);
    assert_eq!(plain.status.code(), Some(0));
    assert!(plain.stdout.is_empty());
    assert!(stderr(&plain).contains("verified 150 frames"));
}

#[test]
fn verify_reports_each_bad_frame_and_exits_1() {
    let Some(d) = common::capture_dir() else {
        return;
    };
    let file = std::fs::read(d.join("firehose-frames.bin")).unwrap();
    let frames = split_frames(&file).unwrap();
    let mut owned: Vec<Vec<u8>> = frames.iter().map(|f| f.bytes.to_vec()).collect();
    // Frame 3: a byte flipped inside the CAR's last block: bad-block-cid.
    common::flip_in_last_block(&mut owned[3]);
    // Frame 4: a byte flipped near the end, in `prevData` (the payload's last field in DAG-CBOR
    // key order): the inverted tree no longer matches it.
    let n = owned[4].len();
    owned[4][n - 20] ^= 0x40;
    // Frame 5: truncated: malformed.
    let half = owned[5].len() / 2;
    owned[5].truncate(half);
    let tmp = scratch();
    let corpus = write(
        &tmp,
        "tampered.bin",
        &write_frames(owned.iter().map(Vec::as_slice)),
    );

    // Documents without the account of frame 7: unknown-key.
    let docs: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.join("did_docs.json")).unwrap()).unwrap();
    let one = riptide(&[
        "verify",
        s(&corpus),
        "--did-docs",
        s(&d.join("did_docs.json")),
        "--json",
    ]);
    let did7 = json_lines(&one)[7]["did"].as_str().unwrap().to_string();
    let mut fewer = docs.as_object().unwrap().clone();
    fewer.remove(&did7);
    let docs_path = write(
        &tmp,
        "fewer_docs.json",
        serde_json::to_string(&fewer).unwrap().as_bytes(),
    );

    let out = riptide(&["verify", s(&corpus), "--did-docs", s(&docs_path), "--json"]);
    assert_eq!(out.status.code(), Some(1));
    let lines = json_lines(&out);
    assert_eq!(lines.len(), 150);
    assert_eq!(lines[3]["verdict"], "bad-block-cid");
    assert!(
        lines[3]["reason"]
            .as_str()
            .unwrap()
            .contains("does not hash"),
        "{}",
        lines[3]
    );
    assert_eq!(lines[3]["kind"], "commit");
    assert!(
        lines[3]["did"].is_string(),
        "the DID of a frame with a bad block is still read"
    );
    assert_eq!(lines[4]["verdict"], "inversion-mismatch");
    assert_eq!(lines[5]["verdict"], "malformed");
    let unknown = lines
        .iter()
        .filter(|l| l["verdict"] == "unknown-key")
        .count();
    assert!(unknown >= 1);
    assert!(lines
        .iter()
        .filter(|l| l["did"] == did7.as_str())
        .all(|l| l["kind"] != "commit" || l["verdict"] == "unknown-key"));
    let bad = lines.iter().filter(|l| l["verdict"] != "ok").count();
    let err = stderr(&out);
    assert!(err.contains(&format!("ok {}", 150 - bad)), "{err}");
    assert!(
        err.contains("bad-block-cid 1")
            && err.contains("malformed 1")
            && err.contains("inversion-mismatch 1")
            && err.contains(&format!("unknown-key {unknown}")),
        "{err}"
    );

    // Threads do not change the verdicts or their order.
    let two = riptide(&[
        "verify",
        s(&corpus),
        "--did-docs",
        s(&docs_path),
        "--json",
        "--threads",
        "2",
    ]);
    assert_eq!(two.stdout, out.stdout);

    // Plain mode: one line per bad frame on stderr, with index and byte offset.
    let plain = riptide(&["verify", s(&corpus), "--did-docs", s(&docs_path)]);
    assert_eq!(plain.status.code(), Some(1));
    let err = stderr(&plain);
    assert!(
        err.contains("frame 3 at byte") && err.contains("bad-block-cid"),
        "{err}"
    );
    assert!(err.contains("frame 5 at byte"), "{err}");
}

#[test]
fn verify_usage_errors_exit_2() {
    let Some(d) = common::capture_dir() else {
        return;
    };
    let frames = d.join("firehose-frames.bin");
    assert_eq!(riptide(&["verify", s(&frames)]).status.code(), Some(2)); // --did-docs is required
    let out = riptide(&["verify", s(&frames), "--did-docs", "/nonexistent.json"]);
    assert_eq!(out.status.code(), Some(2));
    let out = riptide(&[
        "verify",
        s(&frames),
        "--did-docs",
        s(&d.join("did_docs.json")),
        "--threads",
        "0",
    ]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn repo_ls_and_inspect_match_goat() {
    let Some(d) = common::capture_dir() else {
        return;
    };
    let car = d.join("repo.car");
    let ls = riptide(&["repo", "ls", s(&car)]);
    assert!(ls.status.success(), "{}", stderr(&ls));
    assert_eq!(
        String::from_utf8(ls.stdout).unwrap(),
        std::fs::read_to_string(d.join("car_expected_records.tsv")).unwrap()
    );

    let expected = std::fs::read_to_string(d.join("car_expected_commit.txt")).unwrap();
    let inspect = riptide(&["repo", "inspect", s(&car)]);
    assert!(inspect.status.success());
    assert_eq!(String::from_utf8(inspect.stdout).unwrap(), expected);

    let json = riptide(&["repo", "inspect", s(&car), "--json"]);
    assert!(json.status.success());
    let v = &json_lines(&json)[0];
    let field = |name: &str| {
        expected
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|s| s.trim().to_string())
            .unwrap()
    };
    assert_eq!(v["did"], field("DID:").as_str());
    assert_eq!(v["data"], field("Data CID:").as_str());
    assert_eq!(v["rev"], field("Revision:").as_str());
    assert_eq!(v["version"], 3);
    assert!(v["prev"].is_null()); // goat: <nil>
    assert_eq!(v.as_object().unwrap().len(), 5);
}

/// The repository with its commit re-signed by `key` and re-addressed (new commit CID as root).
fn resigned(car_bytes: &[u8], key: &PrivateKey) -> Vec<u8> {
    let mut reader = CarReader::new();
    let car = reader.read(car_bytes, &CarOptions::repository()).unwrap();
    let root = car.roots().next().unwrap();
    let block = car.get(root).unwrap();
    let mut arena = Arena::new();
    let mut tape = arena.tape(block);
    let item = tape.decode(0..block.len(), &Options::strict()).unwrap();
    let OwnedValue::Map(mut m) = OwnedValue::from_value(tape.value(item)).unwrap() else {
        panic!()
    };
    m.remove("sig");
    let unsigned = OwnedValue::Map(m.clone()).to_cbor();
    m.insert(
        "sig".into(),
        OwnedValue::Bytes(key.sign(&unsigned).to_vec()),
    );
    let commit = OwnedValue::Map(m).to_cbor();
    let cid = CidBuf::sha256(DAG_CBOR, &commit);
    let mut blocks: Vec<(CidBuf, Vec<u8>)> = vec![(cid, commit)];
    blocks.extend(
        car.blocks()
            .filter(|b| b.cid != root)
            .map(|b| (b.cid.to_buf(), b.data.to_vec())),
    );
    write_car(
        &[cid],
        blocks.iter().map(|(c, d)| (c.as_cid(), d.as_slice())),
    )
}

#[test]
fn repo_verify_json_signature_and_tampering() {
    let Some(d) = common::capture_dir() else {
        return;
    };
    let car = d.join("repo.car");
    let tmp = scratch();
    let out = riptide(&["repo", "verify", s(&car), "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v = &json_lines(&out)[0];
    assert_eq!(v["verdict"], "ok");
    assert_eq!(v["records"], 23); // lines of car_expected_records.tsv
    assert_eq!(v["blocks"], 29);
    assert_eq!(v["bytes"], 8117);
    assert_eq!(v["signature_checked"], false);
    for phase in ["car", "signature", "walk", "rebuild"] {
        assert!(v["timings_ms"][phase].as_f64().unwrap() >= 0.0, "{phase}");
    }

    // The real commit with a key that is not the account's: bad-signature.
    let stranger = PrivateKey::from_bytes(Curve::Secp256k1, &[11; 32])
        .unwrap()
        .public_key()
        .to_did_key();
    let out = riptide(&["repo", "verify", s(&car), "--key", &stranger, "--json"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(json_lines(&out)[0]["verdict"], "bad-signature");

    // Re-signed with our key: verifies with it, by did:key and by DID document.
    for curve in [Curve::Secp256k1, Curve::P256] {
        let signer = PrivateKey::from_bytes(curve, &[12; 32]).unwrap();
        let path = write(
            &tmp,
            &format!("resigned-{curve}.car"),
            &resigned(&std::fs::read(&car).unwrap(), &signer),
        );
        let did_key = signer.public_key().to_did_key();
        let out = riptide(&["repo", "verify", s(&path), "--key", &did_key, "--json"]);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let v = &json_lines(&out)[0];
        assert_eq!(
            (v["verdict"].as_str(), v["signature_checked"].as_bool()),
            (Some("ok"), Some(true))
        );

        let doc = |did: &str| {
            serde_json::json!({
                "id": did,
                "verificationMethod": [{"id": format!("{did}#atproto"), "type": "Multikey",
                    "controller": did, "publicKeyMultibase": signer.public_key().to_multibase()}],
            })
            .to_string()
        };
        let good = write(
            &tmp,
            "doc.json",
            doc("did:plc:53iucmf5ldftgqyf2ac7hmhd").as_bytes(),
        );
        let out = riptide(&["repo", "verify", s(&path), "--did-doc", s(&good)]);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        assert!(String::from_utf8_lossy(&out.stdout).contains("signature: verified"));
        let other = write(
            &tmp,
            "other-doc.json",
            doc("did:plc:aaaaaaaaaaaaaaaaaaaaaaaa").as_bytes(),
        );
        let out = riptide(&["repo", "verify", s(&path), "--did-doc", s(&other), "--json"]);
        assert_eq!(out.status.code(), Some(1));
        assert_eq!(json_lines(&out)[0]["verdict"], "unknown-key");
    }

    // A flipped byte in the last block: bad-block-cid, in JSON and in plain mode.
    let mut bytes = std::fs::read(&car).unwrap();
    let n = bytes.len();
    bytes[n - 10] ^= 0x01;
    let bad = write(&tmp, "bad.car", &bytes);
    let out = riptide(&["repo", "verify", s(&bad), "--json"]);
    assert_eq!(out.status.code(), Some(1));
    let v = &json_lines(&out)[0];
    assert_eq!(v["verdict"], "bad-block-cid");
    assert!(v["records"].is_null() && v["reason"].is_string());
    let out = riptide(&["repo", "verify", s(&bad)]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("bad-block-cid"));
    assert_eq!(riptide(&["repo", "ls", s(&bad)]).status.code(), Some(1));
}

#[test]
fn corpus_sigs_round_trips_through_bench_sigs() {
    let Some(d) = common::capture_dir() else {
        return;
    };
    let tmp = scratch();
    let out_path = tmp.path().join("capture.sigs");
    let out = riptide(&[
        "corpus",
        "sigs",
        s(&d.join("firehose-frames.bin")),
        "--did-docs",
        s(&d.join("did_docs.json")),
        "-o",
        s(&out_path),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("wrote 148 entries"),
        "{}",
        stderr(&out)
    );
    let bytes = std::fs::read(&out_path).unwrap();
    assert_eq!(u32::from_be_bytes(bytes[..4].try_into().unwrap()), 148);

    let bench = riptide(&[
        "bench",
        "sigs",
        s(&out_path),
        "--warmup",
        "0",
        "--passes",
        "1",
        "--json",
    ]);
    assert_eq!(bench.status.code(), Some(0), "{}", stderr(&bench));
    let v = &json_lines(&bench)[0];
    assert_eq!(v["entries"], 148); // every commit of the capture verifies
    assert_eq!(v["secp256k1"], 148);
    assert_eq!(v["p256"], 0);
    assert_eq!(v["errors"], 0);
    for tier in ["full", "crypto", "preparsed"] {
        let t = &v["tiers"][tier];
        assert!(t["median"].as_f64().unwrap() > 0.0, "{tier}");
        assert!(t["min"].as_f64().unwrap() <= t["max"].as_f64().unwrap());
    }

    // A corrupted entry (a signature byte) is counted as an error, exit 1.
    let mut bad = bytes.clone();
    let len = u16::from_be_bytes([bad[5], bad[6]]) as usize;
    // Inside the first commit's sig: after the text "sig" and the bytes(64) head `58 40`.
    let at = bad[7..7 + len]
        .windows(6)
        .position(|w| w == [0x63, b's', b'i', b'g', 0x58, 0x40])
        .unwrap();
    bad[7 + at + 6 + 3] ^= 0x01;
    let bad_path = write(&tmp, "bad.sigs", &bad);
    let bench = riptide(&[
        "bench",
        "sigs",
        s(&bad_path),
        "--warmup",
        "0",
        "--passes",
        "1",
        "--json",
    ]);
    assert_eq!(bench.status.code(), Some(1));
    assert_eq!(json_lines(&bench)[0]["errors"], 1);
}

#[test]
fn bench_repo_reports_each_phase() {
    let Some(d) = common::capture_dir() else {
        return;
    };
    let out = riptide(&[
        "bench",
        "repo",
        s(&d.join("repo.car")),
        "--warmup",
        "0",
        "--passes",
        "3",
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v = &json_lines(&out)[0];
    assert_eq!(v["records"], 23);
    assert_eq!(v["signature_checked"], false);
    for phase in ["car", "signature", "walk", "rebuild", "total"] {
        assert!(
            v["timings_us"][phase]["median"].as_f64().unwrap() >= 0.0,
            "{phase}"
        );
    }
}

#[test]
fn bench_repo_repeat_reports_the_mean_per_verification() {
    let Some(d) = common::capture_dir() else {
        return;
    };
    let path = d.join("repo.car");
    let car = s(&path);
    let total = |repeat: &str| {
        let out = riptide(&[
            "bench", "repo", car, "--warmup", "1", "--passes", "3", "--repeat", repeat, "--json",
        ]);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let v = json_lines(&out).remove(0);
        assert_eq!(v["repeat"], repeat.parse::<u64>().unwrap());
        assert_eq!(v["records"], 23);
        v["timings_us"]["total"]["median"].as_f64().unwrap()
    };
    // A mean over 100 verifications is about one verification, not a hundred (a sum would be
    // ~100x); the bound of 20x leaves room for a loaded machine.
    let (one, hundred) = (total("1"), total("100"));
    assert!(
        hundred < one * 20.0,
        "repeat 100: {hundred} us, repeat 1: {one} us"
    );
    let zero = riptide(&["bench", "repo", car, "--repeat", "0", "--json"]);
    assert_ne!(zero.status.code(), Some(0), "--repeat 0 must be refused");
}
