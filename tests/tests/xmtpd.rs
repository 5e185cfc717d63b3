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
//!
//! The xmtpd layer (`envelopes_xmtpd`) is compared the same way with reference
//! queries written here in the shapes of xmtpd's own (unnested arrays zipped on
//! the ordinal, a LATERAL per entry with its limit, `NULLIF(limit, 0)` where
//! xmtpd writes it, `DISTINCT ON (topic) ... ORDER BY gateway_time DESC`), over
//! the inputs xmtpd sends that the strict functions refuse or answer otherwise.

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
                SELECT DISTINCT ON (v.topic) v.*
                  FROM envelopes.gateway_envelopes_view v
                 WHERE v.topic = ANY ($1)
                 ORDER BY v.topic, v.gateway_time DESC, v.originator_node_id DESC,
                          v.originator_sequence_id DESC) n
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

// ---------------------------------------------------------------------------
// The xmtpd layer (schema envelopes_xmtpd, sql/xmtpd.sql): each function against
// a reference query written here in the shape of the xmtpd query it is named
// after (its joins of unnested arrays on the ordinal, its LIMITs, its ordering),
// over the tables, for inputs xmtpd sends: limits of 0 and NULL, repeated
// nodes, entries and topics, NULL elements, arrays of different lengths.

/// A row as xmtpd's queries return it: gateway time as `timestamp` (UTC).
type XRow = (i32, i64, SystemTime, Vec<u8>, Vec<u8>);

const XCOLUMNS: &str =
    "originator_node_id, originator_sequence_id, gateway_time, topic, originator_envelope";

/// The tables joined as xmtpd joins them, gateway time in UTC `timestamp`.
const JOINED: &str = "(SELECT m.originator_node_id, m.originator_sequence_id,
                              m.gateway_time AT TIME ZONE 'UTC' AS gateway_time, m.topic,
                              b.originator_envelope
                         FROM envelopes.gateway_envelopes_meta m
                         JOIN envelopes.gateway_envelopes_blob b
                           ON b.originator_node_id = m.originator_node_id
                          AND b.originator_sequence_id = m.originator_sequence_id)";

fn xrows(c: &mut Client, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<Vec<XRow>, String> {
    c.query(&format!("SELECT {XCOLUMNS} FROM ({sql}) r"), params)
        .map(|rows| {
            rows.iter()
                .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
                .collect()
        })
        .map_err(|e| sqlstate(&e))
}

/// Both sides answer alike: the same rows in the same order, or the same
/// SQLSTATE.
fn same(c: &mut Client, got: &str, want: &str, params: &[&(dyn ToSql + Sync)], what: &str) -> bool {
    let want_rows = xrows(c, &want.replace("@J@", JOINED), params);
    let got_rows = xrows(c, got, params);
    assert_eq!(got_rows, want_rows, "{what}");
    // The grid holds no input either side refuses (negative limits are
    // checked on their own).
    assert!(want_rows.is_ok(), "{what}: {want_rows:?}");
    matches!(want_rows, Ok(rows) if !rows.is_empty())
}

/// The rows of `load` plus an originator whose gateway times fall as its
/// sequence ids rise (late arrivals stamped on arrival), and one whose times tie
/// another's on a topic, for newest-by-topic.
fn load_for_layer(c: &mut Client) {
    load(c);
    let base = 1_800_000_000u64;
    let at = |s: u64| SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(s);
    for seq in 1..=40i64 {
        c.execute(
            "SELECT envelopes.insert_gateway_envelope(6, $1, $2, $3, gateway_time => $4)",
            &[
                &seq,
                &topic(seq % 3),
                &format!("late-{seq}").into_bytes(),
                &at(base + 10_000 - seq as u64 * 7),
            ],
        )
        .unwrap();
    }
    // Originator 7 ties originator 6's newest time on topic 1.
    c.execute(
        "SELECT envelopes.insert_gateway_envelope(7, 3, $1, '\\x07', gateway_time => $2)",
        &[&topic(1), &at(base + 10_000 - 7)],
    )
    .unwrap();
}

type Cursor = (Option<Vec<i32>>, Option<Vec<i64>>);
/// A cursor whose arrays may hold NULL.
type NullableCursor = (Vec<Option<i32>>, Vec<Option<i64>>);
/// Per-topic cursor entries whose arrays may hold NULL.
type NullableEntries = (Vec<Option<Vec<u8>>>, Vec<Option<i32>>, Vec<Option<i64>>);

fn layer_cursors() -> Vec<Cursor> {
    let c = |n: &[i32], s: &[i64]| (Some(n.to_vec()), Some(s.to_vec()));
    vec![
        c(&[], &[]),
        c(&[1, 3], &[299, 120]),
        c(&[2, 4, 1, 6], &[300, 37, 0, 20]),
        c(&[1, 1], &[10, 250]),        // a node twice
        c(&[2, 2, 4], &[0, 100, 295]), // twice, and another
        c(&[1, 2, 3], &[5, 6]),        // lengths differ
        c(&[1], &[5, 6]),
        (None, None),
    ]
}

fn layer_cursors_with_nulls() -> Vec<NullableCursor> {
    vec![
        (vec![Some(1), None], vec![Some(5), Some(7)]),
        (vec![Some(1), Some(2)], vec![Some(5), None]),
    ]
}

#[test]
fn the_xmtpd_layer_answers_as_xmtpds_queries() {
    let db = TestDb::new("xmtpd_layer");
    let mut c = db.connect();
    load_for_layer(&mut c);
    // Gateway times are UTC whatever the session's zone.
    c.batch_execute("SET TimeZone = 'America/New_York'")
        .unwrap();
    let (mut checked, mut nonempty) = (0usize, 0usize);
    let limits: [Option<i32>; 6] = [Some(0), Some(1), Some(7), Some(60), Some(1000), None];

    // One originator.
    for node in [Some(1), Some(2), Some(6), Some(11), None] {
        for after in [Some(0i64), Some(49), Some(299), Some(-5), None] {
            for limit in limits {
                nonempty += usize::from(same(
                    &mut c,
                    "SELECT * FROM envelopes_xmtpd.select_gateway_envelopes_by_single_originator($1, $2, $3)",
                    "SELECT j.* FROM @J@ j
                      WHERE j.originator_node_id = $1::int AND j.originator_sequence_id > $2::bigint
                      ORDER BY j.originator_sequence_id LIMIT NULLIF($3::int, 0)",
                    &[&node, &after, &limit],
                    &format!("single {node:?} {after:?} {limit:?}"),
                ));
                checked += 1;
            }
        }
    }

    // Originators, and everything after a cursor.
    let by_originators = "WITH e AS (
            SELECT n.node, s.seq
              FROM unnest($1::int[]) WITH ORDINALITY AS n(node, ord)
              JOIN unnest($2::bigint[]) WITH ORDINALITY AS s(seq, ord) USING (ord))
        SELECT x.* FROM e CROSS JOIN LATERAL (
               SELECT j.* FROM @J@ j
                WHERE j.originator_node_id = e.node AND j.originator_sequence_id > e.seq
                ORDER BY j.originator_sequence_id LIMIT NULLIF($3::int, 0)) x
         ORDER BY x.originator_node_id, x.originator_sequence_id
         LIMIT NULLIF($3::int, 0)";
    let unfiltered = "WITH e AS (
            SELECT n.node, s.seq
              FROM unnest($1::int[]) WITH ORDINALITY AS n(node, ord)
              JOIN unnest($2::bigint[]) WITH ORDINALITY AS s(seq, ord) USING (ord))
        SELECT j.* FROM @J@ j LEFT JOIN e ON e.node = j.originator_node_id
         WHERE j.originator_sequence_id > COALESCE(e.seq, 0)
         ORDER BY j.originator_node_id, j.originator_sequence_id
         LIMIT NULLIF($3::int, 0)";
    let mut cursor_params: Vec<(Box<dyn ToSql + Sync>, Box<dyn ToSql + Sync>)> = layer_cursors()
        .into_iter()
        .map(|(n, s)| {
            (
                Box::new(n) as Box<dyn ToSql + Sync>,
                Box::new(s) as Box<dyn ToSql + Sync>,
            )
        })
        .collect();
    for (n, s) in layer_cursors_with_nulls() {
        cursor_params.push((Box::new(n), Box::new(s)));
    }
    for (nodes, seqs) in &cursor_params {
        for limit in limits {
            for (function, reference) in [
                ("select_gateway_envelopes_by_originators", by_originators),
                ("select_gateway_envelopes_unfiltered", unfiltered),
            ] {
                nonempty += usize::from(same(
                    &mut c,
                    &format!("SELECT * FROM envelopes_xmtpd.{function}($1, $2, $3)"),
                    reference,
                    &[nodes.as_ref(), seqs.as_ref(), &limit],
                    &format!("{function} {nodes:?} {seqs:?} {limit:?}"),
                ));
                checked += 1;
            }
        }
        // Topics with every cursor entry.
        let topic_lists: [Option<Vec<Option<Vec<u8>>>>; 6] = [
            None,
            Some(vec![]),
            Some((0..=3).map(|t| Some(topic(t))).collect()),
            Some(vec![Some(topic(5))]),
            Some(vec![Some(topic(1)), Some(topic(1))]),
            Some(vec![Some(topic(2)), None]),
        ];
        for topics in &topic_lists {
            for limit in [Some(0), Some(7), Some(1000), None] {
                nonempty += usize::from(same(
                    &mut c,
                    "SELECT * FROM envelopes_xmtpd.select_gateway_envelopes_by_topics($1, $2, $3, $4)",
                    "WITH cu AS (
                        SELECT n.node, s.seq
                          FROM unnest($1::int[]) WITH ORDINALITY AS n(node, ord)
                          JOIN unnest($2::bigint[]) WITH ORDINALITY AS s(seq, ord) USING (ord)),
                     e AS (SELECT t.topic, cu.node, cu.seq FROM unnest($3::bytea[]) AS t(topic) CROSS JOIN cu)
                     SELECT x.* FROM e CROSS JOIN LATERAL (
                            SELECT j.* FROM @J@ j
                             WHERE j.topic = e.topic AND j.originator_node_id = e.node
                               AND j.originator_sequence_id > e.seq
                             ORDER BY j.originator_sequence_id LIMIT $4::int) x
                      ORDER BY x.originator_node_id, x.originator_sequence_id
                      LIMIT $4::int",
                    &[nodes.as_ref(), seqs.as_ref(), topics, &limit],
                    &format!("by_topics {nodes:?} {seqs:?} {topics:?} {limit:?}"),
                ));
                checked += 1;
            }
        }
    }

    // Per-topic cursors and waves, with entries repeated, NULL, or of arrays of
    // different lengths.
    let mut entry_lists: Vec<NullableEntries> = entry_sets()
        .into_iter()
        .map(|(t, n, s)| {
            (
                t.into_iter().map(Some).collect(),
                n.into_iter().map(Some).collect(),
                s.into_iter().map(Some).collect(),
            )
        })
        .collect();
    entry_lists.push((
        vec![Some(topic(1)), Some(topic(1)), Some(topic(2))],
        vec![Some(1), Some(1), Some(6)],
        vec![Some(10), Some(100), Some(0)],
    ));
    entry_lists.push((
        vec![Some(topic(0)), None, Some(topic(3))],
        vec![Some(2), Some(2), None],
        vec![Some(0), Some(0), Some(0)],
    ));
    entry_lists.push((
        vec![Some(topic(0)), Some(topic(4))],
        vec![Some(3), Some(3), Some(4)],
        vec![Some(0)],
    ));
    for (topics, nodes, seqs) in &entry_lists {
        for per_entry in [Some(0), Some(1), Some(5), None] {
            for limit in [Some(0), Some(1), Some(60), Some(1000)] {
                nonempty += usize::from(same(
                    &mut c,
                    "SELECT * FROM envelopes_xmtpd.select_gateway_envelopes_by_per_topic_cursors($1, $2, $3, $4, $5)",
                    "WITH e AS (
                        SELECT t.topic, n.node, s.seq
                          FROM unnest($1::bytea[]) WITH ORDINALITY AS t(topic, ord)
                          JOIN unnest($2::int[]) WITH ORDINALITY AS n(node, ord) USING (ord)
                          JOIN unnest($3::bigint[]) WITH ORDINALITY AS s(seq, ord) USING (ord))
                     SELECT x.* FROM e CROSS JOIN LATERAL (
                            SELECT j.* FROM @J@ j
                             WHERE j.topic = e.topic AND j.originator_node_id = e.node
                               AND j.originator_sequence_id > e.seq
                             ORDER BY j.originator_sequence_id LIMIT $4::int) x
                      ORDER BY x.originator_node_id, x.originator_sequence_id
                      LIMIT NULLIF($5::int, 0)",
                    &[topics, nodes, seqs, &per_entry, &limit],
                    &format!("per_topic {topics:?} {nodes:?} {seqs:?} {per_entry:?} {limit:?}"),
                ));
                checked += 1;
            }
        }
        let ceilings: [NullableCursor; 4] = [
            (
                vec![Some(1), Some(2), Some(3), Some(4), Some(6)],
                vec![Some(10_000); 5],
            ),
            (
                vec![Some(4), Some(2), Some(1)],
                vec![Some(40), Some(10_000), Some(175)],
            ),
            (
                vec![Some(1), Some(1), Some(2)],
                vec![Some(100), Some(200), None],
            ),
            (vec![], vec![]),
        ];
        let positions: [(Option<i32>, Option<i64>); 4] = [
            (Some(0), Some(0)),
            (Some(2), Some(100)),
            (None, None),
            (Some(1), None),
        ];
        for (ceiling_nodes, ceiling_seqs) in &ceilings {
            for (at_node, at_seq) in positions {
                for limit in [Some(0), Some(7), Some(1000)] {
                    nonempty += usize::from(same(
                        &mut c,
                        "SELECT * FROM envelopes_xmtpd.select_gateway_envelopes_wave_scan($1, $2, $3, $4, $5, $6, $7, $8)",
                        "WITH e AS (
                            SELECT t.topic, n.node, s.seq
                              FROM unnest($1::bytea[]) WITH ORDINALITY AS t(topic, ord)
                              JOIN unnest($2::int[]) WITH ORDINALITY AS n(node, ord) USING (ord)
                              JOIN unnest($3::bigint[]) WITH ORDINALITY AS s(seq, ord) USING (ord)),
                         cl AS (
                            SELECT n.node, s.seq
                              FROM unnest($4::int[]) WITH ORDINALITY AS n(node, ord)
                              JOIN unnest($5::bigint[]) WITH ORDINALITY AS s(seq, ord) USING (ord))
                         SELECT j.* FROM @J@ j
                           JOIN e ON j.topic = e.topic AND j.originator_node_id = e.node
                           JOIN cl ON cl.node = j.originator_node_id
                          WHERE j.originator_sequence_id > e.seq
                            AND j.originator_sequence_id <= cl.seq
                            AND (j.originator_node_id, j.originator_sequence_id) > ($6::int, $7::bigint)
                          ORDER BY j.originator_node_id, j.originator_sequence_id
                          LIMIT $8::int",
                        &[topics, nodes, seqs, ceiling_nodes, ceiling_seqs, &at_node, &at_seq, &limit],
                        &format!("wave {topics:?} {nodes:?} {seqs:?} {ceiling_nodes:?} {ceiling_seqs:?} {at_node:?} {at_seq:?} {limit:?}"),
                    ));
                    checked += 1;
                }
            }
        }
    }

    // Newest per topic, by gateway time (ties, which xmtpd's query leaves to
    // its plan, to the higher originator, then the higher sequence id).
    let newest_reference = "WITH latest AS (
            SELECT DISTINCT ON (m.topic) m.originator_node_id, m.originator_sequence_id,
                   m.gateway_time, m.topic
              FROM envelopes.gateway_envelopes_meta m
             WHERE m.topic = ANY ($1::bytea[])
             ORDER BY m.topic, m.gateway_time DESC, m.originator_node_id DESC,
                      m.originator_sequence_id DESC)
        SELECT l.originator_node_id, l.originator_sequence_id,
               l.gateway_time AT TIME ZONE 'UTC' AS gateway_time, l.topic, b.originator_envelope
          FROM latest l
          JOIN envelopes.gateway_envelopes_blob b
            ON b.originator_node_id = l.originator_node_id
           AND b.originator_sequence_id = l.originator_sequence_id
         ORDER BY l.topic";
    for topics in [
        None,
        Some(vec![]),
        Some((0..=6).map(|t| Some(topic(t))).collect::<Vec<_>>()),
        Some(vec![Some(topic(5))]),
        Some(vec![Some(topic(2)), Some(topic(2)), None, Some(topic(1))]),
    ] {
        nonempty += usize::from(same(
            &mut c,
            "SELECT * FROM envelopes_xmtpd.select_newest_from_topics($1)",
            newest_reference,
            &[&topics],
            &format!("newest {topics:?}"),
        ));
        checked += 1;
    }
    // Without ties, xmtpd's ordering alone decides: the reference without the
    // tie breakers gives the same rows for topics 0 and 2, whose newest time
    // belongs to one row (originator 6, a late arrival low in its sequence).
    let untied = newest_reference.replace(
        ", m.originator_node_id DESC,\n                      m.originator_sequence_id DESC",
        "",
    );
    assert_ne!(untied, newest_reference);
    let topics = vec![topic(0), topic(2)];
    let got = xrows(
        &mut c,
        "SELECT * FROM envelopes_xmtpd.select_newest_from_topics($1)",
        &[&topics],
    )
    .unwrap();
    assert_eq!(got, xrows(&mut c, &untied, &[&topics]).unwrap());
    assert!(got.iter().all(|r| r.0 == 6), "{got:?}");

    // Ceilings: one row per element, in the order given.
    for nodes in [
        None,
        Some(vec![]),
        Some(vec![Some(4), Some(9), Some(4), None, Some(2)]),
    ] {
        let got: Vec<(Option<i32>, i64)> = c
            .query(
                "SELECT * FROM envelopes_xmtpd.select_originator_ceilings($1)",
                &[&nodes],
            )
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        let want: Vec<(Option<i32>, i64)> = c
            .query(
                "SELECT o.node, COALESCE((SELECT max(m.originator_sequence_id)
                                            FROM envelopes.gateway_envelopes_meta m
                                           WHERE m.originator_node_id = o.node), 0)
                   FROM unnest($1::int[]) WITH ORDINALITY AS o(node, ord) ORDER BY o.ord",
                &[&nodes],
            )
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        assert_eq!(got, want, "ceilings {nodes:?}");
        checked += 1;
    }

    // Negative limits are xmtpd's LIMIT error.
    for call in [
        "select_gateway_envelopes_by_single_originator(1, 0, -1)",
        "select_gateway_envelopes_by_originators('{1}', '{0}', -1)",
        "select_gateway_envelopes_unfiltered('{1,1}', '{0,1}', -1)",
        "select_gateway_envelopes_by_topics('{1}', '{0}', '{\\\\x7000}', -2)",
        "select_gateway_envelopes_by_per_topic_cursors('{\\\\x7000}', '{1}', '{0}', 1, -1)",
        "select_gateway_envelopes_wave_scan('{\\\\x7000}', '{1}', '{0}', '{1}', '{9}', 0, 0, -1)",
    ] {
        let err = c
            .batch_execute(&format!("SELECT * FROM envelopes_xmtpd.{call}"))
            .expect_err(call);
        assert_eq!(sqlstate(&err), "2201W", "{call}: {err}");
    }
    assert!(
        checked > 1000 && nonempty > 400,
        "{checked} comparisons, {nonempty} with rows"
    );
}

/// The batch insert returns the key of every row it stored and of no other: a
/// key already stored, one given twice, or one another session stored at the
/// same moment is charged once, by whoever stored it. Payer 0 is no payer,
/// gateway times are UTC under any session time zone, and both write paths
/// (direct, and SQL when a trigger keeps the direct one away) agree.
#[test]
fn the_xmtpd_batch_insert_returns_exactly_the_new_keys() {
    let db = TestDb::new("xmtpd_insert");
    let mut c = db.connect();
    c.batch_execute("SET TimeZone = 'America/New_York'")
        .unwrap();
    pg_envelopes_tests::insert(&mut c, 1, 2);
    let insert = "SELECT originator_node_id, originator_sequence_id, payer_id,
                         gateway_time::text
                    FROM envelopes_xmtpd.insert_gateway_envelope_batch($1, $2, $3, $4, $5::text[]::timestamp[], NULL, $6)";
    let run = |c: &mut Client,
               nodes: &[i32],
               seqs: &[i64],
               payers: &[i32]|
     -> Vec<(i32, i64, Option<i32>, String)> {
        let n = nodes.len();
        let topics = vec![vec![1u8]; n];
        let times = vec!["2026-01-01 00:00:00".to_owned(); n];
        let envelopes = vec![vec![2u8]; n];
        c.query(
            insert,
            &[&nodes, &seqs, &topics, &payers, &times, &envelopes],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect()
    };
    // 3 rows, 1 already stored: 2 new.
    let got = run(&mut c, &[1, 1, 1], &[1, 2, 3], &[0, 5, 0]);
    assert_eq!(
        got,
        [
            (1, 1, None, "2026-01-01 00:00:00".to_owned()),
            (1, 3, None, "2026-01-01 00:00:00".to_owned())
        ]
    );
    // Stored as midnight UTC with no payer.
    let (time, payer): (String, Option<i32>) = {
        let r = c
            .query_one(
                "SELECT (gateway_time AT TIME ZONE 'UTC')::text, payer_id
                   FROM envelopes.gateway_envelopes_meta
                  WHERE originator_node_id = 1 AND originator_sequence_id = 3",
                &[],
            )
            .unwrap();
        (r.get(0), r.get(1))
    };
    assert_eq!((time.as_str(), payer), ("2026-01-01 00:00:00", None));
    // A key twice in one batch: once.
    assert_eq!(run(&mut c, &[2, 2], &[7, 7], &[1, 1]).len(), 1);
    // Through the SQL path.
    c.batch_execute(
        "CREATE FUNCTION public.same() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END $$;
         CREATE TRIGGER same BEFORE INSERT ON envelopes.gateway_envelopes_meta
             FOR EACH ROW EXECUTE FUNCTION public.same()",
    )
    .unwrap();
    let got = run(&mut c, &[3, 1, 3], &[9, 3, 4], &[0, 0, 8]);
    assert_eq!(
        got.iter().map(|r| (r.0, r.1, r.2)).collect::<Vec<_>>(),
        [(3, 4, Some(8)), (3, 9, None)]
    );
    c.batch_execute("DROP TRIGGER same ON envelopes.gateway_envelopes_meta")
        .unwrap();

    // Racing writers with overlapping batches: every key returned exactly once
    // across them, and every key stored.
    let writers = 4;
    let rounds = 30;
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(writers));
    let handles: Vec<_> = (0..writers)
        .map(|w| {
            let url = db.url();
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                let mut c = Client::connect(&url, postgres::NoTls).unwrap();
                let mut mine = Vec::new();
                for round in 0..rounds {
                    // Each writer covers keys 0..20 of the round from its own
                    // starting point, so every key is wanted by every writer.
                    let seqs: Vec<i64> = (0..20)
                        .map(|k| 1 + round * 100 + (k + w as i64 * 5) % 20)
                        .collect();
                    barrier.wait();
                    mine.extend(
                        run(&mut c, &vec![50; seqs.len()], &seqs, &vec![0; seqs.len()])
                            .into_iter()
                            .map(|r| r.1),
                    );
                }
                mine
            })
        })
        .collect();
    let mut all: Vec<i64> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    all.sort_unstable();
    let expected: Vec<i64> = (0..rounds)
        .flat_map(|r| (0..20).map(move |k| 1 + r * 100 + k))
        .collect();
    assert_eq!(all, expected);
    assert_eq!(
        db.int8(
            "SELECT count(*) FROM envelopes.gateway_envelopes_meta WHERE originator_node_id = 50"
        ),
        rounds * 20
    );
}

/// The vector clock is the highest sequence id ever stored per originator,
/// with its gateway time: pruning lowers neither. Bounded pruning deletes only
/// expired rows below each given originator's bound.
#[test]
fn the_vector_clock_survives_pruning_and_pruning_stays_below_its_bounds() {
    let db = TestDb::new("xmtpd_clock");
    let mut c = db.connect();
    let clock = |c: &mut Client| -> Vec<(i32, i64, String)> {
        c.query(
            "SELECT originator_node_id, originator_sequence_id, gateway_time::text
               FROM envelopes_xmtpd.select_vector_clock()",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
    };
    c.batch_execute("SET envelopes.band_width = 10").unwrap();
    // Originator 1: 1..30 expired long ago; originator 2: 1..5 expired, 6 not.
    for seq in 1..=30i64 {
        c.execute(
            "SELECT envelopes.insert_gateway_envelope(1, $1, '\\x01', '\\x01', expiry => 100,
                 gateway_time => '2026-01-01 00:00:00+00'::timestamptz
                                 + ($1::bigint)::float8 * interval '1 second')",
            &[&seq],
        )
        .unwrap();
    }
    for seq in 1..=6i64 {
        let expiry: Option<i64> = (seq < 6).then_some(100);
        c.execute(
            "SELECT envelopes.insert_gateway_envelope(2, $1, '\\x01', '\\x01', expiry => $2,
                 gateway_time => '2026-01-02 00:00:00+00')",
            &[&seq, &expiry],
        )
        .unwrap();
    }
    let before = clock(&mut c);
    assert_eq!(
        before,
        [
            (1, 30, "2026-01-01 00:00:30".to_owned()),
            (2, 6, "2026-01-02 00:00:00".to_owned())
        ]
    );
    // Bounded: originator 1 below 12 only; originator 2 not named.
    c.batch_execute("SELECT count(*) FROM envelopes.prune_expired_below('{1}', '{12}')")
        .unwrap();
    assert_eq!(
        db.int8(
            "SELECT count(*) FROM envelopes.gateway_envelopes_meta WHERE originator_node_id = 1"
        ),
        19
    );
    assert_eq!(
        db.int8(
            "SELECT count(*) FROM envelopes.gateway_envelopes_meta WHERE originator_node_id = 2"
        ),
        6
    );
    // Everything expired, through the layer's wrapper with both bounds high.
    c.batch_execute(
        "SELECT count(*) FROM envelopes_xmtpd.prune_expired_below_ceilings('{1,2}', '{1000,1000}')",
    )
    .unwrap();
    assert_eq!(
        db.int8("SELECT count(*) FROM envelopes.gateway_envelopes_meta"),
        1
    );
    assert_eq!(clock(&mut c), before);
    let latest = |c: &mut Client, node: i32| -> i64 {
        c.query_one(
            "SELECT envelopes_xmtpd.get_latest_sequence_id($1)",
            &[&node],
        )
        .unwrap()
        .get(0)
    };
    assert_eq!(
        (latest(&mut c, 1), latest(&mut c, 2), latest(&mut c, 3)),
        (30, 6, 0)
    );
    let ids: Vec<i32> = c
        .query(
            "SELECT * FROM envelopes_xmtpd.select_originator_node_ids()",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(ids, [1, 2]);
    // A higher id stored later moves the clock on.
    pg_envelopes_tests::insert(&mut c, 1, 31);
    assert_eq!(latest(&mut c, 1), 31);
    // Bad bounds.
    for (sql, code) in [
        (
            "SELECT * FROM envelopes.prune_expired_below('{1,1}', '{5,6}')",
            "22023",
        ),
        (
            "SELECT * FROM envelopes.prune_expired_below('{1}', '{5,6}')",
            "2202E",
        ),
        (
            "SELECT * FROM envelopes.prune_expired_below(NULL, '{5}')",
            "22004",
        ),
        (
            "SELECT * FROM envelopes.prune_expired_below('{NULL}', '{5}')",
            "22004",
        ),
    ] {
        let err = c.batch_execute(sql).expect_err(sql);
        assert_eq!(sqlstate(&err), code, "{sql}: {err}");
    }
}

/// A writer passes the band width in force, as xmtpd always does, and is let
/// through; another width is still the owner's to choose.
#[test]
fn a_writer_may_name_the_band_width_in_force() {
    let db = TestDb::new("xmtpd_parts");
    let role = pg_envelopes_tests::Role::new(&db, "xw");
    db.connect()
        .batch_execute(&format!("SELECT envelopes.grant_writer('{}')", role.name))
        .unwrap();
    let mut w = role.connect(&db);
    w.batch_execute("SELECT envelopes_xmtpd.ensure_gateway_parts_v3(5, 1, 1000000)")
        .unwrap();
    w.batch_execute("SELECT envelopes.ensure_gateway_parts(5, 2000000, band_width => 1000000)")
        .unwrap();
    let err = w
        .batch_execute("SELECT envelopes_xmtpd.ensure_gateway_parts_v3(5, 9000000, 10000)")
        .unwrap_err();
    assert_eq!(sqlstate(&err), "42501", "{err}");
    assert_eq!(
        db.int8("SELECT count(*) FROM envelopes.partitions() WHERE originator_node_id = 5"),
        2
    );
}

/// The rows of a read are kept in one backend-lived context between calls
/// (src/pg/srf.rs): it is emptied when the query ends, when it fails half way,
/// and it is not shared between two reads open at once (a cursor still being
/// fetched and a second read in the same transaction).
#[test]
fn read_results_memory_is_emptied_after_each_query_and_never_shared() {
    let db = TestDb::new("xmtpd_memory");
    let mut c = db.connect();
    c.batch_execute(
        "SELECT envelopes.insert_gateway_envelopes(array_agg(7), array_agg(s), array_agg('\\x01'::bytea),
                array_agg(pg_catalog.convert_to(repeat('e', 500), 'UTF8')))
           FROM generate_series(1::bigint, 3000) s",
    )
    .unwrap();
    let kept = |c: &mut Client| -> (i64, i64) {
        let r = c
            .query_one(
                "SELECT coalesce(sum(total_bytes), 0)::bigint, coalesce(sum(used_bytes), 0)::bigint
                   FROM pg_backend_memory_contexts WHERE name = 'pg_envelopes read result'",
                &[],
            )
            .unwrap();
        (r.get(0), r.get(1))
    };
    let count = |c: &mut Client, sql: &str| -> i64 { c.query_one(sql, &[]).unwrap().get(0) };
    assert_eq!(
        count(
            &mut c,
            "SELECT count(*) FROM envelopes.select_originator(7, 0, 3000)"
        ),
        3000
    );
    let (total, used) = kept(&mut c);
    assert!(total >= 1024 * 1024, "the first block stays: {total}");
    assert!(used < 4096, "emptied after the query: {used}");
    // A query failing after the read filled it.
    let err = c
        .batch_execute("SELECT 1 / (count(*) - 3000) FROM envelopes.select_originator(7, 0, 3000)")
        .unwrap_err();
    assert_eq!(sqlstate(&err), "22012");
    assert!(kept(&mut c).1 < 4096, "emptied after the failure");
    // Two reads open at once in one transaction: a cursor part way through and
    // a second read; both see their own rows.
    let mut tx = c.transaction().unwrap();
    tx.batch_execute(
        "DECLARE a CURSOR FOR SELECT originator_sequence_id FROM envelopes.select_originator(7, 0, 3000)",
    )
    .unwrap();
    let first: Vec<i64> = tx
        .query("FETCH 5 FROM a", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(first, [1, 2, 3, 4, 5]);
    let other: i64 = tx
        .query_one("SELECT sum(originator_sequence_id)::bigint FROM envelopes.select_originator(7, 2000, 1000)", &[])
        .unwrap()
        .get(0);
    assert_eq!(other, (2001..=3000).sum::<i64>());
    let rest: Vec<i64> = tx
        .query("FETCH ALL FROM a", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(rest, (6..=3000).collect::<Vec<i64>>());
    tx.batch_execute("CLOSE a").unwrap();
    tx.commit().unwrap();
    assert!(kept(&mut c).1 < 4096, "emptied once the cursor closed");
    // A LATERAL read calls the function once per outer row: every call sees
    // its own rows.
    assert_eq!(
        count(
            &mut c,
            "SELECT count(*) FROM generate_series(0, 2999, 1000) g,
                    LATERAL envelopes.select_originator(7, g, 1000) r
              WHERE r.originator_sequence_id > g AND r.originator_sequence_id <= g + 1000"
        ),
        3000
    );
}

/// A role granted the reader bundle calls every layer reader, on the path that
/// hands its input straight over and on the one that reads entry by entry; a
/// writer calls the layer's inserts; neither may call the other's.
#[test]
fn the_reader_and_writer_bundles_cover_the_xmtpd_layer() {
    let db = TestDb::new("xmtpd_roles");
    let reader = pg_envelopes_tests::Role::new(&db, "xr");
    let writer = pg_envelopes_tests::Role::new(&db, "xw");
    db.connect()
        .batch_execute(&format!(
            "SELECT envelopes.grant_reader('{}'); SELECT envelopes.grant_writer('{}');",
            reader.name, writer.name
        ))
        .unwrap();
    let mut w = writer.connect(&db);
    w.batch_execute(
        "SELECT * FROM envelopes_xmtpd.insert_gateway_envelope_batch('{1,1,2}', '{1,2,1}',
             '{\\\\x01,\\\\x02,\\\\x01}', '{0,0,0}', NULL, NULL, '{\\\\xaa,\\\\xbb,\\\\xcc}');
         SELECT * FROM envelopes_xmtpd.insert_gateway_envelope_v3(1, 3, '\\x01', 0,
             '2026-01-01 00:00:00', 9223372036854775807, '\\xdd');",
    )
    .unwrap();
    let mut r = reader.connect(&db);
    for (call, rows) in [
        ("select_gateway_envelopes_by_single_originator(1, 0, 0)", 3),
        ("select_gateway_envelopes_by_originators('{1,2}', '{0,0}', 0)", 4),
        ("select_gateway_envelopes_by_originators('{1,1}', '{0,2}', 0)", 4),
        ("select_gateway_envelopes_by_topics('{1,2}', '{0,0}', '{\\\\x01}', 10)", 3),
        ("select_gateway_envelopes_by_topics('{1,1}', '{0,0}', '{\\\\x01}', 10)", 4),
        ("select_gateway_envelopes_unfiltered('{1}', '{1}', 0)", 3),
        ("select_gateway_envelopes_unfiltered('{1,1}', '{1,0}', 0)", 6),
        ("select_gateway_envelopes_by_per_topic_cursors('{\\\\x01}', '{1}', '{0}', 10, 0)", 2),
        ("select_gateway_envelopes_by_per_topic_cursors('{\\\\x01,\\\\x01}', '{1,1}', '{0,0}', 10, 0)", 4),
        ("select_gateway_envelopes_wave_scan('{\\\\x01}', '{1}', '{0}', '{1}', '{9}', 0, 0, 10)", 2),
        ("select_gateway_envelopes_wave_scan('{\\\\x01}', '{1}', '{0}', '{1,1}', '{9,9}', 0, 0, 10)", 4),
        ("select_newest_from_topics('{\\\\x01,\\\\x02}')", 2),
        ("select_originator_ceilings('{1,2,3}')", 3),
        ("select_vector_clock()", 2),
        ("select_originator_node_ids()", 2),
    ] {
        let sql = format!("SELECT count(*) FROM envelopes_xmtpd.{call}");
        let got: i64 = r.query_one(&sql, &[]).unwrap_or_else(|e| panic!("{sql}: {e}")).get(0);
        assert_eq!(got, rows, "{sql}");
    }
    let err = r
        .batch_execute("SELECT * FROM envelopes_xmtpd.insert_gateway_envelope_v3(1, 9, '\\x01', 0, NULL, NULL, '\\xdd')")
        .unwrap_err();
    assert_eq!(sqlstate(&err), "42501", "{err}");
    let err = w
        .batch_execute("SELECT * FROM envelopes_xmtpd.select_vector_clock()")
        .unwrap_err();
    assert_eq!(sqlstate(&err), "42501", "{err}");
}
