//! In-flight markers: what a writing transaction announces before its rows exist,
//! and how readers list them. Both halves of the lock-tag layout live here.
//!
//! A marker is a transaction-level advisory lock in share mode, in the advisory
//! lock space but with an `objsubid` that the SQL `pg_advisory_*` functions never
//! produce (they use 1 and 2), so it cannot collide with an application's locks.
//! Nobody ever waits for one; readers only list them (`GetLockStatusData`, the
//! data behind `pg_locks`). They are released when the transaction ends (commit or
//! abort), or when the subtransaction that took them rolls back.
//!
//! * **Envelope markers** (`objsubid` [`ENVELOPE_SUBID`]): per originator, the
//!   lowest sequence id the transaction inserts, taken before the row is written
//!   (`database` = node, `classid`/`objid` = high/low 32 bits of the id). A
//!   transaction writing to more than [`MAX_KEYED`] originators takes one
//!   all-originators marker instead (node [`ALL_NODES`]).
//! * **Drawn-feed markers** (outbox and late envelopes, whose ids come from a
//!   sequence): taken before the transaction draws its first id, naming the
//!   sequence's last value at that moment (`database` = the database oid,
//!   `classid`/`objid` = the value), so every id the transaction draws is above it.

use super::clock;
use crate::error::{PgSqlErrorCode, SqlError};
use pgrx::pg_sys;
use std::cell::RefCell;
use std::collections::HashMap;

/// `objsubid` of envelope markers.
pub const ENVELOPE_SUBID: u16 = 0x4502;
/// `objsubid` of outbox markers.
pub const OUTBOX_SUBID: u16 = 0x4505;
/// `objsubid` of late-envelope feed markers.
pub const LATE_SUBID: u16 = 0x4506;

/// Node id of the all-originators envelope marker.
pub const ALL_NODES: u32 = u32::MAX;

/// Per-originator markers one transaction takes before switching to the
/// all-originators marker; bounds its use of the shared lock table.
pub const MAX_KEYED: usize = 256;

/// Errors of the markers.
#[derive(Debug, thiserror::Error)]
pub enum MarkerError {
    #[error(
        "the sequence {0} of the extension is missing; is pg_envelopes installed in this database?"
    )]
    MissingSequence(&'static str),
    #[error(
        "the change feed can only be read on the primary: its in-flight markers are locks, \
         which standbys do not have"
    )]
    OnStandby,
}

impl SqlError for MarkerError {
    fn sqlstate(&self) -> PgSqlErrorCode {
        match self {
            MarkerError::MissingSequence(_) => PgSqlErrorCode::ERRCODE_UNDEFINED_TABLE,
            MarkerError::OnStandby => PgSqlErrorCode::ERRCODE_READ_ONLY_SQL_TRANSACTION,
        }
    }

    fn hint(&self) -> Option<String> {
        match self {
            MarkerError::OnStandby => Some(
                "Run the bridge (and originator_ceilings()) against the primary; \
                 select_gateway_envelopes reads on a standby."
                    .into(),
            ),
            MarkerError::MissingSequence(_) => None,
        }
    }
}

fn acquire(field1: u32, value: i64, subid: u16) {
    let value = value.max(0) as u64;
    let tag = crate::pg::locks::advisory_tag(field1, (value >> 32) as u32, value as u32, subid);
    // A transaction-level share lock that nobody waits for; the lock manager
    // releases it at commit or abort.
    crate::pg::locks::acquire(
        &tag,
        pg_sys::ShareLock as pg_sys::LOCKMODE,
        crate::pg::locks::Hold::Transaction,
        true,
    );
}

/// The current transaction and subtransaction.
fn current_xact() -> (pg_sys::LocalTransactionId, pg_sys::SubTransactionId) {
    crate::pg::xact::local_xid_and_subxact()
}

/// The markers this backend's current transaction holds.
#[derive(Default)]
struct Held {
    lxid: pg_sys::LocalTransactionId,
    /// node -> (lowest sequence id marked, subtransaction that took it)
    envelopes: HashMap<i32, (i64, pg_sys::SubTransactionId)>,
    /// Set (to the subtransaction that took it) once the all-originators marker is held.
    all_nodes: Option<pg_sys::SubTransactionId>,
    /// Per drawn feed: (value named by the marker, subtransaction that took it).
    drawn: [Option<(i64, pg_sys::SubTransactionId)>; 2],
}

thread_local! {
    static HELD: RefCell<Held> = RefCell::new(Held::default());
}

fn with_held<R>(f: impl FnOnce(&mut Held, pg_sys::SubTransactionId) -> R) -> R {
    let (lxid, subxid) = current_xact();
    HELD.with(|held| {
        let mut held = held.borrow_mut();
        if held.lxid != lxid {
            *held = Held {
                lxid,
                ..Held::default()
            };
        }
        f(&mut held, subxid)
    })
}

/// Announces that the current transaction is about to insert `seq` for `node`:
/// takes a marker unless one at or below `seq` is already held (a hash lookup),
/// and bumps the originator's change clock when it takes one.
pub fn mark_envelope(node: i32, seq: i64) {
    enum Take {
        Nothing,
        Node(i64),
        All,
    }
    let take = with_held(|held, subxid| {
        match held.all_nodes {
            Some(taken_in) if taken_in == subxid => return Take::Nothing,
            Some(_) => {
                held.all_nodes = Some(subxid);
                return Take::All;
            }
            None => {}
        }
        match held.envelopes.get(&node) {
            // A marker taken in this same subtransaction at or below seq covers it.
            // One from another subtransaction may have been released by a rollback
            // to a savepoint: take it again (a no-op if it is still held).
            Some(&(marked, taken_in)) if marked <= seq && taken_in == subxid => Take::Nothing,
            Some(&(marked, _)) if marked <= seq => {
                held.envelopes.insert(node, (marked, subxid));
                Take::Node(marked)
            }
            _ if held.envelopes.len() >= MAX_KEYED && !held.envelopes.contains_key(&node) => {
                held.all_nodes = Some(subxid);
                Take::All
            }
            _ => {
                held.envelopes.insert(node, (seq, subxid));
                Take::Node(seq)
            }
        }
    });
    // Marker first, clock second: a reader samples the clocks before it lists
    // the markers (see clock.rs).
    match take {
        Take::Nothing => {}
        Take::Node(at) => {
            acquire(node as u32, at, ENVELOPE_SUBID);
            clock::bump(node);
        }
        Take::All => {
            acquire(ALL_NODES, 0, ENVELOPE_SUBID);
            clock::bump_all();
        }
    }
}

/// A feed whose ids are drawn from a sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Drawn {
    Outbox = 0,
    Late = 1,
}

impl Drawn {
    fn subid(self) -> u16 {
        match self {
            Drawn::Outbox => OUTBOX_SUBID,
            Drawn::Late => LATE_SUBID,
        }
    }

    fn sequence(self) -> &'static std::ffi::CStr {
        match self {
            Drawn::Outbox => c"outbox_id_seq",
            Drawn::Late => c"late_envelopes_id_seq",
        }
    }

    /// The highest id drawn so far (0 when none): every id drawn later is greater,
    /// because the sequences are created with `CACHE 1` and never cycle.
    pub fn last_drawn(self) -> Result<i64, MarkerError> {
        let name = self.sequence();
        let Some(relid) = crate::pg::catalog::relation(c"envelopes", name) else {
            return Err(MarkerError::MissingSequence(
                name.to_str().unwrap_or("sequence"),
            ));
        };
        // The extension's functions that call this run as the extension owner,
        // who may read the sequence.
        Ok(crate::pg::catalog::sequence_last_value(relid).unwrap_or(0))
    }
}

/// Announces that the current transaction is about to draw ids of `feed`: takes
/// its marker (once per transaction, again in a subtransaction that may roll back).
pub fn mark_drawn(feed: Drawn) -> Result<(), MarkerError> {
    let held = with_held(|held, subxid| {
        let slot = &mut held.drawn[feed as usize];
        match *slot {
            Some((_, taken_in)) if taken_in == subxid => Ok(None),
            Some((value, _)) => {
                *slot = Some((value, subxid));
                Ok(Some(value))
            }
            None => Err(subxid),
        }
    });
    let value = match held {
        Ok(None) => return Ok(()),
        Ok(Some(value)) => value,
        Err(subxid) => {
            // Read before the marker is taken: ids drawn after this point are
            // greater than it.
            let value = feed.last_drawn()?;
            with_held(|held, _| held.drawn[feed as usize] = Some((value, subxid)));
            value
        }
    };
    let database = crate::pg::locks::database_id().to_u32();
    acquire(database, value, feed.subid());
    Ok(())
}

/// The markers other transactions of this database hold, as listed at one moment.
#[derive(Debug, Default)]
pub struct Markers {
    /// Lowest marked sequence id per originator.
    envelopes: HashMap<i32, i64>,
    all_nodes: bool,
    /// Lowest value named by a marker, per drawn feed.
    drawn: [Option<i64>; 2],
}

impl Markers {
    /// Lists the markers held right now by other backends. Markers of backends
    /// connected to other databases are theirs, not ours; a prepared transaction's
    /// envelope marker (no backend) could be anyone's and is counted.
    pub fn read() -> Markers {
        let mut markers = Markers::default();
        let my_database = crate::pg::locks::database_id();
        for lock in crate::pg::locks::advisory_locks_of_others() {
            let value = ((u64::from(lock.field2) << 32) | u64::from(lock.field3)) as i64;
            match lock.subid {
                ENVELOPE_SUBID => {
                    if lock.pid != 0
                        && crate::pg::locks::database_of_backend(lock.pid) != Some(my_database)
                    {
                        continue;
                    }
                    if lock.field1 == ALL_NODES {
                        markers.all_nodes = true;
                    } else {
                        let node = lock.field1 as i32;
                        let lowest = markers.envelopes.entry(node).or_insert(value);
                        *lowest = (*lowest).min(value);
                    }
                }
                OUTBOX_SUBID | LATE_SUBID if lock.field1 == my_database.to_u32() => {
                    let feed = if lock.subid == OUTBOX_SUBID {
                        Drawn::Outbox
                    } else {
                        Drawn::Late
                    };
                    let slot = &mut markers.drawn[feed as usize];
                    *slot = Some(slot.map_or(value, |v| v.min(value)));
                }
                _ => {}
            }
        }
        markers
    }

    /// The highest sequence id of `node` that no listed transaction can still be
    /// inserting (`None`: no marker), or `-1` when all originators are held back.
    pub fn envelope_limit(&self, node: i32) -> Option<i64> {
        if self.all_nodes {
            return Some(-1);
        }
        self.envelopes.get(&node).map(|&lowest| lowest - 1)
    }

    /// The highest id of `feed` that no listed transaction can still draw.
    pub fn drawn_limit(&self, feed: Drawn) -> Option<i64> {
        self.drawn[feed as usize]
    }
}
