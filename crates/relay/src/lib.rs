//! A local `com.atproto.sync.subscribeRepos` server that serves a list of frames as a relay would.
//!
//! Why it exists: tests, benchmarks, the simulator and offline demos need a relay on loopback that
//! behaves like the real one — its own increasing seqs, `?cursor=N` replay, live fan-out, pings —
//! and that can misbehave on demand ([`Faults`]: dropped connections, slow frames, 5xx on upgrade,
//! error frames).
//!
//! Model: one shared, bounded log of the last [`RelayConfig::window`] events, each with the seq the
//! relay assigned (spliced into the frame's payload, see [`SeqSlot`]). A feeder task appends the
//! given frames (paced by [`RelayConfig::rate`], repeated with [`RelayConfig::looped`]); callers
//! may append more with [`RelayService::publish`]. Every subscriber runs one pull loop over its own
//! position in the log, so there is no per-subscriber queue to overflow; a subscriber that falls
//! out of the window gets a `ConsumerTooSlow` error frame and is closed, as the real relay does.
//!
//! Mounting: [`Relay::bind`] listens on its own port; [`Relay::start`] gives a [`RelayService`]
//! with no listener, whose [`RelayService::serve`] takes a WebSocket another HTTP server already
//! upgraded (how `riptide sim` serves `subscribeRepos` on its own base URL).
//!
//! Cursor semantics (as the relay): no cursor = live; `cursor=N` replays events with seq > N;
//! N beyond the newest seq → error frame `FutureCursor`, then close; N older than the window →
//! `#info OutdatedCursor`, then replay from the oldest event kept.
//!
//! ```no_run
//! # async fn demo(frames: Vec<bytes::Bytes>) -> Result<(), riptide_relay::RelayError> {
//! use riptide_relay::{Relay, RelayConfig};
//! let (addr, relay) = Relay::bind("127.0.0.1:0".parse().unwrap(), frames, RelayConfig::default()).await?;
//! println!("ws://{addr}/xrpc/com.atproto.sync.subscribeRepos?cursor=0");
//! relay.shutdown().await;
//! # Ok(()) }
//! ```

mod frames;
mod log;
mod server;

use std::time::Duration;

pub use frames::{error_frame, info_frame, SeqSlot};
pub use server::{parse_cursor, Relay, RelayHandle, RelayService, RelayStats};

/// The XRPC path the relay serves.
pub const SUBSCRIBE_PATH: &str = "/xrpc/com.atproto.sync.subscribeRepos";

/// What can go wrong setting up or feeding a relay.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RelayError {
    /// A frame published ([`RelayService::publish`]) does not decode as far as its payload's `seq`.
    /// (Frames given at start are left out and counted instead: [`RelayStats::unservable`].)
    #[error("frame {index}: {reason}")]
    Frame {
        /// Index of the frame in the list given.
        index: usize,
        /// Why.
        reason: String,
    },
    /// Binding the listening socket failed.
    #[error("binding {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: std::net::SocketAddr,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// How the relay serves.
#[derive(Clone, Debug)]
pub struct RelayConfig {
    /// Events per second appended to the log by the feeder; `None` appends all at once.
    pub rate: Option<f64>,
    /// Repeat the frames forever, seqs still increasing. Give a `rate` with it: unpaced, the
    /// feeder appends without end and the window turns over faster than anyone can read it.
    pub looped: bool,
    /// Events kept for cursor replay (older ones are forgotten; cursors before them are outdated).
    /// Bounds memory: with `looped`, the log would otherwise grow without end.
    pub window: usize,
    /// The first seq assigned.
    pub first_seq: u64,
    /// How often each subscriber is pinged. A subscriber silent for three intervals is dropped.
    pub ping_interval: Duration,
    /// Misbehaviour on demand.
    pub faults: Faults,
}

impl Default for RelayConfig {
    fn default() -> RelayConfig {
        RelayConfig {
            rate: None,
            looped: false,
            window: 10_000,
            first_seq: 1,
            ping_interval: Duration::from_secs(30),
            faults: Faults::default(),
        }
    }
}

/// Fault injection, for tests and the simulator. Counts are per connection unless stated.
#[derive(Clone, Debug, Default)]
pub struct Faults {
    /// Drop the TCP connection (no close frame) after this many event frames.
    pub drop_after: Option<usize>,
    /// Wait this long before each frame.
    pub frame_delay: Option<Duration>,
    /// Answer the first K upgrade attempts (counted across all connections) with
    /// [`Faults::reject_status`] instead of upgrading.
    pub reject_upgrades: usize,
    /// The status for rejected upgrades; 503 when 0.
    pub reject_status: u16,
    /// After this many event frames, send an error frame with this `error` name and close.
    pub error_after: Option<(usize, String)>,
    /// Serve every frame given at start exactly as it is: its `seq` not rewritten, and frames
    /// that do not decode served too (nothing left out). For streams made to be hostile
    /// (`riptide mutate`), whose seqs and bytes are part of what is tested. Each frame still takes
    /// one position in the log, so `?cursor=N` resumes after the N-th frame.
    pub verbatim: bool,
}
