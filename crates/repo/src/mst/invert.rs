//! Firehose operations and their inversion on a (partial) MST.
//!
//! Why: Sync 1.1 makes a `#commit` self-proving. Its CAR holds the MST nodes of the *new* tree
//! around every changed key; undoing each operation on that partial tree must give the previous
//! root (`prevData`). This module holds the operation type and the two checks on a tree:
//! [`check_forward`] (the new tree holds what each op says) and [`invert`] (undo them all).
//!
//! Inversion order: operations touch distinct keys (checked), so the final tree does not depend
//! on order, but which nodes must be loaded can. [`invert`] undoes ops last-to-first, the natural
//! undo order of a commit written first-to-last, and is what every proof seen so far needs. When
//! that order hits a missing node, [`invert_any_order`] searches for an order that does not:
//! ops that need an absent node are rolled back and retried after the others. Any order that
//! completes gives the same (correct) tree, so this is sound; it is bounded to a few passes so a
//! hostile frame cannot make it quadratic. Example: a real bridgy-fed commit creating 42 keys
//! inverts last-to-first, but first-to-last (indigo's order) needs a node it lacks.
//!
//! What it does not do: decode frames or commits, or compare against `prevData` (see
//! [`crate::verify`]).

use std::collections::HashSet;

use riptide_cbor::CidBuf;

use crate::error::ProofError;
use crate::mst::height::is_valid_key;
use crate::mst::tree::Tree;
use crate::source::BlockSource;

/// What an operation did to a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// The key did not exist and now maps to `cid`.
    Create,
    /// The key mapped to `prev` and now maps to `cid`.
    Update,
    /// The key mapped to `prev` and no longer exists.
    Delete,
}

impl Action {
    /// The firehose spelling: `create`, `update` or `delete`.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Create => "create",
            Action::Update => "update",
            Action::Delete => "delete",
        }
    }

    /// Parses the firehose spelling: `create`, `update`, `delete`.
    pub fn parse(s: &str) -> Option<Action> {
        match s {
            "create" => Some(Action::Create),
            "update" => Some(Action::Update),
            "delete" => Some(Action::Delete),
            _ => None,
        }
    }
}

/// One repository operation of a `#commit` frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProofOp<'p> {
    /// Create, update or delete.
    pub action: Action,
    /// The MST key: `collection/rkey`.
    pub path: &'p str,
    /// The new record CID (create and update), `None` for delete.
    pub cid: Option<CidBuf>,
    /// The previous record CID (update and delete; Sync 1.1), `None` for create.
    pub prev: Option<CidBuf>,
}

impl ProofOp<'_> {
    /// What the new tree holds under `path` after this op.
    pub fn after(&self) -> Option<CidBuf> {
        match self.action {
            Action::Delete => None,
            _ => self.cid,
        }
    }
}

fn invalid(op: &ProofOp<'_>, reason: &'static str) -> ProofError {
    ProofError::InvalidOp {
        path: op.path.to_owned(),
        reason,
    }
}

/// Checks that every op is well-formed for inversion: a valid path, the CIDs its action needs
/// (and no others), and no path twice.
pub fn check_ops(ops: &[ProofOp<'_>]) -> Result<(), ProofError> {
    for op in ops {
        if !is_valid_key(op.path.as_bytes()) {
            return Err(invalid(op, "path is not a valid repository path"));
        }
        match op.action {
            Action::Create => {
                if op.cid.is_none() {
                    return Err(invalid(op, "create without cid"));
                }
                if op.prev.is_some() {
                    return Err(invalid(op, "create with prev"));
                }
            }
            Action::Update => {
                if op.cid.is_none() {
                    return Err(invalid(op, "update without cid"));
                }
                if op.prev.is_none() {
                    return Err(invalid(
                        op,
                        "update without prev (pre-Sync 1.1 op; cannot be inverted)",
                    ));
                }
            }
            Action::Delete => {
                if op.cid.is_some() {
                    return Err(invalid(op, "delete with cid"));
                }
                if op.prev.is_none() {
                    return Err(invalid(
                        op,
                        "delete without prev (pre-Sync 1.1 op; cannot be inverted)",
                    ));
                }
            }
        }
    }
    if ops.len() > 1 {
        let mut seen = HashSet::with_capacity(ops.len());
        for op in ops {
            if !seen.insert(op.path) {
                return Err(invalid(op, "path appears in more than one op"));
            }
        }
    }
    Ok(())
}

/// Checks that `tree` (the new tree) holds what every op says: the new CID for creates and
/// updates, nothing for deletes.
pub fn check_forward<S: BlockSource + ?Sized>(
    tree: &mut Tree,
    src: &S,
    ops: &[ProofOp<'_>],
) -> Result<(), ProofError> {
    for op in ops {
        let found = tree.get(src, op.path.as_bytes())?;
        if found != op.after() {
            return Err(ProofError::op_mismatch(op.path, op.after(), found));
        }
    }
    Ok(())
}

/// Undoes one op on `tree`.
pub fn invert_one<S: BlockSource + ?Sized>(
    tree: &mut Tree,
    src: &S,
    op: &ProofOp<'_>,
) -> Result<(), ProofError> {
    let key = op.path.as_bytes();
    let mismatch = |found| ProofError::op_mismatch(op.path, op.after(), found);
    match (op.action, op.prev) {
        (Action::Create, _) => {
            let found = tree.delete(src, key)?;
            if found != op.cid {
                return Err(mismatch(found));
            }
        }
        (Action::Update, Some(prev)) => {
            let found = tree.insert(src, key, prev)?;
            if found != op.cid {
                return Err(mismatch(found));
            }
        }
        (Action::Delete, Some(prev)) => {
            let found = tree.insert(src, key, prev)?;
            if found.is_some() {
                return Err(mismatch(found));
            }
        }
        (_, None) => return Err(invalid(op, "op without prev cannot be inverted")),
    }
    Ok(())
}

/// Undoes every op on `tree` (the new tree), last op first. Ops must have passed [`check_ops`].
/// Afterwards the tree is the previous tree and its root should be `prevData`.
pub fn invert<S: BlockSource + ?Sized>(
    tree: &mut Tree,
    src: &S,
    ops: &[ProofOp<'_>],
) -> Result<(), ProofError> {
    for op in ops.iter().rev() {
        invert_one(tree, src, op)?;
    }
    Ok(())
}

/// The MST nodes of the new tree (rooted at `new_root`, all of whose blocks `src` holds) that a
/// verifier inverting `ops` last-to-first needs: what a commit's CAR must carry besides the
/// commit and record blocks. In load order, root first.
pub fn proof_nodes<S: BlockSource + ?Sized>(
    new_root: CidBuf,
    src: &S,
    ops: &[ProofOp<'_>],
) -> Result<Vec<CidBuf>, ProofError> {
    check_ops(ops)?;
    let mut tree = Tree::load(new_root);
    check_forward(&mut tree, src, ops)?;
    invert(&mut tree, src, ops)?;
    let mut seen = HashSet::new();
    Ok(tree
        .loaded()
        .iter()
        .copied()
        .filter(|c| seen.insert(*c))
        .collect())
}

/// Most passes [`invert_any_order`] makes over the ops still pending.
pub const MAX_ORDER_PASSES: usize = 4;

/// Undoes every op on the tree rooted at `root`, in whatever order the available blocks allow:
/// last-to-first, except that an op needing an absent node is rolled back and retried after
/// the others (at most [`MAX_ORDER_PASSES`] passes). Fails with the missing block of the first
/// op still stuck. Returns the inverted tree.
pub fn invert_any_order<S: BlockSource + ?Sized>(
    root: CidBuf,
    src: &S,
    ops: &[ProofOp<'_>],
) -> Result<Tree, ProofError> {
    let mut tree = Tree::load(root);
    let mut pending: Vec<usize> = (0..ops.len()).rev().collect();
    let mut last_missing = None;
    for _ in 0..MAX_ORDER_PASSES {
        let mut stuck = Vec::new();
        let mut first_missing = None;
        for &i in &pending {
            let checkpoint = tree.checkpoint();
            match invert_one(&mut tree, src, &ops[i]) {
                Ok(()) => {}
                Err(ProofError::MissingBlock(cid)) => {
                    tree.rollback(checkpoint);
                    stuck.push(i);
                    first_missing.get_or_insert(cid);
                }
                Err(e) => return Err(e),
            }
        }
        match first_missing {
            None => return Ok(tree),
            Some(cid) if stuck.len() == pending.len() => return Err(ProofError::MissingBlock(cid)),
            Some(cid) => {
                pending = stuck;
                last_missing = Some(cid);
            }
        }
    }
    // Still progressing but out of passes: report what the first op still pending needs.
    Err(ProofError::MissingBlock(last_missing.unwrap_or(root)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use riptide_cbor::DAG_CBOR;

    fn c(i: u8) -> CidBuf {
        CidBuf::sha256(DAG_CBOR, &[i])
    }

    #[test]
    fn op_shapes() {
        let ok = [
            ProofOp {
                action: Action::Create,
                path: "a.b/1",
                cid: Some(c(1)),
                prev: None,
            },
            ProofOp {
                action: Action::Update,
                path: "a.b/2",
                cid: Some(c(1)),
                prev: Some(c(2)),
            },
            ProofOp {
                action: Action::Delete,
                path: "a.b/3",
                cid: None,
                prev: Some(c(2)),
            },
        ];
        check_ops(&ok).unwrap();
        let bad =
            |op: ProofOp<'static>| matches!(check_ops(&[op]), Err(ProofError::InvalidOp { .. }));
        assert!(bad(ProofOp {
            action: Action::Create,
            path: "a.b/1",
            cid: None,
            prev: None
        }));
        assert!(bad(ProofOp {
            action: Action::Create,
            path: "a.b/1",
            cid: Some(c(1)),
            prev: Some(c(1))
        }));
        assert!(bad(ProofOp {
            action: Action::Update,
            path: "a.b/1",
            cid: Some(c(1)),
            prev: None
        }));
        assert!(bad(ProofOp {
            action: Action::Delete,
            path: "a.b/1",
            cid: None,
            prev: None
        }));
        assert!(bad(ProofOp {
            action: Action::Delete,
            path: "a.b/1",
            cid: Some(c(1)),
            prev: Some(c(1))
        }));
        assert!(bad(ProofOp {
            action: Action::Create,
            path: "nope",
            cid: Some(c(1)),
            prev: None
        }));
        let dup = [ok[0], ok[0]];
        assert!(matches!(check_ops(&dup), Err(ProofError::InvalidOp { .. })));
        assert_eq!(Action::parse("update"), Some(Action::Update));
        assert_eq!(Action::parse("x"), None);
    }
}
