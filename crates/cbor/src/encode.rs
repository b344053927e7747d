//! The deterministic DAG-CBOR encoder and an owned value type.
//!
//! Why: verification re-encodes data to hash it (a commit without its signature, MST nodes rebuilt
//! from leaves), and a record given as JSON must encode to exactly the bytes its author hashed.
//! Determinism is the whole point: map keys in canonical order (length first, then bytewise),
//! shortest integer and length forms, no indefinite lengths, no floats.

use std::collections::BTreeMap;

use crate::cid::{Cid, CidBuf};
use crate::tape::Kind;
use crate::value::Value;

/// Appends an initial byte with major type `major` and argument `arg` in shortest form.
#[inline]
pub fn write_head(out: &mut Vec<u8>, major: u8, arg: u64) {
    let m = major << 5;
    if arg < 24 {
        out.push(m | arg as u8);
    } else if arg <= 0xff {
        out.extend_from_slice(&[m | 24, arg as u8]);
    } else if arg <= 0xffff {
        out.push(m | 25);
        out.extend_from_slice(&(arg as u16).to_be_bytes());
    } else if arg <= 0xffff_ffff {
        out.push(m | 26);
        out.extend_from_slice(&(arg as u32).to_be_bytes());
    } else {
        out.push(m | 27);
        out.extend_from_slice(&arg.to_be_bytes());
    }
}

/// Appends an integer.
#[inline]
pub fn write_int(out: &mut Vec<u8>, v: i64) {
    if v >= 0 {
        write_head(out, 0, v as u64);
    } else {
        write_head(out, 1, (-1 - v) as u64);
    }
}

/// Appends a text string.
#[inline]
pub fn write_text(out: &mut Vec<u8>, s: &str) {
    write_head(out, 3, s.len() as u64);
    out.extend_from_slice(s.as_bytes());
}

/// Appends a byte string.
#[inline]
pub fn write_bytes(out: &mut Vec<u8>, b: &[u8]) {
    write_head(out, 2, b.len() as u64);
    out.extend_from_slice(b);
}

/// Appends a link: tag 42 over 0x00 followed by the binary CID.
#[inline]
pub fn write_link(out: &mut Vec<u8>, cid: Cid<'_>) {
    out.extend_from_slice(&[0xd8, 0x2a]);
    let b = cid.as_bytes();
    write_head(out, 2, b.len() as u64 + 1);
    out.push(0);
    out.extend_from_slice(b);
}

/// Appends `true` or `false`.
#[inline]
pub fn write_bool(out: &mut Vec<u8>, b: bool) {
    out.push(if b { 0xf5 } else { 0xf4 });
}

/// Appends `null`.
#[inline]
pub fn write_null(out: &mut Vec<u8>) {
    out.push(0xf6);
}

/// Appends an array header for `len` items.
#[inline]
pub fn write_array_header(out: &mut Vec<u8>, len: usize) {
    write_head(out, 4, len as u64);
}

/// Appends a map header for `len` pairs. The caller writes keys in [`canonical_cmp`] order.
#[inline]
pub fn write_map_header(out: &mut Vec<u8>, len: usize) {
    write_head(out, 5, len as u64);
}

/// DAG-CBOR's canonical map key order: shorter keys first, then bytewise.
#[inline]
pub fn canonical_cmp(a: &str, b: &str) -> std::cmp::Ordering {
    a.len()
        .cmp(&b.len())
        .then_with(|| a.as_bytes().cmp(b.as_bytes()))
}

/// Why a value cannot be encoded as DAG-CBOR.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum EncodeError {
    /// Floats, `undefined`, other simple values and tags other than 42 have no DAG-CBOR form in
    /// the atproto data model.
    NotInDataModel,
    /// A map key is not text.
    NonTextKey,
    /// The same key twice in one map.
    DuplicateKey,
}

impl std::fmt::Display for EncodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            EncodeError::NotInDataModel => "value is not in the atproto data model",
            EncodeError::NonTextKey => "map key is not text",
            EncodeError::DuplicateKey => "duplicate map key",
        })
    }
}

impl std::error::Error for EncodeError {}

/// Re-encodes a decoded value deterministically (canonical key order, shortest forms). For a
/// strictly decoded value this reproduces the input bytes exactly.
pub fn encode_value(v: Value<'_>, out: &mut Vec<u8>) -> Result<(), EncodeError> {
    match v.kind() {
        Kind::Null => write_null(out),
        Kind::Bool => write_bool(out, v.as_bool() == Some(true)),
        Kind::UInt | Kind::NegInt => write_int(out, v.as_i64().ok_or(EncodeError::NotInDataModel)?),
        Kind::Bytes => write_bytes(out, v.as_bytes().unwrap_or_default()),
        Kind::Text => write_text(out, v.as_str().unwrap_or_default()),
        Kind::Link => match v.as_link() {
            Some(c) => write_link(out, c),
            None => return Err(EncodeError::NotInDataModel),
        },
        Kind::Array => {
            write_array_header(out, v.len());
            for item in v.array().into_iter().flatten() {
                encode_value(item, out)?;
            }
        }
        Kind::Map => {
            let mut pairs = Vec::with_capacity(v.len());
            for (k, val) in v.map().into_iter().flatten() {
                pairs.push((k.as_str().ok_or(EncodeError::NonTextKey)?, val));
            }
            pairs.sort_by(|a, b| canonical_cmp(a.0, b.0));
            if pairs.windows(2).any(|w| w[0].0 == w[1].0) {
                return Err(EncodeError::DuplicateKey);
            }
            write_map_header(out, pairs.len());
            for (k, val) in pairs {
                write_text(out, k);
                encode_value(val, out)?;
            }
        }
        Kind::Float | Kind::Undefined | Kind::Simple | Kind::Tag => {
            return Err(EncodeError::NotInDataModel)
        }
    }
    Ok(())
}

/// An owned atproto data-model value, for building data (JSON input, generators, tests).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OwnedValue {
    /// `null`.
    Null,
    /// A boolean.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A byte string.
    Bytes(Vec<u8>),
    /// A text string.
    Text(String),
    /// A CID link.
    Link(CidBuf),
    /// An array.
    Array(Vec<OwnedValue>),
    /// A map; encoded in canonical key order whatever the order here.
    Map(BTreeMap<String, OwnedValue>),
}

impl OwnedValue {
    /// Copies a decoded value.
    pub fn from_value(v: Value<'_>) -> Result<OwnedValue, EncodeError> {
        Ok(match v.kind() {
            Kind::Null => OwnedValue::Null,
            Kind::Bool => OwnedValue::Bool(v.as_bool() == Some(true)),
            Kind::UInt | Kind::NegInt => {
                OwnedValue::Int(v.as_i64().ok_or(EncodeError::NotInDataModel)?)
            }
            Kind::Bytes => OwnedValue::Bytes(v.as_bytes().unwrap_or_default().to_vec()),
            Kind::Text => OwnedValue::Text(v.as_str().unwrap_or_default().to_owned()),
            Kind::Link => {
                OwnedValue::Link(v.as_link().ok_or(EncodeError::NotInDataModel)?.to_buf())
            }
            Kind::Array => OwnedValue::Array(
                v.array()
                    .into_iter()
                    .flatten()
                    .map(OwnedValue::from_value)
                    .collect::<Result<_, _>>()?,
            ),
            Kind::Map => {
                let mut m = BTreeMap::new();
                for (k, val) in v.map().into_iter().flatten() {
                    let k = k.as_str().ok_or(EncodeError::NonTextKey)?.to_owned();
                    if m.insert(k, OwnedValue::from_value(val)?).is_some() {
                        return Err(EncodeError::DuplicateKey);
                    }
                }
                OwnedValue::Map(m)
            }
            Kind::Float | Kind::Undefined | Kind::Simple | Kind::Tag => {
                return Err(EncodeError::NotInDataModel)
            }
        })
    }

    /// Appends the deterministic DAG-CBOR encoding.
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            OwnedValue::Null => write_null(out),
            OwnedValue::Bool(b) => write_bool(out, *b),
            OwnedValue::Int(i) => write_int(out, *i),
            OwnedValue::Bytes(b) => write_bytes(out, b),
            OwnedValue::Text(s) => write_text(out, s),
            OwnedValue::Link(c) => write_link(out, c.as_cid()),
            OwnedValue::Array(items) => {
                write_array_header(out, items.len());
                for i in items {
                    i.encode(out);
                }
            }
            OwnedValue::Map(m) => {
                // Canonical order is length-first, not the map's bytewise order: sort the
                // pairs, on the stack for the small maps records are made of (a heap `Vec`
                // per map showed in generator profiles).
                const SMALL: usize = 16;
                static FILL: OwnedValue = OwnedValue::Null;
                write_map_header(out, m.len());
                let write = |out: &mut Vec<u8>, pairs: &mut [(&str, &OwnedValue)]| {
                    pairs.sort_unstable_by(|a, b| canonical_cmp(a.0, b.0));
                    for (k, v) in pairs.iter() {
                        write_text(out, k);
                        v.encode(out);
                    }
                };
                if m.len() <= SMALL {
                    let mut pairs = [("", &FILL); SMALL];
                    for (slot, (k, v)) in pairs.iter_mut().zip(m) {
                        *slot = (k.as_str(), v);
                    }
                    write(out, &mut pairs[..m.len()]);
                } else {
                    let mut pairs: Vec<(&str, &OwnedValue)> =
                        m.iter().map(|(k, v)| (k.as_str(), v)).collect();
                    write(out, &mut pairs);
                }
            }
        }
    }

    /// The deterministic DAG-CBOR encoding.
    pub fn to_cbor(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode(&mut out);
        out
    }

    /// The CIDv1 (dag-cbor, SHA-256) of the encoding.
    pub fn cid(&self) -> CidBuf {
        CidBuf::sha256(crate::cid::DAG_CBOR, &self.to_cbor())
    }

    /// The value under `key`, if this is a map that has it.
    pub fn get(&self, key: &str) -> Option<&OwnedValue> {
        match self {
            OwnedValue::Map(m) => m.get(key),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tape::{Arena, Options};

    #[test]
    fn heads_are_minimal() {
        let cases: [(u64, &[u8]); 6] = [
            (0, &[0x00]),
            (23, &[0x17]),
            (24, &[0x18, 24]),
            (256, &[0x19, 1, 0]),
            (65536, &[0x1a, 0, 1, 0, 0]),
            (1 << 32, &[0x1b, 0, 0, 0, 1, 0, 0, 0, 0]),
        ];
        for (v, want) in cases {
            let mut out = Vec::new();
            write_head(&mut out, 0, v);
            assert_eq!(out, want, "{v}");
        }
        let mut out = Vec::new();
        write_int(&mut out, -1);
        write_int(&mut out, i64::MIN);
        assert_eq!(out[0], 0x20);
        assert_eq!(out[1], 0x3b);
    }

    #[test]
    fn map_keys_canonical() {
        let mut m = BTreeMap::new();
        m.insert("bb".to_string(), OwnedValue::Int(1));
        m.insert("a".to_string(), OwnedValue::Int(2));
        m.insert("c".to_string(), OwnedValue::Int(3));
        let bytes = OwnedValue::Map(m).to_cbor();
        // a, c, bb
        assert_eq!(
            bytes,
            [0xa3, 0x61, b'a', 2, 0x61, b'c', 3, 0x62, b'b', b'b', 1]
        );
        let mut arena = Arena::new();
        let mut tape = arena.tape(&bytes);
        let item = tape.decode(0..bytes.len(), &Options::strict()).unwrap();
        let mut again = Vec::new();
        encode_value(tape.value(item), &mut again).unwrap();
        assert_eq!(again, bytes);
    }

    #[test]
    fn map_keys_canonical_small_and_large() {
        // Up to and past the on-stack sort's size: keys of mixed lengths, nested; strict
        // decoding (which rejects non-canonical key order) accepts the output.
        for n in [0usize, 1, 15, 16, 17, 40] {
            let m: BTreeMap<String, OwnedValue> = (0..n)
                .map(|i| {
                    (
                        "k".repeat(i % 5 + 1) + &i.to_string(),
                        OwnedValue::Int(i as i64),
                    )
                })
                .collect();
            let mut outer = m.clone();
            outer.insert("inner".into(), OwnedValue::Map(m));
            let bytes = OwnedValue::Map(outer.clone()).to_cbor();
            let mut arena = Arena::new();
            let mut tape = arena.tape(&bytes);
            let item = tape.decode(0..bytes.len(), &Options::strict()).unwrap();
            let v = tape.value(item);
            let keys: Vec<&str> = v.entries().map(|(k, _)| k).collect();
            let mut want: Vec<&str> = outer.keys().map(String::as_str).collect();
            want.sort_by(|a, b| canonical_cmp(a, b));
            assert_eq!(keys, want, "{n} keys");
            assert_eq!(v.get("inner").map(|i| i.len()), Some(n));
        }
    }
}
