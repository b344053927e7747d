//! The reconnecting connection shared by every stream: host rotation, backoff, idle detection and
//! the cursor. One module for the relay firehose, Jetstream and the server's upstream ingest, so
//! they cannot drift apart.
//!
//! Policy:
//! - Hosts are tried round-robin. A failed connection attempt, or a connection that ends before it
//!   was healthy for [`Backoff::healthy_after`], moves to the next host and waits a jittered,
//!   exponentially growing delay ([`Backoff`]). A connection that was healthy that long resets the
//!   failure count and reconnects to the same host at once — unless it ended on a protocol or
//!   size error (a message over [`ClientConfig::max_message_bytes`], a malformed frame): that is
//!   a failure whatever its age, so a relay that sends the same bad message on every connection
//!   gets backoff, not a reconnect loop (issue 40: 781 reconnects in 100 s).
//! - Permanent failures (issue 39): a connection that cannot succeed however long one waits — the
//!   server refuses the upgrade with a 4xx other than 408 (timeout) and 429 (rate limit), or the
//!   host name does not exist — ends the stream with the error when
//!   [`ClientConfig::give_up_on_permanent`] is set (Jetstream v2 always), instead of being retried
//!   forever. Everything else (refused or reset connections, 5xx, timeouts, a resolver that cannot
//!   be reached) is transient: retried with backoff. A caller that goes on after the error gets
//!   the retries.
//! - Idle detection: when nothing arrives for [`ClientConfig::ping_interval`] a ping is sent; when
//!   nothing (not even a pong) arrives for [`ClientConfig::idle_timeout`] the connection is
//!   declared dead and dropped.
//! - The cursor: every reconnect resumes after the last event delivered to the caller (in memory);
//!   a new process resumes after the last one the caller acknowledged ([`CursorStore`]), so
//!   delivery is at-least-once.
//!
//! Concurrency: a `Session` is owned by one task (`&mut self` everywhere); the counters
//! ([`ClientStats`]) are shared atomics.

use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use rand::rngs::StdRng;
use rand::SeedableRng;
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::error::{CapacityError, Error as WsError};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use crate::{Backoff, ClientError, ClientStats, CursorStore};

/// Connection settings shared by every stream.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// Hosts, tried round-robin: `wss://bsky.network`, `ws://127.0.0.1:8080`, a bare `host:port`
    /// (taken as `ws://`), or a full URL with the endpoint path.
    pub hosts: Vec<String>,
    /// Reconnect delays.
    pub backoff: Backoff,
    /// Time allowed for TCP, TLS and the WebSocket upgrade.
    pub connect_timeout: Duration,
    /// Silence after which a ping is sent.
    pub ping_interval: Duration,
    /// Silence after which the connection is dropped as dead.
    pub idle_timeout: Duration,
    /// Largest message accepted. A larger one ends the connection and counts in
    /// [`StatsSnapshot::decode_errors`](crate::StatsSnapshot::decode_errors); the reconnect
    /// resumes before it, so a relay that keeps sending it stalls the stream (with backoff).
    pub max_message_bytes: usize,
    /// Where acknowledged cursors are kept; `None` keeps them in memory only.
    pub cursor_store: Option<Arc<dyn CursorStore>>,
    /// The cursor to start from when the store holds none (`None`: live).
    pub start_cursor: Option<i64>,
    /// Acknowledged cursors are written to the store at most this often (`Session::flush`
    /// writes at once).
    pub persist_every: Duration,
    /// End the stream with the error on a permanent failure (module docs: policy) instead of
    /// retrying it: the stream's `next_checked` returns it once. For a program a person runs
    /// (`riptide tail`); a server keeps retrying (default `false`).
    pub give_up_on_permanent: bool,
}

impl Default for ClientConfig {
    fn default() -> ClientConfig {
        ClientConfig {
            hosts: Vec::new(),
            backoff: Backoff::default(),
            connect_timeout: Duration::from_secs(10),
            ping_interval: Duration::from_secs(15),
            idle_timeout: Duration::from_secs(45),
            max_message_bytes: 16 << 20,
            cursor_store: None,
            start_cursor: None,
            persist_every: Duration::from_secs(1),
            give_up_on_permanent: false,
        }
    }
}

impl ClientConfig {
    /// A configuration for these hosts, everything else default.
    pub fn with_hosts<S: Into<String>>(hosts: impl IntoIterator<Item = S>) -> ClientConfig {
        ClientConfig {
            hosts: hosts.into_iter().map(Into::into).collect(),
            ..ClientConfig::default()
        }
    }
}

pub(crate) type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// What the session produced.
#[derive(Debug)]
pub(crate) enum Step {
    /// A new connection is up (the stream may send a hello).
    Connected,
    /// A binary or text message.
    Message(Message),
}

#[derive(Debug)]
struct Live {
    ws: Ws,
    since: Instant,
    last_heard: Instant,
}

/// One reconnecting connection over several hosts, with its cursor.
#[derive(Debug)]
pub(crate) struct Session {
    cfg: ClientConfig,
    path: &'static str,
    next_host: usize,
    host: usize,
    failures: u32,
    rng: StdRng,
    stats: Arc<ClientStats>,
    live: Option<Live>,
    /// Cursor of the last event delivered (resume point within this process).
    seen: Option<i64>,
    acked: Option<i64>,
    persisted: Option<i64>,
    persisted_at: Instant,
    /// The cursor is a seq the server resumes *after* (the relay firehose): a message over the
    /// size limit is skipped by resuming one seq further (see [`Session::next`]).
    skip_oversized: bool,
    /// The WebSocket subprotocol offered (`Sec-WebSocket-Protocol`), if any.
    pub(crate) subprotocol: Option<&'static str>,
    /// Stop at a permanent failure (module docs: policy), keeping it in `permanent`:
    /// [`ClientConfig::give_up_on_permanent`], or always for an endpoint whose 400s mean the
    /// request itself is wrong (Jetstream v2).
    pub(crate) give_up: bool,
    /// The permanent failure that ended the stream, for the stream to return once.
    pub(crate) permanent: Option<ClientError>,
    /// A permanent failure was handed out already: a caller that goes on gets retries with
    /// backoff, never a loop of instant failures.
    gave_up: bool,
}

impl Session {
    /// A session for the endpoint at `path` (e.g. `/subscribe`). Loads the stored cursor.
    pub(crate) fn new(cfg: ClientConfig, path: &'static str) -> Result<Session, ClientError> {
        if cfg.hosts.is_empty() {
            return Err(ClientError::NoHosts);
        }
        for h in &cfg.hosts {
            endpoint_url(h, path)?;
        }
        let stored = match &cfg.cursor_store {
            Some(s) => s.load().map_err(ClientError::Cursor)?,
            None => None,
        };
        let seen = stored.or(cfg.start_cursor);
        let give_up = cfg.give_up_on_permanent;
        Ok(Session {
            cfg,
            path,
            next_host: 0,
            host: 0,
            failures: 0,
            rng: StdRng::from_entropy(),
            stats: Arc::default(),
            live: None,
            seen,
            acked: stored,
            persisted: stored,
            persisted_at: Instant::now(),
            skip_oversized: false,
            subprotocol: None,
            give_up,
            permanent: None,
            gave_up: false,
        })
    }

    /// Skips messages over the size limit by resuming one seq past the last delivered (for
    /// cursors that are exclusive seqs: the relay firehose).
    pub(crate) fn skip_oversized(&mut self) {
        self.skip_oversized = true;
    }

    pub(crate) fn stats(&self) -> &Arc<ClientStats> {
        &self.stats
    }

    /// The resume cursor: the last event delivered, else the stored one, else the start cursor.
    pub(crate) fn cursor(&self) -> Option<i64> {
        self.seen
    }

    /// Notes that the event with this cursor was delivered to the caller.
    pub(crate) fn seen(&mut self, cursor: i64) {
        self.seen = Some(cursor);
    }

    /// Sets the resume point of the next connection (`None`: live).
    pub(crate) fn resume_from(&mut self, cursor: Option<i64>) {
        self.seen = cursor;
    }

    /// Index of the current (or last) connection's host.
    pub(crate) fn host_index(&self) -> usize {
        self.host
    }

    /// The host of the current (or last) connection.
    pub(crate) fn host(&self) -> &str {
        &self.cfg.hosts[self.host]
    }

    /// Acknowledges a processed cursor; stores it when the last write is old enough.
    pub(crate) fn ack(&mut self, cursor: i64) -> Result<(), ClientError> {
        self.acked = Some(cursor);
        if self.persisted_at.elapsed() >= self.cfg.persist_every {
            self.flush()?;
        }
        Ok(())
    }

    /// Writes the last acknowledged cursor to the store now.
    pub(crate) fn flush(&mut self) -> Result<(), ClientError> {
        if let (Some(store), Some(c)) = (&self.cfg.cursor_store, self.acked) {
            if self.persisted != Some(c) {
                store.save(c).map_err(ClientError::Cursor)?;
                self.persisted = Some(c);
            }
        }
        self.persisted_at = Instant::now();
        Ok(())
    }

    /// Sends on the current connection; a failure drops the connection (the next read reconnects).
    pub(crate) async fn send(&mut self, msg: Message) -> bool {
        let Some(live) = &mut self.live else {
            return false;
        };
        if live.ws.send(msg).await.is_ok() {
            return true;
        }
        self.disconnected("send failed");
        false
    }

    /// Drops the current connection (the next read reconnects, after a backoff if it was young).
    pub(crate) fn disconnected(&mut self, why: &str) {
        self.ended(why, false);
    }

    /// Drops the current connection; one that ended on a protocol or size error (`faulty`)
    /// counts as a failure however long it was up (module docs: policy).
    fn ended(&mut self, why: &str, faulty: bool) {
        if let Some(live) = self.live.take() {
            let healthy = !faulty && live.since.elapsed() >= self.cfg.backoff.healthy_after;
            let host = &self.cfg.hosts[self.host];
            tracing::warn!(host = %host, why, healthy, "disconnected; reconnecting");
            self.stats.set_connected(false);
            self.stats
                .set_error(Some(format!("{host}: disconnected: {why}")));
            if healthy {
                self.failures = 0;
                self.next_host = self.host;
            } else {
                self.failures = self.failures.saturating_add(1);
            }
        }
    }

    /// The next binary or text message, connecting and reconnecting as needed. `query` gives the
    /// query string (without `?`) for a connection resuming at a cursor. With `give_up`, a
    /// permanent failure also ends in `Step::Connected`, with no connection and the error in
    /// `permanent`.
    pub(crate) async fn next(&mut self, query: &(dyn Fn(Option<i64>) -> String + Sync)) -> Step {
        loop {
            let Some(live) = &mut self.live else {
                self.connect(query).await;
                return Step::Connected;
            };
            let wait = self.cfg.ping_interval.min(self.cfg.idle_timeout);
            match tokio::time::timeout(wait, live.ws.next()).await {
                Ok(Some(Ok(msg))) => {
                    live.last_heard = Instant::now();
                    match msg {
                        Message::Binary(_) | Message::Text(_) => return Step::Message(msg),
                        Message::Close(_) => self.disconnected("closed by peer"),
                        _ => {} // ping (answered by tungstenite), pong
                    }
                }
                Ok(Some(Err(e))) => {
                    if let WsError::Capacity(CapacityError::MessageTooLong { size, max_size }) = e {
                        // Refused before its payload is read, so never delivered: counted, and
                        // skipped (a connection resuming at the same cursor would meet it again
                        // forever). tungstenite cannot discard the rest of a message, so the
                        // connection ends; with a seq cursor the next one resumes one seq
                        // further on, which passes over exactly this message: the relay sends
                        // seqs after the cursor, and this message is the first after the last
                        // one delivered. (If the relay's seqs have a gap here, the same message
                        // comes again and the cursor moves one more; no other message is lost.)
                        self.stats.oversized();
                        let host = &self.cfg.hosts[self.host];
                        match self.seen.filter(|_| self.skip_oversized) {
                            Some(c) => {
                                let skipped = c.saturating_add(1);
                                tracing::warn!(
                                    host = %host, size, max_size, after_seq = c, seq = skipped,
                                    "message over the size limit: skipped (resuming after seq {skipped})"
                                );
                                self.seen = Some(skipped);
                            }
                            None => tracing::warn!(
                                host = %host, size, max_size, after = ?self.seen,
                                "message over the size limit: skipped (reconnecting)"
                            ),
                        }
                    }
                    // The peer broke the protocol (or sent more than we take): backoff applies,
                    // even to a connection that was long healthy. A transport error (reset,
                    // closed) is judged by the connection's age, as any other end.
                    let faulty = matches!(
                        e,
                        WsError::Capacity(_)
                            | WsError::Protocol(_)
                            | WsError::Utf8(_)
                            | WsError::AttackAttempt
                    );
                    let why = e.to_string();
                    self.ended(&why, faulty);
                }
                Ok(None) => self.disconnected("end of stream"),
                Err(_) => {
                    if live.last_heard.elapsed() >= self.cfg.idle_timeout {
                        self.disconnected("idle timeout");
                    } else if live
                        .ws
                        .send(Message::Ping(Default::default()))
                        .await
                        .is_err()
                    {
                        self.disconnected("ping failed");
                    }
                }
            }
        }
    }

    /// Connects to the next host, retrying with backoff until a connection is up.
    async fn connect(&mut self, query: &(dyn Fn(Option<i64>) -> String + Sync)) {
        let mut delay = self.cfg.backoff.delay(self.failures, &mut self.rng);
        loop {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            let host = self.next_host % self.cfg.hosts.len();
            let q = query(self.seen);
            // Validated in `new`.
            let mut url = endpoint_url(&self.cfg.hosts[host], self.path).unwrap_or_default();
            if !q.is_empty() {
                url.push(if url.contains('?') { '&' } else { '?' });
                url.push_str(&q);
            }
            let config = WebSocketConfig::default()
                .max_message_size(Some(self.cfg.max_message_bytes))
                .max_frame_size(Some(self.cfg.max_message_bytes));
            let mut request = match url.as_str().into_client_request() {
                Ok(r) => r,
                Err(e) => {
                    // Validated in `new`; said anyway, never skipped silently.
                    tracing::warn!(%url, error = %e, "bad URL");
                    self.stats.connect_failure();
                    self.stats.set_error(Some(format!("{url}: {e}")));
                    self.failures = self.failures.saturating_add(1);
                    self.next_host = host + 1;
                    delay = self.cfg.backoff.delay(self.failures, &mut self.rng);
                    continue;
                }
            };
            if let Some(p) = self.subprotocol {
                request.headers_mut().insert(
                    "sec-websocket-protocol",
                    tokio_tungstenite::tungstenite::http::HeaderValue::from_static(p),
                );
            }
            let attempt = tokio_tungstenite::connect_async_with_config(request, Some(config), true);
            let why = match tokio::time::timeout(self.cfg.connect_timeout, attempt).await {
                Ok(Ok((ws, _))) => {
                    let now = Instant::now();
                    self.live = Some(Live {
                        ws,
                        since: now,
                        last_heard: now,
                    });
                    self.host = host;
                    self.next_host = host + 1;
                    self.stats.connected();
                    self.stats.set_connected(true);
                    self.stats.set_error(None);
                    if self.stats.connects() > 1 || self.failures > 0 {
                        tracing::info!(%url, "connected");
                    } else {
                        tracing::debug!(%url, "connected");
                    }
                    return;
                }
                Ok(Err(e)) => {
                    match permanent(&e, &url).filter(|_| self.give_up && !self.gave_up) {
                        Some(p) => {
                            // Said by whoever receives it (once), not here as well.
                            tracing::debug!(%url, error = %p, "permanent failure: not retrying");
                            self.stats.connect_failure();
                            self.stats.set_error(Some(format!("{url}: {p}")));
                            self.permanent = Some(p);
                            self.gave_up = true;
                            return;
                        }
                        None => e.to_string(),
                    }
                }
                Err(_) => format!("no connection within {:?}", self.cfg.connect_timeout),
            };
            // Every failed attempt is counted and said, with what comes next: a dead or wrong
            // host must be visible at once, not after the backoff has grown.
            self.stats.connect_failure();
            self.failures = self.failures.saturating_add(1);
            self.next_host = host + 1;
            delay = self.cfg.backoff.delay(self.failures, &mut self.rng);
            let next = &self.cfg.hosts[self.next_host % self.cfg.hosts.len()];
            tracing::warn!(
                failures = self.failures,
                "cannot connect to {url}: {why}; retrying {next} in {:.1}s",
                delay.as_secs_f64()
            );
            self.stats.set_error(Some(format!("{url}: {why}")));
        }
    }
}

/// The most of an error body kept in [`ClientError::Refused`] (an HTML error page is long).
const MAX_REFUSAL_TEXT: usize = 300;

/// A failure of a connection attempt that waiting cannot mend (module docs: policy), as the
/// error the stream ends with; `None` for a transient one.
fn permanent(e: &WsError, url: &str) -> Option<ClientError> {
    match e {
        WsError::Http(resp) => {
            let status = resp.status().as_u16();
            // 408 Request Timeout and 429 Too Many Requests ask to try again later.
            if !resp.status().is_client_error() || status == 408 || status == 429 {
                return None;
            }
            let body = resp
                .body()
                .as_ref()
                .map(|b| String::from_utf8_lossy(b).into_owned())
                .unwrap_or_default();
            Some(refusal(status, &body))
        }
        WsError::Io(io) => unknown_host(io).map(|reason| ClientError::UnknownHost {
            url: url.to_owned(),
            reason,
        }),
        _ => None,
    }
}

/// Why a host name does not resolve, when the resolver said it does not exist (`EAI_NONAME`,
/// `EAI_NODATA`); `None` for any other error, including a resolver that could not be asked
/// (`EAI_AGAIN`: offline, or DNS down, which passes). The standard library reports
/// `getaddrinfo` failures only as text (`failed to lookup address information: DETAIL`, DETAIL
/// being the C library's `gai_strerror`), so the text is what is read.
pub(crate) fn unknown_host(e: &std::io::Error) -> Option<String> {
    let text = e.to_string();
    let detail = text.strip_prefix("failed to lookup address information: ")?;
    let lower = detail.to_ascii_lowercase();
    if lower.contains("temporary") || lower.contains("try again") {
        return None;
    }
    Some(detail.to_owned())
}

/// A 4xx answer as an error (the XRPC envelope's `error` and `message` when it has one, else
/// the body, cut to [`MAX_REFUSAL_TEXT`] bytes).
pub(crate) fn refusal(status: u16, body: &str) -> ClientError {
    #[derive(serde::Deserialize)]
    struct Envelope {
        error: Option<String>,
        message: Option<String>,
    }
    let e: Option<Envelope> = serde_json::from_str(body).ok();
    let (error, message) = match e {
        Some(e) => (e.error.unwrap_or_default(), e.message.unwrap_or_default()),
        None => {
            let mut end = body.len().min(MAX_REFUSAL_TEXT);
            while !body.is_char_boundary(end) {
                end -= 1;
            }
            (String::new(), body[..end].trim().to_string())
        }
    };
    ClientError::Refused {
        status,
        error,
        message,
    }
}

/// Whether `host` is one a client can use (see [`ClientConfig::hosts`] for the accepted forms),
/// checked as a connection will parse it: for a server's start-up checks, before anything is
/// opened.
pub fn check_host(host: &str) -> Result<(), ClientError> {
    endpoint_url(host, "/").map(drop)
}

/// The WebSocket URL of `path` on `host` (see [`ClientConfig::hosts`] for the accepted forms).
pub(crate) fn endpoint_url(host: &str, path: &str) -> Result<String, ClientError> {
    let host = host.trim();
    let (scheme, rest) = match host.split_once("://") {
        Some(("ws" | "http", r)) => ("ws", r),
        Some(("wss" | "https", r)) => ("wss", r),
        Some(_) => return Err(ClientError::InvalidUrl(host.to_string())),
        None => ("ws", host),
    };
    let (authority, tail) = match rest.find(['/', '?']) {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    if authority.is_empty() || authority.contains(char::is_whitespace) {
        return Err(ClientError::InvalidUrl(host.to_string()));
    }
    let tail = tail.trim_end_matches('/');
    let url = if tail.is_empty() {
        format!("{scheme}://{authority}{path}")
    } else {
        format!("{scheme}://{authority}{tail}")
    };
    // What the connection will parse, checked now: a bad port or host fails at start, not on
    // every attempt.
    let bad = || ClientError::InvalidUrl(host.to_string());
    let uri: tokio_tungstenite::tungstenite::http::Uri = url.parse().map_err(|_| bad())?;
    let a = uri.authority().ok_or_else(bad)?;
    if a.host().is_empty() || a.as_str().contains('@') {
        return Err(bad());
    }
    if let Some((_, port)) = a
        .as_str()
        .rsplit_once(':')
        .filter(|_| !a.as_str().ends_with(']'))
    {
        port.parse::<u16>().map_err(|_| bad())?;
    }
    Ok(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn http(status: u16, body: &str) -> WsError {
        let resp = tokio_tungstenite::tungstenite::http::Response::builder()
            .status(status)
            .body(Some(body.as_bytes().to_vec()))
            .unwrap();
        WsError::Http(Box::new(resp))
    }

    /// Issue 39: what waiting cannot mend is permanent, the rest transient.
    #[test]
    fn permanent_failures_are_the_4xx_but_408_and_429_and_unknown_hosts() {
        let url = "ws://h:1/subscribe";
        match permanent(&http(404, "no such endpoint"), url) {
            Some(ClientError::Refused {
                status: 404,
                error,
                message,
            }) => assert_eq!((error.as_str(), message.as_str()), ("", "no such endpoint")),
            other => panic!("{other:?}"),
        }
        match permanent(
            &http(400, r#"{"error":"InvalidRequest","message":"bad"}"#),
            url,
        ) {
            Some(e @ ClientError::Refused { .. }) => {
                assert_eq!(e.to_string(), "refused with HTTP 400 InvalidRequest: bad")
            }
            other => panic!("{other:?}"),
        }
        for transient in [408, 429, 500, 502, 503] {
            assert!(
                permanent(&http(transient, "x"), url).is_none(),
                "{transient}"
            );
        }
        // A long error page is cut, on a character boundary.
        let page = "é".repeat(1000);
        match permanent(&http(404, &page), url) {
            Some(ClientError::Refused { message, .. }) => {
                assert!(message.len() <= MAX_REFUSAL_TEXT && message.starts_with("éé"))
            }
            other => panic!("{other:?}"),
        }
        // The standard library's words for getaddrinfo's answers (glibc's gai_strerror).
        let lookup = |detail: &str| {
            std::io::Error::other(format!("failed to lookup address information: {detail}"))
        };
        match permanent(&WsError::Io(lookup("Name or service not known")), url) {
            Some(e @ ClientError::UnknownHost { .. }) => assert_eq!(
                e.to_string(),
                "ws://h:1/subscribe: the host name does not resolve (Name or service not known)"
            ),
            other => panic!("{other:?}"),
        }
        assert!(unknown_host(&lookup("No address associated with hostname")).is_some());
        assert!(unknown_host(&lookup("Temporary failure in name resolution")).is_none());
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert!(permanent(&WsError::Io(refused), url).is_none());
        assert!(permanent(&WsError::ConnectionClosed, url).is_none());
    }

    /// The words the resolver of this machine gives for a name that cannot exist are read as an
    /// unknown host (when it can be asked at all: offline it says "try again").
    #[test]
    fn this_machines_resolver_answer_for_an_invalid_name_is_understood() {
        let Err(e) = std::net::ToSocketAddrs::to_socket_addrs("riptide-test.invalid:80") else {
            panic!(".invalid resolved");
        };
        let text = e.to_string();
        if text.to_ascii_lowercase().contains("temporary") {
            return;
        }
        assert!(unknown_host(&e).is_some(), "{text}");
    }

    #[test]
    fn host_forms_become_endpoint_urls() {
        let p = "/xrpc/com.atproto.sync.subscribeRepos";
        assert_eq!(
            endpoint_url("wss://bsky.network", p).unwrap(),
            format!("wss://bsky.network{p}")
        );
        assert_eq!(
            endpoint_url("https://bsky.network/", p).unwrap(),
            format!("wss://bsky.network{p}")
        );
        assert_eq!(
            endpoint_url("127.0.0.1:9", p).unwrap(),
            format!("ws://127.0.0.1:9{p}")
        );
        assert_eq!(
            endpoint_url("ws://h:1/subscribe?x=1", p).unwrap(),
            "ws://h:1/subscribe?x=1"
        );
        assert!(endpoint_url("ftp://h", p).is_err());
        assert!(endpoint_url("ws://", p).is_err());
        // Caught at start, not on every connection attempt.
        for bad in [
            "ws://h:99999",
            "ws://h:port",
            "h:",
            "ws://[::1",
            "ws://a b",
            "ws://u@h",
        ] {
            assert!(endpoint_url(bad, p).is_err(), "{bad}");
        }
        assert!(endpoint_url("ws://[::1]:80", p).is_ok());
    }
}
