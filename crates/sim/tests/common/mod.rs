//! What the sim's integration tests share: a simulator on loopback with N hosts, and the HTTP
//! reads every test makes of it (a JSON document, a CAR, a document's signing key).

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;

use bytes::Bytes;
use riptide_crypto::PublicKey;
use riptide_sim::{Faults, Network, PlanConfig, Sim, SimHandle};
use serde_json::Value;

/// `net` served on loopback as `plan` says, no faults, the relay's defaults.
pub async fn spawn(net: Network, plan: PlanConfig) -> SimHandle {
    Sim::spawn_network(
        net,
        SocketAddr::from(([127, 0, 0, 1], 0)),
        Faults::default(),
        riptide_relay::RelayConfig::default(),
        plan,
    )
    .await
    .unwrap()
}

/// `GET url`, which must succeed, as JSON.
pub async fn json(http: &reqwest::Client, url: &str) -> Value {
    let r = http.get(url).send().await.unwrap();
    assert!(r.status().is_success(), "{url}: {}", r.status());
    r.json().await.unwrap()
}

/// `GET url`, which must succeed: the body.
pub async fn bytes(http: &reqwest::Client, url: &str) -> Bytes {
    let r = http.get(url).send().await.unwrap();
    assert!(r.status().is_success(), "{url}: {}", r.status());
    r.bytes().await.unwrap()
}

/// The signing key a DID document names.
pub fn key_of(doc: &Value) -> PublicKey {
    riptide_identity::DidDoc::from_value(doc)
        .unwrap()
        .signing_key()
        .unwrap()
}
