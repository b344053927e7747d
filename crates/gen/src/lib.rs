//! A synthetic AT Protocol network: signed, valid, realistic firehose streams and repositories,
//! deterministic from a seed.
//!
//! Why: the real relay capture is 150 frames; benchmarks, load tests and reliability tests need
//! millions of events and repositories of hundreds of thousands of records, offline and
//! reproducible. Everything here is built with the same MST, commit and CAR code that verifies
//! (`riptide-repo`, `riptide-car`, `riptide-crypto`), and every generated frame passes
//! `riptide verify` (tested).
//!
//! - [`network`]: accounts with real MST repositories (pre-populated, then evolved) and the
//!   relay stream of their `#commit` (Sync 1.1: `prevData`, `since`, `prev` CIDs, proof nodes
//!   only), `#identity`, `#account` and `#sync` frames.
//! - [`records`]: record shapes and the collection mix; [`account`]: keys (97% secp256k1, 3%
//!   P-256), `did:plc` DIDs, handles, DID documents.
//! - [`adversarial`]: frames broken in one labeled way each, with the expected verdict.
//! - [`big_repo`](mod@big_repo): one large repository export; [`huge_repo`]: one of 1 GiB and
//!   more, generated piece by piece on demand (never held in memory).
//! - [`hosts`]: which PDS host each account lives on (skewed: one large host, a long tail).
//! - [`mutate`](mod@mutate): real or generated frames with one field (or a few bytes) changed,
//!   labelled, for the fault suite's mutation run.
//! - [`stats`]: measuring a stream, and comparing it with the real capture (tolerances: shares
//!   ±0.08 absolute, means within a factor of 1.5; see [`stats::Stats::compare`]).
//! - [`output`]: the directory layout:
//!
//! ```text
//! DIR/firehose-frames.bin   the stream, corpus format (shared/docs/formats.md)
//! DIR/did_docs.json         DID -> DID document, every account (and the big repo's)
//! DIR/adversarial.json      [{"index","defect","expected_verdict"}] (with --adversarial)
//! DIR/repos/<did>.car       each account's full repository at the end (with --repos)
//! DIR/big-repo.car          one large repository export (with --big-repo)
//! DIR/big-repo.did.json     its DID document (one object; `id` is its DID)
//! ```
//!
//! Determinism: the same [`Config`] gives byte-identical files, whatever [`Config::threads`].
//!
//! What it does not do: serve anything (the network simulator does), or talk to the network.

pub mod account;
pub mod adversarial;
pub mod big_repo;
pub mod clock;
pub mod error;
pub mod hosts;
pub mod huge_repo;
pub mod mutate;
pub mod network;
pub mod output;
pub mod records;
pub mod repo;
pub mod stats;
mod words;

pub use account::Account;
pub use adversarial::{AdversarialEntry, Defect};
pub use big_repo::{big_repo, BigRepo};
pub use error::GenError;
pub use hosts::HostSplit;
pub use huge_repo::HugeRepo;
pub use network::{Config, Network};
pub use output::{
    write_dir, write_dir_with, write_network, write_network_with, Stage, Summary, PROGRESS_FRAMES,
};
pub use stats::{measure, Stats};
