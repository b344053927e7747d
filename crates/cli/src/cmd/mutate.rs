//! `riptide mutate FRAMES... --seed S --count N --out FILE [--manifest FILE]` (hidden, not a
//! contract): frames of corpus files with one field or a few bytes changed each
//! (`riptide_gen::mutate`), written as a corpus file, with a manifest of what was changed in
//! which frame (JSON lines, one per output frame, in order).
//!
//! Why a subcommand: the fault suite (`tests/faults/run`) streams the output through
//! `riptide relay` into `riptide serve`, and needs the same mutations again from the same seed
//! to reproduce a failure. Exit 2 on a bad argument or I/O error.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context};
use riptide_gen::mutate::{mutate, renumber, Source};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Corpus files whose frames are mutated (real captures, `riptide gen` output).
    #[arg(required = true)]
    frames: Vec<PathBuf>,
    /// Seed: the same arguments give byte-identical output.
    #[arg(long)]
    seed: u64,
    /// Number of mutated frames to write.
    #[arg(long)]
    count: u64,
    /// Output corpus file.
    #[arg(long)]
    out: PathBuf,
    /// Manifest (JSON lines); default: OUT.manifest.jsonl.
    #[arg(long)]
    manifest: Option<PathBuf>,
    /// Seq of the first output frame (frames are renumbered in order, except where the mutation
    /// is of `seq`).
    #[arg(long, default_value_t = 1)]
    first_seq: u64,
    /// Unmutated frames to send after the mutated ones (renumbered to follow them): a test sees
    /// that ingest goes on after the mutations by these being served.
    #[arg(long, value_name = "FILE")]
    tail: Option<PathBuf>,
    /// Share of frames damaged at the byte level instead of one field changed (0 to 1).
    #[arg(long, default_value_t = 0.25)]
    byte_share: f64,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    if !(0.0..=1.0).contains(&a.byte_share) {
        bail!("--byte-share is a share from 0 to 1, not {}", a.byte_share);
    }
    let mut sources = Vec::new();
    for path in &a.frames {
        let file = super::read_file(path)?;
        let frames = super::corpus_frames(path, &file)?
            .iter()
            .map(|f| f.bytes.to_vec())
            .collect();
        let name = path
            .file_name()
            .map_or_else(|| super::name(path), |n| n.to_string_lossy().into_owned());
        let parent = path
            .parent()
            .and_then(|p| p.file_name())
            .map(|p| format!("{}/", p.to_string_lossy()))
            .unwrap_or_default();
        sources.push(Source {
            name: format!("{parent}{name}"),
            frames,
        });
    }
    let mut out =
        mutate(&sources, a.seed, a.count, a.first_seq, a.byte_share).map_err(anyhow::Error::msg)?;
    let mutated = out.len();
    if let Some(path) = &a.tail {
        let file = super::read_file(path)?;
        let frames: Vec<Vec<u8>> = super::corpus_frames(path, &file)?
            .iter()
            .map(|f| f.bytes.to_vec())
            .collect();
        out.extend(renumber(
            "tail",
            &frames,
            a.count,
            a.first_seq.saturating_add(a.count),
        ));
    }
    let total =
        u32::try_from(out.len()).context("the corpus format holds at most 2^32-1 frames")?;
    let io = |p: &PathBuf| format!("writing {}", p.display());
    let mut w = std::io::BufWriter::new(std::fs::File::create(&a.out).with_context(|| io(&a.out))?);
    w.write_all(&total.to_be_bytes())
        .with_context(|| io(&a.out))?;
    for (frame, _) in &out {
        let len = u32::try_from(frame.len()).context("frame over 4 GiB")?;
        w.write_all(&len.to_be_bytes())
            .with_context(|| io(&a.out))?;
        w.write_all(frame).with_context(|| io(&a.out))?;
    }
    w.flush().with_context(|| io(&a.out))?;
    let manifest = a.manifest.clone().unwrap_or_else(|| {
        let mut p = a.out.clone().into_os_string();
        p.push(".manifest.jsonl");
        PathBuf::from(p)
    });
    let mut m =
        std::io::BufWriter::new(std::fs::File::create(&manifest).with_context(|| io(&manifest))?);
    for (_, e) in &out {
        serde_json::to_writer(&mut m, e)?;
        m.write_all(b"\n").with_context(|| io(&manifest))?;
    }
    m.flush().with_context(|| io(&manifest))?;
    let malformed = out.iter().filter(|(_, e)| !e.well_formed).count();
    eprintln!(
        "wrote {mutated} mutated frames ({malformed} not well-formed DAG-CBOR) and {} unmutated to {}, manifest {}",
        out.len() - mutated,
        a.out.display(),
        manifest.display()
    );
    Ok(ExitCode::SUCCESS)
}
