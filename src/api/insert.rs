//! The insert functions' SQL entry points: `insert_gateway_envelope`,
//! `insert_gateway_envelopes` and their packed forms for `pg_envelopes_router`,
//! each refusing at once where the transaction may not write, then handing the
//! rows to the write path ([`crate::store::write`]).

use super::packed;
use crate::error::OrRaise;
use crate::store::partition;
use crate::store::write::{self, Batch, InsertError};
use pgrx::datum::TimestampWithTimeZone;
use pgrx::prelude::*;

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
            write::insert_one(
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
                None,
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

/// `insert_gateway_envelopes`, returning the key of each row that was new, in
/// key order: a key already stored, or repeated in the batch after its first
/// occurrence, is not returned. A caller that charges for what it stored does
/// so for exactly these keys in the same statement, whatever other sessions
/// insert at the same time. Same arguments, checks and errors.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[allow(clippy::too_many_arguments, clippy::type_complexity)]
fn insert_gateway_envelopes_keys(
    originator_node_ids: Option<Array<'_, i32>>,
    originator_sequence_ids: Option<Array<'_, i64>>,
    topics: Option<Array<'_, &[u8]>>,
    originator_envelopes: Option<Array<'_, &[u8]>>,
    payer_ids: default!(Option<Array<'_, i32>>, "NULL"),
    gateway_times: default!(Option<Array<'_, TimestampWithTimeZone>>, "NULL"),
    expiries: default!(Option<Array<'_, i64>>, "NULL"),
) -> TableIterator<
    'static,
    (
        name!(originator_node_id, i32),
        name!(originator_sequence_id, i64),
    ),
> {
    let mut keys = Vec::new();
    crate::pg::xact::check_writable("insert_gateway_envelopes_keys")
        .map_err(InsertError::from)
        .and_then(|()| {
            insert_many(
                Some(&mut keys),
                originator_node_ids,
                originator_sequence_ids,
                topics,
                originator_envelopes,
                payer_ids,
                gateway_times,
                expiries,
            )
        })
        .or_raise();
    keys.sort_unstable(); // the SQL path returns them in its join's order
    TableIterator::new(keys)
}

#[allow(clippy::too_many_arguments)]
fn insert_many(
    keys: Option<&mut Vec<(i32, i64)>>,
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
    write::insert_batch(
        Batch {
            nodes: nodes.iter().collect(),
            seqs: seqs.iter().collect(),
            topics: topics.iter().collect(),
            envelopes: envelopes.iter().collect(),
            payers: payer_ids.map(|a| a.iter().collect()),
            times: gateway_times.map(|a| a.iter().collect()),
            expiries: expiries.map(|a| a.iter().collect()),
        },
        keys,
    )
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
    let packed = packed::decode_base64(packed.ok_or(InsertError::Null("packed_rows"))?)?;
    write::insert_batch(packed::unpack(node, &packed)?, None)
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
    let packed = packed::decode_base64(packed.ok_or(InsertError::Null("packed_row"))?)?;
    let row = packed::unpack(node, &packed)?;
    if row.nodes.len() != 1 {
        return Err(InsertError::Packed {
            at: 0,
            what: "exactly one row",
        });
    }
    write::insert_one(
        row.nodes[0],
        row.seqs[0],
        row.topics[0],
        row.envelopes[0],
        packed::first(&row.payers),
        packed::first(&row.times),
        packed::first(&row.expiries),
    )
}
