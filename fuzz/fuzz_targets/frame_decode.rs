//! Firehose frame decoding of arbitrary bytes (`subscribeRepos` binary messages), verified and
//! unverified.
#![no_main]

use libfuzzer_sys::fuzz_target;
use riptide_firehose::{Body, DecodeOptions, FrameDecoder};

fn exercise(dec: &mut FrameDecoder, data: &[u8]) -> bool {
    match dec.decode(data) {
        Ok(frame) => {
            let body = frame.body();
            let _ = (body.kind(), body.seq(), body.did());
            if let Body::Commit(c) = body {
                let _ = c.op_count();
                for op in c.ops() {
                    let _ = (op.collection(), op.rkey());
                }
                let _ = c.blobs().count();
            }
            for i in 0..frame.block_count() {
                let _ = frame.block_value(i);
            }
            let _ = format!("{:?}", frame.header());
            true
        }
        Err(e) => {
            let _ = (e.to_string(), e.class(), e.offset());
            false
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let verified_ok = exercise(&mut FrameDecoder::new(), data);
    let unverified_ok = exercise(&mut FrameDecoder::with_options(DecodeOptions::unverified()), data);
    assert!(!verified_ok || unverified_ok, "unverified decoding refused a frame that verifies");
});
