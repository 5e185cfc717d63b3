//! The lease functions the SQL wrappers call (`consumer_lease`, `ingress_lease`
//! and the functions that move positions, in `sql/consumer.sql` and
//! `sql/ingress.sql`); the leases themselves are [`crate::store::lease`].

use crate::error::OrRaise;
use crate::store::lease::{check, release, take, Kind, LeaseError};
use pgrx::prelude::*;

/// For the SQL wrappers (`consumer_lease`, `ingress_lease`, which check who may
/// act for the name first): takes the lease for this session and returns NULL,
/// or returns the pid of the session that holds it (0 when unknown).
#[pg_extern(volatile, parallel_unsafe)]
fn _lease_take(
    kind: Option<&str>,
    name: Option<&str>,
    stream: default!(Option<&str>, "''"),
) -> Option<i32> {
    (|| {
        let kind = Kind::parse(kind.ok_or(LeaseError::Null("kind"))?)?;
        let name = name.ok_or(LeaseError::Null("name"))?;
        take(kind, name, stream.unwrap_or(""))
    })()
    .or_raise()
}

/// For the SQL wrappers: gives up this session's lease; true if it held it.
#[pg_extern(volatile, parallel_unsafe)]
fn _lease_release(
    kind: Option<&str>,
    name: Option<&str>,
    stream: default!(Option<&str>, "''"),
) -> bool {
    (|| {
        let kind = Kind::parse(kind.ok_or(LeaseError::Null("kind"))?)?;
        let name = name.ok_or(LeaseError::Null("name"))?;
        Ok::<_, LeaseError>(release(kind, name, stream.unwrap_or("")))
    })()
    .or_raise()
}

/// For the PL/pgSQL functions that move positions: 55006 while another session
/// holds the lease.
#[pg_extern(volatile, parallel_unsafe)]
fn _lease_check(kind: Option<&str>, name: Option<&str>, stream: default!(Option<&str>, "''")) {
    (|| {
        let kind = Kind::parse(kind.ok_or(LeaseError::Null("kind"))?)?;
        let name = name.ok_or(LeaseError::Null("name"))?;
        check(kind, name, stream.unwrap_or(""))
    })()
    .or_raise()
}
