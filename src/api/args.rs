//! Arguments of the SQL functions: arrays read element by element (a NULL
//! element refused with its index), required values, limits, lengths that must
//! match, and the cursors of the read functions, each refusal with its SQLSTATE.

use crate::store::read::select::SelectError;
use crate::store::read::shapes::{Entries, ShapeError};
use pgrx::prelude::*;
use std::collections::{BTreeSet, HashMap};

/// Reads the elements of an array argument, rejecting NULL elements.
pub fn elements<T>(
    name: &'static str,
    array: Option<Array<'_, T>>,
) -> Result<Option<Vec<T>>, SelectError>
where
    for<'a> T: Copy + FromDatum + pgrx::datum::UnboxDatum<As<'a> = T> + 'static,
{
    let Some(array) = array else { return Ok(None) };
    array
        .iter()
        .enumerate()
        .map(|(i, v)| v.ok_or(SelectError::NullElement { name, index: i + 1 }))
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

/// A `bytea[]` argument's elements copied out, rejecting NULL elements.
pub fn bytea_elements(
    name: &'static str,
    array: Option<Array<'_, &[u8]>>,
) -> Result<Option<Vec<Vec<u8>>>, SelectError> {
    let Some(array) = array else { return Ok(None) };
    array
        .iter()
        .enumerate()
        .map(|(i, t)| {
            t.map(<[u8]>::to_vec)
                .ok_or(SelectError::NullElement { name, index: i + 1 })
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

/// A required, non-negative limit argument.
pub fn limit(name: &'static str, value: Option<i32>) -> Result<usize, SelectError> {
    match value {
        None => Err(SelectError::Null(name)),
        Some(value) if value < 0 => Err(SelectError::Negative { name, value }),
        Some(value) => Ok(value as usize),
    }
}

/// The cursor as a map; absent originators read as 0.
pub fn cursor_map(nodes: Vec<i32>, seqs: Vec<i64>) -> Result<HashMap<i32, i64>, SelectError> {
    if nodes.len() != seqs.len() {
        return Err(SelectError::CursorLength {
            nodes: nodes.len(),
            seqs: seqs.len(),
        });
    }
    let mut cursor = HashMap::with_capacity(nodes.len());
    for (node, seq) in nodes.into_iter().zip(seqs) {
        if cursor.insert(node, seq).is_some() {
            return Err(SelectError::DuplicateCursor(node));
        }
    }
    Ok(cursor)
}

/// A required array whose elements must not be NULL.
pub fn required<T>(name: &'static str, array: Option<Array<'_, T>>) -> Result<Vec<T>, ShapeError>
where
    for<'a> T: Copy + FromDatum + pgrx::datum::UnboxDatum<As<'a> = T> + 'static,
{
    elements(name, array)?.ok_or(ShapeError::Null(name))
}

/// A required `bytea[]` whose elements must not be NULL, copied out.
pub fn topics_of(
    name: &'static str,
    array: Option<Array<'_, &[u8]>>,
) -> Result<Vec<Vec<u8>>, ShapeError> {
    bytea_elements(name, array)?.ok_or(ShapeError::Null(name))
}

pub fn same_length(
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

/// The cursor entries of the parallel arrays, grouped by originator; a repeated
/// (topic, originator) pair is an error.
pub fn cursor_entries(
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
