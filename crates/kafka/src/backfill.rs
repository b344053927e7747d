//! The backfill crawl spread over a Kafka consumer group (`riptide backfill --publish
//! kafka://BROKERS/TOPIC`, issue 37): hosts are the work items, each worker crawls the hosts of
//! the partitions the group gives it, and each verified repository lands exactly once.
//!
//! Why this shape (the design, `docs/kafka.md` § "Backfill workers"):
//! - **Work**: `TOPIC.backfill.hosts`, one record per host (key: the hostname). Every worker
//!   lists the relay's hosts at start and adds those the topic does not hold yet, so no
//!   separate coordinator is needed; two workers starting at once may both add a host, and
//!   then the copy is two records with one key in one partition, which its owner recognises
//!   (the host's progress says finished, or it was seen already) and skips. A worker adds its
//!   hosts and a listing's end ([`LISTED_KEY`], partition 0) in one transaction, so a reader
//!   that sees a listing's end sees every host of that listing: the ingest node's hold waits
//!   for one ([`listing_complete`]), lest it end while only some hosts are offered.
//! - **Ownership**: the workers are one consumer group on that topic. Partition `p`'s owner
//!   produces with the transactional id `riptide-backfill.TOPIC.p`: taking a partition over
//!   starts with `init_transactions`, which fences the previous owner (a killed or a zombie
//!   worker) and aborts its open transaction, so what the new owner then reads is final.
//! - **Progress**, committed in the same transaction as the rows: per host, a record on the
//!   compacted `TOPIC.backfill.progress` (same partition `p`): the listing cursor of the page in
//!   work and the DIDs of that page already done, counters, and `finished`; and, when a host is
//!   finished, the group's consumed offset of its work record (`send_offsets_to_transaction`,
//!   which also fences a member of an older group generation). Hosts of a partition are crawled
//!   one after another in offset order, so the consumed offset says which host is next.
//! - **Output**: each repository on `TOPIC.backfill` (key: DID; value: [`crate::repo_record`]
//!   chunks: its records' DAG-CBOR as signed, with its commit), its failure (reason, detail) on `TOPIC.backfill.failed`,
//!   all in the transaction that moves its host's progress past it. Readers use
//!   `read_committed`. The rows carry no seq: a single seq space is assigned once, by whoever
//!   appends them to a store (the design's second half, `docs/kafka.md`).
//!
//! A worker ends when every partition's consumed offset has reached its end (every host of
//! the topic finished by someone), so a worker never leaves while another's hosts could still
//! fall to it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::consumer::{Consumer, ConsumerGroupMetadata};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};
use riptide_backfill::discover::{self, host_base, page_url, Entry};
use riptide_backfill::{Failure, Getter, Verified};

use crate::repo_record;
use serde::{Deserialize, Serialize};
use tokio::task::JoinSet;

use crate::{KafkaError, KafkaUrl, Quiet, Reader};

/// How long one transaction may take to commit before it is retried.
const COMMIT_TIMEOUT: Duration = Duration::from_secs(60);

/// Listing page size asked of a host.
const PAGE: usize = 500;

/// The key of a listing's end on the work topic: one record, in partition 0, in the
/// transaction that adds the listing's hosts (value: [`Listed`] as JSON). Not a hostname (`#`
/// is outside their syntax), so no host is keyed so; owners skip it.
pub const LISTED_KEY: &str = "#listed";

/// A listing's end: how many hosts the worker's listing of the relay named (banned ones left
/// out), all on the work topic once this record is committed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Listed {
    /// Hosts in the listing (some may have been on the topic already).
    pub hosts: u64,
}

/// Attempts at offering the listing (a transaction) before the worker gives up.
const OFFER_ATTEMPTS: u32 = 5;

/// The topics of a backfill on `TOPIC`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Topics {
    /// `TOPIC.backfill.hosts`: the work, one record per host.
    pub hosts: String,
    /// `TOPIC.backfill.progress` (compacted): each host's progress, in its work partition.
    pub progress: String,
    /// `TOPIC.backfill`: every verified repository, as [`crate::repo_record`] chunks keyed by
    /// DID.
    pub rows: String,
    /// `TOPIC.backfill.failed`: every repository that failed, with its reason, keyed by DID.
    pub failed: String,
}

impl Topics {
    /// The backfill topics of the events topic `topic`.
    pub fn of(topic: &str) -> Topics {
        Topics {
            hosts: format!("{topic}.backfill.hosts"),
            progress: format!("{topic}.backfill.progress"),
            rows: format!("{topic}.backfill"),
            failed: format!("{topic}.backfill.failed"),
        }
    }
}

/// The consumer group of the workers of `topic`.
pub fn group_id(topic: &str) -> String {
    format!("riptide-backfill.{topic}")
}

/// The transactional id of the owner of work partition `p`.
pub fn transactional_id(topic: &str, p: i32) -> String {
    format!("riptide-backfill.{topic}.{p}")
}

/// One host's progress, as its progress record holds it (JSON; `docs/kafka.md`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostProgress {
    /// The hostname.
    pub host: String,
    /// The `listRepos` cursor of the page in work (`None`: the first page).
    pub cursor: Option<String>,
    /// DIDs of that page whose outcome is committed.
    pub done: Vec<String>,
    /// Every account of the host has an outcome (or its listing failed: `problem`).
    pub finished: bool,
    /// Repositories backfilled.
    pub ok: u64,
    /// Records published.
    pub records: u64,
    /// Records outside the atproto data model, not published.
    pub dropped: u64,
    /// Repositories failed, by reason.
    pub failed: BTreeMap<String, u64>,
    /// Listing entries that were not DIDs.
    pub invalid: u64,
    /// Why the host's listing could not be read to its end (reported, never silent).
    pub problem: Option<String>,
}

/// A failed repository's record on the `failed` topic.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailedRepo {
    /// The account.
    pub did: String,
    /// The host that listed it.
    pub host: String,
    /// The stable reason name (`riptide backfill status`'s).
    pub reason: String,
    /// What happened.
    pub detail: String,
    /// Attempts made.
    pub attempts: u32,
}

/// How a worker runs.
#[derive(Clone, Debug)]
pub struct WorkerConfig {
    /// Where: the brokers and the topic the backfill topics are named after.
    pub url: KafkaUrl,
    /// The relay's `http(s)://` base (its `listHosts`).
    pub relay: String,
    /// Accounts of one host in flight at once.
    pub window: usize,
}

/// A worker's counts, for its log lines and its caller.
#[derive(Debug, Default)]
pub struct WorkerCounts {
    /// Repositories published.
    pub ok: AtomicU64,
    /// Repositories failed (on the `failed` topic).
    pub failed: AtomicU64,
    /// Records published.
    pub records: AtomicU64,
    /// Bytes of the repositories published (their CARs, as verified).
    pub bytes: AtomicU64,
    /// Repositories failed, by reason (`riptide backfill status`'s names).
    pub failed_by_reason: Mutex<BTreeMap<String, u64>>,
    /// Hosts finished by this worker.
    pub hosts: AtomicU64,
    /// Transactions committed.
    pub committed: AtomicU64,
    /// Transactions aborted (and sent again, or given up when the partition moved).
    pub aborted: AtomicU64,
    /// Partitions taken over.
    pub partitions: AtomicU64,
}

impl WorkerCounts {
    /// This worker's counts for `/metrics` ([`riptide_backfill::metrics`]), after running
    /// `secs`: the hosts it finished (what is left is the group's, `backfill status
    /// --publish`), its repositories by outcome, records and bytes, its rate; no ETA.
    pub fn counts(&self, secs: f64) -> riptide_backfill::metrics::Counts {
        let repos_failed = self
            .failed_by_reason
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let ok = self.ok.load(Relaxed);
        let failed = self.failed.load(Relaxed);
        riptide_backfill::metrics::Counts {
            listings: (self.hosts.load(Relaxed), None, None),
            repos_ok: ok,
            repos_failed,
            records: (self.records.load(Relaxed), 0),
            bytes: self.bytes.load(Relaxed),
            repos_per_sec: if secs > 0.0 {
                (ok + failed) as f64 / secs
            } else {
                0.0
            },
            expected_repos: None,
            eta_secs: None,
        }
    }
}

/// Why an owner stopped before its partition's end: it is no longer the owner.
#[derive(Debug)]
struct Lost(String);

/// Runs one worker to the end of the whole backfill (module docs). Blocking: call it off the
/// async threads; `rt` runs the fetches.
pub fn run_worker(
    cfg: &WorkerConfig,
    getter: Arc<Getter>,
    rt: tokio::runtime::Handle,
    counts: Arc<WorkerCounts>,
) -> Result<(), KafkaError> {
    let url = &cfg.url;
    let topics = Topics::of(&url.topic);
    rt.block_on(ensure_topics(url, &topics))?;
    let offered = rt.block_on(offer_hosts(cfg, &getter, &topics))?;
    tracing::info!(hosts = offered.0, added = offered.1, topic = %topics.hosts,
        "backfill worker: the relay's hosts are on the work topic");
    let group: Reader = url
        .config()
        .set("group.id", group_id(&url.topic))
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .set("auto.offset.reset", "earliest")
        .set("session.timeout.ms", "10000")
        .set("heartbeat.interval.ms", "1000")
        .create_with_context(Quiet)
        .map_err(url.client_err("creating the group consumer"))?;
    group
        .subscribe(&[&topics.hosts])
        .map_err(url.client_err("joining the backfill group"))?;
    let cgm: Arc<Mutex<Option<ConsumerGroupMetadata>>> = Arc::default();
    let mut owners: HashMap<i32, Owner> = HashMap::new();
    let checker = url.reader()?;
    let mut last_check = Instant::now();
    let result = loop {
        // Messages are not read here (each owner reads its partition); polling serves the group.
        if let Some(Err(e)) = group.poll(Duration::from_millis(200)) {
            tracing::debug!(error = %e, "backfill worker: group consumer");
        }
        let assigned: HashSet<i32> = group
            .assignment()
            .map(|tpl| {
                tpl.elements()
                    .iter()
                    .map(rdkafka::topic_partition_list::TopicPartitionListElem::partition)
                    .collect()
            })
            .unwrap_or_default();
        if !assigned.is_empty() {
            *lock(&cgm) = group.group_metadata();
            if let Ok(tpl) = group.assignment() {
                let _ = group.pause(&tpl);
            }
        }
        owners.retain(|p, o| {
            let keep = assigned.contains(p) && !o.thread.is_finished();
            if !keep {
                o.stop.store(true, Relaxed);
            }
            keep || !o.thread.is_finished()
        });
        // Partitions given to this worker (its start, or a rebalance when another worker
        // left): when every host is finished already, the worker ends without taking them over
        // (each takeover is an `init_transactions` and a read of the partition: a worker that
        // got the 64 partitions of two peers ending first took 3 s more to end).
        let fresh = assigned.iter().any(|p| !owners.contains_key(p));
        if fresh {
            last_check = Instant::now();
            match all_done(url, &checker, &topics.hosts) {
                Ok(true) => break Ok(()),
                Ok(false) => {}
                Err(e) => tracing::debug!(error = %e, "backfill worker: checking the end"),
            }
        }
        for &p in &assigned {
            if owners.get(&p).is_some_and(|o| o.stop.load(Relaxed)) {
                continue;
            }
            if let std::collections::hash_map::Entry::Vacant(v) = owners.entry(p) {
                counts.partitions.fetch_add(1, Relaxed);
                v.insert(Owner::start(p, cfg, &topics, &getter, &rt, &cgm, &counts)?);
            }
        }
        let idle = owners.values().all(|o| o.idle.load(Relaxed));
        if idle && last_check.elapsed() >= Duration::from_secs(1) {
            last_check = Instant::now();
            match all_done(url, &checker, &topics.hosts) {
                Ok(true) => break Ok(()),
                Ok(false) => {}
                Err(e) => tracing::debug!(error = %e, "backfill worker: checking the end"),
            }
        }
    };
    for o in owners.values() {
        o.stop.store(true, Relaxed);
    }
    for (_, o) in owners.drain() {
        let _ = o.thread.join();
    }
    group.unsubscribe();
    result
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A partition's owner thread.
struct Owner {
    stop: Arc<AtomicBool>,
    idle: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

impl Owner {
    fn start(
        p: i32,
        cfg: &WorkerConfig,
        topics: &Topics,
        getter: &Arc<Getter>,
        rt: &tokio::runtime::Handle,
        cgm: &Arc<Mutex<Option<ConsumerGroupMetadata>>>,
        counts: &Arc<WorkerCounts>,
    ) -> Result<Owner, KafkaError> {
        let stop = Arc::new(AtomicBool::new(false));
        let idle = Arc::new(AtomicBool::new(false));
        let mut part = Partition {
            p,
            cfg: cfg.clone(),
            topics: topics.clone(),
            getter: getter.clone(),
            cgm: cgm.clone(),
            counts: counts.clone(),
            stop: stop.clone(),
            idle: idle.clone(),
            producer: None,
        };
        let rt = rt.clone();
        let thread = std::thread::Builder::new()
            .name(format!("backfill-p{p}"))
            .spawn(move || {
                tracing::info!(
                    partition = p,
                    "backfill worker: taking this work partition over"
                );
                match rt.block_on(part.own()) {
                    Ok(()) => {}
                    Err(Lost(why)) if part.stop.load(Relaxed) => {
                        tracing::info!(partition = p, why, "backfill worker: partition left")
                    }
                    Err(Lost(why)) => {
                        // Taken over again by the worker's loop: not in a tight loop.
                        tracing::warn!(partition = p, why,
                            "backfill worker: the partition's owner stopped; starting it again in 2 s");
                        std::thread::sleep(Duration::from_secs(2));
                    }
                }
                part.idle.store(true, Relaxed);
            })
            .map_err(|e| KafkaError::Inconsistent(format!("starting an owner thread: {e}")))?;
        Ok(Owner { stop, idle, thread })
    }
}

/// The owner of one work partition (module docs).
struct Partition {
    p: i32,
    cfg: WorkerConfig,
    topics: Topics,
    getter: Arc<Getter>,
    cgm: Arc<Mutex<Option<ConsumerGroupMetadata>>>,
    counts: Arc<WorkerCounts>,
    stop: Arc<AtomicBool>,
    idle: Arc<AtomicBool>,
    producer: Option<BaseProducer<Quiet>>,
}

/// What one transaction carries besides the progress record.
#[derive(Default)]
struct Outcomes {
    ok: Vec<Verified>,
    failed: Vec<(Failure, u32)>,
}

impl Partition {
    fn lost(&self, why: impl std::fmt::Display) -> Lost {
        Lost(why.to_string())
    }

    fn check_stop(&self) -> Result<(), Lost> {
        if self.stop.load(Relaxed) {
            return Err(self.lost("the group moved the partition (or the worker is ending)"));
        }
        Ok(())
    }

    /// Takes the partition over (fencing the previous owner), then crawls its hosts in order.
    async fn own(&mut self) -> Result<(), Lost> {
        let url = &self.cfg.url;
        let producer: BaseProducer<Quiet> = url
            .config()
            .set("transactional.id", transactional_id(&url.topic, self.p))
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("transaction.timeout.ms", "60000")
            .set("message.timeout.ms", "55000")
            .set("linger.ms", "5")
            .set("compression.type", "lz4")
            .set("message.max.bytes", crate::MAX_RECORD_BYTES)
            .create_with_context(Quiet)
            .map_err(|e| self.lost(format!("creating the producer: {e}")))?;
        // Fences the previous owner and aborts its open transaction: from here on, what the
        // topics hold for this partition is final until this producer commits.
        tokio::task::block_in_place(|| producer.init_transactions(COMMIT_TIMEOUT))
            .map_err(|e| self.lost(format!("taking the transactional id over: {e}")))?;
        self.producer = Some(producer);
        let reader = self.reader()?;
        let mut progress = self.read_progress(&reader)?;
        let start = self.committed(&reader)?;
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&self.topics.hosts, self.p, start)
            .map_err(|e| self.lost(e))?;
        reader.assign(&tpl).map_err(|e| self.lost(e))?;
        // The group's consumed offset, as this owner last committed it.
        let mut consumed = match start {
            Offset::Offset(o) => o,
            _ => 0,
        };
        loop {
            self.check_stop()?;
            let next = tokio::task::block_in_place(|| {
                reader
                    .poll(Duration::from_millis(500))
                    .map(|r| r.map(|m| (m.offset(), m.key().map(<[u8]>::to_vec))))
            });
            let (offset, key) = match next {
                None => continue,
                Some(Err(rdkafka::error::KafkaError::PartitionEOF(_))) => {
                    // Read to the end: the consumed offset goes past the transaction's marker
                    // after the last record (hosts are offered in transactions), or it would
                    // stay below the partition's end, which is what `all_done` compares it to.
                    if let Some(end) = self.position(&reader).filter(|&e| e > consumed) {
                        self.commit(&Outcomes::default(), None, Some(end))?;
                        consumed = end;
                    }
                    self.idle.store(true, Relaxed);
                    continue;
                }
                Some(Err(e)) => {
                    tracing::warn!(partition = self.p, error = %e, "backfill worker: reading the work partition");
                    continue;
                }
                Some(Ok(m)) => m,
            };
            self.idle.store(false, Relaxed);
            let host = String::from_utf8_lossy(&key.unwrap_or_default()).into_owned();
            // Kept for the whole ownership: a host offered twice (by two workers) has several
            // work records, and every copy after the first finds it finished here.
            let mut prog = progress
                .entry(host.clone())
                .or_insert_with(|| HostProgress {
                    host: host.clone(),
                    ..HostProgress::default()
                })
                .clone();
            if prog.finished || host.is_empty() || host == LISTED_KEY {
                // A copy of a host already done, or a listing's end: only the consumed offset
                // moves.
                self.commit(&Outcomes::default(), None, Some(offset + 1))?;
                consumed = offset + 1;
                continue;
            }
            self.crawl_host(&mut prog, offset).await?;
            consumed = offset + 1;
            progress.insert(host.clone(), prog.clone());
            self.counts.hosts.fetch_add(1, Relaxed);
            tracing::info!(partition = self.p, host, ok = prog.ok, records = prog.records,
                failed = ?prog.failed, problem = ?prog.problem, "backfill worker: host finished");
        }
    }

    /// The reader's position in this work partition (past transaction markers), if it has one.
    fn position(&self, reader: &Reader) -> Option<i64> {
        let pos = reader.position().ok()?;
        match pos.find_partition(&self.topics.hosts, self.p)?.offset() {
            Offset::Offset(o) => Some(o),
            _ => None,
        }
    }

    fn reader(&self) -> Result<Reader, Lost> {
        self.cfg
            .url
            .committed_reader(&group_id(&self.cfg.url.topic))
            .create_with_context(Quiet)
            .map_err(|e| self.lost(format!("creating a reader: {e}")))
    }

    /// Every host's last progress record in this partition (read_committed, to its end).
    fn read_progress(&self, reader: &Reader) -> Result<HashMap<String, HostProgress>, Lost> {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&self.topics.progress, self.p, Offset::Beginning)
            .map_err(|e| self.lost(e))?;
        reader.assign(&tpl).map_err(|e| self.lost(e))?;
        let mut out = HashMap::new();
        loop {
            self.check_stop()?;
            match tokio::task::block_in_place(|| reader.poll(Duration::from_millis(500))) {
                Some(Ok(m)) => {
                    let v: HostProgress = serde_json::from_slice(m.payload().unwrap_or_default())
                        .map_err(|e| {
                        self.lost(format!(
                            "a progress record at offset {} is not one: {e}",
                            m.offset()
                        ))
                    })?;
                    out.insert(v.host.clone(), v);
                }
                Some(Err(rdkafka::error::KafkaError::PartitionEOF(_))) => return Ok(out),
                Some(Err(e)) => {
                    tracing::warn!(partition = self.p, error = %e, "backfill worker: reading progress")
                }
                None => {}
            }
        }
    }

    /// The group's consumed offset of this partition (the next host), or its beginning.
    fn committed(&self, reader: &Reader) -> Result<Offset, Lost> {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(&self.topics.hosts, self.p);
        let got = tokio::task::block_in_place(|| reader.committed_offsets(tpl, COMMIT_TIMEOUT))
            .map_err(|e| self.lost(format!("reading the consumed offset: {e}")))?;
        Ok(match got.elements().first().map(|e| e.offset()) {
            Some(Offset::Offset(o)) => Offset::Offset(o),
            _ => Offset::Beginning,
        })
    }

    /// One host to its end: page by page, `window` accounts at once, each batch of finished
    /// repositories committed with the host's progress.
    async fn crawl_host(&mut self, prog: &mut HostProgress, offset: i64) -> Result<(), Lost> {
        let base = host_base(&prog.host);
        let window = self.cfg.window.max(1);
        tracing::info!(partition = self.p, host = prog.host.as_str(), cursor = ?prog.cursor,
            done_in_page = prog.done.len(), ok = prog.ok,
            "backfill worker: crawling a host (from its committed progress)");
        loop {
            self.check_stop()?;
            let url = page_url(
                &base,
                "com.atproto.sync.listRepos",
                PAGE,
                None,
                prog.cursor.as_deref(),
            );
            let page = match self.getter.list(&url).await {
                Ok(v) => discover::parse_repos(&v),
                Err(e) => Err(e),
            };
            let page = match page {
                Ok(p) => p,
                Err(e) => {
                    tracing::warn!(host = %prog.host, error = %e,
                        "backfill worker: listing failed: the host's remaining accounts are not crawled (in its progress record)");
                    prog.problem = Some(e.to_string());
                    prog.finished = true;
                    return self.commit(&Outcomes::default(), Some(prog), Some(offset + 1));
                }
            };
            for bad in &page.invalid {
                prog.invalid += 1;
                tracing::warn!(host = %prog.host, entry = %bad, "backfill worker: a listing entry is not a DID: skipped (counted as invalid)");
            }
            let done: HashSet<String> = prog.done.iter().cloned().collect();
            let next = page.cursor.clone();
            let empty = page.entries.is_empty() && page.invalid.is_empty();
            let mut todo = page
                .entries
                .into_iter()
                .filter(|e| !done.contains(&e.did))
                .collect::<Vec<Entry>>()
                .into_iter();
            let mut tasks = JoinSet::new();
            loop {
                while tasks.len() < window {
                    let Some(e) = todo.next() else { break };
                    let g = self.getter.clone();
                    tasks.spawn(async move { g.repo(&e).await });
                }
                let Some(first) = tasks.join_next().await else {
                    break;
                };
                let mut batch = Outcomes::default();
                let mut add =
                    |r: Result<Result<Verified, (Failure, u32)>, tokio::task::JoinError>| match r {
                        Ok(Ok(v)) => batch.ok.push(v),
                        Ok(Err(f)) => batch.failed.push(f),
                        Err(e) => {
                            tracing::error!(error = %e, "backfill worker: a repository task failed")
                        }
                    };
                add(first);
                while let Some(r) = tasks.try_join_next() {
                    add(r);
                }
                for v in &batch.ok {
                    prog.done.push(v.did.clone());
                }
                for (f, _) in &batch.failed {
                    prog.done.push(f.did.clone());
                    *prog.failed.entry(f.kind.reason().to_owned()).or_default() += 1;
                }
                self.commit(&batch, Some(prog), None)?;
            }
            // A cursor that does not move would loop forever: the listing ends there.
            let last = next.is_none() || empty || next == prog.cursor;
            prog.cursor = next;
            prog.done.clear();
            prog.problem = None;
            prog.finished = last;
            self.commit(&Outcomes::default(), Some(prog), last.then_some(offset + 1))?;
            if last {
                return Ok(());
            }
        }
    }

    /// One transaction: `out`'s records and failures, the host's progress, and the consumed
    /// offset when a host is finished; sent again until it commits, unless the partition was
    /// lost (fenced, or given to another worker).
    fn commit(
        &mut self,
        out: &Outcomes,
        prog: Option<&mut HostProgress>,
        consumed: Option<i64>,
    ) -> Result<(), Lost> {
        let mut prog = prog;
        let mut wait = Duration::from_millis(200);
        let mut counted = None;
        loop {
            self.check_stop()?;
            let attempt = tokio::task::block_in_place(|| {
                self.attempt(out, prog.as_deref_mut(), consumed, &mut counted)
            });
            let producer = self
                .producer
                .as_ref()
                .ok_or_else(|| self.lost("no producer"))?;
            match attempt {
                Ok(()) => {
                    self.counts.committed.fetch_add(1, Relaxed);
                    self.counts.ok.fetch_add(out.ok.len() as u64, Relaxed);
                    self.counts
                        .failed
                        .fetch_add(out.failed.len() as u64, Relaxed);
                    let (records, _) = counted.unwrap_or_default();
                    self.counts.records.fetch_add(records, Relaxed);
                    self.counts
                        .bytes
                        .fetch_add(out.ok.iter().map(|v| v.bytes).sum(), Relaxed);
                    if !out.failed.is_empty() {
                        let mut by = self
                            .counts
                            .failed_by_reason
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner);
                        for (f, _) in &out.failed {
                            *by.entry(f.kind.reason().to_owned()).or_default() += 1;
                        }
                    }
                    return Ok(());
                }
                Err(e) => {
                    self.counts.aborted.fetch_add(1, Relaxed);
                    let fatal =
                        matches!(&e, rdkafka::error::KafkaError::Transaction(t) if t.is_fatal());
                    if fatal {
                        return Err(self.lost(format!("fenced: {e}")));
                    }
                    tracing::warn!(partition = self.p, error = %e, retry_in = ?wait,
                        "backfill worker: transaction failed: aborting it and sending it again");
                    if let Err(a) =
                        tokio::task::block_in_place(|| producer.abort_transaction(COMMIT_TIMEOUT))
                    {
                        if matches!(&a, rdkafka::error::KafkaError::Transaction(t) if t.is_fatal())
                        {
                            return Err(self.lost(format!("fenced: {a}")));
                        }
                    }
                    std::thread::sleep(wait);
                    wait = (wait * 2).min(Duration::from_secs(10));
                }
            }
        }
    }

    /// One attempt of [`Partition::commit`]. `counted`: (records, dropped) of `out`, counted
    /// into the progress once (a retry sends the same progress again).
    fn attempt(
        &mut self,
        out: &Outcomes,
        prog: Option<&mut HostProgress>,
        consumed: Option<i64>,
        counted: &mut Option<(u64, u64)>,
    ) -> Result<(), rdkafka::error::KafkaError> {
        let Partition {
            producer,
            topics,
            cgm,
            p,
            ..
        } = self;
        let Some(producer) = producer.as_ref() else {
            return Err(rdkafka::error::KafkaError::Canceled);
        };
        producer.begin_transaction()?;
        let (mut records, mut dropped) = (0u64, 0u64);
        for v in &out.ok {
            // The repository as `crate::repo_record` chunks: its records' DAG-CBOR as signed and
            // its commit, what the ingest node lands (`crate::backfill_tail`).
            let Some((values, left_out)) = repo_record::encode(v, repo_record::CHUNK_BYTES) else {
                // Verified, so it has a commit block and a DID and rev of their syntax.
                tracing::error!(did = %v.did, "backfill worker: a verified repository has no commit block to publish: its records are counted as dropped");
                dropped += v.kept() as u64;
                continue;
            };
            records += v.kept() as u64 - left_out;
            dropped += left_out;
            for value in &values {
                crate::send(
                    producer,
                    BaseRecord::to(&topics.rows)
                        .key(v.did.as_bytes())
                        .payload(&value[..]),
                )?;
            }
        }
        let host = prog.as_ref().map(|pr| pr.host.clone()).unwrap_or_default();
        for (f, attempts) in &out.failed {
            let rec = FailedRepo {
                did: f.did.clone(),
                host: host.clone(),
                reason: f.kind.reason().to_owned(),
                detail: f.detail.clone(),
                attempts: *attempts,
            };
            let json = serde_json::to_vec(&rec).unwrap_or_default();
            crate::send(
                producer,
                BaseRecord::to(&topics.failed)
                    .key(f.did.as_bytes())
                    .payload(&json[..]),
            )?;
        }
        if let Some(prog) = prog {
            if counted.is_none() {
                prog.ok += out.ok.len() as u64;
                prog.records += records;
                prog.dropped += dropped;
                *counted = Some((records, dropped));
            }
            let json = serde_json::to_vec(&*prog).unwrap_or_default();
            crate::send(
                producer,
                BaseRecord::to(&topics.progress)
                    .partition(*p)
                    .key(prog.host.as_bytes())
                    .payload(&json[..]),
            )?;
        }
        if let Some(next) = consumed {
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition_offset(&topics.hosts, *p, Offset::Offset(next))?;
            let cgm = lock(cgm);
            let Some(cgm) = cgm.as_ref() else {
                return Err(rdkafka::error::KafkaError::Canceled);
            };
            producer.send_offsets_to_transaction(&tpl, cgm, COMMIT_TIMEOUT)?;
        }
        let deadline = Instant::now() + COMMIT_TIMEOUT;
        while producer.in_flight_count() > 0 && Instant::now() < deadline {
            producer.poll(Duration::from_millis(1));
        }
        producer.commit_transaction(COMMIT_TIMEOUT)
    }
}

/// A partition's low and high watermarks, asked again for up to 30 s while the cluster says it
/// is not ready (a topic just created: its leader is not known everywhere yet).
pub(crate) fn watermarks(
    url: &KafkaUrl,
    c: &Reader,
    topic: &str,
    p: i32,
) -> Result<(i64, i64), KafkaError> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match c.fetch_watermarks(topic, p, Duration::from_secs(10)) {
            Ok(w) => return Ok(w),
            Err(e) if Instant::now() < deadline => {
                tracing::debug!(topic, partition = p, error = %e, "watermarks: asking again");
                std::thread::sleep(Duration::from_millis(250));
            }
            Err(e) => return Err(url.client_err("reading a partition's end")(e)),
        }
    }
}

/// Whether the workers are done, as the ingest node's hold asks (`crate::backfill_tail`): a
/// worker's listing of the relay's hosts is complete on the work topic (`listed`: once seen,
/// not read again) and every host offered is finished. Hosts offered without a listing's end
/// (a worker killed mid-offer left none: its transaction is aborted) do not make it done: while
/// a listing is incomplete, the hosts offered so far could all be finished with more to come.
pub fn workers_done(url: &KafkaUrl, listed: &mut bool) -> Result<bool, KafkaError> {
    let topics = Topics::of(&url.topic);
    if !*listed {
        *listed = listing_complete(url)?;
        if !*listed {
            return Ok(false);
        }
        tracing::info!(topic = %topics.hosts, "backfill: a worker's listing of the relay's hosts is complete on the work topic");
    }
    all_done(url, &url.reader()?, &topics.hosts)
}

/// Whether every work partition's consumed offset has reached its end.
pub(crate) fn all_done(url: &KafkaUrl, c: &Reader, hosts: &str) -> Result<bool, KafkaError> {
    let md = c
        .fetch_metadata(Some(hosts), Duration::from_secs(10))
        .map_err(url.client_err("reading the work topic's metadata"))?;
    let parts: Vec<i32> = md
        .topics()
        .first()
        .map(|t| t.partitions().iter().map(|p| p.id()).collect())
        .unwrap_or_default();
    let group: Reader = url
        .config()
        .set("group.id", group_id(&url.topic))
        .set("isolation.level", "read_committed")
        .create_with_context(Quiet)
        .map_err(url.client_err("creating a reader"))?;
    let mut tpl = TopicPartitionList::new();
    for &p in &parts {
        tpl.add_partition(hosts, p);
    }
    let committed = group
        .committed_offsets(tpl, Duration::from_secs(10))
        .map_err(url.client_err("reading the consumed offsets"))?;
    for e in committed.elements() {
        let (_, high) = watermarks(url, c, hosts, e.partition())?;
        let at = match e.offset() {
            Offset::Offset(o) => o,
            _ => 0,
        };
        if at < high {
            return Ok(false);
        }
    }
    Ok(!parts.is_empty())
}

/// Creates the backfill topics if they are missing (the progress topic compacted), with the
/// events topic's partition count (`?partitions=N`).
pub async fn ensure_topics(url: &KafkaUrl, t: &Topics) -> Result<(), KafkaError> {
    let n = url.partitions;
    let probe = url.reader()?;
    let big = [("max.message.bytes", crate::MAX_RECORD_BYTES)];
    let compact = [("cleanup.policy", "compact")];
    url.create_topics(
        &probe,
        &[
            (&t.hosts, n, &[]),
            (&t.progress, n, &compact),
            (&t.rows, n, &big),
            (&t.failed, n, &[]),
        ],
    )
    .await?;
    // Creation is asynchronous: wait until every partition of each has a leader.
    let deadline = Instant::now() + Duration::from_secs(60);
    for topic in [&t.hosts, &t.progress, &t.rows, &t.failed] {
        loop {
            let ready = probe
                .fetch_metadata(Some(topic), Duration::from_secs(10))
                .ok()
                .and_then(|m| {
                    m.topics().first().filter(|t| t.error().is_none()).map(|t| {
                        !t.partitions().is_empty() && t.partitions().iter().all(|p| p.leader() >= 0)
                    })
                })
                .unwrap_or(false);
            if ready {
                break;
            }
            if Instant::now() > deadline {
                return Err(KafkaError::Timeout {
                    brokers: url.brokers.clone(),
                    what: "waiting for the backfill topics' leaders",
                });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    Ok(())
}

/// Lists the relay's hosts and adds to the work topic those it does not hold; (hosts listed,
/// hosts added).
async fn offer_hosts(
    cfg: &WorkerConfig,
    getter: &Getter,
    t: &Topics,
) -> Result<(usize, usize), KafkaError> {
    let url = &cfg.url;
    let relay = cfg.relay.trim_end_matches('/');
    let mut hosts = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let u = page_url(
            relay,
            "com.atproto.sync.listHosts",
            1000,
            None,
            cursor.as_deref(),
        );
        let v = getter
            .list(&u)
            .await
            .map_err(|e| KafkaError::Relay(e.to_string()))?;
        let (page, next) =
            discover::parse_hosts(&v).map_err(|e| KafkaError::Relay(e.to_string()))?;
        let empty = page.is_empty();
        for h in page {
            if h.status.as_deref() == Some("banned") {
                tracing::warn!(host = %h.hostname, accounts = ?h.account_count,
                    "backfill worker: the relay lists this host as banned: not crawled");
                continue;
            }
            hosts.push(h.hostname);
        }
        match next {
            Some(c) if !empty && Some(&c) != cursor.as_ref() => cursor = Some(c),
            _ => break,
        }
    }
    let mut wait = Duration::from_millis(200);
    for attempt in 1.. {
        match offer_once(url, t, &hosts) {
            Ok(added) => return Ok((hosts.len(), added)),
            Err(OfferError::Kafka(e)) if attempt < OFFER_ATTEMPTS => {
                tracing::warn!(brokers = %url.brokers, error = %e, retry_in = ?wait,
                    "backfill worker: offering the relay's hosts failed (nothing of it is committed): trying again");
                tokio::time::sleep(wait).await;
                wait *= 2;
            }
            Err(OfferError::Kafka(e)) => return Err(url.client_err("offering the hosts")(e)),
            Err(OfferError::Reading(e)) => return Err(e),
        }
    }
    unreachable!("the loop returns")
}

/// Why one attempt at offering failed.
enum OfferError {
    /// The transaction (retried).
    Kafka(rdkafka::error::KafkaError),
    /// Reading the hosts already offered.
    Reading(KafkaError),
}

/// One transaction: the listing's hosts the work topic does not hold yet, and the listing's end
/// ([`LISTED_KEY`]); how many hosts it added. Its transactional id is this attempt's own: a
/// worker killed mid-offer leaves an open transaction, which holds the work partitions'
/// read_committed readers back until the broker aborts it (`transaction.timeout.ms`, 10 s).
fn offer_once(url: &KafkaUrl, t: &Topics, hosts: &[String]) -> Result<usize, OfferError> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let producer: BaseProducer<Quiet> = url
        .config()
        .set(
            "transactional.id",
            format!(
                "riptide-backfill.{}.offer.{}.{nanos}",
                url.topic,
                std::process::id()
            ),
        )
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("transaction.timeout.ms", "10000")
        .set("message.timeout.ms", "9000")
        .create_with_context(Quiet)
        .map_err(OfferError::Kafka)?;
    producer
        .init_transactions(COMMIT_TIMEOUT)
        .map_err(OfferError::Kafka)?;
    let (known, _) = read_hosts(url, t).map_err(OfferError::Reading)?;
    producer.begin_transaction().map_err(OfferError::Kafka)?;
    let sent = (|| {
        let mut added = 0;
        for h in hosts.iter().filter(|h| !known.contains(*h)) {
            crate::send(
                &producer,
                BaseRecord::to(&t.hosts)
                    .key(h.as_bytes())
                    .payload(h.as_bytes()),
            )?;
            added += 1;
        }
        let listed = serde_json::to_vec(&Listed {
            hosts: hosts.len() as u64,
        })
        .unwrap_or_default();
        crate::send(
            &producer,
            BaseRecord::to(&t.hosts)
                .partition(0)
                .key(LISTED_KEY.as_bytes())
                .payload(&listed[..]),
        )?;
        let deadline = Instant::now() + COMMIT_TIMEOUT;
        while producer.in_flight_count() > 0 && Instant::now() < deadline {
            producer.poll(Duration::from_millis(1));
        }
        producer.commit_transaction(COMMIT_TIMEOUT)?;
        Ok(added)
    })();
    if sent.is_err() {
        let _ = producer.abort_transaction(COMMIT_TIMEOUT);
    }
    sent.map_err(OfferError::Kafka)
}

/// The hosts on the work topic (read_committed, to its end), and whether a listing's end is
/// among its records.
fn read_hosts(url: &KafkaUrl, t: &Topics) -> Result<(HashSet<String>, bool), KafkaError> {
    let mut keys = read_keys(url, &t.hosts, None)?;
    let listed = keys.remove(LISTED_KEY);
    Ok((keys, listed))
}

/// Whether a worker's listing of the relay's hosts is complete on the work topic (a committed
/// [`LISTED_KEY`] record in partition 0): every host of that listing is then offered, read
/// committed in the same transaction.
pub fn listing_complete(url: &KafkaUrl) -> Result<bool, KafkaError> {
    let t = Topics::of(&url.topic);
    Ok(read_keys(url, &t.hosts, Some(0))?.contains(LISTED_KEY))
}

/// The keys of every record of `topic` (of partition `only`, if given; read to its end).
fn read_keys(
    url: &KafkaUrl,
    topic: &str,
    only: Option<i32>,
) -> Result<HashSet<String>, KafkaError> {
    let mut keys = HashSet::new();
    read_all(url, topic, only, |m| {
        keys.insert(String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned());
        Ok(())
    })?;
    Ok(keys)
}

/// Every committed record of every partition of `topic` (or of partition `only`), to its end,
/// handed to `each`.
fn read_all(
    url: &KafkaUrl,
    topic: &str,
    only: Option<i32>,
    mut each: impl FnMut(&rdkafka::message::BorrowedMessage<'_>) -> Result<(), KafkaError>,
) -> Result<(), KafkaError> {
    let c = url.reader()?;
    let md = c
        .fetch_metadata(Some(topic), Duration::from_secs(30))
        .map_err(url.client_err("reading a backfill topic's metadata"))?;
    let mut tpl = TopicPartitionList::new();
    let mut left = 0;
    for p in md
        .topics()
        .first()
        .map(|t| t.partitions())
        .unwrap_or_default()
        .iter()
        .filter(|p| only.is_none_or(|o| o == p.id()))
    {
        let (low, high) = watermarks(url, &c, topic, p.id())?;
        if high > low {
            tpl.add_partition_offset(topic, p.id(), Offset::Beginning)
                .map_err(url.client_err("assigning a backfill topic"))?;
            left += 1;
        }
    }
    if left == 0 {
        return Ok(());
    }
    c.assign(&tpl)
        .map_err(url.client_err("assigning a backfill topic"))?;
    let deadline = Instant::now() + Duration::from_secs(300);
    while left > 0 {
        match c.poll(Duration::from_millis(500)) {
            Some(Ok(m)) => each(&m)?,
            Some(Err(rdkafka::error::KafkaError::PartitionEOF(_))) => left -= 1,
            Some(Err(e)) => tracing::warn!(topic, error = %e, "reading a backfill topic"),
            None => {}
        }
        if Instant::now() > deadline {
            return Err(KafkaError::Timeout {
                brokers: url.brokers.clone(),
                what: "reading a backfill topic to its end",
            });
        }
    }
    Ok(())
}

/// What the workers' committed progress says (`riptide backfill status --publish URL`): the
/// sums of every host's last progress record.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct BackfillStatus {
    /// Hosts on the work topic.
    pub hosts: u64,
    /// A worker's listing of the relay's hosts is on the work topic whole ([`LISTED_KEY`]);
    /// until then `hosts` may be some of them only.
    pub listing_complete: bool,
    /// Hosts finished.
    pub hosts_done: u64,
    /// Hosts not finished (not started, or in progress).
    pub hosts_left: u64,
    /// Hosts whose listing failed, with why.
    pub listing_problems: BTreeMap<String, String>,
    /// Repositories published.
    pub repos_ok: u64,
    /// Repositories failed, by reason (each on the failed topic).
    pub repos_failed: BTreeMap<String, u64>,
    /// Records published.
    pub records: u64,
    /// Records outside the atproto data model, not published.
    pub records_dropped: u64,
    /// Listing entries that were not DIDs.
    pub invalid_entries: u64,
}

/// Reads the work and progress topics of the backfill on `url`'s topic (read_committed).
pub fn status(url: &KafkaUrl) -> Result<BackfillStatus, KafkaError> {
    let t = Topics::of(&url.topic);
    let (hosts, listing_complete) = read_hosts(url, &t)?;
    let mut last: HashMap<String, HostProgress> = HashMap::new();
    read_all(url, &t.progress, None, |m| {
        let v: HostProgress =
            serde_json::from_slice(m.payload().unwrap_or_default()).map_err(|e| {
                KafkaError::Inconsistent(format!(
                    "{}: the record at partition {} offset {} is not a host's progress: {e}",
                    t.progress,
                    m.partition(),
                    m.offset()
                ))
            })?;
        last.insert(v.host.clone(), v);
        Ok(())
    })?;
    let mut s = BackfillStatus {
        hosts: hosts.len() as u64,
        listing_complete,
        ..BackfillStatus::default()
    };
    for p in last.values() {
        s.hosts_done += u64::from(p.finished);
        if let Some(why) = &p.problem {
            s.listing_problems.insert(p.host.clone(), why.clone());
        }
        s.repos_ok += p.ok;
        for (reason, n) in &p.failed {
            *s.repos_failed.entry(reason.clone()).or_default() += n;
        }
        s.records += p.records;
        s.records_dropped += p.dropped;
        s.invalid_entries += p.invalid;
    }
    s.hosts_left = s.hosts.saturating_sub(s.hosts_done);
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_derived_from_the_topic() {
        let t = Topics::of("net");
        assert_eq!(t.hosts, "net.backfill.hosts");
        assert_eq!(t.progress, "net.backfill.progress");
        assert_eq!(t.rows, "net.backfill");
        assert_eq!(t.failed, "net.backfill.failed");
        assert_eq!(transactional_id("net", 3), "riptide-backfill.net.3");
        assert_ne!(group_id("net"), group_id("net2"));
    }

    #[test]
    fn progress_records_round_trip_and_refuse_other_json() {
        let mut p = HostProgress {
            host: "pds1.example".into(),
            cursor: Some("c1".into()),
            done: vec!["did:plc:a".into()],
            ok: 1,
            records: 7,
            ..HostProgress::default()
        };
        p.failed.insert("bad_signature".into(), 2);
        let json = serde_json::to_vec(&p).unwrap();
        let back: HostProgress = serde_json::from_slice(&json).unwrap();
        assert_eq!(back, p);
        assert!(serde_json::from_slice::<HostProgress>(br#"{"hostname":"x"}"#).is_err());
    }
}
