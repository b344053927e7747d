//! The simulator's PDS endpoints on the real repository export of the shared corpus, checked
//! against goat's listing of it (an independent implementation): `listRepos` names its rev,
//! `getRepo` returns it byte for byte, `describeRepo` lists the collections goat saw. Plus
//! `/_sim/faults` at run time.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;

use bytes::Bytes;
use riptide_sim::{Faults, Network, Sim};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_repository_served() {
    let Some(dir) = riptide_testdata::corpus() else {
        return;
    };
    let car = std::fs::read(dir.join("jetstream-2026-07/repo.car")).unwrap();
    let expected =
        std::fs::read_to_string(dir.join("jetstream-2026-07/car_expected_commit.txt")).unwrap();
    let field = |name: &str| {
        expected
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().to_owned())
            .unwrap()
    };
    let did = field("DID:");
    let rev = field("Revision:");
    let mut goat_collections: Vec<String> =
        std::fs::read_to_string(dir.join("jetstream-2026-07/car_expected_records.tsv"))
            .unwrap()
            .lines()
            .filter_map(|l| l.split_once('/').map(|(c, _)| c.to_owned()))
            .collect();
    goat_collections.dedup();
    assert!(goat_collections.len() > 1);

    let net = Network::new([], [(did.clone(), Bytes::from(car.clone()))]).unwrap();
    let sim = Sim::spawn(
        net,
        SocketAddr::from(([127, 0, 0, 1], 0)),
        Faults::default(),
    )
    .await
    .unwrap();
    let base = sim.base_url();
    let http = reqwest::Client::new();
    // GET `path` on the sim.
    let get = |path: &str| http.get(format!("{base}{path}")).send();

    let list: serde_json::Value = get("/xrpc/com.atproto.sync.listRepos")
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(list["repos"][0]["did"], did.as_str());
    assert_eq!(list["repos"][0]["rev"], rev.as_str());
    assert!(list["repos"][0]["head"]
        .as_str()
        .unwrap()
        .starts_with("bafyrei"));

    let got = get(&format!("/xrpc/com.atproto.sync.getRepo?did={did}"))
        .await
        .unwrap();
    assert_eq!(got.status(), 200);
    assert_eq!(got.bytes().await.unwrap(), car);

    let desc: serde_json::Value = get(&format!("/xrpc/com.atproto.repo.describeRepo?repo={did}"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let cols: Vec<String> = serde_json::from_value(desc["collections"].clone()).unwrap();
    assert_eq!(cols, goat_collections);

    // Unknown repository: the XRPC error shape.
    let missing = get("/xrpc/com.atproto.sync.getRepo?did=did:plc:nobody")
        .await
        .unwrap();
    assert_eq!(missing.status(), 400);
    let err: serde_json::Value = missing.json().await.unwrap();
    assert_eq!(err["error"], "RepoNotFound");

    // Faults at run time: every request a 503, then off again.
    let set = http
        .post(format!("{base}/_sim/faults"))
        .json(&serde_json::json!({"error_every": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(set.status(), 200);
    let r = get("/xrpc/com.atproto.sync.listRepos").await.unwrap();
    assert_eq!(r.status(), 503);
    http.post(format!("{base}/_sim/faults"))
        .json(&Faults::default())
        .send()
        .await
        .unwrap();
    let r = get("/xrpc/com.atproto.sync.listRepos").await.unwrap();
    assert_eq!(r.status(), 200);
}
