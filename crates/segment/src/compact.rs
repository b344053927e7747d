//! Folding one sealed segment: the rows that later events superseded dropped, block topology kept.
//!
//! Why a module: the archive must stay bounded (issue 38), and a v2 client cannot tell a folded
//! segment from Jetstream's only if the rewrite keeps what Jetstream's `segment/rewrite.go` keeps:
//! every block, in order, under its original index entry's seq and time envelope (an emptied
//! block stays, `event_count = 0`, a `u32` 0 as its body), the frames of untouched blocks byte for
//! byte, and so the header's bounds. Which rows go is the caller's (the store's tombstones); that
//! only create, update and create-resync rows can go is the format's rule, kept here: delete,
//! identity, account and sync rows are what mid-stream clients and the sentinels need. No I/O:
//! [`Compaction::next_block`] hands back the bytes to append, [`Compaction::finish`] the footer
//! and header, in the crash-safe order of [`SegmentWriter`].

use crate::block::Row;
use crate::error::{Error, Result};
use crate::segment::Segment;
use crate::writer::{Sealed, SegmentWriter};

/// A planned rewrite of one segment; emit its blocks in order, then [`Compaction::finish`].
#[derive(Debug)]
pub struct Compaction<'s, 'a> {
    seg: &'s Segment<'a>,
    /// Per block: `None` kept as it is, `Some(rows kept)` rewritten.
    plan: Vec<Option<Vec<usize>>>,
    next: usize,
    writer: SegmentWriter,
    dropped: u64,
}

impl<'s, 'a> Compaction<'s, 'a> {
    /// Decides the rewrite: `candidate(i)` says whether block `i` may hold a row to drop (a
    /// bloom test: a block it refuses is not decompressed), `drop(row)` whether a create, update
    /// or create-resync row is superseded (it is never asked of other kinds). `None` when no row
    /// goes: the file stays as it is, which makes a second pass with the same tombstones a no-op.
    pub fn plan(
        seg: &'s Segment<'a>,
        mut candidate: impl FnMut(usize) -> bool,
        mut drop: impl FnMut(&Row<'_>) -> bool,
    ) -> Result<Option<Compaction<'s, 'a>>> {
        let mut plan = Vec::with_capacity(seg.blocks().len());
        let mut dropped = 0u64;
        for i in 0..seg.blocks().len() {
            if seg.blocks()[i].event_count == 0 || !candidate(i) {
                plan.push(None);
                continue;
            }
            let body = seg.block_body(i)?;
            let rows = seg.rows(i, &body)?;
            let kept: Vec<usize> = (0..rows.len())
                .filter(|&j| !(rows[j].kind.carries_record() && drop(&rows[j])))
                .collect();
            if kept.len() == rows.len() {
                plan.push(None);
            } else {
                dropped += (rows.len() - kept.len()) as u64;
                plan.push(Some(kept));
            }
        }
        Ok((dropped > 0).then(|| Compaction {
            seg,
            plan,
            next: 0,
            writer: SegmentWriter::new(),
            dropped,
        }))
    }

    /// Rows the rewrite drops.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Blocks rewritten (the others keep their frames).
    pub fn blocks_rewritten(&self) -> usize {
        self.plan.iter().filter(|p| p.is_some()).count()
    }

    /// Appends the next block's bytes (`u64` length, frame) to `out`, after the 256 header bytes
    /// the caller wrote first; `false` once every block has been emitted.
    pub fn next_block(&mut self, out: &mut Vec<u8>) -> Result<bool> {
        let i = self.next;
        let Some(step) = self.plan.get(i) else {
            return Ok(false);
        };
        let original = self.seg.blocks()[i];
        match step {
            None => self
                .writer
                .append_kept(self.seg.block_frame(i)?, &original, out)?,
            Some(kept) => {
                let body = self.seg.block_body(i)?;
                let rows = self.seg.rows(i, &body)?;
                let survivors: Vec<Row<'_>> = kept.iter().map(|&j| rows[j]).collect();
                self.writer.append_compacted(&survivors, &original, out)?;
            }
        }
        self.next += 1;
        Ok(true)
    }

    /// The footer and header of the rewritten segment, once every block has been emitted.
    pub fn finish(self) -> Result<Sealed> {
        if self.next != self.plan.len() {
            return Err(Error::BlockMismatch {
                block: self.next,
                reason: format!(
                    "compaction finished after {} of {} blocks",
                    self.next,
                    self.plan.len()
                ),
            });
        }
        self.writer.finish()
    }
}

/// Folds a whole segment in memory (tests, small files): the new file, or `None` if no row goes.
pub fn compact_segment(
    seg: &Segment<'_>,
    drop: impl FnMut(&Row<'_>) -> bool,
) -> Result<Option<Vec<u8>>> {
    let Some(mut c) = Compaction::plan(seg, |_| true, drop)? else {
        return Ok(None);
    };
    let mut file = vec![0u8; crate::header::HEADER_BYTES];
    while c.next_block(&mut file)? {}
    let sealed = c.finish()?;
    file.extend_from_slice(&sealed.footer);
    file[..crate::header::HEADER_BYTES].copy_from_slice(&sealed.header);
    Ok(Some(file))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kind::Kind;
    use crate::writer::write_segment;

    fn row(seq: u64, kind: Kind, rkey: &'static str) -> Row<'static> {
        Row {
            seq,
            witnessed_at: 1_000 + seq as i64,
            indexed_at: 0,
            kind,
            did: "did:plc:a",
            collection: "app.bsky.feed.post",
            rkey,
            rev: "r",
            payload: if kind.carries_record() { b"\xa0" } else { b"" },
        }
    }

    #[test]
    fn only_record_rows_are_offered_and_a_second_pass_changes_nothing() {
        let blocks: [&[Row<'_>]; 2] = [
            &[
                row(1, Kind::Create, "x"),
                row(2, Kind::Update, "x"),
                row(3, Kind::Identity, ""),
            ],
            &[row(4, Kind::Delete, "x"), row(5, Kind::Create, "y")],
        ];
        let file = write_segment(&blocks).unwrap();
        let seg = Segment::open(&file).unwrap();
        let mut asked = Vec::new();
        // A delete of x at seq 4 supersedes every earlier row of x.
        let superseded = |r: &Row<'_>| r.rkey == "x" && r.seq < 4;
        let c = Compaction::plan(
            &seg,
            |_| true,
            |r| {
                asked.push(r.seq);
                superseded(r)
            },
        )
        .unwrap()
        .unwrap();
        assert_eq!(asked, [1, 2, 5]);
        assert_eq!((c.dropped(), c.blocks_rewritten()), (2, 1));

        let folded = compact_segment(&seg, superseded).unwrap().unwrap();
        let f = Segment::open(&folded).unwrap();
        assert_eq!(f.header().min_seq, 1);
        assert_eq!(f.header().event_count, 3);
        // The untouched block's frame is byte for byte the original's.
        assert_eq!(f.block_frame(1).unwrap(), seg.block_frame(1).unwrap());
        assert_eq!(f.blocks()[0].min_seq, 1);
        assert!(compact_segment(&f, superseded).unwrap().is_none());
    }

    #[test]
    fn an_emptied_block_stays_and_a_later_pass_keeps_its_envelope() {
        let blocks: [&[Row<'_>]; 3] = [
            &[row(1, Kind::Create, "x"), row(2, Kind::Create, "y")],
            &[row(3, Kind::Create, "z")],
            &[row(4, Kind::Delete, "x"), row(5, Kind::Delete, "y")],
        ];
        let file = write_segment(&blocks).unwrap();
        let seg = Segment::open(&file).unwrap();
        let once = compact_segment(&seg, |r| r.rkey != "z").unwrap().unwrap();
        let once = Segment::open(&once).unwrap();
        assert_eq!(once.blocks()[0].event_count, 0);
        assert_eq!(once.block_body(0).unwrap(), [0, 0, 0, 0]);
        // A second pass drops z: block 0 (empty) is carried, not refused, under (1, 2).
        let twice = compact_segment(&once, |r| r.rkey == "z").unwrap().unwrap();
        let twice = Segment::open(&twice).unwrap();
        let b = twice.blocks();
        assert_eq!((b[0].min_seq, b[0].max_seq, b[0].event_count), (1, 2, 0));
        assert_eq!((b[1].min_seq, b[1].max_seq, b[1].event_count), (3, 3, 0));
        assert_eq!(
            (twice.header().min_seq, twice.header().max_seq),
            (seg.header().min_seq, seg.header().max_seq)
        );
        assert_eq!(twice.header().event_count, 2);
    }

    #[test]
    fn finishing_early_is_an_error() {
        let file =
            write_segment(&[&[row(1, Kind::Create, "x")], &[row(2, Kind::Create, "y")]]).unwrap();
        let seg = Segment::open(&file).unwrap();
        let mut c = Compaction::plan(&seg, |_| true, |r| r.rkey == "x")
            .unwrap()
            .unwrap();
        c.next_block(&mut Vec::new()).unwrap();
        assert!(matches!(c.finish(), Err(Error::BlockMismatch { .. })));
    }
}
