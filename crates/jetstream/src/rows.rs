//! Relay frame → Jetstream v2 archive rows (`.jss` block rows, `riptide-segment`).
//!
//! Why a module beside [`crate::project`]: the archive keeps, per event, not the v1 JSON but the
//! bytes a client re-derives everything from (`docs/archive.md`, "One copy of the data"): a
//! commit op's row carries the record's DAG-CBOR exactly as signed (its CID is the hash of those
//! bytes), an `#identity`, `#account` or `#sync` row the upstream event's DAG-CBOR (as Jetstream's
//! `internal/ingest/live/events.go`). Which events become rows, and which are dropped and why, is
//! the same as the v1 projection ([`DropReason`]: a DID that is not a DID, a `rev` that is not a
//! TID, a bad collection or record key, a record missing from the CAR or not strict DAG-CBOR), so
//! that the archive and both live wires hold the same events under the same seqs.
//!
//! Seqs and times are the server's: the caller assigns them ([`FrameRow::row`]).

use riptide_cbor::{Arena, Options};
use riptide_firehose::{Action, Body, Frame};
use riptide_segment::{Kind, Row};
use riptide_syntax::{is_valid_did, is_valid_nsid, is_valid_record_key, is_valid_tid};

use crate::DropReason;

/// One row of a frame, borrowing from the frame; seq and times are added by [`FrameRow::row`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameRow<'a> {
    /// What it records.
    pub kind: Kind,
    /// The account.
    pub did: &'a str,
    /// The collection (commits; empty otherwise).
    pub collection: &'a str,
    /// The record key (commits; empty otherwise).
    pub rkey: &'a str,
    /// The commit's rev (commits; empty otherwise).
    pub rev: &'a str,
    /// The record's DAG-CBOR (create, update), nothing (delete), or the upstream event's
    /// DAG-CBOR payload (identity, account, sync).
    pub payload: &'a [u8],
}

impl<'a> FrameRow<'a> {
    /// The segment row with the server's seq and witnessed time (no imported display time).
    pub fn row(&self, seq: u64, witnessed_at: i64) -> Row<'a> {
        Row {
            seq,
            witnessed_at,
            indexed_at: 0,
            kind: self.kind,
            did: self.did,
            collection: self.collection,
            rkey: self.rkey,
            rev: self.rev,
            payload: self.payload,
        }
    }
}

/// The frame's payload (the CBOR item after the header), as the relay sent it.
fn payload_bytes<'a>(frame: &Frame<'a>, arena: &mut Arena) -> Option<&'a [u8]> {
    let bytes = frame.bytes();
    let mut tape = arena.tape(bytes);
    let (_, end) = tape
        .decode_prefix(0..bytes.len(), &Options::lenient())
        .ok()?;
    bytes.get(end..)
}

/// A frame's rows in event order, and the ops or events dropped (by op index, 0 for a
/// non-commit event), as [`crate::Projector::project`] drops them. `#sync` gives a row when
/// `with_sync` (as [`crate::Projector::with_sync`]); `#info`, errors and unknown types none.
pub fn frame_rows<'a>(
    frame: &Frame<'a>,
    arena: &mut Arena,
    with_sync: bool,
) -> (Vec<FrameRow<'a>>, Vec<(usize, DropReason)>) {
    let (mut rows, mut drops) = (Vec::new(), Vec::new());
    let marker = |kind, did: &'a str, arena: &mut Arena, rows: &mut Vec<_>, drops: &mut Vec<_>| {
        if !is_valid_did(did) {
            drops.push((0, DropReason::InvalidDid));
            return;
        }
        match payload_bytes(frame, arena) {
            Some(payload) => rows.push(FrameRow {
                kind,
                did,
                collection: "",
                rkey: "",
                rev: "",
                payload,
            }),
            // The decoder already read the payload: unreachable for a decoded frame.
            None => drops.push((0, DropReason::BadRecord)),
        }
    };
    match frame.body() {
        Body::Commit(c) => {
            let did_ok = is_valid_did(c.repo);
            let rev_ok = is_valid_tid(c.rev);
            for (i, op) in c.ops().enumerate() {
                let (collection, rkey) = (op.collection(), op.rkey());
                let why = if !did_ok {
                    Some(DropReason::InvalidDid)
                } else if !rev_ok {
                    Some(DropReason::InvalidRev)
                } else if !is_valid_nsid(collection) {
                    Some(DropReason::InvalidCollection)
                } else if !is_valid_record_key(rkey) {
                    Some(DropReason::InvalidRkey)
                } else {
                    None
                };
                if let Some(why) = why {
                    drops.push((i, why));
                    continue;
                }
                let (kind, payload) = match op.action {
                    Action::Delete => (Kind::Delete, &[][..]),
                    action => {
                        let Some(bytes) = op.cid.and_then(|cid| frame.block_bytes(cid)) else {
                            drops.push((i, DropReason::MissingRecord));
                            continue;
                        };
                        let mut tape = arena.tape(bytes);
                        if tape.decode(0..bytes.len(), &Options::strict()).is_err() {
                            drops.push((i, DropReason::BadRecord));
                            continue;
                        }
                        let kind = if action == Action::Create {
                            Kind::Create
                        } else {
                            Kind::Update
                        };
                        (kind, bytes)
                    }
                };
                rows.push(FrameRow {
                    kind,
                    did: c.repo,
                    collection,
                    rkey,
                    rev: c.rev,
                    payload,
                });
            }
        }
        Body::Identity(id) => marker(Kind::Identity, id.did, arena, &mut rows, &mut drops),
        Body::Account(a) => marker(Kind::Account, a.did, arena, &mut rows, &mut drops),
        Body::Sync(s) if with_sync => marker(Kind::Sync, s.did, arena, &mut rows, &mut drops),
        Body::Sync(_) | Body::Info(_) | Body::Error(_) | Body::Unknown { .. } => {}
    }
    (rows, drops)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{EventKind, Projector};
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
        let (mut dec, mut proj, mut arena) = (FrameDecoder::new(), Projector::new(), Arena::new());
        let (mut n, mut markers) = (0, 0);
        for f in &frames {
            let frame = dec.decode(f.bytes).unwrap();
            let (rows, drops) = frame_rows(&frame, &mut arena, false);
            let p = proj.project(&frame);
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
                        assert_eq!(
                            op,
                            match r.kind {
                                Kind::Create => "create",
                                Kind::Update => "update",
                                _ => "delete",
                            }
                        );
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
