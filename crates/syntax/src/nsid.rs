//! NSIDs: the namespaced names of Lexicon schemas, i.e. record collections.
//!
//! Every firehose op carries a collection NSID, so this is one of the hottest
//! validators in riptide. Rules (<https://atproto.com/specs/nsid>): at least
//! three `.`-separated segments and at most 317 bytes; all but the last form
//! the domain authority, a reversed handle of at most 253 bytes whose labels
//! follow DNS rules and whose first label (the TLD) does not start with a
//! digit; the last segment (the name) is 1..=63 ASCII letters and digits,
//! starting with a letter. NSIDs are case-sensitive and never normalised.

use crate::handle::validate_label;
use crate::{Format, SyntaxError, SyntaxErrorKind};

const MAX_NSID_LEN: usize = 317;
const MAX_AUTHORITY_LEN: usize = 253;
const MAX_NAME_LEN: usize = 63;

/// Returns whether `s` is a syntactically valid NSID.
pub fn is_valid_nsid(s: &str) -> bool {
    validate(s).is_ok()
}

pub(crate) fn validate(s: &str) -> Result<(), SyntaxErrorKind> {
    let b = s.as_bytes();
    if b.is_empty() {
        return Err(SyntaxErrorKind::Empty);
    }
    if b.len() > MAX_NSID_LEN {
        return Err(SyntaxErrorKind::TooLong { max: MAX_NSID_LEN });
    }
    let Some(dot) = b.iter().rposition(|&c| c == b'.') else {
        return Err(SyntaxErrorKind::TooFewSegments { min: 3 });
    };
    let (authority, name) = (&b[..dot], &b[dot + 1..]);

    let mut start = 0;
    let mut labels = 0;
    for label in authority.split(|&c| c == b'.') {
        validate_label(label, start)?;
        if start == 0 && label.first().is_some_and(u8::is_ascii_digit) {
            return Err(SyntaxErrorKind::BadSegment { index: 0 });
        }
        start += label.len() + 1;
        labels += 1;
    }
    if labels < 2 {
        return Err(SyntaxErrorKind::TooFewSegments { min: 3 });
    }
    // The spec bounds the domain authority like a handle. (Neither reference
    // implementation enforces this; see the note in tests/interop.rs.)
    if authority.len() > MAX_AUTHORITY_LEN {
        return Err(SyntaxErrorKind::TooLong {
            max: MAX_AUTHORITY_LEN,
        });
    }

    let name_start = dot + 1;
    for (i, &c) in name.iter().enumerate() {
        if !c.is_ascii_alphanumeric() {
            return Err(SyntaxErrorKind::BadCharacter {
                index: name_start + i,
            });
        }
    }
    match name.first() {
        Some(c) if c.is_ascii_alphabetic() && name.len() <= MAX_NAME_LEN => Ok(()),
        _ => Err(SyntaxErrorKind::BadSegment { index: name_start }),
    }
}

/// A syntactically valid NSID, e.g. `app.bsky.feed.post`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Nsid(String);

crate::string_type!(Nsid);

impl Nsid {
    fn check(s: &str) -> Result<(), SyntaxError> {
        validate(s).map_err(|k| SyntaxError::new(Format::Nsid, k))
    }

    fn from_checked(s: String) -> Self {
        Nsid(s)
    }

    /// The final segment, e.g. `post` for `app.bsky.feed.post`.
    pub fn name(&self) -> &str {
        self.0.rsplit('.').next().unwrap_or_default()
    }

    /// The domain authority in NSID (reversed) order, e.g. `app.bsky.feed`.
    pub fn authority(&self) -> &str {
        self.0.rsplit_once('.').map_or("", |(a, _)| a)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits() {
        let n = Nsid::parse("app.bsky.feed.post").expect("valid");
        assert_eq!(n.name(), "post");
        assert_eq!(n.authority(), "app.bsky.feed");
    }

    #[test]
    fn reasons() {
        let kind = |s| validate(s).err();
        assert_eq!(kind(""), Some(SyntaxErrorKind::Empty));
        assert_eq!(
            kind("com.example"),
            Some(SyntaxErrorKind::TooFewSegments { min: 3 })
        );
        assert_eq!(
            kind("comexample"),
            Some(SyntaxErrorKind::TooFewSegments { min: 3 })
        );
        assert_eq!(
            kind("1com.example.foo"),
            Some(SyntaxErrorKind::BadSegment { index: 0 })
        );
        assert_eq!(
            kind("com.example.3"),
            Some(SyntaxErrorKind::BadSegment { index: 12 })
        );
        assert_eq!(
            kind("com.example.a-b"),
            Some(SyntaxErrorKind::BadCharacter { index: 13 })
        );
        assert_eq!(
            kind("com..foo"),
            Some(SyntaxErrorKind::BadSegment { index: 4 })
        );
        assert_eq!(
            kind("com.example."),
            Some(SyntaxErrorKind::BadSegment { index: 12 })
        );
        assert!(is_valid_nsid("com.example.fooBarV2"));
        // Authority of exactly 253 bytes is fine; 254 is not.
        let auth = format!(
            "com.{a}.{a}.{a}.{b}",
            a = "a".repeat(63),
            b = "a".repeat(57)
        );
        assert_eq!(auth.len(), 253);
        assert!(is_valid_nsid(&format!("{auth}.x")));
        assert_eq!(
            kind(&format!("{auth}b.x")),
            Some(SyntaxErrorKind::TooLong {
                max: MAX_AUTHORITY_LEN
            })
        );
    }
}
