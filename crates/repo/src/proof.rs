//! Record proofs: one record with the signed commit and the MST path that leads to it, as
//! `com.atproto.sync.getRecord` serves them — built from a whole repository, and checked.
//!
//! Why here: a record proof is a small repository (the commit, the nodes a lookup of the key
//! visits, the record), so building it and checking it are the MST's and the commit's business,
//! without I/O: the simulator builds what it serves with [`record_proof`], `riptide get` checks
//! what a PDS answers with [`verify_record_proof`], and the two meet in tests.
//!
//! What a proof proves: the CAR's blocks hash to their CIDs (the CAR reader), its root is a
//! commit signed by the account's key, and a lookup of `collection/rkey` from the commit's
//! `data` through the CAR's nodes ends at the record's CID (present) or at a gap where the key
//! would be (absent). A node the lookup needs that the CAR lacks is
//! [`MstError::MissingBlock`](crate::MstError::MissingBlock); a record CID without its block is
//! [`RepoError::MissingRecord`].

use riptide_car::{Car, CarWriter};
use riptide_cbor::CidBuf;
use riptide_crypto::PublicKey;

use crate::error::RepoError;
use crate::mst::Tree;
use crate::repo::commit_of;

/// A record whose proof checked ([`verify_record_proof`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProvenRecord<'a> {
    /// The commit's DID (the caller compares it with the account it asked for).
    pub did: &'a str,
    /// The commit's `rev`.
    pub rev: &'a str,
    /// The commit block's CID.
    pub commit: CidBuf,
    /// The record's CID.
    pub cid: CidBuf,
    /// The record block (DAG-CBOR).
    pub record: &'a [u8],
}

/// A record found by a lookup: its CID and its block.
type Found<'a> = Option<(CidBuf, &'a [u8])>;

/// The MST nodes a lookup of `key` visits in `car`'s tree, with the record's CID and block if the
/// key is there (a CID without its block is [`RepoError::MissingRecord`]).
fn lookup<'a>(car: &Car<'a>, data: CidBuf, key: &str) -> Result<(Tree, Found<'a>), RepoError> {
    let mut tree = Tree::load(data);
    let Some(cid) = tree.get(car, key.as_bytes())? else {
        return Ok((tree, None));
    };
    let record = car
        .get(cid.as_cid())
        .ok_or_else(|| RepoError::MissingRecord {
            key: key.to_owned(),
            cid,
        })?;
    Ok((tree, Some((cid, record))))
}

/// The proof CAR of `key` (`collection/rkey`) in a whole repository `car`: rooted at its commit,
/// holding the commit, every node a lookup of the key visits, and the record. `None` when the
/// repository has no such record.
pub fn record_proof(car: &Car<'_>, key: &str) -> Result<Option<Vec<u8>>, RepoError> {
    let (commit_cid, commit) = commit_of(car)?;
    let (tree, found) = lookup(car, commit.data().to_buf(), key)?;
    let Some((cid, record)) = found else {
        return Ok(None);
    };
    let mut w = CarWriter::new(&[commit_cid]);
    w.block(commit_cid.as_cid(), commit.block());
    for node in tree.loaded() {
        let block = car
            .get(node.as_cid())
            .ok_or(RepoError::Mst(crate::MstError::MissingBlock(*node)))?;
        w.block(node.as_cid(), block);
    }
    w.block(cid.as_cid(), record);
    Ok(Some(w.finish()))
}

/// Checks a record proof (`com.atproto.sync.getRecord`'s CAR, read with block verification on)
/// for `key`: the commit's signature with `signing_key` (skipped when `None`), then the lookup
/// from the commit's `data`. `Ok(None)`: the proof shows the key absent.
pub fn verify_record_proof<'a>(
    car: &Car<'a>,
    key: &str,
    signing_key: Option<&PublicKey>,
) -> Result<Option<ProvenRecord<'a>>, RepoError> {
    let (commit_cid, commit) = commit_of(car)?;
    if let Some(k) = signing_key {
        commit.verify_signature(k)?;
    }
    let (_, found) = lookup(car, commit.data().to_buf(), key)?;
    let Some((cid, record)) = found else {
        return Ok(None);
    };
    Ok(Some(ProvenRecord {
        did: commit.did(),
        rev: commit.rev(),
        commit: commit_cid,
        cid,
        record,
    }))
}
