//! The atproto interop vectors (bluesky-social/atproto-interop-tests, `crypto/`) must all pass.
//!
//! Read in place from the shared corpus (`interop/crypto/`, located by `riptide-testdata`). The
//! fixture counts are asserted, so an empty or truncated corpus fails instead of passing
//! vacuously.

use std::path::PathBuf;

use data_encoding::{BASE64_NOPAD, HEXLOWER_PERMISSIVE};
use riptide_crypto::{Curve, PrivateKey, PublicKey, VerifyError};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// The crypto fixtures directory, or `None` (after a note) when the corpus is absent outside CI
/// (the rule of `riptide-testdata`).
fn crypto_dir() -> Option<PathBuf> {
    riptide_testdata::corpus().map(|c| c.join("interop/crypto"))
}

fn read_json(dir: &std::path::Path, name: &str) -> Vec<Value> {
    let path = dir.join(name);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    match serde_json::from_str(&text) {
        Ok(Value::Array(items)) => items,
        other => panic!("{}: expected a JSON array, got {other:?}", path.display()),
    }
}

fn str_field<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key]
        .as_str()
        .unwrap_or_else(|| panic!("fixture field {key:?} missing: {v}"))
}

fn b64(s: &str) -> Vec<u8> {
    BASE64_NOPAD
        .decode(s.trim_end_matches('=').as_bytes())
        .expect("base64")
}

#[test]
fn signature_fixtures() {
    let Some(dir) = crypto_dir() else { return };
    let fixtures = read_json(&dir, "signature-fixtures.json");
    assert_eq!(fixtures.len(), 6, "signature-fixtures.json count changed");

    let (mut valid, mut high_s, mut der) = (0, 0, 0);
    for f in &fixtures {
        let comment = str_field(f, "comment");
        let msg = b64(str_field(f, "messageBase64"));
        let sig = b64(str_field(f, "signatureBase64"));
        let digest: [u8; 32] = Sha256::digest(&msg).into();
        let tags: Vec<&str> = f["tags"]
            .as_array()
            .expect("tags")
            .iter()
            .map(|t| t.as_str().expect("tag"))
            .collect();

        // The key, from both the did:key and the legacy DID document form; they must agree.
        let did = str_field(f, "publicKeyDid");
        let key = PublicKey::from_did_key(did).unwrap_or_else(|e| panic!("{comment}: {e}"));
        let legacy = PublicKey::from_legacy_multibase(
            str_field(f, "didDocSuite"),
            str_field(f, "publicKeyMultibase"),
        )
        .unwrap_or_else(|e| panic!("{comment}: {e}"));
        assert_eq!(key, legacy, "{comment}");
        assert_eq!(key.to_did_key(), did, "{comment}");
        assert_eq!(
            key.curve().jwt_alg(),
            str_field(f, "algorithm"),
            "{comment}"
        );

        if f["validSignature"].as_bool().expect("validSignature") {
            valid += 1;
            assert!(tags.is_empty(), "{comment}");
            assert_eq!(key.verify(&msg, &sig), Ok(()), "{comment}");
            assert_eq!(key.verify_prehashed(&digest, &sig), Ok(()), "{comment}");
            assert_eq!(key.verify_lenient(&msg, &sig), Ok(()), "{comment}");
            assert_eq!(
                key.verify_prehashed_lenient(&digest, &sig),
                Ok(()),
                "{comment}"
            );
            // And a different message must not verify.
            assert_eq!(
                key.verify(b"other", &sig),
                Err(VerifyError::BadSignature),
                "{comment}"
            );
        } else if tags == ["high-s"] {
            high_s += 1;
            assert_eq!(key.verify(&msg, &sig), Err(VerifyError::HighS), "{comment}");
            assert_eq!(
                key.verify_prehashed(&digest, &sig),
                Err(VerifyError::HighS),
                "{comment}"
            );
            assert_eq!(key.verify_lenient(&msg, &sig), Ok(()), "{comment}");
            assert_eq!(
                key.verify_prehashed_lenient(&digest, &sig),
                Ok(()),
                "{comment}"
            );
        } else if tags == ["der-encoded"] {
            der += 1;
            let malformed = Err(VerifyError::Malformed { len: sig.len() });
            assert_ne!(sig.len(), 64, "{comment}");
            assert_eq!(key.verify(&msg, &sig), malformed, "{comment}");
            assert_eq!(key.verify_lenient(&msg, &sig), malformed, "{comment}");
            assert_eq!(key.verify_prehashed(&digest, &sig), malformed, "{comment}");
            assert_eq!(
                key.verify_prehashed_lenient(&digest, &sig),
                malformed,
                "{comment}"
            );
        } else {
            panic!("unexpected invalid fixture {comment}: tags {tags:?}");
        }
    }
    assert_eq!((valid, high_s, der), (2, 2, 2));
}

/// Parses each did:key, re-encodes it identically, derives it from the private key, and signs.
fn check_didkey_vector(curve: Curve, secret: &[u8; 32], did: &str) {
    let key = PublicKey::from_did_key(did).unwrap_or_else(|e| panic!("{did}: {e}"));
    assert_eq!(key.curve(), curve, "{did}");
    assert_eq!(key.to_did_key(), did);
    assert_eq!(
        PublicKey::from_multibase(&key.to_multibase()).as_ref(),
        Ok(&key)
    );

    let private = PrivateKey::from_bytes(curve, secret).expect("private key");
    assert_eq!(private.public_key(), key, "{did}");
    let sig = private.sign(b"interop");
    assert_eq!(key.verify(b"interop", &sig), Ok(()), "{did}");
}

#[test]
fn w3c_didkey_k256() {
    let Some(dir) = crypto_dir() else { return };
    let vectors = read_json(&dir, "w3c_didkey_K256.json");
    assert_eq!(vectors.len(), 5, "w3c_didkey_K256.json count changed");
    for v in &vectors {
        let secret: [u8; 32] = HEXLOWER_PERMISSIVE
            .decode(str_field(v, "privateKeyBytesHex").as_bytes())
            .expect("hex")
            .try_into()
            .expect("32 bytes");
        check_didkey_vector(Curve::Secp256k1, &secret, str_field(v, "publicDidKey"));
    }
}

#[test]
fn w3c_didkey_p256() {
    let Some(dir) = crypto_dir() else { return };
    let vectors = read_json(&dir, "w3c_didkey_P256.json");
    assert_eq!(vectors.len(), 1, "w3c_didkey_P256.json count changed");
    for v in &vectors {
        let secret: [u8; 32] = bs58::decode(str_field(v, "privateKeyBytesBase58"))
            .into_vec()
            .expect("base58")
            .try_into()
            .expect("32 bytes");
        check_didkey_vector(Curve::P256, &secret, str_field(v, "publicDidKey"));
    }
}
