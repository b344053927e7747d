//! Synthetic accounts: keypairs, `did:plc` identifiers, handles, PDS hosts and DID documents.
//!
//! Why: every generated commit is signed by its account's key and checked against the key in
//! `did_docs.json`, so accounts and documents come from one place. Shapes follow the real
//! network: `did:plc:` + 24 base32 characters, handles mostly `name.bsky.social`, PDS endpoints
//! on `*.host.bsky.network`, keys about 97% secp256k1 and 3% P-256, and documents in exactly
//! the JSON shape the PLC directory serves (see the shared corpus's `did_docs.json`).
//!
//! What it does not do: anything random on its own: every choice comes from the caller's RNG.

use rand::Rng;
use riptide_crypto::{Curve, PrivateKey};
use serde_json::{json, Value};

use crate::words::{pick, HANDLE_WORDS, MUSHROOMS, TLDS};

/// Share of accounts with a P-256 key (the rest are secp256k1).
pub const P256_SHARE: f64 = 0.03;

/// A generated account's identity.
#[derive(Clone, Debug)]
pub struct Account {
    /// `did:plc:…`
    pub did: String,
    /// The handle (without `at://`).
    pub handle: String,
    /// The PDS endpoint URL.
    pub pds: String,
    /// The signing key.
    pub key: PrivateKey,
}

const B32: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";

/// A `did:plc:`-shaped DID: 24 characters of base32.
pub fn random_did<R: Rng>(rng: &mut R) -> String {
    let mut s = String::with_capacity(32);
    s.push_str("did:plc:");
    for _ in 0..24 {
        s.push(char::from(B32[rng.gen_range(0..32)]));
    }
    s
}

impl Account {
    /// Draws a new account.
    pub fn generate<R: Rng>(rng: &mut R) -> Account {
        let curve = if rng.gen_bool(P256_SHARE) {
            Curve::P256
        } else {
            Curve::Secp256k1
        };
        let key = loop {
            let bytes: [u8; 32] = rng.gen();
            // A scalar of zero or above the order has probability ~2^-128: draw again.
            if let Ok(k) = PrivateKey::from_bytes(curve, &bytes) {
                break k;
            }
        };
        let did = random_did(rng);
        let name = format!(
            "{}{}{}",
            pick(rng, HANDLE_WORDS),
            pick(rng, HANDLE_WORDS),
            if rng.gen_bool(0.5) {
                rng.gen_range(1..1000).to_string()
            } else {
                String::new()
            }
        );
        let handle = if rng.gen_bool(0.88) {
            format!("{name}.bsky.social")
        } else {
            format!("{name}.{}", pick(rng, TLDS))
        };
        let region = if rng.gen_bool(0.5) {
            "us-east"
        } else {
            "us-west"
        };
        let pds = if rng.gen_bool(0.97) {
            format!(
                "https://{}.{region}.host.bsky.network",
                pick(rng, MUSHROOMS)
            )
        } else {
            format!(
                "https://pds.{}.{}",
                pick(rng, HANDLE_WORDS),
                pick(rng, TLDS)
            )
        };
        Account {
            did,
            handle,
            pds,
            key,
        }
    }

    /// The DID document, as the PLC directory serves it.
    pub fn did_doc(&self) -> Value {
        let suite = match self.key.curve() {
            Curve::Secp256k1 => "https://w3id.org/security/suites/secp256k1-2019/v1",
            Curve::P256 => "https://w3id.org/security/suites/ecdsa-2019/v1",
        };
        json!({
            "@context": [
                "https://www.w3.org/ns/did/v1",
                "https://w3id.org/security/multikey/v1",
                suite,
            ],
            "id": self.did,
            "alsoKnownAs": [format!("at://{}", self.handle)],
            "verificationMethod": [{
                "id": format!("{}#atproto", self.did),
                "type": "Multikey",
                "controller": self.did,
                "publicKeyMultibase": self.key.public_key().to_multibase(),
            }],
            "service": [{
                "id": "#atproto_pds",
                "type": "AtprotoPersonalDataServer",
                "serviceEndpoint": self.pds,
            }],
        })
    }
}
