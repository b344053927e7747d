//! `riptide repo ls|inspect|verify FILE.car` (contracts): a repository export (`getRepo` CAR);
//! `repo export` (downloading one, verified) is `repo_export`.
//!
//! - `ls`: `collection/rkey<TAB>record-CID` per record, in MST key order (the tree is checked on
//!   the way), as indigo's `goat repo ls` prints it.
//! - `inspect`: the commit. Text as `goat repo inspect` prints it; `--json`:
//!   `{"did","data","rev","version","prev"}` (`prev` null when absent).
//! - `verify`: every block CID, the commit signature (given `--key did:key:…` or `--did-doc FILE`),
//!   a structural walk of the MST and its rebuild from the leaves against the commit's `data`.
//!   `--json`: `{"verdict","reason","did","records","blocks","bytes","signature_checked",
//!   "timings_ms":{"car","signature","walk","rebuild"}}`, the same fields whatever the verdict:
//!   a failure fills in what the checks learned before they stopped (`did` once the commit
//!   decoded, `blocks` once the CAR was read, `records` only when the walk finished, else null;
//!   the timings of the phases that ran, zero for the others; `signature_checked` true when the
//!   signature was checked, so true beside `bad-signature`). Exit 1 when the verdict is not `ok`.
//!
//! Verdicts: `ok`, `bad-block-cid`, `bad-signature`, `missing-block`, `root-mismatch` (the tree
//! rebuilt from its leaves is not the commit's `data`), `malformed`, `limits`, `unknown-key` (a
//! DID document for another DID than the repository's). A repository that is not ok is reported,
//! not an error of the command: exit 1, and the JSON still printed.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use riptide_car::{Car, CarOptions, CarReader};
use riptide_crypto::PublicKey;
use riptide_identity::DidDoc;
use riptide_repo::{inspect, list_records, verify_repo_traced, Progress, RepoError, RepoOptions};

use crate::out::{self, ms};

#[derive(clap::Subcommand, Debug)]
pub enum Repo {
    /// List every record: collection/rkey<TAB>record-CID, in MST key order.
    Ls(FileArgs),
    /// Show the commit of a repository export.
    Inspect(InspectArgs),
    /// Verify a repository export: block CIDs, signature, MST structure and rebuild.
    Verify(VerifyArgs),
    /// Download an account's repository (handle or DID) from its PDS, verify it, write it.
    Export(super::repo_export::Args),
}

#[derive(clap::Args, Debug)]
pub struct FileArgs {
    /// A repository CAR (com.atproto.sync.getRepo export).
    file: PathBuf,
}

#[derive(clap::Args, Debug)]
pub struct InspectArgs {
    /// A repository CAR.
    file: PathBuf,
    /// One JSON object: {"did","data","rev","version","prev"}.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args, Debug)]
pub struct VerifyArgs {
    /// A repository CAR.
    file: PathBuf,
    /// The account's signing key (did:key:z…); checks the commit signature.
    #[arg(long, conflicts_with = "did_doc")]
    key: Option<String>,
    /// The account's DID document (JSON); its #atproto key checks the commit signature.
    #[arg(long)]
    did_doc: Option<PathBuf>,
    /// One JSON object on stdout.
    #[arg(long)]
    json: bool,
}

pub fn run(r: Repo) -> anyhow::Result<ExitCode> {
    match r {
        Repo::Ls(a) => ls(a),
        Repo::Inspect(a) => inspect_cmd(a),
        Repo::Verify(a) => verify(a),
        Repo::Export(a) => super::repo_export::run(a),
    }
}

/// The verdict name of a repository error (one mapping, shared with `verify-handle`).
pub fn verdict(e: &RepoError) -> &'static str {
    riptide_resolver::TrustVerdict::of_repo_error(e).as_str()
}

fn report_failure(file: &std::path::Path, bytes: &[u8], e: &RepoError) -> ExitCode {
    eprintln!(
        "{}: {}: {}",
        super::name(file),
        verdict(e),
        reason(bytes, e)
    );
    ExitCode::from(1)
}

/// Why a repository failed, with what the file looks like when a CAR could not be read from it
/// (a frame corpus or a JSON file given where a CAR was expected).
fn reason(bytes: &[u8], e: &RepoError) -> String {
    match (e, super::sniff(bytes).hint(super::Sniffed::Car)) {
        (RepoError::Car(_), Some(hint)) => format!("{hint} ({e})"),
        _ => e.to_string(),
    }
}

/// Reads `file` as a repository CAR and applies `f` to it; a failure of either is reported
/// (`report_failure`) and returned as the exit code.
fn read_repo<T>(
    file: &Path,
    f: impl FnOnce(&Car<'_>) -> Result<T, RepoError>,
) -> anyhow::Result<Result<T, ExitCode>> {
    let bytes = super::read_file_large(file)?;
    let mut reader = CarReader::new();
    let result = reader
        .read(&bytes, &CarOptions::repository())
        .map_err(RepoError::from)
        .and_then(|car| f(&car));
    Ok(result.map_err(|e| report_failure(file, &bytes, &e)))
}

fn ls(a: FileArgs) -> anyhow::Result<ExitCode> {
    let records = match read_repo(&a.file, list_records)? {
        Ok(r) => r,
        Err(code) => return Ok(code),
    };
    let mut stdout = out::stdout();
    for (key, cid) in &records {
        writeln!(stdout, "{key}\t{cid}")?;
    }
    stdout.flush()?;
    Ok(ExitCode::SUCCESS)
}

fn inspect_cmd(a: InspectArgs) -> anyhow::Result<ExitCode> {
    let info = match read_repo(&a.file, inspect)? {
        Ok(i) => i,
        Err(code) => return Ok(code),
    };
    let mut stdout = out::stdout();
    if a.json {
        let v = serde_json::json!({
            "did": info.did,
            "data": info.data.to_string(),
            "rev": info.rev,
            "version": info.version,
            "prev": info.prev.map(|p| p.to_string()),
        });
        writeln!(stdout, "{v}")?;
    } else {
        writeln!(stdout, "ATProto Repo Spec Version: {}", info.version)?;
        writeln!(stdout, "DID: {}", info.did)?;
        writeln!(stdout, "Data CID: {}", info.data)?;
        writeln!(
            stdout,
            "Prev CID: {}",
            info.prev
                .map_or_else(|| "<nil>".to_string(), |p| p.to_string())
        )?;
        writeln!(stdout, "Revision: {}", info.rev)?;
    }
    stdout.flush()?;
    Ok(ExitCode::SUCCESS)
}

/// The key given by `--key` or `--did-doc` (with the document's DID), if any.
pub fn key_arg(
    key: Option<&str>,
    did_doc: Option<&std::path::Path>,
) -> anyhow::Result<Option<(PublicKey, Option<String>)>> {
    if let Some(k) = key {
        let key = PublicKey::from_did_key(k).map_err(|e| anyhow::anyhow!("--key {k}: {e}"))?;
        return Ok(Some((key, None)));
    }
    if let Some(path) = did_doc {
        let text = String::from_utf8(super::read_file(path)?)
            .map_err(|_| anyhow::anyhow!("{}: not UTF-8", path.display()))?;
        let doc =
            DidDoc::from_json(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        let key = doc
            .signing_key()
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        return Ok(Some((key, Some(doc.did().to_string()))));
    }
    Ok(None)
}

/// A spinner on stderr while a large repository is verified, only when stderr is a terminal.
fn spinner(file: &std::path::Path, bytes: usize) -> Option<indicatif::ProgressBar> {
    const LARGE: usize = 8 << 20;
    if bytes < LARGE || !std::io::stderr().is_terminal() {
        return None;
    }
    let pb = indicatif::ProgressBar::new_spinner();
    pb.set_message(format!(
        "verifying {} ({:.1} MB)",
        file.display(),
        bytes as f64 / 1e6
    ));
    pb.enable_steady_tick(Duration::from_millis(100));
    Some(pb)
}

fn verify(a: VerifyArgs) -> anyhow::Result<ExitCode> {
    let bytes = super::read_file_large(&a.file)?;
    let key = key_arg(a.key.as_deref(), a.did_doc.as_deref())?;
    let pb = spinner(&a.file, bytes.len());
    let mut progress = Progress::default();
    let result = verify_repo_traced(
        &bytes,
        key.as_ref().map(|(k, _)| k),
        &RepoOptions::default(),
        &mut progress,
    );
    if let Some(pb) = pb {
        pb.finish_and_clear();
    }

    let (verdict, reason, report) = match result {
        Ok(r) => match key.as_ref().and_then(|(_, did)| did.as_ref()) {
            Some(doc_did) if *doc_did != r.did => {
                let why = format!(
                    "the DID document is for {doc_did}, the repository is {}",
                    r.did
                );
                ("unknown-key", Some(why), Some(r))
            }
            _ => ("ok", None, Some(r)),
        },
        Err(e) => (verdict(&e), Some(reason(&bytes, &e)), None),
    };
    let mut stdout = out::stdout();
    if a.json {
        let v = match &report {
            Some(r) => serde_json::json!({
                "verdict": verdict,
                "reason": reason,
                "did": r.did,
                "records": r.records,
                "blocks": r.blocks,
                "bytes": r.bytes,
                "signature_checked": r.signature_checked,
                "timings_ms": {
                    "car": ms(r.timings.car),
                    "signature": ms(r.timings.signature),
                    "walk": ms(r.timings.walk),
                    "rebuild": ms(r.timings.rebuild),
                },
            }),
            None => {
                let t = &progress.timings;
                serde_json::json!({
                    "verdict": verdict,
                    "reason": reason,
                    "did": progress.did,
                    "records": null,
                    "blocks": progress.blocks,
                    "bytes": bytes.len(),
                    "signature_checked": progress.signature_checked,
                    "timings_ms": {
                        "car": ms(t.car),
                        "signature": ms(t.signature),
                        "walk": ms(t.walk),
                        "rebuild": ms(t.rebuild),
                    },
                })
            }
        };
        writeln!(stdout, "{v}")?;
    } else {
        match (&report, &reason) {
            (Some(r), None) => {
                writeln!(
                    stdout,
                    "ok: {} ({}), {} records, {} MST nodes, {} blocks, {} bytes",
                    r.did, r.rev, r.records, r.mst_nodes, r.blocks, r.bytes
                )?;
                writeln!(
                    stdout,
                    "signature: {}",
                    if r.signature_checked {
                        "verified"
                    } else {
                        "not checked (give --key or --did-doc)"
                    }
                )?;
                let t = &r.timings;
                writeln!(
                    stdout,
                    "timings: car {:.3} ms, signature {:.3} ms, walk {:.3} ms, rebuild {:.3} ms",
                    ms(t.car),
                    ms(t.signature),
                    ms(t.walk),
                    ms(t.rebuild)
                )?;
            }
            (_, Some(why)) => eprintln!("{}: {verdict}: {why}", super::name(&a.file)),
            (None, None) => {}
        }
    }
    stdout.flush()?;
    Ok(if verdict == "ok" {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
