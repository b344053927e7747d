//! A fetched repository checked whole and indexed for its records: no I/O, no async.
//!
//! Why apart from the fetch: verification is the CPU-bound core (it runs on a blocking thread,
//! never on the async threads), and it is tested on real CARs without a network. It is
//! `riptide_repo::verify_repo`, the whole-repository verifier `riptide repo verify` uses (every
//! block's CID while the CAR is read, the commit's signature with the given key, the MST walk
//! and its rebuild against the commit's `data`), told of each record as its walk visits it
//! (`riptide_repo::verify_repo_visiting`), so that where each kept record's block is comes with
//! no second walk. Its errors map onto [`FailKind`]s.

use riptide_car::CarErrorKind;
use riptide_cbor::CidBuf;
use riptide_crypto::PublicKey;
use riptide_repo::{MstError, RepoError, RepoOptions};

use crate::collections::Collections;
use crate::outcome::{FailKind, Failure, RecordAt, RepoBytes, Verified};

/// Verifies `car` as `did`'s repository (signature checked when `key` is given; the backfill
/// always gives the DID document's) and keeps the records `keep` matches.
pub fn verify_car(
    car: RepoBytes,
    did: &str,
    key: Option<&PublicKey>,
    keep: &Collections,
    source: &str,
) -> Result<Verified, Failure> {
    let fail = |kind, detail: String| Failure::new(did, kind, format!("{source}: {detail}"));
    let mut progress = riptide_repo::Progress::default();
    // The records are indexed as the verification's walk visits them (one walk, one CAR
    // index): each kept record's key, CID and place in `car` (the reader does not copy, so a
    // block is a slice of `car`). Kept only if the whole repository verifies.
    let base = car.as_ptr() as usize;
    let mut records = Vec::new();
    let mut bad_key: Option<String> = None;
    // The CAR's root (the commit block, checked against the report's commit below).
    let mut root: Option<(CidBuf, std::ops::Range<usize>)> = None;
    let verified = riptide_repo::verify_repo_visiting(
        &car,
        key,
        &RepoOptions::default(),
        &mut progress,
        |parsed, k, cid| {
            if root.is_none() {
                root = parsed.roots().next().and_then(|c| {
                    let block = parsed.get(c)?;
                    let start = block.as_ptr() as usize - base;
                    Some((c.to_buf(), start..start + block.len()))
                });
            }
            let Some((k, slash)) = std::str::from_utf8(k)
                .ok()
                .and_then(|k| Some((k, k.find('/')?)))
            else {
                bad_key.get_or_insert_with(|| String::from_utf8_lossy(k).into_owned());
                return;
            };
            if !keep.matches(&k[..slash]) {
                return;
            }
            // A missing block fails the verification (`MissingRecord`).
            if let Some(block) = parsed.get(cid) {
                let start = block.as_ptr() as usize - base;
                records.push(RecordAt {
                    key: k.to_owned(),
                    slash,
                    cid: cid.to_buf(),
                    at: start..start + block.len(),
                });
            }
        },
    );
    // Another account's repository fails its signature too (it is signed with the other key):
    // the commit's DID, known as soon as the commit decoded, is the truer reason.
    if let Some(other) = progress.did.as_deref().filter(|d| *d != did) {
        return Err(fail(
            FailKind::WrongDid,
            format!("the repository's commit is {other}'s"),
        ));
    }
    let report = verified.map_err(|e| fail(kind_of(&e), e.to_string()))?;
    if let Some(k) = bad_key {
        return Err(fail(
            FailKind::MstInvalid,
            format!("MST key {k:?} is not collection/rkey"),
        ));
    }
    Ok(Verified {
        did: did.to_owned(),
        rev: report.rev,
        commit: report.commit,
        data: report.data,
        total_records: report.records,
        bytes: car.len() as u64,
        source: source.to_owned(),
        commit_at: root.filter(|(c, _)| *c == report.commit).map(|(_, at)| at),
        car,
        records,
    })
}

/// The failure kind of a verification error.
pub fn kind_of(e: &RepoError) -> FailKind {
    match e {
        RepoError::Car(c) => match c.kind() {
            CarErrorKind::HashMismatch { .. } | CarErrorKind::BadCid => FailKind::BadCid,
            // A section longer than what is left (or empty): a body cut inside a block is by far
            // its most common cause; the detail keeps the CAR reader's own words and offset.
            CarErrorKind::Truncated | CarErrorKind::BadSectionLength => FailKind::Truncated,
            CarErrorKind::TooLarge => FailKind::TooLarge,
            _ => FailKind::BadCar,
        },
        RepoError::NoRoot => FailKind::BadCar,
        RepoError::MissingCommit(_) | RepoError::MissingRecord { .. } => FailKind::MissingBlock,
        RepoError::Mst(MstError::MissingBlock(_)) => FailKind::MissingBlock,
        RepoError::Commit(_) => FailKind::BadCommit,
        RepoError::Signature(_) => FailKind::BadSignature,
        _ => FailKind::MstInvalid,
    }
}
