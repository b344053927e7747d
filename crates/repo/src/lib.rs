//! atproto repositories: the Merkle Search Tree, signed commits, Sync 1.1 commit proofs and
//! whole-repository verification.
//!
//! Specs: <https://atproto.com/specs/repository> and <https://atproto.com/specs/sync>.
//!
//! Why this crate exists: everything a relay or backfill tool must *trust* about a repository
//! lives here. A firehose `#commit` is verified by [`verify_commit_proof`] (the ops applied in
//! reverse to the partial MST in the frame's CAR must give `prevData`) plus
//! [`Commit::verify_signature`]; a repository export by [`verify_repo`] (every block hash, the
//! signature, a structural walk of the whole MST and a rebuild from its leaves); one record's
//! proof (`sync.getRecord`) by [`verify_record_proof`].
//!
//! Built on the zero-copy layers below it: blocks are borrowed from the CAR (`riptide-car`),
//! nodes and commits are decoded on reusable tapes (`riptide-cbor`), signatures checked by
//! `riptide-crypto`.
//!
//! ```
//! use riptide_cbor::{CidBuf, DAG_CBOR};
//! use riptide_repo::mst;
//!
//! let leaf = CidBuf::sha256(DAG_CBOR, b"record");
//! let leaves = vec![("app.bsky.feed.post/3l2a".to_string(), leaf), ("app.bsky.feed.post/3l2b".to_string(), leaf)];
//! let (root, blocks) = mst::build(&leaves)?;
//! let store: std::collections::HashMap<_, _> = blocks.into_iter().collect();
//! let mut keys = Vec::new();
//! mst::walk(&store, root.as_cid(), |k, _, _| keys.push(k.to_vec()))?;
//! assert_eq!(keys.len(), 2);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! What it does not do: resolve DIDs or cache keys, parse firehose frames, or talk to the network.

pub mod commit;
pub mod error;
pub mod mst;
pub mod proof;
pub mod repo;
pub mod source;
pub mod verify;

pub use commit::{is_tid, rev_is_newer, Commit};
pub use error::{
    BuildError, CommitError, MstError, OpMismatch, ProofClass, ProofError, RepoError, RootMismatch,
};
pub use mst::{Action, ProofOp, Tree};
pub use proof::{record_proof, verify_record_proof, ProvenRecord};
pub use repo::{
    commit_of, inspect, list_records, verify_repo, verify_repo_traced, verify_repo_visiting,
    verify_repo_with, CommitInfo, Progress, RepoOptions, RepoReport, Timings,
};
pub use source::{BlockSource, NoBlocks};
pub use verify::{verify_commit_proof, verify_commit_proof_in, Verified};
