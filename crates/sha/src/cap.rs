//! `RIPTIDE_SHA_KERNEL`: capping the run-time kernel dispatch, read once per process.
//!
//! Why: the dispatch picks kernels from the CPU ([`crate::Kernel::best_for`], [`crate::Checker`],
//! [`crate::ShortBatch`], [`crate::sha256_pair`]), so one machine only ever measures its own
//! path. Issue 20's targets hold "with and without AVX-512"; with this variable one machine that
//! has both can run every path a CPU without them would run:
//!
//! | value | what dispatch may use |
//! |---|---|
//! | unset, empty or `auto` | everything the CPU has, as chosen per vendor (the default) |
//! | `shani2` | no AVX-512: SHA-NI pairs and `sha2` (a CPU with SHA-NI, without AVX-512; on AArch64 the pairs run on the SHA2 instructions, which is what dispatch chooses there anyway) |
//! | `sha2` | only `sha2`, one message at a time (no SHA-NI lanes, no AVX-512 lanes; `sha2` itself still uses the CPU's SHA extensions) |
//! | `avx512x16` | sixteen AVX-512 lanes wherever dispatch would choose between them and SHA-NI pairs (what an Intel CPU with both runs), when the CPU has AVX-512 |
//!
//! It only lowers or steers the choice: a kernel the CPU lacks is never used. Explicitly chosen
//! kernels ([`crate::Kernel::digests`] on a named kernel, [`crate::Lanes::new`]) are not capped,
//! so tests still check every kernel the hardware runs. An unknown value is ignored by the
//! library (dispatch stays automatic); [`kernel_from_env`] reports it, for a command to refuse.
//!
//! What it does not do: change `sha2`'s own CPU detection, or anything outside this crate.

use crate::Kernel;

/// The environment variable read by [`kernel_cap`].
pub const KERNEL_ENV: &str = "RIPTIDE_SHA_KERNEL";

/// What `RIPTIDE_SHA_KERNEL` holds: `Ok(None)` when unset, empty or `auto`, `Ok(Some(kernel))`
/// for a kernel name ([`Kernel::name`]), `Err(value)` for anything else.
pub fn kernel_from_env() -> Result<Option<Kernel>, String> {
    match std::env::var(KERNEL_ENV) {
        Ok(v) => parse_cap(&v).ok_or(v),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(v)) => Err(v.to_string_lossy().into_owned()),
    }
}

/// `Some(None)` for automatic (empty, `auto`), `Some(Some(k))` for a kernel name, `None` for
/// an unknown value.
fn parse_cap(v: &str) -> Option<Option<Kernel>> {
    match v.trim() {
        "" | "auto" => Some(None),
        s => Kernel::ALL.into_iter().find(|k| k.name() == s).map(Some),
    }
}

/// The kernel `RIPTIDE_SHA_KERNEL` caps dispatch at (`None`: automatic), read on first use and
/// fixed for the life of the process. An unknown value counts as automatic.
pub fn kernel_cap() -> Option<Kernel> {
    static CAP: std::sync::OnceLock<Option<Kernel>> = std::sync::OnceLock::new();
    *CAP.get_or_init(|| kernel_from_env().unwrap_or(None))
}

/// Whether dispatch may use the two lanes (SHA-NI, or ARMv8 SHA2): the CPU has them and the cap
/// allows them.
#[inline]
pub(crate) fn sha_ni_enabled() -> bool {
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    {
        crate::two::available() && kernel_cap() != Some(Kernel::Sha2)
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        false
    }
}

/// Whether dispatch may use the sixteen AVX-512 lanes: the CPU has them and the cap allows them.
#[inline]
pub(crate) fn wide_enabled() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        crate::x16::available() && !matches!(kernel_cap(), Some(Kernel::Sha2 | Kernel::ShaNi2))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_unknown_values_do_not() {
        assert_eq!(parse_cap(""), Some(None));
        assert_eq!(parse_cap("auto"), Some(None));
        for k in Kernel::ALL {
            assert_eq!(parse_cap(k.name()), Some(Some(k)));
        }
        assert_eq!(parse_cap(" shani2 "), Some(Some(Kernel::ShaNi2)));
        assert_eq!(parse_cap("avx2"), None);
        assert_eq!(parse_cap("SHA2"), None);
    }

    /// What dispatch must choose under each cap, checked in a child process of this test binary
    /// (the cap is read once per process) with `RIPTIDE_SHA_KERNEL` set: see
    /// `every_cap_steers_dispatch_in_a_fresh_process`.
    #[test]
    fn dispatch_under_the_cap_of_this_process() {
        use crate::{Checker, ShortBatch};
        let cap = kernel_cap();
        let ni = Kernel::ShaNi2.is_supported();
        let wide = Kernel::Avx512x16.is_supported();
        let best = Kernel::best_for(1 << 20);
        let lanes = matches!(Checker::<()>::new(), Checker::Lanes(_));
        match cap {
            Some(Kernel::Sha2) => {
                assert_eq!(best, Kernel::Sha2);
                assert!(!crate::lanes_available() && !lanes);
            }
            Some(Kernel::ShaNi2) => {
                assert_eq!(best, if ni { Kernel::ShaNi2 } else { Kernel::Sha2 });
                assert_eq!(crate::lanes_available(), ni);
                assert!(!lanes && !crate::wide_beats_sha_ni());
            }
            Some(Kernel::Avx512x16) => {
                assert!(crate::wide_beats_sha_ni());
                assert_eq!(best == Kernel::Avx512x16, wide);
                assert_eq!(lanes, wide);
            }
            None => {}
        }
        // Whatever the path, the digests are `sha2`'s.
        let msgs: Vec<Vec<u8>> = (0..40usize).map(|i| vec![i as u8; i * 37]).collect();
        let refs: Vec<&[u8]> = msgs.iter().map(|m| &m[..]).collect();
        let mut out = Vec::new();
        best.digests(&refs, &mut out);
        let mut b = ShortBatch::new();
        for m in msgs.iter().filter(|m| m.len() <= ShortBatch::MAX_LEN) {
            assert!(b.push(m));
        }
        let n = b.len();
        let short = b.digests();
        let mut c = Checker::new();
        for (i, m) in msgs.iter().enumerate() {
            assert_eq!(out[i], crate::sha256(m));
            c.push(m, &out[i], i).unwrap();
        }
        c.finish().unwrap();
        assert_eq!(crate::sha256_pair(&msgs[3], &msgs[30]), (out[3], out[30]));
        assert_eq!(short[..n], out[..n]);
        eprintln!("cap {cap:?}: best {best:?}, lanes {lanes}");
    }

    #[test]
    fn every_cap_steers_dispatch_in_a_fresh_process() {
        if std::env::var_os(KERNEL_ENV).is_some() {
            return; // a child (or a run under a cap): the test above checks this process
        }
        let exe = std::env::current_exe().unwrap();
        for value in ["sha2", "shani2", "avx512x16", "auto", "bogus"] {
            let out = std::process::Command::new(&exe)
                .args([
                    "--exact",
                    "cap::tests::dispatch_under_the_cap_of_this_process",
                ])
                .args(["--nocapture", "--test-threads=1"])
                .env(KERNEL_ENV, value)
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "{value}: {err}");
            let want = match value {
                "auto" | "bogus" => "cap None".to_string(),
                v => format!("cap {:?}", parse_cap(v).unwrap()),
            };
            assert!(err.contains(&want), "{value}: {err}");
        }
    }

    #[test]
    fn the_cap_never_enables_what_the_cpu_lacks() {
        #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
        assert!(!sha_ni_enabled() || crate::two::available());
        #[cfg(target_arch = "x86_64")]
        assert!(!wide_enabled() || crate::x16::available());
        match kernel_cap() {
            Some(Kernel::Sha2) => assert!(!sha_ni_enabled() && !wide_enabled()),
            Some(Kernel::ShaNi2) => assert!(!wide_enabled()),
            _ => {}
        }
    }
}
