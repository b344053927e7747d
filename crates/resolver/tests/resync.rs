//! Resync against `riptide-sim` on loopback: a repository fetched from the relay or, failing
//! that, the PDS, verified whole before its commit is returned; a forged repository, 5xx, 429
//! with Retry-After, a slow host and too many resyncs of one account each a typed failure, and
//! nothing unverified ever returned.

#![allow(clippy::unwrap_used, clippy::expect_used)]
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use riptide_resolver::{Resolver, ResolverConfig, ResyncConfig, ResyncError, Resyncer};
use riptide_sim::{fixture, Faults, Network, Sim, SimHandle};

const LOOPBACK: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 0);

struct World {
    sim: SimHandle,
    alice: fixture::FixtureAccount,
    mallory: fixture::FixtureAccount,
}

/// alice (a good repository of 60 records) and mallory (one block of hers tampered).
async fn world() -> World {
    let alice = fixture::account(1, "alice.test", 60);
    let mallory = fixture::account(2, "mallory.test", 30);
    let net = Network::new(
        [alice.doc.clone(), mallory.doc.clone()],
        [
            (alice.did.clone(), alice.car.clone()),
            (
                mallory.did.clone(),
                fixture::tamper_last_block(&mallory.car).into(),
            ),
        ],
    )
    .unwrap();
    let sim = Sim::spawn(net, LOOPBACK, Faults::default()).await.unwrap();
    World {
        sim,
        alice,
        mallory,
    }
}

fn resyncer(w: &World, cfg: ResyncConfig) -> Resyncer {
    let r = Resolver::new(ResolverConfig {
        plc_url: w.sim.base_url(),
        timeout: Duration::from_secs(30),
        ..ResolverConfig::default()
    })
    .unwrap();
    Resyncer::new(r, cfg)
}

fn relay(w: &World) -> String {
    format!("ws://{}/xrpc/com.atproto.sync.subscribeRepos", w.sim.addr)
}

fn attempts(e: &ResyncError) -> Vec<String> {
    match e {
        ResyncError::AllSourcesFailed { attempts, .. } => {
            attempts.iter().map(|a| a.why.clone()).collect()
        }
        other => panic!("expected AllSourcesFailed, got {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_verified_repository_from_the_relay_or_else_the_pds() {
    let w = world().await;
    let want = riptide_repo::verify_repo(&w.alice.car, Some(&w.alice.key.public_key())).unwrap();
    let rs = resyncer(&w, ResyncConfig::default());

    let got = rs.resync(&w.alice.did, &[relay(&w)]).await.unwrap();
    assert_eq!(
        (&got.rev, got.commit, got.data, got.records),
        (&want.rev, want.commit, want.data, 60)
    );
    assert_eq!(got.bytes, w.alice.car.len() as u64);
    assert!(got.source.starts_with(&w.sim.base_url()), "{}", got.source);

    // A relay that is down: the PDS (the sim, from the DID document) answers.
    let got = rs
        .resync(&w.alice.did, &["ws://127.0.0.1:1".to_owned()])
        .await
        .unwrap();
    assert_eq!(got.data, want.data);
    assert!(got.source.starts_with(&w.sim.base_url()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_repository_is_refused_from_every_source() {
    let w = world().await;
    let rs = resyncer(&w, ResyncConfig::default());
    let e = rs
        .resync(&w.mallory.did, &["ws://127.0.0.1:1".to_owned(), relay(&w)])
        .await
        .unwrap_err();
    let why = attempts(&e);
    assert_eq!(why.len(), 2, "{why:?}");
    assert!(why[1].contains("does not verify"), "{why:?}");
    assert!(e.is_transient());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_errors_rate_limits_and_slow_hosts_are_typed_failures() {
    let w = world().await;
    let rs = resyncer(
        &w,
        ResyncConfig {
            timeout: Duration::from_millis(400),
            ..ResyncConfig::default()
        },
    );
    // Every request a 503 (the DID document lookup included: an identity failure).
    w.sim.sim.set_faults(Faults {
        error_every: 1,
        ..Faults::default()
    });
    let e = rs.resync(&w.alice.did, &[relay(&w)]).await.unwrap_err();
    assert!(
        matches!(e, ResyncError::Identity { .. }),
        "the document could not be had: {e}"
    );
    // The document cached, every getRepo a 503.
    w.sim.sim.set_faults(Faults::default());
    rs.resync(&w.alice.did, &[relay(&w)]).await.unwrap();
    w.sim.sim.set_faults(Faults {
        error_every: 1,
        ..Faults::default()
    });
    let e = rs.resync(&w.alice.did, &[relay(&w)]).await.unwrap_err();
    assert!(attempts(&e)[0].contains("HTTP 503"), "{e}");

    // 429 with Retry-After: 1: the host is left alone for a second, then asked again.
    w.sim.sim.set_faults(Faults {
        rate_limit_every: 1,
        ..Faults::default()
    });
    let e = rs.resync(&w.alice.did, &[relay(&w)]).await.unwrap_err();
    assert!(attempts(&e)[0].contains("429"), "{e}");
    w.sim.sim.set_faults(Faults::default());
    let repos = || w.sim.sim.counters().get_repo.load(Relaxed);
    let seen = repos();
    let e = rs.resync(&w.mallory.did, &[relay(&w)]).await.unwrap_err();
    assert!(attempts(&e)[0].contains("rate-limited"), "{e}");
    assert_eq!(repos(), seen, "the host was not asked");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    rs.resync(&w.alice.did, &[relay(&w)]).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_host_times_out_and_an_account_is_resynced_at_most_five_times_a_minute() {
    let w = world().await;
    let rs = resyncer(
        &w,
        ResyncConfig {
            timeout: Duration::from_millis(300),
            ..ResyncConfig::default()
        },
    );
    // Warm the document cache, then make every answer slow.
    rs.resync(&w.alice.did, &[relay(&w)]).await.unwrap();
    w.sim.sim.set_faults(Faults {
        delay_ms: 1500,
        ..Faults::default()
    });
    let e = rs.resync(&w.alice.did, &[relay(&w)]).await.unwrap_err();
    assert!(attempts(&e)[0].contains("timed out"), "{e}");
    w.sim.sim.set_faults(Faults::default());
    for _ in 0..3 {
        rs.resync(&w.alice.did, &[relay(&w)]).await.unwrap();
    }
    match rs.resync(&w.alice.did, &[relay(&w)]).await {
        Err(ResyncError::RateLimited {
            limit, retry_in, ..
        }) => {
            assert_eq!(limit, 5);
            assert!(retry_in <= Duration::from_secs(60));
        }
        other => panic!("expected RateLimited, got {other:?}"),
    }
    // Another account is not limited by alice's count.
    assert!(rs.resync(&w.mallory.did, &[relay(&w)]).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_repository_is_spooled_to_disk_and_verified_the_same() {
    let w = world().await;
    let want = riptide_repo::verify_repo(&w.alice.car, Some(&w.alice.key.public_key())).unwrap();
    let spool = tempfile::tempdir().unwrap();
    let small = ResyncConfig {
        spool_above: 1024,
        spool_dir: Some(spool.path().to_owned()),
        ..ResyncConfig::default()
    };
    assert!(w.alice.car.len() > 4 * 1024, "large enough to spool");
    let got = resyncer(&w, small.clone())
        .resync(&w.alice.did, &[relay(&w)])
        .await
        .unwrap();
    assert_eq!(
        (&got.rev, got.commit, got.data, got.records),
        (&want.rev, want.commit, want.data, 60)
    );
    assert_eq!(got.bytes, w.alice.car.len() as u64);
    // Spooled, a forged repository is refused as in memory; the spool files are unnamed.
    let e = resyncer(&w, small)
        .resync(&w.mallory.did, &[relay(&w)])
        .await
        .unwrap_err();
    assert!(attempts(&e)[0].contains("does not verify"), "{e}");
    assert_eq!(std::fs::read_dir(spool.path()).unwrap().count(), 0);
    // A spool directory that cannot be written is a typed failure, not a crash.
    let e = resyncer(
        &w,
        ResyncConfig {
            spool_above: 1024,
            spool_dir: Some("/nonexistent/riptide-spool".into()),
            ..ResyncConfig::default()
        },
    )
    .resync(&w.alice.did, &[relay(&w)])
    .await
    .unwrap_err();
    assert!(attempts(&e)[0].contains("spooling"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repository_older_than_asked_is_stale_and_the_next_source_is_tried() {
    let w = world().await;
    let rs = resyncer(&w, ResyncConfig::default());
    let rev = riptide_repo::verify_repo(&w.alice.car, Some(&w.alice.key.public_key()))
        .unwrap()
        .rev;
    let v = riptide_syntax::tid_value(&rev).unwrap();
    // At its own rev it will do.
    let got = rs
        .resync_since(&w.alice.did, &[relay(&w)], Some(v))
        .await
        .unwrap();
    assert_eq!((got.rev.as_str(), got.stale_sources), (rev.as_str(), 0));
    // Newer asked: the relay's is stale (the PDS is the same URL here, asked once).
    let e = rs
        .resync_since(&w.alice.did, &[relay(&w)], Some(v + 1))
        .await
        .unwrap_err();
    let why = attempts(&e);
    assert_eq!(why.len(), 1, "{why:?}");
    assert!(why[0].starts_with("stale"), "{why:?}");
    assert_eq!(e.stale_sources(), 1);
    assert!(e.is_transient());
}

/// Issue 40: with `--did-docs`, frames were verified with the file's keys but a resynced
/// repository with the PLC's. One identity source: a resolver given the documents takes the key
/// and the PDS from them alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn given_documents_are_the_only_identity_source() {
    let w = world().await;
    let docs = |pairs: &[(&fixture::FixtureAccount, &serde_json::Value)]| {
        let mut m = serde_json::Map::new();
        for (a, doc) in pairs {
            m.insert(a.did.clone(), (*doc).clone());
        }
        let d = riptide_identity::DidDocs::from_slice(&serde_json::to_vec(&m).unwrap()).unwrap();
        Resyncer::new(
            Resolver::new(ResolverConfig {
                // Unreachable: any lookup there would fail the resync.
                plc_url: "http://127.0.0.1:1".to_owned(),
                did_docs: Some(riptide_resolver::StaticDocs(std::sync::Arc::new(d))),
                ..ResolverConfig::default()
            })
            .unwrap(),
            ResyncConfig::default(),
        )
    };
    // alice's document as the PLC (the sim) serves it: the PDS is the sim.
    let served: serde_json::Value =
        reqwest_get(&format!("{}/{}", w.sim.base_url(), w.alice.did)).await;
    let rs = docs(&[(&w.alice, &served)]);
    let got = rs.resync(&w.alice.did, &[]).await.unwrap();
    assert!(got.source.starts_with(&w.sim.base_url()), "the file's PDS");
    // The file's key, not the PLC's: mallory's key for alice, and her repository is refused.
    let mut forged = served.clone();
    forged["verificationMethod"] = mallory_doc(&w)["verificationMethod"].clone();
    forged["verificationMethod"][0]["id"] = serde_json::json!(format!("{}#atproto", w.alice.did));
    forged["verificationMethod"][0]["controller"] = serde_json::json!(w.alice.did);
    let e = docs(&[(&w.alice, &forged)])
        .resync(&w.alice.did, &[])
        .await
        .unwrap_err();
    assert!(attempts(&e)[0].contains("does not verify"), "{e}");
    // Not in the file: not looked up elsewhere.
    match docs(&[(&w.alice, &served)])
        .resync(&w.mallory.did, &[])
        .await
    {
        Err(ResyncError::Identity { .. }) => {}
        other => panic!("expected an identity failure, got {other:?}"),
    }
}

fn mallory_doc(w: &World) -> serde_json::Value {
    w.mallory.doc.clone()
}

async fn reqwest_get(url: &str) -> serde_json::Value {
    let body = reqwest::get(url).await.unwrap().bytes().await.unwrap();
    serde_json::from_slice(&body).unwrap()
}

/// Issue 40: `getRepo` redirects were followed to any host, the per-host limit charged to the
/// first. Now a redirect is followed only to the same host, at most `MAX_REDIRECTS` times;
/// anything else is a failed source (typed), and the next source is asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redirects_are_followed_only_to_the_same_host_and_only_a_few_times() {
    use axum::response::{IntoResponse, Redirect};
    use axum::routing::get;
    const GET_REPO: &str = "/xrpc/com.atproto.sync.getRepo";
    async fn serve(app: axum::Router) -> String {
        let listener = tokio::net::TcpListener::bind(LOOPBACK).await.unwrap();
        let me = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        format!("ws://{me}")
    }
    let w = world().await;
    let sim = w.sim.base_url();
    let car = w.alice.car.clone();
    // To the sim: another host.
    let other = serve(axum::Router::new().route(
        GET_REPO,
        get(move |q: axum::extract::RawQuery| async move {
            Redirect::temporary(&format!("{sim}{GET_REPO}?{}", q.0.unwrap_or_default()))
        }),
    ))
    .await;
    // To itself, forever.
    let looping =
        serve(axum::Router::new().route(GET_REPO, get(|| async { Redirect::temporary(GET_REPO) })))
            .await;
    // Once, to a path of its own that serves alice's repository.
    let moved = serve(
        axum::Router::new()
            .route(GET_REPO, get(|| async { Redirect::temporary("/car") }))
            .route(
                "/car",
                get(move || async move { car.clone().into_response() }),
            ),
    )
    .await;
    let rs = resyncer(&w, ResyncConfig::default());
    // Warm the document (one PLC request), so that getRepo counts are the sim's alone.
    rs.resync(&w.alice.did, &[relay(&w)]).await.unwrap();
    let repos = || w.sim.sim.counters().get_repo.load(Relaxed);

    // Same host, one hop: followed.
    let got = rs
        .resync(&w.alice.did, std::slice::from_ref(&moved))
        .await
        .unwrap();
    assert!(
        got.source.starts_with(&moved.replace("ws:", "http:")),
        "{}",
        got.source
    );

    // Another host: refused, and the next source (the PDS, the sim itself) asked once.
    let seen = repos();
    let got = rs
        .resync(&w.alice.did, std::slice::from_ref(&other))
        .await
        .unwrap();
    assert!(got.source.starts_with(&w.sim.base_url()), "{}", got.source);
    assert_eq!(repos(), seen + 1, "the redirect was not followed");

    // A loop: refused after a few hops. (mallory's repository does not verify anyway: both
    // sources fail, and the first says why.)
    let e = rs.resync(&w.mallory.did, &[looping]).await.unwrap_err();
    let why = attempts(&e);
    assert!(why[0].contains("more redirects than allowed"), "{why:?}");
    // The cross-host refusal, worded.
    let e = rs.resync(&w.mallory.did, &[other]).await.unwrap_err();
    let why = attempts(&e);
    assert!(why[0].contains("another host"), "{why:?}");
}
