//! The partitions' SQL entry points: `ensure_gateway_parts` (who may choose a
//! band width), `prune_expired` and the guard it asks bands for; partitions and
//! retention themselves are [`crate::store::partition`] and
//! [`crate::store::retention`].

use super::args::elements;
use crate::error::OrRaise;
use crate::store::partition::{self, band::Band, PartitionError};
use crate::store::retention::{self, PruneError};
use pgrx::prelude::*;
use std::collections::HashMap;

/// For `prune_expired`: whether it may drop this band now (no session is between
/// creating or finding it and inserting into it). When it may, the guard is held
/// until the caller's transaction ends.
#[pg_extern(volatile, parallel_unsafe)]
fn _prune_guard(originator_node_id: i32, band_start: i64) -> bool {
    crate::pg::locks::try_lock_for_prune(originator_node_id, band_start)
}

/// Creates the partitions for `(originator_node_id, originator_sequence_id)` in
/// both tables if they do not exist yet. Idempotent: calling it again, or racing
/// other sessions doing the same, is harmless. `band_width` defaults to the
/// `envelopes.band_width` setting.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(pg_catalog, pg_temp)]
fn ensure_gateway_parts(
    originator_node_id: Option<i32>,
    originator_sequence_id: Option<i64>,
    band_width: default!(Option<i64>, "NULL"),
) {
    let ensure = || {
        crate::pg::xact::check_writable("ensure_gateway_parts")?;
        let node = partition::check_node(originator_node_id)?;
        let seq = partition::check_sequence(originator_sequence_id)?;
        let setting = crate::gucs::band_width();
        let width = band_width.unwrap_or(setting);
        Band::containing(seq, width)?; // a bad width is a bad value, whoever gives it
                                       // A width of the caller's choosing is a way around the setting's limit.
        if width != setting && !crate::gucs::caller_may_set("envelopes.band_width")? {
            return Err(PartitionError::BandWidthNotAllowed);
        }
        partition::ensure_band(node, seq, width)
    };
    ensure().or_raise()
}

/// Deletes envelopes whose `expiry` (unix seconds) is before `as_of` (default:
/// now), from meta and blob together and from the late-envelope feed, then drops
/// band partitions left empty that are neither their originator's newest band nor
/// ahead of its highest row. Returns one row per band it deleted rows from or
/// looked at for dropping and found empty (`dropped` says whether it could).
#[pg_extern(volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
#[allow(clippy::type_complexity)]
fn prune_expired(
    as_of: default!(Option<i64>, "NULL"),
    lock_timeout_ms: default!(Option<i32>, "200"),
    in_transaction: default!(Option<bool>, "false"),
) -> TableIterator<
    'static,
    (
        name!(originator_node_id, i32),
        name!(band_start, i64),
        name!(band_end, Option<i64>),
        name!(deleted_rows, i64),
        name!(dropped, bool),
    ),
> {
    let rows = retention::prune(
        as_of,
        lock_timeout_ms,
        in_transaction.unwrap_or(false),
        None,
    )
    .or_raise();
    TableIterator::new(rows)
}

/// `prune_expired` bounded per originator: only the originators in
/// `originator_node_ids` are looked at, and of each only the expired rows with a
/// sequence id below its element of `below_sequence_ids` are deleted (an
/// application that may delete only what it has settled, as xmtpd prunes below
/// its settled payer reports). The other arguments and the result are
/// `prune_expired`'s.
#[pg_extern(volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
#[allow(clippy::type_complexity)]
fn prune_expired_below(
    originator_node_ids: Option<Array<'_, i32>>,
    below_sequence_ids: Option<Array<'_, i64>>,
    as_of: default!(Option<i64>, "NULL"),
    lock_timeout_ms: default!(Option<i32>, "200"),
    in_transaction: default!(Option<bool>, "false"),
) -> TableIterator<
    'static,
    (
        name!(originator_node_id, i32),
        name!(band_start, i64),
        name!(band_end, Option<i64>),
        name!(deleted_rows, i64),
        name!(dropped, bool),
    ),
> {
    let prune = || {
        let nodes = elements("originator_node_ids", originator_node_ids)?
            .ok_or(PruneError::NullBound("originator_node_ids"))?;
        let seqs = elements("below_sequence_ids", below_sequence_ids)?
            .ok_or(PruneError::NullBound("below_sequence_ids"))?;
        if nodes.len() != seqs.len() {
            return Err(PruneError::BoundLength {
                nodes: nodes.len(),
                seqs: seqs.len(),
            });
        }
        let mut bounds = HashMap::with_capacity(nodes.len());
        for (node, seq) in nodes.into_iter().zip(seqs) {
            if bounds.insert(node, seq).is_some() {
                return Err(PruneError::DuplicateBound(node));
            }
        }
        retention::prune(
            as_of,
            lock_timeout_ms,
            in_transaction.unwrap_or(false),
            Some(&bounds),
        )
    };
    TableIterator::new(prune().or_raise())
}

/// Rows present in one of meta and blob and missing from the other (`missing_from`
/// names the table without it). Empty unless someone wrote to the tables directly
/// or dropped a band of one table only. Reads band by band, holding a lock or two
/// at a time, so it works however many bands the store has.
#[pg_extern(stable, parallel_unsafe, security_definer)]
#[search_path(pg_catalog, pg_temp)]
#[allow(clippy::type_complexity)]
fn orphaned_envelopes() -> TableIterator<
    'static,
    (
        name!(originator_node_id, i32),
        name!(originator_sequence_id, i64),
        name!(missing_from, String),
    ),
> {
    let find = || {
        let mut out = Vec::new();
        crate::store::read::orphans::orphans(|node, seq, missing_from| {
            out.push((node, seq, missing_from.to_owned()));
        })?;
        Ok::<_, PartitionError>(out)
    };
    TableIterator::new(find().or_raise())
}

/// The size of the store against the lock table: how many originators and bands
/// it has, about how many locks a statement over the whole store takes (a query
/// on `gateway_envelopes_view` or the roots that no originator or sequence bound
/// narrows down, `prune_expired(in_transaction => true)`), and how many the lock
/// table holds (`max_locks_per_transaction` for each connection slot). When
/// `whole_store_locks` nears `lock_table_size`, such statements fail with 53200;
/// the functions of the extension read band by band and need no more than the
/// bands they find rows in.
#[pg_extern(stable, parallel_safe, security_definer)]
#[search_path(pg_catalog, pg_temp)]
#[allow(clippy::type_complexity)]
fn store_size() -> TableIterator<
    'static,
    (
        name!(originators, i64),
        name!(bands, i64),
        name!(whole_store_locks, i64),
        name!(lock_table_size, i64),
        name!(max_locks_per_transaction, i64),
    ),
> {
    let size = || {
        let nodes = partition::originators()?;
        let mut bands = 0i64;
        for &node in &nodes {
            if let Some(parts) = partition::originator_parts(partition::band::Table::Meta, node)? {
                bands += parts.bands.len() as i64;
            }
        }
        let (per_slot, slots) = crate::pg::locks::lock_table_size();
        Ok::<_, PartitionError>((
            nodes.len() as i64,
            bands,
            bands * retention::LOCKS_PER_BAND as i64 + 2 * nodes.len() as i64 + 2,
            (per_slot * slots) as i64,
            per_slot as i64,
        ))
    };
    TableIterator::once(size().or_raise())
}
