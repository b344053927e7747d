//! goat's everyday commands as a user runs them against `riptide sim`: `resolve`, `repo export`
//! and `get at://…`, with what each must refuse (an unknown handle or DID, a missing record, a
//! repository or proof signed with another key than the document's). Oracles: the fixture's own
//! export and `riptide repo ls`'s listing of it; a record's JSON re-encoded hashes to the CID
//! the listing names.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::process::Output;

use common::{riptide, s, start_sim, stderr};
use riptide_cbor::{CidBuf, DAG_CBOR};
use riptide_sim::fixture;
use serde_json::Value;

/// A network directory with the accounts of [`Network`].
fn network(dir: &Path) -> Network {
    std::fs::create_dir(dir.join("repos")).unwrap();
    let alice = fixture::account(1, "alice.test", 40);
    let wrong = fixture::account(3, "wrongkey.test", 5);
    let wrong_doc = fixture::doc(
        &wrong.did,
        "wrongkey.test",
        &fixture::key_for(9).public_key(),
        "https://x.invalid",
    );
    let bob = fixture::account(5, "bob.test", 3);
    let impostor = fixture::did_for(7);
    let impostor_doc = fixture::doc(
        &impostor,
        "bob.test",
        &fixture::key_for(7).public_key(),
        "https://x.invalid",
    );
    let docs = serde_json::json!({
        alice.did.clone(): alice.doc,
        wrong.did.clone(): wrong_doc,
        bob.did.clone(): bob.doc,
        impostor.clone(): impostor_doc,
    });
    std::fs::write(dir.join("did_docs.json"), docs.to_string()).unwrap();
    for a in [&alice, &wrong, &bob] {
        std::fs::write(dir.join("repos").join(format!("{}.car", a.did)), &a.car).unwrap();
    }
    Network {
        alice,
        wrong,
        bob,
        impostor,
    }
}

/// The sim's accounts.
struct Network {
    /// A valid account.
    alice: fixture::FixtureAccount,
    /// Its document names another key than the one that signed its repository.
    wrong: fixture::FixtureAccount,
    /// A valid account whose handle another document claims too.
    bob: fixture::FixtureAccount,
    /// That other document's DID.
    impostor: String,
}

/// `riptide ARGS… --plc-url BASE --handle-resolver BASE`.
fn run(args: &[&str], base: &str) -> Output {
    let mut all = args.to_vec();
    all.extend(["--plc-url", base, "--handle-resolver", base]);
    riptide(&all)
}

fn json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", stderr(out)))
}

/// A failure: exit 1, nothing on stdout, the verdict said once on stderr.
fn assert_fails(out: &Output, verdict: &str) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(err.matches(verdict).count(), 1, "{verdict} once in {err:?}");
    assert_eq!(err.lines().count(), 1, "{err:?}");
}

/// `riptide repo ls FILE`: `(collection/rkey, CID)` per record.
fn listing(car: &Path) -> Vec<(String, String)> {
    let out = riptide(&["repo", "ls", s(car)]);
    assert!(out.status.success(), "{}", stderr(&out));
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let (k, c) = l.split_once('\t').unwrap();
            (k.to_owned(), c.to_owned())
        })
        .collect()
}

#[test]
fn resolve_export_and_get_against_the_sim() {
    let tmp = common::scratch();
    let Network {
        alice,
        wrong,
        bob,
        impostor,
    } = network(tmp.path());
    let (_sim, base) = start_sim(tmp.path());
    let alice_key = alice.key.public_key().to_did_key();

    // resolve: a handle, checked both ways.
    let out = run(&["resolve", "alice.test", "--json"], &base);
    assert!(out.status.success(), "{}", stderr(&out));
    let v = json(&out);
    assert_eq!(v["did"], alice.did.as_str());
    assert_eq!(v["handle"], "alice.test");
    assert_eq!(v["handle_verified"], true);
    assert_eq!(v["handle_error"], Value::Null);
    assert_eq!(v["pds"], base.as_str());
    assert_eq!(v["signing_key"], alice_key.as_str());
    assert_eq!(v["document"]["id"], alice.did.as_str());
    assert_eq!(v["document"]["alsoKnownAs"][0], "at://alice.test");
    // A DID: its document, and the handle it claims checked back.
    let out = run(&["resolve", &alice.did], &base);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        text,
        format!(
            "did: {}\nhandle: alice.test (verified)\npds: {base}\nsigning key: {alice_key}\n",
            alice.did
        )
    );
    // A DID whose document claims a handle that names another DID: reported, not an error.
    // (`bob.test` is claimed by two documents; the sim's handle resolver names one of them.)
    let (mut verified, mut refused) = (0, 0);
    for did in [&bob.did, &impostor] {
        let out = run(&["resolve", did, "--json"], &base);
        assert!(out.status.success(), "{}", stderr(&out));
        let v = json(&out);
        assert_eq!(v["handle"], "bob.test");
        if v["handle_verified"] == true {
            verified += 1;
        } else {
            refused += 1;
            let why = v["handle_error"].as_str().unwrap();
            assert!(why.contains(&format!("not to {did}")), "{why}");
        }
    }
    assert_eq!((verified, refused), (1, 1));
    // Unknown handle, unknown DID, not a handle at all.
    assert_fails(&run(&["resolve", "nobody.test"], &base), "handle-not-found");
    assert_fails(
        &run(
            &["resolve", "did:plc:aaaaaaaaaaaaaaaaaaaaaaaa", "--json"],
            &base,
        ),
        "did-not-found",
    );
    assert_fails(
        &run(&["resolve", "not a handle"], &base),
        "handle-not-found",
    );

    // repo export: the account's export, verified, renamed into place.
    let car = tmp.path().join("out").join("alice.car");
    std::fs::create_dir(tmp.path().join("out")).unwrap();
    let out = run(
        &["repo", "export", "alice.test", "-o", s(&car), "--json"],
        &base,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let v = json(&out);
    assert_eq!(std::fs::read(&car).unwrap(), alice.car.as_ref());
    assert_eq!(v["did"], alice.did.as_str());
    assert_eq!(v["handle"], "alice.test");
    assert_eq!(v["records"], 40);
    assert_eq!(v["bytes"], alice.car.len());
    let records = listing(&car);
    assert_eq!(records.len(), 40);
    // By DID, to stdout: the same bytes.
    let out = run(&["repo", "export", &alice.did, "-o", "-"], &base);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(out.stdout, alice.car.as_ref());
    // A repository signed with another key than the document's: refused, nothing written, no
    // temporary file left behind.
    let bad = tmp.path().join("out").join("wrong.car");
    assert_fails(
        &run(&["repo", "export", "wrongkey.test", "-o", s(&bad)], &base),
        "bad-signature",
    );
    let left: Vec<_> = std::fs::read_dir(tmp.path().join("out"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(left, ["alice.car"]);
    assert_fails(
        &run(&["repo", "export", "nobody.test", "-o", s(&bad)], &base),
        "handle-not-found",
    );

    // get: every record, by handle and by DID, its proof checked; the JSON re-encoded hashes to
    // the CID `repo ls` lists.
    for (i, (key, cid)) in records.iter().enumerate() {
        let who = if i % 2 == 0 {
            "alice.test"
        } else {
            alice.did.as_str()
        };
        let uri = format!("at://{who}/{key}");
        let out = run(&["get", &uri, "--json"], &base);
        assert!(out.status.success(), "{uri}: {}", stderr(&out));
        let v = json(&out);
        assert_eq!(v["cid"], cid.as_str(), "{uri}");
        assert_eq!(v["uri"], format!("at://{}/{key}", alice.did));
        let mut cbor = Vec::new();
        riptide_cbor::json_to_value(&v["value"])
            .unwrap()
            .encode(&mut cbor);
        assert_eq!(CidBuf::sha256(DAG_CBOR, &cbor).to_string(), *cid, "{uri}");
        if i == 0 {
            // Without --json: the record alone.
            let out = run(&["get", &uri], &base);
            let plain: Value = json(&out);
            assert_eq!(plain, v["value"]);
        }
    }
    let (first, _) = &records[0];
    let collection = first.split('/').next().unwrap();
    assert_fails(
        &run(
            &[
                "get",
                &format!("at://alice.test/{collection}/2222222222222"),
            ],
            &base,
        ),
        "record-not-found",
    );
    // The proof of a record of the wrong-key account: its commit does not verify.
    let wrong_first = {
        let p = tmp.path().join("wrong-src.car");
        std::fs::write(&p, &wrong.car).unwrap();
        listing(&p).remove(0).0
    };
    assert_fails(
        &run(
            &["get", &format!("at://wrongkey.test/{wrong_first}")],
            &base,
        ),
        "bad-signature",
    );
    assert_fails(
        &run(&["get", &format!("at://nobody.test/{wrong_first}")], &base),
        "handle-not-found",
    );
    // Not a record's URI: a usage error (exit 2).
    let out = run(&["get", "at://alice.test/app.bsky.feed.post"], &base);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}

/// A PDS (and PLC directory) on loopback that serves one DID document (`doc_for` its base URL,
/// so that the document can name it as the PDS) and, for every `getRecord`, `proof`:
/// `http://ADDR`.
fn serving_proof(did: &str, doc_for: impl Fn(&str) -> Value, proof: Vec<u8>) -> String {
    use std::io::{Read, Write};
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", l.local_addr().unwrap());
    let doc = doc_for(&base).to_string();
    let doc_path = format!("/{did}");
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { return };
            let mut req = Vec::new();
            let mut buf = [0u8; 1024];
            while !req.ends_with(b"\r\n\r\n") {
                match s.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(k) => req.extend_from_slice(&buf[..k]),
                }
            }
            let head = String::from_utf8_lossy(&req);
            let path = head.split(' ').nth(1).unwrap_or_default().to_owned();
            let (status, body) = if path == doc_path {
                ("200 OK", doc.clone().into_bytes())
            } else if path.starts_with("/xrpc/com.atproto.sync.getRecord?") {
                ("200 OK", proof.clone())
            } else {
                ("404 Not Found", b"no".to_vec())
            };
            // One write: the head and the body together.
            let mut resp = format!(
                "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            )
            .into_bytes();
            resp.extend_from_slice(&body);
            let _ = s.write_all(&resp);
        }
    });
    base
}

/// A PDS whose `getRecord` proof lacks a node of the record's path (the tree's root) or the
/// record itself: the proof does not check, nothing is printed and the verdict says why. The
/// whole proof, from the same server, prints the record.
#[test]
fn get_refuses_a_proof_that_does_not_check() {
    let alice = fixture::account(1, "alice.test", 40);
    let mut reader = riptide_car::CarReader::new();
    let car = reader
        .read(&alice.car, &riptide_car::CarOptions::repository())
        .unwrap();
    let (key, cid) = riptide_repo::list_records(&car).unwrap().remove(17);
    let proof = riptide_repo::record_proof(&car, &key).unwrap().unwrap();
    let mut r = riptide_car::CarReader::new();
    let parsed = r.read(&proof, &riptide_car::CarOptions::default()).unwrap();
    let root = parsed.roots().next().unwrap().to_buf();
    let blocks: Vec<(CidBuf, Vec<u8>)> = parsed
        .blocks()
        .map(|b| (b.cid.to_buf(), b.data.to_vec()))
        .collect();
    let without = |skip: usize| {
        riptide_car::write_car(
            &[root],
            blocks
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != skip)
                .map(|(_, (c, b))| (c.as_cid(), b.as_slice())),
        )
    };
    let uri = format!("at://{}/{key}", alice.did);
    let get = |proof: Vec<u8>| {
        let base = serving_proof(
            &alice.did,
            |pds| fixture::doc(&alice.did, "alice.test", &alice.key.public_key(), pds),
            proof,
        );
        riptide(&["get", &uri, "--json", "--plc-url", &base])
    };
    let out = get(proof.clone());
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(json(&out)["cid"], cid.to_string());
    for (broken, why) in [
        (
            without(1),
            format!("MST node {} is not available", blocks[1].0),
        ),
        (
            without(blocks.len() - 1),
            format!("({cid}) is not in the CAR"),
        ),
    ] {
        let out = get(broken);
        assert_fails(&out, "missing-block");
        assert!(stderr(&out).contains(&why), "{why}: {}", stderr(&out));
    }
}
