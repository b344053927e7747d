//! What fetching one repository gives: a [`Verified`] repository, or a typed [`Failure`].
//!
//! Why a module: the outcome is the contract between the fetch, the scheduler (which retries by
//! kind), the sinks (which take only verified records) and the operator (who reads failures by
//! [`FailKind::reason`] in `riptide backfill status` and the logs). Every kind has one stable
//! snake-case name, so counts keep their meaning across versions.
//!
//! Memory: a [`Verified`] holds the repository's bytes as fetched (in memory, or a read-only map
//! of its spool file) and, per kept record, its key, CID and place in those bytes; records are
//! borrowed from it ([`Verified::records`]), never copied.

use std::ops::Range;

use riptide_cbor::CidBuf;

/// Why a repository was not backfilled. `#[non_exhaustive]`: new kinds may come.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum FailKind {
    /// No such repository (`RepoNotFound`, a 404, or no DID document).
    NotFound,
    /// The account is deactivated (`RepoDeactivated`).
    Deactivated,
    /// The account was taken down (`RepoTakendown`).
    TakenDown,
    /// The account is suspended (`RepoSuspended`).
    Suspended,
    /// The fetch took longer than its timeout.
    Timeout,
    /// The body arrived slower than the minimum rate (a trickle).
    TooSlow,
    /// The repository is larger than the size bound.
    TooLarge,
    /// The host kept answering `429` past the attempts allowed.
    RateLimited,
    /// The body or the CAR ended early.
    Truncated,
    /// A block does not hash to its CID, or a CID does not parse.
    BadCid,
    /// The commit's signature does not verify with the DID document's key.
    BadSignature,
    /// The repository's commit names another DID.
    WrongDid,
    /// The MST is not canonical, or rebuilt from its leaves it is not the commit's `data`.
    MstInvalid,
    /// A block the repository needs (commit, MST node, record) is not in the CAR.
    MissingBlock,
    /// The CAR's framing or header is bad.
    BadCar,
    /// The commit block does not decode as a commit.
    BadCommit,
    /// The DID document could not be had or has no usable key or PDS.
    Identity,
    /// Another HTTP status (a 5xx, an unexpected 4xx).
    Http,
    /// A transport failure (connect, reset, refused redirect).
    Network,
}

impl FailKind {
    /// Every kind, in a stable order (status output, metrics).
    pub const ALL: [FailKind; 19] = [
        FailKind::NotFound,
        FailKind::Deactivated,
        FailKind::TakenDown,
        FailKind::Suspended,
        FailKind::Timeout,
        FailKind::TooSlow,
        FailKind::TooLarge,
        FailKind::RateLimited,
        FailKind::Truncated,
        FailKind::BadCid,
        FailKind::BadSignature,
        FailKind::WrongDid,
        FailKind::MstInvalid,
        FailKind::MissingBlock,
        FailKind::BadCar,
        FailKind::BadCommit,
        FailKind::Identity,
        FailKind::Http,
        FailKind::Network,
    ];

    /// The stable snake-case name (metrics labels, status, logs).
    pub fn reason(self) -> &'static str {
        match self {
            FailKind::NotFound => "not_found",
            FailKind::Deactivated => "deactivated",
            FailKind::TakenDown => "taken_down",
            FailKind::Suspended => "suspended",
            FailKind::Timeout => "timeout",
            FailKind::TooSlow => "too_slow",
            FailKind::TooLarge => "too_large",
            FailKind::RateLimited => "rate_limited",
            FailKind::Truncated => "truncated",
            FailKind::BadCid => "bad_cid",
            FailKind::BadSignature => "bad_signature",
            FailKind::WrongDid => "wrong_did",
            FailKind::MstInvalid => "mst_invalid",
            FailKind::MissingBlock => "missing_block",
            FailKind::BadCar => "bad_car",
            FailKind::BadCommit => "bad_commit",
            FailKind::Identity => "identity",
            FailKind::Http => "http",
            FailKind::Network => "network",
        }
    }

    /// The kind named `reason` ([`FailKind::reason`]).
    pub fn from_reason(reason: &str) -> Option<FailKind> {
        FailKind::ALL.into_iter().find(|k| k.reason() == reason)
    }

    /// Whether asking again later may succeed: the host or the path was at fault, not the
    /// repository. A repository that does not verify is not fetched again (the same bytes
    /// would come back).
    pub fn is_transient(self) -> bool {
        matches!(
            self,
            FailKind::Timeout
                | FailKind::TooSlow
                | FailKind::RateLimited
                | FailKind::Truncated
                | FailKind::Http
                | FailKind::Network
        )
    }

    /// Whether an account's DID document older than its last operation could cause this (its
    /// key rotated: the signature fails; its PDS moved: the old one has no repository, or the
    /// account deactivated there; the document no longer usable): worth asking the PLC
    /// directory past a local copy of it (`riptide backfill --plc-mirror`).
    pub fn may_be_stale_identity(self) -> bool {
        matches!(
            self,
            FailKind::BadSignature
                | FailKind::NotFound
                | FailKind::Deactivated
                | FailKind::Identity
        )
    }

    /// Whether the failure is the transport's, so that another source (the relay) may do
    /// better than the account's PDS. A definite answer about the account (not found,
    /// deactivated…) or a repository that does not verify is the PDS's word and stands; a
    /// `429` is waited out, not routed around.
    pub fn try_elsewhere(self) -> bool {
        matches!(
            self,
            FailKind::Timeout
                | FailKind::TooSlow
                | FailKind::Truncated
                | FailKind::Http
                | FailKind::Network
        )
    }
}

impl std::fmt::Display for FailKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.reason())
    }
}

/// A repository that was not backfilled, and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{did}: {kind}: {detail}")]
pub struct Failure {
    /// The account.
    pub did: String,
    /// What kind of failure.
    pub kind: FailKind,
    /// What exactly (the source, the error).
    pub detail: String,
}

impl Failure {
    /// A failure of `did`.
    pub fn new(did: &str, kind: FailKind, detail: impl Into<String>) -> Failure {
        Failure {
            did: did.to_owned(),
            kind,
            detail: detail.into(),
        }
    }
}

/// The bytes a [`Verified`] borrows its records from.
pub type RepoBytes = Box<dyn std::ops::Deref<Target = [u8]> + Send + Sync>;

/// One record kept, as an index into the repository's bytes.
#[derive(Debug, Clone)]
pub(crate) struct RecordAt {
    /// `collection/rkey`.
    pub(crate) key: String,
    /// Where the `/` is in `key`.
    pub(crate) slash: usize,
    pub(crate) cid: CidBuf,
    pub(crate) at: Range<usize>,
}

/// A repository fetched and verified whole: CIDs, commit signature with the DID document's
/// key, MST structure and root, for the right DID.
pub struct Verified {
    /// The account.
    pub did: String,
    /// The commit's `rev`.
    pub rev: String,
    /// The commit block's CID.
    pub commit: CidBuf,
    /// The MST root.
    pub data: CidBuf,
    /// Records in the repository (kept or not).
    pub total_records: usize,
    /// Bytes of the CAR.
    pub bytes: u64,
    /// The `getRepo` URL it came from.
    pub source: String,
    pub(crate) car: RepoBytes,
    pub(crate) records: Vec<RecordAt>,
    /// Where the signed commit block is in `car` (found by the verification's walk; `None` for
    /// a repository without records, whose walk visits none).
    pub(crate) commit_at: Option<Range<usize>>,
}

impl std::fmt::Debug for Verified {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Verified")
            .field("did", &self.did)
            .field("rev", &self.rev)
            .field("commit", &self.commit.to_string())
            .field("records", &self.records.len())
            .field("bytes", &self.bytes)
            .finish()
    }
}

/// One record of a [`Verified`] repository: its DAG-CBOR bytes exactly as signed. The one type
/// of a repository's record, whether it lands as a `create` or as a replacement row
/// (`riptide_jetstream::replace`, where it is defined).
pub use riptide_jetstream::replace::ReplacementRecord as Record;

impl Verified {
    /// Record `r` of this repository as the row it lands as over an account with no earlier
    /// rows: a `create` at the repository's rev (the store sink's and `serve --backfill`'s).
    pub fn create_row<'a>(&'a self, r: &Record<'a>) -> riptide_jetstream::StoredRow<'a> {
        riptide_jetstream::StoredRow::Commit {
            did: &self.did,
            rev: &self.rev,
            action: riptide_firehose::Action::Create,
            collection: r.collection,
            rkey: r.rkey,
            record: Some(r.bytes),
        }
    }

    /// A repository verified elsewhere, rebuilt from its commit and its records (a backfill
    /// worker's output on Kafka, `riptide_kafka::repo_record`): its bytes become a CAR rooted
    /// at `commit` holding the commit block and each record's block, and reading that CAR back
    /// checks every block against its CID, so a record whose bytes are not the ones its CID
    /// names is refused here. The MST is not carried, so its membership is the worker's word
    /// (the worker verified the whole repository).
    pub fn from_records<'r>(
        did: &str,
        rev: &str,
        commit: CidBuf,
        data: CidBuf,
        commit_block: &[u8],
        records: impl IntoIterator<Item = Record<'r>> + Clone,
        source: &str,
    ) -> Result<Verified, riptide_car::CarError> {
        let car = riptide_car::write_car(
            std::slice::from_ref(&commit),
            std::iter::once((commit.as_cid(), commit_block)).chain(
                records
                    .clone()
                    .into_iter()
                    .map(|r| (r.cid.as_cid(), r.bytes)),
            ),
        );
        let mut reader = riptide_car::CarReader::new();
        let parsed = reader.read(&car, &riptide_car::CarOptions::repository())?;
        let base = car.as_ptr() as usize;
        let commit_at = parsed.get(commit.as_cid()).map(|b| {
            let start = b.as_ptr() as usize - base;
            start..start + b.len()
        });
        let mut at = Vec::new();
        for r in records {
            // Every block was just written, and verified by the read.
            if let Some(block) = parsed.get(r.cid.as_cid()) {
                let start = block.as_ptr() as usize - base;
                at.push(RecordAt {
                    key: format!("{}/{}", r.collection, r.rkey),
                    slash: r.collection.len(),
                    cid: *r.cid,
                    at: start..start + block.len(),
                });
            }
        }
        Ok(Verified {
            did: did.to_owned(),
            rev: rev.to_owned(),
            commit,
            data,
            total_records: at.len(),
            bytes: car.len() as u64,
            source: source.to_owned(),
            car: Box::new(car),
            records: at,
            commit_at,
        })
    }

    /// The signed commit block (what a replacement's `#sync` and a worker's Kafka record
    /// carry): where the verification found it, else read from the CAR again (a repository
    /// without records). `None` only if the CAR no longer reads, which a verified one does.
    pub fn commit_block(&self) -> Option<&[u8]> {
        if let Some(at) = &self.commit_at {
            return self.car.get(at.clone());
        }
        let mut reader = riptide_car::CarReader::new();
        let opts = riptide_car::CarOptions {
            verify: false,
            ..riptide_car::CarOptions::repository()
        };
        let block = reader
            .read(&self.car, &opts)
            .ok()?
            .get(self.commit.as_cid())?;
        // The reader indexes `self.car` without copying: the block is a slice of it.
        let start = block.as_ptr() as usize - self.car.as_ptr() as usize;
        Some(&self.car[start..start + block.len()])
    }

    /// The records kept (all, or those of the collections asked for), in MST key order.
    pub fn records(&self) -> impl ExactSizeIterator<Item = Record<'_>> + '_ {
        self.records.iter().map(move |r| Record {
            collection: &r.key[..r.slash],
            rkey: &r.key[r.slash + 1..],
            cid: &r.cid,
            bytes: &self.car[r.at.clone()],
        })
    }

    /// How many records are kept.
    pub fn kept(&self) -> usize {
        self.records.len()
    }
}
