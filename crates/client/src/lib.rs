//! Consumers of the AT Protocol event stream: the relay firehose (`subscribeRepos`) and Jetstream
//! (`/subscribe`), as async streams of events that survive network trouble without losing their
//! place.
//!
//! - [`FirehoseClient`]: binary frames as [`bytes::Bytes`], not copied by this crate between the
//!   socket and the decoder (see the `firehose` module for tungstenite's part), with kind and seq
//!   read; `#info` and error frames are events too.
//! - [`JetstreamClient`]: v1 JSON events, typed ([`jetstream::Event`]) with the raw JSON; filters,
//!   `options_update`, zstd with a dictionary.
//! - [`JetstreamV2Client`]: Jetstream v2's `subscribeEvents` (`xrpc.v1.json` frames, `kinds`/
//!   `dids`/`collections`, `zstdDictionary`, seq cursor delivered exactly once per process).
//! - [`Snapshot`] and [`Replay`]: Jetstream v2's archive (`planSnapshot`, `getSegment` in
//!   ranges, `getBlock`), rows decoded and checked (record CIDs computed), then the live
//!   `subscribeEvents` from where the archive ends, each event once (module [`archive`]).
//! - [`PerDid`]: one DID's events in order, different DIDs in parallel, bounded queues.
//!
//! Both streams share one reconnecting session ([`ClientConfig`]): round-robin host rotation,
//! exponential backoff with full jitter reset after a healthy period ([`Backoff`]), ping and read
//! timeout for idle connections, and a cursor the caller persists through a [`CursorStore`].
//!
//! **Delivery is at-least-once.** Reconnects resume after the last event delivered; a restarted
//! process resumes after the last cursor the caller acknowledged (`ack`) and that reached the
//! store. Events processed but not yet acknowledged, or acknowledged but not yet flushed, come
//! again. Order is the server's order on each connection; a resume never skips an event the server
//! still holds (it may repeat some).
//!
//! ```no_run
//! # async fn demo() -> Result<(), riptide_client::ClientError> {
//! use std::sync::Arc;
//! use riptide_client::{ClientConfig, FileCursorStore, FirehoseClient};
//! let mut config = ClientConfig::with_hosts(["wss://bsky.network"]);
//! config.cursor_store = Some(Arc::new(FileCursorStore::new("cursor.txt")));
//! let mut client = FirehoseClient::new(config)?;
//! loop {
//!     let event = client.next().await;
//!     // … process event.bytes …
//!     if let Some(seq) = event.seq { client.ack(seq)?; }
//! }
//! # }
//! ```
//!
//! What it does not do: verify (use `riptide_firehose::verify` on [`FirehoseEvent::bytes`] and
//! count with [`ClientStats::record_verdict`]); resolve identities.

pub mod archive;
mod backoff;
mod cursor;
mod firehose;
pub mod jetstream;
pub mod jetstream_v2;
mod perdid;
mod session;
mod stats;

pub use archive::{
    ArchiveConfig, ArchiveError, ArchiveEvent, ArchiveStats, Replay, ReplayEvent, Snapshot,
};
pub use backoff::Backoff;
pub use cursor::{CursorStore, FileCursorStore, MemoryCursorStore};
pub use firehose::{FirehoseClient, FirehoseEvent, FrameKind, Notice, SUBSCRIBE_REPOS};
pub use jetstream::{
    JetstreamClient, JetstreamConfig, JetstreamEvent, JetstreamOptions, OptionsSender,
};
pub use jetstream_v2::{
    fetch_dictionary, JetstreamV2Client, JetstreamV2Config, V2Filter, V2Message, V2Payload,
};
pub use perdid::PerDid;
pub use session::check_host;
pub use session::ClientConfig;
pub use stats::{ClientStats, StatsSnapshot};

/// What can stop a client. Network trouble never does (it is retried), except a permanent
/// failure ([`ClientError::Refused`], [`ClientError::UnknownHost`], [`ClientError::Relay`]) when
/// the client was told to give up on those ([`ClientConfig::give_up_on_permanent`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// No hosts configured.
    #[error("no hosts given")]
    NoHosts,
    /// A host is not a ws://, wss://, http:// or https:// URL or a host:port.
    #[error("not a usable host URL: {0}")]
    InvalidUrl(String),
    /// Reading or writing the cursor store failed.
    #[error("cursor store: {0}")]
    Cursor(std::io::Error),
    /// The zstd dictionary is unusable.
    #[error("zstd dictionary: {0}")]
    Dictionary(String),
    /// Messages in a row did not decode (see
    /// [`JetstreamClient::next_checked`](crate::JetstreamClient::next_checked)).
    #[error("{count} messages in a row did not decode; the last: {error}")]
    Undecodable {
        /// How many in a row.
        count: u32,
        /// The last one's reason.
        error: String,
    },
    /// The client or pool this handle talks to is gone.
    #[error("closed")]
    Closed,
    /// The server refused the request itself (an HTTP 4xx other than 408 and 429 before the
    /// WebSocket upgrade, e.g. Jetstream v2's `InvalidRequest`, `CursorTooOld`,
    /// `UnknownZstdDictionary`, or a 404 for a wrong path): not retried when giving up on
    /// permanent failures ([`ClientConfig::give_up_on_permanent`]; Jetstream v2 always).
    #[error("refused with HTTP {status}{}: {message}", if .error.is_empty() { String::new() } else { format!(" {}", .error) })]
    Refused {
        /// The HTTP status.
        status: u16,
        /// The XRPC error name (empty when the body was not an XRPC envelope).
        error: String,
        /// The error message (or the body).
        message: String,
    },
    /// The host name does not exist (the resolver answered so; a resolver that cannot be reached
    /// is transient): not retried when giving up on permanent failures.
    #[error("{url}: the host name does not resolve ({reason})")]
    UnknownHost {
        /// The URL tried.
        url: String,
        /// The resolver's answer.
        reason: String,
    },
    /// A one-shot request (`getZstdDictionary`) failed in a way that may pass: the network, a
    /// timeout, a 5xx, 408 or 429. Try again later.
    #[error("{url}: {reason}")]
    Unreachable {
        /// The URL asked.
        url: String,
        /// What went wrong.
        reason: String,
    },
    /// The relay answered with an error frame that waiting will not change (`FutureCursor`: the
    /// cursor is past its newest event; see
    /// [`FirehoseClient::next_checked`](crate::FirehoseClient::next_checked)).
    #[error("the relay answered {name}: {message}")]
    Relay {
        /// The error's name.
        name: String,
        /// Its message (empty when it had none).
        message: String,
    },
}
