//! `riptide decode FILE [--no-verify] [--json]` (a contract: other tools call these names).
//!
//! Decodes every frame of a corpus file (format of `shared/docs/formats.md`). Without `--json`, a
//! summary on stdout; with `--json`, one object per frame with records rendered as atproto JSON.
//! A frame that fails is reported on stderr with its index, byte offset and reason, counted and
//! skipped; the exit code is 1 if any frame failed. A file cut short (or with bytes after its last
//! frame) is decoded up to the last whole frame and the rest reported: the frames it declares but
//! lacks count as failed, with the unreadable bytes, and the exit code is 1. A file with no
//! readable frame at all is an error (exit 2) that says what the file looks like instead.
//!
//! Byte offsets, here and in `riptide verify`: `frame I at byte F` is where frame I's bytes start
//! in the file (after its length prefix); the reason ends with `(frame byte N)`, the offset of the
//! fault within the frame. So the fault is at file byte F + N, and both commands print the same
//! F and N for the same corrupted byte.
//!
//! Only the first [`ERROR_LINES`] of each error class are printed (then a count); frames are
//! read one at a time, so memory stays bounded by the file.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use riptide_cbor::{write_json, write_json_int, write_json_string};
use riptide_firehose::corpus::{self, declared_count};
use riptide_firehose::{Action, Body, DecodeOptions, Frame, FrameDecoder};

use crate::out;

/// Error lines printed per error class (and for missing records); the rest are counted.
const ERROR_LINES: u64 = 20;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Corpus file: u32 count, then u32 length + frame bytes each (big-endian).
    file: PathBuf,
    /// Skip the SHA-256 check of CAR blocks against their CIDs.
    #[arg(long)]
    no_verify: bool,
    /// One JSON object per frame on stdout.
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let file = super::read_file(&args.file)?;
    // One frame at a time: memory stays bounded by the file, however many frames it holds.
    let frames = match corpus::frames(&file) {
        Ok(it) => it,
        Err(e) => return Err(super::not_a_corpus(&args.file, &file, e)),
    };
    // The frames a damaged file declares but does not hold, and its unreadable bytes.
    let (mut seen, mut tail_frames, mut tail_bytes) = (0u64, 0u64, 0u64);
    let opts = if args.no_verify {
        DecodeOptions::unverified()
    } else {
        DecodeOptions::default()
    };
    let mut dec = FrameDecoder::with_options(opts);
    let mut stdout = out::stdout();
    let mut kinds: BTreeMap<&'static str, u64> = BTreeMap::new();
    let mut actions: BTreeMap<&'static str, u64> = BTreeMap::new();
    let mut errors: BTreeMap<&'static str, u64> = BTreeMap::new();
    let (mut blocks, mut bytes, mut failed, mut missing_records) = (0u64, 0u64, 0u64, 0u64);
    let mut line = Vec::with_capacity(1 << 16);
    // Error lines are capped per class (a file of millions of broken frames printed one line
    // each took minutes); the rest are counted, and said once at the end.
    let mut stderr = std::io::BufWriter::new(std::io::stderr().lock());
    for f in frames {
        let f = match f {
            Ok(f) => f,
            Err(e) => {
                // A file cut short (or with bytes after its last frame): what was read stands,
                // the rest is counted.
                if seen == 0 && super::sniff(&file) != super::Sniffed::Corpus {
                    return Err(super::not_a_corpus(&args.file, &file, e));
                }
                let declared = declared_count(&file).unwrap_or(0) as u64;
                tail_frames = declared.saturating_sub(seen);
                tail_bytes = (file.len() - e.offset) as u64;
                writeln!(
                    stderr,
                    "{}: {e}: {tail_frames} declared frame(s) missing, {tail_bytes} byte(s) unread",
                    super::name(&args.file),
                )?;
                // Bytes after the last declared frame are not a frame, but the file is still bad.
                tail_frames = tail_frames.max(1);
                break;
            }
        };
        seen += 1;
        bytes += f.bytes.len() as u64;
        let frame = match dec.decode(f.bytes) {
            Ok(frame) => frame,
            Err(e) => {
                failed += 1;
                let n = errors.entry(e.class()).or_default();
                *n += 1;
                if *n <= ERROR_LINES {
                    writeln!(stderr, "frame {} at byte {}: {e}", f.index, f.offset)?;
                    if *n == ERROR_LINES {
                        writeln!(
                            stderr,
                            "(further '{}' errors are counted, not printed)",
                            e.class()
                        )?;
                    }
                }
                continue;
            }
        };
        *kinds.entry(frame.body().kind()).or_default() += 1;
        blocks += frame.block_count() as u64;
        if let Body::Commit(c) = frame.body() {
            for (i, op) in c.ops().enumerate() {
                *actions.entry(op.action.as_str()).or_default() += 1;
                // A create or update whose record is not in the CAR: the frame decodes, but the
                // record cannot be shown (`"record": null` in --json). Counted, never silent.
                if op.cid.is_some_and(|cid| frame.block_by_cid(cid).is_none()) {
                    missing_records += 1;
                    if missing_records <= ERROR_LINES {
                        writeln!(
                            stderr,
                            "frame {} op {i} ({}): record block not in the CAR",
                            f.index, op.path
                        )?;
                    }
                }
            }
        }
        if args.json {
            line.clear();
            frame_json(f.index, &frame, &mut line);
            out::line(&mut stdout, &line)?;
        }
    }
    for (k, n) in errors.iter().filter(|(_, n)| **n > ERROR_LINES) {
        writeln!(stderr, "{} more '{k}' errors not printed", n - ERROR_LINES)?;
    }
    if missing_records > ERROR_LINES {
        writeln!(
            stderr,
            "{} more records missing from their CAR not printed",
            missing_records - ERROR_LINES
        )?;
    }
    stderr.flush()?;
    if !args.json {
        writeln!(
            stdout,
            "frames:  {} ({} bytes), {} failed",
            seen + tail_frames,
            bytes,
            failed + tail_frames
        )?;
        for (k, n) in &kinds {
            writeln!(stdout, "  {k:<9} {n}")?;
        }
        writeln!(stdout, "ops:")?;
        for (k, n) in &actions {
            writeln!(stdout, "  {k:<9} {n}")?;
        }
        writeln!(
            stdout,
            "blocks:  {blocks} ({})",
            if args.no_verify {
                "not verified"
            } else {
                "SHA-256 verified"
            }
        )?;
        if missing_records > 0 {
            writeln!(stdout, "records missing from their CAR: {missing_records}")?;
        }
        if tail_frames > 0 {
            *errors.entry("truncated-file").or_default() += tail_frames;
        }
        if !errors.is_empty() {
            writeln!(stdout, "errors:")?;
            for (k, n) in &errors {
                writeln!(stdout, "  {k:<14} {n}")?;
            }
        }
        if tail_bytes > 0 {
            writeln!(stdout, "unread:  {tail_bytes} bytes at the end of the file")?;
        }
    }
    stdout.flush()?;
    Ok(if failed + tail_frames > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

fn opt_str(out: &mut Vec<u8>, key: &str, v: Option<&str>) {
    out.extend_from_slice(b",\"");
    out.extend_from_slice(key.as_bytes());
    out.extend_from_slice(b"\":");
    match v {
        Some(s) => write_json_string(out, s),
        None => out.extend_from_slice(b"null"),
    }
}

fn cid_str(out: &mut Vec<u8>, key: &str, cid: Option<riptide_cbor::Cid<'_>>) {
    out.extend_from_slice(b",\"");
    out.extend_from_slice(key.as_bytes());
    out.extend_from_slice(b"\":");
    match cid {
        Some(c) => {
            out.push(b'"');
            c.write_string(out);
            out.push(b'"');
        }
        None => out.extend_from_slice(b"null"),
    }
}

/// One frame as JSON: `{"index","kind","seq","did",…}`; commits list their ops with records.
fn frame_json(index: usize, frame: &Frame<'_>, out: &mut Vec<u8>) {
    out.extend_from_slice(b"{\"index\":");
    write_json_int(out, index as i64);
    out.extend_from_slice(b",\"kind\":\"");
    out.extend_from_slice(frame.body().kind().as_bytes());
    out.push(b'"');
    match frame.body() {
        Body::Commit(c) => {
            out.extend_from_slice(b",\"seq\":");
            write_json_int(out, c.seq);
            opt_str(out, "did", Some(c.repo));
            opt_str(out, "rev", Some(c.rev));
            opt_str(out, "since", c.since);
            opt_str(out, "time", Some(c.time));
            cid_str(out, "commit", Some(c.commit));
            cid_str(out, "prevData", c.prev_data);
            out.extend_from_slice(b",\"blocks\":");
            write_json_int(out, frame.block_count() as i64);
            if c.too_big {
                out.extend_from_slice(b",\"tooBig\":true");
            }
            out.extend_from_slice(b",\"ops\":[");
            for (i, op) in c.ops().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(b"{\"action\":\"");
                out.extend_from_slice(op.action.as_str().as_bytes());
                out.push(b'"');
                opt_str(out, "path", Some(op.path));
                cid_str(out, "cid", op.cid);
                cid_str(out, "prev", op.prev);
                if op.action != Action::Delete {
                    out.extend_from_slice(b",\"record\":");
                    let mark = out.len();
                    let ok = op
                        .cid
                        .and_then(|cid| frame.block_by_cid(cid))
                        .is_some_and(|v| write_json(v, out).is_ok());
                    if !ok {
                        out.truncate(mark);
                        out.extend_from_slice(b"null");
                    }
                }
                out.push(b'}');
            }
            out.push(b']');
        }
        other => {
            if let Some(seq) = other.seq() {
                out.extend_from_slice(b",\"seq\":");
                write_json_int(out, seq);
            }
            opt_str(out, "did", other.did());
            out.extend_from_slice(b",\"payload\":");
            let mark = out.len();
            if write_json(frame.payload(), out).is_err() {
                out.truncate(mark);
                out.extend_from_slice(b"null");
            }
        }
    }
    out.push(b'}');
}
