//! Sixteen SHA-256 lanes in AVX-512 registers: one block of sixteen independent messages per
//! compression.
//!
//! Why: on the development machine (a Sapphire Rapids VM) SHA-NI's `sha256rnds2` is not
//! pipelined for independent work: one 64-byte block costs ~100 cycles whether one message or two
//! are in flight (measured with `examples/lanes.rs`: two SHA-NI lanes gain 1.0× on long
//! messages), so the SHA-NI unit itself is the ceiling of verifying a CAR. Plain integer SHA-256
//! in 512-bit registers computes sixteen messages' rounds with the same instructions, and with
//! `vprord` (rotate) and `vpternlogd` (any three-input boolean function) a round is ~17 vector
//! operations: sixteen blocks in well under sixteen SHA-NI blocks' time.
//!
//! How: [`States`] holds sixteen hash states, word-major (`[word][lane]`), so one register holds
//! one state word of every lane; [`compress`] loads one 64-byte block per lane, transposes the
//! 16×16 message words so each register holds one word of every lane, runs the 64 rounds and
//! adds the result back. Lanes are independent: what each one is hashing is the caller's
//! business (see `Lanes` in the crate root).
//!
//! The one `unsafe` is entering the `avx512f,avx512bw` function (sound after [`available`]) and
//! its unaligned 64-byte loads (each from a `&[u8; 64]`).

use std::arch::x86_64::*;

/// Whether this CPU has the AVX-512 subsets [`compress`] uses (cached by std).
#[inline]
pub(crate) fn available() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
}

/// Sixteen SHA-256 states, word-major: `0[j][i]` is word `j` (A..H) of lane `i`.
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct States(pub(crate) [[u32; 16]; 8]);

impl States {
    /// Sets lane `i` to the SHA-256 initial state.
    #[inline]
    pub(crate) fn reset(&mut self, i: usize) {
        for (w, h) in self.0.iter_mut().zip(super::H0) {
            w[i] = h;
        }
    }

    /// The digest of lane `i` (its state, big-endian).
    #[inline]
    pub(crate) fn digest(&self, i: usize) -> super::Digest {
        let mut out = [0u8; 32];
        for (o, w) in out.chunks_exact_mut(4).zip(&self.0) {
            o.copy_from_slice(&w[i].to_be_bytes());
        }
        out
    }

    /// Whether lane `i`'s digest equals `expected` (false unless it is 32 bytes).
    #[inline]
    pub(crate) fn digest_is(&self, i: usize, expected: &[u8]) -> bool {
        expected.len() == 32
            && self
                .0
                .iter()
                .zip(expected.chunks_exact(4))
                .all(|(w, e)| w[i].to_be_bytes() == *e)
    }
}

/// Compresses one block into each lane's state. Call only when [`available`] is true.
#[inline]
pub(crate) fn compress(st: &mut States, blocks: &[&[u8; 64]; 16]) {
    debug_assert!(available());
    // SAFETY: callers check `available()` (avx512f and avx512bw, the features this function
    // enables) before any call, as `Lanes` and the tests do.
    unsafe { compress_avx512(st, blocks) }
}

// The last rounds schedule words into the ring that no later round reads.
#[allow(unused_assignments)]
#[target_feature(enable = "avx512f,avx512bw")]
fn compress_avx512(st: &mut States, blocks: &[&[u8; 64]; 16]) {
    // Big-endian message words: swap the bytes of every 32-bit word.
    let swap = _mm512_set4_epi32(0x0c0d_0e0f, 0x0809_0a0b, 0x0405_0607, 0x0001_0203);
    let mut r = [_mm512_setzero_si512(); 16];
    for (ri, b) in r.iter_mut().zip(blocks) {
        // SAFETY: `b` is a reference to 64 readable bytes; `loadu` has no alignment requirement.
        let v = unsafe { _mm512_loadu_si512(b.as_ptr().cast()) };
        *ri = _mm512_shuffle_epi8(v, swap);
    }
    let mut w = transpose(r);

    let mut s = [_mm512_setzero_si512(); 8];
    for (sj, row) in s.iter_mut().zip(&st.0) {
        // SAFETY: `row` is 16 u32 = 64 readable bytes; `loadu` has no alignment requirement.
        *sj = unsafe { _mm512_loadu_si512(row.as_ptr().cast()) };
    }
    let [mut a, mut b, mut c, mut d, mut e, mut f, mut g, mut h] = s;

    // One round; the eight variables rotate by renaming (the macro call order), so only `d`
    // and `h` are written. Words 16..63 are scheduled in place in the 16-entry ring `w`.
    macro_rules! round {
        ($a:ident, $b:ident, $c:ident, $d:ident, $e:ident, $f:ident, $g:ident, $h:ident, $t:expr) => {{
            let wt = if $t < 16 {
                w[$t & 15]
            } else {
                let x = _mm512_add_epi32(
                    _mm512_add_epi32(small_sigma1(w[($t + 14) & 15]), w[($t + 9) & 15]),
                    _mm512_add_epi32(small_sigma0(w[($t + 1) & 15]), w[$t & 15]),
                );
                w[$t & 15] = x;
                x
            };
            let kw = _mm512_add_epi32(_mm512_set1_epi32(K[$t] as i32), wt);
            let t1 = _mm512_add_epi32(
                _mm512_add_epi32($h, big_sigma1($e)),
                _mm512_add_epi32(_mm512_ternarylogic_epi32::<0xCA>($e, $f, $g), kw),
            );
            let t2 = _mm512_add_epi32(
                big_sigma0($a),
                _mm512_ternarylogic_epi32::<0xE8>($a, $b, $c),
            );
            $d = _mm512_add_epi32($d, t1);
            $h = _mm512_add_epi32(t1, t2);
        }};
    }
    macro_rules! round8 {
        ($t:expr) => {{
            round!(a, b, c, d, e, f, g, h, $t);
            round!(h, a, b, c, d, e, f, g, $t + 1);
            round!(g, h, a, b, c, d, e, f, $t + 2);
            round!(f, g, h, a, b, c, d, e, $t + 3);
            round!(e, f, g, h, a, b, c, d, $t + 4);
            round!(d, e, f, g, h, a, b, c, $t + 5);
            round!(c, d, e, f, g, h, a, b, $t + 6);
            round!(b, c, d, e, f, g, h, a, $t + 7);
        }};
    }
    round8!(0);
    round8!(8);
    round8!(16);
    round8!(24);
    round8!(32);
    round8!(40);
    round8!(48);
    round8!(56);

    for (row, (old, new)) in st.0.iter_mut().zip(s.iter().zip([a, b, c, d, e, f, g, h])) {
        let v = _mm512_add_epi32(*old, new);
        // SAFETY: `row` is 16 u32 = 64 writable bytes; `storeu` has no alignment requirement.
        unsafe { _mm512_storeu_si512(row.as_mut_ptr().cast(), v) };
    }
}

#[inline]
#[target_feature(enable = "avx512f")]
fn big_sigma0(x: __m512i) -> __m512i {
    _mm512_ternarylogic_epi32::<0x96>(
        _mm512_ror_epi32::<2>(x),
        _mm512_ror_epi32::<13>(x),
        _mm512_ror_epi32::<22>(x),
    )
}

#[inline]
#[target_feature(enable = "avx512f")]
fn big_sigma1(x: __m512i) -> __m512i {
    _mm512_ternarylogic_epi32::<0x96>(
        _mm512_ror_epi32::<6>(x),
        _mm512_ror_epi32::<11>(x),
        _mm512_ror_epi32::<25>(x),
    )
}

#[inline]
#[target_feature(enable = "avx512f")]
fn small_sigma0(x: __m512i) -> __m512i {
    _mm512_ternarylogic_epi32::<0x96>(
        _mm512_ror_epi32::<7>(x),
        _mm512_ror_epi32::<18>(x),
        _mm512_srli_epi32::<3>(x),
    )
}

#[inline]
#[target_feature(enable = "avx512f")]
fn small_sigma1(x: __m512i) -> __m512i {
    _mm512_ternarylogic_epi32::<0x96>(
        _mm512_ror_epi32::<17>(x),
        _mm512_ror_epi32::<19>(x),
        _mm512_srli_epi32::<10>(x),
    )
}

/// Transposes sixteen rows of sixteen 32-bit words: out[j] holds word j of every row, row i in
/// element i. Interleave pairs of words, then pairs of pairs (within 128-bit lanes), then
/// move 128-bit lanes twice.
#[inline]
#[target_feature(enable = "avx512f")]
fn transpose(r: [__m512i; 16]) -> [__m512i; 16] {
    let mut t = [_mm512_setzero_si512(); 16];
    for k in 0..8 {
        t[2 * k] = _mm512_unpacklo_epi32(r[2 * k], r[2 * k + 1]);
        t[2 * k + 1] = _mm512_unpackhi_epi32(r[2 * k], r[2 * k + 1]);
    }
    // u[4q + m] holds word m, m+4, m+8, m+12 (one per 128-bit lane) of rows 4q..4q+3.
    let mut u = [_mm512_setzero_si512(); 16];
    for q in 0..4 {
        let (t0, t1, t2, t3) = (t[4 * q], t[4 * q + 1], t[4 * q + 2], t[4 * q + 3]);
        u[4 * q] = _mm512_unpacklo_epi64(t0, t2);
        u[4 * q + 1] = _mm512_unpackhi_epi64(t0, t2);
        u[4 * q + 2] = _mm512_unpacklo_epi64(t1, t3);
        u[4 * q + 3] = _mm512_unpackhi_epi64(t1, t3);
    }
    let mut out = [_mm512_setzero_si512(); 16];
    for m in 0..4 {
        let v0 = _mm512_shuffle_i32x4::<0x88>(u[m], u[4 + m]);
        let v1 = _mm512_shuffle_i32x4::<0xDD>(u[m], u[4 + m]);
        let v2 = _mm512_shuffle_i32x4::<0x88>(u[8 + m], u[12 + m]);
        let v3 = _mm512_shuffle_i32x4::<0xDD>(u[8 + m], u[12 + m]);
        out[m] = _mm512_shuffle_i32x4::<0x88>(v0, v2);
        out[m + 8] = _mm512_shuffle_i32x4::<0xDD>(v0, v2);
        out[m + 4] = _mm512_shuffle_i32x4::<0x88>(v1, v3);
        out[m + 12] = _mm512_shuffle_i32x4::<0xDD>(v1, v3);
    }
    out
}

const K: [u32; 64] = super::K;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sixteen_single_blocks_equal_sha2() {
        if !available() {
            return;
        }
        // Sixteen one-block messages of different lengths, padded by hand.
        let msgs: Vec<Vec<u8>> = (0..16u8)
            .map(|i| vec![i.wrapping_mul(37); i as usize * 3])
            .collect();
        let blocks: Vec<[u8; 64]> = msgs
            .iter()
            .map(|m| {
                let mut b = [0u8; 64];
                b[..m.len()].copy_from_slice(m);
                b[m.len()] = 0x80;
                b[56..].copy_from_slice(&(m.len() as u64 * 8).to_be_bytes());
                b
            })
            .collect();
        let refs: [&[u8; 64]; 16] = std::array::from_fn(|i| &blocks[i]);
        let mut st = States::default();
        for i in 0..16 {
            st.reset(i);
        }
        compress(&mut st, &refs);
        for (i, m) in msgs.iter().enumerate() {
            assert_eq!(st.digest(i), crate::sha256(m), "lane {i}");
            assert!(st.digest_is(i, &crate::sha256(m)));
        }
    }
}
