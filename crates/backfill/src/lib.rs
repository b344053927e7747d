//! Verified backfill of the whole network: every repository fetched from its PDS, verified
//! whole, written once, resumable.
//!
//! Why a crate: a new consumer needs the network's existing records, and the live stream only
//! has what arrives while it runs. Others backfill without verifying signatures (Jetstream v2's
//! "relay-trusted default") or slowly (Tap); this crate verifies every repository (CIDs, the
//! commit's signature with the key of the account's DID document, the MST's structure and
//! root) as fast as the PDSes' rate limits allow (issue 37).
//!
//! The parts, each a module:
//! - [`discover`]: where the accounts come from (the relay's `listHosts` then each host's
//!   `listRepos`; the relay's `listRepos`; `listReposByCollection`; a DID file);
//! - [`limits`]: per-host token buckets and concurrency, `429` pauses, the global bound;
//! - [`metrics`]: the `riptide_backfill_*` families as Prometheus text, for every process that
//!   runs a crawl;
//! - [`fetch`]: identity (key, PDS), then one `getRepo` per source through
//!   `riptide_resolver::resync`'s fetch (size bound, spooling, timeout, minimum rate);
//! - [`verify`]: the whole-repository check (`riptide_repo::verify_repo`) and the record index,
//!   no I/O;
//! - [`outcome`]: [`Verified`] or a typed [`Failure`] with a stable reason name;
//! - [`sink`]: where records go ([`JsonlSink`]), and [`store_sink`]: into the store that
//!   `riptide serve --data DIR` serves ([`StoreSink`]: rows, chain state and progress in one
//!   batch);
//! - [`landing`]: what a landing's progress entry says ([`Landed`]) and where a landing
//!   interrupted between its pieces goes on, for both writers of a store;
//! - [`state`]: durable progress (fjall): statuses, cursors, counters, the sink's position;
//! - [`run`](mod@run): the crawl that ties them, and [`status`](mod@status): the operator's report.
//!
//! `riptide serve --backfill` runs [`run()`] beside ingest with a sink of its own
//! (`riptide_serve::backfill`): the repositories land through ingest's writer. The crawl over
//! several machines is `riptide-kafka`'s (`backfill` module): its workers reuse [`Getter`] (one
//! account's fetch, one listing request, under the limits) and [`record_line`], and keep their
//! progress in Kafka rather than in [`State`].

pub mod collections;
pub mod discover;
pub mod fetch;
pub mod fetching;
pub mod landing;
pub mod limits;
pub mod metrics;
pub mod outcome;
pub mod run;
pub mod sink;
pub mod state;
pub mod status;
pub mod store_sink;
pub mod verify;

pub use collections::{BadPattern, Collections};
pub use fetch::{Fetcher, Identity};
pub use fetching::Fetching;
pub use landing::{landed_in, Landed};
pub use limits::{HostLimits, Hosts};
pub use outcome::{FailKind, Failure, Record, Verified};
pub use run::{run, BackfillError, Config, Discovery, Getter, Progress};
pub use sink::{record_line, JsonlSink, Sink, SinkError, TeeSink, Written};
pub use state::{Counters, Listing, RepoStatus, State, StateError};
pub use status::{status, Status};
pub use store_sink::StoreSink;
pub use verify::verify_car;
