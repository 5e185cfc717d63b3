//! What the settings need of Postgres's GUC machinery beyond pgrx's registry:
//! reading a value given before the settings were defined (a placeholder),
//! parsing a value as Postgres parses one for a setting, reserving the
//! `envelopes.*` prefix, and string settings with a check hook.
//!
//! A check hook is a C function Postgres calls with the proposed value, and it
//! is not told which setting it checks. The string settings with a check get
//! one of a few fixed trampolines here, each calling the safe check it was
//! given: the settings module writes no `unsafe` code.

use pgrx::pg_sys;
use pgrx::{GucContext, GucFlags, GucRegistry, GucSetting};
use std::ffi::{c_char, c_void, CStr, CString};
use std::sync::OnceLock;

/// The value a placeholder (or, once defined, the setting) `name` has, if any.
pub fn current_value(name: &CStr) -> Option<String> {
    // SAFETY: name is NUL-terminated; with missing_ok the lookup returns NULL for an
    // unknown name; the returned string is Postgres-owned and copied at once.
    unsafe {
        let value = pg_sys::GetConfigOption(name.as_ptr(), true, false);
        (!value.is_null()).then(|| CStr::from_ptr(value).to_string_lossy().into_owned())
    }
}

/// An integer as Postgres reads it for a setting with `flags` (units included).
pub fn parse_int(value: &str, flags: GucFlags) -> Option<i32> {
    let text = CString::new(value).ok()?;
    let mut result = 0;
    let mut hint = std::ptr::null();
    // SAFETY: text is NUL-terminated; parse_int writes the result and, on failure,
    // a pointer to a static hint, and allocates nothing.
    let ok = unsafe { pg_sys::parse_int(text.as_ptr(), &mut result, flags.bits(), &mut hint) };
    ok.then_some(result)
}

/// A boolean as Postgres reads it for a setting (`on`, `true`, `1`, ...).
pub fn parse_bool(value: &str) -> Option<bool> {
    let text = CString::new(value).ok()?;
    let mut result = false;
    // SAFETY: text is NUL-terminated; parse_bool only reads it.
    unsafe { pg_sys::parse_bool(text.as_ptr(), &mut result) }.then_some(result)
}

/// A floating-point value as Postgres reads it for a setting without a unit.
pub fn parse_real(value: &str) -> Option<f64> {
    let text = CString::new(value).ok()?;
    let mut result = 0.0;
    let mut hint = std::ptr::null();
    // SAFETY: text is NUL-terminated; parse_real writes the result and, on failure,
    // a pointer to a static hint, and allocates nothing.
    unsafe { pg_sys::parse_real(text.as_ptr(), &mut result, 0, &mut hint) }.then_some(result)
}

/// From now on an unknown name under `prefix` is an error instead of a silent
/// placeholder.
pub fn reserve_prefix(prefix: &'static CStr) {
    // SAFETY: the prefix is a static NUL-terminated string, which Postgres keeps.
    unsafe { pg_sys::MarkGUCPrefixReserved(prefix.as_ptr()) };
}

/// A check of a proposed string value (`None`: the setting is being set to
/// NULL, e.g. an empty list); `false` makes Postgres refuse the value.
pub type StringCheck = fn(Option<&CStr>) -> bool;

/// The string settings that have a check, and their checks, by trampoline.
static CHECKS: [OnceLock<(&'static CStr, StringCheck)>; 2] = [OnceLock::new(), OnceLock::new()];

/// Calls the check registered in slot `slot` on the proposed value.
///
/// # Safety
/// `newval` is the pointer Postgres passes a check hook: valid, pointing to a
/// NUL-terminated string or NULL.
unsafe fn run_check(slot: usize, newval: *mut *mut c_char) -> bool {
    let Some((_, check)) = CHECKS[slot].get() else {
        return true;
    };
    // SAFETY: the caller's promise.
    let value = unsafe {
        if newval.is_null() || (*newval).is_null() {
            None
        } else {
            Some(CStr::from_ptr(*newval))
        }
    };
    check(value)
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn check_slot_0(
    newval: *mut *mut c_char,
    _extra: *mut *mut c_void,
    _source: pg_sys::GucSource::Type,
) -> bool {
    // SAFETY: Postgres passes a check hook a valid pointer to the proposed value.
    unsafe { run_check(0, newval) }
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn check_slot_1(
    newval: *mut *mut c_char,
    _extra: *mut *mut c_void,
    _source: pg_sys::GucSource::Type,
) -> bool {
    // SAFETY: Postgres passes a check hook a valid pointer to the proposed value.
    unsafe { run_check(1, newval) }
}

/// Defines a string setting whose proposed values `check` must accept. At most
/// two settings of the process may have one (each check takes a trampoline of
/// its own); a third is a programming error and panics at library load.
pub fn define_checked_string(
    name: &'static CStr,
    short_description: &'static CStr,
    description: &'static CStr,
    setting: &'static GucSetting<Option<CString>>,
    context: GucContext,
    flags: GucFlags,
    check: StringCheck,
) {
    type Hook = unsafe extern "C-unwind" fn(
        *mut *mut c_char,
        *mut *mut c_void,
        pg_sys::GucSource::Type,
    ) -> bool;
    const HOOKS: [Hook; 2] = [check_slot_0, check_slot_1];
    // The same setting defined again keeps its slot.
    let slot = CHECKS
        .iter()
        .position(|cell| {
            cell.get().is_some_and(|(taken, _)| *taken == name) || cell.set((name, check)).is_ok()
        })
        .expect("more checked string settings than check hooks in src/pg/guc.rs");
    // SAFETY: the hook is a #[pg_guard] function with the signature Postgres
    // expects; it only reads the proposed value and calls a safe check.
    unsafe {
        GucRegistry::define_string_guc_with_hooks(
            name,
            short_description,
            description,
            setting,
            context,
            flags,
            Some(HOOKS[slot]),
            None,
            None,
        );
    }
}
