//! Issue 39: what `serve` checks before its side effects, and how it says that a Kafka cluster
//! cannot be reached. None of these needs a broker: nothing listens on port 1.
//!
//! - A `kafka://` address that does not parse or whose broker does not resolve, and a
//!   `--metrics-listen` address that is taken, are refused in one line before the data directory
//!   is created (the store used to be opened first).
//! - The open-file limit is raised to the hard one, and a limit that still cannot hold
//!   `--max-connections` is said once, with the fix.
//! - An unreachable cluster is said within seconds, once, for both an ingest node (`--publish`)
//!   and an edge (`--from`), and an edge stays not ready meanwhile.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{scratch, stderr, BIN};

/// `riptide serve` on `data` with `args`, run to its end (these all fail at start).
fn serve_fails(data: &Path, args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--data"])
        .arg(data)
        .args(args)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .output()
        .unwrap();
    (out.status.code(), stderr(&out))
}

#[test]
fn a_bad_kafka_address_is_refused_before_the_store_is_opened() {
    let tmp = scratch();
    for (flag, url, says) in [
        (
            "--publish",
            "kafka://localhost/t",
            "each broker must be HOST:PORT",
        ),
        ("--from", "kafka://127.0.0.1:9092", "no /TOPIC"),
        (
            "--publish",
            "kafka://no-such-broker.invalid:9092/t",
            "no-such-broker.invalid:9092",
        ),
        (
            "--from",
            "kafka://127.0.0.1:9092,no-such-broker.invalid:9092/t",
            "no-such-broker.invalid:9092",
        ),
    ] {
        let data = tmp.path().join("data");
        let (code, err) = serve_fails(&data, &[flag, url]);
        assert_eq!(code, Some(2), "{flag} {url}: {err}");
        assert!(err.contains(says), "{flag} {url}: {err}");
        assert_eq!(err.lines().count(), 1, "one line: {err}");
        assert!(
            !data.exists(),
            "{flag} {url}: the store was opened first: {err}"
        );
    }
}

#[test]
fn a_taken_metrics_address_is_refused_before_the_store_is_opened() {
    let tmp = scratch();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let at = taken.local_addr().unwrap().to_string();
    let data = tmp.path().join("data");
    let (code, err) = serve_fails(&data, &["--no-verify", "--metrics-listen", &at]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains(&at) && err.contains("--metrics-listen"),
        "{err}"
    );
    assert!(!err.contains("store open"), "{err}");
    assert!(!data.exists(), "the store was opened first: {err}");
}

/// A `riptide serve` started under `prlimit` (which execs it: the pid is the server's), its
/// stderr going to `log`; the address it printed.
fn serve_under_prlimit(nofile: &str, data: &Path, args: &[&str], log: &Path) -> (Child, String) {
    let mut child = Command::new("prlimit")
        .arg(format!("--nofile={nofile}"))
        .args([BIN, "serve", "--listen", "127.0.0.1:0", "--data"])
        .arg(data)
        .args(args)
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    let addr = first
        .trim()
        .strip_prefix("ws://")
        .and_then(|a| a.strip_suffix("/subscribe"))
        .unwrap_or_else(|| panic!("no URL: {first:?} {}", read(log)))
        .to_owned();
    (child, addr)
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

/// The soft and hard open-file limits of a process.
fn nofile_of(pid: u32) -> (String, String) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    let f: Vec<&str> = line.split_whitespace().collect();
    (f[3].to_owned(), f[4].to_owned())
}

#[test]
fn the_open_file_limit_is_raised_to_the_hard_one_and_a_short_one_is_said() {
    if Command::new("prlimit").arg("--version").output().is_err() {
        assert!(
            std::env::var_os("CI").is_none(),
            "prlimit (util-linux) is missing"
        );
        eprintln!("note: skipped: prlimit (util-linux) not found");
        return;
    }
    let tmp = scratch();
    let corpus = common::write(
        &tmp,
        "empty.bin",
        &riptide_firehose::corpus::write_frames(std::iter::empty()),
    );
    let ingest = ["--no-verify", "--ingest-file", common::s(&corpus)];
    // Soft 1024, hard 4096: raised to 4096, which cannot hold 10,000 connections: said once.
    let log = tmp.path().join("a.log");
    let (mut a, addr) = serve_under_prlimit("1024:4096", &tmp.path().join("a"), &ingest, &log);
    assert_eq!(nofile_of(a.id()), ("4096".into(), "4096".into()));
    assert_eq!(common::http_get(&addr, "/healthz").0, 200);
    a.kill().unwrap();
    a.wait().unwrap();
    let text = read(&log);
    let said: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("--max-connections"))
        .collect();
    assert_eq!(said.len(), 1, "{text}");
    assert!(
        said[0].contains("WARN")
            && said[0].contains("of the 10000 connections")
            && said[0].contains("LimitNOFILE"),
        "{text}"
    );
    assert!(text.contains("open-file limit raised"), "{text}");
    // A budget the limit holds: nothing said about it.
    let log = tmp.path().join("b.log");
    let mut args = ingest.to_vec();
    args.extend(["--max-connections", "1000"]);
    let (mut b, _) = serve_under_prlimit("1024:4096", &tmp.path().join("b"), &args, &log);
    assert_eq!(nofile_of(b.id()).0, "4096");
    b.kill().unwrap();
    b.wait().unwrap();
    assert!(!read(&log).contains("--max-connections"), "{}", read(&log));
}

/// Lines of `log` that speak of Kafka or librdkafka.
fn kafka_lines(log: &Path) -> Vec<String> {
    read(log)
        .lines()
        .filter(|l| l.contains("kafka") || l.contains("Kafka"))
        .map(str::to_owned)
        .collect()
}

/// Watches a server's log for ~15 s: the time of the first line saying the brokers cannot be
/// reached, and the Kafka lines at the end; `each_second` is called meanwhile.
fn watch_unreachable(log: &Path, mut each_second: impl FnMut()) -> (Duration, Vec<String>) {
    let t0 = Instant::now();
    let mut first = None;
    while t0.elapsed() < Duration::from_secs(15) {
        if first.is_none() && read(log).contains("cannot be reached") {
            first = Some(t0.elapsed());
        }
        each_second();
        std::thread::sleep(Duration::from_millis(250));
    }
    let first = first.unwrap_or_else(|| panic!("never said in 15 s: {}", read(log)));
    (first, kafka_lines(log))
}

#[test]
fn an_unreachable_cluster_is_said_within_seconds_once_by_an_ingest_node() {
    let tmp = scratch();
    let log = tmp.path().join("stderr.log");
    let server = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--no-verify", "--data"])
        .arg(tmp.path().join("data"))
        .args(["--publish", "kafka://127.0.0.1:1/t"])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let _server = common::KillOnDrop::from_child(server);
    let (first, lines) = watch_unreachable(&log, || {});
    // Said within a few seconds (the first metadata request gives up after 2 s), and once:
    // the next is a minute later.
    assert!(first < Duration::from_secs(8), "{first:?}");
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert!(
        lines[0].contains("127.0.0.1:1") && lines[0].contains("once a minute"),
        "{lines:?}"
    );
}

#[test]
fn an_edge_without_its_cluster_says_so_once_and_is_not_ready() {
    let tmp = scratch();
    let log = tmp.path().join("stderr.log");
    let mut cmd = common::serve_command(&tmp.path().join("data"));
    cmd.args(["--from", "kafka://127.0.0.1:1/t"])
        .stderr(std::fs::File::create(&log).unwrap());
    let (_edge, addr) = common::spawn_serve(&mut cmd);
    let mut answers = Vec::new();
    let (first, lines) =
        watch_unreachable(&log, || answers.push(common::http_get(&addr, "/readyz")));
    assert!(first < Duration::from_secs(8), "{first:?}");
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert!(answers.len() > 10, "{answers:?}");
    for (code, body) in &answers {
        assert_eq!(*code, 503, "{body}");
        assert!(body.contains("catch up with the Kafka topic"), "{body}");
    }
    assert_eq!(common::metric(&addr, "riptide_kafka_following"), 0.0);
}
