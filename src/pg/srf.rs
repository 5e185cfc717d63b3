//! Set-returning functions that hand back their whole result in one call.
//!
//! pgrx's `TableIterator` returns a set one row per call (value-per-call mode):
//! the executor calls the function again for every row, through the function
//! manager (and, for a `SECURITY DEFINER` function, its user switch) and pgrx's
//! call guard each time. The read functions collect their rows in one pass
//! anyway, so they use materialize mode instead: one call fills a tuplestore
//! (`InitMaterializedSRF`), which the executor then reads. [`materialized_srf!`]
//! declares such a function once: its SQL definition and the C-callable symbol
//! the definition names.

use crate::pg::tuple::Former;
use pgrx::pg_sys::{self, Datum};
use pgrx::PgMemoryContexts;
use std::cell::Cell;

/// Size of the block the result memory keeps between calls: a 1,000-row read
/// of 200-byte envelopes fits in it.
const KEPT_RESULT_BYTES: usize = 1024 * 1024;

thread_local! {
    /// A context that lives as long as the backend, holding the rows of one
    /// read at a time. A tuplestore filled in the query's own context takes
    /// its memory from malloc in doubling blocks and gives it back at the end
    /// of the query; glibc then returns the top of the heap to the kernel, and
    /// the next read pays a page fault for every page again (measured: 26
    /// faults and a tenth of the time of a 1,000-row read). The rows of a read
    /// are kept here instead; the context is reset (keeping its first block)
    /// when the query's context goes, whether the query ended or failed.
    static KEPT_RESULT: Cell<pg_sys::MemoryContext> = const { Cell::new(std::ptr::null_mut()) };
    /// Whether a query holds [`KEPT_RESULT`] now (a second read in the same
    /// query, a LATERAL call say, uses the query's context as before).
    static KEPT_IN_USE: Cell<bool> = const { Cell::new(false) };
}

/// Reset callback of the query context that holds [`KEPT_RESULT`]: the rows
/// are no longer referenced (the tuplestore, if still open, lived in the
/// query's context too) and the context is free again.
unsafe extern "C-unwind" fn release_kept_result(_arg: *mut std::ffi::c_void) {
    let context = KEPT_RESULT.get();
    if !context.is_null() {
        // SAFETY: a context of ours, alive for the backend's lifetime; reset
        // keeps its first block and frees the rest.
        unsafe { pg_sys::MemoryContextReset(context) };
    }
    KEPT_IN_USE.set(false);
}

/// Moves the (still empty) tuplestore of the call into [`KEPT_RESULT`] when no
/// other query holds it.
///
/// # Safety
/// `rsinfo` is the current call's, set up by `InitMaterializedSRF`, with no
/// row stored yet.
unsafe fn use_kept_result(rsinfo: *mut pg_sys::ReturnSetInfo) {
    if KEPT_IN_USE.get() {
        return;
    }
    // SAFETY: the caller's promise; the contexts and the tuplestore are
    // created and switched to as InitMaterializedSRF does, in the order that
    // leaves nothing dangling if an allocation fails (an ERROR then unwinds
    // with the old tuplestore still in place).
    unsafe {
        let query = (*(*rsinfo).econtext).ecxt_per_query_memory;
        let mut context = KEPT_RESULT.get();
        if context.is_null() {
            context = pg_sys::AllocSetContextCreateInternal(
                pg_sys::TopMemoryContext,
                c"pg_envelopes read result".as_ptr(),
                0,
                KEPT_RESULT_BYTES,
                8 * 1024 * 1024,
            );
            KEPT_RESULT.set(context);
        }
        let callback =
            pg_sys::MemoryContextAlloc(query, std::mem::size_of::<pg_sys::MemoryContextCallback>())
                as *mut pg_sys::MemoryContextCallback;
        callback.write(pg_sys::MemoryContextCallback {
            func: Some(release_kept_result),
            arg: std::ptr::null_mut(),
            next: std::ptr::null_mut(),
        });
        let random = (*rsinfo).allowedModes
            & pg_sys::SetFunctionReturnMode::SFRM_Materialize_Random as i32
            != 0;
        let old = pg_sys::MemoryContextSwitchTo(context);
        let store = pg_sys::tuplestore_begin_heap(random, false, pg_sys::work_mem);
        pg_sys::MemoryContextSwitchTo(old);
        pg_sys::MemoryContextRegisterResetCallback(query, callback);
        KEPT_IN_USE.set(true);
        pg_sys::tuplestore_end((*rsinfo).setResult);
        (*rsinfo).setResult = store;
    }
}

/// The result set of the current call, as a tuplestore.
pub struct Materialized {
    rsinfo: *mut pg_sys::ReturnSetInfo,
    /// Rows stored so far.
    pub len: usize,
    /// Where an owned row's datums are built ([`Materialized::put_built`]);
    /// reset after the row is stored (the tuplestore keeps its own copy). Made
    /// at the first such row: rows stored from the scans need none.
    scratch: Option<PgMemoryContexts>,
    /// Forms the rows itself when the result type allows it (see [`Former`]);
    /// otherwise `tuplestore_putvalues` does.
    former: Option<Former>,
    /// The result's column types (the first [`MAX_CHECKED`]), read once, and
    /// its number of columns: what [`Materialized::put_cells`] checks each row
    /// against.
    types: [pg_sys::Oid; MAX_CHECKED],
    natts: usize,
}

/// Result columns whose types `put_cells` checks (the widest result here has 7).
const MAX_CHECKED: usize = 8;

impl Materialized {
    /// Sets the call up to return a tuplestore of the function's result type.
    ///
    /// # Safety
    /// `fcinfo` is the current call's, from the function manager.
    pub unsafe fn begin(fcinfo: pg_sys::FunctionCallInfo) -> Materialized {
        // SAFETY: InitMaterializedSRF checks that the caller accepts a
        // materialized set (raising an ERROR otherwise), creates the tuplestore
        // and descriptor in the per-query context and records them in resultinfo.
        // A function scan hands the row type it expects in expectedDesc: used as
        // is, it spares building the descriptor from the catalog on every call
        // (a call in a target list may have none: then it is built).
        unsafe {
            let rsinfo: *mut pg_sys::ReturnSetInfo = (*fcinfo).resultinfo.cast();
            let flags = if !rsinfo.is_null()
                && pgrx::is_a(rsinfo.cast(), pg_sys::NodeTag::T_ReturnSetInfo)
                && !(*rsinfo).expectedDesc.is_null()
            {
                pg_sys::MAT_SRF_USE_EXPECTED_DESC
            } else {
                0
            };
            pg_sys::InitMaterializedSRF(fcinfo, flags as pg_sys::bits32);
            let rsinfo: *mut pg_sys::ReturnSetInfo = (*fcinfo).resultinfo.cast();
            use_kept_result(rsinfo);
            let desc = (*rsinfo).setDesc;
            let natts = (*desc).natts as usize;
            let mut types = [pg_sys::InvalidOid; MAX_CHECKED];
            for (i, typ) in types.iter_mut().enumerate().take(natts) {
                *typ = crate::pg::compat::attributes(desc)[i].atttypid;
            }
            Materialized {
                rsinfo,
                len: 0,
                scratch: None,
                former: Former::for_desc(desc),
                types,
                natts,
            }
        }
    }

    /// Appends a row whose datums `build` makes (allocating them as it likes):
    /// they are built in a scratch memory context, copied into the tuplestore
    /// and freed.
    ///
    /// # Safety
    /// `build` returns one datum per column of the result, of the declared
    /// types, flat (see [`Materialized::store`]).
    unsafe fn put_built<const N: usize>(
        &mut self,
        build: impl FnOnce() -> ([Datum; N], [bool; N]),
    ) {
        let mut scratch = self
            .scratch
            .take()
            .unwrap_or_else(|| PgMemoryContexts::new("pg_envelopes result row"));
        // SAFETY: the datums are built in the scratch context, copied into the
        // tuplestore by store (valid as the caller guarantees), and freed by the
        // reset; nothing else points there.
        unsafe {
            scratch.switch_to(|_| {
                let (mut values, mut nulls) = build();
                self.store(&mut values, &mut nulls);
            });
            scratch.reset();
        }
        self.scratch = Some(scratch);
        self.len += 1;
    }

    /// Appends an `(originator_node_id, max_sequence_id)` row.
    pub fn put_pair(&mut self, (node, seq): (i32, i64)) {
        // SAFETY: two pass-by-value columns, as declared.
        unsafe {
            self.store(
                &mut [Datum::from(node), Datum::from(seq)],
                &mut [false, false],
            )
        };
        self.len += 1;
    }
}

/// One column of a row for [`Materialized::put_cells`].
#[derive(Clone, Copy)]
pub enum Field<'a> {
    Null,
    Int4(i32),
    Int8(i64),
    TimestampTz(pgrx::datum::TimestampWithTimeZone),
    /// A `bytea` made from these bytes.
    Bytes(&'a [u8]),
    /// A column of a scan's current row, stored as it is.
    Scanned(crate::pg::scan::Value<'a>),
}

impl<'a> From<Option<crate::pg::scan::Value<'a>>> for Field<'a> {
    fn from(value: Option<crate::pg::scan::Value<'a>>) -> Field<'a> {
        value.map_or(Field::Null, Field::Scanned)
    }
}

impl Materialized {
    /// Appends a row of `N` cells, one per column of the result. A cell whose
    /// type is not its column's (or a row of another width) is an internal
    /// error (XX000): the code and the function's definition disagree.
    /// Scanned values are stored as they are (no copy but the tuplestore's
    /// own); bytes and times are made into datums in a scratch context first.
    #[inline(always)]
    pub fn put_cells<const N: usize>(&mut self, cells: [Field<'_>; N]) {
        let mut values = [Datum::from(0); N];
        let mut nulls = [false; N];
        let mut built = false;
        if self.natts != N || N > MAX_CHECKED {
            let natts = self.natts;
            self.mismatch(format!("a row of {N} columns for a result of {natts}"));
        }
        for (i, cell) in cells.iter().enumerate() {
            let column = self.types[i];
            let wanted = match cell {
                Field::Null => {
                    nulls[i] = true;
                    continue;
                }
                Field::Int4(v) => {
                    values[i] = Datum::from(*v);
                    pg_sys::INT4OID
                }
                Field::Int8(v) => {
                    values[i] = Datum::from(*v);
                    pg_sys::INT8OID
                }
                Field::Scanned(value) => {
                    values[i] = value.datum();
                    value.type_oid()
                }
                Field::TimestampTz(_) => {
                    built = true;
                    pg_sys::TIMESTAMPTZOID
                }
                Field::Bytes(_) => {
                    built = true;
                    pg_sys::BYTEAOID
                }
            };
            if wanted != column {
                self.mismatch(format!(
                    "column {} of type oid {} given a value of type oid {}",
                    i + 1,
                    column.to_u32(),
                    wanted.to_u32()
                ));
            }
        }
        if !built {
            // SAFETY: one datum per column, of its type (checked above); the
            // scanned ones are flat (scan::Value) and valid while their rows are
            // current, which their borrows guarantee for this call.
            unsafe { self.store(&mut values, &mut nulls) };
            self.len += 1;
            return;
        }
        // SAFETY: as above; the datums made here are flat varlenas (into_datum)
        // or pass-by-value, built in the scratch context put_built resets.
        unsafe {
            self.put_built(|| {
                use pgrx::IntoDatum;
                for (i, cell) in cells.iter().enumerate() {
                    match cell {
                        Field::TimestampTz(t) => values[i] = t.into_datum().unwrap_or(values[i]),
                        Field::Bytes(b) => values[i] = b.into_datum().unwrap_or(values[i]),
                        _ => {}
                    }
                }
                (values, nulls)
            })
        };
    }

    fn mismatch(&self, what: String) -> ! {
        pgrx::ereport!(
            ERROR,
            pgrx::PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
            format!("a result row does not match the function's result type: {what}")
        );
    }
}

impl Materialized {
    /// Appends one row to the call's tuplestore.
    ///
    /// # Safety
    /// `values` and `nulls` have one entry per column of the result descriptor,
    /// of the declared types; varlena values are flat (not TOASTed, not
    /// compressed, not expanded).
    unsafe fn store(&mut self, values: &mut [Datum], nulls: &mut [bool]) {
        let rsinfo = self.rsinfo;
        // SAFETY: as the caller guarantees; both paths copy the values into the
        // tuplestore's own memory.
        unsafe {
            debug_assert_eq!((*(*rsinfo).setDesc).natts as usize, values.len());
            match &mut self.former {
                Some(former) => former.put((*rsinfo).setResult, values, nulls),
                None => pg_sys::tuplestore_putvalues(
                    (*rsinfo).setResult,
                    (*rsinfo).setDesc,
                    values.as_mut_ptr(),
                    nulls.as_mut_ptr(),
                ),
            }
        }
    }
}

/// Declares a set-returning function in materialize mode: its SQL definition
/// (`sql`, a `CREATE FUNCTION ... LANGUAGE c AS 'MODULE_PATHNAME', '$symbol'`,
/// emitted into the extension's script under `name`) and the C-callable symbol
/// `$symbol` (with its `pg_finfo_` record): `$body` gets the call's `fcinfo` and
/// the result set to fill, and returns `Result<(), E>` (an error is raised).
macro_rules! materialized_srf {
    ($symbol:ident, $finfo:ident, name = $name:literal, sql = $sql:literal,
     |$args:ident, $out:ident| $body:expr) => {
        ::pgrx::extension_sql!($sql, name = $name);

        // The body, apart from the C-callable glue below, so that the lints of
        // the module that declares the function (no unsafe code) hold for it.
        #[doc(hidden)]
        mod $symbol {
            #[allow(unused_imports)]
            use super::*;

            pub(super) fn body(
                $args: &$crate::pg::srf::Args,
                $out: &mut $crate::pg::srf::Materialized,
            ) -> impl $crate::error::OrRaise<()> {
                $body
            }
        }

        #[allow(unsafe_code)]
        #[unsafe(no_mangle)]
        #[doc(hidden)]
        pub extern "C" fn $finfo() -> &'static ::pgrx::pg_sys::Pg_finfo_record {
            const V1: ::pgrx::pg_sys::Pg_finfo_record =
                ::pgrx::pg_sys::Pg_finfo_record { api_version: 1 };
            &V1
        }

        #[allow(unsafe_code)]
        #[unsafe(no_mangle)]
        #[doc(hidden)]
        pub unsafe extern "C-unwind" fn $symbol(
            fcinfo: ::pgrx::pg_sys::FunctionCallInfo,
        ) -> ::pgrx::pg_sys::Datum {
            let body = move || {
                use $crate::error::OrRaise;
                // SAFETY: fcinfo is this call's, from the function manager.
                let (args, mut result) = unsafe {
                    (
                        $crate::pg::srf::Args::new(fcinfo),
                        $crate::pg::srf::Materialized::begin(fcinfo),
                    )
                };
                $symbol::body(&args, &mut result).or_raise();
                ::pgrx::pg_sys::Datum::from(0)
            };
            // SAFETY: the guard turns a Rust panic (an ERROR raised by or_raise)
            // into a Postgres ERROR at this boundary, as #[pg_guard] does.
            unsafe { ::pgrx::pg_sys::submodules::panic::pgrx_extern_c_guard(body) }
        }
    };
}
pub(crate) use materialized_srf;

/// An element type of the array arguments [`Args::array`] reads, with the oid
/// of its array type (a constant, where pgrx looks it up in the syscache).
pub trait ArrayElement {
    const ARRAY_TYPE: pg_sys::Oid;
}

impl ArrayElement for i32 {
    const ARRAY_TYPE: pg_sys::Oid = pg_sys::INT4ARRAYOID;
}

impl ArrayElement for i64 {
    const ARRAY_TYPE: pg_sys::Oid = pg_sys::INT8ARRAYOID;
}

impl ArrayElement for &[u8] {
    const ARRAY_TYPE: pg_sys::Oid = pg_sys::BYTEAARRAYOID;
}

/// The arguments of the current call of a [`materialized_srf!`] function, read
/// by position. Each read checks the argument's declared type against the Rust
/// type asked for, so a definition and a body that disagree raise an internal
/// error (XX000) instead of reading a datum as something it is not.
pub struct Args {
    fcinfo: pg_sys::FunctionCallInfo,
}

impl Args {
    /// # Safety
    /// `fcinfo` is the current call's, valid while the returned value is used.
    pub unsafe fn new(fcinfo: pg_sys::FunctionCallInfo) -> Args {
        Args { fcinfo }
    }

    /// The type argument `n` is declared with, `InvalidOid` when there is no
    /// such argument.
    fn declared(&self, n: usize) -> pg_sys::Oid {
        // SAFETY: fcinfo is the current call's (Args::new); flinfo is set by the
        // function manager; get_fn_expr_argtype returns InvalidOid when the call
        // expression is unknown or has no argument n.
        unsafe {
            if n >= (*self.fcinfo).nargs as usize {
                return pg_sys::InvalidOid;
            }
            let flinfo = (*self.fcinfo).flinfo;
            let from_call = pg_sys::get_fn_expr_argtype(flinfo, n as i32);
            if from_call != pg_sys::InvalidOid {
                return from_call;
            }
            // No call expression (a direct call): the function's signature.
            let mut types: *mut pg_sys::Oid = std::ptr::null_mut();
            let mut count = 0;
            pg_sys::get_func_signature((*flinfo).fn_oid, &mut types, &mut count);
            if types.is_null() || n >= count as usize {
                return pg_sys::InvalidOid;
            }
            *types.add(n)
        }
    }

    fn check(&self, n: usize, wanted: pg_sys::Oid) {
        let declared = self.declared(n);
        if declared != wanted {
            pgrx::ereport!(
                ERROR,
                pgrx::PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
                format!(
                    "argument {} of this function is declared with type oid {}, but its \
                     code reads type oid {}",
                    n + 1,
                    declared.to_u32(),
                    wanted.to_u32()
                )
            );
        }
    }

    /// Argument `n` as a `T` (`None` when NULL).
    pub fn get<T: pgrx::FromDatum + pgrx::IntoDatum>(&self, n: usize) -> Option<T> {
        self.check(n, T::type_oid());
        // SAFETY: the call has argument n, declared with T's type (checked).
        unsafe { pgrx::fcinfo::pg_getarg::<T>(self.fcinfo, n) }
    }

    /// Argument `n` as an array of `T` (`None` when NULL).
    pub fn array<'a, T>(&'a self, n: usize) -> Option<pgrx::Array<'a, T>>
    where
        T: ArrayElement + pgrx::FromDatum + pgrx::datum::UnboxDatum,
    {
        self.check(n, T::ARRAY_TYPE);
        // SAFETY: the call has argument n, declared as an array of T's type
        // (checked); the array borrows from the call, which outlives `self`.
        unsafe { pgrx::fcinfo::pg_getarg::<pgrx::Array<'a, T>>(self.fcinfo, n) }
    }
}

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use crate::testing::sqlstate_of;
    use pgrx::prelude::*;

    /// A definition that disagrees with the code about an argument's type (here
    /// text[] where the code reads bytea[]) is refused with an internal error,
    /// never read as what it is not.
    #[pg_test]
    fn an_argument_declared_with_another_type_is_an_internal_error() {
        Spi::run(
            "CREATE FUNCTION pg_temp.newest(topics text[]) RETURNS TABLE (
                 originator_node_id integer, originator_sequence_id bigint,
                 gateway_time timestamptz, topic bytea, payer_id integer,
                 expiry bigint, originator_envelope bytea)
             LANGUAGE c AS '$libdir/pg_envelopes', 'select_newest_by_topic_wrapper'",
        )
        .unwrap();
        assert_eq!(
            sqlstate_of("SELECT * FROM pg_temp.newest(ARRAY['a'])").as_deref(),
            Some("XX000")
        );
        // The extension's own definition reads the same symbol as it should.
        assert_eq!(
            sqlstate_of("SELECT * FROM envelopes.select_newest_by_topic(ARRAY['\\x01'::bytea])"),
            None
        );
    }
}
