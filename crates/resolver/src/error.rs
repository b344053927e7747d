//! Typed resolution errors, classified by what the caller does next.
//!
//! Definite answers ([`ResolveError::is_definite`]: no such handle or DID, a document that is not
//! usable) are cached for the negative TTL; transient ones ([`ResolveError::is_transient`]:
//! network, 5xx, 429) are not cached and are worth retrying. Errors are `Clone` because one
//! coalesced lookup hands the same outcome to every waiter.

use riptide_identity::DocError;

/// Why a handle or DID could not be resolved.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ResolveError {
    /// The input is not a valid handle.
    #[error("{0:?} is not a valid handle")]
    InvalidHandle(String),
    /// The input is not a valid DID.
    #[error("{0:?} is not a valid DID")]
    InvalidDid(String),
    /// Neither DNS TXT nor HTTPS names a DID for the handle.
    #[error("handle {handle} does not resolve: {why}")]
    HandleNotFound {
        /// The handle.
        handle: String,
        /// What each method answered.
        why: String,
    },
    /// DNS TXT records name more than one DID (the spec says resolution fails).
    #[error("handle {handle}: _atproto TXT records name several DIDs: {dids}")]
    AmbiguousHandle {
        /// The handle.
        handle: String,
        /// The DIDs named, comma-separated.
        dids: String,
    },
    /// The DID document does not claim the handle (`alsoKnownAs`): the handle → DID link is
    /// one-sided and must not be shown or trusted.
    #[error("handle {handle} resolves to {did}, whose document claims {claimed}")]
    HandleMismatch {
        /// The handle.
        handle: String,
        /// The DID it resolved to.
        did: String,
        /// The handle the document claims (`none` if it claims none).
        claimed: String,
    },
    /// The DID method is neither `plc` nor `web`.
    #[error("unsupported DID method: {0}")]
    UnsupportedMethod(String),
    /// The directory or host has no document for the DID (404/410).
    #[error("no DID document for {0}")]
    DidNotFound(String),
    /// The document served is not a usable DID document.
    #[error("DID document of {did}: {error}")]
    Doc {
        /// The DID.
        did: String,
        /// What is wrong with it.
        error: DocError,
    },
    /// The document served is for another DID.
    #[error("document served for {did} has id {id}")]
    IdMismatch {
        /// The DID asked for.
        did: String,
        /// The document's `id`.
        id: String,
    },
    /// The document has no `#atproto_pds` service.
    #[error("DID document of {0} declares no PDS (#atproto_pds)")]
    NoPds(String),
    /// A request failed at the transport level (connect, reset, timeout, DNS server failure).
    #[error("{url}: {why}")]
    Network {
        /// What was asked.
        url: String,
        /// The error.
        why: String,
    },
    /// An unexpected HTTP status.
    #[error("{url}: HTTP {status}")]
    Status {
        /// What was asked.
        url: String,
        /// The status code.
        status: u16,
    },
    /// A local file could not be written (a repository spooled to disk by resync).
    #[error("spooling to {path}: {error}")]
    Io {
        /// The directory.
        path: String,
        /// The error.
        error: String,
    },
    /// A response body exceeded its limit (bounded reads of untrusted input).
    #[error("{url}: response larger than {limit} bytes")]
    TooLarge {
        /// What was asked.
        url: String,
        /// The limit.
        limit: usize,
    },
    /// A repository host redirected elsewhere than to itself (or too many times). Refused, not
    /// followed: each host's fetch limits must apply to the host that serves (`resync` docs).
    #[error("{url}: redirected to {to}: {why}")]
    Redirect {
        /// What was asked.
        url: String,
        /// Where it pointed (the `Location`).
        to: String,
        /// Why it was not followed.
        why: &'static str,
    },
}

impl ResolveError {
    /// A failure that may go away on retry (network, 5xx, 429). Never cached.
    pub fn is_transient(&self) -> bool {
        match self {
            ResolveError::Network { .. } | ResolveError::Io { .. } => true,
            ResolveError::Status { status, .. } => *status >= 500 || *status == 429,
            _ => false,
        }
    }

    /// A definite negative answer, cached for the negative TTL.
    pub fn is_definite(&self) -> bool {
        !self.is_transient()
    }
}
