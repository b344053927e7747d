//! One MST node: strict decoding with structural checks, and deterministic encoding.
//!
//! Why: every MST algorithm here (walk, build, the partial tree) reads or writes nodes, and the
//! rules that make a node canonical are local to it: the exact field set `{e, l}` and
//! `{k, p, t, v}`, prefix lengths that are the *exact* common prefix with the previous key,
//! strictly ascending keys, and every key on the node's layer. Checking them in one place means a
//! node that decodes here re-encodes to the very same bytes, so its CID can be trusted as a
//! cache of its encoding.
//!
//! Decoding goes through the zero-copy tape of `riptide-cbor` into a reusable [`NodeData`]: the
//! full keys are rebuilt into one byte buffer, CIDs stay borrowed from the block. Once the buffers
//! are warm a decode allocates nothing.
//!
//! What it does not do: look at other nodes. Ordering across nodes, child layers and empty
//! subtrees are the business of the walker and the tree.

use riptide_cbor::{
    write_array_header, write_bytes, write_int, write_link, write_map_header, write_null,
    write_text, Arena, Cid, CidBuf, Kind, Options, Value, DAG_CBOR,
};

use crate::error::MstError;
use crate::mst::height::{
    common_prefix_len, key_height, key_height_pair, key_slash, key_slash_after,
};

/// The encoding of the empty node `{e: [], l: null}`: the root of an empty repository.
pub const EMPTY_NODE: [u8; 7] = [0xa2, 0x61, b'e', 0x80, 0x61, b'l', 0xf6];

/// The CID of [`EMPTY_NODE`] (`bafyreie5737gdxlw5i64vzichcalba3z2v5n6icifvx5xytvske7mr3hpm`).
pub fn empty_root_cid() -> CidBuf {
    static EMPTY: std::sync::OnceLock<CidBuf> = std::sync::OnceLock::new();
    *EMPTY.get_or_init(|| CidBuf::sha256(DAG_CBOR, &EMPTY_NODE))
}

#[derive(Clone, Copy, Debug)]
struct EntryRef<'a> {
    key_end: u32,
    value: Cid<'a>,
    right: Option<Cid<'a>>,
}

/// A decoded node: its left subtree, and entries with full keys (prefix compression undone).
/// CIDs borrow the block; keys live in one reusable buffer. Reuse one value across decodes.
#[derive(Debug, Default)]
pub struct NodeData<'a> {
    left: Option<Cid<'a>>,
    entries: Vec<EntryRef<'a>>,
    keys: Vec<u8>,
    layer: Option<u32>,
    /// Where the slash of the last key is.
    last_slash: usize,
}

impl<'a> NodeData<'a> {
    /// An empty value to decode into.
    pub fn new() -> NodeData<'a> {
        NodeData::default()
    }

    /// This value emptied, its buffers kept, for decoding blocks of another lifetime (a caller
    /// that loads nodes from short-lived borrows keeps one across them instead of allocating
    /// afresh for every node).
    pub fn recycle<'b>(self) -> NodeData<'b> {
        let NodeData {
            entries, mut keys, ..
        } = self;
        keys.clear();
        NodeData {
            left: None,
            // Empty, and collected in place: the allocation is reused, nothing is borrowed.
            // (`filter_map`, not `filter`: the item type changes with the lifetime.)
            #[allow(clippy::unnecessary_filter_map)]
            entries: entries.into_iter().filter_map(|_| None).collect(),
            keys,
            layer: None,
            last_slash: 0,
        }
    }

    fn clear(&mut self) {
        self.left = None;
        self.entries.clear();
        self.keys.clear();
        self.layer = None;
    }

    /// The left subtree (`l`).
    #[inline]
    pub fn left(&self) -> Option<Cid<'a>> {
        self.left
    }

    /// Number of entries.
    #[inline]
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the node has no entries.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The layer of the node's keys, or `None` for a node without entries.
    #[inline]
    pub fn layer(&self) -> Option<u32> {
        self.layer
    }

    /// The full key of entry `i`. Panics if `i >= len()`.
    #[inline]
    pub fn key(&self, i: usize) -> &[u8] {
        let start = if i == 0 {
            0
        } else {
            self.entries[i - 1].key_end as usize
        };
        &self.keys[start..self.entries[i].key_end as usize]
    }

    /// The record CID (`v`) of entry `i`. Panics if `i >= len()`.
    #[inline]
    pub fn value(&self, i: usize) -> Cid<'a> {
        self.entries[i].value
    }

    /// The subtree to the right of entry `i` (`t`). Panics if `i >= len()`.
    #[inline]
    pub fn right(&self, i: usize) -> Option<Cid<'a>> {
        self.entries[i].right
    }

    /// Whether the node points to any subtree.
    pub fn has_subtrees(&self) -> bool {
        self.left.is_some() || self.entries.iter().any(|e| e.right.is_some())
    }
}

fn lossy(key: &[u8]) -> String {
    String::from_utf8_lossy(key).into_owned()
}

/// The error for `key`, in node `cid`, whose height is `found` where its node's layer is
/// `expected`.
pub(crate) fn wrong_layer(cid: Cid<'_>, key: &[u8], expected: u32, found: u32) -> MstError {
    MstError::WrongLayer {
        cid: cid.to_buf(),
        key: lossy(key),
        expected,
        found,
    }
}

fn link_in<'a>(v: Value<'_>, block: &'a [u8]) -> Option<Cid<'a>> {
    if v.kind() != Kind::Link {
        return None;
    }
    let r = v.byte_range()?;
    Cid::from_bytes(block.get(r)?).ok()
}

fn bytes_in<'a>(v: Value<'_>, block: &'a [u8]) -> Option<&'a [u8]> {
    if v.kind() != Kind::Bytes {
        return None;
    }
    block.get(v.byte_range()?)
}

/// Decodes MST node `block` (whose CID is `cid`, for error reports) into `out`.
///
/// Checks: strict DAG-CBOR; exactly the fields `e`, `l` and per entry `k`, `p`, `t`, `v` with
/// their types; `p` is the exact common prefix length with the previous key (0 for the first);
/// keys strictly ascending and valid repository paths; every key of the same height, equal to
/// `expected_layer` when given; no subtree pointers on layer 0.
///
/// Two paths, one verdict. Canonical DAG-CBOR leaves a node exactly one byte layout, so
/// `decode_canonical` reads that layout directly, about three times faster than the general
/// tape (the walk of a large repository is mostly node decoding). Anything it does not accept,
/// valid or not, goes through `decode_general`, which decides and explains: the fast path only
/// ever accepts nodes the general one accepts, with the same result (tested on real nodes and on
/// every single-byte mutation of them).
pub fn decode_node<'a>(
    arena: &mut Arena,
    cid: Cid<'_>,
    block: &'a [u8],
    expected_layer: Option<u32>,
    out: &mut NodeData<'a>,
) -> Result<(), MstError> {
    if decode_canonical(cid, block, expected_layer, true, out) {
        return Ok(());
    }
    decode_general(arena, cid, block, expected_layer, out)
}

/// [`decode_node`] for a node that must be on `layer`, except that the keys' heights are not
/// computed: the node is decoded as if every key had height `layer`, and the caller must check
/// each key's height itself (the walk queues them to hash sixteen at a time). Every other check
/// is made. A block the fast path does not accept goes through the general path, which checks
/// heights as [`decode_node`] does.
pub(crate) fn decode_node_on_layer<'a>(
    arena: &mut Arena,
    cid: Cid<'_>,
    block: &'a [u8],
    layer: u32,
    out: &mut NodeData<'a>,
) -> Result<(), MstError> {
    if decode_canonical(cid, block, Some(layer), false, out) {
        return Ok(());
    }
    decode_general(arena, cid, block, Some(layer), out)
}

/// The general path of [`decode_node`]: the strict tape decoder, then the fields by name. Slower,
/// and the one that names what is wrong.
pub(crate) fn decode_general<'a>(
    arena: &mut Arena,
    cid: Cid<'_>,
    block: &'a [u8],
    expected_layer: Option<u32>,
    out: &mut NodeData<'a>,
) -> Result<(), MstError> {
    out.clear();
    let malformed = |reason: &'static str| MstError::Malformed {
        cid: cid.to_buf(),
        reason,
    };
    let mut tape = arena.tape(block);
    let item = tape
        .decode(0..block.len(), &Options::strict())
        .map_err(|e| MstError::Cbor {
            cid: cid.to_buf(),
            kind: e.kind(),
            offset: e.offset(),
        })?;
    let doc = tape.finish();
    let root = doc.value(item);
    if root.kind() != Kind::Map {
        return Err(malformed("node is not a map"));
    }
    let mut entries = None;
    let mut left_seen = false;
    for (name, v) in root.entries() {
        match name {
            "e" => {
                entries = Some(
                    v.array()
                        .ok_or_else(|| malformed("node field e is not an array"))?,
                )
            }
            "l" => {
                left_seen = true;
                if !v.is_null() {
                    out.left = Some(
                        link_in(v, block)
                            .ok_or_else(|| malformed("node field l is not a link or null"))?,
                    );
                }
            }
            _ => return Err(malformed("node has a field other than e and l")),
        }
    }
    let entries = entries.ok_or_else(|| malformed("node has no field e"))?;
    if !left_seen {
        return Err(malformed("node has no field l"));
    }

    let mut layer = expected_layer;
    for (index, ent) in entries.enumerate() {
        if ent.kind() != Kind::Map {
            return Err(malformed("entry is not a map"));
        }
        let (mut k, mut p, mut t, mut v) = (None, None, None, None);
        for (name, val) in ent.entries() {
            match name {
                "k" => {
                    k = Some(
                        bytes_in(val, block)
                            .ok_or_else(|| malformed("entry field k is not bytes"))?,
                    )
                }
                "p" => {
                    let n = val.as_i64().filter(|n| *n >= 0);
                    p =
                        Some(n.ok_or_else(|| {
                            malformed("entry field p is not a non-negative integer")
                        })?);
                }
                "t" => {
                    t = Some(if val.is_null() {
                        None
                    } else {
                        Some(
                            link_in(val, block)
                                .ok_or_else(|| malformed("entry field t is not a link or null"))?,
                        )
                    })
                }
                "v" => {
                    v = Some(
                        link_in(val, block)
                            .ok_or_else(|| malformed("entry field v is not a link"))?,
                    )
                }
                _ => return Err(malformed("entry has a field other than k, p, t and v")),
            }
        }
        let k = k.ok_or_else(|| malformed("entry has no field k"))?;
        let p = p.ok_or_else(|| malformed("entry has no field p"))?;
        let right = t.ok_or_else(|| malformed("entry has no field t"))?;
        let value = v.ok_or_else(|| malformed("entry has no field v"))?;
        push_entry(cid, out, index, k, p as u64, value, right, Some(&mut layer))?;
    }
    finish_node(cid, out, layer)
}

/// The fast path of [`decode_node`]: reads the one canonical byte layout of a node,
///
/// ```text
/// a2 61 'e' <array n> { a4 61 'k' <bytes> 61 'p' <uint> 61 't' <link|null> 61 'v' <link> }*n
///    61 'l' <link|null>
/// ```
///
/// with minimal heads, and applies the same per-entry checks as the general path. Returns false
/// at the first thing it does not accept (the caller then runs the general path, which also
/// produces the error); `out` is then in an unspecified state.
fn decode_canonical<'a>(
    cid: Cid<'_>,
    block: &'a [u8],
    expected_layer: Option<u32>,
    heights: bool,
    out: &mut NodeData<'a>,
) -> bool {
    out.clear();
    // The general path's input limit, so that both accept the same blocks.
    if block.len() > riptide_cbor::Limits::default().max_input {
        return false;
    }
    let mut r = Canonical { b: block, pos: 0 };
    if !r.eat(&[0xa2, 0x61, b'e']) {
        return false;
    }
    let Some(n) = r.head(4) else { return false };
    let mut layer = expected_layer;
    for index in 0..n as usize {
        if !r.eat(&[0xa4, 0x61, b'k']) {
            return false;
        }
        let Some(k) = r.head(2).and_then(|len| r.take(len)) else {
            return false;
        };
        if !r.eat(&[0x61, b'p']) {
            return false;
        }
        let Some(p) = r.head(0).filter(|&p| p <= i64::MAX as u64) else {
            return false;
        };
        if !r.eat(&[0x61, b't']) {
            return false;
        }
        let right = if r.eat(&[0xf6]) {
            None
        } else {
            match r.link() {
                Some(c) => Some(c),
                None => return false,
            }
        };
        if !r.eat(&[0x61, b'v']) {
            return false;
        }
        let Some(value) = r.link() else { return false };
        if push_entry(cid, out, index, k, p, value, right, None).is_err() {
            return false;
        }
    }
    // Heights for the whole node, unless the caller checks them (it can only when it names the
    // layer).
    let n = out.len();
    if (heights || layer.is_none()) && !keys_on_one_layer(out, &mut layer) {
        return false;
    }
    out.layer = if n == 0 { None } else { layer };
    if !r.eat(&[0x61, b'l']) {
        return false;
    }
    if !r.eat(&[0xf6]) {
        match r.link() {
            Some(c) => out.left = Some(c),
            None => return false,
        }
    }
    r.pos == block.len() && finish_node(cid, out, layer).is_ok()
}

/// Whether every key of `out` has the same height, `layer` when it is given (else `layer` is set
/// to it). Keys are hashed two at a time.
fn keys_on_one_layer(out: &NodeData<'_>, layer: &mut Option<u32>) -> bool {
    let n = out.len();
    let mut i = 0;
    while i < n {
        let (a, b) = if i + 1 < n {
            let (a, b) = key_height_pair(out.key(i), out.key(i + 1));
            (a, Some(b))
        } else {
            (key_height(out.key(i)), None)
        };
        for h in std::iter::once(a).chain(b) {
            match *layer {
                None => *layer = Some(h),
                Some(want) if want != h => return false,
                Some(_) => {}
            }
        }
        i += 2;
    }
    true
}

/// A cursor over one node's bytes for [`decode_canonical`]: every read either matches the
/// canonical form or fails.
struct Canonical<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Canonical<'a> {
    /// Consumes `bytes` if they come next.
    #[inline(always)]
    fn eat(&mut self, bytes: &[u8]) -> bool {
        if self.b[self.pos.min(self.b.len())..].starts_with(bytes) {
            self.pos += bytes.len();
            true
        } else {
            false
        }
    }

    /// A head of `major` with its argument in the shortest form; for byte strings and arrays
    /// the argument must also fit in the bytes that remain.
    #[inline(always)]
    fn head(&mut self, major: u8) -> Option<u64> {
        let &ib = self.b.get(self.pos)?;
        if ib >> 5 != major {
            return None;
        }
        let info = ib & 0x1f;
        let (arg, n) = match info {
            0..=23 => (u64::from(info), 0),
            24 => (u64::from(*self.b.get(self.pos + 1)?), 1),
            25 => (
                u64::from(u16::from_be_bytes(
                    self.b.get(self.pos + 1..self.pos + 3)?.try_into().ok()?,
                )),
                2,
            ),
            26 => (
                u64::from(u32::from_be_bytes(
                    self.b.get(self.pos + 1..self.pos + 5)?.try_into().ok()?,
                )),
                4,
            ),
            _ => return None,
        };
        let minimal = match n {
            0 => true,
            1 => arg >= 24,
            2 => arg > 0xff,
            _ => arg > 0xffff,
        };
        if !minimal {
            return None;
        }
        self.pos += 1 + n;
        if major != 0 && arg > (self.b.len() - self.pos) as u64 {
            return None;
        }
        Some(arg)
    }

    #[inline(always)]
    fn take(&mut self, len: u64) -> Option<&'a [u8]> {
        let s = self.b.get(self.pos..self.pos.checked_add(len as usize)?)?;
        self.pos += s.len();
        Some(s)
    }

    /// Tag 42 over a byte string holding 0x00 and a binary CID.
    #[inline(always)]
    fn link(&mut self) -> Option<Cid<'a>> {
        if !self.eat(&[0xd8, 0x2a]) {
            return None;
        }
        let len = self.head(2)?;
        let content = self.take(len)?;
        match content.split_first() {
            Some((0, cid)) => Cid::from_bytes(cid).ok(),
            _ => None,
        }
    }
}

/// One decoded entry's checks and bookkeeping, shared by both paths: undoes the prefix
/// compression against the previous key, checks prefix maximality, order, key syntax and layer,
/// and appends the entry to `out`.
#[allow(clippy::too_many_arguments)]
#[inline]
fn push_entry<'a>(
    cid: Cid<'_>,
    out: &mut NodeData<'a>,
    index: usize,
    k: &[u8],
    p: u64,
    value: Cid<'a>,
    right: Option<Cid<'a>>,
    layer: Option<&mut Option<u32>>,
) -> Result<(), MstError> {
    let prev_end = out.keys.len();
    let prev_start = match index {
        0 => 0,
        1 => 0,
        _ => out.entries[index - 2].key_end as usize,
    };
    let prev_len = prev_end - prev_start;
    let bad_prefix = || MstError::BadPrefix {
        cid: cid.to_buf(),
        index,
    };
    if p > prev_len as u64 {
        return Err(bad_prefix());
    }
    let p = p as usize;
    if index > 0 {
        if p < prev_len {
            match k.first() {
                // The prefix must be maximal: the next byte has to differ.
                Some(&c) if c == out.keys[prev_start + p] => return Err(bad_prefix()),
                Some(&c) if c > out.keys[prev_start + p] => {}
                // A proper prefix of, or smaller than, the previous key.
                _ => {
                    let mut key = out.keys[prev_start..prev_start + p].to_vec();
                    key.extend_from_slice(k);
                    return Err(MstError::KeyOrder {
                        cid: cid.to_buf(),
                        key: lossy(&key),
                    });
                }
            }
        } else if k.is_empty() {
            // Same as the previous key.
            let key = out.keys[prev_start..prev_end].to_vec();
            return Err(MstError::KeyOrder {
                cid: cid.to_buf(),
                key: lossy(&key),
            });
        }
    }
    out.keys.extend_from_within(prev_start..prev_start + p);
    out.keys.extend_from_slice(k);
    let key = &out.keys[prev_end..];
    // After the first entry, the key starts with `p` bytes of the previous (valid) key.
    let slash = if index == 0 {
        key_slash(key)
    } else {
        key_slash_after(key, p, out.last_slash)
    };
    let Some(slash) = slash else {
        return Err(MstError::InvalidKey { key: lossy(key) });
    };
    // Heights are checked here unless the caller checks them for the whole node (`None`).
    let h = match layer {
        Some(layer) => {
            let h = key_height(key);
            match *layer {
                None => *layer = Some(h),
                Some(want) if want != h => return Err(wrong_layer(cid, key, want, h)),
                Some(_) => {}
            }
            Some(h)
        }
        None => None,
    };
    if out.keys.len() > u32::MAX as usize {
        return Err(MstError::Malformed {
            cid: cid.to_buf(),
            reason: "node keys too long",
        });
    }
    out.last_slash = slash;
    out.entries.push(EntryRef {
        key_end: out.keys.len() as u32,
        value,
        right,
    });
    if index == 0 {
        out.layer = h;
    }
    Ok(())
}

/// The node-level check after the last entry: no subtree pointers on layer 0.
#[inline]
fn finish_node(cid: Cid<'_>, out: &NodeData<'_>, layer: Option<u32>) -> Result<(), MstError> {
    if layer == Some(0) && out.has_subtrees() {
        return Err(MstError::SubtreeBelowLayerZero { cid: cid.to_buf() });
    }
    Ok(())
}

/// Starts a node: `{"e": [` with `n` entries to follow.
#[inline]
pub(crate) fn write_node_head(out: &mut Vec<u8>, n: usize) {
    write_map_header(out, 2);
    write_text(out, "e");
    write_array_header(out, n);
}

/// Appends one entry, prefix-compressed against `prev_key` (empty for the first entry).
#[inline]
pub(crate) fn write_entry(
    out: &mut Vec<u8>,
    prev_key: &[u8],
    key: &[u8],
    value: Cid<'_>,
    right: Option<Cid<'_>>,
) {
    let p = common_prefix_len(prev_key, key);
    if !write_entry_short(out, p, &key[p..], value, right) {
        write_entry_general(out, p, &key[p..], value, right);
    }
}

/// The longest key suffix [`write_entry_short`] takes (a TID record key is 13 bytes; a new
/// collection's first key, written whole, is rarely longer than 60).
const SHORT_SUFFIX: usize = 64;

/// [`write_entry_general`]'s bytes for the usual entry, one whose CIDs are 36 bytes (CIDv1,
/// SHA-256) and whose key suffix and prefix length are short, assembled on the stack and
/// appended at once. Why: the general path appends ten small pieces, each a capacity check and
/// most a `memcpy` call of a length only known at run time; re-encoding the inverted path of a
/// commit proof spent ~44 ns an entry that way (`examples/encode_rate.rs`). Returns false,
/// having written nothing, for any other entry.
#[inline]
fn write_entry_short(
    out: &mut Vec<u8>,
    p: usize,
    suffix: &[u8],
    value: Cid<'_>,
    right: Option<Cid<'_>>,
) -> bool {
    // A link's head: tag 42, a byte string of 37 bytes, the 0x00 multibase prefix.
    const LINK36: [u8; 5] = [0xd8, 0x2a, 0x58, 0x25, 0x00];
    let Ok(value) = <&[u8; 36]>::try_from(value.as_bytes()) else {
        return false;
    };
    let right = match right.map(|c| <&[u8; 36]>::try_from(c.as_bytes())) {
        None => None,
        Some(Ok(r)) => Some(r),
        Some(Err(_)) => return false,
    };
    if suffix.len() > SHORT_SUFFIX || p > 0xff {
        return false;
    }
    // 5 (map, "k", head) + 64 + 4 ("p", int) + 2 + 41 ("t", link) + 2 + 41 ("v", link) = 159.
    let mut b = [0u8; 160];
    b[..3].copy_from_slice(&[0xa4, 0x61, b'k']);
    let mut n = 3;
    if suffix.len() < 24 {
        b[n] = 0x40 | suffix.len() as u8;
        n += 1;
    } else {
        b[n..n + 2].copy_from_slice(&[0x58, suffix.len() as u8]);
        n += 2;
    }
    b[n..n + suffix.len()].copy_from_slice(suffix);
    n += suffix.len();
    b[n..n + 2].copy_from_slice(&[0x61, b'p']);
    n += 2;
    if p < 24 {
        b[n] = p as u8;
        n += 1;
    } else {
        b[n..n + 2].copy_from_slice(&[0x18, p as u8]);
        n += 2;
    }
    b[n..n + 2].copy_from_slice(&[0x61, b't']);
    n += 2;
    match right {
        Some(r) => {
            b[n..n + 5].copy_from_slice(&LINK36);
            b[n + 5..n + 41].copy_from_slice(r);
            n += 41;
        }
        None => {
            b[n] = 0xf6;
            n += 1;
        }
    }
    b[n..n + 2].copy_from_slice(&[0x61, b'v']);
    b[n + 2..n + 7].copy_from_slice(&LINK36);
    b[n + 7..n + 43].copy_from_slice(value);
    n += 43;
    out.extend_from_slice(&b[..n]);
    true
}

/// Appends one entry whose key shares `p` bytes with the previous one and ends in `suffix`.
fn write_entry_general(
    out: &mut Vec<u8>,
    p: usize,
    suffix: &[u8],
    value: Cid<'_>,
    right: Option<Cid<'_>>,
) {
    write_map_header(out, 4);
    write_text(out, "k");
    write_bytes(out, suffix);
    write_text(out, "p");
    write_int(out, p as i64);
    write_text(out, "t");
    match right {
        Some(c) => write_link(out, c),
        None => write_null(out),
    }
    write_text(out, "v");
    write_link(out, value);
}

/// Ends a node: `], "l": left}`.
#[inline]
pub(crate) fn write_node_tail(out: &mut Vec<u8>, left: Option<Cid<'_>>) {
    write_text(out, "l");
    match left {
        Some(c) => write_link(out, c),
        None => write_null(out),
    }
}

/// Appends the canonical encoding of a node with subtree `left` and `entries` given as
/// `(full key, record CID, right subtree)` in ascending key order.
pub fn encode_node(
    out: &mut Vec<u8>,
    left: Option<Cid<'_>>,
    entries: &[(&[u8], Cid<'_>, Option<Cid<'_>>)],
) {
    write_node_head(out, entries.len());
    let mut prev: &[u8] = &[];
    for &(key, value, right) in entries {
        write_entry(out, prev, key, value, right);
        prev = key;
    }
    write_node_tail(out, left);
}

#[cfg(test)]
mod tests {
    use super::*;
    use riptide_cbor::OwnedValue;
    use std::collections::BTreeMap;

    fn leaf() -> CidBuf {
        CidBuf::parse("bafyreie5cvv4h45feadgeuwhbcutmh6t2ceseocckahdoe6uat64zmz454").unwrap()
    }

    fn decode(
        bytes: &[u8],
        expected: Option<u32>,
    ) -> Result<(Vec<Vec<u8>>, Option<u32>), MstError> {
        let mut arena = Arena::new();
        let mut out = NodeData::new();
        let cid = CidBuf::sha256(DAG_CBOR, bytes);
        decode_node(&mut arena, cid.as_cid(), bytes, expected, &mut out)?;
        Ok((
            (0..out.len()).map(|i| out.key(i).to_vec()).collect(),
            out.layer(),
        ))
    }

    fn entry(p: i64, k: &[u8], t: Option<CidBuf>) -> OwnedValue {
        let mut m = BTreeMap::new();
        m.insert("k".into(), OwnedValue::Bytes(k.to_vec()));
        m.insert("p".into(), OwnedValue::Int(p));
        m.insert("t".into(), t.map_or(OwnedValue::Null, OwnedValue::Link));
        m.insert("v".into(), OwnedValue::Link(leaf()));
        OwnedValue::Map(m)
    }

    fn node(l: Option<CidBuf>, e: Vec<OwnedValue>) -> Vec<u8> {
        let mut m = BTreeMap::new();
        m.insert("e".into(), OwnedValue::Array(e));
        m.insert("l".into(), l.map_or(OwnedValue::Null, OwnedValue::Link));
        OwnedValue::Map(m).to_cbor()
    }

    /// Both ways of writing an entry against the general DAG-CBOR encoder, across every
    /// boundary of the short path: suffix heads (23/24 bytes), its longest suffix (64), one-
    /// and two-byte prefix lengths (23/24, 255/256), and CIDs of 36 bytes and longer.
    #[test]
    fn entries_are_written_as_the_general_encoder_writes_them() {
        let mut long = vec![0x01, 0x71, 0x13, 0x40];
        long.extend((0..64).map(|i| i as u8));
        let long = CidBuf::from_bytes(&long).unwrap();
        let short = leaf();
        let mut checked = 0;
        for p in [0usize, 1, 23, 24, 255, 256, 1000] {
            for len in 0..=70usize {
                for right in [None, Some(&short), Some(&long)] {
                    for value in [&short, &long] {
                        let prev = vec![b'a'; p];
                        let mut key = prev.clone();
                        key.extend((0..len).map(|i| b'0' + (i % 10) as u8));
                        let mut m = BTreeMap::new();
                        m.insert("k".into(), OwnedValue::Bytes(key[p..].to_vec()));
                        m.insert("p".into(), OwnedValue::Int(p as i64));
                        m.insert(
                            "t".into(),
                            right.map_or(OwnedValue::Null, |c| OwnedValue::Link(*c)),
                        );
                        m.insert("v".into(), OwnedValue::Link(*value));
                        let want = OwnedValue::Map(m).to_cbor();
                        let mut got = vec![0xaa];
                        write_entry(
                            &mut got,
                            &prev,
                            &key,
                            value.as_cid(),
                            right.map(|c| c.as_cid()),
                        );
                        assert_eq!(got[1..], want[..], "p {p} suffix {len}");
                        let mut general = Vec::new();
                        write_entry_general(
                            &mut general,
                            p,
                            &key[p..],
                            value.as_cid(),
                            right.map(|c| c.as_cid()),
                        );
                        assert_eq!(general, want, "p {p} suffix {len}");
                        checked += 1;
                    }
                }
            }
        }
        assert_eq!(checked, 7 * 71 * 3 * 2);
    }

    #[test]
    fn recycled_data_is_empty_and_keeps_its_buffers() {
        let bytes = node(
            None,
            vec![
                entry(0, b"app.bsky.feed.post/3l2a", None),
                entry(22, b"b", None),
            ],
        );
        let mut arena = Arena::new();
        let mut out = NodeData::new();
        let cid = CidBuf::sha256(DAG_CBOR, &bytes);
        decode_node(&mut arena, cid.as_cid(), &bytes, None, &mut out).unwrap();
        assert_eq!(out.key(1), b"app.bsky.feed.post/3l2b");
        let (entries, keys) = (out.entries.capacity(), out.keys.capacity());
        assert!(entries >= 2 && keys >= 46);
        let mut again: NodeData<'_> = out.recycle();
        assert!(again.is_empty() && again.left().is_none() && again.layer().is_none());
        assert_eq!(again.entries.capacity(), entries);
        assert_eq!(again.keys.capacity(), keys);
        // And it decodes the same block the same way again.
        decode_node(&mut arena, cid.as_cid(), &bytes, None, &mut again).unwrap();
        assert_eq!(again.len(), 2);
        assert_eq!(again.key(0), b"app.bsky.feed.post/3l2a");
    }

    #[test]
    fn empty_node() {
        assert_eq!(node(None, vec![]), EMPTY_NODE);
        assert_eq!(decode(&EMPTY_NODE, None).unwrap(), (vec![], None));
        // The well-known CID of the empty MST root.
        assert_eq!(
            empty_root_cid().to_string(),
            "bafyreie5737gdxlw5i64vzichcalba3z2v5n6icifvx5xytvske7mr3hpm"
        );
    }

    #[test]
    fn round_trip_with_prefix_compression() {
        // Three keys of height 0; the last two share "com.example.record/00".
        let keys: Vec<String> = (0..100)
            .map(|i| format!("com.example.record/{i:04}"))
            .filter(|k| key_height(k.as_bytes()) == 0)
            .take(3)
            .collect();
        assert_eq!(&keys[0][..21], "com.example.record/00");
        let v = leaf();
        let entries: Vec<(&[u8], Cid<'_>, Option<Cid<'_>>)> = keys
            .iter()
            .map(|k| (k.as_bytes(), v.as_cid(), None))
            .collect();
        let mut bytes = Vec::new();
        encode_node(&mut bytes, None, &entries);
        let p1 = common_prefix_len(keys[0].as_bytes(), keys[1].as_bytes());
        let p2 = common_prefix_len(keys[1].as_bytes(), keys[2].as_bytes());
        assert!(p1 >= 21 && p2 >= 21);
        let hand = node(
            None,
            vec![
                entry(0, keys[0].as_bytes(), None),
                entry(p1 as i64, &keys[1].as_bytes()[p1..], None),
                entry(p2 as i64, &keys[2].as_bytes()[p2..], None),
            ],
        );
        assert_eq!(bytes, hand);
        let (got, layer) = decode(&bytes, Some(0)).unwrap();
        assert_eq!(
            got,
            keys.iter()
                .map(|k| k.as_bytes().to_vec())
                .collect::<Vec<_>>()
        );
        assert_eq!(layer, Some(0));
    }

    #[test]
    fn structural_rejections() {
        let kind = |b: &[u8], exp: Option<u32>| decode(b, exp).unwrap_err();
        // Prefix longer than the previous key, and a prefix that is not maximal.
        let b = node(
            None,
            vec![entry(0, b"A0/374913", None), entry(10, b"x", None)],
        );
        assert!(matches!(
            kind(&b, None),
            MstError::BadPrefix { index: 1, .. }
        ));
        let b = node(
            None,
            vec![entry(0, b"A0/374913", None), entry(0, b"A1/076595", None)],
        );
        assert!(matches!(
            kind(&b, None),
            MstError::BadPrefix { index: 1, .. }
        ));
        let b = node(None, vec![entry(1, b"A0/374913", None)]);
        assert!(matches!(
            kind(&b, None),
            MstError::BadPrefix { index: 0, .. }
        ));
        // Out of order and duplicate.
        let b = node(
            None,
            vec![entry(0, b"C0/451630", None), entry(0, b"A0/374913", None)],
        );
        assert!(matches!(kind(&b, None), MstError::KeyOrder { .. }));
        let b = node(
            None,
            vec![entry(0, b"A0/374913", None), entry(9, b"", None)],
        );
        assert!(matches!(kind(&b, None), MstError::KeyOrder { .. }));
        // Keys of different heights (A0 is 0, B2/827649 is 2? whatever it is, not 0 for D2).
        assert_eq!(key_height(b"D2/269196"), 2);
        let b = node(
            None,
            vec![entry(0, b"A0/374913", None), entry(0, b"D2/269196", None)],
        );
        assert!(matches!(
            kind(&b, None),
            MstError::WrongLayer {
                expected: 0,
                found: 2,
                ..
            }
        ));
        let b = node(None, vec![entry(0, b"A0/374913", None)]);
        assert!(matches!(
            kind(&b, Some(1)),
            MstError::WrongLayer {
                expected: 1,
                found: 0,
                ..
            }
        ));
        // Layer 0 with a subtree.
        let b = node(Some(leaf()), vec![entry(0, b"A0/374913", None)]);
        assert!(matches!(
            kind(&b, None),
            MstError::SubtreeBelowLayerZero { .. }
        ));
        // Invalid key.
        let b = node(None, vec![entry(0, b"no-slash", None)]);
        assert!(matches!(kind(&b, None), MstError::InvalidKey { .. }));
        // Shape errors.
        let mut m = BTreeMap::new();
        m.insert("e".into(), OwnedValue::Array(vec![]));
        assert!(matches!(
            kind(&OwnedValue::Map(m.clone()).to_cbor(), None),
            MstError::Malformed { .. }
        ));
        m.insert("l".into(), OwnedValue::Null);
        m.insert("x".into(), OwnedValue::Null);
        assert!(matches!(
            kind(&OwnedValue::Map(m).to_cbor(), None),
            MstError::Malformed { .. }
        ));
        assert!(matches!(kind(&[0x01], None), MstError::Malformed { .. }));
        assert!(matches!(kind(&[0xa1, 0x61], None), MstError::Cbor { .. }));
        let mut e = BTreeMap::new();
        e.insert("k".into(), OwnedValue::Bytes(b"A0/374913".to_vec()));
        e.insert("p".into(), OwnedValue::Int(0));
        e.insert("v".into(), OwnedValue::Link(leaf()));
        assert!(matches!(
            kind(&node(None, vec![OwnedValue::Map(e)]), None),
            MstError::Malformed { .. }
        ));
        let b = node(None, vec![entry(-1, b"A0/374913", None)]);
        assert!(matches!(kind(&b, None), MstError::Malformed { .. }));
    }

    /// What a decode produced, comparable across the two paths.
    type Decoded = (
        Option<CidBuf>,
        Vec<(Vec<u8>, CidBuf, Option<CidBuf>)>,
        Option<u32>,
    );

    fn snapshot(out: &NodeData<'_>) -> Decoded {
        let entries = (0..out.len())
            .map(|i| {
                (
                    out.key(i).to_vec(),
                    out.value(i).to_buf(),
                    out.right(i).map(|c| c.to_buf()),
                )
            })
            .collect();
        (out.left().map(|c| c.to_buf()), entries, out.layer())
    }

    /// Both paths on one block: the fast path may refuse anything, but what it accepts the
    /// general path accepts too, with the same result.
    fn agree(block: &[u8], expected: Option<u32>) -> (bool, bool) {
        let cid = CidBuf::sha256(DAG_CBOR, block);
        let mut fast = NodeData::new();
        let fast_ok = decode_canonical(cid.as_cid(), block, expected, true, &mut fast);
        let mut arena = Arena::new();
        let mut general = NodeData::new();
        let general_res = decode_general(&mut arena, cid.as_cid(), block, expected, &mut general);
        if fast_ok {
            assert!(
                general_res.is_ok(),
                "fast path accepted what the general path rejects ({general_res:?}): {block:02x?}"
            );
            assert_eq!(snapshot(&fast), snapshot(&general), "{block:02x?}");
        }
        // With heights left to the caller, the fast path accepts the same nodes, plus those
        // whose only fault is a key's height.
        if let Some(layer) = expected {
            let mut deferred = NodeData::new();
            let deferred_ok =
                decode_canonical(cid.as_cid(), block, Some(layer), false, &mut deferred);
            if fast_ok {
                assert!(deferred_ok, "{block:02x?}");
                assert_eq!(snapshot(&deferred), snapshot(&fast), "{block:02x?}");
            } else if deferred_ok {
                assert!(
                    matches!(general_res, Err(MstError::WrongLayer { .. })),
                    "deferred heights accepted a node rejected for {general_res:?}: {block:02x?}"
                );
            }
        }
        (fast_ok, general_res.is_ok())
    }

    /// Real nodes (the corpus repository) and built ones with subtrees on several layers.
    fn sample_nodes() -> Vec<Vec<u8>> {
        let mut nodes = Vec::new();
        if let Some(car) = riptide_testdata::read("jetstream-2026-07/repo.car") {
            let mut reader = riptide_car::CarReader::new();
            let parsed = reader
                .read(&car, &riptide_car::CarOptions::repository())
                .unwrap();
            let mut arena = Arena::new();
            for b in parsed.blocks() {
                let cid = CidBuf::sha256(DAG_CBOR, b.data);
                let mut out = NodeData::new();
                if decode_general(&mut arena, cid.as_cid(), b.data, None, &mut out).is_ok() {
                    nodes.push(b.data.to_vec());
                }
            }
            assert!(nodes.len() >= 2, "repo.car holds MST nodes");
        }
        let leaves: Vec<(String, CidBuf)> = (0..3000)
            .map(|i| (format!("app.bsky.feed.post/3l{:011x}", i * 7919), leaf()))
            .collect();
        let (_, blocks) = crate::mst::build(&leaves[..]).unwrap();
        assert!(blocks.len() > 600);
        nodes.extend(blocks.into_iter().step_by(60).map(|(_, b)| b));
        nodes.push(EMPTY_NODE.to_vec());
        nodes
    }

    #[test]
    fn fast_path_takes_every_canonical_node() {
        let mut arena = Arena::new();
        let mut on_layer = 0;
        for block in sample_nodes() {
            assert_eq!(agree(&block, None), (true, true), "{block:02x?}");
            // On its own layer, and (heights left to the caller) claimed one layer higher.
            let cid = CidBuf::sha256(DAG_CBOR, &block);
            let mut out = NodeData::new();
            decode_general(&mut arena, cid.as_cid(), &block, None, &mut out).unwrap();
            if let Some(layer) = out.layer() {
                assert_eq!(agree(&block, Some(layer)), (true, true), "{block:02x?}");
                assert_eq!(
                    agree(&block, Some(layer + 1)),
                    (false, false),
                    "{block:02x?}"
                );
                on_layer += 1;
            }
        }
        assert!(on_layer >= 15, "{on_layer}");
    }

    #[test]
    fn fast_path_never_accepts_what_the_general_path_rejects() {
        // Every single-byte change of every sample node, and truncations: whatever the fast
        // path makes of them, `agree` checks it against the general path.
        let mut cases = 0usize;
        let mut both_rejected = 0usize;
        for block in sample_nodes() {
            for i in 0..block.len() {
                for delta in [1u8, 0x80, 0xff] {
                    let mut m = block.clone();
                    m[i] = m[i].wrapping_add(delta);
                    for expected in [None, Some(1)] {
                        let (fast, general) = agree(&m, expected);
                        cases += 1;
                        both_rejected += usize::from(!fast && !general);
                    }
                }
                // Truncated, and with a byte inserted (shifts everything after it).
                let (fast, general) = agree(&block[..i], None);
                both_rejected += usize::from(!fast && !general);
                for extra in [0x00u8, 0xf6] {
                    let mut m = block.clone();
                    m.insert(i, extra);
                    let (fast, general) = agree(&m, None);
                    both_rejected += usize::from(!fast && !general);
                }
            }
            // Trailing bytes.
            for extra in [&[0x00u8][..], &[0xf6], &[0x61, b'l', 0xf6]] {
                let mut m = block.clone();
                m.extend_from_slice(extra);
                assert_eq!(agree(&m, None), (false, false));
            }
        }
        assert!(cases > 5_000, "{cases}");
        assert!(
            both_rejected > cases / 4,
            "mutations must mostly be rejected"
        );
    }
}
