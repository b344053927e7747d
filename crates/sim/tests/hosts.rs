//! `--hosts N` over real HTTP: hosts on their own ports listed by the relay's `listHosts`
//! (paged) with account counts equal to what each host's own `listRepos` pages give; DID
//! documents pointing at the host that lists the account; `getRepo` of the host's own accounts
//! only, verifying with the key of the document; `listReposByCollection` against the records
//! of the CARs the test built; per-IP rate limits with the PDS's headers (127.0.0.1 and
//! 127.0.0.2 are two clients); and every host and repository fault as the manifest lists it,
//! judged by the repository verifier.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use riptide_repo::RepoError;
use riptide_sim::{fixture, HostFault, Network, PlanConfig, RepoFault, SimHandle};
use serde_json::Value;

use common::{bytes, json, key_of};

const ACCOUNTS: u8 = 48;

/// The accounts: seed i has 1 + i % 5 records (one record: a post only; two or more: posts and
/// likes), by DID.
fn accounts() -> BTreeMap<String, fixture::FixtureAccount> {
    (0..ACCOUNTS)
        .map(|i| {
            let a = fixture::account(i, &format!("u{i}.test"), 1 + usize::from(i % 5));
            (a.did.clone(), a)
        })
        .collect()
}

async fn spawn(plan: PlanConfig) -> (SimHandle, BTreeMap<String, fixture::FixtureAccount>) {
    let accs = accounts();
    let net = Network::new(
        accs.values().map(|a| a.doc.clone()),
        accs.values().map(|a| (a.did.clone(), a.car.clone())),
    )
    .unwrap();
    (common::spawn(net, plan).await, accs)
}

fn client(ip: [u8; 4]) -> reqwest::Client {
    reqwest::Client::builder()
        .local_address(IpAddr::from(ip))
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap()
}

/// Every page of a paged list: the items under `field`, and the number of pages.
async fn pages(http: &reqwest::Client, url: &str, field: &str) -> (Vec<Value>, usize) {
    let mut out = Vec::new();
    let mut cursor: Option<String> = None;
    let mut n = 0;
    loop {
        let sep = if url.contains('?') { '&' } else { '?' };
        let u = match &cursor {
            Some(c) => format!("{url}{sep}cursor={c}"),
            None => url.to_owned(),
        };
        let page = json(http, &u).await;
        n += 1;
        out.extend(page[field].as_array().unwrap().iter().cloned());
        match page["cursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => return (out, n),
        }
        assert!(n < 1000, "paging does not end");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hosts_listed_paged_and_serving_their_own_accounts() {
    let (sim, accs) = spawn(PlanConfig {
        hosts: 7,
        seed: 3,
        ..PlanConfig::default()
    })
    .await;
    let base = sim.base_url();
    let http = client([127, 0, 0, 1]);

    // listHosts, two per page: 7 hosts in 4 pages, each a distinct loopback port.
    let (hosts, n) = pages(
        &http,
        &format!("{base}/xrpc/com.atproto.sync.listHosts?limit=2"),
        "hosts",
    )
    .await;
    assert_eq!((hosts.len(), n), (7, 4));
    let names: BTreeSet<&str> = hosts
        .iter()
        .map(|h| h["hostname"].as_str().unwrap())
        .collect();
    assert_eq!(names.len(), 7);
    assert!(hosts.iter().all(|h| h["status"] == "active"));

    // Each host's own listRepos, three per page, is its account count; together they are
    // every account once. The skew: host 0 has the most.
    let mut owner: BTreeMap<String, String> = BTreeMap::new();
    let mut counts = Vec::new();
    for h in &hosts {
        let url = format!("http://{}", h["hostname"].as_str().unwrap());
        let (repos, _) = pages(
            &http,
            &format!("{url}/xrpc/com.atproto.sync.listRepos?limit=3"),
            "repos",
        )
        .await;
        assert_eq!(repos.len() as u64, h["accountCount"].as_u64().unwrap());
        counts.push(repos.len());
        for r in &repos {
            let did = r["did"].as_str().unwrap().to_owned();
            assert_eq!(r["active"], true);
            assert!(owner.insert(did, url.clone()).is_none(), "listed twice");
        }
    }
    assert_eq!(owner.len(), accs.len());
    assert_eq!(counts.iter().max(), Some(&counts[0]), "{counts:?}");
    assert!(counts[0] >= accs.len() / 4, "{counts:?}");

    // The relay's listRepos lists all of them.
    let (all, _) = pages(
        &http,
        &format!("{base}/xrpc/com.atproto.sync.listRepos?limit=10"),
        "repos",
    )
    .await;
    let all: BTreeSet<&str> = all.iter().map(|r| r["did"].as_str().unwrap()).collect();
    assert_eq!(all, owner.keys().map(String::as_str).collect());

    let other_host = |url: &str| owner.values().find(|u| *u != url).unwrap().clone();
    for (did, url) in &owner {
        // The PLC document names the host that lists the account.
        let doc = json(&http, &format!("{base}/{did}")).await;
        assert_eq!(doc["service"][0]["serviceEndpoint"], url.as_str(), "{did}");
        // getRepo on that host: the CAR built, verifying with the document's key.
        let car = bytes(
            &http,
            &format!("{url}/xrpc/com.atproto.sync.getRepo?did={did}"),
        )
        .await;
        assert_eq!(car, accs[did].car);
        let report = riptide_repo::verify_repo(&car, Some(&key_of(&doc))).unwrap();
        assert_eq!(report.did, *did);
        // Another host does not have it.
        let r = http
            .get(format!(
                "{}/xrpc/com.atproto.sync.getRepo?did={did}",
                other_host(url)
            ))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400);
        assert_eq!(r.json::<Value>().await.unwrap()["error"], "RepoNotFound");
    }
    let server = json(
        &http,
        &format!(
            "{}/xrpc/com.atproto.server.describeServer",
            owner.values().next().unwrap()
        ),
    )
    .await;
    assert_eq!(server["did"], "did:web:127.0.0.1");

    // listReposByCollection, two per page, against the records of the CARs.
    for collection in ["app.bsky.feed.post", "app.bsky.feed.like"] {
        let expected: BTreeSet<String> = accs
            .values()
            .filter(|a| {
                let mut reader = riptide_car::CarReader::new();
                let car = reader
                    .read(&a.car, &riptide_car::CarOptions::repository())
                    .unwrap();
                riptide_repo::list_records(&car)
                    .unwrap()
                    .iter()
                    .any(|(k, _)| k.starts_with(&format!("{collection}/")))
            })
            .map(|a| a.did.clone())
            .collect();
        let (got, n) = pages(
            &http,
            &format!(
                "{base}/xrpc/com.atproto.sync.listReposByCollection?collection={collection}&limit=2"
            ),
            "repos",
        )
        .await;
        let got: BTreeSet<String> = got
            .iter()
            .map(|r| r["did"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(got, expected, "{collection}");
        assert!(n >= expected.len() / 2);
    }
    let like_only = accs.values().filter(|a| a.records == 1).count();
    assert!(like_only > 0);
}

/// Waits until early in a wall-clock second, so a burst falls in one rate-limit window.
async fn start_of_second() {
    loop {
        let ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis()
            % 1000;
        if ms < 50 {
            return;
        }
        tokio::time::sleep(Duration::from_millis((1000 - ms as u64).min(20))).await;
    }
}

fn header<'a>(r: &'a reqwest::Response, name: &str) -> &'a str {
    r.headers()
        .get(name)
        .unwrap_or_else(|| panic!("no {name}"))
        .to_str()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limited_per_client_ip_with_the_pds_headers() {
    let (sim, _) = spawn(PlanConfig {
        hosts: 3,
        seed: 1,
        get_repo_per_sec: 4,
        list_repos_per_sec: 2,
        ..PlanConfig::default()
    })
    .await;
    let manifest = sim.sim.manifest();
    let host = manifest["hosts"][0]["url"].as_str().unwrap().to_owned();
    let list = json(
        &client([127, 0, 0, 3]),
        &format!("{host}/xrpc/com.atproto.sync.listRepos"),
    )
    .await;
    let did = list["repos"][0]["did"].as_str().unwrap().to_owned();
    let get = format!("{host}/xrpc/com.atproto.sync.getRepo?did={did}");
    let one = client([127, 0, 0, 1]);
    let two = client([127, 0, 0, 2]);

    start_of_second().await;
    let mut statuses = Vec::new();
    let mut remaining = Vec::new();
    let mut refused = None;
    for _ in 0..6 {
        let r = one.get(&get).send().await.unwrap();
        statuses.push(r.status().as_u16());
        remaining.push(header(&r, "ratelimit-remaining").to_owned());
        assert_eq!(header(&r, "ratelimit-limit"), "4");
        assert_eq!(header(&r, "ratelimit-policy"), "4;w=1");
        if r.status() == 429 {
            refused = Some(r);
        }
    }
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert_eq!(statuses, [200, 200, 200, 200, 429, 429]);
    assert_eq!(remaining, ["3", "2", "1", "0", "0", "0"]);
    let refused = refused.unwrap();
    assert_eq!(header(&refused, "retry-after"), "1");
    let reset: u64 = header(&refused, "ratelimit-reset").parse().unwrap();
    assert_eq!(reset, now + 1);
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["error"], "RateLimitExceeded");
    // Another address is another client, in the same second.
    let r = two.get(&get).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "ratelimit-remaining"), "3");
    // listRepos has its own budget.
    let secs = || {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs()
    };
    let before = secs();
    let codes: Vec<u16> = {
        let mut v = Vec::new();
        for _ in 0..3 {
            v.push(
                two.get(format!("{host}/xrpc/com.atproto.sync.listRepos"))
                    .send()
                    .await
                    .unwrap()
                    .status()
                    .as_u16(),
            );
        }
        v
    };
    // The listRepos budget of 127.0.0.2 is fresh: two allowed (if the second did not turn
    // meanwhile, which a burst this short started early in a second does not).
    if secs() == before {
        assert_eq!(codes, [200, 200, 429]);
    }
    // After the window, the first client is served again; the 429s are counted per host.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(one.get(&get).send().await.unwrap().status(), 200);
    let stats = sim.sim.stats();
    let limited = stats["hosts"][0]["rate_limited"].as_u64().unwrap();
    assert!(limited >= 2, "{stats}");
    assert_eq!(stats["rate_limited"].as_u64().unwrap(), limited);
    // The relay's own getRepo is not limited.
    for _ in 0..6 {
        let r = one
            .get(format!(
                "{}/xrpc/com.atproto.sync.getRepo?did={did}",
                sim.base_url()
            ))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_fault_as_the_manifest_says() {
    const TRICKLE: u64 = 4000;
    let (sim, accs) = spawn(PlanConfig {
        hosts: 6,
        seed: 5,
        host_faults: vec![
            (HostFault::Offline, 1),
            (HostFault::Error5xx, 1),
            (HostFault::Trickle, 1),
        ],
        repo_faults: vec![
            (RepoFault::CutAtBlock, 1),
            (RepoFault::OtherDid, 1),
            (RepoFault::BadSignature, 1),
            (RepoFault::MissingBlock, 1),
            (RepoFault::Error5xx, 1),
            (RepoFault::Trickle, 1),
            (RepoFault::Deactivated, 1),
            (RepoFault::Takendown, 1),
        ],
        trickle_bytes_per_sec: TRICKLE,
        ..PlanConfig::default()
    })
    .await;
    let base = sim.base_url();
    let http = client([127, 0, 0, 1]);
    let manifest = json(&http, &format!("{base}/_sim/manifest")).await;
    assert_eq!(manifest, sim.sim.manifest());
    let hosts = manifest["hosts"].as_array().unwrap();
    let url_of = |h: &Value| {
        hosts[h.as_u64().unwrap() as usize]["url"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let host_with = |f: &str| hosts.iter().find(|h| h["fault"] == f).unwrap().clone();

    // Host faults.
    let offline = host_with("offline");
    let e = http
        .get(format!(
            "{}/xrpc/com.atproto.sync.listRepos",
            offline["url"].as_str().unwrap()
        ))
        .send()
        .await
        .unwrap_err();
    assert!(e.is_connect(), "{e}");
    let (listed, _) = pages(
        &http,
        &format!("{base}/xrpc/com.atproto.sync.listHosts"),
        "hosts",
    )
    .await;
    let status = listed
        .iter()
        .find(|h| h["hostname"] == offline["hostname"])
        .unwrap();
    assert_eq!(status["status"], "offline");
    let e5 = host_with("5xx");
    let r = http
        .get(format!(
            "{}/xrpc/com.atproto.sync.listRepos",
            e5["url"].as_str().unwrap()
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);

    // The accounts of each host, from the relay's documents.
    let mut on_host: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for did in accs.keys() {
        let doc = json(&http, &format!("{base}/{did}")).await;
        let pds = doc["service"][0]["serviceEndpoint"]
            .as_str()
            .unwrap()
            .to_owned();
        on_host.entry(pds).or_default().push(did.clone());
    }
    let trickle_host = host_with("trickle")["url"].as_str().unwrap().to_owned();
    let slow_did = on_host[&trickle_host][0].clone();

    let fetch = |url: String| {
        let http = http.clone();
        async move {
            let t = Instant::now();
            let r = http.get(url).send().await.unwrap();
            let status = r.status().as_u16();
            let headers = r.headers().clone();
            let body = r.bytes().await.unwrap();
            (status, headers, body, t.elapsed())
        }
    };
    // A trickling body: all of it, at the trickle rate.
    let check_trickle = |did: &str, got: &(u16, reqwest::header::HeaderMap, Bytes, Duration)| {
        let car = &accs[did].car;
        assert_eq!(got.0, 200);
        assert_eq!(&got.2, car);
        let floor = Duration::from_secs_f64(car.len() as f64 / TRICKLE as f64 - 0.15);
        assert!(got.3 >= floor, "{did}: {:?} < {floor:?}", got.3);
    };
    let got = fetch(format!(
        "{trickle_host}/xrpc/com.atproto.sync.getRepo?did={slow_did}"
    ))
    .await;
    check_trickle(&slow_did, &got);

    // Repository faults: each listed once, on a healthy host.
    let faults = manifest["faults"].as_array().unwrap();
    assert_eq!(faults.len(), 8);
    for f in faults {
        let did = f["did"].as_str().unwrap();
        let host = url_of(&f["host"]);
        assert_eq!(
            hosts[f["host"].as_u64().unwrap() as usize]["fault"],
            Value::Null
        );
        let doc = json(&http, &format!("{base}/{did}")).await;
        let key = key_of(&doc);
        let own = &accs[did].car;
        let got = fetch(format!("{host}/xrpc/com.atproto.sync.getRepo?did={did}")).await;
        // The relay's getRepo gives the same answer (the fault is the repository's).
        let via_relay = fetch(format!("{base}/xrpc/com.atproto.sync.getRepo?did={did}")).await;
        assert_eq!((got.0, &got.2), (via_relay.0, &via_relay.2), "{did}");
        let error = || serde_json::from_slice::<Value>(&got.2).unwrap()["error"].clone();
        match f["fault"].as_str().unwrap() {
            "cut-at-block" => {
                assert_eq!(got.0, 200);
                assert!(own.starts_with(&got.2) && got.2.len() < own.len());
                let len: usize = got.1["content-length"].to_str().unwrap().parse().unwrap();
                assert_eq!(len, got.2.len());
                assert!(riptide_repo::verify_repo(&got.2, Some(&key)).is_err());
            }
            "other-did" => {
                let report = riptide_repo::verify_repo(&got.2, None).unwrap();
                assert_ne!(report.did, did);
                assert!(accs.contains_key(&report.did));
            }
            "bad-signature" => {
                let err = riptide_repo::verify_repo(&got.2, Some(&key)).unwrap_err();
                assert!(matches!(err, RepoError::Signature(_)), "{err}");
            }
            "missing-block" => {
                let err = riptide_repo::verify_repo(&got.2, Some(&key)).unwrap_err();
                assert!(
                    matches!(err, RepoError::MissingRecord { .. } | RepoError::Mst(_)),
                    "{err}"
                );
            }
            "5xx" => {
                assert_eq!(got.0, 500);
                assert_eq!(error(), "InternalServerError");
            }
            "trickle" => check_trickle(did, &got),
            name @ ("deactivated" | "takendown") => {
                assert_eq!(got.0, 400);
                let expected = if name == "deactivated" {
                    "RepoDeactivated"
                } else {
                    "RepoTakendown"
                };
                assert_eq!(error(), expected);
                let (repos, _) = pages(
                    &http,
                    &format!("{host}/xrpc/com.atproto.sync.listRepos"),
                    "repos",
                )
                .await;
                let e = repos.iter().find(|r| r["did"] == did).unwrap();
                assert_eq!(e["active"], false);
                assert_eq!(e["status"], name);
            }
            other => panic!("unexpected fault {other}"),
        }
    }
    // Every other account on a healthy host verifies.
    let faulty: BTreeSet<&str> = faults.iter().map(|f| f["did"].as_str().unwrap()).collect();
    let mut good = 0;
    for h in hosts.iter().filter(|h| h["fault"].is_null()) {
        let url = h["url"].as_str().unwrap();
        for did in on_host.get(url).into_iter().flatten() {
            if faulty.contains(did.as_str()) {
                continue;
            }
            let car = http
                .get(format!("{url}/xrpc/com.atproto.sync.getRepo?did={did}"))
                .send()
                .await
                .unwrap()
                .bytes()
                .await
                .unwrap();
            riptide_repo::verify_repo(&car, Some(&accs[did].key.public_key())).unwrap();
            good += 1;
        }
    }
    assert!(good > 10, "{good}");
}
