//! `publish()` and the statement trigger that rings the doorbell; the outbox
//! and the doorbell themselves are [`crate::store::outbox`].

use crate::error::OrRaise;
use crate::gucs;
use crate::store::outbox::{self, publish_row, OutboxError};
use pgrx::datum::JsonB;
use pgrx::prelude::*;

/// Writes a message into `envelopes.outbox` inside the caller's transaction and
/// returns its id. It is delivered by the bridge only if the transaction commits.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(pg_catalog, pg_temp)]
fn publish(
    subject: Option<&str>,
    payload: Option<&[u8]>,
    headers: default!(Option<JsonB>, "'{}'"),
) -> i64 {
    publish_row(subject, payload, headers).or_raise()
}

/// Statement-level trigger on the envelope and outbox tables: notes the change for
/// the transaction's single notification (nothing when `envelopes.notify = off`,
/// for bulk loads), and tells the change feed about envelopes written around the
/// insert functions (see `crate::store::feed`).
#[pg_trigger]
fn notify_on_insert<'a>(
    trigger: &'a pgrx::PgTrigger<'a>,
) -> Result<Option<PgHeapTuple<'a, pgrx::AllocatedByPostgres>>, OutboxError> {
    let kind = match trigger
        .extra_args()
        .map_err(|_| OutboxError::BadTrigger)?
        .first()
        .map(String::as_str)
    {
        Some("envelopes") => "envelopes",
        Some("outbox") => "outbox",
        _ => return Err(OutboxError::BadTrigger),
    };
    if kind == "envelopes" {
        crate::store::feed::meta_written();
    }
    if gucs::notify() {
        outbox::ring(kind);
    }
    Ok(None)
}
