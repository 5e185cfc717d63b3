//! The change feed on a hot standby (scripts/test.sh starts one streaming from the
//! test server and exports `ENVELOPES_TEST_PG_STANDBY`). The in-flight markers are
//! locks, which a standby does not have: every function that bounds a read by them
//! refuses with 25006 and a hint, while `select_gateway_envelopes` (which does
//! not) reads there as on the primary.

use pg_envelopes_tests::{insert, sqlstate, TestDb, WRITING_CALLS};
use postgres::{Client, NoTls};
use std::time::{Duration, Instant};

fn standby_server() -> String {
    std::env::var("ENVELOPES_TEST_PG_STANDBY").unwrap_or_else(|_| {
        panic!("ENVELOPES_TEST_PG_STANDBY is not set: run these tests through scripts/test.sh")
    })
}

/// Connects to `db` on the standby once the standby has replayed everything the
/// primary has written so far.
fn caught_up_standby(primary: &mut Client, db: &TestDb) -> Client {
    let lsn: String = primary
        .query_one("SELECT pg_catalog.pg_current_wal_lsn()::text", &[])
        .expect("primary lsn")
        .get(0);
    let mut admin = Client::connect(&format!("{} dbname=postgres", standby_server()), NoTls)
        .expect("connect to the standby");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let replayed: bool = admin
            .query_one(
                "SELECT pg_catalog.pg_last_wal_replay_lsn() >= $1::text::pg_lsn",
                &[&lsn],
            )
            .expect("replay lsn")
            .get(0);
        if replayed {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the standby did not replay {lsn} within 60 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    Client::connect(&format!("{} dbname={}", standby_server(), db.name), NoTls)
        .expect("connect to the test database on the standby")
}

#[test]
fn the_feed_refuses_on_a_standby_and_reads_still_work() {
    let db = TestDb::new("standby");
    let mut primary = db.connect();
    primary
        .batch_execute("SELECT envelopes.consumer_register('c')")
        .expect("register");
    for seq in 1..=3 {
        insert(&mut primary, 1, seq);
    }
    primary
        .batch_execute("SELECT envelopes.publish('orders.created', '\\x01')")
        .expect("outbox row");
    let mut standby = caught_up_standby(&mut primary, &db);

    for sql in [
        "SELECT count(*) FROM envelopes.consumer_envelope_batch('c', 10)",
        "SELECT count(*) FROM envelopes.consumer_outbox_batch('c', 10)",
        "SELECT count(*) FROM envelopes.originator_ceilings()",
        "SELECT count(*) FROM envelopes.consumer_status",
    ] {
        // Twice: a second call in the same backend must not answer from a cache.
        for _ in 0..2 {
            let error = standby
                .query_one(sql, &[])
                .expect_err("refused during recovery");
            assert_eq!(sqlstate(&error), "25006", "{sql}: {error:?}");
            let db_error = error.as_db_error().expect("a server error");
            assert!(
                db_error.hint().is_some_and(|h| h.contains("primary")),
                "{sql}: the hint says where to run it: {db_error:?}"
            );
        }
    }

    let read: i64 = standby
        .query_one(
            "SELECT count(*) FROM envelopes.select_gateway_envelopes()",
            &[],
        )
        .expect("select_gateway_envelopes reads on a standby")
        .get(0);
    assert_eq!(read, 3);

    // The primary's feed is untouched by the refusals.
    drop(standby);
    let handed: i64 = primary
        .query_one(
            "SELECT count(*) FROM envelopes.consumer_envelope_batch('c', 10)",
            &[],
        )
        .expect("batch on the primary")
        .get(0);
    assert_eq!(handed, 3);
}

/// Every function that writes refuses on the standby with 25006 within a second,
/// as a plain INSERT does: the insert functions for a band the standby has
/// (which used to fail with XX000 "cannot assign TransactionIds during
/// recovery") and for originators it has never seen (which used to wait 30 s for
/// a partition worker before 55P03), `ensure_gateway_parts`, `publish` and
/// `prune_expired`.
#[test]
fn writing_functions_refuse_on_a_standby_at_once() {
    let db = TestDb::new("standby_writes");
    let mut primary = db.connect();
    insert(&mut primary, 39, 1);
    let mut standby = caught_up_standby(&mut primary, &db);
    let existing = "SELECT envelopes.insert_gateway_envelope(39, 2, '\\x01', '\\x02')";
    for sql in std::iter::once(existing).chain(WRITING_CALLS) {
        let start = Instant::now();
        let error = standby
            .batch_execute(sql)
            .expect_err("refused during recovery");
        let took = start.elapsed();
        assert_eq!(sqlstate(&error), "25006", "{sql}: {error:?}");
        assert!(took < Duration::from_secs(1), "{sql} took {took:?}");
        let hint = error
            .as_db_error()
            .and_then(|e| e.hint().map(str::to_owned));
        assert!(
            hint.as_deref().is_some_and(|h| h.contains("primary")),
            "{sql}: {hint:?}"
        );
    }
}
