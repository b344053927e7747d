//! Puts the git commit into `riptide --version` (`RIPTIDE_GIT_COMMIT`).
//!
//! Why: a bug report or a deployed server should say exactly which source it was built from. The
//! commit comes from `RIPTIDE_GIT_COMMIT` when set (a build without `.git`, e.g. a container
//! build given it as an argument), else from `git rev-parse HEAD`, else it is `unknown`: a build
//! never fails for want of git. (No `-dirty` mark: cargo reruns this script when HEAD moves, not
//! on every edit, so such a mark would go stale.)

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?;
    Some(s.trim().to_owned())
}

fn main() {
    println!("cargo:rerun-if-env-changed=RIPTIDE_GIT_COMMIT");
    let commit = match std::env::var("RIPTIDE_GIT_COMMIT") {
        Ok(c) if !c.trim().is_empty() => c.trim().to_owned(),
        _ => match git(&["rev-parse", "--short=12", "HEAD"]) {
            Some(hash) => {
                // Rebuild when HEAD moves (a commit, a checkout); `--git-path` finds these files
                // in a linked worktree too.
                for p in ["HEAD", "packed-refs"] {
                    if let Some(path) = git(&["rev-parse", "--git-path", p]) {
                        println!("cargo:rerun-if-changed={path}");
                    }
                }
                if let Some(r) = git(&["symbolic-ref", "-q", "HEAD"]) {
                    if let Some(path) = git(&["rev-parse", "--git-path", &r]) {
                        println!("cargo:rerun-if-changed={path}");
                    }
                }
                hash
            }
            None => "unknown".to_owned(),
        },
    };
    println!("cargo:rustc-env=RIPTIDE_GIT_COMMIT={commit}");
}
