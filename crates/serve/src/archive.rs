//! Jetstream v2's archive: `POST …planSnapshot`, `GET …listSegments`, `GET …getSegment`,
//! `GET …getBlock` (the lexicons in `shared/corpus/jetstream-v2/lexicons/` are the contract;
//! `docs/archive.md` the design).
//!
//! Why a module of its own: these endpoints serve sealed `.jss` files, not the live log, and
//! differ from both wires in everything a client sees (plain HTTP downloads with ranges and
//! validators, a JSON procedure, bearer authorization, a byte quota). What is sealed is
//! [`SealedSegments`]: the current list of verified segment files, a snapshot swapped whole
//! when a segment is sealed or rewritten, read by every request without holding a lock across
//! I/O. Today it scans `DIR/segments/*.jss` at start; the store adds what it seals with
//! [`SealedSegments::add`].
//!
//! **What is kept in memory** per segment is its header and footer ([`SegmentMeta`]: block
//! index, DID blooms, collection bitmaps), read and checksum-verified once when the file is
//! added; `planSnapshot` is computed from that alone ([`riptide_segment::plan`]). A file that
//! fails verification is logged, counted (`riptide_archive_segments_rejected_total`) and not
//! served.
//!
//! **Downloads** are streamed from the file in [`CHUNK`]-byte reads on the blocking pool, at most
//! [`CHUNKS_IN_FLIGHT`] chunks ahead of the socket, so a download costs a few MiB whatever the
//! file's size. Validators come from the file actually opened, never from memory: the `ETag`
//! is the checksum in that file's header (a file rewritten by compaction has a new one), so an
//! `If-Range` naming an older generation gets the whole new file (`200`), never a splice of two.
//! `Range` takes one `bytes=` range (`206` + `Content-Range`; unsatisfiable: `416` with
//! `Content-Range: bytes */LEN`); a list of ranges is answered with the whole file, as RFC 9110
//! allows. One deliberate exception: a range that starts exactly at the end of the file is a
//! `204 No Content` (`Cache-Control: no-store`, `Content-Range: bytes */LEN`), not a `416`. The
//! Python SDK reads a segment in 8 MiB ranges until a chunk is short or empty, so on a file whose
//! size is a multiple of 8 MiB its last request starts at the end; it treats an empty `2xx` as
//! the end and any `416` as a failure (Go's `http.ServeContent`, which Jetstream uses, answers
//! `416` there, and the SDK's `snapshot()` then raises). `If-None-Match` with the `ETag` (or `*`) is a `304`. `HEAD` sends the headers alone.
//! `getBlock` serves the bare zstd frame (its length prefix checked against the block index)
//! with the `ETag` `"<checksum>:<block>"`, as Jetstream.
//!
//! **Authorization**: clients send `Authorization: Bearer <key>`. By default any key (or none)
//! is accepted; with [`ArchiveConfig::token`] (`serve --archive-token`) only that one, anything
//! else a `401 AuthRequired` (compared in constant time over SHA-256 digests). The byte quota
//! ([`ArchiveConfig::quota`], `--archive-quota-bytes` per `--archive-quota-window`, default
//! window 1 h) charges what `getSegment` and `getBlock` send to a client, named by its bearer
//! key, or by its IP without one: a client that has used its quota in the current window gets
//! `429 RateLimitExceeded` with `Retry-After` (seconds to the window's end). A response is
//! admitted while the client is under its quota, so it can go over by at most one response:
//! refusing a response larger than the whole quota would refuse it forever. At most [`MAX_QUOTA_CLIENTS`] clients are tracked per window; past that, new clients
//! share one bucket, and each such charge is counted.

use std::collections::HashMap;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{RawQuery, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use riptide_segment::plan::{self, PlanRequest};
use riptide_segment::{parse_segment_name, segment_name, Header, SegmentMeta, HEADER_BYTES};

use crate::server::App;
use crate::v2::XrpcError;

/// `planSnapshot`'s path.
pub const PLAN_SNAPSHOT: &str = "/xrpc/network.bsky.jetstream.planSnapshot";
/// `listSegments`'s path.
pub const LIST_SEGMENTS: &str = "/xrpc/network.bsky.jetstream.listSegments";
/// `getSegment`'s path.
pub const GET_SEGMENT: &str = "/xrpc/network.bsky.jetstream.getSegment";
/// `getBlock`'s path.
pub const GET_BLOCK: &str = "/xrpc/network.bsky.jetstream.getBlock";

/// Bytes read from a segment file at a time when streaming it.
pub const CHUNK: usize = 1 << 20;
/// Chunks read ahead of the socket per download.
pub const CHUNKS_IN_FLIGHT: usize = 4;
/// Clients tracked per quota window (module docs).
pub const MAX_QUOTA_CLIENTS: usize = 65_536;
/// The default quota window.
pub const DEFAULT_QUOTA_WINDOW: Duration = Duration::from_secs(3600);
/// Largest `planSnapshot` body (axum's default is 2 MB): 10,000 DIDs of up to ~400 bytes, and
/// the rest; a larger body is a `413`.
pub const MAX_PLAN_BODY: usize = 4 << 20;

/// A segment file that cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    /// Reading the file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The file is not a valid sealed segment.
    #[error("{path}: {source}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        source: riptide_segment::Error,
    },
    /// The file's name is not `seg_XXXXXXXXXX.jss`.
    #[error("{0}: not a segment file name (seg_ + 10 base-36 digits + .jss)")]
    Name(PathBuf),
}

/// One sealed, verified segment file.
#[derive(Debug)]
pub struct SealedSegment {
    /// The index its name encodes.
    pub index: u64,
    /// `seg_XXXXXXXXXX.jss`.
    pub name: String,
    /// Where it is.
    pub path: PathBuf,
    /// Its length in bytes.
    pub len: u64,
    /// Its header's checksum (the `ETag`).
    pub checksum: u64,
    /// Header and footer.
    pub meta: SegmentMeta,
}

impl SealedSegment {
    /// Reads and verifies a file's header and footer (not its blocks).
    pub fn open(path: &Path) -> Result<SealedSegment, ArchiveError> {
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| ArchiveError::Name(path.to_owned()))?;
        let index = parse_segment_name(name).ok_or_else(|| ArchiveError::Name(path.to_owned()))?;
        let io = |source| ArchiveError::Io {
            path: path.to_owned(),
            source,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        let meta = riptide_store::read_segment_meta(&file, path).map_err(|e| match e {
            riptide_store::StoreError::Segment { source, .. } => ArchiveError::Format {
                path: path.to_owned(),
                source,
            },
            riptide_store::StoreError::SegmentIo { source, .. } => io(source),
            other => io(std::io::Error::other(other)),
        })?;
        Ok(SealedSegment {
            index,
            name: name.to_owned(),
            path: path.to_owned(),
            len: meta.file_len(),
            checksum: meta.header().checksum,
            meta,
        })
    }
}

/// A file's header, parsed (`None`: unreadable or not a header).
fn read_header(file: &std::fs::File) -> Option<([u8; HEADER_BYTES], Header)> {
    let mut head = [0u8; HEADER_BYTES];
    let n = read_full_at(file, &mut head, 0).ok()?;
    let header = Header::parse(&head[..n]).ok()?;
    Some((head, header))
}

/// Reads into `buf` from `at` until it is full or the file ends; the bytes read.
fn read_full_at(file: &std::fs::File, buf: &mut [u8], at: u64) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read_at(&mut buf[n..], at + n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// The current sealed segments, ascending by index.
pub type Snapshot = Arc<Vec<Arc<SealedSegment>>>;

/// The archive's view of what is sealed (module docs): a snapshot replaced whole.
#[derive(Debug, Default)]
pub struct SealedSegments {
    dir: Option<PathBuf>,
    current: RwLock<Snapshot>,
    /// Files refused at scan or add (bad name, unreadable, failed verification).
    pub rejected: AtomicU64,
}

impl SealedSegments {
    /// No segments, no directory (an archive with nothing sealed).
    pub fn empty() -> SealedSegments {
        SealedSegments::default()
    }

    /// Scans `dir` (`DIR/segments`, created if missing) for `*.jss` files and verifies each:
    /// a file that fails is logged and counted, not served. `tmp/` is not looked at.
    pub fn scan(dir: &Path) -> std::io::Result<SealedSegments> {
        let s = SealedSegments::scan_except(dir, &[])?;
        tracing::info!(dir = %dir.display(), segments = s.snapshot().len(), rejected = s.rejected.load(Relaxed), "archive: sealed segments scanned");
        Ok(s)
    }

    /// [`SealedSegments::scan`] of the files not in `except`.
    fn scan_except(dir: &Path, except: &[PathBuf]) -> std::io::Result<SealedSegments> {
        std::fs::create_dir_all(dir)?;
        let s = SealedSegments {
            dir: Some(dir.to_owned()),
            ..SealedSegments::default()
        };
        let mut found = Vec::new();
        for e in std::fs::read_dir(dir)? {
            let path = e?.path();
            if path.extension().is_none_or(|x| x != "jss")
                || !path.is_file()
                || except.contains(&path)
            {
                continue;
            }
            match SealedSegment::open(&path) {
                Ok(seg) => found.push(Arc::new(seg)),
                Err(e) => s.reject(&e),
            }
        }
        found.sort_by_key(|s| s.index);
        *s.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(found);
        Ok(s)
    }

    /// At start: the store's sealed segments (`named`, its catalog's files, in order), then any
    /// other `*.jss` file in `dir` (copied in: `riptide corpus segments`, a Jetstream file),
    /// which the store does not read but the archive serves as a scan did. Each is verified; a
    /// file that fails, or a named one that is missing, is logged and counted, not served.
    pub fn start(dir: &Path, named: &[PathBuf]) -> std::io::Result<SealedSegments> {
        let s = SealedSegments::scan_except(dir, named)?;
        let copied = s.snapshot().len();
        for path in named {
            // `add` logs and counts a refusal.
            let _ = s.add(path);
        }
        tracing::info!(
            dir = %dir.display(),
            sealed = named.len(),
            copied_in = copied,
            rejected = s.rejected.load(Relaxed),
            "archive: the store's sealed segments and files copied in"
        );
        Ok(s)
    }

    fn reject(&self, e: &ArchiveError) {
        self.rejected.fetch_add(1, Relaxed);
        tracing::error!(error = %e, "archive: segment file refused, not served");
    }

    /// The directory scanned, if any.
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// The current segments.
    pub fn snapshot(&self) -> Snapshot {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The first seq of the oldest segment and the last of the newest (`sealedTipSeq`), if any.
    pub fn seq_range(&self) -> Option<(u64, u64)> {
        let s = self.snapshot();
        let first = s.first()?.meta.header().min_seq;
        Some((first, s.last()?.meta.header().max_seq))
    }

    /// The segment with this index.
    pub fn get(&self, index: u64) -> Option<Arc<SealedSegment>> {
        let snap = self.snapshot();
        snap.binary_search_by_key(&index, |s| s.index)
            .ok()
            .map(|i| snap[i].clone())
    }

    /// Adds a newly sealed (or rewritten) file, replacing a segment of the same index: the
    /// store calls this once the file is renamed into place. A file that fails verification is
    /// refused (logged and counted) and the previous generation, if any, stays.
    pub fn add(&self, path: &Path) -> Result<Arc<SealedSegment>, ArchiveError> {
        let seg = Arc::new(SealedSegment::open(path).inspect_err(|e| self.reject(e))?);
        self.put(seg.clone());
        Ok(seg)
    }

    fn put(&self, seg: Arc<SealedSegment>) {
        let mut cur = self.current.write().unwrap_or_else(|e| e.into_inner());
        let mut next: Vec<Arc<SealedSegment>> = cur.as_ref().clone();
        match next.binary_search_by_key(&seg.index, |s| s.index) {
            Ok(i) => next[i] = seg,
            Err(i) => next.insert(i, seg),
        }
        *cur = Arc::new(next);
    }
}

/// A byte quota per client and window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Quota {
    /// Bytes a client may download per window.
    pub bytes: u64,
    /// The window.
    pub window: Duration,
}

/// The archive's settings.
#[derive(Clone, Debug)]
pub struct ArchiveConfig {
    /// The one bearer key accepted (`--archive-token`); `None`: any.
    pub token: Option<String>,
    /// The download quota (`--archive-quota-bytes`, `--archive-quota-window`); `None`: none.
    pub quota: Option<Quota>,
    /// Entries per `planSnapshot` page ([`plan::MAX_ENTRIES`]; 0: no cap).
    pub plan_max_entries: usize,
}

impl Default for ArchiveConfig {
    fn default() -> Self {
        ArchiveConfig {
            token: None,
            quota: None,
            plan_max_entries: plan::MAX_ENTRIES,
        }
    }
}

#[derive(Debug, Default)]
struct QuotaState {
    window_start: Option<Instant>,
    used: HashMap<String, u64>,
}

/// Counters of the archive endpoints (`/metrics`).
#[derive(Debug, Default)]
pub struct ArchiveMetrics {
    /// Requests answered, per endpoint: plan, list, segment, block.
    pub requests: [AtomicU64; 4],
    /// Body bytes sent by `getSegment` and `getBlock`.
    pub bytes_out: AtomicU64,
    /// Requests refused with 401.
    pub unauthorized: AtomicU64,
    /// Requests refused with 429.
    pub over_quota: AtomicU64,
    /// Charges of clients past [`MAX_QUOTA_CLIENTS`] to the shared bucket.
    pub quota_overflow: AtomicU64,
    /// Downloads cut by a read error (logged).
    pub read_errors: AtomicU64,
}

/// The archive's state: the sealed segments and the settings.
#[derive(Debug)]
pub struct Archive {
    segments: Arc<SealedSegments>,
    config: ArchiveConfig,
    token_digest: Option<[u8; 32]>,
    quota: Mutex<QuotaState>,
    /// Counters.
    pub metrics: ArchiveMetrics,
}

impl Archive {
    /// An archive serving `segments`.
    pub fn new(segments: Arc<SealedSegments>, config: ArchiveConfig) -> Archive {
        let token_digest = config
            .token
            .as_ref()
            .map(|t| riptide_sha::sha256(t.as_bytes()));
        Archive {
            segments,
            token_digest,
            config,
            quota: Mutex::new(QuotaState::default()),
            metrics: ArchiveMetrics::default(),
        }
    }

    /// The sealed segments (the store adds to them).
    pub fn segments(&self) -> &Arc<SealedSegments> {
        &self.segments
    }

    /// The start shared by `getSegment` and `getBlock`: the request counted (`endpoint`, the
    /// index into `requests`), the bearer key checked, the query parsed, and the sealed segment
    /// its `param` names found. The client's name for the quota, the query, the segment.
    fn segment_request(
        &self,
        endpoint: usize,
        headers: &HeaderMap,
        conn: &Option<Conn>,
        query: Option<&str>,
        param: &str,
    ) -> Result<(String, Query, Arc<SealedSegment>), Refused> {
        self.metrics.requests[endpoint].fetch_add(1, Relaxed);
        let client = self.authorize(headers, peer(conn))?;
        let p = params(query)?;
        let seg = named(self, p.get(param), param)?;
        Ok((client, p, seg))
    }

    /// Checks the bearer key; the client's name for the quota.
    fn authorize(
        &self,
        headers: &HeaderMap,
        peer: Option<std::net::IpAddr>,
    ) -> Result<String, Refused> {
        let presented = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| {
                (v.len() >= 7 && v[..7].eq_ignore_ascii_case("bearer ")).then(|| v[7..].to_owned())
            });
        if let Some(want) = &self.token_digest {
            let got = riptide_sha::sha256(presented.as_deref().unwrap_or("").as_bytes());
            let diff = got.iter().zip(want).fold(0u8, |d, (a, b)| d | (a ^ b));
            if presented.is_none() || diff != 0 {
                self.metrics.unauthorized.fetch_add(1, Relaxed);
                let mut r = xrpc(401, "AuthRequired", "invalid or missing bearer token");
                r.headers_mut()
                    .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
                return Err(Box::new(r));
            }
        }
        Ok(match presented {
            Some(k) => format!("key:{k}"),
            None => peer.map_or_else(|| "anonymous".to_owned(), |ip| format!("ip:{ip}")),
        })
    }

    /// Charges `bytes` to `client`, or says when to come back.
    fn charge(&self, client: &str, bytes: u64) -> Result<(), Refused> {
        let Some(q) = self.config.quota else {
            return Ok(());
        };
        let now = Instant::now();
        let mut st = self.quota.lock().unwrap_or_else(|e| e.into_inner());
        let start = *st.window_start.get_or_insert(now);
        let elapsed = now.saturating_duration_since(start);
        let start = if elapsed >= q.window {
            st.used.clear();
            let windows = elapsed.as_nanos() / q.window.as_nanos().max(1);
            let s = start
                + q.window
                    .saturating_mul(windows.min(u128::from(u32::MAX)) as u32);
            st.window_start = Some(s);
            s
        } else {
            start
        };
        let key = if st.used.len() >= MAX_QUOTA_CLIENTS && !st.used.contains_key(client) {
            self.metrics.quota_overflow.fetch_add(1, Relaxed);
            "(overflow)"
        } else {
            client
        };
        let used = st.used.get(key).copied().unwrap_or(0);
        if used >= q.bytes {
            drop(st);
            self.metrics.over_quota.fetch_add(1, Relaxed);
            let left = (start + q.window).saturating_duration_since(now);
            let secs = left.as_secs() + u64::from(left.subsec_nanos() > 0);
            let mut r = xrpc(
                429,
                "RateLimitExceeded",
                &format!(
                    "download quota of {} bytes per {} s used ({used} bytes)",
                    q.bytes,
                    q.window.as_secs()
                ),
            );
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs.max(1)));
            return Err(Box::new(r));
        }
        *st.used.entry(key.to_owned()).or_insert(0) += bytes;
        Ok(())
    }

    /// The `/metrics` families.
    pub fn render_metrics(&self, s: &mut String) {
        use std::fmt::Write as _;
        let snap = self.segments.snapshot();
        let m = &self.metrics;
        let _ = writeln!(
            s,
            "# HELP riptide_archive_requests_total Archive requests answered, by endpoint.\n# TYPE riptide_archive_requests_total counter"
        );
        for (i, e) in ["planSnapshot", "listSegments", "getSegment", "getBlock"]
            .iter()
            .enumerate()
        {
            let _ = writeln!(
                s,
                "riptide_archive_requests_total{{endpoint=\"{e}\"}} {}",
                m.requests[i].load(Relaxed)
            );
        }
        for (name, kind, help, v) in [
            (
                "riptide_archive_segments",
                "gauge",
                "Sealed segment files served.",
                snap.len() as u64,
            ),
            (
                "riptide_archive_segment_bytes",
                "gauge",
                "Bytes of the sealed segment files served.",
                snap.iter().map(|s| s.len).sum(),
            ),
            (
                "riptide_archive_segments_rejected_total",
                "counter",
                "Segment files refused (bad name, unreadable, failed verification): logged, not served.",
                self.segments.rejected.load(Relaxed),
            ),
            (
                "riptide_archive_bytes_out_total",
                "counter",
                "Body bytes sent by getSegment and getBlock.",
                m.bytes_out.load(Relaxed),
            ),
            (
                "riptide_archive_unauthorized_total",
                "counter",
                "Archive requests refused with 401 (--archive-token).",
                m.unauthorized.load(Relaxed),
            ),
            (
                "riptide_archive_over_quota_total",
                "counter",
                "Downloads refused with 429 (--archive-quota-bytes).",
                m.over_quota.load(Relaxed),
            ),
            (
                "riptide_archive_quota_overflow_total",
                "counter",
                "Quota charges to the shared bucket: more clients in a window than are tracked.",
                m.quota_overflow.load(Relaxed),
            ),
            (
                "riptide_archive_read_errors_total",
                "counter",
                "Segment downloads cut short by a read error (logged).",
                m.read_errors.load(Relaxed),
            ),
        ] {
            crate::metrics::sample(s, name, kind, help, v);
        }
    }
}

/// The archive routes (merged into [`crate::router`]).
pub fn routes() -> Router<Arc<App>> {
    Router::new()
        .route(
            PLAN_SNAPSHOT,
            post(plan_snapshot).layer(axum::extract::DefaultBodyLimit::max(MAX_PLAN_BODY)),
        )
        .route(LIST_SEGMENTS, get(list_segments))
        .route(GET_SEGMENT, get(get_segment))
        .route(GET_BLOCK, get(get_block))
}

fn xrpc(status: u16, error: &'static str, message: &str) -> Response {
    XrpcError {
        status,
        error,
        message: message.to_owned(),
    }
    .into_response()
}

fn invalid(message: impl AsRef<str>) -> Refused {
    Box::new(xrpc(400, "InvalidRequest", message.as_ref()))
}

fn internal(message: &str) -> Refused {
    Box::new(xrpc(500, "InternalServerError", message))
}

/// A request answered with something other than what it asked for: an XRPC error, a `304`,
/// `204` or `416` (boxed: a response is large, and these are the uncommon path).
type Refused = Box<Response>;

/// The connection's peer, when served through [`crate::LimitedListener`] with connect info.
type Conn = axum::Extension<axum::extract::ConnectInfo<crate::limits::ConnInfo>>;

fn peer(conn: &Option<Conn>) -> Option<std::net::IpAddr> {
    conn.as_ref().map(|c| c.0 .0.addr.ip())
}

fn json(v: serde_json::Value) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], v.to_string()).into_response()
}

/// The query's parameters, each at most once.
/// A request's query parameters, by name.
type Query = HashMap<String, String>;

fn params(q: Option<&str>) -> Result<Query, Refused> {
    let mut out = HashMap::new();
    for (k, v) in form_urlencoded::parse(q.unwrap_or("").as_bytes()) {
        if out.insert(k.clone().into_owned(), v.into_owned()).is_some() {
            return Err(invalid(format!("parameter {k} given more than once")));
        }
    }
    Ok(out)
}

/// A JSON array of strings, absent or null as empty.
fn strings(v: Option<&serde_json::Value>, field: &str) -> Result<Vec<String>, Refused> {
    match v {
        None | Some(serde_json::Value::Null) => Ok(Vec::new()),
        Some(serde_json::Value::Array(a)) => a
            .iter()
            .map(|x| {
                x.as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| invalid(format!("{field} must be an array of strings")))
            })
            .collect(),
        Some(_) => Err(invalid(format!("{field} must be an array of strings"))),
    }
}

fn seq(v: Option<&serde_json::Value>, field: &str) -> Result<Option<u64>, Refused> {
    match v {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(x) => match x.as_i64() {
            Some(n) if n >= 0 => Ok(Some(n as u64)),
            Some(_) => Err(invalid(format!("{field} must be >= 0"))),
            None => Err(invalid(format!("{field} must be an integer"))),
        },
    }
}

async fn plan_snapshot(
    State(app): State<Arc<App>>,
    conn: Option<Conn>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let a = app.archive.clone();
    a.metrics.requests[0].fetch_add(1, Relaxed);
    if let Err(r) = a.authorize(&headers, peer(&conn)) {
        return *r;
    }
    let v: serde_json::Value = if body.iter().all(u8::is_ascii_whitespace) {
        serde_json::Value::Object(serde_json::Map::new())
    } else {
        match serde_json::from_slice(&body) {
            Ok(v @ serde_json::Value::Object(_)) => v,
            Ok(_) => return *invalid("the input must be a JSON object"),
            Err(e) => return *invalid(format!("invalid JSON: {e}")),
        }
    };
    let req = (|| {
        let kinds = strings(v.get("kinds"), "kinds")?;
        let dids = strings(v.get("dids"), "dids")?;
        let cols = strings(v.get("collections"), "collections")?;
        let after = seq(v.get("afterSeq"), "afterSeq")?;
        let before = seq(v.get("beforeSeq"), "beforeSeq")?;
        PlanRequest::new(&kinds, &dids, &cols, after, before).map_err(|e| invalid(e.0))
    })();
    let req = match req {
        Ok(r) => r,
        Err(r) => return *r,
    };
    let snap = a.segments.snapshot();
    let cap = a.config.plan_max_entries;
    let planned = tokio::task::spawn_blocking(move || {
        let p = plan::plan(snap.iter().map(|s| (s.index, &s.meta)), &req, cap);
        plan_json(&p)
    })
    .await;
    match planned {
        Ok(v) => json(v),
        Err(e) => {
            tracing::error!(error = %e, "planSnapshot task failed");
            *internal("failed to plan snapshot")
        }
    }
}

/// The lexicon's output.
fn plan_json(p: &plan::Plan) -> serde_json::Value {
    let segments: Vec<serde_json::Value> = p
        .segments
        .iter()
        .map(|s| {
            let mut o = serde_json::json!({
                "name": segment_name(s.index),
                "index": s.index,
                "checksum": format!("{:016x}", s.checksum),
                "minSeq": s.min_seq,
                "maxSeq": s.max_seq,
                "mode": s.mode.as_str(),
            });
            if s.mode == plan::Mode::Blocks {
                o["blocks"] = s
                    .blocks
                    .iter()
                    .map(|r| serde_json::json!({"first": r.first, "last": r.last}))
                    .collect();
            }
            o
        })
        .collect();
    serde_json::json!({
        "plannedThroughSeq": p.planned_through_seq,
        "sealedTipSeq": p.sealed_tip_seq,
        "segments": segments,
        "stats": {
            "segmentsExamined": p.stats.segments_examined,
            "segmentsMatched": p.stats.segments_matched,
            "blocksMatched": p.stats.blocks_matched,
            "entries": p.stats.entries,
        },
    })
}

async fn list_segments(
    State(app): State<Arc<App>>,
    conn: Option<Conn>,
    headers: HeaderMap,
    RawQuery(q): RawQuery,
) -> Response {
    let a = &app.archive;
    a.metrics.requests[1].fetch_add(1, Relaxed);
    if let Err(r) = a.authorize(&headers, peer(&conn)) {
        return *r;
    }
    let p = match params(q.as_deref()) {
        Ok(p) => p,
        Err(r) => return *r,
    };
    let limit = match p.get("limit").map(|l| l.parse::<i64>()) {
        None => 100,
        Some(Ok(n)) if n >= 1 => n.min(1000) as usize,
        Some(Ok(_)) => return *invalid("limit must be positive"),
        Some(Err(_)) => return *invalid("limit must be an integer"),
    };
    let start = match p
        .get("cursor")
        .filter(|c| !c.is_empty())
        .map(|c| c.parse::<u64>())
    {
        None => 0,
        Some(Ok(n)) => n,
        Some(Err(_)) => return *invalid("invalid cursor"),
    };
    let snap = a.segments.snapshot();
    let from = snap.partition_point(|s| s.index < start);
    let page = &snap[from..snap.len().min(from + limit)];
    let segments: Vec<serde_json::Value> = page
        .iter()
        .map(|s| {
            let h = s.meta.header();
            serde_json::json!({
                "name": s.name,
                "index": s.index,
                "sizeBytes": s.len,
                "checksum": format!("{:016x}", s.checksum),
                "eventCount": h.event_count,
                "minSeq": h.min_seq,
                "maxSeq": h.max_seq,
                "minWitnessedAt": h.min_witnessed_at,
                "maxWitnessedAt": h.max_witnessed_at,
            })
        })
        .collect();
    let mut out = serde_json::json!({ "segments": segments });
    if let Some(next) = snap.get(from + limit) {
        out["cursor"] = next.index.to_string().into();
    }
    json(out)
}

/// The segment a request names, or its error.
fn named(a: &Archive, name: Option<&String>, param: &str) -> Result<Arc<SealedSegment>, Refused> {
    let name = name.ok_or_else(|| invalid(format!("missing required parameter {param}")))?;
    let index = parse_segment_name(name).ok_or_else(|| invalid("malformed segment name"))?;
    a.segments
        .get(index)
        .ok_or_else(|| Box::new(xrpc(404, "SegmentNotFound", "segment not found")))
}

/// A segment file opened for a response, with the checksum of the file actually open.
struct Opened {
    file: std::fs::File,
    len: u64,
    checksum: u64,
}

/// Opens a segment's file and reads its header (blocking). A file whose header no longer
/// matches what is in memory was rewritten: its metadata is read again from this very file.
fn open_current(
    a: &Archive,
    seg: Arc<SealedSegment>,
) -> Result<(Opened, Arc<SealedSegment>), Refused> {
    let file = std::fs::File::open(&seg.path).map_err(|e| {
        tracing::error!(path = %seg.path.display(), error = %e, "archive: open failed");
        internal("failed to open segment")
    })?;
    let header = read_header(&file).ok_or_else(|| {
        tracing::error!(path = %seg.path.display(), "archive: header unreadable");
        internal("failed to read segment header")
    })?;
    let seg = if header.1.checksum == seg.checksum {
        seg
    } else {
        match a.segments.add(&seg.path) {
            Ok(s) => s,
            Err(_) => return Err(internal("segment file changed and failed verification")),
        }
    };
    let len = file
        .metadata()
        .map_err(|_| internal("failed to stat segment"))?
        .len();
    Ok((
        Opened {
            file,
            len,
            checksum: header.1.checksum,
        },
        seg,
    ))
}

/// What a `Range` header asks for, given the representation's length.
#[derive(Debug, PartialEq, Eq)]
enum Ranged {
    /// The whole representation.
    Whole,
    /// Bytes `start..end`.
    Part(u64, u64),
    /// A range starting exactly at the end of a non-empty representation (`204`, module docs).
    AtEnd,
    /// Nothing of it can be served (416).
    Unsatisfiable,
}

/// One `bytes=` range (RFC 9110 §14.1.2); a malformed header or a list is ignored (whole).
fn parse_range(v: &str, len: u64) -> Ranged {
    let Some(spec) = v.trim().strip_prefix("bytes=") else {
        return Ranged::Whole;
    };
    if spec.contains(',') {
        return Ranged::Whole;
    }
    let Some((a, b)) = spec.trim().split_once('-') else {
        return Ranged::Whole;
    };
    let (a, b) = (a.trim(), b.trim());
    let num = |s: &str| {
        (!s.is_empty() && s.bytes().all(|c| c.is_ascii_digit()))
            .then(|| s.parse::<u64>().ok())
            .flatten()
    };
    if a.is_empty() {
        // Suffix: the last b bytes.
        return match num(b) {
            Some(0) => Ranged::Unsatisfiable,
            Some(_) if len == 0 => Ranged::Unsatisfiable,
            Some(n) => Ranged::Part(len.saturating_sub(n), len),
            None => Ranged::Whole,
        };
    }
    let Some(start) = num(a) else {
        return Ranged::Whole;
    };
    let end = if b.is_empty() {
        len
    } else {
        match num(b) {
            Some(e) if e >= start => e.saturating_add(1).min(len),
            _ => return Ranged::Whole,
        }
    };
    if start == len && len > 0 {
        Ranged::AtEnd
    } else if start >= len {
        Ranged::Unsatisfiable
    } else {
        Ranged::Part(start, end)
    }
}

/// Whether an `If-None-Match` or `If-Range` list names `etag` (weak comparison for the former
/// is the same here: our tags are strong).
fn names_etag(v: &HeaderValue, etag: &str) -> bool {
    v.to_str()
        .is_ok_and(|s| s.split(',').any(|t| t.trim() == "*" || t.trim() == etag))
}

/// Headers, status and the byte range to send, from the request's conditionals.
fn conditional(
    headers: &HeaderMap,
    etag: &str,
    len: u64,
) -> Result<(StatusCode, u64, u64), Refused> {
    if headers
        .get(header::IF_NONE_MATCH)
        .is_some_and(|v| names_etag(v, etag))
    {
        let mut r = StatusCode::NOT_MODIFIED.into_response();
        if let Ok(v) = HeaderValue::from_str(etag) {
            r.headers_mut().insert(header::ETAG, v);
        }
        return Err(Box::new(r));
    }
    let range = headers.get(header::RANGE).and_then(|v| v.to_str().ok());
    // If-Range: the range applies only to the generation the client names (strong match, so
    // no "*"); otherwise the whole file.
    let if_range_ok = headers
        .get(header::IF_RANGE)
        .is_none_or(|v| v.to_str().is_ok_and(|s| s.trim() == etag));
    match range.filter(|_| if_range_ok).map(|r| parse_range(r, len)) {
        None | Some(Ranged::Whole) => Ok((StatusCode::OK, 0, len)),
        Some(Ranged::Part(a, b)) => Ok((StatusCode::PARTIAL_CONTENT, a, b)),
        Some(Ranged::AtEnd) => {
            let mut r = StatusCode::NO_CONTENT.into_response();
            let h = r.headers_mut();
            h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
            if let Ok(v) = HeaderValue::from_str(&format!("bytes */{len}")) {
                h.insert(header::CONTENT_RANGE, v);
            }
            if let Ok(v) = HeaderValue::from_str(etag) {
                h.insert(header::ETAG, v);
            }
            Err(Box::new(r))
        }
        Some(Ranged::Unsatisfiable) => {
            let mut r = (
                StatusCode::RANGE_NOT_SATISFIABLE,
                [(header::CONTENT_TYPE, "application/json")],
                XrpcError {
                    status: 416,
                    error: "InvalidRequest",
                    message: format!("range not satisfiable: the representation is {len} bytes"),
                }
                .body(),
            )
                .into_response();
            if let Ok(v) = HeaderValue::from_str(&format!("bytes */{len}")) {
                r.headers_mut().insert(header::CONTENT_RANGE, v);
            }
            if let Ok(v) = HeaderValue::from_str(etag) {
                r.headers_mut().insert(header::ETAG, v);
            }
            Err(Box::new(r))
        }
    }
}

/// The response head shared by both downloads.
fn download_head(
    status: StatusCode,
    etag: &str,
    start: u64,
    end: u64,
    len: u64,
) -> axum::http::response::Builder {
    let mut b = Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/octet-stream")
        .header(header::ACCEPT_RANGES, "bytes")
        .header(header::CACHE_CONTROL, "public, no-cache")
        .header(header::ETAG, etag)
        .header(header::CONTENT_LENGTH, end - start);
    if status == StatusCode::PARTIAL_CONTENT {
        b = b.header(
            header::CONTENT_RANGE,
            format!("bytes {start}-{}/{len}", end.saturating_sub(1)),
        );
    }
    b
}

async fn get_segment(
    State(app): State<Arc<App>>,
    conn: Option<Conn>,
    method: Method,
    headers: HeaderMap,
    RawQuery(q): RawQuery,
) -> Response {
    let a = app.archive.clone();
    let (client, _, seg) = match a.segment_request(2, &headers, &conn, q.as_deref(), "name") {
        Ok(x) => x,
        Err(r) => return *r,
    };
    let a2 = a.clone();
    let opened = tokio::task::spawn_blocking(move || open_current(&a2, seg)).await;
    let (f, _seg) = match opened {
        Ok(Ok(x)) => x,
        Ok(Err(r)) => return *r,
        Err(_) => return *internal("failed to open segment"),
    };
    let etag = format!("\"{:016x}\"", f.checksum);
    let (status, start, end) = match conditional(&headers, &etag, f.len) {
        Ok(x) => x,
        Err(r) => return *r,
    };
    let head = download_head(status, &etag, start, end, f.len);
    if method == Method::HEAD {
        return head
            .body(Body::empty())
            .unwrap_or_else(|_| *internal("response"));
    }
    if let Err(r) = a.charge(&client, end - start) {
        return *r;
    }
    a.metrics.bytes_out.fetch_add(end - start, Relaxed);
    head.body(stream_file(a, f.file, start, end))
        .unwrap_or_else(|_| *internal("response"))
}

/// `file[start..end]` as a body, read [`CHUNK`] bytes at a time on the blocking pool, at most
/// [`CHUNKS_IN_FLIGHT`] ahead of the socket; a client gone stops the reads.
fn stream_file(a: Arc<Archive>, file: std::fs::File, start: u64, end: u64) -> Body {
    let (tx, rx) = tokio::sync::mpsc::channel::<std::io::Result<Bytes>>(CHUNKS_IN_FLIGHT);
    tokio::task::spawn_blocking(move || {
        let fail = |e: std::io::Error| {
            a.metrics.read_errors.fetch_add(1, Relaxed);
            crate::said::say(
                "archive read failed",
                "riptide_archive_read_errors_total",
                || {
                    tracing::error!(error = %e, "archive: segment read failed mid-download");
                },
            );
            let _ = tx.blocking_send(Err(e));
        };
        // Sequential reads into fresh capacity (`read_to_end` does not zero it first).
        let mut f = &file;
        if let Err(e) = std::io::Seek::seek(&mut f, std::io::SeekFrom::Start(start)) {
            return fail(e);
        }
        let mut at = start;
        while at < end {
            let n = CHUNK.min((end - at) as usize);
            let mut buf = Vec::with_capacity(n);
            match f.take(n as u64).read_to_end(&mut buf) {
                Ok(k) if k == n => {}
                Ok(k) => {
                    return fail(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        format!("file ended {k} bytes into a {n}-byte read at {at}"),
                    ))
                }
                Err(e) => return fail(e),
            }
            if tx.blocking_send(Ok(Bytes::from(buf))).is_err() {
                return; // the client is gone
            }
            at += n as u64;
        }
    });
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    Body::from_stream(stream)
}

async fn get_block(
    State(app): State<Arc<App>>,
    conn: Option<Conn>,
    method: Method,
    headers: HeaderMap,
    RawQuery(q): RawQuery,
) -> Response {
    let a = app.archive.clone();
    let (client, p, seg) = match a.segment_request(3, &headers, &conn, q.as_deref(), "segment") {
        Ok(x) => x,
        Err(r) => return *r,
    };
    let block = match p.get("blockIndex").map(|b| b.parse::<i64>()) {
        None => return *invalid("missing required parameter blockIndex"),
        Some(Ok(n)) if n >= 0 => n as u64,
        Some(Ok(_)) => return *invalid("blockIndex must be >= 0"),
        Some(Err(_)) => return *invalid("blockIndex must be an integer"),
    };
    let a2 = a.clone();
    let read = tokio::task::spawn_blocking(move || -> Result<(u64, Bytes), Refused> {
        let (f, seg) = open_current(&a2, seg)?;
        let count = seg.meta.blocks().len() as u64;
        let Some(info) = usize::try_from(block)
            .ok()
            .and_then(|i| seg.meta.blocks().get(i))
        else {
            return Err(Box::new(xrpc(
                404,
                "BlockNotFound",
                &format!("block index {block} out of range: the segment has {count} blocks"),
            )));
        };
        let size = info.compressed_size as usize;
        let mut buf = vec![0u8; 8 + size];
        let n = read_full_at(&f.file, &mut buf, info.offset).map_err(|e| {
            a2.metrics.read_errors.fetch_add(1, Relaxed);
            crate::said::say("archive read failed", "riptide_archive_read_errors_total", || {
                tracing::error!(path = %seg.path.display(), error = %e, "archive: block read failed");
            });
            internal("failed to read block")
        })?;
        let prefix = u64::from_le_bytes([buf[0], buf[1], buf[2], buf[3], buf[4], buf[5], buf[6], buf[7]]);
        if n != buf.len() || prefix != size as u64 {
            a2.metrics.read_errors.fetch_add(1, Relaxed);
            crate::said::say("archive block mismatch", "riptide_archive_read_errors_total", || {
                tracing::error!(path = %seg.path.display(), block, "archive: block's length prefix disagrees with the index");
            });
            return Err(internal("block does not match the segment's index"));
        }
        Ok((f.checksum, Bytes::from(buf).slice(8..)))
    })
    .await;
    let (checksum, frame) = match read {
        Ok(Ok(x)) => x,
        Ok(Err(r)) => return *r,
        Err(_) => return *internal("failed to read block"),
    };
    let etag = format!("\"{checksum:016x}:{block}\"");
    let len = frame.len() as u64;
    let (status, start, end) = match conditional(&headers, &etag, len) {
        Ok(x) => x,
        Err(r) => return *r,
    };
    let head = download_head(status, &etag, start, end, len);
    if method == Method::HEAD {
        return head
            .body(Body::empty())
            .unwrap_or_else(|_| *internal("response"));
    }
    if let Err(r) = a.charge(&client, end - start) {
        return *r;
    }
    a.metrics.bytes_out.fetch_add(end - start, Relaxed);
    head.body(Body::from(frame.slice(start as usize..end as usize)))
        .unwrap_or_else(|_| *internal("response"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_footer_offset_past_the_header_counts_bound_is_refused_before_reading() {
        use riptide_segment::{write_segment, Kind, Row};
        // 4 MiB that zstd cannot shrink (a xorshift stream), so the file is long.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let payload: Vec<u8> = (0..1 << 20)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let rows: Vec<Row<'_>> = (1..=4u64)
            .map(|seq| Row {
                seq,
                witnessed_at: seq as i64,
                indexed_at: 0,
                kind: Kind::Create,
                did: "did:plc:a",
                collection: "a.b.c",
                rkey: "k",
                rev: "r",
                payload: &payload,
            })
            .collect();
        let blocks: Vec<&[Row<'_>]> = rows.chunks(1).collect();
        let mut file = write_segment(&blocks).unwrap();
        assert!(file.len() > 4 << 20);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("seg_0000000001.jss");
        std::fs::write(&path, &file).unwrap();
        assert!(SealedSegment::open(&path).is_ok());
        // The footer offset moved to the first block: the "footer" would be the whole file.
        file[58..66].copy_from_slice(&256u64.to_le_bytes());
        std::fs::write(&path, &file).unwrap();
        match SealedSegment::open(&path) {
            Err(ArchiveError::Format {
                source: riptide_segment::Error::Footer(m),
                ..
            }) => assert!(m.contains("allow at most"), "{m}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn ranges_as_rfc_9110_reads_them() {
        use Ranged::*;
        let r = |s| parse_range(s, 100);
        assert_eq!(r("bytes=0-9"), Part(0, 10));
        assert_eq!(r("bytes=90-"), Part(90, 100));
        assert_eq!(r("bytes=90-1000"), Part(90, 100));
        assert_eq!(r("bytes=-10"), Part(90, 100));
        assert_eq!(r("bytes=-1000"), Part(0, 100));
        assert_eq!(r("bytes=99-99"), Part(99, 100));
        assert_eq!(r("bytes=100-"), AtEnd);
        assert_eq!(r("bytes=100-199"), AtEnd);
        assert_eq!(r("bytes=101-"), Unsatisfiable);
        assert_eq!(r("bytes=-0"), Unsatisfiable);
        assert_eq!(r("bytes=5-4"), Whole);
        assert_eq!(r("bytes=0-1,5-6"), Whole);
        assert_eq!(r("items=0-1"), Whole);
        assert_eq!(r("bytes=a-1"), Whole);
        assert_eq!(r("bytes=+1-2"), Whole);
        assert_eq!(parse_range("bytes=0-", 0), Unsatisfiable);
    }

    #[test]
    fn the_quota_refuses_past_the_limit_and_says_when() {
        let a = Archive::new(
            Arc::new(SealedSegments::empty()),
            ArchiveConfig {
                quota: Some(Quota {
                    bytes: 100,
                    window: Duration::from_secs(60),
                }),
                ..ArchiveConfig::default()
            },
        );
        assert!(a.charge("k", 60).is_ok());
        // Under the quota: admitted, even past it; then refused.
        assert!(a.charge("k", 50).is_ok());
        let r = a.charge("k", 1).unwrap_err();
        assert_eq!(r.status(), 429);
        let after: u64 = r.headers()[header::RETRY_AFTER]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!((1..=60).contains(&after), "{after}");
        // Another client has its own budget; one response larger than all of it is served once.
        assert!(a.charge("j", 1000).is_ok());
        assert!(a.charge("j", 1).is_err());
        assert_eq!(a.metrics.over_quota.load(Relaxed), 2);
    }

    #[test]
    fn bearer_keys() {
        let open = Archive::new(Arc::new(SealedSegments::empty()), ArchiveConfig::default());
        let mut h = HeaderMap::new();
        assert_eq!(open.authorize(&h, None).unwrap(), "anonymous");
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer abc"),
        );
        assert_eq!(open.authorize(&h, None).unwrap(), "key:abc");
        let shut = Archive::new(
            Arc::new(SealedSegments::empty()),
            ArchiveConfig {
                token: Some("s3cret".into()),
                ..ArchiveConfig::default()
            },
        );
        assert_eq!(shut.authorize(&h, None).unwrap_err().status(), 401);
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("bearer s3cret"),
        );
        assert!(shut.authorize(&h, None).is_ok());
        h.remove(header::AUTHORIZATION);
        assert_eq!(shut.authorize(&h, None).unwrap_err().status(), 401);
        assert_eq!(shut.metrics.unauthorized.load(Relaxed), 2);
    }
}
