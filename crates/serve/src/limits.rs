//! Connection limits: no client, however many or however slow, can exhaust the server's file
//! descriptors or make anything inside fail.
//!
//! Why: every connection costs a descriptor, and the store needs descriptors of its own (journal
//! and segment files; fjall cannot create its next journal without one, and a store that fails a
//! write is poisoned). Left unbounded, 1,000 half-sent requests (slowloris) or a few hundred
//! subscribers under a low `ulimit -n` took the process down. So, before HTTP sees a connection:
//!
//! - **A budget**: at most [`ConnLimits::max_connections`] connections at once, never more than
//!   the descriptor limit minus [`RESERVED_FDS`] (kept for the store, whose open-file cache is
//!   capped at [`riptide_store::store::STORE_MAX_OPEN_FILES`], and for the process's own files);
//! - **a per-IP limit** ([`ConnLimits::per_ip`]), so one host cannot take the whole budget (an
//!   IPv6 client counts per /64, the block one host is usually given: [`ip_key`]);
//! - **a reserve for probes** ([`PROBE_RESERVE`]): connections beyond the budget are still
//!   accepted, up to the reserve (whatever the per-IP count of their address), and may ask
//!   only for `/healthz`, `/readyz`, `/metrics` and the status page `/`
//!   ([`PROBE_PATHS`]; anything else is answered `503` by [`guard`]). Without it 10,000 idle
//!   subscribers (1,000 from each of ten addresses, inside the per-IP limit) made the probes
//!   answer 503, and a liveness probe would have restarted a healthy server. The reserve is not
//!   a defence against a client that sets out to hold it (it gets the header deadline like any
//!   connection); for that, serve the probes on a listener of their own, on an address only the
//!   monitoring can reach ([`LimitedListener::probes`], `riptide serve --metrics-listen`), as
//!   Jetstream's debug listener does;
//! - **a header deadline** ([`ConnLimits::header_timeout`]): a connection whose first request
//!   headers are not complete in time is closed — slowloris, and idle connections that never
//!   send a request (or never finish a WebSocket handshake), cost a descriptor for that long only.
//!   The same deadline holds between requests on a keep-alive connection: each write of a plain
//!   HTTP response starts it again, so the next request's headers must be complete within
//!   `header_timeout` of the server's last write (an idle keep-alive connection is closed after
//!   that long). A connection the server upgraded (its `101 Switching Protocols`: a WebSocket
//!   subscriber, which may rightly send nothing for hours) has no deadline from then on.
//!
//! **Long queries.** A subscriber may name 10,000 DIDs (`dids` of `subscribeEvents`,
//! `wantedDids` of `/subscribe`; protocol §1.2): about 400 KB of query string. hyper cannot take
//! a request target that long: the `http` crate's `Uri` holds at most 65,534 bytes, and hyper
//! answers `414` above it (from about 1,700 DIDs), whatever its buffer sizes. So the first
//! request line of a connection, when it is a `GET` of one of those two paths with a query
//! ([`LONG_QUERY_PATHS`]), is read here, up to [`MAX_REQUEST_LINE`]; a target longer than
//! [`LONG_TARGET`] reaches hyper without its query, which goes beside it ([`LongQuery`], put in
//! the request by [`guard`] and read by the handlers). Only the first request of a connection:
//! a WebSocket client opens a connection for its subscription, and where the next request on a
//! keep-alive connection starts is hyper's to know. A longer line goes to hyper as it came (and
//! is refused there); lines being read here hold at most [`LONG_LINES_BUDGET`] bytes in all.
//!
//! Over a limit, the connection is answered `503` with `connection: close` (written without
//! waiting: a client that does not read gets a plain close) and closed at once, and counted in
//! `riptide_connections_refused_total{reason}`. Accept errors (`EMFILE` if the budget was still
//! too generous) are logged once a second at most and retried after a pause, never fatal.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

use crate::metrics::Metrics;

/// Descriptors kept out of the connection budget: the store's open-file cache
/// ([`riptide_store::store::STORE_MAX_OPEN_FILES`]) plus journals, the listener, the runtime's own
/// (epoll, eventfd, pipes), the upstream connection, DID lookups and the binary's files.
pub const RESERVED_FDS: u64 = riptide_store::store::STORE_MAX_OPEN_FILES as u64 + 128;

/// Connections the main listener accepts beyond the budget, for probes only (module docs); also
/// the budget of a probes listener ([`LimitedListener::probes`]).
pub const PROBE_RESERVE: usize = 8;

/// Descriptors kept for probe connections: the main listener's reserve and a probes listener's
/// budget.
const PROBE_FDS: u64 = 2 * PROBE_RESERVE as u64;

/// What a probe-only connection may ask for: the probes, and the status page (`page.rs`), which
/// an operator opens in a browser where the probes are (`--metrics-listen`) and which costs a
/// `/metrics`.
pub const PROBE_PATHS: [&str; 4] = ["/healthz", "/readyz", "/metrics", "/"];

/// The key an address is counted under for the per-IP limit: an IPv4 address (also when it comes
/// as an IPv4-mapped IPv6 address, as on a dual-stack listener) as is; an IPv6 address by its
/// /64, since one host is usually given a whole /64 and could otherwise open the budget's worth
/// from addresses of its own.
pub fn ip_key(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & !(u64::MAX as u128))),
        v4 => v4,
    }
}

/// The limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnLimits {
    /// Most connections at once (further capped by the descriptor limit, see [`effective`]).
    ///
    /// [`effective`]: ConnLimits::effective
    pub max_connections: usize,
    /// Most connections at once from one IP address.
    pub per_ip: usize,
    /// Time from accept to the end of the first request's headers.
    pub header_timeout: Duration,
}

impl Default for ConnLimits {
    /// 10,000 connections, 1,000 per IP, 10 s for the request headers.
    fn default() -> Self {
        ConnLimits {
            max_connections: 10_000,
            per_ip: 1_000,
            header_timeout: Duration::from_secs(10),
        }
    }
}

/// What [`raise_fd_limit`] did: the soft limit before and after, and the hard limit (`None`:
/// unlimited).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FdRaise {
    /// The soft limit the process started with.
    pub before: Option<u64>,
    /// The soft limit now.
    pub after: Option<u64>,
    /// The hard limit, which an unprivileged process may raise its soft limit to.
    pub hard: Option<u64>,
}

/// Raises the soft open-file limit to the hard one, as far as the kernel allows, before the
/// connection budget is worked out: a systemd service or a shell starts with a soft limit of
/// 1,024 and a hard one far higher, and the default budget of 10,000 connections was silently
/// cut to 624 (issue 39). An error when the limit cannot be set (the soft limit stays as it
/// was).
pub fn raise_fd_limit() -> std::io::Result<FdRaise> {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let now = getrlimit(Resource::Nofile);
    let mut raise = FdRaise {
        before: now.current,
        after: now.current,
        hard: now.maximum,
    };
    if now.current == now.maximum {
        return Ok(raise);
    }
    let mut want = now;
    want.current = now.maximum;
    if setrlimit(Resource::Nofile, want).is_err() {
        // Linux caps the soft limit at `fs.nr_open` even when the hard limit is unlimited.
        want.current = std::fs::read_to_string("/proc/sys/fs/nr_open")
            .ok()
            .and_then(|s| s.trim().parse().ok());
        setrlimit(Resource::Nofile, want)?;
    }
    raise.after = getrlimit(Resource::Nofile).current;
    Ok(raise)
}

/// The process's soft limit on open descriptors (`None` where it cannot be read).
pub fn fd_limit() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = s.lines().find(|l| l.starts_with("Max open files"))?;
    let soft = line.split_whitespace().nth(3)?;
    if soft == "unlimited" {
        return Some(u64::MAX);
    }
    soft.parse().ok()
}

/// Why the limits cannot be met.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LimitError {
    /// The descriptor limit leaves no room for connections after the store's reserve.
    #[error("the open-file limit ({limit}) leaves no room for connections: the store, the process and the probes keep {}; raise it (ulimit -n, or LimitNOFILE= in systemd) to at least {}", RESERVED_FDS + PROBE_FDS, RESERVED_FDS + PROBE_FDS + 64)]
    TooFewDescriptors {
        /// The soft limit.
        limit: u64,
    },
}

impl ConnLimits {
    /// The connection budget under the process's descriptor limit: `max_connections`, lowered
    /// to the limit minus [`RESERVED_FDS`] and the probes' descriptors (twice
    /// [`PROBE_RESERVE`]). An error when fewer than 16 connections would fit.
    pub fn effective(&self) -> Result<ConnLimits, LimitError> {
        self.effective_under(fd_limit())
    }

    fn effective_under(&self, limit: Option<u64>) -> Result<ConnLimits, LimitError> {
        let mut l = *self;
        if let Some(limit) = limit {
            let room = limit.saturating_sub(RESERVED_FDS + PROBE_FDS);
            if room < 16 {
                return Err(LimitError::TooFewDescriptors { limit });
            }
            l.max_connections = l.max_connections.min(room as usize);
        }
        l.max_connections = l.max_connections.max(1);
        l.per_ip = l.per_ip.clamp(1, l.max_connections);
        Ok(l)
    }
}

#[derive(Debug, Default)]
struct Counts {
    total: usize,
    per_ip: HashMap<IpAddr, usize>,
}

/// The paths whose first request line [`Limited`] reads itself (module docs, "Long queries"),
/// each as the start of a request line with a query.
pub const LONG_QUERY_PATHS: [&[u8]; 2] = [
    b"GET /xrpc/network.bsky.jetstream.subscribeEvents?",
    b"GET /subscribe?",
];

/// Request targets longer than this are given to hyper without their query ([`LongQuery`]).
pub const LONG_TARGET: usize = 16 << 10;

/// The longest first request line read for a long query: 10,000 DIDs of up to 90 bytes each,
/// `dids=` repeated, with room to spare.
pub const MAX_REQUEST_LINE: usize = 1 << 20;

/// Bytes of first request lines being read at once, all connections together; past it a line
/// goes to hyper as it came (and is refused there), so that slow clients sending long lines
/// cannot make the server hold `MAX_REQUEST_LINE` for each of its connections.
pub const LONG_LINES_BUDGET: usize = 64 << 20;

/// Bytes of first request lines held now (see [`LONG_LINES_BUDGET`]).
static LONG_LINE_BYTES: AtomicUsize = AtomicUsize::new(0);

/// A query taken out of a connection's first request line because it is too long for a URI
/// (module docs, "Long queries"): the handler's query string, in place of the request's (which
/// has none).
#[derive(Clone, Debug)]
pub struct LongQuery(pub String);

/// What a connection may ask for, decided when it is accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Everything: a connection inside the budget.
    Full,
    /// Only [`PROBE_PATHS`]: a connection in the main listener's reserve, beyond the budget
    /// (anything else is answered 503, counted as refused for `max-connections`).
    Reserve,
    /// Only [`PROBE_PATHS`]: a connection to a probes listener (anything else is a 404).
    Probes,
}

/// A listener that applies [`ConnLimits`] (an `axum::serve::Listener`).
///
/// Serve it with [`crate::router`] made into a service with [`ConnInfo`]
/// (`into_make_service_with_connect_info::<ConnInfo>()`): that is how [`guard`] learns which
/// connections may ask only for the probes. Without it the reserve would be open to everything.
#[derive(Debug)]
pub struct LimitedListener {
    inner: TcpListener,
    limits: ConnLimits,
    /// [`PROBE_RESERVE`] on the main listener; 0 on a probes listener.
    reserve: usize,
    /// Every connection's access on a probes listener.
    probes: bool,
    counts: Arc<Mutex<Counts>>,
    metrics: Arc<Metrics>,
    last_error_log: Option<Instant>,
}

impl LimitedListener {
    /// Wraps `inner`; `limits` as given (see [`ConnLimits::effective`]), with the probes'
    /// reserve beyond them ([`PROBE_RESERVE`]).
    pub fn new(inner: TcpListener, limits: ConnLimits, metrics: Arc<Metrics>) -> LimitedListener {
        LimitedListener {
            inner,
            limits,
            reserve: PROBE_RESERVE,
            probes: false,
            counts: Arc::default(),
            metrics,
            last_error_log: None,
        }
    }

    /// A listener for the probes only (`/healthz`, `/readyz`, `/metrics`, the status page; `riptide serve
    /// --metrics-listen`), outside the subscriber budget: at most [`PROBE_RESERVE`] connections,
    /// with `header_timeout`. Its connections are not in `riptide_connections` (the main
    /// listener's gauge); its refusals are counted with the main listener's.
    pub fn probes(
        inner: TcpListener,
        header_timeout: Duration,
        metrics: Arc<Metrics>,
    ) -> LimitedListener {
        let limits = ConnLimits {
            max_connections: PROBE_RESERVE,
            per_ip: PROBE_RESERVE,
            header_timeout,
        };
        LimitedListener {
            reserve: 0,
            probes: true,
            ..LimitedListener::new(inner, limits, metrics)
        }
    }

    /// Takes a slot for `ip`, or says which limit refuses it (0: total, 1: per IP).
    fn admit(&self, ip: IpAddr) -> Result<(Slot, Access), usize> {
        let key = ip_key(ip);
        let mut c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        if c.total >= self.limits.max_connections + self.reserve {
            return Err(0);
        }
        let access = if self.probes {
            Access::Probes
        } else if c.total >= self.limits.max_connections {
            Access::Reserve
        } else {
            Access::Full
        };
        let n = c.per_ip.entry(key).or_insert(0);
        // The reserve has its own bound: a probe from an address at its limit (a sidecar, the
        // host of a proxy) is still answered.
        if *n >= self.limits.per_ip && access != Access::Reserve {
            return Err(1);
        }
        *n += 1;
        c.total += 1;
        let gauge = (!self.probes).then(|| self.metrics.clone());
        if let Some(m) = &gauge {
            m.connections.store(c.total as i64, Relaxed);
        }
        let slot = Slot {
            key,
            counts: self.counts.clone(),
            gauge,
        };
        Ok((slot, access))
    }
}

/// One connection's place in the counts, given back on drop.
#[derive(Debug)]
struct Slot {
    /// The per-IP key ([`ip_key`]).
    key: IpAddr,
    counts: Arc<Mutex<Counts>>,
    /// `riptide_connections`, kept by the main listener only.
    gauge: Option<Arc<Metrics>>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        c.total = c.total.saturating_sub(1);
        if let Some(n) = c.per_ip.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                c.per_ip.remove(&self.key);
            }
        }
        if let Some(m) = &self.gauge {
            m.connections.store(c.total as i64, Relaxed);
        }
    }
}

/// What a handler learns about its connection (`axum::extract::ConnectInfo<ConnInfo>`, set when
/// a [`LimitedListener`] is served with connect info).
#[derive(Clone, Debug)]
pub struct ConnInfo {
    /// The peer.
    pub addr: SocketAddr,
    /// What the connection may ask for.
    pub access: Access,
    /// The first request's [`LongQuery`], until [`guard`] takes it.
    long_query: Arc<Mutex<Option<String>>>,
}

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, LimitedListener>>
    for ConnInfo
{
    fn connect_info(s: axum::serve::IncomingStream<'_, LimitedListener>) -> ConnInfo {
        ConnInfo {
            addr: *s.remote_addr(),
            access: s.io().access,
            long_query: s.io().long_query.clone(),
        }
    }
}

/// The router's gate (`crate::router` applies it to every route): a connection of the reserve
/// or of a probes listener gets only [`PROBE_PATHS`]; anything else is refused, with
/// `connection: close` so that the slot is given back at once. Requests without [`ConnInfo`]
/// (a listener without limits, as in tests) pass. It also hands a request its [`LongQuery`].
pub async fn guard(
    axum::extract::State(metrics): axum::extract::State<Arc<Metrics>>,
    mut req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let info = req
        .extensions()
        .get::<axum::extract::ConnectInfo<ConnInfo>>()
        .map(|c| c.0.clone());
    let access = info.as_ref().map_or(Access::Full, |c| c.access);
    let long = info.and_then(|c| {
        c.long_query
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    });
    if let Some(q) = long {
        req.extensions_mut().insert(LongQuery(q));
    }
    if access == Access::Full || PROBE_PATHS.contains(&req.uri().path()) {
        return next.run(req).await;
    }
    let close = [(axum::http::header::CONNECTION, "close")];
    if access == Access::Reserve {
        metrics.connections_refused[0].fetch_add(1, Relaxed);
        (
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            close,
            "too many clients\n",
        )
            .into_response()
    } else {
        (
            axum::http::StatusCode::NOT_FOUND,
            close,
            "only /healthz, /readyz, /metrics and / are served here\n",
        )
            .into_response()
    }
}

const REFUSAL: &[u8] =
    b"HTTP/1.1 503 Service Unavailable\r\nconnection: close\r\ncontent-length: 17\r\n\r\ntoo many clients\n";

impl axum::serve::Listener for LimitedListener {
    type Io = Limited;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Limited, SocketAddr) {
        let timeout = self.limits.header_timeout;
        loop {
            let (stream, addr) = match self.inner.accept().await {
                Ok(x) => x,
                Err(e) => {
                    // EMFILE and friends: not fatal; the budget should make them rare.
                    let now = Instant::now();
                    if self
                        .last_error_log
                        .is_none_or(|t| now - t >= Duration::from_secs(1))
                    {
                        self.last_error_log = Some(now);
                        tracing::error!(error = %e, "accept failed; retrying");
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            match self.admit(addr.ip()) {
                Ok((slot, access)) => {
                    let _ = stream.set_nodelay(true);
                    let deadline = Box::pin(tokio::time::sleep(timeout));
                    return (
                        Limited {
                            stream,
                            _slot: slot,
                            access,
                            deadline: Some(deadline),
                            tail: 0,
                            timeout,
                            upgraded: false,
                            metrics: self.metrics.clone(),
                            first_line: (!self.probes).then(FirstLine::default),
                            pending: Vec::new(),
                            pending_at: 0,
                            long_query: Arc::default(),
                        },
                        addr,
                    );
                }
                Err(why) => {
                    self.metrics.connections_refused[why].fetch_add(1, Relaxed);
                    let _ = stream.try_write(REFUSAL);
                    tracing::debug!(%addr, reason = why, "connection refused: over the limit");
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }
}

/// An accepted connection under the limits: closed with `TimedOut` if a request's headers (up
/// to the first blank line) do not arrive before the deadline (module docs).
#[derive(Debug)]
pub struct Limited {
    stream: TcpStream,
    _slot: Slot,
    /// What the connection may ask for ([`guard`]).
    access: Access,
    /// Until the end of the headers of the request awaited; `None` while one is being served.
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    /// How much of `\r\n\r\n` the bytes read so far end with.
    tail: u8,
    /// [`ConnLimits::header_timeout`].
    timeout: Duration,
    /// The server answered `101 Switching Protocols`: no HTTP request follows, no deadline.
    upgraded: bool,
    metrics: Arc<Metrics>,
    /// The first request line, while it is read here (module docs, "Long queries").
    first_line: Option<FirstLine>,
    /// Bytes read from the socket that hyper has yet to be given, from `pending_at`.
    pending: Vec<u8>,
    pending_at: usize,
    /// The first request's [`LongQuery`], shared with its [`ConnInfo`].
    long_query: Arc<Mutex<Option<String>>>,
}

/// A first request line being read, its bytes counted in [`LONG_LINE_BYTES`].
#[derive(Debug, Default)]
struct FirstLine {
    buf: Vec<u8>,
}

impl FirstLine {
    /// Takes `more`, or says that the line may not grow so far (then takes nothing).
    fn push(&mut self, more: &[u8]) -> bool {
        if self.buf.len() + more.len() > MAX_REQUEST_LINE {
            return false;
        }
        let before = LONG_LINE_BYTES.fetch_add(more.len(), Relaxed);
        if before + more.len() > LONG_LINES_BUDGET {
            LONG_LINE_BYTES.fetch_sub(more.len(), Relaxed);
            return false;
        }
        self.buf.extend_from_slice(more);
        true
    }

    /// The bytes read, no longer counted.
    fn take(&mut self) -> Vec<u8> {
        let b = std::mem::take(&mut self.buf);
        LONG_LINE_BYTES.fetch_sub(b.len(), Relaxed);
        b
    }
}

impl Drop for FirstLine {
    fn drop(&mut self) {
        LONG_LINE_BYTES.fetch_sub(self.buf.len(), Relaxed);
    }
}

/// What to do with the first request line read so far.
#[derive(Debug, PartialEq, Eq)]
enum LineIs {
    /// Not one of [`LONG_QUERY_PATHS`]: hand it over as it is.
    Other,
    /// One of them, not complete yet.
    Partial,
    /// Complete, ending at this index (its `\n`).
    Complete(usize),
}

fn first_line_is(buf: &[u8]) -> LineIs {
    let ours = LONG_QUERY_PATHS.iter().any(|p| {
        let n = buf.len().min(p.len());
        buf[..n] == p[..n]
    });
    if !ours {
        return LineIs::Other;
    }
    match buf.iter().position(|&b| b == b'\n') {
        Some(i) => LineIs::Complete(i),
        None => LineIs::Partial,
    }
}

/// The bytes to give hyper for a complete first line ending at `end` in `buf` (the bytes after it
/// included): a target longer than [`LONG_TARGET`] without its query, which is returned beside;
/// anything else as it is.
fn split_long_query(mut buf: Vec<u8>, end: usize) -> (Vec<u8>, Option<String>) {
    let line = &buf[..end];
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    // `GET <target> HTTP/1.x`
    let (Some(q), Some(sp)) = (
        line.iter().position(|&b| b == b'?'),
        line.iter().rposition(|&b| b == b' '),
    ) else {
        return (buf, None);
    };
    if sp < q || sp - 4 <= LONG_TARGET || !line[sp + 1..].starts_with(b"HTTP/1.") {
        return (buf, None);
    }
    let Ok(query) = std::str::from_utf8(&line[q + 1..sp]) else {
        return (buf, None);
    };
    let query = query.to_owned();
    buf.drain(q..sp);
    (buf, Some(query))
}

impl Limited {
    /// Scans newly read bytes for the end of the headers.
    fn scan(&mut self, new: &[u8]) {
        const END: &[u8; 4] = b"\r\n\r\n";
        let mut t = self.tail as usize;
        for &b in new {
            t = if b == END[t] {
                t + 1
            } else if b == b'\r' {
                1
            } else {
                0
            };
            if t == 4 {
                self.deadline = None;
                return;
            }
        }
        self.tail = t as u8;
    }

    /// After a write of `n` bytes starting with `head`: an upgrade ends the deadlines for good;
    /// any other response (re)starts the deadline for the next request's headers. The timer is
    /// polled here, with the writing task's context: hyper may not read again before it sleeps
    /// (it read first, while the deadline was off), and an unpolled timer would wake no one.
    fn wrote(&mut self, head: &[u8], n: usize, cx: &mut Context<'_>) {
        if self.upgraded || n == 0 {
            return;
        }
        if head.starts_with(b"HTTP/1.1 101 ") {
            self.upgraded = true;
            self.deadline = None;
            return;
        }
        let at = crate::deadline_after(tokio::time::Instant::now(), self.timeout);
        let d = self
            .deadline
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(at)));
        d.as_mut().reset(at);
        // Not ready (it was just set in the future); this registers the wake-up.
        let _ = d.as_mut().poll(cx);
        self.tail = 0;
    }
}

impl Limited {
    /// Reads the first request line (module docs, "Long queries") until it is complete, or known
    /// not to be one of [`LONG_QUERY_PATHS`], or too long; then leaves what hyper is to get in
    /// `pending` (empty at the end of the stream).
    fn read_first_line(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let Some(line) = self.first_line.as_mut() else {
            return Poll::Ready(Ok(()));
        };
        let mut chunk = [0u8; 8192];
        loop {
            let mut rb = ReadBuf::new(&mut chunk);
            match Pin::new(&mut self.stream).poll_read(cx, &mut rb) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(())) => {}
            }
            let got = rb.filled();
            let taken = !got.is_empty() && line.push(got);
            let is = if taken {
                first_line_is(&line.buf)
            } else {
                LineIs::Other
            };
            if is == LineIs::Partial {
                continue;
            }
            let mut bytes = line.take();
            if !taken {
                // The end of the stream, or a line too long: as it came.
                bytes.extend_from_slice(got);
            }
            if let LineIs::Complete(end) = is {
                let (b, query) = split_long_query(bytes, end);
                bytes = b;
                *self.long_query.lock().unwrap_or_else(|e| e.into_inner()) = query;
            }
            self.first_line = None;
            self.pending = bytes;
            self.pending_at = 0;
            return Poll::Ready(Ok(()));
        }
    }
}

impl AsyncRead for Limited {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if let Some(d) = this.deadline.as_mut() {
            if d.as_mut().poll(cx).is_ready() {
                this.metrics.header_timeouts.fetch_add(1, Relaxed);
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "request headers not complete in time",
                )));
            }
        }
        if this.first_line.is_some() {
            match this.read_first_line(cx) {
                Poll::Ready(Ok(())) if this.pending.is_empty() => return Poll::Ready(Ok(())),
                Poll::Ready(Ok(())) => {}
                other => return other,
            }
        }
        if this.pending_at < this.pending.len() {
            let n = buf.remaining().min(this.pending.len() - this.pending_at);
            let given = this.pending[this.pending_at..this.pending_at + n].to_vec();
            buf.put_slice(&given);
            this.pending_at += n;
            if this.pending_at == this.pending.len() {
                this.pending = Vec::new();
                this.pending_at = 0;
            }
            if this.deadline.is_some() {
                this.scan(&given);
            }
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let r = Pin::new(&mut this.stream).poll_read(cx, buf);
        if this.deadline.is_some() {
            if let Poll::Ready(Ok(())) = &r {
                let new = buf.filled()[before..].to_vec();
                this.scan(&new);
            }
        }
        r
    }
}

impl AsyncWrite for Limited {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.stream).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = r {
            self.wrote(buf, n, cx);
        }
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = r {
            let head = bufs
                .iter()
                .find(|b| !b.is_empty())
                .map_or(&[][..], |b| &b[..]);
            self.wrote(head, n, cx);
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_keeps_the_reserve() {
        let l = ConnLimits::default();
        let e = l.effective_under(Some(1024)).unwrap();
        assert_eq!(e.max_connections as u64, 1024 - RESERVED_FDS - PROBE_FDS);
        assert!(e.per_ip <= e.max_connections);
        assert_eq!(
            l.effective_under(Some(1 << 20)).unwrap().max_connections,
            10_000
        );
        assert!(l.effective_under(Some(RESERVED_FDS + 8)).is_err());
        assert_eq!(l.effective_under(None).unwrap(), l);
    }

    #[test]
    fn ipv6_clients_count_per_64_and_ipv4_as_is() {
        let k = |s: &str| ip_key(s.parse().unwrap());
        // One /64, however its host bits are set.
        assert_eq!(k("2001:db8:1:2:aaaa:bbbb:cccc:dddd"), k("2001:db8:1:2::1"));
        assert_eq!(k("2001:db8:1:2::ffff").to_string(), "2001:db8:1:2::");
        // The next /64 is another key.
        assert_ne!(k("2001:db8:1:2::1"), k("2001:db8:1:3::1"));
        // IPv4 addresses are not grouped, also when mapped into IPv6 (dual-stack listener).
        assert_eq!(k("192.0.2.7").to_string(), "192.0.2.7");
        assert_eq!(k("::ffff:192.0.2.7"), k("192.0.2.7"));
        assert_ne!(k("::ffff:192.0.2.7"), k("::ffff:192.0.2.8"));
        assert_eq!(k("::1").to_string(), "::");
    }

    #[test]
    fn only_a_long_query_of_a_subscription_is_taken_out_of_the_first_line() {
        let v2 = "GET /xrpc/network.bsky.jetstream.subscribeEvents?";
        assert_eq!(first_line_is(b"GET /xrpc/net"), LineIs::Partial);
        assert_eq!(first_line_is(b"GET /metrics HTTP/1.1\r\n"), LineIs::Other);
        assert_eq!(first_line_is(b"GET /subscribe HTTP/1.1\r\n"), LineIs::Other);
        assert_eq!(first_line_is(b"GET /subscribe?x=1"), LineIs::Partial);
        let long = "dids=did:plc:a&".repeat(2_000);
        let line = format!("{v2}{long} HTTP/1.1\r\nhost: x\r\n\r\n");
        let end = line.find('\n').unwrap();
        assert_eq!(first_line_is(line.as_bytes()), LineIs::Complete(end));
        let (given, query) = split_long_query(line.clone().into_bytes(), end);
        assert_eq!(query.as_deref(), Some(&long[..]));
        assert_eq!(
            given,
            b"GET /xrpc/network.bsky.jetstream.subscribeEvents HTTP/1.1\r\nhost: x\r\n\r\n"
        );
        // Short queries, lines that are not HTTP/1, and queries that are not UTF-8 go as they came.
        let short = format!("{v2}dids=did:plc:a HTTP/1.1\r\n\r\n");
        let (given, query) =
            split_long_query(short.clone().into_bytes(), short.find('\n').unwrap());
        assert_eq!((given, query), (short.into_bytes(), None));
        let odd = format!("{v2}{long} SPDY/3\r\n\r\n");
        let (given, query) = split_long_query(odd.clone().into_bytes(), odd.find('\n').unwrap());
        assert_eq!((given, query), (odd.into_bytes(), None));
        let mut bad = format!("{v2}{long}").into_bytes();
        bad.push(0xff);
        bad.extend_from_slice(b" HTTP/1.1\r\n\r\n");
        let end = bad.iter().position(|&b| b == b'\n').unwrap();
        assert_eq!(split_long_query(bad.clone(), end), (bad, None));
    }

    #[test]
    fn header_end_is_found_across_reads() {
        let (a, _b) = std::net::TcpListener::bind("127.0.0.1:0")
            .map(|l| {
                let a = l.local_addr().unwrap();
                (a, l)
            })
            .unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let s = TcpStream::connect(a).await.unwrap();
            let m = Arc::new(Metrics::default());
            let mut l = Limited {
                stream: s,
                _slot: Slot {
                    key: a.ip(),
                    counts: Arc::default(),
                    gauge: Some(m.clone()),
                },
                access: Access::Full,
                deadline: Some(Box::pin(tokio::time::sleep(Duration::from_secs(9)))),
                tail: 0,
                timeout: Duration::from_secs(9),
                upgraded: false,
                metrics: m,
                first_line: None,
                pending: Vec::new(),
                pending_at: 0,
                long_query: Arc::default(),
            };
            for part in [&b"GET / HTTP/1.1\r\nhost: x\r"[..], b"\n\r", b"\nbody"] {
                assert!(l.deadline.is_some());
                l.scan(part);
            }
            assert!(l.deadline.is_none());
        });
    }
}
