//! Per-client rate limits, as a PDS enforces them: so many requests per second per endpoint per
//! client IP address, answered `429` with the headers Bluesky's PDS sends.
//!
//! Why: a backfill's speed is set by these limits (the largest host's accounts divided by its
//! `getRepo` rate, per client address), so a simulator without them cannot tell a crawler that
//! respects them from one that is merely fast. Per IP because that is how the PDS keys them:
//! loopback is all of 127.0.0.0/8, so a client that binds 127.0.0.2 is another client.
//!
//! The headers are those of the PDS (`@atproto/xrpc-server`, `rate-limiter-http.ts`, read
//! 2026-11-28): on every response of a limited endpoint `RateLimit-Limit` (the points per
//! window), `RateLimit-Remaining`, `RateLimit-Reset` (the window's end, epoch seconds, rounded
//! down) and `RateLimit-Policy` (`<limit>;w=<window seconds>`); on a `429` also `Retry-After`
//! (seconds until the window ends, rounded up) with the body
//! `{"error":"RateLimitExceeded","message":"Rate Limit Exceeded"}`.
//!
//! The window is fixed, one second, aligned on the epoch second (the PDS's limiter is a fixed
//! window too, `rate-limiter-flexible`, though aligned on its first request): at most `limit`
//! requests per client in each wall-clock second.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

/// The window, in seconds.
pub const WINDOW_SECS: u64 = 1;

/// Forget clients not seen in this window once the table holds this many.
const PRUNE_AT: usize = 4096;

/// One limit (an endpoint on a host): `limit` requests per window per client IP; 0 is off.
#[derive(Debug)]
pub struct Limiter {
    limit: u32,
    seen: Mutex<HashMap<IpAddr, (u64, u32)>>,
}

/// What a request is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// Whether it is served.
    pub allowed: bool,
    /// `RateLimit-Limit`.
    pub limit: u32,
    /// `RateLimit-Remaining`.
    pub remaining: u32,
    /// `RateLimit-Reset`: the window's end, epoch seconds.
    pub reset: u64,
    /// `Retry-After`, seconds (on a refusal).
    pub retry_after: u64,
}

impl Limiter {
    /// `limit` requests per second per client IP (0: no limit).
    pub fn new(limit: u32) -> Limiter {
        Limiter {
            limit,
            seen: Mutex::new(HashMap::new()),
        }
    }

    /// The limit (0: off).
    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// Counts a request from `ip` now; `None` when the limit is off.
    pub fn check(&self, ip: IpAddr) -> Option<Decision> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        self.check_at(ip, now)
    }

    /// [`Limiter::check`] at `now_ms` (milliseconds since the epoch).
    pub fn check_at(&self, ip: IpAddr, now_ms: u64) -> Option<Decision> {
        if self.limit == 0 {
            return None;
        }
        let window = now_ms / 1000 / WINDOW_SECS;
        let end_ms = (window + 1) * WINDOW_SECS * 1000;
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        if seen.len() >= PRUNE_AT {
            seen.retain(|_, (w, _)| *w == window);
        }
        let e = seen.entry(ip).or_insert((window, 0));
        if e.0 != window {
            *e = (window, 0);
        }
        let allowed = e.1 < self.limit;
        if allowed {
            e.1 += 1;
        }
        Some(Decision {
            allowed,
            limit: self.limit,
            remaining: self.limit - e.1,
            reset: end_ms / 1000,
            retry_after: (end_ms - now_ms).div_ceil(1000).max(1),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_ip_per_window() {
        let l = Limiter::new(3);
        let a: IpAddr = "127.0.0.1".parse().unwrap();
        let b: IpAddr = "127.0.0.2".parse().unwrap();
        let t = 1_700_000_000_250;
        let got: Vec<(bool, u32)> = (0..5)
            .map(|_| l.check_at(a, t).map(|d| (d.allowed, d.remaining)).unwrap())
            .collect();
        assert_eq!(
            got,
            [(true, 2), (true, 1), (true, 0), (false, 0), (false, 0)]
        );
        let refused = l.check_at(a, t).unwrap();
        assert_eq!(refused.reset, 1_700_000_001);
        assert_eq!(refused.retry_after, 1);
        // Another address has its own budget; the next second restores the first's.
        assert!(l.check_at(b, t).unwrap().allowed);
        assert!(l.check_at(a, t + 750).unwrap().allowed);
        assert_eq!(Limiter::new(0).check_at(a, t), None);
    }
}
