//! `riptide dict train --data DIR -o FILE`: a zstd dictionary trained on stored events' JSON,
//! for operators who run their own clients (Jetstream's own clients hold the legacy dictionary).

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
    /// The data directory of `riptide serve` (not while a server has it open).
    #[arg(long, value_name = "DIR")]
    data: PathBuf,
    /// Output file.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    output: PathBuf,
    /// Dictionary size in bytes (Jetstream's legacy dictionary is 112,640).
    #[arg(long, default_value_t = 112_640)]
    size: usize,
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
    let samples = store.sample_json(a.max_samples)?;
    if samples.len() < 8 {
        anyhow::bail!(
            "{} holds {} events: too few to train a dictionary",
            a.data.display(),
            samples.len()
        );
    }
    let dict = riptide_serve::compress::train(&samples, a.size)?;
    std::fs::write(&a.output, &dict).with_context(|| format!("writing {}", a.output.display()))?;
    let id = riptide_serve::Dictionary::from_bytes(dict.clone())
        .map(|d| d.id())
        .unwrap_or(0);
    eprintln!(
        "trained a {}-byte dictionary (id {id}) from {} events into {}",
        dict.len(),
        samples.len(),
        a.output.display()
    );
    Ok(ExitCode::SUCCESS)
}
