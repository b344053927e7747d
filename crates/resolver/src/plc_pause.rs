//! Waiting out the PLC directory's `429`s: one pause shared by every lookup of a resolver.
//!
//! Why: every `did:plc` lookup goes to the same directory, and a backfill of the network makes
//! millions of them (bench/README.md, "Extrapolation": about 730 a second from one machine). A
//! directory that limits a client answers `429` with when to come back (`Retry-After`, else
//! `RateLimit-Reset`). Taken as a failed lookup, as before, each `429` failed a repository
//! (retried later with the whole fetch, or given up after its attempts), and every concurrent
//! lookup went on asking meanwhile, earning `429`s of its own. Here a `429` pauses the
//! directory for every lookup of the resolver until the time it asked for, and the lookup that
//! got it asks again after the pause: a limited directory slows the crawl down to its rate
//! instead of failing accounts.
//!
//! Bounds: a pause is at most [`MAX_PAUSE`] (a directory asking for longer is asked again then),
//! one lookup waits out at most [`MAX_WAITS`] `429`s before it fails as before (transient, so
//! the caller's own retry applies), and a `429` without a readable wait pauses
//! [`DEFAULT_PAUSE`].

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::Duration;

use riptide_throttle::{Say, Throttle};
// tokio's clock, so that a test can run it paused.
use tokio::time::Instant;

/// The longest one pause lasts.
pub const MAX_PAUSE: Duration = Duration::from_secs(300);

/// The pause after a `429` that says no wait.
pub const DEFAULT_PAUSE: Duration = Duration::from_secs(1);

/// The most `429`s one lookup waits out before it fails.
pub const MAX_WAITS: u32 = 8;

/// The directory's pause and what it has cost.
#[derive(Debug, Default)]
pub(crate) struct PlcPause {
    until: Mutex<Option<Instant>>,
    /// `429`s answered by the directory.
    rate_limited: AtomicU64,
    said: Throttle,
}

impl PlcPause {
    /// Waits until the directory's pause (if any) is over.
    pub(crate) async fn wait(&self) {
        loop {
            let until = *self.until.lock().unwrap_or_else(|p| p.into_inner());
            match until {
                Some(u) if u > Instant::now() => tokio::time::sleep_until(u).await,
                _ => return,
            }
        }
    }

    /// The directory answered `429` asking for `wait` (`None`: it did not say): pauses every
    /// lookup until then (a later end than one already set wins; a pause is never shortened).
    pub(crate) fn rate_limited(&self, url: &str, wait: Option<Duration>) -> Duration {
        let wait = wait.unwrap_or(DEFAULT_PAUSE).min(MAX_PAUSE);
        let end = Instant::now() + wait;
        {
            let mut until = self.until.lock().unwrap_or_else(|p| p.into_inner());
            if until.is_none_or(|u| u < end) {
                *until = Some(end);
            }
        }
        let total = self.rate_limited.fetch_add(1, Relaxed) + 1;
        match self.said.say("plc rate limited") {
            Say::Full => tracing::warn!(
                url,
                pause = ?wait,
                total,
                "the PLC directory answered 429: every DID lookup waits until it asked to come back"
            ),
            Say::Summary { suppressed, total } => tracing::warn!(
                suppressed,
                total,
                "the PLC directory answered 429 {suppressed} more times since the last line, \
                 {total} in all; lookups wait each pause out"
            ),
            Say::Quiet => {}
        }
        wait
    }

    /// `429`s the directory has answered so far.
    pub(crate) fn count(&self) -> u64 {
        self.rate_limited.load(Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pause holds every waiter until its end, a later `429` lengthens it, an earlier one
    /// never shortens it, and absurd waits are bounded.
    #[tokio::test(start_paused = true)]
    async fn a_pause_holds_every_lookup_until_the_directory_said() {
        let p = PlcPause::default();
        let t0 = Instant::now();
        p.wait().await;
        assert_eq!(Instant::now(), t0, "no pause, no wait");
        assert_eq!(
            p.rate_limited("u", Some(Duration::from_secs(3))),
            Duration::from_secs(3)
        );
        p.rate_limited("u", Some(Duration::from_secs(1)));
        p.wait().await;
        assert_eq!(Instant::now() - t0, Duration::from_secs(3));
        assert_eq!(p.rate_limited("u", None), DEFAULT_PAUSE);
        assert_eq!(
            p.rate_limited("u", Some(Duration::from_secs(1 << 40))),
            MAX_PAUSE
        );
        p.wait().await;
        assert_eq!(Instant::now() - t0, Duration::from_secs(3) + MAX_PAUSE);
        assert_eq!(p.count(), 4);
    }
}
