//! Redis Streams: one XADD per message into one stream, with the dedup id in the
//! `id` field (Redis keeps no dedup state: consumers drop repeated ids). The batch
//! goes as one pipeline; a message counts as acknowledged when its XADD answered
//! with the new entry's id.
//!
//! Refused for good:
//! - a message whose body is over the server's `proto-max-bulk-len` (read with
//!   `CONFIG GET` when connecting; Redis' default of 512 MiB where the server does
//!   not answer it). Redis would answer such an argument with a protocol error and
//!   close the connection, after running the commands before it; the bridge
//!   sends the batch only up to that message instead;
//! - a message whose XADD gets an error reply of its own (anything but the
//!   replies that say the server or the key is not usable now, see
//!   [`classify`]). Each command of the pipeline is answered on its own, so the
//!   messages after a refused one were stored too and are published again: a
//!   consumer sees them twice, under the same ids.

use super::error::SinkError;
use super::wire::{PayloadFormat, Wire};
use crate::message::Message;
use clap::Args;

const SINK: &str = "redis";

/// The Redis sink's own options.
#[derive(Args)]
#[command(next_help_heading = "Redis sink")]
pub struct RedisArgs {
    /// Redis stream key.
    #[arg(long, env = "ENVELOPES_REDIS_STREAM", default_value = "envelopes")]
    pub redis_stream: String,
}

/// A failed connection: the server refusing the bridge's credentials (a wrong
/// password or ACL user, a password it wants and the URL lacks) is the bridge's
/// configuration (exit 78 before it ever worked); anything else an outage.
fn connect_error(e: redis::RedisError) -> SinkError {
    if e.kind() == redis::ErrorKind::AuthenticationFailed
        || matches!(e.code(), Some("NOAUTH" | "WRONGPASS" | "NOPERM"))
    {
        return SinkError::Config {
            sink: SINK,
            message: format!(
                "{} (check the user and password in the URL: redis://USER:PASSWORD@HOST or \
                 redis://:PASSWORD@HOST)",
                in_words(&e)
            ),
        };
    }
    SinkError::new(SINK, in_words(&e))
}

/// A Redis error as the operator reads it: the redis crate's text names the
/// error's kind in Rust Debug form (`Password authentication failed -
/// AuthenticationFailed`), which says nothing more.
fn in_words(e: &redis::RedisError) -> String {
    e.to_string().replace(&format!(" - {:?}", e.kind()), "")
}

/// Redis' own default for `proto-max-bulk-len`.
const DEFAULT_MAX_BULK: usize = 512 * 1024 * 1024;

pub struct Redis {
    connection: redis::aio::MultiplexedConnection,
    stream: String,
    format: PayloadFormat,
    /// The largest bulk argument the server takes.
    max_bulk: usize,
}

/// What an error reply of one XADD means.
#[derive(Debug, PartialEq, Eq)]
pub enum Reply {
    /// The server cannot take writes now (loading, busy, out of memory, a
    /// failover): publish the batch again later.
    Unavailable,
    /// The stream key or the bridge's user cannot be written at all (ACL, auth,
    /// the key holds another type): the same for every message until someone
    /// fixes it.
    Misconfigured,
    /// This message is refused.
    Refused,
}

/// Sorts an error reply by its code (the reply's first word).
pub fn classify(code: &str) -> Reply {
    match code {
        "LOADING" | "BUSY" | "TRYAGAIN" | "CLUSTERDOWN" | "MASTERDOWN" | "READONLY" | "OOM"
        | "NOREPLICAS" | "MISCONF" | "MOVED" | "ASK" => Reply::Unavailable,
        "NOPERM" | "NOAUTH" | "WRONGPASS" | "WRONGTYPE" => Reply::Misconfigured,
        _ => Reply::Refused,
    }
}

impl Redis {
    /// The server's `proto-max-bulk-len` (or Redis' default when it would not say).
    pub fn max_bulk(&self) -> u64 {
        self.max_bulk as u64
    }

    /// Whether the server still answers (PING, at most 5 s).
    pub async fn check(&mut self) -> Result<(), SinkError> {
        let command = redis::cmd("PING");
        let ping = command.query_async::<String>(&mut self.connection);
        match tokio::time::timeout(std::time::Duration::from_secs(5), ping).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(connect_error(e)),
            Err(_) => Err(SinkError::new(
                SINK,
                "the server did not answer PING within 5 s",
            )),
        }
    }
    pub async fn connect(url: &str, args: &RedisArgs, wire: &Wire) -> Result<Redis, SinkError> {
        let client = redis::Client::open(url).map_err(|e| SinkError::new(SINK, in_words(&e)))?;
        let mut connection = client
            .get_multiplexed_async_connection()
            .await
            .map_err(connect_error)?;
        // A server that wants a password the URL does not give answers the
        // first command, not the connection.
        redis::cmd("PING")
            .query_async::<String>(&mut connection)
            .await
            .map_err(connect_error)?;
        // Best effort: managed services and least-privilege ACL users are often
        // refused CONFIG; say so, since a row over the real limit then breaks the
        // connection instead of being set aside.
        let max_bulk = match redis::cmd("CONFIG")
            .arg("GET")
            .arg("proto-max-bulk-len")
            .query_async::<Vec<String>>(&mut connection)
            .await
        {
            Ok(reply) => match reply.get(1).and_then(|v| v.parse::<usize>().ok()) {
                Some(limit) => limit,
                None => {
                    tracing::warn!(reply = %reply.join(" "), default = DEFAULT_MAX_BULK,
                                   "CONFIG GET proto-max-bulk-len gave no limit; assuming Redis' default");
                    DEFAULT_MAX_BULK
                }
            },
            Err(e) => {
                tracing::warn!(error = %e, default = DEFAULT_MAX_BULK,
                               "CONFIG GET proto-max-bulk-len refused; assuming Redis' default (a \
                                message over the server's real limit will break the connection \
                                and be retried instead of set aside)");
                DEFAULT_MAX_BULK
            }
        };
        Ok(Redis {
            connection,
            stream: args.redis_stream.clone(),
            format: wire.format,
            max_bulk,
        })
    }

    pub async fn publish(&mut self, batch: &[Message]) -> Result<(), SinkError> {
        // Send only up to the first message the server would drop the connection
        // for (encoding no further); report it after the ones before it are stored.
        let mut bodies: Vec<Vec<u8>> = Vec::with_capacity(batch.len());
        let mut oversized = None;
        for message in batch {
            let body = self.format.encode(message);
            if body.len() > self.max_bulk {
                oversized = Some((bodies.len(), body.len()));
                break;
            }
            bodies.push(body);
        }
        let sent = bodies.len();
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        for (message, body) in batch[..sent].iter().zip(&bodies) {
            pipe.cmd("XADD")
                .arg(&self.stream)
                .arg("*")
                .arg("id")
                .arg(message.dedup_id())
                .arg("kind")
                .arg(message.kind())
                .arg("body")
                .arg(body);
        }
        if sent > 0 {
            let replies: Vec<redis::RedisResult<String>> = pipe
                .query_async(&mut self.connection)
                .await
                .map_err(|e| SinkError::new(SINK, in_words(&e)))?;
            if replies.len() != sent {
                return Err(SinkError::new(
                    SINK,
                    format!("{} replies for {sent} messages", replies.len()),
                ));
            }
            for (index, reply) in replies.into_iter().enumerate() {
                let Err(error) = reply else { continue };
                let code = error.code().unwrap_or("ERR").to_owned();
                let id = batch[index].dedup_id();
                let text = format!("{id}: {error}");
                return Err(match classify(&code) {
                    Reply::Unavailable => SinkError::new(SINK, text),
                    Reply::Misconfigured => SinkError::permanent(SINK, text),
                    Reply::Refused => SinkError::refused(SINK, index, code, text),
                });
            }
        }
        match oversized {
            None => Ok(()),
            Some((index, size)) => Err(SinkError::refused(
                SINK,
                index,
                "PROTO_MAX_BULK_LEN",
                format!(
                    "{}: {size} bytes, over the server's proto-max-bulk-len of {}",
                    batch[index].dedup_id(),
                    self.max_bulk
                ),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_replies_are_sorted_by_code() {
        assert_eq!(classify("OOM"), Reply::Unavailable);
        assert_eq!(classify("LOADING"), Reply::Unavailable);
        assert_eq!(classify("NOPERM"), Reply::Misconfigured);
        assert_eq!(classify("WRONGTYPE"), Reply::Misconfigured);
        assert_eq!(classify("ERR"), Reply::Refused);
    }
}
