//! Where egress publishes: stdout, a JSONL file, NATS JetStream, Redis Streams,
//! MQTT, RabbitMQ (AMQP 0-9-1) or an HTTP webhook. `publish` returns only once the bus has acknowledged every message of the
//! batch, so the caller may then move its cursor. It fails in one of two ways:
//! the bus is unavailable (nothing of the batch counts; publish it again, dedup
//! ids make the replays harmless), or the bus refuses one message of the batch
//! for a reason of its own that retrying will not change — larger than the
//! server's maximum, a subject it does not take — in which case the messages
//! before it were acknowledged and the caller decides what to do with it (after
//! bounded attempts, set it aside as a dead letter: see `egress.rs`).

mod amqp;
mod file;
mod mqtt;
mod nats;
mod redis;
mod webhook;

pub use webhook::WebhookFormat;

use crate::message::Message;
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

/// How messages are encoded on the byte-oriented buses (NATS, Redis, MQTT,
/// RabbitMQ).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum PayloadFormat {
    /// CBOR through serde (the default; what ingress reads).
    Cbor,
    /// The JSON object the JSONL sink writes (with `"id"`, bytes in hex), for
    /// people and tools that read text.
    Json,
}

impl PayloadFormat {
    pub fn encode(self, message: &Message) -> Vec<u8> {
        match self {
            PayloadFormat::Cbor => message.to_cbor(),
            PayloadFormat::Json => message.to_json_line().into_bytes(),
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            PayloadFormat::Cbor => "application/cbor",
            PayloadFormat::Json => "application/json",
        }
    }
}

/// Settings shared by the bus sinks.
#[derive(Clone, Debug)]
pub struct SinkOptions {
    /// JetStream stream (created if missing) and MQTT/NATS subject prefix.
    pub nats_stream: String,
    /// Replicas of the stream when the bridge creates it (a clustered server).
    pub nats_replicas: usize,
    pub subject_prefix: String,
    pub redis_stream: String,
    pub nats_auth: crate::nats::NatsAuth,
    pub mqtt_client_id: String,
    /// The AMQP exchange (declared as a durable topic exchange if missing).
    pub amqp_exchange: String,
    pub webhook_format: WebhookFormat,
    /// The HMAC-SHA256 key of the webhook's signature header, if any.
    pub webhook_secret: Option<String>,
    pub webhook_timeout: std::time::Duration,
    /// Encoding of the messages on the byte-oriented buses.
    pub format: PayloadFormat,
}

/// A failed publish.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    /// The bus could not be reached or did not acknowledge in time: publish the
    /// whole batch again, not before `retry_after` if the bus named a time. When
    /// `permanent`, the bus said the request itself is wrong (an HTTP 4xx): it is
    /// retried at the longest backoff until someone fixes it.
    #[error("{sink}: {message}")]
    Unavailable {
        sink: &'static str,
        message: String,
        retry_after: Option<std::time::Duration>,
        permanent: bool,
    },
    /// The bus refuses message `index` of the batch, and would again: the
    /// messages before it were acknowledged.
    #[error("{sink} refuses message {index} of the batch ({code}): {reason}")]
    Refused {
        sink: &'static str,
        index: usize,
        /// A short code for the refusal (the bus's own where it has one).
        code: String,
        reason: String,
    },
    /// The bus refuses the bridge itself: its credentials, its virtual host, its
    /// URL. Before the bridge ever worked this ends it (exit 78); afterwards it
    /// is retried at the longest backoff.
    #[error("{sink}: {message}")]
    Config { sink: &'static str, message: String },
    /// The bus refuses the batch as a whole as too large (an HTTP 413), without
    /// saying which message: nothing of it counts. The caller publishes it again
    /// in halves, down to single messages; a single message refused this way is
    /// refused for good.
    #[error("{sink} refuses the batch as too large ({code}): {reason}")]
    TooLarge {
        sink: &'static str,
        code: String,
        reason: String,
    },
}

impl SinkError {
    pub fn new(sink: &'static str, message: impl ToString) -> SinkError {
        SinkError::Unavailable {
            sink,
            message: message.to_string(),
            retry_after: None,
            permanent: false,
        }
    }

    /// Unavailable, and asking not to be tried again before `retry_after`.
    pub fn unavailable_for(
        sink: &'static str,
        message: impl ToString,
        retry_after: Option<std::time::Duration>,
    ) -> SinkError {
        SinkError::Unavailable {
            sink,
            message: message.to_string(),
            retry_after,
            permanent: false,
        }
    }

    /// The bus refuses the request as such, and will until someone changes it.
    pub fn permanent(sink: &'static str, message: impl ToString) -> SinkError {
        SinkError::Unavailable {
            sink,
            message: message.to_string(),
            retry_after: None,
            permanent: true,
        }
    }

    pub fn too_large(sink: &'static str, code: impl ToString, reason: impl ToString) -> SinkError {
        SinkError::TooLarge {
            sink,
            code: code.to_string(),
            reason: reason.to_string(),
        }
    }

    pub fn refused(
        sink: &'static str,
        index: usize,
        code: impl ToString,
        reason: impl ToString,
    ) -> SinkError {
        SinkError::Refused {
            sink,
            index,
            code: code.to_string(),
            reason: reason.to_string(),
        }
    }
}

pub enum Sink {
    Stdout(file::Stdout),
    Jsonl(file::Jsonl),
    Nats(nats::Nats),
    Redis(redis::Redis),
    Mqtt(mqtt::Mqtt),
    Amqp(amqp::Amqp),
    Webhook(webhook::Webhook),
}

impl Sink {
    pub async fn connect(spec: &SinkSpec, options: &SinkOptions) -> Result<Sink, SinkError> {
        Ok(match spec {
            SinkSpec::Stdout => Sink::Stdout(file::Stdout::new()),
            SinkSpec::Jsonl(path) => Sink::Jsonl(file::Jsonl::open(path).await?),
            SinkSpec::Nats(url) => Sink::Nats(nats::Nats::connect(url, options).await?),
            SinkSpec::Redis(url) => Sink::Redis(redis::Redis::connect(url, options).await?),
            SinkSpec::Mqtt {
                host,
                port,
                username,
                password,
            } => Sink::Mqtt(
                mqtt::Mqtt::connect(host, *port, username.clone(), password.clone(), options)
                    .await?,
            ),
            SinkSpec::Amqp(url) => Sink::Amqp(amqp::Amqp::connect(url, options).await?),
            SinkSpec::Webhook(url) => Sink::Webhook(webhook::Webhook::new(
                url,
                options.webhook_format,
                options.webhook_secret.as_deref(),
                options.webhook_timeout,
            )?),
        })
    }

    /// Publishes the batch and returns once every message is acknowledged.
    pub async fn publish(&mut self, batch: &[Message]) -> Result<(), SinkError> {
        match self {
            Sink::Stdout(s) => s.publish(batch).await,
            Sink::Jsonl(s) => s.publish(batch).await,
            Sink::Nats(s) => s.publish(batch).await,
            Sink::Redis(s) => s.publish(batch).await,
            Sink::Mqtt(s) => s.publish(batch).await,
            Sink::Amqp(s) => s.publish(batch).await,
            Sink::Webhook(s) => s.publish(batch).await,
        }
    }
}

/// The bus subject of a message: `{prefix}.envelope.{node}` or
/// `{prefix}.outbox.{subject}`, with `sep` between parts.
pub fn subject(prefix: &str, sep: char, message: &Message) -> String {
    match message {
        Message::Envelope(e) => format!("{prefix}{sep}envelope{sep}{}", e.originator_node_id),
        Message::Outbox(o) => format!("{prefix}{sep}outbox{sep}{}", o.subject),
    }
}

/// Why a NATS server would refuse this subject in a publish: an empty token, a
/// wildcard, whitespace (the extension refuses such outbox subjects since 0.3.0;
/// older rows may still have them).
pub fn nats_subject_problem(subject: &str) -> Option<&'static str> {
    for token in subject.split('.') {
        if token.is_empty() {
            return Some("empty token");
        }
        if token.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Some("whitespace or control character");
        }
        if token == "*" || token == ">" || token.contains(['*', '>']) {
            return Some("wildcard");
        }
    }
    None
}

/// Why an MQTT broker would refuse this topic in a publish: a wildcard or NUL.
pub fn mqtt_topic_problem(topic: &str) -> Option<&'static str> {
    if topic.contains(['+', '#']) {
        return Some("wildcard");
    }
    if topic.contains('\0') {
        return Some("NUL character");
    }
    None
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
    fn subjects_the_buses_refuse_are_named() {
        assert_eq!(
            nats_subject_problem("envelopes.outbox.orders.created"),
            None
        );
        assert_eq!(
            nats_subject_problem("envelopes.outbox.a..b"),
            Some("empty token")
        );
        assert_eq!(
            nats_subject_problem("envelopes.outbox.a.*"),
            Some("wildcard")
        );
        assert_eq!(
            nats_subject_problem("envelopes.outbox.a b"),
            Some("whitespace or control character")
        );
        assert_eq!(mqtt_topic_problem("envelopes/outbox/a.b"), None);
        assert_eq!(mqtt_topic_problem("envelopes/outbox/a/+"), Some("wildcard"));
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
