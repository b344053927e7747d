//! `decode_frames`: many frames decoded on Rust threads, handed to Python in order.
//!
//! Why it exists: `decode_frame` in a Python loop decodes on the calling thread, one frame per
//! call, so the decoding and the building of Python objects take turns on one core, and every
//! frame's blocks are hashed alone (too few to fill the SHA-256 lanes). Here the calling thread
//! only pulls frames from the caller's iterable and turns decoded frames into Python objects; the
//! decoding (every block's CID checked, every block decoded, `FrameDecoder::decode_batch`, which
//! hashes a batch's blocks together) runs on `threads` Rust threads without the GIL, while Python
//! works on the previous batch.
//!
//! Order: chunk `k` of [`CHUNK`] frames goes to worker `k mod threads` and its results are taken
//! from that worker in the same turn, so frames (and errors) come out in input order whatever the
//! number of threads. At most [`DEPTH`] chunks per worker are in flight: memory stays bounded and
//! no send blocks.
//!
//! The frames are read in place: a `bytes` object is held (`PyBackedBytes`), not copied, and the
//! decoded `Frame` keeps it (as `decode_frame` does).
//!
//! Errors: a frame that does not decode raises its `DecodeError` subclass at its position (with
//! `.index`, its position in the input); the iterator stays usable and goes on with the next
//! frame. With `on_error="yield"` it is yielded instead as a `Frame` of kind `invalid` with its
//! `.error`. An exception from the input iterable (or an item that is not bytes) is raised after
//! the frames before it, and ends the iteration.
//!
//! Dropping the iterator early drops the channels: each worker finishes the chunk it holds, finds
//! nobody listening and ends; nothing is joined, so dropping never blocks Python.

use std::collections::VecDeque;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Mutex;

use pyo3::exceptions::{PyRuntimeError, PyStopIteration, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::types::PyIterator;
use riptide_cbor::Arena;
use riptide_firehose::{DecodeOptions, FrameDecoder};

use crate::errors;
use crate::frame::{Buf, Frame, FrameData};

/// Frames per chunk handed to a worker: four of `decode_batch`'s SHA-256 batches; small enough
/// that the first frames come out quickly.
const CHUNK: usize = 64;
/// Chunks in flight per worker.
const DEPTH: usize = 4;

/// The frames of a chunk, readable without the GIL.
type Chunk = Vec<PyBackedBytes>;

/// Decodes a chunk with `dec` (batched hashing): one `FrameData` per frame, in order, each
/// holding its frame's buffer; a frame that does not decode carries its error.
fn decode_chunk(dec: &mut FrameDecoder, arena: &mut Arena, chunk: Chunk) -> Vec<FrameData> {
    let slices: Vec<&[u8]> = chunk.iter().map(|b| &b[..]).collect();
    let mut out = Vec::with_capacity(chunk.len());
    dec.decode_batch(&slices, |i, r| {
        out.push(match r {
            Ok(f) => FrameData::of(&f),
            Err(e) => FrameData::invalid_of(slices[i], arena, &e),
        })
    });
    drop(slices);
    for (d, b) in out.iter_mut().zip(chunk) {
        d.bytes = Buf::Py(b);
    }
    out
}

fn decoder(verify_cids: bool) -> FrameDecoder {
    if verify_cids {
        FrameDecoder::new()
    } else {
        FrameDecoder::with_options(DecodeOptions::unverified())
    }
}

/// One decoding thread's ends of its two queues.
struct Worker {
    tx: SyncSender<Chunk>,
    /// In a mutex only so that a `&Worker` may cross into `Python::detach` (never contended).
    rx: Mutex<Receiver<Vec<FrameData>>>,
}

impl Worker {
    fn spawn(verify_cids: bool) -> PyResult<Worker> {
        let (tx, in_rx) = sync_channel::<Chunk>(DEPTH);
        let (out_tx, rx) = sync_channel::<Vec<FrameData>>(DEPTH);
        std::thread::Builder::new()
            .name("riptide-decode".into())
            .spawn(move || {
                let mut dec = decoder(verify_cids);
                let mut arena = Arena::new();
                while let Ok(chunk) = in_rx.recv() {
                    if out_tx
                        .send(decode_chunk(&mut dec, &mut arena, chunk))
                        .is_err()
                    {
                        break;
                    }
                }
            })
            .map_err(|e| PyRuntimeError::new_err(format!("thread: {e}")))?;
        Ok(Worker {
            tx,
            rx: Mutex::new(rx),
        })
    }
}

/// Where the decoding happens.
enum Engine {
    /// On the calling thread, the GIL released per chunk.
    Inline {
        dec: Box<FrameDecoder>,
        arena: Arena,
    },
    /// On worker threads.
    Threads {
        workers: Vec<Worker>,
        /// Chunks sent and not yet taken back.
        in_flight: usize,
        next_send: usize,
        next_recv: usize,
    },
}

/// The caller's frames.
struct Input {
    /// None once exhausted (or failed).
    iter: Option<Py<PyIterator>>,
    /// Raised once the frames before it are out: what the input iterable raised, or a bad item.
    error: Option<PyErr>,
    /// Frames pulled so far.
    pulled: usize,
}

impl Input {
    /// Pulls up to a chunk of frames (with the GIL); None when there are none.
    fn pull(&mut self, py: Python<'_>) -> Option<Chunk> {
        let mut iter = self.iter.as_ref()?.bind(py).clone();
        let mut chunk = Vec::with_capacity(CHUNK);
        while chunk.len() < CHUNK {
            let item = match iter.next() {
                None => {
                    self.iter = None;
                    break;
                }
                Some(Err(e)) => {
                    self.iter = None;
                    self.error = Some(e);
                    break;
                }
                Some(Ok(item)) => item,
            };
            match item.extract::<PyBackedBytes>() {
                Ok(b) => {
                    chunk.push(b);
                    self.pulled += 1;
                }
                Err(_) => {
                    let ty = item
                        .get_type()
                        .name()
                        .map_or_else(|_| "?".to_owned(), |n| n.to_string());
                    self.iter = None;
                    self.error = Some(PyTypeError::new_err(format!(
                        "decode_frames: item {} is {ty}, not bytes",
                        self.pulled
                    )));
                    break;
                }
            }
        }
        (!chunk.is_empty()).then_some(chunk)
    }
}

struct State {
    input: Input,
    engine: Engine,
    ready: VecDeque<FrameData>,
    /// Position in the input of the next frame handed out.
    index: usize,
    yield_errors: bool,
}

/// The iterator `decode_frames` returns.
#[pyclass(module = "riptide", name = "FrameIterator")]
pub struct FrameIterator {
    state: Mutex<State>,
}

impl std::fmt::Debug for FrameIterator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrameIterator").finish_non_exhaustive()
    }
}

impl State {
    /// Fills `ready` with the next decoded chunk; false when there is nothing left.
    fn refill(&mut self, py: Python<'_>) -> PyResult<bool> {
        let State {
            input,
            engine,
            ready,
            ..
        } = self;
        match engine {
            Engine::Inline { dec, arena } => {
                let Some(chunk) = input.pull(py) else {
                    return Ok(false);
                };
                ready.extend(py.detach(|| decode_chunk(dec, arena, chunk)));
                Ok(true)
            }
            Engine::Threads {
                workers,
                in_flight,
                next_send,
                next_recv,
            } => {
                let n = workers.len();
                // Top up: every worker DEPTH chunks ahead.
                while *in_flight < n * DEPTH {
                    let Some(chunk) = input.pull(py) else { break };
                    workers[*next_send % n]
                        .tx
                        .send(chunk)
                        .map_err(|_| stopped())?;
                    *next_send += 1;
                    *in_flight += 1;
                }
                if *in_flight == 0 {
                    return Ok(false);
                }
                let rx = &workers[*next_recv % n].rx;
                let out = py
                    .detach(|| rx.lock().unwrap_or_else(|p| p.into_inner()).recv())
                    .map_err(|_| stopped())?;
                *next_recv += 1;
                *in_flight -= 1;
                ready.extend(out);
                Ok(true)
            }
        }
    }

    fn next(&mut self, py: Python<'_>) -> PyResult<Frame> {
        let d = loop {
            if let Some(d) = self.ready.pop_front() {
                break d;
            }
            if !self.refill(py)? {
                return Err(match self.input.error.take() {
                    Some(e) => e,
                    None => PyStopIteration::new_err(()),
                });
            }
        };
        let index = self.index;
        self.index += 1;
        if !self.yield_errors {
            if let Some((class, message, offset)) = d.error() {
                let err = errors::decode_error(py, class, message.clone(), *offset);
                let _ = err.value(py).setattr("index", index);
                return Err(err);
            }
        }
        Ok(Frame::new(d))
    }
}

fn stopped() -> PyErr {
    PyRuntimeError::new_err("a decoding thread stopped")
}

#[pymethods]
impl FrameIterator {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&mut self, py: Python<'_>) -> PyResult<Frame> {
        let state = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        state.next(py)
    }

    /// Position in the input of the next frame handed out (= frames handed out so far).
    #[getter]
    fn index(&mut self) -> usize {
        self.state
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .index
    }

    fn __repr__(&mut self) -> String {
        let s = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        let threads = match &s.engine {
            Engine::Inline { .. } => 0,
            Engine::Threads { workers, .. } => workers.len(),
        };
        format!("FrameIterator(index={}, threads={threads})", s.index)
    }
}

/// decode_frames(frames, verify_cids=True, threads=None, on_error="raise") -> FrameIterator
///
/// Decodes many frames (an iterable of bytes) on Rust threads, in order; see the module doc.
#[pyfunction]
#[pyo3(signature = (frames, verify_cids = true, threads = None, on_error = "raise"))]
fn decode_frames(
    frames: &Bound<'_, PyAny>,
    verify_cids: bool,
    threads: Option<usize>,
    on_error: &str,
) -> PyResult<FrameIterator> {
    let yield_errors = match on_error {
        "raise" => false,
        "yield" => true,
        other => {
            return Err(PyValueError::new_err(format!(
                "on_error must be \"raise\" or \"yield\", not {other:?}"
            )))
        }
    };
    let threads = threads.unwrap_or_else(default_threads);
    if threads > 256 {
        return Err(PyValueError::new_err(format!(
            "threads must be at most 256, not {threads}"
        )));
    }
    let engine = if threads == 0 {
        Engine::Inline {
            dec: Box::new(decoder(verify_cids)),
            arena: Arena::new(),
        }
    } else {
        Engine::Threads {
            workers: (0..threads)
                .map(|_| Worker::spawn(verify_cids))
                .collect::<PyResult<_>>()?,
            in_flight: 0,
            next_send: 0,
            next_recv: 0,
        }
    };
    Ok(FrameIterator {
        state: Mutex::new(State {
            input: Input {
                iter: Some(frames.try_iter()?.unbind()),
                error: None,
                pulled: 0,
            },
            engine,
            ready: VecDeque::new(),
            index: 0,
            yield_errors,
        }),
    })
}

/// One decoding thread per CPU (at most 8): the calling thread mostly waits for them, and
/// builds Python objects while they decode the next chunks.
fn default_threads() -> usize {
    std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, 8)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<FrameIterator>()?;
    m.add_function(wrap_pyfunction!(decode_frames, m)?)?;
    Ok(())
}
