//! The maintenance launcher and the database worker it starts.
//!
//! The launcher is a static background worker, registered from `_PG_init` only
//! while `shared_preload_libraries` is loaded, started once recovery has
//! finished (so never on a standby) and started again 10 seconds after it exits
//! with an error. It connects to no database (only to the shared catalogs, so that
//! it shows in `pg_stat_activity`). Each interval it starts, for each
//! database in `envelopes.maintenance_databases` in turn, a dynamic worker that
//! connects to it and runs [`super::run_here`], and waits for it (a run that is
//! still going after [`RUN_TIMEOUT`] is stopped). With
//! `envelopes.maintenance_interval = 0` it only sleeps and rereads its settings
//! on SIGHUP (`pg_reload_conf()`). A database that does not exist, or lacks the
//! extension, is reported in the server log each interval and skipped.

use crate::pg::worker::{self, Header, Stop};
use pgrx::prelude::*;
use std::time::{Duration, Instant};

/// The longest a run in one database may take before the launcher stops it.
pub const RUN_TIMEOUT: Duration = Duration::from_secs(3600);

/// How long the launcher sleeps while maintenance is off (a reload wakes it).
const IDLE_WAIT: Duration = Duration::from_secs(60);

/// The kind of the database worker's job (see [`worker::on_job`]); it has no
/// payload: the header says where to connect and carries the outcome.
pub const JOB_KIND: u32 = 3;

/// The launcher's kind among the long-lived workers.
const LAUNCHER_KIND: u32 = 1;

/// Registers the launcher; does nothing unless the library is being preloaded.
pub fn register() {
    worker::register_static(
        "pg_envelopes maintenance launcher",
        LAUNCHER_KIND,
        launcher,
        Duration::from_secs(10),
    );
}

/// The launcher's body, for the life of the server.
fn launcher() {
    worker::install_long_lived_signals();
    worker::connect_to_no_database();
    log!("pg_envelopes maintenance launcher started");
    let mut last_start: Option<Instant> = None;
    loop {
        worker::reload_if_asked();
        let Some(interval) = crate::gucs::maintenance_interval() else {
            last_start = None;
            worker::pause(IDLE_WAIT);
            continue;
        };
        if let Some(due) = last_start.map(|start| start + interval) {
            let now = Instant::now();
            if now < due {
                worker::pause(due - now);
                continue;
            }
        }
        last_start = Some(Instant::now());
        let databases = crate::gucs::maintenance_databases();
        if databases.is_empty() {
            debug1!("pg_envelopes maintenance: envelopes.maintenance_databases is empty");
        }
        for database in databases {
            run_in(&database);
        }
    }
}

/// One run in `database`, in a worker of its own; waits for it.
fn run_in(database: &str) {
    let job = worker::Job::create(JOB_KIND, Header::for_database(database), &[]);
    let Some(running) = job.launch("pg_envelopes maintenance", worker::SLOT_WAIT) else {
        log!(
            "pg_envelopes maintenance of database \"{database}\" skipped: no background worker \
             slot was free (max_worker_processes); trying again next interval"
        );
        job.detach();
        return;
    };
    match worker::wait_for(running, Some(Instant::now() + RUN_TIMEOUT)) {
        Stop::Stopped => match job.outcome() {
            Some(Ok(())) => {}
            Some(Err((_, message))) => {
                log!("pg_envelopes maintenance of database \"{database}\" did not run: {message}")
            }
            None => log!(
                "pg_envelopes maintenance of database \"{database}\": the worker stopped \
                 without reporting (does the database exist? see the messages above)"
            ),
        },
        Stop::TimedOut => warning!(
            "pg_envelopes maintenance of database \"{database}\" stopped after {RUN_TIMEOUT:?}"
        ),
        Stop::PostmasterDied => {}
    }
    job.detach();
}

/// The database worker's job (see [`worker::on_job`]): one run, its outcome
/// reported.
pub fn run_job(job: &mut worker::AttachedJob) {
    job.header().connect();
    let outcome = super::run_here().map(|run| {
        debug1!(
            "pg_envelopes maintenance of database \"{}\": {} rows deleted, {} bands dropped, \
             {} bands created, {} failures",
            job.header().database_name(),
            run.rows_deleted,
            run.bands_dropped,
            run.bands_created,
            run.failures.len()
        );
    });
    job.finish(outcome);
}
