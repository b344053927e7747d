//! `riptide get at://HANDLE-OR-DID/COLLECTION/RKEY [--json]` (contract): one record, fetched
//! with its proof and printed only once the proof checks.
//!
//! Steps: the account (`account`) → its PDS and signing key → `com.atproto.sync.getRecord`
//! (a CAR of the signed commit, the MST nodes on the key's path and the record; fetched with
//! `riptide_resolver::Resyncer::fetch_repo`, bounded) → every block's CID, the commit's
//! signature with the document's key, the commit's DID against the account's, and the lookup
//! of `COLLECTION/RKEY` from the commit's MST root down to the record's CID
//! (`riptide_repo::verify_record_proof`) → the record as JSON (atproto's rendering, as
//! Jetstream's `record` field: keys sorted, bytes as `$bytes`, links as `$link`).
//!
//! Output: the record, one JSON line. `--json`: `{"uri","did","cid","commit","rev","value"}`
//! (`uri` with the DID as authority). A failure: `URI: VERDICT: REASON` on stderr, exit 1:
//! resolution's verdicts (`account`); `record-not-found` (the PDS says `RecordNotFound`, or
//! its proof shows the key absent); `fetch-failed`; a proof that does not check, with the
//! repository's verdicts: `bad-block-cid`, `bad-signature`, `missing-block` (a node of the path
//! or the record is not in the proof), `malformed`, `limits`, `did-mismatch`.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use riptide_car::{CarOptions, CarReader};
use riptide_resolver::{FetchError, ResyncConfig, Resyncer, TrustVerdict};
use riptide_syntax::{AtUri, Nsid, RecordKey};

use crate::cmd::account::{self, ResolveArgs};
use crate::out;

/// Largest proof accepted: a record (at most a few hundred KiB in practice), the commit, and
/// one node per layer of the tree.
const MAX_PROOF_BYTES: usize = 8 << 20;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The record: at://HANDLE-OR-DID/COLLECTION/RKEY.
    uri: String,
    #[command(flatten)]
    resolve: ResolveArgs,
    /// One JSON object with the record's CID, the commit and its rev.
    #[arg(long)]
    json: bool,
}

/// A failure: its verdict name and reason (said once by `run`).
struct Failed(&'static str, String);

impl From<account::AccountError> for Failed {
    fn from(e: account::AccountError) -> Failed {
        Failed(e.verdict.as_str(), e.error.to_string())
    }
}

/// The URI's account, collection and record key, checked.
fn parse(uri: &str) -> Result<(String, String, String), String> {
    let u = AtUri::parse(uri).map_err(|e| e.to_string())?;
    let (Some(c), Some(r)) = (u.collection(), u.rkey()) else {
        return Err("not a record's URI: at://HANDLE-OR-DID/COLLECTION/RKEY".to_owned());
    };
    Nsid::parse(c).map_err(|e| e.to_string())?;
    RecordKey::parse(r).map_err(|e| e.to_string())?;
    Ok((u.authority().to_owned(), c.to_owned(), r.to_owned()))
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let (authority, collection, rkey) = match parse(&a.uri) {
        Ok(p) => p,
        Err(why) => anyhow::bail!("{}: {why}", a.uri),
    };
    let key = format!("{collection}/{rkey}");
    let resolver = a.resolve.resolver()?;
    let resyncer = Resyncer::new(
        resolver.clone(),
        ResyncConfig {
            timeout: Duration::from_secs(a.resolve.timeout),
            max_repo_bytes: MAX_PROOF_BYTES,
            per_account_per_minute: usize::MAX,
            ..ResyncConfig::default()
        },
    );
    let rt = account::runtime()?;
    let got = rt.block_on(async {
        let acct = account::resolve(&resolver, &authority, account::HandleCheck::Skip).await?;
        let pds = account::pds(&acct)?.to_owned();
        let signing = acct.doc.signing_key().map_err(|e| {
            Failed(
                TrustVerdict::BadDocument.as_str(),
                format!("{}: {e}", acct.did),
            )
        })?;
        let url = format!(
            "{pds}/xrpc/com.atproto.sync.getRecord?did={}&collection={collection}&rkey={rkey}",
            acct.did
        );
        let proof = resyncer.fetch_repo(&url).await.map_err(|e| match &e {
            FetchError::Status { error: Some(x), .. } if x == "RecordNotFound" => {
                Failed("record-not-found", e.to_string())
            }
            _ => Failed(TrustVerdict::FetchFailed.as_str(), e.to_string()),
        })?;
        Ok((acct, signing, proof))
    });
    let (acct, signing, proof) = match got {
        Ok(x) => x,
        Err(Failed(verdict, why)) => {
            eprintln!("{}: {verdict}: {why}", a.uri);
            return Ok(ExitCode::from(1));
        }
    };
    match check(&proof, &key, &signing, &acct.did) {
        Ok((json, cid, commit, rev)) => {
            let mut stdout = out::stdout();
            if a.json {
                let v = serde_json::json!({
                    "uri": format!("at://{}/{key}", acct.did),
                    "did": acct.did,
                    "cid": cid,
                    "commit": commit,
                    "rev": rev,
                    "value": json,
                });
                writeln!(stdout, "{v}")?;
            } else {
                writeln!(stdout, "{json}")?;
            }
            stdout.flush()?;
            Ok(ExitCode::SUCCESS)
        }
        Err(Failed(verdict, why)) => {
            eprintln!("{}: {verdict}: {why}", a.uri);
            Ok(ExitCode::from(1))
        }
    }
}

/// Checks the proof of `key` for `did` (module docs): the record as JSON, its CID, the
/// commit's CID and its rev.
fn check(
    proof: &[u8],
    key: &str,
    signing: &riptide_crypto::PublicKey,
    did: &str,
) -> Result<(serde_json::Value, String, String, String), Failed> {
    let repo_failed = |e: riptide_repo::RepoError| {
        Failed(
            TrustVerdict::of_repo_error(&e).as_str(),
            format!("proof: {e}"),
        )
    };
    let mut reader = CarReader::new();
    let opts = CarOptions {
        max_bytes: MAX_PROOF_BYTES,
        ..CarOptions::default()
    };
    let car = reader
        .read(proof, &opts)
        .map_err(|e| repo_failed(e.into()))?;
    let proven =
        riptide_repo::verify_record_proof(&car, key, Some(signing)).map_err(repo_failed)?;
    let Some(p) = proven else {
        return Err(Failed(
            "record-not-found",
            format!("the proof shows no record at {key}"),
        ));
    };
    if p.did != did {
        return Err(Failed(
            TrustVerdict::DidMismatch.as_str(),
            format!("the proof's commit is {}'s, the account is {did}", p.did),
        ));
    }
    let mut arena = riptide_cbor::Arena::new();
    let mut text = Vec::new();
    if !riptide_jetstream::project::write_record_json(&mut arena, p.record, &mut text) {
        return Err(Failed(
            TrustVerdict::Malformed.as_str(),
            format!(
                "record {}: not strict DAG-CBOR in the atproto data model",
                p.cid
            ),
        ));
    }
    let json = serde_json::from_slice(&text).map_err(|e| {
        Failed(
            TrustVerdict::Malformed.as_str(),
            format!("record {}: {e}", p.cid),
        )
    })?;
    Ok((
        json,
        p.cid.to_string(),
        p.commit.to_string(),
        p.rev.to_owned(),
    ))
}
