//! The pinned `search_path` of the insert functions, set only where it matters.
//!
//! The insert functions are `SECURITY DEFINER`: they write tables the writer role
//! cannot write. Such a function must not run SQL under the caller's
//! `search_path`, which could put an object of the caller's (an operator, a
//! function) in front of the built-in one and have it run as the owner. The other
//! functions pin the path with `SET search_path`, which Postgres applies on every
//! call: a new GUC nest level, the setting parsed and applied, and undone on
//! return (measured at several percent of a single-row insert). The insert
//! functions' hot path runs no SQL at all (the direct write path,
//! the store's write path), so they pin the path only around what does run SQL: partition
//! creation and the SQL insert path. [`pinned`] does that the way the function
//! manager does for `SET search_path`. (tests/tests/hardening.rs plants a hostile
//! operator in the caller's path and checks that it never runs.)

use pgrx::pg_sys;
use std::ffi::CStr;

/// The path the extension's SQL runs under (`#[search_path(pg_catalog, pg_temp)]`
/// on the other functions).
const PINNED: &CStr = c"pg_catalog, pg_temp";

/// Runs `f` with `search_path` set to `pg_catalog, pg_temp`, restored afterwards.
/// If `f` raises an ERROR, the (sub)transaction abort restores the setting, as it
/// does for a function's `SET` clause.
pub fn pinned<R>(f: impl FnOnce() -> R) -> R {
    // SAFETY: NewGUCNestLevel starts a save level that AtEOXact_GUC below pops (or
    // the abort of the current (sub)transaction pops, if f raises). The setting
    // name and value are static C strings; search_path's check hook accepts the
    // value; PGC_S_SESSION with GUC_ACTION_SAVE is what the function manager uses
    // for a function's SET clause.
    let level = unsafe {
        let level = pg_sys::NewGUCNestLevel();
        pg_sys::set_config_option(
            c"search_path".as_ptr(),
            PINNED.as_ptr(),
            pg_sys::GucContext::PGC_USERSET,
            pg_sys::GucSource::PGC_S_SESSION,
            pg_sys::GucAction::GUC_ACTION_SAVE,
            true,
            0,
            false,
        );
        level
    };
    let result = f();
    // SAFETY: pops the level opened above; f returned normally, so it is still the
    // innermost one (every nested level was popped by its own owner).
    unsafe { pg_sys::AtEOXact_GUC(true, level) };
    result
}
