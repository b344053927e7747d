//! The repository generated on demand (`riptide sim --huge-repo-bytes`): served over HTTP it
//! verifies with the key of the document the simulator's PLC directory serves; and a large one
//! is streamed while the simulator's memory stays bounded (peak RSS of this process, which runs
//! the simulator, grows by far less than the repository's size while the whole body is read).
//! One test per process (this file) so the peak RSS is this test's own.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;

use riptide_gen::HugeRepo;
use riptide_sim::{Faults, Network, PlanConfig, Sim};

/// `VmHWM` (peak resident set) of this process, in bytes.
fn peak_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .unwrap()
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .unwrap();
    kb * 1024
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_repository_verifies_and_streams_in_bounded_memory() {
    // Small: the whole body verifies against the served document.
    let mut net = Network::default();
    net.set_huge_repo(HugeRepo::new(11, 3 << 20, 2048).unwrap())
        .unwrap();
    let did = net.huge_repo().unwrap().account.did.clone();
    let sim = common::spawn(
        net,
        PlanConfig {
            hosts: 2,
            ..PlanConfig::default()
        },
    )
    .await;
    let base = sim.base_url();
    let http = reqwest::Client::new();
    let doc = common::json(&http, &format!("{base}/{did}")).await;
    let pds = doc["service"][0]["serviceEndpoint"].as_str().unwrap();
    assert_ne!(pds, base);
    let car = common::bytes(
        &http,
        &format!("{pds}/xrpc/com.atproto.sync.getRepo?did={did}"),
    )
    .await;
    let report = riptide_repo::verify_repo(&car, Some(&common::key_of(&doc))).unwrap();
    assert_eq!(report.did, did);
    let list = common::json(&http, &format!("{pds}/xrpc/com.atproto.sync.listRepos")).await;
    assert_eq!(list["repos"][0]["head"], report.commit.to_string());
    // A connection drop (the fault layer's) on the streamed body: at most half, then an error,
    // without the simulator collecting the body first.
    sim.sim.set_faults(Faults {
        drop_every: 1,
        ..Faults::default()
    });
    let mut r = http
        .get(format!("{pds}/xrpc/com.atproto.sync.getRepo?did={did}"))
        .send()
        .await
        .unwrap();
    let mut got = 0;
    let err = loop {
        match r.chunk().await {
            Ok(Some(c)) => got += c.len(),
            Ok(None) => panic!("the body was not cut"),
            Err(e) => break e,
        }
    };
    // At most half arrives (hyper may not flush the last of it before dropping the connection).
    assert!(got <= car.len() / 2, "{got} of {}: {err}", car.len());
    drop(sim);

    // Large: 256 MiB streamed, read chunk by chunk and dropped.
    const SIZE: u64 = 256 << 20;
    let mut net = Network::default();
    let huge = HugeRepo::new(12, SIZE, 8192).unwrap();
    let (did, len) = (huge.account.did.clone(), huge.car_len());
    assert!(len > SIZE * 9 / 10 && len < SIZE * 11 / 10, "{len}");
    net.set_huge_repo(huge).unwrap();
    let sim = Sim::spawn(
        net,
        SocketAddr::from(([127, 0, 0, 1], 0)),
        Faults::default(),
    )
    .await
    .unwrap();
    let before = peak_rss();
    let mut r = http
        .get(format!(
            "{}/xrpc/com.atproto.sync.getRepo?did={did}",
            sim.base_url()
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.headers()["content-length"].to_str().unwrap(),
        len.to_string()
    );
    let mut got = 0u64;
    while let Some(chunk) = r.chunk().await.unwrap() {
        got += chunk.len() as u64;
    }
    assert_eq!(got, len);
    let grew = peak_rss().saturating_sub(before);
    eprintln!(
        "streamed {} MiB; peak RSS {} MiB before, grew by {} KiB",
        len >> 20,
        before >> 20,
        grew >> 10
    );
    assert!(
        grew < 64 << 20,
        "peak RSS grew by {} MiB streaming {} MiB",
        grew >> 20,
        len >> 20
    );
}
