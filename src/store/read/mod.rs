//! Envelope rows read out of the band leaves with an explicit snapshot: the
//! change feed's reads (consumer batches, ceilings, the insert path's lateness
//! probe).
//!
//! One originator's rows in a sequence range are read band by band, in order; in
//! each band the meta leaf and the blob leaf are scanned through their primary
//! keys over the same range and merged by sequence id, so a batch costs two range
//! scans per band rather than one index lookup per row.

pub mod lookup;
pub mod orphans;
pub mod results;
pub mod select;
pub mod shapes;

use crate::pg::scan::{Range, Reading, Scan, Seeker, Value};
use crate::store::partition::band::{RangeBound, Table};
use crate::store::partition::{self, PartitionError};
use pgrx::datum::TimestampWithTimeZone;
use pgrx::pg_sys::{self, Oid};

/// One envelope as the feed reads it.
#[derive(Debug, Clone)]
pub struct EnvelopeRow {
    pub node: i32,
    pub seq: i64,
    pub gateway_time: TimestampWithTimeZone,
    pub topic: Vec<u8>,
    pub payer_id: Option<i32>,
    pub expiry: Option<i64>,
    pub envelope: Vec<u8>,
    /// The inserting top-level transaction (`inserted_xid`).
    pub inserted_xid: u64,
    /// Recorded in the late-envelope feed when it was inserted.
    pub late: bool,
}

impl EnvelopeRow {
    /// Bytes the row carries (topic and envelope), for batch byte budgets.
    pub fn bytes(&self) -> usize {
        self.topic.len() + self.envelope.len()
    }
}

/// What a reader wants next from [`originator_rows`].
pub enum Flow {
    Continue,
    Stop,
}

/// Column numbers of a meta leaf, looked up by name once per scan.
pub struct MetaColumns {
    pub seq: i32,
    pub gateway_time: i32,
    pub topic: i32,
    pub payer_id: i32,
    pub expiry: i32,
    pub inserted_xid: i32,
    pub late: Option<i32>,
}

impl MetaColumns {
    fn of(scan: &Scan) -> Result<MetaColumns, PartitionError> {
        let col = |name| {
            scan.attno(name)
                .ok_or(PartitionError::Catalog("a meta partition lacks a column"))
        };
        Ok(MetaColumns {
            seq: col("originator_sequence_id")?,
            gateway_time: col("gateway_time")?,
            topic: col("topic")?,
            payer_id: col("payer_id")?,
            expiry: col("expiry")?,
            inserted_xid: col("inserted_xid")?,
            late: scan.attno("late"),
        })
    }
}

/// The error for a NULL where the table has NOT NULL (a damaged row). A function,
/// not a constant, so that the success path of `ok_or_else` builds and drops
/// nothing (an `ok_or` argument is built, and dropped, on every row).
pub fn missing() -> PartitionError {
    PartitionError::Catalog("NULL in a NOT NULL column")
}

fn xid8(scan: &mut Scan, attno: i32) -> Result<u64, PartitionError> {
    scan.raw(attno)
        .map(|d| d.value() as u64)
        .ok_or_else(missing)
}

/// Meta columns of the current row; the envelope is filled in by the caller.
fn meta_row(scan: &mut Scan, cols: &MetaColumns, node: i32) -> Result<EnvelopeRow, PartitionError> {
    Ok(EnvelopeRow {
        node,
        seq: scan.get::<i64>(cols.seq).ok_or_else(missing)?,
        gateway_time: scan.get(cols.gateway_time).ok_or_else(missing)?,
        topic: scan.get(cols.topic).ok_or_else(missing)?,
        payer_id: scan.get(cols.payer_id),
        expiry: scan.get(cols.expiry),
        envelope: Vec::new(),
        inserted_xid: xid8(scan, cols.inserted_xid)?,
        late: cols.late.and_then(|c| scan.get::<bool>(c)).unwrap_or(false),
    })
}

/// The blob band with exactly these bounds, if any.
fn aligned(bands: &[(RangeBound, Oid)], bound: &RangeBound) -> Option<Oid> {
    bands.iter().find(|(b, _)| b == bound).map(|(_, oid)| *oid)
}

/// A scan of whichever blob band holds `(node, seq)`, standing on that row, with
/// the envelope's column number.
fn blob_of(
    blob: &partition::cache::OriginatorParts,
    node: i32,
    seq: i64,
    reading: Reading,
) -> Option<(Scan, i32)> {
    let leaf = blob.leaf_for(seq)?;
    let mut scan = Scan::open_band(
        leaf,
        reading,
        Range::Key { node, seq },
        false,
        blob.path(leaf),
    )?;
    let col = scan.attno("originator_envelope")?;
    scan.next().then_some((scan, col))
}

/// One row of a walk: the meta scan standing on it, that leaf's columns, and
/// the envelope (a column of the blob scan's current row) when it was read.
/// Everything in it is valid until the callback returns.
pub struct At<'a> {
    pub meta: &'a mut Scan,
    pub cols: &'a MetaColumns,
    pub node: i32,
    pub seq: i64,
    pub envelope: Option<Value<'a>>,
}

impl At<'_> {
    /// Whether the row was recorded in the late-envelope feed.
    pub fn late(&self) -> bool {
        self.cols
            .late
            .and_then(|c| self.meta.raw(c))
            .is_some_and(|d| d.value() != 0)
    }

    /// The inserting top-level transaction (`inserted_xid`).
    pub fn inserted_xid(&mut self) -> Result<u64, PartitionError> {
        xid8(self.meta, self.cols.inserted_xid)
    }

    /// The row's `gateway_time` as Postgres keeps it (microseconds since
    /// 2000-01-01 UTC, ordered as the times are), read without a copy.
    pub fn gateway_time_raw(&self) -> Result<i64, PartitionError> {
        self.meta
            .raw(self.cols.gateway_time)
            .map(|d| d.value() as i64)
            .ok_or_else(missing)
    }

    /// The row copied out as an [`EnvelopeRow`].
    pub fn copy_out(&mut self) -> Result<EnvelopeRow, PartitionError> {
        let mut row = meta_row(self.meta, self.cols, self.node)?;
        if let Some(value) = self.envelope {
            row.envelope = value.bytes().ok_or_else(missing)?;
        }
        Ok(row)
    }
}

/// Which rows [`originator_rows`] reads the envelope bytes of.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Blobs {
    All,
    /// Rows flagged `late` come without their bytes (`envelope` empty): the
    /// in-order read only steps over them.
    NotOfLateRows,
    /// No row comes with its bytes (for counting).
    None,
}

/// Calls `each` with the rows of `node` whose sequence id is in `(after, upto]`,
/// in order, as `reading` sees them, until it returns [`Flow::Stop`]. Returns true
/// when it reached the end of the range. A meta row without its blob twin (only
/// possible after hand edits) is skipped.
pub fn originator_rows(
    node: i32,
    after: i64,
    upto: i64,
    reading: impl Into<Reading>,
    blobs_wanted: Blobs,
    mut each: impl FnMut(EnvelopeRow) -> Flow,
) -> Result<bool, PartitionError> {
    walk_originator(node, after, upto, reading, blobs_wanted, |mut at| {
        Ok(each(at.copy_out()?))
    })
}

/// [`originator_rows`] without copying: `each` gets the row where it stands.
pub fn walk_originator(
    node: i32,
    after: i64,
    upto: i64,
    reading: impl Into<Reading>,
    blobs_wanted: Blobs,
    mut each: impl FnMut(At<'_>) -> Result<Flow, PartitionError>,
) -> Result<bool, PartitionError> {
    let reading = reading.into();
    if upto <= after {
        return Ok(true);
    }
    let Some(meta) = partition::originator_parts(Table::Meta, node)? else {
        return Ok(true);
    };
    // A count reads no bytes: no blob band is opened (nor locked) at all.
    let blob = match blobs_wanted {
        Blobs::None => None,
        _ => match partition::originator_parts(Table::Blob, node)? {
            Some(blob) => Some(blob),
            None => return Ok(true),
        },
    };
    for (bound, leaf) in &meta.bands {
        if bound
            .upper
            .is_some_and(|upper| upper <= after.saturating_add(1))
        {
            continue; // the whole band is at or below `after`
        }
        if bound.lower.is_some_and(|lower| lower > upto) {
            break; // bands are sorted: nothing further is in range
        }
        let range = Range::Envelope { node, after, upto };
        let Some(mut metas) = Scan::open_band(*leaf, reading, range, false, meta.path(*leaf))
        else {
            continue; // dropped (by prune_expired) after it was listed: it was empty
        };
        let cols = MetaColumns::of(&metas)?;
        let mut blobs = blob
            .as_ref()
            .and_then(|blob| aligned(&blob.bands, bound).map(|b| (blob, b)))
            .and_then(|(blob, b)| Scan::open_band(b, reading, range, false, blob.path(b)))
            .and_then(|scan| {
                let envelope = scan.attno("originator_envelope")?;
                let seq = scan.attno("originator_sequence_id")?;
                Some((scan, envelope, seq))
            });
        let mut blob_seq: Option<i64> = None;
        while metas.next() {
            let seq = metas
                .value(cols.seq)
                .map(|d| d.value() as i64)
                .ok_or_else(missing)?;
            let late = || {
                cols.late
                    .and_then(|c| metas.raw(c))
                    .is_some_and(|d| d.value() != 0)
            };
            let skip_blob =
                blobs_wanted == Blobs::None || (blobs_wanted == Blobs::NotOfLateRows && late());
            if skip_blob {
                let at = At {
                    meta: &mut metas,
                    cols: &cols,
                    node,
                    seq,
                    envelope: None,
                };
                if let Flow::Stop = each(at)? {
                    return Ok(false);
                }
                continue;
            }
            let mut fallback = None;
            let envelope = match &mut blobs {
                Some((scan, col, seq_col)) => {
                    // Advance the blob scan to the first sequence id >= the meta row's.
                    let mut found = None;
                    loop {
                        match blob_seq {
                            Some(s) if s > seq => break,
                            Some(s) if s == seq => {
                                found = scan.cell(*col);
                                break;
                            }
                            _ => {}
                        }
                        if !scan.next() {
                            blob_seq = Some(i64::MAX);
                            break;
                        }
                        blob_seq = scan.value(*seq_col).map(|d| d.value() as i64);
                    }
                    found
                }
                None => {
                    let Some(blob) = &blob else {
                        continue; // not reached: Blobs::None skipped every blob above
                    };
                    fallback = blob_of(blob, node, seq, reading);
                    fallback.as_mut().and_then(|(scan, col)| scan.cell(*col))
                }
            };
            let Some(envelope) = envelope else {
                continue;
            };
            let at = At {
                meta: &mut metas,
                cols: &cols,
                node,
                seq,
                envelope: Some(envelope),
            };
            let flow = each(at)?;
            drop(fallback);
            if let Flow::Stop = flow {
                return Ok(false);
            }
        }
    }
    Ok(true)
}

/// The envelope bytes of blob row `(node, seq)` as `reading` sees it, if it
/// exists. A band the partition cache does not know yet (attached by a
/// transaction that has finished since) is looked for once more after taking in
/// the invalidations.
pub fn blob_envelope(
    node: i32,
    seq: i64,
    reading: impl Into<Reading>,
) -> Result<Option<Vec<u8>>, PartitionError> {
    let reading = reading.into();
    for fresh in [false, true] {
        if fresh {
            crate::pg::invalidation::accept();
        }
        let Some(blob) = partition::originator_parts(Table::Blob, node)? else {
            continue;
        };
        if blob.leaf_for(seq).is_none() {
            continue;
        }
        return Ok(
            blob_of(&blob, node, seq, reading).and_then(|(mut scan, col)| scan.get::<Vec<u8>>(col))
        );
    }
    Ok(None)
}

/// The row `(node, seq)` as `reading` sees it, if it exists.
pub fn envelope(
    node: i32,
    seq: i64,
    reading: impl Into<Reading>,
) -> Result<Option<EnvelopeRow>, PartitionError> {
    let reading = reading.into();
    let mut found = None;
    originator_rows(node, seq - 1, seq, reading, Blobs::All, |row| {
        found = Some(row);
        Flow::Stop
    })?;
    Ok(found)
}

/// The highest sequence id of `node` above `above` among the meta rows visible
/// to `reading` for which `counts(inserted_xid)` is true, searching the bands
/// from the newest down (a backward index scan each; usually only the newest is
/// read). Blobs are not read.
pub fn highest_above(
    node: i32,
    above: i64,
    reading: impl Into<Reading>,
    counts: impl Fn(u64) -> bool,
) -> Result<Option<i64>, PartitionError> {
    let reading = reading.into();
    let Some(meta) = partition::originator_parts(Table::Meta, node)? else {
        return Ok(None);
    };
    for (bound, leaf) in meta.bands.iter().rev() {
        if bound
            .upper
            .is_some_and(|upper| upper <= above.saturating_add(1))
        {
            break; // this band and every lower one are at or below `above`
        }
        let range = Range::Envelope {
            node,
            after: above,
            upto: i64::MAX,
        };
        let Some(mut scan) = Scan::open_band(*leaf, reading, range, true, meta.path(*leaf)) else {
            continue;
        };
        let seq_col = scan.attno("originator_sequence_id").ok_or_else(missing)?;
        let xid_col = scan.attno("inserted_xid").ok_or_else(missing)?;
        while scan.next() {
            if counts(xid8(&mut scan, xid_col)?) {
                return Ok(scan.value(seq_col).map(|d| d.value() as i64));
            }
        }
    }
    Ok(None)
}

/// One topic a topic read follows in one originator: the rows with this topic
/// and a sequence id above `after`, at most `limit` of them.
#[derive(Debug, Clone)]
pub struct TopicEntry {
    pub topic: Vec<u8>,
    pub after: i64,
    pub limit: usize,
}

/// A topic scan open in one band, with the sequence id of the row it stands on.
struct TopicCursor {
    scan: Scan,
    entry: usize,
    seq: i64,
}

/// Calls `each` with the rows of `node` that match one of `entries` (its topic,
/// above its `after`, within its `limit`) and have a sequence id at most `upto`,
/// in sequence order, until it returns [`Flow::Stop`]. Each band is read through
/// its `(topic, originator_sequence_id)` index, one range scan per entry, merged
/// by sequence id; each row's bytes come from one primary-key probe of the
/// blob band (topic rows are sparse: a range scan of the blob band would read
/// the rows of every other topic too). Returns true when every entry reached
/// its end or its limit. The entries' topics must be distinct.
pub fn walk_topics(
    node: i32,
    entries: &mut [TopicEntry],
    upto: i64,
    reading: impl Into<Reading>,
    mut each: impl FnMut(At<'_>) -> Result<Flow, PartitionError>,
) -> Result<bool, PartitionError> {
    let reading = reading.into();
    use pgrx::IntoDatum;
    let Some(lowest) = entries
        .iter()
        .filter(|e| e.limit > 0)
        .map(|e| e.after)
        .min()
    else {
        return Ok(true);
    };
    if upto <= lowest {
        return Ok(true);
    }
    let Some(meta) = partition::originator_parts(Table::Meta, node)? else {
        return Ok(true);
    };
    let Some(blob) = partition::originator_parts(Table::Blob, node)? else {
        return Ok(true);
    };
    // The topics as bytea datums, alive (in the call's memory context) while the
    // scans that use them as keys are open.
    let topics: Vec<pg_sys::Datum> = entries
        .iter()
        .map(|e| {
            e.topic
                .as_slice()
                .into_datum()
                .unwrap_or_else(pg_sys::Datum::null)
        })
        .collect();
    for (bound, leaf) in &meta.bands {
        if bound.lower.is_some_and(|lower| lower > upto) {
            break; // bands are sorted: nothing further is in range
        }
        let mut cursors = Vec::new();
        for (i, entry) in entries.iter().enumerate() {
            if entry.limit == 0
                || entry.after >= upto
                || bound
                    .upper
                    .is_some_and(|upper| upper <= entry.after.saturating_add(1))
            {
                continue;
            }
            let range = Range::Topic {
                topic: topics[i],
                after: entry.after,
                upto,
            };
            let Some(scan) = Scan::open_band(*leaf, reading, range, false, meta.path(*leaf)) else {
                break; // dropped after it was listed
            };
            cursors.push(TopicCursor {
                scan,
                entry: i,
                seq: 0,
            });
        }
        let Some(first) = cursors.first() else {
            continue;
        };
        let cols = MetaColumns::of(&first.scan)?;
        // Stand every scan on its first row; drop the empty ones.
        cursors.retain_mut(|c| advance(c, &cols));
        // The band's blob rows are fetched by key as the walk rises through
        // the band (Seeker: one range scan, stepping over the rows of other
        // topics without fetching them).
        let mut seeker: Option<(Seeker, i32)> = None;
        let blob_leaf = aligned(&blob.bands, bound);
        while let Some(at) = (0..cursors.len()).min_by_key(|&i| cursors[i].seq) {
            let seq = cursors[at].seq;
            let mut fallback = None;
            let envelope = match (&mut seeker, blob_leaf) {
                (Some((blobs, col)), _) => {
                    if blobs.seek(seq) {
                        blobs.cell(*col)
                    } else {
                        None
                    }
                }
                (None, Some(leaf)) => {
                    let path = blob.path(leaf);
                    match Seeker::open(leaf, reading, node, seq.saturating_sub(1), upto, path) {
                        Some(mut blobs) => {
                            let col = blobs.attno("originator_envelope").ok_or_else(missing)?;
                            let sought = blobs.seek(seq);
                            let (blobs, col) = seeker.insert((blobs, col));
                            if sought {
                                blobs.cell(*col)
                            } else {
                                None
                            }
                        }
                        None => None,
                    }
                }
                (None, None) => {
                    fallback = blob_of(&blob, node, seq, reading);
                    fallback.as_mut().and_then(|(scan, col)| scan.cell(*col))
                }
            };
            let cursor = &mut cursors[at];
            let entry = &mut entries[cursor.entry];
            entry.limit -= 1;
            entry.after = seq;
            let flow = match envelope {
                Some(envelope) => each(At {
                    meta: &mut cursor.scan,
                    cols: &cols,
                    node,
                    seq,
                    envelope: Some(envelope),
                })?,
                None => Flow::Continue, // a meta row without its blob twin (hand edits only)
            };
            drop(fallback);
            if let Flow::Stop = flow {
                return Ok(false);
            }
            let cursor = &mut cursors[at];
            if entries[cursor.entry].limit == 0 || !advance(cursor, &cols) {
                cursors.swap_remove(at);
            }
        }
    }
    Ok(true)
}

/// Moves a topic scan to its next row; false at its end.
fn advance(cursor: &mut TopicCursor, cols: &MetaColumns) -> bool {
    if !cursor.scan.next() {
        return false;
    }
    match cursor.scan.value(cols.seq) {
        Some(seq) => {
            cursor.seq = seq.value() as i64;
            true
        }
        None => false,
    }
}

/// The meta row of `node` with the highest sequence id, as `reading` sees it:
/// its sequence id and gateway time (the newest band first, one backward step
/// of each band's primary key until a band has a row).
pub fn highest_meta(
    node: i32,
    reading: impl Into<Reading>,
) -> Result<Option<(i64, TimestampWithTimeZone)>, PartitionError> {
    let reading = reading.into();
    let Some(meta) = partition::originator_parts(Table::Meta, node)? else {
        return Ok(None);
    };
    for (_, leaf) in meta.bands.iter().rev() {
        let range = Range::Envelope {
            node,
            after: i64::MIN,
            upto: i64::MAX,
        };
        let Some(mut scan) = Scan::open_band(*leaf, reading, range, true, meta.path(*leaf)) else {
            continue; // dropped after it was listed
        };
        let cols = MetaColumns::of(&scan)?;
        if scan.next() {
            let seq = scan.get::<i64>(cols.seq).ok_or_else(missing)?;
            let time = scan.get(cols.gateway_time).ok_or_else(missing)?;
            return Ok(Some((seq, time)));
        }
    }
    Ok(None)
}

/// Of `node`'s rows on `topic`, the one with the latest `gateway_time` (on a
/// tie, the higher sequence id), with its bytes, as `reading` sees them. Reads
/// every row of the topic in every band, in the topic index's order, looking at
/// the time column alone; the winner's bytes are read once at the end. A
/// gateway time is the caller's to give, so no band can be skipped: a late
/// arrival low in the sequence may carry the latest time.
pub fn latest_with_topic(
    node: i32,
    topic: &[u8],
    reading: impl Into<Reading>,
) -> Result<Option<EnvelopeRow>, PartitionError> {
    let reading = reading.into();
    use pgrx::IntoDatum;
    let Some(meta) = partition::originator_parts(Table::Meta, node)? else {
        return Ok(None);
    };
    let Some(blob) = partition::originator_parts(Table::Blob, node)? else {
        return Ok(None);
    };
    let datum = topic.into_datum().unwrap_or_else(pg_sys::Datum::null);
    let range = |after, upto| Range::Topic {
        topic: datum,
        after,
        upto,
    };
    // (gateway time, sequence id, leaf) of the best row so far. A meta row
    // without its blob twin (only after hand edits) is not a row of the view.
    let mut best: Option<(i64, i64, Oid)> = None;
    for (_, leaf) in meta.bands.iter().rev() {
        let Some(mut scan) = Scan::open_band(
            *leaf,
            reading,
            range(i64::MIN, i64::MAX),
            true,
            meta.path(*leaf),
        ) else {
            continue; // dropped after it was listed
        };
        let cols = MetaColumns::of(&scan)?;
        while scan.next() {
            let seq = scan
                .value(cols.seq)
                .map(|d| d.value() as i64)
                .ok_or_else(missing)?;
            let time = scan
                .value(cols.gateway_time)
                .map(|d| d.value() as i64)
                .ok_or_else(missing)?;
            if best.is_some_and(|(t, s, _)| (time, seq) <= (t, s)) {
                continue;
            }
            if blob_of(&blob, node, seq, reading).is_some() {
                best = Some((time, seq, *leaf));
            }
        }
    }
    let Some((_, seq, leaf)) = best else {
        return Ok(None);
    };
    let Some(mut scan) = Scan::open_band(
        leaf,
        reading,
        range(seq.saturating_sub(1), seq),
        false,
        meta.path(leaf),
    ) else {
        return Ok(None);
    };
    let cols = MetaColumns::of(&scan)?;
    if !scan.next() {
        return Ok(None);
    }
    let Some((blob_scan, col)) = blob_of(&blob, node, seq, reading) else {
        return Ok(None);
    };
    let envelope = blob_scan.cell(col);
    At {
        meta: &mut scan,
        cols: &cols,
        node,
        seq,
        envelope,
    }
    .copy_out()
    .map(Some)
}
