//! NATS JetStream: each message is published with its dedup id as `Nats-Msg-Id`,
//! and the batch counts as delivered when JetStream has acknowledged every one
//! (a duplicate within the stream's duplicate window is acknowledged as such and
//! stored once). The stream is created if missing, capturing `{prefix}.>`.
//!
//! Refused for good: a message larger than the server's `max_payload` (learned
//! from the server when connecting), one the stream refuses as too large
//! (JetStream error 10054), a subject NATS does not take, a subject the bridge's
//! user may not publish to (the server reports the permissions violation only
//! as an asynchronous error, which the sink waits for beside the ack).

use super::error::SinkError;
use super::subject::nats_subject_problem;
use super::wire::Wire;
use crate::message::Message;
use crate::nats::NatsAuth;
use async_nats::jetstream::{self, message::PublishMessage};
use clap::Args;
use std::sync::Arc;

/// The JetStream sink's own options (its authentication is NATS',
/// [`crate::nats::NatsAuthArgs`]).
#[derive(Args)]
#[command(next_help_heading = "NATS JetStream sink")]
pub struct NatsSinkArgs {
    /// JetStream stream egress publishes into (created if missing).
    #[arg(long, env = "ENVELOPES_NATS_STREAM", default_value = "ENVELOPES")]
    pub nats_stream: String,
    /// Replicas of the JetStream stream when egress creates it (3 on a
    /// three-node cluster; an existing stream keeps its own).
    #[arg(long, env = "ENVELOPES_NATS_REPLICAS", default_value_t = 1,
          value_parser = clap::value_parser!(u8).range(1..=5))]
    pub nats_replicas: u8,
}

pub struct Nats {
    client: async_nats::Client,
    jetstream: jetstream::Context,
    wire: Wire,
    violations: Arc<crate::nats::Violations>,
}

/// JetStream's error code for a message over the stream's maximum size.
const STREAM_MESSAGE_EXCEEDS_MAXIMUM: u64 = 10054;

/// Why the stream could not be made or found: the server refusing its
/// configuration (its subjects overlap another stream's, the name is taken with
/// another configuration, replicas the server cannot have, JetStream not
/// enabled for the account) is the bridge's configuration, ended with exit 78
/// before the bridge ever worked; anything else an outage.
fn stream_error(stream: &str, error: jetstream::context::CreateStreamError) -> SinkError {
    use jetstream::context::CreateStreamErrorKind as Kind;
    use jetstream::ErrorCode;
    let config = match error.kind() {
        Kind::JetStream(e) => [
            ErrorCode::STREAM_SUBJECT_OVERLAP,
            ErrorCode::STREAM_NAME_EXIST,
            ErrorCode::STREAM_INVALID_CONFIG,
            ErrorCode::STREAM_REPLICAS_NOT_SUPPORTED,
            ErrorCode::JETSTREAM_NOT_ENABLED,
            ErrorCode::JETSTREAM_NOT_ENABLED_FOR_ACCOUNT,
        ]
        .contains(&e.error_code()),
        Kind::EmptyStreamName | Kind::InvalidStreamName => true,
        _ => false,
    };
    if config {
        SinkError::Config {
            sink: "nats",
            message: format!(
                "stream {stream}: {error} (check --nats-stream, --subject-prefix and \
                 --nats-replicas: the stream captures PREFIX.>, which no other stream may)"
            ),
        }
    } else {
        SinkError::new("nats", format!("stream {stream}: {error}"))
    }
}

impl Nats {
    pub async fn connect(
        url: &str,
        args: &NatsSinkArgs,
        auth: &NatsAuth,
        wire: &Wire,
    ) -> Result<Nats, SinkError> {
        let violations = Arc::new(crate::nats::Violations::default());
        let client = crate::nats::connect_watching(url, auth, Some(violations.clone()))
            .await
            .map_err(|e| {
                if e.refused {
                    SinkError::Config {
                        sink: "nats",
                        message: e.message,
                    }
                } else {
                    SinkError::new("nats", e)
                }
            })?;
        let jetstream = jetstream::new(client.clone());
        jetstream
            .get_or_create_stream(jetstream::stream::Config {
                name: args.nats_stream.clone(),
                subjects: vec![format!("{}.>", wire.subject_prefix)],
                num_replicas: usize::from(args.nats_replicas),
                ..Default::default()
            })
            .await
            .map_err(|e| stream_error(&args.nats_stream, e))?;
        Ok(Nats {
            client,
            jetstream,
            wire: wire.clone(),
            violations,
        })
    }

    /// The server's `max_payload`.
    pub fn max_payload(&self) -> u64 {
        self.client.server_info().max_payload as u64
    }

    /// Whether the server still answers (a PING round trip, at most 5 s): an
    /// idle egress asks it so that readiness means the bus works.
    pub async fn check(&mut self) -> Result<(), SinkError> {
        if self.client.connection_state() != async_nats::connection::State::Connected {
            return Err(SinkError::new(
                "nats",
                format!(
                    "not connected to the server ({})",
                    self.client.connection_state()
                ),
            ));
        }
        match tokio::time::timeout(std::time::Duration::from_secs(5), self.client.flush()).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(SinkError::new(
                "nats",
                format!("the server does not answer: {e}"),
            )),
            Err(_) => Err(SinkError::new(
                "nats",
                "the server did not answer a PING within 5 s",
            )),
        }
    }

    /// Why the server would refuse `message` whatever the retries.
    fn refusal(&self, subject: &str, payload: &[u8], id: &str) -> Option<(String, String)> {
        if let Some(problem) = nats_subject_problem(subject) {
            return Some(("SUBJECT".into(), format!("subject {subject:?}: {problem}")));
        }
        if self.violations.contains(subject) {
            return Some((
                "PERMISSIONS_VIOLATION".into(),
                format!("the server refuses publishes to {subject:?} for this user"),
            ));
        }
        // What the server counts against max_payload: payload and headers.
        let size = payload.len() + id.len() + 64;
        let max = self.client.server_info().max_payload;
        (max > 0 && size > max).then(|| {
            (
                "MAX_PAYLOAD".into(),
                format!("{size} bytes with headers, over the server's max_payload of {max}"),
            )
        })
    }

    pub async fn publish(&mut self, batch: &[Message]) -> Result<(), SinkError> {
        // Send the batch up to the first message the server would refuse, then
        // wait for every acknowledgement; report the refusal after them.
        let mut pending = Vec::with_capacity(batch.len());
        let mut refused = None;
        for (index, message) in batch.iter().enumerate() {
            let subject = self.wire.subject('.', message);
            let payload = self.wire.format.encode(message);
            let id = message.dedup_id();
            if let Some((code, reason)) = self.refusal(&subject, &payload, &id) {
                refused = Some(SinkError::refused(
                    "nats",
                    index,
                    code,
                    format!("{id}: {reason}"),
                ));
                break;
            }
            let ack = self
                .jetstream
                .send_publish(
                    subject.clone(),
                    PublishMessage::build()
                        .payload(payload.into())
                        .message_id(id.as_str()),
                )
                .await
                .map_err(|e| match e.kind() {
                    jetstream::context::PublishErrorKind::MaxPayloadExceeded => {
                        SinkError::refused("nats", index, "MAX_PAYLOAD", format!("{id}: {e}"))
                    }
                    _ => SinkError::new("nats", format!("{id}: {e}")),
                })?;
            pending.push((index, id, subject, ack));
        }
        for (index, id, subject, ack) in pending {
            let acked = tokio::select! {
                acked = ack => acked,
                _ = self.violations.refused(&subject) => {
                    return Err(SinkError::refused(
                        "nats",
                        index,
                        "PERMISSIONS_VIOLATION",
                        format!("{id}: the server refuses publishes to {subject:?} for this user"),
                    ));
                }
            };
            acked.map_err(|e| {
                let code = std::error::Error::source(&e)
                    .and_then(|s| s.downcast_ref::<jetstream::Error>())
                    .map(|je| je.error_code().0);
                match code {
                    Some(STREAM_MESSAGE_EXCEEDS_MAXIMUM) => SinkError::refused(
                        "nats",
                        index,
                        "JS_10054",
                        format!("{id}: the stream refuses the message as too large: {e}"),
                    ),
                    _ => SinkError::new("nats", format!("{id}: {e}")),
                }
            })?;
        }
        refused.map_or(Ok(()), Err)
    }
}
