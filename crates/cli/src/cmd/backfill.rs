//! `riptide backfill --relay URL [--plc-url URL] --jsonl --state DIR` and
//! `riptide backfill status --state DIR [--json]` (contract names, issue 37): the network's
//! existing repositories, each fetched from its PDS and verified whole, as JSON lines.
//!
//! Output: one line per record on stdout, `{"did","rev","collection","rkey","cid","record"}`
//! (the record rendered as Jetstream renders it), or into `--out FILE`. Progress is durable in
//! `--state DIR` (fjall): stopped at any moment and started again with the same arguments, the
//! run resumes and writes each repository once. Exactly once holds for a regular file (`--out`,
//! or stdout redirected to a file): the file is cut back to the last committed length at start.
//! On a pipe, the repositories in flight at a crash may be written again (a warning says so).
//!
//! `--data DIR` writes into the store that `riptide serve --data DIR` serves
//! ([`riptide_backfill::StoreSink`]): one `create` event per record, each account's chain state
//! and the repository's progress in one atomic batch, exactly once across `kill -9`. The
//! progress state is then `DIR/backfill` unless `--state` says otherwise; the store's own lock
//! keeps a running server (or a second backfill) out of the directory. With `--jsonl` as well,
//! the records are also printed as JSON lines for a pipeline, each output exactly once (a pipe:
//! as a pipe allows); keep the same outputs when resuming (the state's position is theirs).
//!
//! `--publish kafka://BROKERS/TOPIC` makes the run one worker of a backfill spread over a Kafka
//! consumer group (`riptide_kafka::backfill`, docs/kafka.md): no state directory, the progress
//! is in Kafka, the records go to `TOPIC.backfill`; it ends when every host is done.
//!
//! One run per state directory (a lock, `DIR/lock`): a second is refused. `status` never opens
//! the keyspace beside a running backfill (fjall is one process's); it reads the snapshot the run
//! writes every five seconds (`DIR/status.json`) and says it is running.
//!
//! An interactive run (stderr a terminal) shows a progress bar; otherwise a progress line is
//! logged once a minute. Exit codes: 0 when every repository was backfilled or failed with a
//! reason (failures are the network's, listed by `status`), 1 on a local failure (state,
//! output), 2 on bad arguments.

use std::io::{IsTerminal, Write};
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use riptide_backfill::{
    Collections, Config, Discovery, Fetcher, HostLimits, Hosts, JsonlSink, Progress, Sink, State,
    StoreSink, TeeSink,
};
use riptide_resolver::{Resolver, ResolverConfig, ResyncConfig, Resyncer};

use crate::out;

#[derive(clap::Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct Args {
    #[command(subcommand)]
    cmd: Option<Sub>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(clap::Subcommand, Debug)]
enum Sub {
    /// What a backfill's state says: hosts done and left, repositories by outcome, rate, ETA.
    Status(StatusArgs),
}

#[derive(clap::Args, Debug)]
struct StatusArgs {
    /// The backfill's state directory.
    #[arg(long)]
    state: Option<PathBuf>,
    /// The data directory of a store-backed backfill (its state is DIR/backfill).
    #[arg(long, conflicts_with = "state")]
    data: Option<PathBuf>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
    /// The Kafka backfill (`--publish kafka://BROKERS/TOPIC` of its workers): hosts done and
    /// left, repositories ok and failed by reason, records, from the committed progress.
    #[cfg(feature = "kafka")]
    #[arg(long, value_name = "kafka://BROKERS/TOPIC", conflicts_with_all = ["state", "data"])]
    publish: Option<String>,
    /// Failed repositories listed (with --json, or below the summary).
    #[arg(long, default_value_t = 20)]
    failures: usize,
}

#[derive(clap::Args, Debug)]
struct RunArgs {
    /// The relay (its `listHosts`, `listRepos`, `listReposByCollection`, and the fallback
    /// `getRepo`): `https://…` or `wss://…`.
    #[arg(long)]
    relay: Option<String>,
    /// The PLC directory.
    #[arg(long, default_value = riptide_resolver::DEFAULT_PLC_URL)]
    plc_url: String,
    /// Resolve did:plc from a local copy of the PLC directory (`riptide plc mirror --data
    /// DIR`); a DID it does not hold is asked of --plc-url, counted
    /// (`riptide_backfill_plc_lookups_total{source="directory"}`).
    #[arg(long, value_name = "DIR")]
    plc_mirror: Option<PathBuf>,
    /// Print each record as one JSON line (on stdout, or into --out); with --data, as well as
    /// writing the store (keep the same outputs when resuming).
    #[arg(long)]
    jsonl: bool,
    /// Write the JSON lines into this file (appended; exactly once across restarts).
    #[arg(long, requires = "jsonl")]
    out: Option<PathBuf>,
    /// Backfill into a data directory that `riptide serve --data DIR` serves (one `create`
    /// event per record, exactly once; progress in DIR/backfill unless --state).
    #[arg(long)]
    data: Option<PathBuf>,
    /// With --data: land a repository in pieces of at most N records, each its own durable
    /// store batch (memory per landing bounded by the piece; a restart resumes after the last
    /// piece written).
    #[arg(long, value_name = "N", default_value_t = riptide_backfill::store_sink::PIECE_RECORDS as u64, value_parser = clap::value_parser!(u64).range(1..), requires = "data")]
    landing_records: u64,
    /// Progress (per-repository status, cursors): resume by running again with the same DIR.
    #[arg(long)]
    state: Option<PathBuf>,
    /// Crawl as one worker of a Kafka consumer group (kafka://HOST:PORT[,…]/TOPIC[?partitions=N]):
    /// the relay's hosts are the work, each worker crawls the hosts of its partitions, and each
    /// verified repository's records go to TOPIC.backfill in one transaction with its host's
    /// progress, exactly once across killed workers (docs/kafka.md). Start the same command on
    /// each machine; each ends when every host is done.
    #[cfg(feature = "kafka")]
    #[arg(long, value_name = "kafka://BROKERS/TOPIC", conflicts_with_all = ["data", "jsonl", "state", "dids", "collections"])]
    publish: Option<String>,
    /// Serve the crawl's numbers at http://ADDR/metrics (Prometheus text, the
    /// `riptide_backfill_*` names of `serve --backfill`; with --publish, this worker's own),
    /// for as long as the run lasts. Port 0: any free port (the address is logged).
    #[arg(long, value_name = "ADDR", value_parser = super::parse_listen)]
    metrics_listen: Option<std::net::SocketAddr>,
    #[command(flatten)]
    crawl: CrawlArgs,
}

/// How the crawl finds accounts and keeps to the hosts' limits: `riptide backfill`'s and
/// `riptide serve --backfill`'s (the same flags).
#[derive(clap::Args, Debug)]
pub struct CrawlArgs {
    /// Where accounts come from: the relay's `listHosts` then each host's `listRepos`
    /// (`hosts`), or the relay's own `listRepos` (`relay`).
    #[arg(long, value_enum, default_value_t = Source::Hosts)]
    discovery: Source,
    /// Only these collections: exact NSIDs (accounts found with `listReposByCollection`) or
    /// `prefix.*` (every account crawled, records filtered). Comma-separated or repeated.
    #[arg(long, value_delimiter = ',')]
    collections: Vec<String>,
    /// Only the DIDs in this file (one a line).
    #[arg(long, conflicts_with = "collections")]
    dids: Option<PathBuf>,
    /// `getRepo` requests per second per host.
    #[arg(long, default_value_t = 20.0)]
    get_repo_rate: f64,
    /// Listing requests per second per host.
    #[arg(long, default_value_t = 10.0)]
    list_rate: f64,
    /// No per-host rates (benchmarks against a local network).
    #[arg(long)]
    no_rate_limits: bool,
    /// Requests to one host at once (per --bind address).
    #[arg(long, default_value_t = 8)]
    per_host: usize,
    /// Local source addresses to spread the `getRepo`s over, comma-separated (e.g.
    /// `127.0.0.2,127.0.0.3`, or a machine's public addresses): a PDS limits each client IP on
    /// its own, so each address keeps to the per-host rates above by itself and N addresses
    /// crawl a host N times as fast. Listings go out from the first.
    #[arg(long, value_delimiter = ',')]
    bind: Vec<std::net::IpAddr>,
    /// Requests in flight over all hosts.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Attempts per repository for transient failures.
    #[arg(long, default_value_t = 3)]
    attempts: u32,
    /// Seconds a `getRepo` may take.
    #[arg(long, default_value_t = 300)]
    timeout_secs: u64,
    /// Slowest body accepted, bytes per second (after 10 s).
    #[arg(long, default_value_t = 16 * 1024)]
    min_bytes_per_sec: u64,
    /// Largest repository fetched, in bytes (default 2 GiB).
    #[arg(long, default_value_t = 2 << 30)]
    max_repo_bytes: usize,
    /// Repositories larger than this go to an unnamed file in --spool-dir, not memory. With
    /// --concurrency, it bounds the memory that repositories take: at most (concurrency + 16)
    /// repositories are held at once, fetched or waiting to be written.
    #[arg(long, default_value_t = 8 << 20)]
    spool_above: usize,
    /// Where large repositories are spooled (default: DIR/spool under --state).
    #[arg(long)]
    spool_dir: Option<PathBuf>,
    /// The first retry's delay in milliseconds (then ×4 each attempt).
    #[arg(long, default_value_t = 1000)]
    retry_backoff_ms: u64,
    /// Fetch again the repositories that failed in an earlier run.
    #[arg(long)]
    retry_failed: bool,
}

/// A crawl's plan: where the accounts come from and the limits, checked.
pub struct Plan {
    pub cfg: Config,
    pub limits: HostLimits,
    pub keep: Collections,
}

impl CrawlArgs {
    /// The flags' defaults (a server started from code: `riptide demo`).
    pub fn defaults() -> CrawlArgs {
        use clap::{Args as _, FromArgMatches as _};
        let m = CrawlArgs::augment_args(clap::Command::new("crawl")).get_matches_from(["crawl"]);
        CrawlArgs::from_arg_matches(&m).unwrap_or_else(|e| e.exit())
    }

    /// The crawl's configuration against `relay` (an XRPC base: [`relay_base`]); a flag that
    /// cannot be used is an error, said before anything starts.
    pub fn plan(&self, relay: &str) -> anyhow::Result<Plan> {
        let a = self;
        check_bind(&a.bind)?;
        let keep = Collections::parse(&a.collections)
            .map_err(|e| anyhow::anyhow!("--collections: {e}"))?;
        let discovery = if let Some(file) = &a.dids {
            let text = std::fs::read_to_string(file)
                .with_context(|| format!("reading {}", file.display()))?;
            let (dids, bad) = riptide_backfill::discover::parse_did_file(&text);
            if !bad.is_empty() {
                anyhow::bail!(
                    "{}: {} lines are not DIDs (first: {:?})",
                    file.display(),
                    bad.len(),
                    bad[0]
                );
            }
            Discovery::Dids(dids)
        } else if let Some(nsids) = keep.discoverable() {
            Discovery::Collections(nsids.to_vec())
        } else if a.discovery == Source::Relay {
            Discovery::RelayRepos
        } else {
            Discovery::Hosts
        };
        let unlimited = a.no_rate_limits;
        if !unlimited && (a.get_repo_rate <= 0.0 || a.list_rate <= 0.0) {
            anyhow::bail!("--get-repo-rate and --list-rate must be above 0 (or --no-rate-limits)");
        }
        let limits = HostLimits {
            get_repo_per_sec: if unlimited {
                f64::INFINITY
            } else {
                a.get_repo_rate
            },
            list_per_sec: if unlimited {
                f64::INFINITY
            } else {
                a.list_rate
            },
            per_host: a.per_host.max(1),
        };
        let cfg = Config {
            relay: relay.to_owned(),
            discovery,
            global: a.concurrency.max(1),
            window: a.per_host.max(1) * 2,
            attempts: a.attempts.max(1),
            backoff: Duration::from_millis(a.retry_backoff_ms),
            retry_failed: a.retry_failed,
            ..Config::default()
        };
        Ok(Plan { cfg, limits, keep })
    }

    /// The spool directory: --spool-dir, or `state_dir/spool` (created).
    pub fn spool(&self, state_dir: &std::path::Path) -> anyhow::Result<PathBuf> {
        let spool = self
            .spool_dir
            .clone()
            .unwrap_or_else(|| state_dir.join("spool"));
        std::fs::create_dir_all(&spool).with_context(|| format!("creating {}", spool.display()))?;
        Ok(spool)
    }

    /// The fetcher (inside a runtime): `getRepo` through `resolver`, the relay as fallback.
    pub fn fetcher(
        &self,
        resolver: Resolver,
        relay: String,
        keep: Collections,
        spool: PathBuf,
    ) -> anyhow::Result<Fetcher> {
        let a = self;
        let resync = Resyncer::new(
            resolver.clone(),
            ResyncConfig {
                timeout: Duration::from_secs(a.timeout_secs.max(1)),
                max_repo_bytes: a.max_repo_bytes,
                per_host: a.per_host.max(1),
                spool_above: a.spool_above,
                spool_dir: Some(spool),
                min_bytes_per_sec: a.min_bytes_per_sec,
                ..ResyncConfig::default()
            },
        );
        let mut fetcher = Fetcher::new(resolver, resync, Some(relay), keep);
        if !a.bind.is_empty() {
            fetcher = fetcher.bound_to(&a.bind)?;
        }
        Ok(fetcher)
    }
}

impl RunArgs {
    /// The resolver of the accounts' DID documents (--plc-url), for the fetcher.
    fn resolver(&self) -> anyhow::Result<Resolver> {
        let plc_mirror = match &self.plc_mirror {
            Some(dir) => Some(Arc::new(super::plc::open_existing(dir)?)),
            None => None,
        };
        Ok(Resolver::new(ResolverConfig {
            plc_url: self.plc_url.trim_end_matches('/').to_owned(),
            plc_mirror,
            ..ResolverConfig::default()
        })?)
    }
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Source {
    Hosts,
    Relay,
}

/// The backfill's state inside a data directory (`--data DIR` without `--state`).
pub const STATE_IN_DATA: &str = "backfill";

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    match a.cmd {
        Some(Sub::Status(s)) => status(s),
        None => backfill(a.run),
    }
}

fn status(a: StatusArgs) -> anyhow::Result<ExitCode> {
    #[cfg(feature = "kafka")]
    if let Some(url) = &a.publish {
        return kafka_status(url, a.json);
    }
    let Some(dir) = a.state.or_else(|| a.data.map(|d| d.join(STATE_IN_DATA))) else {
        anyhow::bail!("--state DIR, --data DIR or --publish kafka://BROKERS/TOPIC is required");
    };
    // Status reads; it must not create a state where there was none (fjall would). A run that
    // holds the lock may still be making its state: it is running all the same.
    let lock = match dir.join("lock").exists() {
        true => Some(lock_file(&dir)?),
        false => None,
    };
    let running = lock
        .as_ref()
        .is_some_and(|l| matches!(l.try_lock(), Err(std::fs::TryLockError::WouldBlock)));
    if !running && !State::exists(&dir) {
        anyhow::bail!("{}: no backfill state here", dir.display());
    }
    let s = if running {
        // A backfill holds the state: its last snapshot (at most five seconds old).
        let path = dir.join(SNAPSHOT);
        let text = std::fs::read(&path).with_context(|| {
            format!(
                "a backfill is running on {} and has not written {} yet",
                dir.display(),
                path.display()
            )
        })?;
        serde_json::from_slice::<riptide_backfill::Status>(&text)
            .with_context(|| format!("reading {}", path.display()))?
    } else {
        let state = State::open(&dir).with_context(|| format!("opening {}", dir.display()))?;
        riptide_backfill::status(&state, a.failures)?
    };
    let mut w = out::stdout();
    if a.json {
        let mut v = serde_json::to_value(&s)?;
        v["running"] = serde_json::Value::Bool(running);
        serde_json::to_writer(&mut w, &v)?;
        writeln!(w)?;
    } else {
        if running {
            writeln!(w, "running (as of its last snapshot, at most 5 s old)")?;
        }
        writeln!(
            w,
            "listings: {} done, {} left, {} with problems (of {})",
            s.listings_done,
            s.listings_left,
            s.listing_problems.len(),
            s.listings
        )?;
        for (l, p) in &s.listing_problems {
            writeln!(w, "  {l}: {p}")?;
        }
        writeln!(
            w,
            "repositories: {} ok, {} failed",
            s.repos_ok, s.repos_failed_total
        )?;
        for (reason, n) in &s.repos_failed {
            writeln!(w, "  {reason}: {n}")?;
        }
        writeln!(
            w,
            "records: {} ({} not written: outside the data model)",
            s.records, s.records_dropped
        )?;
        writeln!(w, "bytes: {:.1} MB", s.bytes as f64 / 1e6)?;
        writeln!(
            w,
            "rate: {:.1} repositories/s, {:.0} records/s over {:.0} s",
            s.repos_per_sec, s.records_per_sec, s.elapsed_secs
        )?;
        match (s.expected_repos, s.eta_secs) {
            (Some(n), Some(eta)) => writeln!(w, "eta: {:.0} s ({n} accounts expected)", eta)?,
            _ => writeln!(w, "eta: unknown (the total is not known)")?,
        }
        for (did, reason, detail) in &s.failures {
            writeln!(w, "failed {did} {reason}: {detail}")?;
        }
    }
    w.flush()?;
    Ok(ExitCode::SUCCESS)
}

/// `wss://host/…` or `https://host` → `https://host` (the relay's XRPC base).
pub fn relay_base(url: &str) -> anyhow::Result<String> {
    riptide_resolver::resync::relay_http_base(url)
        .with_context(|| format!("--relay {url}: not an http(s):// or ws(s):// URL"))
}

/// Each `--bind` address must be this machine's: said once here, before anything starts,
/// rather than as a network failure of every repository of its lane.
fn check_bind(addrs: &[std::net::IpAddr]) -> anyhow::Result<()> {
    for a in addrs {
        std::net::TcpListener::bind((*a, 0))
            .with_context(|| format!("--bind {a}: not an address of this machine"))?;
    }
    Ok(())
}

fn backfill(a: RunArgs) -> anyhow::Result<ExitCode> {
    let Some(relay) = a.relay.as_deref() else {
        anyhow::bail!("--relay URL is required (or `riptide backfill status --state DIR`)");
    };
    let relay = relay_base(relay)?;
    #[cfg(feature = "kafka")]
    if let Some(url) = a.publish.clone() {
        return worker(&a, relay, &url);
    }
    let Plan { cfg, limits, keep } = a.crawl.plan(&relay)?;
    if !a.jsonl && a.data.is_none() {
        anyhow::bail!("an output is required: --data DIR (the store `riptide serve --data DIR` serves) or --jsonl");
    }
    let Some(state_dir) = a
        .state
        .clone()
        .or_else(|| a.data.as_ref().map(|d| d.join(STATE_IN_DATA)))
    else {
        anyhow::bail!("--state DIR is required: the backfill's progress, to resume from");
    };
    let (state, _lock) = open_state(&state_dir)?;
    let spool = a.crawl.spool(&state_dir)?;
    let lines: Option<Box<dyn Sink>> = match (a.jsonl, &a.out) {
        (false, _) => None,
        (true, Some(path)) => {
            let f = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .read(true)
                .write(true)
                .open(path)
                .with_context(|| format!("opening {}", path.display()))?;
            Some(Box::new(JsonlSink::file(f, path.display().to_string())))
        }
        (true, None) => {
            // Standard output redirected to a regular file is as good as --out.
            let fd = std::io::stdout().as_fd().try_clone_to_owned()?;
            let f = std::fs::File::from(fd);
            Some(if f.metadata().is_ok_and(|m| m.is_file()) {
                Box::new(JsonlSink::file(f, "stdout"))
            } else {
                Box::new(JsonlSink::pipe(Box::new(std::io::stdout()), "stdout"))
            })
        }
    };
    let sink: Box<dyn Sink> = match (&a.data, lines) {
        (Some(data), lines) => {
            // The store's lock (DIR/riptide.lock) is taken here: a server on DIR refuses us.
            let (store, resume) = riptide_store::Store::open_any(data)
                .with_context(|| format!("opening the store in {}", data.display()))?;
            let mut sink = StoreSink::new(store, resume)
                .with_piece_records(usize::try_from(a.landing_records).unwrap_or(usize::MAX))
                .with_collections(&keep);
            // Fault hook (tests): stop a landing once N of its pieces are durable, leaving the
            // data directory as a crash there would.
            if let Some(n) = std::env::var("RIPTIDE_FAULT_LANDING_STOP_AFTER_PIECES")
                .ok()
                .and_then(|v| v.parse().ok())
            {
                sink.crash_after_pieces(n);
            }
            let store: Box<dyn Sink> = Box::new(sink);
            match lines {
                // Both, each exactly once (a pipe: the lines as a pipe allows).
                Some(lines) => Box::new(TeeSink::new(store, lines)),
                None => store,
            }
        }
        (None, Some(lines)) => lines,
        (None, None) => anyhow::bail!("an output is required: --data DIR or --jsonl"),
    };
    let metrics_listener = bind_metrics(a.metrics_listen)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let progress = Arc::new(Progress::default());
    let started = Instant::now();
    let result = rt.block_on(async {
        let resolver = a.resolver()?;
        let lookups = resolver.clone();
        let fetcher = a.crawl.fetcher(resolver, relay, keep, spool)?;
        let hosts = Hosts::new(limits, cfg.global);
        if let Some(l) = metrics_listener {
            let (state, hosts, lookups) = (state.clone(), hosts.clone(), lookups.clone());
            serve_metrics(l, move || {
                let mut s = String::new();
                match riptide_backfill::status(&state, 0) {
                    Ok(st) => riptide_backfill::metrics::render_status(&mut s, &st),
                    Err(e) => tracing::warn!(error = %e, "backfill: /metrics: the state could not be read"),
                }
                riptide_backfill::metrics::render_waits(&mut s, &hosts);
                super::plc::render_lookups(&mut s, &lookups);
                s
            })?;
        }
        let shown = tokio::spawn(show_progress(progress.clone()));
        let snapshots = tokio::spawn(snapshot_status(state.clone(), state_dir.clone()));
        let r =
            riptide_backfill::run(cfg, fetcher, hosts, state.clone(), sink, progress.clone()).await;
        shown.abort();
        snapshots.abort();
        // The last word: the final counts, for `status` after the run.
        write_snapshot(&state, &state_dir);
        if a.plc_mirror.is_some() {
            let (mirror, directory) = lookups.plc_mirror_lookups();
            let (rechecked, stale) = lookups.plc_mirror_rechecks();
            tracing::info!(mirror, directory, rechecked, stale, "backfill: did:plc lookups from the PLC mirror and from the directory (rechecked: asked past the mirror after a failure; stale: the directory's differed)");
        }
        r.map_err(anyhow::Error::from)
    });
    result?;
    let p = &progress;
    tracing::info!(
        ok = p.ok.load(Relaxed),
        failed = p.failed.load(Relaxed),
        skipped = p.skipped.load(Relaxed),
        records = p.records.load(Relaxed),
        bytes = p.bytes.load(Relaxed),
        secs = started.elapsed().as_secs_f64(),
        "backfill: done (riptide backfill status --state DIR for failures by reason)"
    );
    Ok(ExitCode::SUCCESS)
}

/// Opens a state directory (created) for one run: a second one (or a `status` opening the
/// keyspace) beside a running backfill would open fjall twice, so the directory's lock is
/// taken, and held for as long as the returned file lives.
pub fn open_state(dir: &std::path::Path) -> anyhow::Result<(Arc<State>, std::fs::File)> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let lock = lock_file(dir)?;
    match lock.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => anyhow::bail!(
            "{}: another backfill is running on this state (`riptide backfill status --state {}` reports it)",
            dir.display(),
            dir.display()
        ),
        Err(std::fs::TryLockError::Error(e)) => {
            return Err(e).with_context(|| format!("locking {}", dir.display()))
        }
    }
    let state = State::open(dir).with_context(|| format!("opening {}", dir.display()))?;
    Ok((Arc::new(state), lock))
}

/// `status --publish kafka://…`: the Kafka backfill's committed progress.
#[cfg(feature = "kafka")]
fn kafka_status(url: &str, json: bool) -> anyhow::Result<ExitCode> {
    let url = riptide_kafka::KafkaUrl::parse(url).map_err(|e| anyhow::anyhow!("--publish: {e}"))?;
    let s = riptide_kafka::backfill::status(&url)?;
    let mut w = out::stdout();
    if json {
        serde_json::to_writer(&mut w, &s)?;
        writeln!(w)?;
    } else {
        writeln!(
            w,
            "hosts: {} done, {} left, {} with problems (of {}{})",
            s.hosts_done,
            s.hosts_left,
            s.listing_problems.len(),
            s.hosts,
            if s.listing_complete {
                ""
            } else {
                "; no worker's listing of the relay is complete yet"
            }
        )?;
        for (h, p) in &s.listing_problems {
            writeln!(w, "  {h}: {p}")?;
        }
        let failed: u64 = s.repos_failed.values().sum();
        writeln!(w, "repositories: {} ok, {failed} failed", s.repos_ok)?;
        for (reason, n) in &s.repos_failed {
            writeln!(w, "  {reason}: {n}")?;
        }
        writeln!(
            w,
            "records: {} ({} not written: outside the data model)",
            s.records, s.records_dropped
        )?;
    }
    w.flush()?;
    Ok(ExitCode::SUCCESS)
}

/// `--publish kafka://…`: one worker of the Kafka consumer group (docs/kafka.md), to the end of
/// the whole backfill. Large repositories are spooled under --spool-dir (default: the system's
/// temporary directory; unnamed files).
#[cfg(feature = "kafka")]
fn worker(a: &RunArgs, relay: String, url: &str) -> anyhow::Result<ExitCode> {
    use riptide_kafka::backfill::{run_worker, WorkerConfig, WorkerCounts};
    let url = riptide_kafka::KafkaUrl::parse(url).map_err(|e| anyhow::anyhow!("--publish: {e}"))?;
    if a.crawl.discovery != Source::Hosts {
        anyhow::bail!("--publish crawls the relay's hosts (listHosts): --discovery relay is not spread over workers");
    }
    let spool = a.crawl.spool_dir.clone().unwrap_or_else(std::env::temp_dir);
    std::fs::create_dir_all(&spool).with_context(|| format!("creating {}", spool.display()))?;
    let Plan { cfg, limits, .. } = a.crawl.plan(&relay)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let metrics_listener = bind_metrics(a.metrics_listen)?;
    let counts = Arc::new(WorkerCounts::default());
    let started = Instant::now();
    let getter = {
        let _entered = rt.enter();
        let resolver = a.resolver()?;
        let fetcher = a
            .crawl
            .fetcher(resolver, relay.clone(), Collections::default(), spool)?;
        let hosts = Hosts::new(limits, cfg.global);
        if let Some(l) = metrics_listener {
            let (counts, hosts) = (counts.clone(), hosts.clone());
            serve_metrics(l, move || {
                let mut s = String::new();
                let c = counts.counts(started.elapsed().as_secs_f64());
                riptide_backfill::metrics::render_counts(&mut s, &c);
                riptide_backfill::metrics::render_waits(&mut s, &hosts);
                s
            })?;
        }
        Arc::new(riptide_backfill::Getter::new(cfg.clone(), fetcher, hosts)?)
    };
    let wcfg = WorkerConfig {
        url,
        relay,
        window: cfg.window,
    };
    run_worker(&wcfg, getter, rt.handle().clone(), counts.clone())?;
    tracing::info!(
        ok = counts.ok.load(Relaxed),
        failed = counts.failed.load(Relaxed),
        records = counts.records.load(Relaxed),
        hosts = counts.hosts.load(Relaxed),
        partitions_taken = counts.partitions.load(Relaxed),
        transactions = counts.committed.load(Relaxed),
        aborted = counts.aborted.load(Relaxed),
        secs = started.elapsed().as_secs_f64(),
        "backfill worker: every host of the work topic is done (failures: TOPIC.backfill.failed)"
    );
    Ok(ExitCode::SUCCESS)
}

/// Binds `--metrics-listen` before anything starts, so that an address in use is said at once.
fn bind_metrics(
    addr: Option<std::net::SocketAddr>,
) -> anyhow::Result<Option<std::net::TcpListener>> {
    addr.map(|at| {
        let l = std::net::TcpListener::bind(at)
            .with_context(|| format!("listening on {at} (--metrics-listen)"))?;
        l.set_nonblocking(true)?;
        Ok(l)
    })
    .transpose()
}

/// Serves `render()` at `/metrics` on `l` (inside the runtime) for as long as the process runs.
fn serve_metrics(
    l: std::net::TcpListener,
    render: impl Fn() -> String + Clone + Send + Sync + 'static,
) -> anyhow::Result<()> {
    let bound = l.local_addr()?;
    let l = tokio::net::TcpListener::from_std(l)?;
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let render = render.clone();
            async move {
                let text = tokio::task::spawn_blocking(render)
                    .await
                    .unwrap_or_default();
                (
                    [(
                        axum::http::header::CONTENT_TYPE,
                        "text/plain; version=0.0.4; charset=utf-8",
                    )],
                    text,
                )
            }
        }),
    );
    tracing::info!("backfill: serving http://{bound}/metrics");
    tokio::spawn(async move { axum::serve(l, app).await });
    Ok(())
}

/// The lock file of a state directory.
fn lock_file(dir: &std::path::Path) -> anyhow::Result<std::fs::File> {
    let path = dir.join("lock");
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))
}

/// Where a running backfill leaves its status for `status` (which must not open the keyspace
/// beside it).
const SNAPSHOT: &str = "status.json";

/// Writes the status snapshot (atomically: a temporary file renamed over it).
pub fn write_snapshot(state: &State, dir: &std::path::Path) {
    let Ok(s) = riptide_backfill::status(state, 20) else {
        return;
    };
    let tmp = dir.join("status.json.tmp");
    let r = serde_json::to_vec(&s)
        .map_err(std::io::Error::other)
        .and_then(|b| std::fs::write(&tmp, b))
        .and_then(|()| std::fs::rename(&tmp, dir.join(SNAPSHOT)));
    if let Err(e) = r {
        tracing::warn!(dir = %dir.display(), error = %e, "backfill: status snapshot not written");
    }
}

/// The status snapshot every five seconds while the run lasts.
async fn snapshot_status(state: Arc<State>, dir: PathBuf) {
    loop {
        tokio::time::sleep(Duration::from_secs(5)).await;
        let (state, dir) = (state.clone(), dir.clone());
        let _ = tokio::task::spawn_blocking(move || write_snapshot(&state, &dir)).await;
    }
}

/// A progress bar on a terminal, else a log line once a minute.
async fn show_progress(p: Arc<Progress>) {
    let started = Instant::now();
    let line = |p: &Progress| {
        let secs = started.elapsed().as_secs_f64().max(1e-3);
        let ok = p.ok.load(Relaxed);
        let failed = p.failed.load(Relaxed);
        format!(
            "{ok} ok, {failed} failed, {} skipped (done before); {} records; {:.1} MB; {:.1} repos/s; listings {}/{}",
            p.skipped.load(Relaxed),
            p.records.load(Relaxed),
            p.bytes.load(Relaxed) as f64 / 1e6,
            (ok + failed) as f64 / secs,
            p.listings_done.load(Relaxed),
            p.listings.load(Relaxed),
        )
    };
    if std::io::stderr().is_terminal() {
        let bar = indicatif::ProgressBar::new(0);
        if let Ok(style) = indicatif::ProgressStyle::with_template(
            "{elapsed_precise} [{bar:30}] {pos}/{len} repositories (eta {eta}) {msg}",
        ) {
            bar.set_style(style);
        }
        loop {
            let expected = p.expected.load(Relaxed);
            let done = p.ok.load(Relaxed) + p.failed.load(Relaxed) + p.skipped.load(Relaxed);
            bar.set_length(expected.max(done));
            bar.set_position(done);
            bar.set_message(line(&p));
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    } else {
        loop {
            tokio::time::sleep(Duration::from_secs(60)).await;
            tracing::info!("backfill: {}", line(&p));
        }
    }
}
