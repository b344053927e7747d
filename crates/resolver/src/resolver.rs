//! The resolver: handle → DID (DNS TXT, then HTTPS well-known), DID → document (`did:plc`
//! through a PLC directory, `did:web` through the host's `/.well-known/did.json`), and the
//! bidirectional handle check.
//!
//! Handle resolution follows <https://atproto.com/specs/handle>: the DNS TXT record
//! `_atproto.<handle>` holding `did=<DID>` is tried first; if DNS yields no such record (or the
//! DNS query fails), `https://<handle>/.well-known/atproto-did` is tried, whose body is the DID.
//! TXT records naming several different DIDs make resolution fail (no HTTPS fallback). A DID from
//! either method is only a claim until the DID's document lists the handle in `alsoKnownAs`:
//! [`Resolver::identity`] checks both directions.
//!
//! Test and offline use: [`ResolverConfig::handle_resolver`] replaces DNS and HTTPS by one GET of
//! `{base}/.well-known/atproto-did` with the handle as the `Host` header (as a virtual-host
//! server such as `riptide sim` answers it). It is an explicit option, not a fallback.
//!
//! One identity source: [`ResolverConfig::did_docs`] (a `--did-docs` file) replaces PLC and
//! did:web for DID documents altogether, so that everything built on one resolver (the
//! verifier's keys, resync's key and PDS) agrees on an account's identity. Before, `riptide
//! serve --did-docs` verified frames with the file's keys but checked resynced repositories with
//! the public PLC's (issue 40).
//!
//! Every response body is read with a size limit, so a hostile server cannot make us buffer
//! without bound. Requests have a timeout.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures_util::FutureExt;
use hickory_resolver::config::{NameServerConfigGroup, ResolverConfig as DnsConfig, ResolverOpts};
use hickory_resolver::error::ResolveErrorKind;
use hickory_resolver::TokioAsyncResolver;
use riptide_identity::DidDoc;
use riptide_syntax::{Did, Handle};

use crate::cache::{CacheCounts, DocCache, DocResult, Lookup};
use crate::error::ResolveError;
use crate::trust::Progress;

/// The default PLC directory.
pub const DEFAULT_PLC_URL: &str = "https://plc.directory";

/// Largest DID document accepted.
const MAX_DOC_BYTES: usize = 1 << 20;
/// Largest `/.well-known/atproto-did` body accepted (a DID is at most 2 KiB).
const MAX_WELL_KNOWN_BYTES: usize = 4096;

/// How a [`Resolver`] reaches the network and caches.
#[derive(Debug, Clone)]
pub struct ResolverConfig {
    /// PLC directory base URL (`GET {plc_url}/{did}`), default [`DEFAULT_PLC_URL`].
    pub plc_url: String,
    /// Test/offline only: resolve handles with `GET {base}/.well-known/atproto-did`, `Host:
    /// <handle>`, instead of DNS and HTTPS.
    pub handle_resolver: Option<String>,
    /// DNS servers for the TXT lookup; empty means the system configuration.
    pub dns_servers: Vec<SocketAddr>,
    /// Timeout of each HTTP request (a repository download included) and DNS query.
    pub timeout: Duration,
    /// Most DID documents cached.
    pub cache_capacity: usize,
    /// How long a document is trusted before it is fetched again.
    pub ttl: Duration,
    /// How long a definite failure (no such DID, unusable document) is remembered.
    pub negative_ttl: Duration,
    /// A fixed set of DID documents (a `--did-docs` file): when set, DID documents come from it
    /// alone, never the network (a DID not in it is [`ResolveError::DidNotFound`]).
    pub did_docs: Option<StaticDocs>,
    /// A local copy of the PLC directory (`riptide plc mirror`): `did:plc` documents come from
    /// it; a DID it does not hold (newer than its cursor) is asked of `plc_url`, counted
    /// ([`Resolver::plc_mirror_lookups`]). A tombstoned DID is [`ResolveError::DidNotFound`],
    /// as the directory answers it.
    pub plc_mirror: Option<Arc<crate::plc_mirror::PlcMirror>>,
}

/// A shared, fixed set of DID documents ([`ResolverConfig::did_docs`]); its `Debug` says how many.
#[derive(Clone)]
pub struct StaticDocs(pub Arc<riptide_identity::DidDocs>);

impl std::fmt::Debug for StaticDocs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "StaticDocs({} documents)", self.0.len())
    }
}

impl Default for ResolverConfig {
    fn default() -> Self {
        ResolverConfig {
            plc_url: DEFAULT_PLC_URL.to_owned(),
            handle_resolver: None,
            dns_servers: Vec::new(),
            timeout: Duration::from_secs(30),
            cache_capacity: 100_000,
            ttl: Duration::from_secs(3600),
            negative_ttl: Duration::from_secs(60),
            did_docs: None,
            plc_mirror: None,
        }
    }
}

/// A handle confirmed in both directions: it resolves to `did`, and `did`'s document claims it.
#[derive(Debug, Clone)]
pub struct Identity {
    /// The handle (lowercased).
    pub handle: Handle,
    /// The DID.
    pub did: Did,
    /// The DID document.
    pub doc: Arc<DidDoc>,
}

pub(crate) struct Inner {
    pub(crate) cfg: ResolverConfig,
    pub(crate) http: reqwest::Client,
    dns: tokio::sync::OnceCell<Result<TokioAsyncResolver, String>>,
    pub(crate) cache: DocCache,
    plc_pause: crate::plc_pause::PlcPause,
}

/// Resolves handles and DIDs, with a shared, coalescing document cache. Cheap to clone (one
/// `Arc`); clones share the cache.
#[derive(Clone)]
pub struct Resolver {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for Resolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resolver")
            .field("cfg", &self.inner.cfg)
            .field("cache", &self.inner.cache)
            .finish()
    }
}

pub(crate) fn net(url: &str, e: impl std::fmt::Display) -> ResolveError {
    ResolveError::Network {
        url: url.to_owned(),
        why: e.to_string(),
    }
}

/// Capacity reserved up front from a `Content-Length` (a claim of the server's, not a fact):
/// beyond this the body grows as it arrives.
const MAX_PREALLOC: u64 = 64 << 20;

/// Reads a response body of at most `limit` bytes, reporting progress after each chunk (with the
/// announced length, if any). A body shorter than its `Content-Length` is a network error.
pub(crate) async fn read_limited(
    url: &str,
    mut resp: reqwest::Response,
    limit: usize,
    progress: &mut dyn Progress,
) -> Result<Vec<u8>, ResolveError> {
    let too_large = || ResolveError::TooLarge {
        url: url.to_owned(),
        limit,
    };
    let total = resp.content_length();
    if total.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    let mut body = Vec::with_capacity(total.unwrap_or(0).min(MAX_PREALLOC) as usize);
    while let Some(chunk) = resp.chunk().await.map_err(|e| net(url, e))? {
        if body.len() + chunk.len() > limit {
            return Err(too_large());
        }
        body.extend_from_slice(&chunk);
        progress.update(body.len() as u64, total);
    }
    if total.is_some_and(|n| n != body.len() as u64) {
        return Err(net(url, "connection closed early"));
    }
    Ok(body)
}

/// `did`'s document from a fixed set ([`ResolverConfig::did_docs`]).
fn static_doc(docs: &StaticDocs, did: &str) -> DocResult {
    docs.0
        .get(did)
        .map(|d| Arc::new(d.clone()))
        .ok_or_else(|| ResolveError::DidNotFound(did.to_owned()))
}

impl Resolver {
    /// A resolver with `cfg`. Fails only if the HTTP client cannot be built (TLS setup).
    pub fn new(cfg: ResolverConfig) -> Result<Resolver, ResolveError> {
        let http = reqwest::Client::builder()
            .timeout(cfg.timeout)
            .connect_timeout(cfg.timeout.min(Duration::from_secs(10)))
            .redirect(reqwest::redirect::Policy::limited(5))
            .user_agent(concat!("riptide/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| net("(client)", e))?;
        let cache = DocCache::new(cfg.cache_capacity, cfg.ttl, cfg.negative_ttl);
        Ok(Resolver {
            inner: Arc::new(Inner {
                cfg,
                http,
                dns: tokio::sync::OnceCell::new(),
                cache,
                plc_pause: Default::default(),
            }),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &ResolverConfig {
        &self.inner.cfg
    }

    /// `429`s the PLC directory has answered this resolver (each waited out by every lookup:
    /// [`crate::plc_pause`]).
    pub fn plc_rate_limited(&self) -> u64 {
        self.inner.plc_pause.count()
    }

    /// `did:plc` lookups answered by the PLC mirror ([`ResolverConfig::plc_mirror`]) and asked
    /// of the directory because the mirror did not hold the DID: (mirror, directory).
    pub fn plc_mirror_lookups(&self) -> (u64, u64) {
        self.inner
            .cfg
            .plc_mirror
            .as_ref()
            .map_or((0, 0), |m| m.lookups())
    }

    /// `did`'s document from the PLC directory itself, past the mirror and the cache: for a
    /// caller whose repository failed verification with the mirror's document, which may be
    /// older than the account's last operation (the copy does not follow the directory live).
    /// `None` when there is nothing past the mirror to ask: no mirror, a fixed `--did-docs`
    /// set, or not a `did:plc`. The caller says whether it differed
    /// ([`crate::plc_mirror::PlcMirror::note_recheck`], through
    /// [`Resolver::note_plc_mirror_recheck`]).
    pub async fn resolve_did_past_mirror(&self, did: &str) -> Option<DocResult> {
        let cfg = &self.inner.cfg;
        if cfg.plc_mirror.is_none() || cfg.did_docs.is_some() || !did.starts_with("did:plc:") {
            return None;
        }
        Some(
            self.inner
                .fetch_doc_json_from(did, false)
                .await
                .map(|(_, doc)| Arc::new(doc)),
        )
    }

    /// Counts a [`Resolver::resolve_did_past_mirror`] and whether the directory's document
    /// differed from the mirror's (no-op without a mirror).
    pub fn note_plc_mirror_recheck(&self, stale: bool) {
        if let Some(m) = &self.inner.cfg.plc_mirror {
            m.note_recheck(stale);
        }
    }

    /// [`Resolver::resolve_did_past_mirror`]s so far: (asked, found stale).
    pub fn plc_mirror_rechecks(&self) -> (u64, u64) {
        self.inner
            .cfg
            .plc_mirror
            .as_ref()
            .map_or((0, 0), |m| m.rechecks())
    }

    /// The HTTP client (shared connection pool), for fetches that follow resolution.
    pub fn http(&self) -> &reqwest::Client {
        &self.inner.http
    }

    /// Cache counters (hits, coalesced lookups, fetches, …).
    pub fn cache_counts(&self) -> CacheCounts {
        self.inner.cache.counts()
    }

    /// Documents (and negative entries) currently cached.
    pub fn cached_len(&self) -> usize {
        self.inner.cache.len()
    }

    /// Forgets what is known of `did` (call on its `#identity` event). A lookup in flight for it
    /// completes for its waiters but is not cached; the next lookup fetches again.
    pub fn invalidate(&self, did: &str) {
        tracing::debug!(did, "identity cache invalidated");
        self.inner.cache.invalidate(did);
    }

    /// The cached outcome for `did`, if live, without any I/O (for synchronous callers such as
    /// the firehose verifier's key lookup).
    pub fn try_get(&self, did: &str) -> Option<DocResult> {
        if let Some(docs) = &self.inner.cfg.did_docs {
            return Some(static_doc(docs, did));
        }
        self.inner.cache.try_get(did)
    }

    /// `did`'s document: from the cache, by joining a lookup in flight, or fetched.
    pub async fn resolve_did(&self, did: &str) -> DocResult {
        let inner = &self.inner;
        if let Some(docs) = &inner.cfg.did_docs {
            return static_doc(docs, did);
        }
        let lookup = inner.cache.lookup(did, |id| {
            let inner = Arc::clone(inner);
            let did = did.to_owned();
            // Spawned, so the lookup completes (and leaves the in-flight table) even if every
            // waiter gives up; the waiters share its outcome.
            let task = tokio::spawn(async move {
                let r = inner.fetch_doc(&did).await.map(Arc::new);
                inner.cache.complete(&did, id, &r);
                r
            });
            async move { task.await.unwrap_or_else(|e| Err(net("(lookup task)", e))) }
                .boxed()
                .shared()
        });
        match lookup {
            Lookup::Cached(v) => v,
            Lookup::Flight(f) => f.await,
        }
    }

    /// `did`'s document as its directory or host serves it (JSON), checked as
    /// [`Resolver::resolve_did`] checks it: always fetched (the cache keeps parsed documents
    /// only), for a caller that shows the document (`riptide resolve`).
    pub async fn did_document_json(&self, did: &str) -> Result<serde_json::Value, ResolveError> {
        self.inner.fetch_doc_json(did).await.map(|(json, _)| json)
    }

    /// The DID a handle names (one direction only: see [`Resolver::identity`]).
    pub async fn resolve_handle(&self, handle: &str) -> Result<Did, ResolveError> {
        let h =
            Handle::parse(handle).map_err(|_| ResolveError::InvalidHandle(handle.to_owned()))?;
        if let Some(base) = &self.inner.cfg.handle_resolver {
            return self.well_known(base.trim_end_matches('/'), &h, true).await;
        }
        // Whether a DNS server answered (a record or none): a handle is "not found" only if
        // something that could have named its DID was asked and did not.
        let (dns, dns_answered) = match self.dns_txt(&h).await {
            Ok(Some(did)) => return Ok(did),
            Err(e @ ResolveError::AmbiguousHandle { .. }) => return Err(e),
            Ok(None) => ("DNS: no _atproto TXT record".to_owned(), true),
            Err(e) => (format!("DNS: {e}"), false),
        };
        let not_found = |why: String| ResolveError::HandleNotFound {
            handle: h.to_string(),
            why: format!("{dns}; {why}"),
        };
        match self.well_known(&format!("https://{h}"), &h, false).await {
            Ok(did) => Ok(did),
            Err(ResolveError::HandleNotFound { why, .. }) => Err(not_found(why)),
            // DNS answered, the handle's host did not: it has no HTTPS record either.
            Err(ResolveError::Network { why, .. }) if dns_answered => {
                Err(not_found(format!("HTTPS: {why}")))
            }
            // Neither method could be asked (no DNS answer, no connection): the network failed,
            // which says nothing about the handle (issue 39: offline was `handle-not-found`).
            Err(ResolveError::Network { url, why }) => Err(ResolveError::Network {
                url: format!("_atproto.{h} (DNS) and {url}"),
                why: format!("{dns}; HTTPS: {why}"),
            }),
            Err(e) => Err(e),
        }
    }

    /// Resolves `handle` to a DID and its document, and checks that the document claims the
    /// handle back (`alsoKnownAs`).
    pub async fn identity(&self, handle: &str) -> Result<Identity, ResolveError> {
        let did = self.resolve_handle(handle).await?;
        self.confirm_handle(handle, did).await
    }

    /// The other direction: fetches `did`'s document and checks it claims `handle`.
    pub async fn confirm_handle(&self, handle: &str, did: Did) -> Result<Identity, ResolveError> {
        let doc = self.resolve_did(did.as_str()).await?;
        let handle =
            Handle::parse(handle).map_err(|_| ResolveError::InvalidHandle(handle.to_owned()))?;
        if doc.handle() != Some(&handle) {
            return Err(ResolveError::HandleMismatch {
                handle: handle.to_string(),
                did: did.to_string(),
                claimed: doc
                    .handle()
                    .map_or_else(|| "none".to_owned(), |h| h.to_string()),
            });
        }
        Ok(Identity { handle, did, doc })
    }

    async fn dns(&self) -> Result<&TokioAsyncResolver, ResolveError> {
        let cfg = &self.inner.cfg;
        let r = self
            .inner
            .dns
            .get_or_init(|| async {
                let mut opts = ResolverOpts::default();
                opts.timeout = cfg.timeout.min(Duration::from_secs(5));
                opts.attempts = 2;
                if cfg.dns_servers.is_empty() {
                    let (conf, mut sys) = hickory_resolver::system_conf::read_system_conf()
                        .map_err(|e| e.to_string())?;
                    sys.timeout = opts.timeout;
                    sys.attempts = opts.attempts;
                    Ok(TokioAsyncResolver::tokio(conf, sys))
                } else {
                    let mut group = NameServerConfigGroup::new();
                    for a in &cfg.dns_servers {
                        group.merge(NameServerConfigGroup::from_ips_clear(
                            &[a.ip()],
                            a.port(),
                            true,
                        ));
                    }
                    Ok(TokioAsyncResolver::tokio(
                        DnsConfig::from_parts(None, vec![], group),
                        opts,
                    ))
                }
            })
            .await;
        r.as_ref().map_err(|e| net("(DNS configuration)", e))
    }

    /// The DID of the `_atproto.<handle>` TXT record: `Ok(None)` when there is none.
    async fn dns_txt(&self, h: &Handle) -> Result<Option<Did>, ResolveError> {
        let name = format!("_atproto.{h}.");
        let dns = self.dns().await?;
        let lookup = match dns.txt_lookup(name.as_str()).await {
            Ok(l) => l,
            Err(e) if matches!(e.kind(), ResolveErrorKind::NoRecordsFound { .. }) => {
                return Ok(None)
            }
            Err(e) => return Err(net(&name, e)),
        };
        let mut dids: Vec<Did> = Vec::new();
        for txt in lookup.iter() {
            let text: Vec<u8> = txt
                .txt_data()
                .iter()
                .flat_map(|p| p.iter().copied())
                .collect();
            let Ok(text) = std::str::from_utf8(&text) else {
                continue;
            };
            let Some(d) = text.trim().strip_prefix("did=") else {
                continue;
            };
            if let Ok(did) = Did::parse(d) {
                if !dids.contains(&did) {
                    dids.push(did);
                }
            }
        }
        match dids.len() {
            0 => Ok(None),
            1 => Ok(dids.pop()),
            _ => Err(ResolveError::AmbiguousHandle {
                handle: h.to_string(),
                dids: dids
                    .iter()
                    .map(|d| d.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            }),
        }
    }

    /// `GET {base}/.well-known/atproto-did`, with `Host: <handle>` when `virtual_host`.
    async fn well_known(
        &self,
        base: &str,
        h: &Handle,
        virtual_host: bool,
    ) -> Result<Did, ResolveError> {
        let url = format!("{base}/.well-known/atproto-did");
        let mut req = self.inner.http.get(&url);
        if virtual_host {
            req = req.header(reqwest::header::HOST, h.as_str());
        }
        let resp = match req.send().await {
            Ok(r) => r,
            // Whether a host that does not answer means "no HTTPS record" depends on whether
            // DNS answered ([`Resolver::resolve_handle`]).
            Err(e) => return Err(net(&url, e)),
        };
        let status = resp.status();
        if status.is_server_error() || status.as_u16() == 429 {
            return Err(ResolveError::Status {
                url,
                status: status.as_u16(),
            });
        }
        if !status.is_success() {
            return Err(ResolveError::HandleNotFound {
                handle: h.to_string(),
                why: format!("HTTPS: HTTP {status}"),
            });
        }
        let body = read_limited(&url, resp, MAX_WELL_KNOWN_BYTES, &mut |_, _| {}).await?;
        let text = String::from_utf8_lossy(&body);
        Did::parse(text.trim()).map_err(|_| ResolveError::HandleNotFound {
            handle: h.to_string(),
            why: "HTTPS: the body is not a DID".to_owned(),
        })
    }
}

impl Inner {
    /// `did`'s document from the PLC mirror, if there is one and it holds the DID (`None`: ask
    /// the directory). A mirror that cannot be read is a local fault: said, and the directory
    /// asked.
    fn mirror_doc(&self, did: &Did) -> Result<Option<(serde_json::Value, DidDoc)>, ResolveError> {
        let Some(m) = &self.cfg.plc_mirror else {
            return Ok(None);
        };
        let found = match m.lookup(did.as_str()) {
            Ok(f) => f,
            Err(e) => {
                tracing::error!(did = did.as_str(), error = %e, "PLC mirror unreadable; asking the directory");
                return Ok(None);
            }
        };
        match found {
            None => Ok(None),
            Some(crate::plc_mirror::MirrorDoc::Tombstoned) => {
                Err(ResolveError::DidNotFound(did.to_string()))
            }
            Some(crate::plc_mirror::MirrorDoc::Doc(json)) => {
                let doc = DidDoc::from_value(&json).map_err(|error| ResolveError::Doc {
                    did: did.to_string(),
                    error,
                })?;
                Ok(Some((json, doc)))
            }
        }
    }

    /// The document URL of a DID.
    fn doc_url(&self, did: &Did) -> Result<String, ResolveError> {
        match did.method() {
            "plc" => Ok(format!(
                "{}/{}",
                self.cfg.plc_url.trim_end_matches('/'),
                did
            )),
            "web" => {
                // atproto uses hostname-level did:web only (no path); a port is `%3A`-encoded.
                let id = did.identifier();
                if id.contains(':') {
                    return Err(ResolveError::UnsupportedMethod(format!(
                        "{did} (did:web with a path)"
                    )));
                }
                let host = id.replace("%3A", ":").replace("%3a", ":");
                let bare = host.split(':').next().unwrap_or_default();
                // Plain HTTP only for the loopback development hosts, as did:web allows.
                let scheme = if bare == "localhost" || bare == "127.0.0.1" {
                    "http"
                } else {
                    "https"
                };
                Ok(format!("{scheme}://{host}/.well-known/did.json"))
            }
            m => Err(ResolveError::UnsupportedMethod(m.to_owned())),
        }
    }

    async fn fetch_doc(&self, did: &str) -> Result<DidDoc, ResolveError> {
        self.fetch_doc_json(did).await.map(|(_, doc)| doc)
    }

    /// `did`'s document as served (JSON) and parsed, checked as [`Inner::fetch_doc`] checks it.
    async fn fetch_doc_json(&self, did: &str) -> Result<(serde_json::Value, DidDoc), ResolveError> {
        self.fetch_doc_json_from(did, true).await
    }

    /// [`Inner::fetch_doc_json`], from the PLC mirror first only if `mirror`.
    async fn fetch_doc_json_from(
        &self,
        did: &str,
        mirror: bool,
    ) -> Result<(serde_json::Value, DidDoc), ResolveError> {
        let did = Did::parse(did).map_err(|_| ResolveError::InvalidDid(did.to_owned()))?;
        let plc = did.method() == "plc";
        if plc && mirror {
            if let Some(found) = self.mirror_doc(&did)? {
                return Ok(found);
            }
        }
        let url = self.doc_url(&did)?;
        tracing::debug!(did = did.as_str(), url, "fetching DID document");
        let mut waits = 0;
        let resp = loop {
            if plc {
                self.plc_pause.wait().await;
            }
            let resp = self.http.get(&url).send().await.map_err(|e| net(&url, e))?;
            if plc && resp.status().as_u16() == 429 && waits < crate::plc_pause::MAX_WAITS {
                let asked = crate::resync::rate_limit_wait(resp.headers(), SystemTime::now());
                self.plc_pause.rate_limited(&url, asked);
                waits += 1;
                continue;
            }
            break resp;
        };
        let status = resp.status().as_u16();
        match status {
            200 => {}
            404 | 410 => return Err(ResolveError::DidNotFound(did.to_string())),
            _ => return Err(ResolveError::Status { url, status }),
        }
        let body = read_limited(&url, resp, MAX_DOC_BYTES, &mut |_, _| {}).await?;
        let text = std::str::from_utf8(&body).map_err(|_| ResolveError::Doc {
            did: did.to_string(),
            error: riptide_identity::DocError::Malformed("not UTF-8".to_owned()),
        })?;
        let bad = |error| ResolveError::Doc {
            did: did.to_string(),
            error,
        };
        let json: serde_json::Value = serde_json::from_str(text).map_err(|e| {
            bad(riptide_identity::DocError::Malformed(format!(
                "not JSON: {e}"
            )))
        })?;
        let doc = DidDoc::from_value(&json).map_err(bad)?;
        if doc.did() != &did {
            return Err(ResolveError::IdMismatch {
                did: did.to_string(),
                id: doc.did().to_string(),
            });
        }
        Ok((json, doc))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn document_urls() {
        let r = Resolver::new(ResolverConfig {
            plc_url: "http://plc.local/".into(),
            ..ResolverConfig::default()
        })
        .unwrap();
        let url = |d: &str| r.inner.doc_url(&Did::parse(d).unwrap());
        assert_eq!(
            url("did:plc:ewvi7nxzyoun6zhxrhs64oiz").unwrap(),
            "http://plc.local/did:plc:ewvi7nxzyoun6zhxrhs64oiz"
        );
        assert_eq!(
            url("did:web:example.com").unwrap(),
            "https://example.com/.well-known/did.json"
        );
        assert_eq!(
            url("did:web:localhost%3A8080").unwrap(),
            "http://localhost:8080/.well-known/did.json"
        );
        assert_eq!(
            url("did:web:127.0.0.1%3A9").unwrap(),
            "http://127.0.0.1:9/.well-known/did.json"
        );
        // Not loopback: HTTPS even with a port.
        assert_eq!(
            url("did:web:example.com%3A8443").unwrap(),
            "https://example.com:8443/.well-known/did.json"
        );
        assert!(matches!(
            url("did:web:example.com:u:alice"),
            Err(ResolveError::UnsupportedMethod(_))
        ));
        assert!(matches!(
            url("did:key:zQ3shqwJEJyMBsBXCWyCBpUBMqxcon9oHB7mCvx4sSpMdLJwc"),
            Err(ResolveError::UnsupportedMethod(_))
        ));
    }

    #[test]
    fn error_classes() {
        assert!(ResolveError::Status {
            url: "u".into(),
            status: 503
        }
        .is_transient());
        assert!(ResolveError::Status {
            url: "u".into(),
            status: 429
        }
        .is_transient());
        assert!(ResolveError::Network {
            url: "u".into(),
            why: "reset".into()
        }
        .is_transient());
        assert!(ResolveError::Status {
            url: "u".into(),
            status: 400
        }
        .is_definite());
        assert!(ResolveError::DidNotFound("did:plc:x".into()).is_definite());
    }
}
