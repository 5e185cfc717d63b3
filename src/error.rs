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
