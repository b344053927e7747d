//! Frame decoding errors.

use std::fmt;

use riptide_car::CarError;

/// What is wrong with a frame.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FrameErrorKind {
    /// The header `{op, t}` is not valid DAG-CBOR.
    HeaderCbor(riptide_cbor::ErrorKind),
    /// The payload is not valid DAG-CBOR (or bytes follow it).
    PayloadCbor(riptide_cbor::ErrorKind),
    /// The header is not a map with an integer `op` (and a text `t` when op = 1).
    BadHeader(&'static str),
    /// `op` is neither 1 (message) nor -1 (error).
    UnknownOp(i64),
    /// A required payload field is missing.
    MissingField(&'static str),
    /// A payload field has the wrong type.
    WrongType(&'static str),
    /// An op of a commit is malformed (index, reason).
    BadOp(usize, &'static str),
    /// The embedded CAR (`blocks`) is invalid: truncated, over a limit, or a block whose bytes do
    /// not hash to its CID.
    Car(CarError),
    /// A CAR block is not valid DAG-CBOR (block index, what).
    BlockCbor(usize, riptide_cbor::ErrorKind),
    /// A field that names an account (`repo`, `did`) is not a syntactically valid DID (field,
    /// what is wrong). Checked here, where the frame is decoded, because the DID becomes a key:
    /// of the account's chain state, of frames held for its resync, of a consumer's own tables.
    /// An empty DID once reached the store, whose key-value engine asserts a non-empty key.
    BadDid(&'static str, riptide_syntax::SyntaxErrorKind),
}

/// A frame decoding error, boxed to keep `Result<Frame, _>` small.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FrameError(Box<Inner>);

#[derive(Clone, Debug, PartialEq, Eq)]
struct Inner {
    kind: FrameErrorKind,
    offset: usize,
}

impl FrameError {
    pub(crate) fn new(kind: FrameErrorKind, offset: usize) -> FrameError {
        FrameError(Box::new(Inner { kind, offset }))
    }

    /// What is wrong.
    pub fn kind(&self) -> &FrameErrorKind {
        &self.0.kind
    }

    /// Byte offset within the frame.
    pub fn offset(&self) -> usize {
        self.0.offset
    }

    /// A short stable name for counting (`bad-block-cid`, `truncated`, `malformed`, `limits`).
    pub fn class(&self) -> &'static str {
        use riptide_car::CarErrorKind as C;
        use riptide_cbor::ErrorKind as K;
        match &self.0.kind {
            FrameErrorKind::Car(e) => match e.kind() {
                C::HashMismatch { .. } => "bad-block-cid",
                C::TooLarge | C::TooManyBlocks => "limits",
                C::Truncated => "truncated",
                _ => "malformed",
            },
            FrameErrorKind::HeaderCbor(K::Truncated)
            | FrameErrorKind::PayloadCbor(K::Truncated) => "truncated",
            FrameErrorKind::HeaderCbor(K::DepthLimit | K::LengthLimit | K::InputLimit)
            | FrameErrorKind::PayloadCbor(K::DepthLimit | K::LengthLimit | K::InputLimit)
            | FrameErrorKind::BlockCbor(_, K::DepthLimit | K::LengthLimit | K::InputLimit) => {
                "limits"
            }
            _ => "malformed",
        }
    }
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0.kind {
            FrameErrorKind::HeaderCbor(k) => write!(f, "header is not DAG-CBOR: {}", k.as_str()),
            FrameErrorKind::PayloadCbor(k) => write!(f, "payload is not DAG-CBOR: {}", k.as_str()),
            FrameErrorKind::BadHeader(why) => write!(f, "bad header: {why}"),
            FrameErrorKind::UnknownOp(op) => write!(f, "unknown header op {op}"),
            FrameErrorKind::MissingField(name) => write!(f, "payload lacks `{name}`"),
            FrameErrorKind::WrongType(name) => {
                write!(f, "payload field `{name}` has the wrong type")
            }
            FrameErrorKind::BadOp(i, why) => write!(f, "op {i}: {why}"),
            FrameErrorKind::Car(e) => write!(f, "blocks: {e}"),
            FrameErrorKind::BlockCbor(i, k) => {
                write!(f, "block {i} is not DAG-CBOR: {}", k.as_str())
            }
            FrameErrorKind::BadDid(name, k) => {
                write!(f, "payload field `{name}` is not a valid DID: {k}")
            }
        }?;
        write!(f, " (frame byte {})", self.0.offset)
    }
}

impl std::error::Error for FrameError {}
