//! The refusal suite, run against every sink: a private instance of each bus
//! configured to refuse some rows for good (a size limit, an ACL, a key length,
//! a receiver answering 413), good rows written before and after them and on an
//! unrelated originator. Every good row must be delivered while the refused ones
//! wait in `envelopes.dead_letters` with the bus's own code; the bridge tries each
//! a few times by itself, and once the bus is changed to take them,
//! `retry_dead_letters()` delivers them. Then the webhook's redirects, which must
//! never count as an acknowledgement unless they keep the POST.

mod common;

use common::buses::*;
use common::*;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

const CONSUMER: &str = "r";
/// Attempts in all before a refused row waits for an operator.
const ATTEMPTS: i64 = 3;

fn insert_sized(c: &mut postgres::Client, node: i32, seq: i64, bytes: i32) {
    c.execute(
        "SELECT envelopes.insert_gateway_envelope($1, $2, '\\x01',
                pg_catalog.decode(pg_catalog.repeat('ab', $3), 'hex'))",
        &[&node, &seq, &bytes],
    )
    .expect("insert");
}

fn publish(c: &mut postgres::Client, subject: &str, bytes: i32) -> String {
    let id: i64 = c
        .query_one(
            "SELECT envelopes.publish($1, pg_catalog.decode(pg_catalog.repeat('cd', $2), 'hex'))",
            &[&subject, &bytes],
        )
        .expect("publish")
        .get(0);
    format!("outbox:{id}")
}

/// A row the bus will refuse: its dedup id and the code the bridge records.
struct Poison {
    id: String,
    code: &'static str,
    /// Still refused after the bus was relaxed (a key no broker takes).
    forever: bool,
}

/// One bus under test.
struct Case<'a> {
    label: &'a str,
    sink: String,
    args: Vec<String>,
    /// Writes the rows the bus refuses.
    poison: &'a dyn Fn(&mut postgres::Client) -> Vec<Poison>,
    /// Dedup ids that reached the bus, read with its own client.
    delivered: &'a dyn Fn() -> Vec<String>,
    /// Changes the bus so that it takes the refused rows.
    relax: &'a mut dyn FnMut(),
}

/// Good rows around the refused ones flow; the refused ones are set aside with
/// the bus's code, tried `ATTEMPTS` times, and delivered on request once the bus
/// takes them.
fn refused_rows_are_set_aside_and_the_rest_flows(case: Case<'_>) {
    let label = case.label;
    let db = TestDb::new(label);
    let mut c = db.client();
    c.execute("SELECT envelopes.consumer_register($1)", &[&CONSUMER])
        .unwrap();
    for seq in 1..=10 {
        insert_sized(&mut c, 1, seq, 100);
    }
    publish(&mut c, "good.before", 10);
    let poison = (case.poison)(&mut c);
    for seq in 30..=45 {
        insert_sized(&mut c, 1, seq, 100);
    }
    for seq in 1..=25 {
        insert_sized(&mut c, 2, seq, 100);
    }
    publish(&mut c, "good.after", 10);
    let poisoned: BTreeSet<String> = poison.iter().map(|p| p.id.clone()).collect();
    let good: BTreeSet<String> = committed_ids(&db)
        .into_iter()
        .filter(|id| !poisoned.contains(id))
        .collect();

    let metrics_port = free_port();
    let metrics_addr = format!("127.0.0.1:{metrics_port}");
    let attempts = ATTEMPTS.to_string();
    let mut args: Vec<&str> = case.args.iter().map(String::as_str).collect();
    args.extend([
        "--dead-letter-after",
        &attempts,
        "--batch-size",
        "20",
        "--metrics-addr",
        &metrics_addr,
    ]);
    let mut bridge = Bridge::egress(&db, CONSUMER, &case.sink, &args, &[]);
    wait_for_bridge(
        &bridge,
        &format!("{label}: the good rows to flow past the refused ones"),
        Duration::from_secs(60),
        || lag(&db, CONSUMER) == 0,
    );
    wait_for_bridge(
        &bridge,
        &format!("{label}: the bridge's own attempts at the refused rows to end"),
        Duration::from_secs(30),
        || {
            db.int8(&format!(
                "SELECT count(*) FROM envelopes.dead_letters
                  WHERE consumer = '{CONSUMER}' AND next_attempt_at IS NULL"
            )) == poison.len() as i64
        },
    );
    std::thread::sleep(Duration::from_millis(500));
    let delivered: BTreeSet<String> = (case.delivered)().into_iter().collect();
    let missing: Vec<&String> = good.difference(&delivered).collect();
    assert!(
        missing.is_empty(),
        "{label}: good rows not delivered: {missing:?}"
    );
    let leaked: Vec<&String> = poisoned.intersection(&delivered).collect();
    assert!(
        leaked.is_empty(),
        "{label}: refused rows counted as delivered: {leaked:?}"
    );
    for p in &poison {
        let (error, tries): (String, i32) = {
            let (kind, node, seq, outbox) = match p.id.strip_prefix("outbox:") {
                Some(id) => ("outbox", None, None, id.parse::<i64>().ok()),
                None => {
                    let (n, s) = p.id.split_once(':').unwrap();
                    (
                        "envelope",
                        n.parse::<i32>().ok(),
                        s.parse::<i64>().ok(),
                        None,
                    )
                }
            };
            let row = c
                .query_one(
                    "SELECT error, attempts FROM envelopes.dead_letters
                      WHERE consumer = $1 AND kind = $2
                        AND originator_node_id IS NOT DISTINCT FROM $3
                        AND originator_sequence_id IS NOT DISTINCT FROM $4
                        AND outbox_id IS NOT DISTINCT FROM $5",
                    &[&CONSUMER, &kind, &node, &seq, &outbox],
                )
                .unwrap_or_else(|e| panic!("{label}: no dead letter for {}: {e}", p.id));
            (row.get(0), row.get(1))
        };
        assert_eq!(error, p.code, "{label}: the code recorded for {}", p.id);
        assert_eq!(tries as i64, ATTEMPTS, "{label}: attempts at {}", p.id);
    }
    let text = scrape(metrics_port);
    let dead = metric(
        &text,
        "envelopes_bridge_dead_lettered_total{kind=\"envelope\"}",
    ) + metric(
        &text,
        "envelopes_bridge_dead_lettered_total{kind=\"outbox\"}",
    );
    assert_eq!(dead as usize, poison.len(), "{label}: {text}");
    let refused = metric(&text, "envelopes_bridge_refused_total{kind=\"envelope\"}")
        + metric(&text, "envelopes_bridge_refused_total{kind=\"outbox\"}");
    assert!(
        refused as i64 >= ATTEMPTS * poison.len() as i64,
        "{label}: refusals counted: {refused}"
    );

    // The bus takes them now: asked again, they are delivered and resolved.
    (case.relax)();
    let asked = db.int8(&format!(
        "SELECT envelopes.retry_dead_letters('{CONSUMER}')"
    ));
    assert_eq!(asked, poison.len() as i64);
    let forever = poison.iter().filter(|p| p.forever).count() as i64;
    wait_for_bridge(
        &bridge,
        &format!("{label}: the dead letters to be delivered on request"),
        Duration::from_secs(60),
        || {
            db.int8(&format!(
                "SELECT count(*) FROM envelopes.dead_letters
                  WHERE consumer = '{CONSUMER}' AND retry_requested_at IS NULL
                    AND next_attempt_at IS NULL"
            )) == poison.len() as i64
                || db.int8(&format!(
                    "SELECT count(*) FROM envelopes.dead_letters WHERE consumer = '{CONSUMER}'"
                )) == forever
        },
    );
    std::thread::sleep(Duration::from_millis(500));
    let delivered: BTreeSet<String> = (case.delivered)().into_iter().collect();
    for p in &poison {
        assert_eq!(
            delivered.contains(&p.id),
            !p.forever,
            "{label}: {} after the bus was relaxed",
            p.id
        );
    }
    assert_eq!(
        db.int8(&format!(
            "SELECT count(*) FROM envelopes.dead_letters WHERE consumer = '{CONSUMER}'"
        )),
        forever,
        "{label}: dead letters left"
    );
    bridge.terminate();
}

/// A private NATS server whose max_payload is 8 KiB, restarted with the default.
#[test]
fn jetstream_refusals() {
    let dir = std::env::temp_dir().join(unique("refuse_nats"));
    std::fs::create_dir_all(&dir).unwrap();
    let conf = dir.join("small.conf");
    std::fs::write(&conf, "max_payload: 8192\n").unwrap();
    let port = free_port();
    let server = std::sync::Mutex::new(start_nats(
        port,
        &dir.join("store"),
        &["-c", conf.to_str().unwrap()],
    ));
    let url = format!("nats://127.0.0.1:{port}");
    let stream = unique("REFUSE").to_uppercase();
    let rt = tokio::runtime::Runtime::new().unwrap();
    refused_rows_are_set_aside_and_the_rest_flows(Case {
        label: "jetstream",
        sink: url.clone(),
        args: vec!["--nats-stream".into(), stream.clone()],
        poison: &|c| {
            insert_sized(c, 1, 20, 16 * 1024);
            vec![
                Poison {
                    id: "1:20".into(),
                    code: "MAX_PAYLOAD",
                    forever: false,
                },
                Poison {
                    id: publish(c, "poison.big", 16 * 1024),
                    code: "MAX_PAYLOAD",
                    forever: false,
                },
            ]
        },
        delivered: &|| {
            rt.block_on(read_stream(&url, &stream))
                .into_iter()
                .map(|(id, _)| id)
                .collect()
        },
        relax: &mut || {
            let mut old = server.lock().unwrap();
            let _ = old.kill();
            let _ = old.wait();
            *old = start_nats(port, &dir.join("store"), &[]);
        },
    });
    let mut s = server.into_inner().unwrap();
    let _ = s.kill();
    let _ = s.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A private redis-server with the smallest proto-max-bulk-len it takes (1 MiB),
/// raised with CONFIG SET.
#[test]
fn redis_refusals() {
    let redis = PrivateRedis::start(&["--proto-max-bulk-len", "1mb"]);
    let key = unique("refuse");
    let rt = tokio::runtime::Runtime::new().unwrap();
    refused_rows_are_set_aside_and_the_rest_flows(Case {
        label: "redis",
        sink: redis.url(),
        args: vec!["--redis-stream".into(), key.clone()],
        poison: &|c| {
            insert_sized(c, 1, 20, 1100 * 1024);
            vec![Poison {
                id: "1:20".into(),
                code: "PROTO_MAX_BULK_LEN",
                forever: false,
            }]
        },
        delivered: &|| redis_ids(&rt, &redis.url(), &key),
        relax: &mut || redis.cli(&["CONFIG", "SET", "proto-max-bulk-len", "16mb"]),
    });
}

/// A private mosquitto with a message_size_limit of 1000 bytes (PUBACK 0x95) and
/// an ACL denying one outbox topic (PUBACK 0x87), both lifted by a reload.
#[test]
fn mqtt_refusals() {
    let prefix = unique("refuse");
    let mqtt = PrivateMosquitto::start("");
    let acl = mqtt.file(
        "acl",
        &format!("topic deny {prefix}/outbox/denied\ntopic readwrite #\n"),
    );
    mqtt.reconfigure(&format!("acl_file {acl}\nmessage_size_limit 1000"));
    let ids = mqtt_subscribe(&mqtt.url(), &prefix, false);
    refused_rows_are_set_aside_and_the_rest_flows(Case {
        label: "mqtt",
        sink: mqtt.url(),
        args: vec!["--subject-prefix".into(), prefix.clone()],
        poison: &|c| {
            insert_sized(c, 1, 20, 2000);
            vec![
                Poison {
                    id: "1:20".into(),
                    code: "MQTT_0x95",
                    forever: false,
                },
                Poison {
                    id: publish(c, "denied", 10),
                    code: "MQTT_0x87",
                    forever: false,
                },
            ]
        },
        delivered: &|| ids.lock().unwrap().clone(),
        relax: &mut || mqtt.reconfigure(""),
    });
}

/// A private RabbitMQ node with max_message_size 1 MiB (406 PRECONDITION_FAILED)
/// and the protocol's smallest frame_max (4096); an outbox subject whose routing
/// key is over AMQP's 255 bytes is delivered under its mapped key.
#[test]
fn rabbitmq_refusals() {
    let rabbit = PrivateRabbit::start("max_message_size = 1048576\nframe_max = 4096");
    let exchange = unique("refuse");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let url = rabbit.url();
    let (_connection, channel) = rt.block_on(async {
        let (connection, channel) = connect_amqp(&format!("{url}?frame_max=4096")).await;
        declare_bound_queue(&channel, &exchange).await;
        (connection, channel)
    });
    let taken = std::sync::Mutex::new(Vec::new());
    let long_subject = format!("long.{}", "k".repeat(244));
    refused_rows_are_set_aside_and_the_rest_flows(Case {
        label: "rabbitmq",
        sink: url.clone(),
        args: vec![
            "--subject-prefix".into(),
            exchange.clone(),
            "--amqp-exchange".into(),
            exchange.clone(),
        ],
        poison: &|c| {
            insert_sized(c, 1, 20, 1100 * 1024);
            // Not refused: its routing key is mapped onto its leading words,
            // which the queue's binding (EXCHANGE.#) still routes.
            publish(c, &long_subject, 10);
            vec![Poison {
                id: "1:20".into(),
                code: "AMQP_406",
                forever: false,
            }]
        },
        delivered: &|| {
            let mut all = taken.lock().unwrap();
            all.extend(rt.block_on(take_ids(&channel, &exchange)));
            all.clone()
        },
        relax: &mut || rabbit.eval("application:set_env(rabbit, max_message_size, 16777216)."),
    });
}

/// A webhook receiver answering 413 to any body over 4 KiB, raised to 1 MiB.
#[test]
fn webhook_refusals() {
    let limit = Arc::new(AtomicUsize::new(4096));
    let seen = limit.clone();
    let receiver = Receiver::with_policy(move |_, _, body| {
        if body.len() > seen.load(Ordering::Relaxed) {
            Answer::status(413)
        } else {
            Answer::status(200)
        }
    });
    refused_rows_are_set_aside_and_the_rest_flows(Case {
        label: "webhook",
        sink: receiver.url(),
        args: vec![],
        poison: &|c| {
            insert_sized(c, 1, 20, 8 * 1024);
            vec![Poison {
                id: "1:20".into(),
                code: "HTTP_413",
                forever: false,
            }]
        },
        delivered: &|| receiver.acknowledged_ids(),
        relax: &mut || limit.store(1 << 20, Ordering::Relaxed),
    });
}

/// A batch of small rows whose body passes the receiver's limit (105 rows of
/// 2 kB against 100 kB) is sent again in halves until each part passes: every
/// row is delivered, none is set aside.
#[test]
fn a_webhook_413_for_a_whole_batch_splits_it() {
    let receiver = Receiver::with_policy(|_, _, body| {
        Answer::status(if body.len() > 100_000 { 413 } else { 200 })
    });
    let db = TestDb::new("hook_split");
    let mut c = db.client();
    c.execute("SELECT envelopes.consumer_register('split')", &[])
        .unwrap();
    for seq in 1..=105 {
        insert_sized(&mut c, 3, seq, 1000);
    }
    let mut bridge = Bridge::egress(
        &db,
        "split",
        &receiver.url(),
        &["--batch-size", "1000"],
        &[],
    );
    wait_until("the batch to go in parts", Duration::from_secs(30), || {
        lag(&db, "split") == 0
    });
    bridge.terminate();
    assert!(
        receiver.requests().iter().any(|r| r.answered == 413),
        "the whole batch was refused first"
    );
    let ids: BTreeSet<String> = receiver.acknowledged_ids().into_iter().collect();
    assert_eq!(ids, committed_ids(&db));
    assert_eq!(db.int8("SELECT count(*) FROM envelopes.dead_letters"), 0);
}

/// A receiver at /hook redirecting to /final with `code`; /final takes anything.
fn redirecting(code: u16) -> Receiver {
    Receiver::with_policy(move |_, path, _| {
        if path == "/hook" {
            Answer {
                status: code,
                headers: vec![("Location".into(), "/final".into())],
                body: String::new(),
            }
        } else {
            Answer::status(200)
        }
    })
}

/// 301, 302 and 303 would turn the POST into a GET without the batch: the bridge
/// does not follow them, acknowledges nothing, and says where the redirect
/// points.
#[test]
fn a_webhook_redirect_that_drops_the_body_acknowledges_nothing() {
    for code in [301u16, 302, 303] {
        let receiver = redirecting(code);
        let db = TestDb::new(&format!("hook_{code}"));
        let mut c = db.client();
        c.execute("SELECT envelopes.consumer_register('moved')", &[])
            .unwrap();
        for seq in 1..=51 {
            insert_sized(&mut c, 5, seq, 10);
        }
        let mut bridge = Bridge::egress(&db, "moved", &receiver.url(), &[], &[]);
        wait_until(
            &format!("{code}: the redirect named in the log"),
            Duration::from_secs(20),
            || bridge.log_text().contains("/final"),
        );
        std::thread::sleep(Duration::from_secs(1));
        bridge.terminate();
        assert_eq!(
            lag(&db, "moved"),
            51,
            "{code}: nothing may count as delivered"
        );
        assert!(
            receiver.requests().iter().all(|r| r.path == "/hook"),
            "{code}: the redirect was followed"
        );
        let log = bridge.log_text();
        assert!(
            log.contains(&format!("HTTP {code}"))
                && log.contains(&format!("127.0.0.1:{}/final", receiver.port)),
            "{code}: {log}"
        );
    }
}

/// 307 and 308 keep the method and the body: followed, delivered.
#[test]
fn a_webhook_redirect_that_keeps_the_post_delivers() {
    for code in [307u16, 308] {
        let receiver = redirecting(code);
        let db = TestDb::new(&format!("hook_{code}"));
        let mut c = db.client();
        c.execute("SELECT envelopes.consumer_register('moved')", &[])
            .unwrap();
        for seq in 1..=51 {
            insert_sized(&mut c, 5, seq, 10);
        }
        let mut bridge = Bridge::egress(&db, "moved", &receiver.url(), &[], &[]);
        wait_until(
            &format!("{code}: delivery"),
            Duration::from_secs(20),
            || lag(&db, "moved") == 0,
        );
        bridge.terminate();
        let at_final: BTreeSet<String> = receiver
            .requests()
            .iter()
            .filter(|r| r.path == "/final" && r.method == "POST" && r.answered == 200)
            .flat_map(|r| {
                serde_json::from_slice::<Vec<serde_json::Value>>(&r.body)
                    .unwrap()
                    .into_iter()
                    .map(|v| v["id"].as_str().unwrap().to_owned())
            })
            .collect();
        assert_eq!(at_final, committed_ids(&db), "{code}");
    }
}

/// A 307 chain that never ends: each hop is logged, the bridge follows at most
/// five, acknowledges nothing and says why.
#[test]
fn a_webhook_redirect_loop_stops_after_five_hops() {
    let receiver = Receiver::with_policy(|_, path, _| {
        let hop: u32 = path.trim_start_matches("/hook").parse().unwrap_or(0);
        Answer {
            status: 307,
            headers: vec![("Location".into(), format!("/hook{}", hop + 1))],
            body: String::new(),
        }
    });
    let db = TestDb::new("hook_loop");
    let mut c = db.client();
    for seq in 1..=3 {
        insert_sized(&mut c, 5, seq, 10);
    }
    let mut bridge = Bridge::egress(&db, "looped", &receiver.url(), &[], &[]);
    wait_until("the loop named in the log", Duration::from_secs(20), || {
        bridge.log_text().contains("more than 5 redirects")
    });
    bridge.terminate();
    assert_eq!(lag(&db, "looped"), 3, "nothing may count as delivered");
    let hops: BTreeSet<String> = receiver.requests().into_iter().map(|r| r.path).collect();
    let expected: BTreeSet<String> = ["/hook", "/hook1", "/hook2", "/hook3", "/hook4", "/hook5"]
        .into_iter()
        .map(str::to_owned)
        .collect();
    assert_eq!(hops, expected, "five hops followed, no more");
    let log = bridge.log_text();
    assert!(
        log.matches("webhook redirects the POST; following it")
            .count()
            >= 5,
        "each hop logged: {log}"
    );
}

/// A private NATS server with users: the bridge's may not publish to one outbox
/// subject (the server answers with a permissions violation, not an ack); the
/// server restarted without the ban takes it.
#[test]
fn jetstream_acl_refusals() {
    let prefix = unique("acl");
    let dir = std::env::temp_dir().join(unique("refuse_acl"));
    std::fs::create_dir_all(&dir).unwrap();
    let conf = dir.join("acl.conf");
    let write_conf = |deny: bool| {
        let deny = if deny {
            format!(", deny: [\"{prefix}.outbox.denied\"]")
        } else {
            String::new()
        };
        std::fs::write(
            &conf,
            format!(
                "accounts {{ A {{ jetstream: enabled, users: [
                   {{ user: bridge, password: bridgepw, permissions: {{ publish: {{ allow: [\">\"]{deny} }} }} }},
                   {{ user: reader, password: readerpw }} ] }} }}\n"
            ),
        )
        .unwrap();
    };
    write_conf(true);
    let port = free_port();
    let server = std::sync::Mutex::new(start_nats(
        port,
        &dir.join("store"),
        &["-c", conf.to_str().unwrap()],
    ));
    let url = format!("nats://127.0.0.1:{port}");
    let stream = unique("ACL").to_uppercase();
    let rt = tokio::runtime::Runtime::new().unwrap();
    refused_rows_are_set_aside_and_the_rest_flows(Case {
        label: "jetstream_acl",
        sink: url.clone(),
        args: vec![
            "--nats-stream".into(),
            stream.clone(),
            "--subject-prefix".into(),
            prefix.clone(),
            "--nats-user".into(),
            "bridge".into(),
            "--nats-password".into(),
            "bridgepw".into(),
        ],
        poison: &|c| {
            vec![Poison {
                id: publish(c, "denied", 10),
                code: "PERMISSIONS_VIOLATION",
                forever: false,
            }]
        },
        delivered: &|| rt.block_on(read_stream_as(&url, "reader", "readerpw", &stream)),
        relax: &mut || {
            // Restarted on the same store (a reload of accounts with JetStream
            // does not take on this server version).
            write_conf(false);
            let mut old = server.lock().unwrap();
            let _ = old.kill();
            let _ = old.wait();
            *old = start_nats(port, &dir.join("store"), &["-c", conf.to_str().unwrap()]);
        },
    });
    let mut server = server.into_inner().unwrap();
    let _ = server.kill();
    let _ = server.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

/// The Nats-Msg-Id of every message of a stream, read as the given user.
async fn read_stream_as(url: &str, user: &str, password: &str, stream: &str) -> Vec<String> {
    use futures_util::StreamExt;
    let client = async_nats::ConnectOptions::with_user_and_password(user.into(), password.into())
        .connect(url)
        .await
        .expect("connect to NATS");
    let js = async_nats::jetstream::new(client);
    let Ok(mut s) = js.get_stream(stream).await else {
        return Vec::new();
    };
    let total = s.info().await.expect("stream info").state.messages;
    let consumer = s
        .create_consumer(async_nats::jetstream::consumer::pull::Config {
            deliver_policy: async_nats::jetstream::consumer::DeliverPolicy::All,
            ack_policy: async_nats::jetstream::consumer::AckPolicy::None,
            ..Default::default()
        })
        .await
        .expect("consumer");
    let mut ids = Vec::new();
    while (ids.len() as u64) < total {
        let mut batch = consumer
            .fetch()
            .max_messages(1000)
            .expires(Duration::from_secs(2))
            .messages()
            .await
            .expect("fetch");
        let mut got = 0;
        while let Some(Ok(m)) = batch.next().await {
            got += 1;
            if let Some(id) = m.headers.as_ref().and_then(|h| h.get("Nats-Msg-Id")) {
                ids.push(id.to_string());
            }
        }
        if got == 0 {
            break;
        }
    }
    ids
}
