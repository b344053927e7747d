//! DIDs: the permanent account identifiers of atproto.
//!
//! Every repo, commit and identity event names its account by DID, so this is
//! checked once per firehose event. The rules are the generic, method-agnostic
//! ones of <https://atproto.com/specs/did>: lowercase `did:`, a lowercase
//! method, then an identifier of `[A-Za-z0-9._:%-]` that does not end in `:`
//! or `%`, at most 2048 bytes in all. Percent-encoding is not decoded or
//! checked further, as the spec allows. Unsupported methods are still valid
//! syntax; resolving them is someone else's problem.

use crate::{Format, SyntaxError, SyntaxErrorKind};

/// Hard atproto limit on the length of a DID.
const MAX_DID_LEN: usize = 2048;

/// Returns whether `s` is a syntactically valid DID.
pub fn is_valid_did(s: &str) -> bool {
    validate(s).is_ok()
}

/// Checks that `s` is a syntactically valid DID, saying why not, without copying it (the
/// firehose decoder checks every frame's DID in place).
pub fn check_did(s: &str) -> Result<(), SyntaxError> {
    Did::check(s)
}

pub(crate) fn validate(s: &str) -> Result<(), SyntaxErrorKind> {
    let b = s.as_bytes();
    if b.is_empty() {
        return Err(SyntaxErrorKind::Empty);
    }
    if b.len() > MAX_DID_LEN {
        return Err(SyntaxErrorKind::TooLong { max: MAX_DID_LEN });
    }
    let Some(rest) = b.strip_prefix(b"did:") else {
        return Err(SyntaxErrorKind::BadPrefix);
    };
    // Method: one or more lowercase ASCII letters, then ':'.
    let method_len = rest.iter().take_while(|c| c.is_ascii_lowercase()).count();
    let colon = 4 + method_len;
    if method_len == 0 || b.get(colon) != Some(&b':') {
        return Err(SyntaxErrorKind::BadCharacter { index: colon });
    }
    let id_start = colon + 1;
    for (i, &c) in b.iter().enumerate().skip(id_start) {
        if !(c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b':' | b'%' | b'-')) {
            return Err(SyntaxErrorKind::BadCharacter { index: i });
        }
    }
    match b.last() {
        _ if b.len() == id_start => Err(SyntaxErrorKind::Empty),
        Some(b':' | b'%') => Err(SyntaxErrorKind::BadEnding),
        _ => Ok(()),
    }
}

/// A syntactically valid DID, e.g. `did:plc:7iza6de2dwap2sbkpav7c6c6`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Did(String);

crate::string_type!(Did);

impl Did {
    fn check(s: &str) -> Result<(), SyntaxError> {
        validate(s).map_err(|k| SyntaxError::new(Format::Did, k))
    }

    fn from_checked(s: String) -> Self {
        Did(s)
    }

    /// The method name, e.g. `plc` for `did:plc:...`.
    pub fn method(&self) -> &str {
        self.0[4..].split(':').next().unwrap_or_default()
    }

    /// Everything after `did:<method>:`.
    pub fn identifier(&self) -> &str {
        let m = self.method().len();
        &self.0[4 + m + 1..]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_and_splits() {
        let d = Did::parse("did:plc:7iza6de2dwap2sbkpav7c6c6").expect("valid");
        assert_eq!(d.method(), "plc");
        assert_eq!(d.identifier(), "7iza6de2dwap2sbkpav7c6c6");
        assert_eq!(d.to_string(), "did:plc:7iza6de2dwap2sbkpav7c6c6");
        let d: Did = "did:web:localhost%3A1234".parse().expect("valid");
        assert_eq!(d.identifier(), "localhost%3A1234");
    }

    #[test]
    fn reasons() {
        let kind = |s| validate(s).err();
        assert_eq!(kind(""), Some(SyntaxErrorKind::Empty));
        assert_eq!(kind("DID:plc:x"), Some(SyntaxErrorKind::BadPrefix));
        assert_eq!(
            kind("did:m1:x"),
            Some(SyntaxErrorKind::BadCharacter { index: 5 })
        );
        assert_eq!(kind("did:plc:"), Some(SyntaxErrorKind::Empty));
        assert_eq!(kind("did:plc:a:"), Some(SyntaxErrorKind::BadEnding));
        assert_eq!(kind("did:plc:a%"), Some(SyntaxErrorKind::BadEnding));
        assert_eq!(
            kind("did:plc:a/b"),
            Some(SyntaxErrorKind::BadCharacter { index: 9 })
        );
        let long = format!("did:plc:{}", "a".repeat(MAX_DID_LEN));
        assert_eq!(
            kind(&long),
            Some(SyntaxErrorKind::TooLong { max: MAX_DID_LEN })
        );
        let max = format!("did:plc:{}", "a".repeat(MAX_DID_LEN - 8));
        assert!(is_valid_did(&max));
    }
}
