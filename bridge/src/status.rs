//! `envelopes-bridge status`: each consumer's positions, what is pending and
//! how old, the dead letters, and the counters of running bridges. Output goes
//! line by line to stdout; when the reader goes away (`status | head`) it stops
//! quietly, successfully.

use crate::cli::StatusArgs;
use crate::logging::out;
use crate::retry::DbFailure;

/// Prints the report. `Err` carries the database's failure.
pub async fn run(args: StatusArgs) -> Result<(), DbFailure> {
    args.database.apply();
    let db = crate::db::connect(&args.database.database_url, "envelopes-bridge status")
        .await
        .map_err(DbFailure::from)?;
    let failure = |e: tokio_postgres::Error| DbFailure::new(&e);
    let rows = db
        .client
        .query(
            "SELECT consumer, outbox_id, late_id, outbox_pending,
                    COALESCE(extract(epoch FROM outbox_oldest_pending_age), 0)::float8,
                    envelopes_pending,
                    COALESCE(extract(epoch FROM envelopes_oldest_pending_age), 0)::float8,
                    dead_letters, COALESCE(last_acknowledged_at::text, '-'), notification_queue_usage
               FROM envelopes.consumer_status ORDER BY consumer",
            &[],
        )
        .await
        .map_err(failure)?;
    let mut lines = vec![format!(
        "{:<24} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>6}  {:<32} {:>8}",
        "consumer",
        "outbox id",
        "late id",
        "outbox lag",
        "oldest (s)",
        "env. lag",
        "oldest (s)",
        "dead",
        "last ack",
        "notify q"
    )];
    for r in rows {
        lines.push(format!(
            "{:<24} {:>10} {:>10} {:>10} {:>10.1} {:>10} {:>10.1} {:>6}  {:<32} {:>8.4}",
            r.get::<_, String>(0),
            r.get::<_, i64>(1),
            r.get::<_, i64>(2),
            r.get::<_, i64>(3),
            r.get::<_, f64>(4),
            r.get::<_, i64>(5),
            r.get::<_, f64>(6),
            r.get::<_, i64>(7),
            r.get::<_, String>(8),
            r.get::<_, f64>(9),
        ));
    }
    // Through the function, which needs no privilege on the table: the bridge's
    // own role sees its consumers' dead letters.
    let dead = db
        .client
        .query(
            "SELECT id, consumer, CASE kind WHEN 'envelope'
                        THEN originator_node_id || ':' || originator_sequence_id
                        ELSE 'outbox:' || outbox_id END,
                    attempts, COALESCE(error, '-'), reason, last_attempt_at::text,
                    retry_requested_at IS NOT NULL, next_attempt_at IS NOT NULL
               FROM envelopes.consumer_dead_letters() ORDER BY id",
            &[],
        )
        .await
        .map_err(failure)?;
    if !dead.is_empty() {
        lines.push(String::new());
        lines.push("dead letters (envelopes.retry_dead_letters() asks for them again):".into());
        for r in dead {
            lines.push(format!(
                "  #{:<6} {:<20} {:<24} attempts {:<3} {:<12} {}  (last {}{})",
                r.get::<_, i64>(0),
                r.get::<_, String>(1),
                r.get::<_, String>(2),
                r.get::<_, i32>(3),
                r.get::<_, String>(4),
                r.get::<_, String>(5),
                r.get::<_, String>(6),
                if r.get::<_, bool>(7) {
                    ", retry asked"
                } else if r.get::<_, bool>(8) {
                    ", the bridge tries it again shortly"
                } else {
                    ""
                },
            ));
        }
    }
    lines.extend(replication_lines(&db).await);
    for addr in &args.bridge_metrics {
        match crate::metrics::scrape(*addr).await {
            Ok(text) => {
                lines.push(String::new());
                lines.push(format!("bridge at {addr}:"));
                for line in text.lines().filter(|l| {
                    [
                        "_errors_total",
                        "_dead_lettered_total",
                        "_refused_total",
                        "_retried_total",
                        "_published_total",
                        "_active",
                        "_lag_rows",
                        "_standby_waiting",
                        "_sink_stalled",
                        "_sink_refusing",
                        "_sink_blocked",
                    ]
                    .iter()
                    .any(|m| l.starts_with("envelopes_bridge") && l.contains(m))
                }) {
                    lines.push(format!("  {line}"));
                }
            }
            Err(e) => {
                lines.push(String::new());
                lines.push(format!("bridge at {addr}: not reachable ({e})"));
            }
        }
    }
    for line in lines {
        if !out(line) {
            break; // the reader is gone: nothing more to say
        }
    }
    Ok(())
}

/// What egress in `--forward-after standby-flush` mode would wait for now:
/// the standbys, their flush positions, and whether the WAL written so far is
/// flushed where it counts (see [`crate::standby`]).
async fn replication_lines(db: &crate::db::Db) -> Vec<String> {
    let mut lines = vec![String::new()];
    let standbys = db
        .client
        .query(
            "SELECT s.application_name, s.state, s.sync_state, COALESCE(s.flush_lsn::text, '-'),
                    COALESCE(pg_catalog.pg_wal_lsn_diff(pg_catalog.pg_current_wal_insert_lsn(),
                                                        s.flush_lsn), 0)::bigint,
                    pg_catalog.pg_current_wal_insert_lsn()::text
               FROM envelopes.standby_flush_positions() s ORDER BY 1",
            &[],
        )
        .await;
    let here = db
        .client
        .query_one(
            "SELECT pg_catalog.current_setting('synchronous_standby_names'),
                    pg_catalog.pg_current_wal_insert_lsn()::text",
            &[],
        )
        .await;
    let (standbys, (names, lsn)) = match (standbys, here) {
        (Ok(rows), Ok(row)) => (rows, (row.get::<_, String>(0), row.get::<_, String>(1))),
        (Err(e), _) | (_, Err(e)) => {
            lines.push(format!("replication: unknown ({})", DbFailure::new(&e)));
            return lines;
        }
    };
    if standbys.is_empty() && names.trim().is_empty() {
        // A plain server: nothing to wait for and nothing to warn about (a
        // bridge asked for --forward-after standby-flush says so itself).
        lines.push(
            "replication: no standbys and synchronous_standby_names = '': egress forwards each \
             batch once committed (--forward-after auto); only an explicit --forward-after \
             standby-flush would wait (no standby is connected)"
                .into(),
        );
        return lines;
    }
    lines.push(format!(
        "replication: synchronous_standby_names = '{names}', WAL inserted up to {lsn}, {} standby(s)",
        standbys.len()
    ));
    for r in &standbys {
        lines.push(format!(
            "  {:<24} {:<10} {:<10} flushed {:<14} {} bytes behind",
            r.get::<_, String>(0),
            r.get::<_, String>(1),
            r.get::<_, String>(2),
            r.get::<_, String>(3),
            r.get::<_, i64>(4),
        ));
    }
    let mode = if names.trim().is_empty() {
        "commit (auto; standby-flush only when asked for)"
    } else {
        "standby-flush (auto)"
    };
    match crate::standby::replication(db, Some(&lsn)).await {
        Ok((_, state)) => lines.push(match state.waiting_for() {
            None => format!("  egress forwards after: {mode}; what is written now is flushed where it counts"),
            Some(why) => format!("  egress forwards after: {mode}; in standby-flush mode a batch read now waits: {why}"),
        }),
        Err(e) => lines.push(format!("  {e}")),
    }
    lines
}
