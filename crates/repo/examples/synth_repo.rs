//! Generates a synthetic signed repository (default 200,000 records of ~300 bytes, ~70 MB CAR)
//! and times `verify_repo` on it, phase by phase. Optionally writes the CAR.
//!
//! `cargo run --release -p riptide-repo --example synth_repo -- [records] [out.car]`, or
//! `… --example synth_repo -- file.car` to time an existing export.

use std::collections::BTreeMap;
use std::time::Instant;

use riptide_car::write_car;
use riptide_cbor::{CidBuf, OwnedValue, DAG_CBOR};
use riptide_crypto::{Curve, PrivateKey};
use riptide_repo::{mst, verify_repo};

fn tid(n: u64) -> String {
    const A: &[u8] = b"234567abcdefghijklmnopqrstuvwxyz";
    let mut v = (1u64 << 60) + n * 7_777_777;
    let mut s = vec![b'2'; 13];
    for i in (0..13).rev() {
        s[i] = A[(v & 31) as usize];
        v >>= 5;
    }
    String::from_utf8(s).unwrap_or_default()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if let Some(path) = args.get(1).filter(|a| a.ends_with(".car")) {
        // Verify an existing CAR (no signature key).
        let car = std::fs::read(path)?;
        for run in 0..5 {
            let t = Instant::now();
            let r = verify_repo(&car, None)?;
            println!(
                "run {run}: {} records, {:?} total, {:?}",
                r.records,
                t.elapsed(),
                r.timings
            );
        }
        return Ok(());
    }
    let n: u64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(200_000);
    let t = Instant::now();
    let collections = [
        "app.bsky.feed.like",
        "app.bsky.feed.post",
        "app.bsky.graph.follow",
        "app.bsky.feed.repost",
    ];
    let mut records = Vec::with_capacity(n as usize);
    let mut leaves = Vec::with_capacity(n as usize);
    for i in 0..n {
        let coll = collections[(i % 4) as usize];
        let mut m = BTreeMap::new();
        m.insert("$type".to_string(), OwnedValue::Text(coll.into()));
        m.insert(
            "createdAt".to_string(),
            OwnedValue::Text(format!(
                "2025-02-06T01:{:02}:{:02}.{:03}Z",
                i % 60,
                i % 59,
                i % 1000
            )),
        );
        m.insert(
            "text".to_string(),
            OwnedValue::Text(format!("{i} {}", "lorem ipsum dolor sit amet ".repeat(9))),
        );
        let bytes = OwnedValue::Map(m).to_cbor();
        let cid = CidBuf::sha256(DAG_CBOR, &bytes);
        leaves.push((format!("{coll}/{}", tid(i)), cid));
        records.push((cid, bytes));
    }
    leaves.sort();
    let (root, nodes) = mst::build(&leaves)?;
    let key = PrivateKey::from_bytes(Curve::Secp256k1, &[7; 32])?;
    let mut c = BTreeMap::new();
    c.insert(
        "did".to_string(),
        OwnedValue::Text("did:plc:aaaaaaaaaaaaaaaaaaaaaaaa".into()),
    );
    c.insert("version".to_string(), OwnedValue::Int(3));
    c.insert("data".to_string(), OwnedValue::Link(root));
    c.insert("rev".to_string(), OwnedValue::Text(tid(n)));
    c.insert("prev".to_string(), OwnedValue::Null);
    let sig = key.sign(&OwnedValue::Map(c.clone()).to_cbor());
    c.insert("sig".to_string(), OwnedValue::Bytes(sig.to_vec()));
    let commit = OwnedValue::Map(c).to_cbor();
    let commit_cid = CidBuf::sha256(DAG_CBOR, &commit);
    let mut blocks: Vec<(CidBuf, &[u8])> = vec![(commit_cid, &commit)];
    blocks.extend(nodes.iter().map(|(c, d)| (*c, d.as_slice())));
    blocks.extend(records.iter().map(|(c, d)| (*c, d.as_slice())));
    let car = write_car(&[commit_cid], blocks.iter().map(|(c, d)| (c.as_cid(), *d)));
    eprintln!(
        "generated {n} records, {} MST nodes, {:.1} MB in {:?}",
        nodes.len(),
        car.len() as f64 / 1e6,
        t.elapsed()
    );
    if let Some(out) = args.get(2) {
        std::fs::write(out, &car)?;
    }
    if std::env::var_os("BREAKDOWN").is_some() {
        breakdown(&car);
    }
    let public = key.public_key();
    for run in 0..3 {
        let t = Instant::now();
        let r = verify_repo(&car, Some(&public))?;
        let total = t.elapsed();
        println!(
            "run {run}: {} records, {} nodes, {} blocks, {:.1} MB: car {:?}, signature {:?}, walk {:?}, rebuild {:?}, total {:?} ({:.0} MB/s)",
            r.records,
            r.mst_nodes,
            r.blocks,
            r.bytes as f64 / 1e6,
            r.timings.car,
            r.timings.signature,
            r.timings.walk,
            r.timings.rebuild,
            total,
            r.bytes as f64 / 1e6 / total.as_secs_f64()
        );
    }
    Ok(())
}

#[allow(dead_code)]
fn breakdown(car_bytes: &[u8]) {
    use riptide_car::{CarOptions, CarReader};
    let mut reader = CarReader::new();
    let car = reader
        .read(car_bytes, &CarOptions::repository())
        .unwrap_or_else(|e| panic!("{e}"));
    let (_, commit) = riptide_repo::commit_of(&car).unwrap_or_else(|e| panic!("{e}"));
    let mut w = mst::Walker::new();
    let t = Instant::now();
    let mut n = 0usize;
    w.walk(&car, commit.data(), |_, _, _| n += 1)
        .unwrap_or_else(|e| panic!("{e}"));
    println!("walk, no-op callback: {:?} ({n})", t.elapsed());
    let t = Instant::now();
    let mut m = 0usize;
    w.walk(&car, commit.data(), |_, c, _| {
        m += usize::from(car.position(c).is_some())
    })
    .unwrap_or_else(|e| panic!("{e}"));
    println!("walk + record lookups: {:?} ({m})", t.elapsed());
    let t = Instant::now();
    let mut h = 0u32;
    w.walk(&car, commit.data(), |k, _, _| h += mst::key_height(k))
        .unwrap_or_else(|e| panic!("{e}"));
    println!("walk + extra key hash: {:?} ({h})", t.elapsed());
}
