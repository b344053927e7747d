//! A backfill's numbers as Prometheus text: the families `riptide serve --backfill` and
//! `riptide backfill --metrics-listen ADDR` (plain or as a Kafka worker) both expose.
//!
//! Why here: the numbers are the crawl's ([`Status`], [`Hosts`]' waits), and three processes
//! show them; one renderer keeps their names and meanings the same everywhere (the names are
//! the contract, `riptide_backfill_*`). Text only: serving it is the caller's (no I/O here).

use std::fmt::Write;

use crate::limits::Hosts;
use crate::outcome::FailKind;
use crate::status::Status;

/// One unlabelled sample with its `# HELP` and `# TYPE` lines.
fn sample(s: &mut String, name: &str, kind: &str, help: &str, v: impl std::fmt::Display) {
    let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}");
}

/// The `# HELP` and `# TYPE` lines of a labelled family.
fn family(s: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// A label value as the text format wants it (`\`, `"` and newlines escaped).
fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// A crawl's counts, as one process knows them: from the committed state ([`Status`]), or a
/// Kafka worker's own (`riptide_kafka::backfill::WorkerCounts::counts`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Counts {
    /// Listings (hosts...) done, left, and with a problem; `None`: not known here (a Kafka
    /// worker knows only the hosts it finished itself).
    pub listings: (u64, Option<u64>, Option<u64>),
    /// Repositories backfilled.
    pub repos_ok: u64,
    /// Repositories failed, by reason.
    pub repos_failed: std::collections::BTreeMap<String, u64>,
    /// Records written, and not written (outside the data model).
    pub records: (u64, u64),
    /// Bytes of repositories verified.
    pub bytes: u64,
    /// Repositories finished per second of running.
    pub repos_per_sec: f64,
    /// Accounts expected in all, when known.
    pub expected_repos: Option<u64>,
    /// Seconds left at the rate so far, when known.
    pub eta_secs: Option<f64>,
}

impl From<&Status> for Counts {
    fn from(st: &Status) -> Counts {
        Counts {
            listings: (
                st.listings_done,
                Some(st.listings_left),
                Some(st.listing_problems.len() as u64),
            ),
            repos_ok: st.repos_ok,
            repos_failed: st.repos_failed.clone(),
            records: (st.records, st.records_dropped),
            bytes: st.bytes,
            repos_per_sec: st.repos_per_sec,
            expected_repos: st.expected_repos,
            eta_secs: st.eta_secs,
        }
    }
}

/// Appends the families of a backfill's committed status: listings by state, repositories by
/// outcome (every reason, zeros included, so that a rate can be taken from the start), records,
/// bytes, the rate and the ETA.
pub fn render_status(s: &mut String, st: &Status) {
    render_counts(s, &Counts::from(st));
}

/// [`render_status`] from counts (a state not known is left out: `-1` for the ETA, 0 for the
/// expected total, as `serve --backfill` says them).
pub fn render_counts(s: &mut String, c: &Counts) {
    family(
        s,
        "riptide_backfill_listings",
        "gauge",
        "Listings (hosts...) by state, as `riptide backfill status` counts them.",
    );
    for (state, n) in [
        ("done", Some(c.listings.0)),
        ("left", c.listings.1),
        ("problem", c.listings.2),
    ] {
        if let Some(n) = n {
            let _ = writeln!(s, "riptide_backfill_listings{{state=\"{state}\"}} {n}");
        }
    }
    family(
        s,
        "riptide_backfill_repos_total",
        "counter",
        "Repositories by outcome (over all runs).",
    );
    let _ = writeln!(
        s,
        "riptide_backfill_repos_total{{outcome=\"ok\"}} {}",
        c.repos_ok
    );
    for k in FailKind::ALL {
        let n = c.repos_failed.get(k.reason()).copied().unwrap_or(0);
        let _ = writeln!(
            s,
            "riptide_backfill_repos_total{{outcome=\"{}\"}} {n}",
            k.reason()
        );
    }
    for (name, kind, help, v) in [
        (
            "riptide_backfill_records_total",
            "counter",
            "Records backfilled (over all runs).",
            c.records.0.to_string(),
        ),
        (
            "riptide_backfill_records_dropped_total",
            "counter",
            "Records not written: outside the atproto data model.",
            c.records.1.to_string(),
        ),
        (
            "riptide_backfill_bytes_total",
            "counter",
            "Bytes of repositories verified (over all runs).",
            c.bytes.to_string(),
        ),
        (
            "riptide_backfill_repos_per_second",
            "gauge",
            "Repositories finished per second of running.",
            format!("{:.3}", c.repos_per_sec),
        ),
        (
            "riptide_backfill_expected_repos",
            "gauge",
            "Accounts the hosts' listHosts counts add up to (0: not known).",
            c.expected_repos.unwrap_or(0).to_string(),
        ),
        (
            "riptide_backfill_eta_seconds",
            "gauge",
            "Seconds left at the rate so far (-1: not known).",
            c.eta_secs
                .map_or_else(|| "-1".into(), |e| format!("{e:.0}")),
        ),
    ] {
        sample(s, name, kind, help, v);
    }
}

/// Appends what the hosts' limits cost: `429`s received and pauses (a `429`'s wait, or a window
/// the host said was spent), per host (and client address with `--bind`), and their totals.
/// Only hosts that were ever made to wait are listed, so that 5,800 quiet hosts add nothing.
pub fn render_waits(s: &mut String, hosts: &Hosts) {
    let waits = hosts.waits();
    let total = waits.iter().fold((0u64, 0u64, 0f64), |t, (_, w)| {
        (t.0 + w.rate_limited, t.1 + w.pauses, t.2 + w.paused_secs)
    });
    for (name, help, v) in [
        (
            "riptide_backfill_rate_limited_total",
            "`429` answers received from the hosts (each then waited out).",
            total.0.to_string(),
        ),
        (
            "riptide_backfill_host_pauses_total",
            "Pauses of a host: after a `429`, or after an answer saying its window was spent (`RateLimit-Remaining: 0`).",
            total.1.to_string(),
        ),
        (
            "riptide_backfill_host_paused_seconds_total",
            "Seconds of those pauses, as the hosts asked.",
            format!("{:.3}", total.2),
        ),
    ] {
        sample(s, name, "counter", help, v);
    }
    for (name, help, get) in [
        (
            "riptide_backfill_host_rate_limited_total",
            "`429` answers received, per host (hosts that were ever made to wait).",
            (|w| w.rate_limited.to_string()) as fn(&crate::limits::Waits) -> String,
        ),
        (
            "riptide_backfill_host_pauses",
            "Pauses, per host (hosts that were ever made to wait).",
            |w| w.pauses.to_string(),
        ),
        (
            "riptide_backfill_host_paused_seconds",
            "Seconds paused, per host (hosts that were ever made to wait).",
            |w| format!("{:.3}", w.paused_secs),
        ),
    ] {
        if waits.is_empty() {
            continue;
        }
        family(s, name, "counter", help);
        for (host, w) in &waits {
            let _ = writeln!(s, "{name}{{host=\"{}\"}} {}", label(host), get(w));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn value(text: &str, name: &str) -> Option<String> {
        text.lines().find_map(|l| {
            l.strip_prefix(name)
                .and_then(|r| r.strip_prefix(' '))
                .map(str::to_owned)
        })
    }

    #[test]
    fn a_status_renders_every_outcome_once_with_its_value() {
        let st = Status {
            listings: 3,
            listings_done: 2,
            listings_left: 0,
            listing_problems: [("host-b".to_owned(), "offline".to_owned())].into(),
            repos_ok: 17,
            repos_failed: [("bad_cid".to_owned(), 2), ("wrong_did".to_owned(), 1)].into(),
            repos_failed_total: 3,
            records: 901,
            records_dropped: 1,
            bytes: 123_456,
            elapsed_secs: 4.0,
            repos_per_sec: 5.0,
            records_per_sec: 225.25,
            expected_repos: Some(24),
            eta_secs: Some(0.8),
            failures: Vec::new(),
        };
        let mut s = String::new();
        render_status(&mut s, &st);
        for (name, v) in [
            ("riptide_backfill_listings{state=\"done\"}", "2"),
            ("riptide_backfill_listings{state=\"problem\"}", "1"),
            ("riptide_backfill_repos_total{outcome=\"ok\"}", "17"),
            ("riptide_backfill_repos_total{outcome=\"bad_cid\"}", "2"),
            ("riptide_backfill_repos_total{outcome=\"timeout\"}", "0"),
            ("riptide_backfill_records_total", "901"),
            ("riptide_backfill_bytes_total", "123456"),
            ("riptide_backfill_expected_repos", "24"),
            ("riptide_backfill_eta_seconds", "1"),
        ] {
            assert_eq!(value(&s, name).as_deref(), Some(v), "{name} in {s}");
        }
        assert_eq!(
            s.matches("riptide_backfill_repos_total{").count(),
            1 + FailKind::ALL.len()
        );
        assert_eq!(s.matches("# TYPE riptide_backfill_repos_total ").count(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn only_hosts_made_to_wait_are_listed_with_their_429s_and_pauses() {
        let hosts = Hosts::new(crate::HostLimits::default(), 4);
        drop(hosts.admit("quiet:1", crate::limits::Kind::GetRepo).await);
        hosts.rate_limited("busy:1", Duration::from_millis(1500));
        hosts.pause("busy:1", Duration::from_millis(250));
        hosts.pause("odd\"host", Duration::from_secs(1));
        let mut s = String::new();
        render_waits(&mut s, &hosts);
        assert_eq!(
            value(&s, "riptide_backfill_rate_limited_total").as_deref(),
            Some("1")
        );
        assert_eq!(
            value(&s, "riptide_backfill_host_pauses_total").as_deref(),
            Some("3")
        );
        assert_eq!(
            value(&s, "riptide_backfill_host_paused_seconds_total").as_deref(),
            Some("2.750")
        );
        assert_eq!(
            value(&s, "riptide_backfill_host_pauses{host=\"busy:1\"}").as_deref(),
            Some("2")
        );
        assert_eq!(
            value(
                &s,
                "riptide_backfill_host_rate_limited_total{host=\"busy:1\"}"
            )
            .as_deref(),
            Some("1")
        );
        assert_eq!(
            value(&s, "riptide_backfill_host_pauses{host=\"odd\\\"host\"}").as_deref(),
            Some("1")
        );
        assert!(!s.contains("quiet:1"), "{s}");
        // No host waited: the totals alone.
        let mut s = String::new();
        render_waits(&mut s, &Hosts::new(crate::HostLimits::default(), 4));
        assert!(!s.contains("{host="), "{s}");
        assert_eq!(
            value(&s, "riptide_backfill_host_pauses_total").as_deref(),
            Some("0")
        );
    }
}
