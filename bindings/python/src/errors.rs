//! The exceptions: `DecodeError` and its subclasses, one per class of frame error
//! (`FrameError::class`, the names `riptide decode` counts), each with the byte offset;
//! `CorpusError` for a corpus file that does not follow the format; and the clients'
//! `ConnectError` family ([`connect_error`]), which is defined in Python (`riptide/_errors.py`:
//! `InvalidUrlError` is a `ValueError` too, and a Python class can have two bases).
//!
//! The message is the CLI's (`FrameError`'s `Display`, which ends with the frame byte), so a
//! Python user and a CLI user read the same words.

use pyo3::create_exception;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use riptide_client::{ArchiveError, ClientError};
use riptide_firehose::corpus::CorpusError as CorpusFormatError;
use riptide_firehose::FrameError;

create_exception!(
    riptide,
    DecodeError,
    PyValueError,
    "A frame that does not decode. `.offset`: byte offset in the frame; `.name`: the class \
     (`truncated`, `malformed`, `limits`, `bad-block-cid`)."
);
create_exception!(
    riptide,
    TruncatedError,
    DecodeError,
    "The frame ends early."
);
create_exception!(
    riptide,
    MalformedError,
    DecodeError,
    "The frame is not what the protocol defines."
);
create_exception!(
    riptide,
    LimitsError,
    DecodeError,
    "The frame is over a limit (size, block count, nesting)."
);
create_exception!(
    riptide,
    BadBlockCidError,
    DecodeError,
    "A CAR block's bytes do not hash to its CID."
);
create_exception!(
    riptide,
    CorpusError,
    PyValueError,
    "A corpus file that does not follow the format. `.index`: the frame; `.offset`: byte offset in the file."
);

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("DecodeError", py.get_type::<DecodeError>())?;
    m.add("TruncatedError", py.get_type::<TruncatedError>())?;
    m.add("MalformedError", py.get_type::<MalformedError>())?;
    m.add("LimitsError", py.get_type::<LimitsError>())?;
    m.add("BadBlockCidError", py.get_type::<BadBlockCidError>())?;
    m.add("CorpusError", py.get_type::<CorpusError>())?;
    Ok(())
}

/// A decoding error of class `class` with this message and offset, as a Python exception.
pub fn decode_error(py: Python<'_>, class: &str, message: String, offset: usize) -> PyErr {
    let err = match class {
        "truncated" => TruncatedError::new_err(message),
        "limits" => LimitsError::new_err(message),
        "bad-block-cid" => BadBlockCidError::new_err(message),
        _ => MalformedError::new_err(message),
    };
    let value = err.value(py);
    // Setting attributes on a fresh exception instance cannot fail but for memory exhaustion;
    // the exception is raised either way.
    let _ = value.setattr("offset", offset);
    let _ = value.setattr("name", class);
    err
}

/// A frame error as a Python exception (`FrameError`'s message, the CLI's).
pub fn frame_error(py: Python<'_>, e: &FrameError) -> PyErr {
    decode_error(py, e.class(), e.to_string(), e.offset())
}

/// A corpus error as a Python exception.
pub fn corpus_error(py: Python<'_>, e: &CorpusFormatError) -> PyErr {
    let err = CorpusError::new_err(e.to_string());
    let value = err.value(py);
    let _ = value.setattr("index", e.index);
    let _ = value.setattr("offset", e.offset);
    err
}

/// A refusal as `RefusedError`, or the subclass its reason names: `UnauthorizedError` for a 401
/// or `AuthRequired` (a missing or wrong bearer token), `CursorTooOldError` for `CursorTooOld`
/// (the cursor is below the live floor: read the archive first).
fn refused<'py>(
    m: &Bound<'py, PyModule>,
    text: String,
    status: u16,
    error: &str,
    message: &str,
) -> PyResult<Bound<'py, PyAny>> {
    let class = if error == "CursorTooOld" {
        "CursorTooOldError"
    } else if status == 401 || error == "AuthRequired" {
        "UnauthorizedError"
    } else {
        "RefusedError"
    };
    let v = m.getattr(class)?.call1((text,))?;
    v.setattr("status", status)?;
    v.setattr("error", error)?;
    v.setattr("message", message)?;
    Ok(v)
}

/// An archive read's error (`riptide.Archive`) as the Python exception of its class, in the
/// `ConnectError` family: `InvalidUrlError`; a refusal as for the live clients (`RefusedError`,
/// `UnauthorizedError`, `CursorTooOldError`); `UnavailableError` (`.what`, `.attempts`,
/// `.last`) when transient failures went on for every attempt; `StalledPlannerError`
/// (`.after_seq`, `.planned`, `.tip`) for a `planSnapshot` that stopped advancing;
/// `TooLargeError` (`.what`, `.bytes`, `.limit`); `CorruptArchiveError` for a file, block or
/// plan that does not verify; a request that cannot be asked is a `ValueError`. The live half of
/// a replay fails as the live clients do ([`connect_error`]). `at` (the URL) starts the message.
pub fn archive_error(py: Python<'_>, e: &ArchiveError, at: &str) -> PyErr {
    build_archive_error(py, e, at).unwrap_or_else(|err| err)
}

fn build_archive_error(py: Python<'_>, e: &ArchiveError, at: &str) -> PyResult<PyErr> {
    let m = py.import("riptide._errors")?;
    let make = |class: &str| m.getattr(class)?.call1((format!("{at}: {e}"),));
    let value = match e {
        ArchiveError::Live(c) => return Ok(connect_error(py, c, at)),
        ArchiveError::InvalidRequest(_) => return Ok(PyValueError::new_err(e.to_string())),
        ArchiveError::InvalidUrl(url) => {
            let v = m.getattr("InvalidUrlError")?.call1((e.to_string(),))?;
            v.setattr("url", url)?;
            v
        }
        ArchiveError::Refused {
            status,
            error,
            message,
        } => refused(&m, format!("{at}: {e}"), *status, error, message)?,
        ArchiveError::Unavailable {
            what,
            attempts,
            last,
        } => {
            let v = make("UnavailableError")?;
            v.setattr("url", at)?;
            v.setattr("reason", last)?;
            v.setattr("what", what)?;
            v.setattr("attempts", attempts)?;
            v.setattr("last", last)?;
            v
        }
        ArchiveError::Stalled {
            after,
            planned,
            tip,
        } => {
            let v = make("StalledPlannerError")?;
            v.setattr("after_seq", after)?;
            v.setattr("planned", planned)?;
            v.setattr("tip", tip)?;
            v
        }
        ArchiveError::TooLarge { what, bytes, limit } => {
            let v = make("TooLargeError")?;
            v.setattr("what", what)?;
            v.setattr("bytes", bytes)?;
            v.setattr("limit", limit)?;
            v
        }
        _ => make("CorruptArchiveError")?,
    };
    Ok(PyErr::from_value(value))
}

/// A client's error as the Python exception of its class (`riptide._errors`), mirroring
/// `riptide-client`'s split: `InvalidUrlError`, `RefusedError` (`.status`, `.error`, `.message`:
/// the server's reason), `UnknownHostError` (`.url`, `.reason`) and `RelayError` (`.name`,
/// `.message`: `FutureCursor`) are `PermanentConnectError`s; `Unreachable` (a one-shot request
/// that may succeed later) is the base `ConnectError`; settings that cannot work (a dictionary
/// that is not one) are `ValueError`. `at` (the URL asked) starts the message when the error does
/// not name it.
pub fn connect_error(py: Python<'_>, e: &ClientError, at: &str) -> PyErr {
    build_connect_error(py, e, at).unwrap_or_else(|err| err)
}

fn build_connect_error(py: Python<'_>, e: &ClientError, at: &str) -> PyResult<PyErr> {
    let m = py.import("riptide._errors")?;
    let make = |class: &str, text: String| m.getattr(class)?.call1((text,));
    let named = || format!("{at}: {e}");
    let value = match e {
        ClientError::InvalidUrl(url) => {
            let v = make("InvalidUrlError", e.to_string())?;
            v.setattr("url", url)?;
            v
        }
        ClientError::Refused {
            status,
            error,
            message,
        } => refused(&m, named(), *status, error, message)?,
        ClientError::UnknownHost { url, reason } => {
            let v = make("UnknownHostError", e.to_string())?;
            v.setattr("url", url)?;
            v.setattr("reason", reason)?;
            v
        }
        ClientError::Relay { name, message } => {
            let v = make("RelayError", named())?;
            v.setattr("name", name)?;
            v.setattr("message", message)?;
            v
        }
        ClientError::Unreachable { url, reason } => {
            let v = make("ConnectError", e.to_string())?;
            v.setattr("url", url)?;
            v.setattr("reason", reason)?;
            v
        }
        ClientError::NoHosts | ClientError::Dictionary(_) | ClientError::Cursor(_) => {
            return Ok(PyValueError::new_err(e.to_string()))
        }
        _ => make("PermanentConnectError", named())?,
    };
    Ok(PyErr::from_value(value))
}
