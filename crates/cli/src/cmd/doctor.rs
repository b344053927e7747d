//! `riptide doctor [--corpus DIR] [--data DIR [--zstd-dictionary FILE]] [--upstream URL]
//! [--plc-url URL] [--offline] [--timeout SECS] [--json]` (contract): what a machine needs to run
//! riptide and its tests, one line per check, before a user finds out from a failure.
//!
//! Checks, each `ok`, `warn` (works, with a caveat) or `fail` (something will not work):
//! - `corpus`: the shared corpus (`--corpus`, else `$RIPTIDE_CORPUS`, else `../shared/corpus`
//!   from the current directory, as the tests look for it) present and complete: the capture's
//!   frame count against its manifest, every committing DID in `did_docs.json`, `repo.car`'s
//!   records against goat's listing, the two Jetstream dictionaries with their ids. Absent: a
//!   warning (only the tests and benchmarks need it); present but incomplete: a failure.
//! - `store` (with `--data`): the directory's zstd dictionary id against `--zstd-dictionary`'s
//!   (0 = none), as `serve` will compare them; a mismatch fails (`serve` would refuse to start).
//!   A store another process holds is a warning naming the holder.
//! - `upstream`, `plc`: an HTTP answer from the relay (`GET /xrpc/_health` on the
//!   `subscribeRepos` host) and the PLC directory (`GET /_health`) within `--timeout`; any HTTP
//!   status means reachable. `--offline` leaves them out.
//! - `disk`: free space where the store (`--data`, else the current directory) lives: a warning
//!   under 5 GiB, a failure under 512 MiB.
//! - `fd-limit`: the open-file limit against what `serve` needs (a failure when it cannot start,
//!   a warning when it lowers `--max-connections` below its default).
//! - `java`, `mvn`: Java 17+ and Maven, for the Kafka tests and `deploy/kafka/start` only: a
//!   warning when missing.
//!
//! Text: `STATUS  CHECK: DETAIL` per check. `--json`: `{"checks":[{"check","status","detail"}],
//! "ok","warn","fail"}` (the counts). Exit 1 when a check fails.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use riptide_resolver::{Resolver, ResolverConfig, DEFAULT_PLC_URL};

use crate::out;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The shared corpus (default: $RIPTIDE_CORPUS, else ../shared/corpus).
    #[arg(long, value_name = "DIR")]
    corpus: Option<PathBuf>,
    /// A `riptide serve` data directory: its dictionary id is checked.
    #[arg(long, value_name = "DIR")]
    data: Option<PathBuf>,
    /// The dictionary `serve` will be given (with --data; default: none).
    #[arg(long, value_name = "FILE", requires = "data")]
    zstd_dictionary: Option<PathBuf>,
    /// The relay whose reachability is checked.
    #[arg(long, default_value = "wss://bsky.network")]
    upstream: String,
    /// The PLC directory whose reachability is checked.
    #[arg(long, default_value = DEFAULT_PLC_URL)]
    plc_url: String,
    /// Leave out the network checks.
    #[arg(long)]
    offline: bool,
    /// Time allowed for each network check and each program asked for its version, in seconds.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    timeout: u64,
    /// One JSON object on stdout.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Ok,
    Warn,
    Fail,
}

impl Status {
    fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "fail",
        }
    }
}

/// One check's outcome.
struct Check {
    name: &'static str,
    status: Status,
    detail: String,
}

fn check(name: &'static str, status: Status, detail: impl Into<String>) -> Check {
    Check {
        name,
        status,
        detail: detail.into(),
    }
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let timeout = Duration::from_secs(a.timeout);
    let mut checks = vec![corpus(a.corpus.as_deref())];
    if let Some(data) = &a.data {
        checks.push(store(data, a.zstd_dictionary.as_deref()));
    }
    let rt = super::account::runtime()?;
    if !a.offline {
        let resolver = Resolver::new(ResolverConfig {
            timeout,
            ..ResolverConfig::default()
        })?;
        let relay = riptide_resolver::resync::relay_http_base(&a.upstream)
            .map(|b| format!("{b}/xrpc/_health"));
        let plc = format!("{}/_health", a.plc_url.trim_end_matches('/'));
        let (u, p) = rt.block_on(async {
            let u = match &relay {
                Some(url) => reachable(&resolver, "upstream", url, timeout).await,
                None => check(
                    "upstream",
                    Status::Fail,
                    format!("{}: not a ws(s):// or http(s):// URL", a.upstream),
                ),
            };
            (u, reachable(&resolver, "plc", &plc, timeout).await)
        });
        checks.extend([u, p]);
    }
    checks.push(disk(a.data.as_deref().unwrap_or_else(|| Path::new("."))));
    checks.push(fd_limit());
    let (java, mvn) = rt.block_on(async {
        tokio::join!(
            program("java", &["-version"], timeout),
            program("mvn", &["-v"], timeout)
        )
    });
    checks.extend([java, mvn]);

    let count = |s: Status| checks.iter().filter(|c| c.status == s).count();
    let mut stdout = out::stdout();
    if a.json {
        let list: Vec<_> = checks
            .iter()
            .map(|c| serde_json::json!({"check": c.name, "status": c.status.as_str(), "detail": c.detail}))
            .collect();
        let v = serde_json::json!({
            "checks": list,
            "ok": count(Status::Ok),
            "warn": count(Status::Warn),
            "fail": count(Status::Fail),
        });
        writeln!(stdout, "{v}")?;
    } else {
        for c in &checks {
            writeln!(stdout, "{:<5} {}: {}", c.status.as_str(), c.name, c.detail)?;
        }
    }
    stdout.flush()?;
    Ok(if count(Status::Fail) > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// The capture's and dictionaries' facts the tests rely on.
const LEGACY_DICT: (&str, u32) = (
    "jetstream-dictionaries/legacy_subscribe.zdict",
    1_612_007_021,
);
const V2_DICT: (&str, u32) = (
    "jetstream-dictionaries/subscribe_events_20260811.zdict",
    20_260_811,
);

fn corpus(given: Option<&Path>) -> Check {
    let dir = given.map(Path::to_path_buf).unwrap_or_else(|| {
        std::env::var_os("RIPTIDE_CORPUS")
            .map_or_else(|| PathBuf::from("../shared/corpus"), PathBuf::from)
    });
    if !dir.join("README.md").is_file() {
        let status = if given.is_some() {
            Status::Fail
        } else {
            Status::Warn
        };
        return check(
            "corpus",
            status,
            format!(
                "{}: not found (the tests and benchmarks need it: see the README, \"The shared corpus\"; --corpus DIR or RIPTIDE_CORPUS)",
                dir.display()
            ),
        );
    }
    match corpus_facts(&dir) {
        Ok(facts) => check("corpus", Status::Ok, format!("{}: {facts}", dir.display())),
        Err(why) => check(
            "corpus",
            Status::Fail,
            format!("{}: incomplete: {why}", dir.display()),
        ),
    }
}

/// What the corpus holds, or the first thing missing or wrong.
fn corpus_facts(dir: &Path) -> Result<String, String> {
    let read = |rel: &str| std::fs::read(dir.join(rel)).map_err(|e| format!("{rel}: {e}"));
    let cap = "jetstream-2026-07";
    let manifest: serde_json::Value =
        serde_json::from_slice(&read(&format!("{cap}/manifest.json"))?)
            .map_err(|e| format!("{cap}/manifest.json: {e}"))?;
    let want = manifest["frames"]
        .as_u64()
        .ok_or("manifest.json: no frames")? as usize;
    let frames = read(&format!("{cap}/firehose-frames.bin"))?;
    let got = riptide_firehose::corpus::split_frames(&frames)
        .map_err(|e| format!("{cap}/firehose-frames.bin: {e}"))?
        .len();
    if got != want {
        return Err(format!(
            "{cap}/firehose-frames.bin: {got} frames, the manifest says {want}"
        ));
    }
    let docs: serde_json::Value = serde_json::from_slice(&read(&format!("{cap}/did_docs.json"))?)
        .map_err(|e| format!("{cap}/did_docs.json: {e}"))?;
    let dids = manifest["commit_dids"]
        .as_array()
        .map_or(&[][..], Vec::as_slice);
    if let Some(d) = dids
        .iter()
        .filter_map(|d| d.as_str())
        .find(|d| docs.get(d).is_none())
    {
        return Err(format!("{cap}/did_docs.json: no document for {d}"));
    }
    let tsv = read(&format!("{cap}/car_expected_records.tsv"))?;
    let listed = tsv.split(|b| *b == b'\n').filter(|l| !l.is_empty()).count();
    let car = read(&format!("{cap}/repo.car"))?;
    let mut reader = riptide_car::CarReader::new();
    let records = reader
        .read(&car, &riptide_car::CarOptions::repository())
        .map_err(riptide_repo::RepoError::from)
        .and_then(|c| riptide_repo::list_records(&c))
        .map_err(|e| format!("{cap}/repo.car: {e}"))?
        .len();
    if records != listed {
        return Err(format!(
            "{cap}/repo.car: {records} records, goat's listing has {listed}"
        ));
    }
    for (rel, id) in [LEGACY_DICT, V2_DICT] {
        let got = riptide_client::jetstream::dictionary_id(&read(rel)?)
            .map_err(|e| format!("{rel}: {e}"))?;
        if got != id {
            return Err(format!("{rel}: dictionary id {got}, expected {id}"));
        }
    }
    Ok(format!(
        "{got} frames as the manifest says, {} DID documents, repo.car's {records} records as goat lists them, dictionaries {} and {}",
        dids.len(),
        LEGACY_DICT.1,
        V2_DICT.1
    ))
}

fn store(data: &Path, dictionary: Option<&Path>) -> Check {
    if !data.is_dir() {
        return check(
            "store",
            Status::Fail,
            format!("{}: no such directory", data.display()),
        );
    }
    let given = match dictionary.map(|p| {
        super::read_file(p).and_then(|b| {
            riptide_client::jetstream::dictionary_id(&b)
                .map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))
        })
    }) {
        None => 0,
        Some(Ok(id)) => id,
        Some(Err(e)) => return check("store", Status::Fail, format!("{e:#}")),
    };
    // Opening creates a store: a directory without one is said as such, not made one (a store
    // has fjall's `partitions/`). Empty is a new data directory; anything else is a warning.
    if !data.join("partitions").is_dir() {
        let empty = std::fs::read_dir(data).is_ok_and(|mut d| d.next().is_none());
        return if empty {
            check(
                "store",
                Status::Ok,
                format!("{}: empty (serve will create a store)", data.display()),
            )
        } else {
            check(
                "store",
                Status::Warn,
                format!(
                    "{}: holds no store but other files (serve would create one among them)",
                    data.display()
                ),
            )
        };
    }
    let stored = riptide_serve::Store::open_any(data).and_then(|(s, _)| s.dict_id());
    match stored {
        Err(e @ riptide_serve::StoreError::Locked(_)) => check(
            "store",
            Status::Warn,
            format!("{e} (its dictionary is not checked while it runs)"),
        ),
        Err(e) => check("store", Status::Fail, format!("{}: {e}", data.display())),
        Ok(None) => check(
            "store",
            Status::Ok,
            format!("{}: no dictionary recorded yet (a new store)", data.display()),
        ),
        Ok(Some(id)) if id == given => check(
            "store",
            Status::Ok,
            format!("{}: zstd dictionary {id}, as given", data.display()),
        ),
        Ok(Some(id)) => check(
            "store",
            Status::Fail,
            format!(
                "{}: written with zstd dictionary {id}, but {} (serve would refuse it: give the same --zstd-dictionary, or a new --data)",
                data.display(),
                if given == 0 { "none is given".to_owned() } else { format!("the given one is {given}") }
            ),
        ),
    }
}

/// Whether `url` answers HTTP at all within `timeout`.
async fn reachable(resolver: &Resolver, name: &'static str, url: &str, timeout: Duration) -> Check {
    let t = std::time::Instant::now();
    let answer = tokio::time::timeout(timeout, resolver.http().get(url).send()).await;
    let ms = t.elapsed().as_millis();
    match answer {
        Ok(Ok(r)) => check(
            name,
            Status::Ok,
            format!("{url}: HTTP {} in {ms} ms", r.status().as_u16()),
        ),
        Ok(Err(e)) => check(name, Status::Fail, format!("{url}: {}", causes(&e))),
        Err(_) => check(
            name,
            Status::Fail,
            format!("{url}: no answer within {timeout:?}"),
        ),
    }
}

/// Free space on the filesystem holding `dir`, in bytes.
#[allow(unsafe_code)]
fn free_bytes(dir: &Path) -> std::io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
    // SAFETY: `c` is a NUL-terminated path that outlives the call; `st` is a writable, properly
    // aligned `statvfs` that the call fills in (read only when it returns 0).
    let rc = unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: statvfs returned 0, so it initialised `st`.
    let st = unsafe { st.assume_init() };
    // u64 on 64-bit Linux, narrower elsewhere.
    #[allow(clippy::unnecessary_cast)]
    Ok((st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
}

fn disk(dir: &Path) -> Check {
    const GIB: u64 = 1 << 30;
    match free_bytes(dir) {
        Err(e) => check("disk", Status::Fail, format!("{}: {e}", dir.display())),
        Ok(free) => {
            let status = if free < GIB / 2 {
                Status::Fail
            } else if free < 5 * GIB {
                Status::Warn
            } else {
                Status::Ok
            };
            check(
                "disk",
                status,
                format!(
                    "{}: {:.1} GiB free",
                    dir.display(),
                    free as f64 / GIB as f64
                ),
            )
        }
    }
}

fn fd_limit() -> Check {
    let Some(limit) = riptide_serve::limits::fd_limit() else {
        return check(
            "fd-limit",
            Status::Warn,
            "the open-file limit could not be read",
        );
    };
    let default = riptide_serve::ConnLimits::default();
    match default.effective() {
        Err(e) => check("fd-limit", Status::Fail, format!("{limit}: {e}")),
        Ok(l) if l.max_connections < default.max_connections => check(
            "fd-limit",
            Status::Warn,
            format!(
                "{limit} open files: serve would accept {} connections, not its default {} (raise ulimit -n)",
                l.max_connections, default.max_connections
            ),
        ),
        Ok(_) => check(
            "fd-limit",
            Status::Ok,
            format!("{} open files", if limit == u64::MAX { "unlimited".to_owned() } else { limit.to_string() }),
        ),
    }
}

/// Whether `name` runs (its version line), within `timeout`; missing is a warning (only the
/// Kafka tests need Java and Maven).
async fn program(name: &'static str, args: &[&str], timeout: Duration) -> Check {
    let why = "needed only by the Kafka tests and deploy/kafka/start: apt-get install openjdk-17-jre-headless maven";
    let run = tokio::process::Command::new(name)
        .args(args)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    match tokio::time::timeout(timeout, run).await {
        Ok(Ok(out)) if out.status.success() => {
            // `java -version` writes to stderr, `mvn -v` to stdout.
            let text = [out.stdout, out.stderr].concat();
            let first = plain(&String::from_utf8_lossy(&text))
                .lines()
                .find(|l| !l.trim().is_empty())
                .unwrap_or_default()
                .trim()
                .to_owned();
            let status = match java_major(&first) {
                Some(v) if name == "java" && v < 17 => Status::Warn,
                _ => Status::Ok,
            };
            check(name, status, first)
        }
        Ok(Ok(out)) => check(
            name,
            Status::Warn,
            format!("exits with {}; {why}", out.status),
        ),
        Ok(Err(e)) => check(name, Status::Warn, format!("{e}; {why}")),
        Err(_) => check(
            name,
            Status::Warn,
            format!("no answer within {timeout:?}; {why}"),
        ),
    }
}

/// An error with its causes (`error sending request` alone does not say "connection refused").
fn causes(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut at = e.source();
    while let Some(c) = at {
        let t = c.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        at = c.source();
    }
    s
}

/// `text` without terminal escape sequences (`mvn -v` colours its first line).
fn plain(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ parameters… final byte in @..~
            if chars.next() == Some('[') {
                for d in chars.by_ref() {
                    if ('@'..='~').contains(&d) {
                        break;
                    }
                }
            }
            continue;
        }
        out.push(c);
    }
    out
}

/// The major version in `java -version`'s first line (`openjdk version "17.0.12" …`;
/// `"1.8.0_412"` is 8).
fn java_major(line: &str) -> Option<u32> {
    let v = line.split('"').nth(1)?;
    let mut parts = v.split(['.', '_', '-']);
    let first: u32 = parts.next()?.parse().ok()?;
    if first == 1 {
        parts.next()?.parse().ok()
    } else {
        Some(first)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn java_versions() {
        assert_eq!(
            java_major(r#"openjdk version "17.0.12" 2024-07-16"#),
            Some(17)
        );
        assert_eq!(java_major(r#"java version "1.8.0_412""#), Some(8));
        assert_eq!(java_major(r#"openjdk version "21" 2023-09-19"#), Some(21));
        assert_eq!(java_major("Apache Maven 3.8.7"), None);
        assert_eq!(
            plain("\u{1b}[1mApache Maven 3.8.7\u{1b}[m"),
            "Apache Maven 3.8.7"
        );
    }

    #[test]
    fn free_space_of_a_directory_and_of_nothing() {
        assert!(free_bytes(Path::new(".")).unwrap() > 0);
        assert!(free_bytes(Path::new("/no/such/dir/anywhere")).is_err());
    }
}
