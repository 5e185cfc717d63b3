//! The bands pruning looks at: listed from the catalog with whether each may
//! be dropped, their expired rows deleted, and an empty band dropped under
//! exclusive locks asked for without waiting (the module's lock order). An
//! [`Entry`] carries one band there and back through the worker's payload.

use super::PruneError;
use crate::pg::locks;
use crate::pg::scan::{Range, Scan};
use crate::pg::snapshot::Latest;
use crate::pg::worker;
use pgrx::pg_sys::{self, Oid};
use pgrx::prelude::*;
use std::time::{Duration, Instant};

/// One band to look at, and what was done to it. It travels to the worker in
/// its job's payload and back ([`Entry::encode`]).
#[derive(Clone, Copy, Debug)]
pub(super) struct Entry {
    pub(super) node: i32,
    pub(super) meta: Oid,
    /// `InvalidOid` when the blob table has no band with these bounds.
    pub(super) blob: Oid,
    /// Computed when listing: not the newest band, below the highest row.
    pub(super) droppable: bool,
    pub(super) has_end: bool,
    /// Found empty when it was looked at for dropping.
    pub(super) empty: bool,
    pub(super) dropped: bool,
    pub(super) start: i64,
    pub(super) end: i64,
    pub(super) deleted: i64,
    /// Only rows with a lower sequence id may go (`i64::MAX`: no bound).
    pub(super) below: i64,
    /// Record the highest key deleted in `envelopes.pruned_maxima` (absent in
    /// a database still at 0.3.0 under a newer library).
    pub(super) keep_maxima: bool,
}

/// Bytes of an encoded [`Entry`].
pub(super) const ENTRY_BYTES: usize = 4 * 3 + 4 + 8 * 4 + 1;

impl Entry {
    pub(super) fn encode(&self, fields: &mut worker::Fields) {
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

    pub(super) fn decode(r: &mut worker::FieldReader<'_>) -> Option<Entry> {
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
pub(super) fn list_bands() -> Result<Vec<Entry>, PruneError> {
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
pub(super) fn delete_expired(entry: &mut Entry, cutoff: i64, late: Oid) -> Result<(), PruneError> {
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
pub(super) fn try_drop(entry: &mut Entry, lock_timeout_ms: i32) -> Result<(), PruneError> {
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
