//! The archive's three requests over HTTP, with retries: `planSnapshot`, `getSegment` in ranges
//! (resumed with `Range` + `If-Range` after an interruption), `getBlock`.
//!
//! Why a module: what is transient and what is permanent is decided here once, as for the live
//! clients (`session`): a connection that fails or breaks, a timeout, a 5xx, 408 or 429 (whose
//! `Retry-After` is waited out) is retried with backoff up to
//! [`super::ArchiveConfig::max_attempts`] failures in a row; any other 4xx is the request's own
//! fault and returned at once ([`ArchiveError::Refused`]).

use std::time::Duration;

use bytes::Bytes;
use reqwest::header::{
    HeaderMap, CONTENT_LENGTH, CONTENT_RANGE, CONTENT_TYPE, ETAG, IF_RANGE, RANGE, RETRY_AFTER,
};
use reqwest::{Response, StatusCode};
use serde::Deserialize;

use super::{ArchiveConfig, ArchiveError, ArchiveStats};
use crate::{Backoff, ClientError};

const NSID: &str = "network.bsky.jetstream.";
/// Longest `Retry-After` honoured; a longer one is waited for this long, then asked again.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(120);

/// A `planSnapshot` answer (the fields the client uses).
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PlanPage {
    pub planned_through_seq: u64,
    pub sealed_tip_seq: u64,
    pub segments: Vec<PlanEntry>,
}

/// One planned unit: a whole segment, or ranges of its blocks.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PlanEntry {
    pub name: String,
    pub min_seq: u64,
    pub max_seq: u64,
    pub mode: String,
    #[serde(default)]
    pub blocks: Vec<PlanBlocks>,
}

#[derive(Clone, Copy, Debug, Deserialize)]
pub(crate) struct PlanBlocks {
    pub first: u32,
    pub last: u32,
}

/// Why one attempt failed.
enum Failure {
    /// Worth another attempt (after this long, when the server said).
    Transient(String, Option<Duration>),
    Permanent(ArchiveError),
}

impl From<reqwest::Error> for Failure {
    fn from(e: reqwest::Error) -> Failure {
        Failure::Transient(error_chain(&e), None)
    }
}

/// At most this much of a refusal's body is read (its reason, for the error).
const ERROR_BODY_BYTES: usize = 4 << 10;
/// At most this much of one `planSnapshot` page: a page of the lexicon's 100,000 entries is a few
/// MiB of JSON.
const PLAN_PAGE_BYTES: usize = 64 << 20;

/// A response's body, at most `cap` bytes: a server is not trusted with this process's memory.
/// `truncate`: keep the first `cap` bytes and stop (a refusal's reason); otherwise a longer body
/// is a [`ArchiveError::TooLarge`] of `what`.
async fn body_capped(
    mut resp: Response,
    cap: usize,
    what: &str,
    truncate: bool,
) -> Result<Vec<u8>, Failure> {
    let mut buf = Vec::new();
    while let Some(chunk) = resp.chunk().await? {
        if buf.len() + chunk.len() > cap {
            if truncate {
                buf.extend_from_slice(&chunk[..cap - buf.len()]);
                break;
            }
            return Err(Failure::Permanent(ArchiveError::TooLarge {
                what: what.to_owned(),
                bytes: (buf.len() + chunk.len()) as u64,
                limit: cap as u64,
            }));
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(buf)
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(x) = src {
        s.push_str(": ");
        s.push_str(&x.to_string());
        src = x.source();
    }
    s
}

/// The archive's HTTP side.
#[derive(Debug)]
pub(crate) struct Http {
    client: reqwest::Client,
    /// `scheme://authority[/prefix]/xrpc/`
    xrpc: String,
    token: Option<String>,
    range_bytes: u64,
    max_segment_bytes: u64,
    max_attempts: u32,
    backoff: Backoff,
    timeout: Duration,
    pub(crate) stats: ArchiveStats,
}

impl Http {
    pub(crate) fn new(cfg: &ArchiveConfig) -> Result<Http, ArchiveError> {
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| ArchiveError::InvalidUrl(format!("{}: {e}", cfg.url)))?;
        Ok(Http {
            client,
            xrpc: xrpc_base(&cfg.url)?,
            token: cfg.token.clone(),
            range_bytes: cfg.range_bytes.max(1),
            max_segment_bytes: cfg.max_segment_bytes,
            max_attempts: cfg.max_attempts.max(1),
            backoff: cfg.backoff,
            timeout: cfg.timeout,
            stats: ArchiveStats::default(),
        })
    }

    fn request(&self, method: reqwest::Method, endpoint: &str) -> reqwest::RequestBuilder {
        let mut r = self
            .client
            .request(method, format!("{}{NSID}{endpoint}", self.xrpc))
            .timeout(self.timeout);
        if let Some(t) = &self.token {
            r = r.bearer_auth(t);
        }
        r
    }

    /// Sends; a non-success status is a [`Failure`].
    async fn send(&self, r: reqwest::RequestBuilder) -> Result<Response, Failure> {
        let resp = r.send().await?;
        let status = resp.status();
        if status.is_success() || status == StatusCode::NOT_MODIFIED {
            return Ok(resp);
        }
        let retry_after = retry_after(resp.headers());
        let body = body_capped(resp, ERROR_BODY_BYTES, "an error body", true)
            .await
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default();
        let code = status.as_u16();
        if status.is_server_error() || code == 408 || code == 429 {
            return Err(Failure::Transient(
                format!("HTTP {code}: {}", body.trim()),
                retry_after,
            ));
        }
        Err(Failure::Permanent(
            match crate::session::refusal(code, &body) {
                ClientError::Refused {
                    status,
                    error,
                    message,
                } => ArchiveError::Refused {
                    status,
                    error,
                    message,
                },
                other => ArchiveError::Live(other),
            },
        ))
    }

    /// Waits before attempt `failures + 1`; the error once attempts are used up.
    async fn failed(&mut self, what: &str, failures: u32, f: Failure) -> Result<(), ArchiveError> {
        let (reason, after) = match f {
            Failure::Permanent(e) => return Err(e),
            Failure::Transient(r, a) => (r, a),
        };
        if failures >= self.max_attempts {
            return Err(ArchiveError::Unavailable {
                what: what.to_owned(),
                attempts: failures,
                last: reason,
            });
        }
        self.stats.retries += 1;
        let wait = after.map_or_else(
            || self.backoff.delay(failures, &mut rand::thread_rng()),
            |a| a.min(MAX_RETRY_AFTER),
        );
        tracing::warn!(%what, failures, ?wait, "archive request failed: {reason}; retrying");
        tokio::time::sleep(wait).await;
        Ok(())
    }

    /// One `planSnapshot` page.
    pub(crate) async fn plan(
        &mut self,
        body: &serde_json::Value,
    ) -> Result<PlanPage, ArchiveError> {
        let mut failures = 0;
        loop {
            let attempt = async {
                let r = self
                    .send(
                        self.request(reqwest::Method::POST, "planSnapshot")
                            .header(CONTENT_TYPE, "application/json")
                            .body(body.to_string()),
                    )
                    .await?;
                let bytes = body_capped(r, PLAN_PAGE_BYTES, "a planSnapshot page", false).await?;
                serde_json::from_slice::<PlanPage>(&bytes).map_err(|e| {
                    Failure::Permanent(ArchiveError::Corrupt(format!(
                        "planSnapshot answered something that is not a plan: {e}"
                    )))
                })
            };
            match attempt.await {
                Ok(p) => {
                    self.stats.plan_pages += 1;
                    return Ok(p);
                }
                Err(f) => {
                    failures += 1;
                    self.failed("planSnapshot", failures, f).await?;
                }
            }
        }
    }

    /// One block's bare zstd frame.
    pub(crate) async fn block(&mut self, segment: &str, index: u32) -> Result<Bytes, ArchiveError> {
        let what = format!("getBlock {segment} #{index}");
        let mut failures = 0;
        loop {
            let attempt = async {
                let r = self
                    .send(
                        self.request(reqwest::Method::GET, "getBlock")
                            .query(&[("segment", segment), ("blockIndex", &index.to_string())]),
                    )
                    .await?;
                let cap = usize::try_from(self.max_segment_bytes).unwrap_or(usize::MAX);
                Ok::<_, Failure>(Bytes::from(body_capped(r, cap, &what, false).await?))
            };
            match attempt.await {
                Ok(b) => {
                    self.stats.blocks += 1;
                    self.stats.bytes += b.len() as u64;
                    return Ok(b);
                }
                Err(f) => {
                    failures += 1;
                    self.failed(&what, failures, f).await?;
                }
            }
        }
    }

    /// A whole sealed segment, in ranges of `range_bytes`. A range cut short is asked again from
    /// the first missing byte with `If-Range` (the first answer's `ETag`), so a file replaced
    /// meanwhile comes back whole (`200`) instead of being spliced.
    pub(crate) async fn segment(&mut self, name: &str) -> Result<Vec<u8>, ArchiveError> {
        let what = format!("getSegment {name}");
        let mut buf: Vec<u8> = Vec::new();
        let mut etag: Option<String> = None;
        let mut total: Option<u64> = None;
        let mut failures = 0;
        loop {
            let start = buf.len() as u64;
            if total.is_some_and(|t| start >= t) {
                break;
            }
            let end = match total {
                Some(t) => (start + self.range_bytes).min(t) - 1,
                None => start + self.range_bytes - 1,
            };
            let mut r = self
                .request(reqwest::Method::GET, "getSegment")
                .query(&[("name", name)])
                .header(RANGE, format!("bytes={start}-{end}"));
            if let Some(e) = &etag {
                r = r.header(IF_RANGE, e.as_str());
            }
            match self
                .range(name, r, start, &mut buf, &mut etag, &mut total)
                .await
            {
                Ok(()) => failures = 0,
                Err(f) => {
                    failures += 1;
                    self.failed(&what, failures, f).await?;
                }
            }
        }
        self.stats.segments += 1;
        Ok(buf)
    }

    /// One ranged request's answer appended to `buf` (what arrived, even when the body breaks).
    async fn range(
        &mut self,
        name: &str,
        r: reqwest::RequestBuilder,
        start: u64,
        buf: &mut Vec<u8>,
        etag: &mut Option<String>,
        total: &mut Option<u64>,
    ) -> Result<(), Failure> {
        let corrupt = |m: String| {
            Failure::Permanent(ArchiveError::Corrupt(format!("getSegment {name}: {m}")))
        };
        let mut resp = self.send(r).await?;
        let tag = resp
            .headers()
            .get(ETAG)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        match resp.status() {
            StatusCode::NO_CONTENT => {
                // A range starting exactly at the end of the file.
                *total = Some(start);
                return Ok(());
            }
            StatusCode::OK => {
                // The whole (perhaps replaced) file.
                if start > 0 {
                    self.stats.restarts += 1;
                    buf.clear();
                }
                *total = resp
                    .headers()
                    .get(CONTENT_LENGTH)
                    .and_then(|v| v.to_str().ok()?.parse().ok());
                *etag = tag;
            }
            StatusCode::PARTIAL_CONTENT => {
                let (first, len) = resp
                    .headers()
                    .get(CONTENT_RANGE)
                    .and_then(|v| content_range(v.to_str().ok()?))
                    .ok_or_else(|| corrupt("206 without a usable Content-Range".into()))?;
                if first != start || total.is_some_and(|t| t != len) {
                    return Err(corrupt(format!(
                        "asked for bytes from {start} of {total:?}, got from {first} of {len}"
                    )));
                }
                *total = Some(len);
                if etag.is_none() {
                    *etag = tag;
                }
            }
            s => return Err(corrupt(format!("unexpected HTTP {s}"))),
        }
        if let Some(t) = *total {
            if t > self.max_segment_bytes {
                return Err(Failure::Permanent(ArchiveError::TooLarge {
                    what: name.to_owned(),
                    bytes: t,
                    limit: self.max_segment_bytes,
                }));
            }
        }
        loop {
            let chunk = match resp.chunk().await {
                Ok(Some(c)) => c,
                Ok(None) => break,
                Err(e) => {
                    self.stats.interrupted += 1;
                    return Err(e.into());
                }
            };
            self.stats.bytes += chunk.len() as u64;
            buf.extend_from_slice(&chunk);
            if buf.len() as u64 > total.unwrap_or(self.max_segment_bytes) {
                return Err(corrupt(format!("more than {total:?} bytes")));
            }
        }
        if total.is_none() {
            *total = Some(buf.len() as u64);
        }
        Ok(())
    }
}

/// `bytes A-B/LEN` → (A, LEN).
fn content_range(v: &str) -> Option<(u64, u64)> {
    let rest = v.trim().strip_prefix("bytes ")?;
    let (range, len) = rest.split_once('/')?;
    let (a, b) = range.split_once('-')?;
    let (a, b, len): (u64, u64, u64) = (a.parse().ok()?, b.parse().ok()?, len.parse().ok()?);
    (a <= b && b < len).then_some((a, len))
}

fn retry_after(h: &HeaderMap) -> Option<Duration> {
    h.get(RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
        .map(Duration::from_secs)
}

/// `http(s)://authority[/prefix]/xrpc/` from a base URL in any of the forms the live clients
/// take: `http(s)://` or `ws(s)://`, a bare `host:port`, with or without `/xrpc` or a full
/// endpoint path (`…/xrpc/network.bsky.jetstream.subscribeEvents`).
pub(crate) fn xrpc_base(url: &str) -> Result<String, ArchiveError> {
    let url = url.trim();
    let bad = || ArchiveError::InvalidUrl(url.to_owned());
    let (scheme, rest) = match url.split_once("://") {
        Some(("ws" | "http", r)) => ("http", r),
        Some(("wss" | "https", r)) => ("https", r),
        Some(_) => return Err(bad()),
        None => ("http", url),
    };
    let (authority, path) = rest.split_at(rest.find(['/', '?']).unwrap_or(rest.len()));
    if authority.is_empty() || authority.contains(char::is_whitespace) || authority.contains('@') {
        return Err(bad());
    }
    let path = path.split(['?', '#']).next().unwrap_or("");
    let prefix = match path.find("/xrpc") {
        Some(i) => &path[..i],
        None => path.trim_end_matches('/'),
    };
    let base = format!("{scheme}://{authority}{prefix}/xrpc/");
    reqwest::Url::parse(&base).map_err(|_| bad())?;
    Ok(base)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_urls_in_every_form_the_live_clients_take() {
        for (given, want) in [
            ("http://h:1", "http://h:1/xrpc/"),
            ("ws://h:1/", "http://h:1/xrpc/"),
            ("wss://h/xrpc", "https://h/xrpc/"),
            ("h:1", "http://h:1/xrpc/"),
            (
                "ws://h:1/xrpc/network.bsky.jetstream.subscribeEvents?kinds=commit",
                "http://h:1/xrpc/",
            ),
            ("https://h/js/xrpc/", "https://h/js/xrpc/"),
            ("https://h/js", "https://h/js/xrpc/"),
        ] {
            assert_eq!(xrpc_base(given).unwrap(), want, "{given}");
        }
        for bad in ["ftp://h", "http://", "http://u@h", "http://h:99999"] {
            assert!(
                matches!(xrpc_base(bad), Err(ArchiveError::InvalidUrl(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn content_ranges() {
        assert_eq!(content_range("bytes 0-9/10"), Some((0, 10)));
        assert_eq!(
            content_range("bytes 8388608-8388999/9000000"),
            Some((8388608, 9000000))
        );
        for bad in ["bytes 5-4/10", "bytes 0-10/10", "bytes */10", "0-9/10"] {
            assert_eq!(content_range(bad), None, "{bad}");
        }
    }
}
