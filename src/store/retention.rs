//! Retention: `prune_expired` deletes expired envelopes and drops band partitions
//! left empty, one band at a time, each band in a transaction of its own.
//!
//! By default the work runs in a background worker (connected to the same
//! database as the same role) that commits after every band, so an insert into an
//! originator waits at most for the drop of one of its bands, a few milliseconds,
//! never for the whole run. The caller waits for the worker and returns what it
//! did. With `in_transaction => true`, or when no worker slot frees up in time,
//! the same steps run in the caller's transaction instead (what they lock is then
//! held until it ends).
//!
//! # Lock order
//!
//! The pruner never waits for a lock while it holds one, and never sits in a lock
//! queue. For each band it asks, all conditionally (`ConditionalLockRelationOid`,
//! `LockAcquire` with `dontWait`), in this order: ACCESS SHARE on the meta leaf to
//! look at it; then ACCESS EXCLUSIVE on the meta originator partition, the blob
//! originator partition, the meta leaf and the blob leaf (parents before children,
//! the order in which inserts and DDL take them), then the prune guard
//! ([`crate::pg::locks::try_lock_for_prune`]). When any is refused, it releases what it
//! took, pauses a moment and tries again until the band's `lock_timeout_ms` has
//! passed; then the band is skipped (`dropped = false`) and left for the next run.
//! A session that waits while holding nothing cannot close a wait cycle, so
//! pruning cannot deadlock with creation (which takes the creation lock, then the
//! parents) or with inserts (parents, then leaves, then the guard when they create
//! or find a band). And because it never queues, no insert ever waits behind a
//! pruner that is itself waiting.
//!
//! # What is dropped
//!
//! A band is dropped only when it is empty (read with a fresh snapshot after the
//! exclusive locks were granted, whatever the caller's isolation level), is not its
//! originator's newest band, and lies wholly below the highest sequence id that
//! originator had when the run began. Bands created ahead of the data (with
//! `ensure_gateway_parts`) therefore stay, and so does every band of an originator
//! that has no rows left at all, and every band that is not a plain table (one its
//! owner partitioned further, whose expired rows are deleted all the same: the
//! deletes match rows by `tableoid` and `ctid`, which alone repeats across
//! sub-partitions).

use crate::error::{OrRaise, PgSqlErrorCode, SqlError};
use crate::pg::locks;
use crate::pg::scan::{Range, Scan};
use crate::pg::snapshot::Latest;
use crate::pg::worker::{self, Header};
use crate::store::partition::PartitionError;
use pgrx::pg_sys::{self, Oid};
use pgrx::prelude::*;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Errors of `prune_expired`.
#[derive(Debug, thiserror::Error)]
pub enum PruneError {
    #[error("lock_timeout_ms must be positive (got {0})")]
    BadLockTimeout(i32),
    #[error("permission denied to prune the envelope store")]
    NotAllowed,
    #[error("pruning failed: {message}")]
    WorkerFailed { sqlstate: i32, message: String },
    #[error("the pruning worker stopped after {processed} of {total} bands without reporting")]
    WorkerLost { processed: u32, total: u32 },
    #[error("{0}")]
    Partition(#[from] PartitionError),
    #[error("{0}")]
    NotWritable(#[from] crate::pg::xact::NotWritable),
    #[error("SPI error while pruning: {0}")]
    Spi(#[from] pgrx::spi::SpiError),
    #[error("{0} must not be NULL")]
    NullBound(&'static str),
    /// A NULL element of a bound array (the read functions' argument check).
    #[error("{0}")]
    Argument(#[from] crate::store::read::select::SelectError),
    #[error("originator_node_ids has {nodes} elements but below_sequence_ids has {seqs}")]
    BoundLength { nodes: usize, seqs: usize },
    #[error("originator {0} is given more than one bound")]
    DuplicateBound(i32),
    #[error(
        "pruning {bands} bands in the calling transaction would take about {needed} locks, \
         more than the lock table holds ({capacity}: max_locks_per_transaction = \
         {per_slot} for each of {slots} connection slots)"
    )]
    LockTable {
        bands: usize,
        needed: u64,
        capacity: u64,
        per_slot: u64,
        slots: u64,
    },
}

impl SqlError for PruneError {
    fn sqlstate(&self) -> PgSqlErrorCode {
        use PgSqlErrorCode::*;
        match self {
            PruneError::BadLockTimeout(_) => ERRCODE_INVALID_PARAMETER_VALUE,
            PruneError::NotAllowed => ERRCODE_INSUFFICIENT_PRIVILEGE,
            PruneError::WorkerFailed { sqlstate, .. } => PgSqlErrorCode::from(*sqlstate),
            PruneError::WorkerLost { .. } => ERRCODE_CONNECTION_FAILURE,
            PruneError::Partition(e) => e.sqlstate(),
            PruneError::NotWritable(e) => e.sqlstate(),
            PruneError::Spi(_) => ERRCODE_INTERNAL_ERROR,
            PruneError::NullBound(_) => ERRCODE_NULL_VALUE_NOT_ALLOWED,
            PruneError::Argument(e) => e.sqlstate(),
            PruneError::BoundLength { .. } => ERRCODE_ARRAY_ELEMENT_ERROR,
            PruneError::DuplicateBound(_) => ERRCODE_INVALID_PARAMETER_VALUE,
            PruneError::LockTable { .. } => ERRCODE_CONFIGURATION_LIMIT_EXCEEDED,
        }
    }

    fn hint(&self) -> Option<String> {
        match self {
            PruneError::NotAllowed => Some(
                "Pruning deletes rows and drops partitions: run it as the extension's owner."
                    .into(),
            ),
            PruneError::LockTable { needed, slots, .. } => Some(format!(
                "Prune without in_transaction (each band in a transaction of its own, \
                 which needs a few locks at a time), or set max_locks_per_transaction to at \
                 least {} and restart the server.",
                needed.div_ceil(*slots).max(64)
            )),
            PruneError::WorkerFailed { .. } | PruneError::WorkerLost { .. } => Some(
                "Bands handled before the failure stay pruned (each was committed); run \
                 prune_expired again."
                    .into(),
            ),
            PruneError::NotWritable(e) => e.hint(),
            _ => None,
        }
    }
}

/// One band to look at, and what was done to it. It travels to the worker in
/// its job's payload and back ([`Entry::encode`]).
#[derive(Clone, Copy, Debug)]
struct Entry {
    node: i32,
    meta: Oid,
    /// `InvalidOid` when the blob table has no band with these bounds.
    blob: Oid,
    /// Computed when listing: not the newest band, below the highest row.
    droppable: bool,
    has_end: bool,
    /// Found empty when it was looked at for dropping.
    empty: bool,
    dropped: bool,
    start: i64,
    end: i64,
    deleted: i64,
    /// Only rows with a lower sequence id may go (`i64::MAX`: no bound).
    below: i64,
    /// Record the highest key deleted in `envelopes.pruned_maxima` (absent in
    /// a database still at 0.3.0 under a newer library).
    keep_maxima: bool,
}

/// Bytes of an encoded [`Entry`].
const ENTRY_BYTES: usize = 4 * 3 + 4 + 8 * 4 + 1;

impl Entry {
    fn encode(&self, fields: &mut worker::Fields) {
        fields
            .i32(self.node)
            .u32(self.meta.to_u32())
            .u32(self.blob.to_u32())
            .bool(self.droppable)
            .bool(self.has_end)
            .bool(self.empty)
            .bool(self.dropped)
            .i64(self.start)
            .i64(self.end)
            .i64(self.deleted)
            .i64(self.below)
            .bool(self.keep_maxima);
    }

    fn decode(r: &mut worker::FieldReader<'_>) -> Option<Entry> {
        Some(Entry {
            node: r.i32()?,
            meta: Oid::from(r.u32()?),
            blob: Oid::from(r.u32()?),
            droppable: r.bool()?,
            has_end: r.bool()?,
            empty: r.bool()?,
            dropped: r.bool()?,
            start: r.i64()?,
            end: r.i64()?,
            deleted: r.i64()?,
            below: r.i64()?,
            keep_maxima: r.bool()?,
        })
    }
}

/// The kind of the pruning worker's job (see [`worker::on_job`]).
pub const JOB_KIND: u32 = 2;

/// Bytes of the job's fixed part: cutoff, lock_timeout_ms, the oid of
/// `envelopes.late_envelopes` (looked up once by the caller), the entry count;
/// the entries follow.
const JOB_FIXED_BYTES: usize = 8 + 4 + 4 + 4;

fn encode_job(entries: &[Entry], cutoff: i64, lock_timeout_ms: i32, late: Oid) -> worker::Fields {
    let mut fields = worker::Fields::with_capacity(JOB_FIXED_BYTES + entries.len() * ENTRY_BYTES);
    fields
        .i64(cutoff)
        .i32(lock_timeout_ms)
        .u32(late.to_u32())
        .u32(entries.len() as u32);
    for entry in entries {
        entry.encode(&mut fields);
    }
    fields
}

/// The job's fields and entries, `None` when the bytes are not a whole job.
fn decode_job(bytes: &[u8]) -> Option<(i64, i32, Oid, Vec<Entry>)> {
    let mut r = worker::Fields::reader(bytes);
    let (cutoff, timeout, late, count) = (r.i64()?, r.i32()?, Oid::from(r.u32()?), r.u32()?);
    let entries = (0..count)
        .map(|_| Entry::decode(&mut r))
        .collect::<Option<Vec<_>>>()?;
    Some((cutoff, timeout, late, entries))
}

pub type Row = (i32, i64, Option<i64>, i64, bool);

pub fn prune(
    as_of: Option<i64>,
    lock_timeout_ms: Option<i32>,
    in_transaction: bool,
    bounds: Option<&HashMap<i32, i64>>,
) -> Result<Vec<Row>, PruneError> {
    crate::pg::xact::check_writable("prune_expired")?;
    let lock_timeout_ms = match lock_timeout_ms {
        Some(ms) if ms > 0 => ms,
        other => return Err(PruneError::BadLockTimeout(other.unwrap_or(0))),
    };
    // Deleting from the leaves and dropping them takes their owner's rights (the
    // role that created the extension's partitions), not just DELETE on the roots.
    let allowed = Spi::get_one::<bool>(
        "SELECT pg_catalog.bool_and(pg_catalog.pg_has_role(c.relowner, 'USAGE'))
           FROM pg_catalog.pg_class c
          WHERE c.oid IN ('envelopes.gateway_envelopes_meta'::pg_catalog.regclass,
                          'envelopes.gateway_envelopes_blob'::pg_catalog.regclass)",
    )?
    .unwrap_or(false);
    if !allowed {
        return Err(PruneError::NotAllowed);
    }
    let cutoff = match as_of {
        Some(cutoff) => cutoff,
        None => Spi::get_one::<i64>(
            "SELECT pg_catalog.floor(EXTRACT(epoch FROM pg_catalog.now()))::bigint",
        )?
        .unwrap_or(0),
    };
    let mut entries = list_bands()?;
    if let Some(bounds) = bounds {
        // Only the originators given, and in each only the bands that start
        // below its bound.
        entries.retain_mut(|entry| match bounds.get(&entry.node) {
            Some(&below) if entry.start < below => {
                entry.below = below;
                true
            }
            _ => false,
        });
    }
    let mut in_transaction = in_transaction;
    if !in_transaction && !entries.is_empty() && caller_holds_partition_locks()? {
        pgrx::warning!(
            "pg_envelopes: pruning in the calling transaction, which holds locks on the \
             envelope partitions (a worker could drop none of them); the partitions it \
             drops stay locked until that transaction ends"
        );
        in_transaction = true;
    }
    let late = Spi::get_one::<Oid>(
        "SELECT 'envelopes.late_envelopes'::pg_catalog.regclass::pg_catalog.oid",
    )?
    .unwrap_or(pg_sys::InvalidOid);
    if !in_transaction && !entries.is_empty() {
        match run_in_worker(&mut entries, cutoff, lock_timeout_ms, late)? {
            Ok(()) => return Ok(rows_of(&entries)),
            Err(why) => pgrx::warning!(
                "pg_envelopes: pruning in the calling transaction ({why}); the partitions it \
                 drops stay locked until that transaction ends"
            ),
        }
    }
    check_lock_room(entries.len())?;
    for entry in &mut entries {
        delete_expired(entry, cutoff, late)?;
        if entry.droppable {
            try_drop(entry, lock_timeout_ms)?;
        }
    }
    Ok(rows_of(&entries))
}

/// Locks one band's pruning in the calling transaction keeps until it ends: the
/// meta band and its three indexes, the blob band and its primary key (a query
/// that plans over the whole store, on the view or the roots, takes as many).
pub const LOCKS_PER_BAND: u64 = 6;

/// Refuses, before taking any lock, to prune `bands` bands in one transaction
/// when their locks would not fit the lock table (Postgres would fail part way
/// with "out of shared memory", 53200, having touched many of them).
fn check_lock_room(bands: usize) -> Result<(), PruneError> {
    let needed = bands as u64 * LOCKS_PER_BAND;
    let (per_slot, slots) = crate::pg::locks::lock_table_size();
    let capacity = per_slot * slots;
    if needed > capacity {
        return Err(PruneError::LockTable {
            bands,
            needed,
            capacity,
            per_slot,
            slots,
        });
    }
    Ok(())
}

/// Whether the calling transaction already holds a lock on an originator
/// partition or band leaf (it read or wrote the tables earlier): a worker could
/// take no exclusive lock on those until it ends. Only a transaction block can.
fn caller_holds_partition_locks() -> Result<bool, PruneError> {
    if !crate::pg::xact::in_transaction_block() {
        return Ok(false);
    }
    Ok(Spi::get_one::<bool>(
        "SELECT EXISTS (
             SELECT FROM pg_catalog.pg_locks l
               JOIN pg_catalog.pg_inherits o ON o.inhparent IN
                    ('envelopes.gateway_envelopes_meta'::pg_catalog.regclass,
                     'envelopes.gateway_envelopes_blob'::pg_catalog.regclass)
               LEFT JOIN pg_catalog.pg_inherits b ON b.inhparent = o.inhrelid
              WHERE l.pid = pg_catalog.pg_backend_pid() AND l.locktype = 'relation'
                AND l.relation IN (o.inhrelid, b.inhrelid))",
    )?
    .unwrap_or(false))
}

fn rows_of(entries: &[Entry]) -> Vec<Row> {
    entries
        .iter()
        .filter(|e| e.deleted > 0 || e.empty)
        .map(|e| {
            let end = e.has_end.then_some(e.end);
            (e.node, e.start, end, e.deleted, e.dropped)
        })
        .collect()
}

/// Every band with a meta partition, in originator and band order, with whether
/// it may be dropped once empty.
///
/// Nothing here waits for or keeps a lock on a band: the caller's transaction
/// stays open while the worker prunes, and a lock it kept (a query planned over
/// the partitioned tables locks every leaf until the transaction ends) would make
/// every drop wait for it. The bands come from the catalog alone
/// (`envelopes._bands()`); the highest row of each originator is read with index
/// scans of its band leaves, newest band first, each asked for without waiting
/// and released when it closes.
fn list_bands() -> Result<Vec<Entry>, PruneError> {
    let keep_maxima = Spi::get_one::<bool>(
        "SELECT pg_catalog.to_regclass('envelopes.pruned_maxima') IS NOT NULL",
    )?
    .unwrap_or(false);
    let mut entries = Spi::connect(|client| {
        let bands = client.select(
            "SELECT p.originator_node_id, p.band_start, p.band_end,
                    p.meta_partition, p.blob_partition,
                    p.band_start = pg_catalog.max(p.band_start)
                        OVER (PARTITION BY p.originator_node_id) AS newest
               FROM envelopes._bands() p
              WHERE p.meta_partition IS NOT NULL
              ORDER BY 1, 2",
            None,
            &[],
        )?;
        let mut entries = Vec::with_capacity(bands.len());
        for row in bands {
            let end = row.get::<i64>(3)?;
            let blob = row.get::<Oid>(5)?.unwrap_or(pg_sys::InvalidOid);
            let newest = row.get::<bool>(6)?.unwrap_or(true);
            entries.push(Entry {
                node: row.get::<i32>(1)?.unwrap_or(0),
                start: row.get::<i64>(2)?.unwrap_or(i64::MIN),
                end: end.unwrap_or(0),
                has_end: end.is_some(),
                meta: row.get::<Oid>(4)?.unwrap_or(pg_sys::InvalidOid),
                blob,
                // Completed below, once the originator's highest row is known.
                droppable: !newest && end.is_some() && blob != pg_sys::InvalidOid,
                empty: false,
                dropped: false,
                deleted: 0,
                below: i64::MAX,
                keep_maxima,
            });
        }
        Ok::<_, PruneError>(entries)
    })?;
    let snapshot = Latest::take();
    for run in entries.chunk_by_mut(|a, b| a.node == b.node) {
        let highest = highest_row(run, snapshot.as_ptr());
        for entry in run.iter_mut() {
            entry.droppable &= highest.is_some_and(|h| entry.end <= h);
        }
    }
    Ok(entries)
}

/// The highest sequence id in one originator's bands (sorted by start). A band
/// locked exclusively right now (being dropped, so empty) is passed over: a lower
/// answer only makes fewer bands droppable.
fn highest_row(bands: &[Entry], snapshot: pg_sys::Snapshot) -> Option<i64> {
    bands.iter().rev().find_map(
        |band| match edge_row(band.meta, band.node, snapshot, true) {
            Some(Edge::Row(seq)) => seq,
            _ => None,
        },
    )
}

/// What [`edge_row`] found in a band leaf.
enum Edge {
    /// No visible row.
    Empty,
    /// A row, and its sequence id (`None` only if it could not be read).
    Row(Option<i64>),
}

/// The first row of one band leaf, lowest sequence id first (or, `backward`,
/// highest first), read with `snapshot` under an ACCESS SHARE lock asked for
/// without waiting and released after the read. `None` when the lock was refused,
/// the table is gone, or it is not a plain band the index path reads (partitioned
/// further by its owner, say: a query on it could wait for what is inside): busy,
/// leave it. So such a band is never dropped.
fn edge_row(relid: Oid, node: i32, snapshot: pg_sys::Snapshot, backward: bool) -> Option<Edge> {
    let share = pg_sys::AccessShareLock as pg_sys::LOCKMODE;
    // Released below (the scan takes and releases its own).
    if !locks::try_lock_relation(relid, share) {
        return None;
    }
    let range = Range::Envelope {
        node,
        after: i64::MIN,
        upto: i64::MAX,
    };
    let edge = Scan::open(relid, snapshot, range, backward).and_then(|mut scan| {
        if scan.is_executed() {
            // Not a plain band (the owner partitioned it further, or its index
            // is missing): a query on it could wait for locks on what is
            // inside. Treated as busy: such a band is never dropped.
            return None;
        }
        if !scan.next() {
            return Some(Edge::Empty);
        }
        let seq = scan
            .attno("originator_sequence_id")
            .and_then(|attno| scan.get::<i64>(attno));
        Some(Edge::Row(seq))
    });
    locks::unlock_relation(relid, share);
    edge
}

/// The relation's name as SQL can use it (quoted and qualified as needed), or
/// `None` when it does not exist any more.
fn relation_name(relid: Oid) -> Result<Option<String>, PruneError> {
    if relid == pg_sys::InvalidOid {
        return Ok(None);
    }
    Spi::connect(|client| {
        let rows = client.select(
            "SELECT pg_catalog.format('%s', c.oid::pg_catalog.regclass)
               FROM pg_catalog.pg_class c WHERE c.oid = $1",
            None,
            &[relid.into()],
        )?;
        if rows.is_empty() {
            return Ok(None);
        }
        Ok(rows.first().get_one::<String>()?)
    })
}

/// Deletes the band's expired rows from meta, the same keys from blob, and the
/// late-envelope feed's entries of one such row (an entry covering a range is
/// left: it hands out whatever of its range is still there); records how many. Waits for nothing: the tables'
/// ROW EXCLUSIVE locks are asked for without waiting (a band being dropped or
/// altered right now is left for the next run; once held, nobody can drop it
/// under the DELETE), and rows another transaction has locked (another pruner's,
/// or a caller's own uncommitted update) are skipped, not waited for.
fn delete_expired(entry: &mut Entry, cutoff: i64, late: Oid) -> Result<(), PruneError> {
    let mut tables = vec![entry.meta, late];
    if entry.blob != pg_sys::InvalidOid {
        tables.push(entry.blob);
    }
    let row_exclusive = pg_sys::RowExclusiveLock as pg_sys::LOCKMODE;
    for (taken, &table) in tables.iter().enumerate() {
        // A granted lock is released below or at transaction end.
        if !locks::try_lock_relation(table, row_exclusive) {
            for &held in &tables[..taken] {
                locks::unlock_relation(held, row_exclusive);
            }
            return Ok(());
        }
    }
    let Some(meta) = relation_name(entry.meta)? else {
        return Ok(()); // dropped since it was listed
    };
    // The blob band has the same bounds; without one there are no blob rows for
    // these keys (a row can only be stored in a band).
    let gone_blob = match relation_name(entry.blob)? {
        Some(blob) => format!(
            ", gone_blob AS (
                 DELETE FROM {blob} b USING gone g
                  WHERE b.originator_node_id = g.originator_node_id
                    AND b.originator_sequence_id = g.originator_sequence_id)"
        ),
        None => String::new(),
    };
    // The highest key deleted per originator is kept, so that the highest id
    // ever stored (`originator_latest()`) survives pruning.
    let keep = if entry.keep_maxima {
        ", kept AS (
             INSERT INTO envelopes.pruned_maxima AS p
                    (originator_node_id, originator_sequence_id, gateway_time)
             SELECT DISTINCT ON (g.originator_node_id)
                    g.originator_node_id, g.originator_sequence_id, g.gateway_time
               FROM gone g
              ORDER BY g.originator_node_id, g.originator_sequence_id DESC
             ON CONFLICT (originator_node_id) DO UPDATE
                SET originator_sequence_id = excluded.originator_sequence_id,
                    gateway_time = excluded.gateway_time
              WHERE excluded.originator_sequence_id > p.originator_sequence_id
         )"
    } else {
        ""
    };
    let sql = format!(
        "WITH doomed AS (
             SELECT x.tableoid, x.ctid FROM {meta} x
              WHERE x.expiry IS NOT NULL AND x.expiry < $1
                AND x.originator_sequence_id < $2
                FOR UPDATE SKIP LOCKED
         ), gone AS (
             DELETE FROM {meta} m USING doomed d
              WHERE m.ctid = d.ctid AND m.tableoid = d.tableoid
             RETURNING m.originator_node_id, m.originator_sequence_id, m.gateway_time
         ){gone_blob}{keep}, gone_late AS (
             DELETE FROM envelopes.late_envelopes l USING gone g
              WHERE l.originator_node_id = g.originator_node_id
                AND l.originator_sequence_id = g.originator_sequence_id
                AND (l.last_sequence_id IS NULL OR l.last_sequence_id = l.originator_sequence_id)
         )
         SELECT pg_catalog.count(*) FROM gone"
    );
    let deleted = Spi::connect_mut(|client| {
        client
            .update(&sql, None, &[cutoff.into(), entry.below.into()])?
            .first()
            .get_one::<i64>()
    })?;
    entry.deleted += deleted.unwrap_or(0);
    Ok(())
}

/// Whether `relid` holds no row visible to a snapshot taken now. Asks for its
/// ACCESS SHARE lock without waiting; `None` when that was refused (or the table
/// is gone), meaning "busy: leave it".
fn empty_now(relid: Oid, node: i32) -> Option<bool> {
    // This transaction's own earlier deletions, visible to the snapshot below.
    crate::pg::xact::command_counter_increment();
    let snapshot = Latest::take();
    edge_row(relid, node, snapshot.as_ptr(), false).map(|edge| matches!(edge, Edge::Empty))
}

/// Drops the band if it is empty and every lock it needs is granted within
/// `lock_timeout_ms` (see the module's lock order).
fn try_drop(entry: &mut Entry, lock_timeout_ms: i32) -> Result<(), PruneError> {
    // Cheap look first, under no exclusive lock: most old bands still hold rows.
    if empty_now(entry.meta, entry.node) != Some(true) {
        return Ok(());
    }
    entry.empty = true;
    let parents = Spi::connect(|client| {
        let mut parents = Vec::with_capacity(2);
        for leaf in [entry.meta, entry.blob] {
            let rows = client.select(
                "SELECT i.inhparent FROM pg_catalog.pg_inherits i WHERE i.inhrelid = $1",
                None,
                &[leaf.into()],
            )?;
            if !rows.is_empty() {
                parents.extend(rows.first().get_one::<Oid>()?);
            }
        }
        Ok::<_, pgrx::spi::SpiError>(parents)
    })?;
    if parents.len() != 2 {
        return Ok(()); // detached or dropped since it was listed
    }
    let tables = [parents[0], parents[1], entry.meta, entry.blob];
    let deadline = Instant::now() + Duration::from_millis(lock_timeout_ms as u64);
    if !lock_all(&tables, entry, deadline) {
        return Ok(());
    }
    // Under the exclusive locks nobody writes into the band; a fresh snapshot sees
    // every row that was committed before they were granted.
    let empty = empty_now(entry.meta, entry.node) == Some(true)
        && empty_now(entry.blob, entry.node) == Some(true);
    if !empty {
        release(&tables);
        locks::unlock_prune_guard(entry.node, entry.start);
        return Ok(());
    }
    let (Some(meta), Some(blob)) = (relation_name(entry.meta)?, relation_name(entry.blob)?) else {
        release(&tables);
        locks::unlock_prune_guard(entry.node, entry.start);
        return Ok(());
    };
    Spi::run(&format!("DROP TABLE {meta}, {blob}"))?;
    entry.dropped = true;
    Ok(())
}

/// Takes ACCESS EXCLUSIVE on every table and then the prune guard, all or
/// nothing, without ever waiting in a lock queue; true once all are held.
fn lock_all(tables: &[Oid], entry: &Entry, deadline: Instant) -> bool {
    let exclusive = pg_sys::AccessExclusiveLock as pg_sys::LOCKMODE;
    loop {
        let mut held = 0;
        for &table in tables {
            // A granted lock is released below or at transaction end.
            if !locks::try_lock_relation(table, exclusive) {
                break;
            }
            held += 1;
        }
        if held == tables.len() && locks::try_lock_for_prune(entry.node, entry.start) {
            return true;
        }
        release(&tables[..held]);
        if Instant::now() >= deadline {
            return false;
        }
        worker::pause(Duration::from_millis(2));
    }
}

fn release(tables: &[Oid]) {
    for &table in tables {
        // One ACCESS EXCLUSIVE lock this transaction took in lock_all.
        locks::unlock_relation(table, pg_sys::AccessExclusiveLock as pg_sys::LOCKMODE);
    }
}

/// Runs the bands through a worker. `Ok(Err(why))` asks the caller to prune in
/// its own transaction: no worker could start, or it stopped before touching a
/// band (it could not connect).
fn run_in_worker(
    entries: &mut [Entry],
    cutoff: i64,
    lock_timeout_ms: i32,
    late: Oid,
) -> Result<Result<(), &'static str>, PruneError> {
    let payload = encode_job(entries, cutoff, lock_timeout_ms, late);
    let job = worker::Job::create(JOB_KIND, Header::of_caller(), payload.bytes());
    let total = entries.len() as u32;
    let Some(running) = job.launch(
        "pg_envelopes pruner",
        crate::gucs::partition_worker_timeout(),
    ) else {
        job.close();
        return Ok(Err("no background worker slot was free"));
    };
    if let worker::Stop::PostmasterDied = worker::wait_for(running, None) {
        return Err(PruneError::WorkerLost {
            processed: job.progress() as u32,
            total,
        });
    }
    let processed = job.progress() as u32;
    // The worker has stopped: what it did to each entry is in the payload.
    match decode_job(&job.payload()) {
        Some((_, _, _, done)) if done.len() == entries.len() => entries.copy_from_slice(&done),
        _ => {
            job.close();
            return Err(PruneError::WorkerLost { processed, total });
        }
    }
    let outcome = match job.outcome() {
        Some(Ok(())) => Ok(Ok(())),
        Some(Err((sqlstate, message))) => Err(PruneError::WorkerFailed { sqlstate, message }),
        None if processed == 0 => Ok(Err("the worker stopped before it started")),
        None => Err(PruneError::WorkerLost { processed, total }),
    };
    job.close();
    outcome
}

/// The pruning worker's job (see [`worker::on_job`]): each band's deletion,
/// then its drop, in transactions of their own; what was done to each band is
/// written back to its entry in the payload as soon as it is done.
pub fn run_job(job: &mut worker::AttachedJob) {
    let Some((cutoff, timeout, late, mut entries)) = decode_job(&job.payload()) else {
        job.finish(Err((
            PgSqlErrorCode::ERRCODE_INTERNAL_ERROR as i32,
            "malformed pruning job".into(),
        )));
        return;
    };
    job.header().connect();
    let mut handled = 0usize;
    let failure = prune_bands(
        &mut entries,
        cutoff,
        timeout,
        late,
        || job.header().caller_ended(),
        |entry| {
            let mut fields = worker::Fields::with_capacity(ENTRY_BYTES);
            entry.encode(&mut fields);
            job.write_payload_at(JOB_FIXED_BYTES + handled * ENTRY_BYTES, fields.bytes());
            handled += 1;
            job.set_progress(handled as u64);
        },
    );
    job.finish(failure.map_or(Ok(()), Err));
}

/// For a worker outside any transaction: deletes each band's expired rows and
/// drops the band if it may be, each step in a transaction of its own, until
/// `stop()` says the work is no longer wanted (then a 57014 failure) or a step
/// fails (its SQLSTATE and message). `done()` is told each band handled.
fn prune_bands(
    entries: &mut [Entry],
    cutoff: i64,
    timeout: i32,
    late: Oid,
    mut stop: impl FnMut() -> bool,
    mut done: impl FnMut(&Entry),
) -> Option<(i32, String)> {
    for entry in entries.iter_mut() {
        if stop() {
            return Some((
                PgSqlErrorCode::ERRCODE_QUERY_CANCELED as i32,
                "the session that asked for pruning is gone".to_owned(),
            ));
        }
        let droppable = entry.droppable;
        let deleted = worker::in_own_transaction(|| {
            worker_settings(timeout);
            delete_expired(entry, cutoff, late).or_raise()
        });
        let result = match deleted {
            // A lock wait that outlasted lock_timeout_ms after all, or a band
            // dropped since it was listed: leave it for the next run.
            Err((code, _))
                if code == PgSqlErrorCode::ERRCODE_LOCK_NOT_AVAILABLE as i32
                    || code == PgSqlErrorCode::ERRCODE_UNDEFINED_TABLE as i32 =>
            {
                Ok(())
            }
            Err(e) => Err(e),
            Ok(()) if droppable => worker::in_own_transaction(|| {
                worker_settings(timeout);
                try_drop(entry, timeout).or_raise()
            }),
            Ok(()) => Ok(()),
        };
        if let Err(e) = result {
            return Some(e);
        }
        done(entry);
    }
    None
}

/// What [`prune_here`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Pruned {
    pub rows_deleted: i64,
    pub bands_dropped: i64,
}

/// For a background worker outside any transaction (the maintenance worker):
/// what `prune_expired()` does, with the current time as the cutoff, run here
/// rather than in a worker of its own. The bands are listed in one transaction,
/// then each is pruned in transactions of its own (see [`prune_bands`]). What was
/// done up to a failure is returned with it.
pub fn prune_here(lock_timeout_ms: i32) -> (Pruned, Option<(i32, String)>) {
    let mut listed = None;
    let listing = worker::in_own_transaction(|| {
        worker_settings(lock_timeout_ms);
        let cutoff = Spi::get_one::<i64>(
            "SELECT pg_catalog.floor(EXTRACT(epoch FROM pg_catalog.now()))::bigint",
        )
        .map_err(PruneError::from)
        .or_raise()
        .unwrap_or(0);
        let late = Spi::get_one::<Oid>(
            "SELECT 'envelopes.late_envelopes'::pg_catalog.regclass::pg_catalog.oid",
        )
        .map_err(PruneError::from)
        .or_raise()
        .unwrap_or(pg_sys::InvalidOid);
        listed = Some((list_bands().or_raise(), cutoff, late));
    });
    let (mut entries, cutoff, late) = match (listing, listed) {
        (Ok(()), Some(listed)) => listed,
        (Err((code, message)), _) => {
            return (
                Pruned::default(),
                Some((code, format!("listing the bands: {message}"))),
            )
        }
        (Ok(()), None) => return (Pruned::default(), None),
    };
    let failure = prune_bands(
        &mut entries,
        cutoff,
        lock_timeout_ms.max(1),
        late,
        || false,
        |_| {},
    );
    let pruned = Pruned {
        rows_deleted: entries.iter().map(|e| e.deleted).sum(),
        bands_dropped: entries.iter().filter(|e| e.dropped).count() as i64,
    };
    (pruned, failure)
}

/// The highest sequence id in one band leaf, read with `snapshot` under an
/// ACCESS SHARE lock asked for without waiting: `Some(None)` when the band has
/// no visible row, `None` when the lock was refused (or the band is gone, or it
/// is not a plain band the index path reads).
pub fn band_highest(relid: Oid, node: i32, snapshot: &Latest) -> Option<Option<i64>> {
    match edge_row(relid, node, snapshot.as_ptr(), true)? {
        Edge::Empty => Some(None),
        Edge::Row(seq) => seq.map(Some),
    }
}

/// The settings of each of the worker's transactions: a pinned search_path (its
/// SQL names everything schema-qualified, and operators resolve in pg_catalog),
/// and a lock_timeout bounding any lock wait the statements still meet (the
/// table and row locks they need are asked for without waiting; this bounds the
/// rest, such as catalog and index locks).
fn worker_settings(lock_timeout_ms: i32) {
    Spi::run("SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true)")
        .and_then(|()| {
            Spi::run_with_args(
                "SELECT pg_catalog.set_config('lock_timeout', $1, true)",
                &[format!("{}ms", lock_timeout_ms.max(1)).into()],
            )
        })
        .unwrap_or_else(|e| error!("could not configure the pruning transaction: {e}"));
}
