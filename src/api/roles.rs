//! Who acts for whom, for the SQL functions: the calling role, whether it may act
//! for an owner, and the owner rule of consumers (written once, in
//! [`crate::store::consumer::owner`]).

use crate::error::OrRaise;
use crate::pg::acl::{self, Oid};
use crate::store::consumer::owner::{self, Owner};
use pgrx::prelude::*;

/// For the SQL functions (`sql/consumer.sql`, `sql/ingress.sql`): whether the
/// calling role may act for something owned by `owner`.
#[pg_extern(stable, parallel_safe)]
fn _acts_for(owner: Oid) -> bool {
    owner::extension_owner()
        .map(|ext| owner::acts_for(owner, ext))
        .or_raise()
}

/// For the SQL functions: the calling role (see [`acl::caller`]).
#[pg_extern(stable, parallel_safe)]
fn _caller() -> Oid {
    acl::caller()
}

/// For the SQL functions that act for a consumer (`sql/consumer.sql`): refuses
/// (42501) a caller that may not act for `consumer`, owned by `owner`; a consumer
/// without an owner (registered before 0.4.0) becomes the caller's.
#[pg_extern(volatile, parallel_unsafe)]
fn _consumer_owner_check(consumer: &str, owner: Option<Oid>) {
    owner::extension_owner()
        .and_then(|ext| owner::check_owner(consumer, Owner::read(owner, Some(true)), ext))
        .or_raise()
}
