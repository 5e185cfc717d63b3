//! Every difference between the Postgres majors this extension builds for (15,
//! 17 and 18: one `pgNN` Cargo feature per build) in one place. Each function
//! here stands for one server API whose shape changed; the rest of `src/pg`
//! calls these, and nothing outside this module names a major.
//!
//! What changed, and since when:
//! - 16: `ExecInsertIndexTuples` takes `onlySummarizing` (false here: every
//!   index of a fresh row gets its entry); a partition's strategy in its bound
//!   info is the enum `PartitionStrategy` instead of a `char`.
//! - 17: `PGPROC.lxid` moved into `PGPROC.vxid`; backends are named by their
//!   `ProcNumber` (`MyProcNumber`) instead of a `BackendId`, and a
//!   `VirtualTransactionId` carries that; `LockHeldByMe` takes `orstronger`
//!   (false here: the exact mode, as before).

use pgrx::pg_sys;

/// The number that names this backend among the server's processes (with the
/// local transaction id it makes a virtual transaction id).
pub fn my_proc_number() -> i32 {
    #[cfg(feature = "pg15")]
    // SAFETY: MyBackendId is set once at backend start and never changes.
    unsafe {
        pg_sys::MyBackendId
    }
    #[cfg(any(feature = "pg17", feature = "pg18"))]
    // SAFETY: MyProcNumber is set once at backend start and never changes.
    unsafe {
        pg_sys::MyProcNumber
    }
}

/// This backend's local transaction id.
pub fn my_local_xid() -> pg_sys::LocalTransactionId {
    #[cfg(feature = "pg15")]
    // SAFETY: MyProc is this backend's PGPROC, valid for the backend's life.
    unsafe {
        (*pg_sys::MyProc).lxid
    }
    #[cfg(any(feature = "pg17", feature = "pg18"))]
    // SAFETY: MyProc is this backend's PGPROC, valid for the backend's life.
    unsafe {
        (*pg_sys::MyProc).vxid.lxid
    }
}

/// The virtual transaction id of backend `proc_number`'s transaction `lxid`.
pub fn virtual_xid(
    proc_number: i32,
    lxid: pg_sys::LocalTransactionId,
) -> pg_sys::VirtualTransactionId {
    #[cfg(feature = "pg15")]
    {
        pg_sys::VirtualTransactionId {
            backendId: proc_number,
            localTransactionId: lxid,
        }
    }
    #[cfg(any(feature = "pg17", feature = "pg18"))]
    {
        pg_sys::VirtualTransactionId {
            procNumber: proc_number,
            localTransactionId: lxid,
        }
    }
}

/// Whether this backend holds `tag` in exactly `mode`.
pub fn lock_held_by_me(tag: &pg_sys::LOCKTAG, mode: pg_sys::LOCKMODE) -> bool {
    #[cfg(feature = "pg15")]
    // SAFETY: LockHeldByMe only looks the tag up in this backend's lock table.
    unsafe {
        pg_sys::LockHeldByMe(tag, mode)
    }
    #[cfg(any(feature = "pg17", feature = "pg18"))]
    // SAFETY: as above.
    unsafe {
        pg_sys::LockHeldByMe(tag, mode, false)
    }
}

/// Whether a partitioned table's bound info is of range partitioning.
pub fn is_range_strategy(info: &pg_sys::PartitionBoundInfoData) -> bool {
    #[cfg(feature = "pg15")]
    {
        info.strategy as u8 == pg_sys::PARTITION_STRATEGY_RANGE
    }
    #[cfg(any(feature = "pg17", feature = "pg18"))]
    {
        info.strategy == pg_sys::PartitionStrategy::PARTITION_STRATEGY_RANGE
    }
}

/// `ExecInsertIndexTuples` for a row just inserted into `info`'s relation:
/// entries in every index; returns the list of indexes to recheck.
///
/// # Safety
/// As `ExecInsertIndexTuples`: `info` has its indexes open in `estate`, and
/// `slot` holds the row just inserted (with its tid); `spec_conflict` is null
/// or points to a bool.
pub unsafe fn insert_index_tuples(
    info: *mut pg_sys::ResultRelInfo,
    slot: *mut pg_sys::TupleTableSlot,
    estate: *mut pg_sys::EState,
    no_dup_err: bool,
    spec_conflict: *mut bool,
    arbiter_indexes: *mut pg_sys::List,
) -> *mut pg_sys::List {
    #[cfg(feature = "pg15")]
    // SAFETY: the caller upholds this function's # Safety contract.
    unsafe {
        pg_sys::ExecInsertIndexTuples(
            info,
            slot,
            estate,
            false,
            no_dup_err,
            spec_conflict,
            arbiter_indexes,
        )
    }
    #[cfg(any(feature = "pg17", feature = "pg18"))]
    // SAFETY: the caller upholds this function's # Safety contract.
    unsafe {
        pg_sys::ExecInsertIndexTuples(
            info,
            slot,
            estate,
            false,
            no_dup_err,
            spec_conflict,
            arbiter_indexes,
            false,
        )
    }
}
