//! The consumer functions: durable cursors and the batches the bridge forwards.
//!
//! A consumer has three positions: a vector clock over originators (the last
//! sequence id handed out per originator, 0 when absent), a position in the
//! late-envelope feed and a position in the outbox. The batch functions read
//! through a [`Gate`] (see [`crate::store::feed`] for why that hands out every committed
//! row), the acknowledgement functions (SQL, `sql/consumer.sql`) move the
//! positions forward only.
//!
//! An idle poll costs the same whatever the number of originators: each backend
//! remembers, per consumer, which originators a read found *clean* (no marker,
//! read to the end) and at which change clock. While that originator's clock has
//! not moved and the cursor is at the point the read reached, there is nothing to
//! read there, and a poll in which every originator and both drawn feeds are
//! clean returns without opening a gate or a table. The cursor itself is cached
//! too and refreshed from the rows whose `version` is newer than the cached one.
//!
//! [`state`]: this backend's copy of each consumer's positions; [`owner`]: who
//! may act for a consumer; [`envelopes`]: envelope batches, pending counts and
//! acknowledgements; [`outbox`]: outbox batches; [`register`]: new consumers.

pub mod envelopes;
mod late;
pub mod outbox;
pub mod owner;
pub mod register;
mod state;

use crate::error::{PgSqlErrorCode, SqlError};
use crate::pg::scan::{Range, Scan};
use crate::store::feed::markers::MarkerError;
use crate::store::partition::PartitionError;
use pgrx::pg_sys;

/// Errors of the consumer functions.
#[derive(Debug, thiserror::Error)]
pub enum ConsumerError {
    #[error("{0} must not be NULL")]
    Null(&'static str),
    #[error("consumer name must not be empty")]
    EmptyName,
    #[error("consumer \"{0}\" does not exist")]
    Unknown(String),
    #[error("batch_size must be positive (got {0})")]
    BadBatchSize(i32),
    #[error("batch_bytes must be positive (got {0})")]
    BadBatchBytes(i64),
    #[error("originator_node_ids has {nodes} elements but sequence_ids has {seqs}")]
    AckLength { nodes: usize, seqs: usize },
    #[error("cannot acknowledge late_id {0}: it names no late-feed entry drawn yet")]
    NeverDrawn(i64),
    #[error("permission denied for consumer \"{consumer}\"")]
    NotOwner { consumer: String, owner: String },
    #[error("{0}")]
    Partition(#[from] PartitionError),
    #[error("{0}")]
    Marker(#[from] MarkerError),
    #[error("{0}")]
    Lease(#[from] crate::store::lease::LeaseError),
    #[error("a feed table of the extension is missing or damaged: {0}")]
    Feed(&'static str),
    #[error("SPI error in the consumer functions: {0}")]
    Spi(#[from] pgrx::spi::SpiError),
}

impl SqlError for ConsumerError {
    fn sqlstate(&self) -> PgSqlErrorCode {
        use PgSqlErrorCode::*;
        match self {
            ConsumerError::Null(_) => ERRCODE_NULL_VALUE_NOT_ALLOWED,
            ConsumerError::EmptyName
            | ConsumerError::BadBatchSize(_)
            | ConsumerError::BadBatchBytes(_)
            | ConsumerError::NeverDrawn(_) => ERRCODE_INVALID_PARAMETER_VALUE,
            ConsumerError::AckLength { .. } => ERRCODE_ARRAY_ELEMENT_ERROR,
            ConsumerError::Unknown(_) => ERRCODE_UNDEFINED_OBJECT,
            ConsumerError::NotOwner { .. } => ERRCODE_INSUFFICIENT_PRIVILEGE,
            ConsumerError::Partition(e) => e.sqlstate(),
            ConsumerError::Marker(e) => e.sqlstate(),
            ConsumerError::Lease(e) => e.sqlstate(),
            ConsumerError::Feed(_) => ERRCODE_UNDEFINED_TABLE,
            ConsumerError::Spi(_) => ERRCODE_INTERNAL_ERROR,
        }
    }

    fn hint(&self) -> Option<String> {
        match self {
            ConsumerError::Unknown(_) => {
                Some("Create it with envelopes.consumer_register(name).".into())
            }
            ConsumerError::Marker(e) => e.hint(),
            ConsumerError::Lease(e) => e.hint(),
            ConsumerError::NotOwner { owner, .. } => Some(format!(
                "It belongs to role {owner}: only that role (or a member of it) and the \
                 extension's owner may read its batches and move its positions \
                 (envelopes.consumer_set_owner hands it over)."
            )),
            _ => None,
        }
    }
}

/// How much a batch may still take: rows, and bytes when a budget was given. The
/// first row is always taken, however large, so a batch is never empty for lack
/// of room.
#[derive(Clone)]
pub struct Budget {
    rows: usize,
    bytes: Option<usize>,
    taken: usize,
}

impl Budget {
    pub fn new(rows: i32, bytes: Option<i64>) -> Budget {
        Budget {
            rows: rows as usize,
            bytes: bytes.map(|b| b as usize),
            taken: 0,
        }
    }

    /// Takes a row of `size` bytes if there is room; false if it must wait.
    fn take(&mut self, size: usize) -> bool {
        if self.rows == 0 {
            return false;
        }
        if let Some(bytes) = self.bytes {
            if self.taken > 0 && size > bytes {
                return false;
            }
            self.bytes = Some(bytes.saturating_sub(size));
        }
        self.rows -= 1;
        self.taken += 1;
        true
    }

    fn exhausted(&self) -> bool {
        self.rows == 0 || (self.taken > 0 && self.bytes == Some(0))
    }
}

/// Reads a drawn feed's rows with id in `(after, upto]` in order with `snapshot`,
/// calling `each` with the open scan until it returns false. Returns whether the
/// range was read to its end.
fn drawn_rows(
    table: &'static std::ffi::CStr,
    after: i64,
    upto: i64,
    snapshot: pg_sys::Snapshot,
    mut each: impl FnMut(&mut Scan) -> Result<bool, ConsumerError>,
) -> Result<bool, ConsumerError> {
    if upto <= after {
        return Ok(true);
    }
    let relid = crate::pg::catalog::relation(c"envelopes", table).unwrap_or(pg_sys::InvalidOid);
    let mut scan = Scan::open(relid, snapshot, Range::Id { after, upto }, false)
        .ok_or(ConsumerError::Feed("feed table missing"))?;
    while scan.next() {
        if !each(&mut scan)? {
            return Ok(false);
        }
    }
    Ok(true)
}

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use crate::testing::{int8, sqlstate_of};
    use pgrx::prelude::*;

    #[pg_test]
    fn consumer_functions_check_their_arguments() {
        let cases = [
            (
                "SELECT * FROM envelopes.consumer_outbox_batch('nobody')",
                "42704",
            ),
            (
                "SELECT * FROM envelopes.consumer_envelope_batch('nobody')",
                "42704",
            ),
            ("SELECT envelopes.consumer_outbox_ack('nobody', 1)", "42704"),
            (
                "SELECT envelopes.consumer_envelope_ack('nobody', '{1}', '{1}')",
                "42704",
            ),
            ("SELECT envelopes.consumer_register('')", "22023"),
            ("SELECT envelopes.consumer_register(NULL)", "22004"),
            ("SELECT envelopes.consumer_register('x', NULL)", "22004"),
            (
                "SELECT * FROM envelopes.consumer_outbox_batch('c', 0)",
                "22023",
            ),
            (
                "SELECT * FROM envelopes.consumer_envelope_batch('c', 0)",
                "22023",
            ),
            (
                "SELECT * FROM envelopes.consumer_envelope_batch('c', NULL)",
                "22004",
            ),
            (
                "SELECT * FROM envelopes.consumer_envelope_batch('c', 10, 0)",
                "22023",
            ),
            (
                "SELECT * FROM envelopes.consumer_outbox_batch('c', 10, -1)",
                "22023",
            ),
            (
                "SELECT * FROM envelopes.consumer_envelope_batch(NULL)",
                "22004",
            ),
            (
                "SELECT envelopes.consumer_envelope_ack('c', '{1,2}', '{1}')",
                "2202E",
            ),
            (
                "SELECT envelopes.consumer_envelope_ack('c', '{1}', '{NULL}')",
                "22004",
            ),
            (
                "SELECT envelopes.consumer_envelope_ack('c', NULL, '{1}')",
                "22004",
            ),
            ("SELECT envelopes.consumer_outbox_ack('c', NULL)", "22004"),
            // No batch can have returned an id that was never drawn.
            (
                "SELECT envelopes.consumer_outbox_ack('c', 9223372036854775807)",
                "22023",
            ),
            (
                "SELECT envelopes.consumer_envelope_ack('c', '{}', '{}', 5)",
                "22023",
            ),
            (
                // Entry 1000 (a position is the entry id << 24 | an offset).
                "SELECT envelopes.consumer_envelope_ack('c', '{}', '{}', 16777216000)",
                "22023",
            ),
        ];
        Spi::run("SELECT envelopes.consumer_register('c')").unwrap();
        for (sql, expected) in cases {
            assert_eq!(sqlstate_of(sql).as_deref(), Some(expected), "{sql}");
        }
    }

    #[pg_test]
    fn envelope_acks_move_forward_only_and_are_logged() {
        Spi::run("SELECT envelopes.consumer_register('c')").unwrap();
        Spi::run(
            "SELECT envelopes.insert_gateway_envelope(1, s, '\\x01', '\\x01') FROM generate_series(1, 5) s",
        )
        .unwrap();
        assert_eq!(
            int8("SELECT envelopes.consumer_envelope_ack('c', '{1}', '{3}')"),
            3
        );
        assert_eq!(
            int8("SELECT envelopes.consumer_envelope_ack('c', '{1}', '{2}')"),
            0
        );
        assert_eq!(
            int8("SELECT envelopes.consumer_envelope_ack('c', '{1, 1}', '{4, 5}')"),
            2
        );
        assert_eq!(
            int8(
                "SELECT sequence_id FROM envelopes.consumer_envelope_cursors WHERE consumer = 'c'"
            ),
            5
        );
        assert_eq!(
            int8("SELECT sum(rows)::bigint FROM envelopes.delivery_log WHERE consumer = 'c'"),
            5
        );
        // Each ack that moved the clock raised the version its rows carry.
        assert_eq!(
            int8("SELECT version FROM envelopes.consumers WHERE name = 'c'"),
            2
        );
        assert_eq!(
            int8("SELECT version FROM envelopes.consumer_envelope_cursors WHERE consumer = 'c'"),
            2
        );
    }

    #[pg_test]
    fn dead_letters_are_recorded_once_and_retried_on_request() {
        Spi::run("SELECT envelopes.consumer_register('c')").unwrap();
        Spi::run("SELECT envelopes.insert_gateway_envelope(3, 7, '\\x01', '\\x0102')").unwrap();
        let record = "SELECT envelopes.consumer_dead_letter('c', 'envelope', 3, 7, NULL,
                          'message too large', 'MAX_PAYLOAD', 5)";
        let first = int8(record);
        assert_eq!(int8(record), first, "the same row is one dead letter");
        assert_eq!(
            int8("SELECT attempts::bigint FROM envelopes.dead_letters"),
            10
        );
        assert_eq!(
            int8("SELECT count(*) FROM envelopes.consumer_dead_letter_retries('c')"),
            0
        );
        assert_eq!(int8("SELECT envelopes.retry_dead_letters('c')"), 1);
        assert_eq!(
            int8(
                "SELECT count(*) FROM envelopes.consumer_dead_letter_retries('c')
                  WHERE originator_envelope = '\\x0102' AND kind = 'envelope'"
            ),
            1
        );
        assert_eq!(
            int8(&format!(
                "SELECT envelopes.consumer_dead_letter_resolved('c', ARRAY[{first}]::bigint[])"
            )),
            1
        );
        let cases = [
            (
                "SELECT envelopes.consumer_dead_letter('c', 'other', 1, 1, NULL, 'r', NULL, 1)",
                "22023",
            ),
            (
                "SELECT envelopes.consumer_dead_letter('c', 'envelope', 1, 1, NULL, 'r', NULL, 0)",
                "22023",
            ),
            (
                "SELECT envelopes.consumer_dead_letter('c', 'envelope', NULL, 1, NULL, 'r', NULL, 1)",
                "22004",
            ),
            (
                "SELECT envelopes.consumer_dead_letter('nobody', 'outbox', NULL, NULL, 1, 'r', NULL, 1)",
                "42704",
            ),
        ];
        for (sql, expected) in cases {
            assert_eq!(sqlstate_of(sql).as_deref(), Some(expected), "{sql}");
        }
    }
}
