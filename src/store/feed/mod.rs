//! The change feed: how a reader hands out every committed envelope and outbox
//! row although commit order is not id order, without waiting for anything but
//! the transactions that write to the same feed.
//!
//! # Writers
//! * An envelope writer takes an **envelope marker** naming the lowest sequence id
//!   it inserts per originator, before the row exists ([`markers`]), bumps that
//!   originator's **change clock** ([`clock`]), then checks whether its row
//!   **arrives late**: whether another transaction has already committed a higher
//!   sequence id of the same originator ([`late`]). A late row is flagged `late`
//!   in meta and covered by an entry of the **late-envelope feed**
//!   (`envelopes.late_envelopes`), written in the same statement: one per
//!   originator and statement, a range of sequence ids and the transaction,
//!   which picks its own late rows out of the range ([`late::entries`]).
//! * A writer of a drawn feed (the outbox, the late-envelope feed) takes a
//!   **drawn-feed marker** naming the feed sequence's last value before it draws
//!   its first id.
//!
//! # Readers (the [`Gate`])
//! In this order: sample the change clocks; read each drawn feed's last value
//! `L`; take snapshot `S0`; list the markers; take snapshot `S`. Then:
//! * **Drawn feeds**: hand out the rows with id in `(cursor, min(L, lowest
//!   marker value)]` visible in `S`. Every id at or below `L` was drawn before `L`
//!   was read, so its writer had taken its marker before the markers were listed:
//!   it is either listed (and its marker value is below its ids) or finished, in
//!   which case `S` sees its rows or they were rolled back.
//! * **Envelopes, per originator**: read the rows after the cursor in order with
//!   `S`, up to the lowest marker of the originator minus one, and hand out those
//!   up to the highest one whose transaction had finished when `S0` was taken.
//!   Rows flagged `late` are skipped here: the late feed hands them out.
//!
//! Why nothing is skipped: let `d` be handed out and `s < d` a row of the same
//! originator that commits only after `S`. If `s`'s transaction had its marker
//! before the listing, it was listed (still running) and caps the read below `s`,
//! or it had finished, so `S` sees `s` and it is read before `d`. Otherwise it
//! took its marker after the listing, hence after `S0`, and its lateness check
//! runs later still: it sees the row that bounds the read — committed before `S0`
//! with a sequence id `>= d > s` — so `s` is recorded in the late feed. Reading
//! the rows with the caller's snapshot instead of `S`, or bounding by rows that
//! committed after the listing instead of before it, breaks this argument: those
//! are exactly the races `model/` has counterexamples for.
//!
//! Nothing here looks at the cluster-wide xmin horizon: a transaction that never
//! writes to a feed holds nothing back.
//!
//! # Rows written around the functions
//! An `INSERT` or `COPY` into meta that does not come from the insert functions
//! takes no marker and is never checked for lateness, so a reader may skip such a
//! row if it lands below a cursor or commits after a higher one. What it does get:
//! the statement trigger on meta notices it; while its transaction runs, and
//! until each originator has been scanned again after it ended, inserts check
//! their lateness by scanning ([`highwater`]); once it has committed, it moves the
//! all-originators change clock, so readers that cached an idle state look again
//! and hand out such rows that are above their cursors. Writers that fire no
//! statement trigger on the root — a write into a band leaf, `COPY` into it, a
//! filled band attached by hand, logical replication's apply,
//! `session_replication_role = replica`, a restore with triggers disabled — are
//! not noticed by it.
//!
//! Whatever the path, such a row never hides a row written through the
//! functions: a reader hands out no row above what the high-water marks covered
//! before it listed the markers, and raises the marks to the rows it held back,
//! which the next gate hands out ([`Gate::cap`], [`highwater::Coverage`]).

pub mod clock;
pub mod highwater;
pub mod late;
pub mod markers;

use crate::pg::scan::Reading;
use crate::pg::snapshot::Fresh;
use crate::store::partition::PartitionError;
use crate::store::read;
use markers::{Drawn, MarkerError, Markers};

thread_local! {
    /// Set while an insert function executes its statement.
    static THROUGH_FUNCTIONS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// Local transaction id for which a commit callback is already registered.
    static FOREIGN_WRITE_NOTED: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Runs `f` (an insert function's statement) so that the statement trigger knows
/// the rows come through the functions.
pub fn through_functions<R>(f: impl FnOnce() -> R) -> R {
    struct Reset(bool);
    impl Drop for Reset {
        fn drop(&mut self) {
            THROUGH_FUNCTIONS.with(|t| t.set(self.0));
        }
    }
    let _reset = Reset(THROUGH_FUNCTIONS.with(|t| t.replace(true)));
    f()
}

/// Called by the statement trigger on meta: rows written around the functions
/// move the all-originators clock once their transaction has committed.
pub fn meta_written() {
    if THROUGH_FUNCTIONS.with(std::cell::Cell::get) {
        return;
    }
    let lxid = crate::pg::xact::local_xid();
    if FOREIGN_WRITE_NOTED.with(|n| n.replace(lxid)) != lxid {
        highwater::direct_writer_started();
        // After the commit is visible to new snapshots, so a reader that samples the
        // clock after the bump also sees the rows, and an insert that finds the
        // high-water marks usable again scans the originator with them in sight.
        pgrx::register_xact_callback(pgrx::PgXactCallbackEvent::Commit, || {
            clock::bump_all();
            highwater::direct_writer_ended();
        });
        pgrx::register_xact_callback(
            pgrx::PgXactCallbackEvent::Abort,
            highwater::direct_writer_ended,
        );
    }
}

/// The first half of a gate: the change clocks and the drawn feeds' last values.
/// Enough to tell that nothing new can have committed since a clean read; open
/// the [`Gate`] to read.
pub struct Sample {
    /// The change clocks (`None` when unavailable).
    pub clocks: Option<Vec<u64>>,
    /// Last value of each drawn feed.
    last_drawn: [i64; 2],
}

impl Sample {
    pub fn take() -> Result<Sample, MarkerError> {
        if crate::pg::xact::in_recovery() {
            return Err(MarkerError::OnStandby);
        }
        Ok(Sample {
            clocks: clock::sample(),
            last_drawn: [Drawn::Outbox.last_drawn()?, Drawn::Late.last_drawn()?],
        })
    }

    /// The last value of `feed` read by this sample.
    pub fn last_drawn(&self, feed: Drawn) -> i64 {
        self.last_drawn[feed as usize]
    }

    /// Completes the gate: snapshot, markers, snapshot; for a reader of the
    /// originators `nodes` ([`Gate::cap`] answers for those only).
    pub fn open(self, nodes: &[i32]) -> Gate {
        let before = Fresh::take();
        let coverage = highwater::Coverage::sample(nodes);
        let markers = Markers::read();
        let pause = crate::gucs::gate_pause();
        if !pause.is_zero() {
            std::thread::sleep(pause);
        }
        let after = Fresh::take();
        Gate {
            sample: self,
            before,
            coverage,
            markers,
            after,
            held: std::cell::Cell::new(false),
        }
    }
}

/// What a reader established at one moment (see the module documentation).
pub struct Gate {
    pub sample: Sample,
    /// Snapshot taken before the markers were listed.
    before: Fresh,
    /// What the high-water marks covered, sampled after `before` and before the
    /// markers were listed (see [`Gate::cap`]).
    coverage: highwater::Coverage,
    pub markers: Markers,
    /// Snapshot taken after the markers were listed: read rows with it.
    after: Fresh,
    /// Some row was held back by [`Gate::cap`]: a further gate hands it out.
    held: std::cell::Cell<bool>,
}

/// Gates a reader opens at most for one answer: a second hands out what the
/// first held back for the high-water marks ([`Gate::cap`]); a third only if
/// the marks were reset between the two (a `TRUNCATE`).
pub const MAX_GATES: usize = 3;

impl Gate {
    pub fn open(nodes: &[i32]) -> Result<Gate, MarkerError> {
        Ok(Sample::take()?.open(nodes))
    }

    /// Runs `read` through a gate, and again through a new one (up to
    /// [`MAX_GATES`]) while a gate held rows back for the high-water marks, so
    /// that the answer covers every row that can be handed out now.
    pub fn read_settled<T, E: From<MarkerError>>(
        nodes: &[i32],
        read: impl FnMut(&Gate) -> Result<T, E>,
    ) -> Result<T, E> {
        Gate::read_settled_from(Sample::take()?, nodes, read)
    }

    /// [`Gate::read_settled`], the first gate completing `sample`; `read` may
    /// take its answer as it is although rows were held ([`Gate::keep_answer`]).
    pub fn read_settled_from<T, E: From<MarkerError>>(
        sample: Sample,
        nodes: &[i32],
        mut read: impl FnMut(&Gate) -> Result<T, E>,
    ) -> Result<T, E> {
        let mut gate = sample.open(nodes);
        let mut attempt = 1;
        loop {
            let out = read(&gate)?;
            if !gate.held() || attempt == MAX_GATES {
                return Ok(out);
            }
            attempt += 1;
            gate = Sample::take()?.open(nodes);
        }
    }

    /// The snapshot to read rows with.
    pub fn rows(&self) -> pgrx::pg_sys::Snapshot {
        self.after.as_ptr()
    }

    /// Whether a row read with [`Gate::rows`] and inserted by `xid` may be
    /// handed out: its transaction had ended before the markers were listed, or
    /// its id is not one of this cluster's (a row restored from a dump or copied
    /// by logical replication, see [`Fresh::foreign`]). The second test asks the
    /// snapshot the rows are read with, whose next id is above every local
    /// transaction they can come from.
    pub fn settled(&self, xid: u64) -> bool {
        self.before.saw_end_of(xid) || self.after.foreign(xid)
    }

    /// The highest id of `feed` that a reader may hand out now (every id at or
    /// below it is committed and visible to [`Gate::rows`], or never will be).
    pub fn drawn_ceiling(&self, feed: Drawn) -> i64 {
        let last = self.sample.last_drawn(feed);
        match self.markers.drawn_limit(feed) {
            Some(marked) => last.min(marked),
            None => last,
        }
    }

    /// The highest sequence id of `node` a reader may advance a cursor to: below
    /// every marker of the originator, and at most the highest row that had
    /// committed before the markers were listed. `None` when the originator has
    /// no such row.
    pub fn envelope_ceiling(&self, node: i32) -> Result<Option<i64>, PartitionError> {
        let committed =
            read::highest_above(node, 0, Reading::passing(self.before.as_ptr()), |_| true)?;
        let Some(max) = committed else {
            return Ok(None);
        };
        let ceiling = match self.markers.envelope_limit(node) {
            Some(limit) => max.min(limit),
            None => max,
        };
        Ok(Some(self.cap(node, ceiling)))
    }

    /// How far a reader may hand out rows of `node` that it read up to `upto`
    /// (committed rows): `upto`, or less when the high-water marks did not cover
    /// that far before the markers were listed — a row written around the
    /// functions is above them. Then the marks are raised to `upto` and the rows
    /// above the cap wait for the next gate, which covers them
    /// ([`highwater::Coverage`] says why both steps are needed, in this order).
    pub fn cap(&self, node: i32, upto: i64) -> i64 {
        let covered = self.coverage.of(node);
        if upto <= covered {
            return upto;
        }
        highwater::cover(node, upto);
        self.held.set(true);
        covered
    }

    /// The highest sequence id of `node` the high-water marks covered when the
    /// gate was opened: [`Gate::cap`] hands out nothing above it.
    pub fn covered(&self, node: i32) -> i64 {
        self.coverage.of(node)
    }

    /// Whether [`Gate::cap`] held a row back: a gate opened now hands it out.
    pub fn held(&self) -> bool {
        self.held.get()
    }

    /// The answer read through this gate stands although it held rows back (a
    /// batch that has rows: the held ones come with the next batch).
    pub fn keep_answer(&self) {
        self.held.set(false);
    }
}
