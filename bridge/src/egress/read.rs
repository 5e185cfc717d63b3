//! Reading the feeds: one batch of the outbox and one of the envelopes after
//! the consumer's positions, each row with the position its acknowledgement
//! moves.

use super::EgressConfig;
use crate::db::Db;
use crate::message::{Envelope, Message, OutboxMessage};
use crate::retry::DbFailure;

/// A row as read, with the position to acknowledge once it is delivered.
pub(super) enum Position {
    Outbox(i64),
    /// In-order envelope: advances the originator's cursor.
    InOrder(i32, i64),
    /// From the late feed: advances the late-feed position.
    Late(i64),
}

/// Microseconds since the Unix epoch of a `timestamptz`, read in binary so that
/// no value can make the read fail (±infinity saturate).
pub(super) struct UnixMicros(pub(super) i64);

impl<'a> tokio_postgres::types::FromSql<'a> for UnixMicros {
    fn from_sql(
        _: &tokio_postgres::types::Type,
        raw: &'a [u8],
    ) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        let bytes: [u8; 8] = raw.try_into()?;
        // Postgres counts from 2000-01-01.
        const POSTGRES_EPOCH_US: i64 = 946_684_800_000_000;
        Ok(UnixMicros(
            i64::from_be_bytes(bytes).saturating_add(POSTGRES_EPOCH_US),
        ))
    }

    fn accepts(ty: &tokio_postgres::types::Type) -> bool {
        *ty == tokio_postgres::types::Type::TIMESTAMPTZ
    }
}

pub(super) async fn read_outbox(
    db: &Db,
    config: &EgressConfig,
) -> Result<(Vec<Message>, Vec<Position>), DbFailure> {
    let rows = db
        .client
        .query(
            "SELECT id, subject, payload, headers::text, created_at
               FROM envelopes.consumer_outbox_batch($1, $2, $3)",
            &[&config.name, &config.batch_size, &config.batch_bytes],
        )
        .await?;
    let mut out = Vec::with_capacity(rows.len());
    let mut positions = Vec::with_capacity(rows.len());
    for row in rows {
        let id: i64 = row.get(0);
        positions.push(Position::Outbox(id));
        out.push(outbox_message(
            id,
            row.get(1),
            row.get(2),
            row.get(3),
            row.get::<_, UnixMicros>(4).0,
            config.outbox_scope.as_deref(),
        ));
    }
    Ok((out, positions))
}

pub(super) fn outbox_message(
    id: i64,
    subject: String,
    payload: Vec<u8>,
    headers: String,
    created_at_us: i64,
    scope: Option<&str>,
) -> Message {
    Message::Outbox(OutboxMessage {
        id,
        subject,
        payload,
        headers: serde_json::from_str(&headers).unwrap_or(serde_json::Value::Null),
        created_at_us,
        scope: scope.map(str::to_owned),
    })
}

pub(super) async fn read_envelopes(
    db: &Db,
    config: &EgressConfig,
) -> Result<(Vec<Message>, Vec<Position>), DbFailure> {
    let rows = db
        .client
        .query(
            "SELECT originator_node_id, originator_sequence_id, gateway_time,
                    topic, payer_id, expiry, originator_envelope, late_id
               FROM envelopes.consumer_envelope_batch($1, $2, $3)",
            &[&config.name, &config.batch_size, &config.batch_bytes],
        )
        .await?;
    let mut out = Vec::with_capacity(rows.len());
    let mut positions = Vec::with_capacity(rows.len());
    for row in rows {
        let (node, seq): (i32, i64) = (row.get(0), row.get(1));
        positions.push(match row.get::<_, Option<i64>>(7) {
            Some(late) => Position::Late(late),
            None => Position::InOrder(node, seq),
        });
        out.push(Message::Envelope(Envelope {
            originator_node_id: node,
            originator_sequence_id: seq,
            gateway_time_us: row.get::<_, UnixMicros>(2).0,
            topic: row.get(3),
            payer_id: row.get(4),
            expiry: row.get(5),
            originator_envelope: row.get(6),
        }));
    }
    Ok((out, positions))
}
