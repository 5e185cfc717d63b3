//! Moving a store to another host by logical replication, as the docs' "Backup,
//! restore and moving hosts" describes it: publish the roots (through the root)
//! and the state tables, copy the publisher's bands ahead of the apply (dblink),
//! run the cut-over (writers stopped, caught up, the sequences' positions
//! copied, subscription dropped). Writers run through the functions on the
//! publisher all along, creating bands and originators; afterwards every row is
//! on the subscriber once, the consumer resumes where it stopped on the
//! publisher, a new consumer drains every row once, and every kind of write
//! works on the subscriber (late rows, outbox rows, new bands).
//!
//! The publisher is a database of `ENVELOPES_TEST_PG` (wal_level = logical), the
//! subscriber one of `ENVELOPES_TEST_PG_FRESH` (another cluster, its transaction
//! counter elsewhere).

use pg_envelopes_tests::{drain_envelopes, envelope_ack, envelope_batch, Handed, TestDb};
use postgres::{Client, NoTls};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The publication, on the publisher.
const PUBLISH: &str = "
CREATE PUBLICATION envelopes_move
    FOR TABLE envelopes.gateway_envelopes_meta, envelopes.gateway_envelopes_blob,
              envelopes.outbox, envelopes.late_envelopes, envelopes.consumers,
              envelopes.consumer_envelope_cursors, envelopes.dead_letters,
              envelopes.delivery_log, envelopes.ingress_positions,
              envelopes.pruned_maxima, envelopes.maintenance_runs
    WITH (publish_via_partition_root = true)";

/// On the subscriber: creates every band the publisher has and the subscriber
/// lacks ($1: the publisher's connection string). Run before the subscription
/// and then on a schedule (pg_cron), and once more at the cut-over.
const COPY_BANDS: &str = "
SELECT count(envelopes.ensure_gateway_parts(p.originator_node_id, GREATEST(p.band_start, 1),
                                            p.band_end - p.band_start)
             IS NULL)
  FROM public.dblink($1, 'SELECT originator_node_id, band_start, band_end FROM envelopes.partitions()')
       AS p(originator_node_id integer, band_start bigint, band_end bigint)
 WHERE NOT EXISTS (SELECT FROM envelopes.partitions() s
                    WHERE s.originator_node_id = p.originator_node_id
                      AND s.band_start = p.band_start)";

/// On the subscriber, at the cut-over (writers stopped): the positions of the
/// publisher's sequences, which logical replication does not carry.
const COPY_SEQUENCES: &str = "
SELECT count(pg_catalog.setval(pg_catalog.format('envelopes.%I', s.sequencename), s.last_value))
  FROM public.dblink($1, 'SELECT sequencename, last_value FROM pg_catalog.pg_sequences
                           WHERE schemaname = ''envelopes'' AND last_value IS NOT NULL')
       AS s(sequencename name, last_value bigint)";

fn keys(handed: &[Handed]) -> BTreeSet<(i32, i64)> {
    handed.iter().map(|h| (h.node, h.seq)).collect()
}

fn connect(conninfo: &str) -> Client {
    Client::connect(conninfo, NoTls).unwrap_or_else(|e| panic!("connect {conninfo}: {e}"))
}

#[test]
fn a_store_moves_by_logical_replication_with_writers_running() {
    let Ok(fresh) = std::env::var("ENVELOPES_TEST_PG_FRESH") else {
        panic!("ENVELOPES_TEST_PG_FRESH is not set: run through scripts/test.sh");
    };
    let publisher = TestDb::new("move_pub");
    let subscriber = TestDb::new_on(fresh, "move_sub");
    let pub_conninfo = format!("{} dbname={}", publisher.server, publisher.name);
    let mut p = publisher.connect();
    let mut s = subscriber.connect();
    s.batch_execute("CREATE EXTENSION dblink").unwrap();

    // A store in use before the move.
    p.batch_execute(
        "SET envelopes.band_width = 1000;
         SELECT envelopes.insert_gateway_envelope(n, s, '\\x01', pg_catalog.int8send(s))
           FROM generate_series(1, 3) n, generate_series(1, 2000, 2) s;
         SELECT envelopes.consumer_register('bridge');
         SELECT envelopes.publish('before', '\\x01') FROM generate_series(1, 3);
         SELECT envelopes.insert_gateway_envelope(1, 7, '\\x09', '\\x09');",
    )
    .unwrap();
    let first = envelope_batch(&mut p, "bridge", 500).unwrap();
    envelope_ack(&mut p, "bridge", &first).unwrap();

    s.query_one(COPY_BANDS, &[&pub_conninfo]).unwrap();
    p.batch_execute(PUBLISH).unwrap();
    s.batch_execute(&format!(
        "CREATE SUBSCRIPTION envelopes_move CONNECTION '{pub_conninfo}' PUBLICATION envelopes_move"
    ))
    .unwrap();

    // Writers through the functions on the publisher, into new bands and new
    // originators, some rows late; a consumer acknowledging there; the bands
    // copied to the subscriber every 200 ms.
    let stop = Arc::new(AtomicBool::new(false));
    let mut threads = Vec::new();
    for w in 0..2i32 {
        let url = publisher.url();
        let stop = stop.clone();
        threads.push(std::thread::spawn(move || {
            let mut c = connect(&url);
            c.batch_execute("SET envelopes.band_width = 1000").unwrap();
            let mut i = 0i64;
            while !stop.load(Ordering::SeqCst) {
                i += 1;
                let node = 1 + (i % 3) as i32 + if i % 50 == 0 { 10 + w } else { 0 };
                let seq = 2_000 + i * 4 + i64::from(w) * 2;
                c.query_one(
                    "SELECT envelopes.insert_gateway_envelope($1, $2, '\\x01', '\\x02')",
                    &[&node, &seq],
                )
                .unwrap();
                if i % 10 == 0 {
                    // Below what is committed: late.
                    c.query_one(
                        "SELECT envelopes.insert_gateway_envelope($1, $2, '\\x03', '\\x04')",
                        &[&node, &(seq - 999)],
                    )
                    .unwrap();
                    c.execute("SELECT envelopes.publish('during', '\\x01')", &[])
                        .unwrap();
                }
            }
        }));
    }
    {
        let url = publisher.url();
        let stop = stop.clone();
        threads.push(std::thread::spawn(move || {
            let mut c = connect(&url);
            while !stop.load(Ordering::SeqCst) {
                let batch = envelope_batch(&mut c, "bridge", 200).unwrap();
                envelope_ack(&mut c, "bridge", &batch).unwrap();
                std::thread::sleep(Duration::from_millis(50));
            }
        }));
    }
    let deadline = Instant::now() + Duration::from_secs(6);
    while Instant::now() < deadline {
        s.query_one(COPY_BANDS, &[&pub_conninfo]).unwrap();
        std::thread::sleep(Duration::from_millis(200));
    }

    // The cut-over: writers stopped; the subscriber caught up; sequences; done.
    stop.store(true, Ordering::SeqCst);
    for t in threads {
        t.join().unwrap();
    }
    let target: String = p
        .query_one("SELECT pg_catalog.pg_current_wal_lsn()::text", &[])
        .unwrap()
        .get(0);
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        s.query_one(COPY_BANDS, &[&pub_conninfo]).unwrap();
        let caught_up: bool = p
            .query_one(
                "SELECT COALESCE(bool_and(confirmed_flush_lsn >= $1::text::pg_lsn), false)
                   FROM pg_catalog.pg_replication_slots WHERE slot_name = 'envelopes_move'",
                &[&target],
            )
            .unwrap()
            .get(0);
        let copied: bool = s
            .query_one(
                "SELECT bool_and(srsubstate = 'r') FROM pg_catalog.pg_subscription_rel",
                &[],
            )
            .unwrap()
            .get::<_, Option<bool>>(0)
            .unwrap_or(false);
        if caught_up && copied {
            break;
        }
        assert!(Instant::now() < deadline, "the subscriber never caught up");
        std::thread::sleep(Duration::from_millis(200));
    }
    s.query_one(COPY_SEQUENCES, &[&pub_conninfo]).unwrap();
    s.batch_execute("DROP SUBSCRIPTION envelopes_move").unwrap();
    p.batch_execute("DROP PUBLICATION envelopes_move").unwrap();

    // Everything is there, once.
    let snapshot = |c: &mut Client| -> Vec<String> {
        c.query(
            "SELECT originator_node_id || ':' || originator_sequence_id || ':' || late || ':' ||
                    encode(originator_envelope, 'hex')
               FROM envelopes.gateway_envelopes_view v
               JOIN envelopes.gateway_envelopes_meta m USING (originator_node_id, originator_sequence_id)
              ORDER BY 1",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
    };
    let rows = snapshot(&mut p);
    assert_eq!(snapshot(&mut s), rows, "every row on the subscriber");
    for table in [
        "outbox",
        "late_envelopes",
        "consumer_envelope_cursors",
        "consumers",
    ] {
        let q = format!("SELECT count(*) FROM envelopes.{table}");
        let (a, b): (i64, i64) = (
            p.query_one(&q, &[]).unwrap().get(0),
            s.query_one(&q, &[]).unwrap().get(0),
        );
        assert_eq!(a, b, "{table}");
    }

    // The consumer resumes on the subscriber where it stopped on the publisher.
    let expected = drain_envelopes(&mut p, "bridge");
    let resumed = drain_envelopes(&mut s, "bridge");
    assert_eq!(keys(&resumed), keys(&expected), "the consumer resumes");
    assert_eq!(resumed.len(), expected.len(), "nothing twice");

    // A consumer from the start drains every row once, late ones included.
    s.execute("SELECT envelopes.consumer_register('after')", &[])
        .unwrap();
    let all = drain_envelopes(&mut s, "after");
    assert_eq!(all.len(), rows.len(), "a new consumer gets every row");
    assert_eq!(keys(&all).len(), rows.len(), "once each");

    // Writes on the subscriber after the cut-over.
    let insert = |c: &mut Client, node: i32, seq: i64| -> i64 {
        c.query_one(
            "SELECT envelopes.insert_gateway_envelope($1, $2, '\\x01', '\\x02')",
            &[&node, &seq],
        )
        .unwrap_or_else(|e| panic!("insert ({node}, {seq}) after the move: {e}"))
        .get(0)
    };
    assert_eq!(insert(&mut s, 1, 4), 1, "late");
    assert_eq!(insert(&mut s, 2, 5_000_000), 1, "new band");
    assert_eq!(insert(&mut s, 99, 1), 1, "new originator");
    assert_eq!(insert(&mut s, 1, 1), 0, "duplicate");
    s.execute("SELECT envelopes.publish('after', '\\x01')", &[])
        .unwrap_or_else(|e| panic!("publish after the move: {e}"));
    let written = drain_envelopes(&mut s, "after");
    assert_eq!(
        keys(&written),
        BTreeSet::from([(1, 4), (2, 5_000_000), (99, 1)])
    );
    let outbox_max: i64 = s
        .query_one("SELECT max(id) FROM envelopes.outbox", &[])
        .unwrap()
        .get(0);
    let outbox_rows = s
        .query(
            "SELECT id FROM envelopes.consumer_outbox_batch('after')",
            &[],
        )
        .unwrap();
    assert!(
        outbox_rows.iter().any(|r| r.get::<_, i64>(0) == outbox_max),
        "the outbox row published after the move is handed out"
    );
}
