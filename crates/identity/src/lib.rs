//! atproto identity: DID documents and the signing keys, handles and PDS endpoints they declare.
//!
//! Why this crate exists: a commit is only as trustworthy as the key that signed it, and that key
//! is whatever the account's DID document says under `#atproto`. Verifying the firehose therefore
//! needs, for every DID, its document parsed into the three things atproto reads from it
//! (<https://atproto.com/specs/did>): the signing key (the `#atproto` verification method), the
//! handle (the first `at://` entry of `alsoKnownAs`) and the PDS (the `#atproto_pds` service of
//! type `AtprotoPersonalDataServer`).
//!
//! What it does today: parse DID documents ([`DidDoc`]) and hold a set of them loaded from a file
//! ([`DidDocs`], the `did_docs.json` shape: a JSON object mapping DID → document), which is what
//! offline verification of a captured stream needs. What it does not do: any I/O. Resolving
//! handles and DIDs over the network (DNS, PLC directory, `did:web`), the bidirectional handle
//! check and the expiring cache are `riptide-resolver`, built on these types, so that code which
//! only reads documents needs no tokio, HTTP or DNS.
//!
//! Where it sits: above `riptide-firehose` (whose verifier asks for keys through its own
//! `KeyLookup` trait) and below the CLI, which adapts [`DidDocs`] to that trait. Keeping the
//! firehose ignorant of DID documents keeps its verifier usable with any key source (a resolver
//! cache, a database).
//!
//! Keys are parsed by `riptide-crypto` *on request* ([`DidDoc::signing_key`]), not when a document
//! is read: parsing costs microseconds, many documents are never needed, and callers that verify
//! many commits keep their own cache of parsed keys.
//!
//! ```
//! use riptide_identity::DidDoc;
//!
//! let doc = DidDoc::from_json(r##"{
//!   "id": "did:plc:ewvi7nxzyoun6zhxrhs64oiz",
//!   "alsoKnownAs": ["at://atproto.com"],
//!   "verificationMethod": [{
//!     "id": "did:plc:ewvi7nxzyoun6zhxrhs64oiz#atproto",
//!     "type": "Multikey",
//!     "controller": "did:plc:ewvi7nxzyoun6zhxrhs64oiz",
//!     "publicKeyMultibase": "zQ3shqwJEJyMBsBXCWyCBpUBMqxcon9oHB7mCvx4sSpMdLJwc"
//!   }],
//!   "service": [{
//!     "id": "#atproto_pds",
//!     "type": "AtprotoPersonalDataServer",
//!     "serviceEndpoint": "https://enoki.us-east.host.bsky.network"
//!   }]
//! }"##)?;
//! assert_eq!(doc.handle().map(|h| h.as_str()), Some("atproto.com"));
//! assert_eq!(doc.pds(), Some("https://enoki.us-east.host.bsky.network"));
//! let key = doc.signing_key()?;
//! assert_eq!(key.curve(), riptide_crypto::Curve::Secp256k1);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod doc;
mod docs;
mod error;
pub mod plc;

pub use doc::{DidDoc, KeyMethod};
pub use docs::DidDocs;
pub use error::{DocError, DocsError, ResolveError};
