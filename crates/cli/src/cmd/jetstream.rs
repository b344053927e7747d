//! `riptide jetstream FILE` (a contract): the Jetstream v1 events of a corpus file, one JSON line
//! each, exactly as a Jetstream server would send them: `time_us` = max(now, previous + 1) and
//! `cursor` counting from 1, as a fresh server assigns seqs.
//!
//! Frames that fail to decode and ops that Jetstream drops are counted on stderr, the first
//! [`ERROR_LINES`] of each error class and drop reason said one line each (as `decode` does: a
//! file of four million empty frames printed four million lines, one write each, and took a
//! minute), then how many more; the exit code is 1 if any frame failed to decode.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use riptide_firehose::{DecodeOptions, FrameDecoder};
use riptide_jetstream::Projector;

use crate::out;

/// Lines printed per error class and per drop reason; the rest are counted.
pub const ERROR_LINES: u64 = 20;

/// Says a line of class `class` on `out` unless [`ERROR_LINES`] of the class were said.
fn capped(
    out: &mut impl Write,
    seen: &mut BTreeMap<String, u64>,
    class: &str,
    line: impl FnOnce() -> String,
) -> std::io::Result<()> {
    let n = match seen.get_mut(class) {
        Some(n) => n,
        None => seen.entry(class.to_owned()).or_default(),
    };
    *n += 1;
    if *n <= ERROR_LINES {
        writeln!(out, "{}", line())?;
        if *n == ERROR_LINES {
            writeln!(out, "(further {class} are counted, not printed)")?;
        }
    }
    Ok(())
}

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Corpus file (format of shared/docs/formats.md).
    file: PathBuf,
}

fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let file = super::read_file(&args.file)?;
    let frames = super::corpus_frames(&args.file, &file)?;
    // Records are decoded one by one in the projector, so one bad record drops one op, not a frame.
    let opts = DecodeOptions {
        decode_blocks: false,
        ..DecodeOptions::default()
    };
    let mut dec = FrameDecoder::with_options(opts);
    let mut proj = Projector::new();
    let mut stdout = out::stdout();
    let (mut failed, mut dropped, mut seq, mut last_us) = (0u64, 0u64, 0u64, 0i64);
    let mut line = Vec::with_capacity(1 << 14);
    let mut stderr = std::io::BufWriter::new(std::io::stderr().lock());
    // Lines said per class: "'<error class>' errors", "ops dropped (<reason>)".
    let mut seen: BTreeMap<String, u64> = BTreeMap::new();
    for f in &frames {
        let frame = match dec.decode(f.bytes) {
            Ok(frame) => frame,
            Err(e) => {
                failed += 1;
                let class = format!("'{}' errors", e.class());
                capped(&mut stderr, &mut seen, &class, || {
                    format!("frame {} at byte {}: {e}", f.index, f.offset)
                })?;
                continue;
            }
        };
        let events = proj.project(&frame);
        for (op, why) in events.drops() {
            dropped += 1;
            let class = format!("ops dropped ({})", why.as_str());
            capped(&mut stderr, &mut seen, &class, || {
                format!("frame {} op {op}: dropped ({})", f.index, why.as_str())
            })?;
        }
        for i in 0..events.len() {
            seq += 1;
            last_us = now_us().max(last_us + 1);
            line.clear();
            events.render(i, last_us, Some(seq), &mut line);
            out::line(&mut stdout, &line)?;
        }
    }
    stdout.flush()?;
    for (class, n) in seen.iter().filter(|(_, n)| **n > ERROR_LINES) {
        writeln!(stderr, "{} more {class} not printed", n - ERROR_LINES)?;
    }
    writeln!(
        stderr,
        "{} events from {} frames; {} ops dropped; {} frames failed",
        seq,
        frames.len(),
        dropped,
        failed
    )?;
    stderr.flush()?;
    Ok(if failed > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}
