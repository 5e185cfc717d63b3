//! Change clocks: counters in shared memory that writers bump when they start
//! writing to an originator, so that an idle consumer can tell in constant time
//! that nothing it has not seen can have committed since its last read.
//!
//! There are [`BUCKETS`] counters, originator `n` using bucket `n % BUCKETS`, and
//! one more for transactions that mark every originator at once. A writer bumps
//! its bucket *after* taking its in-flight marker; a reader samples the counters
//! *before* reading the markers. So if a bucket has not moved since a read that
//! found an originator with no marker and nothing left to read, no transaction
//! has started writing to that originator since, and its next read would return
//! nothing: the consumer skips it without touching a table (see `consumer.rs`).
//!
//! The counters live in shared memory ([`crate::pg::shmem`]); without room for them,
//! consumers read every originator each time (correct, only slower).

use crate::pg::shmem::{shared_struct, Lazy};
use std::sync::atomic::{AtomicU64, Ordering};

/// Number of originator buckets.
pub const BUCKETS: usize = 1024;

/// Index of the counter bumped by a transaction that marks every originator.
pub const ALL: usize = BUCKETS;

shared_struct! {
    struct Clocks {
        counters: [AtomicU64; BUCKETS + 1],
    }
}

/// Name of the shared memory structure; the version suffix changes if its layout
/// ever does.
const SHMEM_NAME: &std::ffi::CStr = c"pg_envelopes change clocks v1";

thread_local! {
    static CLOCKS: Lazy<Clocks> = const { Lazy::new() };
}

fn shared() -> Option<&'static Clocks> {
    CLOCKS.with(|clocks| clocks.get(SHMEM_NAME))
}

/// Bucket of originator `node`.
pub fn bucket(node: i32) -> usize {
    (node as u32 as usize) % BUCKETS
}

/// Records that a transaction started writing to `node`.
pub fn bump(node: i32) {
    if let Some(clocks) = shared() {
        clocks.counters[bucket(node)].fetch_add(1, Ordering::SeqCst);
    }
}

/// Records that a transaction started writing to every originator at once.
pub fn bump_all() {
    if let Some(clocks) = shared() {
        clocks.counters[ALL].fetch_add(1, Ordering::SeqCst);
    }
}

/// All counters as of now, or `None` when the clocks are unavailable.
pub fn sample() -> Option<Vec<u64>> {
    let clocks = shared()?;
    Some(
        clocks
            .counters
            .iter()
            .map(|c| c.load(Ordering::SeqCst))
            .collect(),
    )
}
