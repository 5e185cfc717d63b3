//! Values given before the library was loaded (read back from Postgres's
//! placeholders and parsed as Postgres would parse them once the settings are
//! defined, with [`crate::pg::guc`]), refused with an ERROR (an invalid value,
//! 22023; a value its setter may not set, 42501) instead of the WARNING and
//! default Postgres would settle for.

use super::CreatePartitionsIn;
use crate::error::{OrRaise, PgSqlErrorCode, SqlError};
use std::ffi::CStr;

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
