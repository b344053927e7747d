//! `riptide completions SHELL` and `riptide man`: generated from the clap definitions.
//!
//! Why generated: a hand-written completion script or man page drifts from the flags; these are
//! the flags, by construction.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;

#[derive(clap::Args, Debug)]
pub struct CompletionsArgs {
    /// bash, zsh, fish, elvish or powershell.
    shell: clap_complete::Shell,
}

#[derive(clap::Args, Debug)]
pub struct ManArgs {
    /// Write riptide.1 and one riptide-COMMAND.1 per command into this directory instead.
    #[arg(long, value_name = "DIR")]
    out_dir: Option<PathBuf>,
}

pub fn completions(a: CompletionsArgs, mut cmd: clap::Command) -> anyhow::Result<ExitCode> {
    let mut stdout = crate::out::stdout();
    clap_complete::generate(a.shell, &mut cmd, "riptide", &mut stdout);
    std::io::Write::flush(&mut stdout)?;
    Ok(ExitCode::SUCCESS)
}

pub fn man(a: ManArgs, cmd: clap::Command) -> anyhow::Result<ExitCode> {
    match a.out_dir {
        Some(dir) => {
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            clap_mangen::generate_to(cmd, &dir)
                .with_context(|| format!("writing man pages to {}", dir.display()))?;
        }
        None => {
            let mut stdout = crate::out::stdout();
            clap_mangen::Man::new(cmd).render(&mut stdout)?;
            std::io::Write::flush(&mut stdout)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
