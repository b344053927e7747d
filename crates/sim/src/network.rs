//! The network a simulator serves: DID documents, handles and repositories, from a `riptide gen`
//! directory or built in memory by a test.
//!
//! Directory layout (what `riptide gen` writes): `did_docs.json` (DID → document), `repos/<did>.car`
//! (each account's repository export), optionally `big-repo.car` with `big-repo.did.json` (the
//! document of its account) and `firehose-frames.bin` (the stream the relay serves; frames are
//! slices of the one file buffer, not copies), `repos.json` (the point of the stream the
//! repositories are as of, and the accounts deactivated there). Every repository is read into
//! memory once, and its commit read (no hash check here: serving is not verifying) for
//! `listRepos`; the one repository generated on demand ([`Network::set_huge_repo`]) never is.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use riptide_car::{CarOptions, CarReader};
use riptide_gen::HugeRepo;
use riptide_identity::DidDoc;
use serde_json::Value;

/// Why a network could not be loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SimError {
    /// Reading a file failed.
    #[error("reading {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The error.
        source: std::io::Error,
    },
    /// A file is not what it should be.
    #[error("{path}: {why}")]
    Invalid {
        /// The file (or DID).
        path: String,
        /// What is wrong.
        why: String,
    },
    /// Binding a listener failed.
    #[error("binding {addr}: {source}")]
    Bind {
        /// The address.
        addr: String,
        /// The error.
        source: std::io::Error,
    },
    /// The hosts and faults asked for cannot be arranged.
    #[error("{0}")]
    Plan(#[from] crate::plan::PlanError),
    /// A repository could not be broken as its fault asks.
    #[error("{did}: {source}")]
    Tamper {
        /// The account.
        did: String,
        /// Why.
        source: crate::tamper::TamperError,
    },
}

/// One account: its document as served, its handle and repository.
#[derive(Debug, Clone)]
pub struct Account {
    /// The DID.
    pub did: String,
    /// The document as loaded (the PDS endpoint is rewritten when served).
    pub doc: Value,
    /// The handle the document claims, if any.
    pub handle: Option<String>,
    /// The repository export, if the network has one for the account.
    pub repo: Option<Bytes>,
    /// The repository's commit CID and rev, when it has one.
    pub head: Option<(String, String)>,
}

/// Every account, by DID, plus the handle index.
#[derive(Debug, Clone, Default)]
pub struct Network {
    pub(crate) accounts: BTreeMap<String, Account>,
    pub(crate) handles: BTreeMap<String, String>,
    pub(crate) frames: Vec<Bytes>,
    /// The repository generated on demand, if any ([`Network::set_huge_repo`]).
    pub(crate) huge: Option<Arc<HugeRepo>>,
    /// `repos.json`'s `as_of_frame`: the repositories are as of this many frames.
    pub(crate) as_of_frame: Option<u64>,
    /// `repos.json`'s `deactivated`: accounts deactivated by the stream at that point.
    pub(crate) deactivated: Vec<String>,
}

fn invalid(path: impl Into<String>, why: impl std::fmt::Display) -> SimError {
    SimError::Invalid {
        path: path.into(),
        why: why.to_string(),
    }
}

fn read(path: &Path) -> Result<Vec<u8>, SimError> {
    std::fs::read(path).map_err(|source| SimError::Io {
        path: path.display().to_string(),
        source,
    })
}

fn head_of(did: &str, car: &[u8]) -> Result<(String, String), SimError> {
    let mut reader = CarReader::new();
    let opts = CarOptions {
        verify: false,
        ..CarOptions::repository()
    };
    let car = reader.read(car, &opts).map_err(|e| invalid(did, e))?;
    let info = riptide_repo::inspect(&car).map_err(|e| invalid(did, e))?;
    Ok((info.commit.to_string(), info.rev))
}

impl Network {
    /// A network of `docs` (DID documents as JSON) and `repos` (DID, repository CAR). A
    /// repository may belong to no listed document (it is then served but resolves nowhere).
    pub fn new(
        docs: impl IntoIterator<Item = Value>,
        repos: impl IntoIterator<Item = (String, Bytes)>,
    ) -> Result<Network, SimError> {
        let mut net = Network::default();
        for doc in docs {
            net.add_doc(doc)?;
        }
        for (did, car) in repos {
            net.add_repo(&did, car)?;
        }
        Ok(net)
    }

    /// Adds (or replaces) a document.
    pub fn add_doc(&mut self, doc: Value) -> Result<(), SimError> {
        let parsed = DidDoc::from_value(&doc).map_err(|e| invalid("document", e))?;
        let did = parsed.did().to_string();
        let handle = parsed.handle().map(|h| h.to_string());
        if let Some(h) = &handle {
            self.handles.insert(h.clone(), did.clone());
        }
        let acc = self.accounts.entry(did.clone()).or_insert_with(|| Account {
            did: did.clone(),
            doc: Value::Null,
            handle: None,
            repo: None,
            head: None,
        });
        acc.doc = doc;
        acc.handle = handle;
        Ok(())
    }

    /// Adds (or replaces) an account's repository.
    pub fn add_repo(&mut self, did: &str, car: Bytes) -> Result<(), SimError> {
        // A repository that does not even name a commit is still served (tests tamper with
        // repositories on purpose); listRepos then shows no head for it.
        let head = head_of(did, &car).ok();
        let acc = self
            .accounts
            .entry(did.to_owned())
            .or_insert_with(|| Account {
                did: did.to_owned(),
                doc: Value::Null,
                handle: None,
                repo: None,
                head: None,
            });
        acc.repo = Some(car);
        acc.head = head;
        Ok(())
    }

    /// Makes `handle` resolve to `did` whatever the documents claim (a DNS record pointing at a
    /// DID that may not claim the handle back: the one-sided case the bidirectional check exists
    /// for).
    pub fn point_handle(&mut self, handle: &str, did: &str) {
        self.handles
            .insert(handle.to_ascii_lowercase(), did.to_owned());
    }

    /// Sets the frames the relay serves (`subscribeRepos`), in order; the relay assigns seqs.
    pub fn set_frames(&mut self, frames: Vec<Bytes>) {
        self.frames = frames;
    }

    /// The frames given to the relay, as loaded: the relay leaves out (and counts) those it
    /// cannot serve ([`riptide_relay::RelayStats::unservable`]).
    pub fn frames(&self) -> &[Bytes] {
        &self.frames
    }

    /// Adds a repository generated on demand (`riptide sim --huge-repo-bytes`): its account's
    /// document is added, `getRepo` streams it piece by piece ([`HugeRepo::piece`]).
    pub fn set_huge_repo(&mut self, huge: HugeRepo) -> Result<(), SimError> {
        self.add_doc(huge.account.did_doc())?;
        if let Some(a) = self.accounts.get_mut(&huge.account.did) {
            a.head = Some((huge.commit.to_string(), huge.rev.clone()));
            a.repo = None;
        }
        self.huge = Some(Arc::new(huge));
        Ok(())
    }

    /// The repository generated on demand, if any.
    pub fn huge_repo(&self) -> Option<&Arc<HugeRepo>> {
        self.huge.as_ref()
    }

    /// Whether `did`'s repository is served (a loaded export or the one generated on demand).
    pub fn has_repo(&self, did: &str) -> bool {
        self.accounts.get(did).is_some_and(|a| a.repo.is_some())
            || self.huge.as_ref().is_some_and(|h| h.account.did == did)
    }

    /// The DIDs whose repository is served, ascending.
    pub fn repo_dids(&self) -> Vec<String> {
        self.accounts
            .keys()
            .filter(|d| self.has_repo(d))
            .cloned()
            .collect()
    }

    /// Says the repositories are as of `frames` frames of the stream, and which accounts are
    /// deactivated at that point (what `riptide gen` writes to `repos.json`).
    pub fn set_as_of(&mut self, frames: u64, deactivated: Vec<String>) {
        self.as_of_frame = Some(frames);
        self.deactivated = deactivated;
    }

    /// Loads a `riptide gen` directory.
    pub fn load(dir: &Path) -> Result<Network, SimError> {
        let mut net = Network::default();
        let status_path = dir.join("repos.json");
        if status_path.exists() {
            let status: riptide_gen::output::ReposStatus =
                serde_json::from_slice(&read(&status_path)?)
                    .map_err(|e| invalid(status_path.display().to_string(), e))?;
            net.set_as_of(status.as_of_frame, status.deactivated);
        }
        let frames_path = dir.join("firehose-frames.bin");
        if frames_path.exists() {
            let file = Bytes::from(read(&frames_path)?);
            let split = riptide_firehose::corpus::split_frames(&file)
                .map_err(|e| invalid(frames_path.display().to_string(), e))?;
            net.frames = split.iter().map(|f| file.slice_ref(f.bytes)).collect();
        }
        let docs_path = dir.join("did_docs.json");
        let docs: Value = serde_json::from_slice(&read(&docs_path)?)
            .map_err(|e| invalid(docs_path.display().to_string(), e))?;
        let Value::Object(map) = docs else {
            return Err(invalid(
                docs_path.display().to_string(),
                "not a JSON object (DID → document)",
            ));
        };
        for (did, doc) in map {
            net.add_doc(doc).map_err(|e| invalid(did, e))?;
        }
        let big_doc = dir.join("big-repo.did.json");
        if big_doc.exists() {
            let doc: Value = serde_json::from_slice(&read(&big_doc)?)
                .map_err(|e| invalid(big_doc.display().to_string(), e))?;
            let did = DidDoc::from_value(&doc)
                .map_err(|e| invalid(big_doc.display().to_string(), e))?
                .did()
                .to_string();
            if net.accounts.get(&did).is_none_or(|a| a.doc.is_null()) {
                net.add_doc(doc)?;
            }
            net.add_repo(&did, Bytes::from(read(&dir.join("big-repo.car"))?))?;
        }
        let repos = dir.join("repos");
        if repos.is_dir() {
            let entries = std::fs::read_dir(&repos).map_err(|source| SimError::Io {
                path: repos.display().to_string(),
                source,
            })?;
            for entry in entries {
                let entry = entry.map_err(|source| SimError::Io {
                    path: repos.display().to_string(),
                    source,
                })?;
                let name = entry.file_name().to_string_lossy().into_owned();
                let Some(did) = name.strip_suffix(".car") else {
                    continue;
                };
                net.add_repo(did, Bytes::from(read(&entry.path())?))?;
            }
        }
        Ok(net)
    }

    /// The accounts, by DID.
    pub fn accounts(&self) -> impl Iterator<Item = &Account> {
        self.accounts.values()
    }

    /// The account of `did`.
    pub fn account(&self, did: &str) -> Option<&Account> {
        self.accounts.get(did)
    }

    /// The DID a handle names.
    pub fn did_of_handle(&self, handle: &str) -> Option<&str> {
        self.handles
            .get(&handle.to_ascii_lowercase())
            .map(String::as_str)
    }
}
