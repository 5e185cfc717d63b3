//! The insert and read functions under setups a DBA may legally make and the
//! direct paths were not written for: a band partitioned further, a band of
//! another table access method or without a usable index, a band replaced while
//! another session has the catalog cached, an originator partition that is a
//! plain table. Every insert form and every read function must give what plain
//! SQL gives (the server used to crash on the first of them), in both creation
//! modes.

use pg_envelopes_tests::{drain_envelopes, TestDb};
use postgres::Client;
use std::collections::BTreeSet;

/// (node, seq, topic, envelope) rows.
type Rows = Vec<(i32, i64, Vec<u8>, Vec<u8>)>;

fn rows(c: &mut Client, sql: &str) -> Rows {
    c.query(sql, &[])
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect()
}

/// One originator's rows as plain SQL over the tables reads them, in key order.
fn reference(c: &mut Client, node: i32, filter: &str) -> Rows {
    rows(
        c,
        &format!(
            "SELECT m.originator_node_id, m.originator_sequence_id, m.topic, b.originator_envelope
               FROM envelopes.gateway_envelopes_meta m
               JOIN envelopes.gateway_envelopes_blob b USING (originator_node_id, originator_sequence_id)
              WHERE m.originator_node_id = {node} {filter}
              ORDER BY 1, 2"
        ),
    )
}

/// Every read function, each compared with the same read in plain SQL: the
/// selector (all rows, by topic, after a position, with a limit), one
/// originator, per-topic cursors, a wave, the newest per topic, maxima, the view,
/// and a consumer's batches (every row once).
fn check_every_read(c: &mut Client, node: i32, topics: &[&str], label: &str) {
    let all = reference(c, node, "");
    assert!(!all.is_empty(), "{label}: no rows to read");
    let cols = "originator_node_id, originator_sequence_id, topic, originator_envelope";
    let read = |c: &mut Client, sql: String| rows(c, &sql);
    assert_eq!(
        read(
            c,
            format!(
                "SELECT {cols} FROM envelopes.select_gateway_envelopes(originator_node_ids => ARRAY[{node}])"
            )
        ),
        all,
        "{label}: select_gateway_envelopes"
    );
    let middle = all[all.len() / 2].1;
    let after_middle: Rows = all.iter().filter(|r| r.1 > middle).cloned().collect();
    assert_eq!(
        read(
            c,
            format!(
                "SELECT {cols} FROM envelopes.select_gateway_envelopes(ARRAY[{node}], ARRAY[{middle}]::bigint[],
                     originator_node_ids => ARRAY[{node}], row_limit => 2)"
            )
        ),
        after_middle[..after_middle.len().min(2)].to_vec(),
        "{label}: select_gateway_envelopes after a position, limited"
    );
    assert_eq!(
        read(
            c,
            format!("SELECT {cols} FROM envelopes.select_originator({node}, {middle})")
        ),
        after_middle,
        "{label}: select_originator"
    );
    assert_eq!(
        read(
            c,
            format!("SELECT {cols} FROM envelopes.select_originator({node}, 0, 3)")
        ),
        all[..all.len().min(3)].to_vec(),
        "{label}: select_originator, limited"
    );
    for topic in topics {
        let by_topic = reference(c, node, &format!("AND m.topic = '{topic}'"));
        assert_eq!(
            read(
                c,
                format!(
                    "SELECT {cols} FROM envelopes.select_gateway_envelopes(topics => ARRAY['{topic}'::bytea],
                         originator_node_ids => ARRAY[{node}])"
                )
            ),
            by_topic,
            "{label}: select_gateway_envelopes by topic {topic}"
        );
        assert_eq!(
            read(
                c,
                format!(
                    "SELECT {cols} FROM envelopes.select_by_topic_cursors(ARRAY['{topic}'::bytea],
                         ARRAY[{node}], ARRAY[0]::bigint[])"
                )
            ),
            by_topic,
            "{label}: select_by_topic_cursors {topic}"
        );
        assert_eq!(
            read(
                c,
                format!(
                    "SELECT {cols} FROM envelopes.select_wave(ARRAY['{topic}'::bytea], ARRAY[{node}],
                         ARRAY[0]::bigint[], ARRAY[{node}], ARRAY[9223372036854775807]::bigint[])"
                )
            ),
            by_topic,
            "{label}: select_wave {topic}"
        );
        // Across every originator: the row on the topic with the latest gateway
        // time (a tie to the higher originator, then the higher sequence id).
        let newest = rows(
            c,
            &format!(
                "SELECT m.originator_node_id, m.originator_sequence_id, m.topic, b.originator_envelope
                   FROM envelopes.gateway_envelopes_meta m
                   JOIN envelopes.gateway_envelopes_blob b
                        USING (originator_node_id, originator_sequence_id)
                  WHERE m.topic = '{topic}'
                  ORDER BY m.gateway_time DESC, m.originator_node_id DESC,
                           m.originator_sequence_id DESC LIMIT 1"
            ),
        );
        assert_eq!(
            read(
                c,
                format!(
                    "SELECT {cols} FROM envelopes.select_newest_by_topic(ARRAY['{topic}'::bytea])"
                )
            ),
            newest,
            "{label}: select_newest_by_topic {topic}"
        );
    }
    let max: i64 = c
        .query_one(
            &format!("SELECT max_sequence_id FROM envelopes.originator_maxima(ARRAY[{node}])"),
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(max, all.last().unwrap().1, "{label}: originator_maxima");
    assert_eq!(
        read(
            c,
            format!(
                "SELECT {cols} FROM envelopes.gateway_envelopes_view WHERE originator_node_id = {node}
                  ORDER BY 1, 2"
            )
        ),
        all,
        "{label}: gateway_envelopes_view"
    );
    assert_eq!(
        c.query_one("SELECT count(*) FROM envelopes.orphaned_envelopes()", &[])
            .unwrap()
            .get::<_, i64>(0),
        0,
        "{label}: orphans"
    );
}

/// What a consumer registered at the start hands out of `node`: every row once.
fn check_consumer(c: &mut Client, consumer: &str, node: i32, label: &str) {
    let handed = drain_envelopes(c, consumer);
    let keys: BTreeSet<i64> = handed
        .iter()
        .filter(|h| h.node == node)
        .map(|h| h.seq)
        .collect();
    let expected: BTreeSet<i64> = reference(c, node, "").iter().map(|r| r.1).collect();
    assert_eq!(keys, expected, "{label}: the consumer's rows");
    assert_eq!(
        handed.iter().filter(|h| h.node == node).count(),
        expected.len(),
        "{label}: a row handed out twice"
    );
}

/// The packed form of rows without optional values (the sequence id, the topic
/// and the envelope with their lengths, and a zero flags byte, in base64), as an
/// SQL expression.
fn packed(rows: &[(i64, &str, &str)]) -> String {
    let bytes: Vec<String> = rows
        .iter()
        .map(|(seq, topic, envelope)| {
            format!(
                "pg_catalog.int8send({seq}::bigint)
                 || pg_catalog.int4send(pg_catalog.length('{topic}'::bytea)) || '{topic}'::bytea
                 || pg_catalog.int4send(pg_catalog.length('{envelope}'::bytea)) || '{envelope}'::bytea
                 || '\\x00'::bytea"
            )
        })
        .collect();
    format!("pg_catalog.encode({}, 'base64')", bytes.join(" || "))
}

/// A DBA splits a hot band: a partitioned table with two sub-partitions attached
/// as band [1000000, 2000000) of originator 80, in both tables. Every insert form
/// writes through it (and around it, creating the next band), a row arriving late
/// included, with a cold and a warm partition cache; every read function reads
/// it; prune deletes an expired row in one sub-partition and leaves the other
/// sub-partition's row that sits at the same place in its table. The server
/// crashed (SIGSEGV) on the first insert or read of such a band.
#[test]
fn a_band_partitioned_further_is_served_in_both_creation_modes() {
    for mode in ["worker", "transaction"] {
        let db = TestDb::new(&format!("subpart_{mode}"));
        let mut c = db.connect();
        c.batch_execute(&format!(
            "ALTER DATABASE \"{}\" SET envelopes.create_partitions_in = '{mode}'",
            db.name
        ))
        .unwrap();
        let mut c = db.connect();
        c.batch_execute(
            "SELECT envelopes.consumer_register('f');
             SELECT envelopes.ensure_gateway_parts(80, 1);
             CREATE TABLE envelopes.hot_meta (LIKE envelopes.gateway_envelopes_meta INCLUDING ALL)
                 PARTITION BY RANGE (originator_sequence_id);
             CREATE TABLE envelopes.hot_meta_a PARTITION OF envelopes.hot_meta
                 FOR VALUES FROM (1000000) TO (1500000);
             CREATE TABLE envelopes.hot_meta_b PARTITION OF envelopes.hot_meta
                 FOR VALUES FROM (1500000) TO (2000000);
             CREATE TABLE envelopes.hot_blob (LIKE envelopes.gateway_envelopes_blob INCLUDING ALL)
                 PARTITION BY RANGE (originator_sequence_id);
             CREATE TABLE envelopes.hot_blob_a PARTITION OF envelopes.hot_blob
                 FOR VALUES FROM (1000000) TO (1500000);
             CREATE TABLE envelopes.hot_blob_b PARTITION OF envelopes.hot_blob
                 FOR VALUES FROM (1500000) TO (2000000);
             ALTER TABLE envelopes.gateway_envelopes_meta_o80
                 ATTACH PARTITION envelopes.hot_meta FOR VALUES FROM (1000000) TO (2000000);
             ALTER TABLE envelopes.gateway_envelopes_blob_o80
                 ATTACH PARTITION envelopes.hot_blob FOR VALUES FROM (1000000) TO (2000000);",
        )
        .unwrap();
        let one = |c: &mut Client, sql: &str| -> i64 {
            c.query_one(sql, &[])
                .unwrap_or_else(|e| panic!("{mode}: {sql}: {e}"))
                .get(0)
        };
        // A fresh session: the band is loaded from the catalog by the insert.
        let mut w = db.connect();
        assert_eq!(
            one(
                &mut w,
                "SELECT envelopes.insert_gateway_envelope(80, 1000002, '\\x01', '\\xa1', expiry => 4000000000)"
            ),
            1
        );
        assert_eq!(
            one(
                &mut w,
                "SELECT envelopes.insert_gateway_envelope(80, 1000002, '\\x01', '\\xa1')"
            ),
            0
        );
        // A batch into both sub-partitions, the band before and a new band after.
        assert_eq!(
            one(
                &mut w,
                "SELECT envelopes.insert_gateway_envelopes(ARRAY[80, 80, 80, 80, 80],
                     ARRAY[1000003, 1600000, 5, 2000005, 1000002]::bigint[],
                     ARRAY['\\x02', '\\x01', '\\x02', '\\x01', '\\x01']::bytea[],
                     ARRAY['\\xa2', '\\xa3', '\\xa4', '\\xa5', '\\xa6']::bytea[],
                     expiries => ARRAY[NULL, 100, NULL, NULL, NULL]::bigint[])"
            ),
            4
        );
        assert_eq!(
            one(
                &mut w,
                &format!(
                    "SELECT envelopes.insert_gateway_envelopes_packed(80, {})",
                    packed(&[(1600001, "\\x02", "\\xa7"), (1000004, "\\x01", "\\xa8")])
                )
            ),
            2
        );
        assert_eq!(
            one(
                &mut w,
                &format!(
                    "SELECT envelopes.insert_gateway_envelope_packed(80, {})",
                    packed(&[(1700000, "\\x01", "\\xa9")])
                )
            ),
            1
        );
        // Below 2000005, committed: late, through the band.
        assert_eq!(
            one(
                &mut w,
                "SELECT envelopes.insert_gateway_envelope(80, 1400000, '\\x02', '\\xaa')"
            ),
            1
        );
        let placed: Vec<String> = w
            .query(
                "SELECT tableoid::regclass::text FROM envelopes.gateway_envelopes_meta
                  WHERE originator_node_id = 80 ORDER BY originator_sequence_id",
                &[],
            )
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        assert_eq!(
            placed,
            [
                "envelopes.gateway_envelopes_meta_o80_s0_1000000",
                "envelopes.hot_meta_a",
                "envelopes.hot_meta_a",
                "envelopes.hot_meta_a",
                "envelopes.hot_meta_a",
                "envelopes.hot_meta_b",
                "envelopes.hot_meta_b",
                "envelopes.hot_meta_b",
                "envelopes.gateway_envelopes_meta_o80_s2000000_3000000",
            ],
            "{mode}"
        );
        // Reads: a warm cache (the writer's session), then a cold one.
        check_every_read(&mut w, 80, &["\\x01", "\\x02"], &format!("{mode}, warm"));
        let mut r = db.connect();
        check_every_read(&mut r, 80, &["\\x01", "\\x02"], &format!("{mode}, cold"));
        check_consumer(&mut r, "f", 80, mode);
        // 1600000 (hot_meta_b) expired, 1000002 (hot_meta_a) not: the first row
        // of each sub-partition, at the same place in its table.
        let same_place: bool = r
            .query_one(
                "SELECT (SELECT ctid FROM envelopes.hot_meta_a WHERE originator_sequence_id = 1000002)
                      = (SELECT ctid FROM envelopes.hot_meta_b WHERE originator_sequence_id = 1600000)",
                &[],
            )
            .unwrap()
            .get(0);
        assert!(same_place, "{mode}: the test needs both rows at one ctid");
        let before = reference(&mut r, 80, "");
        r.batch_execute("SELECT * FROM envelopes.prune_expired(as_of => 200)")
            .unwrap();
        let after = reference(&mut r, 80, "");
        let gone: Vec<i64> = before
            .iter()
            .filter(|row| !after.contains(row))
            .map(|row| row.1)
            .collect();
        assert_eq!(
            gone,
            [1600000],
            "{mode}: prune deleted exactly the expired row"
        );
        check_every_read(
            &mut r,
            80,
            &["\\x01", "\\x02"],
            &format!("{mode}, after prune"),
        );
    }
}

/// Bands the index path cannot read and the direct write path cannot write are
/// served through the executor: a band of another table access method (a copy
/// of heap's handler, which Postgres still calls another method), a band whose
/// topic index is not valid, and an originator partition that is a plain table
/// (one band holding every sequence id). A foreign table cannot be a band at all:
/// Postgres refuses to attach one under the store's primary key.
#[test]
fn bands_without_what_the_direct_paths_need_are_served() {
    let db = TestDb::new("lacking");
    let mut c = db.connect();
    let fill = |c: &mut Client, node: i32| {
        c.batch_execute(&format!(
            "SELECT envelopes.insert_gateway_envelopes(array_agg({node}), array_agg(s::bigint),
                 array_agg(CASE WHEN s % 3 = 0 THEN '\\x01'::bytea ELSE '\\x02'::bytea END),
                 array_agg(pg_catalog.int8send(s::bigint)))
               FROM generate_series(1, 40) s"
        ))
        .unwrap()
    };
    // Another access method, set after the rows and the cache are there.
    fill(&mut c, 83);
    c.batch_execute(
        "CREATE ACCESS METHOD heap_copy TYPE TABLE HANDLER heap_tableam_handler;
         ALTER TABLE envelopes.gateway_envelopes_meta_o83_s0_1000000 SET ACCESS METHOD heap_copy;
         ALTER TABLE envelopes.gateway_envelopes_blob_o83_s0_1000000 SET ACCESS METHOD heap_copy;",
    )
    .unwrap();
    let mut w = db.connect();
    w.batch_execute(
        "SELECT envelopes.insert_gateway_envelope(83, 41, '\\x01', '\\xff');
         SELECT envelopes.insert_gateway_envelopes(ARRAY[83, 83], ARRAY[42, 41]::bigint[],
             ARRAY['\\x02', '\\x02']::bytea[], ARRAY['\\xfe', '\\xfd']::bytea[]);",
    )
    .unwrap();
    assert_eq!(reference(&mut w, 83, "").len(), 42);
    check_every_read(&mut w, 83, &["\\x01", "\\x02"], "another access method");

    // A topic index that is not valid (as after a failed concurrent rebuild).
    fill(&mut c, 84);
    let mut r = db.connect();
    check_every_read(&mut r, 84, &["\\x01"], "before the index broke");
    c.batch_execute(
        "UPDATE pg_catalog.pg_index SET indisvalid = false
          WHERE indrelid = 'envelopes.gateway_envelopes_meta_o84_s0_1000000'::pg_catalog.regclass
            AND indkey::text = '4 2'",
    )
    .unwrap();
    check_every_read(&mut r, 84, &["\\x01", "\\x02"], "topic index invalid, warm");
    check_every_read(
        &mut db.connect(),
        84,
        &["\\x01", "\\x02"],
        "topic index invalid, cold",
    );

    // An originator partition that is a plain table of its own.
    c.batch_execute(
        "CREATE TABLE envelopes.gateway_envelopes_meta_o85
             (LIKE envelopes.gateway_envelopes_meta INCLUDING DEFAULTS);
         ALTER TABLE envelopes.gateway_envelopes_meta
             ATTACH PARTITION envelopes.gateway_envelopes_meta_o85 FOR VALUES IN (85);
         CREATE TABLE envelopes.gateway_envelopes_blob_o85
             (LIKE envelopes.gateway_envelopes_blob INCLUDING DEFAULTS);
         ALTER TABLE envelopes.gateway_envelopes_blob
             ATTACH PARTITION envelopes.gateway_envelopes_blob_o85 FOR VALUES IN (85);",
    )
    .unwrap();
    fill(&mut c, 85);
    c.batch_execute(
        "SELECT envelopes.insert_gateway_envelope(85, 9000000000, '\\x01', '\\x01');
         SELECT envelopes.insert_gateway_envelope(85, 41, '\\x01', '\\x01');",
    )
    .unwrap();
    assert_eq!(
        db.int8(
            "SELECT count(*) FROM pg_catalog.pg_inherits
              WHERE inhparent = 'envelopes.gateway_envelopes_meta_o85'::pg_catalog.regclass"
        ),
        0,
        "no band was created under a plain table"
    );
    check_every_read(&mut c, 85, &["\\x01", "\\x02"], "plain originator table");

    // A foreign table as a band: refused by Postgres itself.
    c.batch_execute(
        "CREATE EXTENSION postgres_fdw;
         CREATE SERVER elsewhere FOREIGN DATA WRAPPER postgres_fdw OPTIONS (dbname 'nowhere');
         CREATE FOREIGN TABLE envelopes.far_meta (
             originator_node_id integer NOT NULL, originator_sequence_id bigint NOT NULL,
             gateway_time timestamptz NOT NULL, topic bytea NOT NULL, payer_id integer,
             expiry bigint, inserted_xid xid8 NOT NULL, late boolean NOT NULL) SERVER elsewhere;",
    )
    .unwrap();
    let err = c
        .batch_execute(
            "ALTER TABLE envelopes.gateway_envelopes_meta_o83
                 ATTACH PARTITION envelopes.far_meta FOR VALUES FROM (1000000) TO (2000000)",
        )
        .unwrap_err();
    let message = err.as_db_error().map(|e| e.message().to_owned());
    assert!(
        message
            .as_deref()
            .is_some_and(|m| m.contains("cannot attach foreign table")),
        "{err:?}"
    );
    check_every_read(&mut c, 83, &["\\x01", "\\x02"], "after the refused attach");
}

/// A band replaced by hand while another session has it cached: the band of
/// originator 86 is detached and a partitioned table holding its rows (split in
/// two) is attached in its place, in both tables. The session that had cached
/// the plain band goes on inserting (single rows, batches, late rows) and
/// reading, correctly.
#[test]
fn a_band_replaced_under_a_cached_session_is_served() {
    let db = TestDb::new("replaced");
    let mut a = db.connect();
    a.batch_execute(
        "SELECT envelopes.insert_gateway_envelopes(array_agg(86), array_agg(s::bigint),
             array_agg('\\x01'::bytea), array_agg(pg_catalog.int8send(s::bigint)))
           FROM generate_series(1, 20) s",
    )
    .unwrap();
    check_every_read(&mut a, 86, &["\\x01"], "before");
    let mut b = db.connect();
    b.batch_execute(
        "BEGIN;
         CREATE TABLE envelopes.split_meta (LIKE envelopes.gateway_envelopes_meta INCLUDING ALL)
             PARTITION BY RANGE (originator_sequence_id);
         CREATE TABLE envelopes.split_meta_lo PARTITION OF envelopes.split_meta FOR VALUES FROM (0) TO (500000);
         CREATE TABLE envelopes.split_meta_hi PARTITION OF envelopes.split_meta FOR VALUES FROM (500000) TO (1000000);
         CREATE TABLE envelopes.split_blob (LIKE envelopes.gateway_envelopes_blob INCLUDING ALL)
             PARTITION BY RANGE (originator_sequence_id);
         CREATE TABLE envelopes.split_blob_lo PARTITION OF envelopes.split_blob FOR VALUES FROM (0) TO (500000);
         CREATE TABLE envelopes.split_blob_hi PARTITION OF envelopes.split_blob FOR VALUES FROM (500000) TO (1000000);
         INSERT INTO envelopes.split_meta SELECT * FROM envelopes.gateway_envelopes_meta_o86_s0_1000000;
         INSERT INTO envelopes.split_blob SELECT * FROM envelopes.gateway_envelopes_blob_o86_s0_1000000;
         ALTER TABLE envelopes.gateway_envelopes_meta_o86
             DETACH PARTITION envelopes.gateway_envelopes_meta_o86_s0_1000000;
         ALTER TABLE envelopes.gateway_envelopes_blob_o86
             DETACH PARTITION envelopes.gateway_envelopes_blob_o86_s0_1000000;
         DROP TABLE envelopes.gateway_envelopes_meta_o86_s0_1000000,
                    envelopes.gateway_envelopes_blob_o86_s0_1000000;
         ALTER TABLE envelopes.gateway_envelopes_meta_o86
             ATTACH PARTITION envelopes.split_meta FOR VALUES FROM (0) TO (1000000);
         ALTER TABLE envelopes.gateway_envelopes_blob_o86
             ATTACH PARTITION envelopes.split_blob FOR VALUES FROM (0) TO (1000000);
         COMMIT;",
    )
    .unwrap();
    a.batch_execute(
        "SELECT envelopes.insert_gateway_envelope(86, 600000, '\\x02', '\\xee');
         SELECT envelopes.insert_gateway_envelopes(ARRAY[86, 86, 86], ARRAY[21, 600001, 5]::bigint[],
             ARRAY['\\x01', '\\x02', '\\x01']::bytea[], ARRAY['\\xe1', '\\xe2', '\\xe3']::bytea[]);",
    )
    .unwrap();
    let all = reference(&mut a, 86, "");
    assert_eq!(all.len(), 23);
    check_every_read(&mut a, 86, &["\\x01", "\\x02"], "after, the cached session");
    check_every_read(&mut b, 86, &["\\x01", "\\x02"], "after, the other session");
}
