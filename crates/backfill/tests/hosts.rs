//! The crawl against real servers on loopback: a relay's `listHosts` (a minimal server written
//! here, to the lexicon: the simulator has no `listHosts` yet) naming two `riptide-sim` PDS
//! hosts, a banned host and an unreachable one; each host's `listRepos` paged; every account's
//! repository fetched from the PDS its DID document names, verified, written as JSON lines.
//!
//! Oracles: the repositories themselves (`riptide_repo::list_records` of each CAR, the listing
//! `riptide repo ls` prints) and the faults planted: each good account's records arrive exactly
//! once, each faulty one is reported with its reason and none of its records is written, and
//! the banned and unreachable hosts are reported, not skipped in silence.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::Query;
use axum::routing::get;
use axum::Json;
use common::{listing, LOOPBACK};
use riptide_backfill::{
    Collections, Config, Discovery, Fetcher, HostLimits, Hosts, JsonlSink, Progress, State,
};
use riptide_identity::{DidDoc, DidDocs};
use riptide_resolver::{Resolver, ResolverConfig, ResyncConfig, Resyncer, StaticDocs};
use riptide_sim::{fixture, Faults, Network, Sim};

#[derive(serde::Deserialize)]
struct Page {
    limit: Option<usize>,
    cursor: Option<String>,
}

/// A relay that only answers `listHosts`, two hosts a page.
async fn relay(hosts: Vec<serde_json::Value>) -> String {
    let hosts = Arc::new(hosts);
    let app = axum::Router::new().route(
        "/xrpc/com.atproto.sync.listHosts",
        get(move |Query(q): Query<Page>| {
            let hosts = hosts.clone();
            async move {
                let start: usize = q.cursor.and_then(|c| c.parse().ok()).unwrap_or(0);
                let n = q.limit.unwrap_or(200).min(2);
                let page: Vec<_> = hosts.iter().skip(start).take(n).cloned().collect();
                let mut out = serde_json::json!({ "hosts": page });
                if start + n < hosts.len() {
                    out["cursor"] = serde_json::json!((start + n).to_string());
                }
                Json(out)
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind(LOOPBACK).await.unwrap();
    let me = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{me}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_hosts_then_each_hosts_repos_exactly_once_with_faults_reported() {
    // Host A: seven good accounts. Host B: four good ones, one whose block was tampered with
    // (bad_cid), one whose document names another key (bad_signature), one serving another
    // account's repository (wrong_did).
    let a: Vec<_> = (1..=7)
        .map(|i| fixture::account(i, &format!("a{i}.test"), 20 + usize::from(i) * 7))
        .collect();
    let b: Vec<_> = (11..=17)
        .map(|i| fixture::account(i, &format!("b{i}.test"), 10 + usize::from(i)))
        .collect();
    let tampered = &b[4];
    let forged = &b[5];
    let stolen = &b[6];
    let served_b = |x: &fixture::FixtureAccount| -> bytes::Bytes {
        if x.did == tampered.did {
            fixture::tamper_last_block(&x.car).into()
        } else if x.did == stolen.did {
            b[0].car.clone()
        } else {
            x.car.clone()
        }
    };
    let net_a = Network::new([], a.iter().map(|x| (x.did.clone(), x.car.clone()))).unwrap();
    let net_b = Network::new([], b.iter().map(|x| (x.did.clone(), served_b(x)))).unwrap();
    // Host B also rate-limits every fifth request (Retry-After: 1).
    let sim_a = Sim::spawn(net_a, LOOPBACK, Faults::default())
        .await
        .unwrap();
    let sim_b = Sim::spawn(
        net_b,
        LOOPBACK,
        Faults {
            rate_limit_every: 5,
            ..Faults::default()
        },
    )
    .await
    .unwrap();
    let mut docs = DidDocs::new();
    for (x, base) in a
        .iter()
        .map(|x| (x, sim_a.base_url()))
        .chain(b.iter().map(|x| (x, sim_b.base_url())))
    {
        let key = if x.did == forged.did {
            fixture::key_for(99).public_key()
        } else {
            x.key.public_key()
        };
        let doc = fixture::doc(&x.did, &x.handle, &key, &base);
        docs.insert(DidDoc::from_value(&doc).unwrap());
    }
    let host = |s: &riptide_sim::SimHandle| s.addr.to_string();
    let relay = relay(vec![
        serde_json::json!({"hostname": host(&sim_a), "accountCount": 7, "status": "active"}),
        serde_json::json!({"hostname": "banned.example.com", "accountCount": 3, "status": "banned"}),
        serde_json::json!({"hostname": host(&sim_b), "accountCount": 7, "status": "active"}),
        // Nothing listens on port 1.
        serde_json::json!({"hostname": "127.0.0.1:1", "accountCount": 2, "status": "active"}),
    ])
    .await;

    let dir = tempfile::tempdir().unwrap();
    let out_path = dir.path().join("out.jsonl");
    let run = || {
        let resolver = Resolver::new(ResolverConfig {
            did_docs: Some(StaticDocs(Arc::new(docs.clone()))),
            timeout: Duration::from_secs(5),
            ..ResolverConfig::default()
        })
        .unwrap();
        let resync = Resyncer::new(resolver.clone(), ResyncConfig::default());
        let fetcher = Fetcher::new(resolver, resync, Some(relay.clone()), Collections::all());
        let cfg = Config {
            relay: relay.clone(),
            discovery: Discovery::Hosts,
            page: 3,
            backoff: Duration::from_millis(50),
            ..Config::default()
        };
        let state = Arc::new(State::open(&dir.path().join("state")).unwrap());
        let out = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&out_path)
            .unwrap();
        let sink = Box::new(JsonlSink::file(out, "out.jsonl"));
        let hosts = Hosts::new(HostLimits::default(), 16);
        riptide_backfill::run(
            cfg,
            fetcher,
            hosts,
            state,
            sink,
            Arc::new(Progress::default()),
        )
    };
    run().await.unwrap();

    // Every good account's records, exactly once.
    let text = std::fs::read_to_string(&out_path).unwrap();
    let mut got: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let key = format!(
            "{}/{}\t{}",
            v["collection"].as_str().unwrap(),
            v["rkey"].as_str().unwrap(),
            v["cid"].as_str().unwrap()
        );
        assert!(v["record"].is_object(), "{line}");
        got.entry(v["did"].as_str().unwrap().to_owned())
            .or_default()
            .push(key);
    }
    let bad: BTreeSet<&str> = [&tampered.did, &forged.did, &stolen.did]
        .into_iter()
        .map(String::as_str)
        .collect();
    let good: Vec<_> = a
        .iter()
        .chain(&b)
        .filter(|x| !bad.contains(x.did.as_str()))
        .collect();
    assert_eq!(good.len(), 11);
    for x in &good {
        let lines = got.remove(&x.did).unwrap_or_default();
        let set: BTreeSet<String> = lines.iter().cloned().collect();
        assert_eq!(set.len(), lines.len(), "{}: a record twice", x.did);
        assert_eq!(set, listing(&x.car, ""), "{}", x.did);
        assert_eq!(lines.len(), x.records);
    }
    assert!(
        got.is_empty(),
        "records of faulty accounts: {:?}",
        got.keys()
    );

    // Faults reported by reason; the banned and unreachable hosts by name.
    let state = State::open(&dir.path().join("state")).unwrap();
    let s = riptide_backfill::status(&state, 10).unwrap();
    assert_eq!(s.repos_ok, 11);
    assert_eq!(
        s.repos_failed,
        BTreeMap::from([
            ("bad_cid".to_owned(), 1),
            ("bad_signature".to_owned(), 1),
            ("wrong_did".to_owned(), 1),
        ])
    );
    let failed: BTreeMap<String, String> = s
        .failures
        .iter()
        .map(|(d, r, _)| (d.clone(), r.clone()))
        .collect();
    assert_eq!(failed[&tampered.did], "bad_cid");
    assert_eq!(failed[&forged.did], "bad_signature");
    assert_eq!(failed[&stolen.did], "wrong_did");
    assert_eq!(s.listings, 4);
    assert_eq!(
        s.listings_done, 3,
        "A, B and the banned one (done: not crawled)"
    );
    assert!(s.listing_problems["host:banned.example.com"].contains("banned"));
    assert!(s.listing_problems.contains_key("host:127.0.0.1:1"));
    assert_eq!(s.expected_repos, Some(19));
    assert!(
        sim_b
            .sim
            .counters()
            .errors_injected
            .load(std::sync::atomic::Ordering::Relaxed)
            > 0
    );
    drop(state);

    // Run again: nothing new is written, nothing is fetched again.
    let before = sim_a
        .sim
        .counters()
        .get_repo
        .load(std::sync::atomic::Ordering::Relaxed);
    run().await.unwrap();
    assert_eq!(std::fs::read_to_string(&out_path).unwrap(), text);
    assert_eq!(
        sim_a
            .sim
            .counters()
            .get_repo
            .load(std::sync::atomic::Ordering::Relaxed),
        before
    );
}
