//! The read functions' rows into their result set: envelope rows straight from
//! the scans, or owned, and `(originator, sequence id)` pairs.

use crate::pg::srf::Materialized;
use crate::store::partition::PartitionError;
use crate::store::read::{missing, At, EnvelopeRow, Flow};
use pgrx::datum::TimestampWithTimeZone;
use pgrx::pg_sys::Datum;
use pgrx::IntoDatum;

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
        let time = at.meta.value(cols.gateway_time).ok_or_else(missing)?;
        let topic = at.meta.flat_value(cols.topic).ok_or_else(missing)?;
        let payer = at.meta.value(cols.payer_id);
        let expiry = at.meta.value(cols.expiry);
        let envelope = at.envelope.ok_or_else(missing)?;
        let mut values = [
            Datum::from(at.node),
            Datum::from(at.seq),
            time,
            topic,
            payer.unwrap_or_else(Datum::null),
            expiry.unwrap_or_else(Datum::null),
            envelope,
        ];
        let mut nulls = [
            false,
            false,
            false,
            false,
            payer.is_none(),
            expiry.is_none(),
            false,
        ];
        // SAFETY: the datums are the columns' own (int4, int8, timestamptz, flat
        // bytea, int4, int8, flat bytea), valid while the walk stands on the row.
        unsafe { self.put(&mut values, &mut nulls) };
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
        // SAFETY: the seven columns' types, built as datums of those types
        // (into_datum copies the bytes into a flat varlena).
        unsafe {
            self.put_built(|| {
                (
                    [
                        Datum::from(node),
                        Datum::from(seq),
                        time.into_datum().unwrap_or_else(Datum::null),
                        topic.into_datum().unwrap_or_else(Datum::null),
                        payer.map(Datum::from).unwrap_or_else(Datum::null),
                        expiry.map(Datum::from).unwrap_or_else(Datum::null),
                        envelope.into_datum().unwrap_or_else(Datum::null),
                    ],
                    [
                        false,
                        false,
                        false,
                        false,
                        payer.is_none(),
                        expiry.is_none(),
                        false,
                    ],
                )
            })
        };
    }
}
