//! `Verifier` and `Verdict`: `riptide_firehose::verify::Verifier` for Python.
//!
//! One Rust verifier per Python `Verifier`, so it is stateful across frames exactly as the Rust
//! one is (its per-DID key cache, dropped on the DID's `#identity` frame, and whatever per-account
//! state the Rust verifier keeps): feed one account's frames to one verifier, in order. `verify`
//! releases the GIL, so several Python threads with a verifier each verify in parallel.
//!
//! A `Verdict`'s `name` is the CLI's (`riptide verify --json`'s `verdict`), its `reason` the CLI's
//! `reason` text.

use pyo3::prelude::*;
use riptide_firehose::verify::{Report, Verifier as RsVerifier};

use crate::keys::Keys;

/// The verdict on one frame.
#[pyclass(module = "riptide", name = "Verdict", frozen)]
#[derive(Clone, Debug)]
pub struct Verdict {
    name: &'static str,
    reason: Option<String>,
    kind: &'static str,
    seq: Option<i64>,
    did: Option<String>,
}

impl Verdict {
    pub fn of_report(r: &Report<'_>) -> Verdict {
        Verdict {
            name: r.verdict.as_str(),
            reason: r.failure.as_ref().map(|f| f.to_string()),
            kind: r.kind,
            seq: r.seq,
            did: r.did.map(str::to_owned),
        }
    }

    pub fn is_ok(&self) -> bool {
        self.name == "ok"
    }
}

#[pymethods]
impl Verdict {
    /// Whether the frame verified.
    #[getter]
    fn ok(&self) -> bool {
        self.is_ok()
    }
    /// `ok`, `bad-signature`, `bad-block-cid`, `missing-block`, `inversion-mismatch`,
    /// `malformed`, `limits` or `unknown-key` (the CLI's names).
    #[getter]
    fn name(&self) -> &'static str {
        self.name
    }
    /// Why, when not ok (the CLI's text); None when ok.
    #[getter]
    fn reason(&self) -> Option<&str> {
        self.reason.as_deref()
    }
    /// The frame's kind (`commit`, …; `invalid` when the header does not decode).
    #[getter]
    fn kind(&self) -> &'static str {
        self.kind
    }
    /// The frame's seq, when it could be read.
    #[getter]
    fn seq(&self) -> Option<i64> {
        self.seq
    }
    /// The frame's DID, when it could be read.
    #[getter]
    fn did(&self) -> Option<&str> {
        self.did.as_deref()
    }
    fn __bool__(&self) -> bool {
        self.is_ok()
    }
    fn __repr__(&self) -> String {
        match &self.reason {
            Some(r) => format!("Verdict({:?}, reason={r:?})", self.name),
            None => format!("Verdict({:?})", self.name),
        }
    }
}

/// Verifies firehose frames: block CIDs, commit signatures, Sync 1.1 proofs.
#[pyclass(module = "riptide", name = "_Verifier")]
#[derive(Debug)]
pub struct PyVerifier {
    inner: RsVerifier<Keys>,
}

#[pymethods]
impl PyVerifier {
    #[new]
    #[pyo3(signature = (did_docs_json = None, plc_url = None))]
    fn new(did_docs_json: Option<&[u8]>, plc_url: Option<String>) -> PyResult<PyVerifier> {
        Ok(PyVerifier {
            inner: RsVerifier::new(Keys::new(did_docs_json, plc_url)?),
        })
    }

    /// verify(data: bytes) -> Verdict
    fn verify(&mut self, py: Python<'_>, data: &[u8]) -> Verdict {
        let inner = &mut self.inner;
        py.detach(|| Verdict::of_report(&inner.check(data)))
    }

    /// Verdict counts so far, by name (zeros included).
    fn counts(&self) -> Vec<(&'static str, u64)> {
        self.inner
            .counts()
            .iter()
            .map(|(v, n)| (v.as_str(), n))
            .collect()
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Verdict>()?;
    m.add_class::<PyVerifier>()?;
    Ok(())
}
