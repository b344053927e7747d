//! One stored v1 event: its JSON and (while a `compress=true` subscriber wants it: `crate::log`)
//! its zstd form, produced once at ingest, in one buffer.
//! (Kind `sync` (3) is stored in the same shape for v2's `subscribeEvents` and never sent on v1.)
//!
//! Why one buffer: the same bytes are the store's value, the in-memory tail's entry and, sliced,
//! the WebSocket message. Nothing is re-encoded between ingest and the socket; a clone is a
//! reference count.
//!
//! The JSON is checked to be UTF-8 once, when the event is made or read from the store
//! ([`Event::text`]): a WebSocket text message must be, and checking it per subscriber and send
//! was, with a thousand subscribers, a thousand checks of every event.
//!
//! Layout (the store's value format, version 1):
//! `[u8 version=1][u8 kind][i64 time_us][u16 did len][did][u16 collection len][collection]`
//! `[u32 json len][json][zstd frame (may be empty: no dictionary, or not wanted at ingest)]`,
//! integers big-endian.

use std::ops::Range;

use axum::extract::ws::Utf8Bytes;
use bytes::Bytes;
use riptide_jetstream::EventKind;

/// A stored value that does not follow the layout: the store is corrupt (ours, not upstream's).
#[derive(Debug, thiserror::Error)]
#[error("stored event {seq}: corrupt value ({what})")]
pub struct CorruptEvent {
    /// The event's seq.
    pub seq: u64,
    /// What is wrong.
    pub what: &'static str,
}

/// One v1 event as served. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Event {
    seq: u64,
    time_us: i64,
    kind: EventKind,
    raw: Bytes,
    did: Range<usize>,
    collection: Range<usize>,
    json: Range<usize>,
    /// The JSON as text (`None`: not UTF-8, which what ingest writes always is).
    text: Option<Utf8Bytes>,
    /// Its `subscribeEvents` frame, made once when the event enters the in-memory tail
    /// ([`Event::with_v2_frame`]); `None` for an event read from the store.
    v2: Option<Utf8Bytes>,
}

const VERSION: u8 = 1;

/// The fixed part of the layout: version, kind, time, and the three lengths.
const HEADER_LEN: usize = 1 + 1 + 8 + 2 + 2 + 4;

/// `s` cut to at most 65,535 bytes (a `u16` length), on a character boundary.
fn cut(s: &str) -> &str {
    let mut end = s.len().min(u16::MAX as usize);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

fn kind_byte(k: EventKind) -> u8 {
    match k {
        EventKind::Commit => 0,
        EventKind::Identity => 1,
        EventKind::Account => 2,
        EventKind::Sync => 3,
    }
}

impl Event {
    /// Builds the stored form, and the event over it (the ranges are known as it is written: it
    /// is not parsed back). `did` and `collection` longer than 65,535 bytes are cut, on a
    /// character boundary so the value still decodes (they are only filter keys; the JSON keeps
    /// them whole) — neither can be that long once validated.
    pub fn encode(
        seq: u64,
        time_us: i64,
        kind: EventKind,
        did: &str,
        collection: &str,
        json: &[u8],
        zstd: &[u8],
    ) -> Event {
        let did = cut(did).as_bytes();
        let collection = cut(collection).as_bytes();
        // Exactly the layout's size: a buffer even one byte short is reallocated (copied) at the
        // last append and left at twice the size, in the tail for as long as the event stays.
        let len = HEADER_LEN + did.len() + collection.len() + json.len() + zstd.len();
        let mut v = Vec::with_capacity(len);
        v.push(VERSION);
        v.push(kind_byte(kind));
        v.extend_from_slice(&time_us.to_be_bytes());
        let field = |v: &mut Vec<u8>, len_bytes: &[u8], bytes: &[u8]| {
            v.extend_from_slice(len_bytes);
            let start = v.len();
            v.extend_from_slice(bytes);
            start..v.len()
        };
        let did_at = field(&mut v, &(did.len() as u16).to_be_bytes(), did);
        let collection_at = field(&mut v, &(collection.len() as u16).to_be_bytes(), collection);
        let json_at = field(&mut v, &(json.len() as u32).to_be_bytes(), json);
        v.extend_from_slice(zstd);
        debug_assert_eq!(v.len(), len);
        let raw = Bytes::from(v);
        Event {
            seq,
            time_us,
            kind,
            text: Utf8Bytes::try_from(raw.slice(json_at.clone())).ok(),
            v2: None,
            raw,
            did: did_at,
            collection: collection_at,
            json: json_at,
        }
    }

    /// Parses a stored value.
    pub fn decode(seq: u64, raw: Bytes) -> Result<Event, CorruptEvent> {
        let bad = |what| CorruptEvent { seq, what };
        let b = &raw[..];
        if b.len() < 12 || b[0] != VERSION {
            return Err(bad("header"));
        }
        let kind = match b[1] {
            0 => EventKind::Commit,
            1 => EventKind::Identity,
            2 => EventKind::Account,
            3 => EventKind::Sync,
            _ => return Err(bad("kind")),
        };
        let time_us = i64::from_be_bytes(b[2..10].try_into().map_err(|_| bad("time"))?);
        let mut pos = 10;
        let mut take = |width: usize| -> Result<Range<usize>, CorruptEvent> {
            let lb = b.get(pos..pos + width).ok_or_else(|| bad("length"))?;
            let len = lb.iter().fold(0usize, |a, &x| (a << 8) | x as usize);
            let start = pos + width;
            if start + len > b.len() {
                return Err(bad("truncated"));
            }
            pos = start + len;
            Ok(start..pos)
        };
        let did = take(2)?;
        let collection = take(2)?;
        let json = take(4)?;
        if std::str::from_utf8(&b[did.clone()]).is_err()
            || std::str::from_utf8(&b[collection.clone()]).is_err()
        {
            return Err(bad("utf-8"));
        }
        Ok(Event {
            seq,
            time_us,
            kind,
            text: Utf8Bytes::try_from(raw.slice(json.clone())).ok(),
            v2: None,
            raw,
            did,
            collection,
            json,
        })
    }

    /// Server seq (the `cursor` field).
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// `time_us`.
    pub fn time_us(&self) -> i64 {
        self.time_us
    }

    /// The event kind.
    pub fn kind(&self) -> EventKind {
        self.kind
    }

    /// The account DID.
    pub fn did(&self) -> &[u8] {
        &self.raw[self.did.clone()]
    }

    /// The commit's collection (empty for identity and account).
    pub fn collection(&self) -> &[u8] {
        &self.raw[self.collection.clone()]
    }

    /// The v1 JSON text.
    pub fn json(&self) -> Bytes {
        self.raw.slice(self.json.clone())
    }

    /// The JSON as a text message's payload, checked once (module docs); `None` if it is not
    /// UTF-8 (never for what ingest writes; such an event is not sent, and counted).
    pub fn text(&self) -> Option<&Utf8Bytes> {
        self.text.as_ref()
    }

    /// This event with its `subscribeEvents` frame made (`crate::v2`): for the in-memory tail,
    /// so that replay and fan-out on v2 send a frame made once, as v1 sends the stored JSON.
    pub fn with_v2_frame(&self) -> Event {
        let mut e = self.clone();
        if e.v2.is_none() {
            e.v2 = crate::v2::render(self).map(Utf8Bytes::from);
        }
        e
    }

    /// The `subscribeEvents` frame made by [`Event::with_v2_frame`], if it was.
    pub fn v2_frame(&self) -> Option<&Utf8Bytes> {
        self.v2.as_ref()
    }

    /// Bytes this event holds in memory: the stored value and the v2 frame, if made.
    pub fn memory_len(&self) -> usize {
        self.raw.len() + self.v2.as_ref().map_or(0, |f| f.len())
    }

    /// Length of the JSON (what `maxMessageSizeBytes` compares against).
    pub fn json_len(&self) -> usize {
        self.json.len()
    }

    /// The zstd frame of the JSON (empty when the server has no dictionary).
    pub fn zstd(&self) -> Bytes {
        self.raw.slice(self.json.end..)
    }

    /// Length of the zstd frame (0 when it is not held: no dictionary, or read from a sealed
    /// block of the store, which keeps only the JSON).
    pub fn zstd_len(&self) -> usize {
        self.raw.len() - self.json.end
    }

    /// The stored value.
    pub fn raw(&self) -> &Bytes {
        &self.raw
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let e = Event::encode(
            7,
            99,
            EventKind::Account,
            "did:plc:x",
            "",
            b"{\"a\":1}",
            b"zz",
        );
        let d = Event::decode(7, e.raw().clone()).unwrap();
        assert_eq!(d.did(), b"did:plc:x");
        assert_eq!(d.collection(), b"");
        assert_eq!(&d.json()[..], b"{\"a\":1}");
        assert_eq!(&d.zstd()[..], b"zz");
        assert_eq!((d.time_us(), d.kind()), (99, EventKind::Account));
        let raw = e.raw().clone();
        for cut in 0..raw.len() - 2 {
            // Truncations inside the fixed fields or the JSON are caught.
            let _ = Event::decode(1, raw.slice(..cut));
        }
        assert!(Event::decode(1, raw.slice(..12)).is_err());

        // An over-long collection is cut on a character boundary, and the value still decodes
        // to what the encoder's event says.
        // 80,000 bytes of two-byte characters: byte 65,535 falls inside one.
        let long = "é".repeat(40_000);
        let e = Event::encode(8, 1, EventKind::Commit, "did:plc:x", &long, b"{}", b"");
        assert_eq!(e.collection().len(), 65_534);
        assert!(long.as_bytes().starts_with(e.collection()));
        let d = Event::decode(8, e.raw().clone()).unwrap();
        assert_eq!(d.collection(), e.collection());
        assert_eq!((d.did(), &d.json()[..]), (e.did(), &e.json()[..]));
        // The layout's size, byte for byte: the fixed fields, then did, collection, JSON, zstd.
        assert_eq!(raw.len(), 18 + 9 + 7 + 2);
        assert_eq!(HEADER_LEN, 18);
    }
}
