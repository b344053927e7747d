//! The resolver as the firehose verifier's key source.
//!
//! The problem: [`KeyLookup`] is synchronous (the verifier is I/O-free), resolution is not. The
//! verifier also remembers each DID's lookup outcome until that DID's next `#identity` frame, so a
//! key source that answered "unknown" merely because the document was not fetched *yet* would
//! make every later commit of the account `unknown-key`.
//!
//! The answer here is **warm, then verify**: before a frame goes to the verifier, its DID's
//! document is resolved (`Resolver::resolve_did`, coalesced and cached), and [`ResolverKeys`]
//! then answers from the cache without I/O. [`verify_resolving`] does both for one frame, and
//! invalidates the resolver's entry on `#identity` frames. A frame is never passed without its
//! signature being checked: if no key can be had it is `unknown-key` (counted by the verifier),
//! and [`ResolverKeys`] records every cache miss it answered "unknown" to, in
//! [`ResolverKeys::take_misses`], so a caller that skipped warming can resolve those DIDs, call
//! `Verifier::forget_key`, and verify the frames again.
//!
//! A verifier that runs on a plain OS thread (not a runtime thread), and whose caller warms the
//! cache ahead of it, can instead resolve the rare miss in place ([`ResolverKeys::resolving_on`]):
//! the entry evicted from the bounded LRU, expired, or dropped by an `#identity` between warming
//! and verifying is then fetched once, blocking that thread on the runtime, rather than answered
//! "unknown" for a key that exists (`riptide serve` does this).
//!
//! Which answers are "unknown" and which "unusable": no document (404, or a transient failure
//! not yet resolved) is [`KeyUnavailable::Unknown`]; a document without a usable `#atproto` key is
//! [`KeyUnavailable::Unusable`].
//!
//! [`DocKeys`] is the static counterpart: a set of DID documents loaded from a file
//! (`--did-docs`), with the same answers. It lives here because this is the crate that knows both
//! DID documents and the verifier's [`KeyLookup`] (`riptide-identity` does not depend on
//! `riptide-firehose`).

use std::sync::Mutex;

use riptide_crypto::PublicKey;
use riptide_firehose::verify::{KeyLookup, KeyUnavailable, Verifier};
use riptide_firehose::{DecodeOptions, FrameDecoder};

use riptide_identity::DidDocs;

use crate::error::ResolveError;
use crate::resolver::Resolver;

/// A set of DID documents (a `did_docs.json` file) as the verifier's key source: no document is
/// "unknown", a document without a usable key is "unusable".
#[derive(Debug, Clone, Copy)]
pub struct DocKeys<'d>(pub &'d DidDocs);

impl KeyLookup for DocKeys<'_> {
    fn key(&self, did: &str) -> Result<PublicKey, KeyUnavailable> {
        match self.0.signing_key(did) {
            Ok(k) => Ok(k),
            Err(riptide_identity::ResolveError::NotFound(_)) => Err(KeyUnavailable::Unknown),
            Err(riptide_identity::ResolveError::Doc { error, .. }) => {
                Err(KeyUnavailable::Unusable(error.to_string()))
            }
            Err(other) => Err(KeyUnavailable::Unusable(other.to_string())),
        }
    }
}

/// Most misses remembered between two [`ResolverKeys::take_misses`]; more are counted only.
pub const MAX_MISSES: usize = 4096;

#[derive(Debug, Default)]
struct Misses {
    dids: Vec<String>,
    overflow: u64,
}

/// A [`KeyLookup`] answering from a [`Resolver`]'s cache, never doing I/O.
#[derive(Debug)]
pub struct ResolverKeys {
    resolver: Resolver,
    misses: Mutex<Misses>,
    /// Where a miss is resolved in place (see [`ResolverKeys::resolving_on`]).
    rt: Option<tokio::runtime::Handle>,
}

impl ResolverKeys {
    /// Keys from `resolver`'s cache.
    pub fn new(resolver: Resolver) -> ResolverKeys {
        ResolverKeys {
            resolver,
            misses: Mutex::new(Misses::default()),
            rt: None,
        }
    }

    /// Resolves a cache miss on `rt`, blocking the calling thread, before answering (when
    /// called from outside any runtime; on a runtime thread a miss stays "unknown"). For
    /// verifiers on plain threads behind a warming stage (module docs).
    pub fn resolving_on(mut self, rt: tokio::runtime::Handle) -> ResolverKeys {
        self.rt = Some(rt);
        self
    }

    /// The resolver.
    pub fn resolver(&self) -> &Resolver {
        &self.resolver
    }

    /// The DIDs looked up while not cached (answered "unknown") since the last call (at most
    /// [`MAX_MISSES`]), and how many more misses there were beyond that.
    pub fn take_misses(&self) -> (Vec<String>, u64) {
        let m = std::mem::take(&mut *self.misses.lock().unwrap_or_else(|p| p.into_inner()));
        (m.dids, m.overflow)
    }
}

impl KeyLookup for ResolverKeys {
    fn key(&self, did: &str) -> Result<PublicKey, KeyUnavailable> {
        let mut cached = self.resolver.try_get(did);
        if let (None, Some(rt)) = (&cached, &self.rt) {
            if tokio::runtime::Handle::try_current().is_err() {
                tracing::debug!(did, "key not cached at verification: resolving");
                // The outcome lands in the cache (a transient failure does not: unknown).
                let _ = rt.block_on(self.resolver.resolve_did(did));
                cached = self.resolver.try_get(did);
            }
        }
        match cached {
            Some(Ok(doc)) => doc
                .signing_key()
                .map_err(|e| KeyUnavailable::Unusable(e.to_string())),
            Some(Err(ResolveError::DidNotFound(_))) => Err(KeyUnavailable::Unknown),
            Some(Err(e)) => Err(KeyUnavailable::Unusable(e.to_string())),
            None => {
                let mut m = self.misses.lock().unwrap_or_else(|p| p.into_inner());
                if m.dids.len() < MAX_MISSES {
                    m.dids.push(did.to_owned());
                } else {
                    m.overflow += 1;
                }
                Err(KeyUnavailable::Unknown)
            }
        }
    }
}

/// Peeks at the DID of a frame (header and payload only; blocks are not hashed here, the
/// verifier does that).
pub fn frame_did(decoder: &mut FrameDecoder, frame: &[u8]) -> Option<String> {
    decoder
        .decode(frame)
        .ok()
        .and_then(|f| f.body().did().map(str::to_owned))
}

/// Verifies one frame with keys from the resolver: resolves the frame's DID first (one
/// coalesced lookup per DID, cached), then verifies, then drops the resolver's entry if the
/// frame is `#identity`. `peek` is a decoder kept by the caller for the DID peek (use
/// `FrameDecoder::with_options(DecodeOptions::unverified())`: the verifier checks blocks).
///
/// Frames of one DID must go through one verifier in order (the verifier's contract).
pub async fn verify_resolving(
    verifier: &mut Verifier<ResolverKeys>,
    peek: &mut FrameDecoder,
    frame: &[u8],
) -> riptide_firehose::verify::Verdict {
    let did = frame_did(peek, frame);
    if let Some(did) = &did {
        let resolver = verifier.keys().resolver().clone();
        if resolver.try_get(did).is_none() {
            // The outcome lands in the cache (or, if transient, is absent and answered unknown).
            let _ = resolver.resolve_did(did).await;
            // The verifier may hold an earlier "unknown" for this DID: look again.
            verifier.forget_key(did);
        }
    }
    let report = verifier.check(frame);
    if report.kind == "identity" {
        if let Some(did) = report.did {
            verifier.keys().resolver().invalidate(did);
        }
    }
    report.verdict
}

/// A decoder for [`verify_resolving`]'s DID peek.
pub fn peek_decoder() -> FrameDecoder {
    FrameDecoder::with_options(DecodeOptions::unverified())
}

#[cfg(test)]
mod tests {
    use riptide_firehose::verify::Verdict;

    use super::*;

    /// The capture's frames all verify with the capture's own documents; a DID without a
    /// document is "unknown", not "unusable".
    #[test]
    fn doc_keys_verify_the_capture() {
        let Some(dir) = riptide_testdata::corpus() else {
            return;
        };
        let docs = DidDocs::load(&dir.join("jetstream-2026-07/did_docs.json")).unwrap();
        let file = std::fs::read(dir.join("jetstream-2026-07/firehose-frames.bin")).unwrap();
        let frames = riptide_firehose::corpus::split_frames(&file).unwrap();
        let mut v = Verifier::new(DocKeys(&docs));
        for f in &frames {
            v.verify(f.bytes);
        }
        assert_eq!(v.counts().get(Verdict::Ok), 150, "{}", v.counts());
        assert!(matches!(
            DocKeys(&docs).key("did:plc:aaaaaaaaaaaaaaaaaaaaaaaa"),
            Err(KeyUnavailable::Unknown)
        ));
    }
}
