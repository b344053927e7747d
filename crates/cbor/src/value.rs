//! Read-only views of decoded items.
//!
//! A [`Value`] is three words: the input buffer, the tape and a node index. It is `Copy`, never
//! allocates, and hands out strings, byte strings and CIDs that borrow the input.
//!
//! This is the one module of the crate that uses `unsafe`: [`Value::as_str`] skips re-validating
//! UTF-8 that the decoder already validated. Re-checking would double the cost of every text read
//! (post text is most of a firehose record's bytes).
#![allow(unsafe_code)]

use std::fmt;

use crate::cid::Cid;
use crate::tape::{Kind, Node};

/// A view of one decoded item.
#[derive(Clone, Copy)]
pub struct Value<'t> {
    base: &'t [u8],
    nodes: &'t [Node],
    idx: u32,
}

impl<'t> Value<'t> {
    pub(crate) fn new(base: &'t [u8], nodes: &'t [Node], idx: u32) -> Value<'t> {
        Value { base, nodes, idx }
    }

    #[inline(always)]
    fn node(&self) -> Node {
        self.nodes[self.idx as usize]
    }

    #[inline(always)]
    fn span(&self, n: Node) -> &'t [u8] {
        let start = n.b as usize;
        &self.base[start..start + n.a as usize]
    }

    /// What this item is.
    #[inline]
    pub fn kind(&self) -> Kind {
        self.node().kind
    }

    /// `null`?
    #[inline]
    pub fn is_null(&self) -> bool {
        self.kind() == Kind::Null
    }

    /// The boolean, if this is one.
    #[inline]
    pub fn as_bool(&self) -> Option<bool> {
        let n = self.node();
        (n.kind == Kind::Bool).then_some(n.a != 0)
    }

    /// The integer, if this is one that fits in `i64` (always, for strictly decoded input).
    #[inline]
    pub fn as_i64(&self) -> Option<i64> {
        let n = self.node();
        match n.kind {
            Kind::UInt => i64::try_from(n.b).ok(),
            Kind::NegInt => i64::try_from(n.b).ok().map(|v| -1 - v),
            _ => None,
        }
    }

    /// The float, if this is one (lenient decoding only).
    pub fn as_f64(&self) -> Option<f64> {
        let n = self.node();
        (n.kind == Kind::Float).then(|| f64::from_bits(n.b))
    }

    /// The text, if this is a text string; borrowed from the input.
    #[inline]
    pub fn as_str(&self) -> Option<&'t str> {
        let n = self.node();
        if n.kind != Kind::Text {
            return None;
        }
        let bytes = self.span(n);
        // SAFETY: text nodes are only pushed by the decoder after `simdutf8` validated exactly
        // this range of the input as UTF-8 (tape.rs, major type 3). A tape holds a shared borrow
        // of its input for its whole life, so the bytes cannot have changed since.
        Some(unsafe { std::str::from_utf8_unchecked(bytes) })
    }

    /// The bytes, if this is a byte string; borrowed from the input.
    #[inline]
    pub fn as_bytes(&self) -> Option<&'t [u8]> {
        let n = self.node();
        (n.kind == Kind::Bytes).then(|| self.span(n))
    }

    /// Where this string's, byte string's or link's content lies in the input buffer.
    pub fn byte_range(&self) -> Option<std::ops::Range<usize>> {
        let n = self.node();
        match n.kind {
            Kind::Bytes | Kind::Text | Kind::Link => {
                Some(n.b as usize..n.b as usize + n.a as usize)
            }
            _ => None,
        }
    }

    /// The CID, if this is a link (tag 42); borrowed from the input.
    #[inline]
    pub fn as_link(&self) -> Option<Cid<'t>> {
        let n = self.node();
        // The decoder validated the CID before pushing the node.
        (n.kind == Kind::Link).then(|| Cid::from_validated(self.span(n)))
    }

    /// Number of items (array) or pairs (map); 0 for anything else.
    pub fn len(&self) -> usize {
        let n = self.node();
        match n.kind {
            Kind::Array | Kind::Map => n.a as usize,
            _ => 0,
        }
    }

    /// Whether this is an empty container (or not a container).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The items, if this is an array.
    #[inline]
    pub fn array(&self) -> Option<Items<'t>> {
        let n = self.node();
        (n.kind == Kind::Array).then_some(Items {
            base: self.base,
            nodes: self.nodes,
            next: self.idx + 1,
            remaining: n.a,
        })
    }

    /// The key/value pairs, if this is a map, in encoded order (canonical order for strict input).
    #[inline]
    pub fn map(&self) -> Option<Pairs<'t>> {
        let n = self.node();
        (n.kind == Kind::Map).then_some(Pairs {
            inner: Items {
                base: self.base,
                nodes: self.nodes,
                next: self.idx + 1,
                remaining: n.a * 2,
            },
        })
    }

    /// The pairs of a map whose keys are text (always, for strict input). Pairs with other keys,
    /// possible only in lenient mode, are skipped.
    #[inline]
    pub fn entries(&self) -> impl Iterator<Item = (&'t str, Value<'t>)> + 't {
        self.map()
            .into_iter()
            .flatten()
            .filter_map(|(k, v)| Some((k.as_str()?, v)))
    }

    /// The value under text key `key`, if this is a map that has it.
    #[inline]
    pub fn get(&self, key: &str) -> Option<Value<'t>> {
        self.entries().find(|(k, _)| *k == key).map(|(_, v)| v)
    }

    /// The tag number and content, if this is a tag other than 42 (lenient decoding only).
    pub fn tag(&self) -> Option<(u32, Value<'t>)> {
        let n = self.node();
        (n.kind == Kind::Tag).then(|| {
            (
                n.a,
                Value {
                    idx: self.idx + 1,
                    ..*self
                },
            )
        })
    }

    /// Index of the node after this item's subtree.
    #[inline(always)]
    fn next_index(nodes: &[Node], idx: u32) -> u32 {
        let n = nodes[idx as usize];
        match n.kind {
            Kind::Array | Kind::Map | Kind::Tag => n.b as u32,
            _ => idx + 1,
        }
    }

    /// Number of nodes in this item's subtree (itself included).
    pub fn node_count(&self) -> usize {
        (Self::next_index(self.nodes, self.idx) - self.idx) as usize
    }
}

/// Iterator over array items (and, two at a time, map entries).
#[derive(Clone, Debug)]
pub struct Items<'t> {
    base: &'t [u8],
    nodes: &'t [Node],
    next: u32,
    remaining: u32,
}

impl<'t> Iterator for Items<'t> {
    type Item = Value<'t>;

    #[inline]
    fn next(&mut self) -> Option<Value<'t>> {
        if self.remaining == 0 {
            return None;
        }
        self.remaining -= 1;
        let v = Value {
            base: self.base,
            nodes: self.nodes,
            idx: self.next,
        };
        self.next = Value::next_index(self.nodes, self.next);
        Some(v)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.remaining as usize, Some(self.remaining as usize))
    }
}

impl ExactSizeIterator for Items<'_> {}

/// Iterator over map pairs.
#[derive(Clone, Debug)]
pub struct Pairs<'t> {
    inner: Items<'t>,
}

impl<'t> Iterator for Pairs<'t> {
    type Item = (Value<'t>, Value<'t>);

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        let k = self.inner.next()?;
        let v = self.inner.next()?;
        Some((k, v))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.inner.remaining as usize / 2;
        (n, Some(n))
    }
}

impl fmt::Debug for Value<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind() {
            Kind::Null => f.write_str("null"),
            Kind::Bool => write!(f, "{}", self.node().a != 0),
            Kind::UInt | Kind::NegInt => match self.as_i64() {
                Some(v) => write!(f, "{v}"),
                None => write!(f, "{}", self.node().b),
            },
            Kind::Float => write!(f, "{:?}", f64::from_bits(self.node().b)),
            Kind::Bytes => write!(f, "h'{}'", self.as_bytes().map(hex).unwrap_or_default()),
            Kind::Text => write!(f, "{:?}", self.as_str().unwrap_or_default()),
            Kind::Link => write!(f, "{:?}", self.as_link()),
            Kind::Array => f
                .debug_list()
                .entries(self.array().into_iter().flatten())
                .finish(),
            Kind::Map => f
                .debug_map()
                .entries(self.map().into_iter().flatten())
                .finish(),
            Kind::Undefined => f.write_str("undefined"),
            Kind::Simple => write!(f, "simple({})", self.node().a),
            Kind::Tag => match self.tag() {
                Some((t, v)) => write!(f, "{t}({v:?})"),
                None => f.write_str("tag"),
            },
        }
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
