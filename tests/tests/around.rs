//! Rows written around the insert functions never hide the rows written through
//! them. A row the functions did not write (into a band leaf, by `COPY`, in a
//! band attached by hand, with `session_replication_role = replica` as a restore
//! or logical replication's apply writes) raises none of the high-water marks the
//! insert path trusts to tell that a row is not late. A consumer that moved past
//! such a row must still receive every row inserted below it through the
//! functions afterwards: from the late feed.

use pg_envelopes_tests::{drain_envelopes, insert, Handed, TestDb};
use postgres::Client;
use std::collections::BTreeSet;
use std::io::Write;

fn keys(handed: &[Handed]) -> BTreeSet<(i32, i64)> {
    handed.iter().map(|h| (h.node, h.seq)).collect()
}

/// The band leaf of `table` ("meta" or "blob") that holds `seq` of `node`.
fn leaf(c: &mut Client, table: &str, node: i32, seq: i64) -> String {
    c.query_one(
        &format!(
            "SELECT {table}_partition::text FROM envelopes.partitions()
              WHERE originator_node_id = $1 AND band_start <= $2 AND band_end > $2"
        ),
        &[&node, &seq],
    )
    .expect("the band exists")
    .get(0)
}

/// One way of writing (node, seq) around the functions.
#[derive(Clone, Copy, Debug)]
enum Around {
    /// INSERT into the band leaves.
    LeafInsert,
    /// COPY into the band leaves.
    LeafCopy,
    /// A band made, filled and attached by hand.
    AttachFilled,
    /// INSERT into the roots with `session_replication_role = replica`.
    ReplicaRole,
    /// INSERT into the roots, the statement trigger firing: noticed before too.
    RootInsert,
}

fn write_around(c: &mut Client, how: Around, node: i32, seq: i64) {
    let values_meta = format!("({node}, {seq}, '\\x01')");
    let values_blob = format!("({node}, {seq}, '\\x02')");
    match how {
        Around::LeafInsert => {
            let (meta, blob) = (leaf(c, "meta", node, seq), leaf(c, "blob", node, seq));
            c.batch_execute(&format!(
                "BEGIN;
                 INSERT INTO {meta} (originator_node_id, originator_sequence_id, topic) VALUES {values_meta};
                 INSERT INTO {blob} VALUES {values_blob};
                 COMMIT"
            ))
            .unwrap();
        }
        Around::LeafCopy => {
            let (meta, blob) = (leaf(c, "meta", node, seq), leaf(c, "blob", node, seq));
            let mut tx = c.transaction().unwrap();
            let mut w = tx
                .copy_in(&format!(
                    "COPY {meta} (originator_node_id, originator_sequence_id, topic) FROM STDIN"
                ))
                .unwrap();
            writeln!(w, "{node}\t{seq}\t\\\\x01").unwrap();
            w.finish().unwrap();
            let mut w = tx.copy_in(&format!("COPY {blob} FROM STDIN")).unwrap();
            writeln!(w, "{node}\t{seq}\t\\\\x02").unwrap();
            w.finish().unwrap();
            tx.commit().unwrap();
        }
        Around::AttachFilled => {
            let start = seq - seq % 1_000_000;
            let end = start + 1_000_000;
            c.batch_execute(&format!(
                "BEGIN;
                 CREATE TABLE envelopes.hand_meta_{node}_{start} (LIKE envelopes.gateway_envelopes_meta INCLUDING DEFAULTS);
                 CREATE TABLE envelopes.hand_blob_{node}_{start} (LIKE envelopes.gateway_envelopes_blob INCLUDING DEFAULTS);
                 INSERT INTO envelopes.hand_meta_{node}_{start} (originator_node_id, originator_sequence_id, topic) VALUES {values_meta};
                 INSERT INTO envelopes.hand_blob_{node}_{start} VALUES {values_blob};
                 ALTER TABLE envelopes.gateway_envelopes_meta_o{node}
                     ATTACH PARTITION envelopes.hand_meta_{node}_{start} FOR VALUES FROM ({start}) TO ({end});
                 ALTER TABLE envelopes.gateway_envelopes_blob_o{node}
                     ATTACH PARTITION envelopes.hand_blob_{node}_{start} FOR VALUES FROM ({start}) TO ({end});
                 COMMIT"
            ))
            .unwrap();
        }
        Around::ReplicaRole => {
            c.batch_execute(&format!(
                "BEGIN;
                 SET LOCAL session_replication_role = replica;
                 INSERT INTO envelopes.gateway_envelopes_meta (originator_node_id, originator_sequence_id, topic) VALUES {values_meta};
                 INSERT INTO envelopes.gateway_envelopes_blob VALUES {values_blob};
                 COMMIT"
            ))
            .unwrap();
        }
        Around::RootInsert => {
            c.batch_execute(&format!(
                "BEGIN;
                 INSERT INTO envelopes.gateway_envelopes_meta (originator_node_id, originator_sequence_id, topic) VALUES {values_meta};
                 INSERT INTO envelopes.gateway_envelopes_blob VALUES {values_blob};
                 COMMIT"
            ))
            .unwrap();
        }
    }
}

/// Ids 1-10 through the functions, `high` written around them, consumers past it
/// (one draining from the start, one registered at the end), then 50 through the
/// functions: both receive it.
fn a_row_below_one_written_around_reaches_every_consumer(how: Around, high: i64) {
    let db = TestDb::new("around");
    let mut c = db.connect();
    c.execute("SELECT envelopes.consumer_register('running')", &[])
        .unwrap();
    for seq in 1..=10 {
        insert(&mut c, 1, seq);
    }
    assert_eq!(drain_envelopes(&mut c, "running").len(), 10);
    // The first batches made the marks of originator 1 ready at 10.
    for seq in 11..=12 {
        insert(&mut c, 1, seq);
    }
    assert_eq!(drain_envelopes(&mut c, "running").len(), 2);

    write_around(&mut c, how, 1, high);
    let passed = drain_envelopes(&mut c, "running");
    c.execute("SELECT envelopes.consumer_register('fresh')", &[])
        .unwrap();
    assert_eq!(drain_envelopes(&mut c, "fresh").len(), 13);
    c.execute(
        "SELECT envelopes.consumer_register('at_end', from_start => false)",
        &[],
    )
    .unwrap();

    let inserted: i64 = c
        .query_one(
            "SELECT envelopes.insert_gateway_envelope(1, 50, '\\x01', '\\x02')",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(inserted, 1);
    let mut running = passed;
    running.extend(drain_envelopes(&mut c, "running"));
    for (consumer, got) in [
        ("running", running),
        ("fresh", drain_envelopes(&mut c, "fresh")),
        ("at_end", drain_envelopes(&mut c, "at_end")),
    ] {
        assert!(
            keys(&got).contains(&(1, 50)),
            "{how:?}: consumer {consumer} never received 50 (got {got:?})"
        );
        let pending: i64 = c
            .query_one(
                "SELECT pending FROM envelopes.consumer_envelopes_pending($1)",
                &[&consumer],
            )
            .unwrap()
            .get(0);
        assert_eq!(pending, 0, "{how:?}: {consumer} has nothing left");
    }
    let late: bool = c
        .query_one(
            "SELECT late FROM envelopes.gateway_envelopes_meta
              WHERE originator_node_id = 1 AND originator_sequence_id = 50",
            &[],
        )
        .unwrap()
        .get(0);
    assert!(
        late,
        "{how:?}: 50 arrived below {high}, which was committed"
    );
}

#[test]
fn a_row_inserted_into_a_band_leaf_hides_nothing() {
    a_row_below_one_written_around_reaches_every_consumer(Around::LeafInsert, 100);
}

#[test]
fn a_row_copied_into_a_band_leaf_hides_nothing() {
    a_row_below_one_written_around_reaches_every_consumer(Around::LeafCopy, 100);
}

#[test]
fn a_filled_band_attached_by_hand_hides_nothing() {
    a_row_below_one_written_around_reaches_every_consumer(Around::AttachFilled, 2_000_005);
}

#[test]
fn a_row_written_with_triggers_off_hides_nothing() {
    a_row_below_one_written_around_reaches_every_consumer(Around::ReplicaRole, 100);
}

#[test]
fn a_row_written_into_the_root_hides_nothing() {
    a_row_below_one_written_around_reaches_every_consumer(Around::RootInsert, 100);
}

/// A client reading with `originator_ceilings()` is in the same place: a ceiling
/// at a row written around the functions means every row below it is committed
/// or late.
#[test]
fn a_ceiling_at_a_row_written_around_makes_later_rows_below_it_late() {
    let db = TestDb::new("around_ceiling");
    let mut c = db.connect();
    for seq in 1..=10 {
        insert(&mut c, 1, seq);
    }
    c.batch_execute("SELECT * FROM envelopes.originator_ceilings()")
        .unwrap();
    write_around(&mut c, Around::LeafInsert, 1, 100);
    let ceiling: i64 = c
        .query_one(
            "SELECT max_sequence_id FROM envelopes.originator_ceilings() WHERE originator_node_id = 1",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(ceiling, 100);
    insert(&mut c, 1, 50);
    assert_eq!(
        db.int8(
            "SELECT count(*) FROM envelopes.gateway_envelopes_meta
              WHERE originator_sequence_id = 50 AND late"
        ),
        1
    );
}

/// Writers through the functions and writers into the leaves racing on one
/// originator, the leaf writers always above, a consumer draining all along:
/// every row written through the functions reaches it.
#[test]
fn racing_leaf_writers_hide_no_row_of_the_functions() {
    let db = TestDb::new("around_race");
    let mut c = db.connect();
    c.execute("SELECT envelopes.consumer_register('f')", &[])
        .unwrap();
    insert(&mut c, 1, 1);
    let meta = leaf(&mut c, "meta", 1, 1);
    let blob = leaf(&mut c, "blob", 1, 1);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut writers = Vec::new();
    for w in 0..2i64 {
        let url = db.url();
        writers.push(std::thread::spawn(move || {
            let mut c = Client::connect(&url, postgres::NoTls).unwrap();
            let mut mine = Vec::new();
            for i in 0..300i64 {
                let seq = 2 + i * 2 + w; // 2..601, the two writers interleaved
                c.query_one(
                    "SELECT envelopes.insert_gateway_envelope(1, $1, '\\x01', '\\x02')",
                    &[&seq],
                )
                .unwrap();
                mine.push(seq);
            }
            mine
        }));
    }
    let around = {
        let url = db.url();
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut c = Client::connect(&url, postgres::NoTls).unwrap();
            let mut seq = 700_000i64;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                seq += 1;
                c.batch_execute(&format!(
                    "BEGIN;
                     INSERT INTO {meta} (originator_node_id, originator_sequence_id, topic) VALUES (1, {seq}, '\\x01');
                     INSERT INTO {blob} VALUES (1, {seq}, '\\x02');
                     COMMIT"
                ))
                .unwrap();
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
        })
    };
    let mut got = Vec::new();
    let mut functions = BTreeSet::from([1i64]);
    let mut finished = 0;
    let mut handles: Vec<_> = writers.into_iter().map(Some).collect();
    while finished < handles.len() {
        got.extend(drain_envelopes(&mut c, "f"));
        for h in handles.iter_mut() {
            if h.as_ref().is_some_and(|h| h.is_finished()) {
                functions.extend(h.take().unwrap().join().unwrap());
                finished += 1;
            }
        }
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    around.join().unwrap();
    got.extend(drain_envelopes(&mut c, "f"));
    let received = keys(&got);
    let missing: Vec<_> = functions
        .iter()
        .filter(|&&s| !received.contains(&(1, s)))
        .collect();
    assert!(
        missing.is_empty(),
        "rows of the functions never handed out: {missing:?}"
    );
}

/// The marks in shared memory describe one store: after `DROP EXTENSION` and
/// `CREATE EXTENSION`, in-order inserts into the new, empty store are not late.
#[test]
fn a_store_created_again_inherits_no_marks() {
    let db = TestDb::new("around_recreate");
    let mut c = db.connect();
    for seq in [1_000i64, 2_000] {
        insert(&mut c, 1, seq);
    }
    c.batch_execute("DROP EXTENSION pg_envelopes CASCADE; CREATE EXTENSION pg_envelopes")
        .unwrap();
    c.execute("SELECT envelopes.consumer_register('f')", &[])
        .unwrap();
    for seq in 1..=10 {
        insert(&mut c, 1, seq);
    }
    assert_eq!(
        db.int8("SELECT count(*) FROM envelopes.gateway_envelopes_meta WHERE late"),
        0
    );
    assert_eq!(db.int8("SELECT count(*) FROM envelopes.late_envelopes"), 0);
    assert_eq!(drain_envelopes(&mut c, "f").len(), 10);
}
