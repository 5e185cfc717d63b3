//! The store's own functions at many bands: a read locks the bands it finds rows
//! in, not every band it looks into; `orphaned_envelopes()` reads band by band;
//! `prune_expired(in_transaction => true)`, which must lock every band at once,
//! refuses before it takes a lock when they would not fit the lock table (53400,
//! naming max_locks_per_transaction), instead of failing part way with 53200.
//!
//! `ENVELOPES_TEST_PG_FEW_LOCKS` names a server started by scripts/test.sh with
//! `max_locks_per_transaction = 10` (a lock table of a few hundred entries), so
//! that 1,000 bands stand for what 10,000 and more are to a server with the
//! default 64.

use pg_envelopes_tests::{sqlstate, TestDb};

const ORIGINATORS: i32 = 10;
const BANDS: i64 = 100;

fn store() -> TestDb {
    let server = std::env::var("ENVELOPES_TEST_PG_FEW_LOCKS")
        .expect("ENVELOPES_TEST_PG_FEW_LOCKS is not set: run through scripts/test.sh");
    let db = TestDb::new_on(server, "scale");
    let mut c = db.connect();
    c.batch_execute(&format!(
        "SET envelopes.band_width = 1000;
         SET envelopes.create_partitions_in = 'transaction';
         CREATE PROCEDURE make_bands() LANGUAGE plpgsql AS $$
         BEGIN
             FOR n IN 1..{ORIGINATORS} LOOP
                 FOR s IN 0..{BANDS} - 1 LOOP
                     -- A transaction each: new tables stay locked until commit.
                     PERFORM envelopes.ensure_gateway_parts(n, s * 1000 + 1);
                     COMMIT;
                 END LOOP;
             END LOOP;
         END $$;"
    ))
    .unwrap();
    c.batch_execute("CALL make_bands()").unwrap();
    // Rows in the first and the last band of each originator only; one expires.
    c.batch_execute(&format!(
        "SELECT envelopes.insert_gateway_envelope(n, s, CASE WHEN s < 1000 THEN '\\x0a'::bytea ELSE '\\x0b' END,
                                                 '\\x02', expiry => CASE WHEN s = 6 THEN 1 END)
           FROM generate_series(1, {ORIGINATORS}) n, (VALUES (5), (6), ({last})) v(s)",
        last = (BANDS - 1) * 1000 + 1
    ))
    .unwrap();
    db
}

#[test]
fn the_extension_functions_work_at_many_bands_with_a_small_lock_table() {
    let db = store();
    let mut c = db.connect();
    let size = c
        .query_one(
            "SELECT originators, bands, whole_store_locks, lock_table_size FROM envelopes.store_size()",
            &[],
        )
        .unwrap();
    assert_eq!(size.get::<_, i64>(0), i64::from(ORIGINATORS));
    assert_eq!(size.get::<_, i64>(1), i64::from(ORIGINATORS) * BANDS);
    assert!(
        size.get::<_, i64>(2) > size.get::<_, i64>(3),
        "the store is larger than the lock table: {size:?}"
    );

    let rows = 3 * i64::from(ORIGINATORS);
    for (read, expected) in [
        (
            "SELECT count(*) FROM envelopes.select_gateway_envelopes(row_limit => 1000)",
            rows,
        ),
        (
            "SELECT count(*) FROM envelopes.select_gateway_envelopes(topics => ARRAY['\\x0b'::bytea])",
            i64::from(ORIGINATORS),
        ),
        (
            "SELECT count(*) FROM envelopes.select_newest_by_topic(ARRAY['\\x0a'::bytea, '\\x0b'::bytea])",
            2,
        ),
        ("SELECT count(*) FROM envelopes.orphaned_envelopes()", 0),
        ("SELECT count(*) FROM envelopes.originator_ceilings()", i64::from(ORIGINATORS)),
    ] {
        // In one transaction, as a client would read, and with the locks it keeps
        // counted: the bands it found rows in, not every band.
        let mut tx = c.transaction().unwrap();
        let got: i64 = tx
            .query_one(read, &[])
            .unwrap_or_else(|e| panic!("{read}: {e}"))
            .get(0);
        assert_eq!(got, expected, "{read}");
        let locks: i64 = tx
            .query_one(
                "SELECT count(*) FROM pg_catalog.pg_locks WHERE pid = pg_catalog.pg_backend_pid()",
                &[],
            )
            .unwrap()
            .get(0);
        assert!(
            locks <= 4 * i64::from(ORIGINATORS) + 10,
            "{read} holds {locks} locks for {} bands",
            i64::from(ORIGINATORS) * BANDS
        );
        tx.commit().unwrap();
    }

    // Pruning everything in one transaction cannot fit: refused before it
    // touches anything, with what to do.
    let err = c
        .batch_execute("SELECT * FROM envelopes.prune_expired(as_of => 10, in_transaction => true)")
        .expect_err("more locks than the lock table holds");
    assert_eq!(sqlstate(&err), "53400", "{err}");
    let text = err
        .as_db_error()
        .map(|e| format!("{} {:?}", e.message(), e.hint()))
        .unwrap_or_default();
    assert!(text.contains("max_locks_per_transaction"), "{text}");
    assert_eq!(
        db.int8("SELECT count(*) FROM envelopes.select_gateway_envelopes(row_limit => 100000)"),
        rows,
        "nothing pruned (counted through the function: a count over the roots would lock every band)"
    );
    // Band by band it works.
    let deleted = db.int8(
        "SELECT COALESCE(sum(deleted_rows), 0)::bigint FROM envelopes.prune_expired(as_of => 10)",
    );
    assert_eq!(deleted, i64::from(ORIGINATORS));
}
