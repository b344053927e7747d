//! `riptide serve --backfill`: the verified backfill (`riptide_backfill`) run beside ingest,
//! its repositories landing through ingest's writer (issue 37).
//!
//! Why through ingest and not beside it: the store has one writer (ingest's thread), one seq
//! space and one chain state per account, and a repository's rows must take their place among
//! the live events in upstream order, with the account's live commits verified on top of it.
//! So the crawl ([`riptide_backfill::run()`]) writes into an [`IngestSink`], which renders each
//! verified repository (one `create` event per record at its head rev, as `riptide backfill
//! --data` writes them) and hands it to the ingest pipeline as an [`Upstream::Backfill`]; the
//! account's verification worker takes it in order with the frames, and the writer stores its
//! events, the account's chain state and its progress entry (the store's `backfill` partition,
//! [`riptide_backfill::Landed`]) in the batch it lands in, then tells the sink. The backfill's
//! own state (`DATA/backfill`, as the standalone mode keeps it) commits a repository's status
//! only after that batch is durable, so `kill -9` at any moment and a restart neither lose nor
//! repeat a repository: one that landed but whose status was lost is found by its progress
//! entry and not handed over again.
//!
//! **Live frames are held as [`BackfillHold`] says**, as resync holds frames (`crate::resync`:
//! in the worker and, in the same batch as the upstream cursor that passes it, in the store's
//! `resync` partition, so a restart reloads it; bounded by the same limits, a frame past them
//! dropped with the verdict `resync-overflow`, after which the account's next commit breaks its
//! chain and the account is resynced). With [`BackfillHold::InFlight`] (the default) only the
//! accounts whose fetch is in flight are held ([`riptide_backfill::Fetching`]: an account enters
//! before its `getRepo` is asked, so whatever was served of it before is inside the repository,
//! and leaves when its repository lands or it is [`Upstream::BackfillSettled`]); the others are
//! served live. With [`BackfillHold::All`], every account with no verified commit is held from
//! the start of the crawl ([`Upstream::BackfillStart`], before any frame) to its end
//! ([`Upstream::BackfillOver`]). When the account's repository lands, its held frames are
//! verified on top of it in upstream order: those at or below its rev are `superseded`, the rest
//! are `ok` and served after the repository's events. A failed account's frames are released
//! when its failure is recorded, and verified as any live frame is.
//!
//! **Over an account with earlier rows** (commits served before its repository landed: live
//! before its fetch, or ingested by an earlier run) the repository lands as replacement rows
//! (`crate::replace`: a `#sync`, then one `create-resync` per record, v2 only), so a subscriber
//! can rebuild the account from the stream; one older than the stored tip (a stale source) gets
//! no rows, is counted as `superseded` (`riptide_backfill_superseded_total`) and its progress
//! entry says why, as `riptide backfill --data` does.
//!
//! Operators see the crawl on `/metrics` (`riptide_backfill_*`, the same numbers `riptide
//! backfill status --data DIR` prints) and on the status page's backfill row.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Mutex};

use riptide_backfill::{
    landed_in, Fetching, Landed, Progress, Sink, SinkError, Status, Verified, Written,
};
use riptide_cbor::CidBuf;
use riptide_jetstream::Projector;

use crate::ingest::{push_event, Part};
use crate::{Store, Upstream};

/// Whose live frames a backfill holds (module docs, "What a subscriber sees").
#[derive(Clone, Debug)]
pub enum BackfillHold {
    /// Every account with no verified commit, from the crawl's start to its end: exact against
    /// a network whose repositories are as of the relay's seq the stream starts from (the sim's
    /// `--repos-at`), but on the real network it fills the hold's bound in minutes.
    All,
    /// Only the accounts whose fetch is in flight (the crawl's [`Fetching`] set); the others'
    /// frames are verified and served live, and their repository lands over them later.
    InFlight(Arc<Fetching>),
}

/// The backfill's jobs for a verification worker, in upstream order with the frames.
pub(crate) enum BackfillJob {
    /// Hold the frames the mode says from now on.
    Start(BackfillHold),
    /// A repository lands.
    Repo(Arc<BackfillRepo>),
    /// No repository of this account will land: stop holding it, release its frames; whom to
    /// tell once that is durable.
    Settled(Box<str>, SyncSender<u64>),
    /// Stop holding; release what is held for the backfill.
    Over,
}

/// A verified repository rendered for ingest: its events' JSON pieces and rows, as a worker
/// renders a frame's, and whom to tell once it is durable.
pub struct BackfillRepo {
    pub(crate) did: Box<str>,
    pub(crate) rev: Box<str>,
    pub(crate) commit: CidBuf,
    pub(crate) data: CidBuf,
    /// The signed commit block (a replacement's `#sync` carries it).
    pub(crate) commit_block: Vec<u8>,
    /// The events' bytes; `parts` point into it.
    pub(crate) buf: Vec<u8>,
    pub(crate) parts: Vec<Part>,
    /// Records outside the atproto data model, not rendered.
    pub(crate) dropped: u64,
    /// The store holds pieces of an interrupted `riptide backfill --data` landing of the
    /// account ([`Landed::partial`]): earlier rows, replaced as served commits are.
    pub(crate) earlier_pieces: bool,
    pub(crate) ack: SyncSender<u64>,
}

impl std::fmt::Debug for BackfillRepo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BackfillRepo")
            .field("did", &self.did)
            .field("rev", &self.rev)
            .field("events", &self.parts.len())
            .finish()
    }
}

impl BackfillRepo {
    /// Its progress entry: landed with its events (`replaced`: over the account's earlier
    /// rows), or `superseded` (why) with none.
    pub(crate) fn landed(&self, superseded: Option<String>, replaced: bool) -> Vec<u8> {
        Landed {
            rev: self.rev.to_string(),
            records: if superseded.is_some() {
                0
            } else {
                self.parts.len() as u64
            },
            dropped: self.dropped,
            // The writer numbers the events; the entry is written before that.
            first_seq: None,
            superseded,
            replaced,
            partial: None,
        }
        .to_vec()
    }
}

/// The crawl's sink inside `riptide serve` (module docs): repositories to ingest, durable when
/// ingest's writer says so.
pub struct IngestSink {
    store: Store,
    tx: tokio::sync::mpsc::Sender<Upstream>,
    projector: Projector,
    /// The store's next seq when it was opened, then as the writer last said.
    next_seq: u64,
    /// Repositories handed over and not yet durable.
    waiting: Vec<Receiver<u64>>,
}

impl std::fmt::Debug for IngestSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IngestSink")
            .field("next_seq", &self.next_seq)
            .field("waiting", &self.waiting.len())
            .finish()
    }
}

impl IngestSink {
    /// Hands repositories to the ingest pipeline fed by `tx`, which writes into `store`, whose
    /// next seq was `next_seq` when opened.
    pub fn new(store: Store, tx: tokio::sync::mpsc::Sender<Upstream>, next_seq: u64) -> Self {
        IngestSink {
            store,
            tx,
            projector: Projector::new(),
            next_seq,
            waiting: Vec::new(),
        }
    }

    fn gone() -> SinkError {
        SinkError::Unavailable("ingest stopped before the repository was stored".into())
    }
}

impl Sink for IngestSink {
    fn recover(&mut self, position: Option<&[u8]>) -> Result<(), SinkError> {
        // Nothing to roll back (a batch is all or nothing); a store behind the state was
        // replaced, as `riptide_backfill::StoreSink` says.
        let Some(p) = position else {
            return Ok(());
        };
        let expected =
            u64::from_le_bytes(p.try_into().map_err(|_| SinkError::BadPosition(p.len()))?);
        if self.next_seq < expected {
            return Err(SinkError::StoreBehind {
                what: self.store.dir().display().to_string(),
                next_seq: self.next_seq,
                expected,
            });
        }
        Ok(())
    }

    fn write(&mut self, repo: &Verified) -> Result<Written, SinkError> {
        let landed = landed_in(&self.store, &repo.did)?;
        let earlier_pieces = landed.as_ref().is_some_and(|l| l.partial.is_some());
        if let Some(l) = landed.filter(|l| l.partial.is_none()) {
            tracing::debug!(did = %repo.did, rev = %l.rev, "backfill: already in the store (landed before a crash); not handed over again");
            // Frames held for it since the restart are released.
            self.settled(&repo.did)?;
            return Ok(Written {
                records: l.records,
                dropped: l.dropped,
            });
        }
        // The worker decides against the account's chain state when the repository lands; the
        // store's says the same for an account already known (its state only moves on, and an
        // account without one has its frames held), so the counts returned are what lands.
        let before = self
            .store
            .account(&repo.did)
            .map_err(|e| SinkError::Store {
                what: self.store.dir().display().to_string(),
                source: e,
            })?;
        let (checked, _) = riptide_firehose::chain::check_sync(
            before.as_ref(),
            &repo.rev,
            repo.commit.as_cid(),
            repo.data.as_cid(),
            crate::now_us().max(0) as u64,
        );
        let known = checked.is_err();
        let mut buf = Vec::new();
        let mut parts = Vec::new();
        let mut dropped = 0;
        for r in repo.records() {
            let row = repo.create_row(&r);
            match self.projector.project_row(&row) {
                Ok(p) => push_event(&mut buf, &mut parts, p, 0, Some(row.row(0, 0))),
                Err(_) => dropped += 1,
            }
        }
        if dropped > 0 {
            tracing::warn!(
                did = %repo.did, rev = %repo.rev, dropped,
                "backfill: records outside the atproto data model not served (counted as records_dropped)"
            );
        }
        let (ack, told) = sync_channel(1);
        let r = BackfillRepo {
            did: repo.did.as_str().into(),
            rev: repo.rev.as_str().into(),
            commit: repo.commit,
            data: repo.data,
            commit_block: repo.commit_block().map(|b| b.to_vec()).unwrap_or_default(),
            buf,
            parts,
            dropped,
            earlier_pieces,
            ack,
        };
        let w = Written {
            records: if known { 0 } else { r.parts.len() as u64 },
            dropped,
        };
        self.tx
            .blocking_send(Upstream::Backfill(Arc::new(r)))
            .map_err(|_| Self::gone())?;
        self.waiting.push(told);
        Ok(w)
    }

    fn commit(&mut self) -> Result<Vec<u8>, SinkError> {
        for told in self.waiting.drain(..) {
            let next = told.recv().map_err(|_| Self::gone())?;
            self.next_seq = self.next_seq.max(next);
        }
        Ok(self.next_seq.to_le_bytes().to_vec())
    }

    fn exact(&self) -> bool {
        true
    }

    fn settled(&mut self, did: &str) -> Result<(), SinkError> {
        // Waited for at the commit, as a landing is: a failure's status is durable only after
        // the release of its held frames is (else a restart would reload them and, the account
        // being done, hold them to the crawl's end).
        let (ack, told) = sync_channel(1);
        self.tx
            .blocking_send(Upstream::BackfillSettled(did.into(), ack))
            .map_err(|_| Self::gone())?;
        self.waiting.push(told);
        Ok(())
    }
}

/// What `/metrics` and the status page say of the backfill (module docs).
#[derive(Debug, Default)]
pub struct BackfillMetrics {
    /// Set while the crawl runs.
    pub running: AtomicBool,
    /// Set once the crawl has ended (every listing crawled; failures are listed by reason).
    pub finished: AtomicBool,
    /// Repositories whose events were stored through ingest.
    pub landed: AtomicU64,
    /// Repositories verified but not served: the store held a newer commit of the account.
    pub superseded: AtomicU64,
    /// The run's live counts.
    pub progress: Mutex<Option<Arc<Progress>>>,
    /// The durable state's report, refreshed every few seconds.
    pub status: Mutex<Option<Status>>,
    /// Why the crawl stopped early (a local failure: its state or the store).
    pub error: Mutex<Option<String>>,
    /// The accounts being fetched, when only those are held ([`BackfillHold::InFlight`]).
    pub fetching: Mutex<Option<Arc<Fetching>>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl BackfillMetrics {
    /// Whether `--backfill` was given (a crawl ran or runs).
    pub fn enabled(&self) -> bool {
        lock(&self.progress).is_some()
    }

    /// The last status report.
    pub fn status(&self) -> Option<Status> {
        lock(&self.status).clone()
    }

    /// Why the crawl stopped early, if it did.
    pub fn error(&self) -> Option<String> {
        lock(&self.error).clone()
    }

    /// The state's word for the status page: `running`, `finished`, `failed` or `off`.
    pub fn state(&self) -> &'static str {
        if !self.enabled() {
            "off"
        } else if self.error().is_some() {
            "failed"
        } else if self.finished.load(Relaxed) {
            "finished"
        } else {
            "running"
        }
    }

    /// Appends the `riptide_backfill_*` families (only with `--backfill`).
    pub(crate) fn render(&self, s: &mut String) {
        if !self.enabled() {
            return;
        }
        let one = |s: &mut String, name: &str, kind: &str, help: &str, v: String| {
            crate::metrics::sample(s, name, kind, help, v);
        };
        one(
            s,
            "riptide_backfill_running",
            "gauge",
            "1 while `serve --backfill`'s crawl runs.",
            (self.running.load(Relaxed) as u8).to_string(),
        );
        one(
            s,
            "riptide_backfill_landed_total",
            "counter",
            "Backfilled repositories whose events were stored (since start).",
            self.landed.load(Relaxed).to_string(),
        );
        if let Some(f) = lock(&self.fetching).as_ref() {
            one(
                s,
                "riptide_backfill_in_flight",
                "gauge",
                "Accounts whose repository is being fetched (their live frames held, with --backfill-hold in-flight).",
                f.len().to_string(),
            );
        }
        one(
            s,
            "riptide_backfill_superseded_total",
            "counter",
            "Backfilled repositories not served: the store held a newer commit of the account (since start).",
            self.superseded.load(Relaxed).to_string(),
        );
        if let Some(st) = self.status() {
            riptide_backfill::metrics::render_status(s, &st);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status() -> Status {
        Status {
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
        }
    }

    #[test]
    fn metrics_say_nothing_without_a_backfill_and_the_status_with_one() {
        let b = BackfillMetrics::default();
        let mut s = String::new();
        b.render(&mut s);
        assert!(s.is_empty(), "{s}");
        assert_eq!(b.state(), "off");

        *lock(&b.progress) = Some(Arc::default());
        b.running.store(true, Relaxed);
        b.landed.store(17, Relaxed);
        b.render(&mut s);
        assert!(s.contains("\nriptide_backfill_running 1\n"), "{s}");
        assert!(s.contains("\nriptide_backfill_landed_total 17\n"), "{s}");
        // No report read yet: only the live counts.
        assert!(!s.contains("riptide_backfill_repos_total"), "{s}");
        assert_eq!(b.state(), "running");

        *lock(&b.status) = Some(status());
        s.clear();
        b.render(&mut s);
        for line in [
            "riptide_backfill_listings{state=\"done\"} 2",
            "riptide_backfill_listings{state=\"problem\"} 1",
            "riptide_backfill_repos_total{outcome=\"ok\"} 17",
            "riptide_backfill_repos_total{outcome=\"bad_cid\"} 2",
            "riptide_backfill_repos_total{outcome=\"wrong_did\"} 1",
            "riptide_backfill_repos_total{outcome=\"timeout\"} 0",
            "riptide_backfill_records_total 901",
            "riptide_backfill_expected_repos 24",
            "riptide_backfill_eta_seconds 1",
        ] {
            assert!(s.contains(&format!("\n{line}\n")), "{line}: {s}");
        }
        // Each family once, with its type.
        assert_eq!(s.matches("# TYPE riptide_backfill_repos_total ").count(), 1);
        *lock(&b.error) = Some("state: disk full".into());
        assert_eq!(b.state(), "failed");
    }

    #[test]
    fn a_store_behind_the_state_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (store, resume) = Store::open(dir.path(), 0).unwrap();
        let (tx, _rx) = tokio::sync::mpsc::channel(1);
        let mut sink = IngestSink::new(store, tx, resume.next_seq);
        sink.recover(None).unwrap();
        sink.recover(Some(&resume.next_seq.to_le_bytes())).unwrap();
        let e = sink
            .recover(Some(&(resume.next_seq + 5).to_le_bytes()))
            .unwrap_err();
        assert!(matches!(e, SinkError::StoreBehind { .. }), "{e}");
        assert!(matches!(
            sink.recover(Some(b"abc")),
            Err(SinkError::BadPosition(3))
        ));
        // Nothing handed over: a commit waits for nothing and says where the store is.
        assert_eq!(
            sink.commit().unwrap(),
            resume.next_seq.to_le_bytes().to_vec()
        );
    }
}
