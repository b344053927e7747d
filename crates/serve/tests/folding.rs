//! Folding seen from the server (issue 38): a record created, updated and deleted through the
//! ingest path leaves a tombstone; a sealed segment of those rows is folded by the store's
//! compaction thread, the archive serves the rewritten file (the callback `riptide serve` gives
//! the thread: `SealedSegments::add`), and `/metrics` counts the pass, the rows dropped, the file
//! rewritten, `compaction_seq` and the tombstones.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use riptide_jetstream::EventKind;
use riptide_segment::{write_segment, Kind, Row, Segment};
use riptide_serve::archive::{Archive, ArchiveConfig, SealedSegments};
use riptide_serve::{App, Event, Log, Metrics, ServerConfig, Store, TailLimits};
use riptide_store::catalog::SegmentEntry;
use riptide_store::folding::CompactionConfig;
use riptide_store::Resume;

async fn metrics(addr: SocketAddr) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").await.unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).await.unwrap();
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_folded_segment_is_served_again_and_counted_in_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = Store::open(dir.path(), 0).unwrap();
    let did = "did:plc:aaaaaaaaaaaaaaaaaaaaaaaa";
    let row = |seq: u64, kind: Kind, rkey: &'static str| Row {
        seq,
        witnessed_at: 1_764_000_000_000_000 + seq as i64,
        indexed_at: 0,
        kind,
        did,
        collection: "app.bsky.feed.post",
        rkey,
        rev: "3l3qo2vutsw2b",
        payload: if kind == Kind::Delete { b"" } else { b"\xa0" },
    };
    // k1 created, updated, deleted; k2 created: the delete supersedes k1's create and update.
    let rows = [
        row(1, Kind::Create, "k1"),
        row(2, Kind::Update, "k1"),
        row(3, Kind::Delete, "k1"),
        row(4, Kind::Create, "k2"),
    ];
    let events: Vec<Event> = rows
        .iter()
        .map(|r| {
            Event::encode(
                r.seq,
                r.display_time_us(),
                EventKind::Commit,
                did,
                r.collection,
                b"{}",
                b"",
            )
        })
        .collect();
    let resume = Resume {
        next_seq: 5,
        last_time_us: rows[3].display_time_us(),
        upstream_cursor: Some(4),
    };
    store
        .append_rows(&events, &rows, &[], &[], &resume)
        .unwrap();
    // The segment sealing will make of them.
    let segments = dir.path().join("segments");
    std::fs::create_dir_all(&segments).unwrap();
    let file = write_segment(&[&rows[..2], &rows[2..]]).unwrap();
    let header = *Segment::open(&file).unwrap().header();
    let entry = SegmentEntry::from_header(0, &header, 0);
    std::fs::write(segments.join(entry.name()), &file).unwrap();
    store.put_segment_entry_for_tests(&entry);

    let sealed = Arc::new(SealedSegments::scan(&segments).unwrap());
    assert_eq!(
        sealed.get(0).unwrap().meta.header().checksum,
        header.checksum
    );
    let rewritten = sealed.clone();
    store
        .start_compaction(CompactionConfig::default(), move |p| {
            rewritten.add(p).unwrap();
        })
        .unwrap();
    let log = Arc::new(Log::new(store, resume.next_seq, TailLimits::default()));
    let config = ServerConfig {
        archive: Some(Arc::new(Archive::new(
            sealed.clone(),
            ArchiveConfig::default(),
        ))),
        ..ServerConfig::default()
    };
    let app = App::new(log.clone(), Arc::new(Metrics::default()), config);
    let addr = common::listen(app).await;
    let before = metrics(addr).await;
    assert!(
        before.contains("\nriptide_compaction_passes_total 0\n")
            && before.contains("\nriptide_store_tombstones 1\n"),
        "{before}"
    );

    log.store().request_compaction();
    let start = Instant::now();
    while log.store().folding_stats().passes == 0 {
        assert!(start.elapsed() < Duration::from_secs(120), "no pass");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The archive serves the new generation: its checksum is the one on disk, which is not the
    // sealed one.
    let now = std::fs::read(segments.join(entry.name())).unwrap();
    let folded = Segment::open(&now).unwrap();
    assert_ne!(folded.header().checksum, header.checksum);
    assert_eq!(
        sealed.get(0).unwrap().meta.header().checksum,
        folded.header().checksum
    );
    let body = metrics(addr).await;
    for line in [
        "riptide_compaction_passes_total 1",
        "riptide_compaction_failures_total 0",
        "riptide_compaction_rows_dropped_total 2",
        "riptide_compaction_segments_rewritten_total 1",
        "riptide_compaction_seq 4",
        "riptide_store_tombstone_errors_total 0",
    ] {
        assert!(body.contains(&format!("\n{line}\n")), "{line}\n{body}");
    }
}
