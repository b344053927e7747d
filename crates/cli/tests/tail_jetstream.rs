//! `riptide tail --jetstream` against `riptide serve`: the Jetstream side of `tail`, end to end.
//! The server ingests the real capture; `tail` asks for one collection, compressed with the legacy
//! dictionary, from the start, and must print exactly that collection's events of the capture's
//! Jetstream projection (`riptide jetstream`, itself checked against production elsewhere), in
//! order, as received.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{json_lines, riptide, s, stderr, wait_for};

const COLLECTION: &str = "app.bsky.feed.like";

#[test]
fn tail_prints_the_filtered_compressed_stream_of_serve() {
    let Some(corpus) = riptide_testdata::corpus() else {
        return;
    };
    let capture = corpus.join("jetstream-2026-07");
    let frames = capture.join("firehose-frames.bin");
    let dictionary = corpus.join("jetstream-dictionaries/legacy_subscribe.zdict");

    // What tail must print: the projection's events of that collection, in order.
    let projection = riptide(&["jetstream", s(&frames)]);
    assert!(projection.status.success(), "{}", stderr(&projection));
    let key = |e: &serde_json::Value| {
        (
            e["did"].as_str().unwrap().to_owned(),
            e["commit"]["rkey"].as_str().unwrap().to_owned(),
            e["commit"]["cid"].as_str().unwrap().to_owned(),
        )
    };
    let expected: Vec<_> = json_lines(&projection)
        .iter()
        .filter(|e| e["commit"]["collection"] == COLLECTION)
        .map(key)
        .collect();
    assert!(
        expected.len() > 50,
        "the capture has {} likes",
        expected.len()
    );

    let data = tempfile::tempdir().unwrap();
    let (_server, addr) = common::spawn_serve(
        common::serve_command(data.path())
            .arg("--did-docs")
            .arg(capture.join("did_docs.json"))
            .arg("--zstd-dictionary")
            .arg(&dictionary)
            .arg("--ingest-file")
            .arg(&frames),
    );
    wait_for(&addr, "riptide_ingest_finished", 1.0);

    let out = riptide(&[
        "tail",
        "--jetstream",
        &format!("ws://{addr}"),
        "--collection",
        COLLECTION,
        "--cursor",
        "0",
        "--zstd-dictionary",
        s(&dictionary),
        "--count",
        &expected.len().to_string(),
        "--json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let got = json_lines(&out);
    assert!(got.iter().all(|e| e["commit"]["collection"] == COLLECTION));
    assert_eq!(got.iter().map(key).collect::<Vec<_>>(), expected);
}

/// `riptide tail --jetstream URL` with a `subscribeEvents` URL speaks v2: `kinds`,
/// `collections`, a seq cursor, compression with the 20260811 dictionary; a refused request
/// (an unknown kind) is an error naming the server's answer, not retried forever.
#[test]
fn tail_speaks_v2_to_subscribe_events() {
    let Some(corpus) = riptide_testdata::corpus() else {
        return;
    };
    let capture = corpus.join("jetstream-2026-07");
    let frames = capture.join("firehose-frames.bin");
    let dictionary = corpus.join("jetstream-dictionaries/subscribe_events_20260811.zdict");
    let projection = riptide(&["jetstream", s(&frames)]);
    assert!(projection.status.success(), "{}", stderr(&projection));
    // (seq, rkey, cid) of the likes: seqs are the projection's positions.
    let expected: Vec<(u64, String, String)> = json_lines(&projection)
        .iter()
        .enumerate()
        .filter(|(_, e)| e["commit"]["collection"] == COLLECTION)
        .map(|(i, e)| {
            (
                i as u64 + 1,
                e["commit"]["rkey"].as_str().unwrap().to_owned(),
                e["commit"]["cid"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert!(expected.len() > 50);
    let data = tempfile::tempdir().unwrap();
    let (_server, addr) = common::spawn_serve(
        common::serve_command(data.path())
            .arg("--did-docs")
            .arg(capture.join("did_docs.json"))
            .arg("--zstd-dictionary-v2")
            .arg(&dictionary)
            .arg("--ingest-file")
            .arg(&frames),
    );
    wait_for(&addr, "riptide_ingest_finished", 1.0);
    let url = format!("ws://{addr}/xrpc/network.bsky.jetstream.subscribeEvents");
    // From the second like on: the cursor is inclusive. The frames and the bytes received
    // (`tail`'s closing line on stderr).
    let from = expected[1].0.to_string();
    let count = (expected.len() - 1).to_string();
    let tail = |compression: &[&str]| {
        let mut args = vec![
            "tail",
            "--jetstream",
            &url,
            "--kind",
            "commit",
            "--collection",
            COLLECTION,
            "--cursor",
            &from,
            "--count",
            &count,
            "--json",
        ];
        args.extend_from_slice(compression);
        let out = riptide(&args);
        assert!(out.status.success(), "{}", stderr(&out));
        let got: Vec<(u64, String, String)> = json_lines(&out)
            .iter()
            .map(|f| {
                assert_eq!(f["$type"], "message");
                let p = &f["payload"];
                assert_eq!(p["$type"], "network.bsky.jetstream.subscribeEvents#commit");
                assert_eq!(p["collection"], COLLECTION);
                (
                    p["seq"].as_u64().unwrap(),
                    p["rkey"].as_str().unwrap().to_owned(),
                    p["cid"].as_str().unwrap().to_owned(),
                )
            })
            .collect();
        assert_eq!(got, expected[1..]);
        let err = stderr(&out);
        let bytes: u64 = err
            .split(" messages, ")
            .nth(1)
            .and_then(|r| r.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no byte count in {err}"));
        bytes
    };
    let with_file = tail(&["--zstd-dictionary", s(&dictionary)]);
    // `--compress` fetches the same dictionary from getZstdDictionary: the same frames, the
    // same compressed bytes, fewer than uncompressed.
    let fetched = tail(&["--compress"]);
    let plain = tail(&[]);
    assert_eq!(fetched, with_file);
    assert!(fetched < plain * 2 / 3, "{fetched} compressed vs {plain}");
    let bad = riptide(&[
        "tail",
        "--jetstream",
        &url,
        "--kind",
        "like",
        "--count",
        "1",
    ]);
    assert!(!bad.status.success());
    assert!(
        stderr(&bad).contains("InvalidRequest") && stderr(&bad).contains("unknown kind"),
        "{}",
        stderr(&bad)
    );
}
