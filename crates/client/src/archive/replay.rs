//! The archive, then the live `subscribeEvents`, every event once across the switch.
//!
//! Why a module: the switch is the one place where an event could be lost or doubled. The
//! snapshot is read up to the `sealedTipSeq` pinned by its first plan page (or the seq the caller
//! starts after, if higher); the live stream then starts at `cursor = that + 1` (inclusive) with
//! the same filters, and anything the server sends at or below it is dropped (counted). Live
//! reconnects resume after the last seq delivered ([`crate::JetstreamV2Client`]).

use std::sync::Arc;

use super::http::xrpc_base;
use super::{ArchiveConfig, ArchiveError, ArchiveEvent, ArchiveStats, Snapshot};
use crate::jetstream_v2::SUBSCRIBE_EVENTS;
use crate::{ClientConfig, ClientStats, JetstreamV2Client, JetstreamV2Config, V2Message};

/// One event of a replay.
#[derive(Clone, Debug)]
pub enum ReplayEvent {
    /// From the archive.
    Archive(ArchiveEvent),
    /// From the live stream (including `#info` messages, which have no seq).
    Live(V2Message),
}

impl ReplayEvent {
    /// The event's seq (`None` for a live `#info`).
    pub fn seq(&self) -> Option<u64> {
        match self {
            ReplayEvent::Archive(e) => Some(e.seq()),
            ReplayEvent::Live(m) => m.payload.seq,
        }
    }
}

/// A replay: see the module docs.
pub struct Replay {
    snapshot: Snapshot,
    /// Until the switch: the live side's settings.
    pending: Option<JetstreamV2Config>,
    live: Option<JetstreamV2Client>,
    /// The last seq of the archive side; live events at or below it are dropped.
    boundary: u64,
    live_dropped: u64,
}

impl std::fmt::Debug for Replay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replay")
            .field("snapshot", &self.snapshot)
            .field("live", &self.live)
            .field("boundary", &self.boundary)
            .finish_non_exhaustive()
    }
}

impl Replay {
    /// A replay of `archive` (its `before_seq` must be unset: a replay runs into the live
    /// stream). `live` gives the live connection's settings; its `hosts`, when empty, are the
    /// archive's server, and its `start_cursor` and `cursor_store` are replaced (the switch
    /// decides where live starts). `dictionary`: as [`JetstreamV2Config::dictionary`].
    pub fn new(
        archive: ArchiveConfig,
        mut live: ClientConfig,
        dictionary: Option<Vec<u8>>,
    ) -> Result<Replay, ArchiveError> {
        if archive.before_seq.is_some() {
            return Err(ArchiveError::InvalidRequest(
                "a replay runs into the live stream: beforeSeq is for a snapshot".into(),
            ));
        }
        if live.hosts.is_empty() {
            let base = xrpc_base(&archive.url)?;
            let ws = base
                .replacen("https://", "wss://", 1)
                .replacen("http://", "ws://", 1);
            live.hosts = vec![format!(
                "{}{}",
                ws.trim_end_matches("/xrpc/"),
                SUBSCRIBE_EVENTS
            )];
        }
        live.cursor_store = None;
        let filter = archive.filter.clone();
        let boundary = archive.after_seq.unwrap_or(0);
        Ok(Replay {
            snapshot: Snapshot::new(archive)?,
            pending: Some(JetstreamV2Config {
                client: live,
                filter,
                dictionary,
            }),
            live: None,
            boundary,
            live_dropped: 0,
        })
    }

    /// The next event: the archive's, then the live stream's. Waits through live disconnects;
    /// ends only with an error.
    pub async fn next(&mut self) -> Result<ReplayEvent, ArchiveError> {
        if let Some(cfg) = self.pending.take() {
            let next = self.snapshot.next().await;
            if !matches!(next, Ok(None)) {
                // Not switched yet (an error leaves the archive to be resumed by another call).
                self.pending = Some(cfg);
                let e = next?.ok_or(ArchiveError::Live(crate::ClientError::Closed))?;
                self.boundary = self.boundary.max(e.seq());
                return Ok(ReplayEvent::Archive(e));
            }
            self.boundary = self.boundary.max(self.snapshot.sealed_tip().unwrap_or(0));
            let mut cfg = cfg;
            cfg.client.start_cursor = Some(self.boundary as i64 + 1);
            tracing::info!(
                boundary = self.boundary,
                "archive read; joining the live stream"
            );
            self.live = Some(JetstreamV2Client::new(cfg)?);
        }
        let Some(live) = self.live.as_mut() else {
            return Err(ArchiveError::Live(crate::ClientError::Closed));
        };
        loop {
            let m = live.next().await?;
            if m.payload.seq.is_some_and(|s| s <= self.boundary) {
                self.live_dropped += 1;
                continue;
            }
            return Ok(ReplayEvent::Live(m));
        }
    }

    /// Whether the archive is read and events now come live.
    pub fn is_live(&self) -> bool {
        self.live.is_some()
    }

    /// The archive side's counters.
    pub fn stats(&self) -> ArchiveStats {
        self.snapshot.stats()
    }

    /// The live side's counters, once it started.
    pub fn live_stats(&self) -> Option<Arc<ClientStats>> {
        self.live.as_ref().map(JetstreamV2Client::stats)
    }

    /// Live events dropped at the switch (at or below the archive's last seq).
    pub fn live_dropped(&self) -> u64 {
        self.live_dropped
    }

    /// The seq where the archive side ended (the live stream starts after it).
    pub fn boundary(&self) -> u64 {
        self.boundary
    }
}
