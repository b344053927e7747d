//! Jetstream v2 (`/xrpc/network.bsky.jetstream.subscribeEvents`) as a stream of typed messages,
//! per the lexicon (`shared/corpus/jetstream-v2/lexicons/`, summarised in protocol §6.2).
//!
//! Why beside [`crate::JetstreamClient`] and not inside it: v2 changes everything the client
//! does on the wire. The filters are `kinds`, `dids`, `collections` (fixed for the connection:
//! v2 is server-push only, so there is no `options_update`); every frame is an `xrpc.v1.json`
//! envelope (`{"$type":"message","payload":…}` or a terminal `{"$type":"error",…}`); the cursor
//! is the message `seq` (inclusive), and compression is `zstdDictionary=<id>` with the id read
//! from the dictionary's header. Only the connection (hosts, backoff, idle detection, cursor
//! store) is shared, through the same session.
//!
//! **Exactly once within a process.** A reconnect resumes at the last delivered seq, which the
//! server sends again (inclusive): the client drops every message whose seq is at or below the
//! last delivered one. Across processes, delivery is at-least-once, from the last acknowledged
//! seq (as for v1).
//!
//! **Errors.** A terminal error frame (`ConsumerTooSlow`) is counted and the connection resumed
//! from the cursor. A pre-upgrade 4xx (`InvalidRequest`, `CursorTooOld`,
//! `UnknownZstdDictionary`) is the request's own fault and is returned to the caller as
//! [`ClientError::Refused`] instead of being retried forever. `#info` messages (no seq) are
//! delivered and do not move the cursor.
//!
//! **The dictionary.** [`fetch_dictionary`] downloads the server's own dictionary from
//! `getZstdDictionary` on the same host, as Jetstream's SDK does before it connects with
//! `zstdDictionary=<id>`: a client need not ship a copy (`riptide tail --compress`, Python's
//! `riptide.Jetstream(…, compress=True)`).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde::Deserialize;
use tokio_tungstenite::tungstenite::Message;

use crate::session::{endpoint_url, refusal, unknown_host, Session, Step};
use crate::{ClientConfig, ClientError, ClientStats};

/// The endpoint path.
pub const SUBSCRIBE_EVENTS: &str = "/xrpc/network.bsky.jetstream.subscribeEvents";
/// The dictionary download's path.
pub const GET_ZSTD_DICTIONARY: &str = "/xrpc/network.bsky.jetstream.getZstdDictionary";
/// Largest dictionary accepted from `getZstdDictionary` (Jetstream v2's is 64 KiB).
pub const MAX_DICTIONARY_BYTES: usize = 4 << 20;
/// The subprotocol offered.
pub const SUBPROTOCOL: &str = "xrpc.v1.json";
/// The message `$type` prefix (`…#commit`).
pub const NSID: &str = "network.bsky.jetstream.subscribeEvents";

/// What to receive (ANDed; empty lists mean everything).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct V2Filter {
    /// `commit`, `identity`, `account`, `sync` (at most 4).
    pub kinds: Vec<String>,
    /// DIDs (at most 10,000; they all go in the URL).
    pub dids: Vec<String>,
    /// NSIDs or `prefix.*` (at most 100; commits only).
    pub collections: Vec<String>,
    /// Skip frames larger than this (0 = no limit).
    pub max_message_size_bytes: u32,
}

/// v2 client settings.
#[derive(Clone, Debug, Default)]
pub struct JetstreamV2Config {
    /// Hosts (base URL, or the full endpoint URL), backoff, cursor store (the cursor is a seq).
    pub client: ClientConfig,
    /// The filters.
    pub filter: V2Filter,
    /// A zstd dictionary (`getZstdDictionary`): connect with `zstdDictionary=<its id>`.
    pub dictionary: Option<Vec<u8>>,
}

/// One message payload, every field optional: which are present depends on its `$type`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct V2Payload {
    /// `network.bsky.jetstream.subscribeEvents#commit` etc.
    #[serde(rename = "$type")]
    pub ty: String,
    /// The server's seq (absent on `#info`).
    pub seq: Option<u64>,
    /// The account.
    pub did: Option<String>,
    /// RFC 3339, microseconds.
    pub time: Option<String>,
    /// `#commit`: the revision.
    pub rev: Option<String>,
    /// `#commit`: `create`, `update` or `delete`.
    pub operation: Option<String>,
    /// `#commit`: the collection.
    pub collection: Option<String>,
    /// `#commit`: the record key.
    pub rkey: Option<String>,
    /// `#commit`: the record (absent on delete).
    pub record: Option<serde_json::Value>,
    /// `#commit`: the record's CID (absent on delete).
    pub cid: Option<String>,
    /// `#identity`: the upstream event.
    pub identity: Option<serde_json::Value>,
    /// `#account`: the upstream event.
    pub account: Option<serde_json::Value>,
    /// `#sync`: the upstream event.
    pub sync: Option<serde_json::Value>,
    /// `#info`: its name (`OutdatedCursor`).
    pub name: Option<String>,
    /// `#info`: its message.
    pub message: Option<String>,
}

impl V2Payload {
    /// `commit`, `identity`, `account`, `sync`, `info` (the `$type` fragment).
    pub fn kind(&self) -> &str {
        self.ty.rsplit_once('#').map_or("", |(_, k)| k)
    }
}

#[derive(Deserialize)]
struct Frame {
    #[serde(rename = "$type")]
    ty: String,
    payload: Option<V2Payload>,
    error: Option<String>,
    message: Option<String>,
}

/// One v2 message.
#[derive(Clone, Debug)]
pub struct V2Message {
    /// The frame's JSON as sent (decompressed when compressed), envelope included.
    pub raw: Bytes,
    /// The payload.
    pub payload: V2Payload,
}

/// A reconnecting Jetstream v2 consumer.
pub struct JetstreamV2Client {
    session: Session,
    filter: V2Filter,
    dictionary_id: Option<u32>,
    decompressor: Option<zstd::bulk::Decompressor<'static>>,
    max_bytes: usize,
    /// The last seq delivered (messages at or below it are dropped: module docs).
    last: Option<u64>,
}

impl std::fmt::Debug for JetstreamV2Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JetstreamV2Client")
            .field("session", &self.session)
            .field("filter", &self.filter)
            .field("dictionary_id", &self.dictionary_id)
            .finish_non_exhaustive()
    }
}

impl JetstreamV2Client {
    /// A client. Loads the stored cursor; reads the dictionary's id.
    pub fn new(config: JetstreamV2Config) -> Result<JetstreamV2Client, ClientError> {
        let max_bytes = config.client.max_message_bytes;
        let mut session = Session::new(config.client, SUBSCRIBE_EVENTS)?;
        session.subprotocol = Some(SUBPROTOCOL);
        session.give_up = true;
        let (dictionary_id, decompressor) = match &config.dictionary {
            Some(d) => {
                if d.len() < 8 || d[..4] != [0x37, 0xA4, 0x30, 0xEC] {
                    return Err(ClientError::Dictionary(
                        "not a zstd dictionary (no 37 A4 30 EC magic)".into(),
                    ));
                }
                let id = u32::from_le_bytes([d[4], d[5], d[6], d[7]]);
                let dec = zstd::bulk::Decompressor::with_dictionary(d)
                    .map_err(|e| ClientError::Dictionary(e.to_string()))?;
                (Some(id), Some(dec))
            }
            None => (None, None),
        };
        let last = session.cursor().and_then(|c| u64::try_from(c).ok());
        Ok(JetstreamV2Client {
            session,
            filter: config.filter,
            dictionary_id,
            decompressor,
            max_bytes,
            // A stored cursor is where to resume (inclusive): that seq itself is delivered.
            last: last.map(|c| c.saturating_sub(1)),
        })
    }

    /// The live counters.
    pub fn stats(&self) -> Arc<ClientStats> {
        self.session.stats().clone()
    }

    /// The seq the next connection resumes from (inclusive).
    pub fn cursor(&self) -> Option<i64> {
        self.session.cursor()
    }

    /// Acknowledges a processed message's seq (see [`crate::FirehoseClient::ack`]).
    pub fn ack(&mut self, seq: u64) -> Result<(), ClientError> {
        self.session.ack(seq as i64)
    }

    /// Writes the last acknowledged cursor now.
    pub fn flush_cursor(&mut self) -> Result<(), ClientError> {
        self.session.flush()
    }

    /// The next message. Waits through disconnects and terminal error frames; returns an error
    /// only when the server refuses the request itself (a 4xx before the upgrade).
    pub async fn next(&mut self) -> Result<V2Message, ClientError> {
        loop {
            let step = {
                let (f, z) = (&self.filter, self.dictionary_id);
                let q = move |c: Option<i64>| query(f, z, c);
                self.session.next(&q).await
            };
            let msg = match step {
                Step::Connected => {
                    if let Some(e) = self.session.permanent.take() {
                        return Err(e);
                    }
                    continue;
                }
                Step::Message(m) => m,
            };
            let raw: Bytes = match msg {
                Message::Text(t) => {
                    self.session.stats().message(t.len());
                    t.into()
                }
                Message::Binary(b) => {
                    self.session.stats().message(b.len());
                    match self.decompress(&b) {
                        Some(raw) => raw,
                        None => {
                            self.session.stats().decode_error();
                            continue;
                        }
                    }
                }
                _ => continue,
            };
            let frame: Frame = match serde_json::from_slice(&raw) {
                Ok(f) => f,
                Err(e) => {
                    tracing::debug!(error = %e, "undecodable subscribeEvents frame");
                    self.session.stats().decode_error();
                    continue;
                }
            };
            match (frame.ty.as_str(), frame.payload) {
                ("message", Some(payload)) => {
                    if let Some(seq) = payload.seq {
                        if self.last.is_some_and(|l| seq <= l) {
                            continue;
                        }
                        self.last = Some(seq);
                        self.session.seen(seq as i64);
                    }
                    return Ok(V2Message { raw, payload });
                }
                ("error", _) => {
                    let e = frame.error.unwrap_or_default();
                    tracing::info!(error = %e, message = ?frame.message, "subscribeEvents error frame; resuming");
                    self.session.stats().decode_error();
                    self.session.disconnected("error frame");
                }
                _ => self.session.stats().decode_error(),
            }
        }
    }

    /// One zstd frame → JSON bytes, bounded by the frame's declared size and the message limit.
    fn decompress(&mut self, data: &[u8]) -> Option<Bytes> {
        let d = self.decompressor.as_mut()?;
        let cap = match zstd::zstd_safe::get_frame_content_size(data) {
            Ok(Some(n)) if (n as usize) <= self.max_bytes => n as usize,
            Ok(Some(_)) => return None,
            _ => self.max_bytes,
        };
        d.decompress(data, cap).ok().map(Bytes::from)
    }
}

/// The `getZstdDictionary` URL of a host given as [`ClientConfig::hosts`] takes it (a base URL or
/// the `subscribeEvents` URL): `ws`/`wss` become `http`/`https`, the path is replaced.
pub fn dictionary_url(host: &str) -> Result<String, ClientError> {
    let ws = endpoint_url(host, SUBSCRIBE_EVENTS)?;
    let bad = || ClientError::InvalidUrl(host.to_string());
    let uri: tokio_tungstenite::tungstenite::http::Uri = ws.parse().map_err(|_| bad())?;
    let scheme = if uri.scheme_str() == Some("wss") {
        "https"
    } else {
        "http"
    };
    let authority = uri.authority().ok_or_else(bad)?;
    Ok(format!("{scheme}://{authority}{GET_ZSTD_DICTIONARY}"))
}

/// Downloads the server's zstd dictionary (`getZstdDictionary` on `host`, see
/// [`dictionary_url`]), checked to be a zstd dictionary; `Ok(None)` when the server has none (404
/// `DictionaryNotFound`: connect uncompressed, as Jetstream's SDK does). The errors follow the
/// stream's split (`session` module docs): a 4xx other than 408/429 is [`ClientError::Refused`]
/// with the server's reason, a host name that does not exist [`ClientError::UnknownHost`], both
/// permanent; the network, a timeout, a 5xx, 408 or 429 are [`ClientError::Unreachable`]
/// (transient: try again). One attempt, within `timeout`.
pub async fn fetch_dictionary(
    host: &str,
    timeout: Duration,
) -> Result<Option<Vec<u8>>, ClientError> {
    let url = dictionary_url(host)?;
    let unreachable = |reason: String| ClientError::Unreachable {
        url: url.clone(),
        reason,
    };
    let failed = |e: reqwest::Error| match error_sources(&e)
        .find_map(|s| s.downcast_ref::<std::io::Error>().and_then(unknown_host))
    {
        Some(reason) => ClientError::UnknownHost {
            url: url.clone(),
            reason,
        },
        None => unreachable(error_chain(&e)),
    };
    let http = reqwest::Client::builder()
        .timeout(timeout)
        .redirect(reqwest::redirect::Policy::limited(3))
        .build()
        .map_err(|e| unreachable(error_chain(&e)))?;
    let mut resp = http.get(&url).send().await.map_err(failed)?;
    let status = resp.status().as_u16();
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(failed)? {
        if body.len() + chunk.len() > MAX_DICTIONARY_BYTES {
            return Err(ClientError::Dictionary(format!(
                "{url}: larger than {MAX_DICTIONARY_BYTES} bytes"
            )));
        }
        body.extend_from_slice(&chunk);
    }
    match status {
        200 => {
            crate::jetstream::dictionary_id(&body)
                .map_err(|e| ClientError::Dictionary(format!("{url}: {e}")))?;
            Ok(Some(body))
        }
        408 | 429 => Err(unreachable(format!("HTTP {status}"))),
        400..=499 => match refusal(status, &String::from_utf8_lossy(&body)) {
            ClientError::Refused {
                status: 404, error, ..
            } if error == "DictionaryNotFound" => Ok(None),
            e => Err(e),
        },
        _ => Err(unreachable(format!("HTTP {status}"))),
    }
}

/// An error and its sources, outermost first.
fn error_sources<'e>(
    e: &'e (dyn std::error::Error + 'static),
) -> impl Iterator<Item = &'e (dyn std::error::Error + 'static)> {
    std::iter::successors(Some(e), |e| e.source())
}

/// An error's message with its sources' (reqwest's own says only "error sending request").
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = String::new();
    for s in error_sources(e) {
        let t = s.to_string();
        if !out.contains(&t) {
            if !out.is_empty() {
                out.push_str(": ");
            }
            out.push_str(&t);
        }
    }
    out
}

/// The query string (without `?`) of a connection with these filters, resuming at `cursor`.
fn query(f: &V2Filter, dictionary: Option<u32>, cursor: Option<i64>) -> String {
    let mut q: Vec<String> = Vec::new();
    for k in &f.kinds {
        q.push(format!("kinds={}", crate::jetstream::encode(k)));
    }
    for d in &f.dids {
        q.push(format!("dids={}", crate::jetstream::encode(d)));
    }
    for c in &f.collections {
        q.push(format!("collections={}", crate::jetstream::encode(c)));
    }
    if f.max_message_size_bytes > 0 {
        q.push(format!("maxMessageSizeBytes={}", f.max_message_size_bytes));
    }
    if let Some(c) = cursor {
        q.push(format!("cursor={c}"));
    }
    if let Some(id) = dictionary {
        q.push(format!("zstdDictionary={id}"));
    }
    q.join("&")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dictionary_urls() {
        let d = "/xrpc/network.bsky.jetstream.getZstdDictionary";
        for (host, url) in [
            (
                "wss://jetstream.example",
                format!("https://jetstream.example{d}"),
            ),
            (
                "ws://127.0.0.1:6008/xrpc/network.bsky.jetstream.subscribeEvents?kinds=commit",
                format!("http://127.0.0.1:6008{d}"),
            ),
            ("127.0.0.1:9", format!("http://127.0.0.1:9{d}")),
        ] {
            assert_eq!(dictionary_url(host).unwrap(), url, "{host}");
        }
        assert!(matches!(
            dictionary_url("ftp://h"),
            Err(ClientError::InvalidUrl(_))
        ));
    }

    #[test]
    fn queries_and_refusals() {
        let f = V2Filter {
            kinds: vec!["commit".into()],
            dids: vec!["did:plc:a".into()],
            collections: vec!["app.bsky.feed.*".into()],
            max_message_size_bytes: 9,
        };
        assert_eq!(
            query(&f, Some(20260811), Some(5)),
            "kinds=commit&dids=did:plc:a&collections=app.bsky.feed.*&maxMessageSizeBytes=9&cursor=5&zstdDictionary=20260811"
        );
        assert_eq!(query(&V2Filter::default(), None, None), "");
        match refusal(400, r#"{"error":"CursorTooOld","message":"floor 51"}"#) {
            ClientError::Refused {
                status: 400,
                error,
                message,
            } => assert_eq!(
                (error.as_str(), message.as_str()),
                ("CursorTooOld", "floor 51")
            ),
            e => panic!("{e:?}"),
        }
        let p: V2Payload = serde_json::from_str(
            r##"{"$type":"network.bsky.jetstream.subscribeEvents#info","name":"OutdatedCursor"}"##,
        )
        .unwrap();
        assert_eq!((p.kind(), p.seq), ("info", None));
    }
}
