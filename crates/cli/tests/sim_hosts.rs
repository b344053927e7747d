//! `riptide sim --hosts N` as a process: a `riptide gen --repos` network on three hosts with
//! two faulty repositories (and any account the stream deactivated); the manifest file names the hosts and the faults; each host lists
//! its own accounts; `riptide repo verify` (with the document the sim's PLC directory serves)
//! passes on a good repository fetched from its host and fails with the expected error on the
//! repositories the manifest says are broken.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{Read, Write};
use std::process::{Command, Stdio};

use serde_json::Value;

/// `GET url` (http://host:port/path) over a plain connection: status and body bytes.
fn get(url: &str) -> (u16, Vec<u8>) {
    let rest = url.strip_prefix("http://").unwrap();
    let (addr, path) = rest.split_at(rest.find('/').unwrap());
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(common::PATIENCE)).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = String::from_utf8_lossy(&raw[..split]).to_string();
    let code = head[9..12].parse().unwrap();
    assert!(
        !head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked"),
        "{head}"
    );
    (code, raw[split + 4..].to_vec())
}

fn get_json(url: &str) -> Value {
    let (code, body) = get(url);
    assert_eq!(code, 200, "{url}");
    serde_json::from_slice(&body).unwrap()
}

#[test]
fn hosts_manifest_and_repo_verify() {
    let tmp = common::scratch();
    let net = tmp.path().join("net");
    let out = common::riptide(&[
        "gen",
        "--seed",
        "4",
        "--accounts",
        "12",
        "--events",
        "150",
        "--repos",
        "--out",
        common::s(&net),
    ]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let manifest_path = tmp.path().join("manifest.json");
    let (_sim, base) = common::spawn_printing_url(
        Command::new(common::BIN)
            .args(["sim", "--from", common::s(&net), "--listen", "127.0.0.1:0"])
            .args(["--hosts", "3", "--seed", "2"])
            .args(["--repo-faults", "bad-signature=1,cut-at-block=1"])
            .args(["--manifest", common::s(&manifest_path)])
            .stderr(Stdio::inherit()),
    );
    let manifest: Value = serde_json::from_slice(&std::fs::read(&manifest_path).unwrap()).unwrap();
    assert_eq!(manifest["base"], base.as_str());
    assert_eq!(manifest["limits"]["get_repo_per_sec"], 20);
    assert_eq!(manifest["limits"]["list_repos_per_sec"], 10);
    let hosts = manifest["hosts"].as_array().unwrap();
    assert_eq!(hosts.len(), 3);
    assert_eq!(
        hosts
            .iter()
            .map(|h| h["accounts"].as_u64().unwrap())
            .sum::<u64>(),
        12
    );
    let listed = get_json(&format!("{base}/xrpc/com.atproto.sync.listHosts"));
    assert_eq!(listed["hosts"].as_array().unwrap().len(), 3);

    let fault_of = |did: &str| {
        manifest["faults"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["did"] == did)
            .map(|f| f["fault"].as_str().unwrap().to_owned())
    };
    let mut seen = Vec::new();
    for h in hosts {
        let url = h["url"].as_str().unwrap();
        let list = get_json(&format!("{url}/xrpc/com.atproto.sync.listRepos"));
        let repos = list["repos"].as_array().unwrap();
        assert_eq!(repos.len() as u64, h["accounts"].as_u64().unwrap());
        for r in repos {
            let did = r["did"].as_str().unwrap();
            let doc = get_json(&format!("{base}/{did}"));
            assert_eq!(doc["service"][0]["serviceEndpoint"], url);
            let doc_path = tmp.path().join(format!("{did}.json"));
            std::fs::write(&doc_path, serde_json::to_vec(&doc).unwrap()).unwrap();
            let (code, car) = get(&format!("{url}/xrpc/com.atproto.sync.getRepo?did={did}"));
            seen.push(fault_of(did));
            if fault_of(did).as_deref() == Some("deactivated") {
                // Deactivated by the stream (`#account`) before the export: repos.json says so.
                assert_eq!(r["active"], false);
                assert_eq!(code, 400);
                let e: Value = serde_json::from_slice(&car).unwrap();
                assert_eq!(e["error"], "RepoDeactivated");
                continue;
            }
            assert_eq!(code, 200, "{did}: {}", String::from_utf8_lossy(&car));
            let car_path = tmp.path().join(format!("{did}.car"));
            std::fs::write(&car_path, &car).unwrap();
            let v = common::riptide(&[
                "repo",
                "verify",
                common::s(&car_path),
                "--did-doc",
                common::s(&doc_path),
            ]);
            let said = format!(
                "{}{}",
                String::from_utf8_lossy(&v.stdout),
                common::stderr(&v)
            );
            match fault_of(did).as_deref() {
                None => assert!(v.status.success(), "{did}: {said}"),
                Some("bad-signature") => {
                    assert!(!v.status.success(), "{did}: {said}");
                    assert!(said.contains("signature"), "{did}: {said}");
                }
                Some("cut-at-block") => {
                    assert!(!v.status.success(), "{did}: {said}");
                    assert!(said.contains("not in the CAR"), "{did}: {said}");
                }
                Some(other) => panic!("unexpected fault {other}"),
            }
        }
    }
    assert_eq!(seen.len(), 12);
    for f in ["bad-signature", "cut-at-block"] {
        assert_eq!(seen.iter().flatten().filter(|s| *s == f).count(), 1, "{f}");
    }
}

/// Bad host or fault arguments are refused with one clear line, before anything is served.
#[test]
fn bad_arguments_are_refused() {
    let tmp = common::scratch();
    let dir = tmp.path().join("net");
    let out = common::riptide(&[
        "gen",
        "--seed",
        "1",
        "--accounts",
        "3",
        "--events",
        "5",
        "--repos",
        "--out",
        common::s(&dir),
    ]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    for (args, says) in [
        (&["--repo-faults", "nope=1"][..], "unknown fault \"nope\""),
        (&["--host-faults", "offline"][..], "is not KIND=COUNT"),
        (&["--hosts", "0"][..], "--hosts must be at least 1"),
        (
            &["--host-faults", "offline=1"][..],
            "1 host faults asked for, but only 0 can have one",
        ),
        (
            &["--hosts", "2", "--repo-faults", "bad-signature=9"][..],
            "9 repository faults asked for, but only 3 can have one",
        ),
    ] {
        let out = Command::new(common::BIN)
            .args(["sim", "--from", common::s(&dir), "--listen", "127.0.0.1:0"])
            .args(args)
            .output()
            .unwrap();
        let err = common::stderr(&out);
        assert!(!out.status.success(), "{args:?}");
        assert!(out.stdout.is_empty(), "{args:?}: served anyway");
        assert!(err.contains(says), "{args:?}: {err}");
    }
}
