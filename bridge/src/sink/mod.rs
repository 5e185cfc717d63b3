//! The sinks egress publishes to — stdout, a JSONL file, NATS JetStream, Redis
//! Streams, MQTT, RabbitMQ (AMQP 0-9-1), an HTTP webhook — and the one place
//! that picks the sink its options name, connects it and hands it each batch.
//!
//! Each sink owns its options (a clap group flattened into `egress`, see
//! [`SinkArgs`]) and its connect. `publish` returns only once the bus has
//! acknowledged every message of the batch, so the caller may then move its
//! cursor. It fails in one of two ways: the bus is unavailable (nothing of the
//! batch counts; publish it again, dedup ids make the replays harmless), or the
//! bus refuses one message of the batch for a reason of its own that retrying
//! will not change — larger than the server's maximum, a subject it does not
//! take — in which case the messages before it were acknowledged and the caller
//! decides what to do with it (after bounded attempts, set it aside as a dead
//! letter: see `egress/deliver.rs`). [`SinkError`] says which.

mod amqp;
mod error;
mod file;
mod memory;
mod mqtt;
mod nats;
mod redis;
mod spec;
mod subject;
mod webhook;
mod wire;

pub use error::SinkError;
pub use spec::SinkSpec;

use crate::message::Message;
use crate::metrics::Metrics;
use crate::nats::NatsAuthArgs;
use clap::Args;
use std::sync::Arc;

/// The sink egress publishes to and its options, flattened into `egress`: the
/// sink itself, what every bus sink shares ([`wire::Wire`]) and each sink's own
/// group of options, which only that sink reads.
#[derive(Args)]
#[command(next_help_heading = "Sink")]
pub struct SinkArgs {
    /// Where to publish: stdout (JSON lines), jsonl:PATH, nats://HOST[:PORT]
    /// (JetStream), redis://HOST[:PORT] (Redis Streams, XADD), mqtt://HOST[:PORT]
    /// (MQTT 5, QoS 1), amqp://USER:PASS@HOST[:PORT]/VHOST (RabbitMQ) or an
    /// http(s):// URL (a webhook); a left-out port is the scheme's usual one, and
    /// a bus sink takes several servers comma-separated. Credentials may be
    /// embedded (mqtt://user:pass@host, redis://:pass@host) and are never logged.
    #[arg(
        long,
        env = "ENVELOPES_SINK",
        default_value = "stdout",
        hide_env_values = true
    )]
    pub sink: SinkSpec,
    #[command(flatten)]
    pub wire: wire::Wire,
    #[command(flatten)]
    pub nats: nats::NatsSinkArgs,
    #[command(flatten)]
    pub nats_auth: NatsAuthArgs,
    #[command(flatten)]
    pub redis: redis::RedisArgs,
    #[command(flatten)]
    pub mqtt: mqtt::MqttArgs,
    #[command(flatten)]
    pub amqp: amqp::AmqpArgs,
    #[command(flatten)]
    pub webhook: webhook::WebhookArgs,
}

/// A connected sink, one variant per kind.
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
    /// Connects the sink `args` names, with that sink's own options, for the
    /// consumer `consumer` (the MQTT client id's default); a sink whose bus can
    /// block the bridge reports it in `metrics`.
    pub async fn connect(
        args: &SinkArgs,
        consumer: &str,
        metrics: &Arc<Metrics>,
    ) -> Result<Sink, SinkError> {
        let wire = &args.wire;
        Ok(match &args.sink {
            SinkSpec::Stdout => Sink::Stdout(file::Stdout::new()),
            SinkSpec::Jsonl(path) => Sink::Jsonl(file::Jsonl::open(path).await?),
            SinkSpec::Nats(url) => Sink::Nats(
                nats::Nats::connect(url, &args.nats, &args.nats_auth.auth(), wire).await?,
            ),
            SinkSpec::Redis(urls) => Sink::Redis(
                first_that_answers(urls, |url| redis::Redis::connect(url, &args.redis, wire))
                    .await?,
            ),
            SinkSpec::Mqtt {
                servers,
                username,
                password,
            } => Sink::Mqtt(
                first_that_answers(servers, |(host, port)| {
                    mqtt::Mqtt::connect(
                        host,
                        *port,
                        username.clone(),
                        password.clone(),
                        args.mqtt.client_id(consumer),
                        wire,
                    )
                })
                .await?,
            ),
            SinkSpec::Amqp(urls) => Sink::Amqp(
                first_that_answers(urls, |url| {
                    amqp::Amqp::connect(url, &args.amqp, wire, metrics.clone())
                })
                .await?,
            ),
            SinkSpec::Webhook(url) => Sink::Webhook(webhook::Webhook::new(url, &args.webhook)?),
        })
    }

    /// Whether the bus still answers, asked without sending a row: NATS (a
    /// PING round trip), Redis (PING), RabbitMQ (the connection's state, kept
    /// by heartbeats), MQTT (the connection's state, kept by keep-alives; a
    /// broken one is made anew), a webhook (a TCP connection to the receiver,
    /// no request); stdout and a file report no failure here and are checked
    /// by their next write.
    pub async fn check(&mut self) -> Result<(), SinkError> {
        match self {
            Sink::Nats(s) => s.check().await,
            Sink::Redis(s) => s.check().await,
            Sink::Amqp(s) => s.check(),
            Sink::Mqtt(s) => s.check().await,
            Sink::Webhook(s) => s.check().await,
            Sink::Stdout(_) | Sink::Jsonl(_) => Ok(()),
        }
    }

    /// The largest message the bus takes and the name of that limit, where it
    /// is below `wanted` bytes (what the store may hand the sink): NATS'
    /// `max_payload`, Redis' `proto-max-bulk-len` and the MQTT broker's maximum
    /// packet size as they said when connecting; RabbitMQ's `max_message_size`
    /// as it names it refusing a probe of `wanted` bytes (it announces none).
    /// `None` where the bus takes messages that large, or does not say.
    pub async fn max_message_bytes(&mut self, wanted: u64) -> Option<(u64, &'static str)> {
        let known = match self {
            Sink::Nats(s) => Some((s.max_payload(), "the NATS server's max_payload")),
            Sink::Redis(s) => Some((s.max_bulk(), "Redis' proto-max-bulk-len")),
            Sink::Mqtt(s) => s
                .max_packet_size()
                .map(|max| (max, "the MQTT broker's maximum packet size")),
            Sink::Amqp(s) => {
                let size = usize::try_from(wanted).ok()?;
                s.probe_max_message_size(size)
                    .await
                    .map(|max| (max, "RabbitMQ's max_message_size"))
            }
            _ => None,
        };
        known.filter(|(max, _)| *max < wanted)
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

/// Connects to the first of several servers that accepts the bridge, in the
/// order given (as RabbitMQ's and Paho's address lists do); the error of the
/// last one otherwise, or a refused configuration if any server refused the
/// bridge itself (waiting does not cure that).
async fn first_that_answers<'a, S, T, F, Fut>(
    servers: &'a [S],
    mut connect: F,
) -> Result<T, SinkError>
where
    F: FnMut(&'a S) -> Fut,
    Fut: std::future::Future<Output = Result<T, SinkError>>,
{
    let mut refused = None;
    let mut last = None;
    for server in servers {
        match connect(server).await {
            Ok(sink) => return Ok(sink),
            Err(e @ SinkError::Config { .. }) => {
                if servers.len() > 1 {
                    tracing::warn!(error = %e, "a server of the sink refuses the bridge; trying the next");
                }
                refused.get_or_insert(e);
            }
            Err(e) => {
                if servers.len() > 1 {
                    tracing::warn!(error = %e, "a server of the sink does not answer; trying the next");
                }
                last = Some(e);
            }
        }
    }
    Err(refused
        .or(last)
        .unwrap_or_else(|| SinkError::new("sink", "no server given")))
}
