//! How messages are encoded on the byte-oriented buses: CBOR, or the JSON
//! objects the JSONL sink writes.

use crate::message::Message;

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
