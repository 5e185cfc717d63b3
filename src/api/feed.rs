//! The change feed's SQL entry points: `originator_ceilings()` and the trigger
//! that forgets the high-water marks after a `TRUNCATE`; the feed itself is
//! [`crate::store::feed`].

use crate::error::SqlError;
use crate::store::feed::markers::MarkerError;
use crate::store::feed::{highwater, Gate};
use crate::store::partition::PartitionError;
use pgrx::prelude::*;

/// Statement-level trigger after `TRUNCATE` of meta: the rows this database's
/// high-water marks stood for are gone (see [`highwater::forget_database`]).
/// Truncating an originator's partition or a band directly does not fire it: the
/// marks then stay above the remaining rows, which only makes inserts below them
/// take the exact lateness check.
#[pg_trigger]
fn forget_high_water_marks<'a>(
    _trigger: &'a pgrx::PgTrigger<'a>,
) -> Result<Option<PgHeapTuple<'a, pgrx::AllocatedByPostgres>>, MarkerError> {
    highwater::forget_database();
    Ok(None)
}

/// Per originator, the highest sequence id a reader may advance its cursor to
/// without skipping a row that is still being inserted.
///
/// Guarantee: a row inserted through the insert functions at or below its
/// originator's ceiling is committed by the time this function returns, or it
/// arrives late (and is recorded in the late-envelope feed, which the consumer
/// functions read). Rows written into the tables directly, not through the
/// insert functions, are not covered.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(pg_catalog, pg_temp)]
fn originator_ceilings(
) -> TableIterator<'static, (name!(originator_node_id, i32), name!(max_sequence_id, i64))> {
    use crate::error::OrRaise;
    let ceilings = || -> Result<Vec<(i32, i64)>, CeilingError> {
        let nodes = crate::store::partition::originators()?;
        Gate::read_settled(&nodes, |gate| {
            let mut out = Vec::new();
            for &node in &nodes {
                if let Some(ceiling) = gate.envelope_ceiling(node)? {
                    out.push((node, ceiling));
                }
            }
            Ok::<_, CeilingError>(out)
        })
    };
    TableIterator::new(ceilings().or_raise())
}

/// Errors of [`originator_ceilings`].
#[derive(Debug, thiserror::Error)]
enum CeilingError {
    #[error("{0}")]
    Marker(#[from] MarkerError),
    #[error("{0}")]
    Partition(#[from] PartitionError),
}

impl SqlError for CeilingError {
    fn sqlstate(&self) -> crate::error::PgSqlErrorCode {
        match self {
            CeilingError::Marker(e) => e.sqlstate(),
            CeilingError::Partition(e) => e.sqlstate(),
        }
    }

    fn hint(&self) -> Option<String> {
        match self {
            CeilingError::Marker(e) => e.hint(),
            CeilingError::Partition(e) => e.hint(),
        }
    }
}
