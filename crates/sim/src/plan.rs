//! The shape of a simulated network beyond its data: how many PDS hosts, which account lives on
//! which, the per-host rate limits, and which host or repository is faulty in which way. All of
//! it is decided up front, from flags and a seed, and written down in a manifest a test reads.
//!
//! Why a manifest: a backfill test must assert that each faulty repository was reported with
//! its own reason and each good one arrived exactly once; it can only do that if it knows, per
//! DID, what the simulator did. The manifest is that list, served at `GET /_sim/manifest` and
//! written to a file by `riptide sim --manifest FILE`.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::str::FromStr;

use riptide_gen::hosts::{hash, HostSplit};
use serde::Serialize;

/// A fault of a whole host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum HostFault {
    /// Its port is closed (connections refused); `listHosts` still lists it (the relay's view
    /// is stale), with status `offline`.
    Offline,
    /// Every request answered `503` (`InternalServerError`).
    #[serde(rename = "5xx")]
    Error5xx,
    /// Every `getRepo` body trickles at the trickle rate.
    Trickle,
}

/// A fault of one repository.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RepoFault {
    /// `getRepo` answers a byte prefix of the export that ends exactly at a block boundary
    /// (half of its blocks), with a `Content-Length` of that prefix.
    CutAtBlock,
    /// `getRepo` answers another account's (valid) export.
    OtherDid,
    /// The commit's signature has one byte changed (CID and CAR root recomputed).
    BadSignature,
    /// The export's last block (a record) is left out.
    MissingBlock,
    /// `getRepo` answers `500` (`InternalServerError`), every time.
    #[serde(rename = "5xx")]
    Error5xx,
    /// The `getRepo` body trickles at the trickle rate.
    Trickle,
    /// `listRepos` says `active: false, status: "deactivated"`; `getRepo` answers `400`
    /// `RepoDeactivated`.
    Deactivated,
    /// `listRepos` says `active: false, status: "takendown"`; `getRepo` answers `400`
    /// `RepoTakendown`.
    Takendown,
}

impl HostFault {
    const ALL: [(HostFault, &'static str); 3] = [
        (HostFault::Offline, "offline"),
        (HostFault::Error5xx, "5xx"),
        (HostFault::Trickle, "trickle"),
    ];
}

impl RepoFault {
    const ALL: [(RepoFault, &'static str); 8] = [
        (RepoFault::CutAtBlock, "cut-at-block"),
        (RepoFault::OtherDid, "other-did"),
        (RepoFault::BadSignature, "bad-signature"),
        (RepoFault::MissingBlock, "missing-block"),
        (RepoFault::Error5xx, "5xx"),
        (RepoFault::Trickle, "trickle"),
        (RepoFault::Deactivated, "deactivated"),
        (RepoFault::Takendown, "takendown"),
    ];

    /// The `status` `listRepos` gives, if the account is not active.
    pub fn status(self) -> Option<&'static str> {
        match self {
            RepoFault::Deactivated => Some("deactivated"),
            RepoFault::Takendown => Some("takendown"),
            _ => None,
        }
    }
}

macro_rules! names {
    ($t:ty) => {
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                let name = <$t>::ALL
                    .iter()
                    .find(|(k, _)| k == self)
                    .map_or("?", |(_, n)| n);
                f.write_str(name)
            }
        }

        impl FromStr for $t {
            type Err = PlanError;
            fn from_str(s: &str) -> Result<Self, PlanError> {
                <$t>::ALL
                    .iter()
                    .find(|(_, n)| *n == s)
                    .map(|(k, _)| *k)
                    .ok_or_else(|| PlanError::UnknownFault {
                        name: s.to_owned(),
                        known: <$t>::ALL
                            .iter()
                            .map(|(_, n)| *n)
                            .collect::<Vec<_>>()
                            .join(", "),
                    })
            }
        }
    };
}
names!(HostFault);
names!(RepoFault);

/// Why a plan cannot be made.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum PlanError {
    /// A fault name that is not one of the known ones.
    #[error("unknown fault {name:?} (known: {known})")]
    UnknownFault {
        /// The name given.
        name: String,
        /// The names known.
        known: String,
    },
    /// A `KIND=COUNT` list item that does not parse.
    #[error("{0:?} is not KIND=COUNT")]
    BadItem(String),
    /// More faults asked for than there are hosts or repositories to give them to.
    #[error("{asked} {what} faults asked for, but only {available} can have one")]
    TooMany {
        /// `host` or `repository`.
        what: &'static str,
        /// How many were asked for.
        asked: usize,
        /// How many candidates there are.
        available: usize,
    },
}

/// Parses `KIND=COUNT,KIND=COUNT` (empty: none).
pub fn parse_counts<K: FromStr<Err = PlanError>>(s: &str) -> Result<Vec<(K, usize)>, PlanError> {
    s.split(',')
        .map(str::trim)
        .filter(|i| !i.is_empty())
        .map(|item| {
            let (k, n) = item
                .split_once('=')
                .ok_or_else(|| PlanError::BadItem(item.to_owned()))?;
            let n = n
                .trim()
                .parse()
                .map_err(|_| PlanError::BadItem(item.to_owned()))?;
            Ok((k.trim().parse()?, n))
        })
        .collect()
}

/// What to build: hosts, limits, faults.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanConfig {
    /// PDS hosts (1: the simulator's own address is the one PDS, as before `--hosts`).
    pub hosts: usize,
    /// Share of the accounts on host 0 (the rest on hosts 1… with weights 1/k).
    pub host_share: f64,
    /// Seed of the host split and of the choice of faulty hosts and repositories.
    pub seed: u64,
    /// `getRepo` requests per second per client IP per host (0: no limit).
    pub get_repo_per_sec: u32,
    /// `listRepos` requests per second per client IP per host (0: no limit).
    pub list_repos_per_sec: u32,
    /// Host faults and how many hosts get each (never host 0, the large one).
    pub host_faults: Vec<(HostFault, usize)>,
    /// Repository faults and how many repositories get each (on hosts without a fault).
    pub repo_faults: Vec<(RepoFault, usize)>,
    /// Bytes per second of a trickling body.
    pub trickle_bytes_per_sec: u64,
}

impl Default for PlanConfig {
    fn default() -> PlanConfig {
        PlanConfig {
            hosts: 1,
            host_share: riptide_gen::hosts::DEFAULT_SHARE,
            seed: 0,
            get_repo_per_sec: 0,
            list_repos_per_sec: 0,
            host_faults: Vec::new(),
            repo_faults: Vec::new(),
            trickle_bytes_per_sec: 2048,
        }
    }
}

/// The decisions: per host its fault, per account its host and fault.
#[derive(Debug, Clone, Default)]
pub struct Plan {
    /// Per host, its fault.
    pub host_faults: Vec<Option<HostFault>>,
    /// Per account (with a repository), its host.
    pub host_of: HashMap<String, usize>,
    /// Per host, its accounts' DIDs, ascending.
    pub accounts: Vec<Vec<String>>,
    /// Faulty repositories.
    pub repo_faults: BTreeMap<String, RepoFault>,
}

impl Plan {
    /// Decides for `dids` (every account with a repository), of which `deactivated` are
    /// deactivated by the stream itself (they get [`RepoFault::Deactivated`] and no other) and
    /// `spared` get no fault (the repository generated on demand).
    pub fn new(
        cfg: &PlanConfig,
        dids: &[String],
        deactivated: &[String],
        spared: &[String],
    ) -> Result<Plan, PlanError> {
        let n = cfg.hosts.max(1);
        let split = HostSplit::new(n, cfg.host_share, cfg.seed);
        let mut plan = Plan {
            host_faults: vec![None; n],
            accounts: vec![Vec::new(); n],
            ..Plan::default()
        };
        let mut sorted = dids.to_vec();
        sorted.sort();
        sorted.dedup();
        for d in &sorted {
            let h = split.host_of(d);
            plan.host_of.insert(d.clone(), h);
            plan.accounts[h].push(d.clone());
        }
        // Host faults: hosts 1… in an order drawn from the seed.
        let mut hosts: Vec<usize> = (1..n).collect();
        hosts.sort_by_key(|&h| hash(cfg.seed ^ 0x686f_7374, &(h as u64).to_le_bytes()));
        let asked: usize = cfg.host_faults.iter().map(|(_, c)| c).sum();
        if asked > hosts.len() {
            return Err(PlanError::TooMany {
                what: "host",
                asked,
                available: hosts.len(),
            });
        }
        let mut next = hosts.into_iter();
        for &(f, count) in &cfg.host_faults {
            for h in next.by_ref().take(count) {
                plan.host_faults[h] = Some(f);
            }
        }
        for d in deactivated {
            if plan.host_of.contains_key(d) {
                plan.repo_faults.insert(d.clone(), RepoFault::Deactivated);
            }
        }
        // Repository faults: accounts on healthy hosts, not already faulty, in an order drawn
        // from the seed.
        let mut candidates: Vec<&String> = sorted
            .iter()
            .filter(|d| plan.host_faults[plan.host_of[*d]].is_none())
            .filter(|d| !plan.repo_faults.contains_key(*d) && !spared.contains(d))
            .collect();
        candidates.sort_by_key(|d| hash(cfg.seed ^ 0x7265_706f, d.as_bytes()));
        let asked: usize = cfg.repo_faults.iter().map(|(_, c)| c).sum();
        if asked > candidates.len() {
            return Err(PlanError::TooMany {
                what: "repository",
                asked,
                available: candidates.len(),
            });
        }
        let mut next = candidates.into_iter();
        for &(f, count) in &cfg.repo_faults {
            for d in next.by_ref().take(count) {
                plan.repo_faults.insert(d.clone(), f);
            }
        }
        Ok(plan)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_assigns_deterministically() {
        let rf: Vec<(RepoFault, usize)> =
            parse_counts("bad-signature=2, cut-at-block=1,5xx=1").unwrap();
        assert_eq!(
            rf,
            [
                (RepoFault::BadSignature, 2),
                (RepoFault::CutAtBlock, 1),
                (RepoFault::Error5xx, 1)
            ]
        );
        assert!(matches!(
            parse_counts::<RepoFault>("nope=1"),
            Err(PlanError::UnknownFault { .. })
        ));
        assert!(matches!(
            parse_counts::<HostFault>("offline"),
            Err(PlanError::BadItem(_))
        ));
        assert_eq!(RepoFault::Error5xx.to_string(), "5xx");
        assert_eq!(
            serde_json::to_value(RepoFault::CutAtBlock).unwrap(),
            "cut-at-block"
        );

        let dids: Vec<String> = (0..200).map(|i| format!("did:plc:{i:024}")).collect();
        let cfg = PlanConfig {
            hosts: 6,
            host_faults: vec![(HostFault::Offline, 1), (HostFault::Error5xx, 1)],
            repo_faults: rf,
            ..PlanConfig::default()
        };
        let plan = Plan::new(&cfg, &dids, &dids[..1], &dids[1..2]).unwrap();
        assert_eq!(plan.host_faults[0], None);
        assert_eq!(plan.host_faults.iter().flatten().count(), 2);
        assert_eq!(plan.repo_faults.len(), 5);
        assert_eq!(plan.repo_faults[&dids[0]], RepoFault::Deactivated);
        assert!(!plan.repo_faults.contains_key(&dids[1]));
        for d in plan.repo_faults.keys() {
            if d != &dids[0] {
                assert_eq!(plan.host_faults[plan.host_of[d]], None, "{d}");
            }
        }
        assert_eq!(plan.accounts.iter().map(Vec::len).sum::<usize>(), 200);
        let again = Plan::new(&cfg, &dids, &dids[..1], &dids[1..2]).unwrap();
        assert_eq!(again.repo_faults, plan.repo_faults);
        assert_eq!(again.host_faults, plan.host_faults);
        let too_many = PlanConfig {
            host_faults: vec![(HostFault::Offline, 6)],
            ..cfg
        };
        assert!(matches!(
            Plan::new(&too_many, &dids, &[], &[]),
            Err(PlanError::TooMany { what: "host", .. })
        ));
    }
}
