//! `riptide bench archive FILE|DIR… [--python PY] [--binding-python PY]`: the archive reader's
//! events/s (issue 38: riptide's Rust and Python readers against the Python `atproto` SDK's on
//! the same segments, ≥ 10×).
//!
//! Why a bench of its own: it times exactly what a client does with a downloaded segment — open
//! and verify the file, decompress every block, decode the rows, check each payload is DAG-CBOR
//! and compute each record's CID (`riptide_client::archive::RowDecoder`, the reader `Snapshot`
//! uses) — over `.jss` files in memory, on one thread, no socket. With `--python`, the same
//! files go through the SDK's own functions (`bench/archive_reader.py`: `iter_block_frames`,
//! `decode_block`, `to_messages(with_cid=True)`) in that interpreter, and the two medians are
//! compared; both must count the same events. With `--binding-python`, a third column: riptide's
//! Python binding (`bench/archive_binding.py`: `riptide.read_segment`, every event a dict with its
//! record as Python objects and its CID computed) in that interpreter. Median, min and max of `--passes` after
//! `--warmup`; the load average before and after is printed, since the machine is shared.

use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::time::Instant;

use anyhow::Context;
use riptide_client::archive::RowDecoder;

use super::bench::{load_avg, spread_warning, utc_now, Passes, Stats};

/// The SDK side, run by `--python`.
const PY_READER: &str = include_str!("../../../../bench/archive_reader.py");
/// riptide's Python binding, run by `--binding-python`.
const BINDING_READER: &str = include_str!("../../../../bench/archive_binding.py");
/// The timing loop both Python readers run after their own text.
const PY_HARNESS: &str = include_str!("../../../../bench/archive_harness.py");

#[derive(clap::Args, Debug)]
pub struct ArchiveArgs {
    /// `.jss` segment files, or directories of them (`riptide corpus segments` writes some).
    #[arg(required = true)]
    paths: Vec<PathBuf>,
    #[command(flatten)]
    runs: Passes,
    /// A Python with the `atproto` SDK (e.g. the v2 oracle's venv): time its reader too.
    #[arg(long)]
    python: Option<PathBuf>,
    /// A Python with riptide's binding installed (`pip install ./bindings/python`): time it too.
    #[arg(long)]
    binding_python: Option<PathBuf>,
    /// One JSON object on stdout.
    #[arg(long)]
    json: bool,
}

fn segment_files(paths: &[PathBuf]) -> anyhow::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for p in paths {
        if p.is_dir() {
            let mut v: Vec<PathBuf> = std::fs::read_dir(p)
                .with_context(|| p.display().to_string())?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|f| f.extension().is_some_and(|x| x == "jss"))
                .collect();
            v.sort();
            out.extend(v);
        } else {
            out.push(p.clone());
        }
    }
    anyhow::ensure!(!out.is_empty(), "no .jss files");
    Ok(out)
}

pub fn run(a: ArchiveArgs) -> anyhow::Result<ExitCode> {
    a.runs.check()?;
    let paths = segment_files(&a.paths)?;
    let files: Vec<Vec<u8>> = paths
        .iter()
        .map(|p| std::fs::read(p).with_context(|| p.display().to_string()))
        .collect::<anyhow::Result<_>>()?;
    let bytes: usize = files.iter().map(Vec::len).sum();
    let load_before = load_avg();

    let mut dec = RowDecoder::new();
    let mut out = Vec::new();
    let mut events = 0usize;
    let mut failed = None;
    let rust = Stats::of(a.runs.time(|| {
        let t0 = Instant::now();
        events = 0;
        for f in &files {
            out.clear();
            if let Err(e) = dec.decode_segment(f, &mut out) {
                failed.get_or_insert(e);
            }
            events += out.len();
        }
        events as f64 / t0.elapsed().as_secs_f64()
    }));
    if let Some(e) = failed {
        anyhow::bail!("riptide's reader failed: {e}");
    }
    anyhow::ensure!(
        dec.rejected == 0,
        "{} rows rejected by riptide's reader",
        dec.rejected
    );

    let python = a
        .python
        .as_deref()
        .map(|py| python_reader(py, PY_READER, "the SDK's reader", &a.runs, &paths, events))
        .transpose()?;
    let binding = a
        .binding_python
        .as_deref()
        .map(|py| {
            python_reader(
                py,
                BINDING_READER,
                "riptide's binding",
                &a.runs,
                &paths,
                events,
            )
        })
        .transpose()?;
    let load_after = load_avg();
    let ratio = python.map(|p| rust.median / p.median.max(1e-9));
    let binding_ratio = python
        .zip(binding)
        .map(|(p, b)| b.median / p.median.max(1e-9));
    if a.json {
        let v = serde_json::json!({
            "bench": "archive",
            "date": utc_now(),
            "machine": super::bench::machine(),
            "load": [load_before, load_after],
            "files": paths.len(),
            "bytes": bytes,
            "events": events,
            "riptide_events_per_s": rust.json(),
            "python_events_per_s": python.map(|p| p.json()),
            "ratio_of_medians": ratio,
            "binding_events_per_s": binding.map(|b| b.json()),
            "binding_ratio_of_medians": binding_ratio,
        });
        println!("{v}");
    } else {
        println!(
            "{} files, {bytes} bytes, {events} events; riptide: {:.0} events/s (min {:.0}, max {:.0})",
            paths.len(),
            rust.median,
            rust.min,
            rust.max
        );
        if let (Some(p), Some(r)) = (python, ratio) {
            println!(
                "atproto SDK: {:.0} events/s (min {:.0}, max {:.0}); riptide ÷ SDK = {r:.1}×",
                p.median, p.min, p.max
            );
        }
        if let Some(b) = binding {
            print!(
                "riptide's Python binding: {:.0} events/s (min {:.0}, max {:.0})",
                b.median, b.min, b.max
            );
            match binding_ratio {
                Some(r) => println!("; binding ÷ SDK = {r:.1}×"),
                None => println!(),
            }
        }
    }
    if let Some(w) = spread_warning(&rust, (load_before, load_after)) {
        eprintln!("{w}");
    }
    Ok(ExitCode::SUCCESS)
}

/// Runs a Python reader (its `script` defining `one_pass`, then [`PY_HARNESS`], with arguments
/// `WARMUP PASSES FILE…`, printing `{"events", "secs"}`) in `py`: its events/s; it must count the
/// `events` riptide's Rust reader counted.
fn python_reader(
    py: &std::path::Path,
    script: &str,
    who: &str,
    runs: &Passes,
    paths: &[PathBuf],
    events: usize,
) -> anyhow::Result<Stats> {
    let o = Command::new(py)
        .arg("-c")
        .arg(format!("{script}\n{PY_HARNESS}"))
        .arg(runs.warmup().to_string())
        .arg(runs.passes().to_string())
        .args(paths)
        .output()
        .with_context(|| format!("running {}", py.display()))?;
    anyhow::ensure!(
        o.status.success(),
        "{who} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&o.stdout)?;
    let n = v["events"].as_u64().unwrap_or(0) as usize;
    anyhow::ensure!(
        n == events,
        "{who} counted {n} events, riptide's Rust reader {events}"
    );
    let rates = v["secs"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_f64())
                .map(|s| n as f64 / s)
                .collect()
        })
        .unwrap_or_default();
    Ok(Stats::of(rates))
}
