//! Relay frame → Jetstream v1 events (protocol §3, §4.1, §7).
//!
//! Mapping: a `#commit` gives one event per op, in op order; `#identity` and `#account` give one
//! event each; `#sync`, `#info`, error frames and unknown types give none. Drops, each counted in
//! [`Projection::drops`] (never silent):
//! - an event whose DID (a commit's `repo`, an identity, account or sync event's `did`) is not a
//!   DID (syntax, at most 2,048 bytes): every op of a commit, or the event. A signed commit with
//!   such a DID cannot be verified, but identity and account events are not signed and
//!   `--no-verify` checks nothing, and downstream (the store's and Kafka's records, whose DID
//!   lengths are `u16`) relies on a DID being one;
//! - a commit whose `rev` is not a TID: every op of it;
//! - an op whose collection is not an NSID or whose record key is invalid;
//! - a create or update whose record block is not in the CAR (block CID = op CID);
//! - a record outside the atproto data model or not strict DAG-CBOR (a float, say): v2 Jetstream
//!   skips these silently; we skip and count.
//!
//! The projection renders each event's body once, without `time_us` and `cursor`: those belong to
//! the server that assigns them ([`Projection::render`] adds them). Records are rendered straight
//! from the CBOR tape, keys sorted bytewise, strings escaped as Go does.

use std::ops::Range;

use riptide_cbor::{
    encode_value, write_int, write_json, write_json_bytes, write_json_int, write_json_string,
    write_map_header, write_text, Arena, Cid, CidBuf, Options, Value, DAG_CBOR,
};
use riptide_firehose::{Action, Body, Frame, FrameDecoder};
use riptide_syntax::{is_valid_did, is_valid_nsid, is_valid_record_key, is_valid_tid};

/// The `kind` of a v1 event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// A record created, updated or deleted.
    Commit,
    /// An `#identity` event.
    Identity,
    /// An `#account` event.
    Account,
    /// A `#sync` event: stored for Jetstream v2's `subscribeEvents`, never sent on v1 (only a
    /// [`Projector::with_sync`] projects it).
    Sync,
    /// A replacement row's `create` (`.jss` kind 7, `create-resync`: a verified repository
    /// landing over an account's earlier rows, [`crate::replace`]): a commit on Jetstream v2's
    /// `subscribeEvents` and in the archive, never sent on v1 `/subscribe` (protocol §4.1, §7
    /// item 8). Its v1 JSON says `"kind":"commit"`. No projection of a frame or a
    /// [`StoredRow`] gives it: it is the kind of the row ([`EventKind::of_row`]).
    Replacement,
}

impl EventKind {
    /// `commit`, `identity`, `account` or `sync`: the v1 JSON's `kind` (`commit` for a
    /// [`EventKind::Replacement`]).
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Commit | EventKind::Replacement => "commit",
            EventKind::Identity => "identity",
            EventKind::Account => "account",
            EventKind::Sync => "sync",
        }
    }

    /// A commit: an ordinary one or a replacement's (what the collection filters and a v2
    /// frame's flat commit fields apply to).
    pub fn is_commit(self) -> bool {
        matches!(self, EventKind::Commit | EventKind::Replacement)
    }

    /// Whether v1 `/subscribe` sends events of this kind: not a `#sync` nor a replacement's
    /// record (protocol §4.1, §7 item 8).
    pub fn sent_on_v1(self) -> bool {
        !matches!(self, EventKind::Sync | EventKind::Replacement)
    }

    /// The kind of the event a `.jss` row of kind `row` is: a `create-resync` is a
    /// [`EventKind::Replacement`], a create, update or delete a commit.
    pub fn of_row(row: riptide_segment::Kind) -> EventKind {
        use riptide_segment::Kind;
        match row {
            Kind::Create | Kind::Update | Kind::Delete => EventKind::Commit,
            Kind::CreateResync => EventKind::Replacement,
            Kind::Identity => EventKind::Identity,
            Kind::Account => EventKind::Account,
            Kind::Sync => EventKind::Sync,
        }
    }
}

/// Why an op produced no event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DropReason {
    /// The event's DID is not a valid DID (a whole commit, or the event, is dropped).
    InvalidDid,
    /// The commit's `rev` is not a valid TID (the whole commit is dropped).
    InvalidRev,
    /// The op's collection is not a valid NSID.
    InvalidCollection,
    /// The op's record key is not valid.
    InvalidRkey,
    /// The record block named by the op's CID is not in the CAR.
    MissingRecord,
    /// The record is not strict DAG-CBOR in the atproto data model.
    BadRecord,
}

impl DropReason {
    /// A stable kebab-case name, for counters.
    pub fn as_str(self) -> &'static str {
        match self {
            DropReason::InvalidDid => "invalid-did",
            DropReason::InvalidRev => "invalid-rev",
            DropReason::InvalidCollection => "invalid-collection",
            DropReason::InvalidRkey => "invalid-rkey",
            DropReason::MissingRecord => "missing-record",
            DropReason::BadRecord => "bad-record",
        }
    }
}

/// One projected event: where its pieces lie in [`Projection`]'s buffer.
#[derive(Clone, Debug)]
struct Part {
    kind: EventKind,
    did: Range<usize>,
    collection: Range<usize>,
    /// `"commit":{…}` (or identity/account), i.e. everything after `"kind":"…",` but the final `}`.
    body: Range<usize>,
}

/// The events of one frame, rendered once, ready to be stamped with `time_us` and `cursor`.
#[derive(Debug, Default)]
pub struct Projection {
    buf: Vec<u8>,
    parts: Vec<Part>,
    drops: Vec<(usize, DropReason)>,
}

impl Projection {
    /// Number of events.
    pub fn len(&self) -> usize {
        self.parts.len()
    }

    /// Whether the frame produced no event.
    pub fn is_empty(&self) -> bool {
        self.parts.is_empty()
    }

    /// What produced no event: (op index, or 0 for an identity, account or sync event; reason).
    pub fn drops(&self) -> &[(usize, DropReason)] {
        &self.drops
    }

    fn text(&self, r: &Range<usize>) -> &str {
        // Only ever filled from `&str` data and ASCII JSON syntax.
        std::str::from_utf8(&self.buf[r.clone()]).unwrap_or_default()
    }

    /// The `kind` of event `i`.
    pub fn kind(&self, i: usize) -> EventKind {
        self.parts[i].kind
    }

    /// The account DID of event `i` (for `wantedDids`).
    pub fn did(&self, i: usize) -> &str {
        self.text(&self.parts[i].did)
    }

    /// The collection of commit event `i` (for `wantedCollections`); empty for other kinds.
    pub fn collection(&self, i: usize) -> &str {
        self.text(&self.parts[i].collection)
    }

    /// Appends the complete v1 JSON of event `i`:
    /// `{"did","time_us","cursor","kind",<kind>}`. `cursor` is omitted when `None` (legacy).
    pub fn render(&self, i: usize, time_us: i64, cursor: Option<u64>, out: &mut Vec<u8>) {
        self.render_head(i, out);
        write_json_int(out, time_us);
        if let Some(c) = cursor {
            out.extend_from_slice(b",\"cursor\":");
            write_json_int(out, c as i64);
        }
        self.render_tail(i, out);
    }

    /// The part of [`render`](Projection::render) before the `time_us` value:
    /// `{"did":"…","time_us":`. With [`render_tail`](Projection::render_tail), for a caller that
    /// stamps the time and cursor later (the server's writer, after verification, in order).
    pub fn render_head(&self, i: usize, out: &mut Vec<u8>) {
        out.extend_from_slice(b"{\"did\":");
        write_json_string(out, self.did(i));
        out.extend_from_slice(b",\"time_us\":");
    }

    /// The part of [`render`](Projection::render) after the `time_us` value and the cursor:
    /// `,"kind":"…",<kind's fields>}`.
    pub fn render_tail(&self, i: usize, out: &mut Vec<u8>) {
        let p = &self.parts[i];
        out.extend_from_slice(b",\"kind\":\"");
        out.extend_from_slice(p.kind.as_str().as_bytes());
        out.extend_from_slice(b"\",");
        out.extend_from_slice(&self.buf[p.body.clone()]);
        out.push(b'}');
    }
}

/// Reusable projection state. One per thread.
#[derive(Debug, Default)]
pub struct Projector {
    arena: Arena,
    out: Projection,
    sync: bool,
    /// Decodes stored identity, account and sync rows ([`Projector::project_row`]).
    rows: FrameDecoder,
    /// The frame a stored event row is decoded from: header, then the row's payload.
    row_frame: Vec<u8>,
    /// A block's record digests ([`Projector::project_rows`]), kept for reuse.
    digests: Vec<riptide_sha::Digest>,
}

impl Projector {
    /// A projector with empty storage.
    pub fn new() -> Projector {
        Projector::default()
    }

    /// A projector that also projects `#sync` frames, to one event of kind [`EventKind::Sync`]
    /// each: `"sync":{"blocks":{"$bytes":…},"did","rev","seq","time"}`, the upstream event
    /// (keys sorted, as identity and account). For the server's store, which keeps them for
    /// Jetstream v2's wire; v1 never sends them (protocol §4.1).
    pub fn with_sync() -> Projector {
        Projector {
            sync: true,
            ..Projector::default()
        }
    }

    /// Projects one decoded frame. Records are taken from the frame's decoded blocks when it has
    /// them, otherwise decoded here strictly, one at a time, so that one bad record drops one op
    /// and not the frame.
    pub fn project(&mut self, frame: &Frame<'_>) -> &Projection {
        project_into(&mut self.arena, &mut self.out, self.sync, frame);
        &self.out
    }

    /// Projects one stored row (issue 38: the store keeps rows, not JSON) to its v1 event: byte
    /// for byte what [`Projector::project`] made of the frame the row came from. A commit row's
    /// record is rendered from its DAG-CBOR and its `cid` is the SHA-256 of those bytes, which is
    /// the op's CID in a verified frame (the CAR's blocks are checked against their CIDs). An
    /// identity, account or sync row's payload is the upstream event's DAG-CBOR, decoded as the
    /// frame's payload was.
    pub fn project_row(&mut self, row: &StoredRow<'_>) -> Result<&Projection, RowError> {
        let cid = match *row {
            StoredRow::Commit {
                record: Some(r), ..
            } => Some(CidBuf::sha256(DAG_CBOR, r)),
            _ => None,
        };
        self.project_row_with(row, cid)
    }

    /// [`Projector::project_row`] for a row whose record's SHA-256 is known already: `sha256`
    /// is the digest of the row's record bytes (a verified repository's record CID's digest: the
    /// CAR reader checked it against the bytes, `riptide_car::verify_block`), so the record is
    /// not hashed again. The same projection as [`Projector::project_row`]; without a digest (or
    /// one not 32 bytes long) the record is hashed here, as there.
    pub fn project_row_hashed(
        &mut self,
        row: &StoredRow<'_>,
        sha256: Option<&[u8]>,
    ) -> Result<&Projection, RowError> {
        match (row, sha256) {
            (
                StoredRow::Commit {
                    record: Some(_), ..
                },
                Some(d),
            ) if d.len() == 32 => {
                let cid = CidBuf::from_sha256_digest(DAG_CBOR, d);
                self.project_row_with(row, Some(cid))
            }
            _ => self.project_row(row),
        }
    }

    /// Projects a block's rows, in order, handing `each` every row's index and v1 event (or why
    /// it has none), as [`Projector::project_row`] does one by one; the records' CIDs are
    /// hashed together first ([`riptide_sha::Kernel::digests`]: two or sixteen messages at a
    /// time, where one at a time left the CPU's SHA unit waiting on each message's chain). For
    /// the store, which renders a block of rows once for all its readers.
    pub fn project_rows(
        &mut self,
        rows: &[StoredRow<'_>],
        mut each: impl FnMut(usize, Result<&Projection, RowError>),
    ) {
        let mut digests = std::mem::take(&mut self.digests);
        let mut records = Vec::with_capacity(rows.len());
        let mut bytes = 0;
        for r in rows {
            if let StoredRow::Commit {
                record: Some(rec), ..
            } = r
            {
                records.push(*rec);
                bytes += rec.len();
            }
        }
        riptide_sha::Kernel::best_for(bytes).digests(&records, &mut digests);
        let mut next = digests.iter();
        for (i, r) in rows.iter().enumerate() {
            let cid = match r {
                StoredRow::Commit {
                    record: Some(_), ..
                } => next.next().map(|d| CidBuf::from_sha256_digest(DAG_CBOR, d)),
                _ => None,
            };
            each(i, self.project_row_with(r, cid));
        }
        self.digests = digests;
    }

    /// [`Projector::project_row`] with the record's CID (if it has a record) computed already.
    fn project_row_with(
        &mut self,
        row: &StoredRow<'_>,
        cid: Option<CidBuf>,
    ) -> Result<&Projection, RowError> {
        let Projector {
            arena,
            out,
            rows,
            row_frame,
            ..
        } = self;
        out.buf.clear();
        out.parts.clear();
        out.drops.clear();
        match *row {
            StoredRow::Commit {
                did,
                rev,
                action,
                collection,
                rkey,
                record,
            } => {
                let record = cid
                    .as_ref()
                    .zip(record)
                    .map(|(c, r)| (c.as_cid(), Some(Record::Bytes(r))));
                let op = OpRow {
                    did,
                    rev,
                    action,
                    collection,
                    rkey,
                };
                out.push_commit(arena, &op, record)
                    .map_err(RowError::Record)?;
            }
            StoredRow::Event { kind, payload, .. } => {
                let t = match kind {
                    EventRowKind::Identity => "#identity",
                    EventRowKind::Account => "#account",
                    EventRowKind::Sync => "#sync",
                };
                // The frame header `{"t": t, "op": 1}` (keys in DAG-CBOR's order), then the payload.
                row_frame.clear();
                write_map_header(row_frame, 2);
                write_text(row_frame, "t");
                write_text(row_frame, t);
                write_text(row_frame, "op");
                write_int(row_frame, 1);
                row_frame.extend_from_slice(payload);
                let frame = rows.decode(row_frame).map_err(RowError::Payload)?;
                project_into(arena, out, true, &frame);
                if out.parts.len() != 1 {
                    return Err(RowError::NoEvent(kind.event_kind()));
                }
            }
        }
        Ok(out)
    }
}

impl Projection {
    /// The stored row of each of this projection's events, in event order, borrowed from the
    /// `frame` it was projected from (issue 38: what the store keeps instead of the JSON;
    /// [`Projector::project_row`] makes the JSON again). A commit op's row holds the record's
    /// block as the CAR carries it; an identity, account or sync event's row the frame's payload
    /// bytes.
    pub fn stored_rows<'f>(&self, frame: &Frame<'f>) -> Result<Vec<StoredRow<'f>>, RowError> {
        let mut rows = Vec::with_capacity(self.len());
        match frame.body() {
            Body::Commit(c) => {
                for (i, op) in c.ops().enumerate() {
                    if self.drops.iter().any(|&(d, _)| d == i) {
                        continue;
                    }
                    let record = match (op.action, op.cid) {
                        (Action::Delete, _) => None,
                        (_, cid) => Some(
                            cid.and_then(|cid| frame.block_bytes(cid))
                                .ok_or(RowError::Record(DropReason::MissingRecord))?,
                        ),
                    };
                    rows.push(StoredRow::Commit {
                        did: c.repo,
                        rev: c.rev,
                        action: op.action,
                        collection: op.collection(),
                        rkey: op.rkey(),
                        record,
                    });
                }
            }
            _ => {
                if let Some(p) = self.parts.first() {
                    let did = match frame.body() {
                        Body::Identity(e) => e.did,
                        Body::Account(e) => e.did,
                        Body::Sync(e) => e.did,
                        _ => return Err(RowError::NoEvent(p.kind)),
                    };
                    rows.push(StoredRow::Event {
                        kind: EventRowKind::of(p.kind).ok_or(RowError::NoEvent(p.kind))?,
                        did,
                        payload: payload_bytes(frame)?,
                    });
                }
            }
        }
        if rows.len() != self.len() {
            return Err(RowError::Unpaired {
                rows: rows.len(),
                events: self.len(),
            });
        }
        Ok(rows)
    }
}

/// The payload's bytes in `frame`: what follows the header, whose strict DAG-CBOR encoding is
/// its bytes.
fn payload_bytes<'f>(frame: &Frame<'f>) -> Result<&'f [u8], RowError> {
    let mut header = Vec::new();
    encode_value(frame.header(), &mut header).map_err(|_| RowError::Header)?;
    let bytes = frame.bytes();
    match bytes.strip_prefix(&header[..]) {
        Some(payload) => Ok(payload),
        None => Err(RowError::Header),
    }
}

/// The kind of a [`StoredRow::Event`]: the events that are not commits. A type of its own, so
/// that no stored row can claim to be a commit's event and be written as some other kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventRowKind {
    /// `#identity`.
    Identity,
    /// `#account`.
    Account,
    /// `#sync`.
    Sync,
}

impl EventRowKind {
    /// The event kind it is (v1's `kind` field, the projection's).
    pub fn event_kind(self) -> EventKind {
        match self {
            EventRowKind::Identity => EventKind::Identity,
            EventRowKind::Account => EventKind::Account,
            EventRowKind::Sync => EventKind::Sync,
        }
    }

    /// The event row kind of an event kind; `None` for a commit.
    pub fn of(kind: EventKind) -> Option<EventRowKind> {
        match kind {
            EventKind::Identity => Some(EventRowKind::Identity),
            EventKind::Account => Some(EventRowKind::Account),
            EventKind::Sync => Some(EventRowKind::Sync),
            EventKind::Commit | EventKind::Replacement => None,
        }
    }
}

/// One row as the store keeps it (the columns of a `.jss` row that make its v1 event).
#[derive(Clone, Copy, Debug)]
pub enum StoredRow<'a> {
    /// A create, update or delete.
    Commit {
        /// The account.
        did: &'a str,
        /// The commit's rev.
        rev: &'a str,
        /// What the op did.
        action: Action,
        /// The record's collection.
        collection: &'a str,
        /// The record key.
        rkey: &'a str,
        /// The record's DAG-CBOR as signed (`None` for a delete).
        record: Option<&'a [u8]>,
    },
    /// An `#identity`, `#account` or `#sync` event.
    Event {
        /// Which (a commit is never an event row, by type).
        kind: EventRowKind,
        /// The account (the payload's `did`; the `.jss` row's DID column).
        did: &'a str,
        /// The upstream event's DAG-CBOR (the frame's payload).
        payload: &'a [u8],
    },
}

/// Why a stored row has no v1 event: the store is damaged (ingest stores only rows that project).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RowError {
    /// A commit row's record does not render ([`DropReason::BadRecord`]).
    #[error("stored row: record not rendered ({})", .0.as_str())]
    Record(DropReason),
    /// An event row's payload does not decode as its upstream event.
    #[error("stored row: payload does not decode: {0}")]
    Payload(riptide_firehose::FrameError),
    /// An event row's payload decodes but gives no event (its DID is not one).
    #[error("stored {} row: payload gives no event", .0.as_str())]
    NoEvent(EventKind),
    /// A frame's header is not in strict DAG-CBOR, so its payload's bytes cannot be told apart.
    #[error("frame header not in strict DAG-CBOR: its payload cannot be stored as a row")]
    Header,
    /// The rows of a frame do not pair with its events (a bug, said rather than stored).
    #[error("{rows} rows for {events} events of a frame")]
    Unpaired {
        /// Rows made.
        rows: usize,
        /// Events projected.
        events: usize,
    },
}

/// [`Projector::project`] into `out`, with `#sync` frames projected when `sync`.
fn project_into(arena: &mut Arena, out: &mut Projection, sync: bool, frame: &Frame<'_>) {
    out.buf.clear();
    out.parts.clear();
    out.drops.clear();
    match frame.body() {
        Body::Commit(c) => {
            let did_ok = is_valid_did(c.repo);
            let rev_ok = is_valid_tid(c.rev);
            for (i, op) in c.ops().enumerate() {
                if !did_ok {
                    out.drops.push((i, DropReason::InvalidDid));
                    continue;
                }
                if !rev_ok {
                    out.drops.push((i, DropReason::InvalidRev));
                    continue;
                }
                let (collection, rkey) = (op.collection(), op.rkey());
                if !is_valid_nsid(collection) {
                    out.drops.push((i, DropReason::InvalidCollection));
                    continue;
                }
                if !is_valid_record_key(rkey) {
                    out.drops.push((i, DropReason::InvalidRkey));
                    continue;
                }
                let record = match (op.action, op.cid) {
                    (Action::Delete, _) => None,
                    // The decoder refuses creates and updates without a CID.
                    (_, None) => {
                        out.drops.push((i, DropReason::MissingRecord));
                        continue;
                    }
                    (_, Some(cid)) => Some((
                        cid,
                        match frame.block_by_cid(cid) {
                            Some(v) => Some(Record::Value(v)),
                            None => frame.block_bytes(cid).map(Record::Bytes),
                        },
                    )),
                };
                let op_row = OpRow {
                    did: c.repo,
                    rev: c.rev,
                    action: op.action,
                    collection,
                    rkey,
                };
                if let Err(why) = out.push_commit(arena, &op_row, record) {
                    out.drops.push((i, why));
                }
            }
        }
        Body::Identity(id) if !is_valid_did(id.did) => {
            out.drops.push((0, DropReason::InvalidDid));
        }
        Body::Account(a) if !is_valid_did(a.did) => {
            out.drops.push((0, DropReason::InvalidDid));
        }
        Body::Sync(s) if sync && !is_valid_did(s.did) => {
            out.drops.push((0, DropReason::InvalidDid));
        }
        Body::Identity(id) => {
            let did = push(&mut out.buf, id.did);
            let start = out.buf.len();
            let b = &mut out.buf;
            b.extend_from_slice(b"\"identity\":{\"did\":");
            write_json_string(b, id.did);
            if let Some(h) = id.handle {
                b.extend_from_slice(b",\"handle\":");
                write_json_string(b, h);
            }
            b.extend_from_slice(b",\"seq\":");
            write_json_int(b, id.seq);
            out.end_part(EventKind::Identity, did, start, id.time);
        }
        Body::Account(a) => {
            let did = push(&mut out.buf, a.did);
            let start = out.buf.len();
            let b = &mut out.buf;
            b.extend_from_slice(if a.active {
                b"\"account\":{\"active\":true,\"did\":"
            } else {
                b"\"account\":{\"active\":false,\"did\":"
            });
            write_json_string(b, a.did);
            b.extend_from_slice(b",\"seq\":");
            write_json_int(b, a.seq);
            if let Some(s) = a.status {
                b.extend_from_slice(b",\"status\":");
                write_json_string(b, s);
            }
            out.end_part(EventKind::Account, did, start, a.time);
        }
        Body::Sync(s) if sync => {
            let did = push(&mut out.buf, s.did);
            let start = out.buf.len();
            let b = &mut out.buf;
            b.extend_from_slice(b"\"sync\":{\"blocks\":");
            write_json_bytes(b, s.blocks);
            b.extend_from_slice(b",\"did\":");
            write_json_string(b, s.did);
            b.extend_from_slice(b",\"rev\":");
            write_json_string(b, s.rev);
            b.extend_from_slice(b",\"seq\":");
            write_json_int(b, s.seq);
            out.end_part(EventKind::Sync, did, start, s.time);
        }
        // Never emitted on v1 (§4.1, §7.8).
        Body::Sync(_) | Body::Info(_) | Body::Error(_) | Body::Unknown { .. } => {}
    }
}

/// A commit op's fields, from a frame or a stored row.
struct OpRow<'a> {
    did: &'a str,
    rev: &'a str,
    action: Action,
    collection: &'a str,
    rkey: &'a str,
}

/// A create's or update's record: decoded with the frame's blocks, or bytes to decode.
enum Record<'v> {
    Value(Value<'v>),
    Bytes(&'v [u8]),
}

impl Projection {
    /// Renders one commit op's event. `record` is `None` for a delete, else the op's CID and its
    /// record (`None` if the CAR does not hold it). Nothing is left in the buffer on an error.
    fn push_commit(
        &mut self,
        arena: &mut Arena,
        op: &OpRow<'_>,
        record: Option<(Cid<'_>, Option<Record<'_>>)>,
    ) -> Result<(), DropReason> {
        let mark = self.buf.len();
        let did = push(&mut self.buf, op.did);
        let collection = push(&mut self.buf, op.collection);
        let body_start = self.buf.len();
        let b = &mut self.buf;
        b.extend_from_slice(b"\"commit\":{\"rev\":");
        write_json_string(b, op.rev);
        b.extend_from_slice(b",\"operation\":\"");
        b.extend_from_slice(op.action.as_str().as_bytes());
        b.extend_from_slice(b"\",\"collection\":");
        write_json_string(b, op.collection);
        b.extend_from_slice(b",\"rkey\":");
        write_json_string(b, op.rkey);
        if let Some((cid, source)) = record {
            b.extend_from_slice(b",\"record\":");
            let rendered = match source {
                None => {
                    b.truncate(mark);
                    return Err(DropReason::MissingRecord);
                }
                Some(Record::Value(v)) => write_json(v, b).is_ok(),
                Some(Record::Bytes(bytes)) => write_record_json(arena, bytes, b),
            };
            if !rendered {
                b.truncate(mark);
                return Err(DropReason::BadRecord);
            }
            b.extend_from_slice(b",\"cid\":\"");
            cid.write_string(b);
            b.push(b'"');
        }
        b.push(b'}');
        let body = body_start..b.len();
        self.parts.push(Part {
            kind: EventKind::Commit,
            did,
            collection,
            body,
        });
        Ok(())
    }

    /// Ends the body of an identity or account event begun at `start` (all its fields written but
    /// the last, `time`) and records its part.
    fn end_part(&mut self, kind: EventKind, did: Range<usize>, start: usize, time: &str) {
        let b = &mut self.buf;
        b.extend_from_slice(b",\"time\":");
        write_json_string(b, time);
        b.push(b'}');
        let body = start..b.len();
        self.parts.push(Part {
            kind,
            did,
            collection: 0..0,
            body,
        });
    }
}

/// Renders one record block (DAG-CBOR bytes) as the JSON of an event's `record` field: decoded
/// strictly, keys sorted bytewise, strings escaped as Go does. `false` (and `out` as it was) for
/// a record outside the atproto data model or not strict DAG-CBOR, which v1 drops
/// ([`DropReason::BadRecord`]). For the projection and for anyone else who emits records as
/// Jetstream does (the backfill's JSON lines), so that a record reads the same everywhere.
pub fn write_record_json(arena: &mut Arena, bytes: &[u8], out: &mut Vec<u8>) -> bool {
    let mark = out.len();
    let mut tape = arena.tape(bytes);
    let ok = match tape.decode(0..bytes.len(), &Options::strict()) {
        Ok(item) => write_json(tape.value(item), out).is_ok(),
        Err(_) => false,
    };
    if !ok {
        out.truncate(mark);
    }
    ok
}

fn push(buf: &mut Vec<u8>, s: &str) -> Range<usize> {
    let start = buf.len();
    buf.extend_from_slice(s.as_bytes());
    start..buf.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `create-resync` row is a replacement's record: a commit (`"kind":"commit"`, the
    /// collection filters' business) that v1 never sends; every other row kind keeps its kind.
    #[test]
    fn a_create_resync_row_is_a_replacement_commit_v1_never_sends() {
        use riptide_segment::Kind;
        let kinds = [
            (Kind::Create, EventKind::Commit),
            (Kind::Update, EventKind::Commit),
            (Kind::Delete, EventKind::Commit),
            (Kind::CreateResync, EventKind::Replacement),
            (Kind::Identity, EventKind::Identity),
            (Kind::Account, EventKind::Account),
            (Kind::Sync, EventKind::Sync),
        ];
        for (row, want) in kinds {
            assert_eq!(EventKind::of_row(row), want, "{row:?}");
        }
        let r = EventKind::Replacement;
        assert_eq!(
            (r.as_str(), r.is_commit(), r.sent_on_v1()),
            ("commit", true, false)
        );
        assert_eq!(EventRowKind::of(r), None);
        assert!(!EventKind::Sync.sent_on_v1() && !EventKind::Sync.is_commit());
        assert!(EventKind::Commit.sent_on_v1() && EventKind::Commit.is_commit());
    }

    #[test]
    fn a_record_renders_as_jetstream_does_or_not_at_all() {
        let mut arena = Arena::new();
        // {"text": "hi \"x\"", "$type": "app.bsky.feed.post", "n": 3}, keys in CBOR's order
        // (length first): rendered bytewise-sorted.
        let rec = [
            0xa3, 0x61, b'n', 0x03, 0x64, b't', b'e', b'x', b't', 0x66, b'h', b'i', b' ', b'"',
            b'x', b'"', 0x65, b'$', b't', b'y', b'p', b'e', 0x72, b'a', b'p', b'p', b'.', b'b',
            b's', b'k', b'y', b'.', b'f', b'e', b'e', b'd', b'.', b'p', b'o', b's', b't',
        ];
        let mut out = b"prefix".to_vec();
        assert!(write_record_json(&mut arena, &rec, &mut out));
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            r#"prefix{"$type":"app.bsky.feed.post","n":3,"text":"hi \"x\""}"#
        );
        // A float is outside the data model: nothing written.
        let float = [0xa1, 0x61, b'f', 0xfb, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0];
        let mut out = b"prefix".to_vec();
        assert!(!write_record_json(&mut arena, &float, &mut out));
        assert_eq!(out, b"prefix");
        // Truncated CBOR: nothing written.
        assert!(!write_record_json(&mut arena, &rec[..10], &mut out));
        assert_eq!(out, b"prefix");
    }

    /// A row projected with its record's digest known is the row projected by hashing the
    /// record: the same event for a record in the data model, the same refusal for one outside
    /// it (a float, truncated CBOR); a digest that is not 32 bytes is not used.
    #[test]
    fn a_row_with_its_record_digest_known_projects_as_hashed() {
        let post = [
            0xa2, 0x64, b't', b'e', b'x', b't', 0x62, b'h', b'i', 0x65, b'$', b't', b'y', b'p',
            b'e', 0x72, b'a', b'p', b'p', b'.', b'b', b's', b'k', b'y', b'.', b'f', b'e', b'e',
            b'd', b'.', b'p', b'o', b's', b't',
        ];
        let float = [0xa1, 0x61, b'f', 0xfb, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0];
        let (mut hashing, mut known) = (Projector::new(), Projector::new());
        let mut rendered = 0;
        for record in [&post[..], &float[..], &post[..9]] {
            let row = StoredRow::Commit {
                did: "did:plc:53iucmf5ldftgqyf2ac7hmhd",
                rev: "3lbzqmjjbhc2a",
                action: Action::Create,
                collection: "app.bsky.feed.post",
                rkey: "3lbzqmjjbhc2a",
                record: Some(record),
            };
            let digest = CidBuf::sha256(DAG_CBOR, record);
            let digest = &digest.as_cid().digest().to_vec();
            let render = |p: &Projection| {
                let mut out = Vec::new();
                p.render(0, 7, Some(9), &mut out);
                out
            };
            let want = hashing.project_row(&row).map(render).ok();
            for d in [Some(&digest[..]), None, Some(&digest[..31])] {
                let got = known.project_row_hashed(&row, d).map(render).ok();
                assert_eq!(got, want, "{record:?} {d:?}");
            }
            rendered += usize::from(want.is_some());
        }
        assert_eq!(rendered, 1, "only the post is in the data model");
    }
}
