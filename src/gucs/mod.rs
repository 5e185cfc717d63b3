//! Every `envelopes.*` setting, registered once from `_PG_init`, read through typed
//! getters so the rest of the extension never touches a `GucSetting` directly.
//!
//! Who may change what: the limits that protect the server and the other writers
//! (sizes, `band_width`, the per-call partition cap, where and how partitions are
//! created) are `SUSET` — a superuser, or a role granted `SET` on the parameter
//! (`GRANT SET ON PARAMETER envelopes.max_envelope_bytes TO owner`), sets them, per
//! role or database with `ALTER ROLE/DATABASE ... SET`; a writer cannot raise
//! them. The doorbell settings stay `USERSET`: bulk loads turn it off per session.
//!
//! Values given before the library is loaded (the first statement of a session, a
//! role's or database's settings, `postgresql.conf`) wait as placeholders that
//! Postgres would check only when the setting is defined, replacing a bad one by
//! the default with a WARNING. [`init`] checks them first and refuses to load
//! with an ERROR instead: an invalid value (22023) every time until it is fixed,
//! and a value the role that gave it may not set (42501) for every call into the
//! extension in that session (Postgres has dropped the value by then, so the
//! session cannot be told apart from one that never gave it, except by
//! remembering: it must reconnect without it).

#![deny(unsafe_code)]

mod placeholder;

use crate::pg::guc::{self, current_value, parse_bool, parse_int, parse_real};
use pgrx::prelude::*;
use pgrx::{GucContext, GucFlags, GucRegistry, GucSetting};
use placeholder::{invalid, parse_create_in, raise_refused, REFUSED};
use std::ffi::{CStr, CString};
use std::sync::atomic::{AtomicBool, Ordering};

/// Width of a sequence band: each band partition holds `band_width` consecutive
/// sequence ids of one originator. Changing it only affects bands created later;
/// existing bands keep their bounds and new ones are clamped between them.
static BAND_WIDTH: GucSetting<i32> = GucSetting::<i32>::new(1_000_000);

/// Largest accepted topic, in bytes; at most [`TOPIC_INDEX_MAX`].
static MAX_TOPIC_BYTES: GucSetting<i32> = GucSetting::<i32>::new(1024);

/// The longest topic the meta leaves' `(topic, originator_sequence_id)` btree
/// index can hold whatever its bytes (an incompressible topic is stored in the
/// index as it is), for pages of `block` bytes: a btree tuple must fit in a third
/// of a page after the page's own overhead (`BTMaxItemSize` in nbtree.h: 2704
/// bytes for 8 kB pages), and the index tuple holds its 8-byte header, the topic
/// with its 4-byte varlena header padded to 8 for the `bigint`, and the `bigint`.
/// A longer topic fails in the index with 54000 instead of 22001 at the
/// function's own check, so `envelopes.max_topic_bytes` cannot go above it.
pub const fn topic_index_max(block: usize) -> usize {
    const fn up(n: usize) -> usize {
        (n + 7) & !7
    }
    const fn down(n: usize) -> usize {
        n & !7
    }
    // Page header (24), three line pointers (4 each) and three heap TIDs (6
    // each, a pivot tuple's), then the btree special space (16).
    let overhead = up(24 + 3 * 4 + 3 * 6) + up(16);
    let max_item = down((block - overhead) / 3);
    down(max_item - 8 - 8) - 4
}

/// [`topic_index_max`] of this server's pages.
pub const TOPIC_INDEX_MAX: usize = topic_index_max(pg_sys::BLCKSZ as usize);

/// Largest accepted envelope blob, in bytes (default 4 MiB).
static MAX_ENVELOPE_BYTES: GucSetting<i32> = GucSetting::<i32>::new(4 * 1024 * 1024);

/// Largest payload `publish()` accepts, in bytes (default 1 MiB).
static MAX_PUBLISH_BYTES: GucSetting<i32> = GucSetting::<i32>::new(1024 * 1024);

/// Largest headers object `publish()` accepts, in bytes of its JSON text.
static MAX_HEADER_BYTES: GucSetting<i32> = GucSetting::<i32>::new(64 * 1024);

/// Most bands one call of an insert function (or `ensure_gateway_parts`) may create.
static MAX_NEW_PARTITIONS_PER_CALL: GucSetting<i32> = GucSetting::<i32>::new(100);

/// Whether inserts ring the NOTIFY doorbell. Off for bulk loads: the rows are still
/// the durable record and listeners still find them on their next poll.
static NOTIFY: GucSetting<bool> = GucSetting::<bool>::new(true);

/// Minimum time between two doorbells of one session on one channel, in
/// milliseconds; 0 rings on every committing transaction.
static NOTIFY_INTERVAL: GucSetting<i32> = GucSetting::<i32>::new(10);

/// The NOTIFY channel of the doorbell.
static NOTIFY_CHANNEL: GucSetting<Option<CString>> =
    GucSetting::<Option<CString>>::new(Some(c"envelopes"));

/// Whether a doorbell channel name is one Postgres accepts at commit time (not
/// empty, shorter than an identifier's limit).
fn valid_channel(value: &CStr) -> bool {
    (1..pg_sys::NAMEDATALEN as usize).contains(&value.to_bytes().len())
}

/// Rejects channel names Postgres would refuse at commit time, so a bad value
/// fails at SET, not when a transaction commits.
fn check_notify_channel(value: Option<&CStr>) -> bool {
    value.is_some_and(valid_channel)
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

/// How long, in milliseconds, the holder of a lease may stay silent (idle, or
/// idle in a transaction) before a session asking for the same lease ends it
/// and takes the lease; 0 (the default) waits for the holder's session to end
/// by itself. Read from the session asking for the lease: the bridge sets it
/// from `--session-timeout`.
static LEASE_TIMEOUT: GucSetting<i32> = GucSetting::<i32>::new(0);

/// Seconds between two runs of the maintenance worker (pruning and band
/// pre-creation) in each of `envelopes.maintenance_databases`; 0 turns it off.
/// Only a server with pg_envelopes in `shared_preload_libraries` has the worker.
static MAINTENANCE_INTERVAL: GucSetting<i32> = GucSetting::<i32>::new(0);

/// The databases the maintenance worker looks after, comma-separated.
static MAINTENANCE_DATABASES: GucSetting<Option<CString>> =
    GucSetting::<Option<CString>>::new(Some(c""));

/// How full an originator's newest band may get (by its highest sequence id in
/// the band) before the maintenance worker creates the next one.
static PREMAKE_FRACTION: GucSetting<f64> = GucSetting::<f64>::new(0.8);

/// The database names of a `envelopes.maintenance_databases` value: separated by
/// commas, blanks around each name ignored, a name in double quotes taken as it
/// is (with `""` for a quote; needed for a comma or blanks at the ends), every
/// name non-empty, shorter than an identifier's limit and given once. `None` for
/// a value that breaks any of that.
pub fn parse_database_list(value: &str) -> Option<Vec<String>> {
    let mut names: Vec<String> = Vec::new();
    if value.trim().is_empty() {
        return Some(names);
    }
    let mut chars = value.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        let mut name = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            loop {
                match chars.next()? {
                    '"' if chars.peek() == Some(&'"') => {
                        chars.next();
                        name.push('"');
                    }
                    '"' => break,
                    c => name.push(c),
                }
            }
            while chars.peek().is_some_and(|c| c.is_whitespace()) {
                chars.next();
            }
        } else {
            while let Some(&c) = chars.peek() {
                if c == ',' || c == '"' {
                    break;
                }
                name.push(c);
                chars.next();
            }
            name.truncate(name.trim_end().len());
        }
        if name.is_empty()
            || name.len() >= pg_sys::NAMEDATALEN as usize
            || name.contains('\0')
            || names.contains(&name)
        {
            return None;
        }
        names.push(name);
        match chars.next() {
            None => return Some(names),
            Some(',') => {}
            Some(_) => return None,
        }
    }
}

/// Rejects a `envelopes.maintenance_databases` value that is not a list of
/// database names, so a bad value fails at ALTER SYSTEM or reload instead of
/// leaving the worker with nothing to do. NULL is the empty list.
fn check_maintenance_databases(value: Option<&CStr>) -> bool {
    value.is_none_or(|value| value.to_str().ok().and_then(parse_database_list).is_some())
}

/// One integer setting: how it is registered and how a placeholder is checked.
struct IntSetting {
    name: &'static CStr,
    short: &'static CStr,
    long: &'static CStr,
    setting: &'static GucSetting<i32>,
    min: i32,
    max: i32,
    context: GucContext,
    flags: GucFlags,
}

fn int_settings() -> [IntSetting; 13] {
    use GucContext::{Sighup, Suset, Userset};
    [
        IntSetting {
            name: c"envelopes.band_width",
            short: c"Sequence ids per band partition created on demand.",
            long: c"Each originator's envelopes are split into range partitions of this many \
                    sequence ids. Affects only bands created after the change.",
            setting: &BAND_WIDTH,
            min: 1,
            max: i32::MAX,
            context: Suset,
            flags: GucFlags::default(),
        },
        IntSetting {
            name: c"envelopes.max_topic_bytes",
            short: c"Largest topic accepted by the insert functions.",
            long: c"An insert with a longer topic fails with SQLSTATE 22001 and writes nothing. \
                    At most what the topic index can hold (2684 bytes with 8 kB pages).",
            setting: &MAX_TOPIC_BYTES,
            min: 1,
            max: TOPIC_INDEX_MAX as i32,
            context: Suset,
            flags: GucFlags::UNIT_BYTE,
        },
        IntSetting {
            name: c"envelopes.max_envelope_bytes",
            short: c"Largest envelope blob accepted by the insert functions.",
            long: c"An insert with a larger envelope fails with SQLSTATE 22001 and writes nothing.",
            setting: &MAX_ENVELOPE_BYTES,
            min: 1,
            max: i32::MAX,
            context: Suset,
            flags: GucFlags::UNIT_BYTE,
        },
        IntSetting {
            name: c"envelopes.max_publish_bytes",
            short: c"Largest payload accepted by envelopes.publish().",
            long: c"A larger payload fails with SQLSTATE 22001 and writes nothing.",
            setting: &MAX_PUBLISH_BYTES,
            min: 1,
            max: i32::MAX,
            context: Suset,
            flags: GucFlags::UNIT_BYTE,
        },
        IntSetting {
            name: c"envelopes.max_header_bytes",
            short: c"Largest headers object accepted by envelopes.publish().",
            long: c"Measured as the headers' JSON text. Larger headers fail with SQLSTATE \
                    22001 and write nothing.",
            setting: &MAX_HEADER_BYTES,
            min: 2,
            max: i32::MAX,
            context: Suset,
            flags: GucFlags::UNIT_BYTE,
        },
        IntSetting {
            name: c"envelopes.max_new_partitions_per_call",
            short: c"Most band partitions one call may create.",
            long: c"A call of an insert function or ensure_gateway_parts that would create \
                    more bands fails with SQLSTATE 54000 before creating any.",
            setting: &MAX_NEW_PARTITIONS_PER_CALL,
            min: 1,
            max: 1_000_000,
            context: Suset,
            flags: GucFlags::default(),
        },
        IntSetting {
            name: c"envelopes.notify_interval",
            short: c"Minimum time between two doorbells of one session on one channel.",
            long: c"0 rings on every committing transaction. Each ring takes the cluster-wide \
                    NOTIFY lock through the commit's WAL flush; listeners also poll.",
            setting: &NOTIFY_INTERVAL,
            min: 0,
            max: 60_000,
            context: Userset,
            flags: GucFlags::UNIT_MS,
        },
        IntSetting {
            name: c"envelopes.partition_lock_timeout",
            short: c"lock_timeout of the DDL that creates a partition.",
            long: c"A worker retries DDL that times out (envelopes.partition_lock_attempts \
                    times); in the caller's transaction a timeout is an error.",
            setting: &PARTITION_LOCK_TIMEOUT,
            min: 1,
            max: 600_000,
            context: Suset,
            flags: GucFlags::UNIT_MS,
        },
        IntSetting {
            name: c"envelopes.partition_lock_attempts",
            short: c"Attempts of a partition worker whose DDL hits its lock timeout.",
            long: c"",
            setting: &PARTITION_LOCK_ATTEMPTS,
            min: 1,
            max: 100,
            context: Suset,
            flags: GucFlags::default(),
        },
        IntSetting {
            name: c"envelopes.partition_worker_timeout",
            short: c"How long an insert waits for the partition worker before failing.",
            long: c"The worker is terminated and the insert fails with SQLSTATE 55P03.",
            setting: &PARTITION_WORKER_TIMEOUT,
            min: 1,
            max: 3_600_000,
            context: Suset,
            flags: GucFlags::UNIT_MS,
        },
        IntSetting {
            name: c"envelopes.maintenance_interval",
            short: c"Seconds between two runs of the maintenance worker; 0 turns it off.",
            long: c"Each run prunes expired envelopes and creates the next band of every \
                    originator whose newest band is fuller than envelopes.premake_fraction, \
                    in each of envelopes.maintenance_databases. Needs pg_envelopes in \
                    shared_preload_libraries.",
            setting: &MAINTENANCE_INTERVAL,
            min: 0,
            max: 7 * 24 * 3600,
            context: Sighup,
            flags: GucFlags::UNIT_S,
        },
        IntSetting {
            name: c"envelopes.lease_timeout",
            short: c"Silence after which a lease's holder is ended by a session asking for it.",
            long: c"Read in the session that asks for a consumer's or ingress stream's lease: a \
                    holder idle (or idle in a transaction) for longer is terminated and the \
                    lease taken. The session that takes a lease with it set gets \
                    idle_session_timeout and idle_in_transaction_session_timeout no longer \
                    than it.",
            setting: &LEASE_TIMEOUT,
            min: 0,
            max: 24 * 3_600_000,
            context: Userset,
            flags: GucFlags::UNIT_MS,
        },
        IntSetting {
            name: c"envelopes.test_gate_pause",
            short: c"Testing aid: pause of the change feed's readers between marker listing \
                     and snapshot.",
            long: c"Lets a test make a commit land inside that window. Leave at 0.",
            setting: &GATE_PAUSE,
            min: 0,
            max: 60_000,
            context: Suset,
            flags: GucFlags::UNIT_MS.union(GucFlags::NO_SHOW_ALL),
        },
    ]
}

const NOTIFY_NAME: &CStr = c"envelopes.notify";
const NOTIFY_CHANNEL_NAME: &CStr = c"envelopes.notify_channel";
const CREATE_PARTITIONS_IN_NAME: &CStr = c"envelopes.create_partitions_in";
const MAINTENANCE_DATABASES_NAME: &CStr = c"envelopes.maintenance_databases";
const PREMAKE_FRACTION_NAME: &CStr = c"envelopes.premake_fraction";

/// Set once the settings are defined in this process (`_PG_init` may run again
/// after it raised an error: the library is then loaded but not yet registered).
static DEFINED: AtomicBool = AtomicBool::new(false);

/// Registers every setting, after checking the values given before the library
/// was loaded. Called from `_PG_init`.
pub fn init() {
    if DEFINED.load(Ordering::Relaxed) {
        raise_refused();
        return;
    }
    let ints = int_settings();
    // 1. Values Postgres would replace by the default: refuse to load.
    let given_ints: Vec<Option<String>> = ints.iter().map(|s| current_value(s.name)).collect();
    for (setting, given) in ints.iter().zip(&given_ints) {
        if let Some(value) = given {
            let parsed = parse_int(value, setting.flags);
            if !parsed.is_some_and(|v| (setting.min..=setting.max).contains(&v)) {
                invalid(setting.name, value);
            }
        }
    }
    let given_notify = current_value(NOTIFY_NAME);
    if let Some(value) = &given_notify {
        if parse_bool(value).is_none() {
            invalid(NOTIFY_NAME, value);
        }
    }
    let given_create_in = current_value(CREATE_PARTITIONS_IN_NAME);
    if let Some(value) = &given_create_in {
        if parse_create_in(value).is_none() {
            invalid(CREATE_PARTITIONS_IN_NAME, value);
        }
    }
    if let Some(value) = current_value(NOTIFY_CHANNEL_NAME) {
        if !CString::new(value.as_str()).is_ok_and(|c| valid_channel(&c)) {
            invalid(NOTIFY_CHANNEL_NAME, &value);
        }
    }
    if let Some(value) = current_value(MAINTENANCE_DATABASES_NAME) {
        if parse_database_list(&value).is_none() {
            invalid(MAINTENANCE_DATABASES_NAME, &value);
        }
    }
    if let Some(value) = current_value(PREMAKE_FRACTION_NAME) {
        if !parse_real(&value).is_some_and(|v| (0.0..=1.0).contains(&v)) {
            invalid(PREMAKE_FRACTION_NAME, &value);
        }
    }

    // 2. Define them; Postgres applies the placeholders it is allowed to.
    let defined: Vec<(&CStr, GucFlags, &GucSetting<i32>)> =
        ints.iter().map(|s| (s.name, s.flags, s.setting)).collect();
    for s in ints {
        GucRegistry::define_int_guc(
            s.name, s.short, s.long, s.setting, s.min, s.max, s.context, s.flags,
        );
    }
    GucRegistry::define_bool_guc(
        NOTIFY_NAME,
        c"Whether envelope and outbox inserts send the NOTIFY doorbell.",
        c"Turn off for bulk loads. Rows stay the durable record; listeners find them on \
          their next poll.",
        &NOTIFY,
        GucContext::Userset,
        GucFlags::default(),
    );
    GucRegistry::define_enum_guc(
        CREATE_PARTITIONS_IN_NAME,
        c"Where missing partitions are created: worker or transaction.",
        c"worker: a background worker creates and commits them while the insert waits, \
          so the inserting transaction holds no DDL locks. transaction: the inserting \
          transaction creates them and holds the locks until it ends.",
        &CREATE_PARTITIONS_IN,
        GucContext::Suset,
        GucFlags::default(),
    );
    guc::define_checked_string(
        NOTIFY_CHANNEL_NAME,
        c"NOTIFY channel of the doorbell sent when envelopes or outbox rows commit.",
        c"At most one notification per channel per transaction; its payload names what \
          changed, never the rows.",
        &NOTIFY_CHANNEL,
        GucContext::Userset,
        GucFlags::default(),
        check_notify_channel,
    );
    guc::define_checked_string(
        MAINTENANCE_DATABASES_NAME,
        c"Databases the maintenance worker looks after, comma-separated.",
        c"Each needs pg_envelopes installed; a run in each every \
          envelopes.maintenance_interval seconds. Names in double quotes are taken as \
          they are.",
        &MAINTENANCE_DATABASES,
        GucContext::Sighup,
        GucFlags::default(),
        check_maintenance_databases,
    );
    GucRegistry::define_float_guc(
        PREMAKE_FRACTION_NAME,
        c"How full an originator's newest band gets before maintenance creates the next.",
        c"By the band's highest sequence id: with 0.8 the next band is created once the \
          newest holds an id in its last fifth. 1 never creates ahead.",
        &PREMAKE_FRACTION,
        0.0,
        1.0,
        GucContext::Sighup,
        GucFlags::default(),
    );
    // From now on an unknown envelopes.* name is an error instead of a silent
    // placeholder.
    guc::reserve_prefix(c"envelopes");
    DEFINED.store(true, Ordering::Relaxed);

    // 3. A valid value that did not stick was refused for its setter's privileges
    // (Postgres said so in a WARNING and kept the default): make it an error.
    // Kept for the rest of the process: Postgres calls _PG_init again when a
    // library's first load failed, and the settings are defined by then.
    for ((name, flags, setting), given) in defined.iter().zip(&given_ints) {
        if let Some(value) = given {
            if parse_int(value, *flags) != Some(setting.get()) {
                let _ = REFUSED.set((name.to_string_lossy().into_owned(), value.clone()));
            }
        }
    }
    if let Some(value) = &given_create_in {
        if parse_create_in(value) != Some(CREATE_PARTITIONS_IN.get()) {
            let _ = REFUSED.set((
                CREATE_PARTITIONS_IN_NAME.to_string_lossy().into_owned(),
                value.clone(),
            ));
        }
    }
    raise_refused();
}

/// Whether the role calling the extension's function (outside any `SECURITY
/// DEFINER` switch) may set the `SUSET` setting `name`: a superuser, or a role
/// granted `SET` on it.
pub fn caller_may_set(name: &str) -> Result<bool, pgrx::spi::SpiError> {
    let caller = crate::pg::acl::caller();
    Ok(pgrx::spi::Spi::get_one_with_args::<bool>(
        "SELECT pg_catalog.has_parameter_privilege($1, $2, 'SET')",
        &[caller.into(), name.into()],
    )?
    .unwrap_or(false))
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

/// `envelopes.max_header_bytes`.
pub fn max_header_bytes() -> usize {
    usize::try_from(MAX_HEADER_BYTES.get()).unwrap_or(usize::MAX)
}

/// `envelopes.max_new_partitions_per_call`.
pub fn max_new_partitions_per_call() -> usize {
    usize::try_from(MAX_NEW_PARTITIONS_PER_CALL.get()).unwrap_or(usize::MAX)
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

/// `envelopes.lease_timeout`; `None` when off.
pub fn lease_timeout() -> Option<std::time::Duration> {
    let ms = u64::try_from(LEASE_TIMEOUT.get()).unwrap_or(0);
    (ms > 0).then(|| std::time::Duration::from_millis(ms))
}

/// `envelopes.test_gate_pause`.
pub fn gate_pause() -> std::time::Duration {
    std::time::Duration::from_millis(u64::try_from(GATE_PAUSE.get()).unwrap_or(0))
}

/// `envelopes.maintenance_interval`; `None` when maintenance is off.
pub fn maintenance_interval() -> Option<std::time::Duration> {
    let seconds = u64::try_from(MAINTENANCE_INTERVAL.get()).unwrap_or(0);
    (seconds > 0).then(|| std::time::Duration::from_secs(seconds))
}

/// `envelopes.maintenance_databases`, as names (its check hook keeps it valid).
pub fn maintenance_databases() -> Vec<String> {
    MAINTENANCE_DATABASES
        .get()
        .and_then(|s| s.into_string().ok())
        .and_then(|s| parse_database_list(&s))
        .unwrap_or_default()
}

/// `envelopes.premake_fraction`, between 0 and 1.
pub fn premake_fraction() -> f64 {
    PREMAKE_FRACTION.get()
}

/// `envelopes.notify_channel`.
pub fn notify_channel() -> String {
    NOTIFY_CHANNEL
        .get()
        .and_then(|s| s.into_string().ok())
        .unwrap_or_else(|| "envelopes".to_owned())
}

#[cfg(test)]
mod tests {
    use super::{parse_database_list, topic_index_max};

    #[test]
    fn database_lists_are_names_separated_by_commas() {
        let list = |v: &str| parse_database_list(v);
        assert_eq!(list(""), Some(vec![]));
        assert_eq!(list("  "), Some(vec![]));
        assert_eq!(list("app"), Some(vec!["app".to_owned()]));
        assert_eq!(
            list(" app , Other db,x"),
            Some(vec!["app".into(), "Other db".into(), "x".into()])
        );
        assert_eq!(
            list(r#""a,b", "say ""hi"" ""#),
            Some(vec!["a,b".into(), r#"say "hi" "#.into()])
        );
        for bad in ["a,,b", "a,", ",a", "a,a", r#""a"b"#, r#""open"#, r#""""#] {
            assert_eq!(list(bad), None, "{bad}");
        }
        assert_eq!(list(&"x".repeat(64)), None);
        assert!(list(&"x".repeat(63)).is_some());
    }

    #[test]
    fn the_topic_limit_is_what_a_btree_tuple_can_hold() {
        // BTMaxItemSize is 2704 bytes for 8 kB pages: 8 + 2688 + 8 with the
        // topic's 4-byte header and 2684 bytes.
        assert_eq!(topic_index_max(8192), 2684);
        assert_eq!(topic_index_max(32768), 10876);
    }
}
