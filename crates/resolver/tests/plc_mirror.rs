//! `plc_export::pull` against the simulator's `/export`, and the resolver answering from the
//! mirror with no directory to ask.
//!
//! Oracle: the documents the simulator serves at `GET /did:plc:…` (signing key, handle, PDS),
//! which the mirror must reproduce from the signed operations alone.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use riptide_identity::plc::DidCheck;
use riptide_identity::DidDoc;
use riptide_resolver::plc_export::{pull, PullConfig};
use riptide_resolver::plc_mirror::PlcMirror;
use riptide_resolver::{ResolveError, Resolver, ResolverConfig};
use riptide_sim::{fixture, Counters, Faults, Network, Sim, SimHandle};

async fn sim(accounts: u8, faults: Faults) -> (SimHandle, Vec<String>) {
    let accts: Vec<_> = (1..=accounts)
        .map(|i| fixture::account(i, &format!("u{i}.test"), 1))
        .collect();
    let dids = accts.iter().map(|a| a.did.clone()).collect();
    let sim = Sim::spawn(
        Network::new(accts.iter().map(|a| a.doc.clone()), []).unwrap(),
        SocketAddr::from(([127, 0, 0, 1], 0)),
        faults,
    )
    .await
    .unwrap();
    (sim, dids)
}

fn cfg(sim: &SimHandle, check: DidCheck) -> PullConfig {
    PullConfig {
        plc_url: sim.base_url(),
        page: 3,
        did_check: check,
        backoff: Duration::from_millis(10),
        ..PullConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirror_of_the_sim_answers_every_did_as_the_sim_serves_it_with_no_directory() {
    // 429s and 503s along the way: waited out and retried, not lost.
    let faults = Faults {
        rate_limit_every: 4,
        rate_limit_retry_after: Some(0),
        error_every: 5,
        ..Faults::default()
    };
    let (sim, dids) = sim(10, faults).await;
    let dir = tempfile::tempdir().unwrap();
    let mirror = Arc::new(PlcMirror::open(dir.path()).unwrap());
    let http = reqwest::Client::new();
    let mut pages = 0;
    let (counts, rate_limited) = pull(&http, &mirror, &cfg(&sim, DidCheck::Count), &mut |_, _| {
        pages += 1
    })
    .await
    .unwrap();
    assert!(rate_limited > 0, "the sim's 429s were not seen");
    // 10 genesis operations and 3 updates (every fourth account), 3 to a page.
    assert_eq!(
        (counts.operations, counts.applied, counts.dids),
        (13, 13, 10)
    );
    assert_eq!(counts.did_underived, 10, "the sim's DIDs are not derived");
    assert!(counts.refused.is_empty(), "{counts:?}");
    assert_eq!(pages, 5);
    assert_eq!(Counters::get(&sim.sim.counters().plc), 0);

    let resolver = Resolver::new(ResolverConfig {
        plc_url: "http://127.0.0.1:9".into(),
        plc_mirror: Some(Arc::clone(&mirror)),
        timeout: Duration::from_secs(2),
        ..ResolverConfig::default()
    })
    .unwrap();
    sim.sim.set_faults(Faults::default());
    for did in &dids {
        let body = reqwest::get(format!("{}/{did}", sim.base_url()))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let want = DidDoc::from_json(&body).unwrap();
        let got = resolver.resolve_did(did).await.unwrap();
        assert_eq!(
            got.signing_key().unwrap(),
            want.signing_key().unwrap(),
            "{did}"
        );
        assert_eq!(got.pds(), want.pds(), "{did}");
        assert_eq!(got.handle(), want.handle(), "{did}");
    }
    assert_eq!(resolver.plc_mirror_lookups(), (10, 0));
    // A DID the mirror does not hold goes to the directory (here: nowhere), counted.
    let e = resolver
        .resolve_did("did:plc:zzzzzzzzzzzzzzzzzzzzzzzz")
        .await
        .unwrap_err();
    assert!(matches!(e, ResolveError::Network { .. }), "{e:?}");
    assert_eq!(resolver.plc_mirror_lookups(), (10, 1));

    // Caught up: a second pull asks one page after the cursor and applies nothing.
    let (again, _) = pull(&http, &mirror, &cfg(&sim, DidCheck::Count), &mut |_, _| {})
        .await
        .unwrap();
    assert_eq!(again.applied, 13);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_strict_mirror_refuses_every_underived_genesis_and_what_follows() {
    let (sim, _) = sim(8, Faults::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let mirror = PlcMirror::open(dir.path()).unwrap();
    let (counts, _) = pull(
        &reqwest::Client::new(),
        &mirror,
        &cfg(&sim, DidCheck::Strict),
        &mut |_, _| {},
    )
    .await
    .unwrap();
    assert_eq!(counts.applied, 0);
    assert_eq!(counts.refused["did_mismatch"], 8);
    // The updates follow genesis operations never applied.
    assert_eq!(counts.refused["unknown_prev"], 2);
}

/// A directory that answers every page with the same line: the pull stops with `Stuck` (the
/// repeat applied once, refused once), instead of asking forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_repeating_its_page_stops_the_pull() {
    let accts = [fixture::account(1, "u1.test", 1)];
    let sim = Sim::spawn(
        Network::new(accts.iter().map(|a| a.doc.clone()), []).unwrap(),
        SocketAddr::from(([127, 0, 0, 1], 0)),
        Faults::default(),
    )
    .await
    .unwrap();
    let line = reqwest::get(format!("{}/export?count=1", sim.base_url()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let app = axum::Router::new().route(
        "/export",
        axum::routing::get(move || {
            let line = line.clone();
            async move { line }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    let dir = tempfile::tempdir().unwrap();
    let mirror = PlcMirror::open(dir.path()).unwrap();
    let cfg = PullConfig {
        plc_url: format!("http://{addr}"),
        page: 1,
        did_check: DidCheck::Count,
        ..PullConfig::default()
    };
    let e = pull(&reqwest::Client::new(), &mirror, &cfg, &mut |_, _| {})
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            riptide_resolver::plc_export::PullError::Stuck { lines: 1, .. }
        ),
        "{e}"
    );
    // Applied once; the repeat read, refused and counted before the pull stopped.
    let c = mirror.counts().unwrap();
    assert_eq!((c.operations, c.applied), (2, 1), "{c:?}");
    assert_eq!(c.refused["duplicate"], 1, "{c:?}");
}
