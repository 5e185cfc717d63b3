//! Advisory locks the extension takes for itself.
//!
//! They live in the advisory lock space (visible in `pg_locks` with
//! `locktype = 'advisory'`) but use a `objsubid` value that the SQL-level
//! `pg_advisory_*` functions never produce (those use 1 and 2), so they cannot
//! collide with an application's own advisory locks.

use pgrx::pg_sys;

/// `objsubid` of the lock that serializes partition creation in one database.
pub const CREATION_LOCK_SUBID: u16 = 0x4501;

fn advisory_tag(field1: u32, field2: u32, field3: u32, subid: u16) -> pg_sys::LOCKTAG {
    pg_sys::LOCKTAG {
        locktag_field1: field1,
        locktag_field2: field2,
        locktag_field3: field3,
        locktag_field4: subid,
        locktag_type: pg_sys::LockTagType::LOCKTAG_ADVISORY as u8,
        locktag_lockmethodid: pg_sys::USER_LOCKMETHOD as u8,
    }
}

/// Takes the per-database partition-creation lock in exclusive mode until the end
/// of the current transaction. Waits like any heavyweight lock: interruptible,
/// subject to `lock_timeout` and to the deadlock detector.
pub fn lock_partition_creation() {
    let tag = creation_tag();
    // SAFETY: the tag is a fully initialised advisory LOCKTAG on the stack;
    // LockAcquire copies it. A transaction-level (non-session) lock is released by
    // the lock manager at commit or abort. Errors (deadlock, timeout) are raised as
    // Postgres ERRORs, which pgrx turns into a Rust unwind and back.
    unsafe {
        pg_sys::LockAcquire(
            &tag,
            pg_sys::ExclusiveLock as pg_sys::LOCKMODE,
            false,
            false,
        );
    }
}

/// Releases the creation lock before the end of the transaction. Only for a
/// holder that created nothing under it (the lock was granted, and the partition
/// turned out to exist already).
pub fn unlock_partition_creation() {
    let tag = creation_tag();
    // SAFETY: releases a lock this backend holds in this mode (just acquired by
    // lock_partition_creation); LockRelease only warns if it is not held.
    unsafe {
        pg_sys::LockRelease(&tag, pg_sys::ExclusiveLock as pg_sys::LOCKMODE, false);
    }
}

fn creation_tag() -> pg_sys::LOCKTAG {
    // SAFETY: MyDatabaseId is set once the backend is connected to a database, which
    // every caller of an extension function is.
    let database = unsafe { pg_sys::MyDatabaseId };
    advisory_tag(database.to_u32(), 0, 0, CREATION_LOCK_SUBID)
}

/// Takes `RowExclusiveLock` on a relation, as an INSERT would. Processes pending
/// invalidation messages when the lock is new to this transaction.
pub fn lock_for_insert(relid: pg_sys::Oid) {
    // SAFETY: LockRelationOid accepts any oid (a lock on a dropped relation is
    // harmless) and raises a Postgres ERROR on failure.
    unsafe { pg_sys::LockRelationOid(relid, pg_sys::RowExclusiveLock as pg_sys::LOCKMODE) }
}
