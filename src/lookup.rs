//! The envelope bytes of one key, for `gateway_envelopes_view`.
//!
//! The view used to join meta with blob. Postgres carries an equality on the
//! originator from one side of that join to the other, but not a range on the
//! sequence id, so a query for one originator after a position pruned meta to the
//! bands asked for and still read every blob band of the originator. The view
//! now looks each meta row's bytes up by primary key through [`envelope_of`]: the
//! blob band of the key, from the partition cache, one index probe with the
//! calling statement's snapshot. The blob side then touches exactly the bands of
//! the meta rows returned, whatever the query's shape, and a `LIMIT` stops both.
//!
//! The probe reads the table directly, so the function checks privileges itself:
//! the caller must be allowed to read the view or blob (a view's tables are
//! checked as its owner, but a function it calls runs as the caller).

use crate::error::{OrRaise, PgSqlErrorCode, SqlError};
use crate::partition::{self, band::Table, PartitionError};
use crate::read;
use crate::select;
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::cell::Cell;

/// Errors of the lookup.
#[derive(Debug, thiserror::Error)]
pub enum LookupError {
    #[error("permission denied for view gateway_envelopes_view")]
    NotAllowed,
    #[error("no snapshot is active: call envelope_of from a query")]
    NoSnapshot,
    #[error("{0}")]
    Partition(#[from] PartitionError),
}

impl SqlError for LookupError {
    fn sqlstate(&self) -> PgSqlErrorCode {
        match self {
            LookupError::NotAllowed => PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
            LookupError::NoSnapshot => PgSqlErrorCode::ERRCODE_INVALID_TRANSACTION_STATE,
            LookupError::Partition(e) => e.sqlstate(),
        }
    }
}

/// When a privilege check passed: the user, the local transaction, the command
/// and the statement's start. The statement start changes with every statement a
/// client sends (the command id only after a write), so a transaction that only
/// reads is checked again at each statement and sees a revoke committed since.
type Checked = (pg_sys::Oid, u32, u32, pg_sys::TimestampTz);

thread_local! {
    /// The last check that passed: a statement reading many rows checks once.
    static ALLOWED: Cell<Option<Checked>> = const { Cell::new(None) };
}

/// Whether `user` may `SELECT` relation `relid`, or at least its column
/// `originator_envelope` (the one column the lookup returns).
///
/// # Safety
/// Calls into the ACL and syscache code; `relid` may be any oid.
unsafe fn may_select(relid: pg_sys::Oid, user: pg_sys::Oid) -> bool {
    let select = pg_sys::ACL_SELECT as pg_sys::AclMode;
    let ok = pg_sys::AclResult::ACLCHECK_OK;
    // SAFETY: pg_class_aclcheck and pg_attribute_aclcheck look the relation up in
    // the syscache and report (do not raise) what the user may do; get_attnum
    // returns InvalidAttrNumber (0) for a column that does not exist.
    unsafe {
        if pg_sys::pg_class_aclcheck(relid, user, select) == ok {
            return true;
        }
        let attnum = pg_sys::get_attnum(relid, c"originator_envelope".as_ptr());
        attnum > 0 && pg_sys::pg_attribute_aclcheck(relid, attnum, user, select) == ok
    }
}

/// Whether the current user may read the view or blob's root.
fn check_allowed(blob_root: pg_sys::Oid) -> Result<(), LookupError> {
    // SAFETY: reads this backend's user, transaction, command and statement
    // start; MyProc is valid for the backend's life.
    let now = unsafe {
        (
            pg_sys::GetUserId(),
            (*pg_sys::MyProc).lxid,
            pg_sys::GetCurrentCommandId(false),
            pg_sys::GetCurrentStatementStartTimestamp(),
        )
    };
    if ALLOWED.with(Cell::get) == Some(now) {
        return Ok(());
    }
    // A new statement: take in the catalog changes committed since (a transaction
    // that holds its locks already would otherwise read the privileges as they
    // were when it last took one).
    // SAFETY: plain call into the invalidation machinery, no arguments.
    unsafe { pg_sys::AcceptInvalidationMessages() };
    // SAFETY: may_select accepts any oid; get_rel_namespace and get_relname_relid
    // return InvalidOid for what does not exist.
    let allowed = unsafe {
        may_select(blob_root, now.0) || {
            let schema = pg_sys::get_rel_namespace(blob_root);
            let view = pg_sys::get_relname_relid(c"gateway_envelopes_view".as_ptr(), schema);
            view != pg_sys::InvalidOid && may_select(view, now.0)
        }
    };
    if !allowed {
        return Err(LookupError::NotAllowed);
    }
    ALLOWED.with(|a| a.set(Some(now)));
    Ok(())
}

fn lookup(node: i32, seq: i64) -> Result<Option<Vec<u8>>, LookupError> {
    check_allowed(partition::root_of(Table::Blob)?)?;
    let snapshot = select::statement_snapshot().map_err(|_| LookupError::NoSnapshot)?;
    Ok(read::blob_envelope(node, seq, snapshot)?)
}

/// The bytes of envelope `(originator_node_id, originator_sequence_id)` from
/// `gateway_envelopes_blob`, as the calling statement sees it; NULL when there is
/// no such row.
#[pg_extern(stable, parallel_safe)]
fn envelope_of(originator_node_id: i32, originator_sequence_id: i64) -> Option<Vec<u8>> {
    lookup(originator_node_id, originator_sequence_id).or_raise()
}
