//! Catalog lookups by name through the syscache: what exists in this database
//! as of the latest processed invalidations (see [`crate::pg::invalidation`]).

use crate::pg::rel::Rel;
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

/// pg_inherits (stable catalog oids and column numbers of Postgres 15).
const INHERITS_RELATION_ID: u32 = 2611;
const INHERITS_RELID_SEQNO_INDEX_ID: u32 = 2680;
const INHERITS_PARENT_INDEX_ID: u32 = 2187;
const ANUM_PG_INHERITS_INHRELID: pg_sys::AttrNumber = 1;
const ANUM_PG_INHERITS_INHPARENT: pg_sys::AttrNumber = 2;

/// The relations attached to (or inheriting from) `parent`, read from
/// pg_inherits with the latest snapshot. Not from the relcache's partition
/// descriptor: right after another session committed an ATTACH, a cached
/// descriptor can still lack the new partition (the new pg_inherits row sends no
/// catalog-cache invalidation) while the syscache already knows the new table.
pub fn inheritors(parent: Oid) -> Vec<Oid> {
    inherits_rows(INHERITS_PARENT_INDEX_ID, ANUM_PG_INHERITS_INHPARENT, parent)
        .into_iter()
        .map(|(child, _)| child)
        .collect()
}

/// The relations `child` is attached to (one for a partition), by the same
/// latest-snapshot read of pg_inherits: one index probe on the child.
pub fn inherited_from(child: Oid) -> Vec<Oid> {
    inherits_rows(
        INHERITS_RELID_SEQNO_INDEX_ID,
        ANUM_PG_INHERITS_INHRELID,
        child,
    )
    .into_iter()
    .map(|(_, parent)| parent)
    .collect()
}

/// `(inhrelid, inhparent)` of the pg_inherits rows whose `attnum` equals `key`,
/// scanned through `index` with the latest snapshot (the catalog snapshot in
/// parallel mode).
fn inherits_rows(index: u32, attnum: pg_sys::AttrNumber, key: Oid) -> Vec<(Oid, Oid)> {
    let mut rows = Vec::new();
    // SAFETY: the standard system-catalog index scan: the catalog is open (with
    // AccessShareLock) while `catalog` lives, the latest snapshot is registered for the scan
    // and unregistered after it (with a NULL one systable_beginscan registers and
    // systable_endscan unregisters the catalog snapshot), and each returned tuple
    // is a pg_inherits row whose first two fixed-width, never-null columns are
    // inhrelid and inhparent (Oids), read before the next call.
    let catalog = Rel::open(
        Oid::from(INHERITS_RELATION_ID),
        pg_sys::AccessShareLock as pg_sys::LOCKMODE,
    );
    unsafe {
        let rel = catalog.as_ptr();
        let mut scan_key = pg_sys::ScanKeyData::default();
        pg_sys::ScanKeyInit(
            &mut scan_key,
            attnum,
            pg_sys::BTEqualStrategyNumber as pg_sys::StrategyNumber,
            Oid::from(pg_sys::F_OIDEQ),
            pg_sys::Datum::from(key),
        );
        // In parallel mode (a parallel worker, or a leader running a Gather, where
        // a query's envelope_of may load bands) Postgres refuses a new latest
        // snapshot; the catalog snapshot (NULL here: systable_beginscan takes and
        // registers it) is what Postgres' own partition lookups read there, and it
        // is renewed by every catalog invalidation taken in.
        let parallel = pg_sys::IsInParallelMode();
        let snapshot = if parallel {
            std::ptr::null_mut()
        } else {
            pg_sys::RegisterSnapshot(pg_sys::GetLatestSnapshot())
        };
        let scan =
            pg_sys::systable_beginscan(rel, Oid::from(index), true, snapshot, 1, &mut scan_key);
        loop {
            let tuple = pg_sys::systable_getnext(scan);
            if tuple.is_null() {
                break;
            }
            let header = (*tuple).t_data;
            let fields = (header as *const u8).add((*header).t_hoff as usize) as *const Oid;
            rows.push((fields.read_unaligned(), fields.add(1).read_unaligned()));
        }
        pg_sys::systable_endscan(scan);
        if !parallel {
            pg_sys::UnregisterSnapshot(snapshot);
        }
    }
    drop(catalog);
    rows
}

/// `pg_get_expr(relpartbound, relid)` of a partition, from the syscache.
pub fn partition_bound(relid: Oid) -> Option<String> {
    // SAFETY: the tuple is released before returning; SysCacheGetAttr reads a
    // column of that valid tuple; pg_get_expr copies what it needs into a new text.
    unsafe {
        let tuple = pg_sys::SearchSysCache1(
            pg_sys::SysCacheIdentifier::RELOID as i32,
            pg_sys::Datum::from(relid),
        );
        if tuple.is_null() {
            return None;
        }
        let mut isnull = false;
        let bound = pg_sys::SysCacheGetAttr(
            pg_sys::SysCacheIdentifier::RELOID as i32,
            tuple,
            pg_sys::Anum_pg_class_relpartbound as pg_sys::AttrNumber,
            &mut isnull,
        );
        let text = if isnull {
            None
        } else {
            pgrx::fcinfo::direct_function_call::<String>(
                pg_sys::pg_get_expr,
                &[Some(bound), Some(pg_sys::Datum::from(relid))],
            )
        };
        pg_sys::ReleaseSysCache(tuple);
        text
    }
}

/// The kind (`pg_class.relkind`) of relation `rel`, `None` when it is gone.
pub fn relkind(rel: Oid) -> Option<u8> {
    // SAFETY: any oid; get_rel_relkind returns '\0' for a relation that is gone.
    let kind = unsafe { pg_sys::get_rel_relkind(rel) } as u8;
    (kind != 0).then_some(kind)
}
