//! What the integration tests of the `riptide` binary share, written once: running the binary,
//! the real capture's directory (located by `riptide-testdata`), scratch files that are removed
//! when the test ends, and servers (`riptide relay|sim|serve` as child processes) that announce
//! their address within a time limit and are killed when the test ends, pass or fail, so that a
//! failed assertion never leaves an orphan server behind.
//!
//! Each test binary includes it with `mod common;` and uses only a part of it.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::Value;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

/// The `riptide` binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_riptide");

/// How long a server may take to announce its address, a metric to reach its value, or a
/// WebSocket message to arrive: generous, for a loaded 2-core machine.
pub const PATIENCE: Duration = Duration::from_secs(120);

/// Runs `riptide args` to completion.
pub fn riptide(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().expect("run riptide")
}

/// The command's stderr, as text.
pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Each line of the command's stdout, parsed as JSON.
pub fn json_lines(out: &Output) -> Vec<Value> {
    std::str::from_utf8(&out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// A path as an argument.
pub fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The real capture's directory (`jetstream-2026-07`): `None`, with a note, when the corpus is
/// absent outside CI (`riptide_testdata::corpus` panics under CI).
pub fn capture_dir() -> Option<PathBuf> {
    Some(riptide_testdata::corpus()?.join("jetstream-2026-07"))
}

/// A scratch directory, removed when dropped (at the end of the test, pass or fail).
pub fn scratch() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("riptide-cli-test-")
        .tempdir()
        .unwrap()
}

/// Writes `bytes` to `dir/name` and returns the path.
pub fn write(dir: &tempfile::TempDir, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.path().join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

/// Flips a byte in the middle of the last block of a commit frame's CAR, so that the block no
/// longer hashes to its CID.
pub fn flip_in_last_block(frame: &mut [u8]) {
    let at = {
        let mut dec = riptide_firehose::FrameDecoder::new();
        let decoded = dec.decode(frame).unwrap();
        let last = decoded.car().unwrap().blocks().last().unwrap();
        last.data.as_ptr() as usize - frame.as_ptr() as usize + last.data.len() / 2
    };
    frame[at] ^= 0x40;
}

/// A child process killed and reaped when dropped.
pub struct KillOnDrop(Child);

impl KillOnDrop {
    /// Takes charge of a child already spawned.
    pub fn from_child(child: Child) -> KillOnDrop {
        KillOnDrop(child)
    }

    /// The exit status, if the process has ended.
    pub fn try_wait(&mut self) -> Option<std::process::ExitStatus> {
        self.0.try_wait().ok().flatten()
    }

    /// SIGKILL now, and wait for the process to end.
    pub fn kill(mut self) {
        self.0.kill().expect("kill the server");
        self.0.wait().expect("reap the server");
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Which output stream of a server carries its address.
#[derive(Clone, Copy)]
enum Pipe {
    Stdout,
    Stderr,
}

/// Spawns `cmd` with `pipe` piped and waits (at most [`PATIENCE`]) for the first line of it that
/// `pick` turns into an address. The rest of the stream is drained, so the server never blocks on
/// a full pipe.
fn spawn_announcing(
    cmd: &mut Command,
    pipe: Pipe,
    pick: fn(&str) -> Option<String>,
) -> (KillOnDrop, String) {
    let (child, announced) = spawn_announcing_later(cmd, pipe, pick);
    (child, announced.wait())
}

/// The address a child will announce (see [`spawn_serve_later`]).
pub struct Announced(mpsc::Receiver<String>);

impl Announced {
    /// Waits for the address; fails after [`PATIENCE`] or when the child exits first.
    pub fn wait(self) -> String {
        match self.0.recv_timeout(PATIENCE) {
            Ok(addr) => addr,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                panic!("no address announced within {PATIENCE:?}")
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                panic!("exited before announcing its address")
            }
        }
    }
}

/// [`spawn_announcing`] without waiting: the child is the caller's at once (killed on drop
/// whatever happens), its address comes later.
fn spawn_announcing_later(
    cmd: &mut Command,
    pipe: Pipe,
    pick: fn(&str) -> Option<String>,
) -> (KillOnDrop, Announced) {
    match pipe {
        Pipe::Stdout => cmd.stdout(Stdio::piped()),
        Pipe::Stderr => cmd.stderr(Stdio::piped()),
    };
    let mut child = KillOnDrop(cmd.spawn().expect("start riptide"));
    let stream: Box<dyn Read + Send> = match pipe {
        Pipe::Stdout => Box::new(child.0.stdout.take().unwrap()),
        Pipe::Stderr => Box::new(child.0.stderr.take().unwrap()),
    };
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stream).lines().map_while(Result::ok);
        if let Some(addr) = lines.by_ref().find_map(|l| pick(&l)) {
            let _ = tx.send(addr);
        }
        lines.for_each(drop);
    });
    (child, Announced(rx))
}

/// Spawns a server that prints its URL as the first line of stdout (`riptide relay`, `riptide
/// sim`), and returns it with that URL.
pub fn spawn_printing_url(cmd: &mut Command) -> (KillOnDrop, String) {
    spawn_announcing(cmd, Pipe::Stdout, |l| Some(l.trim().to_owned()))
}

/// Starts `riptide sim --from dir --listen 127.0.0.1:0` and returns it with its base URL.
pub fn start_sim(dir: &Path) -> (KillOnDrop, String) {
    let (sim, base) = spawn_printing_url(
        Command::new(BIN)
            .args(["sim", "--from", s(dir), "--listen", "127.0.0.1:0"])
            .stderr(Stdio::inherit()),
    );
    assert!(base.starts_with("http://127.0.0.1:"), "{base:?}");
    (sim, base)
}

/// The handle a DID document claims (its first `alsoKnownAs`, without `at://`).
pub fn handle_of(doc: &serde_json::Value) -> String {
    doc["alsoKnownAs"][0]
        .as_str()
        .unwrap()
        .strip_prefix("at://")
        .unwrap()
        .to_owned()
}

/// `riptide verify-handle handle --json` against a sim at `base` (its PLC directory and handle
/// resolver), with the report parsed.
pub fn verify_handle_json(handle: &str, base: &str) -> (Output, Value) {
    let out = riptide(&[
        "verify-handle",
        handle,
        "--plc-url",
        base,
        "--handle-resolver",
        base,
        "--json",
    ]);
    let v: Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", stderr(&out)));
    (out, v)
}

/// `riptide serve --listen 127.0.0.1:0 --data data`, quiet but for warnings; the caller adds its
/// arguments and starts it with [`spawn_serve`].
pub fn serve_command(data: &Path) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.args(["serve", "--listen", "127.0.0.1:0"])
        .arg("--data")
        .arg(data)
        .env("RUST_LOG", "warn");
    cmd
}

/// Spawns `riptide serve` and returns it with the `host:port` of the `ws://ADDR/subscribe` URL
/// it prints as its first stdout line (as `relay` and `sim` print theirs).
pub fn spawn_serve(cmd: &mut Command) -> (KillOnDrop, String) {
    let (child, announced) = spawn_serve_later(cmd);
    (child, announced.wait())
}

/// [`spawn_serve`] for a server that announces itself only later (a standby ingest node waits
/// for its lease): the child is the caller's at once, so it is killed on drop even if it never
/// announces.
pub fn spawn_serve_later(cmd: &mut Command) -> (KillOnDrop, Announced) {
    spawn_announcing_later(cmd, Pipe::Stdout, |l| {
        l.trim()
            .strip_prefix("ws://")
            .map(|rest| rest.trim_end_matches("/subscribe").to_owned())
    })
}

/// Spawns `riptide backfill … --metrics-listen 127.0.0.1:0` and returns it with the `host:port`
/// of the `/metrics` address it logs on stderr (`RUST_LOG=info` is set here).
pub fn spawn_backfill_with_metrics(cmd: &mut Command) -> (KillOnDrop, String) {
    cmd.env("RUST_LOG", "info");
    spawn_announcing(cmd, Pipe::Stderr, |l| {
        let (_, rest) = l.split_once("serving http://")?;
        Some(rest.split_once("/metrics")?.0.to_owned())
    })
}

/// The DID documents of a generated network (`NET/did_docs.json`) with every account's PDS
/// moved to `pds` (a `riptide sim`, as its PLC directory would serve them), written beside them:
/// for a server given `--did-docs`, which resyncs from the documents' PDS too (one identity
/// source).
pub fn docs_with_pds(net: &Path, pds: &str) -> PathBuf {
    let mut docs: serde_json::Map<String, Value> =
        serde_json::from_slice(&std::fs::read(net.join("did_docs.json")).unwrap()).unwrap();
    for doc in docs.values_mut() {
        for svc in doc["service"].as_array_mut().into_iter().flatten() {
            if svc["id"]
                .as_str()
                .is_some_and(|id| id.ends_with("#atproto_pds"))
            {
                svc["serviceEndpoint"] = Value::String(pds.trim_end_matches('/').to_owned());
            }
        }
    }
    let out = net.join(format!(
        "did_docs.{}.json",
        pds.rsplit(':').next().unwrap_or("sim")
    ));
    std::fs::write(&out, serde_json::to_vec(&docs).unwrap()).unwrap();
    out
}

/// `GET path` on a server: the status code and the body.
pub fn http_get(addr: &str, path: &str) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut t = String::new();
    s.read_to_string(&mut t).unwrap();
    let code = t[9..12].parse().unwrap();
    (
        code,
        t.split_once("\r\n\r\n")
            .map(|x| x.1.to_owned())
            .unwrap_or_default(),
    )
}

/// The server's `/metrics` page.
pub fn metrics(addr: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).unwrap();
    body
}

/// One metric's value; panics when the server does not report it.
pub fn metric(addr: &str, name: &str) -> f64 {
    metrics(addr)
        .lines()
        .find_map(|l| {
            l.strip_prefix(name)
                .and_then(|r| r.strip_prefix(' '))
                .map(|v| v.parse().unwrap())
        })
        .unwrap_or_else(|| panic!("no metric {name}"))
}

/// Polls the metric until it reaches `at_least`; fails after [`PATIENCE`].
pub fn wait_for(addr: &str, name: &str, at_least: f64) {
    let deadline = Instant::now() + PATIENCE;
    while metric(addr, name) < at_least {
        assert!(Instant::now() < deadline, "{name} never reached {at_least}");
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// The first `n` events the server sends from cursor 0 (its text messages, as JSON).
pub async fn events_from_start(addr: &str, n: usize) -> Vec<Value> {
    let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/subscribe?cursor=0"))
        .await
        .unwrap();
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let m = tokio::time::timeout(PATIENCE, ws.next())
            .await
            .expect("timed out reading events")
            .unwrap()
            .unwrap();
        if let Message::Text(t) = m {
            out.push(serde_json::from_str(&t).unwrap());
        }
    }
    out
}

/// Jetstream v2's `subscribeEvents` path.
pub const V2: &str = "/xrpc/network.bsky.jetstream.subscribeEvents";

/// Every frame a v2 subscription sends, as JSON (see [`v2_texts`]).
pub async fn v2_frames(addr: &str, query: &str, n: usize, dict: Option<&[u8]>) -> Vec<Value> {
    v2_texts(addr, query, n, dict)
        .await
        .iter()
        .map(|t| serde_json::from_str(t).unwrap())
        .collect()
}

/// Every frame a v2 subscription sends (decompressed with `dict` when given) until `n` message
/// frames have arrived and then nothing more for a moment.
pub async fn v2_texts(addr: &str, query: &str, n: usize, dict: Option<&[u8]>) -> Vec<String> {
    let mut req = format!("ws://{addr}{V2}?{query}")
        .into_client_request()
        .unwrap();
    req.headers_mut()
        .insert("sec-websocket-protocol", "xrpc.v1.json".parse().unwrap());
    let (mut ws, resp) = tokio_tungstenite::connect_async(req).await.unwrap();
    assert_eq!(
        resp.headers()
            .get("sec-websocket-protocol")
            .map(|v| v.to_str().unwrap()),
        Some("xrpc.v1.json")
    );
    let mut dec = dict.map(|d| zstd::bulk::Decompressor::with_dictionary(d).unwrap());
    let mut out = Vec::new();
    let mut messages = 0;
    loop {
        // Until n messages: wait as long as it takes; then a quiet moment proves there is no more.
        let wait = if messages < n {
            PATIENCE
        } else {
            Duration::from_millis(700)
        };
        let m = match tokio::time::timeout(wait, ws.next()).await {
            Err(_) if messages >= n => break,
            Err(_) => panic!("{query}: {messages} of {n} messages"),
            Ok(m) => m.unwrap().unwrap(),
        };
        let text = match (m, dec.as_mut()) {
            (Message::Text(t), None) => t.to_string(),
            (Message::Binary(b), Some(d)) => {
                let raw = d.decompress(&b, 1 << 24).unwrap();
                String::from_utf8(raw).unwrap()
            }
            (Message::Ping(_) | Message::Pong(_), _) => continue,
            (m, _) => panic!("{query}: unexpected frame {m:?}"),
        };
        let v: Value = serde_json::from_str(&text).unwrap();
        if v["payload"]["seq"].is_u64() {
            messages += 1;
        }
        out.push(text);
    }
    let _ = ws.close(None).await;
    out
}

/// `riptide repo ls` of a good account's CAR (`DIR/repos/DID.car`, as `riptide gen` writes it): `collection/rkey\tcid` lines.
pub fn repo_ls(dir: &Path, did: &str) -> BTreeSet<String> {
    let out = riptide(&[
        "repo",
        "ls",
        s(&dir.join("repos").join(format!("{did}.car"))),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// JSON lines → DID → every `collection/rkey\tcid`, in order of arrival; every line parses
/// and has the fields of the contract.
pub fn by_did(text: &str) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in text.lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line:?}"));
        let field = |k: &str| v[k].as_str().unwrap_or_else(|| panic!("{k}: {line}"));
        assert!(riptide_syntax::is_valid_tid(field("rev")), "{line}");
        let collection = field("collection");
        // Generated records carry their type: the rendering is the record's.
        assert_eq!(v["record"]["$type"].as_str(), Some(collection), "{line}");
        out.entry(field("did").to_owned())
            .or_default()
            .push(format!("{collection}/{}\t{}", field("rkey"), field("cid")));
    }
    out
}

/// Each good account's records exactly once and equal to `repo ls`; nothing of the others.
pub fn assert_exactly_once(dir: &Path, good: &[String], text: &str) {
    let mut got = by_did(text);
    for did in good {
        let lines = got.remove(did).unwrap_or_default();
        let set: BTreeSet<String> = lines.iter().cloned().collect();
        assert_eq!(set.len(), lines.len(), "{did}: a record written twice");
        assert_eq!(set, repo_ls(dir, did), "{did}");
    }
    assert!(
        got.is_empty(),
        "records of faulty accounts: {:?}",
        got.keys()
    );
}

/// The DIDs of a generated network's repositories (`DIR/repos/DID.car`, as `riptide gen`
/// writes them), sorted.
pub fn repo_dids(dir: &Path) -> Vec<String> {
    let mut dids: Vec<String> = std::fs::read_dir(dir.join("repos"))
        .unwrap()
        .map(|e| {
            let name = e.unwrap().file_name().into_string().unwrap();
            name.strip_suffix(".car").unwrap().to_owned()
        })
        .collect();
    dids.sort();
    dids
}
