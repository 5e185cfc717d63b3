//! Pre-creation of bands (pg_partman's premake): which originators' newest band
//! is fuller than `envelopes.premake_fraction`, and the creation of the band
//! after it, through the same path an insert that crosses into it takes
//! ([`crate::store::partition::create_ahead`]), so that the writer finds the
//! band there.
//!
//! A band is as full as its highest sequence id says: band `[start, end)` with
//! highest id `h` holds `h - start + 1` of its `end - start` ids. That is what
//! decides when a writer with rising ids reaches the end, whatever ids it skipped.
//! The newest band is its originator's band with the highest start; a band
//! created ahead is empty, so it is never itself full enough to have another one
//! created after it. A newest band that reaches `MAXVALUE` has no next band.

use super::MaintenanceError;
use crate::pg::snapshot::Latest;
use crate::store::retention;
use pgrx::pg_sys::{self, Oid};
use pgrx::prelude::*;
use std::time::{Duration, Instant};

/// An originator whose newest band is full enough to have the next created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    pub node: i32,
    pub band_start: i64,
    pub band_end: i64,
    pub highest: i64,
}

/// Whether band `[start, end)` whose highest sequence id is `highest` is more
/// than `fraction` full.
pub fn past_fraction(start: i64, end: i64, highest: i64, fraction: f64) -> bool {
    if end <= start || highest < start {
        return false;
    }
    let used = (i128::from(highest) - i128::from(start) + 1) as f64;
    let width = (i128::from(end) - i128::from(start)) as f64;
    used / width > fraction
}

/// What [`candidates`] found: the originators to pre-create a band for, and the
/// newest bands it could not read because they stayed locked (by a long
/// transaction's ACCESS EXCLUSIVE lock, say) for `lock_wait`.
#[derive(Debug, Default)]
pub struct Selection {
    pub candidates: Vec<Candidate>,
    pub busy: Vec<MaintenanceError>,
}

/// In a transaction: every originator whose newest band (present in both
/// tables) is more than `fraction` full. A newest band that is locked is asked
/// for again every few milliseconds until `lock_wait` has passed since the
/// listing began; then it is reported busy. Nothing waits in a lock queue.
pub fn candidates(fraction: f64, lock_wait: Duration) -> Result<Selection, MaintenanceError> {
    let newest = newest_bands()?;
    let snapshot = Latest::take();
    let deadline = Instant::now() + lock_wait;
    let mut selection = Selection::default();
    for (node, start, end, meta) in newest {
        let Some(end) = end else {
            continue; // reaches MAXVALUE: there is no next band
        };
        let highest = loop {
            if let Some(highest) = retention::band_highest(meta, node, &snapshot) {
                break Some(highest);
            }
            if Instant::now() >= deadline {
                break None;
            }
            crate::pg::worker::pause(Duration::from_millis(5));
        };
        match highest {
            None => selection.busy.push(MaintenanceError::BandBusy {
                node,
                band_start: start,
                waited: lock_wait,
            }),
            Some(Some(highest)) if past_fraction(start, end, highest, fraction) => {
                selection.candidates.push(Candidate {
                    node,
                    band_start: start,
                    band_end: end,
                    highest,
                })
            }
            Some(_) => {}
        }
    }
    Ok(selection)
}

/// One originator's newest band: node, start, end (`None` = `MAXVALUE`), and
/// its meta leaf.
type Newest = (i32, i64, Option<i64>, Oid);

/// Each originator's newest band that both tables have. From the catalog alone.
fn newest_bands() -> Result<Vec<Newest>, MaintenanceError> {
    Ok(Spi::connect(|client| {
        let rows = client.select(
            "SELECT DISTINCT ON (b.originator_node_id)
                    b.originator_node_id, b.band_start, b.band_end, b.meta_partition
               FROM envelopes._bands() b
              WHERE b.meta_partition IS NOT NULL AND b.blob_partition IS NOT NULL
              ORDER BY b.originator_node_id, b.band_start DESC",
            None,
            &[],
        )?;
        let mut bands = Vec::with_capacity(rows.len());
        for row in rows {
            let (Some(node), Some(start)) = (row.get::<i32>(1)?, row.get::<i64>(2)?) else {
                continue;
            };
            let end = row.get::<i64>(3)?;
            let meta = row.get::<Oid>(4)?.unwrap_or(pg_sys::InvalidOid);
            bands.push((node, start, end, meta));
        }
        Ok::<_, pgrx::spi::SpiError>(bands)
    })?)
}

#[cfg(test)]
mod unit {
    use super::past_fraction;

    #[test]
    fn a_band_is_as_full_as_its_highest_id() {
        // [0, 1000): ids 0..=799 are 80%, not more.
        assert!(!past_fraction(0, 1000, 799, 0.8));
        assert!(past_fraction(0, 1000, 800, 0.8));
        assert!(past_fraction(1000, 2000, 1999, 0.8));
        assert!(!past_fraction(1000, 2000, 1500, 0.8));
        // 0 creates ahead as soon as a band has a row; 1 never.
        assert!(past_fraction(1000, 2000, 1000, 0.0));
        assert!(!past_fraction(1000, 2000, 1999, 1.0));
        // Nonsense stays no.
        assert!(!past_fraction(1000, 2000, 999, 0.0));
        assert!(!past_fraction(2000, 1000, 1500, 0.0));
        // Bands near the top of the id space do not overflow.
        let start = i64::MAX - 1_000_000;
        assert!(past_fraction(start, i64::MAX, i64::MAX - 1, 0.99));
    }
}

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use super::{candidates, Candidate};
    use crate::store::partition;
    use crate::testing::band_names;
    use pgrx::prelude::*;
    use std::time::Duration;

    /// Inserts ids `from..=to` of `node` (bands of 1,000 ids).
    fn insert(node: i32, from: i64, to: i64) {
        Spi::run(&format!(
            "SET LOCAL envelopes.band_width = 1000;
             SELECT envelopes.insert_gateway_envelopes(
                        array_agg({node}), array_agg(s::bigint), array_agg('\\x01'::bytea),
                        array_agg('\\x02'::bytea))
               FROM pg_catalog.generate_series({from}, {to}) s"
        ))
        .unwrap();
    }

    fn nodes(fraction: f64) -> Vec<Candidate> {
        let selection = candidates(fraction, Duration::from_millis(100)).unwrap();
        assert!(selection.busy.is_empty(), "{:?}", selection.busy);
        selection.candidates
    }

    #[pg_test]
    fn only_newest_bands_past_the_fraction_are_candidates() {
        insert(1, 1, 850); // 851 of [0, 1000): past 0.8
        insert(2, 1, 500); // half full
        insert(3, 1, 900); // past, but the next band exists already (empty)
        Spi::run("SELECT envelopes.ensure_gateway_parts(3, 1000, 1000)").unwrap();
        insert(4, 1, 10); // an old band, and a newest one ...
        insert(4, 2000, 2500); // ... half full
        insert(5, 1, 3); // gaps count: the highest id decides
        insert(5, 990, 990);
        assert_eq!(
            nodes(0.8),
            [
                Candidate {
                    node: 1,
                    band_start: 0,
                    band_end: 1000,
                    highest: 850
                },
                Candidate {
                    node: 5,
                    band_start: 0,
                    band_end: 1000,
                    highest: 990
                }
            ]
        );
        let at = |f: f64| nodes(f).iter().map(|c| c.node).collect::<Vec<_>>();
        assert_eq!(at(0.4), [1, 2, 4, 5]);
        assert_eq!(at(0.995), Vec::<i32>::new());
        assert_eq!(at(1.0), Vec::<i32>::new());
    }

    #[pg_test]
    fn the_next_band_is_created_once_and_not_again() {
        insert(7, 1, 900);
        let [c] = nodes(0.8)[..] else {
            panic!("one candidate expected")
        };
        assert!(partition::create_ahead(c.node, c.band_end, 1000).unwrap());
        assert_eq!(
            band_names("meta"),
            [
                "gateway_envelopes_meta_o7_s0_1000",
                "gateway_envelopes_meta_o7_s1000_2000"
            ]
        );
        assert_eq!(band_names("blob").len(), 2);
        // The new band is empty, so nothing is past the fraction any more.
        assert!(nodes(0.8).is_empty());
        assert!(!partition::create_ahead(7, 1000, 1000).unwrap());
        assert_eq!(band_names("meta").len(), 2);
    }

    #[pg_test]
    fn a_band_reaching_maxvalue_has_no_next() {
        Spi::run(
            "SELECT envelopes.insert_gateway_envelope(9, 9223372036854775806, '\\x01', '\\x02')",
        )
        .unwrap();
        assert!(nodes(0.0).is_empty());
    }
}
