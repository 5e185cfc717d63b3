//! The backend-local cache of partitions known to exist.
//!
//! The insert hot path asks this cache which leaf partition will receive a row and
//! never queries the catalog while the answer is cached. The cache is kept honest
//! by Postgres' own relcache invalidation: a partition attached, detached or
//! dropped by any session invalidates the relcache entry of its parent (and of
//! itself), and the callback registered here forgets the affected originator.
//! The insert path locks the routed relations before trusting an entry: lock
//! acquisition processes pending invalidations, so an entry that survives the
//! lock names a partition that cannot be dropped until this transaction ends.

use super::band::{RangeBound, Table};
use crate::pg::scan::Path;
use pgrx::pg_sys::{self, Oid};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;

/// Where a row goes: the root, the originator-level partition and the band leaf,
/// and whether the direct paths may write the leaf (see `OriginatorParts::path`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Route {
    pub root: Oid,
    pub parent: Oid,
    pub leaf: Oid,
    pub path: Path,
}

/// One originator-level partition and its band partitions, sorted by lower bound.
#[derive(Clone, Debug, Default)]
pub struct OriginatorParts {
    pub parent: Oid,
    pub bands: Vec<(RangeBound, Oid)>,
    /// The bands the direct paths cannot use (see `catalog::band_lacks`), read
    /// and written through the executor instead. Usually none.
    pub executor: Vec<Oid>,
}

impl OriginatorParts {
    /// How the read paths read band `leaf`.
    pub fn path(&self, leaf: Oid) -> Path {
        if self.executor.contains(&leaf) {
            Path::Executor
        } else {
            Path::Index
        }
    }

    pub fn sort(&mut self) {
        // MINVALUE (None) sorts first, which is what lower bounds mean.
        self.bands.sort_by_key(|(bound, _)| bound.lower);
    }

    /// The leaf whose range contains `seq`, if any.
    pub fn leaf_for(&self, seq: i64) -> Option<Oid> {
        // Bands never overlap: the candidate is the last one starting at or below seq.
        let idx = self
            .bands
            .partition_point(|(bound, _)| bound.lower.is_none_or(|l| l <= seq));
        let (bound, leaf) = self.bands.get(idx.checked_sub(1)?)?;
        bound.contains(seq).then_some(*leaf)
    }
}

#[derive(Default)]
struct Known {
    /// Root oids, meta then blob.
    roots: Option<[Oid; 2]>,
    /// Node ids of the originator partitions of the meta root, ascending. Attaching
    /// or detaching an originator invalidates the root, which clears this.
    nodes: Option<Vec<i32>>,
    originators: HashMap<(Table, i32), OriginatorParts>,
    /// Every parent and leaf oid in `originators`, pointing back at its entry, so
    /// the invalidation callback can find what to forget in O(1).
    by_oid: HashMap<Oid, (Table, i32)>,
    /// What the catalog said of each band read so far: why the direct paths
    /// cannot use it (None: they can). Kept when its originator is
    /// forgotten (a band attached beside it invalidates the parent), forgotten
    /// with the band's own invalidation (attached elsewhere, an index changed):
    /// so loading an originator again after a new band reads only the new one
    /// from the catalog, not all of them (the cost of a creation grew with the
    /// originator's bands).
    bands: HashMap<Oid, BandFacts>,
}

/// What [`Known::bands`] keeps of one band.
#[derive(Clone, Debug)]
pub struct BandFacts {
    /// Why the direct paths cannot use it (None: they can).
    pub lacks: Option<String>,
}

impl Known {
    fn forget(&mut self, relid: Oid) {
        if relid == pg_sys::InvalidOid {
            *self = Known::default();
            return;
        }
        self.bands.remove(&relid);
        if self.roots.is_some_and(|roots| roots.contains(&relid)) {
            self.roots = None;
            self.nodes = None;
        }
        if let Some(key) = self.by_oid.remove(&relid) {
            if let Some(parts) = self.originators.remove(&key) {
                self.by_oid.remove(&parts.parent);
                for (_, leaf) in parts.bands {
                    self.by_oid.remove(&leaf);
                }
            }
        }
    }
}

thread_local! {
    static KNOWN: RefCell<Known> = RefCell::new(Known::default());
    /// Set when an invalidation arrived while the cache was borrowed; the next
    /// access then drops everything. Never expected, but never unsafe either.
    static STALE: Cell<bool> = const { Cell::new(false) };
}

fn with_known<R>(f: impl FnOnce(&mut Known) -> R) -> R {
    KNOWN.with(|known| {
        let mut known = known.borrow_mut();
        if STALE.replace(false) {
            *known = Known::default();
        }
        f(&mut known)
    })
}

/// Told about every relcache invalidation ([`crate::pg::invalidation::on_relation`]):
/// forgets what it concerns. Runs inside Postgres' invalidation processing, so it
/// must not raise an error: it only edits Rust collections.
fn forget_relation(relid: Oid) {
    KNOWN.with(|known| match known.try_borrow_mut() {
        Ok(mut known) => known.forget(relid),
        Err(_) => STALE.set(true),
    });
}

/// Registers [`forget_relation`]. Called once per process from `_PG_init`.
pub fn register_invalidation_callback() {
    crate::pg::invalidation::on_relation(forget_relation);
}

/// What the catalog said of band `relid`, if it was read since its last change.
pub fn band_facts(relid: Oid) -> Option<BandFacts> {
    with_known(|known| known.bands.get(&relid).cloned())
}

pub fn store_band_facts(relid: Oid, facts: BandFacts) {
    with_known(|known| {
        known.bands.insert(relid, facts);
    });
}

pub fn roots() -> Option<[Oid; 2]> {
    with_known(|known| known.roots)
}

pub fn store_roots(roots: [Oid; 2]) {
    with_known(|known| known.roots = Some(roots));
}

/// Node ids of all originators, ascending, if known.
pub fn originators() -> Option<Vec<i32>> {
    with_known(|known| known.nodes.clone())
}

pub fn store_originators(mut nodes: Vec<i32>) {
    nodes.sort_unstable();
    with_known(|known| {
        // Only meaningful together with the roots they were read from.
        if known.roots.is_some() {
            known.nodes = Some(nodes);
        }
    });
}

/// What is known about one originator in one table.
pub fn parts(table: Table, node: i32) -> Option<OriginatorParts> {
    with_known(|known| known.originators.get(&(table, node)).cloned())
}

/// The cached route of `(node, seq)` in `table`, if both levels are known.
pub fn route(table: Table, node: i32, seq: i64) -> Option<Route> {
    with_known(|known| {
        let roots = known.roots?;
        let parts = known.originators.get(&(table, node))?;
        let leaf = parts.leaf_for(seq)?;
        Some(Route {
            root: roots[table as usize],
            parent: parts.parent,
            leaf,
            path: parts.path(leaf),
        })
    })
}

/// Replaces what is known about one originator in one table.
pub fn store(table: Table, node: i32, mut parts: OriginatorParts) {
    parts.sort();
    with_known(|known| {
        if let Some(old) = known.originators.remove(&(table, node)) {
            known.by_oid.remove(&old.parent);
            for (_, leaf) in old.bands {
                known.by_oid.remove(&leaf);
            }
        }
        known.by_oid.insert(parts.parent, (table, node));
        for (_, leaf) in &parts.bands {
            known.by_oid.insert(*leaf, (table, node));
        }
        known.originators.insert((table, node), parts);
    });
}

/// Forgets everything, e.g. after a transaction that created partitions aborted.
pub fn forget_all() {
    with_known(|known| *known = Known::default());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn oid(n: u32) -> Oid {
        Oid::from(n)
    }

    #[test]
    fn finds_the_covering_band() {
        let mut parts = OriginatorParts {
            parent: oid(10),
            bands: vec![
                (
                    RangeBound {
                        lower: Some(100),
                        upper: Some(200),
                    },
                    oid(12),
                ),
                (
                    RangeBound {
                        lower: Some(0),
                        upper: Some(100),
                    },
                    oid(11),
                ),
                (
                    RangeBound {
                        lower: Some(300),
                        upper: None,
                    },
                    oid(13),
                ),
            ],
            executor: Vec::new(),
        };
        parts.sort();
        assert_eq!(parts.leaf_for(0), Some(oid(11)));
        assert_eq!(parts.leaf_for(99), Some(oid(11)));
        assert_eq!(parts.leaf_for(100), Some(oid(12)));
        assert_eq!(parts.leaf_for(250), None);
        assert_eq!(parts.leaf_for(i64::MAX), Some(oid(13)));
    }
}
