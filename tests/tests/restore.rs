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

use pg_envelopes_tests::whole_store::{check_restored, fill, keys, outbox_drain, state};
use pg_envelopes_tests::{drain_envelopes, run, TestDb};
use postgres::{Client, NoTls};
use std::path::PathBuf;
use std::process::Command;

fn pg_bin(tool: &str) -> PathBuf {
    let dir = std::env::var("PG_BIN").unwrap_or_else(|_| "/usr/lib/postgresql/15/bin".into());
    PathBuf::from(dir).join(tool)
}

/// A libpq connection string of `db` (with `dbname`).
fn conninfo(server: &str, db: &str) -> String {
    format!("{server} dbname={db}")
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
    let _restored = match form {
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
    };
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
