//! The read shapes xmtpd uses, against reference queries over the view.
//!
//! One database is loaded through the insert functions (four originators with
//! gaps, six topics, one topic only one originator has, narrow bands so reads
//! cross them, an originator with partitions and no rows). Each read function is
//! then called over a grid of cursors — empty, partial, complete, above the
//! data, unknown topics and originators, ceilings below and above the data,
//! limits that cut inside one originator and across originators — and its rows
//! must equal, in order, what a query over `gateway_envelopes_view` written here
//! returns for the same arguments.

use pg_envelopes_tests::{sqlstate, TestDb};
use postgres::types::ToSql;
use postgres::Client;
use std::time::SystemTime;

type Row = (
    i32,
    i64,
    SystemTime,
    Vec<u8>,
    Option<i32>,
    Option<i64>,
    Vec<u8>,
);

const COLUMNS: &str = "originator_node_id, originator_sequence_id, gateway_time, topic, payer_id, expiry, originator_envelope";

fn rows(c: &mut Client, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Vec<Row> {
    c.query(&format!("SELECT {COLUMNS} FROM ({sql}) r"), params)
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .iter()
        .map(|r| {
            (
                r.get(0),
                r.get(1),
                r.get(2),
                r.get(3),
                r.get(4),
                r.get(5),
                r.get(6),
            )
        })
        .collect()
}

fn topic(i: i64) -> Vec<u8> {
    vec![0x70, i as u8]
}

/// Loads the data set; returns the highest sequence id per loaded originator.
fn load(c: &mut Client) {
    c.batch_execute("SET envelopes.band_width = 50").unwrap();
    for node in 1..=4i32 {
        let mut seqs = Vec::new();
        let mut topics = Vec::new();
        let mut envelopes = Vec::new();
        let mut payers = Vec::new();
        let mut times = Vec::new();
        for seq in 1..=300i64 {
            if node == 2 && seq % 7 == 3 {
                continue; // gaps
            }
            seqs.push(seq);
            // Topic 5 only in originator 4 (a cold topic elsewhere).
            let t = if node == 4 && seq % 10 == 0 {
                5
            } else {
                (seq * 7 + i64::from(node)) % 5
            };
            topics.push(topic(t));
            envelopes.push(format!("env-{node}-{seq}").into_bytes());
            payers.push(if seq % 3 == 0 { None } else { Some(node * 10) });
            // The same time for the same sequence id in every originator: ties.
            times.push(
                SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_800_000_000 + seq as u64),
            );
        }
        // Inserted in two batches, the second one out of order.
        let half = seqs.len() / 2;
        for range in [half..seqs.len(), 0..half] {
            let nodes = vec![node; range.len()];
            c.execute(
                "SELECT envelopes.insert_gateway_envelopes($1, $2, $3, $4, $5, $6)",
                &[
                    &nodes,
                    &seqs[range.clone()].to_vec(),
                    &topics[range.clone()].to_vec(),
                    &envelopes[range.clone()].to_vec(),
                    &payers[range.clone()].to_vec(),
                    &times[range.clone()].to_vec(),
                ],
            )
            .unwrap();
        }
    }
    // Partitions without rows.
    c.batch_execute("SELECT envelopes.ensure_gateway_parts(9, 1, 120)")
        .unwrap();
}

/// Per-topic cursor entries as parallel arrays: (topics, nodes, seqs).
type EntrySet = (Vec<Vec<u8>>, Vec<i32>, Vec<i64>);

fn entry_sets() -> Vec<EntrySet> {
    let mut sets = Vec::new();
    // Empty.
    sets.push((vec![], vec![], vec![]));
    // Every (topic, originator) from the start.
    let mut all = (vec![], vec![], vec![]);
    for node in [1, 2, 3, 4, 9, 11] {
        for t in 0..=6 {
            all.0.push(topic(t));
            all.1.push(node);
            all.2.push(0);
        }
    }
    sets.push(all.clone());
    // Partial, complete and beyond, per entry.
    let mut mixed = (vec![], vec![], vec![]);
    for (i, (t, node)) in all.0.iter().zip(&all.1).enumerate() {
        mixed.0.push(t.clone());
        mixed.1.push(*node);
        mixed.2.push([0, 37, 120, 299, 300, 5000, 49, 50][i % 8]);
    }
    sets.push(mixed);
    // One cold topic, one originator, mid-stream.
    sets.push((vec![topic(5)], vec![4], vec![95]));
    // A few entries, given out of order.
    sets.push((
        vec![topic(3), topic(1), topic(3), topic(0)],
        vec![3, 1, 1, 2],
        vec![200, 10, 0, 150],
    ));
    sets
}

#[test]
fn read_shapes_equal_reference_queries() {
    let db = TestDb::new("xmtpd");
    let mut c = db.connect();
    load(&mut c);
    let (mut checked, mut nonempty) = (0, 0);

    // Per-topic cursors.
    for (topics, nodes, seqs) in entry_sets() {
        for per_entry in [1, 5, 1000] {
            for limit in [0, 1, 7, 60, 1000] {
                for commit_safe in [false, true] {
                    let got = rows(
                        &mut c,
                        "SELECT * FROM envelopes.select_by_topic_cursors($1, $2, $3, $4, $5, $6)",
                        &[&topics, &nodes, &seqs, &per_entry, &limit, &commit_safe],
                    );
                    let want = rows(
                        &mut c,
                        "SELECT s.* FROM unnest($1::bytea[], $2::int[], $3::bigint[]) AS e(topic, node, seq)
                          CROSS JOIN LATERAL (
                                SELECT v.* FROM envelopes.gateway_envelopes_view v
                                 WHERE v.topic = e.topic AND v.originator_node_id = e.node
                                   AND v.originator_sequence_id > e.seq
                                 ORDER BY v.originator_sequence_id LIMIT $4::int) s
                          ORDER BY s.originator_node_id, s.originator_sequence_id
                          LIMIT $5::int",
                        &[&topics, &nodes, &seqs, &per_entry, &limit],
                    );
                    assert_eq!(
                        got, want,
                        "by_topic_cursors {nodes:?} {seqs:?} per_entry {per_entry} limit {limit}"
                    );
                    checked += 1;
                    nonempty += usize::from(!want.is_empty());
                }
            }
        }
    }

    // Waves: ceilings below, inside and above the data, one originator without a
    // ceiling; positions from the start, inside an originator, at its end.
    let ceiling_sets: [(Vec<i32>, Vec<i64>); 4] = [
        (vec![1, 2, 3, 4, 9], vec![10_000; 5]),
        (vec![4, 2, 1], vec![40, 10_000, 175]),
        (vec![3], vec![0]),
        (vec![], vec![]),
    ];
    let positions: [(Option<i32>, Option<i64>); 5] = [
        (None, None),
        (Some(2), Some(100)),
        (Some(3), Some(0)),
        (Some(1), Some(300)),
        (Some(0), Some(0)),
    ];
    for (topics, nodes, seqs) in entry_sets() {
        for (ceiling_nodes, ceiling_seqs) in &ceiling_sets {
            for (at_node, at_seq) in positions {
                for limit in [1, 7, 60, 1000] {
                    let got = rows(
                        &mut c,
                        "SELECT * FROM envelopes.select_wave($1, $2, $3, $4, $5, $6, $7, $8)",
                        &[
                            &topics,
                            &nodes,
                            &seqs,
                            ceiling_nodes,
                            ceiling_seqs,
                            &at_node,
                            &at_seq,
                            &limit,
                        ],
                    );
                    let want = rows(
                        &mut c,
                        "SELECT v.* FROM envelopes.gateway_envelopes_view v
                           JOIN unnest($1::bytea[], $2::int[], $3::bigint[]) AS e(topic, node, seq)
                             ON v.topic = e.topic AND v.originator_node_id = e.node
                           JOIN unnest($4::int[], $5::bigint[]) AS cl(node, seq)
                             ON cl.node = v.originator_node_id
                          WHERE v.originator_sequence_id > e.seq
                            AND v.originator_sequence_id <= cl.seq
                            AND ($6::int IS NULL
                                 OR (v.originator_node_id, v.originator_sequence_id) > ($6::int, $7::bigint))
                          ORDER BY v.originator_node_id, v.originator_sequence_id
                          LIMIT $8::int",
                        &[
                            &topics,
                            &nodes,
                            &seqs,
                            ceiling_nodes,
                            ceiling_seqs,
                            &at_node,
                            &at_seq,
                            &limit,
                        ],
                    );
                    assert_eq!(
                        got, want,
                        "wave {nodes:?} {seqs:?} ceilings {ceiling_nodes:?} {ceiling_seqs:?} after {at_node:?} {at_seq:?} limit {limit}"
                    );
                    checked += 1;
                    nonempty += usize::from(!want.is_empty());
                }
            }
        }
    }

    // Newest per topic.
    for topics in [
        vec![],
        (0..=6).map(topic).collect::<Vec<_>>(),
        vec![topic(5)],
        vec![topic(2), topic(2), topic(6)],
    ] {
        let got = rows(
            &mut c,
            "SELECT * FROM envelopes.select_newest_by_topic($1)",
            &[&topics],
        );
        let want = rows(
            &mut c,
            "SELECT * FROM (
                SELECT DISTINCT ON (l.topic) l.* FROM (
                    SELECT DISTINCT ON (v.topic, v.originator_node_id) v.*
                      FROM envelopes.gateway_envelopes_view v
                     WHERE v.topic = ANY ($1)
                     ORDER BY v.topic, v.originator_node_id, v.originator_sequence_id DESC) l
                 ORDER BY l.topic, l.gateway_time DESC, l.originator_node_id DESC) n
              ORDER BY n.topic",
            &[&topics],
        );
        assert_eq!(got, want, "newest {topics:?}");
        checked += 1;
        nonempty += usize::from(!want.is_empty());
    }

    // One originator from a position.
    for node in [1, 2, 4, 9, 11] {
        for after in [0, 1, 49, 50, 137, 299, 300, 1000, -5] {
            for limit in [0, 1, 60, 1000] {
                for commit_safe in [false, true] {
                    let got = rows(
                        &mut c,
                        "SELECT * FROM envelopes.select_originator($1, $2, $3, $4)",
                        &[&node, &(after as i64), &limit, &commit_safe],
                    );
                    let want = rows(
                        &mut c,
                        "SELECT v.* FROM envelopes.gateway_envelopes_view v
                          WHERE v.originator_node_id = $1 AND v.originator_sequence_id > $2
                          ORDER BY v.originator_sequence_id LIMIT $3",
                        &[&node, &(after as i64), &i64::from(limit)],
                    );
                    assert_eq!(got, want, "originator {node} after {after} limit {limit}");
                    checked += 1;
                    nonempty += usize::from(!want.is_empty());
                }
            }
        }
    }

    // The vector-clock selector, which reads through the same paths.
    let cursors: [(Vec<i32>, Vec<i64>); 3] = [
        (vec![], vec![]),
        (vec![1, 3], vec![299, 120]),
        (vec![2, 4, 1], vec![300, 37, 0]),
    ];
    for (cursor_nodes, cursor_seqs) in cursors {
        for topics in [
            None,
            Some((0..=3).map(topic).collect::<Vec<_>>()),
            Some(vec![topic(5)]),
        ] {
            for originators in [None, Some(vec![4, 2, 9])] {
                for limit in [1, 60, 1000] {
                    let got = rows(
                        &mut c,
                        "SELECT * FROM envelopes.select_gateway_envelopes($1, $2, $3, $4, $5)",
                        &[&cursor_nodes, &cursor_seqs, &topics, &originators, &limit],
                    );
                    let want = rows(
                        &mut c,
                        "SELECT v.* FROM envelopes.gateway_envelopes_view v
                           LEFT JOIN unnest($1::int[], $2::bigint[]) AS cu(node, seq)
                             ON cu.node = v.originator_node_id
                          WHERE v.originator_sequence_id > coalesce(cu.seq, 0)
                            AND ($3::bytea[] IS NULL OR v.topic = ANY ($3))
                            AND ($4::int[] IS NULL OR v.originator_node_id = ANY ($4))
                          ORDER BY v.originator_node_id, v.originator_sequence_id
                          LIMIT $5::int",
                        &[&cursor_nodes, &cursor_seqs, &topics, &originators, &limit],
                    );
                    assert_eq!(got, want, "select {cursor_nodes:?} {cursor_seqs:?} {topics:?} {originators:?} {limit}");
                    checked += 1;
                    nonempty += usize::from(!want.is_empty());
                }
            }
        }
    }

    // Maxima.
    for nodes in [vec![], vec![1, 2, 3, 4], vec![4, 9, 11, 4, 2]] {
        let got: Vec<(i32, i64)> = c
            .query("SELECT * FROM envelopes.originator_maxima($1)", &[&nodes])
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        let want: Vec<(i32, i64)> = c
            .query(
                "SELECT n, coalesce((SELECT max(m.originator_sequence_id)
                                        FROM envelopes.gateway_envelopes_meta m
                                       WHERE m.originator_node_id = n), 0)
                   FROM (SELECT DISTINCT unnest($1::int[]) AS n) x ORDER BY n",
                &[&nodes],
            )
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        assert_eq!(got, want, "maxima {nodes:?}");
        checked += 1;
        nonempty += usize::from(!want.is_empty());
    }
    assert!(
        checked > 900 && nonempty > 400,
        "{checked} comparisons, {nonempty} with rows"
    );
}

/// A commit-safe read stops below a sequence id that is still being inserted:
/// with seq 12 of originator 3 uncommitted, a commit-safe read of that
/// originator ends at 11 although 13 is committed; the plain read returns 13.
#[test]
fn commit_safe_reads_stop_below_an_uncommitted_insert() {
    let db = TestDb::new("xmtpd_safe");
    let mut c = db.connect();
    for seq in [10i64, 11] {
        pg_envelopes_tests::insert(&mut c, 3, seq);
    }
    let mut writer = db.connect();
    let mut tx = writer.transaction().unwrap();
    tx.execute(
        "SELECT envelopes.insert_gateway_envelope(3, 12, '\\x01', '\\x01')",
        &[],
    )
    .unwrap();
    pg_envelopes_tests::insert(&mut c, 3, 13);
    let seqs = |c: &mut Client, sql: &str| -> Vec<i64> {
        c.query(sql, &[])
            .unwrap()
            .iter()
            .map(|r| r.get::<_, i64>(0))
            .collect()
    };
    let topic =
        "(SELECT topic FROM envelopes.gateway_envelopes_meta WHERE originator_node_id = 3 LIMIT 1)";
    assert_eq!(
        seqs(&mut c, "SELECT originator_sequence_id FROM envelopes.select_originator(3, 0, commit_safe => true)"),
        [10, 11]
    );
    assert_eq!(
        seqs(
            &mut c,
            "SELECT originator_sequence_id FROM envelopes.select_originator(3, 0)"
        ),
        [10, 11, 13]
    );
    assert_eq!(
        seqs(&mut c, &format!("SELECT originator_sequence_id FROM envelopes.select_by_topic_cursors(ARRAY[{topic}], '{{3}}', '{{0}}', commit_safe => true)")),
        [10, 11]
    );
    assert_eq!(
        seqs(&mut c, &format!("SELECT originator_sequence_id FROM envelopes.select_wave(ARRAY[{topic}], '{{3}}', '{{0}}', '{{3}}', '{{100}}', commit_safe => true)")),
        [10, 11]
    );
    tx.commit().unwrap();
    assert_eq!(
        seqs(&mut c, "SELECT originator_sequence_id FROM envelopes.select_originator(3, 0, commit_safe => true)"),
        [10, 11, 12, 13]
    );
}

#[test]
fn read_shapes_reject_bad_arguments_with_sqlstates() {
    let db = TestDb::new("xmtpd_errors");
    let mut c = db.connect();
    let cases = [
        (
            "select_by_topic_cursors('{\\\\x01}', '{1,2}', '{0}')",
            "2202E",
        ),
        ("select_by_topic_cursors(NULL, '{1}', '{0}')", "22004"),
        (
            "select_by_topic_cursors('{\\\\x01}', '{NULL}', '{0}')",
            "22004",
        ),
        (
            "select_by_topic_cursors('{\\\\x01,\\\\x01}', '{1,1}', '{0,5}')",
            "22023",
        ),
        (
            "select_by_topic_cursors('{\\\\x01}', '{1}', '{0}', rows_per_entry => -1)",
            "22023",
        ),
        (
            "select_by_topic_cursors('{\\\\x01}', '{1}', '{0}', row_limit => NULL)",
            "22004",
        ),
        (
            "select_by_topic_cursors('{\\\\x01}', '{1}', '{0}', commit_safe => NULL)",
            "22004",
        ),
        (
            "select_wave('{\\\\x01}', '{1}', '{0}', '{1,1}', '{5,6}')",
            "22023",
        ),
        (
            "select_wave('{\\\\x01}', '{1}', '{0}', '{1}', '{5,6}')",
            "2202E",
        ),
        (
            "select_wave('{\\\\x01}', '{1}', '{0}', NULL, '{5}')",
            "22004",
        ),
        (
            "select_wave('{\\\\x01}', '{1}', '{0}', '{1}', '{5}', after_node_id => 1)",
            "22004",
        ),
        (
            "select_wave('{\\\\x01}', '{1}', '{0}', '{1}', '{5}', row_limit => -3)",
            "22023",
        ),
        ("select_newest_by_topic(NULL)", "22004"),
        ("select_newest_by_topic(ARRAY[NULL]::bytea[])", "22004"),
        ("select_originator(NULL)", "22004"),
        ("select_originator(1, NULL)", "22004"),
        ("select_originator(1, 0, -1)", "22023"),
        ("originator_maxima(NULL)", "22004"),
        ("originator_maxima('{1,NULL}')", "22004"),
    ];
    for (call, code) in cases {
        let sql = format!("SELECT * FROM envelopes.{call}");
        let err = c.batch_execute(&sql).expect_err(&sql);
        assert_eq!(sqlstate(&err), code, "{sql}: {err}");
    }
}

/// The read functions hand back their rows in one call (materialize mode): they
/// work in FROM, in a target list, in a LATERAL join called once per outer row,
/// inside PL/pgSQL, and in a REPEATABLE READ transaction they read its snapshot.
#[test]
fn read_functions_work_wherever_a_set_returning_function_does() {
    let db = TestDb::new("xmtpd_calls");
    let mut c = db.connect();
    for seq in 1..=5i64 {
        pg_envelopes_tests::insert(&mut c, 2, seq);
        pg_envelopes_tests::insert(&mut c, 4, seq);
    }
    let count = |c: &mut Client, sql: &str| -> i64 { c.query_one(sql, &[]).unwrap().get(0) };
    assert_eq!(
        count(
            &mut c,
            "SELECT count(*) FROM (SELECT envelopes.select_originator(2)) s"
        ),
        5
    );
    assert_eq!(
        count(
            &mut c,
            "SELECT count(*) FROM (SELECT (envelopes.select_gateway_envelopes()).originator_sequence_id) s"
        ),
        10
    );
    assert_eq!(
        count(
            &mut c,
            "SELECT count(*) FROM unnest('{2,4,9}'::int[]) n,
                    LATERAL envelopes.select_originator(n, n - 2) r"
        ),
        5 + 3
    );
    assert_eq!(
        count(
            &mut c,
            "SELECT sum(m.max_sequence_id)::bigint FROM envelopes.originator_maxima('{2,4}') m"
        ),
        10
    );
    c.batch_execute(
        "CREATE FUNCTION pg_temp.through_plpgsql() RETURNS bigint LANGUAGE plpgsql AS $$
         DECLARE n bigint := 0; r record;
         BEGIN
             FOR r IN SELECT * FROM envelopes.select_by_topic_cursors(
                          ARRAY[(SELECT topic FROM envelopes.gateway_envelopes_meta LIMIT 1)],
                          '{2}', '{0}') LOOP
                 n := n + 1;
             END LOOP;
             RETURN n;
         END $$",
    )
    .unwrap();
    assert!(count(&mut c, "SELECT pg_temp.through_plpgsql()") >= 1);
    // A REPEATABLE READ transaction keeps its snapshot: a row committed by
    // another session after the first read stays invisible to later reads.
    let mut tx = c
        .build_transaction()
        .isolation_level(postgres::IsolationLevel::RepeatableRead)
        .start()
        .unwrap();
    let before: i64 = tx
        .query_one("SELECT count(*) FROM envelopes.select_originator(2)", &[])
        .unwrap()
        .get(0);
    let mut other = db.connect();
    pg_envelopes_tests::insert(&mut other, 2, 6);
    let after: i64 = tx
        .query_one("SELECT count(*) FROM envelopes.select_originator(2)", &[])
        .unwrap()
        .get(0);
    assert_eq!((before, after), (5, 5));
    tx.commit().unwrap();
    assert_eq!(
        count(
            &mut c,
            "SELECT count(*) FROM envelopes.select_originator(2)"
        ),
        6
    );
}

/// A band created by another session after a transaction first read an
/// originator is read by that transaction's next statement (READ COMMITTED):
/// the reads take in the catalog change although the statement locks nothing
/// before reading and every band they knew of is below the cursor.
#[test]
fn a_band_created_mid_transaction_is_read_by_the_next_statement() {
    let db = TestDb::new("xmtpd_bands");
    let mut c = db.connect();
    c.batch_execute("SET envelopes.band_width = 50").unwrap();
    for seq in 1..=49i64 {
        pg_envelopes_tests::insert(&mut c, 1, seq);
    }
    let mut tx = c.transaction().unwrap();
    let count = |tx: &mut postgres::Transaction<'_>, sql: &str| -> i64 {
        tx.query_one(sql, &[]).unwrap().get(0)
    };
    assert_eq!(
        count(
            &mut tx,
            "SELECT count(*) FROM envelopes.select_originator(1)"
        ),
        49
    );
    assert_eq!(count(&mut tx, "SELECT max_sequence_id FROM envelopes.originator_maxima('{1,2}') WHERE originator_node_id = 1"), 49);
    let mut other = db.connect();
    other
        .batch_execute("SET envelopes.band_width = 50")
        .unwrap();
    pg_envelopes_tests::insert(&mut other, 1, 75); // a new band [50, 100)
    pg_envelopes_tests::insert(&mut other, 2, 1); // a new originator
    assert_eq!(
        count(
            &mut tx,
            "SELECT count(*) FROM envelopes.select_originator(1, 49)"
        ),
        1
    );
    assert_eq!(
        count(
            &mut tx,
            "SELECT max_sequence_id FROM envelopes.originator_maxima('{1}')"
        ),
        75
    );
    assert_eq!(
        count(
            &mut tx,
            "SELECT count(*) FROM envelopes.select_gateway_envelopes('{1}', '{49}')"
        ),
        2
    );
    tx.commit().unwrap();
}
