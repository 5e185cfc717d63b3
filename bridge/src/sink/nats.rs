//! NATS JetStream: each message is published with its dedup id as `Nats-Msg-Id`,
//! and the batch counts as delivered when JetStream has acknowledged every one
//! (a duplicate within the stream's duplicate window is acknowledged as such and
//! stored once). The stream is created if missing, capturing `{prefix}.>`.

use super::{subject, SinkError, SinkOptions};
use crate::message::Message;
use async_nats::jetstream::{self, message::PublishMessage};
use std::time::Duration;

/// How the bridge authenticates to NATS.
#[derive(Clone, Default)]
pub enum NatsAuth {
    #[default]
    None,
    UserPassword(String, String),
    Token(String),
    CredsFile(std::path::PathBuf),
}

impl std::fmt::Debug for NatsAuth {
    /// Names the method, never the secret.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NatsAuth::None => write!(f, "none"),
            NatsAuth::UserPassword(user, _) => write!(f, "user {user}"),
            NatsAuth::Token(_) => write!(f, "token"),
            NatsAuth::CredsFile(path) => write!(f, "creds file {}", path.display()),
        }
    }
}

pub struct Nats {
    jetstream: jetstream::Context,
    prefix: String,
}

/// Connects with the given authentication, shared by egress and ingress.
pub async fn connect_client(url: &str, auth: &NatsAuth) -> Result<async_nats::Client, SinkError> {
    let mut options = async_nats::ConnectOptions::new()
        .connection_timeout(Duration::from_secs(5))
        .request_timeout(Some(Duration::from_secs(10)));
    options = match auth {
        NatsAuth::None => options,
        NatsAuth::UserPassword(user, password) => {
            options.user_and_password(user.clone(), password.clone())
        }
        NatsAuth::Token(token) => options.token(token.clone()),
        NatsAuth::CredsFile(path) => options
            .credentials_file(path)
            .await
            .map_err(|e| SinkError::new("nats", e))?,
    };
    options
        .connect(url)
        .await
        .map_err(|e| SinkError::new("nats", e))
}

impl Nats {
    pub async fn connect(url: &str, options: &SinkOptions) -> Result<Nats, SinkError> {
        let client = connect_client(url, &options.nats_auth).await?;
        let jetstream = jetstream::new(client);
        jetstream
            .get_or_create_stream(jetstream::stream::Config {
                name: options.nats_stream.clone(),
                subjects: vec![format!("{}.>", options.subject_prefix)],
                ..Default::default()
            })
            .await
            .map_err(|e| SinkError::new("nats", format!("stream {}: {e}", options.nats_stream)))?;
        Ok(Nats {
            jetstream,
            prefix: options.subject_prefix.clone(),
        })
    }

    pub async fn publish(&mut self, batch: &[Message]) -> Result<(), SinkError> {
        // Send the whole batch, then wait for every acknowledgement.
        let mut pending = Vec::with_capacity(batch.len());
        for message in batch {
            let ack = self
                .jetstream
                .send_publish(
                    subject(&self.prefix, '.', message),
                    PublishMessage::build()
                        .payload(message.to_cbor().into())
                        .message_id(message.dedup_id()),
                )
                .await
                .map_err(|e| SinkError::new("nats", format!("{}: {e}", message.dedup_id())))?;
            pending.push((message.dedup_id(), ack));
        }
        for (id, ack) in pending {
            ack.await
                .map_err(|e| SinkError::new("nats", format!("{id}: {e}")))?;
        }
        Ok(())
    }
}
