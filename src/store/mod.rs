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

pub mod consumer;
pub mod feed;
pub mod lease;
pub mod maintenance;
pub mod outbox;
pub mod partition;
pub mod read;
pub mod retention;
pub mod write;
