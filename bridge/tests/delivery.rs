//! The bridge's delivery promise end to end: every committed row reaches the bus
//! (late arrivals, rows committed while a batch is read, across kill -9), one row
//! the bus refuses never stops the others, transactions that never touch the feed
//! hold nothing back, and a permanent database error is reported, not skipped.

mod common;

use common::kill9::Kill9;
use common::target::{jsonl_ids, Bus, Target};
use common::*;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// The retried-insert shape, over and over, while the bridge is killed with
/// SIGKILL at random moments: seq k fails and rolls back, k+1..k+9 commit (and
/// are forwarded), then the retried k commits. Every committed envelope reaches
/// the bus; JetStream stores each once.
fn late_arrivals_survive_kill_9(bus: Bus) {
    let target = Target::new(bus);
    let outcome = Kill9 {
        label: "late_kill",
        consumer: "late",
        node: 7,
        with_outbox: false,
        until: 200,
        pause: Duration::from_millis(30),
        kills: 8,
        seed: 7,
        lifetime_ms: 150..700,
        drain: Duration::from_secs(60),
        settle: Duration::ZERO,
    }
    .run(&target);
    let lost = outcome.lost();
    assert!(
        lost.is_empty(),
        "{bus:?}: {} of {} lost: {lost:?}",
        lost.len(),
        outcome.committed.len()
    );
    assert!(
        outcome
            .db
            .int8("SELECT count(*) FROM envelopes.late_envelopes")
            >= 19,
        "the retries did not arrive late"
    );
    if let Bus::JetStream = bus {
        assert_eq!(outcome.duplicates(), 0, "JetStream kept duplicates");
    }
}

#[test]
fn late_arrivals_survive_kill_9_on_jsonl() {
    late_arrivals_survive_kill_9(Bus::Jsonl);
}

#[test]
fn late_arrivals_survive_kill_9_on_jetstream() {
    late_arrivals_survive_kill_9(Bus::JetStream);
}

/// Bounded by default (about a minute); `ENVELOPES_STRESS_SECS` makes it longer
/// (scripts/stress.sh). Writers on shared originators, ids rising with some sent
/// again lower, rollbacks, outbox rows in the same transactions; the bridge is
/// killed with SIGKILL at random moments or crashes at its hooks. Every committed
/// row reaches JetStream once; no position ever moves backwards.
#[test]
fn randomized_writers_and_kills_lose_nothing() {
    let seconds: u64 = std::env::var("ENVELOPES_STRESS_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(50);
    let db = TestDb::new("stress");
    let target = Target::new(Bus::JetStream);
    let mut setup = db.client();
    setup
        .execute("SELECT envelopes.consumer_register('stress')", &[])
        .unwrap();
    for node in 1..=3 {
        setup
            .execute("SELECT envelopes.ensure_gateway_parts($1, 1)", &[&node])
            .unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let next = Arc::new(Mutex::new([0i64; 4]));
    let writers: Vec<_> = (0..4u64)
        .map(|w| {
            let conninfo = db.conninfo();
            let next = next.clone();
            thread::spawn(move || {
                let mut c = postgres::Client::connect(&conninfo, postgres::NoTls).unwrap();
                let mut rng = fastrand::Rng::with_seed(100 + w);
                while Instant::now() < deadline {
                    let mut tx = c.transaction().unwrap();
                    for _ in 0..rng.usize(1..=3) {
                        let node = rng.i32(1..=3);
                        let seq = {
                            let mut ids = next.lock().unwrap();
                            if ids[node as usize] > 10 && rng.u8(..) < 25 {
                                rng.i64(1..ids[node as usize])
                            } else {
                                ids[node as usize] += 1;
                                ids[node as usize]
                            }
                        };
                        insert(&mut tx, node, seq);
                    }
                    if rng.u8(..) < 60 {
                        tx.execute("SELECT envelopes.publish('stress.events', '\\x01')", &[])
                            .unwrap();
                    }
                    if rng.u8(..) < 30 {
                        tx.rollback().unwrap();
                    } else {
                        tx.commit().unwrap();
                    }
                    thread::sleep(Duration::from_millis(rng.u64(0..8)));
                }
            })
        })
        .collect();

    // Positions must never move backwards.
    let stop = Arc::new(AtomicBool::new(false));
    let went_back: Arc<Mutex<Vec<String>>> = Arc::default();
    let sampler = {
        let conninfo = db.conninfo();
        let (stop, went_back) = (stop.clone(), went_back.clone());
        thread::spawn(move || {
            let mut c = postgres::Client::connect(&conninfo, postgres::NoTls).unwrap();
            let mut last: BTreeMap<String, i64> = BTreeMap::new();
            while !stop.load(Ordering::Relaxed) {
                let mut now = BTreeMap::new();
                let r = c
                    .query_one(
                        "SELECT outbox_id, late_id FROM envelopes.consumers WHERE name = 'stress'",
                        &[],
                    )
                    .unwrap();
                now.insert("outbox".to_owned(), r.get::<_, i64>(0));
                now.insert("late".to_owned(), r.get::<_, i64>(1));
                for r in c
                    .query("SELECT originator_node_id, sequence_id FROM envelopes.consumer_envelope_cursors WHERE consumer = 'stress'", &[])
                    .unwrap()
                {
                    now.insert(format!("node{}", r.get::<_, i32>(0)), r.get::<_, i64>(1));
                }
                for (k, v) in &now {
                    if last.get(k).is_some_and(|prev| v < prev) {
                        went_back
                            .lock()
                            .unwrap()
                            .push(format!("{k}: {} -> {v}", last[k]));
                    }
                }
                last = now;
                thread::sleep(Duration::from_millis(25));
            }
        })
    };

    let hooks = ["before_publish:3", "after_publish:2", "after_ack:4"];
    let mut rng = fastrand::Rng::with_seed(42);
    let mut kills = 0;
    while Instant::now() < deadline {
        let env: Vec<(&str, &str)> = if rng.u8(..) < 80 {
            vec![("ENVELOPES_BRIDGE_CRASH", hooks[rng.usize(..hooks.len())])]
        } else {
            vec![]
        };
        let mut bridge = Bridge::egress(&db, "stress", &target.sink, &target.args(), &env);
        let lifetime = Duration::from_millis(rng.u64(100..1500));
        let started = Instant::now();
        while started.elapsed() < lifetime {
            if let Ok(Some(_)) = bridge.child.try_wait() {
                break; // the crash hook fired
            }
            thread::sleep(Duration::from_millis(20));
        }
        bridge.kill9();
        kills += 1;
    }
    for w in writers {
        w.join().unwrap();
    }
    let mut bridge = Bridge::egress(&db, "stress", &target.sink, &target.args(), &[]);
    wait_until("the backlog to drain", Duration::from_secs(120), || {
        lag(&db, "stress") == 0
    });
    bridge.terminate();
    stop.store(true, Ordering::Relaxed);
    sampler.join().unwrap();

    let committed = committed_ids(&db);
    let delivered = target.delivered();
    let delivered_set: BTreeSet<String> = delivered.iter().cloned().collect();
    let lost = missing(&committed, &delivered_set);
    assert!(
        committed.len() > 500,
        "too little traffic: {}",
        committed.len()
    );
    assert!(
        lost.is_empty(),
        "{} of {} committed rows lost after {kills} kills, e.g. {:?}",
        lost.len(),
        committed.len(),
        &lost[..lost.len().min(20)]
    );
    assert_eq!(
        delivered.len(),
        delivered_set.len(),
        "JetStream kept duplicates"
    );
    let back = went_back.lock().unwrap().clone();
    assert!(back.is_empty(), "positions moved backwards: {back:?}");
    assert!(db.int8("SELECT count(*) FROM envelopes.late_envelopes") > 0);
}

/// A NATS server whose max_payload is 8 KiB: an envelope and an outbox payload of
/// 16 KiB cannot go; the 50 rows after them do, the two are set aside, tried again
/// by the bridge until its attempts run out, then counted and shown by `status`,
/// and delivered once asked again on a server that takes them.
#[test]
fn a_row_the_bus_refuses_is_set_aside_and_the_rest_flows() {
    let db = TestDb::new("poison");
    let dir = std::env::temp_dir().join(unique("poison"));
    std::fs::create_dir_all(&dir).unwrap();
    let conf = dir.join("small.conf");
    std::fs::write(&conf, "max_payload: 8192\n").unwrap();
    let port = free_port();
    let mut small = start_nats(port, &dir.join("store"), &["-c", conf.to_str().unwrap()]);
    let url = format!("nats://127.0.0.1:{port}");
    let mut c = db.client();
    c.execute(
        "SELECT envelopes.insert_gateway_envelope(1, 1, '\\x01', pg_catalog.decode(pg_catalog.repeat('ab', 16384), 'hex'))",
        &[],
    )
    .unwrap();
    let big_outbox: i64 = c
        .query_one(
            "SELECT envelopes.publish('poison.big', pg_catalog.decode(pg_catalog.repeat('cd', 16384), 'hex'))",
            &[],
        )
        .unwrap()
        .get(0);
    for seq in 2..=51 {
        insert(&mut c, 1, seq);
    }
    for _ in 0..5 {
        c.execute("SELECT envelopes.publish('poison.small', '\\x01')", &[])
            .unwrap();
    }
    let metrics_port = free_port();
    let metrics_addr = format!("127.0.0.1:{metrics_port}");
    let args = [
        "--nats-stream",
        "POISON",
        "--dead-letter-after",
        "2",
        "--metrics-addr",
        &metrics_addr,
    ];
    let mut bridge = Bridge::egress(&db, "p", &url, &args, &[]);
    wait_until(
        "everything but the poison to flow",
        Duration::from_secs(60),
        || lag(&db, "p") == 0,
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    let ids: BTreeSet<String> = rt
        .block_on(read_stream(&url, "POISON"))
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    assert_eq!(ids.len(), 55, "{ids:?}");
    assert!(!ids.contains("1:1") && !ids.contains(&format!("outbox:{big_outbox}")));
    // The rows flowed while the two were set aside; the bridge's own attempts at
    // them end with none scheduled.
    wait_until(
        "the bridge's attempts at the refused rows to end",
        Duration::from_secs(30),
        || {
            db.int8(
                "SELECT count(*) FROM envelopes.dead_letters
                  WHERE consumer = 'p' AND next_attempt_at IS NULL",
            ) == 2
        },
    );
    let reasons: Vec<(String, String, i32)> = c
        .query(
            "SELECT kind, reason, attempts FROM envelopes.dead_letters WHERE consumer = 'p' ORDER BY kind",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(reasons.len(), 2, "{reasons:?}");
    assert!(
        reasons
            .iter()
            .all(|(_, why, attempts)| why.contains("max_payload") && *attempts >= 2),
        "{reasons:?}"
    );
    assert_eq!(
        db.int8("SELECT dead_letters FROM envelopes.consumer_status WHERE consumer = 'p'"),
        2
    );
    let text = scrape(metrics_port);
    assert_eq!(
        metric(
            &text,
            "envelopes_bridge_dead_lettered_total{kind=\"envelope\"}"
        ),
        1.0,
        "{text}"
    );
    assert_eq!(
        metric(
            &text,
            "envelopes_bridge_dead_lettered_total{kind=\"outbox\"}"
        ),
        1.0
    );
    let status = bridge_command(&[
        "status",
        "--database-url",
        &db.url(),
        "--bridge-metrics",
        &metrics_addr,
    ])
    .output()
    .unwrap();
    let shown = String::from_utf8_lossy(&status.stdout);
    assert!(
        shown.contains("dead letters") && shown.contains("1:1"),
        "{shown}"
    );
    assert!(
        shown.contains("envelopes_bridge_dead_lettered_total"),
        "{shown}"
    );
    bridge.terminate();
    let _ = small.kill();
    let _ = small.wait();

    // On a server with the default max_payload, asked again: delivered, resolved.
    let port = free_port();
    let mut big = start_nats(port, &dir.join("store2"), &[]);
    let url = format!("nats://127.0.0.1:{port}");
    assert_eq!(db.int8("SELECT envelopes.retry_dead_letters('p')"), 2);
    let mut bridge = Bridge::egress(&db, "p", &url, &["--nats-stream", "POISON"], &[]);
    wait_until(
        "the dead letters to be delivered",
        Duration::from_secs(60),
        || db.int8("SELECT count(*) FROM envelopes.dead_letters") == 0,
    );
    let ids: BTreeSet<String> = rt
        .block_on(read_stream(&url, "POISON"))
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    assert!(
        ids.contains("1:1") && ids.contains(&format!("outbox:{big_outbox}")),
        "{ids:?}"
    );
    bridge.terminate();
    let _ = big.kill();
    let _ = big.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Transactions that never write to a feed — one in another database that created
/// a table, one in this database writing elsewhere — stay open while rows
/// commit: the rows are forwarded at once, not when those transactions end.
#[test]
fn transactions_elsewhere_do_not_delay_delivery() {
    let db = TestDb::new("elsewhere");
    let other = TestDb::new("elsewhere_other");
    let path = std::env::temp_dir().join(format!("{}.jsonl", unique("elsewhere")));
    let mut c = db.client();
    c.batch_execute("CREATE TABLE public.side (x int)").unwrap();
    let mut foreign = other.client();
    let mut foreign_tx = foreign.transaction().unwrap();
    foreign_tx
        .batch_execute("CREATE TABLE public.t (); INSERT INTO public.t DEFAULT VALUES")
        .unwrap();
    let mut local = db.client();
    let mut local_tx = local.transaction().unwrap();
    local_tx
        .batch_execute("INSERT INTO public.side VALUES (1)")
        .unwrap();

    let sink = format!("jsonl:{}", path.display());
    let _bridge = Bridge::egress(&db, "e", &sink, &[], &[]);
    wait_until("the bridge to register", Duration::from_secs(30), || {
        db.int8("SELECT count(*) FROM envelopes.consumers") == 1
    });
    insert(&mut c, 1, 1);
    let id: i64 = c
        .query_one("SELECT envelopes.publish('a.b', '\\x01')", &[])
        .unwrap()
        .get(0);
    wait_until("both rows on the bus", Duration::from_secs(5), || {
        let ids = jsonl_ids(&path);
        ids.contains(&"1:1".to_owned()) && ids.contains(&format!("outbox:{id}"))
    });
    foreign_tx.rollback().unwrap();
    local_tx.rollback().unwrap();
    let _ = std::fs::remove_file(&path);
}

/// The bridge's role loses its grants: each read fails with 42501, which is
/// logged with its SQLSTATE, counted as permanent and retried at the longest
/// backoff (not ten times a second); rows committed meanwhile are all delivered
/// once the grants are back.
#[test]
fn a_revoked_bridge_reports_42501_and_skips_nothing() {
    let db = TestDb::new("revoked");
    let role = unique("bridge_role");
    let mut admin = db.client();
    admin
        .batch_execute(&format!("CREATE ROLE {role} LOGIN"))
        .unwrap();
    admin
        .execute("SELECT envelopes.grant_consumer($1)", &[&role])
        .unwrap();
    let url = db.url().replace("postgres@", &format!("{role}@"));
    let path = std::env::temp_dir().join(format!("{}.jsonl", unique("revoked")));
    let metrics_port = free_port();
    let metrics_addr = format!("127.0.0.1:{metrics_port}");
    let mut bridge = Bridge::egress_with_url(
        &url,
        "r",
        &format!("jsonl:{}", path.display()),
        &["--metrics-addr", &metrics_addr],
        &[],
    );
    for seq in 1..=5 {
        insert(&mut admin, 1, seq);
    }
    wait_until("the first rows", Duration::from_secs(30), || {
        jsonl_ids(&path).len() == 5
    });
    admin
        .execute("SELECT envelopes.revoke_consumer($1)", &[&role])
        .unwrap();
    for seq in 6..=20 {
        insert(&mut admin, 1, seq);
    }
    thread::sleep(Duration::from_secs(9));
    let log = bridge.log_text();
    assert!(
        log.contains("42501") && log.contains("permission denied"),
        "{log}"
    );
    let text = scrape(metrics_port);
    assert!(
        metric(&text, "envelopes_bridge_errors_total{kind=\"permanent\"}") >= 1.0,
        "{text}"
    );
    let attempts = log.matches("42501").count();
    assert!(attempts <= 4, "retried {attempts} times in 9 s: {log}");
    assert_eq!(jsonl_ids(&path).len(), 5, "rows went out while revoked");

    admin
        .execute("SELECT envelopes.grant_consumer($1)", &[&role])
        .unwrap();
    wait_until("the rest after the grant", Duration::from_secs(30), || {
        let ids: BTreeSet<String> = jsonl_ids(&path).into_iter().collect();
        (1..=20).all(|s| ids.contains(&format!("1:{s}")))
    });
    bridge.terminate();
    drop(bridge);
    admin
        .batch_execute(&format!("DROP OWNED BY {role}; DROP ROLE {role}"))
        .unwrap();
    let _ = std::fs::remove_file(&path);
}

/// Forty 4 MiB envelopes through a batch budget of 8 MiB: the bridge's peak
/// memory stays within a small multiple of the budget, not of the backlog.
#[test]
fn memory_stays_within_the_batch_budget() {
    let db = TestDb::new("memory");
    let mut c = db.client();
    for seq in 1..=40 {
        c.execute(
            "SELECT envelopes.insert_gateway_envelope(1, $1, '\\x01', pg_catalog.decode(pg_catalog.repeat('ab', 4194304), 'hex'))",
            &[&(seq as i64)],
        )
        .unwrap();
    }
    let prefix = unique("mem");
    let mut bridge = Bridge::egress(
        &db,
        "m",
        &mqtt_url(),
        &["--subject-prefix", &prefix, "--batch-bytes", "8388608"],
        &[],
    );
    wait_until("the backlog to drain", Duration::from_secs(120), || {
        lag(&db, "m") == 0
    });
    let status = std::fs::read_to_string(format!("/proc/{}/status", bridge.child.id())).unwrap();
    let peak_kb: u64 = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap();
    bridge.terminate();
    // 160 MiB went through; a batch is 8 MiB (two envelopes).
    assert!(peak_kb < 120 * 1024, "peak RSS {peak_kb} kB");
}

/// Two bridges under one consumer name, as a rolling deploy or two replicas run
/// them: one works, the other stands by and delivers nothing; when the active one
/// is killed with SIGKILL the standby takes over within seconds and delivers the
/// rest. Every committed row arrives, and only the batch in flight at the kill
/// comes twice.
#[test]
fn a_second_bridge_under_one_name_stands_by_and_takes_over() {
    let db = TestDb::new("standby");
    db.client()
        .execute("SELECT envelopes.consumer_register('pair')", &[])
        .unwrap();
    let dir = std::env::temp_dir().join(unique("pair"));
    std::fs::create_dir_all(&dir).unwrap();
    let (path_a, path_b) = (dir.join("a.jsonl"), dir.join("b.jsonl"));
    let (metrics_a, metrics_b) = (free_port(), free_port());
    let start = |path: &std::path::Path, metrics: u16| {
        let addr = format!("127.0.0.1:{metrics}");
        Bridge::egress(
            &db,
            "pair",
            &format!("jsonl:{}", path.display()),
            &["--batch-size", "20", "--metrics-addr", &addr],
            &[],
        )
    };
    let mut a = start(&path_a, metrics_a);
    wait_until(
        "the first bridge to be active",
        Duration::from_secs(20),
        || metric(&try_scrape(metrics_a), "envelopes_bridge_active") == 1.0,
    );
    let mut b = start(&path_b, metrics_b);
    wait_until(
        "the second bridge to stand by",
        Duration::from_secs(20),
        || b.log_text().contains("standing by"),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (conninfo, stop) = (db.conninfo(), stop.clone());
        thread::spawn(move || {
            let mut c = postgres::Client::connect(&conninfo, postgres::NoTls).unwrap();
            let mut seq = 0;
            while !stop.load(Ordering::Relaxed) {
                seq += 1;
                insert(&mut c, 7, seq);
                if seq % 10 == 0 {
                    thread::sleep(Duration::from_millis(5));
                }
            }
            seq
        })
    };
    thread::sleep(Duration::from_secs(3));
    assert_eq!(metric(&scrape(metrics_b), "envelopes_bridge_active"), 0.0);
    assert!(jsonl_ids(&path_b).is_empty(), "the standby delivered rows");
    let delivered_by_a = jsonl_ids(&path_a).len();
    assert!(delivered_by_a > 0);
    a.kill9();
    let killed = Instant::now();
    wait_until("the standby to take over", Duration::from_secs(10), || {
        !jsonl_ids(&path_b).is_empty()
    });
    let takeover = killed.elapsed();
    thread::sleep(Duration::from_secs(2));
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    wait_until("the backlog to drain", Duration::from_secs(60), || {
        lag(&db, "pair") == 0
    });
    b.terminate();
    let all: Vec<String> = jsonl_ids(&path_a)
        .into_iter()
        .chain(jsonl_ids(&path_b))
        .collect();
    let set: BTreeSet<String> = all.iter().cloned().collect();
    let committed = committed_ids(&db);
    let lost = missing(&committed, &set);
    assert!(
        lost.is_empty(),
        "lost {} rows: {:?}",
        lost.len(),
        &lost[..lost.len().min(20)]
    );
    let duplicates = all.len() - set.len();
    assert!(duplicates <= 20, "{duplicates} rows delivered twice");
    assert!(
        takeover < Duration::from_secs(5),
        "the standby took {takeover:?} to take over"
    );
    assert!(b.log_text().contains("takes over"), "{}", b.log_text());
    let _ = std::fs::remove_dir_all(&dir);
}

/// A hundred rows of one originator that the bus refuses (over a private NATS
/// server's max_payload) are set aside one by one while an unrelated
/// originator's rows, written throughout at a steady pace, keep flowing: none of
/// them waits more than a few seconds for the refused ones.
#[test]
fn a_hundred_refused_rows_do_not_hold_up_an_unrelated_originator() {
    use futures_util::StreamExt;
    let db = TestDb::new("poison100");
    let dir = std::env::temp_dir().join(unique("poison100"));
    std::fs::create_dir_all(&dir).unwrap();
    let conf = dir.join("small.conf");
    std::fs::write(&conf, "max_payload: 8192\n").unwrap();
    let port = free_port();
    let mut nats = start_nats(port, &dir.join("store"), &["-c", conf.to_str().unwrap()]);
    let url = format!("nats://127.0.0.1:{port}");
    let prefix = unique("p100");
    // Arrival times of originator 2's rows, from a plain subscription.
    let arrivals: Arc<Mutex<BTreeMap<String, Instant>>> = Arc::default();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut subscription = rt.block_on(async {
        let client = async_nats::connect(&url).await.unwrap();
        let sub = client
            .subscribe(format!("{prefix}.envelope.2"))
            .await
            .unwrap();
        client.flush().await.unwrap();
        (client, sub)
    });
    let collector = {
        let arrivals = arrivals.clone();
        rt.spawn(async move {
            while let Some(m) = subscription.1.next().await {
                if let Some(id) = m.headers.as_ref().and_then(|h| h.get("Nats-Msg-Id")) {
                    arrivals
                        .lock()
                        .unwrap()
                        .entry(id.to_string())
                        .or_insert_with(Instant::now);
                }
            }
        })
    };
    db.client()
        .execute("SELECT envelopes.consumer_register('p100')", &[])
        .unwrap();
    let mut c = db.client();
    for seq in 1..=100i64 {
        c.execute(
            "SELECT envelopes.insert_gateway_envelope(1, $1, '\\x01',
                    pg_catalog.decode(pg_catalog.repeat('ab', 16384), 'hex'))",
            &[&seq],
        )
        .unwrap();
    }
    let stream = unique("P100").to_uppercase();
    let mut bridge = Bridge::egress(
        &db,
        "p100",
        &url,
        &[
            "--nats-stream",
            &stream,
            "--subject-prefix",
            &prefix,
            "--batch-size",
            "50",
        ],
        &[],
    );
    // Originator 2 writes 20 rows a second for 12 s, noting each commit.
    let mut committed_at = BTreeMap::new();
    let began = Instant::now();
    let mut seq = 0i64;
    while began.elapsed() < Duration::from_secs(12) {
        seq += 1;
        insert(&mut c, 2, seq);
        committed_at.insert(format!("2:{seq}"), Instant::now());
        thread::sleep(Duration::from_millis(50));
    }
    wait_for_bridge(
        &bridge,
        "every row of originator 2",
        Duration::from_secs(60),
        || arrivals.lock().unwrap().len() >= committed_at.len(),
    );
    wait_for_bridge(
        &bridge,
        "the hundred refused rows set aside",
        Duration::from_secs(60),
        || db.int8("SELECT count(*) FROM envelopes.dead_letters WHERE consumer = 'p100'") == 100,
    );
    bridge.terminate();
    collector.abort();
    let arrivals = arrivals.lock().unwrap();
    let mut delays: Vec<Duration> = committed_at
        .iter()
        .map(|(id, at)| {
            arrivals
                .get(id)
                .map(|arrived| arrived.saturating_duration_since(*at))
                .unwrap_or(Duration::MAX)
        })
        .collect();
    delays.sort();
    let p99 = delays[(delays.len() * 99 / 100).min(delays.len() - 1)];
    assert!(
        p99 <= Duration::from_secs(5),
        "originator 2's rows waited for the refused ones: p99 {p99:?}, max {:?}",
        delays.last()
    );
    let _ = nats.kill();
    let _ = nats.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

/// `envelopes-bridge status` run as the bridge's own role (made with
/// grant_consumer) shows its consumer and that consumer's dead letters; it needs
/// no privilege on the dead-letter table itself.
#[test]
fn status_works_for_the_consumer_role() {
    let db = TestDb::new("status_role");
    let role = format!("{}_bridge", db.name);
    db.client()
        .batch_execute(&format!(
            "CREATE ROLE \"{role}\" LOGIN; SELECT envelopes.grant_consumer('{role}');"
        ))
        .unwrap();
    let conninfo = format!("{} user={role}", db.conninfo());
    let mut c = postgres::Client::connect(&conninfo, postgres::NoTls).unwrap();
    c.batch_execute(
        "SELECT envelopes.consumer_register('mine');
         SELECT envelopes.consumer_dead_letter('mine', 'envelope', 3, 9, NULL,
                'too large for the bus', 'MAX_PAYLOAD', 1);",
    )
    .unwrap();
    let url = db.url().replacen("postgres@", &format!("{role}@"), 1);
    let out = bridge_command(&["status", "--database-url", &url])
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "status failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        shown.contains("mine") && shown.contains("3:9") && shown.contains("MAX_PAYLOAD"),
        "{shown}"
    );
    let _ = db.client().batch_execute(&format!(
        "SELECT envelopes.revoke_consumer('{role}'); DROP OWNED BY \"{role}\"; DROP ROLE \"{role}\";"
    ));
}

/// A parallel backfill of one originator (the late-arrival shape of issue 33):
/// four writers each insert 100-row batches of an ascending range of their own,
/// the ranges growing side by side, some batches sent twice, while the bridge
/// is killed with SIGKILL at random moments. Every row reaches JetStream once,
/// the late ones through a handful of range entries.
#[test]
fn a_parallel_backfill_survives_kill_9() {
    let db = TestDb::new("backfill_kill");
    let target = Target::new(Bus::JetStream);
    let mut setup = db.client();
    setup
        .execute("SELECT envelopes.consumer_register('backfill')", &[])
        .unwrap();
    setup
        .execute("SELECT envelopes.ensure_gateway_parts(21, 1)", &[])
        .unwrap();
    let writers: Vec<_> = (0..4i64)
        .map(|w| {
            let conninfo = db.conninfo();
            thread::spawn(move || {
                let mut c = postgres::Client::connect(&conninfo, postgres::NoTls).unwrap();
                let mut rng = fastrand::Rng::with_seed(300 + w as u64);
                for k in 0..30i64 {
                    let first = w * 100_000 + k * 100 + 1;
                    let seqs: Vec<i64> = (first..first + 100).collect();
                    let times = if rng.u8(..) < 40 { 2 } else { 1 }; // a replay now and then
                    for _ in 0..times {
                        c.execute(
                            "SELECT envelopes.insert_gateway_envelopes(
                                 array_fill(21, ARRAY[100]), $1::bigint[],
                                 array_fill('\\x74'::bytea, ARRAY[100]),
                                 array_fill('\\x65'::bytea, ARRAY[100]))",
                            &[&seqs],
                        )
                        .unwrap();
                    }
                    thread::sleep(Duration::from_millis(rng.u64(5..40)));
                }
            })
        })
        .collect();
    let mut rng = fastrand::Rng::with_seed(33);
    let mut kills = 0;
    while !writers.iter().all(|w| w.is_finished()) || kills < 6 {
        let mut bridge = Bridge::egress(&db, "backfill", &target.sink, &target.args(), &[]);
        thread::sleep(Duration::from_millis(rng.u64(200..900)));
        bridge.kill9();
        kills += 1;
    }
    for w in writers {
        w.join().unwrap();
    }
    let late_rows = db.int8("SELECT count(*) FROM envelopes.gateway_envelopes_meta WHERE late");
    let entries = db.int8("SELECT count(*) FROM envelopes.late_envelopes");
    assert!(
        late_rows > 1000,
        "the backfill made late rows ({late_rows})"
    );
    assert!(
        entries * 50 <= late_rows,
        "{entries} entries for {late_rows} late rows: not ranges"
    );
    let mut bridge = Bridge::egress(&db, "backfill", &target.sink, &target.args(), &[]);
    wait_until("the backfill to drain", Duration::from_secs(120), || {
        lag(&db, "backfill") == 0
    });
    thread::sleep(Duration::from_secs(1));
    bridge.terminate();
    let committed = committed_ids(&db);
    assert_eq!(committed.len(), 12_000);
    let delivered = target.delivered();
    let set: BTreeSet<String> = delivered.iter().cloned().collect();
    let lost = missing(&committed, &set);
    assert!(lost.is_empty(), "{} of 12,000 lost: {lost:?}", lost.len());
    assert_eq!(delivered.len(), set.len(), "JetStream kept duplicates");
}
