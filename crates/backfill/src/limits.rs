//! Per-host limits: a request rate per kind of request, a concurrency bound, and a pause after
//! `429`; and the one global concurrency bound.
//!
//! Why our own token bucket rather than `governor`: a host's state is three things that must be
//! read together — its tokens, its slots and a `not before` instant set by a `429`'s
//! `Retry-After` / `RateLimit-Reset` — and the waiting must happen in a fixed order so that a
//! waiting host holds nothing anyone else needs. That is thirty lines here; with `governor` the
//! pause and the slots would still be ours, beside a dependency.
//!
//! Order of waiting, for one request ([`Hosts::admit`]): the host's slot (per-host
//! concurrency), then its pause, then its token, and only then the global slot. So a host that is
//! slow, paused or out of tokens holds none of the global slots, and one host never stalls the
//! others: they wait on their own hosts only.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
// tokio's clock (the same as std's at run time), so that tests can run it paused.
use tokio::time::Instant;

/// Limits of one host.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HostLimits {
    /// `getRepo` per second (default 20, Bluesky's published PDS limit).
    pub get_repo_per_sec: f64,
    /// `listRepos` (and `listHosts`, `listReposByCollection`) per second (default 10).
    pub list_per_sec: f64,
    /// Requests to one host at once (default 8).
    pub per_host: usize,
}

impl Default for HostLimits {
    fn default() -> HostLimits {
        HostLimits {
            get_repo_per_sec: 20.0,
            list_per_sec: 10.0,
            per_host: 8,
        }
    }
}

/// Which rate a request counts against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `getRepo`.
    GetRepo,
    /// A listing (`listRepos`, `listHosts`, `listReposByCollection`).
    List,
}

/// A token bucket: `rate` tokens a second, at most one second's worth saved up (at least
/// one), so a host that was idle gets a burst of at most its per-second limit.
#[derive(Debug)]
struct Bucket {
    rate: f64,
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn new(rate: f64, now: Instant) -> Bucket {
        Bucket {
            rate,
            tokens: rate.max(1.0),
            at: now,
        }
    }

    /// Takes a token, or says how long until one is there. An infinite (or non-positive,
    /// meaning unlimited) rate never waits.
    fn take(&mut self, now: Instant) -> Option<Duration> {
        if !self.rate.is_finite() || self.rate <= 0.0 {
            return None;
        }
        let cap = self.rate.max(1.0);
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate).min(cap);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            None
        } else {
            Some(Duration::from_secs_f64((1.0 - self.tokens) / self.rate))
        }
    }

    /// Gives back a token taken for a request that was not sent.
    fn give_back(&mut self) {
        self.tokens = (self.tokens + 1.0).min(self.rate.max(1.0));
    }
}

#[derive(Debug)]
struct Host {
    slots: Arc<Semaphore>,
    state: Mutex<HostState>,
}

#[derive(Debug)]
struct HostState {
    get: Bucket,
    list: Bucket,
    not_before: Option<Instant>,
    waits: Waits,
}

/// What a host's limits cost so far (`/metrics`, [`crate::metrics`]).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Waits {
    /// `429` answers received ([`Hosts::rate_limited`]).
    pub rate_limited: u64,
    /// Pauses: after a `429`, or after an answer saying the host's window was spent.
    pub pauses: u64,
    /// Seconds of those pauses, as asked.
    pub paused_secs: f64,
}

/// Every host's limits, and the global slots. Cheap to share (`Arc` inside).
#[derive(Clone, Debug)]
pub struct Hosts {
    limits: HostLimits,
    global: Arc<Semaphore>,
    hosts: Arc<Mutex<HashMap<String, Arc<Host>>>>,
}

/// Leave to send one request: the host's slot and a global one, released on drop.
#[derive(Debug)]
pub struct Permit {
    host: Arc<Host>,
    kind: Kind,
    _slot: OwnedSemaphorePermit,
    _global: OwnedSemaphorePermit,
}

impl Permit {
    /// The request was not sent after all (the client knew the host would refuse it: its
    /// window was spent): the token it took is given back, so that the host's rate is not
    /// spent on requests that never went out.
    pub fn not_sent(self) {
        let mut st = self
            .host
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match self.kind {
            Kind::GetRepo => st.get.give_back(),
            Kind::List => st.list.give_back(),
        }
    }
}

impl Hosts {
    /// Hosts under `limits`, at most `global` requests at once over all hosts.
    pub fn new(limits: HostLimits, global: usize) -> Hosts {
        Hosts {
            limits,
            global: Arc::new(Semaphore::new(global.max(1))),
            hosts: Arc::default(),
        }
    }

    fn host(&self, host: &str) -> Arc<Host> {
        let mut hosts = self
            .hosts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        hosts
            .entry(host.to_owned())
            .or_insert_with(|| {
                let now = Instant::now();
                Arc::new(Host {
                    slots: Arc::new(Semaphore::new(self.limits.per_host.max(1))),
                    state: Mutex::new(HostState {
                        get: Bucket::new(self.limits.get_repo_per_sec, now),
                        list: Bucket::new(self.limits.list_per_sec, now),
                        not_before: None,
                        waits: Waits::default(),
                    }),
                })
            })
            .clone()
    }

    /// Waits for leave to send one `kind` request to `host` (module docs: the order).
    pub async fn admit(&self, host: &str, kind: Kind) -> Permit {
        let h = self.host(host);
        // Neither semaphore is ever closed.
        #[allow(clippy::expect_used)]
        let slot = h
            .slots
            .clone()
            .acquire_owned()
            .await
            .expect("host slots are never closed");
        loop {
            let wait = {
                let mut st = h
                    .state
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                let now = Instant::now();
                match st.not_before.filter(|t| *t > now) {
                    Some(t) => Some(t - now),
                    None => match kind {
                        Kind::GetRepo => st.get.take(now),
                        Kind::List => st.list.take(now),
                    },
                }
            };
            match wait {
                Some(d) => tokio::time::sleep(d).await,
                None => break,
            }
        }
        #[allow(clippy::expect_used)]
        let global = self
            .global
            .clone()
            .acquire_owned()
            .await
            .expect("the global slots are never closed");
        Permit {
            host: h,
            kind,
            _slot: slot,
            _global: global,
        }
    }

    /// `host` answered `429` and asked us to wait `d`: counted, and nothing is sent to it
    /// before then.
    pub fn rate_limited(&self, host: &str, d: Duration) {
        self.wait(host, d, true);
    }

    /// `host` said its window is spent until `d` from now (`RateLimit-Remaining: 0`): nothing
    /// is sent to it before then.
    pub fn pause(&self, host: &str, d: Duration) {
        self.wait(host, d, false);
    }

    fn wait(&self, host: &str, d: Duration, refused: bool) {
        let h = self.host(host);
        let mut st = h
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        st.waits.rate_limited += u64::from(refused);
        st.waits.pauses += 1;
        st.waits.paused_secs += d.as_secs_f64();
        let until = Instant::now().checked_add(d);
        st.not_before = match (st.not_before, until) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => b.or(a),
        };
    }
}

impl Hosts {
    /// Every host that was made to wait, with what it cost, by name.
    pub fn waits(&self) -> Vec<(String, Waits)> {
        let hosts: Vec<(String, Arc<Host>)> = self
            .hosts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .map(|(k, h)| (k.clone(), h.clone()))
            .collect();
        let mut out: Vec<(String, Waits)> = hosts
            .into_iter()
            .filter_map(|(k, h)| {
                let w = h
                    .state
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .waits;
                (w.pauses > 0).then_some((k, w))
            })
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_gives_its_rate_and_a_burst_of_one_second() {
        let t0 = Instant::now();
        let mut b = Bucket::new(20.0, t0);
        // A full second's worth at once, then one every 50 ms.
        for _ in 0..20 {
            assert_eq!(b.take(t0), None);
        }
        let w = b.take(t0).unwrap();
        assert!((w.as_secs_f64() - 0.05).abs() < 1e-9, "{w:?}");
        assert_eq!(b.take(t0 + Duration::from_millis(50)), None);
        assert!(b.take(t0 + Duration::from_millis(50)).is_some());
        // Idle for a minute: still only a second's worth.
        let later = t0 + Duration::from_secs(60);
        let taken = (0..100).take_while(|_| b.take(later).is_none()).count();
        assert_eq!(taken, 20);
        // A slow rate saves up one token, not zero.
        let mut slow = Bucket::new(0.5, t0);
        assert_eq!(slow.take(t0), None);
        assert_eq!(slow.take(t0), Some(Duration::from_secs(2)));
        // Unlimited.
        let mut free = Bucket::new(f64::INFINITY, t0);
        assert!((0..1000).all(|_| free.take(t0).is_none()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_paused_or_busy_host_holds_no_global_slot() {
        let hosts = Hosts::new(
            HostLimits {
                get_repo_per_sec: 1000.0,
                list_per_sec: 1000.0,
                per_host: 1,
            },
            1,
        );
        hosts.pause("slow:1", Duration::from_secs(30));
        let h = hosts.clone();
        let slow = tokio::spawn(async move {
            let _p = h.admit("slow:1", Kind::GetRepo).await;
            Instant::now()
        });
        tokio::task::yield_now().await;
        // The one global slot is free for another host while slow:1 waits.
        let t = Instant::now();
        let p = hosts.admit("fast:1", Kind::GetRepo).await;
        assert!(t.elapsed() < Duration::from_secs(1));
        drop(p);
        let admitted = slow.await.unwrap();
        assert!(admitted.duration_since(t) >= Duration::from_secs(29));
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_not_sent_spends_no_token() {
        let hosts = Hosts::new(
            HostLimits {
                get_repo_per_sec: 1.0,
                ..HostLimits::default()
            },
            4,
        );
        let t = Instant::now();
        // The one token, taken for a request the host's spent window kept back: given back,
        // the retry goes at once rather than a second later.
        hosts.admit("pds:1", Kind::GetRepo).await.not_sent();
        drop(hosts.admit("pds:1", Kind::GetRepo).await);
        assert!(t.elapsed() < Duration::from_millis(10), "{:?}", t.elapsed());
        // A request that went out spent its token: the next waits its second.
        drop(hosts.admit("pds:1", Kind::GetRepo).await);
        let took = t.elapsed().as_secs_f64();
        assert!((took - 1.0).abs() < 0.01, "{took}");
        // Given back, never above the bucket's size.
        hosts.admit("pds:1", Kind::GetRepo).await.not_sent();
        hosts.admit("pds:1", Kind::GetRepo).await.not_sent();
        let t = Instant::now();
        drop(hosts.admit("pds:1", Kind::GetRepo).await);
        drop(hosts.admit("pds:1", Kind::GetRepo).await);
        let took = t.elapsed().as_secs_f64();
        assert!((took - 1.0).abs() < 0.01, "{took}");
    }

    #[tokio::test(start_paused = true)]
    async fn twenty_requests_a_second_per_host() {
        let hosts = Hosts::new(HostLimits::default(), 100);
        let t = Instant::now();
        for _ in 0..60 {
            drop(hosts.admit("pds:1", Kind::GetRepo).await);
        }
        // 20 at once, then 40 at 20/s: two seconds.
        let took = t.elapsed().as_secs_f64();
        assert!((took - 2.0).abs() < 0.01, "{took}");
        // listRepos has its own rate (10/s) on the same host.
        let t = Instant::now();
        for _ in 0..20 {
            drop(hosts.admit("pds:1", Kind::List).await);
        }
        let took = t.elapsed().as_secs_f64();
        assert!((took - 1.0).abs() < 0.01, "{took}");
    }
}
