//! The read shapes of an xmtpd node, served natively: per-topic cursors, a
//! catch-up wave, the newest envelope of each topic, one originator from a
//! position, and the highest sequence id of given originators.
//!
//! Every shape reads the band leaves directly ([`crate::store::read`]): one
//! originator's rows through its meta leaves' primary key merged with a range
//! scan of the blob leaves, a topic's rows through each meta leaf's
//! `(topic, originator_sequence_id)` index, one scan per cursor entry merged by
//! sequence id. No SQL runs, so there is no plan to cache (or to turn generic),
//! and nothing to pin `search_path` for: reading the leaves directly checks no
//! privilege on the tables, so `EXECUTE` (granted by `grant_reader`) is the
//! only one a reader needs. The shapes with a cursor are `SECURITY DEFINER`
//! (without a `SET` clause, like the insert functions) because their commit-safe
//! form samples the feed's sequences, which only the owner may read.
//!
//! The SQL definitions are in `sql/reads.sql`; the functions return their rows
//! in one call (materialize mode, `crate::pg::srf`).
//!
//! The shapes with a cursor take `commit_safe`: when true, each originator is
//! read no further than its ceiling (`originator_ceilings()`), with a snapshot
//! taken after the ceiling was established, so a caller that moves its cursor
//! to the last row returned never skips a lower sequence id that commits later.

use crate::error::{PgSqlErrorCode, SqlError};
use crate::pg::scan::Reading;
use crate::pg::srf::{arg, materialized_srf, Materialized};
use crate::store::feed::markers::MarkerError;
use crate::store::feed::Gate;
use crate::store::partition::PartitionError;
use crate::store::read::results::EnvelopeResults;
use crate::store::read::select::{self, elements, statement_snapshot, SelectError};
use crate::store::read::{self, TopicEntry};
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// Errors of the read shapes.
#[derive(Debug, thiserror::Error)]
pub enum ShapeError {
    #[error("{0} must not be NULL")]
    Null(&'static str),
    #[error("{first} has {first_len} elements but {second} has {second_len}")]
    Length {
        first: &'static str,
        first_len: usize,
        second: &'static str,
        second_len: usize,
    },
    #[error("the cursor names topic {topic} of originator {node} more than once")]
    DuplicateEntry { topic: String, node: i32 },
    #[error("originator {0} has more than one ceiling")]
    DuplicateCeiling(i32),
    #[error("after_node_id and after_sequence_id must be both NULL or both given")]
    HalfPosition,
    #[error("{0}")]
    Select(#[from] SelectError),
    #[error("{0}")]
    Marker(#[from] MarkerError),
    #[error("{0}")]
    Partition(#[from] PartitionError),
}

impl SqlError for ShapeError {
    fn sqlstate(&self) -> PgSqlErrorCode {
        use PgSqlErrorCode::*;
        match self {
            ShapeError::Null(_) | ShapeError::HalfPosition => ERRCODE_NULL_VALUE_NOT_ALLOWED,
            ShapeError::Length { .. } => ERRCODE_ARRAY_ELEMENT_ERROR,
            ShapeError::DuplicateEntry { .. } | ShapeError::DuplicateCeiling(_) => {
                ERRCODE_INVALID_PARAMETER_VALUE
            }
            ShapeError::Select(e) => e.sqlstate(),
            ShapeError::Marker(e) => e.sqlstate(),
            ShapeError::Partition(e) => e.sqlstate(),
        }
    }

    fn hint(&self) -> Option<String> {
        match self {
            ShapeError::Marker(e) => e.hint(),
            ShapeError::Partition(e) => e.hint(),
            _ => None,
        }
    }
}

/// A required array whose elements must not be NULL.
fn required<T>(name: &'static str, array: Option<Array<'_, T>>) -> Result<Vec<T>, ShapeError>
where
    for<'a> T: Copy + FromDatum + pgrx::datum::UnboxDatum<As<'a> = T> + 'static,
{
    elements(name, array)?.ok_or(ShapeError::Null(name))
}

/// A required `bytea[]` whose elements must not be NULL, copied out.
fn topics_of(
    name: &'static str,
    array: Option<Array<'_, &[u8]>>,
) -> Result<Vec<Vec<u8>>, ShapeError> {
    select::bytea_elements(name, array)?.ok_or(ShapeError::Null(name))
}

fn same_length(
    first: &'static str,
    first_len: usize,
    second: &'static str,
    second_len: usize,
) -> Result<(), ShapeError> {
    if first_len == second_len {
        Ok(())
    } else {
        Err(ShapeError::Length {
            first,
            first_len,
            second,
            second_len,
        })
    }
}

/// How far, and with which snapshot, each originator is read.
enum Horizon {
    /// The calling statement's snapshot, no bound.
    Statement(pg_sys::Snapshot),
    /// Up to the originator's ceiling, with the snapshot taken after it.
    CommitSafe(Box<Gate>),
}

impl Horizon {
    /// Opens the gate for a commit-safe read (call it once the read is known
    /// to return rows).
    fn new(commit_safe: bool) -> Result<Horizon, ShapeError> {
        Ok(if commit_safe {
            Horizon::CommitSafe(Box::new(Gate::open()?))
        } else {
            Horizon::Statement(statement_snapshot()?)
        })
    }

    /// The highest sequence id of `node` to read (`None`: nothing to read).
    fn upto(&self, node: i32) -> Result<Option<i64>, ShapeError> {
        match self {
            Horizon::Statement(_) => Ok(Some(i64::MAX)),
            Horizon::CommitSafe(gate) => Ok(gate.envelope_ceiling(node)?),
        }
    }

    fn snapshot(&self) -> pg_sys::Snapshot {
        match self {
            Horizon::Statement(snapshot) => *snapshot,
            Horizon::CommitSafe(gate) => gate.rows(),
        }
    }
}

/// Per originator (ascending), its cursor entries: topic -> last sequence id seen.
type Entries = BTreeMap<i32, Vec<(Vec<u8>, i64)>>;

/// The cursor entries of the parallel arrays, grouped by originator; a repeated
/// (topic, originator) pair is an error.
fn cursor_entries(
    cursor_topics: Option<Array<'_, &[u8]>>,
    cursor_node_ids: Option<Array<'_, i32>>,
    cursor_sequence_ids: Option<Array<'_, i64>>,
) -> Result<Entries, ShapeError> {
    let topics = topics_of("cursor_topics", cursor_topics)?;
    let nodes = required("cursor_node_ids", cursor_node_ids)?;
    let seqs = required("cursor_sequence_ids", cursor_sequence_ids)?;
    same_length(
        "cursor_topics",
        topics.len(),
        "cursor_node_ids",
        nodes.len(),
    )?;
    same_length(
        "cursor_topics",
        topics.len(),
        "cursor_sequence_ids",
        seqs.len(),
    )?;
    let mut seen = BTreeSet::new();
    let mut entries = Entries::new();
    for ((topic, node), seq) in topics.into_iter().zip(nodes).zip(seqs) {
        if !seen.insert((node, topic.clone())) {
            return Err(ShapeError::DuplicateEntry {
                topic: hex(&topic),
                node,
            });
        }
        entries.entry(node).or_default().push((topic, seq));
    }
    Ok(entries)
}

fn hex(bytes: &[u8]) -> String {
    let mut out = String::from("\\x");
    for b in bytes {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

/// Reads the rows of `node`'s `entries` into `out`, until it holds `limit`.
#[allow(clippy::too_many_arguments)]
fn read_entries(
    node: i32,
    entries: &[(Vec<u8>, i64)],
    floor: i64,
    per_entry: usize,
    upto: i64,
    snapshot: pg_sys::Snapshot,
    limit: usize,
    out: &mut Materialized,
) -> Result<(), ShapeError> {
    let mut entries: Vec<TopicEntry> = entries
        .iter()
        .map(|(topic, after)| TopicEntry {
            topic: topic.clone(),
            after: (*after).max(floor),
            limit: per_entry,
        })
        .collect();
    read::walk_topics(
        node,
        &mut entries,
        upto,
        Reading::kept(snapshot),
        |mut at| out.take(&mut at, limit),
    )?;
    Ok(())
}

fn by_topic_cursors(
    cursor_topics: Option<Array<'_, &[u8]>>,
    cursor_node_ids: Option<Array<'_, i32>>,
    cursor_sequence_ids: Option<Array<'_, i64>>,
    rows_per_entry: Option<i32>,
    row_limit: Option<i32>,
    commit_safe: Option<bool>,
    out: &mut Materialized,
) -> Result<(), ShapeError> {
    let entries = cursor_entries(cursor_topics, cursor_node_ids, cursor_sequence_ids)?;
    let per_entry = select::limit("rows_per_entry", rows_per_entry)?;
    let limit = select::limit("row_limit", row_limit)?;
    let commit_safe = commit_safe.ok_or(ShapeError::Null("commit_safe"))?;
    if per_entry == 0 || limit == 0 {
        return Ok(());
    }
    let horizon = Horizon::new(commit_safe)?;
    for (node, entries) in &entries {
        if out.len >= limit {
            break;
        }
        let Some(upto) = horizon.upto(*node)? else {
            continue;
        };
        read_entries(
            *node,
            entries,
            i64::MIN,
            per_entry,
            upto,
            horizon.snapshot(),
            limit,
            out,
        )?;
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn wave(
    cursor_topics: Option<Array<'_, &[u8]>>,
    cursor_node_ids: Option<Array<'_, i32>>,
    cursor_sequence_ids: Option<Array<'_, i64>>,
    ceiling_node_ids: Option<Array<'_, i32>>,
    ceiling_sequence_ids: Option<Array<'_, i64>>,
    after_node_id: Option<i32>,
    after_sequence_id: Option<i64>,
    row_limit: Option<i32>,
    commit_safe: Option<bool>,
    out: &mut Materialized,
) -> Result<(), ShapeError> {
    let entries = cursor_entries(cursor_topics, cursor_node_ids, cursor_sequence_ids)?;
    let ceiling_nodes = required("ceiling_node_ids", ceiling_node_ids)?;
    let ceiling_seqs = required("ceiling_sequence_ids", ceiling_sequence_ids)?;
    same_length(
        "ceiling_node_ids",
        ceiling_nodes.len(),
        "ceiling_sequence_ids",
        ceiling_seqs.len(),
    )?;
    let mut ceilings = HashMap::with_capacity(ceiling_nodes.len());
    for (node, seq) in ceiling_nodes.into_iter().zip(ceiling_seqs) {
        if ceilings.insert(node, seq).is_some() {
            return Err(ShapeError::DuplicateCeiling(node));
        }
    }
    let position = match (after_node_id, after_sequence_id) {
        (None, None) => None,
        (Some(node), Some(seq)) => Some((node, seq)),
        _ => return Err(ShapeError::HalfPosition),
    };
    let limit = select::limit("row_limit", row_limit)?;
    let commit_safe = commit_safe.ok_or(ShapeError::Null("commit_safe"))?;
    if limit == 0 {
        return Ok(());
    }
    let horizon = Horizon::new(commit_safe)?;
    for (node, entries) in &entries {
        if out.len >= limit {
            break;
        }
        let floor = match position {
            Some((at, _)) if *node < at => continue,
            Some((at, seq)) if *node == at => seq,
            _ => i64::MIN,
        };
        let Some(ceiling) = ceilings.get(node) else {
            continue; // an originator without a ceiling is not part of the wave
        };
        let Some(upto) = horizon.upto(*node)? else {
            continue;
        };
        read_entries(
            *node,
            entries,
            floor,
            usize::MAX,
            upto.min(*ceiling),
            horizon.snapshot(),
            limit,
            out,
        )?;
    }
    Ok(())
}

fn newest_by_topic(
    topics: Option<Array<'_, &[u8]>>,
    out: &mut Materialized,
) -> Result<(), ShapeError> {
    let topics: BTreeSet<Vec<u8>> = topics_of("topics", topics)?.into_iter().collect();
    let snapshot = statement_snapshot()?;
    let originators = crate::store::partition::originators()?;
    for topic in topics {
        let mut newest: Option<read::EnvelopeRow> = None;
        for node in &originators {
            let Some(row) = read::newest_with_topic(*node, &topic, Reading::kept(snapshot))? else {
                continue;
            };
            // The latest gateway time wins; on a tie, the higher originator.
            if newest
                .as_ref()
                .is_none_or(|best| (row.gateway_time, row.node) > (best.gateway_time, best.node))
            {
                newest = Some(row);
            }
        }
        if let Some(row) = newest {
            out.put_envelope(crate::store::read::results::as_row(row));
        }
    }
    Ok(())
}

fn originator(
    originator_node_id: Option<i32>,
    after_sequence_id: Option<i64>,
    row_limit: Option<i32>,
    commit_safe: Option<bool>,
    out: &mut Materialized,
) -> Result<(), ShapeError> {
    let node = originator_node_id.ok_or(ShapeError::Null("originator_node_id"))?;
    let after = after_sequence_id.ok_or(ShapeError::Null("after_sequence_id"))?;
    let limit = select::limit("row_limit", row_limit)?;
    let commit_safe = commit_safe.ok_or(ShapeError::Null("commit_safe"))?;
    if limit == 0 {
        return Ok(());
    }
    let horizon = Horizon::new(commit_safe)?;
    if let Some(upto) = horizon.upto(node)? {
        select::read_originator(node, after, upto, None, limit, horizon.snapshot(), out)?;
    }
    Ok(())
}

fn maxima(
    originator_node_ids: Option<Array<'_, i32>>,
    out: &mut Materialized,
) -> Result<(), ShapeError> {
    let nodes: BTreeSet<i32> = required("originator_node_ids", originator_node_ids)?
        .into_iter()
        .collect();
    let snapshot = statement_snapshot()?;
    for node in nodes {
        let max = read::highest_above(node, i64::MIN, Reading::kept(snapshot), |_| true)?;
        out.put_pair((node, max.unwrap_or(0)));
    }
    Ok(())
}

// The SQL functions (sql/reads.sql) over the bodies above, in materialize mode
// (crate::pg::srf).

materialized_srf!(
    select_by_topic_cursors_wrapper,
    pg_finfo_select_by_topic_cursors_wrapper,
    // SAFETY: sql/reads.sql declares the six arguments with these types.
    |fcinfo, out| unsafe {
        by_topic_cursors(
            arg(fcinfo, 0),
            arg(fcinfo, 1),
            arg(fcinfo, 2),
            arg(fcinfo, 3),
            arg(fcinfo, 4),
            arg(fcinfo, 5),
            out,
        )
    }
);

materialized_srf!(
    select_wave_wrapper,
    pg_finfo_select_wave_wrapper,
    // SAFETY: sql/reads.sql declares the nine arguments with these types.
    |fcinfo, out| unsafe {
        wave(
            arg(fcinfo, 0),
            arg(fcinfo, 1),
            arg(fcinfo, 2),
            arg(fcinfo, 3),
            arg(fcinfo, 4),
            arg(fcinfo, 5),
            arg(fcinfo, 6),
            arg(fcinfo, 7),
            arg(fcinfo, 8),
            out,
        )
    }
);

materialized_srf!(
    select_newest_by_topic_wrapper,
    pg_finfo_select_newest_by_topic_wrapper,
    // SAFETY: sql/reads.sql declares one bytea[] argument.
    |fcinfo, out| unsafe { newest_by_topic(arg(fcinfo, 0), out) }
);

materialized_srf!(
    select_originator_wrapper,
    pg_finfo_select_originator_wrapper,
    // SAFETY: sql/reads.sql declares the four arguments with these types.
    |fcinfo, out| unsafe {
        originator(
            arg(fcinfo, 0),
            arg(fcinfo, 1),
            arg(fcinfo, 2),
            arg(fcinfo, 3),
            out,
        )
    }
);

materialized_srf!(
    originator_maxima_wrapper,
    pg_finfo_originator_maxima_wrapper,
    // SAFETY: sql/reads.sql declares one int[] argument.
    |fcinfo, out| unsafe { maxima(arg(fcinfo, 0), out) }
);
