//! A lease that follows the bridge's health, not only its TCP session: the
//! active bridge is stopped with SIGSTOP while rows are written. Its session
//! falls silent, the server ends it after `--session-timeout` (set by the
//! bridge on its own session), which frees the lease: the standby takes over
//! within seconds. When the stopped bridge resumes, its session is gone, so it
//! acknowledges nothing: it stands by. Nothing is lost.
//!
//! On 211056c a stopped active bridge was never replaced (its TCP session
//! stays up: the kernel still answers).
//!
//! The second test stops an active bridge whose own session the server never
//! ends (`--session-timeout 0`: the server's settings, no idle timeouts): the
//! standby sees in `pg_stat_activity` that the holder has been silent for
//! longer than its own `--session-timeout` (envelopes.lease_timeout), ends that
//! session and takes the lease. The resumed bridge finds its session gone and
//! acknowledges nothing; the delivery log never goes back in time. On 211056c
//! (and before envelopes.lease_timeout) the standby waited for as long as the
//! holder was stopped.

mod common;

use common::checker::{self, Item};
use common::target::jsonl_ids;
use common::*;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

fn signal(bridge: &Bridge, sig: &str) {
    let status = Command::new("kill")
        .args([sig, &bridge.child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill {sig}");
}

#[test]
fn a_stopped_active_bridge_loses_its_lease_to_the_standby_within_seconds() {
    // A bridge from before the option (ENVELOPES_TEST_BRIDGE_BIN) runs
    // without it.
    let timeout = std::env::var_os("ENVELOPES_TEST_BRIDGE_BIN")
        .is_none()
        .then_some("3");
    stop_the_active("sigstop", timeout, timeout);
}

#[test]
fn a_standby_ends_a_stopped_holder_whose_session_the_server_keeps() {
    stop_the_active("sigstopkept", Some("0"), Some("3"));
}

/// The active bridge (with `--session-timeout` `active_timeout`) stopped while
/// rows are written, a standby (`standby_timeout`) beside it: the standby takes
/// over within 10 s, nothing is lost, the resumed one stands by.
fn stop_the_active(label: &str, active_timeout: Option<&str>, standby_timeout: Option<&str>) {
    let db = TestDb::new(label);
    let (pa, pb) = (
        std::env::temp_dir().join(format!("{}.jsonl", unique("stopa"))),
        std::env::temp_dir().join(format!("{}.jsonl", unique("stopb"))),
    );
    let (ma, mb) = (free_port(), free_port());
    let args = |metrics: u16, timeout: Option<&str>| {
        let mut args = vec!["--metrics-addr".to_owned(), format!("127.0.0.1:{metrics}")];
        if let Some(timeout) = timeout {
            args.extend(["--session-timeout".to_owned(), timeout.to_owned()]);
        }
        args
    };
    let (args_a, args_b) = (args(ma, active_timeout), args(mb, standby_timeout));
    let mut active = Bridge::egress(
        &db,
        "stop",
        &format!("jsonl:{}", pa.display()),
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
        "stop",
        &format!("jsonl:{}", pb.display()),
        &args_b.iter().map(String::as_str).collect::<Vec<_>>(),
        &[],
    );
    wait_until("the standby's metrics", Duration::from_secs(30), || {
        !try_scrape(mb).is_empty()
    });

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
    signal(&active, "-STOP");
    let stopped = Instant::now();
    let mut taken_over = None;
    while stopped.elapsed() < Duration::from_secs(30) {
        if metric(&try_scrape(mb), "envelopes_bridge_active") == 1.0 {
            taken_over = Some(stopped.elapsed());
            break;
        }
        thread::sleep(Duration::from_millis(100));
    }
    thread::sleep(Duration::from_secs(2));
    signal(&active, "-CONT");
    thread::sleep(Duration::from_secs(3));
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    let written = *written.lock().unwrap();
    let drained = {
        let start = Instant::now();
        while lag(&db, "stop") != 0 && start.elapsed() < Duration::from_secs(30) {
            thread::sleep(Duration::from_millis(200));
        }
        lag(&db, "stop") == 0
    };
    let resumed_active = metric(&try_scrape(ma), "envelopes_bridge_active");
    let (log_a, log_b) = (active.log_text(), standby.log_text());
    active.terminate();
    standby.terminate();
    let (delivered_a, delivered_b) = (jsonl_ids(&pa), jsonl_ids(&pb));
    let items_of = |ids: &[String]| -> Vec<Item> {
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
    };
    let mut delivered = delivered_a.clone();
    delivered.extend(delivered_b.iter().cloned());
    let items: Vec<Item> = delivered
        .iter()
        .filter_map(|id| {
            let (node, seq) = id.split_once(':')?;
            Some(Item {
                key: node.to_owned(),
                seq: seq.parse().ok()?,
                id: id.clone(),
                bytes: Vec::new(),
            })
        })
        .collect();
    let acked: Vec<Item> = (1..=written)
        .map(|seq| Item {
            key: "1".into(),
            seq,
            id: format!("1:{seq}"),
            bytes: Vec::new(),
        })
        .collect();
    // Acknowledged batches in the order they were acknowledged: the rows'
    // commit times never go back (a late acknowledgement of the stopped
    // bridge's batch would).
    let log_order: Vec<(i64, bool)> = db
        .client()
        .query(
            "SELECT id, committed_to < max(committed_to) OVER (ORDER BY id ROWS BETWEEN \
             UNBOUNDED PRECEDING AND 1 PRECEDING) FROM envelopes.delivery_log \
             WHERE consumer = 'stop' AND rows > 0 ORDER BY id",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get::<_, Option<bool>>(1).unwrap_or(false)))
        .collect();
    let counts = checker::check(&acked, &acked, &items);
    // Each bridge delivered in order (per originator) what it delivered.
    let out_of_order: usize = [&delivered_a, &delivered_b]
        .iter()
        .map(|ids| {
            let each = checker::check(&acked, &acked, &items_of(ids));
            checker::total(&each).order_violations
        })
        .sum();
    let total = checker::total(&counts);
    let table = checker::table("SIGSTOP of the active bridge", &counts);
    println!("{table}\ntaken over after {taken_over:?}");
    assert!(
        taken_over.is_some_and(|t| t < Duration::from_secs(10)),
        "the standby did not take over within 10 s of SIGSTOP ({taken_over:?}):\n{log_b}"
    );
    assert_eq!(total.lost, 0, "{table}");
    assert_eq!(out_of_order, 0, "a bridge delivered out of order:\n{table}");
    assert!(
        log_order.iter().all(|(_, back)| !back),
        "an acknowledgement went back in time (delivery_log ids {:?}):\n{log_a}",
        log_order
            .iter()
            .filter(|(_, back)| *back)
            .map(|(id, _)| id)
            .collect::<Vec<_>>()
    );
    assert!(drained, "rows still pending:\n{log_b}");
    assert_eq!(
        resumed_active, 0.0,
        "the resumed bridge is active again beside the one that took over:\n{log_a}"
    );
    let _ = std::fs::remove_file(&pa);
    let _ = std::fs::remove_file(&pb);
}
