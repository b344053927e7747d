//! Pulling a PLC directory's `/export` into a [`PlcMirror`], page by page, resumably.
//!
//! Why apart from the mirror: the mirror is storage and checks (no network); this is the HTTP
//! side: `GET {plc}/export?count=N[&after=CURSOR]` (JSON lines, oldest first; the cursor is the
//! last line's `seq`, or its `createdAt` for a directory without sequence numbers), the
//! directory's `429`s waited out as every PLC lookup waits them out ([`crate::plc_pause`]),
//! other failures retried a few times with a growing pause, and each page committed by the
//! mirror with the cursor after it. A page shorter than asked means the copy has caught up:
//! [`pull`] returns; running it again later continues from the cursor.

use std::time::{Duration, SystemTime};

use riptide_identity::plc::DidCheck;

use crate::plc_mirror::{MirrorCounts, MirrorError, PlcMirror};
use crate::plc_pause::{PlcPause, MAX_WAITS};
use crate::resolver::{net, read_limited};
use crate::ResolveError;

/// The most operations asked for per page (the public directory's limit).
pub const MAX_PAGE: usize = 1000;

/// Largest page body accepted (1,000 operations are about 0.5 MB).
const MAX_PAGE_BYTES: usize = 64 << 20;

/// How a [`pull`] runs.
#[derive(Debug, Clone)]
pub struct PullConfig {
    /// The directory's base URL.
    pub plc_url: String,
    /// Operations per page (`count`), at most [`MAX_PAGE`].
    pub page: usize,
    /// What a genesis operation whose DID is not derived from it gets.
    pub did_check: DidCheck,
    /// Attempts per page on a network error or a `5xx` before the pull fails.
    pub attempts: u32,
    /// The first pause between attempts (doubled each time).
    pub backoff: Duration,
    /// Stop after this many pages (`None`: until caught up).
    pub max_pages: Option<u64>,
}

impl Default for PullConfig {
    fn default() -> Self {
        PullConfig {
            plc_url: crate::DEFAULT_PLC_URL.to_owned(),
            page: MAX_PAGE,
            did_check: DidCheck::Strict,
            attempts: 6,
            backoff: Duration::from_millis(500),
            max_pages: None,
        }
    }
}

/// Why a pull stopped early.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PullError {
    /// The directory could not be read (after the attempts); the mirror keeps every page
    /// committed before.
    #[error(transparent)]
    Directory(#[from] ResolveError),
    /// The mirror could not be written.
    #[error(transparent)]
    Mirror(#[from] MirrorError),
    /// A full page that did not move the cursor (no line with a cursor, or the same cursor
    /// again): asking again would get the same page forever.
    #[error("{url}: a page of {lines} lines that does not move the cursor past {cursor:?}")]
    Stuck {
        /// The page asked for.
        url: String,
        /// Its lines.
        lines: usize,
        /// The cursor it was asked after.
        cursor: Option<String>,
    },
}

/// One page's body, with `429`s waited out and transient failures retried.
async fn page(
    http: &reqwest::Client,
    pause: &PlcPause,
    url: &str,
    cfg: &PullConfig,
) -> Result<Vec<u8>, ResolveError> {
    let mut failures = 0;
    let mut waits = 0;
    loop {
        pause.wait().await;
        let r = match http.get(url).send().await {
            Ok(resp) if resp.status().as_u16() == 429 && waits < MAX_WAITS => {
                let asked = crate::resync::rate_limit_wait(resp.headers(), SystemTime::now());
                pause.rate_limited(url, asked);
                waits += 1;
                continue;
            }
            Ok(resp) if resp.status().is_success() => {
                read_limited(url, resp, MAX_PAGE_BYTES, &mut |_, _| {}).await
            }
            Ok(resp) => Err(ResolveError::Status {
                url: url.to_owned(),
                status: resp.status().as_u16(),
            }),
            Err(e) => Err(net(url, e)),
        };
        match r {
            Ok(body) => return Ok(body),
            Err(e) if e.is_transient() && failures + 1 < cfg.attempts => {
                let wait = cfg.backoff * 2u32.saturating_pow(failures);
                tracing::warn!(url, error = %e, ?wait, "PLC export page failed; trying again");
                failures += 1;
                tokio::time::sleep(wait).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Pulls pages into `mirror` from its cursor until a page comes back short (caught up) or
/// `cfg.max_pages` are done; `progress` is called after each committed page. Returns the
/// mirror's counts and the `429`s waited out.
pub async fn pull(
    http: &reqwest::Client,
    mirror: &PlcMirror,
    cfg: &PullConfig,
    progress: &mut dyn FnMut(&MirrorCounts, Option<&str>),
) -> Result<(MirrorCounts, u64), PullError> {
    let pause = PlcPause::default();
    let base = cfg.plc_url.trim_end_matches('/');
    let count = cfg.page.clamp(1, MAX_PAGE);
    let mut pages = 0u64;
    loop {
        let cursor = mirror.cursor()?;
        let url = match &cursor {
            Some(c) => format!("{base}/export?count={count}&after={c}"),
            None => format!("{base}/export?count={count}"),
        };
        let body = page(http, &pause, &url, cfg).await?;
        let out = mirror.apply_page(&body, cfg.did_check)?;
        if out.lines >= count && (out.cursor.is_none() || out.cursor == cursor) {
            return Err(PullError::Stuck {
                url,
                lines: out.lines,
                cursor,
            });
        }
        pages += 1;
        let counts = mirror.counts()?;
        progress(&counts, out.cursor.as_deref());
        if out.lines < count || cfg.max_pages.is_some_and(|m| pages >= m) {
            return Ok((counts, pause.count()));
        }
    }
}
