//! `FrameDecoder::decode_batch` against `FrameDecoder::decode` on arbitrary bytes cut into
//! frames: every frame's result (frame or error) must be the same both ways.
#![no_main]

use libfuzzer_sys::fuzz_target;
use riptide_firehose::{DecodeOptions, Frame, FrameDecoder, FrameError};

/// What a caller sees of a result, as text.
fn summary(r: Result<Frame<'_>, FrameError>) -> Result<String, FrameError> {
    let f = r?;
    let mut s = format!("{:?} {:?} {:?}", f.body(), f.payload(), f.block_count());
    for i in 0..f.block_count() {
        s += &format!(" {:?}", f.block_value(i));
    }
    Ok(s)
}

fuzz_target!(|data: &[u8]| {
    // Frames are separated by the byte sequence 0xff 0xfe (rare inside a frame), so seeds made
    // of real frames joined that way (seed.sh) keep their frames whole.
    let mut frames: Vec<&[u8]> = Vec::new();
    let mut rest = data;
    while let Some(i) = rest.windows(2).position(|w| w == [0xff, 0xfe]) {
        frames.push(&rest[..i]);
        rest = &rest[i + 2..];
    }
    frames.push(rest);
    for opts in [DecodeOptions::default(), DecodeOptions::unverified()] {
        let mut one = FrameDecoder::with_options(opts);
        let want: Vec<_> = frames.iter().map(|f| summary(one.decode(f))).collect();
        let mut got = Vec::new();
        FrameDecoder::with_options(opts).decode_batch(&frames, |i, r| {
            assert_eq!(i, got.len());
            got.push(summary(r));
        });
        assert_eq!(got, want);
    }
});
