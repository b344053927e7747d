//! The HTTP server: routes, the fault layer, request counters, and the listeners of a
//! many-host network ([`Sim::bind_network`]: the simulator's own address for the PLC directory
//! and the relay, one loopback port per PDS host; the PDS endpoints themselves are in `pds`).
//!
//! Concurrency: one [`Sim`] is shared by every connection (an `Arc`); the network is immutable
//! once served, faults sit behind a mutex held for a copy, counters are atomics.
//!
//! The relay: `subscribeRepos` is mounted on the same router, so one base URL is PLC, PDS and
//! relay. axum's own WebSocket type is not tungstenite's, so the upgrade is done here by hand
//! (check the headers, answer 101 with `Sec-WebSocket-Accept`, take hyper's upgraded connection)
//! and the raw connection is handed to `riptide-relay` ([`RelayService::serve`]): one relay
//! implementation, with its cursor semantics, pings and faults, whether it listens on its own
//! port (`riptide relay`) or here.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::{Path, Query, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use bytes::Bytes;
use riptide_relay::{Relay, RelayConfig, RelayService};
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::Role;
use tokio_tungstenite::WebSocketStream;

use crate::fault::{Action, Faults};
use crate::network::{Network, SimError};
use crate::pds::{self, HostState};
use crate::plan::{HostFault, Plan, PlanConfig, RepoFault};

/// Requests served, per endpoint (faulted ones included), and faults injected.
#[derive(Debug, Default)]
pub struct Counters {
    /// `GET /did:…` (PLC directory).
    pub plc: AtomicU64,
    /// `GET /export` (the PLC directory's log, [`crate::plc`]).
    pub plc_export: AtomicU64,
    /// `/.well-known/atproto-did` (by Host header or path).
    pub well_known: AtomicU64,
    /// `com.atproto.sync.getRepo`.
    pub get_repo: AtomicU64,
    /// `com.atproto.sync.listRepos`.
    pub list_repos: AtomicU64,
    /// `com.atproto.repo.describeRepo`.
    pub describe_repo: AtomicU64,
    /// `com.atproto.sync.subscribeRepos` requests (upgraded or not).
    pub subscribe: AtomicU64,
    /// Requests answered 503 by the fault layer.
    pub errors_injected: AtomicU64,
    /// Responses cut by the fault layer.
    pub drops_injected: AtomicU64,
}

impl Counters {
    /// Reads one counter.
    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }
}

pub(crate) struct Shared {
    pub(crate) net: Network,
    pub(crate) base: String,
    faults: Mutex<Faults>,
    seen: AtomicU64,
    pub(crate) counters: Counters,
    relay: Option<RelayService>,
    /// Hosts, limits and faults (one host, no limit, no fault unless [`Sim::bind_network`]).
    pub(crate) plan: Plan,
    pub(crate) config: PlanConfig,
    /// Per host: its address, limiters and counters.
    pub(crate) hosts: Vec<HostState>,
    /// The broken exports of the faulty repositories that have one.
    pub(crate) tampered: HashMap<String, Bytes>,
    /// Collection → DIDs having records in it, built on the first `listReposByCollection`.
    pub(crate) collections: tokio::sync::OnceCell<BTreeMap<String, Vec<String>>>,
    /// The relay seq the repositories are as of, if the network says (`repos.json`).
    pub(crate) as_of_seq: Option<u64>,
    /// The PLC directory's log as export lines, made on the first `/export`.
    plc_log: std::sync::OnceLock<Vec<String>>,
}

impl Shared {
    /// The PDS URL the documents name for `did`: its host's.
    pub(crate) fn pds_of(&self, did: &str) -> &str {
        self.plan
            .host_of
            .get(did)
            .and_then(|&h| self.hosts.get(h))
            .map_or(&self.base, |h| &h.url)
    }
}

/// A simulator: a [`Network`] served at a base URL.
#[derive(Clone)]
pub struct Sim {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Sim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sim")
            .field("base", &self.shared.base)
            .field("accounts", &self.shared.net.accounts.len())
            .finish()
    }
}

/// A simulator running on a spawned task.
#[derive(Debug)]
pub struct SimHandle {
    /// The address it listens on.
    pub addr: SocketAddr,
    /// The simulator (counters, faults).
    pub sim: Sim,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
    hosts: Vec<tokio::task::JoinHandle<std::io::Result<()>>>,
}

impl SimHandle {
    /// `http://addr`.
    pub fn base_url(&self) -> String {
        self.sim.base_url().to_owned()
    }

    /// Stops serving (the relay and every host).
    pub fn abort(&self) {
        self.task.abort();
        for h in &self.hosts {
            h.abort();
        }
    }
}

impl Drop for SimHandle {
    fn drop(&mut self) {
        self.abort();
    }
}

/// The listeners of [`Sim::bind_network`]: the simulator's own (PLC, relay) and, with more than
/// one host, one per PDS host (`None` for an offline host, whose port is closed).
#[derive(Debug)]
pub struct Listeners {
    main: TcpListener,
    hosts: Vec<Option<TcpListener>>,
}

pub(crate) fn xrpc_error(status: StatusCode, error: &str, message: impl Into<String>) -> Response {
    (
        status,
        Json(json!({"error": error, "message": message.into()})),
    )
        .into_response()
}

impl Sim {
    /// A simulator of `net` whose documents name `base_url` as every account's PDS, without a
    /// relay (`subscribeRepos` answers 501); see [`Sim::with_relay`].
    pub fn new(net: Network, base_url: impl Into<String>, faults: Faults) -> Sim {
        Sim::with_relay(net, base_url, faults, None)
    }

    /// [`Sim::new`] with `relay` serving `subscribeRepos` (usually [`Sim::start_relay`]).
    pub fn with_relay(
        net: Network,
        base_url: impl Into<String>,
        faults: Faults,
        relay: Option<RelayService>,
    ) -> Sim {
        let base = base_url.into().trim_end_matches('/').to_owned();
        let dids = net.repo_dids();
        let config = PlanConfig::default();
        // One host, no fault asked for: the plan cannot fail (only stream deactivations).
        // One host serves every repository as before (stream deactivations included).
        let plan = Plan::new(&config, &dids, &[], &[]).unwrap_or_default();
        Sim::build(net, base.clone(), faults, relay, plan, config, vec![base])
            .unwrap_or_else(|(sim, _)| sim)
    }

    /// The simulator, with `urls[h]` the address of host `h`. On a repository that cannot be
    /// broken as its fault asks, the error (and a simulator that serves it unbroken).
    fn build(
        net: Network,
        base: String,
        faults: Faults,
        relay: Option<RelayService>,
        plan: Plan,
        config: PlanConfig,
        urls: Vec<String>,
    ) -> Result<Sim, (Sim, SimError)> {
        let hosts = urls
            .into_iter()
            .enumerate()
            .map(|(i, url)| {
                HostState::new(url, plan.host_faults.get(i).copied().flatten(), &config)
            })
            .collect();
        let mut tampered = HashMap::new();
        let mut failed = None;
        let dids = net.repo_dids();
        for (did, fault) in &plan.repo_faults {
            let Some(car) = net.accounts.get(did).and_then(|a| a.repo.as_ref()) else {
                continue;
            };
            let broken = match fault {
                RepoFault::CutAtBlock => crate::tamper::cut_at_block(car),
                RepoFault::MissingBlock => crate::tamper::missing_block(car),
                RepoFault::BadSignature => crate::tamper::bad_signature(car),
                RepoFault::OtherDid => {
                    // The next account (in DID order) that has a loaded export.
                    let pos = dids.iter().position(|d| d == did).unwrap_or(0);
                    let other = dids
                        .iter()
                        .cycle()
                        .skip(pos + 1)
                        .take(dids.len())
                        .filter(|d| *d != did)
                        .find_map(|d| net.accounts.get(d).and_then(|a| a.repo.clone()));
                    match other {
                        Some(o) => {
                            tampered.insert(did.clone(), o);
                        }
                        None => {
                            failed = Some(SimError::Tamper {
                                did: did.clone(),
                                source: crate::tamper::TamperError::new(
                                    "no other repository to serve instead",
                                ),
                            })
                        }
                    }
                    continue;
                }
                _ => continue,
            };
            match broken {
                Ok(b) => {
                    tampered.insert(did.clone(), Bytes::from(b));
                }
                Err(source) => {
                    failed = Some(SimError::Tamper {
                        did: did.clone(),
                        source,
                    })
                }
            }
        }
        let as_of_seq = match (&relay, net.as_of_frame) {
            (Some(r), Some(k)) => {
                let left_out = r.left_out().iter().filter(|&&p| (p as u64) < k).count() as u64;
                Some(r.config().first_seq + k.saturating_sub(left_out) - 1)
            }
            _ => None,
        };
        let sim = Sim {
            shared: Arc::new(Shared {
                net,
                base,
                faults: Mutex::new(faults),
                seen: AtomicU64::new(0),
                counters: Counters::default(),
                relay,
                plan,
                config,
                hosts,
                tampered,
                collections: tokio::sync::OnceCell::new(),
                as_of_seq,
                plc_log: std::sync::OnceLock::new(),
            }),
        };
        match failed {
            Some(e) => Err((sim, e)),
            None => Ok(sim),
        }
    }

    /// Binds the simulator's own address `addr` (PLC directory, relay, `listHosts`, the
    /// relay's `listRepos`/`getRepo`) and, when `plan.hosts` > 1, one loopback port per PDS host
    /// (an offline host's port is bound and closed again, so connections to it are refused).
    /// With one host the simulator's own address is the PDS, as with [`Sim::bind_with`].
    pub async fn bind_network(
        net: Network,
        addr: SocketAddr,
        faults: Faults,
        relay: RelayConfig,
        plan: PlanConfig,
    ) -> Result<(Sim, Listeners), SimError> {
        let bind_err = |addr: SocketAddr| {
            move |source| SimError::Bind {
                addr: addr.to_string(),
                source,
            }
        };
        let dids = net.repo_dids();
        let spared: Vec<String> = net.huge.iter().map(|h| h.account.did.clone()).collect();
        // With one host every repository is served as before; with more, the accounts the
        // stream deactivated answer as a PDS does.
        let deactivated: &[String] = if plan.hosts > 1 {
            &net.deactivated
        } else {
            &[]
        };
        let decided = Plan::new(&plan, &dids, deactivated, &spared)?;
        let relay = Sim::start_relay(&net, relay);
        let main = TcpListener::bind(addr).await.map_err(bind_err(addr))?;
        let local = main.local_addr().map_err(bind_err(addr))?;
        let ip = if local.ip().is_unspecified() {
            std::net::IpAddr::from([127, 0, 0, 1])
        } else {
            local.ip()
        };
        let base = format!("http://{}", SocketAddr::new(ip, local.port()));
        let mut urls = vec![];
        let mut hosts = vec![];
        if plan.hosts > 1 {
            for h in 0..plan.hosts {
                let at = SocketAddr::new(ip, 0);
                let l = TcpListener::bind(at).await.map_err(bind_err(at))?;
                let a = l.local_addr().map_err(bind_err(at))?;
                urls.push(format!("http://{a}"));
                let offline = decided.host_faults[h] == Some(HostFault::Offline);
                hosts.push((!offline).then_some(l));
            }
        } else {
            urls.push(base.clone());
        }
        let sim = Sim::build(net, base, faults, relay, decided, plan, urls).map_err(|(_, e)| e)?;
        Ok((sim, Listeners { main, hosts }))
    }

    /// Serves every listener of [`Sim::bind_network`] until one fails or the task is dropped.
    pub async fn serve_network(self, listeners: Listeners) -> std::io::Result<()> {
        let mut tasks = tokio::task::JoinSet::new();
        for (i, l) in listeners.hosts.into_iter().enumerate() {
            if let Some(l) = l {
                tasks.spawn(serve_router(l, self.host_router(i)));
            }
        }
        tasks.spawn(serve_router(listeners.main, self.router()));
        match tasks.join_next().await {
            Some(Ok(r)) => r,
            Some(Err(e)) => Err(std::io::Error::other(e)),
            None => Ok(()),
        }
    }

    /// [`Sim::bind_network`], then served on spawned tasks (stopped when the handle drops).
    pub async fn spawn_network(
        net: Network,
        addr: SocketAddr,
        faults: Faults,
        relay: RelayConfig,
        plan: PlanConfig,
    ) -> Result<SimHandle, SimError> {
        let (sim, listeners) = Sim::bind_network(net, addr, faults, relay, plan).await?;
        let local = listeners
            .main
            .local_addr()
            .map_err(|source| SimError::Bind {
                addr: addr.to_string(),
                source,
            })?;
        let mut hosts = Vec::new();
        for (i, l) in listeners.hosts.into_iter().enumerate() {
            if let Some(l) = l {
                hosts.push(tokio::spawn(serve_router(l, sim.host_router(i))));
            }
        }
        let task = tokio::spawn(serve_router(listeners.main, sim.router()));
        Ok(SimHandle {
            addr: local,
            sim,
            task,
            hosts,
        })
    }

    /// The PDS hosts' base URLs, by index (with one host, the simulator's own).
    pub fn host_urls(&self) -> Vec<String> {
        self.shared.hosts.iter().map(|h| h.url.clone()).collect()
    }

    /// The manifest: hosts, limits, faults (see [`crate::manifest`](crate) in the crate docs).
    pub fn manifest(&self) -> Value {
        pds::manifest(&self.shared)
    }

    /// Per-host counters (requests, 429s, injected errors) as JSON (`GET /_sim/stats`).
    pub fn stats(&self) -> Value {
        pds::stats(&self.shared)
    }

    /// The relay seq the repositories are as of (`repos.json`), if known.
    pub fn repos_as_of_seq(&self) -> Option<u64> {
        self.shared.as_of_seq
    }

    /// A relay for the network's frames ([`Network::frames`]; those it cannot serve are left
    /// out and counted in its [`riptide_relay::RelayStats::unservable`]), or `None` when it has
    /// none. `config.window` is raised to hold every frame unless `config.looped`, so `cursor=0`
    /// replays the whole stream. Needs a tokio runtime.
    pub fn start_relay(net: &Network, mut config: RelayConfig) -> Option<RelayService> {
        if net.frames.is_empty() {
            return None;
        }
        if !config.looped {
            config.window = config.window.max(net.frames.len());
        }
        Some(Relay::start(net.frames.clone(), config))
    }

    /// Binds `addr` (port 0: an ephemeral port): the simulator, whose base URL is the bound
    /// address (loopback when `addr` is unspecified), and its listener for [`Sim::serve`]. The
    /// relay serves the network's frames, if any, all at once ([`Sim::bind_with`] to pace them).
    pub async fn bind(
        net: Network,
        addr: SocketAddr,
        faults: Faults,
    ) -> std::io::Result<(Sim, TcpListener)> {
        Sim::bind_with(net, addr, faults, RelayConfig::default()).await
    }

    /// [`Sim::bind`] with the relay's settings (rate, looping, window, first seq; its faults
    /// come from [`Faults`] instead).
    pub async fn bind_with(
        net: Network,
        addr: SocketAddr,
        faults: Faults,
        relay: RelayConfig,
    ) -> std::io::Result<(Sim, TcpListener)> {
        let relay = Sim::start_relay(&net, relay);
        let listener = TcpListener::bind(addr).await?;
        let local = listener.local_addr()?;
        let host = if local.ip().is_unspecified() {
            SocketAddr::from(([127, 0, 0, 1], local.port()))
        } else {
            local
        };
        Ok((
            Sim::with_relay(net, format!("http://{host}"), faults, relay),
            listener,
        ))
    }

    /// Serves on `listener` until the task is dropped or the listener fails.
    pub async fn serve(self, listener: TcpListener) -> std::io::Result<()> {
        serve_router(listener, self.router()).await
    }

    /// [`Sim::bind`], then [`Sim::serve`] on a spawned task (stopped when the handle drops).
    pub async fn spawn(
        net: Network,
        addr: SocketAddr,
        faults: Faults,
    ) -> std::io::Result<SimHandle> {
        let (sim, listener) = Sim::bind(net, addr, faults).await?;
        let local = listener.local_addr()?;
        let task = tokio::spawn(sim.clone().serve(listener));
        Ok(SimHandle {
            addr: local,
            sim,
            task,
            hosts: Vec::new(),
        })
    }

    /// The base URL (what documents name as the PDS).
    pub fn base_url(&self) -> &str {
        &self.shared.base
    }

    /// The relay's URL: `ws://…/xrpc/com.atproto.sync.subscribeRepos` on the base URL.
    pub fn relay_url(&self) -> String {
        let base = &self.shared.base;
        let ws = match base.split_once("://") {
            Some(("https", rest)) => format!("wss://{rest}"),
            Some((_, rest)) => format!("ws://{rest}"),
            None => format!("ws://{base}"),
        };
        format!("{ws}{}", riptide_relay::SUBSCRIBE_PATH)
    }

    /// The relay, if the network has frames.
    pub fn relay(&self) -> Option<&RelayService> {
        self.shared.relay.as_ref()
    }

    /// The network served.
    pub fn network(&self) -> &Network {
        &self.shared.net
    }

    /// Request counters.
    pub fn counters(&self) -> &Counters {
        &self.shared.counters
    }

    /// Replaces the faults; request counting for "every Nth" restarts.
    pub fn set_faults(&self, f: Faults) {
        self.shared.set_faults(f);
    }

    /// The current faults.
    pub fn faults(&self) -> Faults {
        *self.shared.faults.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The routes, with the fault layer. Other services (a relay) can be merged into it.
    pub fn router(&self) -> Router {
        let st = Arc::clone(&self.shared);
        // With one host the simulator's own address is that PDS (limits and all); with more,
        // it is the relay, whose `listRepos`/`getRepo` cover every account.
        let host = (st.hosts.len() == 1).then_some(0);
        let pds = pds::pds_routes(&st, host)
            .route("/xrpc/com.atproto.sync.listHosts", get(pds::list_hosts))
            .route(
                "/xrpc/com.atproto.sync.listReposByCollection",
                get(pds::list_repos_by_collection),
            )
            .with_state(pds::Ctx {
                st: Arc::clone(&st),
                host,
            });
        Router::new()
            .merge(pds)
            .route(riptide_relay::SUBSCRIBE_PATH, get(subscribe_repos))
            .route("/.well-known/atproto-did", get(well_known_host))
            .route("/{handle}/.well-known/atproto-did", get(well_known_path))
            .route("/export", get(plc_export))
            .route("/{did}", get(plc))
            .layer(middleware::from_fn_with_state(Arc::clone(&st), fault_layer))
            .route("/_sim/faults", get(get_faults).post(set_faults))
            .route("/_sim/manifest", get(pds::get_manifest))
            .route("/_sim/stats", get(pds::get_stats))
            .with_state(st)
    }

    /// The routes of PDS host `index` (`getRepo`, `listRepos`, `describeRepo`,
    /// `describeServer`), with its limits and faults, under the simulator's fault layer.
    pub fn host_router(&self, index: usize) -> Router {
        let st = Arc::clone(&self.shared);
        pds::pds_routes(&st, Some(index))
            .with_state(pds::Ctx {
                st: Arc::clone(&st),
                host: Some(index),
            })
            .layer(middleware::from_fn_with_state(Arc::clone(&st), fault_layer))
    }
}

/// Serves `router` with each connection's peer address (the rate limits are per client IP).
async fn serve_router(listener: TcpListener, router: Router) -> std::io::Result<()> {
    axum::serve(
        listener,
        router.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await
}

async fn fault_layer(State(st): State<Arc<Shared>>, req: Request, next: Next) -> Response {
    let n = st.seen.fetch_add(1, Ordering::Relaxed) + 1;
    let f = *st.faults.lock().unwrap_or_else(|p| p.into_inner());
    if f.delay_ms > 0 {
        tokio::time::sleep(f.delay()).await;
    }
    match f.action(n) {
        Action::Pass => next.run(req).await,
        Action::Error => {
            st.counters.errors_injected.fetch_add(1, Ordering::Relaxed);
            xrpc_error(
                StatusCode::SERVICE_UNAVAILABLE,
                "InternalServerError",
                "sim: injected fault",
            )
        }
        Action::RateLimited => {
            st.counters.errors_injected.fetch_add(1, Ordering::Relaxed);
            let mut r = xrpc_error(
                StatusCode::TOO_MANY_REQUESTS,
                "RateLimitExceeded",
                "sim: injected rate limit",
            );
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(f.retry_after()));
            r
        }
        Action::Drop if is_upgrade(req.headers()) => {
            // A WebSocket upgrade has no body to cut: drop the connection before upgrading (an
            // announced body that fails at once).
            st.counters.drops_injected.fetch_add(1, Ordering::Relaxed);
            let chunks: [Result<bytes::Bytes, std::io::Error>; 1] =
                [Err(std::io::Error::other("sim: injected connection drop"))];
            let mut r = Response::new(Body::from_stream(futures_util::stream::iter(chunks)));
            r.headers_mut()
                .insert(header::CONTENT_LENGTH, HeaderValue::from(64u32));
            r
        }
        Action::Drop => {
            st.counters.drops_injected.fetch_add(1, Ordering::Relaxed);
            let (mut parts, body) = next.run(req).await.into_parts();
            let announced = parts
                .headers
                .get(header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
            if let Some(len) = announced {
                // A streamed body (a repository generated as it is sent may be gigabytes): pass
                // the first half through as it comes, then fail, holding nothing.
                return Response::from_parts(parts, cut_stream(body, len / 2));
            }
            let Ok(bytes) = axum::body::to_bytes(body, usize::MAX).await else {
                return xrpc_error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "InternalServerError",
                    "sim: body",
                );
            };
            // Announce the whole length, send half, then fail the stream: hyper drops the
            // connection, and the client sees a body cut short.
            parts
                .headers
                .insert(header::CONTENT_LENGTH, HeaderValue::from(bytes.len()));
            let half = bytes.len() as u64 / 2;
            Response::from_parts(parts, cut_stream(Body::from(bytes), half))
        }
    }
}

/// `body`'s first `keep` bytes, then an error (hyper drops the connection).
fn cut_stream(body: Body, keep: u64) -> Body {
    use futures_util::StreamExt;
    let cut = body
        .into_data_stream()
        .map(|r| r.map_err(std::io::Error::other))
        .chain(futures_util::stream::once(async {
            Err(std::io::Error::other("sim: injected connection drop"))
        }))
        .scan(keep, |left, item| {
            let out = match item {
                Ok(_) if *left == 0 => {
                    Some(Err(std::io::Error::other("sim: injected connection drop")))
                }
                Ok(mut b) => {
                    if b.len() as u64 > *left {
                        b.truncate(*left as usize);
                    }
                    *left -= b.len() as u64;
                    Some(Ok(b))
                }
                Err(e) => Some(Err(e)),
            };
            std::future::ready(out)
        });
    // Stop after the first error: nothing follows a dropped connection.
    let mut failed = false;
    Body::from_stream(cut.take_while(move |r| {
        let go = !failed;
        failed |= r.is_err();
        std::future::ready(go)
    }))
}

async fn get_faults(State(st): State<Arc<Shared>>) -> Json<Faults> {
    Json(*st.faults.lock().unwrap_or_else(|p| p.into_inner()))
}

async fn set_faults(State(st): State<Arc<Shared>>, Json(f): Json<Faults>) -> Json<Faults> {
    st.set_faults(f);
    Json(f)
}

impl Shared {
    fn set_faults(&self, f: Faults) {
        let mut g = self.faults.lock().unwrap_or_else(|p| p.into_inner());
        *g = f;
        self.seen.store(0, Ordering::Relaxed);
    }
}

/// The document with its `#atproto_pds` endpoint pointed at the account's host.
pub(crate) fn rewritten(doc: &Value, base: &str) -> Value {
    let mut doc = doc.clone();
    if let Some(Value::Array(services)) = doc.get_mut("service") {
        for s in services {
            let is_pds = s
                .get("id")
                .and_then(Value::as_str)
                .is_some_and(|id| id.ends_with("#atproto_pds"));
            if is_pds {
                if let Some(o) = s.as_object_mut() {
                    o.insert("serviceEndpoint".to_owned(), Value::String(base.to_owned()));
                }
            }
        }
    }
    doc
}

async fn plc(State(st): State<Arc<Shared>>, Path(did): Path<String>) -> Response {
    st.counters.plc.fetch_add(1, Ordering::Relaxed);
    match st.net.accounts.get(&did).filter(|a| !a.doc.is_null()) {
        Some(a) => Json(rewritten(&a.doc, st.pds_of(&did))).into_response(),
        None => (
            StatusCode::NOT_FOUND,
            Json(json!({"message": format!("DID not registered: {did}")})),
        )
            .into_response(),
    }
}

/// `GET /export` query: `count` (default 10, at most 1,000, as the public directory) and
/// `after` (a `seq`).
#[derive(serde::Deserialize)]
struct ExportQuery {
    count: Option<usize>,
    after: Option<String>,
}

async fn plc_export(State(st): State<Arc<Shared>>, Query(q): Query<ExportQuery>) -> Response {
    st.counters.plc_export.fetch_add(1, Ordering::Relaxed);
    let after = match q.after.as_deref().map(str::parse::<u64>) {
        None => 0,
        Some(Ok(n)) => n,
        Some(Err(_)) => {
            return (
                StatusCode::BAD_REQUEST,
                Json(json!({"message": "sim: `after` must be a seq"})),
            )
                .into_response()
        }
    };
    let lines = st
        .plc_log
        .get_or_init(|| crate::plc::export_lines(&st.net, |d| st.pds_of(d).to_owned()));
    let body = crate::plc::page(lines, after, q.count.unwrap_or(10).clamp(1, 1000));
    ([(header::CONTENT_TYPE, "application/jsonlines")], body).into_response()
}

fn well_known(st: &Shared, handle: &str) -> Response {
    st.counters.well_known.fetch_add(1, Ordering::Relaxed);
    match st.net.did_of_handle(handle) {
        Some(did) => ([(header::CONTENT_TYPE, "text/plain")], did.to_owned()).into_response(),
        None => (StatusCode::NOT_FOUND, "no such handle").into_response(),
    }
}

async fn well_known_host(State(st): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or_default();
    // Strip a port (handles have none; IPv6 literals are not handles either).
    let handle = host.rsplit_once(':').map_or(host, |(h, _)| h);
    well_known(&st, handle)
}

async fn well_known_path(State(st): State<Arc<Shared>>, Path(handle): Path<String>) -> Response {
    well_known(&st, &handle)
}

/// Whether a request asks for a WebSocket upgrade.
fn is_upgrade(h: &HeaderMap) -> bool {
    let has = |name: header::HeaderName, token: &str| {
        h.get_all(name).iter().any(|v| {
            v.to_str()
                .is_ok_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
        })
    };
    has(header::CONNECTION, "upgrade") && has(header::UPGRADE, "websocket")
}

/// `subscribeRepos`: the WebSocket handshake (RFC 6455 §4.2), then the relay on the upgraded
/// connection with the faults in force now.
async fn subscribe_repos(State(st): State<Arc<Shared>>, mut req: Request) -> Response {
    st.counters.subscribe.fetch_add(1, Ordering::Relaxed);
    if st.relay.is_none() {
        return xrpc_error(
            StatusCode::NOT_IMPLEMENTED,
            "MethodNotImplemented",
            "sim: no firehose-frames.bin, so no relay",
        );
    }
    let h = req.headers();
    let version_ok = h
        .get(header::SEC_WEBSOCKET_VERSION)
        .is_some_and(|v| v.as_bytes() == b"13");
    let key = h
        .get(header::SEC_WEBSOCKET_KEY)
        .map(|k| k.as_bytes().to_vec());
    let (true, true, Some(key)) = (is_upgrade(h), version_ok, key) else {
        return xrpc_error(
            StatusCode::UPGRADE_REQUIRED,
            "InvalidRequest",
            "subscribeRepos is a WebSocket endpoint",
        );
    };
    let cursor = match riptide_relay::parse_cursor(req.uri().query()) {
        Ok(c) => c,
        Err(m) => return xrpc_error(StatusCode::BAD_REQUEST, "InvalidRequest", m),
    };
    let faults = st.faults.lock().unwrap_or_else(|p| p.into_inner()).relay();
    let upgrade = hyper::upgrade::on(&mut req);
    // The task must not keep the simulator (and so its relay) alive: dropping the simulator
    // stops the relay, which closes its subscribers.
    let sim = Arc::downgrade(&st);
    drop(st);
    tokio::spawn(async move {
        match upgrade.await {
            Ok(io) => {
                let io = hyper_util::rt::TokioIo::new(io);
                let ws = WebSocketStream::from_raw_socket(io, Role::Server, None).await;
                let serving = match sim.upgrade().as_ref().and_then(|s| s.relay.as_ref()) {
                    Some(relay) => relay.serve(ws, cursor, faults),
                    None => return,
                };
                serving.await;
            }
            Err(e) => tracing::debug!(error = %e, "subscribeRepos upgrade failed"),
        }
    });
    let mut r = Response::new(Body::empty());
    *r.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let hs = r.headers_mut();
    hs.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    hs.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    if let Ok(v) = HeaderValue::from_str(&derive_accept_key(&key)) {
        hs.insert(header::SEC_WEBSOCKET_ACCEPT, v);
    }
    r
}
