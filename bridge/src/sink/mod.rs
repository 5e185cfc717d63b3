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
mod error;
mod file;
mod format;
mod mqtt;
mod nats;
mod redis;
mod spec;
mod subject;
mod webhook;

pub use error::SinkError;
pub use format::PayloadFormat;
pub use spec::SinkSpec;
pub use webhook::WebhookFormat;

use crate::message::Message;

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
