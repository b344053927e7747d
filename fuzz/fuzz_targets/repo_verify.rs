//! Whole-repository verification of arbitrary bytes: CAR, commit, MST walk (with key heights
//! checked sixteen at a time), the rebuild from the leaves.
//!
//! Invariants: no panic; a repository that verifies lists exactly its record count through
//! `list_records`, in strictly ascending key order; verification is deterministic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use riptide_car::{CarOptions, CarReader};
use riptide_repo::{list_records, verify_repo};

fuzz_target!(|data: &[u8]| {
    let first = verify_repo(data, None);
    let again = verify_repo(data, None);
    assert_eq!(
        first.as_ref().map(|r| r.records).map_err(|e| e.to_string()),
        again.as_ref().map(|r| r.records).map_err(|e| e.to_string()),
        "verification is deterministic"
    );
    if let Ok(report) = first {
        let mut reader = CarReader::new();
        let car = reader
            .read(data, &CarOptions::repository())
            .expect("a verified repository reads as a CAR");
        let records = list_records(&car).expect("a verified repository lists");
        assert_eq!(records.len(), report.records);
        assert!(records.windows(2).all(|w| w[0].0 < w[1].0), "keys ascend");
    }
});
