//! `riptide sim --from DIR --listen ADDR` (contract): serve a `riptide gen` network on loopback.
//!
//! A PLC directory (`GET /did:plc:…`, documents' PDS rewritten to this server), PDS endpoints
//! (`com.atproto.sync.getRepo`, `listRepos`, `com.atproto.repo.describeRepo`) and handle
//! resolution (`/.well-known/atproto-did` by Host header or `/<handle>/.well-known/atproto-did`),
//! from `riptide-sim`. Faults: `--fault-5xx-every N`, `--fault-drop-every N`, `--fault-delay-ms
//! MS`, or at run time `POST /_sim/faults` with `{"error_every","drop_every","delay_ms"}`.
//!
//! Prints the base URL on stdout (one line, flushed: a test with `--listen 127.0.0.1:0` reads the
//! port from it), then serves until interrupted.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use riptide_sim::{Faults, Network, Sim};

use crate::out;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// A directory written by `riptide gen` (did_docs.json, repos/<did>.car, big-repo.*).
    #[arg(long)]
    from: PathBuf,
    /// Address to listen on (port 0: any free port).
    #[arg(long)]
    listen: SocketAddr,
    /// Answer every Nth request with a 503 (0: never).
    #[arg(long, default_value_t = 0)]
    fault_5xx_every: u64,
    /// Cut every Nth response half-way and drop the connection (0: never).
    #[arg(long, default_value_t = 0)]
    fault_drop_every: u64,
    /// Delay every response by this many milliseconds.
    #[arg(long, default_value_t = 0)]
    fault_delay_ms: u64,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let net = Network::load(&a.from).with_context(|| format!("loading {}", a.from.display()))?;
    let faults = Faults {
        error_every: a.fault_5xx_every,
        drop_every: a.fault_drop_every,
        delay_ms: a.fault_delay_ms,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let (sim, listener) = Sim::bind(net, a.listen, faults)
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
        tokio::select! {
            r = sim.serve(listener) => r.context("serving")?,
            _ = tokio::signal::ctrl_c() => eprintln!("riptide sim: interrupted"),
        }
        Ok(ExitCode::SUCCESS)
    })
}
