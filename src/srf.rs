//! Set-returning functions that hand back their whole result in one call.
//!
//! pgrx's `TableIterator` returns a set one row per call (value-per-call mode):
//! the executor calls the function again for every row, through the function
//! manager (and, for a `SECURITY DEFINER` function, its user switch) and pgrx's
//! call guard each time. The read functions collect their rows in one pass
//! anyway, so they use materialize mode instead: one call fills a tuplestore
//! (`InitMaterializedSRF`), which the executor then reads. Their SQL
//! definitions are in `sql/reads.sql`; [`materialized_srf!`] declares the
//! C-callable symbols those definitions name.

use crate::partition::PartitionError;
use crate::read::{missing, At, Flow};
use crate::select::Row;
use crate::tuple::Former;
use pgrx::pg_sys::{self, Datum};
use pgrx::{IntoDatum, PgMemoryContexts};

/// The result set of the current call, as a tuplestore.
pub struct Materialized {
    rsinfo: *mut pg_sys::ReturnSetInfo,
    /// Rows stored so far.
    pub len: usize,
    /// Where an owned row's datums are built ([`Materialized::put_envelope`]);
    /// reset after the row is stored (the tuplestore keeps its own copy). Made
    /// at the first such row: rows stored from the scans need none.
    scratch: Option<PgMemoryContexts>,
    /// Forms the rows itself when the result type allows it (see [`Former`]);
    /// otherwise `tuplestore_putvalues` does.
    former: Option<Former>,
}

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
            Materialized {
                rsinfo,
                len: 0,
                scratch: None,
                former: Former::for_desc((*rsinfo).setDesc),
            }
        }
    }

    /// Appends the envelope row a walk stands on, straight from the scans' slots
    /// (no copy but the tuplestore's own).
    pub fn put_at(&mut self, at: &mut At<'_>) -> Result<(), PartitionError> {
        let cols = at.cols;
        let time = at.meta.value(cols.gateway_time).ok_or_else(missing)?;
        let topic = at.meta.flat_value(cols.topic).ok_or_else(missing)?;
        let payer = at.meta.value(cols.payer_id);
        let expiry = at.meta.value(cols.expiry);
        let envelope = at.envelope.ok_or_else(missing)?;
        let mut values = [
            Datum::from(at.node),
            Datum::from(at.seq),
            time,
            topic,
            payer.unwrap_or_else(Datum::null),
            expiry.unwrap_or_else(Datum::null),
            envelope,
        ];
        let mut nulls = [
            false,
            false,
            false,
            false,
            payer.is_none(),
            expiry.is_none(),
            false,
        ];
        // SAFETY: the datums are the columns' own (int4, int8, timestamptz, flat
        // bytea, int4, int8, flat bytea), valid while the walk stands on the row.
        unsafe { self.store(&mut values, &mut nulls) };
        self.len += 1;
        Ok(())
    }

    /// Appends the row a walk stands on and tells the walk to stop once the set
    /// holds `limit` rows.
    pub fn take(&mut self, at: &mut At<'_>, limit: usize) -> Result<Flow, PartitionError> {
        self.put_at(at)?;
        Ok(if self.len >= limit {
            Flow::Stop
        } else {
            Flow::Continue
        })
    }

    /// Appends an envelope row (the seven columns of the selectors).
    pub fn put_envelope(&mut self, row: Row) {
        let (node, seq, time, topic, payer, expiry, envelope) = row;
        // SAFETY: the datums are built in the scratch context, copied into the
        // tuplestore by store, and freed by the reset; nothing else points there.
        let mut scratch = self
            .scratch
            .take()
            .unwrap_or_else(|| PgMemoryContexts::new("pg_envelopes result row"));
        unsafe {
            scratch.switch_to(|_| {
                let mut values = [
                    Datum::from(node),
                    Datum::from(seq),
                    time.into_datum().unwrap_or_else(Datum::null),
                    topic.into_datum().unwrap_or_else(Datum::null),
                    payer.map(Datum::from).unwrap_or_else(Datum::null),
                    expiry.map(Datum::from).unwrap_or_else(Datum::null),
                    envelope.into_datum().unwrap_or_else(Datum::null),
                ];
                let mut nulls = [
                    false,
                    false,
                    false,
                    false,
                    payer.is_none(),
                    expiry.is_none(),
                    false,
                ];
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

/// Declares a C-callable set-returning function `$symbol` (with its
/// `pg_finfo_` record): `$body` gets the call's `fcinfo` and the result set to
/// fill, and returns `Result<(), E>` (an error is raised).
macro_rules! materialized_srf {
    ($symbol:ident, $finfo:ident, |$fcinfo:ident, $out:ident| $body:expr) => {
        #[unsafe(no_mangle)]
        #[doc(hidden)]
        pub extern "C" fn $finfo() -> &'static ::pgrx::pg_sys::Pg_finfo_record {
            const V1: ::pgrx::pg_sys::Pg_finfo_record =
                ::pgrx::pg_sys::Pg_finfo_record { api_version: 1 };
            &V1
        }

        #[unsafe(no_mangle)]
        #[doc(hidden)]
        pub unsafe extern "C-unwind" fn $symbol(
            $fcinfo: ::pgrx::pg_sys::FunctionCallInfo,
        ) -> ::pgrx::pg_sys::Datum {
            let body = move || {
                use $crate::error::OrRaise;
                // SAFETY: fcinfo is this call's, from the function manager.
                let mut result = unsafe { $crate::srf::Materialized::begin($fcinfo) };
                let $out = &mut result;
                $body.or_raise();
                ::pgrx::pg_sys::Datum::from(0)
            };
            // SAFETY: the guard turns a Rust panic (an ERROR raised by or_raise)
            // into a Postgres ERROR at this boundary, as #[pg_guard] does.
            unsafe { ::pgrx::pg_sys::submodules::panic::pgrx_extern_c_guard(body) }
        }
    };
}
pub(crate) use materialized_srf;

/// Argument `n` of the current call (`None` when NULL).
///
/// # Safety
/// `fcinfo` is the current call's and has at least `n + 1` arguments of a type
/// `T` reads.
pub unsafe fn arg<T: pgrx::FromDatum>(fcinfo: pg_sys::FunctionCallInfo, n: usize) -> Option<T> {
    // SAFETY: as the caller guarantees.
    unsafe { pgrx::fcinfo::pg_getarg::<T>(fcinfo, n) }
}
