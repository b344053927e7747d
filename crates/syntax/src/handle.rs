//! Handles: the human-readable, DNS-based account names of atproto.
//!
//! Handles arrive in identity events and AT URIs and are shown to people, so
//! they are checked against <https://atproto.com/specs/handle>: a DNS name of
//! at most 253 bytes, at least two `.`-separated labels of 1..=63 bytes of
//! `[A-Za-z0-9-]` that neither start nor end with `-`, and a last label (TLD)
//! that does not start with a digit. Handles are case-insensitive, so the
//! [`Handle`] type stores them lowercased. TLDs that are valid syntax but
//! barred from registration (`.local`, `.onion`, ...) are accepted here.

use crate::{Format, SyntaxError, SyntaxErrorKind};

const MAX_HANDLE_LEN: usize = 253;
const MAX_LABEL_LEN: usize = 63;

/// Returns whether `s` is a syntactically valid handle (any case).
pub fn is_valid_handle(s: &str) -> bool {
    validate(s).is_ok()
}

pub(crate) fn validate(s: &str) -> Result<(), SyntaxErrorKind> {
    let b = s.as_bytes();
    if b.is_empty() {
        return Err(SyntaxErrorKind::Empty);
    }
    if b.len() > MAX_HANDLE_LEN {
        return Err(SyntaxErrorKind::TooLong {
            max: MAX_HANDLE_LEN,
        });
    }
    let mut start = 0;
    let mut labels = 0;
    let mut tld_start = 0;
    for label in b.split(|&c| c == b'.') {
        validate_label(label, start)?;
        tld_start = start;
        start += label.len() + 1;
        labels += 1;
    }
    if labels < 2 {
        return Err(SyntaxErrorKind::TooFewSegments { min: 2 });
    }
    if b[tld_start].is_ascii_digit() {
        return Err(SyntaxErrorKind::BadSegment { index: tld_start });
    }
    Ok(())
}

/// Checks one DNS label (shared with NSID domain authorities). `start` is the
/// label's byte offset in the whole input, for error reporting.
pub(crate) fn validate_label(label: &[u8], start: usize) -> Result<(), SyntaxErrorKind> {
    for (i, &c) in label.iter().enumerate() {
        if !(c.is_ascii_alphanumeric() || c == b'-') {
            return Err(SyntaxErrorKind::BadCharacter { index: start + i });
        }
    }
    match (label.first(), label.last()) {
        (Some(b'-'), _) | (_, Some(b'-')) | (None, _) => {
            Err(SyntaxErrorKind::BadSegment { index: start })
        }
        _ if label.len() > MAX_LABEL_LEN => Err(SyntaxErrorKind::BadSegment { index: start }),
        _ => Ok(()),
    }
}

/// A syntactically valid handle, normalised to lowercase, e.g. `alice.bsky.social`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Handle(String);

crate::string_type!(Handle);

impl Handle {
    fn check(s: &str) -> Result<(), SyntaxError> {
        validate(s).map_err(|k| SyntaxError::new(Format::Handle, k))
    }

    fn from_checked(mut s: String) -> Self {
        s.make_ascii_lowercase();
        Handle(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lowercases() {
        let h = Handle::parse("XX.LCS.MIT.EDU").expect("valid");
        assert_eq!(h.as_str(), "xx.lcs.mit.edu");
        let h = Handle::try_from(String::from("John.Test")).expect("valid");
        assert_eq!(h, "john.test");
    }

    #[test]
    fn reasons() {
        let kind = |s| validate(s).err();
        assert_eq!(kind(""), Some(SyntaxErrorKind::Empty));
        assert_eq!(
            kind("john"),
            Some(SyntaxErrorKind::TooFewSegments { min: 2 })
        );
        assert_eq!(
            kind("john.0aa"),
            Some(SyntaxErrorKind::BadSegment { index: 5 })
        );
        assert_eq!(
            kind("john..test"),
            Some(SyntaxErrorKind::BadSegment { index: 5 })
        );
        assert_eq!(
            kind("john-.test"),
            Some(SyntaxErrorKind::BadSegment { index: 0 })
        );
        assert_eq!(
            kind("jo_hn.test"),
            Some(SyntaxErrorKind::BadCharacter { index: 2 })
        );
        assert_eq!(
            kind("john.test."),
            Some(SyntaxErrorKind::BadSegment { index: 10 })
        );
        let label = "o".repeat(64);
        assert_eq!(
            kind(&format!("a.{label}.test")),
            Some(SyntaxErrorKind::BadSegment { index: 2 })
        );
        assert!(is_valid_handle(&format!("a.{}.test", &label[1..])));
    }
}
