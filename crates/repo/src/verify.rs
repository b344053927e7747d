//! Sync 1.1 commit-proof verification for one firehose `#commit`.
//!
//! Spec: <https://atproto.com/specs/sync>. Given the frame's CAR, the commit CID, the ops and
//! `prevData`, [`verify_commit_proof`]:
//! 1. decodes the commit block (the signature is a separate step: [`Commit::verify_signature`],
//!    so a caller can check it with a cached key, or skip it);
//! 2. loads the new MST lazily from the CAR, rooted at the commit's `data`;
//! 3. checks each op against the new tree: creates and updates hold their `cid` (and the record
//!    block is in the CAR), deletes are gone;
//! 4. undoes every op (last to first; if that order needs an absent node, in any order the
//!    blocks allow) and compares the resulting root with `prevData`.
//!
//! A node that the proof should contain but does not is [`ProofError::MissingBlock`] — raised
//! only when the node is truly needed; subtrees nobody looks into stay opaque CIDs.
//!
//! What it does not do: check the signature, the frame's `rev`/`since` against the commit or
//! against stored state (helpers: [`crate::commit::rev_is_newer`], [`crate::commit::is_tid`]),
//! or the ops' record contents.

use riptide_cbor::{Cid, CidBuf};

use crate::commit::Commit;
use crate::error::ProofError;
use crate::mst::invert::{check_forward, check_ops, invert, invert_any_order, ProofOp};
use crate::mst::tree::Tree;
use crate::source::BlockSource;

/// A commit whose proof verified.
#[derive(Debug, Clone, Copy)]
pub struct Verified<'a> {
    /// The decoded commit (signature not yet checked).
    pub commit: Commit<'a>,
    /// The root obtained by inverting the ops: equal to `prevData` when one was given.
    pub prev_data: CidBuf,
    /// Whether `prev_data` was compared with the frame's `prevData` (false when it was absent).
    pub prev_data_checked: bool,
    /// MST nodes loaded from the CAR during verification.
    pub nodes_loaded: usize,
}

/// Verifies a `#commit` proof. `blocks` is the frame's CAR (or any block source),
/// `commit_cid` the frame's `commit`, `prev_data` its `prevData` (`None` if absent, in which
/// case the inversion is still performed and its result returned, unchecked).
pub fn verify_commit_proof<'a, S: BlockSource + ?Sized>(
    blocks: &'a S,
    commit_cid: Cid<'_>,
    ops: &[ProofOp<'_>],
    prev_data: Option<Cid<'_>>,
) -> Result<Verified<'a>, ProofError> {
    verify_commit_proof_in(&mut Tree::new(), blocks, commit_cid, ops, prev_data)
}

/// [`verify_commit_proof`] on a tree kept by the caller ([`Tree::reload`]ed here), so that a
/// verifier checking commit after commit reuses the buffers the tree has grown. The same checks
/// and the same result; afterwards `tree` holds whatever the proof loaded.
pub fn verify_commit_proof_in<'a, S: BlockSource + ?Sized>(
    tree: &mut Tree,
    blocks: &'a S,
    commit_cid: Cid<'_>,
    ops: &[ProofOp<'_>],
    prev_data: Option<Cid<'_>>,
) -> Result<Verified<'a>, ProofError> {
    let block = blocks
        .get_block(commit_cid)
        .ok_or_else(|| ProofError::MissingBlock(commit_cid.to_buf()))?;
    // The tree's decoding arena, not a fresh one: a new arena's tape grows by reallocation
    // on every commit.
    let commit = Commit::decode_with(tree.arena(), block)?;
    check_ops(ops)?;
    tree.reload(commit.data().to_buf());
    let mut nodes_extra = 0;
    check_forward(tree, blocks, ops)?;
    for op in ops {
        if let Some(cid) = op.after() {
            if blocks.get_block(cid.as_cid()).is_none() {
                return Err(ProofError::MissingBlock(cid));
            }
        }
    }
    match invert(tree, blocks, ops) {
        Ok(()) => {}
        // Another order of the ops may not need the absent node (see `invert_any_order`).
        Err(ProofError::MissingBlock(_)) if ops.len() > 1 => {
            let loaded = tree.loaded().len();
            *tree = invert_any_order(commit.data().to_buf(), blocks, ops)?;
            nodes_extra = loaded;
        }
        Err(e) => return Err(e),
    }
    let computed = tree.root_cid()?;
    if let Some(expected) = prev_data {
        if expected != computed.as_cid() {
            return Err(ProofError::inversion_mismatch(expected.to_buf(), computed));
        }
    }
    Ok(Verified {
        commit,
        prev_data: computed,
        prev_data_checked: prev_data.is_some(),
        nodes_loaded: nodes_extra + tree.loaded().len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mst::invert::{proof_nodes, Action};
    use riptide_cbor::{OwnedValue, DAG_CBOR};
    use std::collections::{BTreeMap, HashMap};

    fn commit_block(data: CidBuf) -> (CidBuf, Vec<u8>) {
        let mut m = BTreeMap::new();
        m.insert("did".to_string(), OwnedValue::Text("did:plc:x".into()));
        m.insert("version".to_string(), OwnedValue::Int(3));
        m.insert("data".to_string(), OwnedValue::Link(data));
        m.insert("rev".to_string(), OwnedValue::Text("3migo7fijwi2k".into()));
        m.insert("prev".to_string(), OwnedValue::Null);
        m.insert("sig".to_string(), OwnedValue::Bytes(vec![0; 64]));
        let b = OwnedValue::Map(m).to_cbor();
        (CidBuf::sha256(DAG_CBOR, &b), b)
    }

    #[test]
    fn create_into_empty_repo_and_back() {
        // The first commit of a repository: prevData is the empty tree.
        let rec = OwnedValue::Text("hello".into()).to_cbor();
        let rec_cid = CidBuf::sha256(DAG_CBOR, &rec);
        let mut tree = Tree::new();
        tree.insert(&crate::NoBlocks, b"app.bsky.feed.post/3l2a", rec_cid)
            .unwrap();
        let mut blocks = Vec::new();
        let root = tree.root_cid_with_blocks(&mut blocks).unwrap();
        let (commit, commit_bytes) = commit_block(root);
        let mut src: HashMap<CidBuf, Vec<u8>> = blocks.into_iter().collect();
        src.insert(commit, commit_bytes);
        src.insert(rec_cid, rec);
        let ops = [ProofOp {
            action: Action::Create,
            path: "app.bsky.feed.post/3l2a",
            cid: Some(rec_cid),
            prev: None,
        }];
        assert_eq!(proof_nodes(root, &src, &ops).unwrap(), vec![root]);
        let empty = crate::mst::empty_root_cid();
        let v = verify_commit_proof(&src, commit.as_cid(), &ops, Some(empty.as_cid())).unwrap();
        assert_eq!(v.prev_data, empty);
        assert!(v.prev_data_checked);
        assert_eq!(v.commit.rev(), "3migo7fijwi2k");
        // A commit block that is not a commit.
        let junk = OwnedValue::Int(1).to_cbor();
        let junk_cid = CidBuf::sha256(DAG_CBOR, &junk);
        src.insert(junk_cid, junk);
        assert!(matches!(
            verify_commit_proof(&src, junk_cid.as_cid(), &ops, None),
            Err(ProofError::Commit(_))
        ));
    }

    #[test]
    fn empty_commit_keeps_the_root() {
        let leaves = vec![("a.b/c".to_string(), CidBuf::sha256(DAG_CBOR, b"r"))];
        let (root, blocks) = crate::mst::build(&leaves).unwrap();
        let (commit, bytes) = commit_block(root);
        let mut src: HashMap<CidBuf, Vec<u8>> = HashMap::new();
        src.insert(commit, bytes);
        // No ops: no MST node is needed at all, and prevData must equal data.
        let v = verify_commit_proof(&src, commit.as_cid(), &[], Some(root.as_cid())).unwrap();
        assert_eq!((v.prev_data, v.nodes_loaded), (root, 0));
        drop(blocks);
    }
}
