//! `riptide sim` and `riptide verify-handle` as a user runs them: a network directory in the
//! `riptide gen` layout, the simulator as a child process on an ephemeral loopback port, and the
//! trust chain run against it through the binary.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::PathBuf;

use common::{riptide, start_sim, verify_handle_json};
use riptide_sim::fixture;

#[test]
fn sim_serves_a_directory_and_verify_handle_checks_it() {
    let tmp = common::scratch();
    let dir = tmp.path();
    std::fs::create_dir(dir.join("repos")).unwrap();
    let alice = fixture::account(1, "alice.test", 25);
    let wrong = fixture::account(3, "wrongkey.test", 5);
    let wrong_doc = fixture::doc(
        &wrong.did,
        "wrongkey.test",
        &fixture::key_for(9).public_key(),
        "https://x.invalid",
    );
    let docs = serde_json::json!({ alice.did.clone(): alice.doc, wrong.did.clone(): wrong_doc });
    std::fs::write(dir.join("did_docs.json"), docs.to_string()).unwrap();
    std::fs::write(
        dir.join("repos").join(format!("{}.car", alice.did)),
        &alice.car,
    )
    .unwrap();
    std::fs::write(
        dir.join("repos").join(format!("{}.car", wrong.did)),
        &wrong.car,
    )
    .unwrap();
    let (_sim, base) = start_sim(dir);

    let (out, v) = verify_handle_json("alice.test", &base);
    assert!(out.status.success(), "{v}");
    assert_eq!(v["verdict"], "ok");
    assert_eq!(v["handle"], "alice.test");
    assert_eq!(v["did"], alice.did.as_str());
    assert_eq!(v["pds"], base.as_str());
    assert_eq!(v["records"], 25);
    assert_eq!(v["bytes"], alice.car.len());
    assert!(v["blocks"].as_u64().unwrap() > 25);
    let t = v["timings_ms"].as_object().unwrap();
    let keys: Vec<&str> = t.keys().map(String::as_str).collect();
    for k in ["resolve", "fetch", "car", "signature", "walk", "rebuild"] {
        assert!(
            keys.contains(&k) && t[k].as_f64().unwrap() >= 0.0,
            "{k} in {keys:?}"
        );
    }

    let (out, v) = verify_handle_json("wrongkey.test", &base);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(v["verdict"], "bad-signature");
    let (out, v) = verify_handle_json("nobody.test", &base);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(v["verdict"], "handle-not-found");

    // The text form names the verdict.
    let out = riptide(&[
        "verify-handle",
        "alice.test",
        "--plc-url",
        &base,
        "--handle-resolver",
        &base,
    ]);
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("alice.test: ok\n"));
    // A failure in the text form: the verdict said once (stdout, with its reason), exit 1.
    let out = riptide(&[
        "verify-handle",
        "nobody.test",
        "--plc-url",
        &base,
        "--handle-resolver",
        &base,
    ]);
    assert_eq!(out.status.code(), Some(1));
    let both = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(both.matches("handle-not-found").count(), 1, "{both}");
    assert!(both.contains("reason: "), "{both}");
}

/// The ≥ 50 MB trust chain on a `riptide gen` directory: `RIPTIDE_SIM_DIR=DIR cargo test -p
/// riptide-cli --release --test trust -- --ignored`. Uses `DIR/big-repo.did.json`'s handle.
#[test]
#[ignore = "needs a riptide gen directory with a big repository (RIPTIDE_SIM_DIR)"]
fn big_repository_trust_chain() {
    let dir = PathBuf::from(std::env::var("RIPTIDE_SIM_DIR").expect("RIPTIDE_SIM_DIR"));
    let doc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("big-repo.did.json")).unwrap()).unwrap();
    let handle = common::handle_of(&doc);
    let (_sim, base) = start_sim(&dir);
    let (out, v) = verify_handle_json(&handle, &base);
    eprintln!("{v}");
    assert!(out.status.success(), "{v}");
    assert_eq!(v["verdict"], "ok");
    assert!(v["bytes"].as_u64().unwrap() >= 50_000_000, "{}", v["bytes"]);
}
