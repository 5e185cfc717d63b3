//! One active bridge per name, enforced by the database: the session holding a
//! consumer's (or an ingress name and stream's) lease is the only one whose
//! acknowledgements count while it holds it; and ingress positions are kept per
//! (name, stream), so a name used for two streams never mixes their positions.

use pg_envelopes_tests::{outcome, Role, TestDb};
use postgres::Client;

/// `(acquired, holder_pid)` of a lease call.
fn lease(c: &mut Client, sql: &str) -> (bool, Option<i32>) {
    let row = c.query_one(sql, &[]).expect(sql);
    (row.get(0), row.get(1))
}

fn pid(c: &mut Client) -> i32 {
    c.query_one("SELECT pg_catalog.pg_backend_pid()", &[])
        .unwrap()
        .get(0)
}

/// While one session holds a consumer's lease, no other session can move the
/// consumer's positions or its dead letters (55006, naming the holder), whatever
/// its role; the holder can, a rollback does not give the lease up, and once the
/// holder's session ends another session takes it.
#[test]
fn a_consumer_lease_lets_one_session_acknowledge() {
    let db = TestDb::new("lease_egress");
    let mut a = db.connect();
    let mut b = db.connect();
    a.batch_execute(
        "SELECT envelopes.consumer_register('c');
         SELECT envelopes.insert_gateway_envelope(1, 1, '\\x01', '\\x02');
         SELECT envelopes.publish('s.x', '\\x01');",
    )
    .unwrap();
    // Taken inside a transaction that rolls back: session-level, it stays.
    a.batch_execute("BEGIN; SELECT * FROM envelopes.consumer_lease('c'); ROLLBACK;")
        .unwrap();
    let holder = pid(&mut a);
    assert_eq!(
        lease(&mut a, "SELECT * FROM envelopes.consumer_lease('c')"),
        (true, None),
        "taking it again is a no-op for the holder"
    );
    assert_eq!(
        lease(&mut b, "SELECT * FROM envelopes.consumer_lease('c')"),
        (false, Some(holder))
    );
    for sql in [
        "SELECT envelopes.consumer_envelope_ack('c', '{1}', '{1}')",
        "SELECT envelopes.consumer_outbox_ack('c', 1)",
        "SELECT envelopes.consumer_dead_letter('c', 'envelope', 1, 1, NULL, 'r', 'e', 1)",
        "SELECT envelopes.consumer_dead_letter_resolved('c', '{1}')",
    ] {
        assert_eq!(outcome(&mut b, sql), "55006", "{sql} from another session");
    }
    let err = b
        .batch_execute("SELECT envelopes.consumer_outbox_ack('c', 1)")
        .unwrap_err();
    let text = err.as_db_error().unwrap().message().to_owned();
    assert!(text.contains(&format!("pid {holder}")), "{text}");
    assert_eq!(
        db.int8("SELECT outbox_id FROM envelopes.consumers WHERE name = 'c'"),
        0,
        "nothing moved"
    );
    // The holder acknowledges as before.
    assert_eq!(
        outcome(
            &mut a,
            "SELECT envelopes.consumer_envelope_ack('c', '{1}', '{1}')"
        ),
        "ok"
    );
    assert_eq!(
        outcome(&mut a, "SELECT envelopes.consumer_outbox_ack('c', 1)"),
        "ok"
    );
    // Released explicitly, then taken by the other session; the first one's
    // session ending frees it too.
    assert!(a
        .query_one("SELECT envelopes.consumer_lease_release('c')", &[])
        .unwrap()
        .get::<_, bool>(0));
    assert!(!a
        .query_one("SELECT envelopes.consumer_lease_release('c')", &[])
        .unwrap()
        .get::<_, bool>(0));
    assert_eq!(
        lease(&mut b, "SELECT * FROM envelopes.consumer_lease('c')"),
        (true, None)
    );
    assert_eq!(
        outcome(&mut a, "SELECT envelopes.consumer_outbox_ack('c', 1)"),
        "55006"
    );
    drop(b);
    let mut c = db.connect();
    let mut taken = (false, None);
    for _ in 0..50 {
        taken = lease(&mut c, "SELECT * FROM envelopes.consumer_lease('c')");
        if taken.0 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(taken, (true, None), "the lease of a closed session is free");
}

/// Who may take a lease: not for an unknown consumer (42704), nor for a consumer
/// or ingress position another role owns (42501); NULL and empty names are
/// refused like everywhere else.
#[test]
fn leases_are_for_the_owner_of_the_name() {
    let db = TestDb::new("lease_owner");
    let (ra, rb) = (Role::new(&db, "la"), Role::new(&db, "lb"));
    for r in [&ra, &rb] {
        db.connect()
            .batch_execute(&format!(
                "SELECT envelopes.grant_consumer('{0}'); SELECT envelopes.grant_writer('{0}');",
                r.name
            ))
            .unwrap();
    }
    let mut a = ra.connect(&db);
    let mut b = rb.connect(&db);
    a.batch_execute(
        "SELECT envelopes.consumer_register('mine');
         SELECT envelopes.ingress_store_position('in', 'S', 3);",
    )
    .unwrap();
    for (as_a, sql, code) in [
        (
            false,
            "SELECT * FROM envelopes.consumer_lease('mine')",
            "42501",
        ),
        (
            false,
            "SELECT * FROM envelopes.ingress_lease('in', 'S')",
            "42501",
        ),
        (
            false,
            "SELECT * FROM envelopes.consumer_lease('nobody')",
            "42704",
        ),
        (
            false,
            "SELECT * FROM envelopes.consumer_lease(NULL)",
            "22004",
        ),
        (
            false,
            "SELECT * FROM envelopes.ingress_lease('', 'S')",
            "22023",
        ),
        (
            false,
            "SELECT * FROM envelopes.ingress_lease('in', '')",
            "22023",
        ),
        (true, "SELECT * FROM envelopes.consumer_lease('mine')", "ok"),
        (
            true,
            "SELECT * FROM envelopes.ingress_lease('in', 'S')",
            "ok",
        ),
        // A stream of its own under the same name is another position.
        (
            false,
            "SELECT * FROM envelopes.ingress_lease('in', 'T')",
            "ok",
        ),
    ] {
        let c = if as_a { &mut a } else { &mut b };
        assert_eq!(outcome(c, sql), code, "{sql}");
    }
    // The PUBLIC pseudo-role gets none of the lease functions.
    let nobody = Role::new(&db, "ln");
    let mut n = nobody.connect(&db);
    assert_eq!(
        outcome(&mut n, "SELECT envelopes._lease_take('egress', 'mine')"),
        "42501"
    );
}

/// An ingress lease: while one session holds it, another cannot store a position
/// for that name and stream (55006); positions of another stream are another
/// lease.
#[test]
fn an_ingress_lease_lets_one_session_store_positions() {
    let db = TestDb::new("lease_ingress");
    let mut a = db.connect();
    let mut b = db.connect();
    assert_eq!(
        lease(&mut a, "SELECT * FROM envelopes.ingress_lease('in', 'S')"),
        (true, None)
    );
    let holder = pid(&mut a);
    assert_eq!(
        lease(&mut b, "SELECT * FROM envelopes.ingress_lease('in', 'S')"),
        (false, Some(holder))
    );
    assert_eq!(
        outcome(
            &mut b,
            "SELECT envelopes.ingress_store_position('in', 'S', 9)"
        ),
        "55006"
    );
    assert_eq!(
        outcome(
            &mut b,
            "SELECT envelopes.ingress_store_position('in', 'T', 9)"
        ),
        "ok"
    );
    assert_eq!(
        outcome(
            &mut a,
            "SELECT envelopes.ingress_store_position('in', 'S', 4)"
        ),
        "ok"
    );
    assert_eq!(db.int8("SELECT envelopes.ingress_position('in', 'S')"), 4);
    assert_eq!(db.int8("SELECT envelopes.ingress_position('in', 'T')"), 9);
}

/// One ingress name used for two streams: each stream's position is its own. A
/// position kept per name took the larger of the two (1,000 for stream B after
/// A reached 1,000 and B stored 454), and a restart of B's ingress skipped 546
/// messages.
#[test]
fn ingress_positions_are_kept_per_stream() {
    let db = TestDb::new("ingress_streams");
    let mut c = db.connect();
    c.batch_execute(
        "SELECT envelopes.ingress_store_position('n', 'A', 1000);
         SELECT envelopes.ingress_store_position('n', 'B', 454);
         SELECT envelopes.ingress_store_position('n', 'A', 900);",
    )
    .unwrap();
    assert_eq!(db.int8("SELECT envelopes.ingress_position('n', 'B')"), 454);
    assert_eq!(db.int8("SELECT envelopes.ingress_position('n', 'A')"), 1000);
    assert_eq!(db.int8("SELECT envelopes.ingress_position('n', 'C')"), 0);
    assert_eq!(
        db.int8("SELECT count(*) FROM envelopes.ingress_positions WHERE consumer = 'n'"),
        2
    );
    for sql in [
        "SELECT envelopes.ingress_position('', 's')",
        "SELECT envelopes.ingress_position('i', '')",
        "SELECT envelopes.ingress_store_position('i', '', 1)",
    ] {
        assert_eq!(outcome(&mut c, sql), "22023", "{sql}");
    }
}
