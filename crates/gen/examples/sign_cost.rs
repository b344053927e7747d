//! CPU time of one commit signature per curve, as the generator signs (`riptide_crypto::Signer`,
//! one held context): the floor under `riptide gen`'s cost per frame.
//!
//! `cargo run --release -p riptide-gen --example sign_cost -- [N]` (default 5,000 signatures per
//! curve). Prints µs per signature (thread CPU time, not wall time: the machine is shared).
use riptide_crypto::{Curve, PrivateKey, Signer};

fn cpu_secs() -> f64 {
    // Thread CPU time from /proc (Linux): utime + stime in clock ticks (100 Hz) is too coarse,
    // so use the scheduler's nanosecond figure for the thread.
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap_or_default();
    let ns: f64 = s
        .split_whitespace()
        .next()
        .and_then(|x| x.parse().ok())
        .unwrap_or(0.0);
    ns / 1e9
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(5000);
    let signer = Signer::new(&[7; 32]);
    for curve in [Curve::Secp256k1, Curve::P256] {
        let key = PrivateKey::from_bytes(curve, &[0x42; 32])?;
        // A commit-sized message that changes every time.
        let mut msg = vec![0xa5u8; 150];
        let mut acc = 0u8;
        let t0 = cpu_secs();
        for i in 0..n {
            msg[..8].copy_from_slice(&(i as u64).to_be_bytes());
            acc ^= signer.sign(&key, &msg)[0];
        }
        let dt = cpu_secs() - t0;
        println!(
            "{curve:?}: {:.1} µs per signature ({n} signatures, {dt:.3} CPU s; {acc})",
            dt / n as f64 * 1e6
        );
    }
    Ok(())
}
