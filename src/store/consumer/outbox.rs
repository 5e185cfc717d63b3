//! Outbox batches of a consumer.

use super::state::{with_consumer, Access, Known};
use super::{drawn_rows, Budget, ConsumerError};
use crate::store::feed::markers::Drawn;
use crate::store::feed::Sample;
use pgrx::datum::{JsonB, TimestampWithTimeZone};

/// One outbox row as a batch returns it.
pub type OutboxRow = (i64, String, Vec<u8>, JsonB, TimestampWithTimeZone);

/// The next outbox rows `consumer` has not acknowledged, within `budget` (see
/// `consumer_outbox_batch`).
pub fn outbox_batch(consumer: &str, mut budget: Budget) -> Result<Vec<OutboxRow>, ConsumerError> {
    let sample = Sample::take()?;
    with_consumer(consumer, Access::Act, |known| {
        let last = sample.last_drawn(Drawn::Outbox);
        if Known::drawn_is_clean(known.outbox_clean, last, known.outbox_id) {
            return Ok(Vec::new());
        }
        let gate = sample.open(&[]);
        let ceiling = gate.drawn_ceiling(Drawn::Outbox);
        let mut out = Vec::new();
        let mut reached = known.outbox_id;
        let complete = drawn_rows(c"outbox", known.outbox_id, ceiling, gate.rows(), |scan| {
            let missing = ConsumerError::Feed("outbox");
            let col = |name| scan.attno(name).ok_or(ConsumerError::Feed("outbox"));
            let (id, subject, payload, headers, created_at) = (
                col("id")?,
                col("subject")?,
                col("payload")?,
                col("headers")?,
                col("created_at")?,
            );
            let payload: Vec<u8> = scan.get(payload).ok_or(missing)?;
            let subject: String = scan.get(subject).ok_or(ConsumerError::Feed("outbox"))?;
            if !budget.take(payload.len() + subject.len()) {
                return Ok(false);
            }
            let id: i64 = scan.get(id).ok_or(ConsumerError::Feed("outbox"))?;
            reached = id;
            out.push((
                id,
                subject,
                payload,
                scan.get(headers).ok_or(ConsumerError::Feed("outbox"))?,
                scan.get(created_at).ok_or(ConsumerError::Feed("outbox"))?,
            ));
            Ok(true)
        })?;
        known.outbox_clean = (complete && ceiling == last).then_some((last, reached));
        Ok(out)
    })
}
