//! DAG-CBOR decoding of arbitrary bytes, strict and lenient.
//!
//! Invariants checked beyond "no panic": anything strict mode accepts re-encodes to exactly the
//! input (DAG-CBOR has one encoding per value), has an atproto JSON rendering and an owned copy
//! that encodes identically, and is accepted by lenient mode too.
#![no_main]

use libfuzzer_sys::fuzz_target;
use riptide_cbor::{encode_value, to_json_string, Arena, Options, OwnedValue};

fuzz_target!(|data: &[u8]| {
    let mut arena = Arena::new();
    let strict_ok = {
        let mut tape = arena.tape(data);
        match tape.decode(0..data.len(), &Options::strict()) {
            Ok(item) => {
                let v = tape.value(item);
                let mut again = Vec::new();
                encode_value(v, &mut again).expect("strictly decoded values encode");
                assert_eq!(again, data, "strict decoding accepted a non-canonical encoding");
                let owned = OwnedValue::from_value(v).expect("strictly decoded values copy");
                assert_eq!(owned.to_cbor(), data);
                to_json_string(v).expect("strictly decoded values render as JSON");
                let _ = format!("{v:?}");
                true
            }
            Err(e) => {
                assert!(e.offset() <= data.len());
                let _ = e.to_string();
                false
            }
        }
    };
    let mut tape = arena.tape(data);
    match tape.decode(0..data.len(), &Options::lenient()) {
        Ok(item) => {
            let v = tape.value(item);
            let _ = to_json_string(v);
            let _ = encode_value(v, &mut Vec::new());
            let _ = OwnedValue::from_value(v);
            let _ = format!("{v:?}");
        }
        Err(e) => assert!(!strict_ok, "lenient refused what strict accepted: {e}"),
    }
    // Two items back to back, as in a frame.
    let mut tape = arena.tape(data);
    if let Ok((_, stop)) = tape.decode_prefix(0..data.len(), &Options::strict()) {
        assert!(stop <= data.len());
        let _ = tape.decode_prefix(stop..data.len(), &Options::strict());
    }
});
