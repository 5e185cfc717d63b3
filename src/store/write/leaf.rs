//! What the direct write path needs of a table, checked before it writes: the
//! store's columns in order, a plain heap, no trigger, rule, CHECK constraint or
//! forced row security it would pass by (a table that lacks something gets the
//! SQL path instead).

use crate::pg::rel::Rel;
use crate::store::partition::band::Table;
use pgrx::pg_sys;
use std::ffi::CStr;

/// Errors of the direct path.
#[derive(Debug, thiserror::Error)]
pub enum DirectError {
    #[error("could not serialize access due to concurrent update")]
    Serialization,
    #[error("the table access method of {0} lacks a routine the direct write path needs")]
    AccessMethod(&'static str),
    #[error("table {0} has an INSERT rule, which the insert functions cannot apply")]
    Rule(String),
}

impl crate::error::SqlError for DirectError {
    fn sqlstate(&self) -> crate::error::PgSqlErrorCode {
        use crate::error::PgSqlErrorCode::*;
        match self {
            DirectError::Serialization => ERRCODE_T_R_SERIALIZATION_FAILURE,
            DirectError::AccessMethod(_) | DirectError::Rule(_) => ERRCODE_FEATURE_NOT_SUPPORTED,
        }
    }

    fn hint(&self) -> Option<String> {
        match self {
            DirectError::Rule(_) => Some(
                "Drop the rule, or do what it does in a trigger: the insert functions \
                 honour row triggers on the roots (they then insert with SQL)."
                    .into(),
            ),
            _ => None,
        }
    }
}

/// The columns each table must have, in order, for the direct path to form its
/// tuples positionally: (name, type, may the direct path leave it NULL). A column
/// it may leave NULL must not have been made NOT NULL (the direct path does not
/// run the executor's constraint checks; the SQL path does).
const META_COLUMNS: [(&str, pg_sys::Oid, bool); 8] = [
    ("originator_node_id", pg_sys::INT4OID, false),
    ("originator_sequence_id", pg_sys::INT8OID, false),
    ("gateway_time", pg_sys::TIMESTAMPTZOID, false),
    ("topic", pg_sys::BYTEAOID, false),
    ("payer_id", pg_sys::INT4OID, true),
    ("expiry", pg_sys::INT8OID, true),
    ("inserted_xid", pg_sys::XID8OID, false),
    ("late", pg_sys::BOOLOID, false),
];
const BLOB_COLUMNS: [(&str, pg_sys::Oid, bool); 3] = [
    ("originator_node_id", pg_sys::INT4OID, false),
    ("originator_sequence_id", pg_sys::INT8OID, false),
    ("originator_envelope", pg_sys::BYTEAOID, false),
];
pub const LATE_COLUMNS: [(&str, pg_sys::Oid, bool); 6] = [
    ("id", pg_sys::INT8OID, false),
    ("originator_node_id", pg_sys::INT4OID, false),
    ("originator_sequence_id", pg_sys::INT8OID, false),
    ("recorded_at", pg_sys::TIMESTAMPTZOID, false),
    ("last_sequence_id", pg_sys::INT8OID, false),
    ("inserted_xid", pg_sys::XID8OID, false),
];

/// What a table of the store must look like (see [`META_COLUMNS`]).
pub type Columns = [(&'static str, pg_sys::Oid, bool)];

pub fn columns_of(table: Table) -> &'static Columns {
    match table {
        Table::Meta => &META_COLUMNS,
        Table::Blob => &BLOB_COLUMNS,
    }
}

/// The statement trigger on the meta root that rings the doorbell; the only insert
/// trigger the direct path may pass by (it rings instead).
pub const DOORBELL_TRIGGER: &CStr = c"notify_envelopes";

/// Whether a leaf is what the extension created: the expected columns in order,
/// no triggers, no row security forced on its owner, no CHECK constraints.
pub fn leaf_is_plain(rel: &Rel, expected: &Columns) -> bool {
    !rel.has_triggers()
        && !rel.row_security().1
        && !rel.has_checks_or_generated()
        && rel.columns_are(expected)
}

/// Whether an open relation is a plain heap table (what the direct path's table
/// access method calls need; a partitioned or foreign table has none).
pub fn heap_table(rel: &Rel) -> bool {
    crate::pg::scan::can_read(rel) && rel.table_facts().access_method == pg_sys::HEAP_TABLE_AM_OID
}

/// Refuses a table with an INSERT rule that fires in this session: the direct
/// path runs no rewriter, and the SQL path's `INSERT ... ON CONFLICT` is refused
/// by Postgres on such a table, so no insert function could honour it.
pub fn refuse_insert_rules(relid: pg_sys::Oid) -> Result<(), DirectError> {
    // The relation is locked by the caller (the feed table, in open_late).
    let Some(rel) = Rel::reference(relid) else {
        return Ok(());
    };
    insert_rule(&rel)
}

/// [`DirectError::Rule`] when the relation has an INSERT rule that fires in
/// this session (as the rewriter decides with `session_replication_role`).
fn insert_rule(rel: &Rel) -> Result<(), DirectError> {
    let mut fires = false;
    rel.for_each_insert_rule(|enabled| fires |= trigger_fires(enabled));
    if fires {
        return Err(DirectError::Rule(rel.name()));
    }
    Ok(())
}

/// Checks the insert rules (an error: [`insert_rule`]) and triggers of a root
/// (none on blob; on meta only the doorbell), and that row security is not
/// forced on its owner. `Some(fires)` says whether the doorbell trigger would
/// fire in this session; `None` means the direct path would skip a trigger.
pub fn root_triggers_allow(
    root: pg_sys::Oid,
    doorbell_allowed: bool,
) -> Result<Option<bool>, DirectError> {
    // The root is locked (partition::route).
    let Some(rel) = Rel::reference(root) else {
        return Ok(None);
    };
    insert_rule(&rel)?;
    let mut answer = match rel.row_security() {
        (true, true) => None, // row security forced on the owner: the SQL path applies it
        _ => Some(false),
    };
    rel.for_each_trigger(|name, tgtype, enabled| {
        if tgtype & pg_sys::TRIGGER_TYPE_INSERT as i16 == 0 {
            return;
        }
        if doorbell_allowed
            && name == DOORBELL_TRIGGER
            && tgtype & pg_sys::TRIGGER_TYPE_ROW as i16 == 0
        {
            answer = answer.map(|_| trigger_fires(enabled));
        } else {
            answer = None;
        }
    });
    Ok(answer)
}

/// Whether a trigger (or rule) with this `tgenabled` fires under the session's
/// replication role (as `TriggerEnabled` decides in trigger.c).
fn trigger_fires(enabled: u8) -> bool {
    let replica = crate::pg::xact::replication_role_is_replica();
    match enabled {
        b'D' => false,
        b'A' => true,
        b'R' => replica,
        _ => !replica, // 'O': fires on origin and local
    }
}
