//! Every `envelopes.*` setting, registered once from `_PG_init`, read through typed
//! getters so the rest of the extension never touches a `GucSetting` directly.
//!
//! All settings are `USERSET`: an application can change them per session or per
//! transaction (`SET LOCAL`), which is what bulk loads and tests need. Limits that
//! protect the server (sizes) are bounded by their registered min/max.

use pgrx::prelude::*;
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

/// Largest payload `publish()` accepts, in bytes (default 1 MiB).
static MAX_PUBLISH_BYTES: GucSetting<i32> = GucSetting::<i32>::new(1024 * 1024);

/// Whether inserts ring the NOTIFY doorbell. Off for bulk loads: the rows are still
/// the durable record and listeners still find them on their next poll.
static NOTIFY: GucSetting<bool> = GucSetting::<bool>::new(true);

/// Minimum time between two doorbells of one session on one channel, in
/// milliseconds; 0 rings on every committing transaction.
static NOTIFY_INTERVAL: GucSetting<i32> = GucSetting::<i32>::new(10);

/// The NOTIFY channel of the doorbell.
static NOTIFY_CHANNEL: GucSetting<Option<CString>> =
    GucSetting::<Option<CString>>::new(Some(c"envelopes"));

/// Rejects channel names Postgres would refuse at commit time (empty, or longer
/// than an identifier), so a bad value fails at SET, not when a transaction commits.
#[pg_guard]
unsafe extern "C-unwind" fn check_notify_channel(
    newval: *mut *mut std::ffi::c_char,
    _extra: *mut *mut std::ffi::c_void,
    _source: pg_sys::GucSource::Type,
) -> bool {
    // SAFETY: Postgres passes a valid pointer to the proposed value, which is a
    // NUL-terminated string or NULL.
    let value = unsafe {
        if newval.is_null() || (*newval).is_null() {
            return false;
        }
        std::ffi::CStr::from_ptr(*newval)
    };
    let len = value.to_bytes().len();
    (1..pg_sys::NAMEDATALEN as usize).contains(&len)
}

/// Where missing partitions are created.
#[derive(PostgresGucEnum, Clone, Copy, PartialEq, Eq, Debug)]
pub enum CreatePartitionsIn {
    /// In a background worker that commits on its own (no DDL locks held by the
    /// caller's transaction).
    #[name = c"worker"]
    Worker,
    /// In the inserting transaction (the locks are held until it ends).
    #[name = c"transaction"]
    Transaction,
}

static CREATE_PARTITIONS_IN: GucSetting<CreatePartitionsIn> =
    GucSetting::<CreatePartitionsIn>::new(CreatePartitionsIn::Worker);

/// lock_timeout of partition DDL, in milliseconds.
static PARTITION_LOCK_TIMEOUT: GucSetting<i32> = GucSetting::<i32>::new(1000);

/// Attempts of a worker whose DDL hits the lock timeout.
static PARTITION_LOCK_ATTEMPTS: GucSetting<i32> = GucSetting::<i32>::new(5);

/// How long an insert waits for the partition worker, in milliseconds.
static PARTITION_WORKER_TIMEOUT: GucSetting<i32> = GucSetting::<i32>::new(30_000);

/// A pause, in milliseconds, that the change feed's readers take between listing
/// the in-flight markers and taking the snapshot they read rows with. Only for
/// tests, which use it to make a commit land inside that window on purpose.
static GATE_PAUSE: GucSetting<i32> = GucSetting::<i32>::new(0);

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
    GucRegistry::define_int_guc(
        c"envelopes.max_publish_bytes",
        c"Largest payload accepted by envelopes.publish().",
        c"A larger payload fails with SQLSTATE 22001 and writes nothing.",
        &MAX_PUBLISH_BYTES,
        1,
        i32::MAX,
        GucContext::Userset,
        GucFlags::UNIT_BYTE,
    );
    GucRegistry::define_bool_guc(
        c"envelopes.notify",
        c"Whether envelope and outbox inserts send the NOTIFY doorbell.",
        c"Turn off for bulk loads. Rows stay the durable record; listeners find them on \
          their next poll.",
        &NOTIFY,
        GucContext::Userset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"envelopes.notify_interval",
        c"Minimum time between two doorbells of one session on one channel.",
        c"0 rings on every committing transaction. Each ring takes the cluster-wide \
          NOTIFY lock through the commit's WAL flush; listeners also poll.",
        &NOTIFY_INTERVAL,
        0,
        60_000,
        GucContext::Userset,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_enum_guc(
        c"envelopes.create_partitions_in",
        c"Where missing partitions are created: worker or transaction.",
        c"worker: a background worker creates and commits them while the insert waits, \
          so the inserting transaction holds no DDL locks. transaction: the inserting \
          transaction creates them and holds the locks until it ends.",
        &CREATE_PARTITIONS_IN,
        GucContext::Userset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"envelopes.partition_lock_timeout",
        c"lock_timeout of the DDL that creates a partition.",
        c"A worker retries DDL that times out (envelopes.partition_lock_attempts times); \
          in the caller's transaction a timeout is an error.",
        &PARTITION_LOCK_TIMEOUT,
        1,
        600_000,
        GucContext::Userset,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_int_guc(
        c"envelopes.partition_lock_attempts",
        c"Attempts of a partition worker whose DDL hits its lock timeout.",
        c"",
        &PARTITION_LOCK_ATTEMPTS,
        1,
        100,
        GucContext::Userset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"envelopes.partition_worker_timeout",
        c"How long an insert waits for the partition worker before failing.",
        c"The worker is terminated and the insert fails with SQLSTATE 55P03.",
        &PARTITION_WORKER_TIMEOUT,
        1,
        3_600_000,
        GucContext::Userset,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_int_guc(
        c"envelopes.test_gate_pause",
        c"Testing aid: pause of the change feed's readers between marker listing and snapshot.",
        c"Lets a test make a commit land inside that window. Leave at 0.",
        &GATE_PAUSE,
        0,
        60_000,
        GucContext::Suset,
        GucFlags::UNIT_MS | GucFlags::NO_SHOW_ALL,
    );
    // SAFETY: the check hook is a #[pg_guard] function with the signature Postgres
    // expects, and only reads the proposed value it is given.
    unsafe {
        GucRegistry::define_string_guc_with_hooks(
            c"envelopes.notify_channel",
            c"NOTIFY channel of the doorbell sent when envelopes or outbox rows commit.",
            c"At most one notification per channel per transaction; its payload names what \
          changed, never the rows.",
            &NOTIFY_CHANNEL,
            GucContext::Userset,
            GucFlags::default(),
            Some(check_notify_channel),
            None,
            None,
        );
    }
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

/// `envelopes.max_publish_bytes`.
pub fn max_publish_bytes() -> usize {
    usize::try_from(MAX_PUBLISH_BYTES.get()).unwrap_or(usize::MAX)
}

/// `envelopes.notify`.
pub fn notify() -> bool {
    NOTIFY.get()
}

/// `envelopes.create_partitions_in`.
pub fn create_partitions_in() -> CreatePartitionsIn {
    CREATE_PARTITIONS_IN.get()
}

/// `envelopes.partition_lock_timeout`, in milliseconds.
pub fn partition_lock_timeout_ms() -> i32 {
    PARTITION_LOCK_TIMEOUT.get()
}

/// `envelopes.partition_lock_attempts`.
pub fn partition_lock_attempts() -> i32 {
    PARTITION_LOCK_ATTEMPTS.get()
}

/// `envelopes.partition_worker_timeout`.
pub fn partition_worker_timeout() -> std::time::Duration {
    std::time::Duration::from_millis(u64::try_from(PARTITION_WORKER_TIMEOUT.get()).unwrap_or(0))
}

/// `envelopes.notify_interval`.
pub fn notify_interval() -> std::time::Duration {
    std::time::Duration::from_millis(u64::try_from(NOTIFY_INTERVAL.get()).unwrap_or(0))
}

/// `envelopes.test_gate_pause`.
pub fn gate_pause() -> std::time::Duration {
    std::time::Duration::from_millis(u64::try_from(GATE_PAUSE.get()).unwrap_or(0))
}

/// `envelopes.notify_channel`.
pub fn notify_channel() -> String {
    string_or(&NOTIFY_CHANNEL, "envelopes")
}

/// Reads a string setting, falling back to `default` when it is unset.
fn string_or(setting: &GucSetting<Option<CString>>, default: &str) -> String {
    setting
        .get()
        .and_then(|s| s.into_string().ok())
        .unwrap_or_else(|| default.to_owned())
}
