//! The envelope store: what the extension keeps and how, in Postgres' terms but
//! without the SQL surface.
//!
//! [`partition`]: the bands (arithmetic, names, the known-partition cache, the
//! catalog, creation); [`write`]: the insert path; [`read`]: envelope rows out
//! of the band leaves and the read functions' bodies; [`feed`]: the change feed
//! (in-flight markers, clocks, high-water marks, the gate and the ceilings);
//! [`consumer`]: consumers' positions and batches; [`outbox`]: `publish` and
//! the doorbell; [`lease`]: one active bridge per name; [`retention`]: pruning;
//! [`maintenance`]: the background worker that prunes and creates bands ahead.
//! The store calls the Postgres glue ([`crate::pg`]), never the SQL surface.

#![deny(unsafe_code)]

pub mod consumer;
pub mod feed;
pub mod lease;
pub mod maintenance;
pub mod outbox;
pub mod partition;
pub mod read;
pub mod retention;
pub mod write;

/// Has the background workers' jobs run by the store's handlers: partition
/// creation, pruning, a maintenance run (see [`crate::pg::worker::on_job`]).
/// From `_PG_init`, in every process that loads the library.
pub fn register_jobs() {
    use crate::pg::worker::on_job;
    on_job(partition::JOB_KIND, partition::run_creation_job);
    on_job(retention::JOB_KIND, retention::run_job);
    on_job(
        maintenance::launcher::JOB_KIND,
        maintenance::launcher::run_job,
    );
}
