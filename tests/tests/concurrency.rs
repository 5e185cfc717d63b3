//! Several real connections creating partitions at the same time.

use pg_envelopes_tests::{report, sqlstate, TestDb};
use std::sync::{Arc, Barrier};
use std::thread;

const WRITERS: i64 = 8;
const BAND: i64 = 50;
const ROUNDS: usize = 3;

/// Eight writers insert interleaved sequence ids of the same originators, so they
/// all reach each band boundary at about the same moment and race to create the
/// band; they also keep creating new originators. Single inserts, batches and
/// multi-statement transactions are mixed. Repeated on a fresh database each round:
/// no statement may fail, and every row lands exactly once in meta and blob.
#[test]
fn eight_writers_crossing_bands_together_creating_in_workers() {
    crossing(
        "worker",
        std::env::var("ENVELOPES_STRESS_ROUNDS")
            .ok()
            .and_then(|r| r.parse().ok())
            .unwrap_or(ROUNDS),
    );
}

#[test]
fn eight_writers_crossing_bands_together_creating_in_transactions() {
    crossing(
        "transaction",
        std::env::var("ENVELOPES_STRESS_ROUNDS")
            .ok()
            .and_then(|r| r.parse().ok())
            .unwrap_or(ROUNDS),
    );
}

fn crossing(mode: &'static str, rounds: usize) {
    for round in 0..rounds {
        let db = TestDb::new("crossing");
        let per_writer: i64 = 120; // sequence ids per originator per writer
        let barrier = Arc::new(Barrier::new(WRITERS as usize));
        let handles: Vec<_> = (0..WRITERS)
            .map(|w| {
                let url = db.url();
                let barrier = barrier.clone();
                thread::spawn(move || -> Vec<String> {
                    let mut client = postgres::Client::connect(&url, postgres::NoTls).expect("connect");
                    client
                        .batch_execute(&format!(
                            "SET envelopes.band_width = {BAND};
                             SET envelopes.create_partitions_in = '{mode}'"
                        ))
                        .expect("set band width");
                    let mut errors = Vec::new();
                    barrier.wait();
                    for i in 0..per_writer {
                        let seq = i * WRITERS + w + 1; // writers interleave within each band
                        let new_origin = 100 + (i % 40) as i32; // appear concurrently too
                        let result = match i % 3 {
                            0 => client
                                .query_one(
                                    "SELECT envelopes.insert_gateway_envelope($1, $2, '\\x01', '\\x02')",
                                    &[&1i32, &seq],
                                )
                                .map(|_| ()),
                            1 => client
                                .query_one(
                                    "SELECT envelopes.insert_gateway_envelopes(
                                         ARRAY[2, 3, $1::int], ARRAY[$2::bigint, $2::bigint, $2::bigint],
                                         ARRAY['\\x01','\\x01','\\x01']::bytea[], ARRAY['\\x02','\\x02','\\x02']::bytea[])",
                                    &[&new_origin, &seq],
                                )
                                .map(|_| ()),
                            _ => client.transaction().and_then(|mut tx| {
                                tx.query_one(
                                    "SELECT envelopes.insert_gateway_envelope(1, $1, '\\x01', '\\x02')",
                                    &[&seq],
                                )?;
                                tx.query_one(
                                    "SELECT envelopes.insert_gateway_envelopes(ARRAY[2, 3, $1::int],
                                         ARRAY[$2::bigint, $2::bigint, $2::bigint],
                                         ARRAY['\\x01','\\x01','\\x01']::bytea[],
                                         ARRAY['\\x02','\\x02','\\x02']::bytea[])",
                                    &[&new_origin, &seq],
                                )?;
                                tx.commit()
                            }),
                        };
                        if let Err(e) = result {
                            errors.push(format!("writer {w} seq {seq}: {}", report(&e)));
                        }
                    }
                    errors
                })
            })
            .collect();
        let errors: Vec<String> = handles
            .into_iter()
            .flat_map(|h| h.join().expect("writer thread"))
            .collect();
        assert!(
            errors.is_empty(),
            "{mode} round {round}: {} failed statements: {errors:#?}",
            errors.len()
        );

        let total = WRITERS * per_writer;
        // node 1 gets every seq (from i%3 == 0 and 2); nodes 2 and 3 get i%3 != 0.
        let per_node_23 = (0..per_writer).filter(|i| i % 3 != 0).count() as i64 * WRITERS;
        assert_eq!(db.int8("SELECT count(*) FROM envelopes.gateway_envelopes_meta WHERE originator_node_id = 1"),
            (0..per_writer).filter(|i| i % 3 != 1).count() as i64 * WRITERS);
        assert_eq!(db.int8("SELECT count(*) FROM envelopes.gateway_envelopes_meta WHERE originator_node_id = 2"), per_node_23);
        assert_eq!(db.int8("SELECT count(*) FROM envelopes.gateway_envelopes_meta WHERE originator_node_id = 3"), per_node_23);
        assert_eq!(db.int8("SELECT count(*) FROM envelopes.gateway_envelopes_meta WHERE originator_node_id >= 100"), per_node_23);
        assert_eq!(
            db.int8("SELECT count(*) FROM envelopes.orphaned_envelopes()"),
            0
        );
        // Every band of nodes 1-3 exists once per table, with the configured width.
        let bands = total / BAND + 1; // sequence ids 1..=total
        for node in 1..=3 {
            for table in ["meta", "blob"] {
                let n = db.int8(&format!(
                    "SELECT count(*) FROM pg_catalog.pg_class
                      WHERE relkind = 'r' AND relname LIKE 'gateway\\_envelopes\\_{table}\\_o{node}\\_s%'"
                ));
                assert_eq!(n, bands, "round {round}: node {node} {table} bands");
            }
        }
    }
}

/// Eight connections insert the same keys at the same time on the direct write
/// path: each writer goes through the same 4 originators × 300 sequence ids in its
/// own order (rotated, some reversed), as single inserts, batches with repeats
/// and multi-statement transactions (each in key order), so most keys are raced by several writers
/// while another one's insert of them is still uncommitted. No statement may fail,
/// each key is stored once in meta and blob with one writer's values, and the
/// counts the functions return add up to the number of distinct keys.
#[test]
fn eight_writers_racing_on_the_same_keys_store_each_once() {
    const NODES: i32 = 4;
    const SEQS: i64 = 300;
    for round in 0..2 {
        let db = TestDb::new("dupes");
        // Bands created first: the race is about rows, not partitions.
        db.connect()
            .batch_execute(&format!(
                "SELECT envelopes.ensure_gateway_parts(n, 1, {SEQS}) FROM generate_series(1, {NODES}) n"
            ))
            .expect("create bands");
        let keys: Vec<(i32, i64)> = (1..=SEQS)
            .flat_map(|s| (1..=NODES).map(move |n| (n, s)))
            .collect();
        let barrier = Arc::new(Barrier::new(WRITERS as usize));
        let handles: Vec<_> = (0..WRITERS)
            .map(|w| {
                let url = db.url();
                let barrier = barrier.clone();
                let mut mine = keys.clone();
                mine.rotate_left((w as usize * 37) % keys.len());
                if w % 2 == 1 {
                    mine.reverse();
                }
                thread::spawn(move || -> (i64, Vec<String>) {
                    let mut client =
                        postgres::Client::connect(&url, postgres::NoTls).expect("connect");
                    let mut new = 0i64;
                    let mut errors = Vec::new();
                    barrier.wait();
                    for (i, chunk) in mine.chunks(6).enumerate() {
                        let tag = format!("w{w}");
                        let result: Result<i64, postgres::Error> = match (i + round) % 3 {
                            0 => chunk.iter().try_fold(0i64, |sum, (n, s)| {
                                client
                                    .query_one(
                                        "SELECT envelopes.insert_gateway_envelope($1, $2,
                                             pg_catalog.convert_to($3, 'UTF8'), '\\x02')",
                                        &[n, s, &tag],
                                    )
                                    .map(|row| sum + row.get::<_, i64>(0))
                            }),
                            1 => {
                                // The chunk twice over: repeats inside one batch.
                                let nodes: Vec<i32> =
                                    chunk.iter().chain(chunk).map(|k| k.0).collect();
                                let seqs: Vec<i64> =
                                    chunk.iter().chain(chunk).map(|k| k.1).collect();
                                client
                                    .query_one(
                                        "SELECT envelopes.insert_gateway_envelopes($1::int[], $2::bigint[],
                                             array_fill(pg_catalog.convert_to($3::text, 'UTF8'), ARRAY[pg_catalog.cardinality($1::int[])]),
                                             array_fill('\\x02'::bytea, ARRAY[pg_catalog.cardinality($1::int[])]))",
                                        &[&nodes, &seqs, &tag],
                                    )
                                    .map(|row| row.get::<_, i64>(0))
                            }
                            _ => client.transaction().and_then(|mut tx| {
                                // In key order, as a batch does: transactions that
                                // hold some keys while inserting others would
                                // deadlock each other in any other order, whatever
                                // the insert path.
                                let mut sorted = chunk.to_vec();
                                sorted.sort_unstable();
                                let mut sum = 0i64;
                                for (n, s) in &sorted {
                                    sum += tx
                                        .query_one(
                                            "SELECT envelopes.insert_gateway_envelope($1, $2,
                                                 pg_catalog.convert_to($3, 'UTF8'), '\\x02')",
                                            &[n, s, &tag],
                                        )?
                                        .get::<_, i64>(0);
                                    // Hold the row uncommitted a moment longer.
                                    tx.batch_execute("SELECT pg_catalog.pg_sleep(0.0005)")?;
                                }
                                tx.commit()?;
                                Ok(sum)
                            }),
                        };
                        match result {
                            Ok(n) => new += n,
                            Err(e) => errors.push(format!("writer {w}: {} {e:?}", sqlstate(&e))),
                        }
                    }
                    (new, errors)
                })
            })
            .collect();
        let mut new = 0;
        let mut errors = Vec::new();
        for handle in handles {
            let (n, e) = handle.join().expect("writer thread");
            new += n;
            errors.extend(e);
        }
        assert!(errors.is_empty(), "round {round}: {errors:#?}");
        let distinct = keys.len() as i64;
        assert_eq!(new, distinct, "round {round}: the returned counts");
        assert_eq!(
            db.int8("SELECT count(*) FROM envelopes.gateway_envelopes_meta"),
            distinct
        );
        assert_eq!(
            db.int8("SELECT count(*) FROM envelopes.gateway_envelopes_blob"),
            distinct
        );
        assert_eq!(
            db.int8(
                "SELECT count(DISTINCT (originator_node_id, originator_sequence_id))
                   FROM envelopes.gateway_envelopes_meta"
            ),
            distinct
        );
        assert_eq!(
            db.int8("SELECT count(*) FROM envelopes.orphaned_envelopes()"),
            0
        );
        // Every writer won some keys: the race really was one.
        assert!(db.int8("SELECT count(DISTINCT topic) FROM envelopes.gateway_envelopes_meta") > 1);
    }
}

/// At REPEATABLE READ an insert of a key that another transaction committed after
/// the caller's snapshot was taken fails with 40001, as `ON CONFLICT DO NOTHING`
/// does, instead of returning 0 for a row the caller cannot see; a key the caller
/// can see returns 0; and a key written by the same transaction returns 0.
#[test]
fn repeatable_read_callers_see_serialization_failures_for_unseen_conflicts() {
    let db = TestDb::new("rr");
    let mut setup = db.connect();
    setup
        .batch_execute(
            "SELECT envelopes.ensure_gateway_parts(1, 1, 100);
             SELECT envelopes.insert_gateway_envelope(1, 1, '\\x01', '\\x02')",
        )
        .unwrap();
    let mut rr = db.connect();
    for single in [true, false] {
        let seq: i64 = if single { 10 } else { 20 };
        rr.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1 FROM envelopes.gateway_envelopes_meta LIMIT 1")
            .unwrap();
        // Visible conflict: 0.
        let visible: i64 = rr
            .query_one(
                "SELECT envelopes.insert_gateway_envelope(1, 1, '\\x01', '\\x02')",
                &[],
            )
            .unwrap()
            .get(0);
        assert_eq!(visible, 0);
        // Own row: 0 the second time.
        for expected in [1i64, 0] {
            let got: i64 = rr
                .query_one(
                    "SELECT envelopes.insert_gateway_envelope(1, 50, '\\x01', '\\x02')",
                    &[],
                )
                .unwrap()
                .get(0);
            assert_eq!(got, expected);
        }
        setup
            .query_one(
                "SELECT envelopes.insert_gateway_envelope(1, $1, '\\x01', '\\x02')",
                &[&seq],
            )
            .unwrap();
        let err = if single {
            rr.query_one("SELECT envelopes.insert_gateway_envelope(1, $1, '\\x01', '\\x02')", &[&seq])
        } else {
            rr.query_one(
                "SELECT envelopes.insert_gateway_envelopes(ARRAY[1, 1], ARRAY[$1::bigint, $1::bigint + 1],
                     ARRAY['\\x01', '\\x01']::bytea[], ARRAY['\\x02', '\\x02']::bytea[])",
                &[&seq],
            )
        }
        .expect_err("an unseen conflict must fail");
        assert_eq!(sqlstate(&err), "40001", "{err}");
        rr.batch_execute("ROLLBACK").unwrap();
    }
    assert_eq!(
        db.int8("SELECT count(*) FROM envelopes.gateway_envelopes_meta"),
        3
    );
}
