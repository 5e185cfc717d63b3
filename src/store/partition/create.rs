//! Creating a missing band: under the per-database creation lock, in the caller's
//! transaction or in a background worker, both through [`create_locked`], which
//! looks once more under the lock and creates only what is still missing.
//!
//! Created in the caller's transaction, a partition's DDL locks (the creation
//! advisory lock, SHARE UPDATE EXCLUSIVE on the parent) would be held until the
//! caller commits, so one caller that keeps its transaction open stalls every
//! other session that needs a new partition. Instead the inserting backend hands
//! the creation to a worker ([`crate::pg::worker`]) that connects to the same
//! database as the same role, creates the partitions under the creation lock in
//! a transaction of its own and commits; the caller waits on its latch
//! (interruptibly, with a deadline) and then uses the new tables. A partition
//! created this way stays even if the caller later rolls back, which is
//! harmless: it is empty. The worker retries DDL that hits `lock_timeout`, and
//! before committing checks that the caller's transaction is still alive. When
//! no worker slot is free, the caller waits for one (workers live for
//! milliseconds, so slots free up quickly) up to
//! `envelopes.partition_worker_timeout`, and only then falls back to creating in
//! its own transaction, and logs it.

use super::band::{Band, Table};
use super::{cache, catalog, catch_up, roots, PartitionError};
use crate::gucs;
use crate::pg::locks;
use crate::pg::worker::{self, Header, Stop};
use pgrx::prelude::*;
use std::cell::Cell;
use std::time::{Duration, Instant};

/// How many times a session waits for another session's worker creating the same
/// band, looking again after each, before starting a worker of its own.
const SHARED_WORKER_WAITS: usize = 3;

/// One creation attempt, in a worker or in the caller's transaction.
pub(super) fn create(node: i32, seq: i64, width: i64) -> Result<(), PartitionError> {
    // A transaction that already created partitions itself holds the creation
    // lock: a worker would wait for it forever, so keep creating here.
    let in_worker = crate::gucs::create_partitions_in() == crate::gucs::CreatePartitionsIn::Worker
        && !locks::holds_partition_creation_lock();
    if !in_worker {
        return create_in_transaction(node, seq, width);
    }
    match create_in_one_worker(node, seq, width)? {
        Ok(()) => Ok(()),
        Err(fallback) => {
            pgrx::log!(
                "pg_envelopes: partition worker unavailable ({fallback:?}); creating the \
                 partition for originator {node}, sequence {seq} in the inserting transaction"
            );
            create_in_transaction(node, seq, width)
        }
    }
}

/// Creates the band in a worker, unless another session is already doing that for
/// the same band: then waits for it and uses its result. Sessions crossing into a
/// new band together start one worker, not one each.
fn create_in_one_worker(
    node: i32,
    seq: i64,
    width: i64,
) -> Result<Result<(), Fallback>, PartitionError> {
    let start = Band::containing(seq, width)?.start;
    for _ in 0..SHARED_WORKER_WAITS {
        if locks::try_lock_band_launch(node, start) {
            let result = create_in_worker(node, seq, width);
            locks::unlock_band_launch(node, start);
            return result;
        }
        locks::wait_for_band_launch(node, start);
        if catch_up(node, seq)? {
            return Ok(Ok(()));
        }
    }
    create_in_worker(node, seq, width)
}

/// The job a creation worker runs (travels in its payload, see [`worker::Job`]).
struct Job {
    node: i32,
    seq: i64,
    width: i64,
    lock_timeout_ms: i32,
    attempts: i32,
}

/// The kind of job a creation worker runs (see [`worker::on_job`]).
pub const JOB_KIND: u32 = 1;

impl Job {
    fn encode(&self) -> worker::Fields {
        let mut fields = worker::Fields::with_capacity(28);
        fields
            .i32(self.node)
            .i64(self.seq)
            .i64(self.width)
            .i32(self.lock_timeout_ms)
            .i32(self.attempts);
        fields
    }

    fn decode(bytes: &[u8]) -> Option<Job> {
        let mut r = worker::Fields::reader(bytes);
        Some(Job {
            node: r.i32()?,
            seq: r.i64()?,
            width: r.i64()?,
            lock_timeout_ms: r.i32()?,
            attempts: r.i32()?,
        })
    }
}

/// Why the caller should create in its own transaction instead.
#[derive(Debug)]
pub enum Fallback {
    /// No background worker slot was free.
    NoSlot,
    /// The worker stopped without reporting (it could not connect, e.g. the role
    /// cannot log in).
    NoReport,
}

/// Creates the partitions for `(node, seq)` in a background worker and waits for
/// it. `Ok(Err(fallback))` asks the caller to create them itself.
fn create_in_worker(
    node: i32,
    seq: i64,
    width: i64,
) -> Result<Result<(), Fallback>, PartitionError> {
    let params = Job {
        node,
        seq,
        width,
        lock_timeout_ms: gucs::partition_lock_timeout_ms(),
        attempts: gucs::partition_lock_attempts(),
    };
    let job = worker::Job::create(JOB_KIND, Header::of_caller(), params.encode().bytes());
    // No slot free: slots free up as other workers finish (each of ours runs for
    // milliseconds), so wait a moment for one before giving up (see SLOT_WAIT).
    let wait = gucs::partition_worker_timeout();
    let Some(running) = job.launch(
        "pg_envelopes partition creator",
        wait.min(worker::SLOT_WAIT),
    ) else {
        job.close();
        return Ok(Err(Fallback::NoSlot));
    };
    match worker::wait_for(running, Some(Instant::now() + wait)) {
        Stop::Stopped => {}
        Stop::PostmasterDied => {
            return Err(PartitionError::WorkerLost("the postmaster died".into()));
        }
        Stop::TimedOut => return Err(PartitionError::WorkerTimeout(wait)),
    }
    let outcome = match job.outcome() {
        Some(Ok(())) => Ok(Ok(())),
        Some(Err((sqlstate, message))) => Err(PartitionError::WorkerFailed { sqlstate, message }),
        None => Ok(Err(Fallback::NoReport)),
    };
    job.close();
    outcome
}

/// The creation worker's job (see [`worker::on_job`]): create what is missing,
/// retrying DDL that hits `lock_timeout`, and report.
pub fn run_job(attached: &mut worker::AttachedJob) {
    catalog::skip_band_checks();
    let Some(job) = Job::decode(&attached.payload()) else {
        attached.finish(Err((
            PgSqlErrorCode::ERRCODE_INTERNAL_ERROR as i32,
            "malformed partition creation job".into(),
        )));
        return;
    };
    attached.header().connect();
    let mut result = Err((0, String::new()));
    for attempt in 1..=job.attempts.max(1) {
        result = worker::in_own_transaction(|| create_once(&job, attached.header()));
        let lock_timeout = PgSqlErrorCode::ERRCODE_LOCK_NOT_AVAILABLE as i32;
        if !matches!(&result, Err((code, _)) if *code == lock_timeout) || attempt == job.attempts {
            break;
        }
        std::thread::sleep(Duration::from_millis(20 * u64::from(attempt as u32)));
    }
    attached.finish(result);
}

/// One attempt, in a transaction of its own (see [`worker::in_own_transaction`]):
/// create what is missing under the creation lock, and commit only if the caller
/// is still waiting for it.
fn create_once(job: &Job, header: &Header) {
    Spi::run(&format!(
        "SET LOCAL lock_timeout = {}",
        job.lock_timeout_ms.max(1)
    ))
    .unwrap_or_else(|e| error!("could not set lock_timeout: {e}"));
    locks::lock_partition_creation();
    if let Err(e) = create_locked(job.node, job.seq, job.width) {
        crate::error::OrRaise::or_raise(Err::<(), _>(e));
    }
    if header.caller_ended() {
        error!("the session that asked for this partition is gone; not creating it");
    }
}

/// Creates the partitions in the caller's transaction, under the creation lock,
/// which then stays held until that transaction ends.
fn create_in_transaction(node: i32, seq: i64, width: i64) -> Result<(), PartitionError> {
    let newly_locked = locks::lock_partition_creation();
    if catch_up(node, seq)? {
        // Someone else created it and nothing was done under the lock: hand it on
        // now rather than at commit, so other waiters need not wait for us.
        if newly_locked {
            locks::unlock_partition_creation();
        }
        return Ok(());
    }
    forget_cache_on_abort();
    // Bound the DDL's own lock waits (the parent's SHARE UPDATE EXCLUSIVE); the
    // caller's setting comes back afterwards.
    let caller_timeout =
        Spi::get_one::<String>("SELECT pg_catalog.current_setting('lock_timeout')")?
            .unwrap_or_else(|| "0".into());
    Spi::run_with_args(
        "SELECT pg_catalog.set_config('lock_timeout', $1, true)",
        &[format!("{}ms", crate::gucs::partition_lock_timeout_ms()).into()],
    )?;
    let created = create_locked(node, seq, width);
    Spi::run_with_args(
        "SELECT pg_catalog.set_config('lock_timeout', $1, true)",
        &[caller_timeout.into()],
    )?;
    created
}

/// With the creation lock held: looks again, and creates what is still missing.
/// Shared by the caller's-transaction path and the worker.
fn create_locked(node: i32, seq: i64, width: i64) -> Result<(), PartitionError> {
    if catch_up(node, seq)? {
        return Ok(());
    }
    create_missing(node, seq, Band::containing(seq, width)?)
}

/// Creates whatever part of `(node, seq)`'s partitions is missing in either table.
fn create_missing(node: i32, seq: i64, desired: Band) -> Result<(), PartitionError> {
    let roots = roots()?;
    let mut loaded = Vec::with_capacity(2);
    for table in Table::ALL {
        let parts = match catalog::load_originator(table, node, roots[table as usize])? {
            Some(parts) => parts,
            None => {
                catalog::create_originator(table, node)?;
                cache::OriginatorParts::default()
            }
        };
        loaded.push((table, parts));
    }
    let existing: Vec<_> = loaded
        .iter()
        .flat_map(|(_, parts)| parts.bands.iter().map(|(bound, _)| *bound))
        .collect();
    let target = catalog::plan_band(seq, desired, &existing);
    for (table, parts) in &loaded {
        if parts.leaf_for(seq).is_none() {
            catalog::create_band(*table, node, &target)?;
        }
    }
    Ok(())
}

thread_local! {
    /// Local transaction id of the last transaction that registered the abort hook.
    static ABORT_HOOK_FOR: Cell<u32> = const { Cell::new(0) };
}

/// Partitions created in a transaction that aborts disappear; make sure the cache
/// forgets them too (relcache invalidation normally does, this is the backstop).
fn forget_cache_on_abort() {
    let lxid = crate::pg::xact::local_xid();
    if ABORT_HOOK_FOR.replace(lxid) != lxid {
        pgrx::register_xact_callback(pgrx::PgXactCallbackEvent::Abort, cache::forget_all);
    }
}
