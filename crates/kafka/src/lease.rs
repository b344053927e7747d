//! Which ingest node publishes: a lease held through a Kafka consumer group.
//!
//! Why: two ingest nodes on one topic must not both publish, and the standby must take over
//! within seconds when the active one dies (even by `kill -9`). Every ingest node of a topic
//! joins the group `riptide-ingest.TOPIC` on the one-partition batch topic; the member the
//! partition is assigned to holds the lease. A killed holder stops heartbeating, the coordinator
//! drops it after the session timeout ([`SESSION_TIMEOUT_MS`]) and assigns the partition to a
//! standby, which then takes over the transactional id (fencing the old producer if it is in
//! fact alive). The sticky cooperative assignor keeps the lease where it is when a standby
//! joins. The lease only elects; fencing is what makes a second publisher impossible.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use riptide_serve::Metrics;

use crate::{KafkaError, KafkaUrl, Quiet};

/// The group's session timeout: how long a dead holder keeps the lease.
pub const SESSION_TIMEOUT_MS: u32 = 6000;

/// A held lease; dropping it leaves the group (the standby takes over at once).
#[derive(Debug)]
pub struct Lease {
    held: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Lease {
    /// Joins the group and blocks until this node holds the lease (logging, once, that it is a
    /// standby while it waits). Heartbeats go on in a background thread for as long as the
    /// returned value lives; `riptide_kafka_lease_held` says whether the lease is held.
    pub fn acquire(url: &KafkaUrl, metrics: Arc<Metrics>) -> Result<Lease, KafkaError> {
        let group = format!("riptide-ingest.{}", url.topic);
        let consumer: BaseConsumer<Quiet> = url
            .config()
            .set("group.id", &group)
            .set("enable.auto.commit", "false")
            .set("session.timeout.ms", SESSION_TIMEOUT_MS.to_string())
            .set("heartbeat.interval.ms", "1000")
            .set("partition.assignment.strategy", "cooperative-sticky")
            .create_with_context(Quiet)
            .map_err(url.client_err("creating the lease consumer"))?;
        let batch = url.batch_topic();
        consumer
            .subscribe(&[&batch])
            .map_err(url.client_err("joining the ingest group"))?;
        let mut said = false;
        let t0 = std::time::Instant::now();
        loop {
            // Messages are not wanted, only the group's events; the partition is paused once held.
            let _ = consumer.poll(Duration::from_millis(200));
            let a = consumer
                .assignment()
                .map_err(url.client_err("reading the lease assignment"))?;
            if a.count() > 0 {
                let _ = consumer.pause(&a);
                break;
            }
            if !said && t0.elapsed() > Duration::from_secs(3) {
                tracing::warn!(group = %group,
                    "standby: another ingest node holds the topic; waiting to take over");
                said = true;
            }
        }
        tracing::info!(group = %group, "holding the ingest lease: this node publishes");
        let held = Arc::new(AtomicBool::new(true));
        metrics.kafka.lease_held.store(true, Relaxed);
        let stop = Arc::new(AtomicBool::new(false));
        let (h, s) = (held.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("kafka-lease".into())
            .spawn(move || {
                while !s.load(Relaxed) {
                    let _ = consumer.poll(Duration::from_millis(200));
                    let n = consumer.assignment().map_or(0, |a| a.count());
                    metrics.kafka.lease_held.store(n > 0, Relaxed);
                    if n == 0 && h.swap(false, Relaxed) {
                        tracing::error!(
                            "the ingest lease was lost: another node may take over (its \
                             transactional id fences this one)"
                        );
                    } else if n > 0 {
                        if let Ok(a) = consumer.assignment() {
                            let _ = consumer.pause(&a);
                        }
                        h.store(true, Relaxed);
                    }
                }
                consumer.unsubscribe();
            })
            .map_err(|_| KafkaError::Inconsistent("cannot start the lease thread".into()))?;
        Ok(Lease {
            held,
            stop,
            thread: Some(thread),
        })
    }

    /// Whether the lease is still held (as far as the last heartbeat knows).
    pub fn held(&self) -> bool {
        self.held.load(Relaxed)
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
