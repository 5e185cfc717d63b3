//! Read-only queries through the executor, with a snapshot the caller chooses.
//!
//! The read paths scan band leaves through their indexes ([`crate::pg::scan`]), which
//! only works for what they were written for: a heap table with its btree
//! indexes. A table that is something else — a band the owner partitioned further,
//! another access method, an index that is not there — is read with an ordinary
//! query instead, through SPI, which lets the planner and the executor deal with
//! whatever the table is (correct, if slower). And where row-level security
//! applies to the caller (the view's byte lookup), only the executor applies it.
//!
//! SPI would read with the active snapshot (or, once the transaction has written,
//! take a new one); these reads need the snapshot their caller chose (the
//! statement's, or one taken after the feed's markers), so they go through
//! `SPI_execute_snapshot`, read-only. Each query is planned for its parameters
//! (`CURSOR_OPT_CUSTOM_PLAN`): a generic plan over a partitioned table would
//! lock every partition at each execution.

use crate::error::{OrRaise, PgSqlErrorCode, SqlError};
use pgrx::pg_sys::{self, Datum, Oid};
use std::ffi::CString;

/// Errors of an executor read.
#[derive(Debug, thiserror::Error)]
pub enum ExecutorError {
    #[error("SPI failed with code {code} while reading {what}")]
    Spi { code: i32, what: &'static str },
    #[error("query text contains a NUL byte")]
    Nul,
}

impl SqlError for ExecutorError {
    fn sqlstate(&self) -> PgSqlErrorCode {
        PgSqlErrorCode::ERRCODE_INTERNAL_ERROR
    }
}

/// One `$n` parameter of a query: its type and its value (never NULL).
#[derive(Clone, Copy)]
pub struct Param {
    pub typ: Oid,
    pub value: Datum,
}

/// Runs the read-only query `sql` with `snapshot` and hands each result row to
/// `each`, with the result's descriptor, while the result is still alive (copy
/// out what must outlive the call). `run_as` runs it with that role's privileges
/// (`None`: the current user's); `search_path` is pinned to `pg_catalog, pg_temp`
/// for it, so write every object schema-qualified.
///
/// `snapshot` must be an MVCC snapshot that stays valid during the call. The
/// tables the query reads stay locked (ACCESS SHARE) until the transaction ends,
/// as for any query. An ERROR inside (the transaction's or subtransaction's abort
/// then closes the SPI connection, restores the user and the setting) unwinds
/// through the caller.
pub fn select(
    sql: &str,
    params: &[Param],
    snapshot: pg_sys::Snapshot,
    run_as: Option<Oid>,
    what: &'static str,
    mut each: impl FnMut(&Row<'_>),
) -> Result<(), ExecutorError> {
    let text = CString::new(sql).map_err(|_| ExecutorError::Nul)?;
    let mut types: Vec<Oid> = params.iter().map(|p| p.typ).collect();
    let mut values: Vec<Datum> = params.iter().map(|p| p.value).collect();
    let nulls = vec![b' ' as std::ffi::c_char; params.len()];
    let mut user = Oid::INVALID;
    let mut context = 0;
    // SAFETY: reads the current user and security context into the two locals.
    unsafe { pg_sys::GetUserIdAndSecContext(&mut user, &mut context) };
    if let Some(role) = run_as {
        // SAFETY: what the function manager does for a SECURITY DEFINER
        // function: a local user change, undone below or by the abort of the
        // (sub)transaction if the query raises.
        unsafe {
            pg_sys::SetUserIdAndSecContext(
                role,
                context | pg_sys::SECURITY_LOCAL_USERID_CHANGE as i32,
            )
        };
    }
    let result = crate::pg::definer::pinned(|| {
        // SAFETY: a balanced SPI session: connect, prepare the NUL-terminated text
        // with as many argument types as values, execute read-only with the
        // caller's registered (or active) MVCC snapshot, read SPI_tuptable's
        // SPI_processed rows (valid until SPI_finish), free the plan, finish. On
        // an ERROR the abort cleans up the SPI session.
        unsafe {
            let code = pg_sys::SPI_connect();
            if code < 0 {
                return Err(ExecutorError::Spi { code, what });
            }
            let plan = pg_sys::SPI_prepare_cursor(
                text.as_ptr(),
                types.len() as i32,
                types.as_mut_ptr(),
                pg_sys::CURSOR_OPT_CUSTOM_PLAN as i32,
            );
            if plan.is_null() {
                let code = pg_sys::SPI_result;
                pg_sys::SPI_finish();
                return Err(ExecutorError::Spi { code, what });
            }
            let code = pg_sys::SPI_execute_snapshot(
                plan,
                values.as_mut_ptr(),
                nulls.as_ptr(),
                snapshot,
                std::ptr::null_mut(),
                true,
                false,
                0,
            );
            if code != pg_sys::SPI_OK_SELECT as i32 {
                pg_sys::SPI_freeplan(plan);
                pg_sys::SPI_finish();
                return Err(ExecutorError::Spi { code, what });
            }
            let table = pg_sys::SPI_tuptable;
            if !table.is_null() {
                let rows = usize::try_from(pg_sys::SPI_processed).unwrap_or(0);
                for i in 0..rows {
                    each(&Row {
                        tuple: *(*table).vals.add(i),
                        desc: (*table).tupdesc,
                        _valid: std::marker::PhantomData,
                    });
                }
            }
            pg_sys::SPI_freeplan(plan);
            pg_sys::SPI_finish();
            Ok(())
        }
    });
    if run_as.is_some() {
        // SAFETY: restores what was read above.
        unsafe { pg_sys::SetUserIdAndSecContext(user, context) };
    }
    result
}

/// [`select`], raising its error.
pub fn select_or_raise(
    sql: &str,
    params: &[Param],
    snapshot: pg_sys::Snapshot,
    run_as: Option<Oid>,
    what: &'static str,
    each: impl FnMut(&Row<'_>),
) {
    select(sql, params, snapshot, run_as, what, each).or_raise()
}

/// One row of a [`select`], valid during the callback that is handed it.
pub struct Row<'a> {
    tuple: pg_sys::HeapTuple,
    desc: pg_sys::TupleDesc,
    _valid: std::marker::PhantomData<&'a ()>,
}

impl Row<'_> {
    /// Column `column` (from 1) as a `T`, `None` when NULL. A column of another
    /// type than `T`'s (or no such column) is an internal error (XX000).
    pub fn get<T: pgrx::FromDatum + pgrx::IntoDatum>(&self, column: i32) -> Option<T> {
        // SAFETY: the row and its descriptor are SPI's, valid during the
        // callback (the lifetime); SPI_gettypeid returns InvalidOid for a column
        // that does not exist; the conversion reads a datum of T's type (checked)
        // and copies it.
        unsafe {
            let typ = pg_sys::SPI_gettypeid(self.desc, column);
            if typ != T::type_oid() {
                pgrx::ereport!(
                    ERROR,
                    pgrx::PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
                    format!(
                        "column {column} of a query has type oid {}, read as type oid {}",
                        typ.to_u32(),
                        T::type_oid().to_u32()
                    )
                );
            }
            let mut isnull = false;
            let datum = pg_sys::SPI_getbinval(self.tuple, self.desc, column, &mut isnull);
            T::from_polymorphic_datum(datum, isnull, typ)
        }
    }

    /// The tuple and its descriptor, for the glue's own readers.
    pub(in crate::pg) fn raw(&self) -> (pg_sys::HeapTuple, pg_sys::TupleDesc) {
        (self.tuple, self.desc)
    }
}
