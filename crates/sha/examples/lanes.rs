//! Throughput of `sha256_pair` against `sha2` one message at a time, for message sizes riptide
//! hashes most: MST keys (~30 bytes), records (~250 bytes), MST nodes (~1 KB).
//! `cargo run --release -p riptide-sha --example lanes`
use std::hint::black_box;
use std::time::Instant;

fn main() {
    streams();
    println!("SHA-NI lanes available: {}", riptide_sha::lanes_available());
    for size in [30usize, 250, 1000] {
        let n = (40_000_000 / size.max(64)).max(1000) & !1;
        let msgs: Vec<Vec<u8>> = (0..n).map(|i| vec![(i % 251) as u8; size]).collect();
        let mut best = (f64::MAX, f64::MAX, f64::MAX);
        for _ in 0..5 {
            let t = Instant::now();
            let mut x = 0u8;
            for m in &msgs {
                x ^= riptide_sha::sha256(black_box(m))[0];
            }
            black_box(x);
            let one = t.elapsed().as_secs_f64();
            let t = Instant::now();
            for p in msgs.chunks_exact(2) {
                let (a, b) = riptide_sha::sha256_pair(black_box(&p[0]), black_box(&p[1]));
                x ^= a[0] ^ b[0];
            }
            black_box(x);
            let two = t.elapsed().as_secs_f64();
            let t = Instant::now();
            for m in &msgs {
                x ^= riptide_sha::sha256_short(black_box(m))[0];
            }
            black_box(x);
            let short = t.elapsed().as_secs_f64();
            best = (best.0.min(one), best.1.min(two), best.2.min(short));
        }
        println!(
            "{size:>5} bytes: sha2 {:>6.1} ns/msg, pairs {:>6.1} ns/msg ({:.2}x), lean one-lane {:>6.1} ns/msg ({:.2}x)",
            best.0 * 1e9 / n as f64,
            best.1 * 1e9 / n as f64,
            best.0 / best.1,
            best.2 * 1e9 / n as f64,
            best.0 / best.2
        );
    }
}

/// Checking a stream of messages against their digests, as the CAR reader does: two SHA-NI
/// lanes ([`riptide_sha::Pairs`]) against the widest [`riptide_sha::Checker`] (sixteen AVX-512
/// lanes where available).
#[allow(dead_code)]
fn streams() {
    for size in [30usize, 250, 1000, 0] {
        // size 0: a mix like a repository CAR (mostly ~200-byte records, some 1-3 KB nodes).
        let n = 200_000usize;
        let msgs: Vec<Vec<u8>> = (0..n)
            .map(|i| {
                let len = if size == 0 {
                    [180, 200, 220, 240, 90, 1200, 2500, 210][i % 8]
                } else {
                    size
                };
                vec![(i % 251) as u8; len]
            })
            .collect();
        let digests: Vec<riptide_sha::Digest> =
            msgs.iter().map(|m| riptide_sha::sha256(m)).collect();
        let bytes: usize = msgs.iter().map(Vec::len).sum();
        let mut best = (f64::MAX, f64::MAX);
        for _ in 0..5 {
            let t = Instant::now();
            let mut p = riptide_sha::Pairs::new();
            for (i, (m, d)) in msgs.iter().zip(&digests).enumerate() {
                p.push(black_box(m), d, i).expect("match");
            }
            p.finish().expect("match");
            let two = t.elapsed().as_secs_f64();
            let t = Instant::now();
            let mut c = riptide_sha::Checker::new();
            for (i, (m, d)) in msgs.iter().zip(&digests).enumerate() {
                c.push(black_box(m), d, i).expect("match");
            }
            c.finish().expect("match");
            let wide = t.elapsed().as_secs_f64();
            best = (best.0.min(two), best.1.min(wide));
        }
        println!(
            "stream of {n} x {:>5}: pairs {:>6.1} ns/msg ({:.2} GB/s), checker {:>6.1} ns/msg ({:.2} GB/s, {:.2}x)",
            if size == 0 { "mixed".to_string() } else { format!("{size} B") },
            best.0 * 1e9 / n as f64,
            bytes as f64 / best.0 / 1e9,
            best.1 * 1e9 / n as f64,
            bytes as f64 / best.1 / 1e9,
            best.0 / best.1
        );
    }
}
