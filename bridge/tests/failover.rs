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
        admin
            .batch_execute("ALTER SYSTEM SET synchronous_standby_names = 's1'")
            .unwrap();
        admin.batch_execute("SELECT pg_reload_conf()").unwrap();
        wait_until(
            "the standby to stream as the synchronous one",
            Duration::from_secs(30),
            || {
                primary
                    .client("postgres")
                    .query_one(
                        "SELECT count(*) FROM pg_stat_replication
                          WHERE application_name = 's1' AND state = 'streaming'
                            AND sync_state = 'sync'",
                        &[],
                    )
                    .map(|r| r.get::<_, i64>(0) == 1)
                    .unwrap_or(false)
            },
        );
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
/// primary all the same (Postgres says so in a warning). The bridge's own reads
/// and acknowledgements write (a row lock), so their commits wait too and are
/// cancelled as well.
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
    let pair = Pair::start(&format!("fo_{}", mode.unwrap_or("auto").replace('-', "_")));
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

    assert!(canceller.stop() >= CANCELLED as u64);
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
        status.contains("synchronous_standby_names = ''")
            && status
                .contains("in standby-flush mode a batch read now waits: no standby is connected"),
        "{status}"
    );
    let _ = std::fs::remove_file(&path);
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
