//! This backend's copy of each consumer's positions, and what its reads learned:
//! which originators a read found clean, so an idle poll returns at once.

use super::owner::{self, Owner, OWNER_COLUMNS};
use super::ConsumerError;
use crate::store::feed::clock;
use pgrx::datum::{DatumWithOid, TimestampWithTimeZone};
use pgrx::pg_sys;
use pgrx::spi::Spi;
use std::cell::RefCell;
use std::collections::HashMap;

/// Which checks a read of a consumer's row makes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Batches and acknowledgements: only the owner (and the extension's owner).
    Act,
    /// Status: any role allowed to call the function.
    Look,
}

/// A consumer's positions as stored, and what this backend learned from reads.
#[derive(Default)]
pub struct Known {
    /// Identity of the stored row: a consumer dropped and registered again is new.
    pub created_at: Option<TimestampWithTimeZone>,
    pub version: i64,
    pub cursor: HashMap<i32, i64>,
    pub late_id: i64,
    pub outbox_id: i64,
    /// Per originator, from a clean read: (its bucket's clock, the all-originators
    /// clock, the cursor value at which nothing was left to read).
    pub clean: HashMap<i32, (u64, u64, i64)>,
    /// From a clean read of the late feed: (its last value, the position reached).
    pub late_clean: Option<(i64, i64)>,
    /// The clocks, cursor version and late-feed state at which every originator
    /// and the late feed were last found clean: while they are all the same, the
    /// envelope feed is idle without looking at each originator.
    pub idle_at: Option<(Vec<u64>, i64, i64, i64)>,
    /// The same for the outbox.
    pub outbox_clean: Option<(i64, i64)>,
}

impl Known {
    pub fn cursor_of(&self, node: i32) -> i64 {
        self.cursor.get(&node).copied().unwrap_or(0)
    }

    /// Whether a clean read showed that `node` has nothing to read at these clocks.
    pub fn node_is_clean(&self, node: i32, clocks: &[u64]) -> bool {
        self.clean
            .get(&node)
            .is_some_and(|&(bucket, all, reached)| {
                clocks[clock::bucket(node)] == bucket
                    && clocks[clock::ALL] == all
                    && self.cursor_of(node) >= reached
            })
    }

    pub fn drawn_is_clean(clean: Option<(i64, i64)>, last: i64, position: i64) -> bool {
        clean.is_some_and(|(at, reached)| at == last && position >= reached)
    }

    /// Whether nothing of the envelope feed can be read: every originator and the
    /// late feed clean at these clocks and this late-feed value. Checked in
    /// constant time when nothing moved since the last time it held.
    pub fn envelopes_idle(&mut self, clocks: &[u64], last_late: i64, nodes: &[i32]) -> bool {
        let state = (self.version, last_late, self.late_id);
        if let Some((at, version, last, late_id)) = &self.idle_at {
            if at.as_slice() == clocks && (*version, *last, *late_id) == state {
                return true;
            }
        }
        let idle = Known::drawn_is_clean(self.late_clean, last_late, self.late_id)
            && nodes.iter().all(|&n| self.node_is_clean(n, clocks));
        self.idle_at = idle.then(|| (clocks.to_vec(), state.0, state.1, state.2));
        idle
    }
}

thread_local! {
    static KNOWN: RefCell<HashMap<String, Known>> = RefCell::new(HashMap::new());
}

/// Brings this backend's copy of `consumer`'s positions up to date and runs `f`
/// on it. Only cursor rows newer than the cached version are read.
pub fn with_consumer<R>(
    consumer: &str,
    access: Access,
    f: impl FnOnce(&mut Known) -> Result<R, ConsumerError>,
) -> Result<R, ConsumerError> {
    let (created_at, version, late_id, outbox_id, owner, extension_owner) =
        Spi::connect(|client| {
            let rows = client.select(
                &format!(
                    "SELECT c.created_at, c.version, c.late_id, c.outbox_id, {OWNER_COLUMNS},
                            (SELECT e.extowner FROM pg_catalog.pg_extension e
                              WHERE e.extname = 'pg_envelopes')
                       FROM envelopes.consumers c WHERE c.name = $1"
                ),
                None,
                &[DatumWithOid::from(consumer)],
            )?;
            if rows.is_empty() {
                return Err(ConsumerError::Unknown(consumer.to_owned()));
            }
            let row = rows.first();
            Ok::<_, ConsumerError>((
                row.get::<TimestampWithTimeZone>(1)?,
                row.get::<i64>(2)?.unwrap_or(0),
                row.get::<i64>(3)?.unwrap_or(0),
                row.get::<i64>(4)?.unwrap_or(0),
                Owner::read(row.get::<pg_sys::Oid>(5)?, row.get::<bool>(6)?),
                row.get::<pg_sys::Oid>(7)?.unwrap_or(pg_sys::InvalidOid),
            ))
        })?;
    if access == Access::Act {
        owner::check_owner(consumer, owner, extension_owner)?;
    }
    let known_version = KNOWN.with(|known| {
        let mut known = known.borrow_mut();
        let entry = known.entry(consumer.to_owned()).or_default();
        if entry.created_at != created_at || entry.version > version {
            *entry = Known {
                created_at,
                version: -1,
                ..Known::default()
            };
        }
        entry.version
    });
    if known_version != version {
        let changed =
            Spi::connect(|client| {
                let mut changed = Vec::new();
                for row in client.select(
                "SELECT originator_node_id, sequence_id FROM envelopes.consumer_envelope_cursors
                  WHERE consumer = $1 AND version > $2",
                None,
                &[DatumWithOid::from(consumer), DatumWithOid::from(known_version)],
            )? {
                if let (Some(node), Some(seq)) = (row.get::<i32>(1)?, row.get::<i64>(2)?) {
                    changed.push((node, seq));
                }
            }
                Ok::<_, ConsumerError>(changed)
            })?;
        KNOWN.with(|known| {
            if let Some(entry) = known.borrow_mut().get_mut(consumer) {
                entry.cursor.extend(changed);
                entry.version = version;
            }
        });
    }
    KNOWN.with(|known| {
        let mut known = known.borrow_mut();
        let entry = known
            .get_mut(consumer)
            .ok_or(ConsumerError::Feed("consumer cache"))?;
        entry.late_id = late_id;
        entry.outbox_id = outbox_id;
        f(entry)
    })
}
