//! New consumers: where they start, and who owns them.

use super::envelopes::move_cursor;
use super::owner::{self, Owner};
use super::ConsumerError;
use crate::pg::acl;
use crate::store::feed::late::Positions;
use crate::store::feed::markers::Drawn;
use crate::store::feed::Gate;
use crate::store::partition;
use pgrx::datum::DatumWithOid;
use pgrx::spi::Spi;

/// Where a new consumer starts: `(late_id, outbox_id, per-originator cursor)`
/// (`late_id` a late-feed position, see [`Positions`]).
/// From the start: the beginning of every feed. From the end: the ceilings, so a
/// row that a running transaction commits later is still ahead.
#[allow(clippy::type_complexity)]
fn starting_positions(from_start: bool) -> Result<(i64, i64, Vec<(i32, i64)>), ConsumerError> {
    if from_start {
        return Ok((0, 0, Vec::new()));
    }
    let nodes = partition::originators()?;
    Gate::read_settled(&nodes, |gate| {
        let mut cursor = Vec::new();
        for &node in &nodes {
            // A ceiling below the first id (all originators held back) is "no entry".
            if let Some(ceiling) = gate
                .envelope_ceiling(node)?
                .filter(|&c| c >= partition::FIRST_SEQUENCE_ID)
            {
                cursor.push((node, ceiling));
            }
        }
        Ok((
            Positions::current().whole(gate.drawn_ceiling(Drawn::Late)),
            gate.drawn_ceiling(Drawn::Outbox),
            cursor,
        ))
    })
}

/// Creates consumer `name` at the beginning of every feed or at their current
/// end (see `consumer_register`); an existing one keeps its positions.
pub fn register(name: &str, from_start: bool) -> Result<(), ConsumerError> {
    // An existing consumer keeps its positions; registering it again is allowed
    // to the roles that may act for it, and refused to the others.
    if let Some(owner) = owner::owner_of(name)? {
        return owner::check_owner(name, owner, owner::extension_owner()?);
    }
    let (late_id, outbox_id, cursor) = starting_positions(from_start)?;
    // The owner column exists from 0.4.0 on (see Owner::Untracked).
    let tracked = Spi::get_one::<bool>(
        "SELECT EXISTS (SELECT FROM pg_catalog.pg_attribute a
                         WHERE a.attrelid = 'envelopes.consumers'::pg_catalog.regclass
                           AND a.attname = 'owner' AND NOT a.attisdropped)",
    )?
    .unwrap_or(false);
    let insert = if tracked {
        "WITH c AS (
             INSERT INTO envelopes.consumers (name, late_id, outbox_id, owner)
             VALUES ($1, $2, $3, $4)
             ON CONFLICT DO NOTHING RETURNING 1)
         SELECT EXISTS (SELECT FROM c)"
    } else {
        "WITH c AS (
             INSERT INTO envelopes.consumers (name, late_id, outbox_id)
             VALUES ($1, $2, $3)
             ON CONFLICT DO NOTHING RETURNING 1)
         SELECT EXISTS (SELECT FROM c)"
    };
    let mut args = vec![
        DatumWithOid::from(name),
        DatumWithOid::from(late_id),
        DatumWithOid::from(outbox_id),
    ];
    if tracked {
        args.push(DatumWithOid::from(acl::caller()));
    }
    let created = Spi::get_one_with_args::<bool>(insert, &args)?.unwrap_or(false);
    if !created {
        // Another session registered it meanwhile: the same rule as above.
        let owner = owner::owner_of(name)?.unwrap_or(Owner::Untracked);
        return owner::check_owner(name, owner, owner::extension_owner()?);
    }
    if !cursor.is_empty() {
        move_cursor(name, cursor)?;
    }
    Ok(())
}
