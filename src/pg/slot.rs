//! Tuple slots and the executor state the direct write path fills them in:
//! emptying a slot, the per-tuple memory, a row's index entries, `bytea`
//! datums.

use pgrx::pg_sys;
use std::ptr;

/// The per-tuple memory context of an executor state, made on first use.
///
/// # Safety
/// `estate` is a live executor state.
pub unsafe fn per_tuple_memory(estate: *mut pg_sys::EState) -> pg_sys::MemoryContext {
    // SAFETY: the caller upholds this function's # Safety contract.
    unsafe { (*pg_sys::MakePerTupleExprContext(estate)).ecxt_per_tuple_memory }
}

/// The index entries of the row in `slot` (no speculation: a duplicate key is an
/// error), then the slot emptied and the per-tuple memory reset.
///
/// # Safety
/// `slot` holds a tuple just inserted into `info`'s relation.
pub unsafe fn index_entries(
    estate: *mut pg_sys::EState,
    info: *mut pg_sys::ResultRelInfo,
    slot: *mut pg_sys::TupleTableSlot,
) {
    // SAFETY: the caller upholds this function's # Safety contract.
    unsafe {
        let recheck = crate::pg::compat::insert_index_tuples(
            info,
            slot,
            estate,
            false,
            ptr::null_mut(),
            ptr::null_mut(),
        );
        pg_sys::list_free(recheck);
        clear_slot(slot);
        pg_sys::MemoryContextReset(per_tuple_memory(estate));
    }
}

/// A bytea datum holding `bytes`, allocated in the current memory context.
///
/// # Safety
/// The caller frees it or lets its context go.
pub unsafe fn bytea_datum(bytes: &[u8]) -> pg_sys::Datum {
    // SAFETY: the caller upholds this function's # Safety contract.
    unsafe {
        let len = bytes.len() + pg_sys::VARHDRSZ;
        let varlena = pg_sys::palloc(len).cast::<u8>();
        // Four-byte header: length in the upper 30 bits, little-endian layout as
        // SET_VARSIZE writes it.
        pgrx::set_varsize_4b(varlena.cast(), i32::try_from(len).expect("checked size"));
        ptr::copy_nonoverlapping(bytes.as_ptr(), varlena.add(pg_sys::VARHDRSZ), bytes.len());
        pg_sys::Datum::from(varlena)
    }
}

/// Empties a slot (ExecClearTuple, a static inline in C).
///
/// # Safety
/// `slot` is a live slot.
pub unsafe fn clear_slot(slot: *mut pg_sys::TupleTableSlot) {
    // SAFETY: the caller upholds this function's # Safety contract.
    unsafe {
        if let Some(clear) = (*(*slot).tts_ops).clear {
            clear(slot);
        }
    }
}
