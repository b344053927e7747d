//! Resync: an account's whole repository fetched and verified, to replace a broken chain.
//!
//! Why: when an account's chain breaks (`riptide_firehose::chain`: commits are missing between
//! its stored state and the frame that arrived), the sync spec's remedy is to fetch the account's
//! current repository (`com.atproto.sync.getRepo`) and take its commit as the new state. This
//! module is that fetch and its verification; deciding *when* to resync and what to do with the
//! commits that arrive meanwhile is the consumer's (`riptide serve`).
//!
//! Sources, in order: each upstream relay (its `getRepo`, at the host of its `subscribeRepos`
//! URL), then the account's PDS from its DID document. The first repository that verifies
//! completely — every block's CID, the commit signature with the document's key, the MST walk and
//! its rebuild against the commit's `data` (`riptide_repo::verify_repo`), for the right DID — is
//! the answer. A source that fails (network, HTTP status, timeout, too large, a repository that
//! does not verify: a forged one is refused like any other) is noted and the next is tried; when
//! all fail, [`ResyncError::AllSourcesFailed`] lists every attempt. Nothing unverified is ever
//! returned.
//!
//! Staleness: a mirror (a relay) may hold an older repository, validly signed. Only the caller
//! knows what is too old (its stored chain tip), so it says so ([`Resyncer::resync_since`]): a
//! repository whose `rev` is below that is a failed source like any other
//! ([`Attempt::stale`]), and the next one is asked. Without this, a lagging relay answered first
//! every time and the account's PDS, which had the right repository, was never asked (issue 40:
//! 175 stale fetches in 70 s, no account recovered).
//!
//! Limits, as the peers learned them (Jetstream's stream stalled for hours behind one huge
//! repository, issue #299): at most [`ResyncConfig::per_account_per_minute`] resyncs of one
//! account per minute ([`ResyncError::RateLimited`]); at most [`ResyncConfig::per_host`] fetches
//! from one host at once; a host that answered `429` with `Retry-After` (seconds or an
//! HTTP-date) is not asked again before then, but never for longer than
//! [`ResyncConfig::max_retry_after`] (a header is input: `Retry-After: 18446744073709551615` once
//! overflowed the clock and killed the resync task; it is now capped, and the cap logged); each
//! fetch has a timeout and a size bound; verification runs on a blocking thread, never on the
//! async threads that carry live events.
//!
//! Redirects: a `getRepo` answer may redirect, but only to the same host (scheme, host and
//! port), at most [`MAX_REDIRECTS`] times; anything else is refused as
//! [`ResolveError::Redirect`], a failed source, and the next source is asked. Following a
//! redirect to another host would fetch from a host whose per-host limit and `Retry-After` were
//! never consulted (issue 40); a relay that points at the account's PDS loses nothing, since the
//! PDS is the next source anyway, asked under its own limits.
//!
//! One fetch on its own: [`Resyncer::fetch_repo`] is the `getRepo` underneath, public for the
//! backfill (`riptide-backfill`), which schedules its own sources and needs each failure's
//! kind ([`FetchError`]: a `429` and its wait — `Retry-After`, else `RateLimit-Reset` —, an
//! XRPC error such as `RepoDeactivated`, a timeout, a body too large, cut short, or slower than
//! [`ResyncConfig::min_bytes_per_sec`]), not a sentence. A trickling body is a failure of its
//! own because a host that sends a byte a second otherwise holds a fetch slot for the whole
//! timeout.
//!
//! Memory: a repository is verified from one contiguous byte slice (the CAR reader indexes its
//! blocks and the MST walk reads them in tree order, not CAR order). Up to
//! [`ResyncConfig::spool_above`] it is read into memory; a larger one is streamed to an unnamed
//! temporary file in [`ResyncConfig::spool_dir`] as it arrives and verified through a read-only
//! memory map of that file, so its bytes live in the page cache, which the kernel can drop and
//! re-read, not in the process's own memory: what stays resident is the CAR reader's index (a few
//! dozen bytes per block) and the tree walk. Either way the size is bounded by
//! [`ResyncConfig::max_repo_bytes`], checked as bytes arrive.

use std::collections::{HashMap, VecDeque};
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use riptide_cbor::CidBuf;
use tokio::sync::Semaphore;

use crate::error::ResolveError;
use crate::resolver::{net, Resolver};

/// Resync limits.
#[derive(Clone, Debug)]
pub struct ResyncConfig {
    /// Upper bound on one fetch, connect to last byte (default 60 s).
    pub timeout: Duration,
    /// Largest repository fetched (default 512 MiB).
    pub max_repo_bytes: usize,
    /// Resyncs of one account allowed per minute (default 5).
    pub per_account_per_minute: usize,
    /// Fetches from one host at once (default 4).
    pub per_host: usize,
    /// Repositories larger than this are spooled to a file and memory-mapped rather than read
    /// into memory (default 32 MiB).
    pub spool_above: usize,
    /// Where spooled repositories go (default: the system's temporary directory, which may be
    /// a tmpfs, i.e. memory: `riptide serve` sets `DATA/spool/`). The files are unnamed:
    /// nothing is left behind, even after a crash.
    pub spool_dir: Option<std::path::PathBuf>,
    /// The longest a host's `429 Retry-After` is honoured (default 1 h): a longer one (or one
    /// that does not fit the clock) is cut to this, with a warning.
    pub max_retry_after: Duration,
    /// The slowest body accepted, in bytes per second averaged from the request's start, once
    /// [`ResyncConfig::min_rate_grace`] has passed (default 0: no minimum). A host that trickles
    /// a body keeps a fetch slot for the whole timeout otherwise ([`FetchError::TooSlow`]).
    pub min_bytes_per_sec: u64,
    /// How long a fetch may take before [`ResyncConfig::min_bytes_per_sec`] applies (default
    /// 10 s: connection set-up and a slow first byte are not a trickle).
    pub min_rate_grace: Duration,
}

impl Default for ResyncConfig {
    fn default() -> ResyncConfig {
        ResyncConfig {
            timeout: Duration::from_secs(60),
            max_repo_bytes: 512 << 20,
            per_account_per_minute: 5,
            per_host: 4,
            spool_above: 32 << 20,
            spool_dir: None,
            max_retry_after: Duration::from_secs(3600),
            min_bytes_per_sec: 0,
            min_rate_grace: Duration::from_secs(10),
        }
    }
}

/// A repository fetched and verified: the account's new chain state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resynced {
    /// The account.
    pub did: String,
    /// Its commit's `rev`.
    pub rev: String,
    /// The commit block's CID.
    pub commit: CidBuf,
    /// The MST root.
    pub data: CidBuf,
    /// The signed commit block itself (what a `#sync` frame carries).
    pub commit_block: Vec<u8>,
    /// The verified repository's CAR, in memory or mapped from its spool file: what its records
    /// are read from when they replace the account's earlier rows (`riptide serve`).
    pub car: Arc<RepoBytes>,
    /// Records in the repository.
    pub records: usize,
    /// Bytes fetched.
    pub bytes: u64,
    /// The `getRepo` URL it came from.
    pub source: String,
    /// Sources asked before it whose repository was stale ([`Attempt::stale`]).
    pub stale_sources: usize,
}

/// One source tried and why it did not do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attempt {
    /// The `getRepo` URL.
    pub url: String,
    /// What went wrong.
    pub why: String,
    /// The repository verified but was older than the caller's minimum (a stale mirror).
    pub stale: bool,
}

/// Why a resync gave no new state.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ResyncError {
    /// The account was resynced too often lately; try again after `retry_in`.
    #[error("{did}: resynced {limit} times in the last minute; next allowed in {retry_in:?}")]
    RateLimited {
        /// The account.
        did: String,
        /// The limit per minute.
        limit: usize,
        /// When the next resync is allowed.
        retry_in: Duration,
    },
    /// The DID document (for the PDS and the key) could not be had.
    #[error("{did}: {source}")]
    Identity {
        /// The account.
        did: String,
        /// Why.
        source: ResolveError,
    },
    /// Every source failed.
    #[error("{did}: no source gave a repository that verifies: {}", describe(.attempts))]
    AllSourcesFailed {
        /// The account.
        did: String,
        /// Each source tried, in order.
        attempts: Vec<Attempt>,
    },
}

fn describe(attempts: &[Attempt]) -> String {
    attempts
        .iter()
        .map(|a| format!("{} ({})", a.url, a.why))
        .collect::<Vec<_>>()
        .join("; ")
}

impl ResyncError {
    /// How many sources answered with a stale repository ([`Attempt::stale`]): the account's
    /// mirrors lag behind it.
    pub fn stale_sources(&self) -> usize {
        match self {
            ResyncError::AllSourcesFailed { attempts, .. } => {
                attempts.iter().filter(|a| a.stale).count()
            }
            _ => 0,
        }
    }

    /// Whether trying again later may succeed (everything but a DID that does not exist).
    pub fn is_transient(&self) -> bool {
        match self {
            ResyncError::Identity { source, .. } => source.is_transient(),
            _ => true,
        }
    }
}

#[derive(Debug, Default)]
struct Host {
    slots: Option<Arc<Semaphore>>,
    not_before: Option<Instant>,
}

/// Most redirects one `getRepo` follows, all to its own host (module docs).
pub const MAX_REDIRECTS: usize = 3;

/// Resyncs accounts under the limits of [`ResyncConfig`]. Cheap to share (`Arc` inside).
#[derive(Clone, Debug)]
pub struct Resyncer {
    resolver: Resolver,
    /// The resolver's HTTP client but for redirects: same-host only, at most
    /// [`MAX_REDIRECTS`] (module docs).
    http: reqwest::Client,
    cfg: ResyncConfig,
    hosts: Arc<Mutex<HashMap<String, Host>>>,
    recent: Arc<Mutex<HashMap<String, VecDeque<Instant>>>>,
}

/// Whether two URLs have the same scheme, host and port (a redirect that may be followed).
fn same_origin(a: &reqwest::Url, b: &reqwest::Url) -> bool {
    a.scheme() == b.scheme()
        && a.host_str() == b.host_str()
        && a.port_or_known_default() == b.port_or_known_default()
}

/// `ws(s)://host[:port]/…` → `http(s)://host[:port]` (a relay's HTTP base).
pub fn relay_http_base(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    let scheme = match scheme {
        "ws" | "http" => "http",
        "wss" | "https" => "https",
        _ => return None,
    };
    let host = rest.split(['/', '?']).next().filter(|h| !h.is_empty())?;
    Some(format!("{scheme}://{host}"))
}

fn host_of(url: &str) -> String {
    url.split_once("://")
        .map_or(url, |(_, r)| r)
        .split(['/', '?'])
        .next()
        .unwrap_or_default()
        .to_owned()
}

/// The HTTP client of `getRepo` fetches: the resolver's timeouts, redirects to the same host
/// only (module docs), from `local` when given.
fn fetch_client(
    resolver: &Resolver,
    local: Option<std::net::IpAddr>,
) -> reqwest::Result<reqwest::Client> {
    let rc = resolver.config();
    reqwest::Client::builder()
        .timeout(rc.timeout)
        .connect_timeout(rc.timeout.min(Duration::from_secs(10)))
        .local_address(local)
        .redirect(reqwest::redirect::Policy::custom(|a| {
            let elsewhere = a
                .previous()
                .first()
                .is_some_and(|f| !same_origin(f, a.url()));
            if elsewhere || a.previous().len() > MAX_REDIRECTS {
                a.stop()
            } else {
                a.follow()
            }
        }))
        .user_agent(concat!("riptide/", env!("CARGO_PKG_VERSION")))
        .build()
}

impl Resyncer {
    /// A resyncer resolving DIDs (and fetching) with `resolver`.
    pub fn new(resolver: Resolver, cfg: ResyncConfig) -> Resyncer {
        let http = fetch_client(&resolver, None)
            // The same settings built the resolver's client; should this one fail, the
            // resolver's (redirects bounded, to any host) is better than no resync.
            .unwrap_or_else(|e| {
                tracing::error!(error = %e, "resync: HTTP client not built; using the resolver's");
                resolver.http().clone()
            });
        Resyncer {
            http,
            resolver,
            cfg,
            hosts: Arc::default(),
            recent: Arc::default(),
        }
    }

    /// This resyncer with its fetches sent from the local address `addr`: a host that limits
    /// per client IP (every PDS) counts it as another client. Its per-host bookkeeping is its
    /// own; identity lookups still go through the resolver. Fails when the HTTP client cannot
    /// be built.
    pub fn bound_to(&self, addr: std::net::IpAddr) -> Result<Resyncer, ResolveError> {
        Ok(Resyncer {
            http: fetch_client(&self.resolver, Some(addr)).map_err(|e| ResolveError::Network {
                url: format!("(an HTTP client bound to {addr})"),
                why: e.to_string(),
            })?,
            resolver: self.resolver.clone(),
            cfg: self.cfg.clone(),
            hosts: Arc::default(),
            recent: Arc::default(),
        })
    }

    /// Fetches and verifies `did`'s repository from each relay of `relays` (their
    /// `subscribeRepos` URLs), then from its PDS, under the limits (module docs).
    pub async fn resync(&self, did: &str, relays: &[String]) -> Result<Resynced, ResyncError> {
        self.resync_since(did, relays, None).await
    }

    /// [`Resyncer::resync`], refusing a repository whose `rev` (as a TID value,
    /// `riptide_syntax::tid_value`) is below `min_rev`: that source is stale, and the next is
    /// tried (module docs).
    pub async fn resync_since(
        &self,
        did: &str,
        relays: &[String],
        min_rev: Option<u64>,
    ) -> Result<Resynced, ResyncError> {
        self.admit(did)?;
        let doc = self
            .resolver
            .resolve_did(did)
            .await
            .map_err(|source| ResyncError::Identity {
                did: did.to_owned(),
                source,
            })?;
        let key = doc.signing_key().map_err(|e| ResyncError::Identity {
            did: did.to_owned(),
            source: ResolveError::Doc {
                did: did.to_owned(),
                error: e,
            },
        })?;
        let mut urls: Vec<String> = relays.iter().filter_map(|r| relay_http_base(r)).collect();
        if let Some(pds) = doc.pds() {
            urls.push(pds.trim_end_matches('/').to_owned());
        }
        urls.dedup();
        let mut attempts = Vec::new();
        for base in urls {
            let url = format!("{base}/xrpc/com.atproto.sync.getRepo?did={did}");
            match self.fetch(&url).await {
                Err(why) => attempts.push(Attempt {
                    url,
                    why,
                    stale: false,
                }),
                Ok(car) => {
                    let bytes = car.len() as u64;
                    let k = key.clone();
                    let verified = tokio::task::spawn_blocking(move || {
                        riptide_repo::verify_repo(&car, Some(&k)).map(|r| {
                            let block = commit_block(&car, &r.commit);
                            (r, block.map(|b| (b, car)))
                        })
                    })
                    .await;
                    let too_old = |rev: &str| {
                        min_rev.is_some_and(|min| {
                            riptide_syntax::tid_value(rev).is_none_or(|v| v < min)
                        })
                    };
                    match verified {
                        Ok(Ok((r, Some(_)))) if r.did == did && too_old(&r.rev) => {
                            tracing::warn!(
                                did, rev = %r.rev, url,
                                "resync: the source's repository is older than a commit already seen (stale): trying the next"
                            );
                            attempts.push(Attempt {
                                url,
                                why: format!(
                                    "stale: rev {} is older than a commit already seen",
                                    r.rev
                                ),
                                stale: true,
                            });
                        }
                        Ok(Ok((r, Some((commit_block, car))))) if r.did == did => {
                            return Ok(Resynced {
                                did: did.to_owned(),
                                rev: r.rev,
                                commit: r.commit,
                                data: r.data,
                                commit_block,
                                car: Arc::new(car),
                                records: r.records,
                                bytes,
                                source: url,
                                stale_sources: attempts
                                    .iter()
                                    .filter(|a: &&Attempt| a.stale)
                                    .count(),
                            })
                        }
                        Ok(Ok((r, Some(_)))) => attempts.push(Attempt {
                            url,
                            why: format!("the repository is {}'s", r.did),
                            stale: false,
                        }),
                        Ok(Ok((_, None))) => attempts.push(Attempt {
                            url,
                            why: "the commit block is not in the CAR".to_owned(),
                            stale: false,
                        }),
                        Ok(Err(e)) => attempts.push(Attempt {
                            url,
                            why: format!("does not verify: {e}"),
                            stale: false,
                        }),
                        Err(e) => attempts.push(Attempt {
                            url,
                            why: format!("verification task failed: {e}"),
                            stale: false,
                        }),
                    }
                }
            }
        }
        Err(ResyncError::AllSourcesFailed {
            did: did.to_owned(),
            attempts,
        })
    }

    /// Counts a resync of `did` against its per-minute limit.
    fn admit(&self, did: &str) -> Result<(), ResyncError> {
        let now = Instant::now();
        let mut recent = self
            .recent
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Bounded: accounts with nothing in the last minute are forgotten.
        if recent.len() > 100_000 {
            recent.retain(|_, q| q.back().is_some_and(|t| now.duration_since(*t) < MINUTE));
        }
        let q = recent.entry(did.to_owned()).or_default();
        while q.front().is_some_and(|t| now.duration_since(*t) >= MINUTE) {
            q.pop_front();
        }
        if q.len() >= self.cfg.per_account_per_minute {
            let retry_in = q
                .front()
                .map_or(MINUTE, |t| MINUTE.saturating_sub(now.duration_since(*t)));
            return Err(ResyncError::RateLimited {
                did: did.to_owned(),
                limit: self.cfg.per_account_per_minute,
                retry_in,
            });
        }
        q.push_back(now);
        Ok(())
    }

    /// A response body within [`ResyncConfig::max_repo_bytes`] and above
    /// [`ResyncConfig::min_bytes_per_sec`]: in memory, or spooled to a file past
    /// [`ResyncConfig::spool_above`] (module docs).
    async fn read_body(
        &self,
        url: &str,
        mut resp: reqwest::Response,
        started: Instant,
    ) -> Result<RepoBytes, FetchError> {
        let limit = self.cfg.max_repo_bytes;
        let too_large = || FetchError::TooLarge {
            url: url.to_owned(),
            limit,
        };
        let total = resp.content_length();
        if total.is_some_and(|n| n > limit as u64) {
            return Err(too_large());
        }
        let spool_dir = || {
            self.cfg
                .spool_dir
                .clone()
                .unwrap_or_else(std::env::temp_dir)
        };
        let io = |e: std::io::Error| {
            FetchError::Other(ResolveError::Io {
                path: spool_dir().display().to_string(),
                error: e.to_string(),
            })
        };
        // Capacity from `Content-Length` is a claim of the server's: reserved only up to the
        // spool threshold, beyond which the body goes to a file anyway.
        let mut head =
            Vec::with_capacity(total.unwrap_or(0).min(self.cfg.spool_above as u64) as usize);
        let mut file: Option<std::fs::File> = None;
        let mut len = 0usize;
        loop {
            let chunk = match self.rate_deadline(started, len) {
                None => resp.chunk().await,
                Some(deadline) => {
                    match tokio::time::timeout_at(deadline.into(), resp.chunk()).await {
                        Ok(c) => c,
                        Err(_) => {
                            return Err(FetchError::TooSlow {
                                url: url.to_owned(),
                                bytes: len as u64,
                                after: started.elapsed(),
                                min_bytes_per_sec: self.cfg.min_bytes_per_sec,
                            })
                        }
                    }
                }
            };
            let chunk = match chunk {
                Ok(Some(c)) => c,
                Ok(None) => break,
                // Cut after some of the body arrived: a truncated repository, not a refusal.
                Err(e) if len > 0 => {
                    return Err(FetchError::Truncated {
                        url: url.to_owned(),
                        got: len as u64,
                        announced: total,
                        why: e.to_string(),
                    })
                }
                Err(e) => return Err(FetchError::Other(net(url, e))),
            };
            len += chunk.len();
            if len > limit {
                return Err(too_large());
            }
            match file.as_mut() {
                // Blocking writes: they land in the page cache, microseconds per chunk.
                Some(f) => f.write_all(&chunk).map_err(io)?,
                None if head.len() + chunk.len() <= self.cfg.spool_above => {
                    head.extend_from_slice(&chunk);
                }
                None => {
                    let mut f = tempfile::tempfile_in(spool_dir()).map_err(io)?;
                    f.write_all(&head).map_err(io)?;
                    f.write_all(&chunk).map_err(io)?;
                    head = Vec::new();
                    file = Some(f);
                }
            }
        }
        if total.is_some_and(|n| n != len as u64) {
            return Err(FetchError::Truncated {
                url: url.to_owned(),
                got: len as u64,
                announced: total,
                why: "connection closed early".to_owned(),
            });
        }
        match file {
            None => Ok(RepoBytes(Body::Memory(head))),
            Some(f) => map_file(f).map(RepoBytes).map_err(io),
        }
    }

    /// When the body must have more than `len` bytes to keep the minimum rate (`None`: no
    /// minimum): `len / min` seconds after the start, and never before the grace period ends.
    fn rate_deadline(&self, started: Instant, len: usize) -> Option<Instant> {
        let min = self.cfg.min_bytes_per_sec;
        if min == 0 {
            return None;
        }
        let needed = Duration::from_secs_f64(len as f64 / min as f64);
        Some(later(started, needed.max(self.cfg.min_rate_grace)))
    }

    /// One `getRepo`, within the host's limits, the timeout and the size bound.
    async fn fetch(&self, url: &str) -> Result<RepoBytes, String> {
        self.fetch_repo(url).await.map_err(|e| e.to_string())
    }

    /// One `getRepo` of `url` (the whole request URL), within the host's concurrency and
    /// `Retry-After`, the timeout, the size bound and the minimum rate, spooled past
    /// [`ResyncConfig::spool_above`]; failures typed for a caller that acts on the kind (a
    /// backfill schedules a `429`'s host later, and counts each kind). Nothing is verified
    /// here. A `429` also keeps this resyncer from asking the host again before its
    /// `Retry-After` ([`FetchError::RateLimited`] without asking, until then).
    pub async fn fetch_repo(&self, url: &str) -> Result<RepoBytes, FetchError> {
        let host = host_of(url);
        let slots = {
            let mut hosts = self
                .hosts
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let h = hosts.entry(host.clone()).or_default();
            if let Some(t) = h.not_before {
                let now = Instant::now();
                if t > now {
                    return Err(FetchError::RateLimited {
                        url: url.to_owned(),
                        retry_in: t - now,
                        asked: false,
                    });
                }
            }
            h.slots
                .get_or_insert_with(|| Arc::new(Semaphore::new(self.cfg.per_host.max(1))))
                .clone()
        };
        let _slot = slots.acquire_owned().await.map_err(|_| {
            FetchError::Other(ResolveError::Network {
                url: url.to_owned(),
                why: "host slots closed".to_owned(),
            })
        })?;
        let started = Instant::now();
        let get = async {
            let resp = self
                .http
                .get(url)
                // The client's own timeout is for DID documents; a repository gets ours (a
                // second later, so that the bound below is the one that reports it).
                .timeout(self.cfg.timeout.saturating_add(Duration::from_secs(1)))
                .send()
                .await
                .map_err(|e| FetchError::Other(net(url, e)))?;
            let status = resp.status().as_u16();
            if resp.status().is_redirection() {
                // Not followed (the policy stopped): another host, or too many hops.
                let to = resp
                    .headers()
                    .get(reqwest::header::LOCATION)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_owned();
                let why = match resp.url().join(&to) {
                    Ok(t) if same_origin(resp.url(), &t) => "more redirects than allowed",
                    Ok(_) => "another host (its limits were not consulted)",
                    Err(_) => "not a URL",
                };
                return Err(FetchError::Other(ResolveError::Redirect {
                    url: url.to_owned(),
                    to,
                    why,
                }));
            }
            if status == 429 {
                let after =
                    rate_limit_wait(resp.headers(), std::time::SystemTime::now()).unwrap_or(MINUTE);
                return Err(FetchError::RateLimited {
                    url: url.to_owned(),
                    retry_in: after,
                    asked: true,
                });
            }
            if status != 200 {
                // The XRPC error name (`RepoNotFound`, `RepoDeactivated`, …) says why; a body
                // is input, so only its first few KiB are read.
                let mut body = Vec::new();
                let mut resp = resp;
                while let Ok(Some(c)) = resp.chunk().await {
                    body.extend_from_slice(&c[..c.len().min(XRPC_ERROR_BYTES - body.len())]);
                    if body.len() >= XRPC_ERROR_BYTES {
                        break;
                    }
                }
                return Err(FetchError::Status {
                    url: url.to_owned(),
                    status,
                    error: xrpc_error_name(&body),
                });
            }
            // The last request of the host's window (`RateLimit-Remaining: 0`): it is not asked
            // again before the window resets, rather than asked and refused with a 429.
            let spent = resp
                .headers()
                .get("ratelimit-remaining")
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.trim() == "0");
            if spent {
                if let Some(wait) = rate_limit_wait(resp.headers(), std::time::SystemTime::now()) {
                    let until = later(Instant::now(), wait.min(self.cfg.max_retry_after));
                    let mut hosts = self
                        .hosts
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    hosts.entry(host.clone()).or_default().not_before = Some(until);
                }
            }
            self.read_body(url, resp, started).await
        };
        match tokio::time::timeout(self.cfg.timeout, get).await {
            Err(_) => Err(FetchError::Timeout {
                url: url.to_owned(),
                after: self.cfg.timeout,
            }),
            Ok(Ok(car)) => Ok(car),
            Ok(Err(FetchError::RateLimited {
                url,
                retry_in: asked,
                asked: true,
            })) => {
                let cap = self.cfg.max_retry_after;
                let after = asked.min(cap);
                if asked > cap {
                    tracing::warn!(
                        host, asked = ?asked, honoured = ?after,
                        "getRepo: 429 with a Retry-After beyond the cap: the host is asked again after the cap"
                    );
                }
                let until = later(Instant::now(), after);
                let mut hosts = self
                    .hosts
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                hosts.entry(host).or_default().not_before = Some(until);
                Err(FetchError::RateLimited {
                    url,
                    retry_in: after,
                    asked: true,
                })
            }
            Ok(Err(e)) => Err(e),
        }
    }
}

/// Most bytes of an error response read for its XRPC error name.
const XRPC_ERROR_BYTES: usize = 4096;

/// The `error` of an XRPC error body (`{"error":"RepoNotFound","message":…}`), if it has one.
fn xrpc_error_name(body: &[u8]) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    let name = v.get("error")?.as_str()?;
    // A name, not a message: bounded, and only the characters XRPC error names use.
    (name.len() <= 64 && name.bytes().all(|b| b.is_ascii_alphanumeric())).then(|| name.to_owned())
}

/// How long a `429` asks us to wait: `Retry-After` ([`parse_retry_after`]), else the
/// `RateLimit-Reset` header (seconds until the window resets, as the IETF draft and the
/// Bluesky PDS send it, or an epoch time in seconds as some servers do). `None` when neither
/// is readable.
pub fn rate_limit_wait(
    headers: &reqwest::header::HeaderMap,
    now: std::time::SystemTime,
) -> Option<Duration> {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(d) = text("retry-after").and_then(|v| parse_retry_after(v, now)) {
        return Some(d);
    }
    let reset: u64 = text("ratelimit-reset")?.trim().parse().ok()?;
    // A value past 2001 in epoch seconds is a time, not a delay of 31 years. It is measured
    // from now to the millisecond: counted from the start of the current second it would wait
    // up to a second too long, and the last request of every window (`RateLimit-Remaining: 0`)
    // would then cost a whole window, halving a crawl at one request a second (issue 37).
    Some(if reset > 1_000_000_000 {
        let at = std::time::UNIX_EPOCH + Duration::from_secs(reset);
        at.duration_since(now).unwrap_or(Duration::ZERO)
    } else {
        Duration::from_secs(reset)
    })
}

/// Why one `getRepo` fetch failed ([`Resyncer::fetch_repo`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FetchError {
    /// The host answered `429` (`asked`), or did so lately and is not asked again before
    /// `retry_in` (not `asked`). `retry_in` is capped at [`ResyncConfig::max_retry_after`].
    #[error("{url}: {}", if *.asked {
        format!("HTTP 429 (rate-limited), asked to wait {retry_in:?}")
    } else {
        format!("the host rate-limited us; not asked again for {retry_in:?}")
    })]
    RateLimited {
        /// The request.
        url: String,
        /// How long to wait.
        retry_in: Duration,
        /// Whether the host said so now (else it said so before, and was not asked).
        asked: bool,
    },
    /// A status other than 200 (and 429), with the XRPC error name when the body had one.
    #[error("{url}: HTTP {status}{}", .error.as_deref().map(|e| format!(" ({e})")).unwrap_or_default())]
    Status {
        /// The request.
        url: String,
        /// The status.
        status: u16,
        /// The XRPC `error` (`RepoNotFound`, `RepoDeactivated`, `RepoTakendown`, …).
        error: Option<String>,
    },
    /// The whole fetch took longer than [`ResyncConfig::timeout`].
    #[error("{url}: timed out after {after:?}")]
    Timeout {
        /// The request.
        url: String,
        /// The timeout.
        after: Duration,
    },
    /// The body arrived slower than [`ResyncConfig::min_bytes_per_sec`].
    #[error("{url}: {bytes} bytes in {after:?}, below the minimum of {min_bytes_per_sec} bytes/s")]
    TooSlow {
        /// The request.
        url: String,
        /// Bytes received.
        bytes: u64,
        /// Time since the request started.
        after: Duration,
        /// The minimum.
        min_bytes_per_sec: u64,
    },
    /// The repository is larger than [`ResyncConfig::max_repo_bytes`] (announced or as it
    /// arrived).
    #[error("{url}: repository larger than {limit} bytes")]
    TooLarge {
        /// The request.
        url: String,
        /// The limit.
        limit: usize,
    },
    /// The body ended before its `Content-Length`, or the connection failed mid-body.
    #[error("{url}: body cut after {got} bytes{}: {why}", .announced.map(|n| format!(" of {n}")).unwrap_or_default())]
    Truncated {
        /// The request.
        url: String,
        /// Bytes received.
        got: u64,
        /// The `Content-Length`, if any.
        announced: Option<u64>,
        /// What ended it.
        why: String,
    },
    /// Anything else: network, a refused redirect, the spool file.
    #[error(transparent)]
    Other(ResolveError),
}

/// A fetched repository's bytes, in memory or mapped from its spool file (module docs:
/// memory). Dereferences to the CAR's bytes; `Send`, so it can go to a blocking thread.
pub struct RepoBytes(Body);

impl std::fmt::Debug for RepoBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RepoBytes")
            .field("len", &self.len())
            .field("spooled", &self.is_spooled())
            .finish()
    }
}

/// Equal when the bytes are.
impl PartialEq for RepoBytes {
    fn eq(&self, other: &RepoBytes) -> bool {
        **self == **other
    }
}

impl Eq for RepoBytes {}

impl std::ops::Deref for RepoBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl RepoBytes {
    /// Whether the bytes were spooled to a file (larger than [`ResyncConfig::spool_above`]).
    pub fn is_spooled(&self) -> bool {
        matches!(self.0, Body::Mapped(_))
    }
}

#[derive(Debug)]
enum Body {
    /// Read into memory.
    Memory(Vec<u8>),
    /// Spooled to an unnamed temporary file, mapped read-only.
    Mapped(memmap2::Mmap),
}

impl std::ops::Deref for Body {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Body::Memory(v) => v,
            Body::Mapped(m) => m,
        }
    }
}

/// Maps a finished spool file read-only.
#[allow(unsafe_code)]
fn map_file(f: std::fs::File) -> std::io::Result<Body> {
    // SAFETY: a mapped file must not change while mapped. This one is an unnamed temporary file
    // this process created (`tempfile::tempfile_in`: O_TMPFILE, or created and unlinked at
    // once), so no other process can open it, and nothing here writes or truncates it after
    // this point; the map owns the only use of it from now on.
    let map = unsafe { memmap2::Mmap::map(&f) }?;
    Ok(Body::Mapped(map))
}

/// The bytes of block `cid` in a CAR that already verified (so it reads; `None` otherwise).
fn commit_block(car: &[u8], cid: &CidBuf) -> Option<Vec<u8>> {
    let mut reader = riptide_car::CarReader::new();
    let opts = riptide_car::CarOptions {
        verify: false,
        ..riptide_car::CarOptions::repository()
    };
    let c = reader.read(car, &opts).ok()?;
    c.get(cid.as_cid()).map(<[u8]>::to_vec)
}

const MINUTE: Duration = Duration::from_secs(60);

/// A `Retry-After` value (RFC 9110 §10.2.3): delay-seconds, saturating (a number too large for
/// `u64` is `u64::MAX` seconds, for the caller to cap), or an HTTP-date, as the time from `now`
/// until then (zero if past). `None` if it is neither.
pub fn parse_retry_after(value: &str, now: std::time::SystemTime) -> Option<Duration> {
    let v = value.trim();
    if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) {
        return Some(Duration::from_secs(v.parse::<u64>().unwrap_or(u64::MAX)));
    }
    let at = httpdate::parse_http_date(v).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// `now + d`, saturating: an instant the clock cannot represent becomes the latest one it can
/// within a year (an input-fed `Instant + Duration` panics on overflow).
pub(crate) fn later(now: Instant, d: Duration) -> Instant {
    now.checked_add(d)
        .or_else(|| now.checked_add(Duration::from_secs(365 * 86_400)))
        .unwrap_or(now)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relay_urls_map_to_their_http_base() {
        assert_eq!(
            relay_http_base("wss://bsky.network").as_deref(),
            Some("https://bsky.network")
        );
        assert_eq!(
            relay_http_base("ws://127.0.0.1:9/xrpc/com.atproto.sync.subscribeRepos?cursor=5")
                .as_deref(),
            Some("http://127.0.0.1:9")
        );
        assert_eq!(relay_http_base("ftp://x"), None);
        assert_eq!(relay_http_base("ws://"), None);
        assert_eq!(host_of("http://a.b:3/xrpc/x?did=y"), "a.b:3");
    }

    #[test]
    fn retry_after_is_seconds_or_a_date_and_never_overflows() {
        let now = httpdate::parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT").unwrap();
        let p = |v: &str| parse_retry_after(v, now);
        assert_eq!(p("120"), Some(Duration::from_secs(120)));
        assert_eq!(p(" 0 "), Some(Duration::ZERO));
        assert_eq!(
            p("18446744073709551615"),
            Some(Duration::from_secs(u64::MAX))
        );
        assert_eq!(
            p("99999999999999999999999"),
            Some(Duration::from_secs(u64::MAX)),
            "saturates"
        );
        assert_eq!(
            p("Sun, 06 Nov 1994 08:51:37 GMT"),
            Some(Duration::from_secs(120))
        );
        assert_eq!(p("Sun, 06 Nov 1994 08:00:00 GMT"), Some(Duration::ZERO));
        assert_eq!(p("-5"), None);
        assert_eq!(p("soon"), None);
        assert_eq!(p(""), None);
        // The instant: saturated, not a panic.
        let t = Instant::now();
        assert!(later(t, Duration::from_secs(u64::MAX)) >= t);
        assert_eq!(later(t, Duration::from_secs(5)), t + Duration::from_secs(5));
    }

    #[test]
    fn a_429_wait_is_retry_after_else_ratelimit_reset() {
        use reqwest::header::{HeaderMap, HeaderValue};
        let now = std::time::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let h = |pairs: &[(&'static str, &'static str)]| {
            let mut m = HeaderMap::new();
            for (k, v) in pairs {
                m.insert(*k, HeaderValue::from_static(v));
            }
            rate_limit_wait(&m, now)
        };
        assert_eq!(h(&[]), None);
        assert_eq!(h(&[("retry-after", "7")]), Some(Duration::from_secs(7)));
        // Retry-After wins over RateLimit-Reset.
        assert_eq!(
            h(&[("retry-after", "7"), ("ratelimit-reset", "30")]),
            Some(Duration::from_secs(7))
        );
        // A delay in seconds (the IETF draft), or an epoch time (the Bluesky PDS).
        assert_eq!(
            h(&[("ratelimit-reset", "30")]),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            h(&[("ratelimit-reset", "1800000045")]),
            Some(Duration::from_secs(45))
        );
        assert_eq!(
            h(&[("ratelimit-reset", "1700000000")]),
            Some(Duration::ZERO)
        );
        // An epoch time is waited for from now, not from the start of now's second.
        let late = now + Duration::from_millis(750);
        let mut m = HeaderMap::new();
        m.insert("ratelimit-reset", HeaderValue::from_static("1800000001"));
        assert_eq!(rate_limit_wait(&m, late), Some(Duration::from_millis(250)));
        assert_eq!(h(&[("ratelimit-reset", "soon")]), None);
    }

    #[test]
    fn xrpc_error_names_are_read_and_bounded() {
        assert_eq!(
            xrpc_error_name(br#"{"error":"RepoTakendown","message":"x"}"#).as_deref(),
            Some("RepoTakendown")
        );
        assert_eq!(xrpc_error_name(b"<html>"), None);
        assert_eq!(xrpc_error_name(br#"{"error":"a b"}"#), None);
        assert_eq!(xrpc_error_name(br#"{"error":7}"#), None);
    }
}
