//! `riptide plc mirror|status|bench` (contract): a local copy of the PLC directory.
//!
//! - `riptide plc mirror --plc-url URL --data DIR [--page N] [--sim-dids] [--max-pages N]
//!   [--json]`: pulls the directory's `/export` into DIR from DIR's cursor until caught up
//!   (`riptide_resolver::plc_export`), each operation checked (signature against the previous
//!   rotation keys, genesis DID derivation, recoveries) before it is applied; refused ones are
//!   counted by reason. Killed at any moment and run again, it resumes after the last page
//!   committed, losing and repeating nothing. `--sim-dids`: the directory is `riptide sim`'s,
//!   whose DIDs are not derived from their genesis operations; those are applied and counted
//!   (`did_underived`) instead of refused. Prints the counts at the end (text, or one JSON
//!   object with `--json`).
//! - `riptide plc status --data DIR [--json]`: the cursor and the counts.
//! - `riptide plc bench --data DIR --dids N [--lookups M] [--concurrency C]`: fills DIR with N
//!   synthetic signed accounts (two operations each) through the mirror's checks, then times M
//!   lookups of random DIDs, C at a time, through a resolver reading the mirror (cache off): the
//!   figures behind bench/README.md's "DID documents" bullet.
//!
//! `riptide backfill --plc-mirror DIR` then resolves `did:plc` from the copy.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use riptide_identity::plc::{sign_op, DidCheck};
use riptide_resolver::plc_export::{pull, PullConfig, MAX_PAGE};
use riptide_resolver::plc_mirror::{MirrorCounts, PlcMirror};
use riptide_resolver::{Resolver, ResolverConfig};

use crate::out;

#[derive(clap::Subcommand, Debug)]
pub enum Plc {
    /// Pull the directory's /export into DIR (resumable), each operation checked.
    Mirror(MirrorArgs),
    /// The mirror's cursor and counts.
    Status(StatusArgs),
    /// Fill DIR with synthetic signed accounts, then time lookups from it.
    Bench(BenchArgs),
}

#[derive(clap::Args, Debug)]
pub struct MirrorArgs {
    /// The PLC directory.
    #[arg(long, default_value = riptide_resolver::DEFAULT_PLC_URL)]
    plc_url: String,
    /// The mirror's directory (created if absent; resumed from its cursor if not).
    #[arg(long)]
    data: PathBuf,
    /// Operations per page (`count`), at most 1000.
    #[arg(long, default_value_t = MAX_PAGE as u16, value_parser = clap::value_parser!(u16).range(1..=MAX_PAGE as i64))]
    page: u16,
    /// The directory is `riptide sim`'s: apply genesis operations whose DID is not derived
    /// from them, counted as `did_underived` (refused as `did_mismatch` otherwise).
    #[arg(long)]
    sim_dids: bool,
    /// Stop after N pages (default: until a page comes back short, i.e. caught up).
    #[arg(long, value_name = "N")]
    max_pages: Option<u64>,
    /// Print the counts as one JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args, Debug)]
pub struct StatusArgs {
    /// The mirror's directory.
    #[arg(long)]
    data: PathBuf,
    /// One JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// A directory for the synthetic mirror (must not hold one yet).
    #[arg(long)]
    data: PathBuf,
    /// Accounts to create.
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..))]
    dids: u64,
    /// Lookups to time.
    #[arg(long, default_value_t = 200_000)]
    lookups: u64,
    /// Lookups in flight at once (a crawl's fetches resolve concurrently).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..))]
    concurrency: u64,
}

pub fn run(p: Plc) -> anyhow::Result<ExitCode> {
    match p {
        Plc::Mirror(a) => mirror(a),
        Plc::Status(a) => status(a),
        Plc::Bench(a) => bench(a),
    }
}

fn open(dir: &std::path::Path) -> anyhow::Result<PlcMirror> {
    PlcMirror::open(dir).with_context(|| format!("opening the PLC mirror {}", dir.display()))
}

/// A mirror that must exist already (a reader's: `backfill --plc-mirror DIR`).
pub fn open_existing(dir: &std::path::Path) -> anyhow::Result<PlcMirror> {
    anyhow::ensure!(
        dir.join("keyspace").exists(),
        "{}: no PLC mirror there (riptide plc mirror --data DIR makes one)",
        dir.display()
    );
    open(dir)
}

/// The PLC mirror's lookups as Prometheus text (nothing without a mirror):
/// `riptide_backfill_plc_lookups_total{source="mirror"|"directory"}`.
pub fn render_lookups(s: &mut String, r: &Resolver) {
    if r.config().plc_mirror.is_none() {
        return;
    }
    let (mirror, directory) = r.plc_mirror_lookups();
    let name = "riptide_backfill_plc_lookups_total";
    s.push_str(&format!(
        "# HELP {name} did:plc lookups answered by the PLC mirror, and asked of the directory because the mirror did not hold the DID.\n# TYPE {name} counter\n{name}{{source=\"mirror\"}} {mirror}\n{name}{{source=\"directory\"}} {directory}\n"
    ));
    let (asked, stale) = r.plc_mirror_rechecks();
    let name = "riptide_backfill_plc_mirror_rechecks_total";
    s.push_str(&format!(
        "# HELP {name} Documents asked of the directory past the PLC mirror after a repository failed with the mirror's (a rotated key or a moved PDS), by whether the directory's differed.\n# TYPE {name} counter\n{name}{{stale=\"true\"}} {stale}\n{name}{{stale=\"false\"}} {}\n",
        asked - stale
    ));
}

fn print_counts(
    json: bool,
    cursor: Option<&str>,
    c: &MirrorCounts,
    extra: Option<(&str, u64)>,
) -> anyhow::Result<()> {
    let mut o = out::stdout();
    if json {
        let mut v = serde_json::to_value(c)?;
        v["cursor"] = cursor.into();
        if let Some((k, n)) = extra {
            v[k] = n.into();
        }
        writeln!(o, "{v}")?;
    } else {
        writeln!(o, "cursor: {}", cursor.unwrap_or("(start)"))?;
        writeln!(
            o,
            "operations: {} read, {} applied, {} nullified by recoveries",
            c.operations, c.applied, c.nullified
        )?;
        writeln!(o, "dids: {}", c.dids)?;
        if c.did_underived > 0 {
            writeln!(
                o,
                "did_underived: {} (genesis DIDs not derived: --sim-dids)",
                c.did_underived
            )?;
        }
        let refused: u64 = c.refused.values().sum();
        let reasons: Vec<String> = c.refused.iter().map(|(k, n)| format!("{k} {n}")).collect();
        writeln!(o, "refused: {refused} {}", reasons.join(", "))?;
        if let Some((k, n)) = extra {
            writeln!(o, "{k}: {n}")?;
        }
    }
    o.flush()?;
    Ok(())
}

fn mirror(a: MirrorArgs) -> anyhow::Result<ExitCode> {
    let m = open(&a.data)?;
    let cfg = PullConfig {
        plc_url: a.plc_url.trim_end_matches('/').to_owned(),
        page: usize::from(a.page),
        did_check: if a.sim_dids {
            DidCheck::Count
        } else {
            DidCheck::Strict
        },
        max_pages: a.max_pages,
        ..PullConfig::default()
    };
    // The resolver's HTTP client: its timeouts, user agent and TLS setup.
    let client = Resolver::new(ResolverConfig {
        timeout: Duration::from_secs(60),
        ..ResolverConfig::default()
    })?;
    let http = client.http();
    let rt = crate::cmd::account::runtime()?;
    tracing::info!(
        plc_url = cfg.plc_url,
        cursor = m.cursor()?.as_deref().unwrap_or("(start)"),
        "PLC mirror: pulling /export (a progress line every 10 s)"
    );
    let mut last = Instant::now();
    let (counts, rate_limited) = rt.block_on(pull(http, &m, &cfg, &mut |c, cursor| {
        if last.elapsed() >= Duration::from_secs(10) {
            last = Instant::now();
            let refused: u64 = c.refused.values().sum();
            tracing::info!(
                cursor,
                applied = c.applied,
                dids = c.dids,
                refused,
                "PLC mirror"
            );
        }
    }))?;
    print_counts(
        a.json,
        m.cursor()?.as_deref(),
        &counts,
        Some(("rate_limited", rate_limited)),
    )?;
    Ok(ExitCode::SUCCESS)
}

fn status(a: StatusArgs) -> anyhow::Result<ExitCode> {
    let m = open_existing(&a.data)?;
    print_counts(a.json, m.cursor()?.as_deref(), &m.counts()?, None)?;
    Ok(ExitCode::SUCCESS)
}

/// A synthetic account `i`: a genesis with a stale handle, and an update, both signed by the
/// account's rotation key, as export lines.
fn synthetic(i: u64, seq: &mut u64) -> anyhow::Result<(String, [String; 2])> {
    let mut seed = [0x11u8; 32];
    seed[..8].copy_from_slice(&(i + 1).to_be_bytes());
    let key = riptide_crypto::PrivateKey::from_bytes(riptide_crypto::Curve::Secp256k1, &seed)?;
    let dk = key.public_key().to_did_key();
    let op = |prev: Option<&str>, handle: &str| {
        serde_json::json!({
            "type": "plc_operation",
            "prev": prev,
            "rotationKeys": [dk],
            "verificationMethods": {"atproto": dk},
            "alsoKnownAs": [format!("at://{handle}")],
            "services": {"atproto_pds": {"type": "AtprotoPersonalDataServer", "endpoint": "https://pds.example"}},
        })
    };
    let (g, gcid) = sign_op(&op(None, &format!("old{i}.example")), &key)?;
    let did = riptide_identity::plc::PlcOp::parse(&g)?.derived_did();
    let (u, ucid) = sign_op(&op(Some(&gcid.to_string()), &format!("u{i}.example")), &key)?;
    let mut line = |op: serde_json::Value, cid: String| {
        *seq += 1;
        serde_json::json!({
            "seq": *seq, "did": did, "operation": op, "cid": cid, "nullified": false,
            "createdAt": riptide_syntax::format_utc(1_704_067_200_000_000 + *seq * 1000, riptide_syntax::Precision::Millis),
        })
        .to_string()
    };
    let lines = [line(g, gcid.to_string()), line(u, ucid.to_string())];
    Ok((did, lines))
}

fn bench(a: BenchArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        !a.data.exists(),
        "{}: exists; the bench makes its own mirror",
        a.data.display()
    );
    let m = Arc::new(open(&a.data)?);
    let t = Instant::now();
    let mut dids = Vec::with_capacity(a.dids as usize);
    let mut seq = 0;
    let mut page = Vec::new();
    let mut apply_secs = 0.0;
    for i in 0..a.dids {
        let (did, lines) = synthetic(i, &mut seq)?;
        dids.push(did);
        for l in lines {
            page.extend_from_slice(l.as_bytes());
            page.push(b'\n');
        }
        if (i + 1) % 500 == 0 || i + 1 == a.dids {
            let ta = Instant::now();
            m.apply_page(&page, DidCheck::Strict)?;
            apply_secs += ta.elapsed().as_secs_f64();
            page.clear();
        }
    }
    let c = m.counts()?;
    anyhow::ensure!(
        c.applied == 2 * a.dids && c.refused.is_empty(),
        "the bench's own operations were not all applied: {c:?}"
    );
    let filled = t.elapsed().as_secs_f64();
    let resolver = Resolver::new(ResolverConfig {
        plc_url: "http://127.0.0.1:9".into(),
        plc_mirror: Some(Arc::clone(&m)),
        cache_capacity: 1,
        ttl: Duration::ZERO,
        ..ResolverConfig::default()
    })?;
    let rt = crate::cmd::account::runtime()?;
    let dids = Arc::new(dids);
    let t = Instant::now();
    rt.block_on(async {
        let tasks: Vec<_> = (0..a.concurrency)
            .map(|w| {
                let (resolver, dids) = (resolver.clone(), Arc::clone(&dids));
                let n = a.lookups / a.concurrency + u64::from(w < a.lookups % a.concurrency);
                tokio::spawn(async move {
                    // A fixed xorshift per task: the same DIDs every run, in no order.
                    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ (w + 1);
                    for _ in 0..n {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let did = &dids[(x % dids.len() as u64) as usize];
                        let doc = resolver.resolve_did(did).await?;
                        anyhow::ensure!(
                            doc.pds() == Some("https://pds.example"),
                            "{did}: wrong document"
                        );
                    }
                    Ok(())
                })
            })
            .collect();
        for t in tasks {
            t.await??;
        }
        anyhow::Ok(())
    })?;
    let secs = t.elapsed().as_secs_f64();
    let (hits, misses) = resolver.plc_mirror_lookups();
    anyhow::ensure!(misses == 0, "{misses} lookups missed the mirror");
    let bytes = dir_bytes(&a.data);
    let v = serde_json::json!({
        "dids": a.dids,
        "operations": c.applied,
        "fill_seconds": filled,
        "apply_ops_per_sec": c.applied as f64 / apply_secs,
        "lookups": a.lookups,
        // Fewer when two tasks asked for one DID at once (the resolver joins them).
        "mirror_reads": hits,
        "concurrency": a.concurrency,
        "lookup_seconds": secs,
        "lookups_per_sec": a.lookups as f64 / secs,
        "disk_bytes": bytes,
    });
    writeln!(out::stdout(), "{v}")?;
    Ok(ExitCode::SUCCESS)
}

/// Bytes of the files under `dir`.
fn dir_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_bytes(&e.path()),
            _ => e.metadata().map_or(0, |m| m.len()),
        })
        .sum()
}
