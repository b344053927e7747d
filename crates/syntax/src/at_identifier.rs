//! At-identifiers: "a DID or a handle", as accepted by XRPC parameters.
//!
//! The two never overlap (a DID starts with `did:` and handles cannot contain
//! `:`), so the input's prefix picks the parser.

use std::fmt;
use std::str::FromStr;

use crate::{did, handle, Did, Format, Handle, SyntaxError};

/// Returns whether `s` is a valid DID or a valid handle.
pub fn is_valid_at_identifier(s: &str) -> bool {
    if s.starts_with("did:") {
        did::validate(s).is_ok()
    } else {
        handle::validate(s).is_ok()
    }
}

/// A DID or a (lowercased) handle.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AtIdentifier {
    /// A DID.
    Did(Did),
    /// A handle.
    Handle(Handle),
}

impl AtIdentifier {
    /// Parses `s` as a DID if it starts with `did:`, otherwise as a handle.
    pub fn parse(s: &str) -> Result<Self, SyntaxError> {
        let wrong = |e: SyntaxError| SyntaxError::new(Format::AtIdentifier, e.kind());
        if s.starts_with("did:") {
            Did::parse(s).map(AtIdentifier::Did).map_err(wrong)
        } else {
            Handle::parse(s).map(AtIdentifier::Handle).map_err(wrong)
        }
    }

    /// The identifier as a string slice.
    pub fn as_str(&self) -> &str {
        match self {
            AtIdentifier::Did(d) => d.as_str(),
            AtIdentifier::Handle(h) => h.as_str(),
        }
    }
}

impl fmt::Display for AtIdentifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl AsRef<str> for AtIdentifier {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl FromStr for AtIdentifier {
    type Err = SyntaxError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl TryFrom<&str> for AtIdentifier {
    type Error = SyntaxError;
    fn try_from(s: &str) -> Result<Self, Self::Error> {
        Self::parse(s)
    }
}

impl From<Did> for AtIdentifier {
    fn from(d: Did) -> Self {
        AtIdentifier::Did(d)
    }
}

impl From<Handle> for AtIdentifier {
    fn from(h: Handle) -> Self {
        AtIdentifier::Handle(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_the_right_parser() {
        assert!(matches!(
            AtIdentifier::parse("did:plc:abc"),
            Ok(AtIdentifier::Did(_))
        ));
        let h = AtIdentifier::parse("Alice.Test").expect("valid");
        assert!(matches!(h, AtIdentifier::Handle(_)));
        assert_eq!(h.as_str(), "alice.test");
        let e = AtIdentifier::parse("did:thing").expect_err("invalid");
        assert_eq!(e.format(), Format::AtIdentifier);
        assert!(!is_valid_at_identifier("@handle"));
    }
}
