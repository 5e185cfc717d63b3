//! `insert_gateway_envelope` and `insert_gateway_envelopes`.
//!
//! Both write meta and blob in one statement (a data-modifying CTE), so a row is
//! either in both tables or in neither, and return how many envelopes were new:
//! an existing `(originator_node_id, originator_sequence_id)` is skipped, which
//! makes replays idempotent.
//!
//! The hot path (partitions already known) validates the input, asks the
//! partition cache for the row's route, locks it, and executes a plan prepared
//! once per backend. No subtransaction is opened and no catalog query runs; only
//! a cache miss pays for the catalog read, the advisory lock and the DDL (see
//! [`crate::partition`]). There is no "no partition found" error to recover
//! from, because a row is only inserted once its partitions are known to exist.

use crate::error::{PgSqlErrorCode, SqlError};
use crate::gucs;
use crate::partition::{self, PartitionError};
use pgrx::datum::{DatumWithOid, TimestampWithTimeZone};
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::prelude::*;
use pgrx::spi::{OwnedPreparedStatement, Spi};
use pgrx::PgOid;
use std::cell::RefCell;
use std::rc::Rc;

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
    #[error("{0}")]
    Partition(#[from] PartitionError),
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
            InsertError::Partition(e) => e.sqlstate(),
            InsertError::Spi(_) => ERRCODE_INTERNAL_ERROR,
        }
    }

    fn hint(&self) -> Option<String> {
        match self {
            InsertError::Partition(e) => e.hint(),
            InsertError::TooLong { setting, .. } => {
                Some(format!("Raise {setting} if such values are legitimate."))
            }
            _ => None,
        }
    }
}

crate::impl_error_report!(InsertError);

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

/// Inserts one row into meta and, only if that row is new, into blob.
const INSERT_ONE: &str = "
WITH m AS (
    INSERT INTO envelopes.gateway_envelopes_meta
        (originator_node_id, originator_sequence_id, gateway_time, topic, payer_id, expiry)
    VALUES ($1, $2, COALESCE($6, pg_catalog.now()), $3, $5, $7)
    ON CONFLICT (originator_node_id, originator_sequence_id) DO NOTHING
    RETURNING originator_node_id, originator_sequence_id
)
INSERT INTO envelopes.gateway_envelopes_blob
    (originator_node_id, originator_sequence_id, originator_envelope)
SELECT m.originator_node_id, m.originator_sequence_id, $4 FROM m";

/// Inserts a batch given as parallel arrays. Duplicates inside the batch keep their
/// first occurrence; rows are inserted in key order, so two batches that overlap
/// take their index locks in the same order and cannot deadlock each other.
const INSERT_MANY: &str = "
WITH input AS (
    SELECT DISTINCT ON (u.node, u.seq) u.node, u.seq, u.topic, u.envelope, u.payer, u.at, u.expiry
      FROM pg_catalog.unnest($1, $2, $3, $4, $5, $6, $7)
           WITH ORDINALITY AS u(node, seq, topic, envelope, payer, at, expiry, ord)
     ORDER BY u.node, u.seq, u.ord
), m AS (
    INSERT INTO envelopes.gateway_envelopes_meta
        (originator_node_id, originator_sequence_id, gateway_time, topic, payer_id, expiry)
    SELECT node, seq, COALESCE(at, pg_catalog.now()), topic, payer, expiry FROM input
    ON CONFLICT (originator_node_id, originator_sequence_id) DO NOTHING
    RETURNING originator_node_id, originator_sequence_id
)
INSERT INTO envelopes.gateway_envelopes_blob
    (originator_node_id, originator_sequence_id, originator_envelope)
SELECT m.originator_node_id, m.originator_sequence_id, input.envelope
  FROM m JOIN input ON input.node = m.originator_node_id AND input.seq = m.originator_sequence_id";

thread_local! {
    /// Plans prepared once per backend, indexed by [`Plan`]. The plan cache re-plans
    /// them by itself when the tables change (e.g. after the extension is re-created).
    static PLANS: RefCell<[Option<Rc<OwnedPreparedStatement>>; 2]> =
        const { RefCell::new([None, None]) };
}

#[derive(Clone, Copy)]
enum Plan {
    One = 0,
    Many = 1,
}

impl Plan {
    fn sql(self) -> &'static str {
        match self {
            Plan::One => INSERT_ONE,
            Plan::Many => INSERT_MANY,
        }
    }

    fn argument_types(self) -> Vec<PgOid> {
        fn oid<T: IntoDatum>() -> PgOid {
            PgOid::from(T::type_oid())
        }
        match self {
            Plan::One => vec![
                oid::<i32>(),
                oid::<i64>(),
                oid::<&[u8]>(),
                oid::<&[u8]>(),
                oid::<i32>(),
                oid::<TimestampWithTimeZone>(),
                oid::<i64>(),
            ],
            Plan::Many => vec![
                oid::<Vec<i32>>(),
                oid::<Vec<i64>>(),
                oid::<Vec<Vec<u8>>>(),
                oid::<Vec<Vec<u8>>>(),
                oid::<Vec<i32>>(),
                oid::<Vec<TimestampWithTimeZone>>(),
                oid::<Vec<i64>>(),
            ],
        }
    }
}

/// Runs one of the two insert plans, preparing it on first use, and returns the
/// number of rows it inserted into the blob table (= new envelopes).
fn execute(plan: Plan, args: &[DatumWithOid<'_>]) -> Result<i64, InsertError> {
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
        let inserted = client.update(&*prepared, None, args)?.len();
        Ok(i64::try_from(inserted).unwrap_or(i64::MAX))
    })
}

/// Inserts one envelope. Returns 1 if it was new, 0 if
/// `(originator_node_id, originator_sequence_id)` already existed. Missing
/// partitions are created first.
#[pg_extern(volatile, parallel_unsafe)]
#[allow(clippy::too_many_arguments)]
fn insert_gateway_envelope(
    originator_node_id: Option<i32>,
    originator_sequence_id: Option<i64>,
    topic: Option<&[u8]>,
    originator_envelope: Option<&[u8]>,
    payer_id: default!(Option<i32>, "NULL"),
    gateway_time: default!(Option<TimestampWithTimeZone>, "now()"),
    expiry: default!(Option<i64>, "NULL"),
) -> Result<i64, ErrorReport> {
    let node = partition::check_node(originator_node_id).map_err(InsertError::from)?;
    let seq = partition::check_sequence(originator_sequence_id).map_err(InsertError::from)?;
    let topic = check_topic(topic)?;
    let envelope = check_envelope(originator_envelope)?;
    partition::route(node, seq, gucs::band_width()).map_err(InsertError::from)?;
    let args = [
        DatumWithOid::from(node),
        DatumWithOid::from(seq),
        DatumWithOid::from(topic),
        DatumWithOid::from(envelope),
        DatumWithOid::from(payer_id),
        DatumWithOid::from(gateway_time),
        DatumWithOid::from(expiry),
    ];
    Ok(execute(Plan::One, &args)?)
}

/// Checks that an array that was given has `expected` elements.
fn check_len(name: &'static str, len: Option<usize>, expected: usize) -> Result<(), InsertError> {
    match len {
        Some(len) if len != expected => Err(InsertError::ArrayLength {
            name,
            len,
            expected,
        }),
        _ => Ok(()),
    }
}

/// Inserts a batch of envelopes given as parallel arrays (one element per
/// envelope). Returns how many were new. `payer_ids`, `gateway_times` and
/// `expiries` may be NULL as a whole; NULL elements mean no payer, now(), never.
#[pg_extern(volatile, parallel_unsafe)]
#[allow(clippy::too_many_arguments)]
fn insert_gateway_envelopes(
    originator_node_ids: Option<Array<'_, i32>>,
    originator_sequence_ids: Option<Array<'_, i64>>,
    topics: Option<Array<'_, &[u8]>>,
    originator_envelopes: Option<Array<'_, &[u8]>>,
    payer_ids: default!(Option<Array<'_, i32>>, "NULL"),
    gateway_times: default!(Option<Array<'_, TimestampWithTimeZone>>, "NULL"),
    expiries: default!(Option<Array<'_, i64>>, "NULL"),
) -> Result<i64, ErrorReport> {
    let nodes = originator_node_ids.ok_or(InsertError::Null("originator_node_ids"))?;
    let seqs = originator_sequence_ids.ok_or(InsertError::Null("originator_sequence_ids"))?;
    let topics = topics.ok_or(InsertError::Null("topics"))?;
    let envelopes = originator_envelopes.ok_or(InsertError::Null("originator_envelopes"))?;
    let n = nodes.len();
    check_len("originator_sequence_ids", Some(seqs.len()), n)?;
    check_len("topics", Some(topics.len()), n)?;
    check_len("originator_envelopes", Some(envelopes.len()), n)?;
    check_len("payer_ids", payer_ids.as_ref().map(Array::len), n)?;
    check_len("gateway_times", gateway_times.as_ref().map(Array::len), n)?;
    check_len("expiries", expiries.as_ref().map(Array::len), n)?;
    if n == 0 {
        return Ok(0);
    }

    // Validate everything before touching any partition, so bad input writes nothing.
    let mut keys = Vec::with_capacity(n);
    for (index, (node, seq)) in nodes.iter().zip(seqs.iter()).enumerate() {
        let node = node.ok_or(InsertError::NullElement {
            name: "originator_node_ids",
            index: index + 1,
        })?;
        let seq = seq.ok_or(InsertError::NullElement {
            name: "originator_sequence_ids",
            index: index + 1,
        })?;
        let node = partition::check_node(Some(node)).map_err(InsertError::from)?;
        let seq = partition::check_sequence(Some(seq)).map_err(InsertError::from)?;
        keys.push((node, seq));
    }
    for (index, topic) in topics.iter().enumerate() {
        if topic.is_none() {
            return Err(InsertError::NullElement {
                name: "topics",
                index: index + 1,
            }
            .into());
        }
        check_topic(topic)?;
    }
    for (index, envelope) in envelopes.iter().enumerate() {
        if envelope.is_none() {
            return Err(InsertError::NullElement {
                name: "originator_envelopes",
                index: index + 1,
            }
            .into());
        }
        check_envelope(envelope)?;
    }

    let width = gucs::band_width();
    keys.sort_unstable();
    keys.dedup();
    // Consecutive keys mostly share a band: lock each distinct route once.
    let mut locked = Vec::new();
    for &(node, seq) in &keys {
        if let Some(routes) = partition::cached_routes(node, seq) {
            if locked.contains(&routes) {
                continue;
            }
        }
        locked.push(partition::route(node, seq, width).map_err(InsertError::from)?);
    }

    let args = [
        DatumWithOid::from(nodes),
        DatumWithOid::from(seqs),
        DatumWithOid::from(topics),
        DatumWithOid::from(envelopes),
        array_or_null(payer_ids),
        array_or_null(gateway_times),
        array_or_null(expiries),
    ];
    Ok(execute(Plan::Many, &args)?)
}

fn array_or_null<'a, T: IntoDatum>(array: Option<Array<'a, T>>) -> DatumWithOid<'a> {
    match array {
        Some(array) => DatumWithOid::from(array),
        None => DatumWithOid::null::<Array<'a, T>>(),
    }
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use pgrx::prelude::*;

    #[pg_test]
    fn smoke() {
        let n =
            Spi::get_one::<i64>("SELECT envelopes.insert_gateway_envelope(1, 5, '\\x01', '\\x02')")
                .unwrap();
        assert_eq!(n, Some(1));
    }
}
