//! Creating a missing band: under the per-database creation lock, in the caller's
//! transaction or in a background worker ([`super::worker`]), both through
//! [`create_locked`], which looks once more under the lock and creates only what
//! is still missing.

use super::band::{Band, Table};
use super::{cache, catalog, catch_up, roots, worker, PartitionError};
use crate::locks;
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::cell::Cell;

/// How many times a session waits for another session's worker creating the same
/// band, looking again after each, before starting a worker of its own.
const SHARED_WORKER_WAITS: usize = 3;

/// One creation attempt, in a worker or in the caller's transaction.
pub(super) fn create(node: i32, seq: i64, width: i64) -> Result<(), PartitionError> {
    // A transaction that already created partitions itself holds the creation
    // lock: a worker would wait for it forever, so keep creating here.
    let in_worker = crate::gucs::create_partitions_in() == crate::gucs::CreatePartitionsIn::Worker
        && !locks::holds_partition_creation_lock();
    if !in_worker {
        return create_in_transaction(node, seq, width);
    }
    match create_in_one_worker(node, seq, width)? {
        Ok(()) => Ok(()),
        Err(fallback) => {
            pgrx::log!(
                "pg_envelopes: partition worker unavailable ({fallback:?}); creating the \
                 partition for originator {node}, sequence {seq} in the inserting transaction"
            );
            create_in_transaction(node, seq, width)
        }
    }
}

/// Creates the band in a worker, unless another session is already doing that for
/// the same band: then waits for it and uses its result. Sessions crossing into a
/// new band together start one worker, not one each.
fn create_in_one_worker(
    node: i32,
    seq: i64,
    width: i64,
) -> Result<Result<(), worker::Fallback>, PartitionError> {
    let start = Band::containing(seq, width)?.start;
    for _ in 0..SHARED_WORKER_WAITS {
        if locks::try_lock_band_launch(node, start) {
            let result = worker::create_in_worker(node, seq, width);
            locks::unlock_band_launch(node, start);
            return result;
        }
        locks::wait_for_band_launch(node, start);
        if catch_up(node, seq)? {
            return Ok(Ok(()));
        }
    }
    worker::create_in_worker(node, seq, width)
}

/// Creates the partitions in the caller's transaction, under the creation lock,
/// which then stays held until that transaction ends.
fn create_in_transaction(node: i32, seq: i64, width: i64) -> Result<(), PartitionError> {
    let newly_locked = locks::lock_partition_creation();
    if catch_up(node, seq)? {
        // Someone else created it and nothing was done under the lock: hand it on
        // now rather than at commit, so other waiters need not wait for us.
        if newly_locked {
            locks::unlock_partition_creation();
        }
        return Ok(());
    }
    forget_cache_on_abort();
    // Bound the DDL's own lock waits (the parent's SHARE UPDATE EXCLUSIVE); the
    // caller's setting comes back afterwards.
    let caller_timeout =
        Spi::get_one::<String>("SELECT pg_catalog.current_setting('lock_timeout')")?
            .unwrap_or_else(|| "0".into());
    Spi::run_with_args(
        "SELECT pg_catalog.set_config('lock_timeout', $1, true)",
        &[format!("{}ms", crate::gucs::partition_lock_timeout_ms()).into()],
    )?;
    let created = create_locked(node, seq, width);
    Spi::run_with_args(
        "SELECT pg_catalog.set_config('lock_timeout', $1, true)",
        &[caller_timeout.into()],
    )?;
    created
}

/// With the creation lock held: looks again, and creates what is still missing.
/// Shared by the caller's-transaction path and the worker.
pub(super) fn create_locked(node: i32, seq: i64, width: i64) -> Result<(), PartitionError> {
    if catch_up(node, seq)? {
        return Ok(());
    }
    create_missing(node, seq, Band::containing(seq, width)?)
}

/// Creates whatever part of `(node, seq)`'s partitions is missing in either table.
fn create_missing(node: i32, seq: i64, desired: Band) -> Result<(), PartitionError> {
    let roots = roots()?;
    let mut loaded = Vec::with_capacity(2);
    for table in Table::ALL {
        let parts = match catalog::load_originator(table, node, roots[table as usize])? {
            Some(parts) => parts,
            None => {
                catalog::create_originator(table, node)?;
                cache::OriginatorParts::default()
            }
        };
        loaded.push((table, parts));
    }
    let existing: Vec<_> = loaded
        .iter()
        .flat_map(|(_, parts)| parts.bands.iter().map(|(bound, _)| *bound))
        .collect();
    let target = catalog::plan_band(seq, desired, &existing);
    for (table, parts) in &loaded {
        if parts.leaf_for(seq).is_none() {
            catalog::create_band(*table, node, &target)?;
        }
    }
    Ok(())
}

thread_local! {
    /// Local transaction id of the last transaction that registered the abort hook.
    static ABORT_HOOK_FOR: Cell<u32> = const { Cell::new(0) };
}

/// Partitions created in a transaction that aborts disappear; make sure the cache
/// forgets them too (relcache invalidation normally does, this is the backstop).
fn forget_cache_on_abort() {
    // SAFETY: MyProc is valid for the whole life of a backend.
    let lxid = unsafe { (*pg_sys::MyProc).lxid };
    if ABORT_HOOK_FOR.replace(lxid) != lxid {
        pgrx::register_xact_callback(pgrx::PgXactCallbackEvent::Abort, cache::forget_all);
    }
}
