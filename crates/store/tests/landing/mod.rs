//! A backfill's landing written as rows only (`Store::append_landing`) stores what the same rows
//! written with their events (`Store::append_rows`, ingest's and the backfill's write before it)
//! store: the same blocks, the same unsealed tail, the same time index, read back byte for byte
//! as the JSON ingest made of the frames (the generated stream's projection, every kind of row),
//! across batches that seal whole blocks past two blocks' worth, batches below a block, a reopen
//! with rows unsealed, and unsealed events without rows before a landing.
//!
//! A module of `row_blocks.rs`'s test binary, not a binary of its own: it shares the generated
//! stream that binary makes once (its generation is most of the time of either).

use crate::common::{generated, read_all, same};
use riptide_jetstream::{Projector, StoredRow};
use riptide_segment::{Kind, OwnedRow, Row};
use riptide_store::{Event, LandingRow, Resume, Store, StoreOptions, Utf8Text};

/// The generated stream's rows six times over (more than two blocks' worth), renumbered from
/// seq 1 with the stream's times (`time_us = 1.75e15 + 3 seq`: the first copy is the stream
/// itself), each with its event rendered from its row (a `create-resync` row's as a
/// replacement's). Made once for all the tests.
fn stream() -> &'static [(Event, OwnedRow)] {
    static ROWS: std::sync::OnceLock<Vec<(Event, OwnedRow)>> = std::sync::OnceLock::new();
    ROWS.get_or_init(|| copies(6))
}

fn copies(copies: usize) -> Vec<(Event, OwnedRow)> {
    let mut proj = Projector::with_sync();
    let mut json = Vec::new();
    let mut out = Vec::new();
    for _ in 0..copies {
        for (_, r) in generated() {
            let seq = out.len() as u64 + 1;
            let time_us = 1_750_000_000_000_000 + 3 * seq as i64;
            let mut row = r.clone();
            (row.seq, row.witnessed_at, row.indexed_at) = (seq, time_us, 0);
            let stored = StoredRow::from_row(&row.as_row());
            let e = if row.kind == Kind::CreateResync {
                Event::replacement_from_row(&mut proj, &stored, seq, time_us, &mut json)
            } else {
                Event::from_row(&mut proj, &stored, seq, time_us, &mut json)
            }
            .unwrap();
            out.push((e, row));
        }
    }
    out
}

fn resume_after(chunk: &[(Event, OwnedRow)]) -> Resume {
    let last = &chunk[chunk.len() - 1].0;
    Resume {
        next_seq: last.seq() + 1,
        last_time_us: last.time_us(),
        upstream_cursor: None,
    }
}

/// `evs` cut into batches of the `sizes` in turn.
fn batches(evs: &[(Event, OwnedRow)], sizes: &[usize]) -> Vec<std::ops::Range<usize>> {
    let (mut out, mut at) = (Vec::new(), 0);
    for &n in sizes.iter().cycle() {
        if at == evs.len() {
            break;
        }
        let end = (at + n).min(evs.len());
        out.push(at..end);
        at = end;
    }
    out
}

/// The batch through `append_landing`, each row measured as a backfill measures it.
fn land(s: &Store, chunk: &[(Event, OwnedRow)], progress: &str) {
    let mut proj = Projector::with_sync();
    let mut json = Vec::new();
    let rows: Vec<LandingRow<'_>> = chunk
        .iter()
        .map(|(e, r)| {
            let row = r.as_row();
            let value_len = <Event>::value_len_of_row(
                &mut proj,
                &StoredRow::from_row(&row),
                row.seq,
                row.display_time_us(),
                &mut json,
            )
            .unwrap();
            // The length of the event the store would have been handed.
            assert_eq!(value_len, e.raw().len(), "seq {}", e.seq());
            LandingRow { row, value_len }
        })
        .collect();
    let p = [(progress.into(), progress.as_bytes().to_vec())];
    s.append_landing(&rows, &[], &p, &resume_after(chunk))
        .unwrap();
}

/// The batch through `append_with_progress`, events and rows.
fn append(s: &Store, chunk: &[(Event, OwnedRow)], progress: &str) {
    let events: Vec<Event> = chunk.iter().map(|(e, _)| e.clone()).collect();
    let rows: Vec<Row<'_>> = chunk.iter().map(|(_, r)| r.as_row()).collect();
    let p = [(progress.into(), progress.as_bytes().to_vec())];
    s.append_with_progress(&events, Some(&rows), &[], &p, &resume_after(chunk))
        .unwrap();
}

fn open(dir: &std::path::Path) -> Store {
    Store::<Utf8Text>::open_with(dir, 0, StoreOptions::default())
        .unwrap()
        .0
}

/// Both stores hold the same: every event read back alike (and as `evs`), the same blocks and
/// unsealed events, the same time index.
fn alike(landed: &Store, appended: &Store, evs: &[(Event, OwnedRow)]) {
    let got = read_all(landed, 1);
    same(&got, evs);
    same(&read_all(appended, 1), evs);
    let (l, a) = (landed.check().unwrap(), appended.check().unwrap());
    assert_eq!(l, a);
    assert!(l.damaged.is_empty() && l.blocks == l.row_blocks, "{l:?}");
    for (e, _) in evs.iter().step_by(97) {
        assert_eq!(landed.seq_at_time(e.time_us()).unwrap(), Some(e.seq()));
        assert_eq!(
            appended.seq_at_time(e.time_us() - 1).unwrap(),
            Some(e.seq())
        );
        assert_eq!(landed.seq_at_time(e.time_us() - 1).unwrap(), Some(e.seq()));
    }
}

#[test]
fn a_landing_stores_what_its_rows_with_their_events_store() {
    let evs = stream();
    assert!(
        evs.len() > 2 * 4096 && evs.len() < 3_090 + 3 * 4096,
        "{} rows",
        evs.len()
    );
    let (ld, ad) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    // A batch below a block (unsealed), then one that seals two whole blocks, the first with
    // the unsealed rows, and leaves the rest past them unsealed.
    let cuts = batches(evs, &[3_090, 9_000]);
    assert_eq!(cuts.len(), 2);
    let reopen_at = 1;
    {
        let (l, a) = (open(ld.path()), open(ad.path()));
        for (i, r) in cuts[..reopen_at].iter().enumerate() {
            land(&l, &evs[r.clone()], &format!("p{i}"));
            append(&a, &evs[r.clone()], &format!("p{i}"));
        }
        let end = cuts[reopen_at - 1].end;
        alike(&l, &a, &evs[..end]);
        assert!(l.check().unwrap().unsealed > 0, "rows wait unsealed");
    }
    // Reopened with rows unsealed (read back from `recent_rows`): the rest lands alike.
    let (l, a) = (open(ld.path()), open(ad.path()));
    for (i, r) in cuts.iter().enumerate().skip(reopen_at) {
        land(&l, &evs[r.clone()], &format!("p{i}"));
        append(&a, &evs[r.clone()], &format!("p{i}"));
    }
    alike(&l, &a, evs);
    let c = l.check().unwrap();
    assert_eq!(
        (c.blocks, c.unsealed),
        (2, evs.len() as u64 - 2 * 4096),
        "{c:?}"
    );
    for i in [0, cuts.len() - 1] {
        let p = format!("p{i}");
        assert_eq!(l.progress(&p).unwrap().as_deref(), Some(p.as_bytes()));
    }
    assert_eq!(c.events + c.unsealed, evs.len() as u64, "{c:?}");
}

/// Unsealed events that came without rows (a writer that hands none) cannot go into a row
/// block: a landing over them is written as events, sealed as a JSON block as before, and
/// everything reads back alike.
#[test]
fn a_landing_over_events_without_rows_is_written_as_events() {
    let evs = &stream()[..4_638];
    let (ld, ad) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (l, a) = (open(ld.path()), open(ad.path()));
    let first: Vec<Event> = evs[..100].iter().map(|(e, _)| e.clone()).collect();
    for s in [&l, &a] {
        s.append(&first, &resume_after(&evs[..100])).unwrap();
    }
    for (i, r) in batches(&evs[100..], &[2_500, 2_038])
        .into_iter()
        .enumerate()
    {
        let r = r.start + 100..r.end + 100;
        land(&l, &evs[r.clone()], &format!("p{i}"));
        append(&a, &evs[r], &format!("p{i}"));
    }
    same(&read_all(&l, 1), evs);
    let (lc, ac) = (l.check().unwrap(), a.check().unwrap());
    assert_eq!(lc, ac);
    assert!(lc.blocks > lc.row_blocks, "a JSON block: {lc:?}");
}

/// A landing whose seqs are not consecutive is refused whole: nothing of it is written.
#[test]
fn a_landing_with_a_gap_is_refused_whole() {
    let evs = stream();
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path());
    let rows: Vec<LandingRow<'_>> = [&evs[0], &evs[2]]
        .iter()
        .map(|(e, r)| LandingRow {
            row: r.as_row(),
            value_len: e.raw().len(),
        })
        .collect();
    let p = [("did:plc:x".into(), b"x".to_vec())];
    let e = s
        .append_landing(&rows, &[], &p, &resume_after(&evs[..3]))
        .unwrap_err();
    assert!(
        matches!(e, riptide_store::StoreError::Rows { seq: 3, .. }),
        "{e}"
    );
    assert_eq!(s.progress("did:plc:x").unwrap(), None);
    assert!(read_all(&s, 1).is_empty());
}
