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
//! ([`Upstream::BackfillOver`]), and (`serve --backfill`'s own crawl:
//! [`BackfillHold::AllFetching`]) an account with one while its fetch is in flight, so that
//! its repository is at or past what was served of it. When the account's repository lands, its held frames are
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
//! **In pieces.** A repository of more than `--landing-records` records (10,000 by default,
//! as `riptide backfill --data` lands them: `riptide_backfill::landing`) or of more than 16 MiB
//! of events and rows is handed over in pieces of at most that many, each its own ingest job
//! and so stored in one atomic batch: what a landing holds in memory (besides the verified CAR)
//! is two pieces (one being rendered while the one before is written), not the repository. The
//! account's worker decides with the first piece how the repository lands (creates, a
//! replacement after its `#sync`, or `superseded`), holds the account's live frames from the
//! first piece to the last (whatever `--backfill-hold` says), writes with every piece but the
//! last the progress entry marked `partial` (the commit, the last key written), and with the
//! last the account's chain state, the plain entry and the release of its held frames. After
//! `kill -9` between pieces the repository is fetched again: the same commit resumes after the
//! entry's key (no `#sync`, no record twice), another commit starts over as a replacement (its
//! `#sync` drops the pieces written). Pieces of creates that live commits of the account
//! followed (served after a restart, before its fetch began again) cannot be completed: the
//! account is resynced (`crate::resync`), whose replacement rows rebuild it. A subscriber sees
//! a landing's pieces as consecutive runs of its events, possibly with other accounts' events
//! between them, never the account's own live events: on v2 the `#sync` (if any) then every
//! record once; on v1 the creates (a replacement's rows are v2 only).
//!
//! Operators see the crawl on `/metrics` (`riptide_backfill_*`, the same numbers `riptide
//! backfill status --data DIR` prints) and on the status page's backfill row.

use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Mutex, OnceLock};

use riptide_backfill::landing::{
    begin, key, landed_in, records_after, Begin, Landed, PIECE_BYTES, PIECE_RECORDS,
};
use riptide_backfill::{Fetching, Hosts, Progress, Sink, SinkError, Status, Verified, Written};
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
    /// [`BackfillHold::All`], and an account with a verified commit too while its fetch is in
    /// flight (`serve --backfill --backfill-hold all`, whose crawl is in this process): its
    /// repository, asked for once its frames are held, is at or past every commit of it served,
    /// so it lands (as replacement rows) rather than being `superseded` by a commit served
    /// during the fetch, which would leave the account without its records from before the
    /// stream. (`--backfill-from` cannot see the workers' fetches: [`BackfillHold::All`].)
    AllFetching(Arc<Fetching>),
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

/// A piece of a verified repository rendered for ingest (module docs, "In pieces"): its events'
/// JSON pieces and rows, as a worker renders a frame's, where it lies in its landing, and whom
/// to tell once it is durable.
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
    /// Records of this piece outside the atproto data model, not rendered.
    pub(crate) dropped: u64,
    /// The store holds pieces of an interrupted landing of another commit of the account
    /// ([`Landed::partial`]): earlier rows, replaced as served commits are.
    pub(crate) earlier_pieces: bool,
    /// Where the piece lies in its landing.
    pub(crate) piece: Piece,
    /// What the whole landing wrote, set by the worker with the last piece (the crawl's count).
    pub(crate) outcome: OnceLock<Written>,
    pub(crate) ack: SyncSender<u64>,
}

/// Where a [`BackfillRepo`] lies in its repository's landing (module docs, "In pieces").
#[derive(Clone, Debug, Default)]
pub(crate) struct Piece {
    /// The landing's first piece here: the worker decides how the repository lands.
    pub(crate) first: bool,
    /// Its last: the account's chain state, its plain progress entry, its frames released.
    pub(crate) last: bool,
    /// The key of the piece's last record (a piece that is not the last says where the next
    /// begins in its progress entry).
    pub(crate) after: String,
    /// The landing goes on after durable pieces of the same commit: their counts and mode.
    pub(crate) resumed: Option<Landed>,
}

impl std::fmt::Debug for BackfillRepo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BackfillRepo")
            .field("did", &self.did)
            .field("rev", &self.rev)
            .field("events", &self.parts.len())
            .field("piece", &self.piece)
            .finish()
    }
}

/// The crawl's sink inside `riptide serve` (module docs): repositories to ingest, in pieces,
/// durable when ingest's writer says so.
pub struct IngestSink {
    store: Store,
    tx: tokio::sync::mpsc::Sender<Upstream>,
    projector: Projector,
    /// The store's next seq when it was opened, then as the writer last said.
    next_seq: u64,
    /// Last pieces handed over and not yet durable, with the landings' DIDs.
    waiting: Vec<(Option<Arc<BackfillRepo>>, Receiver<u64>)>,
    /// Most records per piece ([`Self::with_piece_records`]).
    piece: usize,
    /// Most bytes of events and rows per piece.
    piece_bytes: usize,
    /// Tests' crash point ([`Self::abort_after_pieces`]).
    abort_after: Option<u32>,
    /// What the landings made durable by the last commit wrote, by the worker's word
    /// ([`Sink::recount`]).
    recounts: HashMap<Box<str>, Written>,
}

impl std::fmt::Debug for IngestSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IngestSink")
            .field("next_seq", &self.next_seq)
            .field("waiting", &self.waiting.len())
            .field("piece", &self.piece)
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
            piece: PIECE_RECORDS,
            piece_bytes: PIECE_BYTES,
            abort_after: None,
            recounts: HashMap::new(),
        }
    }

    /// Lands each repository in pieces of at most `records` records (at least 1; module docs,
    /// "In pieces"): `serve --landing-records`, [`PIECE_RECORDS`] unless told.
    pub fn with_piece_records(mut self, records: usize) -> Self {
        self.piece = records.max(1);
        self
    }

    /// For the fault suite and tests (`RIPTIDE_FAULT_LANDING_STOP_AFTER_PIECES`): once `pieces`
    /// pieces of a landing are durable, the process aborts, as `kill -9` at that point would
    /// leave it.
    pub fn abort_after_pieces(mut self, pieces: u32) -> Self {
        self.abort_after = Some(pieces);
        self
    }

    fn gone() -> SinkError {
        SinkError::Unavailable("ingest stopped before the repository was stored".into())
    }

    /// Hands one piece over; its ack.
    fn send(&mut self, r: BackfillRepo) -> Result<(Arc<BackfillRepo>, Receiver<u64>), SinkError> {
        let (ack, told) = sync_channel(1);
        let r = Arc::new(BackfillRepo { ack, ..r });
        self.tx
            .blocking_send(Upstream::Backfill(r.clone()))
            .map_err(|_| Self::gone())?;
        Ok((r, told))
    }

    /// Waits until a piece handed over is durable.
    fn durable(&mut self, told: &Receiver<u64>) -> Result<(), SinkError> {
        let next = told.recv().map_err(|_| Self::gone())?;
        self.next_seq = self.next_seq.max(next);
        Ok(())
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
        let (after, resumed, earlier_pieces) = match begin(
            landed_in(&self.store, &repo.did)?,
            repo,
            "",
        ) {
            Begin::Landed(l) => {
                tracing::debug!(did = %repo.did, rev = %l.rev, "backfill: already in the store (landed before a crash); not handed over again");
                // Frames held for it since the restart are released.
                self.settled(&repo.did)?;
                return Ok(Written {
                    records: l.records,
                    dropped: l.dropped,
                });
            }
            Begin::Resume { after, landed } => {
                tracing::debug!(did = %repo.did, rev = %landed.rev, after = %after, "backfill: resuming a landing after its durable pieces");
                (Some(after), Some(landed), false)
            }
            Begin::Fresh { earlier_pieces } => (None, None, earlier_pieces),
        };
        let template = |first: bool, resumed: Option<Landed>| BackfillRepo {
            did: repo.did.as_str().into(),
            rev: repo.rev.as_str().into(),
            commit: repo.commit,
            data: repo.data,
            commit_block: if first {
                repo.commit_block().map(|b| b.to_vec()).unwrap_or_default()
            } else {
                Vec::new()
            },
            buf: Vec::new(),
            parts: Vec::new(),
            dropped: 0,
            earlier_pieces,
            piece: Piece {
                first,
                resumed,
                ..Piece::default()
            },
            outcome: OnceLock::new(),
            ack: sync_channel(0).0,
        };
        // Each piece rendered while the one before is written; handed over once it is durable:
        // at most two pieces of the repository in memory (module docs, "In pieces").
        let total = repo.kept();
        let mut piece = template(true, resumed.clone());
        let mut in_flight: Option<Receiver<u64>> = None;
        let mut durable_pieces = 0u32;
        let (mut records, mut dropped) =
            resumed.as_ref().map_or((0, 0), |l| (l.records, l.dropped));
        for (i, r) in records_after(repo, after.as_deref()) {
            let row = repo.create_row(&r);
            match self.projector.project_row(&row) {
                Ok(p) => push_event(&mut piece.buf, &mut piece.parts, p, 0, Some(row.row(0, 0))),
                Err(_) => piece.dropped += 1,
            }
            let full = piece.parts.len() + piece.dropped as usize >= self.piece
                || piece.buf.len() >= self.piece_bytes;
            if full && i + 1 < total {
                piece.piece.after = key(&r);
                dropped += piece.dropped;
                records += piece.parts.len() as u64;
                let next = std::mem::replace(&mut piece, template(false, None));
                if let Some(told) = in_flight.take() {
                    self.durable(&told)?;
                    durable_pieces += 1;
                    self.crash_point(durable_pieces);
                }
                in_flight = Some(self.send(next)?.1);
            }
        }
        dropped += piece.dropped;
        records += piece.parts.len() as u64;
        if dropped > 0 {
            tracing::warn!(
                did = %repo.did, rev = %repo.rev, dropped,
                "backfill: records outside the atproto data model not served (counted as records_dropped)"
            );
        }
        if let Some(told) = in_flight.take() {
            self.durable(&told)?;
            durable_pieces += 1;
            self.crash_point(durable_pieces);
        }
        piece.piece.last = true;
        let (last, told) = self.send(piece)?;
        self.waiting.push((Some(last), told));
        // What lands is the worker's word, read once the last piece is durable
        // ([`Sink::recount`]); until then, what was rendered.
        Ok(Written { records, dropped })
    }

    fn commit(&mut self) -> Result<Vec<u8>, SinkError> {
        for (last, told) in std::mem::take(&mut self.waiting) {
            self.durable(&told)?;
            // Set by the worker before the writer said it is durable.
            if let Some(w) = last.as_ref().and_then(|l| l.outcome.get()) {
                let did = last.as_ref().map(|l| l.did.clone()).unwrap_or_default();
                self.recounts.insert(did, *w);
            }
        }
        Ok(self.next_seq.to_le_bytes().to_vec())
    }

    fn recount(&mut self, did: &str) -> Option<Written> {
        self.recounts.remove(did)
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
        self.waiting.push((None, told));
        Ok(())
    }
}

impl IngestSink {
    /// The test crash point ([`Self::abort_after_pieces`]).
    fn crash_point(&self, durable_pieces: u32) {
        if self.abort_after == Some(durable_pieces) {
            tracing::error!(
                pieces = durable_pieces,
                "RIPTIDE_FAULT_LANDING_STOP_AFTER_PIECES: aborting between the pieces of a landing"
            );
            std::process::abort();
        }
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
    /// Pieces of repositories stored before their landing's last (`--landing-records`).
    pub pieces: AtomicU64,
    /// The run's live counts.
    pub progress: Mutex<Option<Arc<Progress>>>,
    /// The durable state's report, refreshed every few seconds.
    pub status: Mutex<Option<Status>>,
    /// Why the crawl stopped early (a local failure: its state or the store).
    pub error: Mutex<Option<String>>,
    /// The accounts being fetched, when only those are held ([`BackfillHold::InFlight`]).
    pub fetching: Mutex<Option<Arc<Fetching>>>,
    /// The crawl's hosts: what their limits cost (`429`s, pauses), as `riptide backfill
    /// --metrics-listen` reports them.
    pub hosts: Mutex<Option<Hosts>>,
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
                "Accounts whose repository is being fetched (their live frames held).",
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
        one(
            s,
            "riptide_backfill_pieces_total",
            "counter",
            "Pieces of backfilled repositories stored before the last piece of their landing (repositories of more than --landing-records records land in pieces; since start).",
            self.pieces.load(Relaxed).to_string(),
        );
        if let Some(st) = self.status() {
            riptide_backfill::metrics::render_status(s, &st);
        }
        if let Some(h) = lock(&self.hosts).as_ref() {
            riptide_backfill::metrics::render_waits(s, h);
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

    /// What the pieces of a landing hold: (first, last, after, the events' JSON around their
    /// time and cursor, and their rows' columns), as ingest's worker receives them.
    type Received = Vec<(bool, bool, String, Vec<(Vec<u8>, Vec<u8>)>)>;

    /// Lands the corpus repository through an [`IngestSink`] in pieces of `piece` records,
    /// a thread standing in for ingest: it takes each piece, says `outcome` with the last, and
    /// acks each as durable. What it received, what `write` said, and the recount.
    fn land_in_pieces(
        piece: usize,
        outcome: Written,
    ) -> Option<(Received, Written, Option<Written>)> {
        let car = riptide_testdata::read("jetstream-2026-07/repo.car")?;
        let did = "did:plc:53iucmf5ldftgqyf2ac7hmhd";
        let repo = riptide_backfill::verify_car(
            Box::new(car),
            did,
            None,
            &riptide_backfill::Collections::all(),
            "test",
        )
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let (store, resume) = Store::open(dir.path(), 0).unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::channel(1);
        let ingest = std::thread::spawn(move || {
            let mut got = Received::new();
            let mut seq = 1;
            while let Some(Upstream::Backfill(r)) = rx.blocking_recv() {
                let events = r
                    .parts
                    .iter()
                    .map(|p| {
                        (
                            r.buf[p.head.clone()].to_vec(),
                            r.buf[p.tail.clone()].to_vec(),
                        )
                    })
                    .collect();
                got.push((r.piece.first, r.piece.last, r.piece.after.clone(), events));
                if r.piece.last {
                    r.outcome.set(outcome).unwrap();
                }
                seq += r.parts.len() as u64;
                r.ack.try_send(seq).unwrap();
            }
            got
        });
        let mut sink = IngestSink::new(store, tx, resume.next_seq).with_piece_records(piece);
        let said = sink.write(&repo).unwrap();
        sink.commit().unwrap();
        let recount = sink.recount(did);
        drop(sink);
        Some((ingest.join().unwrap(), said, recount))
    }

    /// The corpus repository in pieces of 5 reaches ingest as 5 pieces (the first marked
    /// first, the last last, each but the last naming its last record's key), whose events
    /// are, in order, byte for byte those of the one-piece landing: one create per record of
    /// goat's listing, in MST key order. The crawl's count is the worker's word once durable.
    #[test]
    fn a_repository_reaches_ingest_in_pieces_equal_to_one() {
        let real = Written {
            records: 0,
            dropped: 0,
        };
        let Some((pieces, said, recount)) = land_in_pieces(5, real) else {
            return;
        };
        let (one, _, _) = land_in_pieces(1000, real).unwrap();
        assert_eq!(one.len(), 1);
        assert!(one[0].0 && one[0].1);
        assert_eq!(pieces.len(), 5, "23 records in pieces of 5");
        let listing: Vec<String> =
            riptide_testdata::read_string("jetstream-2026-07/car_expected_records.tsv")
                .unwrap()
                .lines()
                .filter(|l| !l.is_empty())
                .map(|l| l.split_once('\t').unwrap().0.to_owned())
                .collect();
        assert_eq!(listing.len(), 23);
        for (i, (first, last, after, events)) in pieces.iter().enumerate() {
            assert_eq!(*first, i == 0);
            assert_eq!(*last, i == 4);
            if !last {
                assert_eq!(events.len(), 5);
                assert_eq!(*after, listing[i * 5 + 4], "piece {i} ends at its last key");
            }
        }
        let joined: Vec<_> = pieces.iter().flat_map(|p| p.3.clone()).collect();
        assert_eq!(joined, one[0].3, "the pieces are the one landing, in order");
        let keys: Vec<String> = joined
            .iter()
            .map(|(head, tail)| {
                let mut json = head.clone();
                json.extend_from_slice(b"0,\"cursor\":1");
                json.extend_from_slice(tail);
                let v: serde_json::Value = serde_json::from_slice(&json).unwrap();
                assert_eq!(v["commit"]["operation"], "create");
                format!(
                    "{}/{}",
                    v["commit"]["collection"].as_str().unwrap(),
                    v["commit"]["rkey"].as_str().unwrap()
                )
            })
            .collect();
        let mut sorted = listing.clone();
        sorted.sort();
        assert_eq!(keys, sorted);
        // Rendered: 23 records; landed (the worker's word, here superseded): none.
        assert_eq!(said.records, 23);
        assert_eq!(recount, Some(real));
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
