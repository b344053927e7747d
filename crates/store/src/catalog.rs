//! The `segments` partition: which sealed segment files the store has, and which generation.
//!
//! Why a module: a segment file is named by an entry before it is served, so that a file left by
//! a crash (in `tmp/`, or renamed without its entry) is never taken for part of the archive; and
//! compaction rewrites files in place, so the entry carries the checksum of the generation it
//! names. Sealing adds entries, compaction replaces them (generation + 1). Layout
//! (`docs/archive.md`): key the segment's index (BE u32), value
//!
//! ```text
//! u64 checksum | u64 min_seq | u64 max_seq | u32 block_count | u32 generation | name (UTF-8)
//! ```
//!
//! all little-endian as the `.jss` header is; the name is `seg_XXXXXXXXXX.jss`, checked again
//! against the key when read.

use fjall::{Batch, Keyspace, PartitionCreateOptions, PartitionHandle};
use riptide_segment::{parse_segment_name, segment_name, Header};

/// Bytes of an entry's value before the name.
const FIXED: usize = 8 + 8 + 8 + 4 + 4;

/// Why the partition could not be read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CatalogError {
    /// An entry is not one this module writes (our own corruption).
    #[error("segments partition: malformed entry {index:?}")]
    Malformed {
        /// The key, if it was an index.
        index: Option<u32>,
    },
    /// fjall failed.
    #[error("segments partition: {0}")]
    Fjall(#[from] fjall::Error),
}

/// One sealed segment as the store knows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentEntry {
    /// The segment's index (its name is [`segment_name`] of it).
    pub index: u32,
    /// The header checksum of the generation the entry names.
    pub checksum: u64,
    /// The header's lowest seq.
    pub min_seq: u64,
    /// The header's highest seq.
    pub max_seq: u64,
    /// Blocks in the file (compaction keeps them all).
    pub block_count: u32,
    /// 0 when sealed, + 1 per compaction that rewrote the file.
    pub generation: u32,
}

impl SegmentEntry {
    /// The entry for a file with `header`, at `generation`.
    pub fn from_header(index: u32, header: &Header, generation: u32) -> SegmentEntry {
        SegmentEntry {
            index,
            checksum: header.checksum,
            min_seq: header.min_seq,
            max_seq: header.max_seq,
            block_count: header.block_count,
            generation,
        }
    }

    /// The file's name, `seg_XXXXXXXXXX.jss`.
    pub fn name(&self) -> String {
        segment_name(u64::from(self.index))
    }

    fn encode(&self) -> Vec<u8> {
        let name = self.name();
        let mut v = Vec::with_capacity(FIXED + name.len());
        for x in [self.checksum, self.min_seq, self.max_seq] {
            v.extend_from_slice(&x.to_le_bytes());
        }
        v.extend_from_slice(&self.block_count.to_le_bytes());
        v.extend_from_slice(&self.generation.to_le_bytes());
        v.extend_from_slice(name.as_bytes());
        v
    }

    fn decode(key: &[u8], v: &[u8]) -> Result<SegmentEntry, CatalogError> {
        let index = <[u8; 4]>::try_from(key).ok().map(u32::from_be_bytes);
        let bad = || CatalogError::Malformed { index };
        let index = index.ok_or_else(bad)?;
        if v.len() < FIXED {
            return Err(bad());
        }
        let u64_at = |o: usize| u64::from_le_bytes(v[o..o + 8].try_into().unwrap_or_default());
        let u32_at = |o: usize| u32::from_le_bytes(v[o..o + 4].try_into().unwrap_or_default());
        let name = std::str::from_utf8(&v[FIXED..]).map_err(|_| bad())?;
        if parse_segment_name(name) != Some(u64::from(index)) {
            return Err(bad());
        }
        Ok(SegmentEntry {
            index,
            checksum: u64_at(0),
            min_seq: u64_at(8),
            max_seq: u64_at(16),
            block_count: u32_at(24),
            generation: u32_at(28),
        })
    }
}

/// The `segments` partition.
#[derive(Clone)]
pub struct Catalog {
    part: PartitionHandle,
}

impl Catalog {
    /// Opens (creating) the partition in `ks`.
    pub fn open(ks: &Keyspace) -> Result<Catalog, CatalogError> {
        Ok(Catalog {
            part: ks.open_partition("segments", PartitionCreateOptions::default())?,
        })
    }

    /// Every entry, in index order.
    pub fn entries(&self) -> Result<Vec<SegmentEntry>, CatalogError> {
        self.part
            .iter()
            .map(|kv| {
                let (k, v) = kv?;
                SegmentEntry::decode(&k, &v)
            })
            .collect()
    }

    /// The newest entry (the highest index), if any.
    pub fn newest(&self) -> Result<Option<SegmentEntry>, CatalogError> {
        match self.part.last_key_value()? {
            Some((k, v)) => SegmentEntry::decode(&k, &v).map(Some),
            None => Ok(None),
        }
    }

    /// The live floor for a retention floor (`--retention`'s, the first seq inside the window):
    /// never above the first seq of the newest sealed segment (`docs/archive.md`, "Retention"),
    /// so that a client that planned the archive up to `sealedTipSeq` can always join the live
    /// stream where the plan ends. Below it `subscribeEvents` answers `CursorTooOld`: plan from
    /// the archive first. It deletes nothing (the rows are in the segments); it is for a store
    /// whose reads go through the sealed segments, which is what makes the seqs between this and
    /// the retention floor servable live.
    pub fn live_floor(&self, retention_floor: u64) -> Result<u64, CatalogError> {
        Ok(match self.newest()? {
            Some(e) => retention_floor.min(e.min_seq),
            None => retention_floor,
        })
    }

    /// Writes `entry` in `batch` (adding or replacing the segment's entry).
    pub fn put(&self, batch: &mut Batch, entry: &SegmentEntry) {
        batch.insert(&self.part, entry.index.to_be_bytes(), entry.encode());
    }
}

impl std::fmt::Debug for Catalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Catalog").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_in_index_order_and_bad_ones_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let ks = fjall::Config::new(dir.path()).open().unwrap();
        let c = Catalog::open(&ks).unwrap();
        assert_eq!((c.newest().unwrap(), c.live_floor(7).unwrap()), (None, 7));
        let e = |index, generation| SegmentEntry {
            index,
            checksum: 0xfeed_0000 + u64::from(index),
            min_seq: 10 * u64::from(index),
            max_seq: 10 * u64::from(index) + 9,
            block_count: 3,
            generation,
        };
        let mut b = ks.batch();
        c.put(&mut b, &e(300, 0));
        c.put(&mut b, &e(2, 0));
        c.put(&mut b, &e(2, 1));
        b.commit().unwrap();
        assert_eq!(c.entries().unwrap(), [e(2, 1), e(300, 0)]);
        assert_eq!(c.newest().unwrap(), Some(e(300, 0)));
        // The live floor never rises above the newest segment's first seq (3000).
        assert_eq!(c.live_floor(10).unwrap(), 10);
        assert_eq!(c.live_floor(3000).unwrap(), 3000);
        assert_eq!(c.live_floor(5000).unwrap(), 3000);
        assert_eq!(e(300, 0).name(), "seg_000000008c.jss");

        // A value whose name is another segment's is refused.
        let mut v = e(2, 0).encode();
        let at = v.len() - 5;
        v[at] = b'9';
        c.part.insert(2u32.to_be_bytes(), v).unwrap();
        assert!(matches!(
            c.entries(),
            Err(CatalogError::Malformed { index: Some(2) })
        ));
    }
}
