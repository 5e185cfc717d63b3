//! High-water marks: per originator, an upper bound of every sequence id that has
//! been committed or is being inserted, in shared memory ([`crate::pg::shmem`]), so
//! that the insert path can tell in a few nanoseconds that a row cannot arrive
//! late — the common case, each originator's ids rising — and pays for the exact
//! lateness check (an index scan, [`super::late`]) only when it might.
//!
//! Every insert raises its originator's mark to its sequence id right after
//! taking the row's in-flight marker. A slot is *ready* once a backend has
//! scanned the originator's rows with a fresh snapshot and raised the mark to the
//! highest it found: from then on, every row committed before that scan is below
//! the mark, and every row inserted after it raised the mark itself before it
//! existed. So a ready slot whose mark (before this insert raised it) is at most
//! this row's sequence id proves that no committed row lies above it.
//!
//! A second value per slot answers the other case, a row below the mark (late
//! arrivals, backfills, replays): the highest sequence id that a transaction has
//! brought to its pre-commit step, raised there before its rows can become
//! visible. A row of a ready slot above which no such id lies is not late; one
//! below it is recorded as late without a scan (perhaps needlessly, if that
//! transaction then failed: a feed entry too many, never a row lost).
//!
//! Rows written into meta directly (not through the insert functions) do not
//! raise marks. The statement trigger counts such transactions while they run,
//! and when one ends it moves its database's generation on, which makes every
//! slot of that database unready: while one runs, or until a slot is scanned
//! again, inserts into that database take the exact check. Databases share
//! [`DATABASES`] counters by hash; two that share one only slow each other down.
//! (A direct write in a prepared transaction keeps the count up until the server
//! restarts: inserts then always take the exact check.)
//!
//! Slots are keyed by database and originator: the segment is the cluster's, each
//! database has its own envelope store, and a scan of one database's rows says
//! nothing about another's. `TRUNCATE` of meta (the root) empties the marks of its
//! database ([`forget_database`]), so ids that start again from low values are not
//! held to the old rows' marks (they would be correct, only slower).
//!
//! The table has [`SLOTS`] slots; an originator that finds no free slot takes the
//! exact check every time.

use crate::pg::shmem::{shared_struct, Lazy};
use std::sync::atomic::{AtomicU64, Ordering};

/// Slots of the table (24 bytes each).
pub const SLOTS: usize = 2048;

/// Direct-writer counters, shared by databases by hash (16 bytes each).
pub const DATABASES: usize = 512;

shared_struct! {
    /// One database's (or a few databases') direct writers.
    struct Writers {
        /// Transactions writing meta around the functions, running now.
        running: AtomicU64,
        /// Moves on whenever such a transaction ends.
        generation: AtomicU64,
    }
}

shared_struct! {
    struct Slot {
        /// [`key`] of the database and node, 0 when free.
        key: AtomicU64,
        /// Highest sequence id noted + 1 (0: none).
        mark: AtomicU64,
        /// Highest sequence id + 1 of a transaction that has reached its
        /// pre-commit (or pre-prepare) step, or that a ready scan found (0:
        /// none). Raised before the rows become visible, never lowered but by
        /// [`forget_database`].
        committed: AtomicU64,
    }
}

shared_struct! {
    struct Table {
        /// Per database hash, see [`writers`].
        writers: [Writers; DATABASES],
        /// Per slot, its database's generation + 1 at which it was last made
        /// ready (0: never).
        ready: [AtomicU64; SLOTS],
        slots: [Slot; SLOTS],
    }
}

const SHMEM_NAME: &std::ffi::CStr = c"pg_envelopes high-water marks v4";

thread_local! {
    static TABLE: Lazy<Table> = const { Lazy::new() };
}

fn shared() -> Option<&'static Table> {
    TABLE.with(|table| table.get(SHMEM_NAME))
}

/// The current database's oid.
fn database() -> u32 {
    crate::pg::locks::database_id().to_u32()
}

/// A table position for `key`, spread over `size` (Fibonacci hashing).
fn spread(key: u64, size: usize) -> usize {
    (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as usize % size
}

/// The direct-writer counters of the current database.
fn writers(table: &Table) -> &Writers {
    &table.writers[spread(u64::from(database()), DATABASES)]
}

/// The slot key of `node` in the current database: never 0 (node ids are not
/// negative, so `node + 1` is at least 1).
fn key(node: i32) -> u64 {
    (u64::from(database()) << 32) | u64::from((node as u32).wrapping_add(1))
}

/// Where a lookup of an originator's slot ended.
enum Probe {
    /// Its slot.
    Found(usize),
    /// It has none, and one is free.
    Free,
    /// It has none, and none is free (slots are never given back).
    Full,
}

/// Looks for the slot of `node` in the current database along its probe
/// sequence; with `claim`, takes the first free one if it has none.
fn probe(table: &Table, node: i32, claim: bool) -> Probe {
    let key = key(node);
    let start = spread(key, SLOTS);
    for i in 0..SLOTS {
        let at = (start + i) % SLOTS;
        let slot = &table.slots[at];
        match slot.key.load(Ordering::SeqCst) {
            k if k == key => return Probe::Found(at),
            0 if !claim => return Probe::Free,
            0 => match slot
                .key
                .compare_exchange(0, key, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => return Probe::Found(at),
                Err(k) if k == key => return Probe::Found(at),
                Err(_) => continue,
            },
            _ => continue,
        }
    }
    Probe::Full
}

/// The slot of `node` in the current database, claimed if free; `None` when the
/// table is full.
fn slot_of(table: &Table, node: i32) -> Option<usize> {
    match probe(table, node, true) {
        Probe::Found(at) => Some(at),
        Probe::Free | Probe::Full => None,
    }
}

/// What [`note`] concluded about the rows being inserted.
pub enum Noted {
    /// No committed row of the originator can be above the lowest of them. With
    /// `fresh`, every row of the originator written through the functions
    /// (committed, in flight, or this transaction's own) is below the lowest of
    /// them: none of their keys can exist yet, except by a write around the
    /// functions racing this one.
    NotLate { fresh: bool },
    /// A transaction other than this one has reached its commit with a row of
    /// the originator at `above`, which is above the lowest of the rows (or a
    /// ready scan found such a row): the rows below it are late. It may since
    /// have failed to commit, or the row may be gone: recording a row as late
    /// that need not be costs a feed entry, never a row.
    Late { above: i64 },
    /// Take the exact check; with `Some`, also make the slot ready afterwards
    /// ([`ready`]) with the highest row that check's snapshot sees.
    Check(Option<Ready>),
}

/// A slot to make ready, and the generation it was found at.
pub struct Ready {
    slot: usize,
    generation: u64,
}

/// Notes that rows of `node` with sequence ids in `lo..=hi` are being inserted
/// (their in-flight marker is held), and tells whether they might arrive late.
///
/// A ready slot answers without reading anything: its `committed` value covers
/// every row committed before the scan that made it ready (the scan raised it)
/// and every row committed through the functions since (each writer raises it
/// in its pre-commit step, before its rows become visible, see [`committed`]).
/// So a row committed before this call with a sequence id above `lo` has raised
/// it above `lo + 1`, unless a write around the functions is running or has
/// ended since the slot was made ready, which makes the slot unready.
pub fn note(node: i32, lo: i64, hi: i64) -> Noted {
    let Some(table) = shared() else {
        return Noted::Check(None);
    };
    let Some(slot) = slot_of(table, node) else {
        return Noted::Check(None);
    };
    let before = table.slots[slot]
        .mark
        .fetch_max((hi as u64).saturating_add(1), Ordering::SeqCst);
    committed::pending(slot, hi);
    // Direct writers first, generation second: a writer that ended between the two
    // reads has moved the generation on already.
    let writers = writers(table);
    let direct = writers.running.load(Ordering::SeqCst);
    let generation = writers.generation.load(Ordering::SeqCst);
    let ready = table.ready[slot].load(Ordering::SeqCst) == generation + 1;
    if direct != 0 || !ready {
        return Noted::Check((direct == 0 && !ready).then_some(Ready { slot, generation }));
    }
    let lo = lo as u64;
    if before <= lo.saturating_add(1) {
        return Noted::NotLate {
            fresh: before <= lo,
        };
    }
    match table.slots[slot].committed.load(Ordering::SeqCst) {
        c if c > lo.saturating_add(1) => Noted::Late {
            above: (c - 1) as i64,
        },
        _ => Noted::NotLate { fresh: false },
    }
}

/// Makes a slot ready: `highest` is the highest sequence id of the originator
/// that a snapshot taken after [`note`] sees (None: no row).
pub fn ready(slot: Ready, highest: Option<i64>) {
    let Some(table) = shared() else { return };
    if let Some(highest) = highest {
        let above = (highest as u64).saturating_add(1);
        table.slots[slot.slot]
            .mark
            .fetch_max(above, Ordering::SeqCst);
        // Rows the snapshot sees are committed, or this transaction's own: counting
        // those as committed too is on the safe side.
        table.slots[slot.slot]
            .committed
            .fetch_max(above, Ordering::SeqCst);
    }
    table.ready[slot.slot].fetch_max(slot.generation + 1, Ordering::SeqCst);
}

/// The `committed` values: raised for the rows a transaction noted, in its
/// pre-commit (or pre-prepare) step, which runs before its commit record is
/// written and so before any snapshot can see its rows. A transaction that
/// fails after that step leaves them raised (on the safe side).
mod committed {
    use super::shared;
    use std::cell::RefCell;
    use std::sync::atomic::Ordering;

    struct Pending {
        /// Local transaction id the raises belong to.
        lxid: u32,
        /// Slot and the highest sequence id + 1 noted in it.
        raises: Vec<(usize, u64)>,
    }

    thread_local! {
        static PENDING: RefCell<Pending> = const {
            RefCell::new(Pending { lxid: 0, raises: Vec::new() })
        };
    }

    /// Notes that the current transaction writes a row of `slot` at `hi`.
    pub(super) fn pending(slot: usize, hi: i64) {
        let above = (hi as u64).saturating_add(1);
        let lxid = crate::pg::xact::local_xid();
        let first = PENDING.with(|p| {
            let mut p = p.borrow_mut();
            let first = p.lxid != lxid || p.raises.is_empty();
            if p.lxid != lxid {
                p.lxid = lxid;
                p.raises.clear();
            }
            match p.raises.iter_mut().find(|(s, _)| *s == slot) {
                Some((_, v)) => *v = (*v).max(above),
                None => p.raises.push((slot, above)),
            }
            first
        });
        if first {
            pgrx::register_xact_callback(pgrx::PgXactCallbackEvent::PreCommit, raise);
            pgrx::register_xact_callback(pgrx::PgXactCallbackEvent::PrePrepare, raise);
        }
    }

    fn raise() {
        let raises = PENDING.with(|p| std::mem::take(&mut p.borrow_mut().raises));
        if let Some(table) = shared() {
            for (slot, above) in raises {
                table.slots[slot]
                    .committed
                    .fetch_max(above, Ordering::SeqCst);
            }
        }
    }
}

/// What the marks of the current database covered at one moment: per
/// originator, the highest sequence id below both of its marks. A reader samples
/// it between its snapshot `S0` and its listing of the markers
/// ([`super::Gate`]) and hands out no row above it.
///
/// Why: rows written through the functions raised both marks before they became
/// visible, so they are covered. A row written around the functions (into a band
/// leaf, by `COPY`, in a band attached by hand, with triggers off, by a restore or
/// by logical replication's apply) raised none, and an insert below it would
/// find the slot ready with its mark below its own row and take itself for not
/// late. A row handed out at or below what the marks covered before the listing
/// is safe: an insert below it that reads the marks after the listing finds them
/// above its row (late), and one that read them before took its marker before
/// the listing (listed, or ended and seen by `S`). A row above it waits: the
/// reader raises the marks to it ([`cover`]) and the next gate's sample covers
/// it. (Raising the marks and then listing the markers again, without the
/// sample, is not enough: an insert that read the marks before the raise and
/// committed between `S` and the second listing is in neither;
/// `model/egress_counterexample_around_writer_raise_then_relist.pml`.)
pub struct Coverage {
    /// Per originator of this database with a slot: the highest sequence id
    /// covered (-1: none).
    covered: std::collections::HashMap<i32, i64>,
    /// The whole table was scanned (many originators asked for) and no slot was
    /// free: an originator without one never gets one, and its inserts always
    /// take the exact check, which needs no cover. (A lookup of each originator
    /// records a full table as a cover of everything for that originator; one not
    /// asked for holds its rows.)
    full: bool,
    /// The marks were not available: every insert takes the exact check.
    unavailable: bool,
}

impl Coverage {
    /// The marks of originators `nodes`, as they are now.
    pub fn sample(nodes: &[i32]) -> Coverage {
        let Some(table) = shared() else {
            return Coverage {
                covered: Default::default(),
                full: false,
                unavailable: true,
            };
        };
        let covered_by = |slot: &Slot| {
            let mark = slot.mark.load(Ordering::SeqCst);
            let committed = slot.committed.load(Ordering::SeqCst);
            mark.min(committed) as i64 - 1
        };
        let mut covered = std::collections::HashMap::new();
        if nodes.len() < SLOTS / 8 {
            // A lookup each: one without a slot holds its rows (-1) unless the
            // table is full.
            for &node in nodes {
                let found = match probe(table, node, false) {
                    Probe::Found(at) => covered_by(&table.slots[at]),
                    Probe::Free => -1,
                    Probe::Full => i64::MAX, // no slot ever: the exact check
                };
                covered.insert(node, found);
            }
            return Coverage {
                covered,
                full: false,
                unavailable: false,
            };
        }
        // Many originators: one pass over the whole table.
        let database = u64::from(database());
        let mut full = true;
        for slot in &table.slots {
            let key = slot.key.load(Ordering::SeqCst);
            if key == 0 {
                full = false;
            } else if key >> 32 == database {
                let node = (key as u32).wrapping_sub(1) as i32;
                covered.insert(node, covered_by(slot));
            }
        }
        Coverage {
            covered,
            full,
            unavailable: false,
        }
    }

    /// The highest sequence id of `node` that the marks covered.
    pub fn of(&self, node: i32) -> i64 {
        if self.unavailable {
            return i64::MAX;
        }
        match self.covered.get(&node) {
            Some(&covered) => covered,
            None if self.full => i64::MAX,
            None => -1,
        }
    }
}

/// A reader read `seq` of `node` committed, above what its [`Coverage`] covered:
/// raises both marks of the originator to it (claiming a slot if it has none), so
/// that the next gate covers it and every insert below it from now on is late.
pub fn cover(node: i32, seq: i64) {
    let Some(table) = shared() else { return };
    let Some(slot) = slot_of(table, node) else {
        return;
    };
    let above = (seq as u64).saturating_add(1);
    table.slots[slot].mark.fetch_max(above, Ordering::SeqCst);
    table.slots[slot]
        .committed
        .fetch_max(above, Ordering::SeqCst);
}

/// A transaction started writing meta around the insert functions.
pub fn direct_writer_started() {
    if let Some(table) = shared() {
        writers(table).running.fetch_add(1, Ordering::SeqCst);
    }
}

/// That transaction ended (after its commit became visible, or after its abort).
pub fn direct_writer_ended() {
    if let Some(table) = shared() {
        let writers = writers(table);
        writers.generation.fetch_add(1, Ordering::SeqCst);
        writers.running.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Meta was truncated in the current database (by a transaction that holds it in
/// ACCESS EXCLUSIVE mode, so no insert of this database is between noting its
/// rows and committing them): its marks start again from nothing, unready, and the
/// next insert of each originator rescans it. If the truncation rolls back, that
/// rescan finds the rows again.
pub fn forget_database() {
    let Some(table) = shared() else { return };
    let database = u64::from(database());
    for (at, slot) in table.slots.iter().enumerate() {
        if slot.key.load(Ordering::SeqCst) >> 32 == database {
            table.ready[at].store(0, Ordering::SeqCst);
            slot.mark.store(0, Ordering::SeqCst);
            slot.committed.store(0, Ordering::SeqCst);
        }
    }
}
