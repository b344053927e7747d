//! Identity resolution over the network: handles, `did:plc`, `did:web`, a coalescing cache, the
//! firehose verifier's key source, and the trust chain from a handle to a verified repository.
//!
//! Why a crate apart from `riptide-identity`: that crate parses DID documents and does no I/O,
//! so the verification core (and anything else that only reads documents from a file) needs no
//! tokio, HTTP or DNS. This crate adds the network half on top: `identity` ← `resolver` →
//! `firehose` (for the [`KeyLookup`](riptide_firehose::verify::KeyLookup) adapter) and `repo`
//! (for the trust chain). Nothing below depends on it.
//!
//! - [`Resolver`]: handle → DID ([`Resolver::resolve_handle`]: DNS TXT then HTTPS, as the handle
//!   spec says; or a test handle resolver), DID → document ([`Resolver::resolve_did`]: PLC
//!   directory, did:web), both directions checked ([`Resolver::identity`]).
//! - the cache (inside [`Resolver`]): LRU-bounded, TTL, negative entries, [`Resolver::invalidate`]
//!   on `#identity`, one network request for a burst of lookups of one DID.
//! - [`plc_pause`]: a `429` of the PLC directory pauses every `did:plc` lookup of the resolver
//!   until the time it asked for, and the lookup asks again ([`Resolver::plc_rate_limited`]).
//! - [`plc_mirror`] / [`plc_export`]: a local copy of the PLC directory, pulled from its
//!   `/export` and checked operation by operation (`riptide plc mirror`), that answers
//!   `did:plc` lookups instead of the network ([`ResolverConfig::plc_mirror`]).
//! - [`ResolverKeys`] / [`verify_resolving`]: keys for the synchronous firehose verifier (warm the
//!   cache, then verify; see [`keys`] for why and what happens on a miss);
//!   [`DocKeys`]: the same from a static set of DID documents.
//! - [`verify_handle`]: the trust chain behind `riptide verify-handle`.
//!
//! Concurrency: a [`Resolver`] is `Clone + Send + Sync` (one `Arc`); clones share the cache and
//! the HTTP connection pool. Futures need a tokio runtime.

mod cache;
mod error;
pub mod keys;
pub mod plc_export;
pub mod plc_mirror;
pub mod plc_pause;
mod resolver;
pub mod resync;
pub mod trust;

pub use cache::{CacheCounts, DocResult};
pub use error::ResolveError;
pub use keys::{peek_decoder, verify_resolving, DocKeys, ResolverKeys};
pub use resolver::{Identity, Resolver, ResolverConfig, StaticDocs, DEFAULT_PLC_URL};
pub use resync::{
    parse_retry_after, rate_limit_wait, FetchError, RepoBytes, ResyncConfig, ResyncError, Resynced,
    Resyncer, MAX_REDIRECTS,
};
pub use trust::{verify_handle, Progress, TrustOptions, TrustReport, TrustTimings, TrustVerdict};
