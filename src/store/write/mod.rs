//! `insert_gateway_envelope` and `insert_gateway_envelopes`, and their packed
//! forms for `pg_envelopes_router` (`insert_gateway_envelope_packed`,
//! `insert_gateway_envelopes_packed`).
//!
//! Both write meta and blob in the caller's transaction, so a row is either in
//! both tables or in neither, and return how many envelopes were new: an existing
//! `(originator_node_id, originator_sequence_id)` is skipped, which makes replays
//! idempotent.
//!
//! The hot path (partitions already known) validates the input, asks the
//! partition cache for the row's route, locks it, takes the change feed's
//! envelope marker, checks whether the row arrives late (below a sequence id of
//! its originator that another transaction has committed, see [`crate::store::feed`]),
//! and writes the rows straight into their band leaves ([`direct`]): no SQL
//! statement, no subtransaction, no catalog query. A late row is flagged and
//! recorded in the late-envelope feed on the same path. Only a cache miss pays
//! for the catalog read, the advisory lock and the DDL (see [`crate::store::partition`]);
//! there is no "no partition found" error to recover from, because a row is only
//! inserted once its partitions are known to exist. Tables the direct path does
//! not reproduce (a trigger, a changed layout, see [`direct::Writer::open`]) get
//! the SQL statements below, a data-modifying CTE per call, with its own plans
//! for late rows.

mod direct;
mod leaf;
mod sql;

use crate::error::{PgSqlErrorCode, SqlError};
use crate::gucs;
use crate::store::feed::late;
use crate::store::feed::markers::{self, Drawn, MarkerError};
use crate::store::partition::{self, cache, PartitionError};
use pgrx::datum::{DatumWithOid, TimestampWithTimeZone};
use sql::{execute, execute_many, Plan};
use std::collections::HashMap;

/// Errors of the insert functions.
#[derive(Debug, thiserror::Error)]
pub enum InsertError {
    #[error("{0} must not be NULL")]
    Null(&'static str),
    #[error("{what} is {len} bytes, more than {setting} = {max}")]
    TooLong {
        what: &'static str,
        len: usize,
        max: usize,
        setting: &'static str,
    },
    #[error("array {name} has {len} elements but originator_node_ids has {expected}")]
    ArrayLength {
        name: &'static str,
        len: usize,
        expected: usize,
    },
    #[error("{name}[{index}] must not be NULL")]
    NullElement { name: &'static str, index: usize },
    #[error("{0} must be a finite timestamp")]
    InfiniteTime(String),
    #[error("packed input is malformed: {what} expected at byte {at}")]
    Packed { at: usize, what: &'static str },
    #[error("packed input is not base64: {0}")]
    Base64(String),
    #[error("{0}")]
    Partition(#[from] PartitionError),
    #[error("{0}")]
    Marker(#[from] MarkerError),
    #[error("{0}")]
    Direct(#[from] direct::DirectError),
    #[error("{0}")]
    NotWritable(#[from] crate::pg::xact::NotWritable),
    #[error("SPI error while inserting envelopes: {0}")]
    Spi(#[from] pgrx::spi::SpiError),
}

impl SqlError for InsertError {
    fn sqlstate(&self) -> PgSqlErrorCode {
        use PgSqlErrorCode::*;
        match self {
            InsertError::Null(_) | InsertError::NullElement { .. } => {
                ERRCODE_NULL_VALUE_NOT_ALLOWED
            }
            InsertError::TooLong { .. } => ERRCODE_STRING_DATA_RIGHT_TRUNCATION,
            InsertError::ArrayLength { .. } => ERRCODE_ARRAY_ELEMENT_ERROR,
            InsertError::InfiniteTime(_) => ERRCODE_DATETIME_FIELD_OVERFLOW,
            InsertError::Packed { .. } | InsertError::Base64(_) => {
                ERRCODE_INVALID_BINARY_REPRESENTATION
            }
            InsertError::Partition(e) => e.sqlstate(),
            InsertError::Marker(e) => e.sqlstate(),
            InsertError::Direct(e) => e.sqlstate(),
            InsertError::NotWritable(e) => e.sqlstate(),
            InsertError::Spi(_) => ERRCODE_INTERNAL_ERROR,
        }
    }

    fn hint(&self) -> Option<String> {
        match self {
            InsertError::Partition(e) => e.hint(),
            InsertError::Direct(e) => e.hint(),
            InsertError::NotWritable(e) => e.hint(),
            InsertError::TooLong { setting, .. } => {
                Some(format!("Raise {setting} if such values are legitimate."))
            }
            _ => None,
        }
    }
}

fn check_topic(topic: Option<&[u8]>) -> Result<&[u8], InsertError> {
    let topic = topic.ok_or(InsertError::Null("topic"))?;
    let max = gucs::max_topic_bytes();
    if topic.len() > max {
        return Err(InsertError::TooLong {
            what: "topic",
            len: topic.len(),
            max,
            setting: "envelopes.max_topic_bytes",
        });
    }
    Ok(topic)
}

fn check_envelope(envelope: Option<&[u8]>) -> Result<&[u8], InsertError> {
    let envelope = envelope.ok_or(InsertError::Null("originator_envelope"))?;
    let max = gucs::max_envelope_bytes();
    if envelope.len() > max {
        return Err(InsertError::TooLong {
            what: "originator_envelope",
            len: envelope.len(),
            max,
            setting: "envelopes.max_envelope_bytes",
        });
    }
    Ok(envelope)
}

#[allow(clippy::too_many_arguments)]
pub fn insert_one(
    originator_node_id: Option<i32>,
    originator_sequence_id: Option<i64>,
    topic: Option<&[u8]>,
    originator_envelope: Option<&[u8]>,
    payer_id: Option<i32>,
    gateway_time: Option<TimestampWithTimeZone>,
    expiry: Option<i64>,
) -> Result<i64, InsertError> {
    let node = partition::check_node(originator_node_id)?;
    let seq = partition::check_sequence(originator_sequence_id)?;
    let topic = check_topic(topic)?;
    let envelope = check_envelope(originator_envelope)?;
    check_time(gateway_time, || "gateway_time".to_owned())?;
    let routes = partition::route(node, seq, gucs::band_width())?;
    // Marker first, then the lateness check (see crate::store::feed).
    markers::mark_envelope(node, seq);
    let lateness = late::committed_above(node, seq, seq)?;
    let late = lateness.above.is_some();
    let row = || {
        [(
            routes,
            Flags {
                late,
                fresh: lateness.fresh,
            },
            direct::Row {
                node,
                seq,
                topic,
                envelope,
                payer: payer_id,
                time: gateway_time,
                expiry,
            },
        )]
    };
    if let Some(new) = write_direct(&[routes], late, false, false, None, row)? {
        return Ok(new);
    }
    let mut args = vec![
        DatumWithOid::from(node),
        DatumWithOid::from(seq),
        DatumWithOid::from(topic),
        DatumWithOid::from(envelope),
        DatumWithOid::from(payer_id),
        DatumWithOid::from(gateway_time),
        DatumWithOid::from(expiry),
    ];
    if !late {
        return execute(Plan::One, &args);
    }
    markers::mark_drawn(Drawn::Late)?;
    if late::layout() == late::Layout::Rows {
        return execute(Plan::OneLateRows, &args);
    }
    args.push(DatumWithOid::from(!late::entries(node, &[seq]).is_empty()));
    execute(Plan::OneLate, &args)
}

/// Refuses an infinite `gateway_time`: no reader could turn it into a point in
/// time (the bridge publishes microseconds since the epoch).
pub fn check_time(
    time: Option<TimestampWithTimeZone>,
    name: impl FnOnce() -> String,
) -> Result<(), InsertError> {
    match time {
        Some(t) if !t.is_finite() => Err(InsertError::InfiniteTime(name())),
        _ => Ok(()),
    }
}

/// A batch's columns, element by element as the caller gave them (a NULL element
/// is refused by [`insert_batch`]), all of one length; the optional ones may be
/// absent as a whole.
pub struct Batch<'a> {
    pub nodes: Vec<Option<i32>>,
    pub seqs: Vec<Option<i64>>,
    pub topics: Vec<Option<&'a [u8]>>,
    pub envelopes: Vec<Option<&'a [u8]>>,
    pub payers: Option<Vec<Option<i32>>>,
    pub times: Option<Vec<Option<TimestampWithTimeZone>>>,
    pub expiries: Option<Vec<Option<i64>>>,
}

/// Inserts a batch whose columns have one length (checked by the caller): the
/// body of both batch functions.
///
/// With `new_keys`, the keys of the rows that were new are pushed onto it, in key
/// order (what a caller charges for: a key already stored, or given twice in
/// the batch, is not new).
pub fn insert_batch(
    batch: Batch<'_>,
    mut new_keys: Option<&mut Vec<(i32, i64)>>,
) -> Result<i64, InsertError> {
    let n = batch.nodes.len();
    if n == 0 {
        return Ok(0);
    }

    // Validate everything before touching any partition, so bad input writes nothing.
    let mut keys = Vec::with_capacity(n);
    for (index, (&node, &seq)) in batch.nodes.iter().zip(&batch.seqs).enumerate() {
        let node = node.ok_or(InsertError::NullElement {
            name: "originator_node_ids",
            index: index + 1,
        })?;
        let seq = seq.ok_or(InsertError::NullElement {
            name: "originator_sequence_ids",
            index: index + 1,
        })?;
        let node = partition::check_node(Some(node))?;
        let seq = partition::check_sequence(Some(seq))?;
        keys.push((node, seq));
    }
    let mut topic_values = Vec::with_capacity(n);
    for (index, &topic) in batch.topics.iter().enumerate() {
        if topic.is_none() {
            return Err(InsertError::NullElement {
                name: "topics",
                index: index + 1,
            });
        }
        topic_values.push(check_topic(topic)?);
    }
    let mut envelope_values = Vec::with_capacity(n);
    for (index, &envelope) in batch.envelopes.iter().enumerate() {
        if envelope.is_none() {
            return Err(InsertError::NullElement {
                name: "originator_envelopes",
                index: index + 1,
            });
        }
        envelope_values.push(check_envelope(envelope)?);
    }
    if let Some(times) = &batch.times {
        for (index, &time) in times.iter().enumerate() {
            check_time(time, || format!("gateway_times[{}]", index + 1))?;
        }
    }

    // The rows to write, in key order, each key once (its first occurrence): two
    // batches that overlap take their index locks in the same order and cannot
    // deadlock each other.
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by_key(|&i| (keys[i], i));
    order.dedup_by_key(|i| keys[*i]);
    let distinct: Vec<(i32, i64)> = order.iter().map(|&i| keys[i]).collect();

    let width = gucs::band_width();
    partition::check_new_bands(&distinct, width)?;
    // Consecutive keys mostly share a band: lock each distinct route once. Each
    // key's routes are kept: they stay valid once locked, whatever the cache
    // forgets later in the call.
    let mut locked: Vec<[cache::Route; 2]> = Vec::new();
    let mut key_routes: Vec<[cache::Route; 2]> = Vec::with_capacity(distinct.len());
    for &(node, seq) in &distinct {
        if let Some(routes) = partition::cached_routes(node, seq) {
            if locked.contains(&routes) {
                key_routes.push(routes);
                continue;
            }
        }
        let routes = partition::route(node, seq, width)?;
        locked.push(routes);
        key_routes.push(routes);
    }
    // Per originator: the marker at its lowest sequence id (keys are sorted), then
    // the highest id another transaction has committed above it; the batch's rows
    // below that arrive late.
    let mut found: HashMap<i32, late::Lateness> = HashMap::new();
    for run in distinct.chunk_by(|a, b| a.0 == b.0) {
        let (node, lo, hi) = (run[0].0, run[0].1, run[run.len() - 1].1);
        markers::mark_envelope(node, lo);
        found.insert(node, late::committed_above(node, lo, hi)?);
    }
    let is_late = |(node, seq): (i32, i64)| {
        found
            .get(&node)
            .and_then(|l| l.above)
            .is_some_and(|above| seq < above)
    };
    let is_fresh = |node: i32| found.get(&node).is_some_and(|l| l.fresh);
    let any_late = distinct.iter().any(|&key| is_late(key));

    let payers = &batch.payers;
    let times = &batch.times;
    let expiry_values = &batch.expiries;
    let rows = || {
        order.iter().zip(&key_routes).map(|(&i, routes)| {
            let row = direct::Row {
                node: keys[i].0,
                seq: keys[i].1,
                topic: topic_values[i],
                envelope: envelope_values[i],
                payer: payers.as_ref().and_then(|p| p[i]),
                time: times.as_ref().and_then(|t| t[i]),
                expiry: expiry_values.as_ref().and_then(|e| e[i]),
            };
            let flags = Flags {
                late: is_late(keys[i]),
                fresh: is_fresh(keys[i].0),
            };
            (*routes, flags, row)
        })
    };
    if let Some(new) = write_direct(
        &locked,
        any_late,
        n >= BULK_ROWS,
        true,
        new_keys.as_deref_mut(),
        rows,
    )? {
        return Ok(new);
    }

    let late_flags: Option<Vec<bool>> =
        any_late.then(|| keys.iter().map(|&key| is_late(key)).collect());
    let mut args = vec![
        DatumWithOid::from(batch.nodes),
        DatumWithOid::from(batch.seqs),
        DatumWithOid::from(batch.topics),
        DatumWithOid::from(batch.envelopes),
        DatumWithOid::from(batch.payers),
        DatumWithOid::from(batch.times),
        DatumWithOid::from(batch.expiries),
    ];
    match late_flags {
        Some(flags) => {
            markers::mark_drawn(Drawn::Late)?;
            args.push(DatumWithOid::from(flags));
            if late::layout() == late::Layout::Rows {
                return execute_many(Plan::ManyLateRows, &args, new_keys);
            }
            let late_keys: Vec<(i32, i64)> = distinct
                .iter()
                .copied()
                .filter(|&key| is_late(key))
                .collect();
            let entries = late::entries_of(&late_keys);
            args.push(DatumWithOid::from(
                entries.iter().map(|e| e.node).collect::<Vec<i32>>(),
            ));
            args.push(DatumWithOid::from(
                entries.iter().map(|e| e.first).collect::<Vec<i64>>(),
            ));
            args.push(DatumWithOid::from(
                entries.iter().map(|e| e.last).collect::<Vec<i64>>(),
            ));
            execute_many(Plan::ManyLate, &args, new_keys)
        }
        None => execute_many(Plan::Many, &args, new_keys),
    }
}

/// Batches of at least this many rows write through a bulk-insert buffer strategy
/// (a small ring of buffers, as `COPY` uses, instead of the shared buffer pool).
const BULK_ROWS: usize = 1000;

/// What the lateness check found about one row ([`late::committed_above`]).
#[derive(Clone, Copy)]
struct Flags {
    /// Below a row another transaction has committed: recorded as late.
    late: bool,
    /// Its key cannot exist yet (see [`late::Lateness::fresh`]).
    fresh: bool,
}

/// Writes rows on the direct path: `rows()` gives them in key order, each key once,
/// with their routes (all among `routes`, locked) and their [`Flags`] (`any_late`
/// if one arrives late). Returns how many were new, or `None`, with nothing
/// written, when the tables are not ones the direct path reproduces (the caller
/// then runs the SQL statements). `bulk` asks for a bulk-insert buffer strategy,
/// `buffered` for blob rows through multi-insert buffers (batches).
fn write_direct<'a, R>(
    routes: &[[cache::Route; 2]],
    any_late: bool,
    bulk: bool,
    buffered: bool,
    mut keys: Option<&mut Vec<(i32, i64)>>,
    rows: impl FnOnce() -> R,
) -> Result<Option<i64>, InsertError>
where
    R: IntoIterator<Item = ([cache::Route; 2], Flags, direct::Row<'a>)>,
{
    let Some(mut writer) = direct::Writer::open(routes, bulk)? else {
        return Ok(None);
    };
    if any_late && !writer.open_late()? {
        writer.finish()?; // nothing was written
        return Ok(None);
    }
    if any_late {
        markers::mark_drawn(Drawn::Late)?;
    }
    let mut new = 0i64;
    let mut any_meta = false;
    // The late rows inserted, in key order: recorded as entries below.
    let mut late_rows: Vec<(i32, i64)> = Vec::new();
    for (routes, Flags { late, fresh }, row) in rows() {
        if writer.insert_meta(routes[0].leaf, &row, late, fresh)? {
            any_meta = true;
            if late {
                late_rows.push((row.node, row.seq));
            }
            if writer.insert_blob(
                routes[1].leaf,
                row.node,
                row.seq,
                row.envelope,
                buffered,
                fresh,
            )? {
                new += 1;
                if let Some(keys) = keys.as_deref_mut() {
                    keys.push((row.node, row.seq));
                }
            }
        }
    }
    let entries = match writer.late_layout() {
        Some(late::Layout::Rows) => late_rows
            .iter()
            .map(|&(node, seq)| late::Entry {
                node,
                first: seq,
                last: seq,
            })
            .collect(),
        _ => late::entries_of(&late_rows),
    };
    for entry in entries {
        writer.insert_late(entry)?;
    }
    let rings = writer.rings_doorbell();
    writer.finish()?;
    if any_meta && rings {
        crate::store::outbox::ring_for_envelopes();
    }
    Ok(Some(new))
}

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
#[allow(unsafe_code)] // the tests look at Postgres internals directly
mod tests {
    use crate::testing::{band_names, int8, sqlstate_of};
    use pgrx::pg_sys;
    use pgrx::prelude::*;

    #[pg_test]
    fn a_direct_writer_dropped_without_finish_closes_its_leaves() {
        insert(9, 1);
        let routes = crate::store::partition::route(9, 2, 1_000_000).unwrap();
        let leaf = "envelopes.gateway_envelopes_meta_o9_s0_1000000";
        let alter = format!("ALTER TABLE {leaf} SET (fillfactor = 90)");
        let writer = super::direct::Writer::open(&[routes], false).unwrap();
        assert!(writer.is_some());
        // A table this session has open cannot be altered (55006).
        assert_eq!(sqlstate_of(&alter).as_deref(), Some("55006"));
        // Dropped as when an error returns through `?`: the leaves are closed.
        drop(writer);
        assert_eq!(sqlstate_of(&alter), None);
    }

    fn insert(node: i64, seq: i64) -> i64 {
        int8(&format!(
            "SELECT envelopes.insert_gateway_envelope({node}, {seq}, '\\x0a0b', '\\xdeadbeef')"
        ))
    }

    fn rows() -> (i64, i64) {
        (
            int8("SELECT count(*) FROM envelopes.gateway_envelopes_meta"),
            int8("SELECT count(*) FROM envelopes.gateway_envelopes_blob"),
        )
    }

    #[pg_test]
    fn insert_writes_meta_and_blob_and_creates_partitions() {
        assert_eq!(insert(1, 5), 1);
        assert_eq!(rows(), (1, 1));
        assert_eq!(band_names("meta"), ["gateway_envelopes_meta_o1_s0_1000000"]);
        assert_eq!(band_names("blob"), ["gateway_envelopes_blob_o1_s0_1000000"]);
        let row = Spi::get_three::<i32, Vec<u8>, Vec<u8>>(
            "SELECT originator_node_id, topic, originator_envelope FROM envelopes.gateway_envelopes_view",
        )
        .unwrap();
        assert_eq!(
            row,
            (
                Some(1),
                Some(vec![0x0a, 0x0b]),
                Some(vec![0xde, 0xad, 0xbe, 0xef])
            )
        );
    }

    #[pg_test]
    fn insert_is_idempotent() {
        assert_eq!(insert(1, 5), 1);
        assert_eq!(insert(1, 5), 0);
        assert_eq!(rows(), (1, 1));
    }

    #[pg_test]
    fn optional_columns_are_stored() {
        Spi::run(
            "SELECT envelopes.insert_gateway_envelope(4, 9, '\\x01', '\\x02', payer_id => 42,
                 gateway_time => '2026-01-02 03:04:05+00', expiry => 1767225600)",
        )
        .unwrap();
        let (payer, expiry, at) = Spi::get_three::<i32, i64, String>(
            "SELECT payer_id, expiry, to_char(gateway_time AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS')
               FROM envelopes.gateway_envelopes_meta",
        )
        .unwrap();
        assert_eq!(
            (payer, expiry, at.as_deref()),
            (Some(42), Some(1767225600), Some("2026-01-02 03:04:05"))
        );
    }

    #[pg_test]
    fn crossing_bands_and_originators_creates_each_partition_once() {
        Spi::run("SET LOCAL envelopes.band_width = 10").unwrap();
        let inserted = int8(
            "SELECT sum(envelopes.insert_gateway_envelope(n, s, '\\x01', '\\x02'))::bigint
               FROM generate_series(1, 3) n, generate_series(1, 30) s",
        );
        assert_eq!(inserted, 90);
        // Bands [0,10), [10,20), [20,30) and [30,40) of each originator.
        assert_eq!(band_names("meta").len(), 12);
        assert_eq!(band_names("blob").len(), 12);
        assert_eq!(
            int8("SELECT count(*) FROM envelopes.orphaned_envelopes()"),
            0
        );
    }

    #[pg_test]
    fn bad_single_inserts_have_specific_sqlstates_and_write_nothing() {
        Spi::run("SET LOCAL envelopes.max_topic_bytes = 4").unwrap();
        Spi::run("SET LOCAL envelopes.max_envelope_bytes = 8").unwrap();
        let cases = [
            ("NULL, 1, '\\x01', '\\x02'", "22004"),
            ("1, NULL, '\\x01', '\\x02'", "22004"),
            ("1, 1, NULL, '\\x02'", "22004"),
            ("1, 1, '\\x01', NULL", "22004"),
            ("-1, 1, '\\x01', '\\x02'", "22003"),
            ("1, -1, '\\x01', '\\x02'", "22003"),
            // Sequence ids start at 1: "no cursor entry" means "before 1".
            ("1, 0, '\\x01', '\\x02'", "22003"),
            (
                "1, 1, '\\x01', '\\x02', gateway_time => 'infinity'",
                "22008",
            ),
            (
                "1, 1, '\\x01', '\\x02', gateway_time => '-infinity'",
                "22008",
            ),
            ("1, 1, '\\x0102030405', '\\x02'", "22001"),
            ("1, 1, '\\x01', '\\x010203040506070809'", "22001"),
        ];
        for (args, expected) in cases {
            let sql = format!("SELECT envelopes.insert_gateway_envelope({args})");
            assert_eq!(sqlstate_of(&sql).as_deref(), Some(expected), "{sql}");
        }
        assert_eq!(rows(), (0, 0));
        assert!(
            band_names("meta").is_empty(),
            "bad input must not create partitions"
        );
    }

    #[pg_test]
    fn batch_inserts_count_new_rows_only() {
        assert_eq!(insert(1, 2), 1);
        let inserted = int8(
            "SELECT envelopes.insert_gateway_envelopes(
                 ARRAY[1, 1, 1, 2, 2], ARRAY[1, 2, 3, 1, 1]::bigint[],
                 ARRAY['\\x01', '\\x02', '\\x03', '\\x04', '\\x05']::bytea[],
                 ARRAY['\\xa1', '\\xa2', '\\xa3', '\\xa4', '\\xa5']::bytea[])",
        );
        // (1,2) existed and (2,1) appears twice: 3 new rows.
        assert_eq!(inserted, 3);
        assert_eq!(rows(), (4, 4));
        // The first occurrence of a duplicate wins.
        let blob = Spi::get_one::<Vec<u8>>(
            "SELECT originator_envelope FROM envelopes.gateway_envelopes_blob
              WHERE originator_node_id = 2 AND originator_sequence_id = 1",
        )
        .unwrap();
        assert_eq!(blob, Some(vec![0xa4]));
    }

    #[pg_test]
    fn batch_optional_arrays_apply_per_element() {
        Spi::run(
            "SELECT envelopes.insert_gateway_envelopes(
                 ARRAY[5, 5], ARRAY[1, 2]::bigint[], ARRAY['\\x01', '\\x02']::bytea[],
                 ARRAY['\\xa1', '\\xa2']::bytea[], payer_ids => ARRAY[7, NULL],
                 expiries => ARRAY[NULL, 99]::bigint[])",
        )
        .unwrap();
        assert_eq!(int8("SELECT count(*) FROM envelopes.gateway_envelopes_meta WHERE payer_id = 7 AND expiry IS NULL AND originator_sequence_id = 1"), 1);
        assert_eq!(int8("SELECT count(*) FROM envelopes.gateway_envelopes_meta WHERE payer_id IS NULL AND expiry = 99 AND originator_sequence_id = 2"), 1);
    }

    #[pg_test]
    fn empty_batch_inserts_nothing() {
        assert_eq!(
            int8("SELECT envelopes.insert_gateway_envelopes('{}', '{}', '{}', '{}')"),
            0
        );
    }

    #[pg_test]
    fn bad_batches_have_specific_sqlstates_and_write_nothing() {
        let cases = [
            ("ARRAY[1,2], ARRAY[1]::bigint[], ARRAY['\\x01','\\x01']::bytea[], ARRAY['\\x01','\\x01']::bytea[]", "2202E"),
            ("ARRAY[1], ARRAY[1]::bigint[], ARRAY['\\x01']::bytea[], ARRAY['\\x01']::bytea[], payer_ids => ARRAY[1,2]", "2202E"),
            ("NULL, ARRAY[1]::bigint[], ARRAY['\\x01']::bytea[], ARRAY['\\x01']::bytea[]", "22004"),
            ("ARRAY[1,NULL], ARRAY[1,2]::bigint[], ARRAY['\\x01','\\x01']::bytea[], ARRAY['\\x01','\\x01']::bytea[]", "22004"),
            ("ARRAY[1,1], ARRAY[1,2]::bigint[], ARRAY['\\x01',NULL]::bytea[], ARRAY['\\x01','\\x01']::bytea[]", "22004"),
            ("ARRAY[1,1], ARRAY[1,2]::bigint[], ARRAY['\\x01','\\x01']::bytea[], ARRAY[NULL,'\\x01']::bytea[]", "22004"),
            ("ARRAY[1,1], ARRAY[1,-2]::bigint[], ARRAY['\\x01','\\x01']::bytea[], ARRAY['\\x01','\\x01']::bytea[]", "22003"),
            ("ARRAY[1,-1], ARRAY[1,2]::bigint[], ARRAY['\\x01','\\x01']::bytea[], ARRAY['\\x01','\\x01']::bytea[]", "22003"),
            ("ARRAY[1,1], ARRAY[1,0]::bigint[], ARRAY['\\x01','\\x01']::bytea[], ARRAY['\\x01','\\x01']::bytea[]", "22003"),
            ("ARRAY[1,1], ARRAY[1,2]::bigint[], ARRAY['\\x01','\\x01']::bytea[], ARRAY['\\x01','\\x01']::bytea[], gateway_times => ARRAY[now(), 'infinity']", "22008"),
        ];
        for (args, expected) in cases {
            let sql = format!("SELECT envelopes.insert_gateway_envelopes({args})");
            assert_eq!(sqlstate_of(&sql).as_deref(), Some(expected), "{sql}");
        }
        assert_eq!(rows(), (0, 0));
        assert!(band_names("meta").is_empty());
    }

    #[pg_test]
    fn rolled_back_insert_leaves_neither_meta_nor_blob() {
        // The exception block is a subtransaction: everything it did is undone.
        Spi::run(
            "DO $$ BEGIN
                 PERFORM envelopes.insert_gateway_envelope(1, 1, '\\x01', '\\x02');
                 PERFORM envelopes.insert_gateway_envelopes(ARRAY[2], ARRAY[1]::bigint[],
                     ARRAY['\\x01']::bytea[], ARRAY['\\x02']::bytea[]);
                 RAISE EXCEPTION 'undo';
             EXCEPTION WHEN raise_exception THEN NULL; END $$",
        )
        .unwrap();
        assert_eq!(rows(), (0, 0));
        // The partitions created and rolled back are gone from the cache too.
        assert_eq!(insert(1, 1), 1);
        assert_eq!(rows(), (1, 1));
    }

    /// Subtransaction ids this backend's transaction holds (PGPROC's subxid cache),
    /// and whether that cache overflowed. Exact and per backend, unlike the global
    /// xid counter, which the tests running in parallel also advance.
    fn subxids() -> (u8, bool) {
        // SAFETY: MyProc is this backend's own PGPROC, valid for the backend's life;
        // only this backend writes its subxid status.
        let status = unsafe { (*pg_sys::MyProc).subxidStatus };
        (status.count, status.overflowed)
    }

    #[pg_test]
    fn hot_inserts_open_no_subtransactions() {
        assert_eq!(insert(1, 1), 1); // creates the partitions and assigns our xid
        let inserted = int8(
            "SELECT sum(envelopes.insert_gateway_envelope(1, s, '\\x01', '\\x02'))::bigint
               FROM generate_series(2, 201) s",
        );
        assert_eq!(inserted, 200);
        assert_eq!(subxids(), (0, false), "hot inserts opened subtransactions");

        // The check has teeth: the same inserts, each in a subtransaction, show up.
        Spi::run(
            "DO $$ BEGIN FOR s IN 202..211 LOOP
                 BEGIN PERFORM envelopes.insert_gateway_envelope(1, s, '\\x01', '\\x02');
                 EXCEPTION WHEN OTHERS THEN NULL; END;
             END LOOP; END $$",
        )
        .unwrap();
        assert_eq!(subxids(), (10, false));
    }

    fn catalog_scans() -> i64 {
        int8(
            "SELECT COALESCE(sum(seq_scan + COALESCE(idx_scan, 0)), 0)::bigint
               FROM pg_catalog.pg_stat_xact_sys_tables",
        )
    }

    /// Catalog scans caused by one statement inserting `count` rows from `first` on.
    fn scans_for_inserts(first: i64, count: i64) -> i64 {
        let before = catalog_scans();
        let inserted = int8(&format!(
            "SELECT sum(envelopes.insert_gateway_envelope(1, s, '\\x01', '\\x02'))::bigint
               FROM generate_series({first}, {last}) s",
            last = first + count - 1
        ));
        assert_eq!(inserted, count);
        catalog_scans() - before
    }

    #[pg_test]
    fn hot_inserts_do_not_query_the_catalog() {
        assert_eq!(insert(1, 1), 1); // creates the partitions
        scans_for_inserts(2, 1); // warms the caches used by the statement itself
        let one = scans_for_inserts(3, 1);
        let many = scans_for_inserts(4, 200);
        // Whatever one statement costs to plan and measure, 200 rows cost no more.
        assert_eq!(many, one, "catalog scans grew with the number of rows");

        // A new band does read the catalog: the counter sees it.
        let crossing = scans_for_inserts(999_999, 2);
        assert!(
            crossing > one,
            "band creation must show up ({crossing} vs {one})"
        );
    }

    /// Executor runs started while `sql` runs, the statement itself included: every
    /// SPI statement a function runs is one more (ExecutorStart, counted by a hook
    /// installed for the duration).
    fn executor_starts(sql: &str) -> u64 {
        use std::sync::atomic::{AtomicU64, Ordering};
        static STARTS: AtomicU64 = AtomicU64::new(0);
        static mut PREVIOUS: pg_sys::ExecutorStart_hook_type = None;

        #[pg_guard]
        unsafe extern "C-unwind" fn count(desc: *mut pg_sys::QueryDesc, flags: i32) {
            STARTS.fetch_add(1, Ordering::Relaxed);
            // SAFETY: PREVIOUS is only written by the test below, on this thread,
            // while the hook is not being called.
            match unsafe { PREVIOUS } {
                // SAFETY: chaining to the hook that was installed before ours.
                Some(previous) => unsafe { previous(desc, flags) },
                // SAFETY: the executor's own start routine, as without a hook.
                None => unsafe { pg_sys::standard_ExecutorStart(desc, flags) },
            }
        }

        // SAFETY: the backend is single-threaded; the hook is installed and removed
        // around one statement, restoring whatever was there.
        unsafe {
            PREVIOUS = pg_sys::ExecutorStart_hook;
            pg_sys::ExecutorStart_hook = Some(count);
        }
        STARTS.store(0, Ordering::Relaxed);
        let result = Spi::run(sql);
        // SAFETY: as above.
        unsafe { pg_sys::ExecutorStart_hook = PREVIOUS };
        result.unwrap();
        STARTS.load(Ordering::Relaxed)
    }

    #[pg_test]
    fn hot_inserts_run_no_sql_statement() {
        assert_eq!(insert(1, 1), 1); // creates the partitions
        assert_eq!(insert(1, 2), 1);
        // One executor run: the statement itself. None per row, single or batch.
        assert_eq!(
            executor_starts(
                "SELECT envelopes.insert_gateway_envelope(1, s, '\\x01', '\\x02')
                   FROM generate_series(3, 202) s"
            ),
            1
        );
        assert_eq!(
            executor_starts(
                "SELECT envelopes.insert_gateway_envelopes(array_agg(1), array_agg(s::bigint),
                        array_agg('\\x01'::bytea), array_agg('\\x02'::bytea))
                   FROM generate_series(203, 402) s"
            ),
            1
        );
        assert_eq!(rows(), (402, 402));

        // The count has teeth: statements a function runs through SPI are counted
        // (two PERFORMs in a DO block). Tables changed by hand, which send rows
        // through the SQL statements, are in tests/tests/direct.rs: DDL on the
        // shared tables would deadlock with the tests running beside this one.
        assert_eq!(
            executor_starts("DO $$ BEGIN PERFORM 1; PERFORM 2; END $$"),
            2
        );
    }

    #[pg_test]
    fn batches_with_existing_and_repeated_keys_across_bands_and_originators() {
        Spi::run("SET LOCAL envelopes.band_width = 10").unwrap();
        // Existing keys in two originators and two bands.
        assert_eq!(insert(1, 5), 1);
        assert_eq!(insert(2, 15), 1);
        let inserted = int8(
            "SELECT envelopes.insert_gateway_envelopes(
                 ARRAY[2, 1, 1, 3, 2, 1, 3, 1, 2],
                 ARRAY[15, 5, 25, 9, 16, 25, 9, 6, 31]::bigint[],
                 ARRAY['\\x01', '\\x02', '\\x03', '\\x04', '\\x05', '\\x06', '\\x07', '\\x08', '\\x09']::bytea[],
                 ARRAY['\\xa1', '\\xa2', '\\xa3', '\\xa4', '\\xa5', '\\xa6', '\\xa7', '\\xa8', '\\xa9']::bytea[],
                 payer_ids => ARRAY[1, 2, 3, 4, 5, 6, 7, 8, 9])",
        );
        // New: (1,25) (3,9) (2,16) (1,6) (2,31); (2,15) and (1,5) existed; (1,25) and
        // (3,9) repeat, their first occurrence wins.
        assert_eq!(inserted, 5);
        assert_eq!(rows(), (7, 7));
        let firsts = Spi::get_one::<String>(
            "SELECT string_agg(format('%s/%s:%s:%s:%s', m.originator_node_id, m.originator_sequence_id,
                                      m.payer_id, m.topic, b.originator_envelope), ' '
                               ORDER BY m.originator_node_id, m.originator_sequence_id)
               FROM envelopes.gateway_envelopes_meta m
               JOIN envelopes.gateway_envelopes_blob b USING (originator_node_id, originator_sequence_id)
              WHERE m.payer_id IS NOT NULL",
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            firsts,
            "1/6:8:\\x08:\\xa8 1/25:3:\\x03:\\xa3 2/16:5:\\x05:\\xa5 2/31:9:\\x09:\\xa9 3/9:4:\\x04:\\xa4"
        );
        // Each row is in its band's leaf (the view joins them all back).
        assert_eq!(band_names("meta").len(), 5);
        assert_eq!(
            int8("SELECT count(*) FROM envelopes.gateway_envelopes_view"),
            7
        );
    }

    #[pg_test]
    fn large_batches_write_every_row_once() {
        // More rows than one multi-insert buffer holds, several leaves, a repeat of
        // every tenth key and envelopes large enough to be toasted.
        Spi::run("SET LOCAL envelopes.band_width = 1000").unwrap();
        let inserted = int8(
            "SELECT envelopes.insert_gateway_envelopes(array_agg(1 + s % 3), array_agg((s / 3 + 1)::bigint),
                    array_agg(pg_catalog.int4send(s)),
                    array_agg(CASE WHEN s % 500 = 0 THEN pg_catalog.convert_to(repeat(md5(s::text), 300), 'UTF8')
                                   ELSE pg_catalog.int8send(s::bigint) END))
               FROM (SELECT s FROM generate_series(0, 5999) s
                     UNION ALL SELECT s FROM generate_series(0, 5999, 10) s) g",
        );
        assert_eq!(inserted, 6000);
        assert_eq!(rows(), (6000, 6000));
        assert_eq!(
            int8(
                "SELECT count(*) FROM envelopes.gateway_envelopes_view
                  WHERE topic = pg_catalog.int4send(((originator_sequence_id - 1) * 3 + originator_node_id - 1)::int)"
            ),
            6000
        );
        assert_eq!(
            int8("SELECT count(*) FROM envelopes.gateway_envelopes_blob WHERE length(originator_envelope) > 9000"),
            12
        );
        assert_eq!(
            int8("SELECT count(*) FROM envelopes.orphaned_envelopes()"),
            0
        );
    }
}
