//! v1 JSON made again from stored rows (issue 38: the store keeps `.jss` rows, not JSON) is byte
//! for byte the JSON projected from the frames, for every event of the real capture and of a
//! generated stream that has every kind (creates, updates, deletes, identity, account, `#sync`).
//! The oracle is the projection of the frame itself, which `capture_projection.rs` checks against
//! production Jetstream; the row side knows nothing of the frame but the row (the record's CID is
//! recomputed from its bytes, the identity, account and sync payloads decoded again).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use riptide_firehose::corpus::split_frames;
use riptide_firehose::{Action, FrameDecoder};
use riptide_jetstream::{EventRowKind, Projector, RowError, StoredRow};
use riptide_segment::Row;

/// What the frames gave: events compared, and how many of each kind of row.
#[derive(Debug, Default)]
struct Seen {
    events: usize,
    creates: usize,
    updates: usize,
    deletes: usize,
    identity: usize,
    account: usize,
    sync: usize,
}

/// Projects every frame, makes each event's row, renders the row again and compares; then
/// renders the same rows again as the store does, a block at a time ([`Projector::project_rows`],
/// its CIDs hashed together), from the `.jss` rows they become, and compares again.
fn check<'a>(frames: impl IntoIterator<Item = &'a [u8]>) -> Seen {
    let mut stored = Vec::new();
    let mut dec = FrameDecoder::new();
    let mut from_frames = Projector::with_sync();
    let mut from_rows = Projector::new();
    let mut seen = Seen::default();
    let (mut want, mut got) = (Vec::new(), Vec::new());
    for bytes in frames {
        let Ok(frame) = dec.decode(bytes) else {
            continue;
        };
        let p = from_frames.project(&frame);
        let rows = p.stored_rows(&frame).unwrap();
        assert_eq!(rows.len(), p.len());
        for (i, row) in rows.iter().enumerate() {
            seen.events += 1;
            let (seq, time_us) = (
                seen.events as u64,
                1_750_000_000_000_000 + seen.events as i64,
            );
            want.clear();
            p.render(i, time_us, Some(seq), &mut want);
            match row {
                StoredRow::Commit { action, .. } => match action {
                    Action::Create => seen.creates += 1,
                    Action::Update => seen.updates += 1,
                    Action::Delete => seen.deletes += 1,
                },
                StoredRow::Event { kind, .. } => match kind {
                    EventRowKind::Identity => seen.identity += 1,
                    EventRowKind::Account => seen.account += 1,
                    EventRowKind::Sync => seen.sync += 1,
                },
            }
            got.clear();
            from_rows
                .project_row(row)
                .unwrap_or_else(|e| panic!("event {}: {e}", seen.events))
                .render(0, time_us, Some(seq), &mut got);
            assert_eq!(
                String::from_utf8_lossy(&got),
                String::from_utf8_lossy(&want),
                "event {} ({row:?})",
                seen.events
            );
            stored.push((row.row(seq, time_us).to_owned_row(), want.clone()));
        }
    }
    // Blocks of an odd size, so that a block's records are hashed in lanes of every fill.
    let mut blocks = 0;
    for block in stored.chunks(97) {
        let rows: Vec<Row<'_>> = block.iter().map(|(r, _)| r.as_row()).collect();
        let rows: Vec<StoredRow<'_>> = rows.iter().map(StoredRow::from_row).collect();
        let mut rendered = 0;
        from_rows.project_rows(&rows, |i, p| {
            let (row, want) = &block[i];
            got.clear();
            p.unwrap_or_else(|e| panic!("seq {}: {e}", row.seq)).render(
                0,
                row.witnessed_at,
                Some(row.seq),
                &mut got,
            );
            assert_eq!(
                String::from_utf8_lossy(&got),
                String::from_utf8_lossy(want),
                "seq {} rendered in a block",
                row.seq
            );
            rendered += 1;
        });
        assert_eq!(rendered, block.len());
        blocks += 1;
    }
    assert_eq!(blocks, stored.len().div_ceil(97));
    seen
}

#[test]
fn every_event_of_the_capture_renders_again_from_its_row() {
    let Some(file) = riptide_testdata::read("jetstream-2026-07/firehose-frames.bin") else {
        return;
    };
    let frames = split_frames(&file).unwrap();
    let seen = check(frames.iter().map(|f| f.bytes));
    // The manifest: 144 creates, 2 updates, 4 deletes in 148 commits (production Jetstream
    // emitted 152 events, with the identity and the account event).
    assert_eq!(seen.events, 152, "{seen:?}");
    assert_eq!(
        (
            seen.creates,
            seen.updates,
            seen.deletes,
            seen.identity,
            seen.account
        ),
        (144, 2, 4, 1, 1),
        "{seen:?}"
    );
}

#[test]
fn every_event_of_a_generated_stream_renders_again_from_its_row() {
    let mut net = riptide_gen::Network::new(riptide_gen::Config::new(38, 200, 6_000)).unwrap();
    let mut frames = Vec::new();
    net.run(|f: &[u8]| -> Result<(), riptide_gen::GenError> {
        frames.push(f.to_vec());
        Ok(())
    })
    .unwrap();
    let seen = check(frames.iter().map(Vec::as_slice));
    assert!(seen.events >= 6_000, "{seen:?}");
    // Every kind of row is exercised.
    for (kind, n) in [
        ("create", seen.creates),
        ("update", seen.updates),
        ("delete", seen.deletes),
        ("identity", seen.identity),
        ("account", seen.account),
        ("sync", seen.sync),
    ] {
        assert!(n > 0, "no {kind} row in {seen:?}");
    }
}

#[test]
fn a_damaged_row_is_a_typed_error_not_an_event() {
    let mut proj = Projector::new();
    // A record cut short: not DAG-CBOR.
    let cut = StoredRow::Commit {
        did: "did:plc:a",
        rev: "3l3qo2vutsw2b",
        action: Action::Create,
        collection: "app.bsky.feed.post",
        rkey: "3l3qo2vutsw2b",
        record: Some(&[0xa2, 0x61, b'a']),
    };
    assert!(matches!(proj.project_row(&cut), Err(RowError::Record(_))));
    // An identity payload that is not one.
    let junk = StoredRow::Event {
        kind: EventRowKind::Identity,
        did: "did:plc:a",
        payload: b"not cbor",
    };
    assert!(matches!(proj.project_row(&junk), Err(RowError::Payload(_))));
    // A well-formed payload whose DID is not one is refused as the frame would be.
    let mut payload = Vec::new();
    riptide_cbor::write_map_header(&mut payload, 3);
    for (k, v) in [
        ("did", "nope"),
        ("seq", ""),
        ("time", "2026-07-04T00:00:00Z"),
    ] {
        riptide_cbor::write_text(&mut payload, k);
        if k == "seq" {
            riptide_cbor::write_int(&mut payload, 1);
        } else {
            riptide_cbor::write_text(&mut payload, v);
        }
    }
    let bad_did = StoredRow::Event {
        kind: EventRowKind::Identity,
        did: "nope",
        payload: &payload,
    };
    let e = proj.project_row(&bad_did).map(|p| p.len()).unwrap_err();
    assert!(matches!(e, RowError::Payload(_)), "{e:?}");
    assert!(e.to_string().contains("did"), "{e}");
    // A projector that failed a row renders the next good one.
    let ok = StoredRow::Commit {
        did: "did:plc:a",
        rev: "3l3qo2vutsw2b",
        action: Action::Delete,
        collection: "app.bsky.feed.post",
        rkey: "3l3qo2vutsw2b",
        record: None,
    };
    let mut out = Vec::new();
    proj.project_row(&ok)
        .unwrap()
        .render(0, 1, Some(1), &mut out);
    let want = r#"{"did":"did:plc:a","time_us":1,"cursor":1,"kind":"commit","commit":{"rev":"3l3qo2vutsw2b","operation":"delete","collection":"app.bsky.feed.post","rkey":"3l3qo2vutsw2b"}}"#;
    assert_eq!(String::from_utf8(out).unwrap(), want);
    // In a block, each damaged row is its own error and the good rows around it render.
    let block = [ok, cut, junk, ok, bad_did, ok];
    let mut results = Vec::new();
    proj.project_rows(&block, |i, p| {
        results.push(match p {
            Ok(p) => {
                let mut out = Vec::new();
                p.render(0, 1, Some(1), &mut out);
                Ok(String::from_utf8(out).unwrap())
            }
            Err(e) => Err((i, e.to_string())),
        });
    });
    assert_eq!(results.len(), 6);
    for i in [0, 3, 5] {
        assert_eq!(results[i].as_deref(), Ok(want), "row {i}");
    }
    for i in [1, 2, 4] {
        assert!(
            matches!(&results[i], Err((j, _)) if *j == i),
            "row {i}: {:?}",
            results[i]
        );
    }
}
