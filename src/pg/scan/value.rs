//! A column of a scan's current row, borrowed from the scan so that it cannot
//! outlive the row, and the types whose conversion copies the value out.

use super::Scan;
use pgrx::pg_sys::{self, Datum};
use pgrx::FromDatum;

impl Scan {
    /// Column `attno` of the current row as a [`Value`] that borrows the scan
    /// (so it cannot outlive the row), `None` for NULL. A varlena column is
    /// detoasted first (see [`Scan::flat_value`]): a value is always flat.
    #[inline(always)]
    pub fn cell(&self, attno: i32) -> Option<Value<'_>> {
        // SAFETY: attno came from attno() and is within the slot's descriptor
        // (value() relies on the same); the attribute's type and length are
        // read from that descriptor.
        let (typ, len) = unsafe {
            let desc = (*self.slot).tts_tupleDescriptor;
            let attr = &crate::pg::compat::attributes(desc)[(attno - 1) as usize];
            (attr.atttypid, attr.attlen)
        };
        let datum = if len == -1 {
            self.flat_value(attno)?
        } else {
            self.value(attno)?
        };
        Some(Value {
            datum,
            typ,
            _row: std::marker::PhantomData,
        })
    }
}

/// A column of a scan's current row: its datum (flat, for a varlena type) and
/// type. It borrows the scan, which cannot move to another row meanwhile, so
/// the datum stays valid while the value exists.
#[derive(Clone, Copy)]
pub struct Value<'row> {
    datum: Datum,
    typ: pg_sys::Oid,
    _row: std::marker::PhantomData<&'row Scan>,
}

impl Value<'_> {
    /// The column's type.
    pub fn type_oid(&self) -> pg_sys::Oid {
        self.typ
    }

    /// The datum, for the glue that stores it while the row is current.
    pub(in crate::pg) fn datum(&self) -> Datum {
        self.datum
    }

    /// The bytes of a `bytea` value, copied; `None` for another type.
    pub fn bytes(&self) -> Option<Vec<u8>> {
        if self.typ != pg_sys::BYTEAOID {
            return None;
        }
        // SAFETY: a flat bytea datum of the current row (the borrow keeps the
        // row current); the conversion copies the bytes.
        unsafe { <Vec<u8> as FromDatum>::from_polymorphic_datum(self.datum, false, self.typ) }
    }
}

/// Rust types whose `FromDatum` conversion copies the value (so it outlives the
/// scratch context), as opposed to borrowed types like `&[u8]`.
pub trait CopiedOut {}
impl CopiedOut for i32 {}
impl CopiedOut for i64 {}
impl CopiedOut for bool {}
impl CopiedOut for Vec<u8> {}
impl CopiedOut for String {}
impl CopiedOut for pgrx::datum::TimestampWithTimeZone {}
impl CopiedOut for pgrx::datum::JsonB {}
