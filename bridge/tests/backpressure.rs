//! A RabbitMQ broker that pushes back, each a private node: a queue with
//! `x-max-length` and `overflow = reject-publish` (the broker nacks what does
//! not fit), and a memory alarm (`connection.blocked`). The checker counts lost
//! and duplicate rows from what the writers committed and what the queues hold.
//!
//! On 211056c: a 1,000-row batch never fit the 300-slot queue and the whole
//! batch went again after each nack, so the consumer received the same 300 rows
//! over and over while pending grew; and a memory alarm hung the bridge with no
//! log line and its lease held, so no standby could take over.

mod common;

use common::buses::*;
use common::checker::{self, Item};
use common::*;
use lapin::options::*;
use lapin::types::{AMQPValue, FieldTable};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// Declares `name` as a durable topic exchange and a queue of that name bound to
/// it for `name.#`, with these queue arguments.
async fn declare(channel: &lapin::Channel, name: &str, args: FieldTable) {
    channel
        .exchange_declare(
            name.into(),
            lapin::ExchangeKind::Topic,
            ExchangeDeclareOptions {
                durable: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
    channel
        .queue_declare(
            name.into(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            args,
        )
        .await
        .unwrap();
    channel
        .queue_bind(
            name.into(),
            name.into(),
            format!("{name}.#").as_str().into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
}

/// Up to `max` message ids taken from the queue (basic.get, no ack).
async fn take_some(channel: &lapin::Channel, queue: &str, max: usize) -> Vec<String> {
    let mut ids = Vec::new();
    while ids.len() < max {
        let Some(message) = channel
            .basic_get(queue.into(), BasicGetOptions { no_ack: true })
            .await
            .unwrap()
        else {
            break;
        };
        ids.push(
            message
                .delivery
                .properties
                .message_id()
                .as_ref()
                .map(|id| id.to_string())
                .unwrap_or_default(),
        );
    }
    ids
}

/// Checker items of the ids delivered ("node:seq"), in the order received.
fn items(ids: &[String]) -> Vec<Item> {
    ids.iter()
        .filter_map(|id| {
            let (node, seq) = id.split_once(':')?;
            Some(Item {
                key: node.to_owned(),
                seq: seq.parse().ok()?,
                id: id.clone(),
                bytes: Vec::new(),
            })
        })
        .collect()
}

fn acknowledged(node: i32, seqs: impl Iterator<Item = i64>) -> Vec<Item> {
    seqs.map(|seq| Item {
        key: node.to_string(),
        seq,
        id: format!("{node}:{seq}"),
        bytes: Vec::new(),
    })
    .collect()
}

/// 3,000 rows wait; the bridge publishes batches of 1,000 into a queue of 300
/// slots with `reject-publish`, which a consumer drains at its own pace. Every
/// row arrives; what the broker confirmed is not published again.
#[test]
fn rabbitmq_reject_publish_delivers_each_row_once_at_the_brokers_pace() {
    let rabbit = PrivateRabbit::start("");
    let name = unique("reject");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (_connection, channel) = rt.block_on(async {
        let (connection, channel) = connect_amqp(&rabbit.url()).await;
        let mut args = FieldTable::default();
        args.insert("x-max-length".into(), AMQPValue::LongLongInt(300));
        args.insert(
            "x-overflow".into(),
            AMQPValue::LongString("reject-publish".into()),
        );
        declare(&channel, &name, args).await;
        (connection, channel)
    });
    let db = TestDb::new("reject");
    db.client()
        .batch_execute(
            "SELECT envelopes.insert_gateway_envelopes(array_fill(1, ARRAY[3000]),
                 ARRAY(SELECT generate_series(1, 3000)::bigint),
                 array_fill('\\x01'::bytea, ARRAY[3000]), array_fill('\\x0203'::bytea, ARRAY[3000]))",
        )
        .unwrap();
    let metrics = free_port();
    let addr = format!("127.0.0.1:{metrics}");
    let mut bridge = Bridge::egress(
        &db,
        "reject",
        &rabbit.url(),
        &[
            "--amqp-exchange",
            &name,
            "--subject-prefix",
            &name,
            "--batch-size",
            "1000",
            "--metrics-addr",
            &addr,
        ],
        &[],
    );
    // The consumer: at most 60 messages every 100 ms.
    let mut received = Vec::new();
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(90) {
        received.extend(rt.block_on(take_some(&channel, &name, 60)));
        let distinct: BTreeSet<&String> = received.iter().collect();
        if distinct.len() >= 3000 && lag(&db, "reject") == 0 {
            break;
        }
        thread::sleep(Duration::from_millis(100));
    }
    thread::sleep(Duration::from_millis(500));
    received.extend(rt.block_on(take_some(&channel, &name, 10_000)));
    let text = try_scrape(metrics);
    let log = bridge.log_text();
    bridge.terminate();
    let acked = acknowledged(1, 1..=3000);
    let counts = checker::check(&acked, &acked, &items(&received));
    let total = checker::total(&counts);
    let table = checker::table(
        "RabbitMQ reject-publish, 300 slots, batches of 1,000",
        &counts,
    );
    println!("{table}");
    let tail: Vec<&str> = log.lines().rev().take(20).collect();
    assert_eq!(
        total.lost,
        0,
        "{table}\npending {}; log tail:\n{tail:#?}",
        lag(&db, "reject")
    );
    // A message the broker took after an earlier one of the same request was
    // refused (room freed up meanwhile) is ahead of it, and comes again in
    // order: those are the only duplicates, each counted by the bridge as it
    // happens (how many depends on where the consumer's takes fall while a
    // request is under way), and with their early copies set aside the order
    // holds.
    let republished = metric(&text, "envelopes_bridge_republished_total") as usize;
    assert_eq!(
        total.duplicates, republished,
        "what the broker confirmed was published again beyond the overtaking messages \
         the bridge counted:\n{table}"
    );
    assert!(
        total.duplicates < 300,
        "more duplicates than the queue holds:\n{table}"
    );
    let twice: BTreeSet<&String> = {
        let mut seen = BTreeSet::new();
        received.iter().filter(|id| !seen.insert(*id)).collect()
    };
    let mut early_copies_dropped = Vec::new();
    let mut passed: BTreeSet<&String> = BTreeSet::new();
    for id in &received {
        if twice.contains(id) && passed.insert(id) {
            continue; // the early copy
        }
        early_copies_dropped.push(id.clone());
    }
    let ordered = checker::total(&checker::check(
        &acked,
        &acked,
        &items(&early_copies_dropped),
    ));
    assert_eq!(
        ordered.order_violations, 0,
        "order broken beyond the re-published messages:\n{table}"
    );
    assert!(
        log.contains("pushes back"),
        "no line about the broker pushing back:\n{tail:#?}"
    );
    assert!(
        metric(&text, "envelopes_bridge_errors_total{kind=\"transient\"}") >= 1.0,
        "{text}"
    );
    assert_eq!(lag(&db, "reject"), 0);
}

/// Two bridges under one name, each publishing to its own RabbitMQ node (as a
/// standby would be configured with another node of a cluster). A memory alarm
/// on the active one's node blocks its publishing: it logs it, reports it
/// (`sink_blocked`, /readyz 503), and after `--amqp-blocked-timeout` gives up
/// its lease; the standby takes over and delivers. Nothing is lost.
#[test]
fn a_rabbitmq_memory_alarm_is_reported_and_the_lease_goes_to_a_standby() {
    let (a, b) = {
        let a = thread::spawn(|| PrivateRabbit::start(""));
        let b = PrivateRabbit::start("");
        (a.join().unwrap(), b)
    };
    let name = unique("alarm");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let ((_ca, channel_a), (_cb, channel_b)) = rt.block_on(async {
        let ca = connect_amqp(&a.url()).await;
        declare(&ca.1, &name, FieldTable::default()).await;
        let cb = connect_amqp(&b.url()).await;
        declare(&cb.1, &name, FieldTable::default()).await;
        (ca, cb)
    });
    let db = TestDb::new("alarm");
    let args = |metrics: &str| {
        let mut args = vec![
            "--amqp-exchange".to_owned(),
            name.clone(),
            "--subject-prefix".to_owned(),
            name.clone(),
            "--metrics-addr".to_owned(),
            metrics.to_owned(),
        ];
        // A bridge from before the option (ENVELOPES_TEST_BRIDGE_BIN, to see
        // this test fail there) runs without it.
        if std::env::var_os("ENVELOPES_TEST_BRIDGE_BIN").is_none() {
            args.extend(["--amqp-blocked-timeout".to_owned(), "5".to_owned()]);
        }
        args
    };
    let (ma, mb) = (free_port(), free_port());
    let args_a = args(&format!("127.0.0.1:{ma}"));
    let args_b = args(&format!("127.0.0.1:{mb}"));
    let mut active = Bridge::egress(
        &db,
        "alarm",
        &a.url(),
        &args_a.iter().map(String::as_str).collect::<Vec<_>>(),
        &[],
    );
    wait_for_bridge(
        &active,
        "the first bridge active",
        Duration::from_secs(30),
        || metric(&try_scrape(ma), "envelopes_bridge_active") == 1.0,
    );
    let mut standby = Bridge::egress(
        &db,
        "alarm",
        &b.url(),
        &args_b.iter().map(String::as_str).collect::<Vec<_>>(),
        &[],
    );
    wait_until("the standby's metrics", Duration::from_secs(30), || {
        !try_scrape(mb).is_empty()
    });

    // A writer, about 100 rows a second.
    let stop = Arc::new(AtomicBool::new(false));
    let written = Arc::new(Mutex::new(0i64));
    let writer = {
        let (stop, written, conninfo) = (stop.clone(), written.clone(), db.conninfo());
        thread::spawn(move || {
            let mut c = postgres::Client::connect(&conninfo, postgres::NoTls).unwrap();
            let mut seq = 0;
            while !stop.load(Ordering::Relaxed) {
                seq += 1;
                insert(&mut c, 1, seq);
                *written.lock().unwrap() = seq;
                thread::sleep(Duration::from_millis(10));
            }
        })
    };
    thread::sleep(Duration::from_secs(2));
    a.eval("rabbit_alarm:set_alarm({{resource_limit, memory, node()}, []}).");
    let alarmed = Instant::now();
    // Reported while blocked.
    let mut blocked_seen = false;
    let mut not_ready_seen = false;
    let mut taken_over = None;
    while alarmed.elapsed() < Duration::from_secs(40) && taken_over.is_none() {
        let text = try_scrape(ma);
        blocked_seen |= metric(&text, "envelopes_bridge_sink_blocked") == 1.0;
        not_ready_seen |= http_get(ma, "/readyz").0 == 503;
        if metric(&try_scrape(mb), "envelopes_bridge_active") == 1.0 {
            taken_over = Some(alarmed.elapsed());
        }
        thread::sleep(Duration::from_millis(200));
    }
    thread::sleep(Duration::from_secs(2));
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    let written = *written.lock().unwrap();
    let drained = {
        let start = Instant::now();
        while lag(&db, "alarm") != 0 && start.elapsed() < Duration::from_secs(30) {
            thread::sleep(Duration::from_millis(200));
        }
        lag(&db, "alarm") == 0
    };
    let log_a = active.log_text();
    let log_b = standby.log_text();
    a.eval("rabbit_alarm:clear_alarm({resource_limit, memory, node()}).");
    active.terminate();
    standby.terminate();
    let mut received = rt.block_on(take_some(&channel_a, &name, 1_000_000));
    received.extend(rt.block_on(take_some(&channel_b, &name, 1_000_000)));
    let acked = acknowledged(1, 1..=written);
    let counts = checker::check(&acked, &acked, &items(&received));
    let total = checker::total(&counts);
    let table = checker::table("RabbitMQ memory alarm, standby on another node", &counts);
    println!("{table}\ntaken over after {taken_over:?}");
    assert!(
        taken_over.is_some(),
        "the standby never took over while the active bridge was blocked:\n{log_a}"
    );
    assert_eq!(total.lost, 0, "{table}");
    assert!(drained, "rows still pending:\n{log_b}");
    assert!(blocked_seen, "sink_blocked never showed the alarm");
    assert!(not_ready_seen, "/readyz stayed 200 while blocked");
    assert!(
        log_a.contains("connection.blocked"),
        "the blocked bridge logged nothing about it:\n{log_a}"
    );
    assert!(
        log_a.contains("giving up the lease"),
        "the blocked bridge did not give up its lease:\n{log_a}"
    );
}
