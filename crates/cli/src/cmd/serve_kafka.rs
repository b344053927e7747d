//! `riptide serve --publish kafka://…` (ingest node) and `--from kafka://…` (edge node): the
//! scale-out modes on Apache Kafka (crate riptide-kafka, `docs/kafka.md`).
//!
//! Why a module: it is the one place the CLI touches Kafka, so the cargo feature `kafka` (on by
//! default) can leave it out; without the feature both flags are refused with one clear error.

use std::sync::Arc;

use riptide_serve::{Dictionary, Log, Metrics, Publish, Resume, Store, Upstream};

/// What an ingest node needs to publish: the publisher, the position to ingest from (the
/// store caught up with the topic), and the lease, held for as long as it lives.
pub struct Publishing {
    pub publisher: Box<dyn Publish>,
    pub resume: Resume,
    pub lease: Box<dyn std::any::Any + Send>,
}

/// A running edge follower (it runs until the process ends); `done` says how it ended.
pub struct Edge {
    pub done: tokio::task::JoinHandle<anyhow::Result<()>>,
}

#[cfg(feature = "kafka")]
mod imp {
    use super::*;
    use anyhow::Context;
    use riptide_kafka::{KafkaPublisher, KafkaUrl, Lease};
    use std::sync::atomic::Ordering::Relaxed;

    /// The `kafka://` address checked at start, before any side effect: it parses, and each
    /// broker's host resolves (within 10 s). Reaching the brokers is not checked here: a
    /// cluster that is down is waited for and said (`KafkaUrl::reach`).
    pub async fn check(url: &str) -> anyhow::Result<()> {
        let parsed = KafkaUrl::parse(url)?;
        for broker in parsed.brokers.split(',') {
            let found = tokio::time::timeout(
                std::time::Duration::from_secs(10),
                tokio::net::lookup_host(broker),
            )
            .await
            .map_err(|_| anyhow::anyhow!("timed out after 10 s"))
            .and_then(|r| r.map_err(anyhow::Error::from))
            .map(|mut addrs| addrs.next().is_some());
            match found {
                Ok(true) => {}
                Ok(false) => {
                    anyhow::bail!("Kafka broker {broker} (in {url}) resolves to no address")
                }
                Err(e) => anyhow::bail!("Kafka broker {broker} (in {url}) does not resolve: {e}"),
            }
        }
        Ok(())
    }

    /// Creates the topics if needed, waits for the ingest lease (a standby waits here), takes
    /// over the transactional id and catches the store up with the topic.
    pub async fn publishing(
        url: &str,
        store: &Store,
        resume: Resume,
        verified: bool,
        metrics: Arc<Metrics>,
    ) -> anyhow::Result<Publishing> {
        let url = KafkaUrl::parse(url)?;
        metrics.kafka.set_role(riptide_serve::KafkaRole::Ingest);
        let parts = url
            .ensure_topics()
            .await
            .context("preparing the Kafka topics")?;
        tracing::info!(topic = %url.topic, partitions = parts, "Kafka topics ready");
        let u = url.clone();
        let m = metrics.clone();
        let lease = tokio::task::spawn_blocking(move || Lease::acquire(&u, m)).await??;
        let u = url.clone();
        let m = metrics.clone();
        let publisher =
            tokio::task::spawn_blocking(move || KafkaPublisher::connect(&u, verified, m)).await??;
        let (u, s) = (url.clone(), store.clone());
        let m = metrics.clone();
        let resume =
            tokio::task::spawn_blocking(move || riptide_kafka::catch_up(&u, &s, resume, &m))
                .await??;
        // The store now holds what the topic committed: that is the last seq published, also
        // after a takeover (it read 0 until this node's first commit).
        metrics.kafka.published_seq.store(
            resume.next_seq.saturating_sub(1),
            std::sync::atomic::Ordering::Relaxed,
        );
        Ok(Publishing {
            publisher: Box::new(publisher),
            resume,
            lease: Box::new(lease),
        })
    }

    /// Starts following the topic into `log`'s store.
    pub fn edge(
        url: &str,
        log: Arc<Log>,
        metrics: Arc<Metrics>,
        resume: Resume,
        dict: Option<&Dictionary>,
    ) -> anyhow::Result<Edge> {
        let url = KafkaUrl::parse(url)?;
        // Now, not when the follower's thread starts: `/readyz` answers at once.
        metrics.kafka.set_role(riptide_serve::KafkaRole::Edge);
        let compressor = dict.map(Dictionary::compressor).transpose()?;
        // A thread, not a blocking task: the runtime's shutdown must not wait for the follower.
        let (tx, rx) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name("kafka-edge".into())
            .spawn(move || {
                let never = std::sync::atomic::AtomicBool::new(false);
                let r = riptide_kafka::follow::run_edge(
                    &url, &log, &metrics, resume, compressor, &never,
                )
                .context("following the Kafka topic");
                let _ = tx.send(r);
            })?;
        let done = tokio::spawn(async move {
            rx.await
                .unwrap_or_else(|_| Err(anyhow::anyhow!("the Kafka follower thread panicked")))
        });
        Ok(Edge { done })
    }

    /// Starts landing the backfill workers' repositories (`--backfill-from`,
    /// `riptide_kafka::backfill_tail`) through ingest's input `tx` into `store` (next seq
    /// `next_seq`), each in pieces of at most `landing_records` records (`--landing-records`). The caller sent `Upstream::BackfillStart` first; `BackfillOver` follows
    /// when the workers are done and their output landed, or when the landing stops on an
    /// error (said; the frames held for it are then released, as `serve --backfill` does).
    pub fn backfill_tail(
        url: &str,
        store: Store,
        tx: tokio::sync::mpsc::Sender<Upstream>,
        next_seq: u64,
        metrics: Arc<Metrics>,
        landing_records: usize,
    ) -> anyhow::Result<()> {
        let url = KafkaUrl::parse(url)?;
        // `/metrics`' riptide_backfill_running, _landed_total, _superseded_total and the status
        // page's backfill state, as for `--backfill` (the crawl's own numbers are the workers':
        // `riptide backfill status --publish`).
        let b = &metrics.backfill;
        *b.progress.lock().unwrap_or_else(|e| e.into_inner()) = Some(Arc::default());
        b.running.store(true, Relaxed);
        // A thread, not a blocking task: the runtime's shutdown must not wait for it.
        std::thread::Builder::new()
            .name("kafka-backfill".into())
            .spawn(move || {
                let mut sink =
                    riptide_serve::backfill::IngestSink::new(store, tx.clone(), next_seq)
                        .with_piece_records(landing_records);
                let mut released = false;
                let b = &metrics.backfill;
                let mut over = || {
                    if !released {
                        released = true;
                        b.running.store(false, Relaxed);
                        let _ = tx.blocking_send(Upstream::BackfillOver);
                    }
                };
                let never = std::sync::atomic::AtomicBool::new(false);
                let r = riptide_kafka::backfill_tail::run(
                    &url,
                    &mut sink,
                    &metrics,
                    &mut || {
                        metrics.backfill.finished.store(true, Relaxed);
                        over()
                    },
                    &never,
                );
                if let Err(e) = r {
                    tracing::error!(error = %e, topic = %url.topic,
                        "backfill from Kafka stopped: the frames held for it are released; restart to resume it");
                    *metrics.backfill.error.lock().unwrap_or_else(|e| e.into_inner()) =
                        Some(e.to_string());
                }
                over();
            })?;
        Ok(())
    }
}

#[cfg(not(feature = "kafka"))]
mod imp {
    use super::*;

    const NO: &str = "this riptide was built without Kafka support (cargo feature `kafka`)";

    pub async fn check(_: &str) -> anyhow::Result<()> {
        anyhow::bail!(NO)
    }

    pub async fn publishing(
        _: &str,
        _: &Store,
        _: Resume,
        _: bool,
        _: Arc<Metrics>,
    ) -> anyhow::Result<Publishing> {
        anyhow::bail!(NO)
    }

    pub fn edge(
        _: &str,
        _: Arc<Log>,
        _: Arc<Metrics>,
        _: Resume,
        _: Option<&Dictionary>,
    ) -> anyhow::Result<Edge> {
        anyhow::bail!(NO)
    }

    pub fn backfill_tail(
        _: &str,
        _: Store,
        _: tokio::sync::mpsc::Sender<Upstream>,
        _: u64,
        _: Arc<Metrics>,
    ) -> anyhow::Result<()> {
        anyhow::bail!(NO)
    }
}

pub use imp::{backfill_tail, check, edge, publishing};
