//! The AT Protocol event stream (`com.atproto.sync.subscribeRepos`): frames and their payloads.
//!
//! Why this crate exists: it is the one place that knows the firehose's message shapes. It turns
//! a binary WebSocket message into a typed, borrowed [`Frame`] — header, payload, the embedded CAR
//! with every block's SHA-256 checked, and every block decoded — through a reusable
//! [`FrameDecoder`] that allocates nothing per frame once warm.
//!
//! [`verify`] checks what a frame claims: signatures with the account's key and Sync 1.1 proofs,
//! one typed verdict per frame; [`chain`] checks that each commit follows the account's previous
//! one (per-account state: rev, commit, MST root, hosting status).
//!
//! It does no I/O and knows nothing of sockets, async runtimes or metrics.

mod error;
mod frame;

pub mod chain;
pub mod corpus;
pub mod encode;
pub mod verify;

pub use error::{FrameError, FrameErrorKind};
pub use frame::{
    Account, Action, Body, Commit, DecodeOptions, ErrorFrame, Frame, FrameDecoder, Identity, Info,
    RepoOp, SyncEvent, BATCH_FRAMES,
};
pub use riptide_sha::Kernel;
