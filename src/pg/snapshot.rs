//! Snapshots: fresh ones, taken at a chosen moment and independent of the
//! caller's, and the calling statement's own ([`statement`]).
//!
//! `GetLatestSnapshot()` sees every transaction that has committed up to the
//! moment it is called, whatever the isolation level of the calling transaction.
//! The change feed takes one before reading the in-flight markers (to know what
//! had committed by then) and one after (to read the rows), see
//! the store's change feed.

use pgrx::pg_sys;

/// A registered copy of the latest snapshot; unregistered on drop.
pub struct Latest(pg_sys::Snapshot);

impl Latest {
    pub fn take() -> Latest {
        // SAFETY: GetLatestSnapshot returns a static snapshot that the next call
        // overwrites; RegisterSnapshot copies it and pins the copy on the current
        // resource owner until UnregisterSnapshot (or the transaction's end).
        Latest(unsafe { pg_sys::RegisterSnapshot(pg_sys::GetLatestSnapshot()) })
    }

    pub fn as_ptr(&self) -> pg_sys::Snapshot {
        self.0
    }
}

impl Drop for Latest {
    fn drop(&mut self) {
        if std::thread::panicking() {
            return; // the aborting transaction's resource owner releases it
        }
        // SAFETY: registered in Latest::take, unregistered once here.
        unsafe { pg_sys::UnregisterSnapshot(self.0) };
    }
}

/// The latest snapshot with its running transactions widened to 64 bits, to tell
/// which transactions it saw end.
pub struct Fresh {
    snapshot: Latest,
    /// `xmin`, `xmax` and the running top-level transactions, widened to 64 bits.
    xmin: u64,
    xmax: u64,
    running: Vec<u64>,
    /// The next transaction id, read right after the snapshot was taken: every
    /// transaction of this cluster whose rows the snapshot sees has a lower one.
    next: u64,
}

impl Fresh {
    /// The latest snapshot, as of now.
    pub fn take() -> Fresh {
        let snapshot = Latest::take();
        // SAFETY: the registered snapshot stays valid while `snapshot` lives; its
        // xip/subxip arrays hold xcnt/subxcnt entries. ReadNextFullTransactionId
        // only reads shared state.
        unsafe {
            let next = pg_sys::ReadNextFullTransactionId().value;
            let s = &*snapshot.as_ptr();
            let mut running: Vec<u64> = raw_slice(s.xip, s.xcnt as usize)
                .iter()
                .map(|&x| widen(next, x.into_inner()))
                .collect();
            if s.takenDuringRecovery && s.subxcnt > 0 {
                // On a standby every running xid is in subxip.
                running.extend(
                    raw_slice(s.subxip, s.subxcnt as usize)
                        .iter()
                        .map(|&x| widen(next, x.into_inner())),
                );
            }
            running.sort_unstable();
            Fresh {
                snapshot,
                xmin: widen(next, s.xmin.into_inner()),
                xmax: widen(next, s.xmax.into_inner()),
                running,
                next,
            }
        }
    }

    pub fn as_ptr(&self) -> pg_sys::Snapshot {
        self.snapshot.as_ptr()
    }

    /// Whether the top-level transaction `xid` (an `xid8`, e.g. a row's
    /// `inserted_xid`) had finished when this snapshot was taken. For a
    /// transaction known to have committed, that means: its rows are visible here.
    pub fn saw_end_of(&self, xid: u64) -> bool {
        xid < self.xmin || (xid < self.xmax && self.running.binary_search(&xid).is_err())
    }

    /// Whether `xid`, the `inserted_xid` of a row this snapshot sees, cannot be
    /// a transaction of this cluster: it is not below the next transaction id.
    /// Rows restored from a dump or copied by logical replication keep the ids
    /// of the cluster that wrote them, which mean nothing here; such a row is
    /// committed data, as old as any. (One whose foreign id lies below the next
    /// id is taken for a transaction of this cluster with that id: at worst held
    /// back until this cluster's transaction of that id has ended.)
    pub fn foreign(&self, xid: u64) -> bool {
        xid >= self.next
    }
}

/// A Postgres array as a slice; Postgres leaves the pointer NULL when the length
/// is 0, which `slice::from_raw_parts` does not accept.
///
/// # Safety
/// `ptr` must be NULL or point at `len` initialised values that outlive the slice.
pub unsafe fn raw_slice<'a, T>(ptr: *const T, len: usize) -> &'a [T] {
    if ptr.is_null() || len == 0 {
        &[]
    } else {
        // SAFETY: non-null, and the caller vouches for len values behind it.
        unsafe { std::slice::from_raw_parts(ptr, len) }
    }
}

/// The 64-bit form of a recent 32-bit xid, relative to the next full xid (as
/// `pg_current_snapshot()` does): a snapshot's xids are never more than 2^31
/// transactions old.
fn widen(next: u64, xid: u32) -> u64 {
    let next_xid = next as u32;
    let epoch = next >> 32;
    let epoch = if xid > next_xid {
        epoch.saturating_sub(1)
    } else {
        epoch
    };
    (epoch << 32) | u64::from(xid)
}

/// The snapshot the calling statement reads with (`None` outside a statement).
pub fn statement() -> Option<pg_sys::Snapshot> {
    // SAFETY: ActiveSnapshotSet and GetActiveSnapshot only read the snapshot stack;
    // the active snapshot stays pushed (and valid) while the calling statement runs.
    unsafe { pg_sys::ActiveSnapshotSet().then(|| pg_sys::GetActiveSnapshot()) }
}

#[cfg(test)]
mod tests {
    use super::widen;

    #[test]
    fn widening_keeps_the_epoch_of_recent_xids() {
        let next = (5u64 << 32) | 100;
        assert_eq!(widen(next, 99), (5 << 32) | 99);
        assert_eq!(widen(next, 100), (5 << 32) | 100);
        // An xid just before the wrap belongs to the previous epoch.
        assert_eq!(
            widen(next, u32::MAX - 3),
            (4 << 32) | u64::from(u32::MAX - 3)
        );
        assert_eq!(widen(100, 99), 99);
    }
}
