//! Partitions: band arithmetic and names ([`band`]), the known-partition cache
//! ([`cache`]), catalog reads and DDL ([`catalog`]), creation under the creation
//! lock in the caller's transaction or a worker ([`create`]), and the two entry
//! points the rest of the extension uses:
//! [`route`] on the hot path and [`ensure_band`] when a row has nowhere to go yet.
//!
//! Creation happens under one advisory lock per database (see
//! [`crate::pg::locks::lock_partition_creation`]), then re-reads the catalog, so
//! sessions racing to create the same band all end up using the one that won: no
//! 42P07 (duplicate table) or 40P01 (deadlock) reaches a caller. A single lock for
//! all originators, rather than one per originator, is deliberate: ATTACH takes
//! SHARE UPDATE EXCLUSIVE on the root, which conflicts with itself, so creators of
//! different originators serialize on the root anyway, and per-originator locks
//! taken in different orders by two transactions would deadlock with it.

pub mod band;
pub mod cache;
mod catalog;
mod create;
pub use create::{run_job as run_creation_job, JOB_KIND};

use crate::error::{PgSqlErrorCode, SqlError};
use crate::pg::locks;
use band::{Band, BandError, Table};
use cache::Route;
use pgrx::pg_sys;

/// Errors of partition lookup and creation.
#[derive(Debug, thiserror::Error)]
pub enum PartitionError {
    #[error("originator_node_id must not be NULL")]
    NullNode,
    #[error("originator_sequence_id must not be NULL")]
    NullSequence,
    #[error("originator_node_id must not be negative (got {0})")]
    NegativeNode(i32),
    #[error("originator_sequence_id must be at least {FIRST_SEQUENCE_ID} (got {0})")]
    SequenceBelowFirst(i64),
    #[error("{0}")]
    Band(#[from] BandError),
    #[error("relation \"{name}\" exists but is not a partition of the envelope store")]
    NotAPartition { name: String },
    #[error(
        "the envelope store's tables are missing; is pg_envelopes installed in this database?"
    )]
    NotInstalled,
    #[error("unexpected catalog contents: {0}")]
    Catalog(&'static str),
    #[error("partition for originator {node}, sequence {seq} is still missing after creation")]
    StillMissing { node: i32, seq: i64 },
    #[error("partition creation did not finish within {0:?}")]
    WorkerTimeout(std::time::Duration),
    #[error("partition creation failed: {message}")]
    WorkerFailed { sqlstate: i32, message: String },
    #[error("partition worker lost: {0}")]
    WorkerLost(String),
    #[error(
        "this call would create more than {max} band partitions \
         (envelopes.max_new_partitions_per_call)"
    )]
    TooManyNewBands { max: usize },
    #[error(
        "permission denied to choose band_width (only roles that may set envelopes.band_width may)"
    )]
    BandWidthNotAllowed,
    #[error("{0}")]
    NotWritable(#[from] crate::pg::xact::NotWritable),
    #[error("SPI error while managing partitions: {0}")]
    Spi(#[from] pgrx::spi::SpiError),
}

const NAME_TAKEN_HINT: &str = "Rename or drop that table; pg_envelopes owns names of the form \
     gateway_envelopes_{meta,blob}_o<node>[_s<start>_<end>].";

impl SqlError for PartitionError {
    fn sqlstate(&self) -> PgSqlErrorCode {
        use PgSqlErrorCode::*;
        match self {
            PartitionError::NullNode | PartitionError::NullSequence => {
                ERRCODE_NULL_VALUE_NOT_ALLOWED
            }
            PartitionError::NegativeNode(_) | PartitionError::SequenceBelowFirst(_) => {
                ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE
            }
            PartitionError::Band(BandError::NegativeSequence(_)) => {
                ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE
            }
            PartitionError::Band(BandError::NonPositiveWidth(_)) => ERRCODE_INVALID_PARAMETER_VALUE,
            PartitionError::NotAPartition { .. } => ERRCODE_DUPLICATE_TABLE,
            PartitionError::NotInstalled => ERRCODE_UNDEFINED_TABLE,
            PartitionError::TooManyNewBands { .. } => ERRCODE_PROGRAM_LIMIT_EXCEEDED,
            PartitionError::BandWidthNotAllowed => ERRCODE_INSUFFICIENT_PRIVILEGE,
            PartitionError::WorkerTimeout(_) => ERRCODE_LOCK_NOT_AVAILABLE,
            PartitionError::WorkerFailed { sqlstate, .. } => PgSqlErrorCode::from(*sqlstate),
            PartitionError::WorkerLost(_) => ERRCODE_CONNECTION_FAILURE,
            PartitionError::NotWritable(e) => e.sqlstate(),
            PartitionError::Catalog(_)
            | PartitionError::StillMissing { .. }
            | PartitionError::Spi(_) => ERRCODE_INTERNAL_ERROR,
        }
    }

    fn hint(&self) -> Option<String> {
        match self {
            PartitionError::WorkerTimeout(_) => Some(
                "Something holds a lock the partition DDL needs; see pg_locks. \
                 envelopes.partition_worker_timeout sets how long to wait."
                    .into(),
            ),
            PartitionError::TooManyNewBands { .. } => Some(
                "Split the batch, create the bands ahead with ensure_gateway_parts, or have \
                 the extension's owner raise the limit."
                    .into(),
            ),
            PartitionError::NotAPartition { .. } => Some(NAME_TAKEN_HINT.into()),
            PartitionError::NotWritable(e) => e.hint(),
            // The worker's own NotAPartition, which arrives as its code and message.
            PartitionError::WorkerFailed { sqlstate, .. }
                if *sqlstate == PgSqlErrorCode::ERRCODE_DUPLICATE_TABLE as i32 =>
            {
                Some(NAME_TAKEN_HINT.into())
            }
            _ => None,
        }
    }
}

/// Checks a node id from SQL.
pub fn check_node(node: Option<i32>) -> Result<i32, PartitionError> {
    match node {
        None => Err(PartitionError::NullNode),
        Some(n) if n < 0 => Err(PartitionError::NegativeNode(n)),
        Some(n) => Ok(n),
    }
}

/// The lowest sequence id an envelope may have. A cursor that has seen nothing of
/// an originator stands at `FIRST_SEQUENCE_ID - 1` (0), which is also what "no
/// cursor entry" means to every reader, so an id below it could never be read.
pub const FIRST_SEQUENCE_ID: i64 = 1;

/// Checks a sequence id from SQL.
pub fn check_sequence(seq: Option<i64>) -> Result<i64, PartitionError> {
    match seq {
        None => Err(PartitionError::NullSequence),
        Some(s) if s < FIRST_SEQUENCE_ID => Err(PartitionError::SequenceBelowFirst(s)),
        Some(s) => Ok(s),
    }
}

/// Root oids, from the cache or the syscache.
fn roots() -> Result<[pg_sys::Oid; 2], PartitionError> {
    if let Some(roots) = cache::roots() {
        return Ok(roots);
    }
    let roots = catalog::root_oids()?;
    cache::store_roots(roots);
    Ok(roots)
}

/// The root table's oid.
pub fn root_of(table: Table) -> Result<pg_sys::Oid, PartitionError> {
    Ok(roots()?[table as usize])
}

/// Node ids of every originator that has a partition, ascending.
pub fn originators() -> Result<Vec<i32>, PartitionError> {
    if let Some(nodes) = cache::originators() {
        return Ok(nodes);
    }
    let roots = roots()?;
    let nodes = catalog::list_originators(roots[Table::Meta as usize])?;
    cache::store_originators(nodes.clone());
    let mut nodes = nodes;
    nodes.sort_unstable();
    Ok(nodes)
}

/// One originator's partitions in `table` (cached, or read from the catalog), or
/// `None` if the originator has none.
pub fn originator_parts(
    table: Table,
    node: i32,
) -> Result<Option<cache::OriginatorParts>, PartitionError> {
    if let Some(parts) = cache::parts(table, node) {
        return Ok(Some(parts));
    }
    let roots = roots()?;
    let parts = catalog::load_originator(table, node, roots[table as usize])?;
    if let Some(parts) = &parts {
        cache::store(table, node, parts.clone());
    }
    Ok(parts)
}

/// The cached routes (meta, blob) of a row, without any catalog access.
pub fn cached_routes(node: i32, seq: i64) -> Option<[Route; 2]> {
    Some([
        cache::route(Table::Meta, node, seq)?,
        cache::route(Table::Blob, node, seq)?,
    ])
}

/// Locks the relations a row will be routed through, in the executor's order.
pub fn lock_routes(routes: &[Route; 2]) {
    for route in routes {
        locks::lock_for_insert(route.root);
        locks::lock_for_insert(route.parent);
        locks::lock_for_insert(route.leaf);
    }
}

/// The routes of `(node, seq)` with both leaves locked against being dropped,
/// creating the partitions first when they are missing. `width` is the band width
/// used if a band has to be created.
pub fn route(node: i32, seq: i64, width: i64) -> Result<[Route; 2], PartitionError> {
    for _ in 0..ROUTE_ATTEMPTS {
        let routes = match cached_routes(node, seq) {
            Some(routes) => routes,
            // The insert functions pin search_path only around what runs SQL.
            None => crate::pg::definer::pinned(|| ensure_band_routes(node, seq, width))?,
        };
        lock_routes(&routes);
        if cached_routes(node, seq) == Some(routes) {
            return Ok(routes);
        }
        // An invalidation arrived while locking: some partition of this originator
        // was attached, detached or dropped, and the cache forgot the originator.
        // The locks are held now, so the leaf cannot go away any more: if the
        // catalog still routes the row to it, it is ours. (What the catalog said,
        // not what the cache holds afterwards: while other sessions attach bands,
        // an invalidation taken in while reading the second table may already
        // have cleared the first, which sent a busy writer round this loop until
        // it gave up.)
        if refresh(node, seq)?.map(|found| found.routes) == Some(routes) {
            return Ok(routes);
        }
    }
    Err(PartitionError::StillMissing { node, seq })
}

/// How many times [`route`] and [`ensure_band`] look again after the partitions
/// they found moved under them (created, detached or dropped by other sessions),
/// before they give up with [`PartitionError::StillMissing`].
const ROUTE_ATTEMPTS: usize = 5;

/// Processes pending invalidations (so that what other sessions committed is
/// seen, and cached routes name partitions that still exist), then re-reads the
/// originator from the catalog: whether both tables now have a band for `seq`.
fn catch_up(node: i32, seq: i64) -> Result<bool, PartitionError> {
    crate::pg::invalidation::accept();
    Ok(refresh(node, seq)?.is_some())
}

/// Where the catalog routes a row, as [`refresh`] read it.
struct Covered {
    /// Meta, then blob.
    routes: [Route; 2],
    /// The lower bound of the meta band holding the row.
    meta_start: i64,
}

/// Re-reads one originator's partitions from the catalog into the cache and
/// tells where both tables route `seq`, if both have a band for it. The answer
/// is what was read, which callers use rather than looking the row up in the
/// cache again: reading the second table takes in invalidations, and one from
/// another session's new band may already have cleared the first table's entry.
fn refresh(node: i32, seq: i64) -> Result<Option<Covered>, PartitionError> {
    let roots = roots()?;
    let mut found: [Option<(Route, i64)>; 2] = [None, None];
    for table in Table::ALL {
        let root = roots[table as usize];
        let Some(parts) = catalog::load_originator(table, node, root)? else {
            continue;
        };
        found[table as usize] = parts
            .bands
            .iter()
            .find(|(bound, _)| bound.contains(seq))
            .map(|&(bound, leaf)| {
                let route = Route {
                    root,
                    parent: parts.parent,
                    leaf,
                    path: parts.path(leaf),
                };
                (route, bound.lower.unwrap_or(i64::MIN))
            });
        cache::store(table, node, parts);
    }
    Ok(match found {
        [Some((meta, meta_start)), Some((blob, _))] => Some(Covered {
            routes: [meta, blob],
            meta_start,
        }),
        _ => None,
    })
}

/// Refuses a call that would create more than `envelopes.max_new_partitions_per_call`
/// bands for `keys` (sorted by node, then sequence id), before it creates any: the
/// bands it would plan, given what exists now.
pub fn check_new_bands(keys: &[(i32, i64)], width: i64) -> Result<(), PartitionError> {
    let max = crate::gucs::max_new_partitions_per_call();
    if keys.len() <= max {
        return Ok(()); // one row creates at most one band
    }
    // Then the cache does not remember bands that other sessions dropped.
    crate::pg::invalidation::accept();
    let mut count = 0;
    for run in keys.chunk_by(|a, b| a.0 == b.0) {
        let node = run[0].0;
        if run
            .iter()
            .all(|&(node, seq)| cached_routes(node, seq).is_some())
        {
            continue;
        }
        let mut existing: Vec<band::RangeBound> = Vec::new();
        for table in Table::ALL {
            if let Some(parts) = originator_parts(table, node)? {
                existing.extend(parts.bands.iter().map(|(bound, _)| *bound));
            }
        }
        for &(_, seq) in run {
            if existing.iter().any(|bound| bound.contains(seq)) {
                continue;
            }
            let planned = catalog::plan_band(seq, Band::containing(seq, width)?, &existing);
            existing.push(band::RangeBound {
                lower: Some(planned.start),
                upper: planned.end,
            });
            count += 1;
            if count > max {
                return Err(PartitionError::TooManyNewBands { max });
            }
        }
    }
    Ok(())
}

/// Makes sure both tables have a partition for `(node, seq)`, creating the
/// originator level and the band when missing. Idempotent and safe to race.
pub fn ensure_band(node: i32, seq: i64, width: i64) -> Result<(), PartitionError> {
    ensure_band_routes(node, seq, width).map(|_| ())
}

/// [`ensure_band`], telling where the row goes (not yet locked: [`route`] locks
/// and checks).
fn ensure_band_routes(node: i32, seq: i64, width: i64) -> Result<[Route; 2], PartitionError> {
    Band::containing(seq, width)?;
    // Then a cached route names partitions that still exist.
    crate::pg::invalidation::accept();
    if let Some(routes) = cached_routes(node, seq) {
        return Ok(routes);
    }
    if let Some(found) = refresh(node, seq)? {
        return Ok(found.routes);
    }
    // A band created (or found) here is empty until this session's insert
    // commits, and prune_expired drops empty bands. Guard the band until this
    // transaction ends: the aligned band before it is created (usually the one that
    // will be), the actual one once known; then check it is still there (a prune
    // may have dropped it before the guard); if not, create it again.
    locks::hold_off_prune(node, Band::containing(seq, width)?.start);
    for _ in 0..ROUTE_ATTEMPTS {
        create::create(node, seq, width)?;
        let Some(found) = refresh(node, seq)? else {
            continue;
        };
        locks::hold_off_prune(node, found.meta_start);
        crate::pg::invalidation::accept();
        match refresh(node, seq)? {
            Some(again) if again.meta_start == found.meta_start => return Ok(again.routes),
            _ => {}
        }
    }
    Err(PartitionError::StillMissing { node, seq })
}

/// For maintenance: creates the band holding `(node, seq)` ahead of its rows,
/// the way an insert would ([`ensure_band`]), unless both tables have one
/// already. True when it was missing.
pub fn create_ahead(node: i32, seq: i64, width: i64) -> Result<bool, PartitionError> {
    Band::containing(seq, width)?;
    crate::pg::invalidation::accept();
    if refresh(node, seq)?.is_some() {
        return Ok(false);
    }
    ensure_band(node, seq, width)?;
    Ok(true)
}

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use crate::testing::{band_names, int8, sqlstate_of};
    use pgrx::prelude::*;

    #[pg_test]
    fn ensure_creates_both_levels_in_both_tables() {
        Spi::run("SELECT envelopes.ensure_gateway_parts(7, 1500000)").unwrap();
        assert_eq!(
            band_names("meta"),
            ["gateway_envelopes_meta_o7_s1000000_2000000"]
        );
        assert_eq!(
            band_names("blob"),
            ["gateway_envelopes_blob_o7_s1000000_2000000"]
        );
        let parents = int8(
            "SELECT count(*) FROM pg_catalog.pg_partition_tree('envelopes.gateway_envelopes_meta')
              WHERE level = 1 AND relid::text LIKE '%gateway_envelopes_meta_o7'",
        );
        assert_eq!(parents, 1);
    }

    #[pg_test]
    fn ensure_is_idempotent() {
        for _ in 0..3 {
            Spi::run("SELECT envelopes.ensure_gateway_parts(7, 5)").unwrap();
        }
        Spi::run("SELECT envelopes.ensure_gateway_parts(7, 999999)").unwrap();
        assert_eq!(band_names("meta"), ["gateway_envelopes_meta_o7_s0_1000000"]);
    }

    #[pg_test]
    fn explicit_band_width_wins_over_the_setting() {
        Spi::run("SELECT envelopes.ensure_gateway_parts(3, 25, 10)").unwrap();
        assert_eq!(band_names("meta"), ["gateway_envelopes_meta_o3_s20_30"]);
    }

    #[pg_test]
    fn band_width_setting_applies_per_session() {
        Spi::run("SET LOCAL envelopes.band_width = 100").unwrap();
        Spi::run("SELECT envelopes.ensure_gateway_parts(3, 250)").unwrap();
        assert_eq!(band_names("meta"), ["gateway_envelopes_meta_o3_s200_300"]);
    }

    #[pg_test]
    fn new_bands_fit_between_bands_of_another_width() {
        Spi::run("SELECT envelopes.ensure_gateway_parts(3, 50, 100)").unwrap();
        Spi::run("SELECT envelopes.ensure_gateway_parts(3, 5000, 100)").unwrap();
        // Width 1000 would give [0, 1000): it is clamped to the gap [100, 1000)
        // and then to [5100, 6000) above the existing band.
        Spi::run("SELECT envelopes.ensure_gateway_parts(3, 150, 1000)").unwrap();
        Spi::run("SELECT envelopes.ensure_gateway_parts(3, 5150, 1000)").unwrap();
        assert_eq!(
            band_names("meta"),
            [
                "gateway_envelopes_meta_o3_s0_100",
                "gateway_envelopes_meta_o3_s100_1000",
                "gateway_envelopes_meta_o3_s5000_5100",
                "gateway_envelopes_meta_o3_s5100_6000",
            ]
        );
    }

    #[pg_test]
    fn last_band_reaches_maxvalue_without_overflow() {
        Spi::run("SELECT envelopes.ensure_gateway_parts(2147483647, 9223372036854775807)").unwrap();
        let start = i64::MAX - i64::MAX % 1_000_000;
        assert_eq!(
            band_names("meta"),
            [format!("gateway_envelopes_meta_o2147483647_s{start}")]
        );
        let bound = Spi::get_one::<String>(
            "SELECT pg_catalog.pg_get_expr(c.relpartbound, c.oid) FROM pg_catalog.pg_class c
              WHERE c.relkind = 'r' AND c.relname LIKE 'gateway\\_envelopes\\_meta\\_o2147483647\\_s%'",
        )
        .unwrap()
        .unwrap();
        assert_eq!(bound, format!("FOR VALUES FROM ('{start}') TO (MAXVALUE)"));
        let inserted = int8(
            "SELECT envelopes.insert_gateway_envelope(2147483647, 9223372036854775807, '\\x01', '\\x02')",
        );
        assert_eq!(inserted, 1);
    }

    #[pg_test]
    fn bad_arguments_have_specific_sqlstates() {
        let cases = [
            ("SELECT envelopes.ensure_gateway_parts(NULL, 1)", "22004"),
            ("SELECT envelopes.ensure_gateway_parts(1, NULL)", "22004"),
            ("SELECT envelopes.ensure_gateway_parts(-1, 1)", "22003"),
            ("SELECT envelopes.ensure_gateway_parts(1, -1)", "22003"),
            ("SELECT envelopes.ensure_gateway_parts(1, 1, 0)", "22023"),
            ("SELECT envelopes.ensure_gateway_parts(1, 1, -10)", "22023"),
        ];
        for (sql, expected) in cases {
            assert_eq!(sqlstate_of(sql).as_deref(), Some(expected), "{sql}");
        }
        assert!(band_names("meta").is_empty());
    }

    #[pg_test]
    fn band_width_setting_rejects_non_positive_values() {
        assert_eq!(
            sqlstate_of("SET envelopes.band_width = 0").as_deref(),
            Some("22023")
        );
    }

    #[pg_test]
    fn a_foreign_table_with_our_name_is_a_clear_error() {
        Spi::run("CREATE TABLE envelopes.gateway_envelopes_meta_o77 (x int)").unwrap();
        assert_eq!(
            sqlstate_of("SELECT envelopes.insert_gateway_envelope(77, 1, '\\x01', '\\x02')")
                .as_deref(),
            Some("42P07")
        );
        assert_eq!(
            int8("SELECT count(*) FROM envelopes.gateway_envelopes_blob"),
            0
        );
    }

    #[pg_test]
    fn creating_a_band_that_exists_already_uses_it() {
        use super::band::{Band, Table};
        use super::catalog;
        Spi::run("SELECT envelopes.ensure_gateway_parts(5, 10, 100)").unwrap();
        // As if the read under the creation lock had missed the band: the name is
        // taken by our own partition with the planned bound, so nothing is made.
        let band = Band {
            start: 0,
            end: Some(100),
        };
        catalog::create_originator(Table::Meta, 5).unwrap();
        catalog::create_band(Table::Meta, 5, &band).unwrap();
        assert_eq!(band_names("meta"), ["gateway_envelopes_meta_o5_s0_100"]);
        // The same name with another bound is not ours.
        Spi::run(
            "ALTER TABLE envelopes.gateway_envelopes_meta_o5 DETACH PARTITION
                 envelopes.gateway_envelopes_meta_o5_s0_100;
             ALTER TABLE envelopes.gateway_envelopes_meta_o5 ATTACH PARTITION
                 envelopes.gateway_envelopes_meta_o5_s0_100 FOR VALUES FROM (0) TO (50)",
        )
        .unwrap();
        let err = catalog::create_band(Table::Meta, 5, &band).unwrap_err();
        assert!(
            matches!(err, super::PartitionError::NotAPartition { .. }),
            "{err:?}"
        );
    }

    #[pg_test]
    fn view_prunes_to_one_originator() {
        for node in 1..=3 {
            Spi::run(&format!(
                "SELECT envelopes.ensure_gateway_parts({node}, 10)"
            ))
            .unwrap();
            Spi::run(&format!(
                "SELECT envelopes.ensure_gateway_parts({node}, 1000010)"
            ))
            .unwrap();
        }
        let plan = Spi::connect(|client| {
            client
                .select(
                    "EXPLAIN (COSTS OFF) SELECT * FROM envelopes.gateway_envelopes_view
                      WHERE originator_node_id = 2 AND originator_sequence_id = 1000012",
                    None,
                    &[],
                )
                .unwrap()
                .map(|row| row.get::<String>(1).unwrap().unwrap())
                .collect::<Vec<_>>()
                .join("\n")
        });
        assert!(
            plan.contains("gateway_envelopes_meta_o2_s1000000_2000000"),
            "{plan}"
        );
        // Blob is read by key for the meta rows found (envelopes.envelope_of), so
        // no blob table is in the plan at all (pg_test/sql/view_pruning.sql counts
        // the bands it touches).
        assert!(!plan.contains("gateway_envelopes_blob"), "{plan}");
        for other in ["_o1_", "_o3_", "_o2_s0_"] {
            assert!(!plan.contains(other), "plan touches {other}:\n{plan}");
        }
    }
}
