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

use crate::mst::height::common_prefix_len;
use crate::mst::node::{empty_root_cid, write_entry, write_node_head, write_node_tail};

/// A closed node's CID: borrowed from the known block it matched, or hashed (an index into
/// [`StreamBuilder::hashed`]). Copying 73-byte [`CidBuf`]s through every open node cost more
/// than the rest of the bookkeeping.
#[derive(Debug, Clone, Copy)]
enum Child<'v> {
    Known(Cid<'v>),
    Hashed(u32),
}

impl<'v> Child<'v> {
    /// The CID, looking a hashed one up in `hashed` ([`StreamBuilder::hashed`]).
    #[inline]
    fn cid<'a>(self, hashed: &'a [CidBuf]) -> Cid<'a>
    where
        'v: 'a,
    {
        match self {
            Child::Known(cid) => cid,
            Child::Hashed(i) => hashed[i as usize].as_cid(),
        }
    }
}

/// One entry of an open node: where its key ends in the layer's key buffer, its record, and the
/// subtree to its right (filled when the gap after it closes).
#[derive(Debug, Clone, Copy)]
struct Entry<'v> {
    key_end: u32,
    value: Cid<'v>,
    right: Option<Child<'v>>,
}

/// The open node of one layer.
#[derive(Debug, Default)]
struct Open<'v> {
    /// Whether any leaf lies in the node's range yet (a node exists only for non-empty ranges).
    open: bool,
    left: Option<Child<'v>>,
    /// The child for the gap after the last entry (or before the first), once it has closed.
    pending: Option<Child<'v>>,
    keys: Vec<u8>,
    entries: Vec<Entry<'v>>,
}

impl Open<'_> {
    /// Puts the child that closed in the current gap (if any) in its place: right of the last
    /// entry, or left of the node when it has none yet.
    #[inline]
    fn settle_gap(&mut self) {
        let gap = self.pending.take();
        match self.entries.last_mut() {
            Some(last) => last.right = gap,
            None => self.left = gap,
        }
    }
}

/// Builds the MST of leaves fed in ascending key order (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct StreamBuilder<'v> {
    layers: Vec<Open<'v>>,
    out: Vec<u8>,
    /// CIDs of nodes that were hashed.
    hashed: Vec<CidBuf>,
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
    #[inline]
    pub(crate) fn leaf(
        &mut self,
        key: &[u8],
        value: Cid<'v>,
        height: u32,
        known: &[(Cid<'v>, &'v [u8])],
    ) {
        let h = height as usize;
        while self.layers.len() <= h {
            self.layers.push(Open::default());
        }
        for layer in 0..h {
            if self.layers[layer].open {
                self.close_into_parent(layer, known);
            }
        }
        let node = &mut self.layers[h];
        node.settle_gap();
        node.keys.extend_from_slice(key);
        node.entries.push(Entry {
            key_end: node.keys.len() as u32,
            value,
            right: None,
        });
        node.open = true;
    }

    /// Closes every open node and returns the root CID (the empty tree's when no leaf came).
    pub(crate) fn finish(&mut self, known: &[(Cid<'v>, &'v [u8])]) -> CidBuf {
        let Some(top) = self.layers.iter().rposition(|l| !l.entries.is_empty()) else {
            return empty_root_cid();
        };
        for layer in 0..top {
            if self.layers[layer].open {
                self.close_into_parent(layer, known);
            }
        }
        let root = self.close(top, known).cid(&self.hashed).to_buf();
        self.layers.clear();
        self.hashed.clear();
        root
    }

    /// Closes the node of `layer` and puts it in the current gap of the layer above.
    #[inline]
    fn close_into_parent(&mut self, layer: usize, known: &[(Cid<'v>, &'v [u8])]) {
        let child = self.close(layer, known);
        let above = &mut self.layers[layer + 1];
        above.pending = Some(child);
        above.open = true;
    }

    /// Gives the open node of `layer` its CID, and empties the layer. The node is compared with
    /// the next known block as if encoded ([`encodes_to`]); only when that fails is it encoded
    /// and hashed.
    fn close(&mut self, layer: usize, known: &[(Cid<'v>, &'v [u8])]) -> Child<'v> {
        let i = self.next;
        self.next += 1;
        self.nodes += 1;
        self.layers[layer].settle_gap();
        let node = &self.layers[layer];
        let child = match known.get(i) {
            Some(&(cid, block)) if encodes_to(block, node, &self.hashed) => {
                self.reused += 1;
                Child::Known(cid)
            }
            _ => {
                let out = &mut self.out;
                out.clear();
                write_node_head(out, node.entries.len());
                let mut start = 0usize;
                let mut prev: &[u8] = &[];
                let cid_of = |c: Child<'v>| c.cid(&self.hashed);
                for e in &node.entries {
                    let key = &node.keys[start..e.key_end as usize];
                    write_entry(out, prev, key, e.value, e.right.map(cid_of));
                    prev = key;
                    start = e.key_end as usize;
                }
                write_node_tail(out, node.left.map(cid_of));
                let cid = CidBuf::sha256(DAG_CBOR, out);
                self.hashed.push(cid);
                Child::Hashed(self.hashed.len() as u32 - 1)
            }
        };
        let node = &mut self.layers[layer];
        node.open = false;
        node.left = None;
        node.keys.clear();
        node.entries.clear();
        child
    }
}

/// Whether `block` is exactly the canonical encoding of `node` (what `write_node_head`,
/// `write_entry` and `write_node_tail` would write), read piece by piece against the block
/// instead of written out and compared: the same bytes, without the stores.
fn encodes_to<'a>(block: &[u8], node: &Open<'a>, hashed: &'a [CidBuf]) -> bool {
    let cid_of = |c: Child<'a>| c.cid(hashed);
    let mut m = Expect { b: block, pos: 0 };
    if !(m.lit(&[0xa2, 0x61, b'e']) && m.head(4, node.entries.len() as u64)) {
        return false;
    }
    let mut start = 0usize;
    let mut prev: &[u8] = &[];
    for e in &node.entries {
        let key = &node.keys[start..e.key_end as usize];
        let p = common_prefix_len(prev, key);
        let ok = m.lit(&[0xa4, 0x61, b'k'])
            && m.head(2, (key.len() - p) as u64)
            && m.lit(&key[p..])
            && m.lit(&[0x61, b'p'])
            && m.head(0, p as u64)
            && m.lit(&[0x61, b't'])
            && m.link_or_null(e.right.map(cid_of))
            && m.lit(&[0x61, b'v'])
            && m.link_or_null(Some(e.value));
        if !ok {
            return false;
        }
        prev = key;
        start = e.key_end as usize;
    }
    m.lit(&[0x61, b'l']) && m.link_or_null(node.left.map(cid_of)) && m.pos == block.len()
}

/// A cursor that checks a block against the bytes an encoder would write.
struct Expect<'b> {
    b: &'b [u8],
    pos: usize,
}

impl Expect<'_> {
    /// The next bytes are `s`.
    #[inline(always)]
    fn lit(&mut self, s: &[u8]) -> bool {
        match self.b.get(self.pos..self.pos + s.len()) {
            Some(x) if x == s => {
                self.pos += s.len();
                true
            }
            _ => false,
        }
    }

    /// The next bytes are the shortest head of `major` with `arg` (as `write_head` writes it).
    /// Byte by byte: a slice comparison of one to nine bytes is a `memcmp` call (profiled: a
    /// fifth of the walk went to such calls).
    #[inline(always)]
    fn head(&mut self, major: u8, arg: u64) -> bool {
        let m = major << 5;
        let rest = self.b.get(self.pos..).unwrap_or_default();
        let (ok, n) = if arg < 24 {
            (rest.first() == Some(&(m | arg as u8)), 1)
        } else if arg <= 0xff {
            (
                rest.len() >= 2 && rest[0] == m | 24 && rest[1] == arg as u8,
                2,
            )
        } else if arg <= 0xffff {
            let ok = rest.len() >= 3
                && rest[0] == m | 25
                && u16::from_be_bytes([rest[1], rest[2]]) == arg as u16;
            (ok, 3)
        } else if arg <= 0xffff_ffff {
            let ok = rest.len() >= 5
                && rest[0] == m | 26
                && u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) == arg as u32;
            (ok, 5)
        } else {
            let ok = rest.len() >= 9 && rest[0] == m | 27 && rest[1..9] == arg.to_be_bytes();
            (ok, 9)
        };
        if ok {
            self.pos += n;
        }
        ok
    }

    /// The next bytes are `cid`: as one fixed-size comparison for the usual 36-byte CID.
    #[inline(always)]
    fn cid_bytes(&mut self, cid: &[u8]) -> bool {
        let next = self.b.get(self.pos..self.pos + cid.len());
        if let (Some(Ok(x)), Ok(y)) = (next.map(<&[u8; 36]>::try_from), <&[u8; 36]>::try_from(cid))
        {
            if x == y {
                self.pos += 36;
                return true;
            }
            return false;
        }
        self.lit(cid)
    }

    /// The next bytes are a link to `cid` (tag 42 over 0x00 and the CID), or null for `None`.
    #[inline(always)]
    fn link_or_null(&mut self, cid: Option<Cid<'_>>) -> bool {
        match cid {
            None => self.lit(&[0xf6]),
            Some(c) => {
                let b = c.as_bytes();
                self.lit(&[0xd8, 0x2a])
                    && self.head(2, b.len() as u64 + 1)
                    && self.lit(&[0])
                    && self.cid_bytes(b)
            }
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

    /// Blocks as the builder takes known ones: borrowed (CID, bytes) pairs.
    fn as_known(blocks: &[(CidBuf, Vec<u8>)]) -> Vec<(Cid<'_>, &[u8])> {
        blocks
            .iter()
            .map(|(c, b)| (c.as_cid(), b.as_slice()))
            .collect()
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
        let known = as_known(&blocks);
        // The blocks in build order are the order nodes close: nothing is hashed.
        assert_eq!(stream(&leaves, &known), (root, blocks.len(), blocks.len()));

        // A known block with other bytes under its CID is not used: that node is hashed.
        let mut altered = blocks.clone();
        altered[3].1.push(0);
        let known = as_known(&altered);
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
        let known = as_known(&other_blocks);
        assert_eq!(stream(&leaves, &known), (root, blocks.len(), 0));

        // Too few known blocks: the rest are hashed.
        let known = as_known(&blocks[..10]);
        assert_eq!(stream(&leaves, &known), (root, blocks.len(), 10));
    }

    #[test]
    fn a_known_block_is_reused_only_when_it_is_the_encoding() {
        // Every single-byte change, truncation and extension of two known blocks (the first
        // node on layer 0, and the root, which has subtrees): the builder must not take that
        // block's CID (it hashes the node instead), and the root stays right.
        let leaves: Vec<(String, CidBuf)> = (0..300)
            .map(|i| (format!("app.bsky.feed.like/3k{i:08}"), leaf(i)))
            .collect();
        let (root, blocks) = build(&leaves[..]).unwrap();
        let n = blocks.len();
        for target in [0, n - 1] {
            let orig = &blocks[target].1;
            let mut variants = Vec::new();
            for i in 0..orig.len() {
                for d in [1u8, 0x80] {
                    let mut m = orig.clone();
                    m[i] = m[i].wrapping_add(d);
                    variants.push(m);
                }
                variants.push(orig[..i].to_vec());
            }
            for extra in [0x00u8, 0xf6] {
                let mut m = orig.clone();
                m.push(extra);
                variants.push(m);
            }
            for v in &variants {
                let known: Vec<(Cid<'_>, &[u8])> = blocks
                    .iter()
                    .enumerate()
                    .map(|(j, (c, b))| (c.as_cid(), if j == target { &v[..] } else { &b[..] }))
                    .collect();
                assert_eq!(
                    stream(&leaves, &known),
                    (root, n, n - 1),
                    "block {target}: {v:02x?}"
                );
            }
        }
    }
}
