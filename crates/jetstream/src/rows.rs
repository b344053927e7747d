//! Relay frame → Jetstream v2 archive rows (`.jss` block rows, `riptide-segment`).
//!
//! Why a module beside [`crate::project`]: the archive keeps, per event, not the v1 JSON but the
//! bytes a client re-derives everything from (`docs/archive.md`, "One copy of the data"): a
//! commit op's row carries the record's DAG-CBOR exactly as signed (its CID is the hash of those
//! bytes), an `#identity`, `#account` or `#sync` row the upstream event's DAG-CBOR (as Jetstream's
//! `internal/ingest/live/events.go`). Which events become rows, and which are dropped and why, is
//! decided in one place, the v1 projection ([`Projector::project`], [`DropReason`]); the rows are
//! its events' [`StoredRow`]s ([`crate::Projection::stored_rows`]), so the archive and both live
//! wires hold the same events under the same seqs, and [`Projector::project_row`] renders a row
//! back into the v1 event byte for byte.
//!
//! Seqs and times are the server's: the caller assigns them ([`StoredRow::row`]).

use riptide_firehose::{Action, Frame};
use riptide_segment::{Kind, Row};

use crate::{DropReason, EventRowKind, Projector, RowError, StoredRow};

impl<'a> StoredRow<'a> {
    /// The segment row's kind: the op's action for a commit, the event's kind otherwise.
    pub fn segment_kind(&self) -> Kind {
        match self {
            StoredRow::Commit { action, .. } => match action {
                Action::Create => Kind::Create,
                Action::Update => Kind::Update,
                Action::Delete => Kind::Delete,
            },
            StoredRow::Event { kind, .. } => match kind {
                EventRowKind::Identity => Kind::Identity,
                EventRowKind::Account => Kind::Account,
                EventRowKind::Sync => Kind::Sync,
            },
        }
    }

    /// The segment row with the server's seq and witnessed time (no imported display time).
    pub fn row(&self, seq: u64, witnessed_at: i64) -> Row<'a> {
        let kind = self.segment_kind();
        let (did, collection, rkey, rev, payload) = match *self {
            StoredRow::Commit {
                did,
                rev,
                collection,
                rkey,
                record,
                ..
            } => (did, collection, rkey, rev, record.unwrap_or(&[])),
            StoredRow::Event { did, payload, .. } => (did, "", "", "", payload),
        };
        Row {
            seq,
            witnessed_at,
            indexed_at: 0,
            kind,
            did,
            collection,
            rkey,
            rev,
            payload,
        }
    }

    /// A segment row as the stored row [`Projector::project_row`] renders (the inverse of
    /// [`StoredRow::row`]; a `create-resync` row renders as the create it replays).
    pub fn from_row(row: &Row<'a>) -> StoredRow<'a> {
        let event = |kind| StoredRow::Event {
            kind,
            did: row.did,
            payload: row.payload,
        };
        match row.kind {
            Kind::Create | Kind::Update | Kind::Delete | Kind::CreateResync => StoredRow::Commit {
                did: row.did,
                rev: row.rev,
                action: match row.kind {
                    Kind::Update => Action::Update,
                    Kind::Delete => Action::Delete,
                    _ => Action::Create,
                },
                collection: row.collection,
                rkey: row.rkey,
                record: (row.kind != Kind::Delete).then_some(row.payload),
            },
            Kind::Identity => event(EventRowKind::Identity),
            Kind::Account => event(EventRowKind::Account),
            Kind::Sync => event(EventRowKind::Sync),
        }
    }
}

/// A frame's rows in event order (seq and time 0: the caller's to assign), and the ops or events
/// dropped (by op index, 0 for a non-commit event), exactly as `proj` projects the frame
/// (`#sync` gives a row only from a [`Projector::with_sync`]).
pub fn frame_rows<'f>(proj: &mut Projector, frame: &Frame<'f>) -> Result<FrameRows<'f>, RowError> {
    let p = proj.project(frame);
    let rows = p.stored_rows(frame)?.iter().map(|r| r.row(0, 0)).collect();
    Ok(FrameRows {
        rows,
        drops: p.drops().to_vec(),
    })
}

/// What [`frame_rows`] makes of a frame.
#[derive(Clone, Debug, Default)]
pub struct FrameRows<'f> {
    /// The rows, in event order.
    pub rows: Vec<Row<'f>>,
    /// The ops (by index; 0 for a non-commit event) dropped, and why.
    pub drops: Vec<(usize, DropReason)>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::EventKind;
    use riptide_cbor::{Arena, Options};
    use riptide_firehose::FrameDecoder;

    /// Over the real capture: the same events as the v1 projection, in the same order, each
    /// commit row's payload hashing to the CID v1 sends, each marker's payload the upstream
    /// event (its `did` and `seq` as the frame's).
    #[test]
    fn rows_are_the_v1_events_with_their_signed_bytes() {
        let Some(file) = riptide_testdata::read("jetstream-2026-07/firehose-frames.bin") else {
            return;
        };
        let frames = riptide_firehose::corpus::split_frames(&file).unwrap();
        let (mut dec, mut proj, mut v1) = (FrameDecoder::new(), Projector::new(), Projector::new());
        let (mut n, mut markers) = (0, 0);
        for f in &frames {
            let frame = dec.decode(f.bytes).unwrap();
            let FrameRows { rows, drops } = frame_rows(&mut proj, &frame).unwrap();
            let p = v1.project(&frame);
            assert_eq!(drops, p.drops());
            assert_eq!(rows.len(), p.len());
            for (i, r) in rows.iter().enumerate() {
                assert_eq!((r.did, r.collection), (p.did(i), p.collection(i)));
                let mut json = Vec::new();
                p.render(i, 0, None, &mut json);
                let v: serde_json::Value = serde_json::from_slice(&json).unwrap();
                match p.kind(i) {
                    EventKind::Commit => {
                        let c = &v["commit"];
                        assert_eq!(c["rkey"], r.rkey);
                        assert_eq!(c["rev"], r.rev);
                        let op = c["operation"].as_str().unwrap();
                        let want = match r.kind {
                            Kind::Create => "create",
                            Kind::Update => "update",
                            Kind::Delete => "delete",
                            k => panic!("a commit event as a {k:?} row"),
                        };
                        assert_eq!(op, want);
                        if let Some(cid) = c["cid"].as_str() {
                            let digest = riptide_sha::sha256(r.payload);
                            let mut raw = vec![0x01, 0x71, 0x12, 0x20];
                            raw.extend_from_slice(&digest);
                            let want = format!(
                                "b{}",
                                data_encoding::BASE32_NOPAD
                                    .encode(&raw)
                                    .to_ascii_lowercase()
                            );
                            assert_eq!(cid, want);
                        } else {
                            assert!(r.payload.is_empty());
                        }
                    }
                    _ => {
                        markers += 1;
                        let mut a = Arena::new();
                        let mut t = a.tape(r.payload);
                        let item = t.decode(0..r.payload.len(), &Options::strict()).unwrap();
                        let m = t.value(item);
                        assert_eq!(m.get("did").and_then(|d| d.as_str()), Some(r.did));
                        assert_eq!(
                            m.get("seq").and_then(|s| s.as_i64()),
                            frame.body().seq(),
                            "the payload is the upstream event"
                        );
                    }
                }
                n += 1;
            }
        }
        // The capture's manifest: 152 v1 events, one identity and one account among them.
        assert_eq!((n, markers), (152, 2));
    }
}
