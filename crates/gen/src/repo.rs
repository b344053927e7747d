//! One account's repository as the generator evolves it, and what a Sync 1.1 commit must carry.
//!
//! Why: a generated `#commit` is only valid if its CAR holds exactly what a verifier inverting
//! the ops needs. Rather than reimplementing that, this uses `riptide-repo`'s own MST: the
//! account's [`Tree`], held wholly in memory (built bottom-up from the sorted starting records,
//! [`Tree::from_sorted`]), takes the ops and re-hashes only the changed path; the proof nodes of
//! a one-op commit come from the new tree's shape ([`Tree::single_op_proof`], tested against the
//! verifier's inversion), those of a multi-op commit from the verifier's inversion itself
//! ([`proof_nodes`]) over the new tree's blocks near the changed keys.
//!
//! Memory: one in-memory tree per account (no block store: a node's bytes are re-encoded when a
//! proof needs them). Record bytes are kept only when a full export is wanted
//! ([`RepoState::keep_records`]).
//!
//! What it does not do: sign or encode commits (see [`crate::network`]).

use std::collections::{BTreeMap, HashMap, HashSet};

use riptide_cbor::CidBuf;
use riptide_repo::mst::invert::proof_nodes;
use riptide_repo::mst::{self, Tree};
use riptide_repo::{Action, NoBlocks, ProofError, ProofOp};

use crate::error::GenError;

/// One op as the frame will carry it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Op {
    /// Create, update or delete.
    pub action: Action,
    /// `collection/rkey`.
    pub path: String,
    /// The new record CID (create, update).
    pub cid: Option<CidBuf>,
    /// The previous record CID (update, delete).
    pub prev: Option<CidBuf>,
}

/// An op to apply, with the new record's CID and bytes for creates and updates.
#[derive(Clone, Debug)]
pub struct Change {
    /// Create, update or delete.
    pub action: Action,
    /// `collection/rkey`.
    pub path: String,
    /// The record (create, update).
    pub record: Option<(CidBuf, Vec<u8>)>,
}

/// A commit applied to the tree but not yet kept: the new root, its blocks, and the proof.
#[derive(Debug)]
pub struct Prepared {
    /// The MST root after the ops.
    pub data: CidBuf,
    /// The MST root before.
    pub prev_data: CidBuf,
    /// The ops as the frame carries them.
    pub ops: Vec<Op>,
    /// The MST nodes the frame must carry, in the verifier's load order.
    pub proof: Vec<(CidBuf, Vec<u8>)>,
    /// Created and updated records.
    pub records: Vec<(CidBuf, Vec<u8>)>,
}

/// An account's repository.
#[derive(Debug)]
pub struct RepoState {
    tree: Tree,
    /// The MST root.
    pub root: CidBuf,
    /// The current revision.
    pub rev: String,
    leaves: BTreeMap<String, CidBuf>,
    /// TID-keyed paths, for drawing a record to delete (index kept in `deletable_at`).
    deletable: Vec<String>,
    deletable_at: HashMap<String, usize>,
    records: Option<HashMap<CidBuf, Vec<u8>>>,
}

fn rkey_is_tid(path: &str) -> bool {
    path.rsplit_once('/')
        .is_some_and(|(_, k)| riptide_repo::is_tid(k))
}

impl RepoState {
    /// A repository holding `records` (path → CID and bytes), at revision `rev`.
    pub fn new(
        records: Vec<(String, CidBuf, Vec<u8>)>,
        rev: String,
        keep_records: bool,
    ) -> Result<RepoState, GenError> {
        let mut leaves = BTreeMap::new();
        let mut kept = keep_records.then(HashMap::new);
        for (path, cid, bytes) in records {
            leaves.insert(path, cid);
            if let Some(k) = kept.as_mut() {
                k.insert(cid, bytes);
            }
        }
        let sorted: Vec<(&str, CidBuf)> = leaves.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        let mut tree = Tree::from_sorted(&sorted).map_err(|e| GenError::Internal(e.to_string()))?;
        drop(sorted);
        let root = tree.root_cid()?;
        let mut state = RepoState {
            tree,
            root,
            rev,
            deletable: Vec::new(),
            deletable_at: HashMap::new(),
            records: kept,
            leaves,
        };
        let paths: Vec<String> = state
            .leaves
            .keys()
            .filter(|p| rkey_is_tid(p))
            .cloned()
            .collect();
        for p in paths {
            state.add_deletable(p);
        }
        Ok(state)
    }

    /// Whether record bytes are kept (for [`RepoState::export_blocks`]).
    pub fn keep_records(&self) -> bool {
        self.records.is_some()
    }

    /// Number of records.
    pub fn len(&self) -> usize {
        self.leaves.len()
    }

    /// Whether the repository is empty.
    pub fn is_empty(&self) -> bool {
        self.leaves.is_empty()
    }

    /// The record CID at `path`.
    pub fn get(&self, path: &str) -> Option<CidBuf> {
        self.leaves.get(path).copied()
    }

    /// Number of TID-keyed records (candidates for deletion).
    pub fn deletable_len(&self) -> usize {
        self.deletable.len()
    }

    /// The `i`-th TID-keyed record path.
    pub fn deletable(&self, i: usize) -> &str {
        &self.deletable[i]
    }

    fn add_deletable(&mut self, path: String) {
        self.deletable_at.insert(path.clone(), self.deletable.len());
        self.deletable.push(path);
    }

    fn remove_deletable(&mut self, path: &str) {
        if let Some(i) = self.deletable_at.remove(path) {
            self.deletable.swap_remove(i);
            if let Some(moved) = self.deletable.get(i) {
                self.deletable_at.insert(moved.clone(), i);
            }
        }
    }

    /// Applies `changes` to the tree and works out the frame's blocks. Follow with
    /// [`RepoState::keep`] or [`RepoState::abort`] before the next call.
    pub fn prepare(&mut self, changes: Vec<Change>) -> Result<Prepared, GenError> {
        let prev_data = self.root;
        let mut ops = Vec::with_capacity(changes.len());
        let mut records = Vec::new();
        for ch in changes {
            let key = ch.path.as_bytes();
            let (cid, prev) = match (ch.action, ch.record) {
                (Action::Delete, _) => (None, self.tree.delete(&NoBlocks, key)?),
                (_, Some((cid, bytes))) => {
                    let prev = self.tree.insert(&NoBlocks, key, cid)?;
                    records.push((cid, bytes));
                    (Some(cid), prev)
                }
                (_, None) => {
                    return Err(GenError::Internal(
                        "create or update without a record".into(),
                    ))
                }
            };
            let expected_prev = ch.action != Action::Create;
            if prev.is_some() != expected_prev {
                return Err(GenError::Internal(format!(
                    "{} of {}: the tree disagrees about the previous value",
                    ch.action.as_str(),
                    ch.path
                )));
            }
            ops.push(Op {
                action: ch.action,
                path: ch.path,
                cid,
                prev,
            });
        }
        let data = self.tree.root_cid()?;
        let proof_ops: Vec<ProofOp<'_>> = ops
            .iter()
            .map(|o| ProofOp {
                action: o.action,
                path: &o.path,
                cid: o.cid,
                prev: o.prev,
            })
            .collect();
        let single = match proof_ops.as_slice() {
            [op] => self.tree.single_op_proof(op),
            _ => None,
        };
        let proof = match single {
            Some(p) => p,
            None => self.proof_by_inversion(data, &proof_ops)?,
        };
        Ok(Prepared {
            data,
            prev_data,
            ops,
            proof,
            records,
        })
    }

    /// The proof of a multi-op commit: the nodes the verifier's own inversion ([`proof_nodes`])
    /// loads over the new tree's blocks, in several orders. Sync 1.1 does not fix the order in
    /// which a consumer undoes the ops: riptide's verifier goes last-to-first, indigo's
    /// `VerifyCommitMessage` deletes first and then by path, and `@atproto/repo` builds the CAR
    /// from each changed key's covering proof in the new tree and tests every permutation. A
    /// proof for one order only can lack the other nodes of a split that another order must
    /// merge back (seen with indigo on list + list-item commits: "can not merge child nodes").
    /// So this takes the union of the nodes needed last-to-first (first, in load order, as
    /// before), first-to-last, in indigo's order, and by each op alone on the new tree.
    fn proof_by_inversion(
        &self,
        data: CidBuf,
        ops: &[ProofOp<'_>],
    ) -> Result<Vec<(CidBuf, Vec<u8>)>, GenError> {
        let mut near = Vec::new();
        for op in ops {
            self.tree.path_blocks(op.path.as_bytes(), &mut near);
        }
        let mut blocks: HashMap<CidBuf, Vec<u8>> = near.into_iter().collect();
        // `proof_nodes` inverts last-to-first, so each order is given reversed.
        let forward: Vec<ProofOp<'_>> = ops.iter().rev().copied().collect();
        let mut indigo: Vec<ProofOp<'_>> = ops.to_vec();
        indigo.sort_by(|a, b| {
            let del = |o: &ProofOp<'_>| o.action != Action::Delete;
            (del(a), a.path).cmp(&(del(b), b.path))
        });
        indigo.reverse();
        let mut orders: Vec<Vec<ProofOp<'_>>> = vec![ops.to_vec(), forward, indigo];
        orders.extend(ops.iter().map(|op| vec![*op]));
        let mut seen = HashSet::new();
        let mut proof = Vec::new();
        for order in &orders {
            for cid in self.nodes_needed(data, &mut blocks, order)? {
                if seen.insert(cid) {
                    proof.push(cid);
                }
            }
        }
        proof
            .into_iter()
            .map(|cid| {
                let bytes = blocks.get(&cid).cloned().ok_or_else(|| {
                    GenError::Internal(format!("proof node {cid} not in the tree"))
                })?;
                Ok((cid, bytes))
            })
            .collect()
    }

    /// [`proof_nodes`] for `ops` (inverted last-to-first), adding to `blocks` every node of the
    /// new tree it asks for.
    fn nodes_needed(
        &self,
        data: CidBuf,
        blocks: &mut HashMap<CidBuf, Vec<u8>>,
        ops: &[ProofOp<'_>],
    ) -> Result<Vec<CidBuf>, GenError> {
        loop {
            match proof_nodes(data, &*blocks, ops) {
                Ok(needed) => return Ok(needed),
                Err(ProofError::MissingBlock(cid)) => {
                    let bytes = self.tree.node_block(cid.as_cid()).ok_or_else(|| {
                        GenError::Internal(format!("proof node {cid} not in the tree"))
                    })?;
                    blocks.insert(cid, bytes);
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Keeps a prepared commit at revision `rev`.
    pub fn keep(&mut self, p: &mut Prepared, rev: String) -> Result<(), GenError> {
        for op in &p.ops {
            match op.cid {
                Some(cid) => {
                    if self.leaves.insert(op.path.clone(), cid).is_none() && rkey_is_tid(&op.path) {
                        self.add_deletable(op.path.clone());
                    }
                }
                None => {
                    self.leaves.remove(&op.path);
                    self.remove_deletable(&op.path);
                }
            }
        }
        if let Some(kept) = self.records.as_mut() {
            for (cid, bytes) in p.records.drain(..) {
                kept.insert(cid, bytes);
            }
        }
        self.root = p.data;
        self.rev = rev;
        Ok(())
    }

    /// Undoes a prepared commit on the tree (the state is as before [`RepoState::prepare`]).
    pub fn abort(&mut self, p: Prepared) -> Result<(), GenError> {
        for op in p.ops.iter().rev() {
            let key = op.path.as_bytes();
            match (op.action, op.prev) {
                (Action::Create, _) => {
                    self.tree.delete(&NoBlocks, key)?;
                }
                (_, Some(prev)) => {
                    self.tree.insert(&NoBlocks, key, prev)?;
                }
                (_, None) => return Err(GenError::Internal("op without prev".into())),
            }
        }
        let root = self.tree.root_cid()?;
        if root != self.root {
            return Err(GenError::Internal(format!(
                "aborting a commit gave root {root}, not {}",
                self.root
            )));
        }
        Ok(())
    }

    /// Every block of the repository but the commit: MST nodes (root first) and records, for a
    /// full export. Fails unless record bytes were kept.
    pub fn export_blocks(&self) -> Result<Vec<(CidBuf, Vec<u8>)>, GenError> {
        let kept = self
            .records
            .as_ref()
            .ok_or_else(|| GenError::Internal("record bytes were not kept".into()))?;
        let leaves: Vec<(&str, CidBuf)> =
            self.leaves.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        let (root, mut blocks) =
            mst::build(&leaves).map_err(|e| GenError::Internal(e.to_string()))?;
        if root != self.root {
            return Err(GenError::Internal("export root differs".into()));
        }
        blocks.reverse(); // root first
        let mut seen = std::collections::HashSet::new();
        for cid in self.leaves.values() {
            if seen.insert(*cid) {
                let bytes = kept
                    .get(cid)
                    .ok_or_else(|| GenError::Internal(format!("record {cid} not kept")))?;
                blocks.push((*cid, bytes.clone()));
            }
        }
        Ok(blocks)
    }
}
