//! Compaction: folding the sealed segment files with the tombstones written since the last pass.
//!
//! Why a module: the archive holds the whole network only if superseded history leaves it, and
//! a fold that rewrites files in place must survive `kill -9` at every step without a half-written
//! segment ever being named by the store. A pass ([`Folder::pass`]), as `docs/archive.md`
//! ("Folding", "Crash-safety points") says:
//!
//! 1. the target is the highest seq of the newest sealed segment; nothing to do if
//!    `meta.compaction_seq` has reached it;
//! 2. the tombstones above `compaction_seq` are read into memory ([`Tombstones::above`]);
//! 3. each segment is skipped unless one of their DIDs passes its DID bloom, and within it only
//!    the blocks whose bloom passes one are decompressed;
//! 4. a segment with rows to drop is rewritten into `segments/tmp/seg_N.jss.compact`
//!    ([`Compaction`]: block topology, envelopes and header bounds kept), fsynced, its header
//!    written last and fsynced, renamed over the old file, the directory fsynced;
//! 5. one fjall batch (`SyncAll`) replaces its `segments` entry: new checksum, generation + 1;
//! 6. after the last file, `compaction_seq` = the target (`SyncAll`).
//!
//! Rewriting is idempotent (a segment already folded with these tombstones has nothing to drop),
//! so a crash anywhere before step 6 costs a repeat of the pass and nothing else. At open,
//! [`Folder::recover`] removes this module's files from `tmp/` (the old generation is still in
//! place) and refreshes an entry whose file was renamed over before its batch (the new file is
//! self-describing and verified first; either generation is a valid fold). [`CrashPoint`] names
//! the steps for tests ([`Folder::crash_at`]).
//!
//! A segment is read whole into memory to be rewritten (at most `--segment-bytes`, 256 MiB by
//! default, one at a time); the output is written as it is made.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use fjall::{Keyspace, PartitionCreateOptions, PartitionHandle, PersistMode};
use riptide_segment::{Compaction, Header, Segment, HEADER_BYTES};

use crate::catalog::{Catalog, CatalogError, SegmentEntry};
use crate::tombstones::{TombstoneError, Tombstones};

/// The `meta` key of the highest seq every sealed row up to which has been folded (BE u64).
pub const COMPACTION_SEQ: &[u8] = b"compaction_seq";

/// The suffix of a compaction's file in `segments/tmp/`.
const TMP_SUFFIX: &str = ".compact";

/// The steps of a pass after which a crash leaves a distinct state on disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CrashPoint {
    /// The new generation is complete in `tmp/`; the old file and entry are untouched.
    TmpWritten,
    /// The new generation is renamed over the old file; its entry still names the old one.
    Renamed,
    /// The entry names the new generation; `compaction_seq` has not advanced.
    EntryUpdated,
}

/// Why a pass or a recovery failed. Nothing is half-done by a failure: see the module docs.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CompactError {
    /// Reading the tombstones failed.
    #[error(transparent)]
    Tombstones(#[from] TombstoneError),
    /// Reading or writing the `segments` entries failed.
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    /// fjall failed (`meta`, a batch, a persist).
    #[error("compaction: {0}")]
    Fjall(#[from] fjall::Error),
    /// A file operation failed.
    #[error("compaction: {path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A segment named by an entry does not verify, or could not be rewritten.
    #[error("compaction: {name}: {source}")]
    Segment {
        /// The segment's file name.
        name: String,
        /// Why.
        source: riptide_segment::Error,
    },
    /// The compaction thread could not be started.
    #[error("compaction: starting its thread: {0}")]
    Thread(std::io::Error),
    /// A test's crash point was reached ([`Folder::crash_at`]).
    #[error("compaction: stopped at {0:?} (test crash point)")]
    Crashed(CrashPoint),
}

/// What a pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pass {
    /// `compaction_seq` before the pass.
    pub from_seq: u64,
    /// `compaction_seq` after it (unchanged when there was nothing to fold).
    pub to_seq: u64,
    /// Tombstones applied.
    pub tombstones: usize,
    /// Segments looked at.
    pub segments: usize,
    /// Segments skipped by their DID bloom (or whose rows are all above every tombstone).
    pub skipped: usize,
    /// Rows dropped.
    pub rows_dropped: u64,
    /// Blocks rewritten (the other blocks of a rewritten file keep their frames).
    pub blocks_rewritten: usize,
    /// The entries of the files rewritten, as now recorded; the server re-reads these
    /// (`SealedSegments::add`).
    pub rewritten: Vec<SegmentEntry>,
}

/// What [`Folder::recover`] found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recovered {
    /// Unfinished compaction files removed from `tmp/`.
    pub tmp_removed: usize,
    /// Entries refreshed from a file renamed into place before its entry was written.
    pub refreshed: Vec<SegmentEntry>,
}

type Hook = Box<dyn Fn(CrashPoint, u32) -> bool + Send + Sync>;

/// Folds the store's sealed segments: the `tombstones`, `segments` and `meta` partitions of one
/// keyspace and the `segments/` directory beside it. One at a time (the store runs it on a
/// thread of its own, never on the ingest thread).
pub struct Folder {
    ks: Keyspace,
    dir: PathBuf,
    tombstones: Tombstones,
    catalog: Catalog,
    meta: PartitionHandle,
    crash: Option<Hook>,
}

impl std::fmt::Debug for Folder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Folder")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CompactError + '_ {
    move |source| CompactError::Io {
        path: path.to_owned(),
        source,
    }
}

/// fsyncs a directory, so that a rename in it is durable.
fn sync_dir(dir: &Path) -> Result<(), CompactError> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(io(dir))
}

impl Folder {
    /// A folder over `ks`'s partitions and the segment files in `segments_dir`.
    pub fn new(ks: &Keyspace, segments_dir: &Path) -> Result<Folder, CompactError> {
        Ok(Folder {
            ks: ks.clone(),
            dir: segments_dir.to_owned(),
            tombstones: Tombstones::open(ks)?,
            catalog: Catalog::open(ks)?,
            meta: ks.open_partition("meta", PartitionCreateOptions::default())?,
            crash: None,
        })
    }

    /// Test hook: `stop(point, segment index)` returning true ends the pass there with
    /// [`CompactError::Crashed`], leaving the disk as a `kill -9` at that point would.
    pub fn crash_at(&mut self, stop: impl Fn(CrashPoint, u32) -> bool + Send + Sync + 'static) {
        self.crash = Some(Box::new(stop));
    }

    fn crash(&self, point: CrashPoint, index: u32) -> Result<(), CompactError> {
        match &self.crash {
            Some(stop) if stop(point, index) => Err(CompactError::Crashed(point)),
            _ => Ok(()),
        }
    }

    /// The tombstones partition (the ingest batch writes through it).
    pub fn tombstones(&self) -> &Tombstones {
        &self.tombstones
    }

    /// The directory of the segment files.
    pub fn segments_dir(&self) -> &Path {
        &self.dir
    }

    /// The segments partition.
    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    /// `meta.compaction_seq` (0 before the first pass).
    pub fn compaction_seq(&self) -> Result<u64, CompactError> {
        Ok(self
            .meta
            .get(COMPACTION_SEQ)?
            .and_then(|v| <[u8; 8]>::try_from(&v[..]).ok())
            .map_or(0, u64::from_be_bytes))
    }

    fn path(&self, e: &SegmentEntry) -> PathBuf {
        self.dir.join(e.name())
    }

    fn tmp_path(&self, e: &SegmentEntry) -> PathBuf {
        self.dir.join("tmp").join(e.name() + TMP_SUFFIX)
    }

    /// At open, before any pass: removes unfinished compaction files from `tmp/` and refreshes
    /// each entry whose file was renamed over before its entry was written (after checking the
    /// whole file, checksum included; a file that fails is an error, its entry kept).
    pub fn recover(&self) -> Result<Recovered, CompactError> {
        let mut out = Recovered::default();
        let tmp = self.dir.join("tmp");
        if let Ok(list) = std::fs::read_dir(&tmp) {
            for f in list {
                let f = f.map_err(io(&tmp))?;
                if f.file_name().to_string_lossy().ends_with(TMP_SUFFIX) {
                    std::fs::remove_file(f.path()).map_err(io(&f.path()))?;
                    out.tmp_removed += 1;
                }
            }
        }
        let mut batch = self.ks.batch().durability(Some(PersistMode::SyncAll));
        for e in self.catalog.entries()? {
            let path = self.path(&e);
            let mut head = [0u8; HEADER_BYTES];
            File::open(&path)
                .and_then(|mut f| f.read_exact(&mut head))
                .map_err(io(&path))?;
            let segment = |source| CompactError::Segment {
                name: e.name(),
                source,
            };
            if Header::parse(&head).map_err(segment)?.checksum == e.checksum {
                continue;
            }
            let bytes = std::fs::read(&path).map_err(io(&path))?;
            let seg = Segment::open(&bytes).map_err(segment)?;
            let fresh = SegmentEntry::from_header(e.index, seg.header(), e.generation + 1);
            tracing::warn!(
                segment = %e.name(),
                generation = fresh.generation,
                "compaction: a segment was renamed into place before its entry; entry refreshed"
            );
            self.catalog.put(&mut batch, &fresh);
            out.refreshed.push(fresh);
        }
        batch.commit()?;
        Ok(out)
    }

    /// One compaction pass (module docs).
    pub fn pass(&self) -> Result<Pass, CompactError> {
        let from_seq = self.compaction_seq()?;
        let mut pass = Pass {
            from_seq,
            to_seq: from_seq,
            ..Pass::default()
        };
        let entries = self.catalog.entries()?;
        let Some(target) = entries.last().map(|e| e.max_seq) else {
            return Ok(pass);
        };
        if target <= from_seq {
            return Ok(pass);
        }
        let snap = self.tombstones.above(from_seq)?;
        pass.tombstones = snap.len();
        let dids = snap.dids();
        for e in &entries {
            if snap.is_empty() {
                break;
            }
            pass.segments += 1;
            let path = self.path(e);
            let bytes = std::fs::read(&path).map_err(io(&path))?;
            let segment = |source| CompactError::Segment {
                name: e.name(),
                source,
            };
            let seg = Segment::open(&bytes).map_err(segment)?;
            // Blocks that may hold a row of a DID with a tombstone above the block's first seq.
            let mut candidate = vec![false; seg.blocks().len()];
            for &(key, top) in &dids {
                if top <= seg.header().min_seq {
                    continue;
                }
                for i in seg.blocks_with_key(key) {
                    candidate[i] |= seg.blocks()[i].min_seq < top;
                }
            }
            if !candidate.contains(&true) {
                pass.skipped += 1;
                continue;
            }
            let plan = Compaction::plan(&seg, |i| candidate[i], |r| snap.supersedes(r))
                .map_err(segment)?;
            let Some(plan) = plan else {
                continue;
            };
            pass.rows_dropped += plan.dropped();
            pass.blocks_rewritten += plan.blocks_rewritten();
            let header = self.write_tmp(e, plan)?;
            self.crash(CrashPoint::TmpWritten, e.index)?;
            std::fs::rename(self.tmp_path(e), &path).map_err(io(&path))?;
            sync_dir(&self.dir)?;
            self.crash(CrashPoint::Renamed, e.index)?;
            let fresh = SegmentEntry::from_header(e.index, &header, e.generation + 1);
            let mut batch = self.ks.batch().durability(Some(PersistMode::SyncAll));
            self.catalog.put(&mut batch, &fresh);
            batch.commit()?;
            self.crash(CrashPoint::EntryUpdated, e.index)?;
            pass.rewritten.push(fresh);
        }
        let mut batch = self.ks.batch().durability(Some(PersistMode::SyncAll));
        batch.insert(&self.meta, COMPACTION_SEQ, target.to_be_bytes());
        batch.commit()?;
        pass.to_seq = target;
        tracing::info!(
            compaction_seq = target,
            tombstones = pass.tombstones,
            segments = pass.segments,
            skipped = pass.skipped,
            rewritten = pass.rewritten.len(),
            rows_dropped = pass.rows_dropped,
            "compaction pass done"
        );
        Ok(pass)
    }

    /// Writes the rewritten segment to `tmp/`: zeros, blocks, footer, fsync, header, fsync.
    fn write_tmp(
        &self,
        e: &SegmentEntry,
        mut plan: Compaction<'_, '_>,
    ) -> Result<Header, CompactError> {
        let tmp = self.dir.join("tmp");
        std::fs::create_dir_all(&tmp).map_err(io(&tmp))?;
        let path = self.tmp_path(e);
        let segment = |source| CompactError::Segment {
            name: e.name(),
            source,
        };
        let mut f = File::create(&path).map_err(io(&path))?;
        let mut buf = vec![0u8; HEADER_BYTES];
        loop {
            f.write_all(&buf).map_err(io(&path))?;
            buf.clear();
            if !plan.next_block(&mut buf).map_err(segment)? {
                break;
            }
        }
        let sealed = plan.finish().map_err(segment)?;
        f.write_all(&sealed.footer).map_err(io(&path))?;
        f.sync_all().map_err(io(&path))?;
        f.seek(SeekFrom::Start(0)).map_err(io(&path))?;
        f.write_all(&sealed.header).map_err(io(&path))?;
        f.sync_all().map_err(io(&path))?;
        sync_dir(&tmp)?;
        Ok(sealed.parsed)
    }
}
