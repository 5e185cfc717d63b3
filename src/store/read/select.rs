//! Cursor reads: `select_gateway_envelopes` and `originator_ceilings`.
//!
//! A cursor is a vector clock: for each originator, the last sequence id the
//! reader has seen (0 when the originator is absent). The selector walks the
//! originators in ascending order and, within one, its band partitions in
//! ascending order, querying each band's leaf tables directly with an index range
//! scan and stopping as soon as `row_limit` rows are collected. A query never names
//! the partitioned roots, so no plan is built over all partitions and the cost
//! follows the rows returned and the bands they sit in, not the total number of
//! partitions.
//!
//! Sequence order is not commit order: a reader that moves its cursor past a row
//! it saw may skip a lower sequence id that commits later. `originator_ceilings`
//! ([`crate::store::feed`]) tells readers how far they may move; the consumer functions
//! ([`crate::store::consumer`]) also hand out the rows that arrive late.

use crate::error::{PgSqlErrorCode, SqlError};
use crate::pg::scan::Reading;
use crate::pg::srf::Materialized;
use crate::store::partition::{self, PartitionError};
use crate::store::read;
use crate::store::read::results::EnvelopeResults;
use pgrx::pg_sys;
use std::collections::HashMap;

/// Errors of the read functions.
#[derive(Debug, thiserror::Error)]
pub enum SelectError {
    #[error("cursor_node_ids has {nodes} elements but cursor_sequence_ids has {seqs}")]
    CursorLength { nodes: usize, seqs: usize },
    #[error("{0} must not be NULL")]
    Null(&'static str),
    #[error("{name}[{index}] must not be NULL")]
    NullElement { name: &'static str, index: usize },
    #[error("originator {0} appears more than once in the cursor")]
    DuplicateCursor(i32),
    #[error("{name} must not be negative (got {value})")]
    Negative { name: &'static str, value: i32 },
    #[error("{0}")]
    Partition(#[from] PartitionError),
    #[error("no snapshot is active: call the read functions from a query")]
    NoSnapshot,
}

impl SqlError for SelectError {
    fn sqlstate(&self) -> PgSqlErrorCode {
        use PgSqlErrorCode::*;
        match self {
            SelectError::CursorLength { .. } => ERRCODE_ARRAY_ELEMENT_ERROR,
            SelectError::Null(_) | SelectError::NullElement { .. } => {
                ERRCODE_NULL_VALUE_NOT_ALLOWED
            }
            SelectError::DuplicateCursor(_) | SelectError::Negative { .. } => {
                ERRCODE_INVALID_PARAMETER_VALUE
            }
            SelectError::Partition(e) => e.sqlstate(),
            SelectError::NoSnapshot => ERRCODE_INVALID_TRANSACTION_STATE,
        }
    }
}

/// The snapshot the calling statement reads with.
pub fn statement_snapshot() -> Result<pg_sys::Snapshot, SelectError> {
    crate::pg::snapshot::statement().ok_or(SelectError::NoSnapshot)
}

/// Reads into `out` the rows of one originator with `after < seq <= upto`, in
/// order, restricted to `topics` when given, as seen by `snapshot`, until `out`
/// holds `limit` rows.
pub fn read_originator(
    node: i32,
    after: i64,
    upto: i64,
    topics: Option<&[Vec<u8>]>,
    limit: usize,
    snapshot: pg_sys::Snapshot,
    out: &mut Materialized,
) -> Result<(), SelectError> {
    if out.len >= limit {
        return Ok(());
    }
    // What a read function reads it keeps (locked) until the transaction ends.
    let reading = Reading::kept(snapshot);
    let mut take = |mut at: read::At<'_>| out.take(&mut at, limit);
    match topics {
        None => read::walk_originator(node, after, upto, reading, read::Blobs::All, take)?,
        Some(topics) => {
            let mut entries: Vec<read::TopicEntry> = topics
                .iter()
                .map(|topic| read::TopicEntry {
                    topic: topic.clone(),
                    after,
                    limit: usize::MAX,
                })
                .collect();
            read::walk_topics(node, &mut entries, upto, reading, &mut take)?
        }
    };
    Ok(())
}

/// `select_gateway_envelopes`: the rows after `cursor` (absent originators read
/// from 0) of `originators` (all when `None`), restricted to `topics` when given,
/// in (originator, sequence id) order, until `out` holds `limit` rows.
pub fn select(
    cursor: HashMap<i32, i64>,
    mut topics: Option<Vec<Vec<u8>>>,
    originators: Option<Vec<i32>>,
    limit: usize,
    out: &mut Materialized,
) -> Result<(), SelectError> {
    let mut originators = match originators {
        Some(nodes) => nodes,
        None => partition::originators()?,
    };
    originators.sort_unstable();
    originators.dedup();
    if limit == 0 || topics.as_ref().is_some_and(Vec::is_empty) {
        return Ok(());
    }

    if let Some(topics) = topics.as_mut() {
        topics.sort_unstable();
        topics.dedup();
    }
    let snapshot = statement_snapshot()?;
    for node in originators {
        if out.len >= limit {
            break;
        }
        let after = cursor.get(&node).copied().unwrap_or(0);
        read_originator(
            node,
            after,
            i64::MAX,
            topics.as_deref(),
            limit,
            snapshot,
            out,
        )?;
    }
    Ok(())
}

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use crate::testing::{int8, sqlstate_of};
    use pgrx::prelude::*;

    /// Inserts seqs 1..=n for each node, topic = node's byte + (seq % 2).
    fn fill(nodes: &[i32], n: i64) {
        for node in nodes {
            Spi::run(&format!(
                "SELECT envelopes.insert_gateway_envelopes(
                     array_agg({node}), array_agg(s), array_agg(pg_catalog.int2send((s % 2)::int2)),
                     array_agg(pg_catalog.int8send(s)))
                   FROM generate_series(1::bigint, {n}) s"
            ))
            .unwrap();
        }
    }

    /// (node, seq) pairs a select returns, in order.
    fn keys(args: &str) -> Vec<(i32, i64)> {
        Spi::connect(|client| {
            client
                .select(
                    &format!(
                        "SELECT originator_node_id, originator_sequence_id
                           FROM envelopes.select_gateway_envelopes({args})"
                    ),
                    None,
                    &[],
                )
                .unwrap()
                .map(|r| {
                    (
                        r.get::<i32>(1).unwrap().unwrap(),
                        r.get::<i64>(2).unwrap().unwrap(),
                    )
                })
                .collect()
        })
    }

    #[pg_test]
    fn absent_originators_read_from_zero() {
        fill(&[1, 2, 3], 3);
        let rows = keys("cursor_node_ids => '{2}', cursor_sequence_ids => '{2}'");
        assert_eq!(
            rows,
            [(1, 1), (1, 2), (1, 3), (2, 3), (3, 1), (3, 2), (3, 3)]
        );
    }

    #[pg_test]
    fn default_arguments_read_everything_in_order() {
        fill(&[5, 4], 2);
        assert_eq!(keys(""), [(4, 1), (4, 2), (5, 1), (5, 2)]);
    }

    #[pg_test]
    fn topics_and_originators_both_apply() {
        fill(&[1, 2, 3], 6);
        // topic '\x0001' = odd sequence ids
        let rows = keys("topics => ARRAY['\\x0001'::bytea], originator_node_ids => '{3, 1}'");
        assert_eq!(rows, [(1, 1), (1, 3), (1, 5), (3, 1), (3, 3), (3, 5)]);
        assert_eq!(keys("originator_node_ids => '{2}'").len(), 6);
        assert_eq!(keys("topics => '{}'"), []);
        assert_eq!(keys("originator_node_ids => '{}'"), []);
        assert_eq!(keys("originator_node_ids => '{99}'"), []);
    }

    #[pg_test]
    fn limit_cuts_in_order_across_bands_and_originators() {
        Spi::run("SET LOCAL envelopes.band_width = 4").unwrap();
        fill(&[1, 2], 10);
        let rows = keys("cursor_node_ids => '{1}', cursor_sequence_ids => '{6}', row_limit => 7");
        assert_eq!(
            rows,
            [(1, 7), (1, 8), (1, 9), (1, 10), (2, 1), (2, 2), (2, 3)]
        );
        assert_eq!(keys("row_limit => 0"), []);
        // Paging with the last row seen as the cursor returns the rest exactly once.
        let mut seen = Vec::new();
        let (mut c1, mut c2) = (0, 0);
        loop {
            let page = keys(&format!(
                "cursor_node_ids => '{{1,2}}', cursor_sequence_ids => '{{{c1},{c2}}}', row_limit => 3"
            ));
            if page.is_empty() {
                break;
            }
            for &(node, seq) in &page {
                if node == 1 {
                    c1 = seq
                } else {
                    c2 = seq
                }
            }
            seen.extend(page);
        }
        assert_eq!(seen.len(), 20);
        assert!(seen.windows(2).all(|w| w[0] < w[1]));
    }

    #[pg_test]
    fn returns_every_column() {
        Spi::run(
            "SELECT envelopes.insert_gateway_envelope(9, 1, '\\xaa', '\\xbbcc', 7,
                 '2026-01-01 00:00:00+00', 1900000000)",
        )
        .unwrap();
        let same = int8(
            "SELECT count(*) FROM envelopes.select_gateway_envelopes() s
               JOIN envelopes.gateway_envelopes_view v USING (originator_node_id, originator_sequence_id)
              WHERE s.gateway_time = v.gateway_time AND s.topic = '\\xaa' AND s.payer_id = 7
                AND s.expiry = 1900000000 AND s.originator_envelope = '\\xbbcc'",
        );
        assert_eq!(same, 1);
    }

    #[pg_test]
    fn select_rejects_bad_arguments_with_sqlstates() {
        let cases = [
            ("'{1,2}', '{1}'", "2202E"),
            ("'{1,NULL}', '{1,2}'", "22004"),
            ("'{1}', '{NULL}'", "22004"),
            ("'{1,1}', '{1,2}'", "22023"),
            ("row_limit => -1", "22023"),
            ("row_limit => NULL", "22004"),
            ("topics => ARRAY[NULL]::bytea[]", "22004"),
            ("originator_node_ids => '{1,NULL}'", "22004"),
        ];
        for (args, expected) in cases {
            let sql = format!("SELECT * FROM envelopes.select_gateway_envelopes({args})");
            assert_eq!(sqlstate_of(&sql).as_deref(), Some(expected), "{sql}");
        }
    }

    #[pg_test]
    fn reads_use_band_indexes_not_a_scan_of_everything() {
        // A read for one originator after a cursor touches only the bands at or
        // above the cursor, each through an index scan.
        Spi::run("SET LOCAL envelopes.band_width = 100").unwrap();
        fill(&[1], 1000);
        Spi::run("SELECT pg_catalog.pg_stat_force_next_flush()").unwrap();
        let before = int8("SELECT COALESCE(sum(seq_scan), 0)::bigint FROM pg_catalog.pg_stat_xact_user_tables WHERE schemaname = 'envelopes'");
        let rows =
            keys("cursor_node_ids => '{1}', cursor_sequence_ids => '{950}', row_limit => 10");
        assert_eq!(rows.first(), Some(&(1, 951)));
        assert_eq!(rows.len(), 10);
        let after = int8("SELECT COALESCE(sum(seq_scan), 0)::bigint FROM pg_catalog.pg_stat_xact_user_tables WHERE schemaname = 'envelopes'");
        assert_eq!(after, before, "the read scanned a table sequentially");
    }

    #[pg_test]
    fn ceilings_are_the_committed_maxima_without_concurrent_writers() {
        fill(&[1, 2], 5);
        Spi::run("SELECT envelopes.insert_gateway_envelope(2, 70, '\\x01', '\\x01')").unwrap();
        let ceilings = Spi::connect(|client| {
            client
                .select(
                    "SELECT * FROM envelopes.originator_ceilings() ORDER BY 1",
                    None,
                    &[],
                )
                .unwrap()
                .map(|r| {
                    (
                        r.get::<i32>(1).unwrap().unwrap(),
                        r.get::<i64>(2).unwrap().unwrap(),
                    )
                })
                .collect::<Vec<_>>()
        });
        assert_eq!(ceilings, [(1, 5), (2, 70)]);
    }

    #[pg_test]
    fn partitions_lists_every_band_with_its_bounds() {
        Spi::run("SET LOCAL envelopes.band_width = 10").unwrap();
        fill(&[1], 25);
        Spi::run("SELECT envelopes.ensure_gateway_parts(2, 9223372036854775807)").unwrap();
        let bands = Spi::connect(|client| {
            client
                .select(
                    "SELECT originator_node_id, band_start, band_end, meta_partition::text, blob_partition::text
                       FROM envelopes.partitions()",
                    None,
                    &[],
                )
                .unwrap()
                .map(|r| {
                    (
                        r.get::<i32>(1).unwrap().unwrap(),
                        r.get::<i64>(2).unwrap().unwrap(),
                        r.get::<i64>(3).unwrap(),
                        r.get::<String>(4).unwrap().unwrap(),
                        r.get::<String>(5).unwrap().unwrap(),
                    )
                })
                .collect::<Vec<_>>()
        });
        assert_eq!(bands.len(), 4);
        assert_eq!(
            bands[0],
            (
                1,
                0,
                Some(10),
                "envelopes.gateway_envelopes_meta_o1_s0_10".into(),
                "envelopes.gateway_envelopes_blob_o1_s0_10".into()
            )
        );
        assert_eq!((bands[2].1, bands[2].2), (20, Some(30)));
        assert_eq!((bands[3].0, bands[3].2), (2, None));
        assert!(int8("SELECT min(total_bytes) FROM envelopes.partitions()") > 0);
    }

    #[pg_test]
    fn prune_deletes_expired_rows_and_drops_empty_old_bands() {
        // In the test's own transaction: a worker would not see its uncommitted rows.
        // Originator 901: other #[pg_test]s run at the same time, and a band another
        // test's open transaction is filling is one prune must leave alone.
        Spi::run("SET LOCAL envelopes.band_width = 10").unwrap();
        // Band [0,10) all expired, band [10,20) half expired, band [20,30) newest and expired.
        Spi::run(
            "SELECT envelopes.insert_gateway_envelope(901, s, '\\x01', '\\x01',
                 expiry => CASE WHEN s < 10 OR s % 2 = 0 OR s >= 20 THEN 100 END)
               FROM generate_series(1, 25) s",
        )
        .unwrap();
        let removed = Spi::connect(|client| {
            client
                .select("SELECT band_start, deleted_rows, dropped FROM envelopes.prune_expired(as_of => 200, in_transaction => true)", None, &[])
                .unwrap()
                .map(|r| (r.get::<i64>(1).unwrap().unwrap(), r.get::<i64>(2).unwrap().unwrap(), r.get::<bool>(3).unwrap().unwrap()))
                .collect::<Vec<_>>()
        });
        assert_eq!(removed, [(0, 9, true), (10, 5, false), (20, 6, false)]);
        assert_eq!(
            int8("SELECT count(*) FROM envelopes.gateway_envelopes_view WHERE originator_node_id = 901"),
            5
        );
        assert_eq!(
            int8("SELECT count(*) FROM envelopes.orphaned_envelopes()"),
            0
        );
        assert_eq!(
            int8("SELECT count(*) FROM envelopes.partitions() WHERE originator_node_id = 901"),
            2
        );
        // Nothing left to do; unexpired (NULL expiry) rows stay.
        assert_eq!(
            int8("SELECT count(*) FROM envelopes.prune_expired(as_of => 200, in_transaction => true)"),
            0
        );
        // A late arrival for the dropped band recreates it.
        assert_eq!(
            int8("SELECT envelopes.insert_gateway_envelope(901, 3, '\\x01', '\\x01')"),
            1
        );
        assert_eq!(
            int8("SELECT count(*) FROM envelopes.partitions() WHERE originator_node_id = 901"),
            3
        );
        assert_eq!(
            sqlstate_of("SELECT * FROM envelopes.prune_expired(lock_timeout_ms => 0)").as_deref(),
            Some("22023")
        );
    }
}
