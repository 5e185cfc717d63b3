//! One conformance suite for every sink: the same test functions run against
//! stdout-like JSONL, JetStream, Redis Streams, MQTT, RabbitMQ and an HTTP
//! webhook, each read back with that bus's own client (a JetStream consumer,
//! XRANGE, an MQTT subscription, an AMQP queue bound to the exchange, the
//! webhook's own receiver). Envelopes, late arrivals and outbox rows are written
//! while the bridge is killed with SIGKILL at random moments; every committed row
//! must arrive with its dedup id, and where the bus deduplicates (JetStream), once.
//! Then what each new sink does when its bus says no: a webhook answering 503
//! with Retry-After, or 400, for a while; a RabbitMQ exchange with no queue bound
//! for a while (unroutable messages are returned).

mod common;

use common::buses::*;
use common::kill9::Kill9;
use common::target::{Bus, Target, WEBHOOK_SECRET};
use common::*;
use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

/// Envelopes (each tenth arriving late) and outbox rows in the same transactions
/// are written while the bridge is killed with SIGKILL at random moments; then a
/// last bridge drains the backlog. Every committed row reaches the bus with its
/// dedup id; JetStream (which deduplicates) holds each once; the others hold at
/// most the unconfirmed batches twice.
fn survives_kill_9(bus: Bus) {
    let target = Target::new(bus);
    let kills = 6;
    let outcome = Kill9 {
        label: "conformance",
        consumer: "conf",
        node: 3,
        with_outbox: true,
        until: 150,
        pause: Duration::from_millis(20),
        kills,
        seed: 17,
        lifetime_ms: 200..800,
        drain: Duration::from_secs(90),
        settle: Duration::from_millis(500),
    }
    .run(&target);
    let (committed, lost) = (&outcome.committed, outcome.lost());
    assert!(
        lost.is_empty(),
        "{bus:?}: {} of {} committed rows lost: {:?}",
        lost.len(),
        committed.len(),
        &lost[..lost.len().min(20)]
    );
    assert!(committed.len() > 250, "{bus:?}: too little was written");
    let duplicates = outcome.duplicates();
    if bus == Bus::JetStream {
        assert_eq!(duplicates, 0, "JetStream kept duplicates");
    } else {
        // Only batches published but not acknowledged before a kill come twice:
        // at most one batch of each (at most 20 rows of envelopes, 20 of outbox).
        assert!(
            duplicates <= (kills + 1) * 40,
            "{bus:?}: {duplicates} duplicates for {kills} kills"
        );
    }
    if bus == Bus::Webhook {
        for request in target.receiver.as_ref().unwrap().requests() {
            let expected = envelopes_bridge_test_signature(&request.body);
            assert_eq!(request.signature.as_deref(), Some(expected.as_str()));
            let ids: Vec<String> = serde_json::from_slice::<Vec<serde_json::Value>>(&request.body)
                .unwrap()
                .into_iter()
                .map(|v| v["id"].as_str().unwrap().to_owned())
                .collect();
            assert_eq!(
                request.idempotency_key.as_deref(),
                Some(format!("{}..{}", ids[0], ids[ids.len() - 1]).as_str())
            );
        }
    }
}

/// HMAC-SHA256 of a body with the suite's secret, computed independently of the
/// bridge's code.
fn envelopes_bridge_test_signature(body: &[u8]) -> String {
    use hmac::{Hmac, Mac};
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(WEBHOOK_SECRET.as_bytes()).unwrap();
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

#[test]
fn jsonl_survives_kill_9() {
    survives_kill_9(Bus::Jsonl);
}

#[test]
fn jetstream_survives_kill_9() {
    survives_kill_9(Bus::JetStream);
}

#[test]
fn redis_survives_kill_9() {
    survives_kill_9(Bus::Redis);
}

#[test]
fn mqtt_survives_kill_9() {
    survives_kill_9(Bus::Mqtt);
}

#[test]
fn rabbitmq_survives_kill_9() {
    survives_kill_9(Bus::Amqp);
}

#[test]
fn webhook_survives_kill_9() {
    survives_kill_9(Bus::Webhook);
}

/// A webhook answering 503 (with Retry-After: 1) and then 400 for a while gets the
/// same batches again until it answers 200: nothing is skipped, the retry
/// counter moves, the 400 is logged as a permanent error with the body.
#[test]
fn a_webhook_that_says_no_gets_everything_once_it_says_yes() {
    let db = TestDb::new("hook_no");
    let target = Target::new(Bus::Webhook);
    let receiver = target.receiver.as_ref().unwrap();
    db.client()
        .execute("SELECT envelopes.consumer_register('hook')", &[])
        .unwrap();
    let metrics_port = free_port();
    let metrics_addr = format!("127.0.0.1:{metrics_port}");
    let mut args = target.args();
    args.extend(["--metrics-addr", &metrics_addr]);
    receiver.status.store(503, Ordering::Relaxed);
    let mut bridge = Bridge::egress(&db, "hook", &target.sink, &args, &[]);
    let mut c = db.client();
    for seq in 1..=50 {
        insert(&mut c, 4, seq);
    }
    wait_until("503 answers", Duration::from_secs(10), || {
        receiver
            .requests()
            .iter()
            .filter(|r| r.answered == 503)
            .count()
            >= 2
    });
    receiver.status.store(400, Ordering::Relaxed);
    wait_until("a 400 answer", Duration::from_secs(15), || {
        receiver.requests().iter().any(|r| r.answered == 400)
    });
    assert!(lag(&db, "hook") > 0, "nothing may be acknowledged yet");
    let retried = metric(&scrape(metrics_port), "envelopes_bridge_retried_total");
    receiver.status.store(200, Ordering::Relaxed);
    wait_until("the backlog to drain", Duration::from_secs(30), || {
        lag(&db, "hook") == 0
    });
    bridge.terminate();
    assert!(retried >= 3.0, "retry counter: {retried}");
    let log = bridge.log_text();
    assert!(log.contains("bad batch"), "the 400's body is logged: {log}");
    let ids: BTreeSet<String> = receiver.acknowledged_ids().into_iter().collect();
    assert_eq!(ids, committed_ids(&db));
    // Retry-After: 1 was honoured: the 503 answers came at least a second apart.
    let answers_503 = receiver
        .requests()
        .iter()
        .filter(|r| r.answered == 503)
        .count();
    assert!(
        answers_503 <= 12,
        "{answers_503} requests in about 2 s of 503s"
    );
}

/// Messages no queue is bound for are returned by RabbitMQ (published
/// `mandatory`): the bridge fails the batch and publishes it again, never skips
/// it, and once a queue is bound everything arrives.
#[test]
fn rabbitmq_unroutable_messages_are_retried_until_a_queue_is_bound() {
    let db = TestDb::new("amqp_unroutable");
    let target = Target::new(Bus::Amqp);
    // Unbind: the exchange exists, nothing is routed.
    {
        use lapin::types::FieldTable;
        let (_, channel) = target.amqp.as_ref().unwrap();
        let name = target.name.clone();
        target.runtime.block_on(async {
            channel
                .queue_unbind(
                    name.as_str().into(),
                    name.as_str().into(),
                    format!("{name}.#").as_str().into(),
                    FieldTable::default(),
                )
                .await
                .unwrap();
        });
    }
    db.client()
        .execute("SELECT envelopes.consumer_register('rabbit')", &[])
        .unwrap();
    let mut bridge = Bridge::egress(&db, "rabbit", &target.sink, &target.args(), &[]);
    let mut c = db.client();
    for seq in 1..=30 {
        insert(&mut c, 6, seq);
    }
    wait_until(
        "a returned message in the log",
        Duration::from_secs(15),
        || bridge.log_text().contains("returned by the broker"),
    );
    thread::sleep(Duration::from_secs(1));
    assert_eq!(
        lag(&db, "rabbit"),
        30,
        "nothing unroutable may count as delivered"
    );
    // Bind again: the retries get through.
    {
        use lapin::options::*;
        use lapin::types::FieldTable;
        let (_, channel) = target.amqp.as_ref().unwrap();
        let name = target.name.clone();
        target.runtime.block_on(async {
            channel
                .queue_bind(
                    name.as_str().into(),
                    name.as_str().into(),
                    format!("{name}.#").as_str().into(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await
                .unwrap();
        });
    }
    wait_until("the backlog to drain", Duration::from_secs(30), || {
        lag(&db, "rabbit") == 0
    });
    bridge.terminate();
    let ids: BTreeSet<String> = target.delivered().into_iter().collect();
    assert_eq!(ids, committed_ids(&db));
}

/// How long the outage tests keep a bus away (the 30 s by default).
fn outage() -> Duration {
    Duration::from_secs(
        std::env::var("ENVELOPES_TEST_SINK_OUTAGE_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(30),
    )
}

/// Rows commit while the sink is away; none may count as delivered meanwhile;
/// when it is back the backlog drains, every row arrives, and the retry counter
/// moved. `down` takes the sink away, `up` brings it back, `delivered` reads
/// what reached it with the bus's own client.
fn survives_outage(
    label: &str,
    sink: &str,
    args: &[&str],
    down: &mut dyn FnMut(),
    up: &mut dyn FnMut(),
    delivered: &dyn Fn() -> Vec<String>,
) {
    let db = TestDb::new(label);
    db.client()
        .execute("SELECT envelopes.consumer_register('away')", &[])
        .unwrap();
    let metrics_port = free_port();
    let metrics_addr = format!("127.0.0.1:{metrics_port}");
    let mut all_args = args.to_vec();
    all_args.extend(["--batch-size", "20", "--metrics-addr", &metrics_addr]);
    let mut bridge = Bridge::egress(&db, "away", sink, &all_args, &[]);
    let mut c = db.client();
    let mut seq = 0i64;
    let mut write = |n: i64, c: &mut postgres::Client| {
        for _ in 0..n {
            seq += 1;
            insert(c, 8, seq);
        }
        c.execute("SELECT envelopes.publish('away.note', '\\x01')", &[])
            .unwrap();
    };
    write(30, &mut c);
    wait_until("the first rows on the bus", Duration::from_secs(20), || {
        lag(&db, "away") == 0
    });
    down();
    let started = std::time::Instant::now();
    while started.elapsed() < outage() {
        write(5, &mut c);
        thread::sleep(Duration::from_millis(250));
    }
    assert!(
        lag(&db, "away") > 0,
        "{label}: rows must wait while the bus is away"
    );
    let retried = metric(&scrape(metrics_port), "envelopes_bridge_retried_total");
    assert!(retried >= 1.0, "{label}: the retry counter did not move");
    up();
    wait_until("the backlog to drain", Duration::from_secs(90), || {
        lag(&db, "away") == 0
    });
    thread::sleep(Duration::from_millis(300));
    bridge.terminate();
    let set: BTreeSet<String> = delivered().into_iter().collect();
    let committed = committed_ids(&db);
    let lost: Vec<&String> = committed.iter().filter(|id| !set.contains(*id)).collect();
    assert!(lost.is_empty(), "{label}: lost {lost:?}");
}

/// A private redis-server on its own port goes away and comes back.
#[test]
fn a_redis_outage_loses_nothing() {
    let port = free_port();
    let start = move || {
        let child = std::process::Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
            ])
            .args(["--appendonly", "yes", "--dir"])
            .arg(std::env::temp_dir())
            .args(["--appendfilename", &format!("outage{port}.aof")])
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("start redis-server");
        wait_for_port(port);
        child
    };
    let server = Arc::new(Mutex::new(Some(start())));
    let url = format!("redis://127.0.0.1:{port}");
    let stream = unique("away");
    let (s1, s2) = (server.clone(), server.clone());
    let read_url = url.clone();
    let read_stream_key = stream.clone();
    survives_outage(
        "redis_outage",
        &url,
        &["--redis-stream", &stream],
        &mut move || {
            // SHUTDOWN writes the append-only file: what Redis acknowledged stays.
            let _ = std::process::Command::new("redis-cli")
                .args(["-p", &port.to_string(), "shutdown"])
                .status();
            if let Some(mut child) = s1.lock().unwrap().take() {
                let _ = child.wait();
            }
        },
        &mut move || {
            *s2.lock().unwrap() = Some(start());
        },
        &move || {
            let runtime = tokio::runtime::Runtime::new().unwrap();
            redis_ids(&runtime, &read_url, &read_stream_key)
        },
    );
    if let Some(mut child) = server.lock().unwrap().take() {
        let _ = child.kill();
        let _ = child.wait();
    }
    let _ = std::fs::remove_file(std::env::temp_dir().join(format!("outage{port}.aof")));
}

/// The webhook receiver stops listening (connections refused) and comes back on
/// the same port.
#[test]
fn a_webhook_outage_loses_nothing() {
    let receiver = Arc::new(Mutex::new(Receiver::start()));
    let port = receiver.lock().unwrap().port;
    let url = format!("http://127.0.0.1:{port}/hook");
    let kept: Arc<Mutex<Vec<Request>>> = Arc::new(Mutex::new(Vec::new()));
    let (r1, r2, r3) = (receiver.clone(), receiver.clone(), receiver.clone());
    let k1 = kept.clone();
    survives_outage(
        "webhook_outage",
        &url,
        &[],
        &mut move || {
            let r = r1.lock().unwrap();
            k1.lock().unwrap().extend(r.requests());
            r.stop.store(true, Ordering::Relaxed);
            // The listener closes within its next 5 ms poll.
            thread::sleep(Duration::from_millis(100));
        },
        &mut move || {
            *r2.lock().unwrap() = Receiver::start_on(port);
        },
        &move || {
            let mut ids = Vec::new();
            let before = kept.lock().unwrap().clone();
            let after = r3.lock().unwrap().requests();
            for request in before.iter().chain(&after) {
                if (200..300).contains(&request.answered) {
                    for v in
                        serde_json::from_slice::<Vec<serde_json::Value>>(&request.body).unwrap()
                    {
                        ids.push(v["id"].as_str().unwrap().to_owned());
                    }
                }
            }
            ids
        },
    );
}

/// A private mosquitto on its own port, keeping sessions and queued messages on
/// disk, stops (SIGTERM: it writes its store) and comes back; the subscriber's
/// session outlives the broker's restart.
#[test]
fn an_mqtt_outage_loses_nothing() {
    let port = free_port();
    let dir = std::env::temp_dir().join(unique("mosquitto"));
    std::fs::create_dir_all(&dir).unwrap();
    let conf = dir.join("mosquitto.conf");
    std::fs::write(
        &conf,
        format!(
            "listener {port} 127.0.0.1\nallow_anonymous true\npersistence true\n\
             persistence_location {}/\nmax_queued_messages 0\nuser root\n",
            dir.display()
        ),
    )
    .unwrap();
    let start = {
        let conf = conf.clone();
        move || {
            let child = std::process::Command::new("mosquitto")
                .arg("-c")
                .arg(&conf)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .expect("start mosquitto");
            wait_for_port(port);
            child
        }
    };
    let server = Arc::new(Mutex::new(Some(start())));
    let url = format!("mqtt://127.0.0.1:{port}");
    let prefix = unique("away");
    let ids = mqtt_subscribe(&url, &prefix, true);
    let (s1, s2) = (server.clone(), server.clone());
    survives_outage(
        "mqtt_outage",
        &url,
        &["--subject-prefix", &prefix],
        &mut move || {
            if let Some(mut child) = s1.lock().unwrap().take() {
                terminate(&mut child);
            }
        },
        &mut move || {
            *s2.lock().unwrap() = Some(start());
        },
        &move || ids.lock().unwrap().clone(),
    );
    if let Some(mut child) = server.lock().unwrap().take() {
        terminate(&mut child);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A RabbitMQ node of the test's own (own node name, AMQP and distribution
/// ports, database and log directories, no plugins) stops and comes back. The
/// queue is durable and the messages persistent, so what the broker confirmed
/// before it stopped is still there after.
#[test]
fn a_rabbitmq_outage_loses_nothing() {
    let port = free_port();
    let dist = free_port();
    let dir = std::env::temp_dir().join(unique("rabbit"));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("plugins"), "[].\n").unwrap();
    let node = format!("{}@localhost", unique("outage"));
    let start = {
        let (dir, node) = (dir.clone(), node.clone());
        move || {
            let child = std::process::Command::new("/usr/lib/rabbitmq/bin/rabbitmq-server")
                .current_dir(&dir)
                .env("HOME", &dir)
                .env("RABBITMQ_NODENAME", &node)
                .env("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1")
                .env("RABBITMQ_NODE_PORT", port.to_string())
                .env("RABBITMQ_DIST_PORT", dist.to_string())
                .env("RABBITMQ_MNESIA_BASE", dir.join("mnesia"))
                .env("RABBITMQ_LOG_BASE", dir.join("log"))
                .env("RABBITMQ_ENABLED_PLUGINS_FILE", dir.join("plugins"))
                .env("RABBITMQ_CONFIG_FILE", dir.join("none"))
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .expect("start rabbitmq-server");
            wait_until(
                "the private RabbitMQ node",
                Duration::from_secs(120),
                || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok(),
            );
            child
        }
    };
    let server = Arc::new(Mutex::new(Some(start())));
    let url = format!("amqp://guest:guest@127.0.0.1:{port}/%2f");
    let exchange = unique("away");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(declare_durable_queue(&url, &exchange));
    let (s1, s2) = (server.clone(), server.clone());
    let read_url = url.clone();
    let queue = exchange.clone();
    survives_outage(
        "rabbitmq_outage",
        &url,
        &["--subject-prefix", &exchange, "--amqp-exchange", &exchange],
        &mut move || {
            if let Some(mut child) = s1.lock().unwrap().take() {
                terminate(&mut child);
            }
        },
        &mut move || {
            *s2.lock().unwrap() = Some(start());
        },
        &move || {
            let runtime = tokio::runtime::Runtime::new().unwrap();
            runtime.block_on(drain_queue(&read_url, &queue))
        },
    );
    if let Some(mut child) = server.lock().unwrap().take() {
        terminate(&mut child);
    }
    let _ = std::fs::remove_dir_all(&dir);
}
