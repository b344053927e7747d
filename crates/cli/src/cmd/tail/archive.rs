//! `riptide tail --jetstream URL --snapshot | --replay`: Jetstream v2's archive
//! (`riptide_client::archive`), then (`--replay`) the live `subscribeEvents`.
//!
//! Why a module of `tail`: it prints with `tail`'s printer and filters (`--kind`, `--did`,
//! `--collection` are v2's `kinds`, `dids`, `collections`), but reads differently: `--cursor N`
//! is the first seq wanted (the plan's `afterSeq` = N − 1, inclusive as everywhere in `tail`),
//! `--before-seq` ends a snapshot, `--archive-token` is the bearer key. `--snapshot` ends when the
//! archive up to its sealed tip is printed; `--replay` goes on live from the seq after it, each
//! event once. `--json` prints each event as a v2 message payload (`$type`, `seq`, `did`, `time`,
//! and for a commit `rev`, `operation`, `collection`, `rkey`, `record`, `cid`; `identity`,
//! `account` or `sync` for those), the same shape for archive rows (rendered here from the row:
//! the record's JSON from its DAG-CBOR, the `cid` computed from it) and live messages; the
//! readable view is `tail`'s v2 one. A `create-resync` row (kind 7) is printed as a `create`, as
//! the live wire sends it. Rows the reader rejects (payload not DAG-CBOR) are counted on stderr.

use std::io::Write;
use std::process::ExitCode;

use riptide_cbor::{write_json_int, write_json_string, Arena, Options};
use riptide_client::{
    ArchiveConfig, ArchiveError, ArchiveEvent, ArchiveStats, ClientConfig, Replay, ReplayEvent,
    Snapshot,
};
use riptide_segment::Kind;

use super::{Args, Printer};

const NSID: &str = "network.bsky.jetstream.subscribeEvents";

fn archive_config(args: &Args) -> anyhow::Result<ArchiveConfig> {
    let url = match args.jetstream.as_slice() {
        [u] => u.clone(),
        _ => anyhow::bail!("--snapshot and --replay read one server: give one --jetstream URL"),
    };
    let mut cfg = ArchiveConfig::new(url);
    cfg.token = args.archive_token.clone();
    cfg.filter = riptide_client::V2Filter {
        kinds: args.kinds.clone(),
        dids: args.dids.clone(),
        collections: args.collections.clone(),
        max_message_size_bytes: 0,
    };
    cfg.after_seq = match args.cursor {
        None | Some(..=0) => None,
        Some(c) => Some(c as u64 - 1),
    };
    cfg.before_seq = args.before_seq;
    Ok(cfg)
}

pub(super) async fn run(args: Args) -> anyhow::Result<ExitCode> {
    if args.snapshot && args.zstd_dictionary.is_some() {
        anyhow::bail!(
            "--zstd-dictionary is for the live part of --replay; the archive is not a stream"
        );
    }
    let cfg = archive_config(&args)?;
    let url = cfg.url.clone();
    let mut printer = Printer::new(args.count);
    let mut r = Render::default();
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    let ended: Result<(), ArchiveError>;
    let stats: ArchiveStats;
    if args.replay {
        let dictionary = args
            .zstd_dictionary
            .as_deref()
            .map(crate::cmd::read_file)
            .transpose()?;
        let live = ClientConfig {
            give_up_on_permanent: true,
            ..ClientConfig::default()
        };
        let mut replay = Replay::new(cfg, live, dictionary)?;
        ended = loop {
            if !printer.wants_more() {
                break Ok(());
            }
            let e = tokio::select! {
                e = replay.next() => e,
                _ = &mut ctrl_c => break Ok(()),
            };
            match e {
                Ok(ReplayEvent::Archive(e)) => r.archive(&e, args.json)?,
                Ok(ReplayEvent::Live(m)) => r.live(&m, args.json)?,
                Err(e) => break Err(e),
            }
            printer.line(&r.line)?;
        };
        stats = replay.stats();
        let live = replay.live_stats().map(|s| s.snapshot());
        finish(printer, &stats, &ended, &url)?;
        if let Some(s) = live {
            eprintln!(
                "live from seq {}: {} messages, {} reconnects, {} decode errors",
                replay.boundary() + 1,
                s.messages,
                s.reconnects,
                s.decode_errors
            );
        }
    } else {
        let mut snap = Snapshot::new(cfg)?;
        ended = loop {
            if !printer.wants_more() {
                break Ok(());
            }
            let e = tokio::select! {
                e = snap.next() => e,
                _ = &mut ctrl_c => break Ok(()),
            };
            match e {
                Ok(Some(e)) => r.archive(&e, args.json)?,
                Ok(None) => break Ok(()),
                Err(e) => break Err(e),
            }
            printer.line(&r.line)?;
        };
        stats = snap.stats();
        finish(printer, &stats, &ended, &url)?;
    }
    Ok(if ended.is_err() {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// The summary on stderr, and the error that ended the read, once.
fn finish(
    printer: Printer,
    s: &ArchiveStats,
    ended: &Result<(), ArchiveError>,
    url: &str,
) -> anyhow::Result<()> {
    let printed = printer.finish()?;
    eprintln!(
        "{printed} events; archive: {} events from {} segments and {} blocks ({} bytes, {} plan pages, {} retries), {} rows rejected",
        s.events, s.segments, s.blocks, s.bytes, s.plan_pages, s.retries, s.rows_rejected
    );
    if let Err(e) = ended {
        crate::log::fatal(&format!("{url}: {e}"));
    }
    Ok(())
}

/// Renders events into `line`.
#[derive(Default)]
struct Render {
    line: Vec<u8>,
    arena: Arena,
}

impl Render {
    fn archive(&mut self, e: &ArchiveEvent, json: bool) -> anyhow::Result<()> {
        let row = &e.row;
        let out = &mut self.line;
        out.clear();
        let (kind, op) = match row.kind {
            Kind::Create | Kind::CreateResync => ("commit", Some("create")),
            Kind::Update => ("commit", Some("update")),
            Kind::Delete => ("commit", Some("delete")),
            Kind::Identity => ("identity", None),
            Kind::Account => ("account", None),
            Kind::Sync => ("sync", None),
        };
        if !json {
            write!(out, "{} {kind} {}", row.seq, row.did)?;
            if let Some(op) = op {
                write!(out, " {op} {}/{}", row.collection, row.rkey)?;
            }
            return Ok(());
        }
        out.extend_from_slice(b"{\"$type\":");
        write_json_string(out, &format!("{NSID}#{kind}"));
        out.extend_from_slice(b",\"seq\":");
        write_json_int(out, row.seq as i64);
        out.extend_from_slice(b",\"did\":");
        write_json_string(out, &row.did);
        out.extend_from_slice(b",\"time\":\"");
        riptide_serve::v2::write_rfc3339_micros(out, row.as_row().display_time_us());
        out.push(b'"');
        if let Some(op) = op {
            for (k, v) in [
                ("rev", row.rev.as_str()),
                ("operation", op),
                ("collection", &row.collection),
                ("rkey", &row.rkey),
            ] {
                write!(out, ",\"{k}\":")?;
                write_json_string(out, v);
            }
            if let Some(cid) = &e.cid {
                out.extend_from_slice(b",\"record\":");
                if !riptide_jetstream::write_record_json(&mut self.arena, &row.payload, out) {
                    out.extend_from_slice(b"null");
                }
                out.extend_from_slice(b",\"cid\":");
                write_json_string(out, &cid.to_string());
            }
        } else {
            write!(out, ",\"{kind}\":")?;
            let mut tape = self.arena.tape(&row.payload);
            let rendered = tape
                .decode(0..row.payload.len(), &Options::strict())
                .ok()
                .map(|item| riptide_cbor::write_json(tape.value(item), out));
            if !matches!(rendered, Some(Ok(()))) {
                out.extend_from_slice(b"null");
            }
        }
        out.push(b'}');
        Ok(())
    }

    fn live(&mut self, m: &riptide_client::V2Message, json: bool) -> anyhow::Result<()> {
        let out = &mut self.line;
        out.clear();
        if json {
            let v: serde_json::Value = serde_json::from_slice(&m.raw)?;
            serde_json::to_writer(&mut *out, &v["payload"])?;
            return Ok(());
        }
        super::v2_line(&m.payload, out)?;
        Ok(())
    }
}
