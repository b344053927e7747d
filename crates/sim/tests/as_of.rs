//! Repositories as of a relay seq, then the live tail: `riptide gen --repos --repos-at K`
//! served by the simulator says (manifest, `listHosts`) that the repositories are as of seq S;
//! every commit the relay serves up to S is at or below the served repository's rev, and from
//! cursor S the relay's first frame is S + 1 and each account's first live commit continues
//! exactly from the served repository (`since` = the rev `listRepos` gives): a backfill at S
//! then the tail from S + 1 sees every commit once.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use futures_util::StreamExt;
use riptide_firehose::{Body, FrameDecoder};
use riptide_sim::{Network, PlanConfig};
use tokio_tungstenite::tungstenite::Message;

const EVENTS: u64 = 300;
const K: u64 = 120;

/// (seq, repo, rev, since) of every `#commit` the relay sends from `cursor` until `until`.
async fn commits(
    relay: &str,
    cursor: u64,
    until: u64,
) -> Vec<(u64, String, String, Option<String>)> {
    let (mut ws, _) = tokio_tungstenite::connect_async(format!("{relay}?cursor={cursor}"))
        .await
        .unwrap();
    let mut dec = FrameDecoder::new();
    let mut out = Vec::new();
    let mut first = None;
    loop {
        let msg = tokio::time::timeout(Duration::from_secs(20), ws.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        let Message::Binary(bytes) = msg else {
            continue;
        };
        let frame = dec.decode(&bytes).unwrap();
        let seq = frame.body().seq().unwrap() as u64;
        first.get_or_insert(seq);
        if let Body::Commit(c) = frame.body() {
            out.push((
                seq,
                c.repo.to_owned(),
                c.rev.to_owned(),
                c.since.map(str::to_owned),
            ));
        }
        if seq >= until {
            break;
        }
    }
    assert_eq!(first, Some(cursor + 1));
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repositories_as_of_seq_then_the_tail_from_the_next() {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("riptide-sim-as-of-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut cfg = riptide_gen::Config::new(21, 10, EVENTS);
    cfg.keep_records = true;
    cfg.repos_at = Some(K);
    cfg.initial_records = (20, 200);
    riptide_gen::write_dir(&cfg, &dir).unwrap();
    let net = Network::load(&dir).unwrap();
    let sim = common::spawn(
        net,
        PlanConfig {
            hosts: 3,
            ..PlanConfig::default()
        },
    )
    .await;
    let manifest = sim.sim.manifest();
    assert_eq!(manifest["repos_as_of_seq"], K);
    let http = reqwest::Client::new();
    let hosts = common::json(
        &http,
        &format!("{}/xrpc/com.atproto.sync.listHosts", sim.base_url()),
    )
    .await;
    assert!(hosts["hosts"]
        .as_array()
        .unwrap()
        .iter()
        .all(|h| h["seq"] == K));

    // The served repositories' revs, from each host's listRepos.
    let mut rev_of: BTreeMap<String, String> = BTreeMap::new();
    for h in manifest["hosts"].as_array().unwrap() {
        let url = h["url"].as_str().unwrap();
        let list = common::json(&http, &format!("{url}/xrpc/com.atproto.sync.listRepos")).await;
        for r in list["repos"].as_array().unwrap() {
            rev_of.insert(
                r["did"].as_str().unwrap().to_owned(),
                r["rev"].as_str().unwrap().to_owned(),
            );
        }
    }
    assert_eq!(rev_of.len(), 10);

    let relay = sim.sim.relay_url();
    for (seq, repo, rev, _) in commits(&relay, 0, K).await {
        assert!(seq <= K);
        assert!(
            rev <= rev_of[&repo],
            "seq {seq}: {rev} after {}",
            rev_of[&repo]
        );
    }
    let tail = commits(&relay, K, EVENTS).await;
    let mut first_live: BTreeMap<&str, &Option<String>> = BTreeMap::new();
    for (seq, repo, rev, since) in &tail {
        assert!(*seq > K);
        assert!(
            *rev > rev_of[repo],
            "seq {seq}: {rev} not after {}",
            rev_of[repo]
        );
        first_live.entry(repo.as_str()).or_insert(since);
    }
    assert!(first_live.len() >= 5, "{}", first_live.len());
    for (repo, since) in first_live {
        assert_eq!(since.as_deref(), Some(rev_of[repo].as_str()), "{repo}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
