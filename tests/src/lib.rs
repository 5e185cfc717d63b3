//! Test harness for client-side integration tests.
//!
//! `scripts/test.sh` starts a throwaway cluster with the extension installed and
//! exports `ENVELOPES_TEST_PG` (a libpq connection string without a database).
//! Each test creates its own database with a unique name, so tests can run in
//! parallel and never see each other's rows, and drops it when done.

pub mod whole_store;

use postgres::{Client, NoTls};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Connection string of the test server, without a database name.
pub fn server() -> String {
    std::env::var("ENVELOPES_TEST_PG").unwrap_or_else(|_| {
        panic!(
            "ENVELOPES_TEST_PG is not set: run these tests through scripts/test.sh, which \
             starts a throwaway cluster with pg_envelopes installed"
        )
    })
}

/// A fresh database with the extension created in it; dropped on drop.
pub struct TestDb {
    pub name: String,
    /// Connection string of the server it lives on, without a database name.
    pub server: String,
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

impl TestDb {
    pub fn new(label: &str) -> TestDb {
        TestDb::new_on(server(), label)
    }

    /// The same on another server than `ENVELOPES_TEST_PG` (one started with other
    /// settings by scripts/test.sh).
    pub fn new_on(server: String, label: &str) -> TestDb {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let name = format!(
            "t_{label}_{}_{}_{nanos}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let mut admin = connect_on(&server, "postgres");
        admin
            .batch_execute(&format!("CREATE DATABASE \"{name}\""))
            .expect("create database");
        let db = TestDb { name, server };
        db.connect()
            .batch_execute("CREATE EXTENSION pg_envelopes")
            .expect("create extension");
        db
    }

    /// The connection string of this database.
    pub fn url(&self) -> String {
        format!(
            "{} dbname={} options='-c statement_timeout=120s'",
            self.server, self.name
        )
    }

    pub fn connect(&self) -> Client {
        connect_on(&self.server, &self.name)
    }

    /// The single bigint a query returns.
    pub fn int8(&self, sql: &str) -> i64 {
        self.connect().query_one(sql, &[]).expect(sql).get(0)
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if let Ok(mut admin) = Client::connect(&format!("{} dbname=postgres", self.server), NoTls) {
            let _ = admin.batch_execute(&format!(
                "DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)",
                self.name
            ));
        }
    }
}

/// Connects with a statement timeout, so a test that would block forever (a
/// regression that makes one session wait for another) fails instead of hanging.
pub fn connect_to(dbname: &str) -> Client {
    connect_on(&server(), dbname)
}

fn connect_on(server: &str, dbname: &str) -> Client {
    Client::connect(
        &format!("{server} dbname={dbname} options='-c statement_timeout=120s'"),
        NoTls,
    )
    .unwrap_or_else(|e| panic!("connect to {dbname}: {e}"))
}

/// SQLSTATE of a failed statement, or "-----" when the error has none.
pub fn sqlstate(error: &postgres::Error) -> String {
    error
        .code()
        .map(|c| c.code().to_owned())
        .unwrap_or_else(|| "-----".to_owned())
}

/// The SQLSTATE and the server's whole report (message, detail, hint, where) of
/// a failed statement, for assertion messages: `postgres::Error`'s own Display
/// says only "db error".
pub fn report(error: &postgres::Error) -> String {
    match error.as_db_error() {
        Some(db) => format!(
            "{} {} (detail: {:?}, hint: {:?}, where: {:?})",
            db.code().code(),
            db.message(),
            db.detail(),
            db.hint(),
            db.where_()
        ),
        None => format!("----- {error}"),
    }
}

/// Inserts one small envelope through the extension's function.
pub fn insert(client: &mut impl postgres::GenericClient, node: i32, seq: i64) {
    client
        .query_one(
            "SELECT envelopes.insert_gateway_envelope($1, $2, '\\x01', '\\x02')",
            &[&node, &seq],
        )
        .expect("insert");
}

/// The ids of one outbox batch of `consumer`.
pub fn outbox_batch_ids(client: &mut impl postgres::GenericClient, consumer: &str) -> Vec<i64> {
    client
        .query(
            "SELECT id FROM envelopes.consumer_outbox_batch($1)",
            &[&consumer],
        )
        .expect("outbox batch")
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// One envelope as a consumer batch hands it out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Handed {
    pub node: i32,
    pub seq: i64,
    /// Set when the row came from the late-envelope feed.
    pub late_id: Option<i64>,
}

/// Reads one envelope batch of `consumer` (`batch_size` rows).
pub fn envelope_batch(
    client: &mut impl postgres::GenericClient,
    consumer: &str,
    batch_size: i32,
) -> Result<Vec<Handed>, postgres::Error> {
    Ok(client
        .query(
            "SELECT originator_node_id, originator_sequence_id, late_id
               FROM envelopes.consumer_envelope_batch($1, $2)",
            &[&consumer, &batch_size],
        )?
        .iter()
        .map(|r| Handed {
            node: r.get(0),
            seq: r.get(1),
            late_id: r.get(2),
        })
        .collect())
}

/// Acknowledges a batch as the bridge does: per originator the highest sequence id
/// of the in-order rows, and the highest late-feed id.
pub fn envelope_ack(
    client: &mut impl postgres::GenericClient,
    consumer: &str,
    batch: &[Handed],
) -> Result<i64, postgres::Error> {
    let mut tops: std::collections::BTreeMap<i32, i64> = std::collections::BTreeMap::new();
    let mut late: Option<i64> = None;
    for h in batch {
        match h.late_id {
            Some(id) => late = Some(late.map_or(id, |l| l.max(id))),
            None => {
                let top = tops.entry(h.node).or_insert(h.seq);
                *top = (*top).max(h.seq);
            }
        }
    }
    let nodes: Vec<i32> = tops.keys().copied().collect();
    let seqs: Vec<i64> = tops.values().copied().collect();
    Ok(client
        .query_one(
            "SELECT envelopes.consumer_envelope_ack($1, $2, $3, $4)",
            &[&consumer, &nodes, &seqs, &late],
        )?
        .get(0))
}

/// Reads and acknowledges batches until one comes back empty; returns everything
/// handed out, in order.
pub fn drain_envelopes(client: &mut Client, consumer: &str) -> Vec<Handed> {
    drain_envelopes_in(client, consumer, 1000)
}

/// [`drain_envelopes`] in batches of `size` rows.
pub fn drain_envelopes_in(client: &mut Client, consumer: &str, size: i32) -> Vec<Handed> {
    let mut all = Vec::new();
    loop {
        let batch = envelope_batch(client, consumer, size).expect("envelope batch");
        if batch.is_empty() {
            return all;
        }
        envelope_ack(client, consumer, &batch).expect("envelope ack");
        all.extend(batch);
    }
}

/// A LOGIN role for one test, dropped afterwards (roles are cluster-wide).
pub struct Role {
    pub name: String,
}

impl Role {
    pub fn new(db: &TestDb, label: &str) -> Role {
        let name = format!("{label}_{}", db.name.trim_start_matches("t_"));
        let name = name[..name.len().min(60)].to_owned();
        db.connect()
            .batch_execute(&format!("CREATE ROLE \"{name}\" LOGIN"))
            .unwrap();
        Role { name }
    }

    /// A connection to `db` as this role.
    pub fn connect(&self, db: &TestDb) -> Client {
        self.connect_with(db, "")
    }

    /// The same with server options given at connection time (`-c name=value`),
    /// which reach the server before the extension's library is loaded.
    pub fn connect_with(&self, db: &TestDb, options: &str) -> Client {
        Client::connect(
            &format!(
                "{} dbname={} user='{}' options='{options}'",
                db.server.replace("user=postgres", ""),
                db.name,
                self.name
            ),
            NoTls,
        )
        .expect("connect as the role")
    }
}

impl Drop for Role {
    fn drop(&mut self) {
        if let Ok(mut c) = Client::connect(&format!("{} dbname=postgres", server()), NoTls) {
            let _ = c.batch_execute(&format!(
                "DROP ROLE IF EXISTS \"{}\"",
                self.name.replace('"', "\"\"")
            ));
        }
    }
}

/// The SQLSTATE of a statement, or "ok".
pub fn outcome(c: &mut Client, sql: &str) -> String {
    match c.batch_execute(sql) {
        Ok(()) => "ok".into(),
        Err(e) => sqlstate(&e),
    }
}

/// A call of every function that writes, each insert on an originator of its
/// own (40 to 44) that has no partition yet (so it would create one), the packed
/// forms' arguments built in SQL; prune deletes what expired before 200.
pub const WRITING_CALLS: [&str; 10] = [
    "SELECT envelopes.insert_gateway_envelope(40, 1, '\\x01', '\\x02')",
    "SELECT envelopes.insert_gateway_envelopes(ARRAY[41], ARRAY[1]::bigint[],
         ARRAY['\\x01']::bytea[], ARRAY['\\x02']::bytea[])",
    "SELECT envelopes.insert_gateway_envelopes_packed(42, pg_catalog.encode(
         pg_catalog.int8send(1::bigint) || pg_catalog.int4send(1) || '\\x01'::bytea
         || pg_catalog.int4send(1) || '\\x02'::bytea || '\\x00'::bytea, 'base64'))",
    "SELECT envelopes.insert_gateway_envelope_packed(43, pg_catalog.encode(
         pg_catalog.int8send(1::bigint) || pg_catalog.int4send(1) || '\\x01'::bytea
         || pg_catalog.int4send(1) || '\\x02'::bytea || '\\x00'::bytea, 'base64'))",
    "SELECT envelopes.ensure_gateway_parts(44, 1)",
    "SELECT envelopes.publish('orders.created', '\\x01')",
    "SELECT count(*) FROM envelopes.prune_expired(as_of => 200)",
    "SELECT count(*) FROM envelopes.insert_gateway_envelopes_keys(ARRAY[41], ARRAY[2]::bigint[],
         ARRAY['\\x01']::bytea[], ARRAY['\\x02']::bytea[])",
    "SELECT count(*) FROM envelopes_xmtpd.insert_gateway_envelope_batch(ARRAY[40], ARRAY[3]::bigint[],
         ARRAY['\\x01']::bytea[], ARRAY[0], NULL, NULL, ARRAY['\\x02']::bytea[])",
    "SELECT count(*) FROM envelopes.prune_expired_below(ARRAY[39], ARRAY[10]::bigint[], as_of => 200)",
];

/// The setting that runs every query through a parallel worker:
/// `force_parallel_mode` up to Postgres 15, `debug_parallel_query` since 16.
pub fn force_parallel_setting(client: &mut Client) -> String {
    client
        .query_one(
            "SELECT name FROM pg_catalog.pg_settings
              WHERE name IN ('force_parallel_mode', 'debug_parallel_query')",
            &[],
        )
        .expect("pg_settings")
        .get(0)
}

/// Runs a program to its end and returns what it printed (standard output, then
/// standard error); panics with both when it fails.
pub fn run(cmd: &mut std::process::Command) -> String {
    let out = cmd.output().expect("run a program");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{text}",
        out.status
    );
    text
}
