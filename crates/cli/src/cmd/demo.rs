//! `riptide demo`: the whole pipeline on one machine with no network, running live.
//!
//! Why: the first thing to run after cloning. It generates a small signed network (riptide-gen,
//! with a few frames broken on purpose), serves its DID documents from an in-process PLC
//! directory (riptide-sim), replays the stream through an in-process relay (riptide-relay,
//! paced and looping, so it stays live), and serves it verified with `riptide serve`'s own
//! machinery ([`super::serve::start`]: upstream client, DID resolution, verification, store,
//! `/subscribe`). One internal subscriber proves events come out; a summary line is printed
//! every second.
//!
//! `--seconds N` stops it by itself (the CI smoke test) and exits 1 if nothing was served or if
//! any verdict other than the planned adversarial ones (or `ok`) was counted.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use futures_util::StreamExt;
use riptide_firehose::verify::Verdict;
use riptide_relay::{Relay, RelayConfig};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Accounts in the generated network.
    #[arg(long, default_value_t = 200)]
    accounts: usize,
    /// Frames in the generated stream (replayed in a loop).
    #[arg(long, default_value_t = 20_000)]
    events: u64,
    /// Share of frames broken on purpose (their verdicts show as rejections).
    #[arg(long, default_value_t = 0.001)]
    adversarial: f64,
    /// Seed of the generated network.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Relay pace, frames per second.
    #[arg(long, default_value_t = 2000.0)]
    rate: f64,
    /// Listen address of /subscribe.
    #[arg(long, default_value = "127.0.0.1:6008")]
    listen: SocketAddr,
    /// Stop after this many seconds of serving (default: until Ctrl-C).
    #[arg(long)]
    seconds: Option<u64>,
    /// Keep generated files and the store here (default: a temporary directory, removed).
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    // Rejections show in the summary line; RUST_LOG=warn logs each with did/seq/rev.
    super::serve::init_tracing_with("error");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(demo(args))
}

/// The planned verdicts of the adversarial frames the relay serves: every frame `adversarial.json`
/// lists except those the relay left out (`left_out`, positions in the stream).
fn planned_verdicts(dir: &Path, left_out: &[usize]) -> anyhow::Result<BTreeMap<String, u64>> {
    let adv: Vec<serde_json::Value> = match std::fs::read(dir.join("adversarial.json")) {
        Ok(b) => serde_json::from_slice(&b).context("adversarial.json")?,
        Err(_) => return Ok(BTreeMap::new()),
    };
    let mut planned = BTreeMap::new();
    for e in &adv {
        let (Some(i), Some(v)) = (e["index"].as_u64(), e["expected_verdict"].as_str()) else {
            anyhow::bail!("adversarial.json: an entry without index or expected_verdict: {e}");
        };
        if left_out.binary_search(&(i as usize)).is_err() {
            *planned.entry(v.to_owned()).or_insert(0) += 1;
        }
    }
    Ok(planned)
}

fn dir_size(p: &Path) -> u64 {
    let Ok(rd) = std::fs::read_dir(p) else {
        return 0;
    };
    rd.flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_size(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

async fn demo(args: Args) -> anyhow::Result<ExitCode> {
    let tmp;
    let root = match &args.dir {
        Some(d) => d.clone(),
        None => {
            tmp = tempfile::tempdir()?;
            tmp.path().to_path_buf()
        }
    };
    let gen_dir = root.join("network");
    let t = Instant::now();
    let mut cfg = riptide_gen::Config::new(args.seed, args.accounts, args.events);
    cfg.adversarial = args.adversarial;
    cfg.threads = 2;
    cfg.initial_records = (20, 400);
    let g = gen_dir.clone();
    tokio::task::spawn_blocking(move || riptide_gen::write_dir(&cfg, &g)).await??;
    let gen_time = t.elapsed();

    // The PLC directory (and PDS) for the generated accounts; the demo runs its own paced, looping
    // relay over the stream, which leaves out (and reports) the frames it cannot serve.
    let mut net = riptide_sim::Network::load(&gen_dir)?;
    let frames = net.frames().to_vec();
    let total = frames.len();
    net.set_frames(Vec::new());
    let sim = riptide_sim::Sim::spawn(net, "127.0.0.1:0".parse()?, riptide_sim::Faults::default())
        .await?;
    let (_, relay) = Relay::bind(
        "127.0.0.1:0".parse()?,
        frames,
        RelayConfig {
            rate: Some(args.rate),
            looped: true,
            ..RelayConfig::default()
        },
    )
    .await?;
    let left_out = relay.left_out();
    let n_frames = (total - left_out.len()) as u64;
    let planned = planned_verdicts(&gen_dir, left_out)?;
    eprintln!(
        "generated {} accounts, {} frames ({} broken on purpose, {} of them unservable by a relay) in {:.1}s under {}",
        args.accounts,
        args.events,
        planned.values().sum::<u64>() + left_out.len() as u64,
        left_out.len(),
        gen_time.as_secs_f64(),
        gen_dir.display()
    );

    let serve_args = super::serve::Args {
        upstream: vec![relay.url()],
        upstream_cursor: None,
        did_docs: None,
        plc_url: sim.base_url(),
        did_cache: 10_000,
        no_verify: false,
        data: root.join("data"),
        retention: Duration::from_secs(3600),
        listen: args.listen,
        zstd_dictionary: None,
        zstd_dictionary_v2: None,
        ingest_file: None,
        ingest_repeat: 1,
        ingest_rate: None,
        workers: None,
    };
    let running = super::serve::start(&serve_args).await?;
    let addr = running.addr;
    let app = running.app.clone();
    println!(
        "riptide demo: relay {} → riptide serve (verifying, keys from the PLC directory at {})",
        relay.url(),
        sim.base_url()
    );
    println!("  subscribe:  ws://{addr}/subscribe");
    println!("  try:        websocat 'ws://{addr}/subscribe?wantedCollections=app.bsky.feed.post'");
    println!("         or:  cargo run --release -- tail --jetstream ws://{addr}");
    println!("  metrics:    http://{addr}/metrics");
    println!("  planned rejections per pass of {n_frames} frames: {planned:?}");

    // One subscriber of our own, to prove events come out.
    let received = Arc::new(AtomicU64::new(0));
    let r = received.clone();
    let sub = tokio::spawn(async move {
        let Ok((mut ws, _)) =
            tokio_tungstenite::connect_async(format!("ws://{addr}/subscribe?cursor=0")).await
        else {
            return;
        };
        while let Some(Ok(m)) = ws.next().await {
            if m.is_text() {
                r.fetch_add(1, Relaxed);
            }
        }
    });

    let m = app.metrics.clone();
    let resolver = running.resolver.clone();
    let data = serve_args.data.clone();
    let start = Instant::now();
    let deadline = args.seconds.map(|s| start + Duration::from_secs(s));
    let report = async {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.tick().await;
        let (mut last_in, mut last_out) = (0, 0);
        loop {
            tick.tick().await;
            let fin = m.frames_in.load(Relaxed);
            let out = m.events_out.load(Relaxed);
            let verdicts: Vec<String> = Verdict::ALL
                .iter()
                .filter(|&&v| v == Verdict::Ok || m.verdict_count(v) > 0)
                .map(|&v| format!("{v} {}", m.verdict_count(v)))
                .collect();
            let fetched = resolver.as_ref().map_or(0, |r| r.cache_counts().fetches);
            println!(
                "[{:>4}s] in {:>6}/s  out {:>6}/s  stored {:>8}  | {} | subscribers {}  DID lookups {}  store {:.1} MB",
                start.elapsed().as_secs(),
                fin - last_in,
                out - last_out,
                m.events_stored.load(Relaxed),
                verdicts.join(", "),
                m.subscribers.load(Relaxed),
                fetched,
                dir_size(&data) as f64 / 1e6
            );
            (last_in, last_out) = (fin, out);
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return;
            }
        }
    };
    running
        .run_until(async {
            tokio::select! {
                _ = report => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        })
        .await?;
    sub.abort();
    relay.shutdown().await;
    sim.abort();

    // The verdict: something was served, and nothing was refused that was not planned.
    let mut failures = Vec::new();
    if received.load(Relaxed) == 0 || m.events_stored.load(Relaxed) == 0 {
        failures.push("nothing was served".to_owned());
    }
    for v in Verdict::ALL {
        let n = m.verdict_count(v);
        if v != Verdict::Ok && n > 0 && !planned.contains_key(v.as_str()) {
            failures.push(format!("{n} unplanned '{v}' verdicts"));
        }
    }
    println!(
        "riptide demo: {} frames verified, {} events stored, {} received by our subscriber",
        m.frames_in.load(Relaxed),
        m.events_stored.load(Relaxed),
        received.load(Relaxed)
    );
    if failures.is_empty() {
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!("riptide demo: FAILED: {}", failures.join("; "));
        Ok(ExitCode::from(1))
    }
}
