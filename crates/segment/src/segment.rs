//! A sealed segment read from its bytes, every structure checked before it is trusted.
//!
//! Why a module: this is what `getSegment` serves and what a client or the planner opens. Opening
//! validates the whole file except the blocks' contents — header, offsets against the file length
//! (before anything is allocated from them), the block index (in range, ascending, not
//! overlapping, each length prefix equal to its entry), the blooms' shapes, the checksum, the
//! collection index — so that what follows (serving a block, testing a bloom) cannot fail on
//! structure. Blocks are decompressed on demand and checked against their index entries.
//!
//! The reader is stricter than Jetstream's in two places, on purpose: the blocks must be
//! contiguous from offset 256 to the footer (the Python SDK walks the length prefixes without
//! reading the index, so a file with a gap would read differently there), and so must the footer
//! sections (the segment bloom starts where the block index ends). Every file Jetstream's writer
//! and its compaction produce satisfies both; a spliced file does not.
//!
//! Memory: the block index, the collection index and nothing else are copied; blooms and frames
//! are read in place from the borrowed bytes (a memory map or a read buffer — I/O is the caller's).

use crate::block::{decode_block, decompress, Row, MAX_BLOCK_ROWS};
use crate::bloom::{Bloom, BloomKey};
use crate::error::{Error, Result};
use crate::footer::{BlockInfo, CollectionIndex, BLOCK_INDEX_ENTRY};
use crate::header::{checksum, u64_at, Header, HEADER_BYTES};

/// The most blocks a segment may have (Jetstream's `maxBlockCountLimit`).
pub const MAX_BLOCKS: u32 = 1 << 20;

/// An opened, validated sealed segment borrowing the file's bytes.
#[derive(Debug, Clone)]
pub struct Segment<'a> {
    bytes: &'a [u8],
    header: Header,
    blocks: Vec<BlockInfo>,
    did_bloom: Option<Bloom<'a>>,
    block_bloom_bytes: usize,
    collections: CollectionIndex,
}

fn footer(m: String) -> Error {
    Error::Footer(m)
}

impl<'a> Segment<'a> {
    /// Opens and validates a sealed segment, its checksum included.
    pub fn open(bytes: &'a [u8]) -> Result<Segment<'a>> {
        let header = Header::parse(bytes)?;
        let (hb, footer) = split(bytes, &header)?;
        let parts = Footer::parse(&hb, &header, footer, Some(bytes))?;
        Ok(Segment {
            bytes,
            header,
            blocks: parts.blocks,
            did_bloom: parts.did_bloom,
            block_bloom_bytes: parts.block_bloom_bytes,
            collections: parts.collections,
        })
    }

    /// The header.
    pub fn header(&self) -> &Header {
        &self.header
    }
    /// The block index.
    pub fn blocks(&self) -> &[BlockInfo] {
        &self.blocks
    }
    /// The collection index (names, counts, per-block bitmaps).
    pub fn collections(&self) -> &CollectionIndex {
        &self.collections
    }
    /// Bytes of each per-block bloom (taken from the footer: legacy files differ).
    pub fn block_bloom_bytes(&self) -> usize {
        self.block_bloom_bytes
    }

    fn info(&self, index: usize) -> Result<&BlockInfo> {
        self.blocks.get(index).ok_or(Error::BlockOutOfRange {
            index,
            count: self.blocks.len(),
        })
    }

    /// The bare zstd frame of a block, as `getBlock` serves it.
    pub fn block_frame(&self, index: usize) -> Result<&'a [u8]> {
        let b = self.info(index)?;
        let start = b.offset as usize + 8;
        Ok(&self.bytes[start..start + b.compressed_size as usize])
    }

    /// A block decompressed and checked against its index entry's size; decode with
    /// [`Segment::rows`].
    pub fn block_body(&self, index: usize) -> Result<Vec<u8>> {
        let b = *self.info(index)?;
        let body = decompress(self.block_frame(index)?, b.uncompressed_size as usize)?;
        if body.len() != b.uncompressed_size as usize {
            return Err(Error::BlockMismatch {
                block: index,
                reason: format!(
                    "{} bytes, the index says {}",
                    body.len(),
                    b.uncompressed_size
                ),
            });
        }
        Ok(body)
    }

    /// The rows of a block body from [`Segment::block_body`], checked against the index entry:
    /// row count, and every seq and time within the entry's bounds.
    pub fn rows<'b>(&self, index: usize, body: &'b [u8]) -> Result<Vec<Row<'b>>> {
        let b = *self.info(index)?;
        let rows = decode_block(body)?;
        let mismatch = |reason: String| Error::BlockMismatch {
            block: index,
            reason,
        };
        if rows.len() != b.event_count as usize {
            return Err(mismatch(format!(
                "{} rows, the index says {}",
                rows.len(),
                b.event_count
            )));
        }
        if let Some(r) = rows.iter().find(|r| {
            r.seq < b.min_seq
                || r.seq > b.max_seq
                || r.witnessed_at < b.min_witnessed_at
                || r.witnessed_at > b.max_witnessed_at
        }) {
            return Err(mismatch(format!(
                "seq {} or its time outside the entry's bounds",
                r.seq
            )));
        }
        Ok(rows)
    }

    /// Whether the segment may hold rows of `did` (true when it has no segment bloom).
    pub fn may_contain_did(&self, did: &str) -> bool {
        self.did_bloom.is_none_or(|b| b.contains(did.as_bytes()))
    }

    /// The segment-level DID bloom, if the segment has one.
    pub fn did_bloom(&self) -> Option<Bloom<'a>> {
        self.did_bloom
    }

    /// A block's DID bloom.
    pub fn block_bloom(&self, index: usize) -> Result<Bloom<'a>> {
        self.info(index)?;
        let start =
            self.header.block_did_bloom_offset as usize + 8 + index * self.block_bloom_bytes;
        Bloom::parse(&self.bytes[start..start + self.block_bloom_bytes])
    }

    /// The blocks that may hold rows of `did`, ascending (no false negatives).
    pub fn blocks_with_did(&self, did: &str) -> Vec<usize> {
        self.blocks_with_key(BloomKey::new(did.as_bytes()))
    }

    /// [`Segment::blocks_with_did`] for a DID hashed once ([`BloomKey::new`]).
    pub fn blocks_with_key(&self, key: BloomKey) -> Vec<usize> {
        if self.did_bloom.is_some_and(|b| !b.contains_key(key)) {
            return Vec::new();
        }
        (0..self.blocks.len())
            .filter(|&i| self.block_bloom(i).is_ok_and(|b| b.contains_key(key)))
            .collect()
    }
}

/// The header's 256 bytes and the footer's slice of a whole file, the footer offset checked
/// against the file's length.
fn split<'a>(bytes: &'a [u8], h: &Header) -> Result<([u8; HEADER_BYTES], &'a [u8])> {
    let len = bytes.len() as u64;
    if h.footer_offset < HEADER_BYTES as u64 || h.footer_offset > len {
        return Err(footer(format!(
            "footer offset {} outside [256, {len}]",
            h.footer_offset
        )));
    }
    let mut hb = [0u8; HEADER_BYTES];
    hb.copy_from_slice(&bytes[..HEADER_BYTES]);
    Ok((hb, &bytes[h.footer_offset as usize..]))
}

/// The footer's sections, validated: what both [`Segment`] and [`SegmentMeta`] keep.
struct Footer<'a> {
    blocks: Vec<BlockInfo>,
    did_bloom: Option<Bloom<'a>>,
    /// Start of the first per-block filter within the footer.
    block_blooms_at: usize,
    block_bloom_bytes: usize,
    collections: CollectionIndex,
}

impl<'a> Footer<'a> {
    /// Validates the footer (`footer_offset` to the end of the file) against the header, the
    /// checksum first. `file`, when given, is the whole file, for the blocks' length prefixes.
    fn parse(
        hb: &[u8; HEADER_BYTES],
        h: &Header,
        foot: &'a [u8],
        file: Option<&[u8]>,
    ) -> Result<Footer<'a>> {
        let len = h.footer_offset + foot.len() as u64;
        if h.footer_offset < HEADER_BYTES as u64 {
            return Err(footer(format!(
                "footer offset {} outside [256, {len}]",
                h.footer_offset
            )));
        }
        if h.block_index_offset != h.footer_offset {
            return Err(footer(format!(
                "block index at {}, footer at {}",
                h.block_index_offset, h.footer_offset
            )));
        }
        if h.block_count > MAX_BLOCKS {
            return Err(Error::TooMany {
                what: "blocks",
                count: h.block_count.into(),
            });
        }
        let index_end = h.block_index_offset + u64::from(h.block_count) * BLOCK_INDEX_ENTRY as u64;
        if h.did_bloom_offset != index_end
            || h.block_did_bloom_offset < h.did_bloom_offset
            || h.collection_index_offset < h.block_did_bloom_offset
            || h.collection_index_offset > len
        {
            return Err(footer(format!(
                "sections out of order: index {}..{index_end}, bloom {}, block blooms {}, \
                 collections {}, file {len}",
                h.block_index_offset,
                h.did_bloom_offset,
                h.block_did_bloom_offset,
                h.collection_index_offset
            )));
        }
        // Every offset is now within [footer_offset, len], so the casts below are in range.
        let at = |o: u64| (o - h.footer_offset) as usize;

        // The checksum first: past this point a failure is a writer's bug, not rot.
        let computed = checksum(hb, foot);
        if computed != h.checksum {
            return Err(Error::ChecksumMismatch {
                stored: h.checksum,
                computed,
            });
        }

        let index = &foot[at(h.block_index_offset)..at(index_end)];
        let blocks: Vec<BlockInfo> = index
            .chunks_exact(BLOCK_INDEX_ENTRY)
            .map(BlockInfo::parse)
            .collect();
        check_blocks(file, &blocks, h)?;

        let seg_bloom = &foot[at(h.did_bloom_offset)..at(h.block_did_bloom_offset)];
        let did_bloom = if seg_bloom.is_empty() {
            None
        } else {
            Some(Bloom::parse(seg_bloom)?)
        };

        let region = &foot[at(h.block_did_bloom_offset)..at(h.collection_index_offset)];
        if region.len() < 8 {
            return Err(footer(format!(
                "per-block bloom region of {} bytes",
                region.len()
            )));
        }
        let count = u64::from(u32::from_le_bytes([
            region[0], region[1], region[2], region[3],
        ]));
        let size = u64::from(u32::from_le_bytes([
            region[4], region[5], region[6], region[7],
        ]));
        if count != u64::from(h.block_count) || 8 + count * size != region.len() as u64 {
            return Err(footer(format!(
                "per-block bloom region: {count} × {size} bytes in {} for {} blocks",
                region.len(),
                h.block_count
            )));
        }
        let block_bloom_bytes = size as usize;
        for i in 0..count as usize {
            let at = 8 + i * block_bloom_bytes;
            Bloom::parse(&region[at..at + block_bloom_bytes])?;
        }

        let collections =
            CollectionIndex::parse(&foot[at(h.collection_index_offset)..], h.block_count)?;

        Ok(Footer {
            blocks,
            did_bloom,
            block_blooms_at: at(h.block_did_bloom_offset) + 8,
            block_bloom_bytes,
            collections,
        })
    }
}

/// A sealed segment's metadata read from its header and footer alone — what a server keeps in
/// memory per segment to list it, plan over it and serve its blocks, without reading (or
/// holding) the blocks: the header, the block index, both kinds of DID bloom and the collection
/// index, all validated and the checksum verified, as [`Segment::open`] does. The one check it
/// cannot make is each block's `u64` length prefix (it lies in the blocks); a server reading a
/// block's bytes checks that prefix itself.
#[derive(Debug, Clone)]
pub struct SegmentMeta {
    header: Header,
    blocks: Vec<BlockInfo>,
    /// The footer's bytes (the blooms are read in place from them).
    footer: Vec<u8>,
    did_bloom: Option<std::ops::Range<usize>>,
    block_blooms_at: usize,
    block_bloom_bytes: usize,
    collections: CollectionIndex,
}

impl SegmentMeta {
    /// Validates a segment's metadata from the file's first 256 bytes (`head`; more are
    /// ignored) and its footer (from the header's `footer_offset` to the end of the file).
    pub fn from_parts(head: &[u8], footer: Vec<u8>) -> Result<SegmentMeta> {
        let header = Header::parse(head)?;
        let mut hb = [0u8; HEADER_BYTES];
        hb.copy_from_slice(&head[..HEADER_BYTES]);
        let parts = Footer::parse(&hb, &header, &footer, None)?;
        let did_bloom = parts.did_bloom.map(|_| {
            (header.did_bloom_offset - header.footer_offset) as usize
                ..(header.block_did_bloom_offset - header.footer_offset) as usize
        });
        let (blocks, block_blooms_at, block_bloom_bytes, collections) = (
            parts.blocks,
            parts.block_blooms_at,
            parts.block_bloom_bytes,
            parts.collections,
        );
        Ok(SegmentMeta {
            header,
            blocks,
            footer,
            did_bloom,
            block_blooms_at,
            block_bloom_bytes,
            collections,
        })
    }

    /// The metadata of a whole file in memory (for tests and tools; a server reads the two
    /// parts with [`Header::parse`] and `footer_offset`).
    pub fn from_file(bytes: &[u8]) -> Result<SegmentMeta> {
        let header = Header::parse(bytes)?;
        let (_, foot) = split(bytes, &header)?;
        SegmentMeta::from_parts(bytes, foot.to_vec())
    }

    /// The header.
    pub fn header(&self) -> &Header {
        &self.header
    }
    /// The block index.
    pub fn blocks(&self) -> &[BlockInfo] {
        &self.blocks
    }
    /// The collection index.
    pub fn collections(&self) -> &CollectionIndex {
        &self.collections
    }
    /// The file's length: the footer ends it.
    pub fn file_len(&self) -> u64 {
        self.header.footer_offset + self.footer.len() as u64
    }
    /// The segment-level DID bloom, if the segment has one.
    pub fn did_bloom(&self) -> Option<Bloom<'_>> {
        self.did_bloom
            .clone()
            .map(|r| Bloom::validated(&self.footer[r]))
    }
    /// Block `index`'s DID bloom (`None` past the last block).
    pub fn block_bloom(&self, index: usize) -> Option<Bloom<'_>> {
        if index >= self.blocks.len() {
            return None;
        }
        let start = self.block_blooms_at + index * self.block_bloom_bytes;
        Some(Bloom::validated(
            &self.footer[start..start + self.block_bloom_bytes],
        ))
    }
}

/// The block index against the header and, given the file's bytes, each block's length prefix
/// (metadata read from the header and footer alone, [`SegmentMeta`], cannot check those).
fn check_blocks(bytes: Option<&[u8]>, blocks: &[BlockInfo], h: &Header) -> Result<()> {
    let mut prev_end = HEADER_BYTES as u64;
    let mut prev_max: Option<u64> = None;
    let mut events = 0u64;
    let mut bounds: Option<(u64, u64, i64, i64)> = None;
    for (i, b) in blocks.iter().enumerate() {
        let bad = |reason: String| Error::BlockIndex { block: i, reason };
        // Contiguous from 256: Jetstream's writers produce nothing else, and the Python SDK
        // walks the length prefixes from 256 without reading the index.
        if b.offset != prev_end || b.offset >= h.footer_offset {
            return Err(bad(format!(
                "offset {}, the previous block ends at {prev_end}",
                b.offset
            )));
        }
        let end = b.offset + 8 + u64::from(b.compressed_size);
        if end > h.footer_offset {
            return Err(bad(format!(
                "ends at {end}, past the footer at {}",
                h.footer_offset
            )));
        }
        if let Some(bytes) = bytes {
            let prefix = u64_at(bytes, b.offset as usize);
            if prefix != u64::from(b.compressed_size) {
                return Err(bad(format!(
                    "length prefix {prefix}, the entry says {}",
                    b.compressed_size
                )));
            }
        }
        if b.max_seq < b.min_seq || b.max_witnessed_at < b.min_witnessed_at {
            return Err(bad("bounds reversed".into()));
        }
        if b.event_count as usize > MAX_BLOCK_ROWS {
            return Err(bad(format!("{} rows", b.event_count)));
        }
        // Emptied blocks (compaction) keep their old bounds; only blocks with rows order seqs.
        if b.event_count > 0 {
            if prev_max.is_some_and(|m| b.min_seq <= m) {
                return Err(bad(format!(
                    "seq {} not after the previous block's",
                    b.min_seq
                )));
            }
            prev_max = Some(b.max_seq);
        }
        // The header's bounds are the union of every block's envelope, emptied blocks included:
        // compaction keeps both the envelopes and the header (Jetstream `segment/rewrite.go`).
        bounds = Some(match bounds {
            None => (b.min_seq, b.max_seq, b.min_witnessed_at, b.max_witnessed_at),
            Some((a, z, t0, t1)) => (
                a.min(b.min_seq),
                z.max(b.max_seq),
                t0.min(b.min_witnessed_at),
                t1.max(b.max_witnessed_at),
            ),
        });
        events += u64::from(b.event_count);
        prev_end = end;
    }
    if prev_end != h.footer_offset {
        return Err(footer(format!(
            "blocks end at {prev_end}, the footer starts at {}",
            h.footer_offset
        )));
    }
    if events != u64::from(h.event_count) {
        return Err(footer(format!(
            "blocks hold {events} rows, the header says {}",
            h.event_count
        )));
    }
    if let Some((a, z, t0, t1)) = bounds {
        if (a, z, t0, t1) != (h.min_seq, h.max_seq, h.min_witnessed_at, h.max_witnessed_at) {
            return Err(footer("header bounds disagree with the block index".into()));
        }
    }
    Ok(())
}
