//! The direct write path: envelope rows written into their band leaves through the
//! table access method and the executor's index routines, with no SPI, no plan and
//! no executor run.
//!
//! What an `INSERT ... ON CONFLICT DO NOTHING` into the leaf would do, step by step,
//! and nothing else (the leaves have no triggers, CHECK constraints, foreign keys,
//! generated columns or row security for the owner, which [`Writer::open`]
//! verifies before each call):
//!
//! - **meta** rows by speculative insertion, as `ExecInsert` does for `ON CONFLICT
//!   DO NOTHING`: look for a conflicting key first (waiting for a transaction that
//!   is inserting it), insert the heap tuple with a speculative-insertion token,
//!   insert the index entries reporting conflicts instead of raising them, then
//!   confirm the tuple, or kill it and start again when another transaction got
//!   there in between. A key that exists is skipped and counted as 0, never an
//!   error, never a duplicate. At REPEATABLE READ and above, a conflicting row the
//!   caller's snapshot cannot see raises 40001, as the executor does.
//! - **blob** rows only for meta rows that were new. Any other inserter of the same
//!   key waits behind the meta row (its own conflict check waits for this
//!   transaction), so a blob key is probed once and inserted without speculation;
//!   the probe keeps the rule that a blob row already there (its meta row dropped
//!   by hand) is kept and the envelope counted as not new. Batches buffer the blob
//!   rows of each leaf and write them with the access method's multi-insert (one
//!   WAL record per page, as `COPY` does).
//!
//! Heap and index inserts write WAL, move the `pg_stat` counters and are undone by a
//! rollback like any insert, and logical decoding sees them as it sees
//! `ON CONFLICT` inserts. The statement trigger on meta does not fire (no statement
//! runs on the root), so the caller rings the doorbell itself
//! ([`Writer::rings_doorbell`] tells whether the trigger would have).

pub use super::leaf::DirectError;
use super::leaf::{
    columns_of, heap_table, leaf_is_plain, refuse_insert_rules, root_triggers_allow, LATE_COLUMNS,
};
use crate::pg::scan::Path;
use crate::pg::slot::{bytea_datum, clear_slot, index_entries, per_tuple_memory};
use crate::store::feed::late;
use crate::store::partition::band::Table;
use crate::store::partition::cache::Route;
use pgrx::datum::TimestampWithTimeZone;
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::ptr;

/// One envelope as the direct path writes it.
pub struct Row<'a> {
    pub node: i32,
    pub seq: i64,
    pub topic: &'a [u8],
    pub envelope: &'a [u8],
    pub payer: Option<i32>,
    pub time: Option<TimestampWithTimeZone>,
    pub expiry: Option<i64>,
}

/// Blob rows buffered per leaf before a multi-insert, and their bytes: the limits
/// `COPY` uses for its buffers.
const BUFFERED_ROWS: usize = 1000;
const BUFFERED_BYTES: usize = 65535;

/// One band leaf opened for inserting.
struct Leaf {
    oid: pg_sys::Oid,
    rel: pg_sys::Relation,
    info: *mut pg_sys::ResultRelInfo,
    /// The slot a single row goes through.
    slot: *mut pg_sys::TupleTableSlot,
    /// Blob rows waiting for a multi-insert, and their bytes.
    buffer: Vec<*mut pg_sys::TupleTableSlot>,
    buffered: usize,
    buffered_bytes: usize,
    /// The leaf's bulk-insert state (a buffer ring and the page being filled; one
    /// per relation, it remembers a buffer of its relation), or null.
    bulk: *mut pg_sys::BulkInsertStateData,
    /// Blob leaves: the keys of one originator it held from some sequence id on,
    /// see [`Writer::blob_taken`].
    taken: Option<Taken>,
}

/// The sequence ids of `node`, from `from` on, that a blob leaf held (committed
/// or being inserted) when it was scanned, ascending.
struct Taken {
    node: i32,
    from: i64,
    seqs: Vec<i64>,
}

/// The direct writer of one insert call: an executor state, the leaves it has
/// opened, and the blob rows it has buffered. [`Writer::finish`] writes what is
/// buffered and closes it; dropped without it (an error returned through `?`), it
/// closes itself and drops what was buffered. While an ERROR unwinds it leaves
/// everything to the aborting (sub)transaction, which releases the relations and
/// memory: Postgres' own cleanup may already have run, and calling into it again
/// from a destructor during the unwind is what must not happen.
pub struct Writer {
    estate: *mut pg_sys::EState,
    cid: pg_sys::CommandId,
    inserted_xid: pg_sys::Datum,
    now: pg_sys::Datum,
    /// Whether leaves get a bulk-insert buffer strategy.
    bulk: bool,
    leaves: Vec<Leaf>,
    /// A slot of the leaf's own type for reading a conflicting row back, made on
    /// first need (REPEATABLE READ conflicts only).
    conflict_slot: *mut pg_sys::TupleTableSlot,
    doorbell: bool,
    /// `late_envelopes` (index into `leaves`), its id sequence and its layout,
    /// opened on the first late row.
    late: Option<(usize, pg_sys::Oid, late::Layout)>,
    /// The speculative-insertion token held across the fresh meta rows of a
    /// batch, see [`Writer::speculative_insert`].
    token: Option<u32>,
}

impl Writer {
    /// A writer for rows routed to `routes`, or `None` when a table has something
    /// the direct path does not reproduce (a trigger other than the doorbell, a
    /// column layout other than the extension's, row security forced on the
    /// owner): the caller then takes the SQL path. The routes are locked already.
    /// `bulk` asks for a bulk-insert buffer strategy (large batches). A band the
    /// partition catalog found lacking for the direct paths (partitioned, another
    /// access method, an index missing: [`crate::store::partition::Lacks`]) takes the SQL
    /// path too. An INSERT rule on a root is an error ([`DirectError::Rule`]):
    /// neither path can apply it (the SQL path's `ON CONFLICT` is refused by
    /// Postgres on such a table).
    pub fn open(routes: &[[Route; 2]], bulk: bool) -> Result<Option<Writer>, DirectError> {
        let Some(first) = routes.first() else {
            return Ok(None);
        };
        let doorbell = root_triggers_allow(first[Table::Meta as usize].root, true)?;
        let blob = root_triggers_allow(first[Table::Blob as usize].root, false)?;
        let (Some(doorbell), Some(_)) = (doorbell, blob) else {
            return Ok(None);
        };
        if routes
            .iter()
            .flatten()
            .any(|route| route.path != Path::Index)
        {
            return Ok(None);
        }
        // SAFETY: reads the snapshot stack's state.
        if !unsafe { pg_sys::ActiveSnapshotSet() } {
            return Ok(None); // not seen from SQL calls; the SQL path copes with it
        }
        // SAFETY: creating an executor state has no preconditions; it allocates
        // its own memory context under the current one.
        let estate = unsafe { pg_sys::CreateExecutorState() };
        // SAFETY: estate was just created. The active snapshot is the caller's
        // statement snapshot (a function always runs with one); it outlives this
        // call. GetCurrentCommandId(true) marks the command as writing, as the
        // executor does for an INSERT; the transaction id is assigned here (its
        // first write), and now() is the transaction's start.
        let (cid, inserted_xid, now) = unsafe {
            (*estate).es_snapshot = pg_sys::GetActiveSnapshot();
            let cid = pg_sys::GetCurrentCommandId(true);
            (*estate).es_output_cid = cid;
            let xid = pg_sys::GetTopFullTransactionId();
            (
                cid,
                pg_sys::Datum::from(xid.value),
                pg_sys::Datum::from(pg_sys::GetCurrentTransactionStartTimestamp()),
            )
        };
        let mut writer = Writer {
            estate,
            cid,
            inserted_xid,
            now,
            bulk,
            leaves: Vec::with_capacity(routes.len() * 2),
            conflict_slot: ptr::null_mut(),
            doorbell,
            late: None,
            token: None,
        };
        for pair in routes {
            for (table, route) in Table::ALL.into_iter().zip(pair) {
                if writer.leaf_index(route.leaf).is_none() && !writer.open_leaf(table, route.leaf) {
                    return Ok(None); // closed on drop
                }
            }
        }
        Ok(Some(writer))
    }

    /// Whether the doorbell trigger would have fired for these rows (it is enabled
    /// for this session's replication role).
    pub fn rings_doorbell(&self) -> bool {
        self.doorbell
    }

    fn leaf_index(&self, oid: pg_sys::Oid) -> Option<usize> {
        self.leaves.iter().position(|leaf| leaf.oid == oid)
    }

    /// Opens a leaf (already locked by the caller) and its indexes; false if the
    /// leaf is not one the direct path can write.
    fn open_leaf(&mut self, table: Table, oid: pg_sys::Oid) -> bool {
        // What the catalog found when it loaded the band is checked again where
        // it is dereferenced (the kind and access method, cheap to read), in
        // case the band changed under a route taken before its lock.
        self.open_relation(oid, |rel| {
            heap_table(rel) && leaf_is_plain(rel, columns_of(table))
        })
    }

    /// Opens `envelopes.late_envelopes` for the late-envelope feed's rows, and
    /// finds its id sequence; false if either is missing or not as the extension
    /// made it (the caller then takes the SQL path).
    pub fn open_late(&mut self) -> Result<bool, DirectError> {
        if self.late.is_some() {
            return Ok(true);
        }
        use crate::pg::catalog;
        let Some(schema) = catalog::namespace(c"envelopes") else {
            return Ok(false);
        };
        let (Some(table), Some(sequence)) = (
            catalog::relation_in(schema, c"late_envelopes"),
            catalog::relation_in(schema, c"late_envelopes_id_seq"),
        ) else {
            return Ok(false);
        };
        // SAFETY: locks the feed table as an INSERT would (ROW EXCLUSIVE, held to
        // the end of the transaction); the relation is opened below.
        unsafe { pg_sys::LockRelationOid(table, pg_sys::RowExclusiveLock as pg_sys::LOCKMODE) };
        refuse_insert_rules(table)?;
        // The layout before the upgrade script to 0.4.0 ran is the first four
        // columns (one row per entry).
        let mut layout = late::Layout::Ranges;
        let opened = self.open_relation(table, |rel| {
            if !heap_table(rel) {
                return false;
            }
            if leaf_is_plain(rel, &LATE_COLUMNS) {
                return true;
            }
            layout = late::Layout::Rows;
            leaf_is_plain(rel, &LATE_COLUMNS[..4])
        });
        if opened {
            self.late = Some((self.leaves.len() - 1, sequence, layout));
        }
        Ok(opened)
    }

    /// The layout of the `late_envelopes` opened by [`Writer::open_late`].
    pub fn late_layout(&self) -> Option<late::Layout> {
        self.late.map(|(_, _, layout)| layout)
    }

    /// Records an entry of the late-envelope feed in `late_envelopes` (after
    /// [`Writer::open_late`]): its id drawn from the table's sequence,
    /// `recorded_at` = now(), and for [`late::Layout::Ranges`] the range's last
    /// id and the current transaction as `inserted_xid` (a [`late::Layout::Rows`]
    /// table takes entries of one row only).
    pub fn insert_late(&mut self, entry: late::Entry) -> Result<(), DirectError> {
        let (index, sequence, layout) = self.late.expect("open_late before insert_late");
        let estate = self.estate;
        // SAFETY: as in insert_blob; nextval_oid draws from the identity sequence
        // the functions' owner owns, given its valid oid (the marker naming the
        // last drawn id is held, see crate::store::feed::markers).
        unsafe {
            let (rel, slot) = {
                let leaf = &self.leaves[index];
                (leaf.rel, leaf.slot)
            };
            let id = crate::pg::catalog::sequence_next_value(sequence)
                .ok_or(DirectError::AccessMethod("late_envelopes_id_seq"))?;
            let cxt = per_tuple_memory(estate);
            let old = pg_sys::MemoryContextSwitchTo(cxt);
            let mut values = [
                pg_sys::Datum::from(id),
                pg_sys::Datum::from(entry.node),
                pg_sys::Datum::from(entry.first),
                self.now,
                pg_sys::Datum::from(entry.last),
                self.inserted_xid,
            ];
            let mut nulls = [false; 6];
            let columns = match layout {
                late::Layout::Ranges => 6,
                late::Layout::Rows => 4,
            };
            let tuple = pg_sys::heap_form_tuple(
                (*rel).rd_att,
                values[..columns].as_mut_ptr(),
                nulls[..columns].as_mut_ptr(),
            );
            pg_sys::MemoryContextSwitchTo(old);
            pg_sys::ExecStoreHeapTuple(tuple, slot, true);
            self.insert_plain(index, slot)?;
        }
        Ok(())
    }

    /// Opens a relation (already locked by the caller) and its indexes; false,
    /// and nothing kept open, if `plain` says the direct path cannot write it.
    fn open_relation(
        &mut self,
        oid: pg_sys::Oid,
        plain: impl FnOnce(&crate::pg::rel::Rel) -> bool,
    ) -> bool {
        // The caller holds ROW EXCLUSIVE on the leaf (partition::route), so
        // opening it only takes the relcache reference.
        let opened = crate::pg::rel::Rel::open(oid, pg_sys::NoLock as pg_sys::LOCKMODE);
        if !plain(&opened) {
            return false; // closed by the guard
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
            self.leaves.push(Leaf {
                oid,
                rel,
                info,
                slot,
                buffer: Vec::new(),
                taken: None,
                buffered: 0,
                buffered_bytes: 0,
                bulk,
            });
        }
        true
    }

    /// Inserts one meta row into `leaf` unless its key exists; true if it was new.
    /// With `fresh` (the key cannot exist yet, see `late::Lateness`), the first
    /// attempt skips the conflict probe: the index insertion still reports a
    /// conflict, and the attempt after it probes.
    pub fn insert_meta(
        &mut self,
        leaf: pg_sys::Oid,
        row: &Row<'_>,
        late: bool,
        fresh: bool,
    ) -> Result<bool, DirectError> {
        let index = self.leaf_index(leaf).expect("leaf opened in Writer::open");
        let mut values = [pg_sys::Datum::from(0); 8];
        let mut nulls = [false; 8];
        values[0] = pg_sys::Datum::from(row.node);
        values[1] = pg_sys::Datum::from(row.seq);
        values[2] = match row.time {
            Some(time) => time.into_datum().expect("a timestamp is never NULL"),
            None => self.now,
        };
        values[4] = match row.payer {
            Some(payer) => pg_sys::Datum::from(payer),
            None => {
                nulls[4] = true;
                pg_sys::Datum::from(0)
            }
        };
        values[5] = match row.expiry {
            Some(expiry) => pg_sys::Datum::from(expiry),
            None => {
                nulls[5] = true;
                pg_sys::Datum::from(0)
            }
        };
        values[6] = self.inserted_xid;
        values[7] = pg_sys::Datum::from(late);
        let estate = self.estate;
        let cid = self.cid;
        let leaf = &self.leaves[index];
        let bulk = leaf.bulk;
        // SAFETY: the leaf's relation, result info and slot were set up in
        // open_leaf and stay valid for the writer's life; the tuple is formed from
        // datums valid for this call (the topic varlena is made in the per-tuple
        // context, reset after the row).
        unsafe {
            let cxt = per_tuple_memory(estate);
            let old = pg_sys::MemoryContextSwitchTo(cxt);
            values[3] = bytea_datum(row.topic);
            let tuple = pg_sys::heap_form_tuple(
                (*leaf.rel).rd_att,
                values.as_mut_ptr(),
                nulls.as_mut_ptr(),
            );
            pg_sys::MemoryContextSwitchTo(old);
            pg_sys::ExecStoreHeapTuple(tuple, leaf.slot, true);
            let inserted = self.speculative_insert(index, estate, cid, bulk, fresh);
            clear_slot(self.leaves[index].slot);
            pg_sys::MemoryContextReset(cxt);
            inserted
        }
    }

    /// The speculative insertion of the row in the leaf's slot (see the module
    /// documentation); true if it was inserted. With `skip_probe`, the first
    /// attempt goes straight to the insertion: the probe only spares inserting a
    /// tuple that will be killed, and waits for a transaction inserting the same
    /// key, which the index insertion's conflict report then leads to.
    ///
    /// A token only gives a transaction that meets one of our tuples before it is
    /// confirmed something to wait on; each tuple is confirmed (or killed) before
    /// the next is inserted. So the rows inserted without a probe share one token,
    /// taken at the first and released before the next probe or at the end: a
    /// waiter wakes later than it would have, finds the tuple confirmed and waits
    /// for this transaction, whose lock is held longer still; no wait that could
    /// not have happened otherwise is added. Rows that are probed take their own
    /// token, as `ExecInsert` does.
    ///
    /// # Safety
    /// The leaf's slot holds the row; `estate`, `cid` and `bulk` are this writer's.
    unsafe fn speculative_insert(
        &mut self,
        index: usize,
        estate: *mut pg_sys::EState,
        cid: pg_sys::CommandId,
        bulk: *mut pg_sys::BulkInsertStateData,
        mut skip_probe: bool,
    ) -> Result<bool, DirectError> {
        // SAFETY: the caller upholds this function's # Safety contract.
        unsafe {
            let (rel, info, slot) = {
                let leaf = &self.leaves[index];
                (leaf.rel, leaf.info, leaf.slot)
            };
            let am = (*rel).rd_tableam;
            let insert = (*am)
                .tuple_insert_speculative
                .ok_or(DirectError::AccessMethod("meta"))?;
            let complete = (*am)
                .tuple_complete_speculative
                .ok_or(DirectError::AccessMethod("meta"))?;
            loop {
                check_for_interrupts!();
                let probe = !std::mem::take(&mut skip_probe);
                if probe {
                    self.release_token();
                    let mut conflict = pg_sys::ItemPointerData::default();
                    if !pg_sys::ExecCheckIndexConstraints(
                        info,
                        slot,
                        estate,
                        &mut conflict,
                        ptr::null_mut(),
                    ) {
                        self.check_visible(rel, &mut conflict)?;
                        return Ok(false);
                    }
                }
                let token = self.token();
                insert(rel, slot, cid, 0, bulk, token);
                let mut spec_conflict = false;
                let recheck = pg_sys::ExecInsertIndexTuples(
                    info,
                    slot,
                    estate,
                    false,
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
                // Another transaction inserted the key between the probe and ours: our
                // tuple is dead; the probe now waits for that transaction and decides.
            }
        }
    }

    /// The speculative-insertion token to insert a meta tuple with: the one held,
    /// or a new one (taken as `ExecInsert` takes it).
    fn token(&mut self) -> u32 {
        *self.token.get_or_insert_with(|| {
            // SAFETY: the transaction id is assigned (Writer::open); the token lock
            // is released by release_token or, on an ERROR, by the abort.
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

    /// Whether blob leaf `index` may hold `(node, seq)`. The first question for
    /// an originator scans the leaf once from `seq` on with a dirty snapshot
    /// (which sees rows being inserted, as the probe does); later questions about
    /// higher ids of the same originator are answered from that scan. Only asked
    /// for keys whose meta row was fresh (see `late::Lateness`), so the scan
    /// usually finds nothing: a blob row above every meta row written through
    /// the functions comes from a write around them.
    fn blob_taken(&mut self, index: usize, node: i32, seq: i64) -> bool {
        let leaf = &mut self.leaves[index];
        let known = leaf
            .taken
            .as_ref()
            .is_some_and(|t| t.node == node && t.from <= seq);
        if !known {
            // SAFETY: a zeroed SnapshotData with its type set is what
            // InitDirtySnapshot makes; the scan below updates its xmin/xmax and
            // is closed before it goes out of scope.
            let mut dirty: pg_sys::SnapshotData = unsafe { std::mem::zeroed() };
            dirty.snapshot_type = pg_sys::SnapshotType::SNAPSHOT_DIRTY;
            let range = crate::pg::scan::Range::Envelope {
                node,
                after: seq - 1,
                upto: i64::MAX,
            };
            // None cannot happen for a locked leaf with its primary key; probing
            // is then the safe answer.
            let Some(mut scan) =
                crate::pg::scan::Scan::open(leaf.oid, &raw mut dirty, range, false)
            else {
                leaf.taken = None;
                return true;
            };
            let mut seqs = Vec::new();
            // Column 2 is the sequence id (checked by leaf_is_plain).
            while scan.next() {
                seqs.extend(scan.raw(2).map(|d| d.value() as i64));
            }
            drop(scan);
            leaf.taken = Some(Taken {
                node,
                from: seq,
                seqs,
            });
        }
        leaf.taken
            .as_ref()
            .is_none_or(|t| t.seqs.binary_search(&seq).is_ok())
    }

    /// Inserts (or buffers, in a batch) the blob row of a new meta row unless its
    /// key exists; true if it was new. With `fresh` (its meta key was fresh) and
    /// `buffered`, the key is probed only if [`Writer::blob_taken`] says the leaf
    /// may hold it; any other writer through the functions waits behind the meta
    /// row, as for the probe.
    pub fn insert_blob(
        &mut self,
        leaf: pg_sys::Oid,
        node: i32,
        seq: i64,
        envelope: &[u8],
        buffered: bool,
        fresh: bool,
    ) -> Result<bool, DirectError> {
        let index = self.leaf_index(leaf).expect("leaf opened in Writer::open");
        let probe = !(buffered && fresh) || self.blob_taken(index, node, seq);
        let estate = self.estate;
        // SAFETY: as in insert_meta. A buffered tuple is formed in the executor
        // state's query context, so it lives until the buffer is flushed.
        unsafe {
            let (rel, info, single) = {
                let leaf = &self.leaves[index];
                (leaf.rel, leaf.info, leaf.slot)
            };
            let cxt = if buffered {
                (*estate).es_query_cxt
            } else {
                per_tuple_memory(estate)
            };
            let old = pg_sys::MemoryContextSwitchTo(cxt);
            let mut values = [
                pg_sys::Datum::from(node),
                pg_sys::Datum::from(seq),
                bytea_datum(envelope),
            ];
            let mut nulls = [false; 3];
            let tuple =
                pg_sys::heap_form_tuple((*rel).rd_att, values.as_mut_ptr(), nulls.as_mut_ptr());
            pg_sys::pfree(values[2].cast_mut_ptr());
            let slot = if buffered {
                self.buffer_slot(index)
            } else {
                single
            };
            pg_sys::MemoryContextSwitchTo(old);
            pg_sys::ExecStoreHeapTuple(tuple, slot, true);
            let mut conflict = pg_sys::ItemPointerData::default();
            if probe
                && !pg_sys::ExecCheckIndexConstraints(
                    info,
                    slot,
                    estate,
                    &mut conflict,
                    ptr::null_mut(),
                )
            {
                clear_slot(slot);
                self.check_visible(rel, &mut conflict)?;
                return Ok(false);
            }
            if buffered {
                let leaf = &mut self.leaves[index];
                leaf.buffered += 1;
                leaf.buffered_bytes += envelope.len();
                if leaf.buffered >= BUFFERED_ROWS || leaf.buffered_bytes >= BUFFERED_BYTES {
                    self.flush(index)?;
                }
                return Ok(true);
            }
            self.insert_plain(index, slot)?;
            Ok(true)
        }
    }

    /// Inserts the row in `slot` into leaf `index` without speculation (its key
    /// was probed, or is new by construction), then its index entries.
    ///
    /// # Safety
    /// `slot` holds a formed tuple of the leaf's descriptor.
    unsafe fn insert_plain(
        &self,
        index: usize,
        slot: *mut pg_sys::TupleTableSlot,
    ) -> Result<(), DirectError> {
        let leaf = &self.leaves[index];
        // SAFETY: the caller upholds this function's # Safety contract; the
        // relation and result info are the leaf's, opened in open_relation.
        unsafe {
            let insert = (*(*leaf.rel).rd_tableam)
                .tuple_insert
                .ok_or(DirectError::AccessMethod("a table of the store"))?;
            insert(leaf.rel, slot, self.cid, 0, leaf.bulk);
            index_entries(self.estate, leaf.info, slot);
        }
        Ok(())
    }

    /// The next free buffer slot of a leaf, made on first use.
    ///
    /// # Safety
    /// Runs in the executor state's query context.
    unsafe fn buffer_slot(&mut self, index: usize) -> *mut pg_sys::TupleTableSlot {
        // SAFETY: the caller upholds this function's # Safety contract.
        unsafe {
            let leaf = &mut self.leaves[index];
            if leaf.buffered == leaf.buffer.len() {
                leaf.buffer.push(pg_sys::MakeSingleTupleTableSlot(
                    (*leaf.rel).rd_att,
                    &pg_sys::TTSOpsHeapTuple,
                ));
            }
            leaf.buffer[leaf.buffered]
        }
    }

    /// Writes a leaf's buffered blob rows with one multi-insert, then their index
    /// entries.
    fn flush(&mut self, index: usize) -> Result<(), DirectError> {
        let estate = self.estate;
        let leaf = &mut self.leaves[index];
        if leaf.buffered == 0 {
            return Ok(());
        }
        // SAFETY: the first `buffered` slots hold formed tuples; the relation and
        // result info are the leaf's.
        unsafe {
            let multi = (*(*leaf.rel).rd_tableam)
                .multi_insert
                .ok_or(DirectError::AccessMethod("blob"))?;
            let count = i32::try_from(leaf.buffered).expect("at most BUFFERED_ROWS");
            multi(
                leaf.rel,
                leaf.buffer.as_mut_ptr(),
                count,
                self.cid,
                0,
                leaf.bulk,
            );
            for &slot in &leaf.buffer[..leaf.buffered] {
                index_entries(estate, leaf.info, slot);
            }
        }
        leaf.buffered = 0;
        leaf.buffered_bytes = 0;
        Ok(())
    }

    /// Flushes every buffer.
    pub fn flush_all(&mut self) -> Result<(), DirectError> {
        for index in 0..self.leaves.len() {
            self.flush(index)?;
        }
        Ok(())
    }

    /// What `ON CONFLICT DO NOTHING` checks at REPEATABLE READ and SERIALIZABLE: a
    /// conflicting row must be visible to the transaction's snapshot, or have been
    /// written by this transaction; otherwise 40001.
    ///
    /// # Safety
    /// `rel` is an open leaf of this writer, `conflict` a tid the probe returned.
    unsafe fn check_visible(
        &mut self,
        rel: pg_sys::Relation,
        conflict: &mut pg_sys::ItemPointerData,
    ) -> Result<(), DirectError> {
        // SAFETY: the caller upholds this function's # Safety contract.
        unsafe {
            if pg_sys::XactIsoLevel < pg_sys::XACT_REPEATABLE_READ as i32 {
                return Ok(());
            }
            let am = (*rel).rd_tableam;
            let fetch = (*am)
                .tuple_fetch_row_version
                .ok_or(DirectError::AccessMethod("a leaf"))?;
            let satisfies = (*am)
                .tuple_satisfies_snapshot
                .ok_or(DirectError::AccessMethod("a leaf"))?;
            // A slot made for one table serves another only if the descriptor is the
            // same: made on first need, made again for another table.
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
                // The executor raises an internal error here; the row was seen a moment
                // ago and cannot have been vacuumed away (we hold our snapshot).
                pgrx::error!("failed to fetch conflicting tuple for ON CONFLICT");
            }
            let visible = satisfies(rel, slot, (*self.estate).es_snapshot);
            let mut ours = false;
            if !visible {
                let mut isnull = false;
                let getsysattr = (*(*slot).tts_ops)
                    .getsysattr
                    .ok_or(DirectError::AccessMethod("a leaf"))?;
                let xmin = getsysattr(slot, pg_sys::MinTransactionIdAttributeNumber, &mut isnull);
                ours = pg_sys::TransactionIdIsCurrentTransactionId(pg_sys::TransactionId::from(
                    xmin.value() as u32,
                ));
            }
            clear_slot(slot);
            if visible || ours {
                Ok(())
            } else {
                Err(DirectError::Serialization)
            }
        }
    }

    /// Flushes what is buffered and closes everything the writer opened.
    pub fn finish(mut self) -> Result<(), DirectError> {
        self.release_token();
        let flushed = self.flush_all();
        self.close();
        flushed
    }

    /// Closes everything the writer opened, dropping whatever is still buffered.
    /// Once: a closed writer has no executor state.
    fn close(&mut self) {
        if self.estate.is_null() {
            return;
        }
        self.release_token();
        // SAFETY: each leaf was opened in open_leaf; its slots were made there or
        // in buffer_slot. The relation stays locked until the transaction ends.
        unsafe {
            for leaf in self.leaves.drain(..) {
                pg_sys::ExecDropSingleTupleTableSlot(leaf.slot);
                for slot in leaf.buffer {
                    pg_sys::ExecDropSingleTupleTableSlot(slot);
                }
                if !leaf.bulk.is_null() {
                    pg_sys::FreeBulkInsertState(leaf.bulk);
                }
                pg_sys::ExecCloseIndices(leaf.info);
                pg_sys::table_close(leaf.rel, pg_sys::NoLock as pg_sys::LOCKMODE);
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

impl Drop for Writer {
    fn drop(&mut self) {
        // An ERROR unwinding through here (pgrx turns it into a Rust panic) is
        // cleaned up by the transaction's abort; see the type's documentation.
        if !std::thread::panicking() {
            self.close();
        }
    }
}
