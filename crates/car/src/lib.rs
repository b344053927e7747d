//! CAR v1: the block container of firehose commits and repository exports.
//!
//! Why a crate of its own: every commit frame carries a CAR in its `blocks` field and every
//! repository export is one; the reader is where content addressing is enforced. By default the
//! SHA-256 of every block is checked against its CID *while reading*, so no caller can forget to.
//! [`CarOptions::verify`] = false is the explicit, named opt-out.
//!
//! The reader works over a byte slice: blocks are `(CID, data)` views into the input, nothing is
//! copied. A [`CarReader`] keeps its storage (block list, CID index) between calls, so decoding a
//! stream of frames allocates nothing once warm. Lookup by CID is O(1): an index keyed by the
//! first eight digest bytes (SHA-256 output is uniform, so no further hashing is needed),
//! confirmed against the full CID.
//!
//! Limits are checked before work: total size, block count, section length.
//!
//! Spec: <https://ipld.io/specs/transport/car/carv1/>.

use std::fmt;

use riptide_cbor::{read_varint, Arena, Cid, CidBuf, Kind, Options};
use sha2::{Digest, Sha256};

mod write;
pub use write::{write_car, CarWriter};

/// How to read a CAR.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CarOptions {
    /// Check every block's SHA-256 against its CID (default: true).
    pub verify: bool,
    /// Largest CAR accepted, in bytes (default: 2 MiB, the firehose's `blocks` limit).
    pub max_bytes: usize,
    /// Most blocks accepted (default: 10,000).
    pub max_blocks: usize,
}

impl Default for CarOptions {
    fn default() -> Self {
        CarOptions { verify: true, max_bytes: 2 << 20, max_blocks: 10_000 }
    }
}

impl CarOptions {
    /// Options for a whole repository export: verification on, up to 4 GiB and 16M blocks.
    pub fn repository() -> CarOptions {
        CarOptions { verify: true, max_bytes: u32::MAX as usize, max_blocks: 16 << 20 }
    }
}

/// What is wrong with a CAR.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CarErrorKind {
    /// Larger than [`CarOptions::max_bytes`].
    TooLarge,
    /// More blocks than [`CarOptions::max_blocks`].
    TooManyBlocks,
    /// The input ends inside the header or a section.
    Truncated,
    /// A length varint is malformed.
    BadVarint,
    /// The header is not valid DAG-CBOR.
    HeaderCbor(riptide_cbor::ErrorKind),
    /// The header is not `{version: 1, roots: [CID…]}`.
    BadHeader(&'static str),
    /// A section's CID is malformed.
    BadCid,
    /// A section length is zero or runs past the end.
    BadSectionLength,
    /// A block's SHA-256 does not match its CID.
    HashMismatch {
        /// The CID the block claims.
        cid: CidBuf,
    },
    /// A block's CID uses a hash other than SHA-256, so it cannot be verified.
    UnsupportedHash(u64),
}

/// A CAR error: what, where, and which block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CarError {
    kind: CarErrorKind,
    offset: usize,
    block: Option<usize>,
}

impl CarError {
    fn new(kind: CarErrorKind, offset: usize, block: Option<usize>) -> CarError {
        CarError { kind, offset, block }
    }

    /// What is wrong.
    pub fn kind(&self) -> &CarErrorKind {
        &self.kind
    }

    /// Byte offset within the CAR.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Index of the block section concerned, if any.
    pub fn block(&self) -> Option<usize> {
        self.block
    }

    /// Whether this is a content-address failure (a block whose bytes do not match its CID).
    pub fn is_hash_mismatch(&self) -> bool {
        matches!(self.kind, CarErrorKind::HashMismatch { .. })
    }
}

impl fmt::Display for CarError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            CarErrorKind::TooLarge => write!(f, "CAR larger than the limit"),
            CarErrorKind::TooManyBlocks => write!(f, "CAR has more blocks than the limit"),
            CarErrorKind::Truncated => write!(f, "CAR truncated"),
            CarErrorKind::BadVarint => write!(f, "malformed length varint"),
            CarErrorKind::HeaderCbor(k) => write!(f, "CAR header is not DAG-CBOR ({})", k.as_str()),
            CarErrorKind::BadHeader(why) => write!(f, "bad CAR header: {why}"),
            CarErrorKind::BadCid => write!(f, "malformed block CID"),
            CarErrorKind::BadSectionLength => write!(f, "bad section length"),
            CarErrorKind::HashMismatch { cid } => {
                write!(f, "block {cid} does not hash to its CID")
            }
            CarErrorKind::UnsupportedHash(code) => {
                write!(f, "block hash 0x{code:x} is not SHA-256; cannot verify")
            }
        }?;
        if let Some(b) = self.block {
            write!(f, " (block {b})")?;
        }
        write!(f, " at byte {}", self.offset)
    }
}

impl std::error::Error for CarError {}

/// One block: its CID and data, both borrowed from the CAR bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Block<'a> {
    /// The block's CID.
    pub cid: Cid<'a>,
    /// The block's bytes.
    pub data: &'a [u8],
    /// Offset of `data` within the CAR bytes.
    pub offset: usize,
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    key: u64,
    cid_start: u32,
    cid_len: u8,
    data_start: u32,
    data_len: u32,
}

/// The CID index: open addressing over the first eight digest bytes, which SHA-256 makes uniform,
/// so the key is its own hash. Written by hand because a general hash map cost 13% of decoding a
/// ten-block firehose CAR (profiled); this one is cleared by refilling a table sized to the CAR.
#[derive(Debug, Default)]
struct Index {
    /// Block index + 1; 0 is empty.
    slots: Vec<u32>,
    keys: Vec<u64>,
    mask: usize,
}

impl Index {
    fn reset(&mut self, expected: usize) {
        let size = (expected * 2).next_power_of_two().max(16);
        self.slots.clear();
        self.slots.resize(size, 0);
        self.keys.clear();
        self.keys.resize(size, 0);
        self.mask = size - 1;
    }

    fn grow(&mut self, entries: &[Entry]) {
        let size = self.slots.len() * 2;
        self.slots.clear();
        self.slots.resize(size, 0);
        self.keys.clear();
        self.keys.resize(size, 0);
        self.mask = size - 1;
        for (i, e) in entries.iter().enumerate() {
            self.insert(e.key, i as u32);
        }
    }

    /// Inserts unless the key is present (the first block with a digest wins).
    #[inline]
    fn insert(&mut self, key: u64, block: u32) {
        let mut i = key as usize & self.mask;
        loop {
            match self.slots[i] {
                0 => {
                    self.slots[i] = block + 1;
                    self.keys[i] = key;
                    return;
                }
                _ if self.keys[i] == key => return,
                _ => i = (i + 1) & self.mask,
            }
        }
    }

    #[inline]
    fn get(&self, key: u64) -> Option<usize> {
        if self.slots.is_empty() {
            return None;
        }
        let mut i = key as usize & self.mask;
        loop {
            match self.slots[i] {
                0 => return None,
                b if self.keys[i] == key => return Some(b as usize - 1),
                _ => i = (i + 1) & self.mask,
            }
        }
    }
}

/// The index key of a digest: its first eight bytes.
#[inline]
fn digest_key(digest: &[u8]) -> u64 {
    let mut k = [0u8; 8];
    let n = digest.len().min(8);
    k[..n].copy_from_slice(&digest[..n]);
    u64::from_le_bytes(k)
}

/// Reusable CAR reader state. One per thread.
#[derive(Default)]
pub struct CarReader {
    entries: Vec<Entry>,
    roots: Vec<(u32, u8)>,
    index: Index,
    arena: Arena,
}

impl fmt::Debug for CarReader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CarReader").field("blocks", &self.entries.len()).finish()
    }
}

impl CarReader {
    /// A reader with empty storage.
    pub fn new() -> CarReader {
        CarReader::default()
    }

    /// Reads a whole CAR: header, every block section, and (by default) each block's SHA-256.
    pub fn read<'a>(&'a mut self, bytes: &'a [u8], opts: &CarOptions) -> Result<Car<'a>, CarError> {
        self.entries.clear();
        self.roots.clear();
        // A block section is at least 38 bytes (length, CID, data): size the index for that.
        self.index.reset((bytes.len() / 64).min(opts.max_blocks).min(1 << 16));
        if bytes.len() > opts.max_bytes || bytes.len() > u32::MAX as usize {
            return Err(CarError::new(CarErrorKind::TooLarge, 0, None));
        }
        let mut pos = self.read_header(bytes)?;
        while pos < bytes.len() {
            let section_at = pos;
            let block_no = self.entries.len();
            if block_no >= opts.max_blocks {
                return Err(CarError::new(CarErrorKind::TooManyBlocks, pos, Some(block_no)));
            }
            let (len, n) = read_varint(&bytes[pos..]).map_err(|e| {
                let kind = match e {
                    riptide_cbor::CidError::Truncated => CarErrorKind::Truncated,
                    _ => CarErrorKind::BadVarint,
                };
                CarError::new(kind, pos, Some(block_no))
            })?;
            pos += n;
            if len == 0 || len > (bytes.len() - pos) as u64 {
                return Err(CarError::new(CarErrorKind::BadSectionLength, section_at, Some(block_no)));
            }
            let section = &bytes[pos..pos + len as usize];
            let (cid, cid_len) = Cid::read_prefix(section)
                .map_err(|_| CarError::new(CarErrorKind::BadCid, pos, Some(block_no)))?;
            let data_start = pos + cid_len;
            let data = &section[cid_len..];
            if opts.verify {
                verify_block(cid, data)
                    .map_err(|kind| CarError::new(kind, section_at, Some(block_no)))?;
            }
            let key = digest_key(cid.digest());
            self.entries.push(Entry {
                key,
                cid_start: pos as u32,
                cid_len: cid_len as u8,
                data_start: data_start as u32,
                data_len: data.len() as u32,
            });
            if self.entries.len() * 2 > self.index.slots.len() {
                self.index.grow(&self.entries);
            } else {
                self.index.insert(key, block_no as u32);
            }
            pos += len as usize;
        }
        Ok(Car { bytes, reader: self })
    }

    /// Parses the header `{roots: [CID…], version: 1}`; returns where the first section starts.
    fn read_header(&mut self, bytes: &[u8]) -> Result<usize, CarError> {
        let (hlen, n) = read_varint(bytes).map_err(|e| {
            let kind = match e {
                riptide_cbor::CidError::Truncated => CarErrorKind::Truncated,
                _ => CarErrorKind::BadVarint,
            };
            CarError::new(kind, 0, None)
        })?;
        if hlen == 0 || hlen > (bytes.len() - n) as u64 {
            return Err(CarError::new(CarErrorKind::Truncated, 0, None));
        }
        let end = n + hlen as usize;
        let mut tape = self.arena.tape(bytes);
        let item = tape
            .decode(n..end, &Options::strict())
            .map_err(|e| CarError::new(CarErrorKind::HeaderCbor(e.kind()), e.offset(), None))?;
        let header = tape.value(item);
        if header.kind() != Kind::Map {
            return Err(CarError::new(CarErrorKind::BadHeader("not a map"), n, None));
        }
        if header.get("version").and_then(|v| v.as_i64()) != Some(1) {
            return Err(CarError::new(CarErrorKind::BadHeader("version is not 1"), n, None));
        }
        let roots = header
            .get("roots")
            .and_then(|r| r.array())
            .ok_or(CarError::new(CarErrorKind::BadHeader("no roots array"), n, None))?;
        for r in roots {
            let cid = r
                .as_link()
                .ok_or(CarError::new(CarErrorKind::BadHeader("root is not a CID"), n, None))?;
            let off = cid.as_bytes().as_ptr() as usize - bytes.as_ptr() as usize;
            self.roots.push((off as u32, cid.as_bytes().len() as u8));
        }
        Ok(end)
    }
}

/// Checks that `data` hashes to `cid`'s SHA-256 digest.
#[inline]
pub fn verify_block(cid: Cid<'_>, data: &[u8]) -> Result<(), CarErrorKind> {
    if cid.hash_code() != riptide_cbor::SHA2_256 || cid.digest().len() != 32 {
        return Err(CarErrorKind::UnsupportedHash(cid.hash_code()));
    }
    let digest = Sha256::digest(data);
    if digest.as_slice() != cid.digest() {
        return Err(CarErrorKind::HashMismatch { cid: cid.to_buf() });
    }
    Ok(())
}

/// A CAR that was read: roots and blocks, borrowed from the input.
#[derive(Debug)]
pub struct Car<'a> {
    bytes: &'a [u8],
    reader: &'a CarReader,
}

impl<'a> Car<'a> {
    /// The CAR bytes.
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// The root CIDs from the header.
    pub fn roots(&self) -> impl ExactSizeIterator<Item = Cid<'a>> + '_ {
        let bytes = self.bytes;
        self.reader.roots.iter().map(move |&(off, len)| {
            let b = &bytes[off as usize..off as usize + len as usize];
            // Validated when the header was read.
            Cid::from_bytes(b).unwrap_or_else(|_| unreachable_cid(b))
        })
    }

    /// Number of blocks.
    pub fn len(&self) -> usize {
        self.reader.entries.len()
    }

    /// Whether there are no blocks.
    pub fn is_empty(&self) -> bool {
        self.reader.entries.is_empty()
    }

    fn block_at(&self, e: &Entry) -> Block<'a> {
        let cid_bytes = &self.bytes[e.cid_start as usize..e.cid_start as usize + e.cid_len as usize];
        let data = &self.bytes[e.data_start as usize..e.data_start as usize + e.data_len as usize];
        let cid = Cid::from_bytes(cid_bytes).unwrap_or_else(|_| unreachable_cid(cid_bytes));
        Block { cid, data, offset: e.data_start as usize }
    }

    /// The `i`th block in file order.
    pub fn block(&self, i: usize) -> Option<Block<'a>> {
        self.reader.entries.get(i).map(|e| self.block_at(e))
    }

    /// Every block, in file order.
    pub fn blocks(&self) -> impl ExactSizeIterator<Item = Block<'a>> + '_ {
        self.reader.entries.iter().map(move |e| self.block_at(e))
    }

    /// The data of the block with this CID, in O(1).
    #[inline]
    pub fn get(&self, cid: Cid<'_>) -> Option<&'a [u8]> {
        self.position(cid).and_then(|i| self.block(i)).map(|b| b.data)
    }

    /// The index (file order) of the first block with this CID, in O(1).
    #[inline]
    pub fn position(&self, cid: Cid<'_>) -> Option<usize> {
        let idx = self.reader.index.get(digest_key(cid.digest()))?;
        let e = &self.reader.entries[idx];
        let stored = &self.bytes[e.cid_start as usize..e.cid_start as usize + e.cid_len as usize];
        if stored == cid.as_bytes() {
            return Some(idx);
        }
        // Same digest prefix, different CID (another codec, or a crafted collision): scan.
        self.blocks().position(|b| b.cid == cid)
    }
}

/// The reader validated every CID it stored; reaching this would be a bug in this crate.
#[cold]
fn unreachable_cid(b: &[u8]) -> Cid<'_> {
    // Crash loud on our own corruption.
    panic!("riptide-car: stored CID bytes failed to re-parse: {b:02x?}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use riptide_cbor::{OwnedValue, DAG_CBOR};

    fn sample() -> (Vec<u8>, Vec<(CidBuf, Vec<u8>)>) {
        let blocks: Vec<(CidBuf, Vec<u8>)> = (0..5)
            .map(|i| {
                let data = OwnedValue::Int(i).to_cbor();
                (CidBuf::sha256(DAG_CBOR, &data), data)
            })
            .collect();
        let car = write_car(&[blocks[0].0], blocks.iter().map(|(c, d)| (c.as_cid(), d.as_slice())));
        (car, blocks)
    }

    #[test]
    fn round_trip_and_lookup() {
        let (car, blocks) = sample();
        let mut r = CarReader::new();
        let c = r.read(&car, &CarOptions::default()).unwrap();
        assert_eq!(c.len(), 5);
        assert_eq!(c.roots().next().unwrap(), blocks[0].0.as_cid());
        for (cid, data) in &blocks {
            assert_eq!(c.get(cid.as_cid()), Some(data.as_slice()));
        }
        let missing = CidBuf::sha256(DAG_CBOR, b"nope");
        assert_eq!(c.get(missing.as_cid()), None);
    }

    #[test]
    fn flipped_byte_is_a_hash_mismatch_naming_the_block() {
        let (mut car, blocks) = sample();
        let last = car.len() - 1;
        car[last] ^= 1;
        let mut r = CarReader::new();
        let e = r.read(&car, &CarOptions::default()).unwrap_err();
        assert_eq!(e.block(), Some(4));
        assert_eq!(e.kind(), &CarErrorKind::HashMismatch { cid: blocks[4].0 });
        // The opt-out reads it anyway.
        let opts = CarOptions { verify: false, ..CarOptions::default() };
        assert_eq!(r.read(&car, &opts).unwrap().len(), 5);
    }

    #[test]
    fn every_truncation_is_an_error_not_a_panic() {
        let (car, _) = sample();
        let mut r = CarReader::new();
        for cut in 0..car.len() {
            // A cut exactly at a section boundary is a valid, shorter CAR.
            let _ = r.read(&car[..cut], &CarOptions::default());
        }
        assert!(r.read(&car[..3], &CarOptions::default()).is_err());
    }

    #[test]
    fn limits() {
        let (car, _) = sample();
        let mut r = CarReader::new();
        let small = CarOptions { max_bytes: 10, ..CarOptions::default() };
        assert_eq!(r.read(&car, &small).unwrap_err().kind(), &CarErrorKind::TooLarge);
        let few = CarOptions { max_blocks: 2, ..CarOptions::default() };
        assert_eq!(r.read(&car, &few).unwrap_err().kind(), &CarErrorKind::TooManyBlocks);
        // A section that claims more bytes than remain.
        let mut bad = car.clone();
        let hdr_len = bad[0] as usize + 1;
        bad[hdr_len] = 0x7f;
        assert!(r.read(&bad, &CarOptions::default()).is_err());
    }
}
