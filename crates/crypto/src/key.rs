//! Public keys of atproto's two curves, parsed once so that verification does no parsing.
//!
//! atproto signs with ECDSA over either secp256k1 ("K-256", `ES256K`, most accounts) or NIST
//! P-256 ("secp256r1", `ES256`). A [`PublicKey`] is built only through a parser (`from_sec1` here,
//! the multibase forms in `did_key.rs`), which checks that the point is on the curve; after that
//! the key is immutable and `Send + Sync`, so one parsed key can be cached and shared by all
//! verifying threads.
//!
//! What each variant holds, and why:
//! - secp256k1: libsecp256k1's parsed `secp256k1_pubkey` (64 bytes), the exact form its verify
//!   call consumes.
//! - P-256: the 65-byte uncompressed SEC1 point, validated on the curve. `ring` verifies from
//!   these bytes (it has no pre-parsed ECDSA key type, and cannot decompress points), so a
//!   compressed key is decompressed once here, with the `p256` crate.
//!
//! This module does no curve arithmetic itself: decompression and on-curve checks are the
//! libraries'. Compressing a P-256 point is not arithmetic (the prefix is the parity of `y`).

use std::fmt;
use std::str::FromStr;

use p256::elliptic_curve::sec1::ToEncodedPoint;

use crate::error::KeyError;

/// One of the two elliptic curves atproto uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Curve {
    /// secp256k1, "K-256"; JWT algorithm `ES256K`.
    Secp256k1,
    /// NIST P-256, "secp256r1"; JWT algorithm `ES256`.
    P256,
}

impl Curve {
    /// The JWT `alg` name used for this curve in atproto (`ES256K` or `ES256`).
    pub fn jwt_alg(self) -> &'static str {
        match self {
            Curve::Secp256k1 => "ES256K",
            Curve::P256 => "ES256",
        }
    }
}

impl fmt::Display for Curve {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Curve::Secp256k1 => "secp256k1",
            Curve::P256 => "P-256",
        })
    }
}

/// A parsed secp256k1 public key (libsecp256k1's internal form; opaque).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Secp256k1Key(pub(crate) secp256k1::PublicKey);

/// A parsed P-256 public key: the validated 65-byte uncompressed SEC1 point (opaque).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct P256Key(pub(crate) [u8; 65]);

/// An atproto signing public key, validated and ready to verify with.
///
/// Build one with [`PublicKey::from_did_key`], [`PublicKey::from_multibase`],
/// [`PublicKey::from_legacy_multibase`], [`PublicKey::from_verification_method`] or
/// [`PublicKey::from_sec1`]. `Display` writes the `did:key` form and `FromStr` parses it.
#[derive(Clone, PartialEq, Eq, Hash)]
pub enum PublicKey {
    /// A secp256k1 ("K-256") key.
    Secp256k1(Secp256k1Key),
    /// A NIST P-256 key.
    P256(P256Key),
}

impl PublicKey {
    /// Parses a raw SEC1 point of the given curve: 33 bytes compressed (`02`/`03` prefix) or 65
    /// bytes uncompressed (`04` prefix). Hybrid (`06`/`07`) and identity encodings are rejected.
    pub fn from_sec1(curve: Curve, bytes: &[u8]) -> Result<PublicKey, KeyError> {
        match (bytes.len(), bytes.first()) {
            (33, Some(0x02 | 0x03)) | (65, Some(0x04)) => {}
            (33 | 65, _) => return Err(KeyError::BadPoint { curve }),
            (got, _) => {
                return Err(KeyError::WrongLength {
                    curve,
                    expected: "33 (compressed SEC1) or 65 (uncompressed SEC1)",
                    got,
                })
            }
        }
        match curve {
            Curve::Secp256k1 => secp256k1::PublicKey::from_slice(bytes)
                .map(|k| PublicKey::Secp256k1(Secp256k1Key(k)))
                .map_err(|_| KeyError::BadPoint { curve }),
            Curve::P256 => {
                let point = p256::PublicKey::from_sec1_bytes(bytes)
                    .map_err(|_| KeyError::BadPoint { curve })?;
                let encoded = point.to_encoded_point(false);
                let uncompressed: [u8; 65] = encoded
                    .as_bytes()
                    .try_into()
                    .map_err(|_| KeyError::BadPoint { curve })?;
                Ok(PublicKey::P256(P256Key(uncompressed)))
            }
        }
    }

    /// Parses a compressed (33-byte) SEC1 point only, as the multicodec forms require.
    pub(crate) fn from_compressed_sec1(curve: Curve, bytes: &[u8]) -> Result<PublicKey, KeyError> {
        if bytes.len() != 33 {
            return Err(KeyError::WrongLength {
                curve,
                expected: "33 (compressed SEC1, as did:key and Multikey require)",
                got: bytes.len(),
            });
        }
        PublicKey::from_sec1(curve, bytes)
    }

    /// The curve of this key.
    pub fn curve(&self) -> Curve {
        match self {
            PublicKey::Secp256k1(_) => Curve::Secp256k1,
            PublicKey::P256(_) => Curve::P256,
        }
    }

    /// The 33-byte compressed SEC1 encoding (the form inside `did:key` and Multikey).
    pub fn to_compressed_sec1(&self) -> [u8; 33] {
        match self {
            PublicKey::Secp256k1(Secp256k1Key(k)) => k.serialize(),
            PublicKey::P256(P256Key(u)) => {
                // SEC1 2.3.3: prefix 02 for even y, 03 for odd y, then x. No arithmetic.
                let mut out = [0u8; 33];
                out[0] = 0x02 | (u[64] & 1);
                out[1..].copy_from_slice(&u[1..33]);
                out
            }
        }
    }

    /// The 65-byte uncompressed SEC1 encoding (`04 || x || y`).
    pub fn to_uncompressed_sec1(&self) -> [u8; 65] {
        match self {
            PublicKey::Secp256k1(Secp256k1Key(k)) => k.serialize_uncompressed(),
            PublicKey::P256(P256Key(u)) => *u,
        }
    }
}

impl fmt::Debug for Secp256k1Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secp256k1Key({})", hex(&self.0.serialize()))
    }
}

impl fmt::Debug for P256Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let compressed = PublicKey::P256(*self).to_compressed_sec1();
        write!(f, "P256Key({})", hex(&compressed))
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({})", self.to_did_key())
    }
}

impl fmt::Display for PublicKey {
    /// Writes the `did:key:z...` form.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_did_key())
    }
}

impl FromStr for PublicKey {
    type Err = KeyError;

    /// Parses the `did:key:z...` form.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        PublicKey::from_did_key(s)
    }
}

fn hex(bytes: &[u8]) -> String {
    use fmt::Write;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    // The compressed keys of the interop signature fixtures.
    const K256: &str = "03a7d7fbf04846fa1fcff728ba594f3c5819345e88908e874b537ba5a65d1fc3bb";
    const P256: &str = "033a8273eece6b0d82e95c3506617db5000e14ff0023325d0bb0274918bc6a6cdc";

    fn unhex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
            .collect()
    }

    #[test]
    fn compressed_uncompressed_round_trip_both_curves() {
        for (curve, hex) in [(Curve::Secp256k1, K256), (Curve::P256, P256)] {
            let compressed = unhex(hex);
            let key = PublicKey::from_sec1(curve, &compressed).expect("parse compressed");
            assert_eq!(key.curve(), curve);
            assert_eq!(key.to_compressed_sec1().as_slice(), compressed.as_slice());
            let uncompressed = key.to_uncompressed_sec1();
            assert_eq!(uncompressed[0], 0x04);
            let again = PublicKey::from_sec1(curve, &uncompressed).expect("parse uncompressed");
            assert_eq!(again, key);
            assert_eq!(again.to_compressed_sec1().as_slice(), compressed.as_slice());
        }
    }

    #[test]
    fn rejects_hybrid_identity_and_off_curve() {
        let key = PublicKey::from_sec1(Curve::Secp256k1, &unhex(K256)).expect("parse");
        let mut hybrid = key.to_uncompressed_sec1();
        hybrid[0] = 0x06 | (hybrid[64] & 1); // libsecp256k1 alone would accept this
        assert_eq!(
            PublicKey::from_sec1(Curve::Secp256k1, &hybrid),
            Err(KeyError::BadPoint {
                curve: Curve::Secp256k1
            })
        );
        assert!(matches!(
            PublicKey::from_sec1(Curve::P256, &[0x00]),
            Err(KeyError::WrongLength { got: 1, .. })
        ));
        // x = 7 is on neither curve (x^3 + ax + b is a non-residue for both);
        // x = 0xff..ff is not a field element of either.
        let mut off = [0u8; 33];
        off[0] = 0x02;
        off[32] = 7;
        for curve in [Curve::Secp256k1, Curve::P256] {
            assert_eq!(
                PublicKey::from_sec1(curve, &off),
                Err(KeyError::BadPoint { curve })
            );
        }
        let mut big = [0xffu8; 33];
        big[0] = 0x03;
        for curve in [Curve::Secp256k1, Curve::P256] {
            assert_eq!(
                PublicKey::from_sec1(curve, &big),
                Err(KeyError::BadPoint { curve })
            );
        }
        // An uncompressed point with a y that does not match x.
        let mut wrong_y = key.to_uncompressed_sec1();
        wrong_y[64] ^= 1;
        assert!(PublicKey::from_sec1(Curve::Secp256k1, &wrong_y).is_err());
    }

    #[test]
    fn curve_names() {
        assert_eq!(Curve::Secp256k1.jwt_alg(), "ES256K");
        assert_eq!(Curve::P256.jwt_alg(), "ES256");
        assert_eq!(Curve::P256.to_string(), "P-256");
    }

    #[test]
    fn public_key_stays_small() {
        // Keys are cached per DID; keep the enum at its payload size plus a tag.
        assert!(
            std::mem::size_of::<PublicKey>() <= 66,
            "{}",
            std::mem::size_of::<PublicKey>()
        );
    }

    #[test]
    fn is_send_sync() {
        fn check<T: Send + Sync>() {}
        check::<PublicKey>();
    }
}
