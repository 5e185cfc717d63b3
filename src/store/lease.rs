//! Leases: at most one active bridge per consumer (egress) and per ingress name
//! and stream, whatever else runs beside it.
//!
//! A lease is a session-level advisory lock in exclusive mode, held by the
//! bridge's database session for as long as that session lives (the server
//! releases it when the session ends, a `kill -9` of the bridge included: the
//! backend sees the socket close). A second bridge under the same name finds it
//! taken and waits as a standby, asking again every few hundred milliseconds, and
//! takes over once the first one's session is gone.
//!
//! The lease is enforced where it matters, in the functions that move positions
//! (`consumer_envelope_ack`, `consumer_outbox_ack`, the dead-letter functions,
//! `ingress_store_position`): each asks for the same lock in share mode for its
//! transaction, without waiting. The holder's own session is never in conflict
//! with itself, and while nobody holds the lease (a client that does not use
//! leases at all) everyone gets it; but while another session holds it, the call
//! fails with 55006 and moves nothing. So a position is only ever moved by the
//! session that holds the lease, or while nobody does: an instance that lost its
//! session cannot commit anything, and one that never had the lease cannot move
//! the positions the holder relies on. Both modes are transaction- or
//! session-level heavyweight locks: nothing here outlives the session.

use crate::error::{PgSqlErrorCode, SqlError};
use crate::pg::locks;
use pgrx::datum::DatumWithOid;
use pgrx::pg_sys;
use pgrx::spi::Spi;

/// Errors of the lease functions.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error("{0} must not be NULL")]
    Null(&'static str),
    #[error("unknown lease kind {0:?}: expected egress or ingress")]
    Kind(String),
    #[error("{what} \"{name}\" is leased by another session{holder}: only the active bridge may move its positions")]
    Held {
        what: &'static str,
        name: String,
        holder: String,
    },
    #[error("SPI error in the lease functions: {0}")]
    Spi(#[from] pgrx::spi::SpiError),
}

impl SqlError for LeaseError {
    fn sqlstate(&self) -> PgSqlErrorCode {
        use PgSqlErrorCode::*;
        match self {
            LeaseError::Null(_) => ERRCODE_NULL_VALUE_NOT_ALLOWED,
            LeaseError::Kind(_) => ERRCODE_INVALID_PARAMETER_VALUE,
            LeaseError::Held { .. } => ERRCODE_OBJECT_IN_USE,
            LeaseError::Spi(_) => ERRCODE_INTERNAL_ERROR,
        }
    }

    fn hint(&self) -> Option<String> {
        match self {
            LeaseError::Held { .. } => Some(
                "A second bridge under the same name waits as a standby until the active one's \
                 session ends; stop the other instance, or give this one its own name."
                    .into(),
            ),
            _ => None,
        }
    }
}

/// What a lease is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A consumer of the change feed (the egress bridge): one per consumer name.
    Egress,
    /// An ingress position: one per (consumer name, stream).
    Ingress,
}

impl Kind {
    pub fn parse(kind: &str) -> Result<Kind, LeaseError> {
        match kind {
            "egress" => Ok(Kind::Egress),
            "ingress" => Ok(Kind::Ingress),
            other => Err(LeaseError::Kind(other.to_owned())),
        }
    }

    fn label(self) -> &'static str {
        match self {
            Kind::Egress => "consumer",
            Kind::Ingress => "ingress consumer",
        }
    }
}

/// The 64-bit key of a lease: FNV-1a over the kind, the name and the stream,
/// separated by NUL bytes (which text never contains, so two different triples
/// never give the same input). A fixed, fully specified function, so that every
/// backend and every build of the library computes the same key; two triples
/// that hash alike would only make one bridge wait behind the other.
pub fn key(kind: Kind, name: &str, stream: &str) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let kind: &[u8] = match kind {
        Kind::Egress => b"egress",
        Kind::Ingress => b"ingress",
    };
    let mut hash = OFFSET;
    for part in [kind, name.as_bytes(), stream.as_bytes()] {
        for &byte in part.iter().chain(std::iter::once(&0u8)) {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(PRIME);
        }
    }
    hash
}

/// Takes the lease for this session unless another session holds it. Returns
/// `None` when this session holds it now (taken, or already held), or the pid of
/// the session that holds it (0 when it cannot be told, e.g. a transaction that
/// moves positions without a lease holds it in share mode for a moment).
///
/// With `envelopes.lease_timeout` set in this session, a holder that has been
/// silent for longer (idle, or idle in a transaction, by `pg_stat_activity`:
/// the heartbeat every session shows the server) is ended with
/// `pg_terminate_backend` and the lease taken: a bridge that stopped, or a
/// lease left on a pooled server connection, no longer blocks its standby
/// until the server's own timeouts (or the pooler's) end that session. The
/// lease's own lock still decides who may acknowledge: the ended holder's
/// session is gone before this one gets the lock, so no acknowledgement of
/// the old holder can commit after it. The session that takes the lease with
/// the setting on gets `idle_session_timeout` and
/// `idle_in_transaction_session_timeout` no longer than it, so that the
/// server itself ends a holder that falls silent (fencing it) even where no
/// standby asks.
pub fn take(kind: Kind, name: &str, stream: &str) -> Result<Option<i32>, LeaseError> {
    let timeout = crate::gucs::lease_timeout();
    let holder = try_take(kind, name, stream)?;
    let Some(timeout) = timeout else {
        return Ok(holder);
    };
    let holder = match holder {
        Some(pid) if pid > 0 && lapsed(pid, timeout)? => {
            end_lapsed_holder(kind, name, pid, timeout)?;
            try_take(kind, name, stream)?
        }
        other => other,
    };
    if holder.is_none() {
        bound_silence(timeout)?;
    }
    Ok(holder)
}

/// Whether the session `pid` has been idle (or idle in a transaction) for
/// longer than `timeout`. False when it cannot be seen (`track_activities`
/// off, or a caller without the right to see other sessions).
fn lapsed(pid: i32, timeout: std::time::Duration) -> Result<bool, LeaseError> {
    let ms = i64::try_from(timeout.as_millis()).unwrap_or(i64::MAX);
    Ok(Spi::get_one_with_args::<bool>(
        "SELECT a.state IN ('idle', 'idle in transaction', 'idle in transaction (aborted)')
                AND a.state_change < pg_catalog.clock_timestamp()
                                     - pg_catalog.make_interval(secs => $2 / 1000.0)
           FROM pg_catalog.pg_stat_activity a
          WHERE a.pid = $1",
        &[DatumWithOid::from(pid), DatumWithOid::from(ms)],
    )?
    .unwrap_or(false))
}

/// Ends the session `pid`, whose hold on the lease lapsed, and waits (up to 5
/// s) until it is gone, which releases its locks.
fn end_lapsed_holder(
    kind: Kind,
    name: &str,
    pid: i32,
    timeout: std::time::Duration,
) -> Result<(), LeaseError> {
    pgrx::log!(
        "pg_envelopes: {} \"{name}\": its holder (backend pid {pid}) has been silent for more \
         than envelopes.lease_timeout ({} ms): ending that session to take the lease",
        kind.label(),
        timeout.as_millis()
    );
    let gone = Spi::get_one_with_args::<bool>(
        "SELECT pg_catalog.pg_terminate_backend($1, 5000)",
        &[DatumWithOid::from(pid)],
    )?;
    if gone != Some(true) {
        pgrx::log!("pg_envelopes: backend pid {pid} was not ended within 5 s");
    }
    Ok(())
}

/// Lowers this session's `idle_session_timeout` and
/// `idle_in_transaction_session_timeout` to `timeout` where they are off or
/// longer, for as long as the session lives.
fn bound_silence(timeout: std::time::Duration) -> Result<(), LeaseError> {
    let ms = i64::try_from(timeout.as_millis()).unwrap_or(i64::MAX);
    for setting in [
        "idle_session_timeout",
        "idle_in_transaction_session_timeout",
    ] {
        Spi::run_with_args(
            "SELECT pg_catalog.set_config($1, $2::text, false)
              WHERE pg_catalog.current_setting($1)::pg_catalog.interval
                    OPERATOR(pg_catalog.=) '0'::pg_catalog.interval
                 OR pg_catalog.current_setting($1)::pg_catalog.interval
                    OPERATOR(pg_catalog.>) pg_catalog.make_interval(secs => $2 / 1000.0)",
            &[DatumWithOid::from(setting), DatumWithOid::from(ms)],
        )?;
    }
    Ok(())
}

/// [`take`] without looking at the holder's health.
fn try_take(kind: Kind, name: &str, stream: &str) -> Result<Option<i32>, LeaseError> {
    let key = key(kind, name, stream);
    let tag = locks::lease_tag(key);
    let mode = pg_sys::ExclusiveLock as pg_sys::LOCKMODE;
    // A session lock survives the transaction and is released when the session
    // ends or by a session-level release; not waiting returns at once.
    match locks::acquire(&tag, mode, locks::Hold::Session, false) {
        locks::Acquired::Busy => Ok(Some(holder(key)?.unwrap_or(0))),
        locks::Acquired::AlreadyHeld => {
            // Held by this session already: give back the count just added, so
            // that one release (or the end of the session) frees it.
            locks::release(&tag, mode, locks::Hold::Session);
            Ok(None)
        }
        locks::Acquired::Granted => Ok(None),
    }
}

/// Gives the lease up if this session holds it; true if it did.
pub fn release(kind: Kind, name: &str, stream: &str) -> bool {
    let tag = locks::lease_tag(key(kind, name, stream));
    let mode = pg_sys::ExclusiveLock as pg_sys::LOCKMODE;
    locks::held_by_me(&tag, mode) && locks::release(&tag, mode, locks::Hold::Session)
}

/// Fails with 55006 when another session holds the lease; otherwise keeps it from
/// being taken by anyone else until this transaction ends.
pub fn check(kind: Kind, name: &str, stream: &str) -> Result<(), LeaseError> {
    let key = key(kind, name, stream);
    let tag = locks::lease_tag(key);
    // In share mode at transaction level (released by the lock manager at commit
    // or abort); a lock this backend holds in exclusive mode never conflicts
    // with its own share request.
    let result = locks::acquire(
        &tag,
        pg_sys::ShareLock as pg_sys::LOCKMODE,
        locks::Hold::Transaction,
        false,
    );
    if result == locks::Acquired::Busy {
        let holder = match holder(key)? {
            Some(pid) => format!(" (backend pid {pid})"),
            None => String::new(),
        };
        return Err(LeaseError::Held {
            what: kind.label(),
            name: name.to_owned(),
            holder,
        });
    }
    Ok(())
}

/// The pid of the session holding the lease with this key in exclusive mode.
fn holder(key: u64) -> Result<Option<i32>, LeaseError> {
    let tag = locks::lease_tag(key);
    Ok(Spi::get_one_with_args::<i32>(
        "SELECT l.pid FROM pg_catalog.pg_locks l
          WHERE l.locktype = 'advisory' AND l.database = $1 AND l.classid = $2
            AND l.objid = $3 AND l.objsubid = $4 AND l.granted AND l.mode = 'ExclusiveLock'
          LIMIT 1",
        &[
            DatumWithOid::from(pg_sys::Oid::from(tag.locktag_field1)),
            DatumWithOid::from(pg_sys::Oid::from(tag.locktag_field2)),
            DatumWithOid::from(pg_sys::Oid::from(tag.locktag_field3)),
            DatumWithOid::from(i16::from_ne_bytes(tag.locktag_field4.to_ne_bytes())),
        ],
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_fnv1a_of_the_separated_parts() {
        // FNV-1a 64 of "egress\0a\0\0", computed by hand from the definition.
        let mut expected: u64 = 0xcbf2_9ce4_8422_2325;
        for b in b"egress\0a\0\0" {
            expected ^= u64::from(*b);
            expected = expected.wrapping_mul(0x100_0000_01b3);
        }
        assert_eq!(key(Kind::Egress, "a", ""), expected);
        // The separators keep the parts apart.
        assert_ne!(key(Kind::Ingress, "ab", "c"), key(Kind::Ingress, "a", "bc"));
        assert_ne!(key(Kind::Egress, "x", ""), key(Kind::Ingress, "x", ""));
    }
}
