//! Dead letters: recording a message the bus refused, with when the bridge
//! tries it again, and publishing those that are due.

use super::deliver::deliver;
use super::read::{outbox_message, UnixMicros};
use super::{EgressConfig, Failure, State};
use crate::db::Db;
use crate::message::{Envelope, Message};
use crate::metrics::Metrics;
use crate::retry::{self, DbFailure, Driver};
use std::time::SystemTime;

/// Records a message its bus refused in `envelopes.dead_letters`, with when the
/// bridge will try it again (none once `attempts` reached `--dead-letter-after`),
/// logs and counts it.
pub(super) async fn set_aside(
    config: &EgressConfig,
    db: &Db,
    message: &Message,
    code: &str,
    reason: &str,
    attempts: u32,
    metrics: &Metrics,
) -> Result<(), Failure> {
    let id = message.dedup_id();
    let again = (attempts < config.dead_letter_after)
        .then(|| SystemTime::now() + retry::refusal_delay(attempts));
    record_dead_letter(db, &config.name, message, code, reason, again)
        .await
        .map_err(|e| Failure::Database(e, format!("recording dead letter {id}")))?;
    metrics.refused(message.kind());
    match again {
        Some(_) => tracing::warn!(id = %id, code = %code, reason = %reason, attempts,
                                  limit = config.dead_letter_after,
                                  "the bus refuses a message: set aside in envelopes.dead_letters \
                                   while the rows after it go on; trying it again shortly"),
        None => {
            metrics.dead_lettered(message.kind());
            tracing::error!(id = %id, code = %code, reason = %reason, attempts,
                            "the bus refuses a message for good: it stays in envelopes.dead_letters \
                             until envelopes.retry_dead_letters() asks for it again");
        }
    }
    Ok(())
}

pub(super) async fn record_dead_letter(
    db: &Db,
    consumer: &str,
    message: &Message,
    code: &str,
    reason: &str,
    next_attempt: Option<SystemTime>,
) -> Result<(), DbFailure> {
    let (kind, node, seq, outbox): (&str, Option<i32>, Option<i64>, Option<i64>) = match message {
        Message::Envelope(e) => (
            "envelope",
            Some(e.originator_node_id),
            Some(e.originator_sequence_id),
            None,
        ),
        Message::Outbox(o) => ("outbox", None, None, Some(o.id)),
    };
    db.client
        .execute(
            "SELECT envelopes.consumer_dead_letter($1, $2, $3, $4, $5, $6, $7, 1, NULL, $8)",
            &[
                &consumer,
                &kind,
                &node,
                &seq,
                &outbox,
                &reason,
                &code,
                &next_attempt,
            ],
        )
        .await?;
    Ok(())
}

/// Publishes the dead letters that are due again (the bridge's own schedule, or
/// an operator's `retry_dead_letters()`); those the bus now takes are resolved,
/// those it still refuses are recorded again (with the attempt added, and the
/// next one scheduled while attempts remain). Rows that no longer exist are
/// resolved.
pub(super) async fn retry_dead_letters(
    config: &EgressConfig,
    db: &Db,
    state: &mut State,
    driver: &mut Driver,
) -> Result<usize, Failure> {
    let rows = db
        .client
        .query(
            "SELECT dead_letter_id, kind, originator_node_id, originator_sequence_id, gateway_time,
                    topic, payer_id, expiry, originator_envelope, outbox_id, subject, payload,
                    headers::text, created_at, attempts, retry_requested
               FROM envelopes.consumer_dead_letter_retries($1, 100)",
            &[&config.name],
        )
        .await
        .map_err(|e| Failure::Database(e.into(), "reading dead letters to retry".into()))?;
    if rows.is_empty() {
        return Ok(0);
    }
    let mut ids = Vec::new();
    let mut gone = Vec::new();
    let mut batch = Vec::new();
    let mut prior = Vec::new();
    let mut requested = false;
    for row in rows {
        requested |= row.get::<_, bool>(15);
        let id: i64 = row.get(0);
        let attempts = u32::try_from(row.get::<_, i32>(14)).unwrap_or(0);
        let kind: String = row.get(1);
        let message = match kind.as_str() {
            "envelope" => row.get::<_, Option<Vec<u8>>>(8).map(|blob| {
                Message::Envelope(Envelope {
                    originator_node_id: row.get(2),
                    originator_sequence_id: row.get(3),
                    gateway_time_us: row.get::<_, Option<UnixMicros>>(4).map_or(0, |t| t.0),
                    topic: row.get::<_, Option<Vec<u8>>>(5).unwrap_or_default(),
                    payer_id: row.get(6),
                    expiry: row.get(7),
                    originator_envelope: blob,
                })
            }),
            _ => row.get::<_, Option<String>>(10).map(|subject| {
                outbox_message(
                    row.get::<_, Option<i64>>(9).unwrap_or_default(),
                    subject,
                    row.get::<_, Option<Vec<u8>>>(11).unwrap_or_default(),
                    row.get::<_, Option<String>>(12).unwrap_or_default(),
                    row.get::<_, Option<UnixMicros>>(13).map_or(0, |t| t.0),
                    config.outbox_scope.as_deref(),
                )
            }),
        };
        match message {
            Some(m) => {
                ids.push(id);
                batch.push(m);
                prior.push(attempts);
            }
            None => gone.push(id),
        }
    }
    let dead = if batch.is_empty() {
        Vec::new()
    } else {
        // Asked for by an operator (who may have changed the bus: a server
        // restarted with a larger max_payload, a broker reconfigured): a fresh
        // connection learns the bus's limits anew, since what the sink found out
        // when it refused these rows may be out of date. The bridge's own quick
        // retries go through the sink as it is.
        if requested {
            state.sink = None;
        }
        deliver(config, db, state, &batch, &prior, false, driver)
            .await?
            .0
    };
    let resolved: Vec<i64> = ids
        .iter()
        .enumerate()
        .filter(|(i, _)| !dead.contains(i))
        .map(|(_, id)| *id)
        .chain(gone)
        .collect();
    db.client
        .execute(
            "SELECT envelopes.consumer_dead_letter_resolved($1, $2)",
            &[&config.name, &resolved],
        )
        .await
        .map_err(|e| Failure::Database(e.into(), "resolving dead letters".into()))?;
    if !resolved.is_empty() {
        tracing::info!(rows = resolved.len(), "dead letters delivered on retry");
    }
    Ok(batch.len() - dead.len())
}
