//! `riptide sim --from DIR --listen ADDR` (contract): serve a `riptide gen` network on loopback.
//!
//! A PLC directory (`GET /did:plc:…`, documents' PDS rewritten to this server), PDS endpoints
//! (`com.atproto.sync.getRepo`, `listRepos`, `com.atproto.repo.describeRepo`) and handle
//! resolution (`/.well-known/atproto-did` by Host header or `/<handle>/.well-known/atproto-did`),
//! from `riptide-sim`, and a relay: `ws://…/xrpc/com.atproto.sync.subscribeRepos[?cursor=N]` on
//! the same address serves `DIR/firehose-frames.bin` (crate `riptide-relay`: seqs from 1, cursor
//! replay, pings; `--relay-rate`, `--relay-loop`).
//!
//! Faults: `--fault-5xx-every N`, `--fault-429-every N` (with `Retry-After: 1`, or
//! `--fault-429-retry-after SECS`),
//! `--fault-drop-every N`, `--fault-delay-ms MS` (every HTTP
//! request, WebSocket upgrades included), `--fault-relay-drop-after N`, `--fault-relay-error-after
//! N`, `--fault-relay-frame-delay-ms MS` (per relay connection), or at run time `POST
//! /_sim/faults` with the same settings as JSON (`{"error_every","drop_every","delay_ms",
//! "relay_drop_after","relay_error_after","relay_frame_delay_ms","rate_limit_every",
//! "rate_limit_retry_after"}`).
//!
//! Hosts (issue 37): `--hosts N` serves N PDS hosts, each on its own loopback port (accounts
//! split by `--host-share` and `--seed`: one large host, a long tail), listed by the relay's
//! `com.atproto.sync.listHosts` on the base URL; per-host limits per client IP
//! (`--limit-get-repo`, `--limit-list-repos`: 20 and 10 per second with `--hosts` > 1);
//! `--host-faults KIND=N,…`, `--repo-faults KIND=N,…`, `--trickle-bytes-per-sec`;
//! `--huge-repo-bytes` for one repository streamed as it is generated; `--manifest FILE` writes
//! what went where (also `GET /_sim/manifest`; counters at `GET /_sim/stats`).
//!
//! Prints the base URL on stdout (one line, flushed: a test with `--listen 127.0.0.1:0` reads the
//! port from it) and the relay URL on stderr, then serves until interrupted.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::Ordering;

use anyhow::Context;
use riptide_relay::RelayConfig;
use riptide_sim::plan::parse_counts;
use riptide_sim::{Faults, Network, PlanConfig, Sim};

use crate::out;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// A directory written by `riptide gen` (did_docs.json, repos/<did>.car, big-repo.*).
    #[arg(long)]
    from: PathBuf,
    /// Address to listen on (port 0: any free port).
    #[arg(long, value_parser = super::parse_listen)]
    listen: SocketAddr,
    /// Answer every Nth request with a 503 (0: never).
    #[arg(long, default_value_t = 0)]
    fault_5xx_every: u64,
    /// Answer every Nth request with a 429 and `Retry-After: 1` (0: never).
    #[arg(long = "fault-429-every", default_value_t = 0)]
    fault_429_every: u64,
    /// The `Retry-After` of those 429s, in seconds (default 1; any u64, to test a client's cap).
    #[arg(long = "fault-429-retry-after")]
    fault_429_retry_after: Option<u64>,
    /// Cut every Nth response half-way and drop the connection (0: never).
    #[arg(long, default_value_t = 0)]
    fault_drop_every: u64,
    /// Delay every response by this many milliseconds.
    #[arg(long, default_value_t = 0)]
    fault_delay_ms: u64,
    /// Relay: drop each connection (no close frame) after this many frames.
    #[arg(long)]
    fault_relay_drop_after: Option<usize>,
    /// Relay: send an error frame and close after this many frames.
    #[arg(long)]
    fault_relay_error_after: Option<usize>,
    /// Relay: wait this many milliseconds before each frame.
    #[arg(long, default_value_t = 0)]
    fault_relay_frame_delay_ms: u64,
    /// Relay: events per second (default: all at once).
    #[arg(long)]
    relay_rate: Option<f64>,
    /// Relay: repeat the stream forever, seqs still increasing.
    #[arg(long)]
    relay_loop: bool,
    /// PDS hosts, each on its own loopback port (1: this address is the one PDS, as before).
    #[arg(long, default_value_t = 1)]
    hosts: usize,
    /// Share of the accounts on host 0 (the rest spread over hosts 1… with weights 1/k).
    #[arg(long, default_value_t = riptide_gen::hosts::DEFAULT_SHARE)]
    host_share: f64,
    /// Seed of the host split and of which hosts and repositories get the faults.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// getRepo requests per second per client IP per host (0: off). Default: 20 with
    /// `--hosts` > 1, off with one host (as before).
    #[arg(long)]
    limit_get_repo: Option<u32>,
    /// listRepos requests per second per client IP per host (0: off). Default: 10 with
    /// `--hosts` > 1, off with one host.
    #[arg(long)]
    limit_list_repos: Option<u32>,
    /// Host faults, `KIND=COUNT,…` (offline, 5xx, trickle); never host 0.
    #[arg(long, default_value = "")]
    host_faults: String,
    /// Repository faults, `KIND=COUNT,…` (cut-at-block, other-did, bad-signature,
    /// missing-block, 5xx, trickle, deactivated, takendown).
    #[arg(long, default_value = "")]
    repo_faults: String,
    /// Bytes per second of a trickling body.
    #[arg(long, default_value_t = 2048)]
    trickle_bytes_per_sec: u64,
    /// Also serve one repository of about this many bytes, generated as it is sent (never held
    /// in memory), for an extra account (on the host the split gives it; never faulty).
    #[arg(long, value_name = "BYTES")]
    huge_repo_bytes: Option<u64>,
    /// The text size of each record of that repository.
    #[arg(long, default_value_t = riptide_gen::huge_repo::DEFAULT_RECORD_BYTES)]
    huge_repo_record_bytes: usize,
    /// Write the manifest (hosts, limits, faults; also at GET /_sim/manifest) to this file.
    #[arg(long)]
    manifest: Option<PathBuf>,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    // Arguments first: a bad one is said before a large network is loaded.
    anyhow::ensure!(a.hosts >= 1, "--hosts must be at least 1");
    anyhow::ensure!(
        (0.0..=1.0).contains(&a.host_share),
        "--host-share is a share from 0 to 1"
    );
    anyhow::ensure!(
        a.trickle_bytes_per_sec > 0,
        "--trickle-bytes-per-sec must be positive"
    );
    let many = a.hosts > 1;
    let plan = PlanConfig {
        hosts: a.hosts,
        host_share: a.host_share,
        seed: a.seed,
        get_repo_per_sec: a.limit_get_repo.unwrap_or(if many { 20 } else { 0 }),
        list_repos_per_sec: a.limit_list_repos.unwrap_or(if many { 10 } else { 0 }),
        host_faults: parse_counts(&a.host_faults).context("--host-faults")?,
        repo_faults: parse_counts(&a.repo_faults).context("--repo-faults")?,
        trickle_bytes_per_sec: a.trickle_bytes_per_sec,
    };
    let mut net =
        Network::load(&a.from).with_context(|| format!("loading {}", a.from.display()))?;
    if let Some(bytes) = a.huge_repo_bytes {
        let huge = riptide_gen::HugeRepo::new(a.seed, bytes, a.huge_repo_record_bytes)
            .context("generating the huge repository")?;
        eprintln!(
            "riptide sim: huge repository {} of {} bytes, {} records (streamed on demand)",
            huge.account.did,
            huge.car_len(),
            huge.records()
        );
        net.set_huge_repo(huge)?;
    }
    let faults = Faults {
        error_every: a.fault_5xx_every,
        drop_every: a.fault_drop_every,
        delay_ms: a.fault_delay_ms,
        relay_drop_after: a.fault_relay_drop_after,
        relay_error_after: a.fault_relay_error_after,
        relay_frame_delay_ms: a.fault_relay_frame_delay_ms,
        rate_limit_every: a.fault_429_every,
        rate_limit_retry_after: a.fault_429_retry_after,
    };
    anyhow::ensure!(
        a.relay_rate.is_none_or(|r| r > 0.0 && r.is_finite()),
        "--relay-rate must be a positive number"
    );
    let relay = RelayConfig {
        rate: a.relay_rate,
        looped: a.relay_loop,
        ..RelayConfig::default()
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let (sim, listeners) = Sim::bind_network(net, a.listen, faults, relay, plan)
            .await
            .with_context(|| format!("starting on {}", a.listen))?;
        let manifest = sim.manifest();
        if let Some(path) = &a.manifest {
            std::fs::write(path, serde_json::to_vec_pretty(&manifest)?)
                .with_context(|| format!("writing {}", path.display()))?;
        }
        let accounts = sim.network().accounts().count();
        let repos = sim
            .network()
            .accounts()
            .filter(|x| x.repo.is_some())
            .count();
        let mut stdout = out::stdout();
        writeln!(stdout, "{}", sim.base_url())?;
        stdout.flush()?;
        eprintln!(
            "riptide sim: {accounts} accounts, {repos} repositories at {}",
            sim.base_url()
        );
        match sim.relay() {
            Some(relay) => {
                let unservable = relay.stats().unservable.load(Ordering::Relaxed) as usize;
                if unservable > 0 {
                    eprintln!(
                        "riptide sim: {unservable} frame(s) of the stream do not decode far \
                         enough for a relay to serve them (adversarial output); left out"
                    );
                }
                eprintln!(
                    "riptide sim: relay of {} frames at {}",
                    sim.network().frames().len() - unservable,
                    sim.relay_url()
                );
            }
            None => eprintln!("riptide sim: no firehose-frames.bin, no relay"),
        }
        if many {
            for h in manifest["hosts"].as_array().into_iter().flatten() {
                eprintln!(
                    "riptide sim: host {} at {}: {} accounts{}",
                    h["index"],
                    h["url"].as_str().unwrap_or_default(),
                    h["accounts"],
                    h["fault"]
                        .as_str()
                        .map(|f| format!(", fault {f}"))
                        .unwrap_or_default()
                );
            }
        }
        let faults = manifest["faults"].as_array().map_or(0, Vec::len);
        if faults > 0 {
            eprintln!("riptide sim: {faults} faulty repositories (see the manifest)");
        }
        if let Some(seq) = sim.repos_as_of_seq() {
            eprintln!("riptide sim: repositories are as of relay seq {seq}");
        }
        let stats_sim = sim.clone();
        tokio::select! {
            r = sim.serve_network(listeners) => r.context("serving")?,
            _ = tokio::signal::ctrl_c() => eprintln!("riptide sim: interrupted"),
        }
        let stats = stats_sim.stats();
        if stats["rate_limited"].as_u64().unwrap_or(0) > 0 {
            eprintln!("riptide sim: 429s served per host: {}", stats["hosts"]);
        }
        Ok(ExitCode::SUCCESS)
    })
}
