//! `riptide verify FILE --did-docs DOCS.json [--threads N] [--json] [--stateless | --state DIR]`
//! (a contract).
//!
//! Verifies every frame of a corpus file: block CIDs, commit signatures with the keys of the DID
//! documents, Sync 1.1 proofs (see `riptide_firehose::verify`), and each frame against its
//! account's chain state kept across the frames of the input (`riptide_firehose::chain`:
//! `rev-regression`, `future-rev`, `chain-break`, `account-inactive`, `superseded` (at or below
//! the rev of an upstream `#sync`); a chain break restarts the
//! account's chain at the breaking commit, as there is no resync from a file). `--stateless`
//! checks each frame alone; `--state DIR` loads the chain state from `DIR/chain-state` before the
//! run and writes it back after (atomically: a temporary file renamed over it), so successive runs
//! over successive files continue one chain. With `--json`, one object per frame
//! on stdout, in frame order: `{"index","seq","did","kind","verdict","reason"}` (`reason` null when
//! ok). Otherwise each frame that is not ok is reported on stderr, the first [`ERROR_LINES`] of
//! each verdict (as `decode` does: a file of four million empty frames printed four million lines,
//! one write each, and took 16 s), then how many more there were. A summary of verdict counts goes
//! to stderr either way; the exit code is 1 if any frame is not ok.
//!
//! Threads: each DID is owned by one thread for the whole run (its frames are verified in order
//! by one verifier, which holds its cached key and sees its `#identity` frames), and the output is
//! written in frame order. Frames go through in batches: per batch, every thread reads the DIDs of
//! a share of the frames (cheap: header and payload, not the CAR), DIDs seen for the first time are
//! given to threads largest-first onto the least-loaded thread (estimated cost: a signature plus
//! the bytes to hash), and then every thread verifies its frames. Batches bound memory and keep the
//! threads' shares even. The DID → thread map is bounded too: past [`MAX_OWNED`] DIDs, between two
//! batches, it is emptied together with every verifier's key cache (fresh verifiers), so a DID
//! that lands on another thread afterwards finds no stale key anywhere. Chain state is shared by
//! all threads ([`SharedChain`]), so it survives a DID moving to another thread.

use std::collections::HashMap;
use std::io::Write;
use std::ops::Range;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context;
use riptide_cbor::{write_json_int, write_json_string, Arena};
use riptide_firehose::chain::{ChainStore, NoChain, SharedChain};
use riptide_firehose::corpus::CorpusFrame;
use riptide_firehose::verify::{peek, Report, Verdict, VerdictCounts, Verifier};

use super::DocKeys;
use crate::out;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Corpus file: u32 count, then u32 length + frame bytes each (big-endian).
    file: PathBuf,
    /// JSON object mapping DID → DID document (the signing keys).
    #[arg(long)]
    did_docs: PathBuf,
    /// Worker threads (each DID stays on one thread; output stays in frame order).
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// One JSON object per frame on stdout.
    #[arg(long)]
    json: bool,
    /// Check each frame on its own, with no per-account chain state.
    #[arg(long, conflicts_with = "state")]
    stateless: bool,
    /// Keep the chain state in DIR/chain-state across runs (read before, written after).
    #[arg(long, value_name = "DIR")]
    state: Option<PathBuf>,
}

/// A verifier of this command: the documents' keys, chain state shared or none.
type CliVerifier<'d> = Verifier<DocKeys<'d>, Box<dyn ChainStore + Send>>;

/// The chain state file under `--state DIR`.
const STATE_FILE: &str = "chain-state";

fn load_state(dir: &std::path::Path) -> anyhow::Result<SharedChain> {
    let path = dir.join(STATE_FILE);
    match std::fs::read(&path) {
        Ok(bytes) => SharedChain::decode(&bytes)
            .with_context(|| format!("reading chain state {}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(SharedChain::new()),
        Err(e) => Err(anyhow::anyhow!(
            "reading chain state {}: {e}",
            path.display()
        )),
    }
}

/// Writes the state durably: a temporary file, fsynced, renamed over the old one, the directory
/// fsynced (a crash leaves the old state or the new one, never half of one).
fn save_state(dir: &std::path::Path, chain: &SharedChain) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)
        .map_err(|e| anyhow::anyhow!("creating state directory {}: {e}", dir.display()))?;
    let path = dir.join(STATE_FILE);
    let tmp = dir.join(format!("{STATE_FILE}.tmp"));
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&chain.encode())?;
        f.sync_all()?;
        std::fs::rename(&tmp, &path)?;
        std::fs::File::open(dir)?.sync_all()
    };
    write().map_err(|e| anyhow::anyhow!("writing chain state {}: {e}", path.display()))
}

/// Lines printed per verdict without `--json`; the rest are counted.
pub const ERROR_LINES: u64 = 20;

/// Frames per batch: large enough that the per-batch barrier costs nothing (~0.3 s of work).
const BATCH: usize = 8192;

/// DIDs the router remembers before it starts afresh (with fresh verifiers): ~20 MB of map.
const MAX_OWNED: usize = 1 << 18;

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(args.threads > 0, "--threads must be at least 1");
    let file = super::read_file(&args.file)?;
    let frames = super::corpus_frames(&args.file, &file)?;
    let docs = super::load_did_docs(&args.did_docs)?;
    let keys = DocKeys(&docs);
    let chain = std::sync::Arc::new(match &args.state {
        Some(dir) => load_state(dir)?,
        None => SharedChain::new(),
    });
    let new_verifier = || -> CliVerifier<'_> {
        let store: Box<dyn ChainStore + Send> = if args.stateless {
            Box::new(NoChain)
        } else {
            Box::new(chain.clone())
        };
        Verifier::with_chain(keys, store)
    };
    let start = Instant::now();

    let mut verifiers: Vec<CliVerifier<'_>> = (0..args.threads).map(|_| new_verifier()).collect();
    let mut router = Router::new(args.threads);
    let mut stdout = out::stdout();
    let mut stderr = std::io::BufWriter::new(std::io::stderr().lock());
    let mut lines: Vec<Option<(Verdict, String)>> = Vec::new();
    // Lines printed per verdict (without --json).
    let mut printed: HashMap<Verdict, u64> = HashMap::new();
    // Counts of the verifiers retired when the router started afresh.
    let mut counts = VerdictCounts::new();
    for batch in frames.chunks(BATCH) {
        if router.owned() > MAX_OWNED {
            router.forget();
            for v in &mut verifiers {
                counts.merge(v.counts());
                *v = new_verifier();
            }
        }
        let shares = router.route(batch);
        lines.clear();
        lines.resize(batch.len(), None);
        let results = run_shares(&mut verifiers, &shares, batch, args.json);
        for (i, line) in results.into_iter().flatten() {
            lines[i] = Some(line);
        }
        for (verdict, line) in lines.iter().flatten() {
            if args.json {
                out::line(&mut stdout, line.as_bytes())?;
                continue;
            }
            let n = printed.entry(*verdict).or_default();
            if *n < ERROR_LINES {
                *n += 1;
                writeln!(stderr, "{line}")?;
                if *n == ERROR_LINES {
                    writeln!(
                        stderr,
                        "(further '{verdict}' frames are counted, not printed)"
                    )?;
                }
            }
        }
    }
    stdout.flush()?;

    for v in &verifiers {
        counts.merge(v.counts());
    }
    drop(verifiers);
    if let Some(dir) = &args.state {
        save_state(dir, &chain)?;
    }
    for (v, n) in counts.iter() {
        let shown = printed.get(&v).copied().unwrap_or(0);
        if !args.json && n > shown && shown == ERROR_LINES {
            writeln!(stderr, "{} more '{v}' frames not printed", n - shown)?;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    writeln!(
        stderr,
        "verified {} frames in {:.3} s ({:.0} frames/s, {} thread{}): {counts}",
        counts.total(),
        secs,
        counts.total() as f64 / secs.max(1e-9),
        args.threads,
        if args.threads == 1 { "" } else { "s" },
    )?;
    stderr.flush()?;
    Ok(if counts.failed() > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// Verifies each thread's share (frame indices within `batch`, ascending) on its own verifier.
/// Returns, per thread, `(index in batch, (verdict, line))` for every frame to print: with `json`
/// every frame; otherwise the first [`ERROR_LINES`] frames of each failing verdict in the share
/// (a superset of the batch's first [`ERROR_LINES`] of each verdict in frame order, which is all
/// `run` may print; formatting a line for every one of millions of broken frames cost seconds).
fn run_shares(
    verifiers: &mut [CliVerifier<'_>],
    shares: &[Vec<usize>],
    batch: &[CorpusFrame<'_>],
    json: bool,
) -> Vec<Vec<(usize, (Verdict, String))>> {
    let work = |v: &mut CliVerifier<'_>, share: &[usize]| -> Vec<(usize, (Verdict, String))> {
        let mut out = Vec::with_capacity(if json { share.len() } else { 0 });
        let mut lines: HashMap<Verdict, u64> = HashMap::new();
        for &i in share {
            let f = &batch[i];
            let r = v.check(f.bytes);
            if json {
                out.push((i, (r.verdict, json_line(f.index, &r))));
            } else if let Some(why) = &r.failure {
                let n = lines.entry(r.verdict).or_default();
                if *n < ERROR_LINES {
                    *n += 1;
                    let line = format!(
                        "frame {} at byte {}: {}: {why}",
                        f.index, f.offset, r.verdict
                    );
                    out.push((i, (r.verdict, line)));
                }
            }
        }
        out
    };
    if verifiers.len() == 1 {
        return vec![work(&mut verifiers[0], &shares[0])];
    }
    std::thread::scope(|s| {
        let handles: Vec<_> = verifiers
            .iter_mut()
            .zip(shares)
            .map(|(v, share)| s.spawn(move || work(v, share)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    })
}

/// `{"index","seq","did","kind","verdict","reason"}`.
fn json_line(index: usize, r: &Report<'_>) -> String {
    let mut out = Vec::with_capacity(160);
    out.extend_from_slice(b"{\"index\":");
    write_json_int(&mut out, index as i64);
    out.extend_from_slice(b",\"seq\":");
    match r.seq {
        Some(seq) => write_json_int(&mut out, seq),
        None => out.extend_from_slice(b"null"),
    }
    out.extend_from_slice(b",\"did\":");
    match r.did {
        Some(d) => write_json_string(&mut out, d),
        None => out.extend_from_slice(b"null"),
    }
    out.extend_from_slice(b",\"kind\":\"");
    out.extend_from_slice(r.kind.as_bytes());
    out.extend_from_slice(b"\",\"verdict\":\"");
    out.extend_from_slice(r.verdict.as_str().as_bytes());
    out.extend_from_slice(b"\",\"reason\":");
    match &r.failure {
        Some(why) => write_json_string(&mut out, &why.to_string()),
        None => out.extend_from_slice(b"null"),
    }
    out.push(b'}');
    // Built from JSON-escaped strings and ASCII only.
    String::from_utf8_lossy(&out).into_owned()
}

/// Which thread owns which DID (until [`Router::forget`]), and a scratch arena per thread.
#[derive(Debug)]
struct Router {
    owner: HashMap<String, usize>,
    arenas: Vec<Arena>,
}

/// Estimated cost of a frame, in nanoseconds: a signature check for commits and syncs (~30 us),
/// plus hashing and decoding its bytes (~4 ns a byte).
fn cost(bytes: usize, signed: bool) -> u64 {
    (if signed { 30_000 } else { 1_000 }) + 4 * bytes as u64
}

impl Router {
    fn new(threads: usize) -> Router {
        Router {
            owner: HashMap::new(),
            arenas: (0..threads).map(|_| Arena::new()).collect(),
        }
    }

    /// Number of DIDs with an owner.
    fn owned(&self) -> usize {
        self.owner.len()
    }

    /// Forgets every owner. The caller must empty the verifiers' key caches with it: a DID may
    /// then be given to another thread.
    fn forget(&mut self) {
        self.owner = HashMap::new();
    }

    /// Splits a batch into per-thread shares of frame indices (ascending within each share).
    fn route(&mut self, batch: &[CorpusFrame<'_>]) -> Vec<Vec<usize>> {
        let n = self.arenas.len();
        if n == 1 {
            return vec![(0..batch.len()).collect()];
        }
        let peeks = self.peek_dids(batch);
        let did_of = |i: usize| peeks[i].1.as_ref().map(|r| &batch[i].bytes[r.clone()]);

        // Load of DIDs already owned; cost of each new DID in this batch.
        let mut load = vec![0u64; n];
        let mut new: HashMap<&[u8], u64> = HashMap::new();
        for (i, f) in batch.iter().enumerate() {
            let Some(did) = did_of(i) else { continue };
            let c = cost(f.bytes.len(), peeks[i].0);
            match std::str::from_utf8(did)
                .ok()
                .and_then(|d| self.owner.get(d))
            {
                Some(&t) => load[t] += c,
                None => *new.entry(did).or_default() += c,
            }
        }
        // Largest first onto the least-loaded thread.
        let mut new: Vec<(&[u8], u64)> = new.into_iter().collect();
        new.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        for (did, c) in new {
            let t = least(&load);
            load[t] += c;
            self.owner
                .insert(String::from_utf8_lossy(did).into_owned(), t);
        }

        let mut shares = vec![Vec::with_capacity(batch.len() / n + 1); n];
        for (i, f) in batch.iter().enumerate() {
            let t = match did_of(i)
                .and_then(|d| std::str::from_utf8(d).ok())
                .and_then(|d| self.owner.get(d))
            {
                Some(&t) => t,
                None => {
                    // No DID (info, error, unreadable frames): wherever there is room.
                    let t = least(&load);
                    load[t] += cost(f.bytes.len(), false);
                    t
                }
            };
            shares[t].push(i);
        }
        shares
    }

    /// Whether each frame carries a signed commit, and its DID as a byte range within the frame,
    /// read in parallel.
    fn peek_dids(&mut self, batch: &[CorpusFrame<'_>]) -> Vec<(bool, Option<Range<usize>>)> {
        let chunk = batch.len().div_ceil(self.arenas.len()).max(1);
        std::thread::scope(|s| {
            let handles: Vec<_> = self
                .arenas
                .iter_mut()
                .zip(batch.chunks(chunk))
                .map(|(arena, frames)| {
                    s.spawn(move || {
                        frames
                            .iter()
                            .map(|f| {
                                let p = peek(arena, f.bytes);
                                let signed = matches!(p.kind, "commit" | "sync");
                                let did = p.did.and_then(|did| {
                                    riptide_firehose::verify::range_within(f.bytes, did.as_bytes())
                                });
                                (signed, did)
                            })
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            handles
                .into_iter()
                .flat_map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                .collect()
        })
    }
}

fn least(load: &[u64]) -> usize {
    load.iter()
        .enumerate()
        .min_by_key(|&(_, l)| *l)
        .map_or(0, |(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An `#identity` frame of `did` (enough for routing).
    fn identity(did: &str) -> Vec<u8> {
        let mut f = vec![0xa2, 0x61, b't', 0x69];
        f.extend_from_slice(b"#identity");
        f.extend_from_slice(&[
            0x62,
            b'o',
            b'p',
            0x01,
            0xa1,
            0x63,
            b'd',
            b'i',
            b'd',
            0x60 + did.len() as u8,
        ]);
        f.extend_from_slice(did.as_bytes());
        f
    }

    /// `n` `#identity` frames, frame `i` of `did:plc:{i % 7}`: 7 DIDs, each more than once.
    fn identities(n: usize) -> Vec<Vec<u8>> {
        (0..n)
            .map(|i| identity(&format!("did:plc:{}", i % 7)))
            .collect()
    }

    /// `bytes` as the corpus frames the router takes, indexed in order.
    fn corpus_frames(bytes: &[Vec<u8>]) -> Vec<CorpusFrame<'_>> {
        bytes
            .iter()
            .enumerate()
            .map(|(index, b)| CorpusFrame {
                index,
                offset: 0,
                bytes: b,
            })
            .collect()
    }

    #[test]
    fn each_did_stays_on_one_thread_and_shares_are_ordered_and_complete() {
        let bytes = identities(60);
        let frames = corpus_frames(&bytes);
        let mut router = Router::new(3);
        let mut owner: HashMap<String, usize> = HashMap::new();
        for batch in frames.chunks(25) {
            let shares = router.route(batch);
            assert_eq!(shares.len(), 3);
            let mut all: Vec<usize> = shares.concat();
            all.sort_unstable();
            assert_eq!(all, (0..batch.len()).collect::<Vec<_>>());
            for (t, share) in shares.iter().enumerate() {
                assert!(share.windows(2).all(|w| w[0] < w[1]));
                for &i in share {
                    let did = format!("did:plc:{}", batch[i].index % 7);
                    assert_eq!(*owner.entry(did).or_insert(t), t);
                }
            }
            assert!(
                shares.iter().all(|s| !s.is_empty()),
                "7 DIDs spread over 3 threads"
            );
        }
    }

    #[test]
    fn the_owner_map_counts_dids_and_forgets_them() {
        let bytes = identities(20);
        let frames = corpus_frames(&bytes);
        let mut router = Router::new(2);
        router.route(&frames);
        assert_eq!(router.owned(), 7);
        router.route(&frames);
        assert_eq!(router.owned(), 7, "known DIDs are not added again");
        router.forget();
        assert_eq!(router.owned(), 0);
        let mut all = router.route(&frames).concat();
        all.sort_unstable();
        assert_eq!(all, (0..frames.len()).collect::<Vec<_>>());
        assert_eq!(router.owned(), 7);
    }

    #[test]
    fn json_line_fields() {
        let r = Report {
            kind: "commit",
            seq: Some(5),
            did: Some("did:plc:x"),
            verdict: riptide_firehose::verify::Verdict::Ok,
            failure: None,
        };
        assert_eq!(
            json_line(3, &r),
            r#"{"index":3,"seq":5,"did":"did:plc:x","kind":"commit","verdict":"ok","reason":null}"#
        );
    }
}
