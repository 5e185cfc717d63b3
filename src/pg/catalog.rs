//! Catalog lookups by name through the syscache: what exists in this database
//! as of the latest processed invalidations (see [`crate::pg::invalidation`]).

use pgrx::pg_sys::{self, Oid};
use std::ffi::CStr;

/// The oid of schema `name`, `None` when there is none.
pub fn namespace(name: &CStr) -> Option<Oid> {
    // SAFETY: a valid NUL-terminated name; with missing_ok the lookup returns
    // InvalidOid instead of raising an error.
    let oid = unsafe { pg_sys::get_namespace_oid(name.as_ptr(), true) };
    (oid != pg_sys::InvalidOid).then_some(oid)
}

/// The oid of relation `name` in schema `namespace`, `None` when there is none.
pub fn relation_in(namespace: Oid, name: &CStr) -> Option<Oid> {
    // SAFETY: a valid NUL-terminated name and any namespace oid; the syscache
    // lookup returns InvalidOid when the relation does not exist.
    let oid = unsafe { pg_sys::get_relname_relid(name.as_ptr(), namespace) };
    (oid != pg_sys::InvalidOid).then_some(oid)
}

/// The oid of relation `name` in schema `schema`, `None` when either is missing.
pub fn relation(schema: &CStr, name: &CStr) -> Option<Oid> {
    relation_in(namespace(schema)?, name)
}

/// Whether relation `rel` has a column `name` (a missing relation has none).
pub fn has_column(rel: Oid, name: &CStr) -> bool {
    // SAFETY: any oid and a valid NUL-terminated name; get_attnum returns
    // InvalidAttrNumber (0) when the relation or the column does not exist.
    unsafe { pg_sys::get_attnum(rel, name.as_ptr()) > 0 }
}

/// The schema of relation `rel`, `None` when the relation does not exist.
pub fn namespace_of(rel: Oid) -> Option<Oid> {
    // SAFETY: any oid; the syscache lookup returns InvalidOid when it is missing.
    let oid = unsafe { pg_sys::get_rel_namespace(rel) };
    (oid != pg_sys::InvalidOid).then_some(oid)
}

/// The last value drawn from sequence `relid` by any session, `None` when none
/// was drawn yet (`pg_sequence_last_value`). The caller must be allowed to read
/// the sequence (Postgres raises 42501 otherwise).
pub fn sequence_last_value(relid: Oid) -> Option<i64> {
    use pgrx::IntoDatum;
    // SAFETY: the built-in pg_sequence_last_value(regclass) called directly with
    // one non-NULL oid datum; it raises an ERROR for an oid that is not a
    // sequence, and returns NULL when nothing was drawn.
    unsafe {
        pgrx::fcinfo::direct_function_call::<i64>(
            pg_sys::pg_sequence_last_value,
            &[relid.into_datum()],
        )
    }
}

/// The next value of sequence `relid` (`nextval`), `None` only if the built-in
/// returned NULL, which it does not.
pub fn sequence_next_value(relid: Oid) -> Option<i64> {
    use pgrx::IntoDatum;
    // SAFETY: the built-in nextval_oid(regclass) called directly with one
    // non-NULL oid datum; it raises an ERROR for a missing sequence or a caller
    // without USAGE or UPDATE on it.
    unsafe { pgrx::fcinfo::direct_function_call::<i64>(pg_sys::nextval_oid, &[relid.into_datum()]) }
}
