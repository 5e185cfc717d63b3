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

mod band;
mod job;

use crate::error::{PgSqlErrorCode, SqlError};
use crate::store::partition::PartitionError;
pub use band::band_highest;
use band::{delete_expired, list_bands, try_drop, Entry};
use job::run_in_worker;
pub use job::{prune_here, run_job, JOB_KIND};
use pgrx::pg_sys::{self, Oid};
use pgrx::prelude::*;
use std::collections::HashMap;

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
