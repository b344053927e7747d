//! Discovery: which accounts to backfill, page by page.
//!
//! Why a module: the sources of work are several and all are paged XRPC listings with cursors
//! that the state keeps ([`crate::state::Listing`]): the relay's
//! `com.atproto.sync.listHosts` and then each host's own `com.atproto.sync.listRepos`
//! (PDS-direct, as Jetstream v2 crawls), the relay's `listRepos` (as Tap's full-network mode),
//! the relay's `com.atproto.sync.listReposByCollection` for exact collection NSIDs, or a file of
//! DIDs. This module builds the requests and reads the answers; the scheduler (`run`) sends them
//! under each host's listing rate.
//!
//! Answers are input: a page is read with a size bound, an entry whose DID is not a DID is
//! counted and reported (never silently dropped), and a listing that fails is reported with its
//! host.

use std::time::Duration;

use riptide_syntax::is_valid_did;
use serde::Deserialize;

/// Largest listing page read.
const MAX_PAGE_BYTES: usize = 16 << 20;

/// One account in a listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The DID.
    pub did: String,
    /// The host's status for an inactive account (`deactivated`, `takendown`, `suspended`…):
    /// not fetched, recorded as that failure.
    pub inactive: Option<String>,
}

/// One page of a listing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Page {
    /// The accounts.
    pub entries: Vec<Entry>,
    /// Entries whose `did` is not a DID (counted, reported).
    pub invalid: Vec<String>,
    /// The next page's cursor (`None`: the last page).
    pub cursor: Option<String>,
}

/// One host of the relay's `listHosts`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HostEntry {
    /// The hostname (`pds.example.com`; on loopback `127.0.0.1:PORT`).
    pub hostname: String,
    /// Accounts on it, as the relay counts.
    #[serde(default)]
    pub account_count: Option<u64>,
    /// `active`, `idle`, `offline`, `throttled`, `banned`.
    #[serde(default)]
    pub status: Option<String>,
}

/// Why a listing page could not be had.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ListError {
    /// `429`: wait this long.
    #[error("rate-limited: wait {0:?}")]
    RateLimited(Duration),
    /// The server does not implement the method (404, 501, `MethodNotImplemented`).
    #[error("{0}: not implemented by the server")]
    NotImplemented(String),
    /// Anything else (network, status, a body that is not the lexicon's).
    #[error("{0}")]
    Failed(String),
}

/// `http(s)://` base of a `listHosts` hostname: a hostname with a scheme is used as it is; one
/// on loopback (`localhost`, `127.x`, `[::1]`) is plain HTTP (a test network); any other is
/// HTTPS, as every public PDS.
pub fn host_base(hostname: &str) -> String {
    if hostname.starts_with("http://") || hostname.starts_with("https://") {
        return hostname.trim_end_matches('/').to_owned();
    }
    let name = hostname.rsplit_once(':').map_or(hostname, |(h, p)| {
        if p.bytes().all(|b| b.is_ascii_digit()) {
            h
        } else {
            hostname
        }
    });
    let local = name == "localhost" || name.starts_with("127.") || name == "[::1]";
    format!("{}://{hostname}", if local { "http" } else { "https" })
}

/// Sends one listing request and reads its JSON body.
pub async fn get_json(http: &reqwest::Client, url: &str) -> Result<serde_json::Value, ListError> {
    let mut resp = http
        .get(url)
        .send()
        .await
        .map_err(|e| ListError::Failed(format!("{url}: {e}")))?;
    let status = resp.status().as_u16();
    if status == 429 {
        let wait = riptide_resolver::rate_limit_wait(resp.headers(), std::time::SystemTime::now())
            .unwrap_or(Duration::from_secs(60));
        return Err(ListError::RateLimited(wait));
    }
    let mut body = Vec::new();
    loop {
        match resp.chunk().await {
            Ok(Some(c)) => {
                if body.len() + c.len() > MAX_PAGE_BYTES {
                    return Err(ListError::Failed(format!(
                        "{url}: page larger than {MAX_PAGE_BYTES} bytes"
                    )));
                }
                body.extend_from_slice(&c);
            }
            Ok(None) => break,
            Err(e) => return Err(ListError::Failed(format!("{url}: {e}"))),
        }
    }
    let v: Option<serde_json::Value> = serde_json::from_slice(&body).ok();
    let xrpc_error = v
        .as_ref()
        .and_then(|v| v.get("error"))
        .and_then(|e| e.as_str());
    if status == 404 || status == 501 || xrpc_error == Some("MethodNotImplemented") {
        return Err(ListError::NotImplemented(url.to_owned()));
    }
    if status != 200 {
        return Err(ListError::Failed(format!(
            "{url}: HTTP {status}{}",
            xrpc_error.map(|e| format!(" ({e})")).unwrap_or_default()
        )));
    }
    v.ok_or_else(|| ListError::Failed(format!("{url}: the body is not JSON")))
}

/// A listing URL: `{base}/xrpc/{method}?limit=…[&collection=…][&cursor=…]`.
pub fn page_url(
    base: &str,
    method: &str,
    limit: usize,
    collection: Option<&str>,
    cursor: Option<&str>,
) -> String {
    let mut url = format!("{base}/xrpc/{method}?limit={limit}");
    if let Some(c) = collection {
        url.push_str("&collection=");
        url.push_str(&encode(c));
    }
    if let Some(c) = cursor {
        url.push_str("&cursor=");
        url.push_str(&encode(c));
    }
    url
}

/// Percent-encodes a query value (a cursor is opaque: it may hold anything).
fn encode(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for b in v.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~' | b':') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A `listRepos` or `listReposByCollection` page (`repos: [{did, active?, status?}]`).
pub fn parse_repos(v: &serde_json::Value) -> Result<Page, ListError> {
    let repos = v
        .get("repos")
        .and_then(|r| r.as_array())
        .ok_or_else(|| ListError::Failed("the page has no `repos` array".to_owned()))?;
    let mut page = Page {
        cursor: cursor_of(v),
        ..Page::default()
    };
    for r in repos {
        let did = r.get("did").and_then(|d| d.as_str()).unwrap_or_default();
        if !is_valid_did(did) {
            page.invalid.push(truncated(&r.to_string()));
            continue;
        }
        let active = r.get("active").and_then(|a| a.as_bool()).unwrap_or(true);
        let inactive = (!active).then(|| {
            r.get("status")
                .and_then(|s| s.as_str())
                .unwrap_or("inactive")
                .to_owned()
        });
        page.entries.push(Entry {
            did: did.to_owned(),
            inactive,
        });
    }
    Ok(page)
}

/// A `listHosts` page: its hosts and the next cursor.
pub fn parse_hosts(v: &serde_json::Value) -> Result<(Vec<HostEntry>, Option<String>), ListError> {
    let hosts = v
        .get("hosts")
        .cloned()
        .ok_or_else(|| ListError::Failed("the page has no `hosts` array".to_owned()))?;
    let hosts: Vec<HostEntry> =
        serde_json::from_value(hosts).map_err(|e| ListError::Failed(format!("listHosts: {e}")))?;
    Ok((hosts, cursor_of(v)))
}

fn cursor_of(v: &serde_json::Value) -> Option<String> {
    v.get("cursor")
        .and_then(|c| c.as_str())
        .filter(|c| !c.is_empty())
        .map(str::to_owned)
}

fn truncated(s: &str) -> String {
    let mut end = s.len().min(200);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}

/// DIDs from a file, one per line (blank lines and `#` comments ignored): the valid ones, and
/// the lines that are not DIDs (reported).
pub fn parse_did_file(text: &str) -> (Vec<String>, Vec<String>) {
    let mut dids = Vec::new();
    let mut bad = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if is_valid_did(line) {
            dids.push(line.to_owned());
        } else {
            bad.push(truncated(line));
        }
    }
    dids.sort();
    dids.dedup();
    (dids, bad)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn pages_of_repos_and_hosts() {
        let p = parse_repos(&json!({
            "cursor": "abc",
            "repos": [
                {"did": "did:plc:aaaa", "head": "x", "rev": "y", "active": true},
                {"did": "did:plc:bbbb", "head": "x", "rev": "y", "active": false, "status": "takendown"},
                {"did": "not a did"},
                {"head": "no did"}
            ]
        }))
        .unwrap();
        assert_eq!(p.cursor.as_deref(), Some("abc"));
        assert_eq!(
            p.entries,
            vec![
                Entry {
                    did: "did:plc:aaaa".into(),
                    inactive: None
                },
                Entry {
                    did: "did:plc:bbbb".into(),
                    inactive: Some("takendown".into())
                }
            ]
        );
        assert_eq!(p.invalid.len(), 2);
        assert_eq!(parse_repos(&json!({"repos": []})).unwrap().cursor, None);
        assert!(parse_repos(&json!({"dids": []})).is_err());
        let (hosts, cursor) = parse_hosts(&json!({
            "hosts": [
                {"hostname": "pds.example.com", "accountCount": 7, "status": "active", "seq": 5},
                {"hostname": "bad.example.com", "status": "banned"}
            ]
        }))
        .unwrap();
        assert_eq!(cursor, None);
        assert_eq!(hosts[0].account_count, Some(7));
        assert_eq!(hosts[1].status.as_deref(), Some("banned"));
    }

    #[test]
    fn urls_and_bases() {
        assert_eq!(host_base("pds.example.com"), "https://pds.example.com");
        assert_eq!(host_base("127.0.0.1:8080"), "http://127.0.0.1:8080");
        assert_eq!(host_base("localhost:1"), "http://localhost:1");
        assert_eq!(host_base("http://x:1/"), "http://x:1");
        assert_eq!(
            page_url("http://h", "com.atproto.sync.listReposByCollection", 500, Some("app.bsky.feed.post"), Some("a b&c")),
            "http://h/xrpc/com.atproto.sync.listReposByCollection?limit=500&collection=app.bsky.feed.post&cursor=a%20b%26c"
        );
        let (dids, bad) = parse_did_file("# c\ndid:plc:b\n\ndid:plc:a\nnope\ndid:plc:a\n");
        assert_eq!(dids, vec!["did:plc:a", "did:plc:b"]);
        assert_eq!(bad, vec!["nope"]);
    }
}
