//! The HTTP server: routes, the fault layer, request counters.
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
use riptide_relay::{Relay, RelayConfig, RelayService};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::Role;
use tokio_tungstenite::WebSocketStream;

use crate::fault::{Action, Faults};
use crate::network::Network;

/// Requests served, per endpoint (faulted ones included), and faults injected.
#[derive(Debug, Default)]
pub struct Counters {
    /// `GET /did:…` (PLC directory).
    pub plc: AtomicU64,
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

struct Shared {
    net: Network,
    base: String,
    faults: Mutex<Faults>,
    seen: AtomicU64,
    counters: Counters,
    relay: Option<RelayService>,
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
}

impl SimHandle {
    /// `http://addr`.
    pub fn base_url(&self) -> String {
        self.sim.base_url().to_owned()
    }

    /// Stops serving.
    pub fn abort(&self) {
        self.task.abort();
    }
}

impl Drop for SimHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn xrpc_error(status: StatusCode, error: &str, message: impl Into<String>) -> Response {
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
        Sim {
            shared: Arc::new(Shared {
                net,
                base: base_url.into().trim_end_matches('/').to_owned(),
                faults: Mutex::new(faults),
                seen: AtomicU64::new(0),
                counters: Counters::default(),
                relay,
            }),
        }
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
        axum::serve(listener, self.router()).await
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
        Router::new()
            .route("/xrpc/com.atproto.sync.getRepo", get(get_repo))
            .route("/xrpc/com.atproto.sync.listRepos", get(list_repos))
            .route("/xrpc/com.atproto.repo.describeRepo", get(describe_repo))
            .route(riptide_relay::SUBSCRIBE_PATH, get(subscribe_repos))
            .route("/.well-known/atproto-did", get(well_known_host))
            .route("/{handle}/.well-known/atproto-did", get(well_known_path))
            .route("/{did}", get(plc))
            .layer(middleware::from_fn_with_state(Arc::clone(&st), fault_layer))
            .route("/_sim/faults", get(get_faults).post(set_faults))
            .with_state(st)
    }
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
            let half = bytes.slice(..bytes.len() / 2);
            let chunks: [Result<bytes::Bytes, std::io::Error>; 2] = [
                Ok(half),
                Err(std::io::Error::other("sim: injected connection drop")),
            ];
            Response::from_parts(parts, Body::from_stream(futures_util::stream::iter(chunks)))
        }
    }
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

/// The document with its `#atproto_pds` endpoint pointed at the simulator.
fn rewritten(doc: &Value, base: &str) -> Value {
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
        Some(a) => Json(rewritten(&a.doc, &st.base)).into_response(),
        None => (
            StatusCode::NOT_FOUND,
            Json(json!({"message": format!("DID not registered: {did}")})),
        )
            .into_response(),
    }
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

#[derive(Deserialize)]
struct DidQuery {
    did: Option<String>,
}

async fn get_repo(State(st): State<Arc<Shared>>, Query(q): Query<DidQuery>) -> Response {
    st.counters.get_repo.fetch_add(1, Ordering::Relaxed);
    let Some(did) = q.did else {
        return xrpc_error(StatusCode::BAD_REQUEST, "InvalidRequest", "missing did");
    };
    match st.net.accounts.get(&did).and_then(|a| a.repo.clone()) {
        Some(car) => ([(header::CONTENT_TYPE, "application/vnd.ipld.car")], car).into_response(),
        None => xrpc_error(
            StatusCode::BAD_REQUEST,
            "RepoNotFound",
            format!("Could not find repo for DID: {did}"),
        ),
    }
}

#[derive(Deserialize)]
struct ListQuery {
    limit: Option<usize>,
    cursor: Option<String>,
}

async fn list_repos(State(st): State<Arc<Shared>>, Query(q): Query<ListQuery>) -> Response {
    st.counters.list_repos.fetch_add(1, Ordering::Relaxed);
    let limit = q.limit.unwrap_or(500).clamp(1, 1000);
    let start = q.cursor.unwrap_or_default();
    let mut repos = Vec::new();
    let mut last = None;
    let after = st.net.accounts.range::<String, _>((
        std::ops::Bound::Excluded(&start),
        std::ops::Bound::Unbounded,
    ));
    for (did, a) in after.filter(|(_, a)| a.repo.is_some()) {
        if repos.len() == limit {
            break;
        }
        let (head, rev) = a.head.clone().unwrap_or_default();
        repos.push(json!({"did": did, "head": head, "rev": rev, "active": true}));
        last = Some(did.clone());
    }
    // A full page may have more after it: give the cursor to ask for them.
    let full = repos.len() == limit;
    let mut out = json!({ "repos": repos });
    if full {
        out["cursor"] = json!(last);
    }
    Json(out).into_response()
}

#[derive(Deserialize)]
struct RepoQuery {
    repo: Option<String>,
}

async fn describe_repo(State(st): State<Arc<Shared>>, Query(q): Query<RepoQuery>) -> Response {
    st.counters.describe_repo.fetch_add(1, Ordering::Relaxed);
    let Some(repo) = q.repo else {
        return xrpc_error(StatusCode::BAD_REQUEST, "InvalidRequest", "missing repo");
    };
    let did = if repo.starts_with("did:") {
        Some(repo.as_str())
    } else {
        st.net.did_of_handle(&repo)
    };
    let Some(a) = did
        .and_then(|d| st.net.accounts.get(d))
        .filter(|a| a.repo.is_some())
    else {
        return xrpc_error(
            StatusCode::BAD_REQUEST,
            "RepoNotFound",
            format!("Could not find repo: {repo}"),
        );
    };
    let car = a.repo.clone().unwrap_or_default();
    // Listing walks the whole MST: off the async threads.
    let collections = tokio::task::spawn_blocking(move || {
        let mut reader = riptide_car::CarReader::new();
        let opts = riptide_car::CarOptions {
            verify: false,
            ..riptide_car::CarOptions::repository()
        };
        let car = reader.read(&car, &opts).ok()?;
        let records = riptide_repo::list_records(&car).ok()?;
        let mut cols: Vec<String> = records
            .iter()
            .filter_map(|(k, _)| k.split_once('/').map(|(c, _)| c.to_owned()))
            .collect();
        cols.dedup();
        Some(cols)
    })
    .await
    .ok()
    .flatten()
    .unwrap_or_default();
    Json(json!({
        "handle": a.handle.clone().unwrap_or_else(|| "handle.invalid".to_owned()),
        "did": a.did,
        "didDoc": rewritten(&a.doc, &st.base),
        "collections": collections,
        "handleIsCorrect": a.handle.is_some(),
    }))
    .into_response()
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
