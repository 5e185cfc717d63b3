//! Redis Streams: one XADD per message into one stream, with the dedup id in the
//! `id` field (Redis keeps no dedup state: consumers drop repeated ids). The batch
//! goes as one pipeline; the replies are Redis' acknowledgements.

use super::{SinkError, SinkOptions};
use crate::message::Message;

pub struct Redis {
    connection: redis::aio::MultiplexedConnection,
    stream: String,
}

impl Redis {
    pub async fn connect(url: &str, options: &SinkOptions) -> Result<Redis, SinkError> {
        let client = redis::Client::open(url).map_err(|e| SinkError::new("redis", e))?;
        let connection = client
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| SinkError::new("redis", e))?;
        Ok(Redis {
            connection,
            stream: options.redis_stream.clone(),
        })
    }

    pub async fn publish(&mut self, batch: &[Message]) -> Result<(), SinkError> {
        let mut pipe = redis::pipe();
        for message in batch {
            let kind = message.kind();
            pipe.cmd("XADD")
                .arg(&self.stream)
                .arg("*")
                .arg("id")
                .arg(message.dedup_id())
                .arg("kind")
                .arg(kind)
                .arg("body")
                .arg(message.to_cbor());
        }
        let ids: Vec<String> = pipe
            .query_async(&mut self.connection)
            .await
            .map_err(|e| SinkError::new("redis", e))?;
        if ids.len() == batch.len() {
            Ok(())
        } else {
            Err(SinkError::new(
                "redis",
                format!("{} of {} messages acknowledged", ids.len(), batch.len()),
            ))
        }
    }
}
