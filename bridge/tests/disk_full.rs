//! The JSONL sink on a full filesystem: a 4 MiB tmpfs (mounted by the test, which
//! runs as root like the rest of the suite) almost filled by a ballast file, and
//! writers committing envelopes at about 120 rows a second while the bridge
//! writes them there. When the disk fills, the bridge must stall — acknowledge
//! nothing it could not write, leave no torn line, say so (`sink_stalled`,
//! `errors_total`, /readyz, the log naming ENOSPC) — and resume when the ballast
//! is removed. The checker then counts lost, duplicates and order violations
//! per originator from what the writers were told and what the file holds.
//!
//! On 211056c (before the fix) this lost 2,465 of 3,539 rows in the run:
//! tokio's `File::write_all` hands the bytes to a background write whose ENOSPC
//! `sync_data` never reported, so every batch was acknowledged.

mod common;

use common::checker::{self, Item};
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// A small tmpfs mounted for the test, unmounted (lazily) on drop.
struct Tmpfs {
    dir: PathBuf,
}

impl Tmpfs {
    fn mount(size: &str) -> Tmpfs {
        let dir = std::env::temp_dir().join(unique("tmpfs"));
        std::fs::create_dir_all(&dir).unwrap();
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&dir)
            .status()
            .expect("run mount");
        assert!(
            status.success(),
            "mount -t tmpfs failed ({status}): this test needs root, as the rest of the suite"
        );
        Tmpfs { dir }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// Bytes still free on the filesystem holding `dir` (from `df`).
fn free_bytes(dir: &Path) -> u64 {
    let out = Command::new("df")
        .args(["--output=avail", "-B1"])
        .arg(dir)
        .output()
        .expect("run df");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .nth(1)
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or(0)
}

/// Every line of the file: the parsed rows as checker items (key = originator),
/// and the lines no JSON reader could take for a row.
fn read_jsonl(path: &Path) -> (Vec<Item>, Vec<String>) {
    let bytes = std::fs::read(path).unwrap_or_default();
    let text = String::from_utf8_lossy(&bytes);
    let mut items = Vec::new();
    let mut torn = Vec::new();
    for (i, line) in text.split_inclusive('\n').enumerate() {
        let parsed = line
            .strip_suffix('\n')
            .and_then(|l| serde_json::from_str::<serde_json::Value>(l).ok());
        match parsed {
            Some(v) => items.push(Item {
                key: v["originator_node_id"].to_string(),
                seq: v["originator_sequence_id"].as_i64().unwrap_or(-1),
                id: v["id"].as_str().unwrap_or_default().to_owned(),
                bytes: hex_decode(v["originator_envelope"].as_str().unwrap_or_default()),
            }),
            None => torn.push(format!("line {}: {:.80}", i + 1, line)),
        }
    }
    (items, torn)
}

fn hex_decode(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .filter_map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok())
        .collect()
}

/// The envelope blob of (node, seq): 500 bytes, so that a line is about 1.2 KB
/// and the free space runs out within seconds.
fn blob(node: i32, seq: i64) -> Vec<u8> {
    let mut b = format!("{node}:{seq}:").into_bytes();
    b.resize(500, b'x');
    b
}

#[test]
fn a_full_disk_stalls_the_jsonl_sink_and_loses_nothing() {
    let fs = Tmpfs::mount("4m");
    // Leave about 256 KiB free: some 200 rows fit, then the disk is full.
    let ballast = fs.dir.join("ballast");
    let free = free_bytes(&fs.dir);
    assert!(free > 1 << 20, "the tmpfs has {free} bytes free");
    std::fs::write(&ballast, vec![0u8; (free - (256 << 10)) as usize]).unwrap();

    let db = TestDb::new("diskfull");
    let path = fs.dir.join("out.jsonl");
    let metrics = free_port();
    let addr = format!("127.0.0.1:{metrics}");
    let mut bridge = Bridge::egress(
        &db,
        "diskfull",
        &format!("jsonl:{}", path.display()),
        &["--metrics-addr", &addr, "--ready-after", "2"],
        &[],
    );

    // Two writers (originators 1 and 2), about 60 rows a second each, for 8 s.
    let acknowledged = Arc::new(Mutex::new(Vec::<Item>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (1..=2)
        .map(|node: i32| {
            let (acknowledged, stop, conninfo) =
                (acknowledged.clone(), stop.clone(), db.conninfo());
            thread::spawn(move || {
                let mut c = postgres::Client::connect(&conninfo, postgres::NoTls).unwrap();
                let mut seq = 0i64;
                while !stop.load(Ordering::Relaxed) {
                    seq += 1;
                    let bytes = blob(node, seq);
                    let n: i64 = c
                        .query_one(
                            "SELECT envelopes.insert_gateway_envelope($1, $2, '\\x01', $3)",
                            &[&node, &seq, &bytes],
                        )
                        .expect("insert")
                        .get(0);
                    assert_eq!(n, 1);
                    acknowledged.lock().unwrap().push(Item {
                        key: node.to_string(),
                        seq,
                        id: format!("{node}:{seq}"),
                        bytes,
                    });
                    thread::sleep(Duration::from_millis(16));
                }
            })
        })
        .collect();
    let started = Instant::now();
    // While the disk is full (and the writers go on): the bridge holds the
    // rows, says it is stalled, and is not ready.
    let mut stalled_seen = false;
    let mut not_ready_seen = false;
    let mut pending_while_full = 0;
    // At least 8 s, and until the disk has been full for 3 s: a loaded machine
    // writes more slowly and fills the disk later (capped at 60 s).
    let mut full_since: Option<Instant> = None;
    while started.elapsed() < Duration::from_secs(60)
        && (started.elapsed() < Duration::from_secs(8)
            || full_since.is_none_or(|t| t.elapsed() < Duration::from_secs(3)))
    {
        thread::sleep(Duration::from_millis(250));
        let text = try_scrape(metrics);
        stalled_seen |= metric(&text, "envelopes_bridge_sink_stalled") == 1.0;
        not_ready_seen |= http_get(metrics, "/readyz").0 == 503;
        if free_bytes(&fs.dir) < 8 << 10 {
            full_since.get_or_insert_with(Instant::now);
            pending_while_full = pending_while_full.max(lag(&db, "diskfull"));
        }
    }
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.join().unwrap();
    }
    thread::sleep(Duration::from_secs(3));
    let text = try_scrape(metrics);
    stalled_seen |= metric(&text, "envelopes_bridge_sink_stalled") == 1.0;
    not_ready_seen |= http_get(metrics, "/readyz").0 == 503;
    let pending_full = lag(&db, "diskfull");
    let errors = metric(&text, "envelopes_bridge_errors_total{kind=\"transient\"}");
    let (_, torn_while_full) = read_jsonl(&path);

    // Space comes back: the bridge resumes by itself and drains.
    std::fs::remove_file(&ballast).unwrap();
    let drained = {
        let deadline = Instant::now() + Duration::from_secs(60);
        while lag(&db, "diskfull") != 0 && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(200));
        }
        lag(&db, "diskfull") == 0
    };
    thread::sleep(Duration::from_millis(500));
    let (delivered, torn) = read_jsonl(&path);
    let acknowledged = acknowledged.lock().unwrap().clone();
    let mut store = acknowledged.clone();
    store.sort_by(|a, b| a.id.cmp(&b.id));
    let counts = checker::check(&acknowledged, &store, &delivered);
    let total = checker::total(&counts);
    let table = checker::table("JSONL sink on a full tmpfs", &counts);
    println!("{table}");
    let log = bridge.log_text();
    bridge.terminate();

    assert!(
        full_since.is_some(),
        "the disk never filled up in 60 s of writing:\n{table}"
    );
    assert_eq!(
        total.lost, 0,
        "rows acknowledged by the bridge but not in the file:\n{table}"
    );
    assert!(
        torn_while_full.is_empty() && torn.is_empty(),
        "lines a reader would take for a row, or fail on: {torn_while_full:?} {torn:?}"
    );
    assert_eq!(total.phantom, 0, "{table}");
    assert_eq!(
        total.duplicates, 0,
        "a cut-back batch left rows behind:\n{table}"
    );
    assert_eq!(total.order_violations, 0, "{table}");
    assert!(
        pending_full > 0 && pending_while_full > 0,
        "consumer_status shows nothing pending while the disk is full ({pending_full}, \
         {pending_while_full}): the sink acknowledged rows it did not write"
    );
    assert!(
        drained,
        "the bridge did not resume once space returned:\n{log}"
    );
    assert!(stalled_seen, "sink_stalled never showed the stall:\n{text}");
    assert!(not_ready_seen, "/readyz stayed 200 while the disk was full");
    assert!(
        errors >= 1.0,
        "errors_total{{kind=\"transient\"}} = {errors}:\n{text}"
    );
    assert!(
        log.contains("No space left on device"),
        "the log does not name the full disk:\n{log}"
    );
}
