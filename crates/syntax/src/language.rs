//! Lexicon `language` strings: BCP 47 language tags such as a post's `langs`.
//!
//! Clients filter and index posts by language, so tags must at least be
//! well-formed (<https://atproto.com/specs/lexicon#language>, RFC 5646
//! section 2.1). The grammar follows the atproto reference implementation: the
//! primary language subtag is 2 or 3 lower-case letters (so `JA` and the
//! reserved 4-letter form `jaja` are rejected), followed in order by up to
//! three extlangs, a script, a region, variants, extensions and a private-use
//! part; a tag may also be private-use only (`x-...`, `X-...`) or one of the
//! grandfathered tags of RFC 5646 (matched exactly).
//!
//! [`is_valid_language`] checks that grammar ("well-formed"). The
//! [`Language`] type also rejects a repeated variant or extension singleton
//! (compared case-insensitively), which RFC 5646 section 2.2.9 rules out of a
//! "valid" tag and which the spec says clients should ignore.

use crate::{Format, SyntaxError, SyntaxErrorKind};

/// The grandfathered tags of RFC 5646 section 2.2.8, which need not follow
/// the normal grammar.
const GRANDFATHERED: &[&str] = &[
    "en-GB-oed",
    "i-ami",
    "i-bnn",
    "i-default",
    "i-enochian",
    "i-hak",
    "i-klingon",
    "i-lux",
    "i-mingo",
    "i-navajo",
    "i-pwn",
    "i-tao",
    "i-tay",
    "i-tsu",
    "sgn-BE-FR",
    "sgn-BE-NL",
    "sgn-CH-DE",
    "art-lojban",
    "cel-gaulish",
    "no-bok",
    "no-nyn",
    "zh-guoyu",
    "zh-hakka",
    "zh-min",
    "zh-min-nan",
    "zh-xiang",
];

/// Returns whether `s` is a well-formed language tag.
pub fn is_valid_language(s: &str) -> bool {
    validate(s, false).is_ok()
}

/// Walks the `-`-separated subtags of a tag, tracking byte offsets.
struct Cursor<'a> {
    s: &'a [u8],
    /// Byte offset of the next subtag; past the end when exhausted.
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn peek(&self) -> Option<&'a [u8]> {
        let rest = self.s.get(self.pos..)?;
        rest.split(|&c| c == b'-').next()
    }

    /// Consumes the next subtag if `accept` says so.
    fn take_if(&mut self, accept: impl Fn(&[u8]) -> bool) -> Option<&'a [u8]> {
        let t = self.peek().filter(|t| accept(t))?;
        self.pos += t.len() + 1;
        Some(t)
    }

    /// Whether `t` already occurs, as a subtag accepted by `same_kind`, in
    /// the bytes `from..self.pos`.
    fn seen(&self, from: usize, t: &[u8], same_kind: impl Fn(&[u8]) -> bool) -> bool {
        self.s
            .get(from..self.pos.min(self.s.len()))
            .unwrap_or_default()
            .split(|&c| c == b'-')
            .any(|p| same_kind(p) && p.eq_ignore_ascii_case(t))
    }
}

fn alpha(t: &[u8], len: usize) -> bool {
    t.len() == len && t.iter().all(u8::is_ascii_alphabetic)
}

fn is_private_use_marker(t: &[u8]) -> bool {
    t == b"x" || t == b"X"
}

fn is_variant(t: &[u8]) -> bool {
    (5..=8).contains(&t.len()) || (t.len() == 4 && t[0].is_ascii_digit())
}

fn is_singleton(t: &[u8]) -> bool {
    t.len() == 1 && !is_private_use_marker(t)
}

pub(crate) fn validate(s: &str, strict: bool) -> Result<(), SyntaxErrorKind> {
    let b = s.as_bytes();
    if b.is_empty() {
        return Err(SyntaxErrorKind::Empty);
    }
    if GRANDFATHERED.contains(&s) {
        return Ok(());
    }
    // Every subtag is 1..=8 ASCII letters or digits.
    let mut start = 0;
    for t in b.split(|&c| c == b'-') {
        if let Some(i) = t.iter().position(|c| !c.is_ascii_alphanumeric()) {
            return Err(SyntaxErrorKind::BadCharacter { index: start + i });
        }
        if t.is_empty() || t.len() > 8 {
            return Err(SyntaxErrorKind::BadSegment { index: start });
        }
        start += t.len() + 1;
    }

    let mut cur = Cursor { s: b, pos: 0 };
    if cur.take_if(is_private_use_marker).is_none() {
        cur.take_if(|t| (2..=3).contains(&t.len()) && t.iter().all(u8::is_ascii_lowercase))
            .ok_or(SyntaxErrorKind::BadSegment { index: 0 })?;
        for _ in 0..3 {
            if cur.take_if(|t| alpha(t, 3)).is_none() {
                break;
            }
        }
        cur.take_if(|t| alpha(t, 4));
        cur.take_if(|t| alpha(t, 2) || (t.len() == 3 && t.iter().all(u8::is_ascii_digit)));
        let variants = cur.pos;
        while let Some(t) = cur.peek().filter(|t| is_variant(t)) {
            if strict && cur.seen(variants, t, is_variant) {
                return Err(SyntaxErrorKind::DuplicateSubtag);
            }
            cur.take_if(|_| true);
        }
        let extensions = cur.pos;
        while let Some(t) = cur.peek().filter(|t| is_singleton(t)) {
            if strict && cur.seen(extensions, t, is_singleton) {
                return Err(SyntaxErrorKind::DuplicateSubtag);
            }
            cur.take_if(|_| true);
            let body = |t: &[u8]| t.len() >= 2;
            if cur.take_if(body).is_none() {
                return Err(SyntaxErrorKind::BadSegment { index: cur.pos });
            }
            while cur.take_if(body).is_some() {}
        }
        if cur.take_if(is_private_use_marker).is_none() {
            return match cur.peek() {
                None => Ok(()),
                Some(_) => Err(SyntaxErrorKind::BadSegment { index: cur.pos }),
            };
        }
    }
    // Private use: one or more subtags of 1..=8 characters, to the end.
    match cur.peek() {
        Some(_) => Ok(()),
        None => Err(SyntaxErrorKind::BadSegment { index: cur.pos }),
    }
}

/// A well-formed language tag with no repeated variant or extension
/// singleton, e.g. `pt-BR`. Kept verbatim (case is not normalised).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Language(String);

crate::string_type!(Language);

impl Language {
    fn check(s: &str) -> Result<(), SyntaxError> {
        validate(s, true).map_err(|k| SyntaxError::new(Format::Language, k))
    }

    fn from_checked(s: String) -> Self {
        Language(s)
    }

    /// The primary language subtag, e.g. `pt` for `pt-BR` (`x` or `i` for
    /// private-use and grandfathered `i-` tags).
    pub fn primary(&self) -> &str {
        self.0.split('-').next().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grammar() {
        for ok in [
            "en",
            "en-US",
            "zh-yue-Hant-HK",
            "de-1996",
            "en-a-bbb-x-a-ccc",
            "x-whatever",
            "sr-Latn-RS",
            "es-419",
            "en-GB-oed",
            "ja-x-kansai-osaka",
        ] {
            assert!(is_valid_language(ok), "{ok}");
        }
        for bad in [
            "",
            "e",
            "EN",
            "english",
            "en-",
            "-en",
            "en--US",
            "en-a",
            "en-a-x-y",
            "en-x",
            "en-toolongsubtag",
            "en_US",
            "en-US-a",
            "x",
            "de-419-DE",
            "en-GB-OED",
        ] {
            assert!(!is_valid_language(bad), "{bad}");
        }
    }

    #[test]
    fn strict_rejects_duplicates() {
        for dup in [
            "de-DE-1901-1901",
            "en-rozaj-ROZAJ",
            "en-a-foo-a-bar",
            "en-u-co-x-U",
        ] {
            let strict = validate(dup, true).err();
            if dup == "en-u-co-x-U" {
                // The second "U" is private use, not a singleton.
                assert_eq!(strict, None);
            } else {
                assert!(is_valid_language(dup), "{dup}");
                assert_eq!(strict, Some(SyntaxErrorKind::DuplicateSubtag), "{dup}");
            }
        }
        let l = Language::parse("sl-rozaj-biske").expect("valid");
        assert_eq!(l.primary(), "sl");
        // A variant spelled like an extension body is not a duplicate singleton.
        assert!(Language::parse("en-a-bcd-b-bcd").is_ok());
    }
}
