//! Structures of the change feed in the main shared memory segment.
//!
//! They are allocated at first use with `ShmemInitStruct` from the segment's spare
//! space, so the extension needs no `shared_preload_libraries` (pg_prewarm
//! allocates its state the same way). Fresh shared memory is zero, and every
//! structure here is made of atomics for which zero is a valid state, so no
//! initialisation step can race with a reader. If the segment has no room, the
//! structure is absent and its users fall back to slower, always-correct paths.
//! Everything starts again at zero after a server restart, as do the backends
//! whose caches remember it.

use pgrx::pg_sys;
use pgrx::PgTryBuilder;
use std::cell::Cell;
use std::ffi::CStr;

/// The structure `T` named `name` in shared memory, allocated (zeroed) by the
/// first backend that asks; `None` when the segment has no room for it.
///
/// # Safety
/// `T` must be valid when all its bytes are zero and safe to share between
/// processes (atomics only), and every caller must use the same `T` for `name`.
pub unsafe fn attach<T>(name: &'static CStr) -> Option<*const T> {
    PgTryBuilder::new(|| {
        let mut found = false;
        // SAFETY: ShmemInitStruct looks the name up (or allocates it) under
        // ShmemIndexLock and returns memory of the requested size that stays mapped
        // for the backend's life; it raises an ERROR (after releasing its lock) if
        // the segment has no room, which the catch below turns into None.
        let ptr =
            unsafe { pg_sys::ShmemInitStruct(name.as_ptr(), std::mem::size_of::<T>(), &mut found) };
        (!ptr.is_null()).then_some(ptr as *const T)
    })
    .catch_others(|_| {
        pgrx::log!(
            "pg_envelopes: no shared memory left for {}; falling back to the slower path",
            name.to_string_lossy()
        );
        None
    })
    .execute()
}

/// Where this backend found a structure of shared memory: looked up at first use
/// ([`attach`]) and remembered for the backend's life, found or not. Held in a
/// `thread_local!` by the structure's one user module.
pub struct Lazy<T: 'static>(Cell<Attached<T>>);

enum Attached<T: 'static> {
    NotYet,
    Unavailable,
    At(&'static T),
}

impl<T> Clone for Attached<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Attached<T> {}

impl<T: 'static> Lazy<T> {
    pub const fn new() -> Lazy<T> {
        Lazy(Cell::new(Attached::NotYet))
    }

    /// The structure named `name`, attached at the first call; `None` when the
    /// segment had no room for it.
    ///
    /// # Safety
    /// As for [`attach`]: `T` is valid when all its bytes are zero and safe to
    /// share between processes, and every caller uses the same `T` for `name`.
    pub unsafe fn get(&self, name: &'static CStr) -> Option<&'static T> {
        if let Attached::NotYet = self.0.get() {
            // SAFETY: as the caller guarantees; the structure lives in the main
            // shared memory segment, mapped for the whole life of the backend.
            let found = unsafe {
                match attach::<T>(name) {
                    Some(ptr) => Attached::At(&*ptr),
                    None => Attached::Unavailable,
                }
            };
            self.0.set(found);
        }
        match self.0.get() {
            Attached::At(shared) => Some(shared),
            _ => None,
        }
    }
}
