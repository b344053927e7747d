//! Typed errors: one per thing that can go wrong at each level.
//!
//! Three types because callers act differently on each: a [`DocError`] says one account's
//! document is unusable for verification (its commits cannot be checked until it changes); a
//! [`ResolveError`] adds "we have no document at all" (a different operational problem: fetch it);
//! a [`DocsError`] says a whole file of documents could not be loaded (fix the input).

use riptide_crypto::KeyError;

/// Why a DID document is unusable (entirely, or for signature checks).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DocError {
    /// The document has no `#atproto` verification method, so no commit of the account can be
    /// verified.
    #[error("DID document has no #atproto verification method")]
    NoSigningKey,
    /// The `#atproto` verification method names a key type or encoding riptide cannot use.
    #[error("#atproto verification method is unusable: {0}")]
    UnsupportedKey(#[from] KeyError),
    /// The document is not shaped like a DID document (what is wrong, in words).
    #[error("malformed DID document: {0}")]
    Malformed(String),
}

/// Why no signing key could be had for a DID.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ResolveError {
    /// No document is known for the DID.
    #[error("no DID document for {0}")]
    NotFound(String),
    /// The document is known but has no usable key.
    #[error("{did}: {error}")]
    Doc {
        /// The DID.
        did: String,
        /// What is wrong with its document.
        error: DocError,
    },
}

/// Why a file of DID documents could not be loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DocsError {
    /// Reading the file failed.
    #[error("reading {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not JSON.
    #[error("not JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// The top level is not an object mapping DID → document.
    #[error("expected a JSON object mapping DID to DID document")]
    NotAnObject,
    /// One document is malformed.
    #[error("document of {did}: {error}")]
    Doc {
        /// The map key.
        did: String,
        /// What is wrong.
        error: DocError,
    },
    /// A document's `id` is not the DID it is filed under.
    #[error("document filed under {key} has id {id}")]
    IdMismatch {
        /// The map key.
        key: String,
        /// The document's `id`.
        id: String,
    },
}
