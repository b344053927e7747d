//! The footer's sections other than the blooms: the block index and the collection index.
//!
//! Why a module: these are the planner's tables. The block index (52 bytes a block: offset of
//! the block's length prefix, compressed and uncompressed sizes, row count, seq and time bounds)
//! lets a server serve a block and a planner skip by seq without decompressing anything. The
//! collection index (Jetstream `segment/collection.go`) is a 16-byte header — collection count,
//! block count, bitmap bytes, uncompressed body size — then one zstd frame holding the collection
//! table (`u8 len, u32 rows, NSID`, in first-seen order) and one bitmap per block (bit `i` set
//! when collection `i` occurs in the block; marker kinds set their `$account`/`$identity`/`$sync`
//! sentinel, which counts no rows).
//!
//! Footer order on disk: block index, segment DID bloom, per-block DID blooms (`u32 count,
//! u32 bloom_bytes`, then the filters, all one size), collection index to the end of the file.

use crate::block::{decompress, MAX_BLOCK_BYTES, MAX_BLOCK_ROWS};
use crate::bloom::max_serialized_bytes;
use crate::error::{Error, Result};
use crate::header::{bounds_at, u32_at, u64_at, Header};

/// Bytes of one block index entry.
pub const BLOCK_INDEX_ENTRY: usize = 52;
/// Bytes of the collection index's uncompressed header.
pub const COLLECTION_HEADER: usize = 16;
/// The most collections a segment may name (Jetstream's `maxCollectionCountLimit`).
pub const MAX_COLLECTIONS: u32 = 1 << 20;

/// Per-block filters of older files are sized for 4,096 DIDs whatever the block holds
/// (`legacy_fixed4096_blooms.jss`).
const LEGACY_BLOCK_BLOOM_DIDS: u64 = 4096;

/// The most bytes the footer of a segment with this header's counts can take, from the format's
/// maxima: the block index (`block_count` × 52), the segment DID bloom (`unique_did_count` DIDs),
/// the per-block blooms (each for at most as many DIDs as the segment, a block or the legacy
/// 4,096 hold), and the collection index (at most one collection per row plus the three
/// sentinels, [`MAX_COLLECTIONS`], names of 255 bytes, one bitmap per block, compressed no worse
/// than zstd's bound). A reader checks the footer's length against it before reading the footer
/// into memory, so a damaged header cannot make it allocate up to the file's length.
pub fn max_footer_bytes(h: &Header) -> u64 {
    let blocks = u64::from(h.block_count);
    let index = blocks.saturating_mul(BLOCK_INDEX_ENTRY as u64);
    let dids = u64::from(h.unique_did_count);
    let seg_bloom = max_serialized_bytes(dids);
    let per_block = dids.min(MAX_BLOCK_ROWS as u64).max(LEGACY_BLOCK_BLOOM_DIDS);
    let block_blooms = blocks
        .saturating_mul(max_serialized_bytes(per_block))
        .saturating_add(8);
    let names = (u64::from(h.event_count) + 3).min(u64::from(MAX_COLLECTIONS));
    let body = names
        .saturating_mul(1 + 4 + 255)
        .saturating_add(blocks.saturating_mul(names.div_ceil(8)))
        .min(MAX_BLOCK_BYTES as u64);
    // ZSTD_COMPRESSBOUND: src + src/256 + a margin for small inputs.
    let collections = COLLECTION_HEADER as u64 + body + body / 256 + (128 << 10);
    index
        .saturating_add(seg_bloom)
        .saturating_add(block_blooms)
        .saturating_add(collections)
}

/// One block index entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BlockInfo {
    /// File offset of the block's `u64` length prefix; the frame starts 8 bytes later.
    pub offset: u64,
    /// Bytes of the zstd frame.
    pub compressed_size: u32,
    /// Bytes of the block body once decompressed.
    pub uncompressed_size: u32,
    /// Rows in the block (0 only in a compacted segment's emptied block).
    pub event_count: u32,
    /// Lowest seq in the block.
    pub min_seq: u64,
    /// Highest seq in the block.
    pub max_seq: u64,
    /// Earliest `witnessed_at`, unix µs.
    pub min_witnessed_at: i64,
    /// Latest `witnessed_at`, unix µs.
    pub max_witnessed_at: i64,
}

impl BlockInfo {
    pub(crate) fn parse(e: &[u8]) -> BlockInfo {
        let (min_seq, max_seq, min_witnessed_at, max_witnessed_at) = bounds_at(e, 20);
        BlockInfo {
            offset: u64_at(e, 0),
            compressed_size: u32_at(e, 8),
            uncompressed_size: u32_at(e, 12),
            event_count: u32_at(e, 16),
            min_seq,
            max_seq,
            min_witnessed_at,
            max_witnessed_at,
        }
    }

    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.offset.to_le_bytes());
        out.extend_from_slice(&self.compressed_size.to_le_bytes());
        out.extend_from_slice(&self.uncompressed_size.to_le_bytes());
        out.extend_from_slice(&self.event_count.to_le_bytes());
        out.extend_from_slice(&self.min_seq.to_le_bytes());
        out.extend_from_slice(&self.max_seq.to_le_bytes());
        out.extend_from_slice(&(self.min_witnessed_at as u64).to_le_bytes());
        out.extend_from_slice(&(self.max_witnessed_at as u64).to_le_bytes());
    }
}

/// The collection index, decompressed: names, per-collection row counts, per-block bitmaps.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CollectionIndex {
    names: Vec<String>,
    counts: Vec<u32>,
    bitmap_bytes: usize,
    blocks: usize,
    /// `blocks * bitmap_bytes` bytes, block-major.
    bitmaps: Vec<u8>,
}

impl CollectionIndex {
    pub(crate) fn new(names: Vec<String>, counts: Vec<u32>, blocks: &[Vec<u32>]) -> Self {
        let bitmap_bytes = names.len().div_ceil(8);
        let mut bitmaps = vec![0u8; blocks.len() * bitmap_bytes];
        for (b, ids) in blocks.iter().enumerate() {
            for &id in ids {
                bitmaps[b * bitmap_bytes + id as usize / 8] |= 1 << (id % 8);
            }
        }
        CollectionIndex {
            names,
            counts,
            bitmap_bytes,
            blocks: blocks.len(),
            bitmaps,
        }
    }

    /// Collection names (NSIDs and the marker sentinels), indexed by collection id.
    pub fn names(&self) -> &[String] {
        &self.names
    }
    /// Rows per collection id across the segment (sentinels count none).
    pub fn counts(&self) -> &[u32] {
        &self.counts
    }
    /// The id of a collection name, if the segment holds it.
    pub fn id(&self, name: &str) -> Option<u32> {
        self.names.iter().position(|n| n == name).map(|i| i as u32)
    }
    /// Blocks the index describes.
    pub fn block_count(&self) -> usize {
        self.blocks
    }
    /// Whether collection `id` occurs in block `block` (false when either is out of range).
    pub fn block_has(&self, block: usize, id: u32) -> bool {
        let i = id as usize;
        if i >= self.names.len() {
            return false;
        }
        self.bitmaps
            .get(block * self.bitmap_bytes + i / 8)
            .is_some_and(|b| b & (1 << (i % 8)) != 0)
    }
    /// The collection ids present in a block, ascending.
    pub fn block_ids(&self, block: usize) -> impl Iterator<Item = u32> + '_ {
        let row = self
            .bitmaps
            .get(block * self.bitmap_bytes..(block + 1) * self.bitmap_bytes)
            .unwrap_or(&[]);
        (0..row.len() * 8)
            .filter(move |&i| row[i / 8] & (1 << (i % 8)) != 0)
            .map(|i| i as u32)
    }

    /// The uncompressed body (collection table then bitmaps).
    pub fn body(&self) -> Vec<u8> {
        let mut body = Vec::new();
        for (name, count) in self.names.iter().zip(&self.counts) {
            body.push(name.len() as u8);
            body.extend_from_slice(&count.to_le_bytes());
            body.extend_from_slice(name.as_bytes());
        }
        body.extend_from_slice(&self.bitmaps);
        body
    }

    /// The on-disk section: the 16-byte header then the body as one zstd frame.
    pub(crate) fn encode(&self) -> Result<Vec<u8>> {
        if let Some(n) = self.names.iter().find(|n| n.len() > 255) {
            return Err(Error::FieldTooLong {
                column: "collection",
                len: n.len(),
                max: 255,
            });
        }
        let body = self.body();
        let mut out = Vec::with_capacity(COLLECTION_HEADER + body.len());
        out.extend_from_slice(&(self.names.len() as u32).to_le_bytes());
        out.extend_from_slice(&(self.block_count() as u32).to_le_bytes());
        out.extend_from_slice(&(self.bitmap_bytes as u32).to_le_bytes());
        out.extend_from_slice(&(body.len() as u32).to_le_bytes());
        out.extend_from_slice(&crate::block::compress(&body)?);
        Ok(out)
    }

    /// Parses the on-disk section (header and frame, to the end of the file).
    pub fn parse(section: &[u8], block_count: u32) -> Result<CollectionIndex> {
        let bad = |m: String| Err(Error::Collections(m));
        if section.len() < COLLECTION_HEADER {
            return bad(format!("{} bytes, shorter than its header", section.len()));
        }
        let n = u32_at(section, 0);
        let blocks = u32_at(section, 4);
        let bitmap_bytes = u32_at(section, 8);
        let size = u32_at(section, 12) as usize;
        if n > MAX_COLLECTIONS {
            return bad(format!("{n} collections"));
        }
        if blocks != block_count {
            return bad(format!("{blocks} blocks, the header says {block_count}"));
        }
        if bitmap_bytes != n.div_ceil(8) {
            return bad(format!("{bitmap_bytes}-byte bitmaps for {n} collections"));
        }
        // Each entry takes at least 5 bytes and the bitmaps exactly blocks × bitmap bytes: a
        // body smaller than that cannot hold what the header claims, whatever it decompresses to.
        let min = u64::from(n) * 5 + u64::from(blocks) * u64::from(bitmap_bytes);
        if (size as u64) < min || size > MAX_BLOCK_BYTES {
            return bad(format!(
                "body of {size} bytes for {n} collections, {blocks} blocks"
            ));
        }
        let body = decompress(&section[COLLECTION_HEADER..], size)?;
        if body.len() != size {
            return bad(format!(
                "body is {} bytes, the header says {size}",
                body.len()
            ));
        }
        let (n, bitmap_bytes) = (n as usize, bitmap_bytes as usize);
        let mut names = Vec::with_capacity(n);
        let mut counts = Vec::with_capacity(n);
        let mut off = 0;
        for i in 0..n {
            let Some(&len) = body.get(off) else {
                return bad(format!("collection {i} cut short"));
            };
            let end = off + 5 + len as usize;
            if end > body.len() {
                return bad(format!("collection {i} cut short"));
            }
            counts.push(u32_at(&body, off + 1));
            let name = std::str::from_utf8(&body[off + 5..end])
                .map_err(|_| Error::Collections(format!("collection {i} is not UTF-8")))?;
            names.push(name.to_owned());
            off = end;
        }
        let bitmaps = body[off..].to_vec();
        if bitmaps.len() != blocks as usize * bitmap_bytes {
            return bad(format!(
                "{} bitmap bytes, want {} blocks × {bitmap_bytes}",
                bitmaps.len(),
                blocks
            ));
        }
        // A bit past the last collection (in the last byte's padding) names nothing.
        if n % 8 != 0 {
            let pad = !((1u8 << (n % 8)) - 1);
            if let Some(b) = (0..blocks as usize)
                .find(|b| bitmaps[b * bitmap_bytes + bitmap_bytes - 1] & pad != 0)
            {
                return bad(format!("block {b}'s bitmap names a collection past {n}"));
            }
        }
        Ok(CollectionIndex {
            names,
            counts,
            bitmap_bytes,
            blocks: blocks as usize,
            bitmaps,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_info_round_trips_in_52_bytes() {
        let b = BlockInfo {
            offset: 256,
            compressed_size: 10,
            uncompressed_size: 20,
            event_count: 2,
            min_seq: 1,
            max_seq: 2,
            min_witnessed_at: -1,
            max_witnessed_at: 7,
        };
        let mut v = Vec::new();
        b.encode(&mut v);
        assert_eq!(v.len(), BLOCK_INDEX_ENTRY);
        assert_eq!(BlockInfo::parse(&v), b);
    }

    #[test]
    fn collection_index_round_trips_and_checks() {
        let idx = CollectionIndex::new(
            vec!["a.b.c".into(), "$sync".into(), "x.y.z".into()],
            vec![3, 0, 1],
            &[vec![0, 1], vec![2], vec![]],
        );
        let bytes = idx.encode().unwrap();
        let back = CollectionIndex::parse(&bytes, 3).unwrap();
        assert_eq!(back, idx);
        assert_eq!(back.block_ids(0).collect::<Vec<_>>(), [0, 1]);
        assert!(back.block_has(1, 2) && !back.block_has(2, 2) && !back.block_has(9, 0));
        assert_eq!(back.id("x.y.z"), Some(2));
        assert!(CollectionIndex::parse(&bytes, 2).is_err());
        // No collection at all (rows without one, no markers): the blocks are still counted.
        let none = CollectionIndex::new(vec![], vec![], &[vec![], vec![]]);
        let back = CollectionIndex::parse(&none.encode().unwrap(), 2).unwrap();
        assert_eq!((back.block_count(), back.block_ids(1).count()), (2, 0));
        for cut in 0..bytes.len() {
            assert!(CollectionIndex::parse(&bytes[..cut], 3).is_err(), "{cut}");
        }
    }
}
