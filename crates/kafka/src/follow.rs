//! Reading the topic back: edges follow it into their own store, and an ingest node catches its
//! store up to it before it publishes.
//!
//! Why one module: both read committed events in seq order across partitions and store them
//! with the seq and JSON the ingest node gave them, which is what makes every edge's cursors
//! the same. Partitions are merged by the `riptide-seq` header: seqs are contiguous (every
//! stored event is published), so the follower hands out `next_seq`, then `next_seq + 1`, …,
//! holding records that arrive early. Where to start: after the local store's last event (each
//! partition is positioned by timestamp, `time_us / 1000` of that event, and what is already
//! stored is skipped), or, for an empty store, at the first seq the batch topic records.
//!
//! **Bounded memory.** A partition read ahead of the others (its leader is faster, the others'
//! records are larger, a restart positioned it by time) would fill the held records without
//! end. Each partition's held records are bounded ([`AheadLimits`]): a partition over the bound
//! is paused (librdkafka stops fetching it; what it fetched beyond the records handed over is
//! fetched again on resume) and resumed once the next seqs drained it below half. A paused
//! partition cannot hold the next seq (seqs increase within a partition, and it handed over a
//! later one), so pausing never stalls the merge. `riptide_kafka_pending_records` /
//! `_bytes`, `riptide_kafka_partitions_paused` and `riptide_kafka_partition_pauses_total` show
//! it.
//!
//! A seq that never comes (the topic's retention removed it while the edge was down) is a gap:
//! when every partition is read to its end (or paused) and the next seq is still missing for
//! [`GAP_AFTER`], the gap is logged at error with its size, counted
//! (`riptide_kafka_gaps_total`, `riptide_kafka_gap_seqs_total`) and the follower goes on from the
//! lowest seq it holds. An empty store whose first seq is gone (the start of the topic was
//! removed by retention) starts, after the same wait, at the lowest seq the topic holds: that is
//! not a gap but the edge's floor, stored as its retention floor so cursors below it behave as
//! after a retention pass on a single node. (The wait matters: "read to its end" is what the
//! partition said last, and a transaction committed since may hold the missing seq.)

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::Consumer;
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};
use riptide_serve::{Event, Log, Metrics, Resume, Store};

use crate::record::{self, BadRecord, Batch, TopicEvent};
use crate::{KafkaError, KafkaUrl, Reader};
use riptide_throttle::Say;

/// How long a missing seq is waited for, every partition read to its end, before it is a gap.
pub const GAP_AFTER: Duration = Duration::from_secs(30);

/// How often an edge samples its lag (`riptide_kafka_lag_records`).
const LAG_EVERY: Duration = Duration::from_secs(10);

/// How long an edge waits for an unreachable cluster in one attempt to open the topic (then it
/// retries, `open_waiting`).
const REACH_LIMIT: Duration = Duration::from_secs(60);

/// The records a partition may have ahead of the next seq before it is paused (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AheadLimits {
    /// Records held from one partition (default 4,096).
    pub records: usize,
    /// Bytes (values and keys) held from one partition (default 8 MiB).
    pub bytes: usize,
}

impl Default for AheadLimits {
    fn default() -> AheadLimits {
        AheadLimits {
            records: 4096,
            bytes: 8 << 20,
        }
    }
}

/// Reads the events topic in seq order (see the module docs).
pub struct Follower {
    url: KafkaUrl,
    consumer: Reader,
    partitions: i32,
    next_seq: u64,
    /// Records that arrived before their turn: seq → (partition, event).
    pending: BTreeMap<u64, (i32, TopicEvent)>,
    /// Per partition: records and bytes of it in `pending`.
    ahead: HashMap<i32, (usize, usize)>,
    paused: HashSet<i32>,
    limits: AheadLimits,
    at_end: HashSet<i32>,
    /// Partitions read to their end at least once since the follower opened.
    reached_end: HashSet<i32>,
    missing_since: Option<Instant>,
    /// No event handed out yet, from an empty store: a missing first seq is the floor.
    fresh: bool,
    lag_at: Instant,
    metrics: Arc<Metrics>,
    /// Seqs skipped as gaps (retention), for `/metrics`.
    pub gap_seqs: u64,
}

impl std::fmt::Debug for Follower {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Follower")
            .field("url", &self.url)
            .field("next_seq", &self.next_seq)
            .field("pending", &self.pending.len())
            .field("paused", &self.paused)
            .finish()
    }
}

/// Waits (up to `limit`) for the events topic to exist; its partition count.
fn wait_for_topic(url: &KafkaUrl, c: &Reader, limit: Duration) -> Result<i32, KafkaError> {
    // The cluster first: an unreachable one is said within seconds (`KafkaUrl::reach`).
    url.reach(c, Some(REACH_LIMIT))?;
    let t0 = Instant::now();
    let mut said = false;
    loop {
        let n = url.partitions_of_topic(c)?;
        if n > 0 {
            return Ok(n);
        }
        if t0.elapsed() > limit {
            return Err(KafkaError::Timeout {
                brokers: url.brokers.clone(),
                what: "waiting for the events topic to be created by an ingest node",
            });
        }
        if !said {
            tracing::warn!(topic = %url.topic, "the events topic does not exist yet: waiting for an ingest node");
            said = true;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Positions every partition of `topic` at the first record with a timestamp at or after
/// `ts_ms` (or its end), or at its beginning when `ts_ms` is `None`.
fn assign_from(
    url: &KafkaUrl,
    c: &Reader,
    topic: &str,
    partitions: i32,
    ts_ms: Option<i64>,
) -> Result<(), KafkaError> {
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        let o = match ts_ms {
            Some(t) => Offset::Offset(t.max(0)),
            None => Offset::Beginning,
        };
        tpl.add_partition_offset(topic, p, o)
            .map_err(url.client_err("building a partition list"))?;
    }
    let tpl = match ts_ms {
        Some(_) => c
            .offsets_for_times(tpl, Duration::from_secs(30))
            .map_err(url.client_err("looking up offsets by time"))?,
        None => tpl,
    };
    c.assign(&tpl)
        .map_err(url.client_err("assigning partitions"))
}

fn header<'a>(m: &'a rdkafka::message::BorrowedMessage<'_>, key: &str) -> Option<&'a [u8]> {
    let h = m.headers()?;
    h.iter().find(|h| h.key == key).and_then(|h| h.value)
}

/// The event a record of the events topic carries.
fn parse(m: &rdkafka::message::BorrowedMessage<'_>) -> Result<TopicEvent, BadRecord> {
    let bad = |what| BadRecord {
        topic: m.topic().to_owned(),
        partition: m.partition(),
        offset: m.offset(),
        what,
    };
    let seq = header(m, record::H_SEQ)
        .and_then(record::parse_u64)
        .ok_or_else(|| bad("no riptide-seq header"))?;
    let time_us = header(m, record::H_TIME_US)
        .and_then(record::parse_i64)
        .ok_or_else(|| bad("no riptide-time-us header"))?;
    let kind = header(m, record::H_KIND)
        .and_then(record::kind_from_str)
        .ok_or_else(|| bad("no or unknown riptide-kind header"))?;
    let collection = header(m, record::H_COLLECTION)
        .map(|c| String::from_utf8_lossy(c).into_owned())
        .unwrap_or_default();
    let did = m
        .key()
        .and_then(|k| std::str::from_utf8(k).ok())
        .ok_or_else(|| bad("no DID key"))?
        .to_owned();
    let json = bytes::Bytes::copy_from_slice(m.payload().ok_or_else(|| bad("no value"))?);
    let row = header(m, record::H_ROW).map(bytes::Bytes::copy_from_slice);
    let e = TopicEvent {
        seq,
        time_us,
        kind,
        did,
        collection,
        json,
        row,
    };
    e.row().map_err(bad)?;
    Ok(e)
}

/// Appends `got` (as `events`) to `store` with the batch's account states, resync changes and
/// backfill progress entries: as rows when every event came with its row (the store seals them into
/// row blocks, as the ingest node's store does), else as JSON alone, as before `riptide-row`
/// existed.
fn append_events(
    store: &Store,
    events: &[Event],
    got: &[TopicEvent],
    accounts: &[(Box<str>, riptide_firehose::chain::AccountState)],
    pending: &[riptide_store::store::PendingChange],
    progress: &[(Box<str>, Vec<u8>)],
    resume: &Resume,
) -> Result<(), KafkaError> {
    // Checked when the record was read (`parse`), so a failure here is not expected; if it
    // happens anyway the batch goes in as JSON, which reads the same.
    let rows: Option<Vec<riptide_segment::Row<'_>>> =
        got.iter().map(|e| e.row().ok().flatten()).collect();
    let rows = rows.filter(|r| r.len() == events.len());
    store.append_all(events, rows.as_deref(), accounts, pending, progress, resume)?;
    Ok(())
}

/// The batch records of the batch topic from timestamp `ts_ms` (or its beginning) to its end.
pub fn read_batches(url: &KafkaUrl, ts_ms: Option<i64>) -> Result<Vec<Batch>, KafkaError> {
    let c = url.reader()?;
    let topic = url.batch_topic();
    let t0 = Instant::now();
    // The batch topic is created with the events topic.
    loop {
        let md = c
            .fetch_metadata(Some(&topic), Duration::from_secs(30))
            .map_err(url.client_err("reading the batch topic's metadata"))?;
        if md
            .topics()
            .first()
            .is_some_and(|t| t.error().is_none() && !t.partitions().is_empty())
        {
            break;
        }
        if t0.elapsed() > Duration::from_secs(120) {
            return Err(KafkaError::Timeout {
                brokers: url.brokers.clone(),
                what: "waiting for the batch topic",
            });
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let (_, high) = c
        .fetch_watermarks(&topic, 0, Duration::from_secs(30))
        .map_err(url.client_err("reading the batch topic's end"))?;
    assign_from(url, &c, &topic, 1, ts_ms)?;
    let mut out = Vec::new();
    let mut held = Vec::new();
    let mut landed = Vec::new();
    if high == 0 {
        return Ok(out);
    }
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        match c.poll(Duration::from_millis(500)) {
            Some(Ok(m)) => {
                let v = m.payload().unwrap_or_default();
                if m.key() == Some(record::RESYNC_KEY) {
                    // Belongs to the batch record that follows (same transaction).
                    held.push(record::decode_change(v)?);
                } else if m.key() == Some(record::BACKFILL_KEY) {
                    landed.push(record::decode_progress(v)?);
                } else {
                    let mut b = Batch::decode(v)?;
                    b.pending = std::mem::take(&mut held);
                    b.progress = std::mem::take(&mut landed);
                    out.push(b);
                }
            }
            Some(Err(rdkafka::error::KafkaError::PartitionEOF(_))) => break,
            Some(Err(e)) => tracing::warn!(error = %e, "reading the batch topic"),
            None => {}
        }
        if Instant::now() > deadline {
            return Err(KafkaError::Timeout {
                brokers: url.brokers.clone(),
                what: "reading the batch topic to its end",
            });
        }
    }
    Ok(out)
}

impl Follower {
    /// Follows the events topic from after `resume` (the local store's position); an empty
    /// store starts at the first seq the batch topic records (or, if the events topic lost it
    /// to retention, the lowest it holds).
    pub fn open(
        url: &KafkaUrl,
        resume: &Resume,
        metrics: Arc<Metrics>,
    ) -> Result<Follower, KafkaError> {
        Follower::open_with(url, resume, metrics, AheadLimits::default())
    }

    /// [`Follower::open`] with other bounds on the records held ahead.
    pub fn open_with(
        url: &KafkaUrl,
        resume: &Resume,
        metrics: Arc<Metrics>,
        limits: AheadLimits,
    ) -> Result<Follower, KafkaError> {
        let consumer = url.reader()?;
        let partitions = wait_for_topic(url, &consumer, Duration::from_secs(600))?;
        let empty = resume.next_seq <= 1 && resume.last_time_us == 0;
        let next_seq = if empty {
            read_batches(url, None)?
                .into_iter()
                .find(|b| b.first_seq < b.resume.next_seq)
                .map_or(1, |b| b.first_seq)
        } else {
            resume.next_seq
        };
        let ts = (!empty).then_some(resume.last_time_us / 1000);
        assign_from(url, &consumer, &url.topic, partitions, ts)?;
        tracing::info!(topic = %url.topic, partitions, next_seq, "following the Kafka topic");
        Ok(Follower {
            url: url.clone(),
            consumer,
            partitions,
            next_seq,
            pending: BTreeMap::new(),
            ahead: HashMap::new(),
            paused: HashSet::new(),
            limits,
            at_end: HashSet::new(),
            reached_end: HashSet::new(),
            missing_since: None,
            fresh: empty,
            lag_at: Instant::now(),
            metrics,
            gap_seqs: 0,
        })
    }

    /// The next seq this follower hands out.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Up to `max` events in seq order, waiting at most `wait` for the first one.
    pub fn poll_batch(
        &mut self,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<TopicEvent>, KafkaError> {
        let deadline = Instant::now() + wait;
        let mut out = Vec::new();
        let r = self.fill(&mut out, max, deadline);
        self.resume_drained();
        if self.lag_at.elapsed() >= LAG_EVERY {
            self.sample_lag();
        }
        let k = &self.metrics.kafka;
        k.pending_records.store(self.pending.len() as u64, Relaxed);
        // Summed over the partitions' counts (a few entries), not kept a second time.
        let held: usize = self.ahead.values().map(|a| a.1).sum();
        k.pending_bytes.store(held as u64, Relaxed);
        k.partitions_paused.store(self.paused.len() as u64, Relaxed);
        r.map(|()| out)
    }

    /// The next held event, if it is here.
    fn take_next(&mut self) -> Option<TopicEvent> {
        let (p, e) = self.pending.remove(&self.next_seq)?;
        let n = held_bytes(&e);
        if let Some(a) = self.ahead.get_mut(&p) {
            a.0 = a.0.saturating_sub(1);
            a.1 = a.1.saturating_sub(n);
        }
        self.next_seq += 1;
        self.missing_since = None;
        self.fresh = false;
        Some(e)
    }

    /// Holds `e` (from partition `p`) until its turn; pauses `p` if it ran too far ahead.
    fn hold(&mut self, p: i32, e: TopicEvent) {
        let n = held_bytes(&e);
        if let Some((q, old)) = self.pending.insert(e.seq, (p, e)) {
            // The same seq twice (cannot happen in a topic one transactional producer wrote):
            // the later one stands; the counts follow.
            let m = held_bytes(&old);
            if let Some(a) = self.ahead.get_mut(&q) {
                a.0 = a.0.saturating_sub(1);
                a.1 = a.1.saturating_sub(m);
            }
        }
        let a = self.ahead.entry(p).or_default();
        a.0 += 1;
        a.1 += n;
        let held = a.0;
        let over = a.0 >= self.limits.records || a.1 >= self.limits.bytes;
        if over && !self.paused.contains(&p) {
            match self.consumer.pause(&self.one(p)) {
                Ok(()) => {
                    self.paused.insert(p);
                    self.metrics.kafka.pauses.fetch_add(1, Relaxed);
                    tracing::debug!(
                        partition = p,
                        held,
                        next_seq = self.next_seq,
                        "Kafka partition paused: ahead of the next seq"
                    );
                }
                Err(err) => {
                    tracing::warn!(error = %err, partition = p, "pausing a Kafka partition")
                }
            }
        }
    }

    /// Resumes the paused partitions that are below half of both bounds again.
    fn resume_drained(&mut self) {
        if self.paused.is_empty() {
            return;
        }
        let lim = self.limits;
        let ready: Vec<i32> = self
            .paused
            .iter()
            .copied()
            .filter(|p| {
                let (r, b) = self.ahead.get(p).copied().unwrap_or_default();
                r <= lim.records / 2 && b <= lim.bytes / 2
            })
            .collect();
        for p in ready {
            match self.consumer.resume(&self.one(p)) {
                Ok(()) => {
                    self.paused.remove(&p);
                    // Not at its end until it says so again.
                    self.at_end.remove(&p);
                }
                Err(err) => {
                    tracing::warn!(error = %err, partition = p, "resuming a Kafka partition")
                }
            }
        }
    }

    fn one(&self, p: i32) -> TopicPartitionList {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(&self.url.topic, p);
        tpl
    }

    /// Whether every partition has been read to its end at least once since the follower
    /// opened: it has caught up with what the topic held when it started (an edge is ready from
    /// then on, `riptide_kafka_following`).
    pub fn caught_up(&self) -> bool {
        (0..self.partitions).all(|p| self.reached_end.contains(&p))
    }

    /// `riptide_kafka_lag_records`: the committed records not yet read, over the partitions
    /// that have a position (high watermark minus position; transaction markers count).
    fn sample_lag(&mut self) {
        self.lag_at = Instant::now();
        let Ok(pos) = self.consumer.position() else {
            return;
        };
        let mut lag = 0i64;
        for e in pos.elements_for_topic(&self.url.topic) {
            if let Offset::Offset(o) = e.offset() {
                match self.consumer.fetch_watermarks(
                    &self.url.topic,
                    e.partition(),
                    Duration::from_millis(500),
                ) {
                    Ok((_, high)) => lag += (high - o).max(0),
                    // A broker away: no sample this time (the merge must not wait on more).
                    Err(_) => return,
                }
            }
        }
        self.metrics.kafka.lag_records.store(lag as u64, Relaxed);
    }

    fn fill(
        &mut self,
        out: &mut Vec<TopicEvent>,
        max: usize,
        deadline: Instant,
    ) -> Result<(), KafkaError> {
        loop {
            while out.len() < max {
                match self.take_next() {
                    Some(e) => out.push(e),
                    None => break,
                }
            }
            if out.len() >= max {
                return Ok(());
            }
            self.check_gap();
            let timeout = if out.is_empty() {
                deadline.saturating_duration_since(Instant::now())
            } else {
                Duration::ZERO
            };
            match self.consumer.poll(timeout) {
                None => {
                    if !out.is_empty() || Instant::now() >= deadline {
                        return Ok(());
                    }
                }
                Some(Ok(m)) => {
                    self.at_end.remove(&m.partition());
                    let e = parse(&m)?;
                    let k = &self.metrics.kafka;
                    k.records_consumed.fetch_add(1, Relaxed);
                    if e.seq >= self.next_seq {
                        self.hold(m.partition(), e);
                    } else {
                        k.records_skipped.fetch_add(1, Relaxed);
                    }
                }
                Some(Err(rdkafka::error::KafkaError::PartitionEOF(p))) => {
                    self.at_end.insert(p);
                    self.reached_end.insert(p);
                }
                Some(Err(e)) => {
                    // A broker going away also reaches the `Quiet` context, which says it once
                    // with its reason; anything else (a partition's error) is said here.
                    use rdkafka::types::RDKafkaErrorCode::{
                        AllBrokersDown, BrokerTransportFailure,
                    };
                    let said = matches!(
                        e.rdkafka_error_code(),
                        Some(BrokerTransportFailure | AllBrokersDown)
                    );
                    if said {
                        tracing::debug!(error = %e, topic = %self.url.topic, "Kafka consumer");
                    } else {
                        match crate::warnings().say("kafka-consumer") {
                            Say::Full => tracing::warn!(error = %e, topic = %self.url.topic,
                                "Kafka consumer (said once; then a line a minute while it goes on)"),
                            Say::Summary { suppressed, total } => tracing::warn!(error = %e,
                                topic = %self.url.topic, suppressed, total,
                                "Kafka consumer: errors go on"),
                            Say::Quiet => {}
                        }
                    }
                    if Instant::now() >= deadline {
                        return Ok(());
                    }
                }
            }
        }
    }

    /// A missing seq with every partition read to its end (or paused: it cannot hold the next
    /// seq) for [`GAP_AFTER`] is a gap; at the start of an empty store, the floor.
    fn check_gap(&mut self) {
        let Some((&lowest, _)) = self.pending.first_key_value() else {
            self.missing_since = None;
            return;
        };
        let done =
            (0..self.partitions).all(|p| self.at_end.contains(&p) || self.paused.contains(&p));
        if lowest <= self.next_seq || !done {
            self.missing_since = None;
            return;
        }
        let since = *self.missing_since.get_or_insert_with(Instant::now);
        if since.elapsed() < GAP_AFTER {
            return;
        }
        if self.fresh {
            // Nothing handed out yet: the topic's start is gone, this is where the store begins.
            tracing::warn!(
                first_seq = lowest,
                "the Kafka topic no longer holds seqs {} to {} (its retention removed them): \
                 this empty store starts at seq {lowest}",
                self.next_seq,
                lowest - 1
            );
            self.next_seq = lowest;
            self.missing_since = None;
            return;
        }
        let gap = lowest - self.next_seq;
        tracing::error!(
            from = self.next_seq,
            to = lowest - 1,
            seqs = gap,
            "seqs missing from the Kafka topic (removed by its retention?): gap, going on"
        );
        self.gap_seqs += gap;
        let k = &self.metrics.kafka;
        k.gaps.fetch_add(1, Relaxed);
        k.gap_seqs.fetch_add(gap, Relaxed);
        self.next_seq = lowest;
        self.missing_since = None;
    }
}

/// What a held record counts for against [`AheadLimits::bytes`].
fn held_bytes(e: &TopicEvent) -> usize {
    e.json.len() + e.row.as_ref().map_or(0, |r| r.len()) + e.did.len() + e.collection.len() + 64
}

/// The stored form of an event, with its JSON compressed by `compressor` (the local dictionary,
/// when the form is wanted: `riptide_serve::log`).
fn to_event(
    e: &TopicEvent,
    compressor: Option<&mut zstd::bulk::Compressor<'static>>,
    zbuf: &mut Vec<u8>,
) -> Result<Event, KafkaError> {
    let z: &[u8] = match compressor {
        Some(c) => riptide_serve::compress::compress_into(c, &e.json[..], zbuf)
            .map_err(|_| KafkaError::Inconsistent("zstd could not compress an event".into()))?,
        None => &[],
    };
    Ok(e.to_event(z))
}

/// Brings `store` (at `local`) up to what the topic holds: every batch committed after the
/// store's position is written with its events and account states, one store batch each (so a
/// crash here resumes here). Returns the position to ingest from. An ingest node calls it after
/// it took the lease and fenced earlier producers, so the topic does not move meanwhile.
pub fn catch_up(
    url: &KafkaUrl,
    store: &Store,
    local: Resume,
    metrics: &Arc<Metrics>,
) -> Result<Resume, KafkaError> {
    let empty = local.next_seq <= 1 && local.last_time_us == 0 && local.upstream_cursor.is_none();
    let batches = read_batches(url, (!empty).then_some(local.last_time_us / 1000 - 1))?;
    // Batches after the one that left the store where it is.
    let start = if empty {
        0
    } else {
        // The batch that left the store where it is; a store whose upstream cursor was
        // forgotten (--reset-upstream-cursor) is matched by seq and time alone.
        let at = batches.iter().rposition(|b| b.resume == local).or_else(|| {
            local.upstream_cursor.is_none().then(|| {
                batches.iter().rposition(|b| {
                    b.resume.next_seq == local.next_seq
                        && b.resume.last_time_us == local.last_time_us
                })
            })?
        });
        match at {
            Some(i) => i + 1,
            None => {
                let last = batches.last().map(|b| b.resume);
                match last {
                    // The topic is empty or older than the store: the store goes on, and the
                    // topic continues from it.
                    None => {
                        tracing::warn!(next_seq = local.next_seq,
                            "the Kafka topic has no batch: publishing from the local store's position");
                        return Ok(local);
                    }
                    Some(l) if l.next_seq <= local.next_seq => {
                        return Err(KafkaError::Inconsistent(format!(
                            "the local store (next seq {}, upstream cursor {:?}) is ahead of or \
                             beside the Kafka topic (next seq {}, upstream cursor {:?}): this \
                             store was not written by the topic's ingest nodes; start with an \
                             empty --data",
                            local.next_seq, local.upstream_cursor, l.next_seq, l.upstream_cursor
                        )))
                    }
                    Some(_) => {
                        return Err(KafkaError::Inconsistent(format!(
                            "the local store's position (next seq {}) is not in the Kafka \
                             topic's batch records (removed by retention?): start with an \
                             empty --data",
                            local.next_seq
                        )))
                    }
                }
            }
        }
    };
    let todo = &batches[start..];
    if todo.is_empty() {
        return Ok(local);
    }
    let mut follower = Follower::open(url, &local, metrics.clone())?;
    if follower.next_seq() != todo[0].first_seq {
        return Err(KafkaError::Inconsistent(format!(
            "catching up: the store continues at seq {} but the next batch starts at {}",
            follower.next_seq(),
            todo[0].first_seq
        )));
    }
    let mut zbuf = Vec::new();
    let mut events = Vec::new();
    let mut read = Vec::new();
    let mut applied = local;
    for b in todo {
        events.clear();
        read.clear();
        while follower.next_seq() < b.resume.next_seq {
            let want = (b.resume.next_seq - follower.next_seq()) as usize;
            let got = follower.poll_batch(want, Duration::from_secs(60))?;
            if got.is_empty() {
                return Err(KafkaError::Timeout {
                    brokers: url.brokers.clone(),
                    what: "reading a committed batch's events while catching up",
                });
            }
            // Catching up, before any subscriber: the form is made when one wants it.
            for e in &got {
                events.push(to_event(e, None, &mut zbuf)?);
            }
            read.extend(got);
        }
        // With the batch's resync changes and backfill progress: what the publisher held, this
        // store holds, and it knows the repositories the publisher landed.
        append_events(
            store,
            &events,
            &read,
            &b.accounts,
            &b.pending,
            &b.progress,
            &b.resume,
        )?;
        metrics.kafka.caught_up_batches.fetch_add(1, Relaxed);
        applied = b.resume;
    }
    tracing::info!(
        batches = todo.len(),
        from = local.next_seq,
        next_seq = applied.next_seq,
        upstream_cursor = ?applied.upstream_cursor,
        "local store caught up with the Kafka topic"
    );
    Ok(applied)
}

/// An edge: follows the topic into the local store and publishes to subscribers, until `stop`
/// is set or a local failure. Events are stored in batches of whatever is ready (up to 4,096).
pub fn run_edge(
    url: &KafkaUrl,
    log: &Log,
    metrics: &Arc<Metrics>,
    mut resume: Resume,
    mut compressor: Option<zstd::bulk::Compressor<'static>>,
    stop: &AtomicBool,
) -> Result<(), KafkaError> {
    run_edge_with(
        url,
        log,
        metrics,
        &mut resume,
        &mut compressor,
        stop,
        AheadLimits::default(),
    )
}

/// Opens the follower, waiting out a cluster that cannot be read yet (brokers down, too few of
/// them up, a timeout): an edge started during an outage used to exit; it now retries, with
/// backoff from 1 s to 30 s and a warning each time, until the topic can be read or `stop` is
/// set (`None`). Errors that waiting cannot mend (a damaged record, the store) end it.
fn open_waiting(
    url: &KafkaUrl,
    resume: &Resume,
    metrics: &Arc<Metrics>,
    limits: AheadLimits,
    stop: &AtomicBool,
) -> Result<Option<Follower>, KafkaError> {
    let mut wait = Duration::from_secs(1);
    let mut failures = 0u32;
    loop {
        let e = match Follower::open_with(url, resume, metrics.clone(), limits) {
            Ok(f) => {
                if failures > 0 {
                    tracing::warn!(failures, "the Kafka topic can be read again: following it");
                }
                return Ok(Some(f));
            }
            Err(e @ (KafkaError::Client { .. } | KafkaError::Timeout { .. })) => e,
            Err(e) => return Err(e),
        };
        failures += 1;
        // An unreachable cluster was said by `KafkaUrl::reach` already (once a minute).
        let said = matches!(&e, KafkaError::Client { what, .. } if *what == crate::REACHING);
        match if said {
            Say::Quiet
        } else {
            crate::warnings().say("kafka-topic-unreadable")
        } {
            Say::Full => tracing::warn!(error = %e, failures, retry_in = ?wait,
                "cannot read the Kafka topic yet (brokers down?): waiting; /readyz says not ready \
                 (said again once a minute while it lasts)"),
            Say::Summary { .. } => tracing::warn!(error = %e, failures, retry_in = ?wait,
                "still cannot read the Kafka topic: waiting; /readyz says not ready"),
            Say::Quiet => {}
        }
        let until = Instant::now() + wait;
        while Instant::now() < until {
            if stop.load(Relaxed) {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        wait = (wait * 2).min(Duration::from_secs(30));
    }
}

/// [`run_edge`] with other bounds on the records held ahead (tests).
pub fn run_edge_with(
    url: &KafkaUrl,
    log: &Log,
    metrics: &Arc<Metrics>,
    resume: &mut Resume,
    compressor: &mut Option<zstd::bulk::Compressor<'static>>,
    stop: &AtomicBool,
    limits: AheadLimits,
) -> Result<(), KafkaError> {
    metrics.kafka.set_role(riptide_serve::KafkaRole::Edge);
    let mut empty = resume.next_seq <= 1 && resume.last_time_us == 0;
    let Some(mut follower) = open_waiting(url, resume, metrics, limits, stop)? else {
        return Ok(());
    };
    let mut zbuf = Vec::new();
    let mut events = Vec::with_capacity(4096);
    metrics
        .upstream_started_us
        .store(riptide_serve::now_us(), Relaxed);
    while !stop.load(Relaxed) {
        let got = follower.poll_batch(4096, Duration::from_millis(500))?;
        // Ready (`/readyz`) once connected and caught up with what the topic held at start,
        // not as soon as the topic could be opened.
        if !metrics.kafka.following.load(Relaxed) && follower.caught_up() {
            metrics.kafka.following.store(true, Relaxed);
            tracing::info!(topic = %url.topic, next_seq = resume.next_seq,
                "caught up with the Kafka topic: ready");
        }
        if got.is_empty() {
            continue;
        }
        let now = riptide_serve::now_us();
        if empty && got[0].seq > 1 {
            // The topic's retention removed its start before this store began: what it
            // holds from here on is all there is; cursors below behave as below a single
            // node's retention floor.
            log.store().raise_floor(got[0].seq)?;
            metrics.retention_floor.store(got[0].seq, Relaxed);
            tracing::warn!(
                floor = got[0].seq,
                "empty store on a topic that starts above seq 1: serving from seq {} (the \
                 floor; older cursors start there, v2 seq cursors below it are CursorTooOld)",
                got[0].seq
            );
        }
        empty = false;
        events.clear();
        let wanted = log.zstd_demand().wanted();
        for e in &got {
            events.push(to_event(
                e,
                compressor.as_mut().filter(|_| wanted),
                &mut zbuf,
            )?);
        }
        let last = &got[got.len() - 1];
        resume.next_seq = last.seq + 1;
        resume.last_time_us = last.time_us;
        append_events(log.store(), &events, &got, &[], &[], &[], resume)?;
        log.publish(&events);
        metrics.frames_in.fetch_add(got.len() as u64, Relaxed);
        metrics.upstream_last_us.store(now, Relaxed);
        metrics.upstream_seq.store(last.seq, Relaxed);
        metrics.upstream_event_time_us.store(last.time_us, Relaxed);
        metrics
            .events_stored
            .fetch_add(events.len() as u64, Relaxed);
        // On an edge, `riptide_ingest_publish_seconds` is end to end: from the ingest node's
        // stamp (`time_us`, before its Kafka commit) to this store.
        for e in &got {
            metrics
                .publish_seconds
                .observe(Duration::from_micros((now - e.time_us).max(0) as u64));
        }
        if follower.gap_seqs > 0 {
            metrics.upstream_gap_seqs.store(follower.gap_seqs, Relaxed);
        }
    }
    Ok(())
}

/// A shared stop flag for [`run_edge`].
pub fn stop_flag() -> Arc<AtomicBool> {
    Arc::new(AtomicBool::new(false))
}

#[cfg(test)]
mod tests {
    use super::*;
    use riptide_jetstream::EventKind;

    fn corpus(path: &str) -> Option<Vec<u8>> {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../../shared/corpus")
            .join(path);
        std::fs::read(p).ok()
    }

    /// `to_event` stores an event from the topic with Jetstream's zstd frame of its JSON when it
    /// is given the edge's compressor (its caller gives it while a `compress=true` subscriber
    /// wants the form) and with none otherwise: the real golden v1 events, each frame
    /// decompressed with the dictionary back to exactly the JSON.
    #[test]
    fn an_event_from_the_topic_gets_a_zstd_frame_from_the_edges_compressor() {
        let (Some(dict), Some(golden)) = (
            corpus("jetstream-dictionaries/legacy_subscribe.zdict"),
            corpus("jetstream-golden/golden_v1.jsonl"),
        ) else {
            return; // no ../shared beside the checkout
        };
        let dict = riptide_serve::Dictionary::from_bytes(dict).unwrap();
        let mut c = dict.compressor().unwrap();
        let mut d = zstd::bulk::Decompressor::with_dictionary(dict.bytes()).unwrap();
        let mut buf = Vec::new();
        let lines: Vec<&[u8]> = golden
            .split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
            .collect();
        assert_eq!(lines.len(), 10);
        for (i, json) in lines.into_iter().enumerate() {
            let e = TopicEvent {
                seq: i as u64 + 1,
                time_us: 1_779_719_009_132_431,
                kind: EventKind::Commit,
                did: "did:plc:mcc5yghbk7tixqryac2yxku7".into(),
                collection: String::new(),
                json: bytes::Bytes::copy_from_slice(json),
                row: None,
            };
            let without = to_event(&e, None, &mut buf).unwrap();
            assert_eq!(without.zstd_len(), 0);
            assert_eq!(&without.json()[..], json);
            let with = to_event(&e, Some(&mut c), &mut buf).unwrap();
            assert_eq!(&with.json()[..], json);
            let z = with.zstd();
            assert!(!z.is_empty() && z.len() < json.len(), "event {i}");
            assert_eq!(d.decompress(&z, 1 << 20).unwrap(), json, "event {i}");
        }
    }
}
