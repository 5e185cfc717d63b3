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

use crate::error::{OrRaise, PgSqlErrorCode, SqlError};
use crate::gucs;
use crate::store::feed::markers::{self, Drawn, MarkerError};
use crate::store::feed::{self, late};
use crate::store::partition::{self, cache, PartitionError};
use pgrx::datum::{DatumWithOid, TimestampWithTimeZone};
use pgrx::prelude::*;
use pgrx::spi::{OwnedPreparedStatement, Spi};
use pgrx::PgOid;
use std::cell::RefCell;
use std::collections::HashMap;
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

/// [`INSERT_ONE`] for a row that arrives late: flagged in meta and recorded in the
/// late-envelope feed, both only if the row is new.
const INSERT_ONE_LATE: &str = "
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

/// Inserts a batch given as parallel arrays. Duplicates inside the batch keep their
/// first occurrence; rows are inserted in key order, so two batches that overlap
/// take their index locks in the same order and cannot deadlock each other.
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
ON CONFLICT DO NOTHING";

/// [`INSERT_MANY`] for a batch with late rows: `$8` flags them, and the new ones
/// among them are recorded in the late-envelope feed.
const INSERT_MANY_LATE: &str = "
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
), l AS (
    INSERT INTO envelopes.late_envelopes (originator_node_id, originator_sequence_id)
    SELECT m.originator_node_id, m.originator_sequence_id FROM m WHERE m.late
)
INSERT INTO envelopes.gateway_envelopes_blob
    (originator_node_id, originator_sequence_id, originator_envelope)
SELECT m.originator_node_id, m.originator_sequence_id, input.envelope
  FROM m JOIN input ON input.node = m.originator_node_id AND input.seq = m.originator_sequence_id
ON CONFLICT DO NOTHING";

thread_local! {
    /// Plans prepared once per backend, indexed by [`Plan`]. The plan cache re-plans
    /// them by itself when the tables change (e.g. after the extension is re-created).
    static PLANS: RefCell<[Option<Rc<OwnedPreparedStatement>>; 4]> =
        const { RefCell::new([None, None, None, None]) };
}

#[derive(Clone, Copy)]
enum Plan {
    One = 0,
    Many = 1,
    OneLate = 2,
    ManyLate = 3,
}

impl Plan {
    fn sql(self) -> &'static str {
        match self {
            Plan::One => INSERT_ONE,
            Plan::Many => INSERT_MANY,
            Plan::OneLate => INSERT_ONE_LATE,
            Plan::ManyLate => INSERT_MANY_LATE,
        }
    }

    fn argument_types(self) -> Vec<PgOid> {
        fn oid<T: IntoDatum>() -> PgOid {
            PgOid::from(T::type_oid())
        }
        match self {
            Plan::One | Plan::OneLate => vec![
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
            Plan::ManyLate => {
                let mut types = Plan::Many.argument_types();
                types.push(oid::<Vec<bool>>());
                types
            }
        }
    }
}

/// Runs one of the two insert plans, preparing it on first use, and returns the
/// number of rows it inserted into the blob table (= new envelopes).
fn execute(plan: Plan, args: &[DatumWithOid<'_>]) -> Result<i64, InsertError> {
    crate::pg::definer::pinned(|| execute_pinned(plan, args))
}

fn execute_pinned(plan: Plan, args: &[DatumWithOid<'_>]) -> Result<i64, InsertError> {
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
        let inserted = feed::through_functions(|| client.update(&*prepared, None, args))?.len();
        Ok(i64::try_from(inserted).unwrap_or(i64::MAX))
    })
}

/// Inserts one envelope. Returns 1 if it was new, 0 if
/// `(originator_node_id, originator_sequence_id)` already existed. Missing
/// partitions are created first.
///
/// `SECURITY DEFINER` without a `SET search_path` clause: the hot path runs no
/// SQL, and what does run SQL pins the path itself (see [`crate::pg::definer`]).
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[allow(clippy::too_many_arguments)]
fn insert_gateway_envelope(
    originator_node_id: Option<i32>,
    originator_sequence_id: Option<i64>,
    topic: Option<&[u8]>,
    originator_envelope: Option<&[u8]>,
    payer_id: default!(Option<i32>, "NULL"),
    gateway_time: default!(Option<TimestampWithTimeZone>, "now()"),
    expiry: default!(Option<i64>, "NULL"),
) -> i64 {
    crate::pg::xact::check_writable("insert_gateway_envelope")
        .map_err(InsertError::from)
        .and_then(|()| {
            insert_one(
                originator_node_id,
                originator_sequence_id,
                topic,
                originator_envelope,
                payer_id,
                gateway_time,
                expiry,
            )
        })
        .or_raise()
}

#[allow(clippy::too_many_arguments)]
fn insert_one(
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
    if let Some(new) = write_direct(&[routes], late, false, false, row)? {
        return Ok(new);
    }
    let plan = if late {
        markers::mark_drawn(Drawn::Late)?;
        Plan::OneLate
    } else {
        Plan::One
    };
    let args = [
        DatumWithOid::from(node),
        DatumWithOid::from(seq),
        DatumWithOid::from(topic),
        DatumWithOid::from(envelope),
        DatumWithOid::from(payer_id),
        DatumWithOid::from(gateway_time),
        DatumWithOid::from(expiry),
    ];
    execute(plan, &args)
}

/// Refuses an infinite `gateway_time`: no reader could turn it into a point in
/// time (the bridge publishes microseconds since the epoch).
fn check_time(
    time: Option<TimestampWithTimeZone>,
    name: impl FnOnce() -> String,
) -> Result<(), InsertError> {
    match time {
        Some(t) if !t.is_finite() => Err(InsertError::InfiniteTime(name())),
        _ => Ok(()),
    }
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
///
/// `SECURITY DEFINER` without a `SET search_path` clause: the hot path runs no
/// SQL, and what does run SQL pins the path itself (see [`crate::pg::definer`]).
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[allow(clippy::too_many_arguments)]
fn insert_gateway_envelopes(
    originator_node_ids: Option<Array<'_, i32>>,
    originator_sequence_ids: Option<Array<'_, i64>>,
    topics: Option<Array<'_, &[u8]>>,
    originator_envelopes: Option<Array<'_, &[u8]>>,
    payer_ids: default!(Option<Array<'_, i32>>, "NULL"),
    gateway_times: default!(Option<Array<'_, TimestampWithTimeZone>>, "NULL"),
    expiries: default!(Option<Array<'_, i64>>, "NULL"),
) -> i64 {
    crate::pg::xact::check_writable("insert_gateway_envelopes")
        .map_err(InsertError::from)
        .and_then(|()| {
            insert_many(
                originator_node_ids,
                originator_sequence_ids,
                topics,
                originator_envelopes,
                payer_ids,
                gateway_times,
                expiries,
            )
        })
        .or_raise()
}

/// Envelopes of one originator in one base64 value: the form
/// `pg_envelopes_router` sends a shard (single rows: see
/// [`insert_gateway_envelope_packed`]). PL/Proxy
/// passes every value as text and sends every call unprepared: a `bytea[]` in
/// text costs the shard a parse of every character of the array (more than the
/// insert itself for a 100-row batch of 272-byte envelopes), and each argument
/// of a call its share of parsing and planning; one base64 value decoded here
/// costs a small part of either. `packed_rows` is the base64 (standard alphabet,
/// padded; line breaks as `encode(..., 'base64')` writes them are allowed) of,
/// for each envelope: its sequence id (8 bytes), its topic's length (4 bytes),
/// the topic, its envelope's length (4 bytes), the envelope, a flags byte (1: a
/// payer id follows, 4 bytes; 2: a gateway time follows, 8 bytes, microseconds
/// since 2000-01-01 as `timestamptz_send` writes them; 4: an expiry follows, 8
/// bytes; absent: no payer, the transaction's `now()`, never), integers
/// big-endian. Returns how many were new, as `insert_gateway_envelopes` does for
/// the same rows, with the same checks and errors; a malformed `packed_rows` is
/// `22P03`. Not meant for applications.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
fn insert_gateway_envelopes_packed(
    originator_node_id: Option<i32>,
    packed_rows: Option<&str>,
) -> i64 {
    insert_packed(originator_node_id, packed_rows).or_raise()
}

fn insert_packed(node: Option<i32>, packed: Option<&str>) -> Result<i64, InsertError> {
    crate::pg::xact::check_writable("insert_gateway_envelopes_packed")?;
    let node = partition::check_node(node)?;
    let packed = decode_base64(packed.ok_or(InsertError::Null("packed_rows"))?)?;
    insert_batch(unpack(node, &packed)?)
}

/// One envelope in the packed form of [`insert_gateway_envelopes_packed`]
/// (exactly one row): how `pg_envelopes_router` sends a single row, which would
/// otherwise cost the shard parsing and planning seven arguments on every call.
/// Returns 1 or 0, stores and refuses as `insert_gateway_envelope` does for the
/// same values. Not meant for applications.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
fn insert_gateway_envelope_packed(
    originator_node_id: Option<i32>,
    packed_row: Option<&str>,
) -> i64 {
    insert_packed_row(originator_node_id, packed_row).or_raise()
}

fn insert_packed_row(node: Option<i32>, packed: Option<&str>) -> Result<i64, InsertError> {
    crate::pg::xact::check_writable("insert_gateway_envelope_packed")?;
    let node = partition::check_node(node)?;
    let packed = decode_base64(packed.ok_or(InsertError::Null("packed_row"))?)?;
    let row = unpack(node, &packed)?;
    if row.nodes.len() != 1 {
        return Err(InsertError::Packed {
            at: 0,
            what: "exactly one row",
        });
    }
    insert_one(
        row.nodes[0],
        row.seqs[0],
        row.topics[0],
        row.envelopes[0],
        first(&row.payers),
        first(&row.times),
        first(&row.expiries),
    )
}

/// An optional column, present when any row has a value.
fn present<T>(column: Vec<Option<T>>) -> Option<Vec<Option<T>>> {
    column.iter().any(Option::is_some).then_some(column)
}

/// The first element of an optional column.
fn first<T: Copy>(column: &Option<Vec<Option<T>>>) -> Option<T> {
    column.as_ref().and_then(|c| c[0])
}

/// Decodes base64, skipping white space. `encode(..., 'base64')` breaks its
/// lines every 76 characters: those lines are gathered by their fixed stride (a
/// copy per line) and decoded in one pass. Text laid out any other way is decoded
/// as it is, and only if that fails, again without its white space (a test per
/// character, slower).
fn decode_base64(text: &str) -> Result<Vec<u8>, InsertError> {
    use base64::engine::general_purpose::STANDARD;
    use base64::Engine;
    const LINE: usize = 76;
    let bytes = text.as_bytes();
    let mut compact = Vec::with_capacity(bytes.len());
    let mut rest = bytes;
    while rest.len() > LINE && rest[LINE] == b'\n' {
        compact.extend_from_slice(&rest[..LINE]);
        rest = &rest[LINE + 1..];
    }
    compact.extend_from_slice(rest.strip_suffix(b"\n").unwrap_or(rest));
    STANDARD.decode(&compact).or_else(|_| {
        let clean: Vec<u8> = bytes
            .iter()
            .copied()
            .filter(|c| !c.is_ascii_whitespace())
            .collect();
        STANDARD
            .decode(clean)
            .map_err(|e| InsertError::Base64(e.to_string()))
    })
}

/// The rows of `packed_rows` (see [`insert_gateway_envelopes_packed`]) as a
/// batch of `node`; an optional column is present when any row has a value.
fn unpack(node: i32, packed: &[u8]) -> Result<Batch<'_>, InsertError> {
    let mut reader = Unpacker { packed, at: 0 };
    let mut batch = Batch {
        nodes: Vec::new(),
        seqs: Vec::new(),
        topics: Vec::new(),
        envelopes: Vec::new(),
        payers: None,
        times: None,
        expiries: None,
    };
    let (mut payers, mut times, mut expiries) = (Vec::new(), Vec::new(), Vec::new());
    while reader.at < packed.len() {
        batch.nodes.push(Some(node));
        batch
            .seqs
            .push(Some(i64::from_be_bytes(reader.fixed("a sequence id")?)));
        batch.topics.push(Some(reader.counted("a topic")?));
        batch.envelopes.push(Some(reader.counted("an envelope")?));
        let at = reader.at;
        let [flags] = reader.fixed::<1>("a flags byte")?;
        if flags & !7 != 0 {
            return Err(InsertError::Packed {
                at,
                what: "a flags byte of 0 to 7",
            });
        }
        payers.push(match flags & 1 {
            0 => None,
            _ => Some(i32::from_be_bytes(reader.fixed("a payer id")?)),
        });
        times.push(match flags & 2 {
            0 => None,
            _ => {
                let at = reader.at;
                let micros = i64::from_be_bytes(reader.fixed("a gateway time")?);
                let time =
                    TimestampWithTimeZone::try_from(micros).map_err(|_| InsertError::Packed {
                        at,
                        what: "a gateway time in range",
                    })?;
                Some(time)
            }
        });
        expiries.push(match flags & 4 {
            0 => None,
            _ => Some(i64::from_be_bytes(reader.fixed("an expiry")?)),
        });
    }
    batch.payers = present(payers);
    batch.times = present(times);
    batch.expiries = present(expiries);
    Ok(batch)
}

/// Reads `packed_rows` from the front.
struct Unpacker<'a> {
    packed: &'a [u8],
    at: usize,
}

impl<'a> Unpacker<'a> {
    /// The next `n` bytes, or where the form ended too soon.
    fn bytes(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], InsertError> {
        let start = self.at;
        let end = start
            .checked_add(n)
            .filter(|&end| end <= self.packed.len())
            .ok_or(InsertError::Packed { at: start, what })?;
        self.at = end;
        Ok(&self.packed[start..end])
    }

    fn fixed<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], InsertError> {
        let at = self.at;
        let bytes = self.bytes(N, what)?;
        bytes
            .try_into()
            .map_err(|_| InsertError::Packed { at, what })
    }

    /// A 4-byte big-endian length, then that many bytes.
    fn counted(&mut self, what: &'static str) -> Result<&'a [u8], InsertError> {
        let at = self.at;
        let len = i32::from_be_bytes(self.fixed(what)?);
        let len = usize::try_from(len).map_err(|_| InsertError::Packed { at, what })?;
        self.bytes(len, what)
    }
}

#[allow(clippy::too_many_arguments)]
fn insert_many(
    originator_node_ids: Option<Array<'_, i32>>,
    originator_sequence_ids: Option<Array<'_, i64>>,
    topics: Option<Array<'_, &[u8]>>,
    originator_envelopes: Option<Array<'_, &[u8]>>,
    payer_ids: Option<Array<'_, i32>>,
    gateway_times: Option<Array<'_, TimestampWithTimeZone>>,
    expiries: Option<Array<'_, i64>>,
) -> Result<i64, InsertError> {
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
    insert_batch(Batch {
        nodes: nodes.iter().collect(),
        seqs: seqs.iter().collect(),
        topics: topics.iter().collect(),
        envelopes: envelopes.iter().collect(),
        payers: payer_ids.map(|a| a.iter().collect()),
        times: gateway_times.map(|a| a.iter().collect()),
        expiries: expiries.map(|a| a.iter().collect()),
    })
}

/// A batch's columns, element by element as the caller gave them (a NULL element
/// is refused by [`insert_batch`]), all of one length; the optional ones may be
/// absent as a whole.
struct Batch<'a> {
    nodes: Vec<Option<i32>>,
    seqs: Vec<Option<i64>>,
    topics: Vec<Option<&'a [u8]>>,
    envelopes: Vec<Option<&'a [u8]>>,
    payers: Option<Vec<Option<i32>>>,
    times: Option<Vec<Option<TimestampWithTimeZone>>>,
    expiries: Option<Vec<Option<i64>>>,
}

/// Inserts a batch whose columns have one length (checked by the caller): the
/// body of both batch functions.
fn insert_batch(batch: Batch<'_>) -> Result<i64, InsertError> {
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
    if let Some(new) = write_direct(&locked, any_late, n >= BULK_ROWS, true, rows)? {
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
            execute(Plan::ManyLate, &args)
        }
        None => execute(Plan::Many, &args),
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
    for (routes, Flags { late, fresh }, row) in rows() {
        if writer.insert_meta(routes[0].leaf, &row, late, fresh)? {
            any_meta = true;
            if late {
                writer.insert_late(row.node, row.seq)?;
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
            }
        }
    }
    let rings = writer.rings_doorbell();
    writer.finish()?;
    if any_meta && rings {
        crate::store::outbox::ring_for_envelopes();
    }
    Ok(Some(new))
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use crate::testing::{band_names, int8, sqlstate_of};
    use pgrx::pg_sys;
    use pgrx::prelude::*;

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

#[cfg(test)]
mod packed_tests {
    use super::{decode_base64, unpack, InsertError};
    use base64::engine::general_purpose::STANDARD;
    use base64::Engine;

    /// `encode(bytes, 'base64')`: line breaks after every 76 characters.
    fn postgres_base64(bytes: &[u8]) -> String {
        let flat = STANDARD.encode(bytes);
        let lines: Vec<&str> = flat
            .as_bytes()
            .chunks(76)
            .map(|c| std::str::from_utf8(c).unwrap())
            .collect();
        lines.join("\n")
    }

    #[test]
    fn base64_decodes_with_and_without_line_breaks() {
        for len in [0usize, 1, 2, 3, 56, 57, 58, 114, 1000, 70_001] {
            let bytes: Vec<u8> = (0..len).map(|i| (i * 7 % 256) as u8).collect();
            assert_eq!(
                decode_base64(&postgres_base64(&bytes)).unwrap(),
                bytes,
                "{len}"
            );
            assert_eq!(
                decode_base64(&STANDARD.encode(&bytes)).unwrap(),
                bytes,
                "{len}"
            );
            // Line breaks elsewhere, CRLF and spaces: the slow path, same bytes.
            let odd: String = STANDARD
                .encode(&bytes)
                .chars()
                .enumerate()
                .flat_map(|(i, c)| {
                    let sep = if i % 5 == 4 {
                        Some(if i % 2 == 0 { '\n' } else { ' ' })
                    } else {
                        None
                    };
                    std::iter::once(c).chain(sep)
                })
                .collect();
            assert_eq!(decode_base64(&odd).unwrap(), bytes, "{len}");
            assert_eq!(
                decode_base64(&postgres_base64(&bytes).replace('\n', "\r\n")).unwrap(),
                bytes
            );
        }
        for bad in ["QUJD=RA==", "QUJ", "QU!D", "QUJD\nRA=\n=AAA"] {
            assert!(
                matches!(decode_base64(bad), Err(InsertError::Base64(_))),
                "{bad}"
            );
        }
    }

    /// A packed row: sequence id, topic, envelope, then the optional payer,
    /// gateway time (raw microseconds) and expiry.
    type Row<'a> = (
        i64,
        &'a [u8],
        &'a [u8],
        Option<i32>,
        Option<i64>,
        Option<i64>,
    );

    fn packed(rows: &[Row<'_>]) -> Vec<u8> {
        let mut out = Vec::new();
        for &(seq, topic, envelope, payer, time, expiry) in rows {
            out.extend(seq.to_be_bytes());
            out.extend((topic.len() as i32).to_be_bytes());
            out.extend(topic);
            out.extend((envelope.len() as i32).to_be_bytes());
            out.extend(envelope);
            let flags = u8::from(payer.is_some())
                | u8::from(time.is_some()) << 1
                | u8::from(expiry.is_some()) << 2;
            out.push(flags);
            out.extend(payer.map(i32::to_be_bytes).into_iter().flatten());
            out.extend(time.map(i64::to_be_bytes).into_iter().flatten());
            out.extend(expiry.map(i64::to_be_bytes).into_iter().flatten());
        }
        out
    }

    #[test]
    fn packed_rows_unpack_to_their_columns_or_say_where_they_end() {
        let rows: [Row<'_>; 3] = [
            (i64::MAX, b"t", b"", None, None, None),
            (-1, b"", b"\0\0", Some(-5), None, Some(i64::MIN)),
            (7, b"topic", b"envelope", None, Some(0), None),
        ];
        let bytes = packed(&rows);
        let batch = unpack(3, &bytes).unwrap();
        assert_eq!(batch.nodes, vec![Some(3); 3]);
        assert_eq!(batch.seqs, vec![Some(i64::MAX), Some(-1), Some(7)]);
        assert_eq!(
            batch.topics,
            vec![Some(&b"t"[..]), Some(&b""[..]), Some(&b"topic"[..])]
        );
        assert_eq!(
            batch.envelopes,
            vec![Some(&b""[..]), Some(&b"\0\0"[..]), Some(&b"envelope"[..])]
        );
        assert_eq!(batch.payers, Some(vec![None, Some(-5), None]));
        assert_eq!(batch.expiries, Some(vec![None, Some(i64::MIN), None]));
        let times = batch.times.as_ref().unwrap();
        assert!(times[0].is_none() && times[1].is_none() && times[2].is_some());
        // No optional value anywhere: the columns are absent.
        let first = packed(&rows[..1]);
        let plain = unpack(3, &first).unwrap();
        assert!(plain.payers.is_none() && plain.times.is_none() && plain.expiries.is_none());
        assert!(unpack(3, &[]).unwrap().nodes.is_empty());
        // Cut anywhere inside: an error naming the byte, never a panic.
        for cut in 1..bytes.len() {
            if cut == packed(&rows[..1]).len() || cut == packed(&rows[..2]).len() {
                continue; // whole rows
            }
            assert!(
                matches!(unpack(3, &bytes[..cut]), Err(InsertError::Packed { .. })),
                "{cut}"
            );
        }
        // Negative and too large lengths.
        for len in [-1i32, i32::MIN, i32::MAX] {
            let mut bad = packed(&rows[..1]);
            bad[8..12].copy_from_slice(&len.to_be_bytes());
            assert!(
                matches!(unpack(3, &bad), Err(InsertError::Packed { at: 8 | 12, .. })),
                "{len}"
            );
        }
        // Unknown flags, and a gateway time outside Postgres' range.
        let mut bad = packed(&rows[..1]);
        let flags = bad.len() - 1;
        bad[flags] = 8;
        assert!(matches!(unpack(3, &bad), Err(InsertError::Packed { .. })));
        let bad = packed(&[(1, b"t", b"e", None, Some(i64::MAX - 1), None)]);
        assert!(matches!(unpack(3, &bad), Err(InsertError::Packed { .. })));
    }
}
