//! atproto JSON: rendering decoded DAG-CBOR, and the reverse.
//!
//! Why hand-written rather than through serde: the output must match what Jetstream (Go's
//! `encoding/json`) sends — keys sorted bytewise at every depth, `<`, `>`, `&`, U+2028 and U+2029
//! escaped as `\u003c`…, integers exact, bytes as `{"$bytes": base64 without padding}`, CIDs as
//! `{"$link": "b…"}` — and it runs once per record on the server's hot path, straight from the tape
//! into an output buffer with no intermediate tree. See `shared/docs/jetstream-protocol.md` §3.1–3.2.
//!
//! The reverse direction (JSON → DAG-CBOR) is not hot; it goes through `serde_json::Value` and
//! checks the atproto data model (no fractional floats, well-formed `$link`/`$bytes`/blob objects,
//! non-empty string `$type`) so that a record given as JSON can be hashed to its CID.

use std::collections::BTreeMap;

use crate::cid::CidBuf;
use crate::encode::OwnedValue;
use crate::tape::Kind;
use crate::value::Value;

/// Why a value has no atproto JSON form, or JSON no DAG-CBOR form.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum JsonError {
    /// A float, `undefined`, another simple value or a tag: not in the atproto data model.
    NotInDataModel(&'static str),
    /// A map key that is not text (lenient input only).
    NonTextKey,
    /// JSON that breaks a data-model rule; the text says which.
    DataModel(String),
}

impl std::fmt::Display for JsonError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            JsonError::NotInDataModel(what) => write!(f, "{what} is not in the atproto data model"),
            JsonError::NonTextKey => f.write_str("map key is not text"),
            JsonError::DataModel(why) => write!(f, "invalid atproto data: {why}"),
        }
    }
}

impl std::error::Error for JsonError {}

/// Bytes that need escaping in a JSON string as Go writes it (0 = copy as is).
static ESCAPE: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut i = 0;
    while i < 0x20 {
        t[i] = b'u';
        i += 1;
    }
    t[b'\n' as usize] = b'n';
    t[b'\r' as usize] = b'r';
    t[b'\t' as usize] = b't';
    t[0x08] = b'b';
    t[0x0c] = b'f';
    t[b'"' as usize] = b'"';
    t[b'\\' as usize] = b'\\';
    t[b'<' as usize] = b'u';
    t[b'>' as usize] = b'u';
    t[b'&' as usize] = b'u';
    // 0xE2 may start U+2028 / U+2029; checked in place.
    t[0xe2] = b'?';
    t
};

const HEX: &[u8; 16] = b"0123456789abcdef";

/// Appends `s` as a JSON string literal, escaped as Go's `encoding/json` does.
pub fn write_json_string(out: &mut Vec<u8>, s: &str) {
    let bytes = s.as_bytes();
    out.reserve(bytes.len() + 2);
    out.push(b'"');
    let mut start = 0;
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        let esc = ESCAPE[b as usize];
        if esc == 0 {
            i += 1;
            continue;
        }
        if esc == b'?' {
            // U+2028 is E2 80 A8, U+2029 is E2 80 A9.
            if i + 2 < bytes.len() && bytes[i + 1] == 0x80 && (bytes[i + 2] & 0xfe) == 0xa8 {
                out.extend_from_slice(&bytes[start..i]);
                out.extend_from_slice(if bytes[i + 2] == 0xa8 {
                    b"\\u2028"
                } else {
                    b"\\u2029"
                });
                i += 3;
                start = i;
            } else {
                i += 1;
            }
            continue;
        }
        out.extend_from_slice(&bytes[start..i]);
        if esc == b'u' {
            out.extend_from_slice(&[
                b'\\',
                b'u',
                b'0',
                b'0',
                HEX[(b >> 4) as usize],
                HEX[(b & 15) as usize],
            ]);
        } else {
            out.extend_from_slice(&[b'\\', esc]);
        }
        i += 1;
        start = i;
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}

/// Appends bytes as atproto JSON: `{"$bytes":"<standard base64, no padding>"}`.
pub fn write_json_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(b"{\"$bytes\":\"");
    let enc = &data_encoding::BASE64_NOPAD;
    let start = out.len();
    out.resize(start + enc.encode_len(b.len()), 0);
    enc.encode_mut(b, &mut out[start..]);
    out.extend_from_slice(b"\"}");
}

/// Appends an integer as JSON.
#[inline]
pub fn write_json_int(out: &mut Vec<u8>, v: i64) {
    let mut buf = itoa::Buffer::new();
    out.extend_from_slice(buf.format(v).as_bytes());
}

/// Maps with at most this many entries are sorted for [`write_json`] without an allocation.
const SMALL_MAP: usize = 16;

/// Appends the atproto JSON rendering of a decoded value (record keys sorted bytewise).
///
/// On error, `out` may hold a partial rendering: truncate it to its previous length.
pub fn write_json(v: Value<'_>, out: &mut Vec<u8>) -> Result<(), JsonError> {
    match v.kind() {
        Kind::Null => out.extend_from_slice(b"null"),
        Kind::Bool => out.extend_from_slice(if v.as_bool() == Some(true) {
            b"true"
        } else {
            b"false"
        }),
        Kind::UInt | Kind::NegInt => match v.as_i64() {
            Some(i) => write_json_int(out, i),
            None => return Err(JsonError::NotInDataModel("an integer beyond 64 bits")),
        },
        Kind::Text => write_json_string(out, v.as_str().unwrap_or_default()),
        Kind::Bytes => write_json_bytes(out, v.as_bytes().unwrap_or_default()),
        Kind::Link => {
            out.extend_from_slice(b"{\"$link\":\"");
            if let Some(c) = v.as_link() {
                c.write_string(out);
            }
            out.extend_from_slice(b"\"}");
        }
        Kind::Array => {
            out.push(b'[');
            for (i, item) in v.array().into_iter().flatten().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_json(item, out)?;
            }
            out.push(b']');
        }
        Kind::Map => {
            // Canonical CBOR order is length-first; JSON wants bytewise. A record's maps are
            // small: sorted on the stack, not in an allocation per map (a record has several).
            let mut small = [("", v); SMALL_MAP];
            let mut large = Vec::new();
            let pairs: &mut [(&str, Value<'_>)] = if v.len() <= SMALL_MAP {
                &mut small[..]
            } else {
                large.resize(v.len(), ("", v));
                &mut large[..]
            };
            let mut n = 0;
            for (k, val) in v.map().into_iter().flatten() {
                // A map yields exactly its length's entries; said rather than cut if not.
                let Some(slot) = pairs.get_mut(n) else {
                    return Err(JsonError::NotInDataModel(
                        "a map with more entries than its length",
                    ));
                };
                *slot = (k.as_str().ok_or(JsonError::NonTextKey)?, val);
                n += 1;
            }
            let pairs = &mut pairs[..n];
            pairs.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            out.push(b'{');
            for (i, &(k, val)) in pairs.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_json_string(out, k);
                out.push(b':');
                write_json(val, out)?;
            }
            out.push(b'}');
        }
        Kind::Float => return Err(JsonError::NotInDataModel("a float")),
        Kind::Undefined => return Err(JsonError::NotInDataModel("undefined")),
        Kind::Simple => return Err(JsonError::NotInDataModel("a simple value")),
        Kind::Tag => return Err(JsonError::NotInDataModel("a tag other than 42")),
    }
    Ok(())
}

/// The atproto JSON rendering of a decoded value, as a `String`.
pub fn to_json_string(v: Value<'_>) -> Result<String, JsonError> {
    let mut out = Vec::new();
    write_json(v, &mut out)?;
    // Every piece written is valid UTF-8 (validated text, ASCII syntax, escapes).
    String::from_utf8(out).map_err(|_| JsonError::NotInDataModel("invalid UTF-8"))
}

fn bad(why: impl Into<String>) -> JsonError {
    JsonError::DataModel(why.into())
}

/// Converts atproto JSON to a data-model value, checking the data model's rules. The top level
/// must be an object.
pub fn json_to_value(json: &serde_json::Value) -> Result<OwnedValue, JsonError> {
    if !json.is_object() {
        return Err(bad("top level is not an object"));
    }
    convert(json, 0)
}

/// JSON nesting beyond this is refused (the CBOR decoder's default limit).
const MAX_JSON_DEPTH: usize = 64;

fn convert(json: &serde_json::Value, depth: usize) -> Result<OwnedValue, JsonError> {
    use serde_json::Value as J;
    if depth > MAX_JSON_DEPTH {
        return Err(bad("nested too deeply"));
    }
    Ok(match json {
        J::Null => OwnedValue::Null,
        J::Bool(b) => OwnedValue::Bool(*b),
        J::Number(n) => {
            if let Some(i) = n.as_i64() {
                OwnedValue::Int(i)
            } else if let Some(f) = n.as_f64() {
                // An integer-like float (123.0) is an integer; anything else is not in the model.
                if f.fract() == 0.0 && f.abs() < 9.007_199_254_740_992e15 {
                    OwnedValue::Int(f as i64)
                } else {
                    return Err(bad(format!("float {n}")));
                }
            } else {
                return Err(bad(format!("integer {n} out of the 64-bit signed range")));
            }
        }
        J::String(s) => OwnedValue::Text(s.clone()),
        J::Array(items) => OwnedValue::Array(
            items
                .iter()
                .map(|i| convert(i, depth + 1))
                .collect::<Result<_, _>>()?,
        ),
        J::Object(obj) => {
            if let Some(link) = obj.get("$link") {
                if obj.len() != 1 {
                    return Err(bad("$link object with extra fields"));
                }
                let s = link.as_str().ok_or_else(|| bad("$link is not a string"))?;
                let cid = CidBuf::parse(s).map_err(|e| bad(format!("$link {s:?}: {e}")))?;
                return Ok(OwnedValue::Link(cid));
            }
            if let Some(b) = obj.get("$bytes") {
                if obj.len() != 1 {
                    return Err(bad("$bytes object with extra fields"));
                }
                let s = b.as_str().ok_or_else(|| bad("$bytes is not a string"))?;
                let s = s.trim_end_matches('=');
                let bytes = data_encoding::BASE64_NOPAD
                    .decode(s.as_bytes())
                    .map_err(|e| bad(format!("$bytes: {e}")))?;
                return Ok(OwnedValue::Bytes(bytes));
            }
            if let Some(t) = obj.get("$type") {
                match t.as_str() {
                    Some("") => return Err(bad("$type is empty")),
                    Some(_) => {}
                    None => return Err(bad("$type is not a string")),
                }
                if t.as_str() == Some("blob") {
                    check_blob(obj)?;
                }
            }
            let mut m = BTreeMap::new();
            for (k, v) in obj {
                m.insert(k.clone(), convert(v, depth + 1)?);
            }
            OwnedValue::Map(m)
        }
    })
}

fn check_blob(obj: &serde_json::Map<String, serde_json::Value>) -> Result<(), JsonError> {
    let link_ok = obj
        .get("ref")
        .and_then(|r| r.as_object())
        .is_some_and(|r| r.len() == 1 && r.get("$link").is_some_and(|l| l.is_string()));
    if !link_ok {
        return Err(bad("blob without a ref link"));
    }
    if !obj.get("mimeType").is_some_and(|m| m.is_string()) {
        return Err(bad("blob without a string mimeType"));
    }
    if !obj.get("size").is_some_and(|s| s.is_i64()) {
        return Err(bad("blob without an integer size"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn esc(s: &str) -> String {
        let mut out = Vec::new();
        write_json_string(&mut out, s);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn go_escaping() {
        assert_eq!(esc("a<b>&c"), r#""a\u003cb\u003e\u0026c""#);
        assert_eq!(esc("q\"\\"), r#""q\"\\""#);
        assert_eq!(esc("\n\r\t\u{8}\u{c}\u{1}"), r#""\n\r\t\b\f\u0001""#);
        assert_eq!(esc("x\u{2028}y\u{2029}z"), r#""x\u2028y\u2029z""#);
        assert_eq!(esc("é✓😀\u{2027}"), "\"é✓😀\u{2027}\"");
        assert_eq!(esc("\u{7f}"), "\"\u{7f}\"");
    }

    #[test]
    fn data_model_rules() {
        let ok = serde_json::json!({"a": 123.0, "b": {"$bytes": "AAE"}});
        let v = json_to_value(&ok).unwrap();
        assert_eq!(v.get("a"), Some(&OwnedValue::Int(123)));
        assert_eq!(v.get("b"), Some(&OwnedValue::Bytes(vec![0, 1])));
        assert!(json_to_value(&serde_json::json!({"a": 1.5})).is_err());
        assert!(json_to_value(&serde_json::json!([1])).is_err());
        assert!(json_to_value(&serde_json::json!({"$type": ""})).is_err());
    }
}
