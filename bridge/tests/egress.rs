//! End-to-end tests of `envelopes-bridge egress` against a real Postgres with the
//! extension, and real NATS JetStream, Redis and Mosquitto.

mod common;

use common::*;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

fn publish(c: &mut impl postgres::GenericClient, subject: &str) -> i64 {
    c.query_one("SELECT envelopes.publish($1, '\\x7b7d')", &[&subject])
        .expect("publish")
        .get(0)
}

fn jsonl_ids(path: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).expect("a JSON line")["id"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect()
}

#[test]
fn help_documents_every_option_and_its_environment_variable() {
    let out = bridge_command(&["egress", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "--database-url",
        "ENVELOPES_DATABASE_URL",
        "--name",
        "ENVELOPES_BRIDGE_NAME",
        "--sink",
        "ENVELOPES_SINK",
        "--batch-size",
        "ENVELOPES_BATCH_SIZE",
        "--metrics-addr",
        "ENVELOPES_METRICS_ADDR",
        "stdout",
        "jsonl:PATH",
        "nats://",
        "redis://",
        "mqtt://",
        "--nats-stream",
        "--subject-prefix",
    ] {
        assert!(
            help.contains(needle),
            "egress --help lacks {needle}:\n{help}"
        );
    }
    let out = bridge_command(&["ingress", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "--source",
        "ENVELOPES_SOURCE",
        "--nats-stream",
        "--dead-letter-subject",
        "--batch-size",
    ] {
        assert!(
            help.contains(needle),
            "ingress --help lacks {needle}:\n{help}"
        );
    }
    let out = bridge_command(&["status", "--help"]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("--database-url"));
    let out = bridge_command(&["--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(
        help.contains("egress") && help.contains("ingress") && help.contains("status"),
        "{help}"
    );
    let bad = bridge_command(&[
        "egress",
        "--database-url",
        "x",
        "--name",
        "n",
        "--sink",
        "kafka://h:1",
    ])
    .output()
    .unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("unknown sink"));
}

/// Rows committed before and while the bridge runs all arrive, once, in the order
/// of each stream; the cursor ends at the end; status shows no lag.
#[test]
fn jsonl_sink_delivers_every_committed_row() {
    let db = TestDb::new("jsonl");
    let mut c = db.client();
    for seq in 1..=5 {
        insert(&mut c, 1, seq);
    }
    publish(&mut c, "orders.created");
    let path = std::env::temp_dir().join(format!("{}.jsonl", unique("sink")));
    let sink = format!("jsonl:{}", path.display());
    let mut bridge = Bridge::egress(&db, "jsonl", &sink, &[], &[]);
    wait_until("the first rows", Duration::from_secs(20), || {
        jsonl_ids(&path).len() >= 6
    });
    for seq in 6..=10 {
        insert(&mut c, 2, seq);
    }
    wait_until("rows inserted later", Duration::from_secs(20), || {
        jsonl_ids(&path).len() >= 11
    });
    let ids = jsonl_ids(&path);
    let expected: BTreeSet<String> = committed_ids(&db);
    assert_eq!(ids.iter().cloned().collect::<BTreeSet<_>>(), expected);
    assert_eq!(
        ids.len(),
        expected.len(),
        "duplicates without a crash: {ids:?}"
    );
    wait_until("the cursor to catch up", Duration::from_secs(10), || {
        lag(&db, "jsonl") == 0
    });
    assert!(
        bridge.terminate().success(),
        "SIGTERM must stop the bridge cleanly"
    );
    let status = bridge_command(&["status", "--database-url", &db.url()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(text.contains("jsonl"), "{text}");
}

/// A lower id commits after a higher one: both are delivered.
#[test]
fn a_late_commit_is_still_delivered() {
    let db = TestDb::new("late");
    let mut setup = db.client();
    setup
        .execute("SELECT envelopes.ensure_gateway_parts(1, 1)", &[])
        .unwrap();
    let path = std::env::temp_dir().join(format!("{}.jsonl", unique("late")));
    let _bridge = Bridge::egress(&db, "late", &format!("jsonl:{}", path.display()), &[], &[]);
    let mut early = db.client();
    let mut tx = early.transaction().unwrap();
    insert(&mut tx, 1, 1);
    let low = publish(&mut tx, "s");
    let mut late = db.client();
    insert(&mut late, 1, 2);
    let high = publish(&mut late, "s");
    assert!(low < high);
    thread::sleep(Duration::from_millis(800));
    let before = jsonl_ids(&path);
    assert!(
        !before.contains(&"1:2".to_owned()),
        "1:2 passed while 1:1 was uncommitted"
    );
    assert!(
        !before.contains(&format!("outbox:{high}")),
        "a later outbox row passed an open one"
    );
    tx.commit().unwrap();
    wait_until("both rows", Duration::from_secs(20), || {
        let ids = jsonl_ids(&path);
        [
            "1:1".to_owned(),
            "1:2".to_owned(),
            format!("outbox:{low}"),
            format!("outbox:{high}"),
        ]
        .iter()
        .all(|id| ids.contains(id))
    });
}

/// The bridge is killed with SIGKILL again and again — at random moments, and at
/// the hooks before publish, between publish and checkpoint, and after the
/// checkpoint — while writers commit envelopes and outbox rows. Afterwards every
/// committed id is in the JetStream stream exactly once (dedup by Nats-Msg-Id
/// absorbs the replays), and the stored cursor never moved backwards.
#[test]
fn kill_9_at_any_point_loses_nothing_and_duplicates_nothing() {
    let db = TestDb::new("kill9");
    let stream = unique("K");
    let prefix = unique("k");
    let nats = nats_url();
    let sink_args = [
        "--nats-stream",
        &stream[..],
        "--subject-prefix",
        &prefix[..],
        "--batch-size",
        "50",
    ];
    db.client()
        .execute("SELECT envelopes.consumer_register('kill9')", &[])
        .unwrap();

    // Writers: small transactions, some with several rows and an outbox message.
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..3)
        .map(|w| {
            let conninfo = db.conninfo();
            let stop = stop.clone();
            thread::spawn(move || {
                let mut c = postgres::Client::connect(&conninfo, postgres::NoTls).unwrap();
                let mut seq = 0i64;
                while !stop.load(Ordering::Relaxed) {
                    let mut tx = c.transaction().unwrap();
                    for _ in 0..(1 + seq % 3) {
                        seq += 1;
                        insert(&mut tx, w + 1, seq);
                    }
                    if seq % 4 == 0 {
                        publish(&mut tx, "events.created");
                    }
                    tx.commit().unwrap();
                    thread::sleep(Duration::from_millis(5));
                }
            })
        })
        .collect();

    // A sampler: the stored cursor must never move backwards.
    let samples: Arc<Mutex<Vec<String>>> = Arc::default();
    let sampler = {
        let conninfo = db.conninfo();
        let stop = stop.clone();
        let samples = samples.clone();
        thread::spawn(move || {
            let mut c = postgres::Client::connect(&conninfo, postgres::NoTls).unwrap();
            let mut last: BTreeMap<String, i128> = BTreeMap::new();
            while !stop.load(Ordering::Relaxed) {
                let mut now = BTreeMap::new();
                let o = c
                    .query_one(
                        "SELECT outbox_id, late_id FROM envelopes.consumers WHERE name = 'kill9'",
                        &[],
                    )
                    .unwrap();
                now.insert("outbox".to_owned(), i128::from(o.get::<_, i64>(0)));
                now.insert("late".to_owned(), i128::from(o.get::<_, i64>(1)));
                for r in c
                    .query(
                        "SELECT originator_node_id, sequence_id FROM envelopes.consumer_envelope_cursors
                          WHERE consumer = 'kill9'",
                        &[],
                    )
                    .unwrap()
                {
                    now.insert(format!("node{}", r.get::<_, i32>(0)), i128::from(r.get::<_, i64>(1)));
                }
                for (k, v) in &now {
                    if let Some(prev) = last.get(k) {
                        if v < prev {
                            samples
                                .lock()
                                .unwrap()
                                .push(format!("{k} went back from {prev} to {v}"));
                        }
                    }
                }
                last = now;
                thread::sleep(Duration::from_millis(20));
            }
        })
    };

    let hooks = [
        "before_publish:2",
        "after_publish:2",
        "after_ack:2",
        "after_publish:1",
    ];
    let mut kills = 0;
    for round in 0..12 {
        let hook = hooks.get(round % 6).copied();
        let env: Vec<(&str, &str)> = hook
            .map(|h| vec![("ENVELOPES_BRIDGE_CRASH", h)])
            .unwrap_or_default();
        let mut bridge = Bridge::egress(&db, "kill9", &nats, &sink_args, &env);
        if hook.is_some() {
            // The hook aborts the process by itself; give it time to get there.
            let _ = wait_for_exit(&mut bridge, Duration::from_secs(10));
        } else {
            thread::sleep(Duration::from_millis(150 + (round as u64 * 97) % 500));
            bridge.kill9();
        }
        kills += 1;
    }
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.join().unwrap();
    }
    sampler.join().unwrap();

    // A last bridge drains what is left.
    let mut bridge = Bridge::egress(&db, "kill9", &nats, &sink_args, &[]);
    wait_until("the backlog to drain", Duration::from_secs(60), || {
        lag(&db, "kill9") == 0
    });
    bridge.terminate();

    let runtime = tokio::runtime::Runtime::new().unwrap();
    let messages = runtime.block_on(read_stream(&nats, &stream));
    runtime.block_on(delete_stream(&nats, &stream));
    let committed = committed_ids(&db);
    let delivered: Vec<String> = messages.iter().map(|(id, _)| id.clone()).collect();
    let delivered_set: BTreeSet<String> = delivered.iter().cloned().collect();
    let lost: Vec<_> = committed.difference(&delivered_set).collect();
    assert!(
        lost.is_empty(),
        "{} committed rows never delivered (after {kills} kills): {lost:?}",
        lost.len()
    );
    assert_eq!(
        delivered.len(),
        delivered_set.len(),
        "JetStream kept duplicates"
    );
    assert!(
        committed.len() > 100,
        "the writers wrote too little to test anything"
    );
    let went_back = samples.lock().unwrap().clone();
    assert!(
        went_back.is_empty(),
        "cursor moved backwards: {went_back:?}"
    );
}

fn wait_for_exit(bridge: &mut Bridge, limit: Duration) -> Option<std::process::ExitStatus> {
    let start = std::time::Instant::now();
    while start.elapsed() < limit {
        if let Ok(Some(status)) = bridge.child.try_wait() {
            return Some(status);
        }
        thread::sleep(Duration::from_millis(20));
    }
    bridge.kill9();
    None
}

/// Terminating the bridge's database connection (as an operator or a failover
/// would) makes it reconnect, LISTEN again and carry on.
#[test]
fn a_terminated_database_connection_is_reestablished() {
    let db = TestDb::new("reconnect");
    let path = std::env::temp_dir().join(format!("{}.jsonl", unique("reconnect")));
    let bridge = Bridge::egress(
        &db,
        "reconnect",
        &format!("jsonl:{}", path.display()),
        &[],
        &[],
    );
    let mut c = db.client();
    insert(&mut c, 1, 1);
    wait_until("the first row", Duration::from_secs(20), || {
        jsonl_ids(&path).len() == 1
    });
    let killed = db.int8(
        "SELECT count(pg_terminate_backend(pid))::bigint FROM pg_stat_activity
          WHERE application_name = 'envelopes-bridge egress'",
    );
    assert!(killed >= 1);
    insert(&mut c, 1, 2);
    wait_until("a row after the reconnect", Duration::from_secs(30), || {
        jsonl_ids(&path).len() == 2
    });
    assert!(
        bridge.log_text().contains("reconnect"),
        "{}",
        bridge.log_text()
    );
}

/// Redis Streams: every row arrives as one XADD with its dedup id.
#[test]
fn redis_stream_receives_every_row() {
    let db = TestDb::new("redis");
    let mut c = db.client();
    for seq in 1..=20 {
        insert(&mut c, 3, seq);
    }
    publish(&mut c, "s");
    let key = unique("envelopes_");
    let _bridge = Bridge::egress(
        &db,
        "redis",
        &redis_url(),
        &["--redis-stream", &key[..]],
        &[],
    );
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let ids = || -> Vec<String> {
        runtime.block_on(async {
            let client = redis::Client::open(redis_url()).unwrap();
            let mut con = client.get_multiplexed_async_connection().await.unwrap();
            let entries: Vec<(String, Vec<(String, redis::Value)>)> = redis::cmd("XRANGE")
                .arg(&key)
                .arg("-")
                .arg("+")
                .query_async(&mut con)
                .await
                .unwrap_or_default();
            entries
                .into_iter()
                .filter_map(|(_, fields)| {
                    fields
                        .into_iter()
                        .find(|(k, _)| k == "id")
                        .and_then(|(_, v)| match v {
                            redis::Value::BulkString(b) => String::from_utf8(b).ok(),
                            _ => None,
                        })
                })
                .collect()
        })
    };
    wait_until("21 stream entries", Duration::from_secs(20), || {
        ids().len() >= 21
    });
    let got: BTreeSet<String> = ids().into_iter().collect();
    assert_eq!(got, committed_ids(&db));
    runtime.block_on(async {
        let client = redis::Client::open(redis_url()).unwrap();
        let mut con = client.get_multiplexed_async_connection().await.unwrap();
        let _: Result<i64, _> = redis::cmd("DEL").arg(&key).query_async(&mut con).await;
    });
}

/// MQTT 5, QoS 1: a subscriber sees every row with its dedup id as a user property.
#[test]
fn mqtt_subscriber_receives_every_row() {
    use rumqttc::v5::mqttbytes::v5::Packet;
    use rumqttc::v5::mqttbytes::QoS;
    use rumqttc::v5::{AsyncClient, Event, MqttOptions};

    let db = TestDb::new("mqtt");
    let prefix = unique("m");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let received: Arc<Mutex<BTreeSet<String>>> = Arc::default();
    let (host, port) = {
        let hp = mqtt_url().trim_start_matches("mqtt://").to_owned();
        let (h, p) = hp.rsplit_once(':').unwrap();
        (h.to_owned(), p.parse::<u16>().unwrap())
    };
    {
        let received = received.clone();
        let prefix = prefix.clone();
        runtime.spawn(async move {
            let (client, mut events) =
                AsyncClient::new(MqttOptions::new(unique("sub"), host, port), 100);
            client
                .subscribe(format!("{prefix}/#"), QoS::AtLeastOnce)
                .await
                .unwrap();
            loop {
                match events.poll().await {
                    Ok(Event::Incoming(Packet::Publish(p))) => {
                        if let Some(props) = p.properties {
                            for (k, v) in props.user_properties {
                                if k == "id" {
                                    received.lock().unwrap().insert(v);
                                }
                            }
                        }
                    }
                    Ok(_) => {}
                    Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            }
        });
    }
    thread::sleep(Duration::from_millis(500)); // let the subscription settle
    let mut c = db.client();
    for seq in 1..=15 {
        insert(&mut c, 4, seq);
    }
    publish(&mut c, "s");
    let _bridge = Bridge::egress(
        &db,
        "mqtt",
        &mqtt_url(),
        &["--subject-prefix", &prefix[..]],
        &[],
    );
    wait_until("16 MQTT messages", Duration::from_secs(20), || {
        received.lock().unwrap().len() >= 16
    });
    assert_eq!(*received.lock().unwrap(), committed_ids(&db));
}
