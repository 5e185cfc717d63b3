//! How a bus sink puts a message on the wire: the options every byte-oriented
//! bus (NATS, Redis, MQTT, RabbitMQ) shares — the subject prefix and the
//! encoding — and the encodings themselves (CBOR, or the JSON objects the JSONL
//! sink writes).

use crate::message::Message;
use clap::Args;

/// What every bus sink takes from egress' options: where its subjects start
/// and how it encodes messages.
#[derive(Args, Clone, Debug)]
pub struct Wire {
    /// Encoding of the messages on NATS, Redis, MQTT and RabbitMQ: CBOR, or the
    /// JSON objects the JSONL sink writes (readable with the buses' own tools).
    #[arg(long, env = "ENVELOPES_FORMAT", value_enum, default_value = "cbor")]
    pub format: PayloadFormat,
    /// Subject prefix: envelopes go to PREFIX.envelope.NODE, outbox rows to
    /// PREFIX.outbox.SUBJECT (MQTT: PREFIX/envelope/NODE ...; AMQP routing keys
    /// as the NATS subjects).
    #[arg(long, env = "ENVELOPES_SUBJECT_PREFIX", default_value = "envelopes")]
    pub subject_prefix: String,
}

impl Wire {
    /// The message's subject under the prefix, parts separated by `sep`.
    pub fn subject(&self, sep: char, message: &Message) -> String {
        super::subject::subject(&self.subject_prefix, sep, message)
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
