//! The Sync 1.1 commit proof of arbitrary `#commit` frames: the partial MST loaded from the
//! frame's CAR (blocks verified, and again unverified so that any node bytes reach the tree) and
//! the frame's ops undone on it.
//!
//! Invariants: no panic; a tree reused from another proof (as the firehose verifier reuses one,
//! keeping its nodes' buffers and arena) gives exactly the result of a fresh tree; a proof that
//! inverts to `prevData` does so again on the same tree.
#![no_main]

use libfuzzer_sys::fuzz_target;
use riptide_firehose::{Body, DecodeOptions, FrameDecoder};
use riptide_repo::{verify_commit_proof, verify_commit_proof_in, Tree};

fuzz_target!(|data: &[u8]| {
    for opts in [DecodeOptions::default(), DecodeOptions::unverified()] {
        let mut decoder = FrameDecoder::with_options(opts);
        let Ok(frame) = decoder.decode(data) else {
            continue;
        };
        let (Body::Commit(c), Some(car)) = (frame.body(), frame.car()) else {
            continue;
        };
        let ops = c.proof_ops();
        let summary = |r: Result<riptide_repo::Verified<'_>, riptide_repo::ProofError>| {
            r.map(|v| (v.prev_data, v.prev_data_checked, v.nodes_loaded))
                .map_err(|e| e.to_string())
        };
        let fresh = summary(verify_commit_proof(car, c.commit, &ops, c.prev_data));
        // A tree that went through another proof first: the same frame without its prevData
        // check, which loads the same nodes (and may fail elsewhere, poisoning the tree).
        let mut tree = Tree::new();
        let _ = verify_commit_proof_in(&mut tree, car, c.commit, &ops, None);
        let reused = summary(verify_commit_proof_in(
            &mut tree,
            car,
            c.commit,
            &ops,
            c.prev_data,
        ));
        assert_eq!(fresh, reused, "a reused tree gives a fresh tree's result");
        if fresh.is_ok() {
            let again = summary(verify_commit_proof_in(
                &mut tree,
                car,
                c.commit,
                &ops,
                c.prev_data,
            ));
            assert_eq!(fresh, again, "verification is repeatable");
        }
    }
});
