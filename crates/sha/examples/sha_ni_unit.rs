//! How much SHA-256 work this CPU's SHA-NI unit does per cycle, and so how far interleaving
//! independent messages can take a SHA-NI kernel:
//! `cargo run --release -p riptide-sha --example sha_ni_unit`
//!
//! Why: the lane count of the SHA-NI kernels (`sha256_pair`, two lanes) was chosen by measuring
//! whole kernels. This separates the unit's two limits: the *latency* of one `sha256rnds2` (one
//! message's rounds are a chain of them, so one lane waits on it) and the *throughput* of the
//! unit over independent chains, for the rounds alone and for the rounds together with the
//! message schedule (`sha256msg1`, `sha256msg2`). A compression of one 64-byte block issues 32
//! `sha256rnds2`, 12 `sha256msg1` and 12 `sha256msg2`: with enough lanes the unit's throughput
//! for that mix, not the latency, is the floor of any kernel that schedules with them.
//!
//! Measured on the 2-vCPU AMD EPYC VM (Zen 4), 2026-11-25 (`bench/results/2026-11-25-vm/sha-ni-s9.md`):
//! - `sha256rnds2`: 1.10 ns per step on one chain, 0.27 ns on four (latency four cycles, one
//!   issue a cycle), no better on eight;
//! - with `sha256msg1` + `sha256msg2` beside each, 0.69 ns per step on four chains: the
//!   schedule shares the unit;
//! - so a block needs at least 20 × 0.27 + 12 × 0.69 ≈ 13.7 ns of the unit: ~4.7 GB/s however
//!   many lanes are interleaved. `sha2` (one chain) hashes a long message at 1.80 GB/s, two SHA-NI
//!   lanes (`sha256_pair`) at 3.34 GB/s, 72% of that floor; a four-lane kernel, tried, 3.22.
//!
//! On a Zen 3 (AMD EPYC without AVX-512), 2026-11-25 (`bench/results/2026-11-25-zen3/issue20-zen3.md`):
//! the same unit at a lower clock, 1.34 ns per step on one chain, 0.34 on four, 0.73 with the
//! schedule on four.

#![allow(unsafe_code)] // SHA-NI intrinsics, entered after a run-time CPU check (`main`).

#[cfg(target_arch = "x86_64")]
use std::hint::black_box;
#[cfg(target_arch = "x86_64")]
use std::time::Instant;

#[cfg(target_arch = "x86_64")]
mod probe {
    use std::arch::x86_64::*;

    /// `n` steps of `K` independent chains: each step one `sha256rnds2` per chain (`rounds`)
    /// and/or one `sha256msg1` + `sha256msg2` per chain (`schedule`).
    #[target_feature(enable = "sha,sse2")]
    pub fn chains<const K: usize>(n: usize, rounds: bool, schedule: bool) -> __m128i {
        let mut s0 = [_mm_set1_epi32(1); K];
        let mut s1 = [_mm_set1_epi32(2); K];
        let mut w = [_mm_set1_epi32(5); K];
        let m = _mm_set1_epi32(3);
        for _ in 0..n {
            for k in 0..K {
                if rounds {
                    let t = _mm_sha256rnds2_epu32(s1[k], s0[k], m);
                    s1[k] = s0[k];
                    s0[k] = t;
                }
                if schedule {
                    w[k] = _mm_sha256msg2_epu32(_mm_sha256msg1_epu32(w[k], m), m);
                }
            }
        }
        let mut x = _mm_setzero_si128();
        for k in 0..K {
            x = _mm_xor_si128(x, _mm_xor_si128(s0[k], w[k]));
        }
        x
    }
}

#[cfg(target_arch = "x86_64")]
fn main() {
    if !std::arch::is_x86_feature_detected!("sha") {
        println!("this CPU has no SHA-NI");
        return;
    }
    let n = 50_000_000;
    macro_rules! run {
        ($k:literal, $rounds:expr, $schedule:expr) => {{
            let t = Instant::now();
            // SAFETY: the CPU has SHA-NI (checked above); SSE2 is part of x86-64.
            let x = unsafe { probe::chains::<$k>(black_box(n), $rounds, $schedule) };
            black_box(x);
            let ns = t.elapsed().as_secs_f64() * 1e9 / (n * $k) as f64;
            let what = match ($rounds, $schedule) {
                (true, false) => "sha256rnds2",
                (false, true) => "sha256msg1 + sha256msg2",
                _ => "sha256rnds2 + sha256msg1 + sha256msg2",
            };
            println!("{:>2} chains, {what}: {ns:.3} ns per chain-step", $k);
        }};
    }
    run!(1, true, false);
    run!(2, true, false);
    run!(4, true, false);
    run!(8, true, false);
    run!(1, false, true);
    run!(4, false, true);
    run!(4, true, true);
    run!(8, true, true);
}

#[cfg(not(target_arch = "x86_64"))]
fn main() {
    println!("SHA-NI is x86-64 only");
}
