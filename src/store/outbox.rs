//! The transactional outbox: `publish()` and the commit-time doorbell.
//!
//! An application's change and the message announcing it commit together or not
//! at all, because the message is a row in the same transaction
//! (`envelopes.outbox`). Listeners learn that something committed through NOTIFY,
//! but NOTIFY is only a doorbell: the rows are the durable record, and a listener
//! that was away catches up from its cursor. The doorbell rings at most once per
//! channel per transaction, whatever the number of rows or statements: the insert
//! triggers only note what changed, and one pre-commit callback sends a single
//! small notification (`{"xid":"…","changed":["envelopes","outbox"]}`, never
//! envelope bytes). Nothing is sent for a transaction that rolls back, because
//! Postgres discards its pending notifications.
//!
//! `publish()` takes the outbox's in-flight marker before its row draws an id, so
//! the consumers' reads (`crate::store::consumer`) never pass an id that a running
//! transaction may still commit (see `crate::store::feed`).

use crate::error::{PgSqlErrorCode, SqlError};
use crate::gucs;
use crate::store::feed::markers::{self, Drawn, MarkerError};
use pgrx::datum::{DatumWithOid, JsonB};
use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::spi::{OwnedPreparedStatement, Spi};
use pgrx::PgOid;
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::time::Instant;

/// Errors of the outbox functions.
#[derive(Debug, thiserror::Error)]
pub enum OutboxError {
    #[error("{0} must not be NULL")]
    Null(&'static str),
    #[error("subject must not be empty")]
    EmptySubject,
    #[error(
        "subject must be dot-separated non-empty tokens without whitespace, control \
         characters or the wildcards * > + # (got {0:?})"
    )]
    BadSubject(String),
    #[error("subject is {len} bytes, more than {max}")]
    SubjectTooLong { len: usize, max: usize },
    #[error("payload is {len} bytes, more than envelopes.max_publish_bytes = {max}")]
    PayloadTooLarge { len: usize, max: usize },
    #[error("headers must be a JSON object")]
    HeadersNotObject,
    #[error("headers are {len} bytes of JSON, more than envelopes.max_header_bytes = {max}")]
    HeadersTooLarge { len: usize, max: usize },
    #[error(
        "trigger must be called as notify_on_insert('envelopes') or notify_on_insert('outbox')"
    )]
    BadTrigger,
    #[error("{0}")]
    Marker(#[from] MarkerError),
    #[error("{0}")]
    NotWritable(#[from] crate::pg::xact::NotWritable),
    #[error("SPI error in the outbox: {0}")]
    Spi(#[from] pgrx::spi::SpiError),
}

impl SqlError for OutboxError {
    fn sqlstate(&self) -> PgSqlErrorCode {
        use PgSqlErrorCode::*;
        match self {
            OutboxError::Null(_) => ERRCODE_NULL_VALUE_NOT_ALLOWED,
            OutboxError::EmptySubject
            | OutboxError::BadSubject(_)
            | OutboxError::HeadersNotObject => ERRCODE_INVALID_PARAMETER_VALUE,
            OutboxError::SubjectTooLong { .. }
            | OutboxError::PayloadTooLarge { .. }
            | OutboxError::HeadersTooLarge { .. } => ERRCODE_STRING_DATA_RIGHT_TRUNCATION,
            OutboxError::BadTrigger => ERRCODE_TRIGGERED_ACTION_EXCEPTION,
            OutboxError::Marker(e) => e.sqlstate(),
            OutboxError::NotWritable(e) => e.sqlstate(),
            OutboxError::Spi(_) => ERRCODE_INTERNAL_ERROR,
        }
    }

    fn hint(&self) -> Option<String> {
        match self {
            OutboxError::NotWritable(e) => e.hint(),
            _ => None,
        }
    }
}

/// Longest accepted subject. NATS, Redis and MQTT all take this comfortably.
pub const MAX_SUBJECT_BYTES: usize = 255;

/// Whether every bus the bridge serves accepts `subject` as part of a publish
/// subject, topic or routing key: NATS refuses empty tokens (`a..b`) and the
/// wildcards `*` and `>`, MQTT refuses `+` and `#` in a published topic, and none
/// takes whitespace or control characters.
fn valid_on_every_bus(subject: &str) -> bool {
    subject.split('.').all(|token| {
        !token.is_empty()
            && !token
                .chars()
                .any(|c| c.is_whitespace() || c.is_control() || matches!(c, '*' | '>' | '+' | '#'))
    })
}

fn check_subject(subject: Option<&str>) -> Result<&str, OutboxError> {
    let subject = subject.ok_or(OutboxError::Null("subject"))?;
    if subject.is_empty() {
        return Err(OutboxError::EmptySubject);
    }
    if subject.len() > MAX_SUBJECT_BYTES {
        return Err(OutboxError::SubjectTooLong {
            len: subject.len(),
            max: MAX_SUBJECT_BYTES,
        });
    }
    if !valid_on_every_bus(subject) {
        return Err(OutboxError::BadSubject(subject.to_owned()));
    }
    Ok(subject)
}

thread_local! {
    static PUBLISH_PLAN: RefCell<Option<Rc<OwnedPreparedStatement>>> = const { RefCell::new(None) };
}

pub fn publish_row(
    subject: Option<&str>,
    payload: Option<&[u8]>,
    headers: Option<JsonB>,
) -> Result<i64, OutboxError> {
    crate::pg::xact::check_writable("publish")?;
    let subject = check_subject(subject)?;
    let payload = payload.ok_or(OutboxError::Null("payload"))?;
    let max = gucs::max_publish_bytes();
    if payload.len() > max {
        return Err(OutboxError::PayloadTooLarge {
            len: payload.len(),
            max,
        });
    }
    let headers = headers.ok_or(OutboxError::Null("headers"))?;
    if !headers.0.is_object() {
        return Err(OutboxError::HeadersNotObject);
    }
    // Measured as compact JSON text (what the bridge forwards), not as jsonb.
    let max = gucs::max_header_bytes();
    let len = headers.0.to_string().len();
    if len > max {
        return Err(OutboxError::HeadersTooLarge { len, max });
    }
    // Before the row draws its id (see crate::store::feed).
    markers::mark_drawn(Drawn::Outbox)?;
    Spi::connect_mut(|client| {
        let cached = PUBLISH_PLAN.with(|p| p.borrow().clone());
        let plan = match cached {
            Some(plan) => plan,
            None => {
                let plan = Rc::new(
                    client
                        .prepare_mut(
                            "INSERT INTO envelopes.outbox (subject, payload, headers)
                             VALUES ($1, $2, $3) RETURNING id",
                            &[
                                PgOid::from(String::type_oid()),
                                PgOid::from(<&[u8]>::type_oid()),
                                PgOid::from(JsonB::type_oid()),
                            ],
                        )?
                        .keep(),
                );
                PUBLISH_PLAN.with(|p| *p.borrow_mut() = Some(plan.clone()));
                plan
            }
        };
        let args = [
            DatumWithOid::from(subject),
            DatumWithOid::from(payload),
            DatumWithOid::from(headers),
        ];
        let id = client
            .update(&*plan, None, &args)?
            .first()
            .get_one::<i64>()?;
        id.ok_or(OutboxError::Null("returned id"))
    })
}

/// What changed in the current transaction, per notification channel.
#[derive(Default)]
struct Doorbell {
    lxid: pg_sys::LocalTransactionId,
    /// channel -> kinds of rows inserted ("envelopes", "outbox"), in first-seen order
    pending: Vec<(String, Vec<&'static str>)>,
}

thread_local! {
    static DOORBELL: RefCell<Doorbell> = RefCell::new(Doorbell::default());
}

/// What the doorbell trigger on meta does for rows the direct write path inserted
/// (no statement runs on the root there, so the trigger does not fire).
pub(crate) fn ring_for_envelopes() {
    if gucs::notify() {
        ring("envelopes");
    }
}

/// Notes that rows of `kind` were inserted; the first note of a transaction
/// arranges for the notification to be sent just before it commits.
pub fn ring(kind: &'static str) {
    let channel = gucs::notify_channel();
    let lxid = crate::pg::xact::local_xid();
    let first = DOORBELL.with(|bell| {
        let mut bell = bell.borrow_mut();
        let first = bell.lxid != lxid || bell.pending.is_empty();
        if bell.lxid != lxid {
            bell.lxid = lxid;
            bell.pending.clear();
        }
        match bell.pending.iter_mut().find(|(c, _)| *c == channel) {
            Some((_, kinds)) if kinds.contains(&kind) => {}
            Some((_, kinds)) => kinds.push(kind),
            None => bell.pending.push((channel, vec![kind])),
        }
        first
    });
    if first {
        pgrx::register_xact_callback(pgrx::PgXactCallbackEvent::PreCommit, send_pending);
    }
}

/// The notification payload: the transaction and what it changed. A few dozen
/// bytes whatever the transaction wrote.
fn payload(kinds: &[&str]) -> String {
    // A transaction that inserted rows always has an id.
    let xid = crate::pg::xact::top_xid_if_any();
    let changed: Vec<String> = kinds.iter().map(|k| format!("\"{k}\"")).collect();
    format!("{{\"xid\":\"{xid}\",\"changed\":[{}]}}", changed.join(","))
}

thread_local! {
    /// When this session last rang each channel.
    static LAST_RUNG: RefCell<HashMap<String, Instant>> = RefCell::new(HashMap::new());
}

/// Pre-commit callback: one notification per channel that saw changes, unless this
/// session rang that channel less than `envelopes.notify_interval` ago.
///
/// Every notifying commit takes Postgres' cluster-wide NOTIFY lock and holds it
/// through its WAL flush, so ringing on every one of thousands of small commits a
/// second serializes them (measured: 0.47x the throughput of no NOTIFY at 8
/// writers). A session that keeps committing rings at least once per interval, and
/// the listener reads everything committed up to its read, so only the last
/// commits of a burst can wait for the listener's poll instead of the doorbell.
fn send_pending() {
    let pending = DOORBELL.with(|bell| std::mem::take(&mut bell.borrow_mut().pending));
    let interval = gucs::notify_interval();
    let now = Instant::now();
    for (channel, kinds) in pending {
        let recently = LAST_RUNG.with(|last| {
            last.borrow()
                .get(&channel)
                .is_some_and(|at| now.duration_since(*at) < interval)
        });
        if recently {
            continue;
        }
        // The channel was validated by the setting's check hook. pg_notify queues
        // the notification in the transaction's pending list, which
        // PreCommit_Notify (run after this callback) writes to the queue.
        crate::pg::xact::notify(&channel, &payload(&kinds));
        LAST_RUNG.with(|last| last.borrow_mut().insert(channel, now));
    }
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use crate::testing::{int8, sqlstate_of};
    use pgrx::prelude::*;

    #[pg_test]
    fn publish_returns_increasing_ids_in_the_callers_transaction() {
        let a = int8("SELECT envelopes.publish('orders.created', '\\x01')");
        let b = int8("SELECT envelopes.publish('orders.created', '\\x02', '{\"k\": \"v\"}')");
        assert!(b > a);
        assert_eq!(
            int8(&format!(
                "SELECT count(*) FROM envelopes.outbox
                  WHERE id IN ({a}, {b}) AND headers IN ('{{}}', '{{\"k\": \"v\"}}')"
            )),
            2
        );
        // The transaction holds the outbox marker, naming a value below its ids.
        let marked = int8(
            "SELECT count(*) FROM pg_catalog.pg_locks
              WHERE locktype = 'advisory' AND objsubid = 17669 AND pid = pg_backend_pid()",
        );
        assert_eq!(marked, 1);
    }

    #[pg_test]
    fn subjects_valid_on_every_bus_are_accepted() {
        for subject in ["orders.created", "a", "a-b_c.d/e", "ünïcode.ok", "x.1.2.3"] {
            let sql = format!("SELECT envelopes.publish('{subject}', '\\x01')");
            assert_eq!(sqlstate_of(&sql), None, "{sql}");
        }
    }

    #[pg_test]
    fn publish_rejects_bad_input_with_sqlstates_and_writes_nothing() {
        Spi::run("SET LOCAL envelopes.max_publish_bytes = 4").unwrap();
        let long = "x".repeat(super::MAX_SUBJECT_BYTES + 1);
        let cases = [
            ("NULL, '\\x01'".to_owned(), "22004"),
            ("'', '\\x01'".to_owned(), "22023"),
            ("'a b', '\\x01'".to_owned(), "22023"),
            ("'a..b', '\\x01'".to_owned(), "22023"),
            ("'.a', '\\x01'".to_owned(), "22023"),
            ("'a.', '\\x01'".to_owned(), "22023"),
            ("'a.*', '\\x01'".to_owned(), "22023"),
            ("'a.>', '\\x01'".to_owned(), "22023"),
            ("'a/+/b', '\\x01'".to_owned(), "22023"),
            ("'a/#', '\\x01'".to_owned(), "22023"),
            (format!("'{long}', '\\x01'"), "22001"),
            ("'s', NULL".to_owned(), "22004"),
            ("'s', '\\x0102030405'".to_owned(), "22001"),
            ("'s', '\\x01', '[1]'".to_owned(), "22023"),
            ("'s', '\\x01', NULL".to_owned(), "22004"),
        ];
        for (args, expected) in cases {
            let sql = format!("SELECT envelopes.publish({args})");
            assert_eq!(sqlstate_of(&sql).as_deref(), Some(expected), "{sql}");
        }
        assert_eq!(int8("SELECT count(*) FROM envelopes.outbox"), 0);
    }

    #[pg_test]
    fn notify_channel_setting_rejects_names_postgres_would_refuse() {
        assert_eq!(
            sqlstate_of("SET envelopes.notify_channel = ''").as_deref(),
            Some("22023")
        );
        let long = format!("SET envelopes.notify_channel = '{}'", "c".repeat(64));
        assert_eq!(sqlstate_of(&long).as_deref(), Some("22023"));
        assert_eq!(
            sqlstate_of("SET envelopes.notify_channel = 'ok_channel'"),
            None
        );
    }
}
