//! `envelopes-bridge watch`: follows what egress publishes on NATS or RabbitMQ
//! and prints each message as a JSON line (the JSONL sink's form), for the two
//! buses whose own command-line tools are not at hand everywhere (the `nats`
//! CLI is not in Debian; `rabbitmqadmin` needs the management plugin). Redis and
//! MQTT have theirs (`redis-cli XREAD`, `mosquitto_sub`), best with egress'
//! `--format json`.
//!
//! NATS: a plain subscription to `PREFIX.>` (what is published from now on).
//! RabbitMQ: a private queue bound to the exchange for `PREFIX.#`, deleted when
//! the watch ends. `--count N` ends after N messages.

use crate::cli::WatchArgs;
use crate::message::Message;
use futures_util::StreamExt;

/// A bus message as one JSON line: CBOR decoded (and shown with its id), JSON
/// as it is.
fn line(payload: &[u8]) -> String {
    match Message::from_cbor(payload) {
        Ok(message) => message.to_json_line(),
        Err(_) => String::from_utf8_lossy(payload).trim_end().to_owned(),
    }
}

/// Why a watch ended early.
pub struct WatchError {
    pub message: String,
    /// The bus refuses the watch's configuration (its credentials, its virtual
    /// host), and what to fix: exit 78, as for egress and ingress.
    pub fix: Option<&'static str>,
}

impl From<String> for WatchError {
    fn from(message: String) -> WatchError {
        WatchError { message, fix: None }
    }
}

/// A failed AMQP connect: a refused login (403) or virtual host (530) is the
/// configuration's.
fn amqp_error(e: lapin::Error) -> WatchError {
    let fix = match e.kind() {
        lapin::ErrorKind::ProtocolError(amqp) if matches!(amqp.get_id(), 403 | 530) => Some(
            "check the user, password and virtual host in the URL: \
             amqp://user:pass@host:port/%2f is the default vhost \"/\"",
        ),
        _ => None,
    };
    let message = match e.kind() {
        lapin::ErrorKind::ProtocolError(amqp) => amqp.get_message().as_str().to_owned(),
        _ => e.to_string(),
    };
    WatchError { message, fix }
}

pub async fn run(args: WatchArgs) -> Result<(), WatchError> {
    let mut seen = 0u64;
    let mut print = |payload: &[u8]| -> bool {
        seen += 1;
        crate::logging::out(line(payload)) && args.count.is_none_or(|n| seen < n)
    };
    if args.url.starts_with("nats://") || args.url.starts_with("tls://") {
        let client = crate::nats::connect(&args.url, &args.nats_auth.auth())
            .await
            .map_err(|e| WatchError {
                fix: e.refused.then_some(
                    "check the NATS credentials (--nats-user/--nats-password, --nats-token, \
                     --nats-creds)",
                ),
                message: e.message,
            })?;
        let mut sub = client
            .subscribe(format!("{}.>", args.subject_prefix))
            .await
            .map_err(|e| e.to_string())?;
        client.flush().await.map_err(|e| e.to_string())?;
        crate::logging::err(format!("watching {}.> ...", args.subject_prefix));
        while let Some(message) = sub.next().await {
            if !print(&message.payload) {
                break;
            }
        }
        Ok(())
    } else if args.url.starts_with("amqp://") || args.url.starts_with("amqps://") {
        amqp(&args, &mut print).await.map_err(amqp_error)
    } else {
        Err(WatchError::from(format!(
            "{}: watch follows NATS (nats://) and RabbitMQ (amqp://); for Redis use \
             `redis-cli XREAD BLOCK 0 STREAMS KEY $`, for MQTT `mosquitto_sub -V mqttv5 -t \
             'PREFIX/#'`",
            crate::redact::url(&args.url)
        )))
    }
}

async fn amqp(args: &WatchArgs, print: &mut dyn FnMut(&[u8]) -> bool) -> Result<(), lapin::Error> {
    use lapin::options::*;
    use lapin::types::FieldTable;
    let connection =
        lapin::Connection::connect(&args.url, lapin::ConnectionProperties::default()).await?;
    let channel = connection.create_channel().await?;
    channel
        .exchange_declare(
            args.amqp_exchange.as_str().into(),
            lapin::ExchangeKind::Topic,
            ExchangeDeclareOptions {
                durable: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await?;
    let queue = channel
        .queue_declare(
            "".into(),
            QueueDeclareOptions {
                exclusive: true,
                auto_delete: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await?;
    channel
        .queue_bind(
            queue.name().as_str().into(),
            args.amqp_exchange.as_str().into(),
            format!("{}.#", args.subject_prefix).as_str().into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let mut consumer = channel
        .basic_consume(
            queue.name().as_str().into(),
            "envelopes-bridge-watch".into(),
            BasicConsumeOptions {
                no_ack: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await?;
    crate::logging::err(format!(
        "watching exchange {} for {}.# ...",
        args.amqp_exchange, args.subject_prefix
    ));
    while let Some(Ok(delivery)) = consumer.next().await {
        if !print(&delivery.data) {
            break;
        }
    }
    let _ = connection.close(200, "watch ended".into()).await;
    Ok(())
}
