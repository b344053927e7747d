//! The other sources of work and of repositories, on loopback: `listReposByCollection` for
//! `--collections` (only those accounts, only those records), a DID list, and the relay's
//! `getRepo` when an account's PDS fails in transport.
//!
//! Oracles: the repositories' own listings (`riptide_repo::list_records`, filtered by the
//! collection asked for) and which server was asked (the simulators' request counters).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering::Relaxed;
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
use riptide_sim::{fixture, Faults, Network, Sim, SimHandle};

fn read_lines(path: &std::path::Path) -> BTreeMap<String, Vec<String>> {
    let mut got: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in std::fs::read_to_string(path).unwrap().lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        got.entry(v["did"].as_str().unwrap().to_owned())
            .or_default()
            .push(format!(
                "{}/{}\t{}",
                v["collection"].as_str().unwrap(),
                v["rkey"].as_str().unwrap(),
                v["cid"].as_str().unwrap()
            ));
    }
    got
}

fn accounts(n: u8) -> Vec<fixture::FixtureAccount> {
    (1..=n)
        .map(|i| fixture::account(i, &format!("u{i}.test"), 10 + usize::from(i) * 3))
        .collect()
}

/// The accounts' documents, their PDS `pds`.
fn docs(accounts: &[fixture::FixtureAccount], pds: &str) -> DidDocs {
    let mut docs = DidDocs::new();
    for x in accounts {
        let doc = fixture::doc(&x.did, &x.handle, &x.key.public_key(), pds);
        docs.insert(DidDoc::from_value(&doc).unwrap());
    }
    docs
}

async fn sim(w: &[fixture::FixtureAccount], faults: Faults) -> SimHandle {
    let net = Network::new([], w.iter().map(|x| (x.did.clone(), x.car.clone()))).unwrap();
    Sim::spawn(net, LOOPBACK, faults).await.unwrap()
}

async fn run(
    docs: &DidDocs,
    relay: &str,
    discovery: Discovery,
    keep: Collections,
    dir: &std::path::Path,
) -> std::path::PathBuf {
    let resolver = Resolver::new(ResolverConfig {
        did_docs: Some(StaticDocs(Arc::new(docs.clone()))),
        timeout: Duration::from_secs(5),
        ..ResolverConfig::default()
    })
    .unwrap();
    let resync = Resyncer::new(resolver.clone(), ResyncConfig::default());
    let fetcher = Fetcher::new(resolver, resync, Some(relay.to_owned()), keep);
    let cfg = Config {
        relay: relay.to_owned(),
        discovery,
        page: 2,
        attempts: 2,
        backoff: Duration::from_millis(20),
        ..Config::default()
    };
    let out = dir.join("out.jsonl");
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&out)
        .unwrap();
    riptide_backfill::run(
        cfg,
        fetcher,
        Hosts::new(HostLimits::default(), 8),
        Arc::new(State::open(&dir.join("state")).unwrap()),
        Box::new(JsonlSink::file(f, "out")),
        Arc::new(Progress::default()),
    )
    .await
    .unwrap();
    out
}

#[derive(serde::Deserialize)]
struct ByCollection {
    collection: String,
    limit: Option<usize>,
    cursor: Option<String>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn collections_find_only_their_accounts_and_keep_only_their_records() {
    // The PDS serves everyone; the relay's collection index says three accounts have posts.
    let all = accounts(6);
    let pds = sim(&all, Faults::default()).await;
    let docs = docs(&all, &pds.base_url());
    let with_posts: Vec<String> = [1, 3, 4].iter().map(|&i| all[i].did.clone()).collect();
    let index = Arc::new(with_posts.clone());
    let asked = Arc::new(std::sync::Mutex::new(Vec::new()));
    let asked2 = asked.clone();
    let app = axum::Router::new().route(
        "/xrpc/com.atproto.sync.listReposByCollection",
        get(move |Query(q): Query<ByCollection>| {
            let index = index.clone();
            asked2.lock().unwrap().push(q.collection.clone());
            async move {
                let dids: &[String] = if q.collection == "app.bsky.feed.post" {
                    &index
                } else {
                    &[]
                };
                let start: usize = q.cursor.and_then(|c| c.parse().ok()).unwrap_or(0);
                let n = q.limit.unwrap_or(500);
                let page: Vec<_> = dids
                    .iter()
                    .skip(start)
                    .take(n)
                    .map(|d| serde_json::json!({"did": d}))
                    .collect();
                let mut out = serde_json::json!({"repos": page});
                if start + n < dids.len() {
                    out["cursor"] = serde_json::json!((start + n).to_string());
                }
                Json(out)
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind(LOOPBACK).await.unwrap();
    let relay = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });

    let keep = Collections::parse(["app.bsky.feed.post"]).unwrap();
    let nsids = keep.discoverable().unwrap().to_vec();
    let dir = tempfile::tempdir().unwrap();
    let out = run(
        &docs,
        &relay,
        Discovery::Collections(nsids),
        keep,
        dir.path(),
    )
    .await;
    let mut got = read_lines(&out);
    for x in all.iter().filter(|x| with_posts.contains(&x.did)) {
        let lines = got.remove(&x.did).unwrap();
        let set: BTreeSet<String> = lines.iter().cloned().collect();
        assert_eq!(set.len(), lines.len());
        let want = listing(&x.car, "app.bsky.feed.post/");
        assert_eq!(set, want);
        assert_eq!(
            want.len(),
            x.records.div_ceil(2),
            "half the fixture's records are posts"
        );
    }
    assert!(got.is_empty(), "{:?}", got.keys());
    assert_eq!(
        *asked.lock().unwrap(),
        vec!["app.bsky.feed.post"; 2],
        "two pages of two"
    );
    assert_eq!(pds.sim.counters().get_repo.load(Relaxed), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_did_list_and_the_relay_when_the_pds_is_down() {
    // The accounts' PDS answers every request with a 503; the relay (another simulator)
    // serves their repositories.
    let down = sim(
        &[],
        Faults {
            error_every: 1,
            ..Faults::default()
        },
    )
    .await;
    let all = accounts(4);
    let docs = docs(&all, &down.base_url());
    let relay = sim(&all, Faults::default()).await;
    let dids: Vec<String> = all[..3].iter().map(|x| x.did.clone()).collect();
    let dir = tempfile::tempdir().unwrap();
    let out = run(
        &docs,
        &relay.base_url(),
        Discovery::Dids(dids.clone()),
        Collections::all(),
        dir.path(),
    )
    .await;
    let got = read_lines(&out);
    assert_eq!(got.keys().cloned().collect::<Vec<_>>(), {
        let mut d = dids.clone();
        d.sort();
        d
    });
    for x in &all[..3] {
        let set: BTreeSet<String> = got[&x.did].iter().cloned().collect();
        assert_eq!(set, listing(&x.car, ""));
    }
    // The PDS was asked first (and failed, each time, attempts included); the relay served.
    assert_eq!(relay.sim.counters().get_repo.load(Relaxed), 3);
    assert!(down.sim.counters().errors_injected.load(Relaxed) >= 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_host_does_not_stall_the_others() {
    // Host A answers each request after 700 ms; host B at once. Two global slots, one per
    // host: A can hold only one of them, so B's accounts are done while A's still trickle in.
    let all = accounts(8);
    let (slow, fast) = all.split_at(3);
    let a = sim(
        slow,
        Faults {
            delay_ms: 700,
            ..Faults::default()
        },
    )
    .await;
    let b = sim(fast, Faults::default()).await;
    let mut docs = docs(slow, &a.base_url());
    for x in fast {
        let doc = fixture::doc(&x.did, &x.handle, &x.key.public_key(), &b.base_url());
        docs.insert(DidDoc::from_value(&doc).unwrap());
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.jsonl");
    let resolver = Resolver::new(ResolverConfig {
        did_docs: Some(StaticDocs(Arc::new(docs))),
        ..ResolverConfig::default()
    })
    .unwrap();
    let resync = Resyncer::new(resolver.clone(), ResyncConfig::default());
    let fetcher = Fetcher::new(resolver, resync, None, Collections::all());
    // Slow accounts first in the list, so they are asked first.
    let dids: Vec<String> = all.iter().map(|x| x.did.clone()).collect();
    let cfg = Config {
        relay: b.base_url(),
        discovery: Discovery::Dids(dids),
        global: 2,
        ..Config::default()
    };
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&out)
        .unwrap();
    let hosts = Hosts::new(
        HostLimits {
            per_host: 1,
            ..HostLimits::default()
        },
        2,
    );
    let t0 = std::time::Instant::now();
    let run = tokio::spawn(riptide_backfill::run(
        cfg,
        fetcher,
        hosts,
        Arc::new(State::open(&dir.path().join("state")).unwrap()),
        Box::new(JsonlSink::file(f, "out")),
        Arc::new(Progress::default()),
    ));
    let done = |xs: &[fixture::FixtureAccount]| {
        let got = read_lines(&out);
        xs.iter().all(|x| got.contains_key(&x.did))
    };
    let mut fast_done = None;
    while !run.is_finished() {
        if fast_done.is_none() && done(fast) {
            fast_done = Some(t0.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    run.await.unwrap().unwrap();
    let total = t0.elapsed();
    assert!(done(slow) && done(fast));
    let fast_done = fast_done.expect("the fast host's accounts were done before the end");
    // A's three accounts, one at a time, 700 ms each: at least 2.1 s. B's five came first.
    assert!(total >= Duration::from_millis(2100), "{total:?}");
    assert!(
        fast_done < Duration::from_millis(1400),
        "the fast host waited for the slow one: {fast_done:?} of {total:?}"
    );
}
