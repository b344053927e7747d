//! Record keys: the names of records within a collection.
//!
//! Every firehose op carries one, and they end up in MST paths and AT URIs,
//! so they must be safe in both. Rules (<https://atproto.com/specs/record-key>):
//! 1..=512 bytes of `[A-Za-z0-9._:~-]`, and not exactly `.` or `..`.
//! Record keys are case-sensitive and never normalised.

use crate::{Format, SyntaxError, SyntaxErrorKind};

const MAX_RECORD_KEY_LEN: usize = 512;

/// Returns whether `s` is a syntactically valid record key.
pub fn is_valid_record_key(s: &str) -> bool {
    validate(s).is_ok()
}

pub(crate) fn validate(s: &str) -> Result<(), SyntaxErrorKind> {
    let b = s.as_bytes();
    if b.is_empty() {
        return Err(SyntaxErrorKind::Empty);
    }
    if b.len() > MAX_RECORD_KEY_LEN {
        return Err(SyntaxErrorKind::TooLong {
            max: MAX_RECORD_KEY_LEN,
        });
    }
    for (i, &c) in b.iter().enumerate() {
        if !(c.is_ascii_alphanumeric() || matches!(c, b'.' | b'-' | b'_' | b':' | b'~')) {
            return Err(SyntaxErrorKind::BadCharacter { index: i });
        }
    }
    if b == b"." || b == b".." {
        return Err(SyntaxErrorKind::Reserved);
    }
    Ok(())
}

/// A syntactically valid record key, e.g. `3jzfcijpj2z2a` or `self`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RecordKey(String);

crate::string_type!(RecordKey);

impl RecordKey {
    fn check(s: &str) -> Result<(), SyntaxError> {
        validate(s).map_err(|k| SyntaxError::new(Format::RecordKey, k))
    }

    fn from_checked(s: String) -> Self {
        RecordKey(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons() {
        let kind = |s| validate(s).err();
        assert_eq!(kind(""), Some(SyntaxErrorKind::Empty));
        assert_eq!(kind("."), Some(SyntaxErrorKind::Reserved));
        assert_eq!(kind(".."), Some(SyntaxErrorKind::Reserved));
        assert_eq!(
            kind("a/b"),
            Some(SyntaxErrorKind::BadCharacter { index: 1 })
        );
        assert_eq!(
            kind(&"o".repeat(513)),
            Some(SyntaxErrorKind::TooLong { max: 512 })
        );
        assert!(is_valid_record_key("..."));
        let k = RecordKey::parse("self").expect("valid");
        assert_eq!(k.as_str(), "self");
        assert_eq!(
            RecordKey::parse("a b").map_err(|e| e.format()),
            Err(Format::RecordKey)
        );
    }
}
