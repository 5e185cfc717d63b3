//! The SQL surface: every function, trigger and SQL definition the extension
//! installs, with its arguments checked. Each entry point refuses bad input with
//! a specific SQLSTATE, then hands plain Rust values to the store
//! ([`crate::store`]), whose errors it raises. Nothing else imports this layer,
//! and it touches no Postgres internals itself.

#![deny(unsafe_code)]

pub mod args;
pub mod consumer;
pub mod feed;
pub mod insert;
pub mod lease;
pub mod outbox;
mod packed;
pub mod partitions;
pub mod reads;
pub mod roles;
