//! `riptide serve`: the verifying, Jetstream-compatible stream server (riptide-serve).
//!
//! Ingest sources today: `--ingest-file FILE` (not part of the contract: a corpus file, for tests,
//! benchmarks and offline runs; the upstream seq of a frame is its 1-based position in the file,
//! repeated `--ingest-repeat` times, so a restart resumes after the last stored position).
//! `--upstream URL` is parsed but not yet connected: the firehose client is wired in after the
//! client crate lands (it only has to send `(seq, Bytes)` on the ingest channel).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use riptide_firehose::corpus::split_frames;
use riptide_serve::{
    ingest, router, App, Dictionary, IngestConfig, Keys, Log, Metrics, ServerConfig, Store,
    TailLimits,
};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Upstream relay (repeatable). Not yet connected: wired after the client crate lands.
    #[arg(long = "upstream", value_name = "URL")]
    upstream: Vec<String>,
    /// Static DID documents (DID → document JSON) for signature keys.
    #[arg(long, value_name = "FILE")]
    did_docs: Option<PathBuf>,
    /// PLC directory for key resolution (resolution arrives with the identity work).
    #[arg(long, value_name = "URL", default_value = "https://plc.directory")]
    plc_url: String,
    /// Trust the relay: do not verify commits (Jetstream's behaviour). Block CIDs are still checked.
    #[arg(long)]
    no_verify: bool,
    /// Data directory (the event store).
    #[arg(long, value_name = "DIR", default_value = "riptide-data")]
    data: PathBuf,
    /// How long events are kept for replay (e.g. 24h, 90m, 2d).
    #[arg(long, value_name = "DUR", default_value = "24h", value_parser = parse_duration)]
    retention: Duration,
    /// Listen address.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:6008")]
    listen: SocketAddr,
    /// zstd dictionary for compress=true (Jetstream's legacy_subscribe.zdict).
    #[arg(long, value_name = "PATH")]
    zstd_dictionary: Option<PathBuf>,
    /// Not a contract: ingest this corpus file instead of an upstream relay.
    #[arg(long, value_name = "FILE")]
    ingest_file: Option<PathBuf>,
    /// Not a contract: ingest the file this many times (benchmarks).
    #[arg(long, default_value_t = 1, requires = "ingest_file")]
    ingest_repeat: u64,
    /// Not a contract: at most this many frames per second from the file.
    #[arg(long, requires = "ingest_file")]
    ingest_rate: Option<f64>,
}

/// `24h`, `90m`, `30s`, `2d`, or plain seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = num
        .parse()
        .map_err(|_| format!("bad duration {s:?} (use e.g. 24h, 90m, 30s, 2d)"))?;
    let secs = match unit {
        "" | "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        "d" => n * 86400,
        _ => return Err(format!("bad duration unit in {s:?} (s, m, h or d)")),
    };
    Ok(Duration::from_secs(secs))
}

pub fn init_tracing() {
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
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
    let keys = match (&args.did_docs, args.no_verify) {
        (_, true) => None,
        (Some(p), false) => Some(Keys::from_docs(super::load_did_docs(p)?)),
        (None, false) => anyhow::bail!(
            "verification needs --did-docs FILE for now (PLC resolution via --plc-url {} is not wired yet), or --no-verify",
            args.plc_url
        ),
    };
    if !args.upstream.is_empty() {
        tracing::warn!(upstream = ?args.upstream, "--upstream is parsed but not connected yet: it is wired after the client crate lands");
    }
    let dict = match &args.zstd_dictionary {
        Some(p) => Some(Dictionary::load(p)?),
        None => None,
    };
    std::fs::create_dir_all(&args.data)
        .with_context(|| format!("creating {}", args.data.display()))?;
    let (store, resume) = Store::open(&args.data, dict.as_ref().map_or(0, Dictionary::id))?;
    tracing::info!(data = %args.data.display(), next_seq = resume.next_seq, upstream_cursor = ?resume.upstream_cursor, "store open");
    let log = Arc::new(Log::new(store, resume.next_seq, TailLimits::default()));
    let metrics = Arc::new(Metrics::default());
    let config = ServerConfig {
        compression: dict.is_some(),
        ..ServerConfig::default()
    };
    let app = App::new(log.clone(), metrics.clone(), config);

    let cfg = IngestConfig {
        keys,
        workers: 2,
        max_batch: 4096,
        dictionary: dict,
    };
    let (tx, rx) = tokio::sync::mpsc::channel(4096);
    let handle = ingest::spawn(cfg, log.clone(), metrics.clone(), resume, rx)?;
    let ingest_done = {
        let app = app.clone();
        let file = args.ingest_file.clone();
        let (repeat, rate) = (args.ingest_repeat, args.ingest_rate);
        tokio::spawn(async move {
            let fed = match file {
                Some(f) => {
                    feed_file(&f, repeat, rate, resume.upstream_cursor.unwrap_or(0), tx).await
                }
                None => {
                    // Keep the channel open until the client crate is wired in.
                    std::future::pending::<()>().await;
                    Ok(())
                }
            };
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
    tokio::spawn(riptide_serve::retention_loop(
        log.clone(),
        metrics.clone(),
        args.retention,
        Duration::from_secs(60),
    ));

    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("listening on {}", args.listen))?;
    let addr = listener.local_addr()?;
    tracing::info!("serving ws://{addr}/subscribe (metrics at http://{addr}/metrics)");
    eprintln!("riptide serve: ws://{addr}/subscribe");
    let shutdown_app = app.clone();
    let server = axum::serve(listener, router(app.clone())).with_graceful_shutdown(async move {
        shutdown_signal().await;
        tracing::info!("shutting down: closing subscribers with 1001");
        shutdown_app.shutdown();
        shutdown_app.drained(Duration::from_secs(5)).await;
    });
    let mut server = tokio::spawn(async move { server.await });
    let mut ingest_done = ingest_done;
    tokio::select! {
        r = &mut server => { r??; return Ok(ExitCode::SUCCESS) }
        r = &mut ingest_done => {
            // A finite source ended: keep serving; a failure stops the server (crash loud).
            match r {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(e.context("ingest failed")),
                Err(e) => return Err(anyhow::Error::from(e).context("ingest task")),
            }
        }
    }
    server.await??;
    Ok(ExitCode::SUCCESS)
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
    path: &std::path::Path,
    repeat: u64,
    rate: Option<f64>,
    after: u64,
    tx: tokio::sync::mpsc::Sender<riptide_serve::UpstreamFrame>,
) -> anyhow::Result<()> {
    let file = Bytes::from(super::read_file(path)?);
    let frames: Vec<Bytes> = split_frames(&file)?
        .iter()
        .map(|f| file.slice(f.offset..f.offset + f.bytes.len()))
        .collect();
    let n = frames.len() as u64;
    let start = Instant::now();
    let mut sent = 0u64;
    for pos in after + 1..=n * repeat {
        let f = frames[((pos - 1) % n) as usize].clone();
        if tx.send((pos, f)).await.is_err() {
            break;
        }
        sent += 1;
        if let Some(r) = rate {
            let due = Duration::from_secs_f64(sent as f64 / r);
            let el = start.elapsed();
            if due > el + Duration::from_millis(2) {
                tokio::time::sleep(due - el).await;
            }
        }
    }
    Ok(())
}
