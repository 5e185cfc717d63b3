//! Least privilege, over real connections as application roles, and hostile
//! values that must never reach SQL text.

use pg_envelopes_tests::{sqlstate, Role, TestDb};
use postgres::Client;

/// The SQLSTATE of a statement, or "ok".
fn outcome(c: &mut Client, sql: &str) -> String {
    match c.batch_execute(sql) {
        Ok(()) => "ok".into(),
        Err(e) => sqlstate(&e),
    }
}

fn revoke_everything(db: &TestDb, role: &Role) {
    db.connect()
        .batch_execute(&format!(
            "DROP OWNED BY \"{}\"",
            role.name.replace('"', "\"\"")
        ))
        .unwrap();
}

#[test]
fn a_writer_inserts_and_creates_partitions_but_cannot_read_or_alter() {
    let db = TestDb::new("writer");
    db.connect()
        .execute(
            "SELECT envelopes.insert_gateway_envelope(1, 1, '\\x01', '\\x02')",
            &[],
        )
        .unwrap();
    let writer = Role::new(&db, "w");
    db.connect()
        .execute("SELECT envelopes.grant_writer($1)", &[&writer.name])
        .unwrap();
    let mut c = writer.connect(&db);
    for mode in ["worker", "transaction"] {
        // Where partitions are created is the owner's setting, given per role.
        db.connect()
            .batch_execute(&format!(
                "ALTER ROLE \"{}\" IN DATABASE \"{}\" SET envelopes.create_partitions_in = '{mode}'",
                writer.name, db.name
            ))
            .unwrap();
        c = writer.connect(&db);
        let node = if mode == "worker" { 50 } else { 51 };
        // A new originator and a new band: partitions created for a role that owns nothing.
        assert_eq!(
            outcome(
                &mut c,
                &format!("SELECT envelopes.insert_gateway_envelope({node}, 1, '\\x01', '\\x02')")
            ),
            "ok"
        );
        assert_eq!(
            outcome(
                &mut c,
                &format!(
                    "SELECT envelopes.insert_gateway_envelope({node}, 5000000, '\\x01', '\\x02')"
                )
            ),
            "ok"
        );
        assert_eq!(
            outcome(&mut c, &format!(
                "SELECT envelopes.insert_gateway_envelopes(ARRAY[{node}], ARRAY[2]::bigint[], ARRAY['\\x01']::bytea[], ARRAY['\\x01']::bytea[])"
            )),
            "ok"
        );
    }
    assert_eq!(
        outcome(&mut c, "SELECT envelopes.ensure_gateway_parts(52, 1)"),
        "ok"
    );
    assert_eq!(
        outcome(
            &mut c,
            "SELECT envelopes.publish('orders.created', '\\x01')"
        ),
        "ok"
    );
    assert_eq!(db.int8("SELECT count(*) FROM envelopes.gateway_envelopes_meta WHERE originator_node_id IN (50, 51)"), 6);
    // Denied: reading, owning, altering, creating.
    for sql in [
        "SELECT * FROM envelopes.gateway_envelopes_meta",
        "SELECT * FROM envelopes.gateway_envelopes_view",
        "SELECT * FROM envelopes.gateway_envelopes_meta_o50_s0_1000000",
        "SELECT * FROM envelopes.select_gateway_envelopes()",
        "SELECT * FROM envelopes.select_originator(50)",
        "SELECT * FROM envelopes.originator_maxima('{50}')",
        "SELECT * FROM envelopes.select_newest_by_topic('{\\x01}')",
        "SELECT * FROM envelopes.outbox",
        "DROP TABLE envelopes.gateway_envelopes_meta_o50_s0_1000000",
        "ALTER TABLE envelopes.gateway_envelopes_meta_o50 DETACH PARTITION envelopes.gateway_envelopes_meta_o50_s0_1000000",
        "DELETE FROM envelopes.gateway_envelopes_meta",
        "CREATE TABLE envelopes.mine (x int)",
        "SELECT * FROM envelopes.prune_expired()",
        "SELECT envelopes.grant_writer(current_user)",
    ] {
        assert_eq!(outcome(&mut c, sql), "42501", "{sql}");
    }
    // Revoked: inserts are denied again.
    db.connect()
        .execute("SELECT envelopes.revoke_writer($1)", &[&writer.name])
        .unwrap();
    assert_eq!(
        outcome(
            &mut c,
            "SELECT envelopes.insert_gateway_envelope(1, 9, '\\x01', '\\x02')"
        ),
        "42501"
    );
    db.connect()
        .batch_execute(&format!(
            "ALTER ROLE \"{}\" IN DATABASE \"{}\" RESET ALL",
            writer.name, db.name
        ))
        .unwrap();
    revoke_everything(&db, &writer);
}

#[test]
fn a_reader_reads_and_nothing_else() {
    let db = TestDb::new("reader");
    db.connect()
        .execute(
            "SELECT envelopes.insert_gateway_envelope(1, 1, '\\x01', '\\x02')",
            &[],
        )
        .unwrap();
    let reader = Role::new(&db, "r");
    db.connect()
        .execute("SELECT envelopes.grant_reader($1)", &[&reader.name])
        .unwrap();
    let mut c = reader.connect(&db);
    for sql in [
        "SELECT * FROM envelopes.select_gateway_envelopes()",
        "SELECT * FROM envelopes.gateway_envelopes_view",
        "SELECT * FROM envelopes.originator_ceilings()",
        "SELECT * FROM envelopes.partitions()",
        "SELECT * FROM envelopes.select_by_topic_cursors('{\\x01}', '{1}', '{0}')",
        "SELECT * FROM envelopes.select_wave('{\\x01}', '{1}', '{0}', '{1}', '{9}', commit_safe => true)",
        "SELECT * FROM envelopes.select_newest_by_topic('{\\x01}')",
        "SELECT * FROM envelopes.select_originator(1)",
        "SELECT * FROM envelopes.originator_maxima('{1}')",
    ] {
        assert_eq!(outcome(&mut c, sql), "ok", "{sql}");
    }
    assert_eq!(
        c.query("SELECT * FROM envelopes.select_gateway_envelopes()", &[])
            .unwrap()
            .len(),
        1
    );
    for sql in [
        "SELECT envelopes.insert_gateway_envelope(1, 2, '\\x01', '\\x02')",
        "SELECT envelopes.publish('s', '\\x01')",
        "SELECT envelopes.ensure_gateway_parts(9, 1)",
        "SELECT * FROM envelopes.gateway_envelopes_meta",
        "SELECT * FROM envelopes.consumer_outbox_batch('x')",
        "INSERT INTO envelopes.gateway_envelopes_meta (originator_node_id, originator_sequence_id, topic) VALUES (1, 3, '\\x01')",
    ] {
        assert_eq!(outcome(&mut c, sql), "42501", "{sql}");
    }
    revoke_everything(&db, &reader);
}

#[test]
fn a_consumer_keeps_its_cursor_and_a_stranger_gets_nothing() {
    let db = TestDb::new("consumer");
    db.connect()
        .execute("SELECT envelopes.publish('s', '\\x01')", &[])
        .unwrap();
    let consumer = Role::new(&db, "c");
    let stranger = Role::new(&db, "x");
    db.connect()
        .execute("SELECT envelopes.grant_consumer($1)", &[&consumer.name])
        .unwrap();
    let mut c = consumer.connect(&db);
    assert_eq!(
        outcome(&mut c, "SELECT envelopes.consumer_register('bridge')"),
        "ok"
    );
    let rows = c
        .query(
            "SELECT id FROM envelopes.consumer_outbox_batch('bridge')",
            &[],
        )
        .unwrap();
    assert_eq!(rows.len(), 1);
    let id: i64 = rows[0].get(0);
    c.execute("SELECT envelopes.consumer_outbox_ack('bridge', $1)", &[&id])
        .unwrap();
    assert_eq!(
        outcome(
            &mut c,
            "SELECT * FROM envelopes.consumer_envelope_batch('bridge', 10, 1000)"
        ),
        "ok"
    );
    assert_eq!(
        outcome(
            &mut c,
            "SELECT * FROM envelopes.consumer_dead_letter_retries('bridge')"
        ),
        "ok"
    );
    // Asking for retries is the operator's, not the consumer's.
    assert_eq!(
        outcome(&mut c, "SELECT envelopes.retry_dead_letters()"),
        "42501"
    );
    assert_eq!(
        outcome(&mut c, "SELECT * FROM envelopes.consumer_status"),
        "ok"
    );
    assert_eq!(
        outcome(&mut c, "SELECT envelopes.publish('s', '\\x01')"),
        "42501"
    );
    let mut s = stranger.connect(&db);
    for sql in [
        "SELECT * FROM envelopes.select_gateway_envelopes()",
        "SELECT * FROM envelopes.select_by_topic_cursors('{\\\\x01}', '{1}', '{0}')",
        "SELECT * FROM envelopes.select_wave('{\\\\x01}', '{1}', '{0}', '{1}', '{9}')",
        "SELECT envelopes.insert_gateway_envelope(1, 1, '\\x01', '\\x02')",
        "SELECT envelopes.publish('s', '\\x01')",
        "SELECT * FROM envelopes.gateway_envelopes_view",
        "SELECT * FROM envelopes.consumer_status",
    ] {
        assert_eq!(outcome(&mut s, sql), "42501", "{sql}");
    }
    revoke_everything(&db, &consumer);
}

#[test]
fn grant_functions_check_their_argument() {
    let db = TestDb::new("grants");
    let mut c = db.connect();
    assert_eq!(
        outcome(&mut c, "SELECT envelopes.grant_writer('no_such_role_here')"),
        "42704"
    );
    assert_eq!(
        outcome(&mut c, "SELECT envelopes.grant_reader(NULL)"),
        "22004"
    );
}

/// Names and values built to break out of SQL text go through as data: a role
/// whose name is an injection attempt gets exactly the grant, a channel, a subject,
/// a consumer name and a topic full of quotes are stored or used verbatim, and the
/// tables are all still there.
#[test]
fn hostile_values_stay_data() {
    let db = TestDb::new("hostile");
    let evil = Role {
        name: format!("evil\"; DROP TABLE envelopes.outbox; --{}", db.name.len()),
    };
    db.connect()
        .batch_execute(&format!(
            "CREATE ROLE \"{}\" LOGIN",
            evil.name.replace('"', "\"\"")
        ))
        .unwrap();
    let mut c = db.connect();
    c.execute("SELECT envelopes.grant_writer($1)", &[&evil.name])
        .unwrap();
    c.execute("SELECT envelopes.grant_consumer($1)", &[&evil.name])
        .unwrap();
    assert_eq!(
        db.int8("SELECT count(*) FROM pg_catalog.pg_tables WHERE schemaname = 'envelopes' AND tablename = 'outbox'"),
        1
    );
    let granted: bool = c
        .query_one(
            "SELECT has_function_privilege($1, 'envelopes.publish(text, bytea, jsonb)', 'EXECUTE')",
            &[&evil.name],
        )
        .unwrap()
        .get(0);
    assert!(granted);

    // A channel with quotes and a semicolon is a channel name, nothing more.
    let channel = "ch\"'; DROP TABLE envelopes.outbox; --";
    let mut listener = db.connect();
    listener
        .batch_execute(&format!("LISTEN \"{}\"", channel.replace('"', "\"\"")))
        .unwrap();
    c.execute(
        "SELECT set_config('envelopes.notify_channel', $1, false)",
        &[&channel],
    )
    .unwrap();
    c.batch_execute("SET envelopes.notify_interval = 0")
        .unwrap();
    let subject = "orders.'\";DROP.TABLE";
    c.execute("SELECT envelopes.publish($1, '\\x27')", &[&subject])
        .unwrap();
    let topic: &[u8] = b"'); DROP TABLE envelopes.gateway_envelopes_meta; --";
    c.execute(
        "SELECT envelopes.insert_gateway_envelope(1, 1, $1, $1)",
        &[&topic],
    )
    .unwrap();
    let consumer = "bridge'); DROP TABLE envelopes.consumers; --";
    c.execute("SELECT envelopes.consumer_register($1)", &[&consumer])
        .unwrap();
    {
        use postgres::fallible_iterator::FallibleIterator;
        let mut notes = listener.notifications();
        let got = notes
            .timeout_iter(std::time::Duration::from_secs(2))
            .next()
            .unwrap();
        assert_eq!(
            got.map(|n| n.channel().to_owned()).as_deref(),
            Some(channel)
        );
    }
    assert_eq!(
        db.int8("SELECT count(*) FROM envelopes.outbox WHERE subject = 'orders.''\";DROP.TABLE'"),
        1
    );
    let stored: Vec<u8> = c
        .query_one("SELECT topic FROM envelopes.gateway_envelopes_meta", &[])
        .unwrap()
        .get(0);
    assert_eq!(stored, topic);
    assert_eq!(
        c.query(
            "SELECT 1 FROM envelopes.consumers WHERE name = $1",
            &[&consumer]
        )
        .unwrap()
        .len(),
        1
    );
    assert_eq!(
        db.int8("SELECT count(*) FROM pg_catalog.pg_tables WHERE schemaname = 'envelopes' AND tablename IN ('outbox', 'consumers', 'gateway_envelopes_meta')"),
        3
    );
    // A setting that must be a number rejects text.
    assert_eq!(
        outcome(
            &mut c,
            "SET envelopes.band_width = '1; DROP TABLE envelopes.outbox'"
        ),
        "22023"
    );
    c.batch_execute(&format!(
        "DROP OWNED BY \"{}\"",
        evil.name.replace('"', "\"\"")
    ))
    .unwrap();
}

/// `envelope_of` (behind `gateway_envelopes_view`) checks the caller's privilege
/// once per statement, not once per transaction: a revoke that has committed
/// is seen by the next statement of a transaction that only reads.
#[test]
fn a_revoke_reaches_the_view_at_the_next_statement() {
    let db = TestDb::new("revoke_view");
    db.connect()
        .batch_execute(
            "SELECT envelopes.insert_gateway_envelopes('{1,1}', '{1,2}',
                 ARRAY['\\x01'::bytea, '\\x01'], ARRAY['\\xaa'::bytea, '\\xbb'])",
        )
        .unwrap();
    let reader = Role::new(&db, "rv");
    db.connect()
        .execute("SELECT envelopes.grant_reader($1)", &[&reader.name])
        .unwrap();
    let mut c = reader.connect(&db);
    c.batch_execute("BEGIN").unwrap();
    let first: Vec<u8> = c
        .query_one("SELECT envelopes.envelope_of(1, 1)", &[])
        .unwrap()
        .get(0);
    assert_eq!(first, vec![0xaa]);
    db.connect()
        .execute("SELECT envelopes.revoke_reader($1)", &[&reader.name])
        .unwrap();
    for sql in [
        "SELECT envelopes.envelope_of(1, 2)",
        "SELECT count(*) FROM envelopes.gateway_envelopes_meta m, LATERAL (SELECT envelopes.envelope_of(m.originator_node_id, m.originator_sequence_id)) e",
    ] {
        let err = c.query_one(sql, &[]).unwrap_err();
        assert_eq!(sqlstate(&err), "42501", "{sql}");
        c.batch_execute("ROLLBACK; BEGIN").unwrap();
    }
    c.batch_execute("ROLLBACK").unwrap();
    revoke_everything(&db, &reader);
}

/// A grant of SELECT on the view's columns (the envelope among them) is enough
/// to read it, as for any view, with EXECUTE on the view's lookup (which is not
/// PUBLIC's: `grant_reader` grants it); a grant of other columns only is not.
#[test]
fn a_column_grant_on_the_view_reads_it() {
    let db = TestDb::new("column_view");
    db.connect()
        .batch_execute("SELECT envelopes.insert_gateway_envelope(3, 1, '\\x01', '\\xcc')")
        .unwrap();
    let some = Role::new(&db, "cols");
    let few = Role::new(&db, "few");
    db.connect()
        .batch_execute(&format!(
            "GRANT USAGE ON SCHEMA envelopes TO \"{0}\", \"{1}\";
             GRANT SELECT (originator_node_id, originator_sequence_id, originator_envelope)
                ON envelopes.gateway_envelopes_view TO \"{0}\";
             GRANT EXECUTE ON FUNCTION envelopes.envelope_of(integer, bigint) TO \"{0}\";
             GRANT SELECT (originator_node_id, originator_sequence_id)
                ON envelopes.gateway_envelopes_view TO \"{1}\";",
            some.name, few.name
        ))
        .unwrap();
    let mut c = some.connect(&db);
    let got: Vec<u8> = c
        .query_one(
            "SELECT originator_envelope FROM envelopes.gateway_envelopes_view WHERE originator_node_id = 3",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(got, vec![0xcc]);
    let mut f = few.connect(&db);
    let err = f
        .query_one("SELECT envelopes.envelope_of(3, 1)", &[])
        .unwrap_err();
    assert_eq!(sqlstate(&err), "42501");
    revoke_everything(&db, &some);
    revoke_everything(&db, &few);
}

/// `envelope_of` reads blob for whoever calls it: PUBLIC may not (a role with
/// only USAGE on the schema gets 42501), `grant_reader` grants it with the view
/// and `revoke_reader` takes it back.
#[test]
fn envelope_of_comes_with_the_reader_bundle_only() {
    let db = TestDb::new("lookup_grant");
    db.connect()
        .batch_execute("SELECT envelopes.insert_gateway_envelope(1, 1, '\\x01', '\\xaa')")
        .unwrap();
    let role = Role::new(&db, "lk");
    let may = |db: &TestDb| -> bool {
        db.connect()
            .query_one(
                "SELECT pg_catalog.has_function_privilege($1, 'envelopes.envelope_of(integer, bigint)', 'EXECUTE')",
                &[&role.name],
            )
            .unwrap()
            .get(0)
    };
    db.connect()
        .batch_execute(&format!(
            "GRANT USAGE ON SCHEMA envelopes TO \"{}\"",
            role.name
        ))
        .unwrap();
    assert!(!may(&db), "PUBLIC may execute envelope_of");
    assert_eq!(
        outcome(&mut role.connect(&db), "SELECT envelopes.envelope_of(1, 1)"),
        "42501"
    );
    db.connect()
        .execute("SELECT envelopes.grant_reader($1)", &[&role.name])
        .unwrap();
    assert!(may(&db));
    let got: Vec<u8> = role
        .connect(&db)
        .query_one("SELECT envelopes.envelope_of(1, 1)", &[])
        .unwrap()
        .get(0);
    assert_eq!(got, [0xaa]);
    db.connect()
        .execute("SELECT envelopes.revoke_reader($1)", &[&role.name])
        .unwrap();
    assert!(!may(&db));
    revoke_everything(&db, &role);
}

/// Row-level security on blob reaches the bytes. With policies on meta and blob
/// limiting a role to originator 1 and the view made `security_invoker` (so the
/// role's own rights and policies apply), the role gets node 2's bytes neither
/// from `envelope_of` nor from the view; with a policy on blob only, the view
/// leaves out the rows whose blob row the policy hides, as a join does. Through
/// the view as created (not `security_invoker`), a reader without rights of its
/// own on blob reads it with the view owner's rights, as through a view joining
/// meta and blob; a role with rights of its own on blob stays held to its own
/// policies there (`envelope_of` cannot tell a call through the view from a
/// direct one, and must not give such a role more than its policies allow).
#[test]
fn row_level_security_on_blob_reaches_the_bytes() {
    let db = TestDb::new("rls_view");
    let mut admin = db.connect();
    admin
        .batch_execute(
            "SELECT envelopes.insert_gateway_envelopes(array_agg(n), array_agg(s::bigint),
                 array_agg('\\x01'::bytea), array_agg(pg_catalog.int4send(n * 100 + s)))
               FROM generate_series(1, 2) n, generate_series(1, 5) s",
        )
        .unwrap();
    let role = Role::new(&db, "rls");
    admin
        .execute("SELECT envelopes.grant_reader($1)", &[&role.name])
        .unwrap();
    admin
        .batch_execute(&format!(
            "GRANT SELECT ON envelopes.gateway_envelopes_meta, envelopes.gateway_envelopes_blob
                TO \"{0}\";
             ALTER TABLE envelopes.gateway_envelopes_meta ENABLE ROW LEVEL SECURITY;
             ALTER TABLE envelopes.gateway_envelopes_blob ENABLE ROW LEVEL SECURITY;
             CREATE POLICY only_one ON envelopes.gateway_envelopes_meta FOR SELECT TO \"{0}\"
                 USING (originator_node_id = 1);
             CREATE POLICY only_one ON envelopes.gateway_envelopes_blob FOR SELECT TO \"{0}\"
                 USING (originator_node_id = 1);
             ALTER VIEW envelopes.gateway_envelopes_view SET (security_invoker = true);
             CREATE VIEW public.joined AS
                 SELECT m.originator_node_id, m.originator_sequence_id, b.originator_envelope
                   FROM envelopes.gateway_envelopes_meta m
                   JOIN envelopes.gateway_envelopes_blob b USING (originator_node_id, originator_sequence_id);
             GRANT SELECT ON public.joined TO \"{0}\";",
            role.name
        ))
        .unwrap();
    let mut r = role.connect(&db);
    let count = |c: &mut Client, sql: &str| -> i64 {
        c.query_one(sql, &[])
            .unwrap_or_else(|e| panic!("{sql}: {e:?}"))
            .get(0)
    };
    let bytes: Option<Vec<u8>> = r
        .query_one("SELECT envelopes.envelope_of(2, 5)", &[])
        .unwrap()
        .get(0);
    assert_eq!(bytes, None, "node 2's bytes through envelope_of");
    let bytes: Option<Vec<u8>> = r
        .query_one("SELECT envelopes.envelope_of(1, 5)", &[])
        .unwrap()
        .get(0);
    assert_eq!(bytes, Some(105i32.to_be_bytes().to_vec()));
    let view = "SELECT count(*) FROM envelopes.gateway_envelopes_view";
    assert_eq!(count(&mut r, view), 5, "policies on both");
    // A policy on blob only: the view is what a join of the role's rows is.
    admin
        .batch_execute(
            "DROP POLICY only_one ON envelopes.gateway_envelopes_meta;
             ALTER TABLE envelopes.gateway_envelopes_meta DISABLE ROW LEVEL SECURITY;",
        )
        .unwrap();
    let joined = "SELECT count(*) FROM envelopes.gateway_envelopes_meta m
                    JOIN envelopes.gateway_envelopes_blob b USING (originator_node_id, originator_sequence_id)";
    assert_eq!(
        count(
            &mut r,
            "SELECT count(*) FROM envelopes.gateway_envelopes_meta"
        ),
        10
    );
    assert_eq!(count(&mut r, joined), 5);
    assert_eq!(count(&mut r, view), 5, "policy on blob only");
    // The view as created reads blob with its owner's rights for a reader with
    // none of its own, as a join view owned by the same role does.
    admin
        .batch_execute("ALTER VIEW envelopes.gateway_envelopes_view RESET (security_invoker)")
        .unwrap();
    let plain = Role::new(&db, "rls_plain");
    admin
        .execute("SELECT envelopes.grant_reader($1)", &[&plain.name])
        .unwrap();
    admin
        .batch_execute(&format!(
            "GRANT SELECT ON public.joined TO \"{0}\";
             CREATE POLICY plain_one ON envelopes.gateway_envelopes_blob FOR SELECT TO \"{0}\"
                 USING (originator_node_id = 1);",
            plain.name
        ))
        .unwrap();
    let mut p = plain.connect(&db);
    assert_eq!(count(&mut p, "SELECT count(*) FROM public.joined"), 10);
    assert_eq!(count(&mut p, view), 10, "a view reading as its owner");
    let mut r = role.connect(&db);
    assert_eq!(
        count(&mut r, view),
        5,
        "a role held to its own policies on blob"
    );
    admin
        .batch_execute(&format!(
            "DROP VIEW public.joined;
             DROP POLICY only_one ON envelopes.gateway_envelopes_blob;
             DROP POLICY plain_one ON envelopes.gateway_envelopes_blob;
             REVOKE SELECT ON envelopes.gateway_envelopes_meta, envelopes.gateway_envelopes_blob
                 FROM \"{0}\";",
            role.name
        ))
        .unwrap();
    revoke_everything(&db, &role);
    revoke_everything(&db, &plain);
}

/// A role granted SELECT on the view's other columns (not the envelope) and
/// EXECUTE on its lookup reads those columns, with the view's meaning (a meta
/// row without its blob row left out); the envelope stays out of its reach,
/// through the view (42501) and through `envelope_of`, which answers such a role
/// an empty value for an envelope that exists instead of its bytes.
#[test]
fn column_grants_on_the_view_read_those_columns() {
    let db = TestDb::new("view_columns");
    let mut admin = db.connect();
    admin
        .batch_execute(
            "SELECT envelopes.insert_gateway_envelopes(ARRAY[3, 3, 3], ARRAY[1, 2, 3]::bigint[],
                 ARRAY['\\x01', '\\x02', '\\x03']::bytea[], ARRAY['\\xc1', '\\xc2', '\\xc3']::bytea[])",
        )
        .unwrap();
    let role = Role::new(&db, "vc");
    admin
        .batch_execute(&format!(
            "GRANT USAGE ON SCHEMA envelopes TO \"{0}\";
             GRANT SELECT (originator_node_id, originator_sequence_id, topic)
                ON envelopes.gateway_envelopes_view TO \"{0}\";
             GRANT EXECUTE ON FUNCTION envelopes.envelope_of(integer, bigint) TO \"{0}\";",
            role.name
        ))
        .unwrap();
    let mut c = role.connect(&db);
    let columns = "SELECT originator_node_id, originator_sequence_id, topic
                     FROM envelopes.gateway_envelopes_view WHERE originator_node_id = 3
                    ORDER BY originator_sequence_id";
    let read = |c: &mut Client| -> Vec<(i32, i64, Vec<u8>)> {
        c.query(columns, &[])
            .unwrap_or_else(|e| panic!("{columns}: {e:?}"))
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect()
    };
    assert_eq!(
        read(&mut c),
        [(3, 1, vec![1]), (3, 2, vec![2]), (3, 3, vec![3])]
    );
    for sql in [
        "SELECT * FROM envelopes.gateway_envelopes_view",
        "SELECT originator_envelope FROM envelopes.gateway_envelopes_view",
        "SELECT count(*) FROM envelopes.gateway_envelopes_view WHERE originator_envelope IS NOT NULL",
    ] {
        assert_eq!(outcome(&mut c, sql), "42501", "{sql}");
    }
    let answer: Option<Vec<u8>> = c
        .query_one("SELECT envelopes.envelope_of(3, 2)", &[])
        .unwrap()
        .get(0);
    assert_eq!(
        answer,
        Some(Vec::new()),
        "no bytes for a role without the column"
    );
    let answer: Option<Vec<u8>> = c
        .query_one("SELECT envelopes.envelope_of(3, 9)", &[])
        .unwrap()
        .get(0);
    assert_eq!(answer, None);
    // A meta row without its blob row is left out, as for any reader.
    admin
        .batch_execute(
            "DELETE FROM envelopes.gateway_envelopes_blob
              WHERE originator_node_id = 3 AND originator_sequence_id = 2",
        )
        .unwrap();
    assert_eq!(read(&mut c), [(3, 1, vec![1]), (3, 3, vec![3])]);
    revoke_everything(&db, &role);
}
