//! A set of DID documents keyed by DID, loaded from a file.
//!
//! Why: verifying a captured stream offline needs the documents as they were at capture time, so
//! captures ship them beside the frames (`did_docs.json`: one JSON object, DID → document). This is
//! also the shape a resolver's cache will fill later.
//!
//! Loading is strict: a document that is not a DID document, or that is filed under a DID other
//! than its `id`, fails the whole file (the file is wrong, not one account). A document without a
//! usable key loads, and [`DidDocs::signing_key`] reports why for that DID alone.

use std::collections::HashMap;
use std::path::Path;

use riptide_crypto::PublicKey;
use serde_json::Value;

use crate::doc::DidDoc;
use crate::error::{DocsError, ResolveError};

/// DID documents by DID.
#[derive(Debug, Clone, Default)]
pub struct DidDocs {
    docs: HashMap<String, DidDoc>,
}

impl DidDocs {
    /// An empty set.
    pub fn new() -> DidDocs {
        DidDocs::default()
    }

    /// Reads a `did_docs.json` file.
    pub fn load(path: &Path) -> Result<DidDocs, DocsError> {
        let bytes = std::fs::read(path).map_err(|source| DocsError::Io {
            path: path.display().to_string(),
            source,
        })?;
        DidDocs::from_slice(&bytes)
    }

    /// Parses the JSON of a `did_docs.json` file.
    pub fn from_slice(json: &[u8]) -> Result<DidDocs, DocsError> {
        let v: Value = serde_json::from_slice(json)?;
        let map = v.as_object().ok_or(DocsError::NotAnObject)?;
        let mut docs = HashMap::with_capacity(map.len());
        for (did, doc) in map {
            let doc = DidDoc::from_value(doc).map_err(|error| DocsError::Doc {
                did: did.clone(),
                error,
            })?;
            if doc.did().as_str() != did {
                return Err(DocsError::IdMismatch {
                    key: did.clone(),
                    id: doc.did().to_string(),
                });
            }
            docs.insert(did.clone(), doc);
        }
        Ok(DidDocs { docs })
    }

    /// Adds (or replaces) a document under its own DID.
    pub fn insert(&mut self, doc: DidDoc) {
        self.docs.insert(doc.did().to_string(), doc);
    }

    /// The document of `did`, if known.
    pub fn get(&self, did: &str) -> Option<&DidDoc> {
        self.docs.get(did)
    }

    /// The signing key of `did`, parsed (each call parses: cache it when verifying).
    pub fn signing_key(&self, did: &str) -> Result<PublicKey, ResolveError> {
        let doc = self
            .docs
            .get(did)
            .ok_or_else(|| ResolveError::NotFound(did.to_owned()))?;
        doc.signing_key().map_err(|error| ResolveError::Doc {
            did: did.to_owned(),
            error,
        })
    }

    /// Number of documents.
    pub fn len(&self) -> usize {
        self.docs.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.docs.is_empty()
    }

    /// Every document, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = &DidDoc> + '_ {
        self.docs.values()
    }
}

impl FromIterator<DidDoc> for DidDocs {
    fn from_iter<I: IntoIterator<Item = DidDoc>>(iter: I) -> DidDocs {
        let mut d = DidDocs::new();
        for doc in iter {
            d.insert(doc);
        }
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DocError;

    #[test]
    fn strict_loading_lenient_keys() {
        let ok = br##"{"did:plc:a":{"id":"did:plc:a"},
                       "did:plc:b":{"id":"did:plc:b","verificationMethod":[{"id":"#atproto","type":"Multikey",
                        "publicKeyMultibase":"zQ3shqwJEJyMBsBXCWyCBpUBMqxcon9oHB7mCvx4sSpMdLJwc"}]}}"##;
        let docs = DidDocs::from_slice(ok).unwrap();
        assert_eq!(docs.len(), 2);
        assert!(docs.signing_key("did:plc:b").is_ok());
        assert_eq!(
            docs.signing_key("did:plc:a"),
            Err(ResolveError::Doc {
                did: "did:plc:a".into(),
                error: DocError::NoSigningKey
            })
        );
        assert_eq!(
            docs.signing_key("did:plc:c"),
            Err(ResolveError::NotFound("did:plc:c".into()))
        );

        assert!(matches!(
            DidDocs::from_slice(b"[]"),
            Err(DocsError::NotAnObject)
        ));
        assert!(matches!(DidDocs::from_slice(b"{"), Err(DocsError::Json(_))));
        assert!(matches!(
            DidDocs::from_slice(br#"{"did:plc:a":{"id":"did:plc:b"}}"#),
            Err(DocsError::IdMismatch { .. })
        ));
        assert!(matches!(
            DidDocs::from_slice(br#"{"did:plc:a":{}}"#),
            Err(DocsError::Doc { .. })
        ));
        assert!(matches!(
            DidDocs::load(Path::new("/nonexistent/did_docs.json")),
            Err(DocsError::Io { .. })
        ));
    }
}
