//! A job in a dynamic shared memory segment: the [`Header`] (where to connect,
//! as whom, for which caller, and the [`Outcome`]) and the payload after it,
//! seen from the caller ([`Job`]) and from the worker ([`AttachedJob`]).

use super::{launch, JOB_ENTRY};
use pgrx::bgworkers::{BackgroundWorker, DynamicBackgroundWorker};
use pgrx::pg_sys::{self, Oid};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::time::Duration;

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
    /// The job whose segment handle a job worker was started with; `None` when
    /// the caller gave up and the segment is gone.
    pub(super) fn attach(arg: pg_sys::Datum) -> Option<AttachedJob> {
        Attached::from_argument(arg).map(|attached| AttachedJob { attached })
    }

    /// The job's kind, which picks its handler.
    pub(super) fn kind(&self) -> u32 {
        self.head().kind
    }

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
