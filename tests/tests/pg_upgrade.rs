//! `pg_upgrade` from Postgres 15 to each newer major this extension builds for,
//! with the extension in use: envelopes across originators and bands, late rows
//! not yet consumed, outbox rows not yet delivered, consumers at positions (one
//! owned by a role that is not a superuser), a dead letter, ingress positions,
//! and the maintenance worker configured (`shared_preload_libraries`, running
//! every second in the upgraded database, so it is there while pg_upgrade runs
//! the new server). Both `--copy` and `--link`. Afterwards every row, position
//! and late entry is there, the consumer resumes with nothing skipped or handed
//! out twice, inserts create bands, amcheck finds every index sound and the
//! maintenance worker runs.
//!
//! scripts/test.sh sets `ENVELOPES_TEST_UPGRADE_TO` to the `bin` directories of
//! the new majors (space-separated; the extension installed into each) and
//! `ENVELOPES_TEST_UPGRADE_DIR` to a directory the `postgres` user may write;
//! the old binaries are `ENVELOPES_TEST_UPGRADE_FROM` (Debian's Postgres 15 by
//! default). Clusters are made, started and stopped here as `postgres`.

use pg_envelopes_tests::whole_store::{check_restored, fill, keys, outbox_drain, state};
use pg_envelopes_tests::{drain_envelopes, run};
use postgres::{Client, NoTls};
use std::path::{Path, PathBuf};
use std::process::Command;

const DB: &str = "app";

/// The settings both clusters start with: the maintenance worker on, every
/// second, in the upgraded database; never creating bands ahead (the state
/// compared stays what the rows made).
const SETTINGS: &str = "shared_preload_libraries = 'pg_envelopes'
envelopes.maintenance_interval = 1
envelopes.maintenance_databases = 'app'
envelopes.premake_fraction = 1
listen_addresses = '127.0.0.1'
";

fn as_postgres(program: &Path) -> Command {
    let mut cmd = Command::new("runuser");
    cmd.args(["-u", "postgres", "--"]).arg(program);
    cmd
}

/// A port below the ephemeral range nothing listens on now.
fn free_port() -> u16 {
    let seed = std::process::id() as u64
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos() as u64;
    (0..12_000)
        .map(|i| 20_000 + ((seed.wrapping_mul(7919) + i * 4001) % 12_000) as u16)
        .find(|&p| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok())
        .expect("a free port")
}

struct Cluster {
    bin: PathBuf,
    data: PathBuf,
    port: u16,
    running: bool,
}

impl Cluster {
    fn init(bin: &Path, data: PathBuf) -> Cluster {
        let mut initdb = as_postgres(&bin.join("initdb"));
        initdb.arg("-D").arg(&data).args([
            "--auth=trust",
            "-U",
            "postgres",
            "-E",
            "UTF8",
            "--locale=C.UTF-8",
        ]);
        // From 18 initdb turns data checksums on unless told otherwise, and
        // pg_upgrade wants the old cluster's setting (off here).
        if major_of(bin).parse::<u32>().unwrap_or(0) >= 18 {
            initdb.arg("--no-data-checksums");
        }
        run(&mut initdb);
        let conf = data.join("postgresql.conf");
        let mut text = std::fs::read_to_string(&conf).unwrap();
        text.push_str(SETTINGS);
        std::fs::write(&conf, text).unwrap();
        Cluster {
            bin: bin.to_owned(),
            data,
            port: free_port(),
            running: false,
        }
    }

    fn start(&mut self) {
        let log = self.data.with_extension("log");
        run(as_postgres(&self.bin.join("pg_ctl"))
            .arg("-D")
            .arg(&self.data)
            .arg("-l")
            .arg(&log)
            .args(["-w", "-t", "60", "-o"])
            .arg(format!(
                "-p {} -k {}",
                self.port,
                self.data.parent().unwrap().display()
            ))
            .arg("start"));
        self.running = true;
    }

    fn stop(&mut self) {
        run(as_postgres(&self.bin.join("pg_ctl"))
            .arg("-D")
            .arg(&self.data)
            .args(["-m", "fast", "-w", "-t", "60", "stop"]));
        self.running = false;
    }

    fn server(&self) -> String {
        format!("host=127.0.0.1 port={} user=postgres", self.port)
    }

    fn connect(&self, db: &str) -> Client {
        Client::connect(&format!("{} dbname={db}", self.server()), NoTls)
            .unwrap_or_else(|e| panic!("connect to {} on {}: {e:?}", db, self.port))
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.running {
            let _ = as_postgres(&self.bin.join("pg_ctl"))
                .arg("-D")
                .arg(&self.data)
                .args(["-m", "immediate", "stop"])
                .output();
        }
    }
}

/// The state compared, plus the maintenance worker's runs so far (which only
/// grow).
fn maintenance_runs(c: &mut Client) -> i64 {
    c.query_one("SELECT count(*) FROM envelopes.maintenance_runs", &[])
        .unwrap()
        .get(0)
}

/// amcheck over every B-tree of the store (with heapallindexed: every heap row
/// has its index entries); panics with the first complaint.
fn amcheck(c: &mut Client, what: &str) {
    c.batch_execute("CREATE EXTENSION IF NOT EXISTS amcheck")
        .unwrap();
    let checked: i64 = c
        .query_one(
            "SELECT count(*) FROM (
                 SELECT public.bt_index_check(i.indexrelid, true)
                   FROM pg_catalog.pg_index i
                   JOIN pg_catalog.pg_class c ON c.oid = i.indexrelid
                   JOIN pg_catalog.pg_am a ON a.oid = c.relam
                  WHERE c.relnamespace = 'envelopes'::pg_catalog.regnamespace
                    AND a.amname = 'btree' AND c.relkind = 'i') checked",
            &[],
        )
        .unwrap_or_else(|e| panic!("{what}: amcheck: {e}"))
        .get(0);
    assert!(checked > 10, "{what}: amcheck saw only {checked} indexes");
}

fn major_of(bin: &Path) -> String {
    let version = run(Command::new(bin.join("pg_config")).arg("--version"));
    version
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.split('.').next())
        .unwrap_or("?")
        .to_owned()
}

/// The role-owned consumer and ingress position (a role other than the
/// bootstrap superuser: its oid is kept by pg_upgrade, its grants too).
fn add_owned(old: &Cluster) {
    let mut c = old.connect(DB);
    c.batch_execute(
        "CREATE ROLE upgrade_owner LOGIN;
         SELECT envelopes.grant_consumer('upgrade_owner');
         SELECT envelopes.grant_writer('upgrade_owner');",
    )
    .unwrap();
    let mut owner = Client::connect(
        &format!(
            "host=127.0.0.1 port={} user=upgrade_owner dbname={DB}",
            old.port
        ),
        NoTls,
    )
    .unwrap();
    owner
        .batch_execute(
            "SELECT envelopes.consumer_register('owned');
             SELECT envelopes.ingress_store_position('owned_importer', 'ORDERS', 9);",
        )
        .unwrap();
}

fn upgrade(old_bin: &Path, new_bin: &Path, dir: &Path, mode: &str) {
    let major = major_of(new_bin);
    let work = dir.join(format!("{major}-{mode}"));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).unwrap();
    run(Command::new("chown").arg("postgres:postgres").arg(&work));
    let what = format!("15 -> {major} ({mode})");

    let mut old = Cluster::init(old_bin, work.join("old"));
    old.start();
    {
        let mut c = old.connect("postgres");
        c.batch_execute(&format!("CREATE DATABASE {DB}")).unwrap();
        let mut c = old.connect(DB);
        c.batch_execute("CREATE EXTENSION pg_envelopes").unwrap();
        fill(&mut c);
    }
    add_owned(&old);
    let (expected_state, runs_before) = {
        let mut c = old.connect(DB);
        (state(&mut c), maintenance_runs(&mut c))
    };
    assert!(!expected_state.is_empty());
    old.stop();
    // A copy of the stopped old cluster: what the consumer is handed next is
    // read from it after the upgrade (with --link the old cluster is gone).
    let reference_dir = work.join("reference");
    run(Command::new("cp")
        .arg("-a")
        .arg(&old.data)
        .arg(&reference_dir));

    let mut new = Cluster::init(new_bin, work.join("new"));
    let out = run(Command::new("runuser")
        .args(["-u", "postgres", "--", "sh", "-c"])
        .arg(format!(
            "cd '{}' && '{}' -b '{}' -B '{}' -d '{}' -D '{}' -p {} -P {} -s '{}' {mode}",
            work.display(),
            new_bin.join("pg_upgrade").display(),
            old_bin.display(),
            new_bin.display(),
            old.data.display(),
            new.data.display(),
            old.port,
            new.port,
            work.display(),
        )));
    assert!(out.contains("Upgrade Complete"), "{what}: {out}");

    let mut reference = Cluster {
        bin: old_bin.to_owned(),
        data: reference_dir,
        port: free_port(),
        running: false,
    };
    reference.start();
    let (expected_next, expected_outbox) = {
        let mut c = reference.connect(DB);
        let next = keys(&drain_envelopes(&mut c, "bridge"));
        (next, outbox_drain(&mut c, "bridge"))
    };
    assert!(!expected_next.is_empty());
    assert_eq!(expected_outbox, vec![3, 4, 5, 6]);

    new.start();
    let mut c = new.connect(DB);
    let version: String = c.query_one("SHOW server_version_num", &[]).unwrap().get(0);
    assert!(version.starts_with(&major), "{what}: server {version}");
    amcheck(&mut c, &what);
    // The role-owned consumer and position came along, owned by the same role.
    let owned: i64 = c
        .query_one(
            "SELECT count(*) FROM envelopes.consumers WHERE name = 'owned'
                AND owner = 'upgrade_owner'::pg_catalog.regrole",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(owned, 1, "{what}: the role-owned consumer");
    let mut reference_client = reference.connect(DB);
    check_restored(
        &what,
        &mut reference_client,
        &expected_state,
        &expected_next,
        &expected_outbox,
        &mut c,
    );
    amcheck(&mut c, &format!("{what}, after the writes"));
    // The maintenance worker runs in the upgraded cluster (every second).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let runs = maintenance_runs(&mut c);
        if runs > runs_before {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: no maintenance run in 30 s after the upgrade ({runs} runs)"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    drop(c);
    reference.stop();
    new.stop();
    let _ = std::fs::remove_dir_all(&work);
}

fn targets() -> Option<(PathBuf, Vec<PathBuf>, PathBuf)> {
    let to = std::env::var("ENVELOPES_TEST_UPGRADE_TO").ok()?;
    let dir = std::env::var("ENVELOPES_TEST_UPGRADE_DIR")
        .expect("ENVELOPES_TEST_UPGRADE_DIR: a directory the postgres user may write");
    let from = std::env::var("ENVELOPES_TEST_UPGRADE_FROM")
        .unwrap_or_else(|_| "/usr/lib/postgresql/15/bin".into());
    Some((
        from.into(),
        to.split_whitespace().map(PathBuf::from).collect(),
        dir.into(),
    ))
}

#[test]
fn pg_upgrade_with_copy_keeps_every_row_position_and_late_entry() {
    let Some((from, to, dir)) = targets() else {
        eprintln!("ENVELOPES_TEST_UPGRADE_TO is not set: scripts/test.sh runs this after building the newer majors");
        return;
    };
    for bin in &to {
        upgrade(&from, bin, &dir, "--copy");
    }
}

#[test]
fn pg_upgrade_with_link_keeps_every_row_position_and_late_entry() {
    let Some((from, to, dir)) = targets() else {
        eprintln!("ENVELOPES_TEST_UPGRADE_TO is not set: scripts/test.sh runs this after building the newer majors");
        return;
    };
    for bin in &to {
        upgrade(&from, bin, &dir, "--link");
    }
}
