//! pg_envelopes: a partitioned store for message envelopes from many originator
//! nodes, with on-demand partition creation, cursor reads and a NOTIFY outbox.
//!
//! This file only declares the modules, loads the hand-written DDL and registers
//! what a backend needs when the library is loaded. See the README for the SQL
//! surface and the reasons behind the choices.
//!
//! # Layers
//!
//! The code is in three layers, each calling only the one below it:
//!
//! - [`api`], the **SQL surface**: every `#[pg_extern]`, trigger and SQL
//!   definition, argument checks, set-returning plumbing, who may act for whom.
//!   Nothing imports it. It touches no Postgres internals (no `pg_sys`): it
//!   checks what the caller gave and hands plain values to the store.
//! - [`store`], the **envelope store**: partitions (routing, creation, the
//!   catalog and its cache), the write path, reads and scans of the bands, the
//!   change feed, consumers, the outbox, leases and retention. It calls the glue,
//!   and reads `pg_sys` types and constants, but writes no `unsafe` code:
//!   `#![deny(unsafe_code)]` on [`store`] and [`api`] makes the compiler refuse
//!   it, except in the modules still to move behind the glue, each marked with
//!   `#[allow(unsafe_code)]` where it is declared (`grep -rn 'allow(unsafe_code)'
//!   src/store src/api` lists them).
//! - [`pg`], the **Postgres glue**: relation guards, scans and tuple layout,
//!   snapshots, locks and their order, the background-worker runner, catalog
//!   invalidation, shared memory, roles and privileges, the definer switch.
//!   It imports nothing of the extension but [`error`] and itself.
//!
//! [`error`] (errors and their SQLSTATEs) and [`gucs`] (settings) serve every
//! layer; [`gucs`] too is `#![deny(unsafe_code)]`, with what it needs of the GUC
//! machinery in `pg::guc`, so outside tests `unsafe` blocks are written in
//! [`pg`] alone. `grep -rn 'crate::api' src/store src/pg` and `grep -rn 'crate::store'
//! src/pg` find nothing, and `grep -rn pg_sys src/api` finds nothing: that is
//! the rule, checked in one line each.

#![deny(unsafe_op_in_unsafe_fn)]

use pgrx::prelude::*;

mod api;
mod error;
mod gucs;
mod pg;
mod store;
#[cfg(any(test, feature = "pg_test"))]
mod testing;

::pgrx::pg_module_magic!(name, version);

// Tables and the view come first: the functions below refer to them by name.
pgrx::extension_sql_file!("../sql/storage.sql", name = "storage", bootstrap);
// The view over meta and blob, which looks each row's bytes up by key.
pgrx::extension_sql_file!(
    "../sql/view.sql",
    name = "view",
    requires = ["storage", api::reads::envelope_of]
);
// Partition listing and retention, in SQL and PL/pgSQL over the tables above.
pgrx::extension_sql_file!(
    "../sql/retention.sql",
    name = "retention",
    requires = [
        "storage",
        api::partitions::_prune_guard,
        api::reads::_stored_maxima
    ]
);
// The outbox and its doorbell triggers.
pgrx::extension_sql_file!(
    "../sql/outbox.sql",
    name = "outbox_tables",
    requires = ["storage", api::outbox::notify_on_insert]
);
// Consumers: positions, acknowledgements, dead letters, status.
pgrx::extension_sql_file!(
    "../sql/consumer.sql",
    name = "consumers",
    requires = [
        "storage",
        "outbox_tables",
        api::feed::originator_ceilings,
        api::feed::forget_high_water_marks,
        api::consumer::consumer_envelopes_pending,
        api::roles::_acts_for,
        api::roles::_consumer_owner_check,
        api::lease::_lease_take,
        api::lease::_lease_release,
        api::lease::_lease_check
    ]
);

// Positions of ingress consumers (bus -> store).
pgrx::extension_sql_file!(
    "../sql/ingress.sql",
    name = "ingress_positions",
    requires = [
        "storage",
        api::roles::_acts_for,
        api::roles::_caller,
        api::lease::_lease_take,
        api::lease::_lease_release,
        api::lease::_lease_check
    ]
);

// The maintenance worker's record of its runs, and their status.
pgrx::extension_sql_file!(
    "../sql/maintenance.sql",
    name = "maintenance",
    requires = ["storage"]
);

// Roles: grant_writer / grant_reader / grant_consumer and their revoke_ twins.
pgrx::extension_sql_file!(
    "../sql/roles.sql",
    name = "roles",
    requires = [
        "storage",
        "retention",
        "maintenance",
        "outbox_tables",
        "consumers",
        "ingress_positions",
        "select_gateway_envelopes",
        "select_by_topic_cursors",
        "select_wave",
        "select_newest_by_topic",
        "select_originator",
        "originator_maxima",
        "view"
    ]
);
// The xmtpd layer: xmtpd's queries by name, over the functions above.
pgrx::extension_sql_file!(
    "../sql/xmtpd.sql",
    name = "xmtpd",
    requires = [
        "retention",
        "select_gateway_envelopes",
        "select_by_topic_cursors",
        "select_wave",
        "select_newest_by_topic",
        "select_originator",
        "originator_maxima",
        api::insert::insert_gateway_envelope,
        api::insert::insert_gateway_envelopes_keys,
        api::partitions::ensure_gateway_parts,
        api::partitions::prune_expired_below
    ]
);
// Last: nothing is usable by PUBLIC until granted.
pgrx::extension_sql_file!("../sql/privileges.sql", name = "privileges", finalize);

/// Runs once per process when Postgres loads the library.
#[pg_guard]
pub extern "C-unwind" fn _PG_init() {
    error::no_backtraces();
    gucs::init();
    store::partition::cache::register_invalidation_callback();
    store::register_jobs();
    // Only when preloaded (shared_preload_libraries): the maintenance launcher.
    store::maintenance::launcher::register();
}

/// Required by `cargo pgrx test`: hooks for the throwaway test cluster.
#[cfg(test)]
pub mod pg_test {
    pub fn setup(_options: Vec<&str>) {}

    /// `#[pg_test]`s never commit: they run with creation in the test's own
    /// transaction, so each test's partitions vanish with it. The worker mode,
    /// which commits partitions on its own, is tested over real connections in
    /// the `tests/` crate.
    #[must_use]
    pub fn postgresql_conf_options() -> Vec<&'static str> {
        vec!["envelopes.create_partitions_in = 'transaction'"]
    }
}
