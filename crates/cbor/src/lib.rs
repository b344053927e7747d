//! Zero-copy DAG-CBOR for the AT Protocol: decoding, encoding, CIDs and atproto JSON.
//!
//! Why this crate exists: every firehose frame is two DAG-CBOR objects wrapping a CAR of DAG-CBOR
//! blocks. Decoding is the hot path of every relay, backfill tool and Jetstream server, so it is
//! written here by hand around one idea: decode into a reusable flat tape of 16-byte nodes that
//! point into the input ([`Arena`], [`Tape`], [`Value`]) — no allocation per value, no copies.
//!
//! Strict by default: [`Mode::Strict`] accepts exactly the DAG-CBOR that atproto defines
//! (<https://atproto.com/specs/data-model>), and every error is an [`Error`] with a kind and a byte
//! offset. [`Mode::Lenient`] exists for diagnostics.
//!
//! What it does not do: I/O, CAR files (crate `riptide-car`), hashing beyond [`CidBuf::sha256`].
//!
//! ```
//! use riptide_cbor::{Arena, Options};
//! let bytes = [0xa1, 0x61, b'a', 0x01]; // {"a": 1}
//! let mut arena = Arena::new();
//! let mut tape = arena.tape(&bytes);
//! let item = tape.decode(0..bytes.len(), &Options::strict()).unwrap();
//! assert_eq!(tape.value(item).get("a").and_then(|v| v.as_i64()), Some(1));
//! ```

mod cid;
mod descent;
mod encode;
mod error;
mod json;
mod tape;
mod value;

pub use cid::{
    read_varint, write_varint, Cid, CidBuf, CidError, DAG_CBOR, DAG_PB, MAX_CID_LEN, RAW, SHA2_256,
};
pub use encode::{
    canonical_cmp, encode_value, write_array_header, write_bool, write_bytes, write_head,
    write_int, write_link, write_map_header, write_null, write_text, EncodeError, OwnedValue,
};
pub use error::{Error, ErrorKind};
pub use json::{
    json_to_value, to_json_string, write_json, write_json_bytes, write_json_int, write_json_string,
    JsonError,
};
pub use tape::{Arena, Doc, Item, Kind, Limits, Mode, Options, Tape};
pub use value::{Items, Pairs, Value};
