//! A bridge pointed at PgBouncer (Debian `pgbouncer`, started by the test on a
//! port of its own, as the postgres user) in transaction or statement mode is
//! refused at start with the reason (exit 78); in session mode it works.
//!
//! On 211056c bridges behind a transaction-mode PgBouncer flipped between
//! active and standby, failed their own acknowledgements (55006) and hit
//! prepared-statement errors.
//!
//! A lease taken through a transaction-mode pool stays on the pooled server
//! connection after its client has gone (PgBouncer keeps that connection for
//! server_idle_timeout, 600 s by default): a bridge connected straight to
//! Postgres ends that silent holder after its --session-timeout
//! (envelopes.lease_timeout) and takes over. On 211056c it stood by.

mod common;

use common::target::jsonl_ids;
use common::*;
use std::process::{Command, Stdio};
use std::time::Duration;

/// A PgBouncer in front of the test cluster, in `mode`; stopped on drop.
struct Bouncer {
    port: u16,
    dir: std::path::PathBuf,
    child: std::process::Child,
}

impl Bouncer {
    fn start(mode: &str) -> Bouncer {
        let (mut host, mut pg_port) = ("127.0.0.1".to_owned(), "5432".to_owned());
        for kv in server().split_whitespace() {
            match kv.split_once('=') {
                Some(("host", v)) => host = v.into(),
                Some(("port", v)) => pg_port = v.into(),
                _ => {}
            }
        }
        let port = free_port();
        let dir = std::env::temp_dir().join(unique("bouncer"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("users.txt"), "\"postgres\" \"\"\n").unwrap();
        std::fs::write(
            dir.join("pgbouncer.ini"),
            format!(
                "[databases]\n* = host={host} port={pg_port}\n\n[pgbouncer]\n\
                 listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
                 auth_type = trust\nauth_file = {users}\npool_mode = {mode}\n\
                 default_pool_size = 5\nlogfile = {log}\n",
                users = dir.join("users.txt").display(),
                log = dir.join("pgbouncer.log").display(),
            ),
        )
        .unwrap();
        let _ = Command::new("chown")
            .args(["-R", "postgres:postgres", dir.to_str().unwrap()])
            .status();
        let child = Command::new("runuser")
            .args(["-u", "postgres", "--", "/usr/sbin/pgbouncer"])
            .arg(dir.join("pgbouncer.ini"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start pgbouncer (Debian package pgbouncer)");
        wait_for_port(port);
        Bouncer { port, dir, child }
    }

    fn url(&self, db: &TestDb) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{}", self.port, db.name)
    }
}

impl Drop for Bouncer {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn refused_behind(mode: &str) {
    let bouncer = Bouncer::start(mode);
    let db = TestDb::new(&format!("pool{mode}"));
    refused_through(&bouncer, &db, mode);
}

/// Starts a bridge through `bouncer` to `db` and expects it refused.
fn refused_through(bouncer: &Bouncer, db: &TestDb, mode: &str) {
    let path = std::env::temp_dir().join(format!("{}.jsonl", unique("pooled")));
    let mut bridge = Bridge::egress_with_url(
        &bouncer.url(db),
        "pooled",
        &format!("jsonl:{}", path.display()),
        &[],
        &[],
    );
    let code = bridge.exit_code_within(Duration::from_secs(30));
    let log = bridge.log_text();
    assert_eq!(
        code,
        Some(78),
        "a bridge behind a {mode}-mode pooler must stop with exit 78:\n{log}"
    );
    assert!(
        log.contains("pooler in transaction or statement mode"),
        "the reason is not given:\n{log}"
    );
    let _ = std::fs::remove_file(&path);
}

#[test]
fn a_transaction_mode_pooler_is_refused_at_start() {
    refused_behind("transaction");
}

/// Other clients keep the pool's server connections changing hands while the
/// bridge starts, so that the connection its check's probe gets is often not
/// the one the bridge's session just released (PgBouncer opens and hands out
/// connections in an order no client controls). On ca8704b a single probe
/// missed now and then even without other clients (once in CI): the bridge
/// took the lease through the pool and ran. With the check of ca8704b this
/// test failed in 1 of 3 runs here; with up to three probes, 0 of 6.
#[test]
fn a_transaction_mode_pooler_is_refused_while_other_clients_use_the_pool() {
    let bouncer = Bouncer::start("transaction");
    let db = TestDb::new("poolbusy");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let others: Vec<_> = (0..2)
        .map(|_| {
            let url = bouncer.url(&db);
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
                let mut statements = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    c.simple_query("SELECT pg_catalog.pg_sleep(0.002)").unwrap();
                    statements += 1;
                }
                statements
            })
        })
        .collect();
    for round in 0..5 {
        println!("round {round}");
        refused_through(&bouncer, &db, "transaction");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for other in others {
        assert!(other.join().unwrap() > 0, "a busy client ran no statement");
    }
}

#[test]
fn a_statement_mode_pooler_is_refused_at_start() {
    refused_behind("statement");
}

#[test]
fn a_session_mode_pooler_works() {
    let bouncer = Bouncer::start("session");
    let db = TestDb::new("poolsession");
    let path = std::env::temp_dir().join(format!("{}.jsonl", unique("pooled")));
    let mut bridge = Bridge::egress_with_url(
        &bouncer.url(&db),
        "pooled",
        &format!("jsonl:{}", path.display()),
        &[],
        &[],
    );
    let mut c = db.client();
    for seq in 1..=20 {
        insert(&mut c, 1, seq);
    }
    wait_for_bridge(
        &bridge,
        "20 rows through a session pool",
        Duration::from_secs(30),
        || jsonl_ids(&path).len() >= 20,
    );
    bridge.terminate();
    let _ = std::fs::remove_file(&path);
}

#[test]
fn a_lease_left_on_a_pooled_connection_does_not_block_a_direct_bridge() {
    let bouncer = Bouncer::start("transaction");
    let db = TestDb::new("poolleft");
    let mut direct = db.client();
    direct
        .execute("SELECT envelopes.consumer_register('left')", &[])
        .unwrap();
    // A client takes the lease through the pool and goes away; PgBouncer keeps
    // the server connection, and the lease with it.
    {
        let mut pooled = postgres::Client::connect(&bouncer.url(&db), postgres::NoTls).unwrap();
        let acquired: bool = pooled
            .simple_query("SELECT acquired FROM envelopes.consumer_lease('left')")
            .unwrap()
            .iter()
            .find_map(|m| match m {
                postgres::SimpleQueryMessage::Row(r) => r.get(0).map(|v| v == "t"),
                _ => None,
            })
            .unwrap_or(false);
        assert!(acquired, "the lease was not taken through the pool");
    }
    std::thread::sleep(Duration::from_millis(500));
    let held: bool = direct
        .query_one(
            "SELECT NOT acquired FROM envelopes.consumer_lease('left')",
            &[],
        )
        .unwrap()
        .get(0);
    assert!(
        held,
        "the lease did not stay on the pooled server connection"
    );
    for seq in 1..=20 {
        insert(&mut direct, 1, seq);
    }
    let path = std::env::temp_dir().join(format!("{}.jsonl", unique("leftover")));
    let started = std::time::Instant::now();
    let mut bridge = Bridge::egress(
        &db,
        "left",
        &format!("jsonl:{}", path.display()),
        &["--session-timeout", "3"],
        &[],
    );
    wait_for_bridge(
        &bridge,
        "20 rows from a direct bridge while a pooled connection held the lease",
        Duration::from_secs(30),
        || jsonl_ids(&path).len() >= 20,
    );
    let took = started.elapsed();
    let log = bridge.log_text();
    bridge.terminate();
    println!("the direct bridge delivered after {took:?}");
    assert!(
        took < Duration::from_secs(15),
        "the direct bridge waited {took:?} behind the pooled connection's lease:\n{log}"
    );
    assert!(
        log.contains("takes over"),
        "the bridge did not stand by first, so the test did not test the takeover:\n{log}"
    );
    let _ = std::fs::remove_file(&path);
}
