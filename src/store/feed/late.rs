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
    let own = crate::pg::xact::top_xid_if_any();
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

/// The layout of `envelopes.late_envelopes`: before `ALTER EXTENSION pg_envelopes
/// UPDATE` to 0.4.0 an entry is one row and a consumer's position an entry id
/// ([`Layout::Rows`]); after it, entries are ranges and positions carry an offset
/// ([`Layout::Ranges`]). The library of 0.4.0 serves both, so that installing
/// it before running the upgrade script loses nothing and breaks no write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    Rows,
    Ranges,
}

/// The layout of the current database's late-envelope feed (see [`Layout`]).
pub fn layout() -> Layout {
    let has_ranges = crate::pg::catalog::relation(c"envelopes", c"late_envelopes")
        .is_none_or(|rel| crate::pg::catalog::has_column(rel, c"inserted_xid"));
    if has_ranges {
        Layout::Ranges
    } else {
        Layout::Rows
    }
}

/// Positions in the late-envelope feed of one [`Layout`]: [`position`]'s for
/// ranges, the entry id itself for one-row entries.
#[derive(Debug, Clone, Copy)]
pub struct Positions(pub Layout);

impl Positions {
    /// The positions of the current database's feed.
    pub fn current() -> Positions {
        Positions(layout())
    }
    pub fn of(self, entry: i64, offset: i64) -> i64 {
        match self.0 {
            Layout::Ranges => position::of(entry, offset),
            Layout::Rows => entry,
        }
    }
    pub fn whole(self, entry: i64) -> i64 {
        match self.0 {
            Layout::Ranges => position::whole(entry),
            Layout::Rows => entry,
        }
    }
    pub fn entry(self, position: i64) -> i64 {
        match self.0 {
            Layout::Ranges => position::entry(position),
            Layout::Rows => position,
        }
    }
    pub fn offset(self, position: i64) -> i64 {
        match self.0 {
            Layout::Ranges => position::offset(position),
            Layout::Rows => position::WHOLE,
        }
    }
}

/// How far the sequence ids of one late-feed entry may spread (last - first + 1):
/// a consumer's late-feed position names an entry and, in 24 bits, how far into
/// its range it has handed rows out (see [`position`]), the highest value
/// meaning "the whole entry".
pub const MAX_SPAN: i64 = position::WHOLE - 1;

/// One entry of the late-envelope feed to record: the late rows of `node` that
/// the current transaction inserted with sequence ids in `first..=last`. Readers
/// find them by the `late` flag and the transaction's `inserted_xid`, so an
/// entry may span rows of other transactions, never rows of its own that
/// another of its entries covers (see [`entries`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub node: i32,
    pub first: i64,
    pub last: i64,
}

/// Late-feed positions, as consumers store and acknowledge them: an entry id
/// shifted left by 24 bits, and in the low bits how far into the entry's range
/// rows were handed out (`seq - first + 1` of the last one), or
/// [`position::WHOLE`] once all of them were. An offset, not a count of rows, so
/// that rows pruned from the range do not shift it. Entries recorded before
/// 0.4.0 (one row each) are whole once their row is.
pub mod position {
    /// The low bits of a position that covers its whole entry.
    pub const WHOLE: i64 = 0xFF_FFFF;
    /// Bits of a position below the entry id.
    const SHIFT: u32 = 24;
    // The highest entry id a position can hold is i64::MAX >> SHIFT, 2^39 - 1:
    // the MAXVALUE of late_envelopes' id (sql/storage.sql).

    /// The position `offset` into entry `entry`.
    pub fn of(entry: i64, offset: i64) -> i64 {
        (entry << SHIFT) | offset
    }
    /// The position after every row of entry `entry`.
    pub fn whole(entry: i64) -> i64 {
        of(entry, WHOLE)
    }
    /// The entry a position is in.
    pub fn entry(position: i64) -> i64 {
        position >> SHIFT
    }
    /// How far into its entry's range a position reaches.
    pub fn offset(position: i64) -> i64 {
        position & WHOLE
    }
}

/// What the current transaction's entries cover, per originator, with the
/// subtransaction each was recorded in (a rolled-back subtransaction takes its
/// entries with it).
struct Covered {
    /// Local transaction id the ranges belong to.
    lxid: u32,
    /// (node, first, last, subtransaction id).
    ranges: Vec<(i32, i64, i64, pg_sys::SubTransactionId)>,
}

thread_local! {
    static COVERED: std::cell::RefCell<Covered> = const {
        std::cell::RefCell::new(Covered { lxid: 0, ranges: Vec::new() })
    };
}

/// Forgets the ranges of a subtransaction that rolled back, and of every one
/// it contained (their ids are higher: they started inside it).
fn subxact_aborted(my_subid: pg_sys::SubTransactionId) {
    COVERED.with(|c| {
        c.borrow_mut()
            .ranges
            .retain(|&(_, _, _, subid)| subid < my_subid)
    });
}

/// The entries to record for the late rows `seqs` of `node` (ascending, each
/// once) that the current transaction writes now: runs of them spreading over at
/// most [`MAX_SPAN`] ids each, none reaching over a range an earlier entry of the
/// transaction covers. A row inside such a range is left to that entry, which
/// hands out every late row of the transaction in its range. The ranges returned
/// are noted as covered: the caller records them in the same subtransaction.
pub fn entries(node: i32, seqs: &[i64]) -> Vec<Entry> {
    crate::pg::xact::on_subxact_abort(subxact_aborted);
    let (lxid, subid) = crate::pg::xact::local_xid_and_subxact();
    COVERED.with(|covered| {
        let mut covered = covered.borrow_mut();
        if covered.lxid != lxid {
            covered.lxid = lxid;
            covered.ranges.clear();
        }
        let mine: Vec<(i64, i64)> = covered
            .ranges
            .iter()
            .filter(|r| r.0 == node)
            .map(|r| (r.1, r.2))
            .collect();
        let mut out: Vec<Entry> = Vec::new();
        for &seq in seqs {
            if mine.iter().any(|&(a, b)| a <= seq && seq <= b) {
                continue;
            }
            match out.last_mut() {
                Some(run)
                    if seq - run.first < MAX_SPAN
                        && !mine.iter().any(|&(a, b)| a < seq && b > run.last) =>
                {
                    run.last = seq;
                }
                _ => out.push(Entry {
                    node,
                    first: seq,
                    last: seq,
                }),
            }
        }
        covered
            .ranges
            .extend(out.iter().map(|e| (node, e.first, e.last, subid)));
        out
    })
}

/// [`entries`] for the late rows `keys` of several originators, in key order
/// (each key once).
pub fn entries_of(keys: &[(i32, i64)]) -> Vec<Entry> {
    let mut out = Vec::new();
    for run in keys.chunk_by(|a, b| a.0 == b.0) {
        let seqs: Vec<i64> = run.iter().map(|&(_, seq)| seq).collect();
        out.extend(entries(run[0].0, &seqs));
    }
    out
}
