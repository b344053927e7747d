//! `riptide gen --seed S --accounts N --events M --out DIR [--big-repo RECORDS]
//! [--adversarial RATE]` (a contract), plus `--repos [--repos-at K]`, `--sizes ranked|heavy
//! [--size-max N]` and `--threads`: a synthetic network,
//! deterministic from its arguments (`riptide-gen`; layout in its crate docs and the README).
//!
//! Progress on long runs, on stderr: a bar on a terminal; otherwise (a log, CI) a line every
//! `--progress-every` seconds (default 10): `gen: DONE/TOTAL frames (P%), R frames/s, about S s
//! left` (and `gen: making the accounts…` / `gen: making the big repository…` when a stage
//! starts after the first line is due). Then what was written and the rate; exit 2 on a bad
//! argument or I/O error.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use riptide_gen::{write_dir_with, Config, Stage};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Seed: the same arguments give byte-identical output.
    #[arg(long)]
    seed: u64,
    /// Number of accounts in the stream.
    #[arg(long)]
    accounts: usize,
    /// Number of frames to write.
    #[arg(long)]
    events: u64,
    /// Output directory (created if needed).
    #[arg(long)]
    out: PathBuf,
    /// Also write DIR/big-repo.car (one repository of RECORDS records) and DIR/big-repo.did.json.
    #[arg(long, value_name = "RECORDS")]
    big_repo: Option<usize>,
    /// Share of frames broken on purpose (0 to 1), listed in DIR/adversarial.json.
    #[arg(long, value_name = "RATE")]
    adversarial: Option<f64>,
    /// Also write DIR/repos/<did>.car: every account's full repository at the end of the stream.
    #[arg(long)]
    repos: bool,
    /// Threads in all: with N >= 2, one draws the frames while N - 1 sign and encode them
    /// (output identical for any count).
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Starting repository sizes: `ranked` (50 to 6,000 records by activity rank, the default)
    /// or `heavy` (heavy-tailed as the network's: median ≈ 50 records, one in ≈ 500 with 100k+,
    /// capped at `--size-max`).
    #[arg(long, value_enum, default_value_t = SizesArg::Ranked)]
    sizes: SizesArg,
    /// With `--sizes heavy`: the largest repository, in records.
    #[arg(long, default_value_t = 250_000)]
    size_max: usize,
    /// With `--repos`: export the repositories after frame K instead of at the end (the rest of
    /// the stream is the live tail after them; DIR/repos.json says K).
    #[arg(long, value_name = "K", requires = "repos")]
    repos_at: Option<u64>,
    /// Seconds between progress lines when stderr is not a terminal (a terminal gets a bar).
    #[arg(long, value_name = "SECS", default_value_t = 10.0)]
    progress_every: f64,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum SizesArg {
    Ranked,
    Heavy,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let rate = a.adversarial.unwrap_or(0.0);
    if !(0.0..=1.0).contains(&rate) {
        bail!("--adversarial is a share from 0 to 1, not {rate}");
    }
    let mut cfg = Config::new(a.seed, a.accounts, a.events);
    cfg.adversarial = rate;
    cfg.keep_records = a.repos;
    cfg.big_repo = a.big_repo;
    cfg.threads = a.threads.max(1);
    cfg.repos_at = a.repos_at;
    if a.sizes == SizesArg::Heavy {
        let riptide_gen::network::Sizes::Heavy { min, alpha, .. } =
            riptide_gen::network::Sizes::HEAVY
        else {
            bail!("internal: the heavy defaults are not heavy");
        };
        if a.size_max < min {
            bail!("--size-max must be at least {min}");
        }
        cfg.sizes = riptide_gen::network::Sizes::Heavy {
            min,
            alpha,
            max: a.size_max,
        };
    }
    if !(a.progress_every > 0.0 && a.progress_every.is_finite()) {
        bail!("--progress-every is a number of seconds above 0");
    }
    let start = Instant::now();
    let mut progress = Progress::new(Duration::from_secs_f64(a.progress_every));
    let s = write_dir_with(&cfg, &a.out, &mut |stage| progress.report(stage))
        .with_context(|| format!("generating into {}", a.out.display()))?;
    progress.finish();
    let secs = start.elapsed().as_secs_f64();
    eprintln!(
        "wrote {} frames ({} bytes), {} DID documents, {} adversarial, {} repos{} to {} in {secs:.2} s ({:.0} frames/s)",
        s.frames,
        s.frame_bytes,
        s.did_docs,
        s.adversarial,
        s.repos,
        s.big_repo_bytes.map(|b| format!(", big repo {b} bytes")).unwrap_or_default(),
        a.out.display(),
        s.frames as f64 / secs.max(1e-9),
    );
    Ok(ExitCode::SUCCESS)
}

/// Progress on stderr (module docs): a bar on a terminal, else a line per interval.
struct Progress {
    bar: Option<indicatif::ProgressBar>,
    start: Instant,
    every: Duration,
    next_line: Instant,
}

impl Progress {
    fn new(every: Duration) -> Progress {
        let bar = std::io::stderr().is_terminal().then(|| {
            let pb = indicatif::ProgressBar::new_spinner();
            pb.set_message("making the accounts");
            pb.enable_steady_tick(Duration::from_millis(200));
            pb
        });
        let start = Instant::now();
        Progress {
            bar,
            start,
            every,
            next_line: start + every,
        }
    }

    fn report(&mut self, stage: Stage) {
        if let Some(pb) = &self.bar {
            match stage {
                Stage::Frames { done, total } => {
                    if pb.length() != Some(total) {
                        pb.set_length(total);
                        pb.set_style(
                            indicatif::ProgressStyle::with_template(
                                "{msg} {bar:30} {pos}/{len} frames, {per_sec}, {eta} left",
                            )
                            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
                        );
                        pb.set_message("frames");
                    }
                    pb.set_position(done);
                }
                Stage::BigRepo => pb.set_message("making the big repository"),
                _ => pb.set_message("making the accounts"),
            }
            return;
        }
        let now = Instant::now();
        if now < self.next_line {
            return;
        }
        self.next_line = now + self.every;
        match stage {
            Stage::Frames { done, total } => {
                let secs = self.start.elapsed().as_secs_f64().max(1e-9);
                let rate = done as f64 / secs;
                let left = (total - done.min(total)) as f64 / rate.max(1e-9);
                eprintln!(
                    "gen: {done}/{total} frames ({:.0}%), {rate:.0} frames/s, about {left:.0} s left",
                    100.0 * done as f64 / total.max(1) as f64
                );
            }
            Stage::BigRepo => eprintln!("gen: making the big repository…"),
            _ => eprintln!("gen: making the accounts…"),
        }
    }

    fn finish(self) {
        if let Some(pb) = self.bar {
            pb.finish_and_clear();
        }
    }
}
