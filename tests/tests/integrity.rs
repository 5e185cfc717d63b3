//! The integrity tier: what the direct write path must keep under load and
//! crashes, checked the way an adversarial tester checked it, so that the next
//! change to the write path is checked the same way.
//!
//! - **Races.** Writers in two databases race on shared originators and keys:
//!   single rows, batches with repeats across bands and originators, explicit
//!   transactions with savepoints rolled back, whole transactions rolled back,
//!   REPEATABLE READ and SERIALIZABLE callers retrying their 40001s, bands
//!   created on the fly, by workers in one database and in the inserting
//!   transactions in the other. No call may fail otherwise: no deadlock, no
//!   timeout. Then every committed key is in
//!   meta and blob exactly once with its own bytes, nothing rolled back is, and
//!   `amcheck` finds every index (`bt_index_parent_check` with
//!   `heapallindexed`) and every leaf (`verify_heapam`) sound.
//! - **Decoding and the standby.** `test_decoding` and `pgoutput` slots taken
//!   before the races decode exactly the rows the tables hold, once each; the
//!   streaming standby holds exactly the primary's rows.
//! - **Crashes.** The postmaster (with every process of the server, as a power
//!   loss) or one backend is killed with SIGKILL while writers run bulk batches
//!   and cross bands; after recovery every acknowledged row is there once, with
//!   its bytes and its twin, the high-water marks are rebuilt (an existing key
//!   counts 0, a key below a committed one is late), and a consumer registered
//!   before hands out every row.
//!
//! It runs against a server of its own, which it kills: `scripts/integrity.sh`
//! starts it and its standby and exports `ENVELOPES_TEST_INTEGRITY_*`; the tests
//! are `#[ignore]`d in the ordinary run. `ENVELOPES_INTEGRITY_SECONDS` sets how
//! long the writers race (30 by default), `ENVELOPES_INTEGRITY_ROUNDS` the crash
//! rounds (3, one of each kind; `scripts/stress.sh` runs more of both).

use pg_envelopes_tests::{drain_envelopes, sqlstate, TestDb};
use postgres::{Client, IsolationLevel, NoTls};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: run the integrity tier through scripts/integrity.sh")
    })
}

fn setting(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The server of this tier (it is killed and restarted).
struct Server {
    conn: String,
    data: String,
    pg_ctl: String,
    log: String,
}

impl Server {
    fn from_env() -> Server {
        Server {
            conn: env("ENVELOPES_TEST_INTEGRITY_PG"),
            data: env("ENVELOPES_TEST_INTEGRITY_DATA"),
            pg_ctl: env("ENVELOPES_TEST_INTEGRITY_PG_CTL"),
            log: env("ENVELOPES_TEST_INTEGRITY_LOG"),
        }
    }

    fn postmaster_pid(&self) -> i32 {
        let pid = std::fs::read_to_string(format!("{}/postmaster.pid", self.data))
            .expect("postmaster.pid");
        pid.lines().next().unwrap().trim().parse().unwrap()
    }

    /// Kills the postmaster and every process it started, at once, with
    /// SIGKILL (what a power loss does to them), then starts the server again.
    fn crash(&self) {
        let postmaster = self.postmaster_pid();
        let children = children_of(postmaster);
        kill(postmaster);
        for child in children {
            kill(child);
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let status = std::process::Command::new("runuser")
                .args(["-u", "postgres", "--", &self.pg_ctl, "-D", &self.data])
                .args(["-l", &self.log, "-w", "-t", "60", "start"])
                .stdout(std::process::Stdio::null())
                // Refused while processes of the killed server still hold its
                // shared memory: tried again.
                .stderr(std::process::Stdio::null())
                .status()
                .expect("pg_ctl");
            if status.success() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the server did not start again (see {})",
                self.log
            );
            thread::sleep(Duration::from_millis(200));
        }
        self.wait_ready();
    }

    /// Waits until the server accepts connections (after a crash of a backend
    /// the postmaster reinitializes and recovers by itself).
    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(120);
        while Client::connect(&format!("{} dbname=postgres", self.conn), NoTls).is_err() {
            assert!(Instant::now() < deadline, "the server did not come back");
            thread::sleep(Duration::from_millis(100));
        }
    }
}

fn kill(pid: i32) {
    let _ = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status();
}

/// The processes whose parent is `pid`, from /proc.
fn children_of(pid: i32) -> Vec<i32> {
    let mut children = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(child) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) else {
            continue;
        };
        // pid (comm) state ppid ...: the command may contain spaces, the ')' ends it.
        let parent = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<i32>().ok());
        if parent == Some(pid) {
            children.push(child);
        }
    }
    children
}

/// The envelope of a key: what every writer writes for it, so the stored bytes
/// can be checked whoever won the key.
fn envelope_of(node: i32, seq: i64) -> Vec<u8> {
    let mut bytes = (i64::from(node) * 1_000_000_000_000 + seq)
        .to_be_bytes()
        .to_vec();
    // Every 97th envelope is large enough to be toasted.
    if seq % 97 == 0 {
        bytes.extend(std::iter::repeat_n((seq % 251) as u8, 3000));
    }
    bytes
}

fn topic_of(node: i32, seq: i64) -> Vec<u8> {
    vec![(node % 4) as u8, (seq % 5) as u8]
}

/// The parallel arrays of a batch call: nodes, sequence ids, topics, envelopes.
type Arrays = (Vec<i32>, Vec<i64>, Vec<Vec<u8>>, Vec<Vec<u8>>);

/// The arrays of a batch of `keys`.
fn arrays(keys: &[(i32, i64)]) -> Arrays {
    (
        keys.iter().map(|k| k.0).collect(),
        keys.iter().map(|k| k.1).collect(),
        keys.iter().map(|k| topic_of(k.0, k.1)).collect(),
        keys.iter().map(|k| envelope_of(k.0, k.1)).collect(),
    )
}

const BATCH: &str = "SELECT envelopes.insert_gateway_envelopes($1, $2, $3, $4)";
const ONE: &str = "SELECT envelopes.insert_gateway_envelope($1, $2, $3, $4)";

/// Keys the next call of a writer uses: on shared originators, around each
/// originator's frontier (which moves up as writers go, so bands are crossed
/// and created while others write), some below it (late rows, repeats).
struct Keys {
    frontiers: Vec<AtomicI64>,
}

impl Keys {
    fn new(nodes: usize) -> Keys {
        Keys {
            frontiers: (0..nodes).map(|_| AtomicI64::new(1)).collect(),
        }
    }

    fn pick(&self, rng: &mut fastrand::Rng, count: usize) -> Vec<(i32, i64)> {
        let originators = rng.usize(1..=3.min(self.frontiers.len()));
        let first = rng.usize(0..self.frontiers.len());
        (0..count)
            .map(|i| {
                let n = (first + i % originators) % self.frontiers.len();
                let frontier = self.frontiers[n].fetch_add(rng.i64(0..=2), Ordering::Relaxed);
                let seq = (frontier + rng.i64(-3000..=40)).max(1);
                (n as i32 + 1, seq)
            })
            .collect()
    }
}

/// The keys one writer knows are committed (its call returned, or its
/// transaction's COMMIT did) and those it knows were only in rolled-back work.
#[derive(Default)]
struct Outcome {
    committed: BTreeSet<(i32, i64)>,
    rolled_back: BTreeSet<(i32, i64)>,
}

/// One writer: random calls on `url` until `until`, recording what committed,
/// creating partitions in `mode`. In `transaction` mode a transaction holds the
/// creation lock from the call that created a band to its end, so a transaction
/// of several writing statements could wait for another's key while holding it
/// and close a wait cycle (as that mode documents): its writers make their
/// writes one statement each, and every error fails the test.
fn write_randomly(url: String, keys: Arc<Keys>, seed: u64, until: Instant, mode: &str) -> Outcome {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut c = Client::connect(&url, NoTls).expect("connect");
    c.batch_execute(&format!(
        "SET envelopes.band_width = 5000; SET envelopes.create_partitions_in = '{mode}';
         SET envelopes.max_new_partitions_per_call = 10000"
    ))
    .unwrap();
    let mut out = Outcome::default();
    while Instant::now() < until {
        let mut kind = rng.u32(0..10);
        if mode == "transaction" && (4..=5).contains(&kind) {
            kind = 2;
        }
        let count = rng.usize(1..=if kind == 9 { 2000 } else { 150 });
        let batch = keys.pick(&mut rng, count);
        match kind {
            // Autocommit: a single row or a batch.
            0..=1 => {
                let (n, s) = batch[0];
                c.query_one(ONE, &[&n, &s, &topic_of(n, s), &envelope_of(n, s)])
                    .expect("single insert");
                out.committed.insert((n, s));
            }
            2..=3 | 9 => {
                let (n, s, t, e) = arrays(&batch);
                c.query_one(BATCH, &[&n, &s, &t, &e]).expect("batch insert");
                out.committed.extend(batch);
            }
            // A transaction with a savepoint rolled back in the middle, then one
            // more row. Its statements insert in one rising key order (the kept
            // half, the half rolled back, a key above the first of those), as
            // every single call does: so no wait cycle can form, and a deadlock
            // (40P01) anywhere would be the write path's.
            4..=5 => {
                let mut batch = batch;
                batch.sort_unstable();
                batch.dedup();
                let (kept, dropped) = batch.split_at(batch.len() / 2);
                let extra = dropped.first().map(|&(n, s)| (n, s + 1));
                let attempt = (|| -> Result<(), postgres::Error> {
                    let mut tx = c.transaction()?;
                    let (n, s, t, e) = arrays(kept);
                    tx.query_one(BATCH, &[&n, &s, &t, &e])?;
                    let mut sp = tx.savepoint("sp")?;
                    let (n, s, t, e) = arrays(dropped);
                    sp.query_one(BATCH, &[&n, &s, &t, &e])?;
                    sp.rollback()?;
                    if let Some((n, s)) = extra {
                        tx.query_one(ONE, &[&n, &s, &topic_of(n, s), &envelope_of(n, s)])?;
                    }
                    tx.commit()
                })();
                match attempt {
                    Ok(()) => {
                        out.committed.extend(kept.iter().copied());
                        out.committed.extend(extra);
                        out.rolled_back.extend(dropped.iter().copied());
                    }
                    Err(e) => panic!("savepoint writer: {e:?}"),
                }
            }
            // A transaction rolled back as a whole.
            6 => {
                let mut tx = c.transaction().unwrap();
                let (n, s, t, e) = arrays(&batch);
                tx.query_one(BATCH, &[&n, &s, &t, &e]).unwrap();
                tx.rollback().unwrap();
                out.rolled_back.extend(batch);
            }
            // REPEATABLE READ and SERIALIZABLE callers: a read, then the batch
            // and a single row; 40001 is retried, as a client would.
            _ => {
                let level = if kind == 7 {
                    IsolationLevel::RepeatableRead
                } else {
                    IsolationLevel::Serializable
                };
                loop {
                    let mut tx = c
                        .build_transaction()
                        .isolation_level(level)
                        .start()
                        .unwrap();
                    let attempt = (|| -> Result<(), postgres::Error> {
                        tx.query_one("SELECT count(*) FROM envelopes.late_envelopes", &[])?;
                        let (n, s, t, e) = arrays(&batch);
                        tx.query_one(BATCH, &[&n, &s, &t, &e])?;
                        Ok(())
                    })();
                    match attempt.and_then(|()| tx.commit()) {
                        Ok(()) => {
                            out.committed.extend(batch.iter().copied());
                            break;
                        }
                        Err(e) if sqlstate(&e) == "40001" || sqlstate(&e) == "40P01" => continue,
                        Err(e) => panic!("{level:?} writer: {e:?}"),
                    }
                }
            }
        }
    }
    out
}

/// Stored rows: (node, seq) -> (topic, envelope).
type Stored = BTreeMap<(i32, i64), (Vec<u8>, Vec<u8>)>;

/// Every row of the store, read with plain SQL;
/// panics on a meta row without its blob twin or the other way round.
fn stored(c: &mut Client) -> Stored {
    let counts = c
        .query_one(
            "SELECT (SELECT count(*) FROM envelopes.gateway_envelopes_meta),
                    (SELECT count(DISTINCT (originator_node_id, originator_sequence_id))
                       FROM envelopes.gateway_envelopes_meta),
                    (SELECT count(*) FROM envelopes.gateway_envelopes_blob),
                    (SELECT count(DISTINCT (originator_node_id, originator_sequence_id))
                       FROM envelopes.gateway_envelopes_blob),
                    (SELECT count(*) FROM envelopes.orphaned_envelopes())",
            &[],
        )
        .unwrap();
    let (meta, meta_keys, blob, blob_keys, orphans): (i64, i64, i64, i64, i64) = (
        counts.get(0),
        counts.get(1),
        counts.get(2),
        counts.get(3),
        counts.get(4),
    );
    assert_eq!(meta, meta_keys, "duplicate meta rows");
    assert_eq!(blob, blob_keys, "duplicate blob rows");
    assert_eq!(orphans, 0, "rows without their twin");
    assert_eq!(meta, blob);
    c.query(
        "SELECT m.originator_node_id, m.originator_sequence_id, m.topic, b.originator_envelope
           FROM envelopes.gateway_envelopes_meta m
           JOIN envelopes.gateway_envelopes_blob b USING (originator_node_id, originator_sequence_id)",
        &[],
    )
    .unwrap()
    .iter()
    .map(|r| ((r.get(0), r.get(1)), (r.get(2), r.get(3))))
    .collect()
}

/// Every row has the bytes of its key, and every key in `committed` is there.
fn check_rows(rows: &Stored, committed: &BTreeSet<(i32, i64)>, label: &str) {
    for (&(node, seq), (topic, envelope)) in rows {
        assert_eq!(
            *topic,
            topic_of(node, seq),
            "{label}: topic of {node}/{seq}"
        );
        assert_eq!(
            *envelope,
            envelope_of(node, seq),
            "{label}: bytes of {node}/{seq}"
        );
    }
    let missing: Vec<_> = committed
        .iter()
        .filter(|k| !rows.contains_key(k))
        .take(10)
        .collect();
    assert!(
        missing.is_empty(),
        "{label}: committed rows missing: {missing:?}"
    );
}

/// amcheck over every index and every leaf of the store.
fn amcheck(c: &mut Client, label: &str) {
    c.batch_execute("CREATE EXTENSION IF NOT EXISTS amcheck")
        .unwrap();
    let indexes: i64 = c
        .query_one(
            "SELECT count(*) FROM (
                 SELECT public.bt_index_parent_check(i.indexrelid, heapallindexed => true)
                   FROM pg_catalog.pg_index i
                   JOIN pg_catalog.pg_class c ON c.oid = i.indexrelid
                   JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
                  WHERE n.nspname = 'envelopes' AND c.relkind = 'i' AND c.relam = 403) x",
            &[],
        )
        .unwrap_or_else(|e| panic!("{label}: bt_index_parent_check: {e:?}"))
        .get(0);
    let corrupt: Vec<String> = c
        .query(
            "SELECT c.relname || ': ' || v.msg
               FROM pg_catalog.pg_class c
               JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace,
                    LATERAL public.verify_heapam(c.oid) v
              WHERE n.nspname = 'envelopes' AND c.relkind = 'r'",
            &[],
        )
        .unwrap_or_else(|e| panic!("{label}: verify_heapam: {e:?}"))
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(corrupt.is_empty(), "{label}: verify_heapam: {corrupt:?}");
    assert!(indexes > 0, "{label}: no index checked");
}

/// The (node, seq) of the inserts into `table`'s leaves a test_decoding slot
/// returns, each as often as it was decoded.
fn decoded_test_decoding(c: &mut Client, slot: &str, table: &str) -> Vec<(i32, i64)> {
    let rows = c
        .query(
            "SELECT data FROM pg_catalog.pg_logical_slot_get_changes($1, NULL, NULL)
              WHERE data LIKE 'table envelopes.gateway_envelopes_%'",
            &[&slot],
        )
        .unwrap();
    let mut keys = Vec::new();
    for row in rows {
        let data: String = row.get(0);
        if !data.starts_with(&format!("table envelopes.gateway_envelopes_{table}_o")) {
            continue;
        }
        assert!(data.contains(": INSERT: "), "only inserts happen: {data}");
        let field = |name: &str| -> i64 {
            let at = data.find(name).expect(name) + name.len();
            data[at..].split(' ').next().unwrap().parse().expect(name)
        };
        keys.push((
            field("originator_node_id[integer]:") as i32,
            field("originator_sequence_id[bigint]:"),
        ));
    }
    keys
}

/// The same from a pgoutput slot, whose protocol messages (relation 'R', insert
/// 'I') are decoded here.
fn decoded_pgoutput(
    c: &mut Client,
    slot: &str,
    publication: &str,
) -> BTreeMap<String, Vec<(i32, i64)>> {
    let rows = c
        .query(
            "SELECT data FROM pg_catalog.pg_logical_slot_get_binary_changes($1, NULL, NULL,
                 'proto_version', '1', 'publication_names', $2)",
            &[&slot, &publication],
        )
        .unwrap();
    struct Reader<'a>(&'a [u8]);
    impl Reader<'_> {
        fn byte(&mut self) -> u8 {
            let b = self.0[0];
            self.0 = &self.0[1..];
            b
        }
        fn take(&mut self, n: usize) -> &[u8] {
            let (head, tail) = self.0.split_at(n);
            self.0 = tail;
            head
        }
        fn int(&mut self, n: usize) -> i64 {
            self.take(n)
                .iter()
                .fold(0i64, |v, &b| v << 8 | i64::from(b))
        }
        fn string(&mut self) -> String {
            let end = self.0.iter().position(|&b| b == 0).unwrap();
            let s = String::from_utf8_lossy(&self.0[..end]).into_owned();
            self.0 = &self.0[end + 1..];
            s
        }
    }
    // relation oid -> (name, column names)
    let mut relations: BTreeMap<i64, (String, Vec<String>)> = BTreeMap::new();
    let mut inserts: BTreeMap<String, Vec<(i32, i64)>> = BTreeMap::new();
    for row in rows {
        let data: Vec<u8> = row.get(0);
        let mut r = Reader(&data);
        match r.byte() {
            b'R' => {
                let oid = r.int(4);
                let _namespace = r.string();
                let name = r.string();
                let _identity = r.byte();
                let columns = r.int(2);
                let names = (0..columns)
                    .map(|_| {
                        let _flags = r.byte();
                        let name = r.string();
                        r.int(4);
                        r.int(4);
                        name
                    })
                    .collect();
                relations.insert(oid, (name, names));
            }
            b'I' => {
                let oid = r.int(4);
                assert_eq!(r.byte(), b'N');
                let (name, names) = relations.get(&oid).expect("relation before insert").clone();
                let columns = r.int(2) as usize;
                let mut values = BTreeMap::new();
                for column in names.iter().take(columns) {
                    match r.byte() {
                        b't' => {
                            let len = r.int(4) as usize;
                            values.insert(
                                column.clone(),
                                String::from_utf8_lossy(r.take(len)).into_owned(),
                            );
                        }
                        b'n' | b'u' => {}
                        other => panic!("tuple kind {other}"),
                    }
                }
                let kind = if name.starts_with("gateway_envelopes_meta") {
                    "meta"
                } else if name.starts_with("gateway_envelopes_blob") {
                    "blob"
                } else {
                    continue;
                };
                inserts.entry(kind.to_owned()).or_default().push((
                    values["originator_node_id"].parse().unwrap(),
                    values["originator_sequence_id"].parse().unwrap(),
                ));
            }
            b'U' | b'D' | b'T' => panic!("only inserts happen"),
            _ => {}
        }
    }
    inserts
}

/// Waits until the standby has replayed what the primary has written, then
/// compares both stores of `db` row for row.
fn check_standby(primary: &mut Client, db: &TestDb, label: &str) {
    let lsn: String = primary
        .query_one("SELECT pg_catalog.pg_current_wal_lsn()::text", &[])
        .unwrap()
        .get(0);
    let standby_server = env("ENVELOPES_TEST_INTEGRITY_STANDBY");
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut standby = loop {
        if let Ok(mut admin) = Client::connect(&format!("{standby_server} dbname=postgres"), NoTls)
        {
            let replayed: bool = admin
                .query_one(
                    "SELECT pg_catalog.pg_last_wal_replay_lsn() >= $1::text::pg_lsn",
                    &[&lsn],
                )
                .unwrap()
                .get(0);
            if replayed {
                break Client::connect(&format!("{standby_server} dbname={}", db.name), NoTls)
                    .unwrap();
            }
        }
        assert!(
            Instant::now() < deadline,
            "{label}: the standby did not replay {lsn}"
        );
        thread::sleep(Duration::from_millis(100));
    };
    let digest = "SELECT pg_catalog.md5(pg_catalog.string_agg(pg_catalog.concat_ws(',',
                      m.originator_node_id, m.originator_sequence_id, m.topic, m.late,
                      m.inserted_xid, b.originator_envelope), ';'
                      ORDER BY m.originator_node_id, m.originator_sequence_id)), count(*)
                    FROM envelopes.gateway_envelopes_meta m
                    JOIN envelopes.gateway_envelopes_blob b USING (originator_node_id, originator_sequence_id)";
    let on = |c: &mut Client| -> (Option<String>, i64) {
        let r = c.query_one(digest, &[]).unwrap();
        (r.get(0), r.get(1))
    };
    assert_eq!(
        on(&mut standby),
        on(primary),
        "{label}: standby and primary differ"
    );
}

/// Writers race in two databases; then the rows, amcheck, both decoders and the
/// standby.
#[test]
#[ignore = "integrity tier: scripts/integrity.sh runs it against a server of its own"]
fn racing_writers_leave_every_committed_row_once_and_sound_indexes() {
    let server = Server::from_env();
    let seconds = setting("ENVELOPES_INTEGRITY_SECONDS", 30);
    let dbs = [
        TestDb::new_on(server.conn.clone(), "integrity_a"),
        TestDb::new_on(server.conn.clone(), "integrity_b"),
    ];
    let mut a = dbs[0].connect();
    // Each its own transaction: a slot is not created in one that has written.
    for sql in [
        "CREATE PUBLICATION integrity_pub FOR TABLE envelopes.gateway_envelopes_meta,
             envelopes.gateway_envelopes_blob",
        "SELECT pg_catalog.pg_create_logical_replication_slot('integrity_td', 'test_decoding')",
        "SELECT pg_catalog.pg_create_logical_replication_slot('integrity_po', 'pgoutput')",
    ] {
        a.batch_execute(sql).unwrap();
    }
    let until = Instant::now() + Duration::from_secs(seconds);
    let mut writers = Vec::new();
    for (d, db) in dbs.iter().enumerate() {
        let keys = Arc::new(Keys::new(6));
        let mode = if d == 0 { "worker" } else { "transaction" };
        for w in 0..5u64 {
            let (url, keys) = (db.url(), keys.clone());
            writers.push((
                d,
                thread::spawn(move || write_randomly(url, keys, (d as u64) * 100 + w, until, mode)),
            ));
        }
    }
    let mut outcomes = [Outcome::default(), Outcome::default()];
    for (d, writer) in writers {
        let out = writer.join().expect("a writer failed");
        outcomes[d].committed.extend(out.committed);
        outcomes[d].rolled_back.extend(out.rolled_back);
    }
    let mut total = 0;
    for (d, db) in dbs.iter().enumerate() {
        let label = format!("database {d}");
        let mut c = db.connect();
        let rows = stored(&mut c);
        check_rows(&rows, &outcomes[d].committed, &label);
        let phantom: Vec<_> = outcomes[d]
            .rolled_back
            .difference(&outcomes[d].committed)
            .filter(|k| rows.contains_key(k))
            .take(10)
            .collect();
        assert!(
            phantom.is_empty(),
            "{label}: rolled-back rows stored: {phantom:?}"
        );
        assert_eq!(
            rows.len(),
            outcomes[d].committed.len(),
            "{label}: rows no writer committed"
        );
        amcheck(&mut c, &label);
        total += rows.len();
        let bands: i64 = c
            .query_one("SELECT count(*) FROM envelopes.partitions()", &[])
            .unwrap()
            .get(0);
        eprintln!("{label}: {} rows in {bands} bands", rows.len());
    }
    assert!(total > 10_000, "the race wrote only {total} rows");
    // Decoders: exactly the rows the tables hold, once each.
    let keys: BTreeSet<(i32, i64)> = stored(&mut a).keys().copied().collect();
    let td_meta = decoded_test_decoding(&mut a, "integrity_td", "meta");
    assert_eq!(
        td_meta.len(),
        keys.len(),
        "test_decoding: meta inserts decoded"
    );
    assert_eq!(
        td_meta.iter().copied().collect::<BTreeSet<_>>(),
        keys,
        "test_decoding: meta"
    );
    let po = decoded_pgoutput(&mut a, "integrity_po", "integrity_pub");
    for table in ["meta", "blob"] {
        let got = po.get(table).cloned().unwrap_or_default();
        assert_eq!(got.len(), keys.len(), "pgoutput: {table} inserts decoded");
        assert_eq!(
            got.into_iter().collect::<BTreeSet<_>>(),
            keys,
            "pgoutput: {table}"
        );
    }
    a.batch_execute(
        "SELECT pg_catalog.pg_drop_replication_slot('integrity_td');
         SELECT pg_catalog.pg_drop_replication_slot('integrity_po');",
    )
    .unwrap();
    for db in &dbs {
        check_standby(&mut db.connect(), db, &db.name);
    }
}

/// What kills the server in a crash round.
#[derive(Clone, Copy, Debug)]
enum Kill {
    /// The postmaster and every process of the server, during bulk batches.
    ServerDuringBulk,
    /// One backend running a bulk batch (the postmaster then resets every
    /// session and recovers).
    BackendDuringBulk,
    /// The postmaster and every process, while writers cross bands (creation
    /// workers running).
    ServerDuringCreation,
}

/// Writers for one crash round: each records the keys of calls that returned;
/// a call that fails (the server went away) is tried on a new connection.
fn crash_writer(
    url: String,
    node: i32,
    bulk: bool,
    stop: Arc<AtomicBool>,
    pids: Arc<Mutex<Vec<i32>>>,
) -> BTreeSet<(i32, i64)> {
    let mut acknowledged = BTreeSet::new();
    let mut next = 1i64;
    let mut rng = fastrand::Rng::with_seed(node as u64);
    while !stop.load(Ordering::Relaxed) {
        let Ok(mut c) = Client::connect(&url, NoTls) else {
            thread::sleep(Duration::from_millis(50));
            continue;
        };
        let Ok(row) = c.query_one("SELECT pg_catalog.pg_backend_pid()", &[]) else {
            continue;
        };
        pids.lock().unwrap().push(row.get(0));
        let width = if bulk { 50_000 } else { 300 };
        if c.batch_execute(&format!("SET envelopes.band_width = {width}"))
            .is_err()
        {
            continue;
        }
        while !stop.load(Ordering::Relaxed) {
            let count = if bulk {
                2000 + rng.usize(0..8000)
            } else {
                1 + rng.usize(0..40)
            };
            let batch: Vec<(i32, i64)> = (0..count as i64).map(|i| (node, next + i)).collect();
            let (n, s, t, e) = arrays(&batch);
            match c.query_one(BATCH, &[&n, &s, &t, &e]) {
                Ok(_) => {
                    acknowledged.extend(batch);
                    next += count as i64;
                }
                Err(_) => break,
            }
        }
    }
    acknowledged
}

/// Crash rounds of each kind, in turn. After each: every acknowledged row once,
/// with its bytes and twin; the high-water marks rebuilt; amcheck sound. At the
/// end a consumer registered before the first round has every row, and the
/// standby holds exactly the primary's rows.
#[test]
#[ignore = "integrity tier: scripts/integrity.sh runs it against a server of its own"]
fn crashes_lose_no_committed_row_and_duplicate_none() {
    let server = Server::from_env();
    let rounds = setting("ENVELOPES_INTEGRITY_ROUNDS", 3);
    let db = TestDb::new_on(server.conn.clone(), "integrity_crash");
    db.connect()
        .batch_execute("SELECT envelopes.consumer_register('integrity')")
        .unwrap();
    let kinds = [
        Kill::ServerDuringBulk,
        Kill::BackendDuringBulk,
        Kill::ServerDuringCreation,
    ];
    let mut acknowledged = BTreeSet::new();
    let mut rng = fastrand::Rng::with_seed(29);
    for round in 0..rounds {
        let kind = kinds[round as usize % kinds.len()];
        let label = format!("round {round} ({kind:?})");
        let stop = Arc::new(AtomicBool::new(false));
        let pids = Arc::new(Mutex::new(Vec::new()));
        let bulk = !matches!(kind, Kill::ServerDuringCreation);
        let writers: Vec<_> = (0..4)
            .map(|w| {
                let node = (round * 10 + w + 1) as i32;
                let (url, stop, pids) = (db.url(), stop.clone(), pids.clone());
                thread::spawn(move || crash_writer(url, node, bulk, stop, pids))
            })
            .collect();
        thread::sleep(Duration::from_millis(1500 + rng.u64(0..1500)));
        match kind {
            Kill::BackendDuringBulk => {
                let victim = *pids.lock().unwrap().first().expect("a writer's backend");
                kill(victim);
                // The postmaster notices, ends every session and recovers.
                thread::sleep(Duration::from_millis(500));
                server.wait_ready();
            }
            Kill::ServerDuringBulk | Kill::ServerDuringCreation => server.crash(),
        }
        // Writers reconnect and go on for a moment after recovery, then stop.
        thread::sleep(Duration::from_millis(1000));
        stop.store(true, Ordering::Relaxed);
        for writer in writers {
            acknowledged.extend(writer.join().expect("a crash writer failed"));
        }
        server.wait_ready();
        let mut c = db.connect();
        let rows = stored(&mut c);
        check_rows(&rows, &acknowledged, &label);
        // The high-water marks are rebuilt from the tables: an existing key
        // counts 0, a new key below a committed one arrives late.
        let &(node, top) = acknowledged
            .iter()
            .rfind(|k| k.0 == (round * 10 + 1) as i32)
            .expect("the first writer acknowledged rows");
        let again: i64 = c
            .query_one(
                ONE,
                &[&node, &top, &topic_of(node, top), &envelope_of(node, top)],
            )
            .unwrap()
            .get(0);
        assert_eq!(again, 0, "{label}: an existing key was inserted again");
        let far = top + 1_000_000_000;
        c.query_one(
            ONE,
            &[&node, &far, &topic_of(node, far), &envelope_of(node, far)],
        )
        .unwrap();
        let late_key = (node, top + 500_000_000);
        let new: i64 = c
            .query_one(
                ONE,
                &[
                    &late_key.0,
                    &late_key.1,
                    &topic_of(late_key.0, late_key.1),
                    &envelope_of(late_key.0, late_key.1),
                ],
            )
            .unwrap()
            .get(0);
        assert_eq!(new, 1);
        let late: bool = c
            .query_one(
                "SELECT late FROM envelopes.gateway_envelopes_meta
                  WHERE originator_node_id = $1 AND originator_sequence_id = $2",
                &[&late_key.0, &late_key.1],
            )
            .unwrap()
            .get(0);
        assert!(late, "{label}: a row below a committed one was not late");
        acknowledged.insert((node, far));
        acknowledged.insert(late_key);
        amcheck(&mut c, &label);
        eprintln!("{label}: {} rows acknowledged so far", acknowledged.len());
    }
    let mut c = db.connect();
    let handed: BTreeSet<(i32, i64)> = drain_envelopes(&mut c, "integrity")
        .iter()
        .map(|h| (h.node, h.seq))
        .collect();
    let stored_keys: BTreeSet<(i32, i64)> = stored(&mut c).keys().copied().collect();
    let missing: Vec<_> = stored_keys.difference(&handed).take(10).collect();
    assert!(missing.is_empty(), "the consumer missed rows: {missing:?}");
    check_standby(&mut c, &db, "after the crashes");
}
