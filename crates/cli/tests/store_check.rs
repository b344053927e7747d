//! `riptide store check` and `riptide store repair` on damaged data directories (issue 40): a bit
//! flipped in a stopped store's block, and a journal cut short, each named with its seq range,
//! exit 1 until repaired; after `repair` the store checks sound and the lost seqs stay recorded.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;

use common::{riptide, s, scratch, stderr};
use riptide_store::testing::{commit, cut_journals, flip_block, resume, SMALL};
use riptide_store::{Event, Utf8Text};
use serde_json::{json, Value};

/// The store as a tool opens it (`riptide store check|repair`).
type Store = riptide_store::Store<Utf8Text>;

/// Event `i`: a commit whose JSON names its seq.
fn ev(i: u64) -> Event {
    commit(
        i,
        &format!("{{\"did\":\"did:plc:a\",\"time_us\":{i},\"kind\":\"commit\"}}"),
    )
}

/// `riptide store CMD --data DIR --json`: its exit code and report.
fn store_json(cmd: &str, dir: &Path) -> (i32, Value, String) {
    let out = riptide(&["store", cmd, "--data", s(dir), "--json"]);
    let v = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    (out.status.code().unwrap(), v, stderr(&out))
}

#[test]
fn a_flipped_bit_is_named_by_check_and_removed_by_repair() {
    let dir = scratch();
    {
        let (store, _) = Store::open_with(dir.path(), 0, SMALL).unwrap();
        let evs: Vec<_> = (1..=100).map(ev).collect();
        store.append(&evs, &resume(101)).unwrap();
        store.flush().unwrap();
    }
    let (code, v, _) = store_json("check", dir.path());
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["damaged"], false);
    // 1, 17, …, 65, and 81..=100 (the last takes the fewer than 16 left).
    assert_eq!(
        (v["blocks"].as_u64(), v["events"].as_u64()),
        (Some(6), Some(100))
    );

    flip_block(dir.path(), 16, 17, 33);
    let out = riptide(&["store", "check", "--data", s(dir.path())]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("DAMAGED block 17: seqs 17..=32 (16 events): checksum"),
        "{text}"
    );
    let (code, v, _) = store_json("check", dir.path());
    assert_eq!(code, 1);
    assert_eq!(v["damaged"], true);
    assert_eq!(
        v["damaged_blocks"],
        json!([{"first": 17, "last": 32, "events": 16, "what": "checksum"}])
    );
    assert_eq!(v["events"], 84);

    let (code, v, _) = store_json("repair", dir.path());
    assert_eq!(code, 0, "{v}");
    let removed = json!([{"first": 17, "last": 32, "events": 16, "why": "corrupt block"}]);
    assert_eq!(v["removed"], removed);
    let (code, v, _) = store_json("check", dir.path());
    assert_eq!(code, 0, "{v}");
    assert_eq!(
        (v["blocks"].as_u64(), v["events"].as_u64()),
        (Some(5), Some(84))
    );
    assert_eq!(v["lost"], removed);
    // The events around it are all there.
    let (store, r) = Store::open_any(dir.path()).unwrap();
    assert_eq!(r.next_seq, 101);
    let mut out = Vec::new();
    let all = riptide_store::ReadLimit {
        events: 1000,
        bytes: 1 << 30,
    };
    store.read_from(0, all, &mut out).unwrap();
    let want: Vec<u64> = (1..=16).chain(33..=100).collect();
    assert_eq!(out.iter().map(Event::seq).collect::<Vec<_>>(), want);
}

#[test]
fn a_journal_cut_short_is_said_at_open_and_listed() {
    let dir = scratch();
    {
        let (store, _) = Store::open_with(dir.path(), 0, SMALL).unwrap();
        // Ten batches of ten, never flushed: all in the journal.
        for first in (1..=91).step_by(10) {
            let evs: Vec<_> = (first..first + 10).map(ev).collect();
            store.append(&evs, &resume(first + 10)).unwrap();
        }
    }
    cut_journals(dir.path());
    let (code, v, err) = store_json("check", dir.path());
    assert_eq!(code, 1, "{v}\n{err}");
    let lost = v["journal_lost_at_open"].as_u64().unwrap();
    assert!((1..100).contains(&lost), "{v}");
    let first = 101 - lost;
    assert_eq!(
        v["lost"],
        json!([{"first": first, "last": 100, "events": lost, "why": "journal"}])
    );
    assert_eq!(
        v["events"].as_u64().unwrap() + v["unsealed_events"].as_u64().unwrap(),
        first - 1
    );
    // Loudly, with the range and why.
    assert!(err.contains("ERROR"), "{err}");
    assert!(
        err.contains(&format!("{lost} acknowledged events are missing")),
        "{err}"
    );
    // Said once: the store now knows, and the range stays listed.
    let (code, v2, err) = store_json("check", dir.path());
    assert_eq!(code, 0, "{v2}\n{err}");
    assert_eq!(v2["lost"], v["lost"]);
    assert_eq!(Store::open_any(dir.path()).unwrap().1.next_seq, 101);
}

#[test]
fn a_directory_that_is_not_a_store_is_refused() {
    let dir = scratch();
    let out = riptide(&["store", "check", "--data", s(&dir.path().join("nope"))]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("not a riptide serve data directory"));
    assert!(!dir.path().join("nope").exists());
}
