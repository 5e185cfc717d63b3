//! What the direct write path must keep from the SQL path: WAL that logical
//! decoding turns into inserts of both leaves, statistics counters, the doorbell,
//! and nothing left after a rollback.

use pg_envelopes_tests::TestDb;
use postgres::fallible_iterator::FallibleIterator;
use std::time::Duration;

/// Rows inserted by the functions, single and batch, come out of a logical
/// decoding slot as inserts into the band leaves of meta and blob, with their
/// values; a conflicting key produces no change; a rolled-back insert none.
/// Needs `wal_level = logical` (scripts/test.sh starts the server with it).
#[test]
fn logical_decoding_sees_direct_path_rows() {
    let db = TestDb::new("decoding");
    let mut c = db.connect();
    let level: String = c.query_one("SHOW wal_level", &[]).unwrap().get(0);
    assert_eq!(
        level, "logical",
        "scripts/test.sh starts this server with wal_level = logical"
    );
    c.batch_execute("SELECT envelopes.ensure_gateway_parts(7, 1, 10)")
        .unwrap();
    let slot = format!("s_{}", db.url().len() + std::process::id() as usize);
    c.execute(
        "SELECT pg_catalog.pg_create_logical_replication_slot($1, 'test_decoding')",
        &[&slot],
    )
    .unwrap();
    // Each its own transaction (one simple query would be one transaction).
    for sql in [
        "SELECT envelopes.insert_gateway_envelope(7, 1, '\\x0a', '\\xb1')",
        "SELECT envelopes.insert_gateway_envelope(7, 1, '\\x0a', '\\xb1')",
        "SELECT envelopes.insert_gateway_envelopes(ARRAY[7, 7, 7], ARRAY[2, 3, 2]::bigint[],
             ARRAY['\\x0b', '\\x0c', '\\x0d']::bytea[], ARRAY['\\xb2', '\\xb3', '\\xb4']::bytea[])",
    ] {
        c.batch_execute(sql).unwrap();
    }
    let mut tx = c.transaction().unwrap();
    tx.batch_execute("SELECT envelopes.insert_gateway_envelope(7, 4, '\\x0e', '\\xb5')")
        .unwrap();
    tx.rollback().unwrap();
    let changes: Vec<String> = c
        .query(
            "SELECT data FROM pg_catalog.pg_logical_slot_get_changes($1, NULL, NULL)
              WHERE data LIKE 'table %'",
            &[&slot],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    c.execute("SELECT pg_catalog.pg_drop_replication_slot($1)", &[&slot])
        .unwrap();
    let inserts = |table: &str| {
        changes
            .iter()
            .filter(|c| {
                c.contains(&format!("gateway_envelopes_{table}_o7_s")) && c.contains(": INSERT:")
            })
            .count()
    };
    assert_eq!(inserts("meta"), 3, "{changes:#?}");
    assert_eq!(inserts("blob"), 3, "{changes:#?}");
    assert_eq!(
        changes.len(),
        6,
        "only inserts, no speculative leftovers: {changes:#?}"
    );
    for (seq, envelope) in [(1, "b1"), (2, "b2"), (3, "b3")] {
        assert!(
            changes.iter().any(|c| c.contains("blob")
                && c.contains(&format!("originator_sequence_id[bigint]:{seq} "))
                && c.contains(&format!("originator_envelope[bytea]:'\\x{envelope}'"))),
            "blob row {seq}: {changes:#?}"
        );
    }
}

/// The statistics views count the rows the direct path wrote into each leaf.
#[test]
fn statistics_count_direct_path_rows() {
    let db = TestDb::new("stats");
    let mut c = db.connect();
    c.batch_execute(
        "SELECT envelopes.ensure_gateway_parts(3, 1, 10);
         SELECT envelopes.insert_gateway_envelope(3, s, '\\x01', '\\x02') FROM generate_series(1, 5) s;
         SELECT envelopes.insert_gateway_envelopes(array_agg(3), array_agg(s::bigint),
                array_agg('\\x01'::bytea), array_agg('\\x02'::bytea)) FROM generate_series(6, 9) s;",
    )
    .unwrap();
    // The counters reach the shared statistics when the session reports them.
    drop(c);
    let mut c = db.connect();
    for _ in 0..50 {
        let counted: i64 = c
            .query_one(
                "SELECT COALESCE(sum(n_tup_ins), 0)::bigint FROM pg_catalog.pg_stat_user_tables
                  WHERE relname LIKE 'gateway\\_envelopes\\_%\\_o3\\_s%'",
                &[],
            )
            .unwrap()
            .get(0);
        if counted == 18 {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
        c.batch_execute("SELECT pg_catalog.pg_stat_clear_snapshot()")
            .unwrap();
    }
    panic!("pg_stat_user_tables never counted the 18 rows");
}

/// A direct-path insert rings the doorbell once per transaction, after commit;
/// a transaction that inserted nothing new does not ring.
#[test]
fn the_doorbell_rings_for_direct_path_rows() {
    let db = TestDb::new("bell");
    let mut listener = db.connect();
    listener.batch_execute("LISTEN envelopes").unwrap();
    let mut writer = db.connect();
    writer
        .batch_execute(
            "SET envelopes.notify_interval = 0;
             BEGIN;
             SELECT envelopes.insert_gateway_envelope(5, 1, '\\x01', '\\x02');
             SELECT envelopes.insert_gateway_envelopes(ARRAY[5], ARRAY[2]::bigint[],
                 ARRAY['\\x01']::bytea[], ARRAY['\\x02']::bytea[]);
             COMMIT;",
        )
        .unwrap();
    let mut got = Vec::new();
    {
        let mut notes = listener.notifications();
        let mut it = notes.timeout_iter(Duration::from_secs(5));
        while let Some(n) = it.next().unwrap() {
            got.push(n.payload().to_owned());
            if got.len() > 1 {
                break;
            }
        }
    }
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(got[0].contains("\"envelopes\""), "{got:?}");
    // Nothing new: no notification. (The highest key: a lower one would be a late
    // arrival, which takes the SQL path and its statement trigger.)
    writer
        .batch_execute("SELECT envelopes.insert_gateway_envelope(5, 2, '\\x01', '\\x02')")
        .unwrap();
    let mut notes = listener.notifications();
    let mut it = notes.timeout_iter(Duration::from_millis(500));
    assert!(
        it.next().unwrap().is_none(),
        "a duplicate rang the doorbell"
    );
}

/// Tables the direct path would not reproduce send their rows through the SQL
/// statements, which give them exactly what an INSERT gives: a row trigger
/// (cloned from the root onto the leaves) fires and its change is stored; a
/// statement trigger on a root other than the doorbell fires; a column added with
/// a default gets it; a column made NOT NULL refuses a NULL with 23502.
#[test]
fn tables_changed_by_hand_get_what_an_insert_gives() {
    let db = TestDb::new("by_hand");
    let mut c = db.connect();
    let one = |c: &mut postgres::Client, seq: i64| -> Result<i64, postgres::Error> {
        c.query_one(
            "SELECT envelopes.insert_gateway_envelope(1, $1, '\\x01', '\\x02')",
            &[&seq],
        )
        .map(|r| r.get(0))
    };
    assert_eq!(one(&mut c, 1).unwrap(), 1);

    c.batch_execute(
        "CREATE FUNCTION public.tag_payer() RETURNS trigger LANGUAGE plpgsql AS
             $$ BEGIN NEW.payer_id := 99; RETURN NEW; END $$;
         CREATE TRIGGER tag_payer BEFORE INSERT ON envelopes.gateway_envelopes_meta
             FOR EACH ROW EXECUTE FUNCTION public.tag_payer()",
    )
    .unwrap();
    assert_eq!(one(&mut c, 2).unwrap(), 1);
    c.batch_execute(
        "SELECT envelopes.insert_gateway_envelopes(ARRAY[1, 1], ARRAY[3, 4]::bigint[],
             ARRAY['\\x01', '\\x01']::bytea[], ARRAY['\\x02', '\\x02']::bytea[])",
    )
    .unwrap();
    assert_eq!(
        db.int8("SELECT count(*) FROM envelopes.gateway_envelopes_meta WHERE payer_id = 99"),
        3
    );
    c.batch_execute(
        "DROP TRIGGER tag_payer ON envelopes.gateway_envelopes_meta;
         CREATE TABLE public.noted (n int);
         CREATE FUNCTION public.note() RETURNS trigger LANGUAGE plpgsql AS
             $$ BEGIN INSERT INTO public.noted VALUES (1); RETURN NULL; END $$;
         CREATE TRIGGER note AFTER INSERT ON envelopes.gateway_envelopes_blob
             FOR EACH STATEMENT EXECUTE FUNCTION public.note()",
    )
    .unwrap();
    assert_eq!(one(&mut c, 5).unwrap(), 1);
    assert_eq!(db.int8("SELECT count(*) FROM public.noted"), 1);
    c.batch_execute(
        "DROP TRIGGER note ON envelopes.gateway_envelopes_blob;
         ALTER TABLE envelopes.gateway_envelopes_meta ADD COLUMN note text DEFAULT 'noted'",
    )
    .unwrap();
    assert_eq!(one(&mut c, 6).unwrap(), 1);
    assert_eq!(
        db.int8("SELECT count(*) FROM envelopes.gateway_envelopes_meta WHERE note = 'noted'"),
        6
    );
    c.batch_execute(
        "ALTER TABLE envelopes.gateway_envelopes_meta DROP COLUMN note;
         UPDATE envelopes.gateway_envelopes_meta SET payer_id = 0 WHERE payer_id IS NULL;
         ALTER TABLE envelopes.gateway_envelopes_meta ALTER COLUMN payer_id SET NOT NULL",
    )
    .unwrap();
    let err = one(&mut c, 7).expect_err("a NULL payer_id must be refused");
    assert_eq!(pg_envelopes_tests::sqlstate(&err), "23502", "{err}");
    let with_payer: i64 = c
        .query_one(
            "SELECT envelopes.insert_gateway_envelope(1, 7, '\\x01', '\\x02', payer_id => 5)",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(with_payer, 1);
    assert_eq!(
        db.int8("SELECT count(*) FROM envelopes.gateway_envelopes_blob"),
        7
    );
    assert_eq!(
        db.int8("SELECT count(*) FROM envelopes.orphaned_envelopes()"),
        0
    );
}

/// An INSERT rule on a root (which a plain INSERT applies) cannot be honoured by
/// the insert functions: the direct path runs no rewriter and Postgres refuses
/// the SQL path's `ON CONFLICT` on such a table. Every insert form refuses with
/// 0A000 (and a hint) and writes nothing, for a rule on meta, on blob, and on the
/// late-envelope feed for a late row; without the rule they insert again.
#[test]
fn insert_rules_on_the_roots_are_refused() {
    let db = TestDb::new("rules");
    let mut c = db.connect();
    c.batch_execute(
        "SELECT envelopes.insert_gateway_envelope(1, 100, '\\x01', '\\x02');
         CREATE TABLE public.audit (n int, s bigint);",
    )
    .unwrap();
    let calls = [
        "SELECT envelopes.insert_gateway_envelope(1, 101, '\\x01', '\\x02')",
        "SELECT envelopes.insert_gateway_envelopes(ARRAY[1, 2], ARRAY[102, 1]::bigint[],
             ARRAY['\\x01', '\\x01']::bytea[], ARRAY['\\x02', '\\x02']::bytea[])",
        "SELECT envelopes.insert_gateway_envelope_packed(1, pg_catalog.encode(
             pg_catalog.int8send(103::bigint) || pg_catalog.int4send(1) || '\\x01'::bytea
             || pg_catalog.int4send(1) || '\\x02'::bytea || '\\x00'::bytea, 'base64'))",
        "SELECT envelopes.insert_gateway_envelopes_packed(1, pg_catalog.encode(
             pg_catalog.int8send(104::bigint) || pg_catalog.int4send(1) || '\\x01'::bytea
             || pg_catalog.int4send(1) || '\\x02'::bytea || '\\x00'::bytea, 'base64'))",
    ];
    for (table, key) in [
        ("gateway_envelopes_meta", "originator_node_id"),
        ("gateway_envelopes_blob", "originator_node_id"),
    ] {
        c.batch_execute(&format!(
            "CREATE RULE audit AS ON INSERT TO envelopes.{table}
                 DO ALSO INSERT INTO public.audit VALUES (NEW.{key}, NEW.originator_sequence_id)"
        ))
        .unwrap();
        for sql in calls {
            let err = c.batch_execute(sql).expect_err("refused");
            assert_eq!(
                pg_envelopes_tests::sqlstate(&err),
                "0A000",
                "{table}: {sql}"
            );
            let hint = err.as_db_error().and_then(|e| e.hint().map(str::to_owned));
            assert!(
                hint.is_some_and(|h| h.contains("trigger")),
                "{table}: {sql}"
            );
        }
        c.batch_execute(&format!("DROP RULE audit ON envelopes.{table}"))
            .unwrap();
    }
    // The feed's table, for a late row (below 100, committed).
    c.batch_execute(
        "CREATE RULE audit AS ON INSERT TO envelopes.late_envelopes
             DO ALSO INSERT INTO public.audit VALUES (NEW.originator_node_id, NEW.originator_sequence_id)",
    )
    .unwrap();
    let err = c
        .batch_execute("SELECT envelopes.insert_gateway_envelope(1, 50, '\\x01', '\\x02')")
        .expect_err("refused");
    assert_eq!(pg_envelopes_tests::sqlstate(&err), "0A000");
    c.batch_execute("DROP RULE audit ON envelopes.late_envelopes")
        .unwrap();
    assert_eq!(db.int8("SELECT count(*) FROM public.audit"), 0);
    assert_eq!(
        db.int8("SELECT count(*) FROM envelopes.gateway_envelopes_meta"),
        1
    );
    assert_eq!(
        db.int8("SELECT count(*) FROM envelopes.gateway_envelopes_blob"),
        1
    );
    for sql in calls {
        c.batch_execute(sql).unwrap();
    }
    assert_eq!(
        db.int8("SELECT count(*) FROM envelopes.gateway_envelopes_meta"),
        6
    );
}
