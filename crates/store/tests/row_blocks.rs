//! Layout 5: events appended with their `.jss` rows are sealed as row blocks, and every read
//! gives back, byte for byte, the JSON ingest made of the frames (the oracle: the v1 projection of
//! the frames themselves, which `riptide-jetstream`'s `capture_projection.rs` checks against
//! production Jetstream), across blocks, the in-memory tail, a reopen with rows still unsealed,
//! and a batch without rows among them. The row blocks are also smaller than the JSON blocks of
//! the same events, which is why they exist.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod landing;

use common::{append, generated, read_all, same};
use riptide_store::{Event, Resume, Store, StoreError, StoreOptions, Utf8Text};

fn opts() -> StoreOptions {
    StoreOptions {
        block_events: 200,
        block_bytes: 4 << 20,
        block_cache: 2,
        segment_bytes: None,
    }
}

#[test]
fn events_sealed_as_rows_read_back_as_ingest_made_them_across_a_reopen() {
    let evs = generated();
    let dir = tempfile::tempdir().unwrap();
    // Stop with a part of a block's worth unsealed: their rows wait in `recent_rows`.
    let cut = evs.len() - 150;
    {
        let (s, _) = Store::<Utf8Text>::open_with(dir.path(), 0, opts()).unwrap();
        append(&s, &evs[..cut], 64, |_| false);
        same(&read_all(&s, 1), &evs[..cut]);
    }
    let (s, resume) = Store::<Utf8Text>::open_with(dir.path(), 0, opts()).unwrap();
    assert_eq!(resume.next_seq, cut as u64 + 1);
    append(&s, &evs[cut..], 64, |_| false);
    same(&read_all(&s, 1), evs);
    // From a seq inside a block, too.
    same(&read_all(&s, 777), &evs[776..]);
    let c = s.check().unwrap();
    assert!(c.damaged.is_empty(), "{c:?}");
    assert_eq!(c.blocks, c.row_blocks, "every block is a row block: {c:?}");
    assert!(c.blocks >= 5, "{c:?}");
    assert_eq!(c.events + c.unsealed, evs.len() as u64, "{c:?}");

    // The same events as JSON blocks take more room.
    let json_dir = tempfile::tempdir().unwrap();
    let (j, _) = Store::<Utf8Text>::open_with(json_dir.path(), 0, opts()).unwrap();
    append(&j, evs, 64, |_| true);
    let jc = j.check().unwrap();
    assert_eq!((jc.row_blocks, jc.blocks), (0, c.blocks), "{jc:?}");
    s.flush().unwrap();
    j.flush().unwrap();
    let (rows, json) = (s.disk_usage().block_bytes, j.disk_usage().block_bytes);
    assert!(
        rows * 10 < json * 8,
        "row blocks {rows} bytes, JSON blocks {json}"
    );
}

#[test]
fn a_batch_without_rows_seals_its_block_as_json_and_everything_reads() {
    let evs = generated();
    let dir = tempfile::tempdir().unwrap();
    let (s, _) = Store::<Utf8Text>::open_with(dir.path(), 0, opts()).unwrap();
    // One batch in the second block's worth comes without rows.
    append(&s, evs, 50, |first| (201..=300).contains(&first));
    same(&read_all(&s, 1), evs);
    let c = s.check().unwrap();
    assert!(c.damaged.is_empty(), "{c:?}");
    assert_eq!(c.blocks - c.row_blocks, 1, "one JSON block: {c:?}");
}

#[test]
fn rows_that_do_not_pair_with_their_events_are_refused_and_nothing_is_written() {
    let evs = generated();
    let dir = tempfile::tempdir().unwrap();
    let (s, _) = Store::<Utf8Text>::open_with(dir.path(), 0, opts()).unwrap();
    let events: Vec<Event> = evs[..3].iter().map(|(e, _)| e.clone()).collect();
    let resume = Resume {
        next_seq: 4,
        last_time_us: events[2].time_us(),
        upstream_cursor: Some(3),
    };
    let rows: Vec<_> = evs[..3].iter().map(|(_, r)| r.as_row()).collect();
    let shifted: Vec<_> = evs[1..4].iter().map(|(_, r)| r.as_row()).collect();
    for bad in [&rows[..2], &shifted[..]] {
        let e = s.append_rows(&events, bad, &[], &[], &resume).unwrap_err();
        assert!(matches!(e, StoreError::Rows { .. }), "{e}");
    }
    assert!(read_all(&s, 1).is_empty());
    s.append_rows(&events, &rows, &[], &[], &resume).unwrap();
    same(&read_all(&s, 1), &evs[..3]);
}
