//! Reading what partitions exist from the catalog (the slow path only) and the DDL
//! that creates missing ones.
//!
//! Partitions are created with `CREATE TABLE ... (LIKE root ...)` followed by
//! `ALTER TABLE parent ATTACH PARTITION`, never `CREATE TABLE ... PARTITION OF`:
//! ATTACH takes SHARE UPDATE EXCLUSIVE on the parent, which does not block
//! concurrent inserts, where PARTITION OF takes ACCESS EXCLUSIVE. The new table is
//! empty, so ATTACH's validation scan reads nothing and no helper CHECK constraint
//! is needed to skip it.
//!
//! DDL cannot take `$n` parameters. Every identifier is built whole, then quoted
//! with `quote_identifier`; the only other values spliced into DDL text are
//! integers formatted by Rust (node ids and band bounds), never caller text.

use super::band::{self, Band, RangeBound, Table};
use super::cache::{self, OriginatorParts};
use super::PartitionError;
use crate::pg::locks::RelationLock;
use crate::pg::rel::Rel;
use crate::pg::scan;
use pgrx::pg_sys::{self, Oid};
use pgrx::spi::{quote_identifier, Spi};

/// The extension's schema (fixed: the extension is not relocatable).
pub const SCHEMA: &str = "envelopes";

fn qualified(name: &str) -> String {
    format!("{}.{}", quote_identifier(SCHEMA), quote_identifier(name))
}

/// Oids of the two root tables, resolved through the syscache.
pub fn root_oids() -> Result<[Oid; 2], PartitionError> {
    let namespace = namespace_oid()?;
    let mut roots = [pg_sys::InvalidOid; 2];
    for table in Table::ALL {
        let name =
            std::ffi::CString::new(table.root_name()).map_err(|_| PartitionError::NotInstalled)?;
        roots[table as usize] = crate::pg::catalog::relation_in(namespace, &name)
            .ok_or(PartitionError::NotInstalled)?;
    }
    Ok(roots)
}

fn namespace_oid() -> Result<Oid, PartitionError> {
    crate::pg::catalog::namespace(c"envelopes").ok_or(PartitionError::NotInstalled)
}

/// What exists for `node` in `table`: `None` when the originator-level partition
/// does not exist, an error when a relation of that name exists but is not a
/// partition of the root.
///
/// This reads the relcache and syscache, not the catalog through SQL: an SQL query
/// would see the catalog as of the caller's snapshot, which in REPEATABLE READ (or
/// in READ COMMITTED before the caller's first write) predates partitions that
/// another session committed while this one waited for the creation lock. The
/// caches follow the latest committed catalog once invalidations are processed.
pub fn load_originator(
    table: Table,
    node: i32,
    root: Oid,
) -> Result<Option<OriginatorParts>, PartitionError> {
    let name = band::originator_table_name(table, node);
    let parent = relid(&name)?;
    if parent == pg_sys::InvalidOid {
        return Ok(None);
    }
    if partition_parents(parent)?.first() != Some(&root) {
        return Err(PartitionError::NotAPartition { name });
    }
    let mut parts = OriginatorParts {
        parent,
        bands: Vec::new(),
        executor: Vec::new(),
    };
    let kind = crate::pg::catalog::relkind(parent).unwrap_or(0);
    if kind == pg_sys::RELKIND_PARTITIONED_TABLE {
        // A child that is not a range band (a user's DEFAULT partition) never
        // routes our rows: the descriptor's ranges leave it out.
        for (lower, upper, leaf) in crate::pg::rel::range_partitions(parent) {
            parts.bands.push((band::RangeBound { lower, upper }, leaf));
            if checking_bands() {
                let lacks = match cache::band_facts(leaf) {
                    Some(facts) => facts.lacks,
                    None => {
                        let lacks = band_lacks(leaf, table);
                        if lacks != Some(Lacks::Gone) {
                            cache::store_band_facts(
                                leaf,
                                cache::BandFacts {
                                    lacks: lacks.as_ref().map(ToString::to_string),
                                },
                            );
                        }
                        lacks.map(|lacks| lacks.to_string())
                    }
                };
                if let Some(lacks) = lacks {
                    pgrx::debug1!(
                        "pg_envelopes: band {} of originator {node} {lacks}: it is read and \
                         written through the executor",
                        leaf.to_u32()
                    );
                    parts.executor.push(leaf);
                }
            }
        }
    } else {
        // The owner made the originator's partition a table of its own: it holds
        // every sequence id, one band from MINVALUE to MAXVALUE.
        parts.bands.push((
            band::RangeBound {
                lower: None,
                upper: None,
            },
            parent,
        ));
        if let Some(lacks) = band_lacks(parent, table) {
            pgrx::debug1!(
                "pg_envelopes: the partition of originator {node} {lacks}: it is read and \
                 written through the executor"
            );
            parts.executor.push(parent);
        }
    }
    parts.sort();
    Ok(Some(parts))
}

thread_local! {
    /// Cleared in a partition-creation worker, which only plans and creates
    /// bands: what each band lacks for the direct paths (a relcache entry built
    /// per band, in a process that starts with none) is of no use to it.
    static CHECK_BANDS: std::cell::Cell<bool> = const { std::cell::Cell::new(true) };
}

fn checking_bands() -> bool {
    CHECK_BANDS.with(std::cell::Cell::get)
}

/// For the partition-creation worker: load originators without checking their
/// bands (see [`CHECK_BANDS`]).
pub fn skip_band_checks() {
    CHECK_BANDS.with(|c| c.set(false));
}

/// What a band's table lacks for the direct paths: the insert functions' direct
/// write path and the read paths' index scans (`crate::pg::scan`), which need a plain
/// heap table with the store's btree indexes. A band that lacks something is
/// served through the executor instead (SQL inserts through the roots, queries on
/// the band), whatever the owner made of it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Lacks {
    #[error("is partitioned")]
    Partitioned,
    #[error("is a foreign table")]
    Foreign,
    #[error("is not a plain table (relkind '{0}')")]
    NotATable(char),
    #[error("uses the table access method \"{0}\", not heap")]
    AccessMethod(String),
    #[error("has no valid btree primary key on (originator_node_id, originator_sequence_id)")]
    PrimaryKey,
    #[error("has no valid btree index on (topic, originator_sequence_id)")]
    TopicIndex,
    #[error("no longer exists")]
    Gone,
}

/// What band `relid` of `table` lacks for the direct paths, if anything (see
/// [`Lacks`]). Checked when the catalog loads a band, from the relcache (a band
/// dropped meanwhile is [`Lacks::Gone`]; one altered later sends an
/// invalidation, which makes the cache load the originator again); the paths
/// that dereference a band check what they dereference once they hold its lock.
///
/// The band is locked (ACCESS SHARE) while it is looked at and given back at
/// once: a band dropped by another session (`prune_expired` drops empty ones)
/// while this one held its relcache entry would otherwise fail the look with
/// "relation ... deleted while still in use" when the drop's invalidation
/// arrives. A band being dropped is waited for, then found gone.
pub fn band_lacks(relid: Oid, table: Table) -> Option<Lacks> {
    let _locked = RelationLock::take(relid, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
    let Some(rel) = Rel::reference(relid) else {
        return Some(Lacks::Gone);
    };
    direct_lacks(&rel, table)
}

/// [`band_lacks`] of an open relation.
pub fn direct_lacks(rel: &Rel, table: Table) -> Option<Lacks> {
    let facts = rel.table_facts();
    match facts.kind {
        pg_sys::RELKIND_RELATION => {}
        pg_sys::RELKIND_PARTITIONED_TABLE => return Some(Lacks::Partitioned),
        pg_sys::RELKIND_FOREIGN_TABLE => return Some(Lacks::Foreign),
        other => return Some(Lacks::NotATable(other as char)),
    }
    if facts.access_method != pg_sys::HEAP_TABLE_AM_OID || !scan::can_read(rel) {
        return Some(Lacks::AccessMethod(rel.access_method_name()));
    }
    if !scan::primary_key_serves(rel, scan::ENVELOPE_KEY) {
        return Some(Lacks::PrimaryKey);
    }
    if table == Table::Meta && !scan::some_index_serves(rel, scan::TOPIC_KEY) {
        return Some(Lacks::TopicIndex);
    }
    None
}

/// Node ids of every originator partition attached to `root`. A child whose bound
/// is not a single integer (not one of ours) is left out.
pub fn list_originators(root: Oid) -> Result<Vec<i32>, PartitionError> {
    Ok(partition_oids(root)?
        .into_iter()
        .filter_map(|child| {
            crate::pg::catalog::partition_bound(child)
                .as_deref()
                .and_then(band::parse_list_bound)
        })
        .collect())
}

/// The partitions of a partitioned table, read from pg_inherits with the latest
/// snapshot. Not from the relcache partition descriptor: right after another
/// session committed an ATTACH, this backend's cached descriptor was seen to
/// still lack the new partition (the new pg_inherits row sends no catalog-cache
/// invalidation), while the syscache already knew the new table by name.
fn partition_oids(parent: Oid) -> Result<Vec<Oid>, PartitionError> {
    Ok(crate::pg::catalog::inheritors(parent))
}

/// The parents a relation is attached to (one for a partition, none for a table
/// that is not one), by the same latest-snapshot read of pg_inherits. One index
/// probe on the child: asking whether the root's children contain it would read
/// every originator's row, once per originator loaded.
fn partition_parents(child: Oid) -> Result<Vec<Oid>, PartitionError> {
    Ok(crate::pg::catalog::inherited_from(child))
}

/// Creates the originator-level partition of `table` for `node`, attached to the root.
pub fn create_originator(table: Table, node: i32) -> Result<(), PartitionError> {
    let root = qualified(table.root_name());
    let name = band::originator_table_name(table, node);
    let bound = format!("FOR VALUES IN ({node})");
    if check_name(&name, root_oids()?[table as usize], &bound)? == Name::Ours {
        return Ok(());
    }
    let parent = qualified(&name);
    let mut ddl = vec![format!(
        "CREATE TABLE {parent} (LIKE {root} INCLUDING DEFAULTS INCLUDING CONSTRAINTS) \
         PARTITION BY RANGE (originator_sequence_id)"
    )];
    ddl.extend(originator_indexes(table, &parent));
    ddl.push(format!(
        "ALTER TABLE {root} ATTACH PARTITION {parent} FOR VALUES IN ({node})"
    ));
    run_ddl(&ddl)
}

/// The indexes of an originator's partition, made while it is still empty and
/// cloned by `ATTACH PARTITION` into every band attached to it. They live here,
/// not on the roots: the roots are the extension's own tables, which a restore
/// creates with `CREATE EXTENSION` before it attaches the dumped partitions, and
/// an index on a root would then be cloned into each of them a moment before the
/// dump creates the same index again (`pg_restore` failed on exactly that). The
/// names are those Postgres chooses for a clone, so a store upgraded from 0.3.0
/// (whose partitions kept the clones of the old roots' indexes) has the same.
/// Each band is one originator's, so a key unique in its originator's partition
/// is unique in the store.
pub fn originator_indexes(table: Table, parent: &str) -> Vec<String> {
    let mut ddl = vec![format!(
        "ALTER TABLE {parent} ADD PRIMARY KEY (originator_node_id, originator_sequence_id)"
    )];
    if table == Table::Meta {
        ddl.push(format!(
            "CREATE INDEX ON {parent} (topic, originator_sequence_id)"
        ));
        ddl.push(format!(
            "CREATE INDEX ON {parent} (expiry) WHERE expiry IS NOT NULL"
        ));
    }
    ddl
}

/// Creates the band partition of `table` for `node` covering `band`.
pub fn create_band(table: Table, node: i32, band: &Band) -> Result<(), PartitionError> {
    let root = qualified(table.root_name());
    let parent_name = band::originator_table_name(table, node);
    let parent = qualified(&parent_name);
    let name = band::band_table_name(table, node, band);
    if check_name(&name, relid(&parent_name)?, &band.for_values())? == Name::Ours {
        return Ok(());
    }
    let leaf = qualified(&name);
    run_ddl(&[
        format!("CREATE TABLE {leaf} (LIKE {root} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)"),
        format!(
            "ALTER TABLE {parent} ATTACH PARTITION {leaf} {}",
            band.for_values()
        ),
    ])
}

/// What a name about to be created under the creation lock already is.
#[derive(Debug, PartialEq, Eq)]
enum Name {
    /// Nothing has it: create the relation.
    Free,
    /// A partition of the parent it is meant for, with the bound it is meant to
    /// have, has it: ours already.
    Ours,
}

/// Looks at a name before it is created under the creation lock. A relation that
/// has it and hangs off another parent (or none) is not one of ours: say so
/// (42P07 with a hint) rather than let CREATE TABLE fail with its bare message.
/// One that is already a partition of `parent` with `bound` (as `Band::for_values`
/// writes it) is ours, although the catalog read
/// that planned the creation did not list it: it is used as it is, and the
/// disagreement goes to the server log, since the read under the lock is meant
/// to see every partition committed before the lock was granted.
fn check_name(name: &str, parent: Oid, bound: &str) -> Result<Name, PartitionError> {
    let Some(taken) = Spi::get_one_with_args::<Oid>(
        "SELECT pg_catalog.to_regclass($1)::pg_catalog.oid",
        &[qualified(name).into()],
    )?
    else {
        return Ok(Name::Free);
    };
    // pg_get_expr quotes the bigint bounds: FOR VALUES FROM ('700') TO ('750').
    let same_bound = || {
        crate::pg::catalog::partition_bound(taken)
            .is_some_and(|text| text.replace('\'', "") == bound)
    };
    if partition_parents(taken)?.first() == Some(&parent) && same_bound() {
        pgrx::log!(
            "pg_envelopes: \"{name}\" is already a partition of relation {}, which the \
             catalog read under the creation lock did not list; using it",
            parent.to_u32()
        );
        return Ok(Name::Ours);
    }
    Err(PartitionError::NotAPartition {
        name: name.to_owned(),
    })
}

/// The oid of a relation of the extension's schema, by name (`InvalidOid` when
/// there is none), from the syscache.
fn relid(name: &str) -> Result<Oid, PartitionError> {
    let cname = std::ffi::CString::new(name).map_err(|_| PartitionError::NotInstalled)?;
    Ok(crate::pg::catalog::relation_in(namespace_oid()?, &cname).unwrap_or(pg_sys::InvalidOid))
}

fn run_ddl(statements: &[String]) -> Result<(), PartitionError> {
    Spi::connect_mut(|client| {
        for statement in statements {
            client.update(statement.as_str(), None, &[])?;
        }
        Ok(())
    })
}

/// Picks the band to create for `seq`: the bounds of the other table's band when
/// one table already covers `seq` (meta and blob stay aligned), else the aligned
/// band of `width`; in both cases shrunk to fit between the existing neighbours.
pub fn plan_band(seq: i64, desired: Band, existing: &[RangeBound]) -> Band {
    let target = existing
        .iter()
        .find(|b| b.contains(seq))
        .map(|b| Band {
            start: b.lower.unwrap_or(0),
            end: b.upper,
        })
        .unwrap_or(desired);
    let floor = existing
        .iter()
        .filter_map(|b| b.upper)
        .filter(|&u| u <= seq)
        .max();
    let ceiling = existing
        .iter()
        .filter_map(|b| b.lower)
        .filter(|&l| l > seq)
        .min();
    target.clamped(floor, ceiling)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_fits_between_neighbours() {
        let existing = [
            RangeBound {
                lower: Some(0),
                upper: Some(150),
            },
            RangeBound {
                lower: Some(180),
                upper: Some(400),
            },
        ];
        let desired = Band {
            start: 100,
            end: Some(200),
        };
        assert_eq!(
            plan_band(160, desired, &existing),
            Band {
                start: 150,
                end: Some(180)
            }
        );
    }

    #[test]
    fn plan_reuses_the_other_tables_band() {
        let existing = [RangeBound {
            lower: Some(10),
            upper: Some(20),
        }];
        let desired = Band {
            start: 0,
            end: Some(100),
        };
        assert_eq!(
            plan_band(15, desired, &existing),
            Band {
                start: 10,
                end: Some(20)
            }
        );
    }

    #[test]
    fn plan_without_neighbours_is_the_aligned_band() {
        let desired = Band {
            start: 0,
            end: Some(100),
        };
        assert_eq!(plan_band(5, desired, &[]), desired);
    }
}
