//! Jetstream (`/subscribe`) as a stream of typed events, per `shared/docs/jetstream-protocol.md`.
//!
//! Filters go in the query string (`wantedCollections`, `wantedDids`, repeated) and can be replaced
//! mid-stream with an `options_update` ([`OptionsSender`]); the latest filters are also used for
//! every reconnect. Long DID lists (more than [`URL_DIDS`]) are sent by `options_update` right after
//! connecting instead of in the URL, with `requireHello=true` so nothing unfiltered arrives first.
//! With a dictionary, `compress=true` is asked for and each binary message (one zstd frame) is
//! decompressed with it. The cursor is the last event's `time_us`; resuming replays from it
//! inclusive, so the event at the cursor comes again (at-least-once).

use std::sync::Arc;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;

use crate::session::{Session, Step};
use crate::{ClientConfig, ClientError, ClientStats};

/// The endpoint path.
pub const SUBSCRIBE: &str = "/subscribe";

/// DIDs beyond this many are sent in an `options_update` rather than the URL.
pub const URL_DIDS: usize = 100;

/// What to receive. Empty lists mean everything.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct JetstreamOptions {
    /// Exact NSIDs or `prefix.*` patterns.
    #[serde(rename = "wantedCollections")]
    pub wanted_collections: Vec<String>,
    /// DIDs.
    #[serde(rename = "wantedDids")]
    pub wanted_dids: Vec<String>,
    /// Skip events larger than this (0 = no limit).
    #[serde(rename = "maxMessageSizeBytes")]
    pub max_message_size_bytes: u64,
}

/// Jetstream client settings.
#[derive(Clone, Debug, Default)]
pub struct JetstreamConfig {
    /// Hosts, backoff, cursor store (the cursor is a `time_us`).
    pub client: ClientConfig,
    /// Initial filters.
    pub options: JetstreamOptions,
    /// The zstd dictionary (e.g. `legacy_subscribe.zdict`): asks for `compress=true`.
    pub dictionary: Option<Vec<u8>>,
    /// Ask for `requireHello=true` and send the filters as the hello.
    pub require_hello: bool,
}

/// A v1 `commit` object.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
pub struct CommitEvent {
    /// The commit's revision (TID).
    pub rev: String,
    /// `create`, `update` or `delete`.
    pub operation: String,
    /// The record's collection.
    pub collection: String,
    /// The record key.
    pub rkey: String,
    /// The record as atproto JSON (absent on delete).
    #[serde(default)]
    pub record: Option<serde_json::Value>,
    /// The record's CID (absent on delete).
    #[serde(default)]
    pub cid: Option<String>,
}

/// A v1 event (`{"did","time_us","cursor"?,"kind",…}`).
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
pub struct Event {
    /// The account.
    pub did: String,
    /// Server time in microseconds; the resume cursor.
    pub time_us: i64,
    /// The server's seq (v2 servers only).
    #[serde(default)]
    pub cursor: Option<u64>,
    /// `commit`, `identity` or `account`.
    pub kind: String,
    /// For `commit`.
    #[serde(default)]
    pub commit: Option<CommitEvent>,
    /// For `identity`: the upstream event (`did`, `handle`?, `seq`, `time`).
    #[serde(default)]
    pub identity: Option<serde_json::Value>,
    /// For `account`: the upstream event (`active`, `did`, `seq`, `status`?, `time`).
    #[serde(default)]
    pub account: Option<serde_json::Value>,
}

/// One Jetstream message.
#[derive(Clone, Debug)]
pub struct JetstreamEvent {
    /// The event's JSON as sent (decompressed when compressed).
    pub raw: Bytes,
    /// The parsed event.
    pub event: Event,
}

/// Sends `options_update` messages to a running [`JetstreamClient`].
#[derive(Clone, Debug)]
pub struct OptionsSender(mpsc::Sender<JetstreamOptions>);

impl OptionsSender {
    /// Replaces the whole filter (also for later reconnects). Errors when the client is gone.
    pub async fn update(&self, options: JetstreamOptions) -> Result<(), ClientError> {
        self.0.send(options).await.map_err(|_| ClientError::Closed)
    }
}

/// A reconnecting Jetstream consumer.
pub struct JetstreamClient {
    session: Session,
    options: JetstreamOptions,
    require_hello: bool,
    decompressor: Option<zstd::bulk::Decompressor<'static>>,
    updates_tx: mpsc::Sender<JetstreamOptions>,
    updates: mpsc::Receiver<JetstreamOptions>,
    max_bytes: usize,
    /// Messages in a row that did not decode, and the last one's reason.
    undecodable: (u32, String),
}

impl std::fmt::Debug for JetstreamClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JetstreamClient")
            .field("session", &self.session)
            .field("options", &self.options)
            .field("compressed", &self.decompressor.is_some())
            .finish_non_exhaustive()
    }
}

impl JetstreamClient {
    /// A client. Loads the stored cursor; prepares the zstd dictionary.
    pub fn new(config: JetstreamConfig) -> Result<JetstreamClient, ClientError> {
        let max_bytes = config.client.max_message_bytes;
        let session = Session::new(config.client, SUBSCRIBE)?;
        let decompressor = match &config.dictionary {
            Some(d) => Some({
                dictionary_id(d)?;
                zstd::bulk::Decompressor::with_dictionary(d)
                    .map_err(|e| ClientError::Dictionary(e.to_string()))?
            }),
            None => None,
        };
        let (updates_tx, updates) = mpsc::channel(16);
        Ok(JetstreamClient {
            session,
            options: config.options,
            require_hello: config.require_hello,
            decompressor,
            updates_tx,
            updates,
            max_bytes,
            undecodable: (0, String::new()),
        })
    }

    /// A handle that sends `options_update` messages.
    pub fn options_sender(&self) -> OptionsSender {
        OptionsSender(self.updates_tx.clone())
    }

    /// The live counters.
    pub fn stats(&self) -> Arc<ClientStats> {
        self.session.stats().clone()
    }

    /// The `time_us` the next connection resumes from.
    pub fn cursor(&self) -> Option<i64> {
        self.session.cursor()
    }

    /// Acknowledges a processed event's `time_us` (see [`crate::FirehoseClient::ack`]).
    pub fn ack(&mut self, time_us: i64) -> Result<(), ClientError> {
        self.session.ack(time_us)
    }

    /// Writes the last acknowledged cursor now.
    pub fn flush_cursor(&mut self) -> Result<(), ClientError> {
        self.session.flush()
    }

    fn hello_needed(&self) -> bool {
        hello_needed(&self.options, self.require_hello)
    }

    async fn send_options(&mut self) {
        let msg = serde_json::json!({"type": "options_update", "payload": &self.options});
        self.session.send(Message::text(msg.to_string())).await;
    }

    /// The next event. Waits through disconnects; never ends on its own. Messages that do not
    /// decode are counted and skipped (see [`JetstreamClient::next_checked`] to stop on them).
    pub async fn next(&mut self) -> JetstreamEvent {
        loop {
            if let Ok(e) = self.next_checked(0).await {
                return e;
            }
        }
    }

    /// The next event, or [`ClientError::Undecodable`] once `max_undecodable` messages in a row
    /// did not decode (0: never) — a wrong zstd dictionary, or a server that is not Jetstream,
    /// fails loudly instead of dropping every message. The count starts again after an error.
    /// With [`ClientConfig::give_up_on_permanent`], a permanent failure to connect (a 4xx, a host
    /// name that does not exist) is returned too ([`ClientError::Refused`],
    /// [`ClientError::UnknownHost`]).
    pub async fn next_checked(
        &mut self,
        max_undecodable: u32,
    ) -> Result<JetstreamEvent, ClientError> {
        loop {
            if max_undecodable > 0 && self.undecodable.0 >= max_undecodable {
                let (count, error) = std::mem::take(&mut self.undecodable);
                return Err(ClientError::Undecodable { count, error });
            }
            let step = {
                // Built only when the session connects, from the latest filters.
                let (options, compress) = (&self.options, self.decompressor.is_some());
                let hello = self.require_hello;
                let q = move |c: Option<i64>| query(options, compress, hello, c);
                tokio::select! {
                    biased;
                    Some(opts) = self.updates.recv() => Err(opts),
                    step = self.session.next(&q) => Ok(step),
                }
            };
            let msg = match step {
                Err(opts) => {
                    self.options = opts;
                    self.send_options().await;
                    continue;
                }
                Ok(Step::Connected) => {
                    if let Some(e) = self.session.permanent.take() {
                        return Err(e);
                    }
                    if self.hello_needed() {
                        self.send_options().await;
                    }
                    continue;
                }
                Ok(Step::Message(m)) => m,
            };
            let raw: Bytes = match msg {
                Message::Text(t) => {
                    self.session.stats().message(t.len());
                    t.into()
                }
                Message::Binary(b) => {
                    self.session.stats().message(b.len());
                    match self.decompress(&b) {
                        Ok(raw) => raw,
                        Err(e) => {
                            self.undecodable_message(e);
                            continue;
                        }
                    }
                }
                _ => continue,
            };
            match serde_json::from_slice::<Event>(&raw) {
                Ok(event) => {
                    self.session.seen(event.time_us);
                    self.undecodable.0 = 0;
                    return Ok(JetstreamEvent { raw, event });
                }
                Err(e) => self.undecodable_message(format!("not a Jetstream event: {e}")),
            }
        }
    }

    fn undecodable_message(&mut self, why: String) {
        self.session.stats().decode_error();
        if self.undecodable.0 == 0 {
            // The first of a run is said; the rest are counted (stats, and the run's length).
            tracing::warn!(host = self.session.host(), error = %why, "undecodable Jetstream message: skipped");
        }
        self.undecodable = (self.undecodable.0.saturating_add(1), why);
    }

    /// One zstd frame → JSON bytes, bounded by the frame's declared size and the message limit.
    fn decompress(&mut self, data: &[u8]) -> Result<Bytes, String> {
        let Some(d) = self.decompressor.as_mut() else {
            return Err("a binary message, but no zstd dictionary was given".into());
        };
        let cap = match zstd::zstd_safe::get_frame_content_size(data) {
            Ok(Some(n)) if (n as usize) <= self.max_bytes => n as usize,
            Ok(Some(n)) => return Err(format!("decompresses to {n} bytes, over the limit")),
            _ => self.max_bytes,
        };
        d.decompress(data, cap)
            .map(Bytes::from)
            .map_err(|e| format!("zstd with the given dictionary: {e}"))
    }
}

/// The id of a structured zstd dictionary (magic `37 A4 30 EC`, then the id), checked before
/// it is used: zstd would take any bytes as a raw-content dictionary, and every message would
/// then fail to decompress.
pub fn dictionary_id(bytes: &[u8]) -> Result<u32, ClientError> {
    match bytes {
        [0x37, 0xA4, 0x30, 0xEC, a, b, c, d, ..] => Ok(u32::from_le_bytes([*a, *b, *c, *d])),
        _ => Err(ClientError::Dictionary(
            "not a zstd dictionary (no 37 A4 30 EC magic)".into(),
        )),
    }
}

fn hello_needed(options: &JetstreamOptions, require_hello: bool) -> bool {
    require_hello || options.wanted_dids.len() > URL_DIDS
}

/// The query string (without `?`) of a connection with these filters, resuming at `cursor`.
fn query(
    options: &JetstreamOptions,
    compress: bool,
    require_hello: bool,
    cursor: Option<i64>,
) -> String {
    let mut q: Vec<String> = Vec::new();
    for c in &options.wanted_collections {
        q.push(format!("wantedCollections={}", encode(c)));
    }
    if options.wanted_dids.len() <= URL_DIDS {
        for d in &options.wanted_dids {
            q.push(format!("wantedDids={}", encode(d)));
        }
    }
    if options.max_message_size_bytes > 0 {
        q.push(format!(
            "maxMessageSizeBytes={}",
            options.max_message_size_bytes
        ));
    }
    if let Some(c) = cursor {
        q.push(format!("cursor={c}"));
    }
    if compress {
        q.push("compress=true".into());
    }
    if hello_needed(options, require_hello) {
        q.push("requireHello=true".into());
    }
    q.join("&")
}

/// Percent-encodes a query value (NSIDs and DIDs need only `:` kept and `%`, `&`, `+`, `#`, ` `
/// escaped; everything outside unreserved characters and `:` is escaped).
pub(crate) fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~' | b':' | b'*') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
