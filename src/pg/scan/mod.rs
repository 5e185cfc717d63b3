//! Range scans of one table through its primary key, with a snapshot the caller
//! chooses.
//!
//! The change feed must read rows with a snapshot it took itself at a precise
//! moment (after reading the in-flight markers), whatever the caller's isolation
//! level: a REPEATABLE READ caller's transaction snapshot, or the snapshot of the
//! statement that called the function, would be older than the markers and miss a
//! commit that landed in between. SPI always uses the active or the transaction
//! snapshot, so these reads go to the table access method directly: an index scan
//! of the primary key with explicit scan keys and snapshot, one table at a time.
//!
//! Two key shapes are used: `(originator_node_id = n, originator_sequence_id in
//! (after, upto])` on a band leaf of meta or blob, and `id in (after, upto]` on the
//! feed tables (outbox, late envelopes). Columns are found by name in the
//! table's own tuple descriptor, so partitions whose column order differs from the
//! root's (an upgraded table) read correctly.
//!
//! **Two paths.** The index path needs a plain heap table with a valid btree
//! index on exactly the columns of the range. A table that is not one (a band
//! partitioned further, a foreign table, another access method, an index that is
//! missing or being rebuilt) is read by the executor path instead: the same rows,
//! in the same order, with the same snapshot, fetched by queries a chunk at a time
//! ([`crate::pg::executor`]). The caller says which path a table takes (the partition
//! catalog checks each band when it loads it); whatever it says, a table whose
//! relation or index lacks what the index path dereferences is never read by it.
//!
//! **Locks.** A scan takes ACCESS SHARE on its table; [`Hold`] says whether it
//! keeps it until the transaction ends (the read functions, as a query does) or
//! gives it back when the scan closes (the feed's own reads).

use crate::pg::executor::{self, Param};
use crate::pg::rel::Rel;
use crate::pg::slot::clear_slot;
use crate::pg::tuple;
use pgrx::pg_sys::{self, Datum, Oid};
use pgrx::{FromDatum, PgMemoryContexts};

mod executed;
mod index;
mod keys;
mod seeker;
mod value;

use executed::Executed;
pub use index::{
    can_read, index_path_can_read, index_serves, primary_key_on, primary_key_serves,
    some_index_serves, topic_index,
};
use index::{usable, TOPIC_INDEXES};
use keys::{column_number, desc_column, keys_for, live_column_number, quoted_name};
pub use seeker::Seeker;
pub use value::{CopiedOut, Value};

/// The primary-key range a scan covers (lower bound exclusive, upper inclusive).
#[derive(Clone, Copy, Debug)]
pub enum Range {
    /// An envelope leaf: one originator's sequence ids.
    Envelope { node: i32, after: i64, upto: i64 },
    /// A feed table keyed by a single `bigint` id.
    Id { after: i64, upto: i64 },
    /// One envelope's key (on a meta or blob leaf).
    Key { node: i32, seq: i64 },
    /// A meta leaf through its `(topic, originator_sequence_id)` index: one
    /// topic's sequence ids. `topic` is a `bytea` datum that must stay valid while
    /// the scan is open.
    Topic { topic: Datum, after: i64, upto: i64 },
}

impl Range {
    /// The column the range is on, and its bounds (lower exclusive, upper
    /// inclusive).
    fn key(&self) -> (&'static str, i64, i64) {
        match *self {
            Range::Envelope { after, upto, .. } | Range::Topic { after, upto, .. } => {
                ("originator_sequence_id", after, upto)
            }
            Range::Key { seq, .. } => ("originator_sequence_id", seq.saturating_sub(1), seq),
            Range::Id { after, upto } => ("id", after, upto),
        }
    }

    /// The columns of the index the range is read through.
    fn index_columns(&self) -> &'static [&'static str] {
        match self {
            Range::Envelope { .. } | Range::Key { .. } => ENVELOPE_KEY,
            Range::Id { .. } => &["id"],
            Range::Topic { .. } => TOPIC_KEY,
        }
    }
}

/// The primary key of the envelope tables.
pub const ENVELOPE_KEY: &[&str] = &["originator_node_id", "originator_sequence_id"];
/// The columns of meta's topic index.
pub const TOPIC_KEY: &[&str] = &["topic", "originator_sequence_id"];

/// How long a scan keeps the ACCESS SHARE lock on its table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hold {
    /// Until the transaction ends, as a query's scan does. For the read
    /// functions: what a transaction has read stays there for it (a TRUNCATE, a
    /// drop or `prune_expired` passes the table by or waits), so a REPEATABLE
    /// READ caller reading twice sees the same rows.
    Transaction,
    /// Until the scan closes. For the change feed's own reads, which take a
    /// fresh snapshot every time and read every originator (a consumer batch
    /// after a restart reads thousands of bands: keeping each lock would fill the
    /// shared lock table).
    Scan,
}

/// What a scan reads with: a snapshot, and how long it holds its lock.
#[derive(Clone, Copy, Debug)]
pub struct Reading {
    pub snapshot: pg_sys::Snapshot,
    pub hold: Hold,
}

/// A bare snapshot reads as the feed does: [`Reading::passing`].
impl From<pg_sys::Snapshot> for Reading {
    fn from(snapshot: pg_sys::Snapshot) -> Reading {
        Reading::passing(snapshot)
    }
}

impl Reading {
    /// A read function's read: locks kept until the transaction ends.
    pub fn kept(snapshot: pg_sys::Snapshot) -> Reading {
        Reading {
            snapshot,
            hold: Hold::Transaction,
        }
    }

    /// A feed read: locks given back when each scan closes.
    pub fn passing(snapshot: pg_sys::Snapshot) -> Reading {
        Reading {
            snapshot,
            hold: Hold::Scan,
        }
    }
}

/// How a table is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    /// Through a btree index with the index and table access methods.
    Index,
    /// With queries through the executor.
    Executor,
}

/// An open scan. Rows are fetched with [`Scan::next`]; their columns are read
/// with the getters until the next call. Datums read from a row are copied into
/// Rust values inside a scratch memory context that is reset for every row, so a
/// scan over large envelopes holds one detoasted value at a time.
pub struct Scan {
    heap: pg_sys::Relation,
    hold: Hold,
    /// A row was read: with [`Hold::Transaction`], the table's lock is then kept
    /// until the transaction ends. A band that gave nothing gives its lock back
    /// when the scan closes, so a read that looks into many bands and finds rows
    /// in few holds locks on those few, not on every band it looked into (the
    /// lock table is shared by the cluster, 64 per connection by default).
    saw_row: bool,
    source: Source,
    /// The slot the current row is in: the heap's own type on the index path;
    /// on the executor path a heap-tuple slot of the result's descriptor, made
    /// with the first row (null before).
    slot: *mut pg_sys::TupleTableSlot,
    /// Created at the first copied-out read: probes that only look at keys never
    /// pay for it.
    scratch: std::cell::RefCell<Option<PgMemoryContexts>>,
    /// The table's column layouts, when [`tuple::deform`] can read its rows.
    layouts: Option<Vec<tuple::Layout>>,
}

enum Source {
    Index(IndexSource),
    Executor(Box<Executed>),
}

struct IndexSource {
    index: pg_sys::Relation,
    desc: pg_sys::IndexScanDesc,
    direction: pg_sys::ScanDirection::Type,
    /// The scan keys; `index_rescan` copies them, but keep them alive with the scan.
    keys: Vec<pg_sys::ScanKeyData>,
}

impl Scan {
    /// [`Scan::open_band`] by the index path (the feed tables, and tables known
    /// to be plain heaps).
    pub fn open(
        relid: Oid,
        reading: impl Into<Reading>,
        range: Range,
        backward: bool,
    ) -> Option<Scan> {
        Scan::open_with(relid, reading.into(), range, backward, false, Path::Index)
    }

    /// Opens a scan of `relid`'s primary key (its topic index for
    /// [`Range::Topic`]) over `range`, reading with the snapshot of `reading`
    /// (which must stay valid, registered, while the scan is open), forwards or
    /// backwards, by `path` (the executor path whatever `path` says when the
    /// table or its index is not one the index path can read). Takes
    /// `AccessShareLock` on the table (kept as `reading.hold` says) and, on the
    /// index path, on its index (given back when the scan closes; the table's
    /// lock keeps the index from being dropped). Returns `None` when the table
    /// does not exist any more.
    pub fn open_band(
        relid: Oid,
        reading: Reading,
        range: Range,
        backward: bool,
        path: Path,
    ) -> Option<Scan> {
        Scan::open_with(relid, reading, range, backward, false, path)
    }

    /// [`Scan::open`], with the index tuples handed back too when `want_itup`
    /// (for [`Seeker`], which reads keys without fetching rows).
    fn open_with(
        relid: Oid,
        reading: Reading,
        range: Range,
        backward: bool,
        want_itup: bool,
        path: Path,
    ) -> Option<Scan> {
        let lock = pg_sys::AccessShareLock as pg_sys::LOCKMODE;
        // SAFETY: try_relation_open accepts any oid and returns NULL for a relation
        // that does not exist; the lock is released when the scan closes or at
        // transaction end.
        let heap = unsafe { pg_sys::try_relation_open(relid, lock) };
        if heap.is_null() {
            return None;
        }
        // SAFETY: heap is open; its index lookups read its relcache entry.
        let index_oid = unsafe {
            match path {
                Path::Index if index_path_can_read(heap) => match range {
                    Range::Topic { .. } => topic_index(heap),
                    _ => primary_key_on(heap, range.index_columns()),
                },
                _ => pg_sys::InvalidOid,
            }
        };
        if index_oid == pg_sys::InvalidOid {
            return Some(Scan::executed(heap, reading, range, backward));
        }
        let mut keys = keys_for(range);
        // SAFETY: the index belongs to the locked table, so it exists; index_open
        // raises an ERROR otherwise. index_beginscan/index_rescan get a valid heap,
        // index, a snapshot the caller keeps registered, and `keys.len()` scan keys
        // initialised by ScanKeyInit; table_slot_create makes a slot of the heap's
        // own type, as index_getnext_slot requires.
        unsafe {
            let mut index = pg_sys::index_open(index_oid, lock);
            if !usable(index) {
                // The index is being built or retired (CREATE or REINDEX
                // CONCURRENTLY, or marked invalid): a remembered topic index is
                // looked for again among the table's indexes; without a usable
                // one the executor path reads the table.
                pg_sys::index_close(index, lock);
                TOPIC_INDEXES.with(|c| c.borrow_mut().remove(&relid));
                let again = match range {
                    Range::Topic { .. } => topic_index(heap),
                    _ => pg_sys::InvalidOid,
                };
                if again == pg_sys::InvalidOid {
                    return Some(Scan::executed(heap, reading, range, backward));
                }
                index = pg_sys::index_open(again, lock);
            }
            let desc = crate::pg::compat::index_beginscan(
                heap,
                index,
                reading.snapshot,
                keys.len() as i32,
                0,
            );
            // Before the first rescan: btree sets up its copy of the tuples then.
            (*desc).xs_want_itup = want_itup;
            pg_sys::index_rescan(
                desc,
                keys.as_mut_ptr(),
                keys.len() as i32,
                std::ptr::null_mut(),
                0,
            );
            let slot = pg_sys::table_slot_create(heap, std::ptr::null_mut());
            // Rows are read by tuple::deform only from the heap's own slot type
            // (the tuple it stands on is then a plain heap tuple).
            let layouts = if std::ptr::eq((*slot).tts_ops, &pg_sys::TTSOpsBufferHeapTuple) {
                tuple::layouts((*heap).rd_att)
            } else {
                None
            };
            Some(Scan {
                heap,
                hold: reading.hold,
                saw_row: false,
                source: Source::Index(IndexSource {
                    index,
                    desc,
                    direction: if backward {
                        pg_sys::ScanDirection::BackwardScanDirection
                    } else {
                        pg_sys::ScanDirection::ForwardScanDirection
                    },
                    keys,
                }),
                slot,
                scratch: std::cell::RefCell::new(None),
                layouts,
            })
        }
    }

    /// A scan of the open `heap` by the executor path.
    fn executed(heap: pg_sys::Relation, reading: Reading, range: Range, backward: bool) -> Scan {
        // SAFETY: heap is open: its relcache entry names it and its owner.
        let (name, owner) = unsafe { (quoted_name(heap), (*(*heap).rd_rel).relowner) };
        let mut executed = Executed {
            name,
            owner,
            snapshot: reading.snapshot,
            range,
            backward,
            last: None,
            exhausted: false,
            rows: Vec::new(),
            at: 0,
            chunk_rows: Executed::FIRST_CHUNK,
            desc: std::ptr::null_mut(),
            key_attno: 0,
            memory: PgMemoryContexts::new("pg_envelopes executor scan"),
            chunk: PgMemoryContexts::new("pg_envelopes executor chunk"),
        };
        executed.restart(range);
        Scan {
            heap,
            hold: reading.hold,
            saw_row: false,
            source: Source::Executor(Box::new(executed)),
            slot: std::ptr::null_mut(),
            scratch: std::cell::RefCell::new(None),
            layouts: None,
        }
    }

    /// Whether the scan reads by the executor path.
    pub fn is_executed(&self) -> bool {
        matches!(self.source, Source::Executor(_))
    }

    /// Restarts the scan over another range of the same shape (same index, and
    /// the same ends open or closed; the executor path takes any range).
    pub fn rescan(&mut self, range: Range) {
        match &mut self.source {
            Source::Index(index) => {
                let keys = keys_for(range);
                // index_rescan copies as many keys as the scan was begun with.
                assert_eq!(
                    keys.len(),
                    index.keys.len(),
                    "rescan with another key shape"
                );
                index.keys = keys;
                // SAFETY: the scan is open; index_rescan copies the keys, which have
                // the same count and columns as those the scan was begun with.
                unsafe {
                    pg_sys::index_rescan(
                        index.desc,
                        index.keys.as_mut_ptr(),
                        index.keys.len() as i32,
                        std::ptr::null_mut(),
                        0,
                    );
                }
            }
            Source::Executor(executed) => {
                if !self.slot.is_null() {
                    // SAFETY: the slot is this scan's; emptied before its chunk goes.
                    unsafe { clear_slot(self.slot) };
                }
                executed.restart(range);
            }
        }
    }

    /// Moves to the next row visible to the snapshot; false at the end.
    pub fn next(&mut self) -> bool {
        let found = self.next_row();
        self.saw_row |= found;
        found
    }

    fn next_row(&mut self) -> bool {
        // SAFETY: resetting the scratch context frees only the copies made for the
        // previous row, which were already turned into Rust values. The scan and
        // slot are open (self exists).
        unsafe {
            if let Some(scratch) = self.scratch.get_mut() {
                scratch.reset();
            }
        }
        match &mut self.source {
            // SAFETY: as above.
            Source::Index(index) => unsafe {
                pg_sys::index_getnext_slot(index.desc, index.direction, self.slot)
            },
            Source::Executor(executed) => {
                if executed.at == executed.rows.len() {
                    if executed.exhausted {
                        return false;
                    }
                    if !self.slot.is_null() {
                        // SAFETY: the slot is this scan's; its row belongs to the
                        // chunk about to be replaced.
                        unsafe { clear_slot(self.slot) };
                    }
                    executed.fetch();
                    if executed.rows.is_empty() {
                        executed.exhausted = true;
                        return false;
                    }
                }
                // SAFETY: the descriptor was copied with the first chunk (a chunk
                // has rows, so it is set); the slot is made once in the scan's
                // memory; each row is a heap tuple of that descriptor in the
                // current chunk, which stays until the slot is cleared.
                unsafe {
                    if self.slot.is_null() {
                        let old = pg_sys::MemoryContextSwitchTo(executed.memory.value());
                        self.slot = pg_sys::MakeSingleTupleTableSlot(
                            executed.desc,
                            &pg_sys::TTSOpsHeapTuple,
                        );
                        pg_sys::MemoryContextSwitchTo(old);
                    }
                    let row = executed.rows[executed.at];
                    executed.at += 1;
                    pg_sys::ExecStoreHeapTuple(row, self.slot, false);
                }
                let key = executed.key_attno;
                let last = (key > 0).then(|| self.raw(key)).flatten();
                if let Source::Executor(executed) = &mut self.source {
                    if last.is_none() {
                        // No key to go on from (never seen: the key column is
                        // what the query ordered by): this chunk is the last.
                        executed.exhausted = true;
                        executed.rows.truncate(executed.at);
                    }
                    executed.last = last.map(|d| d.value() as i64);
                }
                true
            }
        }
    }

    /// Attribute number of column `name` in the rows, if they have one.
    pub fn attno(&self, name: &str) -> Option<i32> {
        match &self.source {
            Source::Index(_) => column_number(self.heap, name),
            Source::Executor(executed) if !executed.desc.is_null() => {
                // SAFETY: the descriptor copied from the first chunk.
                unsafe { desc_column(executed.desc, name) }
            }
            // No row read yet: the result has the table's columns, without the
            // dropped ones.
            Source::Executor(_) => {
                // SAFETY: heap is open; rd_att is its descriptor.
                unsafe { live_column_number((*self.heap).rd_att, name) }
            }
        }
    }

    /// The raw datum of column `attno` of the current row, `None` for NULL. Only
    /// meaningful for pass-by-value types (`xid8`, integers).
    pub fn raw(&self, attno: i32) -> Option<Datum> {
        self.value(attno)
    }

    /// Reads every column of the current row into the slot's arrays, once per
    /// row: with [`tuple::deform`] where it can (one pass, no call into
    /// Postgres), else with `slot_getsomeattrs`.
    fn deform(&self, attno: i32) {
        // SAFETY: the slot holds the row returned by the last successful next().
        // A slot of TTSOpsBufferHeapTuple (checked at open when layouts is set)
        // is a BufferHeapTupleTableSlot whose `tuple` is that row, pinned in its
        // buffer; tts_values/tts_isnull have natts entries. All columns are read
        // and tts_nvalid set to natts, so Postgres never resumes a partial
        // deform from offsets this code did not keep.
        unsafe {
            let natts = (*(*self.slot).tts_tupleDescriptor).natts;
            if let Some(layouts) = &self.layouts {
                let tuple = (*self.slot.cast::<pg_sys::HeapTupleTableSlot>()).tuple;
                if layouts.len() == natts as usize
                    && !tuple.is_null()
                    && tuple::deform(
                        tuple,
                        layouts,
                        (*self.slot).tts_values,
                        (*self.slot).tts_isnull,
                    )
                {
                    (*self.slot).tts_nvalid = natts as i16;
                    return;
                }
            }
            pg_sys::slot_getsomeattrs_int(self.slot, natts.max(attno));
        }
    }

    /// The datum of column `attno` of the current row as it sits in the slot
    /// (`None` for NULL), deforming the row if needed: no copy, valid until the
    /// next call to [`Scan::next`].
    #[inline]
    pub fn value(&self, attno: i32) -> Option<Datum> {
        // SAFETY: the slot holds the row returned by the last successful next();
        // attno came from attno() and is within the slot's descriptor, so after
        // deform the first attno entries of tts_values/tts_isnull are valid.
        unsafe {
            if i32::from((*self.slot).tts_nvalid) < attno {
                self.deform(attno);
            }
            let i = (attno - 1) as usize;
            if *(*self.slot).tts_isnull.add(i) {
                None
            } else {
                Some(*(*self.slot).tts_values.add(i))
            }
        }
    }

    /// Like [`Scan::value`] for a varlena column, detoasted (fetched from TOAST
    /// or decompressed, into this scan's scratch context) when it is not stored
    /// plainly in the row: valid until the next call to [`Scan::next`].
    #[inline(always)]
    fn flat_value(&self, attno: i32) -> Option<Datum> {
        let datum = self.value(attno)?;
        let ptr = datum.cast_mut_ptr::<pg_sys::varlena>();
        // SAFETY: a varlena column's datum points at its header. The first byte
        // tells whether it is stored plainly (4-byte uncompressed or 1-byte
        // short header, which tuple forming copies as they are) or external /
        // compressed; those are detoasted in the scratch context, which is reset
        // only at the next row.
        unsafe {
            let first = *ptr.cast::<u8>();
            // postgres.h's VARATT_IS_4B_U / VARATT_IS_1B / VARATT_IS_1B_E.
            #[cfg(target_endian = "little")]
            let plain = first & 0x03 == 0x00 || (first & 0x01 == 0x01 && first != 0x01);
            #[cfg(target_endian = "big")]
            let plain = first & 0xC0 == 0x00 || (first & 0x80 == 0x80 && first != 0x80);
            if plain {
                return Some(datum);
            }
            let mut scratch = self.scratch.borrow_mut();
            let scratch =
                scratch.get_or_insert_with(|| PgMemoryContexts::new("pg_envelopes scan row"));
            Some(scratch.switch_to(|_| Datum::from(pg_sys::pg_detoast_datum_packed(ptr))))
        }
    }

    /// Reads column `attno` of the current row as `T` (copied out of Postgres
    /// memory), `None` for NULL.
    pub fn get<T: FromDatum + CopiedOut>(&mut self, attno: i32) -> Option<T> {
        let datum = self.raw(attno)?;
        // SAFETY: the datum is a valid value of the column's type, which the caller
        // names as T; detoasting happens in the scratch context, which is reset
        // only at the next row, after T (an owned copy) has been built.
        let mut scratch = self.scratch.borrow_mut();
        let scratch = scratch.get_or_insert_with(|| PgMemoryContexts::new("pg_envelopes scan row"));
        unsafe {
            scratch.switch_to(|_| T::from_polymorphic_datum(datum, false, pg_sys::InvalidOid))
        }
    }
}

impl Drop for Scan {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // An ERROR is unwinding: the transaction is about to abort, and its
            // resource owner releases the scan's buffers and relation references.
            return;
        }
        let lock = pg_sys::AccessShareLock as pg_sys::LOCKMODE;
        let heap_lock = match self.hold {
            Hold::Transaction if self.saw_row => pg_sys::NoLock as pg_sys::LOCKMODE,
            Hold::Transaction | Hold::Scan => lock,
        };
        // SAFETY: everything was opened in Scan::open and is released once, here:
        // the slot (the executor path's lives in its memory, still there), the
        // index scan and the index with the lock taken there, and the table with
        // its lock unless it is kept until the transaction ends (a hold of the
        // same lock from earlier in the transaction keeps its own count).
        unsafe {
            if !self.slot.is_null() {
                pg_sys::ExecDropSingleTupleTableSlot(self.slot);
            }
            if let Source::Index(index) = &self.source {
                pg_sys::index_endscan(index.desc);
                pg_sys::index_close(index.index, lock);
            }
            pg_sys::relation_close(self.heap, heap_lock);
        }
    }
}

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use super::{Path, Reading, Seeker};
    use pgrx::pg_sys;
    use pgrx::prelude::*;

    /// The envelope bytes of the row the seeker stands on.
    fn bytes(seeker: &mut Seeker, col: i32) -> Vec<u8> {
        seeker
            .cell(col)
            .and_then(|v| v.bytes())
            .expect("an envelope")
    }

    /// A seeker finds each asked key with its current bytes: near keys by
    /// stepping, far ones and lower ones by a new descent; a key whose row was
    /// deleted and inserted again (a dead index entry beside the live one)
    /// gives the live row; a missing key, or one beyond the range, is not found
    /// and the next seek still works.
    #[pg_test]
    fn a_seeker_finds_rows_by_key_in_rising_order() {
        Spi::run(
            "SELECT envelopes.insert_gateway_envelope(9, s, '\\x01', pg_catalog.int8send(s))
               FROM generate_series(1, 200) s;
             DELETE FROM envelopes.gateway_envelopes_blob
              WHERE originator_node_id = 9 AND originator_sequence_id BETWEEN 50 AND 60;
             INSERT INTO envelopes.gateway_envelopes_blob
             SELECT 9, s, pg_catalog.int8send(-s) FROM generate_series(50, 60) s;
             DELETE FROM envelopes.gateway_envelopes_blob
              WHERE originator_node_id = 9 AND originator_sequence_id BETWEEN 100 AND 104;",
        )
        .unwrap();
        let leaf = Spi::get_one::<pg_sys::Oid>(
            "SELECT 'envelopes.gateway_envelopes_blob_o9_s0_1000000'::regclass::oid",
        )
        .unwrap()
        .unwrap();
        let expected = |seq: i64| -> Option<Vec<u8>> {
            match seq {
                50..=60 => Some((-seq).to_be_bytes().to_vec()),
                100..=104 => None,
                1..=200 => Some(seq.to_be_bytes().to_vec()),
                _ => None,
            }
        };
        // SAFETY: a snapshot taken now (the rows above are this transaction's),
        // registered for as long as the seeker reads with it.
        unsafe {
            let snapshot = pg_sys::RegisterSnapshot(pg_sys::GetLatestSnapshot());
            for upto in [i64::MAX, 180] {
                let mut seeker =
                    Seeker::open(leaf, Reading::passing(snapshot), 9, 0, upto, Path::Index)
                        .unwrap();
                let col = seeker.attno("originator_envelope").unwrap();
                let asks = [
                    1, 2, 3, 10, 40, 49, 50, 55, 55, 60, 61, 100, 102, 105, 150, 181, 200, 201, 30,
                    31,
                ];
                for seq in asks {
                    let want = if seq > upto { None } else { expected(seq) };
                    let found = seeker.seek(seq);
                    assert_eq!(found, want.is_some(), "seq {seq} upto {upto}");
                    if let Some(want) = want {
                        assert_eq!(bytes(&mut seeker, col), want, "seq {seq} upto {upto}");
                    }
                }
            }
            pg_sys::UnregisterSnapshot(snapshot);
        }
    }
}
