//! riptide's scale-out on Apache Kafka: verify once on an ingest node, serve from many edges.
//!
//! Why a crate: Kafka support links librdkafka (C, built from source by rdkafka-sys), which the
//! single-machine server must not need; the CLI turns it on with its `kafka` feature (on by
//! default, so `--no-default-features` builds without a C toolchain for it). It depends on
//! riptide-serve, never the other way: ingest only knows the [`riptide_serve::Publish`] hook.
//!
//! - Ingest node (`riptide serve --publish kafka://BROKERS/TOPIC`): [`lease`] makes one node of
//!   several the publisher (a consumer-group lease; the others are standbys); [`publish`]
//!   publishes every batch in one Kafka transaction — its events on `TOPIC` keyed by DID, and a
//!   batch record (seq range, upstream cursor, changed chain states) on `TOPIC.cursor` — before
//!   the local store writes it; transactional-id fencing stops a node that lost the lease. On
//!   start, [`follow::catch_up`] brings the local store up to what the topic holds (after a crash
//!   between the Kafka commit and the store write, or on a standby taking over), so ingest
//!   resumes exactly at the committed upstream cursor.
//! - Edge node (`riptide serve --from kafka://BROKERS/TOPIC`): [`follow::Follower`] reads the
//!   committed events (read_committed), in seq order across partitions, into the edge's own
//!   store, from which both Jetstream wires are served as on a single node. Every edge stores
//!   the ingest node's seq and JSON, so cursors are the same on every edge.
//! - [`record`]: the record format (`docs/kafka.md`).
//! - [`backfill_tail`]: the ingest node landing the workers' repositories (`serve
//!   --backfill-from`), in its seq space, exactly once.
//! - [`repo_record`]: a verified repository on `TOPIC.backfill` (its records' DAG-CBOR and its
//!   commit), as the backfill workers publish it and the ingest node lands it.
//! - [`backfill`]: the backfill crawl spread over a consumer group (`riptide backfill --publish
//!   kafka://BROKERS/TOPIC`, issue 37): hosts as work items, each verified repository published
//!   in one transaction with its host's progress, exactly once across killed workers.
//!
//! Why rdkafka: librdkafka is the reference non-JVM client (idempotent and transactional
//! producer, read_committed consumer, consumer groups), maintained by Confluent and used by
//! most non-Java clients; the pure-Rust clients lack transactions.

pub mod backfill;
pub mod backfill_tail;
pub mod follow;
pub mod lease;
pub mod publish;
pub mod record;
pub mod repo_record;

use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::ClientContext;
use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, ProducerContext};
use rdkafka::types::RDKafkaErrorCode;
use riptide_throttle::{Say, Throttle};

pub use follow::{catch_up, Follower};
pub use lease::Lease;
pub use publish::KafkaPublisher;
/// The client library, for tests and tools that read the topics directly.
pub use rdkafka;

/// Every client's context (consumers, the producer, the admin client): librdkafka's errors as
/// warnings, each kind (error code) said once and then at most a summary line a minute while it
/// goes on ([`warnings`]; a broker that cannot be reached made librdkafka report
/// `AllBrokersDown` ~450 times in 2 ms, issue 39), the end of a partition (expected by a
/// follower) not at all.
///
/// librdkafka also writes a log line for each error it reports (facilities `FAIL` and `ERROR`),
/// and rdkafka's default context says each error again at ERROR: a lost broker came out three
/// times per client. Here the error is said once, by [`ClientContext::error`]; those two log
/// facilities go to DEBUG, and librdkafka's other warnings (e.g. `CONFWARN`) stay warnings.
#[derive(Clone, Copy, Debug, Default)]
pub struct Quiet;

impl ClientContext for Quiet {
    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        let code = error.rdkafka_error_code();
        let eof = matches!(error, rdkafka::error::KafkaError::PartitionEOF(_))
            || code == Some(RDKafkaErrorCode::PartitionEOF);
        if eof {
            return;
        }
        let kind = code.map_or("librdkafka-other", kind_name);
        match warnings().say(kind) {
            Say::Full => tracing::warn!(error = %error, reason,
                "librdkafka (said once; then a line a minute while it goes on)"),
            Say::Summary { suppressed, total } => tracing::warn!(error = %error, reason,
                suppressed, total, "librdkafka: the same error again"),
            Say::Quiet => {}
        }
    }

    fn log(&self, level: RDKafkaLogLevel, fac: &str, line: &str) {
        use RDKafkaLogLevel::*;
        let said_by_error = matches!(fac, "FAIL" | "ERROR");
        let warning = matches!(level, Emerg | Alert | Critical | Error | Warning);
        if warning && !said_by_error {
            tracing::warn!(target: "librdkafka", facility = fac, "{line}");
        } else {
            tracing::debug!(target: "librdkafka", facility = fac, "{line}");
        }
    }
}

impl ConsumerContext for Quiet {}

impl ProducerContext for Quiet {
    type DeliveryOpaque = ();

    /// A record that failed for good fails its transaction's commit, which is where it is said.
    fn delivery(&self, _: &DeliveryResult<'_>, _: ()) {}
}

/// The rule for this crate's repeated warnings, process-wide (every client shares it, so an error
/// that all clients see is said once): the first of a kind in full, then at most a summary a
/// minute with the count (`riptide-throttle`).
pub fn warnings() -> &'static Throttle {
    static W: OnceLock<Throttle> = OnceLock::new();
    W.get_or_init(|| Throttle::new(1, Throttle::EVERY))
}

/// A librdkafka error code's name, as a warning kind: made once per code and kept (there are a
/// few hundred codes at most, so the names kept are bounded).
fn kind_name(code: RDKafkaErrorCode) -> &'static str {
    static NAMES: Mutex<Vec<(RDKafkaErrorCode, &'static str)>> = Mutex::new(Vec::new());
    let mut names = NAMES
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some((_, name)) = names.iter().find(|(c, _)| *c == code) {
        return name;
    }
    let name: &'static str = Box::leak(format!("librdkafka-{code:?}").into_boxed_str());
    names.push((code, name));
    name
}

/// What [`KafkaUrl::reach`]'s error says was being done (so a caller can tell it apart).
pub(crate) const REACHING: &str = "reaching the brokers";

/// How long one metadata request may wait in [`KafkaUrl::reach`] before it is asked again.
pub const REACH_TRY: Duration = Duration::from_secs(2);

/// A topic to create: (name, partitions, topic configuration).
pub(crate) type TopicSpec<'a> = (&'a str, i32, &'a [(&'a str, &'a str)]);

/// A consumer with the [`Quiet`] context.
pub type Reader = BaseConsumer<Quiet>;

/// The largest record the topics take (and the producer sends), bytes.
pub const MAX_RECORD_BYTES: &str = "16777216";

/// Partitions of a new events topic unless the URL says otherwise (`?partitions=N`).
pub const DEFAULT_PARTITIONS: i32 = 8;

/// A `kafka://BROKERS/TOPIC[?partitions=N]` address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KafkaUrl {
    /// Bootstrap servers, `host:port,…`.
    pub brokers: String,
    /// The events topic (the batch topic is `TOPIC.cursor`).
    pub topic: String,
    /// Partitions of the events topic when it is created here.
    pub partitions: i32,
}

/// Everything that can go wrong with Kafka here.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KafkaError {
    /// The `kafka://` address is malformed.
    #[error("bad Kafka address {url:?}: {why} (expected kafka://HOST:PORT[,HOST:PORT…]/TOPIC)")]
    BadUrl {
        /// The address.
        url: String,
        /// What is wrong.
        why: &'static str,
    },
    /// librdkafka reported an error.
    #[error("Kafka ({brokers}): {what}: {source}")]
    Client {
        /// Bootstrap servers.
        brokers: String,
        /// What was being done.
        what: &'static str,
        /// The client's error.
        source: rdkafka::error::KafkaError,
    },
    /// A record is damaged or not ours.
    #[error(transparent)]
    BadRecord(#[from] record::BadRecord),
    /// A batch record is damaged.
    #[error(transparent)]
    BadBatch(#[from] record::BadBatch),
    /// The local store failed.
    #[error(transparent)]
    Store(#[from] riptide_serve::StoreError),
    /// The topic and the local store disagree in a way that cannot be repaired here.
    #[error("{0}")]
    Inconsistent(String),
    /// The relay did not give its hosts (a backfill worker needs its `listHosts`).
    #[error("the relay's listHosts (backfill workers need it): {0}")]
    Relay(String),
    /// A wait on the cluster ran out of time.
    #[error("Kafka ({brokers}): timed out {what}")]
    Timeout {
        /// Bootstrap servers.
        brokers: String,
        /// What was being waited for.
        what: &'static str,
    },
}

impl KafkaUrl {
    /// Parses `kafka://BROKERS/TOPIC[?partitions=N]`.
    pub fn parse(url: &str) -> Result<KafkaUrl, KafkaError> {
        let bad = |why| KafkaError::BadUrl {
            url: url.to_owned(),
            why,
        };
        let rest = url
            .strip_prefix("kafka://")
            .ok_or_else(|| bad("not a kafka:// address"))?;
        let (brokers, path) = rest
            .split_once('/')
            .ok_or_else(|| bad("no /TOPIC after the brokers"))?;
        let (topic, query) = match path.split_once('?') {
            Some((t, q)) => (t, Some(q)),
            None => (path, None),
        };
        if brokers.is_empty() || brokers.split(',').any(|b| !b.contains(':')) {
            return Err(bad("each broker must be HOST:PORT"));
        }
        let topic_ok = !topic.is_empty()
            && topic.len() <= 200
            && topic
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-');
        if !topic_ok {
            return Err(bad("the topic must be 1-200 of [A-Za-z0-9._-]"));
        }
        let mut partitions = DEFAULT_PARTITIONS;
        for kv in query.into_iter().flat_map(|q| q.split('&')) {
            match kv.split_once('=') {
                Some(("partitions", n)) => {
                    partitions = n
                        .parse()
                        .ok()
                        .filter(|&n| (1..=10_000).contains(&n))
                        .ok_or_else(|| bad("partitions must be 1 to 10000"))?;
                }
                _ => return Err(bad("unknown query parameter (only partitions=N)")),
            }
        }
        Ok(KafkaUrl {
            brokers: brokers.to_owned(),
            topic: topic.to_owned(),
            partitions,
        })
    }

    /// The batch topic (`TOPIC.cursor`).
    pub fn batch_topic(&self) -> String {
        record::batch_topic(&self.topic)
    }

    pub(crate) fn client_err(
        &self,
        what: &'static str,
    ) -> impl FnOnce(rdkafka::error::KafkaError) -> KafkaError + '_ {
        move |source| KafkaError::Client {
            brokers: self.brokers.clone(),
            what,
            source,
        }
    }

    /// A client configuration with the bootstrap servers and quiet logging.
    pub(crate) fn config(&self) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.brokers)
            .set("client.id", "riptide")
            .set("socket.keepalive.enable", "true");
        // librdkafka's own debug contexts (`eos`, `protocol`, `broker`, …; its CONFIGURATION.md),
        // for tracing a problem with the cluster. Its lines come out as log events of target
        // `librdkafka` (docs/kafka.md).
        if let Some(d) = std::env::var("RIPTIDE_KAFKA_DEBUG")
            .ok()
            .filter(|d| !d.is_empty())
        {
            c.set("debug", d).set_log_level(RDKafkaLogLevel::Debug);
        }
        c
    }

    /// The settings of a consumer that reads only committed records, from the earliest, with
    /// offsets stored by hand, as `group` (the edges' reader and the backfill workers').
    pub(crate) fn committed_reader(&self, group: &str) -> ClientConfig {
        let mut c = self.config();
        c.set("group.id", group)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("isolation.level", "read_committed")
            .set("enable.partition.eof", "true")
            .set("auto.offset.reset", "earliest")
            .set("fetch.wait.max.ms", "50");
        c
    }

    /// A read_committed consumer with no group (partitions are assigned by hand).
    pub(crate) fn reader(&self) -> Result<Reader, KafkaError> {
        self.committed_reader("riptide-reader")
            .create_with_context(Quiet)
            .map_err(self.client_err("creating a consumer"))
    }

    /// Waits until the cluster answers a metadata request, asking every [`REACH_TRY`], for at
    /// most `limit` (`None`: for as long as it takes); the number of brokers. While it cannot be
    /// reached it says so within [`REACH_TRY`] (a metadata request on a cluster that is not
    /// there used to wait 30 s in silence), once, then a line a minute with how long it has
    /// lasted; and once more when the cluster answers again.
    pub fn reach(&self, c: &Reader, limit: Option<Duration>) -> Result<usize, KafkaError> {
        let t0 = Instant::now();
        let mut failed = false;
        loop {
            match c.fetch_metadata(None, REACH_TRY) {
                Ok(md) => {
                    if failed {
                        tracing::warn!(brokers = %self.brokers, after_s = t0.elapsed().as_secs(),
                            "the Kafka brokers can be reached again");
                    }
                    return Ok(md.brokers().len().max(1));
                }
                Err(e) => {
                    failed = true;
                    match warnings().say("kafka-unreachable") {
                        Say::Full => tracing::warn!(brokers = %self.brokers, error = %e,
                            "the Kafka brokers cannot be reached: waiting for them \
                             (said again once a minute while it lasts)"),
                        Say::Summary { .. } => tracing::warn!(brokers = %self.brokers, error = %e,
                            for_s = t0.elapsed().as_secs(),
                            "the Kafka brokers still cannot be reached: waiting for them"),
                        Say::Quiet => {}
                    }
                    if limit.is_some_and(|l| t0.elapsed() >= l) {
                        return Err(self.client_err(REACHING)(e));
                    }
                }
            }
        }
    }

    /// Creates the events topic (`partitions`) and the batch topic (1 partition) if they do not
    /// exist, with replication factor min(3, brokers in the cluster); returns the events topic's
    /// partition count as it is.
    pub async fn ensure_topics(&self) -> Result<i32, KafkaError> {
        let probe = self.reader()?;
        let batch = self.batch_topic();
        // Records up to 16 MiB (an event's JSON can pass the default 1 MB; a record the topic
        // refused would stall ingest in retries).
        let big = [("max.message.bytes", MAX_RECORD_BYTES)];
        self.create_topics(
            &probe,
            &[(&self.topic, self.partitions, &big), (&batch, 1, &big)],
        )
        .await?;
        // Wait until both topics' leaders are known (creation is asynchronous).
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let md = probe
                .fetch_metadata(Some(&self.topic), Duration::from_secs(10))
                .map_err(self.client_err("reading topic metadata"))?;
            let parts = md
                .topics()
                .first()
                .filter(|t| t.error().is_none())
                .map(|t| {
                    (
                        t.partitions().len() as i32,
                        t.partitions().iter().all(|p| p.leader() >= 0),
                    )
                });
            let batch_ok = probe
                .fetch_metadata(Some(&batch), Duration::from_secs(10))
                .ok()
                .and_then(|m| {
                    m.topics()
                        .first()
                        .filter(|t| t.error().is_none())
                        .map(|t| t.partitions().iter().all(|p| p.leader() >= 0))
                })
                .unwrap_or(false);
            if let Some((n, true)) = parts {
                if n > 0 && batch_ok {
                    return Ok(n);
                }
            }
            if std::time::Instant::now() > deadline {
                return Err(KafkaError::Timeout {
                    brokers: self.brokers.clone(),
                    what: "waiting for the topics' leaders",
                });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Creates each `(name, partitions, config)` topic that does not exist, with replication
    /// factor min(3, brokers in the cluster); waits (blocking) for the cluster first.
    pub(crate) async fn create_topics(
        &self,
        probe: &Reader,
        topics: &[TopicSpec<'_>],
    ) -> Result<(), KafkaError> {
        // Blocking (as the metadata request was), for as long as the cluster is away: this runs
        // at start, before anything else is served.
        let brokers = self.reach(probe, None)?;
        let rf = brokers.min(3) as i32;
        let admin: AdminClient<Quiet> = self
            .config()
            .create_with_context(Quiet)
            .map_err(self.client_err("creating an admin client"))?;
        let new: Vec<NewTopic<'_>> = topics
            .iter()
            .map(|(name, partitions, config)| {
                config.iter().fold(
                    NewTopic::new(name, *partitions, TopicReplication::Fixed(rf)),
                    |t, (k, v)| t.set(k, v),
                )
            })
            .collect();
        let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
        let results = admin
            .create_topics(&new, &opts)
            .await
            .map_err(self.client_err("creating topics"))?;
        for r in results {
            match r {
                Ok(t) => tracing::info!(topic = %t, replication = rf, "created Kafka topic"),
                Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((t, code)) => {
                    return Err(KafkaError::Client {
                        brokers: self.brokers.clone(),
                        what: "creating a topic",
                        source: rdkafka::error::KafkaError::AdminOp(code),
                    })
                    .inspect_err(|_| tracing::error!(topic = %t, "topic creation failed"));
                }
            }
        }
        Ok(())
    }

    /// The events topic's partition count (0 if it does not exist).
    pub fn partitions_of_topic(&self, c: &Reader) -> Result<i32, KafkaError> {
        let md = c
            .fetch_metadata(Some(&self.topic), Duration::from_secs(30))
            .map_err(self.client_err("reading topic metadata"))?;
        Ok(md
            .topics()
            .first()
            .filter(|t| t.error().is_none())
            .map_or(0, |t| t.partitions().len() as i32))
    }
}

/// Sends one record, serving delivery reports while librdkafka's queue is full.
pub(crate) fn send(
    producer: &BaseProducer<Quiet>,
    mut rec: BaseRecord<'_, [u8], [u8]>,
) -> Result<(), rdkafka::error::KafkaError> {
    loop {
        match producer.send(rec) {
            Ok(()) => return Ok(()),
            Err((
                rdkafka::error::KafkaError::MessageProduction(
                    rdkafka::types::RDKafkaErrorCode::QueueFull,
                ),
                r,
            )) => {
                rec = r;
                producer.poll(Duration::from_millis(5));
            }
            Err((e, _)) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse_and_bad_ones_say_why() {
        let u = KafkaUrl::parse("kafka://127.0.0.1:9092,127.0.0.1:9093/riptide").unwrap();
        assert_eq!(u.brokers, "127.0.0.1:9092,127.0.0.1:9093");
        assert_eq!(u.topic, "riptide");
        assert_eq!(u.partitions, DEFAULT_PARTITIONS);
        assert_eq!(u.batch_topic(), "riptide.cursor");
        let u = KafkaUrl::parse("kafka://h:1/t?partitions=3").unwrap();
        assert_eq!(u.partitions, 3);
        for bad in [
            "http://h:1/t",
            "kafka://h:1",
            "kafka://h/t",
            "kafka://h:1/",
            "kafka://h:1/a b",
            "kafka://h:1/t?partitions=0",
            "kafka://h:1/t?x=1",
        ] {
            let e = KafkaUrl::parse(bad).unwrap_err().to_string();
            assert!(e.contains("bad Kafka address"), "{bad}: {e}");
        }
    }
}
