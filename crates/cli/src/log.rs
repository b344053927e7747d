//! Diagnostics on stderr: the log filter (`-v`/`-q`, `RUST_LOG`), colour, and error text.
//!
//! Why one module: every command logs the same way, so an operator learns one rule. The filter is
//! `RUST_LOG` when set (tracing's `EnvFilter` syntax, e.g. `RUST_LOG=riptide_serve=debug`), else
//! the command's default level (`info` for `serve`, `error` for `demo`, `warn` otherwise) moved up
//! one step per `-v` and down one per `-q`. The storage library's (fjall's) start-up lines are
//! INFO in its own terms and noise in ours: they show from `debug` on. Colour only when stderr is
//! a terminal and `NO_COLOR` is unset or empty (<https://no-color.org>).
//!
//! `--log-format json` (or `RIPTIDE_LOG_FORMAT=json`; issue 39) is for log shippers: each line is
//! one JSON object, tracing-subscriber's own JSON formatter with the event's fields at the top
//! level beside `timestamp`, `level`, `target` and `message` (`{"timestamp":"…","level":"INFO",
//! "message":"store open","data":"d","next_seq":1,"target":"riptide::cmd::serve"}`), never
//! coloured. Then the process's last error line is such an object too ([`fatal`]), and `serve`
//! writes nothing else on stderr (its URL is in the log already).

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, AtomicI8, Ordering::Relaxed};

/// `-v` count minus `-q` count, set once by `main`.
static VERBOSITY: AtomicI8 = AtomicI8::new(0);

/// Whether lines are JSON (`--log-format json`), set once by `main`.
static JSON: AtomicBool = AtomicBool::new(false);

/// How log lines are written (`--log-format`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Lines for a person: time, level, target, message, fields.
    #[default]
    Text,
    /// One JSON object per line, for log shippers.
    Json,
}

/// Records the `--log-format` for [`init`] and [`fatal`].
pub fn set_format(format: Format) {
    JSON.store(format == Format::Json, Relaxed);
}

/// Whether log lines are JSON: a command that writes other lines on stderr leaves them out then.
pub fn json() -> bool {
    JSON.load(Relaxed)
}

/// Records the `-v`/`-q` counts for [`init`].
pub fn set_verbosity(verbose: u8, quiet: u8) {
    let v = i16::from(verbose.min(8)) - i16::from(quiet.min(8));
    VERBOSITY.store(v as i8, Relaxed);
}

const LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];

/// The filter used when `RUST_LOG` is unset: `default` moved by the verbosity, with the storage
/// library held at `warn` below `debug`.
pub fn default_filter(default: &str, verbosity: i8) -> String {
    let base = LEVELS.iter().position(|l| *l == default).unwrap_or(2) as i16;
    let level = (base + i16::from(verbosity)).clamp(0, LEVELS.len() as i16 - 1) as usize;
    if level >= 4 {
        LEVELS[level].to_owned()
    } else {
        // fjall (and its LSM tree) log their recovery and flushes at INFO.
        let storage = LEVELS[level.min(2)];
        format!("{},fjall={storage},lsm_tree={storage}", LEVELS[level])
    }
}

/// Whether stderr gets ANSI colours.
pub fn colour() -> bool {
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// Installs the stderr logger (once; later calls do nothing).
pub fn init(default: &str) {
    let filter = match std::env::var("RUST_LOG") {
        Ok(s) if !s.is_empty() => tracing_subscriber::EnvFilter::new(s),
        _ => tracing_subscriber::EnvFilter::new(default_filter(default, VERBOSITY.load(Relaxed))),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = if json() {
        builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .try_init()
    } else {
        builder.with_ansi(colour()).try_init()
    };
}

/// Says the error a command ends with: `riptide: TEXT` on stderr, or with `--log-format json` an
/// ERROR event like every other line (written by hand when the filter is `off`, so that it is
/// never lost).
pub fn fatal(text: &str) {
    if !json() {
        eprintln!("riptide: {text}");
    } else if tracing::enabled!(target: "riptide", tracing::Level::ERROR) {
        tracing::error!(target: "riptide", "{text}");
    } else {
        let line = serde_json::json!({"level": "ERROR", "message": text, "target": "riptide"});
        eprintln!("{line}");
    }
}

/// An error and its causes on one line, each said once: a cause whose text its parent already
/// contains (an I/O error a library quoted in its own message) is left out.
pub fn error_text(e: &anyhow::Error) -> String {
    let mut out = String::new();
    let mut last = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if text.is_empty() || last.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
        last = text;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verbosity_moves_the_level_and_storage_stays_quiet_below_debug() {
        assert_eq!(default_filter("info", 0), "info,fjall=warn,lsm_tree=warn");
        assert_eq!(default_filter("info", 1), "debug");
        assert_eq!(
            default_filter("warn", -1),
            "error,fjall=error,lsm_tree=error"
        );
        assert_eq!(default_filter("warn", -9), "off,fjall=off,lsm_tree=off");
        assert_eq!(default_filter("info", 9), "trace");
    }

    /// An error that quotes its source in its own text, as many libraries' errors do.
    #[derive(Debug)]
    struct Quoting(std::io::Error);

    impl std::fmt::Display for Quoting {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "reading x.json: {}", self.0)
        }
    }

    impl std::error::Error for Quoting {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn a_quoted_cause_is_said_once() {
        let io = std::io::Error::from(std::io::ErrorKind::NotFound);
        let io_text = io.to_string();
        let e = anyhow::Error::new(Quoting(io)).context("DID documents");
        let text = error_text(&e);
        assert_eq!(text, format!("DID documents: reading x.json: {io_text}"));
        assert_eq!(text.matches(&io_text).count(), 1);
    }
}
