//! Scan keys for a [`Range`] on the index columns, and columns found by name
//! in a relation or tuple descriptor.

use super::Range;
use pgrx::pg_sys::{self, Datum};
use std::ffi::CStr;

fn key(attno: i16, strategy: u32, procedure: u32, argument: Datum) -> pg_sys::ScanKeyData {
    let mut key = pg_sys::ScanKeyData::default();
    // SAFETY: ScanKeyInit fills the struct it is given; the procedure is a built-in
    // btree comparison function of the argument's type.
    unsafe {
        pg_sys::ScanKeyInit(
            &mut key,
            attno,
            strategy as pg_sys::StrategyNumber,
            pg_sys::Oid::from(procedure),
            argument,
        );
    }
    key
}

/// Scan keys on the index columns: (node, seq) for envelope leaves, (id) for
/// feeds, (topic, seq) for topic scans. An open end (`after` = `i64::MIN`,
/// `upto` = `i64::MAX`) gets no key: btree checks every key on every tuple of
/// each page it reads, through the function manager.
pub(super) fn keys_for(range: Range) -> Vec<pg_sys::ScanKeyData> {
    let eq = pg_sys::BTEqualStrategyNumber;
    let gt = pg_sys::BTGreaterStrategyNumber;
    let le = pg_sys::BTLessEqualStrategyNumber;
    let (first, column, after, upto) = match range {
        // A band leaf holds one originator only (it is a partition of that
        // originator's LIST partition): with both ends open the node key would
        // only be checked on every tuple read.
        Range::Envelope {
            after: i64::MIN,
            upto: i64::MAX,
            ..
        } => return Vec::new(),
        Range::Envelope { node, after, upto } => (
            Some(key(1, eq, pg_sys::F_INT4EQ, Datum::from(node))),
            2,
            after,
            upto,
        ),
        Range::Id { after, upto } => (None, 1, after, upto),
        Range::Key { node, seq } => {
            return vec![
                key(1, eq, pg_sys::F_INT4EQ, Datum::from(node)),
                key(2, eq, pg_sys::F_INT8EQ, Datum::from(seq)),
            ]
        }
        Range::Topic { topic, after, upto } => {
            (Some(key(1, eq, pg_sys::F_BYTEAEQ, topic)), 2, after, upto)
        }
    };
    let mut keys: Vec<_> = first.into_iter().collect();
    if after != i64::MIN {
        keys.push(key(column, gt, pg_sys::F_INT8GT, Datum::from(after)));
    }
    if upto != i64::MAX {
        keys.push(key(column, le, pg_sys::F_INT8LE, Datum::from(upto)));
    }
    keys
}

/// Attribute number of column `name` in the open relation `rel`, if it has one
/// (by name, so tables whose column order differs from the root's read right).
pub(super) fn column_number(rel: pg_sys::Relation, name: &str) -> Option<i32> {
    // SAFETY: rel is open; rd_att is its tuple descriptor with natts entries.
    unsafe { desc_column((*rel).rd_att, name) }
}

/// Attribute number of the live column `name` of `desc`.
///
/// # Safety
/// `desc` is a valid tuple descriptor.
pub(super) unsafe fn desc_column(desc: pg_sys::TupleDesc, name: &str) -> Option<i32> {
    // SAFETY: the caller's promise; attrs has natts entries.
    unsafe {
        let attrs = crate::pg::compat::attributes(desc);
        attrs.iter().position(|a| {
            !a.attisdropped && CStr::from_ptr(a.attname.data.as_ptr()).to_bytes() == name.as_bytes()
        })
    }
    .map(|i| i as i32 + 1)
}

/// The position of column `name` among the live columns of `desc`: its
/// attribute number in a `SELECT *` of the table.
///
/// # Safety
/// `desc` is a valid tuple descriptor.
pub(super) unsafe fn live_column_number(desc: pg_sys::TupleDesc, name: &str) -> Option<i32> {
    // SAFETY: the caller's promise; attrs has natts entries.
    unsafe {
        let attrs = crate::pg::compat::attributes(desc);
        attrs
            .iter()
            .filter(|a| !a.attisdropped)
            .position(|a| CStr::from_ptr(a.attname.data.as_ptr()).to_bytes() == name.as_bytes())
    }
    .map(|i| i as i32 + 1)
}

/// `schema.table` of an open relation, each part quoted, for SQL text.
///
/// # Safety
/// `rel` is an open relation.
pub(super) unsafe fn quoted_name(rel: pg_sys::Relation) -> String {
    // SAFETY: the caller's promise; the namespace name is a palloc'd copy (NULL
    // only for a namespace dropped under an open relation, which its lock
    // prevents), the relation name is in the relcache entry.
    unsafe {
        let form = (*rel).rd_rel;
        let nsp = pg_sys::get_namespace_name((*form).relnamespace);
        let nsp = if nsp.is_null() {
            String::new()
        } else {
            CStr::from_ptr(nsp).to_string_lossy().into_owned()
        };
        let name = CStr::from_ptr((*form).relname.data.as_ptr()).to_string_lossy();
        format!(
            "{}.{}",
            pgrx::spi::quote_identifier(&nsp),
            pgrx::spi::quote_identifier(&*name)
        )
    }
}
