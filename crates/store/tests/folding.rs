//! Folding wired into the store (issue 38): a generated stream with creates, updates, deletes,
//! `#sync` and deleted accounts ingested through [`Store::append_rows`] leaves exactly the
//! tombstones an independent derivation written here says; the store's compaction thread, asked
//! or on its interval, folds segment files made from the same rows (as sealing makes them) to the
//! independent fold of the original files (decoded by the format crate's second decoder); the
//! writer prunes what a pass finished with, and a tombstone raised while a pass runs survives
//! the prune and folds at the next pass.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "../../segment/tests/common/independent.rs"]
mod independent;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use riptide_firehose::FrameDecoder;
use riptide_jetstream::{EventKind, EventRowKind, Projector, StoredRow};
use riptide_segment::{Kind, OwnedRow, Row};
use riptide_store::compact::CrashPoint;
use riptide_store::folding::{CompactionConfig, FoldingStats};
use riptide_store::{Event, Resume, Store, StoreOptions, Utf8Text};

const BLOCK_ROWS: usize = 150;
const SEGMENT_BLOCKS: usize = 6;
/// Long enough under load (2 busy cores) for a pass over a few segments.
const PATIENCE: Duration = Duration::from_secs(180);

fn time_of(seq: u64) -> i64 {
    1_764_000_000_000_000 + seq as i64 * 1_000
}

/// A generated stream's events with their rows, seqs from 1; three accounts that have rows are
/// deleted and one deactivated three quarters of the way in. Made once.
fn stream() -> &'static [(Event, OwnedRow)] {
    static S: std::sync::OnceLock<Vec<(Event, OwnedRow)>> = std::sync::OnceLock::new();
    S.get_or_init(|| {
        let mut config = riptide_gen::Config::new(38, 60, 3_000);
        config.threads = 2;
        config.initial_records = (5, 40);
        let mut net = riptide_gen::Network::new(config).unwrap();
        let mut frames = Vec::new();
        net.run(|f: &[u8]| -> Result<(), riptide_gen::GenError> {
            frames.push(f.to_vec());
            Ok(())
        })
        .unwrap();
        let (mut dec, mut proj) = (FrameDecoder::new(), Projector::with_sync());
        let (mut out, mut json, mut dids) = (Vec::new(), Vec::new(), Vec::<String>::new());
        let mut push = |r: &StoredRow<'_>, proj: &mut Projector, out: &mut Vec<_>| {
            let seq = out.len() as u64 + 1;
            let e = Event::from_row(proj, r, seq, time_of(seq), &mut json).unwrap();
            out.push((e, r.row(seq, time_of(seq)).to_owned_row()));
        };
        for (i, f) in frames.iter().enumerate() {
            if i == frames.len() * 3 / 4 {
                let payloads: Vec<(String, Vec<u8>)> = dids[..4]
                    .iter()
                    .enumerate()
                    .map(|(n, d)| {
                        let status = if n < 3 { "deleted" } else { "deactivated" };
                        (d.clone(), common::account(d, false, status))
                    })
                    .collect();
                for (did, payload) in &payloads {
                    let r = StoredRow::Event {
                        kind: EventRowKind::Account,
                        did,
                        payload,
                    };
                    push(&r, &mut proj, &mut out);
                }
            }
            let Ok(frame) = dec.decode(f) else { continue };
            let p = proj.project(&frame);
            for r in &p.stored_rows(&frame).unwrap() {
                if let StoredRow::Commit { did, .. } = r {
                    if !dids.iter().any(|d| d == did) {
                        dids.push(did.to_string());
                    }
                }
                push(r, &mut proj, &mut out);
            }
        }
        out
    })
}

fn opts() -> StoreOptions {
    StoreOptions {
        block_events: 200,
        block_bytes: 4 << 20,
        block_cache: 2,
        ..StoreOptions::default()
    }
}

/// Appends `evs` through the ingest path, in batches of `batch`, each event with its row.
fn append(s: &Store, evs: &[(Event, OwnedRow)], batch: usize) {
    for chunk in evs.chunks(batch) {
        let events: Vec<Event> = chunk.iter().map(|(e, _)| e.clone()).collect();
        let rows: Vec<Row<'_>> = chunk.iter().map(|(_, r)| r.as_row()).collect();
        let last = &events[events.len() - 1];
        let resume = Resume {
            next_seq: last.seq() + 1,
            last_time_us: last.time_us(),
            upstream_cursor: Some(last.seq()),
        };
        s.append_rows(&events, &rows, &[], &[], &resume).unwrap();
    }
}

fn record_key(did: &[u8], collection: &[u8], rkey: &[u8]) -> Vec<u8> {
    [&b"r"[..], did, b"\0", collection, b"\0", rkey].concat()
}

/// The independent derivation: the partition's keys and seqs written from this test's reading
/// of the rules (`docs/archive.md`, "Folding"), over the rows as they were handed to the store.
fn derive_independently(rows: &[OwnedRow]) -> HashMap<Vec<u8>, u64> {
    let deleted: &[u8] = b"\x66active\xf4\x66status\x67deleted";
    let mut out = HashMap::new();
    for r in rows {
        let key = match r.kind {
            Kind::Update | Kind::Delete => {
                record_key(r.did.as_bytes(), r.collection.as_bytes(), r.rkey.as_bytes())
            }
            Kind::Sync => [b"d", r.did.as_bytes()].concat(),
            Kind::Account if r.payload.windows(deleted.len()).any(|w| w == deleted) => {
                [b"d", r.did.as_bytes()].concat()
            }
            _ => continue,
        };
        let slot = out.entry(key).or_insert(0);
        *slot = r.seq.max(*slot);
    }
    out
}

fn held(s: &Store) -> HashMap<Vec<u8>, u64> {
    let all = s.tombstones().all().unwrap();
    all.into_iter().map(|t| (t.key().to_vec(), t.seq)).collect()
}

#[test]
fn ingest_writes_exactly_the_tombstones_an_independent_derivation_says() {
    let evs = stream();
    let rows: Vec<OwnedRow> = evs.iter().map(|(_, r)| r.clone()).collect();
    let want = derive_independently(&rows);
    let dids = want.keys().filter(|k| k[0] == b'd').count();
    let syncs = rows.iter().filter(|r| r.kind == Kind::Sync).count();
    assert!(
        syncs > 0 && dids > 3 && want.len() - dids > 100,
        "the stream has every kind of tombstone: {syncs} #sync, {dids} DIDs, {} keys",
        want.len()
    );
    let dir = tempfile::tempdir().unwrap();
    {
        let (s, _) = Store::<Utf8Text>::open_with(dir.path(), 0, opts()).unwrap();
        append(&s, evs, 64);
        assert_eq!(held(&s), want);

        // An #account whose payload does not decode: stored, counted, no tombstone.
        let seq = evs.len() as u64 + 1;
        let did = "did:plc:damagedaccount0000000000";
        let e = Event::encode(seq, time_of(seq), EventKind::Account, did, "", b"{}", b"");
        let r = OwnedRow {
            seq,
            witnessed_at: time_of(seq),
            indexed_at: 0,
            kind: Kind::Account,
            did: did.into(),
            collection: String::new(),
            rkey: String::new(),
            rev: String::new(),
            payload: b"\xa1".to_vec(),
        };
        append(&s, &[(e, r)], 1);
        assert_eq!(s.folding_stats().tombstone_errors, 1);
        let mut got = Vec::new();
        s.read_from(seq, riptide_store::ReadLimit::default(), &mut got)
            .unwrap();
        assert_eq!(got.iter().map(Event::seq).collect::<Vec<_>>(), [seq]);
        assert_eq!(held(&s), want);
    }
    // Durable with their batches.
    let (s, _) = Store::<Utf8Text>::open_with(dir.path(), 0, opts()).unwrap();
    assert_eq!(held(&s), want);
    assert_eq!(s.folding_stats().compaction_seq, 0);
}

/// A store that ingested `evs`, and segment files of the same rows under `DATA/segments` named
/// by entries (what sealing will make). Returns each file's original bytes.
fn with_segments(s: &Store, dir: &Path, evs: &[(Event, OwnedRow)], first: u32) -> Vec<Vec<u8>> {
    let rows: Vec<Row<'_>> = evs.iter().map(|(_, r)| r.as_row()).collect();
    common::write_segments(
        &dir.join("segments"),
        &rows,
        first,
        (BLOCK_ROWS, SEGMENT_BLOCKS),
        |e| s.put_segment_entry_for_tests(e),
    )
}

/// Checks every file (segment `i` is `originals[i]`) against the independent fold with
/// `tombstones`; returns the rows dropped and the paths of the files that changed.
fn check_fold(
    dir: &Path,
    originals: &[Vec<u8>],
    tombstones: &HashMap<Vec<u8>, u64>,
) -> (usize, Vec<PathBuf>) {
    let (mut dropped, mut changed) = (0, Vec::new());
    for (i, orig) in originals.iter().enumerate() {
        let path = dir
            .join("segments")
            .join(riptide_segment::segment_name(i as u64));
        let now = std::fs::read(&path).unwrap();
        let (o, n) = (
            independent::decode(orig).unwrap(),
            independent::decode(&now).unwrap(),
        );
        assert!(n.checksum_ok);
        assert_eq!(n.blocks.len(), o.blocks.len(), "block topology kept");
        for (ob, nb) in o.blocks.iter().zip(&n.blocks) {
            let want: Vec<&independent::IRow> = ob
                .rows
                .iter()
                .filter(|r| {
                    let above = |k: &[u8]| tombstones.get(k).is_some_and(|&s| s > r.seq);
                    !(matches!(r.kind, 1 | 2 | 7)
                        && (above(&[b"d", &r.did[..]].concat())
                            || above(&record_key(&r.did, &r.collection, &r.rkey))))
                })
                .collect();
            assert_eq!(nb.rows.iter().collect::<Vec<_>>(), want, "{path:?}");
            dropped += ob.rows.len() - want.len();
        }
        if now != *orig {
            changed.push(path);
        }
    }
    (dropped, changed)
}

/// Polls the store's counters until `done` (the thread runs on its own).
fn wait_for(s: &Store, what: &str, done: impl Fn(&FoldingStats) -> bool) -> FoldingStats {
    let start = Instant::now();
    loop {
        let st = s.folding_stats();
        if done(&st) {
            return st;
        }
        assert!(start.elapsed() < PATIENCE, "{what}: {st:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn never() -> CompactionConfig {
    CompactionConfig {
        interval: Duration::from_secs(24 * 3600),
    }
}

#[test]
fn a_requested_pass_folds_the_segments_and_the_writer_then_prunes() {
    let evs = stream();
    let rows: Vec<OwnedRow> = evs.iter().map(|(_, r)| r.clone()).collect();
    let tombstones = derive_independently(&rows);
    let dir = tempfile::tempdir().unwrap();
    let (s, _) = Store::<Utf8Text>::open_with(dir.path(), 0, opts()).unwrap();
    append(&s, evs, 64);
    let originals = with_segments(&s, dir.path(), evs, 0);
    assert!(originals.len() >= 4);

    let seen = Arc::new(Mutex::new(Vec::new()));
    let told = seen.clone();
    s.start_compaction(never(), move |p| told.lock().unwrap().push(p.to_owned()))
        .unwrap();
    assert_eq!(
        s.folding_stats().passes,
        0,
        "no pass before one is asked for"
    );
    s.request_compaction();
    let st = wait_for(&s, "the requested pass", |st| st.passes >= 1);
    let (dropped, changed) = check_fold(dir.path(), &originals, &tombstones);
    assert!(dropped > 50, "{dropped}");
    assert_eq!(st.rows_dropped as usize, dropped);
    assert_eq!(st.segments_rewritten as usize, changed.len());
    assert_eq!(
        *seen.lock().unwrap(),
        changed,
        "the callback names each file rewritten"
    );
    let last = evs.len() as u64;
    assert_eq!((st.compaction_seq, st.failures), (last, 0));

    // Every tombstone is at or below compaction_seq: the writer's next batch prunes them all,
    // then writes its own.
    assert_eq!(
        held(&s),
        tombstones,
        "nothing pruned before the writer's next batch"
    );
    let (raise, _) = raised(evs, last + 1, 0);
    append(&s, &raise, 1);
    assert_eq!(held(&s), derive_independently(&[raise[0].1.clone()]));
    assert_eq!(
        s.folding_stats().tombstones_pruned as usize,
        tombstones.len()
    );
}

/// An update at `seq` of the `nth` record (by seq) whose last operation in `evs` is an update
/// (not a delete), and the record's key.
fn raised(evs: &[(Event, OwnedRow)], seq: u64, nth: usize) -> (Vec<(Event, OwnedRow)>, Vec<u8>) {
    // Records of DIDs without a DID tombstone, so that only the record's own tombstone folds.
    let whole: Vec<&str> = evs
        .iter()
        .filter(|(_, r)| matches!(r.kind, Kind::Sync | Kind::Account))
        .map(|(_, r)| r.did.as_str())
        .collect();
    let mut last: HashMap<Vec<u8>, &OwnedRow> = HashMap::new();
    for (_, r) in evs {
        if matches!(r.kind, Kind::Update | Kind::Delete) && !whole.contains(&r.did.as_str()) {
            let k = record_key(r.did.as_bytes(), r.collection.as_bytes(), r.rkey.as_bytes());
            last.insert(k, r);
        }
    }
    let mut updates: Vec<(&Vec<u8>, &&OwnedRow)> = last
        .iter()
        .filter(|(_, r)| r.kind == Kind::Update)
        .collect();
    updates.sort_by_key(|(_, r)| r.seq);
    let (key, r) = updates[nth];
    let e = evs.iter().find(|(_, o)| o.seq == r.seq).unwrap().0.clone();
    let row = OwnedRow {
        seq,
        witnessed_at: time_of(seq),
        ..(*r).clone()
    };
    let e = Event::encode(
        seq,
        time_of(seq),
        e.kind(),
        &r.did,
        &r.collection,
        &e.json(),
        b"",
    );
    (vec![(e, row)], key.clone())
}

#[test]
fn a_tombstone_raised_while_a_pass_runs_survives_the_prune_and_folds_next() {
    let evs = stream();
    let rows: Vec<OwnedRow> = evs.iter().map(|(_, r)| r.clone()).collect();
    let mut tombstones = derive_independently(&rows);
    let dir = tempfile::tempdir().unwrap();
    let (s, _) = Store::<Utf8Text>::open_with(dir.path(), 0, opts()).unwrap();
    append(&s, evs, 64);
    let mut originals = with_segments(&s, dir.path(), evs, 0);
    let last = evs.len() as u64;

    // The pass stops after its first rename (its tombstones read, its files half done) until
    // the test lets it go.
    let (at_tx, at_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let (at_tx, go_rx) = (Mutex::new(Some(at_tx)), Mutex::new(go_rx));
    s.start_compaction_paused(
        never(),
        |_| {},
        move |p, _| {
            if p == CrashPoint::Renamed {
                if let Some(tx) = at_tx.lock().unwrap().take() {
                    tx.send(()).unwrap();
                    go_rx.lock().unwrap().recv_timeout(PATIENCE).unwrap();
                }
            }
        },
    )
    .unwrap();
    s.request_compaction();
    at_rx
        .recv_timeout(PATIENCE)
        .expect("the pass reached its first rename");
    // Meanwhile ingest raises a record's tombstone (its last update was at or below the pass's
    // target) above the target.
    let (raise, key) = raised(evs, last + 1, 0);
    assert!(tombstones[&key] <= last);
    append(&s, &raise, 1);
    go_tx.send(()).unwrap();
    let st = wait_for(&s, "the paused pass", |st| st.passes >= 1);
    assert_eq!(st.compaction_seq, last);
    check_fold(dir.path(), &originals, &tombstones);
    // Nothing is pruned off the writer's thread.
    let mut now = tombstones.clone();
    now.insert(key.clone(), last + 1);
    assert_eq!(held(&s), now);

    // The writer's next batch prunes at `last`: the raised tombstone stays, every other one of
    // the stream goes (the batch's own record was updated in the stream too, so its tombstone
    // is pruned, then written again above `last`).
    let (raise2, key2) = raised(evs, last + 2, 1);
    append(&s, &raise2, 1);
    tombstones.insert(key.clone(), last + 1);
    tombstones.insert(key2.clone(), last + 2);
    let want: HashMap<Vec<u8>, u64> = [(key, last + 1), (key2, last + 2)].into();
    assert_eq!(held(&s), want);
    assert_eq!(
        s.folding_stats().tombstones_pruned as usize,
        derive_independently(&rows).len() - 1
    );

    // The raised tombstones fold the rows they supersede once the next segment is sealed: the
    // records' last updates of the stream, which the first pass kept.
    let next: Vec<(Event, OwnedRow)> = raise.into_iter().chain(raise2).collect();
    originals.extend(with_segments(&s, dir.path(), &next, originals.len() as u32));
    s.request_compaction();
    let st2 = wait_for(&s, "the second pass", |st| st.passes >= 2);
    assert_eq!(st2.compaction_seq, last + 2);
    assert_eq!(st2.rows_dropped - st.rows_dropped, 2, "{st2:?}");
    let (dropped, _) = check_fold(dir.path(), &originals, &tombstones);
    assert_eq!(dropped as u64, st2.rows_dropped);
}

#[test]
fn the_interval_runs_passes_unasked_and_a_failing_pass_is_counted_and_retried() {
    let evs = stream();
    let dir = tempfile::tempdir().unwrap();
    let (s, _) = Store::<Utf8Text>::open_with(dir.path(), 0, opts()).unwrap();
    append(&s, evs, 64);
    let originals = with_segments(&s, dir.path(), evs, 0);
    // The first file is missing: every pass fails on it, nothing is folded.
    let first = dir
        .path()
        .join("segments")
        .join(riptide_segment::segment_name(0));
    std::fs::remove_file(&first).unwrap();
    let config = CompactionConfig {
        interval: Duration::from_millis(50),
    };
    s.start_compaction(config, |_| {}).unwrap();
    let st = wait_for(&s, "failing passes", |st| st.failures >= 2);
    assert_eq!((st.passes, st.compaction_seq, st.rows_dropped), (0, 0, 0));
    // Back in place: the next tick folds, unasked.
    std::fs::write(&first, &originals[0]).unwrap();
    let st = wait_for(&s, "a pass on the interval", |st| st.passes >= 1);
    assert_eq!(st.compaction_seq, evs.len() as u64);
    let rows: Vec<OwnedRow> = evs.iter().map(|(_, r)| r.clone()).collect();
    let (dropped, _) = check_fold(dir.path(), &originals, &derive_independently(&rows));
    assert_eq!(st.rows_dropped as usize, dropped);
}

#[test]
fn open_recovers_what_a_pass_left_and_a_failed_recovery_holds_passes_until_it_succeeds() {
    let evs = stream();
    let dir = tempfile::tempdir().unwrap();
    let originals = {
        let (s, _) = Store::<Utf8Text>::open_with(dir.path(), 0, opts()).unwrap();
        append(&s, evs, 64);
        with_segments(&s, dir.path(), evs, 0)
    };
    // What a pass killed after writing its file to tmp/ leaves; and a segment file gone.
    let tmp = dir.path().join("segments/tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let left = tmp.join(format!("{}.compact", riptide_segment::segment_name(1)));
    std::fs::write(&left, b"half a segment").unwrap();
    let second = dir
        .path()
        .join("segments")
        .join(riptide_segment::segment_name(1));
    std::fs::rename(&second, dir.path().join("aside")).unwrap();

    let (s, _) = Store::<Utf8Text>::open_with(dir.path(), 0, opts()).unwrap();
    // Recovery stopped at the missing file (entries in order: tmp/ was cleaned first).
    assert!(!left.exists());
    assert_eq!(s.folding_stats().failures, 1);
    s.start_compaction(
        CompactionConfig {
            interval: Duration::from_millis(50),
        },
        |_| {},
    )
    .unwrap();
    let st = wait_for(&s, "recoveries retried", |st| st.failures >= 3);
    assert_eq!(
        (st.passes, st.rows_dropped),
        (0, 0),
        "no pass before recovery"
    );
    std::fs::rename(dir.path().join("aside"), &second).unwrap();
    let st = wait_for(&s, "a pass once recovered", |st| st.passes >= 1);
    let rows: Vec<OwnedRow> = evs.iter().map(|(_, r)| r.clone()).collect();
    let (dropped, _) = check_fold(dir.path(), &originals, &derive_independently(&rows));
    assert_eq!(st.rows_dropped as usize, dropped);
}

/// The seqs a replay serves once every sealed row up to `folded` is folded, derived here: every
/// row but the create, update and create-resync rows at or below `folded` that a later row's
/// tombstone (of their record, or of their DID) supersedes.
fn kept_after_fold(rows: &[OwnedRow], folded: u64) -> Vec<u64> {
    let tombstones = derive_independently(rows);
    let above = |k: &[u8], seq| tombstones.get(k).is_some_and(|&t| t > seq);
    rows.iter()
        .filter(|r| {
            let superseded = matches!(r.kind, Kind::Create | Kind::Update | Kind::CreateResync)
                && (above(&[b"d", r.did.as_bytes()].concat(), r.seq)
                    || above(
                        &record_key(r.did.as_bytes(), r.collection.as_bytes(), r.rkey.as_bytes()),
                        r.seq,
                    ));
            !(r.seq <= folded && superseded)
        })
        .map(|r| r.seq)
        .collect()
}

/// Every event from `from` on, through the cache-only reads (`read_cached`) wherever the block
/// is cached and a one-event loading read where it is not.
fn read_all_cached(s: &Store, from: u64) -> Vec<Event> {
    let (mut all, mut got, mut next) = (Vec::new(), Vec::new(), from);
    let limit = riptide_store::ReadLimit {
        events: 61,
        bytes: 16 << 10,
    };
    loop {
        got.clear();
        if !s.read_cached(next, limit, &mut got).unwrap() {
            let one = riptide_store::ReadLimit {
                events: 1,
                bytes: 1,
            };
            s.read_from(next, one, &mut got).unwrap();
        }
        let Some(last) = got.last() else { break };
        next = last.seq() + 1;
        all.append(&mut got);
    }
    all
}

/// Replays from the start, from cursors inside gaps the fold left (the first seqs dropped, one in
/// the middle, the last, and one ending a block), from a block's first seq and past the folded
/// seqs, by both read paths: each serves exactly the events of `kept` from its cursor on, byte
/// for byte as ingest made them. Returns the cursors that were inside gaps.
fn check_replays(s: &Store, evs: &[(Event, OwnedRow)], kept: &[u64]) -> Vec<u64> {
    let want: Vec<(Event, OwnedRow)> = kept.iter().map(|&q| evs[q as usize - 1].clone()).collect();
    let dropped: Vec<u64> = (1..=evs.len() as u64)
        .filter(|q| kept.binary_search(q).is_err())
        .collect();
    let mut gaps: Vec<u64> = dropped.iter().take(3).copied().collect();
    gaps.extend(dropped.get(dropped.len() / 2));
    gaps.extend(dropped.last());
    gaps.extend(
        dropped
            .iter()
            .find(|&&q| q % opts().block_events as u64 == 0),
    );
    let last = evs.len() as u64;
    let mut cursors = vec![1, opts().block_events as u64 + 1, last - 5, last];
    cursors.extend(&gaps);
    for &c in &cursors {
        let from = want.partition_point(|(e, _)| e.seq() < c);
        common::same(&common::read_all(s, c), &want[from..]);
    }
    for &c in [1].iter().chain(gaps.first()) {
        let from = want.partition_point(|(e, _)| e.seq() < c);
        common::same(&read_all_cached(s, c), &want[from..]);
    }
    assert_eq!(s.first_seq().unwrap(), Some(kept[0]));
    gaps
}

#[test]
fn a_sealed_store_folded_by_its_thread_replays_the_fold_from_any_cursor() {
    let evs = stream();
    let rows: Vec<OwnedRow> = evs.iter().map(|(_, r)| r.clone()).collect();
    let sealing = StoreOptions {
        segment_bytes: Some(1),
        ..opts()
    };
    let dir = tempfile::tempdir().unwrap();
    let folded = {
        let (s, _) = Store::<Utf8Text>::open_with(dir.path(), 0, sealing).unwrap();
        s.start_compaction(never(), |_| {}).unwrap();
        // Sealed as the server's seal loop seals (a segment per block here).
        for chunk in evs.chunks(64) {
            append(&s, chunk, 64);
            s.seal_segments().unwrap();
        }
        let entries = s.segment_entries();
        assert!(entries.len() >= 10, "{} segments", entries.len());
        check_replays(&s, evs, &kept_after_fold(&rows, 0));

        s.request_compaction();
        let folded = entries.last().unwrap().max_seq;
        // (`compaction_seq` is published last, once the pass's files are in place.)
        let st = wait_for(&s, "the pass", |st| st.compaction_seq >= folded);
        assert_eq!((st.compaction_seq, st.failures), (folded, 0));
        let kept = kept_after_fold(&rows, folded);
        assert_eq!(st.rows_dropped as usize, evs.len() - kept.len());
        assert!(st.rows_dropped > 100, "{st:?}");
        let gaps = check_replays(&s, evs, &kept);
        assert!(gaps.len() >= 5, "{gaps:?}");
        assert!(s.damaged_blocks().is_empty(), "{:?}", s.damaged_blocks());

        // A flipped bit in a folded block (one not cached) is still found, counted and skipped,
        // never served.
        let e = &s.segment_entries()[1];
        assert!(e.generation > 0, "{e:?}");
        let path = s.segment_path(e);
        let mut bytes = std::fs::read(&path).unwrap();
        let b = riptide_segment::Segment::open(&bytes).unwrap().blocks()[0];
        bytes[(b.offset + 8 + u64::from(b.compressed_size) / 2) as usize] ^= 0x10;
        // In place: the store reads the file it opened.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .and_then(|f| std::os::unix::fs::FileExt::write_all_at(&f, &bytes, 0))
            .unwrap();
        let got = common::read_all(&s, 1);
        let in_block = |q: u64| (b.min_seq..=b.max_seq).contains(&q);
        let want: Vec<u64> = kept.iter().copied().filter(|&q| !in_block(q)).collect();
        assert_eq!(got.iter().map(Event::seq).collect::<Vec<_>>(), want);
        let damaged = s.damaged_blocks();
        assert_eq!(damaged.len(), 1, "{damaged:?}");
        assert_eq!(
            (damaged[0].first, damaged[0].what),
            (b.min_seq, "zstd frame")
        );
        // Put back for the reopen below.
        bytes[(b.offset + 8 + u64::from(b.compressed_size) / 2) as usize] ^= 0x10;
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .and_then(|f| std::os::unix::fs::FileExt::write_all_at(&f, &bytes, 0))
            .unwrap();
        folded
    };
    // Reopened: the same fold, from the files and entries on disk.
    let (s, _) = Store::<Utf8Text>::open_with(dir.path(), 0, sealing).unwrap();
    assert_eq!(s.folding_stats().compaction_seq, folded);
    check_replays(&s, evs, &kept_after_fold(&rows, folded));
}

fn sealing() -> StoreOptions {
    StoreOptions {
        segment_bytes: Some(1),
        ..opts()
    }
}

/// The child of [`kill_9_during_a_fold_pass_loses_nothing_and_serves_no_half_written_file`]:
/// opens the store it is given, runs a pass, and at the named point of the second file the
/// pass rewrites says so in a file and waits to be killed.
#[test]
fn fold_kill_9_child() {
    let (Some(dir), Some(point)) = (
        std::env::var_os("RIPTIDE_FOLD_CHILD_DIR"),
        std::env::var("RIPTIDE_FOLD_CHILD_POINT").ok(),
    ) else {
        return;
    };
    let dir = PathBuf::from(dir);
    let point = match point.as_str() {
        "tmp" => CrashPoint::TmpWritten,
        "renamed" => CrashPoint::Renamed,
        _ => CrashPoint::EntryUpdated,
    };
    let (s, _) = Store::<Utf8Text>::open_with(&dir, 0, sealing()).unwrap();
    let marker = dir.join("at-point");
    let seen = Mutex::new(Vec::new());
    s.start_compaction_paused(
        never(),
        |_| {},
        move |p, index| {
            let mut seen = seen.lock().unwrap();
            if p == point && !seen.contains(&index) {
                seen.push(index);
            }
            if p == point && seen.len() == 2 {
                std::fs::write(&marker, b"").unwrap();
                loop {
                    std::thread::sleep(Duration::from_secs(1));
                }
            }
        },
    )
    .unwrap();
    s.request_compaction();
    std::thread::sleep(PATIENCE);
    panic!("the pass never reached {point:?}");
}

/// A `kill -9` of a server's store in a fold pass, at each crash point (a child process, this
/// test binary re-run as [`fold_kill_9_child`], stopped at the second file the pass rewrites):
/// reopened, the store serves every event the fold keeps, each as ingest made it, from files
/// that all verify (no block damaged: no half-written file is read), and the next pass finishes
/// the fold exactly.
#[test]
fn kill_9_during_a_fold_pass_loses_nothing_and_serves_no_half_written_file() {
    // Enough for several segments with rows to fold (a few seconds under load).
    let evs = &stream()[..1_400];
    let rows: Vec<OwnedRow> = evs.iter().map(|(_, r)| r.clone()).collect();
    for point in ["tmp", "renamed", "entry"] {
        let dir = tempfile::tempdir().unwrap();
        let folded = {
            let (s, _) = Store::<Utf8Text>::open_with(dir.path(), 0, sealing()).unwrap();
            for chunk in evs.chunks(64) {
                append(&s, chunk, 64);
                s.seal_segments().unwrap();
            }
            s.segment_entries().last().unwrap().max_seq
        };
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "fold_kill_9_child", "--nocapture"])
            .env("RIPTIDE_FOLD_CHILD_DIR", dir.path())
            .env("RIPTIDE_FOLD_CHILD_POINT", point)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let start = Instant::now();
        while !dir.path().join("at-point").exists() {
            if let Some(status) = child.try_wait().unwrap() {
                panic!("{point}: the child ended first: {status}");
            }
            assert!(start.elapsed() < PATIENCE, "{point}: never reached");
            std::thread::sleep(Duration::from_millis(20));
        }
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();

        let (s, _) = Store::<Utf8Text>::open_with(dir.path(), 0, sealing()).unwrap();
        assert_eq!(s.folding_stats().compaction_seq, 0, "{point}");
        // Between the two generations: each file folded or not, every kept event there.
        let served = common::read_all(&s, 1);
        let kept = kept_after_fold(&rows, folded);
        let seqs: Vec<u64> = served.iter().map(Event::seq).collect();
        let missing: Vec<u64> = kept
            .iter()
            .copied()
            .filter(|q| seqs.binary_search(q).is_err())
            .collect();
        assert!(missing.is_empty(), "{point}: lost {missing:?}");
        let want: Vec<(Event, OwnedRow)> =
            seqs.iter().map(|&q| evs[q as usize - 1].clone()).collect();
        common::same(&served, &want);
        assert!(
            s.damaged_blocks().is_empty(),
            "{point}: {:?}",
            s.damaged_blocks()
        );
        assert!(
            seqs.len() > kept.len(),
            "{point}: the pass was cut short, some rows remain"
        );

        s.start_compaction(never(), |_| {}).unwrap();
        s.request_compaction();
        wait_for(&s, point, |st| st.compaction_seq >= folded);
        let want: Vec<(Event, OwnedRow)> =
            kept.iter().map(|&q| evs[q as usize - 1].clone()).collect();
        common::same(&common::read_all(&s, 1), &want);
        assert!(s.damaged_blocks().is_empty(), "{point}");
    }
}

/// A replay while a pass has renamed a file's new generation over the old one and not yet
/// written its entry (nor swapped the store's index): the reader's index is the old
/// generation's, the file on disk the new one's; the read finds the block in the new
/// generation's footer and serves exactly the fold there — each event as ingest made it, no
/// block taken for damaged.
#[test]
fn a_replay_between_a_rename_and_its_entry_reads_one_generation() {
    let evs = &stream()[..1_400];
    let rows: Vec<OwnedRow> = evs.iter().map(|(_, r)| r.clone()).collect();
    let dir = tempfile::tempdir().unwrap();
    let (s, _) = Store::<Utf8Text>::open_with(dir.path(), 0, sealing()).unwrap();
    for chunk in evs.chunks(64) {
        append(&s, chunk, 64);
        s.seal_segments().unwrap();
    }
    let folded = s.segment_entries().last().unwrap().max_seq;
    // Nothing read yet, so nothing cached: the replay below reads the files.
    let (at, release) = (mpsc::channel(), mpsc::sync_channel::<()>(0));
    let (at_tx, release_rx) = (Mutex::new(at.0), Mutex::new(release.1));
    s.start_compaction_paused(
        never(),
        |_| {},
        move |p, index| {
            if p == CrashPoint::Renamed {
                at_tx.lock().unwrap().send(index).unwrap();
                release_rx.lock().unwrap().recv().unwrap();
            }
        },
    )
    .unwrap();
    s.request_compaction();
    let index = at.1.recv_timeout(PATIENCE).unwrap();
    let renamed = s.segment_entries()[index as usize].clone();
    let served = common::read_all(&s, renamed.min_seq);
    let kept = kept_after_fold(&rows, folded);
    let seqs: Vec<u64> = served.iter().map(Event::seq).collect();
    let in_file = |q: &u64| (renamed.min_seq..=renamed.max_seq).contains(q);
    // The renamed file is read in its new generation: exactly the fold there.
    assert_eq!(
        seqs.iter().copied().filter(in_file).collect::<Vec<_>>(),
        kept.iter().copied().filter(in_file).collect::<Vec<_>>()
    );
    let want: Vec<(Event, OwnedRow)> = seqs.iter().map(|&q| evs[q as usize - 1].clone()).collect();
    common::same(&served, &want);
    assert!(s.damaged_blocks().is_empty(), "{:?}", s.damaged_blocks());
    // Let the pass go on, file after file.
    std::thread::spawn(move || while release.0.send(()).is_ok() {});
    wait_for(&s, "the pass", |st| st.compaction_seq >= folded);
    let want: Vec<(Event, OwnedRow)> = kept.iter().map(|&q| evs[q as usize - 1].clone()).collect();
    common::same(&common::read_all(&s, 1), &want);
}
