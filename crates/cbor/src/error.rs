//! Decoding errors.
//!
//! One error type for the crate: a small `Copy` kind plus the byte offset at which the decoder
//! stopped, so that a caller (and an operator reading a log) can find the bad byte in the input.
//! The kinds are grouped by what a caller does next: `Truncated` means the input ended early (a
//! stream reader may wait for more); every other kind means the input is invalid and should be
//! dropped and counted.

use std::fmt;

/// Why decoding failed. `#[non_exhaustive]`: new checks may add kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The input ended inside an item.
    Truncated,
    /// Bytes remain after the single top-level item.
    TrailingBytes,
    /// A reserved additional-information value (28..=30), or a break byte out of place.
    InvalidHeader,
    /// An indefinite-length item (DAG-CBOR forbids them).
    Indefinite,
    /// An integer or length not in its shortest form.
    NonMinimal,
    /// An integer outside the signed 64-bit range of the atproto data model.
    IntegerOverflow,
    /// A map key that is not a text string.
    NonTextKey,
    /// Map keys out of DAG-CBOR canonical order (length first, then bytewise).
    KeyOrder,
    /// The same map key twice.
    DuplicateKey,
    /// A tag other than 42.
    UnsupportedTag,
    /// Tag 42 whose content is not a byte string holding 0x00 followed by a valid CID.
    InvalidLink,
    /// A float: the atproto data model has none.
    Float,
    /// A simple value other than false, true and null (undefined included).
    UnsupportedSimple,
    /// A text string that is not valid UTF-8.
    InvalidUtf8,
    /// Nesting deeper than the configured limit.
    DepthLimit,
    /// A declared container length larger than the configured limit. (A length larger than the
    /// bytes that remain is reported as `Truncated`.)
    LengthLimit,
    /// The input is larger than the configured limit.
    InputLimit,
}

impl ErrorKind {
    /// A short, stable, kebab-case name (used in logs, metrics and JSON reports).
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Truncated => "truncated",
            ErrorKind::TrailingBytes => "trailing-bytes",
            ErrorKind::InvalidHeader => "invalid-header",
            ErrorKind::Indefinite => "indefinite-length",
            ErrorKind::NonMinimal => "non-minimal",
            ErrorKind::IntegerOverflow => "integer-overflow",
            ErrorKind::NonTextKey => "non-text-key",
            ErrorKind::KeyOrder => "key-order",
            ErrorKind::DuplicateKey => "duplicate-key",
            ErrorKind::UnsupportedTag => "unsupported-tag",
            ErrorKind::InvalidLink => "invalid-link",
            ErrorKind::Float => "float",
            ErrorKind::UnsupportedSimple => "unsupported-simple",
            ErrorKind::InvalidUtf8 => "invalid-utf8",
            ErrorKind::DepthLimit => "depth-limit",
            ErrorKind::LengthLimit => "length-limit",
            ErrorKind::InputLimit => "input-limit",
        }
    }
}

/// A decoding error: what went wrong and where.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Error {
    kind: ErrorKind,
    offset: usize,
}

impl Error {
    pub(crate) fn new(kind: ErrorKind, offset: usize) -> Error {
        Error { kind, offset }
    }

    /// What went wrong.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The byte offset, within the buffer given to the decoder, of the item that failed.
    pub fn offset(&self) -> usize {
        self.offset
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.kind {
            ErrorKind::Truncated => "input ends inside an item",
            ErrorKind::TrailingBytes => "bytes remain after the top-level item",
            ErrorKind::InvalidHeader => "reserved or misplaced initial byte",
            ErrorKind::Indefinite => "indefinite-length item (not allowed in DAG-CBOR)",
            ErrorKind::NonMinimal => "integer or length not minimally encoded",
            ErrorKind::IntegerOverflow => "integer outside the signed 64-bit range",
            ErrorKind::NonTextKey => "map key is not a text string",
            ErrorKind::KeyOrder => "map keys not in canonical order",
            ErrorKind::DuplicateKey => "duplicate map key",
            ErrorKind::UnsupportedTag => "tag other than 42",
            ErrorKind::InvalidLink => "tag 42 does not hold a valid CID",
            ErrorKind::Float => "float (not in the atproto data model)",
            ErrorKind::UnsupportedSimple => "simple value other than false/true/null",
            ErrorKind::InvalidUtf8 => "text string is not valid UTF-8",
            ErrorKind::DepthLimit => "nesting deeper than the limit",
            ErrorKind::LengthLimit => "declared container length exceeds the limit",
            ErrorKind::InputLimit => "input larger than the limit",
        };
        write!(f, "{what} at byte {}", self.offset)
    }
}

impl std::error::Error for Error {}
