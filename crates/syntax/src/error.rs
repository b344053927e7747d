//! The one error type of this crate.
//!
//! Every parser reports *which* identifier format failed and *why*, as plain
//! `Copy` data, so that the borrowed validators can return it without
//! allocating and callers can match on it instead of on message strings.

use std::fmt;

/// The identifier format (named as in Lexicon `string` formats) that failed
/// to parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Format {
    /// A DID (`did:method:identifier`).
    Did,
    /// A handle (a DNS name).
    Handle,
    /// A namespaced identifier (`com.example.fooBar`).
    Nsid,
    /// A record key.
    RecordKey,
    /// A timestamp identifier.
    Tid,
    /// An `at://` URI in the restricted Lexicon syntax.
    AtUri,
    /// A Lexicon `datetime` string.
    Datetime,
    /// A BCP 47 language tag.
    Language,
    /// A DID or a handle.
    AtIdentifier,
}

impl Format {
    /// The Lexicon name of the format, e.g. `"record-key"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Format::Did => "did",
            Format::Handle => "handle",
            Format::Nsid => "nsid",
            Format::RecordKey => "record-key",
            Format::Tid => "tid",
            Format::AtUri => "at-uri",
            Format::Datetime => "datetime",
            Format::Language => "language",
            Format::AtIdentifier => "at-identifier",
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a string was rejected. Byte offsets index into the rejected input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
#[non_exhaustive]
pub enum SyntaxErrorKind {
    /// The input is empty.
    #[error("empty")]
    Empty,
    /// The input is longer than the format allows.
    #[error("longer than {max} bytes")]
    TooLong {
        /// The maximum length in bytes.
        max: usize,
    },
    /// The input must have exactly this many bytes.
    #[error("not exactly {expected} bytes long")]
    WrongLength {
        /// The required length in bytes.
        expected: usize,
    },
    /// A byte that is not allowed at this position.
    #[error("bad character at byte {index}")]
    BadCharacter {
        /// Byte offset of the offending character.
        index: usize,
    },
    /// A required prefix (`did:`, `at://`) is missing.
    #[error("missing required prefix")]
    BadPrefix,
    /// The input ends with a character it may not end with.
    #[error("bad final character")]
    BadEnding,
    /// A segment (DNS label, NSID part, language subtag) is empty, too long,
    /// starts or ends with `-`, or has the wrong shape for its position.
    #[error("bad segment starting at byte {index}")]
    BadSegment {
        /// Byte offset where the segment starts.
        index: usize,
    },
    /// Fewer `.`-separated segments than the format requires.
    #[error("fewer than {min} segments")]
    TooFewSegments {
        /// The minimum number of segments.
        min: usize,
    },
    /// A value the format reserves (the record keys `.` and `..`).
    #[error("reserved value")]
    Reserved,
    /// A numeric field (month, day, hour, ...), or the instant it denotes,
    /// is out of range.
    #[error("value out of range")]
    OutOfRange,
    /// A language variant or extension singleton appears twice.
    #[error("duplicate subtag")]
    DuplicateSubtag,
    /// An embedded identifier (e.g. the collection NSID of an AT URI) is
    /// invalid.
    #[error("invalid {0} component")]
    InvalidComponent(Format),
}

/// A string failed to parse as an atproto identifier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
#[error("invalid {format}: {kind}")]
pub struct SyntaxError {
    format: Format,
    kind: SyntaxErrorKind,
}

impl SyntaxError {
    /// Builds an error for `format` with reason `kind`.
    pub fn new(format: Format, kind: SyntaxErrorKind) -> Self {
        SyntaxError { format, kind }
    }

    /// The identifier format that failed.
    pub fn format(&self) -> Format {
        self.format
    }

    /// Why it failed.
    pub fn kind(&self) -> SyntaxErrorKind {
        self.kind
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_names_format_and_reason() {
        let e = SyntaxError::new(Format::RecordKey, SyntaxErrorKind::TooLong { max: 512 });
        assert_eq!(e.to_string(), "invalid record-key: longer than 512 bytes");
        let e = SyntaxError::new(
            Format::AtUri,
            SyntaxErrorKind::InvalidComponent(Format::Nsid),
        );
        assert_eq!(e.to_string(), "invalid at-uri: invalid nsid component");
    }
}
