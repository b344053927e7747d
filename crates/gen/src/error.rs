//! The generator's error type.

use std::path::PathBuf;

use riptide_repo::{MstError, ProofError};

/// Why generation failed. Apart from I/O, every variant means the generator broke one of its own
/// invariants (a bug), never bad input: there is no untrusted input.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GenError {
    /// Reading or writing a file.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        source: std::io::Error,
    },
    /// The configuration cannot be generated (e.g. zero accounts).
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The MST refused an operation the generator believed valid.
    #[error("MST: {0}")]
    Mst(#[from] MstError),
    /// Working out a commit's proof failed.
    #[error("proof: {0}")]
    Proof(#[from] ProofError),
    /// Any other broken invariant.
    #[error("internal: {0}")]
    Internal(String),
}

impl GenError {
    /// An I/O error on `path`.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> GenError {
        GenError::Io {
            path: path.into(),
            source,
        }
    }
}
