//! Values as Python objects in atproto JSON form: what `riptide decode --json` prints, parsed.
//!
//! A DAG-CBOR value becomes what `json.loads` of its atproto JSON rendering
//! (`riptide_cbor::write_json`) would give, built straight from the tape with no JSON text in
//! between: maps are dicts (keys inserted in the rendering's bytewise order), CIDs
//! `{"$link": "b…"}`, byte strings `{"$bytes": base64 without padding}`. A value outside the atproto
//! data model (a float, `undefined`, a tag) is refused with the rendering's own message.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString};
use riptide_cbor::{JsonError, Kind, Value};

/// The atproto JSON form of `v` as Python objects.
pub fn value_to_py<'py>(py: Python<'py>, v: Value<'_>) -> PyResult<Bound<'py, PyAny>> {
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
            d.set_item("$bytes", data_encoding::BASE64_NOPAD.encode(b))?;
            d.into_any()
        }
        Kind::Link => {
            let d = PyDict::new(py);
            let s = v.as_link().map(|c| c.to_string()).unwrap_or_default();
            d.set_item("$link", s)?;
            d.into_any()
        }
        Kind::Array => {
            let list = PyList::empty(py);
            for item in v.array().into_iter().flatten() {
                list.append(value_to_py(py, item)?)?;
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
            pairs.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            let d = PyDict::new(py);
            for (k, val) in pairs {
                d.set_item(PyString::new(py, k), value_to_py(py, val)?)?;
            }
            d.into_any()
        }
        Kind::Float => return Err(not_json(JsonError::NotInDataModel("a float"))),
        Kind::Undefined => return Err(not_json(JsonError::NotInDataModel("undefined"))),
        Kind::Simple => return Err(not_json(JsonError::NotInDataModel("a simple value"))),
        Kind::Tag => return Err(not_json(JsonError::NotInDataModel("a tag other than 42"))),
    })
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
