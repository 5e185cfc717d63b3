//! Benchmark helper: loads envelopes in large batches for a fixed time and prints
//! the rows per second, so the extension's batch function can be compared with
//! `COPY` (which pgbench cannot drive) and with a plain idempotent
//! `INSERT ... SELECT FROM unnest(...)` into the same pre-created partitions.
//!
//! It is also the gateway-shaped client of the router comparison: every value a
//! bind parameter in binary form (as tokio-postgres and pgx send them), single
//! rows included, the same client straight into a shard and through the proxy.
//!
//! usage: bulk_load DATABASE_URL MODE CLIENTS SECONDS ROWS_PER_CALL
//!   MODE: extension | single | copy | insert_idempotent
//!   (single: one insert_gateway_envelope call per row, ROWS_PER_CALL 1)
//! Client i writes originator i + 1 from sequence id 1 upwards (the tables are
//! emptied before each run by bench/sql/reset.sql), one call per transaction;
//! the topic (32 bytes) and envelope (272 bytes) are those of the pgbench scripts.
//! Prints one line: rows per second over all clients.
//!
//! Environment: ENVELOPES_LOAD_NODES (comma-separated originators, client i takes
//! the i-th, cycling), ENVELOPES_LOAD_FIRST_SEQ (the first sequence id, default
//! 1), ENVELOPES_LOAD_CALLS (stop each client after this many calls, whatever
//! the time; for instruction counts), ENVELOPES_LOAD_SPREAD (extension mode:
//! spread each batch's rows over this many originators from the client's own
//! upwards, row i to originator + i % SPREAD; default 1).

use futures_util::SinkExt;
use std::time::{Duration, Instant};
use tokio_postgres::NoTls;

const TOPIC: [u8; 32] = [
    0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef, 0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef,
    0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef, 0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef,
];
const ENVELOPE: [u8; 272] = [0xa5; 272];

const EXTENSION: &str = "SELECT envelopes.insert_gateway_envelopes($1, $2, $3, $4)";
const SINGLE: &str = "SELECT envelopes.insert_gateway_envelope($1, $2, $3, $4)";
const INSERT_IDEMPOTENT: &str = "
WITH rows AS (
    SELECT * FROM ROWS FROM (pg_catalog.unnest($1::int[]), pg_catalog.unnest($2::bigint[]),
                             pg_catalog.unnest($3::bytea[]), pg_catalog.unnest($4::bytea[]))
        AS u(node, seq, topic, envelope)
), m AS (
    INSERT INTO envelopes.gateway_envelopes_meta (originator_node_id, originator_sequence_id, topic)
    SELECT node, seq, topic FROM rows
    ON CONFLICT DO NOTHING
    RETURNING originator_node_id, originator_sequence_id
)
INSERT INTO envelopes.gateway_envelopes_blob (originator_node_id, originator_sequence_id, originator_envelope)
SELECT m.originator_node_id, m.originator_sequence_id, rows.envelope
  FROM m JOIN rows ON rows.node = m.originator_node_id AND rows.seq = m.originator_sequence_id";

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

async fn client_loop(
    url: String,
    mode: String,
    node: i32,
    deadline: Instant,
    per_call: i64,
    first_seq: i64,
    max_calls: Option<u64>,
) -> i64 {
    let (client, connection) = tokio_postgres::connect(&url, NoTls).await.expect("connect");
    tokio::spawn(connection);
    let topic_hex = hex(&TOPIC);
    let envelope_hex = hex(&ENVELOPE);
    let prepared = match mode.as_str() {
        "extension" => Some(client.prepare(EXTENSION).await.expect("prepare")),
        "single" => Some(client.prepare(SINGLE).await.expect("prepare")),
        "insert_idempotent" => Some(client.prepare(INSERT_IDEMPOTENT).await.expect("prepare")),
        "copy" => None,
        other => panic!("unknown mode {other}"),
    };
    let topics = vec![TOPIC.to_vec(); per_call as usize];
    let envelopes = vec![ENVELOPE.to_vec(); per_call as usize];
    let spread: i32 = std::env::var("ENVELOPES_LOAD_SPREAD")
        .ok()
        .filter(|v| !v.is_empty())
        .map_or(1, |v| v.parse().expect("ENVELOPES_LOAD_SPREAD"));
    let nodes: Vec<i32> = (0..per_call as i32)
        .map(|i| node + i % spread.max(1))
        .collect();
    let mut next = first_seq;
    let mut rows = 0i64;
    let mut calls = 0u64;
    while Instant::now() < deadline && max_calls.is_none_or(|max| calls < max) {
        calls += 1;
        let seqs: Vec<i64> = (next..next + per_call).collect();
        next += per_call;
        match &prepared {
            Some(statement) if mode == "single" => {
                client
                    .execute(statement, &[&node, &seqs[0], &topics[0], &envelopes[0]])
                    .await
                    .expect("insert");
            }
            Some(statement) => {
                client
                    .execute(statement, &[&nodes, &seqs, &topics, &envelopes])
                    .await
                    .expect("insert");
            }
            None => {
                client.batch_execute("BEGIN").await.expect("begin");
                let mut meta = String::with_capacity(per_call as usize * 100);
                let mut blob = String::with_capacity(per_call as usize * 600);
                for seq in &seqs {
                    meta.push_str(&format!("{node}\t{seq}\t\\\\x{topic_hex}\n"));
                    blob.push_str(&format!("{node}\t{seq}\t\\\\x{envelope_hex}\n"));
                }
                for (sql, data) in [
                    (
                        "COPY envelopes.gateway_envelopes_meta (originator_node_id, originator_sequence_id, topic) FROM STDIN",
                        meta,
                    ),
                    (
                        "COPY envelopes.gateway_envelopes_blob (originator_node_id, originator_sequence_id, originator_envelope) FROM STDIN",
                        blob,
                    ),
                ] {
                    let sink = client.copy_in::<_, bytes::Bytes>(sql).await.expect("copy");
                    futures_util::pin_mut!(sink);
                    sink.send(bytes::Bytes::from(data.into_bytes())).await.expect("copy data");
                    sink.finish().await.expect("copy finish");
                }
                client.batch_execute("COMMIT").await.expect("commit");
            }
        }
        rows += per_call;
    }
    rows
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 6 {
        eprintln!("usage: bulk_load DATABASE_URL MODE CLIENTS SECONDS ROWS_PER_CALL");
        std::process::exit(2);
    }
    let clients: i32 = args[3].parse().expect("CLIENTS");
    let seconds: f64 = args[4].parse().expect("SECONDS");
    let per_call: i64 = args[5].parse().expect("ROWS_PER_CALL");
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let nodes: Vec<i32> = env("ENVELOPES_LOAD_NODES")
        .map(|v| {
            v.split(',')
                .map(|n| n.trim().parse().expect("ENVELOPES_LOAD_NODES"))
                .collect()
        })
        .unwrap_or_default();
    let first_seq: i64 =
        env("ENVELOPES_LOAD_FIRST_SEQ").map_or(1, |v| v.parse().expect("ENVELOPES_LOAD_FIRST_SEQ"));
    let max_calls: Option<u64> =
        env("ENVELOPES_LOAD_CALLS").map(|v| v.parse().expect("ENVELOPES_LOAD_CALLS"));
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(seconds);
    let tasks: Vec<_> = (0..clients)
        .map(|i| {
            tokio::spawn(client_loop(
                args[1].clone(),
                args[2].clone(),
                if nodes.is_empty() {
                    i + 1
                } else {
                    nodes[i as usize % nodes.len()]
                },
                deadline,
                per_call,
                first_seq,
                max_calls,
            ))
        })
        .collect();
    let mut rows = 0;
    for task in tasks {
        rows += task.await.expect("client task");
    }
    println!("{:.0}", rows as f64 / started.elapsed().as_secs_f64());
}
