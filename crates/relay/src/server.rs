//! Accepting WebSocket subscribers and serving them from the log.
//!
//! Each connection is one task: upgrade (where 5xx faults and query validation happen), resolve
//! the cursor, then a loop that sends whatever the log holds past the subscriber's position and
//! otherwise waits for new events, client messages, the ping timer or shutdown. Shutdown sends a
//! 1001 close frame to every subscriber.
//!
//! Two ways in: [`Relay::bind`] owns a listener and does the HTTP upgrade itself (tungstenite's
//! handshake); [`Relay::start`] gives a [`RelayService`] without a listener, for a server that
//! already speaks HTTP (the simulator's axum router) and hands over each upgraded connection with
//! [`RelayService::serve`]. Both run the same subscriber loop over the same log.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::{sleep_until, Instant};
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::http::StatusCode;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

use crate::frames::{error_frame, info_frame, scan_decoder, SeqSlot};
use crate::log::{Log, Read};
use crate::{Faults, RelayConfig, RelayError, SUBSCRIBE_PATH};

/// Events sent per log read: bounds the handles cloned under the lock.
const BATCH: usize = 256;

/// Entry point: [`Relay::bind`].
#[derive(Debug)]
pub struct Relay;

/// Counters of a running relay.
#[derive(Debug, Default)]
pub struct RelayStats {
    /// Upgrade attempts (accepted or not).
    pub attempts: AtomicU64,
    /// Connections upgraded.
    pub connections: AtomicU64,
    /// Subscribers connected now.
    pub subscribers: AtomicU64,
    /// Event frames sent (all subscribers).
    pub frames_sent: AtomicU64,
    /// Upgrades refused by fault injection.
    pub rejected: AtomicU64,
    /// Frames of the list given at start that were left out because no seq could be found in
    /// them (they do not decode as far as the payload: truncated or non-canonical frames, as
    /// `riptide gen --adversarial` writes). A real relay drops what it cannot parse too; counted
    /// once, not per loop.
    pub unservable: AtomicU64,
}

/// A running relay with its own listener: a [`RelayService`] (the log, counters and publishing,
/// reached through `Deref`) plus the accept task and the bound address. Dropping it without
/// [`RelayHandle::shutdown`] stops it abruptly.
#[derive(Debug)]
pub struct RelayHandle {
    service: RelayService,
    tasks: JoinSet<()>,
    addr: SocketAddr,
}

impl std::ops::Deref for RelayHandle {
    type Target = RelayService;

    fn deref(&self) -> &RelayService {
        &self.service
    }
}

struct Shared {
    log: Arc<Log>,
    stats: Arc<RelayStats>,
    /// Positions (in the input) of the frames left out as unservable, ascending.
    left_out: Vec<usize>,
    config: RelayConfig,
    stop: watch::Receiver<bool>,
    rejects_left: AtomicUsize,
}

/// A relay without a listener: the log, its feeder and the subscriber loop, for a server that does
/// its own HTTP and hands over upgraded connections ([`RelayService::serve`]). Cheap to clone;
/// when the last clone is dropped the feeder stops and every subscriber is closed with 1001.
#[derive(Clone, Debug)]
pub struct RelayService {
    shared: Arc<Shared>,
    stop: Arc<StopOnDrop>,
}

#[derive(Debug)]
struct StopOnDrop(watch::Sender<bool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.send_replace(true);
    }
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("head", &self.log.head())
            .field("config", &self.config)
            .finish()
    }
}

/// What [`setup`] gives: the shared state, the servable frames with their seq slots, the stop
/// signal.
type Setup = (Arc<Shared>, Vec<(SeqSlot, Bytes)>, watch::Sender<bool>);

/// Finds every frame's seq slot (leaving out and counting the frames that have none to find,
/// [`RelayStats::unservable`]) and builds the shared state (log, counters, stop signal).
fn setup(frames: Vec<Bytes>, config: RelayConfig) -> Setup {
    let mut dec = scan_decoder();
    let mut slotted = Vec::with_capacity(frames.len());
    let stats = RelayStats::default();
    let mut left_out = Vec::new();
    for (i, f) in frames.into_iter().enumerate() {
        if config.faults.verbatim {
            slotted.push((SeqSlot::verbatim(), f));
            continue;
        }
        match SeqSlot::find(&mut dec, i, &f) {
            Ok(slot) => slotted.push((slot, f)),
            Err(e) => {
                tracing::debug!(error = %e, "frame left out");
                stats.unservable.fetch_add(1, Ordering::Relaxed);
                left_out.push(i);
            }
        }
    }
    let log = Arc::new(Log::new(config.first_seq, config.window));
    let (stop, stop_rx) = watch::channel(false);
    let shared = Arc::new(Shared {
        log,
        stats: Arc::new(stats),
        left_out,
        rejects_left: AtomicUsize::new(config.faults.reject_upgrades),
        config,
        stop: stop_rx,
    });
    (shared, slotted, stop)
}

impl Relay {
    /// Binds `addr` (port 0 for an ephemeral port), starts feeding `frames` into the log and
    /// serving subscribers. Frames that do not decode as far as their payload's `seq` are left
    /// out and counted ([`RelayStats::unservable`]).
    pub async fn bind(
        addr: SocketAddr,
        frames: Vec<Bytes>,
        config: RelayConfig,
    ) -> Result<(SocketAddr, RelayHandle), RelayError> {
        let (shared, slotted, stop) = setup(frames, config);
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| RelayError::Bind { addr, source })?;
        let local = listener
            .local_addr()
            .map_err(|source| RelayError::Bind { addr, source })?;
        let mut tasks = JoinSet::new();
        tasks.spawn(feed(shared.clone(), slotted));
        tasks.spawn(accept(shared.clone(), listener));
        Ok((
            local,
            RelayHandle {
                service: RelayService {
                    shared,
                    stop: Arc::new(StopOnDrop(stop)),
                },
                tasks,
                addr: local,
            },
        ))
    }

    /// Starts feeding `frames` into a log served by whoever calls [`RelayService::serve`] (no
    /// listener; `config.faults.reject_upgrades` is the caller's business, as the upgrade is).
    /// Unservable frames are left out and counted as by [`Relay::bind`]. Needs a tokio runtime
    /// (the feeder is a spawned task).
    pub fn start(frames: Vec<Bytes>, config: RelayConfig) -> RelayService {
        let (shared, slotted, stop) = setup(frames, config);
        tokio::spawn(feed(shared.clone(), slotted));
        RelayService {
            shared,
            stop: Arc::new(StopOnDrop(stop)),
        }
    }
}

/// Parses an upgrade request's query string (without `?`): the `cursor`, if any. The error is the
/// message for a 400 answer.
pub fn parse_cursor(query: Option<&str>) -> Result<Option<u64>, String> {
    let mut cursor = None;
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        if k == "cursor" && !v.is_empty() {
            cursor = Some(
                v.parse::<u64>()
                    .map_err(|_| format!("invalid cursor: {v}"))?,
            );
        }
    }
    Ok(cursor)
}

impl RelayService {
    /// Serves one subscriber on an already-upgraded WebSocket until it leaves, is dropped by a
    /// fault or the service stops. `cursor` is the request's ([`parse_cursor`]); `faults` apply
    /// to this connection (`drop_after`, `frame_delay`, `error_after`; not `reject_upgrades`).
    ///
    /// The future owns what it needs (spawn it) but does not keep the service alive: once the
    /// last [`RelayService`] clone is dropped, the subscriber is closed with 1001.
    pub fn serve<S>(
        &self,
        ws: WebSocketStream<S>,
        cursor: Option<u64>,
        faults: Faults,
    ) -> impl std::future::Future<Output = ()> + Send + 'static
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let shared = self.shared.clone();
        async move {
            shared.stats.attempts.fetch_add(1, Ordering::Relaxed);
            shared.stats.connections.fetch_add(1, Ordering::Relaxed);
            shared.stats.subscribers.fetch_add(1, Ordering::Relaxed);
            if let Err(e) = subscriber(&shared, ws, cursor, &faults).await {
                tracing::debug!(error = %e, "subscriber ended");
            }
            shared.stats.subscribers.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// The newest seq assigned (first_seq - 1 before any).
    pub fn head(&self) -> u64 {
        self.shared.log.head()
    }

    /// Waits until the newest seq is at least `seq`.
    pub async fn wait_for_head(&self, seq: u64) {
        let mut rx = self.shared.log.subscribe();
        let _ = rx.wait_for(|h| *h >= seq).await;
    }

    /// Counters.
    pub fn stats(&self) -> &RelayStats {
        &self.shared.stats
    }

    /// Where in the given frames were the ones left out as unservable (ascending): what a caller
    /// that knows more about its frames (say, which were broken on purpose) needs to tell what is
    /// served from what is not.
    pub fn left_out(&self) -> &[usize] {
        &self.shared.left_out
    }

    /// The configuration it was started with.
    pub fn config(&self) -> &RelayConfig {
        &self.shared.config
    }

    /// Appends a frame to the log with the next seq. The frame must decode (header and payload).
    pub fn publish(&self, frame: Bytes) -> Result<u64, RelayError> {
        let slot = SeqSlot::find(&mut scan_decoder(), 0, &frame)?;
        Ok(self.shared.log.append(&slot, &frame))
    }
}

impl RelayHandle {
    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `ws://ADDR/xrpc/com.atproto.sync.subscribeRepos`.
    pub fn url(&self) -> String {
        format!("ws://{}{}", self.addr, SUBSCRIBE_PATH)
    }

    /// Stops accepting, closes every subscriber with 1001 and waits for the tasks to end.
    pub async fn shutdown(mut self) {
        self.service.stop.0.send_replace(true);
        while self.tasks.join_next().await.is_some() {}
    }
}

/// Resolves once shutdown is asked for (or the handle is gone).
async fn stopped(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}

async fn feed(shared: Arc<Shared>, frames: Vec<(SeqSlot, Bytes)>) {
    if frames.is_empty() {
        return;
    }
    let start = Instant::now();
    let mut stop = shared.stop.clone();
    let mut n: u64 = 0;
    loop {
        for (slot, frame) in &frames {
            // Paced: sleep only when ahead. The timer wakes about once a millisecond and every
            // frame due by then goes out in one burst (a sleep per frame cost the relay 10-20
            // CPU-µs per frame at 40k/s, its subscribers woken frame by frame).
            let ahead = shared
                .config
                .rate
                .filter(|r| *r > 0.0)
                .map(|rate| {
                    // Saturating: an absurdly slow rate is a far deadline, not a panic.
                    let d = Duration::try_from_secs_f64(n as f64 / rate).unwrap_or(Duration::MAX);
                    start
                        .checked_add(d)
                        .unwrap_or_else(|| start + Duration::from_secs(365 * 86_400))
                })
                .filter(|at| *at > Instant::now());
            if let Some(at) = ahead {
                tokio::select! {
                    _ = sleep_until(at) => {}
                    _ = stopped(&mut stop) => return,
                }
            } else if n % 1024 == 1023 {
                // Behind (or unpaced): let the subscribers run.
                tokio::task::yield_now().await;
                if *stop.borrow() {
                    return;
                }
            }
            shared.log.append(slot, frame);
            n += 1;
        }
        if !shared.config.looped {
            return;
        }
    }
}

async fn accept(shared: Arc<Shared>, listener: TcpListener) {
    let mut stop = shared.stop.clone();
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            r = listener.accept() => match r {
                Ok((sock, peer)) => {
                    let _ = sock.set_nodelay(true);
                    conns.spawn(serve(shared.clone(), sock, peer));
                }
                Err(e) => {
                    tracing::debug!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            _ = stopped(&mut stop) => break,
        }
    }
    drop(listener);
    while conns.join_next().await.is_some() {}
}

fn error_response(status: StatusCode, body: &str) -> ErrorResponse {
    let mut r = ErrorResponse::new(Some(format!(
        "{{\"error\":\"{}\",\"message\":\"{body}\"}}",
        status.canonical_reason().unwrap_or("Error")
    )));
    *r.status_mut() = status;
    r
}

async fn serve(shared: Arc<Shared>, sock: TcpStream, peer: SocketAddr) {
    shared.stats.attempts.fetch_add(1, Ordering::Relaxed);
    // The cursor the upgrade request asked for, once it is accepted.
    let mut asked: Option<Option<u64>> = None;
    // The handshake's callback type is tungstenite's; its error is an HTTP response by design.
    #[allow(clippy::result_large_err)]
    let callback = |req: &Request, resp: Response| -> Result<Response, ErrorResponse> {
        if req.uri().path() != SUBSCRIBE_PATH {
            return Err(error_response(StatusCode::NOT_FOUND, "no such method"));
        }
        let left = shared.rejects_left.load(Ordering::Relaxed);
        if left > 0
            && shared
                .rejects_left
                .compare_exchange(left, left - 1, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            shared.stats.rejected.fetch_add(1, Ordering::Relaxed);
            let status = StatusCode::from_u16(shared.config.faults.reject_status)
                .ok()
                .filter(|s| s.is_server_error() || s.is_client_error())
                .unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
            return Err(error_response(status, "injected fault"));
        }
        let cursor = parse_cursor(req.uri().query())
            .map_err(|m| error_response(StatusCode::BAD_REQUEST, &m))?;
        asked = Some(cursor);
        Ok(resp)
    };
    let ws = match tokio_tungstenite::accept_hdr_async(sock, callback).await {
        Ok(ws) => ws,
        Err(e) => {
            tracing::debug!(%peer, error = %e, "upgrade failed");
            return;
        }
    };
    let Some(cursor) = asked else {
        return;
    };
    shared.stats.connections.fetch_add(1, Ordering::Relaxed);
    shared.stats.subscribers.fetch_add(1, Ordering::Relaxed);
    if let Err(e) = subscriber(&shared, ws, cursor, &shared.config.faults).await {
        tracing::debug!(%peer, error = %e, "subscriber ended");
    }
    shared.stats.subscribers.fetch_sub(1, Ordering::Relaxed);
}

type WsResult = Result<(), tokio_tungstenite::tungstenite::Error>;

async fn close<S: AsyncRead + AsyncWrite + Unpin>(
    ws: &mut WebSocketStream<S>,
    code: CloseCode,
    reason: &str,
) -> WsResult {
    ws.send(Message::Close(Some(CloseFrame {
        code,
        reason: reason.into(),
    })))
    .await?;
    // Wait briefly for the peer's close reply so the close frame is not lost to a reset.
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        while let Some(Ok(_)) = ws.next().await {}
    })
    .await;
    Ok(())
}

async fn subscriber<S: AsyncRead + AsyncWrite + Unpin>(
    shared: &Shared,
    mut ws: WebSocketStream<S>,
    cursor: Option<u64>,
    faults: &Faults,
) -> WsResult {
    let log = &shared.log;
    let mut head_rx = log.subscribe();
    let mut stop = shared.stop.clone();
    let mut pos = match cursor {
        None => log.head(),
        Some(n) => {
            let head = log.head();
            let oldest = log.oldest();
            if n > head {
                ws.send(Message::Binary(error_frame(
                    "FutureCursor",
                    "cursor in the future",
                )))
                .await?;
                return close(&mut ws, CloseCode::Normal, "").await;
            }
            if n + 1 < oldest {
                ws.send(Message::Binary(info_frame(
                    "OutdatedCursor",
                    "requested cursor exceeded limit; possibly missing events",
                )))
                .await?;
                oldest - 1
            } else {
                n
            }
        }
    };
    let mut sent: usize = 0;
    let ping_every = shared.config.ping_interval.max(Duration::from_millis(10));
    let mut ping = tokio::time::interval_at(Instant::now() + ping_every, ping_every);
    let mut last_heard = Instant::now();
    loop {
        match log.read_after(pos, BATCH) {
            Read::Events(events, last) => {
                for frame in events {
                    if let Some(d) = faults.frame_delay {
                        // A slow relay: each frame goes out on its own after the delay.
                        ws.flush().await?;
                        tokio::select! {
                            _ = tokio::time::sleep(d) => {}
                            _ = stopped(&mut stop) => return close(&mut ws, CloseCode::Away, "relay shutting down").await,
                        }
                    }
                    if faults.drop_after == Some(sent) {
                        ws.flush().await?;
                        return Ok(()); // dropped: no close frame
                    }
                    if let Some((k, name)) = &faults.error_after {
                        if *k == sent {
                            ws.send(Message::Binary(error_frame(name, "injected fault")))
                                .await?;
                            return close(&mut ws, CloseCode::Normal, "").await;
                        }
                    }
                    ws.feed(Message::Binary(frame)).await?;
                    sent += 1;
                    shared.stats.frames_sent.fetch_add(1, Ordering::Relaxed);
                }
                ws.flush().await?;
                pos = last;
                let stopping = *stop.borrow();
                if stopping {
                    return close(&mut ws, CloseCode::Away, "relay shutting down").await;
                }
                continue;
            }
            Read::Behind(_) => {
                ws.send(Message::Binary(error_frame(
                    "ConsumerTooSlow",
                    "subscriber fell behind the relay's window",
                )))
                .await?;
                return close(&mut ws, CloseCode::Policy, "too slow").await;
            }
            Read::UpToDate => {}
        }
        tokio::select! {
            r = head_rx.changed() => { if r.is_err() { return Ok(()); } }
            msg = ws.next() => match msg {
                None | Some(Err(_)) | Some(Ok(Message::Close(_))) => return Ok(()),
                Some(Ok(_)) => last_heard = Instant::now(),
            },
            _ = ping.tick() => {
                if last_heard.elapsed() > ping_every * 3 {
                    return Ok(()); // idle peer: drop it
                }
                ws.send(Message::Ping(Bytes::new())).await?;
            }
            _ = stopped(&mut stop) => return close(&mut ws, CloseCode::Away, "relay shutting down").await,
        }
    }
}
