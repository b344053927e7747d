//! Reconnect delays: exponential backoff with full jitter, reset after a healthy connection.
//!
//! Full jitter (AWS Architecture Blog, "Exponential Backoff and Jitter"): the n-th consecutive
//! failure waits a uniformly random time in `[0, min(max, base · 2ⁿ)]`, which spreads a crowd of
//! clients reconnecting to a recovering relay instead of having them retry in lockstep.

use std::time::Duration;

use rand::Rng;

/// Backoff parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    /// Cap of the first retry's delay.
    pub base: Duration,
    /// Largest delay.
    pub max: Duration,
    /// A connection that stayed up this long resets the failure count.
    pub healthy_after: Duration,
}

impl Default for Backoff {
    fn default() -> Backoff {
        Backoff {
            base: Duration::from_millis(250),
            max: Duration::from_secs(30),
            healthy_after: Duration::from_secs(60),
        }
    }
}

impl Backoff {
    /// The delay cap after `failures` consecutive failures (0 = none yet: no delay).
    pub fn cap(&self, failures: u32) -> Duration {
        if failures == 0 {
            return Duration::ZERO;
        }
        let factor = 1u32
            .checked_shl(failures.saturating_sub(1).min(31))
            .unwrap_or(u32::MAX);
        self.base.saturating_mul(factor).min(self.max)
    }

    /// A random delay in `[0, cap(failures)]`.
    pub fn delay(&self, failures: u32, rng: &mut impl Rng) -> Duration {
        let cap = self.cap(failures);
        if cap.is_zero() {
            return cap;
        }
        Duration::from_nanos(rng.gen_range(0..=cap.as_nanos().min(u64::MAX as u128) as u64))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_double_up_to_the_max_and_delays_stay_under_the_cap() {
        let b = Backoff {
            base: Duration::from_millis(100),
            max: Duration::from_secs(1),
            ..Backoff::default()
        };
        let caps: Vec<u128> = (0..7).map(|n| b.cap(n).as_millis()).collect();
        assert_eq!(caps, [0, 100, 200, 400, 800, 1000, 1000]);
        assert_eq!(b.cap(1000), Duration::from_secs(1));
        let mut rng = rand::thread_rng();
        let delays: Vec<Duration> = (0..200).map(|_| b.delay(3, &mut rng)).collect();
        assert!(delays.iter().all(|d| *d <= Duration::from_millis(400)));
        // Jitter: not all the same.
        assert!(delays.iter().any(|d| *d != delays[0]));
    }
}
