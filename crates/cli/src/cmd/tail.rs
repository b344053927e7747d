//! `riptide tail [--relay URL | --jetstream URL] [--collection NSID]… [--did DID]… [--cursor N]
//! [--verify] [--json]` (a contract; `--did-docs`, `--count`, `--zstd-dictionary` are additions).
//!
//! Follows a stream through `riptide-client` (reconnecting, rotating over repeated URLs) and prints
//! one line per event on stdout: JSON or a readable view. Relay frames are summarised as
//! `{"seq","kind","did","time","rev","ops":[{"action","path","cid"}],"verdict"}` (`verdict` with
//! `--verify`; `name`/`message` for `#info` and error frames); Jetstream events are printed as
//! received. `--collection`/`--did` are Jetstream's `wantedCollections`/`wantedDids`; on a relay
//! they filter frames here (a commit passes if one of its ops does; identity and account events
//! ignore `--collection`, as on Jetstream). A live rate goes to stderr when it is a terminal.
//! Exit 1 when `--verify` saw a frame that is not ok.
//!
//! Jetstream v2: a `--jetstream` URL naming `network.bsky.jetstream.subscribeEvents` (e.g.
//! `ws://host/xrpc/network.bsky.jetstream.subscribeEvents`) is read with the v2 client:
//! `--collection`/`--did` are v2's `collections`/`dids`, `--kind` its `kinds`, `--cursor` a seq
//! (inclusive), `--compress` fetches the server's dictionary from `getZstdDictionary` and asks for
//! `zstdDictionary=<its id>` (uncompressed, said once, when the server has none), and
//! `--zstd-dictionary` does the same with a file instead. `--json` prints each
//! frame as received (decompressed); the readable view is `seq kind did [operation
//! collection/rkey]`.
//!
//! Jetstream v2's archive: `--snapshot` (the archive up to its sealed tip) and `--replay` (then
//! the live `subscribeEvents`, each event once) read `planSnapshot`, `getSegment` and `getBlock`
//! (module `archive`).
//!
//! Errors (issue 39), the same on every wire: a permanent one ends `tail` with one line on stderr
//! and exit 1, because waiting would not change it — the server refusing the connection with a
//! 4xx other than 408/429 (its reason given: v2's `InvalidRequest`, `CursorTooOld`, an unknown
//! dictionary; a 404 for a wrong path), a host name that does not exist, a relay's
//! `FutureCursor` error frame (the cursor is past its newest event), or, on `--relay`, 5 text
//! messages in a row (relays send binary frames only: a Jetstream URL given as a relay). A transient one is said on
//! stderr and retried with backoff: a refused or reset connection, a 5xx, 408 or 429, a timeout,
//! a resolver that cannot be reached, and a relay's other error frames (`ConsumerTooSlow`: it
//! dropped us; the reconnect resumes after the last event printed). Error frames are never
//! printed as events. (`riptide_client`'s `give_up_on_permanent` is the rule.)

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use riptide_cbor::{write_json_int, write_json_string};
use riptide_client::{
    ClientConfig, ClientError, FirehoseClient, FirehoseEvent, FrameKind, JetstreamClient,
    JetstreamConfig, JetstreamEvent, JetstreamOptions,
};
use riptide_firehose::verify::{Verdict, Verifier};
use riptide_firehose::{Body, DecodeOptions, FrameDecoder};

mod archive;

use super::DocKeys;
use crate::out;

#[derive(clap::Args, Debug)]
#[command(group(clap::ArgGroup::new("source").required(true).args(["relay", "jetstream"])))]
pub struct Args {
    /// Relay base URL (ws://, wss://, host:port); repeat to rotate over several.
    #[arg(long)]
    relay: Vec<String>,
    /// Jetstream base URL; repeat to rotate over several.
    #[arg(long, conflicts_with = "relay")]
    jetstream: Vec<String>,
    /// Only this collection (exact NSID or `prefix.*`); repeatable.
    #[arg(long = "collection")]
    collections: Vec<String>,
    /// Only this DID; repeatable.
    #[arg(long = "did")]
    dids: Vec<String>,
    /// Start here: a relay seq (events after it) or a Jetstream cursor (inclusive).
    #[arg(long)]
    cursor: Option<i64>,
    /// Verify every relay frame (signatures with --did-docs, Sync 1.1 proofs).
    #[arg(long, requires = "did_docs")]
    verify: bool,
    /// JSON object mapping DID → DID document, for --verify.
    #[arg(long)]
    did_docs: Option<PathBuf>,
    /// One JSON object per event.
    #[arg(long)]
    json: bool,
    /// Stop after this many events (printed ones).
    #[arg(long)]
    count: Option<u64>,
    /// Jetstream: ask for compress=true (v2: zstdDictionary=<its id>) and decompress with this
    /// zstd dictionary.
    #[arg(long)]
    zstd_dictionary: Option<PathBuf>,
    /// Jetstream v2 only: compressed frames, with the server's dictionary fetched from its
    /// getZstdDictionary (--zstd-dictionary gives one instead).
    #[arg(long, conflicts_with_all = ["relay", "zstd_dictionary"])]
    compress: bool,
    /// Jetstream v2 only: this event kind (commit, identity, account, sync); repeatable.
    #[arg(long = "kind", conflicts_with = "relay")]
    kinds: Vec<String>,
    /// Jetstream v2: read the archive (planSnapshot, getSegment, getBlock) up to its sealed tip,
    /// then stop.
    #[arg(long, requires = "jetstream", conflicts_with = "replay")]
    snapshot: bool,
    /// Jetstream v2: read the archive, then the live subscribeEvents from the seq after it, each
    /// event once.
    #[arg(long, requires = "jetstream")]
    replay: bool,
    /// With --snapshot: the last seq wanted (inclusive).
    #[arg(long, requires = "snapshot")]
    before_seq: Option<u64>,
    /// With --snapshot or --replay: sent as `Authorization: Bearer <token>` to the archive.
    #[arg(long)]
    archive_token: Option<String>,
}

/// Whether `--jetstream` names Jetstream v2's endpoint.
fn is_v2(urls: &[String]) -> bool {
    urls.iter()
        .any(|u| u.contains("network.bsky.jetstream.subscribeEvents"))
}

/// Undecodable Jetstream messages in a row after which `tail` gives up (a wrong dictionary, or
/// not a Jetstream server): loud at once rather than dropping everything until Ctrl-C.
const MAX_UNDECODABLE: u32 = 5;

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    // Connection trouble (refused, unreachable, wrong path) is a warning on stderr with the host,
    // the error and the next retry: a tail that prints nothing says why.
    super::serve::init_tracing_with("warn");
    if args.archive_token.is_some() && !(args.snapshot || args.replay) {
        anyhow::bail!("--archive-token is for --snapshot or --replay");
    }
    if args.cursor.is_none() && !(args.snapshot || args.replay) {
        eprintln!(
            "starting live (no cursor): only new events are shown; use --cursor 0 to replay what the server holds"
        );
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        if args.snapshot || args.replay {
            archive::run(args).await
        } else if !args.relay.is_empty() {
            relay(args).await
        } else if is_v2(&args.jetstream) {
            jetstream_v2(args).await
        } else if !args.kinds.is_empty() {
            anyhow::bail!("--kind is a Jetstream v2 filter: give a subscribeEvents URL")
        } else if args.compress {
            anyhow::bail!(
                "--compress fetches Jetstream v2's dictionary: give a subscribeEvents URL (v1: --zstd-dictionary FILE)"
            )
        } else {
            jetstream(args).await
        }
    })
}

async fn jetstream_v2(args: Args) -> anyhow::Result<ExitCode> {
    use riptide_client::{JetstreamV2Client, JetstreamV2Config, V2Filter};
    let mut dictionary = args
        .zstd_dictionary
        .as_deref()
        .map(super::read_file)
        .transpose()?;
    if args.compress {
        // The first host's dictionary: a rotation is over replicas of one server.
        let host = &args.jetstream[0];
        match riptide_client::fetch_dictionary(host, Duration::from_secs(30)).await {
            Ok(Some(d)) => dictionary = Some(d),
            Ok(None) => eprintln!(
                "{host}: the server has no zstd dictionary (getZstdDictionary: 404 DictionaryNotFound): uncompressed"
            ),
            Err(e) => {
                let printer = Printer::new(args.count);
                return gave_up(printer, &args.jetstream, &e, args.cursor);
            }
        }
    }
    let mut client = JetstreamV2Client::new(JetstreamV2Config {
        client: config(args.jetstream.clone(), args.cursor),
        filter: V2Filter {
            kinds: args.kinds.clone(),
            dids: args.dids.clone(),
            collections: args.collections.clone(),
            max_message_size_bytes: 0,
        },
        dictionary,
    })?;
    let stats = client.stats();
    let mut printer = Printer::new(args.count);
    let mut line = Vec::new();
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    while printer.wants_more() {
        let m = tokio::select! {
            m = client.next() => match m {
                Ok(m) => m,
                Err(e) => return gave_up(printer, &args.jetstream, &e, args.cursor),
            },
            _ = &mut ctrl_c => break,
        };
        if args.json {
            printer.line(&m.raw)?;
            continue;
        }
        line.clear();
        v2_line(&m.payload, &mut line)?;
        printer.line(&line)?;
    }
    let printed = printer.finish()?;
    let s = stats.snapshot();
    eprintln!(
        "{printed} events; {} messages, {} bytes, {} reconnects, {} decode errors",
        s.messages, s.bytes, s.reconnects, s.decode_errors
    );
    Ok(ExitCode::SUCCESS)
}

/// The readable view of a v2 message: `seq kind did [operation collection/rkey]`.
fn v2_line(p: &riptide_client::V2Payload, line: &mut Vec<u8>) -> std::io::Result<()> {
    match p.seq {
        Some(s) => write!(line, "{s} {}", p.kind())?,
        None => write!(line, "- {}", p.kind())?,
    }
    if let Some(did) = &p.did {
        write!(line, " {did}")?;
    }
    if let (Some(op), Some(c), Some(k)) = (&p.operation, &p.collection, &p.rkey) {
        write!(line, " {op} {c}/{k}")?;
    }
    if let Some(name) = &p.name {
        write!(line, " {name}: {}", p.message.as_deref().unwrap_or(""))?;
    }
    Ok(())
}

/// The printing side of both loops: one line per event on stdout, flushed at once when someone
/// waits for it (`--count`, or a terminal showing the rate), and the rate on stderr, redrawn at
/// most once a second, only on a terminal.
struct Printer {
    stdout: std::io::BufWriter<std::io::StdoutLock<'static>>,
    /// Events printed.
    n: u64,
    count: Option<u64>,
    rate: bool,
    start: Instant,
    last: Instant,
}

impl Printer {
    fn new(count: Option<u64>) -> Printer {
        let now = Instant::now();
        Printer {
            stdout: out::stdout(),
            n: 0,
            count,
            rate: std::io::stderr().is_terminal(),
            start: now,
            last: now,
        }
    }

    /// Whether `--count` still wants events.
    fn wants_more(&self) -> bool {
        self.count.is_none_or(|n| self.n < n)
    }

    fn line(&mut self, line: &[u8]) -> std::io::Result<()> {
        out::line(&mut self.stdout, line)?;
        if self.count.is_some() || self.rate {
            self.stdout.flush()?;
        }
        self.n += 1;
        if self.rate && self.last.elapsed() >= Duration::from_secs(1) {
            self.last = Instant::now();
            let secs = self.start.elapsed().as_secs_f64().max(1e-9);
            eprint!("\r{} events, {:.0}/s   ", self.n, self.n as f64 / secs);
        }
        Ok(())
    }

    /// Flushes stdout, ends the rate line; the number of events printed.
    fn finish(mut self) -> std::io::Result<u64> {
        self.stdout.flush()?;
        if self.rate {
            eprintln!();
        }
        Ok(self.n)
    }
}

fn config(hosts: Vec<String>, cursor: Option<i64>) -> ClientConfig {
    ClientConfig {
        start_cursor: cursor,
        // A person waits for this: a failure that waiting cannot mend ends it (module docs).
        give_up_on_permanent: true,
        ..ClientConfig::with_hosts(hosts)
    }
}

/// Ends `tail` on a permanent error (module docs): what was printed is flushed, then one line
/// on stderr says why, with what to change where that is known; exit 1.
fn gave_up(
    printer: Printer,
    urls: &[String],
    e: &ClientError,
    cursor: Option<i64>,
) -> anyhow::Result<ExitCode> {
    printer.finish()?;
    let hint = match e {
        ClientError::Relay { name, .. } if name == "FutureCursor" => cursor.map_or_else(
            String::new,
            |c| format!(" (--cursor {c} is past the relay's newest event: give a lower one, or none to start live)"),
        ),
        ClientError::Refused { .. } => " (the server refuses this request: not retried)".into(),
        ClientError::Unreachable { .. } => {
            " (the dictionary could not be fetched: try again, or give --zstd-dictionary FILE)".into()
        }
        _ => " (not retried)".into(),
    };
    // Refusals and relay errors do not name the server; an unknown host does already.
    let at = match e {
        ClientError::UnknownHost { .. } | ClientError::Unreachable { .. } => String::new(),
        _ => format!("{}: ", urls.join(", ")),
    };
    crate::log::fatal(&format!("{at}{e}{hint}"));
    Ok(ExitCode::from(1))
}

async fn relay(args: Args) -> anyhow::Result<ExitCode> {
    let docs = args
        .did_docs
        .as_deref()
        .map(super::load_did_docs)
        .transpose()?;
    let mut verifier = docs
        .as_ref()
        .filter(|_| args.verify)
        .map(|d| Verifier::new(DocKeys(d)));
    let mut client = FirehoseClient::new(config(args.relay.clone(), args.cursor))?;
    let stats = client.stats();
    let mut dec = FrameDecoder::with_options(DecodeOptions {
        decode_blocks: false,
        ..DecodeOptions::unverified()
    });
    let mut printer = Printer::new(args.count);
    let mut line = Vec::with_capacity(1 << 12);
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    while printer.wants_more() {
        let event = tokio::select! {
            e = client.next_checked() => match e {
                Ok(e) => e,
                Err(e) => return gave_up(printer, &args.relay, &e, args.cursor),
            },
            _ = &mut ctrl_c => break,
        };
        if event.kind == FrameKind::Error {
            // Transient (a permanent one ended the run above): said, not printed as an event.
            // The relay closes after it; the client reconnects after the last event printed.
            let (name, message) = event.notice.as_ref().map_or(("?", ""), |n| {
                (n.name.as_str(), n.message.as_deref().unwrap_or(""))
            });
            tracing::warn!(
                host = client.host(),
                resume_after = client.cursor(),
                "the relay sent the error {name}: {message}; reconnecting"
            );
            continue;
        }
        let verdict = match &mut verifier {
            Some(v)
                if matches!(
                    event.kind,
                    FrameKind::Commit | FrameKind::Sync | FrameKind::Identity | FrameKind::Account
                ) =>
            {
                Some(v.verify(&event.bytes))
            }
            _ => None,
        };
        line.clear();
        if render_frame(&event, &mut dec, &args, verdict, &mut line) {
            printer.line(&line)?;
        }
    }
    let printed = printer.finish()?;
    let s = stats.snapshot();
    // The verifier counts its verdicts itself.
    let failed = verifier.as_ref().map_or(0, |v| v.counts().failed());
    eprintln!(
        "{printed} events; {} messages, {} bytes, {} reconnects, {} decode errors{}",
        s.messages,
        s.bytes,
        s.reconnects,
        s.decode_errors,
        match &verifier {
            Some(v) => format!(
                ", {} ok, {failed} failed verification",
                v.counts().get(Verdict::Ok)
            ),
            None => String::new(),
        }
    );
    Ok(if failed > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

fn collection_matches(wanted: &[String], collection: &str) -> bool {
    wanted.is_empty()
        || wanted.iter().any(|w| match w.strip_suffix('*') {
            Some(prefix) => collection.starts_with(prefix),
            None => w == collection,
        })
}

/// Renders one relay frame; false when the filters exclude it.
fn render_frame(
    e: &FirehoseEvent,
    dec: &mut FrameDecoder,
    args: &Args,
    verdict: Option<Verdict>,
    out: &mut Vec<u8>,
) -> bool {
    let frame = match dec.decode(&e.bytes) {
        Ok(f) => f,
        Err(err) => {
            if args.json {
                out.extend_from_slice(b"{\"kind\":\"invalid\",\"error\":");
                write_json_string(out, &err.to_string());
                out.push(b'}');
            } else {
                out.extend_from_slice(format!("invalid frame: {err}").as_bytes());
            }
            return true;
        }
    };
    let body = *frame.body();
    if let Some(did) = body.did() {
        if !args.dids.is_empty() && !args.dids.iter().any(|d| d == did) {
            return false;
        }
    }
    let (time, rev) = match body {
        Body::Commit(c) => (Some(c.time), Some(c.rev)),
        Body::Sync(s) => (Some(s.time), Some(s.rev)),
        Body::Identity(i) => (Some(i.time), None),
        Body::Account(a) => (Some(a.time), None),
        _ => (None, None),
    };
    let ops: Vec<_> = match body {
        Body::Commit(c) => c
            .ops()
            .filter(|op| collection_matches(&args.collections, op.collection()))
            .collect(),
        _ => Vec::new(),
    };
    if matches!(body, Body::Commit(_)) && ops.is_empty() && !args.collections.is_empty() {
        return false;
    }
    let notice = match body {
        Body::Info(i) => Some((i.name, i.message)),
        Body::Error(x) => Some((x.error, x.message)),
        _ => None,
    };
    if !args.json {
        let mut s = format!(
            "{} {}",
            body.seq()
                .map_or_else(|| "-".to_string(), |s| s.to_string()),
            body.kind()
        );
        if let Some(did) = body.did() {
            s.push_str(&format!(" {did}"));
        }
        if let Some(op) = ops.first() {
            s.push_str(&format!(" {} {}", op.action.as_str(), op.path));
            if ops.len() > 1 {
                s.push_str(&format!(" (+{} ops)", ops.len() - 1));
            }
        }
        if let Some((name, msg)) = notice {
            s.push_str(&format!(" {name}: {}", msg.unwrap_or("")));
        }
        if let Some(v) = verdict {
            s.push_str(&format!(" [{v}]"));
        }
        out.extend_from_slice(s.as_bytes());
        return true;
    }
    out.extend_from_slice(b"{\"seq\":");
    match body.seq() {
        Some(s) => write_json_int(out, s),
        None => out.extend_from_slice(b"null"),
    }
    out.extend_from_slice(b",\"kind\":");
    write_json_string(out, body.kind());
    let field = |out: &mut Vec<u8>, k: &str, v: Option<&str>| {
        out.extend_from_slice(format!(",\"{k}\":").as_bytes());
        match v {
            Some(v) => write_json_string(out, v),
            None => out.extend_from_slice(b"null"),
        }
    };
    field(out, "did", body.did());
    field(out, "time", time);
    field(out, "rev", rev);
    if let Some((name, msg)) = notice {
        field(out, "name", Some(name));
        field(out, "message", msg);
    }
    if matches!(body, Body::Commit(_)) {
        out.extend_from_slice(b",\"ops\":[");
        for (i, op) in ops.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(b"{\"action\":");
            write_json_string(out, op.action.as_str());
            out.extend_from_slice(b",\"path\":");
            write_json_string(out, op.path);
            out.extend_from_slice(b",\"cid\":");
            match op.cid {
                Some(c) => write_json_string(out, &c.to_string()),
                None => out.extend_from_slice(b"null"),
            }
            out.push(b'}');
        }
        out.push(b']');
    }
    if let Some(v) = verdict {
        field(out, "verdict", Some(v.as_str()));
    }
    out.push(b'}');
    true
}

async fn jetstream(args: Args) -> anyhow::Result<ExitCode> {
    let dictionary = match args.zstd_dictionary.as_deref() {
        Some(p) => {
            let d = super::read_file(p)?;
            let id = riptide_client::jetstream::dictionary_id(&d)
                .map_err(|e| anyhow::anyhow!("--zstd-dictionary {}: {e}", p.display()))?;
            tracing::debug!(id, "zstd dictionary");
            Some(d)
        }
        None => None,
    };
    let cfg = JetstreamConfig {
        client: config(args.jetstream.clone(), args.cursor),
        options: JetstreamOptions {
            wanted_collections: args.collections.clone(),
            wanted_dids: args.dids.clone(),
            max_message_size_bytes: 0,
        },
        dictionary,
        require_hello: false,
    };
    let mut client = JetstreamClient::new(cfg)?;
    let stats = client.stats();
    let mut printer = Printer::new(args.count);
    let mut line = Vec::new();
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    while printer.wants_more() {
        let JetstreamEvent { raw, event } = tokio::select! {
            e = client.next_checked(MAX_UNDECODABLE) => match e {
                Ok(e) => e,
                Err(e @ (ClientError::Refused { .. } | ClientError::UnknownHost { .. })) => {
                    return gave_up(printer, &args.jetstream, &e, args.cursor);
                }
                Err(e) => {
                    printer.finish()?;
                    let hint = if args.zstd_dictionary.is_some() {
                        " (is --zstd-dictionary the dictionary this server compresses with?)"
                    } else {
                        " (is this a Jetstream server?)"
                    };
                    anyhow::bail!("{e}{hint}");
                }
            },
            _ = &mut ctrl_c => break,
        };
        if args.json {
            printer.line(&raw)?;
        } else {
            line.clear();
            write!(line, "{} {} {}", event.time_us, event.kind, event.did)?;
            if let Some(c) = &event.commit {
                write!(line, " {} {}/{}", c.operation, c.collection, c.rkey)?;
            }
            printer.line(&line)?;
        }
    }
    let printed = printer.finish()?;
    let s = stats.snapshot();
    eprintln!(
        "{printed} events; {} messages, {} bytes, {} reconnects, {} decode errors",
        s.messages, s.bytes, s.reconnects, s.decode_errors
    );
    Ok(ExitCode::SUCCESS)
}
