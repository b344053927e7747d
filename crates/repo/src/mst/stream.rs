//! Building the canonical MST from leaves as they arrive, one at a time, in key order.
//!
//! Why: verifying a repository rebuilds its MST from the leaves the walk found and compares the
//! root with the commit's `data`. Done after the walk, from a table of every leaf, the rebuild
//! re-reads record CIDs and node blocks that have long left the cache (profiled on a
//! 200,000-record repository: most of the separate rebuild went to those misses). Fed each leaf
//! while the walk holds it, the builder works on hot data and needs no leaf table.
//!
//! How: the node over a key range on layer L holds the keys of height L, and each gap between
//! them is the node over that sub-range on layer L-1 (see [`crate::mst::build`]). Keys arrive in
//! ascending order, so one open node per layer suffices: a key of height h closes the open nodes
//! on every layer below h (each one becoming the child in the current gap of the layer above)
//! and joins the open node on layer h; the end closes everything, and the highest layer's node is
//! the root. Nodes close children before parents, left to right: the order of
//! [`crate::mst::Builder`] and of a post-order walk. The result is the same tree as
//! [`crate::mst::build()`] (tested against it).
//!
//! Node CIDs: every closed node is encoded from its entries. When a list of blocks whose CIDs
//! were checked against their bytes is given (a verified CAR's nodes, in post-order), the encoding
//! is compared with the next one and, when equal, that block's CID is the node's; otherwise the
//! encoding is hashed. So the root is exactly what hashing every node would give.
//!
//! What it does not do: check the leaves. The caller guarantees ascending valid keys and the
//! height of each (the walk checks both).

use riptide_cbor::{Cid, CidBuf, DAG_CBOR};

use crate::mst::node::{empty_root_cid, write_entry, write_node_head, write_node_tail};

/// One entry of an open node: where its key ends in the layer's key buffer, its record, and the
/// subtree to its right (filled when the gap after it closes).
#[derive(Debug, Clone, Copy)]
struct Entry<'v> {
    key_end: u32,
    value: Cid<'v>,
    right: Option<CidBuf>,
}

/// The open node of one layer.
#[derive(Debug, Default)]
struct Open<'v> {
    /// Whether any leaf lies in the node's range yet (a node exists only for non-empty ranges).
    open: bool,
    left: Option<CidBuf>,
    /// The child for the gap after the last entry (or before the first), once it has closed.
    pending: Option<CidBuf>,
    keys: Vec<u8>,
    entries: Vec<Entry<'v>>,
}

/// Builds the MST of leaves fed in ascending key order (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct StreamBuilder<'v> {
    layers: Vec<Open<'v>>,
    out: Vec<u8>,
    /// Next known block to compare a closed node with.
    next: usize,
    /// Nodes closed so far.
    pub(crate) nodes: usize,
    /// Nodes whose CID came from a known block (the rest were hashed).
    pub(crate) reused: usize,
}

impl<'v> StreamBuilder<'v> {
    /// An empty builder.
    pub(crate) fn new() -> StreamBuilder<'v> {
        StreamBuilder::default()
    }

    /// Adds the next leaf: `key` (greater than every key before it) with record `value`, on layer
    /// `height` (its [`crate::mst::key_height`]). `known` are blocks whose CIDs were checked
    /// against their bytes, in the order nodes close (post-order); it may grow between calls.
    pub(crate) fn leaf<'k>(
        &mut self,
        key: &[u8],
        value: Cid<'v>,
        height: u32,
        known: &[(Cid<'k>, &'k [u8])],
    ) {
        let h = height as usize;
        while self.layers.len() <= h {
            self.layers.push(Open::default());
        }
        for layer in 0..h {
            if self.layers[layer].open {
                let cid = self.close(layer, known);
                let above = &mut self.layers[layer + 1];
                above.pending = Some(cid);
                above.open = true;
            }
        }
        let node = &mut self.layers[h];
        let gap = node.pending.take();
        match node.entries.last_mut() {
            Some(last) => last.right = gap,
            None => node.left = gap,
        }
        node.keys.extend_from_slice(key);
        node.entries.push(Entry {
            key_end: node.keys.len() as u32,
            value,
            right: None,
        });
        node.open = true;
    }

    /// Closes every open node and returns the root CID (the empty tree's when no leaf came).
    pub(crate) fn finish<'k>(&mut self, known: &[(Cid<'k>, &'k [u8])]) -> CidBuf {
        let Some(top) = self.layers.iter().rposition(|l| !l.entries.is_empty()) else {
            return empty_root_cid();
        };
        for layer in 0..top {
            if self.layers[layer].open {
                let cid = self.close(layer, known);
                let above = &mut self.layers[layer + 1];
                above.pending = Some(cid);
                above.open = true;
            }
        }
        let root = self.close(top, known);
        self.layers.clear();
        root
    }

    /// Encodes the open node of `layer`, gives its CID, and empties the layer.
    fn close<'k>(&mut self, layer: usize, known: &[(Cid<'k>, &'k [u8])]) -> CidBuf {
        let node = &mut self.layers[layer];
        let gap = node.pending.take();
        match node.entries.last_mut() {
            Some(last) => last.right = gap,
            None => node.left = gap,
        }
        let out = &mut self.out;
        out.clear();
        write_node_head(out, node.entries.len());
        let mut start = 0usize;
        let mut prev: &[u8] = &[];
        for e in &node.entries {
            let key = &node.keys[start..e.key_end as usize];
            write_entry(
                out,
                prev,
                key,
                e.value,
                e.right.as_ref().map(|c| c.as_cid()),
            );
            prev = key;
            start = e.key_end as usize;
        }
        write_node_tail(out, node.left.as_ref().map(|c| c.as_cid()));
        node.open = false;
        node.left = None;
        node.keys.clear();
        node.entries.clear();
        self.nodes += 1;
        let i = self.next;
        self.next += 1;
        match known.get(i) {
            Some((cid, block)) if *block == self.out.as_slice() => {
                self.reused += 1;
                cid.to_buf()
            }
            _ => CidBuf::sha256(DAG_CBOR, &self.out),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mst::{build, key_height};

    fn leaf(i: usize) -> CidBuf {
        CidBuf::sha256(DAG_CBOR, format!("record {i}").as_bytes())
    }

    fn stream(leaves: &[(String, CidBuf)], known: &[(Cid<'_>, &[u8])]) -> (CidBuf, usize, usize) {
        let mut b = StreamBuilder::new();
        for (k, v) in leaves {
            b.leaf(k.as_bytes(), v.as_cid(), key_height(k.as_bytes()), known);
        }
        let root = b.finish(known);
        (root, b.nodes, b.reused)
    }

    #[test]
    fn same_tree_as_the_recursive_builder() {
        // Many sizes, so that roots on several layers, empty intermediate layers and long
        // gaps all occur; the recursive builder is the oracle.
        for n in [0usize, 1, 2, 3, 5, 17, 64, 100, 257, 1000, 3000] {
            let leaves: Vec<(String, CidBuf)> = (0..n)
                .map(|i| (format!("app.bsky.feed.post/3l{:011x}", i * 7919), leaf(i)))
                .collect();
            let mut sorted = leaves.clone();
            sorted.sort();
            let (root, blocks) = build(&sorted[..]).unwrap();
            let (got, nodes, reused) = stream(&sorted, &[]);
            assert_eq!(got, root, "{n} leaves");
            assert_eq!(reused, 0);
            if n > 0 {
                assert_eq!(nodes, blocks.len(), "{n} leaves");
            }
        }
    }

    #[test]
    fn known_blocks_stand_in_for_hashing_only_when_equal() {
        let leaves: Vec<(String, CidBuf)> = (0..2000)
            .map(|i| (format!("app.bsky.graph.follow/3k{i:08}"), leaf(i)))
            .collect();
        let (root, blocks) = build(&leaves[..]).unwrap();
        let known: Vec<(Cid<'_>, &[u8])> = blocks
            .iter()
            .map(|(c, b)| (c.as_cid(), b.as_slice()))
            .collect();
        // The blocks in build order are the order nodes close: nothing is hashed.
        assert_eq!(stream(&leaves, &known), (root, blocks.len(), blocks.len()));

        // A known block with other bytes under its CID is not used: that node is hashed.
        let mut altered = blocks.clone();
        altered[3].1.push(0);
        let known: Vec<(Cid<'_>, &[u8])> = altered
            .iter()
            .map(|(c, b)| (c.as_cid(), b.as_slice()))
            .collect();
        assert_eq!(
            stream(&leaves, &known),
            (root, blocks.len(), blocks.len() - 1)
        );

        // Blocks of another tree (different CIDs and bytes): a builder that took a known CID
        // without comparing the bytes would get a different root; this one hashes every node.
        let other: Vec<(String, CidBuf)> = (0..2000)
            .map(|i| (format!("app.bsky.graph.follow/3k{i:08}"), leaf(i + 1)))
            .collect();
        let (other_root, other_blocks) = build(&other[..]).unwrap();
        assert_ne!(other_root, root);
        let known: Vec<(Cid<'_>, &[u8])> = other_blocks
            .iter()
            .map(|(c, b)| (c.as_cid(), b.as_slice()))
            .collect();
        assert_eq!(stream(&leaves, &known), (root, blocks.len(), 0));

        // Too few known blocks: the rest are hashed.
        let known: Vec<(Cid<'_>, &[u8])> = blocks
            .iter()
            .take(10)
            .map(|(c, b)| (c.as_cid(), b.as_slice()))
            .collect();
        assert_eq!(stream(&leaves, &known), (root, blocks.len(), 10));
    }
}
