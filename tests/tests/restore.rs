//! `pg_dump` and `pg_restore` give back the whole store: envelopes and bands with
//! their indexes once, the outbox with undelivered rows, consumers with their
//! positions, the late feed, dead letters, ingress positions; and the feed works
//! afterwards, in the same cluster and in a new one whose transaction counter is
//! far below the source's (`inserted_xid` values from another cluster).
//!
//! Every common form: custom with `pg_restore`, custom with `pg_restore
//! --single-transaction --exit-on-error`, directory with `pg_restore -j 4`, and
//! plain SQL through `psql -v ON_ERROR_STOP=1`.
//!
//! `ENVELOPES_TEST_PG_FRESH` names a second server started fresh by
//! scripts/test.sh (its counter near 1,000); the source burns 50,000 transaction
//! ids first.

use pg_envelopes_tests::{drain_envelopes, envelope_ack, envelope_batch, Handed, TestDb};
use postgres::{Client, NoTls};
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;

fn pg_bin(tool: &str) -> PathBuf {
    let dir = std::env::var("PG_BIN").unwrap_or_else(|_| "/usr/lib/postgresql/15/bin".into());
    PathBuf::from(dir).join(tool)
}

fn run(cmd: &mut Command) {
    let out = cmd.output().expect("run a client program");
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A libpq connection string of `db` (with `dbname`).
fn conninfo(server: &str, db: &str) -> String {
    format!("{server} dbname={db}")
}

/// Everything the store holds that a restore must give back, in a comparable form.
fn state(c: &mut Client) -> Vec<String> {
    let queries = [
        "SELECT 'view ' || count(*) || ' ' || COALESCE(md5(string_agg(
                originator_node_id || ':' || originator_sequence_id || ':' || encode(topic, 'hex') || ':' ||
                encode(originator_envelope, 'hex') || ':' || COALESCE(payer_id::text, '-') || ':' ||
                COALESCE(expiry::text, '-') || ':' || gateway_time::text,
                ',' ORDER BY originator_node_id, originator_sequence_id)), '')
           FROM envelopes.gateway_envelopes_view",
        "SELECT 'late rows ' || string_agg(originator_node_id || ':' || originator_sequence_id, ','
                ORDER BY originator_node_id, originator_sequence_id)
           FROM envelopes.gateway_envelopes_meta WHERE late",
        "SELECT 'band ' || originator_node_id || ' ' || band_start || ' ' || band_end
           FROM envelopes.partitions()",
        "SELECT 'indexes ' || c.relname || ' ' || count(*)
           FROM pg_catalog.pg_index i JOIN pg_catalog.pg_class c ON c.oid = i.indrelid
          WHERE c.relnamespace = 'envelopes'::regnamespace AND c.relname LIKE 'gateway_envelopes_%'
          GROUP BY c.relname",
        "SELECT 'outbox ' || id || ' ' || subject || ' ' || encode(payload, 'hex') FROM envelopes.outbox",
        "SELECT 'consumer ' || name || ' ' || outbox_id || ' ' || late_id || ' ' || COALESCE(owner::regrole::text, '-')
           FROM envelopes.consumers",
        "SELECT 'cursor ' || consumer || ' ' || originator_node_id || ' ' || sequence_id
           FROM envelopes.consumer_envelope_cursors",
        "SELECT 'late entry ' || id || ' ' || originator_node_id || ' ' || originator_sequence_id || ' ' ||
                COALESCE(last_sequence_id::text, '-')
           FROM envelopes.late_envelopes",
        "SELECT 'dead letter ' || id || ' ' || consumer || ' ' || kind || ' ' || reason FROM envelopes.dead_letters",
        "SELECT 'ingress ' || consumer || ' ' || stream || ' ' || position || ' ' || COALESCE(owner::regrole::text, '-') FROM envelopes.ingress_positions",
        "SELECT 'pruned ' || originator_node_id || ' ' || originator_sequence_id FROM envelopes.pruned_maxima",
        "SELECT 'orphans ' || count(*) FROM envelopes.orphaned_envelopes()",
    ];
    let mut out = Vec::new();
    for q in queries {
        for row in c.query(q, &[]).unwrap_or_else(|e| panic!("{q}: {e}")) {
            if let Some(s) = row.get::<_, Option<String>>(0) {
                out.push(s);
            }
        }
    }
    out.sort();
    out
}

fn keys(handed: &[Handed]) -> BTreeSet<(i32, i64)> {
    handed.iter().map(|h| (h.node, h.seq)).collect()
}

fn outbox_drain(c: &mut Client, consumer: &str) -> Vec<i64> {
    let mut all = Vec::new();
    loop {
        let ids: Vec<i64> = c
            .query(
                "SELECT id FROM envelopes.consumer_outbox_batch($1)",
                &[&consumer],
            )
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        let Some(&last) = ids.last() else {
            return all;
        };
        c.execute(
            "SELECT envelopes.consumer_outbox_ack($1, $2)",
            &[&consumer, &last],
        )
        .unwrap();
        all.extend(ids);
    }
}

/// A store in use: three originators over several bands, late rows, a consumer
/// part way through both feeds, undelivered outbox rows, a dead letter, ingress
/// positions.
fn fill(c: &mut Client) {
    c.batch_execute(
        "SET envelopes.band_width = 1000;
         SELECT envelopes.insert_gateway_envelope(n, s, pg_catalog.int4send(n % 3), pg_catalog.int8send(s),
                                                 payer_id => n, expiry => CASE WHEN s % 7 = 0 THEN 4000000000 END)
           FROM generate_series(1, 3) n, generate_series(1, 3000, 3) s;
         SELECT envelopes.consumer_register('bridge');
         SELECT envelopes.publish('orders.created', pg_catalog.int4send(i)) FROM generate_series(1, 5) i;",
    )
    .unwrap();
    // Part way: one batch of envelopes acknowledged, two outbox rows.
    let batch = envelope_batch(c, "bridge", 400).unwrap();
    envelope_ack(c, "bridge", &batch).unwrap();
    c.execute("SELECT envelopes.consumer_outbox_ack('bridge', 2)", &[])
        .unwrap();
    // Late rows: below what the consumer and the store have passed.
    c.batch_execute(
        "SELECT envelopes.insert_gateway_envelope(1, s, '\\x09', '\\x09') FROM generate_series(2, 300, 3) s;
         SELECT envelopes.insert_gateway_envelopes(ARRAY[2, 2], ARRAY[5, 8]::bigint[],
                ARRAY['\\x09', '\\x09']::bytea[], ARRAY['\\x0a', '\\x0b']::bytea[]);
         SELECT envelopes.consumer_dead_letter('bridge', 'envelope', 3, 4, NULL, 'too big', 'size', 3);
         SELECT envelopes.ingress_store_position('importer', 'ORDERS', 42);
         SELECT envelopes.ingress_store_position('other', 'EVENTS', 7);
         SELECT envelopes.publish('orders.paid', '\\x01');",
    )
    .unwrap();
}

/// Burns `n` transaction ids in the database `c` is connected to.
fn burn_xids(c: &mut Client, n: i32) {
    c.batch_execute("SET synchronous_commit = off").unwrap();
    c.batch_execute(&format!(
        "DO $$ BEGIN FOR i IN 1..{n} LOOP PERFORM pg_catalog.pg_current_xact_id(); COMMIT; END LOOP; END $$"
    ))
    .unwrap();
}

#[derive(Clone, Copy, Debug)]
enum Form {
    Custom,
    CustomSingleTransaction,
    DirectoryParallel,
    Plain,
}

const FORMS: [Form; 4] = [
    Form::Custom,
    Form::CustomSingleTransaction,
    Form::DirectoryParallel,
    Form::Plain,
];

/// Dumps `source` in `form` and restores it into the empty database `target`.
fn dump_and_restore(form: Form, source: &str, target: &str, dir: &std::path::Path) {
    let file = dir.join(format!("{form:?}"));
    let _ = std::fs::remove_dir_all(&file);
    let _ = std::fs::remove_file(&file);
    let mut dump = Command::new(pg_bin("pg_dump"));
    dump.arg("-d").arg(source).arg("-f").arg(&file);
    match form {
        Form::Custom | Form::CustomSingleTransaction => {
            dump.arg("-Fc");
        }
        Form::DirectoryParallel => {
            dump.args(["-Fd", "-j", "2"]);
        }
        Form::Plain => {
            dump.arg("-Fp");
        }
    }
    run(&mut dump);
    match form {
        Form::Custom => run(Command::new(pg_bin("pg_restore"))
            .args(["--exit-on-error", "-d", target])
            .arg(&file)),
        Form::CustomSingleTransaction => run(Command::new(pg_bin("pg_restore"))
            .args(["--single-transaction", "--exit-on-error", "-d", target])
            .arg(&file)),
        Form::DirectoryParallel => run(Command::new(pg_bin("pg_restore"))
            .args(["-j", "4", "--exit-on-error", "-d", target])
            .arg(&file)),
        Form::Plain => run(Command::new(pg_bin("psql"))
            .args(["-q", "-X", "-v", "ON_ERROR_STOP=1", "-d", target, "-f"])
            .arg(&file)),
    }
}

/// An empty database on `server`, dropped on drop.
struct Empty {
    server: String,
    name: String,
}

impl Empty {
    fn new(server: &str, label: &str) -> Empty {
        let name = format!("r_{label}_{}", std::process::id());
        let mut admin = Client::connect(&conninfo(server, "postgres"), NoTls).unwrap();
        admin
            .batch_execute(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
            .unwrap();
        admin
            .batch_execute(&format!("CREATE DATABASE \"{name}\""))
            .unwrap();
        Empty {
            server: server.to_owned(),
            name,
        }
    }

    fn connect(&self) -> Client {
        Client::connect(&conninfo(&self.server, &self.name), NoTls).unwrap()
    }
}

impl Drop for Empty {
    fn drop(&mut self) {
        if let Ok(mut admin) = Client::connect(&conninfo(&self.server, "postgres"), NoTls) {
            let _ = admin.batch_execute(&format!(
                "DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)",
                self.name
            ));
        }
    }
}

/// After a restore: the same state; the consumer resumes where it stopped (the
/// rows the source would hand it next, no more, no fewer); a consumer registered
/// now drains every row once, late ones included; writes of every kind work.
fn check_restored(
    what: &str,
    source: &mut Client,
    expected_state: &[String],
    expected_next: &BTreeSet<(i32, i64)>,
    expected_outbox: &[i64],
    target: &mut Client,
) {
    assert_eq!(state(target), expected_state, "{what}: restored state");
    let next = drain_envelopes(target, "bridge");
    assert_eq!(keys(&next), *expected_next, "{what}: the consumer resumes");
    assert_eq!(next.len(), expected_next.len(), "{what}: nothing twice");
    assert_eq!(
        outbox_drain(target, "bridge"),
        expected_outbox,
        "{what}: outbox"
    );

    target
        .execute("SELECT envelopes.consumer_register('after')", &[])
        .unwrap();
    let all = drain_envelopes(target, "after");
    let total: i64 = target
        .query_one("SELECT count(*) FROM envelopes.gateway_envelopes_meta", &[])
        .unwrap()
        .get(0);
    assert_eq!(
        all.len() as i64,
        total,
        "{what}: a new consumer gets every row once"
    );
    assert_eq!(keys(&all).len() as i64, total, "{what}: no row twice");

    // Writes after the restore: an existing band, a new band, a new originator,
    // a late row, a duplicate, an outbox row.
    let insert = |c: &mut Client, node: i32, seq: i64| -> i64 {
        c.query_one(
            "SELECT envelopes.insert_gateway_envelope($1, $2, '\\x01', '\\x02')",
            &[&node, &seq],
        )
        .unwrap_or_else(|e| panic!("{what}: insert ({node}, {seq}): {e}"))
        .get(0)
    };
    assert_eq!(insert(target, 1, 3_001), 1, "{what}: existing band");
    assert_eq!(insert(target, 1, 50_000), 1, "{what}: new band");
    assert_eq!(insert(target, 9, 1), 1, "{what}: new originator");
    assert_eq!(insert(target, 2, 11), 1, "{what}: late");
    assert_eq!(insert(target, 2, 11), 0, "{what}: duplicate");
    assert_eq!(
        insert(target, 3, 4),
        0,
        "{what}: duplicate of a restored row"
    );
    target
        .execute("SELECT envelopes.publish('after.restore', '\\x01')", &[])
        .unwrap_or_else(|e| panic!("{what}: publish: {e}"));
    let written = drain_envelopes(target, "after");
    assert_eq!(
        keys(&written),
        BTreeSet::from([(1, 3_001), (1, 50_000), (9, 1), (2, 11)]),
        "{what}: rows written after the restore"
    );
    assert!(
        written
            .iter()
            .any(|h| h.node == 2 && h.seq == 11 && h.late_id.is_some()),
        "{what}: the late row came from the late feed"
    );
    let _ = source;
}

/// A LOGIN role on each of `servers` (the dump names it; a restore needs it to
/// exist), dropped on drop. A second role made first on the target makes the
/// role's oid differ between the clusters.
struct Roles {
    name: String,
    servers: Vec<String>,
}

impl Roles {
    fn new(label: &str, servers: &[&str]) -> Roles {
        let name = format!("restore_{label}_{}", std::process::id());
        for (i, server) in servers.iter().enumerate() {
            let mut admin = Client::connect(&conninfo(server, "postgres"), NoTls).unwrap();
            if i > 0 {
                admin
                    .batch_execute(&format!(
                        "DROP ROLE IF EXISTS \"{name}_x\"; CREATE ROLE \"{name}_x\""
                    ))
                    .unwrap();
            }
            admin
                .batch_execute(&format!(
                    "DROP ROLE IF EXISTS \"{name}\"; CREATE ROLE \"{name}\" LOGIN"
                ))
                .unwrap();
        }
        Roles {
            name,
            servers: servers.iter().map(|s| s.to_string()).collect(),
        }
    }
}

impl Drop for Roles {
    fn drop(&mut self) {
        for server in &self.servers {
            if let Ok(mut admin) = Client::connect(&conninfo(server, "postgres"), NoTls) {
                let _ = admin.batch_execute(&format!(
                    "DROP ROLE IF EXISTS \"{0}\"; DROP ROLE IF EXISTS \"{0}_x\"",
                    self.name
                ));
            }
        }
    }
}

fn round_trip(target_server: &str, label: &str, burn: bool) {
    let db = TestDb::new(label);
    let mut c = db.connect();
    if burn {
        burn_xids(&mut c, 50_000);
    }
    fill(&mut c);
    // A consumer and an ingress position owned by a role that is not a superuser.
    let servers: Vec<&str> = if target_server == db.server {
        vec![&db.server]
    } else {
        vec![&db.server, target_server]
    };
    let role = Roles::new(label, &servers);
    c.execute("SELECT envelopes.grant_consumer($1)", &[&role.name])
        .unwrap();
    c.execute("SELECT envelopes.grant_writer($1)", &[&role.name])
        .unwrap();
    {
        let mut as_role = Client::connect(
            &format!(
                "{} dbname={} user={}",
                db.server.replace("user=postgres", ""),
                db.name,
                role.name
            ),
            NoTls,
        )
        .unwrap();
        as_role
            .batch_execute(
                "SELECT envelopes.consumer_register('owned');
                 SELECT envelopes.ingress_store_position('owned_importer', 'ORDERS', 9);",
            )
            .unwrap();
    }
    let expected_state = state(&mut c);
    let dir =
        std::env::temp_dir().join(format!("envelopes_restore_{label}_{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut targets = Vec::new();
    for form in FORMS {
        let target = Empty::new(target_server, &format!("{label}_{form:?}").to_lowercase());
        dump_and_restore(
            form,
            &conninfo(&db.server, &db.name),
            &conninfo(target_server, &target.name),
            &dir,
        );
        targets.push((form, target));
    }
    // What the source hands the consumer next, and its undelivered outbox rows.
    let expected_next = keys(&drain_envelopes(&mut c, "bridge"));
    assert!(!expected_next.is_empty());
    let expected_outbox = outbox_drain(&mut c, "bridge");
    assert_eq!(expected_outbox, vec![3, 4, 5, 6]);
    for (form, target) in &targets {
        let mut t = target.connect();
        check_restored(
            &format!("{label} {form:?}"),
            &mut c,
            &expected_state,
            &expected_next,
            &expected_outbox,
            &mut t,
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn dumps_restore_into_the_same_cluster() {
    let server = pg_envelopes_tests::server();
    round_trip(&server, "same", false);
}

/// The target cluster's transaction counter is near 1,000, the source's past
/// 50,000: the rows' `inserted_xid` values are from the future there.
#[test]
fn dumps_restore_into_a_new_cluster_behind_in_transaction_ids() {
    let Ok(fresh) = std::env::var("ENVELOPES_TEST_PG_FRESH") else {
        panic!("ENVELOPES_TEST_PG_FRESH is not set: run through scripts/test.sh");
    };
    round_trip(&fresh, "fresh", true);
}
