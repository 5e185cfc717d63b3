//! How errors reach SQL clients.
//!
//! Each module has its own error enum (`InsertError`, `PartitionError`, ...). Every
//! enum implements [`SqlError`], which names the SQLSTATE of each variant. The
//! `#[pg_extern]` functions do their work in a function returning `Result` and
//! finish with [`OrRaise::or_raise`], which raises the error as a Postgres ERROR
//! with that code (through pgrx's `ErrorReport`). A plain `Err` returned to pgrx
//! would surface as the generic 22000 and tell a client nothing.

pub use pgrx::pg_sys::errcodes::PgSqlErrorCode;

/// An error with a specific SQLSTATE and, optionally, a hint for the user.
pub trait SqlError: std::fmt::Display {
    fn sqlstate(&self) -> PgSqlErrorCode;

    fn hint(&self) -> Option<String> {
        None
    }
}

/// Builds the report for any [`SqlError`].
#[track_caller]
fn report<E: SqlError>(error: &E) -> pgrx::pg_sys::panic::ErrorReport {
    let report =
        pgrx::pg_sys::panic::ErrorReport::new(error.sqlstate(), error.to_string(), "pg_envelopes");
    match error.hint() {
        Some(hint) => report.set_hint(hint),
        None => report,
    }
}

/// Raises the error of a `Result` as a Postgres ERROR with its SQLSTATE.
pub trait OrRaise<T> {
    fn or_raise(self) -> T;
}

impl<T, E: SqlError> OrRaise<T> for Result<T, E> {
    #[track_caller]
    fn or_raise(self) -> T {
        match self {
            Ok(value) => value,
            Err(error) => {
                report(&error).report(pgrx::PgLogLevel::ERROR);
                unreachable!("an ERROR report does not return")
            }
        }
    }
}

/// Keeps Rust backtraces out of what clients see. pgrx's panic hook captures one
/// for every ERROR that crosses Rust code (`Backtrace::capture`, which obeys
/// `RUST_LIB_BACKTRACE`, then `RUST_BACKTRACE`) and appends it to the DETAIL: with
/// `RUST_BACKTRACE` set in the server's environment, a client would receive
/// kilobytes of frames and build paths. `RUST_LIB_BACKTRACE=0` turns capturing off
/// for this process whatever else is set; panics printed by Rust's own hook (to
/// the server log, on threads pgrx does not own) still follow `RUST_BACKTRACE`.
pub fn no_backtraces() {
    // Called from _PG_init, on the backend's only thread, before any backtrace was
    // captured (std reads the variable once and caches it); nothing else reads the
    // environment concurrently (set_var is unsafe from edition 2024 on for that).
    std::env::set_var("RUST_LIB_BACKTRACE", "0");
}
