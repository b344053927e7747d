//! The ingest node's half of the distributed backfill (`riptide serve --publish kafka://B/T
//! --backfill-from kafka://B/W`, issue 37): it reads the workers' `W.backfill`
//! ([`crate::repo_record`]) and hands each repository to its writer, as `serve --backfill`
//! hands its own crawl's ([`riptide_serve::backfill::IngestSink`]), so that backfill and live
//! share one seq space, one chain state per account and one stream on `T` for the edges.
//!
//! Why a consumer of its own and not the workers writing into `T`: only the ingest node can
//! assign seqs, and its chain state must learn each backfilled commit (`docs/kafka.md`).
//!
//! **Exactly once, across `kill -9`.** The consumer (group `riptide-ingest-backfill.W`,
//! read_committed) commits its offsets only after the repositories read before them are
//! durable in the store ([`Sink::commit`]), and never past the first chunk of a repository
//! whose chunks have not all arrived. After a crash it reads again from the last committed
//! offset, and a repository that landed already is not handed over twice: the sink finds its
//! progress entry (`riptide_backfill::landed_in`), which a node that caught its store up from
//! `T` (a standby taking over) has too: the batch records carry them
//! ([`crate::record::encode_progress`]).
//!
//! **The hold.** Like `serve --backfill`, the caller holds the live frames of accounts with no
//! verified commit from the start (`Upstream::BackfillStart`); this loop calls `over` once the
//! workers are done (a listing of the relay's hosts complete on the work topic, and every host
//! offered finished, [`crate::backfill`]) and everything they published is landed, and the caller then releases what is held (`Upstream::BackfillOver`).
//!
//! **Bad input.** A record that does not decode, a chunk out of order, or a repository whose
//! rebuilt blocks are not their CIDs is skipped, counted (`riptide_kafka_backfill_bad_records_
//! total`) and said (a line per kind, then a summary a minute). Chunks waiting for the rest of
//! their repository are bounded ([`MAX_ASSEMBLING_BYTES`]); past it the oldest repository in
//! assembly is given up, counted and said.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::{Duration, Instant};

use rdkafka::consumer::{CommitMode, Consumer};
use rdkafka::message::Message;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};
use riptide_backfill::{Sink, SinkError};
use riptide_serve::Metrics;
use riptide_throttle::Say;

use crate::backfill::Topics;
use crate::repo_record::{self, BadRepoRecord};
use crate::{warnings, KafkaError, KafkaUrl, Quiet, Reader};

/// Bytes of chunks held while their repository's other chunks are awaited, at most.
pub const MAX_ASSEMBLING_BYTES: usize = 256 << 20;

/// Repositories handed over between two commits, at most (then the loop waits for them to be
/// durable and commits the consumed offsets).
const COMMIT_EVERY: usize = 256;

/// How often the offsets are committed while repositories arrive.
const COMMIT_INTERVAL: Duration = Duration::from_secs(1);

/// The consumer group of the ingest node reading `topic`'s backfill.
pub fn group_id(topic: &str) -> String {
    format!("riptide-ingest-backfill.{topic}")
}

/// Why the loop stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TailError {
    /// The cluster.
    #[error(transparent)]
    Kafka(#[from] KafkaError),
    /// The sink (ingest stopped, or the store failed).
    #[error("landing a backfilled repository: {0}")]
    Sink(#[from] SinkError),
}

/// A repository whose chunks are arriving.
struct Assembly {
    partition: i32,
    /// The offset of its first chunk (the consumed offsets stay at or before it).
    first: i64,
    rev: String,
    commit: riptide_cbor::CidBuf,
    count: u32,
    chunks: Vec<Vec<u8>>,
    bytes: usize,
    started: Instant,
}

/// Chunks into repositories, keyed by DID (chunks of one repository share a key, so a
/// partition, and come in order within the worker's transaction).
#[derive(Default)]
struct Assembler {
    open: HashMap<String, Assembly>,
    bytes: usize,
}

/// What one record gave.
enum Pushed {
    /// A chunk of a repository not complete yet.
    Waiting,
    /// The last chunk: the repository's values, in order.
    Complete(Vec<Vec<u8>>),
}

impl Assembler {
    fn push(
        &mut self,
        partition: i32,
        offset: i64,
        key: &[u8],
        value: &[u8],
    ) -> Result<Pushed, BadRepoRecord> {
        let c = repo_record::decode(key, value)?;
        if c.count == 1 {
            return Ok(Pushed::Complete(vec![value.to_vec()]));
        }
        let did = c.did.to_owned();
        if c.index == 0 {
            if let Some(a) = self.open.remove(&did) {
                self.bytes -= a.bytes;
                self.started_again(&did, &a);
            }
            self.bytes += value.len();
            self.open.insert(
                did,
                Assembly {
                    partition,
                    first: offset,
                    rev: c.rev.to_owned(),
                    commit: c.commit,
                    count: c.count,
                    chunks: vec![value.to_vec()],
                    bytes: value.len(),
                    started: Instant::now(),
                },
            );
            return Ok(Pushed::Waiting);
        }
        let Some(a) = self.open.get_mut(&did) else {
            return Err(BadRepoRecord::Chunk {
                index: c.index,
                count: c.count,
            });
        };
        if a.rev != c.rev
            || a.commit != c.commit
            || a.count != c.count
            || a.chunks.len() != c.index as usize
        {
            let index = c.index;
            let count = c.count;
            if let Some(a) = self.open.remove(&did) {
                self.bytes -= a.bytes;
            }
            return Err(BadRepoRecord::Chunk { index, count });
        }
        a.chunks.push(value.to_vec());
        a.bytes += value.len();
        self.bytes += value.len();
        if a.chunks.len() == a.count as usize {
            let a = self.open.remove(&did).expect("just found");
            self.bytes -= a.bytes;
            return Ok(Pushed::Complete(a.chunks));
        }
        Ok(Pushed::Waiting)
    }

    fn started_again(&self, did: &str, a: &Assembly) {
        tracing::warn!(did, rev = %a.rev, chunks = a.chunks.len(), of = a.count,
            "backfill: a repository's chunks stopped before its last one and it started again: the incomplete copy is skipped");
    }

    /// Gives up the oldest repositories in assembly while more than [`MAX_ASSEMBLING_BYTES`]
    /// are held; how many.
    fn bound(&mut self) -> u64 {
        let mut given_up = 0;
        while self.bytes > MAX_ASSEMBLING_BYTES {
            let Some(did) = self
                .open
                .iter()
                .min_by_key(|(_, a)| a.started)
                .map(|(d, _)| d.clone())
            else {
                break;
            };
            let a = self.open.remove(&did).expect("just found");
            self.bytes -= a.bytes;
            given_up += 1;
            tracing::error!(did, rev = %a.rev, chunks = a.chunks.len(), of = a.count, held_bytes = self.bytes + a.bytes,
                "backfill: repositories in assembly hold more than the bound: the oldest is skipped (riptide_kafka_backfill_bad_records_total)");
        }
        given_up
    }

    /// The offset before which every chunk of `partition` is done with.
    fn floor(&self, partition: i32) -> Option<i64> {
        self.open
            .values()
            .filter(|a| a.partition == partition)
            .map(|a| a.first)
            .min()
    }
}

/// Reads `W.backfill` of the workers' address `url` into `sink` until `stop` (module docs);
/// calls `over` once when the workers are done and their output has landed.
pub fn run(
    url: &KafkaUrl,
    sink: &mut dyn Sink,
    metrics: &Metrics,
    over: &mut dyn FnMut(),
    stop: &AtomicBool,
) -> Result<(), TailError> {
    let topics = Topics::of(&url.topic);
    let topic = topics.rows.as_str();
    let probe = url.reader()?;
    url.reach(&probe, None)?;
    let consumer: Reader = url
        .committed_reader(&group_id(&url.topic))
        // The workers create the topic: see it soon after they do.
        .set("topic.metadata.refresh.interval.ms", "2000")
        // A node killed with SIGKILL leaves its member in the group until its session times
        // out, and its successor gets the partitions only then (librdkafka's default: 45 s,
        // live frames held meanwhile); the ingest lease's timeout, so both move together.
        .set(
            "session.timeout.ms",
            crate::lease::SESSION_TIMEOUT_MS.to_string(),
        )
        .set("heartbeat.interval.ms", "1000")
        .create_with_context(Quiet)
        .map_err(url.client_err("creating the backfill consumer"))?;
    consumer
        .subscribe(&[topic])
        .map_err(url.client_err("subscribing to the backfill topic"))?;
    sink.recover(None)?;
    tracing::info!(topic, group = %group_id(&url.topic), "backfill: landing the workers' repositories");
    let k = &metrics.kafka;
    let mut asm = Assembler::default();
    // Per partition: the offset after the last record read.
    let mut next: HashMap<i32, i64> = HashMap::new();
    let mut committed: HashMap<i32, i64> = HashMap::new();
    let mut handed = 0usize;
    let mut last_commit = Instant::now();
    let mut done = false;
    let mut waiting_said = false;
    let mut last_check = Instant::now() - Duration::from_secs(60);
    // Partitions read to their end with no record since (librdkafka's EOF).
    let mut at_end: HashSet<i32> = HashSet::new();
    // Since when the workers have been seen done.
    let mut done_since: Option<Instant> = None;
    // A worker's listing of the relay's hosts seen complete on the work topic.
    let mut listed = false;
    loop {
        if stop.load(Relaxed) {
            break;
        }
        let mut idle = false;
        match consumer.poll(Duration::from_millis(100)) {
            None => idle = true,
            Some(Err(rdkafka::error::KafkaError::PartitionEOF(p))) => {
                at_end.insert(p);
                idle = true;
            }
            // No worker has created it yet: waited for, said once.
            Some(Err(rdkafka::error::KafkaError::MessageConsumption(
                RDKafkaErrorCode::UnknownTopicOrPartition,
            ))) => {
                idle = true;
                if !waiting_said {
                    waiting_said = true;
                    tracing::info!(topic, "backfill: the workers' topic does not exist yet: waiting for the first worker (riptide backfill --publish) to create it");
                }
            }
            Some(Err(e)) => {
                idle = true;
                if let Say::Full | Say::Summary { .. } = warnings().say("backfill-consume") {
                    tracing::warn!(error = %e, topic, "backfill: reading the workers' topic failed: trying again");
                }
            }
            Some(Ok(m)) => {
                let (p, o) = (m.partition(), m.offset());
                at_end.remove(&p);
                next.insert(p, o + 1);
                k.backfill_records_consumed.fetch_add(1, Relaxed);
                let key = m.key().unwrap_or_default();
                let value = m.payload().unwrap_or_default();
                let complete = match asm.push(p, o, key, value) {
                    Ok(Pushed::Waiting) => None,
                    Ok(Pushed::Complete(values)) => {
                        let source = format!("{topic}/{p}@{o}");
                        match repo_record::rebuild(key, &values, &source) {
                            Ok(v) => Some(v),
                            Err(why) => {
                                bad(metrics, topic, p, o, &why.to_string());
                                None
                            }
                        }
                    }
                    Err(e) => {
                        bad(metrics, topic, p, o, &e.to_string());
                        None
                    }
                };
                let given_up = asm.bound();
                k.backfill_bad_records.fetch_add(given_up, Relaxed);
                if let Some(v) = complete {
                    sink.write(&v)?;
                    handed += 1;
                    k.backfill_repos.fetch_add(1, Relaxed);
                }
            }
        }
        let due = last_commit.elapsed() >= COMMIT_INTERVAL || handed >= COMMIT_EVERY;
        if due || (idle && handed > 0) {
            if handed > 0 {
                sink.commit()?;
                handed = 0;
            }
            commit_offsets(url, &consumer, topic, &asm, &next, &mut committed);
            last_commit = Instant::now();
        }
        if !done && idle && handed == 0 && last_check.elapsed() >= Duration::from_secs(1) {
            last_check = Instant::now();
            if asm.open.is_empty()
                && landed_all(
                    url,
                    &probe,
                    &consumer,
                    &topics,
                    &at_end,
                    &mut listed,
                    &mut done_since,
                )?
            {
                done = true;
                k.backfill_done.store(true, Relaxed);
                tracing::info!(
                    repos = k.backfill_repos.load(Relaxed),
                    bad_records = k.backfill_bad_records.load(Relaxed),
                    "backfill: the workers are done and every repository they published has landed: the frames held for it are released"
                );
                over();
            }
        }
    }
    if handed > 0 {
        sink.commit()?;
    }
    commit_offsets(url, &consumer, topic, &asm, &next, &mut committed);
    Ok(())
}

fn bad(metrics: &Metrics, topic: &str, p: i32, o: i64, why: &str) {
    metrics.kafka.backfill_bad_records.fetch_add(1, Relaxed);
    match warnings().say("backfill-bad-record") {
        Say::Full => tracing::warn!(topic, partition = p, offset = o, why,
            "backfill: a record of the workers' topic is skipped (riptide_kafka_backfill_bad_records_total)"),
        Say::Summary { suppressed, total } => tracing::warn!(topic, partition = p, offset = o, why, suppressed, total,
            "backfill: records of the workers' topic skipped (riptide_kafka_backfill_bad_records_total)"),
        Say::Quiet => {}
    }
}

/// Commits, per partition, the offset after everything durable: the next offset to read, or the
/// first chunk of a repository still in assembly. Only what moved; a failure is said and
/// tried again at the next commit (the records after the committed offset are read again after
/// a restart, and land once: module docs).
fn commit_offsets(
    url: &KafkaUrl,
    consumer: &Reader,
    topic: &str,
    asm: &Assembler,
    next: &HashMap<i32, i64>,
    committed: &mut HashMap<i32, i64>,
) {
    let mut tpl = TopicPartitionList::new();
    let mut moved = Vec::new();
    for (&p, &n) in next {
        let at = asm.floor(p).map_or(n, |f| f.min(n));
        if committed.get(&p) != Some(&at)
            && tpl
                .add_partition_offset(topic, p, Offset::Offset(at))
                .is_ok()
        {
            moved.push((p, at));
        }
    }
    if moved.is_empty() {
        return;
    }
    match consumer.commit(&tpl, CommitMode::Sync) {
        Ok(()) => committed.extend(moved),
        Err(e) => {
            if let Say::Full | Say::Summary { .. } = warnings().say("backfill-commit") {
                tracing::warn!(brokers = %url.brokers, topic, error = %e,
                    "backfill: committing the consumed offsets failed: trying again with the next ones");
            }
        }
    }
}

/// `topic`'s partition count (0: it does not exist yet).
fn partitions(url: &KafkaUrl, probe: &Reader, topic: &str) -> Result<i32, KafkaError> {
    let md = probe
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .map_err(url.client_err("reading a backfill topic's metadata"))?;
    Ok(md
        .topics()
        .first()
        .filter(|t| t.error().is_none())
        .map_or(0, |t| t.partitions().len() as i32))
}

/// Whether the workers are done (a listing of the relay's hosts complete on the work topic,
/// `listed` once seen, and every host offered finished) and every partition of their
/// topic has been read to its end since: its position at the high watermark read after the
/// workers' word (librdkafka's position passes the transaction markers), or, for a partition
/// with nothing read since this node started (a restart after the backfill ended: no position
/// yet), its end reached (EOF) with nothing after it for a second after the workers were seen
/// done (records committed before that have been fetched by then).
fn landed_all(
    url: &KafkaUrl,
    probe: &Reader,
    consumer: &Reader,
    topics: &Topics,
    at_end: &HashSet<i32>,
    listed: &mut bool,
    done_since: &mut Option<Instant>,
) -> Result<bool, KafkaError> {
    if !crate::backfill::workers_done(url, listed)? {
        *done_since = None;
        return Ok(false);
    }
    let since = *done_since.get_or_insert_with(Instant::now);
    let settled = since.elapsed() >= Duration::from_secs(1);
    let n = partitions(url, probe, &topics.rows)?;
    if n == 0 {
        return Ok(false);
    }
    let Ok(pos) = consumer.position() else {
        return Ok(false);
    };
    for p in 0..n {
        let (_, high) = crate::backfill::watermarks(url, probe, &topics.rows, p)?;
        if high == 0 {
            continue;
        }
        let at = pos
            .find_partition(&topics.rows, p)
            .and_then(|e| match e.offset() {
                Offset::Offset(o) => Some(o),
                _ => None,
            });
        let read = at.is_some_and(|o| o >= high) || (settled && at_end.contains(&p));
        if !read {
            return Ok(false);
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use riptide_backfill::{Collections, Verified};

    fn repo() -> Option<Verified> {
        let bytes = riptide_testdata::read("jetstream-2026-07/repo.car")?;
        Some(
            riptide_backfill::verify_car(
                Box::new(bytes),
                "did:plc:53iucmf5ldftgqyf2ac7hmhd",
                None,
                &Collections::all(),
                "test",
            )
            .unwrap(),
        )
    }

    #[test]
    fn chunks_assemble_in_order_and_strays_are_refused() {
        let Some(v) = repo() else {
            return;
        };
        let key = v.did.as_bytes();
        let (values, _) = repo_record::encode(&v, 512).unwrap();
        assert!(values.len() >= 3, "{}", values.len());
        let mut a = Assembler::default();
        for (i, val) in values.iter().enumerate() {
            match a.push(2, 100 + i as i64, key, val).unwrap() {
                Pushed::Waiting => {
                    assert!(i + 1 < values.len());
                    // The committed offset stays at the repository's first chunk.
                    assert_eq!(a.floor(2), Some(100));
                    assert_eq!(a.floor(1), None);
                }
                Pushed::Complete(all) => {
                    assert_eq!(i + 1, values.len());
                    assert_eq!(&all, &values);
                    let back = repo_record::rebuild(key, &all, "t").unwrap();
                    let ls = |v: &Verified| -> Vec<String> {
                        v.records()
                            .map(|r| format!("{}/{}\t{}", r.collection, r.rkey, r.cid))
                            .collect()
                    };
                    assert_eq!(ls(&back), ls(&v));
                }
            }
        }
        assert!(a.open.is_empty() && a.bytes == 0);
        // A chunk with no start, or out of order: refused, nothing held.
        assert!(matches!(
            a.push(2, 200, key, &values[1]),
            Err(BadRepoRecord::Chunk { index: 1, .. })
        ));
        a.push(2, 201, key, &values[0]).unwrap();
        assert!(a.push(2, 202, key, &values[2]).is_err());
        assert!(a.open.is_empty() && a.bytes == 0);
        // A start again after an incomplete copy: the copy is dropped, the new one assembles.
        a.push(2, 203, key, &values[0]).unwrap();
        a.push(2, 204, key, &values[0]).unwrap();
        assert_eq!(a.floor(2), Some(204));
        assert_eq!(a.bytes, values[0].len());
    }

    #[test]
    fn a_repository_whose_block_is_not_its_cid_is_not_rebuilt() {
        let Some(v) = repo() else {
            return;
        };
        let key = v.did.as_bytes();
        let (mut values, _) = repo_record::encode(&v, repo_record::CHUNK_BYTES).unwrap();
        // Flip the last byte of the last record's DAG-CBOR.
        let last = values[0].len() - 1;
        values[0][last] ^= 1;
        let e = repo_record::rebuild(key, &values, "t")
            .unwrap_err()
            .to_string();
        assert!(e.contains("CID"), "{e}");
    }
}
