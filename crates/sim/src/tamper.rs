//! Broken repository exports, each broken in exactly one way, for the per-repository faults.
//!
//! Why: a backfill must refuse every one of these with its own reason and never serve a record
//! of it, so each has to be precise: a CAR cut exactly at a block boundary is well-framed and
//! only incomplete (a byte prefix of the real export); a missing block leaves everything else
//! intact; a bad signature changes the signature and nothing else (the commit's CID follows, so
//! the CAR itself is consistent). They are computed once, when the simulator starts.

use riptide_car::{CarOptions, CarReader, CarWriter};
use riptide_cbor::{CidBuf, DAG_CBOR};

/// Why a repository export could not be broken as asked (it was not a readable export).
#[derive(Debug, thiserror::Error)]
#[error("cannot tamper with this CAR: {0}")]
pub struct TamperError(String);

impl TamperError {
    /// An error saying `why`.
    pub fn new(why: impl Into<String>) -> TamperError {
        TamperError(why.into())
    }
}

/// A CAR's blocks, owned.
type Blocks = Vec<(CidBuf, Vec<u8>)>;

fn blocks(car: &[u8]) -> Result<(CidBuf, Blocks), TamperError> {
    let mut reader = CarReader::new();
    let opts = CarOptions {
        verify: false,
        ..CarOptions::repository()
    };
    let parsed = reader
        .read(car, &opts)
        .map_err(|e| TamperError(e.to_string()))?;
    let root = parsed
        .roots()
        .next()
        .map(CidBuf::from)
        .ok_or_else(|| TamperError("no root".into()))?;
    let all = parsed
        .blocks()
        .map(|b| (CidBuf::from(b.cid), b.data.to_vec()))
        .collect();
    Ok((root, all))
}

fn write(root: CidBuf, blocks: &[(CidBuf, Vec<u8>)]) -> Vec<u8> {
    let mut w = CarWriter::new(&[root]);
    for (c, d) in blocks {
        w.block(c.as_cid(), d);
    }
    w.finish()
}

/// The export cut after half of its blocks (at least the first): a prefix of `car` that ends
/// exactly where a block ends.
pub fn cut_at_block(car: &[u8]) -> Result<Vec<u8>, TamperError> {
    let (root, all) = blocks(car)?;
    if all.len() < 2 {
        return Err(TamperError("fewer than two blocks".into()));
    }
    Ok(write(root, &all[..all.len().div_ceil(2)]))
}

/// The export without its last block (a record in the exports `riptide gen` and the fixtures
/// write).
pub fn missing_block(car: &[u8]) -> Result<Vec<u8>, TamperError> {
    let (root, mut all) = blocks(car)?;
    if all.len() < 2 {
        return Err(TamperError("fewer than two blocks".into()));
    }
    all.pop();
    Ok(write(root, &all))
}

/// The export with one byte of the commit's signature changed (the signature no longer verifies
/// with the account's key), the commit's CID and the CAR root recomputed to match.
pub fn bad_signature(car: &[u8]) -> Result<Vec<u8>, TamperError> {
    let (root, mut all) = blocks(car)?;
    let Some(pos) = all.iter().position(|(c, _)| *c == root) else {
        return Err(TamperError("the root block is not in the CAR".into()));
    };
    let commit = &mut all[pos].1;
    // `sig` as a text key (0x63 "sig") followed by a 64-byte byte string (0x58 0x40).
    let marker = [0x63, b's', b'i', b'g', 0x58, 0x40];
    let at = commit
        .windows(marker.len())
        .position(|w| w == marker)
        .ok_or_else(|| TamperError("the commit has no 64-byte sig".into()))?;
    // A byte inside `r`: the signature still parses, and no longer verifies.
    commit[at + marker.len() + 10] ^= 0x55;
    let cid = CidBuf::sha256(DAG_CBOR, commit);
    all[pos].0 = cid;
    Ok(write(cid, &all))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixture;

    #[test]
    fn each_break_is_the_one_asked_for() {
        let a = fixture::account(3, "t.test", 12);
        let key = a.key.public_key();
        riptide_repo::verify_repo(&a.car, Some(&key)).unwrap();

        let cut = cut_at_block(&a.car).unwrap();
        assert!(a.car.starts_with(&cut) && cut.len() < a.car.len());
        let mut reader = CarReader::new();
        let whole = reader.read(&a.car, &CarOptions::repository()).unwrap();
        // The cut ends at a block's end: reading it gives whole blocks only.
        let mut r2 = CarReader::new();
        let part = r2.read(&cut, &CarOptions::repository()).unwrap();
        assert_eq!(part.len(), whole.len().div_ceil(2));
        assert!(riptide_repo::verify_repo(&cut, Some(&key)).is_err());

        let missing = missing_block(&a.car).unwrap();
        let err = riptide_repo::verify_repo(&missing, Some(&key)).unwrap_err();
        assert!(
            matches!(
                err,
                riptide_repo::RepoError::MissingRecord { .. } | riptide_repo::RepoError::Mst(_)
            ),
            "{err}"
        );

        let bad = bad_signature(&a.car).unwrap();
        let err = riptide_repo::verify_repo(&bad, Some(&key)).unwrap_err();
        assert!(
            matches!(err, riptide_repo::RepoError::Signature(_)),
            "{err}"
        );
        // Without the key everything else still verifies: only the signature is broken.
        assert_eq!(riptide_repo::verify_repo(&bad, None).unwrap().records, 12);
    }
}
