//! The store's compressed blocks (`store.rs`, layout 3, checksummed since 4, rows since 5) on the wire: the real capture ingested
//! into a store that seals small blocks, replayed from disk (sealed blocks and unsealed events)
//! and from memory, on both wires, plain and compressed: byte for byte the same messages, and
//! v1's zstd frames made at send time identical to the ones ingest made.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use riptide_firehose::corpus::split_frames;
use riptide_identity::DidDocs;
use riptide_serve::{
    ingest, router, App, Dictionary, Event, IngestConfig, Keys, Log, Metrics, ReadLimit,
    ServerConfig, Store, StoreOptions, TailLimits,
};
use tokio_tungstenite::tungstenite::Message;

const T: Duration = Duration::from_secs(120);

/// Blocks of 16 events, the last of a sealing up to 31 (the capture has 152).
const SMALL: StoreOptions = StoreOptions {
    block_events: 16,
    block_bytes: 1 << 20,
    block_cache: 2,
    segment_bytes: None,
};

fn dictionary(name: &str) -> Dictionary {
    let dir = riptide_testdata::corpus().unwrap();
    Dictionary::load(&dir.join("jetstream-dictionaries").join(name)).unwrap()
}

/// Ingests the capture into a store at `dir` sealing [`SMALL`] blocks: the log, every event (all
/// 152 of them: asserted) in its tail.
async fn ingest_capture(dir: &Path) -> Option<Arc<Log>> {
    ingest_capture_with(dir, SMALL).await
}

/// [`ingest_capture`] with other store options.
async fn ingest_capture_with(dir: &Path, opts: StoreOptions) -> Option<Arc<Log>> {
    let file = riptide_testdata::read("jetstream-2026-07/firehose-frames.bin")?;
    let corpus = riptide_testdata::corpus().unwrap();
    let keys =
        Keys::from_docs(DidDocs::load(&corpus.join("jetstream-2026-07/did_docs.json")).unwrap());
    let dict = dictionary("legacy_subscribe.zdict");
    let (store, resume) = Store::open_with(dir, dict.id(), opts).unwrap();
    let log = Arc::new(Log::new(store, resume.next_seq, TailLimits::default()));
    let frames = split_frames(&file).unwrap();
    // As if a `compress=true` subscriber were connected throughout: ingest makes every event's
    // zstd form (`riptide_serve::log`), which unsealed events keep and sealed ones do not; that
    // is how these tests tell them apart.
    let compressed = log.zstd_demand().join();
    // Two runs: the second's few events stay unsealed (one batch seals all that are unsealed).
    let (mut resume, mut events) = (resume, 0);
    for (from, to) in [(0, 140), (140, frames.len())] {
        let mut cfg = IngestConfig::verifying(keys.clone());
        cfg.dictionary = Some(dict.clone());
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        let h = ingest::spawn(cfg, log.clone(), Arc::new(Metrics::default()), resume, rx).unwrap();
        for (i, f) in frames.iter().enumerate().take(to).skip(from) {
            tx.send((i as u64 + 1, Bytes::copy_from_slice(f.bytes)).into())
                .await
                .unwrap();
        }
        drop(tx);
        let s = tokio::task::spawn_blocking(move || h.join())
            .await
            .unwrap()
            .unwrap();
        resume = s.resume;
        events += s.events;
    }
    drop(compressed);
    assert_eq!(events, 152);
    Some(log)
}

async fn serve(log: Arc<Log>) -> SocketAddr {
    serve_with(log, ServerConfig::default()).await
}

async fn serve_with(log: Arc<Log>, config: ServerConfig) -> SocketAddr {
    serving(log, config).await.0
}

/// [`serve_with`], with the server's task (aborting it lets go of the store, once its last
/// connection has ended).
async fn serving(log: Arc<Log>, config: ServerConfig) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let app = App::new(
        log,
        Arc::new(Metrics::default()),
        ServerConfig {
            v1_dictionary: Some(dictionary("legacy_subscribe.zdict")),
            v2_dictionary: Some(dictionary("subscribe_events_20260811.zdict")),
            ..config
        },
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, router(app)).await;
    });
    (addr, task)
}

/// The payloads of the first `n` messages of `path` (a `?cursor=…` subscription).
async fn messages(addr: SocketAddr, path: &str, n: usize) -> Vec<Vec<u8>> {
    let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{addr}{path}"))
        .await
        .unwrap();
    let mut out = Vec::new();
    while out.len() < n {
        match tokio::time::timeout(T, ws.next()).await.unwrap() {
            Some(Ok(Message::Text(t))) => out.push(t.as_bytes().to_vec()),
            Some(Ok(Message::Binary(b))) => out.push(b.to_vec()),
            Some(Ok(_)) => {}
            other => panic!("after {} messages: {other:?}", out.len()),
        }
    }
    out
}

/// A log over the same store with an empty tail: every read goes to the store.
fn disk_only(log: &Log, next_seq: u64) -> Arc<Log> {
    Arc::new(Log::new(
        log.store().clone(),
        next_seq,
        TailLimits {
            max_events: 0,
            max_bytes: 0,
        },
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sealed_blocks_replay_byte_for_byte_on_both_wires() {
    let dir = tempfile::tempdir().unwrap();
    let Some(log) = ingest_capture(dir.path()).await else {
        return;
    };
    let next = log.next_seq();
    // What ingest made: every event in the tail, with the zstd form made at ingest.
    let mut tail: Vec<Event> = Vec::new();
    let all = ReadLimit {
        events: 1000,
        bytes: 1 << 30,
    };
    log.read(1, all, &mut tail).unwrap();
    assert_eq!(tail.len(), 152);
    // The store: the sealed events have no zstd form, the last 8 theirs.
    let mut stored = Vec::new();
    log.store().read_from(1, all, &mut stored).unwrap();
    let unsealed = stored.iter().filter(|e| !e.zstd().is_empty()).count();
    assert!((1..16).contains(&unsealed), "{unsealed} unsealed");
    let v1_text: Vec<Vec<u8>> = tail.iter().map(|e| e.json().to_vec()).collect();
    let v1_zstd: Vec<Vec<u8>> = tail.iter().map(|e| e.zstd().to_vec()).collect();
    assert!(v1_zstd.iter().all(|z| !z.is_empty()));

    let (mem, mem_task) = serving(log.clone(), ServerConfig::default()).await;
    let (disk, disk_task) = serving(disk_only(&log, next), ServerConfig::default()).await;
    let v2 = "/xrpc/network.bsky.jetstream.subscribeEvents?cursor=0";
    let v2z = "/xrpc/network.bsky.jetstream.subscribeEvents?cursor=0&zstdDictionary=20260811";
    for addr in [mem, disk] {
        assert_eq!(messages(addr, "/subscribe?cursor=0", 152).await, v1_text);
        // Sealed events' frames are made at send time: exactly the ones ingest made.
        assert_eq!(
            messages(addr, "/subscribe?cursor=0&compress=true", 152).await,
            v1_zstd
        );
    }
    assert_eq!(messages(mem, v2, 152).await, messages(disk, v2, 152).await);
    assert_eq!(
        messages(mem, v2z, 152).await,
        messages(disk, v2z, 152).await
    );

    // Reopened: the unsealed events come back from `recent`, the rest from the blocks. The
    // servers go first: a data directory is one store's at a time (`riptide_store::lock`), and
    // their last connections end a moment after the clients close them.
    let store = log.store().clone();
    drop(log);
    let dir_path = store.dir().to_path_buf();
    drop(store);
    for t in [mem_task, disk_task] {
        t.abort();
        let _ = t.await;
    }
    let dict = dictionary("legacy_subscribe.zdict");
    let (store, resume) = common::reopen(&dir_path, dict.id(), SMALL).await;
    assert_eq!(resume.next_seq, next);
    // Ingest handed every event's row: all the sealed blocks are row blocks (layout 5), so every
    // message above from the disk-only servers was rendered from rows.
    let c = store.check().unwrap();
    assert!(c.blocks > 0 && c.row_blocks == c.blocks, "{c:?}");
    let reopened = Arc::new(Log::new(store, resume.next_seq, TailLimits::default()));
    let again = serve(disk_only(&reopened, next)).await;
    assert_eq!(messages(again, "/subscribe?cursor=0", 152).await, v1_text);
    assert_eq!(
        messages(again, "/subscribe?cursor=0&compress=true", 152).await,
        v1_zstd
    );
}

/// One `/metrics` sample's value.
async fn metric(addr: SocketAddr, name: &str) -> f64 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").await.unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).await.unwrap();
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in /metrics"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_from_disk_loads_each_block_ahead_of_its_reader() {
    // One reader from the start of a disk-only log: it loads the first block itself, and later
    // ones are loaded ahead of it (`store.rs`, "Read-ahead") while it sends the one before
    // (not all: a read of 16 KiB spans two of these small blocks at times, and loads the
    // second itself); each block is loaded once, and it gets what it got from memory.
    let dir = tempfile::tempdir().unwrap();
    let Some(log) = ingest_capture(dir.path()).await else {
        return;
    };
    let next = log.next_seq();
    let blocks = log.store().block_count().unwrap();
    assert!(blocks >= 7, "{blocks} blocks");
    let mem = serve(log.clone()).await;
    let addr = serve(disk_only(&log, next)).await;
    let v2 = "/xrpc/network.bsky.jetstream.subscribeEvents?cursor=0";
    for path in ["/subscribe?cursor=0", v2] {
        let loads0 = metric(addr, "riptide_block_cache_loads_total").await;
        let ahead0 = metric(addr, "riptide_block_cache_ahead_total").await;
        assert_eq!(
            messages(addr, path, 152).await,
            messages(mem, path, 152).await
        );
        let loads = metric(addr, "riptide_block_cache_loads_total").await - loads0;
        let ahead = metric(addr, "riptide_block_cache_ahead_total").await - ahead0;
        // The cache (2) is smaller than the store, so each replay loads every block again.
        assert_eq!(loads, blocks as f64, "{path}");
        assert!(
            ahead >= 1.0 && ahead < loads,
            "{path}: {ahead} of {loads} ahead"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_behind_the_tail_share_each_decompressed_block() {
    // Eight replays from disk at once, on both wires, through a block cache that holds every
    // block: each block is decompressed once, not once per reader, and the readers get the
    // same messages as one reader alone.
    let dir = tempfile::tempdir().unwrap();
    let opts = StoreOptions {
        block_cache: 64,
        ..SMALL
    };
    let Some(log) = ingest_capture_with(dir.path(), opts).await else {
        return;
    };
    let next = log.next_seq();
    let disk = disk_only(&log, next);
    // One block load at a time: a reader waiting for the block another is loading finds it.
    let config = ServerConfig {
        store_readers: 1,
        ..ServerConfig::default()
    };
    let addr = serve_with(disk.clone(), config).await;
    let v2 = "/xrpc/network.bsky.jetstream.subscribeEvents?cursor=0";
    let readers: Vec<_> = (0..8)
        .map(|i| {
            let path = if i % 2 == 0 {
                "/subscribe?cursor=0"
            } else {
                v2
            };
            tokio::spawn(async move { messages(addr, path, 152).await })
        })
        .collect();
    let mut got = Vec::new();
    for r in readers {
        got.push(r.await.unwrap());
    }
    let loads = metric(addr, "riptide_block_cache_loads_total").await;
    let hits = metric(addr, "riptide_block_cache_hits_total").await;
    assert!(metric(addr, "riptide_block_cache_bytes").await > 0.0);
    // The sealed events (those without their zstd form) and so the blocks: 16 events each.
    let mut stored = Vec::new();
    let all = ReadLimit {
        events: 1000,
        bytes: 1 << 30,
    };
    disk.store().read_from(1, all, &mut stored).unwrap();
    let sealed = stored.iter().filter(|e| e.zstd().is_empty()).count();
    assert!(sealed >= 128, "{sealed} sealed");
    let blocks = disk.store().block_count().unwrap() as f64;
    assert_eq!(loads, blocks, "each block decompressed once ({hits} hits)");
    assert!(hits >= 7.0 * blocks, "{hits} hits");
    // Both wires, every reader the same messages as a reader alone.
    let alone_v1 = messages(addr, "/subscribe?cursor=0", 152).await;
    let alone_v2 = messages(addr, v2, 152).await;
    for (i, g) in got.iter().enumerate() {
        assert_eq!(
            g,
            if i % 2 == 0 { &alone_v1 } else { &alone_v2 },
            "reader {i}"
        );
    }
}

/// A GET over HTTP/1.0: the status and the JSON body.
async fn get_json(addr: SocketAddr, path: &str) -> (u16, serde_json::Value) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.0\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).await.unwrap();
    let (head, json) = body.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap();
    (status, serde_json::from_str(json).unwrap())
}

/// `serve --segment-bytes` (issue 38, "Sealing"): the capture ingested into a store that seals
/// a segment every few blocks, the server's own seal loop sealing them and handing each file to
/// the archive; replays from cursor 0 on both wires, from disk (segments, blocks and unsealed
/// events) and after a reopen, are byte for byte what ingest made, and `listSegments` lists
/// exactly the store's segments.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sealed_segments_replay_byte_for_byte_and_the_archive_lists_them() {
    use riptide_serve::archive::{Archive, ArchiveConfig, SealedSegments};
    let sealing = StoreOptions {
        segment_bytes: Some(4_000),
        ..SMALL
    };
    let dir = tempfile::tempdir().unwrap();
    let Some(log) = ingest_capture_with(dir.path(), sealing).await else {
        return;
    };
    let next = log.next_seq();
    let mut tail: Vec<Event> = Vec::new();
    let all = ReadLimit {
        events: 1000,
        bytes: 1 << 30,
    };
    log.read(1, all, &mut tail).unwrap();
    let v1_text: Vec<Vec<u8>> = tail.iter().map(|e| e.json().to_vec()).collect();
    let v1_zstd: Vec<Vec<u8>> = tail.iter().map(|e| e.zstd().to_vec()).collect();

    let store = log.store().clone();
    let segments = Arc::new(SealedSegments::start(&store.segments_dir(), &[]).unwrap());
    let metrics = Arc::new(Metrics::default());
    let sealer = tokio::spawn(riptide_serve::seal_loop(
        log.clone(),
        segments.clone(),
        metrics.clone(),
        Duration::from_millis(10),
    ));
    // Poll until the loop has sealed all it should and the archive holds every file.
    let deadline = std::time::Instant::now() + T;
    while store.seal_due()
        || store.segment_entries().is_empty()
        || segments.snapshot().len() != store.segment_entries().len()
    {
        assert!(std::time::Instant::now() < deadline, "no seal");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    sealer.abort();
    let _ = sealer.await;
    let entries = store.segment_entries();
    assert!(entries.len() >= 3, "{} segments", entries.len());
    let sealed = metrics
        .segments_sealed
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(sealed, entries.len() as u64);

    let archive = Arc::new(Archive::new(segments, ArchiveConfig::default()));
    let config = || ServerConfig {
        archive: Some(archive.clone()),
        ..ServerConfig::default()
    };
    let (mem, mem_task) = serving(log.clone(), config()).await;
    let (disk, disk_task) = serving(disk_only(&log, next), config()).await;
    let v2 = "/xrpc/network.bsky.jetstream.subscribeEvents?cursor=0";
    for addr in [mem, disk] {
        assert_eq!(messages(addr, "/subscribe?cursor=0", 152).await, v1_text);
        assert_eq!(
            messages(addr, "/subscribe?cursor=0&compress=true", 152).await,
            v1_zstd
        );
    }
    assert_eq!(messages(mem, v2, 152).await, messages(disk, v2, 152).await);
    // The archive lists the store's segments, by name and seq range.
    let (status, listed) = get_json(disk, riptide_serve::archive::LIST_SEGMENTS).await;
    assert_eq!(status, 200);
    let listed: Vec<(String, u64, u64)> = listed["segments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["name"].as_str().unwrap().to_string(),
                s["minSeq"].as_u64().unwrap(),
                s["maxSeq"].as_u64().unwrap(),
            )
        })
        .collect();
    let want: Vec<(String, u64, u64)> = entries
        .iter()
        .map(|e| (e.name(), e.min_seq, e.max_seq))
        .collect();
    assert_eq!(listed, want);
    assert_eq!(want[0].1, 1, "sealed from the first seq");

    // Reopened: the segments are the store's again, and the replay is the same.
    drop((log, store, archive));
    for t in [mem_task, disk_task] {
        t.abort();
        let _ = t.await;
    }
    let dict = dictionary("legacy_subscribe.zdict");
    let (store, resume) = common::reopen(dir.path(), dict.id(), sealing).await;
    assert_eq!(resume.next_seq, next);
    assert_eq!(store.segment_entries(), entries);
    let c = store.check().unwrap();
    assert!(
        c.damaged.is_empty() && c.segments == entries.len() as u64,
        "{c:?}"
    );
    assert_eq!(c.events + c.unsealed, 152, "{c:?}");
    let reopened = Arc::new(Log::new(store, resume.next_seq, TailLimits::default()));
    let again = serve(disk_only(&reopened, next)).await;
    assert_eq!(messages(again, "/subscribe?cursor=0", 152).await, v1_text);

    let named: Vec<_> = entries
        .iter()
        .map(|e| reopened.store().segment_path(e))
        .collect();
    let segments = SealedSegments::start(&reopened.store().segments_dir(), &named).unwrap();
    assert_eq!(segments.snapshot().len(), entries.len());
    let archive = Arc::new(Archive::new(Arc::new(segments), ArchiveConfig::default()));
    let config = ServerConfig {
        archive: Some(archive),
        ..ServerConfig::default()
    };
    let again = serve_with(disk_only(&reopened, next), config).await;
    // Retention past every event moves only the live floor, to the newest segment's first seq:
    // below it subscribeEvents says to plan from the archive, which reaches the floor.
    let newest = entries.last().unwrap();
    let x = reopened
        .store()
        .expire(i64::MAX, Duration::from_secs(1))
        .unwrap();
    assert_eq!(x.floor, newest.min_seq);
    let (status, e) = get_json(
        again,
        "/xrpc/network.bsky.jetstream.subscribeEvents?cursor=1",
    )
    .await;
    assert_eq!(
        (status, e["error"].as_str()),
        (400, Some("CursorTooOld")),
        "{e}"
    );
    let m = e["message"].as_str().unwrap();
    assert!(
        m.contains("plan from the archive first") && m.contains(&newest.min_seq.to_string()),
        "{m}"
    );
}
