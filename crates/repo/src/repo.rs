//! Whole repositories: verify an export, list its records, inspect its commit.
//!
//! Why: a `com.atproto.sync.getRepo` CAR is the unit of backfill and of account migration, and
//! the only way to trust one is to check all of it: every block hashes to its CID (while the CAR
//! is read), the root commit decodes and (given a key) its signature verifies, the MST is the
//! canonical tree (a checked walk), and rebuilding that tree from its leaves reproduces the
//! commit's `data`. [`verify_repo`] does exactly that and reports how long each phase took.
//!
//! Performance: the walk decodes each node once on a reused tape; the rebuild takes each leaf
//! from the walk as it is visited (with the key height the walk computed), so it reads keys,
//! record CIDs and node blocks while they are in cache and needs no table of all leaves. Nothing
//! is allocated per record or per node beyond amortized buffer growth. Each record is first
//! looked for in the block after the last record found (`RecordCursor`): a CAR that lists its
//! records in key order (the generator's, any export written by walking the tree) confirms it
//! with one access next to the last, where the index costs two random ones. In a CAR in another
//! order (a PDS's, sorted by CID) records go through a short queue (`RecordQueue`): each is
//! looked up in the index 16 leaves after the walk hands it over, its slot and entry requested
//! before, so that the cache misses of many records overlap; the first missing record named is
//! still the first in walk order. The walk looks each subtree's block
//! up once, compares keys only across node boundaries, and takes key heights from the SHA-256
//! lanes' leading zeros. Where the time goes on a 200,000-record repository (72 MB), and what
//! was measured and did not pay: `bench/results/2026-11-24-vm/repo-walk.md`,
//! `docs/gotchas.md`. Block order matters: the same repository in CID order verifies about 1.4×
//! slower (0.48 of the SHA-256 bound against 0.68: subtree lookups and node bytes out of cache).
//!
//! Record blocks: a full export holds every record the MST points to, so a missing one is an
//! error ([`RepoError::MissingRecord`]) unless [`RepoOptions::allow_missing_records`] is set (for
//! partial exports such as `getRepo` with `since`), in which case they are counted.
//!
//! What it does not do: resolve the DID to a key, fetch anything, or validate record contents
//! against lexicons.

use std::time::{Duration, Instant};

use riptide_car::{Car, CarOptions, CarReader};
use riptide_cbor::{Cid, CidBuf};
use riptide_crypto::PublicKey;

use crate::commit::Commit;
use crate::error::{RepoError, RootMismatch};
use crate::mst::stream::StreamBuilder;
use crate::mst::walk::{Visit, Walker};

/// Options for [`verify_repo_with`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RepoOptions {
    /// Count record blocks missing from the CAR instead of failing on the first one.
    pub allow_missing_records: bool,
}

/// Per-phase wall-clock timings of [`verify_repo`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Timings {
    /// Reading the CAR, including the SHA-256 of every block.
    pub car: Duration,
    /// Decoding the commit and verifying its signature.
    pub signature: Duration,
    /// Walking the MST with structural checks, and rebuilding it from its leaves as the walk
    /// hands them over (the two are interleaved, so that the rebuild finds its data in cache).
    pub walk: Duration,
    /// Finishing the rebuild: the nodes still open after the last leaf (the right edge of the
    /// tree, up to the root).
    pub rebuild: Duration,
}

/// What [`verify_repo`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepoReport {
    /// The commit CID (the CAR root).
    pub commit: CidBuf,
    /// The repository DID.
    pub did: String,
    /// The commit revision.
    pub rev: String,
    /// The MST root.
    pub data: CidBuf,
    /// The commit's `prev`, if not null.
    pub prev: Option<CidBuf>,
    /// Records (MST leaves).
    pub records: usize,
    /// Record CIDs the MST points to that are not in the CAR (0 unless
    /// [`RepoOptions::allow_missing_records`]).
    pub missing_records: usize,
    /// MST nodes.
    pub mst_nodes: usize,
    /// Layer of the MST root.
    pub mst_root_layer: u32,
    /// Blocks in the CAR.
    pub blocks: usize,
    /// Size of the CAR in bytes.
    pub bytes: usize,
    /// Whether the signature was checked (a key was given) and verified.
    pub signature_checked: bool,
    /// Time per phase.
    pub timings: Timings,
}

/// The commit of a repository, as [`inspect`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitInfo {
    /// The commit CID.
    pub commit: CidBuf,
    /// The repository DID.
    pub did: String,
    /// The repository format version.
    pub version: i64,
    /// The MST root.
    pub data: CidBuf,
    /// The revision.
    pub rev: String,
    /// The previous commit, if not null.
    pub prev: Option<CidBuf>,
}

/// What [`verify_repo`] does with what the walk hands over: every record must be in the CAR,
/// and every leaf goes to the rebuild while the walk still holds it (and the node it came from)
/// in cache.
struct Verifying<'a, 'r, L> {
    car: &'r Car<'a>,
    /// Told of every leaf as the walk visits it ([`verify_repo_visiting`]); a no-op otherwise.
    on_leaf: L,
    rebuild: StreamBuilder<'a>,
    /// Every node in post-order, with its block: the CAR reader has checked each block against
    /// its CID, which lets the rebuild compare encodings instead of hashing them again.
    nodes: Vec<(Cid<'a>, &'a [u8])>,
    missing_records: usize,
    first_missing: Option<(String, CidBuf)>,
    /// Where the last record found is, and whether it came right after the one before.
    records: RecordCursor,
    /// Records visited but not yet looked for, oldest first.
    queue: RecordQueue<'a>,
}

/// Records checked a few leaves after the walk hands them over, in the order it does. Why: in a
/// CAR that is not in key order (a PDS's, sorted by CID) every record is an index lookup, two
/// dependent cache misses (slot, then entry) on a large CAR; one at a time they were most of the
/// walk's time. The walk starts loading each record's slot when it decodes the node; the entry
/// is requested [`RecordQueue::AHEAD`] leaves later and the lookup done [`RecordQueue::LEN`]
/// leaves later, so the misses of many records overlap. While records come in file order (the
/// cursor's guess holds) no entry is requested: the guess needs none.
struct RecordQueue<'a> {
    /// `LEN` slots, used as a ring: key (for the error) and record CID.
    slots: Vec<(Vec<u8>, Option<Cid<'a>>)>,
    /// Records queued so far; slot `i % LEN` holds record `i`.
    pushed: usize,
    /// Records checked so far (`pushed - checked <= LEN`).
    checked: usize,
}

impl<'a> RecordQueue<'a> {
    /// Records in flight.
    const LEN: usize = 16;
    /// How many leaves after it is queued a record's index entry is requested.
    const AHEAD: usize = 8;

    fn new() -> Self {
        RecordQueue {
            slots: (0..Self::LEN).map(|_| (Vec::new(), None)).collect(),
            pushed: 0,
            checked: 0,
        }
    }
}

/// Counts a missing record, and names it if it is the first.
#[cold]
fn note_missing(count: &mut usize, first: &mut Option<(String, CidBuf)>, key: &[u8], cid: Cid<'_>) {
    *count += 1;
    if first.is_none() {
        *first = Some((String::from_utf8_lossy(key).into_owned(), cid.to_buf()));
    }
}

impl<'a, L> Verifying<'a, '_, L> {
    /// Checks the oldest queued record.
    #[inline]
    fn check_oldest(&mut self) {
        let q = &mut self.queue;
        let (key, cid) = &mut q.slots[q.checked % RecordQueue::LEN];
        q.checked += 1;
        let Some(cid) = cid.take() else { return };
        if !self.records.find(self.car, cid) {
            note_missing(&mut self.missing_records, &mut self.first_missing, key, cid);
        }
    }

    /// Queues a record (the guess failed) and requests the index entry of the one queued
    /// [`RecordQueue::AHEAD`] leaves before it. Out of line: the in-order path stays small.
    #[inline(never)]
    fn enqueue(&mut self, key: &[u8], cid: Cid<'a>) {
        if self.queue.pushed - self.queue.checked == RecordQueue::LEN {
            self.check_oldest();
        }
        let q = &mut self.queue;
        let slot = &mut q.slots[q.pushed % RecordQueue::LEN];
        slot.0.clear();
        slot.0.extend_from_slice(key);
        slot.1 = Some(cid);
        q.pushed += 1;
        if q.pushed > RecordQueue::AHEAD {
            let ahead = (q.pushed - 1 - RecordQueue::AHEAD) % RecordQueue::LEN;
            if let Some(c) = q.slots[ahead].1 {
                self.car.touch_entry(c);
            }
        }
    }

    /// Checks every queued record (after the last leaf, or when records come in file order
    /// again).
    #[inline(never)]
    fn drain(&mut self) {
        while self.queue.checked < self.queue.pushed {
            self.check_oldest();
        }
    }
}

/// Where the next record's block probably is. A CAR written by walking the tree (the generator's,
/// or any export that lists records in key order) holds each record right after the previous
/// one; then checking the block after the last record found costs one access next to the last,
/// where an index lookup costs two random ones (slot, then entry: 27–35 ns on a 72 MB CAR). The
/// guess is only tried while it has been right (two records found in a row), so a CAR in any other
/// order (a PDS's, sorted by CID) pays a comparison, not an extra cache miss.
#[derive(Debug, Default, Clone, Copy)]
struct RecordCursor {
    /// The block after the last record found.
    next: usize,
    /// Whether the last two records found were adjacent blocks.
    in_order: bool,
}

impl RecordCursor {
    /// Whether `cid` is a block of `car`: at the guessed place, else through the index.
    #[inline]
    fn find(&mut self, car: &Car<'_>, cid: Cid<'_>) -> bool {
        if self.in_order && car.is_block(self.next, cid) {
            self.next += 1;
            return true;
        }
        match car.position(cid) {
            Some(i) => {
                self.in_order = i == self.next;
                self.next = i + 1;
                true
            }
            None => {
                self.in_order = false;
                false
            }
        }
    }
}

impl<'a, L: FnMut(&Car<'a>, &[u8], Cid<'a>)> Visit<'a, 'a> for Verifying<'a, '_, L> {
    #[inline]
    fn leaf(&mut self, key: &[u8], cid: Cid<'a>, height: u32) {
        if self.records.in_order {
            // Records come in file order: check this one now (the guess needs no lookup),
            // after any queued before it, so that the first missing is still the first in walk
            // order.
            if self.queue.checked < self.queue.pushed {
                self.drain();
            }
            if !self.records.find(self.car, cid) {
                note_missing(&mut self.missing_records, &mut self.first_missing, key, cid);
            }
        } else {
            self.enqueue(key, cid);
        }
        self.rebuild.leaf(key, cid, height, &self.nodes);
        (self.on_leaf)(self.car, key, cid);
    }

    #[inline]
    fn node(&mut self, cid: Cid<'a>, block: &'a [u8]) {
        self.nodes.push((cid, block));
    }
}

/// The commit a repository CAR is rooted at: its CID and decoded view.
pub fn commit_of<'a>(car: &Car<'a>) -> Result<(CidBuf, Commit<'a>), RepoError> {
    let root = car.roots().next().ok_or(RepoError::NoRoot)?;
    let block = car
        .get(root)
        .ok_or_else(|| RepoError::MissingCommit(root.to_buf()))?;
    Ok((root.to_buf(), Commit::decode(block)?))
}

/// The commit of a repository CAR.
pub fn inspect(car: &Car<'_>) -> Result<CommitInfo, RepoError> {
    let (cid, c) = commit_of(car)?;
    Ok(CommitInfo {
        commit: cid,
        did: c.did().to_owned(),
        version: c.version(),
        data: c.data().to_buf(),
        rev: c.rev().to_owned(),
        prev: c.prev().map(|p| p.to_buf()),
    })
}

/// Every record of a repository CAR as `(collection/rkey, record CID)`, in key order. The MST is
/// checked on the way (see [`crate::mst::walk()`]).
pub fn list_records(car: &Car<'_>) -> Result<Vec<(String, CidBuf)>, RepoError> {
    let (_, commit) = commit_of(car)?;
    let mut out = Vec::new();
    let mut bad_utf8 = false;
    Walker::new().walk(
        car,
        commit.data(),
        |key, cid, _| match std::str::from_utf8(key) {
            Ok(k) => out.push((k.to_owned(), cid.to_buf())),
            Err(_) => bad_utf8 = true,
        },
    )?;
    if bad_utf8 {
        return Err(RepoError::KeyNotUtf8);
    }
    Ok(out)
}

/// Verifies a whole repository export: CAR block hashes, commit (and signature, given `key`),
/// MST structure, every record block present, and the MST rebuilt from its leaves against the
/// commit's `data`.
pub fn verify_repo(car_bytes: &[u8], key: Option<&PublicKey>) -> Result<RepoReport, RepoError> {
    verify_repo_with(car_bytes, key, &RepoOptions::default())
}

/// [`verify_repo`] with options.
pub fn verify_repo_with(
    car_bytes: &[u8],
    key: Option<&PublicKey>,
    opts: &RepoOptions,
) -> Result<RepoReport, RepoError> {
    verify_repo_traced(car_bytes, key, opts, &mut Progress::default())
}

/// How far [`verify_repo_traced`] got: what it learned before it stopped. Why: a report of a
/// repository that fails (`riptide repo verify --json`) has the same fields as one that passes,
/// filled in as far as the checks went.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Progress {
    /// The commit's DID, once the commit decoded.
    pub did: Option<String>,
    /// Blocks in the CAR, once it was read.
    pub blocks: Option<usize>,
    /// Whether the signature was checked (passed or failed): a key was given and the commit
    /// decoded far enough for it.
    pub signature_checked: bool,
    /// The phases that ran; those that did not are zero.
    pub timings: Timings,
}

/// [`verify_repo_with`], recording in `progress` how far it got, pass or fail.
pub fn verify_repo_traced(
    car_bytes: &[u8],
    key: Option<&PublicKey>,
    opts: &RepoOptions,
    progress: &mut Progress,
) -> Result<RepoReport, RepoError> {
    verify_repo_visiting(car_bytes, key, opts, progress, |_, _, _| {})
}

/// [`verify_repo_traced`], telling `on_leaf` of every record as the walk visits it (key order):
/// the CAR (to look the record's block up), the key and the record's CID. Why: a backfill
/// needs every record of a repository it verifies, and a second walk over the verified CAR (a
/// second index, every node decoded again) cost it as much as the verification's own walk.
/// The leaves are only a repository's records if the result is `Ok`.
pub fn verify_repo_visiting<L>(
    car_bytes: &[u8],
    key: Option<&PublicKey>,
    opts: &RepoOptions,
    progress: &mut Progress,
    on_leaf: L,
) -> Result<RepoReport, RepoError>
where
    L: FnMut(&Car<'_>, &[u8], Cid<'_>),
{
    let t = Instant::now();
    let mut reader = CarReader::new();
    let car = reader.read(car_bytes, &CarOptions::repository());
    progress.timings.car = t.elapsed();
    let car = car?;
    progress.blocks = Some(car.len());

    let t = Instant::now();
    let commit = commit_of(&car);
    if let Ok((_, c)) = &commit {
        progress.did = Some(c.did().to_owned());
    }
    let signed = commit.and_then(|(cid, c)| {
        if let Some(key) = key {
            progress.signature_checked = true;
            c.verify_signature(key)?;
        }
        Ok((cid, c))
    });
    progress.timings.signature = t.elapsed();
    let (commit_cid, commit) = signed?;
    let timings = &mut progress.timings;

    let t = Instant::now();
    // `CarOptions::repository()` verifies every block, so `nodes` are verified blocks.
    let mut v = Verifying {
        car: &car,
        on_leaf,
        rebuild: StreamBuilder::new(),
        nodes: Vec::with_capacity(car.len() / 3),
        missing_records: 0,
        first_missing: None,
        records: RecordCursor::default(),
        queue: RecordQueue::new(),
    };
    let walked = Walker::new().walk_with(&car, commit.data(), &mut v);
    v.drain();
    timings.walk = t.elapsed();
    let stats = walked?;
    if let (Some((key, cid)), false) = (v.first_missing.take(), opts.allow_missing_records) {
        return Err(RepoError::MissingRecord { key, cid });
    }
    let missing_records = v.missing_records;

    let t = Instant::now();
    let rebuilt = v.rebuild.finish(&v.nodes);
    timings.rebuild = t.elapsed();
    let data = commit.data().to_buf();
    if rebuilt != data {
        return Err(RepoError::RootMismatch(Box::new(RootMismatch {
            expected: data,
            actual: rebuilt,
        })));
    }

    Ok(RepoReport {
        commit: commit_cid,
        did: commit.did().to_owned(),
        rev: commit.rev().to_owned(),
        data,
        prev: commit.prev().map(|p| p.to_buf()),
        records: stats.records,
        missing_records,
        mst_nodes: stats.nodes,
        mst_root_layer: stats.root_layer,
        blocks: car.len(),
        bytes: car_bytes.len(),
        signature_checked: key.is_some(),
        timings: *timings,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use riptide_car::write_car;
    use riptide_cbor::{OwnedValue, DAG_CBOR};
    use riptide_crypto::{Curve, PrivateKey};
    use std::collections::BTreeMap;

    fn repo(
        leaves: &[(String, CidBuf)],
        records: &[(CidBuf, Vec<u8>)],
        key: &PrivateKey,
    ) -> Vec<u8> {
        let (root, nodes) = crate::mst::build(leaves).unwrap();
        let mut m = BTreeMap::new();
        m.insert("did".to_string(), OwnedValue::Text("did:plc:x".into()));
        m.insert("version".to_string(), OwnedValue::Int(3));
        m.insert("data".to_string(), OwnedValue::Link(root));
        m.insert("rev".to_string(), OwnedValue::Text("3migo7fijwi2k".into()));
        m.insert("prev".to_string(), OwnedValue::Null);
        let sig = key.sign(&OwnedValue::Map(m.clone()).to_cbor());
        m.insert("sig".to_string(), OwnedValue::Bytes(sig.to_vec()));
        let commit = OwnedValue::Map(m).to_cbor();
        let commit_cid = CidBuf::sha256(DAG_CBOR, &commit);
        let mut blocks: Vec<(CidBuf, &[u8])> = vec![(commit_cid, &commit)];
        blocks.extend(nodes.iter().map(|(c, d)| (*c, d.as_slice())));
        blocks.extend(records.iter().map(|(c, d)| (*c, d.as_slice())));
        write_car(&[commit_cid], blocks.iter().map(|(c, d)| (c.as_cid(), *d)))
    }

    /// `n` records (`"record {text(i)}"`) and a leaf for each, `collection/{i:04}` in key order:
    /// leaf `i` points to record `i`, whose text is numbered `text(i)` (two leaves given the same
    /// number share a record's content, so its CID).
    #[allow(clippy::type_complexity)]
    fn numbered(
        n: usize,
        collection: &str,
        text: impl Fn(usize) -> usize,
    ) -> (Vec<(CidBuf, Vec<u8>)>, Vec<(String, CidBuf)>) {
        let records: Vec<(CidBuf, Vec<u8>)> = (0..n)
            .map(|i| {
                let r = OwnedValue::Text(format!("record {}", text(i))).to_cbor();
                (CidBuf::sha256(DAG_CBOR, &r), r)
            })
            .collect();
        let leaves = records
            .iter()
            .enumerate()
            .map(|(i, (c, _))| (format!("{collection}/{i:04}"), *c))
            .collect();
        (records, leaves)
    }

    #[test]
    fn empty_and_small_repos() {
        let key = PrivateKey::from_bytes(Curve::Secp256k1, &[1; 32]).unwrap();
        let car = repo(&[], &[], &key);
        let r = verify_repo(&car, Some(&key.public_key())).unwrap();
        assert_eq!((r.records, r.mst_nodes, r.blocks), (0, 1, 2));
        assert_eq!(r.data, crate::mst::empty_root_cid());

        let rec = OwnedValue::Text("x".into()).to_cbor();
        let rec_cid = CidBuf::sha256(DAG_CBOR, &rec);
        let leaves: Vec<(String, CidBuf)> = (0..50)
            .map(|i| (format!("app.bsky.feed.like/{i:03}"), rec_cid))
            .collect();
        let car = repo(&leaves, &[(rec_cid, rec)], &key);
        let r = verify_repo(&car, Some(&key.public_key())).unwrap();
        assert_eq!(r.records, 50);
        let mut reader = CarReader::new();
        let parsed = reader.read(&car, &CarOptions::repository()).unwrap();
        assert_eq!(list_records(&parsed).unwrap(), leaves);
        let info = inspect(&parsed).unwrap();
        assert_eq!(
            (info.did.as_str(), info.version, info.prev),
            ("did:plc:x", 3, None)
        );
        // Without the record block.
        let car = repo(&leaves, &[], &key);
        assert!(matches!(
            verify_repo(&car, None),
            Err(RepoError::MissingRecord { .. })
        ));
        let r = verify_repo_with(
            &car,
            None,
            &RepoOptions {
                allow_missing_records: true,
            },
        )
        .unwrap();
        assert_eq!(r.missing_records, 50);
    }

    #[test]
    fn the_first_missing_record_in_walk_order_is_named() {
        // Each leaf with its own record, some records dropped: early, in the middle, last, and
        // two out of key order; the error names the first in walk (key) order, and
        // `allow_missing_records` counts them all.
        let key = PrivateKey::from_bytes(Curve::Secp256k1, &[1; 32]).unwrap();
        let (records, leaves) = numbered(100, "app.bsky.feed.like", |i| i);
        let allow = RepoOptions {
            allow_missing_records: true,
        };
        for dropped in [
            vec![],
            vec![0],
            vec![37, 80],
            vec![80, 37, 3],
            vec![95],
            vec![99],
        ] {
            let kept: Vec<(CidBuf, Vec<u8>)> = records
                .iter()
                .enumerate()
                .filter(|(i, _)| !dropped.contains(i))
                .map(|(_, r)| r.clone())
                .collect();
            let car = repo(&leaves, &kept, &key);
            let r = verify_repo_with(&car, None, &allow).unwrap();
            assert_eq!((r.records, r.missing_records), (100, dropped.len()));
            match (dropped.iter().min(), verify_repo(&car, None)) {
                (None, Ok(r)) => assert_eq!(r.missing_records, 0),
                (Some(&first), Err(RepoError::MissingRecord { key, cid })) => {
                    assert_eq!((key, cid), leaves[first].clone(), "{dropped:?}")
                }
                (_, other) => panic!("{dropped:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn record_checks_do_not_depend_on_block_order() {
        // The record check guesses that a record follows the previous one in the CAR; the
        // verdict must not depend on the CAR's order. Records in key order, reversed, shuffled,
        // two leaves sharing a record, and records dropped here and there: every order gives the
        // counts and the first missing record (in walk order) of the in-order CAR.
        let key = PrivateKey::from_bytes(Curve::Secp256k1, &[1; 32]).unwrap();
        // Leaves 100 and 101 point to the same record.
        let (records, leaves) = numbered(
            300,
            "app.bsky.feed.like",
            |i| if i == 101 { 100 } else { i },
        );
        let allow = RepoOptions {
            allow_missing_records: true,
        };
        let mut shuffled: Vec<usize> = (0..records.len()).collect();
        let mut x = 7u64;
        for i in (1..shuffled.len()).rev() {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            shuffled.swap(i, (x >> 33) as usize % (i + 1));
        }
        let orders: [Vec<usize>; 4] = [
            (0..records.len()).collect(),
            (0..records.len()).rev().collect(),
            shuffled,
            // In order, but every tenth record moved to the end.
            (0..records.len())
                .filter(|i| i % 10 != 3)
                .chain((0..records.len()).filter(|i| i % 10 == 3))
                .collect(),
        ];
        let mut checked = 0;
        for dropped in [
            vec![],
            vec![0],
            vec![5, 6, 7],
            vec![100],
            vec![101],
            vec![150, 299],
        ] {
            // The record of leaves 100 and 101 is one block: dropping either drops both.
            let gone = |i: usize| {
                dropped.contains(&i)
                    || (i == 101 && dropped.contains(&100))
                    || (i == 100 && dropped.contains(&101))
            };
            let missing: Vec<usize> = (0..leaves.len()).filter(|&i| gone(i)).collect();
            for order in &orders {
                let kept: Vec<(CidBuf, Vec<u8>)> = order
                    .iter()
                    .filter(|&&i| !gone(i) && i != 101)
                    .map(|&i| records[i].clone())
                    .collect();
                let car = repo(&leaves, &kept, &key);
                let r = verify_repo_with(&car, None, &allow).unwrap();
                assert_eq!((r.records, r.missing_records), (300, missing.len()));
                match (missing.first(), verify_repo(&car, None)) {
                    (None, Ok(r)) => assert_eq!(r.missing_records, 0),
                    (Some(&first), Err(RepoError::MissingRecord { key, cid })) => {
                        assert_eq!((key, cid), leaves[first].clone(), "{dropped:?}")
                    }
                    (_, other) => panic!("{dropped:?}: {other:?}"),
                }
                checked += 1;
            }
        }
        assert_eq!(checked, 24);
    }

    /// [`repo`] with one MST node (post-order index) left out, and the blocks in CID order (as a
    /// PDS exports them) if `cid_order`.
    fn repo_in(
        leaves: &[(String, CidBuf)],
        records: &[(CidBuf, Vec<u8>)],
        key: &PrivateKey,
        drop_node: Option<usize>,
        cid_order: bool,
    ) -> Vec<u8> {
        let car = repo(leaves, records, key);
        let mut reader = CarReader::new();
        let parsed = reader.read(&car, &CarOptions::repository()).unwrap();
        let (_, nodes) = crate::mst::build(leaves).unwrap();
        assert_eq!(parsed.roots().len(), 1);
        let dropped = drop_node.map(|i| nodes[i].0);
        let mut blocks: Vec<(CidBuf, &[u8])> = parsed
            .blocks()
            .map(|b| (b.cid.to_buf(), b.data))
            .filter(|(c, _)| Some(*c) != dropped)
            .collect();
        assert_eq!(blocks.len() + usize::from(dropped.is_some()), parsed.len());
        if cid_order {
            blocks.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
        }
        let root = parsed.roots().next().unwrap().to_buf();
        write_car(&[root], blocks.iter().map(|(c, d)| (c.as_cid(), *d)))
    }

    #[test]
    fn cid_order_pipelined_record_checks_give_the_same_verdicts() {
        // In CID order every record check misses the in-order guess and goes through the
        // pipeline (checked several leaves after it was visited, and the rest after the walk):
        // the counts and the first missing record in walk order are those of the key-order CAR,
        // including records dropped at the very start and among the last (checked by the final
        // drain); and a missing MST node is reported as such, ahead of any missing record, in
        // both orders.
        let key = PrivateKey::from_bytes(Curve::Secp256k1, &[1; 32]).unwrap();
        let (records, leaves) = numbered(400, "app.bsky.feed.post", |i| i);
        let allow = RepoOptions {
            allow_missing_records: true,
        };
        let mut checked = 0;
        for dropped in [
            vec![],
            vec![0],
            vec![1, 2, 3, 200],
            vec![399],
            vec![390, 17],
            (0..400).step_by(3).collect::<Vec<usize>>(),
        ] {
            let kept: Vec<(CidBuf, Vec<u8>)> = records
                .iter()
                .enumerate()
                .filter(|(i, _)| !dropped.contains(i))
                .map(|(_, r)| r.clone())
                .collect();
            for cid_order in [false, true] {
                let car = repo_in(&leaves, &kept, &key, None, cid_order);
                let r = verify_repo_with(&car, None, &allow).unwrap();
                assert_eq!((r.records, r.missing_records), (400, dropped.len()));
                match (dropped.iter().min(), verify_repo(&car, None)) {
                    (None, Ok(r)) => assert_eq!(r.missing_records, 0),
                    (Some(&first), Err(RepoError::MissingRecord { key, cid })) => {
                        assert_eq!((key, cid), leaves[first].clone(), "{dropped:?}")
                    }
                    (_, other) => panic!("{dropped:?} {cid_order}: {other:?}"),
                }
                checked += 1;
            }
        }
        assert_eq!(checked, 12);

        let (_, nodes) = crate::mst::build(&leaves).unwrap();
        assert!(nodes.len() > 3, "{}", nodes.len());
        let kept: Vec<(CidBuf, Vec<u8>)> = records[1..].to_vec();
        for node in [0, nodes.len() / 2, nodes.len() - 2] {
            let mut verdicts = Vec::new();
            for cid_order in [false, true] {
                let car = repo_in(&leaves, &kept, &key, Some(node), cid_order);
                for opts in [RepoOptions::default(), allow] {
                    let e = verify_repo_with(&car, None, &opts).unwrap_err();
                    assert_eq!(
                        e,
                        RepoError::Mst(crate::error::MstError::MissingBlock(nodes[node].0)),
                        "{node} {cid_order}"
                    );
                    verdicts.push(e);
                }
            }
            assert_eq!(verdicts.len(), 4);
        }
    }

    #[test]
    fn visiting_gives_every_record_as_listed_with_its_block() {
        // In key order and in CID order (a PDS's): the leaves visited are `list_records`'
        // listing, each with its block; a failed verification still ends in its error.
        let key = PrivateKey::from_bytes(Curve::Secp256k1, &[1; 32]).unwrap();
        let (records, leaves) = numbered(300, "app.bsky.feed.post", |i| i);
        for cid_order in [false, true] {
            let car = repo_in(&leaves, &records, &key, None, cid_order);
            let mut seen = Vec::new();
            let r = verify_repo_visiting(
                &car,
                Some(&key.public_key()),
                &RepoOptions::default(),
                &mut Progress::default(),
                |c, k, cid| {
                    let block = c.get(cid).unwrap();
                    assert_eq!(CidBuf::sha256(DAG_CBOR, block), cid.to_buf());
                    seen.push((String::from_utf8(k.to_vec()).unwrap(), cid.to_buf()));
                },
            )
            .unwrap();
            assert_eq!(r.records, 300);
            assert_eq!(seen, leaves, "cid order {cid_order}");
        }
        let other = PrivateKey::from_bytes(Curve::Secp256k1, &[2; 32]).unwrap();
        let car = repo_in(&leaves, &records, &key, None, false);
        let e = verify_repo_visiting(
            &car,
            Some(&other.public_key()),
            &RepoOptions::default(),
            &mut Progress::default(),
            |_, _, _| panic!("no walk after a bad signature"),
        );
        assert!(matches!(e, Err(RepoError::Signature(_))), "{e:?}");
    }

    #[test]
    fn not_a_car() {
        assert!(matches!(verify_repo(b"nope", None), Err(RepoError::Car(_))));
        let empty_roots = write_car(&[], std::iter::empty());
        assert_eq!(
            verify_repo(&empty_roots, None).unwrap_err(),
            RepoError::NoRoot
        );
    }

    #[test]
    fn a_failed_verification_reports_how_far_it_got() {
        let key = PrivateKey::from_bytes(Curve::Secp256k1, &[1; 32]).unwrap();
        let other = PrivateKey::from_bytes(Curve::Secp256k1, &[2; 32]).unwrap();
        let car = repo(&[], &[], &key);
        let mut p = Progress::default();
        let r = verify_repo_traced(
            &car,
            Some(&other.public_key()),
            &RepoOptions::default(),
            &mut p,
        );
        assert!(matches!(r, Err(RepoError::Signature(_))), "{r:?}");
        assert_eq!(p.did.as_deref(), Some("did:plc:x"));
        assert_eq!(p.blocks, Some(2));
        assert!(p.signature_checked, "the check ran, and failed");
        assert_eq!(p.timings.walk, Duration::ZERO, "the walk never ran");

        let mut p = Progress::default();
        assert!(verify_repo_traced(b"nope", None, &RepoOptions::default(), &mut p).is_err());
        assert_eq!((p.did, p.blocks, p.signature_checked), (None, None, false));
    }
}
