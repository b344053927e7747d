//! `riptide verify-handle HANDLE [--plc-url URL] [--handle-resolver URL] [--json]` (contract): the
//! trust chain from a handle to a verified repository.
//!
//! Handle → DID (DNS TXT `_atproto.<handle>`, then `https://<handle>/.well-known/atproto-did`; or,
//! with `--handle-resolver BASE`, `GET BASE/.well-known/atproto-did` with the handle as the Host
//! header, for offline and test use) → DID document (PLC directory at `--plc-url`, or did:web),
//! which must claim the handle back → `com.atproto.sync.getRepo` from the document's PDS
//! (progress on stderr when it is a terminal) → every block CID, the commit signature with the
//! document's key, the MST walk and its rebuild. The chain is `riptide_resolver::verify_handle`.
//!
//! `--json`: `{"handle","did","pds","records","blocks","bytes","verdict","reason","timings_ms":
//! {"resolve","fetch","car","signature","walk","rebuild"}}`. Verdicts: `ok`; the repository's
//! (`bad-block-cid`, `bad-signature` — a tampered commit or a document with the wrong key —,
//! `missing-block`, `root-mismatch`, `malformed`, `limits`, `did-mismatch`); resolution's
//! (`handle-not-found`, `handle-mismatch` — the document's `alsoKnownAs` does not claim the
//! handle —, `did-not-found`, `bad-document`, `resolve-failed`); `fetch-failed`. Exit 1 unless ok.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::time::Duration;

use riptide_resolver::{
    verify_handle, Resolver, ResolverConfig, TrustOptions, TrustReport, DEFAULT_PLC_URL,
};

use crate::out::{self, ms};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The handle, e.g. alice.bsky.social.
    handle: String,
    /// PLC directory base URL.
    #[arg(long, default_value = DEFAULT_PLC_URL)]
    plc_url: String,
    /// Resolve the handle with GET URL/.well-known/atproto-did (Host: HANDLE) instead of DNS and
    /// HTTPS (offline and test use).
    #[arg(long)]
    handle_resolver: Option<String>,
    /// One JSON object on stdout.
    #[arg(long)]
    json: bool,
}

/// The `--json` object of a report.
pub fn report_json(r: &TrustReport) -> serde_json::Value {
    let t = &r.timings;
    serde_json::json!({
        "handle": r.handle,
        "did": r.did,
        "pds": r.pds,
        "records": r.repo.as_ref().map(|x| x.records),
        "blocks": r.repo.as_ref().map(|x| x.blocks),
        "bytes": r.bytes,
        "verdict": r.verdict.as_str(),
        "reason": r.reason,
        "timings_ms": {
            "resolve": ms(t.resolve),
            "fetch": ms(t.fetch),
            "car": ms(t.car),
            "signature": ms(t.signature),
            "walk": ms(t.walk),
            "rebuild": ms(t.rebuild),
        },
    })
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let resolver = Resolver::new(ResolverConfig {
        plc_url: a.plc_url.clone(),
        handle_resolver: a.handle_resolver.clone(),
        timeout: Duration::from_secs(300),
        ..ResolverConfig::default()
    })?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let pb = std::io::stderr().is_terminal().then(|| {
        let pb = indicatif::ProgressBar::new_spinner();
        pb.set_message(format!("{}: resolving", a.handle));
        pb.enable_steady_tick(Duration::from_millis(100));
        pb
    });
    let mut progress = {
        let pb = pb.clone();
        let mut fetching = false;
        move |done: u64, total: Option<u64>| {
            let Some(pb) = &pb else {
                return;
            };
            if !fetching {
                fetching = true;
                pb.set_message("fetching repository");
                // A bar when the server announced the size; else the spinner goes on.
                if let Some(t) = total {
                    pb.set_length(t);
                    pb.set_style(
                        indicatif::ProgressStyle::with_template(
                            "{msg} {bar:30} {bytes}/{total_bytes} {bytes_per_sec}",
                        )
                        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
                    );
                }
            }
            pb.set_position(done);
        }
    };
    let report = rt.block_on(verify_handle(
        &resolver,
        &a.handle,
        &TrustOptions::default(),
        &mut progress,
    ));
    if let Some(pb) = pb {
        pb.finish_and_clear();
    }

    let mut stdout = out::stdout();
    if a.json {
        writeln!(stdout, "{}", report_json(&report))?;
    } else {
        writeln!(stdout, "{}: {}", report.handle, report.verdict)?;
        if let Some(did) = &report.did {
            writeln!(stdout, "did: {did}")?;
        }
        if let Some(pds) = &report.pds {
            writeln!(stdout, "pds: {pds}")?;
        }
        if let Some(r) = &report.repo {
            writeln!(
                stdout,
                "repository: {} records, {} blocks, {} bytes, rev {}",
                r.records, r.blocks, r.bytes, r.rev
            )?;
        }
        if let Some(why) = &report.reason {
            writeln!(stdout, "reason: {why}")?;
        }
        let t = &report.timings;
        writeln!(
            stdout,
            "timings: resolve {:.3} ms, fetch {:.3} ms, car {:.3} ms, signature {:.3} ms, walk {:.3} ms, rebuild {:.3} ms",
            ms(t.resolve),
            ms(t.fetch),
            ms(t.car),
            ms(t.signature),
            ms(t.walk),
            ms(t.rebuild)
        )?;
    }
    stdout.flush()?;
    if report.verdict != riptide_resolver::TrustVerdict::Ok {
        // Human mode has said the verdict and its reason on stdout; said again on stderr only
        // beside the JSON, for a person watching a script.
        if !a.json {
            return Ok(ExitCode::from(1));
        }
        eprintln!(
            "{}: {}: {}",
            report.handle,
            report.verdict,
            report.reason.as_deref().unwrap_or("")
        );
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}
