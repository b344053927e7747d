//! What chain state costs per account: bytes on disk and resident memory for N accounts in the
//! store's `accounts` partition, and the time of a point lookup (what an ingest worker pays for
//! an account it does not hold in memory).
//!
//! ```sh
//! cargo run --release -p riptide-serve --example chain_state_size -- 10000000 [DIR]
//! ```
//!
//! Accounts are written as ingest writes them (`Store::append_with_accounts`, batches of 10,000,
//! each durable), with did:plc-shaped DIDs (32 bytes) and a full tip (rev, two 36-byte CIDs).
//! Prints one JSON object: accounts, seconds to write, bytes on disk (after the memtables are
//! flushed), bytes per account, peak and final RSS of this process, and lookups/s for 100,000
//! random accounts.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Instant;

use riptide_cbor::CidBuf;
use riptide_firehose::chain::{AccountState, Hosting, SyncStatus, Tip};
use riptide_serve::{Resume, Store};

fn did(i: u64) -> String {
    // did:plc: + 24 base32 characters, as real ones are; distinct for every i.
    const A: &[u8] = b"abcdefghijklmnopqrstuvwxyz234567";
    let mut x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ i;
    let mut s = String::from("did:plc:");
    for k in 0..24 {
        if k == 12 {
            x = i;
        }
        s.push(A[(x & 31) as usize] as char);
        x >>= 5;
    }
    s
}

fn state(i: u64) -> AccountState {
    AccountState {
        tip: Some(Tip {
            rev: (1_783_173_600_000_000u64 + i) << 10,
            commit: CidBuf::sha256(0x71, &i.to_le_bytes()),
            data: CidBuf::sha256(0x71, &(i ^ u64::MAX).to_le_bytes()),
            from_repo: false,
        }),
        hosting: Hosting::Active,
        sync: SyncStatus::Synchronized,
    }
}

fn status(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|r| r.split_whitespace().next()?.parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

fn dir_size(p: &std::path::Path) -> u64 {
    std::fs::read_dir(p)
        .map(|rd| {
            rd.flatten()
                .map(|e| match e.metadata() {
                    Ok(m) if m.is_dir() => dir_size(&e.path()),
                    Ok(m) => m.len(),
                    Err(_) => 0,
                })
                .sum()
        })
        .unwrap_or(0)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let n: u64 = args
        .next()
        .map_or(1_000_000, |a| a.parse().expect("a count"));
    let tmp;
    let dir = match args.next() {
        Some(d) => std::path::PathBuf::from(d),
        None => {
            tmp = tempfile::tempdir().unwrap();
            tmp.path().to_path_buf()
        }
    };
    let (store, _) = Store::open(&dir, 0).unwrap();
    let rss0 = status("VmRSS:");
    let t0 = Instant::now();
    let mut batch = Vec::with_capacity(10_000);
    let mut i = 0;
    while i < n {
        batch.clear();
        for j in i..(i + 10_000).min(n) {
            batch.push((did(j).into_boxed_str(), state(j)));
        }
        let resume = Resume {
            next_seq: 1,
            last_time_us: 0,
            upstream_cursor: Some(i),
        };
        store.append_with_accounts(&[], &batch, &resume).unwrap();
        i += batch.len() as u64;
    }
    let write_secs = t0.elapsed().as_secs_f64();
    drop(store);
    // Reopen: the journal is replayed and what is on disk is what a restart finds.
    let (store, _) = Store::open(&dir, 0).unwrap();
    let lookups = 100_000u64.min(n);
    let t1 = Instant::now();
    let mut x = 12345u64;
    for _ in 0..lookups {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let k = (x >> 11) % n;
        let got = store.account(&did(k)).unwrap();
        assert_eq!(got, Some(state(k)));
    }
    let lookup_secs = t1.elapsed().as_secs_f64();
    let disk = dir_size(&dir);
    println!(
        "{}",
        serde_json::json!({
            "accounts": n,
            "write_seconds": write_secs,
            "disk_bytes": disk,
            "disk_bytes_per_account": disk as f64 / n as f64,
            "rss_before_bytes": rss0,
            "rss_peak_bytes": status("VmHWM:"),
            "rss_after_bytes": status("VmRSS:"),
            "lookups_per_s": lookups as f64 / lookup_secs,
            "in_memory_state_bytes": std::mem::size_of::<AccountState>(),
        })
    );
}
