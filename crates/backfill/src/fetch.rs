//! One repository from the network: the account's identity, its sources, one `getRepo` each,
//! verification off the async threads.
//!
//! Why this shape: the scheduler (`run`) must wait on a host's limits *between* learning which
//! host serves an account and asking it, so the fetch is in two steps: [`Fetcher::identity`]
//! (the DID document: key and PDS; then the relay as the fallback source) and
//! [`Fetcher::fetch_verify`] (one source). The HTTP fetch is `riptide_resolver::resync`'s
//! ([`Resyncer::fetch_repo`]: size bound, spooling of large repositories to an unnamed file,
//! timeout, minimum rate, `429` bookkeeping), extended rather than copied; verification is
//! [`crate::verify::verify_car`] on a blocking thread.
//!
//! Several client addresses ([`Fetcher::bound_to`], `riptide backfill --bind`): a PDS limits
//! each client IP on its own, so one machine with N local addresses may ask each host N times
//! as often. Each address is a *lane* with its own HTTP client; the scheduler picks a lane per
//! repository and keys the host's limits by host and lane ([`Fetcher::limit_key`]), so each
//! address keeps to the host's published limit by itself.

use std::net::IpAddr;
use std::sync::Arc;

use riptide_crypto::PublicKey;
use riptide_resolver::{FetchError, ResolveError, Resolver, Resyncer};

use crate::collections::Collections;
use crate::outcome::{FailKind, Failure, Verified};
use crate::verify::verify_car;

/// An account's key and where its repository can be fetched, best first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// The DID document's signing key.
    pub key: PublicKey,
    /// `http(s)://host[:port]` bases: the account's PDS, then the relay.
    pub sources: Vec<String>,
}

/// Resolves accounts and fetches their repositories.
#[derive(Clone, Debug)]
pub struct Fetcher {
    resolver: Resolver,
    resync: Resyncer,
    /// One fetcher per local source address (module docs); empty: `resync` alone, from
    /// whatever address the system picks.
    lanes: Vec<(IpAddr, Resyncer)>,
    relay: Option<String>,
    keep: Arc<Collections>,
}

/// The host (`host[:port]`) of a URL or base: the unit of rate limits.
pub fn host_of(url: &str) -> &str {
    url.split_once("://")
        .map_or(url, |(_, r)| r)
        .split(['/', '?'])
        .next()
        .unwrap_or_default()
}

impl Fetcher {
    /// A fetcher resolving with `resolver`, fetching with `resync`, falling back to `relay`
    /// (an `http(s)://` base), keeping the records `keep` matches.
    pub fn new(
        resolver: Resolver,
        resync: Resyncer,
        relay: Option<String>,
        keep: Collections,
    ) -> Fetcher {
        Fetcher {
            resolver,
            resync,
            lanes: Vec::new(),
            relay: relay.map(|r| r.trim_end_matches('/').to_owned()),
            keep: Arc::new(keep),
        }
    }

    /// This fetcher sending its `getRepo`s from the local addresses `addrs`, one lane each
    /// (module docs). Fails when a client cannot be built; an address that is not local fails
    /// each fetch of its lane, as a network failure.
    pub fn bound_to(mut self, addrs: &[IpAddr]) -> Result<Fetcher, ResolveError> {
        self.lanes = addrs
            .iter()
            .map(|a| Ok((*a, self.resync.bound_to(*a)?)))
            .collect::<Result<_, ResolveError>>()?;
        Ok(self)
    }

    /// How many lanes (client addresses) the fetches are spread over: at least one.
    pub fn lanes(&self) -> usize {
        self.lanes.len().max(1)
    }

    /// The local address of `lane`, if bound.
    pub fn address(&self, lane: usize) -> Option<IpAddr> {
        self.lanes.get(lane).map(|(a, _)| *a)
    }

    /// The key of `host`'s limits for requests on `lane`: the host alone with one lane, else
    /// the host and the lane's address (each address is its own client to the host).
    pub fn limit_key(&self, lane: usize, host: &str) -> String {
        match self.lanes.get(lane) {
            Some((a, _)) if self.lanes.len() > 1 => format!("{host} from {a}"),
            _ => host.to_owned(),
        }
    }

    /// `did`'s key and sources.
    pub async fn identity(&self, did: &str) -> Result<Identity, Failure> {
        self.identity_of(did, self.resolver.resolve_did(did).await)
    }

    /// `did`'s key and sources from the PLC directory itself, past the PLC mirror (a
    /// repository failed with the mirror's document, which may be stale:
    /// `Resolver::resolve_did_past_mirror`); `None` when there is no mirror to look past.
    pub async fn identity_past_mirror(&self, did: &str) -> Option<Result<Identity, Failure>> {
        let doc = self.resolver.resolve_did_past_mirror(did).await?;
        Some(self.identity_of(did, doc))
    }

    /// Counts a recheck past the PLC mirror, and whether it found the mirror stale.
    pub fn note_plc_mirror_recheck(&self, stale: bool) {
        self.resolver.note_plc_mirror_recheck(stale);
    }

    fn identity_of(
        &self,
        did: &str,
        doc: riptide_resolver::DocResult,
    ) -> Result<Identity, Failure> {
        let doc = doc.map_err(|e| {
            let kind = match &e {
                ResolveError::DidNotFound(_) => FailKind::NotFound,
                e if e.is_transient() => FailKind::Network,
                _ => FailKind::Identity,
            };
            Failure::new(did, kind, format!("DID document: {e}"))
        })?;
        let key = doc
            .signing_key()
            .map_err(|e| Failure::new(did, FailKind::Identity, format!("DID document: {e}")))?;
        let mut sources = Vec::new();
        if let Some(pds) = doc.pds() {
            sources.push(pds.trim_end_matches('/').to_owned());
        }
        if let Some(r) = &self.relay {
            if !sources.contains(r) {
                sources.push(r.clone());
            }
        }
        if sources.is_empty() {
            return Err(Failure::new(
                did,
                FailKind::Identity,
                "the DID document names no PDS and no relay was given",
            ));
        }
        Ok(Identity { key, sources })
    }

    /// `did`'s repository from `base` (one source), verified with `key`.
    pub async fn fetch_verify(
        &self,
        base: &str,
        did: &str,
        key: &PublicKey,
    ) -> Result<Verified, Fetched> {
        self.fetch_verify_on(0, base, did, key).await
    }

    /// [`Fetcher::fetch_verify`] from `lane`'s address (module docs).
    pub async fn fetch_verify_on(
        &self,
        lane: usize,
        base: &str,
        did: &str,
        key: &PublicKey,
    ) -> Result<Verified, Fetched> {
        let url = format!("{base}/xrpc/com.atproto.sync.getRepo?did={did}");
        let resync = self.lanes.get(lane).map_or(&self.resync, |(_, r)| r);
        let car = match resync.fetch_repo(&url).await {
            Ok(car) => car,
            Err(FetchError::RateLimited {
                retry_in, asked, ..
            }) => {
                return Err(Fetched::Wait {
                    retry_in,
                    sent: asked,
                });
            }
            Err(e) => return Err(Fetched::Failed(fetch_failure(did, &e))),
        };
        let (did2, key, keep) = (did.to_owned(), key.clone(), self.keep.clone());
        tokio::task::spawn_blocking(move || {
            verify_car(Box::new(car), &did2, Some(&key), &keep, &url)
        })
        .await
        .map_err(|e| {
            Fetched::Failed(Failure::new(
                did,
                FailKind::BadCar,
                format!("verification task failed: {e}"),
            ))
        })?
        .map_err(Fetched::Failed)
    }
}

/// Why [`Fetcher::fetch_verify`] gave no repository.
#[derive(Debug)]
pub enum Fetched {
    /// The host rate-limited us: ask it again after `retry_in` (not a failed attempt). `sent`:
    /// the request was sent and refused (a `429`); otherwise it was not sent at all, because
    /// the host's last answer said its window was spent (`RateLimit-Remaining: 0`).
    Wait {
        /// How long to wait.
        retry_in: std::time::Duration,
        /// Whether the request went out.
        sent: bool,
    },
    /// A failure.
    Failed(Failure),
}

/// The failure kind of a fetch error.
pub fn fetch_failure(did: &str, e: &FetchError) -> Failure {
    let kind = match e {
        FetchError::RateLimited { .. } => FailKind::RateLimited,
        FetchError::Status { status, error, .. } => match (error.as_deref(), status) {
            (Some("RepoNotFound"), _) | (None, 404) => FailKind::NotFound,
            (Some("RepoDeactivated"), _) => FailKind::Deactivated,
            (Some("RepoTakendown"), _) => FailKind::TakenDown,
            (Some("RepoSuspended"), _) => FailKind::Suspended,
            _ => FailKind::Http,
        },
        FetchError::Timeout { .. } => FailKind::Timeout,
        FetchError::TooSlow { .. } => FailKind::TooSlow,
        FetchError::TooLarge { .. } => FailKind::TooLarge,
        FetchError::Truncated { .. } => FailKind::Truncated,
        _ => FailKind::Network,
    };
    Failure::new(did, kind, e.to_string())
}
