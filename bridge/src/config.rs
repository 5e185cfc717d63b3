//! The `--config FILE` (or `ENVELOPES_CONFIG`): a TOML file that gives any
//! option by its long name, for running the bridge as a service from one file
//! per instance.
//!
//! ```toml
//! command = "egress"            # what `envelopes-bridge run` runs
//! database-url = "postgres://bridge@db/app"
//! name = "forwarder"
//!
//! [egress]                      # options of one subcommand (win over the top)
//! sink = "nats://127.0.0.1:4222"
//! batch-size = 500
//! ```
//!
//! Precedence: flags > environment > file > defaults. The file is applied by
//! setting, before the command line is parsed, the environment variable of every
//! option it gives whose variable is not set already; the parser then takes
//! flags over the environment as it always does. A key the subcommand does not
//! have is an error (a typo must not pass silently), as is a file that cannot be
//! read or parsed.

use clap::CommandFactory;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// Why the configuration file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read the configuration file {0}: {1}")]
    Read(PathBuf, std::io::Error),
    #[error("the configuration file {0} is not valid TOML: {1}")]
    Parse(PathBuf, String),
    #[error("{file}: unknown option {key:?} for `{command}` (known: {known})")]
    Unknown {
        file: PathBuf,
        key: String,
        command: String,
        known: String,
    },
    #[error("{file}: {key:?} must be a string, number, boolean or list of them")]
    Value { file: PathBuf, key: String },
    #[error("{0}: `run` needs command = \"egress\" or \"ingress\" in the file")]
    NoCommand(PathBuf),
    #[error("`run` needs --config FILE (or ENVELOPES_CONFIG)")]
    NoFile,
}

/// The subcommands a file may configure.
const COMMANDS: [&str; 4] = ["egress", "ingress", "register", "status"];

/// Applies the configuration file, if one is given, to the environment, and
/// returns the arguments to parse (`run` replaced by the file's `command`).
pub fn apply(mut args: Vec<OsString>) -> Result<Vec<OsString>, ConfigError> {
    // Asking for help or the version needs no file: the parser answers
    // (`envelopes-bridge run --help` describes `run`).
    if args
        .iter()
        .skip(1)
        .any(|a| matches!(a.to_str(), Some("--help" | "-h" | "--version" | "-V")))
    {
        return Ok(args);
    }
    let path = config_path(&args);
    let position = args
        .iter()
        .skip(1)
        .position(|a| {
            a.to_str()
                .is_some_and(|a| a == "run" || COMMANDS.contains(&a))
        })
        .map(|p| p + 1);
    let Some(path) = path else {
        if position.is_some_and(|p| args[p] == "run") {
            return Err(ConfigError::NoFile);
        }
        return Ok(args);
    };
    let table = read(&path)?;
    let mut command = position.and_then(|p| args[p].to_str().map(str::to_owned));
    if command.as_deref() == Some("run") {
        let named = table
            .get("command")
            .and_then(|c| c.as_str())
            .filter(|c| *c == "egress" || *c == "ingress")
            .ok_or_else(|| ConfigError::NoCommand(path.clone()))?;
        if let Some(p) = position {
            args[p] = OsString::from(named);
        }
        command = Some(named.to_owned());
    }
    let Some(command) = command else {
        return Ok(args); // no subcommand: the parser says what is missing
    };
    let options = options_of(&command);
    let mut values: BTreeMap<String, String> = BTreeMap::new();
    let sections: Vec<&toml::Table> = std::iter::once(&table)
        .chain(table.get(&command).and_then(|t| t.as_table()))
        .collect();
    for section in sections {
        for (key, value) in section {
            // The file's command, and the sections of the subcommands.
            if key == "command" || (value.is_table() && COMMANDS.contains(&key.as_str())) {
                continue;
            }
            let long = key.replace('_', "-");
            if !options.contains_key(&long) {
                return Err(ConfigError::Unknown {
                    file: path.clone(),
                    key: key.clone(),
                    command: command.clone(),
                    known: options.keys().cloned().collect::<Vec<_>>().join(", "),
                });
            }
            let text = scalar(value).ok_or_else(|| ConfigError::Value {
                file: path.clone(),
                key: key.clone(),
            })?;
            values.insert(long, text);
        }
    }
    for (long, text) in values {
        let var = &options[&long];
        if std::env::var_os(var).is_none() {
            // Single-threaded still: called from main before the runtime starts.
            std::env::set_var(var, text);
        }
    }
    Ok(args)
}

/// `--config PATH`, `--config=PATH`, or `ENVELOPES_CONFIG`.
fn config_path(args: &[OsString]) -> Option<PathBuf> {
    let mut iter = args.iter().skip(1);
    while let Some(arg) = iter.next() {
        let Some(arg) = arg.to_str() else { continue };
        if arg == "--config" {
            return iter.next().map(PathBuf::from);
        }
        if let Some(path) = arg.strip_prefix("--config=") {
            return Some(PathBuf::from(path));
        }
    }
    std::env::var_os("ENVELOPES_CONFIG").map(PathBuf::from)
}

fn read(path: &Path) -> Result<toml::Table, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read(path.to_owned(), e))?;
    text.parse::<toml::Table>()
        .map_err(|e| ConfigError::Parse(path.to_owned(), e.to_string()))
}

/// Long option name -> environment variable, for a subcommand (with the global
/// options).
fn options_of(command: &str) -> BTreeMap<String, String> {
    let cli = crate::cli::Cli::command();
    let mut options = BTreeMap::new();
    let globals = cli.get_arguments();
    let own = cli
        .find_subcommand(command)
        .map(|c| c.get_arguments().collect::<Vec<_>>())
        .unwrap_or_default();
    for arg in globals.chain(own) {
        if let (Some(long), Some(env)) = (arg.get_long(), arg.get_env()) {
            if long != "config" {
                options.insert(long.to_owned(), env.to_string_lossy().into_owned());
            }
        }
    }
    options
}

/// A TOML value as the option's text (a list joined with commas).
fn scalar(value: &toml::Value) -> Option<String> {
    match value {
        toml::Value::String(s) => Some(s.clone()),
        toml::Value::Integer(i) => Some(i.to_string()),
        toml::Value::Float(f) => Some(f.to_string()),
        toml::Value::Boolean(b) => Some(b.to_string()),
        toml::Value::Array(items) => items
            .iter()
            .map(scalar)
            .collect::<Option<Vec<_>>>()
            .map(|v| v.join(",")),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_option_of_egress_and_ingress_has_a_key() {
        let egress = options_of("egress");
        for key in [
            "database-url",
            "name",
            "sink",
            "batch-size",
            "nats-stream",
            "metrics-addr",
            "webhook-secret",
            "log-json",
            "ready-after",
            "register",
            "forward-after",
        ] {
            assert!(egress.contains_key(key), "{key}");
        }
        assert_eq!(egress["sink"], "ENVELOPES_SINK");
        let ingress = options_of("ingress");
        assert!(ingress.contains_key("source") && !ingress.contains_key("sink"));
    }

    #[test]
    fn help_needs_no_file() {
        for ask in ["--help", "-h", "--version"] {
            let args: Vec<OsString> = ["envelopes-bridge", "run", ask]
                .iter()
                .map(OsString::from)
                .collect();
            assert_eq!(apply(args.clone()).unwrap(), args, "{ask}");
        }
        let args: Vec<OsString> = ["envelopes-bridge", "run"]
            .iter()
            .map(OsString::from)
            .collect();
        assert!(matches!(apply(args), Err(ConfigError::NoFile)));
    }

    #[test]
    fn values_become_option_text() {
        let table: toml::Table = "a = 5\nb = true\nc = \"x\"\nd = [\"p\", \"q\"]\n"
            .parse()
            .unwrap();
        assert_eq!(scalar(&table["a"]).as_deref(), Some("5"));
        assert_eq!(scalar(&table["b"]).as_deref(), Some("true"));
        assert_eq!(scalar(&table["c"]).as_deref(), Some("x"));
        assert_eq!(scalar(&table["d"]).as_deref(), Some("p,q"));
    }
}
