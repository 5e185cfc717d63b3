//! Relations opened for a while and closed when the guard goes out of scope, so
//! no path (an early return, an error raised through `?`) leaves one open.

use pgrx::pg_sys;

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
