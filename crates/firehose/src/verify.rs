//! Verifying firehose frames: one typed [`Verdict`] per frame, with the reason when it is not ok.
//!
//! Why: a relay, an AppView or a Jetstream server that trusts what it is sent can be fed forged
//! records. Under Sync 1.1 (<https://atproto.com/specs/sync>) every `#commit` frame carries what
//! is needed to check it without any state: the signed commit block, the MST nodes around every
//! changed key, and `prevData`, the MST root before the commit. A [`Verifier`] checks all of it:
//!
//! 1. the frame decodes strictly and every CAR block hashes to its CID ([`FrameDecoder`];
//!    failures map through [`FrameError::class`]); each block is then decoded strictly exactly
//!    once, by whoever reads it: the commit and the MST nodes by `riptide-repo`, the created and
//!    updated records here. (Decoding every block up front as well cost a second decode of most
//!    of them.) A block nothing refers to is hash-checked only: nothing downstream reads it;
//! 2. limits: at most [`MAX_OPS`] ops and [`MAX_BLOCKS_BYTES`] of `blocks` (and
//!    [`MAX_RECORD_BYTES`] per created or updated record, checked where step 5 reads the records,
//!    before each is decoded);
//! 3. the commit block is present, decodes, names the frame's `repo` and `rev`, and `rev` (a TID)
//!    is later than `since`;
//! 4. its signature verifies with the account's key (SHA-256 of the commit re-encoded without
//!    `sig`, strict low-S ECDSA), keys coming from a [`KeyLookup`] through a per-DID cache of
//!    parsed keys;
//! 5. the proof: created and updated records are in the new tree (and in the CAR), deleted ones are
//!    not, and undoing every op on the partial tree gives `prevData`
//!    (`riptide_repo::verify_commit_proof`).
//!
//! A `#sync` frame's commit is checked the same way (steps 1, 3, 4). Other well-formed frames are
//! `ok`; an `#identity` frame also drops the account's cached key, since it announces that the DID
//! document may have changed. That is why frames of one DID must be verified in order, by one
//! verifier: callers that spread frames over threads keep each DID on one thread.
//!
//! Then, unless the verifier is [`Verifier::stateless`], the frame is checked against the
//! account's chain state ([`crate::chain`]: `rev` against the stored rev and the clock, `since`
//! and `prevData` against the stored rev and MST root, the hosting status), kept in a
//! [`ChainStore`] (in memory by default; [`Verifier::with_chain`] for a durable one). A frame that
//! fails a stateless check never reaches the chain and changes no state.
//!
//! What it does not do: resolve DIDs (the [`KeyLookup`] does), or resynchronize an account whose
//! chain broke (the caller does, with the state it reads from its store).
//!
//! Cost: measured on the real capture (release, 2-core Xeon VM), ~58 us a commit frame on one
//! thread: the signature ~27 us (secp256k1; P-256 ~60 us), decoding with the SHA-256 of every block
//! ~7 us, the proof the rest. A warm verifier allocates per commit only for the op list and the
//! proof's partial tree (and for the reason, when a frame fails).

use std::collections::HashMap;
use std::fmt;

use riptide_cbor::{Arena, Cid, CidBuf, Kind, Options};
use riptide_crypto::{PublicKey, VerifyError};
use riptide_repo::{
    is_tid, rev_is_newer, verify_commit_proof_in, Commit, CommitError, ProofClass, ProofError,
    ProofOp, Tree,
};

use riptide_car::Car;

use crate::chain::{
    apply_account, check_commit, check_sync, ChainFailure, ChainStore, CommitClaim, MemoryChain,
    NoChain,
};
use crate::error::{FrameError, FrameErrorKind};
use crate::frame::{Body, DecodeOptions, Frame, FrameDecoder};

/// Most ops a `#commit` may carry (the relay limit of Sync 1.1).
pub const MAX_OPS: usize = 200;
/// Largest `blocks` CAR a `#commit` may carry: the sync spec's hard limit of 2,000,000 bytes.
pub const MAX_BLOCKS_BYTES: usize = 2_000_000;
/// Largest record block a `#commit`'s op may point to: the sync spec's hard limit of 1,000,000
/// bytes.
pub const MAX_RECORD_BYTES: usize = 1_000_000;

/// The verdict on one frame. Stable names ([`Verdict::as_str`]) are a contract of the CLI.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Verdict {
    /// Everything checked out (or there was nothing to check).
    Ok,
    /// The commit's signature does not verify with the account's key (or is high-S, or not 64
    /// bytes).
    BadSignature,
    /// A CAR block's bytes do not hash to its CID.
    BadBlockCid,
    /// A block the proof needs (commit, MST node, created record) is not in the CAR.
    MissingBlock,
    /// Undoing the ops does not give `prevData`.
    InversionMismatch,
    /// Anything else wrong with the frame, the commit or the ops.
    Malformed,
    /// Over a limit (ops, bytes, nesting).
    Limits,
    /// No usable key for the DID.
    UnknownKey,
    /// Chain state: `rev` at or below the account's stored rev (a replay or rollback).
    RevRegression,
    /// Chain state: `rev` more than five minutes in the future.
    FutureRev,
    /// Chain state: `since` or `prevData` does not follow the stored state (commits missing).
    ChainBreak,
    /// Chain state: a commit for an account that is not active.
    AccountInactive,
    /// Resync (`riptide serve`): the frame arrived while its account was being resynced and the
    /// account's buffer was full; it was dropped (its account will break its chain again and be
    /// resynced again).
    ResyncOverflow,
    /// Resync (`riptide serve`): one attempt to fetch and verify a desynchronized account's
    /// repository failed (counted per attempt; it is retried with backoff, and the account's
    /// buffered frames wait, never served unverified).
    ResyncFailed,
    /// Chain state: `rev` at or below the rev of the repository the account's state was taken
    /// from (a resync, a backfill, an upstream `#sync`): the commit is inside that repository
    /// already, as a catch-up replay meets after a resync; refused, nothing of it is lost.
    Superseded,
}

impl Verdict {
    /// How many verdicts there are.
    pub const COUNT: usize = 15;

    /// Every verdict, in counting order.
    pub const ALL: [Verdict; Verdict::COUNT] = [
        Verdict::Ok,
        Verdict::BadSignature,
        Verdict::BadBlockCid,
        Verdict::MissingBlock,
        Verdict::InversionMismatch,
        Verdict::Malformed,
        Verdict::Limits,
        Verdict::UnknownKey,
        Verdict::RevRegression,
        Verdict::FutureRev,
        Verdict::ChainBreak,
        Verdict::AccountInactive,
        Verdict::ResyncOverflow,
        Verdict::ResyncFailed,
        Verdict::Superseded,
    ];

    /// `ok`, `bad-signature`, `bad-block-cid`, `missing-block`, `inversion-mismatch`, `malformed`,
    /// `limits`, `unknown-key`; from chain state, `rev-regression`, `future-rev`, `chain-break`,
    /// `account-inactive`; from `riptide serve`'s resync, `resync-overflow`, `resync-failed`.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Ok => "ok",
            Verdict::BadSignature => "bad-signature",
            Verdict::BadBlockCid => "bad-block-cid",
            Verdict::MissingBlock => "missing-block",
            Verdict::InversionMismatch => "inversion-mismatch",
            Verdict::Malformed => "malformed",
            Verdict::Limits => "limits",
            Verdict::UnknownKey => "unknown-key",
            Verdict::RevRegression => "rev-regression",
            Verdict::FutureRev => "future-rev",
            Verdict::ChainBreak => "chain-break",
            Verdict::AccountInactive => "account-inactive",
            Verdict::ResyncOverflow => "resync-overflow",
            Verdict::ResyncFailed => "resync-failed",
            Verdict::Superseded => "superseded",
        }
    }

    /// The verdict of a frame that does not decode: its [`FrameError::class`], with truncation
    /// counted as malformed.
    pub fn of_frame_error(e: &FrameError) -> Verdict {
        match e.class() {
            "bad-block-cid" => Verdict::BadBlockCid,
            "limits" => Verdict::Limits,
            _ => Verdict::Malformed,
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Counts of each verdict.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VerdictCounts([u64; Verdict::COUNT]);

impl VerdictCounts {
    /// All zero.
    pub fn new() -> VerdictCounts {
        VerdictCounts::default()
    }

    /// Counts one verdict.
    pub fn add(&mut self, v: Verdict) {
        self.0[v.index()] += 1;
    }

    /// How many of this verdict.
    pub fn get(&self, v: Verdict) -> u64 {
        self.0[v.index()]
    }

    /// Adds another set of counts.
    pub fn merge(&mut self, other: &VerdictCounts) {
        for (a, b) in self.0.iter_mut().zip(other.0) {
            *a += b;
        }
    }

    /// All frames counted.
    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }

    /// Frames whose verdict is not `ok`.
    pub fn failed(&self) -> u64 {
        self.total() - self.get(Verdict::Ok)
    }

    /// Every verdict with its count (zeros included), in [`Verdict::ALL`] order.
    pub fn iter(&self) -> impl Iterator<Item = (Verdict, u64)> + '_ {
        Verdict::ALL.iter().map(|&v| (v, self.get(v)))
    }
}

impl fmt::Display for VerdictCounts {
    /// `ok 148, bad-signature 2` (non-zero counts only; `ok 0` when nothing was counted).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for (v, n) in self.iter().filter(|&(v, n)| n > 0 || v == Verdict::Ok) {
            if !first {
                f.write_str(", ")?;
            }
            first = false;
            write!(f, "{v} {n}")?;
        }
        Ok(())
    }
}

/// Why no key is available for a DID.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyUnavailable {
    /// Nothing is known about the DID.
    Unknown,
    /// Its DID document has no usable signing key (why, in words).
    Unusable(String),
}

impl fmt::Display for KeyUnavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyUnavailable::Unknown => f.write_str("no DID document for the account"),
            KeyUnavailable::Unusable(why) => write!(f, "no usable signing key: {why}"),
        }
    }
}

/// Where a [`Verifier`] gets account signing keys. Called once per DID (results are cached until
/// the DID's next `#identity` frame), so it may parse.
pub trait KeyLookup {
    /// The signing key of `did`.
    fn key(&self, did: &str) -> Result<PublicKey, KeyUnavailable>;
}

impl<K: KeyLookup + ?Sized> KeyLookup for &K {
    fn key(&self, did: &str) -> Result<PublicKey, KeyUnavailable> {
        (**self).key(did)
    }
}

impl<S: std::hash::BuildHasher> KeyLookup for HashMap<String, PublicKey, S> {
    fn key(&self, did: &str) -> Result<PublicKey, KeyUnavailable> {
        self.get(did).cloned().ok_or(KeyUnavailable::Unknown)
    }
}

/// Why a frame did not verify: the typed reason behind a [`Verdict`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Failure {
    /// The frame does not decode (or a block does not hash to its CID).
    Frame(FrameError),
    /// More than [`MAX_OPS`] ops.
    TooManyOps(usize),
    /// `blocks` larger than [`MAX_BLOCKS_BYTES`].
    BlocksTooLarge(usize),
    /// A record block (an op's new record) larger than [`MAX_RECORD_BYTES`].
    RecordTooLarge {
        /// The op's path.
        path: String,
        /// The block's size.
        bytes: usize,
    },
    /// A `tooBig` commit without blocks: nothing to verify (not sent under Sync 1.1).
    TooBig,
    /// The commit block named by the frame is not in its CAR.
    CommitMissing(CidBuf),
    /// A `#sync` frame's CAR has no root.
    NoRoot,
    /// A `#commit` frame's CAR is not rooted at its commit.
    RootNotCommit,
    /// The commit block is not a commit.
    Commit(CommitError),
    /// The commit disagrees with the frame (`did` vs `repo`, `rev` vs `rev`).
    Mismatch {
        /// Which field.
        field: &'static str,
        /// The frame's value.
        frame: String,
        /// The commit's value.
        commit: String,
    },
    /// `rev` or `since` is not a TID.
    NotATid(&'static str),
    /// `rev` is not later than `since`.
    RevNotAfterSince {
        /// The commit's revision.
        rev: String,
        /// The frame's `since`.
        since: String,
    },
    /// No `prevData`: not a Sync 1.1 commit, so the ops cannot be proven.
    NoPrevData,
    /// No usable key for the account.
    Key(KeyUnavailable),
    /// The signature does not verify.
    Signature(VerifyError),
    /// The Sync 1.1 proof does not verify (boxed: the largest reason, and the rarest).
    Proof(Box<ProofError>),
    /// The frame verifies on its own but is not the account's next (chain state).
    Chain(ChainFailure),
}

impl Failure {
    /// The verdict this failure means.
    pub fn verdict(&self) -> Verdict {
        match self {
            Failure::Frame(e) => Verdict::of_frame_error(e),
            Failure::TooManyOps(_)
            | Failure::BlocksTooLarge(_)
            | Failure::RecordTooLarge { .. } => Verdict::Limits,
            Failure::CommitMissing(_) => Verdict::MissingBlock,
            Failure::Key(_) => Verdict::UnknownKey,
            Failure::Signature(_) => Verdict::BadSignature,
            Failure::Proof(p) => match p.class() {
                ProofClass::MissingBlock => Verdict::MissingBlock,
                ProofClass::InversionMismatch => Verdict::InversionMismatch,
                _ => Verdict::Malformed,
            },
            Failure::Chain(c) => match c {
                ChainFailure::RevRegression { .. } => Verdict::RevRegression,
                ChainFailure::Superseded { .. } => Verdict::Superseded,
                ChainFailure::FutureRev { .. } => Verdict::FutureRev,
                ChainFailure::ChainBreak { .. } => Verdict::ChainBreak,
                ChainFailure::AccountInactive(_) => Verdict::AccountInactive,
            },
            Failure::TooBig
            | Failure::NoRoot
            | Failure::RootNotCommit
            | Failure::Commit(_)
            | Failure::Mismatch { .. }
            | Failure::NotATid(_)
            | Failure::RevNotAfterSince { .. }
            | Failure::NoPrevData => Verdict::Malformed,
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Frame(e) => write!(f, "{e}"),
            Failure::TooManyOps(n) => write!(f, "{n} ops, more than the limit of {MAX_OPS}"),
            Failure::BlocksTooLarge(n) => write!(
                f,
                "blocks of {n} bytes, more than the limit of {MAX_BLOCKS_BYTES}"
            ),
            Failure::RecordTooLarge { path, bytes } => write!(
                f,
                "record {path} of {bytes} bytes, more than the limit of {MAX_RECORD_BYTES}"
            ),
            Failure::TooBig => f.write_str("tooBig commit without blocks: nothing to verify"),
            Failure::CommitMissing(cid) => write!(f, "commit block {cid} is not in the CAR"),
            Failure::NoRoot => f.write_str("the CAR has no root"),
            Failure::RootNotCommit => f.write_str("the CAR's root is not the frame's commit"),
            Failure::Commit(e) => write!(f, "commit: {e}"),
            Failure::Mismatch {
                field,
                frame,
                commit,
            } => {
                write!(f, "frame {field} {frame:?} but commit {field} {commit:?}")
            }
            Failure::NotATid(field) => write!(f, "{field} is not a TID"),
            Failure::RevNotAfterSince { rev, since } => {
                write!(f, "rev {rev} is not later than since {since}")
            }
            Failure::NoPrevData => {
                f.write_str("no prevData: not a Sync 1.1 commit, its ops cannot be proven")
            }
            Failure::Key(k) => write!(f, "{k}"),
            Failure::Signature(e) => write!(f, "signature: {e}"),
            Failure::Proof(e) => write!(f, "proof: {e}"),
            Failure::Chain(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for Failure {}

/// The outcome for one frame. `did` borrows the frame bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report<'f> {
    /// `commit`, `sync`, `identity`, `account`, `info`, `error`, `unknown`; `invalid` when the
    /// header does not decode.
    pub kind: &'static str,
    /// The relay sequence number, when the frame has one (and it could be read).
    pub seq: Option<i64>,
    /// The account DID, when the frame has one (and it could be read).
    pub did: Option<&'f str>,
    /// The verdict.
    pub verdict: Verdict,
    /// Why, when the verdict is not `ok`.
    pub failure: Option<Failure>,
}

/// Reusable verification state: a frame decoder, a per-DID cache of parsed keys, the accounts'
/// chain state (`C`, in memory by default), scratch buffers and running counts. One per thread;
/// keep each DID on one verifier (see the module docs).
#[derive(Debug)]
pub struct Verifier<K, C = MemoryChain> {
    keys: K,
    decoder: FrameDecoder,
    cache: HashMap<String, Result<PublicKey, KeyUnavailable>>,
    max_cached: usize,
    arena: Arena,
    buf: Vec<u8>,
    /// The proof's partial MST, reused from commit to commit (its buffers, not its contents).
    tree: Tree,
    counts: VerdictCounts,
    chain: C,
    /// The clock future revs are judged by (unix µs); `None`: the system clock.
    now_us: Option<u64>,
}

/// Keys cached before the cache is emptied (bounds memory on an endless stream).
const DEFAULT_MAX_CACHED: usize = 1 << 20;

impl<K: KeyLookup> Verifier<K> {
    /// A verifier with strict, fully verifying decoding that keeps every account's chain state in
    /// memory ([`MemoryChain`]): each frame is checked against the account's previous ones.
    pub fn new(keys: K) -> Verifier<K> {
        Verifier::with_chain(keys, MemoryChain::new())
    }
}

impl<K: KeyLookup> Verifier<K, NoChain> {
    /// A verifier that checks each frame on its own, with no chain state (`--stateless`): a
    /// replayed or out-of-order commit that is validly signed passes.
    pub fn stateless(keys: K) -> Verifier<K, NoChain> {
        Verifier::with_chain(keys, NoChain)
    }
}

impl<K: KeyLookup, C: ChainStore> Verifier<K, C> {
    /// A verifier keeping chain state in `chain`.
    pub fn with_chain(keys: K, chain: C) -> Verifier<K, C> {
        Verifier {
            keys,
            // Blocks are decoded by their readers (module docs, step 1), not all up front.
            decoder: FrameDecoder::with_options(DecodeOptions {
                decode_blocks: false,
                ..DecodeOptions::default()
            }),
            cache: HashMap::new(),
            max_cached: DEFAULT_MAX_CACHED,
            arena: Arena::new(),
            buf: Vec::new(),
            tree: Tree::new(),
            counts: VerdictCounts::new(),
            chain,
            now_us: None,
        }
    }

    /// Judges future revs by a fixed clock (unix µs) instead of the system's: for tests and for
    /// re-verifying an old capture as of its time.
    pub fn with_clock_us(mut self, now_us: u64) -> Verifier<K, C> {
        self.now_us = Some(now_us);
        self
    }

    /// The chain state.
    pub fn chain(&self) -> &C {
        &self.chain
    }

    /// The chain state, mutably (a durable store drains its updates here).
    pub fn chain_mut(&mut self) -> &mut C {
        &mut self.chain
    }

    /// Caps the key cache (it is emptied when full). At least 1.
    pub fn with_max_cached_keys(mut self, n: usize) -> Verifier<K, C> {
        self.max_cached = n.max(1);
        self
    }

    /// Verifies one frame and returns its verdict.
    pub fn verify(&mut self, frame: &[u8]) -> Verdict {
        self.check(frame).verdict
    }

    /// Verifies one frame and returns the full report.
    pub fn check<'f>(&mut self, bytes: &'f [u8]) -> Report<'f> {
        self.check_then(bytes, |_| ()).0
    }

    /// Verifies one frame and, when it is `ok`, hands the decoded frame to `then` (a server
    /// projecting what it verified decodes each frame once, not twice). The frame was decoded
    /// without decoding its blocks up front (module docs, step 1).
    pub fn check_then<'f, R>(
        &mut self,
        bytes: &'f [u8],
        then: impl FnOnce(&Frame<'_>) -> R,
    ) -> (Report<'f>, Option<R>) {
        let mut out = None;
        let Verifier {
            keys,
            decoder,
            cache,
            max_cached,
            arena,
            buf,
            tree,
            counts,
            chain,
            now_us,
        } = self;
        let report = match decoder.decode(bytes) {
            Ok(frame) => {
                let body = frame.body();
                let kind = body.kind();
                let seq = body.seq();
                let did = body.did().and_then(|d| rebase(bytes, d));
                let mut ctx = Ctx {
                    keys: &*keys,
                    cache,
                    max_cached: *max_cached,
                    arena: &mut *arena,
                    buf,
                    tree,
                };
                let failure = ctx
                    .check_frame(&frame)
                    .and_then(|checked| {
                        if chain.is_stateless() {
                            return Ok(());
                        }
                        let now = now_us.unwrap_or_else(system_now_us);
                        chain_step(chain, body, checked, now)
                    })
                    .err();
                let verdict = failure.as_ref().map_or(Verdict::Ok, Failure::verdict);
                if failure.is_none() {
                    out = Some(then(&frame));
                }
                Report {
                    kind,
                    seq,
                    did,
                    verdict,
                    failure,
                }
            }
            Err(e) => {
                let p = peek(arena, bytes);
                Report {
                    kind: p.kind,
                    seq: p.seq,
                    did: p.did,
                    verdict: Verdict::of_frame_error(&e),
                    failure: Some(Failure::Frame(e)),
                }
            }
        };
        counts.add(report.verdict);
        (report, out)
    }

    /// Verdicts counted so far.
    pub fn counts(&self) -> &VerdictCounts {
        &self.counts
    }

    /// Forgets the cached key of `did` (e.g. after learning its document changed).
    pub fn forget_key(&mut self, did: &str) {
        self.cache.remove(did);
    }

    /// Number of DIDs with a cached key (or cached absence of one).
    pub fn cached_keys(&self) -> usize {
        self.cache.len()
    }

    /// The key source.
    pub fn keys(&self) -> &K {
        &self.keys
    }
}

fn system_now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// What the stateless checks learned that the chain checks need.
enum Checked {
    /// A `#commit`: its `data`.
    Commit { data: CidBuf },
    /// A `#sync`: its commit's CID and `data`.
    Sync { commit: CidBuf, data: CidBuf },
    /// Anything else.
    Other,
}

/// Checks a frame that verified on its own against the account's chain state, and stores the
/// state that follows (see [`crate::chain`]).
fn chain_step<C: ChainStore>(
    chain: &mut C,
    body: &Body<'_>,
    checked: Checked,
    now_us: u64,
) -> Result<(), Failure> {
    let (did, (result, next)) = match (body, checked) {
        (Body::Commit(c), Checked::Commit { data }) => {
            let claim = CommitClaim {
                rev: c.rev,
                since: c.since,
                prev_data: c.prev_data,
                commit: c.commit,
                data: data.as_cid(),
            };
            (
                c.repo,
                check_commit(chain.get(c.repo).as_ref(), &claim, now_us),
            )
        }
        (Body::Sync(s), Checked::Sync { commit, data }) => (
            s.did,
            check_sync(
                chain.get(s.did).as_ref(),
                s.rev,
                commit.as_cid(),
                data.as_cid(),
                now_us,
            ),
        ),
        (Body::Account(a), _) => {
            let next = apply_account(chain.get(a.did).as_ref(), a.active, a.status);
            (a.did, (Ok(()), Some(next)))
        }
        _ => return Ok(()),
    };
    if let Some(next) = next {
        chain.put(did, next);
    }
    result.map_err(Failure::Chain)
}

/// The borrowed parts of a verifier that checking one decoded frame needs.
struct Ctx<'v, K> {
    keys: &'v K,
    cache: &'v mut HashMap<String, Result<PublicKey, KeyUnavailable>>,
    max_cached: usize,
    arena: &'v mut Arena,
    buf: &'v mut Vec<u8>,
    tree: &'v mut Tree,
}

impl<K: KeyLookup> Ctx<'_, K> {
    fn check_frame(&mut self, frame: &Frame<'_>) -> Result<Checked, Failure> {
        match frame.body() {
            Body::Commit(c) => {
                if c.op_count() > MAX_OPS {
                    return Err(Failure::TooManyOps(c.op_count()));
                }
                if c.blocks.len() > MAX_BLOCKS_BYTES {
                    // The CAR reader's own limit reports this first unless configured above it.
                    return Err(Failure::BlocksTooLarge(c.blocks.len()));
                }
                let car = frame.car().ok_or(Failure::TooBig)?;
                if car.roots().next() != Some(c.commit) {
                    return Err(Failure::RootNotCommit);
                }
                let block = car
                    .get(c.commit)
                    .ok_or_else(|| Failure::CommitMissing(c.commit.to_buf()))?;
                let commit = Commit::decode_with(self.arena, block).map_err(Failure::Commit)?;
                check_commit_fields(&commit, c.repo, c.rev)?;
                if let Some(since) = c.since {
                    if !is_tid(since) {
                        return Err(Failure::NotATid("since"));
                    }
                    if !rev_is_newer(c.rev, since) {
                        return Err(Failure::RevNotAfterSince {
                            rev: c.rev.to_owned(),
                            since: since.to_owned(),
                        });
                    }
                }
                let prev_data = c.prev_data.ok_or(Failure::NoPrevData)?;
                self.check_signature(&commit)?;
                let ops = c.proof_ops();
                check_records(self.arena, frame, car, &ops)?;
                verify_commit_proof_in(self.tree, car, c.commit, &ops, Some(prev_data))
                    .map_err(|e| Failure::Proof(Box::new(e)))?;
                Ok(Checked::Commit {
                    data: commit.data().to_buf(),
                })
            }
            Body::Sync(s) => {
                let car = frame.car().ok_or(Failure::NoRoot)?;
                let root: Cid<'_> = car.roots().next().ok_or(Failure::NoRoot)?;
                let block = car
                    .get(root)
                    .ok_or_else(|| Failure::CommitMissing(root.to_buf()))?;
                let commit = Commit::decode_with(self.arena, block).map_err(Failure::Commit)?;
                check_commit_fields(&commit, s.did, s.rev)?;
                self.check_signature(&commit)?;
                Ok(Checked::Sync {
                    commit: root.to_buf(),
                    data: commit.data().to_buf(),
                })
            }
            Body::Identity(i) => {
                // The DID document may have changed: look the key up again next time.
                self.cache.remove(i.did);
                Ok(Checked::Other)
            }
            Body::Account(_) | Body::Info(_) | Body::Error(_) | Body::Unknown { .. } => {
                Ok(Checked::Other)
            }
        }
    }

    fn check_signature(&mut self, commit: &Commit<'_>) -> Result<(), Failure> {
        let did = commit.did();
        if !self.cache.contains_key(did) {
            if self.cache.len() >= self.max_cached {
                self.cache.clear();
            }
            let found = self.keys.key(did);
            self.cache.insert(did.to_owned(), found);
        }
        match self.cache.get(did) {
            Some(Ok(key)) => commit
                .verify_signature_with(key, self.buf)
                .map_err(Failure::Signature),
            Some(Err(e)) => Err(Failure::Key(e.clone())),
            None => Err(Failure::Key(KeyUnavailable::Unknown)),
        }
    }
}

/// Strictly decodes every created or updated record present in the CAR (absent ones are the
/// proof's `missing-block`), after checking it against [`MAX_RECORD_BYTES`]. A record that is
/// not strict DAG-CBOR fails the frame as a block that does not decode would.
fn check_records(
    arena: &mut Arena,
    frame: &Frame<'_>,
    car: &Car<'_>,
    ops: &[ProofOp<'_>],
) -> Result<(), Failure> {
    for op in ops {
        let Some(cid) = op.cid else { continue };
        let Some(i) = car.position(cid.as_cid()) else {
            continue;
        };
        let Some(block) = car.block(i) else { continue };
        // The spec's per-record limit, before the record is decoded.
        if block.data.len() > MAX_RECORD_BYTES {
            return Err(Failure::RecordTooLarge {
                path: op.path.to_owned(),
                bytes: block.data.len(),
            });
        }
        let mut tape = arena.tape(block.data);
        if let Err(e) = tape.decode(0..block.data.len(), &Options::strict()) {
            let at = block.data.as_ptr() as usize - frame.bytes().as_ptr() as usize + e.offset();
            return Err(Failure::Frame(FrameError::new(
                FrameErrorKind::BlockCbor(i, e.kind()),
                at,
            )));
        }
    }
    Ok(())
}

fn check_commit_fields(commit: &Commit<'_>, did: &str, rev: &str) -> Result<(), Failure> {
    if commit.did() != did {
        return Err(Failure::Mismatch {
            field: "did",
            frame: did.to_owned(),
            commit: commit.did().to_owned(),
        });
    }
    if commit.rev() != rev {
        return Err(Failure::Mismatch {
            field: "rev",
            frame: rev.to_owned(),
            commit: commit.rev().to_owned(),
        });
    }
    if !is_tid(rev) {
        return Err(Failure::NotATid("rev"));
    }
    Ok(())
}

/// `s` (a slice of `bytes`) re-borrowed with the lifetime of `bytes`.
fn rebase<'f>(bytes: &'f [u8], s: &str) -> Option<&'f str> {
    std::str::from_utf8(bytes.get(range_within(bytes, s.as_bytes())?)?).ok()
}

/// Where `part` is in `whole`, when it is a slice of it: the decoders borrow every string from
/// the frame, so a DID from [`peek`] (or any decoded text) can be kept as a range of the frame's
/// bytes rather than copied. `None` when `part` is not inside `whole`.
pub fn range_within(whole: &[u8], part: &[u8]) -> Option<std::ops::Range<usize>> {
    let start = (part.as_ptr() as usize).checked_sub(whole.as_ptr() as usize)?;
    let end = start.checked_add(part.len())?;
    (end <= whole.len()).then_some(start..end)
}

/// What can be read of a frame that does not fully decode: kind, seq and DID, each if possible.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Peek<'f> {
    /// As in [`Report::kind`]; `invalid` when the header does not decode.
    pub kind: &'static str,
    /// The payload's `seq`, if readable.
    pub seq: Option<i64>,
    /// The payload's `repo` (commits) or `did`, if readable.
    pub did: Option<&'f str>,
}

/// Reads the header and payload of a frame (not its CAR) for its kind, `seq` and DID: cheap, for
/// reporting frames that fail and for routing frames to threads by DID. Never fails: what cannot
/// be read is `None` (kind `invalid`).
pub fn peek<'f>(arena: &mut Arena, bytes: &'f [u8]) -> Peek<'f> {
    let mut p = Peek {
        kind: "invalid",
        seq: None,
        did: None,
    };
    let opts = Options::strict();
    let mut tape = arena.tape(bytes);
    let Ok((header, end)) = tape.decode_prefix(0..bytes.len(), &opts) else {
        return p;
    };
    let payload = tape.decode(end..bytes.len(), &opts).ok();
    let doc = tape.finish();
    let h = doc.value(header);
    if h.kind() != Kind::Map {
        return p;
    }
    p.kind = match (
        h.get("op").and_then(|v| v.as_i64()),
        h.get("t").and_then(|v| v.as_str()),
    ) {
        (Some(-1), _) => "error",
        (Some(1), Some("#commit")) => "commit",
        (Some(1), Some("#sync")) => "sync",
        (Some(1), Some("#identity")) => "identity",
        (Some(1), Some("#account")) => "account",
        (Some(1), Some("#info")) => "info",
        (Some(1), Some(_)) => "unknown",
        _ => "invalid",
    };
    if let Some(payload) = payload
        .map(|i| doc.value(i))
        .filter(|v| v.kind() == Kind::Map)
    {
        p.seq = payload.get("seq").and_then(|v| v.as_i64());
        let did = if p.kind == "commit" {
            payload.get("repo")
        } else {
            payload.get("did")
        };
        p.did = did.and_then(|v| v.as_str()).and_then(|d| rebase(bytes, d));
    }
    p
}

/// The payload's `time` (the relay's RFC 3339 timestamp of the event), if the frame has a
/// readable one: read as [`peek`] reads the rest, for the few frames whose age matters (a
/// consumer deciding whether a frame at or below its cursor is one it already holds).
pub fn peek_time<'f>(arena: &mut Arena, bytes: &'f [u8]) -> Option<&'f str> {
    let opts = Options::strict();
    let mut tape = arena.tape(bytes);
    let (_, end) = tape.decode_prefix(0..bytes.len(), &opts).ok()?;
    let payload = tape.decode(end..bytes.len(), &opts).ok()?;
    let doc = tape.finish();
    let t = doc.value(payload).get("time")?.as_str()?;
    rebase(bytes, t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_within_finds_slices_and_only_slices() {
        let whole = b"0123456789".to_vec();
        assert_eq!(range_within(&whole, &whole[3..7]), Some(3..7));
        assert_eq!(range_within(&whole, &whole[10..]), Some(10..10));
        assert_eq!(range_within(&whole, &whole), Some(0..10));
        let elsewhere = b"3456".to_vec();
        assert_eq!(range_within(&whole, &elsewhere), None);
        assert_eq!(
            range_within(&whole[2..5], &whole[1..3]),
            None,
            "starts before"
        );
        assert_eq!(range_within(&whole[2..5], &whole[3..7]), None, "ends after");
    }

    #[test]
    fn verdict_names_are_the_contract() {
        let names: Vec<&str> = Verdict::ALL.iter().map(|v| v.as_str()).collect();
        assert_eq!(
            names,
            [
                "ok",
                "bad-signature",
                "bad-block-cid",
                "missing-block",
                "inversion-mismatch",
                "malformed",
                "limits",
                "unknown-key",
                "rev-regression",
                "future-rev",
                "chain-break",
                "account-inactive",
                "resync-overflow",
                "resync-failed",
                "superseded"
            ]
        );
        for (i, v) in Verdict::ALL.iter().enumerate() {
            assert_eq!(v.index(), i);
        }
    }

    #[test]
    fn counts_add_merge_and_print() {
        let mut c = VerdictCounts::new();
        assert_eq!(c.to_string(), "ok 0");
        c.add(Verdict::Ok);
        c.add(Verdict::Limits);
        c.add(Verdict::Limits);
        let mut d = c;
        d.merge(&c);
        assert_eq!((d.total(), d.failed(), d.get(Verdict::Limits)), (6, 4, 4));
        assert_eq!(d.to_string(), "ok 2, limits 4");
        assert_eq!(d.iter().count(), Verdict::COUNT);
    }

    #[test]
    fn peek_never_fails() {
        let mut arena = Arena::new();
        for junk in [&[][..], &[0xff], &[0xa0], &[0xa1, 0x62, b'o', b'p', 0x01]] {
            let p = peek(&mut arena, junk);
            assert_eq!((p.seq, p.did), (None, None));
        }
        // {op: 1, t: "#identity"} then {did: "did:plc:x", seq: 5}
        let frame = [
            &[0xa2, 0x61, b't', 0x69][..],
            b"#identity",
            &[0x62, b'o', b'p', 0x01, 0xa2, 0x63, b'd', b'i', b'd', 0x69],
            b"did:plc:x",
            &[0x63, b's', b'e', b'q', 0x05],
        ]
        .concat();
        let p = peek(&mut arena, &frame);
        assert_eq!(
            p,
            Peek {
                kind: "identity",
                seq: Some(5),
                did: Some("did:plc:x")
            }
        );
    }
}
