//! Pruning in a background worker: the job's payload (the bands as
//! [`Entry`]s, written back one by one as each is done), the caller's wait for
//! it, and the band-by-band loop the worker and the maintenance worker run,
//! each step in a transaction of its own.

use super::band::{delete_expired, list_bands, try_drop, Entry, ENTRY_BYTES};
use super::PruneError;
use crate::error::{OrRaise, PgSqlErrorCode};
use crate::pg::worker::{self, Header};
use pgrx::pg_sys::{self, Oid};
use pgrx::prelude::*;

/// The kind of the pruning worker's job (see [`worker::on_job`]).
pub const JOB_KIND: u32 = 2;

/// Bytes of the job's fixed part: cutoff, lock_timeout_ms, the oid of
/// `envelopes.late_envelopes` (looked up once by the caller), the entry count;
/// the entries follow.
const JOB_FIXED_BYTES: usize = 8 + 4 + 4 + 4;

fn encode_job(entries: &[Entry], cutoff: i64, lock_timeout_ms: i32, late: Oid) -> worker::Fields {
    let mut fields = worker::Fields::with_capacity(JOB_FIXED_BYTES + entries.len() * ENTRY_BYTES);
    fields
        .i64(cutoff)
        .i32(lock_timeout_ms)
        .u32(late.to_u32())
        .u32(entries.len() as u32);
    for entry in entries {
        entry.encode(&mut fields);
    }
    fields
}

/// The job's fields and entries, `None` when the bytes are not a whole job.
fn decode_job(bytes: &[u8]) -> Option<(i64, i32, Oid, Vec<Entry>)> {
    let mut r = worker::Fields::reader(bytes);
    let (cutoff, timeout, late, count) = (r.i64()?, r.i32()?, Oid::from(r.u32()?), r.u32()?);
    let entries = (0..count)
        .map(|_| Entry::decode(&mut r))
        .collect::<Option<Vec<_>>>()?;
    Some((cutoff, timeout, late, entries))
}

/// Runs the bands through a worker. `Ok(Err(why))` asks the caller to prune in
/// its own transaction: no worker could start, or it stopped before touching a
/// band (it could not connect).
pub(super) fn run_in_worker(
    entries: &mut [Entry],
    cutoff: i64,
    lock_timeout_ms: i32,
    late: Oid,
) -> Result<Result<(), &'static str>, PruneError> {
    let payload = encode_job(entries, cutoff, lock_timeout_ms, late);
    let job = worker::Job::create(JOB_KIND, Header::of_caller(), payload.bytes());
    let total = entries.len() as u32;
    let Some(running) = job.launch(
        "pg_envelopes pruner",
        crate::gucs::partition_worker_timeout(),
    ) else {
        job.close();
        return Ok(Err("no background worker slot was free"));
    };
    if let worker::Stop::PostmasterDied = worker::wait_for(running, None) {
        return Err(PruneError::WorkerLost {
            processed: job.progress() as u32,
            total,
        });
    }
    let processed = job.progress() as u32;
    // The worker has stopped: what it did to each entry is in the payload.
    match decode_job(&job.payload()) {
        Some((_, _, _, done)) if done.len() == entries.len() => entries.copy_from_slice(&done),
        _ => {
            job.close();
            return Err(PruneError::WorkerLost { processed, total });
        }
    }
    let outcome = match job.outcome() {
        Some(Ok(())) => Ok(Ok(())),
        Some(Err((sqlstate, message))) => Err(PruneError::WorkerFailed { sqlstate, message }),
        None if processed == 0 => Ok(Err("the worker stopped before it started")),
        None => Err(PruneError::WorkerLost { processed, total }),
    };
    job.close();
    outcome
}

/// The pruning worker's job (see [`worker::on_job`]): each band's deletion,
/// then its drop, in transactions of their own; what was done to each band is
/// written back to its entry in the payload as soon as it is done.
pub fn run_job(job: &mut worker::AttachedJob) {
    let Some((cutoff, timeout, late, mut entries)) = decode_job(&job.payload()) else {
        job.finish(Err((
            PgSqlErrorCode::ERRCODE_INTERNAL_ERROR as i32,
            "malformed pruning job".into(),
        )));
        return;
    };
    job.header().connect();
    let mut handled = 0usize;
    let failure = prune_bands(
        &mut entries,
        cutoff,
        timeout,
        late,
        || job.header().caller_ended(),
        |entry| {
            let mut fields = worker::Fields::with_capacity(ENTRY_BYTES);
            entry.encode(&mut fields);
            job.write_payload_at(JOB_FIXED_BYTES + handled * ENTRY_BYTES, fields.bytes());
            handled += 1;
            job.set_progress(handled as u64);
        },
    );
    job.finish(failure.map_or(Ok(()), Err));
}

/// For a worker outside any transaction: deletes each band's expired rows and
/// drops the band if it may be, each step in a transaction of its own, until
/// `stop()` says the work is no longer wanted (then a 57014 failure) or a step
/// fails (its SQLSTATE and message). `done()` is told each band handled.
pub(super) fn prune_bands(
    entries: &mut [Entry],
    cutoff: i64,
    timeout: i32,
    late: Oid,
    mut stop: impl FnMut() -> bool,
    mut done: impl FnMut(&Entry),
) -> Option<(i32, String)> {
    for entry in entries.iter_mut() {
        if stop() {
            return Some((
                PgSqlErrorCode::ERRCODE_QUERY_CANCELED as i32,
                "the session that asked for pruning is gone".to_owned(),
            ));
        }
        let droppable = entry.droppable;
        let deleted = worker::in_own_transaction(|| {
            worker_settings(timeout);
            delete_expired(entry, cutoff, late).or_raise()
        });
        let result = match deleted {
            // A lock wait that outlasted lock_timeout_ms after all, or a band
            // dropped since it was listed: leave it for the next run.
            Err((code, _))
                if code == PgSqlErrorCode::ERRCODE_LOCK_NOT_AVAILABLE as i32
                    || code == PgSqlErrorCode::ERRCODE_UNDEFINED_TABLE as i32 =>
            {
                Ok(())
            }
            Err(e) => Err(e),
            Ok(()) if droppable => worker::in_own_transaction(|| {
                worker_settings(timeout);
                try_drop(entry, timeout).or_raise()
            }),
            Ok(()) => Ok(()),
        };
        if let Err(e) = result {
            return Some(e);
        }
        done(entry);
    }
    None
}

/// What [`prune_here`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Pruned {
    pub rows_deleted: i64,
    pub bands_dropped: i64,
}

/// For a background worker outside any transaction (the maintenance worker):
/// what `prune_expired()` does, with the current time as the cutoff, run here
/// rather than in a worker of its own. The bands are listed in one transaction,
/// then each is pruned in transactions of its own (see [`prune_bands`]). What was
/// done up to a failure is returned with it.
pub fn prune_here(lock_timeout_ms: i32) -> (Pruned, Option<(i32, String)>) {
    let mut listed = None;
    let listing = worker::in_own_transaction(|| {
        worker_settings(lock_timeout_ms);
        let cutoff = Spi::get_one::<i64>(
            "SELECT pg_catalog.floor(EXTRACT(epoch FROM pg_catalog.now()))::bigint",
        )
        .map_err(PruneError::from)
        .or_raise()
        .unwrap_or(0);
        let late = Spi::get_one::<Oid>(
            "SELECT 'envelopes.late_envelopes'::pg_catalog.regclass::pg_catalog.oid",
        )
        .map_err(PruneError::from)
        .or_raise()
        .unwrap_or(pg_sys::InvalidOid);
        listed = Some((list_bands().or_raise(), cutoff, late));
    });
    let (mut entries, cutoff, late) = match (listing, listed) {
        (Ok(()), Some(listed)) => listed,
        (Err((code, message)), _) => {
            return (
                Pruned::default(),
                Some((code, format!("listing the bands: {message}"))),
            )
        }
        (Ok(()), None) => return (Pruned::default(), None),
    };
    let failure = prune_bands(
        &mut entries,
        cutoff,
        lock_timeout_ms.max(1),
        late,
        || false,
        |_| {},
    );
    let pruned = Pruned {
        rows_deleted: entries.iter().map(|e| e.deleted).sum(),
        bands_dropped: entries.iter().filter(|e| e.dropped).count() as i64,
    };
    (pruned, failure)
}

/// The settings of each of the worker's transactions: a pinned search_path (its
/// SQL names everything schema-qualified, and operators resolve in pg_catalog),
/// and a lock_timeout bounding any lock wait the statements still meet (the
/// table and row locks they need are asked for without waiting; this bounds the
/// rest, such as catalog and index locks).
pub(super) fn worker_settings(lock_timeout_ms: i32) {
    Spi::run("SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true)")
        .and_then(|()| {
            Spi::run_with_args(
                "SELECT pg_catalog.set_config('lock_timeout', $1, true)",
                &[format!("{}ms", lock_timeout_ms.max(1)).into()],
            )
        })
        .unwrap_or_else(|e| error!("could not configure the pruning transaction: {e}"));
}
