//! A mutable, partially loaded MST: get, insert, delete, and root CID recomputation.
//!
//! Why: a Sync 1.1 commit proof carries only the MST nodes near the changed keys. To check it we
//! load the *new* tree from those blocks and undo each operation; subtrees the proof does not
//! include stay opaque, known only by CID (stubs), and are loaded from the
//! [`BlockSource`] only when an operation truly needs to look inside. A node that is needed but
//! absent is a typed [`MstError::MissingBlock`], never a guess.
//!
//! The operations keep the tree canonical at every step (it is the unique MST of its keys):
//! - insert on the key's own layer splits the subtree in the gap where the key lands into the
//!   part below and the part above it (loading the nodes along the key's path);
//! - insert above the root splits the whole tree and lifts both halves under a new root, through
//!   entry-less nodes if layers are skipped;
//! - delete merges the subtrees on both sides of the removed entry (loading the facing spines of
//!   both: the siblings a proof must include; a side that is null needs nothing), then prunes
//!   entry-less roots (loading the new root to see whether it needs pruning too, unless it is on
//!   layer 0, where a non-empty node always has entries).
//!
//! CIDs: every node remembers its CID while unmodified (a loaded node's is the CID it was loaded
//! by, valid because strict decoding guarantees it re-encodes to the same bytes), so computing
//! the root re-encodes only the nodes on modified paths.
//!
//! What it does not do: check ordering *across* nodes of a partial tree (a node is checked on its
//! own when loaded; keys of a subtree are assumed to lie in the gap that points to it). For a
//! proof this is enough: the result must hash to `prevData` anyway. After an error the tree is
//! left half-modified and refuses further use ([`MstError::Poisoned`]) unless rolled back to a
//! [`Checkpoint`].

use riptide_cbor::{Arena, Cid, CidBuf, DAG_CBOR};
use sha2::{Digest, Sha256};

use crate::error::MstError;
use crate::mst::build::{BlockSink, RootOnly};
use crate::mst::height::{is_valid_key, key_height};
use crate::mst::node::{
    decode_node, empty_root_cid, write_entry, write_node_head, write_node_tail, NodeData,
};
use crate::source::BlockSource;

mod memory;

/// A subtree: either known only by CID, or loaded (or built) in memory.
#[derive(Debug, Clone)]
enum Link {
    Stub(CidBuf),
    Node(Box<Node>),
}

#[derive(Debug, Clone)]
struct Node {
    layer: u32,
    left: Option<Link>,
    entries: Vec<Entry>,
    /// The CID while the node is unmodified since it was loaded or last hashed.
    cid: Option<CidBuf>,
}

#[derive(Debug, Clone)]
struct Entry {
    key: Key,
    value: CidBuf,
    right: Option<Link>,
}

/// Longest key kept inside its entry (longer ones go to the heap). Repository keys are
/// `collection/rkey`: `app.bsky.feed.like/` and a 13-character TID is 32 bytes, the longest
/// common collections stay under 46; the type is 48 bytes, a boxed slice 16.
const INLINE_KEY: usize = 46;

/// An entry's full key. Inline up to [`INLINE_KEY`] bytes: loading a proof's nodes allocated
/// one box per key (and freed it again with the tree), which cost more than the tree itself.
#[derive(Clone)]
enum Key {
    Inline { len: u8, bytes: [u8; INLINE_KEY] },
    Heap(Box<[u8]>),
}

impl From<&[u8]> for Key {
    fn from(k: &[u8]) -> Key {
        match u8::try_from(k.len()) {
            Ok(len) if k.len() <= INLINE_KEY => {
                let mut bytes = [0; INLINE_KEY];
                bytes[..k.len()].copy_from_slice(k);
                Key::Inline { len, bytes }
            }
            _ => Key::Heap(k.into()),
        }
    }
}

impl std::ops::Deref for Key {
    type Target = [u8];

    #[inline]
    fn deref(&self) -> &[u8] {
        match self {
            Key::Inline { len, bytes } => &bytes[..*len as usize],
            Key::Heap(k) => k,
        }
    }
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", String::from_utf8_lossy(self))
    }
}

impl Node {
    fn is_void(&self) -> bool {
        self.entries.is_empty() && self.left.is_none()
    }

    /// The child slot before entry `i` (`i == entries.len()`: after the last entry).
    fn gap(&mut self, i: usize) -> &mut Option<Link> {
        if i == 0 {
            &mut self.left
        } else {
            &mut self.entries[i - 1].right
        }
    }

    fn find(&self, key: &[u8]) -> (usize, bool) {
        let i = self.entries.partition_point(|e| &*e.key < key);
        let found = self.entries.get(i).is_some_and(|e| &*e.key == key);
        (i, found)
    }
}

/// Lookup state shared by the recursive operations.
struct Ctx<'c, S: ?Sized> {
    src: &'c S,
    arena: &'c mut Arena,
    loaded: &'c mut Vec<CidBuf>,
    /// Decoding scratch, reused from node to node.
    data: &'c mut NodeData<'static>,
}

impl<S: BlockSource + ?Sized> Ctx<'_, S> {
    /// Loads node `cid`. `layer` is the layer it must be on; `None` for a root, whose layer comes
    /// from its keys (`Ok(None)`: the empty tree).
    fn load(&mut self, cid: CidBuf, layer: Option<u32>) -> Result<Option<Box<Node>>, MstError> {
        if layer.is_none() && cid == empty_root_cid() {
            return Ok(None); // the empty tree: its CID says all there is to know
        }
        let block = self
            .src
            .get_block(cid.as_cid())
            .ok_or(MstError::MissingBlock(cid))?;
        let mut data = std::mem::take(self.data).recycle();
        let node = decode_node(self.arena, cid.as_cid(), block, layer, &mut data).and_then(|()| {
            self.loaded.push(cid);
            node_of(cid, &data, layer)
        });
        *self.data = data.recycle();
        node
    }

    /// Loads a non-root node on `layer`.
    fn load_at(&mut self, cid: CidBuf, layer: u32) -> Result<Box<Node>, MstError> {
        self.load(cid, Some(layer))?
            .ok_or(MstError::EmptyNode { cid })
    }

    /// The node behind `link` (on `layer`), loading it in place if it is a stub.
    fn resolve<'n>(&mut self, link: &'n mut Link, layer: u32) -> Result<&'n mut Node, MstError> {
        if let Link::Stub(cid) = *link {
            *link = Link::Node(self.load_at(cid, layer)?);
        }
        match link {
            Link::Node(n) => Ok(n),
            Link::Stub(_) => Err(MstError::Poisoned),
        }
    }

    /// Takes ownership of the node behind `link`, loading it if it is a stub.
    fn take(&mut self, link: Link, layer: u32) -> Result<Box<Node>, MstError> {
        match link {
            Link::Node(n) => Ok(n),
            Link::Stub(cid) => self.load_at(cid, layer),
        }
    }

    fn get(&mut self, mut node: &mut Node, key: &[u8], h: u32) -> Result<Option<CidBuf>, MstError> {
        loop {
            if h > node.layer {
                return Ok(None);
            }
            let (i, found) = node.find(key);
            if h == node.layer {
                return Ok(if found {
                    Some(node.entries[i].value)
                } else {
                    None
                });
            }
            let layer = node.layer - 1;
            match node.gap(i) {
                None => return Ok(None),
                Some(link) => node = self.resolve(link, layer)?,
            }
        }
    }

    fn insert(
        &mut self,
        node: &mut Node,
        key: &[u8],
        h: u32,
        value: CidBuf,
    ) -> Result<Option<CidBuf>, MstError> {
        let (i, found) = node.find(key);
        if h == node.layer {
            if found {
                let old = std::mem::replace(&mut node.entries[i].value, value);
                if old != value {
                    node.cid = None;
                }
                return Ok(Some(old));
            }
            node.cid = None;
            let gap = node.gap(i).take();
            let (lo, hi) = self.split(gap, key, node.layer.saturating_sub(1))?;
            *node.gap(i) = lo;
            node.entries.insert(
                i,
                Entry {
                    key: key.into(),
                    value,
                    right: hi,
                },
            );
            return Ok(None);
        }
        // h < node.layer: the key belongs in the subtree of gap i.
        let layer = node.layer - 1;
        let result = match node.gap(i) {
            slot @ None => {
                *slot = Some(Link::Node(chain(key, value, h, layer)));
                None
            }
            Some(link) => {
                let child = self.resolve(link, layer)?;
                self.insert(child, key, h, value)?
            }
        };
        if result != Some(value) {
            node.cid = None;
        }
        Ok(result)
    }

    /// Splits the subtree `link` (on `layer`) into the keys below and above `key` (which is not in
    /// it). Either side is `None` when empty.
    fn split(
        &mut self,
        link: Option<Link>,
        key: &[u8],
        layer: u32,
    ) -> Result<(Option<Link>, Option<Link>), MstError> {
        let Some(link) = link else {
            return Ok((None, None));
        };
        let mut node = self.take(link, layer)?;
        let (i, _) = node.find(key);
        let n = node.entries.len();
        // Nothing straddles the key: the node goes whole to one side, unmodified.
        let gap_empty = node.gap(i).is_none();
        if gap_empty && i == n {
            return Ok((Some(Link::Node(node)), None));
        }
        if gap_empty && i == 0 {
            return Ok((None, Some(Link::Node(node))));
        }
        let upper = node.entries.split_off(i);
        let gap = node.gap(i).take();
        let (lo, hi) = self.split(gap, key, layer.saturating_sub(1))?;
        *node.gap(i) = lo;
        node.cid = None;
        let upper = Box::new(Node {
            layer,
            left: hi,
            entries: upper,
            cid: None,
        });
        Ok((non_void(node), non_void(upper)))
    }

    fn delete(&mut self, node: &mut Node, key: &[u8], h: u32) -> Result<Option<CidBuf>, MstError> {
        if h > node.layer {
            return Ok(None);
        }
        let (i, found) = node.find(key);
        if h == node.layer {
            if !found {
                return Ok(None);
            }
            node.cid = None;
            let removed = node.entries.remove(i);
            let before = node.gap(i).take();
            *node.gap(i) = self.merge(before, removed.right, node.layer.saturating_sub(1))?;
            return Ok(Some(removed.value));
        }
        let layer = node.layer - 1;
        let Some(link) = node.gap(i) else {
            return Ok(None);
        };
        let child = self.resolve(link, layer)?;
        let result = self.delete(child, key, h)?;
        let void = child.is_void();
        if result.is_some() {
            node.cid = None;
            if void {
                *node.gap(i) = None;
            }
        }
        Ok(result)
    }

    /// Joins two adjacent subtrees on `layer` (every key of `a` below every key of `b`).
    fn merge(
        &mut self,
        a: Option<Link>,
        b: Option<Link>,
        layer: u32,
    ) -> Result<Option<Link>, MstError> {
        let (a, b) = match (a, b) {
            (None, x) | (x, None) => return Ok(x),
            (Some(a), Some(b)) => (a, b),
        };
        let mut a = self.take(a, layer)?;
        let mut b = self.take(b, layer)?;
        let n = a.entries.len();
        let a_last = a.gap(n).take();
        let b_first = b.left.take();
        *a.gap(n) = self.merge(a_last, b_first, layer.saturating_sub(1))?;
        a.entries.append(&mut b.entries);
        a.cid = None;
        Ok(Some(Link::Node(a)))
    }
}

/// The node `data` (decoded from block `cid`) describes, on `layer` (`None`: a root).
fn node_of(
    cid: CidBuf,
    data: &NodeData<'_>,
    layer: Option<u32>,
) -> Result<Option<Box<Node>>, MstError> {
    let layer = match (data.layer(), layer) {
        (Some(l), _) => l,
        (None, Some(l)) => {
            if data.left().is_none() {
                return Err(MstError::EmptyNode { cid });
            }
            l
        }
        (None, None) => {
            if data.left().is_some() {
                return Err(MstError::UnprunedRoot { cid });
            }
            return Ok(None);
        }
    };
    let entries = (0..data.len())
        .map(|i| Entry {
            key: data.key(i).into(),
            value: data.value(i).to_buf(),
            right: data.right(i).map(|c| Link::Stub(c.to_buf())),
        })
        .collect();
    Ok(Some(Box::new(Node {
        layer,
        left: data.left().map(|c| Link::Stub(c.to_buf())),
        entries,
        cid: Some(cid),
    })))
}

fn non_void(node: Box<Node>) -> Option<Link> {
    if node.is_void() {
        None
    } else {
        Some(Link::Node(node))
    }
}

/// A subtree on `layer` holding just `key` (of height `h` ≤ `layer`).
fn chain(key: &[u8], value: CidBuf, h: u32, layer: u32) -> Box<Node> {
    let mut node = Box::new(Node {
        layer: h,
        left: None,
        entries: vec![Entry {
            key: key.into(),
            value,
            right: None,
        }],
        cid: None,
    });
    for l in h + 1..=layer {
        node = Box::new(Node {
            layer: l,
            left: Some(Link::Node(node)),
            entries: Vec::new(),
            cid: None,
        });
    }
    node
}

/// Wraps a subtree on layer `from` in entry-less nodes up to layer `to`.
fn lift(link: Option<Link>, from: u32, to: u32) -> Option<Link> {
    let mut link = link?;
    for l in from + 1..=to {
        link = Link::Node(Box::new(Node {
            layer: l,
            left: Some(link),
            entries: Vec::new(),
            cid: None,
        }));
    }
    Some(link)
}

/// A saved state of a [`Tree`], to undo a failed operation ([`Tree::checkpoint`]).
#[derive(Debug, Clone)]
pub struct Checkpoint {
    root: Option<Link>,
}

/// A mutable MST, possibly only partly loaded. See the module docs.
#[derive(Debug, Default)]
pub struct Tree {
    /// `None`: the empty tree.
    root: Option<Link>,
    arena: Arena,
    loaded: Vec<CidBuf>,
    buf: Vec<u8>,
    kids: Vec<Option<CidBuf>>,
    data: NodeData<'static>,
    poisoned: bool,
}

impl Tree {
    /// The empty tree.
    pub fn new() -> Tree {
        Tree::default()
    }

    /// The tree with root `root`, loaded lazily from whatever source later operations are given.
    pub fn load(root: CidBuf) -> Tree {
        Tree {
            root: Some(Link::Stub(root)),
            ..Tree::default()
        }
    }

    /// Makes this the tree with root `root` (as [`Tree::load`]), keeping the buffers it has grown
    /// (decoding arena, node and encoding scratch): a verifier checking one commit after another
    /// reuses one tree instead of growing a fresh one's for every commit.
    pub fn reload(&mut self, root: CidBuf) {
        self.root = Some(Link::Stub(root));
        self.loaded.clear();
        self.kids.clear();
        self.poisoned = false;
    }

    /// The tree's decoding arena, as scratch for a caller's own decoding between operations.
    pub(crate) fn arena(&mut self) -> &mut Arena {
        &mut self.arena
    }

    /// CIDs of the nodes loaded from a source so far, in load order (what the operations needed).
    pub fn loaded(&self) -> &[CidBuf] {
        &self.loaded
    }

    /// Saves the current state (a deep copy of the loaded part of the tree).
    pub fn checkpoint(&self) -> Checkpoint {
        Checkpoint {
            root: self.root.clone(),
        }
    }

    /// Returns to a saved state, making a tree poisoned by a failed operation usable again.
    pub fn rollback(&mut self, checkpoint: Checkpoint) {
        self.root = checkpoint.root;
        self.poisoned = false;
    }

    fn run<S, T>(
        &mut self,
        src: &S,
        modifies: bool,
        op: impl FnOnce(&mut Ctx<'_, S>, &mut Option<Link>) -> Result<T, MstError>,
    ) -> Result<T, MstError>
    where
        S: BlockSource + ?Sized,
    {
        if self.poisoned {
            return Err(MstError::Poisoned);
        }
        let mut ctx = Ctx {
            src,
            arena: &mut self.arena,
            loaded: &mut self.loaded,
            data: &mut self.data,
        };
        // Make sure the root is loaded (and the empty tree is `None`).
        if let Some(Link::Stub(cid)) = self.root {
            match ctx.load(cid, None) {
                Ok(node) => self.root = node.map(Link::Node),
                Err(e) => return Err(e), // nothing was modified: not poisoned
            }
        }
        let result = op(&mut ctx, &mut self.root);
        // Loading a stub in place is not a modification: a failed lookup leaves the tree intact.
        if result.is_err() && modifies {
            self.poisoned = true;
        }
        result
    }

    /// The record CID stored under `key`, if any.
    pub fn get<S: BlockSource + ?Sized>(
        &mut self,
        src: &S,
        key: &[u8],
    ) -> Result<Option<CidBuf>, MstError> {
        let h = key_height(key);
        self.run(src, false, |ctx, root| match root {
            Some(Link::Node(node)) => ctx.get(node, key, h),
            _ => Ok(None),
        })
    }

    /// Sets `key` to `value`; returns the previous value.
    pub fn insert<S: BlockSource + ?Sized>(
        &mut self,
        src: &S,
        key: &[u8],
        value: CidBuf,
    ) -> Result<Option<CidBuf>, MstError> {
        if !is_valid_key(key) {
            return Err(MstError::InvalidKey {
                key: String::from_utf8_lossy(key).into_owned(),
            });
        }
        let h = key_height(key);
        self.run(src, true, |ctx, root| {
            let node = match root.take() {
                None => {
                    *root = Some(Link::Node(chain(key, value, h, h)));
                    return Ok(None);
                }
                Some(Link::Node(node)) => node,
                // `run` loaded the root; a stub here would be a bug.
                Some(stub) => {
                    *root = Some(stub);
                    return Err(MstError::Poisoned);
                }
            };
            if h > node.layer {
                let layer = node.layer;
                let (lo, hi) = ctx.split(Some(Link::Node(node)), key, layer)?;
                let new_root = Node {
                    layer: h,
                    left: lift(lo, layer, h - 1),
                    entries: vec![Entry {
                        key: key.into(),
                        value,
                        right: lift(hi, layer, h - 1),
                    }],
                    cid: None,
                };
                *root = Some(Link::Node(Box::new(new_root)));
                return Ok(None);
            }
            let mut node = node;
            let r = ctx.insert(&mut node, key, h, value);
            *root = Some(Link::Node(node));
            r
        })
    }

    /// Removes `key`; returns its value, or `None` if it was not in the tree.
    pub fn delete<S: BlockSource + ?Sized>(
        &mut self,
        src: &S,
        key: &[u8],
    ) -> Result<Option<CidBuf>, MstError> {
        let h = key_height(key);
        self.run(src, true, |ctx, root| {
            let Some(Link::Node(node)) = root else {
                return Ok(None);
            };
            let r = ctx.delete(node, key, h)?;
            if r.is_some() {
                // Prune entry-less roots. The new root must be looked at (it may need pruning too),
                // except on layer 0.
                loop {
                    match root.take() {
                        Some(Link::Node(mut node)) if node.entries.is_empty() => {
                            let layer = node.layer.saturating_sub(1);
                            match node.left.take() {
                                None => return Ok(r),
                                // A non-empty node on layer 0 has entries: no need to look.
                                Some(link) if layer == 0 => {
                                    *root = Some(link);
                                    break;
                                }
                                Some(link) => *root = Some(Link::Node(ctx.take(link, layer)?)),
                            }
                        }
                        other => {
                            *root = other;
                            break;
                        }
                    }
                }
            }
            Ok(r)
        })
    }

    /// The root CID, re-encoding modified nodes.
    pub fn root_cid(&mut self) -> Result<CidBuf, MstError> {
        if self.poisoned {
            return Err(MstError::Poisoned);
        }
        Ok(match &mut self.root {
            None => empty_root_cid(),
            Some(Link::Stub(cid)) => *cid,
            Some(Link::Node(node)) => hash_node(node, &mut self.buf, &mut self.kids, &mut RootOnly),
        })
    }

    /// The root CID, handing the block of every node (re-)encoded on the way to `sink`: the new
    /// nodes of a commit after a sequence of operations on a loaded tree.
    pub fn root_cid_with_blocks(
        &mut self,
        sink: &mut Vec<(CidBuf, Vec<u8>)>,
    ) -> Result<CidBuf, MstError> {
        if self.poisoned {
            return Err(MstError::Poisoned);
        }
        Ok(match &mut self.root {
            None => {
                let cid = empty_root_cid();
                sink.push((cid, crate::mst::node::EMPTY_NODE.to_vec()));
                cid
            }
            Some(Link::Stub(cid)) => *cid,
            Some(Link::Node(node)) => hash_node(node, &mut self.buf, &mut self.kids, sink),
        })
    }
}

fn link_cid(
    link: &mut Option<Link>,
    buf: &mut Vec<u8>,
    kids: &mut Vec<Option<CidBuf>>,
    sink: &mut dyn BlockSink,
) -> Option<CidBuf> {
    match link {
        None => None,
        Some(Link::Stub(cid)) => Some(*cid),
        Some(Link::Node(n)) => Some(hash_node(n, buf, kids, sink)),
    }
}

/// The CID of `node`, computing (and caching) it and those of its modified descendants.
fn hash_node(
    node: &mut Node,
    buf: &mut Vec<u8>,
    kids: &mut Vec<Option<CidBuf>>,
    sink: &mut dyn BlockSink,
) -> CidBuf {
    if let Some(cid) = node.cid {
        return cid;
    }
    let base = kids.len();
    let left = link_cid(&mut node.left, buf, kids, sink);
    kids.push(left);
    for e in node.entries.iter_mut() {
        let c = link_cid(&mut e.right, buf, kids, sink);
        kids.push(c);
    }
    buf.clear();
    write_node_head(buf, node.entries.len());
    let mut prev: &[u8] = &[];
    for (j, e) in node.entries.iter().enumerate() {
        let right: Option<Cid<'_>> = kids[base + 1 + j].as_ref().map(|c| c.as_cid());
        write_entry(buf, prev, &e.key, e.value.as_cid(), right);
        prev = &e.key;
    }
    write_node_tail(buf, kids[base].as_ref().map(|c| c.as_cid()));
    kids.truncate(base);
    let cid = CidBuf::from_sha256_digest(DAG_CBOR, &Sha256::digest(&buf[..]));
    sink.block(cid, buf);
    node.cid = Some(cid);
    cid
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mst::build::build;
    use crate::source::NoBlocks;
    use std::collections::HashMap;

    fn val(i: u32) -> CidBuf {
        CidBuf::sha256(DAG_CBOR, &i.to_be_bytes())
    }

    /// Key `i` of `ks` with value `val(i)`, in key order (what `build` takes).
    fn sorted_leaves(ks: &[String]) -> Vec<(String, CidBuf)> {
        let mut sorted: Vec<(String, CidBuf)> = ks
            .iter()
            .enumerate()
            .map(|(i, k)| (k.clone(), val(i as u32)))
            .collect();
        sorted.sort();
        sorted
    }

    fn keys(n: usize) -> Vec<String> {
        (0..n)
            .map(|i| format!("com.example.record/{:05}", i * 7919 % 100_000))
            .collect()
    }

    #[test]
    fn keys_inline_and_on_the_heap_are_the_same_keys() {
        // Lengths on both sides of the inline limit, loaded lazily and modified.
        let ks: Vec<String> = (0..120)
            .map(|i| {
                let pad = "x".repeat([0, 20, 27, 28, 29, 100, 600][i % 7]);
                format!("com.example.r{pad}/{:05}", i * 7919 % 100_000)
            })
            .collect();
        assert!(ks.iter().any(|k| k.len() == INLINE_KEY));
        assert!(ks.iter().any(|k| k.len() == INLINE_KEY + 1));
        let sorted = sorted_leaves(&ks);
        let (root, blocks) = build(&sorted).unwrap();
        let store: HashMap<CidBuf, Vec<u8>> = blocks.into_iter().collect();
        let mut lazy = Tree::load(root);
        for (i, k) in ks.iter().enumerate() {
            assert_eq!(lazy.get(&store, k.as_bytes()).unwrap(), Some(val(i as u32)));
            assert_eq!(&*Key::from(k.as_bytes()), k.as_bytes());
        }
        for k in ks.iter().step_by(3) {
            assert!(lazy.delete(&store, k.as_bytes()).unwrap().is_some());
        }
        let rest: Vec<(String, CidBuf)> = sorted
            .iter()
            .filter(|(k, _)| !ks.iter().step_by(3).any(|d| d == k))
            .cloned()
            .collect();
        assert_eq!(
            lazy.root_cid().unwrap(),
            crate::mst::build::root_cid(&rest).unwrap()
        );
    }

    #[test]
    fn incremental_equals_build() {
        let ks = keys(300);
        let mut tree = Tree::new();
        for (i, k) in ks.iter().enumerate() {
            assert_eq!(
                tree.insert(&NoBlocks, k.as_bytes(), val(i as u32)).unwrap(),
                None
            );
        }
        let sorted = sorted_leaves(&ks);
        let (root, blocks) = build(&sorted).unwrap();
        assert_eq!(tree.root_cid().unwrap(), root);

        // Load lazily from the built blocks, delete half, compare with a rebuild.
        let store: HashMap<CidBuf, Vec<u8>> = blocks.into_iter().collect();
        let mut lazy = Tree::load(root);
        for (i, k) in ks.iter().enumerate() {
            assert_eq!(lazy.get(&store, k.as_bytes()).unwrap(), Some(val(i as u32)));
        }
        for k in ks.iter().step_by(2) {
            assert!(lazy.delete(&store, k.as_bytes()).unwrap().is_some());
            assert!(tree.delete(&NoBlocks, k.as_bytes()).unwrap().is_some());
        }
        let rest: Vec<(String, CidBuf)> = sorted
            .iter()
            .filter(|(k, _)| !ks.iter().step_by(2).any(|d| d == k))
            .cloned()
            .collect();
        let expect = crate::mst::build::root_cid(&rest).unwrap();
        assert_eq!(lazy.root_cid().unwrap(), expect);
        assert_eq!(tree.root_cid().unwrap(), expect);
        // Delete everything: the empty tree.
        for k in ks.iter().skip(1).step_by(2) {
            assert!(tree.delete(&NoBlocks, k.as_bytes()).unwrap().is_some());
        }
        assert_eq!(tree.root_cid().unwrap(), empty_root_cid());
    }

    #[test]
    fn update_and_absent_keys() {
        let mut tree = Tree::new();
        tree.insert(&NoBlocks, b"a.b/c", val(1)).unwrap();
        assert_eq!(
            tree.insert(&NoBlocks, b"a.b/c", val(2)).unwrap(),
            Some(val(1))
        );
        assert_eq!(tree.get(&NoBlocks, b"a.b/c").unwrap(), Some(val(2)));
        assert_eq!(tree.get(&NoBlocks, b"a.b/d").unwrap(), None);
        assert_eq!(tree.delete(&NoBlocks, b"a.b/d").unwrap(), None);
        assert!(matches!(
            tree.insert(&NoBlocks, b"bad", val(1)),
            Err(MstError::InvalidKey { .. })
        ));
    }

    #[test]
    fn stub_root_needs_its_block() {
        let root = val(9);
        let mut tree = Tree::load(root);
        assert_eq!(tree.root_cid().unwrap(), root);
        assert_eq!(
            tree.get(&NoBlocks, b"a.b/c"),
            Err(MstError::MissingBlock(root))
        );
        // A failed read or a failure to load the root leaves the tree usable.
        assert_eq!(tree.root_cid().unwrap(), root);
        assert_eq!(
            tree.delete(&NoBlocks, b"a.b/c"),
            Err(MstError::MissingBlock(root))
        );
    }
}
