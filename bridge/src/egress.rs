//! Egress: committed rows -> the bus, at least once, never skipping one.
//!
//! The loop: LISTEN on the doorbell channel; on a notification or when the poll
//! interval passes, read the next committed batch after the consumer's durable
//! cursor (`consumer_outbox_batch`, `consumer_envelope_batch`: commit-safe, so a
//! row that commits late is still ahead of the cursor), publish it, wait for the
//! bus to acknowledge every message, and only then move the cursor
//! (`consumer_*_ack`). A crash anywhere loses nothing: before the ack the rows
//! are read again and republished under the same dedup ids, which the bus (or the
//! consumer) drops. Reads repeat until a batch comes back empty, so one doorbell
//! drains a whole backlog. Database and bus failures are retried with bounded
//! backoff; a rejected message is logged with its id and retried, never skipped.

use crate::db::{self, Db};
use crate::message::{Envelope, Message, OutboxMessage};
use crate::metrics::Metrics;
use crate::sink::{Sink, SinkOptions, SinkSpec};
use crate::Backoff;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

pub struct EgressConfig {
    pub database_url: String,
    pub name: String,
    pub sink: SinkSpec,
    pub sink_options: SinkOptions,
    pub batch_size: i32,
    pub poll_interval: Duration,
    pub channel: String,
}

/// Test hook: `ENVELOPES_BRIDGE_CRASH=<point>:<n>` aborts the process (no cleanup,
/// like kill -9) at the n-th batch reaching `point` (before_publish,
/// after_publish, after_ack). Used by the crash tests; unset in production.
struct CrashPoint {
    point: String,
    at: u64,
    seen: u64,
}

impl CrashPoint {
    fn from_env() -> Option<CrashPoint> {
        let spec = std::env::var("ENVELOPES_BRIDGE_CRASH").ok()?;
        let (point, at) = spec.split_once(':')?;
        Some(CrashPoint {
            point: point.to_owned(),
            at: at.parse().ok()?,
            seen: 0,
        })
    }

    fn reached(crash: &mut Option<CrashPoint>, point: &str) {
        if let Some(c) = crash {
            if c.point == point {
                c.seen += 1;
                if c.seen >= c.at {
                    eprintln!(
                        "envelopes-bridge: crash hook {point}:{} reached, aborting",
                        c.at
                    );
                    std::process::abort();
                }
            }
        }
    }
}

/// Runs until `shutdown` turns true.
pub async fn run(config: EgressConfig, metrics: Arc<Metrics>, mut shutdown: watch::Receiver<bool>) {
    let mut crash = CrashPoint::from_env();
    let mut db_backoff = Backoff::new();
    let mut sink: Option<Sink> = None;
    let mut progress = Progress::new();
    'connect: while !*shutdown.borrow() {
        let mut db = match connect(&config).await {
            Ok(db) => {
                db_backoff.reset();
                db
            }
            Err(e) => {
                tracing::warn!(error = %e, "database unavailable, retrying");
                if db_backoff.wait(&mut shutdown).await {
                    break;
                }
                continue;
            }
        };
        tracing::info!(consumer = %config.name, sink = %config.sink, "egress connected");
        let mut status_due = Instant::now();
        loop {
            if *shutdown.borrow() {
                break 'connect;
            }
            // Drain: read and publish until both streams come back empty.
            match drain_once(
                &config,
                &mut db,
                &mut sink,
                &metrics,
                &mut crash,
                &mut shutdown,
            )
            .await
            {
                Ok(rows) if rows > 0 => {
                    progress.add(rows, rows as i32 >= config.batch_size);
                    continue;
                }
                Ok(_) => progress.idle(),
                Err(Failure::Database(e)) => {
                    tracing::warn!(error = %e, "database error, reconnecting");
                    if db_backoff.wait(&mut shutdown).await {
                        break 'connect;
                    }
                    continue 'connect;
                }
                Err(Failure::Shutdown) => break 'connect,
            }
            if status_due <= Instant::now() {
                update_lag(&db, &config.name, &metrics).await;
                status_due = Instant::now() + Duration::from_secs(5);
            }
            // Sleep until the doorbell rings, the poll interval passes, or shutdown.
            tokio::select! {
                note = db.notifications.recv() => {
                    if note.is_none() {
                        tracing::warn!("LISTEN connection closed, reconnecting");
                        continue 'connect;
                    }
                    // Several doorbells may be queued; one read serves them all.
                    while db.notifications.try_recv().is_ok() {}
                }
                _ = tokio::time::sleep(config.poll_interval) => {}
                _ = shutdown.changed() => {}
            }
        }
    }
    tracing::info!("egress stopped");
}

async fn connect(config: &EgressConfig) -> Result<Db, String> {
    let db = db::connect(&config.database_url, "envelopes-bridge egress")
        .await
        .map_err(|e| e.to_string())?;
    db.client
        .batch_execute(&format!("LISTEN {}", quote_ident(&config.channel)))
        .await
        .map_err(|e| e.to_string())?;
    db.client
        .execute("SELECT envelopes.consumer_register($1)", &[&config.name])
        .await
        .map_err(|e| e.to_string())?;
    Ok(db)
}

/// A Postgres identifier, quoted.
fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

enum Failure {
    Database(String),
    Shutdown,
}

/// One read of each stream, published and acknowledged. Returns the rows moved.
async fn drain_once(
    config: &EgressConfig,
    db: &mut Db,
    sink: &mut Option<Sink>,
    metrics: &Metrics,
    crash: &mut Option<CrashPoint>,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<usize, Failure> {
    let mut moved = 0;

    let (outbox, last) = read_outbox(db, config).await.map_err(Failure::Database)?;
    if let Some((xid, id)) = last {
        deliver(config, sink, &outbox, metrics, crash, shutdown).await?;
        db.client
            .execute(
                "SELECT envelopes.consumer_outbox_ack($1, $2::text::xid8, $3)",
                &[&config.name, &xid, &id],
            )
            .await
            .map_err(|e| Failure::Database(e.to_string()))?;
        CrashPoint::reached(crash, "after_ack");
        moved += outbox.len();
    }

    let envelopes = read_envelopes(db, config)
        .await
        .map_err(Failure::Database)?;
    if !envelopes.is_empty() {
        deliver(config, sink, &envelopes, metrics, crash, shutdown).await?;
        let mut tops: BTreeMap<i32, i64> = BTreeMap::new();
        for m in &envelopes {
            if let Message::Envelope(e) = m {
                let top = tops
                    .entry(e.originator_node_id)
                    .or_insert(e.originator_sequence_id);
                *top = (*top).max(e.originator_sequence_id);
            }
        }
        let nodes: Vec<i32> = tops.keys().copied().collect();
        let seqs: Vec<i64> = tops.values().copied().collect();
        db.client
            .execute(
                "SELECT envelopes.consumer_envelope_ack($1, $2, $3)",
                &[&config.name, &nodes, &seqs],
            )
            .await
            .map_err(|e| Failure::Database(e.to_string()))?;
        CrashPoint::reached(crash, "after_ack");
        moved += envelopes.len();
    }
    Ok(moved)
}

async fn read_outbox(
    db: &Db,
    config: &EgressConfig,
) -> Result<(Vec<Message>, Option<(String, i64)>), String> {
    let rows = db
        .client
        .query(
            "SELECT id, inserted_xid::text, subject, payload, headers::text,
                    (extract(epoch FROM created_at) * 1000000)::bigint
               FROM envelopes.consumer_outbox_batch($1, $2)",
            &[&config.name, &config.batch_size],
        )
        .await
        .map_err(|e| e.to_string())?;
    let mut last = None;
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        let id: i64 = row.get(0);
        last = Some((row.get::<_, String>(1), id));
        let headers: String = row.get(4);
        out.push(Message::Outbox(OutboxMessage {
            id,
            subject: row.get(2),
            payload: row.get(3),
            headers: serde_json::from_str(&headers).unwrap_or(serde_json::Value::Null),
            created_at_us: row.get(5),
        }));
    }
    Ok((out, last))
}

async fn read_envelopes(db: &Db, config: &EgressConfig) -> Result<Vec<Message>, String> {
    let rows = db
        .client
        .query(
            "SELECT originator_node_id, originator_sequence_id,
                    (extract(epoch FROM gateway_time) * 1000000)::bigint,
                    topic, payer_id, expiry, originator_envelope
               FROM envelopes.consumer_envelope_batch($1, $2)",
            &[&config.name, &config.batch_size],
        )
        .await
        .map_err(|e| e.to_string())?;
    Ok(rows
        .into_iter()
        .map(|row| {
            Message::Envelope(Envelope {
                originator_node_id: row.get(0),
                originator_sequence_id: row.get(1),
                gateway_time_us: row.get(2),
                topic: row.get(3),
                payer_id: row.get(4),
                expiry: row.get(5),
                originator_envelope: row.get(6),
            })
        })
        .collect())
}

/// Publishes until the bus acknowledges the whole batch; reconnects the sink and
/// retries with backoff on failure. Only shutdown ends it early.
async fn deliver(
    config: &EgressConfig,
    sink: &mut Option<Sink>,
    batch: &[Message],
    metrics: &Metrics,
    crash: &mut Option<CrashPoint>,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<(), Failure> {
    let mut backoff = Backoff::new();
    CrashPoint::reached(crash, "before_publish");
    loop {
        if sink.is_none() {
            match Sink::connect(&config.sink, &config.sink_options).await {
                Ok(s) => *sink = Some(s),
                Err(e) => {
                    tracing::warn!(error = %e, sink = %config.sink, "bus unavailable, retrying");
                    if backoff.wait(shutdown).await {
                        return Err(Failure::Shutdown);
                    }
                    continue;
                }
            }
        }
        let Some(s) = sink.as_mut() else { continue };
        let started = Instant::now();
        match s.publish(batch).await {
            Ok(()) => {
                metrics.published(batch);
                metrics
                    .batch_latency
                    .observe(started.elapsed().as_secs_f64());
                CrashPoint::reached(crash, "after_publish");
                return Ok(());
            }
            Err(e) => {
                metrics.retried.inc();
                let first = batch.first().map(Message::dedup_id).unwrap_or_default();
                let last = batch.last().map(Message::dedup_id).unwrap_or_default();
                tracing::warn!(error = %e, first_id = %first, last_id = %last, rows = batch.len(),
                               "publish failed, retrying the batch");
                *sink = None;
                if backoff.wait(shutdown).await {
                    return Err(Failure::Shutdown);
                }
            }
        }
    }
}

async fn update_lag(db: &Db, name: &str, metrics: &Metrics) {
    let row = db
        .client
        .query_opt(
            "SELECT COALESCE(outbox_pending, 0) + COALESCE(envelopes_pending, 0),
                    COALESCE(extract(epoch FROM GREATEST(outbox_oldest_pending_age,
                                                         envelopes_oldest_pending_age)), 0)::float8
               FROM envelopes.consumer_status WHERE consumer = $1",
            &[&name],
        )
        .await;
    match row {
        Ok(Some(row)) => {
            metrics.lag_rows.set(row.get::<_, i64>(0));
            metrics.lag_seconds.set(row.get::<_, f64>(1));
        }
        Ok(None) => {}
        Err(e) => tracing::debug!(error = %e, "could not read consumer status"),
    }
}

/// A progress line while catching up a large backlog.
struct Progress {
    since: Instant,
    rows: usize,
    catching_up: bool,
}

impl Progress {
    fn new() -> Progress {
        Progress {
            since: Instant::now(),
            rows: 0,
            catching_up: false,
        }
    }

    fn add(&mut self, rows: usize, full_batch: bool) {
        self.rows += rows;
        if full_batch && !self.catching_up {
            self.catching_up = true;
            self.since = Instant::now();
            self.rows = rows;
            tracing::info!("backlog detected, catching up");
        }
        if self.catching_up && self.since.elapsed() >= Duration::from_secs(5) {
            let rate = self.rows as f64 / self.since.elapsed().as_secs_f64();
            tracing::info!(
                rows = self.rows,
                rows_per_second = rate as u64,
                "catching up"
            );
            self.since = Instant::now();
            self.rows = 0;
        }
    }

    fn idle(&mut self) {
        if self.catching_up {
            tracing::info!("caught up");
            self.catching_up = false;
        }
    }
}
