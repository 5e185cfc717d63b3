//! Late arrivals, writer side: does a row land below what its originator has
//! already committed?
//!
//! A reader may have handed out (and a consumer acknowledged past) any committed
//! row, so a row inserted below a committed row of the same originator by another
//! transaction could fall behind a cursor forever. The insert functions ask
//! [`committed_above`] right after taking the row's envelope marker; a row below
//! the answer is recorded in `envelopes.late_envelopes` in the same statement and
//! flagged `late`, and the consumer functions hand it out from there. See
//! [`super`] for why asking after the marker, with a fresh snapshot, is enough.

use super::snapshot::Latest;
use crate::partition::PartitionError;
use crate::read;
use pgrx::pg_sys;

/// The highest sequence id of `node` above `seq` that another transaction has
/// committed, if any. Rows of the current transaction do not count: no reader
/// can have handed them out.
pub fn committed_above(node: i32, seq: i64) -> Result<Option<i64>, PartitionError> {
    // SAFETY: plain call into the invalidation machinery, no arguments: a band
    // attached by a transaction that has finished is then in the partition cache.
    unsafe { pg_sys::AcceptInvalidationMessages() };
    let snapshot = Latest::take();
    // SAFETY: only reads this backend's transaction state.
    let own = unsafe { pg_sys::GetTopFullTransactionIdIfAny() }.value;
    read::highest_above(node, seq, snapshot.as_ptr(), |xid| xid != own)
}
