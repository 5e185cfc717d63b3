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

/// A type that may live in shared memory as [`Lazy`] hands it out: every bit
/// pattern (all zeros first of all) is a valid value, it holds no pointer, and
/// it is changed only through atomics. So two processes, or two types of the
/// same size given the same name by mistake, can never make an invalid value.
///
/// # Safety
/// Implement it only for types with those properties; structures of such
/// fields are declared with [`shared_struct!`], which checks every field.
pub unsafe trait ZeroShared: Sync + 'static {}

// SAFETY: atomic integers: any bit pattern is a valid value, changed atomically.
unsafe impl ZeroShared for std::sync::atomic::AtomicU64 {}
// SAFETY: as above.
unsafe impl ZeroShared for std::sync::atomic::AtomicI64 {}
// SAFETY: as above.
unsafe impl ZeroShared for std::sync::atomic::AtomicU32 {}
// SAFETY: as above.
unsafe impl ZeroShared for std::sync::atomic::AtomicU8 {}
// SAFETY: an array of such values is such a value.
unsafe impl<T: ZeroShared, const N: usize> ZeroShared for [T; N] {}

/// Declares a structure for shared memory whose fields are all [`ZeroShared`],
/// and makes it one (a field of another type fails to compile).
macro_rules! shared_struct {
    ($(#[$meta:meta])* $vis:vis struct $name:ident {
        $($(#[$field_meta:meta])* $field_vis:vis $field:ident : $ty:ty),* $(,)?
    }) => {
        $(#[$meta])*
        #[repr(C)]
        $vis struct $name {
            $($(#[$field_meta])* $field_vis $field: $ty),*
        }

        // SAFETY: every field is ZeroShared (the bounds below, which are checked
        // where the type is used), and so is a structure made of them.
        #[allow(unsafe_code)]
        unsafe impl $crate::pg::shmem::ZeroShared for $name
        where
            $($ty: $crate::pg::shmem::ZeroShared),*
        {}
    };
}
pub(crate) use shared_struct;

/// The structure `T` named `name` in shared memory, allocated (zeroed) by the
/// first backend that asks; `None` when the segment has no room for it.
fn attach<T: ZeroShared>(name: &'static CStr) -> Option<*const T> {
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

impl<T: ZeroShared> Lazy<T> {
    pub const fn new() -> Lazy<T> {
        Lazy(Cell::new(Attached::NotYet))
    }

    /// The structure named `name`, attached at the first call; `None` when the
    /// segment had no room for it. (A name asked for with types of different
    /// sizes is an ERROR from Postgres.)
    pub fn get(&self, name: &'static CStr) -> Option<&'static T> {
        if let Attached::NotYet = self.0.get() {
            // SAFETY: the structure lives in the main shared memory segment,
            // mapped for the whole life of the backend, of T's size; T is
            // ZeroShared, so whatever bytes it holds are a valid T.
            let found = match attach::<T>(name) {
                Some(ptr) => Attached::At(unsafe { &*ptr }),
                None => Attached::Unavailable,
            };
            self.0.set(found);
        }
        match self.0.get() {
            Attached::At(shared) => Some(shared),
            _ => None,
        }
    }
}
