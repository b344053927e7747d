//! Hostile DAG-CBOR: every input a relay, a PDS or a man in the middle could send gets a typed
//! [`Error`] with the right [`ErrorKind`] and byte offset — never a panic, never memory out of
//! proportion to the input.
//!
//! Covered: huge declared lengths (strings, byte strings, arrays, maps up to 2^64-1, under default
//! and raised limits), deep nesting (10,000 levels of arrays, maps and tags), truncation of
//! realistic records at every offset, every single-byte mutation of realistic records, and each
//! non-canonical encoding DAG-CBOR forbids (unsorted and duplicate keys, non-minimal integers and
//! lengths, indefinite lengths, floats, undefined and other simple values, tags other than 42,
//! malformed tag 42 contents, CIDv0 links, invalid UTF-8, integers beyond i64).
//!
//! Why: the decoder is the first code that touches bytes from the network. Its oracle here is the
//! DAG-CBOR definition itself: strict decoding must accept exactly the canonical encodings, so any
//! mutated input it accepts must re-encode to the very same bytes.
#![allow(clippy::unwrap_used)]

use riptide_testdata as common;

use riptide_cbor::{
    encode_value, json_to_value, to_json_string, Arena, Cid, CidBuf, EncodeError, Error, ErrorKind,
    Kind, Limits, Mode, Options, OwnedValue, DAG_CBOR, RAW,
};

// ---------------------------------------------------------------------------------------------
// Helpers

/// Decodes `bytes` as one item, checking that the arena never holds more nodes than the input
/// could justify (every node consumes at least one input byte; a `Vec` at most doubles).
fn decode_with(bytes: &[u8], opts: &Options) -> Result<(), Error> {
    let mut arena = Arena::new();
    let r = {
        let mut tape = arena.tape(bytes);
        tape.decode(0..bytes.len(), opts).map(|_| ())
    };
    assert!(
        arena.capacity() <= 2 * bytes.len() + 4,
        "arena grew to {} nodes for {} input bytes",
        arena.capacity(),
        bytes.len()
    );
    r
}

fn strict(bytes: &[u8]) -> Result<(), Error> {
    decode_with(bytes, &Options::strict())
}

fn lenient(bytes: &[u8]) -> Result<(), Error> {
    decode_with(bytes, &Options::lenient())
}

#[track_caller]
fn rejects(bytes: &[u8], kind: ErrorKind, offset: usize) {
    let e = strict(bytes).expect_err("strict decoding accepted hostile input");
    assert_eq!(
        (e.kind(), e.offset()),
        (kind, offset),
        "input {bytes:02x?}: {e}"
    );
}

fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

/// `head` for major type `major` with an explicit additional-information byte and argument width.
fn head(major: u8, info: u8, arg: u64) -> Vec<u8> {
    let mut v = vec![(major << 5) | info];
    let n = match info {
        24 => 1,
        25 => 2,
        26 => 4,
        27 => 8,
        _ => 0,
    };
    v.extend_from_slice(&arg.to_be_bytes()[8 - n..]);
    v
}

/// A post record with a reply, facets, an image embed with a blob, text with characters JSON
/// escapes, and an emoji: the shape of most firehose bytes.
fn post_record() -> Vec<u8> {
    let json = serde_json::json!({
        "$type": "app.bsky.feed.post",
        "text": "café <b>&</b> \u{2028} 😀 @alice.test https://example.com",
        "createdAt": "2026-07-04T12:00:00.000Z",
        "langs": ["en", "fr"],
        "facets": [{
            "$type": "app.bsky.richtext.facet",
            "index": {"byteStart": 25, "byteEnd": 37},
            "features": [{"$type": "app.bsky.richtext.facet#mention", "did": "did:plc:abcdefghijklmnopqrstuvwx"}]
        }],
        "reply": {
            "root": {"cid": "bafyreidfayvfuwqa7qlnopdjiqrxzs6blmoeu4rujcjtnci5beludirz2a", "uri": "at://did:plc:abc/app.bsky.feed.post/3l3qo2vutsw2b"},
            "parent": {"cid": "bafyreidfayvfuwqa7qlnopdjiqrxzs6blmoeu4rujcjtnci5beludirz2a", "uri": "at://did:plc:abc/app.bsky.feed.post/3l3qo2vutsw2b"}
        },
        "embed": {
            "$type": "app.bsky.embed.images",
            "images": [{
                "alt": "",
                "aspectRatio": {"width": 2000, "height": 1500},
                "image": {
                    "$type": "blob",
                    "ref": {"$link": "bafkreiccldh766hwcnuxnf2wh6jgzepf2nlu2lvcllt63eww5p6chi4ity"},
                    "mimeType": "image/jpeg",
                    "size": 732_112
                }
            }]
        }
    });
    json_to_value(&json).unwrap().to_cbor()
}

/// A signed repository commit: links, null, negative and large integers, a byte string.
fn commit_record() -> Vec<u8> {
    let json = serde_json::json!({
        "did": "did:plc:53iucmf5ldftgqyf2ac7hmhd",
        "version": 3,
        "data": {"$link": "bafyreidigqr65jj2zsmitco3fcuag6pi7std6quxa2bcp2xrpin44ikzsy"},
        "rev": "3migo7fijwi2k",
        "prev": null,
        "ok": true,
        "n": [-1, -24, -25, -256, -257, -65_537, i64::MIN, i64::MAX, 4_294_967_296u64, 0],
        "sig": {"$bytes": "nFERjvLLiw9qm45JrqH9QTzyC2Lu1Xb4ne6+sBrCzI2cURGO8suLD2qbjkmuof1BPPILYu7VdvidSnP7Gis2Yw"}
    });
    json_to_value(&json).unwrap().to_cbor()
}

/// The realistic records: two built here, plus a real post from the corpus when present.
fn records() -> Vec<(&'static str, Vec<u8>)> {
    let mut r = vec![("post", post_record()), ("commit", commit_record())];
    if let Some(real) = common::read("indigo-sync/feedpost_record.cbor") {
        r.push(("corpus feedpost_record.cbor", real));
    }
    for (name, bytes) in &r {
        strict(bytes).unwrap_or_else(|e| panic!("{name} must be valid strict DAG-CBOR: {e}"));
    }
    r
}

// ---------------------------------------------------------------------------------------------
// Huge declared lengths

#[test]
fn huge_string_lengths_are_truncated_not_allocated() {
    for major in [2u8, 3] {
        for (info, arg) in [
            (26, u64::from(u32::MAX)),
            (27, 1 << 32),
            (27, 1 << 60),
            (27, u64::MAX),
        ] {
            let bytes = cat(&[&head(major, info, arg), b"abc"]);
            rejects(&bytes, ErrorKind::Truncated, 0);
            assert_eq!(lenient(&bytes).unwrap_err().kind(), ErrorKind::Truncated);
        }
    }
    // Nested: ["a", <text of 2^32-1 bytes>] points at the string, not the array.
    rejects(
        &cat(&[&[0x82, 0x61, b'a'], &head(3, 26, u64::from(u32::MAX))]),
        ErrorKind::Truncated,
        3,
    );
    // Inside a link: tag 42 over a byte string claiming 2^64-1 bytes.
    rejects(
        &cat(&[&[0xd8, 0x2a], &head(2, 27, u64::MAX)]),
        ErrorKind::Truncated,
        0,
    );
}

#[test]
fn huge_container_lengths_hit_the_limit_before_any_work() {
    for major in [4u8, 5] {
        for (info, arg) in [
            (26, u64::from(u32::MAX)),
            (27, 1 << 32),
            (27, 1 << 62),
            (27, u64::MAX),
        ] {
            let bytes = head(major, info, arg);
            rejects(&bytes, ErrorKind::LengthLimit, 0);
            assert_eq!(lenient(&bytes).unwrap_err().kind(), ErrorKind::LengthLimit);
        }
        // Within the limit but longer than the input: truncated.
        rejects(&head(major, 26, 1 << 20), ErrorKind::Truncated, 0);
        // One past the limit.
        rejects(&head(major, 26, (1 << 20) + 1), ErrorKind::LengthLimit, 0);
    }
}

#[test]
fn huge_container_lengths_with_the_limit_lifted_are_still_typed_errors() {
    // A caller that lifts the container limit must still get an error, not an overflow: a map
    // of 2^63 pairs declares 2^64 items, which does not fit in a u64.
    let opts = Options {
        mode: Mode::Strict,
        limits: Limits {
            max_container_len: u64::MAX,
            ..Limits::default()
        },
    };
    let lenient_opts = Options {
        mode: Mode::Lenient,
        ..opts
    };
    for major in [4u8, 5] {
        for arg in [
            u64::from(u32::MAX),
            1 << 32,
            (1 << 63) - 1,
            1 << 63,
            (1 << 63) + 1,
            u64::MAX,
        ] {
            let mut bytes = Vec::new();
            riptide_cbor::write_head(&mut bytes, major, arg); // minimal form
            bytes.extend_from_slice(&[0x00; 16]);
            for o in [&opts, &lenient_opts] {
                let e = decode_with(&bytes, o).expect_err("a container longer than its input");
                assert_eq!(
                    (e.kind(), e.offset()),
                    (ErrorKind::Truncated, 0),
                    "{bytes:02x?}"
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Deep nesting

#[test]
fn ten_thousand_nested_arrays_hit_the_depth_limit() {
    let mut bytes = vec![0x81u8; 10_000];
    bytes.push(0x00);
    // The 65th array (offset 64) is one level too deep for the default limit of 64.
    rejects(&bytes, ErrorKind::DepthLimit, 64);
    assert_eq!(lenient(&bytes).unwrap_err().kind(), ErrorKind::DepthLimit);

    // Exactly at the limit is fine; one more is not.
    let mut ok = vec![0x81u8; 64];
    ok.push(0x00);
    strict(&ok).unwrap();
    let mut over = vec![0x81u8; 65];
    over.push(0x00);
    rejects(&over, ErrorKind::DepthLimit, 64);

    // The decoder is iterative: with the limit raised, 10,000 levels decode without recursion.
    let deep = Options {
        limits: Limits {
            max_depth: 20_000,
            ..Limits::default()
        },
        ..Options::strict()
    };
    let mut arena = Arena::new();
    let mut tape = arena.tape(&bytes);
    let item = tape.decode(0..bytes.len(), &deep).unwrap();
    assert_eq!(tape.value(item).node_count(), 10_001);
}

#[test]
fn ten_thousand_nested_maps_hit_the_depth_limit() {
    // {"a": {"a": … 0 …}}: each level is a1 61 61.
    let mut bytes = [0xa1u8, 0x61, b'a'].repeat(10_000);
    bytes.push(0x00);
    rejects(&bytes, ErrorKind::DepthLimit, 64 * 3);
}

#[test]
fn ten_thousand_nested_tags_hit_the_depth_limit_in_lenient_mode() {
    let mut bytes = vec![0xc1u8; 10_000]; // tag 1 (epoch time), nested
    bytes.push(0x00);
    rejects(&bytes, ErrorKind::UnsupportedTag, 0);
    let e = lenient(&bytes).unwrap_err();
    assert_eq!((e.kind(), e.offset()), (ErrorKind::DepthLimit, 64));
}

#[test]
fn ten_thousand_indefinite_arrays_are_refused_at_the_first() {
    let bytes = vec![0x9fu8; 10_000];
    rejects(&bytes, ErrorKind::Indefinite, 0);
    assert_eq!(lenient(&bytes).unwrap_err().kind(), ErrorKind::Indefinite);
}

#[test]
fn deeply_nested_json_is_refused() {
    let mut v = serde_json::json!(0);
    for _ in 0..100 {
        v = serde_json::json!({ "a": v });
    }
    assert!(json_to_value(&v).is_err());
}

// ---------------------------------------------------------------------------------------------
// Truncation and mutation of realistic records

#[test]
fn every_truncation_of_a_realistic_record_is_truncated() {
    let mut checked = 0;
    let records = records();
    for (name, bytes) in &records {
        for cut in 0..bytes.len() {
            let prefix = &bytes[..cut];
            let e = strict(prefix).expect_err("a strict prefix of a map cannot be complete");
            assert_eq!(e.kind(), ErrorKind::Truncated, "{name} cut at {cut}: {e}");
            assert!(
                e.offset() <= cut,
                "{name} cut at {cut}: offset {} past the end",
                e.offset()
            );
            assert_eq!(lenient(prefix).unwrap_err().kind(), ErrorKind::Truncated);
            // The same through a range of the full buffer: the decoder must not read past it.
            let mut arena = Arena::new();
            let mut tape = arena.tape(bytes);
            let e = tape.decode(0..cut, &Options::strict()).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Truncated, "{name} range 0..{cut}");
            checked += 1;
        }
    }
    assert_eq!(checked, records.iter().map(|(_, b)| b.len()).sum::<usize>());
    assert!(checked > 500, "only {checked} truncations checked");
}

/// What the decoders must do with any input: strict acceptance implies the bytes are the one
/// canonical encoding of their value (re-encoding reproduces them), that the value has an atproto
/// JSON form, and that lenient decoding accepts it too; a strict error of a kind that is not a
/// strictness rule is the same error in lenient mode.
fn check_any_input(bytes: &[u8]) -> bool {
    let mut arena = Arena::new();
    let mut tape = arena.tape(bytes);
    let strict_result = tape.decode(0..bytes.len(), &Options::strict());
    let mut arena2 = Arena::new();
    let mut tape2 = arena2.tape(bytes);
    let lenient_result = tape2.decode(0..bytes.len(), &Options::lenient());
    if let (Err(_), Ok(item)) = (strict_result, lenient_result) {
        // Rendering and re-encoding what only lenient mode reads may fail, but must not panic.
        let v = tape2.value(item);
        let _ = to_json_string(v);
        let _ = encode_value(v, &mut Vec::new());
        let _ = OwnedValue::from_value(v);
        let _ = format!("{v:?}");
    }
    match strict_result {
        Ok(item) => {
            let v = tape.value(item);
            let mut again = Vec::new();
            encode_value(v, &mut again).unwrap();
            assert_eq!(
                again, bytes,
                "strict decoding accepted a non-canonical encoding"
            );
            assert_eq!(OwnedValue::from_value(v).unwrap().to_cbor(), bytes);
            to_json_string(v).unwrap();
            assert!(
                lenient_result.is_ok(),
                "lenient refused what strict accepted: {bytes:02x?}"
            );
            true
        }
        Err(e) => {
            let universal = matches!(
                e.kind(),
                ErrorKind::Truncated
                    | ErrorKind::TrailingBytes
                    | ErrorKind::Indefinite
                    | ErrorKind::InvalidUtf8
                    | ErrorKind::InvalidLink
                    | ErrorKind::InvalidHeader
                    | ErrorKind::DepthLimit
                    | ErrorKind::LengthLimit
                    | ErrorKind::InputLimit
            );
            if universal {
                assert_eq!(
                    lenient_result,
                    Err(e),
                    "strict and lenient disagree on {bytes:02x?}"
                );
            }
            false
        }
    }
}

#[test]
fn every_single_byte_mutation_of_a_realistic_record_is_handled() {
    let mut mutants = 0;
    let mut accepted = 0;
    for (_name, original) in records() {
        let mut bytes = original.clone();
        for i in 0..bytes.len() {
            for v in 0..=255u8 {
                if v == original[i] {
                    continue;
                }
                bytes[i] = v;
                if check_any_input(&bytes) {
                    accepted += 1;
                }
                mutants += 1;
            }
            bytes[i] = original[i];
        }
    }
    eprintln!("{accepted} of {mutants} single-byte mutants accepted (and re-encoded identically)");
    assert!(mutants > 100_000, "only {mutants} mutants");
    // Many mutations only change text or digest bytes and stay canonical; the oracle above must
    // have had real work on both sides.
    assert!(
        accepted > 1000 && accepted < mutants,
        "{accepted} of {mutants} mutants accepted"
    );
}

#[test]
fn deleting_or_inserting_a_byte_is_handled() {
    let mut n = 0;
    for (_name, original) in records() {
        for i in 0..original.len() {
            let mut del = original.clone();
            del.remove(i);
            check_any_input(&del);
            for v in [0x00, 0x17, 0x18, 0x5f, 0x80, 0xa0, 0xd8, 0xf6, 0xff] {
                let mut ins = original.clone();
                ins.insert(i, v);
                check_any_input(&ins);
                n += 1;
            }
        }
    }
    assert!(n > 5000);
}

// ---------------------------------------------------------------------------------------------
// Non-canonical encodings, each with its kind and offset

#[test]
fn unsorted_and_duplicate_keys() {
    // {"b":1,"a":2}: same length, wrong bytewise order; the error is at the second key.
    rejects(
        &[0xa2, 0x61, b'b', 0x01, 0x61, b'a', 0x02],
        ErrorKind::KeyOrder,
        4,
    );
    // {"aa":1,"b":2}: the longer key first.
    rejects(
        &[0xa2, 0x62, b'a', b'a', 0x01, 0x61, b'b', 0x02],
        ErrorKind::KeyOrder,
        5,
    );
    // {"a":1,"":2}: the empty key sorts first.
    rejects(
        &[0xa2, 0x61, b'a', 0x01, 0x60, 0x02],
        ErrorKind::KeyOrder,
        4,
    );
    // {"é":1,"z":2}: length first — "z" (1 byte) precedes "é" (2 bytes).
    rejects(
        &[0xa2, 0x62, 0xc3, 0xa9, 0x01, 0x61, b'z', 0x02],
        ErrorKind::KeyOrder,
        5,
    );
    // {"a":1,"a":2}.
    rejects(
        &[0xa2, 0x61, b'a', 0x01, 0x61, b'a', 0x02],
        ErrorKind::DuplicateKey,
        4,
    );
    // A nested map's order is checked independently of its parent's keys.
    strict(&[0xa2, 0x61, b'a', 0xa1, 0x61, b'b', 0x01, 0x61, b'b', 0x02]).unwrap();
    rejects(
        &[0xa1, 0x61, b'x', 0xa2, 0x61, b'b', 0x01, 0x61, b'a', 0x02],
        ErrorKind::KeyOrder,
        7,
    );

    // Lenient mode reads them; re-encoding sorts, or refuses the duplicate.
    let unsorted = [0xa2, 0x61, b'b', 0x01, 0x61, b'a', 0x02];
    let mut arena = Arena::new();
    let mut tape = arena.tape(&unsorted);
    let item = tape.decode(0..unsorted.len(), &Options::lenient()).unwrap();
    let mut sorted = Vec::new();
    encode_value(tape.value(item), &mut sorted).unwrap();
    assert_eq!(sorted, [0xa2, 0x61, b'a', 0x02, 0x61, b'b', 0x01]);
    strict(&sorted).unwrap();

    let dup = [0xa2, 0x61, b'a', 0x01, 0x61, b'a', 0x02];
    let mut tape = arena.tape(&dup);
    let item = tape.decode(0..dup.len(), &Options::lenient()).unwrap();
    assert_eq!(
        encode_value(tape.value(item), &mut Vec::new()),
        Err(EncodeError::DuplicateKey)
    );
    assert_eq!(
        OwnedValue::from_value(tape.value(item)),
        Err(EncodeError::DuplicateKey)
    );
}

#[test]
fn non_text_keys() {
    rejects(&[0xa1, 0x01, 0x02], ErrorKind::NonTextKey, 1);
    rejects(&[0xa1, 0x41, b'a', 0x02], ErrorKind::NonTextKey, 1);
    rejects(&[0xa1, 0x80, 0x02], ErrorKind::NonTextKey, 1);
    rejects(&[0xa1, 0xf6, 0x02], ErrorKind::NonTextKey, 1);
    // A value position may hold anything; only keys are checked.
    strict(&[0xa1, 0x61, b'a', 0x41, 0x00]).unwrap();
    // Lenient reads them; JSON has no form for them.
    let b = [0xa1, 0x01, 0x02];
    let mut arena = Arena::new();
    let mut tape = arena.tape(&b);
    let item = tape.decode(0..b.len(), &Options::lenient()).unwrap();
    assert!(to_json_string(tape.value(item)).is_err());
}

#[test]
fn non_minimal_integers_and_lengths() {
    for (bytes, offset) in [
        (&[0x18, 0x05][..], 0),
        (&[0x18, 0x17], 0),
        (&[0x19, 0x00, 0xff], 0),
        (&[0x1a, 0x00, 0x00, 0xff, 0xff], 0),
        (&[0x1b, 0x00, 0x00, 0x00, 0x00, 0xff, 0xff, 0xff, 0xff], 0),
        (&[0x38, 0x00], 0),                   // -1 in two bytes
        (&[0x3b, 0, 0, 0, 0, 0, 0, 0, 0], 0), // -1 in nine bytes
        (&[0x58, 0x00], 0),                   // empty bytes, 1-byte length
        (&[0x78, 0x01, b'a'], 0),             // "a", 1-byte length
        (&[0x98, 0x01, 0x00], 0),             // [0], 1-byte length
        (&[0xb8, 0x01, 0x61, b'a', 0x00], 0), // {"a":0}, 1-byte length
        (&[0xa1, 0x61, b'a', 0x18, 0x05], 3), // {"a": 5 in two bytes}
        (&[0x83, 0x01, 0x02, 0x19, 0x00, 0x03], 3),
        (&[0xa1, 0x78, 0x01, b'a', 0x00], 1), // a key with a non-minimal length
    ] {
        rejects(bytes, ErrorKind::NonMinimal, offset);
        lenient(bytes).unwrap();
    }
    // The boundaries themselves are minimal.
    for bytes in [
        &[0x17][..],
        &[0x18, 0x18],
        &[0x18, 0xff],
        &[0x19, 0x01, 0x00],
        &[0x19, 0xff, 0xff],
        &[0x1a, 0x00, 0x01, 0x00, 0x00],
        &[0x1a, 0xff, 0xff, 0xff, 0xff],
        &[0x1b, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00],
        &[0x37],
        &[0x38, 0x18],
    ] {
        strict(bytes).unwrap_or_else(|e| panic!("{bytes:02x?}: {e}"));
    }
}

#[test]
fn integers_beyond_i64() {
    // 2^63 and -2^63-1.
    rejects(
        &[0x1b, 0x80, 0, 0, 0, 0, 0, 0, 0],
        ErrorKind::IntegerOverflow,
        0,
    );
    rejects(
        &[0x3b, 0x80, 0, 0, 0, 0, 0, 0, 0],
        ErrorKind::IntegerOverflow,
        0,
    );
    rejects(
        &[0x81, 0x1b, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
        ErrorKind::IntegerOverflow,
        1,
    );
    // i64::MAX and i64::MIN are in range and exact.
    for (bytes, want) in [
        (
            &[0x1b, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff][..],
            i64::MAX,
        ),
        (
            &[0x3b, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
            i64::MIN,
        ),
    ] {
        let mut arena = Arena::new();
        let mut tape = arena.tape(bytes);
        let item = tape.decode(0..bytes.len(), &Options::strict()).unwrap();
        assert_eq!(tape.value(item).as_i64(), Some(want));
        assert_eq!(to_json_string(tape.value(item)).unwrap(), want.to_string());
    }
    // Lenient mode reads 2^64-1 but it has neither an i64 nor a JSON form.
    let big = [0x1b, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff];
    let mut arena = Arena::new();
    let mut tape = arena.tape(&big);
    let item = tape.decode(0..big.len(), &Options::lenient()).unwrap();
    assert_eq!(tape.value(item).as_i64(), None);
    assert!(to_json_string(tape.value(item)).is_err());
    assert_eq!(
        encode_value(tape.value(item), &mut Vec::new()),
        Err(EncodeError::NotInDataModel)
    );
}

#[test]
fn indefinite_lengths() {
    for b in [0x5f, 0x7f, 0x9f, 0xbf] {
        rejects(&[b, 0xff], ErrorKind::Indefinite, 0);
        assert_eq!(
            lenient(&[b, 0xff]).unwrap_err().kind(),
            ErrorKind::Indefinite
        );
    }
    // Inside a structure, at the offending item.
    rejects(
        &[0xa1, 0x61, b'a', 0x9f, 0x01, 0xff],
        ErrorKind::Indefinite,
        3,
    );
    rejects(
        &[0x82, 0x01, 0x7f, 0x61, b'a', 0xff],
        ErrorKind::Indefinite,
        2,
    );
    // Additional information 31 on integers and tags is malformed CBOR: refused either way.
    for b in [0x1f, 0x3f, 0xdf] {
        let e = strict(&[b, 0x00]).unwrap_err();
        assert!(
            matches!(e.kind(), ErrorKind::Indefinite | ErrorKind::InvalidHeader),
            "{b:02x}: {e}"
        );
        assert!(lenient(&[b, 0x00]).is_err());
    }
}

#[test]
fn floats_undefined_and_simple_values() {
    for bytes in [
        &[0xf9, 0x3c, 0x00][..],               // 1.0 half
        &[0xf9, 0x7e, 0x00],                   // NaN half
        &[0xfa, 0x3f, 0x80, 0x00, 0x00],       // 1.0 single
        &[0xfb, 0x3f, 0xf0, 0, 0, 0, 0, 0, 0], // 1.0 double
        &[0xfb, 0x7f, 0xf0, 0, 0, 0, 0, 0, 0], // +Inf double
    ] {
        rejects(bytes, ErrorKind::Float, 0);
        // Lenient reads the float; it has no JSON or DAG-CBOR form in the data model.
        let mut arena = Arena::new();
        let mut tape = arena.tape(bytes);
        let item = tape.decode(0..bytes.len(), &Options::lenient()).unwrap();
        assert_eq!(tape.value(item).kind(), Kind::Float);
        assert!(to_json_string(tape.value(item)).is_err());
        assert_eq!(
            encode_value(tape.value(item), &mut Vec::new()),
            Err(EncodeError::NotInDataModel)
        );
    }
    rejects(&[0x82, 0x01, 0xf9, 0x3e, 0x00], ErrorKind::Float, 2);
    // Truncated floats in lenient mode are truncated, not misread.
    assert_eq!(
        lenient(&[0xfb, 0x3f, 0xf0]).unwrap_err().kind(),
        ErrorKind::Truncated
    );

    // undefined, simple(0), simple(16), simple(19), simple(32), simple(255).
    for bytes in [
        &[0xf7][..],
        &[0xe0],
        &[0xf0],
        &[0xf3],
        &[0xf8, 0x20],
        &[0xf8, 0xff],
    ] {
        rejects(bytes, ErrorKind::UnsupportedSimple, 0);
        lenient(bytes).unwrap();
    }
    rejects(&[0xa1, 0x61, b'u', 0xf7], ErrorKind::UnsupportedSimple, 3);
    // false, true, null are the data model's.
    for b in [0xf4, 0xf5, 0xf6] {
        strict(&[b]).unwrap();
    }
}

#[test]
fn reserved_and_break_bytes() {
    for b in [
        0x1c, 0x1d, 0x1e, 0x3c, 0x5c, 0x7d, 0x9e, 0xbc, 0xdc, 0xfc, 0xfd, 0xfe,
    ] {
        rejects(&[b, 0, 0, 0, 0, 0, 0, 0, 0], ErrorKind::InvalidHeader, 0);
        assert_eq!(
            lenient(&[b, 0, 0, 0, 0, 0, 0, 0, 0]).unwrap_err().kind(),
            ErrorKind::InvalidHeader
        );
    }
    // A break byte outside an indefinite item.
    rejects(&[0xff], ErrorKind::InvalidHeader, 0);
    rejects(&[0x82, 0x01, 0xff], ErrorKind::InvalidHeader, 2);
    rejects(&[0xa1, 0x61, b'a', 0xff], ErrorKind::InvalidHeader, 3);
}

#[test]
fn tags_other_than_42() {
    for (bytes, offset) in [
        (&[0xc0, 0x60][..], 0),         // tag 0 (date/time string)
        (&[0xc1, 0x00], 0),             // tag 1 (epoch)
        (&[0xc2, 0x41, 0x01], 0),       // tag 2 (bignum)
        (&[0xd8, 0x29, 0x40], 0),       // tag 41
        (&[0xd8, 0x2b, 0x40], 0),       // tag 43
        (&[0xd9, 0xd9, 0xf7, 0x00], 0), // tag 55799 (self-described CBOR)
        (
            &[0xdb, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x00],
            0,
        ),
        (&[0xa1, 0x61, b't', 0xc1, 0x00], 3),
    ] {
        rejects(bytes, ErrorKind::UnsupportedTag, offset);
        // Lenient reads the tag; JSON and DAG-CBOR have no form for it.
        let mut arena = Arena::new();
        let mut tape = arena.tape(bytes);
        let item = tape.decode(0..bytes.len(), &Options::lenient()).unwrap();
        assert!(to_json_string(tape.value(item)).is_err());
    }
    // Tag 42 written non-minimally is a non-minimal head, not another tag.
    let cid = CidBuf::sha256(DAG_CBOR, b"x");
    let content = cat(&[&[0x58, 0x25, 0x00], cid.as_bytes()]);
    rejects(
        &cat(&[&[0xd9, 0x00, 0x2a], &content]),
        ErrorKind::NonMinimal,
        0,
    );
    rejects(
        &cat(&[&[0xda, 0x00, 0x00, 0x00, 0x2a], &content]),
        ErrorKind::NonMinimal,
        0,
    );
}

fn link_bytes(content: &[u8]) -> Vec<u8> {
    let mut v = vec![0xd8, 0x2a];
    let mut h = Vec::new();
    riptide_cbor::write_bytes(&mut h, content);
    v.extend_from_slice(&h);
    v
}

#[test]
fn tag_42_contents() {
    let v1 = CidBuf::sha256(DAG_CBOR, b"block");
    let raw = CidBuf::sha256(RAW, b"blob");

    // The valid forms: 0x00 then a binary CIDv1.
    for cid in [v1, raw] {
        let bytes = link_bytes(&cat(&[&[0x00], cid.as_bytes()]));
        let mut arena = Arena::new();
        let mut tape = arena.tape(&bytes);
        let item = tape.decode(0..bytes.len(), &Options::strict()).unwrap();
        assert_eq!(tape.value(item).as_link().map(|c| c.to_buf()), Some(cid));
        assert_eq!(
            to_json_string(tape.value(item)).unwrap(),
            format!(r#"{{"$link":"{cid}"}}"#)
        );
    }

    // Without the 0x00 multibase-identity prefix: invalid, at the tag.
    rejects(&link_bytes(v1.as_bytes()), ErrorKind::InvalidLink, 0);
    // A wrong prefix byte.
    rejects(
        &link_bytes(&cat(&[&[0x01], v1.as_bytes()])),
        ErrorKind::InvalidLink,
        0,
    );
    // Empty; just the prefix; a truncated CID; a byte after the CID; a CID version 2.
    rejects(&link_bytes(&[]), ErrorKind::InvalidLink, 0);
    rejects(&link_bytes(&[0x00]), ErrorKind::InvalidLink, 0);
    rejects(
        &link_bytes(&cat(&[&[0x00], &v1.as_bytes()[..20]])),
        ErrorKind::InvalidLink,
        0,
    );
    rejects(
        &link_bytes(&cat(&[&[0x00], v1.as_bytes(), &[0x00]])),
        ErrorKind::InvalidLink,
        0,
    );
    let mut v2 = v1.as_bytes().to_vec();
    v2[0] = 0x02;
    rejects(
        &link_bytes(&cat(&[&[0x00], &v2])),
        ErrorKind::InvalidLink,
        0,
    );
    // A CID whose varint is not minimal (codec 0x71 written as f1 00).
    let mut padded = vec![0x00, 0x01, 0xf1, 0x00];
    padded.extend_from_slice(&v1.as_bytes()[2..]);
    rejects(&link_bytes(&padded), ErrorKind::InvalidLink, 0);
    // Tag 42 over something that is not a byte string: text, an integer, another link.
    rejects(&[0xd8, 0x2a, 0x61, 0x00], ErrorKind::InvalidLink, 0);
    rejects(&[0xd8, 0x2a, 0x00], ErrorKind::InvalidLink, 0);
    rejects(
        &cat(&[&[0xd8, 0x2a], &link_bytes(&cat(&[&[0x00], v1.as_bytes()]))]),
        ErrorKind::InvalidLink,
        0,
    );
    // The content's length written non-minimally.
    let content = cat(&[&[0x00], v1.as_bytes()]);
    rejects(
        &cat(&[&[0xd8, 0x2a, 0x59, 0x00, 0x25], &content]),
        ErrorKind::NonMinimal,
        0,
    );
    // Cut after the tag, inside the length, inside the CID.
    rejects(&[0xd8, 0x2a], ErrorKind::Truncated, 2);
    rejects(&[0xd8, 0x2a, 0x58], ErrorKind::Truncated, 0);
    rejects(&link_bytes(&content)[..20], ErrorKind::Truncated, 0);
    // Inside a map, at the tag's offset.
    rejects(
        &cat(&[&[0xa1, 0x61, b'l'], &link_bytes(&[])]),
        ErrorKind::InvalidLink,
        3,
    );
    // Lenient mode enforces the same rules.
    assert_eq!(
        lenient(&link_bytes(v1.as_bytes())).unwrap_err().kind(),
        ErrorKind::InvalidLink
    );
}

#[test]
fn cid_v0_in_tag_42_is_read_as_old_data() {
    // The crate reads CIDv0 (a bare sha2-256 multihash) "for reading old data": in tag 42 it is
    // accepted, reported as version 0 / dag-pb, is not an atproto CID, and renders as `Qm…`.
    let v0 = CidBuf::parse("QmdfTbBqBPQ7VNxZEYEj14VmRuZBkqFbiwReogJgS1zR1n").unwrap();
    let bytes = link_bytes(&cat(&[&[0x00], v0.as_bytes()]));
    let mut arena = Arena::new();
    let mut tape = arena.tape(&bytes);
    let item = tape.decode(0..bytes.len(), &Options::strict()).unwrap();
    let link = tape.value(item).as_link().unwrap();
    assert_eq!(link.version(), 0);
    assert_eq!(link.codec(), riptide_cbor::DAG_PB);
    assert!(!link.is_atproto());
    assert_eq!(
        to_json_string(tape.value(item)).unwrap(),
        r#"{"$link":"QmdfTbBqBPQ7VNxZEYEj14VmRuZBkqFbiwReogJgS1zR1n"}"#
    );
    let mut again = Vec::new();
    encode_value(tape.value(item), &mut again).unwrap();
    assert_eq!(again, bytes);
    // A CIDv0 is exactly 34 bytes: one byte short is invalid.
    rejects(
        &link_bytes(&cat(&[&[0x00], &v0.as_bytes()[..33]])),
        ErrorKind::InvalidLink,
        0,
    );
    // A multihash that is not sha2-256/32 is not a CIDv0.
    let mut bad = v0.as_bytes().to_vec();
    bad[1] = 0x21;
    rejects(
        &link_bytes(&cat(&[&[0x00], &bad])),
        ErrorKind::InvalidLink,
        0,
    );
}

#[test]
fn cid_with_multibyte_codec_reports_its_own_digest() {
    // A 36-byte CIDv1 whose fourth byte happens to be 0x20 but whose codec takes two bytes:
    // version 01, codec 80 01 (0x80), hash 20, digest length 1f (31), then 31 digest bytes.
    let mut bytes = vec![0x01, 0x80, 0x01, 0x20, 0x1f];
    bytes.extend((0u8..31).map(|i| i.wrapping_mul(7)));
    assert_eq!(bytes.len(), 36);
    let cid = Cid::from_bytes(&bytes).unwrap();
    assert_eq!(cid.codec(), 0x80);
    assert_eq!(cid.hash_code(), 0x20);
    assert_eq!(
        cid.digest(),
        &bytes[5..],
        "digest must start after the length varint"
    );
    // Likewise a two-byte hash code: in 01 71 a0 20 1f …, the hash varint is a0 20 (0x1020) and
    // the digest length is byte 4.
    let mut bytes = vec![0x01, 0x71, 0xa0, 0x20, 0x1f];
    bytes.extend(0u8..31);
    let cid = Cid::from_bytes(&bytes).unwrap();
    assert_eq!(cid.hash_code(), 0x20 | (0x20 << 7));
    assert_eq!(cid.digest(), &bytes[5..]);
}

#[test]
fn invalid_utf8() {
    for (bytes, offset) in [
        (&[0x62, 0xc3, 0x28][..], 0),         // bad continuation
        (&[0x62, 0xc0, 0x80], 0),             // overlong NUL
        (&[0x63, 0xed, 0xa0, 0x80], 0),       // UTF-16 surrogate
        (&[0x64, 0xf4, 0x90, 0x80, 0x80], 0), // above U+10FFFF
        (&[0x61, 0xff], 0),
        (&[0x61, 0xc3], 0),                   // sequence cut by the string's end
        (&[0xa1, 0x61, 0xff, 0x00], 1),       // in a key
        (&[0xa1, 0x61, b'a', 0x61, 0x80], 3), // in a value
    ] {
        rejects(bytes, ErrorKind::InvalidUtf8, offset);
        assert_eq!(lenient(bytes).unwrap_err().kind(), ErrorKind::InvalidUtf8);
    }
    // Byte strings are not text: anything goes.
    strict(&[0x42, 0xff, 0xfe]).unwrap();
}

#[test]
fn trailing_bytes_empty_input_and_bad_ranges() {
    rejects(&[0x01, 0x01], ErrorKind::TrailingBytes, 1);
    rejects(&[0xa0, 0x00], ErrorKind::TrailingBytes, 1);
    rejects(
        &cat(&[&post_record(), &[0x00]]),
        ErrorKind::TrailingBytes,
        post_record().len(),
    );
    rejects(&[], ErrorKind::Truncated, 0);

    let bytes = [0x01u8, 0x02];
    let mut arena = Arena::new();
    let mut tape = arena.tape(&bytes);
    assert_eq!(
        tape.decode(0..3, &Options::strict()).unwrap_err().kind(),
        ErrorKind::Truncated
    );
    #[allow(clippy::reversed_empty_ranges)]
    let backwards = 2..1;
    assert_eq!(
        tape.decode(backwards, &Options::strict())
            .unwrap_err()
            .kind(),
        ErrorKind::Truncated
    );
    assert_eq!(
        tape.decode(usize::MAX - 1..usize::MAX, &Options::strict())
            .unwrap_err()
            .kind(),
        ErrorKind::Truncated
    );
    assert!(tape.is_empty());
}

#[test]
fn input_limit() {
    let record = post_record();
    let small = Options {
        limits: Limits {
            max_input: record.len() - 1,
            ..Limits::default()
        },
        ..Options::strict()
    };
    let e = decode_with(&record, &small).unwrap_err();
    assert_eq!((e.kind(), e.offset()), (ErrorKind::InputLimit, 0));
    let exact = Options {
        limits: Limits {
            max_input: record.len(),
            ..Limits::default()
        },
        ..Options::strict()
    };
    decode_with(&record, &exact).unwrap();
}

#[test]
fn hostile_link_strings_in_json_are_refused_not_panics() {
    // `$link` strings are untrusted input on the JSON side; a multi-byte first character or junk
    // after a multibase prefix must be an error.
    for s in [
        "é",
        "éa",
        "ébafyrei",
        "😀😀😀",
        "b",
        "bé",
        "z0OIl",
        "f0g",
        "Qm",
        "Qmé",
        "",
        "\u{0}a",
        "B!!",
    ] {
        let json = serde_json::json!({ "l": { "$link": s } });
        assert!(json_to_value(&json).is_err(), "{s:?} accepted as a link");
        assert!(CidBuf::parse(s).is_err(), "{s:?} parsed as a CID");
    }
    // Same for `$bytes`.
    for s in ["é", "!!!!", "A", "AAAAA"] {
        let json = serde_json::json!({ "b": { "$bytes": s } });
        assert!(json_to_value(&json).is_err(), "{s:?} accepted as bytes");
    }
}
