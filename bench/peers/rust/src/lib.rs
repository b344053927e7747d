//! Shared plumbing of the Rust peers: corpus readers (formats of shared/docs/formats.md), the pass
//! protocol (warm-up, measured passes, median/min/max of rates) and the summary row printed as JSON.

use std::time::Instant;

/// Warm-up and measured passes, from `--warmup N --passes N` (defaults 2 and 5).
pub struct Opts {
    pub warmup: usize,
    pub passes: usize,
    /// repo: verifications per pass.
    pub repeat: usize,
    pub args: Vec<String>,
}

pub fn opts() -> Opts {
    let mut o = Opts {
        warmup: 2,
        passes: 5,
        repeat: 1,
        args: Vec::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--warmup" => o.warmup = it.next().and_then(|v| v.parse().ok()).expect("--warmup N"),
            "--passes" => o.passes = it.next().and_then(|v| v.parse().ok()).expect("--passes N"),
            "--repeat" => o.repeat = it.next().and_then(|v| v.parse().ok()).expect("--repeat N"),
            _ => o.args.push(a),
        }
    }
    o
}

/// Runs `f` for the warm-up and measured passes; rates are `work` per second.
pub fn measure(o: &Opts, work: f64, mut f: impl FnMut()) -> (f64, f64, f64) {
    for _ in 0..o.warmup {
        f();
    }
    let mut rates: Vec<f64> = (0..o.passes)
        .map(|_| {
            let t = Instant::now();
            f();
            work / t.elapsed().as_secs_f64()
        })
        .collect();
    rates.sort_by(|a, b| a.total_cmp(b));
    let n = rates.len();
    let med = if n % 2 == 1 {
        rates[n / 2]
    } else {
        (rates[n / 2 - 1] + rates[n / 2]) / 2.0
    };
    (med, rates[0], rates[n - 1])
}

#[allow(clippy::too_many_arguments)]
pub fn emit(
    benchmark: &str,
    sdk: &str,
    variant: &str,
    unit: &str,
    r: (f64, f64, f64),
    bpf: Option<f64>,
    errors: usize,
) {
    let row = serde_json::json!({
        "benchmark": benchmark, "sdk": sdk, "variant": variant, "unit": unit,
        "median": r.0, "min": r.1, "max": r.2, "blocks_per_frame": bpf, "errors": errors,
    });
    println!("{row}");
}

fn be32(b: &[u8], at: usize) -> usize {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]) as usize
}

/// The frames of a frame corpus.
pub fn frames(data: &[u8]) -> Vec<&[u8]> {
    let n = be32(data, 0);
    let mut off = 4;
    (0..n)
        .map(|_| {
            let l = be32(data, off);
            off += 4 + l;
            &data[off - l..off]
        })
        .collect()
}

/// One signature corpus entry: curve (0 = P-256, 1 = secp256k1), signed commit, compressed key.
pub struct SigEntry<'a> {
    pub k256: bool,
    pub signed: &'a [u8],
    pub pubkey: &'a [u8],
}

pub fn sig_entries(data: &[u8]) -> Vec<SigEntry<'_>> {
    let n = be32(data, 0);
    let mut off = 4;
    (0..n)
        .map(|_| {
            let k256 = data[off] == 1;
            let l = u16::from_be_bytes([data[off + 1], data[off + 2]]) as usize;
            let signed = &data[off + 3..off + 3 + l];
            off += 3 + l;
            let l = u16::from_be_bytes([data[off], data[off + 1]]) as usize;
            let pubkey = &data[off + 2..off + 2 + l];
            off += 2 + l;
            SigEntry {
                k256,
                signed,
                pubkey,
            }
        })
        .collect()
}

pub fn read(path: &str) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("{path}: {e}"))
}
