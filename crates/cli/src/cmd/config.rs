//! `riptide serve --config FILE`: the server's settings from a TOML file, flags overriding it.
//!
//! Why here and not in `serve`: the file is a second spelling of the command line, so it is read
//! by clap's own definitions and nothing else. Each key is a `serve` flag's long name
//! (`listen = "0.0.0.0:6008"`, `upstream = ["wss://a", "wss://b"]`, `no-verify = true`); the file's
//! settings are put on the command line before the user's flags, leaving out every setting the
//! user also gave as a flag, and the whole line is parsed again. So a flag added to `serve` is a
//! config key at once, with the same parser and the same checks, and a flag always wins over the
//! file. Unknown keys are errors that name the key and the file. Relative paths are relative to
//! the working directory, as on the command line. `deploy/riptide.toml` lists every key.
//!
//! **Environment** (issue 39; Jetstream reads `JETSTREAM_*` the same way): every `serve` flag is
//! also read from an environment variable named after it mechanically, `RIPTIDE_` and the long
//! name in capitals with `-` as `_` (`--data` is `RIPTIDE_DATA`, `--max-connections-per-ip`
//! `RIPTIDE_MAX_CONNECTIONS_PER_IP`, `--config` `RIPTIDE_CONFIG`), by clap's `env` feature, so
//! `--help` shows each name and the parser and checks are the flag's own. Names are made here
//! from the flags, not written out beside each one, so a new flag has its variable at once. An
//! on/off flag takes `true`/`false` (also `1`/`0`, `yes`/`no`, `on`/`off`); a repeatable one
//! (`--upstream`) a comma-separated list. Precedence: the command line, then the environment,
//! then the `--config` file, then the default (a file's setting is left out when its flag came
//! from either of the first two).

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::parser::ValueSource;
use clap::ArgAction;

/// `riptide serve`'s arguments: `--config` and the server's own flags.
#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// TOML file of settings: keys are this command's long flag names (see deploy/riptide.toml);
    /// flags given here override the file.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub serve: super::serve::Args,
}

/// Parses `argv`, with the settings of `serve --config FILE` added. A usage error exits as clap
/// exits (message, usage, code 2); an unreadable or invalid file is an error naming it.
pub fn parse_with_config(argv: Vec<OsString>) -> anyhow::Result<crate::Cli> {
    let (cli, matches) = crate::parse_args(&argv).unwrap_or_else(|e| e.exit());
    let Some(("serve", sm)) = matches.subcommand() else {
        return Ok(cli);
    };
    let Some(path) = sm.get_one::<PathBuf>("config") else {
        return Ok(cli);
    };
    // The command line and the environment win over the file (module docs).
    let settings = settings(path, |id| {
        matches!(
            sm.value_source(id),
            Some(ValueSource::CommandLine | ValueSource::EnvVariable)
        )
    })?;
    // The subcommand's token: the first `serve` after the program name (global flags take no
    // values, so nothing before it can be the word `serve` as a value).
    let at = argv
        .iter()
        .skip(1)
        .position(|a| a == "serve")
        .map(|i| i + 2)
        .context("no `serve` on the command line")?;
    let mut full = argv[..at].to_vec();
    full.extend(settings);
    full.extend_from_slice(&argv[at..]);
    match crate::parse_args(&full) {
        Ok((cli, _)) => Ok(cli),
        Err(e) => {
            let text = e.to_string();
            let first = text.lines().next().unwrap_or("");
            anyhow::bail!(
                "{} (with the settings of {})",
                first.trim_start_matches("error: "),
                path.display()
            )
        }
    }
}

/// The environment variable of `serve`'s flag `--long` (module docs, "Environment").
pub fn env_name(long: &str) -> String {
    format!("RIPTIDE_{}", long.to_ascii_uppercase().replace('-', "_"))
}

/// `serve` with each of its flags also read from [`env_name`] (module docs, "Environment").
pub fn with_env(serve: clap::Command) -> clap::Command {
    serve.mut_args(|a| {
        let Some(long) = a.get_long().filter(|l| !matches!(*l, "help" | "version")) else {
            return a;
        };
        let name = env_name(long);
        match a.get_action() {
            // `RIPTIDE_NO_VERIFY=1` as well as `=true`; the command line's `--no-verify` is
            // `true` to this parser too.
            ArgAction::SetTrue => a
                .env(name)
                .value_parser(clap::builder::BoolishValueParser::new()),
            // One variable for a repeatable flag: its values separated by commas.
            ArgAction::Append => a.env(name).value_delimiter(','),
            _ => a.env(name),
        }
    })
}

/// The file's settings as `--flag=value` arguments, leaving out those `on_command_line` (given
/// there or in the environment).
fn settings(path: &Path, on_command_line: impl Fn(&str) -> bool) -> anyhow::Result<Vec<OsString>> {
    let text = String::from_utf8(super::read_file(path)?)
        .map_err(|_| anyhow::anyhow!("{}: not UTF-8 text", path.display()))?;
    let table: toml::Table = text.parse().map_err(|e: toml::de::Error| {
        anyhow::anyhow!("{}: not TOML: {}", path.display(), e.message())
    })?;
    // Built, so that the global flags (`--log-format`) are among serve's.
    let mut cmd = crate::command();
    cmd.build();
    let serve = cmd
        .find_subcommand("serve")
        .context("no serve subcommand")?;
    let settable = |a: &&clap::Arg| {
        a.get_long()
            .is_some_and(|l| !matches!(l, "config" | "help" | "version" | "verbose" | "quiet"))
    };
    let mut out = Vec::new();
    for (key, value) in &table {
        let Some(arg) = serve
            .get_arguments()
            .filter(settable)
            .find(|a| a.get_long() == Some(key.as_str()))
        else {
            let known: Vec<&str> = serve
                .get_arguments()
                .filter(settable)
                .filter_map(clap::Arg::get_long)
                .collect();
            anyhow::bail!(
                "{}: unknown setting `{key}` (the settings are serve's flags: {})",
                path.display(),
                known.join(", ")
            );
        };
        if on_command_line(arg.get_id().as_str()) {
            continue;
        }
        let bad = |want: &str| {
            anyhow::anyhow!(
                "{}: `{key}` must be {want}, not {}",
                path.display(),
                value.type_str()
            )
        };
        match arg.get_action() {
            ArgAction::SetTrue => match value {
                toml::Value::Boolean(true) => out.push(format!("--{key}").into()),
                toml::Value::Boolean(false) => {}
                _ => return Err(bad("true or false")),
            },
            ArgAction::Append => {
                let items: Vec<&toml::Value> = match value {
                    toml::Value::Array(a) => a.iter().collect(),
                    v => vec![v],
                };
                for v in items {
                    let s = scalar(v).ok_or_else(|| bad("a value or a list of values"))?;
                    out.push(format!("--{key}={s}").into());
                }
            }
            _ => {
                let s = scalar(value).ok_or_else(|| bad("a single value"))?;
                out.push(format!("--{key}={s}").into());
            }
        }
    }
    Ok(out)
}

/// A TOML scalar as the text a flag would be given.
fn scalar(v: &toml::Value) -> Option<String> {
    match v {
        toml::Value::String(s) => Some(s.clone()),
        toml::Value::Integer(i) => Some(i.to_string()),
        toml::Value::Float(f) => Some(f.to_string()),
        toml::Value::Boolean(b) => Some(b.to_string()),
        toml::Value::Datetime(d) => Some(d.to_string()),
        toml::Value::Array(_) | toml::Value::Table(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_serve_flag_has_its_environment_variable() {
        assert_eq!(env_name("data"), "RIPTIDE_DATA");
        assert_eq!(
            env_name("max-connections-per-ip"),
            "RIPTIDE_MAX_CONNECTIONS_PER_IP"
        );
        assert_eq!(env_name("zstd-dictionary-v2"), "RIPTIDE_ZSTD_DICTIONARY_V2");
        let cmd = crate::command();
        let serve = cmd.find_subcommand("serve").unwrap();
        let mut named = 0;
        for a in serve.get_arguments() {
            let Some(long) = a.get_long() else { continue };
            if long == "help" {
                assert_eq!(a.get_env(), None);
                continue;
            }
            let want = env_name(long);
            assert_eq!(
                a.get_env().and_then(|e| e.to_str()),
                Some(want.as_str()),
                "--{long}"
            );
            named += 1;
        }
        // The flags of issue 39's examples are among them.
        assert!(named >= 25, "{named}");
    }
}
