//! Subscriber options (protocol §1.2, §2, §7): the query string at connect time and
//! `options_update` messages, validated the same way, with the documented limits.

use std::collections::HashSet;

use riptide_syntax::{is_valid_did, is_valid_nsid};
use serde_json::Value;

use crate::Event;

/// Most collections (exact and prefixes together, after de-duplication).
pub const MAX_COLLECTIONS: usize = 100;
/// Most DIDs (after de-duplication).
pub const MAX_DIDS: usize = 10_000;
/// Seq cursors are below this; timestamps (unix µs) at or above.
pub const CURSOR_SPLIT: i64 = 1_000_000_000_000_000;

/// Options that fail validation: the message is the 400 body or the 1008 close reason.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid subscriber options: {0}")]
pub struct OptionsError(pub String);

/// What a subscriber wants: the part `options_update` can replace.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Filter {
    exact: HashSet<Box<[u8]>>,
    prefixes: Vec<Box<[u8]>>,
    dids: HashSet<Box<[u8]>>,
    /// 0 = unlimited.
    pub max_size: u32,
}

impl Filter {
    /// Builds a filter from raw lists, validating them (§1.2).
    pub fn new<'a>(
        collections: impl IntoIterator<Item = &'a str>,
        dids: impl IntoIterator<Item = &'a str>,
        max_size: u32,
    ) -> Result<Filter, OptionsError> {
        let mut f = Filter {
            max_size,
            ..Filter::default()
        };
        let (mut raw_c, mut raw_d) = (0usize, 0usize);
        let mut prefixes = HashSet::new();
        for c in collections {
            raw_c += 1;
            if raw_c > MAX_COLLECTIONS * 100 {
                return Err(OptionsError(format!(
                    "too many collections (limit {MAX_COLLECTIONS})"
                )));
            }
            if let Some(head) = c.strip_suffix('*').filter(|h| h.ends_with('.')) {
                prefixes.insert(head.as_bytes().into());
            } else if is_valid_nsid(c) {
                f.exact.insert(c.as_bytes().into());
            } else {
                return Err(OptionsError(format!("invalid collection: {c}")));
            }
        }
        f.prefixes = prefixes.into_iter().collect();
        if f.exact.len() + f.prefixes.len() > MAX_COLLECTIONS {
            return Err(OptionsError(format!(
                "too many collections (limit {MAX_COLLECTIONS})"
            )));
        }
        for d in dids {
            raw_d += 1;
            if raw_d > MAX_DIDS * 100 {
                return Err(OptionsError(format!("too many DIDs (limit {MAX_DIDS})")));
            }
            if !is_valid_did(d) {
                return Err(OptionsError(format!("invalid DID: {d}")));
            }
            f.dids.insert(d.as_bytes().into());
        }
        if f.dids.len() > MAX_DIDS {
            return Err(OptionsError(format!("too many DIDs (limit {MAX_DIDS})")));
        }
        Ok(f)
    }

    /// Whether the subscriber wants `e` (size aside). Identity and account events ignore the
    /// collection filter; a commit with an empty collection passes it (§7.1–2).
    pub fn wants(&self, e: &Event) -> bool {
        if !self.dids.is_empty() && !self.dids.contains(e.did()) {
            return false;
        }
        if !e.kind().is_commit() || (self.exact.is_empty() && self.prefixes.is_empty()) {
            return true;
        }
        let c = e.collection();
        c.is_empty() || self.exact.contains(c) || self.prefixes.iter().any(|p| c.starts_with(p))
    }
}

/// Where a subscriber starts (§4.3), before resolution against the log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cursor {
    /// No cursor: live.
    Live,
    /// A seq (below [`CURSOR_SPLIT`]).
    Seq(u64),
    /// A unix-microsecond timestamp.
    Time(i64),
}

/// Everything a `/subscribe` query string says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubscribeOptions {
    /// The filter.
    pub filter: Filter,
    /// Where to start.
    pub cursor: Cursor,
    /// zstd with the dictionary (`compress=true` or a `Socket-Encoding` containing `zstd`).
    pub compress: bool,
    /// Wait for the first `options_update`.
    pub require_hello: bool,
}

/// `maxMessageSizeBytes` from the query: anything unusable means 0 (unlimited).
fn size_param(v: &str) -> u32 {
    v.parse::<i64>()
        .ok()
        .and_then(|n| u32::try_from(n).ok())
        .unwrap_or(0)
}

impl SubscribeOptions {
    /// Parses a raw query string and the `Socket-Encoding` header.
    pub fn parse(
        query: &str,
        socket_encoding: Option<&str>,
    ) -> Result<SubscribeOptions, OptionsError> {
        let (mut cols, mut dids) = (Vec::new(), Vec::new());
        let (mut cursor, mut compress, mut hello, mut size) = (Cursor::Live, false, false, 0);
        for (k, v) in form_urlencoded::parse(query.as_bytes()) {
            match &*k {
                "wantedCollections" => cols.push(v.into_owned()),
                "wantedDids" => dids.push(v.into_owned()),
                "cursor" if v.is_empty() => cursor = Cursor::Live,
                "cursor" => {
                    let n: i64 = v
                        .parse()
                        .map_err(|_| OptionsError(format!("invalid cursor: {v}")))?;
                    cursor = match n {
                        n if n < 0 => {
                            return Err(OptionsError(format!("invalid cursor: {v} is negative")))
                        }
                        n if n < CURSOR_SPLIT => Cursor::Seq(n as u64),
                        n => Cursor::Time(n),
                    };
                }
                "compress" => compress = v == "true",
                "requireHello" => hello = v == "true",
                "maxMessageSizeBytes" => size = size_param(&v),
                _ => {}
            }
        }
        compress |= socket_encoding.is_some_and(|h| h.contains("zstd"));
        let filter = Filter::new(
            cols.iter().map(String::as_str),
            dids.iter().map(String::as_str),
            size,
        )?;
        Ok(SubscribeOptions {
            filter,
            cursor,
            compress,
            require_hello: hello,
        })
    }
}

/// What a client text message asks for.
#[derive(Debug, PartialEq, Eq)]
pub enum ClientMessage {
    /// A valid `options_update`: the new filter.
    Update(Filter),
    /// Any other type (ignored).
    Ignored,
}

/// Why a client message closes the connection: 1007 (bad JSON) or 1008 (bad options).
#[derive(Debug, PartialEq, Eq)]
pub struct ClientError {
    /// The close code.
    pub code: u16,
    /// The close reason (at most 123 bytes).
    pub reason: String,
}

/// Cuts a close reason to 123 bytes on a UTF-8 boundary, ending `...` when cut.
pub fn close_reason(s: &str) -> String {
    if s.len() <= 123 {
        return s.to_string();
    }
    let mut end = 120;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}

fn strings<'a>(v: Option<&'a Value>, field: &str) -> Result<Vec<&'a str>, ClientError> {
    let bad = || ClientError {
        code: 1007,
        reason: close_reason(&format!(
            "invalid payload: {field} must be a list of strings"
        )),
    };
    match v {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(a)) => a.iter().map(|x| x.as_str().ok_or_else(bad)).collect(),
        Some(_) => Err(bad()),
    }
}

/// Parses a client text message (§2).
pub fn parse_client_message(text: &[u8]) -> Result<ClientMessage, ClientError> {
    let bad = |why: &str| ClientError {
        code: 1007,
        reason: close_reason(why),
    };
    let v: Value = serde_json::from_slice(text).map_err(|_| bad("invalid message: not JSON"))?;
    let obj = v
        .as_object()
        .ok_or_else(|| bad("invalid message: not a JSON object"))?;
    match obj.get("type") {
        Some(Value::String(t)) if t == "options_update" => {}
        Some(Value::String(_)) => return Ok(ClientMessage::Ignored),
        _ => return Err(bad("invalid message: no type")),
    }
    let p = obj
        .get("payload")
        .and_then(Value::as_object)
        .ok_or_else(|| bad("invalid payload: not a JSON object"))?;
    let cols = strings(p.get("wantedCollections"), "wantedCollections")?;
    let dids = strings(p.get("wantedDids"), "wantedDids")?;
    let size = match p.get("maxMessageSizeBytes") {
        None | Some(Value::Null) => 0,
        Some(Value::Number(n)) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) if i < 0 => 0,
            (_, Some(u)) => u32::try_from(u).unwrap_or(0),
            _ => {
                return Err(bad(
                    "invalid payload: maxMessageSizeBytes must be an integer",
                ))
            }
        },
        Some(_) => {
            return Err(bad(
                "invalid payload: maxMessageSizeBytes must be an integer",
            ))
        }
    };
    Filter::new(cols, dids, size)
        .map(ClientMessage::Update)
        .map_err(|e| ClientError {
            code: 1008,
            reason: close_reason(&e.to_string()),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use riptide_jetstream::EventKind;

    fn ev(did: &str, coll: &str, kind: EventKind) -> Event {
        Event::encode(1, 1, kind, did, coll, b"{}", b"")
    }

    #[test]
    fn query_parsing_and_limits() {
        let o = SubscribeOptions::parse(
            "wantedCollections=app.bsky.feed.post&wantedCollections=app.bsky.graph.*&cursor=5&compress=true&maxMessageSizeBytes=-3",
            None,
        )
        .unwrap();
        assert_eq!(o.cursor, Cursor::Seq(5));
        assert!(o.compress && !o.require_hello);
        assert_eq!(o.filter.max_size, 0);
        assert!(o
            .filter
            .wants(&ev("did:plc:a", "app.bsky.graph.follow", EventKind::Commit)));
        assert!(o
            .filter
            .wants(&ev("did:plc:a", "app.bsky.feed.post", EventKind::Commit)));
        assert!(!o
            .filter
            .wants(&ev("did:plc:a", "app.bsky.feed.like", EventKind::Commit)));
        assert!(o.filter.wants(&ev("did:plc:a", "", EventKind::Identity)));
        assert!(o.filter.wants(&ev("did:plc:a", "", EventKind::Commit)));
        assert_eq!(
            SubscribeOptions::parse("cursor=1779719010267528", None)
                .unwrap()
                .cursor,
            Cursor::Time(1779719010267528)
        );
        assert_eq!(
            SubscribeOptions::parse("cursor=", None).unwrap().cursor,
            Cursor::Live
        );
        assert!(SubscribeOptions::parse("cursor=abc", None).is_err());
        assert!(SubscribeOptions::parse("cursor=-1", None).is_err());
        assert!(SubscribeOptions::parse("wantedCollections=app.bsky.fo*", None).is_err());
        assert!(SubscribeOptions::parse("wantedCollections=foo.*", None).is_ok());
        assert!(SubscribeOptions::parse("wantedDids=bob", None).is_err());
        assert!(SubscribeOptions::parse("compress=TRUE", None).is_ok_and(|o| !o.compress));
        assert!(
            SubscribeOptions::parse("", Some("gzip, zstd"))
                .unwrap()
                .compress
        );
        assert_eq!(
            SubscribeOptions::parse("maxMessageSizeBytes=99999999999", None)
                .unwrap()
                .filter
                .max_size,
            0
        );
        let many: String = (0..101)
            .map(|i| format!("wantedCollections=a.b.c{i}&"))
            .collect();
        assert!(SubscribeOptions::parse(&many, None).is_err());
        // Limits count after de-duplication.
        let dup: String = (0..150).map(|_| "wantedCollections=a.b.c&").collect();
        assert!(SubscribeOptions::parse(&dup, None).is_ok());
    }

    #[test]
    fn client_messages() {
        let m = parse_client_message(br#"{"type":"options_update","payload":{"wantedDids":["did:plc:x"],"maxMessageSizeBytes":10}}"#);
        let ClientMessage::Update(f) = m.unwrap() else {
            panic!()
        };
        assert_eq!(f.max_size, 10);
        assert!(!f.wants(&ev("did:plc:y", "a.b.c", EventKind::Commit)));
        assert_eq!(
            parse_client_message(br#"{"type":"heartbeat"}"#),
            Ok(ClientMessage::Ignored)
        );
        assert_eq!(parse_client_message(b"{nope").unwrap_err().code, 1007);
        assert_eq!(
            parse_client_message(br#"{"type":"options_update","payload":{"wantedDids":"x"}}"#)
                .unwrap_err()
                .code,
            1007
        );
        assert_eq!(
            parse_client_message(br#"{"type":"options_update","payload":{"wantedDids":["x"]}}"#)
                .unwrap_err()
                .code,
            1008
        );
        let long = "é".repeat(100);
        let r = close_reason(&long);
        assert!(r.len() <= 123 && r.ends_with("..."));
    }
}
