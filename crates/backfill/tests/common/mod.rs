//! What the backfill's loopback tests share.

#![allow(dead_code, clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::net::SocketAddr;

/// Any free port on 127.0.0.1.
pub const LOOPBACK: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 0);

/// `collection/rkey\tcid` of every record of a CAR whose key starts with `prefix` (`""`: all),
/// as `riptide repo ls` lists it: the oracle for what a backfill wrote.
pub fn listing(car: &[u8], prefix: &str) -> BTreeSet<String> {
    let mut reader = riptide_car::CarReader::new();
    let car = reader
        .read(car, &riptide_car::CarOptions::repository())
        .unwrap();
    riptide_repo::list_records(&car)
        .unwrap()
        .into_iter()
        .filter(|(k, _)| k.starts_with(prefix))
        .map(|(k, c)| format!("{k}\t{c}"))
        .collect()
}
