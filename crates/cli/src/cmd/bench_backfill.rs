//! `riptide bench backfill DIR`: the backfill's throughput and CPU per GB against the
//! verification bound, on a `riptide gen --repos` network served by an in-process `riptide sim`
//! without rate limits (issue 37's first performance target).
//!
//! Each pass backfills every repository of the directory with a fresh state (the relay's
//! `listRepos`, each account's document from the sim's PLC, `getRepo`, verification, the JSON
//! lines rendered and discarded), then verifies the same CARs with `riptide_repo::verify_repo`
//! (what `riptide repo verify` runs, keys from the documents), read into memory beforehand. CPU
//! is the process's (user + system, every thread): the backfill's figure includes the sim
//! answering it, so it is an upper bound of the backfill's own. Reported: repositories/s,
//! records/s, MB/s, CPU-seconds per GB of CAR for both, and their ratio per pass.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use riptide_backfill::{
    Collections, Config, Discovery, Fetcher, HostLimits, Hosts, JsonlSink, Progress, State,
};
use riptide_resolver::{Resolver, ResolverConfig, ResyncConfig, Resyncer};

use super::bench::Stats;
use super::bench_serve::cpu_secs;

#[derive(clap::Args, Debug)]
pub struct BackfillArgs {
    /// A directory written by `riptide gen --repos` (optionally `--big-repo N`).
    from: PathBuf,
    /// Requests in flight.
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// Only these collections (as `riptide backfill --collections`; `none.*` keeps no record:
    /// fetch and verification alone).
    #[arg(long, value_delimiter = ',')]
    collections: Vec<String>,
    /// Measured passes (after one warm-up).
    #[arg(long, default_value_t = 3)]
    passes: usize,
    /// One JSON object on stdout.
    #[arg(long)]
    json: bool,
}

pub fn run(a: BackfillArgs) -> anyhow::Result<ExitCode> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(bench(a))
}

/// Every CAR of the directory with its account's key.
fn cars(dir: &std::path::Path) -> anyhow::Result<Vec<(Vec<u8>, riptide_crypto::PublicKey)>> {
    let docs = riptide_identity::DidDocs::load(&dir.join("did_docs.json"))
        .with_context(|| format!("{}/did_docs.json", dir.display()))?;
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir.join("repos"))? {
        let e = e?;
        let name = e.file_name().into_string().unwrap_or_default();
        let Some(did) = name.strip_suffix(".car") else {
            continue;
        };
        let key = docs
            .signing_key(did)
            .map_err(|e| anyhow::anyhow!("{did}: {e}"))?;
        out.push((std::fs::read(e.path())?, key));
    }
    if let Ok(b) = std::fs::read(dir.join("big-repo.did.json")) {
        let doc = riptide_identity::DidDoc::from_json(std::str::from_utf8(&b)?)
            .map_err(|e| anyhow::anyhow!("big-repo.did.json: {e}"))?;
        let key = doc
            .signing_key()
            .map_err(|e| anyhow::anyhow!("big repo: {e}"))?;
        out.push((std::fs::read(dir.join("big-repo.car"))?, key));
    }
    anyhow::ensure!(!out.is_empty(), "{}: no repositories", dir.display());
    Ok(out)
}

struct Pass {
    secs: f64,
    cpu: f64,
    repos: u64,
    records: u64,
    bytes: u64,
    verify_cpu: f64,
}

async fn bench(a: BackfillArgs) -> anyhow::Result<ExitCode> {
    let cars = cars(&a.from)?;
    let car_bytes: u64 = cars.iter().map(|(c, _)| c.len() as u64).sum();
    let keep = Collections::parse(&a.collections).map_err(|e| anyhow::anyhow!("{e}"))?;
    let net = riptide_sim::Network::load(&a.from)?;
    let sim = riptide_sim::Sim::spawn(net, "127.0.0.1:0".parse()?, riptide_sim::Faults::default())
        .await?;
    let base = sim.base_url();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    eprintln!(
        "backfilling {} repositories ({:.1} MB) per pass from the sim at {base}, {} at once, no rate limits; load {}",
        cars.len(),
        car_bytes as f64 / 1e6,
        a.concurrency,
        load.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
    );
    let mut passes = Vec::new();
    for i in 0..=a.passes {
        let dir = tempfile::tempdir()?;
        let resolver = Resolver::new(ResolverConfig {
            plc_url: base.clone(),
            timeout: Duration::from_secs(30),
            ..ResolverConfig::default()
        })?;
        let resync = Resyncer::new(
            resolver.clone(),
            ResyncConfig {
                max_repo_bytes: 2 << 30,
                per_host: a.concurrency.max(1),
                spool_above: 8 << 20,
                spool_dir: Some(dir.path().to_owned()),
                ..ResyncConfig::default()
            },
        );
        let fetcher = Fetcher::new(resolver, resync, Some(base.clone()), keep.clone());
        let limits = HostLimits {
            get_repo_per_sec: f64::INFINITY,
            list_per_sec: f64::INFINITY,
            per_host: a.concurrency.max(1),
        };
        let cfg = Config {
            relay: base.clone(),
            discovery: Discovery::RelayRepos,
            global: a.concurrency.max(1),
            ..Config::default()
        };
        let state = Arc::new(State::open(&dir.path().join("state"))?);
        let progress = Arc::new(Progress::default());
        let (t0, c0) = (Instant::now(), cpu_secs());
        riptide_backfill::run(
            cfg,
            fetcher,
            Hosts::new(limits, a.concurrency.max(1)),
            state,
            Box::new(JsonlSink::pipe(Box::new(std::io::sink()), "nowhere")),
            progress.clone(),
        )
        .await?;
        let (secs, cpu) = (t0.elapsed().as_secs_f64(), cpu_secs() - c0);
        use std::sync::atomic::Ordering::Relaxed;
        let failed = progress.failed.load(Relaxed);
        anyhow::ensure!(failed == 0, "{failed} repositories failed");
        // The bound: the same CARs verified one after another, in memory already.
        let c1 = cpu_secs();
        let mut records = 0u64;
        for (car, key) in &cars {
            let r = riptide_repo::verify_repo(car, Some(key))?;
            records += r.records as u64;
        }
        let verify_cpu = cpu_secs() - c1;
        let p = Pass {
            secs,
            cpu,
            repos: progress.ok.load(Relaxed),
            records: progress.records.load(Relaxed),
            bytes: progress.bytes.load(Relaxed),
            verify_cpu,
        };
        anyhow::ensure!(
            p.bytes == car_bytes,
            "backfilled {} of {car_bytes} bytes",
            p.bytes
        );
        if i > 0 {
            eprintln!(
                "pass {i}: {} repositories, {} records written (of {records}), {:.1} MB in {:.3} s: {:.0} repos/s, {:.0} records/s, {:.1} MB/s; CPU {:.2} s/GB (repo verify {:.2} s/GB, ratio {:.2})",
                p.repos,
                p.records,
                p.bytes as f64 / 1e6,
                p.secs,
                p.repos as f64 / p.secs,
                p.records as f64 / p.secs,
                p.bytes as f64 / 1e6 / p.secs,
                p.cpu / (p.bytes as f64 / 1e9),
                p.verify_cpu / (p.bytes as f64 / 1e9),
                p.cpu / p.verify_cpu,
            );
            passes.push(p);
        }
    }
    let stat = |f: &dyn Fn(&Pass) -> f64| Stats::of(passes.iter().map(f).collect());
    let gb = |p: &Pass| p.bytes as f64 / 1e9;
    let repos_s = stat(&|p| p.repos as f64 / p.secs);
    let records_s = stat(&|p| p.records as f64 / p.secs);
    let mb_s = stat(&|p| p.bytes as f64 / 1e6 / p.secs);
    let cpu_gb = stat(&|p| p.cpu / gb(p));
    let verify_gb = stat(&|p| p.verify_cpu / gb(p));
    let ratio = stat(&|p| p.cpu / p.verify_cpu);
    if a.json {
        println!(
            "{}",
            serde_json::json!({
                "repos": cars.len(),
                "car_bytes": car_bytes,
                "concurrency": a.concurrency,
                "collections": a.collections,
                "repos_per_sec": repos_s.json(),
                "records_per_sec": records_s.json(),
                "mb_per_sec": mb_s.json(),
                "cpu_secs_per_gb": cpu_gb.json(),
                "repo_verify_cpu_secs_per_gb": verify_gb.json(),
                "cpu_ratio_to_repo_verify": ratio.json(),
            })
        );
    } else {
        println!(
            "backfill: {:.0} repos/s (min {:.0}, max {:.0}), {:.0} records/s, {:.1} MB/s; CPU {:.2} s/GB (min {:.2}, max {:.2}); repo verify {:.2} s/GB; ratio {:.2} (min {:.2}, max {:.2})",
            repos_s.median, repos_s.min, repos_s.max, records_s.median, mb_s.median,
            cpu_gb.median, cpu_gb.min, cpu_gb.max, verify_gb.median,
            ratio.median, ratio.min, ratio.max
        );
    }
    Ok(ExitCode::SUCCESS)
}
