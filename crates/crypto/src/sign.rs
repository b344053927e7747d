//! Signing, for tests and for generating atproto test data. Not used when consuming the firehose.
//!
//! Signatures come out as atproto requires them: SHA-256 of the message, 64-byte compact
//! `r || s`, low-S. Both curves sign deterministically (RFC 6979), so the same key and message
//! always give the same signature, which keeps generated fixtures reproducible.
//!
//! - secp256k1: libsecp256k1, which always produces low-S signatures.
//! - P-256: the RustCrypto `p256` crate (ring would want a PKCS#8 document and an RNG), with `s`
//!   normalised to the low half afterwards.
//!
//! Secret material: `p256`'s key zeroizes on drop; the `secp256k1` crate's `SecretKey` does not.
//! Neither is printed by `Debug`.
//!
//! Two ways to sign, same bytes: [`PrivateKey::sign`] goes through the `secp256k1` crate's
//! thread-local context, which it re-randomises after every signature (side-channel defence in
//! depth for long-lived keys; it costs a second scalar multiplication, ~45% of a signature).
//! [`Signer`] holds its own context, randomised once when it is made, for signing in bulk (test
//! data generation). RFC 6979 nonces do not depend on the context's randomisation, so both give
//! identical signatures (tested).

use std::fmt;

use ecdsa::hazmat::SignPrimitive;
use sha2::{Digest, Sha256};

use crate::error::KeyError;
use crate::key::{Curve, P256Key, PublicKey, Secp256k1Key};

/// A secp256k1 or P-256 private key that signs atproto-style (low-S compact ECDSA over SHA-256).
#[derive(Clone)]
pub struct PrivateKey {
    inner: Inner,
    public: PublicKey,
}

#[derive(Clone)]
enum Inner {
    /// The key for the global-context path and the same scalar for [`Signer`]'s.
    Secp256k1(secp256k1::SecretKey, secp256k1_ctx::SecretKey),
    P256(p256::ecdsa::SigningKey),
}

impl PrivateKey {
    /// Loads a private key from its 32-byte big-endian scalar. Fails if the scalar is zero or
    /// not below the curve order.
    pub fn from_bytes(curve: Curve, bytes: &[u8; 32]) -> Result<PrivateKey, KeyError> {
        let bad = || KeyError::InvalidSecretKey { curve };
        let (inner, public) = match curve {
            Curve::Secp256k1 => {
                let sk = secp256k1::SecretKey::from_secret_bytes(*bytes).map_err(|_| bad())?;
                let ctx_sk = secp256k1_ctx::SecretKey::from_slice(bytes).map_err(|_| bad())?;
                let pk = secp256k1::PublicKey::from_secret_key(&sk);
                (
                    Inner::Secp256k1(sk, ctx_sk),
                    PublicKey::Secp256k1(Secp256k1Key(pk)),
                )
            }
            Curve::P256 => {
                let sk = p256::ecdsa::SigningKey::from_bytes(&p256::FieldBytes::from(*bytes))
                    .map_err(|_| bad())?;
                let point = sk.verifying_key().to_encoded_point(false);
                let uncompressed: [u8; 65] = point.as_bytes().try_into().map_err(|_| bad())?;
                (Inner::P256(sk), PublicKey::P256(P256Key(uncompressed)))
            }
        };
        Ok(PrivateKey { inner, public })
    }

    /// The curve of this key.
    pub fn curve(&self) -> Curve {
        self.public.curve()
    }

    /// The matching public key.
    pub fn public_key(&self) -> PublicKey {
        self.public.clone()
    }

    /// The 32-byte big-endian secret scalar (handle with care).
    pub fn to_bytes(&self) -> [u8; 32] {
        match &self.inner {
            Inner::Secp256k1(sk, _) => sk.to_secret_bytes(),
            Inner::P256(sk) => sk.to_bytes().into(),
        }
    }

    /// Signs `msg`: SHA-256, then deterministic ECDSA; returns the low-S compact `r || s`.
    pub fn sign(&self, msg: &[u8]) -> [u8; 64] {
        self.sign_prehashed(&Sha256::digest(msg).into())
    }

    /// Signs a SHA-256 digest the caller computed; returns the low-S compact `r || s`.
    pub fn sign_prehashed(&self, digest: &[u8; 32]) -> [u8; 64] {
        match &self.inner {
            Inner::Secp256k1(sk, _) => {
                // libsecp256k1 signs with RFC 6979 nonces and always returns low-S.
                secp256k1::ecdsa::sign(secp256k1::Message::from_digest(*digest), sk)
                    .serialize_compact()
            }
            Inner::P256(sk) => sign_p256(sk, digest),
        }
    }
}

/// A signer for many signatures: a libsecp256k1 signing context of its own, randomised once
/// from a seed when made, rather than after every signature. Signatures are the same bytes as
/// [`PrivateKey::sign`]'s (RFC 6979 does not depend on the randomisation). `Send + Sync`: one
/// signer can serve several threads.
///
/// ```
/// use riptide_crypto::{Curve, PrivateKey, Signer};
///
/// let key = PrivateKey::from_bytes(Curve::Secp256k1, &[7; 32])?;
/// let signer = Signer::new(&[42; 32]);
/// assert_eq!(signer.sign(&key, b"commit bytes"), key.sign(b"commit bytes"));
/// # Ok::<(), riptide_crypto::KeyError>(())
/// ```
pub struct Signer {
    secp: secp256k1_ctx::Secp256k1<secp256k1_ctx::SignOnly>,
}

impl Signer {
    /// A signer whose context is blinded with `seed` (side-channel defence; any bytes give the
    /// same signatures, secret random bytes give the defence).
    pub fn new(seed: &[u8; 32]) -> Signer {
        let mut secp = secp256k1_ctx::Secp256k1::signing_only();
        secp.seeded_randomize(seed);
        Signer { secp }
    }

    /// Signs `msg` with `key`: SHA-256, then deterministic ECDSA; the low-S compact `r || s`.
    pub fn sign(&self, key: &PrivateKey, msg: &[u8]) -> [u8; 64] {
        self.sign_prehashed(key, &Sha256::digest(msg).into())
    }

    /// Signs a SHA-256 digest the caller computed with `key`; the low-S compact `r || s`.
    pub fn sign_prehashed(&self, key: &PrivateKey, digest: &[u8; 32]) -> [u8; 64] {
        match &key.inner {
            Inner::Secp256k1(_, sk) => self
                .secp
                .sign_ecdsa(&secp256k1_ctx::Message::from_digest(*digest), sk)
                .serialize_compact(),
            Inner::P256(sk) => sign_p256(sk, digest),
        }
    }
}

impl fmt::Debug for Signer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Signer").finish_non_exhaustive()
    }
}

/// RFC 6979 signing for P-256, then low-S normalisation.
///
/// The first attempt has no additional data, so it is plain RFC 6979 and matches other
/// deterministic signers. Only if that nonce yields `r = 0` or `s = 0` (probability about 2^-256)
/// do we retry with a counter as RFC 6979 §3.6 "additional data": a total function, no panic.
fn sign_p256(sk: &p256::ecdsa::SigningKey, digest: &[u8; 32]) -> [u8; 64] {
    let scalar: &p256::Scalar = sk.as_nonzero_scalar();
    let z = p256::FieldBytes::from(*digest);
    let mut counter: u64 = 0;
    loop {
        let ad = counter.to_be_bytes();
        let ad: &[u8] = if counter == 0 { &[] } else { &ad };
        if let Ok((sig, _)) = scalar.try_sign_prehashed_rfc6979::<Sha256>(&z, ad) {
            let sig = sig.normalize_s().unwrap_or(sig);
            return sig.to_bytes().into();
        }
        counter = counter.wrapping_add(1);
    }
}

impl fmt::Debug for PrivateKey {
    /// Prints the curve and the public key only, never the secret.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PrivateKey")
            .field("curve", &self.curve())
            .field("public", &self.public.to_did_key())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::VerifyError;
    use crate::verify::{P256_HALF_ORDER, SECP256K1_HALF_ORDER};

    fn order(curve: Curve) -> [u8; 32] {
        match curve {
            Curve::Secp256k1 => [
                0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                0xff, 0xfe, 0xba, 0xae, 0xdc, 0xe6, 0xaf, 0x48, 0xa0, 0x3b, 0xbf, 0xd2, 0x5e, 0x8c,
                0xd0, 0x36, 0x41, 0x41,
            ],
            Curve::P256 => [
                0xff, 0xff, 0xff, 0xff, 0x00, 0x00, 0x00, 0x00, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                0xff, 0xff, 0xbc, 0xe6, 0xfa, 0xad, 0xa7, 0x17, 0x9e, 0x84, 0xf3, 0xb9, 0xca, 0xc2,
                0xfc, 0x63, 0x25, 0x51,
            ],
        }
    }

    /// `sig` with `s` replaced by `n - s`: the other valid encoding of the same signature.
    fn negate_s(curve: Curve, sig: &[u8; 64]) -> [u8; 64] {
        let n = order(curve);
        let mut out = *sig;
        let mut borrow = 0i16;
        for i in (0..32).rev() {
            let mut d = i16::from(n[i]) - i16::from(sig[32 + i]) - borrow;
            borrow = if d < 0 {
                d += 256;
                1
            } else {
                0
            };
            out[32 + i] = d as u8;
        }
        out
    }

    fn keys() -> [PrivateKey; 2] {
        [
            PrivateKey::from_bytes(Curve::Secp256k1, &[0x11; 32]).expect("k256 key"),
            PrivateKey::from_bytes(Curve::P256, &[0x22; 32]).expect("p256 key"),
        ]
    }

    #[test]
    fn sign_verify_round_trip_both_curves() {
        for key in keys() {
            let public = key.public_key();
            for i in 0..32u8 {
                let msg = [b'm', i];
                let sig = key.sign(&msg);
                assert_eq!(public.verify(&msg, &sig), Ok(()), "{:?}", key.curve());
                assert_eq!(public.verify_lenient(&msg, &sig), Ok(()));
                let digest: [u8; 32] = Sha256::digest(msg).into();
                assert_eq!(public.verify_prehashed(&digest, &sig), Ok(()));
                assert_eq!(key.sign_prehashed(&digest), sig);
                let half = match key.curve() {
                    Curve::Secp256k1 => SECP256K1_HALF_ORDER,
                    Curve::P256 => P256_HALF_ORDER,
                };
                assert!(sig[32..] <= half[..], "signer produced high-S");
            }
        }
    }

    #[test]
    fn signer_matches_global_context_signing() {
        // Different blinding seeds, both curves, many messages: the same bytes as
        // `PrivateKey::sign`, and they verify.
        let signers = [Signer::new(&[0; 32]), Signer::new(&[0xa5; 32])];
        for key in keys() {
            let public = key.public_key();
            for i in 0..64u16 {
                let msg = i.to_be_bytes();
                let sig = key.sign(&msg);
                for signer in &signers {
                    assert_eq!(signer.sign(&key, &msg), sig, "{:?} {i}", key.curve());
                }
                assert_eq!(public.verify(&msg, &sig), Ok(()));
            }
        }
        // A fixed vector: the RFC 6979 low-S signature of "hello" by the 0x11.. key, as
        // RustCrypto's independent `k256` signer computes it (checked outside this repository).
        let key = PrivateKey::from_bytes(Curve::Secp256k1, &[0x11; 32]).expect("key");
        let sig = signers[1].sign(&key, b"hello");
        assert_eq!(hex(&sig), hex(&key.sign(b"hello")));
        assert_eq!(hex(&sig), GOLDEN_HELLO);
    }

    const GOLDEN_HELLO: &str = "9343f49d1310f5686904a22025b1f7fb8f43f8a2a8061a19e96d3ac533a5a08d387263f8fa9bacad1865b222484ea5af7b66a08297005ea3d9bfd2846a9c3dd0";

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    #[test]
    fn signing_is_deterministic() {
        for key in keys() {
            assert_eq!(key.sign(b"hello"), key.sign(b"hello"));
            assert_ne!(key.sign(b"hello"), key.sign(b"hellp"));
        }
    }

    #[test]
    fn high_s_rejected_strictly_accepted_leniently() {
        for key in keys() {
            let public = key.public_key();
            let msg = b"high-s";
            let digest: [u8; 32] = Sha256::digest(msg).into();
            let high = negate_s(key.curve(), &key.sign(msg));
            assert_eq!(public.verify(msg, &high), Err(VerifyError::HighS));
            assert_eq!(
                public.verify_prehashed(&digest, &high),
                Err(VerifyError::HighS)
            );
            assert_eq!(public.verify_lenient(msg, &high), Ok(()));
            assert_eq!(public.verify_prehashed_lenient(&digest, &high), Ok(()));
        }
    }

    #[test]
    fn tampered_message_signature_or_key_rejected() {
        let [k, p] = keys();
        for (key, other) in [(&k, &p), (&p, &k)] {
            let public = key.public_key();
            let sig = key.sign(b"original");
            assert_eq!(
                public.verify(b"originaL", &sig),
                Err(VerifyError::BadSignature)
            );
            assert_eq!(
                public.verify_lenient(b"originaL", &sig),
                Err(VerifyError::BadSignature)
            );
            let mut flipped = sig;
            flipped[5] ^= 0x01;
            assert_eq!(
                public.verify(b"original", &flipped),
                Err(VerifyError::BadSignature)
            );
            let digest: [u8; 32] = Sha256::digest(b"originaL").into();
            assert_eq!(
                public.verify_prehashed(&digest, &sig),
                Err(VerifyError::BadSignature)
            );
            // Signed by a different key (and curve).
            let wrong = other.sign(b"original");
            assert!(public.verify(b"original", &wrong).is_err());
            // Same curve, different key.
            let same_curve = PrivateKey::from_bytes(key.curve(), &[0x33; 32]).expect("key");
            assert_eq!(
                public.verify(b"original", &same_curve.sign(b"original")),
                Err(VerifyError::BadSignature)
            );
        }
    }

    #[test]
    fn secret_bytes_round_trip_and_invalid_scalars() {
        for key in keys() {
            let again = PrivateKey::from_bytes(key.curve(), &key.to_bytes()).expect("reload");
            assert_eq!(again.public_key(), key.public_key());
        }
        for curve in [Curve::Secp256k1, Curve::P256] {
            assert_eq!(
                PrivateKey::from_bytes(curve, &[0; 32]).err(),
                Some(KeyError::InvalidSecretKey { curve })
            );
            assert_eq!(
                PrivateKey::from_bytes(curve, &order(curve)).err(),
                Some(KeyError::InvalidSecretKey { curve })
            );
        }
    }

    #[test]
    fn debug_hides_secret() {
        let key = PrivateKey::from_bytes(Curve::Secp256k1, &[0x11; 32]).expect("key");
        let shown = format!("{key:?}");
        assert!(shown.contains("did:key:z"), "{shown}");
        assert!(!shown.contains("1111"), "{shown}");
    }
}
