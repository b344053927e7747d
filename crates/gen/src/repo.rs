//! One account's repository as the generator evolves it, and what a Sync 1.1 commit must carry.
//!
//! Why: a generated `#commit` is only valid if its CAR holds exactly what a verifier inverting
//! the ops needs. Rather than reimplementing that, this uses `riptide-repo`'s own MST: the
//! account's [`Tree`] (loaded lazily from a block store) takes the ops, its re-encoded nodes are
//! the new blocks, and [`proof_nodes`] (the verifier's inversion, run on the new tree) names the
//! nodes the frame must include.
//!
//! Memory: the store keeps every node of the current tree plus those of replaced versions until
//! a rebuild from the sorted leaves (`mst::build`) collects them, once the replaced nodes
//! outnumber the live ones; the in-memory tree is reloaded lazily at the same time. Record bytes
//! are kept only when a full export is wanted ([`RepoState::keep_records`]).
//!
//! What it does not do: sign or encode commits (see [`crate::network`]).

use std::collections::{BTreeMap, HashMap};

use riptide_cbor::{Cid, CidBuf};
use riptide_repo::mst::invert::proof_nodes;
use riptide_repo::mst::{self, Tree};
use riptide_repo::{Action, BlockSource, ProofOp};

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
    new_nodes: HashMap<CidBuf, Vec<u8>>,
}

/// Two block maps read as one (the new nodes of a commit over the account's store).
struct Layered<'a> {
    top: &'a HashMap<CidBuf, Vec<u8>>,
    base: &'a HashMap<CidBuf, Vec<u8>>,
}

impl BlockSource for Layered<'_> {
    fn get_block(&self, cid: Cid<'_>) -> Option<&[u8]> {
        self.top.get_block(cid).or_else(|| self.base.get_block(cid))
    }
}

/// An account's repository.
#[derive(Debug)]
pub struct RepoState {
    tree: Tree,
    store: HashMap<CidBuf, Vec<u8>>,
    /// The MST root.
    pub root: CidBuf,
    /// The current revision.
    pub rev: String,
    leaves: BTreeMap<String, CidBuf>,
    /// TID-keyed paths, for drawing a record to delete (index kept in `deletable_at`).
    deletable: Vec<String>,
    deletable_at: HashMap<String, usize>,
    records: Option<HashMap<CidBuf, Vec<u8>>>,
    replaced: usize,
    live: usize,
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
        let mut state = RepoState {
            tree: Tree::new(),
            store: HashMap::new(),
            root: mst::empty_root_cid(),
            rev,
            deletable: Vec::new(),
            deletable_at: HashMap::new(),
            records: kept,
            replaced: 0,
            live: 0,
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
        state.rebuild(true)?;
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

    /// Rebuilds the node store from the leaves (dropping replaced nodes) and reloads the tree
    /// lazily. `fresh`: set the root rather than check it.
    fn rebuild(&mut self, fresh: bool) -> Result<(), GenError> {
        let leaves: Vec<(&str, CidBuf)> =
            self.leaves.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        let (root, blocks) = mst::build(&leaves).map_err(|e| GenError::Internal(e.to_string()))?;
        if !fresh && root != self.root {
            return Err(GenError::Internal(format!(
                "rebuilt MST root {root} differs from the incremental root {}",
                self.root
            )));
        }
        self.root = root;
        self.store = blocks.into_iter().collect();
        self.live = self.store.len();
        self.replaced = 0;
        self.tree = Tree::load(root);
        Ok(())
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
                (Action::Delete, _) => (None, self.tree.delete(&self.store, key)?),
                (_, Some((cid, bytes))) => {
                    let prev = self.tree.insert(&self.store, key, cid)?;
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
        let mut new_blocks = Vec::new();
        let data = self.tree.root_cid_with_blocks(&mut new_blocks)?;
        let new_nodes: HashMap<CidBuf, Vec<u8>> = new_blocks.into_iter().collect();
        let src = Layered {
            top: &new_nodes,
            base: &self.store,
        };
        let proof_ops: Vec<ProofOp<'_>> = ops
            .iter()
            .map(|o| ProofOp {
                action: o.action,
                path: &o.path,
                cid: o.cid,
                prev: o.prev,
            })
            .collect();
        let needed = proof_nodes(data, &src, &proof_ops)?;
        let mut proof = Vec::with_capacity(needed.len());
        for cid in needed {
            let bytes = src
                .get_block(cid.as_cid())
                .ok_or_else(|| GenError::Internal(format!("proof node {cid} not in the store")))?;
            proof.push((cid, bytes.to_vec()));
        }
        Ok(Prepared {
            data,
            prev_data,
            ops,
            proof,
            records,
            new_nodes,
        })
    }

    /// Keeps a prepared commit at revision `rev`.
    pub fn keep(&mut self, p: &mut Prepared, rev: String) -> Result<(), GenError> {
        self.replaced += p.new_nodes.len();
        self.store.extend(p.new_nodes.drain());
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
        if self.replaced > self.live.max(512) {
            self.rebuild(false)?;
        }
        Ok(())
    }

    /// Undoes a prepared commit on the tree (the state is as before [`RepoState::prepare`]).
    pub fn abort(&mut self, p: Prepared) -> Result<(), GenError> {
        for op in p.ops.iter().rev() {
            let key = op.path.as_bytes();
            match (op.action, op.prev) {
                (Action::Create, _) => {
                    self.tree.delete(&self.store, key)?;
                }
                (_, Some(prev)) => {
                    self.tree.insert(&self.store, key, prev)?;
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
