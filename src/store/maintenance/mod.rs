//! The maintenance worker: on a server with pg_envelopes in
//! `shared_preload_libraries`, every `envelopes.maintenance_interval` seconds,
//! in each of `envelopes.maintenance_databases`, what `prune_expired()` does and
//! the pre-creation of the next band of every originator whose newest band is
//! fuller than `envelopes.premake_fraction` ([`premake`]), so that a writer
//! crossing into the next band finds it there and pays nothing for it.
//!
//! A static launcher ([`launcher`]), connected to no database, starts one
//! dynamic worker per database in turn through the runner every job of the
//! extension uses ([`crate::pg::worker`]) and waits for it. That worker
//! ([`run_here`]) acts as the extension's owner (who owns the partitions), and
//! does each step in a transaction of its own: pruning band by band, each
//! creation alone (so the creation lock, which inserts that need a new band also
//! take, is held for one band at a time), every lock wait bounded by
//! `envelopes.partition_lock_timeout`. An error in one step is caught in its
//! transaction; the run goes on with the next originator and is recorded with
//! the first error and their count. So a band held by a long transaction fails
//! the run for that band only, and the next interval tries again; no error
//! stops the launcher or reaches the postmaster.
//!
//! Each run is a row of `envelopes.maintenance_runs`, inserted when it starts
//! (visible while it runs) and completed when it ends; the newest
//! [`KEPT_RUNS`] are kept. `envelopes.maintenance_status()` shows them.

pub mod launcher;
pub mod premake;

use crate::error::{OrRaise, PgSqlErrorCode, SqlError};
use crate::pg::worker;
use crate::store::partition::{self, PartitionError};
use crate::store::retention;
use pgrx::pg_sys::Oid;
use pgrx::prelude::*;
use std::time::Duration;

/// How many runs `envelopes.maintenance_runs` keeps, newest first.
pub const KEPT_RUNS: i64 = 1000;

/// Errors of a maintenance run.
#[derive(Debug, thiserror::Error)]
pub enum MaintenanceError {
    #[error("pg_envelopes is not installed in this database")]
    NotInstalled,
    #[error(
        "pg_envelopes in this database is older than 0.4.0 (no envelopes.maintenance_runs); \
         ALTER EXTENSION pg_envelopes UPDATE"
    )]
    TooOld,
    #[error(
        "the newest band of originator {node} (from {band_start}) stayed locked for \
         {waited:?}; its fullness is unknown"
    )]
    BandBusy {
        node: i32,
        band_start: i64,
        waited: Duration,
    },
    #[error("{0}")]
    Partition(#[from] PartitionError),
    #[error("SPI error in maintenance: {0}")]
    Spi(#[from] pgrx::spi::SpiError),
}

impl SqlError for MaintenanceError {
    fn sqlstate(&self) -> PgSqlErrorCode {
        use PgSqlErrorCode::*;
        match self {
            MaintenanceError::NotInstalled | MaintenanceError::TooOld => {
                ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE
            }
            MaintenanceError::BandBusy { .. } => ERRCODE_LOCK_NOT_AVAILABLE,
            MaintenanceError::Partition(e) => e.sqlstate(),
            MaintenanceError::Spi(_) => ERRCODE_INTERNAL_ERROR,
        }
    }
}

/// What one run did, and what went wrong in it.
#[derive(Debug, Default)]
pub struct Run {
    pub bands_dropped: i64,
    pub bands_created: i64,
    pub rows_deleted: i64,
    /// Every step that failed: what it was, its SQLSTATE and message.
    pub failures: Vec<(String, i32, String)>,
}

impl Run {
    fn failed(&mut self, step: String, (code, message): (i32, String)) {
        self.failures.push((step, code, message));
    }

    /// The error text recorded for the run: the first failure, and how many
    /// there were.
    pub fn error_text(&self) -> Option<String> {
        let (step, code, message) = self.failures.first()?;
        let state = sqlstate_text(*code);
        let more = match self.failures.len() {
            1 => String::new(),
            n => format!(" (and {} more failures; see the server log)", n - 1),
        };
        Some(format!("{step}: {message} (SQLSTATE {state}){more}"))
    }
}

/// A packed SQLSTATE as its five characters.
fn sqlstate_text(code: i32) -> String {
    (0..5)
        .map(|i| (((code >> (6 * i)) & 0x3f) as u8 + b'0') as char)
        .collect()
}

/// For the database worker, connected and outside any transaction: one whole
/// run, recorded. `Err` only when there is nothing to record it in (the
/// extension is missing or too old) or the record itself failed.
pub fn run_here() -> Result<Run, (i32, String)> {
    let mut owner = None;
    worker::in_own_transaction(|| owner = Some(extension_owner().or_raise()))?;
    if let Some(owner) = owner {
        crate::pg::acl::act_as(owner);
    }
    let mut run_id = None;
    worker::in_own_transaction(|| {
        run_id = Spi::get_one::<i64>(
            "INSERT INTO envelopes.maintenance_runs DEFAULT VALUES RETURNING run_id",
        )
        .map_err(MaintenanceError::from)
        .or_raise();
    })?;
    let lock_timeout_ms = crate::gucs::partition_lock_timeout_ms();
    let mut run = Run::default();

    let (pruned, failure) = retention::prune_here(lock_timeout_ms);
    run.rows_deleted = pruned.rows_deleted;
    run.bands_dropped = pruned.bands_dropped;
    if let Some(failure) = failure {
        run.failed("pruning".into(), failure);
    }

    premake_here(&mut run, lock_timeout_ms);

    let error = run.error_text();
    worker::in_own_transaction(|| {
        record(run_id, &run, error.as_deref()).or_raise();
    })?;
    for (step, code, message) in &run.failures {
        pgrx::warning!(
            "pg_envelopes maintenance: {step}: {message} (SQLSTATE {})",
            sqlstate_text(*code)
        );
    }
    Ok(run)
}

/// The pre-creation step of a run: the candidates in one transaction, then each
/// band in a transaction of its own.
fn premake_here(run: &mut Run, lock_timeout_ms: i32) {
    let fraction = crate::gucs::premake_fraction();
    let wait = Duration::from_millis(u64::try_from(lock_timeout_ms).unwrap_or(0));
    let mut selection = None;
    let listed = worker::in_own_transaction(|| {
        transaction_settings(lock_timeout_ms);
        selection = Some(premake::candidates(fraction, wait).or_raise());
    });
    if let Err(e) = listed {
        run.failed("listing the bands to create ahead".into(), e);
        return;
    }
    let Some(selection) = selection else {
        return;
    };
    for busy in selection.busy {
        run.failed(
            "looking at a band".into(),
            (busy.sqlstate() as i32, busy.to_string()),
        );
    }
    let width = crate::gucs::band_width();
    for candidate in selection.candidates {
        let mut created = false;
        let result = worker::in_own_transaction(|| {
            transaction_settings(lock_timeout_ms);
            created = partition::create_ahead(candidate.node, candidate.band_end, width).or_raise();
        });
        match result {
            Ok(()) => run.bands_created += i64::from(created),
            Err(e) => run.failed(
                format!(
                    "creating the band of originator {} after {}",
                    candidate.node, candidate.band_end
                ),
                e,
            ),
        }
    }
}

/// The settings of each of the run's transactions: a pinned search_path, a
/// bounded lock wait, and partitions created in the run's own transaction (it is
/// already one of its own; a creation worker would only add a process).
fn transaction_settings(lock_timeout_ms: i32) {
    worker::set_for_transaction(c"search_path", "pg_catalog, pg_temp");
    worker::set_for_transaction(c"lock_timeout", &format!("{}ms", lock_timeout_ms.max(1)));
    worker::set_for_transaction(c"envelopes.create_partitions_in", "transaction");
}

/// The extension's owner, in a transaction; errors when pg_envelopes is not
/// installed here or has no `maintenance_runs` yet.
fn extension_owner() -> Result<Oid, MaintenanceError> {
    let found = Spi::get_two::<Oid, bool>(
        "SELECT (SELECT e.extowner FROM pg_catalog.pg_extension e
                  WHERE e.extname = 'pg_envelopes'),
                pg_catalog.to_regclass('envelopes.maintenance_runs') IS NOT NULL",
    )?;
    match found {
        (Some(owner), Some(true)) => Ok(owner),
        (Some(_), _) => Err(MaintenanceError::TooOld),
        (None, _) => Err(MaintenanceError::NotInstalled),
    }
}

/// Completes the run's row and deletes all but the newest [`KEPT_RUNS`].
fn record(run_id: Option<i64>, run: &Run, error: Option<&str>) -> Result<(), MaintenanceError> {
    Spi::run_with_args(
        "UPDATE envelopes.maintenance_runs
            SET finished = pg_catalog.clock_timestamp(), bands_dropped = $2,
                bands_created = $3, rows_deleted = $4, error = $5
          WHERE run_id = $1",
        &[
            run_id.into(),
            run.bands_dropped.into(),
            run.bands_created.into(),
            run.rows_deleted.into(),
            error.into(),
        ],
    )?;
    Spi::run_with_args(
        "DELETE FROM envelopes.maintenance_runs
          WHERE run_id <= (SELECT pg_catalog.max(r.run_id) FROM envelopes.maintenance_runs r) - $1",
        &[KEPT_RUNS.into()],
    )?;
    Ok(())
}

#[cfg(test)]
mod unit {
    use super::{sqlstate_text, Run};

    #[test]
    fn sqlstates_unpack() {
        let pack = |s: &str| {
            s.bytes()
                .enumerate()
                .map(|(i, b)| (i32::from(b - b'0') & 0x3f) << (6 * i))
                .sum::<i32>()
        };
        assert_eq!(sqlstate_text(pack("55P03")), "55P03");
        assert_eq!(sqlstate_text(pack("XX000")), "XX000");
    }

    #[test]
    fn the_error_text_names_the_first_failure_and_counts_the_rest() {
        let mut run = Run::default();
        assert_eq!(run.error_text(), None);
        run.failed("a".into(), (0, "first".into()));
        assert_eq!(run.error_text().unwrap(), "a: first (SQLSTATE 00000)");
        run.failed("b".into(), (0, "second".into()));
        assert!(run
            .error_text()
            .unwrap()
            .ends_with("(and 1 more failures; see the server log)"));
    }
}

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use super::{record, Run, KEPT_RUNS};
    use crate::testing::{int8, sqlstate_of};
    use pgrx::prelude::*;

    #[pg_test]
    fn a_run_is_recorded_and_the_record_stays_bounded() {
        Spi::run(&format!(
            "INSERT INTO envelopes.maintenance_runs (started)
             SELECT pg_catalog.now() - pg_catalog.make_interval(secs => s)
               FROM pg_catalog.generate_series(1, {}) s",
            KEPT_RUNS + 5
        ))
        .unwrap();
        let newest = int8("SELECT max(run_id) FROM envelopes.maintenance_runs");
        let mut run = Run {
            bands_dropped: 2,
            bands_created: 3,
            rows_deleted: 40,
            ..Run::default()
        };
        run.failed("creating".into(), (0, "it failed".into()));
        record(Some(newest), &run, run.error_text().as_deref()).unwrap();
        assert_eq!(
            int8("SELECT count(*) FROM envelopes.maintenance_runs"),
            KEPT_RUNS
        );
        let (created, error) = Spi::get_two::<i64, String>(
            "SELECT bands_created, error FROM envelopes.maintenance_status(1)",
        )
        .unwrap();
        assert_eq!(created, Some(3));
        assert_eq!(
            error.as_deref(),
            Some("creating: it failed (SQLSTATE 00000)")
        );
        assert_eq!(
            int8("SELECT count(*) FROM envelopes.maintenance_status()"),
            10
        );
        assert_eq!(
            int8("SELECT count(*) FROM envelopes.maintenance_status(0)"),
            0
        );
    }

    #[pg_test]
    fn readers_see_the_runs_and_nothing_more() {
        Spi::run("CREATE ROLE maintenance_reader").unwrap();
        Spi::run("SELECT envelopes.grant_reader('maintenance_reader')").unwrap();
        let may = |what: &str| {
            Spi::get_one::<bool>(&format!("SELECT {what}"))
                .unwrap()
                .unwrap()
        };
        let status = "pg_catalog.has_function_privilege('maintenance_reader', \
                      'envelopes.maintenance_status(integer)', 'EXECUTE')";
        let table = "pg_catalog.has_table_privilege('maintenance_reader', \
                     'envelopes.maintenance_runs', 'SELECT, INSERT, UPDATE, DELETE')";
        assert!(may(status));
        assert!(!may(table));
        Spi::run("SELECT envelopes.revoke_reader('maintenance_reader')").unwrap();
        assert!(!may(status));
    }

    #[pg_test]
    fn maintenance_settings_are_the_servers() {
        for sql in [
            "SET envelopes.maintenance_interval = 5",
            "SET envelopes.maintenance_databases = 'app'",
            "SET envelopes.premake_fraction = 0.5",
        ] {
            assert_eq!(sqlstate_of(sql).as_deref(), Some("55P02"), "{sql}");
        }
        assert_eq!(
            Spi::get_one::<String>("SHOW envelopes.premake_fraction")
                .unwrap()
                .as_deref(),
            Some("0.8")
        );
        assert_eq!(
            Spi::get_one::<String>("SHOW envelopes.maintenance_interval")
                .unwrap()
                .as_deref(),
            Some("0")
        );
    }
}
