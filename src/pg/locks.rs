//! Advisory locks the extension takes for itself (the change feed's in-flight
//! markers are in the store's feed, which also reads them back).
//!
//! # Lock order
//!
//! Every path takes what it waits for in this order, and nothing waits for an
//! earlier lock while holding a later one:
//!
//! 1. relation locks of the rows being inserted: originator partition, then band
//!    leaf (ROW EXCLUSIVE, as the executor takes them);
//! 2. the prune guard of a band about to be created or filled (share);
//! 3. the band-launch lock (sessions sharing one creation worker);
//! 4. the creation lock, then the DDL's own locks (SHARE UPDATE EXCLUSIVE on the
//!    parent for ATTACH).
//!
//! `prune_expired` is outside the order on purpose: it asks for every lock it
//! takes (ACCESS EXCLUSIVE on parents and leaves, then the prune guard) without
//! waiting, releases all of them when one is refused, and so never waits while
//! holding anything (see the store's retention). A waiter that holds nothing
//! closes no cycle, which is why pruning cannot deadlock with creation.
//!
//! The advisory locks live in the advisory lock space (visible in `pg_locks` with
//! `locktype = 'advisory'`) but use a `objsubid` value that the SQL-level
//! `pg_advisory_*` functions never produce (those use 1 and 2), so they cannot
//! collide with an application's own advisory locks.

use pgrx::pg_sys;

/// `objsubid` of the lock that serializes partition creation in one database.
pub const CREATION_LOCK_SUBID: u16 = 0x4501;

/// `objsubid` of the lock a session holds while its worker creates one band, so
/// that sessions needing the same band wait for that worker instead of starting
/// their own (`database` = node, `classid` = database, `objid` = a hash of the
/// band's start).
pub const LAUNCH_SUBID: u16 = 0x4503;

/// `objsubid` of the lock that keeps `prune_expired` away from a band a session
/// has just created or found and not yet inserted into: the session holds it in
/// share mode until its transaction ends, prune needs it exclusively (`database`
/// = node, `classid` = database, `objid` = a hash of the band's lower bound).
pub const PRUNE_GUARD_SUBID: u16 = 0x4504;

/// `objsubid` of a bridge's lease (see the store's leases): `classid` and `objid`
/// are the two halves of the lease's 64-bit key. (0x4502, 0x4505 and 0x4506
/// are the change feed's markers.)
pub const LEASE_SUBID: u16 = 0x4507;

/// An advisory LOCKTAG with an `objsubid` of the extension's own.
pub fn advisory_tag(field1: u32, field2: u32, field3: u32, subid: u16) -> pg_sys::LOCKTAG {
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
/// subject to `lock_timeout` and to the deadlock detector. Returns false when the
/// transaction already held it.
pub fn lock_partition_creation() -> bool {
    let tag = creation_tag();
    // SAFETY: the tag is a fully initialised advisory LOCKTAG on the stack;
    // LockAcquire copies it. A transaction-level (non-session) lock is released by
    // the lock manager at commit or abort. Errors (deadlock, timeout) are raised as
    // Postgres ERRORs, which pgrx turns into a Rust unwind and back.
    let result = unsafe {
        pg_sys::LockAcquire(
            &tag,
            pg_sys::ExclusiveLock as pg_sys::LOCKMODE,
            false,
            false,
        )
    };
    result != pg_sys::LockAcquireResult::LOCKACQUIRE_ALREADY_HELD
        && result != pg_sys::LockAcquireResult::LOCKACQUIRE_ALREADY_CLEAR
}

fn launch_tag(node: i32, band_start: i64) -> pg_sys::LOCKTAG {
    // SAFETY: MyDatabaseId is set once the backend is connected to a database.
    let database = unsafe { pg_sys::MyDatabaseId };
    // Two bands hashing alike only make one session wait for the other's worker
    // and then look again.
    let start = band_start as u64;
    advisory_tag(
        node as u32,
        database.to_u32(),
        (start ^ (start >> 32)) as u32,
        LAUNCH_SUBID,
    )
}

/// Tries to become the session that creates this band; false when another
/// session already is.
pub fn try_lock_band_launch(node: i32, band_start: i64) -> bool {
    let tag = launch_tag(node, band_start);
    // SAFETY: as for the creation lock, with dontWait = true: returns at once.
    let result = unsafe {
        pg_sys::LockAcquire(&tag, pg_sys::ExclusiveLock as pg_sys::LOCKMODE, false, true)
    };
    result != pg_sys::LockAcquireResult::LOCKACQUIRE_NOT_AVAIL
}

/// Releases the band-launch lock taken by [`try_lock_band_launch`].
pub fn unlock_band_launch(node: i32, band_start: i64) {
    let tag = launch_tag(node, band_start);
    // SAFETY: releases a lock this backend holds in this mode.
    unsafe {
        pg_sys::LockRelease(&tag, pg_sys::ExclusiveLock as pg_sys::LOCKMODE, false);
    }
}

/// Waits until the session creating this band is done (a heavyweight lock wait:
/// interruptible and visible to the deadlock detector).
pub fn wait_for_band_launch(node: i32, band_start: i64) {
    let tag = launch_tag(node, band_start);
    // SAFETY: acquires and immediately releases a share lock on the tag.
    unsafe {
        pg_sys::LockAcquire(&tag, pg_sys::ShareLock as pg_sys::LOCKMODE, false, false);
        pg_sys::LockRelease(&tag, pg_sys::ShareLock as pg_sys::LOCKMODE, false);
    }
}

fn prune_guard_tag(node: i32, band_start: i64) -> pg_sys::LOCKTAG {
    // SAFETY: MyDatabaseId is set once the backend is connected to a database.
    let database = unsafe { pg_sys::MyDatabaseId };
    // Two bands hashing alike only make prune skip one more band for a while.
    let start = band_start as u64;
    advisory_tag(
        node as u32,
        database.to_u32(),
        (start ^ (start >> 32)) as u32,
        PRUNE_GUARD_SUBID,
    )
}

/// Keeps `prune_expired` from dropping the band of `node` starting at
/// `band_start` until this transaction ends: a band this session is about to fill
/// stays. Waits while a prune that took it first commits.
pub fn hold_off_prune(node: i32, band_start: i64) {
    let tag = prune_guard_tag(node, band_start);
    // SAFETY: as for the creation lock; share mode, transaction level.
    unsafe {
        pg_sys::LockAcquire(&tag, pg_sys::ShareLock as pg_sys::LOCKMODE, false, false);
    }
}

/// For `prune_expired`: true (and the lock kept until the transaction ends) when
/// no session is about to fill that band; false, without waiting, otherwise.
pub fn try_lock_for_prune(node: i32, band_start: i64) -> bool {
    let tag = prune_guard_tag(node, band_start);
    // SAFETY: as for the creation lock, with dontWait = true.
    let result = unsafe {
        pg_sys::LockAcquire(&tag, pg_sys::ExclusiveLock as pg_sys::LOCKMODE, false, true)
    };
    result != pg_sys::LockAcquireResult::LOCKACQUIRE_NOT_AVAIL
}

/// Releases the prune guard taken by [`try_lock_for_prune`], for a band that
/// turned out not to be droppable after all.
pub fn unlock_prune_guard(node: i32, band_start: i64) {
    let tag = prune_guard_tag(node, band_start);
    // SAFETY: releases a lock this backend holds in this mode.
    unsafe {
        pg_sys::LockRelease(&tag, pg_sys::ExclusiveLock as pg_sys::LOCKMODE, false);
    }
}

/// Whether this transaction holds the creation lock.
pub fn holds_partition_creation_lock() -> bool {
    let tag = creation_tag();
    crate::pg::compat::lock_held_by_me(&tag, pg_sys::ExclusiveLock as pg_sys::LOCKMODE)
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

/// The tag of the lease with this key in the current database.
pub fn lease_tag(key: u64) -> pg_sys::LOCKTAG {
    // SAFETY: MyDatabaseId is set once the backend is connected to a database.
    let database = unsafe { pg_sys::MyDatabaseId };
    advisory_tag(
        database.to_u32(),
        (key >> 32) as u32,
        key as u32,
        LEASE_SUBID,
    )
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

/// A relation lock held for a moment: taken (waiting like any relation lock) by
/// [`RelationLock::take`], given back when dropped (a lock the transaction held
/// already in the same mode stays held: the lock manager counts both).
pub struct RelationLock {
    relid: pg_sys::Oid,
    mode: pg_sys::LOCKMODE,
}

impl RelationLock {
    pub fn take(relid: pg_sys::Oid, mode: pg_sys::LOCKMODE) -> RelationLock {
        // SAFETY: LockRelationOid accepts any oid and raises a Postgres ERROR on
        // failure (before the guard exists, so nothing is given back then).
        unsafe { pg_sys::LockRelationOid(relid, mode) };
        RelationLock { relid, mode }
    }
}

impl Drop for RelationLock {
    fn drop(&mut self) {
        // SAFETY: gives back the one lock this guard took.
        unsafe { pg_sys::UnlockRelationOid(self.relid, self.mode) };
    }
}

/// The size of the lock table, as `(max_locks_per_transaction, slots)`: Postgres
/// sizes it for max_locks_per_transaction locks per backend slot and prepared
/// transaction, and any transaction may take more than its share while room is
/// left.
pub fn lock_table_size() -> (u64, u64) {
    // SAFETY: plain globals set from the server's settings at start-up;
    // GetConfigOption returns the setting's current value as a C string (or NULL
    // with missing_ok), valid until the setting changes, read at once.
    unsafe {
        let prepared = pg_sys::GetConfigOption(c"max_prepared_transactions".as_ptr(), true, false);
        let prepared = if prepared.is_null() {
            0
        } else {
            std::ffi::CStr::from_ptr(prepared)
                .to_str()
                .ok()
                .and_then(|s| s.parse::<u64>().ok())
                .unwrap_or(0)
        };
        (
            pg_sys::max_locks_per_xact.max(0) as u64,
            pg_sys::MaxBackends.max(0) as u64 + prepared,
        )
    }
}

/// How long an advisory lock taken with [`acquire`] is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hold {
    /// Until the transaction (or the subtransaction that rolls back) ends.
    Transaction,
    /// Until released, or until the session ends.
    Session,
}

/// What [`acquire`] got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acquired {
    /// Newly granted.
    Granted,
    /// This backend held it already in that mode and hold (the count went up).
    AlreadyHeld,
    /// Someone else holds a conflicting lock (only when not waiting).
    Busy,
}

/// Takes the advisory lock `tag` (made with [`advisory_tag`]) in `mode`, waiting
/// for it (interruptibly, subject to `lock_timeout` and the deadlock detector)
/// unless `wait` is false.
pub fn acquire(tag: &pg_sys::LOCKTAG, mode: pg_sys::LOCKMODE, hold: Hold, wait: bool) -> Acquired {
    // SAFETY: the tag is a fully initialised LOCKTAG, which LockAcquire copies;
    // errors (deadlock, timeout, out of shared memory for locks) are raised as
    // Postgres ERRORs.
    let result = unsafe { pg_sys::LockAcquire(tag, mode, hold == Hold::Session, !wait) };
    match result {
        pg_sys::LockAcquireResult::LOCKACQUIRE_NOT_AVAIL => Acquired::Busy,
        pg_sys::LockAcquireResult::LOCKACQUIRE_ALREADY_HELD
        | pg_sys::LockAcquireResult::LOCKACQUIRE_ALREADY_CLEAR => Acquired::AlreadyHeld,
        _ => Acquired::Granted,
    }
}

/// Releases one hold of the advisory lock `tag` in `mode`; false (and a
/// WARNING from Postgres) when this backend did not hold it.
pub fn release(tag: &pg_sys::LOCKTAG, mode: pg_sys::LOCKMODE, hold: Hold) -> bool {
    // SAFETY: as in acquire; LockRelease only warns for a lock not held.
    unsafe { pg_sys::LockRelease(tag, mode, hold == Hold::Session) }
}

/// Whether this backend holds the lock `tag` in `mode`.
pub fn held_by_me(tag: &pg_sys::LOCKTAG, mode: pg_sys::LOCKMODE) -> bool {
    crate::pg::compat::lock_held_by_me(tag, mode)
}

/// The current database's oid.
pub fn database_id() -> pg_sys::Oid {
    // SAFETY: MyDatabaseId is set once the backend is connected to a database,
    // before any SQL runs.
    unsafe { pg_sys::MyDatabaseId }
}

/// An advisory lock granted to another backend (or a prepared transaction),
/// as the lock table listed it at one moment.
#[derive(Debug, Clone, Copy)]
pub struct OtherHolder {
    pub field1: u32,
    pub field2: u32,
    pub field3: u32,
    pub subid: u16,
    /// 0 for a prepared transaction.
    pub pid: i32,
}

/// The database backend `pid` is connected to; `None` when no such backend
/// runs now (it may have ended since a lock listing named it).
pub fn database_of_backend(pid: i32) -> Option<pg_sys::Oid> {
    // SAFETY: BackendPidGetProc returns NULL for a pid that is gone, else a
    // PGPROC whose databaseId is read at once.
    unsafe {
        let proc_ = pg_sys::BackendPidGetProc(pid);
        (!proc_.is_null()).then(|| (*proc_).databaseId)
    }
}

/// The advisory locks of the user lock method that other backends hold right
/// now (one entry per lock and holder), whatever their database.
pub fn advisory_locks_of_others() -> Vec<OtherHolder> {
    let mut held = Vec::new();
    // SAFETY: GetLockStatusData returns a palloc'd snapshot of the lock table
    // with `nelements` entries; MyProcPid is set for a connected backend.
    unsafe {
        let data = pg_sys::GetLockStatusData();
        let my_pid = pg_sys::MyProcPid;
        let locks = crate::pg::snapshot::raw_slice((*data).locks, (*data).nelements as usize);
        for lock in locks {
            let tag = &lock.locktag;
            if tag.locktag_type != pg_sys::LockTagType::LOCKTAG_ADVISORY as u8
                || tag.locktag_lockmethodid != pg_sys::USER_LOCKMETHOD as u8
                || lock.holdMask == 0
                || lock.pid == my_pid
            {
                continue;
            }
            held.push(OtherHolder {
                field1: tag.locktag_field1,
                field2: tag.locktag_field2,
                field3: tag.locktag_field3,
                subid: tag.locktag_field4,
                pid: lock.pid,
            });
        }
    }
    held
}

/// Takes a lock on relation `relid` in `mode` if it is free now (any oid is
/// accepted); true when granted. Held until [`unlock_relation`] or the end of
/// the transaction.
pub fn try_lock_relation(relid: pg_sys::Oid, mode: pg_sys::LOCKMODE) -> bool {
    // SAFETY: ConditionalLockRelationOid accepts any oid and does not wait.
    unsafe { pg_sys::ConditionalLockRelationOid(relid, mode) }
}

/// Releases one lock on relation `relid` in `mode` that this transaction took.
pub fn unlock_relation(relid: pg_sys::Oid, mode: pg_sys::LOCKMODE) {
    // SAFETY: UnlockRelationOid only warns for a lock that is not held.
    unsafe { pg_sys::UnlockRelationOid(relid, mode) }
}
