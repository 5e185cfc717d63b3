//! Dynamic background workers that do one job for a backend and report back:
//! the runner that both partition creation and retention use.
//!
//! A job travels in a small dynamic shared memory segment whose handle is the
//! worker's argument: a [`Header`] (where to connect, as whom, which caller asked,
//! and the [`Outcome`], since a background worker's exit code is not observable)
//! followed by the job's own fields. The caller [`launch`]es the worker (waiting
//! a moment for a free slot), waits for it on its latch ([`wait_for`]:
//! interruptibly, with a deadline, stopping the worker first when it gives up so
//! it cannot commit afterwards), and reads the outcome. The worker runs its work
//! in transactions of its own ([`in_own_transaction`]) and checks that the
//! caller's transaction is still alive ([`Header::caller_ended`]) before it
//! commits anything, so a caller that was killed leaves no work behind.

use pgrx::bgworkers::{
    BackgroundWorker, BackgroundWorkerBuilder, BackgroundWorkerStatus, DynamicBackgroundWorker,
};
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::time::{Duration, Instant};

mod fields;
mod job;

pub use fields::{FieldReader, Fields};
pub use job::{AttachedJob, Header, Job};

/// A job's handler, run in the worker with the job attached.
pub type JobHandler = fn(&mut AttachedJob);

/// A long-lived worker's body (see [`register_static`]).
pub type StaticHandler = fn();

static JOB_HANDLERS: std::sync::RwLock<Vec<(u32, JobHandler)>> = std::sync::RwLock::new(Vec::new());
static STATIC_HANDLERS: std::sync::RwLock<Vec<(u32, StaticHandler)>> =
    std::sync::RwLock::new(Vec::new());

/// Has jobs of `kind` run by `handler`. Called from `_PG_init`, which runs in
/// every process that loads the library, workers included, before their entry
/// point.
pub fn on_job(kind: u32, handler: JobHandler) {
    set_handler(&JOB_HANDLERS, kind, handler);
}

/// Registers `handler` for `kind`, replacing an earlier one.
fn set_handler<H>(handlers: &std::sync::RwLock<Vec<(u32, H)>>, kind: u32, handler: H) {
    if let Ok(mut handlers) = handlers.write() {
        handlers.retain(|(k, _)| *k != kind);
        handlers.push((kind, handler));
    }
}

fn handler_of<H: Copy>(handlers: &std::sync::RwLock<Vec<(u32, H)>>, kind: u32) -> Option<H> {
    handlers
        .read()
        .ok()?
        .iter()
        .find(|(k, _)| *k == kind)
        .map(|(_, h)| *h)
}

/// The name of the library function every job worker starts in.
pub(super) const JOB_ENTRY: &str = "envelopes_job_worker";

/// Entry point of every job worker: attaches the caller's segment and runs the
/// handler registered for the job's kind. A job whose caller gave up (the
/// segment is gone) is not run; a kind without a handler is reported as failed.
#[pg_guard]
#[unsafe(no_mangle)]
pub extern "C-unwind" fn envelopes_job_worker(arg: pg_sys::Datum) {
    install_sigterm();
    let Some(mut job) = AttachedJob::attach(arg) else {
        return;
    };
    match handler_of(&JOB_HANDLERS, job.kind()) {
        Some(handler) => handler(&mut job),
        None => job.finish(Err((
            PgSqlErrorCode::ERRCODE_INTERNAL_ERROR as i32,
            format!("no handler for background job kind {}", job.kind()),
        ))),
    }
}

/// Entry point of the long-lived workers of [`register_static`]: the argument
/// names the handler.
#[pg_guard]
#[unsafe(no_mangle)]
pub extern "C-unwind" fn envelopes_static_worker(arg: pg_sys::Datum) {
    if let Some(handler) = handler_of(&STATIC_HANDLERS, arg.value() as u32) {
        handler();
    }
}

// Postgres' SIGTERM handler for backends: sets the interrupt flags, so a worker
// waiting for a lock can be terminated. pg_sys exposes it only as a Rust wrapper.
unsafe extern "C-unwind" {
    #[link_name = "die"]
    fn postgres_die(signal: std::ffi::c_int);
}

/// How long an insert waits for a background-worker slot before it creates in
/// its own transaction. Under load our creation workers hold every slot for
/// milliseconds each, so a slot comes free well within this; slots held for long
/// by other workers (parallel queries, other extensions) should not hold every
/// new band up for the whole partition_worker_timeout.
pub const SLOT_WAIT: Duration = Duration::from_secs(2);

/// Registers a dynamic worker running `function` of this library with `handle` as
/// its argument, waiting up to `wait` for a free slot (not at all on a server
/// without worker slots). `None` when none freed up.
pub fn launch(
    name: &str,
    function: &str,
    handle: pg_sys::dsm_handle,
    wait: Duration,
) -> Option<DynamicBackgroundWorker> {
    let deadline = Instant::now() + wait;
    loop {
        let builder = BackgroundWorkerBuilder::new(name)
            .set_type(name)
            .set_library("pg_envelopes")
            .set_function(function)
            .set_argument(Some(pg_sys::Datum::from(handle)))
            .enable_spi_access()
            // SAFETY: MyProcPid is this backend's pid.
            .set_notify_pid(unsafe { pg_sys::MyProcPid });
        if let Ok(worker) = builder.load_dynamic() {
            return Some(worker);
        }
        // SAFETY: reads a setting fixed at server start.
        let no_slots = unsafe { pg_sys::max_worker_processes } == 0;
        if no_slots || Instant::now() >= deadline {
            return None;
        }
        pause(Duration::from_millis(5));
    }
}

/// How [`wait_for`] ended.
pub enum Stop {
    Stopped,
    TimedOut,
    PostmasterDied,
}

/// Waits on this backend's latch until the worker has stopped, or `deadline`
/// passed (then the worker is stopped first, so it cannot commit after we return).
/// A cancel or termination of this backend stops the worker and is then raised.
pub fn wait_for(worker: DynamicBackgroundWorker, deadline: Option<Instant>) -> Stop {
    loop {
        match worker.pid() {
            Err(BackgroundWorkerStatus::Stopped) => return Stop::Stopped,
            Err(BackgroundWorkerStatus::PostmasterDied) => return Stop::PostmasterDied,
            _ => {}
        }
        // SAFETY: reading flags that signal handlers set.
        let cancelled = unsafe { pg_sys::QueryCancelPending != 0 || pg_sys::ProcDiePending != 0 };
        let late = deadline.is_some_and(|d| Instant::now() > d);
        if cancelled || late {
            worker.terminate().wait_for_shutdown().ok();
            check_for_interrupts!(); // raises the cancel, if that is what it was
            return Stop::TimedOut;
        }
        // Other interrupts (a barrier, a cache catch-up) are handled and the wait
        // goes on.
        check_for_interrupts!();
        // The postmaster sets our latch when the worker starts or stops (notify
        // pid); the timeout bounds each wait.
        latch_wait(Duration::from_millis(50));
    }
}

/// Sleeps on this backend's latch for up to `duration`, interruptibly.
pub fn pause(duration: Duration) {
    check_for_interrupts!();
    latch_wait(duration);
}

fn latch_wait(duration: Duration) {
    // SAFETY: waiting on our own latch with a timeout; exits if the postmaster
    // dies.
    unsafe {
        pg_sys::WaitLatch(
            pg_sys::MyLatch,
            (pg_sys::WL_LATCH_SET | pg_sys::WL_TIMEOUT | pg_sys::WL_EXIT_ON_PM_DEATH) as i32,
            duration.as_millis().max(1) as std::ffi::c_long,
            pg_sys::PG_WAIT_EXTENSION,
        );
        pg_sys::ResetLatch(pg_sys::MyLatch);
    }
}

/// For a worker's entry point: installs Postgres' own SIGTERM handler, so a
/// terminated worker stops at its next interrupt check, then unblocks signals.
pub fn install_sigterm() {
    // SAFETY: runs once at worker start on the main thread.
    unsafe {
        crate::pg::compat::set_signal_handler(pg_sys::SIGTERM, postgres_die);
        pg_sys::BackgroundWorkerUnblockSignals();
    }
}

/// Runs `work` in a transaction of the worker's own and commits it; an ERROR
/// inside aborts it and comes back as its SQLSTATE and message.
pub fn in_own_transaction(work: impl FnOnce()) -> Result<(), (i32, String)> {
    let result = PgTryBuilder::new(std::panic::AssertUnwindSafe(|| {
        // SAFETY: the standard transaction bracket of a background worker; an
        // ERROR inside unwinds to the catch below, which aborts the transaction.
        unsafe {
            pg_sys::SetCurrentStatementStartTimestamp();
            pg_sys::StartTransactionCommand();
            pg_sys::PushActiveSnapshot(pg_sys::GetTransactionSnapshot());
        }
        let switched = crate::pg::acl::enter_acting_role();
        work();
        crate::pg::acl::leave_acting_role(switched);
        // SAFETY: closes the bracket opened above.
        unsafe {
            pg_sys::PopActiveSnapshot();
            pg_sys::CommitTransactionCommand();
        }
        Ok(())
    }))
    .catch_others(|error| {
        let report = match error {
            pgrx::pg_sys::panic::CaughtError::PostgresError(r)
            | pgrx::pg_sys::panic::CaughtError::ErrorReport(r)
            | pgrx::pg_sys::panic::CaughtError::RustPanic { ereport: r, .. } => r,
        };
        Err((report.sql_error_code() as i32, report.message().to_owned()))
    })
    .execute();
    if result.is_err() {
        // SAFETY: leaves the failed transaction.
        unsafe { pg_sys::AbortCurrentTransaction() };
    }
    result
}

/// Registers a worker that the postmaster starts once recovery has finished, runs
/// `handler` (known as `kind`) for the life of the server (which should connect
/// to no database, [`connect_to_no_database`]), and starts again `restart` after
/// it exits with an error. Only possible while `shared_preload_libraries` is
/// being loaded, and not in binary-upgrade mode (pg_upgrade); `false` otherwise.
pub fn register_static(name: &str, kind: u32, handler: StaticHandler, restart: Duration) -> bool {
    // SAFETY: reads a flag the postmaster sets while it loads the preloaded
    // libraries.
    if !unsafe { pg_sys::process_shared_preload_libraries_in_progress } {
        return false;
    }
    // Not while pg_upgrade runs the server (binary-upgrade mode): the databases
    // are being restored, and a worker acting on them would get in the way.
    // SAFETY: the postmaster sets this from its command line before it loads
    // the preloaded libraries.
    if unsafe { pg_sys::IsBinaryUpgrade } {
        return false;
    }
    set_handler(&STATIC_HANDLERS, kind, handler);
    BackgroundWorkerBuilder::new(name)
        .set_type(name)
        .set_library("pg_envelopes")
        .set_function("envelopes_static_worker")
        .set_argument(Some(pg_sys::Datum::from(kind)))
        .enable_spi_access()
        .set_start_time(pgrx::bgworkers::BgWorkerStartTime::RecoveryFinished)
        .set_restart_time(Some(restart))
        .load();
    true
}

/// For a long-lived worker: attaches to shared catalogs only, as the logical
/// replication launcher does, so that it shows in `pg_stat_activity` (and takes
/// part in the server's barriers) without holding a database.
pub fn connect_to_no_database() {
    BackgroundWorker::connect_worker_to_spi(None, None);
}

/// For a long-lived worker's entry point: SIGHUP asks for a configuration
/// reload ([`reload_if_asked`]), SIGTERM stops the worker at its next interrupt
/// check.
pub fn install_long_lived_signals() {
    pgrx::bgworkers::BackgroundWorker::attach_signal_handlers(
        pgrx::bgworkers::SignalWakeFlags::SIGHUP,
    );
    install_sigterm();
}

/// Rereads the configuration files if a SIGHUP came since the last call; true
/// when it did.
pub fn reload_if_asked() -> bool {
    if !pgrx::bgworkers::BackgroundWorker::sighup_received() {
        return false;
    }
    // SAFETY: outside any transaction, on the main thread, as the postmaster's
    // children do on SIGHUP; the flag is ours to clear.
    unsafe {
        (&raw mut pg_sys::ConfigReloadPending).write_volatile(0);
        pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP);
    }
    true
}

/// For a worker's transaction: sets `name` to `value` until the transaction ends
/// (as `SET LOCAL`, with a superuser's right to set it, whoever the worker acts
/// as: the worker's own settings, not a user's). An invalid value is an ERROR.
pub fn set_for_transaction(name: &std::ffi::CStr, value: &str) {
    let value = std::ffi::CString::new(value).unwrap_or_default();
    // SAFETY: both strings are NUL-terminated and live through the call;
    // set_config_option copies what it keeps, and raises an ERROR (elevel 0 means
    // ERROR) for an unknown name or a bad value.
    unsafe {
        pg_sys::set_config_option(
            name.as_ptr(),
            value.as_ptr(),
            pg_sys::GucContext::PGC_SUSET,
            pg_sys::GucSource::PGC_S_SESSION,
            pg_sys::GucAction::GUC_ACTION_LOCAL,
            true,
            0,
            false,
        );
    }
}
