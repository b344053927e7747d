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
//! Prints the base URL on stdout (one line, flushed: a test with `--listen 127.0.0.1:0` reads the
//! port from it) and the relay URL on stderr, then serves until interrupted.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::Ordering;

use anyhow::Context;
use riptide_relay::RelayConfig;
use riptide_sim::{Faults, Network, Sim};

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
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let net = Network::load(&a.from).with_context(|| format!("loading {}", a.from.display()))?;
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
        let (sim, listener) = Sim::bind_with(net, a.listen, faults, relay)
            .await
            .with_context(|| format!("binding {}", a.listen))?;
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
        tokio::select! {
            r = sim.serve(listener) => r.context("serving")?,
            _ = tokio::signal::ctrl_c() => eprintln!("riptide sim: interrupted"),
        }
        Ok(ExitCode::SUCCESS)
    })
}
