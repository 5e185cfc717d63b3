//! pg_envelopes: a partitioned store for message envelopes from many originator
//! nodes, with on-demand partition creation, cursor reads and a NOTIFY outbox.
//!
//! This file only declares the modules, loads the hand-written DDL and registers
//! what a backend needs when the library is loaded. See the README for the SQL
//! surface and ../DESIGN (docs/) for the reasons behind the choices.

#![deny(unsafe_op_in_unsafe_fn)]

use pgrx::prelude::*;

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
    requires = ["storage", store::read::lookup::envelope_of]
);
// Partition listing and retention, in SQL and PL/pgSQL over the tables above.
pgrx::extension_sql_file!(
    "../sql/retention.sql",
    name = "retention",
    requires = ["storage", store::partition::_prune_guard]
);
// The outbox and its doorbell triggers.
pgrx::extension_sql_file!(
    "../sql/outbox.sql",
    name = "outbox_tables",
    requires = ["storage", store::outbox::notify_on_insert]
);
// Consumers: positions, acknowledgements, dead letters, status.
pgrx::extension_sql_file!(
    "../sql/consumer.sql",
    name = "consumers",
    requires = [
        "storage",
        "outbox_tables",
        store::feed::originator_ceilings,
        store::feed::forget_high_water_marks,
        store::consumer::consumer_envelopes_pending,
        store::consumer::_acts_for,
        store::lease::_lease_take,
        store::lease::_lease_release,
        store::lease::_lease_check
    ]
);

// The read functions, in materialize mode (src/srf.rs), over the tables above.
pgrx::extension_sql_file!("../sql/reads.sql", name = "reads", requires = ["storage"]);

// Positions of ingress consumers (bus -> store).
pgrx::extension_sql_file!(
    "../sql/ingress.sql",
    name = "ingress_positions",
    requires = [
        "storage",
        store::consumer::_acts_for,
        store::consumer::_caller,
        store::lease::_lease_take,
        store::lease::_lease_release,
        store::lease::_lease_check
    ]
);

// Roles: grant_writer / grant_reader / grant_consumer and their revoke_ twins.
pgrx::extension_sql_file!(
    "../sql/roles.sql",
    name = "roles",
    requires = [
        "storage",
        "retention",
        "outbox_tables",
        "consumers",
        "ingress_positions",
        "reads",
        "view"
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
