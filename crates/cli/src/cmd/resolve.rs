//! `riptide resolve HANDLE|DID [--json]` (contract): an account's identity, without its
//! repository, as indigo's `goat resolve` gives it.
//!
//! A handle is resolved to its DID and checked both ways (the document must claim the handle);
//! a DID to its document, and the handle the document claims is checked back (reported, not
//! required). See `account`. Text: `did`, `handle` (with `(verified)` or why not), `pds`,
//! `signing key`, one per line. `--json`: `{"did","handle","handle_verified","handle_error",
//! "pds","signing_key","document"}`, `document` the DID document as served. A failure: one line
//! on stderr, `INPUT: VERDICT: REASON` (`handle-not-found`, `handle-mismatch`, `did-not-found`,
//! `bad-document`, `resolve-failed`), exit 1.

use std::io::Write;
use std::process::ExitCode;

use crate::cmd::account::{self, ResolveArgs};
use crate::out;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// A handle (alice.bsky.social) or a DID (did:plc:…, did:web:…).
    account: String,
    #[command(flatten)]
    resolve: ResolveArgs,
    /// One JSON object on stdout, with the DID document.
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let resolver = a.resolve.resolver()?;
    let rt = account::runtime()?;
    let got = rt.block_on(async {
        let acct = account::resolve(&resolver, &a.account, account::HandleCheck::Report).await?;
        let doc = if a.json {
            Some(resolver.did_document_json(&acct.did).await?)
        } else {
            None
        };
        Ok::<_, account::AccountError>((acct, doc))
    });
    let (acct, doc) = match got {
        Ok(x) => x,
        Err(e) => {
            eprintln!("{}: {e}", a.account);
            return Ok(ExitCode::from(1));
        }
    };
    let key = acct.doc.signing_key().ok().map(|k| k.to_did_key());
    let mut stdout = out::stdout();
    if a.json {
        let v = serde_json::json!({
            "did": acct.did,
            "handle": acct.handle,
            "handle_verified": acct.handle.is_some() && acct.handle_check.is_ok(),
            "handle_error": acct.handle_check.as_ref().err(),
            "pds": acct.doc.pds(),
            "signing_key": key,
            "document": doc,
        });
        writeln!(stdout, "{v}")?;
    } else {
        writeln!(stdout, "did: {}", acct.did)?;
        match (&acct.handle, &acct.handle_check) {
            (None, _) => writeln!(stdout, "handle: none")?,
            (Some(h), Ok(())) => writeln!(stdout, "handle: {h} (verified)")?,
            (Some(h), Err(why)) => writeln!(stdout, "handle: {h} (not verified: {why})")?,
        }
        writeln!(stdout, "pds: {}", acct.doc.pds().unwrap_or("none"))?;
        writeln!(stdout, "signing key: {}", key.as_deref().unwrap_or("none"))?;
    }
    stdout.flush()?;
    Ok(ExitCode::SUCCESS)
}
