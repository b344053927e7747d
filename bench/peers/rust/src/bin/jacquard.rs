//! The jacquard peer: `SubscribeReposMessage::decode_framed` (jacquard-api's firehose frame types),
//! jacquard-repo's `parse_car_bytes` (iroh-car: no block hash check, so unverified decode only) and
//! every block decoded as DAG-CBOR into `Ipld`; signatures with jacquard-repo's `Commit::verify`;
//! repositories with jacquard-repo (CAR → MemoryBlockStore → `Mst::load` → leaves → rebuilt tree's
//! root compared with the commit's).
//!
//! usage: jacquard [--warmup N --passes N] decode FILE LABEL --no-verify | sigs FILE | repo FILE LABEL

use std::borrow::Cow;
use std::sync::Arc;

use ipld_core::ipld::Ipld;
use jacquard_api::com_atproto::sync::subscribe_repos::SubscribeReposMessage;
use jacquard_common::types::crypto::{KeyCodec, PublicKey};
use jacquard_repo::commit::Commit;
use jacquard_repo::{MemoryBlockStore, Mst};
use riptide_bench_peers::{emit, frames, measure, opts, read, sig_entries};

type S = jacquard_common::bos::DefaultStr;

async fn car(blocks: &[u8]) -> Result<usize, ()> {
    let parsed = jacquard_repo::car::parse_car_bytes(blocks)
        .await
        .map_err(|_| ())?;
    for b in parsed.blocks.values() {
        serde_ipld_dagcbor::from_slice::<Ipld>(b).map_err(|_| ())?;
    }
    Ok(parsed.blocks.len())
}

async fn decode_frame(f: &[u8]) -> Result<usize, ()> {
    match SubscribeReposMessage::<S>::decode_framed(f).map_err(|_| ())? {
        SubscribeReposMessage::Commit(c) => car(&c.blocks).await,
        SubscribeReposMessage::Sync(s) => car(&s.blocks).await,
        _ => Ok(0),
    }
}

fn main() {
    let o = opts();
    let a: Vec<&str> = o.args.iter().map(String::as_str).collect();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    match a.as_slice() {
        ["decode", file, label, ..] => {
            let data = read(file);
            let fs = frames(&data);
            let (mut blocks, mut errors) = (0, 0);
            rt.block_on(async {
                for f in &fs {
                    match decode_frame(f).await {
                        Ok(n) => blocks += n,
                        Err(()) => errors += 1,
                    }
                }
            });
            let r = measure(&o, fs.len() as f64, || {
                rt.block_on(async {
                    for f in &fs {
                        std::hint::black_box(decode_frame(f).await.ok());
                    }
                })
            });
            emit(
                "decode-unverified",
                "jacquard",
                label,
                "frames/s",
                r,
                Some(blocks as f64 / fs.len() as f64),
                errors,
            );
        }
        ["sigs", file] => {
            let data = read(file);
            let entries = sig_entries(&data);
            let key = |k256: bool, b: &[u8]| PublicKey {
                codec: if k256 {
                    KeyCodec::Secp256k1
                } else {
                    KeyCodec::P256
                },
                bytes: Cow::Owned(b.to_vec()),
            };
            let verify = |e: &riptide_bench_peers::SigEntry<'_>| -> bool {
                Commit::<S>::from_cbor(e.signed)
                    .map(|c| c.verify(&key(e.k256, e.pubkey)).is_ok())
                    .unwrap_or(false)
            };
            let good: Vec<_> = entries.iter().filter(|e| verify(e)).collect();
            let errors = entries.len() - good.len();
            let n = good.len();
            let full = measure(&o, n as f64, || {
                let ok = good.iter().filter(|e| verify(e)).count();
                assert_eq!(ok, n);
            });
            emit("sigs", "jacquard", "full", "verifies/s", full, None, errors);
        }
        ["repo", file, label] => {
            let bytes = read(file);
            let errors = match rt.block_on(verify_repo(&bytes)) {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("jacquard repo: {e}");
                    1
                }
            };
            let r = measure(&o, (bytes.len() * o.repeat) as f64 / 1e6, || {
                for _ in 0..o.repeat {
                    std::hint::black_box(rt.block_on(verify_repo(&bytes)).is_ok());
                }
            });
            emit("repo", "jacquard", label, "MB/s", r, None, errors);
        }
        _ => {
            eprintln!("usage: jacquard [--warmup N --passes N] decode FILE LABEL --no-verify | sigs FILE | repo FILE LABEL");
            std::process::exit(2);
        }
    }
}

async fn verify_repo(bytes: &[u8]) -> Result<(), String> {
    let parsed = jacquard_repo::car::parse_car_bytes(bytes)
        .await
        .map_err(|e| e.to_string())?;
    let commit_bytes = parsed
        .blocks
        .get(&parsed.root)
        .ok_or("commit block missing")?
        .clone();
    let commit = Commit::<S>::from_cbor(&commit_bytes).map_err(|e| e.to_string())?;
    let store = Arc::new(MemoryBlockStore::new_from_blocks(parsed.blocks));
    let tree = Mst::load(store, *commit.data(), None);
    let leaves = tree.leaves().await.map_err(|e| e.to_string())?;
    let mut rebuilt = Mst::new(Arc::new(MemoryBlockStore::new()));
    for (k, v) in &leaves {
        rebuilt = rebuilt.add(k, *v).await.map_err(|e| e.to_string())?;
    }
    let root = rebuilt.root().await.map_err(|e| e.to_string())?;
    if &root != commit.data() {
        return Err(format!("root mismatch: {root} != {}", commit.data()));
    }
    Ok(())
}
