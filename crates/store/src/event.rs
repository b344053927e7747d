//! One stored v1 event: its JSON and (while a `compress=true` subscriber wants it: the server's `log.rs`)
//! its zstd form, produced once at ingest, in one buffer.
//! (Kind `sync` (3) is stored in the same shape for v2's `subscribeEvents` and never sent on v1;
//! so is kind 4, a replacement row's `create` ([`EventKind::Replacement`]), whose JSON says
//! `"kind":"commit"`. A riptide older than kind 4 reads such a value as corrupt.)
//!
//! Why one buffer: the same bytes are the store's value, the in-memory tail's entry and, sliced,
//! the WebSocket message. Nothing is re-encoded between ingest and the socket; a clone is a
//! reference count.
//!
//! The JSON is checked to be UTF-8 once, when the event is made or read from the store
//! ([`Event::text`]): a WebSocket text message must be, and checking it per subscriber and send
//! was, with a thousand subscribers, a thousand checks of every event.
//!
//! The checked text's type is the server's ([`Text`]): the store does no HTTP, and a WebSocket
//! library's UTF-8 type has no way in but a check, so the server names the type it sends and the
//! check made here is the only one. Tools that send nothing use [`Utf8Text`].
//!
//! Layout (the store's value format, version 1):
//! `[u8 version=1][u8 kind][i64 time_us][u16 did len][did][u16 collection len][collection]`
//! `[u32 json len][json][zstd frame (may be empty: no dictionary, or not wanted at ingest)]`,
//! integers big-endian.

use std::ops::Range;

use bytes::Bytes;
use riptide_jetstream::{EventKind, Projector, RowError, StoredRow};

/// A stored value that does not follow the layout: the store is corrupt (ours, not upstream's).
#[derive(Debug, thiserror::Error)]
#[error("stored event {seq}: corrupt value ({what})")]
pub struct CorruptEvent {
    /// The event's seq.
    pub seq: u64,
    /// What is wrong.
    pub what: &'static str,
}

/// UTF-8 text as the server sends it (module docs): made from bytes by one check, or from a
/// `String` without one. Cheap to clone.
pub trait Text: Clone + std::fmt::Debug + Send + Sync + 'static {
    /// `bytes` as text, if they are UTF-8.
    fn from_utf8(bytes: Bytes) -> Option<Self>;
    /// A string as text (no check: it is UTF-8).
    fn from_string(s: String) -> Self;
    /// Its length in bytes.
    fn byte_len(&self) -> usize;
}

/// [`Text`] for what sends nothing (tools, tests): bytes checked to be UTF-8.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Utf8Text(Bytes);

impl Utf8Text {
    /// The text.
    pub fn as_str(&self) -> &str {
        // Checked when made (`from_utf8`) or made from a `String`; never fails.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

impl Text for Utf8Text {
    fn from_utf8(bytes: Bytes) -> Option<Self> {
        std::str::from_utf8(&bytes)
            .is_ok()
            .then_some(Utf8Text(bytes))
    }
    fn from_string(s: String) -> Self {
        Utf8Text(Bytes::from(s))
    }
    fn byte_len(&self) -> usize {
        self.0.len()
    }
}

/// One v1 event as served. Cheap to clone. `T` is the text type the server sends ([`Text`]).
#[derive(Clone, Debug)]
pub struct Event<T = Utf8Text> {
    seq: u64,
    time_us: i64,
    kind: EventKind,
    raw: Bytes,
    did: Range<usize>,
    collection: Range<usize>,
    json: Range<usize>,
    /// The JSON as text (`None`: not UTF-8, which what ingest writes always is).
    text: Option<T>,
    /// Its `subscribeEvents` frame, made once when the event enters the in-memory tail
    /// ([`Event::with_v2_frame`]); `None` for an event read from the store.
    v2: Option<T>,
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
        EventKind::Replacement => 4,
    }
}

/// Appends one stored value without its zstd form (the layout above) to `out`: the header,
/// `did` and `collection` (each cut to 65,535 bytes at a character boundary), and the JSON that
/// `json` appends. Where the DID, the collection and the JSON lie in `out`. For [`Event::encode`]
/// and for a row block rendered into the block cache (`crate::rows`), which writes its events'
/// JSON in place.
pub(crate) fn append_value(
    out: &mut Vec<u8>,
    time_us: i64,
    kind: EventKind,
    did: &str,
    collection: &str,
    json: impl FnOnce(&mut Vec<u8>),
) -> (Range<usize>, Range<usize>, Range<usize>) {
    let did = cut(did).as_bytes();
    let collection = cut(collection).as_bytes();
    out.push(VERSION);
    out.push(kind_byte(kind));
    out.extend_from_slice(&time_us.to_be_bytes());
    let field = |v: &mut Vec<u8>, len_bytes: &[u8], bytes: &[u8]| {
        v.extend_from_slice(len_bytes);
        let start = v.len();
        v.extend_from_slice(bytes);
        start..v.len()
    };
    let did_at = field(out, &(did.len() as u16).to_be_bytes(), did);
    let collection_at = field(out, &(collection.len() as u16).to_be_bytes(), collection);
    let len_at = out.len();
    out.extend_from_slice(&[0; 4]);
    json(out);
    let json_len = (out.len() - len_at - 4) as u32;
    out[len_at..len_at + 4].copy_from_slice(&json_len.to_be_bytes());
    (did_at, collection_at, len_at + 4..out.len())
}

impl<T: Text> Event<T> {
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
    ) -> Self {
        // Exactly the layout's size: a buffer even one byte short is reallocated (copied) at the
        // last append and left at twice the size, in the tail for as long as the event stays.
        let len = HEADER_LEN + cut(did).len() + cut(collection).len() + json.len() + zstd.len();
        let mut v = Vec::with_capacity(len);
        let (did_at, collection_at, json_at) =
            append_value(&mut v, time_us, kind, did, collection, |v| {
                v.extend_from_slice(json)
            });
        v.extend_from_slice(zstd);
        debug_assert_eq!(v.len(), len);
        let raw = Bytes::from(v);
        Event {
            seq,
            time_us,
            kind,
            text: T::from_utf8(raw.slice(json_at.clone())),
            v2: None,
            raw,
            did: did_at,
            collection: collection_at,
            json: json_at,
        }
    }

    /// The stored event of one row ([`StoredRow`]: what the store is moving to keep, issue 38),
    /// at `seq` and `time_us`: the row projected by [`Projector::project_row`] and rendered as
    /// ingest renders a frame's event (`{"did","time_us","cursor","kind",…}`), without its zstd
    /// form (made when a `compress=true` subscriber reads it). The one place where rows become
    /// v1 events outside the live ingest path: the backfill's rows go through it, and the store's
    /// own rows will. `json` is a scratch buffer. A row that does not render is the caller's to
    /// count ([`RowError`]).
    pub fn from_row(
        projector: &mut Projector,
        row: &StoredRow<'_>,
        seq: u64,
        time_us: i64,
        json: &mut Vec<u8>,
    ) -> Result<Self, RowError> {
        Self::from_row_as(projector, row, false, seq, time_us, json)
    }

    /// [`Event::from_row`] for a replacement's record (its `.jss` row a `create-resync`,
    /// `riptide_jetstream::replace`): the same JSON, of kind [`EventKind::Replacement`], which
    /// v1 never sends.
    pub fn replacement_from_row(
        projector: &mut Projector,
        row: &StoredRow<'_>,
        seq: u64,
        time_us: i64,
        json: &mut Vec<u8>,
    ) -> Result<Self, RowError> {
        Self::from_row_as(projector, row, true, seq, time_us, json)
    }

    /// The length of the stored value (without a zstd form) that [`Event::from_row`] would
    /// make of `row` at `seq` and `time_us`, rendered into the scratch buffer `json` and not
    /// kept: what a writer that hands the store rows without events
    /// ([`crate::Store::append_landing`]) checks each row with (a row that does not render is
    /// the caller's to count, as with [`Event::from_row`]) and measures it by.
    pub fn value_len_of_row(
        projector: &mut Projector,
        row: &StoredRow<'_>,
        seq: u64,
        time_us: i64,
        json: &mut Vec<u8>,
    ) -> Result<usize, RowError> {
        Self::value_len_of_hashed_row(projector, row, None, seq, time_us, json)
    }

    /// [`Event::value_len_of_row`] of a row whose record's SHA-256 is known already
    /// ([`Projector::project_row_hashed`]: a verified repository's record, not hashed again).
    pub fn value_len_of_hashed_row(
        projector: &mut Projector,
        row: &StoredRow<'_>,
        sha256: Option<&[u8]>,
        seq: u64,
        time_us: i64,
        json: &mut Vec<u8>,
    ) -> Result<usize, RowError> {
        let p = projector.project_row_hashed(row, sha256)?;
        json.clear();
        p.render(0, time_us, Some(seq), json);
        Ok(HEADER_LEN + cut(p.did(0)).len() + cut(p.collection(0)).len() + json.len())
    }

    fn from_row_as(
        projector: &mut Projector,
        row: &StoredRow<'_>,
        replacement: bool,
        seq: u64,
        time_us: i64,
        json: &mut Vec<u8>,
    ) -> Result<Self, RowError> {
        let p = projector.project_row(row)?;
        json.clear();
        p.render(0, time_us, Some(seq), json);
        let kind = match p.kind(0) {
            EventKind::Commit if replacement => EventKind::Replacement,
            k => k,
        };
        Ok(Event::encode(
            seq,
            time_us,
            kind,
            p.did(0),
            p.collection(0),
            json,
            &[],
        ))
    }

    /// Parses a stored value.
    pub fn decode(seq: u64, raw: Bytes) -> Result<Self, CorruptEvent> {
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
            4 => EventKind::Replacement,
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
            text: T::from_utf8(raw.slice(json.clone())),
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
    pub fn text(&self) -> Option<&T> {
        self.text.as_ref()
    }

    /// This event with its `subscribeEvents` frame made by `render` (the server's `v2::render`):
    /// for the in-memory tail, so that replay and fan-out on v2 send a frame made once, as v1
    /// sends the stored JSON.
    pub fn with_v2_frame(&self, render: impl FnOnce(&Self) -> Option<String>) -> Self {
        let mut e = self.clone();
        if e.v2.is_none() {
            e.v2 = render(self).map(T::from_string);
        }
        e
    }

    /// The `subscribeEvents` frame made by [`Event::with_v2_frame`], if it was.
    pub fn v2_frame(&self) -> Option<&T> {
        self.v2.as_ref()
    }

    /// Bytes this event holds in memory: the stored value and the v2 frame, if made.
    pub fn memory_len(&self) -> usize {
        self.raw.len() + self.v2.as_ref().map_or(0, T::byte_len)
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
        let e: Event = Event::encode(
            7,
            99,
            EventKind::Account,
            "did:plc:x",
            "",
            b"{\"a\":1}",
            b"zz",
        );
        let d: Event = Event::decode(7, e.raw().clone()).unwrap();
        assert_eq!(d.did(), b"did:plc:x");
        assert_eq!(d.collection(), b"");
        assert_eq!(&d.json()[..], b"{\"a\":1}");
        assert_eq!(&d.zstd()[..], b"zz");
        assert_eq!((d.time_us(), d.kind()), (99, EventKind::Account));
        let raw = e.raw().clone();
        for cut in 0..raw.len() - 2 {
            // Truncations inside the fixed fields or the JSON are caught.
            let _ = Event::<Utf8Text>::decode(1, raw.slice(..cut));
        }
        assert!(Event::<Utf8Text>::decode(1, raw.slice(..12)).is_err());

        // An over-long collection is cut on a character boundary, and the value still decodes
        // to what the encoder's event says.
        // 80,000 bytes of two-byte characters: byte 65,535 falls inside one.
        let long = "é".repeat(40_000);
        let e: Event = Event::encode(8, 1, EventKind::Commit, "did:plc:x", &long, b"{}", b"");
        assert_eq!(e.collection().len(), 65_534);
        assert!(long.as_bytes().starts_with(e.collection()));
        let d: Event = Event::decode(8, e.raw().clone()).unwrap();
        assert_eq!(d.collection(), e.collection());
        assert_eq!((d.did(), &d.json()[..]), (e.did(), &e.json()[..]));
        // The layout's size, byte for byte: the fixed fields, then did, collection, JSON, zstd.
        assert_eq!(raw.len(), 18 + 9 + 7 + 2);
        assert_eq!(HEADER_LEN, 18);
    }

    /// Every kind survives the stored value, a replacement's record as kind byte 4; a kind byte
    /// no riptide writes is a corrupt value, not a guess.
    #[test]
    fn every_kind_round_trips_and_an_unknown_kind_is_corrupt() {
        for kind in [
            EventKind::Commit,
            EventKind::Identity,
            EventKind::Account,
            EventKind::Sync,
            EventKind::Replacement,
        ] {
            let e: Event = Event::encode(3, 5, kind, "did:plc:x", "a.b.c", b"{}", b"");
            assert_eq!(e.raw()[1], kind_byte(kind));
            let d: Event = Event::decode(3, e.raw().clone()).unwrap();
            assert_eq!(d.kind(), kind);
        }
        assert_eq!(kind_byte(EventKind::Replacement), 4);
        let e: Event = Event::encode(3, 5, EventKind::Replacement, "did:plc:x", "", b"{}", b"");
        let mut raw = e.raw().to_vec();
        raw[1] = 5;
        let err = Event::<Utf8Text>::decode(3, Bytes::from(raw)).unwrap_err();
        assert_eq!(err.what, "kind");
    }

    #[test]
    fn a_row_becomes_the_event_ingest_would_store() {
        use riptide_firehose::Action;
        // {"$type": "a.b.c", "n": 3} in DAG-CBOR (shorter key first).
        let rec = [
            0xa2, 0x61, b'n', 0x03, 0x65, b'$', b't', b'y', b'p', b'e', 0x65, b'a', b'.', b'b',
            b'.', b'c',
        ];
        let row = |record| StoredRow::Commit {
            did: "did:plc:x",
            rev: "3l2222222222a",
            action: Action::Create,
            collection: "a.b.c",
            rkey: "k1",
            record: Some(record),
        };
        let (mut proj, mut json) = (Projector::new(), Vec::new());
        // A replacement's record: the same JSON, of its own kind.
        let r: Event =
            Event::replacement_from_row(&mut proj, &row(&rec), 42, 1_000_007, &mut json).unwrap();
        assert_eq!(r.kind(), EventKind::Replacement);
        let e: Event = Event::from_row(&mut proj, &row(&rec), 42, 1_000_007, &mut json).unwrap();
        assert_eq!(r.json(), e.json());
        assert_eq!(
            (e.seq(), e.time_us(), e.kind()),
            (42, 1_000_007, EventKind::Commit)
        );
        assert_eq!(
            (e.did(), e.collection()),
            (&b"did:plc:x"[..], &b"a.b.c"[..])
        );
        let text = std::str::from_utf8(&e.json()).unwrap().to_owned();
        let (head, cid) = text.split_once(",\"cid\":\"").unwrap();
        assert_eq!(
            head,
            "{\"did\":\"did:plc:x\",\"time_us\":1000007,\"cursor\":42,\"kind\":\"commit\",\"commit\":{\"rev\":\"3l2222222222a\",\"operation\":\"create\",\"collection\":\"a.b.c\",\"rkey\":\"k1\",\"record\":{\"$type\":\"a.b.c\",\"n\":3}"
        );
        // The record's CID (CIDv1, DAG-CBOR, SHA-256: base32 `bafyrei…`), then the ends.
        assert!(cid.starts_with("bafyrei") && cid.ends_with("\"}}"), "{cid}");
        assert!(e.zstd().is_empty());
        // Decodes as a stored value.
        let d: Event = Event::decode(42, e.raw().clone()).unwrap();
        assert_eq!(d.json(), e.json());
        // A record outside the data model (a CBOR float where none may be) is the caller's to count.
        let bad = [0xa1, 0x61, b'n', 0xf9, 0x3c, 0x00];
        assert!(matches!(
            Event::<Utf8Text>::from_row(&mut proj, &row(&bad), 43, 1, &mut json),
            Err(RowError::Record(_))
        ));
    }
}
