//! Rows written straight into plain heap tables through the table access method
//! and the executor's index routines: no SPI, no plan, no executor run. What an
//! `INSERT ... ON CONFLICT DO NOTHING` into the table would do, step by step, for
//! tables without triggers, CHECK constraints or forced row security (the caller
//! decides which tables qualify when it opens them, [`Inserter::open`]).
//!
//! - [`Inserter::insert_unless_exists`]: speculative insertion, as `ExecInsert`
//!   does for `ON CONFLICT DO NOTHING`: look for a conflicting key first (waiting
//!   for a transaction that is inserting it), insert the heap tuple with a
//!   speculative-insertion token, insert the index entries reporting conflicts
//!   instead of raising them, then confirm the tuple, or kill it and start again
//!   when another transaction got there in between. At REPEATABLE READ and above,
//!   a conflicting row the caller's snapshot cannot see is a serialization
//!   failure, as in the executor.
//! - [`Inserter::insert_probed`]: an optional probe, then a plain insert, or a
//!   place in the table's buffer, written with the access method's multi-insert
//!   (one WAL record per page, as `COPY` does).
//! - [`Inserter::insert`]: a plain insert.
//!
//! Heap and index inserts write WAL, move the `pg_stat` counters and are undone by
//! a rollback like any insert, and logical decoding sees them as it sees
//! `ON CONFLICT` inserts. The inserter closes what it opened when it is dropped
//! (writing nothing more); while an ERROR unwinds it leaves everything to the
//! aborting (sub)transaction.

use crate::pg::rel::Rel;
use crate::pg::slot::{bytea_datum, clear_slot, index_entries, per_tuple_memory};
use pgrx::datum::TimestampWithTimeZone;
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::ptr;

/// Errors of a direct write.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WriteError {
    /// A conflicting row the transaction's snapshot cannot see (REPEATABLE READ
    /// and above): 40001, as the executor raises it.
    #[error("could not serialize access due to concurrent update")]
    Serialization,
    /// The table's access method lacks a routine the writer calls.
    #[error("the table access method of {0} lacks a routine the direct write path needs")]
    AccessMethod(&'static str),
}

/// A value for one column of a row. Each is checked against its column's type
/// when the row is written (a mismatch is an internal error, XX000).
#[derive(Clone, Copy, Debug)]
pub enum Field<'a> {
    Null,
    Int4(i32),
    Int8(i64),
    Bool(bool),
    Bytes(&'a [u8]),
    TimestampTz(TimestampWithTimeZone),
    /// The transaction's start time, `now()`.
    Now,
    /// The top-level transaction's full id (`xid8`).
    TopXid,
}

/// Rows buffered per table before a multi-insert, and their bytes: the limits
/// `COPY` uses for its buffers.
const BUFFERED_ROWS: usize = 1000;
const BUFFERED_BYTES: usize = 65535;

/// A table opened by [`Inserter::open`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Table(usize);

impl Table {
    /// Its position among the inserter's tables (0, 1, ...), for a caller's own
    /// per-table state.
    pub fn index(self) -> usize {
        self.0
    }
}

/// One table opened for inserting.
struct Open {
    oid: pg_sys::Oid,
    /// Names the table in errors.
    label: &'static str,
    rel: pg_sys::Relation,
    info: *mut pg_sys::ResultRelInfo,
    /// The slot a single row goes through.
    slot: *mut pg_sys::TupleTableSlot,
    /// Rows waiting for a multi-insert, and their bytes.
    buffer: Vec<*mut pg_sys::TupleTableSlot>,
    buffered: usize,
    buffered_bytes: usize,
    /// The table's bulk-insert state (a buffer ring and the page being filled;
    /// one per relation, it remembers a buffer of its relation), or null.
    bulk: *mut pg_sys::BulkInsertStateData,
}

/// The direct writer of one call: an executor state, the tables it has opened,
/// and the rows it has buffered. [`Inserter::finish`] writes what is buffered
/// and closes it; dropped without it (an error returned through `?`), it closes
/// itself and drops what was buffered.
pub struct Inserter {
    estate: *mut pg_sys::EState,
    cid: pg_sys::CommandId,
    top_xid: pg_sys::Datum,
    now: pg_sys::Datum,
    /// Whether tables get a bulk-insert buffer strategy.
    bulk: bool,
    tables: Vec<Open>,
    /// A slot of a table's own type for reading a conflicting row back, made on
    /// first need (REPEATABLE READ conflicts only).
    conflict_slot: *mut pg_sys::TupleTableSlot,
    /// The speculative-insertion token held across rows inserted without a
    /// probe, see [`Inserter::insert_unless_exists`].
    token: Option<u32>,
}

impl Inserter {
    /// An inserter for the current command, or `None` without an active
    /// snapshot (not seen from SQL calls). `bulk` asks for a bulk-insert buffer
    /// strategy (large batches). Marks the command as writing and assigns the
    /// transaction id, as the executor does for an INSERT.
    pub fn new(bulk: bool) -> Option<Inserter> {
        // SAFETY: reads the snapshot stack's state.
        if !unsafe { pg_sys::ActiveSnapshotSet() } {
            return None;
        }
        // SAFETY: creating an executor state has no preconditions; it allocates
        // its own memory context under the current one. The active snapshot is
        // the caller's statement snapshot (a function always runs with one); it
        // outlives this call. GetCurrentCommandId(true) marks the command as
        // writing; the transaction id is assigned here (its first write), and
        // now() is the transaction's start.
        unsafe {
            let estate = pg_sys::CreateExecutorState();
            (*estate).es_snapshot = pg_sys::GetActiveSnapshot();
            let cid = pg_sys::GetCurrentCommandId(true);
            (*estate).es_output_cid = cid;
            let xid = pg_sys::GetTopFullTransactionId();
            Some(Inserter {
                estate,
                cid,
                top_xid: pg_sys::Datum::from(xid.value),
                now: pg_sys::Datum::from(pg_sys::GetCurrentTransactionStartTimestamp()),
                bulk,
                tables: Vec::new(),
                conflict_slot: ptr::null_mut(),
                token: None,
            })
        }
    }

    /// The table `oid`, opened before, if it was.
    pub fn opened(&self, oid: pg_sys::Oid) -> Option<Table> {
        self.tables.iter().position(|t| t.oid == oid).map(Table)
    }

    /// Opens table `oid` (which the caller has locked for inserting) and its
    /// indexes, if `accept` says rows may be written into it this way; `None`,
    /// with nothing kept open, otherwise. `label` names it in errors.
    pub fn open(
        &mut self,
        oid: pg_sys::Oid,
        label: &'static str,
        accept: impl FnOnce(&Rel) -> bool,
    ) -> Option<Table> {
        // The caller holds a lock, so opening only takes the relcache reference.
        let opened = Rel::open(oid, pg_sys::NoLock as pg_sys::LOCKMODE);
        if !accept(&opened) {
            return None; // closed by the guard
        }
        // Closed in close() with table_close (NoLock), as the guard would have.
        let rel = opened.into_raw();
        // SAFETY: rel is open. Everything allocated here lives in the executor
        // state's memory context.
        unsafe {
            let old = pg_sys::MemoryContextSwitchTo((*self.estate).es_query_cxt);
            let info = pg_sys::palloc0(std::mem::size_of::<pg_sys::ResultRelInfo>())
                .cast::<pg_sys::ResultRelInfo>();
            pg_sys::InitResultRelInfo(info, rel, 0, ptr::null_mut(), 0);
            // Speculative: builds the unique-check data the conflict probe needs.
            pg_sys::ExecOpenIndices(info, true);
            let slot = pg_sys::MakeSingleTupleTableSlot((*rel).rd_att, &pg_sys::TTSOpsHeapTuple);
            let bulk = if self.bulk {
                pg_sys::GetBulkInsertState()
            } else {
                ptr::null_mut()
            };
            pg_sys::MemoryContextSwitchTo(old);
            self.tables.push(Open {
                oid,
                label,
                rel,
                info,
                slot,
                buffer: Vec::new(),
                buffered: 0,
                buffered_bytes: 0,
                bulk,
            });
        }
        Some(Table(self.tables.len() - 1))
    }

    /// Forms `fields` into a heap tuple of `table` in memory context `cxt` and
    /// stores it in `slot`. The byte values are copied into the tuple.
    ///
    /// # Safety
    /// `slot` is a slot of the table's descriptor; `cxt` lives at least as long
    /// as the slot holds the tuple.
    unsafe fn form(
        &self,
        table: Table,
        fields: &[Field<'_>],
        cxt: pg_sys::MemoryContext,
        slot: *mut pg_sys::TupleTableSlot,
    ) {
        let open = &self.tables[table.0];
        let mut values = [pg_sys::Datum::from(0); 16];
        let mut nulls = [false; 16];
        let mut made = [false; 16];
        // SAFETY: the relation is open; its descriptor has natts attributes.
        let desc = unsafe { (*open.rel).rd_att };
        let natts = unsafe { (*desc).natts } as usize;
        if natts != fields.len() || natts > values.len() {
            mismatch(format!(
                "{} fields for {} columns of {}",
                fields.len(),
                natts,
                open.label
            ));
        }
        // SAFETY: the caller upholds this function's # Safety contract; byte
        // values are made in `cxt` and freed after the tuple copied them.
        unsafe {
            let old = pg_sys::MemoryContextSwitchTo(cxt);
            for (i, field) in fields.iter().enumerate() {
                let column = crate::pg::compat::attributes(desc)[i].atttypid;
                let (datum, typ) = match *field {
                    Field::Null => {
                        nulls[i] = true;
                        continue;
                    }
                    Field::Int4(v) => (pg_sys::Datum::from(v), pg_sys::INT4OID),
                    Field::Int8(v) => (pg_sys::Datum::from(v), pg_sys::INT8OID),
                    Field::Bool(v) => (pg_sys::Datum::from(v), pg_sys::BOOLOID),
                    Field::Bytes(b) => {
                        made[i] = true;
                        (bytea_datum(b), pg_sys::BYTEAOID)
                    }
                    Field::TimestampTz(t) => (
                        t.into_datum().unwrap_or(pg_sys::Datum::from(0)),
                        pg_sys::TIMESTAMPTZOID,
                    ),
                    Field::Now => (self.now, pg_sys::TIMESTAMPTZOID),
                    Field::TopXid => (self.top_xid, pg_sys::XID8OID),
                };
                if typ != column {
                    pg_sys::MemoryContextSwitchTo(old);
                    mismatch(format!(
                        "column {} of {} has type oid {}, given type oid {}",
                        i + 1,
                        open.label,
                        column.to_u32(),
                        typ.to_u32()
                    ));
                }
                values[i] = datum;
            }
            let tuple = pg_sys::heap_form_tuple(desc, values.as_mut_ptr(), nulls.as_mut_ptr());
            for i in 0..natts {
                if made[i] {
                    pg_sys::pfree(values[i].cast_mut_ptr());
                }
            }
            pg_sys::MemoryContextSwitchTo(old);
            pg_sys::ExecStoreHeapTuple(tuple, slot, true);
        }
    }

    /// Inserts a row into `table` unless its key exists (speculative insertion,
    /// see the module documentation); true if it was new. With `skip_probe` (the
    /// caller knows the key cannot exist yet), the first attempt skips the
    /// conflict probe: the index insertion still reports a conflict, and the
    /// attempt after it probes.
    ///
    /// A token only gives a transaction that meets one of our tuples before it
    /// is confirmed something to wait on; each tuple is confirmed (or killed)
    /// before the next is inserted. So the rows inserted without a probe share
    /// one token, taken at the first and released before the next probe or at
    /// the end: a waiter wakes later than it would have, finds the tuple
    /// confirmed and waits for this transaction, whose lock is held longer
    /// still; no wait that could not have happened otherwise is added. Rows that
    /// are probed take their own token, as `ExecInsert` does.
    pub fn insert_unless_exists(
        &mut self,
        table: Table,
        fields: &[Field<'_>],
        mut skip_probe: bool,
    ) -> Result<bool, WriteError> {
        let estate = self.estate;
        let cid = self.cid;
        let (rel, info, slot, bulk, label) = {
            let open = &self.tables[table.0];
            (open.rel, open.info, open.slot, open.bulk, open.label)
        };
        // SAFETY: the table's relation, result info and slot were set up in open
        // and stay valid for the inserter's life; the tuple is formed in the
        // per-tuple context, reset after the row.
        unsafe {
            let cxt = per_tuple_memory(estate);
            self.form(table, fields, cxt, slot);
            let am = (*rel).rd_tableam;
            let result = (|| {
                let insert = (*am)
                    .tuple_insert_speculative
                    .ok_or(WriteError::AccessMethod(label))?;
                let complete = (*am)
                    .tuple_complete_speculative
                    .ok_or(WriteError::AccessMethod(label))?;
                loop {
                    check_for_interrupts!();
                    let probe = !std::mem::take(&mut skip_probe);
                    if probe {
                        self.release_token();
                        let mut conflict = pg_sys::ItemPointerData::default();
                        if !crate::pg::compat::check_index_constraints(
                            info,
                            slot,
                            estate,
                            &mut conflict,
                            ptr::null_mut(),
                        ) {
                            self.check_visible(rel, label, &mut conflict)?;
                            return Ok(false);
                        }
                    }
                    let token = self.token();
                    insert(rel, slot, cid, 0, bulk, token);
                    let mut spec_conflict = false;
                    let recheck = crate::pg::compat::insert_index_tuples(
                        info,
                        slot,
                        estate,
                        true,
                        &mut spec_conflict,
                        ptr::null_mut(),
                    );
                    complete(rel, slot, token, !spec_conflict);
                    if probe || spec_conflict {
                        self.release_token();
                    }
                    pg_sys::list_free(recheck);
                    if !spec_conflict {
                        return Ok(true);
                    }
                    // Another transaction inserted the key between the probe and
                    // ours: our tuple is dead; the probe now waits for that
                    // transaction and decides.
                }
            })();
            clear_slot(slot);
            pg_sys::MemoryContextReset(cxt);
            result
        }
    }

    /// The speculative-insertion token to insert with: the one held, or a new
    /// one (taken as `ExecInsert` takes it).
    fn token(&mut self) -> u32 {
        *self.token.get_or_insert_with(|| {
            // SAFETY: the transaction id is assigned (new); the token lock is
            // released by release_token or, on an ERROR, by the abort.
            unsafe { pg_sys::SpeculativeInsertionLockAcquire(pg_sys::GetCurrentTransactionId()) }
        })
    }

    /// Releases the token held, if any.
    fn release_token(&mut self) {
        if self.token.take().is_some() {
            // SAFETY: releases the token taken last by token() (no other
            // speculative insertion runs in this backend meanwhile).
            unsafe { pg_sys::SpeculativeInsertionLockRelease(pg_sys::GetCurrentTransactionId()) };
        }
    }

    /// Inserts (or, with `buffered`, buffers for a multi-insert) a row into
    /// `table` unless `probe` finds its key; true if it was new. Without
    /// `probe`, the caller knows the key is not there (other inserters of it
    /// wait behind a row of this transaction); `bytes` counts towards the
    /// buffer's size.
    pub fn insert_probed(
        &mut self,
        table: Table,
        fields: &[Field<'_>],
        probe: bool,
        buffered: bool,
        bytes: usize,
    ) -> Result<bool, WriteError> {
        let estate = self.estate;
        let (rel, info, single, label) = {
            let open = &self.tables[table.0];
            (open.rel, open.info, open.slot, open.label)
        };
        // SAFETY: as in insert_unless_exists. A buffered tuple is formed in the
        // executor state's query context, so it lives until the buffer is
        // flushed.
        unsafe {
            let (cxt, slot) = if buffered {
                ((*estate).es_query_cxt, self.buffer_slot(table))
            } else {
                (per_tuple_memory(estate), single)
            };
            self.form(table, fields, cxt, slot);
            let mut conflict = pg_sys::ItemPointerData::default();
            if probe
                && !crate::pg::compat::check_index_constraints(
                    info,
                    slot,
                    estate,
                    &mut conflict,
                    ptr::null_mut(),
                )
            {
                clear_slot(slot);
                self.check_visible(rel, label, &mut conflict)?;
                return Ok(false);
            }
            if buffered {
                let open = &mut self.tables[table.0];
                open.buffered += 1;
                open.buffered_bytes += bytes;
                if open.buffered >= BUFFERED_ROWS || open.buffered_bytes >= BUFFERED_BYTES {
                    self.flush(table)?;
                }
                return Ok(true);
            }
            self.insert_slot(table, slot)?;
            Ok(true)
        }
    }

    /// Inserts a row into `table` without a probe (its key is new by
    /// construction), then its index entries.
    pub fn insert(&mut self, table: Table, fields: &[Field<'_>]) -> Result<(), WriteError> {
        let (estate, slot) = (self.estate, self.tables[table.0].slot);
        // SAFETY: as in insert_unless_exists.
        unsafe {
            self.form(table, fields, per_tuple_memory(estate), slot);
            self.insert_slot(table, slot)
        }
    }

    /// Inserts the row in `slot` into `table`, then its index entries.
    ///
    /// # Safety
    /// `slot` holds a formed tuple of the table's descriptor.
    unsafe fn insert_slot(
        &self,
        table: Table,
        slot: *mut pg_sys::TupleTableSlot,
    ) -> Result<(), WriteError> {
        let open = &self.tables[table.0];
        // SAFETY: the caller upholds this function's # Safety contract; the
        // relation and result info are the table's, opened in open.
        unsafe {
            let insert = (*(*open.rel).rd_tableam)
                .tuple_insert
                .ok_or(WriteError::AccessMethod(open.label))?;
            insert(open.rel, slot, self.cid, 0, open.bulk);
            index_entries(self.estate, open.info, slot);
        }
        Ok(())
    }

    /// The next free buffer slot of a table, made on first use.
    ///
    /// # Safety
    /// The inserter is open.
    unsafe fn buffer_slot(&mut self, table: Table) -> *mut pg_sys::TupleTableSlot {
        let estate = self.estate;
        // SAFETY: the caller upholds this function's # Safety contract; the
        // slot is made in the executor state's query context.
        unsafe {
            let open = &mut self.tables[table.0];
            if open.buffered == open.buffer.len() {
                let old = pg_sys::MemoryContextSwitchTo((*estate).es_query_cxt);
                open.buffer.push(pg_sys::MakeSingleTupleTableSlot(
                    (*open.rel).rd_att,
                    &pg_sys::TTSOpsHeapTuple,
                ));
                pg_sys::MemoryContextSwitchTo(old);
            }
            open.buffer[open.buffered]
        }
    }

    /// Writes a table's buffered rows with one multi-insert, then their index
    /// entries.
    fn flush(&mut self, table: Table) -> Result<(), WriteError> {
        let estate = self.estate;
        let cid = self.cid;
        let open = &mut self.tables[table.0];
        if open.buffered == 0 {
            return Ok(());
        }
        // SAFETY: the first `buffered` slots hold formed tuples; the relation and
        // result info are the table's.
        unsafe {
            let multi = (*(*open.rel).rd_tableam)
                .multi_insert
                .ok_or(WriteError::AccessMethod(open.label))?;
            let count = i32::try_from(open.buffered).unwrap_or(i32::MAX);
            multi(open.rel, open.buffer.as_mut_ptr(), count, cid, 0, open.bulk);
            for &slot in &open.buffer[..open.buffered] {
                index_entries(estate, open.info, slot);
            }
        }
        open.buffered = 0;
        open.buffered_bytes = 0;
        Ok(())
    }

    /// What `ON CONFLICT DO NOTHING` checks at REPEATABLE READ and SERIALIZABLE:
    /// a conflicting row must be visible to the transaction's snapshot, or have
    /// been written by this transaction; otherwise 40001.
    ///
    /// # Safety
    /// `rel` is an open table of this inserter, `conflict` a tid the probe
    /// returned.
    unsafe fn check_visible(
        &mut self,
        rel: pg_sys::Relation,
        label: &'static str,
        conflict: &mut pg_sys::ItemPointerData,
    ) -> Result<(), WriteError> {
        // SAFETY: the caller upholds this function's # Safety contract.
        unsafe {
            if pg_sys::XactIsoLevel < pg_sys::XACT_REPEATABLE_READ as i32 {
                return Ok(());
            }
            let am = (*rel).rd_tableam;
            let fetch = (*am)
                .tuple_fetch_row_version
                .ok_or(WriteError::AccessMethod(label))?;
            let satisfies = (*am)
                .tuple_satisfies_snapshot
                .ok_or(WriteError::AccessMethod(label))?;
            // A slot made for one table serves another only if the descriptor is
            // the same: made on first need, made again for another table.
            let slot = self.conflict_slot;
            if slot.is_null() || (*slot).tts_tupleDescriptor != (*rel).rd_att {
                if !slot.is_null() {
                    pg_sys::ExecDropSingleTupleTableSlot(slot);
                }
                let old = pg_sys::MemoryContextSwitchTo((*self.estate).es_query_cxt);
                self.conflict_slot = pg_sys::table_slot_create(rel, ptr::null_mut());
                pg_sys::MemoryContextSwitchTo(old);
            }
            let slot = self.conflict_slot;
            if !fetch(rel, conflict, &raw mut pg_sys::SnapshotAnyData, slot) {
                // The executor raises an internal error here; the row was seen a
                // moment ago and cannot have been vacuumed away (we hold our
                // snapshot).
                pgrx::error!("failed to fetch conflicting tuple for ON CONFLICT");
            }
            let visible = satisfies(rel, slot, (*self.estate).es_snapshot);
            let mut ours = false;
            if !visible {
                let mut isnull = false;
                let getsysattr = (*(*slot).tts_ops)
                    .getsysattr
                    .ok_or(WriteError::AccessMethod(label))?;
                let xmin = getsysattr(slot, pg_sys::MinTransactionIdAttributeNumber, &mut isnull);
                ours = pg_sys::TransactionIdIsCurrentTransactionId(pg_sys::TransactionId::from(
                    xmin.value() as u32,
                ));
            }
            clear_slot(slot);
            if visible || ours {
                Ok(())
            } else {
                Err(WriteError::Serialization)
            }
        }
    }

    /// Writes what is buffered and closes everything the inserter opened.
    pub fn finish(mut self) -> Result<(), WriteError> {
        self.release_token();
        let mut flushed = Ok(());
        for index in 0..self.tables.len() {
            flushed = flushed.and_then(|()| self.flush(Table(index)));
        }
        self.close();
        flushed
    }

    /// Closes everything the inserter opened, dropping whatever is still
    /// buffered. Once: a closed inserter has no executor state.
    fn close(&mut self) {
        if self.estate.is_null() {
            return;
        }
        self.release_token();
        // SAFETY: each table was opened in open; its slots were made there or in
        // buffer_slot. The relation stays locked until the transaction ends.
        unsafe {
            for open in self.tables.drain(..) {
                pg_sys::ExecDropSingleTupleTableSlot(open.slot);
                for slot in open.buffer {
                    pg_sys::ExecDropSingleTupleTableSlot(slot);
                }
                if !open.bulk.is_null() {
                    pg_sys::FreeBulkInsertState(open.bulk);
                }
                pg_sys::ExecCloseIndices(open.info);
                pg_sys::table_close(open.rel, pg_sys::NoLock as pg_sys::LOCKMODE);
            }
            if !self.conflict_slot.is_null() {
                pg_sys::ExecDropSingleTupleTableSlot(self.conflict_slot);
                self.conflict_slot = ptr::null_mut();
            }
            pg_sys::FreeExecutorState(self.estate);
        }
        self.estate = ptr::null_mut();
    }
}

impl Drop for Inserter {
    fn drop(&mut self) {
        // An ERROR unwinding through here (pgrx turns it into a Rust panic) is
        // cleaned up by the transaction's abort: Postgres' own cleanup may have
        // run already, and calling into it again from a destructor during the
        // unwind is what must not happen.
        if !std::thread::panicking() {
            self.close();
        }
    }
}

/// A row that does not fit its table: the code and the table disagree.
fn mismatch(what: String) -> ! {
    pgrx::ereport!(
        ERROR,
        PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
        format!("a row does not fit its table: {what}")
    );
}

/// A dirty snapshot (it sees rows being inserted, as a conflict probe does),
/// for scans that look for keys other transactions may be writing.
pub struct DirtySnapshot(Box<pg_sys::SnapshotData>);

impl DirtySnapshot {
    pub fn new() -> DirtySnapshot {
        // SAFETY: a zeroed SnapshotData with its type set is what
        // InitDirtySnapshot makes; scans update its xmin/xmax.
        let mut data: pg_sys::SnapshotData = unsafe { std::mem::zeroed() };
        data.snapshot_type = pg_sys::SnapshotType::SNAPSHOT_DIRTY;
        DirtySnapshot(Box::new(data))
    }

    /// For a scan; valid while self lives.
    pub fn as_ptr(&mut self) -> pg_sys::Snapshot {
        &mut *self.0
    }
}

impl Default for DirtySnapshot {
    fn default() -> DirtySnapshot {
        DirtySnapshot::new()
    }
}
