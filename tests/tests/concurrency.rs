//! Several real connections creating partitions at the same time.

use pg_envelopes_tests::{sqlstate, TestDb};
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
                            errors.push(format!("writer {w} seq {seq}: {} {e}", sqlstate(&e)));
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
