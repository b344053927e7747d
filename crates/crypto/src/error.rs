//! Typed errors for key parsing and signature verification.
//!
//! Two error types, because callers do different things next: a [`KeyError`] means a DID
//! document or `did:key` is unusable (the identity is broken until it changes), while a
//! [`VerifyError`] means one signed object is bad (drop that event, count it, carry on). Neither
//! wraps a dependency's error type, so upgrading `secp256k1`, `ring` or `p256` never changes this
//! crate's public API.

use crate::key::Curve;

/// Why a public or private key could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The string does not start with `did:key:`.
    #[error("not a did:key (expected the prefix \"did:key:\")")]
    NotDidKey,
    /// The multibase prefix is not `z` (base58btc), the only encoding atproto uses for keys.
    #[error(
        "multibase prefix {prefix:?} is not 'z' (base58btc), the only one atproto uses for keys"
    )]
    UnsupportedMultibase {
        /// The first character found, or `None` for an empty string.
        prefix: Option<char>,
    },
    /// The base58btc body does not decode.
    #[error("invalid base58btc{}", match (character, index) {
        (Some(c), Some(i)) => format!(": character {c:?} at index {i}"),
        (None, Some(i)) => format!(": non-ASCII character at index {i}"),
        _ => String::new(),
    })]
    InvalidBase58 {
        /// The offending character, when the decoder named it.
        character: Option<char>,
        /// Its index in the base58 body (after the multibase prefix), when known.
        index: Option<usize>,
    },
    /// The multicodec varint prefix is truncated or not minimally encoded.
    #[error("malformed multicodec varint prefix")]
    MalformedMulticodec,
    /// A multicodec that is not a public key type at all (or one we have never heard of).
    #[error("unknown multicodec 0x{code:x} (expected secp256k1-pub 0xe7 or p256-pub 0x1200)")]
    UnknownMulticodec {
        /// The decoded multicodec code.
        code: u64,
    },
    /// A key type that exists but is not one of atproto's two curves (e.g. Ed25519).
    #[error("unsupported key type {name} (atproto uses only secp256k1 and P-256)")]
    UnsupportedCurve {
        /// Multicodec name of the key type, e.g. `"ed25519-pub"`.
        name: &'static str,
    },
    /// A DID document verification method `type` this crate does not know.
    #[error("unsupported verification method type {vm_type:?}")]
    UnsupportedVerificationMethod {
        /// The `type` field as found.
        vm_type: String,
    },
    /// The key bytes have the wrong length for their encoding.
    #[error("{curve} public key is {got} bytes, expected {expected}")]
    WrongLength {
        /// Curve the bytes were meant for.
        curve: Curve,
        /// What was expected, e.g. `"33 (compressed SEC1)"`.
        expected: &'static str,
        /// How many bytes were found.
        got: usize,
    },
    /// The bytes have the right length but are not a valid point encoding on the curve.
    #[error("not a valid {curve} public key point")]
    BadPoint {
        /// Curve the point was meant to be on.
        curve: Curve,
    },
    /// A private key scalar that is zero or not below the curve order.
    #[error("not a valid {curve} private key (must be in 1..n-1)")]
    InvalidSecretKey {
        /// Curve of the key.
        curve: Curve,
    },
}

/// Why a signature did not verify.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum VerifyError {
    /// Not 64 bytes. atproto signatures are compact `r || s`; DER is never accepted.
    #[error(
        "signature is {len} bytes; atproto signatures are 64-byte compact r||s (DER is not accepted)"
    )]
    Malformed {
        /// Length of the rejected signature.
        len: usize,
    },
    /// `s` is above half the curve order. atproto requires low-S signatures (no malleability);
    /// the `*_lenient` functions accept these.
    #[error(
        "signature has a high S value; atproto requires low-S (the lenient verifier accepts it)"
    )]
    HighS,
    /// Well-formed, but not a signature of this message by this key.
    #[error("signature does not match the message and public key")]
    BadSignature,
}
