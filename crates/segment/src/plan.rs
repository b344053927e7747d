//! `planSnapshot`: which sealed segments, or which of their blocks, may hold the events a client
//! asks for — a query over the format's own indices (block index, DID blooms, collection bitmaps).
//!
//! Why a module of the format crate: the plan is computed from nothing but what a segment's
//! header and footer say ([`SegmentMeta`]), so it is pure (no I/O, no HTTP) and is tested here
//! against Jetstream's golden files; `riptide-serve` validates nothing beyond JSON and renders
//! the result. The contract is Jetstream v2's lexicon `network.bsky.jetstream.planSnapshot`.
//!
//! Semantics checked line by line against Jetstream's `internal/manifest/plan.go` and
//! `internal/xrpcapi/plansnapshot.go` (commit 9a30def):
//! - the request's errors: `beforeSeq <= afterSeq`, more than 4 kinds or an unknown one, more
//!   than 10,000 DIDs or 100 collections (counted before de-duplication), a DID or NSID that does
//!   not parse, a wildcard other than `<NSID authority>.*`, collections with `kinds` excluding
//!   `commit`;
//! - `sealedTipSeq`: the highest `maxSeq` of all segments (scanned, not assumed to be the last),
//!   capped at `beforeSeq`; 0 for an empty archive; `plannedThroughSeq` equals it unless the page
//!   is cut, then it is the `maxSeq` of the last admitted unit (a whole segment's header bound,
//!   or a block range's last block's);
//! - a segment is skipped when it has no blocks or no events or lies outside
//!   `(afterSeq, beforeSeq]`; a block when it is empty or outside the window, when (with a kind or
//!   collection filter) its bitmap names no candidate collection, or when (with DIDs) its bloom
//!   passes none of them, the segment bloom having been tested first;
//! - candidates: a real collection stands for commits (exact names or `prefix.` matches against
//!   the segment's own table, all of them when no collection is given); the sentinels
//!   `$identity`, `$account`, `$sync` for their kinds, admitted whenever `kinds` admits them (so
//!   markers ride along with a collection filter);
//! - density = selected blocks / all the segment's blocks; ≥ 0.75 → one `segment` entry, else
//!   one entry per coalesced block range, and the page may end inside a segment;
//! - the entry cap: the first unit of a page is always admitted, then a unit is admitted only
//!   while fewer than the cap are in; every admitted unit holds a seq above `afterSeq`, so a
//!   client paging with `afterSeq = plannedThroughSeq` always advances.
//!
//! One difference, not visible on the wire: a DID is hashed once per request ([`BloomKey`]), its
//! bit positions are computed once per filter shape ([`Probe`]: the filters of one archive share
//! a `k`), and only the DIDs that pass a segment's bloom are tested against its blocks' blooms
//! (Jetstream hashes each DID per filter and tests all of them per block). The same blocks are
//! selected. Past 64 segments the selection runs on up to four scoped threads, each over a
//! contiguous run of segments; the page is then cut in order on the calling thread.
//! `cargo run --release -p riptide-segment --example plan_bench` measures the case.

use crate::bloom::{Bloom, BloomKey, Probe};
use crate::footer::CollectionIndex;
use crate::kind::{SENTINEL_ACCOUNT, SENTINEL_IDENTITY, SENTINEL_SYNC};
use crate::segment::SegmentMeta;

/// Most DIDs a request may name (Jetstream's `DefaultPlanMaxDIDs`).
pub const MAX_DIDS: usize = 10_000;
/// Most collection filters a request may give (Jetstream's `DefaultPlanMaxCollections`).
pub const MAX_COLLECTIONS: usize = 100;
/// Entries per page (Jetstream's `DefaultPlanMaxEntries`).
pub const MAX_ENTRIES: usize = 100_000;
/// The share of a segment's blocks from which the whole segment is planned (Jetstream's
/// `DefaultPlanWholeSegmentThreshold`).
pub const WHOLE_SEGMENT: f64 = 0.75;

/// A request the lexicon refuses (`InvalidRequest`, HTTP 400); the message is for people.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct PlanError(pub String);

fn invalid<T>(m: impl Into<String>) -> Result<T, PlanError> {
    Err(PlanError(m.into()))
}

/// The event kinds of a plan, as a bit set; empty admits every kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Kinds(u8);

impl Kinds {
    const COMMIT: u8 = 1;
    const IDENTITY: u8 = 2;
    const ACCOUNT: u8 = 4;
    const SYNC: u8 = 8;

    /// The set named by the lexicon's strings (`commit`, `identity`, `account`, `sync`).
    pub fn parse<S: AsRef<str>>(names: &[S]) -> Result<Kinds, PlanError> {
        if names.len() > 4 {
            return invalid("too many kinds");
        }
        let mut k = 0;
        for n in names {
            k |= match n.as_ref() {
                "commit" => Kinds::COMMIT,
                "identity" => Kinds::IDENTITY,
                "account" => Kinds::ACCOUNT,
                "sync" => Kinds::SYNC,
                other => return invalid(format!("invalid kind: {other}")),
            };
        }
        Ok(Kinds(k))
    }

    fn admits(self, bit: u8) -> bool {
        self.0 == 0 || self.0 & bit != 0
    }
}

/// A validated `planSnapshot` request.
#[derive(Debug, Clone, Default)]
pub struct PlanRequest {
    kinds: Kinds,
    /// Distinct DIDs, hashed once.
    dids: Vec<BloomKey>,
    /// Distinct exact NSIDs.
    collections: Vec<String>,
    /// Distinct wildcard prefixes, each ending in `.` (`app.bsky.feed.` from `app.bsky.feed.*`).
    prefixes: Vec<String>,
    after_seq: Option<u64>,
    before_seq: Option<u64>,
}

impl PlanRequest {
    /// Validates a request as the lexicon and Jetstream do (module docs).
    pub fn new(
        kinds: &[impl AsRef<str>],
        dids: &[impl AsRef<str>],
        collections: &[impl AsRef<str>],
        after_seq: Option<u64>,
        before_seq: Option<u64>,
    ) -> Result<PlanRequest, PlanError> {
        let kinds = Kinds::parse(kinds)?;
        if dids.len() > MAX_DIDS {
            return invalid(format!("too many DIDs: {}, at most {MAX_DIDS}", dids.len()));
        }
        if collections.len() > MAX_COLLECTIONS {
            return invalid(format!(
                "too many collections: {}, at most {MAX_COLLECTIONS}",
                collections.len()
            ));
        }
        let mut seen = std::collections::HashSet::new();
        let mut keys = Vec::with_capacity(dids.len());
        for d in dids {
            let d = d.as_ref();
            if !seen.insert(d) {
                continue;
            }
            if !riptide_syntax::is_valid_did(d) {
                return invalid(format!("invalid DID: {d}"));
            }
            keys.push(BloomKey::new(d.as_bytes()));
        }
        let (mut exact, mut prefixes) = (Vec::new(), Vec::new());
        let mut seen = std::collections::HashSet::new();
        for c in collections {
            let c = c.as_ref();
            if !seen.insert(c) {
                continue;
            }
            if let Some(head) = c.strip_suffix(".*") {
                if !riptide_syntax::is_valid_nsid(&format!("{head}.x")) {
                    return invalid(format!("invalid collection wildcard: {c}"));
                }
                prefixes.push(format!("{head}."));
            } else if riptide_syntax::is_valid_nsid(c) {
                exact.push(c.to_owned());
            } else {
                return invalid(format!("invalid collection: {c}"));
            }
        }
        let filtered = !exact.is_empty() || !prefixes.is_empty();
        if filtered && !kinds.admits(Kinds::COMMIT) {
            return invalid("collections filter can never apply: kinds excludes commit");
        }
        if let (Some(a), Some(b)) = (after_seq, before_seq) {
            if b <= a {
                return invalid("beforeSeq must be greater than afterSeq");
            }
        }
        Ok(PlanRequest {
            kinds,
            dids: keys,
            collections: exact,
            prefixes,
            after_seq,
            before_seq,
        })
    }

    fn overlaps(&self, min_seq: u64, max_seq: u64) -> bool {
        self.after_seq.is_none_or(|a| max_seq > a) && self.before_seq.is_none_or(|b| min_seq <= b)
    }
}

/// How a planned segment is downloaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The whole file (`getSegment`).
    Segment,
    /// The listed block ranges (`getBlock`).
    Blocks,
}

impl Mode {
    /// The lexicon's string.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Segment => "segment",
            Mode::Blocks => "blocks",
        }
    }
}

/// Blocks `first..=last` of a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockRange {
    /// First block index.
    pub first: u32,
    /// Last block index (inclusive).
    pub last: u32,
}

/// One segment of a plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedSegment {
    /// The segment's index (its name is [`crate::segment_name`] of it).
    pub index: u64,
    /// The segment's checksum (the header's; 16 hex digits on the wire).
    pub checksum: u64,
    /// The header's lowest seq.
    pub min_seq: u64,
    /// The header's highest seq.
    pub max_seq: u64,
    /// Whole file or blocks.
    pub mode: Mode,
    /// The block ranges, for [`Mode::Blocks`] (empty otherwise).
    pub blocks: Vec<BlockRange>,
}

/// The lexicon's `stats`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PlanStats {
    /// Segments looked at (all of them, as Jetstream counts).
    pub segments_examined: u64,
    /// Segments with at least one admitted unit.
    pub segments_matched: u64,
    /// Blocks in admitted units.
    pub blocks_matched: u64,
    /// Units counted against the page's cap.
    pub entries: u64,
}

/// One page of a plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The continuation cursor (`afterSeq` of the next page).
    pub planned_through_seq: u64,
    /// The sealed archive's end for this snapshot, capped at `beforeSeq`.
    pub sealed_tip_seq: u64,
    /// The segments to download, in index order.
    pub segments: Vec<PlannedSegment>,
    /// Counts.
    pub stats: PlanStats,
}

/// Which collection ids of one segment stand for a wanted event.
struct Candidates {
    /// Per collection id: wanted.
    wanted: Vec<bool>,
}

impl Candidates {
    /// `None`: every block qualifies (no kind and no collection filter).
    fn for_segment(req: &PlanRequest, c: &CollectionIndex) -> Option<Candidates> {
        let all_collections = req.collections.is_empty() && req.prefixes.is_empty();
        if req.kinds.0 == 0 && all_collections {
            return None;
        }
        let commits = req.kinds.admits(Kinds::COMMIT);
        let wanted = c
            .names()
            .iter()
            .map(|name| match name.as_str() {
                SENTINEL_IDENTITY => req.kinds.admits(Kinds::IDENTITY),
                SENTINEL_ACCOUNT => req.kinds.admits(Kinds::ACCOUNT),
                SENTINEL_SYNC => req.kinds.admits(Kinds::SYNC),
                n => {
                    commits
                        && (all_collections
                            || req.collections.iter().any(|w| w == n)
                            || req.prefixes.iter().any(|p| n.starts_with(p.as_str())))
                }
            })
            .collect();
        Some(Candidates { wanted })
    }

    fn block_has_any(&self, c: &CollectionIndex, block: usize) -> bool {
        c.block_ids(block)
            .any(|id| self.wanted.get(id as usize).copied().unwrap_or(false))
    }

    fn is_empty(&self) -> bool {
        !self.wanted.iter().any(|&w| w)
    }
}

/// The request's DIDs as bloom probes, made once per partition layout (`k`) a plan meets, so
/// that ten million filter tests cost no division each ([`BloomKey::probe`]).
struct Probes<'r> {
    keys: &'r [BloomKey],
    /// Indexed by `k`; filled on first use.
    by_k: Vec<Option<Vec<Probe>>>,
}

impl<'r> Probes<'r> {
    fn new(keys: &'r [BloomKey]) -> Probes<'r> {
        Probes {
            keys,
            by_k: Vec::new(),
        }
    }

    /// Key `j`'s probe is `for_k(k)[j]`. A `k` no filter can have (a parsed one has 3..=17)
    /// gives no probes, and the filter then counts as "may contain".
    fn for_k(&mut self, k: u32) -> Option<&[Probe]> {
        let k = k as usize;
        if self.by_k.len() <= k {
            self.by_k.resize(k + 1, None);
        }
        let keys = self.keys;
        self.by_k[k]
            .get_or_insert_with(|| keys.iter().map_while(|key| key.probe(k as u32)).collect())
            .get(..keys.len())
    }
}

/// Whether `bloom` may hold any of the keys `wanted` (indices into the request's DIDs).
fn any_probe(bloom: &Bloom<'_>, probes: &mut Probes<'_>, wanted: &[usize]) -> bool {
    match probes.for_k(bloom.k()) {
        Some(ps) => wanted.iter().any(|&j| bloom.contains_probe(&ps[j])),
        None => true,
    }
}

/// The blocks of one segment the request may need, ascending.
fn select(req: &PlanRequest, meta: &SegmentMeta, probes: &mut Probes<'_>) -> Vec<usize> {
    // DIDs first at the segment's bloom; only those that pass are tested per block.
    let all = 0..req.dids.len();
    let keys: Vec<usize> = match meta.did_bloom() {
        Some(b) if !req.dids.is_empty() => match probes.for_k(b.k()) {
            Some(ps) => all.filter(|&j| b.contains_probe(&ps[j])).collect(),
            None => all.collect(),
        },
        _ => all.collect(),
    };
    if !req.dids.is_empty() && keys.is_empty() {
        return Vec::new();
    }
    let candidates = Candidates::for_segment(req, meta.collections());
    if candidates.as_ref().is_some_and(Candidates::is_empty) {
        return Vec::new();
    }
    meta.blocks()
        .iter()
        .enumerate()
        .filter(|(i, b)| {
            b.event_count > 0
                && req.overlaps(b.min_seq, b.max_seq)
                && candidates
                    .as_ref()
                    .is_none_or(|c| c.block_has_any(meta.collections(), *i))
                && (keys.is_empty()
                    || meta
                        .block_bloom(*i)
                        .is_none_or(|bloom| any_probe(&bloom, probes, &keys)))
        })
        .map(|(i, _)| i)
        .collect()
}

/// Below this many segments a plan runs on the calling thread: a thread costs more than it saves.
const PARALLEL_MIN_SEGMENTS: usize = 64;
/// At most this many threads per plan (the selection is memory-light and CPU-bound).
const MAX_THREADS: usize = 4;

/// The blocks [`select`] chooses in each segment, in the segments' order; empty for a segment
/// outside the window or without events. The segments are split in contiguous runs over up to
/// [`MAX_THREADS`] scoped threads, each with probes of its own: a plan for 10,000 DIDs over
/// 1,000 segments is ten million filter tests, and nothing but the result is shared. A plan
/// whose page is cut early has still selected every segment: at most one plan's work.
fn select_all(
    req: &PlanRequest,
    segments: &[(u64, &SegmentMeta)],
    threads: usize,
) -> Vec<Vec<usize>> {
    let run = |part: &[(u64, &SegmentMeta)]| {
        let mut probes = Probes::new(&req.dids);
        part.iter()
            .map(|(_, meta)| {
                let h = meta.header();
                if meta.blocks().is_empty()
                    || h.event_count == 0
                    || !req.overlaps(h.min_seq, h.max_seq)
                {
                    Vec::new()
                } else {
                    select(req, meta, &mut probes)
                }
            })
            .collect::<Vec<_>>()
    };
    if threads < 2 || segments.len() < 2 {
        return run(segments);
    }
    let per = segments.len().div_ceil(threads);
    std::thread::scope(|scope| {
        let mut parts = segments.chunks(per);
        let first = parts.next().unwrap_or(&[]);
        let others: Vec<_> = parts.map(|part| scope.spawn(move || run(part))).collect();
        let mut all = run(first);
        for handle in others {
            // A selection cannot panic short of a bug; the panic is then the caller's, as on
            // one thread.
            match handle.join() {
                Ok(part) => all.extend(part),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        all
    })
}

/// The threads a plan over `segments` segments uses.
fn plan_threads(segments: usize) -> usize {
    if segments < PARALLEL_MIN_SEGMENTS {
        return 1;
    }
    std::thread::available_parallelism()
        .map_or(1, usize::from)
        .min(MAX_THREADS)
}

/// Consecutive block indices as ranges.
fn coalesce(blocks: &[usize]) -> Vec<BlockRange> {
    let mut out: Vec<BlockRange> = Vec::new();
    for &b in blocks {
        let b = b as u32;
        match out.last_mut() {
            Some(r) if r.last + 1 == b => r.last = b,
            _ => out.push(BlockRange { first: b, last: b }),
        }
    }
    out
}

/// Plans one page over the sealed segments `(index, metadata)`, in ascending index order, with
/// at most `max_entries` units (0: no cap; the first unit is always admitted).
pub fn plan<'a>(
    segments: impl IntoIterator<Item = (u64, &'a SegmentMeta)> + Clone,
    req: &PlanRequest,
    max_entries: usize,
) -> Plan {
    let tip = segments
        .clone()
        .into_iter()
        .map(|(_, m)| m.header().max_seq)
        .max()
        .unwrap_or(0);
    let sealed_tip_seq = req.before_seq.map_or(tip, |b| tip.min(b));
    let mut out = Plan {
        planned_through_seq: sealed_tip_seq,
        sealed_tip_seq,
        segments: Vec::new(),
        stats: PlanStats::default(),
    };
    let mut last_unit = 0;
    let mut truncated = false;
    let segments: Vec<(u64, &SegmentMeta)> = segments.into_iter().collect();
    let selections = select_all(req, &segments, plan_threads(segments.len()));
    for ((index, meta), selected) in segments.into_iter().zip(selections) {
        let at_cap = |s: &PlanStats| max_entries > 0 && s.entries >= max_entries as u64;
        out.stats.segments_examined += 1;
        let h = meta.header();
        if selected.is_empty() {
            continue;
        }
        let mut planned = PlannedSegment {
            index,
            checksum: h.checksum,
            min_seq: h.min_seq,
            max_seq: h.max_seq,
            mode: Mode::Segment,
            blocks: Vec::new(),
        };
        let density = selected.len() as f64 / meta.blocks().len().max(1) as f64;
        if density >= WHOLE_SEGMENT {
            if at_cap(&out.stats) {
                truncated = true;
                break;
            }
            out.stats.entries += 1;
            out.stats.segments_matched += 1;
            out.stats.blocks_matched += selected.len() as u64;
            out.segments.push(planned);
            last_unit = h.max_seq;
            continue;
        }
        planned.mode = Mode::Blocks;
        for r in coalesce(&selected) {
            if at_cap(&out.stats) {
                truncated = true;
                break;
            }
            out.stats.entries += 1;
            out.stats.blocks_matched += u64::from(r.last - r.first + 1);
            last_unit = meta.blocks()[r.last as usize].max_seq;
            planned.blocks.push(r);
        }
        if !planned.blocks.is_empty() {
            out.stats.segments_matched += 1;
            out.segments.push(planned);
        }
        if truncated {
            break;
        }
    }
    if truncated {
        out.planned_through_seq = last_unit;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{write_segment, Kind, Row};

    fn row(seq: u64, kind: Kind, did: &'static str, collection: &'static str) -> Row<'static> {
        Row {
            seq,
            witnessed_at: seq as i64 * 10,
            indexed_at: 0,
            kind,
            did,
            collection,
            rkey: if kind.is_commit() { "3k" } else { "" },
            rev: if kind.is_commit() { "3l" } else { "" },
            payload: b"\xa0",
        }
    }

    const A: &str = "did:plc:aaaaaaaaaaaaaaaaaaaaaaaa";
    const B: &str = "did:plc:bbbbbbbbbbbbbbbbbbbbbbbb";
    const C: &str = "did:web:c.example";

    /// Four blocks starting at `base`: A in x.y.post, B in x.z.like, an identity of A, C in
    /// x.y.post.
    fn segment(base: u64) -> SegmentMeta {
        let b0 = [row(base + 1, Kind::Create, A, "x.y.post")];
        let b1 = [row(base + 2, Kind::Create, B, "x.z.like")];
        let b2 = [row(base + 3, Kind::Identity, A, "")];
        let b3 = [
            row(base + 4, Kind::Create, C, "x.y.post"),
            row(base + 5, Kind::Delete, C, "x.y.post"),
        ];
        let file = write_segment(&[&b0, &b1, &b2, &b3]).unwrap();
        SegmentMeta::from_file(&file).unwrap()
    }

    fn req(kinds: &[&str], dids: &[&str], cols: &[&str]) -> PlanRequest {
        PlanRequest::new(kinds, dids, cols, None, None).unwrap()
    }

    type Ranges = Vec<(u64, Mode, Vec<(u32, u32)>)>;

    fn ranges(p: &Plan) -> Ranges {
        p.segments
            .iter()
            .map(|s| {
                let b = s.blocks.iter().map(|r| (r.first, r.last)).collect();
                (s.index, s.mode, b)
            })
            .collect()
    }

    #[test]
    fn threads_select_what_one_thread_selects() {
        let metas: Vec<SegmentMeta> = (0..70).map(|i| segment(i * 10)).collect();
        let list: Vec<(u64, &SegmentMeta)> = (0..).zip(&metas).collect();
        let window =
            PlanRequest::new(&[] as &[&str], &[B], &[] as &[&str], Some(95), Some(402)).unwrap();
        for r in [
            req(&[], &[A], &[]),
            req(&[], &[B, C], &["x.y.post"]),
            req(&["identity"], &[], &[]),
            req(&[], &[], &[]),
            window,
        ] {
            let one = select_all(&r, &list, 1);
            assert!(one.iter().any(|s| !s.is_empty()));
            for threads in [2, 3, 4, 69, 70, 71] {
                assert_eq!(select_all(&r, &list, threads), one, "{threads} threads");
            }
        }
        // Above the threshold `plan` takes the threaded path; its pages still cover the whole.
        assert!(metas.len() >= PARALLEL_MIN_SEGMENTS);
        let p = plan(list.iter().copied(), &req(&[], &[A], &[]), 0);
        assert_eq!(p.stats.segments_matched, 70);
        assert_eq!(p.stats.segments_examined, 70);
    }

    #[test]
    fn filters_select_the_blocks_that_hold_matches() {
        let m = segment(0);
        let one = |r: &PlanRequest| plan([(7, &m)], r, 0);
        let all = one(&req(&[], &[], &[]));
        assert_eq!(ranges(&all), [(7, Mode::Segment, vec![])]);
        assert_eq!((all.sealed_tip_seq, all.planned_through_seq), (5, 5));
        assert_eq!(all.segments[0].checksum, m.header().checksum);
        assert_eq!((all.segments[0].min_seq, all.segments[0].max_seq), (1, 5));
        assert_eq!(
            all.stats,
            PlanStats {
                segments_examined: 1,
                segments_matched: 1,
                blocks_matched: 4,
                entries: 1
            }
        );
        // One DID: its blocks only (A also has the identity in block 2).
        assert_eq!(
            ranges(&one(&req(&[], &[B], &[]))),
            [(7, Mode::Blocks, vec![(1, 1)])]
        );
        assert_eq!(
            ranges(&one(&req(&[], &[A], &[]))),
            [(7, Mode::Blocks, vec![(0, 0), (2, 2)])]
        );
        // A collection: its blocks plus the identity marker's (3 of 4 = 75%: the whole file).
        assert_eq!(
            ranges(&one(&req(&[], &[], &["x.y.post"]))),
            [(7, Mode::Segment, vec![])]
        );
        // Commits only: the marker stays out, two of four blocks.
        assert_eq!(
            ranges(&one(&req(&["commit"], &[], &["x.y.post"]))),
            [(7, Mode::Blocks, vec![(0, 0), (3, 3)])]
        );
        // A wildcard matches by namespace, not by string prefix of a label.
        assert_eq!(
            ranges(&one(&req(&["commit"], &[], &["x.z.*"]))),
            [(7, Mode::Blocks, vec![(1, 1)])]
        );
        assert!(one(&req(&["commit"], &[], &["x.y.*", "x.z.*"])).segments[0].mode == Mode::Segment);
        assert!(one(&req(&["commit"], &[], &["x.zz.*"])).segments.is_empty());
        // Kinds without collections: the sentinel's block.
        assert_eq!(
            ranges(&one(&req(&["identity"], &[], &[]))),
            [(7, Mode::Blocks, vec![(2, 2)])]
        );
        assert!(one(&req(&["sync", "account"], &[], &[]))
            .segments
            .is_empty());
        // DID and collection together; an unknown DID selects nothing but keeps the tip.
        assert_eq!(
            ranges(&one(&req(&["commit"], &[C], &["x.y.post"]))),
            [(7, Mode::Blocks, vec![(3, 3)])]
        );
        let none = one(&req(&[], &["did:plc:nobody"], &[]));
        assert!(none.segments.is_empty());
        assert_eq!((none.sealed_tip_seq, none.planned_through_seq), (5, 5));
        assert_eq!(none.stats.segments_examined, 1);
    }

    #[test]
    fn the_window_is_after_exclusive_before_inclusive() {
        let m = segment(0);
        let w = |a, b| {
            let r = PlanRequest::new(&[] as &[&str], &[] as &[&str], &[] as &[&str], a, b).unwrap();
            plan([(0, &m)], &r, 0)
        };
        // (1, 3]: blocks 1 and 2 of 4.
        let p = w(Some(1), Some(3));
        assert_eq!(ranges(&p), [(0, Mode::Blocks, vec![(1, 2)])]);
        assert_eq!((p.sealed_tip_seq, p.planned_through_seq), (3, 3));
        // (0, 3]: three of four blocks, the whole file.
        assert_eq!(w(Some(0), Some(3)).segments[0].mode, Mode::Segment);
        // Past the end: nothing, the tip is the archive's.
        let p = w(Some(5), None);
        assert!(p.segments.is_empty());
        assert_eq!(p.sealed_tip_seq, 5);
        // Block 3 holds 4..=5: after 4 still selects it.
        assert_eq!(ranges(&w(Some(4), None)), [(0, Mode::Blocks, vec![(3, 3)])]);
    }

    #[test]
    fn pages_at_the_cap_advance_and_cover_the_uncut_plan() {
        let segs: Vec<SegmentMeta> = (0..5).map(|i| segment(i * 100)).collect();
        let all = || segs.iter().enumerate().map(|(i, m)| (i as u64, m));
        for r in [
            req(&[], &[], &[]),
            req(&["commit"], &[], &["x.y.post"]),
            req(&[], &[A, C], &[]),
        ] {
            let whole = plan(all(), &r, 0);
            let want: Vec<(u64, u32, u32)> = whole.segments.iter().flat_map(unit_list).collect();
            for cap in [1, 2, 3] {
                let mut got = Vec::new();
                let mut after = None;
                let mut tip = None;
                loop {
                    let page_req = PlanRequest {
                        after_seq: after,
                        before_seq: tip,
                        ..r.clone()
                    };
                    let p = plan(all(), &page_req, cap);
                    assert!(p.stats.entries as usize <= cap);
                    assert_eq!(p.sealed_tip_seq, whole.sealed_tip_seq);
                    assert!(
                        after.is_none_or(|a| p.planned_through_seq > a),
                        "stuck at {after:?}"
                    );
                    got.extend(p.segments.iter().flat_map(unit_list));
                    tip = Some(p.sealed_tip_seq);
                    after = Some(p.planned_through_seq);
                    if p.planned_through_seq >= p.sealed_tip_seq {
                        break;
                    }
                }
                // A whole segment may be cut into block ranges once its window is narrowed, so
                // compare block coverage: every block of the uncut plan is in some page.
                let blocks = |u: &[(u64, u32, u32)]| {
                    let mut v: Vec<(u64, u32)> = u
                        .iter()
                        .flat_map(|&(s, a, b)| (a..=b).map(move |i| (s, i)))
                        .collect();
                    v.sort_unstable();
                    v.dedup();
                    v
                };
                let full_blocks: Vec<(u64, u32)> = blocks(&want);
                let got_blocks = blocks(&got);
                for b in &full_blocks {
                    assert!(
                        got_blocks.contains(b),
                        "cap {cap}: block {b:?} never planned"
                    );
                }
            }
        }
        // The first unit is admitted even with a cap of 1, and the cut is at its maxSeq.
        let r = req(&["commit"], &[], &["x.y.post"]);
        let p = plan(all(), &r, 1);
        assert_eq!(ranges(&p), [(0, Mode::Blocks, vec![(0, 0)])]);
        assert_eq!((p.planned_through_seq, p.sealed_tip_seq), (1, 405));
        assert_eq!(p.stats.entries, 1);
    }

    /// A planned segment's units as (segment, first block, last block); a whole file is all of
    /// its four blocks.
    fn unit_list(s: &PlannedSegment) -> Vec<(u64, u32, u32)> {
        match s.mode {
            Mode::Segment => vec![(s.index, 0, 3)],
            Mode::Blocks => s
                .blocks
                .iter()
                .map(|r| (s.index, r.first, r.last))
                .collect(),
        }
    }

    #[test]
    fn the_lexicons_errors() {
        let e = |k: &[&str], d: &[&str], c: &[&str], a, b| {
            PlanRequest::new(k, d, c, a, b).unwrap_err().0
        };
        assert_eq!(
            e(&[], &[], &[], Some(5), Some(5)),
            "beforeSeq must be greater than afterSeq"
        );
        assert!(e(&["commits"], &[], &[], None, None).starts_with("invalid kind"));
        assert!(e(&["commit"; 5], &[], &[], None, None).starts_with("too many kinds"));
        assert!(e(&["identity"], &[], &["a.b.c"], None, None).contains("kinds excludes commit"));
        assert!(e(&[], &["bob"], &[], None, None).starts_with("invalid DID"));
        assert!(e(&[], &[], &["a.b"], None, None).starts_with("invalid collection"));
        assert!(e(&[], &[], &["a.*"], None, None).starts_with("invalid collection wildcard"));
        assert!(e(&[], &[], &["*"], None, None).starts_with("invalid collection"));
        let many: Vec<String> = (0..=MAX_DIDS).map(|i| format!("did:plc:{i}")).collect();
        assert!(PlanRequest::new(&many, &many, &[] as &[&str], None, None).is_err());
        let dids = &many[..MAX_DIDS];
        assert!(PlanRequest::new(&[] as &[&str], dids, &[] as &[&str], None, None).is_ok());
        // Counted before de-duplication, as Jetstream counts.
        let cols = vec!["a.b.c".to_string(); MAX_COLLECTIONS + 1];
        assert!(PlanRequest::new(&[] as &[&str], &[] as &[&str], &cols, None, None).is_err());
        assert!(PlanRequest::new(
            &[] as &[&str],
            &[] as &[&str],
            &cols[..MAX_COLLECTIONS],
            None,
            None
        )
        .is_ok());
        // Duplicates are planned once.
        assert_eq!(
            PlanRequest::new(&[] as &[&str], &[A, A], &[] as &[&str], None, None)
                .unwrap()
                .dids
                .len(),
            1
        );
    }

    #[test]
    fn an_empty_archive_plans_nothing_at_zero() {
        let p = plan(std::iter::empty(), &req(&[], &[], &[]), 0);
        assert_eq!((p.planned_through_seq, p.sealed_tip_seq), (0, 0));
        assert!(p.segments.is_empty());
    }
}
