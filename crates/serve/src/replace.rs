//! A verified repository landing over an account's earlier rows, in ingest: the rows it becomes.
//!
//! Why: when a repository replaces what the store already served of an account (a resync after
//! a chain break today; `serve --backfill` over an account ingested live next), a subscriber
//! must be able to rebuild the account from the stream alone. So the repository becomes, as in
//! Jetstream v2 (`docs/archive.md`, "Replacement rows"), a `#sync` event (the account's DID
//! tombstone: on v2 `subscribeEvents` a consumer drops what it holds of the account) followed by
//! one `create-resync` (kind 7) row per record, in MST key order, each the record's DAG-CBOR as
//! signed and checked against its CID, all at the repository's rev. A resync's are parts of
//! **one** worker answer, so the writer stores them in one atomic batch with the account's new
//! chain state and the release of its held frames, in the store's seq space; a `serve
//! --backfill` repository's come in pieces, the chain state and the release with the last
//! (`crate::backfill`, "In pieces"), the account's frames held between them. v1 `/subscribe` sends none of them, as Jetstream's
//! (protocol §4.1, §7 item 8): each record is stored as an `EventKind::Replacement` event
//! (`ingest::push_event` tells it by its `create-resync` row), which v1 skips and counts.
//!
//! The rows themselves (the `#sync` body, the record's row and its kind 7) are
//! [`riptide_jetstream::replace`]'s, shared with the backfill's store sink.

use riptide_cbor::CidBuf;
use riptide_jetstream::replace::{
    replacement_row, sync_body, sync_row, ReplacementError, ReplacementRecord,
};
use riptide_jetstream::{Projector, StoredRow};

use crate::ingest::{push_parts, DoneChunk};

/// A verified repository about to replace an account's earlier rows.
#[derive(Clone, Copy, Debug)]
pub struct Repository<'a> {
    /// The account.
    pub did: &'a str,
    /// Its commit's rev.
    pub rev: &'a str,
    /// The commit block's CID.
    pub commit: &'a CidBuf,
    /// The signed commit block (what the `#sync` carries).
    pub commit_block: &'a [u8],
}

/// What a replacement emitted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Replaced {
    /// Records emitted as `create-resync` rows.
    pub records: u64,
    /// Records not emitted: their block did not hash to their CID, or they fall outside the
    /// data model v1 renders (each counted in `riptide_replacement_records_dropped_total`).
    pub dropped: u64,
    /// Whether the replacement's `#sync` is among them: a repository replaced (one landing in
    /// pieces counts once, with its first).
    pub sync: bool,
}

/// Lands `repo` over its account's earlier rows (module docs): its `#sync` (upstream seq
/// `upstream_seq`, time `time`; unless `sync` is false: a piece after the first, `crate::resync`,
/// "In pieces") then one `create-resync` per record that `records` hands the
/// function it is given (in MST key order), pushed into `out` as events of the job being
/// answered. `records` returns how many records it could not hand over (counted as dropped).
/// The caller has put the account's new chain state in the same answer, so both land in one
/// batch.
pub(crate) fn land_over_earlier_rows(
    projector: &mut Projector,
    repo: &Repository<'_>,
    (upstream_seq, sync): (u64, bool),
    time: &str,
    out: &mut DoneChunk,
    records: impl FnOnce(&mut dyn FnMut(ReplacementRecord<'_>)) -> u64,
) -> Replaced {
    let mut done = Replaced {
        sync,
        ..Replaced::default()
    };
    if sync {
        push_sync(projector, repo, upstream_seq, time, out);
    }
    let unread = records(&mut |r| {
        let row: Result<StoredRow<'_>, ReplacementError> = r.stored_row(repo.did, repo.rev);
        let projected = match row {
            Ok(row) => projector
                .project_row(&row)
                .map(|p| (p, row))
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        match projected {
            Ok((p, row)) => {
                push_parts(p, |_| Some(replacement_row(&row, 0, 0)), out);
                done.records += 1;
            }
            Err(why) => {
                done.dropped += 1;
                tracing::debug!(
                    did = repo.did,
                    collection = r.collection,
                    rkey = r.rkey,
                    why,
                    "replacement record not emitted"
                );
            }
        }
    });
    done.dropped += unread;
    // Counted by the writer once the batch holding them is durable.
    out.replaced = Some(done);
    done
}

/// The replacement's `#sync` (module docs) into `out`.
pub(crate) fn push_sync(
    projector: &mut Projector,
    repo: &Repository<'_>,
    upstream_seq: u64,
    time: &str,
    out: &mut DoneChunk,
) {
    let body = sync_body(
        repo.did,
        repo.rev,
        repo.commit,
        repo.commit_block,
        upstream_seq,
        time,
    );
    let sync = sync_row(repo.did, &body);
    match projector.project_row(&sync) {
        Ok(p) => push_parts(p, |_| Some(replacement_row(&sync, 0, 0)), out),
        Err(e) => {
            // Built here from a verified commit: a bug, said; the records still follow.
            tracing::error!(did = repo.did, error = %e, "the #sync of a replacement does not project: not served");
        }
    }
}

/// One record of a verified repository's CAR, found once ([`car_index`]) so that the pieces
/// of its landing (`crate::resync`, "In pieces") need not walk its MST again.
#[derive(Clone, Debug)]
pub struct RecordAt {
    /// `collection/rkey`.
    key: Box<str>,
    /// Where the `/` is in `key`.
    slash: usize,
    cid: CidBuf,
    /// Its block's bytes in the CAR (empty: not there).
    at: std::ops::Range<usize>,
}

/// A verified repository's records in MST key order, and how many have a key that is not
/// `collection/rkey` (not emitted: counted as dropped); `Err` if the CAR does not read as a
/// repository (it verified before, so it does).
pub fn car_index(car: &[u8]) -> Result<(Vec<RecordAt>, u64), riptide_repo::RepoError> {
    let mut reader = riptide_car::CarReader::new();
    // Its blocks' CIDs were checked when it verified; each record is checked again against its
    // CID as it becomes a row (`ReplacementRecord::stored_row`).
    let opts = riptide_car::CarOptions {
        verify: false,
        ..riptide_car::CarOptions::repository()
    };
    let parsed = reader.read(car, &opts)?;
    let base = car.as_ptr() as usize;
    let mut unread = 0;
    let mut out = Vec::new();
    for (key, cid) in riptide_repo::list_records(&parsed)? {
        let Some(slash) = key.find('/') else {
            unread += 1;
            continue;
        };
        let at = parsed.get(cid.as_cid()).map_or(0..0, |b| {
            let start = b.as_ptr() as usize - base;
            start..start + b.len()
        });
        out.push(RecordAt {
            key: key.into(),
            slash,
            cid,
            at,
        });
    }
    Ok((out, unread))
}

/// Hands `each` the records `index` names, read from `car` (what [`car_index`] read).
pub(crate) fn car_records(
    car: &[u8],
    index: &[RecordAt],
    each: &mut dyn FnMut(ReplacementRecord<'_>),
) {
    for r in index {
        each(ReplacementRecord {
            collection: &r.key[..r.slash],
            rkey: &r.key[r.slash + 1..],
            cid: &r.cid,
            bytes: car.get(r.at.clone()).unwrap_or_default(),
        });
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use riptide_jetstream::EventKind;
    use riptide_segment::Kind;

    /// (`collection/rkey`, CID) per record.
    type Listing = Vec<(String, String)>;

    /// The corpus repository and goat's listing of it.
    fn goat() -> Option<(Vec<u8>, Listing)> {
        let car = riptide_testdata::read("jetstream-2026-07/repo.car")?;
        let tsv = riptide_testdata::read("jetstream-2026-07/car_expected_records.tsv")?;
        let listing = String::from_utf8(tsv)
            .unwrap()
            .lines()
            .filter(|l| !l.is_empty())
            .map(|l| {
                let (k, c) = l.split_once('\t').unwrap();
                (k.to_owned(), c.to_owned())
            })
            .collect();
        Some((car, listing))
    }

    fn land(car: &[u8], out: &mut DoneChunk) -> Replaced {
        let mut reader = riptide_car::CarReader::new();
        let opts = riptide_car::CarOptions {
            verify: false,
            ..riptide_car::CarOptions::repository()
        };
        let parsed = reader.read(car, &opts).unwrap();
        let (commit, c) = riptide_repo::commit_of(&parsed).unwrap();
        let block = parsed.get(commit.as_cid()).unwrap();
        let repo = Repository {
            did: c.did(),
            rev: c.rev(),
            commit: &commit,
            commit_block: block,
        };
        let mut projector = Projector::with_sync();
        land_over_earlier_rows(
            &mut projector,
            &repo,
            (7, true),
            "2026-11-28T18:00:00.000000Z",
            out,
            |each| {
                let (index, unread) = car_index(car).unwrap();
                car_records(car, &index, each);
                unread
            },
        )
    }

    /// A real repository export lands as its `#sync`, then one `create-resync` per record, in
    /// MST key order, each with the CID goat lists for it.
    #[test]
    fn a_real_repository_lands_as_a_sync_then_its_records_as_goat_lists_them() {
        let Some((car, listing)) = goat() else {
            return;
        };
        let mut out = DoneChunk::default();
        let done = land(&car, &mut out);
        assert_eq!(
            done,
            Replaced {
                records: 23,
                dropped: 0,
                sync: true
            }
        );
        assert_eq!(out.replaced, Some(done));
        assert_eq!(out.parts.len(), 24);
        let sync = &out.parts[0];
        assert_eq!(sync.kind, EventKind::Sync);
        assert_eq!(sync.row.as_ref().map(|r| r.kind), Some(Kind::Sync));
        let mut got = Vec::new();
        for p in &out.parts[1..] {
            assert_eq!(p.kind, EventKind::Replacement, "a record v1 never sends");
            let r = p.row.as_ref().unwrap();
            assert_eq!(r.kind, Kind::CreateResync);
            let mut json = out.buf[p.head.clone()].to_vec();
            json.extend_from_slice(b"0,\"cursor\":1");
            json.extend_from_slice(&out.buf[p.tail.clone()]);
            let v: serde_json::Value = serde_json::from_slice(&json).unwrap();
            let c = &v["commit"];
            assert_eq!(c["operation"], "create", "{v}");
            got.push((
                format!(
                    "{}/{}",
                    c["collection"].as_str().unwrap(),
                    c["rkey"].as_str().unwrap()
                ),
                c["cid"].as_str().unwrap().to_owned(),
            ));
        }
        let mut sorted = got.clone();
        sorted.sort();
        assert_eq!(got, sorted, "MST key order");
        let mut want = listing;
        want.sort();
        assert_eq!(got, want);
    }

    /// A record block that does not hash to its MST CID gets no row, and is counted.
    #[test]
    fn a_record_whose_block_is_not_its_cid_is_dropped_and_counted() {
        let Some((mut car, _)) = goat() else {
            return;
        };
        // The first record's block, found in the CAR's bytes, altered.
        let at = {
            let mut reader = riptide_car::CarReader::new();
            let parsed = reader
                .read(&car, &riptide_car::CarOptions::repository())
                .unwrap();
            let (_, cid) = riptide_repo::list_records(&parsed).unwrap().remove(0);
            let block = parsed.get(cid.as_cid()).unwrap();
            block.as_ptr() as usize - car.as_ptr() as usize + block.len() - 1
        };
        car[at] ^= 1;
        let mut out = DoneChunk::default();
        let done = land(&car, &mut out);
        assert_eq!(
            done,
            Replaced {
                records: 22,
                dropped: 1,
                sync: true
            }
        );
        assert_eq!(out.parts.len(), 23);
    }
}
