//! `riptide serve`: a verifying, Jetstream-compatible stream server with disk-backed replay.
//!
//! Why a crate: the server is the one place where the decode/verify core meets tokio, fjall and
//! HTTP; keeping it apart keeps the core free of I/O. Pieces, in data order:
//!
//! - [`ingest`]: `(upstream seq, frame bytes)` in, verified and projected v1 events out, each
//!   rendered (JSON and zstd) once;
//! - [`chain`]: each verifier's account chain state, cached over the store's `accounts`;
//! - [`resync`]: a broken account's repository fetched and verified, its frames held meanwhile;
//! - the store (`riptide-store`): the fjall event store, with the upstream cursor committed
//!   atomically with the events it covers; [`Store`] and [`Event`] are its types with the text
//!   this server sends ([`WsText`]);
//! - [`log`]: the shared log subscribers pull from at their own cursor (memory tail + store);
//! - [`server`]: `/subscribe`, `/metrics`, `/healthz`, `/readyz`, with constant memory per
//!   subscriber;
//! - [`v2`]: Jetstream v2's `/xrpc/network.bsky.jetstream.subscribeEvents` and
//!   `getZstdDictionary`, served from the same log with the same seqs;
//! - [`archive`]: Jetstream v2's archive (`planSnapshot`, `listSegments`, `getSegment`,
//!   `getBlock`) over the sealed `.jss` segment files;
//! - [`slow`]: when a subscriber far behind is dropped (Jetstream v2's rule);
//! - [`limits`]: connection budget, per-IP limit and header deadline, so no client can exhaust
//!   the descriptors the store needs;
//! - [`publish`]: the hook a scale-out ingest node publishes each batch through before it is
//!   stored (riptide-kafka implements it);
//! - [`options`]: subscriber options and client messages, validated as Jetstream does;
//! - [`upstream`]: the relay source (riptide-client), warming DID lookups before verification
//!   (the verifier's keys are then `riptide_resolver::ResolverKeys::resolving_on`);
//! - [`status`]: the status line said once a minute in the log, from the metrics;
//! - [`page`]: the status page at `GET /`, from the same metrics;
//! - `said`: the rule (riptide-throttle) for the rare complaints that can still come in floods.

pub mod archive;
pub mod backfill;
pub mod chain;
pub mod compress;
mod faults;
pub mod ingest;
pub mod keys;
pub mod limits;
pub mod log;
pub mod metrics;
pub mod options;
pub mod page;
pub mod publish;
pub mod replace;
pub mod resync;
mod said;
pub mod server;
pub mod slow;
pub mod status;
pub mod upstream;
pub mod v2;

pub use compress::Dictionary;

/// `now + d`, saturating: a deadline from configuration too far for the clock is the farthest
/// it can hold within a century, never a panic (`Instant + Duration` panics on overflow; issue
/// 40).
pub(crate) fn deadline_after(
    now: tokio::time::Instant,
    d: std::time::Duration,
) -> tokio::time::Instant {
    now.checked_add(d)
        .or_else(|| now.checked_add(std::time::Duration::from_secs(100 * 365 * 86_400)))
        .unwrap_or(now)
}
pub use ingest::{
    default_workers, IngestConfig, IngestHandle, IngestSummary, Upstream, UpstreamFrame,
};
pub use keys::Keys;
pub use limits::{ConnInfo, ConnLimits, LimitedListener};
pub use log::{Log, ReadLimit, TailLimits};
pub use metrics::{KafkaMetrics, KafkaRole, Metrics};
pub use publish::{Publish, PublishError};
pub use riptide_store::{Resume, StoreError, StoreOptions};
pub use server::{router, App, ServerConfig};
pub use slow::SlowPolicy;

/// An event's text as this server sends it: axum's WebSocket text, checked to be UTF-8 once when
/// the event is made or read from the store (`riptide_store::Text`), never per subscriber.
#[derive(Clone, Debug)]
pub struct WsText(pub axum::extract::ws::Utf8Bytes);

impl riptide_store::Text for WsText {
    fn from_utf8(bytes: bytes::Bytes) -> Option<Self> {
        axum::extract::ws::Utf8Bytes::try_from(bytes)
            .ok()
            .map(WsText)
    }
    fn from_string(s: String) -> Self {
        WsText(s.into())
    }
    fn byte_len(&self) -> usize {
        self.0.len()
    }
}

/// One v1 event as this server holds and sends it.
pub type Event = riptide_store::Event<WsText>;

/// The event store, its events carrying this server's text.
pub type Store = riptide_store::Store<WsText>;
pub use upstream::UpstreamConfig;

/// Wall-clock unix microseconds.
pub fn now_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

/// Expires events older than `retention` every `every`, forever (spawn it): raises the store's
/// floor and drops segment files wholly outside the window ([`riptide_store::Store::expire`]), and
/// reports the store's size on disk.
pub async fn retention_loop(
    log: std::sync::Arc<Log>,
    metrics: std::sync::Arc<Metrics>,
    retention: std::time::Duration,
    every: std::time::Duration,
) {
    loop {
        let (l, m) = (log.clone(), metrics.clone());
        let pass = tokio::task::spawn_blocking(move || retention_pass(&l, &m, retention));
        if let Err(e) = pass.await {
            tracing::error!(error = %e, "retention task failed");
        }
        tokio::time::sleep(every).await;
    }
}

/// Seals the store's row blocks into segment files whenever they reach `--segment-bytes`
/// (`riptide_store::Store::seal_segments`, on the blocking pool: never the ingest thread), and
/// hands each file sealed to the archive (`SealedSegments::add`), checked every `every` (a load
/// of an atomic). A failed seal is logged and counted (`riptide_seal_failures_total`), and tried
/// again a minute later: nothing was removed from the store (the store's module `seal`).
pub async fn seal_loop(
    log: std::sync::Arc<Log>,
    archive: std::sync::Arc<archive::SealedSegments>,
    metrics: std::sync::Arc<Metrics>,
    every: std::time::Duration,
) {
    loop {
        let mut wait = every;
        if log.store().seal_due() {
            let (l, a, m) = (log.clone(), archive.clone(), metrics.clone());
            match tokio::task::spawn_blocking(move || seal_pass(&l, &a, &m)).await {
                Ok(true) => {}
                Ok(false) => wait = every * 60,
                Err(e) => tracing::error!(error = %e, "seal task failed"),
            }
        }
        tokio::time::sleep(wait).await;
    }
}

/// One round of sealing (blocking I/O); false when it failed.
fn seal_pass(log: &Log, archive: &archive::SealedSegments, metrics: &Metrics) -> bool {
    use std::sync::atomic::Ordering::Relaxed;
    let store = log.store();
    let sealed = store.seal_segments();
    let ok = sealed.is_ok();
    let entries = sealed.unwrap_or_else(|e| {
        metrics.seal_failures.fetch_add(1, Relaxed);
        tracing::error!(error = %e, "sealing a segment failed (nothing was removed from the store; tried again in a minute)");
        Vec::new()
    });
    let sealed_any = !entries.is_empty();
    for e in entries {
        metrics.segments_sealed.fetch_add(1, Relaxed);
        // A refusal is logged and counted by the archive (`riptide_archive_segments_rejected_total`).
        let _ = archive.add(&store.segment_path(&e));
    }
    if sealed_any {
        // Folding after each seal, as Jetstream's compaction does (docs/archive.md, "Folding"):
        // the store's compaction thread, which `riptide serve` starts whenever it seals.
        store.request_compaction();
    }
    ok
}

/// One retention pass (blocking I/O): expire what left the window, then publish the floor and the
/// store's size on disk.
fn retention_pass(log: &Log, metrics: &Metrics, retention: std::time::Duration) {
    use std::sync::atomic::Ordering::Relaxed;
    let cutoff = now_us() - retention.as_micros() as i64;
    let expired = log.store().expire(cutoff, retention);
    let disk = log.store().disk_usage();
    metrics.store_bytes.store(disk.bytes, Relaxed);
    metrics.store_segments.store(disk.segments as u64, Relaxed);
    let x = match expired {
        Ok(x) => x,
        Err(e) => {
            tracing::error!(error = %e, "retention failed");
            return;
        }
    };
    metrics.retention_floor.store(x.floor, Relaxed);
    if x.events > 0 {
        metrics.retention_deleted.fetch_add(x.events, Relaxed);
        tracing::info!(
            expired = x.events,
            floor = x.floor,
            disk_bytes = disk.bytes,
            "retention: old events expired"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use riptide_jetstream::EventKind;
    use std::sync::atomic::Ordering::Relaxed;
    use std::time::Duration;

    /// A pass over a store whose first events left the window publishes what it did: the floor
    /// at the first event inside the window, the events it passed, the size on disk.
    #[test]
    fn a_retention_pass_moves_the_floor_and_reports_it() {
        let dir = tempfile::tempdir().unwrap();
        let (store, r) = Store::open(dir.path(), 0).unwrap();
        let hour = Duration::from_secs(3600);
        let now = now_us();
        let old = now - 3 * hour.as_micros() as i64 / 2;
        // Seqs 1..=3 an hour and a half ago, 4..=5 now.
        let evs: Vec<Event> = (1..=5u64)
            .map(|i| {
                let t = if i <= 3 { old } else { now } + i as i64;
                Event::encode(i, t, EventKind::Commit, "did:plc:a", "a.b.c", b"{}", b"")
            })
            .collect();
        let resume = Resume {
            next_seq: 6,
            last_time_us: now + 5,
            upstream_cursor: None,
        };
        store.append(&evs, &resume).unwrap();
        let log = Log::new(store, r.next_seq, TailLimits::default());
        let metrics = Metrics::default();
        retention_pass(&log, &metrics, hour);
        assert_eq!(metrics.retention_floor.load(Relaxed), 4);
        assert_eq!(metrics.retention_deleted.load(Relaxed), 3);
        assert!(metrics.store_bytes.load(Relaxed) > 0);
        // A second pass finds nothing new to expire.
        retention_pass(&log, &metrics, hour);
        assert_eq!(metrics.retention_floor.load(Relaxed), 4);
        assert_eq!(metrics.retention_deleted.load(Relaxed), 3);
    }
}
