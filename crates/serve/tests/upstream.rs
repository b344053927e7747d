//! The upstream source against a loopback `riptide-relay`: what the server does when the relay no
//! longer holds its cursor (`#info OutdatedCursor`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use riptide_firehose::corpus::split_frames;
use riptide_relay::{Relay, RelayConfig};
use riptide_serve::{upstream, Metrics, UpstreamConfig};

const T: Duration = Duration::from_secs(60);

/// Runs the upstream source from `cursor` against a relay keeping the last 50 of the capture's
/// frames; returns the upstream seqs handed to ingest (up to the relay's head), the metrics and
/// the head.
async fn ingest_from(cursor: Option<u64>) -> Option<(Vec<u64>, Arc<Metrics>, u64)> {
    let file = Bytes::from(riptide_testdata::read(
        "jetstream-2026-07/firehose-frames.bin",
    )?);
    let frames: Vec<Bytes> = split_frames(&file)
        .unwrap()
        .iter()
        .map(|f| file.slice(f.offset..f.offset + f.bytes.len()))
        .collect();
    let config = RelayConfig {
        window: 50,
        ..RelayConfig::default()
    };
    let (_, relay) = Relay::bind("127.0.0.1:0".parse().unwrap(), frames.clone(), config)
        .await
        .unwrap();
    let head = (frames.len() - relay.left_out().len()) as u64;
    assert!(head > 100, "{head} servable frames");
    relay.wait_for_head(head).await;
    let metrics = Arc::new(Metrics::default());
    let (tx, mut rx) = tokio::sync::mpsc::channel(16);
    let source = tokio::spawn(upstream::run(
        UpstreamConfig::new(vec![relay.url()]),
        cursor,
        metrics.clone(),
        tx,
    ));
    let mut seqs = Vec::new();
    while seqs.last() != Some(&head) {
        let up = tokio::time::timeout(T, rx.recv()).await.unwrap().unwrap();
        seqs.push(up.seq());
    }
    drop(rx);
    source.abort();
    relay.shutdown().await;
    Some((seqs, metrics, head))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outdated_cursor_is_a_counted_gap_and_ingest_goes_on() {
    // Cursor 10, but the relay keeps only its last 50 events: it says OutdatedCursor and goes
    // on from its oldest. Everything it still has is ingested, in order; the gap is counted with
    // its size.
    let Some((seqs, m, head)) = ingest_from(Some(10)).await else {
        return;
    };
    let oldest = head - 49;
    assert_eq!(seqs, (oldest..=head).collect::<Vec<_>>());
    assert_eq!(m.upstream_info.load(Relaxed), 1);
    assert_eq!(m.upstream_gaps.load(Relaxed), 1);
    assert_eq!(m.upstream_gap_seqs.load(Relaxed), oldest - 11);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cursor_the_relay_still_holds_has_no_gap() {
    let Some((seqs, m, head)) = ingest_from(Some(120)).await else {
        return;
    };
    assert_eq!(seqs, (121..=head).collect::<Vec<_>>());
    assert_eq!(m.upstream_gaps.load(Relaxed), 0);
    assert_eq!(m.upstream_gap_seqs.load(Relaxed), 0);
}
