//! Row blocks (layout 5): a sealed block whose events are kept as Jetstream v2 `.jss` rows, not
//! as their v1 JSON, rendered back into the cache's form once when the block is loaded.
//!
//! Why a module: the store is moving to one copy of the data (`docs/archive.md`, "One copy of the
//! data"): the `.jss` block frame that the archive serves and seals into segments is also what
//! both live wires replay from. A row is smaller than its JSON (a commit's record as its signed
//! DAG-CBOR, not its JSON rendering), but a reader needs JSON, so a row block is rendered when it
//! is loaded — once for every reader, since the rendered block goes into the shared block cache
//! (`store.rs`, "Blocks") and loads ahead of a replay run on the blocking pool (`store.rs`,
//! "Read-ahead"): a replay's socket loop sends rendered events as it does from a JSON block.
//!
//! What is here: a row's encoding while it waits unsealed in `recent_rows` (a one-row `.jss`
//! block body, [`encode_row`]), and the rendering of a block's rows into stored event values
//! ([`render_rows`], through [`riptide_jetstream::Projector::project_rows`], the same code that
//! renders a frame's events at ingest, so v1 stays byte for byte what ingest stored).

use std::cell::RefCell;

use riptide_jetstream::{EventKind, Projector, StoredRow};
use riptide_segment::{decode_block, encode_block, Kind, Row};

use crate::event::{append_value, Event, Text};

/// A row as `recent_rows` keeps it until its block is sealed: the uncompressed body of a
/// one-row `.jss` block. `None` for a row a `.jss` block cannot hold (a column past its width).
pub(crate) fn encode_row(row: &Row<'_>) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    encode_block(std::slice::from_ref(row), &mut out).ok()?;
    Some(out)
}

/// The row of [`encode_row`]'s bytes, if they hold exactly one.
pub(crate) fn decode_row(bytes: &[u8]) -> Option<Row<'_>> {
    match decode_block(bytes).ok()?.as_slice() {
        [row] => Some(*row),
        _ => None,
    }
}

thread_local! {
    /// The rendering state of the thread loading a block (a reader's or the blocking pool's).
    static PROJECTOR: RefCell<Projector> = RefCell::new(Projector::new());
}

/// Renders a row block's body (the block of index entry `first..=last`, `count` rows) into
/// `data` as the store's decompressed blocks hold events — `[u32 len][stored value]` each, no
/// zstd form — with where each value starts in `starts` and each row's seq in `seqs`: every
/// row's v1 event, `time_us` its display time and `cursor` its seq, as ingest rendered it.
///
/// The seqs need not be consecutive: a block folded by compaction keeps its entry's bounds and
/// only the rows that survived (`docs/archive.md`, "Folding"). They must be strictly increasing
/// and inside `first..=last`, and there must be `count` of them; a live block (`last = first +
/// count - 1`) is thereby held to consecutive seqs. `Err` names what is wrong: the rows are not
/// the block's (count, seqs) or one does not render (a damaged store: ingest keeps only rows
/// that render).
pub(crate) fn render_rows(
    (first, last): (u64, u64),
    count: u64,
    body: &[u8],
    data: &mut Vec<u8>,
    starts: &mut Vec<u32>,
    seqs: &mut Vec<u64>,
) -> Result<(), &'static str> {
    let rows = decode_block(body).map_err(|_| "rows")?;
    if rows.len() as u64 != count {
        return Err("count");
    }
    if !rows_fit(first, last, rows.iter().map(|r| r.seq)) {
        return Err("row seq");
    }
    seqs.extend(rows.iter().map(|r| r.seq));
    let stored: Vec<StoredRow<'_>> = rows.iter().map(StoredRow::from_row).collect();
    let mut failed = None;
    PROJECTOR.with(|p| {
        let mut p = p.borrow_mut();
        p.project_rows(&stored, |i, projected| {
            let Ok(projected) = projected else {
                failed = Some("row does not render");
                return;
            };
            if failed.is_some() || data.len() > u32::MAX as usize {
                failed = failed.or(Some("block size"));
                return;
            }
            let row = &rows[i];
            let time_us = row.display_time_us();
            let at = data.len();
            data.extend_from_slice(&[0; 4]);
            starts.push((at + 4) as u32);
            // A `create-resync` row renders as a `create`; its event is a replacement's, which
            // v1 never sends (`EventKind::Replacement`).
            let kind = match EventKind::of_row(row.kind) {
                EventKind::Replacement => EventKind::Replacement,
                _ => projected.kind(0),
            };
            append_value(
                data,
                time_us,
                kind,
                projected.did(0),
                projected.collection(0),
                |out| projected.render(0, time_us, Some(row.seq), out),
            );
            let len = (data.len() - at - 4) as u32;
            data[at..at + 4].copy_from_slice(&len.to_be_bytes());
        });
    });
    match failed {
        Some(what) => Err(what),
        None => Ok(()),
    }
}

/// The stored event of one `.jss` row, at its seq and display time, rendered as
/// [`Event::from_row`] renders it (a `create-resync` row as a replacement's:
/// [`EventKind::Replacement`]); `json` is a scratch buffer. For a landing's rows left unsealed
/// (`Store::append_landing`), which wait in `recent` and the in-memory tail as events.
pub(crate) fn event_of_row<T: Text>(
    row: &Row<'_>,
    json: &mut Vec<u8>,
) -> Result<Event<T>, riptide_jetstream::RowError> {
    let stored = StoredRow::from_row(row);
    let time_us = row.display_time_us();
    PROJECTOR.with(|p| {
        let mut p = p.borrow_mut();
        if row.kind == Kind::CreateResync {
            Event::replacement_from_row(&mut p, &stored, row.seq, time_us, json)
        } else {
            Event::from_row(&mut p, &stored, row.seq, time_us, json)
        }
    })
}

/// Whether `seqs` are strictly increasing and all inside `first..=last` (a block's rows against
/// its index entry).
fn rows_fit(first: u64, last: u64, seqs: impl Iterator<Item = u64>) -> bool {
    let mut next = first;
    for seq in seqs {
        if seq < next || seq > last {
            return false;
        }
        next = seq + 1;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Event, Utf8Text};
    use bytes::Bytes;
    use riptide_segment::Kind;

    fn delete(seq: u64) -> Row<'static> {
        Row {
            seq,
            witnessed_at: 1_000 + seq as i64,
            indexed_at: 0,
            kind: Kind::Delete,
            did: "did:plc:a",
            collection: "app.bsky.feed.post",
            rkey: "3l3qo2vutsw2b",
            rev: "3l3qo2vutsw2b",
            payload: b"",
        }
    }

    #[test]
    fn a_row_survives_recent_rows() {
        let r = delete(7);
        let bytes = encode_row(&r).unwrap();
        assert_eq!(decode_row(&bytes), Some(r));
        assert_eq!(decode_row(&bytes[..bytes.len() - 1]), None);
        let too_long = Row {
            rkey: std::str::from_utf8(&[b'k'; 300]).unwrap(),
            ..r
        };
        assert_eq!(encode_row(&too_long), None);
    }

    #[test]
    fn rows_render_into_stored_values_or_say_why_not() {
        let rows = [delete(5), delete(6)];
        let mut body = Vec::new();
        encode_block(&rows, &mut body).unwrap();
        let (mut data, mut starts) = (Vec::new(), Vec::new());
        render_rows((5, 6), 2, &body, &mut data, &mut starts, &mut Vec::new()).unwrap();
        assert_eq!(starts.len(), 2);
        for (i, &s) in starts.iter().enumerate() {
            let end = starts.get(i + 1).map_or(data.len(), |&n| n as usize - 4);
            let e = Event::<Utf8Text>::decode(
                5 + i as u64,
                Bytes::copy_from_slice(&data[s as usize..end]),
            )
            .unwrap();
            assert_eq!(e.time_us(), 1_005 + i as i64);
            assert_eq!(
                std::str::from_utf8(&e.json()).unwrap(),
                format!(
                    r#"{{"did":"did:plc:a","time_us":{},"cursor":{},"kind":"commit","commit":{{"rev":"3l3qo2vutsw2b","operation":"delete","collection":"app.bsky.feed.post","rkey":"3l3qo2vutsw2b"}}}}"#,
                    1_005 + i,
                    5 + i
                )
            );
        }
        let (mut data, mut starts) = (Vec::new(), Vec::new());
        assert_eq!(
            render_rows((4, 5), 2, &body, &mut data, &mut starts, &mut Vec::new()),
            Err("row seq")
        );
        assert_eq!(
            render_rows((5, 7), 3, &body, &mut data, &mut starts, &mut Vec::new()),
            Err("count")
        );
        assert_eq!(
            render_rows(
                (5, 6),
                2,
                &body[..9],
                &mut data,
                &mut starts,
                &mut Vec::new()
            ),
            Err("rows")
        );
        // A replacement's record (kind 7) comes back as one: a `create` v1 never sends.
        // {"$type": "a.b.c", "n": 3} in DAG-CBOR (shorter key first).
        let rec = [
            0xa2, 0x61, b'n', 0x03, 0x65, b'$', b't', b'y', b'p', b'e', 0x65, b'a', b'.', b'b',
            b'.', b'c',
        ];
        let create = |seq, kind| Row {
            kind,
            payload: &rec,
            ..delete(seq)
        };
        body.clear();
        encode_block(
            &[create(5, Kind::Create), create(6, Kind::CreateResync)],
            &mut body,
        )
        .unwrap();
        let (mut data, mut starts) = (Vec::new(), Vec::new());
        render_rows((5, 6), 2, &body, &mut data, &mut starts, &mut Vec::new()).unwrap();
        let at = |i: usize| {
            let end = starts.get(i + 1).map_or(data.len(), |&n| n as usize - 4);
            Event::<Utf8Text>::decode(
                5 + i as u64,
                Bytes::copy_from_slice(&data[starts[i] as usize..end]),
            )
            .unwrap()
        };
        let (plain, replacement) = (at(0), at(1));
        assert_eq!(plain.kind(), EventKind::Commit);
        assert_eq!(replacement.kind(), EventKind::Replacement);
        let text = |e: &Event<Utf8Text>| String::from_utf8(e.json().to_vec()).unwrap();
        // The same event but for its time and cursor.
        assert_eq!(
            text(&plain).replace(
                r#""time_us":1005,"cursor":5,"#,
                r#""time_us":1006,"cursor":6,"#
            ),
            text(&replacement)
        );
        assert!(
            text(&replacement).contains(
                r#","kind":"commit","commit":{"rev":"3l3qo2vutsw2b","operation":"create","#
            ),
            "{}",
            text(&replacement)
        );

        // A create whose record is not DAG-CBOR.
        let bad = Row {
            kind: Kind::Create,
            payload: &[0xa2, 0x61],
            ..delete(6)
        };
        body.clear();
        encode_block(&[delete(5), bad], &mut body).unwrap();
        assert_eq!(
            render_rows((5, 6), 2, &body, &mut data, &mut starts, &mut Vec::new()),
            Err("row does not render")
        );
    }

    #[test]
    fn a_folded_block_renders_its_rows_under_their_own_seqs() {
        // What compaction leaves of the block 10..=20: three rows, gaps before, between, after.
        let rows = [delete(12), delete(13), delete(17)];
        let mut body = Vec::new();
        encode_block(&rows, &mut body).unwrap();
        let (mut data, mut starts, mut seqs) = (Vec::new(), Vec::new(), Vec::new());
        render_rows((10, 20), 3, &body, &mut data, &mut starts, &mut seqs).unwrap();
        assert_eq!(seqs, [12, 13, 17]);
        for (i, &s) in starts.iter().enumerate() {
            let end = starts.get(i + 1).map_or(data.len(), |&n| n as usize - 4);
            let e =
                Event::<Utf8Text>::decode(seqs[i], Bytes::copy_from_slice(&data[s as usize..end]))
                    .unwrap();
            let json = String::from_utf8(e.json().to_vec()).unwrap();
            assert!(
                json.contains(&format!(r#""cursor":{},"#, seqs[i])),
                "{json}"
            );
        }
        // Rows that contradict the entry are still refused: outside its bounds on either side,
        // out of order, repeated, or not as many as it says.
        let refused = |rows: &[Row<'_>], first, last, count| {
            let mut body = Vec::new();
            encode_block(rows, &mut body).unwrap();
            let (mut data, mut starts, mut seqs) = (Vec::new(), Vec::new(), Vec::new());
            render_rows(
                (first, last),
                count,
                &body,
                &mut data,
                &mut starts,
                &mut seqs,
            )
            .err()
        };
        assert_eq!(refused(&rows, 13, 20, 3), Some("row seq"));
        assert_eq!(refused(&rows, 10, 16, 3), Some("row seq"));
        assert_eq!(
            refused(&[delete(13), delete(12)], 10, 20, 2),
            Some("row seq")
        );
        assert_eq!(
            refused(&[delete(13), delete(13)], 10, 20, 2),
            Some("row seq")
        );
        assert_eq!(refused(&rows, 10, 20, 2), Some("count"));
        assert_eq!(refused(&rows, 10, 20, 3), None);
        assert_eq!(refused(&rows, 12, 17, 3), None);
    }
}
