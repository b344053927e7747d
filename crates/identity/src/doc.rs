//! One DID document, reduced to what atproto reads from it.
//!
//! Spec: <https://atproto.com/specs/did#did-documents>. Of the W3C document atproto uses three
//! parts, each found by a fragment id that may be written relative (`#atproto`) or absolute
//! (`did:plc:…#atproto`), and never under another DID's prefix:
//!
//! - the signing key: the verification method `#atproto`, of type `Multikey` (multicodec-prefixed
//!   `publicKeyMultibase`) or one of the legacy 2019 types (bare SEC1 point; the type names the
//!   curve). Parsing is `riptide-crypto`'s [`PublicKey::from_verification_method`];
//! - the handle: the first `at://` entry of `alsoKnownAs` (a claim, to be confirmed through DNS or
//!   HTTPS by whoever shows it; an invalid one means "no handle", not a broken document);
//! - the PDS: the service `#atproto_pds` of type `AtprotoPersonalDataServer`.
//!
//! Other entries (other verification methods, services, `@context`) are ignored, as the spec
//! asks. A document whose parts are present but of the wrong JSON type is [`DocError::Malformed`];
//! a document without a signing key still parses (it is a valid document of an account that
//! cannot currently publish), and says so when [`DidDoc::signing_key`] is asked.

use riptide_crypto::PublicKey;
use riptide_syntax::{Did, Handle};
use serde_json::{Map, Value};

use crate::error::DocError;

/// The `#atproto` verification method as written: type and key string, not yet parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyMethod {
    /// `type`: `Multikey`, `EcdsaSecp256k1VerificationKey2019` or `EcdsaSecp256r1VerificationKey2019`
    /// (others are kept and refused when parsed).
    pub vm_type: String,
    /// `publicKeyMultibase`.
    pub public_key_multibase: String,
}

impl KeyMethod {
    /// Parses the key (microseconds: cache the result when verifying many commits).
    pub fn parse(&self) -> Result<PublicKey, DocError> {
        Ok(PublicKey::from_verification_method(
            &self.vm_type,
            &self.public_key_multibase,
        )?)
    }
}

/// A parsed DID document: the DID, its handle claim, signing key and PDS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DidDoc {
    did: Did,
    also_known_as: Vec<String>,
    handle: Option<Handle>,
    key: Option<KeyMethod>,
    pds: Option<String>,
}

fn malformed(what: impl Into<String>) -> DocError {
    DocError::Malformed(what.into())
}

/// Whether a fragment id (`#frag` or `did…#frag`) names `frag` of `did`.
fn is_fragment_of(id: &str, did: &str, frag: &str) -> bool {
    match id.rsplit_once('#') {
        Some((prefix, f)) => f == frag && (prefix.is_empty() || prefix == did),
        None => false,
    }
}

fn str_field<'v>(
    o: &'v Map<String, Value>,
    name: &str,
    what: &str,
) -> Result<Option<&'v str>, DocError> {
    match o.get(name) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(malformed(format!("{what}: `{name}` is not a string"))),
    }
}

fn array_field<'v>(o: &'v Map<String, Value>, name: &str) -> Result<&'v [Value], DocError> {
    match o.get(name) {
        None => Ok(&[]),
        Some(Value::Array(a)) => Ok(a),
        Some(_) => Err(malformed(format!("`{name}` is not an array"))),
    }
}

impl DidDoc {
    /// Parses a DID document from JSON text.
    pub fn from_json(text: &str) -> Result<DidDoc, DocError> {
        let v: Value =
            serde_json::from_str(text).map_err(|e| malformed(format!("not JSON: {e}")))?;
        DidDoc::from_value(&v)
    }

    /// Parses a DID document from a JSON value.
    pub fn from_value(v: &Value) -> Result<DidDoc, DocError> {
        let o = v
            .as_object()
            .ok_or_else(|| malformed("not a JSON object"))?;
        let id = str_field(o, "id", "document")?.ok_or_else(|| malformed("no `id`"))?;
        let did = Did::parse(id).map_err(|e| malformed(format!("`id` is not a DID: {e}")))?;

        let mut also_known_as = Vec::new();
        for aka in array_field(o, "alsoKnownAs")? {
            let s = aka
                .as_str()
                .ok_or_else(|| malformed("`alsoKnownAs` holds a non-string"))?;
            also_known_as.push(s.to_owned());
        }
        // The first at:// entry is the handle claim; an invalid one is no handle.
        let handle = also_known_as
            .iter()
            .find_map(|s| s.strip_prefix("at://"))
            .and_then(|h| Handle::parse(h).ok());

        let mut key = None;
        for vm in array_field(o, "verificationMethod")? {
            let m = vm
                .as_object()
                .ok_or_else(|| malformed("a verification method is not an object"))?;
            let Some(vm_id) = str_field(m, "id", "verification method")? else {
                continue;
            };
            if !is_fragment_of(vm_id, did.as_str(), "atproto") {
                continue;
            }
            let vm_type = str_field(m, "type", "#atproto verification method")?
                .ok_or_else(|| malformed("#atproto verification method has no `type`"))?;
            let mb = str_field(m, "publicKeyMultibase", "#atproto verification method")?
                .ok_or_else(|| {
                    malformed("#atproto verification method has no `publicKeyMultibase`")
                })?;
            key = Some(KeyMethod {
                vm_type: vm_type.to_owned(),
                public_key_multibase: mb.to_owned(),
            });
            break;
        }

        let mut pds = None;
        for svc in array_field(o, "service")? {
            let s = svc
                .as_object()
                .ok_or_else(|| malformed("a service is not an object"))?;
            let Some(sid) = str_field(s, "id", "service")? else {
                continue;
            };
            if !is_fragment_of(sid, did.as_str(), "atproto_pds") {
                continue;
            }
            if str_field(s, "type", "#atproto_pds service")? != Some("AtprotoPersonalDataServer") {
                continue;
            }
            let endpoint = str_field(s, "serviceEndpoint", "#atproto_pds service")?
                .ok_or_else(|| malformed("#atproto_pds service has no string `serviceEndpoint`"))?;
            pds = Some(endpoint.to_owned());
            break;
        }

        Ok(DidDoc {
            did,
            also_known_as,
            handle,
            key,
            pds,
        })
    }

    /// The document's DID (`id`).
    pub fn did(&self) -> &Did {
        &self.did
    }

    /// `alsoKnownAs` as written.
    pub fn also_known_as(&self) -> &[String] {
        &self.also_known_as
    }

    /// The handle claimed by the first `at://` entry of `alsoKnownAs`, if it is a valid handle
    /// (lowercased). Unconfirmed: confirming it needs DNS or HTTPS.
    pub fn handle(&self) -> Option<&Handle> {
        self.handle.as_ref()
    }

    /// The `#atproto_pds` service endpoint (a URL), if declared.
    pub fn pds(&self) -> Option<&str> {
        self.pds.as_deref()
    }

    /// The `#atproto` verification method as written, if present.
    pub fn key_method(&self) -> Option<&KeyMethod> {
        self.key.as_ref()
    }

    /// The account's signing key, parsed (each call parses again: cache it).
    pub fn signing_key(&self) -> Result<PublicKey, DocError> {
        self.key.as_ref().ok_or(DocError::NoSigningKey)?.parse()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use riptide_crypto::{Curve, PrivateKey, LEGACY_P256_VM_TYPE, LEGACY_SECP256K1_VM_TYPE};

    const DID: &str = "did:plc:ewvi7nxzyoun6zhxrhs64oiz";

    fn doc(vm: &str, svc: &str) -> String {
        format!(
            r#"{{"id":"{DID}","alsoKnownAs":["https://x.example","at://Alice.Example.com","at://b.example.com"],
               "verificationMethod":[{vm}],"service":[{svc}]}}"#
        )
    }

    fn multikey(curve: Curve) -> String {
        PrivateKey::from_bytes(curve, &[3; 32])
            .unwrap()
            .public_key()
            .to_multibase()
    }

    #[test]
    fn multikey_relative_and_absolute_ids() {
        let mk = multikey(Curve::P256);
        for id in ["#atproto".to_owned(), format!("{DID}#atproto")] {
            let d = DidDoc::from_json(&doc(
                &format!(r#"{{"id":"{id}","type":"Multikey","controller":"{DID}","publicKeyMultibase":"{mk}"}}"#),
                r##"{"id":"#atproto_pds","type":"AtprotoPersonalDataServer","serviceEndpoint":"https://pds.example"}"##,
            ))
            .unwrap();
            assert_eq!(d.did().as_str(), DID);
            assert_eq!(d.signing_key().unwrap().curve(), Curve::P256);
            assert_eq!(d.handle().unwrap().as_str(), "alice.example.com");
            assert_eq!(d.pds(), Some("https://pds.example"));
            assert_eq!(d.also_known_as().len(), 3);
        }
    }

    #[test]
    fn legacy_types_parse_through_crypto() {
        for (curve, ty) in [
            (Curve::Secp256k1, LEGACY_SECP256K1_VM_TYPE),
            (Curve::P256, LEGACY_P256_VM_TYPE),
        ] {
            let key = PrivateKey::from_bytes(curve, &[5; 32])
                .unwrap()
                .public_key();
            let mb = format!("z{}", bs58::encode(key.to_compressed_sec1()).into_string());
            let d = DidDoc::from_json(&doc(
                &format!(r##"{{"id":"#atproto","type":"{ty}","publicKeyMultibase":"{mb}"}}"##),
                "",
            ))
            .unwrap();
            assert_eq!(d.signing_key().unwrap(), key);
            assert_eq!(d.pds(), None);
        }
    }

    #[test]
    fn other_dids_fragments_and_types_are_not_ours() {
        let mk = multikey(Curve::Secp256k1);
        // Another DID's #atproto, another fragment, a PDS of the wrong type.
        let d = DidDoc::from_json(&doc(
            &format!(
                r##"{{"id":"did:plc:other#atproto","type":"Multikey","publicKeyMultibase":"{mk}"}},
                    {{"id":"#atproto_label","type":"Multikey","publicKeyMultibase":"{mk}"}}"##
            ),
            r##"{"id":"#atproto_pds","type":"Other","serviceEndpoint":"https://x"}"##,
        ))
        .unwrap();
        assert_eq!(d.signing_key(), Err(DocError::NoSigningKey));
        assert_eq!(d.pds(), None);
    }

    #[test]
    fn unusable_keys_are_typed() {
        // Ed25519 Multikey (multicodec 0xed): a key, but not one atproto signs with.
        let ed = format!(
            "z{}",
            bs58::encode([&[0xed, 0x01][..], &[1; 32]].concat()).into_string()
        );
        let d = DidDoc::from_json(&doc(
            &format!(r##"{{"id":"#atproto","type":"Multikey","publicKeyMultibase":"{ed}"}}"##),
            "",
        ))
        .unwrap();
        assert!(matches!(d.signing_key(), Err(DocError::UnsupportedKey(_))));
        let d = DidDoc::from_json(&doc(
            r##"{"id":"#atproto","type":"JsonWebKey2020","publicKeyMultibase":"zabc"}"##,
            "",
        ))
        .unwrap();
        assert!(matches!(d.signing_key(), Err(DocError::UnsupportedKey(_))));
    }

    #[test]
    fn malformed_documents() {
        for bad in [
            "[]",
            "{}",
            r#"{"id":"not a did"}"#,
            r#"{"id":"did:plc:x","alsoKnownAs":"at://a.b"}"#,
            r#"{"id":"did:plc:x","alsoKnownAs":[1]}"#,
            r#"{"id":"did:plc:x","verificationMethod":[1]}"#,
            r##"{"id":"did:plc:x","verificationMethod":[{"id":"#atproto","type":"Multikey"}]}"##,
            r##"{"id":"did:plc:x","service":[{"id":"#atproto_pds","type":"AtprotoPersonalDataServer","serviceEndpoint":{}}]}"##,
            "{",
        ] {
            assert!(
                matches!(DidDoc::from_json(bad), Err(DocError::Malformed(_))),
                "{bad}"
            );
        }
        // An invalid handle claim is no handle, not a broken document.
        let d = DidDoc::from_json(r#"{"id":"did:plc:x","alsoKnownAs":["at://-bad-"]}"#).unwrap();
        assert!(d.handle().is_none());
    }
}
