//! Writing a generated network to a directory (the layout other tools rely on).
//!
//! ```text
//! DIR/firehose-frames.bin   the stream, corpus format (shared/docs/formats.md)
//! DIR/did_docs.json         DID -> DID document, every account (and the big repo's)
//! DIR/adversarial.json      [{"index","defect","expected_verdict"}] (with --adversarial)
//! DIR/repos/<did>.car       each account's full repository at the end (with --repos), or after
//!                           frame K (with --repos-at K)
//! DIR/repos.json            {"as_of_frame": K, "deactivated": [DID…]} (with --repos)
//! DIR/big-repo.car          one large repository export (with --big-repo)
//! DIR/big-repo.did.json     its DID document (one object; `id` is its DID)
//! ```
//!
//! Frames are streamed to the file as they are made (the count is known up front), so memory
//! does not grow with the number of events. Every file is written under a temporary name
//! (`.NAME.tmp`) and renamed into place whole; `firehose-frames.bin` is removed at the start and
//! renamed into place last, so its presence means the directory is complete.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use crate::big_repo::big_repo;
use crate::error::GenError;
use crate::network::{did_docs, Config, Network};

/// What was written.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// Frames written.
    pub frames: u64,
    /// Bytes of `firehose-frames.bin`.
    pub frame_bytes: u64,
    /// Accounts (DID documents, big repo's included).
    pub did_docs: usize,
    /// Adversarial frames.
    pub adversarial: usize,
    /// Repositories written under `repos/`.
    pub repos: usize,
    /// Bytes of `big-repo.car`, if written.
    pub big_repo_bytes: Option<u64>,
}

/// Where a file is written before it is renamed to `path`: `.NAME.tmp` beside it.
fn temp_name(path: &Path) -> std::path::PathBuf {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    path.with_file_name(format!(".{name}.tmp"))
}

/// Writes `path` whole or not at all: to its temporary name, then renamed over it (issue 39: an
/// interrupted `gen` left files that claimed more than they held).
fn write_file(path: &Path, bytes: &[u8]) -> Result<(), GenError> {
    let tmp = temp_name(path);
    std::fs::write(&tmp, bytes).map_err(|e| GenError::io(&tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| GenError::io(path, e))
}

/// How far a run has got ([`write_dir_with`]), for a caller that shows progress.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Stage {
    /// Making the accounts and their starting repositories (before the first frame).
    Accounts,
    /// `done` of `total` frames written (reported every [`PROGRESS_FRAMES`] frames and at the
    /// end).
    Frames {
        /// Frames written.
        done: u64,
        /// Frames to write.
        total: u64,
    },
    /// Making `big-repo.car` (with `--big-repo`).
    BigRepo,
}

/// Frames between two [`Stage::Frames`] reports.
pub const PROGRESS_FRAMES: u64 = 1024;

/// Generates `cfg` into `dir` (created if needed).
pub fn write_dir(cfg: &Config, dir: &Path) -> Result<Summary, GenError> {
    write_network(cfg, dir).map(|(summary, _)| summary)
}

/// [`write_dir`], telling `progress` how far it has got (`riptide gen`'s progress on long runs).
pub fn write_dir_with(
    cfg: &Config,
    dir: &Path,
    progress: &mut dyn FnMut(Stage),
) -> Result<Summary, GenError> {
    write_network_with(cfg, dir, progress).map(|(summary, _)| summary)
}

/// [`write_dir`], returning the network too, as it stands after the last frame written: a
/// caller can [`Network::extend`] it and go on generating the same stream (a live demo).
pub fn write_network(cfg: &Config, dir: &Path) -> Result<(Summary, Network), GenError> {
    write_network_with(cfg, dir, &mut |_| {})
}

/// [`write_network`] with progress reports.
pub fn write_network_with(
    cfg: &Config,
    dir: &Path,
    progress: &mut dyn FnMut(Stage),
) -> Result<(Summary, Network), GenError> {
    std::fs::create_dir_all(dir).map_err(|e| GenError::io(dir, e))?;
    let count = u32::try_from(cfg.events)
        .map_err(|_| GenError::Config("the corpus format holds at most 2^32-1 frames".into()))?;
    progress(Stage::Accounts);
    let mut net = Network::new(cfg.clone())?;
    // The frames file is the directory's mark of completion: removed first, written under a
    // temporary name, and renamed into place last, after every other file. An interrupted run
    // leaves no `firehose-frames.bin`, so nothing reads a half-written directory (or one whose
    // documents are another run's) as a network.
    let done = dir.join("firehose-frames.bin");
    match std::fs::remove_file(&done) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(GenError::io(&done, e)),
        _ => {}
    }
    let path = temp_name(&done);
    let file = File::create(&path).map_err(|e| GenError::io(&path, e))?;
    let mut w = BufWriter::with_capacity(1 << 20, file);
    let mut summary = Summary::default();
    let mut repos_written = 0;
    let io = |e| GenError::io(&path, e);
    w.write_all(&count.to_be_bytes()).map_err(io)?;
    summary.frame_bytes = 4;
    let mut emit = |frame: &[u8]| -> Result<(), GenError> {
        let len = u32::try_from(frame.len())
            .map_err(|_| GenError::Internal("frame over 4 GiB".into()))?;
        w.write_all(&len.to_be_bytes()).map_err(io)?;
        w.write_all(frame).map_err(io)?;
        summary.frames += 1;
        summary.frame_bytes += 4 + frame.len() as u64;
        if summary.frames % PROGRESS_FRAMES == 0 || summary.frames == cfg.events {
            progress(Stage::Frames {
                done: summary.frames,
                total: cfg.events,
            });
        }
        Ok(())
    };
    // The repositories are exported after `as_of` frames: the end, or `--repos-at K`.
    let as_of = match cfg.repos_at {
        Some(k) if cfg.keep_records => k.min(cfg.events),
        _ => cfg.events,
    };
    net.extend(as_of);
    net.run(&mut emit)?;
    if cfg.keep_records {
        write_repos(&net, dir, as_of, &mut repos_written)?;
    }
    net.extend(cfg.events - as_of);
    net.run(&mut emit)?;
    w.flush().map_err(io)?;
    summary.repos = repos_written;

    let mut accounts: Vec<crate::Account> = net.accounts().cloned().collect();
    if let Some(n) = cfg.big_repo {
        progress(Stage::BigRepo);
        let dids: Vec<String> = accounts.iter().map(|a| a.did.clone()).collect();
        let big = big_repo(cfg.seed, n, &dids)?;
        write_file(&dir.join("big-repo.car"), &big.car)?;
        let doc = serde_json::to_vec_pretty(&big.account.did_doc())
            .map_err(|e| GenError::Internal(e.to_string()))?;
        write_file(&dir.join("big-repo.did.json"), &doc)?;
        summary.big_repo_bytes = Some(big.car.len() as u64);
        accounts.push(big.account);
    }
    let docs = did_docs(&accounts);
    summary.did_docs = docs.len();
    let json = serde_json::to_vec_pretty(&docs).map_err(|e| GenError::Internal(e.to_string()))?;
    write_file(&dir.join("did_docs.json"), &json)?;

    if cfg.adversarial > 0.0 {
        let json = serde_json::to_vec_pretty(net.adversarial())
            .map_err(|e| GenError::Internal(e.to_string()))?;
        write_file(&dir.join("adversarial.json"), &json)?;
        summary.adversarial = net.adversarial().len();
    }
    std::fs::rename(&path, &done).map_err(|e| GenError::io(&done, e))?;
    Ok((summary, net))
}

/// What `DIR/repos.json` says about the exported repositories.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ReposStatus {
    /// The repositories are as of this many frames of `firehose-frames.bin` (all of them
    /// unless `--repos-at K`): frame `as_of_frame + 1` is the first one after them.
    pub as_of_frame: u64,
    /// Accounts deactivated (`#account` with `status: deactivated`) at that point.
    pub deactivated: Vec<String>,
}

/// Writes `DIR/repos/<did>.car` for every account as the network stands, and `DIR/repos.json`.
fn write_repos(net: &Network, dir: &Path, as_of: u64, written: &mut usize) -> Result<(), GenError> {
    let repos = dir.join("repos");
    std::fs::create_dir_all(&repos).map_err(|e| GenError::io(&repos, e))?;
    for r in net.export_repos() {
        let (did, car) = r?;
        write_file(&repos.join(format!("{did}.car")), &car)?;
        *written += 1;
    }
    let status = ReposStatus {
        as_of_frame: as_of,
        deactivated: net.inactive().map(str::to_owned).collect(),
    };
    let json = serde_json::to_vec_pretty(&status).map_err(|e| GenError::Internal(e.to_string()))?;
    write_file(&dir.join("repos.json"), &json)
}
