//! The decoder's fast path: recursive descent from DAG-CBOR bytes to the tape.
//!
//! Why a second decoder beside the loop in `tape.rs`: that loop keeps the innermost open container
//! in variables and its ancestors on a heap stack, so every item asks "am I a map key?", and every
//! finished item walks the "is my container complete?" bookkeeping; with the key-order state that is
//! more live state than x86-64 has registers (profiled: 80% of unverified frame decoding, spread
//! over spills and that bookkeeping, no single hot spot). Here a map is a loop over its pairs — a
//! key, then a value — and an array a loop over its items, so where an item stands is known from
//! the code, the container's state lives in its own call, and a finished container only writes
//! where its subtree ends. The common items (small integers, short strings, short containers,
//! atproto links, booleans and null) are one jump-table dispatch on the initial byte; everything
//! else goes through [`Descent::general`], which is the loop's general case item for item. The two
//! shapes every commit is mostly made of, MST tree entries and the MST nodes that hold them, have
//! paths of their own ([`Descent::mst_entry`], [`Descent::mst_node`]) that make the same nodes and
//! hand anything else back to the general ones.
//!
//! The results are exactly the loop's — the same tape, the same error kinds at the same offsets,
//! found in the same order — because both check each item completely, in input order, with the
//! same checks in the same order per item (unit tests compare the two over random inputs, mutated
//! real frames and every block of the corpus). Recursion depth is bounded by
//! [`Limits::max_depth`]; limits deeper than [`MAX_RECURSION`] use the loop, which needs no call
//! stack (a million-deep limit must not overflow a thread's stack).

use crate::cid::Cid;
use crate::error::{Error, ErrorKind};
use crate::tape::{
    check_key_order, half_to_f64, is_utf8, read_arg, read_len_arg, Kind, Limits, Node,
};

/// The deepest [`Limits::max_depth`] decoded here; deeper limits use the iterative loop. A level
/// costs one call frame of well under 200 bytes: 256 levels fit any thread's stack.
pub(crate) const MAX_RECURSION: usize = 256;

#[inline(always)]
fn err<T>(kind: ErrorKind, offset: usize) -> Result<T, Error> {
    Err(Error::new(kind, offset))
}

/// Whether an atproto-shaped link (see [`Descent::item`]'s `0xd8` case: 41 bytes) starts at `at`;
/// the offset of its CID bytes if so.
#[inline(always)]
fn atproto_link(input: &[u8], at: usize) -> Option<usize> {
    let link = input.get(at..at + 41)?;
    // The first eight bytes as one word, the codec byte (6) masked out: two compares, not nine.
    let head = u64::from_le_bytes(link[..8].try_into().ok()?);
    let codec = (head >> 48) as u8;
    let want = u64::from_le_bytes([0xd8, 0x2a, 0x58, 0x25, 0x00, 0x01, 0x00, 0x12]);
    (head & !(0xff << 48) == want && codec < 0x80 && link[8] == 0x20).then_some(at + 5)
}

/// State of one decode: the input up to the item's range end, the dialect and limits, the tape.
struct Descent<'i, 'n> {
    /// The base buffer cut at the end of the range being decoded: `input.len()` is the range end.
    input: &'i [u8],
    strict: bool,
    max_depth: usize,
    max_container_len: u64,
    nodes: &'n mut Vec<Node>,
}

/// Decodes one item starting at `start`, not reading at or past `end`; appends its nodes and returns
/// the offset just after it. The caller truncates `nodes` on error. `limits.max_depth` must be at
/// most [`MAX_RECURSION`].
pub(crate) fn decode(
    input: &[u8],
    start: usize,
    end: usize,
    strict: bool,
    limits: &Limits,
    nodes: &mut Vec<Node>,
) -> Result<usize, Error> {
    debug_assert!(limits.max_depth <= MAX_RECURSION);
    let mut d = Descent {
        input: &input[..end],
        strict,
        max_depth: limits.max_depth,
        max_container_len: limits.max_container_len,
        nodes,
    };
    d.item(start, 0)
}

impl Descent<'_, '_> {
    #[inline(always)]
    fn push(&mut self, kind: Kind, a: u32, b: u64) {
        self.nodes.push(Node { kind, a, b });
    }

    /// A byte or text string of `len` bytes at `pos` (its head at `at`): bounds, then UTF-8 for
    /// text, as the general path checks them.
    #[inline(always)]
    fn string(&mut self, text: bool, at: usize, pos: usize, len: usize) -> Result<usize, Error> {
        let input = self.input;
        if len > input.len() - pos {
            return err(ErrorKind::Truncated, at);
        }
        let kind = if text {
            if !is_utf8(&input[pos..pos + len]) {
                return err(ErrorKind::InvalidUtf8, at);
            }
            Kind::Text
        } else {
            Kind::Bytes
        };
        self.push(kind, len as u32, pos as u64);
        Ok(pos + len)
    }

    /// One item at `at`, inside `depth` open containers.
    #[inline(always)]
    fn item(&mut self, at: usize, depth: usize) -> Result<usize, Error> {
        let input = self.input;
        let Some(&ib) = input.get(at) else {
            return err(ErrorKind::Truncated, at);
        };
        let pos = at + 1;
        match ib {
            0x00..=0x17 => {
                self.push(Kind::UInt, 0, u64::from(ib));
                Ok(pos)
            }
            0x20..=0x37 => {
                self.push(Kind::NegInt, 0, u64::from(ib & 0x1f));
                Ok(pos)
            }
            0x40..=0x57 | 0x60..=0x77 => self.string(ib >= 0x60, at, pos, usize::from(ib & 0x1f)),
            // One-byte lengths (24..=255): signatures, DIDs, longer text.
            0x58 | 0x78 => {
                let Some(&len) = input.get(pos) else {
                    return err(ErrorKind::Truncated, at);
                };
                let (pos, len) = (pos + 1, usize::from(len));
                if len < 24 {
                    // Not minimal: the general path says so (strict) or accepts it (lenient).
                    return self.general(ib, at, depth);
                }
                self.string(ib == 0x78, at, pos, len)
            }
            0x80..=0x97 => self.array(at, pos, u64::from(ib & 0x1f), depth),
            0xa4 => match self.mst_entry(at, depth) {
                Some(end) => Ok(end),
                None => self.map(at, pos, 4, depth),
            },
            0xa2 if input.get(pos..pos + 2) == Some(b"\x61e") => match self.mst_node(at, depth) {
                Some(end) => Ok(end),
                None => self.map(at, pos, 2, depth),
            },
            0xa0..=0xb7 => self.map(at, pos, u64::from(ib & 0x1f), depth),
            // A link as atproto writes every one: tag 42, a 37-byte byte string, 0x00, a CIDv1
            // with a one-byte codec and a 32-byte SHA-256. The node the general path makes.
            0xd8 => {
                if let Some(cid) = atproto_link(input, at) {
                    self.push(Kind::Link, 36, cid as u64);
                    return Ok(at + 41);
                }
                self.general(ib, at, depth)
            }
            0xf4 => {
                self.push(Kind::Bool, 0, 0);
                Ok(pos)
            }
            0xf5 => {
                self.push(Kind::Bool, 1, 0);
                Ok(pos)
            }
            0xf6 => {
                self.push(Kind::Null, 0, 0);
                Ok(pos)
            }
            _ => self.general(ib, at, depth),
        }
    }

    /// A map of four pairs at `at` that is an MST tree entry as atproto writes every one —
    /// `{"k": bytes, "p": uint, "t": link or null, "v": link}`, the keys in canonical order,
    /// lengths and integers minimal, links of the atproto shape — gets its nine nodes here, the
    /// nodes [`Descent::map`] would make. Three quarters of a firehose frame's items are in these
    /// entries. Anything else (another shape, an error anywhere) is `None` and nothing is pushed:
    /// the general path then decodes the map and finds the error.
    #[inline(always)]
    fn mst_entry(&mut self, at: usize, depth: usize) -> Option<usize> {
        if depth >= self.max_depth || self.max_container_len < 4 {
            return None;
        }
        let input = self.input;
        // "k": a byte string (length minimal).
        let kat = at + 1;
        if input.get(kat..kat + 2)? != b"\x61k" {
            return None;
        }
        let (klen, kpos) = match *input.get(kat + 2)? {
            b @ 0x40..=0x57 => (usize::from(b & 0x1f), kat + 3),
            0x58 => match *input.get(kat + 3)? {
                n @ 24.. => (usize::from(n), kat + 4),
                _ => return None,
            },
            _ => return None,
        };
        // "p": an unsigned integer (minimal, below 2^8).
        let pat = kpos + klen;
        if input.get(pat..pat + 2)? != b"\x61p" {
            return None;
        }
        let (pval, tat) = match *input.get(pat + 2)? {
            b @ 0x00..=0x17 => (b, pat + 3),
            0x18 => match *input.get(pat + 3)? {
                n @ 24.. => (n, pat + 4),
                _ => return None,
            },
            _ => return None,
        };
        // "t": a link or null.
        if input.get(tat..tat + 2)? != b"\x61t" {
            return None;
        }
        let (t, vat) = if *input.get(tat + 2)? == 0xf6 {
            (None, tat + 3)
        } else {
            (Some(atproto_link(input, tat + 2)?), tat + 43)
        };
        // "v": a link.
        if input.get(vat..vat + 2)? != b"\x61v" {
            return None;
        }
        let v = atproto_link(input, vat + 2)?;
        let idx = self.nodes.len() as u64;
        let text1 = |at: usize| Node {
            kind: Kind::Text,
            a: 1,
            b: at as u64 + 1,
        };
        self.nodes.extend_from_slice(&[
            Node {
                kind: Kind::Map,
                a: 4,
                b: idx + 9,
            },
            text1(kat),
            Node {
                kind: Kind::Bytes,
                a: klen as u32,
                b: kpos as u64,
            },
            text1(pat),
            Node {
                kind: Kind::UInt,
                a: 0,
                b: u64::from(pval),
            },
            text1(tat),
            match t {
                Some(cid) => Node {
                    kind: Kind::Link,
                    a: 36,
                    b: cid as u64,
                },
                None => Node {
                    kind: Kind::Null,
                    a: 0,
                    b: 0,
                },
            },
            text1(vat),
            Node {
                kind: Kind::Link,
                a: 36,
                b: v as u64,
            },
        ]);
        Some(vat + 43)
    }

    /// A map of two pairs at `at` that is an MST node as atproto writes every one —
    /// `{"e": [entries], "l": link or null}`, the array's length minimal, every entry one that
    /// [`Descent::mst_entry`] takes, the link of the atproto shape — gets here the nodes
    /// [`Descent::map`] would make.
    ///
    /// Why: most of a firehose commit's blocks are MST nodes of under five entries. Through
    /// `map`, a node paid the general key and item handling around its two keys (37 ns for a node
    /// with no entries, profiled on the real capture, Zen 3), and each entry went through
    /// [`Descent::item`]'s dispatch inside `array`, a function too large to keep the parse in
    /// registers. Here the node's frame is a few compares and the entries a loop of their own:
    /// MST nodes decode in two thirds of the time.
    ///
    /// Anything else — another shape, or an error anywhere inside — is `None` with the tape as it
    /// was: the caller then decodes the map with [`Descent::map`], which finds the same nodes or
    /// the error exactly as it always has. A refused node is read at most twice, never more: this
    /// path reads only the node's own entries, which hold no containers, and stops at the first
    /// item that is not one, so no byte is read by two attempts of it.
    #[inline(never)]
    fn mst_node(&mut self, at: usize, depth: usize) -> Option<usize> {
        let idx = self.nodes.len();
        let end = self.mst_node_at(at, depth, idx);
        if end.is_none() {
            self.nodes.truncate(idx);
        }
        end
    }

    /// [`Descent::mst_node`]'s work; on `None` it may leave nodes from `idx` on.
    #[inline(always)]
    fn mst_node_at(&mut self, at: usize, depth: usize, idx: usize) -> Option<usize> {
        let input = self.input;
        // `map`'s checks before its first key: the length limit and depth. (Its third, room for
        // four items, holds for any input this accepts: the shape is at least six bytes more.)
        if self.max_container_len < 2 || depth >= self.max_depth {
            return None;
        }
        // "e" (checked by the caller), then the array's head, its length minimal.
        let aat = at + 3;
        let (n, first) = match *input.get(aat)? {
            b @ 0x80..=0x97 => (u64::from(b & 0x1f), aat + 1),
            0x98 => match *input.get(aat + 1)? {
                n @ 24.. => (u64::from(n), aat + 2),
                _ => return None,
            },
            _ => return None,
        };
        // `array`'s length checks. (Its depth check is `mst_entry`'s, one level deeper: an entry
        // fails it wherever `array` would.)
        self.open(aat, first, n, n).ok()?;
        self.push(Kind::Map, 2, 0);
        self.push(Kind::Text, 1, at as u64 + 2);
        self.push(Kind::Array, n as u32, 0);
        let mut pos = first;
        for _ in 0..n {
            if *input.get(pos)? != 0xa4 {
                return None;
            }
            pos = self.mst_entry(pos, depth + 2)?;
        }
        self.nodes[idx + 2].b = self.nodes.len() as u64;
        // "l": null or a link.
        if input.get(pos..pos + 2)? != b"\x61l" {
            return None;
        }
        self.push(Kind::Text, 1, pos as u64 + 1);
        let end = if *input.get(pos + 2)? == 0xf6 {
            self.push(Kind::Null, 0, 0);
            pos + 3
        } else {
            let cid = atproto_link(input, pos + 2)?;
            self.push(Kind::Link, 36, cid as u64);
            pos + 43
        };
        self.nodes[idx].b = self.nodes.len() as u64;
        Some(end)
    }

    /// A map key in strict mode: a text string in canonical order after `prev` (offset, length;
    /// length `u32::MAX` before the first key). The checks of the loop's key position, in order.
    #[inline(always)]
    fn key(&mut self, at: usize, prev: &mut (u32, u32)) -> Result<usize, Error> {
        let input = self.input;
        let Some(&ib) = input.get(at) else {
            return err(ErrorKind::Truncated, at);
        };
        if ib >> 5 != 3 {
            return err(ErrorKind::NonTextKey, at);
        }
        let mut pos = at + 1;
        let len = if ib < 0x78 {
            usize::from(ib & 0x1f)
        } else {
            let info = ib & 0x1f;
            let v = read_len_arg(input, &mut pos, input.len(), info, at, true)?;
            if v > (input.len() - pos) as u64 {
                return err(ErrorKind::Truncated, at);
            }
            v as usize
        };
        if len > input.len() - pos {
            return err(ErrorKind::Truncated, at);
        }
        if !is_utf8(&input[pos..pos + len]) {
            return err(ErrorKind::InvalidUtf8, at);
        }
        check_key_order(input, prev, pos, len, at)?;
        self.push(Kind::Text, len as u32, pos as u64);
        Ok(pos + len)
    }

    /// The container checks of the loop: length limit, room for the items, depth (only when the
    /// container has items). `items` counts keys and values separately.
    #[inline(always)]
    fn open(&self, at: usize, pos: usize, arg: u64, items: u64) -> Result<(), Error> {
        if arg > self.max_container_len {
            return err(ErrorKind::LengthLimit, at);
        }
        // Every item takes at least one byte: a longer declared length cannot fit.
        if items > (self.input.len() - pos) as u64 {
            return err(ErrorKind::Truncated, at);
        }
        Ok(())
    }

    /// An array of `n` items whose header is at `at` and whose first item is at `pos`.
    #[inline(never)]
    fn array(&mut self, at: usize, mut pos: usize, n: u64, depth: usize) -> Result<usize, Error> {
        self.open(at, pos, n, n)?;
        let idx = self.nodes.len();
        self.push(Kind::Array, n as u32, idx as u64 + 1);
        if n == 0 {
            return Ok(pos);
        }
        if depth >= self.max_depth {
            return err(ErrorKind::DepthLimit, at);
        }
        for _ in 0..n {
            pos = self.item(pos, depth + 1)?;
        }
        self.nodes[idx].b = self.nodes.len() as u64;
        Ok(pos)
    }

    /// A map of `pairs` pairs whose header is at `at` and whose first key is at `pos`.
    #[inline(never)]
    fn map(&mut self, at: usize, mut pos: usize, pairs: u64, depth: usize) -> Result<usize, Error> {
        // (Saturating: with the limit lifted, 2^63 pairs must not wrap to 0 items.)
        self.open(at, pos, pairs, pairs.saturating_mul(2))?;
        let idx = self.nodes.len();
        self.push(Kind::Map, pairs as u32, idx as u64 + 1);
        if pairs == 0 {
            return Ok(pos);
        }
        if depth >= self.max_depth {
            return err(ErrorKind::DepthLimit, at);
        }
        if self.strict {
            let mut prev = (0u32, u32::MAX);
            for _ in 0..pairs {
                pos = self.key(pos, &mut prev)?;
                pos = self.item(pos, depth + 1)?;
            }
        } else {
            for _ in 0..pairs {
                pos = self.item(pos, depth + 1)?;
                pos = self.item(pos, depth + 1)?;
            }
        }
        self.nodes[idx].b = self.nodes.len() as u64;
        Ok(pos)
    }

    /// Every other item: the loop's general case (arguments of 1–8 bytes, tags, floats, simple
    /// values, reserved and indefinite headers), with the same checks in the same order.
    #[cold]
    #[inline(never)]
    fn general(&mut self, ib: u8, at: usize, depth: usize) -> Result<usize, Error> {
        let input = self.input;
        let end = input.len();
        let strict = self.strict;
        let mut pos = at + 1;
        let major = ib >> 5;
        let info = ib & 0x1f;
        let arg = if info < 24 {
            u64::from(info)
        } else if major == 7 {
            0
        } else {
            read_len_arg(input, &mut pos, end, info, at, strict)?
        };
        let (kind, a, b) = match major {
            0 | 1 => {
                if strict && arg > i64::MAX as u64 {
                    return err(ErrorKind::IntegerOverflow, at);
                }
                let kind = if major == 0 { Kind::UInt } else { Kind::NegInt };
                (kind, 0, arg)
            }
            2 | 3 => {
                if arg > (end - pos) as u64 {
                    return err(ErrorKind::Truncated, at);
                }
                let len = arg as usize;
                if major == 3 && !is_utf8(&input[pos..pos + len]) {
                    return err(ErrorKind::InvalidUtf8, at);
                }
                let kind = if major == 2 { Kind::Bytes } else { Kind::Text };
                self.push(kind, len as u32, pos as u64);
                return Ok(pos + len);
            }
            4 => return self.array(at, pos, arg, depth),
            5 => return self.map(at, pos, arg, depth),
            6 => {
                if arg == 42 {
                    return self.link(at, pos);
                }
                if strict {
                    return err(ErrorKind::UnsupportedTag, at);
                }
                // Lenient: a tag node with one child.
                let idx = self.nodes.len();
                self.push(Kind::Tag, arg as u32, idx as u64 + 1);
                if depth >= self.max_depth {
                    return err(ErrorKind::DepthLimit, at);
                }
                let pos = self.item(pos, depth + 1)?;
                self.nodes[idx].b = self.nodes.len() as u64;
                return Ok(pos);
            }
            _ => match info {
                20 => (Kind::Bool, 0, 0),
                21 => (Kind::Bool, 1, 0),
                22 => (Kind::Null, 0, 0),
                25..=27 => {
                    if strict {
                        return err(ErrorKind::Float, at);
                    }
                    let raw = read_arg(input, &mut pos, end, info, at)?;
                    let f = match info {
                        25 => half_to_f64(raw as u16),
                        26 => f64::from(f32::from_bits(raw as u32)),
                        _ => f64::from_bits(raw),
                    };
                    (Kind::Float, 0, f.to_bits())
                }
                28..=31 => return err(ErrorKind::InvalidHeader, at),
                _ if strict => return err(ErrorKind::UnsupportedSimple, at),
                23 => (Kind::Undefined, 0, 0),
                24 => {
                    let v = read_arg(input, &mut pos, end, info, at)?;
                    (Kind::Simple, v as u32, 0)
                }
                _ => (Kind::Simple, u32::from(info), 0),
            },
        };
        self.push(kind, a, b);
        Ok(pos)
    }

    /// Tag 42 at `at`, its content at `pos`: a byte string holding 0x00 then a binary CID.
    fn link(&mut self, at: usize, mut pos: usize) -> Result<usize, Error> {
        let input = self.input;
        let end = input.len();
        let Some(&bh) = input.get(pos) else {
            return err(ErrorKind::Truncated, pos);
        };
        if bh >> 5 != 2 {
            return err(ErrorKind::InvalidLink, at);
        }
        pos += 1;
        let binfo = bh & 0x1f;
        let blen = if binfo < 24 {
            u64::from(binfo)
        } else {
            read_len_arg(input, &mut pos, end, binfo, at, self.strict)?
        };
        if blen > (end - pos) as u64 {
            return err(ErrorKind::Truncated, at);
        }
        let blen = blen as usize;
        let content = &input[pos..pos + blen];
        if content.first() != Some(&0x00) || Cid::from_bytes(&content[1..]).is_err() {
            return err(ErrorKind::InvalidLink, at);
        }
        self.push(Kind::Link, (blen - 1) as u32, pos as u64 + 1);
        Ok(pos + blen)
    }
}

#[cfg(test)]
mod tests {
    //! The fast path against the loop (the reference): the same nodes, stop offset and error, over
    //! every item of the real corpora, mutations of them, MST entries built from valid and invalid
    //! parts, and random bytes; strict and lenient; default and tiny limits.
    #![allow(clippy::unwrap_used)]

    use proptest::prelude::*;

    use super::*;
    use crate::tape::{decode_loop, Arena, Limits, Mode, Options};
    use crate::{read_varint, Cid};

    type Outcome = Result<(usize, Vec<(Kind, u32, u64)>), Error>;

    fn run(fast: bool, input: &[u8], start: usize, end: usize, opts: &Options) -> Outcome {
        let strict = opts.mode == Mode::Strict;
        let mut arena = Arena::new();
        let stop = if fast {
            decode(input, start, end, strict, &opts.limits, &mut arena.nodes)?
        } else {
            decode_loop(input, start, end, strict, &opts.limits, &mut arena)?
        };
        let nodes = arena.nodes.iter().map(|n| (n.kind, n.a, n.b)).collect();
        Ok((stop, nodes))
    }

    /// Every dialect with the default limits and with limits the tests reach: both tiny; one
    /// limit at a time, so neither check hides the other; and those an MST node's entries (maps
    /// of four, two levels below the node) meet or just miss. `None` keeps the default.
    fn options() -> Vec<Options> {
        let limits = [
            (None, None),
            (Some(1), Some(3)),
            (Some(0), Some(0)),
            (Some(0), None),
            (None, Some(1)),
            (Some(2), None),
            (Some(3), None),
            (None, Some(4)),
        ];
        let d = Limits::default();
        let mut all = Vec::new();
        for mode in [Mode::Strict, Mode::Lenient] {
            for (depth, len) in limits {
                let limits = Limits {
                    max_depth: depth.unwrap_or(d.max_depth),
                    max_container_len: len.unwrap_or(d.max_container_len),
                    ..d
                };
                all.push(Options { mode, limits });
            }
        }
        all
    }

    /// Both decoders over `input[start..end]` with every option set; returns the default strict
    /// outcome.
    fn same(input: &[u8], start: usize, end: usize) -> Outcome {
        let mut first = None;
        for opts in options() {
            let want = run(false, input, start, end, &opts);
            let got = run(true, input, start, end, &opts);
            assert_eq!(got, want, "{opts:?} over {:02x?}", &input[start..end]);
            first.get_or_insert(want);
        }
        first.unwrap()
    }

    /// Every item of a corpus frames file: header and payload of each frame, and every block
    /// of each frame's CAR; returns (frame, start, end) of each item.
    fn corpus_items(file: &[u8]) -> Vec<(usize, usize, usize)> {
        let count = u32::from_be_bytes(file[..4].try_into().unwrap()) as usize;
        let mut items = Vec::new();
        let mut at = 4;
        for _ in 0..count {
            let len = u32::from_be_bytes(file[at..at + 4].try_into().unwrap()) as usize;
            let (start, end) = (at + 4, at + 4 + len);
            at = end;
            let (hend, _) = same(file, start, end).unwrap();
            items.push((start, start, end));
            let (_, nodes) = same(file, hend, end).unwrap();
            items.push((start, hend, end));
            // The payload's `blocks` (a CAR), if any: the bytes node after the key "blocks".
            let blocks = nodes.windows(2).find_map(|w| match (w[0], w[1]) {
                ((Kind::Text, 6, k), (Kind::Bytes, n, b))
                    if &file[k as usize..k as usize + 6] == b"blocks" =>
                {
                    Some((b as usize, n as usize))
                }
                _ => None,
            });
            if let Some((car, n)) = blocks {
                items.extend(car_blocks(&file[..car + n], car).map(|(s, e)| (start, s, e)));
            }
        }
        items
    }

    /// The (start, end) of every block of the CAR at `car` in `bytes` (which ends with it).
    fn car_blocks(bytes: &[u8], car: usize) -> impl Iterator<Item = (usize, usize)> + '_ {
        let (hlen, n) = read_varint(&bytes[car..]).unwrap();
        let mut at = car + n + hlen as usize;
        std::iter::from_fn(move || {
            if at >= bytes.len() {
                return None;
            }
            let (len, n) = read_varint(&bytes[at..]).unwrap();
            let section = at + n;
            at = section + len as usize;
            let (_, clen) = Cid::read_prefix(&bytes[section..]).unwrap();
            Some((section + clen, at))
        })
    }

    #[test]
    fn the_corpus_decodes_the_same() {
        let Some(file) = riptide_testdata::read("jetstream-2026-07/firehose-frames.bin") else {
            return;
        };
        let items = corpus_items(&file);
        assert!(items.len() > 1500, "{} items", items.len());
        for &(_, s, e) in &items {
            same(&file, s, e).unwrap();
        }
        let Some(repo) = riptide_testdata::read("jetstream-2026-07/repo.car") else {
            return;
        };
        let blocks: Vec<_> = car_blocks(&repo, 0).collect();
        assert!(blocks.len() > 20, "{} blocks", blocks.len());
        for (s, e) in blocks {
            same(&repo, s, e).unwrap();
        }
    }

    #[test]
    fn mutated_corpus_items_decode_the_same() {
        let Some(file) = riptide_testdata::read("jetstream-2026-07/firehose-frames.bin") else {
            return;
        };
        let items = corpus_items(&file);
        let mut rng = proptest::test_runner::TestRng::deterministic_rng(
            proptest::test_runner::RngAlgorithm::ChaCha,
        );
        let mut errors = 0;
        for round in 0..20 {
            for &(_, s, e) in &items {
                let mut bytes = file[s..e].to_vec();
                // One to three changes: a byte set to a random or a structural value, a byte
                // removed, or the item cut short.
                for _ in 0..1 + rng.random_range(0..3) {
                    if bytes.is_empty() {
                        break;
                    }
                    let i = rng.random_range(0..bytes.len());
                    match (round + i) % 4 {
                        0 => bytes[i] = rng.random(),
                        1 => bytes[i] = [0x00, 0x18, 0x40, 0x58, 0x61, 0xa4, 0xd8, 0xf6][i % 8],
                        2 => {
                            bytes.remove(i);
                        }
                        _ => bytes.truncate(i),
                    }
                }
                if same(&bytes, 0, bytes.len()).is_err() {
                    errors += 1;
                }
            }
        }
        assert!(errors > 1000, "only {errors} mutations were rejected");
    }

    /// MST tree entries from parts that are each valid (three times in four) or a near miss.
    fn mst_entry() -> impl Strategy<Value = Vec<u8>> {
        let link = |b: u8| {
            let mut l = vec![0xd8, 0x2a, 0x58, 0x25, 0x00, 0x01, 0x71, 0x12, 0x20];
            l.extend([b; 32]);
            l
        };
        let part = |valid: Vec<Vec<u8>>, invalid: Vec<Vec<u8>>| {
            prop_oneof![
                3 => proptest::sample::select(valid),
                1 => proptest::sample::select(invalid),
            ]
        };
        let key = |c: u8| {
            part(
                vec![vec![0x61, c]],
                vec![
                    vec![0x61, c + 1],
                    vec![0x62, c, c],
                    vec![0x41, c],
                    vec![0x78, 1, c],
                ],
            )
        };
        let mut bad_codec = link(5);
        bad_codec[6] = 0x80;
        let mut bad_len = link(9);
        bad_len[3] = 0x24;
        (
            part(
                vec![vec![0xa4]],
                vec![vec![0xa3], vec![0xa5], vec![0xb8, 4]],
            ),
            key(b'k'),
            part(
                vec![
                    vec![0x43, 1, 2, 3],
                    vec![0x40],
                    [&[0x58, 30][..], &[7; 30]].concat(),
                    [&[0x58, 24][..], &[7; 24]].concat(),
                    [&[0x57][..], &[7; 23]].concat(),
                ],
                vec![
                    [&[0x58, 23][..], &[7; 23]].concat(),
                    vec![0x63, 1, 2, 3],
                    vec![0x57],
                    vec![0x59, 0, 1, 1],
                ],
            ),
            key(b'p'),
            part(
                vec![vec![0x00], vec![0x17], vec![0x18, 24], vec![0x18, 0xff]],
                vec![vec![0x18, 23], vec![0x18, 3], vec![0x19, 1, 0], vec![0x20]],
            ),
            key(b't'),
            part(
                vec![vec![0xf6], link(3), link(4)],
                vec![link(4)[..40].to_vec(), vec![0xf7], vec![0xf5], bad_codec],
            ),
            key(b'v'),
            part(
                vec![link(6), link(7)],
                vec![vec![0xf6], link(8)[..30].to_vec(), bad_len],
            ),
        )
            .prop_map(|(m, k, kv, p, pv, t, tv, v, vv)| [m, k, kv, p, pv, t, tv, v, vv].concat())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn mst_entries_decode_the_same(
            entries in proptest::collection::vec(mst_entry(), 1..4),
            many in any::<bool>(),
            head in 0..4usize,
            tail in 0..6usize,
            cut in any::<proptest::sample::Index>(),
            nest in 0..3usize,
        ) {
            // An MST node holding the entries (or 24 or more of them, for a two-byte array
            // head), inside `nest` one-item arrays; whole and cut. Its "e" and "l" as atproto
            // writes them, or near misses: another key, a non-minimal array head, "l" holding
            // neither null nor an atproto link.
            let entries: Vec<Vec<u8>> = if many {
                entries.iter().cycle().take(24 + entries.len()).cloned().collect()
            } else {
                entries
            };
            let n = entries.len() as u8;
            let mut bytes = vec![0x81; nest];
            bytes.extend(match head {
                0 | 1 if n < 24 => vec![0xa2, 0x61, b'e', 0x80 + n],
                0 | 1 => vec![0xa2, 0x61, b'e', 0x98, n],
                2 => vec![0xa2, 0x61, b'e', 0x98, n],
                _ => vec![0xa2, 0x61, b'f', 0x80 + n % 24],
            });
            bytes.extend(entries.concat());
            let mut link = vec![0xd8, 0x2a, 0x58, 0x25, 0x00, 0x01, 0x71, 0x12, 0x20];
            link.extend([9; 32]);
            let mut bad = link.clone();
            bad[6] = 0x80;
            bytes.extend(match tail {
                0 | 1 => vec![0x61, b'l', 0xf6],
                2 => [&[0x61, b'l'][..], &link].concat(),
                3 => [&[0x61, b'l'][..], &bad].concat(),
                4 => vec![0x61, b'l', 0xf5],
                _ => vec![0x61, b'd', 0xf6],
            });
            same(&bytes, 0, bytes.len()).ok();
            let c = cut.index(bytes.len());
            same(&bytes, 0, c).ok();
            same(&bytes, c, bytes.len()).ok();
        }

        #[test]
        fn random_bytes_decode_the_same(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            same(&bytes, 0, bytes.len()).ok();
        }

        #[test]
        fn structural_bytes_decode_the_same(
            bytes in proptest::collection::vec(
                proptest::sample::select(vec![
                    0x00, 0x01, 0x17, 0x18, 0x19, 0x1b, 0x20, 0x38, 0x40, 0x41, 0x58, 0x5f,
                    0x60, 0x61, 0x62, 0x78, 0x7f, 0x80, 0x81, 0x82, 0x98, 0x9f, 0xa0, 0xa1,
                    0xa2, 0xa4, 0xb8, 0xbf, 0xc1, 0xd8, 0x2a, 0xf4, 0xf5, 0xf6, 0xf7, 0xf8,
                    0xf9, 0xfb, 0xff, b'a', b'b',
                ]),
                0..48,
            )
        ) {
            same(&bytes, 0, bytes.len()).ok();
        }
    }
}
