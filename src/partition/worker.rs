//! Partition creation in a dynamic background worker, committed on its own.
//!
//! Created in the caller's transaction, a partition's DDL locks (the creation
//! advisory lock, SHARE UPDATE EXCLUSIVE on the parent) would be held until the
//! caller commits, so one caller that keeps its transaction open stalls every other
//! session that needs a new partition. Instead the inserting backend starts a
//! worker that connects to the same database as the same role, creates the
//! partitions under the creation lock in a transaction of its own and commits;
//! the caller waits on its latch (interruptibly, with a deadline) and then uses
//! the new tables. A partition created this way stays even if the caller later
//! rolls back, which is harmless: it is empty.
//!
//! Inputs and the outcome travel through a small dynamic shared memory segment
//! whose handle is the worker's argument (a background worker's exit code is not
//! observable). The worker retries DDL that hits `lock_timeout`, and before
//! committing checks that the caller's transaction is still alive, so a caller
//! that was killed does not leave work behind it. When no worker slot is free,
//! the caller waits for one (workers live for milliseconds, so slots free up
//! quickly) up to `envelopes.partition_worker_timeout`, and only then falls back
//! to creating in its own transaction, and logs it.
//!
//! The helpers at the end (launching with a wait for a slot, waiting for a
//! worker, a worker's own transactions) serve the pruning worker too.

use super::PartitionError;
use crate::gucs;
use crate::locks;
use pgrx::bgworkers::{
    BackgroundWorker, BackgroundWorkerBuilder, BackgroundWorkerStatus, DynamicBackgroundWorker,
};
use pgrx::pg_sys::{self, Oid};
use pgrx::prelude::*;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

const PENDING: u32 = 0;
const DONE: u32 = 1;
const FAILED: u32 = 2;

/// How a worker ended, as it reports it in shared memory (a worker's exit code
/// cannot be observed). Still `PENDING` after the worker stopped means it never
/// got to report (it could not connect, or was killed).
#[repr(C)]
pub(super) struct Outcome {
    state: AtomicU32,
    sqlstate: i32,
    message_len: u32,
    message: [u8; 512],
}

impl Outcome {
    pub(super) fn new() -> Outcome {
        Outcome {
            state: AtomicU32::new(PENDING),
            sqlstate: 0,
            message_len: 0,
            message: [0; 512],
        }
    }

    /// For the worker, once, at its end.
    pub(super) fn set(&mut self, result: Result<(), (i32, String)>) {
        match result {
            Ok(()) => self.state.store(DONE, Ordering::Release),
            Err((code, message)) => {
                let bytes = message.as_bytes();
                let len = bytes.len().min(self.message.len());
                self.message[..len].copy_from_slice(&bytes[..len]);
                self.message_len = len as u32;
                self.sqlstate = code;
                self.state.store(FAILED, Ordering::Release);
            }
        }
    }

    /// For the caller, after the worker stopped: `None` when it never reported,
    /// else its result (an error as SQLSTATE and message).
    pub(super) fn get(&self) -> Option<Result<(), (i32, String)>> {
        match self.state.load(Ordering::Acquire) {
            DONE => Some(Ok(())),
            FAILED => {
                let len = (self.message_len as usize).min(self.message.len());
                let message = String::from_utf8_lossy(&self.message[..len]).into_owned();
                Some(Err((self.sqlstate, message)))
            }
            _ => None,
        }
    }
}

/// The job a worker runs, and its outcome, in shared memory.
#[repr(C)]
struct Job {
    database: Oid,
    role: Oid,
    caller_backend: i32,
    caller_lxid: u32,
    node: i32,
    seq: i64,
    width: i64,
    lock_timeout_ms: i32,
    attempts: i32,
    outcome: Outcome,
}

/// Why the caller should create in its own transaction instead.
#[derive(Debug)]
pub enum Fallback {
    /// No background worker slot was free.
    NoSlot,
    /// The worker stopped without reporting (it could not connect, e.g. the role
    /// cannot log in).
    NoReport,
}

// Postgres' SIGTERM handler for backends: sets the interrupt flags, so a worker
// waiting for a lock can be terminated. pg_sys exposes it only as a Rust wrapper.
unsafe extern "C-unwind" {
    #[link_name = "die"]
    fn postgres_die(signal: std::ffi::c_int);
}

/// Creates the partitions for `(node, seq)` in a background worker and waits for
/// it. `Ok(Err(fallback))` asks the caller to create them itself.
pub fn create_in_worker(
    node: i32,
    seq: i64,
    width: i64,
) -> Result<Result<(), Fallback>, PartitionError> {
    // SAFETY: dsm_create returns a mapped segment of the requested size (or raises
    // an ERROR); it belongs to the current resource owner, so an error below
    // detaches it. The Job is plain data written before the worker starts.
    let (segment, job) = unsafe {
        let segment = pg_sys::dsm_create(std::mem::size_of::<Job>(), 0);
        let job = pg_sys::dsm_segment_address(segment) as *mut Job;
        job.write(Job {
            database: pg_sys::MyDatabaseId,
            role: pg_sys::GetUserId(),
            caller_backend: pg_sys::MyBackendId,
            caller_lxid: (*pg_sys::MyProc).lxid,
            node,
            seq,
            width,
            lock_timeout_ms: gucs::partition_lock_timeout_ms(),
            attempts: gucs::partition_lock_attempts(),
            outcome: Outcome::new(),
        });
        (segment, &*job)
    };
    // SAFETY: the handle identifies the segment created above.
    let handle = unsafe { pg_sys::dsm_segment_handle(segment) };

    // No slot free: slots free up as other workers finish (each of ours runs for
    // milliseconds), so wait a moment for one before giving up (see SLOT_WAIT).
    let wait = gucs::partition_worker_timeout();
    let Some(worker) = launch(
        "pg_envelopes partition creator",
        "envelopes_partition_worker",
        handle,
        wait.min(SLOT_WAIT),
    ) else {
        // SAFETY: detaching the segment created above.
        unsafe { pg_sys::dsm_detach(segment) };
        return Ok(Err(Fallback::NoSlot));
    };
    match wait_for(worker, Some(Instant::now() + wait)) {
        Stop::Stopped => {}
        Stop::PostmasterDied => {
            return Err(PartitionError::WorkerLost("the postmaster died".into()));
        }
        Stop::TimedOut => return Err(PartitionError::WorkerTimeout(wait)),
    }

    let outcome = match job.outcome.get() {
        Some(Ok(())) => Ok(Ok(())),
        Some(Err((sqlstate, message))) => Err(PartitionError::WorkerFailed { sqlstate, message }),
        None => Ok(Err(Fallback::NoReport)),
    };
    close(segment);
    outcome
}

/// For the caller, once its worker has stopped: detaches the job's segment and
/// takes in the invalidations of what the worker committed, so this backend's
/// caches see its catalog changes even where an earlier lookup cached their
/// absence.
pub(super) fn close(segment: *mut pg_sys::dsm_segment) {
    // SAFETY: the worker has stopped; nothing else uses the segment, and the
    // caller does not touch it after this.
    unsafe { pg_sys::dsm_detach(segment) };
    // SAFETY: plain call into the invalidation machinery.
    unsafe { pg_sys::AcceptInvalidationMessages() };
}

/// Entry point of the worker process.
#[pg_guard]
#[unsafe(no_mangle)]
pub extern "C-unwind" fn envelopes_partition_worker(arg: pg_sys::Datum) {
    install_sigterm();
    let handle = arg.value() as pg_sys::dsm_handle;
    // SAFETY: attaching the caller's segment by handle; NULL if it is already gone
    // (the caller gave up), in which case there is nothing to do.
    let segment = unsafe { pg_sys::dsm_attach(handle) };
    if segment.is_null() {
        return;
    }
    // SAFETY: the segment holds the Job the caller wrote before starting us and
    // stays mapped until we detach it.
    let job = unsafe { &mut *(pg_sys::dsm_segment_address(segment) as *mut Job) };
    BackgroundWorker::connect_worker_to_spi_by_oid(Some(job.database), Some(job.role));

    let mut result = Err((0, String::new()));
    for attempt in 1..=job.attempts.max(1) {
        result = in_own_transaction(|| create_once(job));
        let lock_timeout = PgSqlErrorCode::ERRCODE_LOCK_NOT_AVAILABLE as i32;
        if !matches!(&result, Err((code, _)) if *code == lock_timeout) || attempt == job.attempts {
            break;
        }
        std::thread::sleep(Duration::from_millis(20 * u64::from(attempt as u32)));
    }
    job.outcome.set(result);
    // SAFETY: done with the segment.
    unsafe { pg_sys::dsm_detach(segment) };
}

/// One attempt, in a transaction of its own (see [`in_own_transaction`]): create
/// what is missing under the creation lock, and commit only if the caller is
/// still waiting for it.
fn create_once(job: &Job) {
    Spi::run(&format!(
        "SET LOCAL lock_timeout = {}",
        job.lock_timeout_ms.max(1)
    ))
    .unwrap_or_else(|e| error!("could not set lock_timeout: {e}"));
    locks::lock_partition_creation();
    if let Err(e) = super::create::create_locked(job.node, job.seq, job.width) {
        crate::error::OrRaise::or_raise(Err::<(), _>(e));
    }
    if caller_ended(job.caller_backend, job.caller_lxid) {
        error!("the session that asked for this partition is gone; not creating it");
    }
}

/// How long an insert waits for a background-worker slot before it creates in
/// its own transaction. Under load our creation workers hold every slot for
/// milliseconds each, so a slot comes free well within this; slots held for long
/// by other workers (parallel queries, other extensions) should not hold every
/// new band up for the whole partition_worker_timeout.
pub(super) const SLOT_WAIT: Duration = Duration::from_secs(2);

/// Registers a dynamic worker running `function` of this library with `handle` as
/// its argument, waiting up to `wait` for a free slot (not at all on a server
/// without worker slots). `None` when none freed up.
pub(super) fn launch(
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
pub(super) enum Stop {
    Stopped,
    TimedOut,
    PostmasterDied,
}

/// Waits on this backend's latch until the worker has stopped, or `deadline`
/// passed (then the worker is stopped first, so it cannot commit after we return).
/// A cancel or termination of this backend stops the worker and is then raised.
pub(super) fn wait_for(worker: DynamicBackgroundWorker, deadline: Option<Instant>) -> Stop {
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
pub(super) fn pause(duration: Duration) {
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
pub(super) fn install_sigterm() {
    // SAFETY: runs once at worker start on the main thread.
    unsafe {
        pg_sys::pqsignal(pg_sys::SIGTERM as i32, Some(postgres_die));
        pg_sys::BackgroundWorkerUnblockSignals();
    }
}

/// Whether the caller's transaction (identified by its virtual transaction id)
/// has ended.
pub(super) fn caller_ended(backend: i32, lxid: u32) -> bool {
    let caller = pg_sys::VirtualTransactionId {
        backendId: backend,
        localTransactionId: lxid,
    };
    // SAFETY: VirtualXactLock with wait = false only checks whether that virtual
    // transaction still runs; false means it does.
    unsafe { pg_sys::VirtualXactLock(caller, false) }
}

/// Runs `work` in a transaction of the worker's own and commits it; an ERROR
/// inside aborts it and comes back as its SQLSTATE and message.
pub(super) fn in_own_transaction(work: impl FnOnce()) -> Result<(), (i32, String)> {
    let result = PgTryBuilder::new(std::panic::AssertUnwindSafe(|| {
        // SAFETY: the standard transaction bracket of a background worker; an
        // ERROR inside unwinds to the catch below, which aborts the transaction.
        unsafe {
            pg_sys::SetCurrentStatementStartTimestamp();
            pg_sys::StartTransactionCommand();
            pg_sys::PushActiveSnapshot(pg_sys::GetTransactionSnapshot());
        }
        work();
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
