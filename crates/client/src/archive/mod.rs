//! Jetstream v2's archive, read: `planSnapshot` → `getSegment`/`getBlock` → rows, then (for a
//! replay) the live `subscribeEvents` from where the archive ends.
//!
//! Why a module of the client crate: a v2 consumer that starts from the past reads the archive
//! first and the live wire after, and must see every event once across the switch; the live side
//! is [`crate::JetstreamV2Client`], so the switch lives beside it. The contract mirrored is the
//! `atproto` SDK's `JetstreamClient.snapshot()` / `replay()` (`oracles/jetstream-v2/`):
//!
//! - **Plan.** `planSnapshot` pages from `afterSeq` until `plannedThroughSeq` reaches the
//!   `sealedTipSeq` of the first page (pinned: later pages ask `beforeSeq` = that tip, so a
//!   segment sealed meanwhile is left to the live wire). Every page must advance the cursor; one
//!   that does not is an error ([`ArchiveError::Stalled`]), not a loop.
//! - **Download.** A `segment` entry is fetched whole by `getSegment` in ranges (8 MiB by
//!   default, as the SDK), resumed after an interruption from the first missing byte with
//!   `If-Range`; a `blocks` entry block by block with `getBlock`. A segment is held in memory
//!   while it is decoded (bounded by [`ArchiveConfig::max_segment_bytes`]).
//! - **Rows.** Decoded with `riptide-segment` (files verified), filtered exactly by the request
//!   (a plan is a superset), each payload checked to be DAG-CBOR and each record's CID computed
//!   (module `decode`); delivered in seq order, each seq once.
//! - **Replay** ([`Replay`]): the snapshot up to the pinned tip, then the live stream with
//!   `cursor = tip + 1` and the same filters; the live client drops anything at or below the
//!   last seq delivered, so an event is delivered once across the switch.
//!
//! Errors: a transient failure (connection, timeout, 5xx, 408, 429 with its `Retry-After`) is
//! retried with backoff; when [`ArchiveConfig::max_attempts`] fail in a row it ends the read as
//! [`ArchiveError::Unavailable`]. A refusal (other 4xx), a corrupt file or plan, a request that
//! does not validate are permanent ([`ArchiveError::is_permanent`]). Decoding runs on the calling
//! task (CPU work of a few hundred ns an event).

mod decode;
mod filter;
mod http;
mod replay;

use std::collections::VecDeque;
use std::time::Duration;

pub use decode::{ArchiveEvent, RowDecoder};
pub use replay::{Replay, ReplayEvent};

use filter::RowFilter;
use http::{Http, PlanEntry};

use crate::{Backoff, ClientError, V2Filter};

/// What to read, from where.
#[derive(Clone, Debug)]
pub struct ArchiveConfig {
    /// The server: `http(s)://host[:port]`, `ws(s)://…`, `host:port`, with or without `/xrpc`
    /// or a full `…/xrpc/network.bsky.jetstream.subscribeEvents` URL.
    pub url: String,
    /// Sent as `Authorization: Bearer <token>` on every archive request.
    pub token: Option<String>,
    /// `kinds`, `dids`, `collections` as for the live wire (`max_message_size_bytes` is ignored).
    pub filter: V2Filter,
    /// Events after this seq (exclusive).
    pub after_seq: Option<u64>,
    /// Events up to this seq (inclusive); a snapshot only.
    pub before_seq: Option<u64>,
    /// Bytes per `getSegment` range (default 8 MiB, as the `atproto` SDK).
    pub range_bytes: u64,
    /// Largest segment accepted (default 1 GiB; Jetstream seals at 256 MiB).
    pub max_segment_bytes: u64,
    /// Failed attempts in a row after which a request gives up (default 8).
    pub max_attempts: u32,
    /// Delays between attempts.
    pub backoff: Backoff,
    /// Time allowed for one request, its body included (default 120 s).
    pub timeout: Duration,
}

impl ArchiveConfig {
    /// Defaults for `url`.
    pub fn new(url: impl Into<String>) -> ArchiveConfig {
        ArchiveConfig {
            url: url.into(),
            token: None,
            filter: V2Filter::default(),
            after_seq: None,
            before_seq: None,
            range_bytes: 8 << 20,
            max_segment_bytes: 1 << 30,
            max_attempts: 8,
            backoff: Backoff {
                base: Duration::from_millis(100),
                max: Duration::from_secs(10),
                healthy_after: Duration::from_secs(60),
            },
            timeout: Duration::from_secs(120),
        }
    }
}

/// What ends an archive read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ArchiveError {
    /// Not a usable server URL.
    #[error("not a usable archive URL: {0}")]
    InvalidUrl(String),
    /// The request is one `planSnapshot` refuses (checked before asking).
    #[error("invalid archive request: {0}")]
    InvalidRequest(String),
    /// The server refused (a 4xx other than 408 and 429: `InvalidRequest`, `AuthRequired`,
    /// `SegmentNotFound`, …).
    #[error("refused with HTTP {status}{}: {message}", if .error.is_empty() { String::new() } else { format!(" {}", .error) })]
    Refused {
        /// The HTTP status.
        status: u16,
        /// The XRPC error name (empty when the body was not an XRPC envelope).
        error: String,
        /// The message (or the body).
        message: String,
    },
    /// Transient failures went on for `attempts` tries.
    #[error("{what}: gave up after {attempts} failed attempts; the last: {last}")]
    Unavailable {
        /// The request.
        what: String,
        /// Attempts made.
        attempts: u32,
        /// The last failure.
        last: String,
    },
    /// A segment, block or plan that does not verify or decode.
    #[error("corrupt archive data: {0}")]
    Corrupt(String),
    /// A segment larger than [`ArchiveConfig::max_segment_bytes`].
    #[error("{what}: {bytes} bytes, more than the {limit} allowed")]
    TooLarge {
        /// What was too large: a segment, a block's answer, a `planSnapshot` page.
        what: String,
        /// Its size.
        bytes: u64,
        /// The limit.
        limit: u64,
    },
    /// A `planSnapshot` page that did not advance (a server bug; the read would loop).
    #[error("planSnapshot did not advance: asked after seq {after:?}, planned through {planned}, sealed tip {tip}")]
    Stalled {
        /// The page's `afterSeq`.
        after: Option<u64>,
        /// Its `plannedThroughSeq`.
        planned: u64,
        /// The pinned `sealedTipSeq`.
        tip: u64,
    },
    /// The live stream of a replay ended with this error.
    #[error("live stream: {0}")]
    Live(#[from] ClientError),
}

impl ArchiveError {
    /// Whether waiting and asking again could not change it (everything but
    /// [`ArchiveError::Unavailable`]).
    pub fn is_permanent(&self) -> bool {
        !matches!(self, ArchiveError::Unavailable { .. })
    }
}

/// Counters of one read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ArchiveStats {
    /// `planSnapshot` pages.
    pub plan_pages: u64,
    /// Whole segments downloaded.
    pub segments: u64,
    /// Blocks downloaded with `getBlock`.
    pub blocks: u64,
    /// Bytes downloaded.
    pub bytes: u64,
    /// Events delivered from the archive.
    pub events: u64,
    /// Rows not delivered: their payload is not DAG-CBOR (logged).
    pub rows_rejected: u64,
    /// Rows at or below a seq already delivered (not delivered again).
    pub duplicates: u64,
    /// Requests retried after a transient failure.
    pub retries: u64,
    /// Downloads cut short mid-body (then resumed).
    pub interrupted: u64,
    /// Downloads restarted from byte 0 because the file changed (`If-Range` answered `200`).
    pub restarts: u64,
}

/// The archive's events, in seq order, each once: see the module docs.
#[derive(Debug)]
pub struct Snapshot {
    http: Http,
    filter: RowFilter,
    spec: V2Filter,
    decoder: RowDecoder,
    /// The pinned `sealedTipSeq` (after the first page).
    tip: Option<u64>,
    /// `afterSeq` of the next page.
    cursor: Option<u64>,
    planned: bool,
    entries: VecDeque<PlanEntry>,
    ready: VecDeque<ArchiveEvent>,
    /// The last seq delivered.
    last: Option<u64>,
}

impl Snapshot {
    /// A reader; nothing is asked until [`Snapshot::next`].
    pub fn new(config: ArchiveConfig) -> Result<Snapshot, ArchiveError> {
        let filter = RowFilter::new(&config.filter, config.after_seq, config.before_seq)?;
        Ok(Snapshot {
            http: Http::new(&config)?,
            filter,
            spec: config.filter,
            decoder: RowDecoder::new(),
            tip: None,
            cursor: config.after_seq,
            planned: false,
            entries: VecDeque::new(),
            ready: VecDeque::new(),
            last: None,
        })
    }

    /// The next event; `None` once the archive up to the pinned sealed tip is read.
    pub async fn next(&mut self) -> Result<Option<ArchiveEvent>, ArchiveError> {
        loop {
            if let Some(e) = self.ready.pop_front() {
                self.last = Some(e.seq());
                self.http.stats.events += 1;
                return Ok(Some(e));
            }
            if let Some(entry) = self.entries.pop_front() {
                self.fetch(entry).await?;
            } else if self.planned {
                return Ok(None);
            } else {
                self.plan_page().await?;
            }
        }
    }

    /// The `sealedTipSeq` the read is pinned to (known after the first page).
    pub fn sealed_tip(&self) -> Option<u64> {
        self.tip
    }

    /// The last seq delivered.
    pub fn last_seq(&self) -> Option<u64> {
        self.last
    }

    /// The counters so far.
    pub fn stats(&self) -> ArchiveStats {
        ArchiveStats {
            rows_rejected: self.decoder.rejected,
            ..self.http.stats
        }
    }

    async fn plan_page(&mut self) -> Result<(), ArchiveError> {
        let before = match (self.filter.before_seq, self.tip) {
            (Some(b), Some(t)) => Some(b.min(t)),
            (b, t) => b.or(t),
        };
        let mut body = serde_json::Map::new();
        let mut put = |k: &str, v: serde_json::Value| {
            body.insert(k.to_owned(), v);
        };
        if !self.spec.kinds.is_empty() {
            put("kinds", self.spec.kinds.clone().into());
        }
        if !self.spec.dids.is_empty() {
            put("dids", self.spec.dids.clone().into());
        }
        if !self.spec.collections.is_empty() {
            put("collections", self.spec.collections.clone().into());
        }
        if let Some(a) = self.cursor {
            put("afterSeq", a.into());
        }
        if let Some(b) = before {
            put("beforeSeq", b.into());
        }
        let page = self.http.plan(&serde_json::Value::Object(body)).await?;
        let tip = *self.tip.get_or_insert(page.sealed_tip_seq);
        let stalled = ArchiveError::Stalled {
            after: self.cursor,
            planned: page.planned_through_seq,
            tip,
        };
        if page.planned_through_seq > tip {
            return Err(stalled);
        }
        if page.planned_through_seq >= tip || self.cursor.is_some_and(|c| c >= tip) {
            self.planned = true;
        } else if self.cursor.unwrap_or(0) >= page.planned_through_seq {
            return Err(stalled);
        }
        self.cursor = Some(page.planned_through_seq);
        self.entries.extend(page.segments);
        Ok(())
    }

    async fn fetch(&mut self, e: PlanEntry) -> Result<(), ArchiveError> {
        if riptide_segment::parse_segment_name(&e.name).is_none() {
            return Err(ArchiveError::Corrupt(format!(
                "planSnapshot named {:?}, not a segment file",
                e.name
            )));
        }
        if !self.filter.overlaps(e.min_seq, e.max_seq) {
            return Ok(());
        }
        let mut out = Vec::new();
        match e.mode.as_str() {
            "segment" => {
                let bytes = self.http.segment(&e.name).await?;
                self.decoder
                    .segment(&e.name, &bytes, &self.filter, &mut out)?;
            }
            "blocks" => {
                for r in &e.blocks {
                    if r.first > r.last {
                        return Err(ArchiveError::Corrupt(format!(
                            "{}: block range {}..{}",
                            e.name, r.first, r.last
                        )));
                    }
                    for i in r.first..=r.last {
                        let frame = self.http.block(&e.name, i).await?;
                        let what = format!("{} block {i}", e.name);
                        self.decoder.block(&what, &frame, &self.filter, &mut out)?;
                    }
                }
            }
            m => {
                return Err(ArchiveError::Corrupt(format!(
                    "{}: unknown plan mode {m:?}",
                    e.name
                )))
            }
        }
        let mut last = self.ready.back().map(ArchiveEvent::seq).or(self.last);
        for ev in out {
            if last.is_some_and(|l| ev.seq() <= l) {
                self.http.stats.duplicates += 1;
                continue;
            }
            last = Some(ev.seq());
            self.ready.push_back(ev);
        }
        Ok(())
    }
}
