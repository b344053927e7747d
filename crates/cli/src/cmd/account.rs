//! An account named by a handle or a DID, resolved once for the everyday commands that start
//! from one (`resolve`, `repo export`, `get at://…`), as indigo's `goat` resolves it.
//!
//! A handle is resolved to its DID and checked back (the DID document's `alsoKnownAs` must claim
//! it): a one-sided handle is an error. A DID is resolved to its document; for `resolve`, the
//! handle the document claims is then resolved too, and whether it points back is reported
//! ([`Account::handle_check`]), not an error: the account is the DID, the handle only a name
//! (`repo export` and `get` need only the DID and its document: [`HandleCheck::Skip`]).
//!
//! A failure is an [`AccountError`]: the verdict name `verify-handle` uses for it
//! (`handle-not-found`, `handle-mismatch`, `did-not-found`, `bad-document`, `resolve-failed`)
//! and the resolver's reason, said once by the command (`{input}: {verdict}: {reason}`, exit 1).

use std::sync::Arc;
use std::time::Duration;

use riptide_identity::DidDoc;
use riptide_resolver::{ResolveError, Resolver, ResolverConfig, TrustVerdict, DEFAULT_PLC_URL};

/// Where handles and DIDs are resolved (the same flags as `verify-handle`).
#[derive(clap::Args, Debug, Clone)]
pub struct ResolveArgs {
    /// PLC directory base URL.
    #[arg(long, default_value = DEFAULT_PLC_URL)]
    pub plc_url: String,
    /// Resolve handles with GET URL/.well-known/atproto-did (Host: HANDLE) instead of DNS and
    /// HTTPS (offline and test use).
    #[arg(long)]
    pub handle_resolver: Option<String>,
    /// Timeout of each request (DNS, a DID document, `get`'s proof), in seconds.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    pub timeout: u64,
}

impl ResolveArgs {
    /// A resolver with these settings.
    pub fn resolver(&self) -> anyhow::Result<Resolver> {
        Ok(Resolver::new(ResolverConfig {
            plc_url: self.plc_url.clone(),
            handle_resolver: self.handle_resolver.clone(),
            timeout: Duration::from_secs(self.timeout),
            ..ResolverConfig::default()
        })?)
    }
}

/// A resolved account.
#[derive(Debug)]
pub struct Account {
    /// The DID.
    pub did: String,
    /// Its document.
    pub doc: Arc<DidDoc>,
    /// The handle the document claims, if any.
    pub handle: Option<String>,
    /// Whether that handle resolves back to the DID (`Ok`), or why not. Always `Ok` when the
    /// account was named by its handle (checked both ways, or an error).
    pub handle_check: Result<(), String>,
}

/// Why an account could not be resolved: a verdict name (a CLI contract, shared with
/// `verify-handle`) and the reason.
#[derive(Debug)]
pub struct AccountError {
    /// The verdict.
    pub verdict: TrustVerdict,
    /// The resolver's error.
    pub error: ResolveError,
}

impl From<ResolveError> for AccountError {
    fn from(error: ResolveError) -> AccountError {
        AccountError {
            verdict: TrustVerdict::of_resolve_error(&error),
            error,
        }
    }
}

impl std::fmt::Display for AccountError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.verdict, self.error)
    }
}

impl std::error::Error for AccountError {}

/// How much of a DID's claimed handle to check ([`resolve`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandleCheck {
    /// Resolve the handle a DID's document claims and report whether it names the DID back
    /// (`resolve`, which shows the handle).
    Report,
    /// Leave it: the command uses the DID and its document only (`repo export`, `get`).
    Skip,
}

/// Resolves `input`, a handle (`alice.bsky.social`, `@alice.bsky.social`) or a DID. A handle is
/// always checked both ways; a DID's claimed handle as `check` says (unchecked, it is reported
/// as such in [`Account::handle_check`]).
pub async fn resolve(
    resolver: &Resolver,
    input: &str,
    check: HandleCheck,
) -> Result<Account, AccountError> {
    if input.starts_with("did:") {
        let doc = resolver.resolve_did(input).await?;
        let handle = doc.handle().map(|h| h.to_string());
        let handle_check = match &handle {
            None => Ok(()),
            Some(_) if check == HandleCheck::Skip => Err("not checked".to_owned()),
            Some(h) => match resolver.resolve_handle(h).await {
                Ok(did) if did.as_str() == input => Ok(()),
                Ok(did) => Err(format!("{h} resolves to {did}, not to {input}")),
                Err(e) => Err(e.to_string()),
            },
        };
        return Ok(Account {
            did: input.to_owned(),
            doc,
            handle,
            handle_check,
        });
    }
    let handle = input.strip_prefix('@').unwrap_or(input);
    let ident = resolver.identity(handle).await?;
    Ok(Account {
        did: ident.did.to_string(),
        doc: ident.doc,
        handle: Some(ident.handle.to_string()),
        handle_check: Ok(()),
    })
}

/// The account's PDS base URL, or why it has none.
pub fn pds(a: &Account) -> Result<&str, AccountError> {
    a.doc
        .pds()
        .map(|p| p.trim_end_matches('/'))
        .ok_or_else(|| ResolveError::NoPds(a.did.clone()).into())
}

/// A tokio runtime for one command's network requests.
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
}
