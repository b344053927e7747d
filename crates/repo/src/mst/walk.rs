//! Walking a whole MST in key order, checking that it is the canonical tree.
//!
//! Why: listing a repository and verifying it are the same traversal. The walk visits every
//! node once, left subtree, entry, right subtree, …, and checks on the way everything that makes
//! the tree the unique MST of its keys: keys strictly ascending across the whole tree, every key
//! on its node's layer, every child exactly one layer below its parent, no empty subtrees, a
//! pruned root. Combined with the per-node checks of [`crate::mst::node`], a tree that walks
//! without error re-encodes to itself; rebuilding it from the leaves is a second, independent
//! check.
//!
//! How: an explicit stack, one reusable [`NodeData`] per depth (depth is at most 129 since every
//! level goes down one layer and heights are at most 128), one tape arena. A node's subtree
//! blocks are looked up once, when it is decoded (and their bytes requested then). Keys are
//! compared with the previous key only across nodes, the previous key being found where it was
//! decoded (within a node the decoder checked the order). After warm-up a walk allocates nothing
//! per node. Bad input never panics and cannot loop: every subtree visited must
//! yield a new, larger key.
//!
//! What it does not do: check that record blocks exist (a repository export may omit them only if
//! the caller allows that; see [`crate::repo`]).

use riptide_cbor::{Arena, Cid};

use riptide_sha::ShortBatch;

use crate::error::MstError;
use crate::mst::height::key_height;
use crate::mst::node::{decode_node, decode_node_on_layer, empty_root_cid, wrong_layer, NodeData};
use crate::source::BlockSource;

/// What a walk saw.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WalkStats {
    /// Leaves (records).
    pub records: usize,
    /// Nodes decoded.
    pub nodes: usize,
    /// Layer of the root (0 for an empty tree).
    pub root_layer: u32,
}

#[derive(Debug, Clone, Copy)]
struct Frame {
    /// 0: left subtree next; 2j+1: entry j next; 2j+2: right subtree of entry j next.
    pos: usize,
    layer: u32,
}

/// Reusable walk state (a decoding arena).
#[derive(Debug, Default)]
pub struct Walker {
    arena: Arena,
}

impl Walker {
    /// A walker with empty buffers.
    pub fn new() -> Walker {
        Walker::default()
    }

    /// Visits every leaf of the tree rooted at `root` in key order, calling `f(key, record CID,
    /// height)`, and checks that the tree is canonical. Stops at the first problem.
    pub fn walk<'s, S, F>(&mut self, src: &'s S, root: Cid<'_>, f: F) -> Result<WalkStats, MstError>
    where
        S: BlockSource + ?Sized,
        F: FnMut(&[u8], Cid<'s>, u32),
    {
        // The root CID may borrow something shorter-lived than `src`: walk with a copy.
        let root = root.to_buf();
        self.walk_nodes(src, root.as_cid(), f, |_, _| {})
    }

    /// [`Walker::walk`] that also hands every node to `node(cid, block)` in post-order: children
    /// before parents, left to right (the order [`crate::mst::Builder`] produces nodes in).
    pub fn walk_nodes<'s: 'c, 'c, S, F, N>(
        &mut self,
        src: &'s S,
        root: Cid<'c>,
        f: F,
        node_done: N,
    ) -> Result<WalkStats, MstError>
    where
        S: BlockSource + ?Sized,
        F: FnMut(&[u8], Cid<'s>, u32),
        N: FnMut(Cid<'c>, &'s [u8]),
    {
        self.walk_with(src, root, &mut Closures { f, node_done })
    }

    /// [`Walker::walk_nodes`] with one visitor for leaves and nodes (so that both can work on
    /// the same state).
    ///
    /// Keys' heights are checked sixteen at a time (see `PendingHeights`), so the visitor may
    /// be handed a few leaves and nodes before the walk finds that a key above them is on the
    /// wrong layer; the walk's result is what says whether the tree is canonical, and its error
    /// is always the first problem in walk order.
    pub fn walk_with<'s: 'c, 'c, S, V>(
        &mut self,
        src: &'s S,
        root: Cid<'c>,
        visit: &mut V,
    ) -> Result<WalkStats, MstError>
    where
        S: BlockSource + ?Sized,
        V: Visit<'s, 'c> + ?Sized,
    {
        let mut pending = PendingHeights::new();
        match self.walk_inner(src, root, visit, &mut pending) {
            Ok(stats) => pending.flush().map(|()| stats),
            // A key queued before the problem was found comes first in walk order.
            Err(e) => Err(pending.flush().err().unwrap_or(e)),
        }
    }

    fn walk_inner<'s: 'c, 'c, S, V>(
        &mut self,
        src: &'s S,
        root: Cid<'c>,
        visit: &mut V,
        pending: &mut PendingHeights<'c>,
    ) -> Result<WalkStats, MstError>
    where
        S: BlockSource + ?Sized,
        V: Visit<'s, 'c> + ?Sized,
    {
        let mut stats = WalkStats::default();
        let mut levels: Vec<NodeData<'s>> = vec![NodeData::new()];
        let mut frames: Vec<Frame> = Vec::with_capacity(16);
        let block = match src.get_block(root) {
            Some(b) => b,
            // The empty tree needs no block: its CID says all there is to know.
            None if root == empty_root_cid().as_cid() => {
                return Ok(WalkStats { nodes: 1, ..stats })
            }
            None => return Err(MstError::MissingBlock(root.to_buf())),
        };
        decode_node(&mut self.arena, root, block, None, &mut levels[0])?;
        // The blocks of each depth's subtrees, looked up once when the node was decoded (left
        // first, then right of each entry; `None` where there is no subtree or no block).
        let mut children: Vec<Vec<Option<&'s [u8]>>> = vec![Vec::new()];
        prefetch_node(src, &levels[0], &mut children[0]);
        stats.nodes = 1;
        let Some(root_layer) = levels[0].layer() else {
            if levels[0].left().is_some() {
                return Err(MstError::UnprunedRoot { cid: root.to_buf() });
            }
            return Ok(stats); // the empty tree
        };
        stats.root_layer = root_layer;
        frames.push(Frame {
            pos: 0,
            layer: root_layer,
        });
        // Where the last key visited is: (depth, entry). Its node is still decoded there: a
        // depth is only decoded into again on the way down, and by then every key visited since
        // is at that depth or above.
        let mut prev: Option<(usize, usize)> = None;
        // Which node (for error reports) each depth holds.
        let mut cids: Vec<Cid<'c>> = vec![root];
        // And its block.
        let mut blocks: Vec<&'s [u8]> = vec![block];

        while !frames.is_empty() {
            let depth = frames.len() - 1;
            let frame = &mut frames[depth];
            let node = &levels[depth];
            let pos = frame.pos;
            frame.pos += 1;
            let (child, at) = if pos == 0 {
                (node.left(), 0)
            } else if pos % 2 == 1 {
                let j = (pos - 1) / 2;
                if j >= node.len() {
                    frames.pop();
                    visit.node(cids[depth], blocks[depth]);
                    continue;
                }
                let key = node.key(j);
                // The entry before it in the same node is already known to be smaller (the node's
                // own check); any other previous key (the last of a subtree, or an ancestor's) is
                // compared here.
                if let Some((d, i)) = prev {
                    if (d != depth || i + 1 != j) && key <= levels[d].key(i) {
                        return Err(MstError::KeyOrder {
                            cid: cids[depth].to_buf(),
                            key: String::from_utf8_lossy(key).into_owned(),
                        });
                    }
                }
                prev = Some((depth, j));
                stats.records += 1;
                visit.leaf(key, node.value(j), frame.layer);
                continue;
            } else {
                (node.right((pos - 2) / 2), pos / 2)
            };
            let Some(child) = child else { continue };
            // decode_node rejected subtrees on layer 0, so the parent layer is at least 1.
            let layer = frame.layer.saturating_sub(1);
            let block = children[depth]
                .get(at)
                .copied()
                .flatten()
                .ok_or_else(|| MstError::MissingBlock(child.to_buf()))?;
            if levels.len() <= depth + 1 {
                levels.push(NodeData::new());
                children.push(Vec::new());
                cids.push(child);
                blocks.push(block);
            } else {
                cids[depth + 1] = child;
                blocks[depth + 1] = block;
            }
            let slot = &mut levels[depth + 1];
            decode_node_on_layer(&mut self.arena, child, block, layer, slot)?;
            for j in 0..slot.len() {
                pending.push(slot.key(j), child, layer)?;
            }
            prefetch_node(src, slot, &mut children[depth + 1]);
            stats.nodes += 1;
            if slot.is_empty() && slot.left().is_none() {
                return Err(MstError::EmptyNode {
                    cid: child.to_buf(),
                });
            }
            frames.push(Frame { pos: 0, layer });
        }
        Ok(stats)
    }
}

/// Keys the walk has decoded on a layer but not yet hashed, checked sixteen at a time
/// ([`ShortBatch`]: sixteen SHA-256 lanes where the CPU has AVX-512). A node holds a few keys;
/// queuing them across nodes fills the lanes. Keys too long for one block are checked at once.
struct PendingHeights<'c> {
    batch: ShortBatch,
    /// The node and layer of each queued key.
    at: [Option<(Cid<'c>, u32)>; ShortBatch::LANES],
}

impl<'c> PendingHeights<'c> {
    fn new() -> Self {
        PendingHeights {
            batch: ShortBatch::new(),
            at: [None; ShortBatch::LANES],
        }
    }

    /// Queues "`key`, in node `cid`, has height `layer`"; checks the batch when it is full.
    #[inline]
    fn push(&mut self, key: &[u8], cid: Cid<'c>, layer: u32) -> Result<(), MstError> {
        let i = self.batch.len();
        if !self.batch.push(key) {
            // Too long for a lane: check it now, after everything queued before it.
            self.flush()?;
            return check_height(cid, key, layer, key_height(key));
        }
        self.at[i] = Some((cid, layer));
        if self.batch.is_full() {
            self.flush()?;
        }
        Ok(())
    }

    /// Checks every queued key; the error is the first wrong one in queue order.
    fn flush(&mut self) -> Result<(), MstError> {
        let n = self.batch.len();
        if n == 0 {
            return Ok(());
        }
        // A key's height is the leading zero bits of its SHA-256, halved.
        let zeros = self.batch.leading_zeros();
        for (i, z) in zeros.iter().enumerate().take(n) {
            if let Some((cid, layer)) = self.at[i] {
                check_height(cid, self.batch.message(i), layer, z / 2)?;
            }
        }
        Ok(())
    }
}

#[inline]
fn check_height(cid: Cid<'_>, key: &[u8], layer: u32, found: u32) -> Result<(), MstError> {
    if found == layer {
        return Ok(());
    }
    Err(wrong_layer(cid, key, layer, found))
}

/// What a walk hands over: every leaf in key order, and every node in post-order (children
/// before parents, left to right); a node is handed over before the leaf that follows it.
pub trait Visit<'s, 'c> {
    /// One leaf: its key, record CID and height (the layer of its node).
    fn leaf(&mut self, key: &[u8], cid: Cid<'s>, height: u32);
    /// One node, once every leaf under it was visited: its CID and block.
    fn node(&mut self, _cid: Cid<'c>, _block: &'s [u8]) {}
}

/// A leaf closure and a node closure as one [`Visit`].
struct Closures<F, N> {
    f: F,
    node_done: N,
}

impl<'s, 'c, F, N> Visit<'s, 'c> for Closures<F, N>
where
    F: FnMut(&[u8], Cid<'s>, u32),
    N: FnMut(Cid<'c>, &'s [u8]),
{
    #[inline]
    fn leaf(&mut self, key: &[u8], cid: Cid<'s>, height: u32) {
        (self.f)(key, cid, height)
    }
    #[inline]
    fn node(&mut self, cid: Cid<'c>, block: &'s [u8]) {
        (self.node_done)(cid, block)
    }
}

/// Tells the source about every CID a node links to: the index slots of its records (which
/// callers such as `verify_repo` look up as, or a few leaves after, the walk hands them over) and subtrees; then looks
/// each subtree's block up, once, into `children` (left, then right of each entry; the walk
/// takes them from there when it goes down) and starts loading its bytes, which the walk decodes
/// next. On a large CAR the cache misses then overlap instead of coming one by one.
#[inline]
fn prefetch_node<'s, S: BlockSource + ?Sized>(
    src: &'s S,
    node: &NodeData<'_>,
    children: &mut Vec<Option<&'s [u8]>>,
) {
    if let Some(left) = node.left() {
        src.prefetch(left);
    }
    for j in 0..node.len() {
        src.prefetch(node.value(j));
        if let Some(right) = node.right(j) {
            src.prefetch(right);
        }
    }
    children.clear();
    let subtrees = std::iter::once(node.left()).chain((0..node.len()).map(|j| node.right(j)));
    for child in subtrees {
        let block = child.and_then(|c| src.get_block(c));
        if let Some(b) = block {
            src.prefetch_block(b);
        }
        children.push(block);
    }
}

/// Visits every leaf of the tree rooted at `root` in key order (see [`Walker::walk`]).
pub fn walk<'s, S, F>(src: &'s S, root: Cid<'_>, f: F) -> Result<WalkStats, MstError>
where
    S: BlockSource + ?Sized,
    F: FnMut(&[u8], Cid<'s>, u32),
{
    Walker::new().walk(src, root, f)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mst::build::build;
    use crate::mst::node::encode_node;
    use riptide_cbor::CidBuf;
    use riptide_cbor::DAG_CBOR;
    use std::collections::HashMap;

    fn leaf() -> CidBuf {
        CidBuf::parse("bafyreie5cvv4h45feadgeuwhbcutmh6t2ceseocckahdoe6uat64zmz454").unwrap()
    }

    fn store(blocks: Vec<(CidBuf, Vec<u8>)>) -> HashMap<CidBuf, Vec<u8>> {
        blocks.into_iter().collect()
    }

    /// Encodes a node, stores it, returns its CID.
    fn put(
        src: &mut HashMap<CidBuf, Vec<u8>>,
        left: Option<Cid<'_>>,
        entries: &[(&[u8], Cid<'_>, Option<Cid<'_>>)],
    ) -> CidBuf {
        let mut bytes = Vec::new();
        encode_node(&mut bytes, left, entries);
        let cid = CidBuf::sha256(DAG_CBOR, &bytes);
        src.insert(cid, bytes);
        cid
    }

    fn keys_of(src: &HashMap<CidBuf, Vec<u8>>, root: CidBuf) -> Result<Vec<String>, MstError> {
        let mut out = Vec::new();
        walk(src, root.as_cid(), |k, _, _| {
            out.push(String::from_utf8_lossy(k).into_owned())
        })?;
        Ok(out)
    }

    #[test]
    fn walks_what_build_built() {
        let keys: Vec<String> = (0..500)
            .map(|i| format!("app.bsky.feed.like/{i:06}"))
            .collect();
        let leaves: Vec<(String, CidBuf)> = keys.iter().map(|k| (k.clone(), leaf())).collect();
        let (root, blocks) = build(&leaves).unwrap();
        let n = blocks.len();
        let src = store(blocks);
        assert_eq!(keys_of(&src, root).unwrap(), keys);
        let stats = walk(&src, root.as_cid(), |_, _, _| {}).unwrap();
        assert_eq!((stats.records, stats.nodes), (500, n));
    }

    #[test]
    fn empty_tree_needs_no_block() {
        let src: HashMap<CidBuf, Vec<u8>> = HashMap::new();
        let stats = walk(&src, crate::mst::empty_root_cid().as_cid(), |_, _, _| {}).unwrap();
        assert_eq!((stats.records, stats.nodes), (0, 1));
        let mut tree = crate::mst::Tree::load(crate::mst::empty_root_cid());
        assert_eq!(tree.get(&src, b"a.b/c").unwrap(), None);
    }

    #[test]
    fn missing_node_is_typed() {
        let leaves: Vec<(String, CidBuf)> = (0..100)
            .map(|i| (format!("a.b.c/{i:04}"), leaf()))
            .collect();
        let (root, blocks) = build(&leaves).unwrap();
        let dropped = blocks[0].0;
        let src = store(blocks.into_iter().skip(1).collect());
        assert_eq!(
            keys_of(&src, root).unwrap_err(),
            MstError::MissingBlock(dropped)
        );
    }

    /// The first key `a.b.c/NNNNN` of height `h` strictly between `lo` and `hi`.
    fn key_between(h: u32, lo: &str, hi: &str) -> String {
        (0..100_000)
            .map(|i| format!("a.b.c/{i:05}"))
            .find(|k| {
                crate::mst::key_height(k.as_bytes()) == h && k.as_str() > lo && k.as_str() < hi
            })
            .unwrap()
    }

    #[test]
    fn order_is_checked_across_every_kind_of_node_boundary() {
        // The walk compares a key with the previous one only when that one is in another node
        // (within a node the decoder checked the order). Each boundary, valid and out of order:
        // into a right subtree, out of a subtree back to its parent, and out of a grandchild
        // past two levels.
        let v = leaf();
        let (lo, hi) = ("a.b.c/", "a.b.c/~");
        // Layer-1 keys b < d with layer-0 keys below b and between them.
        let b = key_between(1, &key_between(0, lo, hi), hi);
        let d = key_between(1, &key_between(0, &b, hi), hi);
        let under_b = key_between(0, lo, &b); // a layer-0 key below b
        let between = key_between(0, &b, &d); // a layer-0 key between b and d
        let above_d = key_between(0, &d, hi); // a layer-0 key above d
        let e = |k: &String| (k.as_bytes().to_vec(), v);
        let tree = |src: &mut HashMap<CidBuf, Vec<u8>>, right_of_b: &String| {
            let (k, c) = e(right_of_b);
            let child = put(src, None, &[(&k, c.as_cid(), None)]);
            let (kb, kd) = (e(&b), e(&d));
            put(
                src,
                None,
                &[
                    (&kb.0, v.as_cid(), Some(child.as_cid())),
                    (&kd.0, v.as_cid(), None),
                ],
            )
        };
        let mut src = HashMap::new();
        let ok = tree(&mut src, &between);
        assert_eq!(
            keys_of(&src, ok).unwrap(),
            [b.clone(), between.clone(), d.clone()]
        );
        // Into the subtree: its first key is below the parent's key before it.
        let bad = tree(&mut src, &under_b);
        assert!(
            matches!(keys_of(&src, bad), Err(MstError::KeyOrder { key, .. }) if key == under_b)
        );
        // Out of the subtree: the parent's next key is below the subtree's last.
        let bad = tree(&mut src, &above_d);
        assert!(matches!(keys_of(&src, bad), Err(MstError::KeyOrder { key, .. }) if key == d));

        // Two levels: a layer-2 root whose left child (layer 1) has a left child (layer 0)
        // holding a key above the root's key; the layer-1 child holds keys in order.
        let mid = key_between(1, lo, hi);
        let top = key_between(2, &key_between(0, &mid, hi), hi);
        let (km, kt) = (e(&mid), e(&top));
        // The root (`top`), its left child (`mid`) and that child's left child (`grandchild`).
        let three_levels = |src: &mut _, grandchild: &String| {
            let kg = e(grandchild);
            let grandchild = put(src, None, &[(&kg.0, v.as_cid(), None)]);
            let child = put(src, None, &[(&km.0, v.as_cid(), Some(grandchild.as_cid()))]);
            put(src, Some(child.as_cid()), &[(&kt.0, v.as_cid(), None)])
        };
        let root = three_levels(&mut src, &key_between(0, &top, hi));
        assert!(
            matches!(keys_of(&src, root), Err(MstError::KeyOrder { key, .. }) if key == top),
            "{:?}",
            keys_of(&src, root)
        );
        // The same shape in order walks.
        let grandchild_key = key_between(0, &mid, &top);
        let root = three_levels(&mut src, &grandchild_key);
        assert_eq!(keys_of(&src, root).unwrap(), [mid, grandchild_key, top]);
    }

    #[test]
    fn cross_node_order_and_layers_are_checked() {
        // A layer-1 key with a left child holding a larger layer-0 key.
        let hi: Vec<String> = (0..1000)
            .map(|i| format!("a.b.c/{i:04}"))
            .filter(|k| crate::mst::key_height(k.as_bytes()) == 1)
            .take(1)
            .collect();
        let lo: Vec<String> = (0..1000)
            .map(|i| format!("a.b.c/{i:04}"))
            .filter(|k| crate::mst::key_height(k.as_bytes()) == 0 && k.as_str() > hi[0].as_str())
            .take(1)
            .collect();
        let v = leaf();
        let mut src = HashMap::new();
        let child_cid = put(&mut src, None, &[(lo[0].as_bytes(), v.as_cid(), None)]);
        let root_cid = put(
            &mut src,
            Some(child_cid.as_cid()),
            &[(hi[0].as_bytes(), v.as_cid(), None)],
        );
        assert!(matches!(
            keys_of(&src, root_cid),
            Err(MstError::KeyOrder { .. })
        ));

        // The same child under a layer-2 key: the child must be on layer 1, its key is on 0.
        let top: Vec<String> = (0..5000)
            .map(|i| format!("a.b.c/{i:04}"))
            .filter(|k| crate::mst::key_height(k.as_bytes()) == 2 && k.as_str() > lo[0].as_str())
            .take(1)
            .collect();
        let root_cid = put(
            &mut src,
            Some(child_cid.as_cid()),
            &[(top[0].as_bytes(), v.as_cid(), None)],
        );
        assert!(matches!(
            keys_of(&src, root_cid),
            Err(MstError::WrongLayer {
                expected: 1,
                found: 0,
                ..
            })
        ));

        // The same wrong child, then a right subtree that is missing: the key queued for its
        // height came first in walk order, so it is the error.
        let missing = CidBuf::sha256(DAG_CBOR, b"not in the store");
        let root_cid = put(
            &mut src,
            Some(child_cid.as_cid()),
            &[(top[0].as_bytes(), v.as_cid(), Some(missing.as_cid()))],
        );
        assert!(matches!(
            keys_of(&src, root_cid),
            Err(MstError::WrongLayer {
                expected: 1,
                found: 0,
                ..
            })
        ));

        // A key too long for one SHA-256 block (checked at once, not queued), also on layer 0.
        let long: String = (0..1000)
            .map(|i| format!("a.b.c/{i:04}{}", "-".repeat(60)))
            .find(|k| crate::mst::key_height(k.as_bytes()) == 0 && k.as_str() < top[0].as_str())
            .unwrap();
        let long_cid = put(&mut src, None, &[(long.as_bytes(), v.as_cid(), None)]);
        let root_cid = put(
            &mut src,
            Some(long_cid.as_cid()),
            &[(top[0].as_bytes(), v.as_cid(), None)],
        );
        match keys_of(&src, root_cid) {
            Err(MstError::WrongLayer {
                expected: 1,
                found: 0,
                key,
                ..
            }) => assert_eq!(key, long),
            other => panic!("{other:?}"),
        }

        // An empty node as a child, and an unpruned root.
        let empty_cid = put(&mut src, None, &[]);
        let root_cid = put(
            &mut src,
            Some(empty_cid.as_cid()),
            &[(hi[0].as_bytes(), v.as_cid(), None)],
        );
        assert!(matches!(
            keys_of(&src, root_cid),
            Err(MstError::EmptyNode { .. })
        ));
        let root_cid = put(&mut src, Some(child_cid.as_cid()), &[]);
        assert!(matches!(
            keys_of(&src, root_cid),
            Err(MstError::UnprunedRoot { .. })
        ));
    }
}
