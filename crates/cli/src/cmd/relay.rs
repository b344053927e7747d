//! `riptide relay --replay FILE --listen ADDR [--rate EVENTS_PER_S] [--loop]` (a contract).
//!
//! Serves the frames of a corpus file as a local `com.atproto.sync.subscribeRepos` relay (crate
//! `riptide-relay`): its own seqs from 1, `?cursor=N` replay, live fan-out. Hidden flags inject
//! faults for tests. Runs until Ctrl-C, then closes subscribers with 1001.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use riptide_relay::{Faults, Relay, RelayConfig};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Corpus file to serve (format of shared/docs/formats.md).
    #[arg(long)]
    replay: PathBuf,
    /// Address to listen on, e.g. 127.0.0.1:2470 (port 0: any free port; the URL is printed).
    #[arg(long, value_parser = super::parse_listen)]
    listen: SocketAddr,
    /// Events per second (default: all at once).
    #[arg(long)]
    rate: Option<f64>,
    /// Repeat the corpus forever, seqs still increasing (needs --rate).
    #[arg(long = "loop")]
    looped: bool,
    /// Events kept for cursor replay.
    #[arg(long, default_value_t = 10_000)]
    window: usize,
    /// Test fault: drop each connection after this many frames.
    #[arg(long, hide = true)]
    drop_after: Option<usize>,
    /// Test fault: milliseconds to wait before each frame.
    #[arg(long, hide = true)]
    frame_delay_ms: Option<u64>,
    /// Test fault: answer the first K upgrades with 503.
    #[arg(long, hide = true, default_value_t = 0)]
    reject_upgrades: usize,
    /// Test fault: serve every frame exactly as it is in the file (seqs not rewritten, frames
    /// that do not decode not left out), for mutated streams (`riptide mutate`).
    #[arg(long, hide = true)]
    verbatim: bool,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        args.rate.is_none_or(|r| r > 0.0 && r.is_finite()),
        "--rate must be a positive number"
    );
    // Without a rate the feeder would append frames as fast as a core allows, forever: the log's
    // window turns over in milliseconds and no subscriber can keep up (seen as a relay at 100%
    // CPU that never delivers a frame).
    anyhow::ensure!(
        !args.looped || args.rate.is_some(),
        "--loop needs --rate: without a pace the relay would produce frames faster than any subscriber can take them"
    );
    let file = super::read_file(&args.replay)?;
    let frames: Vec<Bytes> = super::corpus_frames(&args.replay, &file)?
        .iter()
        .map(|f| Bytes::copy_from_slice(f.bytes))
        .collect();
    let count = frames.len();
    let config = RelayConfig {
        rate: args.rate,
        looped: args.looped,
        window: args.window,
        faults: Faults {
            drop_after: args.drop_after,
            frame_delay: args.frame_delay_ms.map(Duration::from_millis),
            reject_upgrades: args.reject_upgrades,
            verbatim: args.verbatim,
            ..Faults::default()
        },
        ..RelayConfig::default()
    };
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async move {
        let (addr, relay) = Relay::bind(args.listen, frames, config).await?;
        // The first stdout line is the URL (tests and scripts read it).
        println!("ws://{addr}{}", riptide_relay::SUBSCRIBE_PATH);
        let unservable = relay.stats().unservable.load(Ordering::Relaxed) as usize;
        if unservable > 0 {
            eprintln!(
                "riptide relay: {unservable} frame(s) do not decode far enough to renumber; left out"
            );
        }
        eprintln!(
            "riptide relay: serving {} frames from {}",
            count - unservable,
            args.replay.display()
        );
        tokio::signal::ctrl_c().await?;
        eprintln!("riptide relay: shutting down after seq {}", relay.head());
        relay.shutdown().await;
        anyhow::Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}
