#![allow(clippy::unwrap_used, clippy::expect_used)] // a measuring tool: bad arguments may panic
//! Decoding rates on a frame corpus, in one process: SHA-256 bound (`sha2` over every block),
//! verified `decode_batch` (automatic and each kernel), verified `decode`, unverified `decode`.
//! What `riptide bench decode` measures, without building the CLI, and robust to a busy machine:
//! passes alternate round by round (the verified-batch variants in an order that rotates) and are
//! timed with this thread's on-CPU time.
//! `cargo run --release -p riptide-firehose --example decode_rate -- FRAMES [REPEAT] [ROUNDS]
//! [unverified|kernels|batch]` (`unverified`: only unverified passes over the distinct frames, in
//! ns/node; `kernels`: only hashing, every block in 16-frame batches, per kernel; `batch`: only
//! verified `decode_batch` passes, for profiles).
use std::hint::black_box;
use std::time::Instant;

use riptide_firehose::corpus::split_frames;
use riptide_firehose::{DecodeOptions, FrameDecoder, Kernel};
use sha2::{Digest, Sha256};

/// A clock that only runs while this thread is on a CPU (`/proc/thread-self/schedstat`, ns), so
/// other work on a shared machine does not count; wall time where that file is missing or moves
/// in coarse steps (some kernels account on-CPU time per 4 ms tick: every round would then read
/// as a multiple of 4 ms).
struct Clock(Option<u64>, Instant);

impl Clock {
    fn cpu_ns() -> Option<u64> {
        static FINE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        if !*FINE.get_or_init(Clock::is_fine) {
            return None;
        }
        Clock::schedstat_ns()
    }
    fn schedstat_ns() -> Option<u64> {
        let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
        s.split_whitespace().next()?.parse().ok()
    }
    /// Whether the on-CPU clock sees a 1 ms spin as 0.5–2 ms (and says which clock is used).
    fn is_fine() -> bool {
        let (Some(a), t) = (Clock::schedstat_ns(), Instant::now()) else {
            return false;
        };
        while t.elapsed() < std::time::Duration::from_millis(1) {
            black_box(0);
        }
        let fine = Clock::schedstat_ns()
            .is_some_and(|b| (500_000..2_000_000).contains(&b.saturating_sub(a)));
        eprintln!(
            "clock: {}",
            if fine {
                "on-CPU time"
            } else {
                "wall time (the on-CPU clock is coarse here)"
            }
        );
        fine
    }
    fn start() -> Clock {
        Clock(Clock::cpu_ns(), Instant::now())
    }
    fn elapsed(&self) -> f64 {
        match (self.0, Clock::cpu_ns()) {
            (Some(a), Some(b)) => b.saturating_sub(a) as f64 / 1e9,
            _ => self.1.elapsed().as_secs_f64(),
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let file = std::fs::read(&args[1]).expect("corpus file");
    let repeat: usize = args.get(2).map_or(20, |s| s.parse().unwrap());
    let rounds: usize = args.get(3).map_or(7, |s| s.parse().unwrap());
    // `unverified`: only unverified passes (for `perf stat`), with the node count.
    if args.get(4).map(String::as_str) == Some("unverified") {
        let one = split_frames(&file).expect("frames");
        let mut dec = FrameDecoder::with_options(DecodeOptions::unverified());
        let mut nodes = 0usize;
        for f in &one {
            let fr = dec.decode(f.bytes).expect("decodes");
            nodes += fr.header().node_count() + fr.payload().node_count();
            nodes += (0..fr.block_count())
                .filter_map(|i| fr.block_value(i))
                .map(|v| v.node_count())
                .sum::<usize>();
        }
        println!("{} frames, {nodes} nodes", one.len());
        let s = Clock::start();
        for _ in 0..repeat * rounds {
            for f in &one {
                black_box(dec.decode(f.bytes).is_ok());
            }
        }
        let t = s.elapsed();
        let n = (repeat * rounds * one.len()) as f64;
        println!(
            "unverified: {:.0} frames/s, {:.2} ns/node",
            n / t,
            t * 1e9 / (n / one.len() as f64) / nodes as f64
        );
        return;
    }
    let one = split_frames(&file).expect("frames");
    // Copies, as `bench decode --repeat` makes them.
    let owned: Vec<Vec<u8>> = (0..repeat)
        .flat_map(|_| one.iter().map(|f| f.bytes.to_vec()))
        .collect();
    let frames: Vec<&[u8]> = owned.iter().map(|f| &f[..]).collect();
    let mut blocks: Vec<(usize, usize, usize)> = Vec::new();
    let mut dec = FrameDecoder::new();
    for (i, f) in frames.iter().enumerate() {
        let fr = dec.decode(f).expect("decodes");
        if let Some(car) = fr.car() {
            let base = f.as_ptr() as usize;
            blocks.extend(
                car.blocks()
                    .map(|b| (i, b.data.as_ptr() as usize - base, b.data.len())),
            );
        }
    }
    let blocks: Vec<&[u8]> = blocks
        .iter()
        .map(|&(i, s, n)| &frames[i][s..s + n])
        .collect();
    let bytes: usize = frames.iter().map(|f| f.len()).sum();
    println!(
        "{} frames, {} blocks, {:.1} MB; kernels {:?}",
        frames.len(),
        blocks.len(),
        bytes as f64 / 1e6,
        Kernel::supported()
    );

    // `batch`: only verified `decode_batch` passes (automatic kernel), for `perf record`.
    if args.get(4).map(String::as_str) == Some("batch") {
        let mut d = FrameDecoder::new();
        let s = Clock::start();
        for _ in 0..rounds {
            d.decode_batch(&frames, |_, r| {
                black_box(r.is_ok());
            });
        }
        let t = s.elapsed();
        println!(
            "verified batch: {:.0} frames/s",
            (rounds * frames.len()) as f64 / t
        );
        return;
    }

    // `kernels`: only hashing, every block, in the batches decode_batch makes (16 frames).
    if args.get(4).map(String::as_str) == Some("kernels") {
        let mut per_batch: Vec<Vec<&[u8]>> = Vec::new();
        let mut dec = FrameDecoder::new();
        for chunk in frames.chunks(riptide_firehose::BATCH_FRAMES) {
            let mut v = Vec::new();
            for f in chunk {
                let fr = dec.decode(f).expect("decodes");
                if let Some(car) = fr.car() {
                    let base = f.as_ptr() as usize;
                    for b in car.blocks() {
                        let s = b.data.as_ptr() as usize - base;
                        v.push(&f[s..s + b.data.len()]);
                    }
                }
            }
            per_batch.push(v);
        }
        let mut out = Vec::new();
        for round in 0..rounds {
            let mut line = format!("round {round}:");
            for k in Kernel::supported() {
                let s = Clock::start();
                for b in &per_batch {
                    k.digests(b, &mut out);
                    black_box(&out);
                }
                let t = s.elapsed();
                line += &format!(" {k:?} {:.0} frames/s;", frames.len() as f64 / t);
            }
            println!("{line}");
        }
        return;
    }

    let mut names: Vec<String> = vec!["sha2 bound".into(), "verified batch".into()];
    let mut kernels: Vec<Option<Kernel>> = vec![None];
    for k in Kernel::supported() {
        names.push(format!("verified batch {k:?}"));
        kernels.push(Some(k));
    }
    names.push("verified decode".into());
    names.push("unverified decode".into());
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); names.len()];
    let mut batch_decs: Vec<FrameDecoder> = kernels
        .iter()
        .map(|&k| {
            let mut d = FrameDecoder::new();
            d.set_batch_kernel(k);
            d
        })
        .collect();
    let mut unv = FrameDecoder::with_options(DecodeOptions::unverified());
    for round in 0..rounds + 1 {
        let mut t = Vec::new();
        let s = Clock::start();
        let mut x = 0u8;
        for b in &blocks {
            x ^= Sha256::digest(b)[0];
        }
        black_box(x);
        t.push(s.elapsed());
        // The variants' order rotates every round: the first verified pass after the bound's
        // runs ~3% slower whichever it is (`docs/gotchas.md`), so a fixed order would favour the
        // later ones.
        let mut batch_t = vec![0.0; batch_decs.len()];
        for j in 0..batch_decs.len() {
            let i = (j + round) % batch_decs.len();
            let s = Clock::start();
            let mut n = 0usize;
            batch_decs[i].decode_batch(&frames, |_, r| {
                if let Ok(f) = r {
                    n += f.block_count();
                }
            });
            assert_eq!(n, blocks.len());
            batch_t[i] = s.elapsed();
        }
        t.extend(batch_t);
        for d in [&mut dec, &mut unv] {
            let s = Clock::start();
            let mut n = 0usize;
            for f in &frames {
                if let Ok(f) = d.decode(f) {
                    n += f.block_count();
                }
            }
            assert_eq!(n, blocks.len());
            t.push(s.elapsed());
        }
        if round > 0 {
            for (all, v) in times.iter_mut().zip(t) {
                all.push(v);
            }
        }
    }
    let med = |v: &Vec<f64>| {
        let mut v = v.clone();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let bound = frames.len() as f64 / med(&times[0]);
    for (name, t) in names.iter().zip(&times) {
        let fps = frames.len() as f64 / med(t);
        println!(
            "{name:>28}: {:>8.0} frames/s {:>6.0} MB/s  ratio to bound {:.2}",
            fps,
            bytes as f64 / med(t) / 1e6,
            fps / bound
        );
    }
}
