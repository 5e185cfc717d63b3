//! The one harness of the bridge's end-to-end tests: a fresh database per test
//! in the throwaway cluster started by scripts/test.sh (`ENVELOPES_TEST_PG`),
//! the bridge binary started and killed as a real process, and the real buses
//! (`ENVELOPES_TEST_NATS`, `ENVELOPES_TEST_REDIS`, `ENVELOPES_TEST_MQTT`, with the
//! local defaults) under names unique to each run. Beside it: the buses as
//! their own clients see them ([`buses`]), a sink under test read back
//! ([`target`]), the kill -9 scenario ([`kill9`]) and a private Postgres server
//! ([`cluster`]).

#![allow(dead_code)]

pub mod buses;
pub mod checker;
pub mod cluster;
pub mod kill9;
pub mod target;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub fn server() -> String {
    std::env::var("ENVELOPES_TEST_PG")
        .expect("ENVELOPES_TEST_PG is not set: run the tests through scripts/test.sh")
}

pub fn nats_url() -> String {
    std::env::var("ENVELOPES_TEST_NATS").unwrap_or_else(|_| "nats://127.0.0.1:4222".into())
}

pub fn redis_url() -> String {
    std::env::var("ENVELOPES_TEST_REDIS").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

pub fn mqtt_url() -> String {
    std::env::var("ENVELOPES_TEST_MQTT").unwrap_or_else(|_| "mqtt://127.0.0.1:1883".into())
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A name unique to this test run: fresh streams, keys and topics every time.
pub fn unique(label: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!(
        "{label}{}x{}x{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed),
        nanos % 1_000_000_000
    )
}

pub struct TestDb {
    pub name: String,
}

impl TestDb {
    pub fn new(label: &str) -> TestDb {
        let name = unique(&format!("b_{label}_"));
        let mut admin =
            postgres::Client::connect(&format!("{} dbname=postgres", server()), postgres::NoTls)
                .expect("connect to the test server");
        admin
            .batch_execute(&format!("CREATE DATABASE \"{name}\""))
            .unwrap();
        let db = TestDb { name };
        db.client()
            .batch_execute("CREATE EXTENSION pg_envelopes")
            .unwrap();
        db
    }

    /// libpq key=value connection string of this database.
    pub fn conninfo(&self) -> String {
        format!("{} dbname={}", server(), self.name)
    }

    /// The same as a postgres:// URL, for the bridge.
    pub fn url(&self) -> String {
        let mut host = "127.0.0.1".to_owned();
        let mut port = "5432".to_owned();
        let mut user = "postgres".to_owned();
        for kv in server().split_whitespace() {
            match kv.split_once('=') {
                Some(("host", v)) => host = v.into(),
                Some(("port", v)) => port = v.into(),
                Some(("user", v)) => user = v.into(),
                _ => {}
            }
        }
        format!("postgres://{user}@{host}:{port}/{}", self.name)
    }

    pub fn client(&self) -> postgres::Client {
        postgres::Client::connect(&self.conninfo(), postgres::NoTls).expect("connect")
    }

    pub fn int8(&self, sql: &str) -> i64 {
        self.client().query_one(sql, &[]).expect(sql).get(0)
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if let Ok(mut admin) =
            postgres::Client::connect(&format!("{} dbname=postgres", server()), postgres::NoTls)
        {
            let _ = admin.batch_execute(&format!(
                "DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)",
                self.name
            ));
        }
    }
}

/// A running bridge process; killed (SIGKILL) on drop.
pub struct Bridge {
    pub child: Child,
    pub log: PathBuf,
}

/// The bridge binary under test: this build's, or `ENVELOPES_TEST_BRIDGE_BIN`
/// (to run the tests against another build, e.g. to check that a test fails on
/// the code before a fix).
pub fn bridge_binary() -> String {
    std::env::var("ENVELOPES_TEST_BRIDGE_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_envelopes-bridge").to_owned())
}

pub fn bridge_command(args: &[&str]) -> Command {
    let mut cmd = Command::new(bridge_binary());
    cmd.args(args).env_remove("RUST_BACKTRACE");
    cmd
}

impl Bridge {
    /// Starts `envelopes-bridge egress` with the given sink and extra arguments and
    /// environment (creating the consumer if it does not exist: `--register`); its
    /// stderr goes to a log file, its stdout nowhere.
    pub fn egress(
        db: &TestDb,
        name: &str,
        sink: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Bridge {
        Bridge::egress_with_url(&db.url(), name, sink, extra, env)
    }

    /// The same with an explicit database URL (credentials, sslmode).
    pub fn egress_with_url(
        url: &str,
        name: &str,
        sink: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Bridge {
        let log = std::env::temp_dir().join(format!("{}.log", unique("bridge")));
        let mut args = vec![
            "egress",
            "--database-url",
            url,
            "--name",
            name,
            "--sink",
            sink,
            "--poll-interval-ms",
            "100",
        ]
        .into_iter()
        .map(str::to_owned)
        .collect::<Vec<_>>();
        // A bridge from before 0.4.0 (ENVELOPES_TEST_BRIDGE_OLD=1, with
        // ENVELOPES_TEST_BRIDGE_BIN) registers an unknown name by itself and
        // does not know the flag.
        if std::env::var_os("ENVELOPES_TEST_BRIDGE_OLD").is_none() {
            args.push("--register".to_owned());
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        let mut cmd = Command::new(bridge_binary());
        cmd.args(&args)
            .env_remove("RUST_BACKTRACE")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        for (k, v) in env {
            cmd.env(k, v);
        }
        Bridge {
            child: cmd.spawn().expect("start the bridge"),
            log,
        }
    }

    pub fn kill9(&mut self) {
        let _ = self.child.kill(); // SIGKILL on Unix
        let _ = self.child.wait();
    }

    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        self.child.wait().expect("wait for the bridge")
    }

    /// The exit code, once the process ended by itself within `limit` (None if
    /// it is still running then, or a signal ended it).
    pub fn exit_code_within(&mut self, limit: Duration) -> Option<i32> {
        let start = Instant::now();
        while start.elapsed() < limit {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status.code();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits until `done()` holds, polling; panics with `what` after `limit`.
pub fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        if start.elapsed() > limit {
            panic!("timed out after {limit:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Like [`wait_until`], and shows the bridge's log when time runs out.
pub fn wait_for_bridge(
    bridge: &Bridge,
    what: &str,
    limit: Duration,
    mut done: impl FnMut() -> bool,
) {
    let start = Instant::now();
    while !done() {
        if start.elapsed() > limit {
            panic!(
                "timed out after {limit:?} waiting for {what}; the bridge's log:\n{}",
                bridge.log_text()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A TCP port on 127.0.0.1 that nothing listens on right now, for a private server.
///
/// Chosen below the kernel's ephemeral range (32768 and up on Linux), never
/// twice in one process: a port handed out by `bind(0)` comes from that range,
/// and an outgoing connection (a NATS node soliciting its routes, a client) can
/// take it between the choice and the private server's own bind.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    const LOW: u32 = 20_000;
    const SPAN: u32 = 12_000;
    let seed = std::process::id().wrapping_mul(7919)
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
    let _ = NEXT.compare_exchange(0, seed % SPAN + 1, Ordering::SeqCst, Ordering::SeqCst);
    for _ in 0..SPAN {
        let port = LOW + NEXT.fetch_add(1, Ordering::SeqCst) % SPAN;
        if std::net::TcpListener::bind(("127.0.0.1", port as u16)).is_ok() {
            return port as u16;
        }
    }
    panic!("no free port between {LOW} and {}", LOW + SPAN)
}

/// Waits until something accepts connections on 127.0.0.1:`port`.
pub fn wait_for_port(port: u16) {
    wait_until("a server to listen", Duration::from_secs(10), || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
}

/// A private nats-server with JetStream on `port`, storing under `store`, with
/// extra arguments (e.g. a config file); it is killed when the returned child is.
/// Its log goes to `store`/../nats-PORT.log and is shown if it does not come up.
/// A child process killed when dropped (a test that fails part way leaves no
/// private server running).
pub struct Killed(pub Child);

impl std::ops::Deref for Killed {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for Killed {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn start_nats(port: u16, store: &std::path::Path, extra: &[&str]) -> Killed {
    let binary = std::env::var("ENVELOPES_TEST_NATS_SERVER")
        .unwrap_or_else(|_| "/usr/sbin/nats-server".into());
    let log_path = store
        .parent()
        .unwrap_or(store)
        .join(format!("nats-{port}.log"));
    std::fs::create_dir_all(store).expect("nats store dir");
    let log = std::fs::File::create(&log_path).expect("nats log file");
    let mut child = Command::new(binary)
        .args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd"])
        .arg(store)
        .args(extra)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start nats-server");
    let start = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        let exited = child.try_wait().ok().flatten();
        if exited.is_some() || start.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            let text = std::fs::read_to_string(&log_path).unwrap_or_default();
            panic!("nats-server on port {port} did not come up ({exited:?}):\n{text}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Killed(child)
}

/// The bridge's metrics text from its --metrics-addr.
pub fn scrape(port: u16) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("metrics endpoint");
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    text
}

/// The bridge's metrics text, or empty while its endpoint is not up (yet).
pub fn try_scrape(port: u16) -> String {
    if std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        return String::new();
    }
    scrape(port)
}

/// The value of one sample line (`name{labels} value`) in metrics text, 0 if absent.
pub fn metric(text: &str, sample: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(sample) && l[sample.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// Inserts envelope (`node`, `seq`) with a small topic and blob; returns what
/// `insert_gateway_envelope` returns (1 inserted, 0 already there).
pub fn insert(c: &mut impl postgres::GenericClient, node: i32, seq: i64) -> i64 {
    c.query_one(
        "SELECT envelopes.insert_gateway_envelope($1, $2, '\\x01', '\\x0203')",
        &[&node, &seq],
    )
    .expect("insert")
    .get(0)
}

/// The committed ids that were not delivered.
pub fn missing<'a>(
    committed: &'a BTreeSet<String>,
    delivered: &BTreeSet<String>,
) -> Vec<&'a String> {
    committed
        .iter()
        .filter(|id| !delivered.contains(*id))
        .collect()
}

/// Dedup ids of every committed row: "node:seq" and "outbox:id".
pub fn committed_ids(db: &TestDb) -> BTreeSet<String> {
    committed_ids_in(&mut db.client(), None)
}

/// The same on any connection, with outbox ids as a bridge with
/// `--outbox-scope SCOPE` writes them ("outbox:SCOPE:id") when a scope is given.
pub fn committed_ids_in(c: &mut postgres::Client, outbox_scope: Option<&str>) -> BTreeSet<String> {
    let mut ids = BTreeSet::new();
    for r in c
        .query("SELECT originator_node_id, originator_sequence_id FROM envelopes.gateway_envelopes_meta", &[])
        .unwrap()
    {
        ids.insert(format!("{}:{}", r.get::<_, i32>(0), r.get::<_, i64>(1)));
    }
    for r in c.query("SELECT id FROM envelopes.outbox", &[]).unwrap() {
        let id = r.get::<_, i64>(0);
        ids.insert(match outbox_scope {
            Some(scope) => format!("outbox:{scope}:{id}"),
            None => format!("outbox:{id}"),
        });
    }
    ids
}

/// Rows committed but not yet acknowledged by consumer `name`.
pub fn lag(db: &TestDb, name: &str) -> i64 {
    db.client()
        .query_one(
            "SELECT COALESCE(outbox_pending, 0) + COALESCE(envelopes_pending, 0)
               FROM envelopes.consumer_status WHERE consumer = $1",
            &[&name],
        )
        .map(|r| r.get(0))
        .unwrap_or(i64::MAX)
}

/// One message of a JetStream stream as a test reads it back.
pub struct Stored {
    pub payload: Vec<u8>,
    /// Header name -> first value.
    pub headers: std::collections::BTreeMap<String, String>,
}

/// Every message in a JetStream stream, in stream order.
pub async fn read_stream_messages(url: &str, stream: &str) -> Vec<Stored> {
    use futures_util::StreamExt;
    let client = async_nats::connect(url).await.expect("connect to NATS");
    let js = async_nats::jetstream::new(client);
    let mut s = js.get_stream(stream).await.expect("stream exists");
    let total = s.info().await.expect("stream info").state.messages;
    // A busy server answers a consumer create with 503 "JetStream system
    // temporarily unavailable" (err 10008) now and then; the checker asks again
    // for a while rather than failing the test that it reads for.
    let mut attempts = 0;
    let consumer = loop {
        match s
            .create_consumer(async_nats::jetstream::consumer::pull::Config {
                deliver_policy: async_nats::jetstream::consumer::DeliverPolicy::All,
                ack_policy: async_nats::jetstream::consumer::AckPolicy::None,
                ..Default::default()
            })
            .await
        {
            Ok(consumer) => break consumer,
            Err(e) if attempts < 60 => {
                attempts += 1;
                eprintln!("read_stream_messages: creating the checker's consumer: {e}; again");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => panic!("consumer on {stream}: {e}"),
        }
    };
    let mut out = Vec::new();
    while (out.len() as u64) < total {
        let mut batch = consumer
            .fetch()
            .max_messages(1000)
            .expires(Duration::from_secs(2))
            .messages()
            .await
            .expect("fetch");
        let mut got = 0;
        while let Some(Ok(m)) = batch.next().await {
            got += 1;
            let mut headers = std::collections::BTreeMap::new();
            if let Some(h) = &m.headers {
                for (name, values) in h.iter() {
                    if let Some(v) = values.first() {
                        headers.insert(name.to_string(), v.to_string());
                    }
                }
            }
            out.push(Stored {
                payload: m.payload.to_vec(),
                headers,
            });
        }
        if got == 0 {
            break;
        }
    }
    out
}

/// Every message in a JetStream stream: (Nats-Msg-Id header, payload).
pub async fn read_stream(url: &str, stream: &str) -> Vec<(String, Vec<u8>)> {
    read_stream_messages(url, stream)
        .await
        .into_iter()
        .map(|m| {
            let id = m.headers.get("Nats-Msg-Id").cloned().unwrap_or_default();
            (id, m.payload)
        })
        .collect()
}

pub async fn delete_stream(url: &str, stream: &str) {
    if let Ok(client) = async_nats::connect(url).await {
        let _ = async_nats::jetstream::new(client)
            .delete_stream(stream)
            .await;
    }
}

/// One of the bridge's own HTTP endpoints (/readyz, /healthz, /metrics) as
/// (status, body); (0, "") while nothing listens.
pub fn http_get(port: u16, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return (0, String::new());
    };
    let _ = s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
    );
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}
