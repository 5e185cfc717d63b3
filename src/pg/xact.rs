//! Whether the current transaction may write: the first thing every function
//! that writes (the insert functions, `publish`, `ensure_gateway_parts`,
//! `prune_expired`) asks.
//!
//! Postgres refuses a plain `INSERT` in a READ ONLY transaction, on a hot standby
//! and in parallel mode before it does anything. The extension's functions write
//! without an executor run (the direct write path), or in a background worker
//! whose transaction is not the caller's, so nothing would refuse them: they ask
//! here, before any lock, worker launch or write, and answer 25006 as Postgres
//! does.

use crate::error::{PgSqlErrorCode, SqlError};
use pgrx::pg_sys;

/// Why the current transaction may not write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// A hot standby (recovery in progress).
    Recovery,
    /// `BEGIN READ ONLY`, `SET TRANSACTION READ ONLY` or
    /// `default_transaction_read_only`.
    ReadOnly,
    /// A parallel operation (a parallel worker, or a leader running one).
    Parallel,
}

/// A writing function called where the transaction may not write.
#[derive(Debug, thiserror::Error)]
#[error("cannot execute {what} {}", match .why {
    Why::Recovery => "during recovery",
    Why::ReadOnly => "in a read-only transaction",
    Why::Parallel => "during a parallel operation",
})]
pub struct NotWritable {
    pub what: &'static str,
    pub why: Why,
}

impl SqlError for NotWritable {
    fn sqlstate(&self) -> PgSqlErrorCode {
        PgSqlErrorCode::ERRCODE_READ_ONLY_SQL_TRANSACTION
    }

    fn hint(&self) -> Option<String> {
        match self.why {
            Why::Recovery => Some("Run it on the primary.".into()),
            Why::ReadOnly | Why::Parallel => None,
        }
    }
}

/// `Ok` when the current transaction may write; the function's name goes into
/// the error.
pub fn check_writable(what: &'static str) -> Result<(), NotWritable> {
    // SAFETY: reads backend state only (RecoveryInProgress reads shared memory
    // through a backend-local cache, as Postgres' own read-only checks do).
    let why = unsafe {
        if pg_sys::RecoveryInProgress() {
            Some(Why::Recovery)
        } else if pg_sys::XactReadOnly {
            Some(Why::ReadOnly)
        } else if pg_sys::IsInParallelMode() {
            Some(Why::Parallel)
        } else {
            None
        }
    };
    match why {
        Some(why) => Err(NotWritable { what, why }),
        None => Ok(()),
    }
}

/// This backend's local transaction id: it changes with every transaction, so
/// per-transaction state kept in a backend (a thread-local) can tell whether it
/// belongs to the current one.
pub fn local_xid() -> u32 {
    crate::pg::compat::my_local_xid()
}

/// The local transaction id and the current subtransaction's id.
pub fn local_xid_and_subxact() -> (u32, pg_sys::SubTransactionId) {
    // SAFETY: as in local_xid; GetCurrentSubTransactionId reads backend state.
    (local_xid(), unsafe { pg_sys::GetCurrentSubTransactionId() })
}

/// The top-level transaction's full id, 0 when none is assigned yet (it has not
/// written).
pub fn top_xid_if_any() -> u64 {
    // SAFETY: reads backend state; returns InvalidFullTransactionId (0) when none.
    unsafe { pg_sys::GetTopFullTransactionIdIfAny() }.value
}

/// Whether this server is in recovery (a standby, or a primary still replaying).
pub fn in_recovery() -> bool {
    // SAFETY: reads shared state through a backend-local cache.
    unsafe { pg_sys::RecoveryInProgress() }
}

/// Queues a notification on `channel` for the end of the current transaction,
/// as `pg_notify(channel, payload)` does (an ERROR for a channel name that is
/// empty or too long, or a payload over 8000 bytes).
pub fn notify(channel: &str, payload: &str) {
    use pgrx::IntoDatum;
    // SAFETY: direct call of the built-in pg_notify(text, text) with two
    // non-NULL text datums built from Rust strings.
    unsafe {
        pgrx::fcinfo::direct_function_call::<()>(
            pg_sys::pg_notify,
            &[channel.into_datum(), payload.into_datum()],
        );
    }
}

/// Has `f` told the id of every subtransaction of this backend that rolls
/// back (from then on, for the life of the backend). Registering the same
/// function again does nothing. `f` runs inside the abort and must not raise.
pub fn on_subxact_abort(f: fn(pg_sys::SubTransactionId)) {
    let first = SUBXACT_ABORT_HANDLERS.with(|handlers| {
        let mut handlers = handlers.borrow_mut();
        let first = handlers.is_empty();
        if !handlers.iter().any(|h| std::ptr::fn_addr_eq(*h, f)) {
            handlers.push(f);
        }
        first
    });
    if first {
        // SAFETY: registers a callback with a static lifetime, once per backend.
        unsafe { pg_sys::RegisterSubXactCallback(Some(subxact_event), std::ptr::null_mut()) };
    }
}

thread_local! {
    static SUBXACT_ABORT_HANDLERS: std::cell::RefCell<Vec<fn(pg_sys::SubTransactionId)>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn subxact_event(
    event: pg_sys::SubXactEvent::Type,
    my_subid: pg_sys::SubTransactionId,
    _parent: pg_sys::SubTransactionId,
    _arg: *mut std::ffi::c_void,
) {
    if event == pg_sys::SubXactEvent::SUBXACT_EVENT_ABORT_SUB {
        let handlers = SUBXACT_ABORT_HANDLERS.with(|h| h.borrow().clone());
        for handler in handlers {
            handler(my_subid);
        }
    }
}

/// Whether the current statement runs inside a transaction block (BEGIN ...).
pub fn in_transaction_block() -> bool {
    // SAFETY: reads backend state only.
    unsafe { pg_sys::IsTransactionBlock() }
}

/// Makes this transaction's earlier changes visible to the snapshots taken
/// after it, as the next statement would see them.
pub fn command_counter_increment() {
    // SAFETY: a plain call, allowed anywhere in a transaction.
    unsafe { pg_sys::CommandCounterIncrement() }
}

/// Whether `session_replication_role` is `replica` (triggers and rules then
/// fire only when enabled for replicas or always).
pub fn replication_role_is_replica() -> bool {
    // SAFETY: reads a backend-global setting.
    unsafe { pg_sys::SessionReplicationRole == pg_sys::SESSION_REPLICATION_ROLE_REPLICA as i32 }
}
