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
    /// Stop retrying when the server refuses the upgrade with a 4xx (its answer is kept in
    /// `refused`): for endpoints whose 400s mean the request itself is wrong.
    pub(crate) stop_on_refusal: bool,
    /// The last 4xx refusal, when `stop_on_refusal` is set: (status, body).
    pub(crate) refused: Option<(u16, String)>,
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
            stop_on_refusal: false,
            refused: None,
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
    /// query string (without `?`) for a connection resuming at a cursor. With
    /// `stop_on_refusal`, a 4xx refusal also ends in `Step::Connected`, with no connection and
    /// the answer in `refused`.
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
                Ok(Err(WsError::Http(resp)))
                    if self.stop_on_refusal && resp.status().is_client_error() =>
                {
                    let body = resp
                        .body()
                        .as_ref()
                        .map(|b| String::from_utf8_lossy(b).into_owned())
                        .unwrap_or_default();
                    tracing::warn!(%url, status = resp.status().as_u16(), %body, "refused by the server: not retrying");
                    self.stats.connect_failure();
                    self.refused = Some((resp.status().as_u16(), body));
                    return;
                }
                Ok(Err(e)) => e.to_string(),
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
