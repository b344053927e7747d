//! Folding the archive (issue 38): segments built from real events (the relay capture) and a
//! generated stream with updates, deletes and `#sync`, plus deleted accounts, are compacted by
//! [`Folder::pass`], and every file is then checked against an independent fold written here from
//! the format alone: the original files decoded by the format crate's second decoder (shared
//! test code, no store or writer code), the tombstones computed from those rows by this test's
//! own rules, and the expected survivors compared block by block with what the compacted files
//! hold. Each crash point of a pass is then hit, the store "restarted" (a new keyspace handle,
//! [`Folder::recover`]) and folded again, to the same files.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "../../segment/tests/common/independent.rs"]
mod independent;

use std::collections::HashMap;
use std::path::Path;

use riptide_firehose::corpus::split_frames;
use riptide_firehose::FrameDecoder;
use riptide_jetstream::{EventRowKind, Projector, StoredRow};
use riptide_segment::{OwnedRow, Row, Segment};
use riptide_store::compact::{CompactError, CrashPoint, Folder};
use riptide_store::tombstones::derive_stored;

const BLOCK_ROWS: usize = 150;
const SEGMENT_BLOCKS: usize = 6;

/// The frames: the capture (when the corpus is there) then a generated stream; made once.
fn frames() -> &'static [Vec<u8>] {
    static FRAMES: std::sync::OnceLock<Vec<Vec<u8>>> = std::sync::OnceLock::new();
    FRAMES.get_or_init(|| {
        let mut out = Vec::new();
        if let Some(file) = riptide_testdata::read("jetstream-2026-07/firehose-frames.bin") {
            out.extend(
                split_frames(&file)
                    .unwrap()
                    .iter()
                    .map(|f| f.bytes.to_vec()),
            );
        }
        let mut config = riptide_gen::Config::new(38, 60, 3_000);
        config.threads = 2;
        // Small starting repositories: the stream's updates and deletes are what matter here.
        config.initial_records = (5, 40);
        let mut net = riptide_gen::Network::new(config).unwrap();
        net.run(|f: &[u8]| -> Result<(), riptide_gen::GenError> {
            out.push(f.to_vec());
            Ok(())
        })
        .unwrap();
        out
    })
}

/// Builds `DATA/segments` and its entries and tombstones as ingest and sealing would: rows of
/// every frame's events, seqs from 1, one tombstone write per block-sized ingest batch; three
/// accounts deleted near the end. Returns the segment files' original bytes.
fn build(data: &Path) -> Vec<Vec<u8>> {
    let raw = frames();
    let mut dec = FrameDecoder::new();
    let mut projector = Projector::with_sync();
    let (mut rows, mut tombstones, mut dids) = (Vec::new(), Vec::new(), Vec::<String>::new());
    let witnessed = |seq: u64| 1_764_000_000_000_000 + seq as i64 * 1_000;
    // Each frame's rows with their seqs, and their tombstones as the ingest batch derives them.
    let push = |stored: &[StoredRow<'_>], rows: &mut Vec<OwnedRow>, tombstones: &mut Vec<_>| {
        let first = rows.len() as u64 + 1;
        let seqd: Vec<(u64, &StoredRow<'_>)> = stored
            .iter()
            .enumerate()
            .map(|(i, r)| (first + i as u64, r))
            .collect();
        tombstones.extend(derive_stored(seqd.iter().copied()).unwrap());
        rows.extend(
            seqd.iter()
                .map(|&(seq, r)| r.row(seq, witnessed(seq)).to_owned_row()),
        );
    };
    for (i, bytes) in raw.iter().enumerate() {
        if i == raw.len() * 3 / 4 {
            // Three accounts that have rows are deleted, three quarters of the way in.
            let payloads: Vec<(String, Vec<u8>)> = dids[..3]
                .iter()
                .map(|d| (d.clone(), common::account(d, false, "deleted")))
                .collect();
            let stored: Vec<StoredRow<'_>> = payloads
                .iter()
                .map(|(did, payload)| StoredRow::Event {
                    kind: EventRowKind::Account,
                    did,
                    payload,
                })
                .collect();
            push(&stored, &mut rows, &mut tombstones);
        }
        let Ok(frame) = dec.decode(bytes) else {
            continue;
        };
        let p = projector.project(&frame);
        let stored = p.stored_rows(&frame).unwrap();
        for r in &stored {
            if let StoredRow::Commit { did, .. } = r {
                if !dids.iter().any(|d| d == did) {
                    dids.push(did.to_string());
                }
            }
        }
        push(&stored, &mut rows, &mut tombstones);
    }

    let ks = fjall::Config::new(data.join("fjall")).open().unwrap();
    let folder = Folder::new(&ks, &data.join("segments")).unwrap();
    let rows: Vec<Row<'_>> = rows.iter().map(OwnedRow::as_row).collect();
    let files = common::write_segments(
        &data.join("segments"),
        &rows,
        0,
        (BLOCK_ROWS, SEGMENT_BLOCKS),
        |entry| {
            let mut b = ks.batch();
            folder.catalog().put(&mut b, entry);
            b.commit().unwrap();
        },
    );
    for batch in tombstones.chunks(64) {
        let mut b = ks.batch();
        folder.tombstones().write(&mut b, batch);
        b.commit().unwrap();
    }
    files
}

/// The independent fold: which rows of the original files survive, per file and block.
fn expected(files: &[Vec<u8>]) -> Vec<Vec<Vec<independent::IRow>>> {
    let decoded: Vec<independent::IFile> = files
        .iter()
        .map(|f| independent::decode(f).expect("original decodes"))
        .collect();
    let (mut records, mut dids) = (HashMap::new(), HashMap::new());
    let deleted: &[u8] = b"\x66active\xf4\x66status\x67deleted";
    for r in decoded.iter().flat_map(|f| &f.blocks).flat_map(|b| &b.rows) {
        let key = (r.did.clone(), r.collection.clone(), r.rkey.clone());
        let slot = match r.kind {
            2 | 3 => records.entry(key).or_insert(0u64),
            6 => dids.entry(r.did.clone()).or_insert(0u64),
            5 if r.payload.windows(deleted.len()).any(|w| w == deleted) => {
                dids.entry(r.did.clone()).or_insert(0u64)
            }
            _ => continue,
        };
        *slot = (*slot).max(r.seq);
    }
    assert!(
        dids.len() >= 3 && records.len() > 10,
        "{} {}",
        dids.len(),
        records.len()
    );
    decoded
        .iter()
        .map(|f| {
            f.blocks
                .iter()
                .map(|b| {
                    b.rows
                        .iter()
                        .filter(|r| {
                            let gone = matches!(r.kind, 1 | 2 | 7)
                                && (dids.get(&r.did).is_some_and(|&s| s > r.seq)
                                    || records
                                        .get(&(r.did.clone(), r.collection.clone(), r.rkey.clone()))
                                        .is_some_and(|&s| s > r.seq));
                            !gone
                        })
                        .cloned()
                        .collect()
                })
                .collect()
        })
        .collect()
}

/// Every segment in `data` is the independent fold of its original, topology kept, and its entry
/// names it.
fn check_folded(data: &Path, originals: &[Vec<u8>], want: &[Vec<Vec<independent::IRow>>]) -> usize {
    let ks = fjall::Config::new(data.join("fjall")).open().unwrap();
    let folder = Folder::new(&ks, &data.join("segments")).unwrap();
    let entries = folder.catalog().entries().unwrap();
    assert_eq!(entries.len(), originals.len());
    let mut rewritten = 0;
    for (e, (orig, want)) in entries.iter().zip(originals.iter().zip(want)) {
        let now = std::fs::read(data.join("segments").join(e.name())).unwrap();
        let seg = Segment::open(&now).expect("the folded file verifies");
        assert_eq!(seg.header().checksum, e.checksum, "{}", e.name());
        let (o, n) = (
            independent::decode(orig).unwrap(),
            independent::decode(&now).unwrap(),
        );
        assert!(n.checksum_ok);
        assert_eq!((n.seq, n.time), (o.seq, o.time), "header bounds kept");
        assert_eq!(n.blocks.len(), o.blocks.len(), "block topology kept");
        let changed = o
            .blocks
            .iter()
            .zip(want)
            .any(|(b, w)| b.rows.len() != w.len());
        assert_eq!(e.generation, u32::from(changed), "{}", e.name());
        rewritten += usize::from(changed);
        for ((ob, nb), w) in o.blocks.iter().zip(&n.blocks).zip(want) {
            assert_eq!((nb.seq, nb.time), (ob.seq, ob.time), "envelope kept");
            assert_eq!(nb.rows, *w, "{} block at {}", e.name(), ob.offset);
            assert_eq!(nb.count as usize, w.len());
            if ob.rows.len() == w.len() {
                let frame = |f: &[u8], b: &independent::IBlock| {
                    f[b.offset as usize + 8..][..b.csize as usize].to_vec()
                };
                assert_eq!(frame(&now, nb), frame(orig, ob), "untouched frame kept");
            }
        }
    }
    rewritten
}

#[test]
fn a_pass_folds_every_segment_as_the_independent_fold_and_a_second_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let originals = build(dir.path());
    assert!(originals.len() >= 4, "{} segments", originals.len());
    let want = expected(&originals);
    let dropped: usize = originals
        .iter()
        .zip(&want)
        .map(|(f, w)| {
            let o = independent::decode(f).unwrap();
            o.blocks.iter().map(|b| b.rows.len()).sum::<usize>()
                - w.iter().map(Vec::len).sum::<usize>()
        })
        .sum();
    assert!(dropped > 50, "the stream supersedes rows: {dropped}");

    let last = {
        let ks = fjall::Config::new(dir.path().join("fjall")).open().unwrap();
        let folder = Folder::new(&ks, &dir.path().join("segments")).unwrap();
        let pass = folder.pass().unwrap();
        assert_eq!(pass.rows_dropped as usize, dropped);
        assert_eq!(pass.from_seq, 0);
        assert_eq!(folder.compaction_seq().unwrap(), pass.to_seq);
        assert!(!pass.rewritten.is_empty());
        // Nothing above the new compaction_seq: the next pass does nothing.
        let again = folder.pass().unwrap();
        assert_eq!((again.rows_dropped, again.segments), (0, 0));
        pass
    };
    assert_eq!(
        check_folded(dir.path(), &originals, &want),
        last.rewritten.len()
    );

    // Idempotent: the same tombstones applied again (compaction_seq back to 0) drop nothing.
    let ks = fjall::Config::new(dir.path().join("fjall")).open().unwrap();
    let meta = ks
        .open_partition("meta", fjall::PartitionCreateOptions::default())
        .unwrap();
    meta.insert(riptide_store::compact::COMPACTION_SEQ, 0u64.to_be_bytes())
        .unwrap();
    let folder = Folder::new(&ks, &dir.path().join("segments")).unwrap();
    let again = folder.pass().unwrap();
    assert_eq!((again.rows_dropped, again.rewritten.len()), (0, 0));
}

#[test]
fn every_crash_point_recovers_to_the_same_fold() {
    for point in [
        CrashPoint::TmpWritten,
        CrashPoint::Renamed,
        CrashPoint::EntryUpdated,
    ] {
        let dir = tempfile::tempdir().unwrap();
        let originals = build(dir.path());
        let want = expected(&originals);
        let crashed_at = {
            let ks = fjall::Config::new(dir.path().join("fjall")).open().unwrap();
            let mut folder = Folder::new(&ks, &dir.path().join("segments")).unwrap();
            // Stop at the second segment the pass rewrites.
            let seen = std::sync::Mutex::new(Vec::new());
            folder.crash_at(move |p, index| {
                let mut s = seen.lock().unwrap();
                if p == point && !s.contains(&index) {
                    s.push(index);
                }
                p == point && s.len() == 2
            });
            match folder.pass() {
                Err(CompactError::Crashed(p)) => assert_eq!(p, point),
                other => panic!("{point:?}: {other:?}"),
            }
            assert_eq!(folder.compaction_seq().unwrap(), 0, "{point:?}");
            // What a server would see now: every entry's file verifies; only after a rename
            // whose entry is not written yet does a file's checksum differ from its entry's.
            let mut differs = 0;
            for e in folder.catalog().entries().unwrap() {
                let f = std::fs::read(dir.path().join("segments").join(e.name())).unwrap();
                let seg = Segment::open(&f).expect("no half-written segment is named");
                differs += usize::from(seg.header().checksum != e.checksum);
            }
            assert_eq!(
                differs,
                usize::from(point == CrashPoint::Renamed),
                "{point:?}"
            );
            let tmp = std::fs::read_dir(dir.path().join("segments/tmp"))
                .unwrap()
                .count();
            assert_eq!(
                tmp,
                usize::from(point == CrashPoint::TmpWritten),
                "{point:?}"
            );
            point
        };
        // Restart: recover, then pass again.
        let ks = fjall::Config::new(dir.path().join("fjall")).open().unwrap();
        let folder = Folder::new(&ks, &dir.path().join("segments")).unwrap();
        let rec = folder.recover().unwrap();
        assert_eq!(
            (rec.tmp_removed, rec.refreshed.len()),
            (
                usize::from(crashed_at == CrashPoint::TmpWritten),
                usize::from(crashed_at == CrashPoint::Renamed)
            ),
            "{crashed_at:?}"
        );
        let pass = folder.pass().unwrap();
        assert!(folder.compaction_seq().unwrap() > 0);
        drop((folder, ks));
        let rewritten = check_folded(dir.path(), &originals, &want);
        // The segments folded before the crash are not rewritten again.
        assert!(pass.rewritten.len() < rewritten, "{crashed_at:?}");
    }
}

/// The child of [`kill_9_at_every_crash_point_recovers_to_the_same_fold`]: runs a pass over the
/// directory it is given and, at the named point of the second segment rewritten, says so in a
/// file and waits to be killed.
#[test]
fn kill_9_child() {
    let (Some(dir), Some(point)) = (
        std::env::var_os("RIPTIDE_FOLD_CHILD_DIR"),
        std::env::var("RIPTIDE_FOLD_CHILD_POINT").ok(),
    ) else {
        return;
    };
    let dir = std::path::PathBuf::from(dir);
    let point = match point.as_str() {
        "tmp" => CrashPoint::TmpWritten,
        "renamed" => CrashPoint::Renamed,
        _ => CrashPoint::EntryUpdated,
    };
    let ks = fjall::Config::new(dir.join("fjall")).open().unwrap();
    let mut folder = Folder::new(&ks, &dir.join("segments")).unwrap();
    let seen = std::sync::Mutex::new(0);
    let marker = dir.join("at-point");
    folder.crash_at(move |p, _| {
        if p == point {
            let mut n = seen.lock().unwrap();
            *n += 1;
            if *n == 2 {
                std::fs::write(&marker, b"").unwrap();
                loop {
                    std::thread::sleep(std::time::Duration::from_secs(1));
                }
            }
        }
        false
    });
    folder.pass().unwrap();
    panic!("the pass ended without reaching {point:?} twice");
}

/// Each crash point with a real `kill -9` of a child process (this test binary, re-run as
/// [`kill_9_child`]) stopped there: the files and entries the kernel is left with recover and
/// fold to the same result as an uninterrupted pass.
#[test]
fn kill_9_at_every_crash_point_recovers_to_the_same_fold() {
    for point in ["tmp", "renamed", "entry"] {
        let dir = tempfile::tempdir().unwrap();
        let originals = build(dir.path());
        let want = expected(&originals);
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "kill_9_child", "--nocapture"])
            .env("RIPTIDE_FOLD_CHILD_DIR", dir.path())
            .env("RIPTIDE_FOLD_CHILD_POINT", point)
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

        let ks = fjall::Config::new(dir.path().join("fjall")).open().unwrap();
        let folder = Folder::new(&ks, &dir.path().join("segments")).unwrap();
        assert_eq!(folder.compaction_seq().unwrap(), 0, "{point}");
        let rec = folder.recover().unwrap();
        assert_eq!(
            (rec.tmp_removed, rec.refreshed.len()),
            (usize::from(point == "tmp"), usize::from(point == "renamed")),
            "{point}"
        );
        folder.pass().unwrap();
        drop((folder, ks));
        check_folded(dir.path(), &originals, &want);
    }
}
