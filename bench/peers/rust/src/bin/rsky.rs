//! The rsky peer: the crates rsky's relay and PDS use. Frame header with ciborium and payload with
//! serde_ipld_dagcbor into rsky-lexicon's types (as rsky-firehose reads frames), CAR with
//! rs-car-sync (SHA-256 of every block checked unless unverified), every block decoded as DAG-CBOR
//! by serde_ipld_dagcbor into `Ipld`. Signatures with rsky-repo's `verify_commit_sig` /
//! rsky-crypto; repositories with rsky-repo's `read_car_with_root` + `verify_repo`.
//!
//! usage: rsky [--warmup N --passes N] decode FILE LABEL [--no-verify] | sigs FILE | repo FILE LABEL

use std::io::Cursor;

use ipld_core::ipld::Ipld;
use riptide_bench_peers::{emit, frames, measure, opts, read, sig_entries};
use rsky_lexicon::com::atproto::sync::{
    SubscribeReposAccount, SubscribeReposCommit, SubscribeReposIdentity,
};
use serde::Deserialize;
use sha2::{Digest, Sha256};

/// rsky-firehose's frame header (`{op, t}`), with `op` signed so that error frames decode.
#[derive(Deserialize)]
struct Header {
    t: Option<String>,
    op: i64,
}

/// `#sync` is missing from rsky-lexicon: the fields it needs, in its style.
#[derive(Deserialize)]
#[allow(dead_code)]
struct SyncEvent {
    seq: i64,
    did: String,
    #[serde(with = "serde_bytes")]
    blocks: Vec<u8>,
    rev: String,
    time: String,
}

fn car(blocks: &[u8], verify: bool) -> Result<usize, ()> {
    let mut r = blocks;
    let reader = rs_car_sync::CarReader::new(&mut r, verify).map_err(|_| ())?;
    let mut n = 0;
    for item in reader {
        let (_cid, block) = item.map_err(|_| ())?;
        serde_ipld_dagcbor::from_slice::<Ipld>(&block).map_err(|_| ())?;
        n += 1;
    }
    Ok(n)
}

fn decode_frame(f: &[u8], verify: bool) -> Result<usize, ()> {
    let mut c = Cursor::new(f);
    let h: Header = ciborium::de::from_reader(&mut c).map_err(|_| ())?;
    if h.op != 1 {
        return Err(());
    }
    match h.t.as_deref().unwrap_or("") {
        "#commit" => {
            let e: SubscribeReposCommit =
                serde_ipld_dagcbor::from_reader(&mut c).map_err(|_| ())?;
            car(&e.blocks, verify)
        }
        "#sync" => {
            let e: SyncEvent = serde_ipld_dagcbor::from_reader(&mut c).map_err(|_| ())?;
            car(&e.blocks, verify)
        }
        "#identity" => serde_ipld_dagcbor::from_reader::<SubscribeReposIdentity, _>(&mut c)
            .map(|_| 0)
            .map_err(|_| ()),
        "#account" => serde_ipld_dagcbor::from_reader::<SubscribeReposAccount, _>(&mut c)
            .map(|_| 0)
            .map_err(|_| ()),
        _ => Err(()),
    }
}

fn main() {
    let o = opts();
    let a: Vec<&str> = o.args.iter().map(String::as_str).collect();
    match a.as_slice() {
        ["decode", file, label, rest @ ..] => {
            let verify = !rest.contains(&"--no-verify");
            let data = read(file);
            let fs = frames(&data);
            let (mut blocks, mut errors) = (0, 0);
            for f in &fs {
                match decode_frame(f, verify) {
                    Ok(n) => blocks += n,
                    Err(()) => errors += 1,
                }
            }
            let r = measure(&o, fs.len() as f64, || {
                for f in &fs {
                    std::hint::black_box(decode_frame(f, verify).ok());
                }
            });
            let bench = if verify {
                "decode"
            } else {
                "decode-unverified"
            };
            emit(
                bench,
                "rsky",
                label,
                "frames/s",
                r,
                Some(blocks as f64 / fs.len() as f64),
                errors,
            );
        }
        ["sigs", file] => sigs(&o, file),
        ["repo", file, label] => repo(&o, file, label),
        _ => {
            eprintln!("usage: rsky [--warmup N --passes N] decode FILE LABEL [--no-verify] | sigs FILE | repo FILE LABEL");
            std::process::exit(2);
        }
    }
}

struct Prepared<'a> {
    k256: bool,
    signed: &'a [u8],
    pubkey: &'a [u8],
    did_key: String,
    sig: Vec<u8>,
    k: Key,
}

enum Key {
    K256(secp256k1::PublicKey),
    P256(p256::ecdsa::VerifyingKey),
}

fn sigs(o: &riptide_bench_peers::Opts, file: &str) {
    use rsky_crypto::constants::{P256_JWT_ALG, SECP256K1_JWT_ALG};
    let data = read(file);
    let entries = sig_entries(&data);
    let mut errors = 0;
    let mut prepared = Vec::new();
    for e in &entries {
        let alg = if e.k256 {
            SECP256K1_JWT_ALG
        } else {
            P256_JWT_ALG
        };
        let p = (|| {
            let did_key =
                rsky_crypto::did::format_did_key(alg.to_string(), e.pubkey.to_vec()).ok()?;
            let commit: rsky_repo::types::Commit = serde_ipld_dagcbor::from_slice(e.signed).ok()?;
            let sig = commit.sig.clone();
            if !rsky_repo::util::verify_commit_sig(commit, &did_key).ok()? {
                return None;
            }
            let k = if e.k256 {
                Key::K256(secp256k1::PublicKey::from_slice(e.pubkey).ok()?)
            } else {
                Key::P256(p256::ecdsa::VerifyingKey::from_sec1_bytes(e.pubkey).ok()?)
            };
            Some(Prepared {
                k256: e.k256,
                signed: e.signed,
                pubkey: e.pubkey,
                did_key,
                sig,
                k,
            })
        })();
        match p {
            Some(p) => prepared.push(p),
            None => errors += 1,
        }
    }
    let n = prepared.len();
    let check = |ok: usize| assert_eq!(ok, n, "a pass verified {ok} of {n}");
    // full: decode the signed commit, re-encode it unsigned, SHA-256, parse the did:key, verify.
    let full = measure(o, n as f64, || {
        let ok = prepared
            .iter()
            .filter(|p| {
                serde_ipld_dagcbor::from_slice::<rsky_repo::types::Commit>(p.signed)
                    .ok()
                    .and_then(|c| rsky_repo::util::verify_commit_sig(c, &p.did_key).ok())
                    .unwrap_or(false)
            })
            .count();
        check(ok);
    });
    emit("sigs", "rsky", "full", "verifies/s", full, None, errors);
    // crypto: key parsed from its bytes, SHA-256 of the unsigned bytes, verify (rsky-crypto).
    let unsigned: Vec<Vec<u8>> = prepared
        .iter()
        .map(|p| {
            let c: rsky_repo::types::Commit =
                serde_ipld_dagcbor::from_slice(p.signed).expect("decoded before");
            let u = rsky_repo::types::UnsignedCommit {
                did: c.did,
                rev: c.rev,
                data: c.data,
                prev: c.prev,
                version: c.version,
            };
            serde_ipld_dagcbor::to_vec(&u).expect("encoded before")
        })
        .collect();
    let crypto = measure(o, n as f64, || {
        let ok = prepared
            .iter()
            .zip(&unsigned)
            .filter(|(p, u)| {
                let d = Sha256::digest(u);
                if p.k256 {
                    rsky_crypto::secp256k1::operations::verify_sig(p.pubkey, &d, &p.sig, None)
                        .unwrap_or(false)
                } else {
                    rsky_crypto::p256::operations::verify_prehash_sig(p.pubkey, &d, &p.sig, None)
                        .unwrap_or(false)
                }
            })
            .count();
        check(ok);
    });
    emit("sigs", "rsky", "crypto", "verifies/s", crypto, None, errors);
    // preparsed: keys parsed beforehand; SHA-256 and verify (the curve crates rsky-crypto uses).
    let preparsed = measure(o, n as f64, || {
        let ok = prepared
            .iter()
            .zip(&unsigned)
            .filter(|(p, u)| {
                let d = Sha256::digest(u);
                match &p.k {
                    Key::K256(k) => {
                        let m = secp256k1::Message::from_digest_slice(&d).expect("32 bytes");
                        secp256k1::ecdsa::Signature::from_compact(&p.sig)
                            .map(|s| secp256k1::SECP256K1.verify_ecdsa(&m, &s, k).is_ok())
                            .unwrap_or(false)
                    }
                    Key::P256(k) => {
                        use p256::ecdsa::signature::hazmat::PrehashVerifier;
                        p256::ecdsa::Signature::try_from(p.sig.as_slice())
                            .map(|s| k.verify_prehash(&d, &s).is_ok())
                            .unwrap_or(false)
                    }
                }
            })
            .count();
        check(ok);
    });
    emit(
        "sigs",
        "rsky",
        "preparsed",
        "verifies/s",
        preparsed,
        None,
        errors,
    );
}

fn repo(o: &riptide_bench_peers::Opts, file: &str, label: &str) {
    let bytes = read(file);
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let verify = |b: &[u8]| -> Result<(), String> {
        rt.block_on(async {
            let mut car = rsky_repo::car::read_car_with_root(b.to_vec())
                .await
                .map_err(|e| e.to_string())?;
            rsky_repo::sync::consumer::verify_repo(&mut car.blocks, car.root, None, None, None)
                .await
                .map_err(|e| e.to_string())?;
            Ok(())
        })
    };
    let errors = match verify(&bytes) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("rsky repo: {e}");
            1
        }
    };
    let r = measure(o, (bytes.len() * o.repeat) as f64 / 1e6, || {
        for _ in 0..o.repeat {
            std::hint::black_box(verify(&bytes).ok());
        }
    });
    emit("repo", "rsky", label, "MB/s", r, None, errors);
}
