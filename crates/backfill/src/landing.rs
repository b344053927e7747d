//! A repository's landing in a store, as its progress entry records it: [`Landed`] (the store's
//! `backfill` partition: DID → entry), [`Partial`] (a landing in pieces not finished), and where
//! a landing begins ([`begin`]).
//!
//! Why a module of its own: two writers land verified repositories in a store, in pieces of at
//! most [`PIECE_RECORDS`] records, and must agree on what an entry says and on how a landing
//! interrupted between its pieces goes on: `riptide backfill --data` ([`crate::StoreSink`])
//! and `riptide serve --backfill` (`riptide_serve::backfill`, through ingest's writer). Every
//! piece but the last carries the entry marked [`Landed::partial`] (the commit landing and the
//! key of the last record written); the last carries the plain entry. After a crash between
//! pieces the repository is fetched again and [`begin`] says what to do: the same commit
//! resumes after the entry's key, in MST key order (neither lost nor written twice); another
//! commit starts over, its records replacing the pieces written as earlier rows.

use riptide_store::{Store, Text};
use serde::{Deserialize, Serialize};

use crate::outcome::{Record, Verified};
use crate::sink::SinkError;

/// Records per landing piece by default (`--landing-records`): about 10 MB of events and rows
/// for typical Bluesky records, against up to 2 GiB for a repository in one batch.
pub const PIECE_RECORDS: usize = 10_000;

/// A piece also ends once it holds this many bytes of events and rows: a piece of large
/// records is bounded in bytes too.
pub const PIECE_BYTES: usize = 16 << 20;

/// A repository landing in pieces whose last piece is not durable yet (module docs): which
/// commit, and where its next piece begins.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Partial {
    /// The commit landing (its CID).
    pub commit: String,
    /// The key (`collection/rkey`) of the last record the durable pieces hold: the landing
    /// resumes after it in MST key order.
    pub after: String,
    /// The `--collections` it was landing with ([`crate::Collections::key`]; empty: every
    /// collection, as for an entry written before this field): a landing resumed with another
    /// filter would miss records the new one keeps below `after`, so it starts over, replacing
    /// the pieces (module docs).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub collections: String,
}

/// What the store's `backfill` partition says of a repository that landed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Landed {
    /// The rev backfilled.
    pub rev: String,
    /// Records written as events.
    pub records: u64,
    /// Records not written: outside the atproto data model.
    pub dropped: u64,
    /// The seq of its first event (`None`: no event, or not known to the writer of the entry).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_seq: Option<u64>,
    /// Why it got no rows although verified: the store already held a newer commit of the
    /// account.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub superseded: Option<String>,
    /// Whether it replaced the account's earlier rows: a `#sync`, then its records as
    /// `create-resync` rows.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub replaced: bool,
    /// Set while the repository lands in pieces and its last piece is not durable: the counts
    /// above are then those of the pieces written (module docs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partial: Option<Partial>,
}

impl Landed {
    /// Nothing landed yet of a repository at `rev`.
    pub fn new(rev: &str) -> Landed {
        Landed {
            rev: rev.to_owned(),
            records: 0,
            dropped: 0,
            first_seq: None,
            superseded: None,
            replaced: false,
            partial: None,
        }
    }

    /// The entry as stored (JSON).
    pub fn to_vec(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// The entry a piece that is not the last carries: these counts, and that the landing of
    /// `commit` under the collections filter `collections` ([`Partial::collections`]) goes on
    /// after the key `after`.
    pub fn piece(&self, commit: &str, after: String, collections: &str) -> Landed {
        Landed {
            partial: Some(Partial {
                commit: commit.to_owned(),
                after,
                collections: collections.to_owned(),
            }),
            ..self.clone()
        }
    }

    /// Reads an entry of `store` (for the error: whose).
    pub fn parse<T: Text>(store: &Store<T>, did: &str, raw: &[u8]) -> Result<Landed, SinkError> {
        serde_json::from_slice(raw).map_err(|e| SinkError::Corrupt {
            what: format!("{}: backfill progress of {did}", store.dir().display()),
            why: e.to_string(),
        })
    }
}

/// What `store`'s `backfill` partition says landed for `did` (the truth of what landed).
pub fn landed_in<T: Text>(store: &Store<T>, did: &str) -> Result<Option<Landed>, SinkError> {
    match store.progress(did) {
        Ok(Some(v)) => Landed::parse(store, did, &v).map(Some),
        Ok(None) => Ok(None),
        Err(e) => Err(SinkError::Store {
            what: store.dir().display().to_string(),
            source: e,
        }),
    }
}

/// Where a landing of a repository begins, given its account's entry ([`begin`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Begin {
    /// It landed already (a plain entry: before a crash, its status lost): nothing to write.
    Landed(Landed),
    /// Pieces of this very commit are durable: go on after the key `after`, from the counts
    /// of `landed` (its `partial` cleared).
    Resume {
        /// The key of the last record written.
        after: String,
        /// The counts so far.
        landed: Landed,
    },
    /// From its first record. `earlier_pieces`: the store holds pieces of another commit of
    /// the account, which are earlier rows its records replace.
    Fresh {
        /// Pieces of another commit's landing are stored.
        earlier_pieces: bool,
    },
}

/// Where the landing of `repo` under the collections filter `collections`
/// ([`Partial::collections`]) begins, its account's entry being `entry` (module docs).
pub fn begin(entry: Option<Landed>, repo: &Verified, collections: &str) -> Begin {
    let Some(l) = entry else {
        return Begin::Fresh {
            earlier_pieces: false,
        };
    };
    match &l.partial {
        None => Begin::Landed(l),
        Some(p)
            if p.commit == repo.commit.to_string()
                && l.rev == repo.rev
                && p.collections == collections =>
        {
            Begin::Resume {
                after: p.after.clone(),
                landed: Landed {
                    partial: None,
                    ..l.clone()
                },
            }
        }
        // Another commit of the account, or the same one landed under another collections
        // filter: its pieces are earlier rows, replaced anew.
        Some(_) => Begin::Fresh {
            earlier_pieces: true,
        },
    }
}

/// A record's key in its repository's MST (`collection/rkey`), which a [`Partial`] names.
pub fn key(r: &Record<'_>) -> String {
    format!("{}/{}", r.collection, r.rkey)
}

/// `repo`'s records after the key `after` (all: `None`), in MST key order, with their index.
pub fn records_after<'a>(
    repo: &'a Verified,
    after: Option<&'a str>,
) -> impl Iterator<Item = (usize, Record<'a>)> + 'a {
    repo.records()
        .enumerate()
        .skip_while(move |(_, r)| after.is_some_and(|a| *key(r) <= *a))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::sink::tests::verified;

    #[test]
    fn a_landing_begins_fresh_resumes_its_own_commit_and_replaces_another() {
        let repo = verified(1, 5);
        assert_eq!(
            begin(None, &repo, ""),
            Begin::Fresh {
                earlier_pieces: false
            }
        );
        let mut done = Landed::new(&repo.rev);
        done.records = 5;
        assert_eq!(
            begin(Some(done.clone()), &repo, ""),
            Begin::Landed(done.clone())
        );
        let keys: Vec<String> = repo.records().map(|r| key(&r)).collect();
        let mut two = Landed::new(&repo.rev);
        two.records = 2;
        let piece = two.piece(&repo.commit.to_string(), keys[1].clone(), "");
        assert_eq!(
            begin(Some(piece.clone()), &repo, ""),
            Begin::Resume {
                after: keys[1].clone(),
                landed: two
            }
        );
        // The same commit landed under another collections filter: over again, replacing.
        assert_eq!(
            begin(Some(piece.clone()), &repo, "app.bsky.feed.post"),
            Begin::Fresh {
                earlier_pieces: true
            }
        );
        let rest: Vec<String> = records_after(&repo, Some(&keys[1]))
            .map(|(_, r)| key(&r))
            .collect();
        assert_eq!(rest, keys[2..]);
        // Another commit of the account: its pieces are replaced.
        let other = verified(2, 5);
        let mut theirs = piece;
        theirs.partial.as_mut().unwrap().commit = other.commit.to_string();
        assert_eq!(
            begin(Some(theirs), &repo, ""),
            Begin::Fresh {
                earlier_pieces: true
            }
        );
        // The entry round-trips as stored.
        let raw = done.to_vec();
        assert_eq!(serde_json::from_slice::<Landed>(&raw).unwrap(), done);
    }
}
