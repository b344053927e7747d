//! `riptide bench …`: benchmarks, per the methodology of `shared/docs/formats.md`.
//!
//! `bench decode` times full decoding passes over a corpus (header → payload → CAR with SHA-256
//! per block → every block as DAG-CBOR), 2 warm-up and 5 measured passes by default, and reports
//! median, min and max. In verified mode it also runs, in the same process and the same way, the
//! *SHA-256 bound*: passes that only hash every block's bytes — the floor under verified decoding —
//! alternating with the decode passes round by round (in swapped order every other round), and
//! reports the ratio of the two medians and, less moved by a machine whose speed changes from one
//! second to the next, the median of the ratios within rounds. Frames go through
//! `FrameDecoder::decode_batch` (CAR blocks of up to sixteen frames hashed together, the fastest
//! verified path); `--per-frame` measures `FrameDecoder::decode` one frame at a time instead.
//! Each thread keeps its decoder across passes.
//!
//! `bench sigs` times signature verification over a signature corpus (`*.sigs`) in the three tiers
//! of atproto-bench, each a pass over every entry: `full` (decode the signed commit, strip `sig`,
//! re-encode, SHA-256, verify, with the key parsed from its bytes every time), `crypto` (key parsed
//! every time, SHA-256 and verify over pre-computed unsigned bytes) and `preparsed` (SHA-256 and
//! verify with keys parsed beforehand). Two more put them in context: `full-cached` is `full` with
//! keys from a per-account cache of parsed keys, which is what the firehose verifier does (parsing
//! a compressed secp256k1 key costs a square root mod p, a sizeable share of one verification), and
//! `raw` calls libsecp256k1 (or ring for P-256) directly on pre-parsed keys, signatures and digests:
//! the library's own rate, the ceiling for every tier. Tiers run interleaved, round by round, so
//! their ratios hold on a noisy machine. Verifies/s.
//!
//! `bench repo` times [`riptide_repo::verify_repo`] on a repository export, phase by phase: the
//! compute cost of trusting a repository (CAR with SHA-256 per block, signature, MST walk, MST
//! rebuild), and one SHA-256 pass over the CAR in each round (the bound), with the ratio of the
//! medians and the median of the ratios within rounds.
//!
//! Machines are noisy: compare ratios measured within one run, not absolute figures across runs.

use std::hint::black_box;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use riptide_crypto::{Curve, PublicKey};
use riptide_firehose::corpus::write_frames;
use riptide_firehose::{DecodeOptions, FrameDecoder};
use riptide_repo::{verify_repo, Commit};
use sha2::{Digest, Sha256};

use crate::out;

#[derive(clap::Subcommand, Debug)]
pub enum Bench {
    /// Decode a frame corpus repeatedly and report frames/s and MB/s.
    Decode(DecodeArgs),
    /// Signature verification tiers (full, crypto, preparsed) over a signature corpus: verifies/s.
    Sigs(SigsArgs),
    /// Verify a repository export repeatedly: per-phase times (car, signature, walk, rebuild).
    Repo(RepoArgs),
    /// `riptide serve`: verified ingest events/s, replay to one consumer events/s, and resident
    /// memory with many live subscribers.
    Serve(super::bench_serve::ServeArgs),
    /// Resync throughput against `riptide sim`: repositories/s and MB/s fetched and verified.
    Resync(super::bench_resync::ResyncArgs),
    /// The store as Jetstream v2 `.jss` rows (issue 38): bytes/event against today's v1 JSON
    /// blocks, and v1 JSON rendered again from the rows (events/s, checked byte for byte).
    Rows(super::bench_rows::RowsArgs),
    /// Backfill throughput against `riptide sim` without rate limits, and its CPU per GB
    /// against `riptide repo verify`'s on the same repositories.
    Backfill(super::bench_backfill::BackfillArgs),
    /// Jetstream v2's archive reader (issue 38): `.jss` segments decoded with every record's CID
    /// computed, events/s, against the Python `atproto` SDK's reader with `--python`.
    Archive(super::bench_archive::ArchiveArgs),
}

#[derive(clap::Args, Debug)]
pub struct DecodeArgs {
    /// Corpus file (format of shared/docs/formats.md).
    file: PathBuf,
    /// Skip the SHA-256 check of CAR blocks.
    #[arg(long)]
    no_verify: bool,
    #[command(flatten)]
    runs: Passes,
    /// Worker threads; frames are split into contiguous chunks, one decoder per thread.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Decode frame by frame (`FrameDecoder::decode`) instead of in batches
    /// (`FrameDecoder::decode_batch`, which hashes several frames' blocks together).
    #[arg(long)]
    per_frame: bool,
    /// Repeat the corpus this many times in memory (copies, so caches see real sizes).
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// One JSON object on stdout.
    #[arg(long)]
    json: bool,
}

/// Warm-up and measured passes: the same flags and defaults (formats.md's 2 and 5) for every
/// bench here.
#[derive(clap::Args, Debug, Clone, Copy)]
pub struct Passes {
    /// Warm-up passes (not measured).
    #[arg(long, default_value_t = 2)]
    warmup: usize,
    /// Measured passes.
    #[arg(long, default_value_t = 5)]
    passes: usize,
}

impl Passes {
    pub(super) fn check(&self) -> anyhow::Result<()> {
        anyhow::ensure!(self.passes > 0, "--passes must be at least 1");
        Ok(())
    }

    /// Warm-up passes (for a bench that hands the counts to another program).
    pub(super) fn warmup(&self) -> usize {
        self.warmup
    }

    /// Measured passes.
    pub(super) fn passes(&self) -> usize {
        self.passes
    }

    /// [`Passes::time`] for rounds of two passes whose times are compared, `a` then `b` in even
    /// rounds and `b` then `a` in odd ones: whichever pass runs second in a round runs ~3% faster
    /// on some machines (`docs/gotchas.md`), so a fixed order would bias their ratio.
    fn time_pairs(
        &self,
        mut a: impl FnMut() -> f64,
        mut b: impl FnMut() -> f64,
    ) -> Vec<(f64, f64)> {
        let mut round = |i: usize| {
            if i.is_multiple_of(2) {
                let ta = a();
                (ta, b())
            } else {
                let tb = b();
                (a(), tb)
            }
        };
        for i in 0..self.warmup {
            round(i);
        }
        (0..self.passes).map(round).collect()
    }

    /// Runs `pass` `warmup` times, then `passes` times; what the measured passes returned.
    pub(super) fn time(&self, mut pass: impl FnMut() -> f64) -> Vec<f64> {
        for _ in 0..self.warmup {
            pass();
        }
        (0..self.passes).map(|_| pass()).collect()
    }
}

pub fn run(b: Bench) -> anyhow::Result<ExitCode> {
    match b {
        Bench::Decode(a) => decode(a),
        Bench::Sigs(a) => sigs(a),
        Bench::Repo(a) => repo(a),
        Bench::Serve(a) => super::bench_serve::run(a),
        Bench::Resync(a) => super::bench_resync::run(a),
        Bench::Rows(a) => super::bench_rows::run(a),
        Bench::Backfill(a) => super::bench_backfill::run(a),
        Bench::Archive(a) => super::bench_archive::run(a),
    }
}

/// `a / b`, or 0 where `b` is not positive (a pass too short to time).
fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        0.0
    }
}

/// min, median, max of a sample.
#[derive(Clone, Copy, Debug)]
pub struct Stats {
    pub min: f64,
    pub median: f64,
    pub max: f64,
}

impl Stats {
    pub fn of(mut xs: Vec<f64>) -> Stats {
        xs.sort_by(|a, b| a.total_cmp(b));
        let n = xs.len();
        let median = if n == 0 {
            0.0
        } else if n % 2 == 1 {
            xs[n / 2]
        } else {
            (xs[n / 2 - 1] + xs[n / 2]) / 2.0
        };
        Stats {
            min: xs.first().copied().unwrap_or(0.0),
            median,
            max: xs.last().copied().unwrap_or(0.0),
        }
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({"min": round(self.min), "median": round(self.median), "max": round(self.max)})
    }
}

/// A max/min spread of passes above this is reported: figures that swing this much say more about
/// the machine than about the code.
pub const WIDE_SPREAD: f64 = 1.3;

/// A 1-minute load average above this means something besides the benchmark was running (the
/// threshold `bench/run` uses).
pub const BUSY_LOAD: f64 = 1.5;

/// The 1-minute load average (`/proc/loadavg`), where the system has one.
pub fn load_avg() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The warning for a run whose passes spread from `s.min` to `s.max` under the load before and
/// after it, or `None` when the run looks steady.
pub fn spread_warning(s: &Stats, load: (Option<f64>, Option<f64>)) -> Option<String> {
    let spread = if s.min > 0.0 { s.max / s.min } else { 1.0 };
    let busy = [load.0, load.1]
        .into_iter()
        .flatten()
        .any(|l| l > BUSY_LOAD);
    if spread <= WIDE_SPREAD && !busy {
        return None;
    }
    let fmt = |l: Option<f64>| l.map_or_else(|| "?".to_owned(), |l| format!("{l:.2}"));
    Some(format!(
        "warning: passes spread {spread:.2}x from min to max (load {} before, {} after): {}",
        fmt(load.0),
        fmt(load.1),
        if busy {
            "the machine was busy; measure again on a quiet machine"
        } else {
            "the figures are unsteady; use more --passes or a larger --repeat"
        }
    ))
}

fn round(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// Runs `f` over `n` contiguous chunks of `items` on `n` threads (inline when n = 1).
fn par_chunks<T: Sync, R: Send>(items: &[T], n: usize, f: impl Fn(&[T]) -> R + Sync) -> Vec<R> {
    if n <= 1 {
        return vec![f(items)];
    }
    let chunk = items.len().div_ceil(n).max(1);
    std::thread::scope(|s| {
        let handles: Vec<_> = items.chunks(chunk).map(|c| s.spawn(|| f(c))).collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    })
}

/// [`par_chunks`] with one piece of per-thread state each (`states.len()` threads, inline when
/// there is one): state that outlives the threads, such as a warm decoder.
fn par_chunks_with<T: Sync, S: Send, R: Send>(
    items: &[T],
    states: &mut [S],
    f: impl Fn(&mut S, &[T]) -> R + Sync,
) -> Vec<R> {
    let n = states.len().max(1);
    let chunk = items.len().div_ceil(n).max(1);
    if let [state] = states {
        return vec![f(state, items)];
    }
    std::thread::scope(|s| {
        let handles: Vec<_> = items
            .chunks(chunk)
            .zip(states.iter_mut())
            .map(|(c, st)| {
                let f = &f;
                s.spawn(move || f(st, c))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    })
}

fn decode(a: DecodeArgs) -> anyhow::Result<ExitCode> {
    a.runs.check()?;
    anyhow::ensure!(a.threads > 0, "--threads must be at least 1");
    let file = super::read_file(&a.file)?;
    let corpus = if a.repeat > 1 {
        let frames = super::corpus_frames(&a.file, &file)?;
        let reps = (0..a.repeat).flat_map(|_| frames.iter().map(|f| f.bytes));
        write_frames(reps.collect::<Vec<_>>().into_iter())
    } else {
        file
    };
    let frames: Vec<&[u8]> = super::corpus_frames(&a.file, &corpus)?
        .iter()
        .map(|f| f.bytes)
        .collect();
    let bytes: usize = frames.iter().map(|f| f.len()).sum();
    let opts = if a.no_verify {
        DecodeOptions::unverified()
    } else {
        DecodeOptions::default()
    };

    // Once, unmeasured: equal-work counts, and every block's bytes for the SHA-256 bound.
    // (Frames borrow the decoder, so block positions are kept as offsets and sliced afterwards.)
    let mut block_spans: Vec<(usize, usize, usize)> = Vec::new();
    let (mut blocks, mut errors) = (0usize, 0usize);
    let mut dec = FrameDecoder::with_options(opts);
    for (i, f) in frames.iter().enumerate() {
        match dec.decode(f) {
            Ok(frame) => {
                blocks += frame.block_count();
                if let Some(car) = frame.car() {
                    let base = f.as_ptr() as usize;
                    block_spans.extend(
                        car.blocks()
                            .map(|b| (i, b.data.as_ptr() as usize - base, b.data.len())),
                    );
                }
            }
            Err(_) => errors += 1,
        }
    }
    let blocks_data: Vec<&[u8]> = block_spans
        .iter()
        .map(|&(i, s, n)| &frames[i][s..s + n])
        .collect();

    // One decoder per thread, kept across passes: a pass measures decoding, not the warm-up of
    // a decoder's storage (nor the allocator's locks when several threads warm up at once).
    let per_frame = a.per_frame;
    let mut decoders: Vec<FrameDecoder> = (0..a.threads)
        .map(|_| FrameDecoder::with_options(opts))
        .collect();
    let decode_pass = || -> f64 {
        let start = Instant::now();
        let counts = par_chunks_with(&frames, &mut decoders, |dec, chunk| {
            let mut n = 0usize;
            if per_frame {
                for f in chunk {
                    if let Ok(frame) = dec.decode(f) {
                        n += frame.block_count();
                    }
                }
            } else {
                dec.decode_batch(chunk, |_, r| {
                    if let Ok(frame) = r {
                        n += frame.block_count();
                    }
                });
            }
            n
        });
        black_box(counts);
        start.elapsed().as_secs_f64()
    };
    let sha_pass = || -> f64 {
        let start = Instant::now();
        let sinks = par_chunks(&blocks_data, a.threads, |chunk| {
            let mut sink = 0u8;
            for b in chunk {
                sink ^= Sha256::digest(b)[0];
            }
            sink
        });
        black_box(sinks);
        start.elapsed().as_secs_f64()
    };

    let load_before = load_avg();
    // Verified: a decode pass and a bound pass alternate, round by round, so that load from
    // other work on the machine falls on both and their ratio holds.
    let (times, sha_times) = if a.no_verify {
        (a.runs.time(decode_pass), None)
    } else {
        let pairs = a.runs.time_pairs(decode_pass, sha_pass);
        let (d, s): (Vec<f64>, Vec<f64>) = pairs.into_iter().unzip();
        (d, Some(s))
    };
    let fps = Stats::of(times.iter().map(|t| frames.len() as f64 / t).collect());
    let mbps = Stats::of(times.iter().map(|t| bytes as f64 / t / 1e6).collect());
    // The bound's rate, and the ratio within each round (where a slow phase of the machine falls
    // on both passes).
    let bound = sha_times.map(|t| {
        let sha = Stats::of(t.iter().map(|t| frames.len() as f64 / t).collect());
        let paired = Stats::of(t.iter().zip(&times).map(|(s, d)| ratio(*s, *d)).collect());
        (sha, paired)
    });

    let load = (load_before, load_avg());
    let warning = spread_warning(&fps, load);
    if let Some(w) = &warning {
        eprintln!("riptide bench decode: {w}");
    }
    let mut report = serde_json::json!({
        "file": a.file.display().to_string(),
        "frames": frames.len(),
        "load": {"before": load.0, "after": load.1},
        "spread": round(if fps.min > 0.0 { fps.max / fps.min } else { 1.0 }),
        "bytes": bytes,
        "blocks": blocks,
        "blocks_per_frame": round(blocks as f64 / frames.len().max(1) as f64),
        "errors": errors,
        "verified": !a.no_verify,
        "threads": a.threads,
        "api": if a.per_frame { "per-frame" } else { "batch" },
        "warmup": a.runs.warmup,
        "passes": a.runs.passes,
        "fps": fps.json(),
        "mbps": mbps.json(),
        "machine": machine(),
        "date": utc_now(),
    });
    if let Some((sha, paired)) = bound {
        report["sha_bound_fps"] = sha.json();
        report["ratio_to_sha_bound"] =
            serde_json::json!(round(fps.median / sha.median * 100.0) / 100.0);
        report["ratio_to_sha_bound_paired"] = paired.json();
    }
    print_report(a.json, &report, errors, |stdout| {
        writeln!(
            stdout,
            "frames {} ({:.1} MB), blocks {blocks}, errors {errors}, {} thread(s), {}, {} passes",
            frames.len(),
            bytes as f64 / 1e6,
            a.threads,
            if a.per_frame {
                "frame by frame"
            } else {
                "in batches"
            },
            a.runs.passes
        )?;
        writeln!(
            stdout,
            "decode{}: {:.0} frames/s (min {:.0}, max {:.0}), {:.0} MB/s",
            if a.no_verify {
                " (unverified)"
            } else {
                " (verified)"
            },
            fps.median,
            fps.min,
            fps.max,
            mbps.median
        )?;
        if let Some((sha, paired)) = bound {
            writeln!(
                stdout,
                "SHA-256 bound: {:.0} frames/s (min {:.0}, max {:.0}); ratio {:.2}; within rounds {:.2} (min {:.2}, max {:.2})",
                sha.median,
                sha.min,
                sha.max,
                fps.median / sha.median,
                paired.median,
                paired.min,
                paired.max
            )?;
        }
        writeln!(stdout, "{}", sha_kernels_line())?;
        Ok(())
    })
}

#[derive(clap::Args, Debug)]
pub struct SigsArgs {
    /// Signature corpus (formats.md `*.sigs`; see `riptide corpus sigs`).
    file: PathBuf,
    #[command(flatten)]
    runs: Passes,
    /// Repeat the entries this many times per pass (longer passes, steadier figures).
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// One JSON object on stdout.
    #[arg(long)]
    json: bool,
}

/// One signature-corpus entry with everything the cheaper tiers take as given.
struct Prepared<'a> {
    curve: Curve,
    signed: &'a [u8],
    pubkey: &'a [u8],
    unsigned: Vec<u8>,
    sig: Vec<u8>,
    key: PublicKey,
    raw: RawEntry,
}

/// The same entry in the signature library's own types, for the `raw` baseline: what the
/// library costs when called directly, with nothing of riptide in between.
enum RawEntry {
    Secp256k1 {
        key: secp256k1::PublicKey,
        sig: secp256k1::ecdsa::Signature,
        digest: [u8; 32],
    },
    P256 {
        point: Vec<u8>,
    },
}

fn prepare<'a>(e: &'a super::corpus::SigEntry) -> Option<Prepared<'a>> {
    let commit = Commit::decode(&e.signed).ok()?;
    let key = PublicKey::from_sec1(e.curve, &e.pubkey).ok()?;
    commit.verify_signature(&key).ok()?;
    let mut unsigned = Vec::new();
    commit.unsigned_bytes(&mut unsigned);
    let sig = commit.sig().to_vec();
    let raw = match e.curve {
        Curve::Secp256k1 => RawEntry::Secp256k1 {
            key: secp256k1::PublicKey::from_slice(&e.pubkey).ok()?,
            sig: secp256k1::ecdsa::Signature::from_compact(&sig).ok()?,
            digest: Sha256::digest(&unsigned).into(),
        },
        Curve::P256 => RawEntry::P256 {
            point: key.to_uncompressed_sec1().to_vec(),
        },
    };
    Some(Prepared {
        curve: e.curve,
        signed: &e.signed,
        pubkey: &e.pubkey,
        unsigned,
        sig,
        key,
        raw,
    })
}

/// Times several tiers over the same work, interleaved: each round runs every tier once, so a
/// load that comes and goes on a shared machine falls on all tiers alike and their ratios stay
/// meaningful. `tiers` return how many entries verified; a pass that verifies fewer than
/// `expect` is a bug of the benchmark. Returns verifies/s per tier.
fn time_interleaved(
    warmup: usize,
    passes: usize,
    expect: usize,
    tiers: &mut [&mut dyn FnMut() -> usize],
) -> anyhow::Result<Vec<Stats>> {
    let mut rates = vec![Vec::with_capacity(passes); tiers.len()];
    for round in 0..warmup + passes {
        for (tier, rates) in tiers.iter_mut().zip(rates.iter_mut()) {
            let start = Instant::now();
            let ok = tier();
            let t = start.elapsed().as_secs_f64();
            anyhow::ensure!(ok == expect, "a pass verified {ok} of {expect} entries");
            if round >= warmup {
                rates.push(expect as f64 / t.max(1e-12));
            }
        }
    }
    Ok(rates.into_iter().map(Stats::of).collect())
}

fn sigs(a: SigsArgs) -> anyhow::Result<ExitCode> {
    a.runs.check()?;
    anyhow::ensure!(a.repeat > 0, "--repeat must be at least 1");
    let file = super::read_file(&a.file)?;
    let entries = super::corpus::read_sigs(&file)?;
    let prepared: Vec<Prepared<'_>> = entries.iter().filter_map(prepare).collect();
    let errors = entries.len() - prepared.len();
    let p256 = entries.iter().filter(|e| e.curve == Curve::P256).count();
    let work: Vec<&Prepared<'_>> = (0..a.repeat).flat_map(|_| prepared.iter()).collect();
    let n = work.len();

    let mut arena = riptide_cbor::Arena::new();
    let mut buf = Vec::new();
    let mut full = || {
        let mut ok = 0;
        for p in &work {
            let verified = Commit::decode_with(&mut arena, black_box(p.signed))
                .ok()
                .and_then(|c| {
                    let key = PublicKey::from_sec1(p.curve, black_box(p.pubkey)).ok()?;
                    c.verify_signature_with(&key, &mut buf).ok()
                });
            ok += usize::from(verified.is_some());
        }
        ok
    };
    // The verifier's own path: keys come from a per-account cache of parsed keys (here keyed by
    // the key bytes, as the corpus carries no DIDs). The cache outlives the passes, as it outlives
    // commits in a stream: after the warm-up every account has been seen.
    let mut arena2 = riptide_cbor::Arena::new();
    let mut buf2 = Vec::new();
    let mut cache: std::collections::HashMap<&[u8], PublicKey> = std::collections::HashMap::new();
    let mut full_cached = || {
        let mut ok = 0;
        for p in &work {
            let verified = Commit::decode_with(&mut arena2, black_box(p.signed))
                .ok()
                .and_then(|c| {
                    let key = match cache.get(p.pubkey) {
                        Some(k) => k,
                        None => {
                            let k = PublicKey::from_sec1(p.curve, black_box(p.pubkey)).ok()?;
                            cache.entry(p.pubkey).or_insert(k)
                        }
                    };
                    c.verify_signature_with(key, &mut buf2).ok()
                });
            ok += usize::from(verified.is_some());
        }
        ok
    };
    let mut crypto = || {
        let mut ok = 0;
        for p in &work {
            let verified = PublicKey::from_sec1(p.curve, black_box(p.pubkey))
                .ok()
                .and_then(|key| key.verify(black_box(&p.unsigned), &p.sig).ok());
            ok += usize::from(verified.is_some());
        }
        ok
    };
    let mut preparsed = || {
        let mut ok = 0;
        for p in &work {
            ok += usize::from(
                black_box(&p.key)
                    .verify(black_box(&p.unsigned), &p.sig)
                    .is_ok(),
            );
        }
        ok
    };
    let mut raw = || {
        let mut ok = 0;
        for p in &work {
            let verified = match &p.raw {
                RawEntry::Secp256k1 { key, sig, digest } => secp256k1::ecdsa::verify(
                    black_box(sig),
                    secp256k1::Message::from_digest(*black_box(digest)),
                    key,
                )
                .is_ok(),
                RawEntry::P256 { point } => ring::signature::UnparsedPublicKey::new(
                    &ring::signature::ECDSA_P256_SHA256_FIXED,
                    point,
                )
                .verify(black_box(&p.unsigned), &p.sig)
                .is_ok(),
            };
            ok += usize::from(verified);
        }
        ok
    };
    let stats = time_interleaved(
        a.runs.warmup,
        a.runs.passes,
        n,
        &mut [
            &mut full,
            &mut full_cached,
            &mut crypto,
            &mut preparsed,
            &mut raw,
        ],
    )?;
    let names = ["full", "full-cached", "crypto", "preparsed", "raw"];
    let tiers: serde_json::Map<String, serde_json::Value> = names
        .iter()
        .zip(&stats)
        .map(|(n, s)| (n.to_string(), s.json()))
        .collect();
    let (full_s, preparsed_s, raw_s) = (&stats[0], &stats[3], &stats[4]);

    let report = serde_json::json!({
        "file": a.file.display().to_string(),
        "entries": entries.len(),
        "p256": p256,
        "secp256k1": entries.len() - p256,
        "errors": errors,
        "repeat": a.repeat,
        "warmup": a.runs.warmup,
        "passes": a.runs.passes,
        "unit": "verifies/s",
        "tiers": tiers,
        "ratios": {
            "full_over_preparsed": round(full_s.median / preparsed_s.median),
            "full_cached_over_preparsed": round(stats[1].median / preparsed_s.median),
            "preparsed_over_raw": round(preparsed_s.median / raw_s.median),
        },
        "machine": machine(),
        "date": utc_now(),
    });
    print_report(a.json, &report, errors, |stdout| {
        writeln!(stdout, "entries {} (secp256k1 {}, P-256 {p256}), errors {errors}, x{} per pass, {} passes (tiers interleaved)",
            entries.len(), entries.len() - p256, a.repeat, a.runs.passes)?;
        for (name, s) in names.iter().zip(&stats) {
            writeln!(
                stdout,
                "{name:<12} {:>8.0} verifies/s (min {:.0}, max {:.0})",
                s.median, s.min, s.max
            )?;
        }
        writeln!(
            stdout,
            "full/preparsed {:.3}, full-cached/preparsed {:.3}, preparsed/raw {:.3}",
            full_s.median / preparsed_s.median,
            stats[1].median / preparsed_s.median,
            preparsed_s.median / raw_s.median
        )?;
        Ok(())
    })
}

#[derive(clap::Args, Debug)]
pub struct RepoArgs {
    /// A repository CAR (com.atproto.sync.getRepo export).
    file: PathBuf,
    /// The account's signing key (did:key:z…): include the signature check.
    #[arg(long)]
    key: Option<String>,
    #[command(flatten)]
    runs: Passes,
    /// Verify the repository this many times per pass and report the mean per verification
    /// (small repositories take microseconds: one call per pass is mostly timer noise).
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// One JSON object on stdout.
    #[arg(long)]
    json: bool,
}

fn repo(a: RepoArgs) -> anyhow::Result<ExitCode> {
    a.runs.check()?;
    anyhow::ensure!(a.repeat > 0, "--repeat must be at least 1");
    // As `repo verify` reads it (huge pages for a large file): the bound and the verification
    // run over the same buffer.
    let bytes = super::read_file_large(&a.file)?;
    let key = super::repo::key_arg(a.key.as_deref(), None)?.map(|(k, _)| k);
    let first = match verify_repo(&bytes, key.as_ref()) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("{}: {}: {e}", a.file.display(), super::repo::verdict(&e));
            return Ok(ExitCode::from(1));
        }
    };
    for _ in 0..a.runs.warmup {
        black_box(verify_repo(black_box(&bytes), key.as_ref()).is_ok());
    }
    // Each round also hashes the CAR's bytes once: the SHA-256 bound, the floor under verifying a
    // repository (every byte must be hashed), measured beside it so the ratio holds on a noisy box.
    let mut phases: [Vec<f64>; 6] = Default::default();
    let mut paired = Vec::with_capacity(a.runs.passes);
    for _ in 0..a.runs.passes {
        let start = Instant::now();
        black_box(Sha256::digest(black_box(&bytes[..])));
        let sha = start.elapsed().as_secs_f64() * 1e6;
        let mut sums = [0f64; 5];
        for _ in 0..a.repeat {
            let start = Instant::now();
            let r = verify_repo(black_box(&bytes), key.as_ref())?;
            let total = start.elapsed();
            let t = r.timings;
            for (s, d) in sums
                .iter_mut()
                .zip([t.car, t.signature, t.walk, t.rebuild, total])
            {
                *s += d.as_secs_f64() * 1e6;
            }
        }
        // car, signature, walk, rebuild, total: this round's means.
        let means = sums.map(|s| s / a.repeat as f64);
        paired.push(ratio(sha, means[4]));
        for (v, s) in phases.iter_mut().zip(means.into_iter().chain([sha])) {
            v.push(s);
        }
    }
    let [car, signature, walk, rebuild, total, sha] = phases.map(Stats::of);
    // The ratio within each round, where a slow phase of the machine falls on both.
    let paired = Stats::of(paired);
    let sha_ratio = ratio(sha.median, total.median);
    let peak_rss = peak_rss_bytes();
    let report = serde_json::json!({
        "file": a.file.display().to_string(),
        "bytes": bytes.len(),
        "blocks": first.blocks,
        "records": first.records,
        "mst_nodes": first.mst_nodes,
        "signature_checked": first.signature_checked,
        "warmup": a.runs.warmup,
        "passes": a.runs.passes,
        "repeat": a.repeat,
        "timings_us": {
            "car": car.json(), "signature": signature.json(), "walk": walk.json(),
            "rebuild": rebuild.json(), "total": total.json(),
        },
        "records_per_s": round(first.records as f64 / (total.median / 1e6).max(1e-12)),
        "sha256_bound_us": sha.json(),
        "ratio_to_sha256_bound": round(sha_ratio),
        "ratio_to_sha256_bound_paired": paired.json(),
        "peak_rss_bytes": peak_rss,
        "machine": machine(),
        "date": utc_now(),
    });
    print_report(a.json, &report, 0, |stdout| {
        writeln!(
            stdout,
            "{}: {} records, {} blocks, {} bytes, signature {}, {} passes (median, us)",
            a.file.display(),
            first.records,
            first.blocks,
            bytes.len(),
            if first.signature_checked {
                "checked"
            } else {
                "not checked"
            },
            a.runs.passes
        )?;
        for (name, s) in [
            ("car", car),
            ("signature", signature),
            ("walk", walk),
            ("rebuild", rebuild),
            ("total", total),
        ] {
            let share = if total.median > 0.0 {
                s.median / total.median * 100.0
            } else {
                0.0
            };
            writeln!(
                stdout,
                "{name:<10} {:>12.1} us  {share:>5.1}%  (min {:.1}, max {:.1})",
                s.median, s.min, s.max
            )?;
        }
        writeln!(stdout, "sha256     {:>12.1} us  (one pass over the CAR's bytes; verification runs at {:.2} of it; within rounds {:.2}, min {:.2}, max {:.2})",
            sha.median, sha_ratio, paired.median, paired.min, paired.max)?;
        if let Some(rss) = peak_rss {
            writeln!(
                stdout,
                "peak RSS   {:.1} MB ({:.2}x the CAR)",
                rss as f64 / 1e6,
                rss as f64 / bytes.len() as f64
            )?;
        }
        writeln!(stdout, "{}", sha_kernels_line())?;
        Ok(())
    })
}

/// Prints a benchmark's result: `report` as one JSON object with `--json`, else the lines `text`
/// writes; then the exit code, 1 when `errors` items of the corpus failed (decode, sigs).
fn print_report(
    json: bool,
    report: &serde_json::Value,
    errors: usize,
    text: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> anyhow::Result<ExitCode> {
    let mut stdout = out::stdout();
    if json {
        writeln!(stdout, "{report}")?;
    } else {
        text(&mut stdout)?;
    }
    stdout.flush()?;
    Ok(if errors > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// The process's peak resident set (`VmHWM` of /proc/self/status), where the OS reports one.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// CPU model and core count, for the record.
pub fn machine() -> serde_json::Value {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    serde_json::json!({
        "cpu": cpu, "cores": cores, "os": std::env::consts::OS, "arch": std::env::consts::ARCH,
        "sha_kernels": sha_kernels(),
    })
}

/// The SHA-256 kernels dispatch uses in this process, and the `RIPTIDE_SHA_KERNEL` cap that
/// steered them (see `riptide_sha::cap`): which path a figure measured.
struct ShaKernels {
    cap: &'static str,
    large_batches: &'static str,
    small_batches: &'static str,
    cpu_has: Vec<&'static str>,
}

impl ShaKernels {
    fn now() -> ShaKernels {
        use riptide_sha::Kernel;
        ShaKernels {
            cap: riptide_sha::kernel_cap().map_or("auto", Kernel::name),
            large_batches: Kernel::best_for(usize::MAX).name(),
            small_batches: Kernel::best_for(0).name(),
            cpu_has: Kernel::supported().into_iter().map(Kernel::name).collect(),
        }
    }
}

/// [`ShaKernels`] for a report's `machine`.
pub fn sha_kernels() -> serde_json::Value {
    let k = ShaKernels::now();
    serde_json::json!({
        "cap": k.cap,
        "large_batches": k.large_batches,
        "small_batches": k.small_batches,
        "cpu_has": k.cpu_has,
    })
}

/// [`ShaKernels`] as one line of text.
fn sha_kernels_line() -> String {
    let k = ShaKernels::now();
    format!(
        "SHA-256 kernels: {} for large batches, {} for small (RIPTIDE_SHA_KERNEL={}; CPU has {})",
        k.large_batches,
        k.small_batches,
        k.cap,
        k.cpu_has.join(", ")
    )
}

/// The current UTC time as RFC 3339, to the second (`2026-11-22T09:41:07Z`).
pub fn utc_now() -> String {
    let micros = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() * 1_000_000);
    riptide_syntax::format_utc(micros, riptide_syntax::Precision::Seconds)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_now_is_an_atproto_datetime_to_the_second() {
        let t = utc_now();
        assert_eq!(t.len(), "2026-11-22T09:41:07Z".len(), "{t}");
        assert!(t.ends_with('Z') && !t.contains('.'), "{t}");
        assert!(riptide_syntax::is_valid_datetime(&t), "{t}");
    }

    #[test]
    fn a_wide_spread_or_a_busy_machine_is_warned_about() {
        let steady = Stats {
            min: 100.0,
            median: 110.0,
            max: 120.0,
        };
        assert_eq!(spread_warning(&steady, (Some(0.2), Some(0.3))), None);
        assert_eq!(spread_warning(&steady, (None, None)), None);
        let swinging = Stats {
            min: 100.0,
            median: 180.0,
            max: 260.0,
        };
        let w = spread_warning(&swinging, (Some(0.2), Some(0.3))).unwrap();
        assert!(w.contains("2.60x") && w.contains("more --passes"), "{w}");
        let w = spread_warning(&steady, (Some(3.1), Some(2.0))).unwrap();
        assert!(w.contains("load 3.10 before") && w.contains("busy"), "{w}");
    }
}
