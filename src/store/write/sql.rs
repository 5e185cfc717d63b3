//! The SQL path of the insert: a data-modifying CTE per call, for tables the
//! direct path does not reproduce (a trigger, a changed layout), with plans of
//! its own for late rows, prepared once per session and kept.

use super::InsertError;
use crate::store::feed;
use pgrx::datum::{DatumWithOid, TimestampWithTimeZone};
use pgrx::prelude::*;
use pgrx::spi::{OwnedPreparedStatement, Spi};
use pgrx::PgOid;
use std::cell::RefCell;
use std::rc::Rc;

/// Inserts one row into meta and, only if that row is new, into blob. The blob
/// insert does nothing on a conflict too: a key whose meta row is missing while
/// its blob row exists (a meta band dropped by hand) is repaired and counted as
/// not new, instead of failing with 23505.
///
/// `ON CONFLICT DO NOTHING` names no conflict target on purpose: the primary key is
/// the only unique index, and with an explicit target the executor maps the
/// arbiter index onto each leaf partition by walking `pg_inherits` (nine catalog
/// index scans per execution here), which is measurable on a single-row insert.
const INSERT_ONE: &str = "
WITH m AS (
    INSERT INTO envelopes.gateway_envelopes_meta
        (originator_node_id, originator_sequence_id, gateway_time, topic, payer_id, expiry)
    VALUES ($1, $2, COALESCE($6, pg_catalog.now()), $3, $5, $7)
    ON CONFLICT DO NOTHING
    RETURNING originator_node_id, originator_sequence_id
)
INSERT INTO envelopes.gateway_envelopes_blob
    (originator_node_id, originator_sequence_id, originator_envelope)
SELECT m.originator_node_id, m.originator_sequence_id, $4 FROM m
ON CONFLICT DO NOTHING";

/// [`INSERT_ONE`] for a row that arrives late: flagged in meta if new, and
/// recorded in the late-envelope feed when `$8` says so (an entry of the
/// transaction does not cover it yet, see [`late::entries`]), new or not: the
/// entry hands out only a row of this transaction.
const INSERT_ONE_LATE: &str = "
WITH m AS (
    INSERT INTO envelopes.gateway_envelopes_meta
        (originator_node_id, originator_sequence_id, gateway_time, topic, payer_id, expiry, late)
    VALUES ($1, $2, COALESCE($6, pg_catalog.now()), $3, $5, $7, true)
    ON CONFLICT DO NOTHING
    RETURNING originator_node_id, originator_sequence_id
), l AS (
    INSERT INTO envelopes.late_envelopes
        (originator_node_id, originator_sequence_id, last_sequence_id, inserted_xid)
    SELECT $1, $2, $2, pg_catalog.pg_current_xact_id() WHERE $8
)
INSERT INTO envelopes.gateway_envelopes_blob
    (originator_node_id, originator_sequence_id, originator_envelope)
SELECT m.originator_node_id, m.originator_sequence_id, $4 FROM m
ON CONFLICT DO NOTHING";

/// Inserts a batch given as parallel arrays. Duplicates inside the batch keep their
/// first occurrence; rows are inserted in key order, so two batches that overlap
/// take their index locks in the same order and cannot deadlock each other.
/// Returns the keys of the new rows (for `insert_gateway_envelopes_keys`).
const INSERT_MANY: &str = "
WITH input AS (
    SELECT DISTINCT ON (u.node, u.seq) u.node, u.seq, u.topic, u.envelope, u.payer, u.at, u.expiry
      FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2), pg_catalog.unnest($3),
                      pg_catalog.unnest($4), pg_catalog.unnest($5), pg_catalog.unnest($6),
                      pg_catalog.unnest($7))
           WITH ORDINALITY AS u(node, seq, topic, envelope, payer, at, expiry, ord)
     ORDER BY u.node, u.seq, u.ord
), m AS (
    INSERT INTO envelopes.gateway_envelopes_meta
        (originator_node_id, originator_sequence_id, gateway_time, topic, payer_id, expiry)
    SELECT node, seq, COALESCE(at, pg_catalog.now()), topic, payer, expiry FROM input
    ON CONFLICT DO NOTHING
    RETURNING originator_node_id, originator_sequence_id
)
INSERT INTO envelopes.gateway_envelopes_blob
    (originator_node_id, originator_sequence_id, originator_envelope)
SELECT m.originator_node_id, m.originator_sequence_id, input.envelope
  FROM m JOIN input ON input.node = m.originator_node_id AND input.seq = m.originator_sequence_id
ON CONFLICT DO NOTHING
RETURNING originator_node_id, originator_sequence_id";

/// The late batch statements around their late-feed part: the input in key
/// order and the meta rows (`late` from `$8`), then the blob rows of the new ones.
macro_rules! insert_many_late {
    ($late_feed:literal) => {
        concat!(
            "
WITH input AS (
    SELECT DISTINCT ON (u.node, u.seq) u.node, u.seq, u.topic, u.envelope, u.payer, u.at, u.expiry, u.late
      FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2), pg_catalog.unnest($3),
                      pg_catalog.unnest($4), pg_catalog.unnest($5), pg_catalog.unnest($6),
                      pg_catalog.unnest($7), pg_catalog.unnest($8))
           WITH ORDINALITY AS u(node, seq, topic, envelope, payer, at, expiry, late, ord)
     ORDER BY u.node, u.seq, u.ord
), m AS (
    INSERT INTO envelopes.gateway_envelopes_meta
        (originator_node_id, originator_sequence_id, gateway_time, topic, payer_id, expiry, late)
    SELECT node, seq, COALESCE(at, pg_catalog.now()), topic, payer, expiry, late FROM input
    ON CONFLICT DO NOTHING
    RETURNING originator_node_id, originator_sequence_id, late
",
            $late_feed,
            "
INSERT INTO envelopes.gateway_envelopes_blob
    (originator_node_id, originator_sequence_id, originator_envelope)
SELECT m.originator_node_id, m.originator_sequence_id, input.envelope
  FROM m JOIN input ON input.node = m.originator_node_id AND input.seq = m.originator_sequence_id
ON CONFLICT DO NOTHING
RETURNING originator_node_id, originator_sequence_id"
        )
    };
}

/// [`INSERT_MANY`] for a batch with late rows: `$8` flags them, and the entries
/// `$9`..`$11` (node, first and last sequence id, see [`late::entries`]) record
/// them in the late-envelope feed (an entry hands out only rows of this
/// transaction: one for rows that turn out not to be new hands out nothing).
const INSERT_MANY_LATE: &str = insert_many_late!(
    "), l AS (
    INSERT INTO envelopes.late_envelopes
        (originator_node_id, originator_sequence_id, last_sequence_id, inserted_xid)
    SELECT e.node, e.first, e.last, pg_catalog.pg_current_xact_id()
      FROM ROWS FROM (pg_catalog.unnest($9), pg_catalog.unnest($10), pg_catalog.unnest($11))
           AS e(node, first, last)
)"
);

/// [`INSERT_ONE_LATE`] for a `late_envelopes` of one row per entry (before the
/// upgrade script to 0.4.0 ran, see [`late::Layout`]): an entry for the row if
/// it is new.
const INSERT_ONE_LATE_ROWS: &str = "
WITH m AS (
    INSERT INTO envelopes.gateway_envelopes_meta
        (originator_node_id, originator_sequence_id, gateway_time, topic, payer_id, expiry, late)
    VALUES ($1, $2, COALESCE($6, pg_catalog.now()), $3, $5, $7, true)
    ON CONFLICT DO NOTHING
    RETURNING originator_node_id, originator_sequence_id
), l AS (
    INSERT INTO envelopes.late_envelopes (originator_node_id, originator_sequence_id)
    SELECT m.originator_node_id, m.originator_sequence_id FROM m
)
INSERT INTO envelopes.gateway_envelopes_blob
    (originator_node_id, originator_sequence_id, originator_envelope)
SELECT m.originator_node_id, m.originator_sequence_id, $4 FROM m
ON CONFLICT DO NOTHING";

/// [`INSERT_MANY_LATE`] for a `late_envelopes` of one row per entry: an entry
/// for each new late row.
const INSERT_MANY_LATE_ROWS: &str = insert_many_late!(
    "), l AS (
    INSERT INTO envelopes.late_envelopes (originator_node_id, originator_sequence_id)
    SELECT m.originator_node_id, m.originator_sequence_id FROM m WHERE m.late
)"
);

thread_local! {
    /// Plans prepared once per backend, indexed by [`Plan`]. The plan cache re-plans
    /// them by itself when the tables change (e.g. after the extension is re-created).
    static PLANS: RefCell<[Option<Rc<OwnedPreparedStatement>>; 6]> =
        const { RefCell::new([None, None, None, None, None, None]) };
}

#[derive(Clone, Copy)]
pub(super) enum Plan {
    One = 0,
    Many = 1,
    OneLate = 2,
    ManyLate = 3,
    OneLateRows = 4,
    ManyLateRows = 5,
}

impl Plan {
    fn sql(self) -> &'static str {
        match self {
            Plan::One => INSERT_ONE,
            Plan::Many => INSERT_MANY,
            Plan::OneLate => INSERT_ONE_LATE,
            Plan::ManyLate => INSERT_MANY_LATE,
            Plan::OneLateRows => INSERT_ONE_LATE_ROWS,
            Plan::ManyLateRows => INSERT_MANY_LATE_ROWS,
        }
    }

    fn argument_types(self) -> Vec<PgOid> {
        fn oid<T: IntoDatum>() -> PgOid {
            PgOid::from(T::type_oid())
        }
        match self {
            Plan::One | Plan::OneLateRows => vec![
                oid::<i32>(),
                oid::<i64>(),
                oid::<&[u8]>(),
                oid::<&[u8]>(),
                oid::<i32>(),
                oid::<TimestampWithTimeZone>(),
                oid::<i64>(),
            ],
            Plan::OneLate => {
                let mut types = Plan::One.argument_types();
                types.push(oid::<bool>());
                types
            }
            Plan::Many => vec![
                oid::<Vec<i32>>(),
                oid::<Vec<i64>>(),
                oid::<Vec<Vec<u8>>>(),
                oid::<Vec<Vec<u8>>>(),
                oid::<Vec<i32>>(),
                oid::<Vec<TimestampWithTimeZone>>(),
                oid::<Vec<i64>>(),
            ],
            Plan::ManyLateRows => {
                let mut types = Plan::Many.argument_types();
                types.push(oid::<Vec<bool>>());
                types
            }
            Plan::ManyLate => {
                let mut types = Plan::Many.argument_types();
                types.push(oid::<Vec<bool>>());
                types.push(oid::<Vec<i32>>());
                types.push(oid::<Vec<i64>>());
                types.push(oid::<Vec<i64>>());
                types
            }
        }
    }
}

/// Runs one of the two insert plans, preparing it on first use, and returns the
/// number of rows it inserted into the blob table (= new envelopes).
pub(super) fn execute(plan: Plan, args: &[DatumWithOid<'_>]) -> Result<i64, InsertError> {
    crate::pg::definer::pinned(|| execute_pinned(plan, args, None))
}

/// [`execute`] for a batch statement, whose rows are the new keys: pushed onto
/// `keys` when given.
pub(super) fn execute_many(
    plan: Plan,
    args: &[DatumWithOid<'_>],
    keys: Option<&mut Vec<(i32, i64)>>,
) -> Result<i64, InsertError> {
    crate::pg::definer::pinned(|| execute_pinned(plan, args, keys))
}

fn execute_pinned(
    plan: Plan,
    args: &[DatumWithOid<'_>],
    keys: Option<&mut Vec<(i32, i64)>>,
) -> Result<i64, InsertError> {
    Spi::connect_mut(|client| {
        // The borrow is released before executing: a trigger may call back in.
        let cached = PLANS.with(|plans| plans.borrow()[plan as usize].clone());
        let prepared = match cached {
            Some(prepared) => prepared,
            None => {
                let prepared = Rc::new(
                    client
                        .prepare_mut(plan.sql(), &plan.argument_types())?
                        .keep(),
                );
                PLANS.with(|plans| plans.borrow_mut()[plan as usize] = Some(prepared.clone()));
                prepared
            }
        };
        let table = feed::through_functions(|| client.update(&*prepared, None, args))?;
        let inserted = table.len();
        if let Some(keys) = keys {
            for row in table {
                if let (Some(node), Some(seq)) = (row.get::<i32>(1)?, row.get::<i64>(2)?) {
                    keys.push((node, seq));
                }
            }
        }
        Ok(i64::try_from(inserted).unwrap_or(i64::MAX))
    })
}
