//! Resync in the server's ingest, against `riptide-sim` on loopback (PLC and PDS): a generated
//! stream with one account's commit dropped breaks that account's chain; the account's
//! repository is fetched from the sim and verified, its frames held meanwhile are released in
//! order against the new state, and what is stored is the uninterrupted run's events plus one
//! `#sync` — per account in the same order. A forged repository is refused again and again
//! (`resync-failed`), nothing of the account is served, the held frames are durable, and a
//! restart against an honest host finishes the resync from the store alone.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use riptide_firehose::chain::SyncStatus;
use riptide_firehose::verify::{peek, Verdict};
use riptide_gen::network::did_docs;
use riptide_gen::{Config, Network};
use riptide_identity::DidDocs;
use riptide_resolver::{Resolver, ResolverConfig, ResyncConfig, Resyncer};
use riptide_serve::metrics::ResyncFailure;
use riptide_serve::resync::{ResyncLimits, ResyncService};
use riptide_serve::{
    ingest, IngestConfig, Keys, Log, Metrics, ReadLimit, Resume, Store, TailLimits,
};
use riptide_sim::{fixture, Faults, Sim, SimHandle};

const LOOPBACK: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 0);

/// A stream in two phases, the repositories as they are between them, and the account whose
/// second-to-last commit of phase one is dropped (so its last one breaks the chain).
struct World {
    /// Phase one without the dropped commit, then phase two.
    frames: Vec<Vec<u8>>,
    /// The same without the drop (what an uninterrupted run sees).
    whole: Vec<Vec<u8>>,
    docs: BTreeMap<String, serde_json::Value>,
    repos: Vec<(String, Bytes)>,
    victim: String,
    /// The victim's frames after the breaking commit.
    victim_after: usize,
    /// Where, among them, the first upstream `#sync` of the victim is.
    victim_sync: Option<usize>,
    /// With [`stale_world`]: the repositories as they were before the victim's chain tip (what
    /// a lagging mirror holds).
    old_repos: Vec<(String, Bytes)>,
    /// The repositories at the stream's end (what the PDS holds when phase two is over).
    end_repos: Vec<(String, Bytes)>,
    /// Upstream `#sync` frames in the stream, of any account.
    syncs: usize,
}

/// A world whose victim has an upstream `#sync` after its break (`with_sync`) or none.
fn world(seed: u64, with_sync: bool) -> World {
    (seed..seed + 50)
        .filter_map(|s| world_of(s, false).filter(|w| w.victim_sync.is_some() == with_sync))
        .next()
        .expect("a seed that gives the world asked for")
}

/// A world without any upstream `#sync` (each would resync its account: `crate::resync`, step
/// 5), so that every account but the victim is served exactly as without the break.
fn quiet_world(seed: u64) -> World {
    (seed..seed + 50)
        .filter_map(|s| world_of(s, false).filter(|w| w.syncs == 0))
        .next()
        .expect("a seed without #sync frames")
}

/// A world (without an upstream `#sync` of the victim) whose `old_repos` were exported before
/// the victim's last accepted commit: every one of them is older than its chain tip at the
/// break.
fn stale_world(seed: u64) -> World {
    (seed..seed + 50)
        .filter_map(|s| world_of(s, true).filter(|w| w.victim_sync.is_none()))
        .next()
        .expect("a seed that gives a stale world")
}

fn world_of(seed: u64, stale: bool) -> Option<World> {
    let mut cfg = Config::new(seed, 5, if stale { 150 } else { 300 });
    cfg.keep_records = true;
    cfg.threads = 1;
    let mut net = Network::new(cfg).unwrap();
    let mut one = Vec::new();
    let run = |net: &mut Network, out: &mut Vec<Vec<u8>>| {
        net.run(|f: &[u8]| -> Result<(), riptide_gen::GenError> {
            out.push(f.to_vec());
            Ok(())
        })
        .unwrap();
    };
    run(&mut net, &mut one);
    let mut old_repos = Vec::new();
    let early = one.len();
    if stale {
        old_repos = net
            .export_repos()
            .map(|r| r.map(|(d, c)| (d.to_owned(), Bytes::from(c))).unwrap())
            .collect();
        net.extend(150);
        run(&mut net, &mut one);
    }
    let repos: Vec<(String, Bytes)> = net
        .export_repos()
        .map(|r| r.map(|(d, c)| (d.to_owned(), Bytes::from(c))).unwrap())
        .collect();
    net.extend(200);
    let mut two = Vec::new();
    run(&mut net, &mut two);
    let end_repos: Vec<(String, Bytes)> = net
        .export_repos()
        .map(|r| r.map(|(d, c)| (d.to_owned(), Bytes::from(c))).unwrap())
        .collect();
    // The account with most commits in phase one, whose last event of phase one is a commit.
    let mut arena = riptide_cbor::Arena::new();
    let mut commits: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    let mut last: BTreeMap<String, &'static str> = BTreeMap::new();
    for (i, f) in one.iter().enumerate() {
        let p = peek(&mut arena, f);
        let did = p.did.unwrap().to_owned();
        last.insert(did.clone(), p.kind);
        if p.kind == "commit" {
            commits.entry(did).or_default().push(i);
        }
    }
    let (victim, idx) = commits
        .iter()
        .filter(|(d, c)| c.len() >= 3 && last[*d] == "commit")
        // A stale world's victim had its tip (the commit before the dropped one) after the export.
        .filter(|(_, c)| !stale || c[c.len() - 3] >= early)
        .max_by_key(|(_, c)| c.len())
        .map(|(d, c)| (d.clone(), c.clone()))?;
    let dropped = idx[idx.len() - 2];
    let after: Vec<&'static str> = two
        .iter()
        .map(|f| peek(&mut arena, f))
        .filter(|p| p.did == Some(victim.as_str()))
        .map(|p| p.kind)
        .collect();
    if after.is_empty() {
        return None;
    }
    let victim_after = after.len();
    let victim_sync = after.iter().position(|k| *k == "sync");
    let whole: Vec<Vec<u8>> = one.iter().chain(&two).cloned().collect();
    let syncs = whole
        .iter()
        .filter(|f| peek(&mut arena, f).kind == "sync")
        .count();
    let frames = one
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != dropped)
        .map(|(_, f)| f.clone())
        .chain(two.iter().cloned())
        .collect();
    Some(World {
        frames,
        whole,
        docs: did_docs(net.accounts()),
        repos,
        victim,
        victim_after,
        victim_sync,
        old_repos,
        end_repos,
        syncs,
    })
}

fn keys(w: &World) -> Keys {
    Keys::from_docs(DidDocs::from_slice(&serde_json::to_vec(&w.docs).unwrap()).unwrap())
}

async fn sim(w: &World, forged: bool, faults: Faults) -> SimHandle {
    sim_of(w, &w.repos, forged, faults).await
}

/// [`sim`] serving `repos`.
async fn sim_of(w: &World, repos: &[(String, Bytes)], forged: bool, faults: Faults) -> SimHandle {
    let repos = repos.iter().map(|(d, c)| {
        let c = if forged && *d == w.victim {
            Bytes::from(fixture::tamper_last_block(c))
        } else {
            c.clone()
        };
        (d.clone(), c)
    });
    let net = riptide_sim::Network::new(w.docs.values().cloned(), repos).unwrap();
    Sim::spawn(net, LOOPBACK, faults).await.unwrap()
}

fn limits() -> ResyncLimits {
    ResyncLimits {
        first_retry: Duration::from_millis(200),
        max_retry: Duration::from_millis(400),
        ..ResyncLimits::default()
    }
}

struct Running {
    stop: Option<riptide_serve::resync::ResyncStop>,
    tx: tokio::sync::mpsc::Sender<riptide_serve::Upstream>,
    handle: riptide_serve::IngestHandle,
    metrics: Arc<Metrics>,
    store: Store,
}

/// Ingest into `dir` with resync through `sim`'s PLC and PDS.
async fn start(dir: &std::path::Path, w: &World, sim: &SimHandle, resync: bool) -> Running {
    start_with(dir, w, sim, resync.then(ResyncConfig::default), Vec::new()).await
}

/// [`start`] with the resolver's resync settings (`None`: no resync).
async fn start_with(
    dir: &std::path::Path,
    w: &World,
    sim: &SimHandle,
    resync: Option<ResyncConfig>,
    relays: Vec<String>,
) -> Running {
    start_with_limits(dir, w, sim, resync, relays, limits()).await
}

/// [`start_with`] under `limits`.
async fn start_with_limits(
    dir: &std::path::Path,
    w: &World,
    sim: &SimHandle,
    resync: Option<ResyncConfig>,
    relays: Vec<String>,
    limits: ResyncLimits,
) -> Running {
    start_cut(dir, w, sim, resync, relays, limits, None).await
}

/// [`start_with_limits`] whose ingest is handed only the first `pieces` landing pieces the
/// resync service verifies (`None`: all of them); the rest are dropped, as a crash between
/// pieces loses them.
async fn start_cut(
    dir: &std::path::Path,
    w: &World,
    sim: &SimHandle,
    resync: Option<ResyncConfig>,
    relays: Vec<String>,
    limits: ResyncLimits,
    pieces: Option<usize>,
) -> Running {
    // A restart in-process waits for the first run's resync service to let go of the store.
    let (store, resume) = common::reopen(dir, 0, riptide_serve::StoreOptions::default()).await;
    let log = Arc::new(Log::new(
        store.clone(),
        resume.next_seq,
        TailLimits::default(),
    ));
    let metrics = Arc::new(Metrics::default());
    let mut cfg = IngestConfig::verifying(keys(w));
    cfg.workers = 3;
    cfg.max_batch = 40;
    let wiring = resync.map(|rcfg| {
        let resolver = Resolver::new(ResolverConfig {
            plc_url: sim.base_url(),
            timeout: Duration::from_secs(30),
            ..ResolverConfig::default()
        })
        .unwrap();
        ResyncService::start(
            Resyncer::new(resolver, rcfg),
            relays.clone(),
            limits,
            store.clone(),
            metrics.clone(),
        )
    });
    let mut wiring = wiring;
    if let (Some(wiring), Some(pieces)) = (wiring.as_mut(), pieces) {
        let (cut, landings) = tokio::sync::mpsc::unbounded_channel();
        let mut verified = std::mem::replace(&mut wiring.landings, landings);
        tokio::spawn(async move {
            let mut handed = 0;
            while let Some(l) = verified.recv().await {
                if handed < pieces {
                    handed += 1;
                    let _ = cut.send(l);
                }
            }
        });
    }
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let stop = wiring.as_ref().map(|w| w.stopper());
    let handle = ingest::spawn_with_resync(cfg, log, metrics.clone(), resume, rx, wiring).unwrap();
    Running {
        stop,
        tx,
        handle,
        metrics,
        store,
    }
}

async fn feed(r: &Running, frames: &[Vec<u8>], first: u64) {
    for (i, f) in frames.iter().enumerate() {
        r.tx.send((first + i as u64, Bytes::copy_from_slice(f)).into())
            .await
            .unwrap();
    }
}

/// An honest host (PLC and PDS) with `faults`, and ingest into a fresh directory resyncing
/// through it with `resync` (asking `relays` first), fed every frame of `w` from seq 1: the host,
/// the directory (both kept alive by the caller) and the running ingest.
async fn fed(
    w: &World,
    faults: Faults,
    resync: ResyncConfig,
    relays: Vec<String>,
) -> (SimHandle, tempfile::TempDir, Running) {
    let host = sim(w, false, faults).await;
    let dir = tempfile::tempdir().unwrap();
    let r = start_with(dir.path(), w, &host, Some(resync), relays).await;
    feed(&r, &w.frames, 1).await;
    (host, dir, r)
}

/// A host that answers each request after `delay_ms`.
fn slowed(delay_ms: u64) -> Faults {
    Faults {
        delay_ms,
        ..Faults::default()
    }
}

/// Ends the source and waits for ingest (which waits for the resyncs it caused).
async fn stop(r: Running) -> (Arc<Metrics>, Store, Resume) {
    drop(r.tx);
    let h = r.handle;
    let s = tokio::task::spawn_blocking(move || h.join())
        .await
        .unwrap()
        .unwrap();
    (r.metrics, r.store, s.resume)
}

async fn wait_for(what: &str, mut ok: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !ok() {
        assert!(
            t0.elapsed() < Duration::from_secs(90),
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Stored events per DID: (kind, the JSON without its time_us and cursor).
fn per_did(store: &Store) -> BTreeMap<String, Vec<(String, String)>> {
    let mut out: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    let mut from = 0;
    loop {
        let mut evs = Vec::new();
        store
            .read_from(
                from,
                ReadLimit {
                    events: 1000,
                    bytes: usize::MAX,
                },
                &mut evs,
            )
            .unwrap();
        let Some(last) = evs.last() else { break };
        from = last.seq() + 1;
        for e in &evs {
            let mut v: serde_json::Value = serde_json::from_slice(&e.json()).unwrap();
            let m = v.as_object_mut().unwrap();
            m.remove("time_us");
            m.remove("cursor");
            let did = String::from_utf8(e.did().to_vec()).unwrap();
            out.entry(did)
                .or_default()
                .push((format!("{:?}", e.kind()), v.to_string()));
        }
    }
    out
}

fn count(m: &Metrics, v: Verdict) -> u64 {
    m.verdict_count(v)
}

/// `did`'s repository among `repos` as `riptide repo ls` lists it: (`collection/rkey`, CID),
/// in MST key order.
fn listing(repos: &[(String, Bytes)], did: &str) -> Vec<(String, String)> {
    let car = &repos.iter().find(|(d, _)| d == did).unwrap().1;
    let mut reader = riptide_car::CarReader::new();
    let c = reader
        .read(car, &riptide_car::CarOptions::repository())
        .unwrap();
    riptide_repo::list_records(&c)
        .unwrap()
        .into_iter()
        .map(|(k, cid)| (k, cid.to_string()))
        .collect()
}

/// Stored commit events (as [`per_did`] gives them) that must all be creates: (`collection/rkey`,
/// CID).
fn creates(events: &[(String, String)]) -> Vec<(String, String)> {
    events
        .iter()
        .map(|(k, json)| {
            assert_eq!(k, "Replacement", "{json}");
            let v: serde_json::Value = serde_json::from_str(json).unwrap();
            let c = &v["commit"];
            assert_eq!(c["operation"], "create", "{json}");
            (
                format!(
                    "{}/{}",
                    c["collection"].as_str().unwrap(),
                    c["rkey"].as_str().unwrap()
                ),
                c["cid"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// An account rebuilt from its stored events as a v2 subscriber does: a `#sync` drops what it
/// held, commits create, update and delete.
fn fold(events: &[(String, String)]) -> BTreeMap<String, String> {
    let mut held = BTreeMap::new();
    for (k, json) in events {
        let v: serde_json::Value = serde_json::from_str(json).unwrap();
        match k.as_str() {
            "Sync" => held.clear(),
            "Commit" | "Replacement" => {
                let c = &v["commit"];
                let key = format!(
                    "{}/{}",
                    c["collection"].as_str().unwrap(),
                    c["rkey"].as_str().unwrap()
                );
                match c["operation"].as_str().unwrap() {
                    "delete" => {
                        held.remove(&key);
                    }
                    _ => {
                        held.insert(key, c["cid"].as_str().unwrap().to_owned());
                    }
                }
            }
            _ => {}
        }
    }
    held
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_chain_is_resynced_and_held_frames_are_released_in_order() {
    let w = quiet_world(31);
    // The reference: the uninterrupted stream, no resync needed.
    let rdir = tempfile::tempdir().unwrap();
    let quiet = sim(&w, false, Faults::default()).await;
    let r = start(rdir.path(), &w, &quiet, false).await;
    feed(&r, &w.whole, 1).await;
    let (rm, rstore, _) = stop(r).await;
    assert_eq!(count(&rm, Verdict::Ok), w.whole.len() as u64);
    let reference = per_did(&rstore);

    // The sim answers slowly, so the victim's phase-two frames arrive while it is resyncing.
    let (slow, _dir, r) = fed(&w, slowed(3000), ResyncConfig::default(), Vec::new()).await;
    let m = r.metrics.clone();
    let all = w.victim_after as u64;
    wait_for("the victim's later frames held", || {
        m.resync_held.load(Relaxed) == all
    })
    .await;
    assert_eq!(m.resync_landed.load(Relaxed), 0);
    wait_for("the resync to land", || {
        m.resync_landed.load(Relaxed) == 1 && m.resync_held.load(Relaxed) == 0
    })
    .await;
    let (m, store, resume) = stop(r).await;
    assert_eq!(resume.upstream_cursor, Some(w.frames.len() as u64));
    assert_eq!(count(&m, Verdict::ChainBreak), 1, "the dropped commit");
    assert_eq!(count(&m, Verdict::ResyncFailed), 0);
    assert_eq!(count(&m, Verdict::ResyncOverflow), 0);
    assert_eq!(count(&m, Verdict::RevRegression), 0);
    // Every frame but the breaking one verified, the held ones included.
    assert_eq!(count(&m, Verdict::Ok), w.frames.len() as u64 - 1);
    assert_eq!(m.resync_queued.load(Relaxed), 1);
    assert!(
        slow.sim.counters().get_repo.load(Relaxed) >= 1,
        "fetched from the sim"
    );

    let got = per_did(&store);
    assert_eq!(got.len(), reference.len());
    for (did, want) in &reference {
        let have = &got[did];
        if *did != w.victim {
            assert_eq!(
                have, want,
                "{did}: untouched accounts are served as without the break"
            );
            continue;
        }
        // The victim: its events up to the dropped commit, then (the dropped and the breaking
        // commits' events missing) one #sync, its repository's records as replacement
        // creates, then everything after, in order.
        let sync_at = have
            .iter()
            .position(|(k, _)| k == "Sync")
            .expect("a #sync for the resynced account");
        assert_eq!(
            have.iter().filter(|(k, _)| k == "Sync").count(),
            1,
            "one #sync"
        );
        let repo = listing(&w.repos, did);
        let n = repo.len();
        assert!(n > 0);
        assert_eq!(
            creates(&have[sync_at + 1..sync_at + 1 + n]),
            repo,
            "the repository's records, in MST key order, after the #sync"
        );
        assert_eq!(m.replacement_rows.load(Relaxed), n as u64);
        assert_eq!(m.replaced_repositories.load(Relaxed), 1);
        let before = &have[..sync_at];
        let after = &have[sync_at + 1 + n..];
        assert!(want.starts_with(before), "the prefix is the reference's");
        assert!(want.ends_with(after), "the rest is the reference's tail");
        assert!(
            after.len() >= w.victim_after,
            "phase two's events of the victim were released: {} < {}",
            after.len(),
            w.victim_after
        );
        assert!(
            before.len() + after.len() < want.len(),
            "the gap is not served"
        );
        // The #sync carries the verified commit: a CAR whose root is the commit block, signed
        // by the account (it verifies as an upstream #sync would).
        let sync: serde_json::Value = serde_json::from_str(&have[sync_at].1).unwrap();
        assert_eq!(sync["did"], serde_json::json!(w.victim));
        assert_eq!(sync["sync"]["did"], serde_json::json!(w.victim));
        let wrapped = serde_json::json!({ "b": sync["sync"]["blocks"] });
        let Ok(riptide_cbor::OwnedValue::Map(m)) = riptide_cbor::json_to_value(&wrapped) else {
            panic!("blocks is not $bytes");
        };
        let Some(riptide_cbor::OwnedValue::Bytes(bytes)) = m.get("b") else {
            panic!("blocks is not $bytes");
        };
        let mut reader = riptide_car::CarReader::new();
        let c = reader
            .read(bytes, &riptide_car::CarOptions::default())
            .unwrap();
        assert_eq!(c.len(), 1, "the commit block alone");
        let commit = riptide_repo::Commit::decode(c.block(0).unwrap().data).unwrap();
        assert_eq!(
            serde_json::json!(commit.rev()),
            sync["sync"]["rev"],
            "the rev of the commit it carries"
        );
    }
    // Nothing held, the account synchronized at its last commit.
    assert!(store.held().unwrap().is_empty());
    let state = store.account(&w.victim).unwrap().unwrap();
    assert_eq!(state.sync, SyncStatus::Synchronized);
    let rstate = rstore.account(&w.victim).unwrap().unwrap();
    assert_eq!(
        state.tip, rstate.tip,
        "the same chain tip as the uninterrupted run"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_repository_serves_nothing_and_a_restart_finishes_the_resync() {
    let w = world(32, false);
    let forged = sim(&w, true, Faults::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let r = start(dir.path(), &w, &forged, true).await;
    feed(&r, &w.frames, 1).await;
    let m = r.metrics.clone();
    let held = w.victim_after as u64;
    wait_for("two failed resyncs and every later frame held", || {
        m.verdict_count(Verdict::ResyncFailed) >= 2 && m.resync_held.load(Relaxed) == held
    })
    .await;
    // Stopped with the resync unfinished (as a crash would leave it; its state is durable).
    r.stop.as_ref().unwrap().stop();
    let (m, store, _) = stop(r).await;
    assert_eq!(m.resync_landed.load(Relaxed), 0);
    assert_eq!(count(&m, Verdict::ChainBreak), 1);
    // Nothing of the victim after the break is stored; its frames are, held.
    let got = per_did(&store);
    assert!(!got[&w.victim].iter().any(|(k, _)| k == "Sync"));
    let pending = store.held().unwrap();
    assert_eq!(
        pending
            .iter()
            .filter(|(d, s, _)| *d == w.victim && *s == 0)
            .count(),
        1,
        "the queue mark"
    );
    assert_eq!(
        pending.len() as u64,
        held + 1,
        "every held frame is durable"
    );
    assert_eq!(
        store.account(&w.victim).unwrap().unwrap().sync,
        SyncStatus::Resyncing
    );
    let before = got[&w.victim].len();
    drop(store);

    // A restart with nothing new from upstream, against an honest host: the resync is queued
    // again from the store, lands, and the held frames are served.
    let honest = sim(&w, false, Faults::default()).await;
    let r = start(dir.path(), &w, &honest, true).await;
    assert_eq!(r.metrics.resync_held.load(Relaxed), held, "reloaded");
    let m = r.metrics.clone();
    wait_for("the resync to land after the restart", || {
        m.resync_landed.load(Relaxed) == 1
    })
    .await;
    let (m, store, _) = stop(r).await;
    assert_eq!(m.resync_held.load(Relaxed), 0);
    assert_eq!(count(&m, Verdict::Ok), held);
    assert!(store.held().unwrap().is_empty());
    let got = per_did(&store);
    let victim = &got[&w.victim];
    assert_eq!(victim[before].0, "Sync");
    assert!(victim.len() as u64 > before as u64 + held / 2);
    assert_eq!(
        store.account(&w.victim).unwrap().unwrap().sync,
        SyncStatus::Synchronized
    );
}

/// An upstream `#sync` of an account that is being resynced (the host is too slow for the
/// resync to land first) moves its tip to the `#sync`'s commit and keeps it resyncing; the
/// repository that lands (the host's, as of the stream's end) replaces the account's rows: one
/// `#sync` of riptide's (the upstream one is not stored), then its records, and the frames held
/// meanwhile are inside it (`superseded`). Every other account with an upstream `#sync` is
/// resynced the same way. Folding each account's stored events as a v2 subscriber does (a
/// `#sync` drops the account) gives exactly its repository at the stream's end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_sync_is_resynced_and_its_repository_replaces_the_account() {
    let w = world(40, true);
    let host = sim_of(&w, &w.end_repos, false, slowed(4000)).await;
    let dir = tempfile::tempdir().unwrap();
    let r = start_with(
        dir.path(),
        &w,
        &host,
        Some(ResyncConfig::default()),
        Vec::new(),
    )
    .await;
    feed(&r, &w.frames, 1).await;
    let m = r.metrics.clone();
    // The break's resync and one per upstream #sync are queued (the victim's #sync while its
    // resync is in flight); all land.
    let queued = 1 + w.syncs as u64;
    wait_for("every resync to land", || {
        m.resync_queued.load(Relaxed) == queued
            && m.resync_accounts.load(Relaxed) == 0
            && m.resync_in_flight.load(Relaxed) == 0
    })
    .await;
    let (m, store, _) = stop(r).await;
    assert_eq!(count(&m, Verdict::ChainBreak), 1);
    assert_eq!(
        m.resync_stale.load(Relaxed),
        0,
        "the host's repositories are current"
    );
    assert_eq!(count(&m, Verdict::ResyncFailed), 0);
    assert_eq!(count(&m, Verdict::RevRegression), 0);
    assert_eq!(
        count(&m, Verdict::Ok) + count(&m, Verdict::Superseded),
        w.frames.len() as u64 - 1
    );
    let landed = m.resync_landed.load(Relaxed);
    assert!(landed >= 1 && landed <= queued, "{landed}");
    assert_eq!(m.replaced_repositories.load(Relaxed), landed);
    assert!(store.held().unwrap().is_empty());
    let state = store.account(&w.victim).unwrap().unwrap();
    assert_eq!(state.sync, SyncStatus::Synchronized);

    let got = per_did(&store);
    let syncs: usize = got
        .values()
        .map(|evs| evs.iter().filter(|(k, _)| k == "Sync").count())
        .sum();
    assert_eq!(
        syncs as u64, landed,
        "one #sync per replacement, none from upstream"
    );
    let mut rows = 0;
    for (did, evs) in &got {
        let Some(at) = evs.iter().rposition(|(k, _)| k == "Sync") else {
            assert_ne!(*did, w.victim, "the victim was resynced");
            continue;
        };
        let end: BTreeMap<String, String> = listing(&w.end_repos, did).into_iter().collect();
        assert_eq!(fold(evs), end, "{did} rebuilt from its events");
        // Its records right after its #sync; nothing of the account after them (the host's
        // repository is as of the stream's end).
        assert_eq!(evs.len() - at - 1, end.len(), "{did}");
        rows += end.len() as u64;
    }
    // Every replacement row is counted: the creates at each #sync's rev right after it.
    let mut replacement = 0;
    for evs in got.values() {
        for (i, (k, json)) in evs.iter().enumerate() {
            if k != "Sync" {
                continue;
            }
            let v: serde_json::Value = serde_json::from_str(json).unwrap();
            let rev = &v["sync"]["rev"];
            replacement += evs[i + 1..]
                .iter()
                .take_while(|(k, j)| {
                    let c: serde_json::Value = serde_json::from_str(j).unwrap();
                    k == "Replacement"
                        && c["commit"]["rev"] == *rev
                        && c["commit"]["operation"] == "create"
                })
                .count() as u64;
        }
    }
    assert!(replacement >= rows);
    assert_eq!(m.replacement_rows.load(Relaxed), replacement);
}

/// Issue 40: `Retry-After: 18446744073709551615` on `getRepo` overflowed `Instant + Duration`
/// and killed the resync task, its account in flight forever and its frames never served. The
/// header is now capped (here at a second): the attempt is a counted failure, the account is
/// retried, and it recovers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_absurd_retry_after_is_capped_and_the_account_recovers() {
    let w = world(31, false);
    // Request 1 is the DID document; request 2, the first getRepo, is a 429.
    let faults = Faults {
        rate_limit_every: 2,
        rate_limit_retry_after: Some(u64::MAX),
        ..Faults::default()
    };
    let capped = ResyncConfig {
        max_retry_after: Duration::from_secs(1),
        ..ResyncConfig::default()
    };
    let (host, _dir, r) = fed(&w, faults, capped, Vec::new()).await;
    let m = r.metrics.clone();
    wait_for("the resync to land after the 429", || {
        m.resync_landed.load(Relaxed) == 1 && m.resync_held.load(Relaxed) == 0
    })
    .await;
    let (m, store, _) = stop(r).await;
    assert_eq!(
        host.sim.counters().errors_injected.load(Relaxed),
        1,
        "one 429"
    );
    // The 429 and each retry while the host was left alone: counted, none a dead task.
    assert!(m.resync_failure_count(ResyncFailure::Sources) >= 1);
    assert_eq!(m.resync_failure_count(ResyncFailure::Panicked), 0);
    assert_eq!(
        count(&m, Verdict::ResyncFailed),
        m.resync_failure_count(ResyncFailure::Sources)
    );
    assert!(store.held().unwrap().is_empty());
    assert_eq!(
        store.account(&w.victim).unwrap().unwrap().sync,
        SyncStatus::Synchronized
    );
    assert_eq!(count(&m, Verdict::Ok), w.frames.len() as u64 - 1);
}

/// Issue 40: a relay whose `getRepo` answered an older, validly signed repository was asked
/// first, every time; the repository landed stale, the account was queued again, and the PDS,
/// which had the right one, was never asked. A stale answer is now a failed source: the next
/// (the PDS) is asked in the same attempt, and the stale answer is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_mirror_is_skipped_for_the_pds_and_counted() {
    let w = stale_world(50);
    // The "relay": a host whose getRepo serves the old repositories.
    let old =
        riptide_sim::Network::new(w.docs.values().cloned(), w.old_repos.iter().cloned()).unwrap();
    let mirror = Sim::spawn(old, LOOPBACK, Faults::default()).await.unwrap();
    // The PLC and the PDS (the documents name it): the repositories as they are. Its first
    // getRepo (request 2, after the document) is a 429, so that one attempt fails whole.
    let faults = Faults {
        rate_limit_every: 2,
        ..Faults::default()
    };
    let relay = format!("ws://{}/xrpc/com.atproto.sync.subscribeRepos", mirror.addr);
    let (pds, _dir, r) = fed(&w, faults, ResyncConfig::default(), vec![relay]).await;
    let m = r.metrics.clone();
    wait_for("the resync to land from the PDS", || {
        m.resync_landed.load(Relaxed) == 1 && m.resync_held.load(Relaxed) == 0
    })
    .await;
    let (m, store, _) = stop(r).await;
    let asked = |s: &SimHandle| s.sim.counters().get_repo.load(Relaxed);
    assert!(asked(&mirror) >= 2, "the mirror was asked first each time");
    // Then the PDS: a 429 (not counted as a getRepo served), then the repository.
    assert_eq!(pds.sim.counters().errors_injected.load(Relaxed), 1);
    assert_eq!(asked(&pds), 1);
    // Every stale answer counted as a failure; none landed.
    assert_eq!(m.resync_failure_count(ResyncFailure::Stale), asked(&mirror));
    assert_eq!(m.resync_stale.load(Relaxed), 0, "nothing stale landed");
    assert_eq!(
        count(&m, Verdict::ResyncFailed),
        m.resync_failure_count(ResyncFailure::Stale)
            + m.resync_failure_count(ResyncFailure::Sources)
    );
    assert_eq!(m.resync_queued.load(Relaxed), 1, "queued once");
    let state = store.account(&w.victim).unwrap().unwrap();
    assert_eq!(state.sync, SyncStatus::Synchronized);
    assert!(store.held().unwrap().is_empty());
    assert_eq!(count(&m, Verdict::Ok), w.frames.len() as u64 - 1);
}

/// `serve --backfill --backfill-hold all` (`BackfillHold::AllFetching`): an account the store
/// already knows (it committed before the backfill began) is held while its repository is
/// fetched, and only then; the others that are known are served live. Released (its failure
/// or landing settled), its frames are verified in order on its state: what the store holds of
/// every account is then what a run without a backfill stores.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hold_all_holds_a_known_account_while_its_repository_is_fetched() {
    use riptide_serve::backfill::BackfillHold;
    let w = quiet_world(11);
    let host = sim(&w, false, Faults::default()).await;
    // Split where every account has committed: from there on, all are known.
    let mut arena = riptide_cbor::Arena::new();
    let mut seen = std::collections::BTreeSet::new();
    let all: std::collections::BTreeSet<String> = w
        .whole
        .iter()
        .filter_map(|f| peek(&mut arena, f).did.map(str::to_owned))
        .collect();
    let split = w
        .whole
        .iter()
        .position(|f| {
            let p = peek(&mut arena, f);
            if p.kind == "commit" {
                seen.insert(p.did.unwrap().to_owned());
            }
            seen.len() == all.len()
        })
        .unwrap()
        + 1;
    let held: usize = w.whole[split..]
        .iter()
        .filter(|f| peek(&mut arena, f).did == Some(w.victim.as_str()))
        .count();
    assert!(held > 0 && split < w.whole.len());

    let dir = tempfile::tempdir().unwrap();
    let r = start(dir.path(), &w, &host, true).await;
    feed(&r, &w.whole[..split], 1).await;
    let fetching = Arc::new(riptide_backfill::Fetching::default());
    fetching.start(&w.victim);
    r.tx.send(riptide_serve::Upstream::BackfillStart(
        BackfillHold::AllFetching(fetching.clone()),
    ))
    .await
    .unwrap();
    feed(&r, &w.whole[split..], split as u64 + 1).await;
    let total = w.whole.len() as u64;
    wait_for("every frame durable", || {
        r.metrics.upstream_seq.load(Relaxed) == total
    })
    .await;
    // Only the account being fetched is held, every frame of it since the backfill began.
    assert_eq!(r.metrics.resync_held_accounts.load(Relaxed), 1);
    assert_eq!(r.metrics.resync_held.load(Relaxed), held as u64);
    // Its fetch failed: its frames are released, verified in order.
    let (ack, told) = std::sync::mpsc::sync_channel(1);
    r.tx.send(riptide_serve::Upstream::BackfillSettled(
        w.victim.as_str().into(),
        ack,
    ))
    .await
    .unwrap();
    tokio::task::spawn_blocking(move || told.recv().unwrap())
        .await
        .unwrap();
    assert!(!fetching.contains(&w.victim));
    assert_eq!(r.metrics.resync_held.load(Relaxed), 0);
    r.tx.send(riptide_serve::Upstream::BackfillOver)
        .await
        .unwrap();
    let (m, store, _) = stop(r).await;
    assert_eq!(count(&m, Verdict::ChainBreak), 0);

    // The same frames without a backfill.
    let plain = tempfile::tempdir().unwrap();
    let p = start(plain.path(), &w, &host, true).await;
    feed(&p, &w.whole, 1).await;
    let (_, plain_store, _) = stop(p).await;
    assert_eq!(per_did(&store), per_did(&plain_store));
}

/// A resync in pieces of 1,000 records (`ResyncLimits::landing_records`; `crate::resync`, "In
/// pieces"; the victim's repository has about 6,000) stores, account by account, what the same resync in one piece stores: one `#sync`,
/// then every record of the repository once in MST key order, then the held frames released
/// in order; counted as one replaced repository.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resync_in_pieces_stores_what_one_piece_stores() {
    let w = quiet_world(31);
    let n = listing(&w.repos, &w.victim).len();
    assert!(n > 2000, "{n} records: too few for pieces of 1,000");
    let mut stored = Vec::new();
    for piece in [usize::MAX, 1000] {
        let host = sim(&w, false, slowed(100)).await;
        let dir = tempfile::tempdir().unwrap();
        let r = start_with_limits(
            dir.path(),
            &w,
            &host,
            Some(ResyncConfig::default()),
            Vec::new(),
            ResyncLimits {
                landing_records: piece,
                ..limits()
            },
        )
        .await;
        feed(&r, &w.frames, 1).await;
        let m = r.metrics.clone();
        wait_for("the resync to land", || {
            m.resync_landed.load(Relaxed) == 1 && m.resync_held.load(Relaxed) == 0
        })
        .await;
        let (m, store, _) = stop(r).await;
        assert_eq!(m.replaced_repositories.load(Relaxed), 1);
        assert_eq!(m.replacement_rows.load(Relaxed), n as u64);
        assert_eq!(count(&m, Verdict::ChainBreak), 1, "the dropped commit");
        // The #sync's body says when it landed: its kind only.
        let mut got = per_did(&store);
        for evs in got.values_mut() {
            for e in evs.iter_mut().filter(|(k, _)| k == "Sync") {
                e.1.clear();
            }
        }
        stored.push(got);
    }
    assert_eq!(stored[0], stored[1]);
}

/// A resync in pieces of 1,000 records stopped once two of them are durable (the rest never
/// reach ingest, as after `kill -9` between pieces: `crate::resync`, "In pieces") leaves the
/// account resyncing, its frames held; at the next start it is resynced again and lands whole:
/// a v2 subscriber folding the account's events (a `#sync` drops what it held) holds exactly
/// its repository at the stream's end (the sim's, listed as `riptide repo ls` lists it), and
/// after the last `#sync` each record of the fetched repository comes once, in MST key order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resync_stopped_between_pieces_is_resynced_whole_at_the_next_start() {
    let w = quiet_world(31);
    let repo = listing(&w.repos, &w.victim);
    let n = repo.len();
    assert!(n > 3000, "{n} records: too few for three pieces of 1,000");
    let in_pieces = ResyncLimits {
        landing_records: 1000,
        ..limits()
    };
    let host = sim(&w, false, slowed(100)).await;
    let dir = tempfile::tempdir().unwrap();
    let r = start_cut(
        dir.path(),
        &w,
        &host,
        Some(ResyncConfig::default()),
        Vec::new(),
        in_pieces.clone(),
        Some(2),
    )
    .await;
    feed(&r, &w.frames, 1).await;
    let m = r.metrics.clone();
    wait_for("two pieces durable", || {
        m.replacement_rows.load(Relaxed) == 2000
    })
    .await;
    r.stop.as_ref().unwrap().stop();
    let (m, store, _) = stop(r).await;
    assert_eq!(m.resync_landed.load(Relaxed), 0);
    assert_eq!(
        m.replacement_rows.load(Relaxed),
        2000,
        "two pieces, no more"
    );
    let got = per_did(&store);
    let first = &got[&w.victim];
    let sync_at = first.iter().position(|(k, _)| k == "Sync").unwrap();
    assert_eq!(creates(&first[sync_at + 1..]), repo[..2000], "two pieces");
    assert_eq!(
        store.account(&w.victim).unwrap().unwrap().sync,
        SyncStatus::Resyncing,
        "still awaiting resync between pieces"
    );
    let held = store.held().unwrap().len();
    drop(store);

    let r = start_with_limits(
        dir.path(),
        &w,
        &host,
        Some(ResyncConfig::default()),
        Vec::new(),
        in_pieces,
    )
    .await;
    assert_eq!(
        r.metrics.resync_held.load(Relaxed) as usize + 1,
        held,
        "the held frames and the queue mark reloaded"
    );
    let m = r.metrics.clone();
    wait_for("the resync to land after the restart", || {
        m.resync_landed.load(Relaxed) == 1 && m.resync_held.load(Relaxed) == 0
    })
    .await;
    let (m, store, _) = stop(r).await;
    assert_eq!(m.replaced_repositories.load(Relaxed), 1);
    assert_eq!(m.replacement_rows.load(Relaxed), n as u64, "landed whole");
    assert!(store.held().unwrap().is_empty());
    assert_eq!(
        store.account(&w.victim).unwrap().unwrap().sync,
        SyncStatus::Synchronized
    );
    let got = per_did(&store);
    let victim = &got[&w.victim];
    assert!(victim.starts_with(first), "the first run's events stay");
    let syncs: Vec<usize> = (0..victim.len())
        .filter(|&i| victim[i].0 == "Sync")
        .collect();
    assert_eq!(
        syncs,
        [sync_at, first.len()],
        "a new #sync after the pieces"
    );
    assert_eq!(
        creates(&victim[first.len() + 1..first.len() + 1 + n]),
        repo,
        "each record once after the last #sync"
    );
    assert_eq!(
        fold(victim),
        listing(&w.end_repos, &w.victim).into_iter().collect(),
        "the fold is the repository at the stream's end"
    );
}
