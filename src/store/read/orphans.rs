//! Rows present in one of meta and blob and missing from the other, found band
//! by band: each originator's keys are read from both tables in order and
//! compared as they go. A band's lock is given back when its scan closes, so the
//! check holds a lock or two at a time however many bands the store has (the
//! SQL anti-join it replaces locked every band of both tables at once and ran
//! out of the lock table at a few thousand bands).

use crate::pg::scan::{Range, Reading, Scan};
use crate::store::partition::{self, band::Table, cache::OriginatorParts, PartitionError};
use pgrx::pg_sys;

/// One originator's keys in one table, in order, across its bands.
struct Keys {
    node: i32,
    bands: Vec<(pg_sys::Oid, crate::pg::scan::Path)>,
    next_band: usize,
    scan: Option<(Scan, i32)>,
    reading: Reading,
}

impl Keys {
    fn new(node: i32, parts: Option<OriginatorParts>, reading: Reading) -> Keys {
        let bands = parts
            .map(|parts| {
                parts
                    .bands
                    .iter()
                    .map(|(_, leaf)| (*leaf, parts.path(*leaf)))
                    .collect()
            })
            .unwrap_or_default();
        Keys {
            node,
            bands,
            next_band: 0,
            scan: None,
            reading,
        }
    }

    /// The next key, or None at the end.
    fn next(&mut self) -> Result<Option<i64>, PartitionError> {
        loop {
            if let Some((scan, col)) = &mut self.scan {
                if scan.next() {
                    let seq = scan
                        .value(*col)
                        .map(|d| d.value() as i64)
                        .ok_or_else(super::missing)?;
                    return Ok(Some(seq));
                }
                self.scan = None; // closes the scan: its lock is given back
            }
            let Some(&(leaf, path)) = self.bands.get(self.next_band) else {
                return Ok(None);
            };
            self.next_band += 1;
            let range = Range::Envelope {
                node: self.node,
                after: i64::MIN,
                upto: i64::MAX,
            };
            if let Some(scan) = Scan::open_band(leaf, self.reading, range, false, path) {
                let col = scan
                    .attno("originator_sequence_id")
                    .ok_or_else(super::missing)?;
                self.scan = Some((scan, col));
            }
        }
    }
}

/// Calls `each(node, seq, missing_from)` for every key of one table that the
/// other lacks, as the calling statement's snapshot sees them; `missing_from`
/// names the table without it.
pub fn orphans(mut each: impl FnMut(i32, i64, &'static str)) -> Result<(), PartitionError> {
    let latest;
    let snapshot = match crate::pg::snapshot::statement() {
        Some(snapshot) => snapshot,
        None => {
            latest = crate::pg::snapshot::Latest::take();
            latest.as_ptr()
        }
    };
    let reading = Reading::passing(snapshot);
    for node in partition::originators()? {
        let mut meta = Keys::new(
            node,
            partition::originator_parts(Table::Meta, node)?,
            reading,
        );
        let mut blob = Keys::new(
            node,
            partition::originator_parts(Table::Blob, node)?,
            reading,
        );
        let (mut m, mut b) = (meta.next()?, blob.next()?);
        loop {
            match (m, b) {
                (None, None) => break,
                (Some(x), Some(y)) if x == y => {
                    m = meta.next()?;
                    b = blob.next()?;
                }
                (Some(x), None) => {
                    each(node, x, "gateway_envelopes_blob");
                    m = meta.next()?;
                }
                (Some(x), Some(y)) if x < y => {
                    each(node, x, "gateway_envelopes_blob");
                    m = meta.next()?;
                }
                (_, Some(y)) => {
                    each(node, y, "gateway_envelopes_meta");
                    b = blob.next()?;
                }
            }
        }
    }
    Ok(())
}
