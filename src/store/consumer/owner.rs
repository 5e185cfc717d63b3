//! Who may act for a consumer: the role that registered it (or a member of it)
//! and the extension's owner. The rule is written once, here: the batch and
//! acknowledgement functions apply it in Rust, the SQL functions through the
//! SQL function `envelopes._consumer_owner_check`, which calls it.

use super::ConsumerError;
use crate::pg::acl;
use pgrx::datum::DatumWithOid;
use pgrx::pg_sys;
use pgrx::spi::Spi;

/// Whether the caller may act for something owned by `owner`: it has that role's
/// privileges (is it, a member of it, or a superuser), or the extension owner's.
pub fn acts_for(owner: pg_sys::Oid, extension_owner: pg_sys::Oid) -> bool {
    let caller = acl::caller();
    acl::has_privileges_of(caller, owner) || acl::has_privileges_of(caller, extension_owner)
}

/// The extension's owner (its member roles act for every consumer).
pub fn extension_owner() -> Result<pg_sys::Oid, ConsumerError> {
    Spi::get_one::<pg_sys::Oid>(
        "SELECT e.extowner FROM pg_catalog.pg_extension e WHERE e.extname = 'pg_envelopes'",
    )?
    .ok_or(ConsumerError::Feed("pg_extension"))
}

/// Who owns a consumer, as read from its row.
#[derive(Clone, Copy)]
pub enum Owner {
    /// A role.
    Role(pg_sys::Oid),
    /// Nobody yet: made before 0.4.0, claimed by the first role that acts for it.
    Unclaimed,
    /// The table has no owner column: this library runs on a database whose
    /// schema is still at 0.3.0 (between installing the new library and
    /// `ALTER EXTENSION pg_envelopes UPDATE`), which had no owners.
    Untracked,
}

/// The two columns, selected from `envelopes.consumers c`, that [`Owner::read`]
/// reads: written so that they work whether or not the column exists.
pub const OWNER_COLUMNS: &str =
    "(pg_catalog.to_jsonb(c) ->> 'owner')::pg_catalog.regrole::pg_catalog.oid, pg_catalog.to_jsonb(c) ? 'owner'";

impl Owner {
    pub fn read(owner: Option<pg_sys::Oid>, tracked: Option<bool>) -> Owner {
        match (tracked.unwrap_or(false), owner) {
            (false, _) => Owner::Untracked,
            (true, Some(role)) => Owner::Role(role),
            (true, None) => Owner::Unclaimed,
        }
    }
}

/// Refuses (42501) a caller that may not act for `consumer`, owned by `owner`.
/// A consumer without an owner (registered before 0.4.0) becomes the caller's.
pub fn check_owner(
    consumer: &str,
    owner: Owner,
    extension_owner: pg_sys::Oid,
) -> Result<(), ConsumerError> {
    let owner = match owner {
        Owner::Role(owner) => owner,
        Owner::Unclaimed => claim(consumer)?,
        Owner::Untracked => return Ok(()),
    };
    if acts_for(owner, extension_owner) {
        Ok(())
    } else {
        Err(ConsumerError::NotOwner {
            consumer: consumer.to_owned(),
            owner: acl::role_name(owner),
        })
    }
}

/// Makes the caller the owner of a consumer that has none, unless another role
/// claimed it first; returns the owner. Consumers made before 0.4.0 have none, and
/// the bridge that goes on using one after the upgrade is the first to act for it.
fn claim(consumer: &str) -> Result<pg_sys::Oid, ConsumerError> {
    let owner = Spi::connect_mut(|client| {
        let rows = client.update(
            "UPDATE envelopes.consumers c SET owner = COALESCE(c.owner, $2)
              WHERE c.name = $1 RETURNING c.owner::pg_catalog.oid",
            None,
            &[
                DatumWithOid::from(consumer),
                DatumWithOid::from(acl::caller()),
            ],
        )?;
        if rows.is_empty() {
            return Ok::<_, pgrx::spi::SpiError>(None); // dropped meanwhile
        }
        rows.first().get_one::<pg_sys::Oid>()
    })?;
    owner.ok_or_else(|| ConsumerError::Unknown(consumer.to_owned()))
}

/// The owner of an existing consumer, `None` when there is no such consumer.
pub fn owner_of(name: &str) -> Result<Option<Owner>, ConsumerError> {
    Spi::connect(|client| {
        let rows = client.select(
            &format!("SELECT {OWNER_COLUMNS} FROM envelopes.consumers c WHERE c.name = $1"),
            None,
            &[DatumWithOid::from(name)],
        )?;
        if rows.is_empty() {
            return Ok(None);
        }
        let row = rows.first();
        Ok(Some(Owner::read(
            row.get::<pg_sys::Oid>(1)?,
            row.get::<bool>(2)?,
        )))
    })
}
