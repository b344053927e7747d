//! Tombstones: which earlier rows a later event supersedes, kept for folding sealed segments.
//!
//! Why a module: the archive is bounded by folding history as Jetstream v2 does
//! (`internal/tombstone`): an update or delete supersedes the record's earlier create, update and
//! create-resync rows; a `#sync`, or an `#account` that says the account is deleted
//! (`active: false`, `status: "deleted"`), supersedes every earlier such row of the DID. The
//! tombstone of a key is the highest seq that superseded it; compaction
//! ([`crate::compact`]) drops the rows below it. Tombstones are derived from a batch's rows
//! ([`derive()`]) and written in the ingest batch that stores those rows ([`Tombstones::write`]),
//! so a tombstone is durable exactly when its row is. Partition `tombstones`:
//!
//! ```text
//! "r" did \0 collection \0 rkey  →  seq (BE u64)     update or delete of one record
//! "d" did                        →  seq (BE u64)     #sync, or #account status=deleted
//! ```
//!
//! A DID, NSID or record key never holds a NUL (their grammars), so the key splits back
//! unambiguously. Seqs only rise, so a write never needs to read the old value first.

use std::collections::HashMap;

use fjall::{Batch, Keyspace, PartitionCreateOptions, PartitionHandle};
use riptide_cbor::{Arena, Options};
use riptide_jetstream::StoredRow;
use riptide_segment::{BloomKey, Kind, Row};

/// Why tombstones could not be derived or read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TombstoneError {
    /// An `#account` row's payload is not the DAG-CBOR of an account event (ingest stores only
    /// verified payloads: the row is damaged).
    #[error("seq {seq}: #account payload of {did} does not decode: {why}")]
    AccountPayload {
        /// The row's seq.
        seq: u64,
        /// The row's DID.
        did: String,
        /// The decoder's reason.
        why: String,
    },
    /// A key or value of the partition is not one this module writes (our own corruption).
    #[error("tombstones partition: malformed entry {key:?}")]
    Malformed {
        /// The key, lossily as text.
        key: String,
    },
    /// fjall failed.
    #[error("tombstones partition: {0}")]
    Fjall(#[from] fjall::Error),
}

/// One tombstone to write: a key of the partition and the seq that superseded it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Tombstone {
    key: Vec<u8>,
    /// The superseding row's seq.
    pub seq: u64,
}

impl Tombstone {
    /// The tombstone of one record (an update or delete of it).
    pub fn record(did: &str, collection: &str, rkey: &str, seq: u64) -> Tombstone {
        let mut key = Vec::with_capacity(3 + did.len() + collection.len() + rkey.len());
        key.push(b'r');
        for (i, part) in [did, collection, rkey].into_iter().enumerate() {
            if i > 0 {
                key.push(0);
            }
            key.extend_from_slice(part.as_bytes());
        }
        Tombstone { key, seq }
    }

    /// The tombstone of a whole DID (a `#sync`, or the account deleted).
    pub fn did(did: &str, seq: u64) -> Tombstone {
        let mut key = Vec::with_capacity(1 + did.len());
        key.push(b'd');
        key.extend_from_slice(did.as_bytes());
        Tombstone { key, seq }
    }

    /// The partition key.
    pub fn key(&self) -> &[u8] {
        &self.key
    }
}

/// The tombstones a batch of rows creates, one per key (the highest seq), in first-seen order.
/// Rows other than update, delete, `#sync` and deleted `#account` create none.
pub fn derive<'r>(
    rows: impl IntoIterator<Item = &'r Row<'r>>,
) -> Result<Vec<Tombstone>, TombstoneError> {
    let mut first = None;
    let out = derive_each(rows, |e| {
        first.get_or_insert(e);
    });
    match first {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

/// [`derive()`] for a batch that is stored whatever its rows hold (the ingest batch): a row whose
/// tombstone cannot be derived (an `#account` payload that does not decode) is handed to `bad`
/// and creates none, and every other row's tombstone is still derived. The caller counts and
/// says each: that row's account stays unfolded (its earlier rows are kept, never dropped).
pub fn derive_each<'r>(
    rows: impl IntoIterator<Item = &'r Row<'r>>,
    mut bad: impl FnMut(TombstoneError),
) -> Vec<Tombstone> {
    let mut out: Vec<Tombstone> = Vec::new();
    let mut at: HashMap<Vec<u8>, usize> = HashMap::new();
    let mut arena = Arena::new();
    for r in rows {
        let t = match r.kind {
            Kind::Update | Kind::Delete => Tombstone::record(r.did, r.collection, r.rkey, r.seq),
            Kind::Sync => Tombstone::did(r.did, r.seq),
            Kind::Account => match account_deleted(&mut arena, r) {
                Ok(true) => Tombstone::did(r.did, r.seq),
                Ok(false) => continue,
                Err(e) => {
                    bad(e);
                    continue;
                }
            },
            _ => continue,
        };
        match at.get(&t.key) {
            Some(&i) => out[i].seq = out[i].seq.max(t.seq),
            None => {
                at.insert(t.key.clone(), out.len());
                out.push(t);
            }
        }
    }
    out
}

/// [`derive()`] for an ingest batch's [`StoredRow`]s paired with the seqs they are stored under.
pub fn derive_stored<'r>(
    rows: impl IntoIterator<Item = (u64, &'r StoredRow<'r>)>,
) -> Result<Vec<Tombstone>, TombstoneError> {
    let rows: Vec<Row<'_>> = rows.into_iter().map(|(seq, r)| r.row(seq, 0)).collect();
    derive(rows.iter())
}

/// Whether an `#account` row says the account is deleted, as Jetstream reads it: not active and
/// status `deleted`.
fn account_deleted(arena: &mut Arena, r: &Row<'_>) -> Result<bool, TombstoneError> {
    let bad = |why: String| TombstoneError::AccountPayload {
        seq: r.seq,
        did: r.did.to_owned(),
        why,
    };
    let mut tape = arena.tape(r.payload);
    let item = tape
        .decode(0..r.payload.len(), &Options::strict())
        .map_err(|e| bad(e.to_string()))?;
    let v = tape.value(item);
    let active = v
        .get("active")
        .and_then(|a| a.as_bool())
        .ok_or_else(|| bad("no boolean `active`".into()))?;
    let status = v.get("status").and_then(|s| s.as_str());
    Ok(!active && status == Some("deleted"))
}

/// The tombstones a compaction pass applies, in memory: every key whose tombstone is above the
/// pass's `compaction_seq`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// did → collection → rkey → seq: looked up with the row's `&str`s, allocating nothing.
    records: HashMap<String, HashMap<String, HashMap<String, u64>>>,
    record_count: usize,
    dids: HashMap<String, u64>,
}

impl Snapshot {
    /// Adds one tombstone (keeping the higher seq of a key already present).
    pub fn add(&mut self, t: &Tombstone) -> Result<(), TombstoneError> {
        let malformed = || TombstoneError::Malformed {
            key: String::from_utf8_lossy(&t.key).into_owned(),
        };
        let text = std::str::from_utf8(&t.key[1..]).map_err(|_| malformed())?;
        let slot = match t.key.first() {
            Some(b'd') if !text.is_empty() && !text.contains('\0') => {
                self.dids.entry(text.to_owned()).or_default()
            }
            Some(b'r') => {
                let mut parts = text.split('\0');
                let (Some(d), Some(c), Some(k), None) =
                    (parts.next(), parts.next(), parts.next(), parts.next())
                else {
                    return Err(malformed());
                };
                let rkeys = self
                    .records
                    .entry(d.to_owned())
                    .or_default()
                    .entry(c.to_owned())
                    .or_default();
                if !rkeys.contains_key(k) {
                    self.record_count += 1;
                }
                rkeys.entry(k.to_owned()).or_default()
            }
            _ => return Err(malformed()),
        };
        *slot = (*slot).max(t.seq);
        Ok(())
    }

    /// Whether `row` is a create, update or create-resync row that a tombstone supersedes
    /// (a strictly higher seq on its record or its DID).
    pub fn supersedes(&self, row: &Row<'_>) -> bool {
        if !row.kind.carries_record() {
            return false;
        }
        if self.dids.get(row.did).is_some_and(|&s| s > row.seq) {
            return true;
        }
        self.records
            .get(row.did)
            .and_then(|c| c.get(row.collection))
            .and_then(|k| k.get(row.rkey))
            .is_some_and(|&s| s > row.seq)
    }

    /// Every DID with a tombstone (of a record or of the DID), once each, with its bloom key
    /// and the highest seq among its tombstones.
    pub fn dids(&self) -> Vec<(BloomKey, u64)> {
        let mut top: HashMap<&str, u64> = HashMap::new();
        let keyed = self.records.iter().map(|(d, c)| {
            let top = c.values().flat_map(HashMap::values).copied().max();
            (d.as_str(), top.unwrap_or(0))
        });
        for (d, s) in keyed.chain(self.dids.iter().map(|(d, &s)| (d.as_str(), s))) {
            let e = top.entry(d).or_default();
            *e = (*e).max(s);
        }
        top.into_iter()
            .map(|(d, s)| (BloomKey::new(d.as_bytes()), s))
            .collect()
    }

    /// Tombstones held (records and DIDs).
    pub fn len(&self) -> usize {
        self.record_count + self.dids.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The `tombstones` partition.
#[derive(Clone)]
pub struct Tombstones {
    part: PartitionHandle,
}

impl Tombstones {
    /// Opens (creating) the partition in `ks`.
    pub fn open(ks: &Keyspace) -> Result<Tombstones, TombstoneError> {
        Ok(Tombstones {
            part: ks.open_partition("tombstones", PartitionCreateOptions::default())?,
        })
    }

    /// Adds `tombstones` to an ingest `batch` (the one that stores the rows they came from).
    pub fn write(&self, batch: &mut Batch, tombstones: &[Tombstone]) {
        for t in tombstones {
            batch.insert(&self.part, t.key.as_slice(), t.seq.to_be_bytes());
        }
    }

    /// Every entry of the partition, in key order, decoded.
    fn scan(&self) -> impl Iterator<Item = Result<Tombstone, TombstoneError>> + '_ {
        self.part.iter().map(|kv| {
            let (k, v) = kv?;
            let at = <[u8; 8]>::try_from(&v[..]).map_err(|_| TombstoneError::Malformed {
                key: String::from_utf8_lossy(&k).into_owned(),
            })?;
            Ok(Tombstone {
                key: k.to_vec(),
                seq: u64::from_be_bytes(at),
            })
        })
    }

    /// Every tombstone whose seq is above `seq`: what a pass with `compaction_seq = seq` applies
    /// (one scan of the partition; the pass's memory is that of the tombstones it returns).
    pub fn above(&self, seq: u64) -> Result<Snapshot, TombstoneError> {
        let mut snap = Snapshot::default();
        for t in self.scan() {
            let t = t?;
            if t.seq > seq {
                snap.add(&t)?;
            }
        }
        Ok(snap)
    }

    /// Removes every tombstone at or below `compaction_seq` (one batch, `SyncAll`): each has
    /// done its work, since every row below it is sealed and folded, and no later row is below
    /// it. Returns how many went. **Only on the ingest writer's thread, between its batches**: a
    /// tombstone the writer raised between this read and this batch would otherwise be lost.
    pub fn prune(&self, ks: &Keyspace, compaction_seq: u64) -> Result<usize, TombstoneError> {
        let mut batch = ks.batch().durability(Some(fjall::PersistMode::SyncAll));
        let mut n = 0;
        for t in self.scan() {
            let t = t?;
            if t.seq <= compaction_seq {
                batch.remove(&self.part, t.key);
                n += 1;
            }
        }
        if n > 0 {
            batch.commit()?;
        }
        Ok(n)
    }

    /// Every tombstone in the partition, in key order (one scan, all in memory: for tests and
    /// checks, not for a large partition on a hot path).
    pub fn all(&self) -> Result<Vec<Tombstone>, TombstoneError> {
        self.scan().collect()
    }

    /// About how many tombstones the partition holds, without a scan (fjall's count of its
    /// items, which counts a key written again more than once until its trees are compacted):
    /// for `/metrics`.
    pub fn approximate_len(&self) -> usize {
        self.part.approximate_len()
    }

    /// Tombstones in the partition.
    pub fn len(&self) -> Result<usize, TombstoneError> {
        Ok(self.part.len()?)
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> Result<bool, TombstoneError> {
        Ok(self.part.is_empty()?)
    }
}

impl std::fmt::Debug for Tombstones {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tombstones").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use riptide_cbor::{write_bool, write_int, write_map_header, write_text};

    fn row<'a>(seq: u64, kind: Kind, did: &'a str, rkey: &'a str, payload: &'a [u8]) -> Row<'a> {
        Row {
            seq,
            witnessed_at: 0,
            indexed_at: 0,
            kind,
            did,
            collection: if kind.is_commit() {
                "app.bsky.feed.like"
            } else {
                ""
            },
            rkey,
            rev: "",
            payload,
        }
    }

    /// An `#account` payload in DAG-CBOR's key order (did, seq, time, active, status).
    fn account(did: &str, active: bool, status: Option<&str>) -> Vec<u8> {
        let mut out = Vec::new();
        write_map_header(&mut out, 4 + usize::from(status.is_some()));
        write_text(&mut out, "did");
        write_text(&mut out, did);
        write_text(&mut out, "seq");
        write_int(&mut out, 1);
        write_text(&mut out, "time");
        write_text(&mut out, "2026-11-28T00:00:00Z");
        write_text(&mut out, "active");
        write_bool(&mut out, active);
        if let Some(s) = status {
            write_text(&mut out, "status");
            write_text(&mut out, s);
        }
        out
    }

    #[test]
    fn derives_one_tombstone_per_key_with_the_highest_seq() {
        let (deleted, deactivated, live) = (
            account("did:plc:b", false, Some("deleted")),
            account("did:plc:c", false, Some("deactivated")),
            account("did:plc:d", true, None),
        );
        let rows = [
            row(1, Kind::Create, "did:plc:a", "x", b""),
            row(2, Kind::Update, "did:plc:a", "x", b""),
            row(3, Kind::Delete, "did:plc:a", "x", b""),
            row(4, Kind::Delete, "did:plc:a", "y", b""),
            row(5, Kind::Sync, "did:plc:a", "", b""),
            row(6, Kind::Account, "did:plc:b", "", &deleted),
            row(7, Kind::Account, "did:plc:c", "", &deactivated),
            row(8, Kind::Account, "did:plc:d", "", &live),
            row(9, Kind::Identity, "did:plc:e", "", b""),
            row(10, Kind::CreateResync, "did:plc:a", "x", b""),
        ];
        let got = derive(rows.iter()).unwrap();
        assert_eq!(
            got,
            [
                Tombstone::record("did:plc:a", "app.bsky.feed.like", "x", 3),
                Tombstone::record("did:plc:a", "app.bsky.feed.like", "y", 4),
                Tombstone::did("did:plc:a", 5),
                Tombstone::did("did:plc:b", 6),
            ]
        );
        assert_eq!(got[0].key(), b"rdid:plc:a\0app.bsky.feed.like\0x");
        assert_eq!(got[2].key(), b"ddid:plc:a");
    }

    #[test]
    fn a_damaged_account_payload_is_a_typed_error() {
        let rows = [row(7, Kind::Account, "did:plc:b", "", b"\xa1")];
        let e = derive(rows.iter()).unwrap_err();
        assert!(
            matches!(e, TombstoneError::AccountPayload { seq: 7, .. }),
            "{e}"
        );
    }

    #[test]
    fn a_damaged_account_payload_is_handed_over_and_the_other_rows_still_derive() {
        let deleted = account("did:plc:b", false, Some("deleted"));
        let rows = [
            row(1, Kind::Update, "did:plc:a", "x", b""),
            row(2, Kind::Account, "did:plc:c", "", b"\xa1"),
            row(3, Kind::Account, "did:plc:b", "", &deleted),
            row(4, Kind::Account, "did:plc:d", "", b"\xa0"),
        ];
        let mut bad = Vec::new();
        let got = derive_each(rows.iter(), |e| bad.push(e));
        assert_eq!(
            got,
            [
                Tombstone::record("did:plc:a", "app.bsky.feed.like", "x", 1),
                Tombstone::did("did:plc:b", 3),
            ]
        );
        // The undecodable payload and the map without `active`, each said once.
        let seqs: Vec<u64> = bad
            .iter()
            .map(|e| match e {
                TombstoneError::AccountPayload { seq, .. } => *seq,
                other => panic!("{other}"),
            })
            .collect();
        assert_eq!(seqs, [2, 4]);
        assert!(matches!(
            derive(rows.iter()),
            Err(TombstoneError::AccountPayload { seq: 2, .. })
        ));
    }

    #[test]
    fn the_partition_keeps_what_a_batch_wrote_and_returns_what_is_above_a_seq() {
        let dir = tempfile::tempdir().unwrap();
        let ks = fjall::Config::new(dir.path()).open().unwrap();
        let t = Tombstones::open(&ks).unwrap();
        let mut b = ks.batch();
        t.write(
            &mut b,
            &[
                Tombstone::record("did:plc:a", "a.b.c", "k", 10),
                Tombstone::did("did:plc:z", 20),
            ],
        );
        b.commit().unwrap();
        let mut b = ks.batch();
        t.write(&mut b, &[Tombstone::record("did:plc:a", "a.b.c", "k", 30)]);
        b.commit().unwrap();
        assert_eq!(t.len().unwrap(), 2);

        let snap = t.above(20).unwrap();
        assert_eq!(snap.len(), 1);
        let create = |seq| Row {
            seq,
            witnessed_at: 0,
            indexed_at: 0,
            kind: Kind::Create,
            did: "did:plc:a",
            collection: "a.b.c",
            rkey: "k",
            rev: "",
            payload: b"",
        };
        assert!(snap.supersedes(&create(29)));
        assert!(!snap.supersedes(&create(30)));
        assert!(!snap.supersedes(&Row {
            kind: Kind::Delete,
            ..create(1)
        }));
        let all = t.above(0).unwrap();
        assert!(all.supersedes(&Row {
            did: "did:plc:z",
            ..create(19)
        }));
        assert_eq!(all.dids().len(), 2);

        // Pruning at 20 removes the DID's tombstone and keeps the record's (raised to 30).
        assert_eq!(t.prune(&ks, 20).unwrap(), 1);
        assert_eq!(t.len().unwrap(), 1);
        assert_eq!(t.above(0).unwrap(), snap);
        assert_eq!(t.prune(&ks, 29).unwrap(), 0);
    }

    #[test]
    fn malformed_keys_are_refused() {
        let mut s = Snapshot::default();
        for key in [&b"x"[..], b"rdid:plc:a\0only-two", b"d", b"r\xff"] {
            let t = Tombstone {
                key: key.to_vec(),
                seq: 1,
            };
            assert!(matches!(s.add(&t), Err(TombstoneError::Malformed { .. })));
        }
    }
}
