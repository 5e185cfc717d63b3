//! The consumer functions: durable cursors and the batches the bridge forwards.
//!
//! A consumer has three positions: a vector clock over originators (the last
//! sequence id handed out per originator, 0 when absent), a position in the
//! late-envelope feed and a position in the outbox. The batch functions read
//! through a [`Gate`] (see [`crate::store::feed`] for why that hands out every committed
//! row), the acknowledgement functions (SQL, `sql/consumer.sql`) move the
//! positions forward only.
//!
//! An idle poll costs the same whatever the number of originators: each backend
//! remembers, per consumer, which originators a read found *clean* (no marker,
//! read to the end) and at which change clock. While that originator's clock has
//! not moved and the cursor is at the point the read reached, there is nothing to
//! read there, and a poll in which every originator and both drawn feeds are
//! clean returns without opening a gate or a table. The cursor itself is cached
//! too and refreshed from the rows whose `version` is newer than the cached one.

use crate::error::{OrRaise, PgSqlErrorCode, SqlError};
use crate::pg::scan::{Range, Scan};
use crate::store::feed::clock;
use crate::store::feed::markers::{Drawn, MarkerError};
use crate::store::feed::{Gate, Sample};
use crate::store::partition::{self, PartitionError};
use crate::store::read::{self, Blobs, EnvelopeRow, Flow};
use pgrx::datum::{DatumWithOid, JsonB, TimestampWithTimeZone};
use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::spi::Spi;
use std::cell::RefCell;
use std::collections::HashMap;

/// Errors of the consumer functions.
#[derive(Debug, thiserror::Error)]
pub enum ConsumerError {
    #[error("{0} must not be NULL")]
    Null(&'static str),
    #[error("consumer name must not be empty")]
    EmptyName,
    #[error("consumer \"{0}\" does not exist")]
    Unknown(String),
    #[error("batch_size must be positive (got {0})")]
    BadBatchSize(i32),
    #[error("batch_bytes must be positive (got {0})")]
    BadBatchBytes(i64),
    #[error("originator_node_ids has {nodes} elements but sequence_ids has {seqs}")]
    AckLength { nodes: usize, seqs: usize },
    #[error("cannot acknowledge late_id {0}: no such id has been drawn yet")]
    NeverDrawn(i64),
    #[error("permission denied for consumer \"{consumer}\"")]
    NotOwner { consumer: String, owner: String },
    #[error("{0}")]
    Partition(#[from] PartitionError),
    #[error("{0}")]
    Marker(#[from] MarkerError),
    #[error("{0}")]
    Lease(#[from] crate::store::lease::LeaseError),
    #[error("a feed table of the extension is missing or damaged: {0}")]
    Feed(&'static str),
    #[error("SPI error in the consumer functions: {0}")]
    Spi(#[from] pgrx::spi::SpiError),
}

impl SqlError for ConsumerError {
    fn sqlstate(&self) -> PgSqlErrorCode {
        use PgSqlErrorCode::*;
        match self {
            ConsumerError::Null(_) => ERRCODE_NULL_VALUE_NOT_ALLOWED,
            ConsumerError::EmptyName
            | ConsumerError::BadBatchSize(_)
            | ConsumerError::BadBatchBytes(_)
            | ConsumerError::NeverDrawn(_) => ERRCODE_INVALID_PARAMETER_VALUE,
            ConsumerError::AckLength { .. } => ERRCODE_ARRAY_ELEMENT_ERROR,
            ConsumerError::Unknown(_) => ERRCODE_UNDEFINED_OBJECT,
            ConsumerError::NotOwner { .. } => ERRCODE_INSUFFICIENT_PRIVILEGE,
            ConsumerError::Partition(e) => e.sqlstate(),
            ConsumerError::Marker(e) => e.sqlstate(),
            ConsumerError::Lease(e) => e.sqlstate(),
            ConsumerError::Feed(_) => ERRCODE_UNDEFINED_TABLE,
            ConsumerError::Spi(_) => ERRCODE_INTERNAL_ERROR,
        }
    }

    fn hint(&self) -> Option<String> {
        match self {
            ConsumerError::Unknown(_) => {
                Some("Create it with envelopes.consumer_register(name).".into())
            }
            ConsumerError::Marker(e) => e.hint(),
            ConsumerError::Lease(e) => e.hint(),
            ConsumerError::NotOwner { owner, .. } => Some(format!(
                "It belongs to role {owner}: only that role (or a member of it) and the \
                 extension's owner may read its batches and move its positions \
                 (envelopes.consumer_set_owner hands it over)."
            )),
            _ => None,
        }
    }
}

/// The role that called the extension's function: `SECURITY DEFINER` switches the
/// current user to the extension's owner, not this one (it follows `SET ROLE`).
pub fn caller() -> pg_sys::Oid {
    // SAFETY: GetOuterUserId only reads backend state.
    unsafe { pg_sys::GetOuterUserId() }
}

/// Whether the caller may act for something owned by `owner`: it has that role's
/// privileges (is it, a member of it, or a superuser), or the extension owner's.
pub fn acts_for(owner: pg_sys::Oid, extension_owner: pg_sys::Oid) -> bool {
    let caller = caller();
    // SAFETY: has_privs_of_role only reads the role membership caches.
    unsafe {
        pg_sys::has_privs_of_role(caller, owner)
            || pg_sys::has_privs_of_role(caller, extension_owner)
    }
}

/// Name of a role, for messages.
pub fn role_name(role: pg_sys::Oid) -> String {
    // SAFETY: with noerr = true an unknown oid gives NULL; the name is a palloc'd
    // copy, read at once.
    unsafe {
        let name = pg_sys::GetUserNameFromId(role, true);
        if name.is_null() {
            format!("with oid {}", role.to_u32())
        } else {
            std::ffi::CStr::from_ptr(name)
                .to_string_lossy()
                .into_owned()
        }
    }
}

/// The extension's owner (its member roles act for every consumer).
pub fn extension_owner() -> Result<pg_sys::Oid, ConsumerError> {
    Spi::get_one::<pg_sys::Oid>(
        "SELECT e.extowner FROM pg_catalog.pg_extension e WHERE e.extname = 'pg_envelopes'",
    )?
    .ok_or(ConsumerError::Feed("pg_extension"))
}

/// Who owns a consumer, as read from its row.
#[derive(Clone, Copy)]
enum Owner {
    /// A role.
    Role(pg_sys::Oid),
    /// Nobody yet: made before 0.4.0, claimed by the first role that acts for it.
    Unclaimed,
    /// The table has no owner column: this library runs on a database whose
    /// schema is still at 0.3.0 (between installing the new library and
    /// `ALTER EXTENSION pg_envelopes UPDATE`), which had no owners.
    Untracked,
}

/// The two columns, selected from `envelopes.consumers c`, that [`Owner::read`]
/// reads: written so that they work whether or not the column exists.
const OWNER_COLUMNS: &str =
    "(pg_catalog.to_jsonb(c) ->> 'owner')::pg_catalog.oid, pg_catalog.to_jsonb(c) ? 'owner'";

impl Owner {
    fn read(owner: Option<pg_sys::Oid>, tracked: Option<bool>) -> Owner {
        match (tracked.unwrap_or(false), owner) {
            (false, _) => Owner::Untracked,
            (true, Some(role)) => Owner::Role(role),
            (true, None) => Owner::Unclaimed,
        }
    }
}

/// Refuses (42501) a caller that may not act for `consumer`, owned by `owner`.
/// A consumer without an owner (registered before 0.4.0) becomes the caller's.
fn check_owner(
    consumer: &str,
    owner: Owner,
    extension_owner: pg_sys::Oid,
) -> Result<(), ConsumerError> {
    let owner = match owner {
        Owner::Role(owner) => owner,
        Owner::Unclaimed => claim(consumer)?,
        Owner::Untracked => return Ok(()),
    };
    if acts_for(owner, extension_owner) {
        Ok(())
    } else {
        Err(ConsumerError::NotOwner {
            consumer: consumer.to_owned(),
            owner: role_name(owner),
        })
    }
}

/// Makes the caller the owner of a consumer that has none, unless another role
/// claimed it first; returns the owner. Consumers made before 0.4.0 have none, and
/// the bridge that goes on using one after the upgrade is the first to act for it.
fn claim(consumer: &str) -> Result<pg_sys::Oid, ConsumerError> {
    let owner = Spi::connect_mut(|client| {
        let rows = client.update(
            "UPDATE envelopes.consumers c SET owner = COALESCE(c.owner, $2)
              WHERE c.name = $1 RETURNING c.owner",
            None,
            &[DatumWithOid::from(consumer), DatumWithOid::from(caller())],
        )?;
        if rows.is_empty() {
            return Ok::<_, pgrx::spi::SpiError>(None); // dropped meanwhile
        }
        rows.first().get_one::<pg_sys::Oid>()
    })?;
    owner.ok_or_else(|| ConsumerError::Unknown(consumer.to_owned()))
}

/// For the SQL functions (`sql/consumer.sql`, `sql/ingress.sql`): whether the
/// calling role may act for something owned by `owner`.
#[pg_extern(stable, parallel_safe)]
fn _acts_for(owner: pg_sys::Oid) -> bool {
    extension_owner().map(|ext| acts_for(owner, ext)).or_raise()
}

/// For the SQL functions: the calling role (see [`caller`]).
#[pg_extern(stable, parallel_safe)]
fn _caller() -> pg_sys::Oid {
    caller()
}

/// Which checks a read of a consumer's row makes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Access {
    /// Batches and acknowledgements: only the owner (and the extension's owner).
    Act,
    /// Status: any role allowed to call the function.
    Look,
}

/// A consumer's positions as stored, and what this backend learned from reads.
#[derive(Default)]
struct Known {
    /// Identity of the stored row: a consumer dropped and registered again is new.
    created_at: Option<TimestampWithTimeZone>,
    version: i64,
    cursor: HashMap<i32, i64>,
    late_id: i64,
    outbox_id: i64,
    /// Per originator, from a clean read: (its bucket's clock, the all-originators
    /// clock, the cursor value at which nothing was left to read).
    clean: HashMap<i32, (u64, u64, i64)>,
    /// From a clean read of the late feed: (its last value, the position reached).
    late_clean: Option<(i64, i64)>,
    /// The clocks, cursor version and late-feed state at which every originator
    /// and the late feed were last found clean: while they are all the same, the
    /// envelope feed is idle without looking at each originator.
    idle_at: Option<(Vec<u64>, i64, i64, i64)>,
    /// The same for the outbox.
    outbox_clean: Option<(i64, i64)>,
}

impl Known {
    fn cursor_of(&self, node: i32) -> i64 {
        self.cursor.get(&node).copied().unwrap_or(0)
    }

    /// Whether a clean read showed that `node` has nothing to read at these clocks.
    fn node_is_clean(&self, node: i32, clocks: &[u64]) -> bool {
        self.clean
            .get(&node)
            .is_some_and(|&(bucket, all, reached)| {
                clocks[clock::bucket(node)] == bucket
                    && clocks[clock::ALL] == all
                    && self.cursor_of(node) >= reached
            })
    }

    fn drawn_is_clean(clean: Option<(i64, i64)>, last: i64, position: i64) -> bool {
        clean.is_some_and(|(at, reached)| at == last && position >= reached)
    }

    /// Whether nothing of the envelope feed can be read: every originator and the
    /// late feed clean at these clocks and this late-feed value. Checked in
    /// constant time when nothing moved since the last time it held.
    fn envelopes_idle(&mut self, clocks: &[u64], last_late: i64, nodes: &[i32]) -> bool {
        let state = (self.version, last_late, self.late_id);
        if let Some((at, version, last, late_id)) = &self.idle_at {
            if at.as_slice() == clocks && (*version, *last, *late_id) == state {
                return true;
            }
        }
        let idle = Known::drawn_is_clean(self.late_clean, last_late, self.late_id)
            && nodes.iter().all(|&n| self.node_is_clean(n, clocks));
        self.idle_at = idle.then(|| (clocks.to_vec(), state.0, state.1, state.2));
        idle
    }
}

thread_local! {
    static KNOWN: RefCell<HashMap<String, Known>> = RefCell::new(HashMap::new());
}

/// Brings this backend's copy of `consumer`'s positions up to date and runs `f`
/// on it. Only cursor rows newer than the cached version are read.
fn with_consumer<R>(
    consumer: &str,
    access: Access,
    f: impl FnOnce(&mut Known) -> Result<R, ConsumerError>,
) -> Result<R, ConsumerError> {
    let (created_at, version, late_id, outbox_id, owner, extension_owner) =
        Spi::connect(|client| {
            let rows = client.select(
                &format!(
                    "SELECT c.created_at, c.version, c.late_id, c.outbox_id, {OWNER_COLUMNS},
                            (SELECT e.extowner FROM pg_catalog.pg_extension e
                              WHERE e.extname = 'pg_envelopes')
                       FROM envelopes.consumers c WHERE c.name = $1"
                ),
                None,
                &[DatumWithOid::from(consumer)],
            )?;
            if rows.is_empty() {
                return Err(ConsumerError::Unknown(consumer.to_owned()));
            }
            let row = rows.first();
            Ok::<_, ConsumerError>((
                row.get::<TimestampWithTimeZone>(1)?,
                row.get::<i64>(2)?.unwrap_or(0),
                row.get::<i64>(3)?.unwrap_or(0),
                row.get::<i64>(4)?.unwrap_or(0),
                Owner::read(row.get::<pg_sys::Oid>(5)?, row.get::<bool>(6)?),
                row.get::<pg_sys::Oid>(7)?.unwrap_or(pg_sys::InvalidOid),
            ))
        })?;
    if access == Access::Act {
        check_owner(consumer, owner, extension_owner)?;
    }
    let known_version = KNOWN.with(|known| {
        let mut known = known.borrow_mut();
        let entry = known.entry(consumer.to_owned()).or_default();
        if entry.created_at != created_at || entry.version > version {
            *entry = Known {
                created_at,
                version: -1,
                ..Known::default()
            };
        }
        entry.version
    });
    if known_version != version {
        let changed =
            Spi::connect(|client| {
                let mut changed = Vec::new();
                for row in client.select(
                "SELECT originator_node_id, sequence_id FROM envelopes.consumer_envelope_cursors
                  WHERE consumer = $1 AND version > $2",
                None,
                &[DatumWithOid::from(consumer), DatumWithOid::from(known_version)],
            )? {
                if let (Some(node), Some(seq)) = (row.get::<i32>(1)?, row.get::<i64>(2)?) {
                    changed.push((node, seq));
                }
            }
                Ok::<_, ConsumerError>(changed)
            })?;
        KNOWN.with(|known| {
            if let Some(entry) = known.borrow_mut().get_mut(consumer) {
                entry.cursor.extend(changed);
                entry.version = version;
            }
        });
    }
    KNOWN.with(|known| {
        let mut known = known.borrow_mut();
        let entry = known
            .get_mut(consumer)
            .ok_or(ConsumerError::Feed("consumer cache"))?;
        entry.late_id = late_id;
        entry.outbox_id = outbox_id;
        f(entry)
    })
}

/// How much a batch may still take: rows, and bytes when a budget was given. The
/// first row is always taken, however large, so a batch is never empty for lack
/// of room.
#[derive(Clone)]
struct Budget {
    rows: usize,
    bytes: Option<usize>,
    taken: usize,
}

impl Budget {
    fn new(rows: i32, bytes: Option<i64>) -> Budget {
        Budget {
            rows: rows as usize,
            bytes: bytes.map(|b| b as usize),
            taken: 0,
        }
    }

    /// Takes a row of `size` bytes if there is room; false if it must wait.
    fn take(&mut self, size: usize) -> bool {
        if self.rows == 0 {
            return false;
        }
        if let Some(bytes) = self.bytes {
            if self.taken > 0 && size > bytes {
                return false;
            }
            self.bytes = Some(bytes.saturating_sub(size));
        }
        self.rows -= 1;
        self.taken += 1;
        true
    }

    fn exhausted(&self) -> bool {
        self.rows == 0 || (self.taken > 0 && self.bytes == Some(0))
    }
}

fn check_batch_args(
    consumer: Option<&str>,
    batch_size: Option<i32>,
    batch_bytes: Option<i64>,
) -> Result<(&str, Budget), ConsumerError> {
    let consumer = consumer.ok_or(ConsumerError::Null("consumer"))?;
    let size = match batch_size {
        None => return Err(ConsumerError::Null("batch_size")),
        Some(n) if n <= 0 => return Err(ConsumerError::BadBatchSize(n)),
        Some(n) => n,
    };
    if let Some(b) = batch_bytes.filter(|&b| b <= 0) {
        return Err(ConsumerError::BadBatchBytes(b));
    }
    Ok((consumer, Budget::new(size, batch_bytes)))
}

/// One row of an envelope batch: the envelope, and its late-feed id when it
/// comes from the late feed (the position to acknowledge).
type BatchRow = (EnvelopeRow, Option<i64>);

/// Reads a drawn feed's rows with id in `(after, upto]` in order with `snapshot`,
/// calling `each` with the open scan until it returns false. Returns whether the
/// range was read to its end.
fn drawn_rows(
    table: &'static std::ffi::CStr,
    after: i64,
    upto: i64,
    snapshot: pg_sys::Snapshot,
    mut each: impl FnMut(&mut Scan) -> Result<bool, ConsumerError>,
) -> Result<bool, ConsumerError> {
    if upto <= after {
        return Ok(true);
    }
    // SAFETY: syscache lookups by name, InvalidOid when missing.
    let relid = unsafe {
        let schema = pg_sys::get_namespace_oid(c"envelopes".as_ptr(), true);
        pg_sys::get_relname_relid(table.as_ptr(), schema)
    };
    let mut scan = Scan::open(relid, snapshot, Range::Id { after, upto }, false)
        .ok_or(ConsumerError::Feed("feed table missing"))?;
    while scan.next() {
        if !each(&mut scan)? {
            return Ok(false);
        }
    }
    Ok(true)
}

fn envelope_batch(
    consumer: Option<&str>,
    batch_size: Option<i32>,
    batch_bytes: Option<i64>,
) -> Result<Vec<BatchRow>, ConsumerError> {
    let (consumer, mut budget) = check_batch_args(consumer, batch_size, batch_bytes)?;
    // The originator list and partition cache then reflect every partition
    // attached so far.
    crate::pg::invalidation::accept();
    let sample = Sample::take()?;
    let nodes = partition::originators()?;
    with_consumer(consumer, Access::Act, |known| {
        let last_late = sample.last_drawn(Drawn::Late);
        if let Some(clocks) = &sample.clocks {
            if known.envelopes_idle(clocks, last_late, &nodes) {
                return Ok(Vec::new()); // nothing can have committed since
            }
        }
        let gate = sample.open();
        let mut out = Vec::new();

        // Late arrivals first, in the order they were recorded.
        let ceiling = gate.drawn_ceiling(Drawn::Late);
        let mut delivered_late = known.late_id;
        let complete = drawn_rows(
            c"late_envelopes",
            known.late_id,
            ceiling,
            gate.rows(),
            |scan| {
                let cols = (
                    scan.attno("id"),
                    scan.attno("originator_node_id"),
                    scan.attno("originator_sequence_id"),
                );
                let (Some(id), Some(node), Some(seq)) = (
                    cols.0.and_then(|c| scan.get::<i64>(c)),
                    cols.1.and_then(|c| scan.get::<i32>(c)),
                    cols.2.and_then(|c| scan.get::<i64>(c)),
                ) else {
                    return Err(ConsumerError::Feed("late_envelopes"));
                };
                // The envelope committed with its entry; it is gone only if pruned.
                let Some(row) = read::envelope(node, seq, gate.rows())? else {
                    return Ok(true);
                };
                if !budget.take(row.bytes()) {
                    return Ok(false);
                }
                delivered_late = id;
                out.push((row, Some(id)));
                Ok(true)
            },
        )?;
        known.late_clean =
            (complete && ceiling == last_late).then_some((last_late, delivered_late));

        // Then each originator after the vector clock. A read that stops at
        // the step-over budget inside a run of late rows moves on from where it
        // stopped in a further round, as long as the batch is still empty: the
        // budget bounds the work of a call that has rows to return, never makes
        // a call return nothing while rows are deliverable.
        let before = gate.before();
        let mut step_over: HashMap<i32, i64> = HashMap::new();
        let mut round: Vec<(i32, i64)> = Vec::with_capacity(nodes.len());
        for &node in &nodes {
            if let Some(clocks) = &gate.sample.clocks {
                if known.node_is_clean(node, clocks) {
                    continue;
                }
            }
            known.clean.remove(&node);
            round.push((node, known.cursor_of(node)));
        }
        while !round.is_empty() {
            let mut again = Vec::new();
            for (node, after) in round {
                if budget.exhausted() {
                    break;
                }
                let pass = read_in_order(node, after, &gate, before, &mut budget, &mut out)?;
                if let Some(seq) = pass.stepped_to {
                    step_over.insert(node, seq);
                }
                if pass.clean {
                    if let Some(clocks) = &gate.sample.clocks {
                        known.clean.insert(
                            node,
                            (
                                clocks[clock::bucket(node)],
                                clocks[clock::ALL],
                                pass.reached,
                            ),
                        );
                    }
                }
                if let Some(from) = pass.go_on_from {
                    again.push((node, from));
                }
            }
            round = if out.is_empty() { again } else { Vec::new() };
        }
        if !step_over.is_empty() {
            move_cursor(consumer, step_over.into_iter().collect())?;
        }
        Ok(out)
    })
}

/// Late rows one read of the in-order part steps over at most before it lets the
/// other originators have their turn; a longer run is read on in the next round
/// of the same call while the batch is empty, else in the next batch.
const MAX_LATE_STEPPED_OVER: usize = 10_000;

/// What one read of an originator's in-order rows ([`read_in_order`]) did.
struct Pass {
    /// How far the originator's rows were handed out or stepped over.
    reached: i64,
    /// The cursor stepped over a run of late rows right after it, to here.
    stepped_to: Option<i64>,
    /// Read to the end with nothing held back: the originator is clean.
    clean: bool,
    /// Stopped at [`MAX_LATE_STEPPED_OVER`] having stepped over every row it
    /// read: another read from here makes progress.
    go_on_from: Option<i64>,
}

/// Reads `node`'s rows after `after` for an envelope batch through `gate`:
/// hands the in-order ones out into `out` (within `budget`) up to the last one
/// whose transaction had ended when the markers were listed (see
/// [`crate::store::feed`]), and steps over the late rows right after `after` (the late
/// feed hands those out), at most [`MAX_LATE_STEPPED_OVER`] of them.
fn read_in_order(
    node: i32,
    after: i64,
    gate: &Gate,
    before: &crate::pg::snapshot::Fresh,
    budget: &mut Budget,
    out: &mut Vec<BatchRow>,
) -> Result<Pass, ConsumerError> {
    let limit = gate.markers.envelope_limit(node);
    let upto = limit.unwrap_or(i64::MAX);
    let mut read = Vec::new();
    let mut room = budget.clone();
    let mut late_seen = 0usize;
    let reached_end = read::originator_rows(
        node,
        after,
        upto,
        gate.rows(),
        Blobs::NotOfLateRows,
        |row| {
            if row.late {
                // Bounds the read like any row (it is committed); the late feed
                // hands it out. Read without its bytes, and only so many.
                late_seen += 1;
                read.push(row);
                return if late_seen < MAX_LATE_STEPPED_OVER {
                    Flow::Continue
                } else {
                    Flow::Stop
                };
            }
            if !room.take(row.bytes()) {
                return Flow::Stop;
            }
            read.push(row);
            Flow::Continue
        },
    )?;
    let read_len = read.len();
    let last_read = read.last().map(|row| row.seq);
    // Hand out rows only up to the last one whose transaction had ended before
    // the markers were listed (see crate::store::feed).
    let settled = read
        .iter()
        .rposition(|row| before.saw_end_of(row.inserted_xid))
        .map_or(0, |i| i + 1);
    let tail_unsettled = settled < read.len();
    read.truncate(settled);
    // Late rows right after the cursor: nothing of this feed is left to hand out
    // below the last of them, so the cursor may step over them without a
    // delivery (the bridge's acknowledgement only covers the rows it was handed).
    let leading_late = read.iter().take_while(|row| row.late).last().map(|r| r.seq);
    let mut reached = after;
    for row in read {
        if row.late {
            continue;
        }
        budget.take(row.bytes());
        reached = reached.max(row.seq);
        out.push((row, None));
    }
    let mut stepped_to = None;
    if let Some(seq) = leading_late.filter(|_| reached == after) {
        stepped_to = Some(seq);
        reached = seq;
    }
    // Stopped at the budget with every row read stepped over: read on from there.
    let go_on_from = (late_seen >= MAX_LATE_STEPPED_OVER
        && settled == read_len
        && stepped_to.is_some()
        && stepped_to == last_read)
        .then_some(reached);
    Ok(Pass {
        reached,
        stepped_to,
        clean: limit.is_none() && reached_end && !tail_unsettled,
        go_on_from,
    })
}

/// Moves `consumer`'s vector clock forward (never back) for the given
/// originators, raising its version as an acknowledgement does: when a batch
/// steps over a run of late rows (see [`envelope_batch`]), and when a consumer is
/// registered at the end of the feeds.
fn move_cursor(consumer: &str, moves: Vec<(i32, i64)>) -> Result<(), ConsumerError> {
    let (nodes, seqs): (Vec<i32>, Vec<i64>) = moves.into_iter().unzip();
    Spi::run_with_args(
        "WITH v AS (
             UPDATE envelopes.consumers SET version = version + 1 WHERE name = $1 RETURNING version)
         INSERT INTO envelopes.consumer_envelope_cursors AS c
                (consumer, originator_node_id, sequence_id, version)
         SELECT $1, t.node, t.seq, v.version
           FROM v, ROWS FROM (pg_catalog.unnest($2::int[]), pg_catalog.unnest($3::bigint[])) AS t(node, seq)
         ON CONFLICT ON CONSTRAINT consumer_envelope_cursors_pkey
         DO UPDATE SET sequence_id = GREATEST(c.sequence_id, EXCLUDED.sequence_id),
                       version = EXCLUDED.version",
        &[
            DatumWithOid::from(consumer),
            DatumWithOid::from(nodes),
            DatumWithOid::from(seqs),
        ],
    )?;
    Ok(())
}

/// The next envelopes `consumer` has not acknowledged: first the late arrivals
/// recorded after its late-feed position (`late_id` set), then per originator the
/// envelopes after its vector clock, in order. Every committed envelope comes in
/// some batch (see the README's delivery contract). At most `batch_size` rows, and
/// when `batch_bytes` is given at most that many bytes of topics and envelopes
/// (but always at least one row). Acknowledge with `consumer_envelope_ack`.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(pg_catalog, pg_temp)]
#[allow(clippy::type_complexity)]
fn consumer_envelope_batch(
    consumer: Option<&str>,
    batch_size: default!(Option<i32>, "1000"),
    batch_bytes: default!(Option<i64>, "NULL"),
) -> TableIterator<
    'static,
    (
        name!(originator_node_id, i32),
        name!(originator_sequence_id, i64),
        name!(gateway_time, TimestampWithTimeZone),
        name!(topic, Vec<u8>),
        name!(payer_id, Option<i32>),
        name!(expiry, Option<i64>),
        name!(originator_envelope, Vec<u8>),
        name!(late_id, Option<i64>),
    ),
> {
    let rows = envelope_batch(consumer, batch_size, batch_bytes).or_raise();
    TableIterator::new(rows.into_iter().map(|(r, late_id)| {
        (
            r.node,
            r.seq,
            r.gateway_time,
            r.topic,
            r.payer_id,
            r.expiry,
            r.envelope,
            late_id,
        )
    }))
}

/// What `consumer` has not acknowledged yet among the envelopes it can read:
/// in-order rows up to each originator's ceiling, and late arrivals after its
/// late-feed position; and the oldest of them (`gateway_time`, or when a late
/// one was recorded). Originators this backend found settled are not read again.
fn envelopes_pending(
    consumer: Option<&str>,
) -> Result<(i64, Option<TimestampWithTimeZone>), ConsumerError> {
    let consumer = consumer.ok_or(ConsumerError::Null("consumer"))?;
    // As for a batch.
    crate::pg::invalidation::accept();
    let sample = Sample::take()?;
    let nodes = partition::originators()?;
    with_consumer(consumer, Access::Look, |known| {
        if let Some(clocks) = &sample.clocks {
            if known.envelopes_idle(clocks, sample.last_drawn(Drawn::Late), &nodes) {
                return Ok((0, None));
            }
        }
        let gate = sample.open();
        let mut pending = 0i64;
        let mut oldest: Option<TimestampWithTimeZone> = None;
        let mut older = |t: TimestampWithTimeZone| {
            if oldest.is_none_or(|o| t < o) {
                oldest = Some(t);
            }
        };
        let ceiling = gate.drawn_ceiling(Drawn::Late);
        drawn_rows(
            c"late_envelopes",
            known.late_id,
            ceiling,
            gate.rows(),
            |scan| {
                pending += 1;
                if let Some(at) = scan.attno("recorded_at").and_then(|c| scan.get(c)) {
                    older(at);
                }
                Ok(true)
            },
        )?;
        for &node in &nodes {
            if let Some(clocks) = &gate.sample.clocks {
                if known.node_is_clean(node, clocks) {
                    continue;
                }
            }
            let Some(ceiling) = gate.envelope_ceiling(node)? else {
                continue;
            };
            read::originator_rows(
                node,
                known.cursor_of(node),
                ceiling,
                gate.rows(),
                Blobs::None,
                |row| {
                    if !row.late {
                        pending += 1;
                        older(row.gateway_time);
                    }
                    Flow::Continue
                },
            )?;
        }
        Ok((pending, oldest))
    })
}

/// How many envelopes `consumer` has not acknowledged yet among those it can read
/// now, and the oldest one's time (for `consumer_status`).
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(pg_catalog, pg_temp)]
fn consumer_envelopes_pending(
    consumer: Option<&str>,
) -> TableIterator<
    'static,
    (
        name!(pending, i64),
        name!(oldest, Option<TimestampWithTimeZone>),
    ),
> {
    TableIterator::once(envelopes_pending(consumer).or_raise())
}

/// One outbox row as a batch returns it.
type OutboxRow = (i64, String, Vec<u8>, JsonB, TimestampWithTimeZone);

fn outbox_batch(
    consumer: Option<&str>,
    batch_size: Option<i32>,
    batch_bytes: Option<i64>,
) -> Result<Vec<OutboxRow>, ConsumerError> {
    let (consumer, mut budget) = check_batch_args(consumer, batch_size, batch_bytes)?;
    let sample = Sample::take()?;
    with_consumer(consumer, Access::Act, |known| {
        let last = sample.last_drawn(Drawn::Outbox);
        if Known::drawn_is_clean(known.outbox_clean, last, known.outbox_id) {
            return Ok(Vec::new());
        }
        let gate = sample.open();
        let ceiling = gate.drawn_ceiling(Drawn::Outbox);
        let mut out = Vec::new();
        let mut reached = known.outbox_id;
        let complete = drawn_rows(c"outbox", known.outbox_id, ceiling, gate.rows(), |scan| {
            let missing = ConsumerError::Feed("outbox");
            let col = |name| scan.attno(name).ok_or(ConsumerError::Feed("outbox"));
            let (id, subject, payload, headers, created_at) = (
                col("id")?,
                col("subject")?,
                col("payload")?,
                col("headers")?,
                col("created_at")?,
            );
            let payload: Vec<u8> = scan.get(payload).ok_or(missing)?;
            let subject: String = scan.get(subject).ok_or(ConsumerError::Feed("outbox"))?;
            if !budget.take(payload.len() + subject.len()) {
                return Ok(false);
            }
            let id: i64 = scan.get(id).ok_or(ConsumerError::Feed("outbox"))?;
            reached = id;
            out.push((
                id,
                subject,
                payload,
                scan.get(headers).ok_or(ConsumerError::Feed("outbox"))?,
                scan.get(created_at).ok_or(ConsumerError::Feed("outbox"))?,
            ));
            Ok(true)
        })?;
        known.outbox_clean = (complete && ceiling == last).then_some((last, reached));
        Ok(out)
    })
}

/// The next outbox rows `consumer` has not acknowledged, in id order, never past
/// an id that a running transaction may still commit. Acknowledge the last one
/// with `consumer_outbox_ack`.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(pg_catalog, pg_temp)]
#[allow(clippy::type_complexity)]
fn consumer_outbox_batch(
    consumer: Option<&str>,
    batch_size: default!(Option<i32>, "1000"),
    batch_bytes: default!(Option<i64>, "NULL"),
) -> TableIterator<
    'static,
    (
        name!(id, i64),
        name!(subject, String),
        name!(payload, Vec<u8>),
        name!(headers, JsonB),
        name!(created_at, TimestampWithTimeZone),
    ),
> {
    TableIterator::new(outbox_batch(consumer, batch_size, batch_bytes).or_raise())
}

/// What an acknowledgement moved: rows acknowledged, and their first and last
/// `gateway_time` (or, for late ones, when they were recorded).
#[derive(Default)]
struct Acknowledged {
    rows: i64,
    first: Option<TimestampWithTimeZone>,
    last: Option<TimestampWithTimeZone>,
}

impl Acknowledged {
    fn add(&mut self, at: Option<TimestampWithTimeZone>) {
        self.rows += 1;
        if let Some(at) = at {
            self.first = Some(self.first.map_or(at, |f| f.min(at)));
            self.last = Some(self.last.map_or(at, |l| l.max(at)));
        }
    }
}

fn envelope_ack(
    consumer: Option<&str>,
    nodes: Option<Array<'_, i32>>,
    seqs: Option<Array<'_, i64>>,
    late_id: Option<i64>,
) -> Result<i64, ConsumerError> {
    let consumer = consumer.ok_or(ConsumerError::Null("consumer"))?;
    let (Some(nodes), Some(seqs)) = (nodes, seqs) else {
        return Err(ConsumerError::Null("originator_node_ids and sequence_ids"));
    };
    if nodes.len() != seqs.len() {
        return Err(ConsumerError::AckLength {
            nodes: nodes.len(),
            seqs: seqs.len(),
        });
    }
    let mut targets: HashMap<i32, i64> = HashMap::new();
    for (node, seq) in nodes.iter().zip(seqs.iter()) {
        let (Some(node), Some(seq)) = (node, seq) else {
            return Err(ConsumerError::Null("an element of the cursor arrays"));
        };
        let top = targets.entry(node).or_insert(seq);
        *top = (*top).max(seq);
    }
    // The consumer's row, locked: acknowledgements of one consumer take turns.
    let locked = Spi::connect_mut(|client| {
        let rows = client.update(
            &format!(
                "SELECT c.late_id, {OWNER_COLUMNS},
                        (SELECT e.extowner FROM pg_catalog.pg_extension e
                          WHERE e.extname = 'pg_envelopes')
                   FROM envelopes.consumers c WHERE c.name = $1 FOR UPDATE"
            ),
            None,
            &[DatumWithOid::from(consumer)],
        )?;
        if rows.is_empty() {
            return Ok::<_, ConsumerError>(None);
        }
        let row = rows.first();
        Ok(Some((
            row.get::<i64>(1)?.unwrap_or(0),
            Owner::read(row.get::<pg_sys::Oid>(2)?, row.get::<bool>(3)?),
            row.get::<pg_sys::Oid>(4)?.unwrap_or(pg_sys::InvalidOid),
        )))
    })?;
    let Some((acked_late, owner, extension_owner)) = locked else {
        return Err(ConsumerError::Unknown(consumer.to_owned()));
    };
    check_owner(consumer, owner, extension_owner)?;
    crate::store::lease::check(crate::store::lease::Kind::Egress, consumer, "")?;
    if let Some(id) = late_id {
        if id > Drawn::Late.last_drawn()? {
            return Err(ConsumerError::NeverDrawn(id));
        }
    }
    let target_nodes: Vec<i32> = targets.keys().copied().collect();
    let mut moved: Vec<(i32, i64, i64)> = Vec::new();
    Spi::connect(|client| {
        let mut current: HashMap<i32, i64> = HashMap::new();
        for row in client.select(
            "SELECT originator_node_id, sequence_id FROM envelopes.consumer_envelope_cursors
              WHERE consumer = $1 AND originator_node_id = ANY ($2)",
            None,
            &[
                DatumWithOid::from(consumer),
                DatumWithOid::from(target_nodes),
            ],
        )? {
            if let (Some(node), Some(seq)) = (row.get::<i32>(1)?, row.get::<i64>(2)?) {
                current.insert(node, seq);
            }
        }
        for (node, seq) in targets {
            let old = current.get(&node).copied().unwrap_or(0);
            if seq > old {
                moved.push((node, old, seq));
            }
        }
        Ok::<_, ConsumerError>(())
    })?;
    let late_moved = late_id.filter(|&id| id > acked_late);
    if moved.is_empty() && late_moved.is_none() {
        return Ok(0);
    }
    // Count what the acknowledgement covers, for the delivery log.
    let snapshot = crate::pg::snapshot::Latest::take();
    let mut acked = Acknowledged::default();
    for &(node, old, new) in &moved {
        read::originator_rows(node, old, new, snapshot.as_ptr(), Blobs::None, |row| {
            if !row.late {
                acked.add(Some(row.gateway_time));
            }
            Flow::Continue
        })?;
    }
    if let Some(id) = late_moved {
        drawn_rows(
            c"late_envelopes",
            acked_late,
            id,
            snapshot.as_ptr(),
            |scan| {
                let at = scan.attno("recorded_at").and_then(|c| scan.get(c));
                acked.add(at);
                Ok(true)
            },
        )?;
    }
    let (nodes, seqs): (Vec<i32>, Vec<i64>) = moved.iter().map(|&(n, _, s)| (n, s)).unzip();
    Spi::run_with_args(
        "WITH v AS (
             UPDATE envelopes.consumers
                SET version = version + (CASE WHEN pg_catalog.cardinality($2::int[]) > 0 THEN 1 ELSE 0 END),
                    late_id = GREATEST(late_id, COALESCE($4, late_id)), acked_at = pg_catalog.now()
              WHERE name = $1 RETURNING version
         ), c AS (
             INSERT INTO envelopes.consumer_envelope_cursors AS c
                    (consumer, originator_node_id, sequence_id, version)
             SELECT $1, t.node, t.seq, v.version
               FROM v, ROWS FROM (pg_catalog.unnest($2::int[]), pg_catalog.unnest($3::bigint[])) AS t(node, seq)
             ON CONFLICT ON CONSTRAINT consumer_envelope_cursors_pkey
             DO UPDATE SET sequence_id = GREATEST(c.sequence_id, EXCLUDED.sequence_id),
                           version = EXCLUDED.version
         )
         INSERT INTO envelopes.delivery_log (consumer, kind, rows, committed_from, committed_to)
         SELECT $1, 'envelopes', $5, $6, $7 FROM v",
        &[
            DatumWithOid::from(consumer),
            DatumWithOid::from(nodes),
            DatumWithOid::from(seqs),
            DatumWithOid::from(late_moved),
            DatumWithOid::from(acked.rows),
            DatumWithOid::from(acked.first),
            DatumWithOid::from(acked.last),
        ],
    )?;
    Ok(acked.rows)
}

/// Moves `consumer`'s positions forward after a batch was delivered: per
/// originator the vector clock to the highest sequence id delivered from the
/// in-order part of its batches, and the late-feed position to the highest
/// `late_id` delivered. Never backwards (a replayed acknowledgement is a no-op);
/// logs the batch in `envelopes.delivery_log`; returns the envelopes acknowledged.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(pg_catalog, pg_temp)]
fn consumer_envelope_ack(
    consumer: Option<&str>,
    originator_node_ids: Option<Array<'_, i32>>,
    sequence_ids: Option<Array<'_, i64>>,
    late_id: default!(Option<i64>, "NULL"),
) -> i64 {
    envelope_ack(consumer, originator_node_ids, sequence_ids, late_id).or_raise()
}

/// Where a new consumer starts: `(late_id, outbox_id, per-originator cursor)`.
/// From the start: the beginning of every feed. From the end: the ceilings, so a
/// row that a running transaction commits later is still ahead.
#[allow(clippy::type_complexity)]
fn starting_positions(from_start: bool) -> Result<(i64, i64, Vec<(i32, i64)>), ConsumerError> {
    if from_start {
        return Ok((0, 0, Vec::new()));
    }
    let gate = Gate::open()?;
    let mut cursor = Vec::new();
    for node in partition::originators()? {
        // A ceiling below the first id (all originators held back) is "no entry".
        if let Some(ceiling) = gate
            .envelope_ceiling(node)?
            .filter(|&c| c >= partition::FIRST_SEQUENCE_ID)
        {
            cursor.push((node, ceiling));
        }
    }
    Ok((
        gate.drawn_ceiling(Drawn::Late),
        gate.drawn_ceiling(Drawn::Outbox),
        cursor,
    ))
}

fn register(name: Option<&str>, from_start: Option<bool>) -> Result<(), ConsumerError> {
    let name = name.ok_or(ConsumerError::Null("name"))?;
    if name.is_empty() {
        return Err(ConsumerError::EmptyName);
    }
    let from_start = from_start.ok_or(ConsumerError::Null("from_start"))?;
    // An existing consumer keeps its positions; registering it again is allowed
    // to the roles that may act for it, and refused to the others.
    if let Some(owner) = owner_of(name)? {
        return check_owner(name, owner, extension_owner()?);
    }
    let (late_id, outbox_id, cursor) = starting_positions(from_start)?;
    // The owner column exists from 0.4.0 on (see Owner::Untracked).
    let tracked = Spi::get_one::<bool>(
        "SELECT EXISTS (SELECT FROM pg_catalog.pg_attribute a
                         WHERE a.attrelid = 'envelopes.consumers'::pg_catalog.regclass
                           AND a.attname = 'owner' AND NOT a.attisdropped)",
    )?
    .unwrap_or(false);
    let insert = if tracked {
        "WITH c AS (
             INSERT INTO envelopes.consumers (name, late_id, outbox_id, owner)
             VALUES ($1, $2, $3, $4)
             ON CONFLICT DO NOTHING RETURNING 1)
         SELECT EXISTS (SELECT FROM c)"
    } else {
        "WITH c AS (
             INSERT INTO envelopes.consumers (name, late_id, outbox_id)
             VALUES ($1, $2, $3)
             ON CONFLICT DO NOTHING RETURNING 1)
         SELECT EXISTS (SELECT FROM c)"
    };
    let mut args = vec![
        DatumWithOid::from(name),
        DatumWithOid::from(late_id),
        DatumWithOid::from(outbox_id),
    ];
    if tracked {
        args.push(DatumWithOid::from(caller()));
    }
    let created = Spi::get_one_with_args::<bool>(insert, &args)?.unwrap_or(false);
    if !created {
        // Another session registered it meanwhile: the same rule as above.
        let owner = owner_of(name)?.unwrap_or(Owner::Untracked);
        return check_owner(name, owner, extension_owner()?);
    }
    if !cursor.is_empty() {
        move_cursor(name, cursor)?;
    }
    Ok(())
}

/// The owner of an existing consumer, `None` when there is no such consumer.
fn owner_of(name: &str) -> Result<Option<Owner>, ConsumerError> {
    Spi::connect(|client| {
        let rows = client.select(
            &format!("SELECT {OWNER_COLUMNS} FROM envelopes.consumers c WHERE c.name = $1"),
            None,
            &[DatumWithOid::from(name)],
        )?;
        if rows.is_empty() {
            return Ok(None);
        }
        let row = rows.first();
        Ok(Some(Owner::read(
            row.get::<pg_sys::Oid>(1)?,
            row.get::<bool>(2)?,
        )))
    })
}

/// Creates a consumer (idempotent: an existing one keeps its positions). It starts
/// at the beginning of every feed, or, with `from_start => false`, at their
/// current end — where rows that transactions still running will commit are ahead
/// of it, not behind.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(pg_catalog, pg_temp)]
fn consumer_register(name: Option<&str>, from_start: default!(Option<bool>, "true")) {
    register(name, from_start).or_raise()
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use crate::testing::{int8, sqlstate_of};
    use pgrx::prelude::*;

    #[pg_test]
    fn consumer_functions_check_their_arguments() {
        let cases = [
            (
                "SELECT * FROM envelopes.consumer_outbox_batch('nobody')",
                "42704",
            ),
            (
                "SELECT * FROM envelopes.consumer_envelope_batch('nobody')",
                "42704",
            ),
            ("SELECT envelopes.consumer_outbox_ack('nobody', 1)", "42704"),
            (
                "SELECT envelopes.consumer_envelope_ack('nobody', '{1}', '{1}')",
                "42704",
            ),
            ("SELECT envelopes.consumer_register('')", "22023"),
            ("SELECT envelopes.consumer_register(NULL)", "22004"),
            ("SELECT envelopes.consumer_register('x', NULL)", "22004"),
            (
                "SELECT * FROM envelopes.consumer_outbox_batch('c', 0)",
                "22023",
            ),
            (
                "SELECT * FROM envelopes.consumer_envelope_batch('c', 0)",
                "22023",
            ),
            (
                "SELECT * FROM envelopes.consumer_envelope_batch('c', NULL)",
                "22004",
            ),
            (
                "SELECT * FROM envelopes.consumer_envelope_batch('c', 10, 0)",
                "22023",
            ),
            (
                "SELECT * FROM envelopes.consumer_outbox_batch('c', 10, -1)",
                "22023",
            ),
            (
                "SELECT * FROM envelopes.consumer_envelope_batch(NULL)",
                "22004",
            ),
            (
                "SELECT envelopes.consumer_envelope_ack('c', '{1,2}', '{1}')",
                "2202E",
            ),
            (
                "SELECT envelopes.consumer_envelope_ack('c', '{1}', '{NULL}')",
                "22004",
            ),
            (
                "SELECT envelopes.consumer_envelope_ack('c', NULL, '{1}')",
                "22004",
            ),
            ("SELECT envelopes.consumer_outbox_ack('c', NULL)", "22004"),
            // No batch can have returned an id that was never drawn.
            (
                "SELECT envelopes.consumer_outbox_ack('c', 9223372036854775807)",
                "22023",
            ),
            (
                "SELECT envelopes.consumer_envelope_ack('c', '{}', '{}', 5)",
                "22023",
            ),
        ];
        Spi::run("SELECT envelopes.consumer_register('c')").unwrap();
        for (sql, expected) in cases {
            assert_eq!(sqlstate_of(sql).as_deref(), Some(expected), "{sql}");
        }
    }

    #[pg_test]
    fn envelope_acks_move_forward_only_and_are_logged() {
        Spi::run("SELECT envelopes.consumer_register('c')").unwrap();
        Spi::run(
            "SELECT envelopes.insert_gateway_envelope(1, s, '\\x01', '\\x01') FROM generate_series(1, 5) s",
        )
        .unwrap();
        assert_eq!(
            int8("SELECT envelopes.consumer_envelope_ack('c', '{1}', '{3}')"),
            3
        );
        assert_eq!(
            int8("SELECT envelopes.consumer_envelope_ack('c', '{1}', '{2}')"),
            0
        );
        assert_eq!(
            int8("SELECT envelopes.consumer_envelope_ack('c', '{1, 1}', '{4, 5}')"),
            2
        );
        assert_eq!(
            int8(
                "SELECT sequence_id FROM envelopes.consumer_envelope_cursors WHERE consumer = 'c'"
            ),
            5
        );
        assert_eq!(
            int8("SELECT sum(rows)::bigint FROM envelopes.delivery_log WHERE consumer = 'c'"),
            5
        );
        // Each ack that moved the clock raised the version its rows carry.
        assert_eq!(
            int8("SELECT version FROM envelopes.consumers WHERE name = 'c'"),
            2
        );
        assert_eq!(
            int8("SELECT version FROM envelopes.consumer_envelope_cursors WHERE consumer = 'c'"),
            2
        );
    }

    #[pg_test]
    fn dead_letters_are_recorded_once_and_retried_on_request() {
        Spi::run("SELECT envelopes.consumer_register('c')").unwrap();
        Spi::run("SELECT envelopes.insert_gateway_envelope(3, 7, '\\x01', '\\x0102')").unwrap();
        let record = "SELECT envelopes.consumer_dead_letter('c', 'envelope', 3, 7, NULL,
                          'message too large', 'MAX_PAYLOAD', 5)";
        let first = int8(record);
        assert_eq!(int8(record), first, "the same row is one dead letter");
        assert_eq!(
            int8("SELECT attempts::bigint FROM envelopes.dead_letters"),
            10
        );
        assert_eq!(
            int8("SELECT count(*) FROM envelopes.consumer_dead_letter_retries('c')"),
            0
        );
        assert_eq!(int8("SELECT envelopes.retry_dead_letters('c')"), 1);
        assert_eq!(
            int8(
                "SELECT count(*) FROM envelopes.consumer_dead_letter_retries('c')
                  WHERE originator_envelope = '\\x0102' AND kind = 'envelope'"
            ),
            1
        );
        assert_eq!(
            int8(&format!(
                "SELECT envelopes.consumer_dead_letter_resolved('c', ARRAY[{first}]::bigint[])"
            )),
            1
        );
        let cases = [
            (
                "SELECT envelopes.consumer_dead_letter('c', 'other', 1, 1, NULL, 'r', NULL, 1)",
                "22023",
            ),
            (
                "SELECT envelopes.consumer_dead_letter('c', 'envelope', 1, 1, NULL, 'r', NULL, 0)",
                "22023",
            ),
            (
                "SELECT envelopes.consumer_dead_letter('c', 'envelope', NULL, 1, NULL, 'r', NULL, 1)",
                "22004",
            ),
            (
                "SELECT envelopes.consumer_dead_letter('nobody', 'outbox', NULL, NULL, 1, 'r', NULL, 1)",
                "42704",
            ),
        ];
        for (sql, expected) in cases {
            assert_eq!(sqlstate_of(sql).as_deref(), Some(expected), "{sql}");
        }
    }
}
