//! Typed errors for MST structure, commits, commit proofs and whole repositories.
//!
//! Why four types: callers act differently on each. An [`MstError`] says a tree is not the one
//! canonical MST for its keys (or a block is missing); a [`CommitError`] says the signed commit
//! object itself is unusable; a [`ProofError`] is the verdict on one firehose `#commit` proof; a
//! [`RepoError`] is the verdict on one repository export. Each kind carries the CID (or path) it
//! concerns, so a log line names the offending block.
//!
//! What this module does not do: map errors onto relay actions (drop, resync, ban): the firehose
//! layer owns that policy. [`ProofError::class`] gives it a three-way summary to start from.

use riptide_car::CarError;
use riptide_cbor::{CidBuf, ErrorKind};
use riptide_crypto::VerifyError;

/// Why an MST (or a node of one) is not valid, or could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MstError {
    /// A node the operation needs is not among the available blocks.
    #[error("MST node {0} is not available")]
    MissingBlock(CidBuf),
    /// The node is not valid DAG-CBOR.
    #[error("MST node {cid} is not valid DAG-CBOR ({} at byte {offset})", kind.as_str())]
    Cbor {
        /// The node.
        cid: CidBuf,
        /// What the decoder rejected.
        kind: ErrorKind,
        /// Where.
        offset: usize,
    },
    /// The node is DAG-CBOR but not shaped like an MST node (`{e: [{k, p, t, v}…], l}`).
    #[error("MST node {cid} is malformed: {reason}")]
    Malformed {
        /// The node.
        cid: CidBuf,
        /// What is wrong, e.g. `"entry field v is not a link"`.
        reason: &'static str,
    },
    /// Keys are not strictly ascending (within a node, or across the in-order walk).
    #[error("MST key {key:?} in node {cid} is not greater than the key before it")]
    KeyOrder {
        /// The node holding the out-of-order key.
        cid: CidBuf,
        /// The key (lossy UTF-8).
        key: String,
    },
    /// A key sits on a layer other than its height (every key of a node on layer L has height
    /// L, and a child is on the layer below its parent).
    #[error("MST node {cid}: key {key:?} has height {found}, but the node is on layer {expected}")]
    WrongLayer {
        /// The node.
        cid: CidBuf,
        /// The key (lossy UTF-8).
        key: String,
        /// The layer the node must be on.
        expected: u32,
        /// The height of the key.
        found: u32,
    },
    /// A node on layer 0 points to a subtree (there is no layer below 0).
    #[error("MST node {cid} is on layer 0 but has a subtree")]
    SubtreeBelowLayerZero {
        /// The node.
        cid: CidBuf,
    },
    /// A node below the root with no entries and no left subtree (empty subtrees must be null).
    #[error("MST node {cid} is empty but is not the root of an empty tree")]
    EmptyNode {
        /// The node.
        cid: CidBuf,
    },
    /// The root has no entries but a left subtree: a canonical MST would have pruned it.
    #[error("MST root {cid} has no entries, only a subtree: not pruned")]
    UnprunedRoot {
        /// The root node.
        cid: CidBuf,
    },
    /// An entry's prefix length `p` is not the exact common prefix with the previous key.
    #[error("MST node {cid}: entry {index} has a wrong prefix length")]
    BadPrefix {
        /// The node.
        cid: CidBuf,
        /// Index of the entry in the node.
        index: usize,
    },
    /// A key is not a repository path `collection/rkey` (at most 1024 bytes, restricted ASCII).
    #[error("MST key {key:?} is not a valid repository path")]
    InvalidKey {
        /// The key (lossy UTF-8).
        key: String,
    },
    /// An earlier operation on this [`crate::mst::Tree`] failed part-way; the tree must be dropped.
    #[error("MST tree is unusable after an earlier error")]
    Poisoned,
}

impl MstError {
    /// Whether this is a missing block rather than a malformed one.
    pub fn is_missing_block(&self) -> bool {
        matches!(self, MstError::MissingBlock(_))
    }
}

/// Why leaves cannot be built into an MST.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// Leaves must be strictly ascending by key (bytewise); this one is not.
    #[error("leaf {index} is not greater than the leaf before it")]
    Unsorted {
        /// Index of the offending leaf.
        index: usize,
    },
    /// A key is not a valid repository path.
    #[error("leaf {index} has a key that is not a valid repository path")]
    InvalidKey {
        /// Index of the offending leaf.
        index: usize,
    },
}

/// Why a block is not a usable repository commit object.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CommitError {
    /// The block is not valid DAG-CBOR.
    #[error("commit is not valid DAG-CBOR ({} at byte {offset})", kind.as_str())]
    Cbor {
        /// What the decoder rejected.
        kind: ErrorKind,
        /// Where.
        offset: usize,
    },
    /// A required field is absent.
    #[error("commit has no {0:?} field")]
    MissingField(&'static str),
    /// A field has the wrong type.
    #[error("commit field {0:?} has the wrong type")]
    WrongType(&'static str),
    /// `version` is not 3.
    #[error("commit version {0} is not supported (expected 3)")]
    UnsupportedVersion(i64),
    /// The commit is not a map.
    #[error("commit is not a map")]
    NotAMap,
}

/// Coarse classification of a [`ProofError`], for mapping onto verdicts and counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ProofClass {
    /// A block the verification needs is not in the CAR.
    MissingBlock,
    /// Everything decoded, but the inverted tree's root is not `prevData`.
    InversionMismatch,
    /// Something is malformed or inconsistent: commit, MST node, or an op versus the tree.
    Malformed,
}

/// Why a Sync 1.1 commit proof does not verify.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProofError {
    /// A block (commit, MST node or created/updated record) is not in the CAR.
    #[error("block {0} is not in the commit's CAR")]
    MissingBlock(CidBuf),
    /// The commit block does not decode.
    #[error("commit: {0}")]
    Commit(#[from] CommitError),
    /// An MST node in the proof is malformed.
    #[error("MST: {0}")]
    Mst(MstError),
    /// An op is not well-formed (e.g. a create with `prev`, an update without it, a duplicate
    /// path). Ops without `prev` on update/delete predate Sync 1.1 and cannot be inverted.
    #[error("op {path:?}: {reason}")]
    InvalidOp {
        /// The op's path.
        path: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// The new tree does not hold what an op says (a created key with another CID, a deleted key
    /// still present, …).
    #[error("{0}")]
    OpMismatch(Box<OpMismatch>),
    /// The tree obtained by inverting every op does not have `prevData` as its root.
    #[error("{0}")]
    InversionMismatch(Box<RootMismatch>),
}

/// Details of [`ProofError::OpMismatch`] (boxed: CIDs are stored inline and rejections are rare).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("op {path:?}: tree has {found:?}, op says {expected:?}")]
pub struct OpMismatch {
    /// The op's path.
    pub path: String,
    /// What the op implies the tree holds under `path`.
    pub expected: Option<CidBuf>,
    /// What the tree holds.
    pub found: Option<CidBuf>,
}

/// Two roots that should be equal: [`ProofError::InversionMismatch`] (expected = the frame's
/// `prevData`, actual = the inverted tree's root) and [`RepoError::RootMismatch`] (expected =
/// the commit's `data`, actual = the tree rebuilt from the leaves).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("root {actual} is not the expected {expected}")]
pub struct RootMismatch {
    /// The root that was claimed.
    pub expected: CidBuf,
    /// The root that was computed.
    pub actual: CidBuf,
}

impl ProofError {
    /// An [`ProofError::OpMismatch`].
    pub fn op_mismatch(path: &str, expected: Option<CidBuf>, found: Option<CidBuf>) -> ProofError {
        ProofError::OpMismatch(Box::new(OpMismatch {
            path: path.to_owned(),
            expected,
            found,
        }))
    }

    /// An [`ProofError::InversionMismatch`].
    pub fn inversion_mismatch(expected: CidBuf, actual: CidBuf) -> ProofError {
        ProofError::InversionMismatch(Box::new(RootMismatch { expected, actual }))
    }
}

impl From<MstError> for ProofError {
    fn from(e: MstError) -> Self {
        match e {
            MstError::MissingBlock(cid) => ProofError::MissingBlock(cid),
            other => ProofError::Mst(other),
        }
    }
}

impl ProofError {
    /// The verdict class of this error.
    pub fn class(&self) -> ProofClass {
        match self {
            ProofError::MissingBlock(_) => ProofClass::MissingBlock,
            ProofError::InversionMismatch(_) => ProofClass::InversionMismatch,
            _ => ProofClass::Malformed,
        }
    }
}

/// Why a repository export does not verify.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RepoError {
    /// The CAR itself is bad (framing, limits, or a block whose bytes do not hash to its CID).
    #[error("CAR: {0}")]
    Car(#[from] CarError),
    /// The CAR header has no root.
    #[error("CAR has no root")]
    NoRoot,
    /// The root (commit) block is not in the CAR.
    #[error("commit block {0} is not in the CAR")]
    MissingCommit(CidBuf),
    /// The commit block does not decode.
    #[error("commit: {0}")]
    Commit(#[from] CommitError),
    /// The commit signature does not verify with the given key.
    #[error("signature: {0}")]
    Signature(#[from] VerifyError),
    /// The MST is incomplete or not canonical.
    #[error("MST: {0}")]
    Mst(#[from] MstError),
    /// A record the MST points to is not in the CAR.
    #[error("record {key} ({cid}) is not in the CAR")]
    MissingRecord {
        /// Its key.
        key: String,
        /// Its CID.
        cid: CidBuf,
    },
    /// Rebuilding the MST from its leaves gives another root than the commit's `data`
    /// (`expected`: `data`; `actual`: the rebuilt root).
    #[error("MST rebuilt from its leaves: {0}")]
    RootMismatch(Box<RootMismatch>),
    /// A key is not UTF-8 (only reachable when listing keys of an unchecked tree).
    #[error("MST key is not UTF-8")]
    KeyNotUtf8,
}

#[cfg(test)]
mod tests {
    use super::*;
    use riptide_cbor::DAG_CBOR;

    #[test]
    fn classes_and_conversions() {
        let cid = CidBuf::sha256(DAG_CBOR, b"x");
        assert_eq!(
            ProofError::from(MstError::MissingBlock(cid)),
            ProofError::MissingBlock(cid)
        );
        assert_eq!(
            ProofError::MissingBlock(cid).class(),
            ProofClass::MissingBlock
        );
        let mm = ProofError::inversion_mismatch(cid, cid);
        assert_eq!(mm.class(), ProofClass::InversionMismatch);
        let bad = ProofError::from(MstError::EmptyNode { cid });
        assert_eq!(bad.class(), ProofClass::Malformed);
        assert!(MstError::MissingBlock(cid).is_missing_block());
        assert!(bad.to_string().contains("empty"));
        // Every error type stays small enough to return by value cheaply.
        assert!(std::mem::size_of::<ProofError>() <= 128);
        assert!(std::mem::size_of::<RepoError>() <= 128);
        assert!(std::mem::size_of::<MstError>() <= 128);
    }
}
