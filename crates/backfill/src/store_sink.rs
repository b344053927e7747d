//! [`StoreSink`]: verified repositories written into the store that `riptide serve --data DIR`
//! serves (`riptide backfill --data DIR`, issue 37).
//!
//! Why a sink of its own: a backfill that a server serves must land in the server's seq space,
//! beside the live stream, and must seed each account's chain state so that its next live commit
//! is verified statefully. A repository becomes one `create` event per record at its head rev
//! (the rows are [`StoredRow`]s, each rendered once into a scratch buffer as [`Event::from_row`]
//! renders it, to check that it is in the data model and to measure it
//! ([`Event::value_len_of_hashed_row`], with the record digest verification already took), and handed to the store as rows only
//! ([`Store::append_landing`]), which seals them as `.jss` row blocks as ingest's are, one copy,
//! the record's signed DAG-CBOR, without making their v1 events), the account's chain state becomes
//! its verified commit, and a small progress entry
//! (`backfill` partition: DID → [`Landed`]) records that it landed: all three in **one** atomic,
//! durable store batch ([`Store::append_with_progress`]).
//!
//! Exactly once across `kill -9`: the store's progress entry is the truth of what landed. The
//! backfill's own state ([`crate::state`]) commits the repository's status only after the store
//! batch is durable (the writer's order); a crash between the two leaves a repository in the
//! store with no status, so it is fetched again, and this sink finds its entry and writes
//! nothing, answering with the counts it landed with. Nothing is ever rolled back: a store batch
//! is all or nothing. Batches are cut between repositories (at [`FLUSH_AT`] buffered bytes, and
//! at every [`Sink::commit`]) and inside a large one only between its pieces (below).
//!
//! **In pieces.** A repository of more than [`PIECE_RECORDS`] records (`riptide backfill
//! --landing-records N`) or of more than [`FLUSH_AT`] bytes of events and rows lands in pieces
//! of at most that many records (ending early at that many bytes), each its own batch, so
//! that what a landing buffers (events and rows) is bounded by the piece, not by the repository
//! (up to `max_repo_bytes`; the verified CAR itself stays in memory, or spooled, as the fetch
//! left it). Every piece but the last carries the account's progress entry marked
//! [`Landed::partial`]: the commit landing and the key of the last record written. The last piece
//! carries the chain state and the plain entry, so the account reads as landed (and its next
//! live commit is checked against the repository) only once all of it is durable. After a
//! crash between pieces the repository is fetched again: the same commit resumes after the
//! entry's key, in MST key order (neither lost nor written twice); another commit (the account moved on) starts
//! over as a replacement (below), its `#sync` dropping the pieces written, so a subscriber
//! folding the account from either `#sync` holds a complete repository. So does the same
//! commit landed with another `--collections` filter than the pieces' ([`Partial::collections`]):
//! resumed after the entry's key, it would miss the records the new filter keeps below it.
//!
//! **Over earlier rows.** An account the store already holds commits of (a data directory a
//! server ingested into before: its chain state has a tip) below or at the repository's rev gets
//! *replacement rows* instead of creates (`riptide_jetstream::replace`, as the resync path in
//! `riptide serve` emits them, and as Jetstream v2 does): a `#sync` event, the account's DID
//! tombstone, then one `create-resync` (kind 7) row per record (its event made by
//! [`Event::replacement_from_row`]: a replacement's, which v1 `/subscribe` never sends), in the
//! same batch as its chain state; a v2 subscriber that drops the account at the `#sync` and applies the creates holds
//! exactly the repository ([`Landed::replaced`]). An account whose chain state is already past
//! the repository's rev gets no rows: its stored events are newer than the repository (rows
//! landed after them would roll it back), and the progress entry says so (`superseded`).

use std::time::{SystemTime, UNIX_EPOCH};

use riptide_firehose::chain::{check_sync, AccountState};
use riptide_jetstream::replace::{replacement_row, sync_body, sync_row};
use riptide_jetstream::{Projector, StoredRow};
use riptide_segment::{Kind, Row};
use riptide_store::{Event, LandingRow, Resume, Store};

use crate::landing::{begin, key, records_after, Begin};
use crate::outcome::Verified;
use crate::sink::{Sink, SinkError, Written};

/// Write the buffered repositories to the store past this many bytes of events (between
/// repositories, or at a piece's end: module docs, "In pieces").
pub const FLUSH_AT: usize = 16 << 20;

pub use crate::landing::{landed_in, Landed, Partial, PIECE_RECORDS};

/// The store-backed sink (module docs).
pub struct StoreSink {
    store: Store,
    resume: Resume,
    projector: Projector,
    /// The scratch buffer each row's JSON is rendered into to check and measure it.
    json: Vec<u8>,
    /// The batch's rows, owned until it is written ([`Store::append_landing`]: they are sealed
    /// as they are, no v1 event made of them; one with a column too long for a `.jss` row makes
    /// the batch JSON blocks, as ingest does with such a batch).
    rows: BatchRows,
    accounts: Vec<(Box<str>, AccountState)>,
    progress: Vec<(Box<str>, Vec<u8>)>,
    bytes: usize,
    /// Most records per landing piece (module docs, "In pieces").
    piece: usize,
    /// Most buffered bytes (events and rows) before a piece ends early ([`FLUSH_AT`]).
    piece_bytes: usize,
    /// Tests' crash point: stop after this many pieces are durable ([`Self::crash_after_pieces`]).
    crash_after: Option<u32>,
    /// The collections filter the repositories were verified with ([`Partial::collections`]).
    collections: String,
}

impl std::fmt::Debug for StoreSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreSink")
            .field("store", &self.store)
            .field("next_seq", &self.resume.next_seq)
            .finish()
    }
}

fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

impl StoreSink {
    /// Writes into `store`, whose writer this sink becomes (the data directory's lock, taken
    /// when the store was opened, keeps any other process out); `resume` is what
    /// [`Store::open`] returned.
    pub fn new(store: Store, resume: Resume) -> StoreSink {
        StoreSink {
            store,
            resume,
            // `#sync` too: a replacement begins with one.
            projector: Projector::with_sync(),
            json: Vec::with_capacity(1 << 14),
            rows: BatchRows::default(),
            accounts: Vec::new(),
            progress: Vec::new(),
            bytes: 0,
            piece: PIECE_RECORDS,
            piece_bytes: FLUSH_AT,
            crash_after: None,
            collections: String::new(),
        }
    }

    /// The `--collections` filter the repositories written were verified with (every
    /// collection unless told): a partial landing records it, and one resumed with another
    /// filter starts over ([`Partial::collections`]).
    pub fn with_collections(mut self, keep: &crate::Collections) -> StoreSink {
        self.collections = keep.key();
        self
    }

    /// Lands each repository in pieces of at most `records` records (at least 1; module docs,
    /// "In pieces"); [`PIECE_RECORDS`] unless told.
    pub fn with_piece_records(mut self, records: usize) -> StoreSink {
        self.piece = records.max(1);
        self
    }

    /// Ends a piece early once the batch buffers `bytes` bytes of events and rows ([`FLUSH_AT`]
    /// unless told): a piece of large records is bounded in bytes too.
    pub fn with_piece_bytes(mut self, bytes: usize) -> StoreSink {
        self.piece_bytes = bytes.max(1);
        self
    }

    /// For tests: once `pieces` pieces of a landing are durable, [`Sink::write`] stops with
    /// [`SinkError::Unavailable`] before anything else of it is written, leaving the disk as a
    /// `kill -9` at that point would (drop the sink then, as the process would be gone).
    pub fn crash_after_pieces(&mut self, pieces: u32) {
        self.crash_after = Some(pieces);
    }

    /// The store written to.
    pub fn store(&self) -> &Store {
        &self.store
    }

    fn store_err(&self, e: riptide_store::StoreError) -> SinkError {
        SinkError::Store {
            what: self.store.dir().display().to_string(),
            source: e,
        }
    }

    /// What the store (or this sink's unwritten batch) says landed for `did`.
    fn landed(&self, did: &str) -> Result<Option<Landed>, SinkError> {
        match self.progress.iter().rev().find(|(k, _)| &**k == did) {
            Some((_, v)) => Landed::parse(&self.store, did, v).map(Some),
            None => landed_in(&self.store, did),
        }
    }

    /// The account's chain state: this batch's, else the store's.
    fn account(&self, did: &str) -> Result<Option<AccountState>, SinkError> {
        match self.accounts.iter().rev().find(|(k, _)| &**k == did) {
            Some((_, s)) => Ok(Some(*s)),
            None => self.store.account(did).map_err(|e| self.store_err(e)),
        }
    }

    /// Appends `row`'s `.jss` row (a replacement's kind when `replacing`) to the batch at the
    /// next seq; its seq, or `None` if its event does not render (outside the data model). Its
    /// event is rendered only to check and measure it ([`Event::value_len_of_hashed_row`]): the store
    /// makes none of the rows it seals ([`Store::append_landing`]).
    /// `sha256`: the digest of the row's record when the verified repository's CID names it
    /// ([`record_sha256`]), which the check then does not compute again.
    fn push_row(
        &mut self,
        row: &StoredRow<'_>,
        sha256: Option<&[u8]>,
        replacing: bool,
    ) -> Option<u64> {
        let seq = self.resume.next_seq;
        let time_us = now_us().max(self.resume.last_time_us + 1);
        let value_len = <Event>::value_len_of_hashed_row(
            &mut self.projector,
            row,
            sha256,
            seq,
            time_us,
            &mut self.json,
        )
        .ok()?;
        let r = if replacing {
            replacement_row(row, seq, time_us)
        } else {
            row.row(seq, time_us)
        };
        self.bytes += value_len + r.payload.len();
        self.rows.push(&r, value_len);
        self.resume.next_seq += 1;
        self.resume.last_time_us = time_us;
        Some(seq)
    }

    /// A replacement's `#sync` (module docs) into the batch.
    fn push_sync(&mut self, repo: &Verified, landed: &mut Landed) {
        let time =
            riptide_syntax::format_utc(now_us().max(0) as u64, riptide_syntax::Precision::Millis);
        let body = sync_body(
            &repo.did,
            &repo.rev,
            &repo.commit,
            repo.commit_block().unwrap_or_default(),
            0,
            &time,
        );
        let sync = sync_row(&repo.did, &body);
        match self.push_row(&sync, None, true) {
            Some(seq) => {
                landed.first_seq.get_or_insert(seq);
            }
            // Built here from a verified commit: a bug, said.
            None => tracing::error!(
                did = %repo.did, rev = %repo.rev,
                "backfill: the #sync of a replacement does not render: its records follow without it"
            ),
        }
    }

    /// The repository's records after the key `after` (all: `None`) into the batch, written in
    /// pieces of at most [`Self::piece`] records: each full piece but the last is written at once
    /// with a progress entry saying where the next begins (module docs, "In pieces").
    fn push_records(
        &mut self,
        repo: &Verified,
        after: Option<&str>,
        commit: &str,
        landed: &mut Landed,
    ) -> Result<(), SinkError> {
        let total = repo.kept();
        let mut in_piece = 0;
        let mut pieces = 0u32;
        for (i, r) in records_after(repo, after) {
            let row = if landed.replaced {
                r.stored_row(&repo.did, &repo.rev).ok()
            } else {
                Some(repo.create_row(&r))
            };
            match row.and_then(|row| self.push_row(&row, record_sha256(&r), landed.replaced)) {
                Some(seq) => {
                    landed.first_seq.get_or_insert(seq);
                    landed.records += 1;
                }
                None => landed.dropped += 1,
            }
            in_piece += 1;
            if (in_piece >= self.piece || self.bytes >= self.piece_bytes) && i + 1 < total {
                let partial = landed.piece(commit, key(&r), &self.collections);
                self.progress
                    .push((repo.did.as_str().into(), partial.to_vec()));
                self.flush()?;
                in_piece = 0;
                pieces += 1;
                if self.crash_after == Some(pieces) {
                    return Err(SinkError::Unavailable(format!(
                        "test crash point after {pieces} pieces of {}",
                        repo.did
                    )));
                }
            }
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), SinkError> {
        if self.rows.is_empty() && self.accounts.is_empty() && self.progress.is_empty() {
            return Ok(());
        }
        self.store
            .append_landing(
                &self.rows.landing(),
                &self.accounts,
                &self.progress,
                &self.resume,
            )
            .map_err(|e| self.store_err(e))?;
        self.rows.clear();
        self.accounts.clear();
        self.progress.clear();
        self.bytes = 0;
        Ok(())
    }
}

/// The SHA-256 of a verified repository's record: its CID's digest. The CAR it came from was
/// read with every block checked against its CID, and that check takes only SHA-256 CIDs
/// (`riptide_car::verify_block`), so the digest is the one of the record's bytes. `None` (the
/// record is hashed again) for a CID that is not SHA-256.
fn record_sha256<'a>(r: &crate::Record<'a>) -> Option<&'a [u8]> {
    let cid = r.cid.as_cid();
    (cid.hash_code() == riptide_cbor::SHA2_256 && cid.digest().len() == 32).then(|| cid.digest())
}

/// A batch's rows in one buffer, their columns end to end: one growing allocation for the
/// batch rather than five per row (an owned row's strings).
#[derive(Debug, Default)]
struct BatchRows {
    bytes: Vec<u8>,
    rows: Vec<RowAt>,
}

/// Where one row's columns lie in [`BatchRows::bytes`], and the rest of it.
#[derive(Debug)]
struct RowAt {
    seq: u64,
    witnessed_at: i64,
    indexed_at: i64,
    kind: Kind,
    value_len: usize,
    /// Where its did, collection, rkey, rev and payload end (each begins where the one before
    /// ends; the did where the row before ends).
    ends: [usize; 5],
}

impl BatchRows {
    fn push(&mut self, r: &Row<'_>, value_len: usize) {
        let mut ends = [0; 5];
        let columns = [
            r.did.as_bytes(),
            r.collection.as_bytes(),
            r.rkey.as_bytes(),
            r.rev.as_bytes(),
            r.payload,
        ];
        for (end, column) in ends.iter_mut().zip(columns) {
            self.bytes.extend_from_slice(column);
            *end = self.bytes.len();
        }
        self.rows.push(RowAt {
            seq: r.seq,
            witnessed_at: r.witnessed_at,
            indexed_at: r.indexed_at,
            kind: r.kind,
            value_len,
            ends,
        });
    }

    /// The rows, borrowed.
    fn iter(&self) -> impl Iterator<Item = Row<'_>> {
        let mut start = 0;
        self.rows.iter().map(move |at| {
            let [did, collection, rkey, rev, payload] = at.ends;
            // Copied from `&str`s (`push`), cut where they ended: UTF-8, never the default.
            let text = |from: usize, to: usize| {
                std::str::from_utf8(&self.bytes[from..to]).unwrap_or_default()
            };
            let row = Row {
                seq: at.seq,
                witnessed_at: at.witnessed_at,
                indexed_at: at.indexed_at,
                kind: at.kind,
                did: text(start, did),
                collection: text(did, collection),
                rkey: text(collection, rkey),
                rev: text(rkey, rev),
                payload: &self.bytes[rev..payload],
            };
            start = payload;
            row
        })
    }

    /// The rows as the store takes a landing's.
    fn landing(&self) -> Vec<LandingRow<'_>> {
        self.iter()
            .zip(&self.rows)
            .map(|(row, at)| LandingRow {
                row,
                value_len: at.value_len,
            })
            .collect()
    }

    fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    fn clear(&mut self) {
        self.bytes.clear();
        self.rows.clear();
    }
}

impl Sink for StoreSink {
    fn recover(&mut self, position: Option<&[u8]>) -> Result<(), SinkError> {
        // Nothing to roll back (module docs); but a store behind the state was replaced.
        let Some(p) = position else {
            return Ok(());
        };
        let expected =
            u64::from_le_bytes(p.try_into().map_err(|_| SinkError::BadPosition(p.len()))?);
        if self.resume.next_seq < expected {
            return Err(SinkError::StoreBehind {
                what: self.store.dir().display().to_string(),
                next_seq: self.resume.next_seq,
                expected,
            });
        }
        Ok(())
    }

    fn write(&mut self, repo: &Verified) -> Result<Written, SinkError> {
        let commit = repo.commit.to_string();
        // Where this landing begins: at the first record, or after the pieces of the same commit
        // a crash interrupted (module docs, "In pieces").
        let (after, resumed, earlier_pieces) = match begin(
            self.landed(&repo.did)?,
            repo,
            &self.collections,
        ) {
            Begin::Landed(l) => {
                tracing::debug!(did = %repo.did, rev = %l.rev, "backfill: already in the store (landed before a crash); not written again");
                return Ok(Written {
                    records: l.records,
                    dropped: l.dropped,
                });
            }
            Begin::Resume { after, landed } => {
                tracing::debug!(did = %repo.did, rev = %landed.rev, after = %after, "backfill: resuming a landing after its durable pieces");
                (Some(after), Some(landed), false)
            }
            // Another commit of the account: its pieces are earlier rows, replaced anew.
            Begin::Fresh { earlier_pieces } => (None, None, earlier_pieces),
        };
        let before = self.account(&repo.did)?;
        let (checked, next) = check_sync(
            before.as_ref(),
            &repo.rev,
            repo.commit.as_cid(),
            repo.data.as_cid(),
            now_us().max(0) as u64,
        );
        let resuming = resumed.is_some();
        let mut landed = resumed.unwrap_or_else(|| Landed::new(&repo.rev));
        match checked {
            Err(why) => {
                tracing::warn!(
                    did = %repo.did, rev = %repo.rev, why = ?why,
                    "backfill: the store already holds a newer commit of this account; its repository is not written"
                );
                if resuming || earlier_pieces {
                    // A server ingested the account between the pieces and now: what it stored
                    // follows the pieces; no repository of its newer commit is at hand.
                    tracing::warn!(
                        did = %repo.did, rev = %repo.rev,
                        "backfill: the pieces of an interrupted landing of this account stay without the rest of its repository"
                    );
                }
                landed.superseded = Some(format!("{why:?}"));
            }
            Ok(()) => {
                if !resuming {
                    // Commits of the account are stored already: its records replace them.
                    landed.replaced = earlier_pieces || before.is_some_and(|s| s.tip.is_some());
                    if landed.replaced {
                        self.push_sync(repo, &mut landed);
                    }
                }
                self.push_records(repo, after.as_deref(), &commit, &mut landed)?;
                // The chain state with the last piece only: nothing reads the account as landed
                // before all of it is durable.
                if let Some(next) = next {
                    self.accounts.push((repo.did.as_str().into(), next));
                }
            }
        }
        if landed.dropped > 0 {
            tracing::warn!(
                did = %repo.did, rev = %repo.rev, dropped = landed.dropped,
                "backfill: records outside the atproto data model not written (counted as records_dropped)"
            );
        }
        let w = Written {
            records: landed.records,
            dropped: landed.dropped,
        };
        self.progress
            .push((repo.did.as_str().into(), landed.to_vec()));
        if self.bytes >= FLUSH_AT {
            self.flush()?;
        }
        Ok(w)
    }

    fn commit(&mut self) -> Result<Vec<u8>, SinkError> {
        self.flush()?;
        Ok(self.resume.next_seq.to_le_bytes().to_vec())
    }

    fn exact(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sink::tests::verified;
    use riptide_firehose::Action;
    use riptide_jetstream::EventKind;
    use riptide_store::ReadLimit;
    use std::collections::BTreeMap;

    fn events(store: &Store) -> Vec<serde_json::Value> {
        stored(store)
            .iter()
            .map(|e| {
                let v: serde_json::Value = serde_json::from_slice(&e.json()).unwrap();
                assert_eq!(v["cursor"], e.seq());
                v
            })
            .collect()
    }

    /// Every event the store holds, as stored.
    fn stored(store: &Store) -> Vec<Event> {
        let mut out = Vec::new();
        let mut next = 1;
        loop {
            let before = out.len();
            let limit = ReadLimit {
                events: 1000,
                bytes: 1 << 24,
            };
            store.read_from(next, limit, &mut out).unwrap();
            if out.len() == before {
                break;
            }
            next = out.last().map_or(next, |e: &Event| e.seq() + 1);
        }
        out
    }

    #[test]
    fn a_repository_lands_as_creates_with_its_chain_state_once() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (verified(1, 30), verified(2, 12));
        let pos = {
            let (store, resume) = Store::open_any(dir.path()).unwrap();
            let mut sink = StoreSink::new(store, resume);
            sink.recover(None).unwrap();
            assert_eq!(sink.write(&a).unwrap().records, 30);
            assert_eq!(sink.write(&b).unwrap().records, 12);
            // The same repository again in the same batch: nothing more.
            assert_eq!(sink.write(&a).unwrap().records, 30);
            sink.commit().unwrap()
        };
        assert_eq!(pos, 43u64.to_le_bytes().to_vec());
        let (store, resume) = Store::open_any(dir.path()).unwrap();
        assert_eq!(resume.next_seq, 43);
        let evs = events(&store);
        assert_eq!(evs.len(), 42);
        let mut want: Vec<(String, String, String, String)> = Vec::new();
        for v in [&a, &b] {
            for r in v.records() {
                want.push((
                    v.did.clone(),
                    r.collection.to_owned(),
                    r.rkey.to_owned(),
                    r.cid.to_string(),
                ));
            }
        }
        let got: Vec<_> = evs
            .iter()
            .map(|e| {
                let c = &e["commit"];
                assert_eq!(e["kind"], "commit");
                assert_eq!(c["operation"], "create");
                assert_eq!(c["record"]["$type"], c["collection"]);
                let rev = if e["did"] == a.did.as_str() {
                    &a.rev
                } else {
                    &b.rev
                };
                assert_eq!(c["rev"], rev.as_str());
                let s = |v: &serde_json::Value| v.as_str().unwrap().to_owned();
                (
                    s(&e["did"]),
                    s(&c["collection"]),
                    s(&c["rkey"]),
                    s(&c["cid"]),
                )
            })
            .collect();
        assert_eq!(got, want);
        // The chain state is the verified commit: the next live commit is checked against it.
        let st = store.account(&a.did).unwrap().unwrap();
        let tip = st.tip.unwrap();
        assert_eq!(
            (tip.commit, tip.data, tip.rev_string()),
            (a.commit, a.data, a.rev.clone())
        );
        let landed: Landed =
            serde_json::from_slice(&store.progress(&b.did).unwrap().unwrap()).unwrap();
        assert_eq!((landed.records, landed.first_seq), (12, Some(31)));

        // Fetched again after a crash that lost the state's commit: found, not written again.
        let mut sink = StoreSink::new(store, resume);
        sink.recover(Some(&pos)).unwrap();
        assert_eq!(sink.write(&b).unwrap().records, 12);
        assert_eq!(sink.commit().unwrap(), pos);
        assert_eq!(events(sink.store()).len(), 42);
    }

    #[test]
    fn repositories_are_sealed_as_row_blocks_that_read_back_as_their_events() {
        use riptide_store::StoreOptions;
        let (a, b) = (verified(3, 30), verified(4, 12));
        let small = StoreOptions {
            block_events: 10,
            ..StoreOptions::default()
        };
        // The same repositories into a store that seals every 10 events and into one that
        // seals none (its events read back as ingest rendered them, from `recent`).
        let land = |dir: &std::path::Path, opts: StoreOptions| {
            let (store, resume) = Store::open_with(dir, 0, opts).unwrap();
            let mut sink = StoreSink::new(store, resume);
            sink.recover(None).unwrap();
            sink.write(&a).unwrap();
            sink.write(&b).unwrap();
            sink.commit().unwrap();
        };
        let (sealed, unsealed) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        land(sealed.path(), small);
        land(unsealed.path(), StoreOptions::default());
        let (store, _) = Store::open_with(sealed.path(), 0, small).unwrap();
        let c = store.check().unwrap();
        // Every sealed block a row block, every event in one or unsealed.
        assert!(c.blocks >= 2 && c.row_blocks == c.blocks, "{c:?}");
        assert_eq!(c.events + c.unsealed, 42, "{c:?}");
        // Rendered from the rows, the events are the ones rendered at landing (times aside).
        let untimed = |store: &Store| {
            let mut evs = events(store);
            for e in &mut evs {
                e.as_object_mut().unwrap().remove("time_us");
            }
            evs
        };
        let from_rows = untimed(&store);
        assert_eq!(from_rows.len(), 42);
        let (other, _) = Store::open_any(unsealed.path()).unwrap();
        assert_eq!(other.check().unwrap().blocks, 0);
        assert_eq!(from_rows, untimed(&other));
    }

    /// `--data DIR --jsonl --out FILE`: a crash after both outputs committed but before the
    /// state did leaves the store with the repository and the file cut back; written again,
    /// each output holds it once.
    #[test]
    fn a_tee_of_the_store_and_a_file_recovers_each_to_once() {
        use crate::sink::{JsonlSink, TeeSink};
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (verified(5, 7), verified(6, 9));
        let path = dir.path().join("out.jsonl");
        let open = || {
            std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .read(true)
                .write(true)
                .open(&path)
                .unwrap()
        };
        let data = dir.path().join("data");
        let tee = |store: Store, resume: Resume| {
            TeeSink::new(
                Box::new(StoreSink::new(store, resume)),
                Box::new(JsonlSink::file(open(), "out")),
            )
        };
        let (store, resume) = Store::open_any(&data).unwrap();
        let mut t = tee(store, resume);
        t.recover(None).unwrap();
        t.write(&a).unwrap();
        let pos = t.commit().unwrap();
        t.write(&b).unwrap();
        // Committed by both outputs, but the state never heard: it still says `pos`.
        t.commit().unwrap();
        assert!(t.exact());
        drop(t);
        let (store, resume) = Store::open_any(&data).unwrap();
        let mut t = tee(store, resume);
        t.recover(Some(&pos)).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap().lines().count(), 7);
        assert_eq!(t.write(&b).unwrap().records, 9);
        t.commit().unwrap();
        drop(t);
        assert_eq!(std::fs::read_to_string(&path).unwrap().lines().count(), 16);
        let (store, _) = Store::open_any(&data).unwrap();
        assert_eq!(events(&store).len(), 16);
        assert!(matches!(
            tee(store, Resume::default()).recover(Some(b"\x09\0\0\0ab")),
            Err(SinkError::BadPosition(6))
        ));
    }

    #[test]
    fn a_store_behind_the_state_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (store, resume) = Store::open_any(dir.path()).unwrap();
        let mut sink = StoreSink::new(store, resume);
        let e = sink.recover(Some(&9u64.to_le_bytes())).unwrap_err();
        assert!(
            matches!(
                e,
                SinkError::StoreBehind {
                    next_seq: 1,
                    expected: 9,
                    ..
                }
            ),
            "{e}"
        );
        assert!(matches!(
            sink.recover(Some(b"\x01")),
            Err(SinkError::BadPosition(1))
        ));
    }

    #[test]
    fn an_account_already_past_the_repository_gets_no_rows() {
        let dir = tempfile::tempdir().unwrap();
        let a = verified(3, 5);
        let (store, resume) = Store::open_any(dir.path()).unwrap();
        // A live commit after the repository's: a later rev in the store.
        let mut later = check_sync(
            None,
            &a.rev,
            a.commit.as_cid(),
            a.data.as_cid(),
            now_us() as u64,
        )
        .1
        .unwrap();
        let other = verified(4, 2);
        if let Some(t) = later.tip.as_mut() {
            t.rev += 1;
            t.commit = other.commit;
        }
        store
            .append_with_accounts(&[], &[(a.did.as_str().into(), later)], &resume)
            .unwrap();
        let mut sink = StoreSink::new(store, resume);
        assert_eq!(sink.write(&a).unwrap().records, 0);
        sink.commit().unwrap();
        assert!(events(sink.store()).is_empty());
        let landed: Landed =
            serde_json::from_slice(&sink.store().progress(&a.did).unwrap().unwrap()).unwrap();
        assert!(landed.superseded.is_some(), "{landed:?}");
        assert_eq!(sink.store().account(&a.did).unwrap(), Some(later));
    }

    /// A repository for an account the store holds earlier commits of (a lower rev): a `#sync`
    /// (the DID tombstone) then one `create-resync` row per record, in one batch with the new
    /// chain state. A subscriber that drops the account at the `#sync` and applies the creates
    /// holds exactly the repository's records, whatever it held before.
    #[test]
    fn a_repository_over_earlier_rows_lands_as_a_sync_then_create_resync_rows() {
        use riptide_segment::Kind;
        let dir = tempfile::tempdir().unwrap();
        let a = verified(7, 9);
        let (store, mut resume) = Store::open_any(dir.path()).unwrap();
        // Earlier rows of the account (records the repository no longer has) and its chain
        // state at an earlier rev, as a server that ingested it live leaves them.
        let mut earlier = check_sync(
            None,
            &a.rev,
            a.commit.as_cid(),
            a.data.as_cid(),
            now_us() as u64,
        )
        .1
        .unwrap();
        if let Some(t) = earlier.tip.as_mut() {
            t.rev -= 1;
            t.from_repo = false;
            t.commit = verified(8, 1).commit;
        }
        let old_record = {
            let mut b = Vec::new();
            riptide_cbor::write_map_header(&mut b, 1);
            riptide_cbor::write_text(&mut b, "$type");
            riptide_cbor::write_text(&mut b, "app.bsky.feed.like");
            b
        };
        let (mut proj, mut json) = (Projector::new(), Vec::new());
        let mut old = Vec::new();
        for rkey in ["3kaaaaaaaaaa2", "3kaaaaaaaaab2"] {
            let row = StoredRow::Commit {
                did: &a.did,
                rev: "3kaaaaaaaaaa2",
                action: Action::Create,
                collection: "app.bsky.feed.like",
                rkey,
                record: Some(&old_record),
            };
            let e = Event::from_row(&mut proj, &row, resume.next_seq, 1, &mut json).unwrap();
            old.push(e);
            resume.next_seq += 1;
            resume.last_time_us = 1;
        }
        store
            .append_with_accounts(&old, &[(a.did.as_str().into(), earlier)], &resume)
            .unwrap();

        let mut sink = StoreSink::new(store, resume);
        sink.recover(None).unwrap();
        assert_eq!(sink.write(&a).unwrap().records, 9);
        // The rows: the `#sync`, then kind 7 per record, in MST key order, at the repository's rev.
        let kinds: Vec<Kind> = sink.rows.iter().map(|r| r.kind).collect();
        assert_eq!(kinds[0], Kind::Sync);
        assert!(
            kinds[1..].iter().all(|k| *k == Kind::CreateResync),
            "{kinds:?}"
        );
        assert_eq!(kinds.len(), 10);
        for (r, want) in sink.rows.iter().skip(1).zip(a.records()) {
            assert_eq!(
                (r.collection, r.rkey, r.rev),
                (want.collection, want.rkey, &*a.rev)
            );
            assert_eq!(r.payload, want.bytes, "the record as signed");
        }
        sink.commit().unwrap();
        let store = sink.store();
        let landed: Landed =
            serde_json::from_slice(&store.progress(&a.did).unwrap().unwrap()).unwrap();
        assert!(landed.replaced && landed.superseded.is_none(), "{landed:?}");
        assert_eq!((landed.records, landed.first_seq), (9, Some(3)));
        let tip = store.account(&a.did).unwrap().unwrap().tip.unwrap();
        assert_eq!((tip.commit, tip.rev_string()), (a.commit, a.rev.clone()));

        // Stored as a replacement's: the earlier commits stay commits, the records after the
        // `#sync` are of the kind v1 never sends.
        let kinds: Vec<EventKind> = stored(store).iter().map(|e| e.kind()).collect();
        assert_eq!(
            kinds[..3],
            [EventKind::Commit, EventKind::Commit, EventKind::Sync]
        );
        assert!(
            kinds[3..].iter().all(|k| *k == EventKind::Replacement),
            "{kinds:?}"
        );
        // Folded as a v2 subscriber does: the `#sync` drops the account, the creates rebuild it.
        let evs = events(store);
        assert_eq!(evs.len(), 2 + 1 + 9);
        assert_eq!(evs[2]["kind"], "sync", "{}", evs[2]);
        assert_eq!(evs[2]["sync"]["rev"], a.rev.as_str(), "{}", evs[2]);
        let mut held: BTreeMap<String, String> = BTreeMap::new();
        for e in &evs {
            match e["kind"].as_str().unwrap() {
                "sync" => held.clear(),
                "commit" => {
                    let c = &e["commit"];
                    assert_eq!(c["operation"], "create");
                    held.insert(
                        format!(
                            "{}/{}",
                            c["collection"].as_str().unwrap(),
                            c["rkey"].as_str().unwrap()
                        ),
                        c["cid"].as_str().unwrap().to_owned(),
                    );
                }
                k => panic!("{k}"),
            }
        }
        let want: BTreeMap<String, String> = a
            .records()
            .map(|r| (format!("{}/{}", r.collection, r.rkey), r.cid.to_string()))
            .collect();
        assert_eq!(held, want);
    }

    /// The check with the verified repository's CIDs ([`record_sha256`]) renders every record
    /// exactly as hashing it again does, and refuses the same ones: the same `records_dropped`
    /// and the same lengths (a block's cuts). Over the corpus's real export and generated
    /// repositories of several sizes, every record, as a create and as a replacement's row.
    #[test]
    fn a_record_checked_with_its_verified_cid_renders_as_hashed_again() {
        let mut repos: Vec<Verified> = (1..=6u8).map(|s| verified(s, 40 * s as usize)).collect();
        repos.extend(real_repo());
        let (mut hashing, mut known) = (Projector::with_sync(), Projector::with_sync());
        let (mut a, mut b) = (Vec::new(), Vec::new());
        let mut checked = 0;
        for repo in &repos {
            for r in repo.records() {
                let replacement = r.stored_row(&repo.did, &repo.rev).ok();
                for row in std::iter::once(repo.create_row(&r)).chain(replacement) {
                    let sha = record_sha256(&r);
                    assert!(sha.is_some(), "a verified record's CID is SHA-256");
                    let x = hashing.project_row(&row).map(|p| {
                        a.clear();
                        p.render(0, 7, Some(9), &mut a);
                    });
                    let y = known.project_row_hashed(&row, sha).map(|p| {
                        b.clear();
                        p.render(0, 7, Some(9), &mut b);
                    });
                    assert_eq!(x.is_ok(), y.is_ok(), "{}/{}", r.collection, r.rkey);
                    assert_eq!(a, b, "{}/{}", r.collection, r.rkey);
                    assert_eq!(
                        <Event>::value_len_of_row(&mut hashing, &row, 9, 7, &mut a).ok(),
                        <Event>::value_len_of_hashed_row(&mut known, &row, sha, 9, 7, &mut b).ok(),
                    );
                    checked += 1;
                }
            }
        }
        assert!(checked >= 2 * 840, "{checked} rows checked");
    }

    /// The corpus's real export (`repo.car`, 23 records), verified; `None` without the corpus.
    fn real_repo() -> Option<Verified> {
        real_repo_keeping(&crate::Collections::all())
    }

    /// [`real_repo`] with only the records of `keep`.
    fn real_repo_keeping(keep: &crate::Collections) -> Option<Verified> {
        let car = riptide_testdata::read("jetstream-2026-07/repo.car")?;
        let did = "did:plc:53iucmf5ldftgqyf2ac7hmhd";
        Some(crate::verify_car(Box::new(car), did, None, keep, "corpus").unwrap())
    }

    /// Folds the stored stream as a v2 subscriber does (a `#sync` drops what it held): each
    /// record key held and its CID, as goat lists a repository.
    fn folded(store: &Store) -> Vec<String> {
        let mut held: BTreeMap<String, String> = BTreeMap::new();
        for e in events(store) {
            match e["kind"].as_str().unwrap() {
                "sync" => held.clear(),
                _ => {
                    let c = &e["commit"];
                    held.insert(
                        format!(
                            "{}/{}",
                            c["collection"].as_str().unwrap(),
                            c["rkey"].as_str().unwrap()
                        ),
                        c["cid"].as_str().unwrap().to_owned(),
                    );
                }
            }
        }
        held.into_iter().map(|(k, c)| format!("{k}\t{c}")).collect()
    }

    /// A landing interrupted under one `--collections` filter and run again under another
    /// starts over as a replacement, its `#sync` dropping the pieces: resumed after the pieces'
    /// last key it would miss the records the new filter keeps below that key (the profile, the
    /// likes and the first posts here). Folded, the stream holds goat's listing of the export.
    #[test]
    fn a_partial_landing_resumed_with_other_collections_starts_over() {
        let posts = crate::Collections::parse(["app.bsky.feed.post"]).unwrap();
        let (Some(some), Some(all)) = (real_repo_keeping(&posts), real_repo()) else {
            return;
        };
        assert_eq!((some.kept(), all.kept()), (6, 23));
        let dir = tempfile::tempdir().unwrap();
        {
            let (store, resume) = Store::open_any(dir.path()).unwrap();
            let mut sink = StoreSink::new(store, resume)
                .with_piece_records(2)
                .with_collections(&posts);
            sink.crash_after_pieces(2);
            assert!(sink.write(&some).is_err());
        }
        let (store, resume) = Store::open_any(dir.path()).unwrap();
        let l = landed_in(&store, &all.did).unwrap().unwrap();
        assert_eq!(
            l.partial.map(|p| (l.records, p.collections)),
            Some((4, "app.bsky.feed.post".to_owned()))
        );
        let mut sink = StoreSink::new(store, resume)
            .with_piece_records(2)
            .with_collections(&crate::Collections::all());
        assert_eq!(sink.write(&all).unwrap().records, 23);
        sink.commit().unwrap();
        let store = sink.store();
        let kinds: Vec<EventKind> = untimed(store).into_iter().map(|(k, _)| k).collect();
        assert_eq!(kinds.len(), 4 + 1 + 23);
        assert_eq!(kinds[4], EventKind::Sync, "{kinds:?}");
        assert!(
            kinds[5..].iter().all(|k| *k == EventKind::Replacement),
            "{kinds:?}"
        );
        let goat =
            riptide_testdata::read_string("jetstream-2026-07/car_expected_records.tsv").unwrap();
        assert_eq!(folded(store), goat.lines().collect::<Vec<_>>());
        let l = landed_in(store, &all.did).unwrap().unwrap();
        assert!(l.replaced && l.partial.is_none(), "{l:?}");
        assert_eq!((l.records, l.first_seq), (23, Some(5)));
    }

    /// Every stored event as JSON without its landing time, with its stored kind.
    fn untimed(store: &Store) -> Vec<(EventKind, serde_json::Value)> {
        stored(store)
            .iter()
            .zip(events(store))
            .map(|(e, mut v)| {
                v.as_object_mut().unwrap().remove("time_us");
                (e.kind(), v)
            })
            .collect()
    }

    /// Lands `repos` into a new store under `dir` in pieces of `piece` records.
    fn land_all(dir: &std::path::Path, piece: usize, repos: &[&Verified]) -> Store {
        let (store, resume) = Store::open_any(dir).unwrap();
        let mut sink = StoreSink::new(store, resume).with_piece_records(piece);
        sink.recover(None).unwrap();
        for r in repos {
            sink.write(r).unwrap();
        }
        sink.commit().unwrap();
        let StoreSink { store, .. } = sink;
        store
    }

    /// A real repository landed in pieces of 7 records (4 batches) is, row for row, what one
    /// batch lands, and is goat's listing of the export; only the last piece seeds its chain
    /// state and its plain progress entry.
    #[test]
    fn a_real_repository_in_pieces_lands_as_in_one_batch() {
        let Some(real) = real_repo() else { return };
        let other = verified(11, 9);
        let (one, pieces) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let one = land_all(one.path(), PIECE_RECORDS, &[&other, &real]);
        let pieces = land_all(pieces.path(), 7, &[&other, &real]);
        let got = untimed(&pieces);
        assert_eq!(got.len(), 9 + 23);
        assert_eq!(got, untimed(&one));
        let goat =
            riptide_testdata::read_string("jetstream-2026-07/car_expected_records.tsv").unwrap();
        let listed: Vec<String> = got[9..]
            .iter()
            .map(|(k, e)| {
                assert_eq!(*k, EventKind::Commit);
                let c = &e["commit"];
                format!(
                    "{}/{}\t{}",
                    c["collection"].as_str().unwrap(),
                    c["rkey"].as_str().unwrap(),
                    c["cid"].as_str().unwrap()
                )
            })
            .collect();
        assert_eq!(listed, goat.lines().collect::<Vec<_>>());
        for store in [&one, &pieces] {
            let landed = landed_in(store, &real.did).unwrap().unwrap();
            assert_eq!(
                (landed.records, landed.first_seq, landed.partial),
                (23, Some(10), None)
            );
            let tip = store.account(&real.did).unwrap().unwrap().tip.unwrap();
            assert_eq!(tip.commit, real.commit);
        }
    }

    /// A crash between pieces (after 2 of 4 are durable) leaves 14 of the 23 records and no
    /// chain state (the account does not read as landed); landed again after the restart, the
    /// repository resumes at its 15th record: the store is the uninterrupted one, row for row.
    #[test]
    fn a_crash_between_pieces_resumes_and_lands_each_record_once() {
        let Some(real) = real_repo() else { return };
        let dir = tempfile::tempdir().unwrap();
        let whole = tempfile::tempdir().unwrap();
        let whole = land_all(whole.path(), PIECE_RECORDS, &[&real]);
        {
            let (store, resume) = Store::open_any(dir.path()).unwrap();
            let mut sink = StoreSink::new(store, resume).with_piece_records(7);
            sink.recover(None).unwrap();
            sink.crash_after_pieces(2);
            let e = sink.write(&real).unwrap_err();
            assert!(matches!(e, SinkError::Unavailable(_)), "{e}");
            // The process is gone: nothing of the sink's buffer reaches the store.
        }
        let (store, resume) = Store::open_any(dir.path()).unwrap();
        assert_eq!(resume.next_seq, 15);
        assert_eq!(events(&store).len(), 14);
        assert_eq!(store.account(&real.did).unwrap(), None);
        let l = landed_in(&store, &real.did).unwrap().unwrap();
        assert_eq!(
            (l.records, l.partial.clone()),
            (
                14,
                Some(Partial {
                    collections: String::new(),
                    commit: real.commit.to_string(),
                    after: real
                        .records()
                        .nth(13)
                        .map(|r| format!("{}/{}", r.collection, r.rkey))
                        .unwrap()
                })
            )
        );
        let mut sink = StoreSink::new(store, resume).with_piece_records(7);
        sink.recover(None).unwrap();
        assert_eq!(sink.write(&real).unwrap().records, 23);
        sink.commit().unwrap();
        assert_eq!(untimed(sink.store()), untimed(&whole));
        let l = landed_in(sink.store(), &real.did).unwrap().unwrap();
        assert_eq!((l.records, l.first_seq, l.partial), (23, Some(1), None));
        assert_eq!(
            sink.store().account(&real.did).unwrap(),
            whole.account(&real.did).unwrap()
        );
    }

    /// A piece ends at its byte bound too: with a bound below one record's event, every record
    /// is a piece of its own (a crash point after 5 pieces leaves 5 records), and the landing
    /// resumed with the same bound completes the one-batch result.
    #[test]
    fn a_piece_ends_at_its_byte_bound() {
        let a = verified(13, 12);
        let whole = tempfile::tempdir().unwrap();
        let whole = land_all(whole.path(), PIECE_RECORDS, &[&a]);
        let dir = tempfile::tempdir().unwrap();
        let open = || {
            let (store, resume) = Store::open_any(dir.path()).unwrap();
            StoreSink::new(store, resume).with_piece_bytes(1)
        };
        {
            let mut sink = open();
            sink.crash_after_pieces(5);
            assert!(sink.write(&a).is_err());
        }
        let mut sink = open();
        assert_eq!(events(sink.store()).len(), 5);
        assert_eq!(sink.write(&a).unwrap().records, 12);
        sink.commit().unwrap();
        assert_eq!(untimed(sink.store()), untimed(&whole));
    }

    /// Pieces of one commit, then another commit of the account (it moved on before the
    /// restart): the new one lands as a replacement, its `#sync` dropping the pieces, so folding
    /// the account from the stream holds exactly the new repository.
    #[test]
    fn a_partial_landing_of_another_commit_is_replaced_whole() {
        let (old, new) = (verified(12, 20), verified(12, 25));
        assert_eq!(old.did, new.did);
        assert_ne!(old.commit, new.commit);
        let dir = tempfile::tempdir().unwrap();
        {
            let (store, resume) = Store::open_any(dir.path()).unwrap();
            let mut sink = StoreSink::new(store, resume).with_piece_records(7);
            sink.crash_after_pieces(1);
            assert!(sink.write(&old).is_err());
        }
        let (store, resume) = Store::open_any(dir.path()).unwrap();
        let mut sink = StoreSink::new(store, resume).with_piece_records(7);
        assert_eq!(sink.write(&new).unwrap().records, 25);
        sink.commit().unwrap();
        let store = sink.store();
        let kinds: Vec<EventKind> = untimed(store).into_iter().map(|(k, _)| k).collect();
        assert_eq!(kinds.len(), 7 + 1 + 25);
        assert!(
            kinds[..7].iter().all(|k| *k == EventKind::Commit),
            "{kinds:?}"
        );
        assert_eq!(kinds[7], EventKind::Sync);
        assert!(
            kinds[8..].iter().all(|k| *k == EventKind::Replacement),
            "{kinds:?}"
        );
        let mut held: BTreeMap<String, String> = BTreeMap::new();
        for e in events(store) {
            match e["kind"].as_str().unwrap() {
                "sync" => held.clear(),
                _ => {
                    let c = &e["commit"];
                    held.insert(
                        format!(
                            "{}/{}",
                            c["collection"].as_str().unwrap(),
                            c["rkey"].as_str().unwrap()
                        ),
                        c["cid"].as_str().unwrap().to_owned(),
                    );
                }
            }
        }
        let want: BTreeMap<String, String> = new
            .records()
            .map(|r| (format!("{}/{}", r.collection, r.rkey), r.cid.to_string()))
            .collect();
        assert_eq!(held, want);
        let l = landed_in(store, &new.did).unwrap().unwrap();
        assert!(l.replaced && l.partial.is_none(), "{l:?}");
        assert_eq!((l.records, l.first_seq), (25, Some(8)));
    }
}
