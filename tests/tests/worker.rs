//! Partition creation in a background worker: nothing waits for a caller's open
//! transaction, and what the worker creates commits on its own.

use pg_envelopes_tests::{sqlstate, TestDb};
use postgres::{Client, NoTls};
use std::sync::{Arc, Mutex};

fn session(db: &TestDb, mode: &str) -> Client {
    let mut c = db.connect();
    c.batch_execute(&format!(
        "SET envelopes.create_partitions_in = '{mode}'; SET statement_timeout = '5s'"
    ))
    .unwrap();
    c
}

fn insert(
    c: &mut impl postgres::GenericClient,
    node: i32,
    seq: i64,
) -> Result<i64, postgres::Error> {
    c.query_one(
        "SELECT envelopes.insert_gateway_envelope($1, $2, '\\x01', '\\x02')",
        &[&node, &seq],
    )
    .map(|r| r.get(0))
}

/// Session A creates a new originator in an open transaction and stays open;
/// session B then needs a new originator and a new band of A's originator. With
/// creation in a worker, B finishes while A is still open; with creation in the
/// caller's transaction, B waits for A (and hits its statement timeout here).
#[test]
fn an_open_transaction_does_not_hold_up_other_creators() {
    let db = TestDb::new("worker_no_wait");
    let mut a = session(&db, "worker");
    let mut b = session(&db, "worker");
    let mut a_tx = a.transaction().unwrap();
    assert_eq!(insert(&mut a_tx, 100, 1).unwrap(), 1);
    assert_eq!(
        insert(&mut b, 101, 1).expect("new originator while A is open"),
        1
    );
    assert_eq!(
        insert(&mut b, 100, 5_000_000).expect("new band of A's originator"),
        1
    );
    a_tx.commit().unwrap();

    // The same sequence with creation in the caller's transaction: B waits.
    let mut a = session(&db, "transaction");
    let mut b = session(&db, "transaction");
    b.batch_execute("SET statement_timeout = '1s'").unwrap();
    let mut a_tx = a.transaction().unwrap();
    insert(&mut a_tx, 102, 1).unwrap();
    let blocked = insert(&mut b, 103, 1).expect_err("B should wait for A's creation lock");
    assert_eq!(sqlstate(&blocked), "57014");
    a_tx.commit().unwrap();
}

#[test]
fn a_rolled_back_caller_leaves_an_empty_partition() {
    let db = TestDb::new("worker_rollback");
    let mut c = session(&db, "worker");
    let mut tx = c.transaction().unwrap();
    insert(&mut tx, 200, 7).unwrap();
    tx.rollback().unwrap();
    let row = db
        .connect()
        .query_one(
            "SELECT count(*) FROM envelopes.partitions() WHERE originator_node_id = 200",
            &[],
        )
        .unwrap();
    assert_eq!(
        row.get::<_, i64>(0),
        1,
        "the band created by the worker stays"
    );
    assert_eq!(
        db.int8("SELECT count(*) FROM envelopes.gateway_envelopes_meta"),
        0
    );
    // And it is used by the next insert without creating anything.
    assert_eq!(insert(&mut c, 200, 8).unwrap(), 1);
}

/// The worker fails (a user table already has the name of the blob band it must
/// create): the insert gets that error with its SQLSTATE, and nothing the worker
/// did before failing (the originator partitions, the meta band) is left behind.
#[test]
fn a_failing_worker_reports_its_error_and_creates_nothing() {
    let db = TestDb::new("worker_failure");
    let mut c = session(&db, "worker");
    c.batch_execute("CREATE TABLE envelopes.gateway_envelopes_blob_o300_s0_1000000 (x int)")
        .unwrap();
    let err = insert(&mut c, 300, 1).expect_err("name collision");
    let message = err
        .as_db_error()
        .map(|e| e.message().to_owned())
        .unwrap_or_default();
    assert_eq!(sqlstate(&err), "42P07", "{err:?}");
    assert!(
        message.contains("gateway_envelopes_blob_o300_s0_1000000"),
        "{message}"
    );
    let made = db.int8(
        "SELECT count(*) FROM pg_catalog.pg_class
          WHERE relname LIKE 'gateway\\_envelopes\\_%\\_o300%' AND relkind IN ('r', 'p')",
    );
    assert_eq!(
        made, 1,
        "only the user's own table may exist: nothing half-created"
    );
    // The session is usable and other originators still work.
    let ok = insert(&mut c, 301, 1).unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(ok, 1);
}

/// With no free background-worker slot (scripts/test.sh starts a second server
/// with `max_worker_processes = 0`), creation falls back to the inserting
/// transaction: the insert succeeds, a LOG message says why, and the partitions
/// belong to that transaction, so its rollback removes them.
#[test]
fn without_a_worker_slot_creation_falls_back_to_the_transaction() {
    let server = std::env::var("ENVELOPES_TEST_PG_NO_WORKERS").unwrap_or_else(|_| {
        panic!("ENVELOPES_TEST_PG_NO_WORKERS is not set: run these tests through scripts/test.sh")
    });
    let db = TestDb::new_on(server, "worker_fallback");
    let messages = Arc::new(Mutex::new(Vec::<String>::new()));
    let seen = Arc::clone(&messages);
    let mut config: postgres::Config = db.url().parse().expect("connection string");
    config.notice_callback(move |notice| {
        if let Ok(mut m) = seen.lock() {
            m.push(notice.message().to_owned());
        }
    });
    let mut c = config.connect(NoTls).expect("connect");
    c.batch_execute(
        "SET envelopes.create_partitions_in = 'worker'; SET client_min_messages = 'log'",
    )
    .unwrap();
    let partitions_of_400 =
        "SELECT count(*) FROM envelopes.partitions() WHERE originator_node_id = 400";

    let mut tx = c.transaction().unwrap();
    assert_eq!(insert(&mut tx, 400, 1).expect("insert without a worker"), 1);
    tx.rollback().unwrap();
    let logged = messages.lock().unwrap().clone();
    assert!(
        logged
            .iter()
            .any(|m| m.contains("partition worker unavailable")),
        "the fallback is logged: {logged:?}"
    );
    assert_eq!(
        db.int8(partitions_of_400),
        0,
        "created in the rolled-back transaction, so gone with it"
    );

    // The same session (its partition cache saw the rolled-back partitions)
    // creates them again and keeps them this time.
    assert_eq!(insert(&mut c, 400, 1).expect("insert after rollback"), 1);
    assert_eq!(db.int8(partitions_of_400), 1);
    assert_eq!(
        db.int8("SELECT count(*) FROM envelopes.gateway_envelopes_meta"),
        1
    );
}
