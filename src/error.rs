//! How errors reach SQL clients.
//!
//! Each module has its own error enum (`InsertError`, `PartitionError`, ...). Every
//! enum implements [`SqlError`], which names the SQLSTATE of each variant, and
//! [`impl_error_report!`] turns it into a pgrx [`ErrorReport`], so a `#[pg_extern]`
//! returning `Result<T, ErrorReport>` raises a Postgres ERROR with that code. A
//! plain `Err` would surface as the generic 22000/XX000 and tell a client nothing.

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
pub fn report<E: SqlError>(error: &E) -> pgrx::pg_sys::panic::ErrorReport {
    let report =
        pgrx::pg_sys::panic::ErrorReport::new(error.sqlstate(), error.to_string(), "pg_envelopes");
    match error.hint() {
        Some(hint) => report.set_hint(hint),
        None => report,
    }
}

/// `impl From<$ty> for ErrorReport` through [`report`].
#[macro_export]
macro_rules! impl_error_report {
    ($ty:ty) => {
        impl From<$ty> for ::pgrx::pg_sys::panic::ErrorReport {
            #[track_caller]
            fn from(error: $ty) -> Self {
                $crate::error::report(&error)
            }
        }
    };
}
