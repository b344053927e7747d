//! Building the canonical MST from sorted leaves.
//!
//! Why: the MST of a key set is unique, so the strongest check of a repository export is to
//! rebuild the tree from its leaves and compare roots; and a generator writing repositories needs
//! the node blocks. Both are this module.
//!
//! How: with every key's height known, the node over a key range on layer L holds the keys of
//! height L, and each gap between them is the node over that sub-range on layer L-1 (null when
//! the gap is empty). One recursion per layer (at most 129 deep), children before parents, one
//! shared encoding buffer and one shared scratch stack: no allocation per node unless blocks are
//! requested.
//!
//! What it does not do: incremental updates (see [`crate::mst::Tree`]).

use riptide_cbor::{Cid, CidBuf, DAG_CBOR};
use sha2::{Digest, Sha256};

use crate::error::BuildError;
use crate::mst::height::{is_valid_key, key_height};
use crate::mst::node::{empty_root_cid, write_entry, write_node_head, write_node_tail, EMPTY_NODE};

/// Leaves in ascending key order: what [`Builder`] consumes.
pub trait Leaves {
    /// Number of leaves.
    fn count(&self) -> usize;
    /// Key of leaf `i`.
    fn key(&self, i: usize) -> &[u8];
    /// Record CID of leaf `i`.
    fn value(&self, i: usize) -> Cid<'_>;
}

impl<K: AsRef<[u8]>> Leaves for [(K, CidBuf)] {
    fn count(&self) -> usize {
        self.len()
    }
    fn key(&self, i: usize) -> &[u8] {
        self[i].0.as_ref()
    }
    fn value(&self, i: usize) -> Cid<'_> {
        self[i].1.as_cid()
    }
}

/// A vector of leaves is its slice (so `build(&vec)` works without `[..]`).
impl<K: AsRef<[u8]>> Leaves for Vec<(K, CidBuf)> {
    #[inline]
    fn count(&self) -> usize {
        Leaves::count(self.as_slice())
    }
    #[inline]
    fn key(&self, i: usize) -> &[u8] {
        self.as_slice().key(i)
    }
    #[inline]
    fn value(&self, i: usize) -> Cid<'_> {
        self.as_slice().value(i)
    }
}

/// Node blocks as `(CID, bytes)`, as [`build`] returns them.
pub type Blocks = Vec<(CidBuf, Vec<u8>)>;

/// Receives each node block as it is built (children before parents, root last).
pub trait BlockSink {
    /// One node: its CID and encoding.
    fn block(&mut self, cid: CidBuf, bytes: &[u8]);
}

/// Discards blocks: compute the root only.
#[derive(Debug, Default, Clone, Copy)]
pub struct RootOnly;

impl BlockSink for RootOnly {
    #[inline]
    fn block(&mut self, _cid: CidBuf, _bytes: &[u8]) {}
}

impl BlockSink for Vec<(CidBuf, Vec<u8>)> {
    fn block(&mut self, cid: CidBuf, bytes: &[u8]) {
        self.push((cid, bytes.to_vec()));
    }
}

/// How the builder turns a node's encoding into its CID.
pub(crate) trait NodeCids {
    /// The CID of `bytes`, the `n`-th node built (children before parents, left to right).
    fn cid(&mut self, bytes: &[u8]) -> CidBuf;
}

/// Hashes every node: the general case.
struct Hashing;

impl NodeCids for Hashing {
    #[inline]
    fn cid(&mut self, bytes: &[u8]) -> CidBuf {
        CidBuf::from_sha256_digest(DAG_CBOR, &Sha256::digest(bytes))
    }
}

/// Reusable state for building MSTs (an encoding buffer and scratch stacks).
#[derive(Debug, Default)]
pub struct Builder {
    out: Vec<u8>,
    heights: Vec<u8>,
    /// Per node under construction: entry indices, then child CIDs (gap 0 = left).
    entries: Vec<u32>,
    kids: Vec<Option<CidBuf>>,
    nodes: usize,
}

impl Builder {
    /// A builder with empty buffers.
    pub fn new() -> Builder {
        Builder::default()
    }

    /// Number of nodes produced by the last build (0 for an empty tree, which has one block).
    pub fn nodes(&self) -> usize {
        self.nodes
    }

    /// Builds the MST of `leaves` (strictly ascending, valid keys) and returns its root CID,
    /// handing every node block to `sink`.
    pub fn build<L: Leaves + ?Sized, S: BlockSink>(
        &mut self,
        leaves: &L,
        sink: &mut S,
    ) -> Result<CidBuf, BuildError> {
        let n = leaves.count();
        let mut heights = std::mem::take(&mut self.heights);
        heights.clear();
        heights.reserve(n);
        for i in 0..n {
            let key = leaves.key(i);
            if !is_valid_key(key) {
                self.heights = heights;
                return Err(BuildError::InvalidKey { index: i });
            }
            if i > 0 && leaves.key(i - 1) >= key {
                self.heights = heights;
                return Err(BuildError::Unsorted { index: i });
            }
            heights.push(key_height(key) as u8);
        }
        let root = self.build_with_cids(leaves, &heights, sink, &mut Hashing);
        self.heights = heights;
        Ok(root)
    }

    /// Like [`Builder::build`] with heights already known (`heights[i]` = height of key `i`) and
    /// order and key syntax already checked, e.g. by a walk of the same tree; node CIDs come from
    /// `cids`.
    pub(crate) fn build_with_cids<L: Leaves + ?Sized, S: BlockSink, C: NodeCids>(
        &mut self,
        leaves: &L,
        heights: &[u8],
        sink: &mut S,
        cids: &mut C,
    ) -> CidBuf {
        self.nodes = 0;
        self.entries.clear();
        self.kids.clear();
        let n = leaves.count().min(heights.len());
        if n == 0 {
            let cid = empty_root_cid();
            sink.block(cid, &EMPTY_NODE);
            return cid;
        }
        let top = heights[..n].iter().copied().max().unwrap_or(0);
        self.node(leaves, heights, 0, n, u32::from(top), sink, cids)
    }

    /// The node over leaves `lo..hi` (non-empty) on `layer`.
    #[allow(clippy::too_many_arguments)]
    fn node<L: Leaves + ?Sized, S: BlockSink, C: NodeCids>(
        &mut self,
        leaves: &L,
        heights: &[u8],
        lo: usize,
        hi: usize,
        layer: u32,
        sink: &mut S,
        cids: &mut C,
    ) -> CidBuf {
        let e_base = self.entries.len();
        let k_base = self.kids.len();
        let mut gap_start = lo;
        for i in lo..hi {
            if u32::from(heights[i]) == layer {
                let kid = self.gap(leaves, heights, gap_start, i, layer, sink, cids);
                self.kids.push(kid);
                self.entries.push(i as u32);
                gap_start = i + 1;
            }
        }
        let kid = self.gap(leaves, heights, gap_start, hi, layer, sink, cids);
        self.kids.push(kid);

        let out = &mut self.out;
        out.clear();
        let entries = &self.entries[e_base..];
        let kids = &self.kids[k_base..];
        write_node_head(out, entries.len());
        let mut prev: &[u8] = &[];
        for (j, &i) in entries.iter().enumerate() {
            let key = leaves.key(i as usize);
            write_entry(
                out,
                prev,
                key,
                leaves.value(i as usize),
                kids[j + 1].as_ref().map(|c| c.as_cid()),
            );
            prev = key;
        }
        write_node_tail(out, kids[0].as_ref().map(|c| c.as_cid()));
        let cid = cids.cid(&self.out);
        sink.block(cid, &self.out);
        self.nodes += 1;
        self.entries.truncate(e_base);
        self.kids.truncate(k_base);
        cid
    }

    /// The child for the gap `lo..hi` below a node on `layer`.
    #[inline]
    #[allow(clippy::too_many_arguments)]
    fn gap<L: Leaves + ?Sized, S: BlockSink, C: NodeCids>(
        &mut self,
        leaves: &L,
        heights: &[u8],
        lo: usize,
        hi: usize,
        layer: u32,
        sink: &mut S,
        cids: &mut C,
    ) -> Option<CidBuf> {
        if lo >= hi || layer == 0 {
            return None;
        }
        Some(self.node(leaves, heights, lo, hi, layer - 1, sink, cids))
    }
}

/// Builds the MST of `leaves` (strictly ascending by key, valid repository paths): the root CID
/// and every node block, children before parents, root last.
pub fn build<L: Leaves + ?Sized>(leaves: &L) -> Result<(CidBuf, Blocks), BuildError> {
    let mut blocks = Vec::new();
    let root = Builder::new().build(leaves, &mut blocks)?;
    Ok((root, blocks))
}

/// The root CID of the MST of `leaves`, without keeping blocks.
pub fn root_cid<L: Leaves + ?Sized>(leaves: &L) -> Result<CidBuf, BuildError> {
    Builder::new().build(leaves, &mut RootOnly)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaf() -> CidBuf {
        CidBuf::parse("bafyreie5cvv4h45feadgeuwhbcutmh6t2ceseocckahdoe6uat64zmz454").unwrap()
    }

    fn leaves(keys: &[&str]) -> Vec<(String, CidBuf)> {
        keys.iter().map(|k| (k.to_string(), leaf())).collect()
    }

    #[test]
    fn empty_tree() {
        let (root, blocks) = build(&leaves(&[])).unwrap();
        assert_eq!(root, empty_root_cid());
        assert_eq!(blocks, vec![(root, EMPTY_NODE.to_vec())]);
    }

    #[test]
    fn interop_roots() {
        // From atproto-interop-tests commit-proof fixtures ("add on edge with neighbor two layers down").
        let before = leaves(&["A0/374913", "B2/827649", "C0/451630"]);
        assert_eq!(
            root_cid(&before).unwrap().to_string(),
            "bafyreigc6ay2qwfk7kuevvrczummpd64nknfo4yxpaooknfymzyb7u3ntq"
        );
        let after = leaves(&["A0/374913", "B2/827649", "C0/451630", "D2/269196"]);
        let (root, blocks) = build(&after).unwrap();
        assert_eq!(
            root.to_string(),
            "bafyreign6kxoll35r5f2ske6hjx7vg56aw3jn6r5hcopgrepzafpvohr2a"
        );
        assert_eq!(blocks.last().map(|b| b.0), Some(root));
        for (cid, bytes) in &blocks {
            assert_eq!(*cid, CidBuf::sha256(DAG_CBOR, bytes));
        }
    }

    #[test]
    fn rejects_bad_leaves() {
        assert_eq!(
            build(&leaves(&["b/1", "a/1"])).unwrap_err(),
            BuildError::Unsorted { index: 1 }
        );
        assert_eq!(
            build(&leaves(&["a/1", "a/1"])).unwrap_err(),
            BuildError::Unsorted { index: 1 }
        );
        assert_eq!(
            build(&leaves(&["a/1", "bad"])).unwrap_err(),
            BuildError::InvalidKey { index: 1 }
        );
    }
}
