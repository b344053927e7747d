//! The PDS and relay XRPC endpoints: `getRepo`, `getRecord`, `listRepos`, `describeRepo`,
//! `describeServer` on each PDS host; `listHosts`, `listReposByCollection` and the all-account `listRepos` /
//! `getRepo` on the relay; the per-host rate limits and faults; `/_sim/manifest` and
//! `/_sim/stats`.
//!
//! Why one module for both roles: a host and the relay answer the same endpoints over different
//! sets of accounts (a host: its own; the relay: all), so each handler takes the host it serves
//! ([`Ctx::host`], `None` for the relay's view) rather than existing twice.
//!
//! What a repository's fault does where: repository faults ([`RepoFault`]) belong to the
//! repository, so the relay's `getRepo` serves the same broken export or error as its host;
//! host faults ([`HostFault`]) and rate limits belong to the host's address only (the relay's
//! view is unlimited and healthy, which is what a fallback to the relay meets).

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{ConnectInfo, Query, Request, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use bytes::Bytes;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::limit::{Decision, Limiter, WINDOW_SECS};
use crate::plan::{HostFault, PlanConfig, RepoFault};
use crate::server::{rewritten, xrpc_error, Shared};

/// What a handler serves: the simulator, and which host (`None`: the relay, every account).
#[derive(Clone)]
pub(crate) struct Ctx {
    pub(crate) st: Arc<Shared>,
    pub(crate) host: Option<usize>,
}

/// Requests served by one host, and what it refused.
#[derive(Debug, Default)]
pub(crate) struct HostCounters {
    get_repo: AtomicU64,
    list_repos: AtomicU64,
    rate_limited: AtomicU64,
    errors: AtomicU64,
    /// `getRepo`s let through, per client IP (at most [`MAX_CLIENTS_COUNTED`] addresses; the
    /// rest under `0.0.0.0`): what a crawler spreading over several addresses is checked with.
    get_repo_by_client: std::sync::Mutex<BTreeMap<IpAddr, u64>>,
}

/// Client addresses counted one by one per host in `/_sim/stats`.
pub const MAX_CLIENTS_COUNTED: usize = 64;

impl HostCounters {
    fn count_client(&self, ip: IpAddr) {
        let mut m = self
            .get_repo_by_client
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let key = if m.len() < MAX_CLIENTS_COUNTED || m.contains_key(&ip) {
            ip
        } else {
            IpAddr::from([0, 0, 0, 0])
        };
        *m.entry(key).or_default() += 1;
    }

    fn by_client(&self) -> Value {
        let m = self
            .get_repo_by_client
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        m.iter().map(|(ip, n)| (ip.to_string(), json!(n))).collect()
    }
}

/// One PDS host: its address, fault, limiters and counters.
#[derive(Debug)]
pub(crate) struct HostState {
    pub(crate) url: String,
    pub(crate) fault: Option<HostFault>,
    get_repo: Limiter,
    list_repos: Limiter,
    counters: HostCounters,
}

impl HostState {
    pub(crate) fn new(url: String, fault: Option<HostFault>, cfg: &PlanConfig) -> HostState {
        HostState {
            url,
            fault,
            get_repo: Limiter::new(cfg.get_repo_per_sec),
            list_repos: Limiter::new(cfg.list_repos_per_sec),
            counters: HostCounters::default(),
        }
    }

    /// `host:port`, as `listHosts` names it.
    pub(crate) fn hostname(&self) -> &str {
        self.url
            .split_once("://")
            .map_or(self.url.as_str(), |(_, h)| h)
    }
}

fn count(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// The PDS routes, with the host's limits and faults when `host` is one.
pub(crate) fn pds_routes(st: &Arc<Shared>, host: Option<usize>) -> Router<Ctx> {
    let ctx = Ctx {
        st: Arc::clone(st),
        host,
    };
    Router::new()
        .route("/xrpc/com.atproto.sync.getRepo", get(get_repo))
        .route("/xrpc/com.atproto.sync.getRecord", get(get_record))
        .route("/xrpc/com.atproto.sync.listRepos", get(list_repos))
        .route("/xrpc/com.atproto.repo.describeRepo", get(describe_repo))
        .route(
            "/xrpc/com.atproto.server.describeServer",
            get(describe_server),
        )
        .layer(middleware::from_fn_with_state(ctx, host_layer))
}

fn set(h: &mut HeaderMap, name: &'static str, v: impl Into<HeaderValue>) {
    h.insert(HeaderName::from_static(name), v.into());
}

fn rate_headers(h: &mut HeaderMap, d: &Decision) {
    set(h, "ratelimit-limit", d.limit);
    set(h, "ratelimit-remaining", d.remaining);
    set(h, "ratelimit-reset", d.reset);
    if let Ok(v) = HeaderValue::from_str(&format!("{};w={WINDOW_SECS}", d.limit)) {
        h.insert(HeaderName::from_static("ratelimit-policy"), v);
    }
}

/// A host's faults and rate limits, before its handlers.
async fn host_layer(State(ctx): State<Ctx>, req: Request, next: Next) -> Response {
    let Some(host) = ctx.host.and_then(|h| ctx.st.hosts.get(h)) else {
        return next.run(req).await;
    };
    if host.fault == Some(HostFault::Error5xx) {
        count(&host.counters.errors);
        return xrpc_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "InternalServerError",
            "sim: host fault 5xx",
        );
    }
    let path = req.uri().path();
    let get_repo = path.ends_with("com.atproto.sync.getRepo");
    let limiter = if get_repo {
        count(&host.counters.get_repo);
        &host.get_repo
    } else if path.ends_with("com.atproto.sync.listRepos") {
        count(&host.counters.list_repos);
        &host.list_repos
    } else {
        return next.run(req).await;
    };
    let ip = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map_or_else(|| IpAddr::from([0, 0, 0, 0]), |c| c.0.ip());
    let Some(decision) = limiter.check(ip) else {
        if get_repo {
            host.counters.count_client(ip);
        }
        return next.run(req).await;
    };
    if !decision.allowed {
        count(&host.counters.rate_limited);
        tracing::debug!(%ip, host = %host.url, path, "sim: rate limited");
        let mut r = xrpc_error(
            StatusCode::TOO_MANY_REQUESTS,
            "RateLimitExceeded",
            "Rate Limit Exceeded",
        );
        rate_headers(r.headers_mut(), &decision);
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(decision.retry_after));
        return r;
    }
    if get_repo {
        host.counters.count_client(ip);
    }
    let mut r = next.run(req).await;
    rate_headers(r.headers_mut(), &decision);
    r
}

/// Whether `did` is served by this view (its host's, or the relay's: all).
fn serves(ctx: &Ctx, did: &str) -> bool {
    ctx.st.net.has_repo(did)
        && match ctx.host {
            None => true,
            Some(h) => ctx.st.plan.host_of.get(did) == Some(&h),
        }
}

#[derive(Deserialize)]
pub(crate) struct DidQuery {
    did: Option<String>,
}

fn car_response(body: Body, len: u64) -> Response {
    let mut r = Response::new(body);
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/vnd.ipld.car"),
    );
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    r
}

/// `bytes` sent at `per_sec` bytes per second: a tenth of a second's worth every 100 ms, the
/// whole length announced up front (a slow body, not a short one).
fn trickle(bytes: Bytes, per_sec: u64) -> Response {
    let chunk = (per_sec / 10).max(1) as usize;
    let len = bytes.len() as u64;
    let stream = futures_util::stream::unfold(0usize, move |off| {
        let bytes = bytes.clone();
        async move {
            if off >= bytes.len() {
                return None;
            }
            if off > 0 {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let end = (off + chunk).min(bytes.len());
            Some((Ok::<_, std::io::Error>(bytes.slice(off..end)), end))
        }
    });
    car_response(Body::from_stream(stream), len)
}

/// The repository generated on demand, streamed: pieces regenerated as they are sent, about
/// 64 KiB a chunk, so the simulator holds one chunk per connection.
fn stream_huge(h: &Arc<riptide_gen::HugeRepo>) -> Response {
    let len = h.car_len();
    let h = Arc::clone(h);
    let stream = futures_util::stream::unfold(0usize, move |n| {
        let h = Arc::clone(&h);
        async move {
            let mut out = h.piece(n)?;
            let mut next = n + 1;
            while out.len() < 64 << 10 {
                match h.piece(next) {
                    Some(p) => out.extend_from_slice(&p),
                    None => break,
                }
                next += 1;
            }
            Some((Ok::<_, std::io::Error>(Bytes::from(out)), next))
        }
    });
    car_response(Body::from_stream(stream), len)
}

/// The XRPC error a repository request for `did` gets before its bytes are looked at: not
/// served here, or an account fault (deactivated, taken down, 5xx). `None`: serve it.
fn refusal(ctx: &Ctx, did: &str) -> Option<Response> {
    let st = &ctx.st;
    if !serves(ctx, did) {
        return Some(xrpc_error(
            StatusCode::BAD_REQUEST,
            "RepoNotFound",
            format!("Could not find repo for DID: {did}"),
        ));
    }
    match st.plan.repo_faults.get(did).copied() {
        Some(RepoFault::Deactivated) => Some(xrpc_error(
            StatusCode::BAD_REQUEST,
            "RepoDeactivated",
            format!("Repo has been deactivated: {did}"),
        )),
        Some(RepoFault::Takendown) => Some(xrpc_error(
            StatusCode::BAD_REQUEST,
            "RepoTakendown",
            format!("Repo has been takendown: {did}"),
        )),
        Some(RepoFault::Error5xx) => {
            if let Some(h) = ctx.host.and_then(|h| st.hosts.get(h)) {
                count(&h.counters.errors);
            }
            Some(xrpc_error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "InternalServerError",
                "sim: repository fault 5xx",
            ))
        }
        _ => None,
    }
}

/// The export the simulator serves for `did`: its tampered form when it has a fault that breaks
/// it, else the generated one.
fn repo_car(st: &Shared, did: &str) -> Bytes {
    st.tampered
        .get(did)
        .cloned()
        .or_else(|| st.net.accounts.get(did).and_then(|a| a.repo.clone()))
        .unwrap_or_default()
}

async fn get_repo(State(ctx): State<Ctx>, Query(q): Query<DidQuery>) -> Response {
    let st = &ctx.st;
    count(&st.counters.get_repo);
    let Some(did) = q.did else {
        return xrpc_error(StatusCode::BAD_REQUEST, "InvalidRequest", "missing did");
    };
    if let Some(r) = refusal(&ctx, &did) {
        return r;
    }
    if let Some(h) = st.net.huge.as_ref().filter(|h| h.account.did == did) {
        return stream_huge(h);
    }
    let car = repo_car(st, &did);
    let fault = st.plan.repo_faults.get(&did).copied();
    let host_trickles = ctx
        .host
        .and_then(|h| st.hosts.get(h))
        .is_some_and(|h| h.fault == Some(HostFault::Trickle));
    if fault == Some(RepoFault::Trickle) || host_trickles {
        return trickle(car, st.config.trickle_bytes_per_sec);
    }
    let len = car.len() as u64;
    car_response(Body::from(car), len)
}

#[derive(Deserialize)]
pub(crate) struct RecordQuery {
    did: Option<String>,
    collection: Option<String>,
    rkey: Option<String>,
}

/// `com.atproto.sync.getRecord`: the record's proof (the commit, the MST path, the record),
/// built from the export this view serves (so a tampered repository's proof is as broken as
/// its export). `400 RecordNotFound` when the repository has no such record.
async fn get_record(State(ctx): State<Ctx>, Query(q): Query<RecordQuery>) -> Response {
    let st = &ctx.st;
    let (Some(did), Some(collection), Some(rkey)) = (q.did, q.collection, q.rkey) else {
        return xrpc_error(
            StatusCode::BAD_REQUEST,
            "InvalidRequest",
            "missing did, collection or rkey",
        );
    };
    if let Some(r) = refusal(&ctx, &did) {
        return r;
    }
    if st.net.huge.as_ref().is_some_and(|h| h.account.did == did) {
        return xrpc_error(
            StatusCode::NOT_IMPLEMENTED,
            "MethodNotImplemented",
            "sim: getRecord is not served for the generated-on-demand repository",
        );
    }
    let car = repo_car(st, &did);
    let key = format!("{collection}/{rkey}");
    let mut reader = riptide_car::CarReader::new();
    // The simulator's own export: its blocks were hashed when it was generated or tampered.
    let opts = riptide_car::CarOptions {
        verify: false,
        ..riptide_car::CarOptions::repository()
    };
    let proof = reader
        .read(&car, &opts)
        .map_err(riptide_repo::RepoError::from)
        .and_then(|c| riptide_repo::record_proof(&c, &key));
    match proof {
        Ok(Some(proof)) => {
            let len = proof.len() as u64;
            car_response(Body::from(proof), len)
        }
        Ok(None) => xrpc_error(
            StatusCode::BAD_REQUEST,
            "RecordNotFound",
            format!("Could not locate record: at://{did}/{key}"),
        ),
        Err(e) => xrpc_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalServerError",
            format!("sim: no proof of {key}: {e}"),
        ),
    }
}

#[derive(Deserialize)]
pub(crate) struct ListQuery {
    limit: Option<usize>,
    cursor: Option<String>,
}

/// One `listRepos` entry: `{did, head, rev, active, status?}`.
fn repo_entry(st: &Shared, did: &str) -> Value {
    let (head, rev) = st
        .net
        .accounts
        .get(did)
        .and_then(|a| a.head.clone())
        .unwrap_or_default();
    let mut e = json!({"did": did, "head": head, "rev": rev, "active": true});
    if let Some(status) = st.plan.repo_faults.get(did).and_then(|f| f.status()) {
        e["active"] = json!(false);
        e["status"] = json!(status);
    }
    e
}

/// A page of the ascending `items` after `cursor` (exclusive), at most `limit`, found by
/// binary search (a million accounts page in O(log n) each); the cursor of the next page when
/// this one is full.
fn page<'a>(
    items: &'a [String],
    cursor: Option<&str>,
    limit: usize,
) -> (&'a [String], Option<String>) {
    let start = cursor.map_or(0, |c| items.partition_point(|d| d.as_str() <= c));
    let got = &items[start..(start + limit).min(items.len())];
    let next = (got.len() == limit).then(|| got.last().cloned()).flatten();
    (got, next)
}

async fn list_repos(State(ctx): State<Ctx>, Query(q): Query<ListQuery>) -> Response {
    let st = &ctx.st;
    count(&st.counters.list_repos);
    let limit = q.limit.unwrap_or(500).clamp(1, 1000);
    let (dids, cursor): (Vec<&String>, _) = match ctx.host {
        Some(h) if st.hosts.len() > 1 => {
            let own = st.plan.accounts.get(h).map_or(&[][..], Vec::as_slice);
            let (got, next) = page(own, q.cursor.as_deref(), limit);
            (got.iter().collect(), next)
        }
        _ => {
            // Every account with a repository, from the cursor on (a range of the DID map).
            let from = q.cursor.clone().unwrap_or_default();
            let got: Vec<&String> = st
                .net
                .accounts
                .range::<String, _>((std::ops::Bound::Excluded(&from), std::ops::Bound::Unbounded))
                .map(|(d, _)| d)
                .filter(|d| st.net.has_repo(d))
                .take(limit)
                .collect();
            let next = (got.len() == limit)
                .then(|| got.last().map(|d| (*d).clone()))
                .flatten();
            (got, next)
        }
    };
    let repos: Vec<Value> = dids.iter().map(|d| repo_entry(st, d)).collect();
    let mut out = json!({ "repos": repos });
    if let Some(c) = cursor {
        out["cursor"] = json!(c);
    }
    Json(out).into_response()
}

#[derive(Deserialize)]
pub(crate) struct RepoQuery {
    repo: Option<String>,
}

async fn describe_repo(State(ctx): State<Ctx>, Query(q): Query<RepoQuery>) -> Response {
    let st = &ctx.st;
    count(&st.counters.describe_repo);
    let Some(repo) = q.repo else {
        return xrpc_error(StatusCode::BAD_REQUEST, "InvalidRequest", "missing repo");
    };
    let did = if repo.starts_with("did:") {
        Some(repo.as_str())
    } else {
        st.net.did_of_handle(&repo)
    };
    let Some(a) = did
        .filter(|d| serves(&ctx, d))
        .and_then(|d| st.net.accounts.get(d))
    else {
        return xrpc_error(
            StatusCode::BAD_REQUEST,
            "RepoNotFound",
            format!("Could not find repo: {repo}"),
        );
    };
    let collections = match &a.repo {
        Some(car) => {
            let car = car.clone();
            // Listing walks the whole MST: off the async threads.
            tokio::task::spawn_blocking(move || collections_of(&car))
                .await
                .ok()
                .flatten()
                .unwrap_or_default()
        }
        // The repository generated on demand has posts only.
        None => vec!["app.bsky.feed.post".to_owned()],
    };
    Json(json!({
        "handle": a.handle.clone().unwrap_or_else(|| "handle.invalid".to_owned()),
        "did": a.did,
        "didDoc": rewritten(&a.doc, st.pds_of(&a.did)),
        "collections": collections,
        "handleIsCorrect": a.handle.is_some(),
    }))
    .into_response()
}

/// The collections of a repository export, ascending (None if it does not read).
fn collections_of(car: &[u8]) -> Option<Vec<String>> {
    let mut reader = riptide_car::CarReader::new();
    let opts = riptide_car::CarOptions {
        verify: false,
        ..riptide_car::CarOptions::repository()
    };
    let car = reader.read(car, &opts).ok()?;
    let records = riptide_repo::list_records(&car).ok()?;
    let mut cols: Vec<String> = records
        .iter()
        .filter_map(|(k, _)| k.split_once('/').map(|(c, _)| c.to_owned()))
        .collect();
    cols.dedup();
    Some(cols)
}

async fn describe_server(State(ctx): State<Ctx>) -> Response {
    let hostname = ctx
        .host
        .and_then(|h| ctx.st.hosts.get(h))
        .map_or_else(|| ctx.st.base.clone(), |h| h.hostname().to_owned());
    let host_only = hostname.split(':').next().unwrap_or_default().to_owned();
    Json(json!({
        "did": format!("did:web:{host_only}"),
        "availableUserDomains": [".test"],
        "inviteCodeRequired": false,
    }))
    .into_response()
}

/// `listHosts`: every PDS host, in index order (the cursor is the last index given).
pub(crate) async fn list_hosts(State(ctx): State<Ctx>, Query(q): Query<ListQuery>) -> Response {
    let st = &ctx.st;
    let limit = q.limit.unwrap_or(200).clamp(1, 1000);
    let start = match q.cursor.as_deref().map(str::parse::<usize>) {
        None => 0,
        Some(Ok(i)) => i + 1,
        Some(Err(_)) => {
            return xrpc_error(StatusCode::BAD_REQUEST, "InvalidRequest", "bad cursor");
        }
    };
    let seq = st.as_of_seq.unwrap_or(0);
    let hosts: Vec<Value> = st
        .hosts
        .iter()
        .enumerate()
        .skip(start)
        .take(limit)
        .map(|(i, h)| {
            json!({
                "hostname": h.hostname(),
                "seq": seq,
                "accountCount": st.plan.accounts.get(i).map_or(0, Vec::len),
                "status": if h.fault == Some(HostFault::Offline) { "offline" } else { "active" },
            })
        })
        .collect();
    let mut out = json!({ "hosts": hosts });
    if hosts_len(&out) == limit && start + limit < st.hosts.len() {
        out["cursor"] = json!((start + limit - 1).to_string());
    }
    Json(out).into_response()
}

fn hosts_len(v: &Value) -> usize {
    v["hosts"].as_array().map_or(0, Vec::len)
}

#[derive(Deserialize)]
pub(crate) struct CollectionQuery {
    collection: Option<String>,
    limit: Option<usize>,
    cursor: Option<String>,
}

/// `listReposByCollection`: the accounts with at least one record in `collection`, by DID.
pub(crate) async fn list_repos_by_collection(
    State(ctx): State<Ctx>,
    Query(q): Query<CollectionQuery>,
) -> Response {
    let Some(collection) = q.collection else {
        return xrpc_error(
            StatusCode::BAD_REQUEST,
            "InvalidRequest",
            "missing collection",
        );
    };
    let st = Arc::clone(&ctx.st);
    let index = ctx
        .st
        .collections
        .get_or_init(|| async move {
            tokio::task::spawn_blocking(move || collection_index(&st))
                .await
                .unwrap_or_default()
        })
        .await;
    let limit = q.limit.unwrap_or(500).clamp(1, 2000);
    let dids = index.get(&collection).map_or(&[][..], Vec::as_slice);
    let (got, cursor) = page(dids, q.cursor.as_deref(), limit);
    let repos: Vec<Value> = got.iter().map(|d| json!({ "did": d })).collect();
    let mut out = json!({ "repos": repos });
    if let Some(c) = cursor {
        out["cursor"] = json!(c);
    }
    Json(out).into_response()
}

/// Collection → DIDs (ascending) of the accounts having records in it.
fn collection_index(st: &Shared) -> BTreeMap<String, Vec<String>> {
    let mut index: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (did, a) in &st.net.accounts {
        let cols = match (&a.repo, &st.net.huge) {
            (Some(car), _) => collections_of(car).unwrap_or_default(),
            (None, Some(h)) if h.account.did == *did => vec!["app.bsky.feed.post".to_owned()],
            _ => continue,
        };
        for c in cols {
            index.entry(c).or_default().push(did.clone());
        }
    }
    index
}

/// The manifest: what the simulator serves where, and which host or repository is faulty.
pub(crate) fn manifest(st: &Shared) -> Value {
    let hosts: Vec<Value> = st
        .hosts
        .iter()
        .enumerate()
        .map(|(i, h)| {
            json!({
                "index": i,
                "hostname": h.hostname(),
                "url": h.url,
                "accounts": st.plan.accounts.get(i).map_or(0, Vec::len),
                "fault": h.fault,
            })
        })
        .collect();
    let faults: Vec<Value> = st
        .plan
        .repo_faults
        .iter()
        .map(|(did, f)| json!({"did": did, "host": st.plan.host_of.get(did), "fault": f}))
        .collect();
    json!({
        "base": st.base,
        "relay": st.base.replacen("http", "ws", 1) + riptide_relay::SUBSCRIBE_PATH,
        "seed": st.config.seed,
        "repos_as_of_seq": st.as_of_seq,
        "limits": {
            "get_repo_per_sec": st.config.get_repo_per_sec,
            "list_repos_per_sec": st.config.list_repos_per_sec,
        },
        "trickle_bytes_per_sec": st.config.trickle_bytes_per_sec,
        "hosts": hosts,
        "faults": faults,
        "huge_repo": st.net.huge.as_ref().map(|h| json!({
            "did": h.account.did,
            "host": st.plan.host_of.get(&h.account.did),
            "bytes": h.car_len(),
            "records": h.records(),
        })),
    })
}

/// Per-host counters.
pub(crate) fn stats(st: &Shared) -> Value {
    let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
    let hosts: Vec<Value> = st
        .hosts
        .iter()
        .enumerate()
        .map(|(i, h)| {
            json!({
                "index": i,
                "hostname": h.hostname(),
                "get_repo": load(&h.counters.get_repo),
                "list_repos": load(&h.counters.list_repos),
                "rate_limited": load(&h.counters.rate_limited),
                "errors": load(&h.counters.errors),
                "get_repo_by_client": h.counters.by_client(),
            })
        })
        .collect();
    let c = &st.counters;
    json!({
        "hosts": hosts,
        "rate_limited": st.hosts.iter().map(|h| load(&h.counters.rate_limited)).sum::<u64>(),
        "requests": {
            "plc": load(&c.plc),
            "plc_export": load(&c.plc_export),
            "get_repo": load(&c.get_repo),
            "list_repos": load(&c.list_repos),
            "describe_repo": load(&c.describe_repo),
            "subscribe": load(&c.subscribe),
        },
    })
}

pub(crate) async fn get_manifest(State(st): State<Arc<Shared>>) -> Json<Value> {
    Json(manifest(&st))
}

pub(crate) async fn get_stats(State(st): State<Arc<Shared>>) -> Json<Value> {
    Json(stats(&st))
}

#[cfg(test)]
mod tests {
    use super::page;

    #[test]
    fn pages_by_binary_search() {
        let items: Vec<String> = ["a", "c", "e", "g", "i"].map(str::to_owned).to_vec();
        let (got, next) = page(&items, None, 2);
        assert_eq!((got, next.as_deref()), (&items[..2], Some("c")));
        let (got, next) = page(&items, Some("c"), 2);
        assert_eq!((got, next.as_deref()), (&items[2..4], Some("g")));
        // A cursor that is not an item (an account gone since) resumes after it.
        let (got, next) = page(&items, Some("d"), 10);
        assert_eq!((got, next), (&items[2..], None));
        let (got, next) = page(&items, Some("z"), 2);
        assert!(got.is_empty() && next.is_none());
    }
}
