//! Values as Python objects in atproto JSON form: what `riptide decode --json` prints, parsed.
//!
//! A DAG-CBOR value becomes what `json.loads` of its atproto JSON rendering
//! (`riptide_cbor::write_json`) would give, built straight from the tape with no JSON text in
//! between: maps are dicts (keys inserted in the rendering's bytewise order), CIDs
//! `{"$link": "b…"}`, byte strings `{"$bytes": base64 without padding}`. A value outside the atproto
//! data model (a float, `undefined`, a tag) is refused with the rendering's own message.

use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString};
use riptide_cbor::{JsonError, Kind, Value};

/// The atproto JSON form of `v` as Python objects.
pub fn value_to_py<'py>(py: Python<'py>, v: Value<'_>) -> PyResult<Bound<'py, PyAny>> {
    BUILDER.with(|b| match b.try_borrow_mut() {
        Ok(mut b) => b.value(py, v),
        // Re-entered (cannot happen: nothing here calls back into Python code that builds a
        // record); a fresh builder keeps it correct anyway.
        Err(_) => Builder::default().value(py, v),
    })
}

thread_local! {
    static BUILDER: RefCell<Builder> = RefCell::new(Builder::default());
}

/// Most distinct map keys kept as Python strings (per thread), and the longest kept.
const KEYS_MAX: usize = 4096;
const KEY_LEN_MAX: usize = 64;

/// What turning records into Python objects reuses from one record to the next: the map keys as
/// Python strings (records of a collection share their keys: `$type`, `text`, `createdAt`, …; a
/// cached key string also carries its cached hash, which the dict insert needs), and a scratch
/// buffer for CID text.
#[derive(Default)]
struct Builder {
    keys: HashMap<Box<[u8]>, Py<PyString>, BuildHasherDefault<FxHasher>>,
    scratch: Vec<u8>,
}

impl Builder {
    /// `k` as a Python string, from the cache when it is there.
    fn key<'py>(&mut self, py: Python<'py>, k: &str) -> Bound<'py, PyString> {
        if let Some(s) = self.keys.get(k.as_bytes()) {
            return s.bind(py).clone();
        }
        let s = PyString::new(py, k);
        if self.keys.len() < KEYS_MAX && k.len() <= KEY_LEN_MAX {
            self.keys.insert(k.as_bytes().into(), s.clone().unbind());
        }
        s
    }

    fn value<'py>(&mut self, py: Python<'py>, v: Value<'_>) -> PyResult<Bound<'py, PyAny>> {
        Ok(match v.kind() {
            Kind::Null => py.None().into_bound(py),
            Kind::Bool => pyo3::types::PyBool::new(py, v.as_bool() == Some(true))
                .to_owned()
                .into_any(),
            Kind::UInt | Kind::NegInt => match v.as_i64() {
                Some(i) => i.into_pyobject(py)?.into_any(),
                None => {
                    return Err(not_json(JsonError::NotInDataModel(
                        "an integer beyond 64 bits",
                    )))
                }
            },
            Kind::Text => PyString::new(py, v.as_str().unwrap_or_default()).into_any(),
            Kind::Bytes => {
                let b = v.as_bytes().unwrap_or_default();
                let d = PyDict::new(py);
                let text = data_encoding::BASE64_NOPAD.encode(b);
                d.set_item(self.key(py, "$bytes"), PyString::new(py, &text))?;
                d.into_any()
            }
            Kind::Link => {
                self.scratch.clear();
                if let Some(c) = v.as_link() {
                    c.write_string(&mut self.scratch);
                }
                // A CID's text is base32 (or base58btc): ASCII.
                let text = std::str::from_utf8(&self.scratch).unwrap_or_default();
                let text = PyString::new(py, text);
                let d = PyDict::new(py);
                d.set_item(self.key(py, "$link"), text)?;
                d.into_any()
            }
            Kind::Array => {
                let list = PyList::empty(py);
                for item in v.array().into_iter().flatten() {
                    list.append(self.value(py, item)?)?;
                }
                list.into_any()
            }
            Kind::Map => {
                // Canonical CBOR order is length-first; the JSON rendering's is bytewise.
                let mut pairs: Vec<(&str, Value<'_>)> = Vec::with_capacity(v.len());
                for (k, val) in v.map().into_iter().flatten() {
                    pairs.push((
                        k.as_str().ok_or_else(|| not_json(JsonError::NonTextKey))?,
                        val,
                    ));
                }
                if !pairs.is_sorted_by(|a, b| a.0.as_bytes() <= b.0.as_bytes()) {
                    pairs.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
                }
                let d = PyDict::new(py);
                for (k, val) in pairs {
                    let key = self.key(py, k);
                    d.set_item(key, self.value(py, val)?)?;
                }
                d.into_any()
            }
            Kind::Float => return Err(not_json(JsonError::NotInDataModel("a float"))),
            Kind::Undefined => return Err(not_json(JsonError::NotInDataModel("undefined"))),
            Kind::Simple => return Err(not_json(JsonError::NotInDataModel("a simple value"))),
            Kind::Tag => return Err(not_json(JsonError::NotInDataModel("a tag other than 42"))),
        })
    }
}

/// FxHash (rustc's): map keys are short and not attacker-chosen in a way that matters here (a
/// collision only costs a comparison, and the cache is bounded).
#[derive(Default, Clone, Copy)]
struct FxHasher(u64);

impl Hasher for FxHasher {
    fn write(&mut self, bytes: &[u8]) {
        const K: u64 = 0x51_7c_c1_b7_27_22_0a_95;
        let mut h = self.0;
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let w = u64::from_le_bytes(c.try_into().unwrap_or([0; 8]));
            h = (h.rotate_left(5) ^ w).wrapping_mul(K);
        }
        for &b in chunks.remainder() {
            h = (h.rotate_left(5) ^ u64::from(b)).wrapping_mul(K);
        }
        self.0 = h;
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

fn not_json(e: JsonError) -> PyErr {
    PyValueError::new_err(e.to_string())
}

/// A parsed JSON document as Python objects (for Jetstream events).
pub fn json_to_py<'py>(py: Python<'py>, v: &serde_json::Value) -> PyResult<Bound<'py, PyAny>> {
    use serde_json::Value as J;
    Ok(match v {
        J::Null => py.None().into_bound(py),
        J::Bool(b) => pyo3::types::PyBool::new(py, *b).to_owned().into_any(),
        J::Number(n) => {
            if let Some(i) = n.as_i64() {
                i.into_pyobject(py)?.into_any()
            } else if let Some(u) = n.as_u64() {
                u.into_pyobject(py)?.into_any()
            } else {
                n.as_f64().unwrap_or(f64::NAN).into_pyobject(py)?.into_any()
            }
        }
        J::String(s) => PyString::new(py, s).into_any(),
        J::Array(a) => {
            let list = PyList::empty(py);
            for item in a {
                list.append(json_to_py(py, item)?)?;
            }
            list.into_any()
        }
        J::Object(o) => {
            let d = PyDict::new(py);
            for (k, val) in o {
                d.set_item(PyString::new(py, k), json_to_py(py, val)?)?;
            }
            d.into_any()
        }
    })
}
