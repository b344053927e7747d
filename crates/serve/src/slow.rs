//! The slow-consumer rule: when a subscriber that is far behind the tip is dropped.
//!
//! Why a rule at all, when a subscriber costs no queue (see `log.rs`): a client that reads far
//! more slowly than events arrive never catches up; it keeps a connection, a task and store
//! reads busy forever. Jetstream v2's rule (protocol §1.4), which this follows: drop a client
//! only when it is more than 100,000 events behind the tip **and** its cursor advances at under
//! 5 events/s, continuously for 60 s; on `/subscribe` the TCP connection is closed without a
//! close frame. A client that is merely behind (replaying history) but moving is never dropped.
//!
//! How "continuously" is measured: a window opens when the subscriber is first seen more than
//! [`SlowPolicy::max_behind`] behind; any check that finds it no longer that far behind closes
//! the window. When a window has lasted [`SlowPolicy::window`], the cursor's advance over it is
//! compared with [`SlowPolicy::min_rate`]: too little and the subscriber is dropped, enough and a
//! new window starts. Checks happen after each batch and while a write is blocked (the serving
//! loop looks at least once a second), so a client that stops reading is judged too.

use std::time::Duration;

/// The rule's thresholds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SlowPolicy {
    /// Events behind the tip (the next seq to be published minus the subscriber's next seq)
    /// above which the subscriber is watched.
    pub max_behind: u64,
    /// Least cursor advance, in events per second, over a window.
    pub min_rate: f64,
    /// How long the subscriber must stay behind and slow.
    pub window: Duration,
}

impl Default for SlowPolicy {
    /// Jetstream v2's: 100,000 events, 5 events/s, 60 s.
    fn default() -> Self {
        SlowPolicy {
            max_behind: 100_000,
            min_rate: 5.0,
            window: Duration::from_secs(60),
        }
    }
}

/// One subscriber's state under a [`SlowPolicy`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct SlowWatch {
    policy: SlowPolicy,
    /// When the current window opened (unix µs) and the cursor then.
    since: Option<(i64, u64)>,
}

impl SlowWatch {
    pub(crate) fn new(policy: SlowPolicy) -> SlowWatch {
        SlowWatch {
            policy,
            since: None,
        }
    }

    /// Whether the subscriber at `cursor` (its next seq), with `tip` the log's next seq, is to
    /// be dropped now (`now_us`: unix microseconds).
    pub(crate) fn too_slow(&mut self, now_us: i64, cursor: u64, tip: u64) -> bool {
        if tip.saturating_sub(cursor) <= self.policy.max_behind {
            self.since = None;
            return false;
        }
        let Some((t0, c0)) = self.since else {
            self.since = Some((now_us, cursor));
            return false;
        };
        let window_us = self.policy.window.as_micros() as i64;
        let elapsed = now_us - t0;
        if elapsed < window_us {
            return false;
        }
        let rate = cursor.saturating_sub(c0) as f64 / (elapsed as f64 / 1e6);
        if rate < self.policy.min_rate {
            return true;
        }
        self.since = Some((now_us, cursor));
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i64 = 1_000_000;

    #[test]
    fn far_behind_and_stalled_for_a_window_is_dropped() {
        let mut w = SlowWatch::new(SlowPolicy::default());
        let tip = 500_000;
        // 200,000 behind, advancing 4 events/s: dropped once 60 s have passed, not before.
        for s in 0..60 {
            assert!(!w.too_slow(s * S, 300_000 + 4 * s as u64, tip), "at {s} s");
        }
        assert!(w.too_slow(60 * S, 300_240, tip));
    }

    #[test]
    fn moving_or_close_subscribers_are_kept() {
        let p = SlowPolicy::default();
        // Far behind but replaying at 6 events/s: a new window each time, never dropped.
        let mut w = SlowWatch::new(p);
        for s in 0..600 {
            assert!(!w.too_slow(s * S, 6 * s as u64, 10_000_000));
        }
        // Stalled, but exactly at the threshold: not "more than" 100,000 behind.
        let mut w = SlowWatch::new(p);
        for s in 0..600 {
            assert!(!w.too_slow(s * S, 1, 100_001));
        }
        // Stalled and far behind for 59 s, then close to the tip once: the window starts again.
        let mut w = SlowWatch::new(p);
        for s in 0..59 {
            assert!(!w.too_slow(s * S, 1, 200_000));
        }
        assert!(!w.too_slow(59 * S, 150_000, 200_000));
        for s in 60..120 {
            assert!(!w.too_slow(s * S, 150_000, 300_000), "at {s} s");
        }
        assert!(w.too_slow(120 * S, 150_000, 300_000));
    }
}
