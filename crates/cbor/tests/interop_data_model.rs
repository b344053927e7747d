//! The atproto interoperability vectors for the data model (`interop/data-model/`, from
//! bluesky-social/atproto-interop-tests): JSON ↔ DAG-CBOR ↔ CID agreement with the reference
//! implementations, and the data-model rules of `json_to_value` (what must convert, what must be
//! refused).
//!
//! Why: a record given as JSON has to encode to exactly the bytes its author hashed, and decoded
//! DAG-CBOR has to render to JSON that other implementations read back as the same data. These
//! vectors are the independent oracle for both directions.
#![allow(clippy::unwrap_used)]

use riptide_testdata as common;

use riptide_cbor::{json_to_value, to_json_string, Arena, CidBuf, Options, DAG_CBOR};
use serde_json::Value as J;

fn load(name: &str) -> Option<Vec<J>> {
    let text = common::read_string(&format!("interop/data-model/{name}"))?;
    match serde_json::from_str(&text).unwrap() {
        J::Array(entries) => Some(entries),
        other => panic!("{name}: expected a JSON array, got {other}"),
    }
}

#[test]
fn fixtures_json_cbor_cid_agree_in_both_directions() {
    let Some(fixtures) = load("data-model-fixtures.json") else {
        return;
    };
    let mut checked = 0;
    for (i, fx) in fixtures.iter().enumerate() {
        let json = &fx["json"];
        let want_cbor = data_encoding::BASE64_NOPAD
            .decode(
                fx["cbor_base64"]
                    .as_str()
                    .unwrap()
                    .trim_end_matches('=')
                    .as_bytes(),
            )
            .unwrap();
        let want_cid = CidBuf::parse(fx["cid"].as_str().unwrap()).unwrap();

        // JSON → data model → DAG-CBOR: byte-identical to the reference encoding.
        let value = json_to_value(json).unwrap_or_else(|e| panic!("fixture {i}: {e}"));
        let cbor = value.to_cbor();
        assert_eq!(
            cbor, want_cbor,
            "fixture {i}: encoding differs from the reference"
        );

        // CID of the reference bytes, and of the value, equal the reference CID.
        assert_eq!(
            CidBuf::sha256(DAG_CBOR, &want_cbor),
            want_cid,
            "fixture {i}: CID of the bytes"
        );
        assert_eq!(value.cid(), want_cid, "fixture {i}: OwnedValue::cid");
        assert_eq!(
            value.cid().to_string(),
            fx["cid"].as_str().unwrap(),
            "fixture {i}: CID string"
        );

        // DAG-CBOR → strict decode → JSON: the same JSON data as the fixture.
        let mut arena = Arena::new();
        let mut tape = arena.tape(&want_cbor);
        let item = tape
            .decode(0..want_cbor.len(), &Options::strict())
            .unwrap_or_else(|e| panic!("fixture {i}: strict decode: {e}"));
        let rendered = to_json_string(tape.value(item)).unwrap();
        let reparsed: J = serde_json::from_str(&rendered).unwrap_or_else(|e| {
            panic!("fixture {i}: rendered JSON does not parse: {e}\n{rendered}")
        });
        assert_eq!(
            &reparsed, json,
            "fixture {i}: JSON rendering differs\n{rendered}"
        );
        checked += 1;
    }
    assert_eq!(checked, 3, "data-model-fixtures.json holds three fixtures");
}

#[test]
fn valid_documents_convert_and_round_trip() {
    let Some(entries) = load("data-model-valid.json") else {
        return;
    };
    assert!(!entries.is_empty());
    for e in &entries {
        let note = e["note"].as_str().unwrap();
        let value = json_to_value(&e["json"]).unwrap_or_else(|err| panic!("{note}: {err}"));
        // The encoding is strict DAG-CBOR and re-renders to the same JSON data (integer-like
        // floats such as 123.0 come back as integers, which compare equal as JSON numbers only
        // when normalised, so compare after converting the rendering back).
        let cbor = value.to_cbor();
        let mut arena = Arena::new();
        let mut tape = arena.tape(&cbor);
        let item = tape
            .decode(0..cbor.len(), &Options::strict())
            .unwrap_or_else(|err| panic!("{note}: {err}"));
        let rendered: J = serde_json::from_str(&to_json_string(tape.value(item)).unwrap()).unwrap();
        assert_eq!(json_to_value(&rendered).unwrap(), value, "{note}");
    }
    assert_eq!(
        entries.len(),
        5,
        "data-model-valid.json holds five documents"
    );
}

#[test]
fn invalid_documents_are_each_refused() {
    let Some(entries) = load("data-model-invalid.json") else {
        return;
    };
    let mut refused = Vec::new();
    for e in &entries {
        let note = e["note"].as_str().unwrap();
        match json_to_value(&e["json"]) {
            Ok(v) => panic!("{note}: accepted as {v:?}"),
            Err(err) => refused.push(format!("{note}: {err}")),
        }
    }
    // Every note named in the vector file was seen and refused (guards against an empty or
    // reshaped file passing vacuously).
    let notes: Vec<&str> = entries
        .iter()
        .map(|e| e["note"].as_str().unwrap())
        .collect();
    for expected in [
        "top-level not an object",
        "float",
        "record with $type null",
        "record with $type wrong type",
        "record with empty $type string",
        "blob with string size",
        "blob with missing key",
        "bytes with wrong field type",
        "bytes with extra fields",
        "link with wrong field type",
        "link with bogus CID",
        "link with extra fields",
    ] {
        assert!(
            notes.contains(&expected),
            "vector {expected:?} missing from the file"
        );
    }
    assert_eq!(refused.len(), entries.len());
    assert_eq!(refused.len(), 12);
}
