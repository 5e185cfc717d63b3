//! The read functions' rows into their result set: envelope rows straight from
//! the scans, or owned, and `(originator, sequence id)` pairs.

use crate::pg::srf::{Field, Materialized};
use crate::store::partition::PartitionError;
use crate::store::read::{missing, At, EnvelopeRow, Flow};
use pgrx::datum::TimestampWithTimeZone;

/// One envelope as the read functions return it.
pub type Row = (
    i32,
    i64,
    TimestampWithTimeZone,
    Vec<u8>,
    Option<i32>,
    Option<i64>,
    Vec<u8>,
);

/// The row as the read functions return it.
pub fn as_row(row: EnvelopeRow) -> Row {
    (
        row.node,
        row.seq,
        row.gateway_time,
        row.topic,
        row.payer_id,
        row.expiry,
        row.envelope,
    )
}

/// Envelope rows into a read function's result set (the seven columns of the
/// selectors).
pub trait EnvelopeResults {
    /// Appends the envelope row a walk stands on, straight from the scans' slots
    /// (no copy but the tuplestore's own).
    fn put_at(&mut self, at: &mut At<'_>) -> Result<(), PartitionError>;

    /// Appends the row a walk stands on and tells the walk to stop once the set
    /// holds `limit` rows.
    fn take(&mut self, at: &mut At<'_>, limit: usize) -> Result<Flow, PartitionError>;

    /// Appends an owned envelope row.
    fn put_envelope(&mut self, row: Row);
}

impl EnvelopeResults for Materialized {
    fn put_at(&mut self, at: &mut At<'_>) -> Result<(), PartitionError> {
        let cols = at.cols;
        let time = at.meta.cell(cols.gateway_time).ok_or_else(missing)?;
        let topic = at.meta.cell(cols.topic).ok_or_else(missing)?;
        let envelope = at.envelope.ok_or_else(missing)?;
        self.put_cells([
            Field::Int4(at.node),
            Field::Int8(at.seq),
            Field::Scanned(time),
            Field::Scanned(topic),
            at.meta.cell(cols.payer_id).into(),
            at.meta.cell(cols.expiry).into(),
            Field::Scanned(envelope),
        ]);
        Ok(())
    }

    fn take(&mut self, at: &mut At<'_>, limit: usize) -> Result<Flow, PartitionError> {
        self.put_at(at)?;
        Ok(if self.len >= limit {
            Flow::Stop
        } else {
            Flow::Continue
        })
    }

    fn put_envelope(&mut self, row: Row) {
        let (node, seq, time, topic, payer, expiry, envelope) = row;
        self.put_cells([
            Field::Int4(node),
            Field::Int8(seq),
            Field::TimestampTz(time),
            Field::Bytes(&topic),
            payer.map_or(Field::Null, Field::Int4),
            expiry.map_or(Field::Null, Field::Int8),
            Field::Bytes(&envelope),
        ]);
    }
}
