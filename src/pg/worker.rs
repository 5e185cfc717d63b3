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
use pgrx::pg_sys::{self, Oid};
use pgrx::prelude::*;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::time::{Duration, Instant};

const PENDING: u32 = 0;
const DONE: u32 = 1;
const FAILED: u32 = 2;

/// How a worker ended, as it reports it in shared memory (a worker's exit code
/// cannot be observed). Still `PENDING` after the worker stopped means it never
/// got to report (it could not connect, or was killed).
#[repr(C)]
pub struct Outcome {
    state: AtomicU32,
    sqlstate: i32,
    message_len: u32,
    message: [u8; 512],
}
impl Outcome {
    pub fn new() -> Outcome {
        Outcome {
            state: AtomicU32::new(PENDING),
            sqlstate: 0,
            message_len: 0,
            message: [0; 512],
        }
    }

    /// For the worker, once, at its end.
    pub fn set(&mut self, result: Result<(), (i32, String)>) {
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
    pub fn get(&self) -> Option<Result<(), (i32, String)>> {
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

/// What every job starts with: where the worker connects and as whom, the
/// caller's virtual transaction (so the worker can tell whether it still waits),
/// and the outcome.
///
/// A job for a backend names its database and role by oid; a job from a process
/// connected to no database (the maintenance launcher) names the database by
/// name, and the worker connects as the bootstrap superuser.
#[repr(C)]
pub struct Header {
    database: Oid,
    role: Oid,
    /// `-1` when no backend waits in a transaction (a job from the launcher).
    caller_backend: i32,
    caller_lxid: u32,
    /// NUL-terminated; used when `database` is invalid.
    database_name: [u8; pg_sys::NAMEDATALEN as usize],
    pub outcome: Outcome,
}

impl Header {
    /// For a job the current backend hands to a worker: this database, the
    /// current user, this transaction.
    pub fn of_caller() -> Header {
        // SAFETY: reads this backend's database, user and virtual transaction id;
        // MyProc is valid for the whole life of a backend.
        unsafe {
            Header {
                database: pg_sys::MyDatabaseId,
                role: pg_sys::GetUserId(),
                caller_backend: crate::pg::compat::my_proc_number(),
                caller_lxid: crate::pg::compat::my_local_xid(),
                database_name: [0; pg_sys::NAMEDATALEN as usize],
                outcome: Outcome::new(),
            }
        }
    }

    /// For a job from a process that is in no transaction of a database: the
    /// worker connects to the database `name` (shorter than an identifier's
    /// limit, else cut there) as the bootstrap superuser, and no caller's
    /// transaction is watched.
    pub fn for_database(name: &str) -> Header {
        let mut database_name = [0; pg_sys::NAMEDATALEN as usize];
        let bytes = name.as_bytes();
        let len = bytes.len().min(database_name.len() - 1);
        database_name[..len].copy_from_slice(&bytes[..len]);
        Header {
            database: pg_sys::InvalidOid,
            role: pg_sys::InvalidOid,
            caller_backend: -1,
            caller_lxid: 0,
            database_name,
            outcome: Outcome::new(),
        }
    }

    /// The database a [`Header::for_database`] job names.
    pub fn database_name(&self) -> String {
        let len = self
            .database_name
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(self.database_name.len());
        String::from_utf8_lossy(&self.database_name[..len]).into_owned()
    }

    /// For the worker: connects to the caller's database as the caller's role
    /// (or, for a [`Header::for_database`] job, to the named database as the
    /// bootstrap superuser). A database that does not exist is a FATAL error:
    /// the worker exits without reporting.
    pub fn connect(&self) {
        if self.database == pg_sys::InvalidOid {
            BackgroundWorker::connect_worker_to_spi(Some(&self.database_name()), None);
        } else {
            BackgroundWorker::connect_worker_to_spi_by_oid(Some(self.database), Some(self.role));
        }
    }

    /// For the worker: whether the caller's transaction (identified by its
    /// virtual transaction id) has ended. Never, for a job without a caller.
    pub fn caller_ended(&self) -> bool {
        if self.caller_backend < 0 {
            return false;
        }
        let caller = crate::pg::compat::virtual_xid(self.caller_backend, self.caller_lxid);
        // SAFETY: VirtualXactLock with wait = false only checks whether that
        // virtual transaction still runs; false means it does.
        unsafe { pg_sys::VirtualXactLock(caller, false) }
    }
}

/// A job's dynamic shared memory segment, on the caller's side.
struct Segment(*mut pg_sys::dsm_segment);

impl Segment {
    /// A new mapped segment of `size` bytes (an ERROR when there is no room). It
    /// belongs to the current resource owner, so an error before [`Segment::close`]
    /// detaches it.
    pub fn create(size: usize) -> Segment {
        // SAFETY: dsm_create returns a mapped segment of the requested size or
        // raises an ERROR.
        Segment(unsafe { pg_sys::dsm_create(size, 0) })
    }

    /// Where the segment is mapped.
    pub fn address(&self) -> *mut u8 {
        // SAFETY: the segment is attached while self lives.
        unsafe { pg_sys::dsm_segment_address(self.0) as *mut u8 }
    }

    /// The worker's argument.
    pub fn handle(&self) -> pg_sys::dsm_handle {
        // SAFETY: the handle identifies the segment created above.
        unsafe { pg_sys::dsm_segment_handle(self.0) }
    }

    /// Once the worker has stopped (or never started), in a process connected to
    /// no database (which has no catalog caches to refresh): detaches the segment.
    pub fn detach(self) {
        // SAFETY: no worker uses the segment any more, and nothing points into it
        // after this.
        unsafe { pg_sys::dsm_detach(self.0) };
    }

    /// Once the worker has stopped (or never started): detaches the segment and
    /// takes in the invalidations of what the worker committed, so this
    /// backend's caches see its catalog changes even where an earlier lookup
    /// cached their absence.
    pub fn close(self) {
        // SAFETY: no worker uses the segment any more, and nothing points into it
        // after this.
        unsafe { pg_sys::dsm_detach(self.0) };
        crate::pg::invalidation::accept();
    }
}

/// A job's segment, on the worker's side: attached from the worker's argument,
/// detached when dropped.
struct Attached(*mut pg_sys::dsm_segment);

impl Attached {
    /// The caller's segment; `None` when it is gone already (the caller gave
    /// up), in which case there is nothing to do.
    pub fn from_argument(arg: pg_sys::Datum) -> Option<Attached> {
        let handle = arg.value() as pg_sys::dsm_handle;
        // SAFETY: attaching by handle; NULL when the segment no longer exists.
        let segment = unsafe { pg_sys::dsm_attach(handle) };
        // Not `then_some`: it would build (and drop, detaching NULL) a guard for a
        // segment that is gone.
        if segment.is_null() {
            None
        } else {
            Some(Attached(segment))
        }
    }

    /// Where the segment is mapped.
    pub fn address(&self) -> *mut u8 {
        // SAFETY: attached while self lives.
        unsafe { pg_sys::dsm_segment_address(self.0) as *mut u8 }
    }
}

impl Drop for Attached {
    fn drop(&mut self) {
        // SAFETY: attached in from_argument, detached once here.
        unsafe { pg_sys::dsm_detach(self.0) };
    }
}

/// The fixed start of a job's segment: the [`Header`], which handler runs the
/// job, the worker's progress (readable by the caller at any time, e.g. after
/// the worker was lost) and the length of the payload that follows.
#[repr(C)]
struct Head {
    header: Header,
    kind: u32,
    progress: AtomicU64,
    len: u64,
}

/// Where the payload starts: after the head, 8-byte aligned.
const PAYLOAD_AT: usize = std::mem::size_of::<Head>().next_multiple_of(8);

/// A job for a dynamic worker, on the caller's side: its segment holds the
/// [`Header`], the job's kind (which registered handler runs it, see
/// [`on_job`]) and a payload of bytes the job's code encodes and decodes
/// itself, which the worker may write back (results). The bytes are read and
/// written one atomic byte at a time, so neither side can observe a torn
/// write, whatever the other does meanwhile.
pub struct Job {
    segment: Segment,
}

impl Job {
    /// A job of `kind` for the worker, with `payload`.
    pub fn create(kind: u32, header: Header, payload: &[u8]) -> Job {
        let segment = Segment::create(PAYLOAD_AT + payload.len());
        // SAFETY: the segment is mapped, page-aligned and large enough for the
        // head and the payload; both are written here, before any worker can
        // see the segment (its handle is not given out yet).
        unsafe {
            let base = segment.address();
            (base as *mut Head).write(Head {
                header,
                kind,
                progress: AtomicU64::new(0),
                len: payload.len() as u64,
            });
            std::ptr::copy_nonoverlapping(payload.as_ptr(), base.add(PAYLOAD_AT), payload.len());
        }
        Job { segment }
    }

    fn head(&self) -> &Head {
        // SAFETY: written in create; mapped while self lives; the worker touches
        // only the atomics and the outcome (whose fields it publishes with a
        // release store that Outcome::get pairs with an acquire load).
        unsafe { &*(self.segment.address() as *const Head) }
    }

    fn payload_cells(&self) -> &[AtomicU8] {
        let len = self.head().len as usize;
        // SAFETY: `len` bytes follow the head in the mapped segment; AtomicU8 has
        // the size and alignment of u8, and every access goes through it.
        unsafe {
            std::slice::from_raw_parts(
                self.segment.address().add(PAYLOAD_AT) as *const AtomicU8,
                len,
            )
        }
    }

    /// Starts a worker for the job (see [`launch`]).
    pub fn launch(&self, name: &str, wait: Duration) -> Option<DynamicBackgroundWorker> {
        launch(name, JOB_ENTRY, self.segment.handle(), wait)
    }

    /// The worker's report (see [`Outcome::get`]).
    pub fn outcome(&self) -> Option<Result<(), (i32, String)>> {
        self.head().header.outcome.get()
    }

    /// What the worker last set with [`AttachedJob::set_progress`].
    pub fn progress(&self) -> u64 {
        self.head().progress.load(Ordering::Acquire)
    }

    /// The payload as it is now (the worker's results once it has stopped).
    pub fn payload(&self) -> Vec<u8> {
        read_cells(self.payload_cells())
    }

    /// See [`Segment::close`].
    pub fn close(self) {
        self.segment.close();
    }

    /// See [`Segment::detach`].
    pub fn detach(self) {
        self.segment.detach();
    }
}

/// A job, on the worker's side (see [`Job`]).
pub struct AttachedJob {
    attached: Attached,
}

impl AttachedJob {
    fn head(&self) -> &Head {
        // SAFETY: the caller wrote the head before starting us; the segment stays
        // mapped while `attached` lives.
        unsafe { &*(self.attached.address() as *const Head) }
    }

    fn payload_cells(&self) -> &[AtomicU8] {
        let len = self.head().len as usize;
        // SAFETY: as in Job::payload_cells.
        unsafe {
            std::slice::from_raw_parts(
                self.attached.address().add(PAYLOAD_AT) as *const AtomicU8,
                len,
            )
        }
    }

    /// Where to connect, as whom, which caller asked.
    pub fn header(&self) -> &Header {
        &self.head().header
    }

    /// The job's payload.
    pub fn payload(&self) -> Vec<u8> {
        read_cells(self.payload_cells())
    }

    /// Writes results back into the payload from byte `offset` on (what does
    /// not fit is left out).
    pub fn write_payload_at(&self, offset: usize, bytes: &[u8]) {
        let cells = self.payload_cells().get(offset..).unwrap_or_default();
        for (cell, &byte) in cells.iter().zip(bytes) {
            cell.store(byte, Ordering::Relaxed);
        }
        std::sync::atomic::fence(Ordering::Release);
    }

    /// Publishes how far the job got.
    pub fn set_progress(&self, progress: u64) {
        self.head().progress.store(progress, Ordering::Release);
    }

    /// Reports the job's end, once.
    pub fn finish(&mut self, outcome: Result<(), (i32, String)>) {
        // SAFETY: as in head(); only this worker writes the outcome, once, at
        // its end, and the caller reads it after the release store inside.
        let head = unsafe { &mut *(self.attached.address() as *mut Head) };
        head.header.outcome.set(outcome);
    }
}

fn read_cells(cells: &[AtomicU8]) -> Vec<u8> {
    std::sync::atomic::fence(Ordering::Acquire);
    cells
        .iter()
        .map(|cell| cell.load(Ordering::Relaxed))
        .collect()
}

/// A job's fields encoded into its payload, in order (little-endian), and read
/// back in the same order with [`Fields::reader`].
#[derive(Default)]
pub struct Fields(Vec<u8>);

impl Fields {
    pub fn with_capacity(bytes: usize) -> Fields {
        Fields(Vec::with_capacity(bytes))
    }

    pub fn i64(&mut self, value: i64) -> &mut Fields {
        self.0.extend_from_slice(&value.to_le_bytes());
        self
    }

    pub fn i32(&mut self, value: i32) -> &mut Fields {
        self.0.extend_from_slice(&value.to_le_bytes());
        self
    }

    pub fn u32(&mut self, value: u32) -> &mut Fields {
        self.0.extend_from_slice(&value.to_le_bytes());
        self
    }

    pub fn bool(&mut self, value: bool) -> &mut Fields {
        self.0.push(u8::from(value));
        self
    }

    pub fn bytes(&self) -> &[u8] {
        &self.0
    }

    /// Reads fields from `bytes` in the order they were written.
    pub fn reader(bytes: &[u8]) -> FieldReader<'_> {
        FieldReader(bytes)
    }
}

/// Reads back what [`Fields`] wrote; `None` once the bytes run out.
pub struct FieldReader<'a>(&'a [u8]);

impl FieldReader<'_> {
    fn take<const N: usize>(&mut self) -> Option<[u8; N]> {
        let (head, rest) = self.0.split_first_chunk::<N>()?;
        self.0 = rest;
        Some(*head)
    }

    pub fn i64(&mut self) -> Option<i64> {
        self.take().map(i64::from_le_bytes)
    }

    pub fn i32(&mut self) -> Option<i32> {
        self.take().map(i32::from_le_bytes)
    }

    pub fn u32(&mut self) -> Option<u32> {
        self.take().map(u32::from_le_bytes)
    }

    pub fn bool(&mut self) -> Option<bool> {
        self.take::<1>().map(|[b]| b != 0)
    }
}

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
const JOB_ENTRY: &str = "envelopes_job_worker";

/// Entry point of every job worker: attaches the caller's segment and runs the
/// handler registered for the job's kind. A job whose caller gave up (the
/// segment is gone) is not run; a kind without a handler is reported as failed.
#[pg_guard]
#[unsafe(no_mangle)]
pub extern "C-unwind" fn envelopes_job_worker(arg: pg_sys::Datum) {
    install_sigterm();
    let Some(attached) = Attached::from_argument(arg) else {
        return;
    };
    let mut job = AttachedJob { attached };
    match handler_of(&JOB_HANDLERS, job.head().kind) {
        Some(handler) => handler(&mut job),
        None => job.finish(Err((
            PgSqlErrorCode::ERRCODE_INTERNAL_ERROR as i32,
            format!("no handler for background job kind {}", job.head().kind),
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
