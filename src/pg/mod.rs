//! The Postgres glue: safe wrappers around what the rest of the extension needs
//! from the server's internals, and nothing of the envelope store itself.
//!
//! Everything that dereferences Postgres' structures for the store lives here:
//! scans through an index or the executor with a chosen snapshot ([`scan`],
//! [`executor`]) and the heap tuple layout they read and write ([`tuple`]);
//! snapshots taken at a chosen moment ([`snapshot`]); the advisory locks and
//! their order ([`locks`]); the background-worker runner ([`worker`]); catalog
//! invalidation ([`invalidation`]); shared memory ([`shmem`]); the caller's
//! transaction state ([`xact`]) and the pinned `search_path` ([`definer`]);
//! result sets in materialize mode ([`srf`]); placeholders, value parsing and
//! checked string settings for the settings module ([`guc`]). Modules here
//! import nothing of the extension but [`crate::error`] and each other.

pub mod acl;
pub mod catalog;
pub mod compat;
pub mod definer;
pub mod executor;
pub mod guc;
pub mod heap_writer;
pub mod invalidation;
pub mod locks;
pub mod rel;
pub mod scan;
pub mod shmem;
pub mod slot;
pub mod snapshot;
pub mod srf;
pub mod tuple;
pub mod worker;
pub mod xact;
