//! The crawl: listings, repository tasks under the host limits, one writer.
//!
//! Why this shape:
//! - A *listing* (a host's `listRepos`, the relay's, a collection's, a DID file) is one task
//!   that reads a page, starts a task per account not yet done (at most
//!   [`Config::window`] at once for a host's own listing, so its waiting accounts stay bounded),
//!   waits for all of them to have a committed status, then commits the page's cursor. At most
//!   [`Config::listings_at_once`] listings run at once.
//! - A *repository task* resolves the account (key, PDS), then for each source in turn (PDS,
//!   then the relay when the PDS failed in transport, `FailKind::try_elsewhere`) waits for the
//!   host's leave ([`Hosts::admit`]: host slot, `429` pause, token, then a global slot), fetches
//!   and verifies. A `429` pauses the host and is waited out (at most [`MAX_WAITS`] times); a
//!   transient failure is retried with exponential backoff up to [`Config::attempts`]; then the
//!   failure is final and recorded with its reason.
//! - With several client addresses ([`Fetcher::bound_to`]), a repository's `getRepo`s go out
//!   on one lane, the host's lanes taken in turn, under the host's limits for that lane; the
//!   listings go out from the first address.
//! - One *writer* (a thread: the sink and fjall block) takes finished repositories from a
//!   bounded channel, writes them to the sink, makes the sink durable, commits the statuses in
//!   one batch, then tells each task. Batching amortizes the fsyncs; the bound on the channel
//!   bounds the verified repositories held in memory. A batch short of [`BATCH_RECORDS`]
//!   records waits up to [`GATHER`] for more repositories: the store seals a batch's whole
//!   blocks of rows at once and makes only the rest past them into events waiting unsealed
//!   (`riptide_store::Store::append_landing`), so small batches (about 3,000 records when the
//!   writer took only what was queued) sent most rows the long way. The repositories it holds
//!   are those whose tasks wait for its answer, inside `--concurrency`.
//!
//! Crash safety is the state's ([`crate::state`]) plus this order: a cursor moves only after
//! its page's statuses are committed, a status only after its output is durable.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio::task::JoinSet;

use crate::discover::{self, get_json, host_base, page_url, Entry, ListError, Page};
use crate::fetch::{host_of, Fetched, Fetcher, Identity};
use crate::fetching::Fetching;
use crate::limits::{Hosts, Kind};
use crate::outcome::{FailKind, Failure, Verified};
use crate::sink::{Sink, SinkError};
use crate::state::{is_final, Done, Listing, State, StateError};

/// Verified repositories queued for the writer at most.
pub const WRITER_QUEUE: usize = 16;

/// Most `429`s waited out for one repository before it fails as `rate_limited`.
pub const MAX_WAITS: u32 = 20;

/// Where the accounts come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Discovery {
    /// The relay's `listHosts`, then each host's `listRepos`.
    Hosts,
    /// The relay's own `listRepos`.
    RelayRepos,
    /// The relay's `listReposByCollection`, one listing per NSID.
    Collections(Vec<String>),
    /// These DIDs.
    Dids(Vec<String>),
}

/// How a backfill runs.
#[derive(Clone, Debug)]
pub struct Config {
    /// The relay's `http(s)://` base.
    pub relay: String,
    /// Where the accounts come from.
    pub discovery: Discovery,
    /// Global bound on requests in flight.
    pub global: usize,
    /// Listings crawled at once.
    pub listings_at_once: usize,
    /// Accounts of one listing in flight at once.
    pub window: usize,
    /// Attempts per repository for transient failures.
    pub attempts: u32,
    /// The first retry's delay (then ×4 each time).
    pub backoff: Duration,
    /// Page size asked of listings.
    pub page: usize,
    /// Retry repositories that failed in an earlier run.
    pub retry_failed: bool,
    /// Told of each account whose fetch begins (before its `getRepo`); the consumer ends it
    /// (`riptide serve --backfill`'s hold of in-flight accounts, [`Fetching`]).
    pub fetching: Option<Arc<Fetching>>,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            relay: String::new(),
            discovery: Discovery::Hosts,
            global: 64,
            listings_at_once: 256,
            window: 64,
            attempts: 3,
            backoff: Duration::from_secs(1),
            page: 500,
            retry_failed: false,
            fetching: None,
        }
    }
}

/// Why a backfill stopped before the end: local trouble, never the network's (which is
/// counted per repository and per host instead).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BackfillError {
    /// The state failed.
    #[error(transparent)]
    State(#[from] StateError),
    /// The output failed.
    #[error(transparent)]
    Sink(#[from] SinkError),
    /// The relay has no `listHosts` and no `listRepos`, or they failed.
    #[error("discovery: {0}")]
    Discovery(String),
}

/// Live counts of a run, for a progress bar or log line (the durable ones are in the state).
#[derive(Debug, Default)]
pub struct Progress {
    /// Repositories backfilled this run.
    pub ok: AtomicU64,
    /// Repositories failed this run.
    pub failed: AtomicU64,
    /// Accounts skipped: a status from an earlier run.
    pub skipped: AtomicU64,
    /// Records written this run.
    pub records: AtomicU64,
    /// Bytes of CARs verified this run.
    pub bytes: AtomicU64,
    /// Listings (hosts…) known, and finished (done, failed or skipped).
    pub listings: AtomicU64,
    /// Listings finished.
    pub listings_done: AtomicU64,
    /// Accounts expected (sum of `listHosts` account counts, when known).
    pub expected: AtomicU64,
    /// Listing entries that were not DIDs.
    pub invalid_entries: AtomicU64,
}

/// A finished repository on its way to the writer.
struct Job {
    outcome: Result<Verified, (Failure, u32)>,
    ack: oneshot::Sender<Result<(), String>>,
}

struct Crawl {
    cfg: Config,
    get: Getter,
    state: Arc<State>,
    progress: Arc<Progress>,
    writer: mpsc::Sender<Job>,
    inflight: Mutex<HashSet<String>>,
    /// The first local failure (the writer's): everyone stops.
    fatal: Mutex<Option<String>>,
}

/// Runs a backfill to the end: every listing crawled, every account done or failed. The state
/// is shared so that the caller can report from it meanwhile ([`crate::status()`]).
pub async fn run(
    cfg: Config,
    fetcher: Fetcher,
    hosts: Hosts,
    state: Arc<State>,
    mut sink: Box<dyn Sink>,
    progress: Arc<Progress>,
) -> Result<(), BackfillError> {
    sink.recover(state.sink_position()?.as_deref())?;
    // Verified repositories waiting for the writer: with the ones being fetched, this bounds
    // the repositories held at once (each in memory up to the spool threshold, beyond it mapped
    // from its spool file).
    let (tx, rx) = mpsc::channel::<Job>(WRITER_QUEUE);
    let writer = {
        let state = state.clone();
        std::thread::Builder::new()
            .name("backfill-writer".into())
            .spawn(move || write_loop(rx, sink, &state))
            .map_err(|e| {
                BackfillError::Sink(SinkError::Io {
                    what: "the writer thread".into(),
                    source: e,
                })
            })?
    };
    let crawl = Arc::new(Crawl {
        get: Getter::new(cfg.clone(), fetcher, hosts)?,
        cfg,
        state,
        progress,
        writer: tx,
        inflight: Mutex::default(),
        fatal: Mutex::default(),
    });
    let result = crawl.clone().crawl_all().await;
    drop(crawl);
    // All senders are gone once the crawl's tasks are: the writer drains and ends.
    let written = writer
        .join()
        .unwrap_or_else(|_| Err(SinkError::Unavailable("the writer thread panicked".into())));
    // The writer's failure first: it is why the crawl stopped, and the crawl's own error may be
    // only a task's "the writer stopped", which won the race to say it.
    written?;
    result?;
    Ok(())
}

/// Records a writer's batch gathers before it is committed, when repositories keep coming
/// (module docs): four row blocks' worth.
pub const BATCH_RECORDS: usize = 4 * 4096;

/// How long a batch short of [`BATCH_RECORDS`] waits for more repositories (module docs).
pub const GATHER: Duration = Duration::from_millis(20);

/// The writer (module docs): batches, sink first, then the state, then the acks.
fn write_loop(
    mut rx: mpsc::Receiver<Job>,
    mut sink: Box<dyn Sink>,
    state: &State,
) -> Result<(), SinkError> {
    /// Most repositories per commit.
    const BATCH: usize = 256;
    let records = |j: &Job| j.outcome.as_ref().map_or(0, crate::Verified::kept);
    while let Some(first) = rx.blocking_recv() {
        let started = std::time::Instant::now();
        let mut held = records(&first);
        let mut jobs = vec![first];
        while jobs.len() < BATCH && held < BATCH_RECORDS {
            match rx.try_recv() {
                Ok(j) => {
                    held += records(&j);
                    jobs.push(j);
                }
                Err(mpsc::error::TryRecvError::Empty) if started.elapsed() < GATHER => {
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(_) => break,
            }
        }
        let mut done = Vec::with_capacity(jobs.len());
        let mut failed: Option<String> = None;
        for j in &jobs {
            match &j.outcome {
                Ok(v) => match sink.write(v) {
                    Ok(w) => done.push(Done::ok(v, w.records, w.dropped)),
                    Err(e) => {
                        failed = Some(e.to_string());
                        break;
                    }
                },
                Err((f, attempts)) => match sink.settled(&f.did) {
                    Ok(()) => done.push(Done::failed(f, *attempts)),
                    Err(e) => {
                        failed = Some(e.to_string());
                        break;
                    }
                },
            }
        }
        let committed = match failed {
            Some(e) => Err(e),
            None => sink.commit().map_err(|e| e.to_string()).and_then(|pos| {
                for d in &mut done {
                    d.recount(sink.recount(&d.did));
                }
                state.commit(&done, &pos).map_err(|e| e.to_string())
            }),
        };
        let stop = committed.is_err();
        for j in jobs {
            let _ = j.ack.send(committed.clone());
        }
        if stop {
            // Nothing more may be committed: later statuses would claim output that is not
            // there. The tasks see the error and the run stops.
            rx.close();
            while rx.try_recv().is_ok() {}
            return Err(SinkError::Unavailable(committed.err().unwrap_or_default()));
        }
    }
    Ok(())
}

impl Crawl {
    fn stopped(&self) -> Option<String> {
        self.fatal
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn stop(&self, why: String) {
        let mut f = self
            .fatal
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f.get_or_insert(why);
    }

    async fn crawl_all(self: Arc<Self>) -> Result<(), BackfillError> {
        let relay = self.cfg.relay.trim_end_matches('/').to_owned();
        let listings: Vec<Unit> = match &self.cfg.discovery {
            Discovery::Hosts => match self.list_hosts(&relay).await {
                Ok(units) => units,
                Err(ListError::NotImplemented(url)) => {
                    tracing::warn!(
                        url,
                        "backfill: the relay does not implement listHosts: crawling its own listRepos instead"
                    );
                    vec![Unit::relay(&relay, self.cfg.global * 2)]
                }
                Err(e) => return Err(BackfillError::Discovery(format!("listHosts: {e}"))),
            },
            Discovery::RelayRepos => vec![Unit::relay(&relay, self.cfg.global * 2)],
            Discovery::Collections(nsids) => nsids
                .iter()
                .map(|n| Unit {
                    key: format!("collection:{n}"),
                    base: relay.clone(),
                    method: "com.atproto.sync.listReposByCollection",
                    collection: Some(n.clone()),
                    dids: None,
                    window: self.cfg.global * 2,
                })
                .collect(),
            Discovery::Dids(dids) => vec![Unit {
                key: "dids".into(),
                base: String::new(),
                method: "",
                collection: None,
                dids: Some(dids.clone()),
                window: self.cfg.global * 2,
            }],
        };
        self.progress
            .listings
            .fetch_add(listings.len() as u64, Relaxed);
        let at_once = Arc::new(Semaphore::new(self.cfg.listings_at_once.max(1)));
        let mut tasks = JoinSet::new();
        for unit in listings {
            let me = self.clone();
            let at_once = at_once.clone();
            tasks.spawn(async move {
                let _slot = at_once.acquire_owned().await;
                let r = me.crawl_listing(&unit).await;
                me.progress.listings_done.fetch_add(1, Relaxed);
                r
            });
        }
        let mut first_err = None;
        while let Some(r) = tasks.join_next().await {
            match r {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    first_err.get_or_insert(e);
                }
                Err(e) => {
                    first_err.get_or_insert_with(|| {
                        BackfillError::Discovery(format!("a listing task failed: {e}"))
                    });
                }
            }
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        if let Some(why) = self.stopped() {
            return Err(BackfillError::Sink(SinkError::Unavailable(why)));
        }
        Ok(())
    }

    /// The relay's hosts, each a listing; banned hosts recorded as skipped, and said.
    async fn list_hosts(&self, relay: &str) -> Result<Vec<Unit>, ListError> {
        let mut units = Vec::new();
        let mut cursor: Option<String> = None;
        let mut seen = HashSet::new();
        loop {
            let url = page_url(
                relay,
                "com.atproto.sync.listHosts",
                1000,
                None,
                cursor.as_deref(),
            );
            let v = self.get.list(&url).await?;
            let (hosts, next) = discover::parse_hosts(&v)?;
            let empty = hosts.is_empty();
            for h in hosts {
                if !seen.insert(h.hostname.clone()) {
                    continue;
                }
                let key = format!("host:{}", h.hostname);
                let status = h.status.as_deref().unwrap_or("active");
                if let Some(n) = h.account_count {
                    self.progress.expected.fetch_add(n, Relaxed);
                }
                if status == "banned" {
                    tracing::warn!(
                        host = %h.hostname, accounts = ?h.account_count,
                        "backfill: the relay lists this host as banned: not crawled (reported in status)"
                    );
                    let l = Listing {
                        done: true,
                        accounts: h.account_count,
                        problem: Some(format!("listHosts status: {status}")),
                        ..self.state.listing(&key).unwrap_or_default()
                    };
                    if let Err(e) = self.state.set_listing(&key, &l) {
                        return Err(ListError::Failed(e.to_string()));
                    }
                    self.progress.listings.fetch_add(1, Relaxed);
                    self.progress.listings_done.fetch_add(1, Relaxed);
                    continue;
                }
                units.push(Unit {
                    key,
                    base: host_base(&h.hostname),
                    method: "com.atproto.sync.listRepos",
                    collection: None,
                    dids: None,
                    window: self.cfg.window,
                });
                if let Some(n) = h.account_count {
                    // Kept with the listing for status's ETA.
                    let mut l = self
                        .state
                        .listing(&units[units.len() - 1].key)
                        .unwrap_or_default();
                    if l.accounts != Some(n) {
                        l.accounts = Some(n);
                        if let Err(e) = self.state.set_listing(&units[units.len() - 1].key, &l) {
                            return Err(ListError::Failed(e.to_string()));
                        }
                    }
                }
            }
            match next {
                Some(c) if !empty && Some(&c) != cursor.as_ref() => cursor = Some(c),
                _ => break,
            }
        }
        Ok(units)
    }

    /// One listing to its end (module docs).
    async fn crawl_listing(self: &Arc<Self>, unit: &Unit) -> Result<(), BackfillError> {
        let mut listing = self.state.listing(&unit.key)?;
        if listing.done {
            return Ok(());
        }
        if listing == Listing::default() {
            // Known from its start (`status`: a listing left), not from its first page's end.
            self.state.set_listing(&unit.key, &listing)?;
        }
        if let Some(dids) = &unit.dids {
            let page = Page {
                entries: dids
                    .iter()
                    .map(|d| Entry {
                        did: d.clone(),
                        inactive: None,
                    })
                    .collect(),
                ..Page::default()
            };
            self.run_page(unit, page).await?;
            listing.done = true;
            self.state.set_listing(&unit.key, &listing)?;
            return Ok(());
        }
        loop {
            if self.stopped().is_some() {
                return Ok(());
            }
            let url = page_url(
                &unit.base,
                unit.method,
                self.cfg.page,
                unit.collection.as_deref(),
                listing.cursor.as_deref(),
            );
            let v = match self.get.list(&url).await {
                Ok(v) => v,
                Err(e) => {
                    // Reported, never skipped silently: in status, and here.
                    tracing::warn!(listing = %unit.key, error = %e, "backfill: listing failed: its remaining accounts are not crawled");
                    listing.problem = Some(e.to_string());
                    self.state.set_listing(&unit.key, &listing)?;
                    return Ok(());
                }
            };
            let page = match discover::parse_repos(&v) {
                Ok(p) => p,
                Err(e) => {
                    tracing::warn!(listing = %unit.key, error = %e, "backfill: listing page unreadable: its remaining accounts are not crawled");
                    listing.problem = Some(format!("{url}: {e}"));
                    self.state.set_listing(&unit.key, &listing)?;
                    return Ok(());
                }
            };
            let next = page.cursor.clone();
            let empty = page.entries.is_empty() && page.invalid.is_empty();
            self.run_page(unit, page).await?;
            if self.stopped().is_some() {
                return Ok(());
            }
            // A cursor that does not move would loop forever: the listing ends there.
            let last = next.is_none() || empty || next == listing.cursor;
            listing.cursor = next;
            listing.done = last;
            listing.problem = None;
            self.state.set_listing(&unit.key, &listing)?;
            if last {
                return Ok(());
            }
        }
    }

    /// Every account of one page, at most `unit.window` at once; returns when all have a
    /// committed status.
    async fn run_page(self: &Arc<Self>, unit: &Unit, page: Page) -> Result<(), BackfillError> {
        for bad in &page.invalid {
            self.progress.invalid_entries.fetch_add(1, Relaxed);
            tracing::warn!(listing = %unit.key, entry = %bad, "backfill: a listing entry is not a DID: skipped (counted as invalid_entries)");
        }
        let mut tasks = JoinSet::new();
        for e in page.entries {
            if let Some(s) = self.state.repo(&e.did)? {
                if is_final(&s, self.cfg.retry_failed) {
                    self.progress.skipped.fetch_add(1, Relaxed);
                    continue;
                }
            }
            {
                let mut inflight = self
                    .inflight
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                if !inflight.insert(e.did.clone()) {
                    // Another listing has it (an account with records in two collections).
                    continue;
                }
            }
            while tasks.len() >= unit.window.max(1) {
                tasks.join_next().await;
            }
            if let Some(f) = &self.cfg.fetching {
                f.start(&e.did);
            }
            let me = self.clone();
            tasks.spawn(async move {
                let outcome = me.get.repo(&e).await;
                me.finish(&e.did, outcome).await;
                me.inflight
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .remove(&e.did);
            });
            if self.stopped().is_some() {
                break;
            }
        }
        while tasks.join_next().await.is_some() {}
        Ok(())
    }

    /// Hands a finished repository to the writer and waits for its commit.
    async fn finish(&self, did: &str, outcome: Result<Verified, (Failure, u32)>) {
        match &outcome {
            Ok(v) => {
                self.progress.ok.fetch_add(1, Relaxed);
                self.progress.bytes.fetch_add(v.bytes, Relaxed);
                self.progress.records.fetch_add(v.kept() as u64, Relaxed);
            }
            Err((f, attempts)) => {
                self.progress.failed.fetch_add(1, Relaxed);
                tracing::debug!(did, reason = f.kind.reason(), attempts, detail = %f.detail, "backfill: repository failed (counted in status by reason)");
            }
        }
        let (ack, done) = oneshot::channel();
        if self.writer.send(Job { outcome, ack }).await.is_err() {
            self.stop("the writer stopped".into());
            return;
        }
        match done.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => self.stop(e),
            Err(_) => self.stop("the writer stopped".into()),
        }
    }
}

/// One account's fetch and one listing request, under the host limits, with the retries and
/// `429` waits of the module docs: the part of the crawl that does not care where progress is
/// kept. Public for the Kafka workers (`riptide-kafka`), which keep it in Kafka.
pub struct Getter {
    cfg: Config,
    fetcher: Fetcher,
    hosts: Hosts,
    http: reqwest::Client,
    /// Per host, the lane its next repository goes out on (module docs).
    next_lane: Mutex<HashMap<String, usize>>,
}

impl std::fmt::Debug for Getter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Getter").finish_non_exhaustive()
    }
}

impl Getter {
    /// A getter with `cfg`'s attempts and backoff; listings go out from the fetcher's first
    /// address.
    pub fn new(cfg: Config, fetcher: Fetcher, hosts: Hosts) -> Result<Getter, BackfillError> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .connect_timeout(Duration::from_secs(10))
            .user_agent(concat!("riptide/", env!("CARGO_PKG_VERSION")))
            .local_address(fetcher.address(0))
            .build()
            .map_err(|e| BackfillError::Discovery(e.to_string()))?;
        Ok(Getter {
            cfg,
            fetcher,
            hosts,
            http,
            next_lane: Mutex::default(),
        })
    }

    /// The configuration it was made with.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The lane of `host`'s next repository: its lanes in turn (module docs).
    fn lane_for(&self, host: &str) -> usize {
        let lanes = self.fetcher.lanes();
        if lanes == 1 {
            return 0;
        }
        let mut next = self
            .next_lane
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let n = next.entry(host.to_owned()).or_default();
        let lane = *n % lanes;
        *n = n.wrapping_add(1);
        lane
    }

    /// One listing request under the listing host's rate, `429`s waited out, transient
    /// failures retried.
    pub async fn list(&self, url: &str) -> Result<serde_json::Value, ListError> {
        let host = host_of(url).to_owned();
        let mut attempt = 0;
        let mut waits = 0;
        loop {
            let permit = self.hosts.admit(&host, Kind::List).await;
            let r = get_json(&self.http, url).await;
            drop(permit);
            match r {
                Err(ListError::RateLimited(d)) if waits < MAX_WAITS => {
                    waits += 1;
                    self.hosts.rate_limited(&host, d);
                }
                Err(ListError::Failed(e)) if attempt + 1 < self.cfg.attempts => {
                    attempt += 1;
                    tracing::debug!(url, error = %e, attempt, "backfill: listing failed; retrying");
                    tokio::time::sleep(self.backoff(attempt)).await;
                }
                other => return other,
            }
        }
    }

    fn backoff(&self, attempt: u32) -> Duration {
        self.cfg
            .backoff
            .saturating_mul(4u32.saturating_pow(attempt.saturating_sub(1)))
            .min(Duration::from_secs(300))
    }

    /// One account to a verified repository or a final failure (module docs).
    pub async fn repo(&self, e: &Entry) -> Result<Verified, (Failure, u32)> {
        let did = e.did.as_str();
        if let Some(status) = &e.inactive {
            let kind = match status.as_str() {
                "deactivated" => FailKind::Deactivated,
                "takendown" => FailKind::TakenDown,
                "suspended" => FailKind::Suspended,
                _ => FailKind::NotFound,
            };
            return Err((
                Failure::new(
                    did,
                    kind,
                    format!("the listing says the account is {status}"),
                ),
                0,
            ));
        }
        let mut attempt = 0u32;
        let mut waits = 0u32;
        // The directory's identity, once a failure with the PLC mirror's found it different.
        let mut fresh: Option<Identity> = None;
        let mut rechecked = false;
        loop {
            attempt += 1;
            let id = match &fresh {
                Some(id) => Ok(id.clone()),
                None => self.fetcher.identity(did).await,
            };
            let used = id.as_ref().ok().cloned();
            let failure = match id {
                Err(f) => f,
                Ok(id) => {
                    let mut last = None;
                    'sources: for base in &id.sources {
                        let lane = self.lane_for(host_of(base));
                        let host = self.fetcher.limit_key(lane, host_of(base));
                        loop {
                            let permit = self.hosts.admit(&host, Kind::GetRepo).await;
                            let r = self.fetcher.fetch_verify_on(lane, base, did, &id.key).await;
                            match r {
                                Ok(v) => return Ok(v),
                                Err(Fetched::Wait {
                                    retry_in: d,
                                    sent: false,
                                }) => {
                                    // Our own pacing (the host's window is spent), not a
                                    // refusal: its token is not spent, nor is a wait counted.
                                    permit.not_sent();
                                    self.hosts.pause(&host, d);
                                }
                                Err(Fetched::Wait { retry_in: d, .. }) if waits < MAX_WAITS => {
                                    drop(permit);
                                    waits += 1;
                                    self.hosts.rate_limited(&host, d);
                                }
                                Err(Fetched::Wait { retry_in: d, .. }) => {
                                    self.hosts.rate_limited(&host, d);
                                    last = Some(Failure::new(
                                        did,
                                        FailKind::RateLimited,
                                        format!("{host}: still rate-limited after {waits} waits (last asked {d:?})"),
                                    ));
                                    break 'sources;
                                }
                                Err(Fetched::Failed(f)) => {
                                    let elsewhere = f.kind.try_elsewhere();
                                    last = Some(f);
                                    if elsewhere {
                                        continue 'sources;
                                    }
                                    break 'sources;
                                }
                            }
                        }
                    }
                    last.unwrap_or_else(|| Failure::new(did, FailKind::Identity, "no source"))
                }
            };
            // A failure a stale document explains (the account rotated its key or moved its
            // PDS after the PLC mirror's cursor): ask the directory once, past the mirror; if
            // its document differs, go again with it, not counted as an attempt.
            if !rechecked && failure.kind.may_be_stale_identity() {
                rechecked = true;
                if let Some(again) = self.fetcher.identity_past_mirror(did).await {
                    let stale = again.as_ref().ok() != used.as_ref() && again.is_ok();
                    self.fetcher.note_plc_mirror_recheck(stale);
                    if let (true, Ok(id)) = (stale, again) {
                        tracing::info!(
                            did,
                            reason = failure.kind.reason(),
                            "backfill: the PLC mirror's document of this account is stale (the directory's key or PDS differs); fetching again with the directory's"
                        );
                        fresh = Some(id);
                        attempt -= 1;
                        continue;
                    }
                }
            }
            if failure.kind.is_transient()
                && failure.kind != FailKind::RateLimited
                && attempt < self.cfg.attempts
            {
                tracing::debug!(
                    did,
                    reason = failure.kind.reason(),
                    attempt,
                    "backfill: retrying"
                );
                tokio::time::sleep(self.backoff(attempt)).await;
                continue;
            }
            return Err((failure, attempt));
        }
    }
}

/// A listing to crawl.
#[derive(Clone, Debug)]
struct Unit {
    /// Its key in the state (`host:NAME`, `relay`, `collection:NSID`, `dids`).
    key: String,
    base: String,
    method: &'static str,
    collection: Option<String>,
    dids: Option<Vec<String>>,
    window: usize,
}

impl Unit {
    fn relay(relay: &str, window: usize) -> Unit {
        Unit {
            key: "relay".into(),
            base: relay.to_owned(),
            method: "com.atproto.sync.listRepos",
            collection: None,
            dids: None,
            window,
        }
    }
}
