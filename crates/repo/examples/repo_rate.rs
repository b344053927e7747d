//! Whole-repository verification against the SHA-256 bound, pass after pass, for A/B runs of
//! two builds: `cargo run --release -p riptide-repo --example repo_rate -- FILE.car [PASSES] [verify]`
//! (`verify`: skip the bound, for `perf stat` of verification alone). Also prints the medians of
//! the thread's CPU time (`/proc/thread-self/schedstat`), less disturbed by other processes.
//! Prints the medians (and minima) of the bound and of `verify_repo`'s time, and their ratio: the
//! figures `riptide bench repo` gives, from a binary that builds in a fraction of the time.
use std::hint::black_box;
use std::time::Instant;

/// This thread's time on a CPU so far, in µs (`/proc/thread-self/schedstat`, nanoseconds;
/// 0 where it is missing): unlike wall-clock time, not inflated while other processes run.
fn cpu_us() -> f64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<f64>().ok())
        .map_or(0.0, |ns| ns / 1e3)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let mut args = std::env::args().skip(1);
    let path = args.next().expect("usage: repo_rate FILE.car [PASSES]");
    let passes: usize = args.next().map_or(11, |s| s.parse().expect("PASSES"));
    // `verify`: no bound passes (for `perf stat` of verification alone).
    let bound = args.next().as_deref() != Some("verify");
    // As `riptide bench repo` reads it: an anonymous map asked for huge pages.
    let file = std::fs::read(&path).expect("read");
    let mut map = memmap2::MmapMut::map_anon(file.len()).expect("map");
    if std::env::var_os("NO_HUGE").is_none() {
        map.advise(memmap2::Advice::HugePage).expect("madvise");
    }
    map.copy_from_slice(&file);
    drop(file);
    let bytes = &map[..];
    riptide_repo::verify_repo(bytes, None).expect("verifies");
    if std::env::var_os("PARSE_ONLY").is_some() {
        let mut t = vec![];
        for _ in 0..passes {
            let s = Instant::now();
            let mut r = riptide_car::CarReader::new();
            let opts = riptide_car::CarOptions {
                verify: false,
                ..riptide_car::CarOptions::repository()
            };
            black_box(r.read(bytes, &opts).expect("car").len());
            t.push(s.elapsed().as_secs_f64() * 1e6);
        }
        println!("parse only (no SHA-256): {:.0} us", median(t));
    }
    let (mut sha, mut ver, mut walk, mut car) = (vec![], vec![], vec![], vec![]);
    let (mut sha_cpu, mut ver_cpu) = (vec![], vec![]);
    for _ in 0..passes {
        let (t, c) = (Instant::now(), cpu_us());
        if bound {
            black_box(riptide_sha::sha256(black_box(bytes)));
        }
        sha.push(t.elapsed().as_secs_f64() * 1e6);
        sha_cpu.push(cpu_us() - c);
        let (t, c) = (Instant::now(), cpu_us());
        let r = riptide_repo::verify_repo(black_box(bytes), None).expect("verifies");
        ver.push(t.elapsed().as_secs_f64() * 1e6);
        ver_cpu.push(cpu_us() - c);
        walk.push(r.timings.walk.as_secs_f64() * 1e6);
        car.push(r.timings.car.as_secs_f64() * 1e6);
    }
    let min = |v: &[f64]| v.iter().copied().fold(f64::MAX, f64::min);
    let (smin, vmin) = (min(&sha), min(&ver));
    let (s, v) = (median(sha), median(ver));
    let (sc, vc) = (median(sha_cpu), median(ver_cpu));
    println!(
        "cpu median: bound {sc:.0} us, verify {vc:.0} us, ratio {:.3}",
        sc / vc
    );
    println!(
        "median: bound {s:.0} us, verify {v:.0} us (car {:.0}, walk {:.0}), ratio {:.3}; \
         min: bound {smin:.0}, verify {vmin:.0}, ratio {:.3}",
        median(car),
        median(walk),
        s / v,
        smin / vmin
    );
}
