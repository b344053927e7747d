//! Writing sealed segments: blocks appended in order, then the footer and the header.
//!
//! Why a module: riptide must write `.jss` files that every v2 client reads, from rows it has
//! verified. The writer mirrors Jetstream's active-segment life (`segment/writer.go`,
//! `seal.go`): a file starts with 256 zero bytes (an active file: checksum zero), each block is
//! appended as `u64 length` + frame, and sealing computes the footer from the blocks' rows,
//! appends it, and only then fills in the header. It does no I/O: [`SegmentWriter`] hands back
//! the bytes to append and, at [`SegmentWriter::finish`], the footer and header, so that the
//! caller can append, fsync, then overwrite offset 0 — the crash-safe order (a file whose header
//! is still zero is an active file to resume, never a segment to serve).
//!
//! Byte equality with Jetstream: everything but the zstd frames is a function of the rows and
//! is produced exactly as Jetstream produces it (row layout, block index, blooms sized by gloom's
//! rules, collection table in first-seen order, sentinels, checksum). The frames are libzstd's,
//! Jetstream's are Go's `klauspost/compress`: the same bodies compress to different bytes.
//! [`SegmentWriter::append_frame`] takes an existing frame as is, so re-sealing Jetstream's own
//! frames reproduces its file but for the collection index frame (and so the checksum).

use std::collections::{BTreeSet, HashMap, HashSet};

use crate::block::{compress, decode_block, decompress, encode_block, Row, MAX_BLOCK_BYTES};
use crate::bloom::{BloomBuilder, FP_RATE};
use crate::error::{Error, Result};
use crate::footer::{BlockInfo, CollectionIndex};
use crate::header::{checksum, Header, HEADER_BYTES, VERSION};
use crate::segment::MAX_BLOCKS;

/// The bytes that finish a segment: append `footer`, make it durable, then write `header` at 0.
#[derive(Debug, Clone)]
pub struct Sealed {
    /// The finished header (checksum set).
    pub header: [u8; HEADER_BYTES],
    /// The footer, to append after the last block.
    pub footer: Vec<u8>,
    /// The parsed header.
    pub parsed: Header,
}

/// Builds one segment. Not thread-safe; one writer per segment.
#[derive(Debug, Default)]
pub struct SegmentWriter {
    len: u64,
    blocks: Vec<BlockInfo>,
    last_max_seq: Option<u64>,
    events: u32,
    dids: HashSet<String>,
    block_dids: Vec<usize>,
    block_did_sets: Vec<HashSet<String>>,
    names: Vec<String>,
    counts: Vec<u32>,
    ids: HashMap<String, u32>,
    block_ids: Vec<Vec<u32>>,
}

impl SegmentWriter {
    /// A writer for an empty active segment; the caller writes [`HEADER_BYTES`] zero bytes first.
    pub fn new() -> SegmentWriter {
        SegmentWriter {
            len: HEADER_BYTES as u64,
            ..SegmentWriter::default()
        }
    }

    /// The file's length so far (header and blocks), for rotating at a size.
    pub fn len(&self) -> u64 {
        self.len
    }
    /// Whether no block has been appended.
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// Compresses `rows` into a block and appends its bytes (`u64` length, frame) to `out`.
    pub fn append_rows(&mut self, rows: &[Row<'_>], out: &mut Vec<u8>) -> Result<()> {
        if rows.is_empty() {
            return Err(Error::EmptyBlock);
        }
        let mut body = Vec::new();
        encode_block(rows, &mut body)?;
        let frame = compress(&body)?;
        self.add(rows, frame.len(), body.len(), None)?;
        out.extend_from_slice(&(frame.len() as u64).to_le_bytes());
        out.extend_from_slice(&frame);
        Ok(())
    }

    /// Appends an already-compressed block frame as is (a live block sealed without
    /// recompression, or another writer's frame); it is decoded to index it.
    pub fn append_frame(&mut self, frame: &[u8], out: &mut Vec<u8>) -> Result<()> {
        let body = decompress(frame, MAX_BLOCK_BYTES)?;
        let rows = decode_block(&body)?;
        if rows.is_empty() {
            return Err(Error::EmptyBlock);
        }
        self.add(&rows, frame.len(), body.len(), None)?;
        out.extend_from_slice(&(frame.len() as u64).to_le_bytes());
        out.extend_from_slice(frame);
        Ok(())
    }

    /// Appends a block of a segment being compacted that folding leaves as it is: its frame
    /// byte for byte under its `original` index entry's envelope, so that a block emptied or
    /// thinned by an earlier pass keeps the bounds Jetstream's compaction keeps. Decoded once, as
    /// [`SegmentWriter::append_frame`] does, to index it; an empty block is accepted.
    pub fn append_kept(
        &mut self,
        frame: &[u8],
        original: &BlockInfo,
        out: &mut Vec<u8>,
    ) -> Result<()> {
        let body = decompress(frame, MAX_BLOCK_BYTES)?;
        let rows = decode_block(&body)?;
        self.add(&rows, frame.len(), body.len(), Some(original))?;
        out.extend_from_slice(&(frame.len() as u64).to_le_bytes());
        out.extend_from_slice(frame);
        Ok(())
    }

    /// Appends a block of a compacted segment: the rows of an `original` block that survive
    /// folding, under the original's seq and time envelope, as Jetstream's compaction keeps it
    /// (block numbers, cursors and the header's bounds stay as they were). No rows gives the
    /// empty block (a `u32` 0) Jetstream writes for a block whose rows were all superseded.
    pub fn append_compacted(
        &mut self,
        rows: &[Row<'_>],
        original: &BlockInfo,
        out: &mut Vec<u8>,
    ) -> Result<()> {
        let mut body = Vec::new();
        encode_block(rows, &mut body)?;
        let frame = compress(&body)?;
        self.add(rows, frame.len(), body.len(), Some(original))?;
        out.extend_from_slice(&(frame.len() as u64).to_le_bytes());
        out.extend_from_slice(&frame);
        Ok(())
    }

    fn add(
        &mut self,
        rows: &[Row<'_>],
        frame: usize,
        body: usize,
        envelope: Option<&BlockInfo>,
    ) -> Result<()> {
        let too_many = |what, count: usize| Error::TooMany {
            what,
            count: count as u64,
        };
        if self.blocks.len() >= MAX_BLOCKS as usize {
            return Err(too_many("blocks", self.blocks.len() + 1));
        }
        let events = u32::try_from(self.events as usize + rows.len())
            .map_err(|_| too_many("rows", self.events as usize + rows.len()))?;
        let compressed_size = u32::try_from(frame).map_err(|_| too_many("frame bytes", frame))?;
        let uncompressed_size = u32::try_from(body).map_err(|_| too_many("block bytes", body))?;
        let mut info = BlockInfo {
            offset: self.len,
            compressed_size,
            uncompressed_size,
            event_count: rows.len() as u32,
            min_seq: u64::MAX,
            max_seq: 0,
            min_witnessed_at: i64::MAX,
            max_witnessed_at: i64::MIN,
        };
        let mut dids = HashSet::new();
        let mut ids = BTreeSet::new();
        for r in rows {
            info.min_seq = info.min_seq.min(r.seq);
            info.max_seq = info.max_seq.max(r.seq);
            info.min_witnessed_at = info.min_witnessed_at.min(r.witnessed_at);
            info.max_witnessed_at = info.max_witnessed_at.max(r.witnessed_at);
            if !r.did.is_empty() {
                if !self.dids.contains(r.did) {
                    self.dids.insert(r.did.to_owned());
                }
                if !dids.contains(r.did) {
                    dids.insert(r.did.to_owned());
                }
            }
            // As Jetstream's seal walk: the collection (counted), then the kind's sentinel (not).
            if !r.collection.is_empty() {
                ids.insert(self.intern(r.collection, true)?);
            }
            if let Some(s) = r.kind.sentinel_collection() {
                ids.insert(self.intern(s, false)?);
            }
        }
        let mismatch = |reason: &str| Error::BlockMismatch {
            block: self.blocks.len(),
            reason: reason.into(),
        };
        if let Some(e) = envelope {
            if !rows.is_empty()
                && (info.min_seq < e.min_seq
                    || info.max_seq > e.max_seq
                    || info.min_witnessed_at < e.min_witnessed_at
                    || info.max_witnessed_at > e.max_witnessed_at)
            {
                return Err(mismatch("rows outside the original block's envelope"));
            }
            if e.min_seq > e.max_seq || e.min_witnessed_at > e.max_witnessed_at {
                return Err(mismatch("envelope reversed"));
            }
            (info.min_seq, info.max_seq) = (e.min_seq, e.max_seq);
            (info.min_witnessed_at, info.max_witnessed_at) =
                (e.min_witnessed_at, e.max_witnessed_at);
        }
        // Seqs rise from block to block; an emptied block is not ordered (the reader skips it).
        if !rows.is_empty() {
            if self.last_max_seq.is_some_and(|m| info.min_seq <= m) {
                return Err(mismatch("seqs must rise from block to block"));
            }
            self.last_max_seq = Some(info.max_seq);
        }
        self.len += 8 + frame as u64;
        self.events = events;
        self.blocks.push(info);
        self.block_dids.push(dids.len());
        self.block_did_sets.push(dids);
        self.block_ids.push(ids.into_iter().collect());
        Ok(())
    }

    fn intern(&mut self, name: &str, count: bool) -> Result<u32> {
        let id = match self.ids.get(name) {
            Some(&id) => id,
            None => {
                if name.len() > 255 {
                    return Err(Error::FieldTooLong {
                        column: "collection",
                        len: name.len(),
                        max: 255,
                    });
                }
                let id = self.names.len() as u32;
                self.names.push(name.to_owned());
                self.counts.push(0);
                self.ids.insert(name.to_owned(), id);
                id
            }
        };
        if count {
            self.counts[id as usize] = self.counts[id as usize].saturating_add(1);
        }
        Ok(id)
    }

    /// Builds the footer and the header. The file is sealed once the footer is appended after
    /// the blocks and the header written at offset 0.
    pub fn finish(self) -> Result<Sealed> {
        let footer_offset = self.len;
        let mut footer = Vec::new();
        for b in &self.blocks {
            b.encode(&mut footer);
        }
        let did_bloom_offset = footer_offset + footer.len() as u64;
        let mut seg = BloomBuilder::new(self.dids.len() as u64, FP_RATE);
        for d in &self.dids {
            seg.insert(d.as_bytes());
        }
        footer.extend_from_slice(&seg.to_bytes());

        let block_did_bloom_offset = footer_offset + footer.len() as u64;
        // Every per-block filter is sized for the largest block's DID count, so that all are one
        // size and a reader finds block i's filter by multiplication (Jetstream issue #302).
        let capacity = self.block_dids.iter().copied().max().unwrap_or(0).max(1) as u64;
        let filters: Vec<Vec<u8>> = self
            .block_did_sets
            .iter()
            .map(|set| {
                let mut f = BloomBuilder::new(capacity, FP_RATE);
                set.iter().for_each(|d| f.insert(d.as_bytes()));
                f.to_bytes()
            })
            .collect();
        let size = filters.first().map_or(0, Vec::len);
        footer.extend_from_slice(&(filters.len() as u32).to_le_bytes());
        footer.extend_from_slice(&(size as u32).to_le_bytes());
        filters.iter().for_each(|f| footer.extend_from_slice(f));

        let collection_index_offset = footer_offset + footer.len() as u64;
        let index = CollectionIndex::new(self.names, self.counts, &self.block_ids);
        footer.extend_from_slice(&index.encode()?);

        // The union of the blocks' envelopes: the rows' bounds for a fresh seal, the original
        // header's for a compacted segment (its envelopes are kept).
        let all = self.blocks.iter();
        let mut parsed = Header {
            checksum: 0,
            version: VERSION,
            block_count: self.blocks.len() as u32,
            event_count: self.events,
            unique_did_count: self.dids.len() as u32,
            min_seq: all.clone().map(|b| b.min_seq).min().unwrap_or(0),
            max_seq: all.clone().map(|b| b.max_seq).max().unwrap_or(0),
            min_witnessed_at: all.clone().map(|b| b.min_witnessed_at).min().unwrap_or(0),
            max_witnessed_at: all.map(|b| b.max_witnessed_at).max().unwrap_or(0),
            footer_offset,
            did_bloom_offset,
            block_did_bloom_offset,
            collection_index_offset,
            block_index_offset: footer_offset,
        };
        parsed.checksum = checksum(&parsed.encode(), &footer);
        // A zero checksum would read back as an active file; XXH3 gives zero with probability
        // 2^-64, and no remedy exists in the format, so say so rather than write a lie.
        if parsed.checksum == 0 {
            return Err(Error::Footer("the checksum came out zero".into()));
        }
        Ok(Sealed {
            header: parsed.encode(),
            footer,
            parsed,
        })
    }
}

/// Writes a whole segment in memory, one block per slice of rows.
pub fn write_segment(blocks: &[&[Row<'_>]]) -> Result<Vec<u8>> {
    let mut w = SegmentWriter::new();
    let mut file = vec![0u8; HEADER_BYTES];
    for rows in blocks {
        w.append_rows(rows, &mut file)?;
    }
    let sealed = w.finish()?;
    file.extend_from_slice(&sealed.footer);
    file[..HEADER_BYTES].copy_from_slice(&sealed.header);
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kind::Kind;
    use crate::segment::Segment;

    fn row(seq: u64, kind: Kind, collection: &'static str) -> Row<'static> {
        Row {
            seq,
            witnessed_at: seq as i64,
            indexed_at: 0,
            kind,
            did: "did:plc:a",
            collection,
            rkey: "",
            rev: "",
            payload: b"",
        }
    }

    #[test]
    fn blocks_without_any_collection_still_count_in_the_collection_index() {
        let file =
            write_segment(&[&[row(1, Kind::Create, "")], &[row(2, Kind::Delete, "")]]).unwrap();
        let seg = Segment::open(&file).unwrap();
        assert!(seg.collections().names().is_empty());
        assert_eq!(seg.collections().block_count(), 2);
    }

    #[test]
    fn sentinels_are_indexed_but_not_counted() {
        let file = write_segment(&[&[
            row(1, Kind::Create, "app.bsky.feed.post"),
            row(2, Kind::Sync, ""),
            row(3, Kind::Account, ""),
        ]])
        .unwrap();
        let seg = Segment::open(&file).unwrap();
        assert_eq!(
            seg.collections().names(),
            ["app.bsky.feed.post", "$sync", "$account"]
        );
        assert_eq!(seg.collections().counts(), [1, 0, 0]);
        assert_eq!(
            seg.collections().block_ids(0).collect::<Vec<_>>(),
            [0, 1, 2]
        );
    }

    #[test]
    fn empty_blocks_and_falling_seqs_are_refused() {
        let mut w = SegmentWriter::new();
        let mut out = Vec::new();
        assert_eq!(w.append_rows(&[], &mut out), Err(Error::EmptyBlock));
        w.append_rows(&[row(5, Kind::Create, "a.b.c")], &mut out)
            .unwrap();
        assert_eq!(w.len(), HEADER_BYTES as u64 + out.len() as u64);
        assert!(matches!(
            w.append_rows(&[row(5, Kind::Create, "a.b.c")], &mut out),
            Err(Error::BlockMismatch { .. })
        ));
    }
}

#[cfg(test)]
mod compaction_tests {
    use super::*;
    use crate::kind::Kind;
    use crate::segment::Segment;

    fn row(seq: u64, did: &'static str) -> Row<'static> {
        Row {
            seq,
            witnessed_at: seq as i64 * 100,
            indexed_at: 0,
            kind: Kind::Create,
            did,
            collection: "app.bsky.feed.post",
            rkey: "k",
            rev: "r",
            payload: b"p",
        }
    }

    #[test]
    fn a_compacted_segment_keeps_its_envelopes_and_header_bounds() {
        let blocks: [&[Row<'_>]; 3] = [
            &[row(1, "did:plc:gone"), row(2, "did:plc:gone")],
            &[
                row(3, "did:plc:a"),
                row(4, "did:plc:gone"),
                row(5, "did:plc:a"),
            ],
            &[row(6, "did:plc:b")],
        ];
        let file = write_segment(&blocks).unwrap();
        let seg = Segment::open(&file).unwrap();

        // Fold away did:plc:gone, as compaction after its account was deleted would.
        let mut w = SegmentWriter::new();
        let mut out = vec![0u8; HEADER_BYTES];
        for (i, rows) in blocks.iter().enumerate() {
            let kept: Vec<Row<'_>> = rows
                .iter()
                .copied()
                .filter(|r| r.did != "did:plc:gone")
                .collect();
            if kept.len() == rows.len() {
                w.append_frame(seg.block_frame(i).unwrap(), &mut out)
                    .unwrap();
            } else {
                w.append_compacted(&kept, &seg.blocks()[i], &mut out)
                    .unwrap();
            }
        }
        let sealed = w.finish().unwrap();
        out.extend_from_slice(&sealed.footer);
        out[..HEADER_BYTES].copy_from_slice(&sealed.header);

        let c = Segment::open(&out).unwrap();
        let (a, b) = (c.header(), seg.header());
        assert_eq!(
            (a.min_seq, a.max_seq, a.min_witnessed_at),
            (b.min_seq, b.max_seq, b.min_witnessed_at)
        );
        assert_eq!((a.event_count, a.unique_did_count), (3, 2));
        assert_eq!(c.blocks()[0].event_count, 0);
        assert_eq!((c.blocks()[0].min_seq, c.blocks()[0].max_seq), (1, 2));
        assert_eq!((c.blocks()[1].min_seq, c.blocks()[1].max_seq), (3, 5));
        assert_eq!(c.block_body(0).unwrap(), [0, 0, 0, 0]);
        let body = c.block_body(1).unwrap();
        assert_eq!(
            c.rows(1, &body)
                .unwrap()
                .iter()
                .map(|r| r.seq)
                .collect::<Vec<_>>(),
            [3, 5]
        );
        assert_eq!(c.collections().counts(), [3]);
        assert!(c.blocks_with_did("did:plc:a") == [1]);

        // Rows outside the original envelope are refused.
        let mut w = SegmentWriter::new();
        assert!(w
            .append_compacted(&[row(9, "did:plc:a")], &seg.blocks()[0], &mut Vec::new())
            .is_err());
    }
}
