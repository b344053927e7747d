//! Where verified records go: the [`Sink`] trait, and [`JsonlSink`] (one JSON line per record).
//!
//! Why a trait: the backfill's output is a pipeline's input (`--jsonl`, [`JsonlSink`]) or the
//! store that `riptide serve` reads (`--data`, [`crate::StoreSink`]); the crawl, the limits and
//! the durable progress are the same for both.
//!
//! The contract with the state ([`crate::state`]): [`Sink::write`] buffers; [`Sink::commit`]
//! makes everything written durable and returns a position; the state stores that position with
//! the statuses of the repositories written; at start, [`Sink::recover`] rolls the output back
//! to the position stored, so that a repository whose status was not committed leaves nothing
//! behind and is written again, once.
//!
//! [`JsonlSink`] on a regular file (`--out FILE`, or standard output redirected to a file) is
//! exact: the position is the file's length, fsynced, and recovery truncates to it. On a pipe
//! nothing can be taken back: after a crash, the repositories whose output was written but whose
//! status was not committed (at most one writer batch) are written again. The lines carry the
//! DID and rev, so a consumer can drop those; the run says so in a warning.

use std::fs::File;
use std::io::{Seek, SeekFrom, Write};

use riptide_cbor::{write_json_string, Arena};
use riptide_jetstream::write_record_json;

use crate::outcome::{Record, Verified};

/// Why the output failed: it stops the run (the state is not advanced past it).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SinkError {
    /// Writing or syncing failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being written.
        what: String,
        /// The error.
        source: std::io::Error,
    },
    /// The output is shorter than the state says was written durably: someone truncated or
    /// replaced it, and records would be lost.
    #[error("{what} is {len} bytes but the backfill state says {expected} bytes were written: the output was truncated or replaced (to resume into a file, append to it: `>> FILE` or --out FILE; or start over with a new --state)")]
    Shorter {
        /// The output.
        what: String,
        /// Its length.
        len: u64,
        /// What the state says.
        expected: u64,
    },
    /// The position in the state is not one this sink writes.
    #[error("the backfill state's output position is not this sink's ({0} bytes)")]
    BadPosition(usize),
    /// The writer stopped (a local failure said where it happened).
    #[error("{0}")]
    Unavailable(String),
    /// The store refused a read or a write ([`crate::StoreSink`]).
    #[error("store {what}: {source}")]
    Store {
        /// The data directory.
        what: String,
        /// The error.
        source: riptide_store::StoreError,
    },
    /// The store holds fewer events than the backfill state says were written durably: the
    /// data directory was replaced or restored from an older copy, and records would be lost.
    #[error("store {what} ends at seq {next_seq} but the backfill state says events up to {expected} were written: the data directory was replaced; start over with a new backfill state (or the data directory it was written with)")]
    StoreBehind {
        /// The data directory.
        what: String,
        /// The store's next seq.
        next_seq: u64,
        /// The next seq the state recorded.
        expected: u64,
    },
    /// A progress entry in the store is not what this version writes.
    #[error("{what}: {why}")]
    Corrupt {
        /// Which entry.
        what: String,
        /// What is wrong.
        why: String,
    },
}

/// What a [`Sink::write`] did with one repository.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Written {
    /// Records written.
    pub records: u64,
    /// Records not written: outside the atproto data model (as Jetstream's projection drops
    /// them); counted in the state.
    pub dropped: u64,
}

/// An output for verified repositories (module docs: the durability contract).
pub trait Sink: Send {
    /// Rolls the output back to `position` (from the state; `None`: nothing was committed).
    fn recover(&mut self, position: Option<&[u8]>) -> Result<(), SinkError>;
    /// Writes one repository's records (buffered: not yet durable).
    fn write(&mut self, repo: &Verified) -> Result<Written, SinkError>;
    /// Makes everything written durable; the position to store.
    fn commit(&mut self) -> Result<Vec<u8>, SinkError>;
    /// Whether a crash can repeat output ([`JsonlSink`] on a pipe).
    fn exact(&self) -> bool;
    /// `did` failed: no repository of it will be written by this run (buffered in order with
    /// the writes; `riptide serve --backfill` stops holding the account's live frames).
    fn settled(&mut self, _did: &str) -> Result<(), SinkError> {
        Ok(())
    }
    /// After [`Sink::commit`]: what the repository of `did` written since the commit before
    /// really wrote, when the sink learns it only once it is durable (`riptide serve
    /// --backfill`, whose ingest worker decides how a repository lands against the account's
    /// state in memory); `None`: what [`Sink::write`] said.
    fn recount(&mut self, _did: &str) -> Option<Written> {
        None
    }
}

/// Appends one record's line (without its newline) to `buf`:
/// `{"did","rev","collection","rkey","cid","record"}`, the record rendered as Jetstream's
/// projection renders it. False (and `buf` as it was) for a record outside the atproto data
/// model, which is not written. [`JsonlSink`]'s (`riptide backfill --jsonl`).
pub fn record_line(arena: &mut Arena, buf: &mut Vec<u8>, repo: &Verified, r: &Record<'_>) -> bool {
    let mark = buf.len();
    buf.extend_from_slice(b"{\"did\":");
    write_json_string(buf, &repo.did);
    buf.extend_from_slice(b",\"rev\":");
    write_json_string(buf, &repo.rev);
    buf.extend_from_slice(b",\"collection\":");
    write_json_string(buf, r.collection);
    buf.extend_from_slice(b",\"rkey\":");
    write_json_string(buf, r.rkey);
    buf.extend_from_slice(b",\"cid\":\"");
    r.cid.as_cid().write_string(buf);
    buf.extend_from_slice(b"\",\"record\":");
    if write_record_json(arena, r.bytes, buf) {
        buf.push(b'}');
        true
    } else {
        buf.truncate(mark);
        false
    }
}

/// JSON lines: `{"did","rev","collection","rkey","cid","record"}` per record, the record
/// rendered as Jetstream's projection renders it ([`write_record_json`]).
pub struct JsonlSink {
    out: Output,
    what: String,
    buf: Vec<u8>,
    arena: Arena,
    /// Bytes written since the output's start (a file's length).
    len: u64,
}

enum Output {
    File(File),
    Pipe(Box<dyn Write + Send>),
}

impl std::fmt::Debug for JsonlSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JsonlSink")
            .field("what", &self.what)
            .field("len", &self.len)
            .finish()
    }
}

/// Flush to the output past this many buffered bytes.
const FLUSH_AT: usize = 1 << 20;

impl JsonlSink {
    /// Lines appended to a regular file (exact across crashes).
    pub fn file(file: File, what: impl Into<String>) -> JsonlSink {
        JsonlSink::new(Output::File(file), what.into())
    }

    /// Lines to a pipe or terminal (module docs: a crash may repeat the last batch).
    pub fn pipe(w: Box<dyn Write + Send>, what: impl Into<String>) -> JsonlSink {
        JsonlSink::new(Output::Pipe(w), what.into())
    }

    fn new(out: Output, what: String) -> JsonlSink {
        JsonlSink {
            out,
            what,
            buf: Vec::with_capacity(FLUSH_AT * 2),
            arena: Arena::new(),
            len: 0,
        }
    }

    fn io(&self, source: std::io::Error) -> SinkError {
        SinkError::Io {
            what: self.what.clone(),
            source,
        }
    }

    fn flush_buf(&mut self) -> Result<(), SinkError> {
        let r = match &mut self.out {
            Output::File(f) => f.write_all(&self.buf),
            Output::Pipe(w) => w.write_all(&self.buf),
        };
        r.map_err(|e| self.io(e))?;
        self.len += self.buf.len() as u64;
        self.buf.clear();
        Ok(())
    }
}

impl Sink for JsonlSink {
    fn recover(&mut self, position: Option<&[u8]>) -> Result<(), SinkError> {
        let expected = match position {
            None => 0,
            Some(p) => {
                u64::from_le_bytes(p.try_into().map_err(|_| SinkError::BadPosition(p.len()))?)
            }
        };
        match &mut self.out {
            Output::File(f) => {
                let len = f.metadata().map_err(|e| SinkError::Io {
                    what: self.what.clone(),
                    source: e,
                })?;
                let len = len.len();
                if len < expected {
                    return Err(SinkError::Shorter {
                        what: self.what.clone(),
                        len,
                        expected,
                    });
                }
                if len > expected {
                    tracing::info!(
                        output = %self.what, committed = expected, found = len,
                        "backfill: dropping output written after the last commit (it is written again)"
                    );
                }
                let r = f
                    .set_len(expected)
                    .and_then(|()| f.seek(SeekFrom::Start(expected)).map(drop))
                    .and_then(|()| f.sync_all());
                r.map_err(|e| SinkError::Io {
                    what: self.what.clone(),
                    source: e,
                })?;
            }
            Output::Pipe(_) => {
                if expected > 0 {
                    tracing::warn!(
                        output = %self.what,
                        "backfill: resuming to a pipe: records of the repositories in flight at the last stop may be written twice (lines carry did and rev to tell); write to a file (--out) for exactly once"
                    );
                }
            }
        }
        self.len = expected;
        Ok(())
    }

    fn write(&mut self, repo: &Verified) -> Result<Written, SinkError> {
        let mut w = Written::default();
        for r in repo.records() {
            if record_line(&mut self.arena, &mut self.buf, repo, &r) {
                self.buf.push(b'\n');
                w.records += 1;
            } else {
                w.dropped += 1;
            }
            if self.buf.len() >= FLUSH_AT {
                self.flush_buf()?;
            }
        }
        if w.dropped > 0 {
            tracing::warn!(
                did = %repo.did, rev = %repo.rev, dropped = w.dropped,
                "backfill: records outside the atproto data model not written (counted as records_dropped)"
            );
        }
        Ok(w)
    }

    fn commit(&mut self) -> Result<Vec<u8>, SinkError> {
        self.flush_buf()?;
        let r = match &mut self.out {
            // Data only: the length is part of the data for an appended file.
            Output::File(f) => f.sync_data(),
            Output::Pipe(w) => w.flush(),
        };
        r.map_err(|e| self.io(e))?;
        Ok(self.len.to_le_bytes().to_vec())
    }

    fn exact(&self) -> bool {
        matches!(self.out, Output::File(_))
    }
}

/// Two outputs at once (`--data DIR --jsonl`: the store, and JSON lines for a pipeline): every
/// repository written to both, both made durable before the state commits. Its position holds
/// both positions, so each output recovers to its own; exact when both are.
pub struct TeeSink {
    first: Box<dyn Sink>,
    second: Box<dyn Sink>,
}

impl std::fmt::Debug for TeeSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TeeSink").finish_non_exhaustive()
    }
}

impl TeeSink {
    /// Writes to `first`, then to `second`.
    pub fn new(first: Box<dyn Sink>, second: Box<dyn Sink>) -> TeeSink {
        TeeSink { first, second }
    }
}

impl Sink for TeeSink {
    fn recover(&mut self, position: Option<&[u8]>) -> Result<(), SinkError> {
        let Some(p) = position else {
            self.first.recover(None)?;
            return self.second.recover(None);
        };
        // `[u32 le: first's length][first's position][second's position]`.
        let bad = || SinkError::BadPosition(p.len());
        let n = p
            .get(..4)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_le_bytes)
            .ok_or_else(bad)? as usize;
        let first = p.get(4..4 + n).ok_or_else(bad)?;
        self.first.recover(Some(first))?;
        self.second.recover(Some(&p[4 + n..]))
    }

    fn write(&mut self, repo: &Verified) -> Result<Written, SinkError> {
        let w = self.first.write(repo)?;
        self.second.write(repo)?;
        Ok(w)
    }

    fn commit(&mut self) -> Result<Vec<u8>, SinkError> {
        let first = self.first.commit()?;
        let second = self.second.commit()?;
        let mut p = Vec::with_capacity(4 + first.len() + second.len());
        p.extend_from_slice(&(first.len() as u32).to_le_bytes());
        p.extend_from_slice(&first);
        p.extend_from_slice(&second);
        Ok(p)
    }

    fn settled(&mut self, did: &str) -> Result<(), SinkError> {
        self.first.settled(did)?;
        self.second.settled(did)
    }

    fn exact(&self) -> bool {
        self.first.exact() && self.second.exact()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::collections::Collections;
    use crate::verify::verify_car;
    use riptide_sim::fixture;

    /// A fixture account's repository of `records` records, verified.
    pub(crate) fn verified(seed: u8, records: usize) -> Verified {
        let a = fixture::account(seed, "x.test", records);
        let key = a.key.public_key();
        verify_car(
            Box::new(a.car.to_vec()),
            &a.did,
            Some(&key),
            &Collections::all(),
            "t",
        )
        .unwrap()
    }

    fn open(path: &std::path::Path) -> File {
        std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(path)
            .unwrap()
    }

    #[test]
    fn a_file_is_cut_back_to_its_last_commit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.jsonl");
        let (a, b) = (verified(1, 30), verified(2, 12));
        let mut sink = JsonlSink::file(open(&path), "out");
        sink.recover(None).unwrap();
        assert_eq!(
            sink.write(&a).unwrap(),
            Written {
                records: 30,
                dropped: 0
            }
        );
        let pos = sink.commit().unwrap();
        let committed = std::fs::read_to_string(&path).unwrap();
        assert_eq!(pos, (committed.len() as u64).to_le_bytes().to_vec());
        let lines: Vec<serde_json::Value> = committed
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 30);
        let first = a.records().next().unwrap();
        assert_eq!(lines[0]["did"], a.did.as_str());
        assert_eq!(lines[0]["rev"], a.rev.as_str());
        assert_eq!(lines[0]["collection"], first.collection);
        assert_eq!(lines[0]["rkey"], first.rkey);
        assert_eq!(lines[0]["cid"], first.cid.to_string());
        assert_eq!(lines[0]["record"]["$type"], first.collection);
        // b written and flushed but its commit never made: a crash. At restart it is gone.
        sink.write(&b).unwrap();
        sink.flush_buf().unwrap();
        drop(sink);
        assert!(std::fs::metadata(&path).unwrap().len() > committed.len() as u64);
        let mut sink = JsonlSink::file(open(&path), "out");
        sink.recover(Some(&pos)).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), committed);
        // Written again, once.
        sink.write(&b).unwrap();
        sink.commit().unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap().lines().count(), 42);
        assert!(sink.exact());
    }

    #[test]
    fn an_output_shorter_than_the_state_says_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.jsonl");
        std::fs::write(&path, b"{}\n").unwrap();
        let mut sink = JsonlSink::file(open(&path), "out");
        let e = sink.recover(Some(&100u64.to_le_bytes())).unwrap_err();
        assert!(
            matches!(
                e,
                SinkError::Shorter {
                    len: 3,
                    expected: 100,
                    ..
                }
            ),
            "{e}"
        );
        assert!(matches!(
            sink.recover(Some(b"\x01\x02")),
            Err(SinkError::BadPosition(2))
        ));
        let mut pipe = JsonlSink::pipe(Box::new(std::io::sink()), "pipe");
        pipe.recover(Some(&100u64.to_le_bytes())).unwrap();
        assert!(!pipe.exact());
    }
}
