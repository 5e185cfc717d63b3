//! Rows of one originator in a band leaf fetched by key in rising order, from
//! one open range scan (the blob side of a topic walk).

use super::*;

/// Rows of one originator in a band leaf, fetched by key in rising order: the
/// blob side of a topic walk, which needs the bytes of some rows of the band (the
/// ones of its topics), in sequence order. A probe per row descends the primary
/// key from its root each time; here one forward range scan stays open, steps
/// over the index entries of the rows not asked for without fetching those rows,
/// and fetches the row asked for. A key far ahead (more than [`Seeker::STEPS`]
/// entries, judged by sequence ids, which are dense in a band) is reached by a
/// new descent instead, from which stepping goes on. On the executor path each
/// key is one query.
pub struct Seeker {
    scan: Scan,
    node: i32,
    upto: i64,
    /// The sequence id of the index entry the scan stands on, if any.
    standing: Option<i64>,
    /// Every entry the scan has yet to return has a sequence id above this.
    behind: i64,
    /// The scan has run past its last entry.
    done: bool,
}

impl Seeker {
    /// Entries stepped over at most before a new descent is cheaper: a step is
    /// a few hundred instructions, a descent some thousands.
    const STEPS: i64 = 16;

    /// A seeker over `relid`'s rows of `node` with sequence ids in `(after,
    /// upto]` (`after` above `i64::MIN`: the scan keeps the same key shape when
    /// it descends again); `None` as for [`Scan::open_band`].
    pub fn open(
        relid: Oid,
        reading: Reading,
        node: i32,
        after: i64,
        upto: i64,
        path: Path,
    ) -> Option<Seeker> {
        let scan = Scan::open_with(
            relid,
            reading,
            Range::Envelope { node, after, upto },
            false,
            true,
            path,
        )?;
        Some(Seeker {
            scan,
            node,
            upto,
            standing: None,
            behind: after,
            done: false,
        })
    }

    /// Column `attno` of the row last found by [`Seeker::seek`] (see
    /// [`Scan::flat_value`]).
    pub fn cell(&self, attno: i32) -> Option<super::Value<'_>> {
        self.scan.cell(attno)
    }

    /// Attribute number of column `name` of the table.
    pub fn attno(&self, name: &str) -> Option<i32> {
        self.scan.attno(name)
    }

    /// Moves to the next index entry; its sequence id, or `None` at the end.
    fn step(&mut self) -> Option<i64> {
        let Source::Index(index) = &self.scan.source else {
            self.done = true;
            return None;
        };
        // SAFETY: the scan is open with xs_want_itup set, so after a TID is
        // returned xs_itup is the index tuple it came from, described by
        // xs_itupdesc (the primary key: originator, sequence id), valid until
        // the next call on the scan.
        unsafe {
            let desc = index.desc;
            let tid = pg_sys::index_getnext_tid(desc, pg_sys::ScanDirection::ForwardScanDirection);
            if tid.is_null() || (*desc).xs_itup.is_null() {
                self.done = true;
                self.standing = None;
                return None;
            }
            let mut values = [Datum::from(0); pg_sys::INDEX_MAX_KEYS as usize];
            let mut nulls = [false; pg_sys::INDEX_MAX_KEYS as usize];
            pg_sys::index_deform_tuple(
                (*desc).xs_itup,
                (*desc).xs_itupdesc,
                values.as_mut_ptr(),
                nulls.as_mut_ptr(),
            );
            let seq = (!nulls[1]).then(|| values[1].value() as i64);
            self.standing = seq;
            if let Some(seq) = seq {
                self.behind = seq;
            }
            seq
        }
    }

    /// Stands on the row with sequence id `seq` (above every one asked for
    /// before) and returns true if it exists and is visible to the snapshot; its
    /// columns are then read with [`Seeker::flat_value`].
    pub fn seek(&mut self, seq: i64) -> bool {
        if self.scan.is_executed() {
            if seq > self.upto {
                return false;
            }
            self.scan.rescan(Range::Key {
                node: self.node,
                seq,
            });
            return self.scan.next();
        }
        // Decided once per seek, before any step: far ahead, or behind what the
        // scan has passed (never asked by the walks, which go up, but kept
        // right), descend again to just before the key. Deciding it again after
        // a step would descend forever on a key whose only entries are dead to
        // the snapshot: the step past them makes the key look behind.
        let behind = seq <= self.behind && self.standing != Some(seq);
        let far = !self.done && seq.saturating_sub(self.behind) > Seeker::STEPS;
        if behind || far {
            self.scan.rescan(Range::Envelope {
                node: self.node,
                after: seq.saturating_sub(1),
                upto: self.upto,
            });
            self.standing = None;
            self.behind = seq.saturating_sub(1);
            self.done = false;
        }
        loop {
            match self.standing {
                Some(at) if at > seq => return false,
                Some(at) if at == seq => {
                    let Source::Index(index) = &self.scan.source else {
                        return false;
                    };
                    // SAFETY: the scan stands on the entry index_getnext_tid
                    // returned last (xs_heaptid); index_fetch_heap fetches that
                    // row into the scan's slot if the snapshot sees it.
                    let visible = unsafe {
                        if let Some(scratch) = self.scan.scratch.get_mut() {
                            scratch.reset();
                        }
                        pg_sys::index_fetch_heap(index.desc, self.scan.slot)
                    };
                    if visible {
                        self.scan.saw_row = true;
                        return true;
                    }
                    // Another version of the key, dead to this snapshot: the next
                    // entry may be the one it sees.
                }
                None if self.done => return false,
                _ => {}
            }
            if self.step().is_none() {
                return false;
            }
        }
    }
}
