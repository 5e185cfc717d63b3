//! Cursor reads across real sessions: commit-safe ceilings and retention under load.

use pg_envelopes_tests::{insert, sqlstate, TestDb};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

fn ceilings(db: &TestDb) -> BTreeMap<i32, i64> {
    db.connect()
        .query(
            "SELECT originator_node_id, max_sequence_id FROM envelopes.originator_ceilings()",
            &[],
        )
        .expect("ceilings")
        .into_iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

/// Seq 2 is in an open transaction while 1 and 3 are committed: the ceiling is 1
/// until that transaction commits, then 3. Run twice: with the open transaction
/// taking its transaction id before and after the one that commits seq 3. The
/// second order is the one a rule based only on transaction ids and the oldest
/// running transaction gets wrong (seq 3's id is older than every running one).
#[test]
fn ceiling_never_passes_an_uncommitted_row() {
    for open_first in [true, false] {
        let db = TestDb::new("ceiling");
        let mut open = db.connect();
        let mut other = db.connect();
        insert(&mut other, 1, 1);
        insert(&mut other, 7, 10); // an unrelated originator is not held back

        let mut other_tx = other.transaction().unwrap();
        let mut open_tx;
        if open_first {
            open_tx = open.transaction().unwrap();
            insert(&mut open_tx, 1, 2);
            insert(&mut other_tx, 1, 3);
        } else {
            insert(&mut other_tx, 1, 3); // takes the older transaction id
            open_tx = open.transaction().unwrap();
            insert(&mut open_tx, 1, 2);
        }
        other_tx.commit().unwrap();

        let seen = ceilings(&db);
        assert_eq!(seen.get(&1), Some(&1), "open_first={open_first}: {seen:?}");
        assert_eq!(seen.get(&7), Some(&10));
        // A reader bounded by the ceiling sees seq 1 only.
        let rows = db.int8(
            "SELECT count(*) FROM envelopes.select_gateway_envelopes(originator_node_ids => '{1}')
              WHERE originator_sequence_id <= 1",
        );
        assert_eq!(rows, 1);

        open_tx.commit().unwrap();
        assert_eq!(ceilings(&db).get(&1), Some(&3), "open_first={open_first}");
    }
}

/// A rolled back writer releases its hold on the ceiling.
#[test]
fn rollback_releases_the_ceiling() {
    let db = TestDb::new("ceiling_rollback");
    let mut writer = db.connect();
    insert(&mut writer, 1, 5);
    let mut tx = writer.transaction().unwrap();
    insert(&mut tx, 1, 3);
    assert_eq!(ceilings(&db).get(&1), Some(&2));
    tx.rollback().unwrap();
    assert_eq!(ceilings(&db).get(&1), Some(&5));
}

/// prune_expired runs again and again while four writers keep inserting rows that
/// are mostly expired already, plus late arrivals into old bands. No writer ever fails, no
/// unexpired row is lost, nothing is orphaned, and expired rows end up gone.
#[test]
fn prune_is_safe_while_inserts_go_on() {
    let db = TestDb::new("prune");
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..4i64)
        .map(|w| {
            let url = db.url();
            let stop = stop.clone();
            thread::spawn(move || -> (Vec<String>, i64) {
                let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
                c.batch_execute("SET envelopes.band_width = 20").unwrap();
                let (mut errors, mut kept) = (Vec::new(), 0i64);
                let mut i = 0i64;
                while !stop.load(Ordering::Relaxed) || i < 200 {
                    // Most rows are born expired, so old bands empty out and get
                    // dropped; every fifth row is a late arrival, not expired, into a
                    // band about ten bands back that prune may just have dropped.
                    let (seq, expiry) = if i % 5 == 4 && i >= 50 {
                        (2 * ((i - 50) * 4 + w) + 1, None)
                    } else {
                        (2 * (i * 4 + w) + 2, Some(1i64))
                    };
                    match c.query_one(
                        "SELECT envelopes.insert_gateway_envelope(1, $1, '\\x01', '\\x02', expiry => $2)",
                        &[&seq, &expiry],
                    ) {
                        Ok(row) => kept += if expiry.is_none() { row.get::<_, i64>(0) } else { 0 },
                        Err(e) => errors.push(format!("{} {e}", sqlstate(&e))),
                    }
                    i += 1;
                }
                (errors, kept)
            })
        })
        .collect();
    let mut pruner = db.connect();
    let mut dropped = 0i64;
    for _ in 0..30 {
        let row = pruner
            .query_one(
                "SELECT count(*) FILTER (WHERE dropped) FROM envelopes.prune_expired()",
                &[],
            )
            .expect("prune must not fail");
        dropped += row.get::<_, i64>(0);
        thread::sleep(Duration::from_millis(20));
    }
    stop.store(true, Ordering::Relaxed);
    let mut kept = 0;
    for w in writers {
        let (errors, k) = w.join().unwrap();
        assert!(errors.is_empty(), "writer errors: {errors:?}");
        kept += k;
    }
    pruner
        .query("SELECT * FROM envelopes.prune_expired()", &[])
        .unwrap();
    assert_eq!(
        db.int8("SELECT count(*) FROM envelopes.gateway_envelopes_meta WHERE expiry IS NOT NULL"),
        0
    );
    assert_eq!(
        db.int8("SELECT count(*) FROM envelopes.gateway_envelopes_meta"),
        kept
    );
    assert_eq!(
        db.int8("SELECT count(*) FROM envelopes.orphaned_envelopes()"),
        0
    );
    assert!(
        dropped > 0,
        "the test never dropped a band; it does not exercise the race"
    );
}

/// `gateway_envelopes_view` under parallel query: its lookup runs in parallel
/// workers (whose partition cache is always cold) and in a leader in parallel
/// mode (whose cache another session's new band has just emptied), and must load
/// the bands there as anywhere else, returning what the join returns.
#[test]
fn the_view_reads_under_parallel_query() {
    let db = TestDb::new("view_parallel");
    let mut setup = db.connect();
    setup
        .batch_execute(
            "SELECT envelopes.insert_gateway_envelopes(array_agg(70 + i % 3), array_agg(i::bigint),
                        array_agg('\\x74'::bytea), array_agg(pg_catalog.convert_to(i::text, 'UTF8')))
               FROM generate_series(1, 30000) i;
             ANALYZE envelopes.gateway_envelopes_meta;",
        )
        .unwrap();
    let join = "SELECT count(*), sum(length(b.originator_envelope))::bigint
                  FROM envelopes.gateway_envelopes_meta m
                  JOIN envelopes.gateway_envelopes_blob b USING (originator_node_id, originator_sequence_id)
                 WHERE m.originator_sequence_id % 7 = 3";
    let view = "SELECT count(*), sum(length(originator_envelope))::bigint
                  FROM envelopes.gateway_envelopes_view WHERE originator_sequence_id % 7 = 3";
    let direct = "SELECT count(envelopes.envelope_of(originator_node_id, originator_sequence_id)),
                         sum(length(envelopes.envelope_of(originator_node_id, originator_sequence_id)))::bigint
                    FROM envelopes.gateway_envelopes_meta WHERE originator_sequence_id % 7 = 3";
    let parallel = "SET parallel_setup_cost = 0; SET parallel_tuple_cost = 0;
                    SET min_parallel_table_scan_size = 0; SET max_parallel_workers_per_gather = 2;";
    let pair = |c: &mut postgres::Client, sql: &str| -> (i64, i64) {
        let r = c
            .query_one(sql, &[])
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        (r.get(0), r.get(1))
    };
    let expected = pair(&mut setup, join);
    let force = pg_envelopes_tests::force_parallel_setting(&mut setup);
    assert_eq!(expected.0, 30000 / 7 + 1);
    for (label, settings, new_band) in [
        ("parallel plans", parallel.to_owned(), 5_000_005i64),
        (
            "force_parallel_mode",
            format!("{parallel} SET {force} = on;"),
            6_000_004,
        ),
    ] {
        assert_eq!(new_band % 7, 3);
        // A fresh session (cold cache in leader and workers).
        let mut c = db.connect();
        c.batch_execute(&settings).unwrap();
        assert_eq!(pair(&mut c, view), expected, "{label}: view, cold");
        assert_eq!(pair(&mut c, direct), expected, "{label}: envelope_of, cold");
        // Warm, then another session adds a band to an originator read here.
        assert_eq!(pair(&mut c, view), expected, "{label}: view, warm");
        setup
            .execute(
                "SELECT envelopes.insert_gateway_envelope(71, $1, '\\x74', '\\x70')",
                &[&new_band],
            )
            .unwrap();
        let with_new = (expected.0 + 1, expected.1 + 1);
        assert_eq!(
            pair(&mut c, view),
            with_new,
            "{label}: view after a new band"
        );
        assert_eq!(
            pair(&mut c, direct),
            with_new,
            "{label}: envelope_of after a new band"
        );
        setup
            .execute(
                "DELETE FROM envelopes.gateway_envelopes_meta WHERE originator_sequence_id = $1",
                &[&new_band],
            )
            .unwrap();
    }
}

/// A session that has read by topic remembers each band's topic index; when
/// another session rebuilds that index (REINDEX CONCURRENTLY: a new index, the
/// old one retired and dropped), the first session's topic reads still return
/// every row, the ones written after the rebuild too.
#[test]
fn topic_reads_follow_a_rebuilt_topic_index() {
    let db = TestDb::new("topicindex");
    let mut reader = db.connect();
    let mut admin = db.connect();
    for seq in 1..=40 {
        insert(&mut admin, 5, seq);
    }
    fn topic_count(c: &mut impl postgres::GenericClient) -> i64 {
        c.query_one(
            "SELECT count(*) FROM envelopes.select_gateway_envelopes(
                 topics => ARRAY['\\x01'::bytea], originator_node_ids => '{5}')",
            &[],
        )
        .unwrap()
        .get(0)
    }
    assert_eq!(topic_count(&mut reader), 40);
    let index: String = admin
        .query_one(
            "SELECT i.indexrelid::regclass::text
               FROM pg_catalog.pg_index i
               JOIN pg_catalog.pg_inherits h ON h.inhrelid = i.indrelid
               JOIN pg_catalog.pg_inherits o ON o.inhrelid = h.inhparent
              WHERE o.inhparent = 'envelopes.gateway_envelopes_meta'::regclass
                AND pg_catalog.pg_get_indexdef(i.indexrelid) LIKE '%(topic, originator_sequence_id)'",
            &[],
        )
        .unwrap()
        .get(0);
    admin
        .batch_execute(&format!("REINDEX INDEX CONCURRENTLY {index}"))
        .unwrap();
    for seq in 41..=50 {
        insert(&mut admin, 5, seq);
    }
    assert_eq!(topic_count(&mut reader), 50, "after REINDEX CONCURRENTLY");
    // A second rebuild while the reader stands in a transaction that has read
    // through the index: its next statement reads through the new one.
    let mut tx = reader.transaction().unwrap();
    assert_eq!(topic_count(&mut tx), 50);
    tx.commit().unwrap();
    admin
        .batch_execute(&format!("REINDEX INDEX CONCURRENTLY {index}"))
        .unwrap();
    for seq in 51..=60 {
        insert(&mut admin, 5, seq);
    }
    assert_eq!(
        topic_count(&mut reader),
        60,
        "after a second REINDEX CONCURRENTLY"
    );
}
