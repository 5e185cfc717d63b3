//! The `--sink` argument: which bus egress publishes to, parsed from its URL
//! (and shown without its credentials).

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

/// A sink as given on the command line.
#[derive(Clone, PartialEq, Eq)]
pub enum SinkSpec {
    Stdout,
    Jsonl(PathBuf),
    Nats(String),
    Redis(String),
    Mqtt {
        host: String,
        port: u16,
        username: Option<String>,
        password: Option<String>,
    },
    /// `amqp://user:pass@host:port/vhost` (or `amqps://`), as lapin takes it.
    Amqp(String),
    /// `http://` or `https://` URL the batches are POSTed to.
    Webhook(String),
}

impl fmt::Debug for SinkSpec {
    /// Never prints credentials.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}

impl fmt::Display for SinkSpec {
    /// The sink without credentials, for logs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SinkSpec::Stdout => write!(f, "stdout"),
            SinkSpec::Jsonl(path) => write!(f, "jsonl:{}", path.display()),
            SinkSpec::Nats(url)
            | SinkSpec::Redis(url)
            | SinkSpec::Amqp(url)
            | SinkSpec::Webhook(url) => {
                write!(f, "{}", crate::redact::url(url))
            }
            SinkSpec::Mqtt { host, port, .. } => write!(f, "mqtt://{host}:{port}"),
        }
    }
}

/// Why a sink argument is not understood.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SinkParseError {
    #[error("unknown sink {0:?}: expected stdout, jsonl:PATH, nats://HOST:PORT, redis://HOST:PORT, mqtt://HOST:PORT, amqp://HOST:PORT/VHOST or http(s)://HOST:PORT/PATH")]
    Unknown(String),
    #[error("jsonl sink needs a path: jsonl:PATH")]
    EmptyPath,
    #[error("{0}: missing or invalid host:port")]
    Address(String),
}

impl FromStr for SinkSpec {
    type Err = SinkParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if s == "stdout" {
            return Ok(SinkSpec::Stdout);
        }
        if let Some(path) = s.strip_prefix("jsonl:") {
            return if path.is_empty() {
                Err(SinkParseError::EmptyPath)
            } else {
                Ok(SinkSpec::Jsonl(PathBuf::from(path)))
            };
        }
        // A NATS cluster by several seed servers: nats://a:4222,nats://b:4222.
        if s.contains(',') && (s.starts_with("nats://") || s.starts_with("tls://")) {
            for part in s.split(',') {
                match part.parse::<SinkSpec>()? {
                    SinkSpec::Nats(_) => {}
                    _ => return Err(SinkParseError::Address(crate::redact::url(s))),
                }
            }
            return Ok(SinkSpec::Nats(s.to_owned()));
        }
        let (scheme, rest) = s
            .split_once("://")
            .ok_or_else(|| SinkParseError::Unknown(s.into()))?;
        let (userinfo, hostport) = match rest.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, rest),
        };
        // What follows host:port (an AMQP vhost, a Redis database) is the client's.
        let hostport = hostport.split_once('/').map_or(hostport, |(h, _)| h);
        let (host, port) = hostport
            .rsplit_once(':')
            .and_then(|(h, p)| Some((h, p.parse::<u16>().ok()?)))
            .filter(|(h, _)| !h.is_empty() && !h.contains('/'))
            .ok_or_else(|| SinkParseError::Address(crate::redact::url(s)))?;
        match scheme {
            "nats" | "tls" => Ok(SinkSpec::Nats(s.to_owned())),
            "redis" | "rediss" => Ok(SinkSpec::Redis(s.to_owned())),
            "amqp" | "amqps" => Ok(SinkSpec::Amqp(s.to_owned())),
            "http" | "https" => Ok(SinkSpec::Webhook(s.to_owned())),
            "mqtt" => {
                let (username, password) = match userinfo {
                    Some(u) => match u.split_once(':') {
                        Some((name, pass)) => (Some(name.to_owned()), Some(pass.to_owned())),
                        None => (Some(u.to_owned()), None),
                    },
                    None => (None, None),
                };
                Ok(SinkSpec::Mqtt {
                    host: host.to_owned(),
                    port,
                    username,
                    password,
                })
            }
            _ => Err(SinkParseError::Unknown(crate::redact::url(s))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sinks() {
        assert_eq!("stdout".parse(), Ok(SinkSpec::Stdout));
        assert_eq!(
            "jsonl:/tmp/x.jsonl".parse(),
            Ok(SinkSpec::Jsonl("/tmp/x.jsonl".into()))
        );
        assert_eq!(
            "nats://127.0.0.1:4222".parse(),
            Ok(SinkSpec::Nats("nats://127.0.0.1:4222".into()))
        );
        assert_eq!(
            "nats://127.0.0.1:4222,nats://127.0.0.1:4223".parse(),
            Ok(SinkSpec::Nats(
                "nats://127.0.0.1:4222,nats://127.0.0.1:4223".into()
            ))
        );
        assert!("nats://127.0.0.1:4222,redis://127.0.0.1:6379"
            .parse::<SinkSpec>()
            .is_err());
        assert!("nats://127.0.0.1:4222,".parse::<SinkSpec>().is_err());
        assert_eq!(
            "redis://127.0.0.1:6379".parse(),
            Ok(SinkSpec::Redis("redis://127.0.0.1:6379".into()))
        );
        assert_eq!(
            "amqp://guest:guest@127.0.0.1:5672/%2f".parse(),
            Ok(SinkSpec::Amqp(
                "amqp://guest:guest@127.0.0.1:5672/%2f".into()
            ))
        );
        assert_eq!(
            "mqtt://u:p@localhost:1883".parse(),
            Ok(SinkSpec::Mqtt {
                host: "localhost".into(),
                port: 1883,
                username: Some("u".into()),
                password: Some("p".into())
            })
        );
    }

    #[test]
    fn rejects_bad_sinks_without_echoing_secrets() {
        assert_eq!("jsonl:".parse::<SinkSpec>(), Err(SinkParseError::EmptyPath));
        assert!(matches!(
            "kafka://h:1".parse::<SinkSpec>(),
            Err(SinkParseError::Unknown(_))
        ));
        assert!(matches!(
            "nats://host".parse::<SinkSpec>(),
            Err(SinkParseError::Address(_))
        ));
        assert!(matches!(
            "nats://:4222".parse::<SinkSpec>(),
            Err(SinkParseError::Address(_))
        ));
        let err = "ftp://user:hunter2@h:1"
            .parse::<SinkSpec>()
            .unwrap_err()
            .to_string();
        assert!(!err.contains("hunter2"), "{err}");
        let shown = "mqtt://u:hunter2@h:1"
            .parse::<SinkSpec>()
            .unwrap()
            .to_string();
        assert!(!shown.contains("hunter2"), "{shown}");
    }
}

/// Generated inputs for the sink argument parser and the URL redaction.
#[cfg(test)]
mod fuzz {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4000))]

        #[test]
        fn any_string_parses_or_errors(s in ".{0,80}") {
            let _ = s.parse::<SinkSpec>();
            let _ = crate::redact::url(&s);
        }

        #[test]
        fn url_shaped_strings_never_panic(
            scheme in "(nats|redis|rediss|mqtt|tls|jsonl|[a-z]{1,6})",
            user in "[a-zA-Z0-9:@%]{0,12}",
            host in "[a-z0-9.:\\[\\]]{0,20}",
            port in "[0-9]{0,7}",
            rest in "[/?&=a-z]{0,12}",
        ) {
            let url = format!("{scheme}://{user}@{host}:{port}{rest}");
            let _ = url.parse::<SinkSpec>();
            let _ = crate::redact::url(&url);
        }

        #[test]
        fn passwords_never_survive_redaction(
            user in "[a-z]{1,8}",
            password in "[A-Z0-9]{6,16}",
            host in "[a-z]{1,10}",
        ) {
            for scheme in ["postgres", "nats", "redis", "mqtt"] {
                let url = format!("{scheme}://{user}:{password}@{host}:1234/db");
                let shown = crate::redact::url(&url);
                prop_assert!(!shown.contains(&password), "{}", shown);
                if let Ok(spec) = url.parse::<SinkSpec>() {
                    prop_assert!(!spec.to_string().contains(&password));
                    let debug = format!("{:?}", spec);
                    prop_assert!(!debug.contains(&password));
                }
            }
        }
    }
}
