//! Failover with synchronous replication, and the window it leaves open: a
//! commit whose wait for the synchronous standby is cancelled is visible on the
//! primary although the standby never received it. Forwarded at commit, such a
//! row reaches the bus and then disappears with the failover (a phantom); in
//! `--forward-after standby-flush` mode the bridge holds it back until the
//! standby has it, which it never will, so it is never forwarded.
//!
//! Forced deterministically, on servers of the test's own (ports and data
//! directories of their own, removed on drop): a primary and a synchronous
//! standby (`synchronous_standby_names = 's1'`); the standby's WAL receiver
//! stopped with SIGSTOP, so commits wait for it; rows inserted with a
//! `pg_cancel_backend` cancelling that wait (committed and visible on the
//! primary); the bridge given time to read them; the primary's processes and
//! the WAL receiver killed with SIGKILL (nothing in the receiver's socket
//! buffer reaches the standby); the standby promoted. The bridge connects by a
//! multi-host URL with `target_session_attrs=read-write` and is never restarted.

mod common;

use common::cluster::Cluster;
use common::*;
use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

const DB: &str = "failover";
/// The originator of the test's rows; seq 1 is written (and replicated) before
/// the standby stops, so that the partitions exist when it does.
const NODE: i32 = 950;
/// Rows whose wait for the standby is cancelled: seqs 2..=CANCELLED + 1.
const CANCELLED: i64 = 10;

/// A primary with a synchronous standby named s1, the database with the
/// extension on both.
struct Pair {
    primary: Cluster,
    standby: Cluster,
}

impl Pair {
    fn start(label: &str) -> Pair {
        Pair::start_with(label, true)
    }

    /// With `synchronous` false the standby streams asynchronously (no
    /// `synchronous_standby_names`).
    fn start_with(label: &str, synchronous: bool) -> Pair {
        let primary = Cluster::start(
            label,
            &[
                "wal_level = replica",
                "max_wal_senders = 5",
                "wal_keep_size = '64MB'",
            ],
        );
        primary.create_db(DB);
        let standby = Cluster::standby_of(&primary, &format!("{label}_standby"), "s1");
        // Set on the primary only, after the base backup: the promoted standby
        // must not wait for a standby of its own.
        let mut admin = primary.client("postgres");
        if synchronous {
            admin
                .batch_execute("ALTER SYSTEM SET synchronous_standby_names = 's1'")
                .unwrap();
            admin.batch_execute("SELECT pg_reload_conf()").unwrap();
        }
        let wanted = if synchronous { "sync" } else { "async" };
        wait_until("the standby to stream", Duration::from_secs(30), || {
            primary
                .client("postgres")
                .query_one(
                    "SELECT count(*) FROM pg_stat_replication
                          WHERE application_name = 's1' AND state = 'streaming'
                            AND sync_state = $1",
                    &[&wanted],
                )
                .map(|r| r.get::<_, i64>(0) == 1)
                .unwrap_or(false)
        });
        Pair { primary, standby }
    }

    /// Both servers, the writable one first (libpq's multi-host URL).
    fn url(&self) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/{DB}?target_session_attrs=read-write",
            self.primary.port, self.standby.port
        )
    }
}

/// Inserts `NODE:seq` with `bytes` as its envelope, waiting for the commit
/// (and the synchronous standby) as a writer does.
fn insert(client: &mut postgres::Client, seq: i64, bytes: &[u8]) {
    client
        .execute(
            "SELECT envelopes.insert_gateway_envelope($1, $2, '\\x746f706963'::bytea, $3)",
            &[&NODE, &seq, &bytes],
        )
        .unwrap();
}

/// Cancels, every 20 ms until dropped, every commit on `primary` that waits for
/// the synchronous standby (`wait_event` SyncRep) — what `statement_timeout`s,
/// clients that give up, or an operator's `pg_cancel_backend` do to commits
/// while the standby receives nothing. Each such commit is committed on the
/// primary all the same (Postgres says so in a warning). The bridge's
/// acknowledgements write (they move its positions), so their commits wait too
/// and are cancelled as well.
struct Canceller {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<u64>>,
}

impl Canceller {
    fn start(primary: &Cluster) -> Canceller {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut admin = primary.client("postgres");
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut cancelled = 0u64;
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                if let Ok(row) = admin.query_one(
                    "SELECT count(*) FILTER (WHERE pg_cancel_backend(pid))
                       FROM pg_stat_activity WHERE wait_event = 'SyncRep'",
                    &[],
                ) {
                    cancelled += row.get::<_, i64>(0) as u64;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            cancelled
        });
        Canceller {
            stop,
            thread: Some(thread),
        }
    }

    /// Stops; returns how many waits it cancelled.
    fn stop(mut self) -> u64 {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.take().and_then(|t| t.join().ok()).unwrap_or(0)
    }
}

impl Drop for Canceller {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// What reached the JSONL sink: id -> envelope bytes in hex (the last line of
/// each id), and how many lines each id has.
fn sink(path: &std::path::Path) -> (BTreeMap<String, String>, BTreeMap<String, usize>) {
    let mut bytes = BTreeMap::new();
    let mut lines = BTreeMap::new();
    for line in std::fs::read_to_string(path).unwrap_or_default().lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let (Some(id), Some(blob)) = (v["id"].as_str(), v["originator_envelope"].as_str()) else {
            continue;
        };
        bytes.insert(id.to_owned(), blob.to_owned());
        *lines.entry(id.to_owned()).or_insert(0) += 1;
    }
    (bytes, lines)
}

/// The store's rows: id -> envelope bytes in hex.
fn store(cluster: &Cluster) -> BTreeMap<String, String> {
    cluster
        .client(DB)
        .query(
            "SELECT originator_node_id || ':' || originator_sequence_id,
                    encode(originator_envelope, 'hex')
               FROM envelopes.gateway_envelopes_view",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

/// Sends `signal` to a process.
fn signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill {signal} {pid}");
}

/// The scenario up to the promotion; returns the pair (promoted standby), the
/// bridge still running, and the sink's file.
fn cancelled_waits_then_failover(mode: Option<&str>) -> (Pair, Bridge, std::path::PathBuf) {
    unreplicated_rows_then_failover(mode, true)
}

/// The scenario; with `synchronous` false, asynchronous replication: the
/// commits do not wait, nothing needs cancelling, and the rows the stopped
/// receiver never got are simply not on the standby.
fn unreplicated_rows_then_failover(
    mode: Option<&str>,
    synchronous: bool,
) -> (Pair, Bridge, std::path::PathBuf) {
    let pair = Pair::start_with(
        &format!(
            "fo_{}{}",
            mode.unwrap_or("auto").replace('-', "_"),
            if synchronous { "" } else { "_async" }
        ),
        synchronous,
    );
    let path = std::env::temp_dir().join(format!("{}.jsonl", unique("failover")));
    let mut writer = pair.primary.client(DB);
    insert(&mut writer, 1, b"before");
    let bridge = Bridge::egress_with_url(
        &pair.url(),
        "forwarder",
        &format!("jsonl:{}", path.display()),
        &mode.map_or(Vec::new(), |m| vec!["--forward-after", m]),
        &[],
    );
    wait_for_bridge(
        &bridge,
        "950:1 on the sink",
        Duration::from_secs(30),
        || sink(&path).0.contains_key("950:1"),
    );

    // Commits now wait for the standby, which receives nothing more.
    let receiver = pair.standby.wal_receiver_pid().expect("a WAL receiver");
    signal(receiver, "-STOP");
    let canceller = Canceller::start(&pair.primary);
    for seq in 2..=CANCELLED + 1 {
        insert(&mut writer, seq, b"before");
    }
    let visible = pair
        .primary
        .client(DB)
        .query_one(
            "SELECT count(*) FROM envelopes.gateway_envelopes_meta WHERE originator_node_id = $1",
            &[&NODE],
        )
        .unwrap()
        .get::<_, i64>(0);
    assert_eq!(
        visible,
        CANCELLED + 1,
        "the rows whose wait was cancelled are visible on the primary"
    );

    // Let the bridge read them.
    if mode == Some("commit") {
        wait_for_bridge(
            &bridge,
            "the unreplicated rows on the sink",
            Duration::from_secs(30),
            || {
                sink(&path)
                    .0
                    .contains_key(&format!("950:{}", CANCELLED + 1))
            },
        );
    } else {
        wait_for_bridge(
            &bridge,
            "the bridge to say it holds the batch back",
            Duration::from_secs(30),
            || {
                bridge
                    .log_text()
                    .contains("holding the batch back until the standbys have flushed it")
            },
        );
    }

    let cancelled = canceller.stop();
    assert!(!synchronous || cancelled >= CANCELLED as u64);
    // The primary dies; so does the stopped WAL receiver, with whatever its
    // socket still holds; the standby is promoted.
    drop(writer);
    pair.primary.kill9();
    signal(receiver, "-KILL");
    wait_until(
        "the standby to accept connections again",
        Duration::from_secs(60),
        || {
            postgres::Client::connect(&pair.standby.conninfo("postgres"), postgres::NoTls)
                .and_then(|mut c| c.query_one("SELECT 1", &[]))
                .is_ok()
        },
    );
    pair.standby.promote();
    (pair, bridge, path)
}

/// Rows on the sink that the promoted store lacks, or has with other bytes.
fn phantoms(pair: &Pair, path: &std::path::Path) -> Vec<String> {
    let kept = store(&pair.standby);
    sink(path)
        .0
        .into_iter()
        .filter(|(id, bytes)| kept.get(id) != Some(bytes))
        .map(|(id, _)| id)
        .collect()
}

#[test]
fn forwarding_at_commit_forwards_rows_the_failover_takes_back() {
    let (pair, _bridge, path) = cancelled_waits_then_failover(Some("commit"));
    let phantoms = phantoms(&pair, &path);
    println!(
        "forwarded at commit: {} phantom(s): {phantoms:?}",
        phantoms.len()
    );
    assert!(
        !phantoms.is_empty(),
        "forwarded at commit, rows that only the dead primary had reach the sink"
    );
    assert!(!store(&pair.standby).contains_key(&phantoms[0]));
    let _ = std::fs::remove_file(&path);
}

/// With `synchronous_standby_names` set the default (`auto`) is standby-flush.
/// After the failover the new primary has no standby and no such setting:
/// `auto` forwards at commit there, while an explicit standby-flush would wait
/// for a standby (and `status` says so).
#[test]
fn standby_flush_by_default_forwards_nothing_the_failover_takes_back() {
    let (pair, bridge, path) = cancelled_waits_then_failover(None);
    assert_eq!(
        phantoms(&pair, &path),
        Vec::<String>::new(),
        "no row on the sink that the promoted store lacks; the bridge's log:\n{}",
        bridge.log_text()
    );
    // The same bridge, never restarted, finds the new primary through its URL
    // and forwards what is written there — 950:2 again, with other bytes,
    // which a phantom would have shadowed on a bus that drops repeated ids.
    let mut writer = pair.standby.client(DB);
    insert(&mut writer, 2, b"after");
    wait_for_bridge(
        &bridge,
        "950:2 from the new primary on the sink",
        Duration::from_secs(60),
        || sink(&path).0.get("950:2") == Some(&hex(b"after")),
    );
    let (_, lines) = sink(&path);
    assert_eq!(lines.get("950:2"), Some(&1), "950:2 reached the sink once");
    assert_eq!(phantoms(&pair, &path), Vec::<String>::new());
    let status = bridge_command(&["status", "--database-url", &pair.url()])
        .output()
        .unwrap();
    let status = String::from_utf8_lossy(&status.stdout);
    assert!(
        status.contains("no standbys and synchronous_standby_names = ''")
            && status.contains(
                "only an explicit --forward-after standby-flush would wait (no standby is connected)"
            ),
        "{status}"
    );
    let _ = std::fs::remove_file(&path);
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The checker counts what it is meant to count.
#[test]
fn the_checker_counts_lost_phantom_duplicate_and_out_of_order_rows() {
    use common::checker::{check, Item};
    let item = |key: &str, seq: i64, bytes: &str| Item {
        key: key.into(),
        seq,
        id: format!("{key}:{seq}"),
        bytes: bytes.as_bytes().to_vec(),
    };
    let acknowledged = [item("1", 1, "a"), item("1", 2, "b"), item("1", 3, "c")];
    let store = [item("1", 1, "a"), item("1", 2, "b"), item("1", 3, "c")];
    let delivered = [
        item("1", 2, "b"),
        item("1", 1, "a"), // out of order
        item("1", 1, "a"), // a duplicate
        item("1", 4, "d"), // not in the store: a phantom
        item("1", 3, "x"), // other bytes: a phantom, and 1:3 with "c" is lost
    ];
    // Written late on purpose (5 committed before 3): no order is promised.
    let late_acks = [item("2", 5, "e"), item("2", 3, "f")];
    let late_delivered = [item("2", 5, "e"), item("2", 3, "f")];
    let late = &check(&late_acks, &late_acks, &late_delivered)["2"];
    assert_eq!((late.lost, late.phantom, late.order_violations), (0, 0, 0));
    let counts = &check(&acknowledged, &store, &delivered)["1"];
    assert_eq!(
        (
            counts.acknowledged,
            counts.delivered,
            counts.lost,
            counts.phantom,
            counts.duplicates,
            counts.order_violations
        ),
        (3, 5, 1, 2, 1, 1)
    );
}

/// What writers were told was committed (an insert or publish() that returned).
type Acks = std::sync::Arc<std::sync::Mutex<Vec<common::checker::Item>>>;

/// A writer through a multi-host connection string: it reconnects by itself
/// (to whichever server accepts writes) and carries on; a row whose statement
/// failed is written again (envelopes: the insert is idempotent) or given up
/// unacknowledged (outbox rows).
struct Writers {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
    acks: Acks,
}

fn connect_retrying(
    conninfo: &str,
    stop: &std::sync::atomic::AtomicBool,
) -> Option<postgres::Client> {
    loop {
        if stop.load(std::sync::atomic::Ordering::Relaxed) {
            return None;
        }
        if let Ok(c) = postgres::Client::connect(conninfo, postgres::NoTls) {
            return Some(c);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

impl Writers {
    fn start(conninfo: &str, nodes: &[i32]) -> Writers {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let acks: Acks = Default::default();
        let mut threads = Vec::new();
        for &node in nodes {
            let (stop, acks, conninfo) = (stop.clone(), acks.clone(), conninfo.to_owned());
            threads.push(std::thread::spawn(move || {
                let mut client = connect_retrying(&conninfo, &stop);
                let mut seq = 1i64;
                while let Some(c) = client.as_mut() {
                    if stop.load(std::sync::atomic::Ordering::Relaxed) {
                        break;
                    }
                    let bytes = format!("{node}:{seq}:envelope").into_bytes();
                    match c.execute(
                        "SELECT envelopes.insert_gateway_envelope($1, $2, '\\x01'::bytea, $3)",
                        &[&node, &seq, &bytes],
                    ) {
                        Ok(_) => {
                            acks.lock().unwrap().push(common::checker::Item {
                                key: node.to_string(),
                                seq,
                                id: format!("{node}:{seq}"),
                                bytes,
                            });
                            seq += 1;
                            std::thread::sleep(Duration::from_millis(2));
                        }
                        Err(_) => client = connect_retrying(&conninfo, &stop),
                    }
                }
            }));
        }
        // The outbox, through publish(): ids come from the database, so the
        // checker goes by the payload, which the writer numbers.
        let (stop2, acks2, conninfo) = (stop.clone(), acks.clone(), conninfo.to_owned());
        threads.push(std::thread::spawn(move || {
            let mut client = connect_retrying(&conninfo, &stop2);
            let mut n = 1i64;
            while let Some(c) = client.as_mut() {
                if stop2.load(std::sync::atomic::Ordering::Relaxed) {
                    break;
                }
                let payload = format!("outbox-{n}").into_bytes();
                match c.execute(
                    "SELECT envelopes.publish('failover.outbox', $1)",
                    &[&payload],
                ) {
                    Ok(_) => {
                        acks2.lock().unwrap().push(common::checker::Item {
                            key: "outbox".into(),
                            seq: n,
                            id: format!("outbox-{n}"),
                            bytes: payload,
                        });
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    Err(_) => client = connect_retrying(&conninfo, &stop2),
                }
                n += 1;
            }
        }));
        Writers {
            stop,
            threads,
            acks,
        }
    }

    fn acknowledged(&self) -> usize {
        self.acks.lock().unwrap().len()
    }

    fn stop(self) -> Vec<common::checker::Item> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for t in self.threads {
            let _ = t.join();
        }
        let acks = self.acks.lock().unwrap().clone();
        acks
    }
}

/// A JSON line (or JetStream message in `--format json`) as the checker sees
/// it: envelopes by originator, outbox rows by their payload.
fn item_of_json(v: &serde_json::Value) -> Option<common::checker::Item> {
    let unhex = |s: &str| -> Option<Vec<u8>> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
            .collect()
    };
    match v["kind"].as_str()? {
        "envelope" => {
            let node = v["originator_node_id"].as_i64()?;
            let seq = v["originator_sequence_id"].as_i64()?;
            Some(common::checker::Item {
                key: node.to_string(),
                seq,
                id: format!("{node}:{seq}"),
                bytes: unhex(v["originator_envelope"].as_str()?)?,
            })
        }
        _ => {
            let payload = unhex(v["payload"].as_str()?)?;
            let text = String::from_utf8(payload.clone()).ok()?;
            let n = text.strip_prefix("outbox-")?.parse().ok()?;
            Some(common::checker::Item {
                key: "outbox".into(),
                seq: n,
                id: text,
                bytes: payload,
            })
        }
    }
}

/// The store after the run: envelopes and outbox rows.
fn store_items(cluster: &Cluster) -> Vec<common::checker::Item> {
    let mut client = cluster.client(DB);
    let mut out: Vec<common::checker::Item> = client
        .query(
            "SELECT originator_node_id, originator_sequence_id, originator_envelope
               FROM envelopes.gateway_envelopes_view",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| {
            let (node, seq): (i32, i64) = (r.get(0), r.get(1));
            common::checker::Item {
                key: node.to_string(),
                seq,
                id: format!("{node}:{seq}"),
                bytes: r.get(2),
            }
        })
        .collect();
    for r in client
        .query("SELECT payload FROM envelopes.outbox", &[])
        .unwrap()
    {
        let payload: Vec<u8> = r.get(0);
        if let Some(n) = String::from_utf8_lossy(&payload)
            .strip_prefix("outbox-")
            .and_then(|n| n.parse().ok())
        {
            out.push(common::checker::Item {
                key: "outbox".into(),
                seq: n,
                id: format!("outbox-{n}"),
                bytes: payload,
            });
        }
    }
    out
}

/// Envelopes published straight to a JetStream stream with the NATS client, as
/// another node would, for ingress to import: (originator 300, seq n), acked
/// by JetStream.
struct Producer {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<Vec<common::checker::Item>>>,
}

const INGRESS_NODE: i64 = 300;

impl Producer {
    fn start(prefix: &str) -> Producer {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (flag, prefix) = (stop.clone(), prefix.to_owned());
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Runtime::new().unwrap();
            runtime.block_on(async move {
                let js = async_nats::jetstream::new(async_nats::connect(nats_url()).await.unwrap());
                let mut acked = Vec::new();
                let mut seq = 1i64;
                while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                    let bytes = format!("{INGRESS_NODE}:{seq}:imported").into_bytes();
                    let body = serde_json::json!({
                        "kind": "envelope",
                        "originator_node_id": INGRESS_NODE,
                        "originator_sequence_id": seq,
                        "gateway_time_us": 1_800_000_000_000_000i64,
                        "topic": "02",
                        "payer_id": null,
                        "expiry": null,
                        "originator_envelope": bytes.iter().map(|b| format!("{b:02x}")).collect::<String>(),
                    })
                    .to_string();
                    let sent = js
                        .send_publish(
                            format!("{prefix}.envelope.{INGRESS_NODE}"),
                            async_nats::jetstream::message::PublishMessage::build()
                                .payload(body.into_bytes().into())
                                .message_id(format!("{INGRESS_NODE}:{seq}")),
                        )
                        .await;
                    if let Ok(ack) = sent {
                        if ack.await.is_ok() {
                            acked.push(common::checker::Item {
                                key: INGRESS_NODE.to_string(),
                                seq,
                                id: format!("{INGRESS_NODE}:{seq}"),
                                bytes,
                            });
                            seq += 1;
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                acked
            })
        });
        Producer {
            stop,
            thread: Some(thread),
        }
    }

    fn stop(mut self) -> Vec<common::checker::Item> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default()
    }
}

impl Drop for Producer {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Failover under traffic (a synchronous and an asynchronous standby):
/// writers through the insert functions and publish(), egress to JetStream and to JSONL, ingress importing from a
/// JetStream stream, all by a multi-host URL; the primary killed with SIGKILL
/// mid-stream and the synchronous standby promoted; nothing restarted by hand.
/// The checker then finds nothing lost and no phantom on either bus, and the
/// promoted standby's change feed (which never ran a writer before) serves the
/// rows written after the promotion.
#[test]
fn failover_under_traffic_loses_nothing_and_forwards_no_phantom() {
    let pair = Pair::start("fo_traffic");
    // An asynchronous standby beside the synchronous one: it must not count
    // for standby-flush (synchronous_standby_names names s1 only), and is left
    // behind by the failover (it follows the old primary).
    let _async_standby = Cluster::standby_of(&pair.primary, "fo_traffic_async", "a1");
    wait_until("the asynchronous standby", Duration::from_secs(30), || {
        pair.primary
            .client("postgres")
            .query_one(
                "SELECT count(*) FROM pg_stat_replication
                  WHERE application_name = 'a1' AND sync_state = 'async'",
                &[],
            )
            .map(|r| r.get::<_, i64>(0) == 1)
            .unwrap_or(false)
    });
    let conninfo = format!(
        "host=127.0.0.1,127.0.0.1 port={},{} user=postgres dbname={DB} \
         target_session_attrs=read-write connect_timeout=2",
        pair.primary.port, pair.standby.port
    );
    let out_prefix = unique("foout");
    let out_stream = out_prefix.to_uppercase();
    let in_prefix = unique("foin");
    let in_stream = in_prefix.to_uppercase();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let js = async_nats::jetstream::new(async_nats::connect(nats_url()).await.unwrap());
        js.create_stream(async_nats::jetstream::stream::Config {
            name: in_stream.clone(),
            subjects: vec![format!("{in_prefix}.>")],
            ..Default::default()
        })
        .await
        .unwrap();
    });
    let jsonl = std::env::temp_dir().join(format!("{}.jsonl", unique("fotraffic")));
    let url = pair.url();
    let to_nats = Bridge::egress_with_url(
        &url,
        "to_nats",
        &nats_url(),
        &[
            "--nats-stream",
            &out_stream,
            "--subject-prefix",
            &out_prefix,
            "--format",
            "json",
        ],
        &[],
    );
    let to_file = Bridge::egress_with_url(
        &url,
        "to_file",
        &format!("jsonl:{}", jsonl.display()),
        &[],
        &[],
    );
    let ingress_log = std::env::temp_dir().join(format!("{}.log", unique("foingress")));
    let mut cmd = bridge_command(&[
        "ingress",
        "--database-url",
        &url,
        "--name",
        "importer",
        "--source",
        &nats_url(),
        "--nats-stream",
        &in_stream,
        "--subject-prefix",
        &in_prefix,
        "--dead-letter-subject",
        &format!("{in_prefix}dlq"),
    ]);
    cmd.stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&ingress_log).unwrap());
    let ingress = Bridge {
        child: cmd.spawn().unwrap(),
        log: ingress_log,
    };

    let writers = Writers::start(&conninfo, &[101, 102]);
    let producer = Producer::start(&in_prefix);
    wait_until("writers to get going", Duration::from_secs(30), || {
        writers.acknowledged() >= 300
    });
    // Originator 103: seq 5 committed (and replicated) on the old primary; seq
    // 3 comes on the new one, whose shared memory never saw 5, and must still
    // be found late and delivered.
    let late_row = |cluster: &Cluster, seq: i64| {
        let bytes = format!("103:{seq}:envelope").into_bytes();
        cluster
            .client(DB)
            .execute(
                "SELECT envelopes.insert_gateway_envelope(103, $1, '\\x01'::bytea, $2)",
                &[&seq, &bytes],
            )
            .unwrap();
        common::checker::Item {
            key: "103".into(),
            seq,
            id: format!("103:{seq}"),
            bytes,
        }
    };
    let mut late_acks = vec![late_row(&pair.primary, 5)];
    let before = writers.acknowledged();
    pair.primary.kill9();
    pair.standby.promote();
    wait_until(
        "writers to commit on the promoted standby",
        Duration::from_secs(60),
        || writers.acknowledged() >= before + 300,
    );
    let mut acknowledged = writers.stop();
    let imported = producer.stop();
    late_acks.push(late_row(&pair.standby, 3));
    let late: bool = pair
        .standby
        .client(DB)
        .query_one(
            "SELECT late FROM envelopes.gateway_envelopes_meta
              WHERE originator_node_id = 103 AND originator_sequence_id = 3",
            &[],
        )
        .unwrap()
        .get(0);
    assert!(
        late,
        "103:3 below the old primary's 103:5 is a late arrival on the new primary"
    );
    acknowledged.extend(late_acks);

    // Everything in the store reaches both buses; every imported envelope
    // reaches the store.
    let stored = || store_items(&pair.standby);
    let on_nats = || -> Vec<common::checker::Item> {
        runtime
            .block_on(read_stream(&nats_url(), &out_stream))
            .iter()
            .filter_map(|(_, payload)| serde_json::from_slice(payload).ok())
            .filter_map(|v: serde_json::Value| item_of_json(&v))
            .collect()
    };
    let on_file = || -> Vec<common::checker::Item> {
        std::fs::read_to_string(&jsonl)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .filter_map(|v: serde_json::Value| item_of_json(&v))
            .collect()
    };
    let covers = |store: &[common::checker::Item], bus: &[common::checker::Item]| {
        let ids: std::collections::BTreeSet<&str> = bus.iter().map(|i| i.id.as_str()).collect();
        store.iter().all(|i| ids.contains(i.id.as_str()))
    };
    wait_for_bridge(
        &ingress,
        "ingress to import every acked envelope",
        Duration::from_secs(90),
        || {
            let ids: std::collections::BTreeSet<String> =
                stored().into_iter().map(|i| i.id).collect();
            imported.iter().all(|i| ids.contains(&i.id))
        },
    );
    wait_for_bridge(
        &to_nats,
        "the store on JetStream",
        Duration::from_secs(90),
        || covers(&stored(), &on_nats()),
    );
    wait_for_bridge(
        &to_file,
        "the store on the JSONL sink",
        Duration::from_secs(90),
        || covers(&stored(), &on_file()),
    );

    let store = stored();
    let mut all_acked = acknowledged.clone();
    all_acked.extend(imported.iter().cloned());
    // Ingress: what JetStream acknowledged to the producer, "delivered" to the store.
    let store_as_delivered = common::checker::check(&imported, &[], &store);
    let nats = common::checker::check(&all_acked, &store, &on_nats());
    let file = common::checker::check(&all_acked, &store, &on_file());
    println!(
        "{}",
        common::checker::table("JetStream (a consumer with async-nats):", &nats)
    );
    println!("{}", common::checker::table("JSONL file:", &file));
    let imported_lost = common::checker::total(&store_as_delivered).lost;
    for (name, counts) in [("JetStream", &nats), ("JSONL", &file)] {
        let t = common::checker::total(counts);
        assert_eq!(
            (t.lost, t.phantom, t.order_violations),
            (0, 0, 0),
            "{name}: {counts:?}"
        );
        assert!(t.acknowledged > 600);
    }
    // JetStream drops the batches republished after the failover (same ids).
    assert_eq!(common::checker::total(&nats).duplicates, 0, "{nats:?}");
    assert_eq!(
        imported_lost, 0,
        "every envelope JetStream acked is in the store"
    );
    assert!(!imported.is_empty());

    // The promoted standby's change feed: its ceilings reach each writer's
    // last row, though it never ran a writer before the promotion.
    let mut client = pair.standby.client(DB);
    for node in [101, 102, 103] {
        let top = acknowledged
            .iter()
            .filter(|i| i.key == node.to_string())
            .map(|i| i.seq)
            .max()
            .unwrap();
        let ceiling: i64 = client
            .query_one(
                "SELECT max_sequence_id FROM envelopes.originator_ceilings() WHERE originator_node_id = $1",
                &[&node],
            )
            .unwrap()
            .get(0);
        assert!(
            ceiling >= top,
            "originator {node}: ceiling {ceiling} < {top}"
        );
    }
    drop((to_nats, to_file, ingress));
    runtime.block_on(async {
        delete_stream(&nats_url(), &out_stream).await;
        delete_stream(&nats_url(), &in_stream).await;
    });
    let _ = std::fs::remove_file(&jsonl);
}

/// Asynchronous replication: no commit waits, and the rows the standby never
/// received are lost from the store with the primary (asynchronous
/// replication's own loss window, acknowledged to the writer). At commit the
/// bridge has forwarded them (phantoms); in standby-flush mode, which without
/// `synchronous_standby_names` waits for every streaming standby, it has not.
#[test]
fn asynchronous_replication_standby_flush_forwards_no_phantom() {
    for (mode, phantoms_expected) in [("commit", true), ("standby-flush", false)] {
        let (pair, bridge, path) = unreplicated_rows_then_failover(Some(mode), false);
        let kept = store(&pair.standby);
        let lost_from_store = (2..=CANCELLED + 1)
            .filter(|seq| !kept.contains_key(&format!("950:{seq}")))
            .count();
        let found = phantoms(&pair, &path);
        println!(
            "asynchronous, {mode}: {lost_from_store} acknowledged rows not replicated (lost from \
             the store), {} phantom(s) on the sink",
            found.len()
        );
        assert_eq!(
            lost_from_store, CANCELLED as usize,
            "the loss window of asynchronous replication"
        );
        assert_eq!(
            !found.is_empty(),
            phantoms_expected,
            "{mode}: {found:?}\n{}",
            bridge.log_text()
        );
        if !phantoms_expected {
            assert!(bridge
                .log_text()
                .contains("0 of the 1 streaming standbys have flushed the batch's WAL"));
        }
        let _ = std::fs::remove_file(&path);
    }
}

/// A role made with `grant_consumer` sees no LSNs of other users' rows in
/// `pg_stat_replication`, but does through `standby_flush_positions()`, which
/// is what standby-flush mode reads.
#[test]
fn a_consumer_role_sees_the_standbys_flush_positions() {
    let pair = Pair::start("fo_role");
    let mut admin = pair.primary.client(DB);
    admin
        .batch_execute(
            "CREATE ROLE fo_bridge LOGIN; SELECT envelopes.grant_consumer('fo_bridge');
             GRANT USAGE ON SCHEMA envelopes TO fo_bridge",
        )
        .unwrap();
    let mut bridge_role = postgres::Client::connect(
        &format!(
            "host=127.0.0.1 port={} user=fo_bridge dbname={DB}",
            pair.primary.port
        ),
        postgres::NoTls,
    )
    .unwrap();
    let hidden: i64 = bridge_role
        .query_one(
            "SELECT count(*) FROM pg_stat_replication WHERE flush_lsn IS NOT NULL",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(hidden, 0, "pg_stat_replication hides the standby's LSNs");
    let row = bridge_role
        .query_one(
            "SELECT application_name, sync_state, flush_lsn IS NOT NULL
               FROM envelopes.standby_flush_positions()",
            &[],
        )
        .unwrap();
    assert_eq!(
        (
            row.get::<_, String>(0),
            row.get::<_, String>(1),
            row.get::<_, bool>(2)
        ),
        ("s1".to_owned(), "sync".to_owned(), true)
    );
}
