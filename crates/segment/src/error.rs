//! The crate's one error type.
//!
//! Why one enum: every caller does the same thing with any of these (refuse the segment or block
//! and say why), but tests and the server want to tell a torn file (`ShortFile`, `Active`) from
//! rot (`ChecksumMismatch`) from a hostile or buggy writer (everything else). Offsets and indices
//! are carried so a message names the place.

/// A `.jss` segment or block that cannot be read, or rows that cannot be written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Fewer bytes than the 256-byte header.
    #[error("segment is {len} bytes, shorter than its 256-byte header")]
    ShortFile {
        /// The file's length.
        len: usize,
    },
    /// The first four bytes are not `jss0`.
    #[error("bad magic {found:?}, want \"jss0\"")]
    BadMagic {
        /// The four bytes found.
        found: [u8; 4],
    },
    /// The checksum field is zero: the file is an active segment, not a sealed one.
    #[error("checksum field is zero: an active (unsealed) segment")]
    Active,
    /// A header version other than 1.
    #[error("header version {0}, want 1")]
    Version(u16),
    /// The XXH3-64 over header[12..256] and the footer disagrees with the header.
    #[error("checksum mismatch: header says {stored:016x}, contents hash to {computed:016x}")]
    ChecksumMismatch {
        /// The value in the header.
        stored: u64,
        /// The value computed from the file.
        computed: u64,
    },
    /// The footer's offsets, lengths or sections do not fit the file or each other.
    #[error("invalid footer: {0}")]
    Footer(String),
    /// A block index entry that is out of range, overlapping or self-contradictory.
    #[error("invalid block index entry {block}: {reason}")]
    BlockIndex {
        /// The block's index.
        block: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// A block index past the segment's block count.
    #[error("block {index} out of range: the segment has {count} blocks")]
    BlockOutOfRange {
        /// The index asked for.
        index: usize,
        /// The segment's block count.
        count: usize,
    },
    /// A serialized bloom filter that is malformed.
    #[error("invalid bloom filter: {0}")]
    Bloom(String),
    /// The collection index is malformed.
    #[error("invalid collection index: {0}")]
    Collections(String),
    /// A zstd frame that does not decode (corrupt, truncated, trailing bytes, bad checksum).
    #[error("zstd frame: {0}")]
    Zstd(String),
    /// A zstd frame that decompresses past the limit (a decompression bomb or a lying index).
    #[error("zstd frame decompresses past its limit of {limit} bytes")]
    TooLarge {
        /// The limit in bytes.
        limit: u64,
    },
    /// A block body that is malformed: its columns do not fit its bytes.
    #[error("malformed block body at byte {offset}: {reason}")]
    Block {
        /// Offset in the uncompressed body.
        offset: usize,
        /// What did not fit.
        reason: &'static str,
    },
    /// A row kind outside 1..=7.
    #[error("row {row}: kind {kind} is not one of 1..=7")]
    InvalidKind {
        /// Row index in its block.
        row: usize,
        /// The byte found.
        kind: u8,
    },
    /// A text column (DID, collection, rkey, rev) that is not UTF-8.
    #[error("row {row}: {column} is not UTF-8")]
    NotUtf8 {
        /// Row index in its block.
        row: usize,
        /// The column's name.
        column: &'static str,
    },
    /// A block's rows disagree with its block index entry (count, seq or time envelope).
    #[error("block {block} disagrees with its index entry: {reason}")]
    BlockMismatch {
        /// The block's index.
        block: usize,
        /// The disagreement.
        reason: String,
    },
    /// A field longer than its on-disk length column (writer side).
    #[error("{column} is {len} bytes, its column holds at most {max}")]
    FieldTooLong {
        /// The column's name.
        column: &'static str,
        /// The field's length.
        len: usize,
        /// The column's maximum.
        max: usize,
    },
    /// An empty block given to the writer (Jetstream's seal walk stops at an empty block).
    #[error("a block needs at least one row")]
    EmptyBlock,
    /// More blocks, rows or collections than the format's counters (or our limits) hold.
    #[error("too many {what}: {count}")]
    TooMany {
        /// What overflowed.
        what: &'static str,
        /// How many.
        count: u64,
    },
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
