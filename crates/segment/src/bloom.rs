//! The DID bloom filters of the footer, bit-compatible with the Go library Jetstream uses.
//!
//! Why a module: a planner that is asked for 10,000 DIDs must skip segments and blocks without
//! decompressing them, and the filters must be the very bits Jetstream's clients and tools test
//! against, so the hash, the layout and the serialized form are fixed here. The filter is
//! `github.com/jcalabro/gloom` v0.1.0 (the version Jetstream's `go.mod` pins): blocks of 512
//! bits; the item's XXH3-128 chooses a block from its high half (`hi × blocks >> 64`) and, from
//! its low half folded to 32 bits (`lo ^ lo >> 32`), one bit in each of `k` pairwise-coprime
//! partitions of the block (sizes summing to 512, `k` in 3..=17). Serialized: `u8 version (1)`,
//! `u32 k`, `u64 block count`, `u64 items added`, the words as little-endian `u64`s, then a
//! CRC-32C (Castagnoli) of everything before it, little-endian.
//!
//! Reading is zero-copy ([`Bloom`] tests bits in the file's bytes). Building ([`BloomBuilder`])
//! reproduces gloom's sizing (`OptimalParams`: the block count grows from the classic estimate
//! until the Poisson-weighted false-positive estimate meets the target, with the `k` that
//! minimises it), so that a segment we write has the filters Jetstream would write. That sizing
//! is floating point: the integer powers follow Go's `math.Pow` step by step, but `exp`/`ln`
//! come from the platform, so a size at an exact tie could differ by a block. A reader takes
//! the size from the filter, so this can only cost byte equality, never compatibility.

use crate::error::{Error, Result};

const BLOCK_BITS: u64 = 512;
const BLOCK_BYTES: usize = 64;
const SERIAL_HEADER: usize = 21;
const SERIAL_TRAILER: usize = 4;
const LN2_SQUARED: f64 = 0.480_453_013_918_201_4;
const MIN_K: u32 = 3;
const MAX_K: u32 = 17;

/// The false-positive rate Jetstream sizes both kinds of DID bloom for.
pub const FP_RATE: f64 = 0.001;

/// gloom's partition sizes per `k` (pairwise coprime, each set summing to 512).
fn partitions(k: u32) -> Option<&'static [u32]> {
    Some(match k {
        3 => &[167, 173, 172],
        4 => &[109, 127, 137, 139],
        5 => &[97, 101, 103, 109, 102],
        6 => &[61, 79, 83, 89, 97, 103],
        7 => &[61, 67, 71, 79, 83, 89, 62],
        8 => &[37, 47, 53, 61, 67, 71, 79, 97],
        9 => &[41, 43, 47, 53, 59, 67, 71, 73, 58],
        10 => &[31, 37, 41, 43, 47, 53, 59, 61, 67, 73],
        11 => &[29, 31, 37, 41, 43, 44, 47, 53, 59, 61, 67],
        12 => &[17, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 71],
        13 => &[17, 19, 23, 29, 31, 37, 41, 43, 47, 52, 53, 59, 61],
        14 => &[11, 13, 17, 19, 23, 29, 31, 37, 41, 47, 53, 59, 61, 71],
        15 => &[11, 13, 17, 19, 23, 28, 29, 31, 37, 41, 43, 47, 53, 59, 61],
        16 => &[
            5, 7, 11, 13, 17, 19, 23, 27, 29, 31, 37, 41, 43, 47, 53, 109,
        ],
        17 => &[
            3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 32, 37, 41, 43, 47, 53, 101,
        ],
        _ => return None,
    })
}

/// An item's hash, computed once and tested against any number of filters: a planner asked
/// for 10,000 DIDs over 1,000 segments hashes 10,000 times, not ten million.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BloomKey(u128);

impl BloomKey {
    /// The key of an item (a DID's bytes).
    pub fn new(item: &[u8]) -> BloomKey {
        BloomKey(xxhash_rust::xxh3::xxh3_128(item))
    }
}

/// A key's bit positions for one partition layout (one `k`), computed once and then tested
/// against any number of filters with that `k` without a division: a plan for 10,000 DIDs over
/// 1,000 segments makes ten million filter tests, and the `intra % p` of each partition was
/// most of their cost (the filters of one plan mostly share a `k`, since they are sized for the
/// same false-positive rate).
#[derive(Debug, Clone, Copy)]
pub struct Probe {
    /// The key's high half, which chooses the block (`hi × blocks >> 64`).
    hi: u64,
    k: u32,
    /// The bit of each partition within the block; the first `k` are used.
    bits: [u16; MAX_K as usize],
}

impl BloomKey {
    /// The key's positions for filters with `k` partitions (`None` outside 3..=17, which no
    /// parsed filter has).
    pub fn probe(self, k: u32) -> Option<Probe> {
        let parts = partitions(k)?;
        let h = self.0;
        let lo = h as u64;
        let intra = (lo as u32) ^ ((lo >> 32) as u32);
        let mut bits = [0u16; MAX_K as usize];
        let mut base = 0u32;
        for (slot, &p) in bits.iter_mut().zip(parts) {
            // < 512: the partitions of one block sum to 512.
            *slot = (base + intra % p) as u16;
            base += p;
        }
        Some(Probe {
            hi: (h >> 64) as u64,
            k,
            bits,
        })
    }
}

/// The block an item lands in and its bit positions within the block.
fn positions(item: &[u8], num_blocks: u64, parts: &[u32]) -> (usize, Vec<u32>) {
    key_positions(BloomKey::new(item), num_blocks, parts)
}

fn key_positions(key: BloomKey, num_blocks: u64, parts: &[u32]) -> (usize, Vec<u32>) {
    let h = key.0;
    let (hi, lo) = ((h >> 64) as u64, h as u64);
    let block = ((u128::from(hi) * u128::from(num_blocks)) >> 64) as usize;
    let intra = (lo as u32) ^ ((lo >> 32) as u32);
    let mut base = 0u32;
    let bits = parts
        .iter()
        .map(|&p| {
            let bit = base + intra % p;
            base += p;
            bit
        })
        .collect();
    (block, bits)
}

/// CRC-32C (Castagnoli, reflected), the filter's trailer.
fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = (crc >> 1) ^ (0x82F6_3B78 & (crc & 1).wrapping_neg());
        }
    }
    !crc
}

/// A serialized filter, read in place.
#[derive(Debug, Clone, Copy)]
pub struct Bloom<'a> {
    k: u32,
    num_blocks: u64,
    count: u64,
    words: &'a [u8],
}

impl<'a> Bloom<'a> {
    /// Parses a serialized filter: its length must be what its header says and its CRC match.
    pub fn parse(bytes: &'a [u8]) -> Result<Bloom<'a>> {
        if bytes.len() < SERIAL_HEADER + SERIAL_TRAILER {
            return Err(Error::Bloom(format!(
                "{} bytes, shorter than 25",
                bytes.len()
            )));
        }
        if bytes[0] != 1 {
            return Err(Error::Bloom(format!("serialization version {}", bytes[0])));
        }
        let k = u32::from_le_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]);
        let num_blocks = crate::header::u64_at(bytes, 5);
        let count = crate::header::u64_at(bytes, 13);
        if partitions(k).is_none() {
            return Err(Error::Bloom(format!("k = {k} outside 3..=17")));
        }
        let want = num_blocks
            .checked_mul(BLOCK_BYTES as u64)
            .and_then(|b| b.checked_add((SERIAL_HEADER + SERIAL_TRAILER) as u64));
        if num_blocks == 0 || want != Some(bytes.len() as u64) {
            return Err(Error::Bloom(format!(
                "{num_blocks} blocks do not fill {} bytes",
                bytes.len()
            )));
        }
        let (body, trailer) = bytes.split_at(bytes.len() - SERIAL_TRAILER);
        let stored = u32::from_le_bytes([trailer[0], trailer[1], trailer[2], trailer[3]]);
        if crc32c(body) != stored {
            return Err(Error::Bloom("CRC-32C mismatch".into()));
        }
        Ok(Bloom {
            k,
            num_blocks,
            count,
            words: &body[SERIAL_HEADER..],
        })
    }

    /// A filter [`Bloom::parse`] already accepted, read again without recomputing its CRC:
    /// metadata kept in memory (`SegmentMeta`) is tested millions of times per plan.
    pub(crate) fn validated(bytes: &'a [u8]) -> Bloom<'a> {
        let k = u32::from_le_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]);
        Bloom {
            k,
            num_blocks: crate::header::u64_at(bytes, 5),
            count: crate::header::u64_at(bytes, 13),
            words: &bytes[SERIAL_HEADER..bytes.len() - SERIAL_TRAILER],
        }
    }

    /// Whether `item` may have been added (no false negatives).
    pub fn contains(&self, item: &[u8]) -> bool {
        self.contains_key(BloomKey::new(item))
    }

    /// [`Bloom::contains`] for an item hashed once with [`BloomKey::new`].
    pub fn contains_key(&self, key: BloomKey) -> bool {
        // The positions of `key_positions`, tested as they are computed: no allocation, since
        // a plan makes millions of these tests.
        let parts = partitions(self.k).unwrap_or(&[]);
        let h = key.0;
        let (hi, lo) = ((h >> 64) as u64, h as u64);
        let block = ((u128::from(hi) * u128::from(self.num_blocks)) >> 64) as usize;
        let intra = (lo as u32) ^ ((lo >> 32) as u32);
        let words = &self.words[block * BLOCK_BYTES..(block + 1) * BLOCK_BYTES];
        let mut base = 0u32;
        // Word w of the block, bit b, little-endian: byte w*8 + b/8 = bit/8.
        parts.iter().all(|&p| {
            let bit = base + intra % p;
            base += p;
            words[(bit / 8) as usize] & (1 << (bit % 8)) != 0
        })
    }

    /// [`Bloom::contains_key`] for a key's positions computed once for this filter's `k`
    /// ([`BloomKey::probe`]). A probe made for another `k` answers "may contain": never a
    /// false negative, only a wasted test.
    pub fn contains_probe(&self, probe: &Probe) -> bool {
        if probe.k != self.k {
            return true;
        }
        let block = ((u128::from(probe.hi) * u128::from(self.num_blocks)) >> 64) as usize;
        let Ok(words) = <&[u8; BLOCK_BYTES]>::try_from(
            &self.words[block * BLOCK_BYTES..(block + 1) * BLOCK_BYTES],
        ) else {
            return true;
        };
        // Every bit tested, without a branch per bit: for a DID the filter does not hold, about
        // half the bits are set, so a test that stopped at the first clear bit would branch
        // unpredictably, and the mispredictions cost more than the few loads it saves.
        // `& 63` is a no-op (a bit is < 512) that spares the bounds check.
        let mut all = 1u8;
        for &bit in &probe.bits[..self.k as usize] {
            all &= words[usize::from(bit / 8) & 63] >> (bit % 8);
        }
        all & 1 == 1
    }

    /// The number of hash partitions.
    pub fn k(&self) -> u32 {
        self.k
    }
    /// The number of 512-bit blocks.
    pub fn num_blocks(&self) -> u64 {
        self.num_blocks
    }
    /// Items added when it was built.
    pub fn count(&self) -> u64 {
        self.count
    }
}

/// A filter being built, sized as gloom's `New(expected, fpRate)` sizes it.
#[derive(Debug, Clone)]
pub struct BloomBuilder {
    k: u32,
    num_blocks: u64,
    count: u64,
    bytes: Vec<u8>,
}

/// Go's `math.Frexp` for a positive normal `x`: `x = f × 2^e`, `f` in [0.5, 1).
fn frexp(x: f64) -> (f64, i64) {
    let bits = x.to_bits();
    let e = ((bits >> 52) & 0x7ff) as i64 - 1022;
    (f64::from_bits((bits & !(0x7ff << 52)) | (1022 << 52)), e)
}

/// `a × 2^e`, rounding once (as Go's `math.Ldexp`).
fn ldexp(a: f64, e: i64) -> f64 {
    let two = |e: i64| f64::from_bits(((e + 1023) as u64) << 52);
    match e {
        e if e > 1023 => a * two(1023) * two((e - 1023).min(1023)),
        e if e < -1022 => a * two((e + 53).max(-1022)) * two(-53),
        e => a * two(e),
    }
}

/// Go's `math.Pow(x, y)` for `0 < x < 1` and `y >= 0`, step for step: the integer part by
/// repeated squaring of the mantissa, so that the result is the very float Go computes.
fn go_pow(x: f64, y: f64) -> f64 {
    let (mut yi, mut yf) = (y.trunc(), y.fract());
    let mut a1 = 1.0;
    let mut ae = 0i64;
    if yf != 0.0 {
        if yf > 0.5 {
            yf -= 1.0;
            yi += 1.0;
        }
        a1 = (yf * x.ln()).exp();
    }
    let (mut x1, mut xe) = frexp(x);
    let mut i = yi as i64;
    while i != 0 {
        if !(-(1 << 12)..=(1 << 12)).contains(&xe) {
            ae += xe;
            break;
        }
        if i & 1 == 1 {
            a1 *= x1;
            ae += xe;
        }
        x1 *= x1;
        xe <<= 1;
        if x1 < 0.5 {
            x1 += x1;
            xe -= 1;
        }
        i >>= 1;
    }
    ldexp(a1, ae)
}

fn partitioned_block_fp(parts: &[u32], j: f64) -> f64 {
    parts.iter().fold(1.0, |fp, &p| {
        fp * (1.0 - go_pow(1.0 - 1.0 / f64::from(p), j))
    })
}

/// gloom's `EstimateFalsePositiveRate`: the per-block rate averaged over a Poisson load.
fn estimate_fp(num_blocks: u64, k: u32, items: u64) -> f64 {
    let Some(parts) = partitions(k) else {
        return 1.0;
    };
    if num_blocks == 0 || items == 0 {
        return 0.0;
    }
    let lambda = items as f64 / num_blocks as f64;
    if lambda > 10_000.0 {
        return partitioned_block_fp(parts, lambda);
    }
    let max_j = (lambda + 10.0 * lambda.sqrt() + 20.0) as i64;
    let (mut fp, mut log_fact) = (0.0, 0.0);
    let log_lambda = lambda.ln();
    for j in 0..=max_j {
        if j > 0 {
            log_fact += (j as f64).ln();
        }
        let prob = (-lambda + j as f64 * log_lambda - log_fact).exp();
        if prob < 1e-15 && j > lambda as i64 {
            break;
        }
        if j > 0 {
            fp += prob * partitioned_block_fp(parts, j as f64);
        }
    }
    fp
}

/// gloom's `bestK`: the `k` with the lowest estimate (the first on a tie).
fn best_k(num_blocks: u64, items: u64) -> u32 {
    let (mut best, mut best_fp) = (MIN_K, f64::INFINITY);
    for k in MIN_K..=MAX_K {
        let fp = estimate_fp(num_blocks, k, items);
        if fp < best_fp {
            (best, best_fp) = (k, fp);
        }
    }
    best
}

/// gloom's `OptimalParams`: (block count, k).
fn optimal_params(expected: u64, fp_rate: f64) -> (u64, u32) {
    let expected = expected.max(1);
    let bits_per_item = -fp_rate.ln() / LN2_SQUARED;
    let base = (expected as f64 * bits_per_item / BLOCK_BITS as f64).ceil() as u64;
    let max_blocks = (base as f64 * 4.0).ceil() as u64;
    let mut num_blocks = base;
    let mut k = best_k(num_blocks, expected);
    while estimate_fp(num_blocks, k, expected) > fp_rate && num_blocks < max_blocks {
        num_blocks = (num_blocks + num_blocks / 8 + 1).min(max_blocks);
        k = best_k(num_blocks, expected);
    }
    (num_blocks.max(1), k)
}

/// The most bytes a serialized filter for `items` items can take in a file any writer made:
/// gloom grows a filter to at most 4 × its classic size, and this allows for a target rate as
/// low as 10⁻⁶ (Jetstream's is 10⁻³), so that no reader refuses a valid filter. A bound, for
/// refusing a damaged header's sizes before allocating (`max_footer_bytes`), not a size.
pub fn max_serialized_bytes(items: u64) -> u64 {
    let bits_per_item = -(1e-6f64).ln() / LN2_SQUARED;
    let base = (items.max(1) as f64 * bits_per_item / BLOCK_BITS as f64).ceil() as u64;
    let blocks = base.saturating_mul(4).saturating_add(1);
    blocks
        .saturating_mul(BLOCK_BYTES as u64)
        .saturating_add((SERIAL_HEADER + SERIAL_TRAILER) as u64)
}

impl BloomBuilder {
    /// A filter for `expected` items at `fp_rate` (`expected` 0 is taken as 1, as gloom does).
    pub fn new(expected: u64, fp_rate: f64) -> BloomBuilder {
        let (num_blocks, k) = optimal_params(expected, fp_rate);
        BloomBuilder {
            k,
            num_blocks,
            count: 0,
            bytes: vec![0; num_blocks as usize * BLOCK_BYTES],
        }
    }

    /// Adds an item.
    pub fn insert(&mut self, item: &[u8]) {
        let parts = partitions(self.k).unwrap_or(&[]);
        let (block, bits) = positions(item, self.num_blocks, parts);
        let base = block * BLOCK_BYTES;
        for bit in bits {
            self.bytes[base + (bit / 8) as usize] |= 1 << (bit % 8);
        }
        self.count += 1;
    }

    /// The serialized filter.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(SERIAL_HEADER + self.bytes.len() + SERIAL_TRAILER);
        out.push(1);
        out.extend_from_slice(&self.k.to_le_bytes());
        out.extend_from_slice(&self.num_blocks.to_le_bytes());
        out.extend_from_slice(&self.count.to_le_bytes());
        out.extend_from_slice(&self.bytes);
        let crc = crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizing_matches_files_jetstream_wrote() {
        // golden_seal.bin's filters, for 1 and 2 DIDs: one block, k = 15.
        assert_eq!(optimal_params(1, FP_RATE), (1, 15));
        // legacy_fixed4096_blooms.jss: capacity 4096 gave 8,409-byte filters = 21 + 131 × 64 + 4
        // (segment/rewrite_bloom_test.go pins the 8,409).
        assert_eq!(optimal_params(4096, FP_RATE).0, 131);
    }

    #[test]
    fn go_pow_matches_exact_powers() {
        assert_eq!(go_pow(0.5, 3.0), 0.125);
        assert_eq!(go_pow(0.75, 0.0), 1.0);
        assert!((go_pow(0.9, 10.0) - 0.9f64.powi(10)).abs() < 1e-15);
        assert!((go_pow(0.9, 2.5) - 0.9f64.powf(2.5)).abs() < 1e-15);
        // CRC-32C check value ("123456789").
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
    }

    #[test]
    fn no_false_negatives_and_few_positives() {
        let mut b = BloomBuilder::new(500, FP_RATE);
        for i in 0..500 {
            b.insert(format!("did:plc:{i}").as_bytes());
        }
        let bytes = b.to_bytes();
        let f = Bloom::parse(&bytes).unwrap();
        assert_eq!(f.count(), 500);
        assert!((0..500).all(|i| f.contains(format!("did:plc:{i}").as_bytes())));
        assert!(f.contains_key(BloomKey::new(b"did:plc:7")));
        let fp = (0..20_000)
            .filter(|i| f.contains(format!("did:web:{i}").as_bytes()))
            .count();
        assert!(fp < 100, "{fp} false positives in 20,000");
    }

    #[test]
    fn probes_answer_as_the_key_does_for_every_k() {
        // Filter sizes whose best k spans the range, each tested with members and strangers.
        let mut ks = std::collections::BTreeSet::new();
        for (items, fp) in [(3, 0.2), (50, 0.05), (500, FP_RATE), (2_000, 1e-5)] {
            let mut b = BloomBuilder::new(items, fp);
            for i in 0..items {
                b.insert(format!("did:plc:{i}").as_bytes());
            }
            let bytes = b.to_bytes();
            let f = Bloom::parse(&bytes).unwrap();
            ks.insert(f.k());
            for i in 0..(items * 4) {
                let key = BloomKey::new(format!("did:plc:{i}").as_bytes());
                let probe = key.probe(f.k()).unwrap();
                assert_eq!(f.contains_probe(&probe), f.contains_key(key), "k {}", f.k());
                // A probe made for another k never says "absent".
                let other = key.probe(if f.k() == 3 { 4 } else { 3 }).unwrap();
                assert!(f.contains_probe(&other));
            }
        }
        assert!(ks.len() >= 3, "only k = {ks:?} covered");
        assert!(BloomKey::new(b"x").probe(2).is_none());
        assert!(BloomKey::new(b"x").probe(18).is_none());
    }

    #[test]
    fn malformed_filters_are_refused() {
        let bytes = BloomBuilder::new(3, FP_RATE).to_bytes();
        assert!(Bloom::parse(&bytes[..bytes.len() - 1]).is_err());
        let mut v = bytes.clone();
        v[0] = 2;
        assert!(Bloom::parse(&v).is_err());
        let mut v = bytes.clone();
        v[1] = 18;
        assert!(Bloom::parse(&v).is_err());
        let mut v = bytes.clone();
        v[30] ^= 1;
        assert!(Bloom::parse(&v).is_err(), "CRC");
        let mut v = bytes;
        v[5..13].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(Bloom::parse(&v).is_err());
    }
}
