//! The writing functions honour the transaction's state as Postgres does for a
//! plain INSERT: in a READ ONLY transaction, with `default_transaction_read_only`
//! and in parallel mode each refuses at once with 25006, before it takes a lock,
//! starts a worker or writes anything (the hot standby is in `standby.rs`).

use pg_envelopes_tests::{sqlstate, TestDb, WRITING_CALLS as WRITERS};
use postgres::Client;
use std::time::{Duration, Instant};

/// Runs `sql` and returns its SQLSTATE ("ok" when it succeeds) and how long it
/// took.
fn timed(c: &mut Client, sql: &str) -> (String, Duration) {
    let start = Instant::now();
    let outcome = match c.batch_execute(sql) {
        Ok(()) => "ok".to_owned(),
        Err(e) => sqlstate(&e),
    };
    (outcome, start.elapsed())
}

/// Nothing any of [`WRITERS`] would have written is there: no partition of
/// originators 40 to 44, no outbox row, and the expired row of originator 39
/// (which prune would delete) still in place.
fn nothing_written(db: &TestDb, label: &str) {
    assert_eq!(
        db.int8(
            "SELECT count(*) FROM pg_catalog.pg_class c
               JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
              WHERE n.nspname = 'envelopes' AND c.relname ~ '^gateway_envelopes_(meta|blob)_o4[0-4]'"
        ),
        0,
        "{label}: a partition was created"
    );
    assert_eq!(
        db.int8("SELECT count(*) FROM envelopes.outbox"),
        0,
        "{label}: an outbox row"
    );
    assert_eq!(
        db.int8(
            "SELECT count(*) FROM envelopes.gateway_envelopes_meta
              WHERE originator_node_id = 39 AND originator_sequence_id = 1"
        ),
        1,
        "{label}: prune deleted a row"
    );
}

fn setup(label: &str) -> TestDb {
    let db = TestDb::new(label);
    db.connect()
        .batch_execute(
            "SELECT envelopes.insert_gateway_envelope(39, 1, '\\x01', '\\x02', expiry => 100);
             SELECT envelopes.insert_gateway_envelope(39, 2000000, '\\x01', '\\x02');",
        )
        .unwrap();
    db
}

/// `BEGIN READ ONLY` and `default_transaction_read_only = on`: 25006 at once
/// from every writing function; nothing created, written or deleted (the
/// insert functions returned 1 and kept the row, and a batch for a new band had
/// its worker create partitions).
#[test]
fn read_only_transactions_are_refused_at_once() {
    let db = setup("read_only");
    let mut c = db.connect();
    for sql in WRITERS {
        c.batch_execute("BEGIN READ ONLY").unwrap();
        let (outcome, took) = timed(&mut c, sql);
        c.batch_execute("ROLLBACK").unwrap();
        assert_eq!(outcome, "25006", "READ ONLY: {sql}");
        assert!(
            took < Duration::from_secs(1),
            "READ ONLY: {sql} took {took:?}"
        );
    }
    nothing_written(&db, "BEGIN READ ONLY");
    // Every transaction read-only by default, in autocommit and in a block.
    let mut c = db.connect();
    c.batch_execute("SET default_transaction_read_only = on")
        .unwrap();
    for sql in WRITERS {
        let (outcome, took) = timed(&mut c, sql);
        assert_eq!(outcome, "25006", "default_transaction_read_only: {sql}");
        assert!(took < Duration::from_secs(1), "{sql} took {took:?}");
        c.batch_execute("BEGIN").unwrap();
        let (outcome, _) = timed(&mut c, sql);
        c.batch_execute("ROLLBACK").unwrap();
        assert_eq!(
            outcome, "25006",
            "default_transaction_read_only, in a block: {sql}"
        );
    }
    nothing_written(&db, "default_transaction_read_only");
    // A read-write transaction still writes.
    let mut c = db.connect();
    assert_eq!(timed(&mut c, WRITERS[0]).0, "ok");
}

/// In parallel mode (a PARALLEL SAFE function run by a parallel worker under
/// `force_parallel_mode`, `debug_parallel_query` since 16): 25006 from every writing function, the insert
/// functions for a band that exists (the direct path) and one that does not.
#[test]
fn parallel_mode_is_refused() {
    let db = setup("parallel_mode");
    let mut c = db.connect();
    c.batch_execute(
        "CREATE FUNCTION public.in_worker(q text) RETURNS void
             LANGUAGE plpgsql PARALLEL SAFE AS $$ BEGIN EXECUTE q; END $$;",
    )
    .unwrap();
    let setting = pg_envelopes_tests::force_parallel_setting(&mut c);
    c.batch_execute(&format!(
        "SET {setting} = on; SET parallel_setup_cost = 0;
         SET parallel_tuple_cost = 0; SET max_parallel_workers_per_gather = 2;"
    ))
    .unwrap();
    for sql in ["SELECT envelopes.insert_gateway_envelope(39, 5, '\\x01', '\\x02')"]
        .into_iter()
        .chain(WRITERS)
    {
        let (outcome, _) = timed(&mut c, &format!("SELECT public.in_worker($q${sql}$q$)"));
        assert_eq!(outcome, "25006", "in a parallel worker: {sql}");
    }
    nothing_written(&db, "parallel mode");
    assert_eq!(
        db.int8("SELECT count(*) FROM envelopes.gateway_envelopes_meta"),
        2
    );
}
