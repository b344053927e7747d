//! `riptide serve`: the verifying, Jetstream-compatible stream server (riptide-serve).
//!
//! Ingest source: `--upstream URL` (repeatable, default `wss://bsky.network`) through
//! [`riptide_serve::upstream`] (riptide-client: rotation, backoff with jitter; the store's
//! upstream cursor is the resume point). Not part of the contract: `--ingest-file FILE` (a corpus
//! file, for tests, benchmarks and offline runs; the upstream seq of a frame is its 1-based
//! position in the file, repeated `--ingest-repeat` times).
//!
//! Keys: `--did-docs FILE`, or else PLC (`--plc-url`) and did:web resolution with a bounded
//! cache (`--did-cache`), warmed before each frame is verified. One identity source: resync's
//! key and PDS come from the same place as the frames' keys (the file, when given). [`start`] is also what `riptide
//! demo` runs.
//!
//! Prints its URL (`ws://ADDR/subscribe`) as the first stdout line, as `relay` and `sim` do; logs
//! go to stderr. `--config FILE` (the same settings in TOML) is read in `config`, before these
//! arguments are parsed: a flag added here is a config key with no change there.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use riptide_firehose::corpus::split_frames;
use riptide_resolver::{
    Resolver, ResolverConfig, ResolverKeys, ResyncConfig, Resyncer, StaticDocs,
};
use riptide_serve::resync::{ResyncLimits, ResyncService};
use riptide_serve::{
    ingest, router, upstream, App, ConnInfo, ConnLimits, Dictionary, IngestConfig, Keys,
    LimitedListener, Log, Metrics, ServerConfig, Store, TailLimits, UpstreamConfig,
};

/// The public Bluesky relay.
pub const DEFAULT_UPSTREAM: &str = "wss://bsky.network";

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Scale-out ingest node: publish every verified batch to this Kafka topic
    /// (kafka://HOST:PORT[,HOST:PORT…]/TOPIC), its events and the upstream cursor in one
    /// transaction, before the local store. Of several nodes with the same topic one publishes,
    /// the others wait as standbys and take over when it dies (docs/kafka.md).
    #[arg(long, value_name = "kafka://BROKERS/TOPIC", conflicts_with = "from")]
    pub publish: Option<String>,
    /// Edge node: serve the events of this Kafka topic (written by a --publish node), stored in
    /// the local --data, instead of ingesting from a relay. Cursors are the ingest node's seqs,
    /// the same on every edge.
    #[arg(long, value_name = "kafka://BROKERS/TOPIC", conflicts_with_all = ["upstream", "ingest_file"])]
    pub from: Option<String>,
    /// Upstream relay (repeatable; rotated on failure). Default: wss://bsky.network.
    #[arg(long = "upstream", value_name = "URL")]
    pub upstream: Vec<String>,
    /// Upstream cursor to start from when the store holds none (default: live). After that,
    /// the store's cursor always wins (see --reset-upstream-cursor).
    #[arg(long, value_name = "SEQ")]
    pub upstream_cursor: Option<u64>,
    /// Forget the store's upstream cursor before starting, and follow the relay from
    /// --upstream-cursor (or live): for a relay that was reset or replaced (it answers
    /// FutureCursor, or numbers its events differently). Stored events are kept.
    #[arg(long)]
    pub reset_upstream_cursor: bool,
    /// Convert a data directory written by an older riptide (store layout 2: one value per
    /// event) into compressed blocks (layout 3) before starting; a directory already converted
    /// is left alone. Without it such a directory is refused with a message naming this flag.
    #[arg(long)]
    pub migrate_store: bool,
    /// Most client connections at once (also capped by the open-file limit minus what the store
    /// needs); over it, new connections get 503 and are closed.
    #[arg(long, value_name = "N", default_value_t = 10_000, value_parser = parse_positive)]
    pub max_connections: usize,
    /// Most client connections at once from one IP address.
    #[arg(long, value_name = "N", default_value_t = 1_000, value_parser = parse_positive)]
    pub max_connections_per_ip: usize,
    /// Time a connection has to send a request's headers: from accept, and on a keep-alive
    /// connection from the last response (slow or idle connections are closed after it).
    #[arg(long, value_name = "DUR", default_value = "10s", value_parser = parse_nonzero_duration)]
    pub header_timeout: Duration,
    /// /readyz answers 503 when no upstream frame arrived for this long (0: never for
    /// idleness; an unconnected upstream is always not ready).
    #[arg(long, value_name = "DUR", default_value = "120s", value_parser = parse_duration)]
    pub ready_max_idle: Duration,
    /// Static DID documents (DID → document JSON) for signature keys, instead of resolution.
    /// Resync takes each account's key and PDS from them too (--plc-url is then unused).
    #[arg(long, value_name = "FILE")]
    pub did_docs: Option<PathBuf>,
    /// PLC directory for key and PDS resolution, frames' and resync's (without --did-docs);
    /// did:web is resolved over HTTPS.
    #[arg(long, value_name = "URL", default_value = "https://plc.directory")]
    pub plc_url: String,
    /// Most DID documents cached (LRU), with negative entries.
    #[arg(long, value_name = "N", default_value_t = 200_000)]
    pub did_cache: usize,
    /// Trust the relay: do not verify commits (Jetstream's behaviour). Block CIDs are still checked.
    #[arg(long)]
    pub no_verify: bool,
    /// Verify each frame on its own: no per-account chain state (rev, since, prevData, hosting
    /// status), so a replayed or out-of-order commit that is validly signed is served.
    #[arg(long)]
    pub stateless: bool,
    /// Do not resync accounts whose chain breaks: the breaking commit re-establishes the chain
    /// (as `riptide verify` does) and the account's later commits are served. By default a
    /// broken account's repository is fetched (relay, then PDS) and verified, and its frames are
    /// held until it lands (`riptide_serve::resync`).
    #[arg(long)]
    pub no_resync: bool,
    /// Data directory (the event store; resync spools large repositories in DIR/spool/).
    #[arg(long, value_name = "DIR", default_value = "riptide-data")]
    pub data: PathBuf,
    /// How long events are kept for replay (e.g. 24h, 90m, 2d).
    #[arg(long, value_name = "DUR", default_value = "24h", value_parser = parse_nonzero_duration)]
    pub retention: Duration,
    /// Seal the store's row blocks into a segment file of Jetstream v2's archive
    /// (DATA/segments/seg_XXXXXXXXXX.jss) once they hold this many bytes (default 256 MiB, as
    /// Jetstream). Sealed events stay replayable on both wires and are served by the archive
    /// endpoints, folded by the store's compaction thread (superseded rows leave the files,
    /// docs/archive.md "Folding"); the store deletes nothing by age, and --retention only sets
    /// the live floor (the oldest cursor served live; never above the newest segment's first
    /// seq). An edge (--from) seals and folds the rows the ingest node publishes with its
    /// events (docs/kafka.md, `riptide-row`), so it serves the same archive. 0: no archive of
    /// our own and no folding; the store deletes what --retention leaves behind, as before
    /// sealing existed.
    #[arg(long, value_name = "BYTES", default_value_t = 256 << 20)]
    pub segment_bytes: u64,
    /// Listen address.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:6008", value_parser = super::parse_listen)]
    pub listen: SocketAddr,
    /// Also serve /metrics, /healthz, /readyz and the status page / (only those) on this address, outside the
    /// subscriber connection budget, so that probes answer however many subscribers there are
    /// (the main port keeps a small reserve for them too). Bind it where only monitoring reaches.
    #[arg(long, value_name = "ADDR", value_parser = super::parse_listen)]
    pub metrics_listen: Option<SocketAddr>,
    /// zstd dictionary for compress=true (Jetstream's legacy_subscribe.zdict).
    #[arg(long, value_name = "PATH")]
    pub zstd_dictionary: Option<PathBuf>,
    /// zstd dictionary of /xrpc/network.bsky.jetstream.subscribeEvents (`zstdDictionary=<id>`,
    /// served by getZstdDictionary; Jetstream v2's is subscribe_events_20260811.zdict). Not
    /// stored: it may change across restarts.
    #[arg(long = "zstd-dictionary-v2", value_name = "PATH")]
    pub zstd_dictionary_v2: Option<PathBuf>,
    /// Require this bearer key (`Authorization: Bearer TOKEN`) on the archive endpoints
    /// (planSnapshot, listSegments, getSegment, getBlock); others get 401. Default: any key.
    #[arg(long, value_name = "TOKEN")]
    pub archive_token: Option<String>,
    /// Bytes each archive client (its bearer key, else its IP) may download with getSegment and
    /// getBlock per --archive-quota-window; past it, 429 with Retry-After. Default: no quota.
    #[arg(long, value_name = "N", value_parser = parse_positive_u64)]
    pub archive_quota_bytes: Option<u64>,
    /// The window of --archive-quota-bytes (e.g. 1h, 10m).
    #[arg(long, value_name = "DUR", default_value = "1h", value_parser = parse_nonzero_duration)]
    pub archive_quota_window: Duration,
    /// Verification threads (default: two per core, so that a busy account's share of the work
    /// does not leave a core idle; frames are assigned to threads by DID).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u8).range(1..))]
    pub workers: Option<u8>,
    /// How often the status line is logged (a minute; shorter for tests).
    #[arg(long, value_name = "DUR", default_value = "60s", value_parser = parse_nonzero_duration, hide = true)]
    pub status_interval: Duration,
    /// Not a contract: ingest this corpus file instead of an upstream relay.
    #[arg(long, value_name = "FILE")]
    pub ingest_file: Option<PathBuf>,
    /// Not a contract: ingest the file this many times (benchmarks).
    #[arg(long, default_value_t = 1, requires = "ingest_file")]
    pub ingest_repeat: u64,
    /// Not a contract: at most this many frames per second from the file.
    #[arg(long, requires = "ingest_file")]
    pub ingest_rate: Option<f64>,
    /// Backfill the network's existing repositories beside ingest (issue 37): the first
    /// --upstream's hosts and accounts crawled as `riptide backfill` crawls them, each
    /// repository verified and stored through ingest as one `create` per record (over an
    /// account already served, as replacement rows: a `#sync` then its records, v2 only), the
    /// live frames of an account held as --backfill-hold says; progress in DATA/backfill, so a
    /// restart resumes. The discovery and limit flags below are `riptide backfill`'s.
    #[arg(long, conflicts_with_all = ["no_verify", "stateless", "no_resync", "from", "publish", "ingest_file"])]
    pub backfill: bool,
    /// Whose live frames --backfill holds until their repository lands: `in-flight` (only the
    /// accounts being fetched; the others are served live, and their repository replaces what
    /// was served) or `all` (every account not yet backfilled, from the crawl's start to its
    /// end: exact against a network whose repositories are as of the stream's start, but on
    /// the real network the hold's 256 MiB fill in minutes and the rest overflow into resyncs).
    #[arg(long, value_enum, default_value_t = BackfillHold::InFlight, requires = "backfill")]
    pub backfill_hold: BackfillHold,
    /// Land a repository (a resync's, with --backfill the crawl's, with --backfill-from the
    /// Kafka workers') in pieces of at most N
    /// records, as `riptide backfill --landing-records` does, each its own durable store batch
    /// with the account's frames held from the first to the last (memory per landing bounded
    /// by the piece; after a restart a backfill resumes after the last piece written, a resync
    /// lands again after a new #sync).
    #[arg(long, value_name = "N", default_value_t = riptide_backfill::landing::PIECE_RECORDS as u64, value_parser = clap::value_parser!(u64).range(1..))]
    pub landing_records: u64,
    /// With --publish: also serve the backfill workers' output (`riptide backfill --publish
    /// kafka://BROKERS/TOPIC` writes TOPIC.backfill): each verified repository lands through
    /// ingest in this node's seq space (and so reaches the edges), the live frames of accounts
    /// with no verified commit held until theirs lands or the workers are done, as with
    /// --backfill (docs/kafka.md).
    #[arg(long, value_name = "kafka://BROKERS/TOPIC", requires = "publish", conflicts_with_all = ["backfill", "no_verify", "stateless"])]
    pub backfill_from: Option<String>,
    #[command(flatten, next_help_heading = "Backfill (with --backfill)")]
    pub crawl: super::backfill::CrawlArgs,
}

/// `--backfill-hold` (`riptide_serve::backfill::BackfillHold`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackfillHold {
    /// Only the accounts whose repository is being fetched.
    InFlight,
    /// Every account not yet backfilled, for the whole crawl.
    All,
}

/// Resync's settings: large repositories spool under `DATA/spool/` (created here), not the
/// system's temporary directory, which on a tmpfs `/tmp` is memory (8 resyncs of up to 512 MiB
/// at once; issue 40). The spool files are unnamed: nothing is left there, even after a crash.
fn resync_config(data: &std::path::Path) -> anyhow::Result<ResyncConfig> {
    let spool = data.join("spool");
    std::fs::create_dir_all(&spool).with_context(|| format!("creating {}", spool.display()))?;
    Ok(ResyncConfig {
        spool_dir: Some(spool),
        ..ResyncConfig::default()
    })
}

/// The largest duration a flag takes (100 years).
const MAX_DURATION_SECS: u64 = 36_500 * 86_400;

/// A byte count that must be at least 1 (`--archive-quota-bytes`), as [`parse_positive`].
pub fn parse_positive_u64(s: &str) -> Result<u64, String> {
    match s.parse::<u64>() {
        Ok(0) => Err("0 would refuse every download; give at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(format!("{s:?}: {e}")),
    }
}

/// A count that must be at least 1: `0` would refuse every connection (or mean "no limit" to a
/// reader who guesses), so it is refused with a reason rather than taken (issue 39).
pub fn parse_positive(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("0 would refuse every connection; give at least 1".into()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("{s:?} is not a whole number")),
    }
}

/// [`parse_duration`] for a setting where zero makes no sense (a retention that keeps nothing, a
/// header timeout that closes every connection at once): refused with a reason (issue 39).
pub fn parse_nonzero_duration(s: &str) -> Result<Duration, String> {
    match parse_duration(s)? {
        d if d.is_zero() => Err(format!(
            "{s:?} is zero, which would keep nothing or close every connection at once; give a positive duration"
        )),
        d => Ok(d),
    }
}

/// `24h`, `90m`, `30s`, `2d`, or plain seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = num
        .parse()
        .map_err(|_| format!("bad duration {s:?} (use e.g. 24h, 90m, 30s, 2d)"))?;
    let secs = match unit {
        "" | "s" => Some(n),
        "m" => n.checked_mul(60),
        "h" => n.checked_mul(3600),
        "d" => n.checked_mul(86400),
        _ => return Err(format!("bad duration unit in {s:?} (s, m, h or d)")),
    };
    // A hundred years at most: a deadline is `now +` it, which must not overflow the clock.
    match secs {
        Some(secs) if secs <= MAX_DURATION_SECS => Ok(Duration::from_secs(secs)),
        _ => Err(format!("duration {s:?} is too large (at most 36500d)")),
    }
}

pub fn init_tracing() {
    init_tracing_with("info");
}

/// Logs to stderr (see `crate::log`: `RUST_LOG`, or `default` moved by `-v`/`-q`).
pub fn init_tracing_with(default: &str) {
    crate::log::init(default);
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    init_tracing();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(serve(args))
}

async fn serve(args: Args) -> anyhow::Result<ExitCode> {
    let running = start(&args).await?;
    // The first stdout line is the URL, as `relay` and `sim` print theirs (scripts read it); the
    // same on stderr, beside the log, for a person reading the terminal or a log file.
    println!("ws://{}/subscribe", running.addr);
    // With JSON logs, stderr is the log's alone (the log says both addresses already).
    if !crate::log::json() {
        eprintln!("riptide serve: ws://{}/subscribe", running.addr);
        if let Some(m) = running.metrics_addr {
            eprintln!("riptide serve: probes at http://{m}/metrics, /healthz, /readyz, and the status page /");
        }
    }
    let addr = running.addr;
    match running.run_until(shutdown_signal()).await {
        Err(e) if needs_reopen(&e) => restart(e, addr),
        r => r.map(|()| ExitCode::SUCCESS),
    }
}

/// Whether ingest stopped because the store must be reopened (it failed a write on a full disk,
/// and space is back: see `riptide_serve::ingest`).
fn needs_reopen(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        matches!(
            c.downcast_ref::<riptide_serve::ingest::IngestError>(),
            Some(riptide_serve::ingest::IngestError::Store(
                riptide_serve::StoreError::NeedsReopen { .. }
            ))
        ) || matches!(
            c.downcast_ref::<riptide_serve::StoreError>(),
            Some(riptide_serve::StoreError::NeedsReopen { .. })
        )
    })
}

/// Replaces this process with a fresh `riptide serve` with the same arguments (same pid, so a
/// supervisor sees no exit): the store is reopened, and ingest resumes from its durable cursor.
/// It listens on `addr`, the address this process bound: with `--listen …:0` a new bind would
/// pick another port, and clients (and the script that read the first stdout line) would lose
/// the server.
#[cfg(unix)]
fn restart(why: anyhow::Error, addr: SocketAddr) -> anyhow::Result<ExitCode> {
    use std::os::unix::process::CommandExt;
    tracing::warn!(reason = %why, %addr, "disk space is back: restarting to reopen the store");
    let exe = std::env::current_exe()?;
    let e = std::process::Command::new(exe)
        .args(listening_on(std::env::args_os().skip(1), addr))
        .exec();
    Err(anyhow::Error::from(e).context("restarting riptide serve"))
}

#[cfg(not(unix))]
fn restart(why: anyhow::Error, _: SocketAddr) -> anyhow::Result<ExitCode> {
    Err(why)
}

/// `args` (the command line after the program name) with `--listen` given as `addr`, whether
/// it was given (`--listen X`, `--listen=X`), set by `--config`, or left to its default.
fn listening_on(
    args: impl IntoIterator<Item = std::ffi::OsString>,
    addr: SocketAddr,
) -> Vec<std::ffi::OsString> {
    let mut out = Vec::new();
    let mut args = args.into_iter();
    while let Some(a) = args.next() {
        if a == "--listen" {
            args.next();
        } else if !a.to_str().is_some_and(|a| a.starts_with("--listen=")) {
            out.push(a);
        }
    }
    out.extend(["--listen".into(), addr.to_string().into()]);
    out
}

/// A started server: ingest running, `/subscribe` listening.
pub struct Running {
    /// The bound address.
    pub addr: SocketAddr,
    /// The bound address of `--metrics-listen`.
    pub metrics_addr: Option<SocketAddr>,
    /// The shared state (log, metrics).
    pub app: Arc<App>,
    /// The resolver, when keys come from PLC / did:web.
    pub resolver: Option<Resolver>,
    stop: Arc<tokio::sync::Notify>,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
    ingest_done: tokio::task::JoinHandle<anyhow::Result<()>>,
    /// Where the ingest source runs (kept for as long as the server).
    source: SourceRuntime,
}

/// The runtime of the ingest source (the relay client, or the file feeder) and of the key
/// lookups verification waits on: one thread of its own, beside the runtime that serves
/// subscribers.
///
/// Why: on the serving runtime the source is one task among a thousand subscribers' tasks,
/// polled about as often as each of them. With 1,000 unfiltered subscribers saturating two
/// cores it read upstream at a fraction of the offered rate (the file source once at ~100
/// frames/s of 5,000), and since it was the source that starved, nothing queued in front of
/// ingest: `riptide_ingest_queue_frames` read 0 and the subscribers' step-aside never came into
/// play. On a thread of its own the operating system gives the source its share of the CPU
/// whatever the fan-out does, so upstream frames reach ingest as they arrive, and a backlog, if
/// verification cannot keep up, is in the ingest queue where `/metrics` shows it and
/// subscribers step aside for it (`riptide_serve::server`, "Ingest comes first").
struct SourceRuntime(Option<tokio::runtime::Runtime>);

impl SourceRuntime {
    fn new() -> std::io::Result<SourceRuntime> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("ingest-source")
            .enable_all()
            .build()?;
        Ok(SourceRuntime(Some(rt)))
    }

    fn handle(&self) -> tokio::runtime::Handle {
        match &self.0 {
            Some(rt) => rt.handle().clone(),
            None => tokio::runtime::Handle::current(),
        }
    }
}

impl Drop for SourceRuntime {
    fn drop(&mut self) {
        // Dropped on the serving runtime: a runtime may not block there while it stops.
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

impl Running {
    /// Serves until `until` resolves (or ingest fails), then closes subscribers with 1001.
    pub async fn run_until(
        self,
        until: impl std::future::Future<Output = ()>,
    ) -> anyhow::Result<()> {
        let Running {
            stop,
            mut server,
            mut ingest_done,
            source: _source,
            ..
        } = self;
        let stopper = stop.clone();
        tokio::pin!(until);
        tokio::select! {
            _ = &mut until => stopper.notify_one(),
            r = &mut server => { r??; return Ok(()) }
            r = &mut ingest_done => {
                // A finite source ended: keep serving; a failure stops the server (crash loud).
                match r {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => return Err(e.context("ingest failed")),
                    Err(e) => return Err(anyhow::Error::from(e).context("ingest task")),
                }
                tokio::select! {
                    _ = &mut until => stopper.notify_one(),
                    r = &mut server => { r??; return Ok(()) }
                }
            }
        }
        server.await??;
        Ok(())
    }
}

/// Opens the store, starts ingest from the configured source and serves `/subscribe`.
pub async fn start(args: &Args) -> anyhow::Result<Running> {
    let source_rt = SourceRuntime::new()?;
    let mut resolver = None;
    // An edge (--from) verifies nothing itself: the ingest node did.
    let verifies = !(args.no_verify || args.from.is_some());
    // One identity source for frames and resync: the --did-docs file, when given.
    let docs = match &args.did_docs {
        Some(p) if verifies => Some(Arc::new(super::load_did_docs(p)?)),
        _ => None,
    };
    // Keys (and, for resync, repositories) through PLC / did:web as --plc-url says, or the file.
    let new_resolver = || {
        Resolver::new(ResolverConfig {
            plc_url: args.plc_url.trim_end_matches('/').to_owned(),
            cache_capacity: args.did_cache,
            timeout: Duration::from_secs(10),
            did_docs: docs.clone().map(StaticDocs),
            ..ResolverConfig::default()
        })
    };
    // The relays ingest follows (and resync asks `getRepo` first).
    let hosts = if args.upstream.is_empty() {
        vec![DEFAULT_UPSTREAM.to_owned()]
    } else {
        args.upstream.clone()
    };
    let keys = match (&docs, verifies) {
        (_, false) => None,
        (Some(d), true) => Some(Keys::from_shared_docs(d.clone())),
        (None, true) => {
            let r = new_resolver()?;
            resolver = Some(r.clone());
            let keys = ResolverKeys::new(r).resolving_on(source_rt.handle());
            Some(Keys(Arc::new(keys)))
        }
    };
    // Checks before side effects (issue 39): the open-file limit, the Kafka address, the
    // dictionaries and both listeners are said, each in one line, before the store is opened,
    // anything connects upstream or to Kafka, or a subscriber is taken.
    let limits = connection_limits(args)?;
    // Every upstream URL as the client will parse it (a bad scheme, host or port), all of them
    // and not only the first the rotation picks: a relay URL that cannot be used is a
    // configuration error, said before the store is opened.
    if args.from.is_none() && args.ingest_file.is_none() {
        for h in &hosts {
            riptide_client::check_host(h).with_context(|| format!("--upstream {h}"))?;
        }
    }
    if let Some(url) = args.publish.as_ref().or(args.from.as_ref()) {
        super::serve_kafka::check(url).await?;
    }
    if let Some(url) = &args.backfill_from {
        super::serve_kafka::check(url)
            .await
            .context("--backfill-from")?;
    }
    let backfill = match args.backfill {
        true => Some(super::serve_backfill::plan(&args.crawl, &hosts[0])?),
        false => None,
    };
    let dict = match &args.zstd_dictionary {
        Some(p) => Some(super::load_dictionary(p)?),
        None => None,
    };
    let v2_dictionary = match &args.zstd_dictionary_v2 {
        Some(p) => Some(Dictionary::load(p)?),
        None => None,
    };
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("listening on {}", args.listen))?;
    let metrics_listener = match args.metrics_listen {
        Some(at) => Some(
            tokio::net::TcpListener::bind(at)
                .await
                .with_context(|| format!("listening on {at} (--metrics-listen)"))?,
        ),
        None => None,
    };
    std::fs::create_dir_all(&args.data)
        .with_context(|| format!("creating {}", args.data.display()))?;
    if args.migrate_store {
        let m = Store::migrate(&args.data)?;
        tracing::warn!(
            data = %args.data.display(),
            from_layout = m.from,
            events = m.events,
            blocks = m.blocks,
            "store migrated (--migrate-store)"
        );
    }
    // An edge (--from) stores the rows the ingest node publishes, so it seals as it does.
    let options = riptide_serve::StoreOptions {
        segment_bytes: (args.segment_bytes > 0).then_some(args.segment_bytes),
        ..Default::default()
    };
    let (store, mut resume) =
        Store::open_with(&args.data, dict.as_ref().map_or(0, Dictionary::id), options)?;
    if args.reset_upstream_cursor {
        store.set_upstream_cursor(None)?;
        tracing::warn!(
            old = ?resume.upstream_cursor,
            new = ?args.upstream_cursor,
            "upstream cursor reset (--reset-upstream-cursor): following the relay from {}",
            args.upstream_cursor.map_or_else(|| "its live position".to_string(), |c| format!("seq {c}"))
        );
        resume.upstream_cursor = None;
    }
    tracing::info!(data = %args.data.display(), next_seq = resume.next_seq, upstream_cursor = ?resume.upstream_cursor, "store open");
    // Scale-out ingest node: hold the lease, fence earlier publishers, catch the store up with
    // the topic; ingest then resumes from the topic's committed upstream cursor.
    let metrics = Arc::new(Metrics::default());
    let publishing = match &args.publish {
        Some(url) => {
            let p = super::serve_kafka::publishing(
                url,
                &store,
                resume,
                keys.is_some(),
                metrics.clone(),
            )
            .await?;
            resume = p.resume;
            if args.reset_upstream_cursor {
                // The topic's cursor is forgotten too: the next batch records the new one.
                resume.upstream_cursor = None;
            }
            Some(p)
        }
        None => None,
    };
    let log = Arc::new(Log::new(store, resume.next_seq, TailLimits::default()));
    // The archive: the store's sealed segments, as its catalog names them, and any file copied
    // into DATA/segments/, verified at start (`archive.rs`); then each segment the store seals.
    let named: Vec<_> = log
        .store()
        .segment_entries()
        .iter()
        .map(|e| log.store().segment_path(e))
        .collect();
    let sealed = riptide_serve::archive::SealedSegments::start(&log.store().segments_dir(), &named)
        .with_context(|| format!("scanning {}", args.data.join("segments").display()))?;
    let sealed = Arc::new(sealed);
    // Folding (issue 38, docs/archive.md "Folding"): whenever the store seals, its compaction
    // thread folds the sealed segments after each seal (`seal_loop` asks) and every minute
    // besides; the writer then prunes the tombstones a pass finished with. Each file it rewrites
    // is read again for the archive (a file that fails is refused there, said and counted). The
    // thread stops with the store's last clone (a pass finishes its current file first).
    if args.segment_bytes > 0 {
        let rewritten = sealed.clone();
        log.store()
            .start_compaction(Default::default(), move |path| {
                let _ = rewritten.add(path);
            })
            .context("starting the compaction thread")?;
    }
    let archive = Arc::new(riptide_serve::archive::Archive::new(
        sealed,
        riptide_serve::archive::ArchiveConfig {
            token: args.archive_token.clone(),
            quota: args
                .archive_quota_bytes
                .map(|bytes| riptide_serve::archive::Quota {
                    bytes,
                    window: args.archive_quota_window,
                }),
            ..Default::default()
        },
    ));
    let archived = archive.segments().clone();
    // What the status page says the server ingests from.
    let mut sources = match (&args.from, &args.ingest_file) {
        (Some(url), _) => vec![format!("{url} (edge)")],
        (None, Some(f)) => vec![format!("file {}", f.display())],
        (None, None) => hosts.clone(),
    };
    if let Some(url) = &args.publish {
        sources.push(format!("publishing to {url}"));
    }
    if let Some(url) = &args.backfill_from {
        sources.push(format!("backfill from {url}"));
    }
    let config = ServerConfig {
        sources,
        archive: Some(archive),
        v1_dictionary: dict.clone(),
        ready_max_idle: Some(args.ready_max_idle).filter(|d| !d.is_zero()),
        v2_dictionary,
        ..ServerConfig::default()
    };
    let app = App::new(log.clone(), metrics.clone(), config);
    // Counting from here, before ingest starts: the status lines add up to the whole run.
    tokio::spawn(riptide_serve::status::run(
        app.clone(),
        args.status_interval,
    ));

    let ingest_done = if let Some(url) = &args.from {
        // Edge: the topic is the source; the store and both wires are as on a single node.
        let edge =
            super::serve_kafka::edge(url, log.clone(), metrics.clone(), resume, dict.as_ref())?;
        let app = app.clone();
        tokio::spawn(async move {
            let r = edge.done.await;
            app.ingest_finished.store(true, Relaxed);
            r?
        })
    } else {
        let cfg = IngestConfig {
            keys,
            workers: args
                .workers
                .map_or_else(riptide_serve::default_workers, usize::from),
            max_batch: 4096,
            dictionary: dict,
            stateful: !args.stateless,
        };
        let resync = if args.no_resync || args.stateless || args.no_verify {
            None
        } else {
            // Resync needs DID documents for the PDS and key: the resolver's, or one made for it
            // (with --did-docs, from the file: the same keys as the frames'; issue 40).
            let r = match &resolver {
                Some(r) => r.clone(),
                None => new_resolver()?,
            };
            let relays = if args.ingest_file.is_some() {
                Vec::new()
            } else {
                hosts.clone()
            };
            Some(ResyncService::start(
                Resyncer::new(r, resync_config(&args.data)?),
                relays,
                ResyncLimits {
                    landing_records: usize::try_from(args.landing_records).unwrap_or(usize::MAX),
                    ..ResyncLimits::default()
                },
                log.store().clone(),
                metrics.clone(),
            ))
        };
        let (tx, rx) = tokio::sync::mpsc::channel(4096);
        match backfill {
            Some(plan) => {
                let r = match &resolver {
                    Some(r) => r.clone(),
                    None => new_resolver()?,
                };
                let wiring = super::serve_backfill::Wiring {
                    store: log.store().clone(),
                    next_seq: resume.next_seq,
                    tx: tx.clone(),
                    metrics: metrics.clone(),
                };
                super::serve_backfill::start(
                    &args.crawl,
                    (args.backfill_hold, args.landing_records),
                    &args.data,
                    plan,
                    r,
                    wiring,
                )?;
            }
            // The backfill workers' output on Kafka: held from the start, as above; every
            // account not yet backfilled (this node cannot see which the workers are fetching).
            None if args.backfill_from.is_some() => {
                tx.try_send(riptide_serve::Upstream::BackfillStart(
                    riptide_serve::backfill::BackfillHold::All,
                ))
                .map_err(|_| anyhow::anyhow!("ingest's input is not open"))?;
                super::serve_kafka::backfill_tail(
                    args.backfill_from.as_deref().unwrap_or_default(),
                    log.store().clone(),
                    tx.clone(),
                    resume.next_seq,
                    metrics.clone(),
                    usize::try_from(args.landing_records).unwrap_or(usize::MAX),
                )?;
            }
            // Frames a backfill held when the server last stopped are verified and released.
            None => {
                let _ = tx.try_send(riptide_serve::Upstream::BackfillOver);
            }
        }
        let (publisher, lease) = match publishing {
            Some(p) => (Some(p.publisher), Some(p.lease)),
            None => (None, None),
        };
        let handle = ingest::spawn_with(
            cfg,
            log.clone(),
            metrics.clone(),
            resume,
            rx,
            resync,
            publisher,
        )?;
        let source: std::pin::Pin<
            Box<dyn std::future::Future<Output = anyhow::Result<()>> + Send>,
        > = match &args.ingest_file {
            Some(f) => Box::pin(feed_file(
                f.clone(),
                args.ingest_repeat,
                args.ingest_rate,
                resume.upstream_cursor.unwrap_or(0),
                tx,
            )),
            None => {
                let start_cursor = resume.upstream_cursor.or(args.upstream_cursor);
                // Said now, not when the source's thread first runs it: `/metrics` answers
                // as soon as the listener is up.
                metrics
                    .upstream_start_cursor
                    .store(start_cursor.unwrap_or(0), Relaxed);
                if start_cursor.is_none() {
                    tracing::warn!(
                        "starting live (no stored cursor): only events from now on are ingested; \
                             use --upstream-cursor 0 to replay what the relay holds"
                    );
                }
                let mut ucfg = UpstreamConfig::new(hosts);
                ucfg.resolver = resolver.clone();
                ucfg.stored_until_us = (resume.last_time_us > 0).then_some(resume.last_time_us);
                let m = metrics.clone();
                Box::pin(async move {
                    upstream::run(ucfg, start_cursor, m, tx).await?;
                    Ok(())
                })
            }
        };
        let ingest_done = {
            let app = app.clone();
            // The source on its own thread (`SourceRuntime`).
            let mut source = source_rt.handle().spawn(source);
            let mut failed = handle.failed();
            tokio::spawn(async move {
                // The ingest lease (--publish) is held for as long as ingest runs.
                let _lease = lease;
                // A pipeline thread that fails stops ingest whatever the source does: a quiet
                // upstream would otherwise keep this waiting, and the process looking alive.
                let fed = source_outcome(&mut source, &mut failed).await;
                let joined = tokio::task::spawn_blocking(move || handle.join()).await;
                app.ingest_finished.store(true, Relaxed);
                match (fed, joined) {
                    (Err(e), _) => Err(e),
                    (_, Ok(Ok(s))) => {
                        tracing::info!(
                            frames = s.frames,
                            events = s.events,
                            next_seq = s.resume.next_seq,
                            "ingest finished"
                        );
                        Ok(())
                    }
                    (_, Ok(Err(e))) => Err(anyhow::Error::from(e)),
                    (_, Err(e)) => Err(anyhow::Error::from(e)),
                }
            })
        };
        ingest_done
    };
    tokio::spawn(riptide_serve::seal_loop(
        log.clone(),
        archived,
        metrics.clone(),
        Duration::from_secs(1),
    ));
    tokio::spawn(riptide_serve::retention_loop(
        log.clone(),
        metrics.clone(),
        args.retention,
        Duration::from_secs(60),
    ));

    let addr = listener.local_addr()?;
    tracing::info!(
        max_connections = limits.max_connections,
        per_ip = limits.per_ip,
        "serving ws://{addr}/subscribe (metrics at http://{addr}/metrics)"
    );
    let listener = LimitedListener::new(listener, limits, metrics.clone());
    // The probes' own listener: outside the subscriber budget (`riptide_serve::limits`). It
    // lives as long as the process.
    let metrics_addr = match metrics_listener {
        Some(l) => {
            let bound = l.local_addr()?;
            tracing::info!(
                "serving http://{bound}/metrics, /healthz, /readyz and the status page /"
            );
            let l = LimitedListener::probes(l, limits.header_timeout, metrics.clone());
            let svc = router(app.clone()).into_make_service_with_connect_info::<ConnInfo>();
            tokio::spawn(async move { axum::serve(l, svc).await });
            Some(bound)
        }
        None => None,
    };
    let stop = Arc::new(tokio::sync::Notify::new());
    let shutdown_app = app.clone();
    let stopped = stop.clone();
    let service = router(app.clone()).into_make_service_with_connect_info::<ConnInfo>();
    let server = axum::serve(listener, service).with_graceful_shutdown(async move {
        stopped.notified().await;
        tracing::info!("shutting down: closing subscribers with 1001");
        shutdown_app.shutdown();
        shutdown_app.drained(Duration::from_secs(5)).await;
    });
    let server = tokio::spawn(async move { server.await });
    Ok(Running {
        addr,
        metrics_addr,
        app,
        resolver,
        stop,
        server,
        ingest_done,
        source: source_rt,
    })
}

/// How the source ended, as `serve` must report it: waits for the source, or for a pipeline
/// thread's failure (which stops ingest whatever the source does: the source is aborted and the
/// pipeline's own error is the one `join` gives).
///
/// The pipeline also ends without failing when its channel closes, which only the source's end
/// does: the source drops its sender as it returns, a moment before its task's result is ready.
/// That end of the watch is not a failure, and it is not the source's result either: the result
/// is awaited. Taking it for a finished source turned a failed upstream into `ingest finished
/// frames=0` with the server still serving (seen about once in ten starts).
async fn source_outcome(
    source: &mut tokio::task::JoinHandle<anyhow::Result<()>>,
    failed: &mut tokio::sync::watch::Receiver<Option<String>>,
) -> anyhow::Result<()> {
    let result = |r: Result<anyhow::Result<()>, tokio::task::JoinError>| {
        r.unwrap_or_else(|e| Err(anyhow::Error::from(e).context("ingest source task")))
    };
    let pipeline_failed = tokio::select! {
        biased;
        r = &mut *source => return result(r),
        w = failed.wait_for(Option::is_some) => w.is_ok(),
    };
    if pipeline_failed {
        source.abort();
        Ok(())
    } else {
        result(source.await)
    }
}

/// The connection limits under the open-file limit, raised first to the hard one
/// (`riptide_serve::limits::raise_fd_limit`); a warning, once, naming the limit and the fix when
/// it still cannot hold `--max-connections`.
fn connection_limits(args: &Args) -> anyhow::Result<ConnLimits> {
    let raised = riptide_serve::limits::raise_fd_limit();
    match &raised {
        Ok(r) if r.after != r.before => tracing::info!(
            from = ?r.before, to = ?r.after, "open-file limit raised to the hard limit"
        ),
        Ok(_) => {}
        Err(e) => {
            tracing::warn!(error = %e, "could not raise the open-file limit to the hard limit")
        }
    }
    let limits = ConnLimits {
        max_connections: args.max_connections,
        per_ip: args.max_connections_per_ip,
        header_timeout: args.header_timeout,
    }
    .effective()?;
    if limits.max_connections < args.max_connections {
        let (soft, hard) = match raised {
            Ok(r) => (r.after, r.hard),
            Err(_) => (riptide_serve::limits::fd_limit(), None),
        };
        let show = |l: Option<u64>| l.map_or_else(|| "unlimited".into(), |n| n.to_string());
        tracing::warn!(
            max_connections = args.max_connections,
            allowed = limits.max_connections,
            open_file_limit = %show(soft),
            hard_limit = %show(hard),
            "the open-file limit allows only {} of the {} connections of --max-connections: \
             raise it (LimitNOFILE= in systemd, ulimit -n, --ulimit nofile= in docker) to at \
             least {}",
            limits.max_connections,
            args.max_connections,
            args.max_connections as u64
                + riptide_serve::limits::RESERVED_FDS
                + 2 * riptide_serve::limits::PROBE_RESERVE as u64,
        );
    }
    Ok(limits)
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! { _ = ctrl_c => {}, _ = term => {} }
}

/// Sends the frames of a corpus file, `repeat` times, skipping positions ≤ `after`.
pub async fn feed_file(
    path: PathBuf,
    repeat: u64,
    rate: Option<f64>,
    after: u64,
    tx: tokio::sync::mpsc::Sender<riptide_serve::Upstream>,
) -> anyhow::Result<()> {
    let file = Bytes::from(super::read_file(&path)?);
    let frames: Vec<Bytes> = split_frames(&file)?
        .iter()
        .map(|f| file.slice(f.offset..f.offset + f.bytes.len()))
        .collect();
    let n = frames.len() as u64;
    let start = Instant::now();
    let mut sent = 0u64;
    for pos in after + 1..=n * repeat {
        let f = frames[((pos - 1) % n) as usize].clone();
        if tx.send((pos, f).into()).await.is_err() {
            break;
        }
        sent += 1;
        if let Some(r) = rate {
            // Saturating: a rate of 0 (or below) paces nothing rather than panicking.
            let due = Duration::try_from_secs_f64(sent as f64 / r).unwrap_or(Duration::ZERO);
            let el = start.elapsed();
            if due > el + Duration::from_millis(2) {
                tokio::time::sleep(due - el).await;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The race behind a server that kept serving after its upstream failed: the pipeline's
    /// watch closes (the source dropped its sender) before the source's result is ready. The
    /// source's error must win, every time; a real pipeline failure still stops the source.
    #[tokio::test]
    async fn a_source_error_is_not_taken_for_a_finished_source() {
        for _ in 0..50 {
            let (tx, mut failed) = tokio::sync::watch::channel(None::<String>);
            let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
            let mut source = tokio::spawn(async move {
                let _ = go_rx.await;
                tokio::task::yield_now().await;
                Err::<(), _>(anyhow::anyhow!("upstream refused"))
            });
            // The pipeline ends first, as it does when the channel closes.
            drop(tx);
            go_tx.send(()).unwrap();
            let r = source_outcome(&mut source, &mut failed).await;
            assert_eq!(r.unwrap_err().to_string(), "upstream refused");
        }
        let (tx, mut failed) = tokio::sync::watch::channel(None::<String>);
        let mut source = tokio::spawn(std::future::pending::<anyhow::Result<()>>());
        tx.send_replace(Some("ingest-writer: disk full".into()));
        assert!(source_outcome(&mut source, &mut failed).await.is_ok());
        assert!(source.await.unwrap_err().is_cancelled());
        // A source that ends well is a finished source.
        let (_tx, mut failed) = tokio::sync::watch::channel(None::<String>);
        let mut source = tokio::spawn(async { Ok(()) });
        assert!(source_outcome(&mut source, &mut failed).await.is_ok());
    }

    fn args(a: &[&str]) -> Vec<std::ffi::OsString> {
        a.iter().map(Into::into).collect()
    }

    /// Issue 39: values that would silently refuse every connection or keep nothing are refused
    /// with a reason; Jetstream's `--listen :6008` is every IPv4 interface.
    #[test]
    fn zero_limits_are_refused_and_a_bare_port_listens_everywhere() {
        assert!(parse_positive("0")
            .unwrap_err()
            .contains("refuse every connection"));
        assert_eq!(parse_positive("12"), Ok(12));
        assert!(parse_positive("x").is_err());
        for zero in ["0", "0s", "0h"] {
            assert!(
                parse_nonzero_duration(zero).unwrap_err().contains("zero"),
                "{zero}"
            );
        }
        assert_eq!(parse_nonzero_duration("90m"), Ok(Duration::from_secs(5400)));
        assert_eq!(
            super::super::parse_listen(":6008"),
            Ok(SocketAddr::from(([0, 0, 0, 0], 6008)))
        );
        assert!(super::super::parse_listen(":99999").is_err());
        assert!(super::super::parse_listen(":").is_err());
    }

    #[test]
    fn a_restart_listens_where_this_process_did() {
        let at: SocketAddr = "127.0.0.1:43117".parse().unwrap();
        let want = |a: &[&str]| {
            let mut w = args(a);
            w.extend(args(&["--listen", "127.0.0.1:43117"]));
            w
        };
        for (given, kept) in [
            (
                &["--data", "d", "--listen", "127.0.0.1:0", "--no-verify"][..],
                &["--data", "d", "--no-verify"][..],
            ),
            (&["--listen=127.0.0.1:0", "--data", "d"], &["--data", "d"]),
            (&["--config", "riptide.toml"], &["--config", "riptide.toml"]),
            (&[], &[]),
        ] {
            assert_eq!(listening_on(args(given), at), want(kept), "{given:?}");
        }
        // What the restarted process parses: the bound address, once.
        let line = [
            vec!["riptide".into(), "serve".into()],
            listening_on(args(&["--listen", "127.0.0.1:0"]), at),
        ]
        .concat();
        let cli = <crate::Cli as clap::Parser>::try_parse_from(line).unwrap();
        match cli.command {
            crate::Command::Serve(a) => assert_eq!(a.serve.listen, at),
            _ => panic!("not serve"),
        }
    }

    #[test]
    fn durations_parse_and_an_absurd_one_is_refused_not_overflowed() {
        assert_eq!(parse_duration("90m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("2d"), Ok(Duration::from_secs(172_800)));
        assert_eq!(
            parse_duration("36500d"),
            Ok(Duration::from_secs(MAX_DURATION_SECS))
        );
        for bad in [
            "36501d",
            "18446744073709551615d",
            "18446744073709551615",
            "5x",
            "h",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn resync_spools_under_the_data_directory() {
        let data = tempfile::tempdir().unwrap();
        let cfg = resync_config(data.path()).unwrap();
        let spool = data.path().join("spool");
        assert_eq!(cfg.spool_dir.as_deref(), Some(spool.as_path()));
        assert!(spool.is_dir(), "created at start");
        // Again (a restart): fine.
        resync_config(data.path()).unwrap();
    }
}
