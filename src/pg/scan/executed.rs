//! The executor path of a scan: a table read by queries, a chunk of rows at a
//! time, with the snapshot the scan was opened with.

use super::*;

/// A table read by queries, one chunk of rows at a time, each chunk starting
/// after the key of the last row returned (no SPI cursor stays open between
/// calls, so scans open and close in any order).
pub(super) struct Executed {
    /// `schema.table`, quoted.
    pub(super) name: String,
    /// The table's owner, whose rights the queries run with (the index path
    /// checks no privilege either).
    pub(super) owner: Oid,
    pub(super) snapshot: pg_sys::Snapshot,
    pub(super) range: Range,
    pub(super) backward: bool,
    /// The key of the last row returned.
    pub(super) last: Option<i64>,
    /// The last chunk was not full: nothing more to fetch.
    pub(super) exhausted: bool,
    /// The current chunk's rows (in `chunk`), and the next one to return.
    pub(super) rows: Vec<pg_sys::HeapTuple>,
    pub(super) at: usize,
    /// Rows asked for by the next chunk; grows from a few (a probe reads one).
    pub(super) chunk_rows: i64,
    /// The result's descriptor (in `memory`), known from the first chunk, and
    /// the attribute number of the key column in it.
    pub(super) desc: pg_sys::TupleDesc,
    pub(super) key_attno: i32,
    /// Lives as long as the scan: the descriptor and the slot.
    pub(super) memory: PgMemoryContexts,
    /// Holds one chunk; reset before the next.
    pub(super) chunk: PgMemoryContexts,
}

impl Executed {
    pub(super) const FIRST_CHUNK: i64 = 8;
    pub(super) const MAX_CHUNK: i64 = 1024;

    pub(super) fn restart(&mut self, range: Range) {
        self.range = range;
        self.last = None;
        self.exhausted = false;
        self.rows.clear();
        self.at = 0;
        self.chunk_rows = Executed::FIRST_CHUNK;
    }

    /// The query of the next chunk and its parameters, or `None` when the key
    /// space past the last row is empty.
    pub(super) fn next_query(&self) -> Option<(String, Vec<Param>)> {
        let (column, mut after, mut upto) = self.range.key();
        match (self.last, self.backward) {
            (Some(last), true) => upto = upto.min(last.checked_sub(1)?),
            (Some(last), false) => after = after.max(last),
            (None, _) => {}
        }
        if upto <= after {
            return None;
        }
        let mut conditions = Vec::new();
        let mut params = Vec::new();
        let mut bind = |condition: String, typ: Oid, value: Datum| {
            params.push(Param { typ, value });
            conditions.push(format!("{condition} ${}", params.len()));
        };
        match self.range {
            Range::Envelope { node, .. } | Range::Key { node, .. } => bind(
                "originator_node_id OPERATOR(pg_catalog.=)".into(),
                pg_sys::INT4OID,
                Datum::from(node),
            ),
            Range::Topic { topic, .. } => bind(
                "topic OPERATOR(pg_catalog.=)".into(),
                pg_sys::BYTEAOID,
                topic,
            ),
            Range::Id { .. } => {}
        }
        if after != i64::MIN {
            bind(
                format!("{column} OPERATOR(pg_catalog.>)"),
                pg_sys::INT8OID,
                Datum::from(after),
            );
        }
        if upto != i64::MAX {
            bind(
                format!("{column} OPERATOR(pg_catalog.<=)"),
                pg_sys::INT8OID,
                Datum::from(upto),
            );
        }
        let filter = if conditions.is_empty() {
            "true".to_owned()
        } else {
            conditions.join(" AND ")
        };
        params.push(Param {
            typ: pg_sys::INT8OID,
            value: Datum::from(self.chunk_rows),
        });
        let order = if self.backward { " DESC" } else { "" };
        let sql = format!(
            "SELECT * FROM {} WHERE {filter} ORDER BY {column}{order} LIMIT ${}",
            self.name,
            params.len()
        );
        Some((sql, params))
    }

    /// Fetches the next chunk into `rows` (empty when there is none).
    pub(super) fn fetch(&mut self) {
        self.rows.clear();
        self.at = 0;
        let Some((sql, params)) = self.next_query() else {
            self.exhausted = true;
            return;
        };
        // SAFETY: the previous chunk's rows are no longer referenced: the
        // caller cleared the slot that held the last of them.
        unsafe { self.chunk.reset() };
        let chunk = self.chunk.value();
        let memory = self.memory.value();
        let mut desc = self.desc;
        let mut rows = Vec::new();
        executor::select_or_raise(
            &sql,
            &params,
            self.snapshot,
            Some(self.owner),
            "a table read through the executor",
            |row| {
                let (tuple, result) = row.raw();
                // SAFETY: the row and the descriptor are SPI's, valid during this
                // callback; the copies live in the scan's contexts.
                unsafe {
                    if desc.is_null() {
                        let old = pg_sys::MemoryContextSwitchTo(memory);
                        desc = pg_sys::CreateTupleDescCopy(result);
                        pg_sys::MemoryContextSwitchTo(old);
                    }
                    let old = pg_sys::MemoryContextSwitchTo(chunk);
                    rows.push(pg_sys::heap_copytuple(tuple));
                    pg_sys::MemoryContextSwitchTo(old);
                }
            },
        );
        if self.desc.is_null() && !desc.is_null() {
            self.desc = desc;
            // SAFETY: desc is the copy made above, with natts attributes.
            self.key_attno = unsafe { desc_column(desc, self.range.key().0) }.unwrap_or(0);
        }
        self.exhausted = (rows.len() as i64) < self.chunk_rows;
        self.chunk_rows = (self.chunk_rows * 8).min(Executed::MAX_CHUNK);
        self.rows = rows;
    }
}
