//! What a hostile or unlucky role cannot do: lift the limits the extension's
//! owner set, create unbounded partitions from one call, move another role's
//! cursors, or read Rust internals in an error.

use pg_envelopes_tests::{outcome, sqlstate, Role, TestDb};
use postgres::Client;

fn writer(db: &TestDb) -> Role {
    writer_named(db, "w")
}

fn writer_named(db: &TestDb, label: &str) -> Role {
    let role = Role::new(db, label);
    db.connect()
        .execute("SELECT envelopes.grant_writer($1)", &[&role.name])
        .unwrap();
    role
}

fn consumer_role(db: &TestDb, label: &str) -> Role {
    let role = Role::new(db, label);
    db.connect()
        .execute("SELECT envelopes.grant_consumer($1)", &[&role.name])
        .unwrap();
    role
}

/// Every limit and creation setting is the owner's: a writer that tries to raise
/// it, per session, per transaction, through set_config, or by choosing its own
/// band width, gets 42501 and nothing changes.
#[test]
fn a_writer_cannot_lift_its_limits() {
    let db = TestDb::new("limits");
    let w = writer(&db);
    let mut c = w.connect(&db);
    // Loads the library in this session (the settings are then defined).
    assert_eq!(
        outcome(
            &mut c,
            "SELECT envelopes.insert_gateway_envelope(1, 1, '\\x01', '\\x02')"
        ),
        "ok"
    );
    for (name, value) in [
        ("envelopes.max_envelope_bytes", "'100MB'"),
        ("envelopes.max_topic_bytes", "'1MB'"),
        ("envelopes.max_publish_bytes", "'100MB'"),
        ("envelopes.max_header_bytes", "'100MB'"),
        ("envelopes.max_new_partitions_per_call", "100000"),
        ("envelopes.band_width", "1"),
        ("envelopes.create_partitions_in", "'transaction'"),
        ("envelopes.partition_lock_timeout", "'1h'"),
        ("envelopes.partition_lock_attempts", "1000"),
        ("envelopes.partition_worker_timeout", "'1h'"),
    ] {
        for sql in [
            format!("SET {name} = {value}"),
            format!("BEGIN; SET LOCAL {name} = {value}; COMMIT"),
            format!("SELECT pg_catalog.set_config('{name}', {value}::text, false)"),
        ] {
            assert_eq!(outcome(&mut c, &sql), "42501", "{sql}");
            let _ = c.batch_execute("ROLLBACK");
        }
    }
    // The limits still hold: a 5 MB envelope is refused, band width stays.
    let big = vec![7u8; 5 << 20];
    let e = c
        .query_one(
            "SELECT envelopes.insert_gateway_envelope(1, 2, '\\x01', $1)",
            &[&big],
        )
        .unwrap_err();
    assert_eq!(sqlstate(&e), "22001");
    assert_eq!(
        outcome(
            &mut c,
            "SELECT envelopes.ensure_gateway_parts(2, 1, band_width => 1)"
        ),
        "42501"
    );
    // Headers have a limit too.
    let headers = format!("{{\"h\": \"{}\"}}", "x".repeat(100 << 10));
    let e = c
        .query_one(
            "SELECT envelopes.publish('a.b', '\\x01', $1::text::jsonb)",
            &[&headers],
        )
        .unwrap_err();
    assert_eq!(sqlstate(&e), "22001");
    // Notify settings stay the session's own.
    assert_eq!(outcome(&mut c, "SET envelopes.notify = off"), "ok");
    assert_eq!(
        outcome(&mut c, "SET envelopes.notify_interval = '1s'"),
        "ok"
    );

    // What the owner grants, the role may set.
    db.connect()
        .batch_execute(&format!(
            "GRANT SET ON PARAMETER envelopes.max_envelope_bytes TO \"{}\"",
            w.name
        ))
        .unwrap();
    let mut c = w.connect(&db);
    assert_eq!(
        outcome(
            &mut c,
            "SELECT envelopes.insert_gateway_envelope(1, 3, '\\x01', '\\x02')"
        ),
        "ok"
    );
    assert_eq!(
        outcome(&mut c, "SET envelopes.max_envelope_bytes = '8MB'"),
        "ok"
    );
    db.connect()
        .batch_execute(&format!(
            "REVOKE SET ON PARAMETER envelopes.max_envelope_bytes FROM \"{}\"",
            w.name
        ))
        .unwrap();
}

/// Values given before the library is loaded (connection options, ALTER ROLE SET)
/// are checked when it loads: an invalid one and one the role may not set are
/// errors then, not silently replaced by the default.
#[test]
fn settings_given_before_load_are_checked_at_load() {
    let db = TestDb::new("preload");
    let w = writer(&db);
    let insert = "SELECT envelopes.insert_gateway_envelope(1, 1, '\\x01', '\\x02')";

    let mut c = w.connect_with(&db, "-c envelopes.max_envelope_bytes=100MB");
    assert_eq!(outcome(&mut c, insert), "42501");
    // Every later attempt in that session fails the same way.
    assert_eq!(outcome(&mut c, insert), "42501");

    let mut c = w.connect_with(&db, "-c envelopes.max_envelope_bytes=banana");
    assert_eq!(outcome(&mut c, insert), "22023");

    let mut c = w.connect_with(&db, "-c envelopes.band_width=0");
    assert_eq!(outcome(&mut c, insert), "22023");

    // The role cannot configure itself with ALTER ROLE either.
    let mut c = w.connect(&db);
    assert_eq!(
        outcome(
            &mut c,
            "ALTER ROLE CURRENT_USER SET envelopes.band_width = 1"
        ),
        "42501"
    );
    // What a superuser configures for the role is checked when it loads (an
    // invalid value is an error), and a valid one is honoured.
    let mut fresh_admin = db.connect(); // has not loaded the library: no check here
    fresh_admin
        .batch_execute(&format!(
            "ALTER ROLE \"{}\" IN DATABASE \"{}\" SET envelopes.max_envelope_bytes = 'banana'",
            w.name, db.name
        ))
        .unwrap();
    let mut c = w.connect(&db);
    assert_eq!(outcome(&mut c, insert), "22023");
    fresh_admin
        .batch_execute(&format!(
            "ALTER ROLE \"{0}\" IN DATABASE \"{1}\" RESET ALL;
             ALTER ROLE \"{0}\" IN DATABASE \"{1}\" SET envelopes.band_width = 10",
            w.name, db.name
        ))
        .unwrap();
    let mut c = w.connect(&db);
    assert_eq!(outcome(&mut c, insert), "ok");
    let width: String = c
        .query_one("SHOW envelopes.band_width", &[])
        .unwrap()
        .get(0);
    assert_eq!(width, "10");
    fresh_admin
        .batch_execute(&format!(
            "ALTER ROLE \"{}\" IN DATABASE \"{}\" RESET ALL",
            w.name, db.name
        ))
        .unwrap();

    // A superuser's session may set them before load.
    let mut admin = Client::connect(
        &format!(
            "{} dbname={} options='-c envelopes.band_width=20'",
            db.server, db.name
        ),
        postgres::NoTls,
    )
    .unwrap();
    assert_eq!(
        outcome(
            &mut admin,
            "SELECT envelopes.insert_gateway_envelope(1, 2, '\\x01', '\\x02')"
        ),
        "ok"
    );
    let width: String = admin
        .query_one("SHOW envelopes.band_width", &[])
        .unwrap()
        .get(0);
    assert_eq!(width, "20");
    // Only the two accepted sessions wrote.
    assert_eq!(
        db.int8("SELECT count(*) FROM envelopes.gateway_envelopes_meta"),
        2
    );
}

/// `envelopes.max_topic_bytes` goes no higher than what the topic index holds
/// (2684 bytes with 8 kB pages): a larger value is refused with 22023 (by SET
/// and when given before the library loads), so a topic the index could not
/// hold gets the documented 22001 from the function rather than 54000 from the
/// index. The bound is exact: an incompressible topic of 2684 bytes goes in
/// through the function, one of 2685 bytes fails in the index of a plain INSERT.
#[test]
fn the_topic_limit_stays_within_what_the_topic_index_holds() {
    let db = TestDb::new("topic_limit");
    let mut c = db.connect();
    let random = |n: i32| {
        format!(
            "(SELECT pg_catalog.decode(pg_catalog.string_agg(pg_catalog.lpad(pg_catalog.to_hex(
                 (pg_catalog.random() * 255)::int), 2, '0'), ''), 'hex') FROM generate_series(1, {n}))"
        )
    };
    c.batch_execute("SELECT envelopes.ensure_gateway_parts(1, 1)")
        .unwrap();
    for value in ["2685", "3000", "'1MB'", "2147483647"] {
        assert_eq!(
            outcome(&mut c, &format!("SET envelopes.max_topic_bytes = {value}")),
            "22023",
            "{value}"
        );
    }
    assert_eq!(
        outcome(&mut c, "SET envelopes.max_topic_bytes = 2684"),
        "ok"
    );
    assert_eq!(
        outcome(
            &mut c,
            &format!(
                "SELECT envelopes.insert_gateway_envelope(1, 1, {}, '\\x02')",
                random(2684)
            )
        ),
        "ok"
    );
    assert_eq!(
        outcome(
            &mut c,
            &format!(
                "SELECT envelopes.insert_gateway_envelope(1, 2, {}, '\\x02')",
                random(2685)
            )
        ),
        "22001"
    );
    assert_eq!(
        outcome(
            &mut c,
            &format!(
                "INSERT INTO envelopes.gateway_envelopes_meta (originator_node_id, originator_sequence_id, topic)
                 VALUES (1, 3, {})",
                random(2685)
            )
        ),
        "54000"
    );
    let mut c = Client::connect(
        &format!(
            "{} dbname={} options='-c envelopes.max_topic_bytes=3000'",
            db.server, db.name
        ),
        postgres::NoTls,
    )
    .unwrap();
    assert_eq!(
        outcome(
            &mut c,
            "SELECT envelopes.insert_gateway_envelope(1, 4, '\\x01', '\\x02')"
        ),
        "22023"
    );
    assert_eq!(
        db.int8("SELECT count(*) FROM envelopes.gateway_envelopes_meta"),
        1
    );
}

/// A batch that would create more band partitions than
/// envelopes.max_new_partitions_per_call fails with 54000 and writes nothing.
#[test]
fn one_call_creates_a_bounded_number_of_partitions() {
    let db = TestDb::new("partcap");
    let w = writer(&db);
    let mut c = w.connect(&db);
    let bands_before = db.int8("SELECT count(*) FROM envelopes.partitions()");
    // 101 rows, each in a band of its own (the default width is 1,000,000).
    let nodes: Vec<i32> = vec![5; 101];
    let seqs: Vec<i64> = (0..101).map(|i| 1 + i * 1_000_000).collect();
    let topics: Vec<Vec<u8>> = vec![vec![1]; 101];
    let envelopes: Vec<Vec<u8>> = vec![vec![2]; 101];
    let e = c
        .query_one(
            "SELECT envelopes.insert_gateway_envelopes($1, $2, $3, $4)",
            &[&nodes, &seqs, &topics, &envelopes],
        )
        .unwrap_err();
    assert_eq!(sqlstate(&e), "54000", "{e:?}");
    assert_eq!(
        db.int8("SELECT count(*) FROM envelopes.partitions()"),
        bands_before
    );
    assert_eq!(
        db.int8("SELECT count(*) FROM envelopes.gateway_envelopes_meta"),
        0
    );
    // 100 are allowed, and once they exist the same rows need no new band.
    let n = c
        .query_one(
            "SELECT envelopes.insert_gateway_envelopes($1, $2, $3, $4)",
            &[
                &nodes[..100].to_vec(),
                &seqs[..100].to_vec(),
                &topics[..100].to_vec(),
                &envelopes[..100].to_vec(),
            ],
        )
        .expect("100 new bands are within the limit")
        .get::<_, i64>(0);
    assert_eq!(n, 100);
    db.connect()
        .batch_execute(&format!(
            "ALTER DATABASE \"{}\" SET envelopes.max_new_partitions_per_call = 1",
            db.name
        ))
        .unwrap();
    let mut c = w.connect(&db);
    let n = c
        .query_one(
            "SELECT envelopes.insert_gateway_envelopes($1, $2, $3, $4)",
            &[
                &nodes[..100].to_vec(),
                &seqs[..100].iter().map(|s| s + 1).collect::<Vec<i64>>(),
                &topics[..100].to_vec(),
                &envelopes[..100].to_vec(),
            ],
        )
        .expect("existing bands do not count")
        .get::<_, i64>(0);
    assert_eq!(n, 100);
}

/// A consumer belongs to the role that registered it: another consumer role can
/// neither read its batches nor move any of its positions; the extension's owner
/// can, and the owner can hand it over.
#[test]
fn cursors_belong_to_their_role() {
    let db = TestDb::new("owners");
    let a = consumer_role(&db, "ca");
    let b = consumer_role(&db, "cb");
    let mut admin = db.connect();
    admin
        .batch_execute(
            "SELECT envelopes.insert_gateway_envelope(30, s, '\\x01', '\\x02')
               FROM generate_series(1, 100) s;
             SELECT envelopes.publish('a.b', '\\x01')",
        )
        .unwrap();
    let mut ca = a.connect(&db);
    assert_eq!(
        outcome(&mut ca, "SELECT envelopes.consumer_register('forwarder')"),
        "ok"
    );
    let mut cb = b.connect(&db);
    for sql in [
        "SELECT envelopes.consumer_envelope_ack('forwarder', '{30}', '{9223372036854775807}')",
        "SELECT envelopes.consumer_envelope_ack('forwarder', '{}', '{}', 1)",
        "SELECT * FROM envelopes.consumer_envelope_batch('forwarder')",
        "SELECT * FROM envelopes.consumer_outbox_batch('forwarder')",
        "SELECT envelopes.consumer_outbox_ack('forwarder', 1)",
        "SELECT envelopes.consumer_register('forwarder')",
        "SELECT envelopes.consumer_dead_letter('forwarder', 'outbox', NULL, NULL, 1, 'r', 'e', 1)",
        "SELECT * FROM envelopes.consumer_dead_letter_retries('forwarder')",
        "SELECT envelopes.consumer_dead_letter_resolved('forwarder', '{1}')",
        "SELECT envelopes.consumer_set_owner('forwarder', current_user::regrole)",
    ] {
        assert_eq!(outcome(&mut cb, sql), "42501", "{sql}");
    }
    // Nothing moved: the real consumer still gets all 100 rows.
    let rows = ca
        .query(
            "SELECT * FROM envelopes.consumer_envelope_batch('forwarder', 1000)",
            &[],
        )
        .unwrap();
    assert_eq!(rows.len(), 100);
    // Status is readable by both, and says who owns it.
    let owner: String = cb
        .query_one(
            "SELECT owner::text FROM envelopes.consumer_status WHERE consumer = 'forwarder'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(owner, a.name);
    // The extension's owner acts for every consumer.
    assert_eq!(
        outcome(
            &mut admin,
            "SELECT * FROM envelopes.consumer_envelope_batch('forwarder')"
        ),
        "ok"
    );
    // Handing it over.
    ca.execute(
        "SELECT envelopes.consumer_set_owner('forwarder', $1::text::regrole)",
        &[&b.name],
    )
    .unwrap();
    assert_eq!(
        outcome(
            &mut cb,
            "SELECT * FROM envelopes.consumer_envelope_batch('forwarder')"
        ),
        "ok"
    );
    assert_eq!(
        outcome(
            &mut ca,
            "SELECT * FROM envelopes.consumer_envelope_batch('forwarder')"
        ),
        "42501"
    );
}

/// An ingress position belongs to the role that stored it first.
#[test]
fn ingress_positions_belong_to_their_role() {
    let db = TestDb::new("ingress_owner");
    let (wa, wb) = (writer_named(&db, "wa"), writer_named(&db, "wb"));
    let mut a = wa.connect(&db);
    let mut b = wb.connect(&db);
    let store = "SELECT envelopes.ingress_store_position('in1', 'stream', 5)";
    assert_eq!(outcome(&mut a, store), "ok");
    assert_eq!(
        outcome(
            &mut b,
            "SELECT envelopes.ingress_store_position('in1', 'stream', 500)"
        ),
        "42501"
    );
    assert_eq!(
        outcome(
            &mut a,
            "SELECT envelopes.ingress_store_position('in1', 'stream', 7)"
        ),
        "ok"
    );
    assert_eq!(
        db.int8("SELECT envelopes.ingress_position('in1', 'stream')"),
        7
    );
    // Two roles racing for a new consumer: one wins, the other is refused.
    let (ua, ub) = (wa.name.clone(), wb.name.clone());
    let handles: Vec<_> = [(ua, 1i64), (ub, 2i64)]
        .into_iter()
        .map(|(user, pos)| {
            let url = format!(
                "{} dbname={} user='{user}'",
                db.server.replace("user=postgres", ""),
                db.name
            );
            std::thread::spawn(move || {
                let mut c = Client::connect(&url, postgres::NoTls).unwrap();
                outcome(
                    &mut c,
                    &format!("SELECT envelopes.ingress_store_position('race', 's', {pos})"),
                )
            })
        })
        .collect();
    let mut outcomes: Vec<String> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    outcomes.sort();
    assert_eq!(outcomes, ["42501", "ok"]);
}

/// The server here runs with RUST_BACKTRACE=1 in its environment (as the
/// machine's shell has it); errors raised in Rust code still carry no backtrace
/// and no build path.
#[test]
fn no_backtrace_reaches_a_client() {
    let db = TestDb::new("backtrace");
    let mut c = db.connect();
    // The postmaster's environment, which every backend inherits (a backend's own
    // /proc/PID/environ is overwritten by its process title).
    let data: String = c.query_one("SHOW data_directory", &[]).unwrap().get(0);
    let pidfile =
        std::fs::read_to_string(format!("{data}/postmaster.pid")).expect("postmaster.pid");
    let pid = pidfile.lines().next().unwrap_or("").trim().to_owned();
    let environ =
        std::fs::read(format!("/proc/{pid}/environ")).expect("read the server's environment");
    assert!(
        environ
            .split(|&b| b == 0)
            .any(|var| var == b"RUST_BACKTRACE=1"),
        "the test server must run with RUST_BACKTRACE=1 (scripts/lib.sh)"
    );
    // An error Postgres raises inside the extension's Rust code (here a CHECK
    // constraint hit by the insert publish() runs): the kind that carried the
    // backtrace captured when it crossed into Rust.
    c.batch_execute("ALTER TABLE envelopes.outbox ADD CONSTRAINT no_rows CHECK (false) NOT VALID")
        .unwrap();
    for sql in [
        "SELECT envelopes.publish('a.b', '\\x01')",
        "SELECT envelopes.insert_gateway_envelope(NULL, 1, '\\x01', '\\x02')",
        "SELECT envelopes.insert_gateway_envelope(1, 1, '\\x01', '\\x02', gateway_time => 'infinity')",
        "SELECT * FROM envelopes.consumer_envelope_batch('nobody')",
        "SELECT envelopes.publish('a..b', '\\x01')",
        "SELECT * FROM envelopes.select_gateway_envelopes('{1,1}', '{0,0}')",
        "SELECT * FROM envelopes.prune_expired(lock_timeout_ms => 0)",
    ] {
        let e = c.query(sql, &[]).unwrap_err();
        let db_error = e.as_db_error().expect("a server error");
        let text = format!(
            "{} {} {}",
            db_error.message(),
            db_error.detail().unwrap_or(""),
            db_error.hint().unwrap_or("")
        );
        for leak in ["backtrace", ".rs:", "/root/", "/src/", "rustc"] {
            assert!(!text.contains(leak), "{sql}: {leak:?} in {text}");
        }
    }
}

/// After a meta band was dropped by hand, replaying a key whose blob row
/// survived returns 0 (not new) and puts the meta row back.
#[test]
fn replay_after_a_hand_dropped_meta_band_returns_zero() {
    let db = TestDb::new("replay_meta");
    let mut c = db.connect();
    c.batch_execute("SELECT envelopes.insert_gateway_envelope(5, 10, '\\x01', '\\x02')")
        .unwrap();
    let meta: String = c
        .query_one(
            "SELECT meta_partition::text FROM envelopes.partitions() WHERE originator_node_id = 5",
            &[],
        )
        .unwrap()
        .get(0);
    c.batch_execute(&format!("DROP TABLE {meta}")).unwrap();
    let n: i64 = c
        .query_one(
            "SELECT envelopes.insert_gateway_envelope(5, 10, '\\x01', '\\x02')",
            &[],
        )
        .expect("the replay must not fail")
        .get(0);
    assert_eq!(n, 0);
    assert_eq!(
        db.int8(
            "SELECT count(*) FROM envelopes.gateway_envelopes_view WHERE originator_node_id = 5"
        ),
        1
    );
    // The batch form too.
    let meta: String = c
        .query_one(
            "SELECT meta_partition::text FROM envelopes.partitions() WHERE originator_node_id = 5",
            &[],
        )
        .unwrap()
        .get(0);
    c.batch_execute(&format!("DROP TABLE {meta}")).unwrap();
    let n: i64 = c
        .query_one(
            "SELECT envelopes.insert_gateway_envelopes('{5}', '{10}', '{\"\\\\x01\"}', '{\"\\\\x02\"}')",
            &[],
        )
        .expect("the batch replay must not fail")
        .get(0);
    assert_eq!(n, 0);
}

/// A table that squats on a band partition's name: 42P07 with the hint, in
/// both creation modes.
#[test]
fn a_squatted_band_name_has_the_hint() {
    let db = TestDb::new("squat");
    let mut c = db.connect();
    c.batch_execute(
        "SELECT envelopes.insert_gateway_envelope(8, 1, '\\x01', '\\x02');
         CREATE TABLE envelopes.gateway_envelopes_meta_o8_s1000000_2000000 (x int)",
    )
    .unwrap();
    for mode in ["worker", "transaction"] {
        c.batch_execute(&format!("SET envelopes.create_partitions_in = {mode}"))
            .unwrap();
        let e = c
            .query_one(
                "SELECT envelopes.insert_gateway_envelope(8, 1500000, '\\x01', '\\x02')",
                &[],
            )
            .unwrap_err();
        let db_error = e.as_db_error().expect("a server error");
        assert_eq!(db_error.code().code(), "42P07", "{mode}: {e:?}");
        assert!(
            db_error
                .hint()
                .unwrap_or("")
                .contains("Rename or drop that table"),
            "{mode}: {e:?}"
        );
    }
}

/// The per-call cap counts bands other sessions dropped after this session cached
/// them: a batch that would create them all again is refused too.
#[test]
fn the_partition_cap_sees_bands_dropped_behind_the_cache() {
    let db = TestDb::new("partcap_stale");
    db.connect()
        .batch_execute(&format!(
            "ALTER DATABASE \"{}\" SET envelopes.max_new_partitions_per_call = 5",
            db.name
        ))
        .unwrap();
    let mut admin = db.connect();
    // Seven bands of expired rows below a row that stays, made a few at a time.
    for chunk in [0i64, 5] {
        let seqs: Vec<i64> = (chunk..(chunk + 5).min(7))
            .map(|b| b * 1_000_000 + 1)
            .collect();
        let n = seqs.len() as i32;
        admin
            .execute(
                "SELECT envelopes.insert_gateway_envelopes(array_fill(52, ARRAY[$1::int]), $2,
                        array_fill('\\x01'::bytea, ARRAY[$1::int]), array_fill('\\x02'::bytea, ARRAY[$1::int]),
                        expiries => array_fill(1::bigint, ARRAY[$1::int]))",
                &[&n, &seqs],
            )
            .unwrap();
    }
    admin
        .batch_execute("SELECT envelopes.insert_gateway_envelope(52, 20000001, '\\x01', '\\x02')")
        .unwrap();
    let w = writer(&db);
    let mut c = w.connect(&db);
    // The writer's cache learns the seven bands.
    for b in 0..7i64 {
        c.execute(
            "SELECT envelopes.insert_gateway_envelope(52, $1, '\\x01', '\\x02', expiry => 1)",
            &[&(b * 1_000_000 + 3)],
        )
        .unwrap();
    }
    c.batch_execute("BEGIN; SELECT 1").unwrap();
    let dropped = admin
        .query_one(
            "SELECT count(*) FILTER (WHERE dropped) FROM envelopes.prune_expired()",
            &[],
        )
        .unwrap()
        .get::<_, i64>(0);
    assert_eq!(dropped, 7);
    let seqs: Vec<i64> = (0..7).map(|b| b * 1_000_000 + 2).collect();
    let e = c
        .query_one(
            "SELECT envelopes.insert_gateway_envelopes(array_fill(52, ARRAY[7]), $1,
                    array_fill('\\x01'::bytea, ARRAY[7]), array_fill('\\x02'::bytea, ARRAY[7]))",
            &[&seqs],
        )
        .unwrap_err();
    assert_eq!(sqlstate(&e), "54000", "{e:?}");
    c.batch_execute("ROLLBACK").unwrap();
}

/// The codes the README's error table gives for NULL, empty and mismatched
/// arguments of the consumer and ingress functions.
#[test]
fn consumer_and_ingress_argument_errors_have_the_documented_codes() {
    let db = TestDb::new("argcodes");
    let w = writer(&db);
    let mut c = w.connect(&db);
    let mut admin = db.connect();
    admin
        .batch_execute("SELECT envelopes.consumer_register('q1')")
        .unwrap();
    for (as_admin, sql, code) in [
        (
            true,
            "SELECT * FROM envelopes.consumer_dead_letter_retries(NULL)",
            "22004",
        ),
        (
            true,
            "SELECT * FROM envelopes.consumer_dead_letter_retries('q1', 0)",
            "22023",
        ),
        (
            true,
            "SELECT envelopes.consumer_dead_letter('q1', 'outbox', NULL, NULL, NULL, 'r', 'e', 1)",
            "22004",
        ),
        (
            true,
            "SELECT envelopes.consumer_dead_letter('q1', 'outbox', 1, 1, 1, 'r', 'e', 1)",
            "22023",
        ),
        (
            true,
            "SELECT envelopes.consumer_dead_letter('q1', 'envelope', NULL, 1, NULL, 'r', 'e', 1)",
            "22004",
        ),
        (
            true,
            "SELECT envelopes.consumer_dead_letter_resolved('q1', NULL)",
            "22004",
        ),
        (
            false,
            "SELECT envelopes.ingress_position(NULL, 's')",
            "22004",
        ),
        (
            false,
            "SELECT envelopes.ingress_store_position(NULL, 's', 1)",
            "22004",
        ),
        (
            false,
            "SELECT envelopes.ingress_store_position('', 's', 1)",
            "22023",
        ),
        (
            false,
            "SELECT envelopes.ingress_store_position('i', 's', -1)",
            "22003",
        ),
        (
            false,
            "SELECT envelopes.ensure_gateway_parts(1, 1, 0)",
            "22023",
        ),
    ] {
        let client = if as_admin { &mut admin } else { &mut c };
        assert_eq!(outcome(client, sql), code, "{sql}");
    }
}

/// The insert functions pin `search_path` only around what runs SQL (see
/// src/pg/definer.rs). A writer that puts an operator of its own in front of the
/// built-in `=` and then inserts rows that take every path that runs SQL (a new
/// originator, so partitions are created; rows into tables with a row trigger,
/// which take the SQL insert statements) and the direct path (late and in-order
/// rows) never gets that operator called: the check has teeth, since the same
/// writer's own query does call it.
#[test]
fn a_writers_search_path_never_reaches_the_functions_sql() {
    let db = TestDb::new("hostile_path");
    let role = writer(&db);
    db.connect()
        .batch_execute(&format!(
            "GRANT CREATE ON DATABASE \"{}\" TO \"{}\"",
            db.name, role.name
        ))
        .unwrap();
    let mut w = role.connect(&db);
    w.batch_execute(
        "CREATE SCHEMA evil;
         CREATE FUNCTION evil.spy4(integer, integer) RETURNS boolean LANGUAGE plpgsql AS
             $$ BEGIN PERFORM pg_catalog.set_config('spy.ran', 'yes', false);
                      RETURN $1 OPERATOR(pg_catalog.=) $2; END $$;
         CREATE FUNCTION evil.spy8(bigint, bigint) RETURNS boolean LANGUAGE plpgsql AS
             $$ BEGIN PERFORM pg_catalog.set_config('spy.ran', 'yes', false);
                      RETURN $1 OPERATOR(pg_catalog.=) $2; END $$;
         CREATE OPERATOR evil.= (LEFTARG = integer, RIGHTARG = integer, FUNCTION = evil.spy4);
         CREATE OPERATOR evil.= (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = evil.spy8);
         SET search_path = evil, pg_catalog;",
    )
    .unwrap();
    let spied = |w: &mut Client| -> String {
        w.query_one(
            "SELECT COALESCE(pg_catalog.current_setting('spy.ran', true), '')",
            &[],
        )
        .unwrap()
        .get(0)
    };
    w.batch_execute("SELECT 1::int = 1::int").unwrap();
    assert_eq!(
        spied(&mut w),
        "yes",
        "the planted operator is the one the path finds"
    );
    w.batch_execute("SELECT pg_catalog.set_config('spy.ran', '', false)")
        .unwrap();

    for sql in [
        // A new originator: partitions created in the call.
        "SELECT envelopes.insert_gateway_envelope(9, 10, '\\x01', '\\x02')",
        // Late rows (below 10, committed), single and batch.
        "SELECT envelopes.insert_gateway_envelope(9, 4, '\\x01', '\\x02')",
        "SELECT envelopes.insert_gateway_envelopes(ARRAY[9, 9], ARRAY[5, 6]::bigint[],
             ARRAY['\\x01', '\\x01']::bytea[], ARRAY['\\x02', '\\x02']::bytea[])",
        // In order: the direct path; and a batch that creates another originator.
        "SELECT envelopes.insert_gateway_envelopes(ARRAY[9, 10], ARRAY[11, 1]::bigint[],
             ARRAY['\\x01', '\\x01']::bytea[], ARRAY['\\x02', '\\x02']::bytea[])",
    ] {
        w.batch_execute(sql)
            .unwrap_or_else(|e| panic!("{sql}: {e:?}"));
        assert_eq!(spied(&mut w), "", "the writer's operator ran inside: {sql}");
    }
    // The owner adds a row trigger (cloned onto every leaf): the rows now take the
    // SQL insert statements, late and in order, single and batch.
    db.connect()
        .batch_execute(
            "CREATE FUNCTION public.keep_row() RETURNS trigger LANGUAGE plpgsql
                 SET search_path = pg_catalog AS $$ BEGIN RETURN NEW; END $$;
             CREATE TRIGGER keep_row BEFORE INSERT ON envelopes.gateway_envelopes_meta
                 FOR EACH ROW EXECUTE FUNCTION public.keep_row()",
        )
        .unwrap();
    for sql in [
        "SELECT envelopes.insert_gateway_envelope(9, 3, '\\x01', '\\x02')",
        "SELECT envelopes.insert_gateway_envelopes(ARRAY[9, 9], ARRAY[1, 2]::bigint[],
             ARRAY['\\x01', '\\x01']::bytea[], ARRAY['\\x02', '\\x02']::bytea[])",
        "SELECT envelopes.insert_gateway_envelopes(ARRAY[9, 9], ARRAY[12, 13]::bigint[],
             ARRAY['\\x01', '\\x01']::bytea[], ARRAY['\\x02', '\\x02']::bytea[])",
    ] {
        w.batch_execute(sql)
            .unwrap_or_else(|e| panic!("{sql}: {e:?}"));
        assert_eq!(spied(&mut w), "", "the writer's operator ran inside: {sql}");
    }
    assert_eq!(
        db.int8("SELECT count(*) FROM envelopes.gateway_envelopes_view"),
        11
    );
    assert_eq!(
        db.int8("SELECT count(*) FROM envelopes.gateway_envelopes_meta WHERE late"),
        6
    );
    // One late-feed entry per statement: 4, {5, 6}, 3, {1, 2}.
    assert_eq!(db.int8("SELECT count(*) FROM envelopes.late_envelopes"), 4);
}
