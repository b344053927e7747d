//! Where the Python `Verifier` and `Firehose` get signing keys: DID documents given by the caller
//! (`did_docs=`), or resolution through the PLC directory and did:web (`plc_url=`, default
//! `https://plc.directory`), as `riptide verify --did-docs` and `riptide serve` get them.
//!
//! Resolution runs on a small tokio runtime owned here; the verifier calls the lookup on a plain
//! thread (a Python thread with the GIL released, or a client's worker), where
//! `ResolverKeys::resolving_on` blocks on that runtime for a DID not yet cached.

use std::sync::Arc;

use pyo3::exceptions::PyValueError;
use pyo3::PyResult;
use riptide_crypto::PublicKey;
use riptide_firehose::verify::{KeyLookup, KeyUnavailable};
use riptide_identity::DidDocs;
use riptide_resolver::{DocKeys, Resolver, ResolverConfig, ResolverKeys};

/// A key source for the verifier.
#[derive(Debug)]
pub enum Keys {
    /// A fixed set of DID documents.
    Docs(DidDocs),
    /// Resolution, with the runtime it runs on (kept alive as long as the keys).
    Resolving(
        ResolverKeys,
        #[allow(dead_code)] Arc<tokio::runtime::Runtime>,
    ),
}

impl Keys {
    /// Keys from `did_docs` (the JSON text of a DID → document object) when given, else from
    /// resolution through `plc_url` (default: the public PLC directory).
    pub fn new(did_docs: Option<&[u8]>, plc_url: Option<String>) -> PyResult<Keys> {
        if let Some(json) = did_docs {
            let docs = DidDocs::from_slice(json)
                .map_err(|e| PyValueError::new_err(format!("did_docs: {e}")))?;
            return Ok(Keys::Docs(docs));
        }
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("riptide-resolver")
            .enable_all()
            .build()
            .map_err(|e| PyValueError::new_err(format!("resolver runtime: {e}")))?;
        let mut cfg = ResolverConfig::default();
        if let Some(url) = plc_url {
            cfg.plc_url = url;
        }
        let resolver = {
            let _guard = rt.enter();
            Resolver::new(cfg).map_err(|e| PyValueError::new_err(format!("resolver: {e}")))?
        };
        let keys = ResolverKeys::new(resolver).resolving_on(rt.handle().clone());
        Ok(Keys::Resolving(keys, Arc::new(rt)))
    }
}

impl KeyLookup for Keys {
    fn key(&self, did: &str) -> Result<PublicKey, KeyUnavailable> {
        match self {
            Keys::Docs(docs) => DocKeys(docs).key(did),
            Keys::Resolving(keys, _) => keys.key(did),
        }
    }
}
