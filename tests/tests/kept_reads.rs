//! The read functions keep what they read for the transaction, as a table scan
//! does: the band leaves a read function scanned stay locked (ACCESS SHARE) until
//! the transaction ends, so `prune_expired` passes those bands by and a TRUNCATE
//! waits, and a REPEATABLE READ or SERIALIZABLE reader reading again sees the
//! same rows. (The reads used to give each lock back when their scan closed: a
//! prune in another session then dropped the band, and the same read returned 1
//! row instead of 501.)

use pg_envelopes_tests::{sqlstate, TestDb};
use postgres::IsolationLevel;

/// Originator 60: rows 1..=500 in band [0, 1000), all expired (prune deletes
/// them, then drops the band once empty: it is not the newest), on topic `\x01`;
/// row 1500 in band [1000, 2000), on topic `\x02`, never expiring.
fn setup(label: &str) -> TestDb {
    let db = TestDb::new(label);
    db.connect()
        .batch_execute(
            "SELECT envelopes.ensure_gateway_parts(60, 1, 1000);
             SELECT envelopes.ensure_gateway_parts(60, 1500, 1000);
             SELECT envelopes.insert_gateway_envelopes(array_agg(60), array_agg(s::bigint),
                 array_agg('\\x01'::bytea), array_agg(pg_catalog.int8send(s::bigint)),
                 expiries => array_agg(100::bigint))
               FROM generate_series(1, 500) s;
             SELECT envelopes.insert_gateway_envelope(60, 1500, '\\x02', '\\x02');",
        )
        .unwrap();
    db
}

const LOW_META: &str = "envelopes.gateway_envelopes_meta_o60_s0_1000";
const LOW_BLOB: &str = "envelopes.gateway_envelopes_blob_o60_s0_1000";
const HIGH_META: &str = "envelopes.gateway_envelopes_meta_o60_s1000_2000";

/// Each read function (and the view) with what it returns here, and the band
/// leaves it reads (which another session then tries to truncate). The
/// commit-safe forms are not here: they read with a snapshot of their own, taken
/// after the ceilings at each call, not the transaction's.
const READS: [(&str, i64, &[&str]); 9] = [
    (
        "SELECT count(*) FROM envelopes.select_gateway_envelopes(originator_node_ids => ARRAY[60])",
        501,
        &[LOW_META, LOW_BLOB],
    ),
    (
        "SELECT count(*) FROM envelopes.select_gateway_envelopes(topics => ARRAY['\\x01'::bytea])",
        500,
        &[LOW_META, LOW_BLOB],
    ),
    (
        "SELECT count(*) FROM envelopes.select_originator(60)",
        501,
        &[LOW_META, LOW_BLOB],
    ),
    (
        "SELECT count(*) FROM envelopes.select_by_topic_cursors(ARRAY['\\x01'::bytea], ARRAY[60],
             ARRAY[0]::bigint[])",
        500,
        &[LOW_META, LOW_BLOB],
    ),
    (
        "SELECT count(*) FROM envelopes.select_wave(ARRAY['\\x01'::bytea], ARRAY[60],
             ARRAY[0]::bigint[], ARRAY[60], ARRAY[9999]::bigint[])",
        500,
        &[LOW_META, LOW_BLOB],
    ),
    (
        "SELECT COALESCE(max(originator_sequence_id), 0)
           FROM envelopes.select_newest_by_topic(ARRAY['\\x01'::bytea])",
        500,
        &[LOW_META, LOW_BLOB],
    ),
    (
        "SELECT max_sequence_id FROM envelopes.originator_maxima(ARRAY[60])",
        1500,
        &[HIGH_META],
    ),
    (
        "SELECT count(*) FROM envelopes.gateway_envelopes_view WHERE originator_node_id = 60",
        501,
        &[LOW_META, LOW_BLOB],
    ),
    (
        "SELECT count(*) FROM envelopes.gateway_envelopes_view
          WHERE originator_node_id = 60 AND originator_sequence_id <= 500",
        500,
        &[LOW_BLOB],
    ),
];

/// For every read function, in REPEATABLE READ and SERIALIZABLE: read, let
/// another session prune (deleting the 500 expired rows, which the reader's
/// snapshot still sees, and trying to drop their band) and try to TRUNCATE every
/// leaf the read touched (which must wait: lock_timeout, 55P03), read again in
/// the same transaction: the same answer. After the reader commits, the
/// TRUNCATE goes through.
#[test]
fn a_repeatable_read_reader_keeps_what_it_read() {
    for level in [IsolationLevel::RepeatableRead, IsolationLevel::Serializable] {
        for (i, (read, expected, leaves)) in READS.iter().enumerate() {
            let label = format!("{level:?}: {read}");
            let db = setup(&format!("kept_{i}"));
            let mut reader = db.connect();
            let mut tx = reader
                .build_transaction()
                .isolation_level(level)
                .start()
                .unwrap();
            let first: i64 = tx.query_one(*read, &[]).unwrap().get(0);
            assert_eq!(first, *expected, "{label}");
            let mut other = db.connect();
            other
                .batch_execute("SELECT * FROM envelopes.prune_expired(as_of => 200)")
                .unwrap_or_else(|e| panic!("{label}: prune: {e}"));
            other.batch_execute("SET lock_timeout = '200ms'").unwrap();
            for leaf in *leaves {
                let err = other
                    .batch_execute(&format!("TRUNCATE {leaf}"))
                    .expect_err("TRUNCATE must wait for the reader");
                assert_eq!(sqlstate(&err), "55P03", "{label}: TRUNCATE {leaf}");
            }
            let again: i64 = tx.query_one(*read, &[]).unwrap().get(0);
            assert_eq!(again, first, "{label}: read again in the same transaction");
            tx.commit().unwrap();
            for leaf in *leaves {
                if db.int8(&format!(
                    "SELECT count(*) FROM pg_catalog.pg_class WHERE oid = pg_catalog.to_regclass('{leaf}')"
                )) == 1
                {
                    other
                        .batch_execute(&format!("TRUNCATE {leaf}"))
                        .unwrap_or_else(|e| panic!("{label}: TRUNCATE {leaf} after commit: {e}"));
                }
            }
        }
    }
}
