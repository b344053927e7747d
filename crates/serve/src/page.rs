//! The status page at `GET /`: how the server is doing, for a person with a browser.
//!
//! Why (issue 39): `/metrics` is for Prometheus and the status line for the journal; an operator
//! who opens the server's address in a browser (as Jetstream v2's status page invites) should see
//! at a glance where the upstream is, whether it is connected and how far behind, the rates in and
//! out, what verification refused, the subscribers on each wire, the store, resync, backfill and
//! the archive.
//!
//! **One source.** Every figure is read from the same atomics `/metrics` renders and the status
//! line reads (`status::Snapshot`, `status::Status`, `Metrics`); a number cell carries the name of
//! the `/metrics` series it equals (`data-metric`; a name without labels whose series are all
//! labelled means their sum), so a test (and a curious operator) can check the page against
//! `/metrics`. The rates are differences of those totals over a window of at least
//! [`status::RATE_WINDOW`](crate::status::RATE_WINDOW) (`status::Recent`), said with the window.
//!
//! **Self-contained.** One server-rendered HTML document: inline style, no script, no external
//! asset, a `<meta http-equiv="refresh">` every [`REFRESH_S`] seconds. Every text that comes from
//! outside (an upstream's address, an error message) is HTML-escaped ([`escape`]).

use std::fmt::Write as _;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use riptide_firehose::verify::Verdict;

use crate::metrics::SlowDrop;
use crate::server::App;
use crate::status::{Snapshot, Status};

/// How often the page reloads itself (seconds).
pub const REFRESH_S: u32 = 10;

/// `GET /`.
pub(crate) async fn index(State(app): State<Arc<App>>) -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        render(&app),
    )
        .into_response()
}

/// `s` with `&`, `<`, `>`, `"` and `'` as character references: safe in text and in a quoted
/// attribute.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// `n` with a comma every three digits (`1,234,567`).
fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A byte count for a person: `12.5 MiB`.
/// The backfill's row (`serve --backfill`: `crate::backfill`), the numbers `/metrics` renders.
fn backfill(doc: &mut Doc, b: &crate::backfill::BackfillMetrics) {
    if !b.enabled() {
        doc.text("State", "not running", "riptide serve --backfill runs one");
        return;
    }
    doc.text("State", b.state(), &b.error().unwrap_or_default());
    let Some(st) = b.status() else {
        return;
    };
    doc.count(
        "Hosts done",
        "riptide_backfill_listings{state=\"done\"}",
        st.listings_done,
        "listings crawled to their end",
    );
    doc.count(
        "Hosts left",
        "riptide_backfill_listings{state=\"left\"}",
        st.listings_left,
        &format!("{} with problems", st.listing_problems.len()),
    );
    doc.count(
        "Repositories ok",
        "riptide_backfill_repos_total{outcome=\"ok\"}",
        st.repos_ok,
        "verified and stored",
    );
    for (reason, n) in &st.repos_failed {
        doc.count(
            &format!("Failed: {reason}"),
            &format!("riptide_backfill_repos_total{{outcome=\"{reason}\"}}"),
            *n,
            "",
        );
    }
    doc.count(
        "Records",
        "riptide_backfill_records_total",
        st.records,
        &human_bytes(st.bytes),
    );
    doc.count(
        "Superseded",
        "riptide_backfill_superseded_total",
        b.superseded.load(Relaxed),
        "the store held a newer commit",
    );
    doc.text(
        "Rate",
        &format!("{:.1} repositories/s", st.repos_per_sec),
        &format!("{:.0} records/s", st.records_per_sec),
    );
    let eta = match st.eta_secs {
        Some(e) => format!("{e:.0} s"),
        None => "unknown".into(),
    };
    doc.text(
        "ETA",
        &eta,
        &st.expected_repos
            .map(|n| format!("{n} accounts expected"))
            .unwrap_or_default(),
    );
}

fn human_bytes(n: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", units[u])
    }
}

/// A duration for a person: `2.5 s`, `4 min 10 s`, `3 h 5 min`, `147 d 2 h`.
fn human_secs(s: f64) -> String {
    let whole = s.max(0.0) as u64;
    match whole {
        0..=119 => format!("{s:.1} s"),
        120..=7_199 => format!("{} min {} s", whole / 60, whole % 60),
        7_200..=172_799 => format!("{} h {} min", whole / 3_600, whole / 60 % 60),
        _ => format!("{} d {} h", whole / 86_400, whole / 3_600 % 24),
    }
}

/// The page's body, section by section: a table of rows, each a label, a value and a note.
struct Doc {
    html: String,
}

impl Doc {
    fn section(&mut self, title: &str) {
        if self.html.ends_with("</tr>\n") {
            self.html.push_str("</table>\n");
        }
        let _ = writeln!(self.html, "<h2>{}</h2>\n<table>", escape(title));
    }

    /// A row whose value is text (escaped here).
    fn text(&mut self, label: &str, value: &str, note: &str) {
        let _ = writeln!(
            self.html,
            "<tr><th>{}</th><td>{}</td><td class=\"note\">{}</td></tr>",
            escape(label),
            escape(value),
            escape(note)
        );
    }

    /// A row whose value is the `/metrics` series `metric` (its name and labels, as `/metrics`
    /// writes them), shown grouped by thousands.
    fn count(&mut self, label: &str, metric: &str, value: u64, note: &str) {
        let _ = writeln!(
            self.html,
            "<tr><th>{}</th><td class=\"num\" data-metric=\"{}\">{}</td><td class=\"note\">{}</td></tr>",
            escape(label),
            escape(metric),
            grouped(value),
            escape(note)
        );
    }

    /// A row whose value is a rate (one decimal, aligned with the counts).
    fn rate(&mut self, label: &str, per_s: f64, note: &str) {
        let _ = writeln!(
            self.html,
            "<tr><th>{}</th><td class=\"num\">{per_s:.1}</td><td class=\"note\">{}</td></tr>",
            escape(label),
            escape(note)
        );
    }

    fn finish(mut self) -> String {
        if self.html.ends_with("</tr>\n") {
            self.html.push_str("</table>\n");
        }
        self.html.push_str("</body>\n</html>\n");
        self.html
    }
}

const STYLE: &str = "body{font-family:sans-serif;margin:1.5em;color:#111;background:#fff}\
h1{font-size:1.4em;margin:0 0 .2em}h2{font-size:1.1em;margin:1.2em 0 .3em}\
table{border-collapse:collapse;table-layout:fixed;width:56em}\
th{text-align:left;font-weight:normal;width:13em;padding:.15em 1em .15em 0}\
td{padding:.15em 1em .15em 0;overflow-wrap:anywhere}td:nth-child(2){width:14em}\
td.num{text-align:right;font-variant-numeric:tabular-nums}\
td.note{color:#555}.bad{color:#a00}.good{color:#060}";

/// The whole page for `app` now.
pub fn render(app: &App) -> String {
    let m = &app.metrics;
    let now = tokio::time::Instant::now();
    let snap = Snapshot::of(app);
    let (since, base) = app.recent.window(now, snap);
    let window = now.saturating_duration_since(since);
    let st = Status::between(app, &base, &snap, window);
    let ready = crate::server::readiness(app);
    let mut doc = Doc {
        html: String::with_capacity(16 * 1024),
    };
    let _ = write!(
        doc.html,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta http-equiv=\"refresh\" content=\"{REFRESH_S}\">\n\
         <title>riptide serve</title>\n<style>{STYLE}</style>\n</head>\n<body>\n\
         <h1>riptide serve</h1>\n<p>{} · up {} s · <span class=\"{}\" id=\"readiness\">{}</span></p>\n",
        escape(env!("CARGO_PKG_VERSION")),
        app.started.elapsed().as_secs(),
        if ready.is_ok() { "good" } else { "bad" },
        escape(&match &ready {
            Ok(()) => "ready".to_owned(),
            Err(why) => format!("not ready: {why}"),
        }),
    );

    doc.section("Upstream");
    let sources = if app.config.sources.is_empty() {
        "none".to_owned()
    } else {
        app.config.sources.join(", ")
    };
    doc.text("Source", &sources, "");
    let client = m.upstream_client.get();
    doc.text(
        "Connected",
        match st.upstream_connected {
            Some(true) => "yes",
            Some(false) => "no",
            None => "n/a",
        },
        match st.upstream_connected {
            None => "not a relay connection",
            Some(_) => "",
        },
    );
    if let Some(err) = client.and_then(|c| c.last_error()) {
        doc.text("Last error", &err, "");
    }
    doc.count(
        "Upstream seq",
        "riptide_upstream_seq",
        st.upstream_seq,
        "the last stored",
    );
    doc.text(
        "Lag",
        &st.upstream_lag_s.map_or_else(|| "-".to_owned(), human_secs),
        "from the relay's time of the newest event stored to now",
    );
    doc.count(
        "Frames in",
        "riptide_upstream_frames_total",
        m.frames_in.load(Relaxed),
        "since start",
    );
    doc.count(
        "Duplicates skipped",
        "riptide_upstream_frames_duplicate_total",
        snap.duplicates,
        "at or below the stored cursor",
    );

    doc.section("Events");
    let over = format!(
        "events per second, over the last {:.0} s",
        window.as_secs_f64()
    );
    doc.rate("In", st.events_per_s, &over);
    doc.rate("Out", st.events_out_per_s, &over);
    doc.count(
        "Stored",
        "riptide_events_stored_total",
        snap.events_stored,
        "since start",
    );
    doc.count(
        "Sent",
        "riptide_events_out_total",
        snap.events_out,
        "since start, both wires",
    );

    doc.section("Verdicts");
    for v in Verdict::ALL {
        doc.count(
            v.as_str(),
            &format!("riptide_verdicts_total{{verdict=\"{v}\"}}"),
            m.verdict_count(v),
            if v == Verdict::Ok {
                "served"
            } else {
                "refused"
            },
        );
    }

    doc.section("Subscribers");
    doc.count(
        "v1 /subscribe",
        "riptide_endpoint_subscribers{endpoint=\"subscribe\"}",
        st.subscribers_v1,
        "",
    );
    doc.count(
        "v2 subscribeEvents",
        "riptide_endpoint_subscribers{endpoint=\"subscribeEvents\"}",
        st.subscribers_v2,
        "",
    );
    for r in SlowDrop::ALL {
        doc.count(
            &format!("Dropped: {}", r.as_str()),
            &format!(
                "riptide_slow_consumer_drops_total{{reason=\"{}\"}}",
                r.as_str()
            ),
            m.slow_drop_count(r),
            "since start",
        );
    }
    doc.count(
        "Connections refused",
        "riptide_connections_refused_total",
        snap.connections_refused,
        "over the limits, since start",
    );

    doc.section("Store");
    doc.count(
        "Size",
        "riptide_store_bytes",
        st.store_bytes,
        &format!(
            "{}, at the last retention pass",
            human_bytes(st.store_bytes)
        ),
    );
    doc.count(
        "Floor",
        "riptide_retention_floor",
        m.retention_floor.load(Relaxed),
        "the oldest seq kept",
    );
    doc.count("Next seq", "riptide_log_next_seq", app.log.next_seq(), "");

    doc.section("Resync");
    let in_flight = m.resync_in_flight.load(Relaxed);
    let accounts = m.resync_accounts.load(Relaxed);
    doc.text(
        "State",
        if in_flight > 0 || accounts > 0 {
            "resyncing"
        } else {
            "idle"
        },
        "",
    );
    doc.count(
        "Accounts waiting",
        "riptide_resync_accounts",
        accounts,
        "their frames held",
    );
    doc.count("In flight", "riptide_resync_in_flight", in_flight, "");
    doc.count(
        "Frames held",
        "riptide_resync_held_frames",
        m.resync_held.load(Relaxed),
        "",
    );
    doc.count(
        "Queued",
        "riptide_resync_queued_total",
        m.resync_queued.load(Relaxed),
        "since start",
    );
    doc.count(
        "Landed",
        "riptide_resync_landed_total",
        m.resync_landed.load(Relaxed),
        "since start",
    );

    doc.section("Backfill");
    backfill(&mut doc, &m.backfill);

    doc.section("Archive");
    let segs = app.archive.segments().snapshot();
    doc.count(
        "Segments served",
        "riptide_archive_segments",
        segs.len() as u64,
        "",
    );
    let seg_bytes: u64 = segs.iter().map(|s| s.len).sum();
    doc.count(
        "Segment bytes",
        "riptide_archive_segment_bytes",
        seg_bytes,
        &human_bytes(seg_bytes),
    );
    for (i, e) in ["getSegment", "getBlock"].iter().enumerate() {
        doc.count(
            &format!("{e} requests"),
            &format!("riptide_archive_requests_total{{endpoint=\"{e}\"}}"),
            app.archive.metrics.requests[i + 2].load(Relaxed),
            "since start",
        );
    }

    let role = m.kafka.role();
    if role != crate::KafkaRole::None {
        doc.section("Kafka");
        let k = &m.kafka;
        match role {
            crate::KafkaRole::Edge => {
                doc.text(
                    "Role",
                    "edge (--from)",
                    if k.following.load(Relaxed) {
                        "following the topic"
                    } else {
                        "waiting for the topic"
                    },
                );
                doc.count(
                    "Records consumed",
                    "riptide_kafka_records_consumed_total",
                    k.records_consumed.load(Relaxed),
                    "",
                );
                doc.count(
                    "Lag",
                    "riptide_kafka_lag_records",
                    k.lag_records.load(Relaxed),
                    "records",
                );
            }
            _ => {
                doc.text(
                    "Role",
                    "ingest (--publish)",
                    if k.lease_held.load(Relaxed) {
                        "lease held"
                    } else {
                        "standby"
                    },
                );
                doc.count(
                    "Published seq",
                    "riptide_kafka_published_seq",
                    k.published_seq.load(Relaxed),
                    "",
                );
                doc.count(
                    "Transactions",
                    "riptide_kafka_transactions_committed_total",
                    k.transactions_committed.load(Relaxed),
                    "committed",
                );
            }
        }
    }

    doc.section("Dropped");
    doc.count(
        "Upstream messages",
        "riptide_upstream_dropped_total",
        snap.upstream_dropped,
        "over the size limit, or text; since start",
    );
    doc.count(
        "Ops",
        "riptide_ops_dropped_total",
        snap.ops_dropped,
        "no event made of them; since start",
    );
    doc.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Log, Metrics, ServerConfig, Store, TailLimits};

    /// The page of a server whose counters moved, with an upstream name full of markup: every
    /// figure is there beside its series, and the markup is text.
    #[test]
    fn the_page_says_the_counters_beside_their_series_and_escapes_names() {
        let dir = tempfile::tempdir().unwrap();
        let (store, r) = Store::open(dir.path(), 0).unwrap();
        let log = Arc::new(Log::new(store, r.next_seq, TailLimits::default()));
        let config = ServerConfig {
            sources: vec!["wss://<b>relay</b>&co".into()],
            ..ServerConfig::default()
        };
        let app = App::new(log, Arc::new(Metrics::default()), config);
        let m = &app.metrics;
        m.upstream_seq.store(4_242, Relaxed);
        m.events_stored.fetch_add(1_234_567, Relaxed);
        for _ in 0..3 {
            m.verdict(Verdict::RevRegression);
        }
        m.store_bytes.store(12_500_000, Relaxed);
        let page = render(&app);
        assert!(page.starts_with("<!DOCTYPE html>"), "{page}");
        assert!(page.ends_with("</html>\n"), "{page}");
        for want in [
            "<td>wss://&lt;b&gt;relay&lt;/b&gt;&amp;co</td>",
            "data-metric=\"riptide_upstream_seq\">4,242<",
            "data-metric=\"riptide_events_stored_total\">1,234,567<",
            "data-metric=\"riptide_verdicts_total{verdict=&quot;rev-regression&quot;}\">3<",
            "data-metric=\"riptide_store_bytes\">12,500,000<",
            "<td>not running</td>",
        ] {
            assert!(page.contains(want), "{want} not in {page}");
        }
        assert!(!page.contains("<b>"), "{page}");
        assert!(!page.contains("<script"), "no script: {page}");
        assert_eq!(
            page.matches("<table>").count(),
            page.matches("</table>").count()
        );
    }

    #[test]
    fn escape_makes_markup_text() {
        assert_eq!(
            escape(r#"<script>alert("x&y")</script> it's"#),
            "&lt;script&gt;alert(&quot;x&amp;y&quot;)&lt;/script&gt; it&#39;s"
        );
        assert_eq!(escape("wss://bsky.network"), "wss://bsky.network");
    }

    #[test]
    fn numbers_are_grouped_and_sizes_human() {
        assert_eq!(grouped(0), "0");
        assert_eq!(grouped(999), "999");
        assert_eq!(grouped(1_000), "1,000");
        assert_eq!(grouped(12_345_678), "12,345,678");
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(12_500_000), "11.9 MiB");
        assert_eq!(human_secs(2.54), "2.5 s");
        assert_eq!(human_secs(250.0), "4 min 10 s");
        assert_eq!(human_secs(11_100.0), "3 h 5 min");
        assert_eq!(human_secs(12_700_742.3), "146 d 23 h");
    }
}
