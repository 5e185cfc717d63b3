//! Relations opened for a while and closed when the guard goes out of scope, so
//! no path (an early return, an error raised through `?`) leaves one open.

use pgrx::pg_sys::{self, Oid};

/// An open relation: with a lock ([`Rel::open`], [`Rel::open_index`]), closed with the lock mode it was opened with, or a
/// relcache reference without a lock ([`Rel::reference`]), given back.
pub struct Rel {
    rel: pg_sys::Relation,
    close: Close,
}

enum Close {
    /// `relation_close` with this mode (`NoLock` keeps the lock until the
    /// transaction ends).
    Relation(pg_sys::LOCKMODE),
    /// `index_close` with this mode.
    Index(pg_sys::LOCKMODE),
    /// `RelationClose`: a reference, no lock.
    Reference,
}

impl Rel {
    /// Opens a table, view or partitioned table with `lock` (raising an ERROR
    /// when it does not exist); closed with the same mode.
    pub fn open(relid: pg_sys::Oid, lock: pg_sys::LOCKMODE) -> Rel {
        // SAFETY: table_open raises an ERROR for a missing relation or an index;
        // the relation stays open (and locked) until closed in drop.
        let rel = unsafe { pg_sys::table_open(relid, lock) };
        Rel {
            rel,
            close: Close::Relation(lock),
        }
    }

    /// Opens an index with `lock`; closed with the same mode.
    pub fn open_index(relid: pg_sys::Oid, lock: pg_sys::LOCKMODE) -> Rel {
        // SAFETY: index_open raises an ERROR when the relation is missing or not
        // an index.
        let rel = unsafe { pg_sys::index_open(relid, lock) };
        Rel {
            rel,
            close: Close::Index(lock),
        }
    }

    /// A relcache reference without a lock (`RelationIdGetRelation`); `None`
    /// when the relation does not exist.
    pub fn reference(relid: pg_sys::Oid) -> Option<Rel> {
        // SAFETY: builds (or finds) the relcache entry and takes a reference;
        // NULL when the relation is gone.
        let rel = unsafe { pg_sys::RelationIdGetRelation(relid) };
        // Not `then_some`: it would build (and drop, closing NULL) a guard for a
        // relation that is gone.
        if rel.is_null() {
            None
        } else {
            Some(Rel {
                rel,
                close: Close::Reference,
            })
        }
    }

    /// The relation, valid while the guard lives.
    pub fn as_ptr(&self) -> pg_sys::Relation {
        self.rel
    }
}

/// What a table is, as the direct paths need to know it (see [`Rel::table_facts`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableFacts {
    /// `pg_class.relkind`.
    pub kind: u8,
    /// Its table access method.
    pub access_method: Oid,
}

impl Rel {
    /// The relation's kind and access method.
    pub fn table_facts(&self) -> TableFacts {
        // SAFETY: the relation is open (or referenced) while self lives; its
        // pg_class form is read.
        unsafe {
            let form = (*self.rel).rd_rel;
            TableFacts {
                kind: (*form).relkind as u8,
                access_method: (*form).relam,
            }
        }
    }

    /// The name of the relation's table access method (its oid when it has
    /// none), from the syscache.
    pub fn access_method_name(&self) -> String {
        let access_method = self.table_facts().access_method;
        // SAFETY: get_am_name returns a palloc'd copy of the name, or NULL; it
        // is copied here.
        unsafe {
            let name = pg_sys::get_am_name(access_method);
            if name.is_null() {
                access_method.to_u32().to_string()
            } else {
                std::ffi::CStr::from_ptr(name)
                    .to_string_lossy()
                    .into_owned()
            }
        }
    }

    /// Whether the relation has any trigger.
    pub fn has_triggers(&self) -> bool {
        // SAFETY: the relation is open while self lives.
        unsafe { !(*self.rel).trigdesc.is_null() }
    }

    /// Whether row security is enabled on the table, and whether it is forced
    /// on its owner too.
    pub fn row_security(&self) -> (bool, bool) {
        // SAFETY: the relation is open while self lives.
        unsafe {
            let form = (*self.rel).rd_rel;
            ((*form).relrowsecurity, (*form).relforcerowsecurity)
        }
    }

    /// Whether the table has a CHECK constraint or a stored generated column.
    pub fn has_checks_or_generated(&self) -> bool {
        // SAFETY: the relation is open while self lives; constr may be NULL.
        unsafe {
            let constr = (*(*self.rel).rd_att).constr;
            !constr.is_null() && ((*constr).num_check > 0 || (*constr).has_generated_stored)
        }
    }

    /// Whether the table's columns are exactly `expected`, in order: `(name,
    /// type, may be NULL)`, none dropped, and a column that may be NULL not
    /// declared NOT NULL.
    pub fn columns_are(&self, expected: &[(&str, Oid, bool)]) -> bool {
        // SAFETY: the relation is open while self lives; its descriptor has
        // natts attributes, and each name is NUL-terminated.
        unsafe {
            let desc = (*self.rel).rd_att;
            if usize::try_from((*desc).natts).ok() != Some(expected.len()) {
                return false;
            }
            crate::pg::compat::attributes(desc)
                .iter()
                .zip(expected)
                .all(|(attr, (name, typid, nullable))| {
                    !attr.attisdropped
                        && attr.atttypid == *typid
                        && !(*nullable && attr.attnotnull)
                        && std::ffi::CStr::from_ptr(attr.attname.data.as_ptr()).to_bytes()
                            == name.as_bytes()
                })
        }
    }

    /// Calls `f` with each trigger's name, `tgtype` and `tgenabled`.
    pub fn for_each_trigger(&self, mut f: impl FnMut(&std::ffi::CStr, i16, u8)) {
        // SAFETY: the trigger descriptor belongs to the relcache entry, read
        // while the relation is open; it holds numtriggers triggers, each with
        // a NUL-terminated name.
        unsafe {
            let desc = (*self.rel).trigdesc;
            if desc.is_null() {
                return;
            }
            let count = usize::try_from((*desc).numtriggers).unwrap_or(0);
            for trigger in std::slice::from_raw_parts((*desc).triggers, count) {
                f(
                    std::ffi::CStr::from_ptr(trigger.tgname),
                    trigger.tgtype,
                    trigger.tgenabled as u8,
                );
            }
        }
    }

    /// Calls `f` with the `ev_enabled` of each INSERT rule of the relation.
    pub fn for_each_insert_rule(&self, mut f: impl FnMut(u8)) {
        // SAFETY: rd_rules belongs to the relcache entry, read while the
        // relation is open, and holds numLocks rules.
        unsafe {
            let rules = (*self.rel).rd_rules;
            if rules.is_null() {
                return;
            }
            let count = usize::try_from((*rules).numLocks).unwrap_or(0);
            for &rule in std::slice::from_raw_parts((*rules).rules, count) {
                if (*rule).event == pg_sys::CmdType::CMD_INSERT {
                    f((*rule).enabled as u8);
                }
            }
        }
    }

    /// The relation's name (unqualified).
    pub fn name(&self) -> String {
        // SAFETY: the relation is open while self lives; relname is
        // NUL-terminated.
        unsafe {
            std::ffi::CStr::from_ptr((*(*self.rel).rd_rel).relname.data.as_ptr())
                .to_string_lossy()
                .into_owned()
        }
    }

    /// Gives the open relation up without closing it: the caller closes it
    /// (`table_close` with the same lock mode) or leaves it to the end of the
    /// transaction.
    pub fn into_raw(self) -> pg_sys::Relation {
        let rel = self.rel;
        std::mem::forget(self);
        rel
    }

    /// The relation's owner.
    pub fn owner(&self) -> Oid {
        // SAFETY: the relation is open while self lives.
        unsafe { (*(*self.rel).rd_rel).relowner }
    }

    /// Whether the relation is a view with `security_invoker` set.
    pub fn is_security_invoker_view(&self) -> bool {
        // SAFETY: the relation is open while self lives; rd_options of a view
        // is its ViewOptions (or NULL when it has none).
        unsafe {
            let options = (*self.rel).rd_options.cast::<pg_sys::ViewOptions>();
            (*(*self.rel).rd_rel).relkind as u8 == pg_sys::RELKIND_VIEW
                && !options.is_null()
                && (*options).security_invoker
        }
    }
}

impl Drop for Rel {
    fn drop(&mut self) {
        // SAFETY: the relation was opened (or referenced) by one of the
        // constructors above and is closed once, the way it was opened.
        unsafe {
            match self.close {
                Close::Relation(lock) => pg_sys::relation_close(self.rel, lock),
                Close::Index(lock) => pg_sys::index_close(self.rel, lock),
                Close::Reference => pg_sys::RelationClose(self.rel),
            }
        }
    }
}

/// The partitions of `parent`, a table partitioned by range on one `bigint`
/// column, as Postgres' own partition descriptor holds them: `(lower, upper,
/// oid)`, `None` standing for MINVALUE (lower) and MAXVALUE (upper). A DEFAULT
/// partition is left out; so is everything when `parent` is not partitioned by
/// range. Reading the descriptor (built once per change by the relcache, which
/// ATTACH needs anyway) spares deparsing each partition's bound from the catalog,
/// which cost as much again per partition each time the list was read.
pub fn range_partitions(parent: pg_sys::Oid) -> Vec<(Option<i64>, Option<i64>, pg_sys::Oid)> {
    let rel = Rel::open(parent, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
    let mut out = Vec::new();
    // SAFETY: the relation is open and locked while `rel` lives, so its relcache
    // entry, partition descriptor and bound info stay valid while read here; the
    // descriptor's arrays hold `nparts` oids, and the bound info `ndatums` datum
    // and kind arrays (one column each) and `nindexes` indexes, as Postgres builds
    // them for range partitioning (partbounds.h).
    unsafe {
        let r = rel.as_ptr();
        if (*(*r).rd_rel).relkind as u8 != pg_sys::RELKIND_PARTITIONED_TABLE {
            return out;
        }
        let desc = pg_sys::RelationGetPartitionDesc(r, false);
        if desc.is_null() || (*desc).nparts == 0 || (*desc).boundinfo.is_null() {
            return out;
        }
        let info = &*(*desc).boundinfo;
        if !crate::pg::compat::is_range_strategy(info) {
            return out;
        }
        let oids = crate::pg::snapshot::raw_slice((*desc).oids, (*desc).nparts as usize);
        let n = info.ndatums as usize;
        let datums = crate::pg::snapshot::raw_slice(info.datums, n);
        let kinds = crate::pg::snapshot::raw_slice(info.kind, n);
        let indexes = crate::pg::snapshot::raw_slice(info.indexes, info.nindexes as usize);
        let bound = |i: usize| -> Option<i64> {
            let kind = *kinds[i];
            (kind == pg_sys::PartitionRangeDatumKind::PARTITION_RANGE_DATUM_VALUE)
                .then(|| (*datums[i]).value() as i64)
        };
        // indexes[i] is the partition whose range ends at datums[i] (and starts
        // at datums[i - 1]); -1 where no partition does.
        for (i, &index) in indexes.iter().enumerate().take(n).skip(1) {
            let Ok(p) = usize::try_from(index) else {
                continue;
            };
            if let Some(&oid) = oids.get(p) {
                out.push((bound(i - 1), bound(i), oid));
            }
        }
    }
    out
}
