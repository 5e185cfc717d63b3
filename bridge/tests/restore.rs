//! A bridge resumes against a restored database where it stopped: the store
//! dumped with `pg_dump` after the bridge was stopped, restored with
//! `pg_restore` into a new database, the bridge started against it with the
//! same JSON lines file; rows written before, during and after (late ones and
//! outbox rows included) are each in the file exactly once.

mod common;

use common::*;
use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

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

fn pg_bin(tool: &str) -> String {
    let dir = std::env::var("PG_BIN").unwrap_or_else(|_| "/usr/lib/postgresql/15/bin".into());
    format!("{dir}/{tool}")
}

fn run(cmd: &mut Command) {
    let out = cmd.output().expect("run a client program");
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Rows of every kind: in order on three originators, late ones, outbox rows.
fn write(c: &mut postgres::Client, from: i64, count: i64) {
    for i in from..from + count {
        for node in 1..=3 {
            insert(c, node, i * 10);
        }
        if i % 5 == 0 {
            insert(c, 1, i * 10 - 25); // below what is committed: late
            c.execute("SELECT envelopes.publish('orders', '\\x7b7d')", &[])
                .unwrap();
        }
    }
}

/// An empty database (no extension: the restore creates it), dropped on drop.
struct Target {
    db: TestDb,
}

impl Target {
    fn new() -> Target {
        let db = TestDb::new("restored");
        db.client()
            .batch_execute(
                "DROP EXTENSION pg_envelopes CASCADE; DROP SCHEMA IF EXISTS envelopes CASCADE",
            )
            .unwrap();
        Target { db }
    }
}

#[test]
fn a_bridge_resumes_against_a_restored_database_with_no_gap_and_no_duplicate() {
    let source = TestDb::new("dumped");
    let mut c = source.client();
    write(&mut c, 1, 20);
    let path = std::env::temp_dir().join(format!("{}.jsonl", unique("restore")));
    let sink = format!("jsonl:{}", path.display());
    let mut bridge = Bridge::egress(&source, "b", &sink, &[], &[]);
    write(&mut c, 21, 20);
    wait_until(
        "the bridge forwards the source's rows",
        Duration::from_secs(60),
        || {
            let got: BTreeSet<String> = jsonl_ids(&path).into_iter().collect();
            committed_ids(&source).is_subset(&got)
        },
    );
    // More rows while it runs, then stop it (the docs: stop, dump, restore).
    write(&mut c, 41, 10);
    std::thread::sleep(Duration::from_millis(300));
    bridge.terminate();
    write(&mut c, 51, 10); // committed after the bridge stopped: in the dump only

    let dump = std::env::temp_dir().join(format!("{}.dump", unique("restore")));
    run(Command::new(pg_bin("pg_dump"))
        .args(["-Fc", "-d", &source.conninfo(), "-f"])
        .arg(&dump));
    let target = Target::new();
    run(Command::new(pg_bin("pg_restore"))
        .args([
            "--single-transaction",
            "--exit-on-error",
            "-d",
            &target.db.conninfo(),
        ])
        .arg(&dump));
    let _ = std::fs::remove_file(&dump);

    let _bridge = Bridge::egress(&target.db, "b", &sink, &[], &[]);
    let mut t = target.db.client();
    write(&mut t, 61, 20); // after the restore, late rows and a new band included
    insert(&mut t, 2, 5_000_000);
    insert(&mut t, 7, 1);
    let expected = committed_ids(&target.db);
    wait_until(
        "the bridge forwards every row of the restored database",
        Duration::from_secs(60),
        || {
            let got: BTreeSet<String> = jsonl_ids(&path).into_iter().collect();
            expected.is_subset(&got)
        },
    );
    std::thread::sleep(Duration::from_millis(500));
    let ids = jsonl_ids(&path);
    let unique_ids: BTreeSet<String> = ids.iter().cloned().collect();
    assert_eq!(
        ids.len(),
        unique_ids.len(),
        "a row forwarded twice across the restore"
    );
    assert_eq!(unique_ids, expected, "exactly the committed rows");
    let _ = std::fs::remove_file(&path);
}
