//! Refuses a database URL that leads through a pooler in transaction or
//! statement mode (PgBouncer `pool_mode = transaction` / `statement`): the
//! bridge's lease is a session-level lock and its positions are acknowledged
//! under it, so it needs a server session of its own. Behind such a pooler
//! bridges flip between active and standby, fail their own acknowledgements
//! (55006), and leave a lease on an idle pooled server connection.
//!
//! The check, at each session's start: the session asks for its backend's pid;
//! a probe session opens a transaction (which pins a server connection in any
//! pool mode) and asks for its own; the first session asks again. On Postgres
//! itself, or through a session-mode pooler, the probe's pid is another and the
//! first session's is unchanged. Through a transaction-mode pooler the probe
//! usually gets the very server connection the first session just released
//! (PgBouncer hands out the most recently used one), or else the first session
//! moves to another one or waits for one. A statement-mode pooler refuses the
//! transaction block.
//!
//! "Usually": a pool can hold several idle server connections in an order the
//! bridge does not control (a connection the pooler opened for a moment's
//! demand joins at the head), so one probe can miss. Up to [`PROBES`] probes
//! are tried, each keeping its transaction (and its server connection) open,
//! so that every round leaves one idle connection fewer to miss on. The pids
//! are read with the simple query protocol: a prepared statement's
//! close after it runs is another pooled round trip, which could itself make
//! the pooler open a connection between the two sessions' statements.

use crate::db::{self, Db};
use crate::retry::{Class, DbFailure};
use std::time::Duration;
use tokio_postgres::{Client, SimpleQueryMessage};

/// How long the first session's statement may wait for a server connection
/// (a pool whose connections the probes hold).
const WAIT: Duration = Duration::from_secs(5);

/// How many probe sessions, each holding a transaction open, the check opens
/// at most before it takes the first session for one of its own.
const PROBES: usize = 3;

fn pooled(what: String) -> DbFailure {
    DbFailure {
        sqlstate: None,
        hint: Some(
            "point --database-url at Postgres itself or at a pool in session mode \
             (PgBouncer pool_mode = session)"
                .into(),
        ),
        class: Class::Config,
        message: format!(
            "--database-url leads through a connection pooler in transaction or statement mode: \
             {what}. The bridge's lease is a session-level lock and needs a server session of its \
             own: point --database-url at Postgres itself or at a pool in session mode \
             (PgBouncer pool_mode = session)"
        ),
    }
}

/// The pid of the backend that runs this statement (simple query protocol).
async fn backend_pid(client: &Client) -> Result<i32, DbFailure> {
    let messages = client
        .simple_query("SELECT pg_catalog.pg_backend_pid()")
        .await?;
    messages
        .iter()
        .find_map(|m| match m {
            SimpleQueryMessage::Row(row) => row.get(0).and_then(|pid| pid.parse().ok()),
            _ => None,
        })
        .ok_or_else(|| DbFailure {
            sqlstate: None,
            hint: None,
            class: Class::Transient,
            message: "pg_backend_pid() returned no row".into(),
        })
}

/// `Err` (class config) when `db`'s statements do not keep one server session.
pub async fn check(url: &str, db: &Db) -> Result<(), DbFailure> {
    let first = backend_pid(&db.client).await?;
    let mut probes = Vec::with_capacity(PROBES);
    let verdict = probe(url, db, first, &mut probes).await;
    for held in &probes {
        let _ = held.client.batch_execute("ROLLBACK").await;
    }
    verdict
}

/// The probe rounds; each probe session opened is pushed on `probes`, its
/// transaction still open, for the caller to roll back.
async fn probe(url: &str, db: &Db, first: i32, probes: &mut Vec<Db>) -> Result<(), DbFailure> {
    for _ in 0..PROBES {
        let other = db::connect(url, "envelopes-bridge pooler check").await?;
        if let Err(e) = other.client.batch_execute("BEGIN").await {
            let e = DbFailure::new(&e);
            // PgBouncer in statement mode answers 08P01 ("transaction blocks
            // not allowed in statement pooling mode"); Postgres never refuses a
            // plain BEGIN so, and anything else (a lost connection) is retried.
            return match e.sqlstate.as_deref() {
                Some("08P01") => Err(pooled(format!("a transaction block was refused ({e})"))),
                _ => Err(e),
            };
        }
        let held = backend_pid(&other.client).await;
        probes.push(other);
        let held = held?;
        if held == first {
            return Err(pooled(format!(
                "another session's transaction ran on this session's server backend (pid \
                 {first})"
            )));
        }
        match tokio::time::timeout(WAIT, backend_pid(&db.client)).await {
            Err(_) => {
                return Err(pooled(format!(
                    "a statement waited {} s for a server connection while other sessions held \
                     theirs in transactions",
                    WAIT.as_secs()
                )))
            }
            Ok(again) => {
                let again = again?;
                if again != first {
                    return Err(pooled(format!(
                        "the server backend changed between two statements of one session (pid \
                         {first}, then {again}; pid {held} went to another session meanwhile)"
                    )));
                }
            }
        }
    }
    Ok(())
}
