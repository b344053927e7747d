//! A fetched repository checked whole and indexed for its records: no I/O, no async.
//!
//! Why apart from the fetch: verification is the CPU-bound core (it runs on a blocking thread,
//! never on the async threads), and it is tested on real CARs without a network. It is
//! `riptide_repo::verify_repo`, the whole-repository verifier `riptide repo verify` uses (every
//! block's CID while the CAR is read, the commit's signature with the given key, the MST walk
//! and its rebuild against the commit's `data`), then one listing walk over the verified CAR
//! (`riptide_repo::list_records`, blocks not hashed again) that records where each kept
//! record's block is. Its errors map onto [`FailKind`]s.

use riptide_car::{CarErrorKind, CarOptions, CarReader};
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
    let verified =
        riptide_repo::verify_repo_traced(&car, key, &RepoOptions::default(), &mut progress);
    // Another account's repository fails its signature too (it is signed with the other key):
    // the commit's DID, known as soon as the commit decoded, is the truer reason.
    if let Some(other) = progress.did.as_deref().filter(|d| *d != did) {
        return Err(fail(
            FailKind::WrongDid,
            format!("the repository's commit is {other}'s"),
        ));
    }
    let report = verified.map_err(|e| fail(kind_of(&e), e.to_string()))?;
    let records = {
        let mut reader = CarReader::new();
        // Every block was hashed by the verification above.
        let opts = CarOptions {
            verify: false,
            ..CarOptions::repository()
        };
        let parsed = reader
            .read(&car, &opts)
            .map_err(|e| fail(FailKind::BadCar, e.to_string()))?;
        let base = car.as_ptr() as usize;
        let listed =
            riptide_repo::list_records(&parsed).map_err(|e| fail(kind_of(&e), e.to_string()))?;
        let mut kept = Vec::with_capacity(if keep.is_all() { listed.len() } else { 0 });
        for (key, cid) in listed {
            let Some(slash) = key.find('/') else {
                return Err(fail(
                    FailKind::MstInvalid,
                    format!("MST key {key:?} is not collection/rkey"),
                ));
            };
            if !keep.matches(&key[..slash]) {
                continue;
            }
            let Some(block) = parsed.get(cid.as_cid()) else {
                return Err(fail(
                    FailKind::MissingBlock,
                    format!("record {key} ({cid}) is not in the CAR"),
                ));
            };
            // The block is a slice of `car` (the reader does not copy): its place in it.
            let start = block.as_ptr() as usize - base;
            kept.push(RecordAt {
                key,
                slash,
                cid,
                at: start..start + block.len(),
            });
        }
        kept
    };
    Ok(Verified {
        did: did.to_owned(),
        rev: report.rev,
        commit: report.commit,
        data: report.data,
        total_records: report.records,
        bytes: car.len() as u64,
        source: source.to_owned(),
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
