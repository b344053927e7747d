//! `riptide repo export HANDLE|DID -o FILE.car [--json]` (contract): an account's repository,
//! downloaded from its PDS and verified whole before it is written, as `goat repo export` does
//! without the verification.
//!
//! Steps: the account (`account`: a handle checked both ways, or a DID) → its PDS and signing
//! key from the DID document → `com.atproto.sync.getRepo` (`riptide_resolver::Resyncer::
//! fetch_repo`: bounded by `--max-bytes` and `--max-time`, spooled to a file beside FILE past
//! 32 MiB, a `429` or an XRPC error such as `RepoNotFound` typed) → `riptide_repo::verify_repo`
//! with the document's key (every block CID, the commit signature, the MST walk and its rebuild)
//! and the commit's DID against the account's → written to a temporary file in FILE's
//! directory, synced, and renamed to FILE. So FILE is either absent (or as it was) or a
//! verified export, never a partial or unverified one. `-o -` writes the verified CAR to stdout.
//!
//! Text: `FILE: DID, N records, N blocks, N bytes, rev REV` on stdout (stderr with `-o -`).
//! `--json`: `{"did","handle","pds","file","records","blocks","bytes","rev","commit"}` (`handle`
//! null when the account was named by its DID: only a handle given is checked). A
//! failure: `INPUT: VERDICT: REASON` on stderr, exit 1, with resolution's verdicts (`account`),
//! `fetch-failed`, or the repository's (`bad-block-cid`, `bad-signature`, `missing-block`,
//! `root-mismatch`, `malformed`, `limits`, `did-mismatch`), as `verify-handle` names them.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use riptide_resolver::{ResyncConfig, Resyncer, TrustVerdict};

use crate::cmd::account::{self, ResolveArgs};
use crate::out;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// A handle (alice.bsky.social) or a DID.
    account: String,
    /// Where to write the verified CAR (- for stdout).
    #[arg(short, long)]
    output: PathBuf,
    #[command(flatten)]
    resolve: ResolveArgs,
    /// Largest repository accepted, in bytes.
    #[arg(long, default_value_t = 4 << 30)]
    max_bytes: usize,
    /// Longest the download may take, in seconds.
    #[arg(long, default_value_t = 1800, value_parser = clap::value_parser!(u64).range(1..))]
    max_time: u64,
    /// One JSON object on stdout.
    #[arg(long)]
    json: bool,
}

/// A failure with its verdict (said once by `run`).
struct Failed(TrustVerdict, String);

impl From<account::AccountError> for Failed {
    fn from(e: account::AccountError) -> Failed {
        Failed(e.verdict, e.error.to_string())
    }
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let to_stdout = super::is_stdin(&a.output);
    let dir = match a.output.parent() {
        _ if to_stdout => std::env::temp_dir(),
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    // Before the download: a directory that cannot take the file is said now, not after it.
    if !to_stdout && !dir.is_dir() {
        anyhow::bail!("{}: no such directory", dir.display());
    }
    let resolver = a.resolve.resolver()?;
    let resyncer = Resyncer::new(
        resolver.clone(),
        ResyncConfig {
            timeout: Duration::from_secs(a.max_time),
            max_repo_bytes: a.max_bytes,
            spool_dir: Some(dir.clone()),
            per_account_per_minute: usize::MAX,
            ..ResyncConfig::default()
        },
    );
    let rt = account::runtime()?;
    let got = rt.block_on(async {
        let acct = account::resolve(&resolver, &a.account, account::HandleCheck::Skip).await?;
        let pds = account::pds(&acct)?.to_owned();
        let key = acct
            .doc
            .signing_key()
            .map_err(|e| Failed(TrustVerdict::BadDocument, format!("{}: {e}", acct.did)))?;
        let url = format!("{pds}/xrpc/com.atproto.sync.getRepo?did={}", acct.did);
        let car = resyncer
            .fetch_repo(&url)
            .await
            .map_err(|e| Failed(TrustVerdict::FetchFailed, e.to_string()))?;
        let (car, report) = tokio::task::spawn_blocking(move || {
            let r = riptide_repo::verify_repo(&car, Some(&key));
            (car, r)
        })
        .await
        .map_err(|e| Failed(TrustVerdict::Malformed, format!("verification task: {e}")))?;
        let report = report.map_err(|e| Failed(TrustVerdict::of_repo_error(&e), e.to_string()))?;
        if report.did != acct.did {
            return Err(Failed(
                TrustVerdict::DidMismatch,
                format!(
                    "the repository is {}, the account is {}",
                    report.did, acct.did
                ),
            ));
        }
        Ok((acct, pds, car, report))
    });
    let (acct, pds, car, report) = match got {
        Ok(x) => x,
        Err(Failed(verdict, why)) => {
            eprintln!("{}: {verdict}: {why}", a.account);
            return Ok(ExitCode::from(1));
        }
    };
    if to_stdout {
        let mut stdout = std::io::stdout().lock();
        stdout.write_all(&car)?;
        stdout.flush()?;
    } else {
        write_atomically(&a.output, &dir, &car)?;
    }
    let file = super::name(&a.output);
    let summary = if a.json {
        serde_json::json!({
            "did": acct.did,
            // Named by its handle: checked both ways; by its DID: not asked (null).
            "handle": acct.handle.as_ref().filter(|_| acct.handle_check.is_ok()),
            "pds": pds,
            "file": file,
            "records": report.records,
            "blocks": report.blocks,
            "bytes": report.bytes,
            "rev": report.rev,
            "commit": report.commit.to_string(),
        })
        .to_string()
    } else {
        format!(
            "{file}: {}, {} records, {} blocks, {} bytes, rev {}",
            acct.did, report.records, report.blocks, report.bytes, report.rev
        )
    };
    if to_stdout {
        eprintln!("{summary}");
    } else {
        let mut stdout = out::stdout();
        writeln!(stdout, "{summary}")?;
        stdout.flush()?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Writes `bytes` to a temporary file in `dir`, syncs it and renames it to `path`.
fn write_atomically(path: &Path, dir: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let mut tmp = tempfile::Builder::new()
        .prefix(".riptide-export-")
        .suffix(".car.tmp")
        .tempfile_in(dir)
        .with_context(|| format!("creating a temporary file in {}", dir.display()))?;
    tmp.write_all(bytes)
        .and_then(|()| tmp.as_file().sync_all())
        .with_context(|| format!("writing {}", tmp.path().display()))?;
    tmp.persist(path)
        .with_context(|| format!("renaming into {}", path.display()))?;
    Ok(())
}
