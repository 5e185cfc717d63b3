//! The outbox doorbell and consumer reads, observed from real sessions.

use pg_envelopes_tests::TestDb;
use postgres::fallible_iterator::FallibleIterator;
use postgres::Client;
use std::time::Duration;

/// Every notification that arrives on `client` within `wait`.
fn drain(client: &mut Client, wait: Duration) -> Vec<(String, String)> {
    let mut notes = Vec::new();
    let mut all = client.notifications();
    let mut it = all.timeout_iter(wait);
    while let Some(n) = it.next().expect("notifications") {
        notes.push((n.channel().to_owned(), n.payload().to_owned()));
    }
    notes
}

fn listener(db: &TestDb, channel: &str) -> Client {
    let mut c = db.connect();
    c.batch_execute(&format!("LISTEN {channel}")).unwrap();
    c
}

#[test]
fn one_notification_per_transaction_whatever_it_writes() {
    let db = TestDb::new("notify_once");
    let mut listen = listener(&db, "envelopes");
    let mut writer = db.connect();
    writer
        .batch_execute("SET envelopes.notify_interval = 0")
        .unwrap();
    let mut tx = writer.transaction().unwrap();
    for seq in 1..=100i64 {
        tx.query_one(
            "SELECT envelopes.insert_gateway_envelope(1, $1, '\\x01', '\\x02')",
            &[&seq],
        )
        .unwrap();
    }
    tx.query_one(
        "SELECT envelopes.insert_gateway_envelopes(ARRAY[2, 2], ARRAY[1, 2]::bigint[],
             ARRAY['\\x01', '\\x01']::bytea[], ARRAY['\\x01', '\\x01']::bytea[])",
        &[],
    )
    .unwrap();
    for _ in 0..3 {
        tx.query_one("SELECT envelopes.publish('orders.created', '\\x01')", &[])
            .unwrap();
    }
    tx.commit().unwrap();
    let notes = drain(&mut listen, Duration::from_millis(700));
    assert_eq!(notes.len(), 1, "{notes:?}");
    let (channel, payload) = &notes[0];
    assert_eq!(channel, "envelopes");
    assert!(
        payload.contains("\"changed\":[\"envelopes\",\"outbox\"]"),
        "{payload}"
    );
    assert!(payload.len() < 100, "{payload}");

    // A second transaction gets its own single notification.
    writer
        .query_one("SELECT envelopes.publish('orders.created', '\\x01')", &[])
        .unwrap();
    let notes = drain(&mut listen, Duration::from_millis(500));
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(notes[0].1.contains("\"changed\":[\"outbox\"]"));
}

#[test]
fn no_notification_for_a_rolled_back_transaction() {
    let db = TestDb::new("notify_rollback");
    let mut listen = listener(&db, "envelopes");
    let mut writer = db.connect();
    let mut tx = writer.transaction().unwrap();
    tx.query_one(
        "SELECT envelopes.insert_gateway_envelope(1, 1, '\\x01', '\\x02')",
        &[],
    )
    .unwrap();
    tx.query_one("SELECT envelopes.publish('s', '\\x01')", &[])
        .unwrap();
    tx.rollback().unwrap();
    assert_eq!(drain(&mut listen, Duration::from_millis(500)), vec![]);
}

#[test]
fn a_megabyte_envelope_still_sends_a_few_bytes() {
    let db = TestDb::new("notify_size");
    let mut listen = listener(&db, "envelopes");
    let blob = vec![0xa5u8; 1024 * 1024];
    db.connect()
        .query_one(
            "SELECT envelopes.insert_gateway_envelope(1, 1, '\\x01', $1)",
            &[&blob],
        )
        .unwrap();
    let notes = drain(&mut listen, Duration::from_millis(500));
    assert_eq!(notes.len(), 1);
    assert!(
        notes[0].1.len() < 8000 && notes[0].1.len() < 100,
        "{} bytes",
        notes[0].1.len()
    );
}

#[test]
fn channel_and_switch_are_settings() {
    let db = TestDb::new("notify_settings");
    let mut default_channel = listener(&db, "envelopes");
    let mut custom = listener(&db, "ledger_events");
    let mut writer = db.connect();
    writer
        .batch_execute("SET envelopes.notify_channel = 'ledger_events'")
        .unwrap();
    writer
        .query_one("SELECT envelopes.publish('s', '\\x01')", &[])
        .unwrap();
    assert_eq!(drain(&mut custom, Duration::from_millis(500)).len(), 1);
    assert_eq!(
        drain(&mut default_channel, Duration::from_millis(100)).len(),
        0
    );

    writer.batch_execute("SET envelopes.notify = off").unwrap();
    writer
        .query_one("SELECT envelopes.publish('s', '\\x01')", &[])
        .unwrap();
    writer
        .query_one(
            "SELECT envelopes.insert_gateway_envelope(1, 1, '\\x01', '\\x02')",
            &[],
        )
        .unwrap();
    assert_eq!(drain(&mut custom, Duration::from_millis(500)).len(), 0);
}

/// A consumer reads while a lower-id outbox row is still uncommitted: the batch
/// stops before it, and once it commits the next batch returns it. Same for an
/// envelope with a lower sequence id.
#[test]
fn a_late_commit_is_never_skipped() {
    let db = TestDb::new("late_commit");
    let mut reader = db.connect();
    reader
        .query_one("SELECT envelopes.consumer_register('bridge')", &[])
        .unwrap();
    // The band exists up front, so neither writer creates a partition while the
    // other waits (creation is the subject of other tests).
    reader
        .execute("SELECT envelopes.ensure_gateway_parts(1, 1)", &[])
        .unwrap();
    let mut early = db.connect();
    let mut late = db.connect();

    let mut early_tx = early.transaction().unwrap();
    let first: i64 = early_tx
        .query_one("SELECT envelopes.publish('s', '\\x01')", &[])
        .unwrap()
        .get(0);
    early_tx
        .query_one(
            "SELECT envelopes.insert_gateway_envelope(1, 1, '\\x01', '\\x02')",
            &[],
        )
        .unwrap();
    let second: i64 = late
        .query_one("SELECT envelopes.publish('s', '\\x02')", &[])
        .unwrap()
        .get(0);
    late.query_one(
        "SELECT envelopes.insert_gateway_envelope(1, 2, '\\x01', '\\x02')",
        &[],
    )
    .unwrap();
    assert!(first < second);

    // The early transaction is open: neither stream may hand out what follows it.
    let batch = reader
        .query(
            "SELECT id FROM envelopes.consumer_outbox_batch('bridge')",
            &[],
        )
        .unwrap();
    assert!(
        batch.is_empty(),
        "outbox rows after an open transaction were returned"
    );
    let batch = reader
        .query(
            "SELECT originator_sequence_id FROM envelopes.consumer_envelope_batch('bridge')",
            &[],
        )
        .unwrap();
    assert!(
        batch.is_empty(),
        "envelope 2 was returned while 1 is uncommitted"
    );

    early_tx.commit().unwrap();
    // Once the early transaction has committed, both rows come at once (nothing
    // else that runs on the cluster holds them back), in order.
    let ids: Vec<i64> = reader
        .query(
            "SELECT id FROM envelopes.consumer_outbox_batch('bridge')",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let seqs: Vec<i64> = reader
        .query(
            "SELECT originator_sequence_id FROM envelopes.consumer_envelope_batch('bridge')",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(ids, vec![first, second]);
    assert_eq!(seqs, vec![1, 2]);

    // Acknowledge and the batches are empty; the delivery log and status agree.
    reader
        .query_one(
            "SELECT envelopes.consumer_outbox_ack('bridge', $1)",
            &[&second],
        )
        .unwrap();
    reader
        .query_one(
            "SELECT envelopes.consumer_envelope_ack('bridge', '{1}', '{2}')",
            &[],
        )
        .unwrap();
    assert!(reader
        .query(
            "SELECT 1 FROM envelopes.consumer_outbox_batch('bridge')",
            &[]
        )
        .unwrap()
        .is_empty());
    assert!(reader
        .query(
            "SELECT 1 FROM envelopes.consumer_envelope_batch('bridge')",
            &[]
        )
        .unwrap()
        .is_empty());
    let status = reader
        .query_one(
            "SELECT outbox_pending, envelopes_pending FROM envelopes.consumer_status WHERE consumer = 'bridge'",
            &[],
        )
        .unwrap();
    assert_eq!((status.get::<_, i64>(0), status.get::<_, i64>(1)), (0, 0));
    assert_eq!(
        db.int8("SELECT sum(rows)::bigint FROM envelopes.delivery_log WHERE consumer = 'bridge'"),
        4
    );
}

#[test]
fn status_shows_the_gap_until_acknowledged() {
    let db = TestDb::new("status");
    let mut c = db.connect();
    c.query_one("SELECT envelopes.consumer_register('b')", &[])
        .unwrap();
    c.query_one("SELECT envelopes.publish('s', '\\x01')", &[])
        .unwrap();
    c.query_one(
        "SELECT envelopes.insert_gateway_envelope(3, 9, '\\x01', '\\x02')",
        &[],
    )
    .unwrap();
    let row = c
        .query_one(
            "SELECT outbox_pending, envelopes_pending, outbox_oldest_pending_age IS NOT NULL,
                    notification_queue_usage >= 0
               FROM envelopes.consumer_status WHERE consumer = 'b'",
            &[],
        )
        .unwrap();
    assert_eq!(row.get::<_, i64>(0), 1);
    assert_eq!(row.get::<_, i64>(1), 1);
    assert!(row.get::<_, bool>(2));
    assert!(row.get::<_, bool>(3));
}

/// With a notify interval, a session's back-to-back commits ring once; a commit
/// after the interval rings again.
#[test]
fn a_busy_session_rings_once_per_interval() {
    let db = TestDb::new("notify_interval");
    let mut listen = listener(&db, "envelopes");
    let mut writer = db.connect();
    writer
        .batch_execute("SET envelopes.notify_interval = '2s'")
        .unwrap();
    for _ in 0..20 {
        writer
            .query_one("SELECT envelopes.publish('s', '\\x01')", &[])
            .unwrap();
    }
    assert_eq!(drain(&mut listen, Duration::from_millis(500)).len(), 1);
    std::thread::sleep(Duration::from_millis(1600));
    writer
        .query_one("SELECT envelopes.publish('s', '\\x01')", &[])
        .unwrap();
    assert_eq!(drain(&mut listen, Duration::from_millis(500)).len(), 1);
}
