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
//! the caller falls back to creating in its own transaction and logs it.

use super::PartitionError;
use crate::gucs;
use crate::locks;
use pgrx::bgworkers::{BackgroundWorker, BackgroundWorkerBuilder, BackgroundWorkerStatus};
use pgrx::pg_sys::{self, Oid};
use pgrx::prelude::*;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

const PENDING: u32 = 0;
const DONE: u32 = 1;
const FAILED: u32 = 2;

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
    state: AtomicU32,
    sqlstate: i32,
    message_len: u32,
    message: [u8; 512],
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
            state: AtomicU32::new(PENDING),
            sqlstate: 0,
            message_len: 0,
            message: [0; 512],
        });
        (segment, &*job)
    };
    // SAFETY: the handle identifies the segment created above.
    let handle = unsafe { pg_sys::dsm_segment_handle(segment) };

    let mut worker = None;
    for _ in 0..3 {
        let builder = BackgroundWorkerBuilder::new("pg_envelopes partition creator")
            .set_type("pg_envelopes partition creator")
            .set_library("pg_envelopes")
            .set_function("envelopes_partition_worker")
            .set_argument(Some(pg_sys::Datum::from(handle)))
            .enable_spi_access()
            // SAFETY: MyProcPid is this backend's pid.
            .set_notify_pid(unsafe { pg_sys::MyProcPid });
        match builder.load_dynamic() {
            Ok(w) => {
                worker = Some(w);
                break;
            }
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
    let Some(worker) = worker else {
        // SAFETY: detaching the segment created above.
        unsafe { pg_sys::dsm_detach(segment) };
        return Ok(Err(Fallback::NoSlot));
    };

    let deadline = Instant::now() + gucs::partition_worker_timeout();
    loop {
        match worker.pid() {
            Err(BackgroundWorkerStatus::Stopped) => break,
            Err(BackgroundWorkerStatus::PostmasterDied) => {
                return Err(PartitionError::WorkerLost("the postmaster died".into()));
            }
            _ => {}
        }
        // SAFETY: reading flags that signal handlers set.
        let cancelled = unsafe { pg_sys::QueryCancelPending != 0 || pg_sys::ProcDiePending != 0 };
        if cancelled || Instant::now() > deadline {
            // Stop the worker before giving up, so it cannot commit after we return.
            worker.terminate().wait_for_shutdown().ok();
            check_for_interrupts!(); // raises the cancel, if that is what it was
            return Err(PartitionError::WorkerTimeout(
                gucs::partition_worker_timeout(),
            ));
        }
        // Other interrupts (a barrier, a cache catch-up) are handled and the wait
        // goes on.
        check_for_interrupts!();
        // SAFETY: waiting on our own latch; the postmaster sets it when the worker
        // starts or stops (notify pid), the timeout bounds each wait.
        unsafe {
            pg_sys::WaitLatch(
                pg_sys::MyLatch,
                (pg_sys::WL_LATCH_SET | pg_sys::WL_TIMEOUT | pg_sys::WL_EXIT_ON_PM_DEATH) as i32,
                50,
                pg_sys::PG_WAIT_EXTENSION,
            );
            pg_sys::ResetLatch(pg_sys::MyLatch);
        }
    }

    let outcome = match job.state.load(Ordering::Acquire) {
        DONE => Ok(Ok(())),
        FAILED => {
            let len = (job.message_len as usize).min(job.message.len());
            let message = String::from_utf8_lossy(&job.message[..len]).into_owned();
            Err(PartitionError::WorkerFailed {
                sqlstate: job.sqlstate,
                message,
            })
        }
        _ => Ok(Err(Fallback::NoReport)),
    };
    // SAFETY: the worker has stopped; nothing else uses the segment.
    unsafe { pg_sys::dsm_detach(segment) };
    // The worker's catalog changes are committed; make sure this backend's caches
    // see them even if an earlier lookup cached their absence.
    // SAFETY: plain call into the invalidation machinery.
    unsafe { pg_sys::AcceptInvalidationMessages() };
    outcome
}

/// Entry point of the worker process.
#[pg_guard]
#[unsafe(no_mangle)]
pub extern "C-unwind" fn envelopes_partition_worker(arg: pg_sys::Datum) {
    // SAFETY: runs once at worker start on the main thread: installs Postgres'
    // own SIGTERM handler so a lock wait can be terminated, then unblocks signals.
    unsafe {
        pg_sys::pqsignal(pg_sys::SIGTERM as i32, Some(postgres_die));
        pg_sys::BackgroundWorkerUnblockSignals();
    }
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
        result = PgTryBuilder::new(|| {
            create_once(job);
            Ok(())
        })
        .catch_others(|error| {
            let report = match error {
                pgrx::pg_sys::panic::CaughtError::PostgresError(r)
                | pgrx::pg_sys::panic::CaughtError::ErrorReport(r)
                | pgrx::pg_sys::panic::CaughtError::RustPanic { ereport: r, .. } => r,
            };
            Err((report.sql_error_code() as i32, report.message().to_owned()))
        })
        .execute();
        if result.is_ok() {
            break;
        }
        // SAFETY: leaves the failed transaction so the next attempt starts clean.
        unsafe { pg_sys::AbortCurrentTransaction() };
        let lock_timeout = PgSqlErrorCode::ERRCODE_LOCK_NOT_AVAILABLE as i32;
        if !matches!(&result, Err((code, _)) if *code == lock_timeout) || attempt == job.attempts {
            break;
        }
        std::thread::sleep(Duration::from_millis(20 * u64::from(attempt as u32)));
    }
    match result {
        Ok(()) => job.state.store(DONE, Ordering::Release),
        Err((code, message)) => {
            let bytes = message.as_bytes();
            let len = bytes.len().min(job.message.len());
            job.message[..len].copy_from_slice(&bytes[..len]);
            job.message_len = len as u32;
            job.sqlstate = code;
            job.state.store(FAILED, Ordering::Release);
        }
    }
    // SAFETY: done with the segment.
    unsafe { pg_sys::dsm_detach(segment) };
}

/// One attempt, in one transaction: create what is missing under the creation
/// lock, and commit only if the caller is still waiting for it.
fn create_once(job: &Job) {
    // SAFETY: the standard transaction bracket of a background worker; any ERROR
    // inside propagates to the caller of this function, which aborts it.
    unsafe {
        pg_sys::SetCurrentStatementStartTimestamp();
        pg_sys::StartTransactionCommand();
        pg_sys::PushActiveSnapshot(pg_sys::GetTransactionSnapshot());
    }
    Spi::run(&format!(
        "SET LOCAL lock_timeout = {}",
        job.lock_timeout_ms.max(1)
    ))
    .unwrap_or_else(|e| error!("could not set lock_timeout: {e}"));
    locks::lock_partition_creation();
    if let Err(e) = super::create_locked(job.node, job.seq, job.width) {
        crate::error::OrRaise::or_raise(Err::<(), _>(e));
    }
    let caller = pg_sys::VirtualTransactionId {
        backendId: job.caller_backend,
        localTransactionId: job.caller_lxid,
    };
    // SAFETY: VirtualXactLock with wait = false only checks whether that virtual
    // transaction still runs; false means it does.
    let caller_ended = unsafe { pg_sys::VirtualXactLock(caller, false) };
    if caller_ended {
        error!("the session that asked for this partition is gone; not creating it");
    }
    // SAFETY: closes the bracket opened above.
    unsafe {
        pg_sys::PopActiveSnapshot();
        pg_sys::CommitTransactionCommand();
    }
}
