//! Refuses a database URL that leads through a pooler in transaction or
//! statement mode (PgBouncer `pool_mode = transaction` / `statement`): the
//! bridge's lease is a session-level lock and its positions are acknowledged
//! under it, so it needs a server session of its own. Behind such a pooler
//! bridges flip between active and standby, fail their own acknowledgements
//! (55006), and leave a lease on an idle pooled server connection.
//!
//! The check, at each session's start: the session asks for its backend's pid;
//! a second session opens a transaction (which pins a server connection in
//! any pool mode, and which a transaction-mode pooler hands the one the first
//! session just released: PgBouncer reuses the most recent); the first session
//! asks again. On Postgres itself, or through a session-mode pooler, the pid is
//! the same; through a transaction-mode pooler it changed (or the first session
//! waits for a server connection the open transaction holds); a
//! statement-mode pooler refuses the transaction block.

use crate::db::{self, Db};
use crate::retry::{Class, DbFailure};
use std::time::Duration;

/// How long the first session's second statement may wait for a server
/// connection (a pool of one held by the probe's open transaction).
const WAIT: Duration = Duration::from_secs(5);

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

/// `Err` (class config) when `db`'s statements do not keep one server session.
pub async fn check(url: &str, db: &Db) -> Result<(), DbFailure> {
    let pid = "SELECT pg_catalog.pg_backend_pid()";
    let first: i32 = db.client.query_one(pid, &[]).await?.get(0);
    let other = db::connect(url, "envelopes-bridge pooler check").await?;
    if let Err(e) = other.client.batch_execute("BEGIN").await {
        let e = DbFailure::new(&e);
        // PgBouncer in statement mode answers 08P01 ("transaction blocks not
        // allowed in statement pooling mode"); Postgres never refuses a plain
        // BEGIN so, and anything else (a lost connection) is retried.
        return match e.sqlstate.as_deref() {
            Some("08P01") => Err(pooled(format!("a transaction block was refused ({e})"))),
            _ => Err(e),
        };
    }
    let held: i32 = other.client.query_one(pid, &[]).await?.get(0);
    let second = tokio::time::timeout(WAIT, db.client.query_one(pid, &[])).await;
    let _ = other.client.batch_execute("ROLLBACK").await;
    match second {
        Err(_) => Err(pooled(format!(
            "a statement waited {} s for a server connection while another session held one \
             in a transaction",
            WAIT.as_secs()
        ))),
        Ok(row) => {
            let second: i32 = row?.get(0);
            if second != first {
                Err(pooled(format!(
                    "the server backend changed between two statements of one session (pid \
                     {first}, then {second}; pid {held} went to another session meanwhile)"
                )))
            } else {
                Ok(())
            }
        }
    }
}
