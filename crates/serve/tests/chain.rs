//! Chain state in the server's ingest: a generated stream with every stream-level defect goes
//! through the real pipeline (several workers, small batches), and the verdicts, the events served
//! and the durable account states are what a single in-memory verifier gives; ingest stopped and
//! resumed from the store continues the same chain.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use riptide_firehose::chain::AccountState;
use riptide_firehose::verify::{Verdict, Verifier};
use riptide_gen::network::did_docs;
use riptide_gen::{Config, Network};
use riptide_identity::DidDocs;
use riptide_serve::{ingest, IngestConfig, Keys, Log, Metrics, Resume, Store, TailLimits};

struct Stream {
    frames: Vec<Vec<u8>>,
    docs: DidDocs,
    /// Expected verdict per frame (`ok` unless labelled).
    expected: Vec<&'static str>,
}

fn stream(seed: u64, accounts: usize, events: u64) -> Stream {
    let mut cfg = Config::new(seed, accounts, events);
    cfg.adversarial = 0.05;
    let mut net = Network::new(cfg).unwrap();
    let mut frames = Vec::new();
    net.run(|f: &[u8]| -> Result<(), riptide_gen::GenError> {
        frames.push(f.to_vec());
        Ok(())
    })
    .unwrap();
    let mut expected = vec!["ok"; frames.len()];
    for e in net.adversarial() {
        expected[e.index as usize] = e.expected_verdict;
    }
    let json = serde_json::to_vec(&did_docs(net.accounts())).unwrap();
    Stream {
        frames,
        docs: DidDocs::from_slice(&json).unwrap(),
        expected,
    }
}

/// Runs `frames` (upstream seqs `first`..) through ingest into the store at `dir`.
async fn ingest_into(
    dir: &std::path::Path,
    keys: Keys,
    frames: &[Vec<u8>],
    first: u64,
) -> (Arc<Metrics>, Resume, Store) {
    let (store, resume) = Store::open(dir, 0).unwrap();
    let log = Arc::new(Log::new(
        store.clone(),
        resume.next_seq,
        TailLimits::default(),
    ));
    let metrics = Arc::new(Metrics::default());
    let mut cfg = IngestConfig::verifying(keys);
    cfg.workers = 3;
    cfg.max_batch = 50;
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let h = ingest::spawn(cfg, log.clone(), metrics.clone(), resume, rx).unwrap();
    for (i, f) in frames.iter().enumerate() {
        tx.send((first + i as u64, Bytes::copy_from_slice(f)).into())
            .await
            .unwrap();
    }
    drop(tx);
    let s = tokio::task::spawn_blocking(move || h.join())
        .await
        .unwrap()
        .unwrap();
    (metrics, s.resume, store)
}

fn counts(verdicts: impl IntoIterator<Item = &'static str>) -> BTreeMap<&'static str, u64> {
    let mut m = BTreeMap::new();
    for v in verdicts {
        *m.entry(v).or_insert(0) += 1;
    }
    m
}

fn metric_counts(m: &Metrics) -> BTreeMap<&'static str, u64> {
    Verdict::ALL
        .iter()
        .map(|&v| (v.as_str(), m.verdict_count(v)))
        .filter(|&(_, n)| n > 0)
        .collect()
}

fn stored_accounts(store: &Store) -> Vec<(String, AccountState)> {
    store.accounts().map(Result::unwrap).collect()
}

fn reference(s: &Stream) -> (Vec<&'static str>, Vec<(String, AccountState)>) {
    let keys = Keys::from_docs(s.docs.clone());
    let mut v = Verifier::new(keys);
    let verdicts = s.frames.iter().map(|f| v.verify(f).as_str()).collect();
    let mut states: Vec<(String, AccountState)> =
        v.chain().iter().map(|(d, s)| (d.to_owned(), *s)).collect();
    states.sort_by(|a, b| a.0.cmp(&b.0));
    (verdicts, states)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingest_checks_every_frame_against_durable_chain_state() {
    let s = stream(21, 15, 1500);
    let (ref_verdicts, ref_states) = reference(&s);
    assert_eq!(
        ref_verdicts, s.expected,
        "the in-memory verifier gives the labels"
    );
    for v in [
        "rev-regression",
        "chain-break",
        "future-rev",
        "account-inactive",
    ] {
        assert!(s.expected.contains(&v), "{v} in the stream");
    }

    let dir = tempfile::tempdir().unwrap();
    let (metrics, resume, store) =
        ingest_into(dir.path(), Keys::from_docs(s.docs.clone()), &s.frames, 1).await;
    assert_eq!(metric_counts(&metrics), counts(s.expected.iter().copied()));
    assert_eq!(resume.upstream_cursor, Some(1500));
    assert_eq!(stored_accounts(&store), ref_states);

    // Events come only from frames that verified: the same number a stateless ingest of the
    // frames labelled ok gives.
    let ok: Vec<Vec<u8>> = s
        .frames
        .iter()
        .zip(&s.expected)
        .filter(|(_, v)| **v == "ok")
        .map(|(f, _)| f.clone())
        .collect();
    let dir2 = tempfile::tempdir().unwrap();
    let (store2, r2) = Store::open(dir2.path(), 0).unwrap();
    let log2 = Arc::new(Log::new(store2, r2.next_seq, TailLimits::default()));
    let m2 = Arc::new(Metrics::default());
    let mut cfg = IngestConfig::verifying(Keys::from_docs(s.docs.clone()));
    cfg.stateful = false;
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let h = ingest::spawn(cfg, log2, m2, r2, rx).unwrap();
    for (i, f) in ok.iter().enumerate() {
        tx.send((1 + i as u64, Bytes::copy_from_slice(f)).into())
            .await
            .unwrap();
    }
    drop(tx);
    let s2 = tokio::task::spawn_blocking(move || h.join())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(resume.next_seq, s2.resume.next_seq);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingest_resumed_from_the_store_continues_the_chain() {
    let s = stream(22, 12, 1200);
    let (ref_verdicts, ref_states) = reference(&s);
    let dir = tempfile::tempdir().unwrap();
    let keys = Keys::from_docs(s.docs.clone());
    // Stopped after 500 frames, reopened, the rest: the verifiers' caches start empty and read
    // the states the first run stored.
    let (m1, r1, store) = ingest_into(dir.path(), keys.clone(), &s.frames[..500], 1).await;
    assert_eq!(r1.upstream_cursor, Some(500));
    drop(store);
    let (m2, r2, store) = ingest_into(dir.path(), keys, &s.frames[500..], 501).await;
    assert_eq!(r2.upstream_cursor, Some(1200));
    let mut got = metric_counts(&m1);
    for (v, n) in metric_counts(&m2) {
        *got.entry(v).or_insert(0) += n;
    }
    assert_eq!(got, counts(ref_verdicts.iter().copied()));
    assert_eq!(
        metric_counts(&m2),
        counts(ref_verdicts[500..].iter().copied())
    );
    assert_eq!(stored_accounts(&store), ref_states);
}
