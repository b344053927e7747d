//! Jetstream v2's `.jss` archive segment format: read, verify, write.
//!
//! Why a crate: the archive (`getSegment`, `getBlock`, `planSnapshot`) serves these files
//! byte-compatible with every v2 client, and riptide's store will keep its sealed history in
//! them; the format and its checks belong in one place with no HTTP and no I/O, that `serve`, the
//! clients and the tests all use. The format is Jetstream's (`bluesky-social/jetstream`,
//! `segment/`, `docs/README.md` §3); `docs/archive.md` says how riptide's store uses it.
//!
//! ```text
//! [0, 256)            header: "jss0", xxh3 checksum, counts, bounds, footer offsets  (header)
//! [256, footer)       blocks: u64 length + one zstd frame of a columnar block          (block)
//! [footer, end)       block index | segment DID bloom | per-block DID blooms
//!                     | collection index (16-byte header + zstd body)         (footer, bloom)
//! ```
//!
//! Reading: [`Segment::open`] validates a whole file (never panicking, allocating only after a
//! size has been checked against the file); [`Segment::block_body`] and [`Segment::rows`] give a
//! block's rows, borrowing from its decompressed body. A bare frame (`getBlock`) decodes with
//! [`decode_block_frame`] and [`decode_block`]. Writing: [`SegmentWriter`] or [`write_segment`]; folding a sealed one,
//! [`Compaction`].
//! A server keeps each segment's [`SegmentMeta`] (header and footer only) and answers
//! `planSnapshot` with [`plan::plan`].

mod block;
mod bloom;
mod compact;
mod error;
mod footer;
mod header;
mod kind;
mod name;
pub mod plan;
mod segment;
mod writer;

pub use block::{
    compress, decode_block, decode_block_frame, decompress, encode_block, encode_block_frame,
    OwnedRow, Row, FIXED_ROW_BYTES, MAX_BLOCK_BYTES, MAX_BLOCK_ROWS, ZSTD_LEVEL,
};
pub use bloom::{Bloom, BloomBuilder, BloomKey, Probe, FP_RATE};
pub use compact::{compact_segment, Compaction};
pub use error::{Error, Result};
pub use footer::{
    max_footer_bytes, BlockInfo, CollectionIndex, BLOCK_INDEX_ENTRY, COLLECTION_HEADER,
    MAX_COLLECTIONS,
};
pub use header::{checksum, Header, HEADER_BYTES, MAGIC, VERSION};
pub use kind::{Kind, SENTINEL_ACCOUNT, SENTINEL_IDENTITY, SENTINEL_SYNC};
pub use name::{parse_segment_name, segment_name};
pub use segment::{Segment, SegmentMeta, MAX_BLOCKS};
pub use writer::{write_segment, Sealed, SegmentWriter};
