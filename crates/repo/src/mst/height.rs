//! Key heights, common prefixes and key syntax: the arithmetic the MST shape is made of.
//!
//! Why: every structural rule of the atproto MST comes down to these three functions. A key's
//! *height* (the layer it lives on) is the number of leading zero bits of SHA-256(key), counted in
//! 2-bit chunks (fanout 4). Entries store keys prefix-compressed against the previous key of the
//! same node, so the exact common prefix length is part of the canonical encoding.
//!
//! What it does not do: any tree logic. Heights fit in a `u8` (at most 128 for a 256-bit hash).

use sha2::{Digest, Sha256};

/// Longest key accepted, in bytes (the reference implementation's limit).
pub const MAX_KEY_LEN: usize = 1024;

/// The MST layer of `key`: leading zero bits of SHA-256(key), divided by two (floor).
#[inline]
pub fn key_height(key: &[u8]) -> u32 {
    height_of_digest(&Sha256::digest(key).into())
}

/// Leading zero bits of a digest, divided by two: the height a key with this SHA-256 has.
#[inline]
pub fn height_of_digest(digest: &[u8; 32]) -> u32 {
    let mut zeros = 0u32;
    for &b in digest.iter() {
        if b == 0 {
            zeros += 8;
        } else {
            zeros += b.leading_zeros();
            break;
        }
    }
    zeros / 2
}

/// The heights of two keys, hashed together (see `riptide-sha`: two short messages cost little
/// more than one). Equal to two calls of [`key_height`].
#[inline]
pub fn key_height_pair(a: &[u8], b: &[u8]) -> (u32, u32) {
    let (x, y) = riptide_sha::sha256_pair(a, b);
    (height_of_digest(&x), height_of_digest(&y))
}

/// Length of the longest common prefix of `a` and `b`, in bytes.
#[inline]
pub fn common_prefix_len(a: &[u8], b: &[u8]) -> usize {
    // Compare eight bytes at a time; keys share long collection prefixes.
    let n = a.len().min(b.len());
    let mut i = 0;
    while i + 8 <= n {
        let x = u64::from_le_bytes(chunk8(&a[i..i + 8]));
        let y = u64::from_le_bytes(chunk8(&b[i..i + 8]));
        let d = x ^ y;
        if d != 0 {
            return i + (d.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    while i < n && a[i] == b[i] {
        i += 1;
    }
    i
}

#[inline(always)]
fn chunk8(s: &[u8]) -> [u8; 8] {
    let mut out = [0u8; 8];
    out.copy_from_slice(s);
    out
}

/// Whether `key` is a valid MST key: `collection/rkey`, both parts non-empty, characters from
/// `A-Z a-z 0-9 _ ~ - : .`, at most [`MAX_KEY_LEN`] bytes.
#[inline]
pub fn is_valid_key(key: &[u8]) -> bool {
    key_slash(key).is_some()
}

/// [`is_valid_key`], giving the position of the key's slash when it is valid.
#[inline]
pub(crate) fn key_slash(key: &[u8]) -> Option<usize> {
    if key.is_empty() || key.len() > MAX_KEY_LEN {
        return None;
    }
    let (invalid, slashes, last) = classes(key);
    (invalid == 0 && slashes == 1 && last > 0 && last + 1 < key.len()).then_some(last)
}

/// [`key_slash`] of a key whose first `p` bytes are those of a valid key with its slash at
/// `prev_slash` (the previous key of the same node, which shares exactly that prefix): only the
/// bytes after the prefix are looked at, the prefix's verdict is known. Within a node keys share
/// their collection and often most of the record key, so this reads a fraction of the bytes
/// (profiled: the syntax check was a tenth of a repository walk).
#[inline]
pub(crate) fn key_slash_after(key: &[u8], p: usize, prev_slash: usize) -> Option<usize> {
    if key.is_empty() || key.len() > MAX_KEY_LEN || p > key.len() {
        return None;
    }
    // The usual case, a prefix past the slash: the rest must be plain key bytes, no slash; one
    // comparison per byte instead of counting classes (profiled: `classes` was the largest part
    // of decoding a node).
    if p > prev_slash {
        let plain = key[p..]
            .iter()
            .fold(true, |ok, &c| ok & (KEY_CLASS[c as usize] == 1));
        return (plain && prev_slash > 0 && prev_slash + 1 < key.len()).then_some(prev_slash);
    }
    let (invalid, slashes, last) = classes(&key[p..]);
    if invalid != 0 {
        return None;
    }
    // The prefix holds the previous key's slash exactly when it extends past it; otherwise it
    // holds no slash at all (a valid key has one).
    let slash = if p > prev_slash {
        (slashes == 0).then_some(prev_slash)?
    } else {
        (slashes == 1).then_some(p + last)?
    };
    (slash > 0 && slash + 1 < key.len()).then_some(slash)
}

/// Invalid bytes, slashes, and the position of the last slash (0 if none) in `bytes`.
/// Branch-free over the bytes: a table gives each byte's class, and only counts come out.
#[inline]
fn classes(bytes: &[u8]) -> (u32, u32, usize) {
    let mut invalid = 0u32;
    let mut slashes = 0u32;
    let mut slash_at = 0usize;
    for (i, &c) in bytes.iter().enumerate() {
        let class = KEY_CLASS[c as usize];
        invalid += u32::from(class == 0);
        let is_slash = class == 2;
        slashes += u32::from(is_slash);
        if is_slash {
            slash_at = i;
        }
    }
    (invalid, slashes, slash_at)
}

/// Byte classes of keys: 0 not allowed, 1 allowed, 2 the `/` between collection and rkey.
static KEY_CLASS: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut c = 0;
    while c < 256 {
        let b = c as u8;
        if b.is_ascii_alphanumeric() || matches!(b, b'_' | b'~' | b'-' | b':' | b'.') {
            t[c] = 1;
        }
        c += 1;
    }
    t[b'/' as usize] = 2;
    t
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heights_from_the_spec() {
        assert_eq!(key_height(b""), 0);
        assert_eq!(key_height(b"asdf"), 0);
        assert_eq!(key_height(b"blue"), 1);
        assert_eq!(key_height(b"2653ae71"), 0);
        assert_eq!(key_height(b"88bfafc7"), 2);
        assert_eq!(key_height(b"2a92d355"), 4);
        assert_eq!(key_height(b"884976f5"), 6);
        assert_eq!(key_height(b"app.bsky.feed.post/454397e440ec"), 4);
        assert_eq!(key_height(b"app.bsky.feed.post/9adeb165882c"), 8);
    }

    #[test]
    fn prefixes() {
        assert_eq!(common_prefix_len(b"", b""), 0);
        assert_eq!(common_prefix_len(b"abc", b"abc"), 3);
        assert_eq!(common_prefix_len(b"abcde", b"abc1"), 3);
        assert_eq!(common_prefix_len(b"abc\0", b"abc"), 3);
        let a = b"app.bsky.feed.post/3lo3kqqljmfe2";
        let b = b"app.bsky.feed.post/3log4547dm6h2";
        assert_eq!(common_prefix_len(a, b), 22);
        for i in 0..a.len() {
            let mut c = a.to_vec();
            c[i] ^= 1;
            assert_eq!(common_prefix_len(a, &c), i);
        }
    }

    #[test]
    fn key_syntax() {
        assert!(is_valid_key(b"app.bsky.feed.post/3lo3kqqljmfe2"));
        assert!(is_valid_key(b"A0/374913"));
        assert!(is_valid_key(b"com.example.record/self:~_-."));
        for bad in [
            &b""[..],
            b"/",
            b"a/",
            b"/b",
            b"a/b/c",
            b"a b/c",
            b"a/\xff",
            b"nocollection",
        ] {
            assert!(!is_valid_key(bad), "{bad:?}");
        }
        let long = [b'a'; MAX_KEY_LEN];
        let mut k = long.to_vec();
        k[3] = b'/';
        assert!(is_valid_key(&k));
        k.push(b'a');
        assert!(!is_valid_key(&k));
    }

    #[test]
    fn syntax_after_a_shared_prefix_is_the_full_check() {
        // Every valid `prev` and every key sharing a prefix of it, over an alphabet with valid
        // bytes, slashes and an invalid byte: the incremental check gives the full one's answer.
        let alphabet = [b'a', b'/', b' ', b'.'];
        let mut words: Vec<Vec<u8>> = vec![vec![]];
        let mut frontier = words.clone();
        for _ in 0..5 {
            let mut next = Vec::new();
            for w in &frontier {
                for &c in &alphabet {
                    let mut x = w.clone();
                    x.push(c);
                    next.push(x);
                }
            }
            words.extend(next.iter().cloned());
            frontier = next;
        }
        let suffixes: Vec<&Vec<u8>> = words.iter().filter(|w| w.len() <= 3).collect();
        let mut checked = 0usize;
        for prev in words.iter().filter(|w| is_valid_key(w)) {
            let prev_slash = key_slash(prev).unwrap();
            assert_eq!(prev[prev_slash], b'/');
            for p in 0..=prev.len() {
                for suffix in &suffixes {
                    let mut key = prev[..p].to_vec();
                    key.extend_from_slice(suffix);
                    let full = key_slash(&key);
                    assert_eq!(full.is_some(), is_valid_key(&key));
                    assert_eq!(
                        key_slash_after(&key, p, prev_slash),
                        full,
                        "{prev:?} {key:?}"
                    );
                    checked += 1;
                }
            }
        }
        assert!(checked > 30_000, "{checked}");
    }
}
