//! `decode_frame`, `read_corpus` and the `Frame` / `RepoOp` classes.
//!
//! A decoded [`riptide_firehose::Frame`] borrows its bytes and its decoder, so it cannot cross into
//! Python as is. [`FrameData`] is its owned summary: the frame bytes (a reference-counted
//! `Bytes`, shared, not copied, when it came from a socket), the payload fields as Python will read
//! them, and for each op the byte range of its record block inside the frame. The record itself
//! is turned into a dict only when `RepoOp.record` is first read (then cached): a consumer that
//! looks at one collection pays nothing for the others.
//!
//! The frame is decoded exactly as `riptide decode` decodes it (strict, every block's SHA-256
//! checked against its CID unless `verify_cids=False`, every block decoded as DAG-CBOR), with the
//! GIL released.

use std::cell::RefCell;

use bytes::Bytes;
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::types::{PyBytes, PyList};
use riptide_cbor::{Arena, CidBuf, Options};
use riptide_firehose::corpus::split_frames;
use riptide_firehose::verify::peek;
use riptide_firehose::{Action, Body, DecodeOptions, Frame as RsFrame, FrameDecoder, FrameError};

use crate::errors;
use crate::topy::value_to_py;
use crate::verify::Verdict;

/// One op, owned.
#[derive(Clone, Debug)]
pub struct OpData {
    action: &'static str,
    path: Text,
    // CIDs are kept binary (inline, no heap) and rendered as text only when Python asks.
    cid: Option<CidBuf>,
    prev: Option<CidBuf>,
    /// The record block's byte range in the frame (create, update), if it is in the CAR.
    record: Option<(usize, usize)>,
}

/// A text field of a frame, kept as where it is in the frame's bytes: the decoder borrows every
/// string from them, so a frame's DID, revision, time and op paths cost no allocation on the
/// decoding thread and no free on Python's. A string found elsewhere (none is, today) is owned.
#[derive(Clone, Debug)]
pub enum Text {
    At(u32, u32),
    Owned(Box<str>),
}

impl Text {
    /// `s`, which the decoder of `bytes` returned.
    fn of(bytes: &[u8], s: &str) -> Text {
        let at = riptide_firehose::verify::range_within(bytes, s.as_bytes())
            .and_then(|r| Some((u32::try_from(r.start).ok()?, u32::try_from(r.len()).ok()?)));
        match at {
            Some((at, len)) => Text::At(at, len),
            None => Text::Owned(s.into()),
        }
    }

    /// The text, from the frame's bytes (checked UTF-8: it was text when decoded).
    fn get<'a>(&'a self, bytes: &'a [u8]) -> &'a str {
        match self {
            Text::At(at, len) => {
                let (at, len) = (*at as usize, *len as usize);
                bytes
                    .get(at..at + len)
                    .and_then(|b| std::str::from_utf8(b).ok())
                    .unwrap_or_default()
            }
            Text::Owned(s) => s,
        }
    }
}

/// The bytes of a frame: the socket's buffer (a client's frames) or the caller's `bytes` object
/// (`decode_frame`, `decode_frames`: kept, not copied; readable without the GIL, so a decoding
/// thread reads it in place).
#[derive(Debug)]
pub enum Buf {
    Rust(Bytes),
    Py(PyBackedBytes),
}

impl Buf {
    fn slice(&self) -> &[u8] {
        match self {
            Buf::Rust(b) => b,
            Buf::Py(b) => b,
        }
    }

    fn clone_ref(&self, py: Python<'_>) -> Buf {
        match self {
            Buf::Rust(b) => Buf::Rust(b.clone()),
            Buf::Py(b) => Buf::Py(b.clone_ref(py)),
        }
    }

    /// A stand-in until the real buffer is attached ([`FrameData::of`]); allocates nothing.
    pub fn none() -> Buf {
        Buf::Rust(Bytes::new())
    }
}

/// A decoded frame, owned: what crosses from a Rust thread to Python.
#[derive(Debug)]
pub struct FrameData {
    pub bytes: Buf,
    pub kind: &'static str,
    pub seq: Option<i64>,
    // Text fields are where they are in `bytes` (no allocation per field): see [`Text`].
    did: Option<Text>,
    rev: Option<Text>,
    since: Option<Text>,
    time: Option<Text>,
    commit: Option<CidBuf>,
    prev_data: Option<CidBuf>,
    blocks: usize,
    handle: Option<Text>,
    active: Option<bool>,
    status: Option<Text>,
    name: Option<Text>,
    message: Option<Text>,
    ops: Vec<OpData>,
    /// The frame error, for a frame a client received that does not decode.
    error: Option<(&'static str, String, usize)>,
    /// The verdict, for frames a verifying client checked.
    pub verdict: Option<Verdict>,
}

impl FrameData {
    /// The owned summary of a decoded frame, holding `buf`, the frame's bytes.
    pub fn new(buf: Buf, frame: &RsFrame<'_>) -> FrameData {
        let mut d = FrameData::of(frame);
        d.bytes = buf;
        d
    }

    /// The owned summary of a decoded frame, its buffer still to be attached (`bytes`, a
    /// stand-in until then): for frames decoded in a batch, whose buffers are borrowed until the
    /// batch ends.
    pub fn of(frame: &RsFrame<'_>) -> FrameData {
        let bytes = frame.bytes();
        let base = bytes.as_ptr() as usize;
        let text = |s: &str| Text::of(bytes, s);
        let some = |s: &str| Some(Text::of(bytes, s));
        let mut d = FrameData::empty(Buf::none(), frame.body().kind());
        d.seq = frame.body().seq();
        d.did = frame.body().did().map(text);
        d.blocks = frame.block_count();
        match frame.body() {
            Body::Commit(c) => {
                d.rev = some(c.rev);
                d.since = c.since.map(text);
                d.time = some(c.time);
                d.commit = Some(c.commit.to_buf());
                d.prev_data = c.prev_data.map(|c| c.to_buf());
                d.ops = c
                    .ops()
                    .map(|op| OpData {
                        action: op.action.as_str(),
                        path: Text::of(bytes, op.path),
                        cid: op.cid.map(|c| c.to_buf()),
                        prev: op.prev.map(|c| c.to_buf()),
                        record: match op.action {
                            Action::Delete => None,
                            _ => op
                                .cid
                                .and_then(|cid| frame.block_bytes(cid))
                                .map(|b| (b.as_ptr() as usize - base, b.len())),
                        },
                    })
                    .collect();
            }
            Body::Sync(s) => {
                d.rev = some(s.rev);
                d.time = some(s.time);
            }
            Body::Identity(i) => {
                d.time = some(i.time);
                d.handle = i.handle.map(text);
            }
            Body::Account(a) => {
                d.time = some(a.time);
                d.active = Some(a.active);
                d.status = a.status.map(text);
            }
            Body::Info(i) => {
                d.name = some(i.name);
                d.message = i.message.map(text);
            }
            Body::Error(e) => {
                d.name = some(e.error);
                d.message = e.message.map(text);
            }
            Body::Unknown { .. } => {}
        }
        d
    }

    /// A frame that does not decode: kind `invalid`, its seq and DID as far as they can be read.
    pub fn invalid(bytes: Bytes, arena: &mut Arena, e: &FrameError) -> FrameData {
        let mut d = FrameData::invalid_of(&bytes, arena, e);
        d.bytes = Buf::Rust(bytes);
        d
    }

    /// [`FrameData::invalid`], its buffer still to be attached (as [`FrameData::of`]).
    pub fn invalid_of(bytes: &[u8], arena: &mut Arena, e: &FrameError) -> FrameData {
        // Kind `invalid` (as documented), with the seq and DID as far as they can be read.
        let p = peek(arena, bytes);
        let (seq, did) = (p.seq, p.did.map(|d| Text::of(bytes, d)));
        let mut d = FrameData::empty(Buf::none(), "invalid");
        d.seq = seq;
        d.did = did;
        d.error = Some((e.class(), e.to_string(), e.offset()));
        d
    }

    /// A text field's text.
    fn text<'a>(&'a self, field: &'a Option<Text>) -> Option<&'a str> {
        field.as_ref().map(|t| t.get(self.bytes.slice()))
    }

    /// Why the frame does not decode: (class, message, offset).
    pub fn error(&self) -> Option<&(&'static str, String, usize)> {
        self.error.as_ref()
    }

    fn empty(bytes: Buf, kind: &'static str) -> FrameData {
        FrameData {
            bytes,
            kind,
            seq: None,
            did: None,
            rev: None,
            since: None,
            time: None,
            commit: None,
            prev_data: None,
            blocks: 0,
            handle: None,
            active: None,
            status: None,
            name: None,
            message: None,
            ops: Vec::new(),
            error: None,
            verdict: None,
        }
    }
}

/// A decoded firehose frame (`com.atproto.sync.subscribeRepos` message).
#[pyclass(module = "riptide", name = "Frame")]
#[derive(Debug)]
pub struct Frame {
    data: FrameData,
    /// `.ops`, once built (the ops then move out of `data`).
    ops: Option<Py<PyList>>,
    n_ops: usize,
}

impl Frame {
    pub fn new(data: FrameData) -> Frame {
        let n_ops = data.ops.len();
        Frame {
            data,
            ops: None,
            n_ops,
        }
    }
}

#[pymethods]
impl Frame {
    /// `commit`, `sync`, `identity`, `account`, `info`, `error`, `unknown`; `invalid` for a
    /// frame that does not decode, from a client or `decode_frames(on_error="yield")` (see
    /// `error`).
    #[getter]
    fn kind(&self) -> &'static str {
        self.data.kind
    }
    /// The relay sequence number (commit, sync, identity, account).
    #[getter]
    fn seq(&self) -> Option<i64> {
        self.data.seq
    }
    /// The account DID (`repo` of a commit).
    #[getter]
    fn did(&self) -> Option<&str> {
        self.data.text(&self.data.did)
    }
    /// The commit's revision (commit, sync).
    #[getter]
    fn rev(&self) -> Option<&str> {
        self.data.text(&self.data.rev)
    }
    /// The revision a commit follows.
    #[getter]
    fn since(&self) -> Option<&str> {
        self.data.text(&self.data.since)
    }
    /// When the relay saw the event (RFC 3339).
    #[getter]
    fn time(&self) -> Option<&str> {
        self.data.text(&self.data.time)
    }
    /// The signed commit's CID (commit).
    #[getter]
    fn commit(&self) -> Option<String> {
        self.data.commit.map(|c| c.to_string())
    }
    /// The MST root before the commit (Sync 1.1).
    #[getter]
    fn prev_data(&self) -> Option<String> {
        self.data.prev_data.map(|c| c.to_string())
    }
    /// Number of blocks in the embedded CAR.
    #[getter]
    fn blocks(&self) -> usize {
        self.data.blocks
    }
    /// The handle of an `#identity` event, if it carries one.
    #[getter]
    fn handle(&self) -> Option<&str> {
        self.data.text(&self.data.handle)
    }
    /// Whether the account is active (`#account`).
    #[getter]
    fn active(&self) -> Option<bool> {
        self.data.active
    }
    /// Why not (`#account`), when given.
    #[getter]
    fn status(&self) -> Option<&str> {
        self.data.text(&self.data.status)
    }
    /// The name of an `#info` message or error frame (`OutdatedCursor`, `FutureCursor`, …).
    #[getter]
    fn name(&self) -> Option<&str> {
        self.data.text(&self.data.name)
    }
    /// The message of an `#info` or error frame.
    #[getter]
    fn message(&self) -> Option<&str> {
        self.data.text(&self.data.message)
    }
    /// Why the frame does not decode (kind `invalid`), as `riptide decode` says it.
    #[getter]
    fn error(&self) -> Option<&str> {
        self.data.error.as_ref().map(|e| e.1.as_str())
    }
    /// The verdict, for frames of a verifying `Firehose`.
    #[getter]
    fn verdict(&self) -> Option<Verdict> {
        self.data.verdict.clone()
    }
    /// The frame bytes as received.
    #[getter]
    fn bytes<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        match &self.data.bytes {
            Buf::Py(b) => b.into_pyobject(py).unwrap_or_else(|e| match e {}),
            Buf::Rust(b) => PyBytes::new(py, b),
        }
    }
    /// The ops of a commit (empty for other kinds).
    #[getter]
    fn ops(&mut self, py: Python<'_>) -> PyResult<Py<PyList>> {
        if let Some(ops) = &self.ops {
            return Ok(ops.clone_ref(py));
        }
        let list = PyList::empty(py);
        for op in std::mem::take(&mut self.data.ops) {
            list.append(RepoOp {
                bytes: self.data.bytes.clone_ref(py),
                op,
                record: None,
            })?;
        }
        let list = list.unbind();
        self.ops = Some(list.clone_ref(py));
        Ok(list)
    }
    fn __repr__(&self) -> String {
        format!(
            "Frame(kind={:?}, seq={}, did={}, ops={})",
            self.data.kind,
            self.data.seq.map_or("None".into(), |s| s.to_string()),
            self.data
                .text(&self.data.did)
                .map_or("None".into(), |d| format!("{d:?}")),
            self.n_ops
        )
    }
}

/// One op of a commit.
#[pyclass(module = "riptide", name = "RepoOp")]
#[derive(Debug)]
pub struct RepoOp {
    bytes: Buf,
    op: OpData,
    record: Option<Py<PyAny>>,
}

#[pymethods]
impl RepoOp {
    /// `create`, `update` or `delete`.
    #[getter]
    fn action(&self) -> &'static str {
        self.op.action
    }
    /// `collection/rkey`.
    #[getter]
    fn path(&self) -> &str {
        self.op.path.get(self.bytes.slice())
    }
    /// The collection NSID.
    #[getter]
    fn collection(&self) -> &str {
        let path = self.path();
        path.split_once('/').map_or(path, |(c, _)| c)
    }
    /// The record key.
    #[getter]
    fn rkey(&self) -> &str {
        self.path().split_once('/').map_or("", |(_, r)| r)
    }
    /// The new record's CID (create, update); None for delete.
    #[getter]
    fn cid(&self) -> Option<String> {
        self.op.cid.map(|c| c.to_string())
    }
    /// The previous record's CID (update, delete; Sync 1.1).
    #[getter]
    fn prev(&self) -> Option<String> {
        self.op.prev.map(|c| c.to_string())
    }
    /// The record as a dict in atproto JSON form (`$link`, `$bytes`), built on first access;
    /// None for a delete, or when the record block is not in the frame's CAR (as in
    /// `riptide decode --json`).
    #[getter]
    fn record(&mut self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        if let Some(r) = &self.record {
            return Ok(r.clone_ref(py));
        }
        let Some((start, len)) = self.op.record else {
            return Ok(py.None());
        };
        let obj = record_to_py(py, self.bytes.slice(), start..start + len)?.unbind();
        self.record = Some(obj.clone_ref(py));
        Ok(obj)
    }
    fn __repr__(&self) -> String {
        format!(
            "RepoOp(action={:?}, path={:?}, cid={})",
            self.op.action,
            self.path(),
            self.op
                .cid
                .map_or("None".into(), |c| format!("{:?}", c.to_string()))
        )
    }
}

thread_local! {
    static RECORD_ARENA: RefCell<Arena> = RefCell::new(Arena::new());
    static DECODER: RefCell<FrameDecoder> = RefCell::new(FrameDecoder::new());
    static DECODER_UNVERIFIED: RefCell<FrameDecoder> =
        RefCell::new(FrameDecoder::with_options(DecodeOptions::unverified()));
}

/// Decodes one record block (already checked when the frame was decoded) into Python objects.
pub(crate) fn record_to_py<'py>(
    py: Python<'py>,
    bytes: &[u8],
    range: std::ops::Range<usize>,
) -> PyResult<Bound<'py, PyAny>> {
    RECORD_ARENA.with(|arena| {
        let mut arena = arena.borrow_mut();
        let mut tape = arena.tape(bytes);
        let start = range.start;
        let item = tape.decode(range, &Options::strict()).map_err(|e| {
            errors::decode_error(
                py,
                "malformed",
                format!("record block: {e}"),
                e.offset().max(start),
            )
        })?;
        let doc = tape.finish();
        value_to_py(py, doc.value(item))
    })
}

/// Decodes the frame in `buf` on this thread's decoder: the owned summary (holding `buf`), or the
/// frame error.
fn decode_owned(buf: Buf, verify_cids: bool) -> Result<FrameData, FrameError> {
    let run = |dec: &RefCell<FrameDecoder>| {
        let mut dec = dec.borrow_mut();
        dec.decode(buf.slice()).map(|f| FrameData::of(&f))
    };
    let mut d = if verify_cids {
        DECODER.with(run)
    } else {
        DECODER_UNVERIFIED.with(run)
    }?;
    d.bytes = buf;
    Ok(d)
}

/// decode_frame(data, verify_cids=True) -> Frame
///
/// Decodes one firehose frame: header, payload, the embedded CAR with every block's SHA-256
/// checked against its CID (unless verify_cids=False), every block decoded as strict DAG-CBOR.
/// Raises a DecodeError subclass (with .offset) when the frame does not decode.
#[pyfunction]
#[pyo3(signature = (data, verify_cids = true))]
fn decode_frame(py: Python<'_>, data: &Bound<'_, PyBytes>, verify_cids: bool) -> PyResult<Frame> {
    // The frame keeps the caller's (immutable) bytes object alive instead of copying it.
    let buf = PyBackedBytes::from(data.clone());
    let result = py.detach(move || decode_owned(Buf::Py(buf), verify_cids));
    match result {
        Ok(d) => Ok(Frame::new(d)),
        Err(e) => Err(errors::frame_error(py, &e)),
    }
}

/// Splits a corpus file's bytes into frames (the native half of `read_corpus`).
#[pyfunction]
fn split_corpus<'py>(py: Python<'py>, data: &[u8]) -> PyResult<Bound<'py, PyList>> {
    let frames = split_frames(data).map_err(|e| errors::corpus_error(py, &e))?;
    let list = PyList::empty(py);
    for f in frames {
        list.append(PyBytes::new(py, f.bytes))?;
    }
    Ok(list)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Frame>()?;
    m.add_class::<RepoOp>()?;
    m.add_function(wrap_pyfunction!(decode_frame, m)?)?;
    m.add_function(wrap_pyfunction!(split_corpus, m)?)?;
    Ok(())
}
