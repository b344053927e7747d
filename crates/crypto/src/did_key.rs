//! The string forms of public keys found in atproto: `did:key`, Multikey `publicKeyMultibase`,
//! and the legacy DID document verification methods.
//!
//! Spec: <https://atproto.com/specs/cryptography#public-key-encoding>. The current form is
//! multibase base58btc (`z`) of a multicodec varint (`secp256k1-pub` 0xe7 = bytes `e7 01`,
//! `p256-pub` 0x1200 = bytes `80 24`) followed by the 33-byte *compressed* point. A `did:key` is
//! that string after `did:key:`; a DID document's `Multikey` verification method carries it in
//! `publicKeyMultibase`.
//!
//! Older DID documents used `EcdsaSecp256k1VerificationKey2019` and
//! `EcdsaSecp256r1VerificationKey2019` methods whose `publicKeyMultibase` is base58btc of the
//! bare SEC1 point, *without* a multicodec prefix (the curve comes from the `type`); we accept
//! compressed or uncompressed points there, as both occur (the interop fixtures use compressed).
//!
//! Only the `z` multibase prefix is accepted: atproto uses no other, and accepting more would make
//! two strings for one key. Parsing is not a hot path (keys are parsed once per DID document and
//! cached), so it allocates freely.

use crate::error::KeyError;
use crate::key::{Curve, PublicKey};

const DID_KEY_PREFIX: &str = "did:key:";
const SECP256K1_PUB: [u8; 2] = [0xe7, 0x01];
const P256_PUB: [u8; 2] = [0x80, 0x24];

/// `type` of the legacy DID document verification method for secp256k1 keys.
pub const LEGACY_SECP256K1_VM_TYPE: &str = "EcdsaSecp256k1VerificationKey2019";
/// `type` of the legacy DID document verification method for P-256 keys.
pub const LEGACY_P256_VM_TYPE: &str = "EcdsaSecp256r1VerificationKey2019";
/// `type` of the current DID document verification method (multicodec in `publicKeyMultibase`).
pub const MULTIKEY_VM_TYPE: &str = "Multikey";

impl PublicKey {
    /// Parses `did:key:z...` (multibase base58btc of multicodec + compressed point).
    pub fn from_did_key(did: &str) -> Result<PublicKey, KeyError> {
        let multibase = did
            .strip_prefix(DID_KEY_PREFIX)
            .ok_or(KeyError::NotDidKey)?;
        PublicKey::from_multibase(multibase)
    }

    /// Parses a Multikey `publicKeyMultibase` value:
    /// `z` + base58btc(multicodec || compressed point).
    /// This is also the part of a `did:key` after `did:key:`.
    pub fn from_multibase(multibase: &str) -> Result<PublicKey, KeyError> {
        let bytes = decode_base58btc(multibase)?;
        let (curve, point) = split_multicodec(&bytes)?;
        PublicKey::from_compressed_sec1(curve, point)
    }

    /// Parses the `publicKeyMultibase` of a legacy verification method, whose `type` names the
    /// curve ([`LEGACY_SECP256K1_VM_TYPE`] or [`LEGACY_P256_VM_TYPE`]) and whose value is
    /// `z` + base58btc of the bare SEC1 point (compressed or uncompressed, no multicodec).
    pub fn from_legacy_multibase(vm_type: &str, multibase: &str) -> Result<PublicKey, KeyError> {
        let curve = match vm_type {
            LEGACY_SECP256K1_VM_TYPE => Curve::Secp256k1,
            LEGACY_P256_VM_TYPE => Curve::P256,
            other => {
                return Err(KeyError::UnsupportedVerificationMethod {
                    vm_type: other.to_owned(),
                })
            }
        };
        let bytes = decode_base58btc(multibase)?;
        PublicKey::from_sec1(curve, &bytes)
    }

    /// Parses a DID document verification method from its `type` and `publicKeyMultibase`:
    /// `Multikey` as [`PublicKey::from_multibase`], the 2019 types as
    /// [`PublicKey::from_legacy_multibase`].
    pub fn from_verification_method(
        vm_type: &str,
        public_key_multibase: &str,
    ) -> Result<PublicKey, KeyError> {
        if vm_type == MULTIKEY_VM_TYPE {
            PublicKey::from_multibase(public_key_multibase)
        } else {
            PublicKey::from_legacy_multibase(vm_type, public_key_multibase)
        }
    }

    /// The Multikey form: `z` + base58btc(multicodec || compressed point), as used in
    /// `publicKeyMultibase`.
    pub fn to_multibase(&self) -> String {
        let prefix = match self.curve() {
            Curve::Secp256k1 => SECP256K1_PUB,
            Curve::P256 => P256_PUB,
        };
        let mut bytes = [0u8; 35];
        bytes[..2].copy_from_slice(&prefix);
        bytes[2..].copy_from_slice(&self.to_compressed_sec1());
        let mut out = String::with_capacity(1 + 48);
        out.push('z');
        out.push_str(&bs58::encode(bytes).into_string());
        out
    }

    /// The `did:key:z...` form (always the compressed point, as atproto requires).
    pub fn to_did_key(&self) -> String {
        let mut out = String::with_capacity(DID_KEY_PREFIX.len() + 49);
        out.push_str(DID_KEY_PREFIX);
        out.push_str(&self.to_multibase());
        out
    }
}

/// Decodes `z` + base58btc.
fn decode_base58btc(multibase: &str) -> Result<Vec<u8>, KeyError> {
    let mut chars = multibase.chars();
    match chars.next() {
        Some('z') => {}
        prefix => return Err(KeyError::UnsupportedMultibase { prefix }),
    }
    bs58::decode(chars.as_str())
        .into_vec()
        .map_err(|e| match e {
            bs58::decode::Error::InvalidCharacter { character, index } => KeyError::InvalidBase58 {
                character: Some(character),
                index: Some(index),
            },
            bs58::decode::Error::NonAsciiCharacter { index } => KeyError::InvalidBase58 {
                character: None,
                index: Some(index),
            },
            _ => KeyError::InvalidBase58 {
                character: None,
                index: None,
            },
        })
}

/// Splits the multicodec prefix off, mapping it to a curve. Only the exact minimal encodings of
/// the two supported codes are accepted; anything else is decoded only to name it in the error.
fn split_multicodec(bytes: &[u8]) -> Result<(Curve, &[u8]), KeyError> {
    if let Some(rest) = bytes.strip_prefix(&SECP256K1_PUB) {
        return Ok((Curve::Secp256k1, rest));
    }
    if let Some(rest) = bytes.strip_prefix(&P256_PUB) {
        return Ok((Curve::P256, rest));
    }
    let code = decode_varint(bytes)?;
    Err(match code {
        0xe7 | 0x1200 => KeyError::MalformedMulticodec, // non-minimal encoding of a known code
        0xed => KeyError::UnsupportedCurve {
            name: "ed25519-pub",
        },
        0xec => KeyError::UnsupportedCurve { name: "x25519-pub" },
        0x1201 => KeyError::UnsupportedCurve { name: "p384-pub" },
        0x1202 => KeyError::UnsupportedCurve { name: "p521-pub" },
        0xeb => KeyError::UnsupportedCurve {
            name: "bls12_381-g1-pub",
        },
        code => KeyError::UnknownMulticodec { code },
    })
}

/// Unsigned LEB128 as multiformats uses it (at most 9 bytes), for error messages only.
fn decode_varint(bytes: &[u8]) -> Result<u64, KeyError> {
    let mut value = 0u64;
    for (i, &b) in bytes.iter().take(9).enumerate() {
        value |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err(KeyError::MalformedMulticodec)
}

#[cfg(test)]
mod tests {
    use super::*;

    // From the atproto interop fixtures (signature-fixtures.json).
    const K256_DID: &str = "did:key:zQ3shqwJEJyMBsBXCWyCBpUBMqxcon9oHB7mCvx4sSpMdLJwc";
    const K256_LEGACY: &str = "z25z9DTpsiYYJKGsWmSPJK2NFN8PcJtZig12K59UgW7q5t";
    const P256_DID: &str = "did:key:zDnaembgSGUhZULN2Caob4HLJPaxBh92N7rtH21TErzqf8HQo";
    const P256_LEGACY: &str = "zxdM8dSstjrpZaRUwBmDvjGXweKuEMVN95A9oJBFjkWMh";

    #[test]
    fn did_key_round_trip() {
        for (did, curve) in [(K256_DID, Curve::Secp256k1), (P256_DID, Curve::P256)] {
            let key = PublicKey::from_did_key(did).expect("parse");
            assert_eq!(key.curve(), curve);
            assert_eq!(key.to_did_key(), did);
            assert_eq!(key.to_string(), did);
            assert_eq!(did.parse::<PublicKey>().expect("FromStr"), key);
            let multibase = key.to_multibase();
            assert_eq!(
                PublicKey::from_multibase(&multibase).expect("multibase"),
                key
            );
            assert_eq!(
                PublicKey::from_verification_method("Multikey", &multibase),
                Ok(key)
            );
        }
    }

    #[test]
    fn legacy_forms_match_did_key() {
        let k = PublicKey::from_legacy_multibase(LEGACY_SECP256K1_VM_TYPE, K256_LEGACY);
        assert_eq!(k, PublicKey::from_did_key(K256_DID));
        let p = PublicKey::from_verification_method(LEGACY_P256_VM_TYPE, P256_LEGACY);
        assert_eq!(p, PublicKey::from_did_key(P256_DID));
        // Uncompressed legacy keys are accepted too.
        let key = p.expect("parse");
        let uncompressed = format!(
            "z{}",
            bs58::encode(key.to_uncompressed_sec1()).into_string()
        );
        assert_eq!(
            PublicKey::from_legacy_multibase(LEGACY_P256_VM_TYPE, &uncompressed),
            Ok(key.clone())
        );
        // The curve comes from the type: the same bytes under the K-256 type are (at best) a
        // different, secp256k1 key, never the P-256 one.
        let crossed = PublicKey::from_legacy_multibase(LEGACY_SECP256K1_VM_TYPE, P256_LEGACY);
        assert_ne!(crossed.as_ref().map(PublicKey::curve), Ok(Curve::P256));
        assert_ne!(crossed, Ok(key));
        assert_eq!(
            PublicKey::from_legacy_multibase("JsonWebKey2020", K256_LEGACY),
            Err(KeyError::UnsupportedVerificationMethod {
                vm_type: "JsonWebKey2020".into()
            })
        );
    }

    #[test]
    fn rejects_bad_strings() {
        assert_eq!(
            PublicKey::from_did_key("did:plc:abc"),
            Err(KeyError::NotDidKey)
        );
        assert_eq!(
            PublicKey::from_did_key("did:key:"),
            Err(KeyError::UnsupportedMultibase { prefix: None })
        );
        assert_eq!(
            PublicKey::from_multibase("mAAAA"),
            Err(KeyError::UnsupportedMultibase { prefix: Some('m') })
        );
        assert_eq!(
            PublicKey::from_multibase("zQ3sh0"),
            Err(KeyError::InvalidBase58 {
                character: Some('0'),
                index: Some(4)
            })
        );
        // Ed25519 did:key from the W3C did:key spec.
        assert_eq!(
            PublicKey::from_did_key("did:key:z6MkhaXgBZDvotDkL5257faiztiGiC2QtKLGpbnnEGta2doK"),
            Err(KeyError::UnsupportedCurve {
                name: "ed25519-pub"
            })
        );
        assert!(matches!(
            PublicKey::from_multibase("z"),
            Err(KeyError::MalformedMulticodec)
        ));
    }

    #[test]
    fn multicodec_requires_compressed_and_minimal() {
        let key = PublicKey::from_did_key(K256_DID).expect("parse");
        let mut long = SECP256K1_PUB.to_vec();
        long.extend_from_slice(&key.to_uncompressed_sec1());
        let s = format!("z{}", bs58::encode(&long).into_string());
        assert!(matches!(
            PublicKey::from_multibase(&s),
            Err(KeyError::WrongLength { got: 65, .. })
        ));
        let mut non_minimal = vec![0xe7, 0x81, 0x00];
        non_minimal.extend_from_slice(&key.to_compressed_sec1());
        let s = format!("z{}", bs58::encode(&non_minimal).into_string());
        assert_eq!(
            PublicKey::from_multibase(&s),
            Err(KeyError::MalformedMulticodec)
        );
        let s = format!("z{}", bs58::encode([0x85, 0x24, 0x02]).into_string());
        assert_eq!(
            PublicKey::from_multibase(&s),
            Err(KeyError::UnknownMulticodec { code: 0x1205 })
        );
    }
}
