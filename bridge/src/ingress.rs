//! Ingress: envelopes from a JetStream stream into the store, with the stream
//! position folded into the same transaction.
//!
//! Per pulled batch: malformed messages go to the dead-letter subject (with the
//! reason in a header) first; then ONE transaction inserts the good envelopes
//! through `insert_gateway_envelopes` (idempotent, creating partitions on demand)
//! and stores the batch's last stream sequence as this consumer's position;
//! only after that commit is the batch acknowledged on the bus. A crash before the
//! commit leaves neither rows nor position, and the bus redelivers; a crash after
//! it makes the bus redeliver rows that are already stored, which the idempotent
//! insert ignores. On start the consumer resumes from the stored position — the
//! database, not the bus, is the record of what was stored.

use crate::db;
use crate::message::Envelope;
use crate::metrics::Metrics;
use crate::sink::{nats::connect_client, NatsAuth};
use crate::Backoff;
use async_nats::jetstream::{self, consumer::pull, consumer::AckPolicy, consumer::DeliverPolicy};
use futures_util::StreamExt;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::watch;

pub struct IngressConfig {
    pub database_url: String,
    pub name: String,
    pub source: String,
    pub nats_auth: NatsAuth,
    pub stream: String,
    /// Subject filter within the stream (empty: all).
    pub subject: String,
    pub dead_letter_subject: String,
    pub batch_size: usize,
}

enum Failure {
    Retry(String),
}

pub async fn run(
    config: IngressConfig,
    metrics: Arc<Metrics>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut backoff = Backoff::new();
    while !*shutdown.borrow() {
        match session(&config, &metrics, &mut shutdown, &mut backoff).await {
            Ok(()) => break,
            Err(Failure::Retry(why)) => {
                tracing::warn!(error = %why, "ingress interrupted, reconnecting");
                if backoff.wait(&mut shutdown).await {
                    break;
                }
            }
        }
    }
    tracing::info!("ingress stopped");
}

/// One connected session: runs until shutdown (Ok) or a failure to retry.
async fn session(
    config: &IngressConfig,
    metrics: &Metrics,
    shutdown: &mut watch::Receiver<bool>,
    backoff: &mut Backoff,
) -> Result<(), Failure> {
    let retry = |e: &dyn std::fmt::Display| Failure::Retry(e.to_string());
    let mut db = db::connect(&config.database_url, "envelopes-bridge ingress")
        .await
        .map_err(|e| retry(&e))?;
    let client = connect_client(&config.source, &config.nats_auth)
        .await
        .map_err(|e| retry(&e))?;
    let js = jetstream::new(client.clone());
    let stream = js.get_stream(&config.stream).await.map_err(|e| retry(&e))?;

    // Resume after what the database says is stored.
    let position: i64 = db
        .client
        .query_one(
            "SELECT envelopes.ingress_position($1, $2)",
            &[&config.name, &config.stream],
        )
        .await
        .map_err(|e| retry(&e))?
        .get(0);
    let durable = format!("envelopes-ingress-{}", config.name);
    let _ = stream.delete_consumer(&durable).await; // the database position wins
    let consumer = stream
        .create_consumer(pull::Config {
            durable_name: Some(durable.clone()),
            deliver_policy: DeliverPolicy::ByStartSequence {
                start_sequence: position as u64 + 1,
            },
            ack_policy: AckPolicy::All,
            ack_wait: Duration::from_secs(30),
            filter_subject: config.subject.clone(),
            ..Default::default()
        })
        .await
        .map_err(|e| retry(&e))?;
    tracing::info!(consumer = %config.name, stream = %config.stream, position, "ingress connected");
    backoff.reset();

    loop {
        if *shutdown.borrow() {
            return Ok(());
        }
        let mut batch = consumer
            .fetch()
            .max_messages(config.batch_size)
            .expires(Duration::from_millis(500))
            .messages()
            .await
            .map_err(|e| retry(&e))?;
        let mut messages = Vec::new();
        while let Some(message) = batch.next().await {
            messages.push(message.map_err(|e| retry(&e))?);
        }
        if messages.is_empty() {
            continue;
        }
        let mut good = Vec::with_capacity(messages.len());
        let mut last_sequence = 0u64;
        for m in &messages {
            let sequence = m.info().map(|i| i.stream_sequence).map_err(|e| retry(&e))?;
            last_sequence = last_sequence.max(sequence);
            match Envelope::from_bus(&m.payload) {
                Ok(envelope) => good.push(envelope),
                Err(reason) => {
                    dead_letter(
                        &client,
                        &config.dead_letter_subject,
                        m,
                        sequence,
                        &reason.to_string(),
                    )
                    .await
                    .map_err(|e| retry(&e))?;
                    metrics.dead_lettered.inc();
                    tracing::warn!(sequence, %reason, "malformed message dead-lettered");
                }
            }
        }
        let stored = store(&mut db, config, &good, last_sequence as i64)
            .await
            .map_err(|e| retry(&e))?;
        metrics.ingested.inc_by(stored as u64);
        crash_hook("after_commit");
        // The position is committed: now the bus may forget the batch.
        if let Some(last) = messages.last() {
            last.ack().await.map_err(|e| retry(&e))?;
        }
        tracing::debug!(rows = good.len(), stored, last_sequence, "batch stored");
    }
}

/// One transaction: the envelopes and the position.
async fn store(
    db: &mut db::Db,
    config: &IngressConfig,
    envelopes: &[Envelope],
    position: i64,
) -> Result<i64, tokio_postgres::Error> {
    let tx = db.client.transaction().await?;
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
    crash_hook("before_commit");
    tx.execute(
        "SELECT envelopes.ingress_store_position($1, $2, $3)",
        &[&config.name, &config.stream, &position],
    )
    .await?;
    tx.commit().await?;
    Ok(stored)
}

/// Publishes a malformed message to the dead-letter subject, with why and where it
/// came from, and waits until the server has it.
async fn dead_letter(
    client: &async_nats::Client,
    subject: &str,
    message: &jetstream::Message,
    sequence: u64,
    reason: &str,
) -> Result<(), async_nats::Error> {
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Envelopes-Error", reason);
    headers.insert("Envelopes-Source-Subject", message.subject.as_str());
    headers.insert("Envelopes-Source-Sequence", sequence.to_string().as_str());
    client
        .publish_with_headers(subject.to_owned(), headers, message.payload.clone())
        .await?;
    client.flush().await?;
    Ok(())
}

/// Test hook, as in egress: `ENVELOPES_BRIDGE_CRASH=<point>:<n>` aborts at the n-th
/// batch reaching before_commit or after_commit.
fn crash_hook(point: &str) {
    use std::sync::atomic::{AtomicU64, Ordering};
    static SEEN: AtomicU64 = AtomicU64::new(0);
    let Ok(spec) = std::env::var("ENVELOPES_BRIDGE_CRASH") else {
        return;
    };
    let Some((p, n)) = spec.split_once(':') else {
        return;
    };
    if p == point && SEEN.fetch_add(1, Ordering::SeqCst) + 1 >= n.parse().unwrap_or(u64::MAX) {
        eprintln!("envelopes-bridge: crash hook {spec} reached, aborting");
        std::process::abort();
    }
}
