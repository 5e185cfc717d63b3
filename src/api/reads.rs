//! The read functions: `select_gateway_envelopes`, xmtpd's read shapes and
//! `envelope_of`, each declared here once (its SQL definition beside the Rust
//! that reads its arguments by position), its arguments checked
//! ([`super::args`]), its rows read by [`crate::store::read`].
//!
//! They return their whole result in one call (materialize mode, see
//! [`crate::pg::srf`]), which pgrx's generated definitions cannot express. None
//! runs SQL: they scan the band leaves' indexes directly, with the calling
//! statement's snapshot (or, with `commit_safe`, one taken after the ceilings).
//! Those with a commit-safe form are `SECURITY DEFINER`, without a `SET` clause,
//! because that form samples the change feed's sequences (see
//! `sql/roles.sql`).

use super::args::{
    bytea_elements, cursor_entries, cursor_map, elements, limit, required, same_length, topics_of,
};
use crate::error::OrRaise;
use crate::pg::srf::materialized_srf;
use crate::store::read::lookup;
use crate::store::read::select::{self, SelectError};
use crate::store::read::shapes::{self, ShapeError};
use pgrx::datum::TimestampWithTimeZone;
use pgrx::prelude::*;
use std::collections::{BTreeSet, HashMap};

// Envelopes after a vector-clock cursor, ordered by (originator_node_id,
// originator_sequence_id), at most row_limit of them (README:
// select_gateway_envelopes).
materialized_srf!(
    select_gateway_envelopes_wrapper,
    pg_finfo_select_gateway_envelopes_wrapper,
    name = "select_gateway_envelopes",
    sql = r#"
CREATE FUNCTION select_gateway_envelopes(
    cursor_node_ids integer[] DEFAULT '{}',
    cursor_sequence_ids bigint[] DEFAULT '{}',
    topics bytea[] DEFAULT NULL,
    originator_node_ids integer[] DEFAULT NULL,
    row_limit integer DEFAULT 1000
) RETURNS TABLE (
    originator_node_id integer,
    originator_sequence_id bigint,
    gateway_time timestamp with time zone,
    topic bytea,
    payer_id integer,
    expiry bigint,
    originator_envelope bytea
)
STABLE PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'select_gateway_envelopes_wrapper';
"#,
    |args, out| {
        (|| -> Result<(), SelectError> {
            let limit = limit("row_limit", args.get(4))?;
            let nodes = elements("cursor_node_ids", args.array(0))?.unwrap_or_default();
            let seqs = elements("cursor_sequence_ids", args.array(1))?.unwrap_or_default();
            let cursor = cursor_map(nodes, seqs)?;
            let topics = bytea_elements("topics", args.array(2))?;
            let originators = elements("originator_node_ids", args.array(3))?;
            select::select(cursor, topics, originators, limit, out)
        })()
    }
);

// xmtpd's read shapes (README: the read shapes of an xmtpd node).

materialized_srf!(
    select_by_topic_cursors_wrapper,
    pg_finfo_select_by_topic_cursors_wrapper,
    name = "select_by_topic_cursors",
    sql = r#"
CREATE FUNCTION select_by_topic_cursors(
    cursor_topics bytea[],
    cursor_node_ids integer[],
    cursor_sequence_ids bigint[],
    rows_per_entry integer DEFAULT 1000,
    row_limit integer DEFAULT 1000,
    commit_safe boolean DEFAULT false
) RETURNS TABLE (
    originator_node_id integer,
    originator_sequence_id bigint,
    gateway_time timestamp with time zone,
    topic bytea,
    payer_id integer,
    expiry bigint,
    originator_envelope bytea
)
VOLATILE PARALLEL UNSAFE SECURITY DEFINER
LANGUAGE c AS 'MODULE_PATHNAME', 'select_by_topic_cursors_wrapper';
"#,
    |args, out| {
        (|| -> Result<(), ShapeError> {
            let entries = cursor_entries(args.array(0), args.array(1), args.array(2))?;
            let per_entry = limit("rows_per_entry", args.get(3))?;
            let limit = limit("row_limit", args.get(4))?;
            let commit_safe: bool = args.get(5).ok_or(ShapeError::Null("commit_safe"))?;
            shapes::by_topic_cursors(&entries, per_entry, limit, commit_safe, out)
        })()
    }
);

materialized_srf!(
    select_wave_wrapper,
    pg_finfo_select_wave_wrapper,
    name = "select_wave",
    sql = r#"
CREATE FUNCTION select_wave(
    cursor_topics bytea[],
    cursor_node_ids integer[],
    cursor_sequence_ids bigint[],
    ceiling_node_ids integer[],
    ceiling_sequence_ids bigint[],
    after_node_id integer DEFAULT NULL,
    after_sequence_id bigint DEFAULT NULL,
    row_limit integer DEFAULT 1000,
    commit_safe boolean DEFAULT false
) RETURNS TABLE (
    originator_node_id integer,
    originator_sequence_id bigint,
    gateway_time timestamp with time zone,
    topic bytea,
    payer_id integer,
    expiry bigint,
    originator_envelope bytea
)
VOLATILE PARALLEL UNSAFE SECURITY DEFINER
LANGUAGE c AS 'MODULE_PATHNAME', 'select_wave_wrapper';
"#,
    |args, out| {
        (|| -> Result<(), ShapeError> {
            let entries = cursor_entries(args.array(0), args.array(1), args.array(2))?;
            let ceiling_nodes = required("ceiling_node_ids", args.array(3))?;
            let ceiling_seqs = required("ceiling_sequence_ids", args.array(4))?;
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
            let position = match (args.get::<i32>(5), args.get::<i64>(6)) {
                (None, None) => None,
                (Some(node), Some(seq)) => Some((node, seq)),
                _ => return Err(ShapeError::HalfPosition),
            };
            let limit = limit("row_limit", args.get(7))?;
            let commit_safe: bool = args.get(8).ok_or(ShapeError::Null("commit_safe"))?;
            shapes::wave(&entries, &ceilings, position, limit, commit_safe, out)
        })()
    }
);

materialized_srf!(
    select_newest_by_topic_wrapper,
    pg_finfo_select_newest_by_topic_wrapper,
    name = "select_newest_by_topic",
    sql = r#"
CREATE FUNCTION select_newest_by_topic(topics bytea[])
RETURNS TABLE (
    originator_node_id integer,
    originator_sequence_id bigint,
    gateway_time timestamp with time zone,
    topic bytea,
    payer_id integer,
    expiry bigint,
    originator_envelope bytea
)
STABLE PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'select_newest_by_topic_wrapper';
"#,
    |args, out| {
        (|| -> Result<(), ShapeError> {
            let topics: BTreeSet<Vec<u8>> =
                topics_of("topics", args.array(0))?.into_iter().collect();
            shapes::newest_by_topic(topics, out)
        })()
    }
);

materialized_srf!(
    select_originator_wrapper,
    pg_finfo_select_originator_wrapper,
    name = "select_originator",
    sql = r#"
CREATE FUNCTION select_originator(
    originator_node_id integer,
    after_sequence_id bigint DEFAULT 0,
    row_limit integer DEFAULT 1000,
    commit_safe boolean DEFAULT false
) RETURNS TABLE (
    originator_node_id integer,
    originator_sequence_id bigint,
    gateway_time timestamp with time zone,
    topic bytea,
    payer_id integer,
    expiry bigint,
    originator_envelope bytea
)
VOLATILE PARALLEL UNSAFE SECURITY DEFINER
LANGUAGE c AS 'MODULE_PATHNAME', 'select_originator_wrapper';
"#,
    |args, out| {
        (|| -> Result<(), ShapeError> {
            let node: i32 = args.get(0).ok_or(ShapeError::Null("originator_node_id"))?;
            let after: i64 = args.get(1).ok_or(ShapeError::Null("after_sequence_id"))?;
            let limit = limit("row_limit", args.get(2))?;
            let commit_safe: bool = args.get(3).ok_or(ShapeError::Null("commit_safe"))?;
            shapes::originator(node, after, limit, commit_safe, out)
        })()
    }
);

materialized_srf!(
    originator_maxima_wrapper,
    pg_finfo_originator_maxima_wrapper,
    name = "originator_maxima",
    sql = r#"
CREATE FUNCTION originator_maxima(originator_node_ids integer[])
RETURNS TABLE (originator_node_id integer, max_sequence_id bigint)
STABLE PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'originator_maxima_wrapper';
"#,
    |args, out| {
        (|| -> Result<(), ShapeError> {
            let nodes: BTreeSet<i32> = required("originator_node_ids", args.array(0))?
                .into_iter()
                .collect();
            shapes::maxima(nodes, out)
        })()
    }
);

/// Per originator with a stored row, its highest sequence id and that row's
/// gateway time, as the calling statement sees them (`originator_latest()`
/// adds what pruning deleted).
#[pg_extern(stable, parallel_safe)]
#[allow(clippy::type_complexity)]
fn _stored_maxima() -> TableIterator<
    'static,
    (
        name!(originator_node_id, i32),
        name!(originator_sequence_id, i64),
        name!(gateway_time, TimestampWithTimeZone),
    ),
> {
    TableIterator::new(shapes::stored_maxima().or_raise())
}

/// The bytes of envelope `(originator_node_id, originator_sequence_id)` from
/// `gateway_envelopes_blob`, as the calling statement sees it; NULL when there is
/// no such row. For a role that may read only the view's other columns, an empty
/// `bytea` for an envelope that exists (see [`lookup`]).
#[pg_extern(stable, parallel_safe)]
fn envelope_of(originator_node_id: i32, originator_sequence_id: i64) -> Option<Vec<u8>> {
    lookup::lookup(originator_node_id, originator_sequence_id).or_raise()
}
