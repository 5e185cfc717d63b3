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
//!
//! A batch the database refuses for good (a data or privilege error, e.g. a topic
//! over the receiver's `max_topic_bytes`) is bisected in transactions that roll
//! back, to find the messages it refuses; those go to the dead-letter subject
//! with the SQLSTATE and the server's message in headers, and the rest of the
//! batch is stored with the position as usual. A batch that needs more new
//! partitions than one call may create (54000, `envelopes.max_new_partitions_per_call`)
//! is inserted in more, smaller calls in the same transaction, halving the part
//! that was refused until it passes; a single message that still needs more is
//! refused for good. Transient errors reconnect with backoff; the backoff starts
//! over only after a batch went through.
//!
//! Positions are per (name, stream), and only one instance per name and stream
//! works at a time ([`crate::lease`]): a second one stands by and takes over
//! when the first one's database session ends. The JetStream consumer is made
//! anew from the stored position by whichever instance becomes active, and
//! messages are acknowledged one by one (explicit acks), each only after the
//! transaction that stored it (or set it aside) committed.

mod store;
mod stream;

use crate::crash;
use crate::db;
use crate::lease::{self, Lease};
use crate::message::Envelope;
use crate::metrics::Metrics;
use crate::nats::NatsAuth;
use crate::retry::{self, Class, DbFailure, Driver, Fatal, Wait};
use async_nats::jetstream::{self, consumer::pull, consumer::AckPolicy, consumer::DeliverPolicy};
use futures_util::StreamExt;
use std::sync::Arc;
use std::time::{Duration, Instant};
use store::{dead_letter, refused_by_database, refuses_rows, store};
use stream::{
    check_identity, count_gone, resume, stream_identity, subject_matches, IDENTITY_CHECK_INTERVAL,
};
use tokio::sync::watch;

/// How long JetStream waits for a message's acknowledgement before it delivers
/// the message again.
const ACK_WAIT: Duration = Duration::from_secs(30);
/// How long one pull waits for messages before it comes back with fewer (or
/// none: an idle round).
const FETCH_WAIT: Duration = Duration::from_millis(500);
/// How much longer than [`FETCH_WAIT`] a pull may wait for its next message
/// (or its end) before the source counts as not answering.
const PULL_GRACE: Duration = Duration::from_secs(2);

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
    /// How often the summary line is logged (zero: never).
    pub summary_every: Duration,
}

/// Why a session of ingress ended.
enum Failure {
    /// Transient database errors: reconnect.
    Retry(String),
    /// Anything from the bus (connect, read, acknowledge): reconnect; /readyz
    /// says not ready until a round works again.
    Bus(String),
    /// A permanent database error outside the envelopes themselves (e.g. the
    /// position function after a revoke): retry at the longest backoff.
    Permanent(DbFailure),
    /// A configuration the database refuses (see [`Class::Config`]).
    Config(DbFailure),
    /// The bus refuses the bridge's configuration: why, and the fix.
    BusConfig(String, &'static str),
}

/// How the driver retries and reports a failed session (see
/// [`retry::Failure`]): every failure counts in `errors_total`, as transient
/// or permanent.
impl retry::Failure for Failure {
    fn class(&self) -> Class {
        match self {
            Failure::Retry(_) | Failure::Bus(_) => Class::Transient,
            Failure::Permanent(_) => Class::Permanent,
            Failure::Config(_) | Failure::BusConfig(..) => Class::Config,
        }
    }

    fn what(&self) -> String {
        match self {
            Failure::Retry(why) | Failure::Bus(why) | Failure::BusConfig(why, _) => why.clone(),
            Failure::Permanent(e) | Failure::Config(e) => e.message.clone(),
        }
    }

    fn counts_as_error(&self) -> bool {
        true
    }

    fn log(&self, wait: Wait) {
        match self {
            Failure::Retry(why) | Failure::Bus(why) => {
                tracing::warn!(error = %why, retry_in_ms = wait.millis(),
                               "ingress interrupted, reconnecting")
            }
            Failure::Permanent(e) | Failure::Config(e) => {
                tracing::error!(sqlstate = e.code(), error = %e.message,
                                "database refuses the ingress; retrying at the longest backoff")
            }
            Failure::BusConfig(why, fix) => {
                tracing::error!(error = %why, %fix, "NATS refuses the ingress; retrying at the longest backoff")
            }
        }
    }

    fn fatal(&self) -> Fatal {
        match self {
            Failure::Permanent(e) | Failure::Config(e) => Fatal::database(e),
            Failure::BusConfig(why, fix) => Fatal::new(why, fix),
            Failure::Retry(why) | Failure::Bus(why) => Fatal::new(why, "fix the configuration"),
        }
    }
}

/// Runs until `shutdown` turns true. Ends early, with the cause, when the
/// configuration is refused before any batch went through.
pub async fn run(
    config: IngressConfig,
    metrics: Arc<Metrics>,
    shutdown: watch::Receiver<bool>,
) -> Result<(), Fatal> {
    Driver::new(metrics, shutdown)
        .run(async |driver| {
            let result = session(&config, driver).await;
            if let Err(Failure::Bus(_) | Failure::BusConfig(..)) = &result {
                // Readiness means the source answers: not ready until a round
                // works again.
                driver.metrics().sink_stalled.set(1);
            }
            if let Err(Failure::BusConfig(..)) = &result {
                // The source refuses ingress itself (its credentials, its
                // stream or subject).
                driver.metrics().sink_refusing.set(1);
            }
            result
        })
        .await?;
    tracing::info!("ingress stopped");
    Ok(())
}

/// One connected session: runs until shutdown (Ok) or a failure to retry.
async fn session(config: &IngressConfig, driver: &mut Driver) -> Result<(), Failure> {
    let retry = |e: &dyn std::fmt::Display| Failure::Bus(e.to_string());
    let mut db = db::connect(&config.database_url, "envelopes-bridge ingress")
        .await
        .map_err(|e| database(e.into()))?;
    crate::pooler::check(&config.database_url, &db)
        .await
        .map_err(database)?;
    // Nothing of the bus is touched before this instance is the active one.
    let lease = Lease::Ingress {
        consumer: &config.name,
        stream: &config.stream,
    };
    let metrics = driver.metrics().clone();
    let active = lease::acquire(&db, lease, &metrics, driver.shutdown())
        .await
        .map_err(database)?;
    if !active {
        return Ok(());
    }
    let client = crate::nats::connect(&config.source, &config.nats_auth)
        .await
        .map_err(|e| {
            if e.refused {
                Failure::BusConfig(
                    e.message,
                    "check the NATS credentials (--nats-user/--nats-password, --nats-token, \
                     --nats-creds)",
                )
            } else {
                retry(&e)
            }
        })?;
    let js = jetstream::new(client.clone());
    let mut stream = js
        .get_stream(&config.stream)
        .await
        .map_err(|e| match e.kind() {
            jetstream::context::GetStreamErrorKind::JetStream(j)
                if j.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND =>
            {
                Failure::BusConfig(
                    format!("stream {}: {e}", config.stream),
                    "check --nats-stream (and --source): ingress reads a stream that exists \
                     (egress creates it)",
                )
            }
            _ => retry(&e),
        })?;
    let info = stream.info().await.map_err(|e| retry(&e))?;
    // A dead letter the stream captures and ingress' own filter takes would be
    // read back, found malformed again and set aside again, without end.
    let dead_letters = &config.dead_letter_subject;
    let read_back = (config.subject.is_empty() || subject_matches(&config.subject, dead_letters))
        && info
            .config
            .subjects
            .iter()
            .any(|s| subject_matches(s, dead_letters));
    if read_back {
        return Err(Failure::BusConfig(
            format!(
                "the dead-letter subject {dead_letters:?} is one the stream {} captures and \
                 ingress reads ({:?}): a malformed message would come back as a new one, \
                 without end",
                config.stream, config.subject
            ),
            "check --dead-letter-subject: keep it outside the stream's subjects",
        ));
    }
    let identity = stream_identity(info);
    let (first, last) = (info.state.first_sequence, info.state.last_sequence);

    // Resume after what the database says is stored, in the stream it was read from.
    let row = db
        .client
        .query_one(
            "SELECT position, stream_identity FROM envelopes.ingress_stream_position($1, $2)",
            &[&config.name, &config.stream],
        )
        .await
        .map_err(|e| database(e.into()))?;
    let position = u64::try_from(row.get::<_, i64>(0)).unwrap_or(0);
    let stored_identity: Option<String> = row.get(1);
    let plan = resume(position, stored_identity.as_deref(), &identity, first, last);
    if plan.reset {
        metrics.ingress_stream_resets.inc();
        tracing::warn!(stream = %config.stream, position, stored_identity = stored_identity.as_deref().unwrap_or("none"),
                       identity = %identity, first_sequence = first, last_sequence = last,
                       "the stream was deleted and re-created (its numbering started again) since \
                        the position was stored: starting from the new stream's first message")
    }
    if plan.gone > 0 {
        metrics.ingress_gone.inc_by(plan.gone);
        tracing::warn!(stream = %config.stream, gone = plan.gone, from_sequence = plan.start - plan.gone,
                       first_sequence = first,
                       "messages were gone from the stream before ingress read them (purged, or \
                        removed by the stream's limits or age); they cannot be stored")
    }
    let durable = format!("envelopes-ingress-{}", config.name);
    let _ = stream.delete_consumer(&durable).await; // the database position wins
    let consumer = stream
        .create_consumer(pull::Config {
            durable_name: Some(durable.clone()),
            deliver_policy: DeliverPolicy::ByStartSequence {
                start_sequence: plan.start,
            },
            ack_policy: AckPolicy::Explicit,
            ack_wait: ACK_WAIT,
            filter_subject: config.subject.clone(),
            ..Default::default()
        })
        .await
        .map_err(|e| match e.kind() {
            jetstream::stream::ConsumerErrorKind::JetStream(j)
                if j.error_code() == jetstream::ErrorCode::CONSUMER_FILTER_NOT_SUBSET =>
            {
                Failure::BusConfig(
                    format!(
                        "stream {}: subject {:?}: {e}",
                        config.stream, config.subject
                    ),
                    "check --subject (or --subject-prefix, whose PREFIX.envelope.> is the                      default): ingress reads subjects the stream takes (see `nats stream info`)",
                )
            }
            _ => retry(&e),
        })?;
    // A stream re-created between the look at it and the consumer: start over.
    check_identity(&mut stream, &identity).await?;
    tracing::info!(consumer = %config.name, stream = %config.stream, position,
                   start_sequence = plan.start, identity = %identity, "ingress connected");
    let mut next_sequence = plan.start;
    let mut identity_checked = Instant::now();
    // One INFO line per --summary-secs, idle or not: a healthy ingress is seen
    // to be one.
    let mut summary = (Instant::now(), metrics.ingested.get(), metrics.totals().1);

    loop {
        if driver.stopping() {
            return Ok(());
        }
        if !config.summary_every.is_zero() && summary.0.elapsed() >= config.summary_every {
            let (stored, dead) = (metrics.ingested.get(), metrics.totals().1);
            tracing::info!(
                stored = stored.saturating_sub(summary.1),
                dead_lettered = dead.saturating_sub(summary.2),
                stream_position = next_sequence.saturating_sub(1),
                interval_s = summary.0.elapsed().as_secs(),
                "ingress summary"
            );
            summary = (Instant::now(), stored, dead);
        }
        // A pull ends after FETCH_WAIT at the latest, and its messages come
        // one after the other; a pull whose next message or end does not come
        // (the source went away and the client waits to reconnect) is a
        // failure, found within seconds.
        let silent = || {
            Failure::Bus(format!(
                "a pull from the stream got no answer within {} ms",
                (FETCH_WAIT + PULL_GRACE).as_millis()
            ))
        };
        let mut batch = tokio::time::timeout(
            FETCH_WAIT + PULL_GRACE,
            consumer
                .fetch()
                .max_messages(config.batch_size)
                .expires(FETCH_WAIT)
                .messages(),
        )
        .await
        .map_err(|_| silent())?
        .map_err(|e| retry(&e))?;
        let mut messages = Vec::new();
        while let Some(message) = tokio::time::timeout(FETCH_WAIT + PULL_GRACE, batch.next())
            .await
            .map_err(|_| silent())?
        {
            messages.push(message.map_err(|e| retry(&e))?);
        }
        if messages.is_empty() {
            // Idle: a stream deleted (and perhaps re-created) under the consumer
            // may leave the pulls merely empty.
            if identity_checked.elapsed() >= IDENTITY_CHECK_INTERVAL {
                check_identity(&mut stream, &identity).await?;
                identity_checked = Instant::now();
            }
            // An empty pull is no proof that the source answers: the client
            // hands out empty pulls while it reconnects.
            let state = client.connection_state();
            if state != async_nats::connection::State::Connected {
                return Err(Failure::Bus(format!(
                    "the connection to the source is down ({state})"
                )));
            }
            metrics.sink_stalled.set(0);
            metrics.sink_refusing.set(0);
            driver.worked(); // a whole round worked
            continue;
        }
        let mut good = Vec::with_capacity(messages.len());
        let mut good_sources = Vec::with_capacity(messages.len());
        let mut last_sequence = 0u64;
        // Where the sequence jumped ahead: (expected, got).
        let mut jumps = Vec::new();
        for m in &messages {
            let sequence = m.info().map(|i| i.stream_sequence).map_err(|e| retry(&e))?;
            last_sequence = last_sequence.max(sequence);
            if sequence > next_sequence {
                jumps.push((next_sequence, sequence));
            }
            next_sequence = next_sequence.max(sequence + 1);
            match Envelope::from_bus(&m.payload) {
                Ok(envelope) => {
                    good.push(envelope);
                    good_sources.push((m, sequence));
                }
                Err(reason) => {
                    dead_letter(
                        &client,
                        &config.dead_letter_subject,
                        m,
                        sequence,
                        &reason.to_string(),
                        None,
                    )
                    .await
                    .map_err(|e| retry(&e))?;
                    metrics.dead_lettered("envelope");
                    tracing::warn!(sequence, %reason, "malformed message dead-lettered");
                }
            }
        }
        let stored = match store(&mut db, config, &good, last_sequence as i64, &identity).await {
            Ok(stored) => stored,
            Err(e) if refuses_rows(&e) && !good.is_empty() => {
                // Which messages does the database refuse? Set them aside, store the rest.
                let refused = refused_by_database(&mut db, &good)
                    .await
                    .map_err(database)?;
                for (index, why) in &refused {
                    let (m, sequence) = &good_sources[*index];
                    dead_letter(
                        &client,
                        &config.dead_letter_subject,
                        m,
                        *sequence,
                        &why.message,
                        why.sqlstate.as_deref(),
                    )
                    .await
                    .map_err(|e| retry(&e))?;
                    metrics.dead_lettered("envelope");
                    tracing::warn!(sequence, sqlstate = why.code(), error = %why.message,
                                   "message refused by the database dead-lettered");
                }
                let kept: Vec<Envelope> = good
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| !refused.iter().any(|(r, _)| r == i))
                    .map(|(_, e)| e.clone())
                    .collect();
                store(&mut db, config, &kept, last_sequence as i64, &identity)
                    .await
                    .map_err(database)?
            }
            Err(e) => return Err(database(e)),
        };
        if !jumps.is_empty() {
            count_gone(&mut stream, config, &jumps, &metrics).await?;
        }
        metrics.ingested.inc_by(stored as u64);
        metrics.sink_stalled.set(0);
        metrics.sink_refusing.set(0);
        driver.worked();
        crash::reached("after_commit");
        // The position is committed: now the bus may forget the batch's messages
        // (each its own ack: a consumer another instance may have shared before
        // this one became active never hears of messages this one did not store).
        for m in &messages {
            m.ack().await.map_err(|e| retry(&e))?;
        }
        tracing::debug!(rows = good.len(), stored, last_sequence, "batch stored");
    }
}

fn database(e: DbFailure) -> Failure {
    match e.class {
        Class::Transient => Failure::Retry(e.to_string()),
        Class::Permanent => Failure::Permanent(e),
        Class::Config => Failure::Config(e),
    }
}
