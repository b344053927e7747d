//! `riptide backfill status`: what a state directory says about a backfill.
//!
//! Why apart from the state: the report is the operator's view (hosts done and left,
//! repositories by outcome, rate, ETA), computed from the committed state alone, so that it is
//! the same whether the backfill is running, stopped or finished.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::state::{State, StateError};

/// A backfill's progress as committed.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Status {
    /// Listings (hosts, the relay, collections, a DID file) known.
    pub listings: u64,
    /// Listings finished.
    pub listings_done: u64,
    /// Listings not finished and without a problem.
    pub listings_left: u64,
    /// Listings with a problem (a banned host, an unreachable one), with it.
    pub listing_problems: BTreeMap<String, String>,
    /// Repositories backfilled.
    pub repos_ok: u64,
    /// Repositories failed, by reason.
    pub repos_failed: BTreeMap<String, u64>,
    /// Repositories failed, in all.
    pub repos_failed_total: u64,
    /// Records written.
    pub records: u64,
    /// Records not written (outside the data model).
    pub records_dropped: u64,
    /// Bytes of verified CARs.
    pub bytes: u64,
    /// Seconds spent running, over all runs.
    pub elapsed_secs: f64,
    /// Repositories (ok or failed) per second of running.
    pub repos_per_sec: f64,
    /// Records per second of running.
    pub records_per_sec: f64,
    /// Accounts the hosts' `listHosts` counts add up to, when known.
    pub expected_repos: Option<u64>,
    /// Seconds left at the rate so far, when the total is known.
    pub eta_secs: Option<f64>,
    /// The first failed repositories: DID, reason, detail.
    pub failures: Vec<(String, String, String)>,
}

/// The status of `state`, listing at most `failures` failed repositories.
pub fn status(state: &State, failures: usize) -> Result<Status, StateError> {
    let c = state.counters();
    let listings = state.listings()?;
    let mut problems = BTreeMap::new();
    let (mut done, mut left, mut expected) = (0u64, 0u64, None::<u64>);
    for (key, l) in &listings {
        if let Some(p) = &l.problem {
            problems.insert(key.clone(), p.clone());
        }
        if l.done {
            done += 1;
        } else if l.problem.is_none() {
            left += 1;
        }
        if let Some(n) = l.accounts {
            *expected.get_or_insert(0) += n;
        }
    }
    let failed_total: u64 = c.failed.values().sum();
    let secs = c.elapsed_ms as f64 / 1000.0;
    let finished = c.ok + failed_total;
    let rate = if secs > 0.0 {
        finished as f64 / secs
    } else {
        0.0
    };
    let eta = expected.and_then(|n| (rate > 0.0).then(|| n.saturating_sub(finished) as f64 / rate));
    Ok(Status {
        listings: listings.len() as u64,
        listings_done: done,
        listings_left: left,
        listing_problems: problems,
        repos_ok: c.ok,
        repos_failed: c.failed.into_iter().filter(|(_, n)| *n > 0).collect(),
        repos_failed_total: failed_total,
        records: c.records,
        records_dropped: c.records_dropped,
        bytes: c.bytes,
        elapsed_secs: secs,
        repos_per_sec: rate,
        records_per_sec: if secs > 0.0 {
            c.records as f64 / secs
        } else {
            0.0
        },
        expected_repos: expected,
        eta_secs: eta,
        failures: state.failures(failures)?,
    })
}
