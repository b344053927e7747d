//! Downloaded archive bytes → the events a request names, each checked.
//!
//! Why a module: this is the reader's CPU work and the part a benchmark measures, kept apart from
//! the HTTP so that it runs the same on a file read from disk. A whole segment is opened with
//! [`Segment::open`] (header, footer and checksum verified; every block checked against its index
//! entry), a `getBlock` frame with [`decode_block_frame`]. Each kept row's payload must be one
//! strict DAG-CBOR value (a record as the account signed it, or the upstream event of an
//! identity, account or sync row), and a record's CID is computed from it (CIDv1, dag-cbor,
//! sha-256), as the live wire's `cid` is. A row that fails is not delivered: it is counted
//! ([`super::ArchiveStats::rows_rejected`]) and logged; a file or frame that fails is an error.

use riptide_cbor::{Arena, CidBuf, Options, DAG_CBOR};
use riptide_segment::{decode_block, decode_block_frame, Kind, OwnedRow, Row, Segment};

use super::filter::RowFilter;
use super::ArchiveError;

/// One archived event: the row as stored, and its record's CID.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArchiveEvent {
    /// The row (seq, times, kind, DID, collection, rkey, rev, payload).
    pub row: OwnedRow,
    /// The record's CID, for rows that carry a record (create, update, create-resync).
    pub cid: Option<CidBuf>,
}

impl ArchiveEvent {
    /// The event's seq.
    pub fn seq(&self) -> u64 {
        self.row.seq
    }
}

/// Decodes and checks rows; keeps its CBOR arena between rows.
#[derive(Debug)]
pub struct RowDecoder {
    arena: Arena,
    opts: Options,
    /// Rows whose payload failed its check.
    pub rejected: u64,
}

impl Default for RowDecoder {
    fn default() -> Self {
        RowDecoder {
            arena: Arena::new(),
            opts: Options::strict(),
            rejected: 0,
        }
    }
}

impl RowDecoder {
    /// A decoder.
    pub fn new() -> RowDecoder {
        RowDecoder::default()
    }

    /// Checks one row; its CID when it carries a record.
    fn check(&mut self, r: &Row<'_>) -> Result<Option<CidBuf>, String> {
        if r.kind == Kind::Delete {
            return Ok(None);
        }
        let mut tape = self.arena.tape(r.payload);
        tape.decode(0..r.payload.len(), &self.opts)
            .map_err(|e| format!("payload is not DAG-CBOR: {e}"))?;
        Ok(r.kind
            .carries_record()
            .then(|| CidBuf::sha256(DAG_CBOR, r.payload)))
    }

    fn keep(&mut self, rows: &[Row<'_>], filter: &RowFilter, out: &mut Vec<ArchiveEvent>) {
        for r in rows {
            if !filter.matches(r) {
                continue;
            }
            match self.check(r) {
                Ok(cid) => out.push(ArchiveEvent {
                    row: r.to_owned_row(),
                    cid,
                }),
                Err(e) => {
                    self.rejected += 1;
                    tracing::warn!(seq = r.seq, did = r.did, "archive row rejected: {e}");
                }
            }
        }
    }

    /// A whole `.jss` file's rows that `filter` names, in order.
    pub(crate) fn segment(
        &mut self,
        name: &str,
        bytes: &[u8],
        filter: &RowFilter,
        out: &mut Vec<ArchiveEvent>,
    ) -> Result<(), ArchiveError> {
        let corrupt = |e: riptide_segment::Error| ArchiveError::Corrupt(format!("{name}: {e}"));
        let seg = Segment::open(bytes).map_err(corrupt)?;
        for (i, b) in seg.blocks().iter().enumerate() {
            if b.event_count == 0 || !filter.overlaps(b.min_seq, b.max_seq) {
                continue;
            }
            self.segment_block(name, &seg, i, filter, out)?;
        }
        Ok(())
    }

    fn segment_block(
        &mut self,
        name: &str,
        seg: &Segment<'_>,
        i: usize,
        filter: &RowFilter,
        out: &mut Vec<ArchiveEvent>,
    ) -> Result<(), ArchiveError> {
        let corrupt = |e: riptide_segment::Error| ArchiveError::Corrupt(format!("{name}: {e}"));
        let body = seg.block_body(i).map_err(corrupt)?;
        let rows = seg.rows(i, &body).map_err(corrupt)?;
        self.keep(&rows, filter, out);
        Ok(())
    }

    /// Every row of block `i` of an opened segment, checked (no filter): for a reader that hands
    /// a large file's events over block by block (the Python binding's `read_segment`).
    pub fn decode_segment_block(
        &mut self,
        seg: &Segment<'_>,
        i: usize,
        out: &mut Vec<ArchiveEvent>,
    ) -> Result<(), ArchiveError> {
        self.segment_block("segment", seg, i, &RowFilter::default(), out)
    }

    /// A bare block frame's (`getBlock`) rows that `filter` names, in order.
    pub(crate) fn block(
        &mut self,
        what: &str,
        frame: &[u8],
        filter: &RowFilter,
        out: &mut Vec<ArchiveEvent>,
    ) -> Result<(), ArchiveError> {
        let corrupt = |e: riptide_segment::Error| ArchiveError::Corrupt(format!("{what}: {e}"));
        let body = decode_block_frame(frame).map_err(corrupt)?;
        let rows = decode_block(&body).map_err(corrupt)?;
        self.keep(&rows, filter, out);
        Ok(())
    }

    /// Every row of a whole `.jss` file, checked (no filter): what the benchmark measures.
    pub fn decode_segment(
        &mut self,
        bytes: &[u8],
        out: &mut Vec<ArchiveEvent>,
    ) -> Result<(), ArchiveError> {
        self.segment("segment", bytes, &RowFilter::default(), out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use riptide_segment::write_segment;

    fn row(seq: u64, kind: Kind, payload: &'static [u8]) -> Row<'static> {
        Row {
            seq,
            witnessed_at: 1,
            indexed_at: 0,
            kind,
            did: "did:plc:aaaa",
            collection: "app.bsky.feed.like",
            rkey: "3k",
            rev: "3l",
            payload,
        }
    }

    #[test]
    fn cids_are_computed_and_bad_payloads_counted_not_delivered() {
        // {"a": 1} in DAG-CBOR; its CID computed independently with sha2 below.
        let good: &[u8] = &[0xa1, 0x61, b'a', 0x01];
        let rows = [
            row(1, Kind::Create, good),
            row(2, Kind::Create, &[0xa1, 0x61]), // truncated
            row(3, Kind::Delete, &[]),
            row(4, Kind::Identity, &[0xff]), // not CBOR
            row(5, Kind::CreateResync, good),
        ];
        let file = write_segment(&[&rows[..3], &rows[3..]]).unwrap();
        let mut d = RowDecoder::new();
        let mut out = Vec::new();
        d.decode_segment(&file, &mut out).unwrap();
        assert_eq!(out.iter().map(|e| e.seq()).collect::<Vec<_>>(), [1, 3, 5]);
        assert_eq!(d.rejected, 2);
        use sha2::Digest;
        let digest = sha2::Sha256::digest(good);
        let mut want = vec![0x01, 0x71, 0x12, 0x20];
        want.extend_from_slice(&digest);
        assert_eq!(out[0].cid.unwrap().as_bytes(), want.as_slice());
        assert_eq!(out[1].cid, None);
        assert_eq!(out[2].cid, out[0].cid);

        // Block by block: the same events, in order.
        let seg = Segment::open(&file).unwrap();
        let mut d2 = RowDecoder::new();
        let mut by_block = Vec::new();
        for i in 0..seg.blocks().len() {
            d2.decode_segment_block(&seg, i, &mut by_block).unwrap();
        }
        assert_eq!(by_block, out);
        assert_eq!(d2.rejected, 2);

        // A damaged file is an error, not rows.
        let mut bad = file.clone();
        bad[300] ^= 0xff;
        let mut out = Vec::new();
        assert!(matches!(
            d.decode_segment(&bad, &mut out),
            Err(ArchiveError::Corrupt(_))
        ));
    }
}
