//! Property tests over generated data-model values: encoding, strict decoding and atproto JSON
//! are mutually inverse, and no byte string makes the decoder panic.
//!
//! Properties:
//! - `to_cbor` → strict decode → `OwnedValue::from_value` gives back the original value, and
//!   `encode_value` of the decoded view reproduces the encoded bytes exactly (the encoding is
//!   canonical and the decoder loses nothing);
//! - for values whose top level is a map: `write_json` → `serde_json` → `json_to_value` gives back
//!   the original (serde_json is the independent JSON parser);
//! - arbitrary bytes and mutated valid encodings: strict and lenient decoding return `Ok` or
//!   `Err`, never panic, and anything strict accepts is the canonical encoding of its value.
//!
//! Why: the example-based tests pin known vectors; these explore the corners of the value space
//! (integer boundaries across the whole i64 range, every Unicode scalar, empty containers, links
//! of both codecs) that vectors miss.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;

use proptest::prelude::*;
use riptide_cbor::{
    encode_value, json_to_value, to_json_string, write_json, Arena, CidBuf, Options, OwnedValue,
    DAG_CBOR, RAW,
};

/// Integers: anywhere in i64, with the encoding's width boundaries over-represented.
fn int() -> impl Strategy<Value = i64> {
    let edges: Vec<i64> = [
        0u64,
        23,
        24,
        255,
        256,
        65_535,
        65_536,
        4_294_967_295,
        4_294_967_296,
    ]
    .iter()
    .flat_map(|&e| {
        let e = e as i64;
        [e, -e, -e - 1, e + 1]
    })
    .chain([i64::MAX, i64::MIN, i64::MAX - 1, i64::MIN + 1])
    .collect();
    prop_oneof![any::<i64>(), proptest::sample::select(edges)]
}

/// Text: any Unicode scalars, and characters that JSON escaping treats specially.
fn text() -> impl Strategy<Value = String> {
    let special: Vec<char> = vec![
        '"',
        '\\',
        '/',
        '<',
        '>',
        '&',
        '\n',
        '\r',
        '\t',
        '\u{0}',
        '\u{8}',
        '\u{c}',
        '\u{1f}',
        '\u{7f}',
        '\u{2028}',
        '\u{2029}',
        '\u{2027}',
        '\u{e2}',
        'é',
        '😀',
        '\u{fffd}',
        '\u{10ffff}',
        'a',
        '$',
    ];
    prop_oneof![
        proptest::collection::vec(any::<char>(), 0..12).prop_map(String::from_iter),
        proptest::collection::vec(proptest::sample::select(special), 0..12)
            .prop_map(String::from_iter),
        "[a-z]{0,8}",
    ]
}

/// Map keys: any text (CBOR round trip), or text without a leading `$` (JSON round trip, where
/// `$link`, `$bytes` and `$type` have meaning).
fn key(json_safe: bool) -> BoxedStrategy<String> {
    if json_safe {
        text()
            .prop_filter("keys starting with $ are special in atproto JSON", |k| {
                !k.starts_with('$')
            })
            .boxed()
    } else {
        prop_oneof![text(), Just("$type".to_string()), Just("$link".to_string())].boxed()
    }
}

fn link() -> impl Strategy<Value = CidBuf> {
    (
        prop_oneof![Just(DAG_CBOR), Just(RAW)],
        proptest::collection::vec(any::<u8>(), 0..16),
    )
        .prop_map(|(codec, data)| CidBuf::sha256(codec, &data))
}

fn value(json_safe: bool) -> impl Strategy<Value = OwnedValue> {
    let leaf = prop_oneof![
        Just(OwnedValue::Null),
        any::<bool>().prop_map(OwnedValue::Bool),
        int().prop_map(OwnedValue::Int),
        proptest::collection::vec(any::<u8>(), 0..40).prop_map(OwnedValue::Bytes),
        text().prop_map(OwnedValue::Text),
        link().prop_map(OwnedValue::Link),
    ];
    leaf.prop_recursive(5, 64, 6, move |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(OwnedValue::Array),
            proptest::collection::btree_map(key(json_safe), inner, 0..6).prop_map(OwnedValue::Map),
        ]
    })
}

fn json_document() -> impl Strategy<Value = OwnedValue> {
    proptest::collection::btree_map(key(true), value(true), 0..8).prop_map(OwnedValue::Map)
}

/// Strict and lenient decoding of arbitrary bytes: no panic; strict acceptance means canonical.
fn decode_anything(bytes: &[u8]) -> Result<(), TestCaseError> {
    let mut arena = Arena::new();
    let mut tape = arena.tape(bytes);
    if let Ok(item) = tape.decode(0..bytes.len(), &Options::strict()) {
        let v = tape.value(item);
        let mut again = Vec::new();
        encode_value(v, &mut again).unwrap();
        prop_assert_eq!(
            &again,
            &bytes,
            "strict decoding accepted a non-canonical encoding"
        );
        prop_assert!(to_json_string(v).is_ok());
    }
    let mut tape = arena.tape(bytes);
    if let Ok(item) = tape.decode(0..bytes.len(), &Options::lenient()) {
        let v = tape.value(item);
        let _ = to_json_string(v);
        let _ = encode_value(v, &mut Vec::new());
        let _ = OwnedValue::from_value(v);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    #[test]
    fn cbor_round_trip(original in value(false)) {
        let bytes = original.to_cbor();
        let mut arena = Arena::new();
        let mut tape = arena.tape(&bytes);
        let item = tape.decode(0..bytes.len(), &Options::strict())
            .map_err(|e| TestCaseError::fail(format!("strict decode of our own encoding: {e}")))?;
        let v = tape.value(item);
        prop_assert_eq!(&OwnedValue::from_value(v).unwrap(), &original);
        let mut again = Vec::new();
        encode_value(v, &mut again).unwrap();
        prop_assert_eq!(&again, &bytes);
        // The CID is over exactly these bytes.
        prop_assert_eq!(original.cid(), CidBuf::sha256(DAG_CBOR, &bytes));
    }

    #[test]
    fn json_round_trip(original in json_document()) {
        let bytes = original.to_cbor();
        let mut arena = Arena::new();
        let mut tape = arena.tape(&bytes);
        let item = tape.decode(0..bytes.len(), &Options::strict()).unwrap();
        let mut out = Vec::new();
        write_json(tape.value(item), &mut out).unwrap();
        let text = std::str::from_utf8(&out).unwrap();
        let parsed: serde_json::Value = serde_json::from_str(text)
            .map_err(|e| TestCaseError::fail(format!("our JSON does not parse: {e}\n{text}")))?;
        let back = json_to_value(&parsed)
            .map_err(|e| TestCaseError::fail(format!("{e}\n{text}")))?;
        prop_assert_eq!(&back, &original, "{}", text);
        prop_assert_eq!(back.to_cbor(), bytes);
        // Keys come out sorted bytewise at the top level, as Go writes them.
        let keys: Vec<&String> = parsed.as_object().unwrap().keys().collect();
        prop_assert!(keys.windows(2).all(|w| w[0].as_bytes() < w[1].as_bytes()));
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        decode_anything(&bytes)?;
    }

    #[test]
    fn arbitrary_bytes_after_a_valid_head_never_panic(
        head in proptest::sample::select(vec![0x81u8, 0x82, 0xa1, 0xa2, 0xd8, 0x58, 0x78, 0x9a, 0xbb]),
        tail in proptest::collection::vec(any::<u8>(), 0..64),
    ) {
        let mut bytes = vec![head];
        if head == 0xd8 {
            bytes.push(0x2a);
        }
        bytes.extend_from_slice(&tail);
        decode_anything(&bytes)?;
    }

    #[test]
    fn mutated_encodings_never_panic(
        original in value(false),
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
    ) {
        let mut bytes = original.to_cbor();
        for (at, b) in edits {
            let i = at.index(bytes.len());
            bytes[i] = b;
        }
        decode_anything(&bytes)?;
        // Every prefix too.
        for cut in 0..bytes.len() {
            decode_anything(&bytes[..cut])?;
        }
    }
}

#[test]
fn generated_values_are_not_trivial() {
    // Guard against a generator that silently degenerates (e.g. only empty maps): over 200
    // generated trees, every kind of value appears, and integers reach beyond 32 bits.
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    fn walk(v: &OwnedValue, kinds: &mut BTreeMap<&'static str, usize>) {
        let k = match v {
            OwnedValue::Null => "null",
            OwnedValue::Bool(_) => "bool",
            OwnedValue::Int(i) if i.unsigned_abs() > u64::from(u32::MAX) => "int64",
            OwnedValue::Int(_) => "int",
            OwnedValue::Bytes(_) => "bytes",
            OwnedValue::Text(_) => "text",
            OwnedValue::Link(_) => "link",
            OwnedValue::Array(items) => {
                items.iter().for_each(|i| walk(i, kinds));
                "array"
            }
            OwnedValue::Map(m) => {
                m.values().for_each(|i| walk(i, kinds));
                "map"
            }
        };
        *kinds.entry(k).or_insert(0) += 1;
    }
    let mut runner = TestRunner::deterministic();
    let mut kinds = BTreeMap::new();
    for _ in 0..200 {
        walk(
            &value(false).new_tree(&mut runner).unwrap().current(),
            &mut kinds,
        );
    }
    assert_eq!(kinds.len(), 9, "{kinds:?}");
    assert!(kinds.values().all(|&n| n >= 10), "{kinds:?}");
}
