//! The native half of `riptide.Archive`: Jetstream v2's archive (`planSnapshot` →
//! `getSegment` / `getBlock` → rows) read by `riptide_client::archive` (`Snapshot`, `Replay`),
//! run on the clients' threads (`crate::clients::Pipeline`), and `read_segment` for a `.jss`
//! file already in memory (decoded block by block on a thread of its own).
//!
//! Why a module: an archive row is not a wire message. It becomes the dict the live v2 client
//! yields for the same event (`crate::v2::v1_event`), so that one consumer handles the archive,
//! a replay's switch to live, and the live wire alike: `did`, `time_us` (the row's display time,
//! as `subscribeEvents` sends it), `cursor` (the seq; riptide's one number per event), `kind`,
//! and the kind's object — `commit` (`rev`, `operation`, `collection`, `rkey`, and for a
//! create or update `record`, the atproto JSON form of the DAG-CBOR payload, and `cid`, computed
//! by the reader from those bytes), `identity`, `account`, `sync` (the upstream event). A
//! `create-resync` row (kind 7) is a `create`, as the live wire sends it. With
//! `record_bytes=True` a commit also carries `record_bytes`, the payload as the account signed
//! it, for a consumer that hashes or stores it. The record dicts are built under the GIL in
//! `take` (`crate::clients`); downloading, verifying the files, decoding and CID computation
//! happen on the socket thread with the GIL released.
//!
//! Errors (`crate::errors::archive_error`) end the read after the events before them; a row
//! whose payload is not DAG-CBOR is not delivered, and counted (`stats()["rows_rejected"]`).

use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pyo3::exceptions::PyValueError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use riptide_client::archive::RowDecoder;
use riptide_client::{
    ArchiveConfig, ArchiveError, ArchiveEvent, ArchiveStats, ClientConfig, ClientStats, Replay,
    ReplayEvent, Snapshot, V2Filter,
};
use riptide_segment::{Kind, Segment};

use crate::clients::{AsyncNext, ClientCore, Counters, Failure, Item, NextFuture, Pipeline};
use crate::errors::archive_error;
use crate::frame::record_to_py;
use crate::log::LogLines;
use crate::v2::{server_dictionary, v1_event};

/// An archive read's counters, published by the socket thread after every event.
#[derive(Default)]
struct Shared {
    archive: Mutex<ArchiveStats>,
    /// A replay's live side, once it started.
    live: Mutex<Option<Arc<ClientStats>>>,
}

impl Counters for Shared {
    fn to_py<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = *self.archive.lock().unwrap_or_else(|p| p.into_inner());
        let d = PyDict::new(py);
        for (k, v) in [
            ("plan_pages", s.plan_pages),
            ("segments", s.segments),
            ("blocks", s.blocks),
            ("bytes", s.bytes),
            ("events", s.events),
            ("rows_rejected", s.rows_rejected),
            ("duplicates", s.duplicates),
            ("retries", s.retries),
            ("interrupted", s.interrupted),
            ("restarts", s.restarts),
        ] {
            d.set_item(k, v)?;
        }
        let live = self.live.lock().unwrap_or_else(|p| p.into_inner()).clone();
        match live {
            Some(l) => d.set_item("live", l.to_py(py)?)?,
            None => d.set_item("live", py.None())?,
        }
        Ok(d)
    }

    fn last_error(&self) -> Option<String> {
        let live = self.live.lock().unwrap_or_else(|p| p.into_inner()).clone();
        live.and_then(|l| l.last_error())
    }
}

/// What the socket thread runs: the reader and where it publishes its counters.
struct Reader<R> {
    read: R,
    shared: Arc<Shared>,
}

struct SnapshotNext;
impl<'c> AsyncNext<'c, Reader<Snapshot>, ArchiveEvent> for SnapshotNext {
    type Fut = NextFuture<'c, ArchiveEvent>;
    fn next(&self, r: &'c mut Reader<Snapshot>) -> Self::Fut {
        Box::pin(async move {
            let e = r.read.next().await;
            *r.shared.archive.lock().unwrap_or_else(|p| p.into_inner()) = r.read.stats();
            e.map_err(Failure::Archive)
        })
    }
}

struct ReplayNext;
impl<'c> AsyncNext<'c, Reader<Replay>, ReplayEvent> for ReplayNext {
    type Fut = NextFuture<'c, ReplayEvent>;
    fn next(&self, r: &'c mut Reader<Replay>) -> Self::Fut {
        Box::pin(async move {
            let e = r.read.next().await;
            *r.shared.archive.lock().unwrap_or_else(|p| p.into_inner()) = r.read.stats();
            if r.read.is_live() {
                let mut live = r.shared.live.lock().unwrap_or_else(|p| p.into_inner());
                if live.is_none() {
                    *live = r.read.live_stats();
                }
            }
            e.map(Some).map_err(Failure::Archive)
        })
    }
}

/// The settings of a read (`riptide.Archive`'s and its method's arguments).
#[allow(clippy::too_many_arguments)]
fn archive_config(
    url: &str,
    token: Option<String>,
    kinds: Option<Vec<String>>,
    dids: Option<Vec<String>>,
    collections: Option<Vec<String>>,
    after_seq: Option<u64>,
    before_seq: Option<u64>,
    limits: Limits,
) -> PyResult<ArchiveConfig> {
    let mut cfg = ArchiveConfig::new(url);
    cfg.token = token;
    cfg.filter = V2Filter {
        kinds: kinds.unwrap_or_default(),
        dids: dids.unwrap_or_default(),
        collections: collections.unwrap_or_default(),
        max_message_size_bytes: 0,
    };
    cfg.after_seq = after_seq;
    cfg.before_seq = before_seq;
    if let Some(n) = limits.range_bytes {
        if n == 0 {
            return Err(PyValueError::new_err("range_bytes must be at least 1"));
        }
        cfg.range_bytes = n;
    }
    if let Some(n) = limits.max_segment_bytes {
        cfg.max_segment_bytes = n;
    }
    if let Some(n) = limits.max_attempts {
        if n == 0 {
            return Err(PyValueError::new_err("max_attempts must be at least 1"));
        }
        cfg.max_attempts = n;
    }
    if let Some(t) = limits.timeout {
        cfg.timeout = Duration::try_from_secs_f64(t)
            .ok()
            .filter(|d| !d.is_zero())
            .ok_or_else(|| {
                PyValueError::new_err(format!("timeout: {t} is not a positive number of seconds"))
            })?;
    }
    Ok(cfg)
}

/// `riptide.Archive`'s limits (`None`: the reader's defaults).
#[derive(Clone, Copy, Debug)]
struct Limits {
    range_bytes: Option<u64>,
    max_segment_bytes: Option<u64>,
    max_attempts: Option<u32>,
    timeout: Option<f64>,
}

/// The native half of `Archive.snapshot()`.
#[pyfunction]
#[pyo3(name = "_archive_snapshot")]
#[pyo3(signature = (url, token = None, kinds = None, dids = None, collections = None, after_seq = None, before_seq = None, record_bytes = false, range_bytes = None, max_segment_bytes = None, max_attempts = None, timeout = None))]
#[allow(clippy::too_many_arguments)]
fn archive_snapshot(
    py: Python<'_>,
    url: String,
    token: Option<String>,
    kinds: Option<Vec<String>>,
    dids: Option<Vec<String>>,
    collections: Option<Vec<String>>,
    after_seq: Option<u64>,
    before_seq: Option<u64>,
    record_bytes: bool,
    range_bytes: Option<u64>,
    max_segment_bytes: Option<u64>,
    max_attempts: Option<u32>,
    timeout: Option<f64>,
) -> PyResult<ClientCore> {
    let limits = Limits {
        range_bytes,
        max_segment_bytes,
        max_attempts,
        timeout,
    };
    let cfg = archive_config(
        &url,
        token,
        kinds,
        dids,
        collections,
        after_seq,
        before_seq,
        limits,
    )?;
    let read = Snapshot::new(cfg).map_err(|e| archive_error(py, &e, &url))?;
    let shared = Arc::new(Shared::default());
    let reader = Reader {
        read,
        shared: shared.clone(),
    };
    let process = move |events: Vec<ArchiveEvent>| {
        events
            .into_iter()
            .map(|event| Item::Archive {
                event: Box::new(event),
                record_bytes,
            })
            .collect()
    };
    Ok(ClientCore::new(Pipeline::start(
        url,
        reader,
        shared,
        LogLines::default(),
        SnapshotNext,
        process,
    )?))
}

/// The native half of `Archive.replay()`.
#[pyfunction]
#[pyo3(name = "_archive_replay")]
#[pyo3(signature = (url, token = None, kinds = None, dids = None, collections = None, after_seq = None, record_bytes = false, compress = false, zstd_dictionary = None, range_bytes = None, max_segment_bytes = None, max_attempts = None, timeout = None))]
#[allow(clippy::too_many_arguments)]
fn archive_replay(
    py: Python<'_>,
    url: String,
    token: Option<String>,
    kinds: Option<Vec<String>>,
    dids: Option<Vec<String>>,
    collections: Option<Vec<String>>,
    after_seq: Option<u64>,
    record_bytes: bool,
    compress: bool,
    zstd_dictionary: Option<Vec<u8>>,
    range_bytes: Option<u64>,
    max_segment_bytes: Option<u64>,
    max_attempts: Option<u32>,
    timeout: Option<f64>,
) -> PyResult<ClientCore> {
    let limits = Limits {
        range_bytes,
        max_segment_bytes,
        max_attempts,
        timeout,
    };
    let cfg = archive_config(
        &url,
        token,
        kinds,
        dids,
        collections,
        after_seq,
        None,
        limits,
    )?;
    let log = LogLines::default();
    let dictionary = match zstd_dictionary {
        Some(d) => Some(d),
        None if compress => server_dictionary(py, &url, &log)?,
        None => None,
    };
    // The live side: no host (the archive's server), its cursor set at the switch; permanent
    // failures end it, as for `riptide.Jetstream`.
    let live = ClientConfig {
        give_up_on_permanent: true,
        ..ClientConfig::default()
    };
    let read = Replay::new(cfg, live, dictionary).map_err(|e| archive_error(py, &e, &url))?;
    let shared = Arc::new(Shared::default());
    let reader = Reader {
        read,
        shared: shared.clone(),
    };
    let process = move |events: Vec<ReplayEvent>| {
        events
            .into_iter()
            .map(|e| match e {
                ReplayEvent::Archive(event) => Item::Archive {
                    event: Box::new(event),
                    record_bytes,
                },
                ReplayEvent::Live(m) => Item::Event(v1_event(m.payload)),
            })
            .collect()
    };
    Ok(ClientCore::new(Pipeline::start(
        url, reader, shared, log, ReplayNext, process,
    )?))
}

/// An archive row as the dict the live v2 client yields for the same event (module docs).
pub(crate) fn event_to_py<'py>(
    py: Python<'py>,
    e: &ArchiveEvent,
    record_bytes: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let r = &e.row;
    // The keys and the fixed values are interned: made once, their hashes cached.
    let (kind, op) = match r.kind {
        Kind::Create | Kind::CreateResync => (intern!(py, "commit"), Some(intern!(py, "create"))),
        Kind::Update => (intern!(py, "commit"), Some(intern!(py, "update"))),
        Kind::Delete => (intern!(py, "commit"), Some(intern!(py, "delete"))),
        Kind::Identity => (intern!(py, "identity"), None),
        Kind::Account => (intern!(py, "account"), None),
        Kind::Sync => (intern!(py, "sync"), None),
    };
    let d = PyDict::new(py);
    d.set_item(intern!(py, "did"), &r.did)?;
    d.set_item(intern!(py, "time_us"), r.as_row().display_time_us())?;
    d.set_item(intern!(py, "cursor"), r.seq)?;
    d.set_item(intern!(py, "kind"), kind)?;
    // The reader delivers only rows whose payload decoded as DAG-CBOR (deletes have none).
    let payload = || record_to_py(py, &r.payload, 0..r.payload.len());
    match op {
        Some(op) => {
            let c = PyDict::new(py);
            c.set_item(intern!(py, "rev"), &r.rev)?;
            c.set_item(intern!(py, "operation"), op)?;
            c.set_item(intern!(py, "collection"), &r.collection)?;
            c.set_item(intern!(py, "rkey"), &r.rkey)?;
            if let Some(cid) = &e.cid {
                c.set_item(intern!(py, "record"), payload()?)?;
                c.set_item(intern!(py, "cid"), cid.to_string())?;
                if record_bytes {
                    c.set_item(intern!(py, "record_bytes"), PyBytes::new(py, &r.payload))?;
                }
            }
            d.set_item(kind, c)?;
        }
        None => d.set_item(kind, payload()?)?,
    }
    Ok(d)
}

/// Blocks decoded ahead of the Python consumer by `read_segment`'s thread.
const SEGMENT_AHEAD: usize = 2;

/// One block's events, or what ended the file.
type Block = Result<Vec<ArchiveEvent>, ArchiveError>;

/// `riptide.read_segment(data)`: an iterator of every row of a whole `.jss` file as event dicts,
/// the file verified (header, footer, checksums, every block), each payload checked to be
/// DAG-CBOR and each record's CID computed. A thread (the GIL released) opens the file once and
/// decodes it block by block, at most [`SEGMENT_AHEAD`] blocks ahead of the consumer, which
/// builds each event's dict as it asks for it: memory stays bounded by a few blocks' rows
/// however large the file, and decoding overlaps with the Python side. A file or block that does
/// not verify, or a row whose payload is not DAG-CBOR, raises `CorruptArchiveError` when
/// iteration reaches it (a file whose header or footer is wrong: before the first event).
#[pyclass(module = "riptide", name = "SegmentEvents")]
pub struct SegmentEvents {
    rx: Mutex<Option<Receiver<Block>>>,
    ready: Mutex<std::vec::IntoIter<ArchiveEvent>>,
    record_bytes: bool,
}

impl std::fmt::Debug for SegmentEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SegmentEvents").finish_non_exhaustive()
    }
}

/// What `read_segment`'s thread runs: every block's rows, in order, sent as they are decoded.
fn decode_blocks(data: &[u8], tx: &SyncSender<Block>) {
    let seg = match Segment::open(data) {
        Ok(s) => s,
        Err(e) => {
            let _ = tx.send(Err(ArchiveError::Corrupt(format!("segment: {e}"))));
            return;
        }
    };
    let mut dec = RowDecoder::new();
    for i in 0..seg.blocks().len() {
        let mut out = Vec::new();
        let r = dec.decode_segment_block(&seg, i, &mut out).and_then(|()| {
            if dec.rejected == 0 {
                return Ok(out);
            }
            Err(ArchiveError::Corrupt(format!(
                "segment block {i}: {} rows whose payload is not DAG-CBOR",
                dec.rejected
            )))
        });
        let failed = r.is_err();
        // The consumer gone (the iterator dropped): stop.
        if tx.send(r).is_err() || failed {
            return;
        }
    }
}

#[pymethods]
impl SegmentEvents {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        loop {
            let next = self.ready.lock().unwrap_or_else(|p| p.into_inner()).next();
            if let Some(e) = next {
                return event_to_py(py, &e, self.record_bytes).map(Some);
            }
            let got = py.detach(|| {
                let rx = self.rx.lock().unwrap_or_else(|p| p.into_inner());
                rx.as_ref().map(|rx| rx.recv())
            });
            match got {
                Some(Ok(Ok(events))) => {
                    *self.ready.lock().unwrap_or_else(|p| p.into_inner()) = events.into_iter()
                }
                Some(Ok(Err(e))) => {
                    self.rx.lock().unwrap_or_else(|p| p.into_inner()).take();
                    return Err(archive_error(py, &e, "read_segment"));
                }
                // The thread is done (every block sent), or an error was raised already.
                Some(Err(_)) | None => return Ok(None),
            }
        }
    }
}

#[pyfunction]
#[pyo3(signature = (data, record_bytes = false))]
fn read_segment(data: &[u8], record_bytes: bool) -> PyResult<SegmentEvents> {
    // A copy the thread owns (a memcpy: the bytes object stays the caller's).
    let data = data.to_vec();
    let (tx, rx) = sync_channel(SEGMENT_AHEAD);
    std::thread::Builder::new()
        .name("riptide-segment".into())
        .spawn(move || decode_blocks(&data, &tx))
        .map_err(|e| pyo3::exceptions::PyRuntimeError::new_err(format!("thread: {e}")))?;
    Ok(SegmentEvents {
        rx: Mutex::new(Some(rx)),
        ready: Mutex::new(Vec::new().into_iter()),
        record_bytes,
    })
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(archive_snapshot, m)?)?;
    m.add_function(wrap_pyfunction!(archive_replay, m)?)?;
    m.add_class::<SegmentEvents>()?;
    m.add_function(wrap_pyfunction!(read_segment, m)?)?;
    Ok(())
}
