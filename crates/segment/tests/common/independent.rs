//! A second `.jss` decoder, written from the format's description (Jetstream `docs/README.md`
//! §3 and the corpus README), sharing no code with the crate: a sequential cursor instead of
//! offset arithmetic, rows decoded column by column into owned values, its own bloom test. The
//! golden tests decode every file with both and require the same answers, so a mistake that the
//! writer and the reader share (the symmetric bug a round trip cannot see) shows up here.

#![allow(dead_code)]

use std::io::Read;

/// A cursor that yields `None` past the end instead of reading out of bounds.
pub struct Cur<'a> {
    pub b: &'a [u8],
    pub at: usize,
}

impl<'a> Cur<'a> {
    pub fn new(b: &'a [u8]) -> Self {
        Cur { b, at: 0 }
    }
    pub fn bytes(&mut self, n: usize) -> Option<&'a [u8]> {
        let s = self.b.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(s)
    }
    pub fn le(&mut self, n: usize) -> Option<u64> {
        let s = self.bytes(n)?;
        Some(
            s.iter()
                .rev()
                .fold(0u64, |acc, &x| (acc << 8) | u64::from(x)),
        )
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IRow {
    pub seq: u64,
    pub witnessed: i64,
    pub indexed: i64,
    pub kind: u8,
    pub collection: Vec<u8>,
    pub did: Vec<u8>,
    pub rkey: Vec<u8>,
    pub rev: Vec<u8>,
    pub payload: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IBlock {
    pub offset: u64,
    pub csize: u64,
    pub usize_: u64,
    pub count: u64,
    pub seq: (u64, u64),
    pub time: (i64, i64),
    pub rows: Vec<IRow>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IFile {
    pub checksum_ok: bool,
    pub stored_checksum: u64,
    /// block_count, event_count, unique_did_count
    pub counts: (u64, u64, u64),
    pub seq: (u64, u64),
    pub time: (i64, i64),
    /// footer, did bloom, block blooms, collections, block index
    pub offsets: [u64; 5],
    pub blocks: Vec<IBlock>,
    pub seg_bloom: Vec<u8>,
    pub block_bloom_size: u64,
    pub block_blooms: Vec<Vec<u8>>,
    pub collections: Vec<(String, u64)>,
    /// per block, the collection names whose bit is set
    pub block_collections: Vec<Vec<String>>,
    pub collection_body: Vec<u8>,
}

pub fn unzstd(frame: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    zstd::stream::read::Decoder::new(frame)
        .ok()?
        .read_to_end(&mut out)
        .ok()?;
    Some(out)
}

pub fn block_rows(body: &[u8]) -> Option<Vec<IRow>> {
    let mut c = Cur::new(body);
    let n = c.le(4)? as usize;
    let mut col = |w: usize| -> Option<Vec<u64>> { (0..n).map(|_| c.le(w)).collect() };
    let seq = col(8)?;
    let wit = col(8)?;
    let idx = col(8)?;
    let kind = col(1)?;
    let cl = col(1)?;
    let dl = col(2)?;
    let kl = col(1)?;
    let vl = col(1)?;
    let pl = col(4)?;
    let mut blob = |lens: &[u64]| -> Option<Vec<Vec<u8>>> {
        lens.iter()
            .map(|&l| c.bytes(l as usize).map(<[u8]>::to_vec))
            .collect()
    };
    let coll = blob(&cl)?;
    let did = blob(&dl)?;
    let rkey = blob(&kl)?;
    let rev = blob(&vl)?;
    let pay = blob(&pl)?;
    if c.at != body.len() {
        return None;
    }
    Some(
        (0..n)
            .map(|i| IRow {
                seq: seq[i],
                witnessed: wit[i] as i64,
                indexed: idx[i] as i64,
                kind: kind[i] as u8,
                collection: coll[i].clone(),
                did: did[i].clone(),
                rkey: rkey[i].clone(),
                rev: rev[i].clone(),
                payload: pay[i].clone(),
            })
            .collect(),
    )
}

pub fn decode(file: &[u8]) -> Option<IFile> {
    let mut h = Cur::new(file);
    if h.bytes(4)? != b"jss0" {
        return None;
    }
    let stored_checksum = h.le(8)?;
    if h.le(2)? != 1 {
        return None;
    }
    let counts = (h.le(4)?, h.le(4)?, h.le(4)?);
    let seq = (h.le(8)?, h.le(8)?);
    let time = (h.le(8)? as i64, h.le(8)? as i64);
    let offsets = [h.le(8)?, h.le(8)?, h.le(8)?, h.le(8)?, h.le(8)?];
    let [footer, did_bloom, block_blooms, collections, block_index] = offsets;

    let mut hasher = xxhash_rust::xxh3::Xxh3::new();
    hasher.update(file.get(12..256)?);
    hasher.update(file.get(footer as usize..)?);
    let checksum_ok = hasher.digest() == stored_checksum;

    let mut ix = Cur::new(file.get(block_index as usize..did_bloom as usize)?);
    let mut blocks = Vec::new();
    for _ in 0..counts.0 {
        let offset = ix.le(8)?;
        let csize = ix.le(4)?;
        let usize_ = ix.le(4)?;
        let count = ix.le(4)?;
        let seq = (ix.le(8)?, ix.le(8)?);
        let time = (ix.le(8)? as i64, ix.le(8)? as i64);
        let mut f = Cur::new(file);
        f.at = offset as usize;
        if f.le(8)? != csize {
            return None;
        }
        let body = unzstd(f.bytes(csize as usize)?)?;
        if body.len() as u64 != usize_ {
            return None;
        }
        let rows = block_rows(&body)?;
        blocks.push(IBlock {
            offset,
            csize,
            usize_,
            count,
            seq,
            time,
            rows,
        });
    }
    let seg_bloom = file
        .get(did_bloom as usize..block_blooms as usize)?
        .to_vec();
    let mut r = Cur::new(file.get(block_blooms as usize..collections as usize)?);
    let n = r.le(4)?;
    let block_bloom_size = r.le(4)?;
    let block_blooms_v = (0..n)
        .map(|_| r.bytes(block_bloom_size as usize).map(<[u8]>::to_vec))
        .collect::<Option<Vec<_>>>()?;

    let mut ci = Cur::new(file.get(collections as usize..)?);
    let ncoll = ci.le(4)?;
    let nblocks = ci.le(4)?;
    let mask = ci.le(4)?;
    let size = ci.le(4)?;
    let collection_body = unzstd(ci.bytes(file.len() - collections as usize - 16)?)?;
    if collection_body.len() as u64 != size || nblocks != counts.0 {
        return None;
    }
    let mut cb = Cur::new(&collection_body);
    let mut colls = Vec::new();
    for _ in 0..ncoll {
        let len = cb.le(1)? as usize;
        let cnt = cb.le(4)?;
        colls.push((String::from_utf8(cb.bytes(len)?.to_vec()).ok()?, cnt));
    }
    let mut block_collections = Vec::new();
    for _ in 0..nblocks {
        let m = cb.bytes(mask as usize)?;
        block_collections.push(
            colls
                .iter()
                .enumerate()
                .filter(|(i, _)| m[i / 8] >> (i % 8) & 1 == 1)
                .map(|(_, (name, _))| name.clone())
                .collect(),
        );
    }
    Some(IFile {
        checksum_ok,
        stored_checksum,
        counts,
        seq,
        time,
        offsets,
        blocks,
        seg_bloom,
        block_bloom_size,
        block_blooms: block_blooms_v,
        collections: colls,
        block_collections,
        collection_body,
    })
}

/// gloom v0.1.0's membership test, from its description: XXH3-128 of the item; block =
/// floor(hi × blocks / 2^64); intra = low 32 bits of lo XOR its high 32 bits; for each of k
/// partitions p_i (offset o_i), bit o_i + intra mod p_i must be set. Also checks the CRC-32C
/// trailer, computed here bitwise MSB-free with the reflected polynomial.
pub fn bloom_has(filter: &[u8], item: &[u8]) -> bool {
    const PARTS: [&[u32]; 18] = [
        &[],
        &[],
        &[],
        &[167, 173, 172],
        &[109, 127, 137, 139],
        &[97, 101, 103, 109, 102],
        &[61, 79, 83, 89, 97, 103],
        &[61, 67, 71, 79, 83, 89, 62],
        &[37, 47, 53, 61, 67, 71, 79, 97],
        &[41, 43, 47, 53, 59, 67, 71, 73, 58],
        &[31, 37, 41, 43, 47, 53, 59, 61, 67, 73],
        &[29, 31, 37, 41, 43, 44, 47, 53, 59, 61, 67],
        &[17, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 71],
        &[17, 19, 23, 29, 31, 37, 41, 43, 47, 52, 53, 59, 61],
        &[11, 13, 17, 19, 23, 29, 31, 37, 41, 47, 53, 59, 61, 71],
        &[11, 13, 17, 19, 23, 28, 29, 31, 37, 41, 43, 47, 53, 59, 61],
        &[
            5, 7, 11, 13, 17, 19, 23, 27, 29, 31, 37, 41, 43, 47, 53, 109,
        ],
        &[
            3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 32, 37, 41, 43, 47, 53, 101,
        ],
    ];
    let (body, trailer) = filter.split_at(filter.len() - 4);
    let mut crc = 0xFFFF_FFFFu32;
    for &b in body {
        let mut x = (crc ^ u32::from(b)) & 0xFF;
        for _ in 0..8 {
            x = if x & 1 == 1 {
                (x >> 1) ^ 0x82F6_3B78
            } else {
                x >> 1
            };
        }
        crc = (crc >> 8) ^ x;
    }
    assert_eq!((crc ^ 0xFFFF_FFFF).to_le_bytes(), trailer, "bloom CRC-32C");
    let mut c = Cur::new(body);
    let _version = c.le(1);
    let k = c.le(4).unwrap_or(0) as usize;
    let blocks = c.le(8).unwrap_or(1);
    let _count = c.le(8);
    let words: Vec<u64> = std::iter::from_fn(|| c.le(8)).collect();
    let h = xxhash_rust::xxh3::xxh3_128(item);
    let hi = (h >> 64) as u64;
    let lo = h as u64;
    let block = ((u128::from(hi) * u128::from(blocks)) >> 64) as usize;
    let intra = (lo ^ (lo >> 32)) as u32;
    let mut base = 0u32;
    PARTS[k].iter().all(|&p| {
        let bit = base + intra % p;
        base += p;
        words[block * 8 + (bit / 64) as usize] >> (bit % 64) & 1 == 1
    })
}
