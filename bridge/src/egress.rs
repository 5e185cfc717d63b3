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

use crate::crash;
use crate::db::{self, Db};
use crate::lease::{self, Lease};
use crate::message::{Envelope, Message, OutboxMessage};
use crate::metrics::Metrics;
use crate::retry::{self, Backoff, Class, DbFailure, Driver, Fatal, Next, Wait};
use crate::sink::{Sink, SinkArgs, SinkError, SinkSpec};
use crate::standby::{self, ForwardAfter, WaitError};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
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

/// How often the lag is read when not every round.
const LAG_INTERVAL: Duration = Duration::from_secs(5);
/// With `--lag-every-round`, the least time between two lag reads while rows
/// flow: every round of a slow drain, at most ten a second of a fast one (a
/// read per 1,000-row round cost a fast drain a fifth of its rate).
const LAG_EVERY_ROUND: Duration = Duration::from_millis(100);
/// And at least this many times as long as the last read took: the reads take
/// at most about 3% of the drain's time however many originators the lag sums
/// over (`consumer_lag` takes about 80 ms at 10,000 originators all behind).
const LAG_COST_SHARE: u32 = 30;
/// How often the progress line is logged while catching up a backlog.
const PROGRESS_INTERVAL: Duration = Duration::from_secs(5);

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

/// How long after the bus pushed back on a message (a publisher nack: a queue
/// full with `reject-publish`) egress publishes one message per request.
/// Pipelining more into a queue at its limit lets a later message in when room
/// frees up just after an earlier one was refused, ahead of it: the order the
/// consumer sees breaks. One at a time costs a confirm round trip per message,
/// which is the consumer's pace anyway while the queue is full.
const PUSHBACK_CAREFUL: Duration = Duration::from_secs(5);

// After that, requests grow again from one message, doubling with each the
// bus takes, across batches (see `State::pushback_window`): a queue that was
// full a moment ago is sent no whole batch at once, where any room freed while
// the request is under way lets more of its later messages overtake.

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
    /// ([`PUSHBACK_CAREFUL`]), forgotten once it reaches a whole batch.
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
    /// rows (see [`BREAKER_ROWS`]): egress stalls instead of setting rows aside.
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

/// Refusals a sink decides from the row itself against a limit the bus stated
/// (NATS' max_payload and subject syntax, MQTT's topic syntax and maximum
/// packet size, Redis' proto-max-bulk-len): the row's own, never the bus
/// refusing the bridge, so they are set aside at once and never trip the
/// breaker (a limit below every row is what the start-up warning is for).
fn judged_by_the_row(code: &str) -> bool {
    matches!(
        code,
        "MAX_PAYLOAD" | "SUBJECT" | "TOPIC" | "MAX_PACKET_SIZE" | "PROTO_MAX_BULK_LEN"
    )
}

/// Whether a failed request or connect is the bus refusing the bridge itself
/// (its credentials, its permissions, the request as such: an HTTP 4xx, Redis
/// NOPERM), which waiting does not cure: `sink_refusing` says so.
fn refuses_the_bridge(error: &SinkError) -> bool {
    matches!(
        error,
        SinkError::Config { .. }
            | SinkError::Unavailable {
                permanent: true,
                ..
            }
    )
}

/// How many rounds in a row refused rows with nothing delivered after them are
/// read again before they are set aside (about 1.75 s of refusal delays).
const DEFER_ROUNDS: u32 = 3;

/// Refusals of this many different rows with the same code and nothing
/// delivered between them mean the bus refuses the bridge (an ACL for every
/// subject, revoked credentials, a proxy limit below every body), not the rows:
/// egress then keeps its position and order, sets nothing aside, alerts
/// (readiness false, `sink_stalled`, `errors_total{kind="permanent"}`, an ERROR
/// line every retry), asks the bus again on a new connection at the longest
/// backoff (no cache of refused subjects or bodies outlives the condition) and
/// resumes by itself once a row goes through. A refusal is judged per row, and
/// the row set aside, only when another row gets through after it.
const BREAKER_ROWS: usize = 3;

/// Logs one INFO line of what egress did every `every` (`--summary-secs`),
/// also while idle, so that a healthy bridge is seen to be one.
fn summarize(state: &mut State, metrics: &Metrics, every: Duration) {
    if every.is_zero() {
        return;
    }
    let (published, dead) = metrics.totals();
    // The first interval counts from the process' start.
    let (at, published_then, dead_then) = *state.summary.get_or_insert((Instant::now(), 0, 0));
    if at.elapsed() < every {
        return;
    }
    tracing::info!(
        forwarded = published.saturating_sub(published_then),
        dead_lettered = dead.saturating_sub(dead_then),
        lag_rows = metrics.lag_rows.get(),
        interval_s = at.elapsed().as_secs(),
        "egress summary"
    );
    state.summary = Some((Instant::now(), published, dead));
}

/// Warns once, naming both values, when the store accepts larger envelopes
/// than the sink takes (NATS' default max_payload is 1 MiB, the store's
/// envelopes.max_envelope_bytes 4 MB): such a row would be set aside as a dead
/// letter by the default setup.
async fn compare_limits(db: &Db, sink: &mut Sink) {
    let store_max = match db
        .client
        .query_opt(
            "SELECT s.setting::bigint * CASE s.unit WHEN 'kB' THEN 1024 WHEN 'MB' THEN 1048576
                    WHEN '8kB' THEN 8192 ELSE 1 END
               FROM pg_catalog.pg_settings s WHERE s.name = 'envelopes.max_envelope_bytes'",
            &[],
        )
        .await
    {
        Ok(Some(row)) => row.get::<_, i64>(0),
        Ok(None) => return,
        Err(e) => {
            tracing::debug!(error = %DbFailure::new(&e), "could not read envelopes.max_envelope_bytes");
            return;
        }
    };
    // What a message adds around the envelope: topic, ids, framing, headers.
    const FRAMING: u64 = 1024;
    let Ok(store_max) = u64::try_from(store_max) else {
        return;
    };
    if store_max == 0 {
        return;
    }
    let Some((sink_max, limit)) = sink.max_message_bytes(store_max + FRAMING).await else {
        return;
    };
    tracing::warn!(
        store_max_envelope_bytes = store_max,
        sink_max_message_bytes = sink_max,
        sink_limit = limit,
        "the store accepts envelopes up to {store_max} bytes \
                    (envelopes.max_envelope_bytes) but {limit} is {sink_max} bytes: a larger \
                    row would be set aside as a dead letter; lower envelopes.max_envelope_bytes \
                    below the sink's limit (less about 1 KB of framing) or raise the sink's"
    );
}

/// How often an idle egress asks its sink whether it still answers.
const SINK_CHECK_INTERVAL: Duration = Duration::from_secs(5);

/// Connects the sink if it is not connected, retrying as a batch would (a bus
/// that refuses the bridge before it ever worked ends it, exit 78), keeping the
/// database session alive meanwhile.
async fn ensure_sink(
    config: &EgressConfig,
    db: &Db,
    state: &mut State,
    driver: &mut Driver,
) -> Result<(), Failure> {
    let mut backoff = Backoff::new();
    while state.sink.is_none() {
        if driver.stopping() {
            return Err(Failure::Shutdown);
        }
        let metrics = driver.metrics().clone();
        // Connected, and asked once (a webhook's connect makes no connection).
        let connected = match Sink::connect(&config.sink, &config.name, &metrics).await {
            Ok(mut sink) => sink.check().await.map(|()| sink),
            Err(error) => Err(error),
        };
        match connected {
            Ok(mut sink) => {
                if !state.limits_compared {
                    state.limits_compared = true;
                    compare_limits(db, &mut sink).await;
                }
                state.sink = Some(sink);
                metrics.sink_stalled.set(0);
                if state.breaker.is_none() {
                    // The bus took the bridge's credentials again; a breaker
                    // waits for a row to go through.
                    metrics.sink_refusing.set(0);
                }
            }
            Err(error) => {
                metrics.sink_stalled.set(1);
                if refuses_the_bridge(&error) {
                    metrics.sink_refusing.set(1);
                }
                let failure = SinkFailure::Connecting {
                    error,
                    sink: &config.sink.sink,
                };
                wait_out(driver, &failure, &mut backoff).await?;
                db.heartbeat().await;
            }
        }
    }
    state.sink_checked = Some(Instant::now());
    Ok(())
}

/// Asks an idle sink whether it still answers; one that does not is connected
/// again (and /readyz says not ready meanwhile: `sink_stalled`).
async fn recheck_sink(
    config: &EgressConfig,
    db: &Db,
    state: &mut State,
    driver: &mut Driver,
) -> Result<(), Failure> {
    if let Some(sink) = state.sink.as_mut() {
        match sink.check().await {
            Ok(()) => {
                state.sink_checked = Some(Instant::now());
                return Ok(());
            }
            Err(error) => {
                tracing::warn!(error = %error, "the sink does not answer while idle; connecting again");
                driver.metrics().sink_stalled.set(1);
                driver.metrics().failed(&error);
                state.sink = None;
            }
        }
    }
    ensure_sink(config, db, state, driver).await
}

/// A row as read, with the position to acknowledge once it is delivered.
enum Position {
    Outbox(i64),
    /// In-order envelope: advances the originator's cursor.
    InOrder(i32, i64),
    /// From the late feed: advances the late-feed position.
    Late(i64),
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

/// Microseconds since the Unix epoch of a `timestamptz`, read in binary so that
/// no value can make the read fail (±infinity saturate).
struct UnixMicros(i64);

impl<'a> tokio_postgres::types::FromSql<'a> for UnixMicros {
    fn from_sql(
        _: &tokio_postgres::types::Type,
        raw: &'a [u8],
    ) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        let bytes: [u8; 8] = raw.try_into()?;
        // Postgres counts from 2000-01-01.
        const POSTGRES_EPOCH_US: i64 = 946_684_800_000_000;
        Ok(UnixMicros(
            i64::from_be_bytes(bytes).saturating_add(POSTGRES_EPOCH_US),
        ))
    }

    fn accepts(ty: &tokio_postgres::types::Type) -> bool {
        *ty == tokio_postgres::types::Type::TIMESTAMPTZ
    }
}

async fn read_outbox(
    db: &Db,
    config: &EgressConfig,
) -> Result<(Vec<Message>, Vec<Position>), DbFailure> {
    let rows = db
        .client
        .query(
            "SELECT id, subject, payload, headers::text, created_at
               FROM envelopes.consumer_outbox_batch($1, $2, $3)",
            &[&config.name, &config.batch_size, &config.batch_bytes],
        )
        .await?;
    let mut out = Vec::with_capacity(rows.len());
    let mut positions = Vec::with_capacity(rows.len());
    for row in rows {
        let id: i64 = row.get(0);
        positions.push(Position::Outbox(id));
        out.push(outbox_message(
            id,
            row.get(1),
            row.get(2),
            row.get(3),
            row.get::<_, UnixMicros>(4).0,
            config.outbox_scope.as_deref(),
        ));
    }
    Ok((out, positions))
}

fn outbox_message(
    id: i64,
    subject: String,
    payload: Vec<u8>,
    headers: String,
    created_at_us: i64,
    scope: Option<&str>,
) -> Message {
    Message::Outbox(OutboxMessage {
        id,
        subject,
        payload,
        headers: serde_json::from_str(&headers).unwrap_or(serde_json::Value::Null),
        created_at_us,
        scope: scope.map(str::to_owned),
    })
}

async fn read_envelopes(
    db: &Db,
    config: &EgressConfig,
) -> Result<(Vec<Message>, Vec<Position>), DbFailure> {
    let rows = db
        .client
        .query(
            "SELECT originator_node_id, originator_sequence_id, gateway_time,
                    topic, payer_id, expiry, originator_envelope, late_id
               FROM envelopes.consumer_envelope_batch($1, $2, $3)",
            &[&config.name, &config.batch_size, &config.batch_bytes],
        )
        .await?;
    let mut out = Vec::with_capacity(rows.len());
    let mut positions = Vec::with_capacity(rows.len());
    for row in rows {
        let (node, seq): (i32, i64) = (row.get(0), row.get(1));
        positions.push(match row.get::<_, Option<i64>>(7) {
            Some(late) => Position::Late(late),
            None => Position::InOrder(node, seq),
        });
        out.push(Message::Envelope(Envelope {
            originator_node_id: node,
            originator_sequence_id: seq,
            gateway_time_us: row.get::<_, UnixMicros>(2).0,
            topic: row.get(3),
            payer_id: row.get(4),
            expiry: row.get(5),
            originator_envelope: row.get(6),
        }));
    }
    Ok((out, positions))
}

/// Publishes until the bus has acknowledged every message of the batch, or
/// refused it: a refused message is set aside at once (see the module
/// documentation) and the messages after it are published. `prior[i]` is how
/// often message `i` was refused before (dead letters tried again; 0 when absent).
/// Returns the indices of the messages refused again. Only shutdown and database
/// errors (while recording a dead letter) end it early.
async fn deliver(
    config: &EgressConfig,
    db: &Db,
    state: &mut State,
    batch: &[Message],
    prior: &[u32],
    judge: bool,
    driver: &mut Driver,
) -> Result<(Vec<usize>, Option<usize>), Failure> {
    // Each batch backs off on its own, from the first delay.
    let mut backoff = Backoff::new();
    let metrics = driver.metrics().clone();
    let mut start = 0;
    // Messages per publish: the whole rest, halved while the bus refuses a
    // request as too large, doubled again after each one it takes.
    let mut window = batch.len().max(1);
    // While the bus pushed back recently, one message per request (see
    // [`PUSHBACK_CAREFUL`]).
    let careful = |state: &State| {
        state
            .pushed_back_at
            .is_some_and(|at| at.elapsed() < PUSHBACK_CAREFUL)
    };
    if careful(state) {
        window = 1;
    } else if let Some(grown) = state.pushback_window {
        window = grown.clamp(1, window);
    }
    let mut refused_again = Vec::new();
    // Refused rows of this batch not judged yet: (index, code, reason).
    let mut suspects: Vec<(usize, String, String)> = Vec::new();
    let mut lag_due = Instant::now() + LAG_INTERVAL;
    metrics.lag_seconds.set(batch_age(batch));
    crash::reached("before_publish");
    while start < batch.len() {
        if start > 0 || lag_due <= Instant::now() {
            // Still at it (the bus away, or refusing): the lag keeps growing.
            metrics.lag_seconds.set(batch_age(&batch[start..]));
            if lag_due <= Instant::now() {
                update_lag(db, &config.name, &metrics).await;
                lag_due = Instant::now() + LAG_INTERVAL;
            }
        }
        if state.sink.is_none() {
            match Sink::connect(&config.sink, &config.name, &metrics).await {
                Ok(s) => state.sink = Some(s),
                Err(error) => {
                    metrics.sink_stalled.set(1);
                    if refuses_the_bridge(&error) {
                        metrics.sink_refusing.set(1);
                    }
                    let failure = SinkFailure::Connecting {
                        error,
                        sink: &config.sink.sink,
                    };
                    wait_out(driver, &failure, &mut backoff).await?;
                    continue;
                }
            }
        }
        let Some(sink) = state.sink.as_mut() else {
            continue;
        };
        let end = (start + window).min(batch.len());
        let part = &batch[start..end];
        let started = Instant::now();
        // While the bus takes its time, the database session stays alive
        // (see `--session-timeout`).
        let published = {
            let publish = sink.publish(part);
            tokio::pin!(publish);
            let mut beat = tokio::time::interval_at(
                tokio::time::Instant::now() + db::heartbeat_interval(),
                db::heartbeat_interval(),
            );
            loop {
                tokio::select! {
                    result = &mut publish => break result,
                    _ = beat.tick() => db.heartbeat().await,
                }
            }
        };
        // The refused message's index in the batch, with the bus's code and reason.
        let refusal = match published {
            Ok(()) => {
                // Rows got through after the refused ones: those were refused
                // for themselves, and are set aside now.
                for (index, code, reason) in suspects.drain(..) {
                    let attempts = prior.get(index).copied().unwrap_or(0) + 1;
                    set_aside(
                        config,
                        db,
                        &batch[index],
                        &code,
                        &reason,
                        attempts,
                        &metrics,
                    )
                    .await?;
                    if index < prior.len() {
                        refused_again.push(index);
                    }
                }
                state.streak.clear();
                state.deferrals = 0;
                if let Some(code) = state.breaker.take() {
                    tracing::info!(code = %code, "the bus takes the bridge's rows again: delivery resumes");
                }
                metrics.sink_refusing.set(0);
                metrics.published(part);
                metrics.sink_stalled.set(0);
                state.sink_checked = Some(Instant::now());
                metrics
                    .batch_latency
                    .observe(started.elapsed().as_secs_f64());
                backoff.reset();
                start = end;
                if careful(state) {
                    window = 1;
                } else {
                    window = (window * 2).min(batch.len());
                    // After a push-back the next batch starts where this one
                    // got to, until requests are whole batches again.
                    if state.pushback_window.is_some() {
                        state.pushback_window =
                            (window < config.batch_size.max(1) as usize).then_some(window);
                    }
                }
                None
            }
            Err(SinkError::TooLarge { code, reason, .. }) if part.len() > 1 => {
                // Nothing of the request counts: send it again in halves.
                window = part.len() / 2;
                tracing::warn!(code = %code, reason = %reason, rows = part.len(), next_rows = window,
                               first_id = %part[0].dedup_id(),
                               "the bus refuses the request as too large; publishing it in halves");
                None
            }
            Err(SinkError::Backpressure {
                sink,
                delivered,
                overtaken,
                message,
            }) => {
                // What the bus took counts and is not published again; the
                // rest goes in requests no larger than what it just took
                // (doubling while it takes them), at the bus's pace.
                let delivered = delivered.min(part.len());
                metrics.published(&part[..delivered]);
                if delivered > 0 {
                    backoff.reset();
                }
                // One message per request for a while: a request larger than
                // the room the bus has lets a later message in when room frees
                // up after an earlier one was pushed back, ahead of it.
                window = 1;
                state.pushed_back_at = Some(Instant::now());
                state.pushback_window = Some(1);
                metrics.sink_stalled.set(1);
                metrics.republished.inc_by(overtaken as u64);
                let error = SinkError::Backpressure {
                    sink,
                    delivered,
                    overtaken,
                    message,
                };
                let failure = SinkFailure::Publishing { error, part };
                start += delivered;
                wait_out(driver, &failure, &mut backoff).await?;
                None
            }
            Err(error @ SinkError::Blocked { .. }) => {
                // Blocked past the sink's bound: give the lease up for a while
                // (the session ends, and its database session with it) so that
                // a standby on another broker node can take over.
                state.sink = None;
                metrics.sink_stalled.set(1);
                state.stand_aside_until = Some(Instant::now() + STAND_ASIDE);
                return Err(Failure::Blocked(error.to_string(), part.len()));
            }
            Err(SinkError::Refused {
                index,
                code,
                reason,
                ..
            }) => Some((start + index.min(part.len() - 1), code, reason)),
            // A single message refused as too large.
            Err(SinkError::TooLarge { code, reason, .. }) => Some((start, code, reason)),
            // Unavailable, or the bridge refused: nothing of the request counts;
            // it goes again, on a new connection.
            Err(error) => {
                state.sink = None;
                metrics.sink_stalled.set(1);
                if refuses_the_bridge(&error) {
                    metrics.sink_refusing.set(1);
                }
                wait_out(
                    driver,
                    &SinkFailure::Publishing { error, part },
                    &mut backoff,
                )
                .await?;
                None
            }
        };
        if let Some((index, code, reason)) = refusal {
            if index > start {
                // The bus took what came before the refused message: progress,
                // and the refusals before it were the rows' own.
                metrics.published(&batch[start..index]);
                backoff.reset();
                for (held, code, reason) in suspects.drain(..) {
                    let attempts = prior.get(held).copied().unwrap_or(0) + 1;
                    set_aside(config, db, &batch[held], &code, &reason, attempts, &metrics).await?;
                    if held < prior.len() {
                        refused_again.push(held);
                    }
                }
                state.streak.clear();
                state.deferrals = 0;
                if let Some(code) = state.breaker.take() {
                    tracing::info!(code = %code, "the bus takes the bridge's rows again: delivery resumes");
                }
                metrics.sink_refusing.set(0);
            }
            if judged_by_the_row(&code) {
                // The sink measured this row itself against a limit the bus
                // stated (its size, its subject): the row's own refusal.
                let attempts = prior.get(index).copied().unwrap_or(0) + 1;
                set_aside(
                    config,
                    db,
                    &batch[index],
                    &code,
                    &reason,
                    attempts,
                    &metrics,
                )
                .await?;
                if index < prior.len() {
                    refused_again.push(index);
                }
                start = index + 1;
                continue;
            }
            let id = batch[index].dedup_id();
            if !state.streak.iter().any(|(_, row)| *row == id) {
                state.streak.push((code.clone(), id));
            }
            // Not judged yet: set aside once another row gets through (or at
            // the end of the batch), unless the bus refuses the bridge.
            suspects.push((index, code, reason));
            // The window stays as it is: after a refusal found by halving
            // (413), the rows after it go in windows of that size again,
            // doubling while the bus takes them, instead of starting over
            // from the whole batch (which re-sent, or re-encoded, all of it
            // once per refused row).
            start = index + 1;
        }
    }
    // Refused rows at the end of the batch, nothing delivered after them.
    if let Some((from, code, reason)) = suspects.first().cloned() {
        let same = state
            .streak
            .iter()
            .rev()
            .take_while(|(c, _)| *c == code)
            .count();
        if judge && same >= BREAKER_ROWS {
            // The bus refuses the bridge: nothing is set aside; delivery stands
            // at the first row not judged, which is read again (with whatever
            // came after it) once the wait is over.
            if state.breaker.is_none() {
                tracing::error!(code = %code, reason = %reason, rows = same,
                                "the bus refuses every row with the same code and takes none \
                                 between them: it refuses the bridge (permissions, credentials, a \
                                 limit below every message), not the rows. Delivery stalls at its \
                                 position, nothing is set aside, and resumes by itself once the bus \
                                 takes a row");
                state.breaker = Some(code.clone());
            }
            metrics.sink_refusing.set(1);
            metrics.sink_stalled.set(1);
            // A new connection for the next attempt: no cache of what the bus
            // refused outlives the condition.
            state.sink = None;
            let error = SinkError::Unavailable {
                sink: "bus",
                message: format!(
                    "the bus refuses the bridge ({code}: {reason}); stalled at {}",
                    batch[from].dedup_id()
                ),
                retry_after: None,
                permanent: true,
            };
            let part = &batch[from..from + 1];
            wait_out(
                driver,
                &SinkFailure::Publishing { error, part },
                &mut backoff,
            )
            .await?;
            crash::reached("after_publish");
            return Ok((refused_again, Some(from)));
        }
        if judge && state.deferrals < DEFER_ROUNDS {
            // Nothing after them to judge by yet: read them again shortly,
            // with whatever comes after them, instead of setting them aside at
            // once (a bus that refuses every row reaches BREAKER_ROWS that
            // way without a row set aside; a row refused for itself alone is
            // set aside after DEFER_ROUNDS).
            state.deferrals += 1;
            if crate::shutdown::sleep(retry::refusal_delay(state.deferrals), driver.shutdown())
                .await
            {
                return Err(Failure::Shutdown);
            }
            crash::reached("after_publish");
            return Ok((refused_again, Some(from)));
        }
    }
    state.deferrals = 0;
    // Otherwise set aside as before (the streak goes on into the next batch, so
    // a bus that refuses every row still trips the breaker there).
    for (index, code, reason) in suspects.drain(..) {
        let attempts = prior.get(index).copied().unwrap_or(0) + 1;
        set_aside(
            config,
            db,
            &batch[index],
            &code,
            &reason,
            attempts,
            &metrics,
        )
        .await?;
        if index < prior.len() {
            refused_again.push(index);
        }
    }
    crash::reached("after_publish");
    Ok((refused_again, None))
}

/// Waits out a failed attempt at a batch ([`Driver::failed`]); `Err` when the
/// delivery ends instead (shutdown, or a configuration refused before any round
/// worked).
async fn wait_out(
    driver: &mut Driver,
    failure: &SinkFailure<'_>,
    backoff: &mut Backoff,
) -> Result<(), Failure> {
    match driver.failed(failure, backoff).await {
        Next::Retry => Ok(()),
        Next::Stop => Err(Failure::Shutdown),
        Next::Fatal(fatal) => Err(Failure::Fatal(fatal)),
    }
}

/// A sink that failed an attempt at a batch as a whole: it could not connect,
/// or the bus did not take the request. (A refusal of one message is no such
/// failure: the message is set aside and the rest goes on.)
enum SinkFailure<'a> {
    Connecting {
        error: SinkError,
        sink: &'a SinkSpec,
    },
    Publishing {
        error: SinkError,
        part: &'a [Message],
    },
}

/// How the driver retries and reports a sink's failure (see [`retry::Failure`]).
impl retry::Failure for SinkFailure<'_> {
    fn class(&self) -> Class {
        match self {
            SinkFailure::Connecting { error, .. } => Class::of_sink_connect(error),
            SinkFailure::Publishing { error, .. } => Class::of_sink_publish(error),
        }
    }

    fn not_before(&self) -> Duration {
        match self {
            SinkFailure::Publishing {
                error:
                    SinkError::Unavailable {
                        retry_after: Some(after),
                        ..
                    },
                ..
            } => *after,
            _ => Duration::ZERO,
        }
    }

    /// Every failure of a sink counts in `errors_total` (transient or permanent).
    fn counts_as_error(&self) -> bool {
        true
    }

    fn what(&self) -> String {
        match self {
            SinkFailure::Connecting { error, .. } => format!("connecting to the bus: {error}"),
            SinkFailure::Publishing { error, .. } => format!("publishing: {error}"),
        }
    }

    fn log(&self, wait: Wait) {
        match self {
            SinkFailure::Connecting { error, sink } => match wait {
                Wait::Longest => {
                    tracing::error!(error = %error, sink = %sink,
                                    "the bus refuses the bridge's configuration; retrying at \
                                     the longest backoff until it is fixed")
                }
                Wait::Backoff(_) => {
                    tracing::warn!(error = %error, sink = %sink, "bus unavailable, retrying")
                }
            },
            SinkFailure::Publishing { error, part } => {
                let first_id = part.first().map(Message::dedup_id).unwrap_or_default();
                let last_id = part.last().map(Message::dedup_id).unwrap_or_default();
                match error {
                    SinkError::Unavailable {
                        permanent: true, ..
                    } => {
                        tracing::error!(error = %error, first_id = %first_id, last_id = %last_id,
                                        rows = part.len(),
                                        "the bus refuses the request; retrying at the longest \
                                         backoff until it is fixed (nothing is skipped)")
                    }
                    SinkError::Backpressure { delivered, .. } => {
                        tracing::warn!(error = %error, first_id = %first_id, last_id = %last_id,
                                       rows = part.len(), delivered,
                                       retry_in_ms = wait.millis(),
                                       "the bus pushes back: what it took counts, the rest goes \
                                        again in smaller requests at its pace")
                    }
                    SinkError::Unavailable { retry_after, .. } => {
                        tracing::warn!(error = %error, first_id = %first_id, last_id = %last_id,
                                       rows = part.len(),
                                       retry_after_ms = retry_after.map(|d| d.as_millis() as u64),
                                       "publish failed, retrying the batch")
                    }
                    _ => {
                        tracing::error!(error = %error,
                                        "the bus refuses the bridge; retrying at the longest backoff")
                    }
                }
            }
        }
    }

    fn fatal(&self) -> Fatal {
        let error = match self {
            SinkFailure::Connecting { error, .. } | SinkFailure::Publishing { error, .. } => error,
        };
        // A sink that refuses the bridge names the fix itself, in its own
        // terms; the general one only where it did not.
        let hint = match error {
            SinkError::Config { message, .. } if message.contains("(check ") => "",
            _ => "check the sink's URL, credentials and virtual host",
        };
        Fatal::new(error, hint)
    }
}

/// Records a message its bus refused in `envelopes.dead_letters`, with when the
/// bridge will try it again (none once `attempts` reached `--dead-letter-after`),
/// logs and counts it.
async fn set_aside(
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

async fn record_dead_letter(
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
async fn retry_dead_letters(
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

/// Reads how far the consumer is behind (`consumer_lag`: the rows it can read
/// and has not acknowledged, cheap enough for every round of a catch-up).
async fn update_lag(db: &Db, name: &str, metrics: &Metrics) {
    match db
        .client
        .query_one("SELECT envelopes.consumer_lag($1)", &[&name])
        .await
    {
        Ok(row) => {
            metrics.lag_rows.set(row.get::<_, i64>(0));
        }
        Err(e) => tracing::debug!(error = %DbFailure::new(&e), "could not read the consumer's lag"),
    }
}

/// How old the oldest row of a batch is: while the batch waits for the bus,
/// the consumer's lag in time.
fn batch_age(batch: &[Message]) -> f64 {
    let oldest = oldest_us(batch);
    let now = SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0);
    oldest.map_or(0.0, |t| (now.saturating_sub(t)).max(0) as f64 / 1e6)
}

/// When the oldest row of a batch was written (µs since the epoch).
fn oldest_us(batch: &[Message]) -> Option<i64> {
    batch
        .iter()
        .map(|m| match m {
            Message::Envelope(e) => e.gateway_time_us,
            Message::Outbox(o) => o.created_at_us,
        })
        .min()
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

    fn add(&mut self, rows: usize, full_batch: bool, metrics: &Metrics) {
        self.rows += rows;
        if full_batch && !self.catching_up {
            self.catching_up = true;
            self.since = Instant::now();
            self.rows = rows;
            tracing::info!("backlog detected, catching up");
        }
        if self.catching_up && self.since.elapsed() >= PROGRESS_INTERVAL {
            let rate = self.rows as f64 / self.since.elapsed().as_secs_f64();
            let remaining = metrics.lag_rows.get().max(0);
            let eta_seconds = if rate > 0.0 {
                (remaining as f64 / rate).round() as u64
            } else {
                0
            };
            tracing::info!(
                rows = self.rows,
                rows_per_second = rate as u64,
                remaining,
                eta_seconds,
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
