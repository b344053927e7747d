//! The 256-byte fixed header at offset 0 of a sealed segment.
//!
//! Why a module: the header is what a server reads to answer `listSegments`, set an `ETag` and
//! serve `getBlock` without touching the rest of the file, and its checksum is what a client
//! checks a download against. Layout (Jetstream `segment/header.go`), little-endian:
//!
//! ```text
//!   0  magic "jss0"          4  u64 checksum          12  u16 version (1)
//!  14  u32 block_count      18  u32 event_count       22  u32 unique_did_count
//!  26  u64 min_seq          34  u64 max_seq           42  i64 min_witnessed_at
//!  50  i64 max_witnessed_at 58  u64 footer_offset     66  u64 did_bloom_offset
//!  74  u64 block_did_bloom_offset  82  u64 collection_index_offset  90  u64 block_index_offset
//!  98..256 zero
//! ```
//!
//! The checksum is XXH3-64 (seed 0) over header[12..256] followed by the whole footer
//! (footer_offset to the end of the file). It does not cover the blocks: each block's zstd frame
//! carries its own content checksum. A zero checksum marks an active (unsealed) file.

use crate::error::{Error, Result};

/// Bytes reserved for the header; the first block starts here.
pub const HEADER_BYTES: usize = 256;
/// The magic at offset 0.
pub const MAGIC: [u8; 4] = *b"jss0";
/// The only version there is.
pub const VERSION: u16 = 1;

/// The parsed header. Offsets are absolute file offsets; times are unix microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[allow(missing_docs)]
pub struct Header {
    pub checksum: u64,
    pub version: u16,
    pub block_count: u32,
    pub event_count: u32,
    pub unique_did_count: u32,
    pub min_seq: u64,
    pub max_seq: u64,
    pub min_witnessed_at: i64,
    pub max_witnessed_at: i64,
    pub footer_offset: u64,
    pub did_bloom_offset: u64,
    pub block_did_bloom_offset: u64,
    pub collection_index_offset: u64,
    pub block_index_offset: u64,
}

fn u16_at(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([b[o], b[o + 1]])
}
pub(crate) fn u32_at(b: &[u8], o: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[o..o + 4]);
    u32::from_le_bytes(a)
}
pub(crate) fn u64_at(b: &[u8], o: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[o..o + 8]);
    u64::from_le_bytes(a)
}

/// The seq and time bounds as the header and each block index entry store them, 32 bytes from
/// `o`: min seq, max seq, min and max `witnessed_at` (Unix µs, two's complement), each a
/// little-endian `u64`. One reader, so the two tables cannot come to disagree on the layout.
pub(crate) fn bounds_at(b: &[u8], o: usize) -> (u64, u64, i64, i64) {
    (
        u64_at(b, o),
        u64_at(b, o + 8),
        u64_at(b, o + 16) as i64,
        u64_at(b, o + 24) as i64,
    )
}

impl Header {
    /// Parses and checks magic, sealed state and version (not the checksum: that needs the footer).
    pub fn parse(file: &[u8]) -> Result<Header> {
        if file.len() < HEADER_BYTES {
            return Err(Error::ShortFile { len: file.len() });
        }
        let b = &file[..HEADER_BYTES];
        if b[..4] != MAGIC {
            return Err(Error::BadMagic {
                found: [b[0], b[1], b[2], b[3]],
            });
        }
        let checksum = u64_at(b, 4);
        if checksum == 0 {
            return Err(Error::Active);
        }
        let version = u16_at(b, 12);
        if version != VERSION {
            return Err(Error::Version(version));
        }
        let (min_seq, max_seq, min_witnessed_at, max_witnessed_at) = bounds_at(b, 26);
        Ok(Header {
            checksum,
            version,
            block_count: u32_at(b, 14),
            event_count: u32_at(b, 18),
            unique_did_count: u32_at(b, 22),
            min_seq,
            max_seq,
            min_witnessed_at,
            max_witnessed_at,
            footer_offset: u64_at(b, 58),
            did_bloom_offset: u64_at(b, 66),
            block_did_bloom_offset: u64_at(b, 74),
            collection_index_offset: u64_at(b, 82),
            block_index_offset: u64_at(b, 90),
        })
    }

    /// The 256 bytes, with `self.checksum` at offset 4.
    pub fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut b = [0u8; HEADER_BYTES];
        b[..4].copy_from_slice(&MAGIC);
        b[4..12].copy_from_slice(&self.checksum.to_le_bytes());
        b[12..14].copy_from_slice(&self.version.to_le_bytes());
        b[14..18].copy_from_slice(&self.block_count.to_le_bytes());
        b[18..22].copy_from_slice(&self.event_count.to_le_bytes());
        b[22..26].copy_from_slice(&self.unique_did_count.to_le_bytes());
        for (o, v) in [
            (26, self.min_seq),
            (34, self.max_seq),
            (42, self.min_witnessed_at as u64),
            (50, self.max_witnessed_at as u64),
            (58, self.footer_offset),
            (66, self.did_bloom_offset),
            (74, self.block_did_bloom_offset),
            (82, self.collection_index_offset),
            (90, self.block_index_offset),
        ] {
            b[o..o + 8].copy_from_slice(&v.to_le_bytes());
        }
        b
    }
}

/// XXH3-64 over header[12..256] and the footer: the segment's checksum and `ETag`.
pub fn checksum(header: &[u8; HEADER_BYTES], footer: &[u8]) -> u64 {
    let mut h = xxhash_rust::xxh3::Xxh3Default::new();
    h.update(&header[12..]);
    h.update(footer);
    h.digest()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encode_parse_round_trip_and_field_offsets() {
        let h = Header {
            checksum: 0x1122_3344_5566_7788,
            version: 1,
            block_count: 3,
            event_count: 23,
            unique_did_count: 1,
            min_seq: 1,
            max_seq: 23,
            min_witnessed_at: -5,
            max_witnessed_at: 9,
            footer_offset: 300,
            did_bloom_offset: 456,
            block_did_bloom_offset: 500,
            collection_index_offset: 600,
            block_index_offset: 300,
        };
        let b = h.encode();
        assert_eq!(Header::parse(&b).unwrap(), h);
        assert_eq!(&b[0..4], b"jss0");
        assert_eq!(b[14], 3);
        assert_eq!(&b[42..50], &(-5i64).to_le_bytes());
        assert!(b[98..].iter().all(|&x| x == 0));
    }

    #[test]
    fn bounds_are_four_little_endian_words_from_the_offset() {
        // Written by hand, byte by byte, at an odd offset (the block index's is 20).
        let mut b = vec![0xAAu8; 3];
        b.extend_from_slice(&[0x01, 0x02, 0, 0, 0, 0, 0, 0]); // 0x0201
        b.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]); // u64::MAX
        b.extend_from_slice(&[0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]); // -2
        b.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0x80]); // i64::MIN
        b.push(0xAA);
        assert_eq!(bounds_at(&b, 3), (0x0201, u64::MAX, -2, i64::MIN));
    }

    #[test]
    fn bad_headers_are_typed() {
        let mut b = Header {
            checksum: 1,
            version: 1,
            ..Header::default()
        }
        .encode();
        assert_eq!(Header::parse(&b[..255]), Err(Error::ShortFile { len: 255 }));
        b[12] = 2;
        assert_eq!(Header::parse(&b), Err(Error::Version(2)));
        b[4] = 0;
        assert_eq!(Header::parse(&b), Err(Error::Active));
        b[0] = b'J';
        assert!(matches!(Header::parse(&b), Err(Error::BadMagic { .. })));
    }

    #[test]
    fn checksum_skips_magic_and_checksum_field() {
        let mut a = [0u8; HEADER_BYTES];
        let before = checksum(&a, b"footer");
        a[..12].copy_from_slice(b"jss0xxxxxxxx");
        assert_eq!(checksum(&a, b"footer"), before);
        a[12] = 1;
        assert_ne!(checksum(&a, b"footer"), before);
        assert_eq!(
            before,
            xxhash_rust::xxh3::xxh3_64(&[&[0u8; 244][..], b"footer"].concat())
        );
    }
}
