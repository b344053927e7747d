//! atproto JSON → DAG-CBOR of arbitrary text (the path a record given as JSON takes to its CID),
//! and CID string parsing.
//!
//! Invariants: whatever `json_to_value` accepts encodes to strict DAG-CBOR that decodes back to
//! the same value and renders to JSON that converts back to the same value; `CidBuf::parse` never
//! panics, and what it accepts prints back to a string that parses to the same CID.
#![no_main]

use libfuzzer_sys::fuzz_target;
use riptide_cbor::{json_to_value, to_json_string, Arena, CidBuf, Options, OwnedValue};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(cid) = CidBuf::parse(text.trim()) {
        assert_eq!(CidBuf::parse(&cid.to_string()), Ok(cid));
    }
    let Ok(json) = serde_json::from_str::<serde_json::Value>(text) else { return };
    let Ok(value) = json_to_value(&json) else { return };
    let bytes = value.to_cbor();
    let mut arena = Arena::new();
    let mut tape = arena.tape(&bytes);
    let item = tape.decode(0..bytes.len(), &Options::strict()).expect("our encoding is strict DAG-CBOR");
    let v = tape.value(item);
    assert_eq!(OwnedValue::from_value(v).as_ref(), Ok(&value));
    let rendered = to_json_string(v).expect("data-model values render");
    let again: serde_json::Value = serde_json::from_str(&rendered).expect("our JSON parses");
    assert_eq!(json_to_value(&again).as_ref(), Ok(&value), "{rendered}");
});
