//! Late arrivals, writer side: does a row land below what its originator has
//! already committed?
//!
//! A reader may have handed out (and a consumer acknowledged past) any committed
//! row, so a row inserted below a committed row of the same originator by another
//! transaction could fall behind a cursor forever. The insert functions ask
//! [`committed_above`] right after taking the rows' envelope marker; a row below
//! the answer is recorded in `envelopes.late_envelopes` in the same statement and
//! flagged `late`, and the consumer functions hand it out from there. See
//! [`super`] for why asking after the marker, with a fresh snapshot, is enough.
//!
//! Most inserts, in order or late, are answered by the originator's high-water
//! marks in shared memory ([`super::highwater`]) without reading anything; the
//! others (the first insert of an originator after a start, or while a write
//! around the functions runs) scan the originator's newest bands backwards with
//! a fresh snapshot.

use super::highwater::{self, Noted};
use crate::pg::scan::Reading;
use crate::pg::snapshot::Latest;
use crate::store::partition::PartitionError;
use crate::store::read;
use pgrx::pg_sys;

/// What [`committed_above`] found for rows about to be inserted.
pub struct Lateness {
    /// The highest sequence id of the originator above the rows' lowest that
    /// another transaction has committed, if any.
    pub above: Option<i64>,
    /// None of the rows' keys can exist yet: every row of the originator written
    /// through the insert functions is below them (see [`Noted::NotLate`]). The
    /// insert may then skip its conflict probe and let the index insertion report
    /// the conflict a write around the functions could still cause.
    pub fresh: bool,
}

/// The highest sequence id of `node` above `lo` that another transaction has
/// committed, if any, for rows `lo..=hi` about to be inserted (their marker is
/// held). Rows of the current transaction do not count: no reader can have
/// handed them out.
pub fn committed_above(node: i32, lo: i64, hi: i64) -> Result<Lateness, PartitionError> {
    let ready = match highwater::note(node, lo, hi) {
        Noted::NotLate { fresh } => return Ok(Lateness { above: None, fresh }),
        Noted::Late { above } => {
            return Ok(Lateness {
                above: Some(above),
                fresh: false,
            })
        }
        Noted::Check(ready) => ready,
    };
    // A band attached by a transaction that has finished is then in the
    // partition cache.
    crate::pg::invalidation::accept();
    let snapshot = Latest::take();
    // SAFETY: only reads this backend's transaction state.
    let own = unsafe { pg_sys::GetTopFullTransactionIdIfAny() }.value;
    let reading = Reading::passing(snapshot.as_ptr());
    let above = read::highest_above(node, lo, reading, |xid| xid != own)?;
    if let Some(ready) = ready {
        // Every row this snapshot sees, the current transaction's included.
        let highest = read::highest_above(node, 0, reading, |_| true)?;
        highwater::ready(ready, highest);
    }
    Ok(Lateness {
        above,
        fresh: false,
    })
}
