//! Production Jetstream v1 events (`jetstream-golden/golden_v1.jsonl`): every record in a commit
//! event, converted from its JSON to DAG-CBOR, hashes to the event's `commit.cid`; and rendering
//! those bytes back with `to_json_string` reproduces the record's JSON text *byte for byte*.
//!
//! Why: the CID proves our JSON → DAG-CBOR direction matches what the author's PDS hashed (an
//! independent implementation); the byte-identical rendering proves our CBOR → JSON direction
//! matches Go's `encoding/json` as production Jetstream emits it (key order, escaping, `$link`),
//! which is the compatibility promise of the Jetstream server.
//!
//! One documented difference (`shared/docs/jetstream-protocol.md` §3.2): legacy Jetstream wrote
//! blob objects in Go struct order `$type, ref, mimeType, size`, while riptide (like Jetstream v2)
//! sorts every object bytewise, giving `$type, mimeType, ref, size`. The test rewrites exactly
//! that blob shape in the expected text, counts how often it did, and demands byte identity for
//! everything else.
#![allow(clippy::unwrap_used)]

use riptide_testdata as common;

use std::collections::BTreeMap;

use riptide_cbor::{json_to_value, to_json_string, Arena, CidBuf, Options, DAG_CBOR};
use serde_json::value::RawValue;

/// One line's top-level fields, and its `commit` object's fields, as raw JSON text.
fn fields(text: &str) -> BTreeMap<String, &RawValue> {
    serde_json::from_str(text).unwrap()
}

#[test]
fn records_hash_to_their_cid_and_render_byte_identically() {
    let Some(file) = common::read_string("jetstream-golden/golden_v1.jsonl") else {
        return;
    };
    let mut lines = 0;
    let mut commits = 0;
    let mut records = 0;
    let mut collections = Vec::new();
    let mut legacy_blobs = 0;
    for (n, line) in file
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        lines += 1;
        let event = fields(line);
        let kind: String = serde_json::from_str(event["kind"].get()).unwrap();
        if kind != "commit" {
            continue;
        }
        commits += 1;
        let commit = fields(event["commit"].get());
        let Some(raw_record) = commit.get("record") else {
            // Deletes carry no record.
            let op: String = serde_json::from_str(commit["operation"].get()).unwrap();
            assert_eq!(
                op,
                "delete",
                "line {}: a non-delete commit without a record",
                n + 1
            );
            continue;
        };
        let want_cid: String = serde_json::from_str(commit["cid"].get()).unwrap();
        let want_cid = CidBuf::parse(&want_cid).unwrap();

        // JSON → DAG-CBOR → CID.
        let json: serde_json::Value = serde_json::from_str(raw_record.get()).unwrap();
        let value = json_to_value(&json).unwrap_or_else(|e| panic!("line {}: {e}", n + 1));
        let cbor = value.to_cbor();
        assert_eq!(
            CidBuf::sha256(DAG_CBOR, &cbor),
            want_cid,
            "line {}: record CID",
            n + 1
        );

        // DAG-CBOR → strict decode → JSON text identical to what Jetstream sent.
        let mut arena = Arena::new();
        let mut tape = arena.tape(&cbor);
        let item = tape.decode(0..cbor.len(), &Options::strict()).unwrap();
        let rendered = to_json_string(tape.value(item)).unwrap();
        let (expected, blobs) = sort_legacy_blobs(raw_record.get());
        legacy_blobs += blobs;
        assert_eq!(
            rendered,
            expected,
            "line {}: rendering differs from Jetstream's",
            n + 1
        );
        // Independently of the rewrite: the same JSON data.
        let reparsed: serde_json::Value = serde_json::from_str(&rendered).unwrap();
        assert_eq!(reparsed, json, "line {}", n + 1);

        let collection: String = serde_json::from_str(commit["collection"].get()).unwrap();
        collections.push(collection);
        records += 1;
    }
    assert_eq!(lines, 10, "golden_v1.jsonl holds 10 events");
    assert_eq!(commits, 8, "8 of them are commits");
    // 7 carry a record: like, post (reply), repost, follow, profile update (blobs), a non-Bluesky
    // lexicon update, block. The eighth commit is a delete.
    assert_eq!(records, 7, "records checked: {collections:?}");
    // The profile update has an avatar and a banner: the only blobs in the file.
    assert_eq!(legacy_blobs, 2);
}

/// Rewrites every legacy-ordered blob `{"$type":"blob","ref":R,"mimeType":M,"size":S}` in `raw`
/// to sorted order `{"$type":"blob","mimeType":M,"ref":R,"size":S}`; returns the text and the
/// number of blobs rewritten. Anything not of exactly that shape is left alone (and would then
/// fail the byte comparison).
fn sort_legacy_blobs(raw: &str) -> (String, usize) {
    const HEAD: &str = r#"{"$type":"blob","ref":"#;
    let mut out = String::with_capacity(raw.len());
    let mut rest = raw;
    let mut count = 0;
    while let Some(at) = rest.find(HEAD) {
        out.push_str(&rest[..at]);
        let body = &rest[at + HEAD.len()..];
        // ref is {"$link":"…"}: no nested braces.
        let parsed = body.find('}').and_then(|r_end| {
            let r = &body[..=r_end];
            let after = body[r_end + 1..].strip_prefix(r#","mimeType":""#)?;
            let m_end = after.find('"')?; // MIME types need no escapes
            let m = &after[..m_end];
            let after = after[m_end + 1..].strip_prefix(r#","size":"#)?;
            let s_end = after.find('}')?;
            let size = &after[..s_end];
            Some((r, m, size, &after[s_end + 1..]))
        });
        match parsed {
            Some((r, m, size, tail)) => {
                out.push_str(&format!(
                    r#"{{"$type":"blob","mimeType":"{m}","ref":{r},"size":{size}}}"#
                ));
                count += 1;
                rest = tail;
            }
            None => {
                out.push_str(HEAD);
                rest = body;
            }
        }
    }
    out.push_str(rest);
    (out, count)
}
