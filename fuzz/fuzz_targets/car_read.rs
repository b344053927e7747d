//! CAR v1 reading of arbitrary bytes, with block verification on and off.
//!
//! Invariants: with verification on, every block returned hashes to its CID; the verified and the
//! unverified read agree whenever the verified one succeeds; every block is found by its CID.
#![no_main]

use libfuzzer_sys::fuzz_target;
use riptide_car::{verify_block, CarOptions, CarReader};

fuzz_target!(|data: &[u8]| {
    let mut verified = CarReader::new();
    let mut unverified = CarReader::new();
    let on = verified.read(data, &CarOptions::default());
    let off = unverified.read(data, &CarOptions { verify: false, ..CarOptions::default() });
    match (&on, &off) {
        (Ok(a), Ok(b)) => {
            assert_eq!(a.len(), b.len());
            let _ = a.roots().count();
            for (i, blk) in a.blocks().enumerate() {
                verify_block(blk.cid, blk.data).expect("a verified read returned a bad block");
                assert_eq!(b.block(i), Some(blk));
                let first = a.position(blk.cid).expect("every block is found by its CID");
                assert!(first <= i);
                assert_eq!(a.get(blk.cid).map(|d| d.len()), a.block(first).map(|x| x.data.len()));
            }
        }
        (Ok(_), Err(e)) => panic!("unverified read failed where verified succeeded: {e}"),
        (Err(e), _) => {
            let _ = e.to_string();
        }
    }
    if let Ok(b) = &off {
        for blk in b.blocks() {
            let _ = b.position(blk.cid);
        }
    }
});
