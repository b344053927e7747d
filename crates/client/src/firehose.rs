//! The relay firehose (`com.atproto.sync.subscribeRepos`) as a stream of frames.
//!
//! Zero copy: each binary WebSocket message reaches the caller as the `bytes::Bytes` tungstenite
//! produced; nothing in this crate copies frame bytes. How that was checked (tungstenite 0.29.0
//! and bytes 1.12 source): tokio-tungstenite's `AllowStd::read` polls the socket straight into
//! the slice it is given; `FrameCodec::read_in` (`protocol/frame/mod.rs`) gives it the spare
//! capacity of one `BytesMut` read buffer, and `read_frame` takes each frame's payload with
//! `split_to(len).freeze()` — a reference-counted view, no copy (client-bound frames are not
//! masked, so nothing is rewritten); `WebSocketContext::read_message` (`protocol/mod.rs`) wraps an
//! unfragmented binary payload as `Message::Binary(payload)` unchanged; this module moves that
//! `Bytes` into [`FirehoseEvent::bytes`], and [`FirehoseEvent::decode`] hands the same memory to
//! [`FrameDecoder`] as a slice (`grep` for `to_vec`, `copy_from_slice`, `Bytes::from` in `src/`:
//! only a unit test and Jetstream's zstd output). Two caveats, both tungstenite's: when a frame
//! straddles two socket reads and the read buffer must grow while earlier frames still share it,
//! `BytesMut::reserve` moves the part of that frame already read into the new buffer (at most
//! one partial frame per read); and fragmented messages, which relays do not send, are
//! concatenated. The test `frames_are_slices_of_the_socket_read_buffer` (tests/firehose.rs)
//! checks the path end to end over a real socket by pointer (consecutive frames from one read
//! sit exactly one WebSocket header apart), `event_bytes_are_the_message_bytes` the last step.
//!
//! The client reads only each frame's header and payload (not its CAR) to learn kind and seq.

use riptide_throttle::{Say, Throttle};
use std::sync::Arc;

use bytes::Bytes;
use riptide_cbor::Arena;
use riptide_firehose::verify::peek;
use riptide_firehose::{Body, Frame, FrameDecoder, FrameError};
use tokio_tungstenite::tungstenite::Message;

use crate::session::{Session, Step};
use crate::{ClientConfig, ClientError, ClientStats};

/// The endpoint path.
pub const SUBSCRIBE_REPOS: &str = "/xrpc/com.atproto.sync.subscribeRepos";

/// What a frame is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FrameKind {
    /// `#commit`.
    Commit,
    /// `#sync`.
    Sync,
    /// `#identity`.
    Identity,
    /// `#account`.
    Account,
    /// `#info` (e.g. `OutdatedCursor`): see [`FirehoseEvent::notice`].
    Info,
    /// An error frame (e.g. `FutureCursor`, `ConsumerTooSlow`); the relay closes after it and the
    /// client reconnects. See [`FirehoseEvent::notice`].
    Error,
    /// A message type this version does not know.
    Unknown,
    /// Not a frame (header or payload does not decode); counted in `decode_errors`.
    Invalid,
}

impl FrameKind {
    fn of(kind: &str) -> FrameKind {
        match kind {
            "commit" => FrameKind::Commit,
            "sync" => FrameKind::Sync,
            "identity" => FrameKind::Identity,
            "account" => FrameKind::Account,
            "info" => FrameKind::Info,
            "error" => FrameKind::Error,
            "unknown" => FrameKind::Unknown,
            _ => FrameKind::Invalid,
        }
    }

    /// `commit`, `sync`, `identity`, `account`, `info`, `error`, `unknown` or `invalid`.
    pub fn as_str(self) -> &'static str {
        match self {
            FrameKind::Commit => "commit",
            FrameKind::Sync => "sync",
            FrameKind::Identity => "identity",
            FrameKind::Account => "account",
            FrameKind::Info => "info",
            FrameKind::Error => "error",
            FrameKind::Unknown => "unknown",
            FrameKind::Invalid => "invalid",
        }
    }
}

/// An `#info` name or error frame's `error`, with its message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Notice {
    /// `OutdatedCursor`, `FutureCursor`, `ConsumerTooSlow`, …
    pub name: String,
    /// The human-readable message, if any.
    pub message: Option<String>,
}

impl Notice {
    /// Whether this error frame says something waiting will not change: `FutureCursor` (the
    /// cursor asked for is past the relay's newest event; asking again asks the same). The
    /// others are transient: `ConsumerTooSlow` (the relay dropped us; reconnecting resumes
    /// where we were), and any name this version does not know (the relay closes after an
    /// error frame; the reconnect gets backoff).
    pub fn is_permanent(&self) -> bool {
        self.name == "FutureCursor"
    }
}

/// One message of the firehose.
#[derive(Clone, Debug)]
pub struct FirehoseEvent {
    /// The relay's seq (commit, sync, identity, account).
    pub seq: Option<i64>,
    /// What the frame is.
    pub kind: FrameKind,
    /// The message exactly as received (shared, not copied).
    pub bytes: Bytes,
    /// For [`FrameKind::Info`] and [`FrameKind::Error`].
    pub notice: Option<Notice>,
    /// Index in [`ClientConfig::hosts`] of the host it came from.
    pub host: usize,
    /// Which connection of this client it came on (1 for the first; each reconnect adds one).
    /// A relay's seqs increase within a connection; across connections they may repeat.
    pub connection: u64,
}

impl FirehoseEvent {
    /// The full decoded view (header, payload, CAR with block CIDs checked per the decoder's
    /// options).
    pub fn decode<'d>(&'d self, decoder: &'d mut FrameDecoder) -> Result<Frame<'d>, FrameError> {
        decoder.decode(&self.bytes)
    }
}

/// The warning for text messages on the firehose (see [`FirehoseClient::next`]).
static TEXT: std::sync::LazyLock<Throttle> = std::sync::LazyLock::new(Throttle::default);

/// Text messages in a row after which [`FirehoseClient::next_checked`], giving up on permanent
/// failures, ends: a relay sends binary frames only, so a server that sends text (a Jetstream
/// URL given as a relay) will not start sending frames by waiting.
const MAX_TEXT_IN_ROW: u32 = 5;

/// A reconnecting firehose consumer. See the crate docs for the delivery guarantees.
#[derive(Debug)]
pub struct FirehoseClient {
    session: Session,
    arena: Arena,
    notice_decoder: Option<FrameDecoder>,
    /// Text messages since the last binary frame.
    text_in_row: u32,
}

impl FirehoseClient {
    /// A client for these hosts and settings. Loads the stored cursor (the resume point).
    pub fn new(config: ClientConfig) -> Result<FirehoseClient, ClientError> {
        let mut session = Session::new(config, SUBSCRIBE_REPOS)?;
        session.skip_oversized();
        Ok(FirehoseClient {
            session,
            arena: Arena::new(),
            notice_decoder: None,
            text_in_row: 0,
        })
    }

    /// The live counters (shareable with another task).
    pub fn stats(&self) -> Arc<ClientStats> {
        self.session.stats().clone()
    }

    /// The seq the next connection resumes after.
    pub fn cursor(&self) -> Option<i64> {
        self.session.cursor()
    }

    /// The host of the current (or last) connection.
    pub fn host(&self) -> &str {
        self.session.host()
    }

    /// Makes the next connection resume after `cursor` (`None`: live), whatever was delivered
    /// before: for a consumer that finds its cursor unreachable (`riptide serve`'s upstream, when
    /// the relay keeps answering `FutureCursor`). The current connection, if any, is not closed.
    pub fn resume_from(&mut self, cursor: Option<i64>) {
        self.session.resume_from(cursor);
    }

    /// Acknowledges that the event with this seq has been processed: a restart resumes after it.
    /// Written to the cursor store at most every [`ClientConfig::persist_every`].
    pub fn ack(&mut self, seq: i64) -> Result<(), ClientError> {
        self.session.ack(seq)
    }

    /// Writes the last acknowledged seq to the cursor store now (call before exiting).
    pub fn flush_cursor(&mut self) -> Result<(), ClientError> {
        self.session.flush()
    }

    /// The next event. Waits through disconnects (reconnecting with backoff and host rotation);
    /// never ends on its own. (With [`ClientConfig::give_up_on_permanent`], use
    /// [`FirehoseClient::next_checked`]: here a permanent failure is passed over and retried.)
    pub async fn next(&mut self) -> FirehoseEvent {
        loop {
            if let Ok(e) = self.next_checked().await {
                return e;
            }
        }
    }

    /// [`FirehoseClient::next`], ending with the error on a permanent failure when
    /// [`ClientConfig::give_up_on_permanent`] is set: a connection the relay refuses with a 4xx
    /// ([`ClientError::Refused`]), a host name that does not exist
    /// ([`ClientError::UnknownHost`]), or an error frame that waiting will not change
    /// ([`Notice::is_permanent`]: `FutureCursor`, as [`ClientError::Relay`]), or
    /// five text messages in a row ([`ClientError::Undecodable`]: not a relay).
    /// Other error frames are delivered as events, as without it. Without the setting, never an
    /// error.
    pub async fn next_checked(&mut self) -> Result<FirehoseEvent, ClientError> {
        let query = |c: Option<i64>| c.map(|c| format!("cursor={c}")).unwrap_or_default();
        loop {
            let msg = match self.session.next(&query).await {
                Step::Connected => {
                    if let Some(e) = self.session.permanent.take() {
                        return Err(e);
                    }
                    continue;
                }
                Step::Message(m) => m,
            };
            let bytes = match msg {
                Message::Binary(b) => b,
                other => {
                    // Relays send binary frames only: count it, say it (a few times, then a
                    // summary a minute: a Jetstream URL sends nothing else), and go on.
                    self.session.stats().message(other.len());
                    self.session.stats().text_message();
                    self.text_in_row += 1;
                    if self.session.give_up {
                        // Said once, by whoever gets the error, not per message.
                        if self.text_in_row >= MAX_TEXT_IN_ROW {
                            let count = std::mem::take(&mut self.text_in_row);
                            return Err(ClientError::Undecodable {
                                count,
                                error: "a text message, where relays send binary frames only \
                                        (is this a Jetstream URL?)"
                                    .to_owned(),
                            });
                        }
                        continue;
                    }
                    match TEXT.say("text") {
                        Say::Quiet => {}
                        Say::Full => tracing::warn!(
                            host = self.session.host(),
                            len = other.len(),
                            after = ?self.session.cursor(),
                            "text message on the firehose: skipped (relays send binary frames; is this a Jetstream URL?)"
                        ),
                        Say::Summary { suppressed, total } => tracing::warn!(
                            host = self.session.host(),
                            "text messages on the firehose: {suppressed} more skipped since the last line, {total} in all"
                        ),
                    }
                    continue;
                }
            };
            self.session.stats().message(bytes.len());
            self.text_in_row = 0;
            let event = self.event(bytes);
            if let Some(n) = event.notice.as_ref().filter(|n| {
                self.session.give_up && event.kind == FrameKind::Error && n.is_permanent()
            }) {
                return Err(ClientError::Relay {
                    name: n.name.clone(),
                    message: n.message.clone().unwrap_or_default(),
                });
            }
            return Ok(event);
        }
    }

    /// The events as a `futures` stream (for combinators); acknowledging then needs
    /// [`FirehoseClient::ack`] on the client, so prefer [`FirehoseClient::next`] when persisting.
    pub fn into_stream(self) -> impl futures_util::Stream<Item = FirehoseEvent> {
        futures_util::stream::unfold(self, |mut c| async move {
            let e = c.next().await;
            Some((e, c))
        })
    }

    fn event(&mut self, bytes: Bytes) -> FirehoseEvent {
        let p = peek(&mut self.arena, &bytes);
        let kind = FrameKind::of(p.kind);
        let seq = p.seq;
        let notice = match kind {
            FrameKind::Info | FrameKind::Error => {
                let d = self.notice_decoder.get_or_insert_with(FrameDecoder::new);
                match d.decode(&bytes).map(|f| *f.body()) {
                    Ok(Body::Info(i)) => Some(Notice {
                        name: i.name.into(),
                        message: i.message.map(Into::into),
                    }),
                    Ok(Body::Error(e)) => Some(Notice {
                        name: e.error.into(),
                        message: e.message.map(Into::into),
                    }),
                    _ => None,
                }
            }
            _ => None,
        };
        if kind == FrameKind::Invalid {
            self.session.stats().decode_error();
        }
        // Only a seq a relay could honour becomes the resume point: a negative one (a relay's
        // bug or a forgery) is refused by every consumer, and resuming from `cursor=-7` asks the
        // relay for its whole window again, or for nothing.
        if let Some(s) = seq.filter(|&s| {
            s >= 0
                && !matches!(
                    kind,
                    FrameKind::Invalid | FrameKind::Info | FrameKind::Error
                )
        }) {
            self.session.seen(s);
        }
        FirehoseEvent {
            seq,
            kind,
            bytes,
            notice,
            host: self.session.host_index(),
            connection: self.session.stats().connects(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_bytes_are_the_message_bytes() {
        let mut c = FirehoseClient::new(ClientConfig::with_hosts(["ws://127.0.0.1:9"])).unwrap();
        let frame = Bytes::from(riptide_cbor_info());
        let ptr = frame.as_ptr();
        let e = c.event(frame);
        assert_eq!(e.bytes.as_ptr(), ptr);
        assert_eq!(e.kind, FrameKind::Info);
        assert_eq!(e.notice.unwrap().name, "OutdatedCursor");
    }

    /// An `#account` frame with this seq.
    fn account_with_seq(seq: i64) -> Vec<u8> {
        use riptide_cbor::{write_bool, write_int, write_map_header, write_text};
        let mut out = Vec::new();
        riptide_firehose::encode::write_message_header(&mut out, "#account");
        write_map_header(&mut out, 4);
        write_text(&mut out, "did");
        write_text(&mut out, "did:plc:abc");
        write_text(&mut out, "seq");
        write_int(&mut out, seq);
        write_text(&mut out, "time");
        write_text(&mut out, "2026-11-28T08:00:00.000Z");
        write_text(&mut out, "active");
        write_bool(&mut out, true);
        out
    }

    /// Issue 40: a frame with `seq: -7` became the resume point, and the next connection asked
    /// for `cursor=-7`. A negative seq is delivered (for the caller to refuse and count) but is
    /// never resumed from.
    #[test]
    fn a_negative_seq_is_never_the_resume_point() {
        let cfg = ClientConfig {
            start_cursor: Some(10),
            ..ClientConfig::with_hosts(["ws://127.0.0.1:9"])
        };
        let mut c = FirehoseClient::new(cfg).unwrap();
        let e = c.event(Bytes::from(account_with_seq(12)));
        assert_eq!(e.seq, Some(12));
        assert_eq!(c.cursor(), Some(12));
        let e = c.event(Bytes::from(account_with_seq(-7)));
        assert_eq!(e.seq, Some(-7), "delivered as it came");
        assert_eq!(c.cursor(), Some(12), "not the resume point");
        c.resume_from(Some(5));
        assert_eq!(c.cursor(), Some(5));
        c.resume_from(None);
        assert_eq!(c.cursor(), None);
    }

    fn riptide_cbor_info() -> Vec<u8> {
        use riptide_cbor::{write_map_header, write_text};
        let mut out = Vec::new();
        riptide_firehose::encode::write_message_header(&mut out, "#info");
        write_map_header(&mut out, 1);
        write_text(&mut out, "name");
        write_text(&mut out, "OutdatedCursor");
        out
    }
}
