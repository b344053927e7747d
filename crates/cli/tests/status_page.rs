//! Issue 39: `serve`'s status page at `GET /`, read by a real browser (headless Chromium from
//! Debian's packages) as an operator would: the DOM Chromium built is checked figure by figure
//! against `/metrics` of the same server, and a screenshot is read back by OCR (Debian's
//! `tesseract-ocr`) for the main figures, so the page is checked as rendered, not only as sent.
//!
//! Chromium and tesseract are installed by `tests/browser/install` (which `.ci/run` runs). Under
//! `CI=true` a missing one fails the test; elsewhere the test is skipped with a one-line note.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{scratch, PATIENCE};
use futures_util::StreamExt;
use tokio_tungstenite::tungstenite::Message;

/// A program from `PATH` the test needs: `None` with a note outside CI; a failure under CI.
fn tool(name: &str, package: &str) -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(name))
            .find(|f| f.is_file())
    });
    if found.is_none() {
        let msg = format!(
            "{name} not found: `apt-get install -y {package}` (or tests/browser/install) to run the status page's browser test"
        );
        assert!(std::env::var_os("CI").is_none(), "{msg}");
        eprintln!("note: skipped: {msg}");
    }
    found
}

/// Runs `cmd` to its end within [`PATIENCE`] (a browser that hangs is killed and fails the
/// test); its stdout.
fn run_bounded(cmd: &mut Command) -> Vec<u8> {
    let tmp = scratch();
    let out_path = tmp.path().join("stdout");
    let mut child = cmd
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + PATIENCE;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{cmd:?} did not finish within {PATIENCE:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{cmd:?}: {status}");
    std::fs::read(&out_path).unwrap()
}

/// Headless Chromium on `url` with `what` (`--dump-dom`, `--screenshot=…`): a fresh profile, no
/// network of its own (no updates, no sync, no QUIC), as the environment's notes ask.
fn chromium(bin: &Path, url: &str, what: &str) -> Vec<u8> {
    let profile = scratch();
    run_bounded(
        Command::new(bin)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--hide-scrollbars",
                "--window-size=1100,2400",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg(what)
            .arg(url),
    )
}

/// `/metrics` as series (name with labels) to value.
fn series(addr: &str) -> HashMap<String, f64> {
    common::metrics(addr)
        .lines()
        .filter(|l| l.starts_with("riptide_"))
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_owned(), v.parse().ok()?))
        })
        .collect()
}

/// The value of the series `name` names in `m`: the series itself, or, for a name without
/// labels that `/metrics` writes only labelled, the sum of its series (the page's convention).
fn value(m: &HashMap<String, f64>, name: &str) -> Option<f64> {
    if let Some(v) = m.get(name) {
        return Some(*v);
    }
    let prefix = format!("{name}{{");
    let parts: Vec<f64> = m
        .iter()
        .filter(|(k, _)| k.starts_with(&prefix))
        .map(|(_, v)| *v)
        .collect();
    (!parts.is_empty() && !name.contains('{')).then(|| parts.iter().sum())
}

/// The `(series, shown value)` of every `data-metric` cell of a DOM as Chromium serialized it.
fn metric_cells(dom: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = dom;
    while let Some(i) = rest.find("data-metric=\"") {
        rest = &rest[i + "data-metric=\"".len()..];
        let end = rest.find('"').unwrap();
        let name = rest[..end].replace("&quot;", "\"").replace("&amp;", "&");
        let open = rest.find('>').unwrap();
        let close = rest.find('<').unwrap();
        out.push((name, rest[open + 1..close].to_owned()));
        rest = &rest[close..];
    }
    out
}

/// The `--metrics-listen` address the server printed on stderr (its log file).
fn probes_addr(log: &Path) -> String {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if let Some(rest) = text.split("probes at http://").nth(1) {
            return rest.split('/').next().unwrap().to_owned();
        }
        assert!(Instant::now() < deadline, "no probes address in {text}");
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// A served v1 subscriber reading every stored event, kept connected while the page is read.
async fn subscriber(
    addr: &str,
    n: usize,
) -> tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>> {
    let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/subscribe?cursor=0"))
        .await
        .unwrap();
    let mut got = 0;
    while got < n {
        let m = tokio::time::timeout(PATIENCE, ws.next())
            .await
            .expect("timed out reading events")
            .unwrap()
            .unwrap();
        got += matches!(m, Message::Text(_)) as usize;
    }
    ws
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_in_a_browser_says_what_metrics_says() {
    let Some(cap) = common::capture_dir() else {
        return;
    };
    let (Some(browser), Some(ocr)) = (
        tool("chromium", "chromium"),
        tool("tesseract", "tesseract-ocr"),
    ) else {
        return;
    };
    let tmp = scratch();
    let log = tmp.path().join("stderr.log");
    let mut cmd = common::serve_command(&tmp.path().join("data"));
    cmd.arg("--ingest-file")
        .arg(cap.join("firehose-frames.bin"))
        .arg("--did-docs")
        .arg(cap.join("did_docs.json"))
        .args(["--metrics-listen", "127.0.0.1:0"])
        .stderr(std::fs::File::create(&log).unwrap());
    let (_server, addr) = common::spawn_serve(&mut cmd);
    let probes = probes_addr(&log);
    // The capture ingested whole, and one subscriber served all of it: every figure is still.
    common::wait_for(&addr, "riptide_ingest_finished", 1.0);
    let stored = common::metric(&addr, "riptide_events_stored_total");
    assert!(stored >= 150.0, "{stored}");
    let ws = {
        let addr = addr.clone();
        tokio::spawn(async move { subscriber(&addr, stored as usize).await })
            .await
            .unwrap()
    };
    common::wait_for(&addr, "riptide_events_out_total", stored);

    // The DOM Chromium built, against /metrics read just before and after it (a figure that
    // moved in between, the store's size at a retention pass, makes the round be taken again).
    let page = format!("http://{addr}/");
    let (cells, m) = (0..5)
        .find_map(|_| {
            let before = series(&addr);
            let dom = String::from_utf8(chromium(&browser, &page, "--dump-dom")).unwrap();
            let after = series(&addr);
            let cells = metric_cells(&dom);
            let still = cells
                .iter()
                .all(|(name, _)| value(&before, name) == value(&after, name));
            still.then_some((cells, after))
        })
        .expect("the figures never stood still over a page load");
    assert!(cells.len() >= 30, "{cells:?}");
    for (name, shown) in &cells {
        let want = value(&m, name).unwrap_or_else(|| panic!("{name} is not in /metrics"));
        let shown: f64 = shown.replace(',', "").parse().unwrap();
        assert_eq!(shown, want, "{name}");
    }
    let named = |n: &str| cells.iter().any(|(c, _)| c == n);
    for must in [
        "riptide_upstream_seq",
        "riptide_events_stored_total",
        "riptide_events_out_total",
        "riptide_verdicts_total{verdict=\"ok\"}",
        "riptide_endpoint_subscribers{endpoint=\"subscribe\"}",
        "riptide_store_bytes",
        "riptide_retention_floor",
        "riptide_archive_segments",
    ] {
        assert!(named(must), "{must} not on the page: {cells:?}");
    }
    assert_eq!(
        value(&m, "riptide_endpoint_subscribers{endpoint=\"subscribe\"}"),
        Some(1.0)
    );

    // The rendering, read back: the screenshot is a real PNG of the page, and OCR finds the
    // figures beside their labels.
    let shots = scratch();
    let png = shots.path().join("page.png");
    chromium(&browser, &page, &format!("--screenshot={}", png.display()));
    let bytes = std::fs::read(&png).unwrap();
    assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
    assert!(bytes.len() > 20_000, "a blank page? {} bytes", bytes.len());
    // `--psm 6`: the page read as one block of lines, each row's label beside its value.
    let text = run_bounded(Command::new(&ocr).arg(&png).args(["-", "--psm", "6"]));
    let text = String::from_utf8(text).unwrap();
    let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let v = |n: &str| value(&m, n).unwrap() as u64;
    for want in [
        "riptide serve".to_owned(),
        format!("Upstream seq {}", v("riptide_upstream_seq")),
        format!("Stored {}", v("riptide_events_stored_total")),
        format!("Sent {}", v("riptide_events_out_total")),
        format!("ok {}", v("riptide_verdicts_total{verdict=\"ok\"}")),
        "v1 /subscribe 1".to_owned(),
        "State not running".to_owned(),
    ] {
        // The figure whole: not the start of a longer number.
        let whole = text.match_indices(&want).any(|(i, _)| {
            !text[i + want.len()..].starts_with(|c: char| c.is_ascii_digit() || c == ',')
        });
        assert!(whole, "{want:?} not read in the screenshot: {text}");
    }
    drop(ws);

    // The same page on the probes' own listener (--metrics-listen).
    let (code, body) = common::http_get(&probes, "/");
    assert_eq!(code, 200);
    assert!(
        body.contains("data-metric=\"riptide_upstream_seq\""),
        "{body}"
    );
}
