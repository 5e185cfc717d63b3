//! Which indexes the index path may read: a usable btree on exactly the columns
//! of the range, without a predicate (the primary key, meta's topic index).

use super::*;

/// Whether the index path may read this open relation at all: a plain table
/// with a table access method (a partitioned or foreign table has none).
///
/// # Safety
/// `rel` is an open relation.
pub unsafe fn index_path_can_read(rel: pg_sys::Relation) -> bool {
    // SAFETY: the caller's promise.
    unsafe {
        (*(*rel).rd_rel).relkind as u8 == pg_sys::RELKIND_RELATION && !(*rel).rd_tableam.is_null()
    }
}

thread_local! {
    /// Each meta leaf's topic index, as [`topic_index`] found it: a read of
    /// topics opens a scan per entry and band, and looking the index up means
    /// opening every index of the leaf. An index's columns and predicate never
    /// change; whether it is usable does, so [`Scan::open`] checks that on the
    /// index it opens, and a remembered index the leaf no longer lists (dropped)
    /// is looked up again.
    pub(super) static TOPIC_INDEXES: std::cell::RefCell<std::collections::HashMap<Oid, Oid>> =
        std::cell::RefCell::new(std::collections::HashMap::new());
}

/// Whether an index may be read by the index path: a btree (the scans' keys and
/// the index-only steps of [`Seeker`] are btree's) that is valid (complete),
/// ready (kept up to date) and live.
///
/// # Safety
/// `index` is an open index.
pub(super) unsafe fn usable(index: pg_sys::Relation) -> bool {
    // SAFETY: as the caller guarantees; rd_index is its pg_index row.
    unsafe {
        let form = (*index).rd_index;
        (*(*index).rd_rel).relam == pg_sys::BTREE_AM_OID
            && !(*index).rd_indam.is_null()
            && (*form).indisvalid
            && (*form).indisready
            && (*form).indislive
    }
}

/// Whether the open index `index` of `heap` is on exactly `columns`, in order,
/// without a predicate.
///
/// # Safety
/// Both are open; `index` is an index of `heap`.
unsafe fn index_is_on(heap: pg_sys::Relation, index: pg_sys::Relation, columns: &[&str]) -> bool {
    // SAFETY: the caller's promise; indkey has indnatts entries, and indpred is
    // NULL in rd_indextuple for a non-partial index.
    unsafe {
        let form = (*index).rd_index;
        let keys = (*form).indkey.values.as_slice((*form).indnatts as usize);
        let wanted: Option<Vec<i16>> = columns
            .iter()
            .map(|c| column_number(heap, c).map(|n| n as i16))
            .collect();
        wanted.is_some_and(|wanted| keys == wanted.as_slice())
            && pg_sys::heap_attisnull(
                (*index).rd_indextuple,
                pg_sys::Anum_pg_index_indpred as i32,
                std::ptr::null_mut(),
            )
    }
}

/// Whether the open index `index` of `heap` serves the index path for a range
/// on `columns`: a usable btree on exactly those columns, without a predicate.
///
/// # Safety
/// Both are open; `index` is an index of `heap`.
pub unsafe fn index_serves(
    heap: pg_sys::Relation,
    index: pg_sys::Relation,
    columns: &[&str],
) -> bool {
    // SAFETY: the caller's promise.
    unsafe { usable(index) && index_is_on(heap, index, columns) }
}

/// The table's primary key if the index path can read it: a btree on exactly
/// `columns`; `InvalidOid` otherwise. Whether it is usable (valid, ready) is
/// checked by [`Scan::open_band`] on the index it opens; what an index is on
/// never changes, so it is looked at once per index and remembered.
///
/// # Safety
/// `heap` is an open relation.
pub unsafe fn primary_key_on(heap: pg_sys::Relation, columns: &[&str]) -> Oid {
    let lock = pg_sys::AccessShareLock as pg_sys::LOCKMODE;
    // SAFETY: the caller's promise; the primary key (if any) belongs to the open
    // table, is opened with the lock the scan takes anyway and closed again.
    unsafe {
        let oid = crate::pg::compat::primary_key_index(heap);
        if oid == pg_sys::InvalidOid {
            return oid;
        }
        let key = (oid, columns.len());
        let on = match KEYS_ON.with(|k| k.borrow().get(&key).copied()) {
            Some(on) => on,
            None => {
                let index = Rel::open_index(oid, lock);
                let index = index.as_ptr();
                let on = (*(*index).rd_rel).relam == pg_sys::BTREE_AM_OID
                    && index_is_on(heap, index, columns);
                KEYS_ON.with(|k| k.borrow_mut().insert(key, on));
                on
            }
        };
        if on {
            oid
        } else {
            pg_sys::InvalidOid
        }
    }
}

thread_local! {
    /// Whether a primary key (by oid, and the number of columns asked for) is a
    /// btree on the columns the index path keys it by, as [`primary_key_on`]
    /// found it.
    static KEYS_ON: std::cell::RefCell<std::collections::HashMap<(Oid, usize), bool>> =
        std::cell::RefCell::new(std::collections::HashMap::new());
}

/// The usable, non-partial btree index of `heap` on exactly `(topic,
/// originator_sequence_id)`, or `InvalidOid`.
///
/// # Safety
/// `heap` is an open relation.
pub unsafe fn topic_index(heap: pg_sys::Relation) -> Oid {
    // SAFETY: RelationGetIndexList returns a palloc'd list of the open heap's index
    // oids (from its relcache entry). Each index is opened with the lock the scan
    // will hold anyway and closed again.
    unsafe {
        let relid = (*heap).rd_id;
        let list = pg_sys::RelationGetIndexList(heap);
        if list.is_null() {
            return pg_sys::InvalidOid;
        }
        let len = (*list).length as usize;
        let cells = std::slice::from_raw_parts((*list).elements, len);
        let listed = |oid: Oid| cells.iter().any(|c| c.oid_value == oid);
        if let Some(known) = TOPIC_INDEXES.with(|c| c.borrow().get(&relid).copied()) {
            if listed(known) {
                pg_sys::list_free(list);
                return known;
            }
        }
        let lock = pg_sys::AccessShareLock as pg_sys::LOCKMODE;
        let mut found = pg_sys::InvalidOid;
        for cell in cells {
            let oid = cell.oid_value;
            let matches = index_serves(heap, Rel::open_index(oid, lock).as_ptr(), TOPIC_KEY);
            if matches {
                found = oid;
                break;
            }
        }
        pg_sys::list_free(list);
        if found != pg_sys::InvalidOid {
            TOPIC_INDEXES.with(|c| c.borrow_mut().insert(relid, found));
        }
        found
    }
}

/// Whether the index path can read the open relation (see
/// [`index_path_can_read`]).
pub fn can_read(rel: &Rel) -> bool {
    // SAFETY: the relation is open while the guard lives.
    unsafe { index_path_can_read(rel.as_ptr()) }
}

/// Whether the table's primary key is a btree on exactly `columns` that the
/// index path may read.
pub fn primary_key_serves(rel: &Rel, columns: &[&str]) -> bool {
    // SAFETY: the relation is open while the guard lives.
    let pk = unsafe { crate::pg::compat::primary_key_index(rel.as_ptr()) };
    pk != pg_sys::InvalidOid && index_serves_rel(rel, pk, columns)
}

/// Whether one of the table's indexes is a btree on exactly `columns` that
/// the index path may read.
pub fn some_index_serves(rel: &Rel, columns: &[&str]) -> bool {
    // SAFETY: the relation is open while the guard lives; the list is this
    // backend's copy, freed here after its oids were read.
    let indexes: Vec<pg_sys::Oid> = unsafe {
        let list = pg_sys::RelationGetIndexList(rel.as_ptr());
        if list.is_null() {
            return false;
        }
        let oids = std::slice::from_raw_parts((*list).elements, (*list).length as usize)
            .iter()
            .map(|cell| cell.oid_value)
            .collect();
        pg_sys::list_free(list);
        oids
    };
    indexes
        .into_iter()
        .any(|index| index_serves_rel(rel, index, columns))
}

fn index_serves_rel(rel: &Rel, index: pg_sys::Oid, columns: &[&str]) -> bool {
    Rel::reference(index).is_some_and(|index| {
        // SAFETY: both are open while the guards live; `index` is one of
        // this table's indexes.
        unsafe { crate::pg::scan::index_serves(rel.as_ptr(), index.as_ptr(), columns) }
    })
}
