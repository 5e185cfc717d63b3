//! When and how to try again — one policy for the whole bridge: which failures
//! are worth retrying ([`classify`]), how long to wait between attempts
//! ([`backoff`]: exponential, 100 ms to 5 s, jittered), and the round loop that
//! applies both to every sink's publishing in egress and to ingress
//! ([`driver`]).

mod backoff;
mod classify;
mod driver;

#[cfg(test)]
pub use backoff::FIRST_DELAY;
pub use backoff::{refusal_delay, Backoff};
pub use classify::{Class, DbFailure, Fatal};
pub use driver::{Driver, Failure, Next, Wait};
