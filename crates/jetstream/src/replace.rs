//! Replacement rows: what a verified repository becomes when it lands over an account's
//! earlier rows (a resync after a chain break, or a backfill into a store that already served
//! the account).
//!
//! Why a module of its own: the live ingest path (`riptide serve`'s resync) and the backfill's
//! store sink both land repositories over earlier rows and must emit the same thing, as
//! Jetstream v2 does (`docs/archive.md`, "Replacement rows"): first a `#sync` row, the account's
//! DID tombstone (everything of the account before it is replaced), then one `create-resync`
//! (kind 7) row per record of the repository, in MST key order, each carrying the record's
//! DAG-CBOR as signed and the repository's rev. No I/O: the callers give the records and assign
//! seqs and times.

use riptide_cbor::{write_bytes, write_int, write_map_header, write_text, CidBuf, DAG_CBOR};
use riptide_firehose::Action;
use riptide_segment::{Kind, Row};

use crate::{EventRowKind, StoredRow};

/// The body of the `#sync` event that opens a replacement (the lexicon's
/// `com.atproto.sync.subscribeRepos#sync`): `{did, rev, seq, time, blocks}`, `blocks` a CAR of
/// the signed commit block alone, rooted at its CID. `seq` is the upstream seq at which the new
/// state took effect (0 when there is none, as for a backfill), `time` when it landed.
pub fn sync_body(
    did: &str,
    rev: &str,
    commit: &CidBuf,
    commit_block: &[u8],
    seq: u64,
    time: &str,
) -> Vec<u8> {
    let car = riptide_car::write_car(
        std::slice::from_ref(commit),
        [(commit.as_cid(), commit_block)],
    );
    let mut out = Vec::with_capacity(car.len() + 200);
    // DAG-CBOR map keys in canonical order: shorter first, then bytewise.
    write_map_header(&mut out, 5);
    write_text(&mut out, "did");
    write_text(&mut out, did);
    write_text(&mut out, "rev");
    write_text(&mut out, rev);
    write_text(&mut out, "seq");
    write_int(&mut out, seq.min(i64::MAX as u64) as i64);
    write_text(&mut out, "time");
    write_text(&mut out, time);
    write_text(&mut out, "blocks");
    write_bytes(&mut out, &car);
    out
}

/// [`sync_body`] as a whole `#sync` frame: the header `{t: "#sync", op: 1}`, then the body.
pub fn sync_frame(
    did: &str,
    rev: &str,
    commit: &CidBuf,
    commit_block: &[u8],
    seq: u64,
    time: &str,
) -> Vec<u8> {
    let mut out = Vec::new();
    write_map_header(&mut out, 2);
    write_text(&mut out, "t");
    write_text(&mut out, "#sync");
    write_text(&mut out, "op");
    write_int(&mut out, 1);
    out.extend_from_slice(&sync_body(did, rev, commit, commit_block, seq, time));
    out
}

/// The stored row of a replacement's `#sync` (its payload is a [`sync_body`]).
pub fn sync_row<'a>(did: &'a str, body: &'a [u8]) -> StoredRow<'a> {
    StoredRow::Event {
        kind: EventRowKind::Sync,
        did,
        payload: body,
    }
}

/// One record of a repository that replaces earlier rows.
#[derive(Clone, Copy, Debug)]
pub struct ReplacementRecord<'a> {
    /// The collection NSID.
    pub collection: &'a str,
    /// The record key.
    pub rkey: &'a str,
    /// The record's CID as the repository's MST names it.
    pub cid: &'a CidBuf,
    /// The record block, DAG-CBOR as signed.
    pub bytes: &'a [u8],
}

/// Why a record of a replacement got no row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReplacementError {
    /// The block does not hash to the CID the MST names (a verified repository cannot have
    /// one; checked anyway, since the row is served as that record).
    #[error("the record's block does not hash to its CID")]
    CidMismatch,
}

impl<'a> ReplacementRecord<'a> {
    /// The record's row as a v1 event renders it (a `create` at the repository's `rev`), its
    /// block checked against its CID first. Its segment row is [`replacement_row`] of it.
    pub fn stored_row(
        &self,
        did: &'a str,
        rev: &'a str,
    ) -> Result<StoredRow<'a>, ReplacementError> {
        if CidBuf::sha256(DAG_CBOR, self.bytes) != *self.cid {
            return Err(ReplacementError::CidMismatch);
        }
        Ok(StoredRow::Commit {
            did,
            rev,
            action: Action::Create,
            collection: self.collection,
            rkey: self.rkey,
            record: Some(self.bytes),
        })
    }
}

/// The segment row of a replacement's stored row: a record's `create` becomes `create-resync`
/// (kind 7), which Jetstream's v2 wire sends as a `create` and its archive keeps apart; the
/// `#sync` stays a `#sync`.
pub fn replacement_row<'a>(row: &StoredRow<'a>, seq: u64, witnessed_at: i64) -> Row<'a> {
    let mut r = row.row(seq, witnessed_at);
    if r.kind == Kind::Create {
        r.kind = Kind::CreateResync;
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{EventKind, Projector};

    /// A replacement renders as v1 events: the `#sync` as a `sync` event naming the commit, each
    /// record as a `create` whose CID is its block's; its segment rows are `#sync` then kind 7.
    #[test]
    fn a_replacement_renders_as_a_sync_then_creates() {
        let record = b"\xa2e$typeqapp.bsky.feed.likedtexta";
        let mut rec = Vec::new();
        write_map_header(&mut rec, 1);
        write_text(&mut rec, "$type");
        write_text(&mut rec, "app.bsky.feed.like");
        let cid = CidBuf::sha256(DAG_CBOR, &rec);
        let mut commit_block = Vec::new();
        write_map_header(&mut commit_block, 1);
        write_text(&mut commit_block, "rev");
        write_text(&mut commit_block, "3l2222222222a");
        let commit = CidBuf::sha256(DAG_CBOR, &commit_block);
        let did = "did:plc:aaaaaaaaaaaaaaaaaaaaaaaa";
        let rev = "3l2222222222a";
        let body = sync_body(
            did,
            rev,
            &commit,
            &commit_block,
            0,
            "2026-11-28T18:00:00.000000Z",
        );
        let mut p = Projector::with_sync();
        let sync = p.project_row(&sync_row(did, &body)).unwrap();
        assert_eq!((sync.len(), sync.kind(0)), (1, EventKind::Sync));
        let mut json = Vec::new();
        sync.render(0, 1, Some(1), &mut json);
        let v: serde_json::Value = serde_json::from_slice(&json).unwrap();
        assert_eq!(v["sync"]["rev"], rev, "{v}");
        assert_eq!(
            replacement_row(&sync_row(did, &body), 1, 1).kind,
            Kind::Sync
        );

        let r = ReplacementRecord {
            collection: "app.bsky.feed.like",
            rkey: "3l2222222222b",
            cid: &cid,
            bytes: &rec,
        };
        let row = r.stored_row(did, rev).unwrap();
        let c = p.project_row(&row).unwrap();
        json.clear();
        c.render(0, 2, Some(2), &mut json);
        let v: serde_json::Value = serde_json::from_slice(&json).unwrap();
        assert_eq!(v["commit"]["operation"], "create");
        assert_eq!(v["commit"]["rev"], rev);
        assert_eq!(v["commit"]["cid"], cid.to_string());
        let seg = replacement_row(&row, 2, 2);
        assert_eq!((seg.kind, seg.payload), (Kind::CreateResync, &rec[..]));

        // A block that is not the record the MST names gets no row.
        let bad = ReplacementRecord {
            bytes: &record[..],
            ..r
        };
        assert!(matches!(
            bad.stored_row(did, rev),
            Err(ReplacementError::CidMismatch)
        ));
    }
}
