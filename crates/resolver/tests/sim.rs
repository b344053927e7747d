//! The resolver and the trust chain against `riptide-sim` on loopback: verdicts for a good
//! account and for each way the chain can break, the cache's coalescing, invalidation and
//! negative entries (counted at the server), faults, and the firehose key adapter on the real
//! capture.

#![allow(clippy::unwrap_used, clippy::expect_used)]
use std::net::SocketAddr;
use std::time::Duration;

use riptide_firehose::verify::{Verdict, Verifier};
use riptide_resolver::{
    peek_decoder, verify_handle, verify_resolving, ResolveError, Resolver, ResolverConfig,
    ResolverKeys, TrustOptions, TrustVerdict,
};
use riptide_sim::{fixture, Counters, Faults, Network, Sim, SimHandle};

const LOOPBACK: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 0);

async fn spawn(net: Network) -> SimHandle {
    Sim::spawn(net, LOOPBACK, Faults::default()).await.unwrap()
}

fn resolver(sim: &SimHandle) -> Resolver {
    Resolver::new(ResolverConfig {
        plc_url: sim.base_url(),
        handle_resolver: Some(sim.base_url()),
        timeout: Duration::from_secs(30),
        ..ResolverConfig::default()
    })
    .unwrap()
}

/// A network of: alice (good), mallory (tampered repository), wrongkey (document key of another
/// account), `liar.test` pointing at alice's DID (alice does not claim it), `ghost.test`
/// pointing at an unregistered DID.
fn network() -> Network {
    let alice = fixture::account(1, "alice.test", 40);
    let mallory = fixture::account(2, "mallory.test", 40);
    let wrong = fixture::account(3, "wrongkey.test", 40);
    let wrong_doc = fixture::doc(
        &wrong.did,
        "wrongkey.test",
        &fixture::key_for(9).public_key(),
        "https://x.invalid",
    );
    let mut net = Network::new(
        [alice.doc.clone(), mallory.doc.clone(), wrong_doc],
        [
            (alice.did.clone(), alice.car.clone()),
            (
                mallory.did.clone(),
                fixture::tamper_last_block(&mallory.car).into(),
            ),
            (wrong.did.clone(), wrong.car.clone()),
        ],
    )
    .unwrap();
    net.point_handle("liar.test", &alice.did);
    net.point_handle("ghost.test", &fixture::did_for(200));
    net
}

async fn run(r: &Resolver, handle: &str) -> riptide_resolver::TrustReport {
    let mut last = 0u64;
    let mut progress = |done: u64, _total: Option<u64>| {
        assert!(done >= last, "progress goes forward");
        last = done;
    };
    verify_handle(r, handle, &TrustOptions::default(), &mut progress).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trust_chain_verdicts() {
    let sim = spawn(network()).await;
    let r = resolver(&sim);

    let ok = run(&r, "Alice.Test").await;
    assert_eq!(ok.verdict, TrustVerdict::Ok, "{:?}", ok.reason);
    assert_eq!(ok.did.as_deref(), Some(fixture::did_for(1).as_str()));
    assert_eq!(
        ok.pds.as_deref(),
        Some(sim.base_url().as_str()),
        "the sim rewrites the PDS to itself"
    );
    let repo = ok.repo.as_ref().unwrap();
    assert_eq!(repo.records, 40);
    assert!(repo.signature_checked);
    assert_eq!(
        ok.bytes as usize,
        fixture::account(1, "alice.test", 40).car.len()
    );

    let cases = [
        ("mallory.test", TrustVerdict::BadBlockCid),
        ("wrongkey.test", TrustVerdict::BadSignature),
        ("liar.test", TrustVerdict::HandleMismatch),
        ("nobody.test", TrustVerdict::HandleNotFound),
        ("ghost.test", TrustVerdict::DidNotFound),
        ("not a handle", TrustVerdict::HandleNotFound),
    ];
    for (handle, want) in cases {
        let rep = run(&r, handle).await;
        assert_eq!(rep.verdict, want, "{handle}: {:?}", rep.reason);
        assert!(rep.reason.is_some(), "{handle}: a failure says why");
    }
    // The mismatch names both sides.
    let liar = run(&r, "liar.test").await;
    assert!(liar.reason.unwrap().contains("alice.test"));
}

/// The download is bounded: a repository larger than `max_repo_bytes` is refused with a clear
/// reason, not buffered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repository_over_the_size_limit_is_refused() {
    let sim = spawn(network()).await;
    let r = resolver(&sim);
    let opts = TrustOptions {
        max_repo_bytes: 1000,
    };
    let rep = verify_handle(&r, "alice.test", &opts, &mut |_, _| {}).await;
    assert_eq!(rep.verdict, TrustVerdict::FetchFailed, "{:?}", rep.reason);
    let why = rep.reason.unwrap();
    assert!(why.contains("larger than 1000 bytes"), "{why}");
    assert!(rep.repo.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn burst_of_lookups_makes_one_request() {
    let alice = fixture::account(1, "alice.test", 1);
    let sim = spawn(Network::new([alice.doc.clone()], []).unwrap()).await;
    // Slow answers make sure the burst overlaps the one request in flight.
    sim.sim.set_faults(Faults {
        delay_ms: 300,
        ..Faults::default()
    });
    let r = resolver(&sim);
    let mut tasks = Vec::new();
    for _ in 0..50 {
        let r = r.clone();
        let did = alice.did.clone();
        tasks.push(tokio::spawn(async move { r.resolve_did(&did).await }));
    }
    for t in tasks {
        let doc = t.await.unwrap().unwrap();
        assert_eq!(doc.did().as_str(), alice.did);
    }
    assert_eq!(
        Counters::get(&sim.sim.counters().plc),
        1,
        "50 lookups, one request"
    );
    let c = r.cache_counts();
    assert_eq!(c.fetches, 1);
    assert_eq!(c.coalesced + c.hits, 49);

    // Cached: no request.
    sim.sim.set_faults(Faults::default());
    r.resolve_did(&alice.did).await.unwrap();
    assert_eq!(Counters::get(&sim.sim.counters().plc), 1);
    // #identity: invalidate forces a refetch.
    r.invalidate(&alice.did);
    assert!(r.try_get(&alice.did).is_none());
    r.resolve_did(&alice.did).await.unwrap();
    assert_eq!(Counters::get(&sim.sim.counters().plc), 2);
    assert_eq!(r.cache_counts().invalidations, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn negative_entries_and_transient_failures() {
    let alice = fixture::account(1, "alice.test", 1);
    let sim = spawn(Network::new([alice.doc.clone()], []).unwrap()).await;
    let r = resolver(&sim);
    let ghost = fixture::did_for(77);
    for _ in 0..3 {
        assert_eq!(
            r.resolve_did(&ghost).await,
            Err(ResolveError::DidNotFound(ghost.clone()))
        );
    }
    assert_eq!(
        Counters::get(&sim.sim.counters().plc),
        1,
        "a definite miss is cached"
    );
    assert_eq!(r.cache_counts().negative_hits, 2);

    // A short negative TTL expires and the DID is asked again.
    let short = Resolver::new(ResolverConfig {
        negative_ttl: Duration::ZERO,
        ..r.config().clone()
    })
    .unwrap();
    short.resolve_did(&ghost).await.unwrap_err();
    short.resolve_did(&ghost).await.unwrap_err();
    assert_eq!(Counters::get(&sim.sim.counters().plc), 3);

    // 5xx: transient, reported as such, not cached.
    sim.sim.set_faults(Faults {
        error_every: 1,
        ..Faults::default()
    });
    let e = r.resolve_did(&alice.did).await.unwrap_err();
    assert!(e.is_transient(), "{e}");
    sim.sim.set_faults(Faults::default());
    r.resolve_did(&alice.did).await.unwrap();
    // The faulted request never reached the PLC handler: 3 + 1.
    assert_eq!(Counters::get(&sim.sim.counters().plc), 4);
    assert_eq!(Counters::get(&sim.sim.counters().errors_injected), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_during_the_chain() {
    let sim = spawn(network()).await;
    let r = resolver(&sim);
    sim.sim.set_faults(Faults {
        error_every: 1,
        ..Faults::default()
    });
    let rep = run(&r, "alice.test").await;
    assert_eq!(rep.verdict, TrustVerdict::ResolveFailed, "{:?}", rep.reason);

    // Resolution now cached; the repository download is cut half-way.
    sim.sim.set_faults(Faults::default());
    r.identity("alice.test").await.unwrap();
    // Request 1 (the handle, not cached) passes, request 2 (the download) is cut.
    sim.sim.set_faults(Faults {
        drop_every: 2,
        ..Faults::default()
    });
    let rep = run(&r, "alice.test").await;
    assert_eq!(rep.verdict, TrustVerdict::FetchFailed, "{:?}", rep.reason);
    assert_eq!(Counters::get(&sim.sim.counters().drops_injected), 1);
}

/// The real capture's frames, verified with keys resolved from a simulated PLC directory serving
/// the capture's own documents: every frame verifies, and each DID was fetched once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_capture_verifies_with_resolved_keys() {
    let Some(dir) = riptide_testdata::corpus() else {
        return;
    };
    let docs: serde_json::Value = serde_json::from_slice(
        &std::fs::read(dir.join("jetstream-2026-07/did_docs.json")).unwrap(),
    )
    .unwrap();
    let dids = docs.as_object().unwrap().len();
    let sim = spawn(Network::new(docs.as_object().unwrap().values().cloned(), []).unwrap()).await;
    let r = resolver(&sim);
    let file = std::fs::read(dir.join("jetstream-2026-07/firehose-frames.bin")).unwrap();
    let frames = riptide_firehose::corpus::split_frames(&file).unwrap();
    let mut verifier = Verifier::new(ResolverKeys::new(r.clone()));
    let mut peek = peek_decoder();
    for f in &frames {
        verify_resolving(&mut verifier, &mut peek, f.bytes).await;
    }
    let counts = verifier.counts();
    assert_eq!(counts.get(Verdict::Ok), 150, "{counts}");
    let mut distinct = std::collections::HashSet::new();
    for f in &frames {
        distinct.insert(riptide_resolver::keys::frame_did(&mut peek, f.bytes).unwrap());
    }
    assert!(
        distinct.len() >= dids,
        "{} DIDs in frames, {dids} documents",
        distinct.len()
    );
    let fetched = Counters::get(&sim.sim.counters().plc) as usize;
    // One fetch per DID, plus one if the #identity frame's DID appears again after it.
    assert!(
        fetched >= distinct.len() && fetched <= distinct.len() + 1,
        "{fetched} fetches, {} DIDs",
        distinct.len()
    );
    assert_eq!(
        verifier.keys().take_misses(),
        (vec![], 0),
        "warming left no miss"
    );

    // Without warming: the first commit is unknown-key (counted, not passed), its DID is a
    // recorded miss, and after resolving and forgetting the verifier's answer it verifies.
    let cold = Resolver::new(r.config().clone()).unwrap();
    let mut v = Verifier::new(ResolverKeys::new(cold.clone()));
    let first = frames
        .iter()
        .find(|f| v.check(f.bytes).kind == "commit")
        .unwrap();
    let mut v = Verifier::new(ResolverKeys::new(cold.clone()));
    assert_eq!(v.verify(first.bytes), Verdict::UnknownKey);
    let (missed, overflow) = v.keys().take_misses();
    assert_eq!((missed.len(), overflow), (1, 0));
    cold.resolve_did(&missed[0]).await.unwrap();
    v.forget_key(&missed[0]);
    assert_eq!(v.verify(first.bytes), Verdict::Ok);
}

/// A `429` of the PLC directory is waited out, not taken for a failed lookup: every third
/// answer of the sim is a `429` with `Retry-After: 1`; twelve accounts looked up at once all
/// resolve, each `429` paused every lookup (so the run takes at least a second per pause, and
/// the directory is not asked again during one), and the resolver counts them. A directory that
/// answers nothing but `429` fails a lookup as before (transient) once it has waited out
/// `MAX_WAITS` of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limited_plc_directory_is_waited_out_by_every_lookup() {
    let accounts: Vec<_> = (1..=12)
        .map(|i| fixture::account(i, &format!("a{i}.test"), 1))
        .collect();
    let sim = spawn(Network::new(accounts.iter().map(|a| a.doc.clone()), []).unwrap()).await;
    sim.sim.set_faults(Faults {
        rate_limit_every: 3,
        rate_limit_retry_after: Some(1),
        ..Faults::default()
    });
    let r = resolver(&sim);
    let t0 = std::time::Instant::now();
    let mut tasks = Vec::new();
    for a in &accounts {
        let (r, did) = (r.clone(), a.did.clone());
        tasks.push(tokio::spawn(async move { r.resolve_did(&did).await }));
    }
    for (t, a) in tasks.into_iter().zip(&accounts) {
        let doc = t.await.unwrap().unwrap();
        assert_eq!(doc.did().as_str(), a.did);
    }
    let limited = Counters::get(&sim.sim.counters().errors_injected);
    assert!(
        limited >= 4,
        "every third of at least 12 requests: {limited}"
    );
    assert_eq!(r.plc_rate_limited(), limited);
    assert!(
        t0.elapsed() >= Duration::from_secs(1),
        "the lookups did not wait: {:?}",
        t0.elapsed()
    );

    sim.sim.set_faults(Faults {
        rate_limit_every: 1,
        rate_limit_retry_after: Some(0),
        ..Faults::default()
    });
    let fresh = resolver(&sim);
    let e = fresh.resolve_did(&accounts[0].did).await.unwrap_err();
    assert!(
        matches!(e, ResolveError::Status { status: 429, .. }) && e.is_transient(),
        "{e}"
    );
    assert_eq!(
        fresh.plc_rate_limited(),
        u64::from(riptide_resolver::plc_pause::MAX_WAITS)
    );
}
