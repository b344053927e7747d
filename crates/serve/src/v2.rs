//! Jetstream v2's live wire, beside the frozen v1 `/subscribe`:
//! `GET /xrpc/network.bsky.jetstream.subscribeEvents` and
//! `GET /xrpc/network.bsky.jetstream.getZstdDictionary` (the lexicons in
//! `shared/corpus/jetstream-v2/lexicons/` are the contract; protocol §6.2 summarises them).
//!
//! Why a module of its own: the v2 endpoint reads the same [`Log`](crate::Log) as `/subscribe`,
//! at the same seqs, in the same subscriber loop (`server::stream`: reads, writer deadlines,
//! slow-consumer rule, keepalive), but everything a client sees differs: the query parameters, the pre-upgrade
//! errors (an XRPC JSON envelope, `{"error","message"}`), the framing and the compression. Those
//! differences live here, so `/subscribe` stays byte for byte what it was.
//!
//! **Frames.** Every frame is one JSON object (atproto proposal 0015, subprotocol
//! `xrpc.v1.json`, echoed when offered): `{"$type":"message","payload":{"$type":
//! "network.bsky.jetstream.subscribeEvents#commit",…}}` or a terminal
//! `{"$type":"error","error":"ConsumerTooSlow","message":…}`. A frame is derived from the stored
//! v1 event, not re-rendered from CBOR: the v1 JSON is `{"did","time_us","cursor","kind",<kind>}`
//! with a fixed prefix (checked against the event's own fields: `V1Parts`), so the v2 payload is
//! `seq`, `did`, `time` (the same `time_us`, as RFC 3339 with six fractional digits) followed by
//! the commit's fields (flat) or `"identity"|"account"|"sync":<the same object>`. `seq` is the
//! v1 `cursor`: one number per event on both wires. The records, CIDs and upstream objects are
//! the very bytes v1 sends.
//!
//! **Frames are made once.** An event's frame is made when it enters the in-memory tail
//! (`log.rs`, [`Event::with_v2_frame`]), so replay and fan-out from memory send shared bytes, as
//! v1 sends the stored JSON. Events read back from the store are made into frames as they are
//! sent, cheaply: fixed ASCII pieces and the `time` around three slices of the stored JSON (its
//! `"did":"…"`, its `cursor` digits, the kind's object), which is known to be UTF-8
//! ([`Event::text`]), written into one allocation of exactly its size and handed to the socket
//! without another (`server::Writer::run`), with the `time` of the last second remembered per
//! subscriber ([`TimeFormat`]). This is what v2 pays beyond v1 when replaying from the store
//! (`bench/results/2026-11-24-vm/v2disk.md`).
//!
//! **Frame cache.** A frame (and its zstd form) is made once per event and kept in a small
//! seq-indexed cache ([`CACHE_SLOTS`] slots, a mutex each), so a thousand live subscribers cost
//! one rendering and one compression per event, as on v1, where the forms are made at ingest.
//! Only events within half the cache of the tip use it: a subscriber replaying from further back
//! makes its own frames without touching the cache (it would only evict what live subscribers
//! need); that costs one frame's allocation and, compressed, one zstd call.
//!
//! **Memory.** A v2 subscriber costs what a `/subscribe` subscriber costs (`server.rs`; both run
//! the same loop, `server::stream`), plus the frames it has made and not yet written; the frame
//! cache is shared: [`CACHE_SLOTS`] frames, each allocated exactly (about 3 MB at the capture's
//! ~630-byte frames, plus their zstd forms when asked for).
//!
//! **Compression.** `?zstdDictionary=<id>` makes every frame (messages, `#info` and the error
//! frame alike) a binary message holding one zstd frame of exactly the text frame, with
//! Jetstream's settings (`compress.rs`). The dictionary is `--zstd-dictionary-v2 PATH`; it is
//! independent of v1's (`--zstd-dictionary`): nothing about v2 compression is stored, so it can
//! change across restarts. An unknown id is a 400 `UnknownZstdDictionary` naming the current id;
//! without a dictionary every id is unknown, and the message says so (a client such as the Python
//! SDK then finds `getZstdDictionary` answering 404 `DictionaryNotFound` and goes uncompressed).
//!
//! **Cursor.** Inclusive seq; at or above 10^15 a unix-µs timestamp, translated to the first seq
//! at or after it, clamped up to the retention floor with an `#info OutdatedCursor` sent first;
//! a seq below the floor is a 400 `CursorTooOld` whose message carries the floor; omitted: live.
//!
//! **Server-push only.** Any data frame from the client closes the connection with 1008; a
//! protocol violation gets the code `/subscribe` gives it (the reader is shared:
//! `server::reader`). A client's Close is answered with the server's, and no event follows it
//! (`server::answer_close`).
//!
//! **`#sync`.** Ingest stores every verified `#sync` frame as an event of kind `sync` with a
//! seq of its own (`Projector::with_sync`), as Jetstream v2 does: v2 sends it
//! (`{"seq","did","time","sync":{"blocks":{"$bytes":…},"did","rev","seq","time"}}`), and v1's
//! `/subscribe` skips it, so v1's cursors step over those seqs and every other event has the same
//! number on both wires. v1's output is unchanged for a stream without `#sync` frames.
//!
//! **Metrics.** Subscribers, events, bytes, filtered, oversize and slow drops count in the
//! server-wide totals, as v1's do, and per endpoint in `riptide_endpoint_*{endpoint=…}`.

use std::fmt::Write as _;
use std::ops::Range;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicI64, AtomicU64};
use std::sync::{Arc, Mutex};

use axum::extract::ws::{Message, Utf8Bytes, WebSocket, WebSocketUpgrade};
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use riptide_jetstream::EventKind;
use tokio::sync::{mpsc, watch};

use crate::compress::{CompressorPool, Dictionary};
use crate::metrics::{Metrics, SlowDrop};
use crate::options::{Filter, CURSOR_SPLIT, MAX_COLLECTIONS, MAX_DIDS};
use crate::server::{
    stream, unsendable, App, Ctl, Frames, Op, Outcome, Writer, MAX_CLIENT_MESSAGE,
    WS_MAX_WRITE_BUFFER, WS_READ_BUFFER, WS_WRITE_BUFFER,
};
use crate::Event;

/// The subscription's path.
pub const SUBSCRIBE_EVENTS: &str = "/xrpc/network.bsky.jetstream.subscribeEvents";
/// The dictionary download's path.
pub const GET_ZSTD_DICTIONARY: &str = "/xrpc/network.bsky.jetstream.getZstdDictionary";
/// The one subprotocol (proposal 0015).
pub const SUBPROTOCOL: &str = "xrpc.v1.json";
/// The message `$type` prefix.
pub const NSID: &str = "network.bsky.jetstream.subscribeEvents";
/// Most `kinds` values.
pub const MAX_KINDS: usize = 4;
/// Frames kept in the frame cache (module docs).
pub const CACHE_SLOTS: usize = 4096;

/// The v2 routes (merged into [`crate::router`]).
pub fn routes() -> Router<Arc<App>> {
    Router::new()
        .route(SUBSCRIBE_EVENTS, get(subscribe_events))
        .route(GET_ZSTD_DICTIONARY, get(get_zstd_dictionary))
}

/// A pre-upgrade refusal: HTTP status plus the XRPC error envelope `{"error","message"}`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{status} {error}: {message}")]
pub struct XrpcError {
    /// HTTP status.
    pub status: u16,
    /// The error name (`InvalidRequest`, `CursorTooOld`, `UnknownZstdDictionary`, …).
    pub error: &'static str,
    /// What is wrong, for people.
    pub message: String,
}

impl XrpcError {
    fn invalid(message: impl Into<String>) -> XrpcError {
        XrpcError {
            status: 400,
            error: "InvalidRequest",
            message: message.into(),
        }
    }

    /// The envelope as JSON.
    pub fn body(&self) -> String {
        serde_json::json!({"error": self.error, "message": self.message}).to_string()
    }
}

impl IntoResponse for XrpcError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::BAD_REQUEST);
        (status, [("content-type", "application/json")], self.body()).into_response()
    }
}

/// The event kinds of v2's `kinds` filter, as a bit set (bit per [`Kind`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `commit`.
    Commit = 1,
    /// `identity`.
    Identity = 2,
    /// `account`.
    Account = 4,
    /// `sync` (none stored yet: module docs).
    Sync = 8,
}

impl Kind {
    fn parse(s: &str) -> Option<Kind> {
        Some(match s {
            "commit" => Kind::Commit,
            "identity" => Kind::Identity,
            "account" => Kind::Account,
            "sync" => Kind::Sync,
            _ => return None,
        })
    }

    fn of(k: EventKind) -> Kind {
        match k {
            EventKind::Commit | EventKind::Replacement => Kind::Commit,
            EventKind::Identity => Kind::Identity,
            EventKind::Account => Kind::Account,
            EventKind::Sync => Kind::Sync,
        }
    }
}

/// What a subscriber receives: `kinds`, `dids`, `collections` (ANDed) and the size cap. Fixed for
/// the connection.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct V2Filter {
    /// Bit set of [`Kind`]s; 0 = every kind.
    pub kinds: u8,
    /// DIDs and collections (validated as v1's, with v2's limits checked first).
    pub inner: Filter,
    /// Largest frame (the uncompressed text frame, envelope included); 0 = no limit.
    pub max_size: u32,
}

impl V2Filter {
    /// Whether the subscriber wants `e` (size aside).
    pub fn wants(&self, e: &Event) -> bool {
        (self.kinds == 0 || self.kinds & Kind::of(e.kind()) as u8 != 0) && self.inner.wants(e)
    }
}

/// Where a v2 subscriber starts, before resolution.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum V2Cursor {
    /// Omitted: the live tip.
    Live,
    /// A seq (inclusive).
    Seq(u64),
    /// A unix-µs timestamp.
    Time(i64),
}

/// Everything a `subscribeEvents` query says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct V2Options {
    /// The filter.
    pub filter: V2Filter,
    /// Where to start.
    pub cursor: V2Cursor,
    /// `zstdDictionary`, if given (checked against the server's by [`V2Options::parse`]'s caller).
    pub zstd_dictionary: Option<u32>,
}

impl V2Options {
    /// Parses a raw query string and the request headers (lexicon `subscribeEvents`; errors as
    /// Jetstream v2 gives them).
    pub fn parse(query: &str, headers: &HeaderMap) -> Result<V2Options, XrpcError> {
        let (mut kinds, mut dids, mut cols) = (Vec::new(), Vec::new(), Vec::new());
        let (mut cursor, mut size, mut dict) = (V2Cursor::Live, None::<Vec<String>>, None);
        for (k, v) in form_urlencoded::parse(query.as_bytes()) {
            match &*k {
                "wantedDids" => {
                    return Err(XrpcError::invalid(
                        "wantedDids is the legacy /subscribe parameter; use dids",
                    ))
                }
                "wantedCollections" => {
                    return Err(XrpcError::invalid(
                        "wantedCollections is the legacy /subscribe parameter; use collections",
                    ))
                }
                "requireHello" => return Err(XrpcError::invalid(
                    "requireHello is not supported on this endpoint; it is server-push only (use the filter parameters)",
                )),
                "compress" if v == "true" => return Err(XrpcError::invalid(
                    "compress=true is the /subscribe (v1) opt-in; this endpoint uses zstdDictionary=<id> with the dictionary from getZstdDictionary",
                )),
                "kinds" => kinds.push(v.into_owned()),
                "dids" => dids.push(v.into_owned()),
                "collections" => cols.push(v.into_owned()),
                "cursor" if v.is_empty() => cursor = V2Cursor::Live,
                "cursor" => {
                    let n: i64 = v
                        .parse()
                        .map_err(|_| XrpcError::invalid(format!("invalid cursor: {v}")))?;
                    cursor = match n {
                        n if n < 0 => {
                            return Err(XrpcError::invalid(format!(
                                "invalid cursor: {n} is negative"
                            )))
                        }
                        n if n < CURSOR_SPLIT => V2Cursor::Seq(n as u64),
                        n => V2Cursor::Time(n),
                    };
                }
                "maxMessageSizeBytes" => size.get_or_insert_with(Vec::new).push(v.into_owned()),
                "zstdDictionary" => {
                    dict = Some(match v.parse::<u32>() {
                        Ok(n) if n > 0 => n,
                        _ => {
                            return Err(XrpcError::invalid(
                                "zstdDictionary must be a positive integer zstd dictionary ID",
                            ))
                        }
                    })
                }
                _ => {}
            }
        }
        if headers
            .get("socket-encoding")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|h| h.contains("zstd"))
        {
            return Err(XrpcError::invalid(
                "Socket-Encoding: zstd is the /subscribe (v1) opt-in; this endpoint uses zstdDictionary=<id> with the dictionary from getZstdDictionary",
            ));
        }
        if kinds.len() > MAX_KINDS {
            return Err(XrpcError::invalid(format!(
                "too many kinds values: {} > {MAX_KINDS}",
                kinds.len()
            )));
        }
        let mut mask = 0u8;
        for k in &kinds {
            let Some(k) = Kind::parse(k) else {
                return Err(XrpcError::invalid(format!(
                    "unknown kind {k:?} (valid: commit, identity, account, sync)"
                )));
            };
            mask |= k as u8;
        }
        if dids.len() > MAX_DIDS {
            return Err(XrpcError::invalid(format!(
                "too many dids values: {} > {MAX_DIDS}",
                dids.len()
            )));
        }
        if cols.len() > MAX_COLLECTIONS {
            return Err(XrpcError::invalid(format!(
                "too many collections values: {} > {MAX_COLLECTIONS}",
                cols.len()
            )));
        }
        for c in &cols {
            if let Some(head) = c.strip_suffix(".*") {
                if !riptide_syntax::is_valid_nsid(&format!("{head}.x")) {
                    return Err(XrpcError::invalid(format!(
                        "invalid collection wildcard: {c}"
                    )));
                }
            }
        }
        if !cols.is_empty() && mask != 0 && mask & Kind::Commit as u8 == 0 {
            return Err(XrpcError::invalid(
                "collections filter can never apply: kinds excludes commit",
            ));
        }
        let max_size = match size.as_deref() {
            None => 0,
            Some([one]) => one
                .parse::<u32>()
                .map_err(|_| XrpcError::invalid(format!("invalid maxMessageSizeBytes {one:?}")))?,
            Some(_) => {
                return Err(XrpcError::invalid(
                    "maxMessageSizeBytes must be one unsigned 32-bit integer",
                ))
            }
        };
        let inner = Filter::new(
            cols.iter().map(String::as_str),
            dids.iter().map(String::as_str),
            0,
        )
        .map_err(|e| XrpcError::invalid(e.0))?;
        Ok(V2Options {
            filter: V2Filter {
                kinds: mask,
                inner,
                max_size,
            },
            cursor,
            zstd_dictionary: dict,
        })
    }
}

/// A resolved v2 start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct V2Start {
    /// The first seq to send (`None`: the live tip).
    pub seq: Option<u64>,
    /// An `#info OutdatedCursor` message to send first (a clamped timestamp).
    pub outdated: Option<String>,
}

/// The `CursorTooOld` answer to seq `n` below the live `floor`. With sealed segments (`sealed`:
/// the archive's first and last seq) the floor means "plan from the archive first", as on
/// Jetstream v2: the message names the floor, the `planSnapshot` to make and where the archive
/// ends; the Python SDK's `replay()` and riptide's clients join the live stream at the plan's end.
/// Without an archive it can only say to re-backfill. The lexicon fixes the error's name and that
/// the message carries the floor, nothing else.
pub fn cursor_too_old(n: u64, floor: u64, sealed: Option<(u64, u64)>) -> XrpcError {
    let message = match sealed {
        Some((first, tip)) if first <= n + 1 && tip + 1 >= floor => format!(
            "cursor {n} is below the live floor {floor}: plan from the archive first \
             (network.bsky.jetstream.planSnapshot with afterSeq {n}; it is sealed through seq \
             {tip}), then subscribe from its plannedThroughSeq"
        ),
        Some((first, tip)) => format!(
            "cursor {n} is below the live floor {floor}, and the archive holds only seqs \
             {first}..={tip}: re-backfill from your last seq (the oldest seq served live is {floor})"
        ),
        None => format!(
            "cursor {n} below the retention floor {floor}; re-backfill from your last seq (the oldest seq served is {floor})"
        ),
    };
    XrpcError {
        status: 400,
        error: "CursorTooOld",
        message,
    }
}

/// Resolves a cursor (blocking: it may read the store). `sealed`: the archive's first and last
/// sealed seq, if it has segments ([`cursor_too_old`]).
pub fn resolve(
    log: &crate::Log,
    sealed: Option<(u64, u64)>,
    c: V2Cursor,
) -> Result<Result<V2Start, XrpcError>, crate::StoreError> {
    let next = log.next_seq();
    let floor = log.store().floor();
    let live = V2Start {
        seq: None,
        outdated: None,
    };
    Ok(Ok(match c {
        V2Cursor::Live => live,
        V2Cursor::Seq(n) if n >= next => live,
        V2Cursor::Seq(n) => {
            let s = n.max(1);
            if s < floor {
                return Ok(Err(cursor_too_old(n, floor, sealed)));
            }
            V2Start {
                seq: Some(s),
                outdated: None,
            }
        }
        V2Cursor::Time(t) if t > crate::now_us() => live,
        V2Cursor::Time(t) => {
            let s = log.store().seq_at_time(t)?.unwrap_or(next).min(next);
            // Clamped: events were expired (the floor is above 1) and `t` is older than the
            // oldest retained one (or than everything, when nothing is retained).
            let mut first = Vec::with_capacity(1);
            let one = crate::ReadLimit {
                events: 1,
                bytes: 0,
            };
            log.read(floor, one, &mut first)?;
            let clamped = floor > 1 && first.first().is_none_or(|e| t < e.time_us());
            V2Start {
                seq: Some(s),
                outdated: clamped.then(|| {
                    format!(
                        "requested timestamp cursor {t} is below the retention floor; starting at seq {s}"
                    )
                }),
            }
        }
    }))
}

/// `time_us` as RFC 3339 UTC with exactly six fractional digits (`2026-05-25T14:23:29.950123Z`).
pub fn rfc3339_micros(us: i64) -> String {
    let mut b = Vec::with_capacity(27);
    write_rfc3339_micros(&mut b, us);
    String::from_utf8(b).unwrap_or_default()
}

/// Appends [`rfc3339_micros`] (ASCII digits only; years outside 0..=9999 are clamped).
pub fn write_rfc3339_micros(out: &mut Vec<u8>, us: i64) {
    out.extend_from_slice(&rfc3339_micros_bytes(us));
}

/// [`rfc3339_micros`] as its 27 bytes, with no allocation (every v2 frame has one).
pub fn rfc3339_micros_bytes(us: i64) -> [u8; 27] {
    let secs = us.div_euclid(1_000_000);
    let micros = us.rem_euclid(1_000_000);
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    // Civil from days (Howard Hinnant's algorithm), proleptic Gregorian.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = (yoe + era * 400 + i64::from(m <= 2)).clamp(0, 9999);
    let mut b = *b"0000-00-00T00:00:00.000000Z";
    // `v` (non-negative, below 10^width) as the `width` digits ending before `end`.
    let mut digits = |end: usize, width: usize, mut v: i64| {
        for i in (end - width..end).rev() {
            b[i] = b'0' + (v % 10) as u8;
            v /= 10;
        }
    };
    digits(4, 4, y);
    digits(7, 2, m);
    digits(10, 2, d);
    digits(13, 2, sod / 3600);
    digits(16, 2, sod / 60 % 60);
    digits(19, 2, sod % 60);
    digits(26, 6, micros);
    b
}

/// Formats `time` fields, remembering the last second: a replay sends thousands of events in
/// the same second, whose `YYYY-MM-DDTHH:MM:SS.` is then copied rather than computed.
#[derive(Debug, Default)]
pub struct TimeFormat {
    second: Option<i64>,
    head: [u8; 20],
}

impl TimeFormat {
    /// [`rfc3339_micros_bytes`] of `us`.
    pub fn format(&mut self, us: i64) -> [u8; 27] {
        let second = us.div_euclid(1_000_000);
        if self.second != Some(second) {
            let full = rfc3339_micros_bytes(us);
            self.head.copy_from_slice(&full[..20]);
            self.second = Some(second);
            return full;
        }
        let mut b = *b"0000-00-00T00:00:00.000000Z";
        b[..20].copy_from_slice(&self.head);
        let mut v = us.rem_euclid(1_000_000);
        for i in (20..26).rev() {
            b[i] = b'0' + (v % 10) as u8;
            v /= 10;
        }
        b
    }

    /// The whole `time` field of a v2 payload, between the fields before and after it:
    /// `,"time":"<format(us)>",`.
    fn field(&mut self, us: i64) -> [u8; 38] {
        let mut f = *b",\"time\":\"0000-00-00T00:00:00.000000Z\",";
        f[9..36].copy_from_slice(&self.format(us));
        f
    }
}

/// The fixed pieces around a kind's fields: in a stored v1 event (`,"kind":"commit","commit":`,
/// after the `cursor`), and in a v2 frame (the envelope and the payload's `$type` up to `"seq":`;
/// and, for a kind other than commit, the name its object goes under).
struct KindText {
    v1: &'static str,
    v2_head: &'static str,
    v2_object: &'static str,
}

macro_rules! kind_text {
    ($k:literal) => {
        KindText {
            v1: concat!(",\"kind\":\"", $k, "\",\"", $k, "\":"),
            v2_head: concat!(
                "{\"$type\":\"message\",\"payload\":{\"$type\":\"network.bsky.jetstream.subscribeEvents#",
                $k,
                "\",\"seq\":"
            ),
            v2_object: concat!("\"", $k, "\":"),
        }
    };
}

fn kind_text(k: EventKind) -> &'static KindText {
    static COMMIT: KindText = kind_text!("commit");
    static IDENTITY: KindText = kind_text!("identity");
    static ACCOUNT: KindText = kind_text!("account");
    static SYNC: KindText = kind_text!("sync");
    match k {
        EventKind::Commit | EventKind::Replacement => &COMMIT,
        EventKind::Identity => &IDENTITY,
        EventKind::Account => &ACCOUNT,
        EventKind::Sync => &SYNC,
    }
}

/// Where a v2 frame's pieces are in a stored v1 event's JSON (module docs), found by checking the
/// v1 prefix `{"did":"…","time_us":…,"cursor":…,"kind":"…","<kind>":` byte for byte against the
/// event's own fields. The JSON is `{` + `"did":"<did>"` + `,"time_us":<t>,"cursor":` +
/// `<seq>,` + `"kind":…` + `<object>}`, and a v2 frame reuses three of those slices as they are.
#[derive(Debug, PartialEq, Eq)]
struct V1Parts {
    /// `"did":"<did>"`: v2's `did` field, byte for byte (a JSON writer makes this of
    /// [`Event::did`], which it matched unescaped).
    did: Range<usize>,
    /// The `cursor` digits and the `,` after them: v2's `seq` value and the comma after it.
    seq: Range<usize>,
    /// Where the kind's object (`{"rev":…}` for a commit, the upstream object otherwise) starts;
    /// it ends one byte before the JSON does.
    obj: usize,
}

/// `b[at..]` starts with `s`: the position after it.
fn after(b: &[u8], at: usize, s: &[u8]) -> Option<usize> {
    let end = at.checked_add(s.len())?;
    (b.get(at..end)? == s).then_some(end)
}

fn v1_parts(e: &Event, json: &[u8]) -> Option<V1Parts> {
    let at = after(json, 0, b"{\"did\":\"")?;
    let at = after(json, at, e.did())?;
    let did = 1..at + 1;
    let at = after(json, at, b"\",\"time_us\":")?;
    let at = after(json, at, itoa::Buffer::new().format(e.time_us()).as_bytes())?;
    let at = after(json, at, b",\"cursor\":")?;
    let digits = at;
    let at = after(json, at, itoa::Buffer::new().format(e.seq()).as_bytes())?;
    let seq = digits..at + 1;
    let obj = after(json, at, kind_text(e.kind()).v1.as_bytes())?;
    let ok = json.len() >= obj + 3 && json[obj] == b'{' && json[json.len() - 1] == b'}';
    ok.then_some(V1Parts { did, seq, obj })
}

/// The kind's object of a stored v1 event (`{"rev":…}` for a commit, the upstream object
/// otherwise), found by checking the v1 prefix (`V1Parts`). `None` if the stored JSON does not
/// have the prefix (it always has: the writer renders it).
pub fn kind_object(e: &Event) -> Option<Bytes> {
    let json = e.json();
    let obj = v1_parts(e, &json)?.obj;
    Some(json.slice(obj..json.len() - 1))
}

/// The v2 text frame of a stored event (module docs).
pub fn render(e: &Event) -> Option<String> {
    render_with(e, &mut TimeFormat::default())
}

/// [`render`], with the `time` formatter of a subscriber (or any caller rendering many frames).
/// Exactly one allocation, of exactly the frame's size, and no UTF-8 check but of the `time`:
/// the frame is fixed ASCII around three slices of the event's JSON (`V1Parts`), which was
/// checked once ([`Event::text`]). Six copies: the envelope and `"seq":`; the seq and its comma;
/// `"did":"…"`; the `time` field; for a commit its fields (`"rev":…}`) and the closing `}`, as
/// one slice, for another kind its name, then its object and the closing `}`, as one slice, then
/// the last `}`.
pub fn render_with(e: &Event, times: &mut TimeFormat) -> Option<String> {
    let json = e.text()?.0.as_str();
    let p = v1_parts(e, json.as_bytes())?;
    let kind = kind_text(e.kind());
    let time = times.field(e.time_us());
    let time = std::str::from_utf8(&time).ok()?;
    // Every range starts and ends next to an ASCII byte of the prefix (or at the end), so these
    // are character boundaries.
    let seq = json.get(p.seq)?;
    let did = json.get(p.did)?;
    let commit = e.kind().is_commit();
    // A commit's fields go in flat: `"rev":…}` closes the payload, `}` the envelope.
    let body = json.get(if commit { p.obj + 1 } else { p.obj }..)?;
    let len = kind.v2_head.len()
        + seq.len()
        + did.len()
        + time.len()
        + body.len()
        + if commit { 0 } else { kind.v2_object.len() + 1 };
    let mut out = String::with_capacity(len);
    out.push_str(kind.v2_head);
    out.push_str(seq);
    out.push_str(did);
    out.push_str(time);
    if commit {
        out.push_str(body);
    } else {
        out.push_str(kind.v2_object);
        out.push_str(body);
        out.push('}');
    }
    debug_assert_eq!(out.len(), len);
    Some(out)
}

/// An `#info` text frame.
pub fn info_frame(name: &str, message: &str) -> String {
    serde_json::json!({"$type": "message", "payload": {
        "$type": format!("{NSID}#info"), "name": name, "message": message}})
    .to_string()
}

/// An error text frame (terminal).
pub fn error_frame(error: &str, message: &str) -> String {
    serde_json::json!({"$type": "error", "error": error, "message": message}).to_string()
}

#[derive(Debug)]
struct Cached {
    seq: u64,
    text: Utf8Bytes,
    zstd: Option<Bytes>,
}

/// Counters of the v2 endpoint (also counted in the server-wide totals; module docs).
#[derive(Debug, Default)]
pub struct V2Metrics {
    /// Connected v2 subscribers.
    pub subscribers: AtomicI64,
    /// Frames of events sent.
    pub events_out: AtomicU64,
    /// Bytes of those frames (WebSocket payloads).
    pub bytes_out: AtomicU64,
    /// Events not sent: filtered out.
    pub events_filtered: AtomicU64,
    /// Events not sent: over `maxMessageSizeBytes`.
    pub events_oversize: AtomicU64,
    /// Slow drops, by [`SlowDrop`] reason.
    slow_drops: [AtomicU64; 3],
    /// Connections closed for a client data frame.
    pub client_errors: AtomicU64,
    /// `#info` frames sent.
    pub info_frames: AtomicU64,
    /// Stored events that could not be made into a frame (never expected; logged).
    pub render_failures: AtomicU64,
    /// Pre-upgrade refusals, by error name.
    rejected: Mutex<Vec<(&'static str, u64)>>,
}

impl V2Metrics {
    fn reject(&self, name: &'static str) {
        let mut r = self.rejected.lock().unwrap_or_else(|p| p.into_inner());
        match r.iter_mut().find(|(n, _)| *n == name) {
            Some((_, c)) => *c += 1,
            None => r.push((name, 1)),
        }
    }

    /// v2 subscribers dropped as too slow for `why`.
    pub fn slow_drop_count(&self, why: SlowDrop) -> u64 {
        self.slow_drops[why as usize].load(Relaxed)
    }
}

/// The v2 endpoint's shared state: dictionary (with its compressors), frame cache, metrics.
pub struct V2 {
    zstd: Option<CompressorPool>,
    cache: Box<[Mutex<Option<Cached>>]>,
    /// Counters.
    pub metrics: V2Metrics,
}

impl std::fmt::Debug for V2 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("V2")
            .field("dictionary", &self.dictionary_id())
            .finish()
    }
}

impl V2 {
    /// State for a server with (or without) a v2 dictionary.
    pub fn new(dictionary: Option<Dictionary>) -> V2 {
        V2 {
            zstd: dictionary.map(CompressorPool::new),
            cache: (0..CACHE_SLOTS).map(|_| Mutex::new(None)).collect(),
            metrics: V2Metrics::default(),
        }
    }

    /// The dictionary's id, if there is one.
    pub fn dictionary_id(&self) -> Option<u32> {
        self.dictionary().map(Dictionary::id)
    }

    /// The dictionary, if there is one.
    pub fn dictionary(&self) -> Option<&Dictionary> {
        self.zstd.as_ref().map(CompressorPool::dictionary)
    }

    /// One zstd frame of `text` (Jetstream's settings, the v2 dictionary); `None` without a
    /// dictionary or if zstd fails (logged here; the subscriber loop counts the event unsendable).
    pub fn compress(&self, text: &[u8]) -> Option<Bytes> {
        match self.zstd.as_ref()?.compress(text) {
            Ok(z) => Some(Bytes::from(z)),
            Err(e) => {
                crate::said::say("v2 zstd failed", "riptide_events_unsendable_total", || {
                    tracing::error!(error = %e, "v2 zstd: the event cannot be compressed");
                });
                None
            }
        }
    }

    /// The frame of `e`, text or (`zstd`) compressed, from the cache or made now; with `cache`
    /// false (an event far behind the tip, which other subscribers are unlikely to want soon)
    /// made without touching the cache.
    fn frame(&self, e: &Event, zstd: bool, cache: bool, times: &mut TimeFormat) -> Option<Message> {
        // Made when the event entered the in-memory tail.
        if let (Some(t), false) = (e.v2_frame(), zstd) {
            return Some(Message::Text(t.0.clone()));
        }
        if !cache {
            let text = self.render_counted(e, times)?;
            return Some(if zstd {
                Message::Binary(self.compress(text.as_bytes())?)
            } else {
                Message::Text(text)
            });
        }
        let slot = &self.cache[(e.seq() % CACHE_SLOTS as u64) as usize];
        let (text, z) = {
            let g = slot.lock().unwrap_or_else(|p| p.into_inner());
            match g.as_ref() {
                Some(c) if c.seq == e.seq() => (Some(c.text.clone()), c.zstd.clone()),
                _ => (None, None),
            }
        };
        if let (Some(t), false) = (&text, zstd) {
            return Some(Message::Text(t.clone()));
        }
        if let (Some(z), true) = (z, zstd) {
            return Some(Message::Binary(z));
        }
        let text = match text.or_else(|| e.v2_frame().map(|t| t.0.clone())) {
            Some(t) => t,
            None => self.render_counted(e, times)?,
        };
        let z = if zstd {
            Some(self.compress(text.as_bytes())?)
        } else {
            None
        };
        {
            let mut g = slot.lock().unwrap_or_else(|p| p.into_inner());
            match g.as_mut() {
                Some(c) if c.seq == e.seq() => {
                    if c.zstd.is_none() {
                        c.zstd.clone_from(&z);
                    }
                }
                _ => {
                    *g = Some(Cached {
                        seq: e.seq(),
                        text: text.clone(),
                        zstd: z.clone(),
                    })
                }
            }
        }
        Some(match z {
            Some(z) => Message::Binary(z),
            None => Message::Text(text),
        })
    }

    /// [`render_with`] as a message payload; a failure counted.
    fn render_counted(&self, e: &Event, times: &mut TimeFormat) -> Option<Utf8Bytes> {
        let r = render_with(e, times).map(Utf8Bytes::from);
        if r.is_none() {
            // Said (once) by the subscriber loop, which counts the event unsendable.
            self.metrics.render_failures.fetch_add(1, Relaxed);
        }
        r
    }

    /// A control frame (`#info`, error) as sent on a connection with or without compression.
    fn control(&self, text: String, zstd: bool) -> Option<Message> {
        if zstd {
            self.compress(text.as_bytes()).map(Message::Binary)
        } else {
            Some(Message::Text(Utf8Bytes::from(text)))
        }
    }

    /// Appends the per-endpoint metrics (v1's share is the server-wide total less v2's).
    pub fn render_metrics(&self, total: &Metrics, s: &mut String) {
        let m = &self.metrics;
        let pair = |t: u64, v: u64| [("subscribe", t.saturating_sub(v)), ("subscribeEvents", v)];
        let families: [(&str, &str, &str, u64, u64); 6] = [
            (
                "riptide_endpoint_subscribers",
                "gauge",
                "Connected subscribers, by endpoint.",
                total.subscribers.load(Relaxed).max(0) as u64,
                m.subscribers.load(Relaxed).max(0) as u64,
            ),
            (
                "riptide_endpoint_events_out_total",
                "counter",
                "Events sent to subscribers, by endpoint.",
                total.events_out.load(Relaxed),
                m.events_out.load(Relaxed),
            ),
            (
                "riptide_endpoint_bytes_out_total",
                "counter",
                "Event bytes sent to subscribers (WebSocket payloads), by endpoint.",
                total.bytes_out.load(Relaxed),
                m.bytes_out.load(Relaxed),
            ),
            (
                "riptide_endpoint_events_filtered_total",
                "counter",
                "Events not sent: filtered out, by endpoint.",
                total.events_filtered.load(Relaxed),
                m.events_filtered.load(Relaxed),
            ),
            (
                "riptide_endpoint_events_oversize_total",
                "counter",
                "Events not sent: over maxMessageSizeBytes, by endpoint.",
                total.events_oversize.load(Relaxed),
                m.events_oversize.load(Relaxed),
            ),
            (
                "riptide_endpoint_client_errors_total",
                "counter",
                "Subscribers closed for a client message (v2: any data frame), by endpoint.",
                total.client_errors.load(Relaxed),
                m.client_errors.load(Relaxed),
            ),
        ];
        for (name, kind, help, t, v) in families {
            let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for (ep, n) in pair(t, v) {
                let _ = writeln!(s, "{name}{{endpoint=\"{ep}\"}} {n}");
            }
        }
        let name = "riptide_endpoint_slow_consumer_drops_total";
        let _ = writeln!(
            s,
            "# HELP {name} Subscribers dropped as too slow, by endpoint and reason.\n# TYPE {name} counter"
        );
        for r in SlowDrop::ALL {
            for (ep, n) in pair(total.slow_drop_count(r), m.slow_drop_count(r)) {
                let _ = writeln!(
                    s,
                    "{name}{{endpoint=\"{ep}\",reason=\"{}\"}} {n}",
                    r.as_str()
                );
            }
        }
        let _ = writeln!(s, "# HELP riptide_v2_rejected_total subscribeEvents connections refused before the upgrade, by XRPC error.\n# TYPE riptide_v2_rejected_total counter");
        for (e, n) in m.rejected.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            let _ = writeln!(s, "riptide_v2_rejected_total{{error=\"{e}\"}} {n}");
        }
        for (name, help, v) in [
            (
                "riptide_v2_info_frames_total",
                "subscribeEvents #info frames sent (OutdatedCursor).",
                &m.info_frames,
            ),
            (
                "riptide_v2_render_failures_total",
                "Stored events that could not be made into a subscribeEvents frame.",
                &m.render_failures,
            ),
        ] {
            crate::metrics::sample(s, name, "counter", help, v.load(Relaxed));
        }
    }
}

async fn get_zstd_dictionary(State(app): State<Arc<App>>, RawQuery(q): RawQuery) -> Response {
    let mut want = None;
    for (k, v) in form_urlencoded::parse(q.as_deref().unwrap_or("").as_bytes()) {
        if k == "id" {
            match v.parse::<u32>() {
                Ok(n) if n > 0 => want = Some(n),
                _ => {
                    return XrpcError::invalid("id must be a positive integer zstd dictionary ID")
                        .into_response()
                }
            }
        }
    }
    let Some(dict) = app.v2.dictionary() else {
        return XrpcError {
            status: 404,
            error: "DictionaryNotFound",
            message: "this server has no subscribeEvents dictionary (start it with --zstd-dictionary-v2); connect without zstdDictionary".into(),
        }
        .into_response();
    };
    if want.is_some_and(|w| w != dict.id()) {
        return XrpcError {
            status: 404,
            error: "DictionaryNotFound",
            message: format!(
                "no dictionary with id {}; current dictionary id is {}",
                want.unwrap_or(0),
                dict.id()
            ),
        }
        .into_response();
    }
    (
        [
            ("content-type", "application/octet-stream".to_string()),
            ("x-zstd-dictionary-id", dict.id().to_string()),
            (
                "cache-control",
                "public, max-age=31536000, immutable".to_string(),
            ),
        ],
        dict.bytes().to_vec(),
    )
        .into_response()
}

async fn subscribe_events(
    State(app): State<Arc<App>>,
    RawQuery(query): RawQuery,
    long: Option<axum::Extension<crate::limits::LongQuery>>,
    headers: HeaderMap,
    ws: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> Response {
    // A query too long for a URI comes beside the request (`crate::limits`, "Long queries").
    let query = long.map(|axum::Extension(q)| q.0).or(query);
    let refuse = |e: XrpcError| {
        app.v2.metrics.reject(e.error);
        e.into_response()
    };
    let opts = match V2Options::parse(query.as_deref().unwrap_or(""), &headers) {
        Ok(o) => o,
        Err(e) => return refuse(e),
    };
    if let Some(id) = opts.zstd_dictionary {
        match app.v2.dictionary_id() {
            Some(cur) if cur == id => {}
            Some(cur) => return refuse(XrpcError {
                status: 400,
                error: "UnknownZstdDictionary",
                message: format!("unknown zstd dictionary id {id}; current dictionary id is {cur} (fetch it via getZstdDictionary and reconnect)"),
            }),
            None => return refuse(XrpcError {
                status: 400,
                error: "UnknownZstdDictionary",
                message: format!("unknown zstd dictionary id {id}: this server has no subscribeEvents dictionary (started without --zstd-dictionary-v2); connect without zstdDictionary"),
            }),
        }
    }
    if !app.ready.load(Relaxed) {
        return XrpcError {
            status: 503,
            error: "NotReady",
            message: "not ready".into(),
        }
        .into_response();
    }
    let log = app.log.clone();
    let cursor = opts.cursor;
    let sealed = app.archive.segments().seq_range();
    let start = match tokio::task::spawn_blocking(move || resolve(&log, sealed, cursor)).await {
        Ok(Ok(Ok(s))) => s,
        Ok(Ok(Err(e))) => return refuse(e),
        _ => {
            return XrpcError {
                status: 503,
                error: "InternalError",
                message: "cannot resolve the cursor".into(),
            }
            .into_response()
        }
    };
    // Last: every refusal above is an XRPC error, upgrade or not.
    let ws = match ws {
        Ok(ws) => ws,
        Err(r) => return r.into_response(),
    };
    ws.protocols([SUBPROTOCOL])
        .max_message_size(MAX_CLIENT_MESSAGE)
        .max_frame_size(MAX_CLIENT_MESSAGE)
        .read_buffer_size(WS_READ_BUFFER)
        .write_buffer_size(WS_WRITE_BUFFER)
        .max_write_buffer_size(WS_MAX_WRITE_BUFFER)
        .on_upgrade(move |socket| run(app, socket, opts, start))
}

/// How long a subscriber dropped for being far behind gets to take its terminal
/// `ConsumerTooSlow` frame and the close, in all. Its socket is slow to drain by definition:
/// bounded by the write timeout (120 s) instead, a dropped subscriber kept its connection, and its
/// place in the connection budget, for two minutes after the drop was counted (issue 40). One
/// that still reads gets the frame within this; one that does not is closed without it.
pub const TERMINAL_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

async fn run(app: Arc<App>, socket: WebSocket, opts: V2Options, start: V2Start) {
    app.metrics.subscribers.fetch_add(1, Relaxed);
    app.v2.metrics.subscribers.fetch_add(1, Relaxed);
    let zstd = opts.zstd_dictionary.is_some();
    let (mut sink, stream) = socket.split();
    let (ctl_tx, mut ctl_rx) = mpsc::channel::<Ctl>(2);
    let last_pong = Arc::new(AtomicI64::new(crate::now_us()));
    let pong = last_pong.clone();
    let a = app.clone();
    // Server-push only: any data frame closes the connection (1008).
    let reader = crate::server::reader(
        stream,
        ctl_tx,
        pong,
        move || {
            a.metrics.client_errors.fetch_add(1, Relaxed);
            a.v2.metrics.client_errors.fetch_add(1, Relaxed);
        },
        |_| {
            Err((
                1008,
                "server-push only: client data frames are not accepted".into(),
            ))
        },
    );
    let mut shutdown = app.shutdown.subscribe();
    let outcome = serve(
        &app,
        &mut sink,
        &opts,
        start,
        zstd,
        &mut ctl_rx,
        &mut shutdown,
        &last_pong,
    )
    .await;
    let gone = matches!(outcome, Outcome::Gone);
    match outcome {
        Outcome::Close(code, reason) => {
            crate::server::close(&app, &mut sink, &mut ctl_rx, code, reason).await
        }
        Outcome::Drop(why) => {
            app.metrics.slow_drop(why);
            app.v2.metrics.slow_drops[why as usize].fetch_add(1, Relaxed);
            tracing::info!(
                reason = why.as_str(),
                endpoint = "subscribeEvents",
                "slow subscriber dropped"
            );
            // Far behind but still reading: the terminal error frame, then the close, within
            // `TERMINAL_GRACE` in all (the frame waits behind what the socket still holds). A
            // socket that stopped taking writes (or pongs) gets neither.
            if why == SlowDrop::Behind {
                let text = error_frame(
                    "ConsumerTooSlow",
                    "far behind the live tip and reading below the floor rate; reconnect with your last seq as the cursor",
                );
                if let Some(m) = app.v2.control(text, zstd) {
                    let _ = tokio::time::timeout(TERMINAL_GRACE, async {
                        if sink.send(m).await.is_ok() {
                            crate::server::send_close(
                                &app,
                                &mut sink,
                                1008,
                                "ConsumerTooSlow".into(),
                            )
                            .await;
                        }
                    })
                    .await;
                }
            }
        }
        Outcome::Gone => {}
    }
    crate::server::end_reader(reader, gone).await;
    app.v2.metrics.subscribers.fetch_sub(1, Relaxed);
    app.metrics.subscribers.fetch_sub(1, Relaxed);
}

#[allow(clippy::too_many_arguments)]
async fn serve(
    app: &App,
    sink: &mut crate::server::Sink,
    opts: &V2Options,
    start: V2Start,
    zstd: bool,
    ctl_rx: &mut mpsc::Receiver<Ctl>,
    shutdown: &mut watch::Receiver<bool>,
    last_pong: &AtomicI64,
) -> Outcome {
    if *shutdown.borrow() {
        return Outcome::Close(1001, "server shutting down".into());
    }
    let next = start.seq.unwrap_or_else(|| app.log.next_seq());
    let mut w = Writer::new(sink, app);
    if let Some(msg) = start.outdated {
        if let Some(f) = app.v2.control(info_frame("OutdatedCursor", &msg), zstd) {
            if let Err(o) = w.run(Op::Feed(f), next).await {
                return o;
            }
            if let Err(o) = w.run(Op::Flush, next).await {
                return o;
            }
            app.v2.metrics.info_frames.fetch_add(1, Relaxed);
        }
    }
    let mut frames = V2Frames {
        filter: &opts.filter,
        zstd,
        near: 0,
        times: TimeFormat::default(),
    };
    stream(app, &mut w, &mut frames, next, ctl_rx, shutdown, last_pong).await
}

/// `subscribeEvents`' frames (module docs), for [`stream`], the loop both wires share.
struct V2Frames<'a> {
    filter: &'a V2Filter,
    zstd: bool,
    /// Events from this seq on go through the frame cache (live fan-out); a replay further
    /// behind renders its own.
    near: u64,
    times: TimeFormat,
}

impl Frames for V2Frames<'_> {
    fn batch(&mut self, app: &App) {
        self.near = app.log.next_seq().saturating_sub(CACHE_SLOTS as u64 / 2);
    }

    fn frame(&mut self, app: &App, e: &Event) -> Result<Option<(Message, usize)>, Outcome> {
        let (m, vm) = (&app.metrics, &app.v2.metrics);
        if !self.filter.wants(e) {
            m.events_filtered.fetch_add(1, Relaxed);
            vm.events_filtered.fetch_add(1, Relaxed);
            return Ok(None);
        }
        let cache = e.seq() >= self.near;
        let max = self.filter.max_size as usize;
        // The size cap is on the text frame, envelope included (lexicon), so the text frame is
        // needed even for a compressed connection.
        let msg = if max > 0 {
            match app.v2.frame(e, false, cache, &mut self.times) {
                Some(Message::Text(t)) if t.len() > max => {
                    m.events_oversize.fetch_add(1, Relaxed);
                    vm.events_oversize.fetch_add(1, Relaxed);
                    return Ok(None);
                }
                Some(Message::Text(_)) if self.zstd => {
                    app.v2.frame(e, true, cache, &mut self.times)
                }
                other => other,
            }
        } else {
            app.v2.frame(e, self.zstd, cache, &mut self.times)
        };
        let Some(msg) = msg else {
            unsendable(
                app,
                e,
                "no subscribeEvents frame (a stored event without the v1 prefix, or not UTF-8: \
                 riptide_v2_render_failures_total; or its zstd compression failed)",
            );
            return Ok(None);
        };
        let len = match &msg {
            Message::Text(t) => t.len(),
            Message::Binary(b) => b.len(),
            _ => 0,
        };
        Ok(Some((msg, len)))
    }

    fn sent(&mut self, app: &App, events: u64, bytes: u64) {
        let vm = &app.v2.metrics;
        vm.events_out.fetch_add(events, Relaxed);
        vm.bytes_out.fetch_add(bytes, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursor_too_old_says_to_plan_from_the_archive_when_it_reaches_the_floor() {
        let m = |n, sealed| {
            let e = cursor_too_old(n, 51, sealed);
            assert_eq!((e.status, e.error), (400, "CursorTooOld"));
            assert!(e.message.contains("51"), "{}", e.message);
            e.message
        };
        assert!(m(10, Some((1, 60))).contains("plan from the archive first"));
        assert!(m(10, Some((1, 50))).contains("plan from the archive first"));
        // The archive ends two seqs below the floor, or starts after the cursor: a gap.
        assert!(m(10, Some((1, 49))).contains("re-backfill"));
        assert!(m(10, Some((20, 60))).contains("re-backfill"));
        assert!(m(10, None).contains("re-backfill"));
    }

    #[test]
    fn rfc3339_has_six_fractional_digits() {
        assert_eq!(rfc3339_micros(0), "1970-01-01T00:00:00.000000Z");
        assert_eq!(
            rfc3339_micros(1_779_719_010_267_528),
            "2026-05-25T14:23:30.267528Z"
        );
        assert_eq!(
            rfc3339_micros(951_782_400_000_001),
            "2000-02-29T00:00:00.000001Z"
        );
        assert_eq!(rfc3339_micros(-1), "1969-12-31T23:59:59.999999Z");
    }

    #[test]
    fn the_time_format_remembers_a_second_and_still_says_each_micro() {
        let mut f = TimeFormat::default();
        let base = 1_779_719_010_000_000i64;
        for us in [
            base,
            base + 1,
            base + 999_999,
            base + 1_000_000,
            base + 1_000_001,
            base + 86_400_000_000,
            -1,
            -2,
            0,
            base + 7,
        ] {
            assert_eq!(f.format(us), rfc3339_micros_bytes(us), "{us}");
        }
    }

    #[test]
    fn frames_from_v1_events() {
        let json = br#"{"did":"did:plc:a","time_us":1779719010267528,"cursor":7,"kind":"commit","commit":{"rev":"3l3qo2vutsw2b","operation":"delete","collection":"a.b.c","rkey":"x"}}"#;
        let e = Event::encode(
            7,
            1779719010267528,
            EventKind::Commit,
            "did:plc:a",
            "a.b.c",
            json,
            b"",
        );
        assert_eq!(
            render(&e).unwrap(),
            r#"{"$type":"message","payload":{"$type":"network.bsky.jetstream.subscribeEvents#commit","seq":7,"did":"did:plc:a","time":"2026-05-25T14:23:30.267528Z","rev":"3l3qo2vutsw2b","operation":"delete","collection":"a.b.c","rkey":"x"}}"#
        );
        let json = br#"{"did":"did:plc:a","time_us":5,"cursor":8,"kind":"account","account":{"active":true,"did":"did:plc:a","seq":1,"time":"t"}}"#;
        let e = Event::encode(8, 5, EventKind::Account, "did:plc:a", "", json, b"");
        assert_eq!(
            render(&e).unwrap(),
            r#"{"$type":"message","payload":{"$type":"network.bsky.jetstream.subscribeEvents#account","seq":8,"did":"did:plc:a","time":"1970-01-01T00:00:00.000005Z","account":{"active":true,"did":"did:plc:a","seq":1,"time":"t"}}}"#
        );
        // A value whose JSON does not carry its own seq is refused, not mis-rendered.
        let e = Event::encode(9, 5, EventKind::Account, "did:plc:a", "", json, b"");
        assert!(render(&e).is_none());
    }

    #[test]
    fn a_frame_needs_the_v1_prefix_exactly() {
        let ev =
            |kind, json: &str| Event::encode(8, -5, kind, "did:plc:a", "", json.as_bytes(), b"");
        let e = ev(
            EventKind::Identity,
            r#"{"did":"did:plc:a","time_us":-5,"cursor":8,"kind":"identity","identity":{"did":"did:plc:a","seq":1}}"#,
        );
        assert_eq!(
            render(&e).unwrap(),
            r#"{"$type":"message","payload":{"$type":"network.bsky.jetstream.subscribeEvents#identity","seq":8,"did":"did:plc:a","time":"1969-12-31T23:59:59.999995Z","identity":{"did":"did:plc:a","seq":1}}}"#
        );
        assert_eq!(
            &kind_object(&e).unwrap()[..],
            br#"{"did":"did:plc:a","seq":1}"#
        );
        // Anything that is not exactly what the writer makes of the event's fields is refused.
        for bad in [
            r#"{"did":"did:plc:b","time_us":-5,"cursor":8,"kind":"identity","identity":{}}"#,
            r#"{"did":"did:plc:a","time_us":-6,"cursor":8,"kind":"identity","identity":{}}"#,
            r#"{"did":"did:plc:a","time_us":5,"cursor":8,"kind":"identity","identity":{}}"#,
            r#"{"did":"did:plc:a","time_us":-05,"cursor":8,"kind":"identity","identity":{}}"#,
            r#"{"did":"did:plc:a","time_us":-5,"cursor":08,"kind":"identity","identity":{}}"#,
            r#"{"did":"did:plc:a","time_us":-5,"cursor":80,"kind":"identity","identity":{}}"#,
            r#"{"did":"did:plc:a","time_us":-5,"cursor":8,"kind":"account","account":{}}"#,
            r#"{"did":"did:plc:a","time_us":-5,"cursor":8,"kind":"identity","identity":1}"#,
            r#"{"did":"did:plc:a","time_us":-5,"cursor":8,"kind":"identity","identity":{}"#,
            r#"{"did":"did:plc:a","time_us":-5,"cursor":8,"kind":"identity","identity":"#,
            r#"{"did":"did:plc:a","time_us":-5,"cursor":8,"#,
            r#"{"did":"did:plc:a"#,
            "",
        ] {
            let e = ev(EventKind::Identity, bad);
            assert!(render(&e).is_none() && kind_object(&e).is_none(), "{bad}");
        }
    }

    fn parse(q: &str) -> Result<V2Options, XrpcError> {
        V2Options::parse(q, &HeaderMap::new())
    }

    #[test]
    fn options_and_their_errors() {
        let o = parse("kinds=commit&kinds=identity&dids=did:plc:a&collections=app.bsky.feed.*&cursor=5&maxMessageSizeBytes=100&zstdDictionary=20260811").unwrap();
        assert_eq!(o.cursor, V2Cursor::Seq(5));
        assert_eq!(o.filter.kinds, 3);
        assert_eq!(o.filter.max_size, 100);
        assert_eq!(o.zstd_dictionary, Some(20260811));
        assert_eq!(
            parse("cursor=1779719010267528").unwrap().cursor,
            V2Cursor::Time(1779719010267528)
        );
        assert_eq!(
            parse("").unwrap(),
            V2Options {
                filter: V2Filter::default(),
                cursor: V2Cursor::Live,
                zstd_dictionary: None
            }
        );
        for (q, says) in [
            ("wantedDids=did:plc:a", "use dids"),
            ("wantedCollections=a.b.c", "use collections"),
            ("requireHello=true", "server-push only"),
            ("compress=true", "zstdDictionary"),
            (
                "kinds=commit&kinds=identity&kinds=account&kinds=sync&kinds=commit",
                "too many kinds",
            ),
            ("kinds=post", "unknown kind"),
            ("dids=bob", "invalid DID"),
            ("collections=app.bsky.fo*", "invalid collection"),
            ("collections=foo.*", "wildcard"),
            ("kinds=identity&collections=a.b.c", "kinds excludes commit"),
            ("maxMessageSizeBytes=-1", "maxMessageSizeBytes"),
            ("maxMessageSizeBytes=", "maxMessageSizeBytes"),
            ("maxMessageSizeBytes=99999999999", "maxMessageSizeBytes"),
            (
                "maxMessageSizeBytes=1&maxMessageSizeBytes=2",
                "maxMessageSizeBytes",
            ),
            ("cursor=-1", "negative"),
            ("cursor=x", "invalid cursor"),
            ("zstdDictionary=0", "positive"),
        ] {
            let e = parse(q).unwrap_err();
            assert_eq!((e.status, e.error), (400, "InvalidRequest"), "{q}");
            assert!(e.message.contains(says), "{q}: {}", e.message);
        }
        let many: String = (0..101).map(|i| format!("collections=a.b.c{i}&")).collect();
        assert!(parse(&many)
            .unwrap_err()
            .message
            .contains("too many collections"));
        let many: String = (0..10_001).map(|i| format!("dids=did:plc:{i}&")).collect();
        assert!(parse(&many).unwrap_err().message.contains("too many dids"));
        let mut h = HeaderMap::new();
        h.insert("socket-encoding", "zstd".parse().unwrap());
        assert!(V2Options::parse("", &h).is_err());
    }
}
