//! Ingress and the identity of the stream it reads, against a private
//! nats-server: a JetStream stream deleted and re-created under the same name
//! numbers its messages from 1 again, and a position stored for the old stream
//! must not skip the new one's first messages (on 211056c the server clamped the
//! start past the new stream's end and `GREATEST` kept the old position: 5,000
//! of 8,000 never stored with ingress stopped during the re-create, 87 of 2,000
//! with it running). A purged stream's lost messages are logged and counted.

mod common;

use common::*;
use serde::Serialize;
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[derive(Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum Wire {
    Envelope {
        originator_node_id: i32,
        originator_sequence_id: i64,
        gateway_time_us: i64,
        #[serde(with = "serde_bytes")]
        topic: Vec<u8>,
        payer_id: Option<i32>,
        expiry: Option<i64>,
        #[serde(with = "serde_bytes")]
        originator_envelope: Vec<u8>,
    },
}

fn cbor(node: i32, seq: i64) -> Vec<u8> {
    let mut out = Vec::new();
    ciborium::into_writer(
        &Wire::Envelope {
            originator_node_id: node,
            originator_sequence_id: seq,
            gateway_time_us: 1_800_000_000_000_000,
            topic: vec![1],
            payer_id: None,
            expiry: None,
            originator_envelope: seq.to_be_bytes().to_vec(),
        },
        &mut out,
    )
    .unwrap();
    out
}

/// A private nats-server and one stream on it.
struct Bus {
    _server: Killed,
    url: String,
    stream: String,
    prefix: String,
    runtime: tokio::runtime::Runtime,
    js: async_nats::jetstream::Context,
    _store: PathBuf,
}

impl Bus {
    fn new() -> Bus {
        let port = free_port();
        let store = std::env::temp_dir().join(unique("natsid"));
        let server = start_nats(port, &store.join("js"), &[]);
        let url = format!("nats://127.0.0.1:{port}");
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let js = runtime.block_on(async {
            async_nats::jetstream::new(async_nats::connect(&url).await.unwrap())
        });
        let bus = Bus {
            _server: server,
            url,
            stream: unique("ID"),
            prefix: unique("id"),
            runtime,
            js,
            _store: store,
        };
        bus.create_stream();
        bus
    }

    fn create_stream(&self) {
        self.runtime.block_on(async {
            self.js
                .create_stream(async_nats::jetstream::stream::Config {
                    name: self.stream.clone(),
                    subjects: vec![format!("{}.>", self.prefix)],
                    ..Default::default()
                })
                .await
                .unwrap();
        });
    }

    fn delete_stream(&self) {
        self.runtime.block_on(async {
            self.js.delete_stream(&self.stream).await.unwrap();
        });
    }

    fn purge(&self) {
        self.runtime.block_on(async {
            self.js
                .get_stream(&self.stream)
                .await
                .unwrap()
                .purge()
                .await
                .unwrap();
        });
    }

    /// Publishes envelopes (node, from..=to), acknowledged by the stream; the
    /// publishes are pipelined, their acknowledgements awaited in order.
    fn publish(&self, node: i32, from: i64, to: i64) {
        self.runtime.block_on(async {
            let mut acks = Vec::new();
            for seq in from..=to {
                let ack = self
                    .js
                    .send_publish(
                        format!("{}.envelope.{node}", self.prefix),
                        async_nats::jetstream::message::PublishMessage::build()
                            .payload(cbor(node, seq).into())
                            .message_id(format!("{node}:{seq}")),
                    )
                    .await
                    .unwrap();
                acks.push(ack);
                if acks.len() >= 500 {
                    for a in acks.drain(..) {
                        a.await.unwrap();
                    }
                }
            }
            for a in acks {
                a.await.unwrap();
            }
        });
    }

    fn start(&self, db: &TestDb, name: &str, metrics: u16) -> Bridge {
        let log = std::env::temp_dir().join(format!("{}.log", unique("ingressid")));
        let addr = format!("127.0.0.1:{metrics}");
        let mut cmd = bridge_command(&[
            "ingress",
            "--database-url",
            &db.url(),
            "--name",
            name,
            "--source",
            &self.url,
            "--nats-stream",
            &self.stream,
            "--dead-letter-subject",
            &format!("{}-dlq", self.prefix),
            "--subject-prefix",
            &self.prefix,
            "--batch-size",
            "500",
            "--metrics-addr",
            &addr,
        ]);
        cmd.stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        Bridge {
            child: cmd.spawn().unwrap(),
            log,
        }
    }
}

fn stored(db: &TestDb, node: i32) -> BTreeSet<i64> {
    db.client()
        .query(
            "SELECT originator_sequence_id FROM envelopes.gateway_envelopes_meta
              WHERE originator_node_id = $1",
            &[&node],
        )
        .unwrap()
        .into_iter()
        .map(|r| r.get(0))
        .collect()
}

/// Waits up to `limit` for all of `1..=count` of `node` to be stored; returns
/// how many are missing then.
fn missing_after(db: &TestDb, node: i32, count: i64, limit: Duration) -> usize {
    let start = Instant::now();
    loop {
        let have = stored(db, node);
        let missing = (1..=count).filter(|s| !have.contains(s)).count();
        if missing == 0 || start.elapsed() > limit {
            return missing;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_stream_re_created_while_ingress_is_stopped_is_read_from_its_first_message() {
    let bus = Bus::new();
    let db = TestDb::new("streamid");
    let metrics = free_port();
    bus.publish(1, 1, 3000);
    let mut ingress = bus.start(&db, "sid", metrics);
    let missing = missing_after(&db, 1, 3000, Duration::from_secs(60));
    assert_eq!(missing, 0, "the first stream:\n{}", ingress.log_text());
    ingress.terminate();

    bus.delete_stream();
    bus.create_stream();
    bus.publish(2, 1, 8000);
    let metrics = free_port();
    let mut ingress = bus.start(&db, "sid", metrics);
    let missing = missing_after(&db, 2, 8000, Duration::from_secs(60));
    let text = try_scrape(metrics);
    let log = ingress.log_text();
    ingress.terminate();
    assert_eq!(
        missing, 0,
        "{missing} of 8000 messages of the re-created stream never stored:\n{log}"
    );
    assert_eq!(
        metric(&text, "envelopes_bridge_ingress_stream_resets_total"),
        1.0,
        "{text}"
    );
    assert!(
        log.contains("re-created"),
        "no WARN about the re-created stream:\n{log}"
    );
    // Started again, it stays on the new stream (no reset, nothing read twice
    // that counts).
    let metrics = free_port();
    let mut ingress = bus.start(&db, "sid", metrics);
    bus.publish(2, 8001, 8100);
    let missing = missing_after(&db, 2, 8100, Duration::from_secs(30));
    let text = try_scrape(metrics);
    ingress.terminate();
    assert_eq!(missing, 0);
    assert_eq!(
        metric(&text, "envelopes_bridge_ingress_stream_resets_total"),
        0.0,
        "{text}"
    );
    let position: i64 = db
        .client()
        .query_one(
            "SELECT position FROM envelopes.ingress_positions WHERE consumer = 'sid'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(position, 8100);
}

#[test]
fn a_stream_re_created_while_ingress_runs_loses_nothing() {
    let bus = Bus::new();
    let db = TestDb::new("streamidrun");
    let metrics = free_port();
    let mut ingress = bus.start(&db, "sidrun", metrics);
    bus.publish(1, 1, 1000);
    let missing = missing_after(&db, 1, 1000, Duration::from_secs(60));
    assert_eq!(missing, 0, "the first stream:\n{}", ingress.log_text());
    bus.delete_stream();
    bus.create_stream();
    // Fewer messages than the old position first, then more.
    bus.publish(2, 1, 300);
    std::thread::sleep(Duration::from_millis(700));
    bus.publish(2, 301, 2000);
    let missing = missing_after(&db, 2, 2000, Duration::from_secs(60));
    let log = ingress.log_text();
    ingress.terminate();
    assert_eq!(
        missing, 0,
        "{missing} of 2000 messages of the re-created stream never stored:\n{log}"
    );
}

#[test]
fn messages_purged_before_ingress_read_them_are_logged_and_counted() {
    let bus = Bus::new();
    let db = TestDb::new("streampurge");
    bus.publish(1, 1, 100);
    let metrics = free_port();
    let mut ingress = bus.start(&db, "purge", metrics);
    assert_eq!(missing_after(&db, 1, 100, Duration::from_secs(60)), 0);
    ingress.terminate();
    bus.publish(1, 101, 150); // never read: purged below
    bus.purge();
    bus.publish(2, 1, 100);
    let metrics = free_port();
    let mut ingress = bus.start(&db, "purge", metrics);
    let missing = missing_after(&db, 2, 100, Duration::from_secs(60));
    let text = try_scrape(metrics);
    let log = ingress.log_text();
    ingress.terminate();
    assert_eq!(missing, 0, "{log}");
    assert_eq!(
        metric(&text, "envelopes_bridge_ingress_gone_total"),
        50.0,
        "{text}"
    );
    assert!(log.contains("gone from the stream"), "{log}");
    assert_eq!(stored(&db, 1).len(), 100);
}

/// The same while ingress runs: it is paused (SIGSTOP) while messages are
/// published and purged, then resumed; its consumer jumps over the purged
/// sequence numbers, which are logged and counted.
#[test]
fn messages_purged_while_ingress_runs_are_logged_and_counted() {
    let bus = Bus::new();
    let db = TestDb::new("streampurgerun");
    let metrics = free_port();
    let mut ingress = bus.start(&db, "purgerun", metrics);
    bus.publish(1, 1, 100);
    assert_eq!(missing_after(&db, 1, 100, Duration::from_secs(60)), 0);
    let pid = ingress.child.id().to_string();
    let signal = |sig: &str| {
        assert!(std::process::Command::new("kill")
            .args([sig, &pid])
            .status()
            .unwrap()
            .success());
    };
    signal("-STOP");
    // Purged below before ingress reads them, except what a pull already in
    // flight when the process stopped brings (at most one batch, 500): more
    // than a batch, so some are always gone.
    bus.publish(1, 101, 1100);
    bus.purge();
    bus.publish(2, 1, 100);
    signal("-CONT");
    let missing = missing_after(&db, 2, 100, Duration::from_secs(60));
    std::thread::sleep(Duration::from_millis(500));
    let text = try_scrape(metrics);
    let log = ingress.log_text();
    ingress.terminate();
    assert_eq!(missing, 0, "{log}");
    // A pull in flight when the process stopped may have brought some of the
    // 1,000 before the purge: those are stored, the rest counted as gone.
    let read_before_purge = stored(&db, 1).len() as f64 - 100.0;
    let gone = metric(&text, "envelopes_bridge_ingress_gone_total");
    assert_eq!(gone + read_before_purge, 1000.0, "{text}\n{log}");
    assert!(gone >= 500.0, "{gone} counted as gone:\n{text}\n{log}");
    assert!(log.contains("gone from the stream"), "{log}");
}
