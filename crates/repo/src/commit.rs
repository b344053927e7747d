//! The signed repository commit object: decoding, the unsigned bytes, signature verification.
//!
//! Spec: <https://atproto.com/specs/repository#commit-objects>. A commit is a DAG-CBOR map
//! `{did, version: 3, data, rev, prev, sig}`: `data` is the MST root, `rev` a TID, `prev` a
//! nullable link (absent in some older commits: tolerated), `sig` the 64-byte ECDSA signature
//! over the SHA-256 of the same map encoded without `sig`.
//!
//! Why the unsigned bytes are cheap: the commit was decoded strictly, so its bytes *are* its
//! canonical encoding. The map without `sig` is then a new map header followed by the original
//! bytes with the `sig` pair cut out: two copies, no re-encoding, and any fields this code does
//! not know about are signed over exactly as the author wrote them.
//!
//! What it does not do: resolve or cache signing keys (the caller owns a per-DID key cache), or
//! judge `rev` against a previous commit beyond [`rev_is_newer`].

use riptide_cbor::{write_map_header, Arena, Cid, Kind, Options, Value};
use riptide_crypto::{PublicKey, VerifyError};

use crate::error::CommitError;

/// A decoded commit, borrowing its block.
#[derive(Debug, Clone, Copy)]
pub struct Commit<'a> {
    block: &'a [u8],
    did: &'a str,
    version: i64,
    data: Cid<'a>,
    rev: &'a str,
    prev: Option<Cid<'a>>,
    has_prev: bool,
    sig: &'a [u8],
    /// Byte range of the `sig` pair (key and value) in `block`.
    sig_pair: (usize, usize),
    /// Length of the map header and number of pairs.
    header_len: usize,
    pairs: usize,
}

fn text_in<'a>(v: Value<'_>, block: &'a [u8]) -> Option<&'a str> {
    if v.kind() != Kind::Text {
        return None;
    }
    std::str::from_utf8(block.get(v.byte_range()?)?).ok()
}

fn head_len(arg: usize) -> usize {
    match arg {
        0..=23 => 1,
        24..=0xff => 2,
        0x100..=0xffff => 3,
        _ => 5,
    }
}

impl<'a> Commit<'a> {
    /// Decodes a commit block (strict DAG-CBOR).
    pub fn decode(block: &'a [u8]) -> Result<Commit<'a>, CommitError> {
        Commit::decode_with(&mut Arena::new(), block)
    }

    /// Decodes a commit block using `arena` for the tape.
    pub fn decode_with(arena: &mut Arena, block: &'a [u8]) -> Result<Commit<'a>, CommitError> {
        let mut tape = arena.tape(block);
        let item = tape
            .decode(0..block.len(), &Options::strict())
            .map_err(|e| CommitError::Cbor {
                kind: e.kind(),
                offset: e.offset(),
            })?;
        let doc = tape.finish();
        let map = doc.value(item);
        if map.kind() != Kind::Map {
            return Err(CommitError::NotAMap);
        }
        let (mut did, mut version, mut data, mut rev, mut sig) = (None, None, None, None, None);
        let mut prev = None;
        let mut has_prev = false;
        let mut sig_pair = (0, 0);
        for (name, v) in map.entries() {
            match name {
                "did" => did = Some(text_in(v, block).ok_or(CommitError::WrongType("did"))?),
                "version" => version = Some(v.as_i64().ok_or(CommitError::WrongType("version"))?),
                "data" => {
                    let r = v
                        .byte_range()
                        .filter(|_| v.kind() == Kind::Link)
                        .ok_or(CommitError::WrongType("data"))?;
                    data = Some(
                        block
                            .get(r)
                            .and_then(|b| Cid::from_bytes(b).ok())
                            .ok_or(CommitError::WrongType("data"))?,
                    );
                }
                "rev" => rev = Some(text_in(v, block).ok_or(CommitError::WrongType("rev"))?),
                "prev" => {
                    has_prev = true;
                    if !v.is_null() {
                        let r = v
                            .byte_range()
                            .filter(|_| v.kind() == Kind::Link)
                            .ok_or(CommitError::WrongType("prev"))?;
                        prev = Some(
                            block
                                .get(r)
                                .and_then(|b| Cid::from_bytes(b).ok())
                                .ok_or(CommitError::WrongType("prev"))?,
                        );
                    }
                }
                "sig" => {
                    let r = v
                        .byte_range()
                        .filter(|_| v.kind() == Kind::Bytes)
                        .ok_or(CommitError::WrongType("sig"))?;
                    // The key "sig" is a one-byte text header and three bytes, just before the value.
                    let value_start = r.start.saturating_sub(head_len(r.len()));
                    sig_pair = (value_start.saturating_sub(4), r.end);
                    sig = Some(block.get(r).ok_or(CommitError::WrongType("sig"))?);
                }
                _ => {}
            }
        }
        let version = version.ok_or(CommitError::MissingField("version"))?;
        if version != 3 {
            return Err(CommitError::UnsupportedVersion(version));
        }
        Ok(Commit {
            block,
            did: did.ok_or(CommitError::MissingField("did"))?,
            version,
            data: data.ok_or(CommitError::MissingField("data"))?,
            rev: rev.ok_or(CommitError::MissingField("rev"))?,
            prev,
            has_prev,
            sig: sig.ok_or(CommitError::MissingField("sig"))?,
            sig_pair,
            header_len: head_len(map.len()),
            pairs: map.len(),
        })
    }

    /// The repository DID.
    pub fn did(&self) -> &'a str {
        self.did
    }

    /// The repository format version (always 3 for a decoded commit).
    pub fn version(&self) -> i64 {
        self.version
    }

    /// The MST root.
    pub fn data(&self) -> Cid<'a> {
        self.data
    }

    /// The revision (a TID).
    pub fn rev(&self) -> &'a str {
        self.rev
    }

    /// The previous commit, if linked (usually null in current repositories).
    pub fn prev(&self) -> Option<Cid<'a>> {
        self.prev
    }

    /// Whether the `prev` field is present at all (even as null).
    pub fn has_prev_field(&self) -> bool {
        self.has_prev
    }

    /// The signature bytes (64 for a well-formed commit).
    pub fn sig(&self) -> &'a [u8] {
        self.sig
    }

    /// The block this commit was decoded from.
    pub fn block(&self) -> &'a [u8] {
        self.block
    }

    /// Appends the bytes that were signed: the commit map without its `sig` pair.
    pub fn unsigned_bytes(&self, out: &mut Vec<u8>) {
        let (start, end) = self.sig_pair;
        out.reserve(self.block.len());
        write_map_header(out, self.pairs.saturating_sub(1));
        out.extend_from_slice(self.block.get(self.header_len..start).unwrap_or_default());
        out.extend_from_slice(self.block.get(end..).unwrap_or_default());
    }

    /// Verifies the signature with `key` (strict: low-S, 64-byte compact).
    pub fn verify_signature(&self, key: &PublicKey) -> Result<(), VerifyError> {
        let mut buf = Vec::with_capacity(self.block.len());
        self.verify_signature_with(key, &mut buf)
    }

    /// [`Commit::verify_signature`] with a caller-owned scratch buffer (cleared first).
    pub fn verify_signature_with(
        &self,
        key: &PublicKey,
        buf: &mut Vec<u8>,
    ) -> Result<(), VerifyError> {
        buf.clear();
        self.unsigned_bytes(buf);
        key.verify(buf, self.sig)
    }
}

/// Whether `s` is a TID: 13 characters of base32-sortable, the first one of `234567abcdefghij`.
pub fn is_tid(s: &str) -> bool {
    const ALPHABET: &[u8] = b"234567abcdefghijklmnopqrstuvwxyz";
    let b = s.as_bytes();
    b.len() == 13 && b"234567abcdefghij".contains(&b[0]) && b.iter().all(|c| ALPHABET.contains(c))
}

/// Whether revision `rev` comes strictly after `since`. TIDs are base32-sortable, so this is a
/// plain string comparison; both should be checked with [`is_tid`] first.
pub fn rev_is_newer(rev: &str, since: &str) -> bool {
    rev > since
}

#[cfg(test)]
mod tests {
    use super::*;
    use riptide_cbor::{CidBuf, OwnedValue, DAG_CBOR};
    use riptide_crypto::{Curve, PrivateKey};
    use std::collections::BTreeMap;

    fn commit_map(with_prev: bool) -> BTreeMap<String, OwnedValue> {
        let mut m = BTreeMap::new();
        m.insert(
            "did".into(),
            OwnedValue::Text("did:plc:53iucmf5ldftgqyf2ac7hmhd".into()),
        );
        m.insert("version".into(), OwnedValue::Int(3));
        m.insert(
            "data".into(),
            OwnedValue::Link(CidBuf::sha256(DAG_CBOR, b"x")),
        );
        m.insert("rev".into(), OwnedValue::Text("3migo7fijwi2k".into()));
        if with_prev {
            m.insert("prev".into(), OwnedValue::Null);
        }
        m
    }

    fn signed(key: &PrivateKey, with_prev: bool) -> Vec<u8> {
        let mut m = commit_map(with_prev);
        let unsigned = OwnedValue::Map(m.clone()).to_cbor();
        m.insert(
            "sig".into(),
            OwnedValue::Bytes(key.sign(&unsigned).to_vec()),
        );
        OwnedValue::Map(m).to_cbor()
    }

    #[test]
    fn unsigned_bytes_match_reencoding() {
        for with_prev in [true, false] {
            let key = PrivateKey::from_bytes(Curve::Secp256k1, &[3; 32]).unwrap();
            let bytes = signed(&key, with_prev);
            let c = Commit::decode(&bytes).unwrap();
            let mut out = Vec::new();
            c.unsigned_bytes(&mut out);
            assert_eq!(out, OwnedValue::Map(commit_map(with_prev)).to_cbor());
            assert_eq!(c.has_prev_field(), with_prev);
            assert_eq!(c.prev(), None);
            assert_eq!(c.rev(), "3migo7fijwi2k");
            assert_eq!(c.version(), 3);
            c.verify_signature(&key.public_key()).unwrap();
            let other = PrivateKey::from_bytes(Curve::P256, &[4; 32]).unwrap();
            assert!(c.verify_signature(&other.public_key()).is_err());
        }
    }

    #[test]
    fn tampering_breaks_the_signature() {
        let key = PrivateKey::from_bytes(Curve::P256, &[5; 32]).unwrap();
        let mut bytes = signed(&key, true);
        // Flip a byte of the rev text.
        let pos = bytes.windows(4).position(|w| w == b"3mig").unwrap();
        bytes[pos + 5] ^= 1;
        let c = Commit::decode(&bytes).unwrap();
        assert_eq!(
            c.verify_signature(&key.public_key()),
            Err(VerifyError::BadSignature)
        );
    }

    #[test]
    fn field_errors() {
        let mut m = commit_map(true);
        m.insert("sig".into(), OwnedValue::Bytes(vec![0; 64]));
        let mut v2 = m.clone();
        v2.insert("version".into(), OwnedValue::Int(2));
        assert_eq!(
            Commit::decode(&OwnedValue::Map(v2).to_cbor()).unwrap_err(),
            CommitError::UnsupportedVersion(2)
        );
        let mut nodid = m.clone();
        nodid.remove("did");
        assert_eq!(
            Commit::decode(&OwnedValue::Map(nodid).to_cbor()).unwrap_err(),
            CommitError::MissingField("did")
        );
        let mut badsig = m.clone();
        badsig.insert("sig".into(), OwnedValue::Text("x".into()));
        assert_eq!(
            Commit::decode(&OwnedValue::Map(badsig).to_cbor()).unwrap_err(),
            CommitError::WrongType("sig")
        );
        let mut baddata = m;
        baddata.insert("data".into(), OwnedValue::Null);
        assert_eq!(
            Commit::decode(&OwnedValue::Map(baddata).to_cbor()).unwrap_err(),
            CommitError::WrongType("data")
        );
        assert_eq!(Commit::decode(&[0x01]).unwrap_err(), CommitError::NotAMap);
        assert!(matches!(
            Commit::decode(&[0xa1]).unwrap_err(),
            CommitError::Cbor { .. }
        ));
    }

    #[test]
    fn tids() {
        assert!(is_tid("3migo7fijwi2k"));
        assert!(!is_tid("3migo7fijwi2"));
        assert!(!is_tid("kmigo7fijwi2k"));
        assert!(!is_tid("3migo7fijwi2K"));
        assert!(rev_is_newer("3migo7fijwi2k", "3migo7fijwi2j"));
        assert!(!rev_is_newer("3migo7fijwi2k", "3migo7fijwi2k"));
    }
}
