//! The consumer functions' SQL entry points: their arguments checked, the
//! batches, pending counts, acknowledgements and registration of
//! [`crate::store::consumer`].

use crate::error::OrRaise;
use crate::store::consumer::{envelopes, outbox, register, Budget, ConsumerError};
use pgrx::datum::{JsonB, TimestampWithTimeZone};
use pgrx::prelude::*;
use std::collections::HashMap;

/// The consumer's name and the batch's budget, checked.
fn check_batch_args(
    consumer: Option<&str>,
    batch_size: Option<i32>,
    batch_bytes: Option<i64>,
) -> Result<(&str, Budget), ConsumerError> {
    let consumer = consumer.ok_or(ConsumerError::Null("consumer"))?;
    let size = match batch_size {
        None => return Err(ConsumerError::Null("batch_size")),
        Some(n) if n <= 0 => return Err(ConsumerError::BadBatchSize(n)),
        Some(n) => n,
    };
    if let Some(b) = batch_bytes.filter(|&b| b <= 0) {
        return Err(ConsumerError::BadBatchBytes(b));
    }
    Ok((consumer, Budget::new(size, batch_bytes)))
}

/// The next envelopes `consumer` has not acknowledged: first the late arrivals
/// recorded after its late-feed position (`late_id` set), then per originator the
/// envelopes after its vector clock, in order. Every committed envelope comes in
/// some batch (see the README's delivery contract). At most `batch_size` rows, and
/// when `batch_bytes` is given at most that many bytes of topics and envelopes
/// (but always at least one row). Acknowledge with `consumer_envelope_ack`.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(pg_catalog, pg_temp)]
#[allow(clippy::type_complexity)]
fn consumer_envelope_batch(
    consumer: Option<&str>,
    batch_size: default!(Option<i32>, "1000"),
    batch_bytes: default!(Option<i64>, "NULL"),
) -> TableIterator<
    'static,
    (
        name!(originator_node_id, i32),
        name!(originator_sequence_id, i64),
        name!(gateway_time, TimestampWithTimeZone),
        name!(topic, Vec<u8>),
        name!(payer_id, Option<i32>),
        name!(expiry, Option<i64>),
        name!(originator_envelope, Vec<u8>),
        name!(late_id, Option<i64>),
    ),
> {
    let rows = check_batch_args(consumer, batch_size, batch_bytes)
        .and_then(|(consumer, budget)| envelopes::envelope_batch(consumer, budget))
        .or_raise();
    TableIterator::new(rows.into_iter().map(|(r, late_id)| {
        (
            r.node,
            r.seq,
            r.gateway_time,
            r.topic,
            r.payer_id,
            r.expiry,
            r.envelope,
            late_id,
        )
    }))
}

/// How many envelopes `consumer` has not acknowledged yet among those it can read
/// now, and the oldest one's time (for `consumer_status`).
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(pg_catalog, pg_temp)]
fn consumer_envelopes_pending(
    consumer: Option<&str>,
) -> TableIterator<
    'static,
    (
        name!(pending, i64),
        name!(oldest, Option<TimestampWithTimeZone>),
    ),
> {
    TableIterator::once(
        consumer
            .ok_or(ConsumerError::Null("consumer"))
            .and_then(envelopes::envelopes_pending)
            .or_raise(),
    )
}

/// The next outbox rows `consumer` has not acknowledged, in id order, never past
/// an id that a running transaction may still commit. Acknowledge the last one
/// with `consumer_outbox_ack`.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(pg_catalog, pg_temp)]
#[allow(clippy::type_complexity)]
fn consumer_outbox_batch(
    consumer: Option<&str>,
    batch_size: default!(Option<i32>, "1000"),
    batch_bytes: default!(Option<i64>, "NULL"),
) -> TableIterator<
    'static,
    (
        name!(id, i64),
        name!(subject, String),
        name!(payload, Vec<u8>),
        name!(headers, JsonB),
        name!(created_at, TimestampWithTimeZone),
    ),
> {
    TableIterator::new(
        check_batch_args(consumer, batch_size, batch_bytes)
            .and_then(|(consumer, budget)| outbox::outbox_batch(consumer, budget))
            .or_raise(),
    )
}

/// The acknowledgement's arguments, checked: the consumer, and per originator
/// the highest sequence id acknowledged.
fn ack_args<'a>(
    consumer: Option<&'a str>,
    nodes: Option<Array<'_, i32>>,
    seqs: Option<Array<'_, i64>>,
) -> Result<(&'a str, HashMap<i32, i64>), ConsumerError> {
    let consumer = consumer.ok_or(ConsumerError::Null("consumer"))?;
    let (Some(nodes), Some(seqs)) = (nodes, seqs) else {
        return Err(ConsumerError::Null("originator_node_ids and sequence_ids"));
    };
    if nodes.len() != seqs.len() {
        return Err(ConsumerError::AckLength {
            nodes: nodes.len(),
            seqs: seqs.len(),
        });
    }
    let mut targets: HashMap<i32, i64> = HashMap::new();
    for (node, seq) in nodes.iter().zip(seqs.iter()) {
        let (Some(node), Some(seq)) = (node, seq) else {
            return Err(ConsumerError::Null("an element of the cursor arrays"));
        };
        let top = targets.entry(node).or_insert(seq);
        *top = (*top).max(seq);
    }
    Ok((consumer, targets))
}

/// Moves `consumer`'s positions forward after a batch was delivered: per
/// originator the vector clock to the highest sequence id delivered from the
/// in-order part of its batches, and the late-feed position to the highest
/// `late_id` delivered. Never backwards (a replayed acknowledgement is a no-op);
/// logs the batch in `envelopes.delivery_log`; returns the envelopes acknowledged.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(pg_catalog, pg_temp)]
fn consumer_envelope_ack(
    consumer: Option<&str>,
    originator_node_ids: Option<Array<'_, i32>>,
    sequence_ids: Option<Array<'_, i64>>,
    late_id: default!(Option<i64>, "NULL"),
) -> i64 {
    ack_args(consumer, originator_node_ids, sequence_ids)
        .and_then(|(consumer, targets)| envelopes::envelope_ack(consumer, targets, late_id))
        .or_raise()
}

/// Creates a consumer (idempotent: an existing one keeps its positions). It starts
/// at the beginning of every feed, or, with `from_start => false`, at their
/// current end — where rows that transactions still running will commit are ahead
/// of it, not behind.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(pg_catalog, pg_temp)]
fn consumer_register(name: Option<&str>, from_start: default!(Option<bool>, "true")) {
    (|| {
        let name = name.ok_or(ConsumerError::Null("name"))?;
        if name.is_empty() {
            return Err(ConsumerError::EmptyName);
        }
        let from_start = from_start.ok_or(ConsumerError::Null("from_start"))?;
        register::register(name, from_start)
    })()
    .or_raise()
}
