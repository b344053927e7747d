//! `riptide._riptide`: the native half of the `riptide` Python package.
//!
//! Why it exists: Python consumers of the firehose (bots, feed generators, labelers, research
//! pipelines) are CPU-bound on decoding, and no Python package verifies commits. This module gives
//! them riptide's decoder, verifier, repository verification and clients, running the same code
//! paths as the `riptide` CLI (`decode`, `verify`, `repo`, `tail`) so that names and messages are
//! the CLI's: a verdict's `name` is `riptide verify --json`'s `verdict`, an exception's text is the
//! message the CLI prints.
//!
//! The Python package (`python/riptide/`) re-exports this module and adds what is easier in Python:
//! the iterator and `async for` protocols of the clients, and `did_docs` given as a dict.
//!
//! Threads and the GIL: every call that decodes or verifies more than a few bytes releases the GIL
//! (`Python::detach`); the clients run their socket, decoding and verification on Rust threads and
//! hand Python whole batches. Bad input raises a Python exception; nothing here panics on input
//! (and PyO3 turns a panic into `pyo3_runtime.PanicException` rather than aborting).

mod archive;
mod batch;
mod clients;
mod errors;
mod frame;
mod keys;
mod log;
mod repo;
mod topy;
mod v2;
mod verify;

use pyo3::prelude::*;

#[pymodule]
fn _riptide(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    errors::register(m)?;
    frame::register(m)?;
    batch::register(m)?;
    verify::register(m)?;
    repo::register(m)?;
    clients::register(m)?;
    v2::register(m)?;
    archive::register(m)?;
    Ok(())
}
