//! Content identifiers (CIDs): binary parsing, string formatting and parsing.
//!
//! Why here and not in a separate crate: a CID is the one CBOR extension atproto uses (tag 42), so
//! the decoder must validate CIDs in-line, and everything above (CAR, MST, records) speaks CIDs.
//!
//! Two representations:
//! - [`Cid<'a>`]: a validated view of binary CID bytes *inside the input* (no copy). This is what the
//!   decoder and the CAR reader hand out.
//! - [`CidBuf`]: an owned, fixed-size copy (no heap), for maps, caches and crossing threads.
//!
//! Supported: CIDv1 with any codec and any multihash whose digest fits (atproto uses codecs
//! dag-cbor 0x71 and raw 0x55 with sha2-256), and CIDv0 (`Qm…`, a bare sha2-256 multihash) for
//! reading old data. [`Cid::is_atproto`] tells whether a CID is one atproto blesses.
//! String forms: multibase base32 lower (`b…`, the only form atproto writes), and for reading also
//! base58btc (`z…`), base16 (`f…`) and CIDv0 (`Qm…`).

use std::fmt;
use std::sync::OnceLock;

/// Multicodec of DAG-CBOR blocks (records, MST nodes, commits).
pub const DAG_CBOR: u64 = 0x71;
/// Multicodec of raw blocks (blobs).
pub const RAW: u64 = 0x55;
/// Multicodec of DAG-PB (the implicit codec of CIDv0).
pub const DAG_PB: u64 = 0x70;
/// Multihash code of SHA-256.
pub const SHA2_256: u64 = 0x12;

/// The longest binary CID we accept (a 64-byte digest plus four varints).
pub const MAX_CID_LEN: usize = 72;

/// Why bytes or a string are not a CID.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CidError {
    /// The bytes end inside the CID.
    Truncated,
    /// A varint is longer than 9 bytes or not minimal.
    BadVarint,
    /// The version is neither 0 nor 1.
    BadVersion,
    /// The digest length is larger than [`MAX_CID_LEN`] allows.
    TooLong,
    /// Bytes remain after the CID where none were expected.
    TrailingBytes,
    /// The string's multibase prefix is unknown, or its characters are not of that base.
    BadString,
}

impl fmt::Display for CidError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CidError::Truncated => "CID is truncated",
            CidError::BadVarint => "CID has an over-long or non-minimal varint",
            CidError::BadVersion => "CID version is not 0 or 1",
            CidError::TooLong => "CID digest is too long",
            CidError::TrailingBytes => "bytes follow the CID",
            CidError::BadString => "not a CID string (multibase b, z, f or CIDv0 Qm)",
        })
    }
}

impl std::error::Error for CidError {}

/// Reads an unsigned LEB128 varint as multiformats define it (at most 9 bytes, minimal).
/// Returns the value and the number of bytes read.
#[inline]
pub fn read_varint(input: &[u8]) -> Result<(u64, usize), CidError> {
    let mut value: u64 = 0;
    for (i, &b) in input.iter().enumerate().take(9) {
        value |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            if b == 0 && i > 0 {
                return Err(CidError::BadVarint);
            }
            return Ok((value, i + 1));
        }
    }
    if input.len() < 9 {
        Err(CidError::Truncated)
    } else {
        Err(CidError::BadVarint)
    }
}

/// Appends `value` as an unsigned LEB128 varint.
pub fn write_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// A validated binary CID borrowed from the input.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Cid<'a> {
    bytes: &'a [u8],
}

impl<'a> Cid<'a> {
    /// Parses the CID at the start of `input`, returning it and its length in bytes.
    /// This is how CAR sections are read: the block data follows the CID.
    #[inline]
    pub fn read_prefix(input: &'a [u8]) -> Result<(Cid<'a>, usize), CidError> {
        // Fast path: the shape of every atproto CID (v1, one-byte codec, sha2-256, 32 bytes).
        if input.len() >= 36
            && input[0] == 0x01
            && input[1] < 0x80
            && input[2] == 0x12
            && input[3] == 0x20
        {
            return Ok((
                Cid {
                    bytes: &input[..36],
                },
                36,
            ));
        }
        let len = Self::measure(input)?;
        Ok((
            Cid {
                bytes: &input[..len],
            },
            len,
        ))
    }

    /// Wraps bytes the decoder already validated as a CID.
    #[inline]
    pub(crate) fn from_validated(bytes: &'a [u8]) -> Cid<'a> {
        Cid { bytes }
    }

    /// Parses `bytes` as exactly one binary CID.
    pub fn from_bytes(bytes: &'a [u8]) -> Result<Cid<'a>, CidError> {
        let (cid, len) = Self::read_prefix(bytes)?;
        if len != bytes.len() {
            return Err(CidError::TrailingBytes);
        }
        Ok(cid)
    }

    /// The length of the CID at the start of `input` (slow path of [`Cid::read_prefix`]).
    fn measure(input: &[u8]) -> Result<usize, CidError> {
        // CIDv0: a bare sha2-256 multihash, 0x12 0x20 + 32 bytes.
        if input.first() == Some(&0x12) {
            if input.get(1) != Some(&0x20) {
                return Err(CidError::BadVersion);
            }
            return if input.len() >= 34 {
                Ok(34)
            } else {
                Err(CidError::Truncated)
            };
        }
        let mut pos = 0;
        let (version, n) = read_varint(input)?;
        pos += n;
        if version != 1 {
            return Err(CidError::BadVersion);
        }
        let (_codec, n) = read_varint(&input[pos..])?;
        pos += n;
        let (_hash, n) = read_varint(&input[pos..])?;
        pos += n;
        let (digest_len, n) = read_varint(&input[pos..])?;
        pos += n;
        let total = (pos as u64).saturating_add(digest_len);
        if total > MAX_CID_LEN as u64 {
            return Err(CidError::TooLong);
        }
        let total = total as usize;
        if input.len() < total {
            return Err(CidError::Truncated);
        }
        Ok(total)
    }

    /// The binary form, exactly as found in the input.
    #[inline]
    pub fn as_bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// 0 or 1.
    pub fn version(&self) -> u64 {
        if self.bytes[0] == 0x12 {
            0
        } else {
            1
        }
    }

    /// The content multicodec (DAG-PB for CIDv0).
    pub fn codec(&self) -> u64 {
        if self.version() == 0 {
            return DAG_PB;
        }
        if self.bytes[1] < 0x80 {
            return u64::from(self.bytes[1]);
        }
        self.fields().0
    }

    /// The multihash code (0x12 for SHA-256).
    pub fn hash_code(&self) -> u64 {
        if self.version() == 0 {
            return SHA2_256;
        }
        // One-byte codec and hash code (every atproto CID): byte 2.
        if self.bytes[1] < 0x80 && self.bytes[2] < 0x80 {
            return u64::from(self.bytes[2]);
        }
        self.fields().1
    }

    /// The digest bytes of the multihash.
    #[inline]
    pub fn digest(&self) -> &'a [u8] {
        // Fast path only when codec and hash code are one-byte varints, so byte 3 is the length.
        if self.bytes.len() == 36
            && self.bytes[1] < 0x80
            && self.bytes[2] < 0x80
            && self.bytes[3] == 0x20
        {
            return &self.bytes[4..];
        }
        if self.version() == 0 {
            return &self.bytes[2..];
        }
        &self.bytes[self.fields().2..]
    }

    /// (codec, hash code, digest offset) of a CIDv1; the bytes were validated at construction.
    fn fields(&self) -> (u64, u64, usize) {
        let mut pos = 1; // version 1 is one byte
        let mut next = || {
            let (v, n) = read_varint(&self.bytes[pos..]).unwrap_or((0, 1));
            pos += n;
            v
        };
        let codec = next();
        let hash = next();
        let _len = next();
        (codec, hash, pos)
    }

    /// Whether this is a CID atproto data may contain: CIDv1, dag-cbor or raw, SHA-256.
    #[inline]
    pub fn is_atproto(&self) -> bool {
        self.bytes.len() == 36
            && self.bytes[0] == 0x01
            && (self.bytes[1] == DAG_CBOR as u8 || self.bytes[1] == RAW as u8)
            && self.bytes[2] == 0x12
            && self.bytes[3] == 0x20
    }

    /// An owned copy.
    pub fn to_buf(&self) -> CidBuf {
        let mut buf = [0u8; MAX_CID_LEN];
        buf[..self.bytes.len()].copy_from_slice(self.bytes);
        CidBuf {
            len: self.bytes.len() as u8,
            buf,
        }
    }

    /// Appends the canonical string form (base32 `b…` for v1, base58 `Qm…` for v0) to `out`.
    pub fn write_string(&self, out: &mut Vec<u8>) {
        if self.version() == 0 {
            out.extend_from_slice(bs58::encode(self.bytes).into_string().as_bytes());
            return;
        }
        out.push(b'b');
        let enc = base32_lower();
        let start = out.len();
        out.resize(start + enc.encode_len(self.bytes.len()), 0);
        enc.encode_mut(self.bytes, &mut out[start..]);
    }
}

impl fmt::Display for Cid<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut s = Vec::with_capacity(64);
        self.write_string(&mut s);
        f.write_str(std::str::from_utf8(&s).map_err(|_| fmt::Error)?)
    }
}

impl fmt::Debug for Cid<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Cid({self})")
    }
}

fn base32_lower() -> &'static data_encoding::Encoding {
    static ENC: OnceLock<data_encoding::Encoding> = OnceLock::new();
    ENC.get_or_init(|| {
        let mut spec = data_encoding::Specification::new();
        spec.symbols.push_str("abcdefghijklmnopqrstuvwxyz234567");
        // Accept upper case too when decoding (multibase 'B' is upper-case base32).
        spec.translate.from.push_str("ABCDEFGHIJKLMNOPQRSTUVWXYZ");
        spec.translate.to.push_str("abcdefghijklmnopqrstuvwxyz");
        #[allow(clippy::expect_used)]
        spec.encoding()
            .expect("static base32 specification is valid")
    })
}

/// An owned CID: a fixed-size inline buffer, `Copy`, no heap.
#[derive(Clone, Copy)]
pub struct CidBuf {
    len: u8,
    buf: [u8; MAX_CID_LEN],
}

impl CidBuf {
    /// Copies and validates binary CID bytes.
    pub fn from_bytes(bytes: &[u8]) -> Result<CidBuf, CidError> {
        Ok(Cid::from_bytes(bytes)?.to_buf())
    }

    /// The CIDv1 of `data` under `codec` with a SHA-256 multihash.
    pub fn sha256(codec: u64, data: &[u8]) -> CidBuf {
        use sha2::Digest;
        let digest = sha2::Sha256::digest(data);
        Self::from_sha256_digest(codec, digest.as_ref())
    }

    /// The CIDv1 for a SHA-256 digest already computed. `codec` must be below 0x80 (dag-cbor, raw).
    pub fn from_sha256_digest(codec: u64, digest: &[u8]) -> CidBuf {
        debug_assert!(codec < 0x80 && digest.len() == 32);
        let mut buf = [0u8; MAX_CID_LEN];
        buf[0] = 0x01;
        buf[1] = codec as u8;
        buf[2] = 0x12;
        buf[3] = 0x20;
        buf[4..36].copy_from_slice(&digest[..32]);
        CidBuf { len: 36, buf }
    }

    /// Parses a CID string: `b…` (base32), `B…`, `z…` (base58btc), `f…` (base16) or `Qm…` (CIDv0).
    pub fn parse(s: &str) -> Result<CidBuf, CidError> {
        let bytes = s.as_bytes();
        if bytes.len() < 2 {
            return Err(CidError::BadString);
        }
        let decoded: Vec<u8> = if s.len() == 46 && s.starts_with("Qm") {
            bs58::decode(s)
                .into_vec()
                .map_err(|_| CidError::BadString)?
        } else {
            // `get`, not indexing: a multi-byte first character must be an error, not a panic.
            let body = s.get(1..).ok_or(CidError::BadString)?;
            match bytes[0] {
                b'b' | b'B' => base32_lower()
                    .decode(body.as_bytes())
                    .map_err(|_| CidError::BadString)?,
                b'z' => bs58::decode(body)
                    .into_vec()
                    .map_err(|_| CidError::BadString)?,
                b'f' | b'F' => data_encoding::HEXLOWER_PERMISSIVE
                    .decode(body.as_bytes())
                    .map_err(|_| CidError::BadString)?,
                _ => return Err(CidError::BadString),
            }
        };
        // A multibase string must carry a CIDv1; CIDv0 only appears bare as `Qm…`.
        if !s.starts_with("Qm") && decoded.first() != Some(&0x01) {
            return Err(CidError::BadVersion);
        }
        CidBuf::from_bytes(&decoded)
    }

    /// A borrowed view.
    #[inline]
    pub fn as_cid(&self) -> Cid<'_> {
        Cid {
            bytes: self.as_bytes(),
        }
    }

    /// The binary form.
    #[inline]
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..usize::from(self.len)]
    }
}

impl PartialEq for CidBuf {
    fn eq(&self, other: &Self) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}
impl Eq for CidBuf {}
impl std::hash::Hash for CidBuf {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_bytes().hash(state)
    }
}
impl PartialOrd for CidBuf {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for CidBuf {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_bytes().cmp(other.as_bytes())
    }
}
impl fmt::Display for CidBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.as_cid(), f)
    }
}
impl fmt::Debug for CidBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CidBuf({self})")
    }
}
impl std::str::FromStr for CidBuf {
    type Err = CidError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        CidBuf::parse(s)
    }
}
impl<'a> From<Cid<'a>> for CidBuf {
    fn from(c: Cid<'a>) -> Self {
        c.to_buf()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const V1: &str = "bafyreidfayvfuwqa7qlnopdjiqrxzs6blmoeu4rujcjtnci5beludirz2a";

    #[test]
    fn hash_code_fast_path_matches_the_varints() {
        // Codec and hash code of one and two varint bytes, every combination.
        for codec in [0x55u64, 0x71, 0x7f, 0x80, 0x3fff] {
            for hash in [0x12u64, 0x13, 0x7f, 0x80, 0x1012] {
                let mut b = vec![0x01];
                write_varint(&mut b, codec);
                write_varint(&mut b, hash);
                b.push(4);
                b.extend([9; 4]);
                let c = Cid::from_bytes(&b).unwrap();
                assert_eq!((c.codec(), c.hash_code()), (codec, hash), "{b:02x?}");
                assert_eq!(c.hash_code(), c.fields().1);
            }
        }
    }

    #[test]
    fn v1_string_round_trip() {
        let c = CidBuf::parse(V1).unwrap();
        assert_eq!(c.as_bytes().len(), 36);
        assert_eq!(c.as_cid().codec(), DAG_CBOR);
        assert_eq!(c.as_cid().hash_code(), SHA2_256);
        assert!(c.as_cid().is_atproto());
        assert_eq!(c.to_string(), V1);
    }

    #[test]
    fn raw_codec() {
        let c =
            CidBuf::parse("bafkreiccldh766hwcnuxnf2wh6jgzepf2nlu2lvcllt63eww5p6chi4ity").unwrap();
        assert_eq!(c.as_cid().codec(), RAW);
    }

    #[test]
    fn v0_reads() {
        let c = CidBuf::parse("QmdfTbBqBPQ7VNxZEYEj14VmRuZBkqFbiwReogJgS1zR1n").unwrap();
        assert_eq!(c.as_cid().version(), 0);
        assert_eq!(c.as_cid().codec(), DAG_PB);
        assert_eq!(c.as_cid().digest().len(), 32);
        assert_eq!(
            c.to_string(),
            "QmdfTbBqBPQ7VNxZEYEj14VmRuZBkqFbiwReogJgS1zR1n"
        );
        assert!(!c.as_cid().is_atproto());
    }

    #[test]
    fn other_bases_read() {
        let v1 = CidBuf::parse(V1).unwrap();
        let mut hex = String::from("f");
        for b in v1.as_bytes() {
            hex.push_str(&format!("{b:02x}"));
        }
        assert_eq!(CidBuf::parse(&hex).unwrap(), v1);
        let z = format!("z{}", bs58::encode(v1.as_bytes()).into_string());
        assert_eq!(CidBuf::parse(&z).unwrap(), v1);
    }

    #[test]
    fn sha256_matches_known_cid() {
        // The empty byte string's raw CID.
        let c = CidBuf::sha256(RAW, b"");
        assert_eq!(
            c.to_string(),
            "bafkreihdwdcefgh4dqkjv67uzcmw7ojee6xedzdetojuzjevtenxquvyku"
        );
    }

    #[test]
    fn rejects_garbage() {
        assert_eq!(CidBuf::parse("."), Err(CidError::BadString));
        assert!(CidBuf::parse("bafy").is_err());
        assert!(Cid::from_bytes(&[0x01, 0x71, 0x12, 0x20, 1, 2]).is_err());
        assert_eq!(Cid::from_bytes(&[0x02, 0x71]), Err(CidError::BadVersion));
        assert_eq!(read_varint(&[0x80, 0x00]), Err(CidError::BadVarint));
        assert_eq!(read_varint(&[0x80]), Err(CidError::Truncated));
    }
}
