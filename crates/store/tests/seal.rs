//! Sealing (issue 38, `docs/archive.md` "Sealing"): row blocks become `.jss` segment files once
//! they reach `segment_bytes`, and replays from any cursor read old seqs back from those files,
//! byte for byte what ingest made (the oracle: the v1 projection of the generated frames, as in
//! `row_blocks.rs`). Each file is checked with the format crate's own reader against the rows
//! ingest handed the store. Then every crash point of a seal, by hook and by `kill -9` of a child
//! process: no half-written segment is ever named, nothing is lost and nothing repeated.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;

use common::{append, generated, read_all, same};
use riptide_segment::{OwnedRow, Segment};
use riptide_store::{Event, SealPoint, Store, StoreError, StoreOptions, Utf8Text};

/// Segments of a few 200-event blocks: the generated stream seals several.
const SEGMENT_BYTES: u64 = 20_000;

fn opts() -> StoreOptions {
    StoreOptions {
        block_events: 200,
        block_bytes: 4 << 20,
        block_cache: 2,
        segment_bytes: Some(SEGMENT_BYTES),
    }
}

/// Appends `evs` in batches of `batch` and seals after each, as the server's seal loop does.
fn append_sealing(s: &Store, evs: &[(Event, OwnedRow)], batch: usize) -> usize {
    let mut sealed = 0;
    for chunk in evs.chunks(batch) {
        append(s, chunk, batch, |_| false);
        sealed += s.seal_segments().unwrap().len();
    }
    sealed
}

/// Every sealed file opens with the format crate's reader, its name is its entry's, its rows are
/// exactly the rows ingest handed for those seqs, and the files and `blocks` do not overlap.
/// Returns the seqs the segments hold, in order.
fn check_files(s: &Store, evs: &[(Event, OwnedRow)]) -> Vec<u64> {
    let mut seqs = Vec::new();
    let entries = s.segment_entries();
    for w in entries.windows(2) {
        assert!(w[0].index < w[1].index && w[0].max_seq < w[1].min_seq);
    }
    for e in &entries {
        let bytes = std::fs::read(s.segment_path(e)).unwrap();
        let seg = Segment::open(&bytes).unwrap();
        assert_eq!(
            (
                seg.header().checksum,
                seg.header().min_seq,
                seg.header().max_seq
            ),
            (e.checksum, e.min_seq, e.max_seq)
        );
        for b in 0..seg.blocks().len() {
            let body = seg.block_body(b).unwrap();
            for r in seg.rows(b, &body).unwrap() {
                let want = &evs[r.seq as usize - 1].1;
                assert_eq!(r.to_owned_row(), *want, "seq {}", r.seq);
                seqs.push(r.seq);
            }
        }
    }
    assert!(
        seqs.windows(2).all(|w| w[0] < w[1]),
        "no seq twice, in order"
    );
    seqs
}

fn tmp_files(data: &Path) -> usize {
    std::fs::read_dir(data.join("segments/tmp")).map_or(0, |d| d.count())
}

#[test]
fn row_blocks_seal_into_segments_and_replays_read_them_as_ingest_made_them() {
    let evs = generated();
    let dir = tempfile::tempdir().unwrap();
    let cut = evs.len() - 150;
    {
        let (s, _) = Store::<Utf8Text>::open_with(dir.path(), 0, opts()).unwrap();
        let sealed = append_sealing(&s, &evs[..cut], 64);
        eprintln!("{} events, {sealed} segments", evs.len());
        assert!(sealed >= 3, "{sealed} segments");
        assert!(!s.seal_due(), "sealed until below segment_bytes");
        same(&read_all(&s, 1), &evs[..cut]);
        check_files(&s, evs);
    }
    let (s, resume) = Store::<Utf8Text>::open_with(dir.path(), 0, opts()).unwrap();
    assert_eq!(resume.next_seq, cut as u64 + 1);
    append_sealing(&s, &evs[cut..], 64);
    // From the start, and from seqs inside a segment's block and inside a later segment.
    same(&read_all(&s, 1), evs);
    same(&read_all(&s, 777), &evs[776..]);
    let in_segments = check_files(&s, evs);
    let last_sealed = *in_segments.last().unwrap() as usize;
    same(&read_all(&s, 3), &evs[2..]);
    assert_eq!(in_segments, (1..=last_sealed as u64).collect::<Vec<_>>());
    // `blocks` holds only what is above the newest segment, and less than a segment's worth.
    assert!(s.live_row_bytes() < SEGMENT_BYTES, "{}", s.live_row_bytes());
    let c = s.check().unwrap();
    assert!(c.damaged.is_empty(), "{c:?}");
    assert!(c.segments >= 3 && c.blocks < c.segment_blocks, "{c:?}");
    assert_eq!(c.blocks as usize, s.block_count().unwrap());
    assert_eq!(
        c.events + c.unsealed,
        evs.len() as u64,
        "check counts the segments' events too: {c:?}"
    );
    assert_eq!(tmp_files(dir.path()), 0);
}

#[test]
fn a_json_block_among_row_blocks_stays_in_blocks_and_everything_reads_in_order() {
    let evs = generated();
    let dir = tempfile::tempdir().unwrap();
    let (s, _) = Store::<Utf8Text>::open_with(dir.path(), 0, opts()).unwrap();
    // The third block's worth comes without rows: sealed as JSON, it cannot go into a segment.
    for chunk in evs.chunks(50) {
        append(&s, chunk, 50, |first| (401..=600).contains(&first));
        s.seal_segments().unwrap();
    }
    same(&read_all(&s, 1), evs);
    same(&read_all(&s, 450), &evs[449..]);
    let in_segments = check_files(&s, evs);
    assert!(!in_segments.is_empty());
    // The JSON block's seqs are in no segment; a segment ends before it, the next starts after.
    assert!(!in_segments.iter().any(|q| (401..=600).contains(q)));
    assert!(in_segments.contains(&400) && in_segments.contains(&601));
    let c = s.check().unwrap();
    assert_eq!(c.blocks - c.row_blocks, 1, "the JSON block stays: {c:?}");
    assert_eq!(c.events + c.unsealed, evs.len() as u64, "{c:?}");
    drop(s);
    let (s, _) = Store::<Utf8Text>::open_with(dir.path(), 0, opts()).unwrap();
    same(&read_all(&s, 1), evs);
}

/// Seals everything but stops at `point` of the second seal; then a reopen, and sealing again.
fn crash_then_recover(point: SealPoint) {
    let evs = generated();
    let dir = tempfile::tempdir().unwrap();
    {
        let big = StoreOptions {
            segment_bytes: None,
            ..opts()
        };
        let (s, _) = Store::<Utf8Text>::open_with(dir.path(), 0, big).unwrap();
        append(&s, evs, 64, |_| false);
    }
    {
        let (s, _) = Store::<Utf8Text>::open_with(dir.path(), 0, opts()).unwrap();
        s.seal_crash_at(move |p, index| p == point && index == 1);
        let e = s.seal_segments().unwrap_err();
        assert!(matches!(e, StoreError::SealCrashed(p) if p == point), "{e}");
        same(&read_all(&s, 1), evs);
    }
    let (s, _) = Store::<Utf8Text>::open_with(dir.path(), 0, opts()).unwrap();
    assert_eq!(tmp_files(dir.path()), 0, "{point:?}");
    let want = match point {
        SealPoint::TmpWritten => 1,
        SealPoint::Renamed | SealPoint::Committed => 2,
    };
    assert_eq!(s.segment_entries().len(), want, "{point:?}");
    same(&read_all(&s, 1), evs);
    s.seal_segments().unwrap();
    assert!(s.segment_entries().len() >= 3);
    same(&read_all(&s, 1), evs);
    let seqs = check_files(&s, evs);
    assert_eq!(seqs[0], 1);
    assert_eq!(
        seqs.len() as u64,
        *seqs.last().unwrap(),
        "{point:?}: nothing lost"
    );
}

#[test]
fn a_seal_stopped_with_its_file_in_tmp_is_undone() {
    crash_then_recover(SealPoint::TmpWritten);
}

#[test]
fn a_seal_stopped_after_the_rename_is_adopted() {
    crash_then_recover(SealPoint::Renamed);
}

#[test]
fn a_seal_stopped_after_its_batch_is_done() {
    crash_then_recover(SealPoint::Committed);
}

/// Files no entry names: one that starts where the unsealed row blocks start is taken for a
/// seal's and removed when its frames are not theirs; one that does not (copied in) is left as
/// it is, and seals never overwrite it.
#[test]
fn files_no_entry_names_are_removed_if_a_seals_else_left_alone() {
    let evs = generated();
    let dir = tempfile::tempdir().unwrap();
    {
        let unsealing = StoreOptions {
            segment_bytes: None,
            ..opts()
        };
        let (s, _) = Store::<Utf8Text>::open_with(dir.path(), 0, unsealing).unwrap();
        append(&s, &evs[..1000], 64, |_| false);
    }
    let segments = dir.path().join("segments");
    std::fs::create_dir_all(&segments).unwrap();
    let file = |rows: &[(Event, OwnedRow)]| {
        let rows: Vec<_> = rows.iter().map(|(_, r)| r.as_row()).collect();
        riptide_segment::write_segment(&[&rows]).unwrap()
    };
    // Seqs 1..=10 in one block: where the blocks start, but not their frames.
    let ours = segments.join(riptide_segment::segment_name(0));
    std::fs::write(&ours, file(&evs[..10])).unwrap();
    // The last three events, as someone else's file.
    let theirs = segments.join(riptide_segment::segment_name(5));
    let foreign = file(&evs[evs.len() - 3..]);
    std::fs::write(&theirs, &foreign).unwrap();

    let (s, _) = Store::<Utf8Text>::open_with(dir.path(), 0, opts()).unwrap();
    assert!(!ours.exists());
    assert_eq!(std::fs::read(&theirs).unwrap(), foreign);
    assert!(s.segment_entries().is_empty());
    same(&read_all(&s, 1), &evs[..1000]);
    let sealed = s.seal_segments().unwrap();
    assert!(!sealed.is_empty());
    assert_eq!(sealed[0].index, 6, "past the file copied in");
    assert_eq!(std::fs::read(&theirs).unwrap(), foreign);
    same(&read_all(&s, 1), &evs[..1000]);
}

/// The child of [`kill_9_during_a_seal_loses_and_repeats_nothing`]: seals the directory it is
/// given and, at the named point of the second seal, says so in a file and waits to be killed.
#[test]
fn seal_kill_9_child() {
    let (Some(dir), Some(point)) = (
        std::env::var_os("RIPTIDE_SEAL_CHILD_DIR"),
        std::env::var("RIPTIDE_SEAL_CHILD_POINT").ok(),
    ) else {
        return;
    };
    let dir = std::path::PathBuf::from(dir);
    let point = match point.as_str() {
        "tmp" => SealPoint::TmpWritten,
        "renamed" => SealPoint::Renamed,
        _ => SealPoint::Committed,
    };
    let (s, _) = Store::<Utf8Text>::open_with(&dir, 0, opts()).unwrap();
    let marker = dir.join("at-point");
    s.seal_crash_at(move |p, index| {
        if p == point && index == 1 {
            std::fs::write(&marker, b"").unwrap();
            loop {
                std::thread::sleep(std::time::Duration::from_secs(1));
            }
        }
        false
    });
    s.seal_segments().unwrap();
    panic!("the seal ended without reaching {point:?}");
}

/// Each crash point with a real `kill -9` of a child process (this test binary, re-run as
/// [`seal_kill_9_child`]) stopped there: the store reopens, seals the rest, and a replay from
/// cursor 0 gives every event once, as ingest made it.
#[test]
fn kill_9_during_a_seal_loses_and_repeats_nothing() {
    let evs = generated();
    for point in ["tmp", "renamed", "committed"] {
        let dir = tempfile::tempdir().unwrap();
        {
            let unsealing = StoreOptions {
                segment_bytes: None,
                ..opts()
            };
            let (s, _) = Store::<Utf8Text>::open_with(dir.path(), 0, unsealing).unwrap();
            append(&s, evs, 64, |_| false);
        }
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "seal_kill_9_child", "--nocapture"])
            .env("RIPTIDE_SEAL_CHILD_DIR", dir.path())
            .env("RIPTIDE_SEAL_CHILD_POINT", point)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        // Poll for the child to reach the point (generous: two busy cores).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
        while !dir.path().join("at-point").exists() {
            if let Some(status) = child.try_wait().unwrap() {
                panic!("{point}: the child ended first: {status}");
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{point}: no crash point"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();

        // The directory lock is released with the process.
        let (s, _) = Store::<Utf8Text>::open_with(dir.path(), 0, opts()).unwrap();
        assert_eq!(tmp_files(dir.path()), 0, "{point}");
        let want = if point == "tmp" { 1 } else { 2 };
        assert_eq!(s.segment_entries().len(), want, "{point}");
        same(&read_all(&s, 1), evs);
        s.seal_segments().unwrap();
        same(&read_all(&s, 1), evs);
        let seqs = check_files(&s, evs);
        assert_eq!(seqs.len() as u64, *seqs.last().unwrap(), "{point}");
    }
}

/// Retention in a sealing store (`docs/archive.md`, "Retention"): the floor is the live floor,
/// never above the newest segment's first seq, and nothing is deleted: every segment and block
/// stays, and a replay from the floor reads on as ingest made it.
#[test]
fn retention_moves_the_live_floor_and_deletes_nothing() {
    let evs = generated();
    let dir = tempfile::tempdir().unwrap();
    let (s, _) = Store::<Utf8Text>::open_with(dir.path(), 0, opts()).unwrap();
    append_sealing(&s, evs, 64);
    let (entries, blocks) = (s.segment_entries(), s.block_count().unwrap());
    let newest = entries.last().unwrap().clone();
    // A cutoff past every event: the retention floor would be past the end.
    let x = s
        .expire(i64::MAX, std::time::Duration::from_secs(1))
        .unwrap();
    assert_eq!(x.floor, newest.min_seq);
    assert_eq!(s.floor(), newest.min_seq);
    assert_eq!(s.catalog().live_floor(u64::MAX).unwrap(), newest.min_seq);
    assert_eq!(
        (s.segment_entries(), s.block_count().unwrap()),
        (entries, blocks)
    );
    let from = newest.min_seq as usize;
    same(&read_all(&s, 1), &evs[from - 1..]);
    check_files(&s, evs);
}
