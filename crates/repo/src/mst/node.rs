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
use crate::mst::height::{common_prefix_len, is_valid_key, key_height};

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
}

impl<'a> NodeData<'a> {
    /// An empty value to decode into.
    pub fn new() -> NodeData<'a> {
        NodeData::default()
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
pub fn decode_node<'a>(
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
    let mut prev_start = 0usize;
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

        // Undo prefix compression against the previous key of this node.
        let prev_end = out.keys.len();
        let prev_len = prev_end - prev_start;
        let bad_prefix = || MstError::BadPrefix {
            cid: cid.to_buf(),
            index,
        };
        if p as u64 > prev_len as u64 {
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
        if !is_valid_key(key) {
            return Err(MstError::InvalidKey { key: lossy(key) });
        }
        let h = key_height(key);
        match layer {
            None => layer = Some(h),
            Some(want) if want != h => {
                return Err(MstError::WrongLayer {
                    cid: cid.to_buf(),
                    key: lossy(key),
                    expected: want,
                    found: h,
                })
            }
            Some(_) => {}
        }
        if out.keys.len() > u32::MAX as usize {
            return Err(malformed("node keys too long"));
        }
        out.entries.push(EntryRef {
            key_end: out.keys.len() as u32,
            value,
            right,
        });
        prev_start = prev_end;
        if index == 0 {
            out.layer = Some(h);
        }
    }
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
    write_map_header(out, 4);
    write_text(out, "k");
    write_bytes(out, &key[p..]);
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
}
