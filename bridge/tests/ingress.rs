//! End-to-end tests of `envelopes-bridge ingress` against real NATS JetStream.

mod common;

use common::*;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

/// The wire format egress writes and ingress reads, restated here on purpose: the
/// test fails if the bridge's format drifts from it.
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
    cbor_with_topic(node, seq, vec![1])
}

fn cbor_with_topic(node: i32, seq: i64, topic: Vec<u8>) -> Vec<u8> {
    let mut out = Vec::new();
    ciborium::into_writer(
        &Wire::Envelope {
            originator_node_id: node,
            originator_sequence_id: seq,
            gateway_time_us: 1_800_000_000_000_000,
            topic,
            payer_id: None,
            expiry: None,
            originator_envelope: seq.to_be_bytes().to_vec(),
        },
        &mut out,
    )
    .unwrap();
    out
}

struct Setup {
    stream: String,
    prefix: String,
    dead_letters: String,
    runtime: tokio::runtime::Runtime,
    js: async_nats::jetstream::Context,
}

impl Setup {
    fn new() -> Setup {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let stream = unique("IN");
        let prefix = unique("in");
        let dead_letters = unique("dlq");
        let js = runtime.block_on(async {
            let js = async_nats::jetstream::new(async_nats::connect(nats_url()).await.unwrap());
            for (name, subjects) in [
                (&stream, format!("{prefix}.>")),
                (&format!("{stream}DLQ"), dead_letters.clone()),
            ] {
                js.create_stream(async_nats::jetstream::stream::Config {
                    name: name.clone(),
                    subjects: vec![subjects],
                    ..Default::default()
                })
                .await
                .unwrap();
            }
            js
        });
        Setup {
            stream,
            prefix,
            dead_letters,
            runtime,
            js,
        }
    }

    /// Publishes and returns the stream sequence JetStream assigned.
    fn publish(&self, node: i32, payload: Vec<u8>, id: &str) -> u64 {
        self.runtime.block_on(async {
            let ack = self
                .js
                .send_publish(
                    format!("{}.envelope.{node}", self.prefix),
                    async_nats::jetstream::message::PublishMessage::build()
                        .payload(payload.into())
                        .message_id(id),
                )
                .await
                .unwrap()
                .await
                .unwrap();
            ack.sequence
        })
    }

    fn start(&self, db: &TestDb, name: &str, env: &[(&str, &str)]) -> Bridge {
        let log = std::env::temp_dir().join(format!("{}.log", unique("ingress")));
        let mut cmd = bridge_command(&[
            "ingress",
            "--database-url",
            &db.url(),
            "--name",
            name,
            "--source",
            &nats_url(),
            "--nats-stream",
            &self.stream,
            "--dead-letter-subject",
            &self.dead_letters,
            "--batch-size",
            "25",
        ]);
        cmd.stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        for (k, v) in env {
            cmd.env(k, v);
        }
        Bridge {
            child: cmd.spawn().unwrap(),
            log,
        }
    }

    /// Headers of every dead letter: (Envelopes-Error, Envelopes-Sqlstate).
    fn dead_letter_headers(&self) -> Vec<(String, Option<String>)> {
        let name = format!("{}DLQ", self.stream);
        let url = nats_url();
        self.runtime.block_on(async {
            let all = read_stream_messages(&url, &name).await;
            all.into_iter()
                .map(|m| {
                    (
                        m.headers
                            .get("Envelopes-Error")
                            .cloned()
                            .unwrap_or_default(),
                        m.headers.get("Envelopes-Sqlstate").cloned(),
                    )
                })
                .collect()
        })
    }

    fn dead_lettered(&self) -> usize {
        self.runtime.block_on(async {
            let mut s = self
                .js
                .get_stream(format!("{}DLQ", self.stream))
                .await
                .unwrap();
            s.info().await.unwrap().state.messages as usize
        })
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        let (js, a, b) = (
            self.js.clone(),
            self.stream.clone(),
            format!("{}DLQ", self.stream),
        );
        self.runtime.block_on(async move {
            let _ = js.delete_stream(a).await;
            let _ = js.delete_stream(b).await;
        });
    }
}

/// Stream sequence -> the (node, seq) published there, or None for a malformed one.
type Published = Arc<Mutex<BTreeMap<u64, Option<(i32, i64)>>>>;

fn position(db: &TestDb, name: &str) -> i64 {
    db.client()
        .query_one("SELECT COALESCE(max(position), 0) FROM envelopes.ingress_positions WHERE consumer = $1", &[&name])
        .unwrap()
        .get(0)
}

fn stored(db: &TestDb) -> BTreeSet<(i32, i64)> {
    db.client()
        .query("SELECT originator_node_id, originator_sequence_id FROM envelopes.gateway_envelopes_meta", &[])
        .unwrap()
        .into_iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

/// Ingress is killed with SIGKILL at random moments and at the hooks just before
/// and just after its commit, while messages keep arriving (some malformed).
/// Afterwards every good message is stored exactly once, the malformed ones are in
/// the dead-letter stream, and at every moment sampled the stored position only
/// covered messages that were stored.
#[test]
fn kill_9_while_messages_flow_stores_each_exactly_once() {
    let setup = Arc::new(Setup::new());
    let db = TestDb::new("ingress_kill");
    let published: Published = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let producer = {
        let (setup, published, stop) = (setup.clone(), published.clone(), stop.clone());
        thread::spawn(move || {
            let mut seq = 0i64;
            while !stop.load(Ordering::Relaxed) || seq < 400 {
                seq += 1;
                let node = 1 + (seq % 3) as i32;
                if seq % 37 == 0 {
                    let s = setup.publish(node, b"\xff not cbor".to_vec(), &format!("bad{seq}"));
                    published.lock().unwrap().insert(s, None);
                } else {
                    let s = setup.publish(node, cbor(node, seq), &format!("{node}:{seq}"));
                    published.lock().unwrap().insert(s, Some((node, seq)));
                }
                if seq % 20 == 0 {
                    thread::sleep(Duration::from_millis(10));
                }
            }
        })
    };
    let violations: Arc<Mutex<Vec<String>>> = Arc::default();
    let sampler = {
        let (published, stop, violations) = (published.clone(), stop.clone(), violations.clone());
        let conninfo = db.conninfo();
        thread::spawn(move || {
            let mut c = postgres::Client::connect(&conninfo, postgres::NoTls).unwrap();
            while !stop.load(Ordering::Relaxed) {
                let p: i64 = c
                    .query_one(
                        "SELECT COALESCE(max(position), 0) FROM envelopes.ingress_positions",
                        &[],
                    )
                    .unwrap()
                    .get(0);
                let rows: BTreeSet<(i32, i64)> = c
                    .query("SELECT originator_node_id, originator_sequence_id FROM envelopes.gateway_envelopes_meta", &[])
                    .unwrap()
                    .into_iter()
                    .map(|r| (r.get(0), r.get(1)))
                    .collect();
                let published = published.lock().unwrap();
                for (_, key) in published.range(..=p as u64) {
                    if let Some(key) = key {
                        if !rows.contains(key) {
                            violations
                                .lock()
                                .unwrap()
                                .push(format!("position {p} covers unstored {key:?}"));
                        }
                    }
                }
                drop(published);
                thread::sleep(Duration::from_millis(30));
            }
        })
    };
    let hooks = ["before_commit:2", "after_commit:2", "after_commit:1"];
    for round in 0..10 {
        let hook = hooks.get(round % 5).copied();
        let env: Vec<(&str, &str)> = hook
            .map(|h| vec![("ENVELOPES_BRIDGE_CRASH", h)])
            .unwrap_or_default();
        let mut bridge = setup.start(&db, "ingest", &env);
        if hook.is_some() {
            let start = std::time::Instant::now();
            while start.elapsed() < Duration::from_secs(10)
                && bridge.child.try_wait().unwrap().is_none()
            {
                thread::sleep(Duration::from_millis(20));
            }
            bridge.kill9();
        } else {
            thread::sleep(Duration::from_millis(100 + fastrand::u64(0..600)));
            bridge.kill9();
        }
    }
    stop.store(true, Ordering::Relaxed);
    producer.join().unwrap();
    sampler.join().unwrap();

    let last = *published.lock().unwrap().keys().last().unwrap() as i64;
    let mut bridge = setup.start(&db, "ingest", &[]);
    wait_until(
        "ingress to reach the end of the stream",
        Duration::from_secs(60),
        || position(&db, "ingest") >= last,
    );
    bridge.terminate();

    let expected: BTreeSet<(i32, i64)> = published
        .lock()
        .unwrap()
        .values()
        .flatten()
        .copied()
        .collect();
    let bad = published
        .lock()
        .unwrap()
        .values()
        .filter(|v| v.is_none())
        .count();
    assert_eq!(
        stored(&db),
        expected,
        "stored rows differ from the good messages"
    );
    assert_eq!(
        db.int8("SELECT count(*) FROM envelopes.gateway_envelopes_blob"),
        expected.len() as i64
    );
    assert!(
        setup.dead_lettered() >= bad,
        "{} dead letters for {bad} malformed messages",
        setup.dead_lettered()
    );
    let v = violations.lock().unwrap().clone();
    assert!(v.is_empty(), "{v:?}");
    assert!(bridge.log_text().contains("ingress connected"));

    // A redelivery of everything stores nothing new.
    db.client()
        .execute("UPDATE envelopes.ingress_positions SET position = 0", &[])
        .unwrap();
    let before = db.int8("SELECT count(*) FROM envelopes.gateway_envelopes_meta");
    let mut bridge = setup.start(&db, "ingest", &[]);
    wait_until("the replay", Duration::from_secs(60), || {
        position(&db, "ingest") >= last
    });
    bridge.terminate();
    assert_eq!(
        db.int8("SELECT count(*) FROM envelopes.gateway_envelopes_meta"),
        before
    );
}

/// One message in a batch of 100 has a topic longer than the receiving database
/// accepts (SQLSTATE 22001 there), another has sequence id 0 (below the first
/// id the extension stores): 98 are stored, both are dead-lettered with the
/// reason (and the SQLSTATE for the database's refusal), the position moves past
/// them, and the ingress does not go round in circles.
#[test]
fn messages_that_cannot_be_stored_are_set_aside() {
    let setup = Setup::new();
    let db = TestDb::new("ingress_poison");
    db.client()
        .batch_execute(&format!(
            "ALTER DATABASE \"{}\" SET envelopes.max_topic_bytes = 16",
            db.name
        ))
        .unwrap();
    let mut last = 0;
    for seq in 1..=100i64 {
        let payload = match seq {
            40 => cbor_with_topic(1, seq, vec![7; 64]),
            70 => cbor(1, 0),
            _ => cbor(1, seq),
        };
        last = setup.publish(1, payload, &format!("1:{seq}"));
    }
    let mut bridge = setup.start(&db, "poison", &[]);
    wait_until("the batch to be stored", Duration::from_secs(60), || {
        position(&db, "poison") >= last as i64
    });
    thread::sleep(Duration::from_secs(1));
    bridge.terminate();
    let stored = stored(&db);
    assert_eq!(stored.len(), 98, "{stored:?}");
    assert!(!stored.contains(&(1, 40)) && !stored.contains(&(1, 70)));
    let mut headers = setup.dead_letter_headers();
    headers.sort();
    assert_eq!(headers.len(), 2, "{headers:?}");
    assert!(
        headers
            .iter()
            .any(|(why, code)| code.as_deref() == Some("22001") && why.contains("topic")),
        "{headers:?}"
    );
    assert!(
        headers
            .iter()
            .any(|(why, code)| code.is_none() && why.contains("at least 1")),
        "{headers:?}"
    );
    let log = bridge.log_text();
    assert!(
        !log.contains("reconnecting"),
        "the ingress retried in a loop: {log}"
    );
}
