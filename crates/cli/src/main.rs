//! `riptide`: decode, verify and serve the AT Protocol event stream.
//!
//! One file per subcommand under `cmd/`. Data goes to stdout (JSON lines where a machine reads
//! it), diagnostics to stderr. Exit codes: 0 success, 1 some input failed (counted and reported),
//! 2 usage or I/O error. A closed stdout pipe (`| head`) ends the program quietly. Logging and
//! the error line: `log`.

// The subcommands' doc comments are clap's `--help` text, where `<did>`, `<TAB>` and the like are
// meant literally; rustdoc would read them as HTML tags.
#![allow(rustdoc::invalid_html_tags)]

mod alloc;
mod cmd;
mod log;
mod out;

/// glibc's malloc, or mimalloc once a server command switches to it (see `alloc`).
#[global_allocator]
static ALLOC: alloc::Process = alloc::Process;

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

/// `riptide --version`: the crate version and the git commit it was built from (`build.rs`).
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("RIPTIDE_GIT_COMMIT"),
    ")"
);

#[derive(Parser, Debug)]
#[command(
    name = "riptide",
    version = VERSION,
    about = "The AT Protocol event stream, decoded and verified",
    after_help = "Logs go to stderr: -v/-q move the level one step (RUST_LOG, when set, is used instead). \
                  Colour only on a terminal, never with NO_COLOR set; --log-format json writes one JSON object a line. \
                  A FILE argument of - reads stdin."
)]
struct Cli {
    /// More log output (repeat for more); RUST_LOG overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
    /// Less log output (repeat for less); RUST_LOG overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count, conflicts_with = "verbose")]
    quiet: u8,
    /// Log lines as text, or one JSON object per line (for log shippers).
    #[arg(long, global = true, value_enum, value_name = "FORMAT", default_value_t = log::Format::Text, env = "RIPTIDE_LOG_FORMAT")]
    log_format: log::Format,
    #[command(subcommand)]
    command: Command,
}

// Parsed once at startup: the size of the largest variant (`serve`'s many flags) costs nothing.
#[allow(clippy::large_enum_variant)]
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
    /// An account's identity: a handle or DID, its DID document, the handle checked both ways.
    Resolve(cmd::resolve::Args),
    /// One record (at://HANDLE-OR-DID/COLLECTION/RKEY), fetched with its proof, checked, as JSON.
    Get(cmd::get::Args),
    /// A local copy of the PLC directory: pull its /export (resumable, each operation
    /// checked), show its status, time lookups from it.
    #[command(subcommand)]
    Plc(cmd::plc::Plc),
    /// Serve a generated network (PLC directory, PDS, handles) on loopback, with faults.
    Sim(cmd::sim::Args),
    /// Backfill the network's repositories, each verified whole: JSON lines, resumable.
    Backfill(cmd::backfill::Args),
    /// Serve the verified stream as a Jetstream-compatible /subscribe endpoint.
    Serve(cmd::config::ServeArgs),
    /// Offline, live: generate a network, replay it through a local relay, serve it verified.
    Demo(cmd::demo::Args),
    /// zstd dictionaries for compressed subscriptions.
    #[command(subcommand)]
    Dict(cmd::dict::Dict),
    /// A serve data directory's integrity: check every stored block and event, repair.
    #[command(subcommand)]
    Store(cmd::store::StoreCmd),
    /// Check this machine: corpus, a store's dictionary, upstream and PLC reachable, disk, fd
    /// limit, Java for the Kafka tests. One line per check; exit 1 when one fails.
    Doctor(cmd::doctor::Args),
    /// Print a shell completion script (e.g. `riptide completions bash > /etc/bash_completion.d/riptide`).
    Completions(cmd::docs::CompletionsArgs),
    /// Print the man page (roff), or write one page per command with --out-dir.
    Man(cmd::docs::ManArgs),
    /// Mutated frames for the fault suite: one field or a few bytes changed per frame, labelled.
    #[command(hide = true)]
    Mutate(cmd::mutate::Args),
}

fn main() -> ExitCode {
    let cli = match cmd::config::parse_with_config(std::env::args_os().collect()) {
        Ok(cli) => cli,
        Err(e) => {
            eprintln!("riptide: {}", log::error_text(&e));
            return ExitCode::from(2);
        }
    };
    // Read once by riptide-sha; refused here so that a typo does not silently measure the CPU's
    // own path (see `riptide_sha::cap`).
    if let Err(v) = riptide_sha::kernel_from_env() {
        eprintln!(
            "riptide: {}={v:?}: not a SHA-256 kernel cap (sha2, shani2, avx512x16 or auto)",
            riptide_sha::KERNEL_ENV
        );
        return ExitCode::from(2);
    }
    log::set_verbosity(cli.verbose, cli.quiet);
    log::set_format(cli.log_format);
    log::init(match cli.command {
        Command::Serve(_) | Command::Backfill(_) | Command::Plc(cmd::plc::Plc::Mirror(_)) => "info",
        Command::Demo(_) => "error",
        _ => "warn",
    });
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
        Command::Resolve(a) => cmd::resolve::run(a),
        Command::Get(a) => cmd::get::run(a),
        Command::Plc(p) => cmd::plc::run(p),
        Command::Sim(a) => cmd::sim::run(a),
        Command::Backfill(a) => cmd::backfill::run(a),
        Command::Serve(a) => cmd::serve::run(a.serve),
        Command::Demo(a) => cmd::demo::run(a),
        Command::Dict(d) => cmd::dict::run(d),
        Command::Store(c) => cmd::store::run(c),
        Command::Doctor(a) => cmd::doctor::run(a),
        Command::Completions(a) => cmd::docs::completions(a, command()),
        Command::Man(a) => cmd::docs::man(a, command()),
        Command::Mutate(a) => cmd::mutate::run(a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            if out::is_broken_pipe(&e) {
                return ExitCode::SUCCESS;
            }
            log::fatal(&log::error_text(&e));
            ExitCode::from(2)
        }
    }
}

/// The command line's definition: the derived one, with every `serve` flag also read from its
/// `RIPTIDE_*` environment variable (`cmd::config`, "Environment").
fn command() -> clap::Command {
    Cli::command().mut_subcommand("serve", cmd::config::with_env)
}

/// Parses the command line (`cmd::config` adds a `serve --config` file's settings first).
fn parse_args(argv: &[std::ffi::OsString]) -> Result<(Cli, clap::ArgMatches), clap::Error> {
    let matches = command().try_get_matches_from(argv)?;
    let cli = Cli::from_arg_matches(&matches)?;
    Ok((cli, matches))
}
