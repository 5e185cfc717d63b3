//! Every `envelopes.*` setting, registered once from `_PG_init`, read through typed
//! getters so the rest of the extension never touches a `GucSetting` directly.
//!
//! All settings are `USERSET`: an application can change them per session or per
//! transaction (`SET LOCAL`), which is what bulk loads and tests need. Limits that
//! protect the server (sizes) are bounded by their registered min/max.

use pgrx::{GucContext, GucFlags, GucRegistry, GucSetting};
use std::ffi::CString;

/// Width of a sequence band: each band partition holds `band_width` consecutive
/// sequence ids of one originator. Changing it only affects bands created later;
/// existing bands keep their bounds and new ones are clamped between them.
static BAND_WIDTH: GucSetting<i32> = GucSetting::<i32>::new(1_000_000);

/// Largest accepted topic, in bytes.
static MAX_TOPIC_BYTES: GucSetting<i32> = GucSetting::<i32>::new(1024);

/// Largest accepted envelope blob, in bytes (default 4 MiB).
static MAX_ENVELOPE_BYTES: GucSetting<i32> = GucSetting::<i32>::new(4 * 1024 * 1024);

/// Registers every setting. Called once per backend from `_PG_init`.
pub fn init() {
    GucRegistry::define_int_guc(
        c"envelopes.band_width",
        c"Sequence ids per band partition created on demand.",
        c"Each originator's envelopes are split into range partitions of this many \
          sequence ids. Affects only bands created after the change.",
        &BAND_WIDTH,
        1,
        i32::MAX,
        GucContext::Userset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"envelopes.max_topic_bytes",
        c"Largest topic accepted by the insert functions.",
        c"An insert with a longer topic fails with SQLSTATE 22001 and writes nothing.",
        &MAX_TOPIC_BYTES,
        1,
        i32::MAX,
        GucContext::Userset,
        GucFlags::UNIT_BYTE,
    );
    GucRegistry::define_int_guc(
        c"envelopes.max_envelope_bytes",
        c"Largest envelope blob accepted by the insert functions.",
        c"An insert with a larger envelope fails with SQLSTATE 22001 and writes nothing.",
        &MAX_ENVELOPE_BYTES,
        1,
        i32::MAX,
        GucContext::Userset,
        GucFlags::UNIT_BYTE,
    );
}

/// `envelopes.band_width`, always positive.
pub fn band_width() -> i64 {
    i64::from(BAND_WIDTH.get())
}

/// `envelopes.max_topic_bytes`.
pub fn max_topic_bytes() -> usize {
    usize::try_from(MAX_TOPIC_BYTES.get()).unwrap_or(usize::MAX)
}

/// `envelopes.max_envelope_bytes`.
pub fn max_envelope_bytes() -> usize {
    usize::try_from(MAX_ENVELOPE_BYTES.get()).unwrap_or(usize::MAX)
}

/// Reads a string setting, falling back to `default` when it is unset.
#[allow(dead_code)]
fn string_or(setting: &GucSetting<Option<CString>>, default: &str) -> String {
    setting
        .get()
        .and_then(|s| s.into_string().ok())
        .unwrap_or_else(|| default.to_owned())
}
