//! ECDSA signature verification with atproto's rules: SHA-256, 64-byte compact `r || s`, low-S.
//!
//! Spec: <https://atproto.com/specs/cryptography>. A signature is over the SHA-256 digest of the
//! signed bytes, encoded as 64 bytes (`r` then `s`, big-endian, 32 bytes each); DER is not
//! allowed; and `s` must be in the lower half of the group order, so a signature has exactly one
//! valid encoding. Strictness is in the function name (as in indigo): [`PublicKey::verify`] and
//! [`PublicKey::verify_prehashed`] enforce all of it; [`PublicKey::verify_lenient`] and
//! [`PublicKey::verify_prehashed_lenient`] accept high-S signatures (as many older signers made)
//! but still refuse DER.
//!
//! The low-S check is done here, on the raw `s` bytes, for both curves, before any library is
//! called, so a high-S signature always reports [`VerifyError::HighS`] whatever the library would
//! have said. Comparing 32-byte big-endian arrays lexicographically is comparing the integers.
//!
//! Backends:
//! - secp256k1: libsecp256k1 (`secp256k1` crate). Since 0.33 that crate uses its own per-thread
//!   context for verification (the explicit-context methods are deprecated); creating it is cheap
//!   (the precomputed tables are static) and happens once per thread. libsecp256k1 itself also
//!   rejects high-S, so the lenient path normalises `s` first.
//! - P-256 from a message: `ring` (assembly, the fastest option here). `ring` hashes the message
//!   itself and, as standard ECDSA, accepts either `s`, so the lenient path skips only our check.
//! - P-256 from a digest: `ring` has no prehashed ECDSA API, so [`PublicKey::verify_prehashed`]
//!   uses the RustCrypto `p256` crate's `verify_prehash` (pure Rust, about 3.5x slower than
//!   ring: ~200 us against ~58 us, see the crate docs). `aws-lc-rs` would offer it too, but adds
//!   a large C/CMake build for a path no current caller needs to be fast: atproto P-256 keys are
//!   rare and commit verification has the message. Prefer [`PublicKey::verify`] for P-256 when
//!   you hold the message.
//!
//! All functions are pure and thread-safe; none allocates.

use p256::ecdsa::signature::hazmat::PrehashVerifier;
use sha2::{Digest, Sha256};

use crate::error::VerifyError;
use crate::key::{P256Key, PublicKey, Secp256k1Key};

/// Half the secp256k1 group order, `n / 2` rounded down: the largest valid low `s`.
pub(crate) const SECP256K1_HALF_ORDER: [u8; 32] = [
    0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
    0x5d, 0x57, 0x6e, 0x73, 0x57, 0xa4, 0x50, 0x1d, 0xdf, 0xe9, 0x2f, 0x46, 0x68, 0x1b, 0x20, 0xa0,
];

/// Half the P-256 group order, `n / 2` rounded down: the largest valid low `s`.
pub(crate) const P256_HALF_ORDER: [u8; 32] = [
    0x7f, 0xff, 0xff, 0xff, 0x80, 0x00, 0x00, 0x00, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
    0xde, 0x73, 0x7d, 0x56, 0xd3, 0x8b, 0xcf, 0x42, 0x79, 0xdc, 0xe5, 0x61, 0x7e, 0x31, 0x92, 0xa8,
];

/// Whether to enforce low-S.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Strictness {
    Strict,
    Lenient,
}

impl PublicKey {
    /// Verifies an atproto signature over `msg`: SHA-256, 64-byte compact `r || s`, low-S.
    pub fn verify(&self, msg: &[u8], sig: &[u8]) -> Result<(), VerifyError> {
        self.verify_message(msg, sig, Strictness::Strict)
    }

    /// Like [`PublicKey::verify`] but accepts high-S signatures. Still requires 64-byte compact
    /// signatures (no DER). For data that predates atproto's low-S rule; not for the firehose.
    pub fn verify_lenient(&self, msg: &[u8], sig: &[u8]) -> Result<(), VerifyError> {
        self.verify_message(msg, sig, Strictness::Lenient)
    }

    /// Verifies an atproto signature given the SHA-256 digest of the signed bytes (strict, as
    /// [`PublicKey::verify`]). Fastest for secp256k1; for P-256 it uses a slower pure-Rust backend
    /// (see the module docs), so prefer [`PublicKey::verify`] there.
    pub fn verify_prehashed(&self, digest: &[u8; 32], sig: &[u8]) -> Result<(), VerifyError> {
        self.verify_digest(digest, sig, Strictness::Strict)
    }

    /// Like [`PublicKey::verify_prehashed`] but accepts high-S signatures.
    pub fn verify_prehashed_lenient(
        &self,
        digest: &[u8; 32],
        sig: &[u8],
    ) -> Result<(), VerifyError> {
        self.verify_digest(digest, sig, Strictness::Lenient)
    }

    fn verify_message(
        &self,
        msg: &[u8],
        sig: &[u8],
        strictness: Strictness,
    ) -> Result<(), VerifyError> {
        match self {
            // libsecp256k1 verifies digests: hash, then the digest path.
            PublicKey::Secp256k1(_) => {
                self.verify_digest(&Sha256::digest(msg).into(), sig, strictness)
            }
            PublicKey::P256(P256Key(point)) => {
                check_compact(sig, &P256_HALF_ORDER, strictness)?;
                ring::signature::UnparsedPublicKey::new(
                    &ring::signature::ECDSA_P256_SHA256_FIXED,
                    point,
                )
                .verify(msg, sig)
                .map_err(|_| VerifyError::BadSignature)
            }
        }
    }

    fn verify_digest(
        &self,
        digest: &[u8; 32],
        sig: &[u8],
        strictness: Strictness,
    ) -> Result<(), VerifyError> {
        match self {
            PublicKey::Secp256k1(key) => {
                let sig = check_compact(sig, &SECP256K1_HALF_ORDER, strictness)?;
                verify_secp256k1(key, digest, sig)
            }
            PublicKey::P256(P256Key(point)) => {
                let sig = check_compact(sig, &P256_HALF_ORDER, strictness)?;
                // The point was validated when the key was parsed; this re-parse cannot fail
                // but costs a little, which is acceptable on this non-hot path.
                let key = p256::ecdsa::VerifyingKey::from_sec1_bytes(point)
                    .map_err(|_| VerifyError::BadSignature)?;
                // Rejects r or s of zero or not below n.
                let sig = p256::ecdsa::Signature::from_slice(sig)
                    .map_err(|_| VerifyError::BadSignature)?;
                key.verify_prehash(digest, &sig)
                    .map_err(|_| VerifyError::BadSignature)
            }
        }
    }
}

/// Checks length (64, never DER) and, when strict, that `s <= n/2`.
fn check_compact<'a>(
    sig: &'a [u8],
    half_order: &[u8; 32],
    strictness: Strictness,
) -> Result<&'a [u8; 64], VerifyError> {
    let sig: &[u8; 64] = sig
        .try_into()
        .map_err(|_| VerifyError::Malformed { len: sig.len() })?;
    if strictness == Strictness::Strict && !is_low_s(sig, half_order) {
        return Err(VerifyError::HighS);
    }
    Ok(sig)
}

/// `s <= half_order`, comparing big-endian bytes (lexicographic order on equal-length arrays).
pub(crate) fn is_low_s(sig: &[u8; 64], half_order: &[u8; 32]) -> bool {
    sig[32..] <= half_order[..]
}

fn verify_secp256k1(
    Secp256k1Key(key): &Secp256k1Key,
    digest: &[u8; 32],
    sig: &[u8; 64],
) -> Result<(), VerifyError> {
    // Rejects r or s not below n (r or s of zero parse, then fail to verify).
    let mut sig =
        secp256k1::ecdsa::Signature::from_compact(sig).map_err(|_| VerifyError::BadSignature)?;
    // A no-op for strict callers (already checked); for lenient ones, libsecp256k1 would reject
    // high-S otherwise.
    sig.normalize_s();
    secp256k1::ecdsa::verify(&sig, secp256k1::Message::from_digest(*digest), key)
        .map_err(|_| VerifyError::BadSignature)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn be_minus(a: &[u8; 32], b: &[u8; 32]) -> [u8; 32] {
        let mut out = [0u8; 32];
        let mut borrow = 0i16;
        for i in (0..32).rev() {
            let mut d = i16::from(a[i]) - i16::from(b[i]) - borrow;
            borrow = if d < 0 {
                d += 256;
                1
            } else {
                0
            };
            out[i] = d as u8;
        }
        out
    }

    #[test]
    fn half_orders_match_curve_orders() {
        // n is odd, so n = 2 * half + 1: check it as n - half - 1 == half.
        let k_n: [u8; 32] = [
            0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
            0xff, 0xfe, 0xba, 0xae, 0xdc, 0xe6, 0xaf, 0x48, 0xa0, 0x3b, 0xbf, 0xd2, 0x5e, 0x8c,
            0xd0, 0x36, 0x41, 0x41,
        ];
        let p_n: [u8; 32] = [
            0xff, 0xff, 0xff, 0xff, 0x00, 0x00, 0x00, 0x00, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
            0xff, 0xff, 0xbc, 0xe6, 0xfa, 0xad, 0xa7, 0x17, 0x9e, 0x84, 0xf3, 0xb9, 0xca, 0xc2,
            0xfc, 0x63, 0x25, 0x51,
        ];
        for (n, half) in [(k_n, SECP256K1_HALF_ORDER), (p_n, P256_HALF_ORDER)] {
            let rest = be_minus(&n, &half);
            let mut one = [0u8; 32];
            one[31] = 1;
            assert_eq!(be_minus(&rest, &one), half);
        }
    }

    #[test]
    fn low_s_boundary() {
        for half in [SECP256K1_HALF_ORDER, P256_HALF_ORDER] {
            let mut sig = [0u8; 64];
            sig[32..].copy_from_slice(&half);
            assert!(is_low_s(&sig, &half));
            let mut one = [0u8; 32];
            one[31] = 1;
            let below = be_minus(&half, &one);
            sig[32..].copy_from_slice(&below);
            assert!(is_low_s(&sig, &half));
            // half + 1: its last byte is even for both curves, so +1 cannot carry.
            sig[32..].copy_from_slice(&half);
            sig[63] += 1;
            assert!(!is_low_s(&sig, &half));
        }
    }

    #[test]
    fn malformed_lengths_rejected_before_anything_else() {
        let key =
            PublicKey::from_did_key("did:key:zQ3shqwJEJyMBsBXCWyCBpUBMqxcon9oHB7mCvx4sSpMdLJwc")
                .expect("parse");
        for len in [0usize, 63, 65, 70, 72] {
            let sig = vec![0u8; len];
            assert_eq!(key.verify(b"m", &sig), Err(VerifyError::Malformed { len }));
            assert_eq!(
                key.verify_lenient(b"m", &sig),
                Err(VerifyError::Malformed { len })
            );
            assert_eq!(
                key.verify_prehashed(&[0; 32], &sig),
                Err(VerifyError::Malformed { len })
            );
        }
    }

    #[test]
    fn zero_and_overflowing_scalars_are_bad_not_panics() {
        for did in [
            "did:key:zQ3shqwJEJyMBsBXCWyCBpUBMqxcon9oHB7mCvx4sSpMdLJwc",
            "did:key:zDnaembgSGUhZULN2Caob4HLJPaxBh92N7rtH21TErzqf8HQo",
        ] {
            let key = PublicKey::from_did_key(did).expect("parse");
            let zero = [0u8; 64];
            assert_eq!(key.verify(b"m", &zero), Err(VerifyError::BadSignature));
            assert_eq!(
                key.verify_prehashed(&[1; 32], &zero),
                Err(VerifyError::BadSignature)
            );
            let mut r_overflow = [0xffu8; 64];
            r_overflow[32..].fill(0);
            r_overflow[63] = 1;
            assert_eq!(
                key.verify(b"m", &r_overflow),
                Err(VerifyError::BadSignature)
            );
            assert_eq!(
                key.verify_prehashed_lenient(&[1; 32], &r_overflow),
                Err(VerifyError::BadSignature)
            );
            let s_overflow = [0xffu8; 64];
            assert_eq!(key.verify(b"m", &s_overflow), Err(VerifyError::HighS));
            assert_eq!(
                key.verify_lenient(b"m", &s_overflow),
                Err(VerifyError::BadSignature)
            );
        }
    }
}
