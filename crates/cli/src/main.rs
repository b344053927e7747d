//! `riptide`: decode, verify and serve the AT Protocol event stream.
//!
//! One file per subcommand under `cmd/`. Data goes to stdout (JSON lines where a machine reads
//! it), diagnostics to stderr. Exit codes: 0 success, 1 some input failed (counted and reported),
//! 2 usage or I/O error. A closed stdout pipe (`| head`) ends the program quietly.

mod alloc;
mod cmd;
mod out;

/// glibc's malloc, or mimalloc once a server command switches to it (see `alloc`).
#[global_allocator]
static ALLOC: alloc::Process = alloc::Process;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "riptide",
    version,
    about = "The AT Protocol event stream, decoded and verified"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Decode every frame of a corpus file (block CIDs verified unless --no-verify).
    Decode(cmd::decode::Args),
    /// Print the Jetstream v1 events of a corpus file, one JSON line each.
    Jetstream(cmd::jetstream::Args),
    /// Verify every frame of a corpus: block CIDs, signatures, Sync 1.1 proofs.
    Verify(cmd::verify::Args),
    /// Repository exports (CAR): list, inspect, verify.
    #[command(subcommand)]
    Repo(cmd::repo::Repo),
    /// Make benchmark corpora.
    #[command(subcommand)]
    Corpus(cmd::corpus::CorpusCmd),
    /// Serve a corpus file as a local relay (com.atproto.sync.subscribeRepos).
    Relay(cmd::relay::Args),
    /// Follow a relay firehose or a Jetstream and print its events.
    Tail(cmd::tail::Args),
    /// Benchmarks.
    #[command(subcommand)]
    Bench(cmd::bench::Bench),
    /// Generate a synthetic network: signed firehose frames, DID documents, repositories.
    Gen(cmd::gen::Args),
    /// The trust chain: handle -> DID -> document -> repository, all verified.
    VerifyHandle(cmd::verify_handle::Args),
    /// Serve a generated network (PLC directory, PDS, handles) on loopback, with faults.
    Sim(cmd::sim::Args),
    /// Serve the verified stream as a Jetstream-compatible /subscribe endpoint.
    Serve(cmd::serve::Args),
    /// Offline, live: generate a network, replay it through a local relay, serve it verified.
    Demo(cmd::demo::Args),
    /// zstd dictionaries for compressed subscriptions.
    #[command(subcommand)]
    Dict(cmd::dict::Dict),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The long-running server allocates per frame on many threads; see `alloc`.
    if matches!(
        cli.command,
        Command::Serve(_) | Command::Demo(_) | Command::Bench(cmd::bench::Bench::Serve(_))
    ) {
        alloc::use_mimalloc();
    }
    let result = match cli.command {
        Command::Decode(a) => cmd::decode::run(a),
        Command::Jetstream(a) => cmd::jetstream::run(a),
        Command::Verify(a) => cmd::verify::run(a),
        Command::Repo(r) => cmd::repo::run(r),
        Command::Corpus(c) => cmd::corpus::run(c),
        Command::Bench(b) => cmd::bench::run(b),
        Command::Relay(a) => cmd::relay::run(a),
        Command::Tail(a) => cmd::tail::run(a),
        Command::Gen(a) => cmd::gen::run(a),
        Command::VerifyHandle(a) => cmd::verify_handle::run(a),
        Command::Sim(a) => cmd::sim::run(a),
        Command::Serve(a) => cmd::serve::run(a),
        Command::Demo(a) => cmd::demo::run(a),
        Command::Dict(d) => cmd::dict::run(d),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            if out::is_broken_pipe(&e) {
                return ExitCode::SUCCESS;
            }
            eprintln!("riptide: {e:#}");
            ExitCode::from(2)
        }
    }
}
