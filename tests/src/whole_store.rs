//! The whole state of a store in use, filled, read back and checked: what a
//! dump and restore (tests/tests/restore.rs) or a major upgrade with
//! `pg_upgrade` (tests/tests/pg_upgrade.rs) must give back, and what must work
//! on the result.

use crate::{drain_envelopes, envelope_ack, envelope_batch, Handed};
use postgres::Client;
use std::collections::BTreeSet;

/// Everything the store holds that a restore must give back, in a comparable form.
pub fn state(c: &mut Client) -> Vec<String> {
    let queries = [
        "SELECT 'view ' || count(*) || ' ' || COALESCE(md5(string_agg(
                originator_node_id || ':' || originator_sequence_id || ':' || encode(topic, 'hex') || ':' ||
                encode(originator_envelope, 'hex') || ':' || COALESCE(payer_id::text, '-') || ':' ||
                COALESCE(expiry::text, '-') || ':' || gateway_time::text,
                ',' ORDER BY originator_node_id, originator_sequence_id)), '')
           FROM envelopes.gateway_envelopes_view",
        "SELECT 'late rows ' || string_agg(originator_node_id || ':' || originator_sequence_id, ','
                ORDER BY originator_node_id, originator_sequence_id)
           FROM envelopes.gateway_envelopes_meta WHERE late",
        "SELECT 'band ' || originator_node_id || ' ' || band_start || ' ' || band_end
           FROM envelopes.partitions()",
        "SELECT 'indexes ' || c.relname || ' ' || count(*)
           FROM pg_catalog.pg_index i JOIN pg_catalog.pg_class c ON c.oid = i.indrelid
          WHERE c.relnamespace = 'envelopes'::regnamespace AND c.relname LIKE 'gateway_envelopes_%'
          GROUP BY c.relname",
        "SELECT 'outbox ' || id || ' ' || subject || ' ' || encode(payload, 'hex') FROM envelopes.outbox",
        "SELECT 'consumer ' || name || ' ' || outbox_id || ' ' || late_id || ' ' || COALESCE(owner::regrole::text, '-')
           FROM envelopes.consumers",
        "SELECT 'cursor ' || consumer || ' ' || originator_node_id || ' ' || sequence_id
           FROM envelopes.consumer_envelope_cursors",
        "SELECT 'late entry ' || id || ' ' || originator_node_id || ' ' || originator_sequence_id || ' ' ||
                COALESCE(last_sequence_id::text, '-')
           FROM envelopes.late_envelopes",
        "SELECT 'dead letter ' || id || ' ' || consumer || ' ' || kind || ' ' || reason FROM envelopes.dead_letters",
        "SELECT 'ingress ' || consumer || ' ' || stream || ' ' || position || ' ' || COALESCE(owner::regrole::text, '-') FROM envelopes.ingress_positions",
        "SELECT 'pruned ' || originator_node_id || ' ' || originator_sequence_id FROM envelopes.pruned_maxima",
        "SELECT 'orphans ' || count(*) FROM envelopes.orphaned_envelopes()",
    ];
    let mut out = Vec::new();
    for q in queries {
        for row in c.query(q, &[]).unwrap_or_else(|e| panic!("{q}: {e}")) {
            if let Some(s) = row.get::<_, Option<String>>(0) {
                out.push(s);
            }
        }
    }
    out.sort();
    out
}

pub fn keys(handed: &[Handed]) -> BTreeSet<(i32, i64)> {
    handed.iter().map(|h| (h.node, h.seq)).collect()
}

pub fn outbox_drain(c: &mut Client, consumer: &str) -> Vec<i64> {
    let mut all = Vec::new();
    loop {
        let ids: Vec<i64> = c
            .query(
                "SELECT id FROM envelopes.consumer_outbox_batch($1)",
                &[&consumer],
            )
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        let Some(&last) = ids.last() else {
            return all;
        };
        c.execute(
            "SELECT envelopes.consumer_outbox_ack($1, $2)",
            &[&consumer, &last],
        )
        .unwrap();
        all.extend(ids);
    }
}

/// A store in use: three originators over several bands, late rows, a consumer
/// part way through both feeds, undelivered outbox rows, a dead letter, ingress
/// positions.
pub fn fill(c: &mut Client) {
    c.batch_execute(
        "SET envelopes.band_width = 1000;
         SELECT envelopes.insert_gateway_envelope(n, s, pg_catalog.int4send(n % 3), pg_catalog.int8send(s),
                                                 payer_id => n, expiry => CASE WHEN s % 7 = 0 THEN 4000000000 END)
           FROM generate_series(1, 3) n, generate_series(1, 3000, 3) s;
         SELECT envelopes.consumer_register('bridge');
         SELECT envelopes.publish('orders.created', pg_catalog.int4send(i)) FROM generate_series(1, 5) i;",
    )
    .unwrap();
    // Part way: one batch of envelopes acknowledged, two outbox rows.
    let batch = envelope_batch(c, "bridge", 400).unwrap();
    envelope_ack(c, "bridge", &batch).unwrap();
    c.execute("SELECT envelopes.consumer_outbox_ack('bridge', 2)", &[])
        .unwrap();
    // Late rows: below what the consumer and the store have passed.
    c.batch_execute(
        "SELECT envelopes.insert_gateway_envelope(1, s, '\\x09', '\\x09') FROM generate_series(2, 300, 3) s;
         SELECT envelopes.insert_gateway_envelopes(ARRAY[2, 2], ARRAY[5, 8]::bigint[],
                ARRAY['\\x09', '\\x09']::bytea[], ARRAY['\\x0a', '\\x0b']::bytea[]);
         SELECT envelopes.consumer_dead_letter('bridge', 'envelope', 3, 4, NULL, 'too big', 'size', 3);
         SELECT envelopes.ingress_store_position('importer', 'ORDERS', 42);
         SELECT envelopes.ingress_store_position('other', 'EVENTS', 7);
         SELECT envelopes.publish('orders.paid', '\\x01');",
    )
    .unwrap();
}

/// Checks a store that `source` was copied into: the same state; the consumer
/// `bridge` resumes with `expected_next` and `expected_outbox`, a new consumer gets
/// every row once, and writes afterwards (an existing band, a new band, a new
/// originator, a late row, duplicates, an outbox row) work and reach the feed.
pub fn check_restored(
    what: &str,
    source: &mut Client,
    expected_state: &[String],
    expected_next: &BTreeSet<(i32, i64)>,
    expected_outbox: &[i64],
    target: &mut Client,
) {
    assert_eq!(state(target), expected_state, "{what}: restored state");
    let next = drain_envelopes(target, "bridge");
    assert_eq!(keys(&next), *expected_next, "{what}: the consumer resumes");
    assert_eq!(next.len(), expected_next.len(), "{what}: nothing twice");
    assert_eq!(
        outbox_drain(target, "bridge"),
        expected_outbox,
        "{what}: outbox"
    );

    target
        .execute("SELECT envelopes.consumer_register('after')", &[])
        .unwrap();
    let all = drain_envelopes(target, "after");
    let total: i64 = target
        .query_one("SELECT count(*) FROM envelopes.gateway_envelopes_meta", &[])
        .unwrap()
        .get(0);
    assert_eq!(
        all.len() as i64,
        total,
        "{what}: a new consumer gets every row once"
    );
    assert_eq!(keys(&all).len() as i64, total, "{what}: no row twice");

    // Writes after the restore: an existing band, a new band, a new originator,
    // a late row, a duplicate, an outbox row.
    let insert = |c: &mut Client, node: i32, seq: i64| -> i64 {
        c.query_one(
            "SELECT envelopes.insert_gateway_envelope($1, $2, '\\x01', '\\x02')",
            &[&node, &seq],
        )
        .unwrap_or_else(|e| panic!("{what}: insert ({node}, {seq}): {e}"))
        .get(0)
    };
    assert_eq!(insert(target, 1, 3_001), 1, "{what}: existing band");
    assert_eq!(insert(target, 1, 50_000), 1, "{what}: new band");
    assert_eq!(insert(target, 9, 1), 1, "{what}: new originator");
    assert_eq!(insert(target, 2, 11), 1, "{what}: late");
    assert_eq!(insert(target, 2, 11), 0, "{what}: duplicate");
    assert_eq!(
        insert(target, 3, 4),
        0,
        "{what}: duplicate of a restored row"
    );
    target
        .execute("SELECT envelopes.publish('after.restore', '\\x01')", &[])
        .unwrap_or_else(|e| panic!("{what}: publish: {e}"));
    let written = drain_envelopes(target, "after");
    assert_eq!(
        keys(&written),
        BTreeSet::from([(1, 3_001), (1, 50_000), (9, 1), (2, 11)]),
        "{what}: rows written after the restore"
    );
    assert!(
        written
            .iter()
            .any(|h| h.node == 2 && h.seq == 11 && h.late_id.is_some()),
        "{what}: the late row came from the late feed"
    );
    let _ = source;
}
