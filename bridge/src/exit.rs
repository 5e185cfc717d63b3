//! The process' exit codes, in one place, for the service manager that reads
//! them.
//!
//! - 0: stopped cleanly (SIGTERM/SIGINT: the batch in hand finished);
//! - 1 ([`FAILURE`]): a failure at start (the metrics address taken, the
//!   runtime, the signal handlers), or a one-shot command that failed;
//! - 2: a usage error (an option, a sink or source URL the bridge does not
//!   serve), as clap reports it;
//! - 78 ([`CONFIG`], sysexits.h's EX_CONFIG): a configuration the servers refuse
//!   before the bridge ever worked (a wrong password, a missing database, role
//!   or extension, an unknown consumer, a privilege the role lacks (42501), a
//!   refused AMQP login or vhost, a bad --config file); also `status` and
//!   `register` when the database refuses them so, and `watch` when the bus
//!   refuses its credentials or virtual host;
//! - 128 + the signal's number: a second SIGTERM/SIGINT (exit at once, see
//!   `shutdown.rs`).
//!
//! Never 101: no failed write to stdout or stderr panics.

/// A failure at start.
pub const FAILURE: i32 = 1;
/// A configuration the servers refuse (sysexits.h's EX_CONFIG): restarting does
/// not help; a service manager should not (`RestartPreventExitStatus=78`).
pub const CONFIG: i32 = 78;
