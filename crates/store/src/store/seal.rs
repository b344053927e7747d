//! Sealing: the row blocks in `blocks` become a `.jss` segment file, and old seqs are read back
//! from those files (`docs/archive.md`, "Sealing: live blocks become a segment").
//!
//! Why a module: the archive (`getSegment`, `getBlock`, `planSnapshot`) serves files, and the
//! store must not keep a second copy of what it sealed, so once the row blocks above the newest
//! segment hold [`StoreOptions::segment_bytes`] they move into `DIR/segments/seg_N.jss`
//! ([`Store::seal_segments`]) and replays of their seqs, on both wires, read them from there
//! (`Store::load_block` → [`Store::segment_block`]): the segment's block index finds the frame,
//! which is rendered once into the block cache as a row block is. A seal never runs on the
//! ingest thread: the server calls it from a background task (`serve`'s seal loop), one at a
//! time, and it only reads what ingest's batches made durable.
//!
//! **The seal** (one segment): the first run of consecutive row blocks above the newest segment,
//! up to `segment_bytes`, goes frame by frame as it is (no recompression;
//! `SegmentWriter::append_frame` decodes each once more, which checks it) into
//! `segments/tmp/seg_N.jss` after 256 zero bytes, then the footer; fsync; the header at offset 0
//! (its checksum makes the file sealed); fsync; rename to `segments/seg_N.jss`; fsync of the
//! directory; the file joins the in-memory index readers use; then ONE durable fjall batch writes
//! the `segments` entry and removes the blocks it covers. Readers find a seq in `blocks` or in a
//! file at every instant (the file is readable before its blocks leave). `N` is the newest entry's
//! index + 1 (0 first), named as Jetstream names files (`seg_` + 10 base-36 digits).
//!
//! **JSON blocks** (sealed by a writer that hands no rows: the Kafka follower, a layout-4
//! directory, a batch with a key too long for a row) cannot go into a segment. A run stops at
//! one: the row blocks before it are sealed as a smaller segment, and the JSON block stays in
//! `blocks`, below the segments that follow it, read from there by seq as before (nothing lost or
//! reordered: a read takes the block holding the seq, or the first after it, from either place).
//! The archive does not list its events (they have no rows). A damaged row block (its checksum)
//! also stops a run and stays where it is, skipped by readers as before.
//!
//! **Crash points** ([`SealPoint`]; `docs/archive.md`'s table), undone or finished at open by
//! [`Store::open_segments`]: a file in `tmp/` is deleted; a file renamed into `segments/` with no
//! entry is adopted if it verifies (checksum included) and its blocks are exactly the row blocks
//! in `blocks` that follow the newest entry (same first seqs, counts and frames), in one batch as
//! a seal would have done, else deleted (its blocks are all still in `blocks`); once the batch is
//! committed the seal is done. A file no entry names whose first seq is not where the unsealed
//! row blocks start is not a seal's (a file copied in, `riptide corpus segments`' fixtures): it
//! is left alone and not read by the store (the server's archive serves it, `serve`), and a seal
//! takes an index past every file in the directory, so it is never overwritten. A file named by an entry that is missing or fails verification at
//! open is logged at error, its blocks counted as corrupt (`/metrics`), and its seqs not served.
//!
//! **Space.** `blocks` is a FIFO partition that never merges, so the removed blocks' bytes would
//! stay on disk until retention's time-to-live dropped their files, which a sealing store no
//! longer runs on `blocks` (an unsealed block must not expire: the archive keeps everything).
//! So each seal ends with a major compaction of `blocks` (what is on disk: removals still in
//! the memtable are merged by a later seal, once flushed): what is left (the blocks above the
//! segment, and any JSON block) is rewritten and the removed values are dropped. A small test
//! (`seal.rs`) kept 80 KB in `blocks` after sealing 118 KB of rows (most removals flushed after
//! the last merge), and flushing the memtable inside the seal (`rotate_memtable_and_wait`) hung
//! the crash-point tests; over 800,000 events sealed into 64 segments `blocks` stayed between 0
//! and 7.9 MB on disk, never growing (`examples/fold_disk.rs`; `docs/archive.md`, "Folding").
//!
//! **Folded blocks.** A block rewritten by folding (`crate::compact`) keeps its index entry's
//! seq bounds and only the rows that survived, so its seqs have gaps, and a block whose rows were
//! all superseded is listed with no events. A reader finds a block by its bounds
//! ([`SegmentBlock::holds`]), the event by seq inside it (a cursor in a gap starts at the next
//! event present), and skips emptied blocks; the rows are checked against the entry (increasing,
//! within its bounds, as many as it says: `crate::rows::render_rows`), so damage is still found.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use fjall::{PersistMode, Slice};
use riptide_segment::{
    parse_segment_name, segment_name, BlockInfo, Header, Segment, SegmentMeta, SegmentWriter,
    HEADER_BYTES,
};

use super::*;
use crate::catalog::SegmentEntry;

/// A step of a seal after which a crash leaves a distinct state on disk (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SealPoint {
    /// The file is complete in `segments/tmp/`; nothing else changed.
    TmpWritten,
    /// The file is renamed into `segments/`; no entry names it, its blocks are in `blocks`.
    Renamed,
    /// The entry is written and the blocks removed: the seal is done.
    Committed,
}

type Hook = Arc<dyn Fn(SealPoint, u32) -> bool + Send + Sync>;

/// The sealer's lock and the tests' crash hook.
#[derive(Default)]
pub(super) struct Sealing {
    hook: Option<Hook>,
}

/// One sealed file as reads use it: its entry, where it is, and its block index. Not held open
/// (a long-lived archive has thousands of files, and the server's connection budget counts on
/// the open-file limit): a read opens the path and checks the header's checksum against the
/// entry's, so that an index of one generation never addresses the bytes of another (folding
/// renames a new generation over the path before [`refresh_file`] swaps its index in).
#[derive(Debug)]
pub(super) struct SealedFile {
    entry: SegmentEntry,
    path: PathBuf,
    blocks: Vec<BlockInfo>,
}

impl SealedFile {
    /// The file at `path` as `entry` names it: opened, its header and footer read and its
    /// checksum checked against the entry's.
    fn open(entry: SegmentEntry, path: PathBuf) -> Result<(SealedFile, SegmentMeta), StoreError> {
        let file = File::open(&path).map_err(io_at(&path))?;
        let meta = read_segment_meta(&file, &path)?;
        if meta.header().checksum != entry.checksum {
            return Err(format_at(&path)(riptide_segment::Error::Footer(format!(
                "checksum {:016x}, its entry says {:016x}",
                meta.header().checksum,
                entry.checksum
            ))));
        }
        let blocks = meta.blocks().to_vec();
        Ok((
            SealedFile {
                entry,
                path,
                blocks,
            },
            meta,
        ))
    }
}

/// After folding rewrote the file of `entry` (now at `path`): readers take the new generation
/// from here on, and the blocks of the old one leave the block cache (a replay then serves the
/// fold). If the new file cannot be read, readers keep the old generation (still open, so still
/// readable) and the failure is logged: nothing is lost, the fold is served after a restart.
pub(super) fn refresh_file(
    files: &std::sync::RwLock<Files>,
    cache: &Mutex<VecDeque<Arc<Block>>>,
    entry: &SegmentEntry,
    path: &Path,
) {
    let fresh = match SealedFile::open(entry.clone(), path.to_owned()) {
        Ok((f, _)) => f,
        Err(e) => {
            tracing::error!(
                segment = %entry.name(),
                error = %e,
                "a folded segment cannot be read back: replays keep serving its previous \
                 generation until the store is reopened"
            );
            return;
        }
    };
    {
        let mut cur = files.write().unwrap_or_else(|p| p.into_inner());
        let mut next: Vec<Arc<SealedFile>> = cur.as_ref().clone();
        match next.iter().position(|f| f.entry.index == entry.index) {
            Some(i) => next[i] = Arc::new(fresh),
            None => return,
        }
        *cur = Arc::new(next);
    }
    lock(cache).retain(|b| !(entry.min_seq..=entry.max_seq).contains(&b.first));
}

/// The sealed files, ascending by seq, swapped whole when one is added.
pub(super) type Files = Arc<Vec<Arc<SealedFile>>>;

/// Where a block to read is: a file and the index of the block in it.
pub(super) struct SegmentBlock {
    file: Arc<SealedFile>,
    index: usize,
}

impl SegmentBlock {
    /// Whether its file is still the generation readers take (not replaced by folding since).
    pub(super) fn is_current(&self, files: &Files) -> bool {
        files.iter().any(|f| Arc::ptr_eq(f, &self.file))
    }

    /// The block's first seq.
    pub(super) fn first(&self) -> u64 {
        self.file.blocks[self.index].min_seq
    }

    /// Whether `seq` is in its range (its index entry's bounds: a folded block keeps them, with
    /// gaps between the rows that survived).
    pub(super) fn holds(&self, seq: u64) -> bool {
        let b = &self.file.blocks[self.index];
        b.min_seq <= seq && seq <= b.max_seq
    }

    /// The lowest seq a reader finds nothing at before this block: the seq after the last
    /// non-empty block before it, across the blocks emptied by folding just before it (in its
    /// file, and in the files right before it when they are contiguous: nothing else holds those
    /// seqs). Its own first seq when the block before it holds events.
    fn reaches_back_to(&self, files: &[Arc<SealedFile>]) -> u64 {
        let mut at = self.file.blocks[self.index].min_seq;
        let mut file = files.iter().rposition(|f| Arc::ptr_eq(f, &self.file));
        let mut blocks = &self.file.blocks[..self.index];
        loop {
            match blocks.iter().rev().find(|b| b.event_count > 0) {
                Some(b) => return b.max_seq + 1,
                None => {
                    let Some(i) = file else { return at };
                    at = at.min(files[i].entry.min_seq);
                    match i.checked_sub(1).map(|p| &files[p]) {
                        Some(prev) if prev.entry.max_seq + 1 == files[i].entry.min_seq => {
                            file = Some(i - 1);
                            blocks = &prev.blocks;
                        }
                        _ => return at,
                    }
                }
            }
        }
    }
}

fn io_at(path: &Path) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
    move |source| StoreError::SegmentIo {
        path: path.to_owned(),
        source,
    }
}

fn format_at(path: &Path) -> impl FnOnce(riptide_segment::Error) -> StoreError + '_ {
    move |source| StoreError::Segment {
        path: path.to_owned(),
        source,
    }
}

/// fsyncs a directory, so that a rename or a creation in it is durable.
fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_at(dir))
}

/// Reads `buf.len()` bytes at `at`, or fails.
fn read_exact_at(file: &File, buf: &mut [u8], at: u64, path: &Path) -> Result<(), StoreError> {
    file.read_exact_at(buf, at).map_err(io_at(path))
}

/// The header and footer of a sealed file, verified (its checksum included), without its
/// blocks: the footer is read only once the header's counts bound it
/// (`riptide_segment::max_footer_bytes`), so a damaged header cannot make this read a large file
/// into memory.
/// `file` is open at `path` (named in errors): a server takes its validators from the file it
/// actually opened.
pub fn read_segment_meta(file: &File, path: &Path) -> Result<SegmentMeta, StoreError> {
    let mut head = [0u8; HEADER_BYTES];
    let len = file.metadata().map_err(io_at(path))?.len();
    if len < HEADER_BYTES as u64 {
        return Err(format_at(path)(riptide_segment::Error::Footer(format!(
            "{len} bytes: shorter than a header"
        ))));
    }
    read_exact_at(file, &mut head, 0, path)?;
    let header = Header::parse(&head).map_err(format_at(path))?;
    if header.footer_offset < HEADER_BYTES as u64 || header.footer_offset > len {
        return Err(format_at(path)(riptide_segment::Error::Footer(format!(
            "footer offset {} outside [256, {len}]",
            header.footer_offset
        ))));
    }
    let footer_len = len - header.footer_offset;
    let bound = riptide_segment::max_footer_bytes(&header);
    if footer_len > bound {
        return Err(format_at(path)(riptide_segment::Error::Footer(format!(
            "footer of {footer_len} bytes at {}: the header's counts allow at most {bound}",
            header.footer_offset
        ))));
    }
    let mut footer = Vec::new();
    let mut f = file;
    f.seek(SeekFrom::Start(header.footer_offset))
        .map_err(io_at(path))?;
    f.take(len - header.footer_offset)
        .read_to_end(&mut footer)
        .map_err(io_at(path))?;
    SegmentMeta::from_parts(&head, footer).map_err(format_at(path))
}

impl<T: Text> Store<T> {
    /// `DIR/segments`, where sealed files are.
    pub fn segments_dir(&self) -> PathBuf {
        Path::new(&self.path).join("segments")
    }

    /// The path of an entry's file.
    pub fn segment_path(&self, e: &SegmentEntry) -> PathBuf {
        self.segments_dir().join(e.name())
    }

    /// The sealed segments, in index order (what the archive serves: `serve` feeds its
    /// `SealedSegments` from these at start, not from a scan of the directory).
    pub fn segment_entries(&self) -> Vec<SegmentEntry> {
        self.files().iter().map(|f| f.entry.clone()).collect()
    }

    /// The `segments` catalog (for `Catalog::live_floor`, and folding's `Folder`).
    pub fn catalog(&self) -> &crate::catalog::Catalog {
        &self.catalog
    }

    /// Bytes of row blocks waiting in `blocks` above the newest segment.
    pub fn live_row_bytes(&self) -> u64 {
        self.live_row_bytes.load(Relaxed)
    }

    /// Whether the row blocks above the newest segment have reached `segment_bytes` (never for
    /// a store without it): [`Self::seal_segments`] has work to do.
    pub fn seal_due(&self) -> bool {
        self.options
            .segment_bytes
            .is_some_and(|n| self.live_row_bytes() >= n.max(1))
    }

    /// Test hook: `stop(point, segment index)` returning true ends a seal there with
    /// [`StoreError::SealCrashed`], leaving the disk as a `kill -9` at that point would.
    pub fn seal_crash_at(&self, stop: impl Fn(SealPoint, u32) -> bool + Send + Sync + 'static) {
        lock(&self.sealing).hook = Some(Arc::new(stop));
    }

    pub(super) fn files(&self) -> Files {
        self.segments
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Seals segments while [`Self::seal_due`] (module docs), and returns the entry of each
    /// file sealed, in order: the server hands each to its archive (`SealedSegments::add` of
    /// [`Self::segment_path`]) and folding may follow. Blocking (writes and fsyncs up to
    /// `segment_bytes` a segment): for a background thread, never the ingest thread. One seal
    /// at a time: a second caller waits for the first.
    pub fn seal_segments(&self) -> Result<Vec<SegmentEntry>, StoreError> {
        let guard = lock(&self.sealing);
        let hook = guard.hook.clone();
        let mut out = Vec::new();
        while self.seal_due() {
            match self.seal_one(hook.as_ref())? {
                Some(e) => out.push(e),
                None => break,
            }
        }
        Ok(out)
    }

    fn crash(hook: Option<&Hook>, point: SealPoint, index: u32) -> Result<(), StoreError> {
        match hook {
            Some(stop) if stop(point, index) => Err(StoreError::SealCrashed(point)),
            _ => Ok(()),
        }
    }

    /// The run of row blocks the next seal takes (module docs): the first consecutive row blocks
    /// above `after`, up to `limit` bytes, JSON and damaged blocks below the run passed over.
    fn next_run(&self, after: u64, limit: u64) -> Result<Vec<(u64, Slice)>, StoreError> {
        let (mut run, mut bytes) = (Vec::<(u64, Slice)>::new(), 0u64);
        let mut end = 0;
        for kv in self.blocks.range((after + 1).to_be_bytes()..) {
            let (k, v) = kv.map_err(|e| self.err(e))?;
            let first = be64(&k);
            let h = match block_header(first, &v) {
                Ok(h) if h.format == BLOCK_FORMAT_ROWS => h,
                Ok(_) if run.is_empty() => continue,
                Err(StoreError::CorruptBlock { first, what }) => {
                    self.note_damaged(first, what);
                    if run.is_empty() {
                        // Not counted as live any more: it never leaves `blocks`.
                        self.live_row_bytes
                            .fetch_sub((v.len() as u64).min(self.live_row_bytes()), Relaxed);
                        continue;
                    }
                    break;
                }
                Err(e) => return Err(e),
                Ok(_) => break,
            };
            if !run.is_empty() && first != end {
                break;
            }
            end = h.first + h.count;
            bytes += v.len() as u64;
            run.push((first, v));
            if bytes >= limit {
                break;
            }
        }
        Ok(run)
    }

    /// One seal (module docs); `None` when there is no row block to seal.
    fn seal_one(&self, hook: Option<&Hook>) -> Result<Option<SegmentEntry>, StoreError> {
        let newest = self.catalog.newest()?;
        let after = newest.as_ref().map_or(0, |e| e.max_seq);
        // Past every file in the directory: a file no entry names (copied in) is never
        // overwritten.
        let index = self
            .segment_files()
            .last()
            .map(|(i, _)| *i + 1)
            .into_iter()
            .chain(newest.as_ref().map(|e| u64::from(e.index) + 1))
            .max()
            .unwrap_or(0);
        let index = u32::try_from(index).map_err(|_| {
            format_at(&self.segments_dir())(riptide_segment::Error::Footer(
                "segment index past u32".into(),
            ))
        })?;
        let limit = self.options.segment_bytes.unwrap_or(u64::MAX).max(1);
        let run = self.next_run(after, limit)?;
        if run.is_empty() {
            return Ok(None);
        }
        let dir = self.segments_dir();
        let tmp = dir.join("tmp");
        std::fs::create_dir_all(&tmp).map_err(io_at(&tmp))?;
        let name = segment_name(u64::from(index));
        let tmp_path = tmp.join(&name);
        let sealed = {
            let mut f = File::create(&tmp_path).map_err(io_at(&tmp_path))?;
            let mut w = SegmentWriter::new();
            let mut buf = vec![0u8; HEADER_BYTES];
            for (_, v) in &run {
                f.write_all(&buf).map_err(io_at(&tmp_path))?;
                buf.clear();
                let frame = &v[BLOCK_HEADER..v.len() - BLOCK_CHECKSUM];
                w.append_frame(frame, &mut buf)
                    .map_err(format_at(&tmp_path))?;
            }
            f.write_all(&buf).map_err(io_at(&tmp_path))?;
            let sealed = w.finish().map_err(format_at(&tmp_path))?;
            f.write_all(&sealed.footer).map_err(io_at(&tmp_path))?;
            f.sync_all().map_err(io_at(&tmp_path))?;
            f.write_all_at(&sealed.header, 0)
                .map_err(io_at(&tmp_path))?;
            f.sync_all().map_err(io_at(&tmp_path))?;
            sealed
        };
        sync_dir(&tmp)?;
        Self::crash(hook, SealPoint::TmpWritten, index)?;
        let path = dir.join(&name);
        std::fs::rename(&tmp_path, &path).map_err(io_at(&path))?;
        sync_dir(&dir)?;
        Self::crash(hook, SealPoint::Renamed, index)?;
        let entry = SegmentEntry::from_header(index, &sealed.parsed, 0);
        let meta =
            SegmentMeta::from_parts(&sealed.header, sealed.footer).map_err(format_at(&path))?;
        let bytes = self.adopt(entry.clone(), path, meta.blocks().to_vec(), &run)?;
        Self::crash(hook, SealPoint::Committed, index)?;
        tracing::info!(
            store = %self.path,
            segment = %entry.name(),
            seqs = %format_args!("{}..={}", entry.min_seq, entry.max_seq),
            blocks = entry.block_count,
            bytes,
            "sealed a segment"
        );
        Ok(Some(entry))
    }

    /// Makes a renamed file part of the store: readers' index first, then the entry and the
    /// removal of its blocks in one durable batch, then the space of those blocks reclaimed.
    /// Returns the blocks' bytes.
    fn adopt(
        &self,
        entry: SegmentEntry,
        path: PathBuf,
        blocks: Vec<BlockInfo>,
        run: &[(u64, Slice)],
    ) -> Result<u64, StoreError> {
        self.add_file(SealedFile {
            entry: entry.clone(),
            path,
            blocks,
        });
        let mut batch = self.ks.batch().durability(Some(PersistMode::SyncAll));
        self.catalog.put(&mut batch, &entry);
        let mut bytes = 0;
        for (first, v) in run {
            batch.remove(&self.blocks, first.to_be_bytes());
            bytes += v.len() as u64;
        }
        batch.commit().map_err(|e| self.err(e))?;
        self.live_row_bytes
            .fetch_sub(bytes.min(self.live_row_bytes()), Relaxed);
        // The removed values leave the FIFO partition's files (module docs, "Space"): a merge
        // of what is on disk; removals still in the memtable are merged by a later seal.
        self.blocks
            .tree
            .major_compact(u64::from(BLOCKS_MEMTABLE), self.ks.instant())
            .map_err(|e| self.err(e.into()))?;
        Ok(bytes)
    }

    fn add_file(&self, file: SealedFile) {
        let mut cur = self.segments.write().unwrap_or_else(|p| p.into_inner());
        let mut next: Vec<Arc<SealedFile>> = cur.as_ref().clone();
        let at = next.partition_point(|f| f.entry.min_seq < file.entry.min_seq);
        next.insert(at, Arc::new(file));
        *cur = Arc::new(next);
    }

    /// The sealed file's block holding `seq`, or the first non-empty one after it.
    pub(super) fn segment_block(&self, seq: u64) -> Option<SegmentBlock> {
        let files = self.files();
        let at = files.partition_point(|f| f.entry.max_seq < seq);
        for file in &files[at..] {
            let from = file.blocks.partition_point(|b| b.max_seq < seq);
            if let Some(i) = (from..file.blocks.len()).find(|&i| file.blocks[i].event_count > 0) {
                return Some(SegmentBlock {
                    file: file.clone(),
                    index: i,
                });
            }
        }
        None
    }

    /// The index entry of `at`'s block in the generation of the file `f` (opened at `path`):
    /// `None` when it is the generation `at` was found in (the header's checksum is the
    /// entry's), else the same block (folding keeps the block topology) in the new generation's
    /// footer, read from `f`: folding renamed it over the path and its index is not swapped in
    /// yet (`refresh_file`).
    fn current_info(
        f: &File,
        path: &Path,
        at: &SegmentBlock,
    ) -> Result<Option<BlockInfo>, StoreError> {
        let mut head = [0u8; HEADER_BYTES];
        read_exact_at(f, &mut head, 0, path)?;
        let header = Header::parse(&head).map_err(format_at(path))?;
        if header.checksum == at.file.entry.checksum {
            return Ok(None);
        }
        let meta = read_segment_meta(f, path)?;
        match meta.blocks().get(at.index) {
            Some(b) if b.min_seq == at.first() => Ok(Some(*b)),
            _ => Err(format_at(path)(riptide_segment::Error::Footer(format!(
                "block {} of the new generation is not the block at seq {}",
                at.index,
                at.first()
            )))),
        }
    }

    /// Reads, decompresses and renders a sealed file's block into `buf` (a cached block's
    /// form). A block that does not match its index entry or does not render is corrupt.
    pub(super) fn open_segment_block(
        &self,
        at: &SegmentBlock,
        mut buf: Vec<u8>,
    ) -> Result<Block, StoreError> {
        let info = at.file.blocks[at.index];
        let path = &at.file.path;
        let bad = |what| StoreError::CorruptBlock {
            first: info.min_seq,
            what,
        };
        let f = File::open(path).map_err(io_at(path))?;
        let info = Self::current_info(&f, path, at)?.unwrap_or(info);
        let mut frame = vec![0u8; 8 + info.compressed_size as usize];
        read_exact_at(&f, &mut frame, info.offset, path)?;
        if be64_le(&frame[..8]) != u64::from(info.compressed_size) {
            return Err(bad("segment block length"));
        }
        let body = riptide_segment::decompress(&frame[8..], info.uncompressed_size as usize)
            .map_err(|_| bad("zstd frame"))?;
        if body.len() != info.uncompressed_size as usize {
            return Err(bad("length"));
        }
        buf.clear();
        let count = u64::from(info.event_count);
        let mut starts = Vec::with_capacity(count as usize);
        let mut seqs = Vec::with_capacity(count as usize);
        let bounds = (info.min_seq, info.max_seq);
        crate::rows::render_rows(bounds, count, &body, &mut buf, &mut starts, &mut seqs)
            .map_err(bad)?;
        Ok(Block {
            first: info.min_seq,
            from: at.reaches_back_to(&self.files()),
            last: info.max_seq,
            data: buf,
            starts,
            seqs,
        })
    }

    /// For `check`: each sealed file's block count and, for each of its blocks, its events
    /// decoded (the number) or why not.
    pub(super) fn check_segments(&self) -> Vec<(u64, Vec<Result<u64, StoreError>>)> {
        self.files()
            .iter()
            .map(|file| {
                let opened = (0..file.blocks.len())
                    .filter(|&i| file.blocks[i].event_count > 0)
                    .map(|index| {
                        let at = SegmentBlock {
                            file: file.clone(),
                            index,
                        };
                        Self::check_events(&self.open_segment_block(&at, Vec::new())?)
                    })
                    .collect();
                (file.blocks.len() as u64, opened)
            })
            .collect()
    }

    /// Where the next block after the one at `first` starts among the sealed files, if any.
    pub(super) fn next_segment_block(&self, first: u64) -> Option<u64> {
        let files = self.files();
        let at = files.partition_point(|f| f.entry.max_seq <= first);
        files[at..]
            .iter()
            .flat_map(|f| f.blocks.iter())
            .find(|b| b.min_seq > first && b.event_count > 0)
            .map(|b| b.min_seq)
    }

    /// At open (module docs, "Crash points"): removes unfinished seals from `tmp/`, adopts or
    /// deletes a file renamed without its entry, loads every entry's block index and counts
    /// the live row bytes. Returns the newest segment's last seq and latest time, if any.
    pub(super) fn open_segments(&self) -> Result<Option<(u64, i64)>, StoreError> {
        let dir = self.segments_dir();
        let tmp = dir.join("tmp");
        if let Ok(list) = std::fs::read_dir(&tmp) {
            for f in list {
                let f = f.map_err(io_at(&tmp))?;
                let name = f.file_name();
                // Folding's `*.jss.compact` are `Folder::recover`'s.
                if parse_segment_name(&name.to_string_lossy()).is_some() {
                    std::fs::remove_file(f.path()).map_err(io_at(&f.path()))?;
                    tracing::warn!(file = %f.path().display(), "an unfinished seal removed");
                }
            }
        }
        let mut newest = self.catalog.newest()?;
        for (i, path) in self.segment_files() {
            if newest.as_ref().is_some_and(|e| i <= u64::from(e.index)) {
                continue;
            }
            match self.adopt_renamed(i, &path, newest.as_ref())? {
                Renamed::Adopted(e) => newest = Some(e),
                Renamed::Removed => {
                    std::fs::remove_file(&path).map_err(io_at(&path))?;
                    sync_dir(&dir)?;
                    tracing::warn!(
                        file = %path.display(),
                        "a segment renamed before its entry does not match the blocks after the \
                         last sealed segment: removed (its blocks are still in the store)"
                    );
                }
                Renamed::NotOurs => tracing::warn!(
                    file = %path.display(),
                    "a segment file no entry of the store names, not starting where the store's \
                     unsealed blocks start: left as it is, not read by the store"
                ),
            }
        }
        let mut last = None;
        *self.segments.write().unwrap_or_else(|p| p.into_inner()) = Arc::default();
        for e in self.catalog.entries()? {
            let path = self.segment_path(&e);
            match SealedFile::open(e.clone(), path) {
                Ok((file, m)) => {
                    last = Some((e.max_seq, m.header().max_witnessed_at));
                    self.add_file(file);
                }
                Err(err) => {
                    last = Some((e.max_seq, 0));
                    self.integrity
                        .corrupt_blocks
                        .fetch_add(u64::from(e.block_count), Relaxed);
                    tracing::error!(
                        store = %self.path,
                        segment = %e.name(),
                        seqs = %format_args!("{}..={}", e.min_seq, e.max_seq),
                        error = %err,
                        "a sealed segment is missing or does not verify: its events are not \
                         served (restore the file from a backup)"
                    );
                }
            }
        }
        if self.options.segment_bytes.is_some() {
            let after = last.map_or(0, |(s, _)| s);
            let mut bytes = 0;
            for kv in self.blocks.range((after + 1).to_be_bytes()..) {
                let (_, v) = kv.map_err(|e| self.err(e))?;
                if v.first() == Some(&BLOCK_FORMAT_ROWS) {
                    bytes += v.len() as u64;
                }
            }
            self.live_row_bytes.store(bytes, Relaxed);
        }
        Ok(last)
    }

    /// A file renamed into `segments/` with no entry (crash point [`SealPoint::Renamed`]):
    /// adopted as the seal would have finished it if it verifies whole and its blocks are
    /// exactly the row blocks that follow `newest` in `blocks`; `None` otherwise.
    fn adopt_renamed(
        &self,
        index: u64,
        path: &Path,
        newest: Option<&SegmentEntry>,
    ) -> Result<Renamed, StoreError> {
        let after = newest.map_or(0, |e| e.max_seq);
        let run = self.next_run(after, u64::MAX)?;
        // What a seal renames starts where the unsealed row blocks start; anything else was
        // put there by someone else (`riptide corpus segments`, a copy).
        let mut head = [0u8; HEADER_BYTES];
        let starts_here = File::open(path)
            .and_then(|f| f.read_exact_at(&mut head, 0))
            .ok()
            .and_then(|()| Header::parse(&head).ok())
            .is_some_and(|h| run.first().is_some_and(|(first, _)| h.min_seq == *first));
        let Ok(expected) = u32::try_from(index) else {
            return Ok(Renamed::NotOurs);
        };
        if !starts_here {
            return Ok(Renamed::NotOurs);
        }
        let bytes = std::fs::read(path).map_err(io_at(path))?;
        let Ok(seg) = Segment::open(&bytes) else {
            return Ok(Renamed::Removed);
        };
        let matches = seg.blocks().len() <= run.len()
            && seg
                .blocks()
                .iter()
                .zip(&run)
                .enumerate()
                .all(|(i, (b, (first, v)))| {
                    b.min_seq == *first
                        && block_header(*first, v)
                            .is_ok_and(|h| h.count == u64::from(b.event_count))
                        && seg.block_frame(i).ok()
                            == Some(&v[BLOCK_HEADER..v.len() - BLOCK_CHECKSUM])
                });
        if !matches {
            return Ok(Renamed::Removed);
        }
        let run = &run[..seg.blocks().len()];
        let entry = SegmentEntry::from_header(expected, seg.header(), 0);
        self.adopt(entry.clone(), path.to_owned(), seg.blocks().to_vec(), run)?;
        tracing::warn!(
            store = %self.path,
            segment = %entry.name(),
            "a segment renamed into place before its entry was adopted"
        );
        Ok(Renamed::Adopted(entry))
    }

    /// The `seg_*.jss` files in `segments/`, by index.
    fn segment_files(&self) -> Vec<(u64, PathBuf)> {
        let mut found: Vec<(u64, PathBuf)> = match std::fs::read_dir(self.segments_dir()) {
            Ok(list) => list
                .filter_map(|f| f.ok())
                .filter_map(|f| {
                    let i = parse_segment_name(&f.file_name().to_string_lossy())?;
                    Some((i, f.path()))
                })
                .collect(),
            Err(_) => Vec::new(),
        };
        found.sort();
        found
    }
}

/// What [`Store::open_segments`] does with a file no entry names.
enum Renamed {
    /// A seal's, renamed before its batch: now finished.
    Adopted(SegmentEntry),
    /// A seal's that does not match the blocks (they are all still in `blocks`): to remove.
    Removed,
    /// Not a seal's: left alone.
    NotOurs,
}

/// A little-endian u64 (the `.jss` length prefix).
fn be64_le(v: &[u8]) -> u64 {
    v.try_into().map(u64::from_le_bytes).unwrap_or(u64::MAX)
}
