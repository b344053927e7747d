//! The record format on the topics (documented for other consumers in `docs/kafka.md`).
//!
//! Why a module: the ingest node writes it, edges and the catch-up read it, and Kafka Streams /
//! Flink users depend on it; one place defines both directions and is tested as a round trip.
//!
//! - Events topic `TOPIC`: one record per stored event, key = the DID, value = the Jetstream v1
//!   JSON exactly as `/subscribe` sends it (`cursor` = seq, `time_us` stamped by the ingest
//!   node), timestamp = `time_us / 1000` (CreateTime), headers [`H_SEQ`], [`H_TIME_US`],
//!   [`H_KIND`], [`H_COLLECTION`] (commits), [`H_REV`] (commits), [`H_VERDICT`], and [`H_ROW`]
//!   (the event's Jetstream v2 `.jss` row, when the ingest node made one: what an edge's store
//!   seals, so that edges keep rows, not JSON, and can seal the archive's segments as the
//!   ingest node does).
//! - Batch topic `TOPIC.cursor` (one partition): one record per ingest batch, in the same
//!   transaction as the batch's events: key `cursor`, value [`Batch::encode`] (the seq range,
//!   the upstream cursor, the chain state of the accounts the batch changed). Before it, in the
//!   same transaction, one record per change the batch made to the resync partition (key
//!   `resync`, value [`encode_change`]): accounts queued for resync after a chain break, the raw
//!   frames held for them, their release. A reader attaches them to the batch record that
//!   follows ([`Batch::pending`]), so a node catching up from the topic holds what the
//!   publisher held.

use bytes::Bytes;
use riptide_firehose::chain::{decode_state, encode_state, AccountState};
use riptide_jetstream::EventKind;
use riptide_segment::{decode_block, encode_block, Row};
use riptide_serve::{Event, Resume};
use riptide_store::store::PendingChange;

/// Header: the event's seq (the v1 `cursor`, the v2 `seq`), decimal ASCII.
pub const H_SEQ: &str = "riptide-seq";
/// Header: the event's `time_us`, decimal ASCII.
pub const H_TIME_US: &str = "riptide-time-us";
/// Header: `commit`, `identity`, `account`, `sync` or `commit-resync` (a replacement row's
/// record: a `commit` on v2, never sent on v1; [`kind_str`]).
pub const H_KIND: &str = "riptide-kind";
/// Header: the record's collection (commits only).
pub const H_COLLECTION: &str = "riptide-collection";
/// Header: the commit's rev (commits only).
pub const H_REV: &str = "riptide-rev";
/// Header: `ok` (signature, proof and chain state verified) or `unverified` (`--no-verify`).
pub const H_VERDICT: &str = "riptide-verdict";
/// Header: the event's Jetstream v2 `.jss` row ([`encode_row`]): the uncompressed body of a
/// one-row block (`riptide_segment::encode_block`), a commit's record as its signed DAG-CBOR.
/// Present on every event of a batch whose events all had rows at the ingest node (layout 5),
/// absent otherwise (a publisher older than the header, an event whose row a block cannot
/// hold): then the edge stores that batch as JSON, as before.
pub const H_ROW: &str = "riptide-row";

/// The key of the batch records on the batch topic.
pub const BATCH_KEY: &[u8] = b"cursor";

/// The key of the resync-change records on the batch topic ([`encode_change`]).
pub const RESYNC_KEY: &[u8] = b"resync";

/// The key of the backfill progress records on the batch topic ([`encode_progress`]).
pub const BACKFILL_KEY: &[u8] = b"backfill";

/// The batch topic of events topic `topic`.
pub fn batch_topic(topic: &str) -> String {
    format!("{topic}.cursor")
}

/// A record of the events topic that is not one of ours, or damaged.
#[derive(Debug, thiserror::Error)]
#[error("record at {topic}/{partition}@{offset}: {what}")]
pub struct BadRecord {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
    /// What is wrong.
    pub what: &'static str,
}

/// The kind named by a [`H_KIND`] header.
pub fn kind_from_str(s: &[u8]) -> Option<EventKind> {
    Some(match s {
        b"commit" => EventKind::Commit,
        b"identity" => EventKind::Identity,
        b"account" => EventKind::Account,
        b"sync" => EventKind::Sync,
        b"commit-resync" => EventKind::Replacement,
        _ => return None,
    })
}

/// The [`H_KIND`] header's value for `kind` ([`kind_from_str`]'s inverse): its v1 `kind`, but
/// `commit-resync` for a replacement's record, so that an edge keeps it from v1 too.
pub fn kind_str(kind: EventKind) -> &'static str {
    match kind {
        EventKind::Replacement => "commit-resync",
        k => k.as_str(),
    }
}

/// The commit's rev from its v1 JSON (`"commit":{"rev":"…"` comes first in Jetstream's field
/// order), if it is a commit.
pub fn rev_of(json: &[u8]) -> Option<&[u8]> {
    const PAT: &[u8] = b"\"commit\":{\"rev\":\"";
    let at = json.windows(PAT.len()).position(|w| w == PAT)? + PAT.len();
    let len = json[at..].iter().position(|&b| b == b'"')?;
    Some(&json[at..at + len])
}

/// Parses a decimal header value.
pub fn parse_u64(v: &[u8]) -> Option<u64> {
    std::str::from_utf8(v).ok()?.parse().ok()
}

/// Parses a signed decimal header value.
pub fn parse_i64(v: &[u8]) -> Option<i64> {
    std::str::from_utf8(v).ok()?.parse().ok()
}

/// [`H_ROW`]'s value for `row`, or `None` for a row a `.jss` block cannot hold (a column past
/// its width).
pub fn encode_row(row: &Row<'_>) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    encode_block(std::slice::from_ref(row), &mut out).ok()?;
    Some(out)
}

/// The row of an [`H_ROW`] value, if it holds exactly one.
pub fn decode_row(bytes: &[u8]) -> Option<Row<'_>> {
    match decode_block(bytes).ok()?.as_slice() {
        [row] => Some(*row),
        _ => None,
    }
}

/// One event read back from the events topic: what an edge stores.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopicEvent {
    /// Seq (from [`H_SEQ`]).
    pub seq: u64,
    /// `time_us` (from [`H_TIME_US`]).
    pub time_us: i64,
    /// Kind (from [`H_KIND`]).
    pub kind: EventKind,
    /// The DID (the key).
    pub did: String,
    /// The collection (from [`H_COLLECTION`], empty if none).
    pub collection: String,
    /// The v1 JSON (the value).
    pub json: Bytes,
    /// The `.jss` row ([`H_ROW`]), checked by [`TopicEvent::row`] to hold this event's row.
    pub row: Option<Bytes>,
}

impl TopicEvent {
    /// The event's `.jss` row, if the record carried one. `Err` if it does not decode to
    /// exactly one row, or to one of another seq, time, kind or DID than the record's headers
    /// say (a damaged or foreign record).
    pub fn row(&self) -> Result<Option<Row<'_>>, &'static str> {
        let Some(bytes) = &self.row else {
            return Ok(None);
        };
        let row = decode_row(bytes).ok_or("riptide-row is not one .jss row")?;
        if row.seq != self.seq || row.display_time_us() != self.time_us || row.did != self.did {
            return Err("riptide-row is not the record's event (seq, time or DID)");
        }
        if EventKind::of_row(row.kind) != self.kind {
            return Err("riptide-row is of another kind than riptide-kind");
        }
        Ok(Some(row))
    }

    /// The stored form, its zstd frame made with `compress` (an edge's own dictionary) if any.
    pub fn to_event(&self, zstd: &[u8]) -> Event {
        Event::encode(
            self.seq,
            self.time_us,
            self.kind,
            &self.did,
            &self.collection,
            &self.json,
            zstd,
        )
    }
}

/// One ingest batch as recorded on the batch topic: the seqs `[first_seq, resume.next_seq)` of
/// the events topic, the position after them and the chain states they changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Batch {
    /// The first seq of the batch (= `resume.next_seq` when it has no events).
    pub first_seq: u64,
    /// The position after the batch.
    pub resume: Resume,
    /// The chain states the batch's frames changed (the last per DID).
    pub accounts: Vec<(Box<str>, AccountState)>,
    /// The batch's changes to the resync partition, in order (records of their own, before the
    /// batch record: not part of [`Batch::encode`]).
    pub pending: Vec<PendingChange>,
    /// The batch's backfill progress entries, (key, value) of the store's `backfill` partition
    /// (records of their own, before the batch record: [`encode_progress`]).
    pub progress: Vec<(Box<str>, Vec<u8>)>,
}

const CHANGE_MAGIC: &[u8; 6] = b"RPTKR1";

/// Why a DID's length always fits the records' `u16`: the DIDs here are accounts with chain
/// state or a resync, which exist only for verified commits, whose key lookup parses the DID
/// (`riptide_syntax::Did`: at most 2,048 bytes); and an event whose DID is not a DID is never
/// projected (`riptide_jetstream::DropReason::InvalidDid`). The cut below cannot happen.
const WHY_DIDS_FIT: &str = "a DID here is at most 2,048 bytes (riptide_syntax::Did)";

/// A resync change as a record value: `RPTKR1`, a byte 1 (hold) or 0 (release), the upstream
/// seq u64 (big-endian; 0 is the account's queue mark), the DID's length u16 and the DID, then
/// (hold) the raw frame to the end.
pub fn encode_change(c: &PendingChange) -> Vec<u8> {
    let (op, did, seq, frame): (u8, &str, u64, &[u8]) = match c {
        PendingChange::Hold { did, seq, frame } => (1, did, *seq, frame),
        PendingChange::Release { did, seq } => (0, did, *seq, &[]),
    };
    let d = &did.as_bytes()[..did.len().min(u16::MAX as usize)];
    debug_assert_eq!(d.len(), did.len(), "{}", WHY_DIDS_FIT);
    let mut v = Vec::with_capacity(17 + d.len() + frame.len());
    v.extend_from_slice(CHANGE_MAGIC);
    v.push(op);
    v.extend_from_slice(&seq.to_be_bytes());
    v.extend_from_slice(&(d.len() as u16).to_be_bytes());
    v.extend_from_slice(d);
    v.extend_from_slice(frame);
    v
}

/// The inverse of [`encode_change`].
pub fn decode_change(b: &[u8]) -> Result<PendingChange, BadBatch> {
    let r = b
        .strip_prefix(CHANGE_MAGIC)
        .ok_or(BadBatch("resync change: bad magic"))?;
    if r.len() < 11 {
        return Err(BadBatch("resync change: truncated"));
    }
    let op = r[0];
    let seq = u64::from_be_bytes(r[1..9].try_into().unwrap_or([0; 8]));
    let len = u16::from_be_bytes([r[9], r[10]]) as usize;
    let r = &r[11..];
    if r.len() < len {
        return Err(BadBatch("resync change: truncated"));
    }
    let did: Box<str> = std::str::from_utf8(&r[..len])
        .map_err(|_| BadBatch("resync change: DID not UTF-8"))?
        .into();
    match op {
        1 => Ok(PendingChange::Hold {
            did,
            seq,
            frame: Bytes::copy_from_slice(&r[len..]),
        }),
        0 if r.len() == len => Ok(PendingChange::Release { did, seq }),
        _ => Err(BadBatch("resync change: bad operation")),
    }
}

const PROGRESS_MAGIC: &[u8; 6] = b"RPTKP1";

/// A backfill progress entry as a record value: `RPTKP1`, the key's length u16 (big-endian)
/// and the key (a DID: at most 2,048 bytes), then the entry's value as the store keeps it (its
/// meaning is `riptide_backfill`'s: a landed repository's rev and outcome) to the end. Why a
/// record of its own, like a resync change, and not a field of the batch record: batch records
/// of publishers before it stay as they were, and read the same.
pub fn encode_progress(key: &str, value: &[u8]) -> Vec<u8> {
    let k = &key.as_bytes()[..key.len().min(u16::MAX as usize)];
    debug_assert_eq!(k.len(), key.len(), "{}", WHY_DIDS_FIT);
    let mut v = Vec::with_capacity(8 + k.len() + value.len());
    v.extend_from_slice(PROGRESS_MAGIC);
    v.extend_from_slice(&(k.len() as u16).to_be_bytes());
    v.extend_from_slice(k);
    v.extend_from_slice(value);
    v
}

/// The inverse of [`encode_progress`].
pub fn decode_progress(b: &[u8]) -> Result<(Box<str>, Vec<u8>), BadBatch> {
    let r = b
        .strip_prefix(PROGRESS_MAGIC)
        .ok_or(BadBatch("backfill progress: bad magic"))?;
    if r.len() < 2 {
        return Err(BadBatch("backfill progress: truncated"));
    }
    let len = u16::from_be_bytes([r[0], r[1]]) as usize;
    let r = &r[2..];
    if r.len() < len || len == 0 {
        return Err(BadBatch("backfill progress: truncated"));
    }
    let key =
        std::str::from_utf8(&r[..len]).map_err(|_| BadBatch("backfill progress: key not UTF-8"))?;
    Ok((key.into(), r[len..].to_vec()))
}

const BATCH_MAGIC: &[u8; 6] = b"RPTKB1";

/// A batch record that does not decode.
#[derive(Debug, thiserror::Error)]
#[error("batch record: {0}")]
pub struct BadBatch(pub &'static str);

impl Batch {
    /// `RPTKB1`, then big-endian: first_seq u64, next_seq u64, last_time_us i64, a byte 0/1 and
    /// the upstream cursor u64, the number of accounts u32, and per account: DID length u16, the
    /// DID, state length u8, the state (`riptide_firehose::chain::encode_state`).
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(48 + self.accounts.len() * 120);
        v.extend_from_slice(BATCH_MAGIC);
        v.extend_from_slice(&self.first_seq.to_be_bytes());
        v.extend_from_slice(&self.resume.next_seq.to_be_bytes());
        v.extend_from_slice(&self.resume.last_time_us.to_be_bytes());
        v.push(u8::from(self.resume.upstream_cursor.is_some()));
        v.extend_from_slice(&self.resume.upstream_cursor.unwrap_or(0).to_be_bytes());
        v.extend_from_slice(&(self.accounts.len() as u32).to_be_bytes());
        let mut s = Vec::with_capacity(96);
        for (did, st) in &self.accounts {
            let d = did.as_bytes();
            let len = d.len().min(u16::MAX as usize);
            debug_assert_eq!(len, d.len(), "{}", WHY_DIDS_FIT);
            v.extend_from_slice(&(len as u16).to_be_bytes());
            v.extend_from_slice(&d[..len]);
            s.clear();
            encode_state(st, &mut s);
            v.push(s.len() as u8);
            v.extend_from_slice(&s);
        }
        v
    }

    /// The inverse of [`Batch::encode`].
    pub fn decode(b: &[u8]) -> Result<Batch, BadBatch> {
        let mut r = b.strip_prefix(BATCH_MAGIC).ok_or(BadBatch("bad magic"))?;
        let mut take = |n: usize| -> Result<&[u8], BadBatch> {
            if r.len() < n {
                return Err(BadBatch("truncated"));
            }
            let (a, rest) = r.split_at(n);
            r = rest;
            Ok(a)
        };
        let u64_ = |b: &[u8]| u64::from_be_bytes(b.try_into().unwrap_or([0; 8]));
        let first_seq = u64_(take(8)?);
        let next_seq = u64_(take(8)?);
        let last_time_us = u64_(take(8)?) as i64;
        let has = take(1)?[0] == 1;
        let cursor = u64_(take(8)?);
        let n = u32::from_be_bytes(take(4)?.try_into().unwrap_or([0; 4])) as usize;
        // Each account takes at least 3 bytes: a count beyond that is damage, not a size.
        let mut accounts = Vec::with_capacity(n.min(b.len() / 3));
        for _ in 0..n {
            let len = u16::from_be_bytes(take(2)?.try_into().unwrap_or([0; 2])) as usize;
            let did = std::str::from_utf8(take(len)?).map_err(|_| BadBatch("DID not UTF-8"))?;
            let slen = take(1)?[0] as usize;
            let st = decode_state(take(slen)?).map_err(|_| BadBatch("bad account state"))?;
            accounts.push((Box::from(did), st));
        }
        if first_seq > next_seq {
            return Err(BadBatch("first seq after next seq"));
        }
        Ok(Batch {
            first_seq,
            resume: Resume {
                next_seq,
                last_time_us,
                upstream_cursor: has.then_some(cursor),
            },
            accounts,
            pending: Vec::new(),
            progress: Vec::new(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `riptide-row`: a row survives its header, and a row that is not the record's own event
    /// (another seq, time, DID or kind) or is damaged is refused, never stored.
    #[test]
    fn a_row_travels_in_its_header_and_must_be_the_records_event() {
        let row = Row {
            seq: 7,
            witnessed_at: 1_700_000_000_000_001,
            indexed_at: 0,
            kind: riptide_segment::Kind::Create,
            did: "did:plc:abc",
            collection: "app.bsky.feed.like",
            rkey: "3kabc",
            rev: "3labc",
            payload: &[0xa1, 0x61, 0x61, 0x01],
        };
        let bytes = encode_row(&row).unwrap();
        let e = TopicEvent {
            seq: 7,
            time_us: 1_700_000_000_000_001,
            kind: EventKind::Commit,
            did: "did:plc:abc".into(),
            collection: "app.bsky.feed.like".into(),
            json: Bytes::from_static(b"{}"),
            row: Some(Bytes::from(bytes.clone())),
        };
        assert_eq!(e.row(), Ok(Some(row)));
        for bad in [
            TopicEvent {
                seq: 8,
                ..e.clone()
            },
            TopicEvent {
                time_us: 1,
                ..e.clone()
            },
            TopicEvent {
                did: "did:plc:other".into(),
                ..e.clone()
            },
            TopicEvent {
                kind: EventKind::Identity,
                ..e.clone()
            },
            TopicEvent {
                row: Some(Bytes::from(bytes[..bytes.len() - 1].to_vec())),
                ..e.clone()
            },
        ] {
            assert!(bad.row().is_err(), "{bad:?}");
        }
        assert_eq!(
            TopicEvent {
                row: None,
                ..e.clone()
            }
            .row(),
            Ok(None)
        );

        // A replacement's record: a `create-resync` row is the event of a `commit-resync`
        // record, not of a `commit` one (nor a `create` row of a `commit-resync` record).
        let resync = Row {
            kind: riptide_segment::Kind::CreateResync,
            ..row
        };
        let e = TopicEvent {
            kind: EventKind::Replacement,
            row: Some(Bytes::from(encode_row(&resync).unwrap())),
            ..e
        };
        assert_eq!(e.row(), Ok(Some(resync)));
        let plain = TopicEvent {
            kind: EventKind::Commit,
            ..e.clone()
        };
        assert!(plain.row().is_err());
        let create = TopicEvent {
            row: Some(Bytes::from(bytes)),
            ..e
        };
        assert!(create.row().is_err());
    }

    /// `riptide-kind`: every kind survives its header, a replacement's record as
    /// `commit-resync` (so that an edge, too, keeps it from v1).
    #[test]
    fn every_kind_travels_in_its_header() {
        for k in [
            EventKind::Commit,
            EventKind::Identity,
            EventKind::Account,
            EventKind::Sync,
            EventKind::Replacement,
        ] {
            assert_eq!(kind_from_str(kind_str(k).as_bytes()), Some(k));
        }
        assert_eq!(kind_str(EventKind::Replacement), "commit-resync");
        assert_eq!(kind_from_str(b"create-resync"), None);
    }

    #[test]
    fn a_batch_round_trips_and_damage_is_an_error() {
        let b = Batch {
            first_seq: 10,
            resume: Resume {
                next_seq: 14,
                last_time_us: 1_700_000_000_000_000,
                upstream_cursor: Some(99),
            },
            accounts: vec![("did:plc:a".into(), AccountState::default())],
            pending: vec![],
            progress: vec![],
        };
        let e = b.encode();
        assert_eq!(Batch::decode(&e).unwrap(), b);
        for cut in [0, 5, 20, e.len() - 1] {
            assert!(Batch::decode(&e[..cut]).is_err(), "cut at {cut}");
        }
        let none = Batch {
            first_seq: 3,
            resume: Resume {
                next_seq: 3,
                last_time_us: 0,
                upstream_cursor: None,
            },
            accounts: vec![],
            pending: vec![],
            progress: vec![],
        };
        assert_eq!(Batch::decode(&none.encode()).unwrap(), none);
    }

    #[test]
    fn resync_changes_round_trip_and_damage_is_an_error() {
        let changes = [
            PendingChange::Hold {
                did: "did:plc:a".into(),
                seq: 0,
                frame: Bytes::new(),
            },
            PendingChange::Hold {
                did: "did:plc:b".into(),
                seq: 77,
                frame: Bytes::from_static(b"\xa2frame bytes"),
            },
            PendingChange::Release {
                did: "did:plc:b".into(),
                seq: 77,
            },
        ];
        for c in &changes {
            let e = encode_change(c);
            assert_eq!(&decode_change(&e).unwrap(), c);
            for cut in [0, 6, 16, 18] {
                assert!(decode_change(&e[..cut]).is_err(), "{c:?} cut at {cut}");
            }
        }
        let mut release = encode_change(&changes[2]);
        release.push(0);
        assert!(
            decode_change(&release).is_err(),
            "a release carries no frame"
        );
    }

    /// A landed repository's progress entry travels as it is, and a record that is not one
    /// (damage, another record's value) is a typed error, not an entry.
    #[test]
    fn backfill_progress_round_trips_and_damage_is_an_error() {
        let value = b"{\"rev\":\"3lxyz\",\"records\":7}".to_vec();
        let e = encode_progress("did:plc:a", &value);
        assert_eq!(decode_progress(&e).unwrap(), ("did:plc:a".into(), value));
        // An empty value is an entry too (the store keeps what it is given).
        let empty = encode_progress("did:plc:b", &[]);
        assert_eq!(
            decode_progress(&empty).unwrap(),
            ("did:plc:b".into(), vec![])
        );
        for cut in [0, 5, 7, 10] {
            assert!(decode_progress(&e[..cut]).is_err(), "cut at {cut}");
        }
        let change = encode_change(&PendingChange::Release {
            did: "did:plc:a".into(),
            seq: 1,
        });
        assert!(decode_progress(&change).is_err());
        assert!(decode_change(&e).is_err());
        assert!(Batch::decode(&e).is_err());
        let mut bad = e.clone();
        bad[8] = 0xff;
        assert!(decode_progress(&bad).is_err(), "a key not UTF-8");
    }

    #[test]
    fn the_rev_is_found_in_a_commit_and_not_elsewhere() {
        let c = br#"{"did":"did:plc:a","time_us":1,"kind":"commit","commit":{"rev":"3lxyz","operation":"create"}}"#;
        assert_eq!(rev_of(c), Some(&b"3lxyz"[..]));
        let i = br#"{"did":"did:plc:a","time_us":1,"kind":"identity","identity":{"seq":1}}"#;
        assert_eq!(rev_of(i), None);
    }
}
