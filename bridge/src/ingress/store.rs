//! Storing a batch: one transaction for the envelopes and the stream position
//! (split into smaller insert calls when one call would need more new
//! partitions than it may create), the bisection that finds the envelopes the
//! database refuses for good, and the dead-letter subject they go to.

use super::IngressConfig;
use crate::crash;
use crate::db;
use crate::message::Envelope;
use crate::retry::{Class, DbFailure};
use async_nats::jetstream;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// SQLSTATE of a call that would create more partitions than
/// `envelopes.max_new_partitions_per_call` allows.
const TOO_MANY_NEW_PARTITIONS: &str = "54000";

fn too_many_partitions(e: &DbFailure) -> bool {
    e.sqlstate.as_deref() == Some(TOO_MANY_NEW_PARTITIONS)
}

/// Whether the database refuses the rows themselves (for good), so that finding
/// and setting aside the refused ones lets the rest through.
pub(super) fn refuses_rows(e: &DbFailure) -> bool {
    e.class == Class::Permanent || too_many_partitions(e)
}

/// One transaction: the envelopes and the position. The envelopes go in one
/// insert call, or, when one call would need more new partitions than it may
/// create, in as many smaller calls as it takes (the part refused is halved
/// until it passes). A single envelope refused that way fails the store.
pub(super) async fn store(
    db: &mut db::Db,
    config: &IngressConfig,
    envelopes: &[Envelope],
    position: i64,
    identity: &str,
) -> Result<i64, DbFailure> {
    let mut parts: Vec<std::ops::Range<usize>> = Vec::new();
    parts.push(0..envelopes.len());
    'attempt: loop {
        let tx = db.client.transaction().await?;
        let mut stored = 0;
        for (i, part) in parts.iter().enumerate() {
            match insert(&tx, &envelopes[part.clone()]).await {
                Ok(n) => stored += n,
                Err(e) if too_many_partitions(&e) && part.len() > 1 => {
                    drop(tx);
                    let (from, to) = (part.start, part.end);
                    let mid = from + (to - from) / 2;
                    parts.splice(i..=i, [from..mid, mid..to]);
                    tracing::info!(
                        rows = to - from,
                        parts = parts.len(),
                        "the batch needs more new partitions than one call may create; \
                                    inserting it in smaller calls"
                    );
                    continue 'attempt;
                }
                Err(e) => return Err(e),
            }
        }
        crash::reached("before_commit");
        tx.execute(
            "SELECT envelopes.ingress_store_position($1, $2, $3, $4)",
            &[&config.name, &config.stream, &position, &identity],
        )
        .await?;
        tx.commit().await?;
        return Ok(stored);
    }
}

/// Finds the envelopes the database refuses, by bisection: each half is inserted
/// in a transaction that is rolled back, and a half that fails for good is split
/// again. A transient error ends the search (the batch is retried as a whole).
pub(super) async fn refused_by_database(
    db: &mut db::Db,
    envelopes: &[Envelope],
) -> Result<Vec<(usize, DbFailure)>, DbFailure> {
    let mut refused = Vec::new();
    let mut ranges = vec![(0, envelopes.len())];
    while let Some((from, to)) = ranges.pop() {
        let tx = db.client.transaction().await?;
        let result = insert(&tx, &envelopes[from..to]).await;
        tx.rollback().await?;
        match result {
            Ok(_) => {}
            Err(e) if refuses_rows(&e) => {
                if to - from == 1 {
                    refused.push((from, e));
                } else {
                    let mid = from + (to - from) / 2;
                    ranges.push((mid, to));
                    ranges.push((from, mid));
                }
            }
            Err(e) => return Err(e),
        }
    }
    refused.sort_by_key(|(i, _)| *i);
    Ok(refused)
}

/// Inserts envelopes with the extension's batch function; returns the new ones.
async fn insert(
    tx: &tokio_postgres::Transaction<'_>,
    envelopes: &[Envelope],
) -> Result<i64, DbFailure> {
    let mut stored = 0;
    if !envelopes.is_empty() {
        let nodes: Vec<i32> = envelopes.iter().map(|e| e.originator_node_id).collect();
        let seqs: Vec<i64> = envelopes.iter().map(|e| e.originator_sequence_id).collect();
        let topics: Vec<&[u8]> = envelopes.iter().map(|e| &e.topic[..]).collect();
        let blobs: Vec<&[u8]> = envelopes
            .iter()
            .map(|e| &e.originator_envelope[..])
            .collect();
        let payers: Vec<Option<i32>> = envelopes.iter().map(|e| e.payer_id).collect();
        let times: Vec<SystemTime> = envelopes
            .iter()
            .map(|e| UNIX_EPOCH + Duration::from_micros(e.gateway_time_us.max(0) as u64))
            .collect();
        let expiries: Vec<Option<i64>> = envelopes.iter().map(|e| e.expiry).collect();
        stored = tx
            .query_one(
                "SELECT envelopes.insert_gateway_envelopes($1, $2, $3, $4, $5, $6, $7)",
                &[&nodes, &seqs, &topics, &blobs, &payers, &times, &expiries],
            )
            .await?
            .get(0);
    }
    Ok(stored)
}

/// Publishes a message that cannot be stored to the dead-letter subject, with why
/// (and the SQLSTATE when the database refused it) and where it came from, and
/// waits until the server has it.
pub(super) async fn dead_letter(
    client: &async_nats::Client,
    subject: &str,
    message: &jetstream::Message,
    sequence: u64,
    reason: &str,
    sqlstate: Option<&str>,
) -> Result<(), async_nats::Error> {
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Envelopes-Error", reason);
    if let Some(code) = sqlstate {
        headers.insert("Envelopes-Sqlstate", code);
    }
    headers.insert("Envelopes-Source-Subject", message.subject.as_str());
    headers.insert("Envelopes-Source-Sequence", sequence.to_string().as_str());
    client
        .publish_with_headers(subject.to_owned(), headers, message.payload.clone())
        .await?;
    client.flush().await?;
    Ok(())
}
