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
use super::cache::OriginatorParts;
use super::PartitionError;
use pgrx::datum::DatumWithOid;
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
        // SAFETY: both arguments are valid; get_relname_relid only reads the syscache
        // and returns InvalidOid when the relation does not exist.
        let oid = unsafe { pg_sys::get_relname_relid(name.as_ptr(), namespace) };
        if oid == pg_sys::InvalidOid {
            return Err(PartitionError::NotInstalled);
        }
        roots[table as usize] = oid;
    }
    Ok(roots)
}

fn namespace_oid() -> Result<Oid, PartitionError> {
    // SAFETY: the name is a static NUL-terminated string; with missing_ok = true the
    // lookup returns InvalidOid instead of raising an error.
    let oid = unsafe { pg_sys::get_namespace_oid(c"envelopes".as_ptr(), true) };
    if oid == pg_sys::InvalidOid {
        Err(PartitionError::NotInstalled)
    } else {
        Ok(oid)
    }
}

/// What exists for `node` in `table`: `None` when the originator-level partition
/// does not exist, an error when a relation of that name exists but is not a
/// partition of the root.
pub fn load_originator(
    table: Table,
    node: i32,
    root: Oid,
) -> Result<Option<OriginatorParts>, PartitionError> {
    let name = band::originator_table_name(table, node);
    let namespace = namespace_oid()?;
    Spi::connect(|client| {
        let rows = client.select(
            "SELECT p.oid,
                    (SELECT i.inhparent FROM pg_catalog.pg_inherits i WHERE i.inhrelid = p.oid),
                    c.oid,
                    pg_catalog.pg_get_expr(c.relpartbound, c.oid)
               FROM pg_catalog.pg_class p
               LEFT JOIN pg_catalog.pg_inherits ci ON ci.inhparent = p.oid
               LEFT JOIN pg_catalog.pg_class c ON c.oid = ci.inhrelid
              WHERE p.relnamespace = $1 AND p.relname = $2::pg_catalog.name",
            None,
            &[
                DatumWithOid::from(namespace),
                DatumWithOid::from(name.as_str()),
            ],
        )?;
        let mut parts: Option<OriginatorParts> = None;
        for row in rows {
            let parent: Oid = row
                .get(1)?
                .ok_or(PartitionError::Catalog("pg_class.oid is NULL"))?;
            if row.get::<Oid>(2)? != Some(root) {
                return Err(PartitionError::NotAPartition { name: name.clone() });
            }
            let entry = parts.get_or_insert_with(|| OriginatorParts {
                parent,
                bands: Vec::new(),
            });
            if let (Some(leaf), Some(bound)) = (row.get::<Oid>(3)?, row.get::<String>(4)?) {
                // A child that is not a plain range band (a user's DEFAULT partition)
                // never routes our rows; leave it out of the cache.
                if let Some(bound) = band::parse_range_bound(&bound) {
                    entry.bands.push((bound, leaf));
                }
            }
        }
        if let Some(parts) = parts.as_mut() {
            parts.sort();
        }
        Ok(parts)
    })
}

/// Creates the originator-level partition of `table` for `node`, attached to the root.
pub fn create_originator(table: Table, node: i32) -> Result<(), PartitionError> {
    let root = qualified(table.root_name());
    let parent = qualified(&band::originator_table_name(table, node));
    run_ddl(&[
        format!(
            "CREATE TABLE {parent} (LIKE {root} INCLUDING DEFAULTS INCLUDING CONSTRAINTS) \
             PARTITION BY RANGE (originator_sequence_id)"
        ),
        format!("ALTER TABLE {root} ATTACH PARTITION {parent} FOR VALUES IN ({node})"),
    ])
}

/// Creates the band partition of `table` for `node` covering `band`.
pub fn create_band(table: Table, node: i32, band: &Band) -> Result<(), PartitionError> {
    let root = qualified(table.root_name());
    let parent = qualified(&band::originator_table_name(table, node));
    let leaf = qualified(&band::band_table_name(table, node, band));
    run_ddl(&[
        format!("CREATE TABLE {leaf} (LIKE {root} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)"),
        format!(
            "ALTER TABLE {parent} ATTACH PARTITION {leaf} {}",
            band.for_values()
        ),
    ])
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
