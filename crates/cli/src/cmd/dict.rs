//! `riptide dict train --data DIR -o FILE [--wire v1|v2]`: a zstd dictionary trained on stored
//! events, for operators who run their own clients (Jetstream's own v1 clients hold the legacy
//! dictionary). `--wire v2` trains on the `subscribeEvents` frames the store's events become
//! (`riptide_serve::v2::render`), for `riptide serve --zstd-dictionary-v2`; v2 clients fetch it
//! from `getZstdDictionary`, so a trained one is usable at once (Jetstream v2's is 64 KiB, hence
//! that default size for v2).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use riptide_serve::Store;

#[derive(clap::Subcommand, Debug)]
pub enum Dict {
    /// Train a dictionary from the events of a `riptide serve` data directory.
    Train(TrainArgs),
}

#[derive(clap::Args, Debug)]
pub struct TrainArgs {
    /// The data directory of `riptide serve` (refused while a server has it open).
    #[arg(long, value_name = "DIR")]
    data: PathBuf,
    /// Output file.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    output: PathBuf,
    /// Dictionary size in bytes (default: 112,640 for v1, as Jetstream's legacy dictionary;
    /// 65,536 for v2, as subscribe_events_20260811.zdict).
    #[arg(long)]
    size: Option<usize>,
    /// Which wire's messages to train on: `v1` (`/subscribe` JSON) or `v2` (`subscribeEvents`
    /// frames).
    #[arg(long, default_value = "v1", value_parser = ["v1", "v2"])]
    wire: String,
    /// Most sample bytes read from the store (oldest events first).
    #[arg(long, default_value_t = 64 << 20)]
    max_samples: usize,
}

pub fn run(d: Dict) -> anyhow::Result<ExitCode> {
    let Dict::Train(a) = d;
    // Opening a store creates one: a mistyped --data would otherwise leave an empty store behind
    // and report "0 events".
    anyhow::ensure!(
        a.data.is_dir(),
        "{}: no such directory (give the --data directory of a riptide serve)",
        a.data.display()
    );
    let (store, _) = Store::open_any(&a.data)?;
    let v2 = a.wire == "v2";
    let samples = if v2 {
        v2_frames(&store, a.max_samples)?
    } else {
        store.sample_json(a.max_samples)?
    };
    let size = a.size.unwrap_or(if v2 { 65_536 } else { 112_640 });
    if samples.len() < 8 {
        anyhow::bail!(
            "{} holds {} events: too few to train a dictionary",
            a.data.display(),
            samples.len()
        );
    }
    let dict = riptide_serve::compress::train(&samples, size)?;
    std::fs::write(&a.output, &dict).with_context(|| format!("writing {}", a.output.display()))?;
    let id = riptide_serve::Dictionary::from_bytes(dict.clone())
        .map(|d| d.id())
        .unwrap_or(0);
    eprintln!(
        "trained a {}-byte {} dictionary (id {id}) from {} events into {}",
        dict.len(),
        a.wire,
        samples.len(),
        a.output.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// The `subscribeEvents` frames of the stored events, oldest first, up to `max_bytes` in total.
fn v2_frames(store: &Store, max_bytes: usize) -> anyhow::Result<Vec<bytes::Bytes>> {
    let limit = riptide_serve::ReadLimit {
        events: 4096,
        bytes: 4 << 20,
    };
    let (mut out, mut batch, mut total, mut from) = (Vec::new(), Vec::new(), 0, 0);
    loop {
        batch.clear();
        store.read_from(from, limit, &mut batch)?;
        let Some(last) = batch.last() else {
            return Ok(out);
        };
        from = last.seq() + 1;
        for e in &batch {
            if let Some(f) = riptide_serve::v2::render(e) {
                total += f.len();
                if total > max_bytes {
                    return Ok(out);
                }
                out.push(bytes::Bytes::from(f));
            }
        }
    }
}
