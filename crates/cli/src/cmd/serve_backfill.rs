//! `riptide serve --backfill` (issue 37): the crawl of `riptide backfill` started beside ingest,
//! its repositories landing through ingest's writer (`riptide_serve::backfill`).
//!
//! Why apart from `serve.rs`: the crawl's setup (its state in `DATA/backfill`, the same flags
//! and checks as `riptide backfill`, the status snapshot `riptide backfill status --data DIR`
//! reads, the numbers `/metrics` and the status page show) is the backfill command's, reused;
//! `serve.rs` only says when.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use riptide_backfill::{Fetching, Hosts, Progress, State};
use riptide_resolver::Resolver;
use riptide_serve::backfill::IngestSink;
use riptide_serve::{Metrics, Store, Upstream};

use super::backfill::{open_state, relay_base, write_snapshot, CrawlArgs, Plan, STATE_IN_DATA};

/// How often the state's report is refreshed for `/metrics`, the status page and `riptide
/// backfill status`.
const REFRESH: Duration = Duration::from_secs(5);

/// Checks the flags against the relay crawled (the first `--upstream`): said before anything
/// starts.
pub fn plan(crawl: &CrawlArgs, upstream: &str) -> anyhow::Result<(String, Plan)> {
    let relay = relay_base(upstream)?;
    let plan = crawl.plan(&relay)?;
    Ok((relay, plan))
}

/// What the crawl needs from the server.
pub struct Wiring {
    /// The store ingest writes.
    pub store: Store,
    /// Its next seq when opened.
    pub next_seq: u64,
    /// Ingest's input.
    pub tx: tokio::sync::mpsc::Sender<Upstream>,
    /// The server's metrics.
    pub metrics: Arc<Metrics>,
}

/// Starts the crawl (call before the upstream source starts: the hold begins before any
/// frame). Its state is `DATA/backfill`, locked for as long as the crawl runs.
pub fn start(
    crawl: &CrawlArgs,
    (hold, landing_records): (super::serve::BackfillHold, u64),
    data: &std::path::Path,
    (relay, plan): (String, Plan),
    resolver: Resolver,
    w: Wiring,
) -> anyhow::Result<()> {
    let state_dir = data.join(STATE_IN_DATA);
    let (state, lock) = open_state(&state_dir)?;
    let spool = crawl.spool(&state_dir)?;
    let Plan {
        mut cfg,
        limits,
        keep,
    } = plan;
    // The accounts being fetched: held in either mode (with `all`, those with a verified
    // commit too, as `riptide_serve::backfill::BackfillHold::AllFetching` says why).
    let f = Arc::new(Fetching::default());
    cfg.fetching = Some(f.clone());
    *w.metrics
        .backfill
        .fetching
        .lock()
        .unwrap_or_else(|e| e.into_inner()) = Some(f.clone());
    let hold = match hold {
        super::serve::BackfillHold::All => riptide_serve::backfill::BackfillHold::AllFetching(f),
        super::serve::BackfillHold::InFlight => riptide_serve::backfill::BackfillHold::InFlight(f),
    };
    let fetcher = crawl.fetcher(resolver, relay, keep, spool)?;
    let hosts = Hosts::new(limits, cfg.global);
    *w.metrics
        .backfill
        .hosts
        .lock()
        .unwrap_or_else(|e| e.into_inner()) = Some(hosts.clone());
    let progress = Arc::new(Progress::default());
    let b = &w.metrics.backfill;
    *b.progress.lock().unwrap_or_else(|e| e.into_inner()) = Some(progress.clone());
    b.running.store(true, Relaxed);
    // First in ingest's input: nothing of the upstream has been sent yet.
    w.tx.try_send(Upstream::BackfillStart(hold))
        .map_err(|_| anyhow::anyhow!("ingest's input is not open"))?;
    let mut sink = IngestSink::new(w.store, w.tx.clone(), w.next_seq)
        .with_piece_records(usize::try_from(landing_records).unwrap_or(usize::MAX));
    // Fault hook (tests): abort once N pieces of a landing are durable, as `kill -9` there would.
    if let Some(n) = std::env::var("RIPTIDE_FAULT_LANDING_STOP_AFTER_PIECES")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        sink = sink.abort_after_pieces(n);
    }
    let sink = Box::new(sink);
    let (tx, metrics) = (w.tx, w.metrics);
    tracing::info!(data = %state_dir.display(), relay = %cfg.relay, "backfill: crawling beside ingest (riptide backfill status --data DIR reports it)");
    tokio::spawn(async move {
        let _lock = lock;
        let refresh = tokio::spawn(refresh(state.clone(), state_dir.clone(), metrics.clone()));
        let fetching = cfg.fetching.clone();
        let r = riptide_backfill::run(cfg, fetcher, hosts, state.clone(), sink, progress).await;
        // A crawl that stopped early leaves fetches it will not finish: none is in flight now
        // (the frames held for them are released with the rest below).
        if let Some(f) = fetching {
            f.clear();
        }
        refresh.abort();
        report(&state, &state_dir, &metrics).await;
        let b = &metrics.backfill;
        b.running.store(false, Relaxed);
        match r {
            Ok(()) => {
                b.finished.store(true, Relaxed);
                tracing::info!(
                    landed = b.landed.load(Relaxed),
                    superseded = b.superseded.load(Relaxed),
                    "backfill: done; the frames held for it are verified and released (riptide backfill status --data DIR lists failures by reason)"
                );
            }
            Err(e) => {
                tracing::error!(error = %e, "backfill stopped: the frames held for it are verified and released; restart to resume it");
                *b.error.lock().unwrap_or_else(|e| e.into_inner()) = Some(e.to_string());
            }
        }
        // After every repository it handed over: the held frames go on in order.
        if tx.send(Upstream::BackfillOver).await.is_err() {
            tracing::debug!("backfill: ingest ended first");
        }
    });
    Ok(())
}

/// The state's report into the metrics and the snapshot file, every [`REFRESH`], and a log
/// line once a minute (a service has no progress bar).
async fn refresh(state: Arc<State>, dir: std::path::PathBuf, metrics: Arc<Metrics>) {
    let mut last_line = tokio::time::Instant::now();
    loop {
        report(&state, &dir, &metrics).await;
        if last_line.elapsed() >= Duration::from_secs(60) {
            last_line = tokio::time::Instant::now();
            if let Some(s) = metrics.backfill.status() {
                tracing::info!(
                    listings_done = s.listings_done,
                    listings_left = s.listings_left,
                    ok = s.repos_ok,
                    failed = s.repos_failed_total,
                    records = s.records,
                    repos_per_sec = format!("{:.1}", s.repos_per_sec),
                    eta_secs = s.eta_secs.map(|e| e.round() as u64),
                    held_frames = metrics.resync_held.load(Relaxed),
                    "backfill: progress"
                );
            }
        }
        tokio::time::sleep(REFRESH).await;
    }
}

async fn report(state: &Arc<State>, dir: &std::path::Path, metrics: &Arc<Metrics>) {
    let (state, dir, metrics) = (state.clone(), dir.to_owned(), metrics.clone());
    let _ = tokio::task::spawn_blocking(move || {
        write_snapshot(&state, &dir);
        match riptide_backfill::status(&state, 20) {
            Ok(s) => {
                *metrics
                    .backfill
                    .status
                    .lock()
                    .unwrap_or_else(|e| e.into_inner()) = Some(s)
            }
            Err(e) => tracing::warn!(error = %e, "backfill: status not read"),
        }
    })
    .await;
}
