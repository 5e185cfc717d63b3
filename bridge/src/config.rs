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
//! The file is checked as a file, whole, before anything runs: every key of
//! every section must be an option of that section's subcommand (a key at the
//! top, an option of any subcommand), every value must be one its option takes
//! (checked by that option's own parser), and each mistake is reported with the
//! file, the line, the key and why (exit 78, like any configuration a server
//! refuses): a typo in `[ingress]` is an error while running egress too, and a
//! bad value is never reported as if the user had typed a flag.
//!
//! Which sections a subcommand reads: the top, then its own section; `register`
//! and `status` also read the section of the file's `command` (between the two),
//! so that they act on the service the file describes (`register --config
//! FILE` registers its `name`). A key at the top that the running subcommand
//! does not have is left to the others (`status` ignores `sink`).
//!
//! Precedence: flags > environment > file > defaults. The file is applied by
//! setting, before the command line is parsed, the environment variable of every
//! option it gives whose variable is not set already; the parser then takes
//! flags over the environment as it always does.

use clap::error::{ContextKind, ContextValue};
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
    /// A key or value the file's options do not take, with the file, the line
    /// and the key: `FILE:LINE: ...`.
    #[error("{0}")]
    Invalid(String),
    #[error("{}: `run` needs command = \"egress\" or \"ingress\" in the file", .0.display())]
    NoCommand(PathBuf),
    #[error("`run` needs --config FILE (or ENVELOPES_CONFIG)")]
    NoFile,
}

fn in_section(section: Option<&str>) -> String {
    section.map(|s| format!(" in [{s}]")).unwrap_or_default()
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
                .is_some_and(|a| a == "run" || a == "watch" || COMMANDS.contains(&a))
        })
        .map(|p| p + 1);
    let Some(path) = path else {
        if position.is_some_and(|p| args[p] == "run") {
            return Err(ConfigError::NoFile);
        }
        return Ok(args);
    };
    let file = ConfigFile::read(&path)?;
    file.check()?;
    let file_command = file
        .table
        .get("command")
        .and_then(|c| c.as_str())
        .map(str::to_owned);
    let mut command = position.and_then(|p| args[p].to_str().map(str::to_owned));
    if command.as_deref() == Some("run") {
        let named = file_command
            .clone()
            .ok_or_else(|| ConfigError::NoCommand(path.clone()))?;
        if let Some(p) = position {
            args[p] = OsString::from(&named);
        }
        command = Some(named);
    }
    // No subcommand (the parser says what is missing), or `watch`, which takes
    // nothing from a file.
    let Some(command) = command.filter(|c| COMMANDS.contains(&c.as_str())) else {
        return Ok(args);
    };
    let options = options_of(&command);
    let mut sections: Vec<&toml::Table> = vec![&file.table];
    if command == "register" || command == "status" {
        if let Some(service) = file_command.as_deref().and_then(|c| file.section(c)) {
            sections.push(service);
        }
    }
    sections.extend(file.section(&command));
    let mut values: BTreeMap<String, String> = BTreeMap::new();
    for section in sections {
        for (key, value) in section {
            let long = key.replace('_', "-");
            if !options.contains_key(&long) {
                continue; // another subcommand's (checked above)
            }
            if let Some(text) = scalar(value) {
                values.insert(long, text);
            }
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

/// A configuration file read and parsed, with the line of every key.
struct ConfigFile {
    path: PathBuf,
    table: toml::Table,
    /// (section, key) -> line (1-based); the section of a top-level key is "".
    lines: BTreeMap<(String, String), usize>,
}

impl ConfigFile {
    fn read(path: &Path) -> Result<ConfigFile, ConfigError> {
        let text =
            std::fs::read_to_string(path).map_err(|e| ConfigError::Read(path.to_owned(), e))?;
        ConfigFile::parse(path, &text)
    }

    fn parse(path: &Path, text: &str) -> Result<ConfigFile, ConfigError> {
        let table = text
            .parse::<toml::Table>()
            .map_err(|e| ConfigError::Parse(path.to_owned(), e.to_string().trim().to_owned()))?;
        let line_of = |offset: usize| {
            text.get(..offset)
                .map_or(0, |before| before.matches('\n').count())
                + 1
        };
        let mut lines = BTreeMap::new();
        if let Ok(document) = toml::de::DeTable::parse(text) {
            for (key, value) in document.get_ref().iter() {
                let key_line = line_of(key.span().start);
                lines.insert((String::new(), key.get_ref().to_string()), key_line);
                if let toml::de::DeValue::Table(section) = value.get_ref() {
                    for (inner, _) in section.iter() {
                        lines.insert(
                            (key.get_ref().to_string(), inner.get_ref().to_string()),
                            line_of(inner.span().start),
                        );
                    }
                }
            }
        }
        Ok(ConfigFile {
            path: path.to_owned(),
            table,
            lines,
        })
    }

    fn section(&self, command: &str) -> Option<&toml::Table> {
        self.table.get(command).and_then(|t| t.as_table())
    }

    fn line(&self, section: Option<&str>, key: &str) -> usize {
        self.lines
            .get(&(section.unwrap_or_default().to_owned(), key.to_owned()))
            .copied()
            .unwrap_or(0)
    }

    /// Every key known where it stands and every value one its option takes.
    fn check(&self) -> Result<(), ConfigError> {
        let every: BTreeMap<&str, BTreeMap<String, clap::Arg>> =
            COMMANDS.iter().map(|c| (*c, args_of(c))).collect();
        for (key, value) in &self.table {
            if key == "command" {
                if !matches!(value.as_str(), Some("egress" | "ingress")) {
                    return Err(self.bad_value(None, key, value, "\"egress\" or \"ingress\""));
                }
                continue;
            }
            if let Some(section) = value.as_table() {
                if !COMMANDS.contains(&key.as_str()) {
                    return Err(ConfigError::Invalid(format!(
                        "{}:{}: unknown section [{key}] (sections: [egress], [ingress], \
                         [register], [status])",
                        self.path.display(),
                        self.line(None, key)
                    )));
                }
                let args = &every[key.as_str()];
                for (inner, value) in section {
                    let long = inner.replace('_', "-");
                    let Some(arg) = args.get(&long) else {
                        return Err(self.unknown(
                            Some(key),
                            inner,
                            args.keys().cloned().collect::<Vec<_>>(),
                        ));
                    };
                    self.check_value(Some(key), inner, value, arg)?;
                }
                continue;
            }
            let long = key.replace('_', "-");
            let having: Vec<&clap::Arg> = every.values().filter_map(|a| a.get(&long)).collect();
            if having.is_empty() {
                let mut known: Vec<String> =
                    every.values().flat_map(|a| a.keys().cloned()).collect();
                known.sort();
                known.dedup();
                return Err(self.unknown(None, key, known));
            }
            for arg in having {
                self.check_value(None, key, value, arg)?;
            }
        }
        Ok(())
    }

    fn check_value(
        &self,
        section: Option<&str>,
        key: &str,
        value: &toml::Value,
        arg: &clap::Arg,
    ) -> Result<(), ConfigError> {
        let Some(text) = scalar(value) else {
            return Err(self.bad_value(
                section,
                key,
                value,
                "must be a string, number, boolean or list of them",
            ));
        };
        check_with_parser(arg, &text).map_err(|reason| self.bad_value(section, key, value, &reason))
    }

    fn bad_value(
        &self,
        section: Option<&str>,
        key: &str,
        value: &toml::Value,
        reason: &str,
    ) -> ConfigError {
        let mut shown = value.to_string();
        if arg_is_secret(key) {
            shown = "(hidden)".into();
        }
        ConfigError::Invalid(format!(
            "{}:{}: {key}{} = {}: {reason}",
            self.path.display(),
            self.line(section, key),
            in_section(section),
            crate::redact::url(&shown)
        ))
    }

    fn unknown(&self, section: Option<&str>, key: &str, known: Vec<String>) -> ConfigError {
        ConfigError::Invalid(format!(
            "{}:{}: unknown key {key:?}{} (the keys there: {})",
            self.path.display(),
            self.line(section, key),
            in_section(section),
            known.join(", ")
        ))
    }
}

/// Keys whose values are not shown in an error.
fn arg_is_secret(key: &str) -> bool {
    let key = key.replace('_', "-");
    key.contains("password") || key.contains("token") || key.contains("secret")
}

/// Parses `text` with the option's own parser, as clap would from the command
/// line, and says why it is refused (without naming a flag nobody typed).
fn check_with_parser(arg: &clap::Arg, text: &str) -> Result<(), String> {
    let arg = arg.clone().required(false).env(None::<&str>);
    let argv = match arg.get_long() {
        Some(long) => vec![format!("--{long}={text}")],
        None => vec![text.to_owned()],
    };
    let command = clap::Command::new("file")
        .no_binary_name(true)
        .disable_help_flag(true)
        .disable_version_flag(true)
        .arg(arg);
    match command.try_get_matches_from(argv) {
        Ok(_) => Ok(()),
        Err(e) => Err(clap_reason(&e)),
    }
}

/// What a clap error says about the value itself.
fn clap_reason(error: &clap::Error) -> String {
    if let Some(source) = std::error::Error::source(error) {
        return source.to_string();
    }
    if let Some(ContextValue::Strings(valid)) = error.get(ContextKind::ValidValue) {
        return format!("expected one of {}", valid.join(", "));
    }
    let text = error.render().to_string();
    text.lines()
        .next()
        .unwrap_or_default()
        .trim_start_matches("error: ")
        .to_owned()
}

/// Long option name -> the option, for a subcommand (with the global options):
/// every option that has an environment variable has a key.
fn args_of(command: &str) -> BTreeMap<String, clap::Arg> {
    let cli = crate::cli::Cli::command();
    let mut options = BTreeMap::new();
    let globals: Vec<clap::Arg> = cli.get_arguments().cloned().collect();
    let own: Vec<clap::Arg> = cli
        .find_subcommand(command)
        .map(|c| c.get_arguments().cloned().collect())
        .unwrap_or_default();
    for arg in globals.into_iter().chain(own) {
        if arg.get_env().is_none() || arg.get_long() == Some("config") {
            continue;
        }
        let key = arg
            .get_long()
            .map(str::to_owned)
            .unwrap_or_else(|| arg.get_id().as_str().replace('_', "-"));
        options.insert(key, arg);
    }
    options
}

/// Long option name -> environment variable, for a subcommand.
fn options_of(command: &str) -> BTreeMap<String, String> {
    args_of(command)
        .into_iter()
        .filter_map(|(key, arg)| {
            arg.get_env()
                .map(|env| (key, env.to_string_lossy().into_owned()))
        })
        .collect()
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

    fn file(text: &str) -> Result<(), ConfigError> {
        ConfigFile::parse(Path::new("/etc/b.toml"), text)?.check()
    }

    #[test]
    fn a_bad_value_names_the_file_line_key_and_why_never_a_flag() {
        let err = file("command = \"egress\"\nname = \"x\"\n\n[egress]\nsink = \"stdout\"\nbatch-size = \"lots\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("/etc/b.toml:6: batch-size in [egress] = \"lots\": "),
            "{err}"
        );
        assert!(!err.contains("--batch-size"), "{err}");
        let err = file("[egress]\nbatch_size = 0\n").unwrap_err().to_string();
        assert!(
            err.contains(":2: batch_size in [egress] = 0: 0 is not in 1..=100000"),
            "{err}"
        );
        let err = file("forward-after = \"later\"\n").unwrap_err().to_string();
        assert!(
            err.contains(
                ":1: forward-after = \"later\": expected one of auto, standby-flush, commit"
            ),
            "{err}"
        );
        let err = file("[egress]\nsink = \"nats://u:hunter2@\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(":2: sink in [egress]") && !err.contains("hunter2"),
            "{err}"
        );
        let err = file("webhook-secret = [\"a\", {x = 1}]\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(":1: webhook-secret = (hidden): must be"),
            "{err}"
        );
        let err = file("command = \"egres\"\n").unwrap_err().to_string();
        assert!(err.contains(":1: command = \"egres\""), "{err}");
    }

    #[test]
    fn unknown_keys_are_refused_in_every_section() {
        let err = file("command = \"egress\"\n[egress]\nsink = \"stdout\"\n[ingress]\nsorce = \"nats://h:4222\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("/etc/b.toml:5: unknown key \"sorce\" in [ingress]"),
            "{err}"
        );
        assert!(err.contains("source"), "{err}");
        let err = file("[egres]\nsink = \"stdout\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("/etc/b.toml:1: unknown section [egres]"),
            "{err}"
        );
        let err = file("\n\nbatch-sise = 5\n").unwrap_err().to_string();
        assert!(
            err.starts_with("/etc/b.toml:3: unknown key \"batch-sise\""),
            "{err}"
        );
        // A key at the top is any subcommand's: status ignores the service's sink.
        file("command = \"egress\"\nname = \"x\"\nsink = \"stdout\"\nsource = \"nats://h:4222\"\nbridge-metrics = \"127.0.0.1:1,127.0.0.1:2\"\n")
            .unwrap();
        let err = file("[status]\nsink = \"stdout\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown key \"sink\" in [status]"), "{err}");
        assert!(matches!(
            ConfigFile::parse(Path::new("/x"), "a = [").err(),
            Some(ConfigError::Parse(..))
        ));
    }

    /// Every option has a file key and an environment variable, except the
    /// ones docs/bridge/configuration.md names as command-line only.
    #[test]
    fn every_option_has_a_variable_but_the_documented_few() {
        let cli = crate::cli::Cli::command();
        let mut without = Vec::new();
        let own = |c: &clap::Command| {
            c.get_arguments()
                .filter(|a| a.get_env().is_none())
                .map(|a| format!("{} {}", c.get_name(), a.get_id()))
                .collect::<Vec<_>>()
        };
        without.extend(own(&cli));
        for sub in cli.get_subcommands() {
            without.extend(own(sub));
        }
        without.sort();
        assert_eq!(
            without,
            ["envelopes-bridge check_config", "watch count", "watch url"],
            "document an option without a variable in docs/bridge/configuration.md"
        );
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
