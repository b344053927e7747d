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
        CarOptions {
            verify: true,
            max_bytes: 2 << 20,
            max_blocks: 10_000,
        }
    }
}

impl CarOptions {
    /// Options for a whole repository export: verification on, up to 4 GiB and 16M blocks.
    pub fn repository() -> CarOptions {
        CarOptions {
            verify: true,
            max_bytes: u32::MAX as usize,
            max_blocks: 16 << 20,
        }
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
        CarError {
            kind,
            offset,
            block,
        }
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

/// Where one block is, and enough of its CID to answer a lookup without touching the CAR bytes:
/// on a large repository every lookup of a record's CID is a cache miss, and a miss into the
/// 70 MB input to compare CID bytes cost as much as the miss into the index (profiled on a
/// 200,000-record repository: 22% of whole-repository verification went to these two lookups).
/// The CID is stored as its short prefix (version, codec, hash code and length) plus its 32-byte
/// digest; CIDs that do not fit (other digest lengths, long codec varints) are compared against the
/// input instead.
#[derive(Clone, Copy, Debug)]
struct Entry {
    digest: [u8; 32],
    cid_start: u32,
    data_len: u32,
    cid_len: u8,
    /// Length of `prefix` in use, or `0` when the CID does not fit this form.
    prefix_len: u8,
    prefix: [u8; PREFIX_MAX],
}

const PREFIX_MAX: usize = 6;

impl Entry {
    #[inline(always)]
    fn new(cid: Cid<'_>, cid_start: usize, data_len: usize) -> Entry {
        let bytes = cid.as_bytes();
        // Every atproto CID: a 4-byte prefix and a SHA-256 digest, copied as fixed-size arrays
        // (the general path below makes two `memcpy` calls per block).
        if let Ok(b) = <&[u8; 36]>::try_from(bytes) {
            if b[1] < 0x80 && b[2] < 0x80 && b[3] == 0x20 {
                let mut prefix = [0u8; PREFIX_MAX];
                prefix[..4].copy_from_slice(&b[..4]);
                let mut digest = [0u8; 32];
                digest.copy_from_slice(&b[4..]);
                return Entry {
                    digest,
                    cid_start: cid_start as u32,
                    data_len: data_len as u32,
                    cid_len: 36,
                    prefix_len: 4,
                    prefix,
                };
            }
        }
        let digest = cid.digest();
        let mut e = Entry {
            digest: [0; 32],
            cid_start: cid_start as u32,
            data_len: data_len as u32,
            cid_len: bytes.len() as u8,
            prefix_len: 0,
            prefix: [0; PREFIX_MAX],
        };
        e.digest = index_key(cid);
        let prefix_len = bytes.len() - digest.len();
        if digest.len() == 32 && prefix_len <= PREFIX_MAX {
            e.prefix[..prefix_len].copy_from_slice(&bytes[..prefix_len]);
            e.prefix_len = prefix_len as u8;
        }
        e
    }

    /// The table position: the first eight digest bytes (see [`index_key`]).
    #[inline]
    fn hash(&self) -> usize {
        hash_of(&self.digest)
    }

    #[inline]
    fn tag(&self) -> u32 {
        tag_of(&self.digest)
    }

    fn same_cid(&self, other: &Entry, car: &[u8]) -> bool {
        let (a, b) = (self.cid_start as usize, other.cid_start as usize);
        car[a..a + self.cid_len as usize] == car[b..b + other.cid_len as usize]
    }

    #[inline]
    fn data_start(&self) -> usize {
        self.cid_start as usize + self.cid_len as usize
    }

    /// Whether this entry's CID is `cid`; `car` is consulted only for CIDs of the uncommon forms.
    #[inline]
    fn is(&self, cid: Cid<'_>, car: &[u8]) -> bool {
        let bytes = cid.as_bytes();
        if self.prefix_len != 0 {
            let p = self.prefix_len as usize;
            // The digest as one fixed-size comparison, not a `memcmp` call (profiled).
            bytes.len() == p + 32
                && bytes[..p] == self.prefix[..p]
                && <&[u8; 32]>::try_from(&bytes[p..]).is_ok_and(|d| *d == self.digest)
        } else {
            let start = self.cid_start as usize;
            &car[start..start + self.cid_len as usize] == bytes
        }
    }
}

/// One index slot: four digest bytes as a tag, and the block index + 1 (0 is empty). Eight bytes,
/// eight slots to a cache line, so a probe is one miss.
#[derive(Clone, Copy, Debug, Default)]
struct Slot {
    tag: u32,
    block: u32,
}

/// The CID index: open addressing over digest bytes, which SHA-256 makes uniform, so the digest
/// is its own hash. Written by hand because a general hash map cost 13% of decoding a ten-block
/// firehose CAR (profiled); this one is cleared by refilling a table sized to the CAR. A tag
/// match is confirmed against the entry's full CID ([`Entry::is`]), so a crafted digest-prefix
/// collision costs a probe, never a wrong answer.
#[derive(Debug, Default)]
struct Index {
    slots: Vec<Slot>,
    mask: usize,
}

impl Index {
    fn reset(&mut self, expected: usize) {
        let size = (expected * 2).next_power_of_two().max(16);
        self.slots.clear();
        self.slots.resize(size, Slot::default());
        self.mask = size - 1;
    }

    /// Starts loading the slot a hash starts probing at, without waiting for it.
    #[inline]
    fn touch(&self, hash: usize) {
        if let Some(slot) = self.slots.get(hash & self.mask) {
            prefetch(std::ptr::from_ref(slot).cast());
        }
    }

    /// Starts loading the entry of the block a tag-matching home slot names, if any: reads the
    /// slot (which should have been [`Index::touch`]ed a while before) but not the entry.
    #[inline]
    fn touch_entry(&self, cid: Cid<'_>, entries: &[Entry]) {
        let key = index_key(cid);
        let Some(slot) = self.slots.get(hash_of(&key) & self.mask) else {
            return;
        };
        if slot.block != 0 && slot.tag == tag_of(&key) {
            if let Some(e) = entries.get(slot.block as usize - 1) {
                let p: *const u8 = std::ptr::from_ref(e).cast();
                prefetch(p);
                prefetch(p.wrapping_add(std::mem::size_of::<Entry>() - 1));
            }
        }
    }

    /// Inserts block `block` unless an earlier block has the same CID (the first one wins).
    #[inline]
    fn insert(&mut self, e: &Entry, block: u32, entries: &[Entry], car: &[u8]) {
        let tag = e.tag();
        let mut i = e.hash() & self.mask;
        loop {
            let slot = self.slots[i];
            if slot.block == 0 {
                self.slots[i] = Slot {
                    tag,
                    block: block + 1,
                };
                return;
            }
            if slot.tag == tag && entries[slot.block as usize - 1].same_cid(e, car) {
                return;
            }
            i = (i + 1) & self.mask;
        }
    }

    /// The first block whose CID is `cid`, if any.
    #[inline]
    fn find(&self, cid: Cid<'_>, entries: &[Entry], car: &[u8]) -> Option<usize> {
        if self.slots.is_empty() {
            return None;
        }
        let key = index_key(cid);
        let tag = tag_of(&key);
        let mut i = hash_of(&key) & self.mask;
        loop {
            let slot = self.slots[i];
            if slot.block == 0 {
                return None;
            }
            if slot.tag == tag {
                let b = slot.block as usize - 1;
                if entries[b].is(cid, car) {
                    return Some(b);
                }
            }
            i = (i + 1) & self.mask;
        }
    }
}

/// What a CID is indexed by: its 32-byte digest when it has one (SHA-256, uniform already), else
/// (other digest lengths, long codec varints: only seen with verification off) a hash of all its
/// bytes spread over 32 bytes, so that hostile input of uncommon CIDs cannot pile into one probe
/// sequence.
#[inline]
fn index_key(cid: Cid<'_>) -> [u8; 32] {
    let (bytes, digest) = (cid.as_bytes(), cid.digest());
    let mut key = [0u8; 32];
    if digest.len() == 32 && bytes.len() - 32 <= PREFIX_MAX {
        key.copy_from_slice(digest);
    } else {
        let d = Sha256::digest(bytes);
        key.copy_from_slice(&d);
    }
    key
}

/// The table position of a digest: its first eight bytes (uniform for SHA-256).
#[inline]
fn hash_of(digest: &[u8]) -> usize {
    let mut k = [0u8; 8];
    let n = digest.len().min(8);
    k[..n].copy_from_slice(&digest[..n]);
    u64::from_le_bytes(k) as usize
}

/// The slot tag of a digest: four bytes not used for the position.
#[inline]
fn tag_of(digest: &[u8]) -> u32 {
    let mut k = [0u8; 4];
    if digest.len() >= 12 {
        k.copy_from_slice(&digest[8..12]);
    }
    u32::from_le_bytes(k)
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
        f.debug_struct("CarReader")
            .field("blocks", &self.entries.len())
            .finish()
    }
}

impl CarReader {
    /// A reader with empty storage.
    pub fn new() -> CarReader {
        CarReader::default()
    }

    /// Reads a whole CAR: header, every block section, and (by default) each block's SHA-256.
    ///
    /// Blocks are hashed several at a time ([`riptide_sha::Checker`]: sixteen AVX-512 lanes for a
    /// large CAR, two SHA-NI lanes for a firehose commit's few blocks). Errors are still those of
    /// checking block by block: the first bad block in file order, before any later error.
    pub fn read<'a>(&'a mut self, bytes: &'a [u8], opts: &CarOptions) -> Result<Car<'a>, CarError> {
        self.entries.clear();
        self.roots.clear();
        if bytes.len() > opts.max_bytes || bytes.len() > u32::MAX as usize {
            return Err(CarError::new(CarErrorKind::TooLarge, 0, None));
        }
        let mut pending = riptide_sha::Checker::for_bytes(bytes.len());
        let read = self.read_sections(bytes, opts, &mut pending);
        // A block still held (or the one before a structural error) was earlier in the file.
        pending.finish().map_err(mismatch)?;
        read?;
        self.build_index(bytes);
        Ok(Car {
            bytes,
            reader: self,
        })
    }

    /// [`CarReader::read`] with verification, except that the SHA-256 checks are left to the
    /// caller: every block `read` would hash is appended to `unhashed` (file order), and nothing
    /// is hashed here. Errors are `read`'s structural ones (including an unsupported hash kind).
    ///
    /// Why: a firehose commit's ten blocks are too few to keep SHA-256 lanes busy; a caller that
    /// reads several frames' CARs first can hash all their blocks together
    /// ([`riptide_sha::Kernel::digests`]). The verdict is then exactly `read`'s when the caller
    /// applies this rule: if a block in `unhashed` does not match its CID, the first such block's
    /// [`Unhashed::mismatch`] is the error (even when this call returned a structural error, which
    /// only ever comes after the blocks it left); otherwise this call's result is.
    ///
    /// With `opts.verify` off this is `read` and nothing is appended.
    pub fn read_deferred<'a, 'b: 'a>(
        &'a mut self,
        bytes: &'b [u8],
        opts: &CarOptions,
        unhashed: &mut Vec<Unhashed<'b>>,
    ) -> Result<Car<'a>, CarError> {
        self.entries.clear();
        self.roots.clear();
        if bytes.len() > opts.max_bytes || bytes.len() > u32::MAX as usize {
            return Err(CarError::new(CarErrorKind::TooLarge, 0, None));
        }
        self.read_sections(bytes, opts, unhashed)?;
        self.build_index(bytes);
        Ok(Car {
            bytes,
            reader: self,
        })
    }

    /// The header and every section; SHA-256 checks go to `pending` (a [`riptide_sha::Checker`]
    /// reports a mismatch once the lane holding it is hashed, a few blocks later at most).
    fn read_sections<'a, S: HashSink<'a>>(
        &mut self,
        bytes: &'a [u8],
        opts: &CarOptions,
        pending: &mut S,
    ) -> Result<(), CarError> {
        let mut pos = self.read_header(bytes)?;
        // How far ahead of the parse the bytes are requested. The hardware streams a sequential
        // scan only within a 4 KiB page; asking a few pages ahead keeps section heads (the first
        // touch of every block) from waiting on memory. A small CAR (a firehose commit's) has
        // just arrived and is in cache already.
        let ahead = if bytes.len() >= 64 * 1024 { 8192 } else { 0 };
        let mut fetched = pos;
        while pos < bytes.len() {
            while fetched < pos + ahead && fetched < bytes.len() {
                prefetch(bytes[fetched..].as_ptr());
                fetched += 64;
            }
            let section_at = pos;
            let block_no = self.entries.len();
            if block_no >= opts.max_blocks {
                return Err(CarError::new(
                    CarErrorKind::TooManyBlocks,
                    pos,
                    Some(block_no),
                ));
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
                return Err(CarError::new(
                    CarErrorKind::BadSectionLength,
                    section_at,
                    Some(block_no),
                ));
            }
            let section = &bytes[pos..pos + len as usize];
            let (cid, cid_len) = Cid::read_prefix(section)
                .map_err(|_| CarError::new(CarErrorKind::BadCid, pos, Some(block_no)))?;
            let data = &section[cid_len..];
            if opts.verify {
                check_hash_kind(cid)
                    .map_err(|kind| CarError::new(kind, section_at, Some(block_no)))?;
                pending.push(Unhashed {
                    data,
                    cid,
                    section_at,
                    block_no,
                })?;
            }
            self.entries.push(Entry::new(cid, pos, data.len()));
            pos += len as usize;
        }
        Ok(())
    }

    /// Indexes every block once all are read, so the table is sized exactly (never regrown) and
    /// the random slot accesses can be overlapped: each insert first touches the slot of the
    /// block `LOOKAHEAD` places on, so on a large CAR the cache misses are in flight together
    /// instead of one after another (the insert miss was 11% of verifying a 200,000-record
    /// repository, profiled). The first block with a CID wins; repeats stay in file order,
    /// unindexed.
    fn build_index(&mut self, bytes: &[u8]) {
        const LOOKAHEAD: usize = 24;
        self.index.reset(self.entries.len());
        let n = self.entries.len();
        for i in 0..n {
            if let Some(ahead) = self.entries.get(i + LOOKAHEAD) {
                self.index.touch(ahead.hash());
            }
            let e = self.entries[i];
            self.index.insert(&e, i as u32, &self.entries, bytes);
        }
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
        if let Some(root) = atproto_header_root(&bytes[n..end]) {
            self.roots.push(((n + root) as u32, 36));
            return Ok(end);
        }
        self.read_header_cbor(bytes, n, end)?;
        Ok(end)
    }

    /// The header `bytes[n..end]` decoded as DAG-CBOR, its roots appended to `self.roots`: the
    /// general path for a header of any other form than [`atproto_header_root`]'s.
    fn read_header_cbor(&mut self, bytes: &[u8], n: usize, end: usize) -> Result<(), CarError> {
        let mut tape = self.arena.tape(bytes);
        let item = tape
            .decode(n..end, &Options::strict())
            .map_err(|e| CarError::new(CarErrorKind::HeaderCbor(e.kind()), e.offset(), None))?;
        let header = tape.value(item);
        if header.kind() != Kind::Map {
            return Err(CarError::new(CarErrorKind::BadHeader("not a map"), n, None));
        }
        if header.get("version").and_then(|v| v.as_i64()) != Some(1) {
            return Err(CarError::new(
                CarErrorKind::BadHeader("version is not 1"),
                n,
                None,
            ));
        }
        let roots = header
            .get("roots")
            .and_then(|r| r.array())
            .ok_or_else(|| CarError::new(CarErrorKind::BadHeader("no roots array"), n, None))?;
        for r in roots {
            let cid = r.as_link().ok_or_else(|| {
                CarError::new(CarErrorKind::BadHeader("root is not a CID"), n, None)
            })?;
            let off = cid.as_bytes().as_ptr() as usize - bytes.as_ptr() as usize;
            self.roots.push((off as u32, cid.as_bytes().len() as u8));
        }
        Ok(())
    }
}

/// Where the root CID starts in `header` when it is the header every atproto CAR carries,
/// `{"roots": [CID], "version": 1}` in canonical DAG-CBOR with one CIDv1 of a one-byte codec and
/// a SHA-256 digest; `None` for any other bytes. What the general path
/// ([`CarReader::read_header_cbor`]) reads from these bytes, without building a tape and looking
/// the two keys up: a firehose commit's CAR is ~4.6 KB, and that was ~8% of reading a frame
/// without its blocks (profiled, real capture, Zen 3).
fn atproto_header_root(header: &[u8]) -> Option<usize> {
    const HEAD: &[u8] = b"\xa2\x65roots\x81\xd8\x2a\x58\x25\x00";
    const TAIL: &[u8] = b"\x67version\x01";
    let cid = header.strip_prefix(HEAD)?.strip_suffix(TAIL)?;
    // The general path's check of tag 42's content, on the one length this form allows.
    (cid.len() == 36 && Cid::from_bytes(cid).is_ok()).then_some(HEAD.len())
}

/// Checks that `data` hashes to `cid`'s SHA-256 digest.
#[inline]
pub fn verify_block(cid: Cid<'_>, data: &[u8]) -> Result<(), CarErrorKind> {
    check_hash_kind(cid)?;
    let digest = Sha256::digest(data);
    if digest.as_slice() != cid.digest() {
        return Err(CarErrorKind::HashMismatch { cid: cid.to_buf() });
    }
    Ok(())
}

/// Only SHA-256 CIDs can be checked (and atproto uses no other).
#[inline]
fn check_hash_kind(cid: Cid<'_>) -> Result<(), CarErrorKind> {
    if cid.hash_code() != riptide_cbor::SHA2_256 || cid.digest().len() != 32 {
        return Err(CarErrorKind::UnsupportedHash(cid.hash_code()));
    }
    Ok(())
}

/// A block whose SHA-256 is still to be checked against its CID: see
/// [`CarReader::read_deferred`].
#[derive(Clone, Copy, Debug)]
pub struct Unhashed<'a> {
    /// The block's bytes (what is hashed).
    pub data: &'a [u8],
    /// Its CID (SHA-256, 32-byte digest: checked before the block was left unhashed).
    pub cid: Cid<'a>,
    /// Offset of its section in the CAR.
    pub section_at: usize,
    /// Its index among the CAR's blocks.
    pub block_no: usize,
}

impl<'a> Unhashed<'a> {
    /// The digest the block must hash to.
    #[inline]
    pub fn expected(&self) -> &'a [u8] {
        self.cid.digest()
    }

    /// The error [`CarReader::read`] gives for this block when its hash does not match.
    #[cold]
    pub fn mismatch(&self) -> CarError {
        mismatch((self.section_at, self.block_no, self.cid))
    }
}

/// Where the reader sends each block to be hashed: a checker that hashes as it goes, or a list
/// the caller hashes later.
trait HashSink<'a> {
    fn push(&mut self, block: Unhashed<'a>) -> Result<(), CarError>;
}

impl<'a> HashSink<'a> for riptide_sha::Checker<'a, (usize, usize, Cid<'a>)> {
    #[inline]
    fn push(&mut self, b: Unhashed<'a>) -> Result<(), CarError> {
        riptide_sha::Checker::push(
            self,
            b.data,
            b.cid.digest(),
            (b.section_at, b.block_no, b.cid),
        )
        .map_err(mismatch)
    }
}

impl<'a> HashSink<'a> for Vec<Unhashed<'a>> {
    #[inline]
    fn push(&mut self, b: Unhashed<'a>) -> Result<(), CarError> {
        Vec::push(self, b);
        Ok(())
    }
}

/// The error for a block whose SHA-256 is not its CID's digest.
#[cold]
fn mismatch((section_at, block_no, cid): (usize, usize, Cid<'_>)) -> CarError {
    CarError::new(
        CarErrorKind::HashMismatch { cid: cid.to_buf() },
        section_at,
        Some(block_no),
    )
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

    fn data_at(&self, e: &Entry) -> &'a [u8] {
        &self.bytes[e.data_start()..e.data_start() + e.data_len as usize]
    }

    fn block_at(&self, e: &Entry) -> Block<'a> {
        let cid_bytes = &self.bytes[e.cid_start as usize..e.data_start()];
        let cid = Cid::from_bytes(cid_bytes).unwrap_or_else(|_| unreachable_cid(cid_bytes));
        Block {
            cid,
            data: self.data_at(e),
            offset: e.data_start(),
        }
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
        // The data only: the found block's CID is not re-parsed.
        let i = self.position(cid)?;
        self.reader.entries.get(i).map(|e| self.data_at(e))
    }

    /// Starts loading the index slot of `cid` without waiting for it: call it for the CIDs you
    /// are about to look up (say, every entry of an MST node) so their cache misses overlap.
    #[inline]
    pub fn touch(&self, cid: Cid<'_>) {
        self.reader.index.touch(hash_of(&index_key(cid)));
    }

    /// Starts loading the index entry that a lookup of `cid` will compare with, without
    /// waiting for it (it reads the CID's home slot, so [`Car::touch`] that a while before).
    /// Why: a lookup is two dependent cache misses, slot then entry; a caller that knows its
    /// CIDs several lookups ahead (records checked in a pipeline) overlaps both.
    #[inline]
    pub fn touch_entry(&self, cid: Cid<'_>) {
        self.reader.index.touch_entry(cid, &self.reader.entries);
    }

    /// Starts loading the first bytes of the block with this CID (looking it up waits for the
    /// index, so [`Car::touch`] it first): call it for blocks you will decode soon.
    #[inline]
    pub fn touch_data(&self, cid: Cid<'_>) {
        if let Some(e) = self.position(cid).and_then(|i| self.reader.entries.get(i)) {
            touch_bytes(self.data_at(e));
        }
    }

    /// Whether block `i` (file order) has the CID `cid`: one look at that block's index entry,
    /// no table probe. Why: a caller that expects a CID at a known place (the block after the
    /// last one it found, when a CAR lists its records in the order they are visited) confirms
    /// it with one access to memory next to the previous one, where [`Car::position`] starts
    /// with a random access into the table; it falls back to `position` when this says no.
    #[inline]
    pub fn is_block(&self, i: usize, cid: Cid<'_>) -> bool {
        self.reader
            .entries
            .get(i)
            .is_some_and(|e| e.is(cid, self.bytes))
    }

    /// The index (file order) of the first block with this CID, in O(1).
    #[inline]
    pub fn position(&self, cid: Cid<'_>) -> Option<usize> {
        self.reader
            .index
            .find(cid, &self.reader.entries, self.bytes)
    }
}

/// Starts loading the first bytes of `data` (a block about to be read) without waiting: every
/// cache line of its first 4 KiB (MST nodes are rarely longer).
#[inline]
pub fn touch_bytes(data: &[u8]) {
    for line in data.chunks(64).take(64) {
        prefetch(line.as_ptr());
    }
}

/// A hint to the CPU to start loading the cache line at `p` (x86-64: `prefetcht0`; elsewhere
/// nothing). Lookups into a large CAR miss the cache one after another; started early, the
/// misses overlap (profiled: index probes and first node bytes were most of an MST walk).
#[inline(always)]
#[allow(unsafe_code)]
fn prefetch(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch never dereferences its address (any value is allowed, faults are
    // suppressed) and SSE, the feature it needs, is part of the x86-64 baseline.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
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
        let car = write_car(
            &[blocks[0].0],
            blocks.iter().map(|(c, d)| (c.as_cid(), d.as_slice())),
        );
        (car, blocks)
    }

    /// The general path's roots for a header (the header alone as the input).
    fn roots_by_cbor(header: &[u8]) -> Result<Vec<(u32, u8)>, CarError> {
        let mut reader = CarReader::new();
        reader.read_header_cbor(header, 0, header.len())?;
        Ok(reader.roots)
    }

    #[test]
    fn atproto_headers_read_as_the_general_path_reads_them() {
        // Every CAR header of the real capture (found by its length, 58, and first bytes) and of
        // the real repository takes the short path and gets the general path's root.
        let mut headers: Vec<Vec<u8>> = Vec::new();
        for name in [
            "jetstream-2026-07/firehose-frames.bin",
            "jetstream-2026-07/repo.car",
        ] {
            let Some(file) = riptide_testdata::read(name) else {
                return;
            };
            for (i, w) in file.windows(9).enumerate() {
                if w == b"\x3a\xa2\x65roots\x81" {
                    headers.push(file[i + 1..i + 59].to_vec());
                }
            }
        }
        // One per commit of the capture (its manifest says how many) and the repository's.
        let manifest: serde_json::Value = serde_json::from_slice(
            &riptide_testdata::read("jetstream-2026-07/manifest.json").unwrap(),
        )
        .unwrap();
        let commits = manifest["commit_frames"].as_u64().unwrap() as usize;
        assert_eq!(headers.len(), commits + 1);
        for h in &headers {
            assert_eq!(atproto_header_root(h), Some(13));
            assert_eq!(roots_by_cbor(h).unwrap(), vec![(13, 36)]);
        }
        // Every one-byte change and every cut of a real header: whenever the short path takes
        // the bytes, the general path reads the same root from them.
        let (mut taken, mut refused) = (0, 0);
        let h = &headers[0];
        let mut variants: Vec<Vec<u8>> = (0..h.len()).map(|i| h[..i].to_vec()).collect();
        for i in 0..h.len() {
            for v in 0..=255u8 {
                let mut m = h.clone();
                m[i] = v;
                variants.push(m);
            }
        }
        for m in &variants {
            match atproto_header_root(m) {
                Some(at) => {
                    taken += 1;
                    assert_eq!(roots_by_cbor(m).unwrap(), vec![(at as u32, 36)], "{m:02x?}");
                }
                None => refused += 1,
            }
        }
        // Changes inside the digest keep the form; changes to the frame or a cut do not.
        assert!(
            taken > 32 * 255 && refused > 20 * 255,
            "{taken} taken, {refused} refused"
        );
        // A header in another form (two roots) still reads through the general path.
        let (_, blocks) = sample();
        let two = write_car(
            &[blocks[0].0, blocks[1].0],
            blocks.iter().map(|(c, d)| (c.as_cid(), d.as_slice())),
        );
        let mut reader = CarReader::new();
        let read = reader.read(&two, &CarOptions::default()).unwrap();
        assert_eq!(read.roots().count(), 2);
    }

    #[test]
    fn lookups_survive_growth_duplicates_and_shared_digests() {
        // Enough blocks to grow the index several times; one CID repeated (the first wins); one
        // digest under two codecs (different CIDs, both found).
        let mut blocks: Vec<(CidBuf, Vec<u8>)> = (0..3000)
            .map(|i| {
                let data = OwnedValue::Int(i).to_cbor();
                (CidBuf::sha256(DAG_CBOR, &data), data)
            })
            .collect();
        let raw = CidBuf::sha256(riptide_cbor::RAW, &blocks[7].1);
        assert_ne!(raw, blocks[7].0);
        blocks.push((raw, blocks[7].1.clone()));
        blocks.push(blocks[11].clone());
        let car = write_car(
            &[blocks[0].0],
            blocks.iter().map(|(c, d)| (c.as_cid(), d.as_slice())),
        );
        let mut r = CarReader::new();
        let c = r.read(&car, &CarOptions::default()).unwrap();
        assert_eq!(c.len(), 3002);
        for (i, (cid, data)) in blocks.iter().enumerate().take(3001) {
            assert_eq!(c.position(cid.as_cid()), Some(i), "block {i}");
            assert_eq!(c.get(cid.as_cid()), Some(data.as_slice()));
        }
        assert_eq!(c.position(blocks[3001].0.as_cid()), Some(11));
        // `is_block` agrees with `position` at every place, and says no everywhere else (the
        // raw CID and its dag-cbor twin share a digest but are different CIDs).
        for (i, (cid, _)) in blocks.iter().enumerate().take(3001) {
            assert!(c.is_block(i, cid.as_cid()), "block {i}");
            assert!(!c.is_block(i + 1, cid.as_cid()), "block {i} + 1");
        }
        assert!(c.is_block(3000, raw.as_cid()) && !c.is_block(7, raw.as_cid()));
        assert!(
            c.is_block(3001, blocks[11].0.as_cid()),
            "a repeated CID is at both places"
        );
        assert!(!c.is_block(3002, blocks[0].0.as_cid()), "past the end");
        let absent = CidBuf::sha256(DAG_CBOR, b"not a block of this CAR");
        assert_eq!(c.position(absent.as_cid()), None);
    }

    #[test]
    fn uncommon_cids_are_indexed_when_verification_is_off() {
        // Identity-hash CIDs (digest = the data, any length) and a SHA-256 CID: all found.
        let ids: Vec<(CidBuf, Vec<u8>)> = (0u8..40)
            .map(|i| {
                let data = vec![i; usize::from(i % 7) + 1];
                let mut cid = vec![0x01, 0x71, 0x00, data.len() as u8];
                cid.extend_from_slice(&data);
                (CidBuf::from_bytes(&cid).unwrap(), data)
            })
            .chain(std::iter::once({
                let data = OwnedValue::Int(5).to_cbor();
                (CidBuf::sha256(DAG_CBOR, &data), data)
            }))
            .collect();
        let car = write_car(
            &[ids[0].0],
            ids.iter().map(|(c, d)| (c.as_cid(), d.as_slice())),
        );
        let mut r = CarReader::new();
        let opts = CarOptions {
            verify: false,
            ..CarOptions::default()
        };
        let c = r.read(&car, &opts).unwrap();
        for (i, (cid, _)) in ids.iter().enumerate() {
            assert_eq!(c.position(cid.as_cid()), Some(i));
        }
        // With verification on, the identity hash is refused, as atproto requires SHA-256.
        assert!(CarReader::new().read(&car, &CarOptions::default()).is_err());
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
    fn touching_entries_is_only_a_hint() {
        // Present CIDs, an absent one, and a CAR with no blocks: no panic, lookups unchanged.
        let (car, blocks) = sample();
        let mut r = CarReader::new();
        let c = r.read(&car, &CarOptions::default()).unwrap();
        let absent = CidBuf::sha256(DAG_CBOR, b"not in the car");
        for (cid, _) in &blocks {
            c.touch(cid.as_cid());
            c.touch_entry(cid.as_cid());
        }
        c.touch_entry(absent.as_cid());
        for (i, (cid, data)) in blocks.iter().enumerate() {
            assert_eq!(c.position(cid.as_cid()), Some(i));
            assert_eq!(c.get(cid.as_cid()), Some(data.as_slice()));
        }
        assert_eq!(c.position(absent.as_cid()), None);
        let empty = write_car(&[absent], std::iter::empty());
        let mut r = CarReader::new();
        let c = r.read(&empty, &CarOptions::default()).unwrap();
        c.touch_entry(absent.as_cid());
        assert_eq!(c.position(absent.as_cid()), None);
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
        let opts = CarOptions {
            verify: false,
            ..CarOptions::default()
        };
        assert_eq!(r.read(&car, &opts).unwrap().len(), 5);
    }

    #[test]
    fn hashing_in_pairs_keeps_file_order_of_errors() {
        // Blocks are hashed two at a time; whatever the pairing, the first bad block in the file
        // is the one reported, also when a later section is malformed.
        let (car, blocks) = sample();
        let mut r = CarReader::new();
        let clean = r.read(&car, &CarOptions::default()).unwrap();
        let spans: Vec<(usize, usize)> = clean.blocks().map(|b| (b.offset, b.data.len())).collect();
        for first in 0..blocks.len() {
            for second in first..blocks.len() {
                let mut bad = car.clone();
                bad[spans[first].0] ^= 1;
                bad[spans[second].0 + spans[second].1 - 1] ^= 2;
                let e = r.read(&bad, &CarOptions::default()).unwrap_err();
                assert_eq!(e.block(), Some(first), "{first} {second}");
                assert_eq!(
                    e.kind(),
                    &CarErrorKind::HashMismatch {
                        cid: blocks[first].0
                    }
                );
            }
            // A tampered block, then a truncated CAR: the tampered block comes first.
            if first + 1 < blocks.len() {
                let mut bad = car[..spans[first].0 + spans[first].1 + 1].to_vec();
                bad[spans[first].0] ^= 1;
                let e = r.read(&bad, &CarOptions::default()).unwrap_err();
                assert_eq!(e.block(), Some(first));
                assert!(e.is_hash_mismatch(), "{first}: {e:?}");
            }
        }
    }

    #[test]
    fn hashing_in_lanes_keeps_file_order_of_errors() {
        // A CAR large enough for sixteen-lane hashing (where the CPU has it), blocks of many
        // lengths so lanes finish out of order: the first bad block in the file is reported.
        let blocks: Vec<(CidBuf, Vec<u8>)> = (0..400usize)
            .map(|i| {
                let data = OwnedValue::Bytes(vec![i as u8; (i * 131) % 1500]).to_cbor();
                (CidBuf::sha256(DAG_CBOR, &data), data)
            })
            .collect();
        let car = write_car(
            &[blocks[0].0],
            blocks.iter().map(|(c, d)| (c.as_cid(), d.as_slice())),
        );
        assert!(car.len() >= riptide_sha::LANES_MIN_BYTES, "{}", car.len());
        let mut r = CarReader::new();
        let clean = r.read(&car, &CarOptions::default()).unwrap();
        assert_eq!(clean.len(), blocks.len());
        let spans: Vec<(usize, usize)> = clean.blocks().map(|b| (b.offset, b.data.len())).collect();
        for (first, second) in [(0, 0), (3, 2), (17, 1), (100, 99), (250, 399), (399, 399)] {
            let mut bad = car.clone();
            bad[spans[first].0] ^= 1;
            bad[spans[second].0 + spans[second].1 - 1] ^= 2;
            let e = r.read(&bad, &CarOptions::default()).unwrap_err();
            let want = first.min(second);
            assert_eq!(e.block(), Some(want), "{first} {second}");
            assert_eq!(
                e.kind(),
                &CarErrorKind::HashMismatch {
                    cid: blocks[want].0
                }
            );
        }
        // A tampered block, then a truncated CAR: the tampered block comes first.
        let mut bad = car[..spans[300].0 + 5].to_vec();
        bad[spans[290].0] ^= 1;
        let e = r.read(&bad, &CarOptions::default()).unwrap_err();
        assert_eq!(e.block(), Some(290));
        assert!(e.is_hash_mismatch(), "{e:?}");
    }

    /// `read_deferred`, then the caller's rule: the first unhashed block that does not match
    /// wins; the block count or the error.
    fn deferred_verdict(
        r: &mut CarReader,
        car: &[u8],
        opts: &CarOptions,
    ) -> Result<usize, CarError> {
        let mut unhashed = Vec::new();
        let res = r.read_deferred(car, opts, &mut unhashed).map(|c| c.len());
        let msgs: Vec<&[u8]> = unhashed.iter().map(|u| u.data).collect();
        let mut digests = Vec::new();
        riptide_sha::Kernel::Sha2.digests(&msgs, &mut digests);
        if let Some((u, _)) = unhashed
            .iter()
            .zip(&digests)
            .find(|(u, d)| d[..] != *u.expected())
        {
            return Err(u.mismatch());
        }
        if !opts.verify {
            assert!(unhashed.is_empty());
        }
        res
    }

    #[test]
    fn deferred_hashing_gives_the_verdict_of_read() {
        // Every single-byte flip, every truncation and every flip of a truncated CAR, with and
        // without verification: `read` and `read_deferred` + the caller's rule agree.
        let (car, _) = sample();
        let mut r = CarReader::new();
        let mut cases: Vec<Vec<u8>> = vec![car.clone()];
        for i in 0..car.len() {
            for bit in [1u8, 0x80] {
                let mut bad = car.clone();
                bad[i] ^= bit;
                cases.push(bad.clone());
                bad.truncate(car.len() - 3);
                cases.push(bad);
            }
            cases.push(car[..i].to_vec());
        }
        let (mut mismatches, mut structural) = (0, 0);
        for c in &cases {
            for verify in [true, false] {
                let opts = CarOptions {
                    verify,
                    ..CarOptions::default()
                };
                let want = r.read(c, &opts).map(|c| c.len());
                let got = deferred_verdict(&mut r, c, &opts);
                assert_eq!(got, want, "{c:?}");
                match want {
                    Err(e) if e.is_hash_mismatch() => mismatches += 1,
                    Err(_) => structural += 1,
                    Ok(_) => {}
                }
            }
        }
        assert!(
            mismatches > 50 && structural > 50,
            "{mismatches} {structural}"
        );
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
        let small = CarOptions {
            max_bytes: 10,
            ..CarOptions::default()
        };
        assert_eq!(
            r.read(&car, &small).unwrap_err().kind(),
            &CarErrorKind::TooLarge
        );
        let few = CarOptions {
            max_blocks: 2,
            ..CarOptions::default()
        };
        assert_eq!(
            r.read(&car, &few).unwrap_err().kind(),
            &CarErrorKind::TooManyBlocks
        );
        // A section that claims more bytes than remain.
        let mut bad = car.clone();
        let hdr_len = bad[0] as usize + 1;
        bad[hdr_len] = 0x7f;
        assert!(r.read(&bad, &CarOptions::default()).is_err());
    }
}
