//! Delivering one batch: publishing it in windows until the bus has taken or
//! refused every message, backing off while the bus is away or pushes back,
//! and judging refusals (the row's own, set aside; or the bus refusing the
//! bridge, which stalls delivery at its position: the breaker).

use super::dead_letter::set_aside;
use super::lag::{batch_age, update_lag, LAG_INTERVAL};
use super::{EgressConfig, Failure, State, STAND_ASIDE};
use crate::crash;
use crate::db::{self, Db};
use crate::message::Message;
use crate::metrics::Metrics;
use crate::retry::{self, Backoff, Class, Driver, Fatal, Next, Wait};
use crate::sink::{Sink, SinkError, SinkSpec};
use std::time::{Duration, Instant};

/// How long after the bus pushed back on a message (a publisher nack: a queue
/// full with `reject-publish`) egress publishes one message per request.
/// Pipelining more into a queue at its limit lets a later message in when room
/// frees up just after an earlier one was refused, ahead of it: the order the
/// consumer sees breaks. One at a time costs a confirm round trip per message,
/// which is the consumer's pace anyway while the queue is full.
pub(super) const PUSHBACK_CAREFUL: Duration = Duration::from_secs(5);

// After that, requests grow again from one message, doubling with each the
// bus takes, across batches (see `State::pushback_window`): a queue that was
// full a moment ago is sent no whole batch at once, where any room freed while
// the request is under way lets more of its later messages overtake.

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
pub(super) const BREAKER_ROWS: usize = 3;

/// Publishes until the bus has acknowledged every message of the batch, or
/// refused it: a refused message is set aside at once (see the module
/// documentation) and the messages after it are published. `prior[i]` is how
/// often message `i` was refused before (dead letters tried again; 0 when absent).
/// Returns the indices of the messages refused again. Only shutdown and database
/// errors (while recording a dead letter) end it early.
pub(super) async fn deliver(
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
                    connect_failed(config, driver, error, &mut backoff).await?;
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
                let held = suspects.drain(..);
                set_aside_rows(config, db, batch, prior, held, &mut refused_again, &metrics)
                    .await?;
                rows_got_through(state, &metrics);
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
                let held = suspects.drain(..);
                set_aside_rows(config, db, batch, prior, held, &mut refused_again, &metrics)
                    .await?;
                rows_got_through(state, &metrics);
            }
            if judged_by_the_row(&code) {
                // The sink measured this row itself against a limit the bus
                // stated (its size, its subject): the row's own refusal.
                let row = [(index, code, reason)];
                set_aside_rows(config, db, batch, prior, row, &mut refused_again, &metrics).await?;
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
    let held = suspects.drain(..);
    set_aside_rows(config, db, batch, prior, held, &mut refused_again, &metrics).await?;
    crash::reached("after_publish");
    Ok((refused_again, None))
}

/// Sets aside the refused rows of `batch` ((index, code, reason): each with its
/// attempts counted on from `prior`) and notes in `refused_again` those that
/// were dead letters tried again.
async fn set_aside_rows(
    config: &EgressConfig,
    db: &Db,
    batch: &[Message],
    prior: &[u32],
    rows: impl IntoIterator<Item = (usize, String, String)>,
    refused_again: &mut Vec<usize>,
    metrics: &Metrics,
) -> Result<(), Failure> {
    for (index, code, reason) in rows {
        let attempts = prior.get(index).copied().unwrap_or(0) + 1;
        set_aside(config, db, &batch[index], &code, &reason, attempts, metrics).await?;
        if index < prior.len() {
            refused_again.push(index);
        }
    }
    Ok(())
}

/// A row got through after refused ones: those were the rows' own refusals,
/// so the streak ends and a tripped breaker resets.
fn rows_got_through(state: &mut State, metrics: &Metrics) {
    state.streak.clear();
    state.deferrals = 0;
    if let Some(code) = state.breaker.take() {
        tracing::info!(code = %code, "the bus takes the bridge's rows again: delivery resumes");
    }
    metrics.sink_refusing.set(0);
}

/// A sink that could not connect: stalled (and refusing, when the bus refuses
/// the bridge itself) while the attempt is waited out.
pub(super) async fn connect_failed(
    config: &EgressConfig,
    driver: &mut Driver,
    error: SinkError,
    backoff: &mut Backoff,
) -> Result<(), Failure> {
    let metrics = driver.metrics();
    metrics.sink_stalled.set(1);
    if refuses_the_bridge(&error) {
        metrics.sink_refusing.set(1);
    }
    let failure = SinkFailure::Connecting {
        error,
        sink: &config.sink.sink,
    };
    wait_out(driver, &failure, backoff).await
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
