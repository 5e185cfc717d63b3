//! What travels on the buses: one message per envelope or outbox row, CBOR-encoded
//! through serde, each with a dedup id. JSON is only for people (stdout/JSONL).

use serde::{Deserialize, Serialize};

/// An envelope row as published (and, on ingress, as consumed).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    pub originator_node_id: i32,
    pub originator_sequence_id: i64,
    /// `gateway_time` as microseconds since the Unix epoch.
    pub gateway_time_us: i64,
    #[serde(with = "serde_bytes")]
    pub topic: Vec<u8>,
    pub payer_id: Option<i32>,
    /// Unix seconds after which the envelope may be pruned.
    pub expiry: Option<i64>,
    #[serde(with = "serde_bytes")]
    pub originator_envelope: Vec<u8>,
}

/// An outbox row as published.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct OutboxMessage {
    pub id: i64,
    pub subject: String,
    #[serde(with = "serde_bytes")]
    pub payload: Vec<u8>,
    pub headers: serde_json::Value,
    /// `created_at` as microseconds since the Unix epoch.
    pub created_at_us: i64,
    /// The bridge's `--outbox-scope`: outbox ids are per database, so bridges of
    /// several databases (shards) publishing into one stream set a scope each
    /// and their dedup ids stay apart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
}

/// One message on the bus.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Message {
    Envelope(Envelope),
    Outbox(OutboxMessage),
}

/// The lowest sequence id the extension stores (its `FIRST_SEQUENCE_ID`): a
/// cursor with no entry for an originator stands just below it.
pub const FIRST_SEQUENCE_ID: i64 = 1;

/// Why bytes from a bus are not a message we accept.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("not valid CBOR for a message: {0}")]
    Cbor(String),
    #[error("originator_node_id must not be negative (got {0})")]
    NegativeNode(i32),
    #[error("originator_sequence_id must be at least {FIRST_SEQUENCE_ID} (got {0})")]
    SequenceBelowFirst(i64),
    #[error("expected an envelope, got an outbox message")]
    NotAnEnvelope,
    #[error("not a JSON envelope as egress writes it (--format json): {0}")]
    Json(String),
}

/// A CBOR decoding error in words (ciborium's own Display is its Debug text,
/// which would reach the Envelopes-Error header and the log as Rust syntax).
fn cbor_error<T>(error: ciborium::de::Error<T>) -> String {
    use ciborium::de::Error;
    match error {
        Error::Io(_) => "it ends too early".into(),
        Error::Syntax(offset) => format!("malformed at byte {offset}"),
        Error::Semantic(Some(offset), why) => format!("{why} (at byte {offset})"),
        Error::Semantic(None, why) => why,
        Error::RecursionLimitExceeded => "nested too deeply".into(),
    }
}

impl Message {
    /// `"envelope"` or `"outbox"`.
    pub fn kind(&self) -> &'static str {
        match self {
            Message::Envelope(_) => "envelope",
            Message::Outbox(_) => "outbox",
        }
    }

    /// The id a bus or consumer uses to drop replays: `"{node}:{seq}"` for an
    /// envelope, `"outbox:{id}"` for an outbox row (`"outbox:{scope}:{id}"` with
    /// a scope).
    pub fn dedup_id(&self) -> String {
        match self {
            Message::Envelope(e) => {
                format!("{}:{}", e.originator_node_id, e.originator_sequence_id)
            }
            Message::Outbox(o) => match &o.scope {
                Some(scope) => format!("outbox:{scope}:{}", o.id),
                None => format!("outbox:{}", o.id),
            },
        }
    }

    pub fn to_cbor(&self) -> Vec<u8> {
        let mut out = Vec::new();
        // Writing into a Vec cannot fail, and every field serializes.
        ciborium::into_writer(self, &mut out).expect("serializing a message into memory");
        out
    }

    pub fn from_cbor(bytes: &[u8]) -> Result<Message, DecodeError> {
        ciborium::from_reader(bytes).map_err(|e| DecodeError::Cbor(cbor_error(e)))
    }

    /// One JSON object for a line of stdout/JSONL output, with the dedup id as
    /// `"id"` and bytes in hex.
    pub fn to_json_line(&self) -> String {
        self.to_json_value().to_string()
    }

    /// The JSON object of [`Message::to_json_line`] (also the webhook's elements).
    pub fn to_json_value(&self) -> serde_json::Value {
        match self {
            Message::Envelope(e) => serde_json::json!({
                "id": self.dedup_id(),
                "kind": "envelope",
                "originator_node_id": e.originator_node_id,
                "originator_sequence_id": e.originator_sequence_id,
                "gateway_time_us": e.gateway_time_us,
                "topic": hex::encode(&e.topic),
                "payer_id": e.payer_id,
                "expiry": e.expiry,
                "originator_envelope": hex::encode(&e.originator_envelope),
            }),
            Message::Outbox(o) => serde_json::json!({
                "id": self.dedup_id(),
                "kind": "outbox",
                "outbox_id": o.id,
                "subject": o.subject,
                "payload": hex::encode(&o.payload),
                "headers": o.headers,
                "created_at_us": o.created_at_us,
            }),
        }
    }
}

impl Envelope {
    /// Decodes an envelope message from a bus and checks what the database would
    /// reject anyway, so a bad message is dead-lettered with a reason instead of
    /// failing a whole batch.
    pub fn from_bus(bytes: &[u8]) -> Result<Envelope, DecodeError> {
        // A CBOR map never starts with '{' (0x7b is a text string's head of 27
        // bytes), a JSON object always does.
        let message = if bytes.first() == Some(&b'{') {
            Envelope::from_json(bytes).map(Message::Envelope)?
        } else {
            Message::from_cbor(bytes)?
        };
        match message {
            Message::Envelope(e) if e.originator_node_id < 0 => {
                Err(DecodeError::NegativeNode(e.originator_node_id))
            }
            Message::Envelope(e) if e.originator_sequence_id < FIRST_SEQUENCE_ID => {
                Err(DecodeError::SequenceBelowFirst(e.originator_sequence_id))
            }
            Message::Envelope(e) => Ok(e),
            Message::Outbox(_) => Err(DecodeError::NotAnEnvelope),
        }
    }
}

/// An envelope as the JSON sinks and `--format json` write it (bytes in hex).
#[derive(Deserialize)]
struct JsonEnvelope {
    kind: String,
    originator_node_id: i32,
    originator_sequence_id: i64,
    gateway_time_us: i64,
    topic: String,
    payer_id: Option<i32>,
    expiry: Option<i64>,
    originator_envelope: String,
}

impl Envelope {
    fn from_json(bytes: &[u8]) -> Result<Envelope, DecodeError> {
        let j: JsonEnvelope =
            serde_json::from_slice(bytes).map_err(|e| DecodeError::Json(e.to_string()))?;
        if j.kind != "envelope" {
            return Err(DecodeError::NotAnEnvelope);
        }
        let hex = |field: &str, text: &str| {
            hex::decode(text).map_err(|e| DecodeError::Json(format!("{field}: {e}")))
        };
        Ok(Envelope {
            originator_node_id: j.originator_node_id,
            originator_sequence_id: j.originator_sequence_id,
            gateway_time_us: j.gateway_time_us,
            topic: hex("topic", &j.topic)?,
            payer_id: j.payer_id,
            expiry: j.expiry,
            originator_envelope: hex("originator_envelope", &j.originator_envelope)?,
        })
    }
}

/// A message with its dedup id beside its fields: the webhook's CBOR elements.
#[derive(Serialize)]
pub struct WithId<'a> {
    pub id: String,
    #[serde(flatten)]
    pub message: &'a Message,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn envelope() -> Message {
        Message::Envelope(Envelope {
            originator_node_id: 7,
            originator_sequence_id: 42,
            gateway_time_us: 1_700_000_000_000_000,
            topic: vec![1, 2],
            payer_id: None,
            expiry: Some(99),
            originator_envelope: vec![0xde, 0xad],
        })
    }

    #[test]
    fn scoped_outbox_ids_stay_apart() {
        let outbox = |scope: Option<&str>| {
            Message::Outbox(OutboxMessage {
                id: 3,
                subject: "s".into(),
                payload: vec![],
                headers: serde_json::Value::Null,
                created_at_us: 0,
                scope: scope.map(str::to_owned),
            })
        };
        assert_eq!(outbox(None).dedup_id(), "outbox:3");
        assert_eq!(outbox(Some("shard1")).dedup_id(), "outbox:shard1:3");
        assert_ne!(
            outbox(Some("shard1")).dedup_id(),
            outbox(Some("shard2")).dedup_id()
        );
        let scoped = outbox(Some("shard1"));
        assert_eq!(Message::from_cbor(&scoped.to_cbor()), Ok(scoped));
    }

    #[test]
    fn json_envelopes_decode_as_cbor_ones_do() {
        let m = envelope();
        let Message::Envelope(e) = &m else {
            unreachable!()
        };
        assert_eq!(
            Envelope::from_bus(m.to_json_line().as_bytes()).as_ref(),
            Ok(e)
        );
        assert!(matches!(
            Envelope::from_bus(b"{\"kind\": \"envelope\"}"),
            Err(DecodeError::Json(_))
        ));
    }

    #[test]
    fn webhook_cbor_elements_carry_the_id() {
        let m = envelope();
        let mut out = Vec::new();
        ciborium::into_writer(
            &WithId {
                id: m.dedup_id(),
                message: &m,
            },
            &mut out,
        )
        .unwrap();
        let value: ciborium::Value = ciborium::from_reader(&out[..]).unwrap();
        let map = value.as_map().unwrap();
        let get = |k: &str| {
            map.iter()
                .find(|(key, _)| key.as_text() == Some(k))
                .map(|(_, v)| v.clone())
        };
        assert_eq!(
            get("id")
                .and_then(|v| v.as_text().map(str::to_owned))
                .as_deref(),
            Some("7:42")
        );
        assert_eq!(
            get("kind")
                .and_then(|v| v.as_text().map(str::to_owned))
                .as_deref(),
            Some("envelope")
        );
        assert!(get("originator_envelope").is_some());
    }

    #[test]
    fn cbor_round_trip() {
        let m = envelope();
        assert_eq!(Message::from_cbor(&m.to_cbor()), Ok(m.clone()));
        let o = Message::Outbox(OutboxMessage {
            id: 5,
            subject: "orders.created".into(),
            payload: vec![9],
            headers: serde_json::json!({"k": "v"}),
            created_at_us: 1,
            scope: None,
        });
        assert_eq!(Message::from_cbor(&o.to_cbor()), Ok(o));
    }

    #[test]
    fn bytes_are_cbor_byte_strings() {
        // A byte string of length 2 is 0x42 followed by the bytes.
        let bytes = envelope().to_cbor();
        assert!(bytes.windows(3).any(|w| w == [0x42, 0xde, 0xad]));
    }

    #[test]
    fn dedup_ids() {
        assert_eq!(envelope().dedup_id(), "7:42");
    }

    #[test]
    fn json_line_has_the_id() {
        let line = envelope().to_json_line();
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["id"], "7:42");
        assert_eq!(v["originator_envelope"], "dead");
    }

    #[test]
    fn bad_bus_messages_are_errors() {
        assert!(matches!(
            Envelope::from_bus(b"not cbor"),
            Err(DecodeError::Cbor(_))
        ));
        // Words, not Rust's Debug text (the Envelopes-Error header shows it).
        let full = envelope().to_cbor();
        for bad in [&b"not cbor"[..], &full[..full.len() / 2], &[0xff][..]] {
            let text = Message::from_cbor(bad).unwrap_err().to_string();
            assert!(
                !text.contains("Semantic(") && !text.contains("Io(") && !text.contains("Syntax("),
                "{text}"
            );
        }
        assert_eq!(
            Message::from_cbor(&full[..full.len() / 2])
                .unwrap_err()
                .to_string(),
            "not valid CBOR for a message: it ends too early"
        );
        let mut neg = envelope();
        if let Message::Envelope(e) = &mut neg {
            e.originator_sequence_id = -1;
        }
        assert_eq!(
            Envelope::from_bus(&neg.to_cbor()),
            Err(DecodeError::SequenceBelowFirst(-1))
        );
        if let Message::Envelope(e) = &mut neg {
            e.originator_sequence_id = 0;
        }
        assert_eq!(
            Envelope::from_bus(&neg.to_cbor()),
            Err(DecodeError::SequenceBelowFirst(0))
        );
    }
}

/// Generated inputs: the decoder of bytes that arrive from a bus must answer every
/// input with a message or an error, never a panic.
#[cfg(test)]
mod fuzz {
    use super::*;
    use proptest::prelude::*;

    fn envelope() -> impl Strategy<Value = Envelope> {
        (
            any::<i32>(),
            any::<i64>(),
            any::<i64>(),
            proptest::collection::vec(any::<u8>(), 0..64),
            any::<Option<i32>>(),
            any::<Option<i64>>(),
            proptest::collection::vec(any::<u8>(), 0..256),
        )
            .prop_map(|(n, s, t, topic, payer_id, expiry, blob)| Envelope {
                originator_node_id: n,
                originator_sequence_id: s,
                gateway_time_us: t,
                topic,
                payer_id,
                expiry,
                originator_envelope: blob,
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4000))]

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = Message::from_cbor(&bytes);
            let _ = Envelope::from_bus(&bytes);
        }

        #[test]
        fn damaged_messages_never_panic(
            e in envelope(),
            cut in any::<prop::sample::Index>(),
            flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..8),
        ) {
            let mut bytes = Message::Envelope(e).to_cbor();
            for (at, value) in flips {
                let i = at.index(bytes.len());
                bytes[i] ^= value;
            }
            let len = cut.index(bytes.len() + 1);
            let decoded = Envelope::from_bus(&bytes[..len]);
            if let Ok(e) = decoded {
                prop_assert!(e.originator_node_id >= 0 && e.originator_sequence_id >= FIRST_SEQUENCE_ID);
            }
        }

        #[test]
        fn envelopes_round_trip(e in envelope()) {
            let m = Message::Envelope(e.clone());
            prop_assert_eq!(Message::from_cbor(&m.to_cbor()), Ok(m));
            match Envelope::from_bus(&Message::Envelope(e.clone()).to_cbor()) {
                Ok(back) => prop_assert_eq!(back, e),
                Err(DecodeError::NegativeNode(_)) => prop_assert!(e.originator_node_id < 0),
                Err(DecodeError::SequenceBelowFirst(_)) => prop_assert!(e.originator_sequence_id < FIRST_SEQUENCE_ID),
                Err(other) => prop_assert!(false, "unexpected {other}"),
            }
        }
    }
}
