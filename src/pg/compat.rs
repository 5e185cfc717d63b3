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
//! - 18: a tuple descriptor's full attributes follow its compact ones (no
//!   `attrs` field: [`attributes`]); `ExecCheckIndexConstraints` takes the
//!   tuple id of an updated row (none here); `RelationGetPrimaryKeyIndex` takes
//!   `deferrable_ok` (false: the deferrable key of 15 and 17 is no key here
//!   either); `index_beginscan` takes instrumentation (none); the backend's
//!   `pqsignal` is `pqsignal_be`.

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

/// The attributes (columns, dropped ones included) of a tuple descriptor.
///
/// # Safety
/// `desc` is a valid tuple descriptor that outlives the slice.
pub unsafe fn attributes<'a>(desc: pg_sys::TupleDesc) -> &'a [pg_sys::FormData_pg_attribute] {
    #[cfg(any(feature = "pg15", feature = "pg17"))]
    // SAFETY: the caller's promise; attrs has natts entries.
    unsafe {
        (*desc).attrs.as_slice((*desc).natts as usize)
    }
    #[cfg(feature = "pg18")]
    // SAFETY: the caller's promise; in 18 the natts full attributes are laid
    // out right after the natts compact ones (TupleDescAttr in tupdesc.h).
    unsafe {
        let natts = (*desc).natts as usize;
        let first = (*desc)
            .compact_attrs
            .as_ptr()
            .add(natts)
            .cast::<pg_sys::FormData_pg_attribute>();
        std::slice::from_raw_parts(first, natts)
    }
}

/// `ExecCheckIndexConstraints` for a row about to be inserted: false (and the
/// conflicting row's tid in `conflict`) when an arbiter index already holds its
/// key.
///
/// # Safety
/// As `ExecCheckIndexConstraints`: `info` has its indexes open in `estate` and
/// `slot` holds the row.
pub unsafe fn check_index_constraints(
    info: *mut pg_sys::ResultRelInfo,
    slot: *mut pg_sys::TupleTableSlot,
    estate: *mut pg_sys::EState,
    conflict: *mut pg_sys::ItemPointerData,
    arbiter_indexes: *mut pg_sys::List,
) -> bool {
    #[cfg(any(feature = "pg15", feature = "pg17"))]
    // SAFETY: the caller upholds this function's # Safety contract.
    unsafe {
        pg_sys::ExecCheckIndexConstraints(info, slot, estate, conflict, arbiter_indexes)
    }
    #[cfg(feature = "pg18")]
    // SAFETY: the caller upholds this function's # Safety contract; no updated
    // row's tid.
    unsafe {
        pg_sys::ExecCheckIndexConstraints(
            info,
            slot,
            estate,
            conflict,
            std::ptr::null_mut(),
            arbiter_indexes,
        )
    }
}

/// The oid of `rel`'s primary key index (not a deferrable one), or InvalidOid.
///
/// # Safety
/// `rel` is an open relation.
pub unsafe fn primary_key_index(rel: pg_sys::Relation) -> pg_sys::Oid {
    #[cfg(any(feature = "pg15", feature = "pg17"))]
    // SAFETY: the caller's promise.
    unsafe {
        pg_sys::RelationGetPrimaryKeyIndex(rel)
    }
    #[cfg(feature = "pg18")]
    // SAFETY: the caller's promise.
    unsafe {
        pg_sys::RelationGetPrimaryKeyIndex(rel, false)
    }
}

/// `index_beginscan` with no instrumentation.
///
/// # Safety
/// As `index_beginscan`: both relations open and locked, `snapshot` registered
/// or active for the scan's life.
pub unsafe fn index_beginscan(
    heap: pg_sys::Relation,
    index: pg_sys::Relation,
    snapshot: pg_sys::Snapshot,
    nkeys: i32,
    norderbys: i32,
) -> pg_sys::IndexScanDesc {
    #[cfg(any(feature = "pg15", feature = "pg17"))]
    // SAFETY: the caller upholds this function's # Safety contract.
    unsafe {
        pg_sys::index_beginscan(heap, index, snapshot, nkeys, norderbys)
    }
    #[cfg(feature = "pg18")]
    // SAFETY: the caller upholds this function's # Safety contract.
    unsafe {
        pg_sys::index_beginscan(
            heap,
            index,
            snapshot,
            std::ptr::null_mut(),
            nkeys,
            norderbys,
        )
    }
}

/// Installs `handler` for `signal` in this backend (`pqsignal`).
///
/// # Safety
/// Runs on the backend's main thread; `handler` is safe to run as a signal
/// handler.
pub unsafe fn set_signal_handler(signal: u32, handler: unsafe extern "C-unwind" fn(i32)) {
    #[cfg(any(feature = "pg15", feature = "pg17"))]
    // SAFETY: the caller upholds this function's # Safety contract.
    unsafe {
        pg_sys::pqsignal(signal as i32, Some(handler));
    }
    #[cfg(feature = "pg18")]
    // SAFETY: the caller upholds this function's # Safety contract.
    unsafe {
        pg_sys::pqsignal_be(signal as i32, Some(handler));
    }
}
