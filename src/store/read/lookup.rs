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
//! The probe reads the table directly, so the function checks what the join
//! would have checked itself, once per statement ([`access`]):
//!
//! - **privileges**: the caller's own on blob, or else the view's (a view reads
//!   its tables with its owner's rights, unless it is `security_invoker`, when
//!   they are the caller's); the right to read `originator_envelope` gives the
//!   bytes, the right to read only other columns (column grants on the view's
//!   other columns) gives an empty `bytea` for an existing key — the view needs
//!   to know the row has its blob twin, and its own column check keeps
//!   `originator_envelope` from such a role;
//! - **row-level security**: where it applies to blob for the role the lookup
//!   reads as (`check_enable_rls`), the lookup is a query through the executor
//!   as that role ([`crate::pg::executor`]), which applies the policies; otherwise
//!   the index probe.
//!
//! `envelope_of` is not executable by PUBLIC: `grant_reader` grants it with the
//! view.

use crate::error::{PgSqlErrorCode, SqlError};
use crate::pg::acl;
use crate::pg::executor::{self, Param};
use crate::pg::rel::Rel;
use crate::pg::scan::Reading;
use crate::store::partition::{self, band::Table, PartitionError};
use crate::store::read;
use crate::store::read::select;
use pgrx::pg_sys;
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
    #[error("{0}")]
    Executor(#[from] executor::ExecutorError),
}

impl SqlError for LookupError {
    fn sqlstate(&self) -> PgSqlErrorCode {
        match self {
            LookupError::NotAllowed => PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
            LookupError::NoSnapshot => PgSqlErrorCode::ERRCODE_INVALID_TRANSACTION_STATE,
            LookupError::Partition(e) => e.sqlstate(),
            LookupError::Executor(e) => e.sqlstate(),
        }
    }

    fn hint(&self) -> Option<String> {
        match self {
            LookupError::NotAllowed => Some(
                "Reading the view needs SELECT on it (or on gateway_envelopes_blob) and \
                 EXECUTE on envelopes.envelope_of; envelopes.grant_reader grants both."
                    .into(),
            ),
            _ => None,
        }
    }
}

/// What the caller may learn of a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Right {
    /// Its bytes.
    Bytes,
    /// Only whether it has a blob row (an empty `bytea` stands for it).
    Exists,
}

/// How a statement's lookups read blob.
#[derive(Clone, Copy, Debug)]
struct Access {
    right: Right,
    /// The role the lookup reads as: the caller, or the view's owner.
    role: pg_sys::Oid,
    /// Row-level security applies to `role` on blob: read through the executor.
    row_security: bool,
}

thread_local! {
    /// The last check that passed, and the statement it was made for: a
    /// statement reading many rows checks once.
    static ALLOWED: Cell<Option<(acl::Statement, Access)>> = const { Cell::new(None) };
}

/// What `user` may read of relation `relid`: `Some(Bytes)` with SELECT on it or
/// on its column `originator_envelope`, `Some(Exists)` with SELECT on another of
/// its columns only, `None` without any.
fn right_on(relid: pg_sys::Oid, user: pg_sys::Oid) -> Option<Right> {
    if acl::may_select(relid, user) || acl::may_select_column(relid, c"originator_envelope", user) {
        return Some(Right::Bytes);
    }
    acl::may_select_some_column(relid, user).then_some(Right::Exists)
}

/// The view's owner, and whether it is `security_invoker` (its tables are then
/// read with the caller's rights); `None` when there is no view.
fn view_of(blob_root: pg_sys::Oid) -> Option<(pg_sys::Oid, pg_sys::Oid, bool)> {
    use crate::pg::catalog;
    let view = catalog::relation_in(catalog::namespace_of(blob_root)?, c"gateway_envelopes_view")?;
    let rel = Rel::reference(view)?;
    Some((view, rel.owner(), rel.is_security_invoker_view()))
}

/// How the current statement's lookups read blob (checked once per statement).
fn access(blob_root: pg_sys::Oid) -> Result<Access, LookupError> {
    let now = acl::statement();
    if let Some((checked, access)) = ALLOWED.with(Cell::get) {
        if checked == now {
            return Ok(access);
        }
    }
    // A new statement: take in the catalog changes committed since (a transaction
    // that holds its locks already would otherwise read the privileges as they
    // were when it last took one).
    crate::pg::invalidation::accept();
    let user = now.0;
    let on_blob = right_on(blob_root, user);
    // Through the view, as its owner, unless it reads as the caller.
    let on_view = view_of(blob_root).and_then(|(view, owner, invoker)| {
        let right = (!invoker).then(|| right_on(view, user)).flatten()?;
        Some((right, owner))
    });
    let (right, role) = match (on_blob, on_view) {
        (Some(Right::Bytes), _) => (Right::Bytes, user),
        (_, Some((Right::Bytes, owner))) => (Right::Bytes, owner),
        (Some(Right::Exists), _) => (Right::Exists, user),
        (_, Some((Right::Exists, owner))) => (Right::Exists, owner),
        (None, None) => return Err(LookupError::NotAllowed),
    };
    let row_security = acl::row_security_applies(blob_root, role);
    let access = Access {
        right,
        role,
        row_security,
    };
    ALLOWED.with(|a| a.set(Some((now, access))));
    Ok(access)
}

/// The key looked up through the executor, as `role`, so that blob's row
/// security applies: its bytes, or an empty `bytea` for [`Right::Exists`].
fn lookup_with_row_security(
    node: i32,
    seq: i64,
    access: Access,
    snapshot: pg_sys::Snapshot,
) -> Result<Option<Vec<u8>>, LookupError> {
    let sql = match access.right {
        Right::Bytes => {
            "SELECT b.originator_envelope FROM envelopes.gateway_envelopes_blob b
              WHERE b.originator_node_id OPERATOR(pg_catalog.=) $1
                AND b.originator_sequence_id OPERATOR(pg_catalog.=) $2"
        }
        Right::Exists => {
            "SELECT ''::pg_catalog.bytea FROM envelopes.gateway_envelopes_blob b
              WHERE b.originator_node_id OPERATOR(pg_catalog.=) $1
                AND b.originator_sequence_id OPERATOR(pg_catalog.=) $2"
        }
    };
    let params = [
        Param {
            typ: pg_sys::INT4OID,
            value: pg_sys::Datum::from(node),
        },
        Param {
            typ: pg_sys::INT8OID,
            value: pg_sys::Datum::from(seq),
        },
    ];
    let mut found = None;
    executor::select(
        sql,
        &params,
        snapshot,
        Some(access.role),
        "gateway_envelopes_blob",
        |row| {
            if found.is_none() {
                found = row.get::<Vec<u8>>(1);
            }
        },
    )?;
    Ok(found)
}

/// The bytes of `(node, seq)` as the calling statement may see them (see the
/// module documentation).
pub fn lookup(node: i32, seq: i64) -> Result<Option<Vec<u8>>, LookupError> {
    let access = access(partition::root_of(Table::Blob)?)?;
    let snapshot = select::statement_snapshot().map_err(|_| LookupError::NoSnapshot)?;
    if access.row_security {
        return lookup_with_row_security(node, seq, access, snapshot);
    }
    let bytes = read::blob_envelope(node, seq, Reading::kept(snapshot))?;
    Ok(match access.right {
        Right::Bytes => bytes,
        Right::Exists => bytes.map(|_| Vec::new()),
    })
}
