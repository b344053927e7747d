//! A local copy of the PLC directory: every DID's folded state in a fjall keyspace, filled
//! from the directory's `/export` ([`crate::plc_export`]) and read by the resolver instead of
//! the network ([`crate::ResolverConfig::plc_mirror`]).
//!
//! Why: a crawl of the network resolves ≈ 40M `did:plc` DIDs, ≈ 730 a second from one machine
//! for the crawl's rate bound (bench/README.md, "Extrapolation"); the public directory does not
//! serve one address that. Its `/export` pages through every operation ever made, so one pass
//! (resumable) gives a copy that answers lookups at disk speed.
//!
//! What is stored: per DID, its [`Chain`] (the head state and the operations a recovery could
//! still fork from) as JSON in partition `dids`; in `meta`, the export cursor and the
//! [`MirrorCounts`]. Operations are checked by `riptide_identity::plc` before they are applied;
//! a refused one is counted by reason and changes nothing.
//!
//! Durability (the contract behind "kill -9 neither loses nor repeats an operation"): a page of
//! the export is applied as one fjall batch holding every DID it changed, the cursor after its
//! last line and the counters, committed with an fsync. After a crash the mirror is as of the
//! last page committed, and the next run asks for the page after its cursor. An operation seen
//! twice (a directory repeating itself) is refused as a duplicate, not applied twice.
//!
//! Creation: the keyspace is built whole under `DIR/keyspace.creating` and renamed, so a kill
//! while fjall creates its partitions leaves nothing half made (the lesson of the backfill
//! state, `riptide_backfill::state`).
//!
//! One process at a time: fjall locks the keyspace, so a backfill reading the mirror runs after
//! (or between) `riptide plc mirror` runs, not during one.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use fjall::{Config, Keyspace, PartitionCreateOptions, PartitionHandle, PersistMode};
use riptide_identity::plc::{created_at_ms, Chain, DidCheck, PlcOp, Refusal};
use serde_json::Value;

const KEYSPACE: &str = "keyspace";
const CURSOR: &str = "cursor";
const COUNTS: &str = "counts";

/// Why the mirror could not be read or written (local I/O or corruption: stops the caller).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MirrorError {
    /// fjall failed.
    #[error("PLC mirror {path}: {source}")]
    Store {
        /// The mirror's directory.
        path: PathBuf,
        /// The error.
        source: fjall::Error,
    },
    /// The directory could not be made.
    #[error("PLC mirror {path}: {source}")]
    Io {
        /// The mirror's directory.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A stored value is not what this version writes.
    #[error("PLC mirror {path}: {key}: {why}")]
    Corrupt {
        /// The mirror's directory.
        path: PathBuf,
        /// The key.
        key: String,
        /// What is wrong.
        why: String,
    },
}

/// What the mirror has applied and refused, over all its runs (committed with the operations).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MirrorCounts {
    /// Export lines read (operations, applied or not).
    pub operations: u64,
    /// Operations applied.
    pub applied: u64,
    /// DIDs with a genesis operation applied.
    pub dids: u64,
    /// Operations nullified by a recovery.
    pub nullified: u64,
    /// Genesis operations applied whose DID is not derived from them (only with
    /// `DidCheck::Count`, for a simulated directory).
    pub did_underived: u64,
    /// Operations refused, by reason (`Refusal::reason`, and `bad_line` for a line that is not
    /// an export entry).
    pub refused: BTreeMap<String, u64>,
    /// Pages committed.
    pub pages: u64,
}

/// The mirror's answer for a DID.
#[derive(Debug, Clone, PartialEq)]
pub enum MirrorDoc {
    /// Its DID document, as the directory would serve it.
    Doc(Value),
    /// The DID is tombstoned.
    Tombstoned,
}

/// A page applied: what [`PlcMirror::apply_page`] saw.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PageOutcome {
    /// Lines in the page.
    pub lines: usize,
    /// The cursor after it (unchanged if the page was empty).
    pub cursor: Option<String>,
}

/// The mirror (cheap to share behind an `Arc`; reads are `&self`).
pub struct PlcMirror {
    path: PathBuf,
    ks: Keyspace,
    dids: PartitionHandle,
    meta: PartitionHandle,
    /// Lookups answered ([`PlcMirror::lookup`]): found, not found.
    hits: AtomicU64,
    misses: AtomicU64,
    /// Documents asked of the directory past the mirror after a repository failed with the
    /// mirror's ([`PlcMirror::note_recheck`]), and of those, how many differed (stale).
    rechecked: AtomicU64,
    stale: AtomicU64,
}

impl std::fmt::Debug for PlcMirror {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PlcMirror({})", self.path.display())
    }
}

/// One `/export` line, parsed as far as the mirror needs before the operation's checks.
struct Line<'a> {
    did: &'a str,
    cid: &'a str,
    created_at: &'a str,
    op: &'a Value,
    /// The line's cursor: its `seq` if it has one, else its `createdAt`.
    cursor: String,
}

fn line(v: &Value) -> Option<Line<'_>> {
    let s = |k: &str| v.get(k).and_then(Value::as_str);
    let created_at = s("createdAt")?;
    Some(Line {
        did: s("did")?,
        cid: s("cid")?,
        created_at,
        op: v.get("operation")?,
        cursor: match v.get("seq").and_then(Value::as_u64) {
            Some(seq) => seq.to_string(),
            None => created_at.to_owned(),
        },
    })
}

impl PlcMirror {
    /// Opens (or creates) the mirror in `dir`.
    pub fn open(dir: &Path) -> Result<PlcMirror, MirrorError> {
        let io = |source| MirrorError::Io {
            path: dir.to_owned(),
            source,
        };
        let store = |source| MirrorError::Store {
            path: dir.to_owned(),
            source,
        };
        let ks_dir = dir.join(KEYSPACE);
        if !ks_dir.exists() {
            std::fs::create_dir_all(dir).map_err(io)?;
            let tmp = dir.join(format!("{KEYSPACE}.creating"));
            if tmp.exists() {
                std::fs::remove_dir_all(&tmp).map_err(io)?;
            }
            {
                let ks = Config::new(&tmp).open().map_err(store)?;
                for name in ["dids", "meta"] {
                    ks.open_partition(name, PartitionCreateOptions::default())
                        .map_err(store)?;
                }
                ks.persist(PersistMode::SyncAll).map_err(store)?;
            }
            std::fs::rename(&tmp, &ks_dir).map_err(io)?;
            std::fs::File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(io)?;
        }
        let ks = Config::new(&ks_dir).open().map_err(store)?;
        let part = |name| {
            ks.open_partition(name, PartitionCreateOptions::default())
                .map_err(store)
        };
        Ok(PlcMirror {
            dids: part("dids")?,
            meta: part("meta")?,
            ks,
            path: dir.to_owned(),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            rechecked: AtomicU64::new(0),
            stale: AtomicU64::new(0),
        })
    }

    fn store_err(&self, source: fjall::Error) -> MirrorError {
        MirrorError::Store {
            path: self.path.clone(),
            source,
        }
    }

    fn corrupt(&self, key: &str, why: impl std::fmt::Display) -> MirrorError {
        MirrorError::Corrupt {
            path: self.path.clone(),
            key: key.to_owned(),
            why: why.to_string(),
        }
    }

    /// The export cursor: where the next page starts (`None`: at the beginning).
    pub fn cursor(&self) -> Result<Option<String>, MirrorError> {
        let v = self.meta.get(CURSOR).map_err(|e| self.store_err(e))?;
        v.map(|b| String::from_utf8(b.to_vec()).map_err(|e| self.corrupt(CURSOR, e)))
            .transpose()
    }

    /// What has been applied and refused so far.
    pub fn counts(&self) -> Result<MirrorCounts, MirrorError> {
        match self.meta.get(COUNTS).map_err(|e| self.store_err(e))? {
            None => Ok(MirrorCounts::default()),
            Some(b) => serde_json::from_slice(&b).map_err(|e| self.corrupt(COUNTS, e)),
        }
    }

    /// `did`'s log as folded so far, if it has one.
    pub fn chain(&self, did: &str) -> Result<Option<Chain>, MirrorError> {
        let Some(b) = self.dids.get(did).map_err(|e| self.store_err(e))? else {
            return Ok(None);
        };
        let v: Value = serde_json::from_slice(&b).map_err(|e| self.corrupt(did, e))?;
        Chain::from_json(&v)
            .map(Some)
            .map_err(|e| self.corrupt(did, e))
    }

    /// `did`'s document from the mirror (`None`: not in it, counted as a miss).
    pub fn lookup(&self, did: &str) -> Result<Option<MirrorDoc>, MirrorError> {
        let found = self.chain(did)?.and_then(|c| match c.state() {
            Some(s) => Some(MirrorDoc::Doc(s.to_doc_json(did))),
            None if c.tombstoned() => Some(MirrorDoc::Tombstoned),
            None => None,
        });
        let counter = if found.is_some() {
            &self.hits
        } else {
            &self.misses
        };
        counter.fetch_add(1, Relaxed);
        Ok(found)
    }

    /// Lookups answered by [`PlcMirror::lookup`] so far: (found, not found).
    pub fn lookups(&self) -> (u64, u64) {
        (self.hits.load(Relaxed), self.misses.load(Relaxed))
    }

    /// Counts a document asked of the directory past the mirror (a repository failed with the
    /// mirror's: `Resolver::resolve_did_past_mirror`), and whether the directory's differed in
    /// what verification uses (the mirror was stale for that DID).
    pub fn note_recheck(&self, stale: bool) {
        self.rechecked.fetch_add(1, Relaxed);
        if stale {
            self.stale.fetch_add(1, Relaxed);
        }
    }

    /// Rechecks so far ([`PlcMirror::note_recheck`]): (asked, found stale).
    pub fn rechecks(&self) -> (u64, u64) {
        (self.rechecked.load(Relaxed), self.stale.load(Relaxed))
    }

    /// Applies one page of the export (JSON lines, in the export's order) and commits it, with
    /// the cursor after its last line and the counters, as one durable batch.
    pub fn apply_page(&self, body: &[u8], check: DidCheck) -> Result<PageOutcome, MirrorError> {
        let mut counts = self.counts()?;
        let mut chains: HashMap<String, Chain> = HashMap::new();
        let mut out = PageOutcome::default();
        let refuse = |counts: &mut MirrorCounts, reason: &str| {
            *counts.refused.entry(reason.to_owned()).or_default() += 1;
        };
        for text in body.split(|&b| b == b'\n') {
            if text.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            out.lines += 1;
            counts.operations += 1;
            let parsed: Option<Value> = serde_json::from_slice(text).ok();
            let Some(l) = parsed.as_ref().and_then(line) else {
                refuse(&mut counts, "bad_line");
                tracing::warn!(
                    line = %String::from_utf8_lossy(&text[..text.len().min(200)]),
                    "PLC export: a line that is not an export entry, refused"
                );
                continue;
            };
            out.cursor = Some(l.cursor.clone());
            if !chains.contains_key(l.did) {
                let c = self.chain(l.did)?.unwrap_or_default();
                chains.insert(l.did.to_owned(), c);
            }
            let chain = chains.get_mut(l.did).unwrap_or_else(|| unreachable!());
            let genesis = chain.entries.is_empty();
            let r: Result<_, Refusal> = PlcOp::parse(l.op)
                .and_then(|op| chain.apply(l.did, &op, l.cid, created_at_ms(l.created_at)?, check));
            match r {
                Ok(a) => {
                    counts.applied += 1;
                    counts.dids += u64::from(genesis);
                    counts.nullified += a.nullified as u64;
                    counts.did_underived += u64::from(a.did_underived);
                }
                Err(e) => {
                    refuse(&mut counts, e.reason());
                    tracing::debug!(did = l.did, cid = l.cid, error = %e, "PLC operation refused");
                }
            }
        }
        let Some(cursor) = &out.cursor else {
            return Ok(out);
        };
        counts.pages += 1;
        let mut b = self.ks.batch().durability(Some(PersistMode::SyncAll));
        for (did, chain) in &chains {
            if !chain.entries.is_empty() {
                b.insert(&self.dids, did.as_str(), chain.to_json().to_string());
            }
        }
        b.insert(&self.meta, CURSOR, cursor.as_str());
        let counts_json = serde_json::to_vec(&counts).map_err(|e| self.corrupt(COUNTS, e))?;
        b.insert(&self.meta, COUNTS, counts_json);
        b.commit().map_err(|e| self.store_err(e))?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests;
