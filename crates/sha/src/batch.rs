//! Digests of a whole batch of independent messages, with a kernel chosen at run time.
//!
//! Why: a firehose frame holds about ten CAR blocks, too few to keep SHA-256 lanes busy, and a
//! frame's blocks can only be hashed together with *another* frame's if the caller hands over
//! several frames' blocks at once (`FrameDecoder::decode_batch` in riptide-firehose does). This
//! is the entry point for that: every message of the batch is hashed with the widest kernel the
//! CPU has, lanes refilled as messages end so that different lengths keep them busy.
//!
//! [`Kernel`] names each implementation so that tests (and benchmarks) can run every one this
//! machine supports against `sha2`; [`Kernel::best`] is the run-time dispatch, one binary for
//! every x86-64 (and `sha2` everywhere else).

use crate::Digest;

/// A SHA-256 implementation for [`Kernel::digests`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    /// `sha2`, one message after another (SHA-NI or ARMv8 SHA2 inside when `sha2` finds them,
    /// plain Rust otherwise): the fallback on every CPU.
    Sha2,
    /// Two lanes interleaved round by round: SHA-NI on x86-64 (with SSE4.1), the SHA2
    /// instructions on AArch64 (the name, `shani2`, is the x86 one on both). On an AMD
    /// EPYC (Zen) `sha256rnds2` has latency to spare: two lanes do nearly twice one's work.
    ShaNi2,
    /// Sixteen lanes in AVX-512 registers (x86-64 with AVX-512 F and BW).
    Avx512x16,
}

/// Below this many bytes in a batch, [`Kernel::best_for`] prefers SHA-NI pairs to sixteen
/// AVX-512 lanes, which do sixteen blocks' work per step however many lanes are busy.
pub const WIDE_MIN_BYTES: usize = crate::LANES_MIN_BYTES;

impl Kernel {
    /// Every kernel, widest last.
    pub const ALL: [Kernel; 3] = [Kernel::Sha2, Kernel::ShaNi2, Kernel::Avx512x16];

    /// The kernel's name, as `RIPTIDE_SHA_KERNEL` takes it: `sha2`, `shani2`, `avx512x16`.
    pub fn name(self) -> &'static str {
        match self {
            Kernel::Sha2 => "sha2",
            Kernel::ShaNi2 => "shani2",
            Kernel::Avx512x16 => "avx512x16",
        }
    }

    /// Whether this CPU runs this kernel (whatever `RIPTIDE_SHA_KERNEL` says).
    pub fn is_supported(self) -> bool {
        match self {
            Kernel::Sha2 => true,
            #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
            Kernel::ShaNi2 => crate::two::available(),
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512x16 => crate::x16::available(),
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// The kernels this CPU runs.
    pub fn supported() -> Vec<Kernel> {
        Kernel::ALL
            .into_iter()
            .filter(|k| k.is_supported())
            .collect()
    }

    /// The fastest kernel for a batch of about `bytes` bytes: sixteen AVX-512 lanes for a large
    /// batch where the CPU has them and they beat SHA-NI pairs ([`wide_beats_sha_ni`]), else
    /// SHA-NI pairs, else `sha2`.
    ///
    /// `RIPTIDE_SHA_KERNEL` caps or steers the choice ([`crate::cap`]).
    pub fn best_for(bytes: usize) -> Kernel {
        let ni = crate::cap::sha_ni_enabled();
        if bytes >= WIDE_MIN_BYTES && crate::cap::wide_enabled() && (!ni || wide_beats_sha_ni()) {
            Kernel::Avx512x16
        } else if ni {
            Kernel::ShaNi2
        } else {
            Kernel::Sha2
        }
    }

    /// The widest kernel dispatch uses on this CPU.
    pub fn best() -> Kernel {
        Kernel::best_for(usize::MAX)
    }

    /// Replaces `out` with the SHA-256 of every message of `msgs`, in order. A kernel this CPU
    /// does not run ([`Kernel::is_supported`]) falls back to [`Kernel::Sha2`], so the digests are
    /// always right.
    pub fn digests(self, msgs: &[&[u8]], out: &mut Vec<Digest>) {
        out.clear();
        out.resize(msgs.len(), [0; 32]);
        let k = if self.is_supported() {
            self
        } else {
            Kernel::Sha2
        };
        match k {
            #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
            Kernel::ShaNi2 => crate::two::stream(msgs, out),
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512x16 => wide(msgs, out),
            _ => {
                for (o, m) in out.iter_mut().zip(msgs) {
                    *o = crate::sha256(m);
                }
            }
        }
    }
}

/// Whether sixteen AVX-512 lanes hash faster than two SHA-NI lanes on this CPU. On Intel cores
/// they do (the development Sapphire Rapids VM: SHA-NI ~100 cycles a block, two lanes no faster
/// than one; sixteen lanes 1.5×, `examples/lanes.rs`). On AMD Zen, `sha256rnds2` has latency to
/// spare, so two interleaved lanes do nearly twice one's work, while 512-bit vectors run as two
/// 256-bit halves: on the real capture's blocks in 16-frame batches two SHA-NI lanes were ~1.6×
/// the sixteen AVX-512 lanes on an AMD EPYC with both (`riptide-firehose` example `decode_rate
/// … kernels`, 2026-11-24, loaded machine). Decided by vendor: deterministic and free;
/// `RIPTIDE_SHA_KERNEL=avx512x16` says yes on any vendor, `shani2` no ([`crate::cap`]).
pub fn wide_beats_sha_ni() -> bool {
    match crate::cap::kernel_cap() {
        Some(Kernel::Avx512x16) => return true,
        Some(Kernel::ShaNi2) => return false,
        _ => {}
    }
    #[cfg(target_arch = "x86_64")]
    {
        !is_amd()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether the CPU vendor is AMD (`AuthenticAMD`).
#[cfg(target_arch = "x86_64")]
fn is_amd() -> bool {
    static AMD: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AMD.get_or_init(|| {
        // SAFETY: CPUID leaf 0 exists on every x86-64 CPU and only reads identification
        // registers (the intrinsic is safe in recent Rust; `unsafe` for older compilers).
        #[allow(unused_unsafe)]
        let r = unsafe { std::arch::x86_64::__cpuid(0) };
        // "Auth" "enti" "cAMD" in EBX, EDX, ECX.
        (r.ebx, r.edx, r.ecx) == (0x6874_7541, 0x6974_6e65, 0x444d_4163)
    })
}

/// Sixteen AVX-512 lanes over the batch; each lane takes the next message when its own ends.
#[cfg(target_arch = "x86_64")]
fn wide(msgs: &[&[u8]], out: &mut [Digest]) {
    use crate::{x16, Lane, IDLE};
    let mut states = x16::States::default();
    let mut lanes = [Lane::default(); 16];
    let mut index = [0usize; 16];
    let mut busy: u16 = 0;
    let mut queue = msgs.iter().enumerate();
    loop {
        while busy != u16::MAX {
            let Some((n, m)) = queue.next() else { break };
            let i = (!busy).trailing_zeros() as usize;
            lanes[i].load(m, &[]);
            states.reset(i);
            index[i] = n;
            busy |= 1 << i;
        }
        if busy == 0 {
            return;
        }
        let mut blocks: [&[u8; 64]; 16] = [&IDLE; 16];
        let mut last: u16 = 0;
        for (i, (lane, slot)) in lanes.iter_mut().zip(blocks.iter_mut()).enumerate() {
            if busy & (1 << i) != 0 {
                let (b, is_last) = lane.next_block();
                *slot = b;
                last |= u16::from(is_last) << i;
            }
        }
        x16::compress(&mut states, &blocks);
        while last != 0 {
            let i = last.trailing_zeros() as usize;
            last &= last - 1;
            busy &= !(1 << i);
            if let Some(o) = out.get_mut(index[i]) {
                *o = states.digest(i);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn check(msgs: &[Vec<u8>]) {
        let refs: Vec<&[u8]> = msgs.iter().map(|m| &m[..]).collect();
        let want: Vec<Digest> = msgs.iter().map(|m| crate::sha256(m)).collect();
        let mut out = Vec::new();
        for k in Kernel::supported() {
            k.digests(&refs, &mut out);
            assert_eq!(out, want, "{k:?}");
        }
    }

    #[test]
    fn the_fallback_is_always_supported_and_dispatch_follows_the_cpu() {
        assert!(Kernel::Sha2.is_supported());
        assert!(Kernel::supported().contains(&Kernel::best()));
        if crate::lanes_available() {
            assert_eq!(Kernel::best_for(0), Kernel::ShaNi2);
        }
        #[cfg(target_arch = "x86_64")]
        {
            let ni = std::arch::is_x86_feature_detected!("sha")
                && std::arch::is_x86_feature_detected!("sse4.1")
                && std::arch::is_x86_feature_detected!("ssse3");
            let wide = std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512bw");
            assert_eq!(Kernel::ShaNi2.is_supported(), ni);
            assert_eq!(Kernel::Avx512x16.is_supported(), wide);
            // What `RIPTIDE_SHA_KERNEL` leaves to dispatch.
            let cap = crate::kernel_cap();
            let ni = ni && cap != Some(Kernel::Sha2);
            let wide = wide && !matches!(cap, Some(Kernel::Sha2 | Kernel::ShaNi2));
            // A large batch: the widest kernel, unless SHA-NI pairs are faster on this vendor.
            let want = match (wide, ni) {
                (true, false) => Kernel::Avx512x16,
                (true, true) if wide_beats_sha_ni() => Kernel::Avx512x16,
                (_, true) => Kernel::ShaNi2,
                (false, false) => Kernel::Sha2,
            };
            assert_eq!(Kernel::best_for(1 << 20), want);
            eprintln!("kernels on this CPU: {:?}", Kernel::supported());
        }
        #[cfg(target_arch = "aarch64")]
        {
            let two = std::arch::is_aarch64_feature_detected!("sha2");
            assert_eq!(Kernel::ShaNi2.is_supported(), two);
            assert!(!Kernel::Avx512x16.is_supported());
            let two = two && crate::kernel_cap() != Some(Kernel::Sha2);
            let want = if two { Kernel::ShaNi2 } else { Kernel::Sha2 };
            assert_eq!(Kernel::best_for(1 << 20), want);
        }
    }

    #[test]
    fn every_kernel_equals_sha2_around_block_edges() {
        let lens = [
            0usize, 1, 31, 55, 56, 57, 63, 64, 65, 119, 120, 127, 128, 129, 200, 1000, 3000,
        ];
        // Every length next to every other, in lanes that end at different times.
        let msgs: Vec<Vec<u8>> = lens
            .iter()
            .flat_map(|&a| lens.iter().map(move |&b| (a, b)))
            .flat_map(|(a, b)| [vec![a as u8; a], vec![b as u8 ^ 0x55; b]])
            .collect();
        check(&msgs);
        check(&[]);
        check(&[b"abc".to_vec()]);
    }

    #[test]
    fn an_unsupported_kernel_still_gives_right_digests() {
        let msgs: [&[u8]; 2] = [b"abc", b""];
        let mut out = Vec::new();
        for k in Kernel::ALL {
            k.digests(&msgs, &mut out);
            assert_eq!(out, vec![crate::sha256(b"abc"), crate::sha256(b"")]);
        }
    }

    proptest! {
        #[test]
        fn every_supported_kernel_equals_sha2(msgs in proptest::collection::vec(
                proptest::collection::vec(any::<u8>(), 0..1200), 0..70)) {
            check(&msgs);
        }
    }
}
