//! Writes a small network directory in the `riptide gen` layout, from `riptide_sim::fixture`
//! accounts, for `riptide sim` until `riptide gen` exists (and for the ≥ 50 MB trust-chain run):
//!
//! `cargo run --release -p riptide-sim --example network_dir -- DIR [ACCOUNTS] [BIG_RECORDS]`
//!
//! ACCOUNTS small accounts `user{n}.sim.test` (default 10, 50 records each) and one big account
//! `big.sim.test` of BIG_RECORDS records of ~450 bytes (default 150,000: ~70 MB), as
//! `big-repo.car` + `big-repo.did.json`. Output: DIR/did_docs.json, DIR/repos/<did>.car.

use std::path::PathBuf;

use riptide_sim::fixture;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let dir = PathBuf::from(
        args.get(1)
            .ok_or("usage: network_dir DIR [ACCOUNTS] [BIG_RECORDS]")?,
    );
    let accounts: u8 = args.get(2).map_or(Ok(10), |s| s.parse())?;
    let big: usize = args.get(3).map_or(Ok(150_000), |s| s.parse())?;
    std::fs::create_dir_all(dir.join("repos"))?;
    let mut docs = serde_json::Map::new();
    for n in 0..accounts {
        let a = fixture::account(n, &format!("user{n}.sim.test"), 50);
        std::fs::write(dir.join("repos").join(format!("{}.car", a.did)), &a.car)?;
        docs.insert(a.did.clone(), a.doc);
    }
    let did = fixture::did_for(255);
    let key = fixture::key_for(255);
    let doc = fixture::doc(
        &did,
        "big.sim.test",
        &key.public_key(),
        "https://pds.invalid",
    );
    let car = fixture::repo_sized(&did, &key, big, 300);
    std::fs::write(dir.join("big-repo.car"), &car)?;
    std::fs::write(
        dir.join("big-repo.did.json"),
        serde_json::to_vec_pretty(&doc)?,
    )?;
    docs.insert(did.clone(), doc);
    std::fs::write(dir.join("did_docs.json"), serde_json::to_vec(&docs)?)?;
    eprintln!(
        "{}: {} accounts, big repository {did} {:.1} MB",
        dir.display(),
        docs.len(),
        car.len() as f64 / 1e6
    );
    Ok(())
}
