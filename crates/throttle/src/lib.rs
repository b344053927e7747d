//! Repeated warnings, said a few times in full and then as a summary with counts.
//!
//! Why a crate: every long-running part of riptide meets floods of the same complaint — a looped
//! capture makes `serve` refuse every replayed commit (421 `rev-regression` lines in 10 s at 50
//! frames/s), a Jetstream URL given to `tail --relay` sends thousands of text messages — and one
//! log line per event drowns the journal and whatever else was in it (issue 39). The rule is the
//! same everywhere, so it is written once: the first [`Throttle::FIRST`] of a kind are said in
//! full (an operator needs one whole example with its fields), then at most one line per
//! [`Throttle::EVERY`] that says how many were not said. Counting stays the metrics' job: they
//! count every event, so a summary only has to point at them.
//!
//! The crate decides; the caller logs (with `tracing`, in its own words and fields), so no log
//! framework is imposed here and the rule is tested without one. A summary is said when the next
//! event of its kind comes after the interval; the last few of a flood that then stops are
//! counted in the metrics but not in a line (a timer would cost a thread for that).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// What to do with one occurrence of a warning ([`Throttle::say`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Say {
    /// Say it in full.
    Full,
    /// Say nothing (it is counted for the next summary).
    Quiet,
    /// Say this one as a summary: `suppressed` occurrences were not said since the last line of
    /// this kind, `total` have happened in all.
    Summary {
        /// Occurrences not said since the last line of this kind (this one excluded).
        suppressed: u64,
        /// Occurrences of this kind so far, this one included.
        total: u64,
    },
}

#[derive(Debug)]
struct Kind {
    total: u64,
    quiet: u64,
    last_line: Instant,
}

/// One rule for many kinds of warning, shareable between threads.
#[derive(Debug)]
pub struct Throttle {
    first: u64,
    every: Duration,
    kinds: Mutex<HashMap<&'static str, Kind>>,
}

impl Default for Throttle {
    fn default() -> Throttle {
        Throttle::new(Throttle::FIRST, Throttle::EVERY)
    }
}

impl Throttle {
    /// Occurrences of a kind said in full before summaries begin (default).
    pub const FIRST: u64 = 5;
    /// At most one summary line per kind this often (default).
    pub const EVERY: Duration = Duration::from_secs(60);

    /// `first` said in full, then a summary at most every `every`.
    pub fn new(first: u64, every: Duration) -> Throttle {
        Throttle {
            first,
            every,
            kinds: Mutex::new(HashMap::new()),
        }
    }

    /// What to do with one occurrence of `kind` now.
    pub fn say(&self, kind: &'static str) -> Say {
        self.say_at(kind, Instant::now())
    }

    /// [`Throttle::say`] at a given instant (for tests).
    pub fn say_at(&self, kind: &'static str, now: Instant) -> Say {
        let mut kinds = self
            .kinds
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let k = kinds.entry(kind).or_insert(Kind {
            total: 0,
            quiet: 0,
            last_line: now,
        });
        k.total += 1;
        if k.total <= self.first {
            k.last_line = now;
            return Say::Full;
        }
        if now.saturating_duration_since(k.last_line) >= self.every {
            let suppressed = std::mem::take(&mut k.quiet);
            k.last_line = now;
            return Say::Summary {
                suppressed,
                total: k.total,
            };
        }
        k.quiet += 1;
        Say::Quiet
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_is_said_a_few_times_then_once_per_interval_with_exact_counts() {
        let t = Throttle::new(3, Duration::from_secs(10));
        let t0 = Instant::now();
        let mut lines = Vec::new();
        // 1,000 occurrences over 35 s: 3 in full, then a summary at 10 s, 20 s and 30 s.
        for i in 0..1000u64 {
            let at = t0 + Duration::from_millis(i * 35);
            match t.say_at("rev-regression", at) {
                Say::Quiet => {}
                s => lines.push((i, s)),
            }
        }
        assert_eq!(lines.len(), 6, "{lines:?}");
        assert!(lines[..3].iter().all(|(_, s)| *s == Say::Full));
        let summaries: Vec<(u64, u64)> = lines[3..]
            .iter()
            .map(|(_, s)| match s {
                Say::Summary { suppressed, total } => (*suppressed, *total),
                other => panic!("{other:?}"),
            })
            .collect();
        // Every occurrence is either said or counted in the next summary.
        let said = 3 + summaries.len() as u64;
        let suppressed: u64 = summaries.iter().map(|s| s.0).sum();
        let last_total = summaries.last().map(|s| s.1).unwrap_or(0);
        assert_eq!(said + suppressed, last_total);
        // The first summary comes 10 s after the third full line (at 70 ms): occurrence 288,
        // with 3 to 287 (285) unsaid before it.
        assert_eq!(lines[3].0, 288);
        assert_eq!(summaries[0], (285, 289));
    }

    #[test]
    fn kinds_are_counted_apart() {
        let t = Throttle::new(1, Duration::from_secs(60));
        let now = Instant::now();
        assert_eq!(t.say_at("a", now), Say::Full);
        assert_eq!(t.say_at("a", now), Say::Quiet);
        assert_eq!(t.say_at("b", now), Say::Full);
        assert_eq!(
            t.say_at("a", now + Duration::from_secs(60)),
            Say::Summary {
                suppressed: 1,
                total: 3
            }
        );
    }
}
