//! A [`Tree`] held wholly in memory: built bottom-up from sorted leaves, and asked for the
//! blocks of a commit proof without re-reading its own nodes from bytes.
//!
//! Why: a writer (the test-data generator) keeps each repository as a live tree and, for every
//! commit, must know which nodes of the *new* tree a verifier loads to invert the ops
//! ([`crate::mst::invert::proof_nodes`]). Running that inversion means encoding, storing and
//! re-decoding the new tree's nodes; on a tree whose nodes are all in memory with their CIDs
//! the answer follows from the tree's shape, for one op at a time:
//!
//! - every op: the nodes `get` passes on the way to the key (the root first);
//! - a create (inverted by a delete): the facing spines of the subtrees on both sides of the
//!   key, as far as both sides exist, and the nodes that become the root when an entry-less
//!   root is pruned;
//! - a delete (inverted by an insert of the absent key): the rest of the key's path down to the
//!   first empty gap (the split).
//!
//! That simulation is checked against `proof_nodes` on random trees and ops (tests). For
//! several ops in one commit, callers run `proof_nodes` itself over [`Tree::path_blocks`] (and
//! [`Tree::node_block`] for anything else it asks for).
//!
//! What it does not do: load anything. A stub or an unhashed node on the way makes the answer
//! `None` (ask `proof_nodes` instead).

use riptide_cbor::{Cid, CidBuf};

use super::{Entry, Link, Node, Tree};
use crate::error::BuildError;
use crate::mst::height::{is_valid_key, key_height};
use crate::mst::invert::{Action, ProofOp};
use crate::mst::node::{write_entry, write_node_head, write_node_tail};

/// A child's CID, if it is known without hashing.
fn link_cid(link: &Option<Link>) -> Result<Option<CidBuf>, ()> {
    match link {
        None => Ok(None),
        Some(Link::Stub(c)) => Ok(Some(*c)),
        Some(Link::Node(n)) => n.cid.map(Some).ok_or(()),
    }
}

/// The canonical encoding of a hashed node (every child's CID known).
fn encode(node: &Node) -> Option<Vec<u8>> {
    let left = link_cid(&node.left).ok()?;
    let mut out = Vec::with_capacity(48 + node.entries.len() * 80);
    write_node_head(&mut out, node.entries.len());
    let mut prev: &[u8] = &[];
    for e in &node.entries {
        let right = link_cid(&e.right).ok()?;
        write_entry(
            &mut out,
            prev,
            &e.key,
            e.value.as_cid(),
            right.as_ref().map(|c| c.as_cid()),
        );
        prev = &e.key;
    }
    write_node_tail(&mut out, left.as_ref().map(|c| c.as_cid()));
    Some(out)
}

/// The loaded node behind a link (`None` for a stub).
fn node(link: &Option<Link>) -> Option<Option<&Node>> {
    match link {
        None => Some(None),
        Some(Link::Node(n)) => Some(Some(n)),
        Some(Link::Stub(_)) => None,
    }
}

fn gap(node: &Node, i: usize) -> &Option<Link> {
    if i == 0 {
        &node.left
    } else {
        &node.entries[i - 1].right
    }
}

/// Blocks in first-load order, each once.
#[derive(Default)]
struct Loads(Vec<(CidBuf, Vec<u8>)>);

impl Loads {
    fn load(&mut self, node: &Node) -> Option<()> {
        let cid = node.cid?;
        if !self.0.iter().any(|(c, _)| *c == cid) {
            self.0.push((cid, encode(node)?));
        }
        Some(())
    }
}

/// Builds the subtree on `layer` of `leaves` (key, value, height; all heights ≤ `layer`).
fn build(leaves: &[(&[u8], CidBuf, u32)], layer: u32) -> Option<Link> {
    if leaves.is_empty() {
        return None;
    }
    let below = |part: &[(&[u8], CidBuf, u32)]| match layer {
        0 => None,
        l => build(part, l - 1),
    };
    let mut start = 0;
    let mut left = None;
    let mut entries = Vec::new();
    for (j, &(key, value, h)) in leaves.iter().enumerate() {
        if h == layer {
            let gap = below(&leaves[start..j]);
            match entries.last_mut() {
                None => left = gap,
                Some(Entry { right, .. }) => *right = gap,
            }
            entries.push(Entry {
                key: key.into(),
                value,
                right: None,
            });
            start = j + 1;
        }
    }
    let gap = below(&leaves[start..]);
    match entries.last_mut() {
        None => left = gap,
        Some(Entry { right, .. }) => *right = gap,
    }
    Some(Link::Node(Box::new(Node {
        layer,
        left,
        entries,
        cid: None,
    })))
}

impl Tree {
    /// The tree of `leaves` (strictly ascending keys), built bottom-up wholly in memory; its
    /// CIDs are computed by the first [`Tree::root_cid`]. The same tree as inserting the leaves
    /// one by one, and the same root as [`crate::mst::build()`].
    pub fn from_sorted<K: AsRef<[u8]>>(leaves: &[(K, CidBuf)]) -> Result<Tree, BuildError> {
        let mut with_heights = Vec::with_capacity(leaves.len());
        let mut top = 0;
        for (index, (k, v)) in leaves.iter().enumerate() {
            let key = k.as_ref();
            if !is_valid_key(key) {
                return Err(BuildError::InvalidKey { index });
            }
            if index > 0 && leaves[index - 1].0.as_ref() >= key {
                return Err(BuildError::Unsorted { index });
            }
            let h = key_height(key);
            top = top.max(h);
            with_heights.push((key, *v, h));
        }
        Ok(Tree {
            root: build(&with_heights, top),
            ..Tree::default()
        })
    }

    /// The blocks [`crate::mst::invert::proof_nodes`] names for the single op `op` on this tree
    /// (the tree after the op, hashed by [`Tree::root_cid`]), in the same order, with their
    /// bytes. `None` if the tree is not in memory and hashed along the way, or does not hold
    /// what the op says.
    pub fn single_op_proof(&self, op: &ProofOp<'_>) -> Option<Vec<(CidBuf, Vec<u8>)>> {
        let mut loads = Loads::default();
        let Some(root) = node(&self.root)? else {
            // The empty tree: nothing to load (only a delete can leave it).
            return (op.action == Action::Delete).then(Vec::new);
        };
        let key = op.path.as_bytes();
        let h = key_height(key);
        loads.load(root)?;
        // `get`: down the key's path while the key lies below the node's layer.
        let mut at = root;
        let mut found = None;
        while h <= at.layer {
            let i = at.entries.partition_point(|e| &*e.key < key);
            if h == at.layer {
                found = at
                    .entries
                    .get(i)
                    .filter(|e| &*e.key == key)
                    .map(|e| (i, e.value));
                break;
            }
            match node(gap(at, i))? {
                None => break,
                Some(child) => {
                    loads.load(child)?;
                    at = child;
                }
            }
        }
        if found.map(|f| f.1) != op.after() {
            return None;
        }
        match op.action {
            Action::Update => {}
            Action::Delete => {
                // Inserting the absent key splits the rest of its path, down to an empty gap.
                loop {
                    let i = at.entries.partition_point(|e| &*e.key < key);
                    match node(gap(at, i))? {
                        None => break,
                        Some(child) => {
                            loads.load(child)?;
                            at = child;
                        }
                    }
                }
            }
            Action::Create => {
                let (i, _) = found?;
                // Deleting the entry merges the subtrees before and after it: both facing
                // spines, while both sides exist.
                let mut a = node(gap(at, i))?;
                let mut b = node(&at.entries[i].right)?;
                while let (Some(x), Some(y)) = (a, b) {
                    loads.load(x)?;
                    loads.load(y)?;
                    a = node(gap(x, x.entries.len()))?;
                    b = node(&y.left)?;
                }
                // Pruning: a root left without entries is replaced by its child, which is
                // loaded (unless on layer 0) to see whether it needs pruning too. The child
                // is the merge of both sides (in memory already) or the one side that exists.
                if std::ptr::eq(at, root) && root.entries.len() == 1 {
                    let mut pair = (node(&root.left)?, node(&root.entries[0].right)?);
                    let mut layer = root.layer;
                    while layer > 1 {
                        match pair {
                            (None, None) => break,
                            (Some(x), Some(y)) => {
                                if !x.entries.is_empty() || !y.entries.is_empty() {
                                    break;
                                }
                                pair = (node(&x.left)?, node(&y.left)?);
                            }
                            (Some(c), None) | (None, Some(c)) => {
                                loads.load(c)?;
                                if !c.entries.is_empty() {
                                    break;
                                }
                                pair = (node(&c.left)?, None);
                            }
                        }
                        layer -= 1;
                    }
                }
            }
        }
        Some(loads.0)
    }

    /// The blocks of every node on `key`'s path, down to the first empty gap, and of their
    /// children (each once, appended to `out`): what inverting ops on `key` usually loads.
    /// Stops at stubs and unhashed nodes.
    pub fn path_blocks(&self, key: &[u8], out: &mut Vec<(CidBuf, Vec<u8>)>) {
        let mut loads = Loads(std::mem::take(out));
        let mut at = node(&self.root).flatten();
        while let Some(n) = at {
            if loads.load(n).is_none() {
                break;
            }
            let kids = std::iter::once(&n.left).chain(n.entries.iter().map(|e| &e.right));
            for k in kids {
                if let Some(Some(c)) = node(k) {
                    let _ = loads.load(c);
                }
            }
            let i = n.entries.partition_point(|e| &*e.key < key);
            at = node(gap(n, i)).flatten();
        }
        *out = loads.0;
    }

    /// The block of the in-memory node `cid` (a walk of the loaded tree).
    pub fn node_block(&self, cid: Cid<'_>) -> Option<Vec<u8>> {
        let mut stack: Vec<&Node> = node(&self.root).flatten().into_iter().collect();
        while let Some(n) = stack.pop() {
            if n.cid.is_some_and(|c| c.as_cid() == cid) {
                return encode(n);
            }
            let kids = std::iter::once(&n.left).chain(n.entries.iter().map(|e| &e.right));
            stack.extend(kids.filter_map(|k| node(k).flatten()));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mst::invert::proof_nodes;
    use crate::source::NoBlocks;
    use riptide_cbor::DAG_CBOR;
    use std::collections::HashMap;

    fn val(i: u64) -> CidBuf {
        CidBuf::sha256(DAG_CBOR, &i.to_be_bytes())
    }

    /// A small deterministic generator (xorshift), enough for shapes.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
    }

    fn key(i: u64) -> String {
        format!("app.bsky.feed.like/{:013}", i)
    }

    #[test]
    fn from_sorted_matches_build_and_insertion() {
        for n in [0usize, 1, 2, 3, 10, 100, 1000] {
            let leaves: Vec<(String, CidBuf)> =
                (0..n as u64).map(|i| (key(i * 37), val(i))).collect();
            let (root, _) = crate::mst::build(&leaves).unwrap();
            let mut tree = Tree::from_sorted(&leaves).unwrap();
            assert_eq!(tree.root_cid().unwrap(), root, "{n} leaves");
            let mut inserted = Tree::new();
            for (k, v) in leaves.iter().rev() {
                inserted.insert(&NoBlocks, k.as_bytes(), *v).unwrap();
            }
            assert_eq!(inserted.root_cid().unwrap(), root);
        }
        let bad = [("b.c/x".to_owned(), val(1)), ("a.c/x".to_owned(), val(2))];
        assert!(matches!(
            Tree::from_sorted(&bad),
            Err(BuildError::Unsorted { index: 1 })
        ));
        assert!(matches!(
            Tree::from_sorted(&[("nokey", val(1))]),
            Err(BuildError::InvalidKey { index: 0 })
        ));
    }

    /// The oracle: `proof_nodes` over every block of the new tree.
    fn oracle(tree: &Tree, op: &ProofOp<'_>) -> Vec<(CidBuf, Vec<u8>)> {
        let mut sink = Vec::new();
        let mut clone = Tree {
            root: tree.root.clone(),
            ..Tree::default()
        };
        // Re-hash everything to collect all blocks.
        fn unhash(l: &mut Option<Link>) {
            if let Some(Link::Node(n)) = l {
                n.cid = None;
                unhash(&mut n.left);
                for e in &mut n.entries {
                    unhash(&mut e.right);
                }
            }
        }
        unhash(&mut clone.root);
        let root = clone.root_cid_with_blocks(&mut sink).unwrap();
        let store: HashMap<CidBuf, Vec<u8>> = sink.into_iter().collect();
        proof_nodes(root, &store, std::slice::from_ref(op))
            .unwrap()
            .into_iter()
            .map(|c| (c, store[&c].clone()))
            .collect()
    }

    #[test]
    fn single_op_proof_matches_proof_nodes() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let mut checked = 0;
        for round in 0..60 {
            let n = [1u64, 2, 3, 5, 8, 30, 200, 600][round % 8];
            let mut keys: Vec<u64> = (0..n).map(|_| rng.next() % 100_000).collect();
            keys.sort_unstable();
            keys.dedup();
            let leaves: Vec<(String, CidBuf)> = keys.iter().map(|&k| (key(k), val(k))).collect();
            for _ in 0..20 {
                let mut tree = Tree::from_sorted(&leaves).unwrap();
                tree.root_cid().unwrap();
                let pick = keys[(rng.next() % keys.len() as u64) as usize];
                let fresh = loop {
                    let k = rng.next() % 100_000;
                    if keys.binary_search(&k).is_err() {
                        break k;
                    }
                };
                let (path, action) = match rng.next() % 3 {
                    0 => (key(fresh), Action::Create),
                    1 => (key(pick), Action::Update),
                    _ => (key(pick), Action::Delete),
                };
                let k = path.as_bytes();
                let prev = match action {
                    Action::Create => tree.insert(&NoBlocks, k, val(1 << 40)).unwrap(),
                    Action::Update => tree.insert(&NoBlocks, k, val(1 << 41)).unwrap(),
                    Action::Delete => tree.delete(&NoBlocks, k).unwrap(),
                };
                let cid = match action {
                    Action::Create => Some(val(1 << 40)),
                    Action::Update => Some(val(1 << 41)),
                    Action::Delete => None,
                };
                tree.root_cid().unwrap();
                let op = ProofOp {
                    action,
                    path: &path,
                    cid,
                    prev,
                };
                let got = tree.single_op_proof(&op).expect("in memory");
                assert_eq!(got, oracle(&tree, &op), "{n} leaves, {action:?} {path}");
                checked += 1;
            }
        }
        assert_eq!(checked, 1200);
    }

    #[test]
    fn disagreeing_op_and_blocks_lookup() {
        let leaves: Vec<(String, CidBuf)> = (0..50).map(|i| (key(i), val(i))).collect();
        let mut tree = Tree::from_sorted(&leaves).unwrap();
        let root = tree.root_cid().unwrap();
        let path = key(3);
        let wrong = ProofOp {
            action: Action::Create,
            path: &path,
            cid: Some(val(99)),
            prev: None,
        };
        assert_eq!(tree.single_op_proof(&wrong), None);
        let mut blocks = Vec::new();
        tree.path_blocks(path.as_bytes(), &mut blocks);
        assert_eq!(blocks[0].0, root);
        assert_eq!(tree.node_block(root.as_cid()), Some(blocks[0].1.clone()));
        for (c, b) in &blocks {
            assert_eq!(CidBuf::sha256(DAG_CBOR, b), *c);
        }
        assert_eq!(tree.node_block(val(7).as_cid()), None);
        // A lazily loaded tree (stubs) cannot answer.
        let lazy = Tree::load(root);
        let ok = ProofOp {
            action: Action::Update,
            path: &path,
            cid: Some(val(3)),
            prev: Some(val(3)),
        };
        assert_eq!(lazy.single_op_proof(&ok), None);
    }
}
