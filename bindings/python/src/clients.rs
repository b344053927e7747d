//! The native halves of `riptide.Firehose` and `riptide.Jetstream` (v1, and v2 through
//! `crate::v2`): a `riptide-client` stream run on Rust threads, handing Python whole batches.
//!
//! Per client, two threads:
//! - the socket thread runs the client (`FirehoseClient` / `JetstreamClient`: reconnection with
//!   backoff and host rotation, resuming after the last event received) on a current-thread tokio
//!   runtime and passes every event to
//! - the worker thread, which decodes (and, for a verifying `Firehose`, verifies) or parses
//!   (Jetstream JSON) whatever events have arrived, up to [`BATCH`] at a time, and queues the
//!   batch for Python. Verification (a signature check per commit: the bottleneck) is split by
//!   account over `threads` shards, one `riptide_firehose::verify::Verifier` each: an account's
//!   frames always go to the shard its DID hashes to, so each account's frames are verified in
//!   order by the same verifier, as the verifier's per-account state needs. A batch of at least
//!   [`PARALLEL_MIN`] frames runs its shards on scoped threads; the batch keeps stream order.
//!
//! Python takes a batch with the GIL released while it waits (`take`), and only then builds the
//! Python objects. Both queues are bounded ([`RAW_QUEUE`] events, [`OUT_QUEUE`] batches): a slow
//! Python consumer holds the socket thread back (TCP backpressure, as a slow consumer of the Rust
//! client would), and memory stays bounded.
//!
//! Shutdown: `close()` (or dropping the object) drops the batch queue and tells the socket thread
//! to stop; the worker ends when either queue is gone. Nothing is joined from Python, so closing
//! never blocks the interpreter.
//!
//! Nothing is dropped silently: a frame that does not decode reaches Python as a `Frame` of kind
//! `invalid` with its `error`, a frame that does not verify with its `verdict`, and the client's
//! counters (`stats()`) count messages, reconnects, decode errors and verdicts.
//!
//! Failures (issue 39), as `riptide-client` splits them (`give_up_on_permanent`): a permanent one
//! (a 4xx other than 408/429, a host name that does not exist, a relay's `FutureCursor`) ends the
//! stream, and reaches Python after the events before it as an exception object in the batch
//! (`Item::Failed`), which the Python side raises; a transient one is retried by the client and
//! said through its `tracing` events, which `crate::log` carries to Python's `logging`; the last
//! one is `last_error()`.

use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use riptide_cbor::Arena;
use riptide_client::{
    ArchiveError, ArchiveEvent, ClientConfig, ClientError, ClientStats, FirehoseClient,
    FirehoseEvent, JetstreamClient, JetstreamConfig, JetstreamEvent, JetstreamOptions,
};
use riptide_crypto::PublicKey;
use riptide_firehose::verify::{
    peek, KeyLookup, KeyUnavailable, Verdict as RsVerdict, Verifier as RsVerifier,
};
use riptide_firehose::FrameDecoder;
use tokio::sync::oneshot;

use crate::errors::{archive_error, connect_error};
use crate::frame::{Buf, Frame, FrameData};
use crate::keys::Keys;
use crate::log::LogLines;
use crate::topy::json_to_py;
use crate::verify::Verdict;

/// Most events processed into one batch.
const BATCH: usize = 512;
/// Events buffered between the socket thread and the worker.
const RAW_QUEUE: usize = 4096;
/// Batches buffered between the worker and Python.
const OUT_QUEUE: usize = 16;

/// What the worker hands Python.
pub(crate) enum Item {
    Frame(Box<FrameData>),
    Event(serde_json::Value),
    /// A Jetstream message that is not JSON. (The client parses every message before handing
    /// it over, so this does not happen; if it ever did, Python would see it, not lose it.)
    BadEvent(String),
    /// A row of Jetstream v2's archive (`crate::archive`), made a dict under the GIL (with its
    /// payload's bytes when `record_bytes`).
    Archive {
        event: Box<ArchiveEvent>,
        record_bytes: bool,
    },
    /// The permanent failure that ended the stream (module docs): the last item.
    Failed(Failure),
}

/// What ends a stream: a live client's failure, or an archive read's (`crate::archive`).
#[derive(Debug)]
pub(crate) enum Failure {
    Client(ClientError),
    Archive(ArchiveError),
}

/// A stream's counters as Python sees them (`stats()`, `last_error()`): a live client's
/// [`ClientStats`], or an archive read's (`crate::archive`).
pub(crate) trait Counters: Send + Sync {
    fn to_py<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>>;
    fn last_error(&self) -> Option<String>;
}

impl Counters for ClientStats {
    fn to_py<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.snapshot();
        let d = PyDict::new(py);
        d.set_item("messages", s.messages)?;
        d.set_item("bytes", s.bytes)?;
        d.set_item("connects", s.connects)?;
        d.set_item("reconnects", s.reconnects)?;
        d.set_item("connect_failures", s.connect_failures)?;
        d.set_item("decode_errors", s.decode_errors)?;
        let v = PyDict::new(py);
        for (verdict, n) in RsVerdict::ALL.iter().zip(s.verdicts) {
            v.set_item(verdict.as_str(), n)?;
        }
        d.set_item("verdicts", v)?;
        Ok(d)
    }

    fn last_error(&self) -> Option<String> {
        ClientStats::last_error(self)
    }
}

/// A running client: the batch queue, the stop signal, the counters and the log lines.
pub(crate) struct Pipeline {
    rx: Mutex<Option<Receiver<Vec<Item>>>>,
    stop: Mutex<Option<oneshot::Sender<()>>>,
    /// Set when the stream ended by itself (an archive read that is complete).
    ended: Arc<AtomicBool>,
    stats: Arc<dyn Counters>,
    log: LogLines,
    /// The URL as given, for the messages of errors that do not name it.
    url: String,
}

impl Pipeline {
    /// Starts the socket thread (`next` gives the stream's events, `None` when it ends (a
    /// finite stream: an archive read), or the permanent failure that ends it) and the worker (`process` turns the events that have arrived, up to [`BATCH`],
    /// into items, in order). Both threads log into `log` (`crate::log`).
    pub(crate) fn start<C, E, N, P>(
        url: String,
        client: C,
        stats: Arc<dyn Counters>,
        log: LogLines,
        next: N,
        mut process: P,
    ) -> PyResult<Pipeline>
    where
        C: Send + 'static,
        E: Send + 'static,
        N: for<'c> AsyncNext<'c, C, E> + Send + 'static,
        P: FnMut(Vec<E>) -> Vec<Item> + Send + 'static,
    {
        let (raw_tx, raw_rx) = sync_channel::<Result<E, Failure>>(RAW_QUEUE);
        let (out_tx, out_rx) = sync_channel::<Vec<Item>>(OUT_QUEUE);
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| PyRuntimeError::new_err(format!("runtime: {e}")))?;
        let capture = log.clone();
        let ended = Arc::new(AtomicBool::new(false));
        let end = ended.clone();
        std::thread::Builder::new()
            .name("riptide-socket".into())
            .spawn(move || {
                let _log = tracing::subscriber::set_default(capture.capture());
                socket_loop(rt, client, next, raw_tx, stop_rx, &end)
            })
            .map_err(|e| PyRuntimeError::new_err(format!("thread: {e}")))?;
        let capture = log.clone();
        std::thread::Builder::new()
            .name("riptide-worker".into())
            .spawn(move || {
                let _log = tracing::subscriber::set_default(capture.capture());
                while let Ok(first) = raw_rx.recv() {
                    let mut raw = Vec::with_capacity(64);
                    let mut failed = None;
                    match first {
                        Ok(e) => raw.push(e),
                        Err(e) => failed = Some(e),
                    }
                    while failed.is_none() && raw.len() < BATCH {
                        match raw_rx.try_recv() {
                            Ok(Ok(e)) => raw.push(e),
                            Ok(Err(e)) => failed = Some(e),
                            Err(_) => break,
                        }
                    }
                    let mut items = if raw.is_empty() {
                        Vec::new()
                    } else {
                        process(raw)
                    };
                    let end = failed.is_some();
                    items.extend(failed.map(Item::Failed));
                    if out_tx.send(items).is_err() || end {
                        break;
                    }
                }
            })
            .map_err(|e| PyRuntimeError::new_err(format!("thread: {e}")))?;
        Ok(Pipeline {
            rx: Mutex::new(Some(out_rx)),
            stop: Mutex::new(Some(stop_tx)),
            ended,
            stats,
            log,
            url,
        })
    }

    /// The next batch, waiting at most `timeout` seconds with the GIL released: `Some(empty)` on
    /// timeout, `None` once closed.
    fn take(&self, py: Python<'_>, timeout: f64) -> PyResult<Option<Vec<Item>>> {
        let timeout = Duration::try_from_secs_f64(timeout.max(0.0))
            .map_err(|e| PyValueError::new_err(format!("timeout: {e}")))?;
        let r = py.detach(|| {
            let rx = self.rx.lock().unwrap_or_else(|p| p.into_inner());
            match rx.as_ref() {
                None => Err(RecvTimeoutError::Disconnected),
                Some(rx) => rx.recv_timeout(timeout),
            }
        });
        match r {
            Ok(batch) => Ok(Some(batch)),
            Err(RecvTimeoutError::Timeout) => Ok(Some(Vec::new())),
            Err(RecvTimeoutError::Disconnected) => {
                if self.is_closed() || self.ended.load(Ordering::Acquire) {
                    Ok(None)
                } else {
                    Err(PyRuntimeError::new_err("the client's threads stopped"))
                }
            }
        }
    }

    fn is_closed(&self) -> bool {
        self.stop
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_none()
    }

    fn close(&self) {
        if let Some(stop) = self.stop.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = stop.send(());
        }
        self.rx.lock().unwrap_or_else(|p| p.into_inner()).take();
    }

    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.stats.to_py(py)
    }
}

impl Drop for Pipeline {
    fn drop(&mut self) {
        self.close();
    }
}

/// The stream's next event, `None` once a finite stream (an archive read) is complete, or the
/// permanent failure that ends it (`next_checked`), as a trait, so one socket loop serves every
/// client.
pub(crate) trait AsyncNext<'c, C, E> {
    type Fut: std::future::Future<Output = Result<Option<E>, Failure>> + 'c;
    fn next(&self, client: &'c mut C) -> Self::Fut;
}

/// The future of one [`AsyncNext::next`].
pub(crate) type NextFuture<'c, E> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<Option<E>, Failure>> + 'c>>;

/// A live client's next event as an [`AsyncNext`] answer (a live stream never ends by itself).
pub(crate) fn live<'c, E>(
    next: impl std::future::Future<Output = Result<E, ClientError>> + 'c,
) -> NextFuture<'c, E> {
    Box::pin(async move { next.await.map(Some).map_err(Failure::Client) })
}

struct FirehoseNext;
impl<'c> AsyncNext<'c, FirehoseClient, FirehoseEvent> for FirehoseNext {
    type Fut = NextFuture<'c, FirehoseEvent>;
    fn next(&self, client: &'c mut FirehoseClient) -> Self::Fut {
        live(client.next_checked())
    }
}

struct JetstreamNext;
impl<'c> AsyncNext<'c, JetstreamClient, JetstreamEvent> for JetstreamNext {
    type Fut = NextFuture<'c, JetstreamEvent>;
    fn next(&self, client: &'c mut JetstreamClient) -> Self::Fut {
        // Undecodable messages are counted and skipped (0: never an error for that).
        live(client.next_checked(0))
    }
}

fn socket_loop<C, E, N>(
    rt: tokio::runtime::Runtime,
    mut client: C,
    next: N,
    raw_tx: SyncSender<Result<E, Failure>>,
    mut stop_rx: oneshot::Receiver<()>,
    ended: &AtomicBool,
) where
    N: for<'c> AsyncNext<'c, C, E>,
{
    rt.block_on(async {
        loop {
            let event = tokio::select! {
                _ = &mut stop_rx => break,
                e = next.next(&mut client) => e,
            };
            let event = match event {
                Ok(Some(e)) => Ok(e),
                Ok(None) => {
                    // Complete: the queues drain, then `take` answers `None`.
                    ended.store(true, Ordering::Release);
                    break;
                }
                Err(e) => Err(e),
            };
            let end = event.is_err();
            // Blocks this thread (its own runtime) while the worker is behind: backpressure.
            if raw_tx.send(event).is_err() || end {
                break;
            }
        }
    });
}

/// An error of a client's settings, raised by its constructor (`InvalidUrlError`, a
/// `ValueError`, for a URL that cannot work).
pub(crate) fn client_error(py: Python<'_>, url: &str, e: ClientError) -> PyErr {
    connect_error(py, &e, url)
}

/// The connection settings of every client: one URL, a start cursor, and permanent failures
/// ending the stream (module docs).
pub(crate) fn config(url: String, cursor: Option<i64>) -> ClientConfig {
    let mut cfg = ClientConfig::with_hosts([url]);
    cfg.start_cursor = cursor;
    cfg.give_up_on_permanent = true;
    cfg
}

/// The keys, shared by the verifiers of a client's shards (one resolver and its cache of DID
/// documents, not one per thread).
#[derive(Clone, Debug)]
struct SharedKeys(Arc<Keys>);

impl KeyLookup for SharedKeys {
    fn key(&self, did: &str) -> Result<PublicKey, KeyUnavailable> {
        self.0.key(did)
    }
}

/// One verifying thread's state: its accounts' verifier (per-account state: chain, key cache)
/// and a decoder for frames that fail.
struct Shard {
    verifier: Option<RsVerifier<SharedKeys>>,
    decoder: FrameDecoder,
    arena: Arena,
}

impl Shard {
    fn process(&mut self, counts: &ClientStats, bytes: Bytes) -> FrameData {
        let Shard {
            verifier,
            decoder,
            arena,
        } = self;
        let decoded = |decoder: &mut FrameDecoder, arena: &mut Arena| match decoder.decode(&bytes) {
            Ok(f) => FrameData::new(Buf::Rust(bytes.clone()), &f),
            Err(e) => FrameData::invalid(bytes.clone(), arena, &e),
        };
        match verifier {
            Some(v) => {
                let (report, data) =
                    v.check_then(&bytes, |f| FrameData::new(Buf::Rust(bytes.clone()), f));
                counts.record_verdict(report.verdict);
                // A frame that failed is still shown, decoded as far as it goes.
                let mut data = data.unwrap_or_else(|| decoded(decoder, arena));
                data.verdict = Some(Verdict::of_report(&report));
                data
            }
            None => decoded(decoder, arena),
        }
    }
}

/// Fewest frames in a batch worth verifying on several threads (below: one thread, no spawn).
const PARALLEL_MIN: usize = 32;

/// Decodes (and verifies) a batch of frames, in order. With several shards, each account's
/// frames go to the shard its DID hashes to, always the same one (the verifier's state is per
/// account and needs the account's frames in order); the shards of a large batch run on scoped
/// threads, and the results are put back in stream order.
fn process_frames(
    shards: &mut [Shard],
    peek_arena: &mut Arena,
    counts: &ClientStats,
    events: Vec<FirehoseEvent>,
) -> Vec<Item> {
    let n = shards.len();
    let shard_of = |arena: &mut Arena, bytes: &[u8]| -> usize {
        if n == 1 {
            return 0;
        }
        match peek(arena, bytes).did {
            Some(did) => {
                let mut h = std::hash::DefaultHasher::new();
                did.hash(&mut h);
                (h.finish() % n as u64) as usize
            }
            None => 0,
        }
    };
    if n == 1 || events.len() < PARALLEL_MIN {
        return events
            .into_iter()
            .map(|ev| {
                let k = shard_of(peek_arena, &ev.bytes);
                Item::Frame(Box::new(shards[k].process(counts, ev.bytes)))
            })
            .collect();
    }
    let total = events.len();

    let mut parts: Vec<Vec<(usize, Bytes)>> = (0..n).map(|_| Vec::new()).collect();
    for (i, ev) in events.into_iter().enumerate() {
        let k = shard_of(peek_arena, &ev.bytes);
        parts[k].push((i, ev.bytes));
    }
    let mut done: Vec<Vec<(usize, FrameData)>> = Vec::with_capacity(n);
    std::thread::scope(|scope| {
        let mut handles = Vec::with_capacity(n);
        let mut jobs = shards.iter_mut().zip(parts);
        // The first shard runs on this thread, the others on scoped threads.
        let first = jobs.next();
        for (shard, part) in jobs {
            handles.push(scope.spawn(move || {
                part.into_iter()
                    .map(|(i, b)| (i, shard.process(counts, b)))
                    .collect::<Vec<_>>()
            }));
        }
        if let Some((shard, part)) = first {
            done.push(
                part.into_iter()
                    .map(|(i, b)| (i, shard.process(counts, b)))
                    .collect(),
            );
        }
        for h in handles {
            // A panic in a verifier is a bug; re-raised here, PyO3 turns it into an exception
            // on the consumer's side (the worker's queue closes).
            done.push(h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)));
        }
    });
    let mut out: Vec<Option<Item>> = (0..total).map(|_| None).collect();
    for (i, d) in done.into_iter().flatten() {
        out[i] = Some(Item::Frame(Box::new(d)));
    }
    out.into_iter().flatten().collect()
}

/// The native half of a client (`riptide.Firehose`, `riptide.Jetstream`, `riptide.Archive`'s
/// reads), made by `_firehose`, `_jetstream`, `_jetstream_v2`, `_archive_snapshot` or
/// `_archive_replay`.
#[pyclass(module = "riptide", name = "_ClientCore")]
pub struct ClientCore {
    pipeline: Pipeline,
}

impl ClientCore {
    pub(crate) fn new(pipeline: Pipeline) -> ClientCore {
        ClientCore { pipeline }
    }
}

impl std::fmt::Debug for ClientCore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientCore").finish_non_exhaustive()
    }
}

#[pymethods]
impl ClientCore {
    /// The next batch (waiting at most `timeout` seconds; empty on timeout), or None once
    /// closed. A permanent failure comes last in its batch, as an exception object.
    fn take(&self, py: Python<'_>, timeout: f64) -> PyResult<Option<Py<PyList>>> {
        let url = &self.pipeline.url;
        items_to_py(py, url, self.pipeline.take(py, timeout)?)
    }

    /// The log lines since the last call: `(kind, level, text)` tuples (`crate::log`).
    fn take_log(&self) -> Vec<crate::log::Line> {
        self.pipeline.log.take()
    }

    /// What went wrong last (a failed connection or one that ended, with its URL); None while
    /// the current connection has had no trouble.
    fn last_error(&self) -> Option<String> {
        self.pipeline.stats.last_error()
    }

    /// Stops the client (the GIL released while its queue is locked: a `take` may hold it).
    fn close(&self, py: Python<'_>) {
        py.detach(|| self.pipeline.close());
    }

    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.pipeline.stats(py)
    }
}

/// The native half of `riptide.Firehose`.
#[pyfunction]
#[pyo3(name = "_firehose")]
#[pyo3(signature = (url, cursor = None, verify = true, did_docs_json = None, plc_url = None, threads = None))]
fn firehose(
    py: Python<'_>,
    url: String,
    cursor: Option<i64>,
    verify: bool,
    did_docs_json: Option<&[u8]>,
    plc_url: Option<String>,
    threads: Option<usize>,
) -> PyResult<ClientCore> {
    let client =
        FirehoseClient::new(config(url.clone(), cursor)).map_err(|e| client_error(py, &url, e))?;
    let stats = client.stats();
    let threads = match threads {
        Some(0) | Some(257..) => {
            return Err(PyValueError::new_err(
                "threads must be between 1 and 256 (None: one per CPU)",
            ))
        }
        Some(n) => n,
        None => std::thread::available_parallelism().map_or(1, |n| n.get().min(8)),
    };
    let keys = if verify {
        Some(SharedKeys(Arc::new(Keys::new(did_docs_json, plc_url)?)))
    } else {
        None
    };
    let mut shards: Vec<Shard> = (0..if verify { threads } else { 1 })
        .map(|_| Shard {
            verifier: keys.clone().map(RsVerifier::new),
            decoder: FrameDecoder::new(),
            arena: Arena::new(),
        })
        .collect();
    let counts = stats.clone();
    let mut peek_arena = Arena::new();
    let process = move |events: Vec<FirehoseEvent>| -> Vec<Item> {
        process_frames(&mut shards, &mut peek_arena, &counts, events)
    };
    let log = LogLines::default();
    Ok(ClientCore::new(Pipeline::start(
        url,
        client,
        stats,
        log,
        FirehoseNext,
        process,
    )?))
}

/// The native half of `riptide.Jetstream` on v1's `/subscribe`.
#[pyfunction]
#[pyo3(name = "_jetstream")]
#[pyo3(signature = (url, collections = None, dids = None, cursor = None, zstd_dictionary = None))]
fn jetstream(
    py: Python<'_>,
    url: String,
    collections: Option<Vec<String>>,
    dids: Option<Vec<String>>,
    cursor: Option<i64>,
    zstd_dictionary: Option<Vec<u8>>,
) -> PyResult<ClientCore> {
    let cfg = JetstreamConfig {
        client: config(url.clone(), cursor),
        options: JetstreamOptions {
            wanted_collections: collections.unwrap_or_default(),
            wanted_dids: dids.unwrap_or_default(),
            max_message_size_bytes: 0,
        },
        dictionary: zstd_dictionary,
        require_hello: false,
    };
    let client = JetstreamClient::new(cfg).map_err(|e| client_error(py, &url, e))?;
    let stats = client.stats();
    let process = |events: Vec<JetstreamEvent>| {
        events
            .into_iter()
            .map(|ev| match serde_json::from_slice(&ev.raw) {
                Ok(v) => Item::Event(v),
                Err(e) => Item::BadEvent(format!("not JSON: {e}")),
            })
            .collect()
    };
    Ok(ClientCore::new(Pipeline::start(
        url,
        client,
        stats,
        LogLines::default(),
        JetstreamNext,
        process,
    )?))
}

fn items_to_py(
    py: Python<'_>,
    url: &str,
    batch: Option<Vec<Item>>,
) -> PyResult<Option<Py<PyList>>> {
    let Some(batch) = batch else {
        return Ok(None);
    };
    let list = PyList::empty(py);
    for item in batch {
        match item {
            Item::Frame(d) => list.append(Py::new(py, Frame::new(*d))?)?,
            Item::Event(v) => list.append(json_to_py(py, &v)?)?,
            Item::BadEvent(why) => {
                let d = PyDict::new(py);
                d.set_item("kind", "invalid")?;
                d.set_item("error", why)?;
                list.append(d)?;
            }
            Item::Archive {
                event,
                record_bytes,
            } => list.append(crate::archive::event_to_py(py, &event, record_bytes)?)?,
            Item::Failed(Failure::Client(e)) => {
                list.append(connect_error(py, &e, url).into_value(py))?
            }
            Item::Failed(Failure::Archive(e)) => {
                list.append(archive_error(py, &e, url).into_value(py))?
            }
        }
    }
    Ok(Some(list.unbind()))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<ClientCore>()?;
    m.add_function(wrap_pyfunction!(firehose, m)?)?;
    m.add_function(wrap_pyfunction!(jetstream, m)?)?;
    Ok(())
}
