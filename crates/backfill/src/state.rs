//! Durable progress in a small fjall keyspace: per-repository status, per-listing cursors,
//! counters, and the sink's position.
//!
//! Why fjall: the store and serve use it already; one batch commits several partitions
//! atomically with one fsync, which is the whole durability contract here.
//!
//! Durability (the contract behind "kill -9 neither loses nor repeats a repository"): a
//! repository's status is committed in the same batch as the counters and the sink's position,
//! and only after the sink has made that repository's output durable (the writer in `run`
//! calls [`crate::Sink::commit`] first, then [`State::commit`]). A listing's cursor is committed
//! only after every repository of the pages before it has a committed status. So after a crash:
//! a repository with a status has its output; one without has none (the sink rolls back to the
//! position in the state, [`crate::Sink::recover`]); and a restart resumes each listing at its
//! last cursor, skipping the repositories that already have a status.
//!
//! Partitions: `repos` (DID → [`RepoStatus`] as JSON), `failed` (DID → the failure, for listing
//! failures without a scan of every repository), `listings` (listing key → [`Listing`]), `meta`
//! (`counters` → [`Counters`], `sink` → the sink's position).
//!
//! Creation: fjall creates a partition in several steps, so a `kill -9` while a new keyspace was
//! being made left one it could not open again (found by the CLI's kill test, killed 200 ms
//! into a first run). A new state's keyspace is therefore built whole under
//! `DIR/keyspace.creating` and renamed to `DIR/keyspace`; a leftover `.creating` is removed (no
//! commit can have reached it). A state made before this (its keyspace directly in `DIR`) is
//! opened where it is.
//!
//! Concurrency: one writer (the run's writer thread) commits repository statuses and counters;
//! listing cursors are written by the listing's own task. Both go through `&self`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Instant;

use fjall::{Config, Keyspace, PartitionCreateOptions, PartitionHandle, PersistMode};
use serde::{Deserialize, Serialize};

use crate::outcome::{FailKind, Failure, Verified};

/// Why the state could not be read or written: local corruption or I/O, which stops the run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StateError {
    /// fjall failed.
    #[error("backfill state {path}: {source}")]
    Store {
        /// The state directory.
        path: PathBuf,
        /// The error.
        source: fjall::Error,
    },
    /// A value in the state is not what this version writes.
    #[error("backfill state {path}: {key}: {why}")]
    Corrupt {
        /// The state directory.
        path: PathBuf,
        /// The key.
        key: String,
        /// What is wrong.
        why: String,
    },
}

/// A repository's status.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum RepoStatus {
    /// Verified and its records written.
    Ok {
        /// The rev backfilled.
        rev: String,
        /// Records written.
        records: u64,
        /// Bytes of the CAR.
        bytes: u64,
    },
    /// Not backfilled.
    Failed {
        /// [`FailKind::reason`].
        reason: String,
        /// What exactly.
        detail: String,
        /// Fetch attempts made.
        attempts: u32,
    },
}

/// A listing's progress (a host's `listRepos`, the relay's, a collection's, a DID file).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Listing {
    /// The cursor after the last page whose repositories all have a status.
    pub cursor: Option<String>,
    /// Every page done.
    pub done: bool,
    /// Accounts the relay's `listHosts` said the host has.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accounts: Option<u64>,
    /// The host's status in `listHosts` when it is not crawled (`banned`), or why the listing
    /// failed (an unreachable host): reported, never silently skipped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
}

/// Totals, committed with the statuses they count.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counters {
    /// Repositories backfilled.
    pub ok: u64,
    /// Repositories failed, by [`FailKind::reason`].
    pub failed: BTreeMap<String, u64>,
    /// Records written.
    pub records: u64,
    /// Records not written: outside the data model (as Jetstream drops them).
    pub records_dropped: u64,
    /// Bytes of verified CARs.
    pub bytes: u64,
    /// Time spent running, over all runs, in milliseconds.
    pub elapsed_ms: u64,
}

/// One repository finished, for [`State::commit`].
#[derive(Debug)]
pub struct Done {
    /// The account.
    pub did: String,
    /// Its status.
    pub status: RepoStatus,
    /// Records not written (outside the data model).
    pub dropped: u64,
}

impl Done {
    /// A verified repository whose `records` were written.
    pub fn ok(v: &Verified, records: u64, dropped: u64) -> Done {
        Done {
            did: v.did.clone(),
            status: RepoStatus::Ok {
                rev: v.rev.clone(),
                records,
                bytes: v.bytes,
            },
            dropped,
        }
    }

    /// What the sink says it really wrote, once durable ([`crate::Sink::recount`]), in place
    /// of what it said when written.
    pub fn recount(&mut self, w: Option<crate::Written>) {
        let Some(w) = w else { return };
        if let RepoStatus::Ok { records, .. } = &mut self.status {
            *records = w.records;
            self.dropped = w.dropped;
        }
    }

    /// A failure after `attempts` attempts.
    pub fn failed(f: &Failure, attempts: u32) -> Done {
        Done {
            did: f.did.clone(),
            status: RepoStatus::Failed {
                reason: f.kind.reason().to_owned(),
                detail: f.detail.clone(),
                attempts,
            },
            dropped: 0,
        }
    }
}

/// The backfill's state directory.
pub struct State {
    path: PathBuf,
    ks: Keyspace,
    repos: PartitionHandle,
    failed: PartitionHandle,
    listings: PartitionHandle,
    meta: PartitionHandle,
    counters: Mutex<Counters>,
    /// `elapsed_ms` at open, and when this run started.
    run: (u64, Instant),
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State").field("path", &self.path).finish()
    }
}

const COUNTERS: &str = "counters";
/// The keyspace's directory inside the state directory.
const KEYSPACE: &str = "keyspace";
/// Every partition, created together.
const PARTITIONS: [&str; 4] = ["repos", "failed", "listings", "meta"];
const SINK: &str = "sink";

impl State {
    /// Whether `dir` holds a state (made by [`State::open`]).
    pub fn exists(dir: &Path) -> bool {
        dir.join(KEYSPACE).join("version").exists() || dir.join("version").exists()
    }

    /// Creates the keyspace of a new state whole, or not at all (module docs, "Creation"):
    /// built under `DIR/keyspace.creating` with every partition, made durable, then renamed to
    /// `DIR/keyspace`.
    fn create(dir: &Path, ks_dir: &Path) -> Result<(), StateError> {
        let io = |e: std::io::Error| StateError::Corrupt {
            path: dir.to_owned(),
            key: KEYSPACE.to_owned(),
            why: format!("creating the state: {e}"),
        };
        let err = |source| StateError::Store {
            path: dir.to_owned(),
            source,
        };
        let tmp = dir.join(format!("{KEYSPACE}.creating"));
        if tmp.exists() {
            // An earlier creation that did not finish: nothing was ever committed to it.
            std::fs::remove_dir_all(&tmp).map_err(io)?;
        }
        {
            let ks = Config::new(&tmp).open().map_err(err)?;
            for name in PARTITIONS {
                ks.open_partition(name, PartitionCreateOptions::default())
                    .map_err(err)?;
            }
            ks.persist(PersistMode::SyncAll).map_err(err)?;
        }
        std::fs::rename(&tmp, ks_dir).map_err(io)?;
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(io)
    }

    /// Opens (or creates) the state in `dir`.
    pub fn open(dir: &Path) -> Result<State, StateError> {
        // A state from before the keyspace had its own directory is opened where it is.
        let ks_dir = if dir.join("version").exists() {
            dir.to_owned()
        } else {
            let ks_dir = dir.join(KEYSPACE);
            if !ks_dir.exists() {
                std::fs::create_dir_all(dir).map_err(|e| StateError::Corrupt {
                    path: dir.to_owned(),
                    key: KEYSPACE.to_owned(),
                    why: format!("creating the state: {e}"),
                })?;
                Self::create(dir, &ks_dir)?;
            }
            ks_dir
        };
        let err = |source| StateError::Store {
            path: dir.to_owned(),
            source,
        };
        let ks = Config::new(&ks_dir).open().map_err(err)?;
        let open = |name: &str| {
            ks.open_partition(name, PartitionCreateOptions::default())
                .map_err(err)
        };
        let [repos, failed, listings, meta] = PARTITIONS.map(open);
        let (repos, failed, listings, meta) = (repos?, failed?, listings?, meta?);
        let mut st = State {
            path: dir.to_owned(),
            ks,
            repos,
            failed,
            listings,
            meta,
            counters: Mutex::default(),
            run: (0, Instant::now()),
        };
        let counters: Counters = st.read_json(&st.meta, COUNTERS)?.unwrap_or_default();
        st.run = (counters.elapsed_ms, Instant::now());
        st.counters = Mutex::new(counters);
        Ok(st)
    }

    fn err(&self, source: fjall::Error) -> StateError {
        StateError::Store {
            path: self.path.clone(),
            source,
        }
    }

    fn read_json<T: serde::de::DeserializeOwned>(
        &self,
        p: &PartitionHandle,
        key: &str,
    ) -> Result<Option<T>, StateError> {
        let Some(v) = p.get(key).map_err(|e| self.err(e))? else {
            return Ok(None);
        };
        serde_json::from_slice(&v)
            .map(Some)
            .map_err(|e| StateError::Corrupt {
                path: self.path.clone(),
                key: key.to_owned(),
                why: e.to_string(),
            })
    }

    /// `did`'s status, if it has one.
    pub fn repo(&self, did: &str) -> Result<Option<RepoStatus>, StateError> {
        self.read_json(&self.repos, did)
    }

    /// A listing's progress.
    pub fn listing(&self, key: &str) -> Result<Listing, StateError> {
        Ok(self.read_json(&self.listings, key)?.unwrap_or_default())
    }

    /// Commits a listing's progress (durably: a cursor is only written after the statuses of
    /// the repositories before it, module docs).
    pub fn set_listing(&self, key: &str, l: &Listing) -> Result<(), StateError> {
        let v = serde_json::to_vec(l).unwrap_or_default();
        let mut b = self.ks.batch().durability(Some(PersistMode::SyncAll));
        b.insert(&self.listings, key, v);
        b.commit().map_err(|e| self.err(e))
    }

    /// The sink's position at the last commit.
    pub fn sink_position(&self) -> Result<Option<Vec<u8>>, StateError> {
        Ok(self
            .meta
            .get(SINK)
            .map_err(|e| self.err(e))?
            .map(|v| v.to_vec()))
    }

    /// Commits `done` with the counters and the sink's `position`, in one durable batch.
    pub fn commit(&self, done: &[Done], position: &[u8]) -> Result<(), StateError> {
        let mut c = self
            .counters
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut next = c.clone();
        let mut b = self.ks.batch().durability(Some(PersistMode::SyncAll));
        for d in done {
            // A repository retried after a failure (`--retry-failed`) leaves that count.
            if let Some(RepoStatus::Failed { reason, .. }) = self.repo(&d.did)? {
                if let Some(n) = next.failed.get_mut(&reason) {
                    *n = n.saturating_sub(1);
                }
                b.remove(&self.failed, d.did.as_str());
            }
            match &d.status {
                RepoStatus::Ok { records, bytes, .. } => {
                    next.ok += 1;
                    next.records += records;
                    next.bytes += bytes;
                }
                RepoStatus::Failed { reason, detail, .. } => {
                    *next.failed.entry(reason.clone()).or_default() += 1;
                    b.insert(&self.failed, d.did.as_str(), format!("{reason}\t{detail}"));
                }
            }
            next.records_dropped += d.dropped;
            b.insert(
                &self.repos,
                d.did.as_str(),
                serde_json::to_vec(&d.status).unwrap_or_default(),
            );
        }
        next.elapsed_ms = self.run.0 + self.run.1.elapsed().as_millis() as u64;
        b.insert(
            &self.meta,
            COUNTERS,
            serde_json::to_vec(&next).unwrap_or_default(),
        );
        b.insert(&self.meta, SINK, position);
        b.commit().map_err(|e| self.err(e))?;
        *c = next;
        Ok(())
    }

    /// The counters as last committed.
    pub fn counters(&self) -> Counters {
        self.counters
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Every listing and its progress.
    pub fn listings(&self) -> Result<Vec<(String, Listing)>, StateError> {
        let mut out = Vec::new();
        for kv in self.listings.iter() {
            let (k, v) = kv.map_err(|e| self.err(e))?;
            let key = String::from_utf8_lossy(&k).into_owned();
            let l = serde_json::from_slice(&v).map_err(|e| StateError::Corrupt {
                path: self.path.clone(),
                key: key.clone(),
                why: e.to_string(),
            })?;
            out.push((key, l));
        }
        Ok(out)
    }

    /// Up to `limit` failed repositories: DID, reason, detail.
    pub fn failures(&self, limit: usize) -> Result<Vec<(String, String, String)>, StateError> {
        let mut out = Vec::new();
        for kv in self.failed.iter().take(limit) {
            let (k, v) = kv.map_err(|e| self.err(e))?;
            let v = String::from_utf8_lossy(&v);
            let (reason, detail) = v.split_once('\t').unwrap_or((&v, ""));
            out.push((
                String::from_utf8_lossy(&k).into_owned(),
                reason.to_owned(),
                detail.to_owned(),
            ));
        }
        Ok(out)
    }
}

/// Whether a status is final for this run: `ok` always; a failure unless failures are retried.
pub fn is_final(s: &RepoStatus, retry_failed: bool) -> bool {
    match s {
        RepoStatus::Ok { .. } => true,
        RepoStatus::Failed { .. } => !retry_failed,
    }
}

/// `reason` as a kind, for status output (unknown names are kept as they are).
pub fn kind_named(reason: &str) -> Option<FailKind> {
    FailKind::from_reason(reason)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outcome::FailKind;

    /// A creation killed half-way (a partition without its files, as fjall leaves one) is
    /// made again; a state from before the keyspace's own directory still opens where it is.
    #[test]
    fn a_creation_cut_short_is_made_again_and_old_states_still_open() {
        let dir = tempfile::tempdir().unwrap();
        let half = dir.path().join("keyspace.creating/partitions/listings");
        std::fs::create_dir_all(&half).unwrap();
        std::fs::write(half.join("config"), b"").unwrap();
        assert!(!State::exists(dir.path()));
        let st = State::open(dir.path()).unwrap();
        st.set_listing("relay", &Listing::default()).unwrap();
        drop(st);
        assert!(State::exists(dir.path()));
        assert!(!dir.path().join("keyspace.creating").exists());
        assert!(State::open(dir.path()).is_ok());

        let old = tempfile::tempdir().unwrap();
        {
            let ks = Config::new(old.path()).open().unwrap();
            let meta = ks
                .open_partition("meta", PartitionCreateOptions::default())
                .unwrap();
            let c = Counters {
                ok: 7,
                ..Counters::default()
            };
            meta.insert(COUNTERS, serde_json::to_vec(&c).unwrap())
                .unwrap();
            ks.persist(PersistMode::SyncAll).unwrap();
        }
        assert!(State::exists(old.path()));
        assert_eq!(State::open(old.path()).unwrap().counters().ok, 7);
        assert!(!old.path().join(KEYSPACE).exists());
    }

    #[test]
    fn statuses_counters_and_position_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        {
            let st = State::open(dir.path()).unwrap();
            assert_eq!(st.repo("did:plc:a").unwrap(), None);
            let f = Failure::new("did:plc:b", FailKind::BadSignature, "forged");
            st.commit(
                &[
                    Done {
                        did: "did:plc:a".into(),
                        status: RepoStatus::Ok {
                            rev: "3l".into(),
                            records: 5,
                            bytes: 900,
                        },
                        dropped: 1,
                    },
                    Done::failed(&f, 1),
                ],
                b"\x10",
            )
            .unwrap();
            st.set_listing(
                "relay",
                &Listing {
                    cursor: Some("did:plc:b".into()),
                    ..Listing::default()
                },
            )
            .unwrap();
        }
        let st = State::open(dir.path()).unwrap();
        let c = st.counters();
        assert_eq!(
            (c.ok, c.records, c.records_dropped, c.bytes),
            (1, 5, 1, 900)
        );
        assert_eq!(c.failed.get("bad_signature"), Some(&1));
        assert_eq!(st.sink_position().unwrap().as_deref(), Some(&b"\x10"[..]));
        assert_eq!(
            st.listing("relay").unwrap().cursor.as_deref(),
            Some("did:plc:b")
        );
        assert_eq!(
            st.failures(10).unwrap(),
            vec![(
                "did:plc:b".to_owned(),
                "bad_signature".to_owned(),
                "forged".to_owned()
            )]
        );
        // Retried and now good: the failure count and list drop it.
        st.commit(
            &[Done {
                did: "did:plc:b".into(),
                status: RepoStatus::Ok {
                    rev: "3m".into(),
                    records: 2,
                    bytes: 100,
                },
                dropped: 0,
            }],
            b"\x20",
        )
        .unwrap();
        let c = st.counters();
        assert_eq!((c.ok, c.failed.get("bad_signature")), (2, Some(&0)));
        assert!(st.failures(10).unwrap().is_empty());
        assert!(is_final(&st.repo("did:plc:b").unwrap().unwrap(), true));
    }
}
