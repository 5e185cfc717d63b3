//! The late-envelope feed, reader side: the late rows after a consumer's
//! late-feed position, entry by entry in id order, each entry's rows in sequence
//! order, each with the position that covers it (see
//! [`crate::store::feed::late::position`]).

use super::{drawn_rows, ConsumerError};
use crate::store::feed::late::{position, Positions};
use crate::store::read::{self, Blobs, EnvelopeRow, Flow};
use pgrx::datum::TimestampWithTimeZone;
use pgrx::pg_sys;

/// One late row as [`late_rows`] hands it out.
pub struct LateRow {
    /// The position that covers this row and every one before it.
    pub position: i64,
    /// When its entry was recorded.
    pub recorded_at: Option<TimestampWithTimeZone>,
    pub row: EnvelopeRow,
}

/// Calls `each` with the late rows after position `after`, of the entries up to
/// id `upto`, as `snapshot` sees them, until it returns false. `blobs` says
/// which rows come with their bytes. Returns true when every entry up to `upto`
/// was read to its end.
///
/// An entry hands out the rows of its originator in its range that are flagged
/// late and were inserted by its transaction (entries from before 0.4.0: their
/// one row), in sequence order, each with the position of its offset in the
/// range; the last one gets the position of the whole entry, so that a consumer
/// that acknowledged it starts at the next entry. A position inside an entry
/// reads on after its offset.
pub fn late_rows(
    after: i64,
    upto: i64,
    snapshot: pg_sys::Snapshot,
    blobs: Blobs,
    mut each: impl FnMut(LateRow) -> bool,
) -> Result<bool, ConsumerError> {
    let pos = Positions::current();
    let (partial, skip) = match pos.offset(after) {
        position::WHOLE => (None, 0),
        offset => (Some(pos.entry(after)), offset),
    };
    // A partly handed-out entry is read again from its start.
    let from = partial.map_or(pos.entry(after), |entry| entry - 1);
    drawn_rows(c"late_envelopes", from, upto, snapshot, |scan| {
        let cols = [
            "id",
            "originator_node_id",
            "originator_sequence_id",
            "recorded_at",
            "last_sequence_id",
            "inserted_xid",
        ]
        .map(|name| scan.attno(name));
        let [Some(id), Some(node), Some(first), at, last, xid] = cols else {
            return Err(ConsumerError::Feed("late_envelopes"));
        };
        let (Some(id), Some(node), Some(first)) = (
            scan.get::<i64>(id),
            scan.get::<i32>(node),
            scan.get::<i64>(first),
        ) else {
            return Err(ConsumerError::Feed("late_envelopes"));
        };
        let recorded_at = at.and_then(|c| scan.get::<TimestampWithTimeZone>(c));
        let last = last.and_then(|c| scan.get::<i64>(c));
        let xid = xid.and_then(|c| scan.raw(c)).map(|d| d.value() as u64);
        let skip = if Some(id) == partial { skip } else { 0 };
        let (Some(last), Some(xid)) = (last, xid) else {
            // One row (recorded before 0.4.0). The envelope committed with its
            // entry; it is gone only if pruned.
            if skip > 0 {
                return Ok(true);
            }
            let Some(row) = read::envelope(node, first, snapshot)? else {
                return Ok(true);
            };
            return Ok(each(LateRow {
                position: pos.whole(id),
                recorded_at,
                row,
            }));
        };
        // Each row is handed out once the next one is found (or the range ends),
        // when it is known whether it is the entry's last.
        let mut held: Option<(i64, EnvelopeRow)> = None;
        let mut go_on = true;
        read::originator_rows(node, first - 1 + skip, last, snapshot, blobs, |row| {
            if !row.late || row.inserted_xid != xid {
                return Flow::Continue;
            }
            let offset = row.seq - first + 1;
            if let Some((at, prior)) = held.replace((offset, row)) {
                go_on = each(LateRow {
                    position: pos.of(id, at),
                    recorded_at,
                    row: prior,
                });
                if !go_on {
                    return Flow::Stop;
                }
            }
            Flow::Continue
        })?;
        if !go_on {
            return Ok(false);
        }
        Ok(match held {
            Some((_, row)) => each(LateRow {
                position: pos.whole(id),
                recorded_at,
                row,
            }),
            None => true,
        })
    })
}
