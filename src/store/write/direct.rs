//! The direct write path: envelope rows written into their band leaves through the
//! table access method and the executor's index routines, with no SPI, no plan and
//! no executor run ([`crate::pg::heap_writer`] does the writing; this module
//! decides which tables qualify and what each row holds).
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
use crate::pg::heap_writer::{DirtySnapshot, Field, Inserter, Table as Opened, WriteError};
use crate::pg::scan::Path;
use crate::store::feed::late;
use crate::store::partition::band::Table;
use crate::store::partition::cache::Route;
use pgrx::datum::TimestampWithTimeZone;
use pgrx::pg_sys;

impl From<WriteError> for DirectError {
    fn from(error: WriteError) -> DirectError {
        match error {
            WriteError::Serialization => DirectError::Serialization,
            WriteError::AccessMethod(what) => DirectError::AccessMethod(what),
        }
    }
}

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

/// The sequence ids of `node`, from `from` on, that a blob leaf held (committed
/// or being inserted) when it was scanned, ascending.
struct Taken {
    node: i32,
    from: i64,
    seqs: Vec<i64>,
}

/// The direct writer of one insert call: the inserter with the leaves it has
/// opened, and what the envelope rows need besides. [`Writer::finish`] writes
/// what is buffered; dropped without it (an error returned through `?`), the
/// inserter closes itself.
pub struct Writer {
    inserter: Inserter,
    doorbell: bool,
    /// `late_envelopes`, its id sequence and its layout, opened on the first
    /// late row.
    late: Option<(Opened, pg_sys::Oid, late::Layout)>,
    /// Per opened table (by its index), the keys of one originator a blob leaf
    /// held from some sequence id on, see [`Writer::blob_taken`].
    taken: Vec<Option<Taken>>,
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
        let Some(mut inserter) = Inserter::new(bulk) else {
            return Ok(None); // not seen from SQL calls; the SQL path copes with it
        };
        for pair in routes {
            for (table, route) in Table::ALL.into_iter().zip(pair) {
                if inserter.opened(route.leaf).is_some() {
                    continue;
                }
                let label = match table {
                    Table::Meta => "meta",
                    Table::Blob => "blob",
                };
                // What the catalog found when it loaded the band is checked again
                // where it is dereferenced (the kind and access method, cheap to
                // read), in case the band changed under a route taken before its
                // lock.
                let opened = inserter.open(route.leaf, label, |rel| {
                    heap_table(rel) && leaf_is_plain(rel, columns_of(table))
                });
                if opened.is_none() {
                    return Ok(None); // closed on drop
                }
            }
        }
        Ok(Some(Writer {
            inserter,
            doorbell,
            late: None,
            taken: Vec::new(),
        }))
    }

    /// Whether the doorbell trigger would have fired for these rows (it is enabled
    /// for this session's replication role).
    pub fn rings_doorbell(&self) -> bool {
        self.doorbell
    }

    fn leaf(&self, oid: pg_sys::Oid) -> Opened {
        self.inserter
            .opened(oid)
            .expect("leaf opened in Writer::open")
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
        // Locked as an INSERT would (ROW EXCLUSIVE, held to the end of the
        // transaction); opened below.
        crate::pg::locks::lock_for_insert(table);
        refuse_insert_rules(table)?;
        // The layout before the upgrade script to 0.4.0 ran is the first four
        // columns (one row per entry).
        let mut layout = late::Layout::Ranges;
        let opened = self.inserter.open(table, "late_envelopes", |rel| {
            if !heap_table(rel) {
                return false;
            }
            if leaf_is_plain(rel, &LATE_COLUMNS) {
                return true;
            }
            layout = late::Layout::Rows;
            leaf_is_plain(rel, &LATE_COLUMNS[..4])
        });
        match opened {
            Some(opened) => {
                self.late = Some((opened, sequence, layout));
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// The layout of the `late_envelopes` opened by [`Writer::open_late`].
    pub fn late_layout(&self) -> Option<late::Layout> {
        self.late.map(|(_, _, layout)| layout)
    }

    /// Records an entry of the late-envelope feed in `late_envelopes` (after
    /// [`Writer::open_late`]): its id drawn from the table's sequence (the
    /// marker naming the last drawn id is held, see
    /// crate::store::feed::markers), `recorded_at` = now(), and for
    /// [`late::Layout::Ranges`] the range's last id and the current transaction
    /// as `inserted_xid` (a [`late::Layout::Rows`] table takes entries of one row
    /// only).
    pub fn insert_late(&mut self, entry: late::Entry) -> Result<(), DirectError> {
        let (table, sequence, layout) = self.late.expect("open_late before insert_late");
        let id = crate::pg::catalog::sequence_next_value(sequence)
            .ok_or(DirectError::AccessMethod("late_envelopes_id_seq"))?;
        let fields = [
            Field::Int8(id),
            Field::Int4(entry.node),
            Field::Int8(entry.first),
            Field::Now,
            Field::Int8(entry.last),
            Field::TopXid,
        ];
        let columns = match layout {
            late::Layout::Ranges => 6,
            late::Layout::Rows => 4,
        };
        self.inserter.insert(table, &fields[..columns])?;
        Ok(())
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
        let table = self.leaf(leaf);
        let fields = [
            Field::Int4(row.node),
            Field::Int8(row.seq),
            row.time.map_or(Field::Now, Field::TimestampTz),
            Field::Bytes(row.topic),
            row.payer.map_or(Field::Null, Field::Int4),
            row.expiry.map_or(Field::Null, Field::Int8),
            Field::TopXid,
            Field::Bool(late),
        ];
        Ok(self.inserter.insert_unless_exists(table, &fields, fresh)?)
    }

    /// Whether blob leaf `table` may hold `(node, seq)`. The first question for
    /// an originator scans the leaf once from `seq` on with a dirty snapshot
    /// (which sees rows being inserted, as the probe does); later questions about
    /// higher ids of the same originator are answered from that scan. Only asked
    /// for keys whose meta row was fresh (see `late::Lateness`), so the scan
    /// usually finds nothing: a blob row above every meta row written through
    /// the functions comes from a write around them.
    fn blob_taken(&mut self, table: Opened, leaf: pg_sys::Oid, node: i32, seq: i64) -> bool {
        let slot = table.index();
        if self.taken.len() <= slot {
            self.taken.resize_with(slot + 1, || None);
        }
        let known = self.taken[slot]
            .as_ref()
            .is_some_and(|t| t.node == node && t.from <= seq);
        if !known {
            let mut dirty = DirtySnapshot::new();
            let range = crate::pg::scan::Range::Envelope {
                node,
                after: seq - 1,
                upto: i64::MAX,
            };
            // None cannot happen for a locked leaf with its primary key; probing
            // is then the safe answer.
            let Some(mut scan) = crate::pg::scan::Scan::open(leaf, dirty.as_ptr(), range, false)
            else {
                self.taken[slot] = None;
                return true;
            };
            let mut seqs = Vec::new();
            // Column 2 is the sequence id (checked by leaf_is_plain).
            while scan.next() {
                seqs.extend(scan.raw(2).map(|d| d.value() as i64));
            }
            drop(scan);
            self.taken[slot] = Some(Taken {
                node,
                from: seq,
                seqs,
            });
        }
        self.taken[slot]
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
        let table = self.leaf(leaf);
        let probe = !(buffered && fresh) || self.blob_taken(table, leaf, node, seq);
        let fields = [Field::Int4(node), Field::Int8(seq), Field::Bytes(envelope)];
        Ok(self
            .inserter
            .insert_probed(table, &fields, probe, buffered, envelope.len())?)
    }

    /// Writes what is buffered and closes everything the writer opened.
    pub fn finish(self) -> Result<(), DirectError> {
        Ok(self.inserter.finish()?)
    }
}
