//! Values given before the library was loaded: read back from Postgres's
//! placeholders, parsed as Postgres would parse them once the settings are
//! defined, and refused with an ERROR (an invalid value, 22023; a value its
//! setter may not set, 42501) instead of the WARNING and default Postgres
//! would settle for.

use super::CreatePartitionsIn;
use crate::error::{OrRaise, PgSqlErrorCode, SqlError};
use pgrx::prelude::*;
use pgrx::GucFlags;
use std::ffi::{CStr, CString};

/// Errors of settings given before the library was loaded.
#[derive(Debug, thiserror::Error)]
pub enum GucError {
    #[error("invalid value for parameter \"{name}\": \"{value}\" (given before pg_envelopes was loaded)")]
    Invalid { name: String, value: String },
    #[error(
        "permission denied to set parameter \"{name}\" to \"{value}\" (given before \
         pg_envelopes was loaded); this session cannot use pg_envelopes"
    )]
    NotAllowed { name: String, value: String },
}

impl SqlError for GucError {
    fn sqlstate(&self) -> PgSqlErrorCode {
        match self {
            GucError::Invalid { .. } => PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            GucError::NotAllowed { .. } => PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
        }
    }

    fn hint(&self) -> Option<String> {
        Some(match self {
            GucError::Invalid { .. } => {
                "Fix or RESET the value (SET, ALTER ROLE/DATABASE ... SET, postgresql.conf); \
                 SHOW the setting for its unit and range once the library loads."
                    .into()
            }
            GucError::NotAllowed { .. } => {
                "Limits of pg_envelopes are set by a superuser or a role granted SET on them; \
                 reconnect without the value."
                    .into()
            }
        })
    }
}

/// The value a placeholder (or, once defined, the setting) has, if any.
pub(super) fn current_value(name: &CStr) -> Option<String> {
    // SAFETY: name is NUL-terminated; with missing_ok the lookup returns NULL for an
    // unknown name; the returned string is Postgres-owned and copied at once.
    unsafe {
        let value = pg_sys::GetConfigOption(name.as_ptr(), true, false);
        (!value.is_null()).then(|| CStr::from_ptr(value).to_string_lossy().into_owned())
    }
}

/// An integer as Postgres reads it for a setting with `flags` (units included).
pub(super) fn parse_int(value: &str, flags: GucFlags) -> Option<i32> {
    let text = CString::new(value).ok()?;
    let mut result = 0;
    let mut hint = std::ptr::null();
    // SAFETY: text is NUL-terminated; parse_int writes the result and, on failure,
    // a pointer to a static hint, and allocates nothing.
    let ok = unsafe { pg_sys::parse_int(text.as_ptr(), &mut result, flags.bits(), &mut hint) };
    ok.then_some(result)
}

pub(super) fn parse_bool(value: &str) -> Option<bool> {
    let text = CString::new(value).ok()?;
    let mut result = false;
    // SAFETY: text is NUL-terminated; parse_bool only reads it.
    unsafe { pg_sys::parse_bool(text.as_ptr(), &mut result) }.then_some(result)
}

pub(super) fn parse_real(value: &str) -> Option<f64> {
    let text = CString::new(value).ok()?;
    let mut result = 0.0;
    let mut hint = std::ptr::null();
    // SAFETY: text is NUL-terminated; parse_real writes the result and, on failure,
    // a pointer to a static hint, and allocates nothing.
    unsafe { pg_sys::parse_real(text.as_ptr(), &mut result, 0, &mut hint) }.then_some(result)
}

pub(super) fn parse_create_in(value: &str) -> Option<CreatePartitionsIn> {
    match value.to_ascii_lowercase().as_str() {
        "worker" => Some(CreatePartitionsIn::Worker),
        "transaction" => Some(CreatePartitionsIn::Transaction),
        _ => None,
    }
}

/// A setting given before the library was loaded by a role that may not set it:
/// its name and value. Once found, every later load attempt in the process fails.
pub(super) static REFUSED: std::sync::OnceLock<(String, String)> = std::sync::OnceLock::new();

pub(super) fn raise_refused() {
    if let Some((name, value)) = REFUSED.get() {
        Err::<(), _>(GucError::NotAllowed {
            name: name.clone(),
            value: value.clone(),
        })
        .or_raise()
    }
}

pub(super) fn invalid(name: &CStr, value: &str) {
    Err::<(), _>(GucError::Invalid {
        name: name.to_string_lossy().into_owned(),
        value: value.to_owned(),
    })
    .or_raise()
}
