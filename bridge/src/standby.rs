//! `--forward-after standby-flush|commit`: when a batch may go to the bus.
//!
//! A transaction whose wait for the synchronous standbys ends early (its
//! `statement_timeout`, `pg_cancel_backend`, a client that goes away, a primary
//! restart) is committed and visible on the primary although no standby has its
//! commit record. Forwarded at once, its rows reach the bus; if the primary then
//! dies and a standby is promoted, the store no longer has them, but the bus
//! does — a phantom, which JetStream's dedup window even uses to drop the
//! different envelope written later under the same id.
//!
//! In `standby-flush` mode the bridge therefore reads the WAL insert position
//! right after it read a batch (`pg_current_wal_insert_lsn()`, in a statement
//! after the read: every commit the read saw was inserted into the WAL before
//! it became visible, so its record ends at or before that position — the
//! insert position rather than `pg_current_wal_lsn()`, the write position,
//! because with `synchronous_commit = off` a commit is visible before its record
//! is written), and publishes the batch only once the standbys that count have
//! flushed WAL up to there (`pg_stat_replication.flush_lsn`, read through the
//! extension's `standby_flush_positions()`, which a consumer role may call:
//! the view hides other users' positions from it). Which standbys count:
//!
//! * with `synchronous_standby_names` set, the synchronous ones, as many as it
//!   asks for (`FIRST n (...)`, `ANY n (...)`, `n (...)`, a plain list: 1) —
//!   the ones a commit waits for, so the ones an operator promotes;
//! * without it (asynchronous replication, the mode asked for explicitly),
//!   every standby that is streaming, and at least one.
//!
//! While the standbys lag the bridge polls, sleeping 0.25 ms and then half as
//! long again each time up to 100 ms, never spinning; after a second it logs why it waits (no
//! standby connected, how many have flushed) and again every 10 s, and
//! `envelopes_bridge_standby_waiting` is 1. It never publishes the batch until
//! the condition holds: a lost connection drops the batch, which is read again
//! (on the promoted standby, through a multi-host URL, where a phantom row
//! simply is not there to read).
//!
//! `auto` (the default) is `standby-flush` while `synchronous_standby_names` is
//! set and `commit` otherwise, asked anew for every batch (a reload may change it).

use crate::db::Db;
use crate::metrics::Metrics;
use crate::retry::DbFailure;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// When the bridge publishes a batch it read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ForwardAfter {
    /// `standby-flush` while `synchronous_standby_names` is set, else `commit`.
    Auto,
    /// Once the synchronous standbys (without `synchronous_standby_names`: every
    /// streaming standby, at least one) have flushed the WAL the batch was read at.
    StandbyFlush,
    /// As soon as the rows are committed and visible on the primary.
    Commit,
}

/// How many synchronous standbys `synchronous_standby_names` asks for; `None`
/// when it is empty (no synchronous replication). A value Postgres would not
/// accept never reaches here (the server refuses it); what is not understood
/// counts as 1, the least a non-empty setting asks for.
pub fn required_standbys(names: &str) -> Option<u32> {
    let text = names.trim();
    if text.is_empty() {
        return None;
    }
    let upper = text.to_ascii_uppercase();
    let rest = upper
        .strip_prefix("FIRST")
        .or_else(|| upper.strip_prefix("ANY"))
        .filter(|r| r.starts_with(|c: char| c.is_ascii_whitespace()))
        .unwrap_or(&upper)
        .trim_start();
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    let after = rest[digits.len()..].trim_start();
    match digits.parse::<u32>() {
        Ok(n) if after.starts_with('(') => Some(n.max(1)),
        _ => Some(1),
    }
}

/// What the standbys have flushed, against the position a batch was read at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replication {
    /// `synchronous_standby_names` on the primary.
    pub names: String,
    /// Standbys streaming.
    pub streaming: i64,
    /// Streaming standbys that flushed past the target.
    pub streaming_flushed: i64,
    /// Synchronous standbys (`sync_state` sync or quorum).
    pub synchronous: i64,
    /// Synchronous standbys that flushed past the target.
    pub synchronous_flushed: i64,
}

impl Replication {
    /// `None` when the batch may go; else why it waits.
    pub fn waiting_for(&self) -> Option<String> {
        match required_standbys(&self.names) {
            Some(needed) => {
                if self.synchronous_flushed >= i64::from(needed) {
                    None
                } else if self.streaming == 0 {
                    Some(format!(
                        "no standby is connected (synchronous_standby_names = '{}' asks for {needed})",
                        self.names
                    ))
                } else {
                    Some(format!(
                        "{} of the {needed} synchronous standbys needed have flushed the batch's WAL \
                         ({} synchronous, {} streaming; synchronous_standby_names = '{}')",
                        self.synchronous_flushed, self.synchronous, self.streaming, self.names
                    ))
                }
            }
            None => {
                if self.streaming == 0 {
                    Some(
                        "no standby is connected (standby-flush mode without \
                         synchronous_standby_names waits for every streaming standby, at least one)"
                            .to_owned(),
                    )
                } else if self.streaming_flushed < self.streaming {
                    Some(format!(
                        "{} of the {} streaming standbys have flushed the batch's WAL",
                        self.streaming_flushed, self.streaming
                    ))
                } else {
                    None
                }
            }
        }
    }
}

/// The replication state against `target` (an LSN as text), or, when `None`,
/// against the WAL insert position read by the same statement (once, before
/// the standbys' positions); one round trip. Returns the target with it.
pub async fn replication(
    db: &Db,
    target: Option<&str>,
) -> Result<(String, Replication), DbFailure> {
    let row = db
        .client
        .query_one(
            "WITH t AS MATERIALIZED (
                 SELECT COALESCE($1::text::pg_lsn, pg_catalog.pg_current_wal_insert_lsn()) AS lsn)
             SELECT t.lsn::text,
                    pg_catalog.current_setting('synchronous_standby_names'),
                    count(*) FILTER (WHERE s.state = 'streaming'),
                    count(*) FILTER (WHERE s.state = 'streaming' AND s.flush_lsn >= t.lsn),
                    count(*) FILTER (WHERE s.sync_state IN ('sync', 'quorum')),
                    count(*) FILTER (WHERE s.sync_state IN ('sync', 'quorum')
                                       AND s.flush_lsn >= t.lsn)
               FROM t LEFT JOIN envelopes.standby_flush_positions() s ON true
              GROUP BY t.lsn",
            &[&target],
        )
        .await?;
    Ok((
        row.get(0),
        Replication {
            names: row.get(1),
            streaming: row.get(2),
            streaming_flushed: row.get(3),
            synchronous: row.get(4),
            synchronous_flushed: row.get(5),
        },
    ))
}

/// The first poll's sleep, and the longest; each sleep is half as long again as
/// the one before. On loopback a synchronous standby reports its flush within a
/// millisecond or two: short first sleeps keep the added latency near that,
/// and the growth keeps a long wait (no standby) at ten polls a second.
const FIRST_POLL: Duration = Duration::from_micros(250);
const LONGEST_POLL: Duration = Duration::from_millis(100);
/// After this long waiting the bridge says why, and then every `REPEAT_LOG`.
const LOG_AFTER: Duration = Duration::from_secs(1);
const REPEAT_LOG: Duration = Duration::from_secs(10);

/// Why the wait ended without the batch being cleared for publishing.
pub enum WaitError {
    Database(DbFailure),
    Shutdown,
}

/// How often the lag's rows are read while a batch is held back.
const LAG_DURING_WAIT: Duration = Duration::from_secs(1);

/// The batch held back, for the lag metrics while it waits.
pub struct Held<'a> {
    /// The consumer (for `consumer_lag`).
    pub consumer: &'a str,
    /// When the oldest row of the batch was written (µs since the epoch).
    pub oldest_us: Option<i64>,
}

impl Held<'_> {
    fn age_seconds(&self) -> f64 {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_micros() as i64)
            .unwrap_or(0);
        self.oldest_us
            .map_or(0.0, |t| now.saturating_sub(t).max(0) as f64 / 1e6)
    }
}

/// Waits, in `mode`, until the batch just read may be published. Call it right
/// after the read returned, on the same session. `names_seen` carries between
/// calls whether `synchronous_standby_names` was set at the last one: in auto
/// mode while it is not, one light statement asks for it (no call of
/// `standby_flush_positions()`, which a role granted by hand before 0.4.0 may
/// not have); while it is, the target and the standbys' positions come in one.
pub async fn wait_until_flushed(
    db: &Db,
    mode: ForwardAfter,
    names_seen: &mut bool,
    held: &Held<'_>,
    metrics: &Metrics,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<(), WaitError> {
    if mode == ForwardAfter::Commit {
        return Ok(());
    }
    // The target, read after the batch (see the module documentation).
    let (target, first) = if mode == ForwardAfter::Auto && !*names_seen {
        let row = db
            .client
            .query_one(
                "SELECT pg_catalog.current_setting('synchronous_standby_names'),
                        pg_catalog.pg_current_wal_insert_lsn()::text",
                &[],
            )
            .await
            .map_err(|e| WaitError::Database(e.into()))?;
        let names: String = row.get(0);
        if names.trim().is_empty() {
            return Ok(());
        }
        (row.get::<_, String>(1), None)
    } else {
        let (target, state) = replication(db, None).await.map_err(WaitError::Database)?;
        (target, Some(state))
    };
    *names_seen = true;
    let mut first = first;
    let started = Instant::now();
    let mut poll = FIRST_POLL;
    let mut log_due = started + LOG_AFTER;
    let mut logged = false;
    let mut polls = 0u32;
    // What the wait has added to standby_wait_seconds so far: it grows during a
    // wait, not only once it ends.
    let mut counted = Instant::now();
    let mut lag_due = started;
    let result = loop {
        polls += 1;
        let state = match first.take() {
            Some(state) => state,
            None => match replication(db, Some(&target)).await {
                Ok((_, state)) => state,
                Err(e) => break Err(WaitError::Database(e)),
            },
        };
        // In auto mode a reload that empties the setting ends the wait.
        let Some(why) = (if mode == ForwardAfter::Auto && state.names.trim().is_empty() {
            *names_seen = false;
            None
        } else {
            state.waiting_for()
        }) else {
            break Ok(());
        };
        metrics.standby_waiting.set(1);
        metrics
            .standby_wait_seconds
            .inc_by(counted.elapsed().as_secs_f64());
        counted = Instant::now();
        // The held rows are lag: its age from the oldest of them, its rows
        // from the database (at most once a second).
        metrics.lag_seconds.set(held.age_seconds());
        if Instant::now() >= lag_due {
            if let Ok(row) = db
                .client
                .query_one("SELECT envelopes.consumer_lag($1)", &[&held.consumer])
                .await
            {
                metrics.lag_rows.set(row.get::<_, i64>(0));
            }
            lag_due = Instant::now() + LAG_DURING_WAIT;
        }
        if Instant::now() >= log_due {
            tracing::warn!(target_lsn = %target, waited_ms = started.elapsed().as_millis() as u64,
                           reason = %why,
                           "standby-flush: holding the batch back until the standbys have flushed it");
            log_due = Instant::now() + REPEAT_LOG;
            logged = true;
        }
        if crate::shutdown::sleep(poll, shutdown).await {
            break Err(WaitError::Shutdown);
        }
        poll = (poll * 3 / 2).min(LONGEST_POLL);
    };
    metrics.standby_waiting.set(0);
    metrics
        .standby_wait_seconds
        .inc_by(counted.elapsed().as_secs_f64());
    tracing::debug!(target_lsn = %target, waited_us = started.elapsed().as_micros() as u64, polls,
                    "standby-flush: wait over");
    if logged && result.is_ok() {
        tracing::info!(target_lsn = %target, waited_ms = started.elapsed().as_millis() as u64,
                       "standby-flush: the standbys have flushed the batch; publishing");
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn how_many_standbys_the_setting_asks_for() {
        assert_eq!(required_standbys(""), None);
        assert_eq!(required_standbys("  "), None);
        assert_eq!(required_standbys("s1"), Some(1));
        assert_eq!(required_standbys("s1, s2"), Some(1));
        assert_eq!(required_standbys("*"), Some(1));
        assert_eq!(required_standbys("FIRST 2 (s1, s2, s3)"), Some(2));
        assert_eq!(required_standbys("first 2(s1, s2)"), Some(2));
        assert_eq!(required_standbys("ANY 3 (a, b, c, d)"), Some(3));
        assert_eq!(required_standbys("any 1 (\"s 1\", s2)"), Some(1));
        assert_eq!(required_standbys("2 (s1, s2)"), Some(2));
        assert_eq!(required_standbys("firsts"), Some(1)); // a standby named so
        assert_eq!(required_standbys("ANY 99999999999 (a)"), Some(1));
    }

    fn state(
        names: &str,
        streaming: i64,
        flushed: i64,
        sync: i64,
        sync_flushed: i64,
    ) -> Replication {
        Replication {
            names: names.into(),
            streaming,
            streaming_flushed: flushed,
            synchronous: sync,
            synchronous_flushed: sync_flushed,
        }
    }

    #[test]
    fn a_batch_waits_for_the_standbys_that_count() {
        // Synchronous: as many synchronous standbys as asked for.
        assert!(state("s1", 0, 0, 0, 0)
            .waiting_for()
            .unwrap()
            .contains("no standby"));
        assert!(state("s1", 1, 1, 0, 0).waiting_for().is_some()); // an async one only
        assert_eq!(state("s1", 1, 1, 1, 1).waiting_for(), None);
        assert!(state("ANY 2 (a, b, c)", 3, 3, 3, 1).waiting_for().is_some());
        assert_eq!(state("ANY 2 (a, b, c)", 3, 2, 3, 2).waiting_for(), None);
        // Asynchronous: every streaming standby, at least one.
        assert!(state("", 0, 0, 0, 0).waiting_for().is_some());
        assert!(state("", 2, 1, 0, 0).waiting_for().is_some());
        assert_eq!(state("", 2, 2, 0, 0).waiting_for(), None);
    }
}
