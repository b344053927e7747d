//! The status line: once a minute, one INFO line that says how the server is doing.
//!
//! Why (issue 39): an operator woken at 3 a.m. reads the journal first, and a journal in which a
//! healthy server says nothing cannot tell "all is well" from "nothing is happening". So `serve`
//! says, every [`EVERY`]: where the upstream is (its seq, whether connected, how far the newest
//! event stored is behind the network's clock), how many events were stored and at what rate,
//! the subscribers on each wire, the store's size, and everything refused or dropped since the
//! previous line (frames refused by verification, duplicates skipped, upstream messages dropped,
//! subscribers dropped as too slow, connections refused). A quiet journal then means a quiet
//! network, and a figure that moves is said within the minute.
//!
//! What it is not: the record. Every figure is a metric at `/metrics` (counted there since
//! start); this line only reads those atomics, compares them with the previous line's
//! ([`Snapshot`]) and says the difference. Reading them costs a few dozen loads a minute. The
//! line is the message `status` with each figure a field of its own (`upstream_seq`, `events`,
//! `refused`, …): `key=value` pairs to a person, numbers to a log shipper (`--log-format json`),
//! nothing to parse out of prose.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use riptide_firehose::verify::Verdict;

use crate::metrics::SlowDrop;
use crate::server::App;

/// How often the line is said by default.
pub const EVERY: Duration = Duration::from_secs(60);

/// The counters a status line compares with the previous line's: totals since start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Events stored.
    pub events_stored: u64,
    /// Events sent to subscribers (both wires).
    pub events_out: u64,
    /// Frames refused, by verdict (in [`Verdict::ALL`] order; `ok` is never counted here).
    pub refused: [u64; Verdict::COUNT],
    /// Frames skipped as already stored.
    pub duplicates: u64,
    /// Upstream messages dropped before ingest (over the size limit, or text).
    pub upstream_dropped: u64,
    /// Ops dropped by the projection (no event made of them).
    pub ops_dropped: u64,
    /// Subscribers dropped as too slow.
    pub subscribers_dropped: u64,
    /// Connections refused over the limits.
    pub connections_refused: u64,
}

impl Snapshot {
    /// The counters of `app` now.
    pub fn of(app: &App) -> Snapshot {
        let m = &app.metrics;
        let mut refused = [0; Verdict::COUNT];
        for (i, v) in Verdict::ALL.iter().enumerate() {
            if *v != Verdict::Ok {
                refused[i] = m.verdict_count(*v);
            }
        }
        let client = m.upstream_client.get().map(|c| c.snapshot());
        Snapshot {
            events_stored: m.events_stored.load(Relaxed),
            events_out: m.events_out.load(Relaxed),
            refused,
            duplicates: m.frames_duplicate.load(Relaxed),
            upstream_dropped: client.map_or(0, |c| c.oversized + c.text_messages),
            ops_dropped: m.ops_dropped(),
            subscribers_dropped: SlowDrop::ALL.iter().map(|&r| m.slow_drop_count(r)).sum(),
            connections_refused: m.connections_refused.iter().map(|c| c.load(Relaxed)).sum(),
        }
    }
}

/// One status line's figures.
#[derive(Clone, Debug, PartialEq)]
pub struct Status {
    /// The last upstream seq stored.
    pub upstream_seq: u64,
    /// Whether a relay connection is up (`None`: no relay, e.g. a file or a Kafka topic).
    pub upstream_connected: Option<bool>,
    /// Seconds from the relay's time of the newest event stored to now (`None` before the first).
    pub upstream_lag_s: Option<f64>,
    /// Events stored since the last line.
    pub events: u64,
    /// Those per second.
    pub events_per_s: f64,
    /// Events sent to subscribers (both wires) since the last line.
    pub events_out: u64,
    /// Those per second.
    pub events_out_per_s: f64,
    /// Subscribers on Jetstream v1's `/subscribe`.
    pub subscribers_v1: u64,
    /// Subscribers on Jetstream v2's `subscribeEvents`.
    pub subscribers_v2: u64,
    /// The store's size on disk, as last measured (by the retention pass, once a minute).
    pub store_bytes: u64,
    /// Frames refused since the last line, all verdicts.
    pub refused: u64,
    /// Those by verdict, `verdict count` joined by `, ` (empty when none).
    pub refused_by: String,
    /// Frames skipped as already stored since the last line.
    pub duplicates: u64,
    /// Upstream messages dropped, ops dropped, subscribers dropped and connections refused
    /// since the last line, in that order.
    pub dropped: [u64; 4],
}

impl Status {
    /// The line for `now` against the previous line's `prev`, `elapsed` after it; the gauges
    /// (seq, lag, subscribers, store size) are read from `app` as they stand.
    pub fn between(app: &App, prev: &Snapshot, now: &Snapshot, elapsed: Duration) -> Status {
        let m = &app.metrics;
        let events = now.events_stored.saturating_sub(prev.events_stored);
        let events_out = now.events_out.saturating_sub(prev.events_out);
        let secs = elapsed.as_secs_f64().max(1e-3);
        let refused_each: Vec<(Verdict, u64)> = Verdict::ALL
            .iter()
            .enumerate()
            .map(|(i, v)| (*v, now.refused[i].saturating_sub(prev.refused[i])))
            .filter(|(_, n)| *n > 0)
            .collect();
        let t = m.upstream_event_time_us.load(Relaxed);
        let all = m.subscribers.load(Relaxed).max(0) as u64;
        let v2 = app.v2.metrics.subscribers.load(Relaxed).max(0) as u64;
        Status {
            upstream_seq: m.upstream_seq.load(Relaxed),
            upstream_connected: m.upstream_client.get().map(|c| c.snapshot().connected),
            upstream_lag_s: (t > 0).then(|| (crate::now_us() - t).max(0) as f64 / 1e6),
            events,
            events_per_s: events as f64 / secs,
            events_out,
            events_out_per_s: events_out as f64 / secs,
            subscribers_v1: all.saturating_sub(v2),
            subscribers_v2: v2,
            store_bytes: m.store_bytes.load(Relaxed),
            refused: refused_each.iter().map(|(_, n)| n).sum(),
            refused_by: refused_each
                .iter()
                .map(|(v, n)| format!("{v} {n}"))
                .collect::<Vec<_>>()
                .join(", "),
            duplicates: now.duplicates.saturating_sub(prev.duplicates),
            dropped: [
                now.upstream_dropped.saturating_sub(prev.upstream_dropped),
                now.ops_dropped.saturating_sub(prev.ops_dropped),
                now.subscribers_dropped
                    .saturating_sub(prev.subscribers_dropped),
                now.connections_refused
                    .saturating_sub(prev.connections_refused),
            ],
        }
    }

    /// Says the line at INFO: the message `status`, each figure a field (`status
    /// upstream_seq=150 upstream_lag_s=2.5 events=152 …` as text, numbers in JSON), the
    /// rates and the lag to a tenth.
    pub fn log(&self) {
        let [upstream_dropped, ops_dropped, subscribers_dropped, connections_refused] =
            self.dropped;
        let tenth = |x: f64| (x * 10.0).round() / 10.0;
        tracing::info!(
            upstream_seq = self.upstream_seq,
            upstream_connected = self.upstream_connected,
            upstream_lag_s = self.upstream_lag_s.map(tenth),
            events = self.events,
            events_per_s = tenth(self.events_per_s),
            events_out = self.events_out,
            events_out_per_s = tenth(self.events_out_per_s),
            subscribers_v1 = self.subscribers_v1,
            subscribers_v2 = self.subscribers_v2,
            store_bytes = self.store_bytes,
            refused = self.refused,
            refused_by = self.refused_by.as_str(),
            duplicates = self.duplicates,
            upstream_dropped,
            ops_dropped,
            subscribers_dropped,
            connections_refused,
            "status"
        );
    }
}

/// Says a status line every `every`, forever (spawn the future). The counters are taken when
/// this is called, not when the task first runs, so the first line counts everything since:
/// call it before ingest starts and the lines add up to the whole run. The first line comes
/// `every` after the call.
pub fn run(app: Arc<App>, every: Duration) -> impl std::future::Future<Output = ()> + Send {
    let mut prev = Snapshot::of(&app);
    let mut at = tokio::time::Instant::now();
    async move {
        let mut tick = tokio::time::interval_at(crate::deadline_after(at, every), every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let now_at = tick.tick().await;
            let now = Snapshot::of(&app);
            Status::between(&app, &prev, &now, now_at.saturating_duration_since(at)).log();
            (prev, at) = (now, now_at);
        }
    }
}

/// How long a window the status page's rates are taken over, at least.
pub const RATE_WINDOW: Duration = Duration::from_secs(10);

/// The snapshots the status page compares with to say rates: the start, then at most one every
/// [`RATE_WINDOW`], the last two kept. A page viewed now compares with the newest that is at
/// least [`RATE_WINDOW`] old (else the oldest), so its rates are over 10–20 s once the server
/// has run that long, however often the page is loaded (a reload a second does not make them
/// one-second noise), and over the whole run before.
#[derive(Debug)]
pub struct Recent(std::sync::Mutex<Vec<(Instant, Snapshot)>>);

impl Recent {
    /// Starting at `at` with every counter at zero (a new server's metrics).
    pub fn new(at: Instant) -> Recent {
        Recent(std::sync::Mutex::new(vec![(at, Snapshot::default())]))
    }

    /// The snapshot to compare `now` (taken at `at`) with, and when it was taken; keeps `now`
    /// when the newest kept is [`RATE_WINDOW`] old.
    pub fn window(&self, at: Instant, now: Snapshot) -> (Instant, Snapshot) {
        let mut kept = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let old_enough = |t: &Instant| at.saturating_duration_since(*t) >= RATE_WINDOW;
        let base = kept
            .iter()
            .rev()
            .find(|(t, _)| old_enough(t))
            .or_else(|| kept.first())
            .copied()
            .unwrap_or((at, now));
        if kept.last().is_none_or(|(t, _)| old_enough(t)) {
            kept.push((at, now));
            if kept.len() > 2 {
                kept.remove(0);
            }
        }
        base
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Log, Metrics, ServerConfig, Store, TailLimits};

    fn app() -> (tempfile::TempDir, Arc<App>) {
        let dir = tempfile::tempdir().unwrap();
        let (store, r) = Store::open(dir.path(), 0).unwrap();
        let log = Arc::new(Log::new(store, r.next_seq, TailLimits::default()));
        let app = App::new(log, Arc::new(Metrics::default()), ServerConfig::default());
        (dir, app)
    }

    #[test]
    fn a_line_says_what_changed_since_the_last_and_the_gauges_as_they_stand() {
        let (_dir, app) = app();
        let m = &app.metrics;
        let first = Snapshot::of(&app);
        assert_eq!(first, Snapshot::default());
        // A minute of work: 600 events, refusals of two kinds, duplicates, drops.
        m.events_stored.fetch_add(600, Relaxed);
        m.upstream_seq.store(4_242, Relaxed);
        for _ in 0..3 {
            m.verdict(Verdict::RevRegression);
        }
        m.verdict(Verdict::Malformed);
        m.verdict(Verdict::Ok);
        m.frames_duplicate.fetch_add(7, Relaxed);
        m.slow_drop(SlowDrop::Behind);
        m.connections_refused[1].fetch_add(2, Relaxed);
        m.subscribers.store(5, Relaxed);
        app.v2.metrics.subscribers.store(2, Relaxed);
        m.store_bytes.store(12_500_000, Relaxed);
        m.upstream_event_time_us
            .store(crate::now_us() - 3_000_000, Relaxed);
        let second = Snapshot::of(&app);
        let s = Status::between(&app, &first, &second, Duration::from_secs(60));
        assert_eq!(s.upstream_seq, 4_242);
        assert_eq!(s.upstream_connected, None, "no relay client here");
        let lag = s.upstream_lag_s.unwrap();
        assert!((3.0..10.0).contains(&lag), "{lag}");
        assert_eq!(s.events, 600);
        assert_eq!(s.events_per_s, 10.0);
        assert_eq!((s.subscribers_v1, s.subscribers_v2), (3, 2));
        assert_eq!(s.store_bytes, 12_500_000);
        assert_eq!(s.refused, 4, "ok is not refused");
        assert_eq!(s.refused_by, "malformed 1, rev-regression 3");
        assert_eq!(s.duplicates, 7);
        assert_eq!(s.dropped, [0, 0, 1, 2]);
        // The next line counts from the second: nothing new, nothing said as refused.
        let third = Snapshot::of(&app);
        let s = Status::between(&app, &second, &third, Duration::from_secs(60));
        assert_eq!((s.events, s.refused, s.duplicates), (0, 0, 0));
        assert_eq!(s.refused_by, "");
        assert_eq!(s.dropped, [0; 4]);
        assert_eq!(s.upstream_seq, 4_242, "gauges are said as they stand");
    }

    /// The page's window: the whole run at first, then the newest kept snapshot at least
    /// [`RATE_WINDOW`] old, however often it is asked.
    #[test]
    fn rates_are_over_ten_to_twenty_seconds_however_often_asked() {
        let t0 = Instant::now();
        let recent = Recent::new(t0);
        let at = |s: u64| t0 + Duration::from_secs(s);
        let snap = |n: u64| Snapshot {
            events_stored: n,
            ..Snapshot::default()
        };
        // Asked every second: before 10 s, the start.
        for s in 1..10 {
            assert_eq!(recent.window(at(s), snap(s)), (t0, Snapshot::default()));
        }
        // At 10 s the start is still the base, and 10 s is kept.
        assert_eq!(recent.window(at(10), snap(10)).0, t0);
        // Until 20 s, the base stays the start (the 10 s one is too young)...
        assert_eq!(recent.window(at(15), snap(15)).0, t0);
        // ...then moves to 10 s, and 20 s is kept.
        assert_eq!(recent.window(at(20), snap(20)), (at(10), snap(10)));
        assert_eq!(recent.window(at(29), snap(29)), (at(10), snap(10)));
        assert_eq!(recent.window(at(30), snap(30)), (at(20), snap(20)));
        // Not asked for a long while: the newest kept, however old.
        assert_eq!(recent.window(at(500), snap(500)), (at(30), snap(30)));
        assert!(recent.0.lock().unwrap().len() <= 2);
    }
}
