//! Faults on demand: what a flaky network does to a client, made deterministic.
//!
//! Deterministic (every Nth request) rather than random so a test that asserts "the client
//! survives a dropped connection" fails the same way on every run. Counting is over all requests
//! the fault layer sees, `/_sim/*` excluded. The relay's faults (`relay_*`) are per WebSocket
//! connection and apply to connections upgraded after they are set.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Which faults to inject. All off by default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Faults {
    /// Every Nth request is answered `503 Service Unavailable` (0: never).
    pub error_every: u64,
    /// Every Nth response is cut half-way through its body and the connection dropped (0: never).
    pub drop_every: u64,
    /// Milliseconds to wait before answering each request.
    pub delay_ms: u64,
    /// Relay: drop each `subscribeRepos` connection (no close frame) after this many event frames.
    pub relay_drop_after: Option<usize>,
    /// Relay: after this many event frames, send an error frame (`error`: [`RELAY_ERROR`]) and
    /// close.
    pub relay_error_after: Option<usize>,
    /// Relay: milliseconds to wait before each frame (0: none).
    pub relay_frame_delay_ms: u64,
    /// Every Nth request is answered `429 Too Many Requests` with `Retry-After:`
    /// `RETRY_AFTER_SECS` (0: never). Checked after `error_every`, before `drop_every`.
    pub rate_limit_every: u64,
    /// The `Retry-After` (seconds) of those 429s instead of `RETRY_AFTER_SECS` (1): any `u64`, so
    /// a client's handling of an absurd one can be tested.
    pub rate_limit_retry_after: Option<u64>,
}

/// The `Retry-After` of an injected 429, in seconds.
pub const RETRY_AFTER_SECS: u64 = 1;

/// The `error` of the error frames [`Faults::relay_error_after`] injects.
pub const RELAY_ERROR: &str = "InternalError";

/// What the fault layer does to request number `n` (1-based).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    Pass,
    Error,
    RateLimited,
    Drop,
}

impl Faults {
    pub(crate) fn delay(&self) -> Duration {
        Duration::from_millis(self.delay_ms)
    }

    /// The relay's per-connection faults.
    pub(crate) fn relay(&self) -> riptide_relay::Faults {
        riptide_relay::Faults {
            drop_after: self.relay_drop_after,
            frame_delay: (self.relay_frame_delay_ms > 0)
                .then(|| Duration::from_millis(self.relay_frame_delay_ms)),
            error_after: self.relay_error_after.map(|k| (k, RELAY_ERROR.to_owned())),
            ..riptide_relay::Faults::default()
        }
    }

    /// The `Retry-After` of an injected 429, in seconds.
    pub(crate) fn retry_after(&self) -> u64 {
        self.rate_limit_retry_after.unwrap_or(RETRY_AFTER_SECS)
    }

    pub(crate) fn action(&self, n: u64) -> Action {
        if self.error_every > 0 && n.is_multiple_of(self.error_every) {
            Action::Error
        } else if self.rate_limit_every > 0 && n.is_multiple_of(self.rate_limit_every) {
            Action::RateLimited
        } else if self.drop_every > 0 && n.is_multiple_of(self.drop_every) {
            Action::Drop
        } else {
            Action::Pass
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_nth() {
        let f = Faults {
            error_every: 3,
            drop_every: 2,
            ..Faults::default()
        };
        let got: Vec<Action> = (1..=6).map(|n| f.action(n)).collect();
        use Action::*;
        assert_eq!(got, [Pass, Drop, Error, Drop, Pass, Error]);
        assert_eq!(Faults::default().action(1), Pass);
        let parsed: Faults = serde_json::from_str(r#"{"error_every":2}"#).unwrap();
        assert_eq!(
            parsed,
            Faults {
                error_every: 2,
                ..Faults::default()
            }
        );
        assert!(serde_json::from_str::<Faults>(r#"{"bogus":1}"#).is_err());
        // The relay's faults, as POST /_sim/faults sends them, become the relay's.
        let relay: Faults = serde_json::from_str(
            r#"{"relay_drop_after":7,"relay_error_after":3,"relay_frame_delay_ms":5}"#,
        )
        .unwrap();
        let r = relay.relay();
        assert_eq!(r.drop_after, Some(7));
        assert_eq!(r.error_after, Some((3, RELAY_ERROR.to_owned())));
        assert_eq!(r.frame_delay, Some(Duration::from_millis(5)));
        assert_eq!(Faults::default().relay().frame_delay, None);
    }
}
