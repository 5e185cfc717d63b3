//! Helpers shared by the `#[pg_test]` modules.

use pgrx::prelude::*;

/// Runs `sql` and returns the SQLSTATE it failed with, or `None` if it succeeded.
/// The statement runs inside a PL/pgSQL exception block, i.e. a subtransaction,
/// so a failure leaves the test's transaction usable and its effects rolled back.
pub fn sqlstate_of(sql: &str) -> Option<String> {
    Spi::run(
        "CREATE OR REPLACE FUNCTION pg_temp.sqlstate_of(q text) RETURNS text
         LANGUAGE plpgsql AS $$
         BEGIN EXECUTE q; RETURN NULL;
         EXCEPTION WHEN OTHERS THEN RETURN SQLSTATE; END $$",
    )
    .expect("create helper");
    Spi::get_one_with_args::<String>("SELECT pg_temp.sqlstate_of($1)", &[sql.into()])
        .expect("run helper")
}

/// The single bigint a query returns.
pub fn int8(sql: &str) -> i64 {
    Spi::get_one::<i64>(sql)
        .expect("query")
        .expect("non-NULL result")
}

/// Names of every band partition of `table` ('meta' or 'blob'), sorted.
pub fn band_names(table: &str) -> Vec<String> {
    Spi::connect(|client| {
        client
            .select(
                "SELECT c.relname::text FROM pg_catalog.pg_class c
                   JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
                  WHERE n.nspname = 'envelopes' AND c.relkind = 'r'
                    AND c.relname LIKE 'gateway\\_envelopes\\_' || $1 || '\\_o%'
                  ORDER BY 1",
                None,
                &[table.into()],
            )
            .expect("select")
            .map(|row| row.get::<String>(1).expect("get").expect("non-NULL"))
            .collect()
    })
}
