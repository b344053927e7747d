//! Per-account chain state (Sync 1.1): is this commit the account's *next* commit?
//!
//! Why: a frame that verifies on its own proves only that the account signed it at some point. A
//! relay (or anything between it and us) can replay an old signed commit, roll an account back
//! with an old `#sync`, or drop commits, and each of those frames still verifies. The sync spec
//! (<https://atproto.com/specs/sync>) asks a consumer to keep, per account, the latest `rev`, the
//! commit CID and the MST root (`data`), and to check every commit against them. This module holds
//! that state ([`AccountState`]), the checks ([`check_commit`], [`check_sync`],
//! [`apply_account`]) as pure functions, the [`ChainStore`] the [`crate::verify::Verifier`] reads
//! and writes it through, and a compact binary encoding for stores that keep it on disk. It does
//! no I/O.
//!
//! The checks, in order, on a `#commit` that already verified on its own (signature, proof):
//!
//! | check | verdict | state after |
//! |---|---|---|
//! | the account's last `#account` said it is not active | `account-inactive` | unchanged |
//! | `rev` at or below the stored `rev` | `rev-regression` | unchanged (the spec: ignore it) |
//! | `rev` more than [`MAX_FUTURE_REV`] ahead of the clock (the TID's timestamp) | `future-rev` | unchanged |
//! | `since` ≠ stored `rev`, or `prevData` ≠ stored `data` | `chain-break` | re-established at this commit, `desynchronized` |
//! | otherwise | `ok` | this commit |
//!
//! A DID seen for the first time has no state: its first valid commit establishes it. A `#sync`
//! resets the state to its commit (after the rev checks: an old `#sync` must not roll an account
//! back; the same commit again is a no-op) and marks the account `synchronized`. An `#account`
//! sets the hosting status. Frames that fail their stateless checks change nothing.
//!
//! **What follows a chain break.** The breaking commit is refused (not served: its ops are not
//! known to follow the ops a consumer has), but it is signed by the account, so its `rev`, commit
//! and `data` are authentic: the chain is *re-established* at it and the account is marked
//! `desynchronized`, meaning the commits between the stored tip and it are unknown. Commits that
//! continue from it verify `ok` again; the account stays `desynchronized` until a `#sync` (or a
//! resync) replaces its state. This is what `riptide verify` does on a file, where no resync is
//! possible, and what `riptide serve` does until it has resynced the account. Dropping every later
//! commit of the account instead would turn one lost frame into a silent outage of the account.

use std::collections::HashMap;
use std::fmt;
use std::sync::Mutex;

use riptide_cbor::{Cid, CidBuf};
use riptide_syntax::{tid_value, Tid};

/// How far in the future a `rev` (by its TID clock) may be: the sync spec's "a few minutes",
/// five as atmos and indigo's relay use.
pub const MAX_FUTURE_REV: std::time::Duration = std::time::Duration::from_secs(5 * 60);

/// The account's hosting status, from its latest `#account` frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Hosting {
    /// Active (the default: nothing said otherwise).
    #[default]
    Active,
    /// `deactivated` by its owner.
    Deactivated,
    /// `takendown` by the host or a moderation service.
    Takendown,
    /// `suspended` (temporarily taken down).
    Suspended,
    /// `deleted`.
    Deleted,
    /// `desynchronized` (the upstream says it lost track of the account).
    Desynchronized,
    /// `throttled`.
    Throttled,
    /// Not active, with a status this code does not know (or none).
    Inactive,
}

impl Hosting {
    /// The status an `#account` frame gives: `active` wins; otherwise its `status` string.
    pub fn from_account(active: bool, status: Option<&str>) -> Hosting {
        if active {
            return Hosting::Active;
        }
        match status {
            Some("deactivated") => Hosting::Deactivated,
            Some("takendown") => Hosting::Takendown,
            Some("suspended") => Hosting::Suspended,
            Some("deleted") => Hosting::Deleted,
            Some("desynchronized") => Hosting::Desynchronized,
            Some("throttled") => Hosting::Throttled,
            _ => Hosting::Inactive,
        }
    }

    /// Whether commits are accepted from the account.
    pub fn is_active(self) -> bool {
        self == Hosting::Active
    }

    /// `active`, `deactivated`, `takendown`, `suspended`, `deleted`, `desynchronized`,
    /// `throttled` or `inactive`.
    pub fn as_str(self) -> &'static str {
        match self {
            Hosting::Active => "active",
            Hosting::Deactivated => "deactivated",
            Hosting::Takendown => "takendown",
            Hosting::Suspended => "suspended",
            Hosting::Deleted => "deleted",
            Hosting::Desynchronized => "desynchronized",
            Hosting::Throttled => "throttled",
            Hosting::Inactive => "inactive",
        }
    }

    const ALL: [Hosting; 8] = [
        Hosting::Active,
        Hosting::Deactivated,
        Hosting::Takendown,
        Hosting::Suspended,
        Hosting::Deleted,
        Hosting::Desynchronized,
        Hosting::Throttled,
        Hosting::Inactive,
    ];
}

impl fmt::Display for Hosting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether the stored chain is known to hold every commit of the account.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum SyncStatus {
    /// Every commit since the state was established was seen and checked.
    #[default]
    Synchronized,
    /// A chain break: commits between the stored tip and an earlier one are unknown.
    Desynchronized,
    /// A resync of the account is under way.
    Resyncing,
}

impl SyncStatus {
    /// `synchronized`, `desynchronized` or `resyncing`.
    pub fn as_str(self) -> &'static str {
        match self {
            SyncStatus::Synchronized => "synchronized",
            SyncStatus::Desynchronized => "desynchronized",
            SyncStatus::Resyncing => "resyncing",
        }
    }

    const ALL: [SyncStatus; 3] = [
        SyncStatus::Synchronized,
        SyncStatus::Desynchronized,
        SyncStatus::Resyncing,
    ];
}

impl fmt::Display for SyncStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The account's latest accepted commit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tip {
    /// Its `rev`, as the TID's integer (TID order is integer order).
    pub rev: u64,
    /// The commit block's CID.
    pub commit: CidBuf,
    /// The MST root after it (`data`).
    pub data: CidBuf,
    /// Taken from a whole repository (a resync, a backfill, or an upstream `#sync`), not from a
    /// commit: a commit at or below it is inside that repository already
    /// ([`ChainFailure::Superseded`]), not a replay. The next commit above it clears it.
    pub from_repo: bool,
}

impl Tip {
    /// The rev as a TID string.
    pub fn rev_string(&self) -> String {
        Tid::from_u64(self.rev).into_string()
    }
}

/// Everything kept per account. `Copy`, no heap.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct AccountState {
    /// The latest accepted commit (`None` until the first one).
    pub tip: Option<Tip>,
    /// The hosting status.
    pub hosting: Hosting,
    /// Whether the chain is complete.
    pub sync: SyncStatus,
}

/// Why a frame is not the account's next one. Each maps to one verdict
/// ([`crate::verify::Failure::verdict`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ChainFailure {
    /// `rev` at or below the stored one: a replay or a rollback.
    RevRegression {
        /// The frame's rev.
        rev: String,
        /// The stored rev.
        stored: String,
    },
    /// `rev` at or below the rev of the repository the account's state was taken from (a
    /// resync, a backfill, an upstream `#sync`): the commit is inside that repository, so what it
    /// changed is there already. A catch-up replay meets these after a resync.
    Superseded {
        /// The frame's rev.
        rev: String,
        /// The repository's rev.
        repo: String,
    },
    /// `rev` too far ahead of the clock.
    FutureRev {
        /// The frame's rev.
        rev: String,
        /// How far ahead of the clock its timestamp is, in seconds.
        ahead_secs: u64,
    },
    /// `since` or `prevData` does not match the stored state.
    ChainBreak {
        /// `since` or `prevData`.
        field: &'static str,
        /// The stored value (`rev` or `data`).
        stored: String,
        /// The frame's value (`none` when absent).
        frame: String,
    },
    /// A commit for an account that is not active.
    AccountInactive(Hosting),
}

impl fmt::Display for ChainFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ChainFailure::RevRegression { rev, stored } => write!(
                f,
                "rev {rev} is not later than the account's stored rev {stored} (a replayed or rolled-back commit)"
            ),
            ChainFailure::Superseded { rev, repo } => write!(
                f,
                "rev {rev} is not later than the repository the account's state was taken from (rev {repo}): the commit is inside it already"
            ),
            ChainFailure::FutureRev { rev, ahead_secs } => write!(
                f,
                "rev {rev} is {ahead_secs} s in the future (the limit is {} s)",
                MAX_FUTURE_REV.as_secs()
            ),
            ChainFailure::ChainBreak {
                field,
                stored,
                frame,
            } => write!(
                f,
                "{field} {frame} does not follow the account's stored {} {stored} (commits missing between them)",
                if *field == "since" { "rev" } else { "data" }
            ),
            ChainFailure::AccountInactive(h) => {
                write!(f, "a commit for an account whose status is {h}")
            }
        }
    }
}

impl std::error::Error for ChainFailure {}

/// What a `#commit` that verified on its own claims about the chain.
#[derive(Clone, Copy, Debug)]
pub struct CommitClaim<'a> {
    /// `rev`.
    pub rev: &'a str,
    /// `since` (the previous rev), if any.
    pub since: Option<&'a str>,
    /// `prevData` (the previous MST root), if any.
    pub prev_data: Option<Cid<'a>>,
    /// The commit block's CID.
    pub commit: Cid<'a>,
    /// The commit's `data` (the MST root after it).
    pub data: Cid<'a>,
}

/// The outcome of a check: the failure, if any, and the state to store (`None`: unchanged).
pub type Step = (Result<(), ChainFailure>, Option<AccountState>);

/// Checks a `#commit` against the account's state (module docs: the table).
pub fn check_commit(state: Option<&AccountState>, c: &CommitClaim<'_>, now_us: u64) -> Step {
    let Some(rev) = tid_value(c.rev) else {
        // The stateless checks refuse a rev that is not a TID; nothing to compare.
        return (Ok(()), None);
    };
    let new_tip = Tip {
        rev,
        commit: c.commit.to_buf(),
        data: c.data.to_buf(),
        from_repo: false,
    };
    let current = state.copied().unwrap_or_default();
    if !current.hosting.is_active() {
        return (Err(ChainFailure::AccountInactive(current.hosting)), None);
    }
    if let Some(e) = rev_checks(current.tip.as_ref(), rev, c.rev, now_us) {
        return (Err(e), None);
    }
    let Some(tip) = current.tip else {
        // First commit seen: it establishes the chain.
        return (
            Ok(()),
            Some(AccountState {
                tip: Some(new_tip),
                ..current
            }),
        );
    };
    let since_ok = c.since.and_then(tid_value) == Some(tip.rev);
    let prev_ok = c.prev_data.is_some_and(|p| p == tip.data.as_cid());
    if since_ok && prev_ok {
        let next = AccountState {
            tip: Some(new_tip),
            ..current
        };
        return (Ok(()), Some(next));
    }
    let failure = if !since_ok {
        ChainFailure::ChainBreak {
            field: "since",
            stored: tip.rev_string(),
            frame: c.since.unwrap_or("none").to_owned(),
        }
    } else {
        ChainFailure::ChainBreak {
            field: "prevData",
            stored: tip.data.to_string(),
            frame: c
                .prev_data
                .map_or_else(|| "none".to_owned(), |p| p.to_buf().to_string()),
        }
    };
    // Re-established at the breaking commit (module docs).
    let next = AccountState {
        tip: Some(new_tip),
        hosting: current.hosting,
        sync: SyncStatus::Desynchronized,
    };
    (Err(failure), Some(next))
}

/// Checks a `#sync` (whose commit verified on its own) and resets the state to its commit.
pub fn check_sync(
    state: Option<&AccountState>,
    rev: &str,
    commit: Cid<'_>,
    data: Cid<'_>,
    now_us: u64,
) -> Step {
    let Some(rev_v) = tid_value(rev) else {
        return (Ok(()), None);
    };
    let current = state.copied().unwrap_or_default();
    if let Some(tip) = &current.tip {
        if tip.commit.as_cid() == commit && current.sync == SyncStatus::Synchronized {
            // The state it announces is the one we have: nothing to do.
            return (Ok(()), None);
        }
    }
    if let Some(e) = rev_checks(current.tip.as_ref(), rev_v, rev, now_us) {
        return (Err(e), None);
    }
    let next = AccountState {
        tip: Some(Tip {
            rev: rev_v,
            commit: commit.to_buf(),
            data: data.to_buf(),
            from_repo: true,
        }),
        hosting: current.hosting,
        sync: SyncStatus::Synchronized,
    };
    (Ok(()), Some(next))
}

/// The state after an `#account` frame: its hosting status, the chain unchanged.
pub fn apply_account(
    state: Option<&AccountState>,
    active: bool,
    status: Option<&str>,
) -> AccountState {
    AccountState {
        hosting: Hosting::from_account(active, status),
        ..state.copied().unwrap_or_default()
    }
}

fn rev_checks(tip: Option<&Tip>, rev: u64, rev_str: &str, now_us: u64) -> Option<ChainFailure> {
    if let Some(tip) = tip {
        if rev <= tip.rev && tip.from_repo {
            return Some(ChainFailure::Superseded {
                rev: rev_str.to_owned(),
                repo: tip.rev_string(),
            });
        }
        if rev <= tip.rev {
            return Some(ChainFailure::RevRegression {
                rev: rev_str.to_owned(),
                stored: tip.rev_string(),
            });
        }
    }
    let at = (rev >> 10) & ((1 << 53) - 1);
    let limit = now_us.saturating_add(MAX_FUTURE_REV.as_micros() as u64);
    if at > limit {
        return Some(ChainFailure::FutureRev {
            rev: rev_str.to_owned(),
            ahead_secs: (at - now_us) / 1_000_000,
        });
    }
    None
}

/// Where a verifier keeps account states. Each DID's frames reach one store in order (the
/// verifier's contract), so a store needs no ordering of its own.
pub trait ChainStore {
    /// The state of `did`, if any.
    fn get(&mut self, did: &str) -> Option<AccountState>;
    /// Replaces the state of `did`.
    fn put(&mut self, did: &str, state: AccountState);
    /// Whether this store keeps nothing, so the chain checks are skipped ([`NoChain`]).
    fn is_stateless(&self) -> bool {
        false
    }
}

/// No state at all: every commit is the account's first ([`crate::verify::Verifier::stateless`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct NoChain;

impl ChainStore for NoChain {
    fn get(&mut self, _did: &str) -> Option<AccountState> {
        None
    }

    fn put(&mut self, _did: &str, _state: AccountState) {}

    fn is_stateless(&self) -> bool {
        true
    }
}

impl<C: ChainStore + ?Sized> ChainStore for Box<C> {
    fn get(&mut self, did: &str) -> Option<AccountState> {
        (**self).get(did)
    }

    fn put(&mut self, did: &str, state: AccountState) {
        (**self).put(did, state)
    }

    fn is_stateless(&self) -> bool {
        (**self).is_stateless()
    }
}

/// Account states in a hash map: for one verifier over one input. Memory grows with the number
/// of accounts (about 200 bytes each).
#[derive(Clone, Debug, Default)]
pub struct MemoryChain {
    map: HashMap<Box<str>, AccountState>,
}

impl MemoryChain {
    /// Empty.
    pub fn new() -> MemoryChain {
        MemoryChain::default()
    }

    /// Accounts with a state.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether no account has a state.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Every account and its state (in no order).
    pub fn iter(&self) -> impl Iterator<Item = (&str, &AccountState)> + '_ {
        self.map.iter().map(|(d, s)| (&**d, s))
    }
}

impl ChainStore for MemoryChain {
    fn get(&mut self, did: &str) -> Option<AccountState> {
        self.map.get(did).copied()
    }

    fn put(&mut self, did: &str, state: AccountState) {
        match self.map.get_mut(did) {
            Some(s) => *s = state,
            None => {
                self.map.insert(did.into(), state);
            }
        }
    }
}

/// Account states shared by several verifiers on several threads (sharded maps behind mutexes):
/// lets a DID move from one verifier to another without losing its chain. Share it by
/// reference: `&SharedChain` is a [`ChainStore`].
#[derive(Debug)]
pub struct SharedChain {
    shards: Vec<Mutex<HashMap<Box<str>, AccountState>>>,
}

impl Default for SharedChain {
    fn default() -> SharedChain {
        SharedChain::new()
    }
}

impl SharedChain {
    /// Empty, with 64 shards.
    pub fn new() -> SharedChain {
        SharedChain {
            shards: (0..64).map(|_| Mutex::new(HashMap::new())).collect(),
        }
    }

    fn shard(&self, did: &str) -> std::sync::MutexGuard<'_, HashMap<Box<str>, AccountState>> {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        did.hash(&mut h);
        let i = (h.finish() % self.shards.len() as u64) as usize;
        // A poisoned shard only means another thread panicked mid-insert of a Copy value.
        self.shards[i]
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Accounts with a state.
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().map_or(0, |m| m.len()))
            .sum()
    }

    /// Whether no account has a state.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every account and its state, sorted by DID.
    pub fn to_sorted(&self) -> Vec<(String, AccountState)> {
        let mut all: Vec<(String, AccountState)> = self
            .shards
            .iter()
            .flat_map(|s| {
                let m = s.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                m.iter()
                    .map(|(d, st)| (d.to_string(), *st))
                    .collect::<Vec<_>>()
            })
            .collect();
        all.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        all
    }

    /// Encodes every state: `RIPTIDE-CHAIN 1\n`, then per account a u16 DID length, the DID, a
    /// u8 state length and [`encode_state`]'s bytes (big-endian lengths), sorted by DID.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        for (did, st) in self.to_sorted() {
            let did = did.as_bytes();
            let len = u16::try_from(did.len()).unwrap_or(u16::MAX);
            out.extend_from_slice(&len.to_be_bytes());
            out.extend_from_slice(&did[..len as usize]);
            let mut s = Vec::with_capacity(80);
            encode_state(&st, &mut s);
            out.push(s.len() as u8);
            out.extend_from_slice(&s);
        }
        out
    }

    /// Reads what [`SharedChain::encode`] wrote.
    pub fn decode(bytes: &[u8]) -> Result<SharedChain, CorruptState> {
        let rest = bytes.strip_prefix(MAGIC).ok_or(CorruptState {
            offset: 0,
            what: "not a riptide chain-state file (bad magic)",
        })?;
        let chain = SharedChain::new();
        let mut at = MAGIC.len();
        let mut rest = rest;
        while !rest.is_empty() {
            let corrupt = |what| CorruptState { offset: at, what };
            let (len, r) = rest
                .split_first_chunk::<2>()
                .ok_or_else(|| corrupt("truncated DID length"))?;
            let len = u16::from_be_bytes(*len) as usize;
            let did = r.get(..len).ok_or_else(|| corrupt("truncated DID"))?;
            let did = std::str::from_utf8(did).map_err(|_| corrupt("DID is not UTF-8"))?;
            let r = &r[len..];
            let (&slen, r) = r
                .split_first()
                .ok_or_else(|| corrupt("truncated state length"))?;
            let s = r
                .get(..slen as usize)
                .ok_or_else(|| corrupt("truncated state"))?;
            let st = decode_state(s).map_err(|e| CorruptState {
                offset: at + 2 + len + 1 + e.offset,
                what: e.what,
            })?;
            (&chain).put(did, st);
            at += 2 + len + 1 + slen as usize;
            rest = &r[slen as usize..];
        }
        Ok(chain)
    }
}

impl ChainStore for std::sync::Arc<SharedChain> {
    fn get(&mut self, did: &str) -> Option<AccountState> {
        (&**self).get(did)
    }

    fn put(&mut self, did: &str, state: AccountState) {
        (&**self).put(did, state)
    }
}

impl ChainStore for &SharedChain {
    fn get(&mut self, did: &str) -> Option<AccountState> {
        self.shard(did).get(did).copied()
    }

    fn put(&mut self, did: &str, state: AccountState) {
        let mut m = self.shard(did);
        match m.get_mut(did) {
            Some(s) => *s = state,
            None => {
                m.insert(did.into(), state);
            }
        }
    }
}

const MAGIC: &[u8] = b"RIPTIDE-CHAIN 1\n";

/// A stored account state that does not decode: riptide's own data, corrupt.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("corrupt chain state at byte {offset}: {what}")]
pub struct CorruptState {
    /// Byte offset of the problem.
    pub offset: usize,
    /// What is wrong.
    pub what: &'static str,
}

/// Version byte of [`encode_state`]'s format.
const STATE_V1: u8 = 1;

/// Encodes a state compactly (at most 4 + 8 + 2 × 73 bytes; 80 for atproto's 36-byte CIDs):
/// version 1, hosting, sync, a tip flag (0 none, 1 a commit's, 2 a repository's:
/// [`Tip::from_repo`]), then if there is a tip the rev (u64, big-endian) and each CID as a
/// length byte and its bytes.
pub fn encode_state(s: &AccountState, out: &mut Vec<u8>) {
    let hosting = Hosting::ALL
        .iter()
        .position(|&h| h == s.hosting)
        .unwrap_or(7) as u8;
    let sync = SyncStatus::ALL
        .iter()
        .position(|&x| x == s.sync)
        .unwrap_or(0) as u8;
    let tip = match &s.tip {
        None => 0,
        Some(t) if t.from_repo => 2,
        Some(_) => 1,
    };
    out.extend_from_slice(&[STATE_V1, hosting, sync, tip]);
    if let Some(t) = &s.tip {
        out.extend_from_slice(&t.rev.to_be_bytes());
        for cid in [&t.commit, &t.data] {
            let b = cid.as_bytes();
            out.push(b.len() as u8);
            out.extend_from_slice(b);
        }
    }
}

/// Decodes what [`encode_state`] wrote.
pub fn decode_state(b: &[u8]) -> Result<AccountState, CorruptState> {
    let corrupt = |offset, what| CorruptState { offset, what };
    let [v, h, s, has_tip, rest @ ..] = b else {
        return Err(corrupt(0, "shorter than its header"));
    };
    if *v != STATE_V1 {
        return Err(corrupt(0, "unknown version"));
    }
    let hosting = *Hosting::ALL
        .get(*h as usize)
        .ok_or_else(|| corrupt(1, "unknown hosting status"))?;
    let sync = *SyncStatus::ALL
        .get(*s as usize)
        .ok_or_else(|| corrupt(2, "unknown sync status"))?;
    let tip = match has_tip {
        0 if rest.is_empty() => None,
        0 => return Err(corrupt(4, "trailing bytes")),
        1 | 2 => {
            let (rev, r) = rest
                .split_first_chunk::<8>()
                .ok_or_else(|| corrupt(4, "truncated rev"))?;
            let mut r = r;
            let mut at = 12;
            let mut cids = [CidBuf::sha256(0x71, b""); 2];
            for c in &mut cids {
                let (&n, tail) = r
                    .split_first()
                    .ok_or_else(|| corrupt(at, "truncated CID"))?;
                let bytes = tail
                    .get(..n as usize)
                    .ok_or_else(|| corrupt(at, "truncated CID"))?;
                *c = CidBuf::from_bytes(bytes).map_err(|_| corrupt(at + 1, "bad CID"))?;
                r = &tail[n as usize..];
                at += 1 + n as usize;
            }
            if !r.is_empty() {
                return Err(corrupt(at, "trailing bytes"));
            }
            Some(Tip {
                rev: u64::from_be_bytes(*rev),
                commit: cids[0],
                data: cids[1],
                from_repo: *has_tip == 2,
            })
        }
        _ => return Err(corrupt(3, "bad tip flag")),
    };
    Ok(AccountState { tip, hosting, sync })
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: u64 = 1_783_173_600_000_000; // 2026-07-04T14:00:00Z

    /// A commit's claim, owned: rev, since, prevData, commit CID, data.
    type Owned = (String, Option<String>, Option<CidBuf>, CidBuf, CidBuf);

    fn rev(micros: u64) -> String {
        Tid::from_parts(micros, 7).into_string()
    }

    fn cid(n: u8) -> CidBuf {
        CidBuf::sha256(0x71, &[n])
    }

    /// A commit at `micros` whose `since` is `since_micros` and `prevData` is `cid(prev)`; its
    /// commit block is `cid(100 + data)` and its `data` `cid(data)`.
    fn commit_at(
        micros: u64,
        since_micros: Option<u64>,
        prev: Option<u8>,
        data: u8,
        bufs: &mut Vec<Owned>,
    ) {
        bufs.push((
            rev(micros),
            since_micros.map(rev),
            prev.map(cid),
            cid(100 + data),
            cid(data),
        ));
    }

    fn claim(b: &(String, Option<String>, Option<CidBuf>, CidBuf, CidBuf)) -> CommitClaim<'_> {
        CommitClaim {
            rev: &b.0,
            since: b.1.as_deref(),
            prev_data: b.2.as_ref().map(CidBuf::as_cid),
            commit: b.3.as_cid(),
            data: b.4.as_cid(),
        }
    }

    /// Runs commits through one account's state; the verdict-relevant outcome of each.
    fn run(
        commits: &[(u64, Option<u64>, Option<u8>, u8)],
        now: u64,
    ) -> (Vec<String>, AccountState) {
        let mut bufs = Vec::new();
        for &(m, s, p, d) in commits {
            commit_at(m, s, p, d, &mut bufs);
        }
        let mut state: Option<AccountState> = None;
        let mut out = Vec::new();
        for b in &bufs {
            let (r, next) = check_commit(state.as_ref(), &claim(b), now);
            out.push(match r {
                Ok(()) => "ok".to_owned(),
                Err(ChainFailure::RevRegression { .. }) => "rev-regression".to_owned(),
                Err(ChainFailure::Superseded { .. }) => "superseded".to_owned(),
                Err(ChainFailure::FutureRev { .. }) => "future-rev".to_owned(),
                Err(ChainFailure::ChainBreak { field, .. }) => format!("chain-break:{field}"),
                Err(ChainFailure::AccountInactive(_)) => "account-inactive".to_owned(),
            });
            if let Some(n) = next {
                state = Some(n);
            }
        }
        (out, state.unwrap_or_default())
    }

    #[test]
    fn a_chain_of_commits_is_ok() {
        let (v, s) = run(
            &[
                (T0, None, None, 1),
                (T0 + 1, Some(T0), Some(1), 2),
                (T0 + 2, Some(T0 + 1), Some(2), 3),
            ],
            T0,
        );
        assert_eq!(v, ["ok", "ok", "ok"]);
        let tip = s.tip.expect("a tip");
        assert_eq!((tip.rev_string(), tip.data), (rev(T0 + 2), cid(3)));
        assert_eq!(s.sync, SyncStatus::Synchronized);
    }

    #[test]
    fn a_first_commit_establishes_whatever_its_since() {
        let (v, _) = run(&[(T0 + 5, Some(T0), Some(9), 1)], T0);
        assert_eq!(v, ["ok"]);
    }

    #[test]
    fn replays_and_rollbacks_are_rev_regressions_and_change_nothing() {
        let (v, s) = run(
            &[
                (T0, None, None, 1),
                (T0 + 1, Some(T0), Some(1), 2),
                (T0 + 1, Some(T0), Some(1), 2), // the same commit again
                (T0, None, None, 1),            // the first one again
                (T0 + 2, Some(T0 + 1), Some(2), 3),
            ],
            T0,
        );
        assert_eq!(v, ["ok", "ok", "rev-regression", "rev-regression", "ok"]);
        assert_eq!(s.sync, SyncStatus::Synchronized);
    }

    #[test]
    fn a_dropped_commit_breaks_the_chain_which_restarts_at_the_break() {
        let (v, s) = run(
            &[
                (T0, None, None, 1),
                // (T0 + 1, data 2) dropped
                (T0 + 2, Some(T0 + 1), Some(2), 3),
                (T0 + 3, Some(T0 + 2), Some(3), 4),
            ],
            T0,
        );
        assert_eq!(v, ["ok", "chain-break:since", "ok"]);
        assert_eq!(s.sync, SyncStatus::Desynchronized);
        assert_eq!(s.tip.map(|t| t.data), Some(cid(4)));
    }

    #[test]
    fn a_wrong_prev_data_or_a_missing_since_is_a_chain_break() {
        let (v, _) = run(&[(T0, None, None, 1), (T0 + 1, Some(T0), Some(7), 2)], T0);
        assert_eq!(v, ["ok", "chain-break:prevData"]);
        let (v, _) = run(&[(T0, None, None, 1), (T0 + 1, None, Some(1), 2)], T0);
        assert_eq!(v, ["ok", "chain-break:since"]);
        let (v, _) = run(&[(T0, None, None, 1), (T0 + 1, Some(T0), None, 2)], T0);
        assert_eq!(v, ["ok", "chain-break:prevData"]);
    }

    #[test]
    fn future_revs_are_refused_past_five_minutes() {
        let five = MAX_FUTURE_REV.as_micros() as u64;
        let (v, _) = run(&[(T0 + five, None, None, 1)], T0);
        assert_eq!(v, ["ok"], "exactly at the limit");
        let (v, s) = run(&[(T0 + five + 1_000_000, None, None, 1)], T0);
        assert_eq!(v, ["future-rev"]);
        assert_eq!(s.tip, None, "a future rev establishes nothing");
    }

    #[test]
    fn inactive_accounts_commit_nothing_until_reactivated() {
        let mut bufs = Vec::new();
        commit_at(T0, None, None, 1, &mut bufs);
        commit_at(T0 + 1, Some(T0), Some(1), 2, &mut bufs);
        let (r, s) = check_commit(None, &claim(&bufs[0]), T0);
        assert!(r.is_ok());
        let off = apply_account(s.as_ref(), false, Some("takendown"));
        assert_eq!(off.hosting, Hosting::Takendown);
        assert_eq!(off.tip, s.and_then(|s| s.tip), "the chain is kept");
        let (r, next) = check_commit(Some(&off), &claim(&bufs[1]), T0);
        assert_eq!(r, Err(ChainFailure::AccountInactive(Hosting::Takendown)));
        assert_eq!(next, None);
        let on = apply_account(Some(&off), true, None);
        let (r, _) = check_commit(Some(&on), &claim(&bufs[1]), T0);
        assert!(r.is_ok());
        // An #account before any commit: the first commit meets the status too.
        let off = apply_account(None, false, None);
        assert_eq!(off.hosting, Hosting::Inactive);
        assert!(check_commit(Some(&off), &claim(&bufs[0]), T0).0.is_err());
    }

    #[test]
    fn a_sync_resets_the_chain_but_never_rolls_it_back() {
        let (_, s) = run(
            &[(T0, None, None, 1), (T0 + 2, Some(T0 + 1), Some(2), 3)],
            T0,
        );
        assert_eq!(s.sync, SyncStatus::Desynchronized);
        // An old sync: refused.
        let (r, next) = check_sync(
            Some(&s),
            &rev(T0 + 1),
            cid(102).as_cid(),
            cid(2).as_cid(),
            T0,
        );
        assert!(matches!(r, Err(ChainFailure::RevRegression { .. })));
        assert_eq!(next, None);
        // A newer one: the new state, synchronized.
        let (r, next) = check_sync(
            Some(&s),
            &rev(T0 + 9),
            cid(109).as_cid(),
            cid(9).as_cid(),
            T0,
        );
        assert!(r.is_ok());
        let next = next.expect("a new state");
        assert_eq!(next.sync, SyncStatus::Synchronized);
        assert_eq!(
            next.tip.map(|t| (t.rev, t.data)),
            Some((tid_value(&rev(T0 + 9)).unwrap_or(0), cid(9)))
        );
        // The same sync again: nothing to do.
        let (r, again) = check_sync(
            Some(&next),
            &rev(T0 + 9),
            cid(109).as_cid(),
            cid(9).as_cid(),
            T0,
        );
        assert_eq!((r, again), (Ok(()), None));
        // A commit at or below it is inside the repository: superseded, not a replay.
        let mut bufs = Vec::new();
        commit_at(T0 + 9, Some(T0 + 8), Some(8), 9, &mut bufs);
        commit_at(T0 + 10, Some(T0 + 9), Some(9), 10, &mut bufs);
        commit_at(T0 + 10, Some(T0 + 9), Some(9), 10, &mut bufs);
        let (r, n) = check_commit(Some(&next), &claim(&bufs[0]), T0);
        assert!(matches!(r, Err(ChainFailure::Superseded { .. })), "{r:?}");
        assert_eq!(n, None);
        assert!(r.unwrap_err().to_string().contains("inside it already"));
        // A commit continuing from it is ok, and the tip is a commit's again: the same commit
        // once more is a replay.
        let (r, after) = check_commit(Some(&next), &claim(&bufs[1]), T0);
        assert!(r.is_ok());
        let after = after.expect("a new state");
        assert_eq!(after.tip.map(|t| t.from_repo), Some(false));
        let (r, _) = check_commit(Some(&after), &claim(&bufs[2]), T0);
        assert!(
            matches!(r, Err(ChainFailure::RevRegression { .. })),
            "{r:?}"
        );
    }

    #[test]
    fn states_round_trip_and_corruption_is_typed() {
        let (_, s) = run(&[(T0, None, None, 1)], T0);
        let (_, synced) = check_sync(None, &rev(T0 + 9), cid(109).as_cid(), cid(9).as_cid(), T0);
        let synced = synced.expect("a state");
        assert_eq!(synced.tip.map(|t| t.from_repo), Some(true));
        for st in [
            s,
            synced,
            AccountState::default(),
            AccountState {
                hosting: Hosting::Deleted,
                sync: SyncStatus::Resyncing,
                ..s
            },
        ] {
            let mut b = Vec::new();
            encode_state(&st, &mut b);
            assert!(b.len() <= 4 + 8 + 2 * 37);
            assert_eq!(decode_state(&b), Ok(st));
            for cut in 0..b.len() {
                assert!(decode_state(&b[..cut]).is_err(), "cut at {cut}");
            }
            let mut long = b.clone();
            long.push(0);
            assert!(decode_state(&long).is_err());
        }
        assert!(decode_state(&[2, 0, 0, 0]).is_err());
        assert!(decode_state(&[1, 0, 0, 3]).is_err(), "no such tip flag");
        assert!(decode_state(&[1, 9, 0, 0]).is_err());
    }

    #[test]
    fn shared_chains_encode_and_decode() {
        let chain = SharedChain::new();
        let (_, s) = run(&[(T0, None, None, 1)], T0);
        (&chain).put("did:plc:b", s);
        (&chain).put("did:plc:a", AccountState::default());
        (&chain).put("did:plc:a", apply_account(None, false, Some("deleted")));
        assert_eq!(chain.len(), 2);
        let bytes = chain.encode();
        let back = SharedChain::decode(&bytes).expect("decodes");
        assert_eq!(back.to_sorted(), chain.to_sorted());
        assert_eq!((&back).get("did:plc:b"), Some(s));
        for cut in MAGIC.len() + 1..bytes.len() {
            // A cut between records is a shorter file; anywhere else, an error.
            if let Ok(c) = SharedChain::decode(&bytes[..cut]) {
                assert_eq!(c.len(), 1, "cut at {cut}");
            }
        }
        assert!(SharedChain::decode(b"nope").is_err());
        assert!(SharedChain::decode(MAGIC).expect("empty").is_empty());
    }
}
