//! Frames broken on purpose, each in exactly one labeled way, with the verdict a strict
//! verifier must give (as `riptide verify --json` prints it).
//!
//! Why: a verifier is only trusted if it is seen to refuse what it must refuse, and to refuse
//! it for the right reason. Each broken frame starts as a valid `#commit` of some account, built
//! and then aborted ([`crate::repo::RepoState::abort`]): it does not advance the account, so
//! the frames around it verify as they would without it, and a stateful consumer that drops it
//! sees an unbroken chain of revisions. Then exactly one thing is broken:
//!
//! | defect | what | verdict |
//! |---|---|---|
//! | `changed-block-byte` | one byte of a record block flipped (its CID kept) | `bad-block-cid` |
//! | `bad-signature` | commit signed by another key of the same curve | `bad-signature` |
//! | `wrong-prev-data` | `prevData` is not the previous MST root | `inversion-mismatch` |
//! | `missing-proof-block` | the MST root node left out of the CAR | `missing-block` |
//! | `truncated-frame` | the frame cut to two thirds of its length | `malformed` |
//! | `oversized-blocks` | a raw block makes `blocks` larger than 2 MiB | `limits` |
//! | `too-many-ops` | 201 creates (the limit is 200) | `limits` |
//! | `deep-nesting` | a record nested 100 levels deep (the limit is 64) | `limits` |
//! | `unsorted-keys` | payload map keys in reverse canonical order | `malformed` |
//! | `non-minimal-int` | the header's `op: 1` in a two-byte head (`0x18 0x01`) | `malformed` |
//! | `unknown-type` | header `t` is `#futureType`: well-formed; an unknown message type is skipped, not an error (the protocol adds types over time) | `ok` |
//!
//! Stream-level defects break nothing inside a frame: each frame verifies on its own (and under
//! `riptide verify --stateless`), and only a verifier that keeps each account's chain state
//! (`riptide_firehose::chain`) refuses it:
//!
//! | defect | what | verdict |
//! |---|---|---|
//! | `replayed-commit` | an account's commit sent again right after it (the label is on the copy) | `rev-regression` |
//! | `dropped-commit` | an account's commit left out of the stream; the label is on its next commit, sent in its place | `chain-break` |
//! | `future-rev` | a commit whose `rev` is in the year 2200 (aborted) | `future-rev` |
//! | `commit-after-deactivation` | a commit of an account whose last `#account` deactivated it (aborted) | `account-inactive` |
//! | `sync-after-gap` | an account's commit left out, then a `#sync` of its new state sent in its place: the account's later commits continue from the `#sync` | `ok` |
//!
//! After a `dropped-commit` the account's chain restarts at the labelled commit (what a verifier
//! without resync does), so its later commits verify `ok`.
//!
//! Defects are assigned round-robin in this order, except that `oversized-blocks` (2 MiB each)
//! is made at most [`MAX_OVERSIZED`] times per stream, and `commit-after-deactivation` only
//! while some account is deactivated (otherwise the next defect is made instead).

use riptide_cbor::{write_array_header, write_map_header, write_text};
use riptide_crypto::{Curve, PrivateKey};
use serde::Serialize;

/// Most `oversized-blocks` frames in one stream (each is over 2 MiB).
pub const MAX_OVERSIZED: usize = 2;
/// Size of the raw filler block of an `oversized-blocks` frame.
pub const OVERSIZED_FILLER: usize = (2 << 20) + 1024;
/// Nesting depth of a `deep-nesting` record.
pub const DEEP: usize = 100;
/// The clock of a `future-rev` commit: 2200-01-01T00:00:00Z in unix µs (TIDs reach 2255).
pub const FUTURE_REV_MICROS: u64 =
    riptide_syntax::days_from_civil(2200, 1, 1) as u64 * 86_400 * 1_000_000;

/// One way of breaking a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Defect {
    /// A record block byte flipped.
    ChangedBlockByte,
    /// Signed with the wrong key.
    BadSignature,
    /// `prevData` wrong.
    WrongPrevData,
    /// A proof node missing.
    MissingProofBlock,
    /// The frame truncated.
    Truncated,
    /// `blocks` over 2 MiB.
    OversizedBlocks,
    /// Over 200 ops.
    TooManyOps,
    /// A record nested too deep.
    DeepNesting,
    /// Payload keys out of canonical order.
    UnsortedKeys,
    /// A non-minimal integer head.
    NonMinimalInt,
    /// An unknown message type.
    UnknownType,
    /// A commit sent twice.
    ReplayedCommit,
    /// A commit left out.
    DroppedCommit,
    /// A rev far in the future.
    FutureRev,
    /// A commit of a deactivated account.
    CommitAfterDeactivation,
    /// A commit left out, then a `#sync`.
    SyncAfterGap,
}

impl Defect {
    /// Every defect, in assignment order.
    pub const ALL: [Defect; 16] = [
        Defect::ChangedBlockByte,
        Defect::BadSignature,
        Defect::WrongPrevData,
        Defect::MissingProofBlock,
        Defect::Truncated,
        Defect::OversizedBlocks,
        Defect::TooManyOps,
        Defect::DeepNesting,
        Defect::UnsortedKeys,
        Defect::NonMinimalInt,
        Defect::UnknownType,
        Defect::ReplayedCommit,
        Defect::DroppedCommit,
        Defect::FutureRev,
        Defect::CommitAfterDeactivation,
        Defect::SyncAfterGap,
    ];

    /// The label in `adversarial.json`.
    pub fn as_str(self) -> &'static str {
        match self {
            Defect::ChangedBlockByte => "changed-block-byte",
            Defect::BadSignature => "bad-signature",
            Defect::WrongPrevData => "wrong-prev-data",
            Defect::MissingProofBlock => "missing-proof-block",
            Defect::Truncated => "truncated-frame",
            Defect::OversizedBlocks => "oversized-blocks",
            Defect::TooManyOps => "too-many-ops",
            Defect::DeepNesting => "deep-nesting",
            Defect::UnsortedKeys => "unsorted-keys",
            Defect::NonMinimalInt => "non-minimal-int",
            Defect::UnknownType => "unknown-type",
            Defect::ReplayedCommit => "replayed-commit",
            Defect::DroppedCommit => "dropped-commit",
            Defect::FutureRev => "future-rev",
            Defect::CommitAfterDeactivation => "commit-after-deactivation",
            Defect::SyncAfterGap => "sync-after-gap",
        }
    }

    /// The verdict `riptide verify` must give, as it prints it.
    pub fn expected_verdict(self) -> &'static str {
        match self {
            Defect::ChangedBlockByte => "bad-block-cid",
            Defect::BadSignature => "bad-signature",
            Defect::WrongPrevData => "inversion-mismatch",
            Defect::MissingProofBlock => "missing-block",
            Defect::Truncated | Defect::UnsortedKeys | Defect::NonMinimalInt => "malformed",
            Defect::OversizedBlocks | Defect::TooManyOps | Defect::DeepNesting => "limits",
            Defect::UnknownType | Defect::SyncAfterGap => "ok",
            Defect::ReplayedCommit => "rev-regression",
            Defect::DroppedCommit => "chain-break",
            Defect::FutureRev => "future-rev",
            Defect::CommitAfterDeactivation => "account-inactive",
        }
    }

    /// Whether the frame verifies on its own and only chain state refuses it.
    pub fn is_stream_level(self) -> bool {
        matches!(
            self,
            Defect::ReplayedCommit
                | Defect::DroppedCommit
                | Defect::FutureRev
                | Defect::CommitAfterDeactivation
                | Defect::SyncAfterGap
        )
    }
}

impl Serialize for Defect {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// One line of `adversarial.json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AdversarialEntry {
    /// The frame's index in the corpus (0-based, as `riptide verify --json` numbers frames).
    pub index: u64,
    /// What was broken.
    pub defect: Defect,
    /// The verdict a strict verifier gives.
    pub expected_verdict: &'static str,
}

/// A record `{"$type": "app.bsky.feed.like", "x": [[[…]]]}` nested [`DEEP`] levels: valid
/// DAG-CBOR, over any sane depth limit.
pub fn deep_record() -> Vec<u8> {
    let mut out = Vec::with_capacity(DEEP + 48);
    write_map_header(&mut out, 2);
    write_text(&mut out, "x");
    for _ in 0..DEEP - 1 {
        write_array_header(&mut out, 1);
    }
    write_array_header(&mut out, 0);
    write_text(&mut out, "$type");
    write_text(&mut out, "app.bsky.feed.like");
    out
}

/// A key that is not any account's (for `bad-signature`).
pub fn wrong_key(curve: Curve) -> PrivateKey {
    // A fixed valid scalar on both curves; from_bytes cannot fail for it.
    match PrivateKey::from_bytes(curve, &[0x42; 32]) {
        Ok(k) => k,
        Err(_) => unreachable_key(),
    }
}

#[cold]
fn unreachable_key() -> PrivateKey {
    // 0x42…42 is below both group orders and non-zero; reaching this is a bug in riptide-crypto.
    panic!("riptide-crypto refused the scalar 0x42..42")
}
