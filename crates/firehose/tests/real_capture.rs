#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The real relay capture (`jetstream-2026-07`): every frame decodes, verified, with the counts of
//! its manifest (which come from an independent decoder), and tampering is caught.

use riptide_testdata as common;

use riptide_firehose::corpus::split_frames;
use riptide_firehose::{Action, Body, DecodeOptions, FrameDecoder, FrameErrorKind};

struct Counts {
    frames: usize,
    commits: usize,
    identity: usize,
    account: usize,
    sync: usize,
    creates: usize,
    updates: usize,
    deletes: usize,
    blocks: usize,
}

fn count(file: &[u8], opts: DecodeOptions) -> Counts {
    let frames = split_frames(file).expect("corpus splits");
    let mut dec = FrameDecoder::with_options(opts);
    let mut c = Counts {
        frames: 0,
        commits: 0,
        identity: 0,
        account: 0,
        sync: 0,
        creates: 0,
        updates: 0,
        deletes: 0,
        blocks: 0,
    };
    for f in &frames {
        let frame = dec
            .decode(f.bytes)
            .unwrap_or_else(|e| panic!("frame {}: {e}", f.index));
        c.frames += 1;
        c.blocks += frame.block_count();
        match frame.body() {
            Body::Commit(commit) => {
                c.commits += 1;
                for op in commit.ops() {
                    match op.action {
                        Action::Create => c.creates += 1,
                        Action::Update => c.updates += 1,
                        Action::Delete => c.deletes += 1,
                    }
                    // Every create/update record is in the CAR and decodes.
                    if let Some(cid) = op.cid {
                        assert!(
                            frame.block_by_cid(cid).is_some(),
                            "frame {} op {}: record missing",
                            f.index,
                            op.path
                        );
                    }
                }
                // The signed commit block is present.
                assert!(frame.block_by_cid(commit.commit).is_some());
            }
            Body::Identity(_) => c.identity += 1,
            Body::Account(_) => c.account += 1,
            Body::Sync(_) => c.sync += 1,
            other => panic!("unexpected {other:?}"),
        }
    }
    c
}

#[test]
fn capture_matches_manifest() {
    let Some(file) = common::read("jetstream-2026-07/firehose-frames.bin") else {
        return;
    };
    let manifest: serde_json::Value =
        serde_json::from_slice(&common::read("jetstream-2026-07/manifest.json").unwrap()).unwrap();
    let m = |k: &str| manifest[k].as_u64().unwrap() as usize;
    for opts in [DecodeOptions::default(), DecodeOptions::unverified()] {
        let c = count(&file, opts);
        assert_eq!(c.frames, m("frames"));
        assert_eq!(c.commits, m("commit_frames"));
        assert_eq!(c.creates, m("creates"));
        assert_eq!(c.updates, m("updates"));
        assert_eq!(c.deletes, m("deletes"));
        assert_eq!(c.identity, m("identity"));
        assert_eq!(c.account, m("account"));
        assert_eq!(c.sync, 0);
        // Counted by an independent decoder (corpus README).
        assert_eq!(c.blocks, 1549);
    }
}

#[test]
fn flipped_block_byte_names_block_and_is_a_cid_mismatch() {
    let Some(file) = common::read("jetstream-2026-07/firehose-frames.bin") else {
        return;
    };
    let frames = split_frames(&file).unwrap();
    let mut dec = FrameDecoder::new();
    // The first commit frame; flip one byte inside its third CAR block.
    let (f, at) = frames
        .iter()
        .find_map(|f| {
            let frame = dec.decode(f.bytes).ok()?;
            let car = frame.car()?;
            let base = car.bytes().as_ptr() as usize - f.bytes.as_ptr() as usize;
            Some((f, base + car.block(2)?.offset + 3))
        })
        .unwrap();
    let mut bytes = f.bytes.to_vec();
    bytes[at] ^= 0x01;
    let Err(err) = dec.decode(&bytes) else {
        panic!("tampered frame decoded")
    };
    assert_eq!(err.class(), "bad-block-cid", "{err}");
    match err.kind() {
        FrameErrorKind::Car(e) => assert!(e.block() == Some(2) && e.is_hash_mismatch()),
        other => panic!("{other:?}"),
    }
    assert!(
        err.to_string().contains("does not hash to its CID"),
        "{err}"
    );
    // With the explicit opt-out the frame decodes (the byte is in record text or a CID).
    let mut lax = FrameDecoder::with_options(DecodeOptions::unverified());
    let _ = lax.decode(&bytes);
}

#[test]
fn every_truncation_of_every_frame_is_a_typed_error() {
    let Some(file) = common::read("jetstream-2026-07/firehose-frames.bin") else {
        return;
    };
    let frames = split_frames(&file).unwrap();
    let mut dec = FrameDecoder::new();
    let mut errors = 0;
    for f in frames.iter().take(20) {
        for cut in (0..f.bytes.len()).step_by(7) {
            if dec.decode(&f.bytes[..cut]).is_err() {
                errors += 1;
            }
        }
    }
    assert!(errors > 100);
}
