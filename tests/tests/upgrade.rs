//! Upgrading from the last released version: data survives, and the upgraded
//! schema is exactly what a fresh install of the current version creates, so
//! every test of the current version holds for an upgraded database too.

use pg_envelopes_tests::{connect_to, TestDb};
use postgres::Client;

/// Everything about the extension's objects that a user could observe: functions
/// with their full definitions and privileges, relations with columns, indexes,
/// constraints, triggers, views, and the schema's privileges.
fn catalog(c: &mut Client) -> Vec<String> {
    let queries = [
        "SELECT p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ') ' ||
                pg_get_functiondef(p.oid) || ' acl=' || COALESCE(p.proacl::text, 'default')
           FROM pg_proc p WHERE p.pronamespace::regnamespace::text IN ('envelopes', 'envelopes_xmtpd')",
        "SELECT c.relname || ' ' || c.relkind::text || ' acl=' || COALESCE(c.relacl::text, 'default') || ' ' ||
                COALESCE(string_agg(a.attname || ':' || format_type(a.atttypid, a.atttypmod) || ':' ||
                         a.attnotnull || ':' || COALESCE(pg_get_expr(d.adbin, d.adrelid), ''), ',' ORDER BY a.attnum), '')
           FROM pg_class c
           LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
           LEFT JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum
          WHERE c.relnamespace = 'envelopes'::regnamespace AND c.relname NOT LIKE '%\\_o%'
          GROUP BY c.relname, c.relkind, c.relacl::text",
        "SELECT indexrelid::regclass::text || ' ' || pg_get_indexdef(indexrelid) FROM pg_index i
           JOIN pg_class c ON c.oid = i.indrelid
          WHERE c.relnamespace = 'envelopes'::regnamespace AND c.relname NOT LIKE '%\\_o%'",
        "SELECT conname || ' ' || pg_get_constraintdef(oid) FROM pg_constraint
          WHERE connamespace = 'envelopes'::regnamespace AND conrelid::regclass::text NOT LIKE '%\\_o%'",
        "SELECT tgname || ' ' || pg_get_triggerdef(t.oid) FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
          WHERE c.relnamespace = 'envelopes'::regnamespace AND NOT t.tgisinternal AND c.relname NOT LIKE '%\\_o%'",
        "SELECT viewname || ' ' || definition FROM pg_views WHERE schemaname = 'envelopes'",
        "SELECT nspname || ' acl=' || COALESCE(nspacl::text, 'default') || ' ' || COALESCE(obj_description(oid, 'pg_namespace'), '')
           FROM pg_namespace WHERE nspname IN ('envelopes', 'envelopes_xmtpd')",
    ];
    let mut out = Vec::new();
    for q in queries {
        for row in c.query(q, &[]).expect(q) {
            out.push(row.get::<_, String>(0));
        }
    }
    out.sort();
    out
}

/// The installed version of pg_envelopes in the connected database.
fn extversion(c: &mut Client) -> String {
    c.query_one(
        "SELECT extversion FROM pg_catalog.pg_extension WHERE extname = 'pg_envelopes'",
        &[],
    )
    .unwrap()
    .get(0)
}

/// Installs `from`, writes data with it (envelopes in several bands, outbox rows
/// delivered and pending, a consumer part way through, a role made with
/// grant_consumer), upgrades, and checks the data, the schema and the consumer.
fn upgrade_keeps_the_data_and_matches_a_fresh_install(from: &str) {
    let fresh = TestDb::new("fresh");
    let old = TestDb::new("old");
    let mut c = connect_to(&old.name);
    c.batch_execute(&format!(
        "DROP EXTENSION pg_envelopes; CREATE EXTENSION pg_envelopes VERSION '{from}'"
    ))
    .unwrap();
    assert_eq!(extversion(&mut c), from);
    let role = format!("{}_consumer", old.name);
    c.batch_execute(&format!(
        "SET envelopes.band_width = 10;
         SELECT envelopes.insert_gateway_envelope(n, s, '\\x01', pg_catalog.int8send(s))
           FROM generate_series(1, 3) n, generate_series(1, 25) s;
         SELECT envelopes.publish('orders.created', '\\x7b7d') FROM generate_series(1, 3);
         SELECT envelopes.consumer_register('bridge');
         SELECT envelopes.consumer_register('claimed');
         SELECT envelopes.consumer_envelope_ack('bridge', '{{1}}', '{{7}}');
         SELECT envelopes.ingress_store_position('importer', 'ORDERS', 42);
         SELECT envelopes.ingress_store_position('other', 'EVENTS', 7);
         CREATE ROLE {role} LOGIN;"
    ))
    .unwrap();
    // A writer granted before the upgrade (grant_writer came with 0.2.0).
    let writer = format!("{}_writer", old.name);
    if from != "0.1.0" {
        c.execute("SELECT envelopes.grant_consumer($1)", &[&role])
            .unwrap();
        c.batch_execute(&format!("CREATE ROLE {writer} LOGIN"))
            .unwrap();
        c.execute("SELECT envelopes.grant_writer($1)", &[&writer])
            .unwrap();
    }
    // The bridge delivered the first outbox row (in the version's own terms).
    let acked = if from == "0.1.0" || from == "0.2.0" {
        "SELECT envelopes.consumer_outbox_ack('bridge', inserted_xid, id)
           FROM envelopes.outbox ORDER BY id LIMIT 1"
    } else {
        "SELECT envelopes.consumer_outbox_ack('bridge', min(id)) FROM envelopes.outbox"
    };
    // Before 0.3.0 an outbox ack waited for the cluster-wide xmin horizon, which the
    // other tests' transactions hold back for a moment: retry, as a bridge did.
    let started = std::time::Instant::now();
    while let Err(e) = c.batch_execute(acked) {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(20),
            "outbox ack of {from}: {e}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }

    c.batch_execute("ALTER EXTENSION pg_envelopes UPDATE")
        .unwrap();
    let version = extversion(&mut c);
    let current = extversion(&mut connect_to(&fresh.name));
    assert_eq!(version, current);
    assert_ne!(version, from);

    // The schema is the same as a fresh install of the current version (roles the
    // test created aside).
    connect_to(&fresh.name)
        .execute("SELECT envelopes.grant_consumer($1)", &[&role])
        .unwrap();
    if from != "0.1.0" {
        // The writer's privileges are compared below with a fresh install's
        // writer: functions added since are granted to it by the upgrade.
        connect_to(&fresh.name)
            .execute("SELECT envelopes.grant_writer($1)", &[&writer])
            .unwrap();
    }
    if from == "0.1.0" {
        c.execute("SELECT envelopes.grant_consumer($1)", &[&role])
            .unwrap();
    }
    let upgraded = catalog(&mut c);
    let expected = catalog(&mut connect_to(&fresh.name));
    let missing: Vec<_> = expected.iter().filter(|x| !upgraded.contains(x)).collect();
    let extra: Vec<_> = upgraded.iter().filter(|x| !expected.contains(x)).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "upgrade from {from} differs from a fresh install:\nmissing {missing:#?}\nextra {extra:#?}"
    );

    // The data is intact and the current version works on it.
    assert_eq!(
        old.int8("SELECT count(*) FROM envelopes.gateway_envelopes_view"),
        75
    );
    assert_eq!(old.int8("SELECT count(*) FROM envelopes.partitions()"), 9);
    assert_eq!(
        old.int8("SELECT count(*) FROM envelopes.orphaned_envelopes()"),
        0
    );
    assert_eq!(
        old.int8("SELECT count(*) FROM envelopes.select_gateway_envelopes('{1}', '{20}', originator_node_ids => '{1}')"),
        5
    );
    assert_eq!(
        old.int8("SELECT envelopes.insert_gateway_envelope(4, 1, '\\x01', '\\x02')"),
        1
    );
    assert_eq!(
        old.int8("SELECT count(*) FROM envelopes.consumer_envelope_batch('bridge', 1000)"),
        76 - 7
    );
    // The consumer's outbox position: the two rows it had not acknowledged, never
    // the one it had.
    assert_eq!(
        old.int8("SELECT count(*) FROM envelopes.consumer_outbox_batch('bridge')"),
        2
    );
    // Ingress positions keep their stream, and are per (name, stream) from now on:
    // the same name reading a second stream starts that stream at 0 and leaves the
    // first one's position alone (before 0.4.0 it kept the larger of the two).
    assert_eq!(
        old.int8("SELECT envelopes.ingress_position('importer', 'ORDERS')"),
        42
    );
    assert_eq!(
        old.int8("SELECT envelopes.ingress_position('importer', 'OTHER_STREAM')"),
        0
    );
    old.int8("SELECT count(*) FROM (SELECT envelopes.ingress_store_position('importer', 'OTHER_STREAM', 5)) s");
    assert_eq!(
        old.int8("SELECT envelopes.ingress_position('importer', 'ORDERS')"),
        42
    );
    assert_eq!(
        old.int8("SELECT envelopes.ingress_position('importer', 'OTHER_STREAM')"),
        5
    );
    assert_eq!(
        old.int8("SELECT envelopes.ingress_position('other', 'EVENTS')"),
        7
    );
    // The role made with grant_consumer before the upgrade can use the new functions.
    let mut as_role = postgres::Client::connect(
        &format!("{} dbname={} user={role}", old.server, old.name),
        postgres::NoTls,
    )
    .unwrap();
    as_role
        .batch_execute(
            "SELECT envelopes.consumer_register('mine');
             SELECT * FROM envelopes.consumer_envelope_batch('mine', 10, 100000);
             SELECT envelopes.consumer_set_owner('mine', current_user::regrole);",
        )
        .unwrap();
    // A consumer made before the upgrade belongs to the first role that acted for
    // it after the upgrade: here the extension's owner, whose batches are above.
    let refused = as_role
        .query(
            "SELECT * FROM envelopes.consumer_envelope_batch('bridge', 10)",
            &[],
        )
        .unwrap_err();
    assert_eq!(refused.code().map(|c| c.code()), Some("42501"));
    // One nobody acted for yet becomes the first role's: the bridge that goes on
    // using its consumer after the upgrade keeps it.
    as_role
        .query(
            "SELECT * FROM envelopes.consumer_envelope_batch('claimed', 10)",
            &[],
        )
        .unwrap();
    let owner: String = as_role
        .query_one(
            "SELECT owner::text FROM envelopes.consumer_status WHERE consumer = 'claimed'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(owner, role);
    drop(as_role);
    if from != "0.1.0" {
        // The writer granted before the upgrade calls the forms added since
        // (the packed rows pg_envelopes_router sends).
        let mut as_writer = postgres::Client::connect(
            &format!("{} dbname={} user={writer}", old.server, old.name),
            postgres::NoTls,
        )
        .unwrap();
        let packed = |seq: i64| {
            format!(
                "pg_catalog.encode(pg_catalog.int8send({seq}::bigint) || pg_catalog.int4send(1)
                    || '\\x01'::bytea || pg_catalog.int4send(1) || '\\x02'::bytea
                    || '\\x00'::bytea, 'base64')"
            )
        };
        for sql in [
            format!(
                "SELECT envelopes.insert_gateway_envelope_packed(5, {})",
                packed(1)
            ),
            format!(
                "SELECT envelopes.insert_gateway_envelopes_packed(5, {})",
                packed(2)
            ),
        ] {
            let n: i64 = as_writer
                .query_one(sql.as_str(), &[])
                .unwrap_or_else(|e| panic!("{sql} as a writer of {from}: {e}"))
                .get(0);
            assert_eq!(n, 1, "{sql}");
        }
        drop(as_writer);
        assert_eq!(
            old.int8("SELECT count(*) FROM envelopes.gateway_envelopes_view WHERE originator_node_id = 5"),
            2
        );
        connect_to(&fresh.name)
            .batch_execute(&format!("DROP OWNED BY {writer}"))
            .unwrap();
        c.batch_execute(&format!("DROP OWNED BY {writer}; DROP ROLE {writer}"))
            .unwrap();
    }
    connect_to(&fresh.name)
        .batch_execute(&format!("DROP OWNED BY {role}"))
        .unwrap();
    c.batch_execute(&format!("DROP OWNED BY {role}; DROP ROLE {role}"))
        .unwrap();
}

#[test]
fn upgrading_from_0_1_0_keeps_the_data_and_matches_a_fresh_install() {
    upgrade_keeps_the_data_and_matches_a_fresh_install("0.1.0");
}

#[test]
fn upgrading_from_0_2_0_keeps_the_data_and_matches_a_fresh_install() {
    upgrade_keeps_the_data_and_matches_a_fresh_install("0.2.0");
}

#[test]
fn upgrading_from_0_3_0_keeps_the_data_and_matches_a_fresh_install() {
    upgrade_keeps_the_data_and_matches_a_fresh_install("0.3.0");
}

/// The late feed across the upgrade from 0.3.0: a consumer's position in the
/// old one-row entries becomes a position after their whole entry, so it gets
/// the late row it had not acknowledged, once, and the late rows written after
/// the upgrade (range entries), once; a consumer from the start gets them all.
#[test]
fn late_feed_positions_survive_the_upgrade_from_0_3_0() {
    let db = TestDb::new("late_upgrade");
    let mut c = connect_to(&db.name);
    // The extension committed first: 0.3.0 creates bands in a worker, which
    // would wait for the locks of an uncommitted CREATE EXTENSION.
    c.batch_execute("DROP EXTENSION pg_envelopes; CREATE EXTENSION pg_envelopes VERSION '0.3.0'")
        .unwrap();
    for sql in [
        "SELECT envelopes.consumer_register('late')",
        "SELECT envelopes.insert_gateway_envelope(1, 100, '\\x01', '\\x02')",
        "SELECT envelopes.insert_gateway_envelope(1, 10, '\\x01', '\\x02')",
    ] {
        c.batch_execute(sql).unwrap();
    }
    let read = |c: &mut Client| -> Vec<(i64, Option<i64>)> {
        c.query(
            "SELECT originator_sequence_id, late_id FROM envelopes.consumer_envelope_batch('late', 1000)",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
    };
    let ack = |c: &mut Client, rows: &[(i64, Option<i64>)]| {
        let late = rows.iter().filter_map(|r| r.1).max();
        let top = rows
            .iter()
            .filter(|r| r.1.is_none())
            .map(|r| r.0)
            .max()
            .unwrap_or(0);
        c.execute(
            "SELECT envelopes.consumer_envelope_ack('late', '{1}', ARRAY[$1::bigint], $2)",
            &[&top, &late],
        )
        .unwrap();
    };
    let first = read(&mut c);
    assert_eq!(first.len(), 2, "{first:?}");
    ack(&mut c, &first);
    c.batch_execute("SELECT envelopes.insert_gateway_envelope(1, 20, '\\x01', '\\x02')")
        .unwrap();
    c.batch_execute("ALTER EXTENSION pg_envelopes UPDATE")
        .unwrap();
    c.batch_execute(
        "SELECT envelopes.insert_gateway_envelopes(ARRAY[1, 1, 1], ARRAY[30, 31, 33]::bigint[],
             ARRAY['\\x01', '\\x01', '\\x01']::bytea[], ARRAY['\\x02', '\\x02', '\\x02']::bytea[])",
    )
    .unwrap();
    let mut rest = Vec::new();
    loop {
        let batch = read(&mut c);
        if batch.is_empty() {
            break;
        }
        ack(&mut c, &batch);
        rest.extend(batch.iter().map(|r| r.0));
    }
    rest.sort();
    assert_eq!(rest, vec![20, 30, 31, 33]);
    c.batch_execute("SELECT envelopes.consumer_register('again')")
        .unwrap();
    let all: i64 = c
        .query_one(
            "SELECT count(*) FROM envelopes.consumer_envelope_batch('again', 1000)",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(
        all, 6,
        "100, then 10, 20 (one-row entries) and 30, 31, 33 (a range)"
    );
}
