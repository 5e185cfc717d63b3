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
            "--subject-prefix",
            &self.prefix,
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

fn position_on(db: &TestDb, name: &str, stream: &str) -> i64 {
    db.int8(&format!(
        "SELECT envelopes.ingress_position('{name}', '{stream}')"
    ))
}

/// One ingress name used first for stream A, then for stream B: each stream keeps
/// its own position, so an ingress of B that dies part way resumes where B's
/// position stands, not at A's (which was larger and skipped B's messages).
#[test]
fn a_name_reused_for_another_stream_keeps_each_position() {
    let a = Setup::new();
    let b = Setup::new();
    let db = TestDb::new("ingress_streams");
    let mut last_a = 0;
    for seq in 1..=300i64 {
        last_a = a.publish(1, cbor(1, seq), &format!("1:{seq}"));
    }
    let mut bridge = a.start(&db, "reused", &[]);
    wait_until("stream A stored", Duration::from_secs(60), || {
        position_on(&db, "reused", &a.stream) >= last_a as i64
    });
    bridge.terminate();
    let mut last_b = 0;
    for seq in 1..=200i64 {
        last_b = b.publish(2, cbor(2, seq), &format!("2:{seq}"));
    }
    // Dies after its third stored batch of B, then starts again.
    let mut bridge = b.start(
        &db,
        "reused",
        &[("ENVELOPES_BRIDGE_CRASH", "after_commit:3")],
    );
    let _ = bridge.child.wait();
    let stored_b = position_on(&db, "reused", &b.stream);
    assert!(
        stored_b > 0 && stored_b < last_b as i64,
        "B stopped part way: {stored_b}"
    );
    assert_eq!(position_on(&db, "reused", &a.stream), last_a as i64);
    let mut bridge = b.start(&db, "reused", &[]);
    wait_until("stream B stored", Duration::from_secs(60), || {
        position_on(&db, "reused", &b.stream) >= last_b as i64
    });
    bridge.terminate();
    let rows = stored(&db);
    let missing: Vec<i64> = (1..=200).filter(|s| !rows.contains(&(2, *s))).collect();
    assert!(missing.is_empty(), "B's messages never stored: {missing:?}");
    assert_eq!(rows.iter().filter(|(n, _)| *n == 1).count(), 300);
}

/// Two ingress instances under one name on one stream, as a rolling deploy or two
/// replicas run them, while messages flow: one is killed every few hundred
/// milliseconds and started again, the other every few seconds. Only the one
/// holding the lease works (the other stands by), so at every moment sampled
/// the stored position covers only stored messages, and in the end every message
/// is stored once.
#[test]
fn two_instances_under_one_name_lose_nothing_while_they_keep_dying() {
    let setup = Arc::new(Setup::new());
    let db = TestDb::new("ingress_twins");
    let published: Published = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let producer = {
        let (setup, published, stop) = (setup.clone(), published.clone(), stop.clone());
        thread::spawn(move || {
            let mut seq = 0i64;
            while !stop.load(Ordering::Relaxed) || seq < 3000 {
                seq += 1;
                let node = 1 + (seq % 4) as i32;
                let s = setup.publish(node, cbor(node, seq), &format!("{node}:{seq}"));
                published.lock().unwrap().insert(s, Some((node, seq)));
                if seq % 50 == 0 {
                    thread::sleep(Duration::from_millis(20));
                }
            }
        })
    };
    let violations: Arc<Mutex<Vec<String>>> = Arc::default();
    let sampler = {
        let (published, stop, violations) = (published.clone(), stop.clone(), violations.clone());
        let (conninfo, stream) = (db.conninfo(), setup.stream.clone());
        thread::spawn(move || {
            let mut c = postgres::Client::connect(&conninfo, postgres::NoTls).unwrap();
            while !stop.load(Ordering::Relaxed) {
                let p: i64 = c
                    .query_one("SELECT envelopes.ingress_position('twin', $1)", &[&stream])
                    .unwrap()
                    .get(0);
                let rows: BTreeSet<(i32, i64)> = c
                    .query("SELECT originator_node_id, originator_sequence_id FROM envelopes.gateway_envelopes_meta", &[])
                    .unwrap()
                    .into_iter()
                    .map(|r| (r.get(0), r.get(1)))
                    .collect();
                let published = published.lock().unwrap();
                let uncovered = published
                    .range(..=p as u64)
                    .filter_map(|(_, key)| *key)
                    .filter(|key| !rows.contains(key))
                    .count();
                if uncovered > 0 {
                    violations
                        .lock()
                        .unwrap()
                        .push(format!("position {p} covers {uncovered} unstored messages"));
                }
                drop(published);
                thread::sleep(Duration::from_millis(50));
            }
        })
    };
    let started = std::time::Instant::now();
    let mut fast = setup.start(&db, "twin", &[]);
    let mut slow = setup.start(&db, "twin", &[]);
    let mut slow_until = std::time::Instant::now() + Duration::from_secs(3 + fastrand::u64(0..3));
    // Every instance's log, not only the last two's: which one stood by when
    // depends on the kills' timing.
    let mut logs = String::new();
    while started.elapsed() < Duration::from_secs(25) {
        thread::sleep(Duration::from_millis(200 + fastrand::u64(0..600)));
        fast.kill9();
        logs.push_str(&fast.log_text());
        fast = setup.start(&db, "twin", &[]);
        if std::time::Instant::now() >= slow_until {
            slow.kill9();
            logs.push_str(&slow.log_text());
            slow = setup.start(&db, "twin", &[]);
            slow_until = std::time::Instant::now() + Duration::from_secs(3 + fastrand::u64(0..3));
        }
    }
    stop.store(true, Ordering::Relaxed);
    producer.join().unwrap();
    let last = *published.lock().unwrap().keys().last().unwrap() as i64;
    wait_until(
        "the twins to reach the end of the stream",
        Duration::from_secs(60),
        || position_on(&db, "twin", &setup.stream) >= last,
    );
    sampler.join().unwrap();
    let log = format!("{logs}{}{}", fast.log_text(), slow.log_text());
    fast.terminate();
    slow.terminate();
    let expected: BTreeSet<(i32, i64)> = published
        .lock()
        .unwrap()
        .values()
        .flatten()
        .copied()
        .collect();
    let rows = stored(&db);
    let lost: Vec<&(i32, i64)> = expected.difference(&rows).collect();
    assert!(
        lost.is_empty(),
        "{} of {} never stored: {:?}",
        lost.len(),
        expected.len(),
        &lost[..lost.len().min(20)]
    );
    let v = violations.lock().unwrap().clone();
    assert!(
        v.is_empty(),
        "{} samples: {:?}",
        v.len(),
        &v[..v.len().min(10)]
    );
    assert!(log.contains("standing by"), "one of them stood by: {log}");
}

/// A batch whose rows each need a new band, more than one call may create
/// (`envelopes.max_new_partitions_per_call` = 4 here): each row is fine alone,
/// so ingress inserts the batch in smaller calls instead of failing it (54000)
/// forever. Everything is stored, nothing is set aside.
#[test]
fn a_batch_needing_more_new_bands_than_one_call_may_create_is_split() {
    let setup = Setup::new();
    let db = TestDb::new("ingress_bands");
    db.client()
        .batch_execute(&format!(
            "ALTER DATABASE \"{0}\" SET envelopes.max_new_partitions_per_call = 4;
             ALTER DATABASE \"{0}\" SET envelopes.band_width = 10",
            db.name
        ))
        .unwrap();
    let mut last = 0;
    for i in 1..=111i64 {
        let seq = i * 10;
        last = setup.publish(9, cbor(9, seq), &format!("9:{seq}"));
    }
    let mut bridge = setup.start(&db, "bands", &[]);
    wait_until("every band's row stored", Duration::from_secs(60), || {
        position_on(&db, "bands", &setup.stream) >= last as i64
    });
    bridge.terminate();
    assert_eq!(stored(&db).len(), 111);
    assert_eq!(setup.dead_lettered(), 0, "nothing is set aside");
    assert!(
        bridge.log_text().contains("smaller calls"),
        "{}",
        bridge.log_text()
    );
}
