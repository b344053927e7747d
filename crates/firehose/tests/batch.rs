#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `FrameDecoder::decode_batch` against `FrameDecoder::decode`: on the real capture, on tampered
//! and truncated copies of its frames and on random bytes, with every SHA-256 kernel this CPU
//! runs, verified and not, every frame's result is the same frame or the same error.

use std::sync::LazyLock;

use proptest::prelude::*;
use riptide_firehose::corpus::split_frames;
use riptide_firehose::{
    DecodeOptions, Frame, FrameDecoder, FrameError, FrameErrorKind, Kernel, BATCH_FRAMES,
};
use riptide_testdata as common;

/// The real capture's frames (empty without the shared corpus).
static CAPTURE: LazyLock<Vec<Vec<u8>>> = LazyLock::new(|| {
    let Some(file) = common::read("jetstream-2026-07/firehose-frames.bin") else {
        return Vec::new();
    };
    split_frames(&file)
        .unwrap()
        .iter()
        .map(|f| f.bytes.to_vec())
        .collect()
});

/// Everything a caller can see of a result, as text: body, header, payload, every block's
/// bytes and decoded value; or the error.
fn summary(r: Result<Frame<'_>, FrameError>) -> Result<String, FrameError> {
    let f = r?;
    let mut s = format!(
        "{:?}\n{:?}\n{:?}\n{}",
        f.body(),
        f.header(),
        f.payload(),
        f.block_count()
    );
    if let Some(car) = f.car() {
        for (i, b) in car.blocks().enumerate() {
            s += &format!("\n{:?} {:?} {:?}", b.cid, b.data, f.block_value(i));
        }
    }
    Ok(s)
}

/// Every frame through `decode` and through `decode_batch` (each kernel this CPU runs, and the
/// automatic choice), verified and unverified: the results must be identical. Returns the
/// verified per-frame results.
fn same_both_ways(frames: &[&[u8]]) -> Vec<Result<String, FrameError>> {
    let mut verified = Vec::new();
    for opts in [DecodeOptions::default(), DecodeOptions::unverified()] {
        let mut one = FrameDecoder::with_options(opts);
        let want: Vec<_> = frames.iter().map(|f| summary(one.decode(f))).collect();
        let kernels = std::iter::once(None).chain(Kernel::supported().into_iter().map(Some));
        for kernel in kernels {
            let mut dec = FrameDecoder::with_options(opts);
            dec.set_batch_kernel(kernel);
            // Twice with the same decoder: reused state must not leak between calls.
            for _ in 0..2 {
                let mut got = Vec::new();
                dec.decode_batch(frames, |i, r| {
                    assert_eq!(i, got.len());
                    got.push(summary(r));
                });
                assert_eq!(got.len(), want.len());
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(g, w, "frame {i}, {kernel:?}, verify {}", opts.car.verify);
                }
            }
            // The per-frame API on the same decoder still works between batches.
            for (f, w) in frames.iter().zip(&want) {
                assert_eq!(&summary(dec.decode(f)), w);
            }
        }
        if opts.car.verify {
            verified = want;
        }
    }
    verified
}

fn is_mismatch(r: &Result<String, FrameError>) -> bool {
    matches!(r, Err(e) if matches!(e.kind(), FrameErrorKind::Car(c) if c.is_hash_mismatch()))
}

#[test]
fn the_real_capture_decodes_the_same_in_batches() {
    if CAPTURE.is_empty() {
        return;
    }
    let frames: Vec<&[u8]> = CAPTURE.iter().map(|f| &f[..]).collect();
    let got = same_both_ways(&frames);
    assert_eq!(got.len(), 150);
    assert!(got.iter().all(|r| r.is_ok()));
}

#[test]
fn tampered_blocks_in_one_batch_fail_alone_and_in_order() {
    if CAPTURE.is_empty() {
        return;
    }
    // Commit frames, each with a byte flipped in one of its blocks (the block varies), beside
    // clean frames, so batches hold failing and passing frames together; some frames twice
    // tampered (two blocks: the first in file order is the error).
    let mut dec = FrameDecoder::new();
    let mut frames: Vec<Vec<u8>> = Vec::new();
    for (n, f) in CAPTURE.iter().enumerate() {
        let Ok(frame) = dec.decode(f) else { continue };
        let Some(car) = frame.car() else {
            frames.push(f.clone());
            continue;
        };
        let base = car.bytes().as_ptr() as usize - f.as_ptr() as usize;
        let spans: Vec<(usize, usize)> = car
            .blocks()
            .map(|b| (base + b.offset, b.data.len()))
            .collect();
        frames.push(f.clone());
        let mut bad = f.clone();
        let (at, len) = spans[n % spans.len()];
        bad[at + (n * 7) % len] ^= 1 << (n % 8);
        if n % 3 == 0 {
            let (at2, len2) = spans[(n + 1) % spans.len()];
            bad[at2 + len2 - 1] ^= 0x40;
        }
        frames.push(bad);
    }
    let refs: Vec<&[u8]> = frames.iter().map(|f| &f[..]).collect();
    assert!(refs.len() > 4 * BATCH_FRAMES);
    let got = same_both_ways(&refs);
    let mismatches = got.iter().filter(|r| is_mismatch(r)).count();
    assert!(mismatches > 100, "{mismatches}");
    assert!(got.iter().filter(|r| r.is_ok()).count() >= 150);
}

/// A capture frame, tampered as the strategy says.
#[derive(Clone, Debug)]
enum Tamper {
    None,
    Flip { at: usize, bit: u8 },
    Truncate { keep: usize },
    FlipTruncate { at: usize, bit: u8, keep: usize },
    Random(Vec<u8>),
}

fn tamper() -> impl Strategy<Value = (usize, Tamper)> {
    (
        any::<usize>(),
        prop_oneof![
            2 => Just(Tamper::None),
            4 => (any::<usize>(), 0u8..8).prop_map(|(at, bit)| Tamper::Flip { at, bit }),
            1 => any::<usize>().prop_map(|keep| Tamper::Truncate { keep }),
            1 => (any::<usize>(), 0u8..8, any::<usize>())
                .prop_map(|(at, bit, keep)| Tamper::FlipTruncate { at, bit, keep }),
            1 => proptest::collection::vec(any::<u8>(), 0..200).prop_map(Tamper::Random),
        ],
    )
}

fn apply(n: usize, t: &Tamper) -> Vec<u8> {
    let mut f = if CAPTURE.is_empty() {
        vec![0xa2, 0x62, b'o', b'p', 0x01, 0x61, b't', 0x67]
    } else {
        CAPTURE[n % CAPTURE.len()].clone()
    };
    match *t {
        Tamper::None => {}
        Tamper::Flip { at, bit } => {
            let l = f.len();
            f[at % l] ^= 1 << bit;
        }
        Tamper::Truncate { keep } => f.truncate(keep % (f.len() + 1)),
        Tamper::FlipTruncate { at, bit, keep } => {
            let l = f.len();
            f[at % l] ^= 1 << bit;
            f.truncate(keep % (l + 1));
        }
        Tamper::Random(ref r) => f = r.clone(),
    }
    f
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn batches_of_tampered_real_frames_equal_frame_by_frame(
        picks in proptest::collection::vec(tamper(), 0..3 * BATCH_FRAMES + 3)
    ) {
        let frames: Vec<Vec<u8>> = picks.iter().map(|(n, t)| apply(*n, t)).collect();
        let refs: Vec<&[u8]> = frames.iter().map(|f| &f[..]).collect();
        same_both_ways(&refs);
    }
}
