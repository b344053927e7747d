//! What an operator or a newcomer meets when something goes wrong (issue 18): each error said
//! once and naming the file, the exit codes, messages that name a wrong kind of input, `-` for
//! stdin, host names in `--listen`, where the URL is printed, `--version`, completions, man pages,
//! `serve --config`, and logs without colour or storage noise off a terminal.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use common::{riptide, s, scratch, stderr, write, BIN};
use riptide_firehose::corpus::{split_frames, write_frames};

fn capture() -> Option<PathBuf> {
    common::capture_dir()
}

/// How often `needle` occurs in `hay`.
fn count(hay: &str, needle: &str) -> usize {
    hay.matches(needle).count()
}

/// `riptide args` with `input` on its stdin.
fn riptide_stdin(args: &[&str], input: &[u8]) -> Output {
    let mut child = Command::new(BIN)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let input = input.to_vec();
    let feeder = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let out = child.wait_with_output().unwrap();
    feeder.join().unwrap();
    out
}

#[test]
fn a_missing_file_is_one_message_naming_it() {
    let tmp = scratch();
    let missing = tmp.path().join("no-such-file.bin");
    let m = s(&missing);
    let docs = tmp.path().join("no-such-docs.json");
    let corpus = write(&tmp, "empty-corpus.bin", &write_frames(std::iter::empty()));
    for args in [
        vec!["decode", m],
        vec!["jetstream", m],
        vec!["repo", "verify", m],
        vec!["repo", "ls", m],
        vec!["verify", s(&corpus), "--did-docs", s(&docs)],
        vec!["relay", "--replay", m, "--listen", "127.0.0.1:0"],
    ] {
        let out = riptide(&args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: one line: {err}");
        let name = if args[0] == "verify" {
            "no-such-docs.json"
        } else {
            "no-such-file.bin"
        };
        assert_eq!(count(&err, name), 1, "{args:?}: names the file once: {err}");
        assert_eq!(
            count(&err, "os error 2"),
            1,
            "{args:?}: the cause once: {err}"
        );
    }
}

#[test]
fn a_truncated_corpus_reports_its_good_frames_and_counts_the_tail() {
    let Some(cap) = capture() else { return };
    let bytes = std::fs::read(cap.join("firehose-frames.bin")).unwrap();
    let frames = split_frames(&bytes).unwrap();
    // Cut in the middle of frame 100: frames 0..100 are whole, 50 declared frames are missing.
    let cut = frames[100].offset + frames[100].bytes.len() / 2;
    let tmp = scratch();
    let path = write(&tmp, "truncated.bin", &bytes[..cut]);
    let out = riptide(&["decode", s(&path)]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let text = String::from_utf8(out.stdout.clone()).unwrap();
    assert!(text.contains("frames:  150 ("), "{text}");
    assert!(text.contains(", 50 failed"), "{text}");
    assert!(text.contains("truncated-file 50"), "{text}");
    let unread = cut - (frames[100].offset - 4);
    assert!(text.contains(&format!("unread:  {unread} bytes")), "{text}");
    // The 100 good frames are decoded and counted by kind.
    let commits = frames[..100]
        .iter()
        .filter(|f| {
            let mut dec = riptide_firehose::FrameDecoder::new();
            let kind = dec.decode(f.bytes).unwrap().body().kind();
            kind == "commit"
        })
        .count();
    assert!(text.contains(&format!("commit    {commits}")), "{text}");
    let err = stderr(&out);
    assert_eq!(count(&err, "truncated.bin"), 1, "{err}");
    assert!(err.contains("50 declared frame(s) missing"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}

/// `frame I at byte F: … (frame byte N)` → (I, F, N) for frame `index`.
fn offsets(stderr: &str, index: usize) -> (usize, usize) {
    let prefix = format!("frame {index} at byte ");
    let line = stderr
        .lines()
        .find(|l| l.starts_with(&prefix))
        .unwrap_or_else(|| panic!("no {prefix:?} in {stderr}"));
    let at: usize = line[prefix.len()..]
        .split(':')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let n: usize = line
        .rsplit_once("(frame byte ")
        .unwrap_or_else(|| panic!("no frame byte in {line}"))
        .1
        .trim_end_matches(')')
        .parse()
        .unwrap();
    (at, n)
}

#[test]
fn decode_and_verify_report_the_same_offsets_for_the_same_byte() {
    let Some(cap) = capture() else { return };
    let bytes = std::fs::read(cap.join("firehose-frames.bin")).unwrap();
    let frames = split_frames(&bytes).unwrap();
    let mut owned: Vec<Vec<u8>> = frames.iter().take(10).map(|f| f.bytes.to_vec()).collect();
    common::flip_in_last_block(&mut owned[3]);
    let tmp = scratch();
    let path = write(
        &tmp,
        "tampered.bin",
        &write_frames(owned.iter().map(Vec::as_slice)),
    );
    let decoded = riptide(&["decode", s(&path)]);
    assert_eq!(decoded.status.code(), Some(1));
    let docs = cap.join("did_docs.json");
    let verified = riptide(&["verify", s(&path), "--did-docs", s(&docs)]);
    assert_eq!(verified.status.code(), Some(1));
    let (d_at, d_n) = offsets(&stderr(&decoded), 3);
    let (v_at, v_n) = offsets(&stderr(&verified), 3);
    assert_eq!((d_at, d_n), (v_at, v_n));
    // F is where frame 3's bytes start in the file: 4 (count) + 3 length prefixes + frames 0..3
    // + frame 3's own length prefix.
    let start = 4 + owned[..3].iter().map(|f| 4 + f.len()).sum::<usize>() + 4;
    assert_eq!(d_at, start);
    assert!(d_n > 0 && d_n < owned[3].len());
}

#[test]
fn repo_verify_json_has_the_same_fields_on_success_and_failure() {
    let Some(cap) = capture() else { return };
    let car = cap.join("repo.car");
    let json = |extra: &[&str]| -> (Option<i32>, serde_json::Value) {
        let out = riptide(&[&["repo", "verify", s(&car), "--json"], extra].concat());
        let v =
            serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", stderr(&out)));
        (out.status.code(), v)
    };
    // Another account's key from the capture's documents: a wrong key.
    let docs: serde_json::Value =
        serde_json::from_slice(&std::fs::read(cap.join("did_docs.json")).unwrap()).unwrap();
    let (_, doc) = docs.as_object().unwrap().iter().next().unwrap();
    let vm = doc["verificationMethod"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["id"].as_str().unwrap().ends_with("#atproto"))
        .unwrap();
    let wrong = format!("did:key:{}", vm["publicKeyMultibase"].as_str().unwrap());

    let (code, ok) = json(&[]);
    assert_eq!(code, Some(0));
    assert_eq!(ok["verdict"], "ok");
    let (code, bad) = json(&["--key", &wrong]);
    assert_eq!(code, Some(1));
    assert_eq!(bad["verdict"], "bad-signature");
    let keys = |v: &serde_json::Value| {
        let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
        k.sort();
        k
    };
    assert_eq!(keys(&ok), keys(&bad));
    assert_eq!(keys(&ok["timings_ms"]), keys(&bad["timings_ms"]));
    assert_eq!(bad["did"], ok["did"]);
    assert!(bad["did"].as_str().unwrap().starts_with("did:plc:"));
    assert_eq!(bad["signature_checked"], true, "checked, and it failed");
    assert_eq!(ok["signature_checked"], false, "no key given");
    assert_eq!(bad["blocks"], ok["blocks"]);
    assert!(bad["timings_ms"]["car"].as_f64().unwrap() > 0.0);
    assert!(bad["timings_ms"]["signature"].as_f64().unwrap() > 0.0);
    assert_eq!(bad["timings_ms"]["walk"], 0.0, "the walk never ran");
}

#[test]
fn a_wrong_kind_of_input_is_named() {
    let Some(cap) = capture() else { return };
    let car = cap.join("repo.car");
    let frames = cap.join("firehose-frames.bin");
    let docs = cap.join("did_docs.json");

    let out = riptide(&["decode", s(&car)]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert_eq!(count(&err, "this looks like a CAR file"), 1, "{err}");
    assert!(err.contains("not a frame corpus"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");

    for sub in ["verify", "ls", "inspect"] {
        let out = riptide(&["repo", sub, s(&frames)]);
        assert_eq!(out.status.code(), Some(1), "{sub}");
        let err = stderr(&out);
        assert_eq!(
            count(&err, "this looks like a frame corpus, not a CAR file"),
            1,
            "{err}"
        );
    }

    let out = riptide(&["jetstream", s(&docs)]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("this looks like JSON, not a frame corpus"),
        "{}",
        stderr(&out)
    );

    // A frame corpus where the DID documents go.
    let out = riptide(&["verify", s(&frames), "--did-docs", s(&frames)]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(err.contains("not a DID documents file"), "{err}");
    assert!(err.contains("this looks like a frame corpus"), "{err}");
}

#[test]
fn a_dash_reads_stdin() {
    let Some(cap) = capture() else { return };
    let frames = std::fs::read(cap.join("firehose-frames.bin")).unwrap();
    let from_file = riptide(&["decode", s(&cap.join("firehose-frames.bin"))]);
    let from_stdin = riptide_stdin(&["decode", "-"], &frames);
    assert!(from_stdin.status.success(), "{}", stderr(&from_stdin));
    assert_eq!(from_stdin.stdout, from_file.stdout);
    assert!(String::from_utf8_lossy(&from_stdin.stdout).contains("frames:  150"));

    let car = std::fs::read(cap.join("repo.car")).unwrap();
    let out = riptide_stdin(&["repo", "inspect", "-", "--json"], &car);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["did"].as_str().unwrap().starts_with("did:plc:"));

    // DID documents from stdin.
    let docs = std::fs::read(cap.join("did_docs.json")).unwrap();
    let out = riptide_stdin(
        &[
            "verify",
            s(&cap.join("firehose-frames.bin")),
            "--did-docs",
            "-",
        ],
        &docs,
    );
    assert!(out.status.success(), "{}", stderr(&out));

    // An empty stdin names stdin.
    let out = riptide_stdin(&["decode", "-"], b"");
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("stdin: the file is empty"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn listen_takes_a_host_name_and_servers_print_their_url_on_stdout() {
    let Some(cap) = capture() else { return };
    let frames = cap.join("firehose-frames.bin");
    let (_relay, url) = common::spawn_printing_url(
        Command::new(BIN)
            .args(["relay", "--replay", s(&frames), "--listen", "localhost:0"])
            .stderr(Stdio::null()),
    );
    assert!(url.starts_with("ws://"), "{url}");
    assert!(
        !url.ends_with(":0/xrpc/com.atproto.sync.subscribeRepos"),
        "a port was chosen: {url}"
    );

    // serve: the URL is the first stdout line, as for relay and sim (spawn_serve reads stdout).
    let data = scratch();
    let (_serve, addr) = common::spawn_serve(
        Command::new(BIN)
            .args([
                "serve",
                "--listen",
                "localhost:0",
                "--ingest-file",
                s(&frames),
            ])
            .arg("--did-docs")
            .arg(cap.join("did_docs.json"))
            .arg("--data")
            .arg(data.path())
            .stderr(Stdio::null()),
    );
    assert!(!addr.ends_with(":0"), "{addr}");
    assert!(common::metrics(&addr).contains("riptide_subscribers"));

    let out = riptide(&["relay", "--replay", s(&frames), "--listen", "localhost"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("has no port"), "{}", stderr(&out));
}

#[test]
fn version_names_the_commit() {
    let out = riptide(&["--version"]);
    assert!(out.status.success());
    let v = String::from_utf8(out.stdout).unwrap();
    assert!(v.starts_with("riptide "), "{v}");
    let commit = v
        .split("(commit ")
        .nth(1)
        .unwrap_or_else(|| panic!("{v}"))
        .trim()
        .trim_end_matches(')');
    // A hash when built from a git checkout, `unknown` otherwise; never empty.
    assert!(
        commit == "unknown" || (commit.len() >= 7 && commit.chars().all(|c| c.is_ascii_hexdigit())),
        "{v}"
    );
}

#[test]
fn completions_and_man_pages_come_from_the_flags() {
    for shell in ["bash", "zsh", "fish"] {
        let out = riptide(&["completions", shell]);
        assert!(out.status.success(), "{shell}");
        let text = String::from_utf8(out.stdout).unwrap();
        for word in ["riptide", "serve", "zstd-dictionary", "verify-handle"] {
            assert!(text.contains(word), "{shell}: {word}");
        }
    }
    let out = riptide(&["completions", "tcsh"]);
    assert_eq!(out.status.code(), Some(2));

    let out = riptide(&["man"]);
    assert!(out.status.success());
    let page = String::from_utf8(out.stdout).unwrap();
    assert!(
        page.starts_with(".ie") || page.contains(".TH riptide"),
        "{}",
        &page[..200]
    );
    assert!(page.contains("serve"));

    let dir = scratch();
    let out = riptide(&["man", "--out-dir", s(dir.path())]);
    assert!(out.status.success(), "{}", stderr(&out));
    let serve = std::fs::read_to_string(dir.path().join("riptide-serve.1")).unwrap();
    assert!(serve.contains("upstream\\-cursor") || serve.contains("upstream-cursor"));
}

/// Writes a config file and returns its path.
fn config(dir: &tempfile::TempDir, text: &str) -> PathBuf {
    write(dir, "riptide.toml", text.as_bytes())
}

#[test]
fn serve_config_file_with_flags_overriding_it() {
    let Some(cap) = capture() else { return };
    let tmp = scratch();
    let data = tmp.path().join("data");
    let log = tmp.path().join("stderr.log");
    // Every kind of setting: a string, a path, a number, a list, a boolean; `listen` names a port
    // nothing could bind twice, and the command line's `--listen` must win over it.
    let cfg = config(
        &tmp,
        &format!(
            "listen = \"127.0.0.1:1\"\ndata = {:?}\ningest-file = {:?}\ndid-docs = {:?}\n\
             workers = 1\nretention = \"2h\"\nupstream = [\"ws://127.0.0.1:9\"]\nno-verify = false\n",
            data,
            cap.join("firehose-frames.bin"),
            cap.join("did_docs.json"),
        ),
    );
    let (_serve, addr) = common::spawn_serve(
        Command::new(BIN)
            .args(["serve", "--config", s(&cfg), "--listen", "127.0.0.1:0"])
            .env_remove("RUST_LOG")
            .stderr(std::fs::File::create(&log).unwrap()),
    );
    // The file's ingest source and data directory were used.
    common::wait_for(&addr, "riptide_events_stored_total", 152.0);
    assert!(
        std::fs::read_dir(&data).unwrap().next().is_some(),
        "the store is in the file's data directory"
    );
    // Logs off a terminal: no colour codes, and no storage start-up lines at the default level.
    let logs = std::fs::read_to_string(&log).unwrap();
    assert!(logs.contains("INFO"), "{logs}");
    assert!(
        !logs.contains('\u{1b}'),
        "colour codes off a terminal: {logs:?}"
    );
    assert!(!logs.contains("fjall"), "storage noise: {logs}");

    // Unknown keys, wrong types and unreadable files are errors naming the file.
    let bad = config(&tmp, "listn = \"127.0.0.1:0\"\n");
    let out = riptide(&["serve", "--config", s(&bad)]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(
        err.contains("unknown setting `listn`") && err.contains("riptide.toml"),
        "{err}"
    );
    assert!(err.contains("listen"), "lists the settings: {err}");
    let bad = config(&tmp, "workers = \"many\"\n");
    let out = riptide(&["serve", "--config", s(&bad)]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(
        err.contains("many") && err.contains("riptide.toml"),
        "{err}"
    );
    let bad = config(&tmp, "no-verify = \"yes\"\n");
    let out = riptide(&["serve", "--config", s(&bad)]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("`no-verify` must be true or false"),
        "{}",
        stderr(&out)
    );
    let out = riptide(&["serve", "--config", s(&tmp.path().join("none.toml"))]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(count(&stderr(&out), "none.toml"), 1, "{}", stderr(&out));
}

/// The long flags `riptide serve --help` lists.
fn serve_flags() -> Vec<String> {
    let out = riptide(&["serve", "--help"]);
    let help = String::from_utf8(out.stdout).unwrap();
    let mut flags: Vec<String> = help
        .lines()
        .filter_map(|l| {
            let l = l.trim_start();
            let l = l
                .strip_prefix("-v, ")
                .or_else(|| l.strip_prefix("-q, "))
                .unwrap_or(l);
            l.strip_prefix("--")
                .map(|r| r.split([' ', ',', '=', '.']).next().unwrap().to_owned())
        })
        .filter(|f| {
            !matches!(
                f.as_str(),
                "help" | "version" | "config" | "verbose" | "quiet"
            )
        })
        .collect();
    flags.sort();
    flags.dedup();
    flags
}

#[test]
fn the_example_config_covers_every_serve_flag_and_parses() {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/riptide.toml");
    let text = std::fs::read_to_string(&example).unwrap();
    let flags = serve_flags();
    assert!(flags.len() >= 10, "{flags:?}");
    // A key is documented when it is set or shown commented out (`# key = …`).
    for f in &flags {
        let documented = text.lines().any(|l| {
            let l = l.trim_start().trim_start_matches('#').trim_start();
            l.strip_prefix(f.as_str())
                .is_some_and(|r| r.trim_start().starts_with('='))
        });
        assert!(
            documented,
            "deploy/riptide.toml does not mention `{f}`: add it (set, or commented out with its \
             default) so the example stays equivalent to every serve flag"
        );
    }
    // Every key it sets is accepted: `riptide serve --config` with a nonexistent dictionary
    // fails on the dictionary, not on the file's keys.
    let tmp = scratch();
    let adjusted = text.replace("/var/lib/riptide", s(tmp.path()));
    let cfg = config(&tmp, &adjusted);
    let out = riptide(&[
        "serve",
        "--config",
        s(&cfg),
        "--zstd-dictionary",
        s(&tmp.path().join("no-dictionary.zdict")),
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(err.contains("no-dictionary.zdict"), "{err}");
}

/// Issue 39: every `serve` flag is also `RIPTIDE_<FLAG>`, shown in `--help`; the command line
/// wins over the environment, and the environment over a `--config` file.
#[test]
fn serve_flags_are_read_from_riptide_environment_variables() {
    let out = riptide(&["serve", "--help"]);
    let help = String::from_utf8(out.stdout).unwrap();
    let flags = serve_flags();
    assert!(flags.len() >= 10, "{flags:?}");
    for f in flags.iter().map(String::as_str).chain(["config"]) {
        let var = format!("RIPTIDE_{}", f.to_uppercase().replace('-', "_"));
        assert!(help.contains(&format!("[env: {var}=")), "--{f}: {help}");
    }
    let Some(cap) = capture() else { return };
    let tmp = scratch();
    let data = tmp.path().join("from-env");
    let file_data = tmp.path().join("from-file");
    let cfg = config(&tmp, &format!("data = {file_data:?}\n"));
    // A port held here: were the environment's `--listen` taken over the command line's, the
    // server could not start.
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    // No key source and a PLC that refuses: only `RIPTIDE_NO_VERIFY=1` lets every frame in.
    let refused = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let plc = format!("http://{}", refused.local_addr().unwrap());
    drop(refused);
    let (_serve, addr) = common::spawn_serve(
        Command::new(BIN)
            .args(["serve", "--listen", "127.0.0.1:0"])
            .env("RIPTIDE_CONFIG", &cfg)
            .env("RIPTIDE_DATA", &data)
            .env("RIPTIDE_LISTEN", held.local_addr().unwrap().to_string())
            .env("RIPTIDE_INGEST_FILE", cap.join("firehose-frames.bin"))
            .env("RIPTIDE_PLC_URL", &plc)
            .env("RIPTIDE_NO_VERIFY", "1")
            .env("RUST_LOG", "warn"),
    );
    assert_ne!(addr, held.local_addr().unwrap().to_string());
    common::wait_for(&addr, "riptide_events_stored_total", 152.0);
    assert!(
        data.join("riptide.lock").exists(),
        "the store is in RIPTIDE_DATA's directory"
    );
    assert!(
        !file_data.exists(),
        "the config file's data lost to RIPTIDE_DATA"
    );
    // A value the flag's parser refuses is refused from the environment too, naming it.
    let out = Command::new(BIN)
        .args(["serve"])
        .env("RIPTIDE_MAX_CONNECTIONS", "0")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(
        err.contains("refuse every connection") && err.contains("--max-connections"),
        "{err}"
    );
}

/// `riptide FLAGS serve` ingesting the capture (verified, with its documents) into `dir/data`,
/// at the default log level, its stderr written to `log`; the caller may add `serve` flags.
fn capture_serve(cap: &Path, dir: &Path, flags: &[&str], log: &Path) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.args(flags)
        .args(["serve", "--listen", "127.0.0.1:0", "--data"])
        .arg(dir.join("data"))
        .arg("--ingest-file")
        .arg(cap.join("firehose-frames.bin"))
        .arg("--did-docs")
        .arg(cap.join("did_docs.json"))
        .env_remove("RUST_LOG")
        .stderr(std::fs::File::create(log).unwrap());
    cmd
}

/// `riptide serve` on the capture with `flags`, killed once it printed its URL; its stderr.
fn serve_stderr(cap: &Path, flags: &[&str]) -> String {
    let tmp = scratch();
    let log = tmp.path().join("stderr.log");
    let (server, _) = common::spawn_serve(&mut capture_serve(cap, tmp.path(), flags, &log));
    server.kill();
    std::fs::read_to_string(&log).unwrap()
}

/// Issue 39: `--log-format json` (for log shippers) writes one JSON object per line, with the
/// event's fields beside `timestamp`, `level`, `target` and `message`; the error a command ends
/// with is such a line too.
#[test]
fn json_logs_are_one_object_per_line_with_the_fields() {
    let Some(cap) = capture() else { return };
    let logs = serve_stderr(&cap, &["--log-format", "json"]);
    let lines: Vec<serde_json::Value> = logs
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l:?}")))
        .collect();
    let find = |start: &str| {
        lines
            .iter()
            .find(|v| v["message"].as_str().is_some_and(|m| m.starts_with(start)))
            .unwrap_or_else(|| panic!("no {start:?} line in {logs}"))
    };
    let serving = find("serving ws://127.0.0.1:");
    assert_eq!(serving["level"], "INFO");
    assert_eq!(serving["target"], "riptide::cmd::serve");
    assert!(
        serving["max_connections"].as_u64().is_some_and(|n| n > 0),
        "{serving}"
    );
    assert!(
        serving["per_ip"].as_u64().is_some_and(|n| n > 0),
        "{serving}"
    );
    let t = serving["timestamp"].as_str().unwrap();
    assert!(t.starts_with("20") && t.ends_with('Z'), "{t}");
    let store = find("store open");
    assert_eq!(store["next_seq"], 1);
    assert!(store["data"].as_str().unwrap().ends_with("data"), "{store}");
    assert!(!logs.contains('\u{1b}'), "no colour in JSON: {logs:?}");
    // The last error, as an object (RIPTIDE_LOG_FORMAT as well as the flag).
    let out = Command::new(BIN)
        .args(["decode", "no-such-file.bin"])
        .env("RIPTIDE_LOG_FORMAT", "json")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    let v: serde_json::Value = serde_json::from_str(err.trim())
        .unwrap_or_else(|e| panic!("not one JSON line ({e}): {err:?}"));
    assert_eq!(v["level"], "ERROR");
    assert!(
        v["message"].as_str().unwrap().contains("no-such-file.bin"),
        "{v}"
    );
}

/// The status lines of a JSON log file so far.
fn status_lines(log: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(log)
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["message"] == "status" && v["target"] == "riptide_serve::status")
        .collect()
}

/// Issue 39: `serve` says a status line at INFO every `--status-interval` (a minute by
/// default), so a quiet journal means a quiet network: the events of the lines add up to what
/// was stored, the refusals to the non-ok verdicts of `/metrics`, and the last says the upstream
/// seq `/metrics` says.
#[test]
fn serve_says_a_status_line_with_what_changed_since_the_last() {
    let Some(cap) = capture() else { return };
    let tmp = scratch();
    let log = tmp.path().join("stderr.log");
    let (_server, addr) = common::spawn_serve(
        capture_serve(&cap, tmp.path(), &["--log-format", "json"], &log)
            .args(["--status-interval", "1s"]),
    );
    common::wait_for(&addr, "riptide_events_stored_total", 152.0);
    let stored = common::metric(&addr, "riptide_events_stored_total") as u64;
    // Every event stored is in one line's `events`; wait for the line that completes them.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let lines = loop {
        let lines = status_lines(&log);
        let said: u64 = lines.iter().map(|v| v["events"].as_u64().unwrap()).sum();
        assert!(said <= stored, "{said} > {stored}: {lines:?}");
        if said == stored {
            break lines;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{said} of {stored} events said: {lines:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    let metrics = common::metrics(&addr);
    let not_ok: u64 = metrics
        .lines()
        .filter(|l| l.starts_with("riptide_verdicts_total{") && !l.contains("\"ok\""))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum();
    let refused: u64 = lines.iter().map(|v| v["refused"].as_u64().unwrap()).sum();
    assert_eq!(refused, not_ok, "{lines:?}\n{metrics}");
    let last = lines.last().unwrap();
    assert_eq!(last["level"], "INFO");
    assert_eq!(
        last["upstream_seq"].as_u64().unwrap(),
        common::metric(&addr, "riptide_upstream_seq") as u64
    );
    assert_eq!(last["subscribers_v1"], 0);
    assert_eq!(last["subscribers_v2"], 0);
    assert!(last["store_bytes"].as_u64().is_some(), "{last}");
    assert!(last["events_per_s"].as_f64().is_some(), "{last}");
    for field in [
        "upstream_lag_s",
        "duplicates",
        "upstream_dropped",
        "ops_dropped",
        "subscribers_dropped",
        "connections_refused",
    ] {
        assert!(last[field].is_number(), "{field}: {last}");
    }
}

#[test]
fn verbose_and_quiet_move_the_log_level_and_storage_lines_are_debug() {
    let Some(cap) = capture() else { return };
    let default = serve_stderr(&cap, &[]);
    assert!(default.contains(" INFO "), "{default}");
    assert!(!default.contains("fjall"), "{default}");
    let quiet = serve_stderr(&cap, &["-q"]);
    assert!(!quiet.contains(" INFO "), "{quiet}");
    let verbose = serve_stderr(&cap, &["-v"]);
    assert!(verbose.contains("DEBUG"), "{verbose}");
    assert!(
        verbose.contains("fjall"),
        "the storage library from debug on: {verbose}"
    );
}

#[test]
fn colour_only_on_a_terminal_and_never_with_no_color() {
    // `script` (util-linux) gives the command a terminal.
    if Command::new("script").arg("--version").output().is_err() {
        // Said where cargo test shows it, not only on failure.
        let _ = writeln!(
            std::io::stderr(),
            "note: `script` (util-linux) is not installed: colour on a terminal not tested"
        );
        return;
    }
    let tmp = scratch();
    // A command that logs (the storage library at debug, with -vv) and ends by itself (an empty
    // store has nothing to train on).
    let on_terminal = |no_color: bool, dir: &str| -> String {
        std::fs::create_dir(tmp.path().join(dir)).unwrap();
        let line = format!(
            "{BIN} -vv dict train --data {} -o {}",
            s(&tmp.path().join(dir)),
            s(&tmp.path().join(format!("{dir}.zdict"))),
        );
        let mut cmd = Command::new("script");
        cmd.args(["-qec", &line, "/dev/null"])
            .env_remove("RUST_LOG");
        if no_color {
            cmd.env("NO_COLOR", "1");
        } else {
            cmd.env_remove("NO_COLOR");
        }
        String::from_utf8_lossy(&cmd.output().unwrap().stdout).into_owned()
    };
    let coloured = on_terminal(false, "a");
    assert!(coloured.contains("fjall"), "{coloured}");
    assert!(
        coloured.contains("\u{1b}["),
        "colour on a terminal: {coloured:?}"
    );
    let plain = on_terminal(true, "b");
    assert!(plain.contains("fjall"), "{plain}");
    assert!(!plain.contains('\u{1b}'), "NO_COLOR: {plain:?}");
    // Off a terminal: never.
    std::fs::create_dir(tmp.path().join("c")).unwrap();
    let out = Command::new(BIN)
        .args(["-vv", "dict", "train", "--data"])
        .arg(tmp.path().join("c"))
        .arg("-o")
        .arg(tmp.path().join("c.zdict"))
        .env_remove("RUST_LOG")
        .env_remove("NO_COLOR")
        .output()
        .unwrap();
    let err = stderr(&out);
    assert!(err.contains("fjall") && !err.contains('\u{1b}'), "{err:?}");
}

#[test]
fn a_file_that_is_not_a_dictionary_is_named_before_serving() {
    let tmp = scratch();
    let readme = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md");
    let out = Command::new(BIN)
        .args(["serve", "--no-verify", "--listen", "127.0.0.1:0", "--data"])
        .arg(tmp.path().join("data"))
        .arg("--zstd-dictionary")
        .arg(&readme)
        .arg("--ingest-file")
        .arg(&readme)
        .stdout(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert_eq!(count(&err, "README.md"), 1, "{err}");
    assert!(err.contains("not a zstd dictionary"), "{err}");
    assert!(err.contains("this looks like a text file"), "{err}");
}

#[test]
fn dict_train_on_a_missing_directory_creates_nothing() {
    let tmp = scratch();
    let missing = tmp.path().join("no-data");
    let out = riptide(&[
        "dict",
        "train",
        "--data",
        s(&missing),
        "-o",
        s(&tmp.path().join("d")),
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(err.contains("no-data: no such directory"), "{err}");
    assert!(!missing.exists(), "a mistyped --data made a store");
}
