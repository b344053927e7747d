//! A block: up to a few thousand rows in columns, one zstd frame on disk.
//!
//! Why a module: a block is the unit everything else moves — `getBlock` serves one frame bare,
//! a segment is a run of them, and a reader decodes one at a time. Layout (Jetstream
//! `segment/block.go`, `docs/README.md` §3.2), all little-endian:
//!
//! ```text
//! u32 row_count
//! u64 seq[n] | i64 witnessed_at[n] | i64 indexed_at[n] | u8 kind[n] | u8 collection_len[n]
//! | u16 did_len[n] | u8 rkey_len[n] | u8 rev_len[n] | u32 payload_len[n]      (34 bytes a row)
//! collection blob | did blob | rkey blob | rev blob | payload blob
//! ```
//!
//! Decoding borrows: a [`Row`] points into the uncompressed body, so a block of 4,096 rows costs
//! one `Vec<Row>` and no copies. Every length is checked against the bytes that remain before it
//! is used, and trailing bytes are refused, as Jetstream's decoder does. What this module does not
//! do: I/O, or checking that a DID or NSID is well-formed (the server verifies rows before they
//! are written; a reader of a foreign file gets exactly its bytes).

use crate::error::{Error, Result};
use crate::kind::Kind;

/// Bytes of fixed-width columns per row.
pub const FIXED_ROW_BYTES: usize = 8 + 8 + 8 + 1 + 1 + 2 + 1 + 1 + 4;

/// The most rows a block may claim (Jetstream's decoder ceiling, `maxBlockEventsLimit`).
pub const MAX_BLOCK_ROWS: usize = 1 << 18;

/// The most bytes a block frame may decompress to (Jetstream's `maxDecodedBlockBytes`).
pub const MAX_BLOCK_BYTES: usize = 1 << 30;

/// The zstd level blocks are compressed at: libzstd's default, the nearest to the `SpeedDefault`
/// of the Go encoder Jetstream uses.
pub const ZSTD_LEVEL: i32 = 3;

/// One row of a block, borrowing its variable columns from the block's uncompressed body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Row<'a> {
    /// The event's seq (shared with the live stream).
    pub seq: u64,
    /// When the server first saw the event, unix microseconds.
    pub witnessed_at: i64,
    /// An operator-imported display time, unix microseconds; 0 when there is none.
    pub indexed_at: i64,
    /// What the row records.
    pub kind: Kind,
    /// The account's DID (may be empty for DID-less markers).
    pub did: &'a str,
    /// The record's collection (empty for non-commit kinds).
    pub collection: &'a str,
    /// The record key (empty for non-commit kinds).
    pub rkey: &'a str,
    /// The commit's rev (empty for non-commit kinds).
    pub rev: &'a str,
    /// The record's DAG-CBOR bytes as signed, or the event's payload for non-commit kinds.
    pub payload: &'a [u8],
}

impl Row<'_> {
    /// The time shown to subscribers (`time_us`): `indexed_at` when set, else `witnessed_at`.
    pub fn display_time_us(&self) -> i64 {
        if self.indexed_at != 0 {
            self.indexed_at
        } else {
            self.witnessed_at
        }
    }

    /// A copy that owns its columns, to cross threads or outlive the block.
    pub fn to_owned_row(&self) -> OwnedRow {
        OwnedRow {
            seq: self.seq,
            witnessed_at: self.witnessed_at,
            indexed_at: self.indexed_at,
            kind: self.kind,
            did: self.did.to_owned(),
            collection: self.collection.to_owned(),
            rkey: self.rkey.to_owned(),
            rev: self.rev.to_owned(),
            payload: self.payload.to_vec(),
        }
    }

    /// Checks every variable column against its length column's width.
    pub fn validate(&self) -> Result<()> {
        check_len("did", self.did.len(), u16::MAX as usize)?;
        check_len("collection", self.collection.len(), u8::MAX as usize)?;
        check_len("rkey", self.rkey.len(), u8::MAX as usize)?;
        check_len("rev", self.rev.len(), u8::MAX as usize)?;
        check_len("payload", self.payload.len(), u32::MAX as usize)
    }
}

fn check_len(column: &'static str, len: usize, max: usize) -> Result<()> {
    if len > max {
        return Err(Error::FieldTooLong { column, len, max });
    }
    Ok(())
}

/// A [`Row`] that owns its columns.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub struct OwnedRow {
    pub seq: u64,
    pub witnessed_at: i64,
    pub indexed_at: i64,
    pub kind: Kind,
    pub did: String,
    pub collection: String,
    pub rkey: String,
    pub rev: String,
    pub payload: Vec<u8>,
}

impl OwnedRow {
    /// The borrowed view.
    pub fn as_row(&self) -> Row<'_> {
        Row {
            seq: self.seq,
            witnessed_at: self.witnessed_at,
            indexed_at: self.indexed_at,
            kind: self.kind,
            did: &self.did,
            collection: &self.collection,
            rkey: &self.rkey,
            rev: &self.rev,
            payload: &self.payload,
        }
    }
}

/// A cursor over the body that refuses to read past its end.
struct Take<'a> {
    buf: &'a [u8],
    off: usize,
}

impl<'a> Take<'a> {
    fn take(&mut self, n: usize, reason: &'static str) -> Result<&'a [u8]> {
        let end = self.off.checked_add(n).filter(|&e| e <= self.buf.len());
        let Some(end) = end else {
            return Err(Error::Block {
                offset: self.off,
                reason,
            });
        };
        let s = &self.buf[self.off..end];
        self.off = end;
        Ok(s)
    }
}

fn le_u16(b: &[u8], i: usize) -> u16 {
    u16::from_le_bytes([b[2 * i], b[2 * i + 1]])
}
fn le_u32(b: &[u8], i: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[4 * i..4 * i + 4]);
    u32::from_le_bytes(a)
}
fn le_u64(b: &[u8], i: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[8 * i..8 * i + 8]);
    u64::from_le_bytes(a)
}

/// Splits a blob into `n` consecutive pieces of the given lengths, as UTF-8.
fn split_str<'a>(
    blob: &'a [u8],
    lens: impl Iterator<Item = usize>,
    column: &'static str,
    out: &mut Vec<&'a str>,
) -> Result<()> {
    let mut off = 0;
    for (row, len) in lens.enumerate() {
        // The blob's length is the sum of `lens`, so this slice is in range.
        let piece = &blob[off..off + len];
        off += len;
        out.push(std::str::from_utf8(piece).map_err(|_| Error::NotUtf8 { row, column })?);
    }
    Ok(())
}

/// Decodes an uncompressed block body into rows that borrow from it.
pub fn decode_block(body: &[u8]) -> Result<Vec<Row<'_>>> {
    let mut t = Take { buf: body, off: 0 };
    let n = u32::from_le_bytes(
        t.take(4, "shorter than its 4-byte row count")?
            .try_into()
            .map_err(|_| Error::Block {
                offset: 0,
                reason: "row count",
            })?,
    ) as usize;
    if n > MAX_BLOCK_ROWS {
        return Err(Error::Block {
            offset: 0,
            reason: "row count past 262,144",
        });
    }
    // The fixed columns must fit before anything is allocated for them.
    if body.len() - 4 < n * FIXED_ROW_BYTES {
        return Err(Error::Block {
            offset: 4,
            reason: "row count larger than the fixed columns present",
        });
    }
    let seq = t.take(8 * n, "seq column")?;
    let witnessed = t.take(8 * n, "witnessed_at column")?;
    let indexed = t.take(8 * n, "indexed_at column")?;
    let kinds = t.take(n, "kind column")?;
    let coll_len = t.take(n, "collection_len column")?;
    let did_len = t.take(2 * n, "did_len column")?;
    let rkey_len = t.take(n, "rkey_len column")?;
    let rev_len = t.take(n, "rev_len column")?;
    let pay_len = t.take(4 * n, "payload_len column")?;

    // Sums of at most 2^18 lengths of at most 2^32 each: no overflow in u64.
    let sum = |f: &dyn Fn(usize) -> u64| (0..n).map(f).sum::<u64>();
    let total = |v: u64| usize::try_from(v).unwrap_or(usize::MAX);
    let colls = t.take(total(sum(&|i| u64::from(coll_len[i]))), "collection blob")?;
    let dids = t.take(total(sum(&|i| u64::from(le_u16(did_len, i)))), "did blob")?;
    let rkeys = t.take(total(sum(&|i| u64::from(rkey_len[i]))), "rkey blob")?;
    let revs = t.take(total(sum(&|i| u64::from(rev_len[i]))), "rev blob")?;
    let pays = t.take(
        total(sum(&|i| u64::from(le_u32(pay_len, i)))),
        "payload blob",
    )?;
    if t.off != body.len() {
        return Err(Error::Block {
            offset: t.off,
            reason: "trailing bytes after the payload blob",
        });
    }

    let mut c = Vec::with_capacity(n);
    split_str(
        colls,
        coll_len.iter().map(|&l| l as usize),
        "collection",
        &mut c,
    )?;
    let mut d = Vec::with_capacity(n);
    split_str(
        dids,
        (0..n).map(|i| le_u16(did_len, i) as usize),
        "did",
        &mut d,
    )?;
    let mut k = Vec::with_capacity(n);
    split_str(rkeys, rkey_len.iter().map(|&l| l as usize), "rkey", &mut k)?;
    let mut r = Vec::with_capacity(n);
    split_str(revs, rev_len.iter().map(|&l| l as usize), "rev", &mut r)?;

    let mut rows = Vec::with_capacity(n);
    let mut poff = 0usize;
    for i in 0..n {
        let kind = Kind::from_u8(kinds[i]).ok_or(Error::InvalidKind {
            row: i,
            kind: kinds[i],
        })?;
        let pl = le_u32(pay_len, i) as usize;
        rows.push(Row {
            seq: le_u64(seq, i),
            witnessed_at: le_u64(witnessed, i) as i64,
            indexed_at: le_u64(indexed, i) as i64,
            kind,
            did: d[i],
            collection: c[i],
            rkey: k[i],
            rev: r[i],
            payload: &pays[poff..poff + pl],
        });
        poff += pl;
    }
    Ok(rows)
}

/// Appends the uncompressed body of `rows` to `out` (an empty slice gives the 4-byte empty
/// block Jetstream's compaction writes).
pub fn encode_block(rows: &[Row<'_>], out: &mut Vec<u8>) -> Result<()> {
    if rows.len() > MAX_BLOCK_ROWS {
        return Err(Error::TooMany {
            what: "rows in a block",
            count: rows.len() as u64,
        });
    }
    let mut var = 0usize;
    for r in rows {
        r.validate()?;
        var += r.did.len() + r.collection.len() + r.rkey.len() + r.rev.len() + r.payload.len();
    }
    out.reserve(4 + rows.len() * FIXED_ROW_BYTES + var);
    out.extend_from_slice(&(rows.len() as u32).to_le_bytes());
    rows.iter()
        .for_each(|r| out.extend_from_slice(&r.seq.to_le_bytes()));
    rows.iter()
        .for_each(|r| out.extend_from_slice(&r.witnessed_at.to_le_bytes()));
    rows.iter()
        .for_each(|r| out.extend_from_slice(&r.indexed_at.to_le_bytes()));
    rows.iter().for_each(|r| out.push(r.kind as u8));
    rows.iter().for_each(|r| out.push(r.collection.len() as u8));
    rows.iter()
        .for_each(|r| out.extend_from_slice(&(r.did.len() as u16).to_le_bytes()));
    rows.iter().for_each(|r| out.push(r.rkey.len() as u8));
    rows.iter().for_each(|r| out.push(r.rev.len() as u8));
    rows.iter()
        .for_each(|r| out.extend_from_slice(&(r.payload.len() as u32).to_le_bytes()));
    rows.iter()
        .for_each(|r| out.extend_from_slice(r.collection.as_bytes()));
    rows.iter()
        .for_each(|r| out.extend_from_slice(r.did.as_bytes()));
    rows.iter()
        .for_each(|r| out.extend_from_slice(r.rkey.as_bytes()));
    rows.iter()
        .for_each(|r| out.extend_from_slice(r.rev.as_bytes()));
    rows.iter().for_each(|r| out.extend_from_slice(r.payload));
    Ok(())
}

/// Compresses a block body (or any footer body) into one zstd frame: content size recorded,
/// content checksum on, as Jetstream writes its frames.
pub fn compress(body: &[u8]) -> Result<Vec<u8>> {
    let mut c = zstd::bulk::Compressor::new(ZSTD_LEVEL).map_err(|e| Error::Zstd(e.to_string()))?;
    c.include_checksum(true)
        .and_then(|_| c.include_contentsize(true))
        .map_err(|e| Error::Zstd(e.to_string()))?;
    c.compress(body).map_err(|e| Error::Zstd(e.to_string()))
}

/// Compresses `rows` into a block frame (what `getBlock` serves).
pub fn encode_block_frame(rows: &[Row<'_>]) -> Result<Vec<u8>> {
    let mut body = Vec::new();
    encode_block(rows, &mut body)?;
    compress(&body)
}

/// Decompresses exactly one zstd frame, refusing trailing bytes and output past `limit`.
///
/// Memory is bounded by `limit`, not by anything the frame claims: the output grows as it is
/// produced and stops one byte past the limit.
pub fn decompress(frame: &[u8], limit: usize) -> Result<Vec<u8>> {
    use std::io::Read;
    let size = zstd::zstd_safe::find_frame_compressed_size(frame)
        .map_err(|code| Error::Zstd(zstd::zstd_safe::get_error_name(code).to_owned()))?;
    if size != frame.len() {
        return Err(Error::Zstd(format!(
            "{} bytes after the frame's {size}",
            frame.len() - size
        )));
    }
    let mut dec = zstd::stream::read::Decoder::with_buffer(frame)
        .map_err(|e| Error::Zstd(e.to_string()))?
        .single_frame();
    // Frames of up to 1 GiB declare a window that large; libzstd refuses over 128 MiB by default.
    dec.window_log_max(31)
        .map_err(|e| Error::Zstd(e.to_string()))?;
    let mut out = Vec::new();
    dec.take((limit as u64).saturating_add(1))
        .read_to_end(&mut out)
        .map_err(|e| Error::Zstd(e.to_string()))?;
    if out.len() > limit {
        return Err(Error::TooLarge {
            limit: limit as u64,
        });
    }
    Ok(out)
}

/// Decompresses a bare block frame (as `getBlock` serves it) into its body; decode the rows with
/// [`decode_block`].
pub fn decode_block_frame(frame: &[u8]) -> Result<Vec<u8>> {
    decompress(frame, MAX_BLOCK_BYTES)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(seq: u64, kind: Kind, did: &'static str, payload: &'static [u8]) -> Row<'static> {
        Row {
            seq,
            witnessed_at: seq as i64 * 10,
            indexed_at: 0,
            kind,
            did,
            collection: "app.bsky.feed.post",
            rkey: "3kabc",
            rev: "3krev",
            payload,
        }
    }

    #[test]
    fn encode_decode_round_trip_and_layout() {
        let rows = [
            row(1, Kind::Create, "did:plc:a", b"\xa0"),
            row(2, Kind::Delete, "did:plc:bb", b""),
        ];
        let mut body = Vec::new();
        encode_block(&rows, &mut body).unwrap();
        let var: usize = rows
            .iter()
            .map(|r| {
                r.did.len() + r.collection.len() + r.rkey.len() + r.rev.len() + r.payload.len()
            })
            .sum();
        assert_eq!(body.len(), 4 + 2 * FIXED_ROW_BYTES + var);
        assert_eq!(&body[..4], &2u32.to_le_bytes());
        assert_eq!(decode_block(&body).unwrap(), rows);
        // The kind column sits after three u64 columns.
        assert_eq!(body[4 + 48], 1);
        assert_eq!(body[4 + 49], 3);
    }

    #[test]
    fn empty_block_is_four_zero_bytes() {
        let mut body = Vec::new();
        encode_block(&[], &mut body).unwrap();
        assert_eq!(body, [0, 0, 0, 0]);
        assert!(decode_block(&body).unwrap().is_empty());
        assert!(decode_block(&[0, 0, 0, 0, 0]).is_err());
    }

    #[test]
    fn every_truncation_and_a_bad_kind_are_errors() {
        let rows = [row(7, Kind::Update, "did:plc:x", b"abc")];
        let mut body = Vec::new();
        encode_block(&rows, &mut body).unwrap();
        for cut in 0..body.len() {
            assert!(decode_block(&body[..cut]).is_err(), "cut at {cut}");
        }
        let mut bad = body.clone();
        bad[4 + 24] = 8;
        assert_eq!(
            decode_block(&bad),
            Err(Error::InvalidKind { row: 0, kind: 8 })
        );
        let mut huge = body.clone();
        huge[..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(decode_block(&huge), Err(Error::Block { .. })));
    }

    #[test]
    fn too_long_fields_are_refused() {
        let long = "x".repeat(256);
        let mut r = row(1, Kind::Create, "did:plc:a", b"");
        r.rkey = &long;
        assert!(matches!(
            encode_block(&[r], &mut Vec::new()),
            Err(Error::FieldTooLong { column: "rkey", .. })
        ));
    }

    #[test]
    fn frames_round_trip_and_bombs_and_trailers_are_refused() {
        let rows = [row(1, Kind::Create, "did:plc:a", b"payload")];
        let frame = encode_block_frame(&rows).unwrap();
        let body = decode_block_frame(&frame).unwrap();
        assert_eq!(decode_block(&body).unwrap(), rows);
        assert!(matches!(
            decompress(&frame, body.len() - 1),
            Err(Error::TooLarge { .. })
        ));
        let mut trailing = frame.clone();
        trailing.push(0);
        assert!(matches!(decode_block_frame(&trailing), Err(Error::Zstd(_))));
        assert_eq!(decompress(&frame, usize::MAX).unwrap(), body);
        let zeros = compress(&vec![0u8; 1 << 20]).unwrap();
        assert!(matches!(
            decompress(&zeros, 1 << 10),
            Err(Error::TooLarge { .. })
        ));
    }
}
