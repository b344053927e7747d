//! `riptide corpus sigs FRAMES --did-docs DOCS -o OUT` (a contract): make benchmark corpora.
//! `riptide corpus segments FRAMES --out DIR` (not a contract: test fixtures until the store
//! seals its own): the frames' events as `.jss` archive segments.
//!
//! `sigs` writes the signature corpus of `shared/docs/formats.md` from the `#commit` frames of a
//! frame corpus: `[u32 count]`, then per entry `[u8 curve: 0 = P-256, 1 = secp256k1]`
//! `[u16 len][signed commit block, sig included][u16 len][33-byte compressed SEC1 public key]`,
//! big-endian. Only commits whose signature verifies with their DID document's key are written
//! (as the format requires); the others are counted on stderr by reason.
//!
//! The reader ([`read_sigs`]) lives here too, so that `bench sigs` reads exactly what this writes.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use riptide_crypto::{Curve, PublicKey};
use riptide_firehose::verify::KeyLookup;
use riptide_firehose::{Body, FrameDecoder};
use riptide_repo::Commit;

use super::DocKeys;

#[derive(clap::Subcommand, Debug)]
pub enum CorpusCmd {
    /// Write the signature corpus (formats.md `*.sigs`) from the verified commits of a frame corpus.
    Sigs(SigsArgs),
    /// Not a contract (test fixtures): write the frames' events, unverified, as sealed .jss
    /// segments `DIR/seg_XXXXXXXXXX.jss` (seqs from 1, as `riptide serve` numbers them), for
    /// `riptide serve --data D` to serve from `D/segments/`.
    Segments(SegmentsArgs),
}

#[derive(clap::Args, Debug)]
pub struct SegmentsArgs {
    /// Frame corpus (formats.md).
    frames: PathBuf,
    /// Directory to write the segments into (created).
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// Rows per block.
    #[arg(long, value_name = "N", default_value_t = 4096, value_parser = super::serve::parse_positive)]
    block_rows: usize,
    /// Blocks per segment.
    #[arg(long, value_name = "N", default_value_t = 64, value_parser = super::serve::parse_positive)]
    segment_blocks: usize,
    /// Witnessed time of seq 1, unix µs; each later row is 1 µs later.
    #[arg(long, value_name = "US", default_value_t = 1_783_123_200_000_000)]
    first_time_us: i64,
    /// Write #sync events as rows (as `riptide serve` stores them).
    #[arg(long)]
    with_sync: bool,
}

#[derive(clap::Args, Debug)]
pub struct SigsArgs {
    /// Frame corpus (formats.md).
    frames: PathBuf,
    /// JSON object mapping DID → DID document (the signing keys).
    #[arg(long)]
    did_docs: PathBuf,
    /// Where to write the signature corpus.
    #[arg(short = 'o', long = "output")]
    output: PathBuf,
}

pub fn run(c: CorpusCmd) -> anyhow::Result<ExitCode> {
    match c {
        CorpusCmd::Sigs(a) => sigs(a),
        CorpusCmd::Segments(a) => segments(a),
    }
}

/// `riptide corpus segments`: rows as [`riptide_jetstream::rows`] makes them, sealed with
/// [`riptide_segment::SegmentWriter`], one file per `segment_blocks` blocks.
fn segments(a: SegmentsArgs) -> anyhow::Result<ExitCode> {
    let file =
        std::fs::read(&a.frames).with_context(|| format!("reading {}", a.frames.display()))?;
    let frames = super::corpus_frames(&a.frames, &file)?;
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let mut dec = FrameDecoder::new();
    let mut proj = if a.with_sync {
        riptide_jetstream::Projector::with_sync()
    } else {
        riptide_jetstream::Projector::new()
    };
    let mut rows: Vec<riptide_segment::OwnedRow> = Vec::new();
    let mut dropped: BTreeMap<&'static str, u64> = BTreeMap::new();
    for f in &frames {
        let frame = match dec.decode(f.bytes) {
            Ok(fr) => fr,
            Err(e) => {
                *dropped.entry("undecodable-frame").or_default() += 1;
                eprintln!("frame {}: {e}", f.index);
                continue;
            }
        };
        let riptide_jetstream::rows::FrameRows { rows: got, drops } =
            riptide_jetstream::rows::frame_rows(&mut proj, &frame)?;
        for (_, why) in drops {
            *dropped.entry(why.as_str()).or_default() += 1;
        }
        for r in got {
            let seq = rows.len() as u64 + 1;
            let row = riptide_segment::Row {
                seq,
                witnessed_at: a.first_time_us + seq as i64 - 1,
                ..r
            };
            rows.push(row.to_owned_row());
        }
    }
    let (mut files, mut index) = (0u64, 0u64);
    let per_segment = a.block_rows.saturating_mul(a.segment_blocks);
    for chunk in rows.chunks(per_segment) {
        let blocks: Vec<Vec<riptide_segment::Row<'_>>> = chunk
            .chunks(a.block_rows)
            .map(|b| b.iter().map(riptide_segment::OwnedRow::as_row).collect())
            .collect();
        let refs: Vec<&[riptide_segment::Row<'_>]> = blocks.iter().map(Vec::as_slice).collect();
        let bytes = riptide_segment::write_segment(&refs)?;
        let path = a.out.join(riptide_segment::segment_name(index));
        let tmp = a
            .out
            .join(format!(".{}.tmp", riptide_segment::segment_name(index)));
        std::fs::write(&tmp, &bytes).with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, &path).with_context(|| format!("renaming to {}", path.display()))?;
        files += 1;
        index += 1;
    }
    eprintln!(
        "{} rows (seqs 1..={}) in {files} segments under {}; dropped: {:?}",
        rows.len(),
        rows.len(),
        a.out.display(),
        dropped
    );
    Ok(ExitCode::SUCCESS)
}

/// One entry of a signature corpus.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SigEntry {
    /// The key's curve.
    pub curve: Curve,
    /// The signed commit block (DAG-CBOR, `sig` included).
    pub signed: Vec<u8>,
    /// The 33-byte compressed SEC1 public key.
    pub pubkey: Vec<u8>,
}

fn curve_byte(c: Curve) -> u8 {
    match c {
        Curve::P256 => 0,
        Curve::Secp256k1 => 1,
    }
}

/// Encodes a signature corpus. Entries longer than a u16 length allows are an error.
pub fn write_sigs(entries: &[SigEntry]) -> anyhow::Result<Vec<u8>> {
    let mut out = Vec::with_capacity(
        4 + entries
            .iter()
            .map(|e| 5 + e.signed.len() + e.pubkey.len())
            .sum::<usize>(),
    );
    out.extend_from_slice(&u32::try_from(entries.len())?.to_be_bytes());
    for e in entries {
        out.push(curve_byte(e.curve));
        out.extend_from_slice(
            &u16::try_from(e.signed.len())
                .context("signed commit over 65535 bytes")?
                .to_be_bytes(),
        );
        out.extend_from_slice(&e.signed);
        out.extend_from_slice(
            &u16::try_from(e.pubkey.len())
                .context("public key over 65535 bytes")?
                .to_be_bytes(),
        );
        out.extend_from_slice(&e.pubkey);
    }
    Ok(out)
}

/// Decodes a signature corpus; the declared count must match the entries present.
pub fn read_sigs(bytes: &[u8]) -> anyhow::Result<Vec<SigEntry>> {
    fn take<'a>(b: &'a [u8], pos: &mut usize, n: usize, what: &str) -> anyhow::Result<&'a [u8]> {
        let s = b
            .get(*pos..pos.saturating_add(n))
            .with_context(|| format!("sigs corpus truncated in {what} at byte {pos}"))?;
        *pos += n;
        Ok(s)
    }
    let mut pos = 0;
    let count = u32::from_be_bytes(take(bytes, &mut pos, 4, "the count")?.try_into()?) as usize;
    // Every entry takes at least 5 bytes: bound the allocation by the input.
    let mut entries = Vec::with_capacity(count.min(bytes.len() / 5));
    for i in 0..count {
        let curve = match take(bytes, &mut pos, 1, "a curve")?[0] {
            0 => Curve::P256,
            1 => Curve::Secp256k1,
            other => anyhow::bail!("sigs entry {i}: unknown curve {other}"),
        };
        let n = u16::from_be_bytes(take(bytes, &mut pos, 2, "a length")?.try_into()?) as usize;
        let signed = take(bytes, &mut pos, n, "a commit")?.to_vec();
        let n = u16::from_be_bytes(take(bytes, &mut pos, 2, "a length")?.try_into()?) as usize;
        let pubkey = take(bytes, &mut pos, n, "a public key")?.to_vec();
        entries.push(SigEntry {
            curve,
            signed,
            pubkey,
        });
    }
    anyhow::ensure!(
        pos == bytes.len(),
        "sigs corpus has {} bytes after its {count} entries",
        bytes.len() - pos
    );
    Ok(entries)
}

fn sigs(a: SigsArgs) -> anyhow::Result<ExitCode> {
    let file = super::read_file(&a.frames)?;
    let frames = super::corpus_frames(&a.frames, &file)?;
    let docs = super::load_did_docs(&a.did_docs)?;
    let lookup = DocKeys(&docs);
    let mut keys: HashMap<String, Option<PublicKey>> = HashMap::new();
    let mut dec = FrameDecoder::new();
    let mut entries = Vec::new();
    let mut skipped: BTreeMap<&'static str, u64> = BTreeMap::new();
    let mut buf = Vec::new();
    for f in &frames {
        let frame = match dec.decode(f.bytes) {
            Ok(frame) => frame,
            Err(_) => {
                *skipped.entry("undecodable frame").or_default() += 1;
                continue;
            }
        };
        let Body::Commit(c) = frame.body() else {
            continue;
        };
        let Some(block) = frame.block_bytes(c.commit) else {
            *skipped.entry("no commit block").or_default() += 1;
            continue;
        };
        let Ok(commit) = Commit::decode(block) else {
            *skipped.entry("undecodable commit").or_default() += 1;
            continue;
        };
        if commit.did() != c.repo {
            *skipped.entry("commit of another DID").or_default() += 1;
            continue;
        }
        let key = keys
            .entry(c.repo.to_owned())
            .or_insert_with(|| lookup.key(c.repo).ok());
        let Some(key) = key else {
            *skipped.entry("no key").or_default() += 1;
            continue;
        };
        if commit.verify_signature_with(key, &mut buf).is_err() {
            *skipped.entry("bad signature").or_default() += 1;
            continue;
        }
        entries.push(SigEntry {
            curve: key.curve(),
            signed: block.to_vec(),
            pubkey: key.to_compressed_sec1().to_vec(),
        });
    }
    let bytes = write_sigs(&entries)?;
    std::fs::write(&a.output, &bytes).with_context(|| format!("writing {}", a.output.display()))?;
    let k256 = entries
        .iter()
        .filter(|e| e.curve == Curve::Secp256k1)
        .count();
    let mut line = format!(
        "wrote {} entries (secp256k1 {k256}, P-256 {}) to {}",
        entries.len(),
        entries.len() - k256,
        a.output.display()
    );
    for (why, n) in &skipped {
        line.push_str(&format!("; skipped {n}: {why}"));
    }
    eprintln!("{line}");
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sigs_round_trip_and_errors() {
        let e = vec![
            SigEntry {
                curve: Curve::P256,
                signed: vec![1, 2, 3],
                pubkey: vec![2; 33],
            },
            SigEntry {
                curve: Curve::Secp256k1,
                signed: vec![],
                pubkey: vec![3; 33],
            },
        ];
        let bytes = write_sigs(&e).unwrap();
        assert_eq!(bytes[..5], [0, 0, 0, 2, 0]);
        assert_eq!(read_sigs(&bytes).unwrap(), e);
        assert!(read_sigs(&bytes[..bytes.len() - 1]).is_err());
        let mut extra = bytes.clone();
        extra.push(0);
        assert!(read_sigs(&extra).is_err());
        let mut bad_curve = bytes;
        bad_curve[4] = 7;
        assert!(read_sigs(&bad_curve).is_err());
        assert!(read_sigs(&[0xff, 0xff, 0xff, 0xff]).is_err());
    }
}
