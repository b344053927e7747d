//! The Merkle Search Tree (MST) of atproto repositories.
//!
//! Spec: <https://atproto.com/specs/repository>. A repository maps keys `collection/rkey` to
//! record CIDs through a deterministic search tree: a key's layer is its [`key_height`], nodes
//! hold the keys of one layer in order with the subtrees between them, and the tree of a key set
//! is unique, so its root CID commits to exactly that set.
//!
//! - [`height`]: key heights, common prefixes, key syntax.
//! - [`node`]: decoding one node with its local checks; canonical encoding.
//! - [`walk`](mod@walk): every leaf in order, checking the whole structure.
//! - [`build`](mod@build): the canonical tree (root CID and blocks) from sorted leaves.
//! - `stream`: the same tree built from leaves as a walk hands them over (repository
//!   verification).
//! - [`tree`]: a mutable tree loaded lazily from blocks, for commit-proof inversion and
//!   incremental updates.
//! - [`invert`]: undoing firehose operations on such a tree.
//!
//! What this module does not do: commits, signatures or CAR parsing (see [`crate::commit`],
//! [`crate::repo`] and `riptide-car`).

pub mod build;
pub mod height;
pub mod invert;
pub mod node;
pub(crate) mod stream;
pub mod tree;
pub mod walk;

pub use build::{build, root_cid, BlockSink, Blocks, Builder, Leaves, RootOnly};
pub use height::{common_prefix_len, is_valid_key, key_height, MAX_KEY_LEN};
pub use invert::{Action, ProofOp};
pub use node::{decode_node, empty_root_cid, encode_node, NodeData, EMPTY_NODE};
pub use tree::{Checkpoint, Tree};
pub use walk::{walk, Visit, WalkStats, Walker};
