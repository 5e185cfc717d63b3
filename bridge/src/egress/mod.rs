//! Egress: the loop that moves committed rows to the bus, at least once, never
//! skipping one, and never letting one row stop the others.
//!
//! The loop: LISTEN on the doorbell channel; on a notification or when the poll
//! interval passes, read the next batch after the consumer's durable positions
//! (`consumer_outbox_batch`, `consumer_envelope_batch`: every committed row comes
//! in some batch, late arrivals included, see the extension's `feed` module),
//! publish it, wait for the bus to acknowledge every message, and only then move
//! the positions (`consumer_*_ack`). A crash anywhere loses nothing: before the
//! ack the rows are read again and republished under the same dedup ids, which
//! the bus (or the consumer) drops. Reads repeat until a batch comes back empty,
//! so one doorbell drains a whole backlog. Batches are bounded by rows and bytes.
//!
//! Only the instance holding its consumer's lease works ([`crate::lease`]): a
//! second bridge under the same name stands by, connected, and takes over when
//! the first one's database session ends.
//!
//! Failures, by kind (retried by the delivery driver, [`crate::retry`]: the
//! sessions through [`Driver::run`], each batch's publishing through
//! [`Driver::failed`]):
//! * the bus is unavailable: the batch is published again with backoff, for as
//!   long as it takes (an outage never sets a row aside);
//! * the bus refuses one message (too large, a subject or key it does not take,
//!   an ACL): the row is set aside at once in `envelopes.dead_letters` with the
//!   bus's code and reason, and the rest of the batch and of the feed flows
//!   without waiting for it. The bridge tries the row again by itself on a short
//!   schedule of its own ([`retry::refusal_delay`]: 250 ms doubling, jittered)
//!   until `--dead-letter-after` attempts in all; after that it stays set aside
//!   (counted in `dead_lettered_total`) until an operator asks for it again with
//!   `retry_dead_letters()`. A batch the bus refuses as a whole as too large (an
//!   HTTP 413) is published again in halves, down to single rows;
//! * a transient database error (connection, serialization, resources): reconnect
//!   with backoff;
//! * a permanent database error (data, privileges, e.g. 42501 after a revoke):
//!   logged as an error with its SQLSTATE, counted, retried at the longest backoff
//!   until someone fixes it. Nothing is skipped.

//!
//! The parts, by concept: [`read`] (the two feeds' batches), [`mod@deliver`]
//! (publishing a batch and judging refusals), [`dead_letter`] (rows set aside
//! and tried again), [`sink_check`] (reaching the sink, idle checks) and
//! [`lag`] (lag, progress and summary lines); this module holds the session,
//! the lease and the acknowledgements.

mod dead_letter;
mod deliver;
mod lag;
mod read;
mod sink_check;

use crate::crash;
use crate::db::{self, Db};
use crate::lease::{self, Lease};
use crate::message::Message;
use crate::metrics::Metrics;
use crate::retry::{self, Class, DbFailure, Driver, Fatal, Wait};
use crate::sink::{Sink, SinkArgs};
use crate::standby::{self, ForwardAfter, WaitError};
use dead_letter::retry_dead_letters;
use deliver::deliver;
use lag::{
    oldest_us, summarize, update_lag, Progress, LAG_COST_SHARE, LAG_EVERY_ROUND, LAG_INTERVAL,
};
use read::{read_envelopes, read_outbox, Position};
use sink_check::{ensure_sink, recheck_sink, SINK_CHECK_INTERVAL};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

pub struct EgressConfig {
    pub database_url: String,
    pub name: String,
    /// The sink, with its own options.
    pub sink: SinkArgs,
    pub batch_size: i32,
    /// Bytes of topics, envelopes and payloads per batch (at least one row).
    pub batch_bytes: i64,
    pub poll_interval: Duration,
    pub channel: String,
    /// Attempts in all a message the bus refuses gets (the first, when it is set
    /// aside, and the bridge's own retries) before it waits for an operator.
    pub dead_letter_after: u32,
    /// Goes into outbox rows' dedup ids (`outbox:SCOPE:ID`), see `--outbox-scope`.
    pub outbox_scope: Option<String>,
    /// Create the consumer if it does not exist (otherwise an unknown name ends
    /// the bridge, exit 78).
    pub register: bool,
    /// Read the lag from the database every round (else every 5 seconds).
    pub lag_every_round: bool,
    /// How often the summary line is logged (zero: never).
    pub summary_every: Duration,
    /// When a batch read may be published (see [`crate::standby`]).
    pub forward_after: ForwardAfter,
}

/// Runs until `shutdown` turns true. Ends early, with the cause, when the
/// configuration is refused before any round worked (see [`Class::Config`]).
pub async fn run(
    config: EgressConfig,
    metrics: Arc<Metrics>,
    shutdown: watch::Receiver<bool>,
) -> Result<(), Fatal> {
    let mut driver = Driver::new(metrics, shutdown);
    let mut state = State::default();
    let mut progress = Progress::new();
    let sessions = driver
        .run(async |driver| session(&config, driver, &mut state, &mut progress).await)
        .await;
    if let Err(fatal) = sessions {
        return Err(fatal.for_consumer(&config).await);
    }
    tracing::info!("egress stopped");
    Ok(())
}

/// One session: connects, takes the lease (standing by while another instance
/// holds it), listens, and drains the feeds whenever the doorbell rings or the
/// poll interval passes. Ends with `Ok` on shutdown, or when the LISTEN
/// connection closes (to connect again at once).
async fn session(
    config: &EgressConfig,
    driver: &mut Driver,
    state: &mut State,
    progress: &mut Progress,
) -> Result<(), Failure> {
    if let Some(until) = state.stand_aside_until.take() {
        driver.metrics().active.set(0);
        let wait = until.saturating_duration_since(Instant::now());
        if crate::shutdown::sleep(wait, driver.shutdown()).await {
            return Ok(());
        }
    }
    let mut db = match connect(config, driver).await {
        Ok(Some(db)) => db,
        Ok(None) => return Ok(()), // shutdown while standing by
        Err(e) => {
            driver.metrics().active.set(0);
            return Err(Failure::Database(e, "connecting".into()));
        }
    };
    tracing::info!(consumer = %config.name, sink = %config.sink.sink, "egress connected");
    // The sink is reached before any round counts as working (readiness means
    // the bus answers, and a bus that refuses the bridge ends it with 78 even
    // on a quiet feed).
    match ensure_sink(config, &db, state, driver).await {
        Ok(()) => {}
        Err(Failure::Shutdown) => return Ok(()),
        Err(failure) => return Err(failure),
    }
    let mut lag_due = Instant::now();
    loop {
        if driver.stopping() {
            return Ok(());
        }
        // Drain: read and publish until both feeds come back empty.
        match drain_once(config, &mut db, state, driver).await {
            Ok(rows) if std::mem::take(&mut state.stalled) => {
                // Stalled on a bus that refuses the bridge (the wait is over):
                // not a round that worked; read again at once.
                progress.add(rows, false, driver.metrics());
                update_lag(&db, &config.name, driver.metrics()).await;
                continue;
            }
            Ok(rows) => {
                // Idle, the sink is asked every SINK_CHECK_INTERVAL whether it
                // still answers; a round counts as working only then.
                if rows == 0
                    && state
                        .sink_checked
                        .is_none_or(|t| t.elapsed() >= SINK_CHECK_INTERVAL)
                {
                    match recheck_sink(config, &db, state, driver).await {
                        Ok(()) => {}
                        Err(Failure::Shutdown) => return Ok(()),
                        Err(failure) => return Err(failure),
                    }
                }
                // A whole round worked: the next failure starts backing off anew.
                driver.worked();
                let metrics = driver.metrics();
                summarize(state, metrics, config.summary_every);
                if rows > 0 {
                    if lag_due <= Instant::now() {
                        let asked = Instant::now();
                        update_lag(&db, &config.name, metrics).await;
                        let took = asked.elapsed();
                        lag_due = Instant::now()
                            + if config.lag_every_round {
                                LAG_EVERY_ROUND.max(took * LAG_COST_SHARE)
                            } else {
                                LAG_INTERVAL
                            };
                    } else {
                        // Between two counts (consumer_lag counts rows, which
                        // takes longer the larger the backlog), the rows this
                        // round acknowledged come off the last one.
                        let left = (metrics.lag_rows.get() - rows as i64).max(0);
                        metrics.lag_rows.set(left);
                    }
                    progress.add(rows, rows as i32 >= config.batch_size, metrics);
                    continue;
                }
                // A round that found nothing to read: nothing deliverable is
                // pending (rows of transactions still open are not yet).
                metrics.lag_rows.set(0);
                metrics.lag_seconds.set(0.0);
                progress.idle();
            }
            Err(Failure::Shutdown) => return Ok(()),
            Err(failure) => {
                if let Failure::Database(..) | Failure::Blocked(..) = failure {
                    driver.metrics().active.set(0);
                }
                return Err(failure);
            }
        }
        // Sleep until the doorbell rings, the poll interval passes, or shutdown.
        tokio::select! {
            note = db.notifications.recv() => {
                if note.is_none() {
                    tracing::warn!("LISTEN connection closed, reconnecting");
                    return Ok(());
                }
                // Several doorbells may be queued; one read serves them all.
                while db.notifications.try_recv().is_ok() {}
            }
            // Never idle past the heartbeat: the server ends silent sessions.
            _ = tokio::time::sleep(config.poll_interval.min(db::heartbeat_interval())) => {}
            _ = crate::shutdown::requested(driver.shutdown()) => {}
        }
    }
}

impl Fatal {
    /// For an unknown consumer, names the ones that exist.
    async fn for_consumer(mut self, config: &EgressConfig) -> Fatal {
        if self.sqlstate.as_deref() == Some("42704") && !config.register {
            let known = match db::connect(&config.database_url, "envelopes-bridge egress").await {
                Ok(db) => db
                    .client
                    .query(
                        "SELECT consumer FROM envelopes.consumer_status ORDER BY 1",
                        &[],
                    )
                    .await
                    .map(|rows| {
                        rows.iter()
                            .map(|r| r.get::<_, String>(0))
                            .collect::<Vec<_>>()
                    })
                    .unwrap_or_default(),
                Err(_) => Vec::new(),
            };
            self.hint = format!(
                "no consumer {:?}; existing consumers: {}. Check --name, or create it with \
                 --register (from the beginning of every feed) or `envelopes-bridge register \
                 NAME [--from-end]`",
                config.name,
                if known.is_empty() {
                    "none".to_owned()
                } else {
                    known.join(", ")
                }
            );
        }
        self
    }
}

/// Connects, registers the consumer, waits for its lease (standing by while
/// another instance holds it) and listens. `None` when shutdown came first.
async fn connect(config: &EgressConfig, driver: &mut Driver) -> Result<Option<Db>, DbFailure> {
    let db = db::connect(&config.database_url, "envelopes-bridge egress").await?;
    crate::pooler::check(&config.database_url, &db).await?;
    if config.register {
        db.client
            .execute("SELECT envelopes.consumer_register($1)", &[&config.name])
            .await?;
    }
    let lease = Lease::Egress {
        consumer: &config.name,
    };
    let metrics = driver.metrics().clone();
    if !lease::acquire(&db, lease, &metrics, driver.shutdown()).await? {
        return Ok(None);
    }
    db.client
        .batch_execute(&format!("LISTEN {}", quote_ident(&config.channel)))
        .await?;
    Ok(Some(db))
}

/// A Postgres identifier, quoted.
fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Why a round of egress ended early.
enum Failure {
    /// The failure, and what the bridge was doing (with the rows' ids when known).
    Database(DbFailure, String),
    /// The bus refuses the bridge's configuration before any round worked.
    Fatal(Fatal),
    /// The broker blocked publishing for longer than the sink's bound (the
    /// error, and the rows held): the session ends and the lease is left to a
    /// standby for a while.
    Blocked(String, usize),
    /// Shutdown was asked for: the session ends (this never reaches the
    /// driver's retries).
    Shutdown,
}

/// How the driver retries and reports a failed round (see [`retry::Failure`]).
impl retry::Failure for Failure {
    fn class(&self) -> Class {
        match self {
            Failure::Database(error, _) => error.class,
            Failure::Fatal(_) => Class::Config,
            Failure::Blocked(..) | Failure::Shutdown => Class::Transient,
        }
    }

    fn what(&self) -> String {
        match self {
            Failure::Database(error, during) => format!("{during}: {error}"),
            Failure::Fatal(fatal) => fatal.message.clone(),
            Failure::Blocked(error, _) => error.clone(),
            Failure::Shutdown => "shutdown requested".into(),
        }
    }

    fn counts_as_error(&self) -> bool {
        matches!(self, Failure::Database(..) | Failure::Blocked(..))
    }

    fn log(&self, wait: Wait) {
        if let Failure::Blocked(error, rows) = self {
            tracing::error!(error = %error, rows, stand_aside_ms = STAND_ASIDE.as_millis() as u64,
                            "the broker has blocked publishing for too long: giving up the lease \
                             so that a standby can take over (nothing unconfirmed counts)");
            return;
        }
        let Failure::Database(error, during) = self else {
            return;
        };
        let during = during.as_str();
        match wait {
            Wait::Backoff(_) => {
                tracing::warn!(sqlstate = error.code(), error = %error.message, during,
                               retry_in_ms = wait.millis(),
                               "database error, reconnecting and retrying")
            }
            Wait::Longest => {
                tracing::error!(sqlstate = error.code(), error = %error.message, during,
                                "database refuses the bridge's statement; retrying at the longest \
                                 backoff until it is fixed (nothing is skipped)")
            }
        }
    }

    fn fatal(&self) -> Fatal {
        match self {
            Failure::Database(error, _) => Fatal::database(error),
            Failure::Fatal(fatal) => fatal.clone(),
            Failure::Blocked(error, _) => Fatal::new(error, "free the broker's memory or disk"),
            Failure::Shutdown => Fatal::new("shutdown requested", "none needed"),
        }
    }
}

/// How long a bridge whose broker blocked it past the bound stays away from
/// its lease, so that a standby (polling every [`lease::STANDBY_POLL`]) takes it.
const STAND_ASIDE: Duration = Duration::from_secs(3);

/// What the bridge keeps between batches: the sink connection.
#[derive(Default)]
struct State {
    sink: Option<Sink>,
    /// Until when this instance leaves its lease to others (after its broker
    /// blocked it for too long).
    stand_aside_until: Option<Instant>,
    /// When the bus last pushed back on a message (a nack).
    pushed_back_at: Option<Instant>,
    /// Messages per request since the bus last pushed back: 1 then, doubled
    /// with each request it takes once the careful time is over
    /// ([`deliver::PUSHBACK_CAREFUL`]), forgotten once it reaches a whole batch.
    pushback_window: Option<usize>,
    /// Whether `synchronous_standby_names` was set at the last batch (see
    /// [`standby::wait_until_flushed`]).
    standby_names_seen: bool,
    /// When the sink last answered (a connect, a publish, a check).
    sink_checked: Option<Instant>,
    /// Whether the store's and the sink's message limits were compared.
    limits_compared: bool,
    /// The last summary line: when, and the totals (published, dead-lettered)
    /// then.
    summary: Option<(Instant, u64, u64)>,
    /// The refusal code of the bus while it refuses the bridge rather than its
    /// rows (see [`deliver::BREAKER_ROWS`]): egress stalls instead of setting rows aside.
    breaker: Option<String>,
    /// Refusals since the last delivery that were not judged yet, across
    /// batches: (code, row id), the newest last.
    streak: Vec<(String, String)>,
    /// The last round stalled on a bus that refuses the bridge, or deferred
    /// judging refused rows (it is read again at once).
    stalled: bool,
    /// Rounds in a row that ended on refused rows not judged yet.
    deferrals: u32,
}

/// One read of each feed, published and acknowledged. Returns the rows moved.
async fn drain_once(
    config: &EgressConfig,
    db: &mut Db,
    state: &mut State,
    driver: &mut Driver,
) -> Result<usize, Failure> {
    let mut moved = retry_dead_letters(config, db, state, driver).await?;

    let (outbox, positions) = read_outbox(db, config)
        .await
        .map_err(|e| Failure::Database(e, "reading the outbox".into()))?;
    if !positions.is_empty() {
        hold_for_standbys(config, db, state, &outbox, driver).await?;
        let (_, stalled) = deliver(config, db, state, &outbox, &[], true, driver).await?;
        // Stalled (the bus refuses the bridge): only what went before counts.
        let done = stalled.unwrap_or(outbox.len());
        if let Some(Position::Outbox(last)) = positions[..done].last() {
            db.client
                .execute(
                    "SELECT envelopes.consumer_outbox_ack($1, $2)",
                    &[&config.name, last],
                )
                .await
                .map_err(|e| Failure::Database(e.into(), during("acknowledging", &outbox)))?;
            crash::reached("after_ack");
        }
        moved += done;
        if stalled.is_some() {
            state.stalled = true;
            return Ok(moved);
        }
    }

    let (envelopes, positions) = read_envelopes(db, config)
        .await
        .map_err(|e| Failure::Database(e, "reading envelopes".into()))?;
    if !envelopes.is_empty() {
        hold_for_standbys(config, db, state, &envelopes, driver).await?;
        let (_, stalled) = deliver(config, db, state, &envelopes, &[], true, driver).await?;
        // Stalled (the bus refuses the bridge): only what went before counts.
        let done = stalled.unwrap_or(envelopes.len());
        state.stalled = stalled.is_some();
        let mut tops: BTreeMap<i32, i64> = BTreeMap::new();
        let mut late: Option<i64> = None;
        for p in &positions[..done] {
            match *p {
                Position::InOrder(node, seq) => {
                    let top = tops.entry(node).or_insert(seq);
                    *top = (*top).max(seq);
                }
                Position::Late(id) => late = Some(late.map_or(id, |l: i64| l.max(id))),
                Position::Outbox(_) => {}
            }
        }
        let nodes: Vec<i32> = tops.keys().copied().collect();
        let seqs: Vec<i64> = tops.values().copied().collect();
        db.client
            .execute(
                "SELECT envelopes.consumer_envelope_ack($1, $2, $3, $4)",
                &[&config.name, &nodes, &seqs, &late],
            )
            .await
            .map_err(|e| Failure::Database(e.into(), during("acknowledging", &envelopes)))?;
        crash::reached("after_ack");
        moved += done;
    }
    Ok(moved)
}

/// In `standby-flush` mode, holds the batch just read back until the standbys
/// have flushed the WAL it was read at ([`crate::standby`]). A database error
/// drops the batch (it is read again on the next session, wherever the URL
/// leads), so nothing is published that the standbys may not have.
async fn hold_for_standbys(
    config: &EgressConfig,
    db: &Db,
    state: &mut State,
    batch: &[Message],
    driver: &mut Driver,
) -> Result<(), Failure> {
    let metrics = driver.metrics().clone();
    let held = standby::Held {
        consumer: &config.name,
        oldest_us: oldest_us(batch),
    };
    match standby::wait_until_flushed(
        db,
        config.forward_after,
        &mut state.standby_names_seen,
        &held,
        &metrics,
        driver.shutdown(),
    )
    .await
    {
        Ok(()) => Ok(()),
        Err(WaitError::Shutdown) => Err(Failure::Shutdown),
        Err(WaitError::Database(e)) => Err(Failure::Database(
            e,
            "waiting for the standbys to flush the batch".into(),
        )),
    }
}

/// "`what` first..last", for log lines about a batch.
fn during(what: &str, batch: &[Message]) -> String {
    let first = batch.first().map(Message::dedup_id).unwrap_or_default();
    let last = batch.last().map(Message::dedup_id).unwrap_or_default();
    format!("{what} rows {first}..{last}")
}
