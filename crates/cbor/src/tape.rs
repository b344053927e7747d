//! The decoder: DAG-CBOR bytes → a flat tape of 16-byte nodes.
//!
//! Why a tape: firehose consumers decode millions of small objects a second. Building a tree of
//! heap-allocated values per block would cost more than the SHA-256 check that precedes it. Instead
//! every item becomes one fixed-size [`Node`] appended to a `Vec` that is reused for the next frame
//! (`clear`, never freed), strings and bytes are kept as offsets into the input, and a container
//! records where its subtree ends so a reader can skip it in O(1).
//!
//! ```text
//! input:  a2 61 61 01 61 62 82 02 03          {"a": 1, "b": [2, 3]}
//! tape:   [0] Map   a=2 (pairs)  b=7 (end)
//!         [1] Text  a=1 (len)    b=2 (offset of "a")
//!         [2] UInt               b=1
//!         [3] Text  a=1          b=5 (offset of "b")
//!         [4] Array a=2 (items)  b=7 (end)
//!         [5] UInt               b=2
//!         [6] UInt               b=3
//! ```
//!
//! Memory is bounded by the input: every node consumes at least one input byte, and container
//! lengths are checked against the bytes that remain before anything is pushed.
//!
//! Two decoders fill the tape, with identical results: `descent.rs` (recursive descent, the fast
//! path, for depth limits up to 256) and `decode_loop` here (iterative, with an explicit stack:
//! for deeper limits, and the reference the fast path is tested against).
//!
//! Concurrency: an [`Arena`] belongs to one thread at a time; use one per worker.

use std::ops::Range;

use crate::cid::Cid;
use crate::descent;
use crate::error::{Error, ErrorKind};
use crate::value::Value;

/// What a node is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// `null`.
    Null,
    /// `false` or `true`.
    Bool,
    /// An integer ≥ 0.
    UInt,
    /// An integer < 0.
    NegInt,
    /// A float (lenient mode only).
    Float,
    /// A byte string.
    Bytes,
    /// A UTF-8 text string.
    Text,
    /// Tag 42: a CID.
    Link,
    /// An array.
    Array,
    /// A map.
    Map,
    /// `undefined` (lenient mode only).
    Undefined,
    /// Another simple value (lenient mode only).
    Simple,
    /// A tag other than 42 (lenient mode only); its one child follows.
    Tag,
}

/// One decoded item. 16 bytes; see the module docs for the meaning of `a` and `b` per kind.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Node {
    pub(crate) kind: Kind,
    /// Bool: 0/1. Bytes/Text/Link: length. Array: items. Map: pairs. Simple/Tag: number (truncated).
    pub(crate) a: u32,
    /// UInt: value. NegInt: n where the value is -1-n. Float: f64 bits. Bytes/Text/Link: offset
    /// in the input. Array/Map/Tag: index one past the last node of the subtree.
    pub(crate) b: u64,
}

/// Which dialect to accept.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Mode {
    /// DAG-CBOR as atproto defines it: text map keys in canonical order without duplicates,
    /// minimal integers and lengths, tag 42 only, no floats, no simple values but false, true and
    /// null, valid UTF-8. The default.
    #[default]
    Strict,
    /// For diagnostics: accepts any key type and order, non-minimal encodings, floats, undefined
    /// and other simple values, and any tag. Still rejects indefinite lengths, invalid UTF-8 and
    /// malformed CIDs in tag 42, and still enforces every limit.
    Lenient,
}

/// Limits checked before any work or allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Largest input (one item) accepted, in bytes.
    pub max_input: usize,
    /// Deepest nesting of arrays and maps.
    pub max_depth: usize,
    /// Largest declared array length or map pair count.
    pub max_container_len: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_input: 16 << 20,
            max_depth: 64,
            max_container_len: 1 << 20,
        }
    }
}

/// Decoding options: dialect and limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Options {
    /// Strict (default) or lenient.
    pub mode: Mode,
    /// Limits.
    pub limits: Limits,
}

impl Options {
    /// Strict DAG-CBOR with default limits.
    pub fn strict() -> Options {
        Options::default()
    }

    /// Lenient decoding with default limits.
    pub fn lenient() -> Options {
        Options {
            mode: Mode::Lenient,
            ..Options::default()
        }
    }
}

/// A decoded top-level item on a tape: the index of its root node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Item(pub(crate) u32);

#[derive(Clone, Copy, Debug)]
struct Level {
    node: u32,
    /// Items still expected (for maps: keys and values counted separately).
    remaining: u64,
    is_map: bool,
    /// The previous key of this map (offset, length); length u32::MAX before the first key.
    prev_key: (u32, u32),
}

/// Reusable storage for tapes: keep one per thread and call [`Arena::tape`] per frame.
#[derive(Debug, Default)]
pub struct Arena {
    pub(crate) nodes: Vec<Node>,
    stack: Vec<Level>,
}

impl Arena {
    /// An empty arena.
    pub fn new() -> Arena {
        Arena::default()
    }

    /// Starts a tape over `base`, clearing (not freeing) the storage of the previous one. All
    /// items decoded on this tape are ranges of `base`, which stays borrowed while the tape lives.
    pub fn tape<'a>(&'a mut self, base: &'a [u8]) -> Tape<'a> {
        self.nodes.clear();
        self.stack.clear();
        Tape { base, arena: self }
    }

    /// Nodes currently held (for capacity planning and tests).
    pub fn capacity(&self) -> usize {
        self.nodes.capacity()
    }
}

/// Decoded items over one input buffer.
#[derive(Debug)]
pub struct Tape<'a> {
    base: &'a [u8],
    arena: &'a mut Arena,
}

#[inline(always)]
fn err(kind: ErrorKind, offset: usize) -> Error {
    Error::new(kind, offset)
}

impl<'a> Tape<'a> {
    /// The buffer every item on this tape points into.
    pub fn base(&self) -> &'a [u8] {
        self.base
    }

    /// Number of nodes decoded so far.
    pub fn len(&self) -> usize {
        self.arena.nodes.len()
    }

    /// Whether nothing has been decoded yet.
    pub fn is_empty(&self) -> bool {
        self.arena.nodes.is_empty()
    }

    /// A view of a decoded item.
    #[inline]
    pub fn value(&self, item: Item) -> Value<'_> {
        Value::new(self.base, &self.arena.nodes, item.0)
    }

    /// Ends decoding: the tape becomes a read-only [`Doc`] whose values borrow the input and
    /// the arena for the whole lifetime `'a`, so views can be stored next to each other.
    pub fn finish(self) -> Doc<'a> {
        let arena: &'a Arena = self.arena;
        Doc {
            base: self.base,
            nodes: &arena.nodes,
        }
    }

    /// Decodes exactly one item spanning `range` of the base buffer.
    pub fn decode(&mut self, range: Range<usize>, opts: &Options) -> Result<Item, Error> {
        let end = range.end;
        let (item, stop) = self.decode_prefix(range, opts)?;
        if stop != end {
            return Err(err(ErrorKind::TrailingBytes, stop));
        }
        Ok(item)
    }

    /// Decodes one item starting at `range.start`, not reading past `range.end`; returns the item
    /// and the offset just after it. Used for frames, which hold two items back to back.
    pub fn decode_prefix(
        &mut self,
        range: Range<usize>,
        opts: &Options,
    ) -> Result<(Item, usize), Error> {
        let Range { start, end } = range;
        if end > self.base.len() || start > end {
            return Err(err(ErrorKind::Truncated, start.min(self.base.len())));
        }
        if end - start > opts.limits.max_input {
            return Err(err(ErrorKind::InputLimit, start));
        }
        if self.base.len() > u32::MAX as usize {
            return Err(err(ErrorKind::InputLimit, start));
        }
        let strict = opts.mode == Mode::Strict;
        let root = self.arena.nodes.len();
        let result = if opts.limits.max_depth <= descent::MAX_RECURSION {
            descent::decode(
                self.base,
                start,
                end,
                strict,
                &opts.limits,
                &mut self.arena.nodes,
            )
        } else {
            decode_loop(self.base, start, end, strict, &opts.limits, self.arena)
        };
        match result {
            Ok(stop) => Ok((Item(root as u32), stop)),
            Err(e) => {
                // Leave the tape as it was before this item.
                self.arena.nodes.truncate(root);
                self.arena.stack.clear();
                Err(e)
            }
        }
    }
}

/// A finished tape: read-only views of everything decoded over one input.
#[derive(Clone, Copy, Debug)]
pub struct Doc<'a> {
    base: &'a [u8],
    nodes: &'a [Node],
}

impl<'a> Doc<'a> {
    /// A view of a decoded item.
    #[inline]
    pub fn value(&self, item: Item) -> Value<'a> {
        Value::new(self.base, self.nodes, item.0)
    }

    /// The input buffer.
    pub fn base(&self) -> &'a [u8] {
        self.base
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether nothing was decoded.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }
}

/// Reads the argument that follows an initial byte with additional information `info` ≥ 24.
#[inline(always)]
pub(crate) fn read_arg(
    input: &[u8],
    pos: &mut usize,
    end: usize,
    info: u8,
    at: usize,
) -> Result<u64, Error> {
    let n = match info {
        24 => 1,
        25 => 2,
        26 => 4,
        27 => 8,
        31 => return Err(err(ErrorKind::Indefinite, at)),
        _ => return Err(err(ErrorKind::InvalidHeader, at)),
    };
    if end - *pos < n {
        return Err(err(ErrorKind::Truncated, at));
    }
    let bytes = &input[*pos..*pos + n];
    *pos += n;
    let mut v: u64 = 0;
    for &b in bytes {
        v = (v << 8) | u64::from(b);
    }
    Ok(v)
}

/// [`read_arg`] of a length or integer argument, which strict mode also requires in its
/// shortest form ([`minimal`]): the same check for every head both decoders read.
#[inline(always)]
pub(crate) fn read_len_arg(
    input: &[u8],
    pos: &mut usize,
    end: usize,
    info: u8,
    at: usize,
    strict: bool,
) -> Result<u64, Error> {
    let v = read_arg(input, pos, end, info, at)?;
    if strict && !minimal(info, v) {
        return Err(err(ErrorKind::NonMinimal, at));
    }
    Ok(v)
}

/// UTF-8 validation with an inline ASCII fast path: map keys and most record strings are short
/// and ASCII, and a library call per string costs more than the check (profiled: 10% of decode).
#[inline(always)]
pub(crate) fn is_utf8(s: &[u8]) -> bool {
    let mut chunks = s.chunks_exact(8);
    let mut acc = 0u64;
    for c in &mut chunks {
        let mut w = [0u8; 8];
        w.copy_from_slice(c);
        acc |= u64::from_le_bytes(w);
    }
    let mut tail = 0u8;
    for &b in chunks.remainder() {
        tail |= b;
    }
    if acc & 0x8080_8080_8080_8080 == 0 && tail < 0x80 {
        return true;
    }
    simdutf8::basic::from_utf8(s).is_ok()
}

/// Bytewise comparison of two keys of equal length `len` at offsets `a` and `b` of `input`.
/// Short keys are compared as one big-endian word loaded in place: `memcmp` through libc cost 15%
/// of decoding for the one-byte keys of MST entries, and copying into a zeroed buffer stalled on
/// store forwarding just as badly (profiled).
#[inline(always)]
fn key_cmp(input: &[u8], a: usize, b: usize, len: usize) -> std::cmp::Ordering {
    if len == 0 {
        return std::cmp::Ordering::Equal;
    }
    if len <= 8 {
        if let (Some(x), Some(y)) = (input.get(a..a + 8), input.get(b..b + 8)) {
            let shift = (8 - len) * 8;
            let x = u64::from_be_bytes([x[0], x[1], x[2], x[3], x[4], x[5], x[6], x[7]]) >> shift;
            let y = u64::from_be_bytes([y[0], y[1], y[2], y[3], y[4], y[5], y[6], y[7]]) >> shift;
            return x.cmp(&y);
        }
    }
    input[a..a + len].cmp(&input[b..b + len])
}

/// Whether `arg` read with additional information `info` was in its shortest form.
#[inline(always)]
pub(crate) fn minimal(info: u8, arg: u64) -> bool {
    match info {
        24 => arg >= 24,
        25 => arg > 0xff,
        26 => arg > 0xffff,
        27 => arg > 0xffff_ffff,
        _ => true,
    }
}

pub(crate) fn half_to_f64(h: u16) -> f64 {
    let sign = if h & 0x8000 != 0 { -1.0 } else { 1.0 };
    let exp = i32::from((h >> 10) & 0x1f);
    let frac = f64::from(h & 0x3ff);
    match exp {
        0 => sign * frac * 2f64.powi(-24),
        31 => {
            if frac == 0.0 {
                sign * f64::INFINITY
            } else {
                f64::NAN
            }
        }
        _ => sign * (1.0 + frac / 1024.0) * 2f64.powi(exp - 15),
    }
}

/// The decoding loop: iterative, with an explicit stack bounded by `max_depth`. Used for limits
/// deeper than [`descent::MAX_RECURSION`], and the reference the fast path (`descent`) is tested
/// against.
#[inline(never)]
pub(crate) fn decode_loop(
    input: &[u8],
    start: usize,
    end: usize,
    strict: bool,
    limits: &Limits,
    arena: &mut Arena,
) -> Result<usize, Error> {
    let Arena { nodes, stack } = arena;
    stack.clear();
    // The innermost open container lives in `cur` (registers), its ancestors on `stack`; reading
    // the stack top for every item cost more than the item itself (profiled).
    let mut cur = Level {
        node: 0,
        remaining: 0,
        is_map: false,
        prev_key: (0, u32::MAX),
    };
    let mut open = false;
    let mut pos = start;
    loop {
        let at = pos;
        if pos >= end {
            return Err(err(ErrorKind::Truncated, at));
        }
        let ib = input[pos];
        pos += 1;
        let major = ib >> 5;
        let info = ib & 0x1f;

        // Map key position: a text string in canonical order (strict).
        let key_pos = open && cur.is_map && cur.remaining.is_multiple_of(2);
        if key_pos && strict {
            if major != 3 {
                return Err(err(ErrorKind::NonTextKey, at));
            }
            if info < 24 {
                // A short key (nearly every key): the checks of the text case below in the same
                // order, without the general dispatch. A key never completes its map (a value
                // follows), so no container closes here.
                let len = usize::from(info);
                if len > end - pos {
                    return Err(err(ErrorKind::Truncated, at));
                }
                if !is_utf8(&input[pos..pos + len]) {
                    return Err(err(ErrorKind::InvalidUtf8, at));
                }
                check_key_order(input, &mut cur.prev_key, pos, len, at)?;
                nodes.push(Node {
                    kind: Kind::Text,
                    a: len as u32,
                    b: pos as u64,
                });
                pos += len;
                cur.remaining -= 1;
                continue;
            }
        }

        // A link as atproto writes every one: tag 42, a 37-byte byte string, 0x00, a CIDv1 with a
        // one-byte codec and a 32-byte SHA-256 (MST nodes and records are full of them). The
        // node the general path below makes, without its two argument reads and CID parse.
        if ib == 0xd8 && !key_pos && pos + 40 <= end {
            if let Some(&[0x2a, 0x58, 0x25, 0x00, 0x01, codec, 0x12, 0x20]) =
                input.get(pos..pos + 8)
            {
                if codec < 0x80 {
                    nodes.push(Node {
                        kind: Kind::Link,
                        a: 36,
                        b: pos as u64 + 4,
                    });
                    pos += 40;
                    if complete(nodes, stack, &mut cur, &mut open) {
                        return Ok(pos);
                    }
                    continue;
                }
            }
        }

        let arg = if info < 24 {
            u64::from(info)
        } else if major == 7 {
            // Floats and simple values: handled below, not an integer argument.
            0
        } else {
            read_len_arg(input, &mut pos, end, info, at, strict)?
        };

        let node = match major {
            0 => {
                if strict && arg > i64::MAX as u64 {
                    return Err(err(ErrorKind::IntegerOverflow, at));
                }
                Node {
                    kind: Kind::UInt,
                    a: 0,
                    b: arg,
                }
            }
            1 => {
                if strict && arg > i64::MAX as u64 {
                    return Err(err(ErrorKind::IntegerOverflow, at));
                }
                Node {
                    kind: Kind::NegInt,
                    a: 0,
                    b: arg,
                }
            }
            2 | 3 => {
                if arg > (end - pos) as u64 {
                    return Err(err(ErrorKind::Truncated, at));
                }
                let len = arg as usize;
                let s = &input[pos..pos + len];
                if major == 3 {
                    if !is_utf8(s) {
                        return Err(err(ErrorKind::InvalidUtf8, at));
                    }
                    if key_pos && strict {
                        check_key_order(input, &mut cur.prev_key, pos, len, at)?;
                    }
                }
                let kind = if major == 2 { Kind::Bytes } else { Kind::Text };
                let n = Node {
                    kind,
                    a: len as u32,
                    b: pos as u64,
                };
                pos += len;
                n
            }
            4 | 5 => {
                if arg > limits.max_container_len {
                    return Err(err(ErrorKind::LengthLimit, at));
                }
                // Every item takes at least one byte: a longer declared length cannot fit.
                // (Saturating: with the limit lifted, 2^63 pairs must not wrap to 0 items.)
                let items = if major == 5 {
                    arg.saturating_mul(2)
                } else {
                    arg
                };
                if items > (end - pos) as u64 {
                    return Err(err(ErrorKind::Truncated, at));
                }
                let kind = if major == 5 { Kind::Map } else { Kind::Array };
                let idx = nodes.len();
                nodes.push(Node {
                    kind,
                    a: arg as u32,
                    b: idx as u64 + 1,
                });
                if items > 0 {
                    if stack.len() + usize::from(open) >= limits.max_depth {
                        return Err(err(ErrorKind::DepthLimit, at));
                    }
                    if open {
                        stack.push(cur);
                    }
                    cur = Level {
                        node: idx as u32,
                        remaining: items,
                        is_map: major == 5,
                        prev_key: (0, u32::MAX),
                    };
                    open = true;
                    continue;
                }
                // Empty container: complete at once (below).
                if complete(nodes, stack, &mut cur, &mut open) {
                    return Ok(pos);
                }
                continue;
            }
            6 => {
                if arg == 42 {
                    // The content must be a byte string: 0x00 then a binary CID.
                    if pos >= end {
                        return Err(err(ErrorKind::Truncated, pos));
                    }
                    let bh = input[pos];
                    if bh >> 5 != 2 {
                        return Err(err(ErrorKind::InvalidLink, at));
                    }
                    pos += 1;
                    let binfo = bh & 0x1f;
                    let blen = if binfo < 24 {
                        u64::from(binfo)
                    } else {
                        read_len_arg(input, &mut pos, end, binfo, at, strict)?
                    };
                    if blen > (end - pos) as u64 {
                        return Err(err(ErrorKind::Truncated, at));
                    }
                    let blen = blen as usize;
                    let content = &input[pos..pos + blen];
                    if content.first() != Some(&0x00) || Cid::from_bytes(&content[1..]).is_err() {
                        return Err(err(ErrorKind::InvalidLink, at));
                    }
                    let n = Node {
                        kind: Kind::Link,
                        a: (blen - 1) as u32,
                        b: pos as u64 + 1,
                    };
                    pos += blen;
                    n
                } else if strict {
                    return Err(err(ErrorKind::UnsupportedTag, at));
                } else {
                    // Lenient: a tag node with one child.
                    let idx = nodes.len();
                    nodes.push(Node {
                        kind: Kind::Tag,
                        a: arg as u32,
                        b: idx as u64 + 1,
                    });
                    if stack.len() + usize::from(open) >= limits.max_depth {
                        return Err(err(ErrorKind::DepthLimit, at));
                    }
                    if open {
                        stack.push(cur);
                    }
                    cur = Level {
                        node: idx as u32,
                        remaining: 1,
                        is_map: false,
                        prev_key: (0, u32::MAX),
                    };
                    open = true;
                    continue;
                }
            }
            _ => match info {
                20 => Node {
                    kind: Kind::Bool,
                    a: 0,
                    b: 0,
                },
                21 => Node {
                    kind: Kind::Bool,
                    a: 1,
                    b: 0,
                },
                22 => Node {
                    kind: Kind::Null,
                    a: 0,
                    b: 0,
                },
                25..=27 => {
                    if strict {
                        return Err(err(ErrorKind::Float, at));
                    }
                    let raw = read_arg(input, &mut pos, end, info, at)?;
                    let f = match info {
                        25 => half_to_f64(raw as u16),
                        26 => f64::from(f32::from_bits(raw as u32)),
                        _ => f64::from_bits(raw),
                    };
                    Node {
                        kind: Kind::Float,
                        a: 0,
                        b: f.to_bits(),
                    }
                }
                31 => return Err(err(ErrorKind::InvalidHeader, at)),
                28..=30 => return Err(err(ErrorKind::InvalidHeader, at)),
                _ if strict => return Err(err(ErrorKind::UnsupportedSimple, at)),
                23 => Node {
                    kind: Kind::Undefined,
                    a: 0,
                    b: 0,
                },
                24 => {
                    let v = read_arg(input, &mut pos, end, info, at)?;
                    Node {
                        kind: Kind::Simple,
                        a: v as u32,
                        b: 0,
                    }
                }
                _ => Node {
                    kind: Kind::Simple,
                    a: u32::from(info),
                    b: 0,
                },
            },
        };
        nodes.push(node);
        if complete(nodes, stack, &mut cur, &mut open) {
            return Ok(pos);
        }
    }
}

/// Canonical key order (strict): shorter keys first, then bytewise; no duplicates. The key is
/// `input[pos..pos + len]`, at item offset `at`; it becomes the map's previous key.
#[inline(always)]
pub(crate) fn check_key_order(
    input: &[u8],
    prev: &mut (u32, u32),
    pos: usize,
    len: usize,
    at: usize,
) -> Result<(), Error> {
    let (poff, plen) = *prev;
    if plen != u32::MAX {
        let plen = plen as usize;
        if len < plen {
            return Err(err(ErrorKind::KeyOrder, at));
        }
        if len == plen {
            match key_cmp(input, poff as usize, pos, len) {
                std::cmp::Ordering::Less => {}
                std::cmp::Ordering::Equal => return Err(err(ErrorKind::DuplicateKey, at)),
                std::cmp::Ordering::Greater => return Err(err(ErrorKind::KeyOrder, at)),
            }
        }
    }
    *prev = (pos as u32, len as u32);
    Ok(())
}

/// Records that one item finished: closes every container it completes. Returns true when the
/// top-level item is complete.
#[inline(always)]
fn complete(nodes: &mut [Node], stack: &mut Vec<Level>, cur: &mut Level, open: &mut bool) -> bool {
    loop {
        if !*open {
            return true;
        }
        cur.remaining -= 1;
        if cur.remaining != 0 {
            return false;
        }
        let end = nodes.len() as u64;
        nodes[cur.node as usize].b = end;
        match stack.pop() {
            Some(parent) => *cur = parent,
            None => *open = false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_is_16_bytes() {
        assert_eq!(std::mem::size_of::<Node>(), 16);
    }

    fn decode(bytes: &[u8], opts: Options) -> Result<(), Error> {
        let mut arena = Arena::new();
        let mut tape = arena.tape(bytes);
        tape.decode(0..bytes.len(), &opts).map(|_| ())
    }

    fn kind(bytes: &[u8]) -> ErrorKind {
        decode(bytes, Options::strict()).unwrap_err().kind()
    }

    #[test]
    fn module_example_layout() {
        let bytes = [0xa2, 0x61, 0x61, 0x01, 0x61, 0x62, 0x82, 0x02, 0x03];
        let mut arena = Arena::new();
        let mut tape = arena.tape(&bytes);
        let item = tape.decode(0..bytes.len(), &Options::strict()).unwrap();
        assert_eq!(tape.len(), 7);
        let v = tape.value(item);
        assert_eq!(v.get("a").and_then(|v| v.as_i64()), Some(1));
        let b: Vec<i64> = v
            .get("b")
            .unwrap()
            .array()
            .unwrap()
            .filter_map(|v| v.as_i64())
            .collect();
        assert_eq!(b, vec![2, 3]);
    }

    #[test]
    fn atproto_links_fast_or_not_decode_the_same() {
        // [link, 1] and {"a": link}: the link as atproto writes it (fast path), at the end of the
        // input and not, truncated anywhere, and with its codec byte a varint continuation
        // (general path: not a valid CID then).
        for codec in [0x71u8, 0x55, 0x7f] {
            let mut cid = vec![0x01, codec, 0x12, 0x20];
            cid.extend((0..32u8).map(|i| i.wrapping_mul(37)));
            let mut link = vec![0xd8, 0x2a, 0x58, 0x25, 0x00];
            link.extend(&cid);
            for doc in [
                [&[0x82][..], &link, &[0x01]].concat(),
                [&[0xa1, 0x61, b'a'][..], &link].concat(),
                [&[0x81][..], &link].concat(),
            ] {
                let mut arena = Arena::new();
                let mut tape = arena.tape(&doc);
                let item = tape.decode(0..doc.len(), &Options::strict()).unwrap();
                let v = tape.value(item);
                let l = match v.kind() {
                    Kind::Map => v.get("a").unwrap(),
                    _ => v.array().unwrap().next().unwrap(),
                };
                assert_eq!(l.kind(), Kind::Link);
                assert_eq!(l.as_link().unwrap().as_bytes(), &cid[..]);
                for cut in 1..doc.len() {
                    assert_eq!(kind(&doc[..cut]), ErrorKind::Truncated, "{cut}");
                }
            }
        }
        let mut bad = vec![0x81, 0xd8, 0x2a, 0x58, 0x25, 0x00, 0x01, 0x80, 0x12, 0x20];
        bad.extend([0u8; 32]);
        assert_eq!(kind(&bad), ErrorKind::InvalidLink);
    }

    #[test]
    fn strict_rejections() {
        assert_eq!(kind(&[0x18, 0x05]), ErrorKind::NonMinimal);
        assert_eq!(kind(&[0x19, 0x00, 0x10]), ErrorKind::NonMinimal);
        assert_eq!(kind(&[0x9f, 0xff]), ErrorKind::Indefinite);
        assert_eq!(kind(&[0xa1, 0x01, 0x01]), ErrorKind::NonTextKey);
        // {"b":1,"a":2}: same length, wrong order.
        assert_eq!(
            kind(&[0xa2, 0x61, 0x62, 0x01, 0x61, 0x61, 0x02]),
            ErrorKind::KeyOrder
        );
        // {"aa":1,"b":2}: longer key first.
        assert_eq!(
            kind(&[0xa2, 0x62, 0x61, 0x61, 0x01, 0x61, 0x62, 0x02]),
            ErrorKind::KeyOrder
        );
        assert_eq!(
            kind(&[0xa2, 0x61, 0x61, 0x01, 0x61, 0x61, 0x02]),
            ErrorKind::DuplicateKey
        );
        assert_eq!(kind(&[0xc1, 0x00]), ErrorKind::UnsupportedTag);
        assert_eq!(kind(&[0xf9, 0x3c, 0x00]), ErrorKind::Float);
        assert_eq!(kind(&[0xf7]), ErrorKind::UnsupportedSimple);
        assert_eq!(kind(&[0x62, 0xff, 0xfe]), ErrorKind::InvalidUtf8);
        assert_eq!(
            kind(&[0x1b, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]),
            ErrorKind::IntegerOverflow
        );
        assert_eq!(kind(&[0x01, 0x01]), ErrorKind::TrailingBytes);
        assert_eq!(kind(&[0x82, 0x01]), ErrorKind::Truncated);
        assert_eq!(kind(&[0x5a, 0xff, 0xff, 0xff, 0xff]), ErrorKind::Truncated);
        assert_eq!(
            kind(&[0x9b, 0, 0, 0, 1, 0, 0, 0, 0]),
            ErrorKind::LengthLimit
        );
        assert_eq!(kind(&[0x1c]), ErrorKind::InvalidHeader);
        // tag 42 over something that is not 0x00 + CID
        assert_eq!(
            kind(&[0xd8, 0x2a, 0x42, 0x01, 0x02]),
            ErrorKind::InvalidLink
        );
        assert_eq!(kind(&[0xd8, 0x2a, 0x01]), ErrorKind::InvalidLink);
    }

    #[test]
    fn lenient_accepts_what_strict_rejects() {
        for bytes in [
            &[0x18, 0x05][..],
            &[0xa2, 0x61, 0x62, 0x01, 0x61, 0x61, 0x02],
            &[0xf9, 0x3c, 0x00],
            &[0xf7],
            &[0xc1, 0x00],
            &[0xa1, 0x01, 0x01],
        ] {
            decode(bytes, Options::lenient()).unwrap();
        }
        // but not indefinite lengths or bad UTF-8
        assert!(decode(&[0x9f, 0xff], Options::lenient()).is_err());
        assert!(decode(&[0x62, 0xff, 0xfe], Options::lenient()).is_err());
    }

    #[test]
    fn depth_limit() {
        let mut deep = vec![0x81u8; 100];
        deep.push(0x00);
        assert_eq!(kind(&deep), ErrorKind::DepthLimit);
        let mut ok = vec![0x81u8; 64];
        ok.push(0x00);
        decode(&ok, Options::strict()).unwrap();
    }

    #[test]
    fn error_offsets_point_at_the_item() {
        // [1, 2, 0x18 0x03]: the non-minimal int is at offset 3.
        let e = decode(&[0x83, 0x01, 0x02, 0x18, 0x03], Options::strict()).unwrap_err();
        assert_eq!((e.kind(), e.offset()), (ErrorKind::NonMinimal, 3));
    }

    #[test]
    fn failed_decode_leaves_tape_unchanged() {
        let bytes = [0x01, 0x82, 0x01];
        let mut arena = Arena::new();
        let mut tape = arena.tape(&bytes);
        let (_, stop) = tape.decode_prefix(0..3, &Options::strict()).unwrap();
        assert_eq!(tape.len(), 1);
        assert!(tape.decode_prefix(stop..3, &Options::strict()).is_err());
        assert_eq!(tape.len(), 1);
    }

    #[test]
    fn key_cmp_matches_slice_order() {
        // Every pair of equal-length windows of a buffer, near its end too (no 8-byte load).
        let buf = b"abcabdab\xffa\x00bcdefghiabcdefgiab";
        for len in 0..=10 {
            for a in 0..=buf.len() - len {
                for b in 0..=buf.len() - len {
                    let want = buf[a..a + len].cmp(&buf[b..b + len]);
                    assert_eq!(key_cmp(buf, a, b, len), want, "{a} {b} {len}");
                }
            }
        }
        assert!(is_utf8(b"hello world, ascii only"));
        assert!(is_utf8("h\u{e9}llo \u{1f600}".as_bytes()));
        assert!(!is_utf8(b"abcdefgh\xff"));
        assert!(!is_utf8(b"\xc3"));
    }

    #[test]
    fn half_floats() {
        assert_eq!(half_to_f64(0x3c00), 1.0);
        assert_eq!(half_to_f64(0xc000), -2.0);
        assert_eq!(half_to_f64(0x7c00), f64::INFINITY);
    }
}
