//! The router (pg_envelopes_router over PL/Proxy) against real shards on
//! loopback: `scripts/test.sh` runs `scripts/shards.sh up 4` (and `add` for one
//! spare shard) and exports `ENVELOPES_TEST_SHARDS`, the path of its env file.
//!
//! - rows inserted through the router (single and batch) land only on the shard
//!   the map gives their originator, and every read through the router equals one
//!   node loaded with the same rows, over a grid of cursors, filters and limits;
//! - a shard down: its originators fail with a clear error, the others go on,
//!   and after it is back a retry completes what failed, each row once;
//! - a partition moved to the spare shard while writers go on: every
//!   acknowledged row is read back once, from the new shard.
//!
//! The tests share the shards, so they take a lock and run one at a time.

use pg_envelopes_tests::{sqlstate, TestDb};
use postgres::{Client, NoTls};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

static SHARED: Mutex<()> = Mutex::new(());
static COUNTER: AtomicU32 = AtomicU32::new(0);

/// The servers `scripts/shards.sh` started: the shards' (as connection strings
/// without a database), the spare's and the proxy's.
struct Servers {
    proxy: String,
    shards: Vec<String>,
    spare: Option<String>,
    dir: PathBuf,
}

impl Servers {
    fn load() -> Servers {
        let path = std::env::var("ENVELOPES_TEST_SHARDS").unwrap_or_else(|_| {
            panic!("ENVELOPES_TEST_SHARDS is not set: run through scripts/test.sh (scripts/shards.sh up 4)")
        });
        let text = std::fs::read_to_string(&path).expect("read the shards env file");
        let (mut proxy, mut shards, mut spare) = (String::new(), Vec::new(), None);
        let strip = |s: &str| {
            s.replace(" dbname=envelopes", "")
                .replace(" user=postgres", "")
        };
        for line in text.lines() {
            if let Some(v) = line.strip_prefix("PROXY_CONNSTR=") {
                proxy = strip(v.trim_matches('"'));
            } else if let Some(v) = line.strip_prefix("SHARD_CONNSTRS=(") {
                shards = v
                    .trim_end_matches(')')
                    .split('"')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(strip)
                    .collect();
            } else if line.starts_with("EXTRA_PORT_") {
                let port = line.split('=').nth(1).unwrap();
                spare = Some(format!("host=127.0.0.1 port={port}"));
            }
        }
        assert!(
            !proxy.is_empty() && !shards.is_empty(),
            "bad env file {path}"
        );
        let dir = PathBuf::from(path).parent().unwrap().to_owned();
        Servers {
            proxy,
            shards,
            spare,
            dir,
        }
    }

    fn pg_ctl(&self, shard: usize, action: &str) {
        let data = self.dir.join(format!("shard{shard}/data"));
        let log = self.dir.join(format!("shard{shard}/server.log"));
        // The server binaries scripts/lib.sh starts the shards with (PG_BIN).
        let pg_ctl = format!(
            "{}/pg_ctl",
            std::env::var("PG_BIN").unwrap_or_else(|_| "/usr/lib/postgresql/15/bin".into())
        );
        let status = std::process::Command::new("runuser")
            .args(["-u", "postgres", "--", &pg_ctl, "-D"])
            .arg(&data)
            .arg("-l")
            .arg(&log)
            .args(["-w", "-m", "fast", action])
            .stdout(std::process::Stdio::null())
            .status()
            .expect("pg_ctl");
        assert!(status.success(), "pg_ctl {action} shard{shard}");
    }
}

/// A sharded store of one test's own: a database with pg_envelopes on every
/// shard server (and on the spare, outside the map), and a proxy database with
/// the router set to the shards' databases. Dropped when the test ends.
struct Cluster {
    name: String,
    servers: Servers,
    /// Every shard database's connection string, the spare's last when asked for.
    shards: Vec<String>,
    spare: Option<String>,
    proxy: String,
}

impl Cluster {
    fn new(label: &str, with_spare: bool) -> Cluster {
        let servers = Servers::load();
        let name = format!(
            "r_{label}_{}_{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let create = |server: &str, extension: &str| {
            let mut admin = connect(&format!("{server} dbname=postgres user=postgres"));
            admin
                .batch_execute(&format!("CREATE DATABASE \"{name}\""))
                .unwrap();
            let connstr = format!("{server} dbname={name}");
            connect(&format!("{connstr} user=postgres"))
                .batch_execute(&format!(
                    "SET client_min_messages = warning; CREATE EXTENSION {extension} CASCADE"
                ))
                .unwrap();
            connstr
        };
        let mut shards: Vec<String> = servers
            .shards
            .iter()
            .map(|s| create(s, "pg_envelopes"))
            .collect();
        let spare = if with_spare {
            let s = create(
                servers
                    .spare
                    .as_ref()
                    .expect("a spare shard (scripts/shards.sh add)"),
                "pg_envelopes",
            );
            Some(s)
        } else {
            None
        };
        let proxy = create(&servers.proxy, "pg_envelopes_router");
        connect(&format!("{proxy} user=postgres"))
            .query("SELECT envelopes_router.set_shards($1, 16)", &[&shards])
            .unwrap();
        shards.extend(spare.clone());
        Cluster {
            name,
            servers,
            shards,
            spare,
            proxy,
        }
    }

    fn proxy(&self) -> Client {
        connect(&format!("{} user=postgres", self.proxy))
    }

    fn shard(&self, i: usize) -> Client {
        connect(&format!("{} user=postgres", self.shards[i]))
    }

    /// The index of the shard the router's map gives an originator.
    fn shard_of(&self, proxy: &mut Client, originator: i32) -> usize {
        let connstr: String = proxy
            .query_one("SELECT envelopes_router.shard_of($1)", &[&originator])
            .unwrap()
            .get(0);
        self.shards.iter().position(|s| *s == connstr).unwrap()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::env::var_os("ENVELOPES_TEST_KEEP").is_some() {
            eprintln!("kept databases {}", self.name);
            return;
        }
        let mut servers = self.servers.shards.clone();
        servers.extend(self.servers.spare.clone());
        servers.push(self.servers.proxy.clone());
        for server in servers {
            if let Ok(mut admin) =
                Client::connect(&format!("{server} dbname=postgres user=postgres"), NoTls)
            {
                let _ = admin.batch_execute(&format!(
                    "DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)",
                    self.name
                ));
            }
        }
    }
}

fn connect(connstr: &str) -> Client {
    Client::connect(
        &format!("{connstr} options='-c statement_timeout=120s'"),
        NoTls,
    )
    .unwrap_or_else(|e| panic!("connect {connstr}: {e}"))
}

type Row = (
    i32,
    i64,
    std::time::SystemTime,
    Vec<u8>,
    Option<i32>,
    Option<i64>,
    Vec<u8>,
);

fn rows(c: &mut Client, sql: &str) -> Vec<Row> {
    c.query(sql, &[])
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .iter()
        .map(|r| {
            (
                r.get(0),
                r.get(1),
                r.get(2),
                r.get(3),
                r.get(4),
                r.get(5),
                r.get(6),
            )
        })
        .collect()
}

/// The rows of the routing test: sequences 1..=30 and 1,000,001..=1,000,010 (two
/// bands), topics cycling over four, a payer and an expiry on some, one fixed
/// gateway time so both sides store the same value.
fn data(originators: std::ops::RangeInclusive<i32>) -> Vec<Input> {
    let mut out = Vec::new();
    for o in originators {
        for s in (1..=30).chain(1_000_001..=1_000_010) {
            let topic = vec![b't', ((o as i64 + s) % 4) as u8];
            let payer = (s % 3 == 0).then_some(o * 10);
            let expiry = (s % 5 == 0).then_some(1_900_000_000 + s);
            out.push((o, s, topic, payer, expiry));
        }
    }
    out
}

/// An envelope to insert: originator, sequence, topic, payer, expiry.
type Input = (i32, i64, Vec<u8>, Option<i32>, Option<i64>);

const GATEWAY_TIME: &str = "2026-11-01 00:00:00+00";

fn insert_batch(c: &mut Client, batch: &[Input]) -> Result<i64, postgres::Error> {
    let ids: Vec<i32> = batch.iter().map(|r| r.0).collect();
    let seqs: Vec<i64> = batch.iter().map(|r| r.1).collect();
    let topics: Vec<Vec<u8>> = batch.iter().map(|r| r.2.clone()).collect();
    let envs: Vec<Vec<u8>> = batch
        .iter()
        .map(|r| format!("env {} {}", r.0, r.1).into_bytes())
        .collect();
    let payers: Vec<Option<i32>> = batch.iter().map(|r| r.3).collect();
    let expiries: Vec<Option<i64>> = batch.iter().map(|r| r.4).collect();
    c.query_one(
        &format!(
            "SELECT envelopes.insert_gateway_envelopes($1, $2, $3, $4, $5,
                 array_fill('{GATEWAY_TIME}'::timestamptz, ARRAY[cardinality($1::int[])]), $6)"
        ),
        &[&ids, &seqs, &topics, &envs, &payers, &expiries],
    )
    .map(|r| r.get(0))
}

fn insert_one(c: &mut Client, r: &Input) -> i64 {
    c.query_one(
        &format!(
            "SELECT envelopes.insert_gateway_envelope($1, $2, $3, $4, $5, '{GATEWAY_TIME}', $6)"
        ),
        &[
            &r.0,
            &r.1,
            &r.2,
            &format!("env {} {}", r.0, r.1).into_bytes(),
            &r.3,
            &r.4,
        ],
    )
    .unwrap()
    .get(0)
}

/// A statistics counter read until `done` holds or 10 s have passed (function
/// statistics reach the view once the calling backend is idle); the last value.
fn settled(mut read: impl FnMut() -> i64, done: impl Fn(i64) -> bool) -> i64 {
    let mut value = read();
    for _ in 0..50 {
        if done(value) {
            break;
        }
        thread::sleep(Duration::from_millis(200));
        value = read();
    }
    value
}

fn array<T: ToString>(v: &[T]) -> String {
    format!(
        "'{{{}}}'",
        v.iter().map(T::to_string).collect::<Vec<_>>().join(",")
    )
}

#[test]
fn the_router_places_rows_by_originator_and_reads_like_one_node() {
    let _guard = SHARED.lock().unwrap_or_else(|e| e.into_inner());
    let shards = Cluster::new("route", false);
    let mut proxy = shards.proxy();
    let reference = TestDb::new("router_ref");
    let mut one = reference.connect();
    let rows_in = data(1..=64);

    // Odd originators one row at a time, even ones in batches that mix
    // originators of every shard (PL/Proxy splits them), ids going down inside.
    let (odd, even): (Vec<_>, Vec<_>) = rows_in.iter().cloned().partition(|r| r.0 % 2 == 1);
    for r in &odd {
        assert_eq!(insert_one(&mut proxy, r), 1);
    }
    let mut even = even;
    even.reverse();
    let mut inserted = 0;
    for chunk in even.chunks(97) {
        inserted += insert_batch(&mut proxy, chunk).unwrap();
    }
    assert_eq!(inserted as usize, even.len());
    // Again: every row exists, nothing is inserted twice.
    assert_eq!(insert_batch(&mut proxy, &rows_in[..200]).unwrap(), 0);
    assert_eq!(insert_one(&mut proxy, &rows_in[0]), 0);
    for chunk in rows_in.chunks(500) {
        insert_batch(&mut one, chunk).unwrap();
    }

    // Each shard holds exactly the originators the map gives it.
    let mut held = BTreeSet::new();
    for i in 0..shards.shards.len() {
        let mut shard = shards.shard(i);
        let originators: Vec<i32> = shard
            .query(
                "SELECT originator_node_id FROM envelopes.originator_ceilings()",
                &[],
            )
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        assert!(!originators.is_empty(), "shard {i} holds nothing");
        for o in originators {
            assert_eq!(
                shards.shard_of(&mut proxy, o),
                i,
                "originator {o} on shard {i}"
            );
            assert!(held.insert(o), "originator {o} on two shards");
        }
        let orphans: i64 = shard
            .query_one("SELECT count(*) FROM envelopes.orphaned_envelopes()", &[])
            .unwrap()
            .get(0);
        assert_eq!(orphans, 0);
    }
    assert_eq!(held, (1..=64).collect());

    // Reads through the router equal one node's, over a grid.
    let all: Vec<i32> = (1..=64).collect();
    let maxima: Vec<i64> = all.iter().map(|_| 1_000_010).collect();
    let cursors = [
        ("'{}'".to_owned(), "'{}'".to_owned()),
        (
            array(&[1, 2, 3, 10, 33]),
            array(&[5, 1_000_003, 0, 40, 1_000_010]),
        ),
        (array(&all), array(&maxima)),
        (array(&[7]), array(&[29])),
    ];
    let filters = [
        ("NULL", "NULL".to_owned()),
        (
            "ARRAY['\\x7400'::bytea, '\\x7402'::bytea]",
            "NULL".to_owned(),
        ),
        ("NULL", array(&[1, 2, 3, 17, 33, 64, 99])),
        ("ARRAY['\\x7401'::bytea]", array(&[4, 5, 6, 7])),
        ("NULL", "'{}'".to_owned()),
        ("'{}'::bytea[]", "NULL".to_owned()),
    ];
    let mut compared = 0;
    for (nodes, seqs) in &cursors {
        for (topics, originators) in &filters {
            for limit in [0, 1, 7, 25, 100, 1000, 5000] {
                let sql = format!(
                    "SELECT * FROM envelopes.select_gateway_envelopes({nodes}, {seqs}, {topics}, {originators}, {limit})"
                );
                let routed = rows(&mut proxy, &sql);
                let local = rows(&mut one, &sql);
                if routed != local {
                    let first = routed.iter().zip(&local).position(|(a, b)| a != b);
                    panic!(
                        "{sql}: {} rows through the router, {} on one node, first difference at {first:?}",
                        routed.len(),
                        local.len()
                    );
                }
                compared += routed.len();
            }
        }
    }
    assert!(compared > 10_000, "the grid compared only {compared} rows");

    // xmtpd's read shapes through the router equal one node's too.
    let entries: [(u8, i32, i64); 8] = [
        (0, 1, 0),
        (1, 1, 5),
        (2, 2, 0),
        (0, 10, 20),
        (3, 33, 1_000_003),
        (1, 64, 0),
        (2, 17, 29),
        (3, 99, 0),
    ];
    let topics_of = |e: &[(u8, i32, i64)]| {
        format!(
            "ARRAY[{}]::bytea[]",
            e.iter()
                .map(|t| format!("'\\x74{:02x}'", t.0))
                .collect::<Vec<_>>()
                .join(",")
        )
    };
    let et = topics_of(&entries);
    let en = array(&entries.iter().map(|e| e.1).collect::<Vec<_>>());
    let es = array(&entries.iter().map(|e| e.2).collect::<Vec<_>>());
    let mut shapes = Vec::new();
    for (per_entry, limit) in [(1000, 1000), (3, 1000), (1000, 7), (5, 20), (0, 10), (2, 0)] {
        shapes.push(format!(
            "SELECT * FROM envelopes.select_by_topic_cursors({et}, {en}, {es}, {per_entry}, {limit})"
        ));
    }
    shapes.push(format!(
        "SELECT * FROM envelopes.select_by_topic_cursors({et}, {en}, {es}, 4, 30, commit_safe => true)"
    ));
    let ceiling_nodes = array(&[1, 2, 10, 33, 64, 17]);
    let ceiling_seqs = array(&[20, 1_000_005, 1_000_010, 1_000_010, 25, 0]);
    for (after_node, after_seq) in [
        ("NULL", "NULL"),
        ("2", "3"),
        ("33", "1000004"),
        ("64", "30"),
    ] {
        for limit in [1000, 9, 0] {
            shapes.push(format!(
                "SELECT * FROM envelopes.select_wave({et}, {en}, {es}, {ceiling_nodes}, {ceiling_seqs},
                     {after_node}, {after_seq}, {limit})"
            ));
        }
    }
    shapes.push(format!(
        "SELECT * FROM envelopes.select_wave({et}, {en}, {es}, {ceiling_nodes}, {ceiling_seqs},
             row_limit => 12, commit_safe => true)"
    ));
    for o in [1, 2, 33, 64, 99] {
        for (after, limit) in [(0, 1000), (15, 7), (1_000_005, 100), (0, 0), (30, 1)] {
            shapes.push(format!(
                "SELECT * FROM envelopes.select_originator({o}, {after}, {limit})"
            ));
        }
    }
    shapes.push("SELECT * FROM envelopes.select_originator(5, 10, 8, commit_safe => true)".into());
    shapes.push(
        "SELECT * FROM envelopes.select_newest_by_topic(
             ARRAY['\\x7400', '\\x7401', '\\x7402', '\\x7403', '\\x7499']::bytea[])"
            .into(),
    );
    let mut shaped = 0;
    for sql in &shapes {
        let routed = rows(&mut proxy, sql);
        let local = rows(&mut one, sql);
        assert_eq!(
            routed,
            local,
            "{sql}: {} rows through the router, {} on one node",
            routed.len(),
            local.len()
        );
        shaped += routed.len();
    }
    assert!(shaped > 400, "the shapes compared only {shaped} rows");
    let maxima_sql = "SELECT * FROM envelopes.originator_maxima(ARRAY[64, 1, 2, 33, 99, 7, 1])";
    let pairs = |c: &mut Client| -> Vec<(i32, i64)> {
        c.query(maxima_sql, &[])
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect()
    };
    let m = pairs(&mut proxy);
    assert_eq!(m, pairs(&mut one));
    assert_eq!(m.len(), 6);
    assert!(m.contains(&(99, 0)), "{m:?}");

    let ceilings = "SELECT * FROM envelopes.originator_ceilings()";
    let c1: Vec<(i32, i64)> = proxy
        .query(ceilings, &[])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let c2: Vec<(i32, i64)> = one
        .query(ceilings, &[])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(c1, c2);
    let parts = "SELECT originator_node_id, band_start, band_end, meta_partition::text, blob_partition::text
                   FROM envelopes.partitions() ORDER BY 1, 2";
    let p = |c: &mut Client| -> Vec<(i32, i64, i64, String, String)> {
        c.query(parts, &[])
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
            .collect()
    };
    assert_eq!(p(&mut proxy), p(&mut one));

    // Bad input: the SQLSTATEs one node gives.
    for (sql, state) in [
        ("SELECT * FROM envelopes.select_gateway_envelopes(row_limit => -1)", "22023"),
        ("SELECT * FROM envelopes.select_gateway_envelopes(row_limit => NULL)", "22004"),
        ("SELECT * FROM envelopes.select_originator(1, 0, -1)", "22023"),
        ("SELECT * FROM envelopes.select_originator(NULL)", "22004"),
        ("SELECT * FROM envelopes.select_by_topic_cursors('{\\x01}', '{1,2}', '{0,0}')", "2202E"),
        ("SELECT * FROM envelopes.select_wave('{}', '{}', '{}', '{}', '{}', after_node_id => 1)", "22004"),
        ("SELECT * FROM envelopes.select_newest_by_topic(ARRAY[NULL]::bytea[])", "22004"),
        ("SELECT * FROM envelopes.originator_maxima(ARRAY[1, NULL])", "22004"),
        ("SELECT envelopes.insert_gateway_envelope(1, 1, NULL, '\\x01')", "22004"),
        ("SELECT envelopes.insert_gateway_envelope(NULL, 1, '\\x01', '\\x01')", "22004"),
        ("SELECT envelopes.insert_gateway_envelopes('{1,2}', '{1}', '{\\x01,\\x01}', '{\\x01,\\x01}')", "2202E"),
        ("SELECT envelopes.insert_gateway_envelopes('{1,NULL}', '{1,2}', '{\\x01,\\x01}', '{\\x01,\\x01}')", "22004"),
    ] {
        let routed = proxy.query(sql, &[]).map(|_| ()).map_err(|e| sqlstate(&e));
        let local = one.query(sql, &[]).map(|_| ()).map_err(|e| sqlstate(&e));
        assert_eq!(routed, Err(state.to_owned()), "{sql} through the router");
        assert_eq!(local, Err(state.to_owned()), "{sql} on one node");
    }
    let empty: i64 = proxy
        .query_one(
            "SELECT envelopes.insert_gateway_envelopes('{}', '{}', '{}', '{}')",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(empty, 0);
}

#[test]
fn a_batch_without_the_optional_arrays_takes_each_shards_defaults() {
    let _guard = SHARED.lock().unwrap_or_else(|e| e.into_inner());
    let shards = Cluster::new("given", false);
    let mut proxy = shards.proxy();
    // Originators of every shard, ids going down, only the four required arrays
    // (the router sends just those and each shard fills in its defaults).
    let ids: Vec<i32> = (1..=24).rev().collect();
    let seqs: Vec<i64> = (1..=24).rev().map(|s| s * 10).collect();
    let topics: Vec<Vec<u8>> = ids.iter().map(|o| vec![0x74, *o as u8]).collect();
    let envs: Vec<Vec<u8>> = ids
        .iter()
        .map(|o| format!("given {o}").into_bytes())
        .collect();
    let call = "SELECT envelopes.insert_gateway_envelopes($1, $2, $3, $4)";
    let before: std::time::SystemTime = proxy.query_one("SELECT now()", &[]).unwrap().get(0);
    let n: i64 = proxy
        .query_one(call, &[&ids, &seqs, &topics, &envs])
        .unwrap()
        .get(0);
    assert_eq!(n, 24);
    let again: i64 = proxy
        .query_one(call, &[&ids, &seqs, &topics, &envs])
        .unwrap()
        .get(0);
    assert_eq!(again, 0, "a repeated batch inserts nothing");
    // A bad batch is still refused before any shard is called.
    let short = proxy.query_one(call, &[&ids, &seqs[..3].to_vec(), &topics, &envs]);
    assert_eq!(sqlstate(&short.unwrap_err()), "2202E");

    let mut seen = 0;
    for i in 0..shards.shards.len() {
        let mut shard = shards.shard(i);
        for row in shard
            .query(
                "SELECT originator_node_id, originator_sequence_id, payer_id, expiry,
                        gateway_time, originator_envelope
                   FROM envelopes.gateway_envelopes_view",
                &[],
            )
            .unwrap()
        {
            let o: i32 = row.get(0);
            assert_eq!(
                shards.shard_of(&mut proxy, o),
                i,
                "originator {o} on shard {i}"
            );
            assert_eq!(row.get::<_, i64>(1), i64::from(o) * 10);
            assert_eq!(row.get::<_, Option<i32>>(2), None, "no payer");
            assert_eq!(row.get::<_, Option<i64>>(3), None, "no expiry");
            let at: std::time::SystemTime = row.get(4);
            assert!(at >= before, "the gateway time is the shard's now()");
            assert_eq!(row.get::<_, Vec<u8>>(5), format!("given {o}").into_bytes());
            seen += 1;
        }
    }
    assert_eq!(seen, 24);
}

/// A batch of one originator without the optional arrays travels packed (one
/// base64 value for `insert_gateway_envelopes_packed` on the shard): what it stores,
/// what it returns and how it fails are one node's for the same batch, whatever
/// the bytes (NUL bytes, empty envelopes, one large enough for base64's line
/// breaks), with keys repeated in the batch, keys already stored and ids going
/// down. A batch with a NULL element takes the array path and is refused naming
/// the element. The packed form itself refuses a malformed value with 22P03.
#[test]
fn a_batch_of_one_originator_travels_packed_and_lands_like_one_node() {
    let _guard = SHARED.lock().unwrap_or_else(|e| e.into_inner());
    let shards = Cluster::new("packed", false);
    let mut proxy = shards.proxy();
    let reference = TestDb::new("router_packed_ref");
    let mut one = reference.connect();
    let node = 7i32;
    let home = shards.shard_of(&mut proxy, node);
    // Count the shard's calls of the packed form (function statistics).
    {
        let mut shard = shards.shard(home);
        let db: String = shard
            .query_one("SELECT current_database()", &[])
            .unwrap()
            .get(0);
        shard
            .batch_execute(&format!(
                "ALTER DATABASE \"{db}\" SET track_functions = 'all'"
            ))
            .unwrap();
    }
    let packed_calls_of = |function: &str| -> i64 {
        let mut shard = shards.shard(home);
        shard
            .query_one(
                "SELECT coalesce(sum(calls), 0)::bigint FROM pg_catalog.pg_stat_user_functions
                  WHERE funcname = $1",
                &[&function],
            )
            .unwrap()
            .get(0)
    };
    let packed_calls = || packed_calls_of("insert_gateway_envelopes_packed");
    let call = "SELECT envelopes.insert_gateway_envelopes($1, $2, $3, $4)";
    let batch =
        |c: &mut Client, seqs: &[i64], topics: &[Option<Vec<u8>>], envs: &[Option<Vec<u8>>]| {
            let nodes = vec![node; seqs.len()];
            c.query_one(call, &[&nodes, &seqs, &topics, &envs])
                .map(|r| r.get::<_, i64>(0))
        };
    let envelope = |seq: i64| -> Vec<u8> {
        match seq % 5 {
            0 => Vec::new(),
            1 => vec![0u8; 17],
            2 => (0..=255u8).collect(),
            3 => vec![0xa5; 70_000],
            _ => seq.to_be_bytes().to_vec(),
        }
    };
    let topic = |seq: i64| -> Vec<u8> { vec![(seq % 7) as u8; (seq % 40) as usize + 1] };
    // Some keys first, through each path.
    let early: Vec<i64> = vec![40, 2_000_003, 6];
    let early_topics: Vec<Option<Vec<u8>>> = early.iter().map(|&s| Some(topic(s))).collect();
    let early_envs: Vec<Option<Vec<u8>>> = early.iter().map(|&s| Some(envelope(s))).collect();
    assert_eq!(
        batch(&mut proxy, &early, &early_topics, &early_envs).unwrap(),
        3
    );
    assert_eq!(
        batch(&mut one, &early, &early_topics, &early_envs).unwrap(),
        3
    );
    // Ids going down across bands, repeated keys (the first occurrence counts),
    // and the keys stored above.
    let mut seqs: Vec<i64> = (1..=60).rev().map(|s| s * 50_001).collect();
    seqs.extend([6, 40, 2_000_003, 50_001, 50_001, 1]);
    let topics: Vec<Option<Vec<u8>>> = seqs.iter().map(|&s| Some(topic(s))).collect();
    let mut envs: Vec<Option<Vec<u8>>> = seqs.iter().map(|&s| Some(envelope(s))).collect();
    let last = envs.len() - 2;
    envs[last] = Some(b"a repeated key keeps its first row".to_vec());
    let before = packed_calls();
    let routed = batch(&mut proxy, &seqs, &topics, &envs).unwrap();
    let direct = batch(&mut one, &seqs, &topics, &envs).unwrap();
    assert_eq!(routed, direct, "the count one node returns");
    assert_eq!(routed, 61);
    assert_eq!(
        batch(&mut proxy, &seqs, &topics, &envs).unwrap(),
        0,
        "idempotent"
    );
    type Stored = (i32, i64, Vec<u8>, Option<i32>, Option<i64>, Vec<u8>);
    let stored = |c: &mut Client| -> Vec<Stored> {
        c.query(
            "SELECT originator_node_id, originator_sequence_id, topic, payer_id, expiry,
                    originator_envelope
               FROM envelopes.gateway_envelopes_view WHERE originator_node_id = $1
              ORDER BY 1, 2",
            &[&node],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4), r.get(5)))
        .collect()
    };
    assert_eq!(stored(&mut shards.shard(home)), stored(&mut one));
    // Statistics reach the view once the calling backend is idle.
    let calls = settled(packed_calls, |c| c >= before + 2);
    assert!(
        calls >= before + 2,
        "the batches went packed ({before} -> {calls} calls)"
    );

    // Refusals: the codes (and for elements, the messages) one node gives.
    let refused =
        |c: &mut Client, seqs: &[i64], topics: &[Option<Vec<u8>>], envs: &[Option<Vec<u8>>]| {
            let e = batch(c, seqs, topics, envs).unwrap_err();
            let message = e
                .as_db_error()
                .map(|d| d.message().to_owned())
                .unwrap_or_default();
            (sqlstate(&e), message)
        };
    type Case = (Vec<i64>, Vec<Option<Vec<u8>>>, Vec<Option<Vec<u8>>>);
    let cases: Vec<Case> = vec![
        // a NULL topic element: the array path, refused with its index
        (
            vec![90, 91],
            vec![Some(vec![1]), None],
            vec![Some(vec![1]), Some(vec![2])],
        ),
        // a NULL envelope element
        (
            vec![90, 91],
            vec![Some(vec![1]), Some(vec![1])],
            vec![None, Some(vec![2])],
        ),
        // a topic over envelopes.max_topic_bytes
        (
            vec![90, 91],
            vec![Some(vec![1]), Some(vec![1; 1025])],
            vec![Some(vec![1]), Some(vec![2])],
        ),
        // a negative sequence id
        (
            vec![90, -1],
            vec![Some(vec![1]), Some(vec![1])],
            vec![Some(vec![1]), Some(vec![2])],
        ),
    ];
    for (seqs, topics, envs) in &cases {
        let (code, message) = refused(&mut proxy, seqs, topics, envs);
        let (want_code, want_message) = refused(&mut one, seqs, topics, envs);
        assert_eq!(code, want_code, "{seqs:?}");
        if code == "22004" {
            assert!(
                message.ends_with(&want_message),
                "{message} vs {want_message}"
            );
        }
    }
    assert_eq!(
        stored(&mut shards.shard(home)),
        stored(&mut one),
        "refused batches wrote nothing"
    );

    // Single rows travel packed too (insert_gateway_envelope_packed), their
    // optional values with them; a NULL the shard refuses travels as it is.
    let single = "SELECT envelopes.insert_gateway_envelope($1, $2, $3, $4, $5, $6, $7)";
    let time: std::time::SystemTime = proxy
        .query_one("SELECT '2026-01-02 03:04:05.678901+00'::timestamptz", &[])
        .unwrap()
        .get(0);
    type One = (i64, Option<i32>, Option<std::time::SystemTime>, Option<i64>);
    let long_ago: std::time::SystemTime = proxy
        .query_one("SELECT '1969-07-20 20:17:40.123456+00'::timestamptz", &[])
        .unwrap()
        .get(0);
    let ones: Vec<One> = vec![
        (7_000_001, None, None, None),
        (7_000_002, Some(42), Some(time), Some(1_900_000_000)),
        (7_000_003, Some(-1), None, Some(i64::MAX)),
        (7_000_004, None, Some(time), None),
        // before 2000 (a negative count of microseconds), a zero payer, a
        // negative expiry
        (7_000_010, Some(0), Some(long_ago), Some(-5)),
        (7_000_011, Some(i32::MIN), Some(long_ago), Some(i64::MIN)),
    ];
    let single_before = packed_calls_of("insert_gateway_envelope_packed");
    for &(seq, payer, at, expiry) in &ones {
        let args: [&(dyn postgres::types::ToSql + Sync); 7] = [
            &node,
            &seq,
            &topic(seq),
            &envelope(seq),
            &payer,
            &at,
            &expiry,
        ];
        for c in [&mut proxy, &mut one] {
            let n: i64 = c.query_one(single, &args).unwrap().get(0);
            assert_eq!(n, 1, "{seq}");
        }
        let again: i64 = proxy.query_one(single, &args).unwrap().get(0);
        assert_eq!(again, 0, "{seq} again");
    }
    // An empty topic or envelope: whatever one node does, the router does.
    for (seq, t, e) in [
        (7_000_012i64, Vec::new(), b"x".to_vec()),
        (7_000_013, b"t".to_vec(), Vec::new()),
        (7_000_014, Vec::new(), Vec::new()),
    ] {
        let args: [&(dyn postgres::types::ToSql + Sync); 7] = [
            &node,
            &seq,
            &t,
            &e,
            &None::<i32>,
            &None::<std::time::SystemTime>,
            &None::<i64>,
        ];
        let routed = proxy.query_one(single, &args).map(|r| r.get::<_, i64>(0));
        let direct = one.query_one(single, &args).map(|r| r.get::<_, i64>(0));
        match (routed, direct) {
            (Ok(r), Ok(d)) => assert_eq!(r, d, "{seq}"),
            (Err(r), Err(d)) => assert_eq!(sqlstate(&r), sqlstate(&d), "{seq}"),
            (r, d) => panic!("{seq}: routed {r:?}, one node {d:?}"),
        }
    }
    // With standard_conforming_strings off, the router's own literals keep
    // their meaning (an empty bytea stays empty). A new session: PL/pgSQL reads
    // a function's statements at their first call in a session.
    let mut lax = shards.proxy();
    lax.batch_execute("SET standard_conforming_strings = off")
        .unwrap();
    let args: [&(dyn postgres::types::ToSql + Sync); 7] = [
        &node,
        &7_000_015i64,
        &topic(15),
        &envelope(15),
        &None::<i32>,
        &None::<std::time::SystemTime>,
        &None::<i64>,
    ];
    for c in [&mut lax, &mut one] {
        let n: i64 = c.query_one(single, &args).unwrap().get(0);
        assert_eq!(n, 1, "with standard_conforming_strings off");
    }
    let n = batch(
        &mut lax,
        &[7_000_016, 7_000_017],
        &[Some(topic(16)), Some(topic(17))],
        &[Some(envelope(16)), Some(envelope(17))],
    )
    .unwrap();
    assert_eq!(n, 2, "a packed batch with standard_conforming_strings off");
    batch(
        &mut one,
        &[7_000_016, 7_000_017],
        &[Some(topic(16)), Some(topic(17))],
        &[Some(envelope(16)), Some(envelope(17))],
    )
    .unwrap();
    // A session with other date and time settings: times travel binary, so each
    // is stored as given; a NULL element is refused on the proxy, so no shard
    // stores its part of the batch.
    let mut odd = shards.proxy();
    odd.batch_execute("SET datestyle = 'SQL, DMY'; SET timezone = 'Asia/Kolkata'")
        .unwrap();
    let odd_nodes: Vec<i32> = vec![7, 12, 13];
    let odd_seqs: Vec<i64> = vec![9_100_001, 9_100_002, 9_100_003];
    let odd_topics: Vec<Vec<u8>> = vec![vec![1], vec![2], vec![3]];
    let odd_times: Vec<Option<std::time::SystemTime>> =
        vec![Some(time), Some(long_ago), Some(time)];
    for c in [&mut odd, &mut one] {
        let n: i64 = c
            .query_one(
                "SELECT envelopes.insert_gateway_envelopes($1, $2, $3, $3, gateway_times => $4)",
                &[&odd_nodes, &odd_seqs, &odd_topics, &odd_times],
            )
            .unwrap()
            .get(0);
        assert_eq!(n, 3);
    }
    for ((&o, &seq), &at) in odd_nodes.iter().zip(&odd_seqs).zip(&odd_times) {
        let at_shard = shards.shard_of(&mut proxy, o);
        let stored: std::time::SystemTime = shards
            .shard(at_shard)
            .query_one(
                "SELECT gateway_time FROM envelopes.gateway_envelopes_meta
                  WHERE originator_node_id = $1 AND originator_sequence_id = $2",
                &[&o, &seq],
            )
            .unwrap()
            .get(0);
        assert_eq!(Some(stored), at, "originator {o}");
    }
    let null_topic: Vec<Option<Vec<u8>>> = vec![Some(vec![1]), Some(vec![2]), None];
    let e = odd
        .query_one(
            "SELECT envelopes.insert_gateway_envelopes($1, $2, $3, $4)",
            &[
                &odd_nodes,
                &vec![9_100_011i64, 9_100_012, 9_100_013],
                &null_topic,
                &odd_topics,
            ],
        )
        .unwrap_err();
    assert_eq!(sqlstate(&e), "22004");
    assert_eq!(
        e.as_db_error().unwrap().message(),
        "topics[3] must not be NULL"
    );
    for &o in &odd_nodes {
        let at_shard = shards.shard_of(&mut proxy, o);
        let stored: i64 = shards
            .shard(at_shard)
            .query_one(
                "SELECT count(*) FROM envelopes.gateway_envelopes_meta
                  WHERE originator_node_id = $1 AND originator_sequence_id > 9100010",
                &[&o],
            )
            .unwrap()
            .get(0);
        assert_eq!(
            stored, 0,
            "nothing of the refused batch on originator {o}'s shard"
        );
    }
    // The router's hash is pg_catalog's whatever the caller's search_path.
    odd.batch_execute(
        "CREATE SCHEMA IF NOT EXISTS odd_hash;
         CREATE OR REPLACE FUNCTION odd_hash.hashint4(integer) RETURNS integer
             LANGUAGE sql IMMUTABLE AS 'SELECT 0';
         SET search_path = odd_hash, pg_catalog",
    )
    .unwrap();
    for o in 20..28 {
        odd.query_one(
            "SELECT envelopes.insert_gateway_envelope($1, 1, '\\x01', '\\x02')",
            &[&o],
        )
        .unwrap();
        let at_shard = shards.shard_of(&mut proxy, o);
        let stored: i64 = shards
            .shard(at_shard)
            .query_one(
                "SELECT count(*) FROM envelopes.gateway_envelopes_meta WHERE originator_node_id = $1",
                &[&o],
            )
            .unwrap()
            .get(0);
        assert_eq!(stored, 1, "originator {o} on its own shard");
    }
    // Arrays whose subscripts do not start at 1, one originator and two.
    for sql in [
        "SELECT envelopes.insert_gateway_envelopes('[2:3]={7,7}'::int[],
                '[2:3]={7000020,7000021}'::bigint[], '{\"\\\\x01\",\"\\\\x02\"}'::bytea[],
                '{\"\\\\x03\",\"\\\\x04\"}'::bytea[])",
        "SELECT envelopes.insert_gateway_envelopes('[0:1]={7,8}'::int[],
                '{7000022,7000023}'::bigint[], '{\"\\\\x01\",\"\\\\x02\"}'::bytea[],
                '{\"\\\\x03\",\"\\\\x04\"}'::bytea[])",
    ] {
        let routed: i64 = proxy.query_one(sql, &[]).unwrap().get(0);
        let direct: i64 = one.query_one(sql, &[]).unwrap().get(0);
        assert_eq!((routed, direct), (2, 2), "{sql}");
    }
    let moved = shards.shard_of(&mut proxy, 8);
    let eight: i64 = shards
        .shard(moved)
        .query_one(
            "SELECT count(*) FROM envelopes.gateway_envelopes_meta
              WHERE originator_node_id = 8 AND originator_sequence_id = 7000023",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(eight, 1, "originator 8 of a [0:1] batch on its own shard");
    // A batch across originators travels packed too, one value per originator,
    // interleaved rows, a repeated key and optional values included.
    let mixed_nodes: Vec<i32> = vec![7, 9, 7, 10, 9, 7, 11, 10];
    let mixed_seqs: Vec<i64> = vec![9_000_001, 5, 9_000_002, 6, 5, 9_000_001, 1, 7];
    let mixed_topics: Vec<Vec<u8>> = mixed_seqs.iter().map(|&s| topic(s)).collect();
    let mut mixed_envs: Vec<Vec<u8>> = mixed_seqs.iter().map(|&s| envelope(s)).collect();
    mixed_envs[5] = b"a repeated key keeps its first row".to_vec();
    let mixed_payers: Vec<Option<i32>> = vec![Some(1), None, None, Some(4), None, None, None, None];
    let mixed_times: Vec<Option<std::time::SystemTime>> = vec![
        None,
        Some(time),
        None,
        None,
        None,
        None,
        Some(long_ago),
        None,
    ];
    let before_mixed = packed_calls();
    let mut counts = Vec::new();
    for c in [&mut proxy, &mut one] {
        let n: i64 = c
            .query_one(
                "SELECT envelopes.insert_gateway_envelopes($1, $2, $3, $4, $5, $6)",
                &[
                    &mixed_nodes,
                    &mixed_seqs,
                    &mixed_topics,
                    &mixed_envs,
                    &mixed_payers,
                    &mixed_times,
                ],
            )
            .unwrap()
            .get(0);
        counts.push(n);
    }
    assert_eq!(counts, vec![6, 6], "the count one node returns");
    let of_originator = |c: &mut Client, o: i32| -> Vec<Stored> {
        c.query(
            "SELECT originator_node_id, originator_sequence_id, topic, payer_id, expiry,
                    originator_envelope
               FROM envelopes.gateway_envelopes_view WHERE originator_node_id = $1
              ORDER BY 1, 2",
            &[&o],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4), r.get(5)))
        .collect()
    };
    for o in [7, 9, 10, 11] {
        let at = shards.shard_of(&mut proxy, o);
        assert_eq!(
            of_originator(&mut shards.shard(at), o),
            of_originator(&mut one, o),
            "originator {o} on its shard"
        );
    }
    let after_mixed = settled(packed_calls, |c| c > before_mixed);
    assert!(
        after_mixed > before_mixed,
        "the batch across originators went packed"
    );
    let single_after = settled(
        || packed_calls_of("insert_gateway_envelope_packed"),
        |c| c >= single_before + ones.len() as i64,
    );
    assert!(
        single_after >= single_before + ones.len() as i64,
        "single rows went packed ({single_before} -> {single_after} calls)"
    );
    // The default gateway time (the proxy's now()) and an explicit NULL (the
    // shard's now()) are both the time of the call.
    for sql in [
        "SELECT envelopes.insert_gateway_envelope(7, 7000005, '\\x01', '\\x02')",
        "SELECT envelopes.insert_gateway_envelope(7, 7000006, '\\x01', '\\x02', gateway_time => NULL)",
    ] {
        proxy.batch_execute(sql).unwrap();
        one.batch_execute(sql).unwrap();
    }
    let recent: i64 = shards
        .shard(home)
        .query_one(
            "SELECT count(*) FROM envelopes.gateway_envelopes_meta
              WHERE originator_sequence_id IN (7000005, 7000006)
                AND gateway_time > now() - interval '1 minute'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(recent, 2);
    for sql in [
        "SELECT envelopes.insert_gateway_envelope(7, 7000007, NULL, '\\x02')",
        "SELECT envelopes.insert_gateway_envelope(7, NULL, '\\x01', '\\x02')",
        "SELECT envelopes.insert_gateway_envelope(NULL, 1, '\\x01', '\\x02')",
        "SELECT envelopes.insert_gateway_envelope(7, 0, '\\x01', '\\x02')",
        "SELECT envelopes.insert_gateway_envelope(7, 7000008, '\\x01', '\\x02', gateway_time => 'infinity')",
        "SELECT envelopes.insert_gateway_envelope(7, 7000009, pg_catalog.decode(repeat('ab', 1025), 'hex'), '\\x02')",
    ] {
        let routed = proxy.batch_execute(sql).unwrap_err();
        let direct = one.batch_execute(sql).unwrap_err();
        assert_eq!(sqlstate(&routed), sqlstate(&direct), "{sql}");
        let (r, d) = (routed.as_db_error().unwrap(), direct.as_db_error().unwrap());
        assert!(
            r.message().ends_with(d.message()),
            "{sql}: {} vs {}",
            r.message(),
            d.message()
        );
    }
    // A batch of one originator with the optional arrays travels packed as well.
    let opt_seqs: Vec<i64> = vec![8_000_003, 8_000_001, 8_000_002];
    let opt_topics: Vec<Vec<u8>> = opt_seqs.iter().map(|&s| topic(s)).collect();
    let opt_envs: Vec<Vec<u8>> = opt_seqs.iter().map(|&s| envelope(s)).collect();
    let payers: Vec<Option<i32>> = vec![Some(1), None, Some(3)];
    let times: Vec<Option<std::time::SystemTime>> = vec![None, Some(time), Some(time)];
    let expiries: Vec<Option<i64>> = vec![Some(5), Some(6), None];
    let nodes = vec![node; 3];
    let before_options = packed_calls();
    for c in [&mut proxy, &mut one] {
        let n: i64 = c
            .query_one(
                "SELECT envelopes.insert_gateway_envelopes($1, $2, $3, $4, $5, $6, $7)",
                &[
                    &nodes,
                    &opt_seqs,
                    &opt_topics,
                    &opt_envs,
                    &payers,
                    &times,
                    &expiries,
                ],
            )
            .unwrap()
            .get(0);
        assert_eq!(n, 3);
    }
    let after_options = settled(packed_calls, |c| c > before_options);
    assert!(
        after_options > before_options,
        "the batch with options went packed"
    );
    assert_eq!(stored(&mut shards.shard(home)), stored(&mut one));
    let explicit_times = |c: &mut Client| -> Vec<(i64, std::time::SystemTime)> {
        c.query(
            "SELECT originator_sequence_id, gateway_time FROM envelopes.gateway_envelopes_meta
              WHERE originator_sequence_id IN (7000002, 7000004, 8000001, 8000002) ORDER BY 1",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
    };
    let routed_times = explicit_times(&mut shards.shard(home));
    assert_eq!(routed_times, explicit_times(&mut one));
    assert_eq!(routed_times.len(), 4);
    assert!(
        routed_times.iter().all(|&(_, t)| t == time),
        "to the microsecond"
    );

    // The packed form on a shard: malformed values are 22P03, a NULL originator 22004.
    let mut shard = shards.shard(home);
    let packed =
        "SELECT envelopes.insert_gateway_envelopes_packed($1, pg_catalog.encode($2, 'base64'))";
    let mut good = Vec::new();
    good.extend(5_000_000i64.to_be_bytes());
    good.extend(2i32.to_be_bytes());
    good.extend(b"tp");
    good.extend(3i32.to_be_bytes());
    good.extend(b"env");
    good.push(0); // no optional values
    let mut negative = good.clone();
    negative[8..12].copy_from_slice(&(-1i32).to_be_bytes());
    let mut huge = good.clone();
    huge[8..12].copy_from_slice(&i32::MAX.to_be_bytes());
    for bad in [
        good[..good.len() - 1].to_vec(),
        good[..5].to_vec(),
        negative,
        huge,
    ] {
        let e = shard.query_one(packed, &[&node, &bad]).unwrap_err();
        assert_eq!(sqlstate(&e), "22P03", "{bad:?}");
    }
    let e = shard.query_one(packed, &[&None::<i32>, &good]).unwrap_err();
    assert_eq!(sqlstate(&e), "22004");
    for text in ["not base64!", "QUJD=RA=="] {
        let e = shard
            .query_one(
                "SELECT envelopes.insert_gateway_envelopes_packed($1, $2)",
                &[&node, &text],
            )
            .unwrap_err();
        assert_eq!(sqlstate(&e), "22P03", "{text}");
    }
    let n: i64 = shard.query_one(packed, &[&node, &good]).unwrap().get(0);
    assert_eq!(n, 1);
    let n: i64 = shard
        .query_one(packed, &[&node, &Vec::<u8>::new()])
        .unwrap()
        .get(0);
    assert_eq!(n, 0, "an empty batch");
    // The single-row form takes exactly one row.
    let single_packed =
        "SELECT envelopes.insert_gateway_envelope_packed($1, pg_catalog.encode($2, 'base64'))";
    let mut two = good.clone();
    two[..8].copy_from_slice(&5_000_001i64.to_be_bytes());
    let mut both = good.clone();
    both.extend(&two);
    for bad in [Vec::new(), both] {
        let e = shard.query_one(single_packed, &[&node, &bad]).unwrap_err();
        assert_eq!(sqlstate(&e), "22P03", "{bad:?}");
    }
    let n: i64 = shard
        .query_one(single_packed, &[&node, &two])
        .unwrap()
        .get(0);
    assert_eq!(n, 1);
}

#[test]
fn a_shard_down_stops_only_its_originators() {
    let _guard = SHARED.lock().unwrap_or_else(|e| e.into_inner());
    let shards = Cluster::new("down", false);
    let mut proxy = shards.proxy();
    let down = 1;
    let originators: Vec<i32> = (201..=232).collect();
    let (on_down, elsewhere): (Vec<i32>, Vec<i32>) = originators
        .iter()
        .partition(|o| shards.shard_of(&mut proxy, **o) == down);
    assert!(!on_down.is_empty() && !elsewhere.is_empty());
    let row = |o: i32, s: i64| (o, s, vec![b'd'], None, None);

    shards.servers.pg_ctl(down, "stop");
    // Started again whatever happens below, so a failure here leaves the other
    // tests their shards.
    struct Restart<'a>(&'a Servers, usize, bool);
    impl Drop for Restart<'_> {
        fn drop(&mut self) {
            if !self.2 {
                self.0.pg_ctl(self.1, "start");
            }
        }
    }
    let mut restart = Restart(&shards.servers, down, false);
    let failed = proxy
        .query_one(
            "SELECT envelopes.insert_gateway_envelope($1, 1, '\\x64', '\\x01')",
            &[&on_down[0]],
        )
        .expect_err("an insert for a stopped shard must fail");
    // PL/Proxy reports it as XX000 with libpq's own words.
    let text = failed
        .as_db_error()
        .map(|e| e.message().to_owned())
        .unwrap_or_default();
    assert!(
        text.contains("connection to server")
            && text.contains(&shards.servers.shards[down].replace("host=127.0.0.1 port=", "")),
        "not a clear error: {failed:?}"
    );
    // The other shards' originators keep working, one at a time and in batches.
    for o in &elsewhere {
        assert_eq!(insert_one(&mut proxy, &row(*o, 1)), 1);
    }
    let rest: Vec<_> = elsewhere.iter().map(|o| row(*o, 2)).collect();
    assert_eq!(insert_batch(&mut proxy, &rest).unwrap(), rest.len() as i64);
    // A batch that touches the stopped shard fails as a whole call...
    let mixed: Vec<_> = originators.iter().map(|o| row(*o, 3)).collect();
    assert!(proxy
        .query_one(
            "SELECT envelopes.insert_gateway_envelopes($1, $2, $3, $4)",
            &[
                &mixed.iter().map(|r| r.0).collect::<Vec<_>>(),
                &mixed.iter().map(|r| r.1).collect::<Vec<_>>(),
                &mixed.iter().map(|r| r.2.clone()).collect::<Vec<_>>(),
                &mixed.iter().map(|r| r.2.clone()).collect::<Vec<_>>(),
            ],
        )
        .is_err());

    shards.servers.pg_ctl(down, "start");
    restart.2 = true;
    // ... and calling it again once the shard is back completes it (the first
    // call after the restart may find PL/Proxy's old connection dead).
    let mut done = None;
    for _ in 0..20 {
        match insert_batch(&mut shards.proxy(), &mixed) {
            Ok(n) => {
                done = Some(n);
                break;
            }
            Err(_) => thread::sleep(Duration::from_millis(250)),
        }
    }
    let inserted = done.expect("the batch after the restart");
    assert!(inserted as usize >= on_down.len(), "{inserted} rows");
    let mut proxy = shards.proxy();
    for o in &on_down {
        assert_eq!(insert_one(&mut proxy, &row(*o, 1)), 1);
    }
    let got = rows(
        &mut proxy,
        &format!(
            "SELECT * FROM envelopes.select_gateway_envelopes(originator_node_ids => {}, row_limit => 1000)",
            array(&originators)
        ),
    );
    let keys: Vec<(i32, i64)> = got.iter().map(|r| (r.0, r.1)).collect();
    let mut want = Vec::new();
    for o in &originators {
        let seqs: &[i64] = if on_down.contains(o) {
            &[1, 3]
        } else {
            &[1, 2, 3]
        };
        for s in seqs {
            want.push((*o, *s));
        }
    }
    want.sort();
    assert_eq!(keys, want);
    for i in 0..shards.shards.len() {
        let orphans: i64 = shards
            .shard(i)
            .query_one("SELECT count(*) FROM envelopes.orphaned_envelopes()", &[])
            .unwrap()
            .get(0);
        assert_eq!(orphans, 0, "a torn envelope on shard {i}");
    }
}

#[test]
fn a_partition_moves_to_a_new_shard_while_writes_go_on() {
    let _guard = SHARED.lock().unwrap_or_else(|e| e.into_inner());
    let shards = Cluster::new("move", true);
    let spare = shards.spare.clone().unwrap();
    let mut proxy = shards.proxy();
    let partition: i32 = proxy
        .query_one("SELECT envelopes_router.partition_of(301)", &[])
        .unwrap()
        .get(0);
    let movers: Vec<i32> = proxy
        .query(
            "SELECT o FROM generate_series(301, 800) o WHERE envelopes_router.partition_of(o) = $1",
            &[&partition],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(movers.len() >= 10, "{movers:?}");
    let old: String = proxy
        .query_one("SELECT envelopes_router.shard_of(301)", &[])
        .unwrap()
        .get(0);

    // Two writers: one row at a time and in batches, ids going up per originator,
    // each recording what the router acknowledged.
    let stop = Arc::new(AtomicBool::new(false));
    let acked: Arc<Mutex<BTreeSet<(i32, i64)>>> = Arc::new(Mutex::new(BTreeSet::new()));
    let errors = Arc::new(Mutex::new(Vec::<String>::new()));
    let mut writers = Vec::new();
    for w in 0..2i64 {
        let (stop, acked, errors) = (stop.clone(), acked.clone(), errors.clone());
        let movers = movers.clone();
        let proxy_connstr = format!("{} user=postgres", shards.proxy);
        writers.push(thread::spawn(move || {
            let mut c = connect(&proxy_connstr);
            let mut seq = 0i64;
            while !stop.load(Ordering::Relaxed) {
                seq += 1;
                let s = seq * 2 + w; // the two writers never share a key
                if w == 0 {
                    for o in &movers {
                        let r = (*o, s, vec![b'm']);
                        match c.query_one(
                            "SELECT envelopes.insert_gateway_envelope($1, $2, $3, $4)",
                            &[&r.0, &r.1, &r.2, &r.2],
                        ) {
                            Ok(_) => {
                                acked.lock().unwrap().insert((r.0, r.1));
                            }
                            Err(e) => errors.lock().unwrap().push(e.to_string()),
                        }
                    }
                } else {
                    let batch: Vec<(i32, i64, Vec<u8>)> =
                        movers.iter().map(|o| (*o, s, vec![b'm'])).collect();
                    let ids: Vec<i32> = batch.iter().map(|r| r.0).collect();
                    let seqs: Vec<i64> = batch.iter().map(|r| r.1).collect();
                    let topics: Vec<Vec<u8>> = batch.iter().map(|r| r.2.clone()).collect();
                    match c.query_one(
                        "SELECT envelopes.insert_gateway_envelopes($1, $2, $3, $3)",
                        &[&ids, &seqs, &topics],
                    ) {
                        Ok(_) => acked.lock().unwrap().extend(ids.iter().copied().zip(seqs)),
                        Err(e) => errors.lock().unwrap().push(e.to_string()),
                    }
                }
                thread::sleep(Duration::from_millis(5));
            }
        }));
    }
    thread::sleep(Duration::from_secs(2));
    proxy
        .batch_execute(&format!(
            "CALL envelopes_router.move_partition({partition}, '{spare}')"
        ))
        .expect("move the partition");
    thread::sleep(Duration::from_secs(2));
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.join().unwrap();
    }
    let errors = errors.lock().unwrap().clone();
    assert!(errors.is_empty(), "writers failed: {errors:?}");
    let acked = acked.lock().unwrap().clone();

    let mut proxy = shards.proxy();
    let now: String = proxy
        .query_one("SELECT envelopes_router.shard_of(301)", &[])
        .unwrap()
        .get(0);
    assert_eq!(now, spare);
    assert_ne!(old, spare);
    // Through the router: every acknowledged row, once.
    let got = rows(
        &mut proxy,
        &format!(
            "SELECT * FROM envelopes.select_gateway_envelopes(originator_node_ids => {}, row_limit => 1000000)",
            array(&movers)
        ),
    );
    let keys: Vec<(i32, i64)> = got.iter().map(|r| (r.0, r.1)).collect();
    let unique: BTreeSet<(i32, i64)> = keys.iter().copied().collect();
    assert_eq!(keys.len(), unique.len(), "a row read twice");
    let missing: Vec<_> = acked.difference(&unique).collect();
    assert!(
        missing.is_empty(),
        "lost {} rows: {missing:?}",
        missing.len()
    );
    // The new shard holds all of them by itself.
    let mut new = connect(&format!("{spare} user=postgres"));
    let on_new: BTreeMap<i32, i64> = new
        .query("SELECT * FROM envelopes.originator_ceilings()", &[])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let count: i64 = new
        .query_one(
            "SELECT count(*) FROM envelopes.gateway_envelopes_meta WHERE originator_node_id = ANY($1)",
            &[&movers],
        )
        .unwrap()
        .get(0);
    assert_eq!(count as usize, unique.len());
    for o in &movers {
        let top = acked.iter().filter(|k| k.0 == *o).map(|k| k.1).max();
        assert_eq!(
            on_new.get(o).copied(),
            top,
            "originator {o} on the new shard"
        );
    }
    // New writes go to the new shard.
    assert_eq!(
        insert_one(&mut proxy, &(movers[0], 9_000_000, vec![b'n'], None, None)),
        1
    );
    let there: i64 = new
        .query_one(
            "SELECT count(*) FROM envelopes.gateway_envelopes_meta WHERE originator_node_id = $1 AND originator_sequence_id = 9000000",
            &[&movers[0]],
        )
        .unwrap()
        .get(0);
    assert_eq!(there, 1);
}

#[test]
fn the_routers_grants_let_a_writer_write_and_nobody_else() {
    let _guard = SHARED.lock().unwrap_or_else(|e| e.into_inner());
    let shards = Cluster::new("roles", false);
    let role = format!("rw_{}", shards.name);
    let outsider = format!("ro_{}", shards.name);
    // Roles are per server: made on every server, granted on the proxy with the
    // router's grant_writer and on every shard with the extension's.
    let mut servers = shards.servers.shards.clone();
    servers.push(shards.servers.proxy.clone());
    for server in &servers {
        let mut admin = connect(&format!("{server} dbname=postgres user=postgres"));
        admin
            .batch_execute(&format!(
                "CREATE ROLE \"{role}\" LOGIN; CREATE ROLE \"{outsider}\" LOGIN"
            ))
            .unwrap();
    }
    let mut proxy = shards.proxy();
    proxy
        .execute("SELECT envelopes.grant_writer($1)", &[&role])
        .unwrap();
    for i in 0..shards.shards.len() {
        let mut shard = shards.shard(i);
        shard
            .execute("SELECT envelopes.grant_writer($1)", &[&role])
            .unwrap();
        shard
            .execute("SELECT envelopes.grant_reader($1)", &[&role])
            .unwrap();
    }
    let mut writer = connect(&format!("{} user={role}", shards.proxy));
    for o in 1..=8 {
        assert_eq!(insert_one(&mut writer, &(o, 1, vec![b'g'], None, None)), 1);
    }
    // Batches both ways: of one originator without the optional arrays
    // (packed) and across shards with them (split).
    let packed: i64 = writer
        .query_one(
            "SELECT envelopes.insert_gateway_envelopes('{3,3,3,3}', '{2,3,4,5}',
                 array_fill('\\x70'::bytea, '{4}'), array_fill('\\x01'::bytea, '{4}'))",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(packed, 4);
    let across: Vec<Input> = (1..=8).map(|o| (o, 10, vec![b's'], None, None)).collect();
    assert_eq!(insert_batch(&mut writer, &across).unwrap(), 8);
    let n: i64 = writer
        .query_one(
            "SELECT count(*) FROM envelopes.select_gateway_envelopes(row_limit => 100)",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(n, 20);
    let mut stranger = connect(&format!("{} user={outsider}", shards.proxy));
    let refused = stranger
        .query_one(
            "SELECT envelopes.insert_gateway_envelope(1, 2, '\\x01', '\\x01')",
            &[],
        )
        .expect_err("a role without grants must not write");
    assert_eq!(sqlstate(&refused), "42501");
    let refused = stranger
        .query(
            "SELECT * FROM envelopes_router.set_shards(ARRAY['host=x'])",
            &[],
        )
        .expect_err("only the owner sets shards");
    assert_eq!(sqlstate(&refused), "42501");
    drop((writer, stranger));
    drop(shards);
    for server in &servers {
        let mut admin = connect(&format!("{server} dbname=postgres user=postgres"));
        let _ = admin.batch_execute(&format!(
            "DROP ROLE IF EXISTS \"{role}\"; DROP ROLE IF EXISTS \"{outsider}\""
        ));
    }
}

/// Before set_shards, a routed call fails at once with a connection error that
/// names the placeholder, writes nothing, and leaves the router usable once the
/// shards are set.
#[test]
fn a_router_without_shards_refuses_calls_at_once() {
    let servers = Servers::load();
    let name = format!("r_noshards_{}", std::process::id());
    let mut admin = connect(&format!("{} dbname=postgres user=postgres", servers.proxy));
    admin
        .batch_execute(&format!("CREATE DATABASE \"{name}\""))
        .unwrap();
    let mut proxy = connect(&format!("{} dbname={name} user=postgres", servers.proxy));
    proxy
        .batch_execute(
            "SET client_min_messages = warning; CREATE EXTENSION pg_envelopes_router CASCADE",
        )
        .unwrap();
    for call in [
        "SELECT envelopes.insert_gateway_envelope(1, 1, '\\x01', '\\x02')",
        "SELECT * FROM envelopes.select_gateway_envelopes()",
        "SELECT envelopes.insert_gateway_envelopes('{1}', '{1}', '{\\\\x01}', '{\\\\x02}')",
    ] {
        let started = std::time::Instant::now();
        let error = proxy.batch_execute(call).expect_err(call);
        let text = format!("{error:?}");
        assert!(
            text.contains("pg_envelopes_router_has_no_shards"),
            "{call}: {text}"
        );
        assert!(
            started.elapsed() < std::time::Duration::from_secs(5),
            "{call} took {:?}",
            started.elapsed()
        );
    }
    let _ = admin.batch_execute(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"));
}

/// Several writers through the router on the same keys at once, as single rows,
/// batches of one originator and batches across originators (every packed
/// form): each key is stored once on its shard and the counts the writers get
/// back add up to the number of distinct keys.
#[test]
fn racing_writers_through_the_router_store_each_key_once() {
    let _guard = SHARED.lock().unwrap_or_else(|e| e.into_inner());
    let shards = Arc::new(Cluster::new("race", false));
    let originators: Vec<i32> = (101..=106).collect();
    let keys: Vec<(i32, i64)> = originators
        .iter()
        .flat_map(|&o| (1..=60).map(move |s| (o, s * 7)))
        .collect();
    let keys = Arc::new(keys);
    let writers: Vec<_> = (0..6)
        .map(|w| {
            let shards = Arc::clone(&shards);
            let keys = Arc::clone(&keys);
            thread::spawn(move || -> i64 {
                let mut proxy = shards.proxy();
                let mut total = 0i64;
                // Each writer takes the keys in its own order and shape.
                let mut mine: Vec<(i32, i64)> = keys.to_vec();
                mine.rotate_left(w * 37 % keys.len());
                if w % 2 == 1 {
                    mine.reverse();
                }
                for chunk in mine.chunks(match w % 3 {
                    0 => 1,
                    1 => 9,
                    _ => 25,
                }) {
                    if chunk.len() == 1 {
                        let (o, s) = chunk[0];
                        total += proxy
                            .query_one(
                                "SELECT envelopes.insert_gateway_envelope($1, $2, $3, $4)",
                                &[&o, &s, &vec![1u8, 2], &s.to_be_bytes().to_vec()],
                            )
                            .unwrap()
                            .get::<_, i64>(0);
                    } else {
                        let nodes: Vec<i32> = chunk.iter().map(|k| k.0).collect();
                        let seqs: Vec<i64> = chunk.iter().map(|k| k.1).collect();
                        let topics: Vec<Vec<u8>> = chunk.iter().map(|_| vec![1u8, 2]).collect();
                        let envs: Vec<Vec<u8>> =
                            chunk.iter().map(|k| k.1.to_be_bytes().to_vec()).collect();
                        total += proxy
                            .query_one(
                                "SELECT envelopes.insert_gateway_envelopes($1, $2, $3, $4)",
                                &[&nodes, &seqs, &topics, &envs],
                            )
                            .unwrap()
                            .get::<_, i64>(0);
                    }
                }
                total
            })
        })
        .collect();
    let inserted: i64 = writers.into_iter().map(|w| w.join().unwrap()).sum();
    assert_eq!(
        inserted,
        keys.len() as i64,
        "counts add up to the distinct keys"
    );
    let mut proxy = shards.proxy();
    for &o in &originators {
        let home = shards.shard_of(&mut proxy, o);
        for (i, _) in shards.shards.iter().enumerate() {
            let (rows, distinct, bad): (i64, i64, i64) = {
                let r = shards
                    .shard(i)
                    .query_one(
                        "SELECT count(*), count(DISTINCT originator_sequence_id),
                                count(*) FILTER (WHERE originator_envelope
                                    <> pg_catalog.int8send(originator_sequence_id))
                           FROM envelopes.gateway_envelopes_view WHERE originator_node_id = $1",
                        &[&o],
                    )
                    .unwrap();
                (r.get(0), r.get(1), r.get(2))
            };
            let want = if i == home { 60 } else { 0 };
            assert_eq!(
                (rows, distinct, bad),
                (want, want, 0),
                "originator {o} on shard {i}"
            );
        }
    }
}
