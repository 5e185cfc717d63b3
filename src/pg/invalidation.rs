//! Catalog invalidation: taking in what other sessions committed to the catalog,
//! and hearing about relations that changed.
//!
//! A backend's caches (the relcache, the syscache and the extension's own
//! partition cache) follow other sessions' catalog changes only when it
//! processes the invalidation messages they sent; Postgres does that when it
//! takes a lock, and [`accept`] does it on purpose where the extension must see
//! the latest catalog before it looks (a band another session created, a
//! privilege revoked since the last statement).

use pgrx::pg_sys::{self, Oid};
use std::sync::OnceLock;

/// Processes the pending invalidation messages now.
pub fn accept() {
    // SAFETY: plain call into the invalidation machinery, no arguments; it may
    // run the registered callbacks, which must not raise (see `on_relation`).
    unsafe { pg_sys::AcceptInvalidationMessages() };
}

/// The function told about each relcache invalidation (see [`on_relation`]).
static ON_RELATION: OnceLock<fn(Oid)> = OnceLock::new();

/// Relcache invalidation callback: hands the relation's oid (`InvalidOid` when
/// every relation may have changed) to the registered function.
unsafe extern "C-unwind" fn relcache_callback(_arg: pg_sys::Datum, relid: Oid) {
    if let Some(f) = ON_RELATION.get() {
        f(relid);
    }
}

/// Has `f` told the oid of every relation whose relcache entry is invalidated:
/// attached, detached, dropped, altered, by this session or, once their messages
/// are processed, by others. `f` runs inside Postgres' invalidation processing
/// and must not raise an error or run SQL. Called once per process, from
/// `_PG_init`.
pub fn on_relation(f: fn(Oid)) {
    if ON_RELATION.set(f).is_err() {
        return; // registered already
    }
    // SAFETY: called from _PG_init on the main thread; the callback is a plain
    // function with the signature Postgres expects and lives for the whole
    // process, as a loaded extension library does.
    unsafe {
        pg_sys::CacheRegisterRelcacheCallback(Some(relcache_callback), pg_sys::Datum::from(0usize))
    };
}
