//! Counters, gauges and histograms, rendered as Prometheus text at `/metrics`.
//!
//! Why hand-rolled: a few dozen atomics and one text renderer; the names are the contract.
//! Histograms ([`Histogram`]) are fixed-bucket and lock-free (one atomic add per bucket hit), so
//! observing every frame costs nothing measurable next to verifying it.

use std::fmt::Write;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicU8, Ordering::Relaxed};
use std::time::Duration;

use riptide_firehose::verify::Verdict;
use riptide_jetstream::DropReason;

/// Writes one unlabelled sample with its `# HELP` and `# TYPE` lines (the text exposition
/// format), for every family this crate exposes.
pub(crate) fn sample(
    s: &mut String,
    name: &str,
    kind: &str,
    help: &str,
    v: impl std::fmt::Display,
) {
    let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}");
}

/// The store's integrity counters (issue 40): damage found in sealed blocks, which every reader
/// skips (`store.rs`, "Checksums"), and acknowledged events a journal cut short lost at open
/// (`store.rs`, "Journal"). Kept by the store itself (it finds them, on any reader's path) and
/// written here, all in one place.
pub(crate) fn render_store_integrity(s: &mut String, st: riptide_store::store::IntegrityStats) {
    for (name, kind, help, v) in [
        (
            "riptide_store_corrupt_blocks_total",
            "counter",
            "Stored blocks found corrupt (checksum or format), each counted once; their events are skipped by every reader (`riptide store check`/`repair`).",
            st.corrupt_blocks,
        ),
        (
            "riptide_store_corrupt_events_total",
            "counter",
            "Seqs held by the stored blocks found corrupt: not served.",
            st.corrupt_events,
        ),
        (
            "riptide_store_journal_lost_events",
            "gauge",
            "Seqs acknowledged before the last start that the store no longer held when it opened (its journal was cut short or damaged).",
            st.journal_lost_events,
        ),
    ] {
        sample(s, name, kind, help, v);
    }
}

/// Folding's counters (issue 38, `riptide_store::folding`): the compaction thread's passes over
/// the sealed segments, and the tombstones the ingest batches write and the writer prunes. Kept
/// by the store (its thread and its writer do the work) and written here.
pub(crate) fn render_store_folding(s: &mut String, st: riptide_store::folding::FoldingStats) {
    for (name, kind, help, v) in [
        (
            "riptide_compaction_passes_total",
            "counter",
            "Compaction passes over the sealed segments that ended (with or without rows to fold).",
            st.passes,
        ),
        (
            "riptide_compaction_failures_total",
            "counter",
            "Compaction passes, recoveries at open and tombstone prunes that failed (each retried; the log says why).",
            st.failures,
        ),
        (
            "riptide_compaction_rows_dropped_total",
            "counter",
            "Rows folded out of sealed segments (superseded by a later update, delete, #sync or account deletion).",
            st.rows_dropped,
        ),
        (
            "riptide_compaction_segments_rewritten_total",
            "counter",
            "Sealed segment files rewritten by compaction (each a new generation, a new ETag).",
            st.segments_rewritten,
        ),
        (
            "riptide_compaction_seq",
            "gauge",
            "Every sealed row up to this seq is folded (meta.compaction_seq).",
            st.compaction_seq,
        ),
        (
            "riptide_store_tombstones",
            "gauge",
            "Tombstones held for the next compaction pass (approximate: fjall's count).",
            st.tombstones,
        ),
        (
            "riptide_store_tombstones_pruned_total",
            "counter",
            "Tombstones removed once a pass had folded every row below them.",
            st.tombstones_pruned,
        ),
        (
            "riptide_store_tombstone_errors_total",
            "counter",
            "Rows stored without the tombstone they may carry (an #account payload that does not decode): their account is not folded.",
            st.tombstone_errors,
        ),
    ] {
        sample(s, name, kind, help, v);
    }
}

const DROPS: [DropReason; 6] = [
    DropReason::InvalidDid,
    DropReason::InvalidRev,
    DropReason::InvalidCollection,
    DropReason::InvalidRkey,
    DropReason::MissingRecord,
    DropReason::BadRecord,
];

/// Why a subscriber was dropped as too slow (the `reason` label of
/// `riptide_slow_consumer_drops_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlowDrop {
    /// One write blocked longer than the write timeout.
    WriteTimeout,
    /// A ping went unanswered.
    PongTimeout,
    /// Far behind the tip and barely moving (Jetstream v2's rule, `slow.rs`).
    Behind,
}

impl SlowDrop {
    /// Every reason, in counting order.
    pub const ALL: [SlowDrop; 3] = [
        SlowDrop::WriteTimeout,
        SlowDrop::PongTimeout,
        SlowDrop::Behind,
    ];

    /// `write-timeout`, `pong-timeout` or `behind`.
    pub fn as_str(self) -> &'static str {
        match self {
            SlowDrop::WriteTimeout => "write-timeout",
            SlowDrop::PongTimeout => "pong-timeout",
            SlowDrop::Behind => "behind",
        }
    }
}

/// Why a resync attempt failed (the `reason` label of `riptide_resync_failed_total`; each is
/// also a `resync-failed` verdict). Counted per attempt, so an operator sees what keeps an
/// account from recovering, not just that it does not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResyncFailure {
    /// No source gave a repository that verifies (or the DID document could not be had).
    Sources,
    /// A source's repository verified but was older than a commit already seen (a stale
    /// mirror): counted per such answer, even when a later source had a good one.
    Stale,
    /// The resync task died (a panic, caught at the task's boundary); the account is retried.
    Panicked,
}

impl ResyncFailure {
    /// Every reason, in counting order.
    pub const ALL: [ResyncFailure; 3] = [
        ResyncFailure::Sources,
        ResyncFailure::Stale,
        ResyncFailure::Panicked,
    ];

    /// `sources`, `stale` or `panicked`.
    pub fn as_str(self) -> &'static str {
        match self {
            ResyncFailure::Sources => "sources",
            ResyncFailure::Stale => "stale",
            ResyncFailure::Panicked => "panicked",
        }
    }
}

/// Upper bounds of the latency buckets, in seconds (`le` labels): 50 µs to 10 s.
pub const LATENCY_BOUNDS: [f64; 17] = [
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0,
];

/// A Prometheus histogram of durations over [`LATENCY_BOUNDS`].
#[derive(Debug, Default)]
pub struct Histogram {
    /// Observations per bucket (not cumulative); the last is above every bound.
    buckets: [AtomicU64; LATENCY_BOUNDS.len() + 1],
    sum_ns: AtomicU64,
}

impl Histogram {
    /// Records one duration.
    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        let i = LATENCY_BOUNDS
            .iter()
            .position(|&b| secs <= b)
            .unwrap_or(LATENCY_BOUNDS.len());
        self.buckets[i].fetch_add(1, Relaxed);
        self.sum_ns
            .fetch_add(d.as_nanos().min(u64::MAX as u128) as u64, Relaxed);
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.buckets.iter().map(|b| b.load(Relaxed)).sum()
    }

    /// Observations at or below `LATENCY_BOUNDS[i]` (cumulative, as exposed).
    pub fn cumulative(&self, i: usize) -> u64 {
        self.buckets[..=i.min(LATENCY_BOUNDS.len())]
            .iter()
            .map(|b| b.load(Relaxed))
            .sum()
    }

    /// Sum of the observations, in seconds.
    pub fn sum_seconds(&self) -> f64 {
        self.sum_ns.load(Relaxed) as f64 / 1e9
    }

    fn render(&self, s: &mut String, name: &str, help: &str) {
        let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut total = 0;
        for (i, b) in LATENCY_BOUNDS.iter().enumerate() {
            total += self.buckets[i].load(Relaxed);
            let _ = writeln!(s, "{name}_bucket{{le=\"{b}\"}} {total}");
        }
        total += self.buckets[LATENCY_BOUNDS.len()].load(Relaxed);
        let _ = writeln!(s, "{name}_bucket{{le=\"+Inf\"}} {total}");
        let _ = writeln!(s, "{name}_sum {}", self.sum_seconds());
        let _ = writeln!(s, "{name}_count {total}");
    }
}

/// What a server is in a Kafka scale-out (`docs/kafka.md`): [`KafkaMetrics::role`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum KafkaRole {
    /// A single node: no Kafka metrics are rendered.
    None = 0,
    /// `serve --publish kafka://…`.
    Ingest = 1,
    /// `serve --from kafka://…`.
    Edge = 2,
}

/// The Kafka scale-out's metrics (crate riptide-kafka writes them; this crate only renders
/// them, as `riptide_kafka_*`, on a server whose [`KafkaMetrics::role`] is set).
#[derive(Debug, Default)]
pub struct KafkaMetrics {
    role: AtomicU8,
    /// Ingest node: 1 while this node holds the ingest lease (it publishes).
    pub lease_held: AtomicBool,
    /// Ingest node: Kafka transactions committed (one per ingest batch).
    pub transactions_committed: AtomicU64,
    /// Ingest node: transaction attempts that failed and were aborted (each is retried).
    pub transactions_aborted: AtomicU64,
    /// Ingest node: publish errors that stopped ingest (fenced, or a fatal producer error).
    pub publish_fatal: AtomicU64,
    /// Ingest node: event records committed to the events topic.
    pub records_published: AtomicU64,
    /// Ingest node: resync changes (queue marks, held frames, releases) committed on the batch
    /// topic.
    pub resync_changes_published: AtomicU64,
    /// Ingest node: the last seq committed to the topic (0 before the first; at a start or
    /// takeover, the topic's last committed seq once the store has caught up with it).
    pub published_seq: AtomicU64,
    /// Ingest node: when the batch being published now was first tried (unix µs; 0 while no
    /// publish is under way). A publish that has not committed for long (brokers down, too few
    /// in sync) holds ingest back: `/readyz` says so ([`KafkaMetrics::publish_stalled_us`]).
    pub publishing_since_us: AtomicI64,
    /// Ingest node: batches of the topic applied to the local store at start (catch-up).
    pub caught_up_batches: AtomicU64,
    /// Edge: set once the topic is followed and every partition was read to its end (clear
    /// while the cluster cannot be read at start, and while catching up: `/readyz` says so).
    pub following: AtomicBool,
    /// Edge: event records read from the topic.
    pub records_consumed: AtomicU64,
    /// Edge: records read again that the store already had (skipped).
    pub records_skipped: AtomicU64,
    /// Edge: records held because they arrived before the next seq, now.
    pub pending_records: AtomicU64,
    /// Edge: bytes of those records, now.
    pub pending_bytes: AtomicU64,
    /// Edge: partitions paused for running ahead of the next seq, now.
    pub partitions_paused: AtomicU64,
    /// Edge: times a partition was paused.
    pub pauses: AtomicU64,
    /// Edge: records of the topic not yet read (high watermarks minus positions, sampled).
    pub lag_records: AtomicU64,
    /// Edge: gaps (seqs missing from the topic, skipped).
    pub gaps: AtomicU64,
    /// Edge: seqs skipped across those gaps.
    pub gap_seqs: AtomicU64,
    /// Ingest node: time of one Kafka transaction (begin to committed).
    pub commit_seconds: Histogram,
    /// Ingest node with `--backfill-from`: records of the workers' `TOPIC.backfill` read.
    pub backfill_records_consumed: AtomicU64,
    /// Ingest node with `--backfill-from`: repositories of it handed to ingest (each lands,
    /// is superseded, or had landed before a restart).
    pub backfill_repos: AtomicU64,
    /// Ingest node with `--backfill-from`: records of it skipped as damaged, of another
    /// format, or a repository's chunks that never completed.
    pub backfill_bad_records: AtomicU64,
    /// Ingest node with `--backfill-from`: set once the workers are done and everything they
    /// published has landed (the frames held for the backfill are then released).
    pub backfill_done: AtomicBool,
}

impl KafkaMetrics {
    /// How long the publish under way has been trying, at `now_us` (0: none is).
    pub fn publish_stalled_us(&self, now_us: i64) -> i64 {
        match self.publishing_since_us.load(Relaxed) {
            0 => 0,
            t => (now_us - t).max(0),
        }
    }

    /// Sets what this server is.
    pub fn set_role(&self, role: KafkaRole) {
        self.role.store(role as u8, Relaxed);
    }

    /// What this server is.
    pub fn role(&self) -> KafkaRole {
        match self.role.load(Relaxed) {
            1 => KafkaRole::Ingest,
            2 => KafkaRole::Edge,
            _ => KafkaRole::None,
        }
    }

    fn render(&self, s: &mut String) {
        let role = self.role();
        let c = |a: &AtomicU64| a.load(Relaxed).to_string();
        let ingest = [
            (
                "riptide_kafka_lease_held",
                "gauge",
                "Ingest node: 1 while it holds the ingest lease and publishes.",
                (self.lease_held.load(Relaxed) as u8).to_string(),
            ),
            (
                "riptide_kafka_transactions_committed_total",
                "counter",
                "Ingest node: Kafka transactions committed (one per ingest batch).",
                c(&self.transactions_committed),
            ),
            (
                "riptide_kafka_transactions_aborted_total",
                "counter",
                "Ingest node: Kafka transaction attempts that failed, aborted and retried.",
                c(&self.transactions_aborted),
            ),
            (
                "riptide_kafka_publish_fatal_total",
                "counter",
                "Ingest node: publish errors that stopped ingest (fenced by another ingest node, or a fatal producer error).",
                c(&self.publish_fatal),
            ),
            (
                "riptide_kafka_records_published_total",
                "counter",
                "Ingest node: event records committed to the events topic.",
                c(&self.records_published),
            ),
            (
                "riptide_kafka_resync_changes_published_total",
                "counter",
                "Ingest node: resync queue marks, held frames and releases committed on the batch topic.",
                c(&self.resync_changes_published),
            ),
            (
                "riptide_kafka_published_seq",
                "gauge",
                "Ingest node: the last seq committed to the topic.",
                c(&self.published_seq),
            ),
            (
                "riptide_kafka_publish_pending_seconds",
                "gauge",
                "Ingest node: how long the batch being published has been trying to commit (0: none is); ingest waits meanwhile.",
                format!("{:.3}", self.publish_stalled_us(crate::now_us()) as f64 / 1e6),
            ),
            (
                "riptide_kafka_caught_up_batches_total",
                "counter",
                "Ingest node: batches of the topic applied to the local store at start (after a crash, or taking over as standby).",
                c(&self.caught_up_batches),
            ),
            (
                "riptide_kafka_backfill_records_consumed_total",
                "counter",
                "Ingest node (--backfill-from): records of the backfill workers' TOPIC.backfill read.",
                c(&self.backfill_records_consumed),
            ),
            (
                "riptide_kafka_backfill_repos_total",
                "counter",
                "Ingest node (--backfill-from): backfilled repositories handed to ingest.",
                c(&self.backfill_repos),
            ),
            (
                "riptide_kafka_backfill_done",
                "gauge",
                "Ingest node (--backfill-from): 1 once the workers are done and every repository they published has landed.",
                (self.backfill_done.load(Relaxed) as u8).to_string(),
            ),
            (
                "riptide_kafka_backfill_bad_records_total",
                "counter",
                "Ingest node (--backfill-from): records of TOPIC.backfill skipped (damaged, another format, a repository whose chunks never completed).",
                c(&self.backfill_bad_records),
            ),
        ];
        let edge = [
            (
                "riptide_kafka_following",
                "gauge",
                "Edge: 1 once the topic is followed and read to its end; 0 while the cluster cannot be read at start, or the edge is catching up.",
                (self.following.load(Relaxed) as u8).to_string(),
            ),
            (
                "riptide_kafka_records_consumed_total",
                "counter",
                "Edge: event records read from the topic.",
                c(&self.records_consumed),
            ),
            (
                "riptide_kafka_records_skipped_total",
                "counter",
                "Edge: records read that the store already had (after a restart), skipped.",
                c(&self.records_skipped),
            ),
            (
                "riptide_kafka_pending_records",
                "gauge",
                "Edge: records held in memory because they arrived before the next seq.",
                c(&self.pending_records),
            ),
            (
                "riptide_kafka_pending_bytes",
                "gauge",
                "Edge: bytes of the records held before the next seq.",
                c(&self.pending_bytes),
            ),
            (
                "riptide_kafka_partitions_paused",
                "gauge",
                "Edge: partitions paused for running ahead of the next seq (memory bound).",
                c(&self.partitions_paused),
            ),
            (
                "riptide_kafka_partition_pauses_total",
                "counter",
                "Edge: times a partition was paused for running ahead.",
                c(&self.pauses),
            ),
            (
                "riptide_kafka_lag_records",
                "gauge",
                "Edge: committed records of the topic not yet read (high watermarks minus positions, sampled).",
                c(&self.lag_records),
            ),
            (
                "riptide_kafka_gaps_total",
                "counter",
                "Edge: gaps, seqs missing from the topic (removed by its retention) and skipped.",
                c(&self.gaps),
            ),
            (
                "riptide_kafka_gap_seqs_total",
                "counter",
                "Edge: seqs skipped across gaps.",
                c(&self.gap_seqs),
            ),
        ];
        let family: &[(&str, &str, &str, String)] = match role {
            KafkaRole::None => return,
            KafkaRole::Ingest => &ingest,
            KafkaRole::Edge => &edge,
        };
        for (name, kind, help, v) in family {
            sample(s, name, kind, help, v);
        }
        if role == KafkaRole::Ingest {
            self.commit_seconds.render(
                s,
                "riptide_kafka_commit_seconds",
                "Ingest node: time of one Kafka transaction, begin to committed.",
            );
        }
    }
}

/// Every metric of the server.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Upstream frames received.
    pub frames_in: AtomicU64,
    /// Upstream frames skipped because the store already covers their seq.
    pub frames_duplicate: AtomicU64,
    verdicts: [AtomicU64; Verdict::COUNT],
    drops: [AtomicU64; 6],
    /// Events stored (and published).
    pub events_stored: AtomicU64,
    /// Events sent to subscribers.
    pub events_out: AtomicU64,
    /// Bytes of events sent to subscribers (WebSocket payloads).
    pub bytes_out: AtomicU64,
    /// Events not sent because of a subscriber's filter.
    pub events_filtered: AtomicU64,
    /// Events not sent because they exceed `maxMessageSizeBytes`.
    pub events_oversize: AtomicU64,
    /// Replacement rows' records (`create-resync`) not sent on v1 `/subscribe`, which never
    /// sends them (protocol §4.1), one per subscriber and record:
    /// `riptide_v1_events_skipped_total{reason="resync_replacement"}`.
    pub v1_skipped_replacement: AtomicU64,
    /// `riptide_v1_events_skipped_total{reason="sync"}`.
    pub v1_skipped_sync: AtomicU64,
    /// Events not sent: their stored JSON is not UTF-8 (or, on `subscribeEvents`, lacks the v1
    /// prefix a frame is made from). Never expected: what ingest writes always is.
    pub events_unsendable: AtomicU64,
    /// Reads a subscriber served from the store (replay or fallen behind the tail).
    pub replay_reads: AtomicU64,
    /// Reads served from the in-memory tail.
    pub tail_reads: AtomicU64,
    /// Connected subscribers.
    pub subscribers: AtomicI64,
    /// Subscribers dropped for being slow, by [`SlowDrop`] reason.
    slow_drops: [AtomicU64; 3],
    /// Subscriber connections closed by the server for a bad client message.
    pub client_errors: AtomicU64,
    /// Last upstream seq stored.
    pub upstream_seq: AtomicU64,
    /// Unix microseconds of the last upstream frame received.
    pub upstream_last_us: AtomicI64,
    /// Wall-clock microseconds between receiving a frame and storing its events (last batch).
    pub ingest_lag_us: AtomicI64,
    /// Stored events expired by retention (now below the floor).
    pub retention_deleted: AtomicU64,
    /// The retention floor: the oldest seq served.
    pub retention_floor: AtomicU64,
    /// Segment files the store sealed since start (`--segment-bytes`).
    pub segments_sealed: AtomicU64,
    /// Seals that failed (logged; tried again).
    pub seal_failures: AtomicU64,
    /// Bytes of the store's segment files and journals (updated by each retention pass).
    pub store_bytes: AtomicU64,
    /// Segment files of the store's log partitions (updated by each retention pass).
    pub store_segments: AtomicU64,
    /// The upstream cursor the upstream source started from (0: live).
    pub upstream_start_cursor: AtomicU64,
    /// Upstream connections made.
    pub upstream_connects: AtomicU64,
    /// Upstream connection attempts that failed.
    pub upstream_connect_failures: AtomicU64,
    /// Upstream `#info` frames (e.g. `OutdatedCursor`).
    pub upstream_info: AtomicU64,
    /// `#info OutdatedCursor` notices: gaps in what the relay sent us (see `upstream.rs`).
    pub upstream_gaps: AtomicU64,
    /// Upstream seqs skipped across those gaps.
    pub upstream_gap_seqs: AtomicU64,
    /// Upstream error frames (e.g. `FutureCursor`, `ConsumerTooSlow`).
    pub upstream_errors: AtomicU64,
    /// Upstream frames without a seq that are not garbage otherwise (of an unknown type, or
    /// decoding): not ingested. Garbage without a seq is a verdict (`upstream.rs`, "Garbage").
    pub upstream_unsequenced: AtomicU64,
    /// The upstream client's own counters (connections, failures, oversized and text messages),
    /// read live when `/metrics` is rendered: they move on every attempt, even while no frame
    /// ever arrives.
    pub upstream_client: std::sync::OnceLock<std::sync::Arc<riptide_client::ClientStats>>,
    /// Unix microseconds when the upstream source started (idle time counts from it until the
    /// first frame).
    pub upstream_started_us: AtomicI64,
    /// Times the relay's seqs went backwards within one connection (a relay reset, or a forged
    /// seq before): the cursor followed the relay's numbering (see `upstream.rs`).
    pub upstream_seq_resets: AtomicU64,
    /// `FutureCursor` error frames: the relay is behind our stored cursor.
    pub upstream_future_cursor: AtomicU64,
    /// Times our upstream cursor was found unreachable and ingest resumed below it
    /// (`upstream.rs`, "A cursor no later frame can pass"), by reason: `future-cursor`,
    /// `live-below-cursor`.
    pub upstream_cursor_recoveries: [AtomicU64; 2],
    /// Upstream frames that came again with the same seq and bytes (a relay's replay,
    /// `upstream.rs`): skipped as duplicates, never taken for a relay reset.
    pub upstream_replayed: AtomicU64,
    /// Set while the last word from the relay was `FutureCursor` (cleared by the next frame).
    pub upstream_behind: std::sync::atomic::AtomicBool,
    /// Unix microseconds of the `time` of the latest upstream event ingested (the relay's
    /// clock; Jetstream's `last_seen_upstream_event_timestamp`).
    pub upstream_event_time_us: AtomicI64,
    /// Frames waiting between the upstream source and ingest (sampled by the source).
    pub ingest_queue: AtomicI64,
    /// Set while ingest is paused because the store cannot be written (full or read-only disk).
    pub ingest_paused: std::sync::atomic::AtomicBool,
    /// Set once an ingest thread has failed for good (a panic, or an error that stops ingest):
    /// `/healthz` and `/readyz` answer 503 from then on, and `riptide serve` exits
    /// (`crate::ingest`, "When a thread fails").
    pub ingest_failed: std::sync::atomic::AtomicBool,
    /// Store writes that failed (each pauses ingest until a retry succeeds).
    pub store_write_failures: AtomicU64,
    /// Store reads that failed for a replaying subscriber (each closed with 1011).
    pub store_read_failures: AtomicU64,
    /// Connections refused before reaching HTTP, by reason (see `limits.rs`).
    pub connections_refused: [AtomicU64; 2],
    /// Open client connections (HTTP or WebSocket).
    pub connections: AtomicI64,
    /// Connections closed because their request headers did not arrive in time.
    pub header_timeouts: AtomicU64,
    /// DID lookups retried after a transient failure.
    pub key_lookup_retries: AtomicU64,
    /// DID lookups given up (no document, unusable, or retries exhausted).
    pub key_lookup_failures: AtomicU64,
    /// Accounts queued for resync after a chain break (`crate::resync`).
    pub resync_queued: AtomicU64,
    /// Resyncs that landed: a verified repository became the account's state.
    pub resync_landed: AtomicU64,
    /// Resyncs that landed too late to matter (a `#sync` had resynchronized the account) or
    /// whose repository was older than a commit already seen (then queued again).
    pub resync_stale: AtomicU64,
    /// Resyncs being fetched or verified now.
    pub resync_in_flight: AtomicU64,
    /// Frames held for accounts awaiting resync, now.
    pub resync_held: AtomicU64,
    /// Accounts with frames held (for a resync or `serve --backfill`), now.
    pub resync_held_accounts: AtomicU64,
    /// Accounts awaiting resync, now.
    pub resync_accounts: AtomicU64,
    /// Bytes of repositories fetched and verified by resyncs.
    pub resync_bytes: AtomicU64,
    /// Records in repositories fetched and verified by resyncs.
    pub resync_records: AtomicU64,
    /// Repositories that landed over their account's earlier rows (`crate::replace`).
    pub replaced_repositories: AtomicU64,
    /// Replacement rows emitted: one `create-resync` per record (the `#sync`s are
    /// [`Metrics::replaced_repositories`]).
    pub replacement_rows: AtomicU64,
    /// Records of replacing repositories not emitted (CID mismatch, outside v1's data model).
    pub replacement_dropped: AtomicU64,
    /// Failed resync attempts, by [`ResyncFailure`] reason ([`Metrics::resync_failed`]).
    resync_failures: [AtomicU64; 3],
    /// Per frame: verifying it (a worker's time from starting the check to its verdict).
    pub verify_seconds: Histogram,
    /// Per frame: from receiving it to its events being durable and published to subscribers
    /// (queueing, verification, rendering, the durable store batch).
    pub publish_seconds: Histogram,
    /// Per ingest batch: the durable store write (journal fsync included).
    pub store_append_seconds: Histogram,
    /// The Kafka scale-out's (rendered on an ingest node or an edge only).
    pub kafka: KafkaMetrics,
    /// `serve --backfill`'s (rendered only with it: `crate::backfill`).
    pub backfill: crate::backfill::BackfillMetrics,
}

impl Metrics {
    /// Counts one verdict.
    pub fn verdict(&self, v: Verdict) {
        let i = Verdict::ALL.iter().position(|&x| x == v).unwrap_or(0);
        self.verdicts[i].fetch_add(1, Relaxed);
    }

    /// Frames with verdict `v` so far.
    pub fn verdict_count(&self, v: Verdict) -> u64 {
        let i = Verdict::ALL.iter().position(|&x| x == v).unwrap_or(0);
        self.verdicts[i].load(Relaxed)
    }

    /// Counts one failed resync attempt: a `resync-failed` verdict, and its reason.
    pub fn resync_failed(&self, why: ResyncFailure) {
        self.verdict(Verdict::ResyncFailed);
        self.resync_failures[why as usize].fetch_add(1, Relaxed);
    }

    /// Counts a repository that replaced its account's earlier rows, once they are durable.
    pub fn replaced(&self, r: crate::replace::Replaced) {
        self.replaced_repositories.fetch_add(r.sync as u64, Relaxed);
        self.replacement_rows.fetch_add(r.records, Relaxed);
        self.replacement_dropped.fetch_add(r.dropped, Relaxed);
    }

    /// Failed resync attempts for `why` so far.
    pub fn resync_failure_count(&self, why: ResyncFailure) -> u64 {
        self.resync_failures[why as usize].load(Relaxed)
    }

    /// Counts one subscriber dropped as too slow.
    pub fn slow_drop(&self, why: SlowDrop) {
        self.slow_drops[why as usize].fetch_add(1, Relaxed);
    }

    /// Subscribers dropped as too slow for `why` so far.
    pub fn slow_drop_count(&self, why: SlowDrop) -> u64 {
        self.slow_drops[why as usize].load(Relaxed)
    }

    /// Ops dropped so far, all reasons.
    pub fn ops_dropped(&self) -> u64 {
        self.drops.iter().map(|d| d.load(Relaxed)).sum()
    }

    /// Counts one dropped op.
    pub fn drop_op(&self, r: DropReason) {
        let i = DROPS.iter().position(|&x| x == r).unwrap_or(0);
        self.drops[i].fetch_add(1, Relaxed);
    }

    /// Prometheus text exposition. `extra` gauges (name, help, value) are appended.
    pub fn render(&self, extra: &[(&str, &str, f64)]) -> String {
        let mut s = String::with_capacity(4096);
        // Labelled families written while `one` holds `s`; appended after it.
        let mut lab = String::new();
        let mut one = |name: &str, kind: &str, help: &str, v: String| {
            sample(&mut s, name, kind, help, v);
        };
        let c = |a: &AtomicU64| a.load(Relaxed).to_string();
        one(
            "riptide_upstream_frames_total",
            "counter",
            "Upstream frames received.",
            c(&self.frames_in),
        );
        one(
            "riptide_upstream_frames_duplicate_total",
            "counter",
            "Upstream frames at or below the stored cursor, skipped.",
            c(&self.frames_duplicate),
        );
        one(
            "riptide_upstream_seq",
            "gauge",
            "Last upstream seq stored.",
            c(&self.upstream_seq),
        );
        let now = crate::now_us();
        let last = self
            .upstream_last_us
            .load(Relaxed)
            .max(self.upstream_started_us.load(Relaxed));
        let lag = if last > 0 {
            (now - last) as f64 / 1e6
        } else {
            0.0
        };
        one(
            "riptide_upstream_idle_seconds",
            "gauge",
            "Seconds since the last upstream frame.",
            format!("{lag}"),
        );
        let t = self.upstream_event_time_us.load(Relaxed);
        one(
            "riptide_upstream_event_time_seconds",
            "gauge",
            "Unix time (the relay's `time` field) of the newest upstream event ingested; 0 before the first.",
            format!("{}", t as f64 / 1e6),
        );
        one(
            "riptide_upstream_event_age_seconds",
            "gauge",
            "Now minus the time of the newest upstream event ingested: how far behind the network the verified stream is (0 before the first).",
            format!("{}", if t > 0 { (now - t).max(0) as f64 / 1e6 } else { 0.0 }),
        );
        one(
            "riptide_ingest_queue_frames",
            "gauge",
            "Upstream frames received and waiting for ingest (the upstream backlog inside the server).",
            self.ingest_queue.load(Relaxed).to_string(),
        );
        one(
            "riptide_ingest_paused",
            "gauge",
            "1 while ingest is paused because the store cannot be written (full or read-only disk).",
            (self.ingest_paused.load(Relaxed) as u8).to_string(),
        );
        one(
            "riptide_ingest_failed",
            "gauge",
            "1 once an ingest thread has failed for good (a panic or a fatal error): the server stops ingesting and exits; /healthz answers 503.",
            (self.ingest_failed.load(Relaxed) as u8).to_string(),
        );
        one(
            "riptide_store_read_failures_total",
            "counter",
            "Store reads that failed for a replaying subscriber (the subscriber is closed with 1011).",
            c(&self.store_read_failures),
        );
        one(
            "riptide_store_write_failures_total",
            "counter",
            "Store writes that failed (ingest pauses and retries).",
            c(&self.store_write_failures),
        );
        one(
            "riptide_connections",
            "gauge",
            "Open client connections (HTTP and WebSocket).",
            self.connections.load(Relaxed).to_string(),
        );
        one(
            "riptide_header_timeouts_total",
            "counter",
            "Connections closed because a request's headers were not complete in time (slowloris, or an idle keep-alive connection).",
            c(&self.header_timeouts),
        );
        one(
            "riptide_ingest_lag_seconds",
            "gauge",
            "Receive-to-durable delay of the last ingest batch.",
            format!("{}", self.ingest_lag_us.load(Relaxed) as f64 / 1e6),
        );
        one(
            "riptide_events_stored_total",
            "counter",
            "Events stored and published.",
            c(&self.events_stored),
        );
        one(
            "riptide_events_out_total",
            "counter",
            "Events sent to subscribers.",
            c(&self.events_out),
        );
        one(
            "riptide_bytes_out_total",
            "counter",
            "Event bytes sent to subscribers.",
            c(&self.bytes_out),
        );
        one(
            "riptide_events_filtered_total",
            "counter",
            "Events not sent: filtered out.",
            c(&self.events_filtered),
        );
        one(
            "riptide_events_oversize_total",
            "counter",
            "Events not sent: over maxMessageSizeBytes.",
            c(&self.events_oversize),
        );
        let _ = writeln!(lab, "# HELP riptide_v1_events_skipped_total Events /subscribe (v1) never sends, one per subscriber and event, by reason (resync_replacement: a replacement row's record; sync: a #sync event; both sent on subscribeEvents only).\n# TYPE riptide_v1_events_skipped_total counter");
        let _ = writeln!(
            lab,
            "riptide_v1_events_skipped_total{{reason=\"resync_replacement\"}} {}",
            self.v1_skipped_replacement.load(Relaxed)
        );
        let _ = writeln!(
            lab,
            "riptide_v1_events_skipped_total{{reason=\"sync\"}} {}",
            self.v1_skipped_sync.load(Relaxed)
        );
        one(
            "riptide_events_unsendable_total",
            "counter",
            "Events not sent: their stored JSON is not UTF-8 or not in the stored shape (never expected; logged).",
            c(&self.events_unsendable),
        );
        one(
            "riptide_replay_reads_total",
            "counter",
            "Subscriber reads served from the store.",
            c(&self.replay_reads),
        );
        one(
            "riptide_tail_reads_total",
            "counter",
            "Subscriber reads served from memory.",
            c(&self.tail_reads),
        );
        one(
            "riptide_subscribers",
            "gauge",
            "Connected subscribers.",
            self.subscribers.load(Relaxed).to_string(),
        );
        one(
            "riptide_client_errors_total",
            "counter",
            "Subscribers closed for a bad message.",
            c(&self.client_errors),
        );
        one(
            "riptide_retention_deleted_total",
            "counter",
            "Events expired by retention (below the floor; their disk space is reclaimed a segment file at a time).",
            c(&self.retention_deleted),
        );
        one(
            "riptide_segments_sealed_total",
            "counter",
            "Segment files the store sealed from its row blocks since start (--segment-bytes).",
            c(&self.segments_sealed),
        );
        one(
            "riptide_seal_failures_total",
            "counter",
            "Seals of a segment that failed (logged; nothing removed from the store; tried again).",
            c(&self.seal_failures),
        );
        for (name, help, v) in [
            (
                "riptide_retention_floor",
                "The oldest seq served (retention floor).",
                &self.retention_floor,
            ),
            (
                "riptide_store_bytes",
                "Bytes of the store's segment files and journals (at the last retention pass).",
                &self.store_bytes,
            ),
            (
                "riptide_store_segments",
                "Segment files of the store's log partitions (at the last retention pass).",
                &self.store_segments,
            ),
        ] {
            one(name, "gauge", help, c(v));
        }
        let client = self.upstream_client.get().map(|c| c.snapshot());
        if let Some(cs) = &client {
            self.upstream_connects.store(cs.connects, Relaxed);
            self.upstream_connect_failures
                .store(cs.connect_failures, Relaxed);
        }
        one(
            "riptide_upstream_connected",
            "gauge",
            "1 while a connection to the upstream relay is up.",
            (client.is_some_and(|c| c.connected) as u8).to_string(),
        );
        let _ = writeln!(lab, "# HELP riptide_upstream_dropped_total Upstream messages dropped before ingest, by reason.\n# TYPE riptide_upstream_dropped_total counter");
        for (reason, n) in [
            ("oversized", client.map_or(0, |c| c.oversized)),
            ("text", client.map_or(0, |c| c.text_messages)),
        ] {
            let _ = writeln!(
                lab,
                "riptide_upstream_dropped_total{{reason=\"{reason}\"}} {n}"
            );
        }
        let _ = writeln!(lab, "# HELP riptide_upstream_cursor_recoveries_total Times the upstream cursor was found unreachable (a forged seq, a relay that lost its history) and ingest resumed below it, by reason.\n# TYPE riptide_upstream_cursor_recoveries_total counter");
        for (i, reason) in ["future-cursor", "live-below-cursor"].iter().enumerate() {
            let _ = writeln!(
                lab,
                "riptide_upstream_cursor_recoveries_total{{reason=\"{reason}\"}} {}",
                self.upstream_cursor_recoveries[i].load(Relaxed)
            );
        }
        let _ = writeln!(lab, "# HELP riptide_connections_refused_total Client connections refused before HTTP, by reason.\n# TYPE riptide_connections_refused_total counter");
        for (i, reason) in ["max-connections", "per-ip"].iter().enumerate() {
            let _ = writeln!(
                lab,
                "riptide_connections_refused_total{{reason=\"{reason}\"}} {}",
                self.connections_refused[i].load(Relaxed)
            );
        }
        for (name, kind, help, v) in [
            (
                "riptide_upstream_seq_resets_total",
                "counter",
                "Times the relay's seqs went backwards within a connection; the cursor followed the relay.",
                &self.upstream_seq_resets,
            ),
            (
                "riptide_upstream_future_cursor_total",
                "counter",
                "FutureCursor error frames: the relay is behind our stored upstream cursor.",
                &self.upstream_future_cursor,
            ),
            (
                "riptide_upstream_replayed_total",
                "counter",
                "Upstream frames the relay sent again with the same seq and bytes: skipped as duplicates.",
                &self.upstream_replayed,
            ),
            (
                "riptide_upstream_start_cursor",
                "gauge",
                "Upstream cursor ingest started from (0: live).",
                &self.upstream_start_cursor,
            ),
            (
                "riptide_upstream_connects_total",
                "counter",
                "Upstream connections made.",
                &self.upstream_connects,
            ),
            (
                "riptide_upstream_connect_failures_total",
                "counter",
                "Upstream connection attempts that failed.",
                &self.upstream_connect_failures,
            ),
            (
                "riptide_upstream_info_total",
                "counter",
                "Upstream #info frames.",
                &self.upstream_info,
            ),
            (
                "riptide_upstream_gaps_total",
                "counter",
                "Upstream OutdatedCursor notices: events the relay no longer held were lost.",
                &self.upstream_gaps,
            ),
            (
                "riptide_upstream_gap_seqs_total",
                "counter",
                "Upstream seqs skipped across OutdatedCursor gaps.",
                &self.upstream_gap_seqs,
            ),
            (
                "riptide_upstream_error_frames_total",
                "counter",
                "Upstream error frames.",
                &self.upstream_errors,
            ),
            (
                "riptide_upstream_unsequenced_total",
                "counter",
                "Upstream frames without a seq (of an unknown type, or decoding), not ingested; frames that do not decode are riptide_verdicts_total.",
                &self.upstream_unsequenced,
            ),
            (
                "riptide_resync_queued_total",
                "counter",
                "Accounts queued for resync after a chain break.",
                &self.resync_queued,
            ),
            (
                "riptide_resync_landed_total",
                "counter",
                "Resyncs whose verified repository became the account's state.",
                &self.resync_landed,
            ),
            (
                "riptide_resync_stale_total",
                "counter",
                "Resyncs that landed after a #sync had resynchronized the account, or with a repository older than a commit already seen.",
                &self.resync_stale,
            ),
            (
                "riptide_resync_in_flight",
                "gauge",
                "Resyncs being fetched or verified now.",
                &self.resync_in_flight,
            ),
            (
                "riptide_resync_held_frames",
                "gauge",
                "Frames held (durably) for accounts awaiting resync.",
                &self.resync_held,
            ),
            (
                "riptide_resync_held_accounts",
                "gauge",
                "Accounts with frames held, for a resync or the backfill (--backfill-hold).",
                &self.resync_held_accounts,
            ),
            (
                "riptide_resync_accounts",
                "gauge",
                "Accounts awaiting resync (their frames held).",
                &self.resync_accounts,
            ),
            (
                "riptide_resync_bytes_total",
                "counter",
                "Bytes of repositories fetched and verified by resyncs.",
                &self.resync_bytes,
            ),
            (
                "riptide_resync_records_total",
                "counter",
                "Records in repositories fetched and verified by resyncs.",
                &self.resync_records,
            ),
            (
                "riptide_replaced_repositories_total",
                "counter",
                "Repositories that landed over their account's earlier rows: a #sync, then one create-resync row per record.",
                &self.replaced_repositories,
            ),
            (
                "riptide_replacement_rows_total",
                "counter",
                "create-resync rows emitted for repositories that replaced their account's earlier rows.",
                &self.replacement_rows,
            ),
            (
                "riptide_replacement_records_dropped_total",
                "counter",
                "Records of replacing repositories not emitted (block not matching its CID, or outside the data model).",
                &self.replacement_dropped,
            ),
            (
                "riptide_key_lookup_retries_total",
                "counter",
                "DID lookups retried after a transient failure.",
                &self.key_lookup_retries,
            ),
            (
                "riptide_key_lookup_failures_total",
                "counter",
                "DID lookups given up.",
                &self.key_lookup_failures,
            ),
        ] {
            one(name, kind, help, c(v));
        }
        s.push_str(&lab);
        let _ = writeln!(s, "# HELP riptide_verdicts_total Upstream frames by verification verdict.\n# TYPE riptide_verdicts_total counter");
        for (i, v) in Verdict::ALL.iter().enumerate() {
            let _ = writeln!(
                s,
                "riptide_verdicts_total{{verdict=\"{v}\"}} {}",
                self.verdicts[i].load(Relaxed)
            );
        }
        let _ = writeln!(s, "# HELP riptide_ops_dropped_total Ops that produced no event, by reason.\n# TYPE riptide_ops_dropped_total counter");
        for (i, r) in DROPS.iter().enumerate() {
            let _ = writeln!(
                s,
                "riptide_ops_dropped_total{{reason=\"{}\"}} {}",
                r.as_str(),
                self.drops[i].load(Relaxed)
            );
        }
        let _ = writeln!(s, "# HELP riptide_slow_consumer_drops_total Subscribers dropped as too slow, by reason.\n# TYPE riptide_slow_consumer_drops_total counter");
        for r in SlowDrop::ALL {
            let _ = writeln!(
                s,
                "riptide_slow_consumer_drops_total{{reason=\"{}\"}} {}",
                r.as_str(),
                self.slow_drop_count(r)
            );
        }
        let _ = writeln!(s, "# HELP riptide_resync_failed_total Failed resync attempts, by reason (each also a resync-failed verdict).\n# TYPE riptide_resync_failed_total counter");
        for r in ResyncFailure::ALL {
            let _ = writeln!(
                s,
                "riptide_resync_failed_total{{reason=\"{}\"}} {}",
                r.as_str(),
                self.resync_failure_count(r)
            );
        }
        for (h, name, help) in [
            (
                &self.verify_seconds,
                "riptide_ingest_verify_seconds",
                "Time to verify one upstream frame.",
            ),
            (
                &self.publish_seconds,
                "riptide_ingest_publish_seconds",
                "Time from receiving an upstream frame to its events being durable and published.",
            ),
            (
                &self.store_append_seconds,
                "riptide_store_append_seconds",
                "Time of one durable store batch write.",
            ),
        ] {
            h.render(&mut s, name, help);
        }
        self.kafka.render(&mut s);
        self.backfill.render(&mut s);
        for (name, help, v) in extra {
            sample(&mut s, name, "gauge", help, v);
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kafka_metrics_are_rendered_by_role_only() {
        let m = Metrics::default();
        assert!(!m.render(&[]).contains("riptide_kafka_"));
        m.kafka.set_role(KafkaRole::Ingest);
        m.kafka.transactions_committed.fetch_add(3, Relaxed);
        m.kafka.lease_held.store(true, Relaxed);
        let s = m.render(&[]);
        assert!(s.contains("\nriptide_kafka_transactions_committed_total 3\n"));
        assert!(s.contains("\nriptide_kafka_lease_held 1\n"));
        assert!(s.contains("riptide_kafka_commit_seconds_bucket"));
        assert!(!s.contains("riptide_kafka_pending_records"));
        m.kafka.set_role(KafkaRole::Edge);
        m.kafka.partitions_paused.store(2, Relaxed);
        let s = m.render(&[]);
        assert!(s.contains("\nriptide_kafka_partitions_paused 2\n"));
        assert!(s.contains("# TYPE riptide_kafka_partition_pauses_total counter\n"));
        assert!(!s.contains("riptide_kafka_lease_held"));
    }

    #[test]
    fn histogram_buckets_sum_and_exposition() {
        let h = Histogram::default();
        for us in [10, 50, 51, 700, 3_000_000, 60_000_000] {
            h.observe(Duration::from_micros(us));
        }
        // 10 and 50 µs are at or below 50 µs (bounds are inclusive); 51 µs in the 100 µs bucket.
        assert_eq!(h.cumulative(0), 2);
        assert_eq!(h.cumulative(1), 3);
        assert_eq!(h.cumulative(4), 4); // ≤ 1 ms
        assert_eq!(h.cumulative(15), 5); // ≤ 5 s
        assert_eq!(h.cumulative(16), 5); // ≤ 10 s: the minute is above every bound
        assert_eq!(h.count(), 6);
        assert!((h.sum_seconds() - 63.000811).abs() < 1e-9);
        let mut s = String::new();
        h.render(&mut s, "x_seconds", "X.");
        let lines: Vec<&str> = s.lines().collect();
        assert_eq!(lines[0], "# HELP x_seconds X.");
        assert_eq!(lines[1], "# TYPE x_seconds histogram");
        assert_eq!(lines[2], "x_seconds_bucket{le=\"0.00005\"} 2");
        assert_eq!(lines[3], "x_seconds_bucket{le=\"0.0001\"} 3");
        assert_eq!(lines[18], "x_seconds_bucket{le=\"10\"} 5");
        assert_eq!(lines[19], "x_seconds_bucket{le=\"+Inf\"} 6");
        assert_eq!(lines[20], "x_seconds_sum 63.000811");
        assert_eq!(lines[21], "x_seconds_count 6");
        // Buckets never decrease.
        let counts: Vec<u64> = lines[2..20]
            .iter()
            .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
            .collect();
        assert!(counts.windows(2).all(|w| w[0] <= w[1]));
    }
}
