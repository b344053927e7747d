//! `riptide store check --data DIR [--json]` and `riptide store repair --data DIR [--json]`: the
//! integrity of a `riptide serve` data directory (issue 40; `riptide_store::store`, "Checksums"
//! and "Journal").
//!
//! `check` reads every sealed block (its checksum, its zstd frame, every event's format) and the
//! unsealed events, and prints what is damaged — each block by its seq range and event count —
//! and the seqs recorded as lost before (by a journal cut short, or by an earlier `repair`);
//! exit 1 when anything is damaged now. `repair` removes the damaged blocks and unsealed values
//! and records the seqs they held, so that a server started on the directory does not meet them
//! again (it would skip them anyway, once per start, logging each at error). Both open the
//! store as the server does, so with a server running they are refused with its pid
//! (`riptide_store::lock`): stop the server first.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use riptide_store::store::{Checked, LostRange};
use riptide_store::Utf8Text;
use serde_json::json;

#[derive(clap::Subcommand, Debug)]
pub enum StoreCmd {
    /// Verify every stored block and event of a data directory; exit 1 if any is damaged.
    Check(Args),
    /// Remove the damaged blocks and events of a data directory, recording the seqs lost.
    Repair(Args),
}

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The data directory of `riptide serve` (with the server stopped).
    #[arg(long, value_name = "DIR")]
    data: PathBuf,
    /// One JSON object on stdout instead of text.
    #[arg(long)]
    json: bool,
}

pub fn run(c: StoreCmd) -> anyhow::Result<ExitCode> {
    let (a, repair) = match c {
        StoreCmd::Check(a) => (a, false),
        StoreCmd::Repair(a) => (a, true),
    };
    // Opening a store creates one: a mistyped --data must not leave an empty store behind and
    // report it sound.
    anyhow::ensure!(
        a.data.join("partitions").is_dir(),
        "{}: not a riptide serve data directory (give the --data directory of a riptide serve)",
        a.data.display()
    );
    let (store, _) = riptide_store::Store::<Utf8Text>::open_any(&a.data)?;
    let checked = store.check()?;
    let removed = if repair { store.repair()? } else { Vec::new() };
    if a.json {
        println!(
            "{}",
            report_json(&a.data, &checked, repair.then_some(&removed))
        );
    } else {
        print_text(&a.data, &checked, repair.then_some(&removed));
    }
    // A repair that removed the damage leaves a sound store.
    let damaged = checked.is_damaged() && !(repair && checked.journal_lost_at_open == 0);
    Ok(if damaged {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// `first..=last` as text (`end` is one past the last).
fn range(first: u64, end: u64) -> String {
    if end <= first + 1 {
        first.to_string()
    } else {
        format!("{first}..={}", end - 1)
    }
}

fn lost_json(l: &LostRange) -> serde_json::Value {
    json!({"first": l.first, "last": l.end - 1, "events": l.end - l.first, "why": l.why})
}

fn report_json(dir: &Path, c: &Checked, removed: Option<&Vec<LostRange>>) -> serde_json::Value {
    let mut v = json!({
        "data": dir.display().to_string(),
        "damaged": c.is_damaged(),
        "blocks": c.blocks,
        "checksummed_blocks": c.checksummed,
        "row_blocks": c.row_blocks,
        "events": c.events,
        "unsealed_events": c.unsealed,
        "damaged_blocks": c.damaged.iter().map(|d| json!({
            "first": d.first, "last": d.end - 1, "events": d.events(), "what": d.what,
        })).collect::<Vec<_>>(),
        "damaged_unsealed": c.damaged_unsealed,
        "journal_lost_at_open": c.journal_lost_at_open,
        "lost": c.lost.iter().map(lost_json).collect::<Vec<_>>(),
    });
    if let Some(r) = removed {
        v["removed"] = r.iter().map(lost_json).collect();
    }
    v
}

fn print_text(dir: &Path, c: &Checked, removed: Option<&Vec<LostRange>>) {
    println!(
        "{}: {} blocks ({} checksummed, {} of them rows, {} from before checksums), {} events in sound blocks, {} unsealed",
        dir.display(),
        c.blocks,
        c.checksummed,
        c.row_blocks,
        c.blocks - c.checksummed,
        c.events,
        c.unsealed
    );
    for d in &c.damaged {
        println!(
            "DAMAGED block {}: seqs {} ({} events): {}",
            d.first,
            range(d.first, d.end),
            d.events(),
            d.what
        );
    }
    for seq in &c.damaged_unsealed {
        println!("DAMAGED unsealed event: seq {seq}");
    }
    if c.journal_lost_at_open > 0 {
        println!(
            "LOST at this open: {} acknowledged events missing from the journal (cut short or damaged); recorded below",
            c.journal_lost_at_open
        );
    }
    for l in &c.lost {
        println!(
            "lost: seqs {} ({} events): {}",
            range(l.first, l.end),
            l.end - l.first,
            l.why
        );
    }
    match removed {
        Some(r) if r.is_empty() => println!("nothing to repair"),
        Some(r) => {
            let events: u64 = r.iter().map(|l| l.end - l.first).sum();
            println!(
                "repaired: removed {} damaged blocks or events ({events} seqs), recorded as lost",
                r.len()
            );
        }
        None if c.damaged.is_empty() && c.damaged_unsealed.is_empty() => {
            println!("no damage found")
        }
        None => println!(
            "damage found: a server skips it (logged once per start); `riptide store repair --data {}` removes it, with the server stopped",
            dir.display()
        ),
    }
}
