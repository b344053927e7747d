//! A small atproto network on loopback, for tests and offline demos: `riptide sim`.
//!
//! Why: no test may depend on the internet, yet identity resolution and the trust chain only mean
//! something end to end (handle → DID → document → PDS → repository). This crate serves what
//! `riptide gen` produced (or what a test builds in memory, [`Network::new`]) over HTTP on one
//! listener:
//!
//! - a PLC directory: `GET /did:plc:…` → the DID document, its `#atproto_pds` service endpoint
//!   rewritten to the simulator's own base URL, so every account's PDS is this server;
//! - the directory's log: `GET /export?count=N&after=SEQ`, signed operations that fold to the
//!   documents served ([`plc`]; for `riptide plc mirror`);
//! - PDS endpoints: `/xrpc/com.atproto.sync.getRepo?did=`, `/xrpc/com.atproto.sync.listRepos`
//!   (`limit`, `cursor`), `/xrpc/com.atproto.repo.describeRepo?repo=`;
//! - handle resolution: `GET /.well-known/atproto-did` answered by the `Host` header (handle →
//!   DID from the documents' `alsoKnownAs`), or by path `GET /<handle>/.well-known/atproto-did`;
//! - a relay: `ws://…/xrpc/com.atproto.sync.subscribeRepos[?cursor=N]` serving the directory's
//!   `firehose-frames.bin` ([`Network::frames`]) through `riptide-relay` ([`Sim::relay_url`],
//!   [`Sim::relay`]): the relay's own seqs from 1, cursor replay, pings;
//! - faults on demand ([`Faults`]): every Nth request a 503, every Nth response cut mid-body (the
//!   connection drops; WebSocket upgrades included), a delay before each response, and per relay
//!   connection a drop after N frames, an error frame after N frames, a delay before each frame;
//!   set at start or at run time with `POST /_sim/faults` (JSON [`Faults`]), and read back with
//!   `GET /_sim/faults`.
//!
//! Many hosts (issue 37: a network to test a backfill against; `riptide sim --hosts N`,
//! [`Sim::bind_network`]): N PDS hosts, each on its own loopback port with its own accounts'
//! `getRepo`/`listRepos`/`describeRepo`/`describeServer`, listed by the relay's `listHosts`;
//! per-host rate limits per client IP ([`limit`]) with the PDS's headers; host and repository
//! faults chosen up front ([`plan`], broken exports from [`tamper`]) and listed in a manifest
//! (`GET /_sim/manifest`); `listReposByCollection`; one repository of any size generated as it
//! is sent ([`riptide_gen::HugeRepo`]); repositories as of a relay seq (`repos.json`). The
//! endpoints, the manifest's format and the consistency guarantee are in the crate's README.
//!
//! [`fixture`] builds small signed accounts in memory for tests.
//!
//! Why the relay is mounted rather than on a second port: one base URL is then PLC, PDS and relay,
//! so a test or a user needs one address, and the sim's HTTP faults (5xx, drops, delay) hit the
//! upgrade like any request. axum's WebSocket type is not tungstenite's, so the sim performs the
//! upgrade and hands the raw connection to `riptide_relay::RelayService::serve` (see `server`).
//!
//! What it is not: a PDS (no writes, no auth), or a faithful PLC directory (no audit log, and
//! DIDs not derived from their genesis operations: see [`plc`]). The documents are served as
//! loaded; only the PDS endpoint is rewritten. Requests are counted per
//! endpoint ([`Counters`]) so tests can assert how many lookups reached the network.

mod fault;
pub mod fixture;
pub mod limit;
mod network;
mod pds;
pub mod plan;
pub mod plc;
mod server;
pub mod tamper;

pub use fault::{Faults, RELAY_ERROR};
pub use network::{Account, Network, SimError};
pub use plan::{HostFault, PlanConfig, RepoFault};
pub use server::{Counters, Listeners, Sim, SimHandle};
