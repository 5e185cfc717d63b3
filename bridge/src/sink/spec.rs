//! The `--sink` argument: which bus egress publishes to, parsed from its URL
//! (and shown without its credentials).
//!
//! URLs are taken as users write them: the port may be left out (each scheme's
//! usual one is filled in: nats and tls 4222, redis and rediss 6379, mqtt 1883,
//! amqp 5672, amqps 5671, http 80, https 443), and a bus sink may name several
//! servers, comma-separated, as its own clients take them:
//! `nats://a:4222,nats://b:4222` (NATS' seed list; the client picks and fails
//! over), `amqp://u:p@a/%2f,amqp://u:p@b/%2f`, `redis://a,redis://b`,
//! `mqtt://a,mqtt://b` (tried in order at every connect, as RabbitMQ's and
//! Paho's address lists are: the first that accepts the bridge is used). A
//! server after the first may be a bare `HOST[:PORT]`: it takes the first URL's
//! scheme, credentials and path (`nats://a,b,c`). A webhook takes one URL (a
//! comma belongs to its query).

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

/// A sink as given on the command line, its URLs with their ports filled in.
#[derive(Clone, PartialEq, Eq)]
pub enum SinkSpec {
    Stdout,
    Jsonl(PathBuf),
    /// The servers, comma-separated (NATS' own form of a seed list).
    Nats(String),
    /// One URL per server, tried in order.
    Redis(Vec<String>),
    Mqtt {
        /// (host, port) per server, tried in order.
        servers: Vec<(String, u16)>,
        username: Option<String>,
        password: Option<String>,
    },
    /// `amqp://user:pass@host:port/vhost` (or `amqps://`), as lapin takes it;
    /// one per server, tried in order.
    Amqp(Vec<String>),
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
        let list = |urls: &[String]| {
            urls.iter()
                .map(|u| crate::redact::url(u))
                .collect::<Vec<_>>()
                .join(",")
        };
        match self {
            SinkSpec::Stdout => write!(f, "stdout"),
            SinkSpec::Jsonl(path) => write!(f, "jsonl:{}", path.display()),
            SinkSpec::Nats(url) | SinkSpec::Webhook(url) => {
                write!(f, "{}", crate::redact::url(url))
            }
            SinkSpec::Redis(urls) | SinkSpec::Amqp(urls) => write!(f, "{}", list(urls)),
            SinkSpec::Mqtt { servers, .. } => write!(
                f,
                "{}",
                servers
                    .iter()
                    .map(|(host, port)| format!("mqtt://{host}:{port}"))
                    .collect::<Vec<_>>()
                    .join(",")
            ),
        }
    }
}

/// Why a sink argument is not understood.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SinkParseError {
    #[error("unknown sink {0:?}: expected stdout, jsonl:PATH, nats://HOST[:PORT], redis://HOST[:PORT], mqtt://HOST[:PORT], amqp://HOST[:PORT]/VHOST or http(s)://HOST[:PORT]/PATH (bus sinks: several servers comma-separated)")]
    Unknown(String),
    #[error("jsonl sink needs a path: jsonl:PATH")]
    EmptyPath,
    #[error("{0}: missing or invalid host or port")]
    Address(String),
    #[error("{0}: every server of a sink must be of the same bus")]
    Mixed(String),
}

/// The usual port of a scheme the bridge serves.
fn default_port(scheme: &str) -> Option<u16> {
    Some(match scheme {
        "nats" | "tls" => 4222,
        "redis" | "rediss" => 6379,
        "mqtt" => 1883,
        "amqp" => 5672,
        "amqps" => 5671,
        "http" => 80,
        "https" => 443,
        _ => return None,
    })
}

/// One server's URL taken apart.
struct Server<'a> {
    scheme: &'a str,
    userinfo: Option<&'a str>,
    host: &'a str,
    port: u16,
    /// What follows host:port (an AMQP vhost, a Redis database, a path).
    rest: &'a str,
}

impl Server<'_> {
    /// The URL with its port.
    fn url(&self) -> String {
        let userinfo = self.userinfo.map(|u| format!("{u}@")).unwrap_or_default();
        format!(
            "{}://{userinfo}{}:{}{}",
            self.scheme, self.host, self.port, self.rest
        )
    }
}

/// `SCHEME://[USERINFO@]HOST[:PORT][/REST]`, the port defaulting to the
/// scheme's.
fn server(url: &str) -> Result<Server<'_>, SinkParseError> {
    let bad = || SinkParseError::Address(crate::redact::url(url));
    let (scheme, after) = url
        .split_once("://")
        .ok_or_else(|| SinkParseError::Unknown(crate::redact::url(url)))?;
    let port_of =
        default_port(scheme).ok_or_else(|| SinkParseError::Unknown(crate::redact::url(url)))?;
    let (userinfo, hostport_rest) = match after.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, after),
    };
    let cut = hostport_rest
        .find(['/', '?', '#'])
        .unwrap_or(hostport_rest.len());
    let (hostport, rest) = hostport_rest.split_at(cut);
    let (host, port) = if let Some(bracketed) = hostport.strip_prefix('[') {
        // [IPv6]:PORT
        let (inside, after) = bracketed.split_once(']').ok_or_else(bad)?;
        let host = &hostport[..inside.len() + 2];
        match after {
            "" => (host, port_of),
            p => (
                host,
                p.strip_prefix(':')
                    .and_then(|p| p.parse::<u16>().ok())
                    .ok_or_else(bad)?,
            ),
        }
    } else {
        match hostport.rsplit_once(':') {
            Some((h, p)) => (h, p.parse::<u16>().map_err(|_| bad())?),
            None => (hostport, port_of),
        }
    };
    if host.is_empty() || host.contains([':', '@']) && !host.starts_with('[') || port == 0 {
        return Err(bad());
    }
    Ok(Server {
        scheme,
        userinfo,
        host,
        port,
        rest,
    })
}

/// The bus of a scheme (plain or TLS).
fn family(scheme: &str) -> &str {
    match scheme {
        "tls" => "nats",
        "rediss" => "redis",
        "amqps" => "amqp",
        other => other,
    }
}

/// The servers of a comma-separated list, each with its port; a bare
/// `HOST[:PORT]` after the first takes the first's scheme, credentials and
/// path.
fn servers(list: &str) -> Result<Vec<Server<'_>>, SinkParseError> {
    let mut parts = list.split(',').map(str::trim);
    let first = server(parts.next().unwrap_or_default())?;
    let mut out = Vec::new();
    for part in parts {
        let next = if part.contains("://") {
            server(part)?
        } else {
            let (hostport, _) = part.split_once('/').unwrap_or((part, ""));
            let (host, port) = match hostport.rsplit_once(':') {
                Some((h, p)) if !h.ends_with(']') || h.starts_with('[') => (
                    h,
                    p.parse::<u16>()
                        .map_err(|_| SinkParseError::Address(crate::redact::url(list)))?,
                ),
                _ => (hostport, default_port(first.scheme).unwrap_or(0)),
            };
            if host.is_empty() || port == 0 || host.contains(['@', '/']) {
                return Err(SinkParseError::Address(crate::redact::url(list)));
            }
            Server {
                scheme: first.scheme,
                userinfo: first.userinfo,
                host,
                port,
                rest: first.rest,
            }
        };
        if family(next.scheme) != family(first.scheme) {
            return Err(SinkParseError::Mixed(crate::redact::url(list)));
        }
        out.push(next);
    }
    out.insert(0, first);
    Ok(out)
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
        if s.starts_with("http://") || s.starts_with("https://") {
            // One URL: a comma belongs to its path or query.
            server(s)?;
            return Ok(SinkSpec::Webhook(s.to_owned()));
        }
        let list = servers(s)?;
        let urls = || list.iter().map(Server::url).collect::<Vec<_>>();
        match list[0].scheme {
            "nats" | "tls" => Ok(SinkSpec::Nats(urls().join(","))),
            "redis" | "rediss" => Ok(SinkSpec::Redis(urls())),
            "amqp" | "amqps" => Ok(SinkSpec::Amqp(urls())),
            "mqtt" => {
                let (username, password) = match list.iter().find_map(|s| s.userinfo) {
                    Some(u) => match u.split_once(':') {
                        Some((name, pass)) => (Some(name.to_owned()), Some(pass.to_owned())),
                        None => (Some(u.to_owned()), None),
                    },
                    None => (None, None),
                };
                Ok(SinkSpec::Mqtt {
                    servers: list.iter().map(|s| (s.host.to_owned(), s.port)).collect(),
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
            Ok(SinkSpec::Redis(vec!["redis://127.0.0.1:6379".into()]))
        );
        assert_eq!(
            "amqp://guest:guest@127.0.0.1:5672/%2f".parse(),
            Ok(SinkSpec::Amqp(vec![
                "amqp://guest:guest@127.0.0.1:5672/%2f".into()
            ]))
        );
        assert_eq!(
            "mqtt://u:p@localhost:1883".parse(),
            Ok(SinkSpec::Mqtt {
                servers: vec![("localhost".into(), 1883)],
                username: Some("u".into()),
                password: Some("p".into())
            })
        );
    }

    /// Item 5 of issue 43: URLs as users write them.
    #[test]
    fn ports_default_per_scheme_and_lists_take_each_bus_form() {
        let cases = [
            ("nats://h", "nats://h:4222"),
            ("tls://h", "tls://h:4222"),
            ("nats://a,nats://b:4223", "nats://a:4222,nats://b:4223"),
            ("nats://a, b, c:5", "nats://a:4222,nats://b:4222,nats://c:5"),
            ("nats://[::1]", "nats://[::1]:4222"),
            ("nats://[::1]:7", "nats://[::1]:7"),
            ("redis://h", "redis://h:6379"),
            ("redis://:pw@h/2", "redis://:pw@h:6379/2"),
            ("rediss://h", "rediss://h:6379"),
            ("amqp://u:p@h/%2f", "amqp://u:p@h:5672/%2f"),
            ("amqps://u:p@h/v", "amqps://u:p@h:5671/v"),
            ("https://hooks.example.com/x", "https://hooks.example.com/x"),
            ("http://h/x?a=1,2", "http://h/x?a=1,2"),
        ];
        for (given, wanted) in cases {
            let spec: SinkSpec = given.parse().unwrap_or_else(|e| panic!("{given}: {e}"));
            let urls = match spec {
                SinkSpec::Nats(u) | SinkSpec::Webhook(u) => u,
                SinkSpec::Redis(u) | SinkSpec::Amqp(u) => u.join(","),
                other => panic!("{given}: {other}"),
            };
            assert_eq!(urls, wanted, "{given}");
        }
        assert_eq!(
            "amqp://u:p@a/%2f,b:5673".parse(),
            Ok(SinkSpec::Amqp(vec![
                "amqp://u:p@a:5672/%2f".into(),
                "amqp://u:p@b:5673/%2f".into()
            ]))
        );
        assert_eq!(
            "mqtt://u:p@a,mqtt://b:1884".parse(),
            Ok(SinkSpec::Mqtt {
                servers: vec![("a".into(), 1883), ("b".into(), 1884)],
                username: Some("u".into()),
                password: Some("p".into())
            })
        );
        assert_eq!(
            "mqtt://a,b".parse::<SinkSpec>().map(|s| s.to_string()),
            Ok("mqtt://a:1883,mqtt://b:1883".to_owned())
        );
        for bad in [
            "nats://h:notaport",
            "nats://h:0",
            "nats://h:65536",
            "redis://",
            "nats://a,",
            "nats://a,:5",
            "redis://a,nats://b",
            "nats://[::1",
            "amqp://u@",
        ] {
            assert!(bad.parse::<SinkSpec>().is_err(), "{bad}");
        }
        assert!(matches!(
            "redis://a,amqp://b".parse::<SinkSpec>(),
            Err(SinkParseError::Mixed(_))
        ));
        let shown = "amqp://u:hunter2@a/%2f,b"
            .parse::<SinkSpec>()
            .unwrap()
            .to_string();
        assert!(
            !shown.contains("hunter2") && shown.contains("b:5672"),
            "{shown}"
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
