//! `riptide backfill --bind ADDR,…`: the crawl spread over several local source addresses, each
//! its own client to a PDS's per-IP limits (issue 37), against the `riptide sim --hosts` binary.
//!
//! Oracles: the sim's own count of the `getRepo`s it let through per client IP
//! (`/_sim/stats`, `get_repo_by_client`), its listing of the large host, and the limit itself:
//! one address cannot crawl the large host faster than its accounts divided by the rate; three
//! addresses share its accounts a third each and finish in well under the one address's time.
//! The records written are the same either way.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{http_get, riptide, s, scratch, BIN};

/// The sim's (and the crawler's) `getRepo` limit per client IP per host, low so that the
/// limit, not the machine, sets the wall time.
const RATE: u64 = 5;

fn stats(base: &str) -> serde_json::Value {
    let addr = base.strip_prefix("http://").unwrap();
    let (code, body) = http_get(addr, "/_sim/stats");
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

/// Host 0's `getRepo`s let through, per client IP.
fn by_client(base: &str) -> BTreeMap<String, u64> {
    serde_json::from_value(stats(base)["hosts"][0]["get_repo_by_client"].clone()).unwrap()
}

/// One backfill of the sim at `base` into `dir`, with `--bind bind` when given: the records
/// written (`did collection/rkey cid` lines) and the wall time.
fn backfill(base: &str, dir: &Path, bind: Option<&str>) -> (BTreeSet<String>, Duration) {
    let out = dir.join("out.jsonl");
    let mut c = Command::new(BIN);
    c.args(["backfill", "--relay", base, "--plc-url", base, "--jsonl"])
        .args(["--out", s(&out), "--state", s(&dir.join("state"))])
        .args(["--get-repo-rate", &RATE.to_string()]);
    if let Some(b) = bind {
        c.args(["--bind", b]);
    }
    let t = Instant::now();
    let run = c.output().unwrap();
    let took = t.elapsed();
    assert!(run.status.success(), "{}", common::stderr(&run));
    let lines = std::fs::read_to_string(&out)
        .unwrap()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            format!(
                "{} {}/{} {}",
                v["did"], v["collection"], v["rkey"], v["cid"]
            )
        })
        .collect();
    (lines, took)
}

#[test]
fn three_addresses_share_the_large_host_a_third_each_and_finish_sooner() {
    let tmp = scratch();
    let net = tmp.path().join("net");
    let gen = riptide(&[
        "gen",
        "--seed",
        "5",
        "--accounts",
        "60",
        "--events",
        "300",
        "--repos",
        "--sizes",
        "heavy",
        "--size-max",
        "200",
        "--out",
        s(&net),
    ]);
    assert!(gen.status.success(), "{}", common::stderr(&gen));
    let (_sim, base) = common::spawn_printing_url(
        Command::new(BIN)
            .args(["sim", "--from", s(&net), "--listen", "127.0.0.1:0"])
            .args(["--hosts", "2", "--host-share", "0.9", "--seed", "1"])
            .args(["--limit-get-repo", &RATE.to_string()])
            .stderr(Stdio::inherit()),
    );
    let manifest = {
        let addr = base.strip_prefix("http://").unwrap();
        let (code, body) = http_get(addr, "/_sim/manifest");
        assert_eq!(code, 200, "{body}");
        serde_json::from_str::<serde_json::Value>(&body).unwrap()
    };
    // The large host's active accounts: the ones a backfill asks for (inactive ones are
    // failed from the listing, with no getRepo).
    let host0 = manifest["hosts"][0]["url"].as_str().unwrap();
    let (code, body) = http_get(
        host0.strip_prefix("http://").unwrap(),
        "/xrpc/com.atproto.sync.listRepos?limit=1000",
    );
    assert_eq!(code, 200, "{body}");
    let listed: serde_json::Value = serde_json::from_str(&body).unwrap();
    let large = listed["repos"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["active"].as_bool() != Some(false))
        .count() as u64;
    assert!(
        large >= 40,
        "the large host has too few accounts to time: {body}"
    );

    // One address: every getRepo of the large host from it, at the host's rate.
    let one = tmp.path().join("one");
    let (records, took_one) = backfill(&base, &one, Some("127.0.0.2"));
    let after_one = by_client(&base);
    assert_eq!(
        after_one,
        BTreeMap::from([("127.0.0.2".to_owned(), large)]),
        "one address"
    );
    // A full second's tokens to start with, then RATE a second: the limit's bound.
    let bound_one = (large - RATE) as f64 / RATE as f64;
    assert!(
        took_one.as_secs_f64() >= 0.9 * bound_one,
        "one address took {took_one:?}, faster than the limit allows ({bound_one:.1} s)"
    );

    // Three addresses: a third each (the host's repositories go to its lanes in turn).
    let three = tmp.path().join("three");
    let addrs = ["127.0.0.3", "127.0.0.4", "127.0.0.5"];
    let (records3, took_three) = backfill(&base, &three, Some(&addrs.join(",")));
    let after_three = by_client(&base);
    let mut total = 0;
    for a in addrs {
        let n = after_three.get(a).copied().unwrap_or_default();
        assert!(
            n + 1 >= large / 3 && n <= large / 3 + 1,
            "{a} fetched {n} of {large}: {after_three:?}"
        );
        total += n;
    }
    assert_eq!(total, large, "{after_three:?}");
    assert_eq!(
        after_three.get("127.0.0.2"),
        Some(&large),
        "{after_three:?}"
    );
    assert_eq!(
        records3, records,
        "the same records from one address and three"
    );
    assert!(!records.is_empty());
    eprintln!(
        "{large} repositories on the large host at {RATE}/s per address: one address \
         {took_one:.2?} (bound {bound_one:.1} s), three {took_three:.2?}"
    );
    // A third of the one address's bound, plus set-up: generous, timing is the weaker check.
    assert!(
        took_three.as_secs_f64() < 0.7 * took_one.as_secs_f64(),
        "three addresses took {took_three:?}, one {took_one:?}"
    );
}

/// An address that is not this machine's is refused once, before any crawl, with its name.
#[test]
fn an_address_not_of_this_machine_is_refused_at_start() {
    let tmp = scratch();
    // TEST-NET-1 (RFC 5737): never a local address.
    let out = riptide(&[
        "backfill",
        "--relay",
        "http://127.0.0.1:9",
        "--jsonl",
        "--state",
        s(&tmp.path().join("state")),
        "--bind",
        "127.0.0.2,192.0.2.1",
    ]);
    assert!(!out.status.success());
    let err = common::stderr(&out);
    assert!(
        err.contains("--bind 192.0.2.1: not an address of this machine"),
        "{err}"
    );
    assert!(
        !tmp.path().join("state").exists(),
        "a state was created: {err}"
    );
}
