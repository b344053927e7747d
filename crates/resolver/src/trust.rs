//! The trust chain from a handle: handle → DID → document → repository → verified.
//!
//! Why here: it is the one place resolution (this crate) and whole-repository verification
//! (`riptide-repo`, I/O-free) meet, and `riptide verify-handle`, the simulator tests and the
//! benchmark suite all run the same chain. Steps, each timed:
//!
//! 1. `resolve`: the handle's DID (DNS/HTTPS, or the test handle resolver), the DID document, and
//!    the document's `alsoKnownAs` claiming the handle back; the signing key and PDS from it;
//! 2. `fetch`: `GET {pds}/xrpc/com.atproto.sync.getRepo?did=…`, streamed into memory (progress
//!    reported through a callback), bounded by [`TrustOptions::max_repo_bytes`];
//! 3. `car`, `signature`, `walk`, `rebuild`: [`riptide_repo::verify_repo`] with the document's key
//!    (on a blocking thread: it is CPU-bound), then the commit's DID against the resolved DID.
//!
//! Every failure is a [`TrustVerdict`], never an `Err`: a repository that does not verify is an
//! answer, not an error of the tool.

use std::time::{Duration, Instant};

use riptide_car::CarErrorKind;
use riptide_repo::{MstError, RepoError, RepoReport};

use crate::error::ResolveError;
use crate::resolver::{net, read_limited, Resolver};

/// The verdict of a trust-chain run. Names ([`TrustVerdict::as_str`]) are a CLI contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TrustVerdict {
    /// Every step verified.
    Ok,
    /// A block's bytes do not hash to its CID (tampered repository).
    BadBlockCid,
    /// The commit signature does not verify with the document's key (tampered commit, or a
    /// document with the wrong key).
    BadSignature,
    /// A block the commit or MST points to is absent.
    MissingBlock,
    /// The MST rebuilt from its leaves is not the commit's `data` (tampered tree).
    RootMismatch,
    /// The repository does not decode as a repository.
    Malformed,
    /// The repository exceeds a limit.
    Limits,
    /// The repository's commit is for another DID than the handle's.
    DidMismatch,
    /// The handle does not resolve to a DID.
    HandleNotFound,
    /// The handle's DID document does not claim the handle (`alsoKnownAs`).
    HandleMismatch,
    /// The DID has no document.
    DidNotFound,
    /// The document is unusable: no or bad signing key, no PDS, wrong `id`, not a document.
    BadDocument,
    /// Resolution failed for a reason that may be transient (network, 5xx).
    ResolveFailed,
    /// Downloading the repository failed.
    FetchFailed,
}

impl TrustVerdict {
    /// The stable name.
    pub fn as_str(self) -> &'static str {
        match self {
            TrustVerdict::Ok => "ok",
            TrustVerdict::BadBlockCid => "bad-block-cid",
            TrustVerdict::BadSignature => "bad-signature",
            TrustVerdict::MissingBlock => "missing-block",
            TrustVerdict::RootMismatch => "root-mismatch",
            TrustVerdict::Malformed => "malformed",
            TrustVerdict::Limits => "limits",
            TrustVerdict::DidMismatch => "did-mismatch",
            TrustVerdict::HandleNotFound => "handle-not-found",
            TrustVerdict::HandleMismatch => "handle-mismatch",
            TrustVerdict::DidNotFound => "did-not-found",
            TrustVerdict::BadDocument => "bad-document",
            TrustVerdict::ResolveFailed => "resolve-failed",
            TrustVerdict::FetchFailed => "fetch-failed",
        }
    }

    /// The verdict for a repository verification error (shared with `riptide repo verify`).
    pub fn of_repo_error(e: &RepoError) -> TrustVerdict {
        match e {
            RepoError::Car(c) => match c.kind() {
                CarErrorKind::HashMismatch { .. } => TrustVerdict::BadBlockCid,
                CarErrorKind::TooLarge | CarErrorKind::TooManyBlocks => TrustVerdict::Limits,
                _ => TrustVerdict::Malformed,
            },
            RepoError::Signature(_) => TrustVerdict::BadSignature,
            RepoError::MissingCommit(_)
            | RepoError::MissingRecord { .. }
            | RepoError::Mst(MstError::MissingBlock(_)) => TrustVerdict::MissingBlock,
            RepoError::RootMismatch(_) => TrustVerdict::RootMismatch,
            _ => TrustVerdict::Malformed,
        }
    }

    /// The verdict for a resolution error.
    pub fn of_resolve_error(e: &ResolveError) -> TrustVerdict {
        match e {
            ResolveError::InvalidHandle(_)
            | ResolveError::HandleNotFound { .. }
            | ResolveError::AmbiguousHandle { .. } => TrustVerdict::HandleNotFound,
            ResolveError::HandleMismatch { .. } => TrustVerdict::HandleMismatch,
            ResolveError::DidNotFound(_) => TrustVerdict::DidNotFound,
            ResolveError::Doc { .. }
            | ResolveError::IdMismatch { .. }
            | ResolveError::NoPds(_)
            | ResolveError::InvalidDid(_)
            | ResolveError::UnsupportedMethod(_) => TrustVerdict::BadDocument,
            _ => TrustVerdict::ResolveFailed,
        }
    }
}

impl std::fmt::Display for TrustVerdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Time per step.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TrustTimings {
    /// Handle → DID → document.
    pub resolve: Duration,
    /// Downloading the repository.
    pub fetch: Duration,
    /// Reading the CAR (SHA-256 of every block).
    pub car: Duration,
    /// The commit signature.
    pub signature: Duration,
    /// The MST walk.
    pub walk: Duration,
    /// The MST rebuild.
    pub rebuild: Duration,
}

/// What a trust-chain run found.
#[derive(Debug, Clone)]
pub struct TrustReport {
    /// The handle as given.
    pub handle: String,
    /// The DID, once resolved.
    pub did: Option<String>,
    /// The PDS endpoint, once known.
    pub pds: Option<String>,
    /// The verdict.
    pub verdict: TrustVerdict,
    /// Why, when not ok.
    pub reason: Option<String>,
    /// The repository verification report, when verification ran to the end.
    pub repo: Option<RepoReport>,
    /// Bytes downloaded.
    pub bytes: u64,
    /// Time per step.
    pub timings: TrustTimings,
}

/// Options of [`verify_handle`].
#[derive(Debug, Clone, Copy)]
pub struct TrustOptions {
    /// Largest repository downloaded (default 4 GiB, the CAR reader's own limit).
    pub max_repo_bytes: usize,
}

impl Default for TrustOptions {
    fn default() -> Self {
        TrustOptions {
            max_repo_bytes: u32::MAX as usize,
        }
    }
}

/// Download progress: bytes so far, and the total if the server announced it.
pub trait Progress: Send {
    /// Called after each chunk.
    fn update(&mut self, done: u64, total: Option<u64>);
}

impl<F: FnMut(u64, Option<u64>) + Send> Progress for F {
    fn update(&mut self, done: u64, total: Option<u64>) {
        self(done, total)
    }
}

/// Runs the trust chain for `handle`.
pub async fn verify_handle(
    resolver: &Resolver,
    handle: &str,
    opts: &TrustOptions,
    progress: &mut dyn Progress,
) -> TrustReport {
    let mut report = TrustReport {
        handle: handle.to_owned(),
        did: None,
        pds: None,
        verdict: TrustVerdict::Ok,
        reason: None,
        repo: None,
        bytes: 0,
        timings: TrustTimings::default(),
    };
    let fail = |mut r: TrustReport, v: TrustVerdict, why: String| {
        r.verdict = v;
        r.reason = Some(why);
        r
    };

    // 1. resolve
    let t = Instant::now();
    let ident = match resolver.resolve_handle(handle).await {
        Ok(did) => {
            report.did = Some(did.to_string());
            resolver.confirm_handle(handle, did).await
        }
        Err(e) => Err(e),
    };
    report.timings.resolve = t.elapsed();
    let ident = match ident {
        Ok(i) => i,
        Err(e) => return fail(report, TrustVerdict::of_resolve_error(&e), e.to_string()),
    };
    let Some(pds) = ident.doc.pds() else {
        let e = ResolveError::NoPds(ident.did.to_string());
        return fail(report, TrustVerdict::of_resolve_error(&e), e.to_string());
    };
    report.pds = Some(pds.to_owned());
    let key = match ident.doc.signing_key() {
        Ok(k) => k,
        Err(e) => {
            return fail(
                report,
                TrustVerdict::BadDocument,
                format!("{}: {e}", ident.did),
            )
        }
    };

    // 2. fetch
    let t = Instant::now();
    let url = format!(
        "{}/xrpc/com.atproto.sync.getRepo?did={}",
        pds.trim_end_matches('/'),
        ident.did
    );
    let car = fetch_repo(resolver, &url, opts.max_repo_bytes, progress).await;
    report.timings.fetch = t.elapsed();
    let car = match car {
        Ok(c) => c,
        Err(e) => return fail(report, TrustVerdict::FetchFailed, e.to_string()),
    };
    report.bytes = car.len() as u64;

    // 3. verify (CPU-bound: off the async threads)
    let verified =
        tokio::task::spawn_blocking(move || riptide_repo::verify_repo(&car, Some(&key))).await;
    let repo = match verified {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => return fail(report, TrustVerdict::of_repo_error(&e), e.to_string()),
        Err(e) => {
            return fail(
                report,
                TrustVerdict::Malformed,
                format!("verification task failed: {e}"),
            )
        }
    };
    let t = repo.timings;
    report.timings.car = t.car;
    report.timings.signature = t.signature;
    report.timings.walk = t.walk;
    report.timings.rebuild = t.rebuild;
    let did_ok = repo.did == ident.did.as_str();
    let why = format!(
        "the repository is {}, the handle's DID is {}",
        repo.did, ident.did
    );
    report.repo = Some(repo);
    if !did_ok {
        return fail(report, TrustVerdict::DidMismatch, why);
    }
    report
}

/// Downloads a repository, streaming, with progress and a size bound.
async fn fetch_repo(
    resolver: &Resolver,
    url: &str,
    limit: usize,
    progress: &mut dyn Progress,
) -> Result<Vec<u8>, ResolveError> {
    let resp = resolver
        .http()
        .get(url)
        .send()
        .await
        .map_err(|e| net(url, e))?;
    let status = resp.status().as_u16();
    if status != 200 {
        return Err(ResolveError::Status {
            url: url.to_owned(),
            status,
        });
    }
    read_limited(url, resp, limit, progress).await
}
