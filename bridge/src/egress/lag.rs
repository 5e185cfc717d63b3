//! What egress tells about itself: the consumer's lag (rows and age), the
//! progress line while it catches up a backlog, and the periodic summary.

use super::State;
use crate::db::Db;
use crate::message::Message;
use crate::metrics::Metrics;
use crate::retry::DbFailure;
use std::time::{Duration, Instant, SystemTime};

/// How often the lag is read when not every round.
pub(super) const LAG_INTERVAL: Duration = Duration::from_secs(5);
/// With `--lag-every-round`, the least time between two lag reads while rows
/// flow: every round of a slow drain, at most ten a second of a fast one (a
/// read per 1,000-row round cost a fast drain a fifth of its rate).
pub(super) const LAG_EVERY_ROUND: Duration = Duration::from_millis(100);
/// And at least this many times as long as the last read took: the reads take
/// at most about 3% of the drain's time however many originators the lag sums
/// over (`consumer_lag` takes about 80 ms at 10,000 originators all behind).
pub(super) const LAG_COST_SHARE: u32 = 30;
/// How often the progress line is logged while catching up a backlog.
pub(super) const PROGRESS_INTERVAL: Duration = Duration::from_secs(5);

/// Logs one INFO line of what egress did every `every` (`--summary-secs`),
/// also while idle, so that a healthy bridge is seen to be one.
pub(super) fn summarize(state: &mut State, metrics: &Metrics, every: Duration) {
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

/// Reads how far the consumer is behind (`consumer_lag`: the rows it can read
/// and has not acknowledged, cheap enough for every round of a catch-up).
pub(super) async fn update_lag(db: &Db, name: &str, metrics: &Metrics) {
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
pub(super) fn batch_age(batch: &[Message]) -> f64 {
    let oldest = oldest_us(batch);
    let now = SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0);
    oldest.map_or(0.0, |t| (now.saturating_sub(t)).max(0) as f64 / 1e6)
}

/// When the oldest row of a batch was written (µs since the epoch).
pub(super) fn oldest_us(batch: &[Message]) -> Option<i64> {
    batch
        .iter()
        .map(|m| match m {
            Message::Envelope(e) => e.gateway_time_us,
            Message::Outbox(o) => o.created_at_us,
        })
        .min()
}

/// A progress line while catching up a large backlog.
pub(super) struct Progress {
    since: Instant,
    rows: usize,
    catching_up: bool,
}

impl Progress {
    pub(super) fn new() -> Progress {
        Progress {
            since: Instant::now(),
            rows: 0,
            catching_up: false,
        }
    }

    pub(super) fn add(&mut self, rows: usize, full_batch: bool, metrics: &Metrics) {
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

    pub(super) fn idle(&mut self) {
        if self.catching_up {
            tracing::info!("caught up");
            self.catching_up = false;
        }
    }
}
