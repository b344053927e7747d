//! The ingest node's transactional publisher: one Kafka transaction per ingest batch.
//!
//! Why: the exactly-once requirement. A batch's events (events topic, keyed by DID so
//! each account's events stay in one partition, in seq order) and its batch record (upstream
//! cursor, seq range, changed chain states, on `TOPIC.cursor`) commit together or not at all;
//! consumers read with `isolation.level=read_committed`, so an aborted or unfinished batch (the
//! node was killed mid-transaction) is never seen. The transactional id is fixed per topic
//! (`riptide-ingest.TOPIC`): a node that starts publishing fences every earlier producer with
//! that id and aborts its open transaction, so a zombie that lost its lease cannot commit.
//!
//! The batch's resync changes (`riptide_serve::publish`) are records of the batch topic before
//! the batch record, in the same transaction ([`crate::record::encode_change`]).
//!
//! Metrics (`riptide_kafka_*`, `docs/kafka.md`): transactions committed and aborted, commit time,
//! records published, the last seq published, fatal errors.
//!
//! Transient failures (a broker down, a leader moving) abort the transaction and send the batch
//! again, with backoff, until it commits: nothing was stored locally yet, so nothing is lost or
//! duplicated. A fatal error (fenced: another node took over) is returned, and ingest stops.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use riptide_firehose::chain::AccountState;
use riptide_segment::Row;
use riptide_serve::{Event, Metrics, Publish, PublishError, Resume};
use riptide_store::store::PendingChange;

use crate::record::{self, Batch};
use crate::{KafkaError, KafkaUrl, Quiet};

/// How long one transaction may take to commit before it is retried.
const COMMIT_TIMEOUT: Duration = Duration::from_secs(60);

/// The transactional publisher (see the module docs).
pub struct KafkaPublisher {
    url: KafkaUrl,
    batch_topic: String,
    /// Polled by the publishing thread itself ([`KafkaPublisher::drain`]): no polling thread.
    producer: BaseProducer<Quiet>,
    verdict: &'static str,
    published: u64,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for KafkaPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaPublisher")
            .field("url", &self.url)
            .field("published", &self.published)
            .finish()
    }
}

/// The transactional id of the ingest nodes of `topic`.
pub fn transactional_id(topic: &str) -> String {
    format!("riptide-ingest.{topic}")
}

impl KafkaPublisher {
    /// Connects and takes over the topic's transactional id (fencing any earlier producer and
    /// aborting its open transaction). `verified`: the events were verified (header
    /// `riptide-verdict: ok`), else `unverified` (`--no-verify`).
    pub fn connect(
        url: &KafkaUrl,
        verified: bool,
        metrics: Arc<Metrics>,
    ) -> Result<KafkaPublisher, KafkaError> {
        let producer: BaseProducer<Quiet> = url
            .config()
            .set("transactional.id", transactional_id(&url.topic))
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("transaction.timeout.ms", "60000")
            .set("message.timeout.ms", "55000")
            .set("linger.ms", "5")
            .set("compression.type", "lz4")
            .set("message.max.bytes", crate::MAX_RECORD_BYTES)
            .set("queue.buffering.max.messages", "200000")
            .create_with_context(Quiet)
            .map_err(url.client_err("creating the transactional producer"))?;
        producer
            .init_transactions(Duration::from_secs(60))
            .map_err(
                url.client_err("initialising transactions (taking over the transactional id)"),
            )?;
        tracing::info!(
            topic = %url.topic,
            transactional_id = %transactional_id(&url.topic),
            "Kafka publisher ready: earlier producers of this topic are fenced"
        );
        Ok(KafkaPublisher {
            batch_topic: url.batch_topic(),
            url: url.clone(),
            producer,
            verdict: if verified { "ok" } else { "unverified" },
            published: 0,
            metrics,
        })
    }

    /// Sends one record, serving delivery reports while librdkafka's queue is full.
    fn send(&self, rec: BaseRecord<'_, [u8], [u8]>) -> Result<(), rdkafka::error::KafkaError> {
        crate::send(&self.producer, rec)
    }

    /// One attempt: the whole batch in one transaction.
    fn attempt(
        &self,
        events: &[Event],
        rows: Option<&[Vec<u8>]>,
        pending: &[PendingChange],
        progress: &[(Box<str>, Vec<u8>)],
        batch: &[u8],
        batch_ts: i64,
    ) -> Result<(), rdkafka::error::KafkaError> {
        self.producer.begin_transaction()?;
        let mut seq = itoa_buf();
        let mut time = itoa_buf();
        for (i, e) in events.iter().enumerate() {
            let json = e.json();
            let did = e.did();
            let seq_s = fmt_u64(&mut seq, e.seq());
            let time_s = fmt_i64(&mut time, e.time_us());
            let mut h = OwnedHeaders::new_with_capacity(6)
                .insert(Header {
                    key: record::H_SEQ,
                    value: Some(seq_s),
                })
                .insert(Header {
                    key: record::H_TIME_US,
                    value: Some(time_s),
                })
                .insert(Header {
                    key: record::H_KIND,
                    value: Some(record::kind_str(e.kind())),
                })
                .insert(Header {
                    key: record::H_VERDICT,
                    value: Some(self.verdict),
                });
            if e.kind().is_commit() {
                h = h.insert(Header {
                    key: record::H_COLLECTION,
                    value: Some(e.collection()),
                });
                if let Some(rev) = record::rev_of(&json) {
                    h = h.insert(Header {
                        key: record::H_REV,
                        value: Some(rev),
                    });
                }
            }
            if let Some(row) = rows.and_then(|r| r.get(i)) {
                h = h.insert(Header {
                    key: record::H_ROW,
                    value: Some(&row[..]),
                });
            }
            let rec = BaseRecord::to(&self.url.topic)
                .key(did)
                .payload(&json[..])
                .timestamp(e.time_us() / 1000)
                .headers(h);
            self.send(rec)?;
        }
        // The resync changes and the backfill progress entries, then the batch record they
        // belong to (one partition: in order).
        let changes = pending
            .iter()
            .map(|p| (record::RESYNC_KEY, record::encode_change(p)));
        let landed = progress
            .iter()
            .map(|(k, v)| (record::BACKFILL_KEY, record::encode_progress(k, v)));
        for (key, value) in changes.chain(landed) {
            let rec = BaseRecord::to(&self.batch_topic)
                .key(key)
                .payload(&value[..])
                .timestamp(batch_ts);
            self.send(rec)?;
        }
        let rec = BaseRecord::to(&self.batch_topic)
            .key(record::BATCH_KEY)
            .payload(batch)
            .timestamp(batch_ts);
        self.send(rec)?;
        self.drain(Instant::now() + COMMIT_TIMEOUT);
        self.producer.commit_transaction(COMMIT_TIMEOUT)
    }

    /// Serves delivery reports in 1 ms polls until every record sent is acknowledged (or the
    /// deadline passes). Why: rdkafka's `commit_transaction` flushes first, polling 100 ms at a
    /// time, and its poll always sits out its whole timeout. With records still in flight at
    /// commit (nearly always: `linger.ms` is 5), every transaction took over 100 ms, and so did
    /// every event's way through Kafka (a steady ~105 ms commit time, measured with librdkafka's
    /// `eos` debug log: `RIPTIDE_KAFKA_DEBUG=eos`). Drained, that flush returns at once.
    fn drain(&self, deadline: Instant) {
        while self.producer.in_flight_count() > 0 && Instant::now() < deadline {
            self.producer.poll(Duration::from_millis(1));
        }
    }
}

impl Publish for KafkaPublisher {
    fn publish(
        &mut self,
        events: &[Event],
        rows: Option<&[Row<'_>]>,
        accounts: &[(Box<str>, AccountState)],
        pending: &[PendingChange],
        progress: &[(Box<str>, Vec<u8>)],
        resume: &Resume,
    ) -> Result<(), PublishError> {
        // Each event's row as the header carries it, or none for the whole batch (an edge
        // stores a batch as rows only if every event has one, as the store does).
        let rows: Option<Vec<Vec<u8>>> = rows
            .filter(|r| r.len() == events.len())
            .and_then(|r| r.iter().map(record::encode_row).collect());
        let batch = Batch {
            first_seq: events.first().map_or(resume.next_seq, Event::seq),
            resume: *resume,
            accounts: accounts.to_vec(),
            pending: Vec::new(),
            progress: Vec::new(),
        }
        .encode();
        let ts = if resume.last_time_us > 0 {
            resume.last_time_us / 1000
        } else {
            riptide_serve::now_us() / 1000
        };
        let mut wait = Duration::from_millis(200);
        let mut failures = 0u32;
        let k = &self.metrics.kafka;
        // Until it commits: `/readyz` fails when this lasts (brokers down, too few in sync).
        k.publishing_since_us
            .store(riptide_serve::now_us(), Relaxed);
        loop {
            let t0 = Instant::now();
            let e = match self.attempt(events, rows.as_deref(), pending, progress, &batch, ts) {
                Ok(()) => {
                    k.commit_seconds.observe(t0.elapsed());
                    k.transactions_committed.fetch_add(1, Relaxed);
                    k.records_published.fetch_add(events.len() as u64, Relaxed);
                    k.resync_changes_published
                        .fetch_add(pending.len() as u64, Relaxed);
                    k.published_seq
                        .store(resume.next_seq.saturating_sub(1), Relaxed);
                    k.publishing_since_us.store(0, Relaxed);
                    if failures > 0 {
                        tracing::warn!(
                            failures,
                            "Kafka transaction committed again: publishing resumed"
                        );
                    }
                    self.published += events.len() as u64;
                    return Ok(());
                }
                Err(e) => e,
            };
            let fatal = match &e {
                rdkafka::error::KafkaError::Transaction(t) => t.is_fatal(),
                _ => false,
            };
            if fatal {
                k.publish_fatal.fetch_add(1, Relaxed);
                return Err(PublishError {
                    target: format!("kafka://{}/{}", self.url.brokers, self.url.topic),
                    reason: format!(
                        "{e} (another ingest node holds the topic's transactional id, or the \
                         producer failed for good): stopping ingest"
                    ),
                });
            }
            if failures.is_multiple_of(10) {
                tracing::error!(error = %e, failures = failures + 1, retry_in = ?wait,
                    "Kafka transaction failed: aborting it and sending the batch again");
            }
            failures += 1;
            k.transactions_aborted.fetch_add(1, Relaxed);
            if let Err(a) = self.producer.abort_transaction(COMMIT_TIMEOUT) {
                let fatal =
                    matches!(&a, rdkafka::error::KafkaError::Transaction(t) if t.is_fatal());
                if fatal {
                    k.publish_fatal.fetch_add(1, Relaxed);
                    return Err(PublishError {
                        target: format!("kafka://{}/{}", self.url.brokers, self.url.topic),
                        reason: format!("aborting a failed transaction: {a}"),
                    });
                }
                tracing::warn!(error = %a, "aborting the Kafka transaction failed; retrying");
            }
            std::thread::sleep(wait);
            wait = (wait * 2).min(Duration::from_secs(10));
        }
    }
}

fn itoa_buf() -> [u8; 24] {
    [0; 24]
}

fn fmt_u64(buf: &mut [u8; 24], v: u64) -> &[u8] {
    use std::io::Write;
    let mut c = std::io::Cursor::new(&mut buf[..]);
    let _ = write!(c, "{v}");
    let n = c.position() as usize;
    &buf[..n]
}

fn fmt_i64(buf: &mut [u8; 24], v: i64) -> &[u8] {
    use std::io::Write;
    let mut c = std::io::Cursor::new(&mut buf[..]);
    let _ = write!(c, "{v}");
    let n = c.position() as usize;
    &buf[..n]
}
