//! The change feed over real sessions: every committed envelope and outbox row is
//! handed out to a consumer, whatever the commit order, the sequence ids, the
//! caller's isolation level, or what else runs.

use pg_envelopes_tests::{
    drain_envelopes, drain_envelopes_in, envelope_ack, envelope_batch, insert, outbox_batch_ids,
    sqlstate, Handed, TestDb,
};
use postgres::{Client, IsolationLevel};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

fn register(client: &mut Client, consumer: &str) {
    client
        .execute("SELECT envelopes.consumer_register($1)", &[&consumer])
        .expect("register");
}

fn keys(handed: &[Handed]) -> BTreeSet<(i32, i64)> {
    handed.iter().map(|h| (h.node, h.seq)).collect()
}

/// The reproduction from the issue, made deterministic: the batch's argument
/// sleeps, so the statement's snapshot is taken, then a lower id commits, then
/// the function body runs. Nothing may be skipped, in READ COMMITTED and in a
/// REPEATABLE READ transaction that took its snapshot before the commit.
#[test]
fn a_commit_landing_while_a_batch_starts_is_not_skipped() {
    for isolation in [
        IsolationLevel::ReadCommitted,
        IsolationLevel::RepeatableRead,
    ] {
        let db = TestDb::new("commit_during_read");
        let mut setup = db.connect();
        setup
            .execute("SELECT envelopes.ensure_gateway_parts(900, 1)", &[])
            .unwrap();
        register(&mut setup, "c");
        insert(&mut setup, 900, 1);

        let mut a = db.connect();
        let mut a_tx = a.transaction().unwrap();
        insert(&mut a_tx, 900, 2); // stays open
        insert(&mut db.connect(), 900, 3);

        let url = db.url();
        let reader = thread::spawn(move || {
            let mut c = Client::connect(&url, postgres::NoTls).unwrap();
            let mut tx = c
                .build_transaction()
                .isolation_level(isolation)
                .start()
                .unwrap();
            tx.query_one("SELECT 1", &[]).unwrap(); // the RR snapshot is taken here
            let rows = tx
                .query(
                    "SELECT originator_sequence_id, late_id
                       FROM envelopes.consumer_envelope_batch((SELECT 'c'::text FROM pg_sleep(2)), 100)",
                    &[],
                )
                .unwrap();
            let batch: Vec<Handed> = rows
                .iter()
                .map(|r| Handed {
                    node: 900,
                    seq: r.get(0),
                    late_id: r.get(1),
                })
                .collect();
            envelope_ack(&mut tx, "c", &batch).unwrap();
            tx.commit().unwrap();
            batch
        });
        thread::sleep(Duration::from_millis(700));
        a_tx.commit().unwrap();
        let first = reader.join().unwrap();

        // Whatever the first batch held, 2 is handed out before the feed is empty.
        let mut c = db.connect();
        let mut all = first.clone();
        all.extend(drain_envelopes(&mut c, "c"));
        assert_eq!(
            keys(&all),
            BTreeSet::from([(900, 1), (900, 2), (900, 3)]),
            "{isolation:?}: first batch {first:?}, all {all:?}"
        );
        assert_eq!(all.len(), 3, "{isolation:?}: duplicates in {all:?}");
        let pending: i64 = c
            .query_one(
                "SELECT envelopes_pending FROM envelopes.consumer_status WHERE consumer = 'c'",
                &[],
            )
            .unwrap()
            .get(0);
        assert_eq!(pending, 0);
    }
}

/// Originator 7's seq 50 fails and rolls back, 51..60 commit and are forwarded,
/// then the retried 50 commits: it is handed out (from the late feed), once, to
/// the consumer that had moved on and to one that starts from the beginning.
#[test]
fn a_late_arrival_is_handed_out() {
    let db = TestDb::new("late_arrival");
    let mut c = db.connect();
    register(&mut c, "forwarder");
    {
        let mut tx = c.transaction().unwrap();
        insert(&mut tx, 7, 50);
        tx.rollback().unwrap();
    }
    for seq in 51..=60 {
        insert(&mut c, 7, seq);
    }
    let first = drain_envelopes(&mut c, "forwarder");
    assert_eq!(keys(&first), (51..=60).map(|s| (7, s)).collect());
    assert!(first.iter().all(|h| h.late_id.is_none()));

    insert(&mut db.connect(), 7, 50); // the retry commits late
    let late = drain_envelopes(&mut c, "forwarder");
    assert_eq!(late.len(), 1, "{late:?}");
    assert_eq!((late[0].node, late[0].seq), (7, 50));
    assert!(late[0].late_id.is_some());
    assert!(drain_envelopes(&mut c, "forwarder").is_empty());

    register(&mut c, "newcomer");
    let all = drain_envelopes(&mut c, "newcomer");
    assert_eq!(keys(&all), (50..=60).map(|s| (7, s)).collect());
    assert_eq!(all.len(), 11, "{all:?}");

    // Replaying the late envelope changes nothing.
    assert_eq!(
        db.int8("SELECT envelopes.insert_gateway_envelope(7, 50, '\\x01', '\\x02')"),
        0
    );
    assert_eq!(db.int8("SELECT count(*) FROM envelopes.late_envelopes"), 1);
    assert!(drain_envelopes(&mut c, "forwarder").is_empty());
}

/// A batch insert whose rows fall partly below and partly above what another
/// transaction committed: only the rows below are late.
#[test]
fn a_batch_is_late_only_below_what_others_committed() {
    let db = TestDb::new("late_batch");
    let mut c = db.connect();
    register(&mut c, "f");
    insert(&mut c, 3, 10);
    assert_eq!(drain_envelopes(&mut c, "f").len(), 1);
    c.query_one(
        "SELECT envelopes.insert_gateway_envelopes(ARRAY[3,3,3,3], ARRAY[8,9,11,12]::bigint[],
             ARRAY['\\x01','\\x01','\\x01','\\x01']::bytea[], ARRAY['\\x02','\\x02','\\x02','\\x02']::bytea[])",
        &[],
    )
    .unwrap();
    assert_eq!(
        db.int8("SELECT count(*) FROM envelopes.gateway_envelopes_meta WHERE late"),
        2
    );
    let next = drain_envelopes(&mut c, "f");
    assert_eq!(
        keys(&next),
        BTreeSet::from([(3, 8), (3, 9), (3, 11), (3, 12)])
    );
    let late: BTreeSet<i64> = next
        .iter()
        .filter(|h| h.late_id.is_some())
        .map(|h| h.seq)
        .collect();
    assert_eq!(late, BTreeSet::from([8, 9]));
}

/// Several writers on shared originators, ids rising on the whole but some sent
/// again lower (replays from several gateways), some transactions rolled back,
/// some rows in savepoints rolled back; a consumer reading and acknowledging all
/// along. Every committed envelope is handed out exactly once (no crash here, so
/// no replay either).
#[test]
fn writers_on_shared_originators_with_ids_up_and_down_lose_nothing() {
    let db = TestDb::new("shared_writers");
    let mut setup = db.connect();
    register(&mut setup, "f");
    for node in 1..=3 {
        setup
            .execute("SELECT envelopes.ensure_gateway_parts($1, 1)", &[&node])
            .unwrap();
    }
    let committed = Arc::new(Mutex::new(BTreeSet::new()));
    let next_id = Arc::new(Mutex::new([0i64; 4]));
    let stop = Arc::new(AtomicBool::new(false));
    let deadline = Instant::now() + Duration::from_secs(12);

    let writers: Vec<_> = (0..4)
        .map(|w| {
            let url = db.url();
            let committed = committed.clone();
            let next_id = next_id.clone();
            thread::spawn(move || {
                let mut c = Client::connect(&url, postgres::NoTls).unwrap();
                let mut rng = fastrand::Rng::with_seed(w);
                while Instant::now() < deadline {
                    let mut tx = c.transaction().unwrap();
                    let mut mine = Vec::new();
                    for _ in 0..rng.usize(1..=4) {
                        let node = rng.i32(1..=3);
                        let seq = {
                            let mut ids = next_id.lock().unwrap();
                            if ids[node as usize] > 20 && rng.u8(..) < 40 {
                                // a replay or retry below what is out there
                                rng.i64(1..ids[node as usize])
                            } else {
                                ids[node as usize] += 1;
                                ids[node as usize]
                            }
                        };
                        if rng.u8(..) < 20 {
                            let mut sp = tx.transaction().unwrap();
                            insert(&mut sp, node, seq);
                            sp.rollback().unwrap();
                        } else {
                            let inserted: i64 = tx
                                .query_one(
                                    "SELECT envelopes.insert_gateway_envelope($1, $2, '\\x01', '\\x02')",
                                    &[&node, &seq],
                                )
                                .unwrap()
                                .get(0);
                            if inserted == 1 {
                                mine.push((node, seq));
                            }
                        }
                        if rng.bool() {
                            thread::sleep(Duration::from_millis(rng.u64(0..3)));
                        }
                    }
                    if rng.u8(..) < 25 {
                        tx.rollback().unwrap();
                    } else {
                        tx.commit().unwrap();
                        committed.lock().unwrap().extend(mine);
                    }
                }
            })
        })
        .collect();

    let reader = {
        let url = db.url();
        let stop = stop.clone();
        thread::spawn(move || {
            let mut c = Client::connect(&url, postgres::NoTls).unwrap();
            let mut handed = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                let batch = envelope_batch(&mut c, "f", 50).unwrap();
                if batch.is_empty() {
                    thread::sleep(Duration::from_millis(5));
                    continue;
                }
                envelope_ack(&mut c, "f", &batch).unwrap();
                handed.extend(batch);
            }
            handed.extend(drain_envelopes(&mut c, "f"));
            handed
        })
    };
    for w in writers {
        w.join().unwrap();
    }
    stop.store(true, Ordering::SeqCst);
    let handed = reader.join().unwrap();
    let committed = committed.lock().unwrap().clone();
    let got = keys(&handed);
    let lost: Vec<_> = committed.difference(&got).collect();
    let mut counts: BTreeMap<(i32, i64), usize> = BTreeMap::new();
    for h in &handed {
        *counts.entry((h.node, h.seq)).or_default() += 1;
    }
    let duplicated: Vec<_> = counts.iter().filter(|(_, &n)| n > 1).collect();
    assert!(
        committed.len() > 200,
        "too little traffic: {}",
        committed.len()
    );
    assert!(
        lost.is_empty(),
        "{} of {} committed envelopes never handed out, e.g. {:?}",
        lost.len(),
        committed.len(),
        &lost[..lost.len().min(20)]
    );
    assert!(duplicated.is_empty(), "handed out twice: {duplicated:?}");
    assert_eq!(
        got.len(),
        committed.len(),
        "handed out rows that never committed"
    );
    assert!(
        db.int8("SELECT count(*) FROM envelopes.late_envelopes") > 0,
        "the test never produced a late arrival"
    );
}

/// Transactions that never write to a feed hold nothing back: one in another
/// database that created a table, one in the same database writing elsewhere.
/// An outbox writer that is still open does hold back the ids after its own.
#[test]
fn only_writers_of_the_same_feed_hold_delivery_back() {
    let db = TestDb::new("unrelated");
    let other_db = TestDb::new("unrelated_other");
    let mut c = db.connect();
    register(&mut c, "f");
    c.batch_execute("CREATE TABLE public.elsewhere (x int)")
        .unwrap();

    let mut foreign = other_db.connect();
    let mut foreign_tx = foreign.transaction().unwrap();
    foreign_tx
        .batch_execute("CREATE TABLE public.x (); INSERT INTO public.x DEFAULT VALUES")
        .unwrap();
    let mut local = db.connect();
    let mut local_tx = local.transaction().unwrap();
    local_tx
        .batch_execute("INSERT INTO public.elsewhere VALUES (1)")
        .unwrap();

    insert(&mut c, 1, 1);
    let id: i64 = c
        .query_one("SELECT envelopes.publish('a.b', '\\x01')", &[])
        .unwrap()
        .get(0);
    // At once, not after the open transactions end.
    assert_eq!(
        keys(&drain_envelopes(&mut c, "f")),
        BTreeSet::from([(1, 1)])
    );
    let outbox: Vec<i64> = outbox_batch_ids(&mut c, "f");
    assert_eq!(outbox, vec![id]);
    c.query_one("SELECT envelopes.consumer_outbox_ack('f', $1)", &[&id])
        .unwrap();

    // An open outbox writer with a lower id holds back the rows after it.
    let mut writer = db.connect();
    let mut writer_tx = writer.transaction().unwrap();
    let low: i64 = writer_tx
        .query_one("SELECT envelopes.publish('a.b', '\\x02')", &[])
        .unwrap()
        .get(0);
    let high: i64 = c
        .query_one("SELECT envelopes.publish('a.b', '\\x03')", &[])
        .unwrap()
        .get(0);
    assert!(low < high);
    assert!(outbox_batch_ids(&mut c, "f").is_empty());
    writer_tx.commit().unwrap();
    let outbox: Vec<i64> = outbox_batch_ids(&mut c, "f");
    assert_eq!(outbox, vec![low, high]);
    foreign_tx.rollback().unwrap();
    local_tx.rollback().unwrap();
}

/// An outbox writer that has not drawn its id yet when the reader looks still
/// holds the reader back: its marker names the sequence's value from before.
#[test]
fn an_outbox_id_drawn_after_the_marker_is_covered() {
    let db = TestDb::new("outbox_marker");
    let mut c = db.connect();
    register(&mut c, "f");
    let mut w = db.connect();
    let mut tx = w.transaction().unwrap();
    let first: i64 = tx
        .query_one("SELECT envelopes.publish('s', '\\x01')", &[])
        .unwrap()
        .get(0);
    let later: i64 = c
        .query_one("SELECT envelopes.publish('s', '\\x02')", &[])
        .unwrap()
        .get(0);
    // The open transaction draws a second id, above the committed one.
    let second: i64 = tx
        .query_one("SELECT envelopes.publish('s', '\\x03')", &[])
        .unwrap()
        .get(0);
    assert!(first < later && later < second);
    assert!(outbox_batch_ids(&mut c, "f").is_empty());
    tx.commit().unwrap();
    let ids: Vec<i64> = outbox_batch_ids(&mut c, "f");
    assert_eq!(ids, vec![first, later, second]);
}

/// A consumer registered at the end while transactions are running still gets
/// their rows when they commit.
#[test]
fn registering_at_the_end_keeps_running_transactions_ahead() {
    let db = TestDb::new("register_end");
    let mut c = db.connect();
    insert(&mut c, 5, 1);
    c.execute("SELECT envelopes.publish('s', '\\x00')", &[])
        .unwrap();
    let mut w = db.connect();
    let mut tx = w.transaction().unwrap();
    insert(&mut tx, 5, 2);
    let id: i64 = tx
        .query_one("SELECT envelopes.publish('s', '\\x01')", &[])
        .unwrap()
        .get(0);
    c.execute("SELECT envelopes.consumer_register('late', false)", &[])
        .unwrap();
    // Committed before registration and not in flight: behind the consumer.
    assert!(drain_envelopes(&mut c, "late").is_empty());
    tx.commit().unwrap();
    assert_eq!(
        keys(&drain_envelopes(&mut c, "late")),
        BTreeSet::from([(5, 2)])
    );
    assert_eq!(outbox_batch_ids(&mut c, "late"), vec![id]);
}

/// `batch_bytes` bounds a batch by the bytes it carries, never below one row.
#[test]
fn batches_are_bounded_by_bytes() {
    let db = TestDb::new("batch_bytes");
    let mut c = db.connect();
    register(&mut c, "f");
    c.execute(
        "SELECT envelopes.insert_gateway_envelope(1, s, '\\x01', pg_catalog.decode(pg_catalog.repeat('ab', 999), 'hex'))
           FROM generate_series(1, 10) s",
        &[],
    )
    .unwrap();
    let count = |c: &mut Client, bytes: i64| -> i64 {
        c.query_one(
            "SELECT count(*) FROM envelopes.consumer_envelope_batch('f', 100, $1)",
            &[&bytes],
        )
        .unwrap()
        .get(0)
    };
    assert_eq!(count(&mut c, 2500), 2); // 1000 bytes a row
    assert_eq!(count(&mut c, 1), 1); // the first row always fits
    assert_eq!(count(&mut c, 1_000_000), 10);
    let err = c
        .query(
            "SELECT * FROM envelopes.consumer_envelope_batch('f', 100, 0)",
            &[],
        )
        .unwrap_err();
    assert_eq!(sqlstate(&err), "22023");
}

/// A consumer read by two sessions in turn (e.g. a bridge that reconnected):
/// each session's cached cursor follows the other's acknowledgements, and an
/// idle poll never hides a row that committed after it.
#[test]
fn cached_positions_follow_other_sessions_and_new_commits() {
    let db = TestDb::new("cache");
    let mut a = db.connect();
    let mut b = db.connect();
    register(&mut a, "f");
    insert(&mut a, 1, 1);
    insert(&mut a, 2, 1);
    assert_eq!(drain_envelopes(&mut a, "f").len(), 2);
    assert!(envelope_batch(&mut a, "f", 10).unwrap().is_empty()); // idle, cached
    insert(&mut b, 1, 2);
    assert_eq!(
        keys(&envelope_batch(&mut a, "f", 10).unwrap()),
        BTreeSet::from([(1, 2)])
    );
    // b reads and acknowledges it; a must not hand it out again, nor miss (2, 2).
    assert_eq!(drain_envelopes(&mut b, "f").len(), 1);
    insert(&mut b, 2, 2);
    assert_eq!(
        keys(&drain_envelopes(&mut a, "f")),
        BTreeSet::from([(2, 2)])
    );
    assert!(envelope_batch(&mut b, "f", 10).unwrap().is_empty());
    // A consumer dropped and registered again starts over, in every session.
    a.batch_execute("DELETE FROM envelopes.consumers WHERE name = 'f'")
        .unwrap();
    register(&mut a, "f");
    assert_eq!(drain_envelopes(&mut b, "f").len(), 4);
}

/// Rows written into the tables directly, not through the insert functions, take
/// no marker and are never flagged late: the documented limit. One below the
/// cursor is never handed out; one above it is, like any row.
#[test]
fn rows_written_around_the_functions_are_not_tracked() {
    let db = TestDb::new("direct");
    let mut c = db.connect();
    register(&mut c, "f");
    for seq in [2, 4, 6] {
        insert(&mut c, 1, seq);
    }
    assert_eq!(drain_envelopes(&mut c, "f").len(), 3);
    let direct = "INSERT INTO envelopes.gateway_envelopes_meta (originator_node_id, originator_sequence_id, topic)
                  VALUES (1, $1, '\\x01');
                  INSERT INTO envelopes.gateway_envelopes_blob VALUES (1, $1, '\\x02')";
    for seq in [5i64, 7] {
        let mut tx = c.transaction().unwrap();
        for statement in direct.split(';') {
            tx.execute(statement, &[&seq]).unwrap();
        }
        tx.commit().unwrap();
    }
    assert_eq!(
        keys(&drain_envelopes(&mut c, "f")),
        BTreeSet::from([(1, 7)])
    );
}

/// The window between the reader's marker listing and its row snapshot, held open
/// on purpose (`envelopes.test_gate_pause`): writer A starts inserting seq 5 and
/// writer B inserts and commits seq 10, both after the listing and before the
/// snapshot. The snapshot sees 10 but not 5, and A's lateness check ran before 10
/// committed. Handing out 10 here would lose 5 for good; the reader bounds what
/// it hands out by what had committed before the listing.
#[test]
fn commits_between_the_marker_listing_and_the_row_snapshot_are_held_back() {
    let db = TestDb::new("gate_window");
    let mut c = db.connect();
    register(&mut c, "f");
    c.execute("SELECT envelopes.ensure_gateway_parts(4, 1)", &[])
        .unwrap();
    insert(&mut c, 4, 1);
    assert_eq!(drain_envelopes(&mut c, "f").len(), 1);

    let url = db.url();
    let reader = thread::spawn(move || {
        let mut c = Client::connect(&url, postgres::NoTls).unwrap();
        c.batch_execute("SET envelopes.test_gate_pause = '1500ms'")
            .unwrap();
        let batch = envelope_batch(&mut c, "f", 100).unwrap();
        envelope_ack(&mut c, "f", &batch).unwrap();
        batch
    });
    thread::sleep(Duration::from_millis(500)); // the reader is inside the window
    let mut a = db.connect();
    let mut a_tx = a.transaction().unwrap();
    insert(&mut a_tx, 4, 5);
    insert(&mut db.connect(), 4, 10);
    let first = reader.join().unwrap();
    a_tx.commit().unwrap();

    let mut all = first.clone();
    all.extend(drain_envelopes(&mut c, "f"));
    assert_eq!(
        keys(&all),
        BTreeSet::from([(4, 5), (4, 10)]),
        "first batch {first:?}, all {all:?}"
    );
    assert!(
        !first.iter().any(|h| h.seq == 10),
        "10 was handed out from inside the window: {first:?}"
    );
}

/// A long run of late rows right after the cursor, with the in-order row after it
/// out of one read's reach: the late feed hands them all out once, and the
/// in-order read steps the cursor over them instead of reading them again and
/// again.
#[test]
fn a_long_run_of_late_rows_is_stepped_over() {
    let db = TestDb::new("late_run");
    let mut c = db.connect();
    register(&mut c, "f");
    insert(&mut c, 5, 20_000); // committed: everything below it arrives late
    c.execute(
        "SELECT envelopes.insert_gateway_envelopes(array_agg(5), array_agg(s::bigint),
             array_agg('\\x01'::bytea), array_agg('\\x02'::bytea))
           FROM generate_series(1, 10500) s",
        &[],
    )
    .unwrap();
    insert(&mut c, 5, 20_001);
    let all = drain_envelopes(&mut c, "f");
    let got = keys(&all);
    assert_eq!(got.len(), 10_502, "{} handed out", got.len());
    assert_eq!(all.len(), 10_502, "handed out twice");
    assert!(got.contains(&(5, 20_000)) && got.contains(&(5, 20_001)));
    assert_eq!(
        db.int8("SELECT sequence_id FROM envelopes.consumer_envelope_cursors WHERE consumer = 'f'"),
        20_001
    );
}

/// A run of late rows longer than one read steps over (35,000 against 10,000),
/// right after the cursor, with the in-order row behind it: no batch comes back
/// empty while a row is deliverable (a consumer reading until a batch is empty,
/// as the README says and the bridge does, gets everything). The first batches
/// are the late feed's; then the in-order read steps over the whole run in one
/// call, as many rounds as it takes, and hands out the row behind it.
#[test]
fn no_empty_batch_while_rows_are_pending() {
    let db = TestDb::new("late_run_long");
    let mut c = db.connect();
    register(&mut c, "f");
    insert(&mut c, 6, 100_000); // committed: everything below it arrives late
    c.execute(
        "SELECT envelopes.insert_gateway_envelopes(array_agg(6), array_agg(s::bigint),
             array_agg('\\x01'::bytea), array_agg('\\x02'::bytea))
           FROM generate_series(1, 35000) s",
        &[],
    )
    .unwrap();
    let mut all = Vec::new();
    loop {
        let pending: i64 = c
            .query_one(
                "SELECT pending FROM envelopes.consumer_envelopes_pending('f')",
                &[],
            )
            .unwrap()
            .get(0);
        let batch = envelope_batch(&mut c, "f", 1000).expect("envelope batch");
        if batch.is_empty() {
            assert_eq!(pending, 0, "an empty batch with {pending} rows pending");
            break;
        }
        envelope_ack(&mut c, "f", &batch).expect("envelope ack");
        all.extend(batch);
    }
    let got = keys(&all);
    assert_eq!(got.len(), 35_001, "{} handed out", got.len());
    assert_eq!(all.len(), 35_001, "handed out twice");
    assert!(got.contains(&(6, 100_000)));
    assert_eq!(
        db.int8("SELECT sequence_id FROM envelopes.consumer_envelope_cursors WHERE consumer = 'f'"),
        100_000
    );
}

/// The insert path's high-water marks live in the cluster's shared memory, but
/// every database has its own rows. Database B writes originator 7's rows 1..500
/// 200..500 around the functions (no mark raised; the marks must be rescanned after it);
/// database A then inserts originator 7's row 1, and its rescan sees only A's
/// rows. B's row 100 inserted afterwards lands below B's committed 500: it must
/// still be flagged late and reach B's consumer, which acknowledged 500.
#[test]
fn high_water_marks_of_one_database_vouch_for_no_other() {
    let a = TestDb::new("marks_a");
    let b = TestDb::new("marks_b");
    let mut ca = a.connect();
    let mut cb = b.connect();
    register(&mut cb, "f");
    cb.batch_execute(
        "SELECT envelopes.ensure_gateway_parts(7, 1);
         BEGIN;
         INSERT INTO envelopes.gateway_envelopes_meta (originator_node_id, originator_sequence_id, topic)
              SELECT 7, s, '\\x01' FROM generate_series(200, 500) s;
         INSERT INTO envelopes.gateway_envelopes_blob
              SELECT 7, s, '\\x02' FROM generate_series(200, 500) s;
         COMMIT;",
    )
    .unwrap();
    assert_eq!(drain_envelopes(&mut cb, "f").len(), 301);

    insert(&mut ca, 7, 1);
    insert(&mut cb, 7, 100);
    assert_eq!(
        b.int8(
            "SELECT count(*) FROM envelopes.gateway_envelopes_meta
              WHERE originator_node_id = 7 AND originator_sequence_id = 100 AND late"
        ),
        1,
        "B's row below its committed 500 was not flagged late"
    );
    let again = drain_envelopes(&mut cb, "f");
    assert_eq!(keys(&again), BTreeSet::from([(7, 100)]), "{again:?}");
}

/// Index scans of meta's leaves in the current transaction. An insert whose keys
/// are above its originator's high-water mark makes none; any other probes the
/// primary key for a conflict once per row, and the exact lateness check adds its
/// own.
fn meta_index_scans(client: &mut impl postgres::GenericClient) -> i64 {
    client
        .query_one(
            "SELECT COALESCE(sum(idx_scan), 0)::bigint FROM pg_catalog.pg_stat_xact_user_tables
              WHERE schemaname = 'envelopes' AND relname LIKE 'gateway\\_envelopes\\_meta\\_o%\\_s%'",
            &[],
        )
        .unwrap()
        .get(0)
}

/// Index scans of blob's leaves in the current transaction.
fn blob_index_scans(client: &mut impl postgres::GenericClient) -> i64 {
    client
        .query_one(
            "SELECT COALESCE(sum(idx_scan), 0)::bigint FROM pg_catalog.pg_stat_xact_user_tables
              WHERE schemaname = 'envelopes' AND relname LIKE 'gateway\\_envelopes\\_blob\\_o%\\_s%'",
            &[],
        )
        .unwrap()
        .get(0)
}

/// After `TRUNCATE` of the store, ids that start again from 1 are in order: the
/// insert path answers them from the high-water marks again (no index scan at
/// all: no lateness scan, and no conflict probe for keys above the marks), instead
/// of holding them to the marks of the rows that were truncated.
/// Before the truncation, rows below a committed one are late by the marks (the
/// committed mark of 1,000): after it, that mark is gone too, or 2..=50 would be
/// late.
#[test]
fn truncating_the_store_starts_the_high_water_marks_again() {
    let db = TestDb::new("marks_truncate");
    let mut c = db.connect();
    insert(&mut c, 3, 1_000);
    let mut tx = c.transaction().unwrap();
    insert(&mut tx, 3, 10);
    let before = meta_index_scans(&mut tx);
    insert(&mut tx, 3, 11);
    insert(&mut tx, 3, 12);
    let below = meta_index_scans(&mut tx) - before;
    assert_eq!(
        below, 2,
        "rows below a committed one are late by the marks alone: a conflict probe each, no scan"
    );
    let late: i64 = tx
        .query_one(
            "SELECT count(*) FROM envelopes.gateway_envelopes_meta WHERE late",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(late, 3, "10, 11 and 12 are below 1,000, which is committed");
    tx.rollback().unwrap();

    c.batch_execute("TRUNCATE envelopes.gateway_envelopes_meta, envelopes.gateway_envelopes_blob")
        .unwrap();
    let mut tx = c.transaction().unwrap();
    insert(&mut tx, 3, 1); // rescans the originator once
    let before = meta_index_scans(&mut tx);
    for seq in 2..=50 {
        insert(&mut tx, 3, seq);
    }
    assert_eq!(
        meta_index_scans(&mut tx) - before,
        0,
        "no lateness scan, and no conflict probe for keys above the marks"
    );
    tx.commit().unwrap();
    assert_eq!(
        db.int8("SELECT count(*) FROM envelopes.gateway_envelopes_meta WHERE late"),
        0
    );
}

/// A transaction writing meta around the functions in one database makes that
/// database's inserts take the exact check; it must not slow another database's
/// inserts (they are answered by their marks: one probe per row), neither while it
/// runs nor after it ends.
#[test]
fn direct_writers_slow_only_their_own_database() {
    let db = TestDb::new("marks_own");
    let other = TestDb::new("marks_own_other");
    let mut c = db.connect();
    let mut o = other.connect();
    o.execute("SELECT envelopes.ensure_gateway_parts(3, 1)", &[])
        .unwrap();
    insert(&mut c, 3, 1); // scans the originator once, the slot is ready

    let mut direct = o.transaction().unwrap();
    direct
        .batch_execute(
            "INSERT INTO envelopes.gateway_envelopes_meta (originator_node_id, originator_sequence_id, topic)
                  VALUES (3, 1, '\\x01');
             INSERT INTO envelopes.gateway_envelopes_blob VALUES (3, 1, '\\x02')",
        )
        .unwrap();
    let mut tx = c.transaction().unwrap();
    let before = meta_index_scans(&mut tx);
    for seq in 2..=20 {
        insert(&mut tx, 3, seq);
    }
    assert_eq!(
        meta_index_scans(&mut tx) - before,
        0,
        "another database's running direct writer made inserts here take the exact check"
    );
    tx.commit().unwrap();

    direct.commit().unwrap();
    let mut tx = c.transaction().unwrap();
    let before = meta_index_scans(&mut tx);
    for seq in 21..=40 {
        insert(&mut tx, 3, seq);
    }
    assert_eq!(
        meta_index_scans(&mut tx) - before,
        0,
        "another database's ended direct writer made the marks here unready"
    );
    tx.commit().unwrap();
}

/// A batch of `node` with sequence ids `lo..=hi`: how many rows were new.
fn insert_range(client: &mut impl postgres::GenericClient, node: i32, lo: i64, hi: i64) -> i64 {
    client
        .query_one(
            "SELECT envelopes.insert_gateway_envelopes(array_agg($1::int), array_agg(s),
                 array_agg('\\x01'::bytea), array_agg('\\x02'::bytea))
               FROM pg_catalog.generate_series($2::bigint, $3::bigint) s",
            &[&node, &lo, &hi],
        )
        .unwrap()
        .get(0)
}

/// Keys above every row the functions have written for an originator cannot
/// exist, so the insert skips its conflict probe for them. A row written around
/// the functions with the triggers off (so nothing counts it) can still sit on
/// such keys: the index insertion reports it, the attempt after it probes, and
/// the key is skipped: counted 0, stored once, no error.
#[test]
fn fresh_keys_skip_the_probe_and_still_meet_a_hidden_row() {
    let db = TestDb::new("marks_fresh");
    let mut c = db.connect();
    insert(&mut c, 5, 1); // scans the originator once: the slot is ready
    c.batch_execute(
        "SET session_replication_role = replica;
         INSERT INTO envelopes.gateway_envelopes_meta (originator_node_id, originator_sequence_id, topic)
              VALUES (5, 10, '\\x0a'), (5, 11, '\\x0a');
         INSERT INTO envelopes.gateway_envelopes_blob VALUES (5, 10, '\\xbeef'), (5, 11, '\\xbeef');
         RESET session_replication_role",
    )
    .unwrap();

    let mut tx = c.transaction().unwrap();
    let before = meta_index_scans(&mut tx);
    assert_eq!(
        insert_range(&mut tx, 5, 8, 13),
        4,
        "8, 9, 12 and 13 are new"
    );
    assert_eq!(
        meta_index_scans(&mut tx) - before,
        2,
        "only the two keys the index insertion found taken are probed"
    );
    let before = (meta_index_scans(&mut tx), blob_index_scans(&mut tx));
    assert_eq!(insert_range(&mut tx, 5, 14, 20), 7);
    assert_eq!(
        meta_index_scans(&mut tx) - before.0,
        0,
        "fresh keys are not probed"
    );
    assert_eq!(
        blob_index_scans(&mut tx) - before.1,
        1,
        "a fresh batch's blob keys are looked up by one range scan, not one probe each"
    );
    // This transaction's own rows raised the marks: the same keys again are probed
    // (and skipped), not inserted and killed; the exact lateness check scans too.
    let before = meta_index_scans(&mut tx);
    assert_eq!(insert_range(&mut tx, 5, 19, 20), 0);
    let probed = meta_index_scans(&mut tx) - before;
    assert!(probed >= 2, "{probed} scans for two keys seen before");
    tx.commit().unwrap();

    // A blob row without its meta row (written by hand) on a fresh key: the range
    // scan finds it, the key is probed, the blob row is kept and the envelope is
    // not counted as new.
    c.batch_execute("INSERT INTO envelopes.gateway_envelopes_blob VALUES (5, 30, '\\xbeef')")
        .unwrap();
    assert_eq!(insert_range(&mut c, 5, 25, 35), 10);

    assert_eq!(
        db.int8(
            "SELECT count(*) FROM envelopes.gateway_envelopes_meta WHERE originator_node_id = 5"
        ),
        25
    );
    assert_eq!(
        db.int8(
            "SELECT count(DISTINCT originator_sequence_id) FROM envelopes.gateway_envelopes_view
              WHERE originator_node_id = 5"
        ),
        25
    );
    assert_eq!(
        db.int8(
            "SELECT count(*) FROM envelopes.gateway_envelopes_blob
              WHERE originator_node_id = 5 AND originator_envelope = '\\xbeef'"
        ),
        3,
        "a hidden row's blob was replaced"
    );
}

/// Inserts a batch of originator `node`'s rows `seqs` in one statement.
fn insert_batch(client: &mut impl postgres::GenericClient, node: i32, seqs: &[i64]) -> i64 {
    let nodes = vec![node; seqs.len()];
    let topics = vec![b"t".to_vec(); seqs.len()];
    let envelopes: Vec<Vec<u8>> = seqs.iter().map(|s| s.to_be_bytes().to_vec()).collect();
    client
        .query_one(
            "SELECT envelopes.insert_gateway_envelopes($1, $2, $3, $4)",
            &[&nodes, &seqs, &topics, &envelopes],
        )
        .expect("insert batch")
        .get(0)
}

/// Asserts that `handed` holds every key of `expected` exactly once.
fn assert_once(handed: &[Handed], expected: &BTreeSet<(i32, i64)>, what: &str) {
    let mut seen = BTreeMap::new();
    for h in handed {
        *seen.entry((h.node, h.seq)).or_insert(0) += 1;
    }
    let twice: Vec<_> = seen.iter().filter(|(_, &n)| n > 1).collect();
    assert!(
        twice.is_empty(),
        "{what}: handed out more than once: {twice:?}"
    );
    let got: BTreeSet<(i32, i64)> = seen.keys().copied().collect();
    let missing: Vec<_> = expected.difference(&got).collect();
    let extra: Vec<_> = got.difference(expected).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "{what}: missing {missing:?}, not expected {extra:?}"
    );
}

/// A late batch is one entry of the late feed, however many rows it has; a
/// consumer reading it in batches smaller than the entry stops inside it and
/// goes on from there: every row once, in sequence order.
#[test]
fn a_late_batch_is_one_entry_and_small_batches_stop_inside_it() {
    let db = TestDb::new("late_range");
    let mut c = db.connect();
    register(&mut c, "small");
    insert(&mut c, 7, 1_000);
    let seqs: Vec<i64> = (1..=300).collect();
    assert_eq!(insert_batch(&mut c, 7, &seqs), 300);
    assert_eq!(
        db.int8("SELECT count(*) FROM envelopes.late_envelopes"),
        1,
        "300 late rows of one statement: one entry"
    );
    assert_eq!(
        db.int8(
            "SELECT count(*) FROM envelopes.late_envelopes
              WHERE originator_sequence_id = 1 AND last_sequence_id = 300"
        ),
        1
    );
    let handed = drain_envelopes_in(&mut c, "small", 7);
    let expected: BTreeSet<(i32, i64)> = (1..=300).chain([1_000]).map(|s| (7, s)).collect();
    assert_once(&handed, &expected, "batches of 7");
    let late: Vec<i64> = handed
        .iter()
        .filter(|h| h.late_id.is_some())
        .map(|h| h.seq)
        .collect();
    assert_eq!(late, (1..=300).collect::<Vec<_>>(), "in sequence order");
    let pending: i64 = c
        .query_one(
            "SELECT envelopes_pending FROM envelopes.consumer_status WHERE consumer = 'small'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(pending, 0);
    // A consumer registered afterwards from the start counts and reads them too.
    register(&mut c, "later");
    let pending: i64 = c
        .query_one(
            "SELECT envelopes_pending FROM envelopes.consumer_status WHERE consumer = 'later'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(pending, 301, "the late rows counted as rows, not entries");
    assert_once(
        &drain_envelopes_in(&mut c, "later", 1000),
        &expected,
        "one batch",
    );
}

/// Statements of one transaction, some inside savepoints that are released and
/// one inside a savepoint rolled back, write overlapping ranges of late rows:
/// every row that committed is handed out once, none of the rolled-back ones.
#[test]
fn savepoints_leave_no_row_in_two_entries() {
    let db = TestDb::new("late_savepoints");
    let mut c = db.connect();
    register(&mut c, "c");
    insert(&mut c, 8, 1_000);
    let mut tx = c.transaction().unwrap();
    insert_batch(&mut tx, 8, &(10..=20).collect::<Vec<_>>());
    tx.batch_execute("SAVEPOINT a").unwrap();
    insert_batch(&mut tx, 8, &(15..=30).collect::<Vec<_>>());
    tx.batch_execute("RELEASE SAVEPOINT a").unwrap();
    insert_batch(&mut tx, 8, &(5..=25).step_by(2).collect::<Vec<_>>());
    tx.batch_execute("SAVEPOINT b").unwrap();
    insert_batch(&mut tx, 8, &(40..=50).collect::<Vec<_>>());
    insert(&mut tx, 8, 60);
    tx.batch_execute("ROLLBACK TO SAVEPOINT b").unwrap();
    insert_batch(&mut tx, 8, &[45, 47, 4]);
    insert(&mut tx, 8, 46);
    tx.commit().unwrap();
    let expected: BTreeSet<(i32, i64)> = (10..=30)
        .chain((5..=25).step_by(2))
        .chain([45, 46, 47, 4, 1_000])
        .map(|s| (8, s))
        .collect();
    let handed = drain_envelopes_in(&mut c, "c", 4);
    assert_once(&handed, &expected, "savepoints");
}

/// Two transactions write late rows of one originator whose ranges interleave:
/// each entry hands out its own transaction's rows only.
#[test]
fn overlapping_entries_of_two_transactions_hand_out_their_own_rows() {
    let db = TestDb::new("late_overlap");
    let mut c = db.connect();
    register(&mut c, "c");
    insert(&mut c, 9, 1_000);
    let mut a = db.connect();
    let mut b = db.connect();
    let mut ta = a.transaction().unwrap();
    let mut tb = b.transaction().unwrap();
    insert_batch(&mut ta, 9, &[10, 12, 14, 16]);
    insert_batch(&mut tb, 9, &[11, 13, 15, 17]);
    insert_batch(&mut ta, 9, &[20, 22]);
    tb.commit().unwrap();
    ta.commit().unwrap();
    assert_eq!(db.int8("SELECT count(*) FROM envelopes.late_envelopes"), 3);
    let expected: BTreeSet<(i32, i64)> = [10, 11, 12, 13, 14, 15, 16, 17, 20, 22, 1_000]
        .into_iter()
        .map(|s| (9, s))
        .collect();
    for size in [1, 3, 1000] {
        let name = format!("c{size}");
        register(&mut c, &name);
        assert_once(&drain_envelopes_in(&mut c, &name, size), &expected, &name);
    }
}

/// Writers inserting one originator's rows in random order, singly and in small
/// batches, some rolled back, while a consumer reads and acknowledges
/// concurrently: every committed row is handed out once.
#[test]
fn random_order_writers_and_a_concurrent_reader_hand_out_every_row_once() {
    let db = TestDb::new("late_random");
    let mut c = db.connect();
    register(&mut c, "c");
    c.execute("SELECT envelopes.ensure_gateway_parts(11, 1)", &[])
        .unwrap();
    let committed = Arc::new(Mutex::new(BTreeSet::new()));
    let done = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..4u64)
        .map(|w| {
            let url = db.url();
            let committed = committed.clone();
            thread::spawn(move || {
                let mut client = Client::connect(&url, postgres::NoTls).unwrap();
                // A fixed shuffle of this writer's ids (w, w + 4, w + 8, ...).
                let mut ids: Vec<i64> = (0..600).map(|i| (i * 4 + w as i64) + 1).collect();
                let mut state = 0x9E37_79B9_7F4A_7C15u64 ^ w;
                for i in (1..ids.len()).rev() {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    ids.swap(i, (state % (i as u64 + 1)) as usize);
                }
                let mut at = 0;
                let mut round = 0;
                while at < ids.len() {
                    round += 1;
                    let take = (round % 5 + 1).min(ids.len() - at);
                    let chunk: Vec<i64> = ids[at..at + take].to_vec();
                    at += take;
                    let mut tx = client.transaction().unwrap();
                    if take == 1 {
                        insert(&mut tx, 11, chunk[0]);
                    } else {
                        insert_batch(&mut tx, 11, &chunk);
                    }
                    if round % 7 == 0 {
                        tx.rollback().unwrap();
                    } else {
                        tx.commit().unwrap();
                        committed
                            .lock()
                            .unwrap()
                            .extend(chunk.iter().map(|&s| (11, s)));
                    }
                }
            })
        })
        .collect();
    let reader = {
        let url = db.url();
        let done = done.clone();
        thread::spawn(move || {
            let mut client = Client::connect(&url, postgres::NoTls).unwrap();
            let mut all = Vec::new();
            while !done.load(Ordering::SeqCst) {
                let batch = envelope_batch(&mut client, "c", 17).unwrap();
                envelope_ack(&mut client, "c", &batch).unwrap();
                all.extend(batch);
            }
            all.extend(drain_envelopes_in(&mut client, "c", 17));
            all
        })
    };
    for w in writers {
        w.join().unwrap();
    }
    done.store(true, Ordering::SeqCst);
    let handed = reader.join().unwrap();
    let expected = committed.lock().unwrap().clone();
    assert!(
        handed.iter().any(|h| h.late_id.is_some()),
        "some rows were late"
    );
    assert_once(&handed, &expected, "random order");
}

/// The late feed's ids stop at 2^39 - 1 (a position is an id times 2^24 plus an
/// offset into the entry's range): the last id works and is handed out; the next
/// late insert fails whole with 2200H, writing nothing.
#[test]
fn the_last_late_entry_id_works_and_the_next_fails_whole() {
    let db = TestDb::new("late_last_id");
    let mut c = db.connect();
    register(&mut c, "c");
    insert(&mut c, 12, 1_000);
    c.batch_execute("SELECT pg_catalog.setval('envelopes.late_envelopes_id_seq', 549755813886)")
        .unwrap();
    insert_batch(&mut c, 12, &[5, 6]);
    assert_eq!(
        db.int8("SELECT max(id) FROM envelopes.late_envelopes"),
        549_755_813_887
    );
    let handed = drain_envelopes_in(&mut c, "c", 1);
    let expected: BTreeSet<(i32, i64)> = [5, 6, 1_000].into_iter().map(|s| (12, s)).collect();
    assert_once(&handed, &expected, "last id");
    assert_eq!(
        handed.iter().filter_map(|h| h.late_id).max(),
        Some(i64::MAX),
        "the whole of the last entry is the highest position"
    );
    let err = c
        .query_one(
            "SELECT envelopes.insert_gateway_envelope(12, 7, '\\x01', '\\x02')",
            &[],
        )
        .unwrap_err();
    assert_eq!(sqlstate(&err), "2200H");
    assert_eq!(
        db.int8("SELECT count(*) FROM envelopes.gateway_envelopes_meta WHERE originator_sequence_id = 7"),
        0
    );
}

/// Late rows written through the SQL path (a trigger on meta keeps the direct
/// path away) and through the direct path in the same transaction, with ranges
/// that overlap, some keys already stored: every row once.
#[test]
fn late_rows_of_both_write_paths_in_one_transaction_are_handed_out_once() {
    let db = TestDb::new("late_paths");
    let mut c = db.connect();
    register(&mut c, "c");
    insert(&mut c, 13, 1_000);
    insert(&mut c, 13, 30); // stored and handed out before; late now
    c.batch_execute(
        "CREATE FUNCTION public.same() RETURNS trigger LANGUAGE plpgsql AS
             $$ BEGIN RETURN NEW; END $$",
    )
    .unwrap();
    let mut tx = c.transaction().unwrap();
    tx.batch_execute(
        "CREATE TRIGGER same BEFORE INSERT ON envelopes.gateway_envelopes_meta
             FOR EACH ROW EXECUTE FUNCTION public.same()",
    )
    .unwrap();
    insert_batch(&mut tx, 13, &[10, 20, 30, 40]); // SQL path, 30 is not new
    insert(&mut tx, 13, 25); // SQL path, inside the range above
    insert(&mut tx, 13, 5);
    tx.batch_execute("DROP TRIGGER same ON envelopes.gateway_envelopes_meta")
        .unwrap();
    insert_batch(&mut tx, 13, &[1, 15, 35, 45]); // direct path, overlapping
    insert(&mut tx, 13, 12); // direct path, inside
    tx.commit().unwrap();
    let expected: BTreeSet<(i32, i64)> = [1, 5, 10, 12, 15, 20, 25, 30, 35, 40, 45, 1_000]
        .into_iter()
        .map(|s| (13, s))
        .collect();
    assert_once(&drain_envelopes_in(&mut c, "c", 3), &expected, "both paths");
}

/// Rows of a late-feed entry pruned after a consumer read part of it do not
/// shift where it reads on: a position is an offset into the entry's range, not
/// a count of rows.
#[test]
fn pruning_inside_a_partly_read_entry_skips_nothing() {
    let db = TestDb::new("late_prune");
    let mut c = db.connect();
    register(&mut c, "c");
    insert(&mut c, 14, 1_000);
    c.batch_execute(
        "SELECT envelopes.insert_gateway_envelopes(
             array_fill(14, ARRAY[20]), ARRAY(SELECT g::bigint FROM generate_series(1, 20) g),
             array_fill('\\x01'::bytea, ARRAY[20]), array_fill('\\x02'::bytea, ARRAY[20]),
             expiries => ARRAY(SELECT CASE WHEN g BETWEEN 2 AND 4 THEN 1 END::bigint
                                 FROM generate_series(1, 20) g))",
    )
    .unwrap();
    let first = envelope_batch(&mut c, "c", 5).unwrap();
    assert_eq!(
        first.iter().map(|h| h.seq).collect::<Vec<_>>(),
        vec![1, 2, 3, 4, 5]
    );
    envelope_ack(&mut c, "c", &first).unwrap();
    c.batch_execute("SELECT * FROM envelopes.prune_expired()")
        .unwrap();
    assert_eq!(
        db.int8(
            "SELECT count(*) FROM envelopes.gateway_envelopes_meta WHERE originator_node_id = 14"
        ),
        18
    );
    let rest = drain_envelopes_in(&mut c, "c", 4);
    let expected: BTreeSet<(i32, i64)> = (6..=20).chain([1_000]).map(|s| (14, s)).collect();
    assert_once(&rest, &expected, "after pruning");
}

/// consumer_lag counts rows: gaps between ids, a rolled-back insert's ids and a
/// first id far above 1 count nothing, late rows count once (in the late feed,
/// not again in order), over many originators (most caught up, a few behind) and
/// after a partial acknowledgement; each time it equals the rows the consumer
/// then drains, and 0 once it has drained them.
#[test]
fn consumer_lag_counts_the_rows_it_will_hand_out() {
    let db = TestDb::new("lag_rows");
    let mut c = db.connect();
    register(&mut c, "lag");
    // 300 originators, one row each (100 new ones a call: the partitions a
    // call may create), and the consumer catches up with them.
    for first in [1, 101, 201] {
        c.execute(
            "SELECT envelopes.insert_gateway_envelopes(array_agg(g::int), array_agg(1::bigint),
                 array_agg('\\x01'::bytea), array_agg('\\x02'::bytea))
               FROM generate_series($1::int, $1::int + 99) g",
            &[&first],
        )
        .unwrap();
    }
    let lag = |c: &mut Client| -> i64 {
        c.query_one("SELECT envelopes.consumer_lag('lag')", &[])
            .unwrap()
            .get(0)
    };
    assert_eq!(lag(&mut c), 300);
    let drained = drain_envelopes(&mut c, "lag");
    assert_eq!(drained.len(), 300);
    assert_eq!(lag(&mut c), 0);
    // Gaps: every third id of originator 7 from 10 to 3,000; a first id of
    // 1,500,000 on 8; a rolled-back batch on 9; late rows below 7's highest.
    c.execute(
        "SELECT envelopes.insert_gateway_envelopes(array_agg(7), array_agg(s::bigint),
             array_agg('\\x01'::bytea), array_agg('\\x02'::bytea))
           FROM generate_series(10, 3000, 3) s",
        &[],
    )
    .unwrap();
    insert(&mut c, 8, 1_500_000);
    let mut t = c.transaction().unwrap();
    t.execute(
        "SELECT envelopes.insert_gateway_envelopes(array_agg(9), array_agg(s::bigint),
             array_agg('\\x01'::bytea), array_agg('\\x02'::bytea))
           FROM generate_series(2, 500) s",
        &[],
    )
    .unwrap();
    t.rollback().unwrap();
    c.execute(
        "SELECT envelopes.insert_gateway_envelopes(array_agg(7), array_agg(s::bigint),
             array_agg('\\x01'::bytea), array_agg('\\x02'::bytea))
           FROM generate_series(11, 200, 3) s",
        &[],
    )
    .unwrap();
    let gaps = (10..=3000).step_by(3).count() as i64;
    let late = (11..=200).step_by(3).count() as i64;
    let expected = gaps + 1 + late;
    assert_eq!(lag(&mut c), expected);
    // A partial acknowledgement: the lag is what is left.
    let batch = envelope_batch(&mut c, "lag", 250).expect("envelope batch");
    envelope_ack(&mut c, "lag", &batch).expect("envelope ack");
    let left = lag(&mut c);
    assert_eq!(left, expected - batch.len() as i64);
    let rest = drain_envelopes_in(&mut c, "lag", 100);
    assert_eq!(rest.len() as i64, left);
    assert_eq!(lag(&mut c), 0);
    // Outbox rows add to it.
    c.execute("SELECT envelopes.publish('s', '\\x01')", &[])
        .unwrap();
    assert_eq!(lag(&mut c), 1);
}
