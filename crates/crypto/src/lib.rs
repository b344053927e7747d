//! atproto cryptography: `did:key` and Multikey public keys, and strict ECDSA verification.
//!
//! Spec: <https://atproto.com/specs/cryptography>. atproto signs with ECDSA over secp256k1
//! (`ES256K`) or NIST P-256 (`ES256`): SHA-256 of the bytes, a 64-byte compact `r || s` signature,
//! and `s` in the low half of the group order. This crate exists so that the rest of riptide can
//! verify repository commit signatures from the firehose without knowing about curves, encodings
//! or malleability rules.
//!
//! ```
//! use riptide_crypto::{Curve, PrivateKey, PublicKey};
//!
//! let key = PublicKey::from_did_key("did:key:zQ3shqwJEJyMBsBXCWyCBpUBMqxcon9oHB7mCvx4sSpMdLJwc")?;
//! assert_eq!(key.curve(), Curve::Secp256k1);
//!
//! let signer = PrivateKey::from_bytes(Curve::P256, &[7; 32])?;
//! let sig = signer.sign(b"commit bytes");
//! signer.public_key().verify(b"commit bytes", &sig)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! - [`PublicKey`]: parsed once (point validated, P-256 decompressed), then verify does no
//!   parsing. Strictness is in the name: `verify` / `verify_prehashed` enforce low-S;
//!   `verify_lenient` / `verify_prehashed_lenient` accept high-S. DER is always refused.
//! - [`PrivateKey`]: deterministic low-S signing, for tests and test-data generation;
//!   [`Signer`] signs the same bytes in bulk through a context it holds (no per-call
//!   re-randomisation).
//! - Backends: libsecp256k1 (`secp256k1` crate) for K-256; `ring` for P-256 verification from a
//!   message; the RustCrypto `p256` crate for P-256 point decompression, prehashed verification
//!   and signing. This crate contains no curve arithmetic.
//!
//! What it does not do: resolve DIDs or fetch documents (it parses the key strings found in
//! them), key generation from randomness, or any I/O.
//!
//! Measured single-thread verify cost (release build, 2-core Xeon dev VM, 300-byte message;
//! SHA-256 included): secp256k1 `verify` ~25 us (~39k/s), `verify_prehashed` the same; P-256
//! `verify` (ring) ~58 us (~17k/s), P-256 `verify_prehashed` (`p256` crate) ~200 us (~5k/s).
//! Parsing a `did:key` costs 5-9 us, which is why keys are parsed once and cached.
//!
//! Everything here is pure, `Send + Sync`, and safe to call from many threads at once.

mod did_key;
mod error;
mod key;
mod sign;
mod verify;

pub use did_key::{LEGACY_P256_VM_TYPE, LEGACY_SECP256K1_VM_TYPE, MULTIKEY_VM_TYPE};
pub use error::{KeyError, VerifyError};
pub use key::{Curve, P256Key, PublicKey, Secp256k1Key};
pub use sign::{PrivateKey, Signer};
