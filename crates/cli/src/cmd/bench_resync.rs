//! `riptide bench resync`: how fast `riptide serve` can repair broken chains — repositories
//! fetched from `riptide sim` on loopback and verified whole (`riptide_resolver::Resyncer`, the
//! code serve runs), under serve's limits.
//!
//! Each pass resyncs every account of a `riptide gen --repos` directory once, at most
//! `--concurrency` at a time (serve's default, 8) and `--per-host` per host (the sim is one
//! host: the per-host limit, 4 by default, is what binds), with a fresh resolver (DID documents
//! are looked up as in a real resync). Reported per pass: repositories/s, MB/s and records/s of
//! verified repository, and the CPU seconds per MB (user + system, every thread: the fetch, the
//! sim's answer and the verification share the machine, as on a relay host they would not). With
//! `riptide gen --big-repo N`, the big repository is then resynced alone, spooled to disk
//! (`ResyncConfig::spool_above`), and its time and the process's peak resident memory reported.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use riptide_resolver::{Resolver, ResolverConfig, ResyncConfig, Resyncer};

use super::bench::{peak_rss_bytes, Stats};
use super::bench_serve::cpu_secs;

#[derive(clap::Args, Debug)]
pub struct ResyncArgs {
    /// A directory written by `riptide gen --repos` (optionally `--big-repo N`).
    from: PathBuf,
    /// Resyncs at once (serve's default).
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// Fetches from one host at once (serve's default).
    #[arg(long, default_value_t = 4)]
    per_host: usize,
    /// Measured passes.
    #[arg(long, default_value_t = 3)]
    passes: usize,
    /// One JSON object on stdout.
    #[arg(long)]
    json: bool,
}

/// The process's anonymous resident memory now (`RssAnon` of /proc/self/status).
fn rss_anon_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("RssAnon:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

struct Pass {
    secs: f64,
    cpu: f64,
    repos: usize,
    bytes: u64,
    records: u64,
}

pub fn run(a: ResyncArgs) -> anyhow::Result<ExitCode> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(bench(a))
}

async fn bench(a: ResyncArgs) -> anyhow::Result<ExitCode> {
    let repos_dir = a.from.join("repos");
    let mut dids: Vec<String> = std::fs::read_dir(&repos_dir)
        .with_context(|| {
            format!(
                "{}: no repositories (make the directory with `riptide gen --repos`)",
                repos_dir.display()
            )
        })?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| n.strip_suffix(".car"))
                .map(str::to_owned)
        })
        .collect();
    dids.sort();
    anyhow::ensure!(!dids.is_empty(), "{}: no repositories", repos_dir.display());
    let big = match std::fs::read(a.from.join("big-repo.did.json")) {
        Ok(b) => {
            let doc: serde_json::Value = serde_json::from_slice(&b)?;
            doc["id"].as_str().map(str::to_owned)
        }
        Err(_) => None,
    };
    let net = riptide_sim::Network::load(&a.from)?;
    let sim = riptide_sim::Sim::spawn(net, "127.0.0.1:0".parse()?, riptide_sim::Faults::default())
        .await?;
    let base = sim.base_url();
    let resyncer = |cfg: ResyncConfig| -> anyhow::Result<Resyncer> {
        let r = Resolver::new(ResolverConfig {
            plc_url: base.clone(),
            timeout: Duration::from_secs(30),
            ..ResolverConfig::default()
        })?;
        Ok(Resyncer::new(r, cfg))
    };
    let cfg = ResyncConfig {
        per_host: a.per_host,
        ..ResyncConfig::default()
    };
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    eprintln!(
        "resyncing {} repositories per pass from the sim at {base}, {} at once ({} per host); load {}",
        dids.len(),
        a.concurrency,
        a.per_host,
        load.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
    );
    let mut passes = Vec::new();
    // One warm-up pass (connections, page cache), then the measured ones.
    for i in 0..=a.passes {
        let rs = resyncer(cfg.clone())?;
        let slots = Arc::new(tokio::sync::Semaphore::new(a.concurrency.max(1)));
        let (t0, c0) = (Instant::now(), cpu_secs());
        let mut tasks = Vec::new();
        for did in &dids {
            let (rs, slots, did) = (rs.clone(), slots.clone(), did.clone());
            tasks.push(tokio::spawn(async move {
                let _slot = slots.acquire().await;
                rs.resync(&did, &[]).await
            }));
        }
        let mut p = Pass {
            secs: 0.0,
            cpu: 0.0,
            repos: 0,
            bytes: 0,
            records: 0,
        };
        for t in tasks {
            let r = t
                .await?
                .map_err(|e| anyhow::anyhow!("resync failed: {e}"))?;
            p.repos += 1;
            p.bytes += r.bytes;
            p.records += r.records as u64;
        }
        p.secs = t0.elapsed().as_secs_f64();
        p.cpu = cpu_secs() - c0;
        if i > 0 {
            eprintln!(
                "pass {i}: {} repositories, {:.1} MB, {} records in {:.3}s: {:.0} repos/s, {:.1} MB/s, {:.1} CPU-ms/MB",
                p.repos,
                p.bytes as f64 / 1e6,
                p.records,
                p.secs,
                p.repos as f64 / p.secs,
                p.bytes as f64 / 1e6 / p.secs,
                1e3 * p.cpu / (p.bytes as f64 / 1e6)
            );
            passes.push(p);
        }
    }
    let repos_s = Stats::of(passes.iter().map(|p| p.repos as f64 / p.secs).collect());
    let mb_s = Stats::of(
        passes
            .iter()
            .map(|p| p.bytes as f64 / 1e6 / p.secs)
            .collect(),
    );
    let records_s = Stats::of(passes.iter().map(|p| p.records as f64 / p.secs).collect());
    let cpu_per_mb = Stats::of(
        passes
            .iter()
            .map(|p| 1e3 * p.cpu / (p.bytes as f64 / 1e6))
            .collect(),
    );
    println!(
        "resync: {:.0} repos/s (min {:.0}, max {:.0}), {:.1} MB/s (min {:.1}, max {:.1}), {:.0} records/s, {:.1} CPU-ms per MB",
        repos_s.median, repos_s.min, repos_s.max, mb_s.median, mb_s.min, mb_s.max,
        records_s.median, cpu_per_mb.median
    );
    let mut big_json = serde_json::Value::Null;
    if let Some(did) = big {
        // The big repository twice: spooled to disk (serve's default above 32 MiB) and read into
        // memory, each with the process's anonymous memory sampled every 2 ms (the map's pages
        // are file-backed, which the kernel can drop: they are not the cost).
        let mut runs = Vec::new();
        for (name, spool_above) in [("spooled", cfg.spool_above), ("in memory", usize::MAX)] {
            let rs = resyncer(ResyncConfig {
                max_repo_bytes: usize::MAX,
                spool_above,
                ..cfg.clone()
            })?;
            let base = rss_anon_bytes().unwrap_or(0);
            let peak = Arc::new(std::sync::atomic::AtomicU64::new(base));
            let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let sampler = {
                let (peak, done) = (peak.clone(), done.clone());
                std::thread::spawn(move || {
                    while !done.load(std::sync::atomic::Ordering::Relaxed) {
                        if let Some(b) = rss_anon_bytes() {
                            peak.fetch_max(b, std::sync::atomic::Ordering::Relaxed);
                        }
                        std::thread::sleep(Duration::from_millis(2));
                    }
                })
            };
            let t0 = Instant::now();
            let r = rs.resync(&did, &[]).await;
            let secs = t0.elapsed().as_secs_f64();
            done.store(true, std::sync::atomic::Ordering::Relaxed);
            let _ = sampler.join();
            let r = r.map_err(|e| anyhow::anyhow!("big repository: {e}"))?;
            let extra = peak
                .load(std::sync::atomic::Ordering::Relaxed)
                .saturating_sub(base);
            println!(
                "big repository {name}: {:.1} MB, {} records in {:.2}s ({:.1} MB/s); anonymous memory +{:.1} MB at peak ({:.2}x the repository)",
                r.bytes as f64 / 1e6,
                r.records,
                secs,
                r.bytes as f64 / 1e6 / secs,
                extra as f64 / 1e6,
                extra as f64 / r.bytes as f64
            );
            runs.push(serde_json::json!({
                "mode": name, "bytes": r.bytes, "records": r.records, "secs": secs,
                "mb_per_s": r.bytes as f64 / 1e6 / secs, "anon_peak_extra_bytes": extra,
            }));
        }
        big_json = serde_json::json!({
            "runs": runs, "peak_rss_bytes": peak_rss_bytes(),
        });
    }
    if a.json {
        println!(
            "{}",
            serde_json::json!({
                "repos_per_pass": dids.len(),
                "concurrency": a.concurrency,
                "per_host": a.per_host,
                "repos_per_s": repos_s.json(),
                "mb_per_s": mb_s.json(),
                "records_per_s": records_s.json(),
                "cpu_ms_per_mb": cpu_per_mb.json(),
                "big_repo": big_json,
            })
        );
    }
    Ok(ExitCode::SUCCESS)
}
