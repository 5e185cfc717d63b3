//! Heap tuples written and read by layout, for the column kinds the envelope
//! tables and the read functions' results have: integer-like values passed by
//! value, and varlenas (`bytea`).
//!
//! A read returns each row by deforming a meta and a blob tuple and forming a
//! result tuple. Postgres' generic routines (`slot_getsomeattrs`,
//! `heap_form_minimal_tuple`) handle every kind of type and re-read the
//! descriptor for every column of every row; behind pgrx's call guard, they
//! were half of the instructions of a 1,000-row read. Here the layout of each
//! column (width, alignment) is taken from the descriptor once, and a row is
//! read or written in one pass. The format is exactly the heap tuple format of
//! `heaptuple.c` (header, null bitmap, each value at its alignment, a varlena
//! with a 1-byte header never aligned, padding zeroed so that a reader can tell
//! a pad byte from a short header); whatever this module does not handle
//! (other types, tuples with fewer columns than their table) is left to
//! Postgres.

use pgrx::pg_sys::{self, Datum};

/// How a column is laid out in a tuple.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Passed by value, this many bytes (1, 2, 4 or 8), aligned to `align`.
    ByValue { len: usize, align: usize },
    /// A varlena; one with a 4-byte header is aligned to `align`.
    Varlena { align: usize },
}

/// `offsetof(HeapTupleHeaderData, t_bits)`: where the null bitmap starts.
const BITS_OFFSET: usize = std::mem::offset_of!(pg_sys::HeapTupleHeaderData, t_bits);

/// `HEAP_NATTS_MASK`: the column count in `t_infomask2`.
const NATTS_MASK: u16 = 0x07FF;

fn align_to(offset: usize, align: usize) -> usize {
    (offset + align - 1) & !(align - 1)
}

/// The alignment an `attalign` character stands for.
fn alignment(attalign: std::ffi::c_char) -> Option<usize> {
    match attalign as u8 {
        b'c' => Some(1),
        b's' => Some(2),
        b'i' => Some(4),
        b'd' => Some(8),
        _ => None,
    }
}

/// The layout of every column of `desc`, if each is an integer-like value
/// passed by value or a varlena, and none is dropped.
///
/// # Safety
/// `desc` is a valid tuple descriptor or NULL.
pub unsafe fn layouts(desc: pg_sys::TupleDesc) -> Option<Vec<Layout>> {
    if desc.is_null() {
        return None;
    }
    // SAFETY: desc is valid (the caller's promise); attrs has natts entries.
    let attrs = unsafe { crate::pg::compat::attributes(desc) };
    attrs
        .iter()
        .map(|att| {
            let align = alignment(att.attalign)?;
            match (att.attisdropped, att.attlen, att.attbyval) {
                (false, 1 | 2 | 4 | 8, true) => Some(Layout::ByValue {
                    len: att.attlen as usize,
                    align,
                }),
                (false, -1, false) => Some(Layout::Varlena { align }),
                _ => None,
            }
        })
        .collect()
}

/// The stored size of the varlena `ptr` points at (header included), and
/// whether its header is a 1-byte one (short, or an external pointer), which is
/// never aligned. postgres.h's `VARSIZE_ANY`.
///
/// # Safety
/// `ptr` points at a varlena as stored in a tuple.
unsafe fn varlena_size(ptr: *const u8) -> (usize, bool) {
    // SAFETY: as the caller guarantees. A 1-byte header is either a short value
    // (its size in the header) or, when it is exactly 1, an external pointer
    // whose second byte is its tag (varatt.h: an on-disk pointer is 16 bytes,
    // an indirect or expanded one 8, after the 2 header bytes).
    unsafe {
        let first = *ptr;
        #[cfg(target_endian = "little")]
        let (one_byte, external, short_size) = (first & 0x01 == 0x01, first == 0x01, first >> 1);
        #[cfg(target_endian = "big")]
        let (one_byte, external, short_size) = (first & 0x80 == 0x80, first == 0x80, first & 0x7F);
        if external {
            let tag = *ptr.add(1) as u32;
            let body = if tag == pg_sys::vartag_external::VARTAG_ONDISK {
                std::mem::size_of::<pg_sys::varatt_external>()
            } else {
                std::mem::size_of::<pg_sys::varatt_indirect>()
            };
            (2 + body, true)
        } else if one_byte {
            (short_size as usize, true)
        } else {
            let header = u32::from_ne_bytes(*ptr.cast::<[u8; 4]>());
            #[cfg(target_endian = "little")]
            let size = (header >> 2) as usize;
            #[cfg(target_endian = "big")]
            let size = (header & 0x3FFF_FFFF) as usize;
            (size, false)
        }
    }
}

/// Reads every column of `tuple` into `values`/`isnull` (as `heap_deform_tuple`
/// does), if the tuple has as many columns as `layouts`. Returns false and
/// leaves the arrays alone otherwise: a tuple written before a column was added
/// takes that column's default from the catalog, which Postgres knows how to do.
///
/// # Safety
/// `tuple` is a valid heap tuple of a table whose columns are `layouts`, kept
/// in memory (its buffer pinned) while the values are used; `values` and
/// `isnull` have room for `layouts.len()` entries.
pub unsafe fn deform(
    tuple: pg_sys::HeapTuple,
    layouts: &[Layout],
    values: *mut Datum,
    isnull: *mut bool,
) -> bool {
    // SAFETY: as the caller guarantees; every read stays inside the tuple, whose
    // header says where its data and bitmap are, and each value's offset and
    // size follow the rules heap_fill_tuple wrote them by.
    unsafe {
        let header = (*tuple).t_data;
        if (((*header).t_infomask2 & NATTS_MASK) as usize) < layouts.len() {
            return false;
        }
        let has_nulls = (*header).t_infomask & pg_sys::HEAP_HASNULL as u16 != 0;
        let bits = (*header).t_bits.as_ptr();
        let data = header.cast::<u8>().add((*header).t_hoff as usize);
        let mut off = 0usize;
        for (i, layout) in layouts.iter().enumerate() {
            if has_nulls && *bits.add(i >> 3) & (1 << (i & 7)) == 0 {
                *values.add(i) = Datum::from(0);
                *isnull.add(i) = true;
                continue;
            }
            *isnull.add(i) = false;
            match *layout {
                Layout::ByValue { len, align } => {
                    off = align_to(off, align);
                    let at = data.add(off);
                    // fetch_att: the C type's value, widened as C widens it
                    // (signed types sign-extended).
                    *values.add(i) = Datum::from(match len {
                        1 => *at.cast::<i8>() as i64,
                        2 => at.cast::<i16>().read_unaligned() as i64,
                        4 => at.cast::<i32>().read_unaligned() as i64,
                        _ => at.cast::<i64>().read_unaligned(),
                    });
                    off += len;
                }
                Layout::Varlena { align } => {
                    // att_align_pointer: a non-zero byte here is a 1-byte
                    // header, stored unaligned; a zero byte is padding.
                    if *data.add(off) == 0 {
                        off = align_to(off, align);
                    }
                    let at = data.add(off);
                    *values.add(i) = Datum::from(at);
                    off += varlena_size(at).0;
                }
            }
        }
        true
    }
}

/// Forms rows as tuples in a buffer it keeps and hands them to a tuplestore,
/// which copies them (`tuplestore_puttuple`): `tuplestore_putvalues` without
/// `heap_form_minimal_tuple`'s two generic passes. Varlena values are copied
/// with the header they have (1-byte or 4-byte), which `heap_fill_tuple` would
/// sometimes shorten: both are valid.
pub struct Former {
    layouts: Vec<Layout>,
    /// Which columns are varlenas (their sizes vary by row).
    varlenas: Vec<usize>,
    /// Bytes every row's values take at most besides the varlenas' own sizes
    /// (each value's width and alignment).
    fixed_bound: usize,
    /// The tuple being built; `u64` so that it is 8-byte aligned, as the
    /// alignment of the values within is computed from its start.
    buf: Vec<u64>,
}

/// Zeroes `len` bytes (a few: padding) at `at`.
///
/// # Safety
/// `at..at + len` is writable.
#[inline(always)]
unsafe fn zero(at: *mut u8, len: usize) {
    for i in 0..len {
        // SAFETY: as the caller guarantees.
        unsafe { *at.add(i) = 0 };
    }
}

impl Former {
    /// A former for rows of `desc`, if [`layouts`] handles its columns.
    ///
    /// # Safety
    /// `desc` is a valid tuple descriptor or NULL.
    pub unsafe fn for_desc(desc: pg_sys::TupleDesc) -> Option<Former> {
        // SAFETY: as the caller guarantees.
        let layouts = unsafe { layouts(desc) }?;
        let varlenas = (0..layouts.len())
            .filter(|&i| matches!(layouts[i], Layout::Varlena { .. }))
            .collect();
        let fixed_bound = layouts
            .iter()
            .map(|layout| match *layout {
                Layout::ByValue { len, align } => len + align,
                Layout::Varlena { align } => align,
            })
            .sum();
        Some(Former {
            layouts,
            varlenas,
            fixed_bound,
            buf: Vec::new(),
        })
    }

    /// Forms the row and appends it to `store`.
    ///
    /// # Safety
    /// `store` is a valid tuplestore; `values`/`nulls` have one entry per
    /// column, varlena values flat (not TOASTed, compressed or expanded).
    pub unsafe fn put(
        &mut self,
        store: *mut pg_sys::Tuplestorestate,
        values: &[Datum],
        nulls: &[bool],
    ) {
        let natts = self.layouts.len();
        assert!(values.len() == natts && nulls.len() == natts);
        let has_null = nulls.contains(&true);
        let bitmap = if has_null { natts.div_ceil(8) } else { 0 };
        let hoff = align_to(BITS_OFFSET + bitmap, 8);
        // A bound of the size: the buffer only has to hold the tuple.
        let mut bound = hoff + self.fixed_bound;
        for &i in &self.varlenas {
            if !nulls[i] {
                // SAFETY: a flat varlena, as the caller guarantees.
                bound += unsafe { varlena_size(values[i].cast_mut_ptr::<u8>()) }.0;
            }
        }
        self.buf.clear();
        self.buf.reserve(bound.div_ceil(8));
        let base = self.buf.as_mut_ptr().cast::<u8>();
        // SAFETY: base points at room for `bound` bytes, 8-byte aligned; every
        // write below stays inside them (each value takes at most its size plus
        // its alignment). The header and bitmap are zeroed first, and so is
        // every padding byte, as heap_fill_tuple's palloc0 leaves them. The
        // header fields are those of HeapTupleHeaderData (bindgen's layout).
        unsafe {
            for word in 0..hoff / 8 {
                base.cast::<u64>().add(word).write(0);
            }
            let header = base.cast::<pg_sys::HeapTupleHeaderData>();
            let bits = base.add(BITS_OFFSET);
            let data = base.add(hoff);
            let mut off = 0usize;
            let mut any_varlena = false;
            for i in 0..natts {
                if *nulls.get_unchecked(i) {
                    continue;
                }
                if has_null {
                    *bits.add(i / 8) |= 1 << (i % 8);
                }
                let value = *values.get_unchecked(i);
                match *self.layouts.get_unchecked(i) {
                    Layout::ByValue { len, align } => {
                        let aligned = align_to(off, align);
                        zero(data.add(off), aligned - off);
                        let at = data.add(aligned);
                        let v = value.value();
                        match len {
                            1 => *at = v as u8,
                            2 => at.cast::<u16>().write_unaligned(v as u16),
                            4 => at.cast::<u32>().write_unaligned(v as u32),
                            _ => at.cast::<u64>().write_unaligned(v as u64),
                        }
                        off = aligned + len;
                    }
                    Layout::Varlena { align } => {
                        any_varlena = true;
                        let src = value.cast_mut_ptr::<u8>();
                        let (len, short) = varlena_size(src);
                        if !short {
                            let aligned = align_to(off, align);
                            zero(data.add(off), aligned - off);
                            off = aligned;
                        }
                        std::ptr::copy_nonoverlapping(src, data.add(off), len);
                        off += len;
                    }
                }
            }
            (*header).t_infomask2 = natts as u16;
            let mut infomask = 0u16;
            if has_null {
                infomask |= pg_sys::HEAP_HASNULL as u16;
            }
            if any_varlena {
                infomask |= pg_sys::HEAP_HASVARWIDTH as u16;
            }
            (*header).t_infomask = infomask;
            (*header).t_hoff = hoff as u8;
            let mut tuple = pg_sys::HeapTupleData {
                t_len: (hoff + off) as u32,
                t_data: header,
                ..Default::default()
            };
            pg_sys::tuplestore_puttuple(store, &mut tuple);
        }
    }
}

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use super::{deform, layouts, Former};
    use pgrx::pg_sys::{self, Datum};
    use pgrx::prelude::*;
    use pgrx::IntoDatum;

    /// Column types of the test descriptor: the envelope row's, with a bool and
    /// an int2 (1- and 2-byte values) between the others.
    const TYPES: [pg_sys::Oid; 9] = [
        pg_sys::INT4OID,
        pg_sys::INT8OID,
        pg_sys::TIMESTAMPTZOID,
        pg_sys::BYTEAOID,
        pg_sys::INT4OID,
        pg_sys::BOOLOID,
        pg_sys::INT8OID,
        pg_sys::INT2OID,
        pg_sys::BYTEAOID,
    ];
    const BYTEA_COLUMNS: [usize; 2] = [3, 8];

    /// A descriptor of `types`.
    unsafe fn descriptor(types: &[pg_sys::Oid]) -> pg_sys::TupleDesc {
        // SAFETY: a descriptor made in the current memory context.
        unsafe {
            let desc = pg_sys::CreateTemplateTupleDesc(types.len() as i32);
            for (i, oid) in types.iter().enumerate() {
                pg_sys::TupleDescInitEntry(desc, (i + 1) as i16, c"c".as_ptr(), *oid, -1, 0);
            }
            desc
        }
    }

    fn bytes_of(datum: Datum) -> Vec<u8> {
        // SAFETY: a bytea datum (flat, short or TOASTed), detoasted by the call.
        unsafe { <Vec<u8> as FromDatum>::from_polymorphic_datum(datum, false, pg_sys::BYTEAOID) }
            .unwrap()
    }

    /// Test rows of TYPES: every size class of bytea (empty, short, the 126/127
    /// border of 1-byte headers, long), edge values of the integers, and four
    /// null patterns. Bytea values are 4-byte-header datums.
    fn rows() -> Vec<([Datum; 9], [bool; 9])> {
        let sizes = [0usize, 1, 3, 126, 127, 200, 5000];
        let mut out = Vec::new();
        let mut row = 0i64;
        for (k, &a) in sizes.iter().enumerate() {
            for mask in [0u32, 0b1_0101_0101, 0b0_1010_1010, 0b1_0001_0000] {
                let b = sizes[(k + 3) % sizes.len()];
                let bytes_a: Vec<u8> = (0..a).map(|i| (i * 7 + 1) as u8).collect();
                let bytes_b: Vec<u8> = (0..b).map(|i| (i * 3 + 2) as u8).collect();
                let values = [
                    Datum::from(i32::MIN + row as i32),
                    Datum::from(i64::MAX - row),
                    Datum::from(-row * 1_000_003),
                    bytes_a.into_datum().unwrap(),
                    Datum::from(-1i32),
                    Datum::from(row % 2 == 0),
                    Datum::from(i64::MIN),
                    Datum::from(-7i16),
                    bytes_b.into_datum().unwrap(),
                ];
                let mut nulls = [false; 9];
                for (i, n) in nulls.iter_mut().enumerate() {
                    *n = mask & (1 << i) != 0;
                }
                out.push((values, nulls));
                row += 1;
            }
        }
        out
    }

    /// Our deform of `tuple` equals heap_deform_tuple's, value for value (the
    /// same bits for values passed by value, the same address for varlenas).
    unsafe fn assert_deforms_alike(tuple: pg_sys::HeapTuple, desc: pg_sys::TupleDesc) {
        // SAFETY: tuple is a tuple of desc, valid for this call.
        unsafe {
            let natts = (*desc).natts as usize;
            let (mut ours, mut our_nulls) = (vec![Datum::from(0); natts], vec![false; natts]);
            let (mut theirs, mut their_nulls) = (vec![Datum::from(0); natts], vec![false; natts]);
            let layouts = layouts(desc).unwrap();
            assert!(deform(
                tuple,
                &layouts,
                ours.as_mut_ptr(),
                our_nulls.as_mut_ptr()
            ));
            pg_sys::heap_deform_tuple(tuple, desc, theirs.as_mut_ptr(), their_nulls.as_mut_ptr());
            assert_eq!(our_nulls, their_nulls);
            for i in 0..natts {
                if !their_nulls[i] {
                    assert_eq!(ours[i].value(), theirs[i].value(), "column {i}");
                }
            }
        }
    }

    /// Rows formed by [`Former`] read back through a tuplestore as written:
    /// 1-byte and 4-byte varlena headers at every alignment, integers at their
    /// edges, several null patterns.
    #[pg_test]
    fn formed_rows_read_back_as_written() {
        // SAFETY: a descriptor, a tuplestore and a slot made here; the datums are
        // of TYPES, bytea ones flat (4-byte headers from into_datum; 1-byte ones
        // deformed out of a heap tuple, which stays in memory).
        unsafe {
            let desc = descriptor(&TYPES);
            let mut former = Former::for_desc(desc).expect("every type is handled");
            let store = pg_sys::tuplestore_begin_heap(false, false, 1024);
            let slot = pg_sys::MakeSingleTupleTableSlot(desc, &pg_sys::TTSOpsMinimalTuple);
            let mut expected = Vec::new();
            for (values, nulls) in rows() {
                // As given (4-byte headers), then as heap_fill_tuple shortens them.
                former.put(store, &values, &nulls);
                let (mut short, mut short_nulls) = (values, nulls);
                let tuple =
                    pg_sys::heap_form_tuple(desc, short.as_mut_ptr(), short_nulls.as_mut_ptr());
                pg_sys::heap_deform_tuple(
                    tuple,
                    desc,
                    short.as_mut_ptr(),
                    short_nulls.as_mut_ptr(),
                );
                former.put(store, &short, &short_nulls);
                expected.push((values, nulls));
                expected.push((values, nulls));
            }
            for (values, nulls) in expected {
                assert!(pg_sys::tuplestore_gettupleslot(store, true, false, slot));
                pg_sys::slot_getallattrs(slot);
                for i in 0..TYPES.len() {
                    let isnull = *(*slot).tts_isnull.add(i);
                    assert_eq!(isnull, nulls[i], "column {i}");
                    if isnull {
                        continue;
                    }
                    let got = *(*slot).tts_values.add(i);
                    if BYTEA_COLUMNS.contains(&i) {
                        assert_eq!(bytes_of(got), bytes_of(values[i]), "column {i}");
                    } else {
                        assert_eq!(got.value(), values[i].value(), "column {i}");
                    }
                }
                // The formed tuple deforms alike through this module too.
                let tuple = pg_sys::ExecFetchSlotHeapTuple(slot, false, std::ptr::null_mut());
                assert_deforms_alike(tuple, desc);
            }
            assert!(!pg_sys::tuplestore_gettupleslot(store, true, false, slot));
            pg_sys::ExecDropSingleTupleTableSlot(slot);
            pg_sys::tuplestore_end(store);
        }
    }

    /// Tuples formed by Postgres deform alike here and in heap_deform_tuple,
    /// and one with fewer columns than its descriptor is left to Postgres.
    #[pg_test]
    fn postgres_tuples_deform_alike() {
        // SAFETY: tuples formed here from datums of TYPES.
        unsafe {
            let desc = descriptor(&TYPES);
            for (mut values, mut nulls) in rows() {
                let tuple = pg_sys::heap_form_tuple(desc, values.as_mut_ptr(), nulls.as_mut_ptr());
                assert_deforms_alike(tuple, desc);
            }
            let fewer = descriptor(&TYPES[..5]);
            let (mut values, mut nulls) = rows()[0];
            let tuple = pg_sys::heap_form_tuple(fewer, values.as_mut_ptr(), nulls.as_mut_ptr());
            let (mut out, mut out_nulls) = ([Datum::from(0); 9], [false; 9]);
            let all = layouts(desc).unwrap();
            assert!(!deform(
                tuple,
                &all,
                out.as_mut_ptr(),
                out_nulls.as_mut_ptr()
            ));
        }
    }

    /// Stored rows with TOASTed values (an external pointer, a compressed value
    /// kept inline) and NULLs deform alike, read straight from a table.
    #[pg_test]
    fn stored_tuples_with_toasted_values_deform_alike() {
        Spi::run(
            "CREATE TABLE tuple_test (a int4, b int8, t bytea, c int4, big bytea);
             INSERT INTO tuple_test VALUES
               (1, 2, '\\x01', NULL, decode(repeat('ab', 100), 'hex')),
               (3, NULL, decode(repeat('cd', 3000), 'hex'), 4, NULL),
               (5, 6, NULL, 7, (SELECT decode(string_agg(md5(g::text), ''), 'hex') FROM generate_series(1, 20000) g)),
               (NULL, NULL, NULL, NULL, NULL)",
        )
        .unwrap();
        let oid = Spi::get_one::<pg_sys::Oid>("SELECT 'tuple_test'::regclass::oid")
            .unwrap()
            .unwrap();
        // SAFETY: the table made above, scanned with a registered snapshot;
        // each tuple stays pinned until the next heap_getnext.
        let table = crate::pg::rel::Rel::open(oid, pg_sys::AccessShareLock as i32);
        unsafe {
            let rel = table.as_ptr();
            let desc = (*rel).rd_att;
            // A snapshot taken now: the function's own predates the rows.
            let snapshot = pg_sys::RegisterSnapshot(pg_sys::GetLatestSnapshot());
            let scan = pg_sys::table_beginscan(rel, snapshot, 0, std::ptr::null_mut());
            let mut seen = 0;
            loop {
                let tuple = pg_sys::heap_getnext(scan, pg_sys::ScanDirection::ForwardScanDirection);
                if tuple.is_null() {
                    break;
                }
                assert_deforms_alike(tuple, desc);
                seen += 1;
            }
            assert_eq!(seen, 4);
            pg_sys::table_endscan(scan);
            pg_sys::UnregisterSnapshot(snapshot);
        }
        // The values read back whole; the large one was stored out of line.
        assert_eq!(
            Spi::get_one::<bool>(
                "SELECT pg_catalog.pg_relation_size(reltoastrelid) > 0
                   FROM pg_catalog.pg_class WHERE oid = 'tuple_test'::regclass"
            )
            .unwrap(),
            Some(true)
        );
        assert_eq!(
            Spi::get_one::<i64>("SELECT sum(length(t)) + sum(length(big)) FROM tuple_test")
                .unwrap(),
            Some(1 + 3000 + 100 + 20000 * 16)
        );
    }
}
