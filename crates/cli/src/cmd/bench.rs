//! `riptide bench …`: benchmarks, per the methodology of `shared/docs/formats.md`.
//!
//! `bench decode` times full decoding passes over a corpus (header → payload → CAR with SHA-256
//! per block → every block as DAG-CBOR), 2 warm-up and 5 measured passes by default, and reports
//! median, min and max. In verified mode it also runs, in the same process and the same way, the
//! *SHA-256 bound*: passes that only hash every block's bytes — the floor under verified decoding —
//! and reports the ratio of the two medians.
//!
//! Machines are noisy: compare ratios measured within one run, not absolute figures across runs.

use std::hint::black_box;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use riptide_firehose::corpus::{split_frames, write_frames};
use riptide_firehose::{DecodeOptions, FrameDecoder};
use sha2::{Digest, Sha256};

use crate::out;

#[derive(clap::Subcommand, Debug)]
pub enum Bench {
    /// Decode a frame corpus repeatedly and report frames/s and MB/s.
    Decode(DecodeArgs),
}

#[derive(clap::Args, Debug)]
pub struct DecodeArgs {
    /// Corpus file (format of shared/docs/formats.md).
    file: PathBuf,
    /// Skip the SHA-256 check of CAR blocks.
    #[arg(long)]
    no_verify: bool,
    /// Warm-up passes (not measured).
    #[arg(long, default_value_t = 2)]
    warmup: usize,
    /// Measured passes.
    #[arg(long, default_value_t = 5)]
    passes: usize,
    /// Worker threads; frames are split into contiguous chunks, one decoder per thread.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Repeat the corpus this many times in memory (copies, so caches see real sizes).
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// One JSON object on stdout.
    #[arg(long)]
    json: bool,
}

pub fn run(b: Bench) -> anyhow::Result<ExitCode> {
    match b {
        Bench::Decode(a) => decode(a),
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
        Stats { min: xs.first().copied().unwrap_or(0.0), median, max: xs.last().copied().unwrap_or(0.0) }
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({"min": round(self.min), "median": round(self.median), "max": round(self.max)})
    }
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
        handles.into_iter().map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))).collect()
    })
}

fn decode(a: DecodeArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(a.passes > 0, "--passes must be at least 1");
    anyhow::ensure!(a.threads > 0, "--threads must be at least 1");
    let file = super::read_file(&a.file)?;
    let corpus = if a.repeat > 1 {
        let frames = split_frames(&file)?;
        let reps = (0..a.repeat).flat_map(|_| frames.iter().map(|f| f.bytes));
        write_frames(reps.collect::<Vec<_>>().into_iter())
    } else {
        file
    };
    let frames: Vec<&[u8]> = split_frames(&corpus)?.iter().map(|f| f.bytes).collect();
    let bytes: usize = frames.iter().map(|f| f.len()).sum();
    let opts = if a.no_verify { DecodeOptions::unverified() } else { DecodeOptions::default() };

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
                    block_spans.extend(car.blocks().map(|b| (i, b.data.as_ptr() as usize - base, b.data.len())));
                }
            }
            Err(_) => errors += 1,
        }
    }
    let blocks_data: Vec<&[u8]> = block_spans.iter().map(|&(i, s, n)| &frames[i][s..s + n]).collect();

    let decode_pass = || -> f64 {
        let start = Instant::now();
        let counts = par_chunks(&frames, a.threads, |chunk| {
            let mut dec = FrameDecoder::with_options(opts);
            let mut n = 0usize;
            for f in chunk {
                if let Ok(frame) = dec.decode(f) {
                    n += frame.block_count();
                }
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

    for _ in 0..a.warmup {
        decode_pass();
    }
    let times: Vec<f64> = (0..a.passes).map(|_| decode_pass()).collect();
    let fps = Stats::of(times.iter().map(|t| frames.len() as f64 / t).collect());
    let mbps = Stats::of(times.iter().map(|t| bytes as f64 / t / 1e6).collect());
    let sha = if a.no_verify {
        None
    } else {
        for _ in 0..a.warmup {
            sha_pass();
        }
        let t: Vec<f64> = (0..a.passes).map(|_| sha_pass()).collect();
        Some(Stats::of(t.iter().map(|t| frames.len() as f64 / t).collect()))
    };

    let mut report = serde_json::json!({
        "file": a.file.display().to_string(),
        "frames": frames.len(),
        "bytes": bytes,
        "blocks": blocks,
        "blocks_per_frame": round(blocks as f64 / frames.len().max(1) as f64),
        "errors": errors,
        "verified": !a.no_verify,
        "threads": a.threads,
        "warmup": a.warmup,
        "passes": a.passes,
        "fps": fps.json(),
        "mbps": mbps.json(),
        "machine": machine(),
        "date": utc_now(),
    });
    if let Some(sha) = sha {
        report["sha_bound_fps"] = sha.json();
        report["ratio_to_sha_bound"] = serde_json::json!(round(fps.median / sha.median * 100.0) / 100.0);
    }
    let mut stdout = out::stdout();
    if a.json {
        writeln!(stdout, "{report}")?;
    } else {
        writeln!(stdout, "frames {} ({:.1} MB), blocks {blocks}, errors {errors}, {} thread(s), {} passes",
            frames.len(), bytes as f64 / 1e6, a.threads, a.passes)?;
        writeln!(stdout, "decode{}: {:.0} frames/s (min {:.0}, max {:.0}), {:.0} MB/s",
            if a.no_verify { " (unverified)" } else { " (verified)" }, fps.median, fps.min, fps.max, mbps.median)?;
        if let Some(sha) = sha {
            writeln!(stdout, "SHA-256 bound: {:.0} frames/s (min {:.0}, max {:.0}); ratio {:.2}",
                sha.median, sha.min, sha.max, fps.median / sha.median)?;
        }
    }
    stdout.flush()?;
    Ok(if errors > 0 { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

/// CPU model and core count, for the record.
pub fn machine() -> serde_json::Value {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("model name")).map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string()))
        .unwrap_or_else(|| "unknown".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    serde_json::json!({"cpu": cpu, "cores": cores, "os": std::env::consts::OS, "arch": std::env::consts::ARCH})
}

/// The current UTC time as RFC 3339 (seconds).
pub fn utc_now() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}
