//! `verify_repo` and `list_records`: repository exports (`com.atproto.sync.getRepo` CARs), as
//! `riptide repo verify` and `riptide repo ls` check and list them.
//!
//! A repository that does not verify is a report with `ok == False`, the CLI's verdict name and
//! reason, not an exception (as the CLI reports it and exits 1); a `key` that is not a did:key is
//! a `ValueError`.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use riptide_car::{CarOptions, CarReader};
use riptide_crypto::PublicKey;
use riptide_repo::{list_records as rs_list_records, verify_repo as rs_verify_repo, RepoError};
use riptide_resolver::TrustVerdict;

/// What `verify_repo` found.
#[pyclass(module = "riptide", name = "RepoReport", frozen)]
#[derive(Debug)]
pub struct RepoReport {
    name: &'static str,
    reason: Option<String>,
    report: Option<riptide_repo::RepoReport>,
    bytes: usize,
}

#[pymethods]
impl RepoReport {
    /// Whether the repository verified.
    #[getter]
    fn ok(&self) -> bool {
        self.name == "ok"
    }
    /// `ok`, `bad-block-cid`, `bad-signature`, `missing-block`, `root-mismatch`, `malformed`,
    /// `limits` (the names of `riptide repo verify`).
    #[getter]
    fn name(&self) -> &'static str {
        self.name
    }
    /// Why, when not ok.
    #[getter]
    fn reason(&self) -> Option<&str> {
        self.reason.as_deref()
    }
    /// The repository DID.
    #[getter]
    fn did(&self) -> Option<&str> {
        self.report.as_ref().map(|r| r.did.as_str())
    }
    /// The commit's revision.
    #[getter]
    fn rev(&self) -> Option<&str> {
        self.report.as_ref().map(|r| r.rev.as_str())
    }
    /// The commit CID (the CAR root).
    #[getter]
    fn commit(&self) -> Option<String> {
        self.report.as_ref().map(|r| r.commit.to_string())
    }
    /// The MST root CID.
    #[getter]
    fn data(&self) -> Option<String> {
        self.report.as_ref().map(|r| r.data.to_string())
    }
    /// Number of records.
    #[getter]
    fn records(&self) -> Option<usize> {
        self.report.as_ref().map(|r| r.records)
    }
    /// Number of MST nodes.
    #[getter]
    fn mst_nodes(&self) -> Option<usize> {
        self.report.as_ref().map(|r| r.mst_nodes)
    }
    /// Number of blocks in the CAR.
    #[getter]
    fn blocks(&self) -> Option<usize> {
        self.report.as_ref().map(|r| r.blocks)
    }
    /// Size of the CAR in bytes.
    #[getter]
    fn bytes(&self) -> usize {
        self.bytes
    }
    /// Whether the signature was checked (a key was given) and verified.
    #[getter]
    fn signature_checked(&self) -> bool {
        self.report.as_ref().is_some_and(|r| r.signature_checked)
    }
    fn __bool__(&self) -> bool {
        self.ok()
    }
    fn __repr__(&self) -> String {
        match (&self.reason, &self.report) {
            (Some(r), _) => format!("RepoReport({:?}, reason={r:?})", self.name),
            (None, Some(r)) => format!(
                "RepoReport({:?}, did={:?}, records={})",
                self.name, r.did, r.records
            ),
            (None, None) => format!("RepoReport({:?})", self.name),
        }
    }
}

fn verdict(e: &RepoError) -> &'static str {
    TrustVerdict::of_repo_error(e).as_str()
}

/// verify_repo(car: bytes, key: str | None = None) -> RepoReport
///
/// Verifies a repository export: every block's CID, the commit signature (when `key`, a
/// did:key, is given), the MST structure and its rebuild from the leaves against the commit.
#[pyfunction]
#[pyo3(signature = (car, key = None))]
fn verify_repo(py: Python<'_>, car: &[u8], key: Option<&str>) -> PyResult<RepoReport> {
    let key = key
        .map(|k| {
            PublicKey::from_did_key(k).map_err(|e| PyValueError::new_err(format!("key {k}: {e}")))
        })
        .transpose()?;
    let result = py.detach(|| rs_verify_repo(car, key.as_ref()));
    Ok(match result {
        Ok(r) => RepoReport {
            name: "ok",
            reason: None,
            bytes: r.bytes,
            report: Some(r),
        },
        Err(e) => RepoReport {
            name: verdict(&e),
            reason: Some(e.to_string()),
            report: None,
            bytes: car.len(),
        },
    })
}

/// list_records(car: bytes) -> list[tuple[str, str]]
///
/// Every record of a repository export as (`collection/rkey`, record CID), in MST key order, as
/// `riptide repo ls` (and indigo's `goat repo ls`) list them. Raises ValueError (the CLI's verdict
/// and reason) when the CAR or its tree is not valid.
#[pyfunction]
fn list_records(py: Python<'_>, car: &[u8]) -> PyResult<Vec<(String, String)>> {
    let result = py.detach(|| {
        let mut reader = CarReader::new();
        reader
            .read(car, &CarOptions::repository())
            .map_err(RepoError::from)
            .and_then(|car| rs_list_records(&car))
    });
    match result {
        Ok(records) => Ok(records
            .into_iter()
            .map(|(k, cid)| (k, cid.to_string()))
            .collect()),
        Err(e) => Err(PyValueError::new_err(format!("{}: {e}", verdict(&e)))),
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<RepoReport>()?;
    m.add_function(wrap_pyfunction!(verify_repo, m)?)?;
    m.add_function(wrap_pyfunction!(list_records, m)?)?;
    Ok(())
}
