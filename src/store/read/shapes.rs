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
use crate::pg::srf::Materialized;
use crate::store::feed::markers::MarkerError;
use crate::store::feed::Gate;
use crate::store::partition::PartitionError;
use crate::store::read::results::EnvelopeResults;
use crate::store::read::select::{self, statement_snapshot, SelectError};
use crate::store::read::{self, TopicEntry};
use pgrx::datum::TimestampWithTimeZone;
use pgrx::pg_sys;
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

/// Per originator (ascending), its cursor entries: topic -> last sequence id seen.
pub type Entries = BTreeMap<i32, Vec<(Vec<u8>, i64)>>;

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
    fn new(commit_safe: bool, nodes: &[i32]) -> Result<Horizon, ShapeError> {
        Ok(if commit_safe {
            Horizon::CommitSafe(Box::new(Gate::open(nodes)?))
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

/// `select_by_topic_cursors`: per cursor entry, up to `per_entry` rows of its
/// topic after its position, originator by originator, until `out` holds `limit`.
pub fn by_topic_cursors(
    entries: &Entries,
    per_entry: usize,
    limit: usize,
    commit_safe: bool,
    out: &mut Materialized,
) -> Result<(), ShapeError> {
    if per_entry == 0 || limit == 0 {
        return Ok(());
    }
    let nodes: Vec<i32> = entries.keys().copied().collect();
    let horizon = Horizon::new(commit_safe, &nodes)?;
    for (node, entries) in entries {
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

/// `select_wave`: the cursor entries' rows up to each originator's ceiling (an
/// originator without one is not part of the wave), from `position` on (the
/// keyset of the last row of the previous page), until `out` holds `limit`.
pub fn wave(
    entries: &Entries,
    ceilings: &HashMap<i32, i64>,
    position: Option<(i32, i64)>,
    limit: usize,
    commit_safe: bool,
    out: &mut Materialized,
) -> Result<(), ShapeError> {
    if limit == 0 {
        return Ok(());
    }
    let nodes: Vec<i32> = entries.keys().copied().collect();
    let horizon = Horizon::new(commit_safe, &nodes)?;
    for (node, entries) in entries {
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

/// `select_newest_by_topic`: per topic, its envelope with the latest
/// `gateway_time`, as xmtpd's `SelectNewestFromTopics` orders them (`DISTINCT
/// ON (topic) ... ORDER BY topic, gateway_time DESC`). xmtpd leaves a tie to
/// the plan; here it goes to the higher originator, then the higher sequence id.
pub fn newest_by_topic(
    topics: BTreeSet<Vec<u8>>,
    out: &mut Materialized,
) -> Result<(), ShapeError> {
    let snapshot = statement_snapshot()?;
    let originators = crate::store::partition::originators()?;
    for topic in topics {
        let mut newest: Option<read::EnvelopeRow> = None;
        for node in &originators {
            let Some(row) = read::latest_with_topic(*node, &topic, Reading::kept(snapshot))? else {
                continue;
            };
            let key = |r: &read::EnvelopeRow| (r.gateway_time, r.node, r.seq);
            if newest.as_ref().is_none_or(|best| key(&row) > key(best)) {
                newest = Some(row);
            }
        }
        if let Some(row) = newest {
            out.put_envelope(crate::store::read::results::as_row(row));
        }
    }
    Ok(())
}

/// `select_originator`: one originator's rows after `after`, until `out` holds
/// `limit`.
pub fn originator(
    node: i32,
    after: i64,
    limit: usize,
    commit_safe: bool,
    out: &mut Materialized,
) -> Result<(), ShapeError> {
    if limit == 0 {
        return Ok(());
    }
    let horizon = Horizon::new(commit_safe, &[node])?;
    if let Some(upto) = horizon.upto(node)? {
        select::read_originator(node, after, upto, None, limit, horizon.snapshot(), out)?;
    }
    Ok(())
}

/// `originator_maxima`: each originator's highest sequence id (0 when it has no
/// row).
pub fn maxima(nodes: BTreeSet<i32>, out: &mut Materialized) -> Result<(), ShapeError> {
    let snapshot = statement_snapshot()?;
    for node in nodes {
        let max = read::highest_above(node, i64::MIN, Reading::kept(snapshot), |_| true)?;
        out.put_pair((node, max.unwrap_or(0)));
    }
    Ok(())
}

/// Every originator's stored row with the highest sequence id: `(originator,
/// sequence id, gateway time)`, ascending by originator.
pub fn stored_maxima() -> Result<Vec<(i32, i64, TimestampWithTimeZone)>, ShapeError> {
    let snapshot = statement_snapshot()?;
    let mut rows = Vec::new();
    for node in crate::store::partition::originators()? {
        if let Some((seq, time)) = read::highest_meta(node, Reading::kept(snapshot))? {
            rows.push((node, seq, time));
        }
    }
    Ok(rows)
}
