//! Rows → segment → rows, for arbitrary rows and block boundaries, through both decoders.

#![allow(clippy::unwrap_used)]

mod common;

use proptest::prelude::*;
use riptide_segment::{write_segment, Kind, OwnedRow, Row, Segment};

fn kind() -> impl Strategy<Value = Kind> {
    (1u8..=7).prop_map(|b| Kind::from_u8(b).unwrap())
}

/// Rows with seqs rising (as they must across blocks) and small DID and collection alphabets,
/// so that blocks share DIDs and collections.
fn blocks() -> impl Strategy<Value = Vec<Vec<OwnedRow>>> {
    let row = (
        1u64..1000,
        any::<i64>(),
        prop_oneof![Just(0i64), any::<i64>()],
        kind(),
        prop_oneof![
            Just(String::new()),
            "did:plc:[a-c]{1,3}",
            "did:web:[a-z.]{0,20}"
        ],
        prop_oneof![
            Just(String::new()),
            "app\\.bsky\\.[a-c]{1,2}",
            "[a-z.]{0,255}"
        ],
        "[a-z0-9]{0,13}",
        "[a-z0-9]{0,13}",
        proptest::collection::vec(any::<u8>(), 0..64),
    );
    proptest::collection::vec(proptest::collection::vec(row, 1..12), 0..6).prop_map(|blocks| {
        let mut seq = 0u64;
        blocks
            .into_iter()
            .map(|rows| {
                rows.into_iter()
                    .map(|(gap, w, i, kind, did, collection, rkey, rev, payload)| {
                        seq += gap;
                        OwnedRow {
                            seq,
                            witnessed_at: w,
                            indexed_at: i,
                            kind,
                            did,
                            collection,
                            rkey,
                            rev,
                            payload,
                        }
                    })
                    .collect()
            })
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn rows_survive_a_segment(blocks in blocks()) {
        let views: Vec<Vec<Row<'_>>> =
            blocks.iter().map(|b| b.iter().map(OwnedRow::as_row).collect()).collect();
        let slices: Vec<&[Row<'_>]> = views.iter().map(Vec::as_slice).collect();
        let file = write_segment(&slices).unwrap();
        let seg = Segment::open(&file).unwrap();
        prop_assert_eq!(seg.blocks().len(), blocks.len());
        prop_assert_eq!(seg.header().event_count as usize, blocks.iter().map(Vec::len).sum::<usize>());
        for (i, want) in blocks.iter().enumerate() {
            let body = seg.block_body(i).unwrap();
            let got: Vec<OwnedRow> = seg.rows(i, &body).unwrap().iter().map(Row::to_owned_row).collect();
            prop_assert_eq!(&got, want);
        }
        common::cross_check(&file);
    }
}
