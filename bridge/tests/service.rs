//! The bridge as an operator runs it: stopped by a signal whatever became of its
//! stderr and stdout, configuration mistakes ending it at once with exit 78 and
//! the cause (and ridden out once it has worked), a --config file under the
//! environment and the flags, liveness and readiness through a sink outage, lag
//! metrics that follow the backlog, and the README's ways of watching each bus.

mod common;

use common::buses::*;
use common::*;
use std::collections::BTreeSet;
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `count` envelopes of `node` from `first` in one statement.
fn bulk(db: &TestDb, node: i32, first: i64, count: i64) {
    db.client()
        .execute(
            "SELECT envelopes.insert_gateway_envelopes(
                    array_agg($1::int), array_agg(s), array_agg('\\x01'::bytea),
                    array_agg(pg_catalog.int8send(s)))
               FROM generate_series($2::bigint, $2 + $3 - 1) s",
            &[&node, &first, &count],
        )
        .expect("bulk insert");
}

fn signal(bridge: &Bridge, name: &str) {
    let _ = Command::new("kill")
        .args([&format!("-{name}"), &bridge.child.id().to_string()])
        .status();
}

/// An egress bridge to a JSONL file with its stderr as given.
fn egress_with_stderr(
    db: &TestDb,
    path: &std::path::Path,
    stderr: Stdio,
    extra: &[&str],
) -> Bridge {
    let url = db.url();
    let sink = format!("jsonl:{}", path.display());
    let mut args = vec![
        "egress",
        "--database-url",
        &url,
        "--name",
        "svc",
        "--register",
        "--sink",
        &sink,
        "--poll-interval-ms",
        "50",
    ];
    args.extend_from_slice(extra);
    let mut cmd = bridge_command(&args);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .env("ENVELOPES_LOG", "debug");
    let log = std::env::temp_dir().join(format!("{}.log", unique("nolog")));
    Bridge {
        child: cmd.spawn().expect("start the bridge"),
        log,
    }
}

/// SIGTERM and SIGINT stop the bridge cleanly (exit 0) while every write to its
/// stderr fails (a pipe whose reader is gone, /dev/full), with debug logging on
/// so that it writes all the time, through a backlog it drains meanwhile.
#[test]
fn a_signal_stops_the_bridge_whatever_became_of_its_stderr() {
    for (signal_name, stderr_kind) in [
        ("TERM", "closed pipe"),
        ("INT", "closed pipe"),
        ("TERM", "/dev/full"),
        ("INT", "/dev/full"),
    ] {
        let db = TestDb::new("stop");
        bulk(&db, 1, 1, 3000);
        let path = std::env::temp_dir().join(format!("{}.jsonl", unique("stop")));
        let stderr = match stderr_kind {
            "/dev/full" => Stdio::from(std::fs::File::create("/dev/full").unwrap()),
            _ => Stdio::piped(),
        };
        let mut bridge = egress_with_stderr(&db, &path, stderr, &["--batch-size", "50"]);
        // The reader goes away at once: every log line from now on fails.
        drop(bridge.child.stderr.take());
        wait_until(
            &format!("{stderr_kind}: the backlog drained with a dead stderr"),
            Duration::from_secs(60),
            || lag(&db, "svc") == 0,
        );
        assert!(
            bridge.child.try_wait().unwrap().is_none(),
            "{stderr_kind}: the bridge died"
        );
        signal(&bridge, signal_name);
        assert_eq!(
            bridge.exit_code_within(Duration::from_secs(10)),
            Some(0),
            "SIG{signal_name} with stderr a {stderr_kind}"
        );
        let _ = std::fs::remove_file(&path);
    }
}

/// A signal in the middle of a backlog, stderr a dead pipe: the bridge finishes
/// the batch in hand, acknowledges it and exits 0 at once, and every row it
/// acknowledged is in the file (the rest is left for the next start).
#[test]
fn a_signal_mid_backlog_ends_after_the_batch_in_hand() {
    for signal_name in ["TERM", "INT"] {
        let db = TestDb::new("stop_mid");
        bulk(&db, 1, 1, 50_000);
        let path = std::env::temp_dir().join(format!("{}.jsonl", unique("stop_mid")));
        let mut bridge = egress_with_stderr(&db, &path, Stdio::piped(), &["--batch-size", "20"]);
        drop(bridge.child.stderr.take());
        wait_until("the drain under way", Duration::from_secs(60), || {
            lag(&db, "svc") < 49_000
        });
        signal(&bridge, signal_name);
        let started = Instant::now();
        assert_eq!(
            bridge.exit_code_within(Duration::from_secs(10)),
            Some(0),
            "SIG{signal_name} mid-backlog"
        );
        eprintln!(
            "SIG{signal_name}: exited {:?} after the signal, {} rows left",
            started.elapsed(),
            lag(&db, "svc")
        );
        let acknowledged = 50_000 - lag(&db, "svc");
        let written: BTreeSet<String> = std::fs::read_to_string(&path)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter_map(|v| v["id"].as_str().map(str::to_owned))
            .collect();
        assert!(
            written.len() as i64 >= acknowledged,
            "SIG{signal_name}: {acknowledged} rows acknowledged, {} in the file",
            written.len()
        );
        for seq in [1, acknowledged] {
            assert!(
                written.contains(&format!("1:{seq}")),
                "1:{seq} acknowledged, not written"
            );
        }
        let _ = std::fs::remove_file(&path);
    }
}

/// The first signal lets the batch in hand finish; a second one ends the bridge
/// at once (here the batch waits on a receiver that never answers), with
/// 128 + the signal's number.
#[test]
fn a_second_signal_ends_the_bridge_at_once() {
    for (second, code) in [("TERM", 143), ("INT", 130)] {
        a_second_signal_ends_it(second, code);
    }
}

fn a_second_signal_ends_it(second: &str, code: i32) {
    let db = TestDb::new("stop2");
    let mut c = db.client();
    for seq in 1..=5 {
        insert(&mut c, 1, seq);
    }
    // Accepts, reads, never answers.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let held = Arc::new(std::sync::Mutex::new(Vec::new()));
    {
        let held = held.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                held.lock().unwrap().push(stream);
            }
        });
    }
    let url = format!("http://127.0.0.1:{port}/hook");
    let mut bridge = Bridge::egress(&db, "slow", &url, &["--webhook-timeout-ms", "60000"], &[]);
    wait_until("the request in hand", Duration::from_secs(20), || {
        !held.lock().unwrap().is_empty()
    });
    std::thread::sleep(Duration::from_millis(300));
    signal(&bridge, "TERM");
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        bridge.child.try_wait().unwrap().is_none(),
        "the first signal waits for the batch in hand"
    );
    signal(&bridge, second);
    assert_eq!(
        bridge.exit_code_within(Duration::from_secs(3)),
        Some(code),
        "SIG{second} second"
    );
    assert_eq!(lag(&db, "slow"), 5, "nothing counts as delivered");
}

/// `status | true`: its reader is gone before it writes; it ends successfully
/// without a panic.
#[test]
fn status_ends_quietly_when_its_reader_is_gone() {
    let db = TestDb::new("status_pipe");
    db.client()
        .batch_execute(
            "SELECT envelopes.consumer_register('a'); SELECT envelopes.consumer_register('b');",
        )
        .unwrap();
    let mut child = bridge_command(&["status", "--database-url", &db.url()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}: {stderr}", out.status);
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// Runs a bridge command to its end (at most 10 s): exit code and stderr.
fn ends_with(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let mut cmd = bridge_command(args);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut text = String::new();
            use std::io::Read;
            let _ = child.stderr.take().unwrap().read_to_string(&mut text);
            return (status.code(), text);
        }
        if start.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            let _ = child.wait();
            return (None, "still running after 10 s".into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Mistakes no retry can heal end the bridge within seconds, with exit 78 and a
/// line naming the cause and the fix; URLs it does not serve are usage errors
/// (exit 2).
#[test]
fn configuration_mistakes_end_the_bridge_with_the_cause() {
    let db = TestDb::new("config");
    db.client()
        .batch_execute("SELECT envelopes.consumer_register('known1'); SELECT envelopes.consumer_register('known2');")
        .unwrap();
    let bare = TestDb::new("noext");
    bare.client()
        .batch_execute("DROP EXTENSION pg_envelopes")
        .unwrap();
    let url = db.url();
    let (host_port, _) = url
        .trim_start_matches("postgres://postgres@")
        .split_once('/')
        .unwrap();
    let wrong_password = format!(
        "postgres://envelopes_tls:wrong{}@{host_port}/{}?sslmode=require",
        fastrand::u32(..),
        db.name
    );
    let no_role = url.replacen("postgres@", "no_such_role_here@", 1);
    let no_database = format!("postgres://postgres@{host_port}/no_such_database_here");
    let cases: Vec<(&str, Vec<String>, i32, &str)> = vec![
        (
            "wrong password",
            vec![
                "--database-url".into(),
                wrong_password,
                "--name".into(),
                "known1".into(),
            ],
            78,
            "28P01",
        ),
        (
            "missing role",
            vec![
                "--database-url".into(),
                no_role,
                "--name".into(),
                "known1".into(),
            ],
            78,
            "SQLSTATE 28",
        ),
        (
            "missing database",
            vec![
                "--database-url".into(),
                no_database,
                "--name".into(),
                "known1".into(),
            ],
            78,
            "3D000",
        ),
        (
            "no extension",
            vec![
                "--database-url".into(),
                bare.url(),
                "--name".into(),
                "x".into(),
                "--register".into(),
            ],
            78,
            "CREATE EXTENSION",
        ),
        (
            "unknown consumer",
            vec![
                "--database-url".into(),
                url.clone(),
                "--name".into(),
                "knwon1".into(),
            ],
            78,
            "known1, known2",
        ),
        (
            "AMQP password",
            vec![
                "--database-url".into(),
                url.clone(),
                "--name".into(),
                "known1".into(),
                "--sink".into(),
                "amqp://guest:wrong@127.0.0.1:5672/%2f".into(),
            ],
            78,
            "ACCESS_REFUSED",
        ),
        (
            "AMQP empty vhost",
            vec![
                "--database-url".into(),
                url.clone(),
                "--name".into(),
                "known2".into(),
                "--sink".into(),
                "amqp://guest:guest@127.0.0.1:5672/".into(),
            ],
            78,
            "vhost",
        ),
    ];
    let mut c = db.client();
    insert(&mut c, 1, 1);
    for (what, args, code, needle) in cases {
        let mut all = vec!["egress"];
        all.extend(args.iter().map(String::as_str));
        let started = Instant::now();
        let (exit, stderr) = ends_with(&all, &[]);
        assert_eq!(exit, Some(code), "{what}: {stderr}");
        assert!(stderr.contains(needle), "{what}: {stderr}");
        assert!(started.elapsed() < Duration::from_secs(10), "{what}");
        assert!(
            !stderr.contains("wrong") || what != "AMQP password",
            "{what}: the password shows: {stderr}"
        );
    }
    // A source ingress does not read, a sink egress does not serve: usage errors.
    let (exit, stderr) = ends_with(
        &[
            "ingress",
            "--database-url",
            &url,
            "--name",
            "i",
            "--source",
            "redis://127.0.0.1:6379",
        ],
        &[],
    );
    assert_eq!(exit, Some(2), "{stderr}");
    assert!(
        stderr.contains("ingress reads NATS JetStream only"),
        "{stderr}"
    );
    assert_eq!(
        lag(&db, "known1"),
        1,
        "nothing was delivered by any of them"
    );
}

/// After it has worked once, the same kind of error (here its role may no longer
/// log in) is ridden out: the bridge keeps trying, logs it as an error, and
/// delivers once the role may log in again.
#[test]
fn a_configuration_error_after_a_good_start_is_ridden_out() {
    let db = TestDb::new("ride");
    let role = format!("{}_r", db.name);
    db.client()
        .batch_execute(&format!(
            "CREATE ROLE \"{role}\" LOGIN; SELECT envelopes.grant_consumer('{role}');"
        ))
        .unwrap();
    let url = db.url().replacen("postgres@", &format!("{role}@"), 1);
    let path = std::env::temp_dir().join(format!("{}.jsonl", unique("ride")));
    let mut bridge = Bridge::egress_with_url(
        &url,
        "rider",
        &format!("jsonl:{}", path.display()),
        &[],
        &[],
    );
    let mut c = db.client();
    insert(&mut c, 1, 1);
    wait_until("a first delivery", Duration::from_secs(20), || {
        lag(&db, "rider") == 0
    });
    // Two statements: sent as one, they run in one implicit transaction, and
    // a bridge reconnecting between the termination and its commit still
    // logs in.
    c.batch_execute(&format!("ALTER ROLE \"{role}\" NOLOGIN"))
        .unwrap();
    c.batch_execute(&format!(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{role}'"
    ))
    .unwrap();
    insert(&mut c, 1, 2);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !bridge.log_text().contains("28000") {
        assert!(
            std::time::Instant::now() < deadline,
            "no refused reconnect in the log after 20 s: {}",
            bridge.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        bridge.child.try_wait().unwrap().is_none(),
        "the bridge gave up: {}",
        bridge.log_text()
    );
    c.batch_execute(&format!("ALTER ROLE \"{role}\" LOGIN"))
        .unwrap();
    wait_until(
        "delivery after the role may log in again",
        Duration::from_secs(30),
        || lag(&db, "rider") == 0,
    );
    bridge.terminate();
    let _ = db.client().batch_execute(&format!(
        "SELECT envelopes.revoke_consumer('{role}'); DROP OWNED BY \"{role}\"; DROP ROLE \"{role}\";"
    ));
    let _ = std::fs::remove_file(&path);
}

/// `envelopes-bridge register NAME` and `register NAME --from-end` create the
/// consumer at the beginning or at the end of every feed; then the bridge rides
/// out a restart of its database server after a good start (fast shutdown, and
/// an immediate one that crash-recovers), delivering what was committed before
/// and after it.
#[test]
fn register_and_a_database_restart_after_a_good_start() {
    let cluster = common::cluster::Cluster::start("restart", &[]);
    cluster.create_db("store");
    let mut c = cluster.client("store");
    for seq in 1..=10 {
        insert(&mut c, 1, seq);
    }
    let url = cluster.url("store");
    let registered = |name: &str, extra: &[&str]| {
        let mut args = vec!["register", "--database-url", &url, name];
        args.extend_from_slice(extra);
        let out = bridge_command(&args).output().unwrap();
        assert!(
            out.status.success(),
            "register {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let pending = |c: &mut postgres::Client, name: &str| -> i64 {
        c.query_one(
            "SELECT COALESCE(outbox_pending, 0) + COALESCE(envelopes_pending, 0)
               FROM envelopes.consumer_status WHERE consumer = $1",
            &[&name],
        )
        .map(|r| r.get(0))
        .unwrap_or(-1)
    };
    assert!(registered("from_start", &[]).contains("beginning"));
    assert!(registered("from_end", &["--from-end"]).contains("end"));
    assert_eq!(pending(&mut c, "from_start"), 10);
    assert_eq!(pending(&mut c, "from_end"), 0);
    // Registering again changes nothing.
    registered("from_end", &[]);
    assert_eq!(pending(&mut c, "from_end"), 0);

    let path = std::env::temp_dir().join(format!("{}.jsonl", unique("restart")));
    // No --register: the consumer made above is used as it is.
    let metrics_port = free_port();
    let metrics_addr = format!("127.0.0.1:{metrics_port}");
    let mut cmd = bridge_command(&[
        "egress",
        "--database-url",
        &url,
        "--name",
        "from_start",
        "--sink",
        &format!("jsonl:{}", path.display()),
        "--poll-interval-ms",
        "100",
        "--metrics-addr",
        &metrics_addr,
    ]);
    let log = std::env::temp_dir().join(format!("{}.log", unique("restart")));
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    let mut bridge = Bridge {
        child: cmd.spawn().unwrap(),
        log,
    };
    wait_until("the first rows", Duration::from_secs(20), || {
        pending(&mut cluster.client("store"), "from_start") == 0
    });
    let mut next = 11;
    for mode in ["fast", "immediate"] {
        cluster.stop(mode);
        std::thread::sleep(Duration::from_secs(3));
        assert!(
            bridge.child.try_wait().unwrap().is_none(),
            "the bridge gave up while the server was down ({mode}): {}",
            bridge.log_text()
        );
        cluster.start_again();
        let mut c = cluster.client("store");
        for seq in next..next + 5 {
            insert(&mut c, 1, seq);
        }
        next += 5;
        wait_until(
            &format!("delivery after the {mode} restart"),
            Duration::from_secs(60),
            || pending(&mut cluster.client("store"), "from_start") == 0,
        );
    }
    // Every failed round while the server was away counts as retried.
    let retried = metric(&scrape(metrics_port), "envelopes_bridge_retried_total");
    assert!(retried >= 2.0, "retried_total {retried}");
    bridge.terminate();
    let ids: BTreeSet<String> = std::fs::read_to_string(&path)
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["id"].as_str().map(str::to_owned))
        .collect();
    let expected: BTreeSet<String> = (1..next).map(|s| format!("1:{s}")).collect();
    assert_eq!(ids, expected);
    let _ = std::fs::remove_file(&path);
}

/// A --config file gives options by their long names; the environment wins over
/// it and the flags over both; `run` runs the file's command; an unknown key is
/// refused (78).
#[test]
fn a_config_file_gives_options_under_the_environment_and_the_flags() {
    let db = TestDb::new("conffile");
    let dir = std::env::temp_dir().join(unique("conffile"));
    std::fs::create_dir_all(&dir).unwrap();
    let (from_file, from_env) = (dir.join("file.jsonl"), dir.join("env.jsonl"));
    let conf = dir.join("bridge.toml");
    std::fs::write(
        &conf,
        format!(
            "command = \"egress\"\ndatabase-url = \"{}\"\nname = \"fromfile\"\n\n[egress]\n\
             sink = \"jsonl:{}\"\nregister = true\npoll_interval_ms = 50\n",
            db.url(),
            from_file.display()
        ),
    )
    .unwrap();
    let mut c = db.client();
    insert(&mut c, 1, 1);
    let mut cmd = bridge_command(&[
        "run",
        "--config",
        conf.to_str().unwrap(),
        "--name",
        "fromflag",
    ]);
    cmd.env("ENVELOPES_SINK", format!("jsonl:{}", from_env.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut bridge = Bridge {
        child: cmd.spawn().unwrap(),
        log: dir.join("none.log"),
    };
    wait_until(
        "delivery by the configured bridge",
        Duration::from_secs(20),
        || lag(&db, "fromflag") == 0,
    );
    assert_eq!(bridge.terminate().code(), Some(0));
    assert!(std::fs::read_to_string(&from_env)
        .unwrap_or_default()
        .contains("\"1:1\""));
    assert!(
        !from_file.exists(),
        "the environment's sink wins over the file's"
    );
    assert_eq!(
        db.int8("SELECT count(*) FROM envelopes.consumers WHERE name = 'fromfile'"),
        0,
        "the flag's name wins over the file's"
    );
    std::fs::write(&conf, "command = \"egress\"\nbatch-sise = 5\n").unwrap();
    let (exit, stderr) = ends_with(&["run", "--config", conf.to_str().unwrap()], &[]);
    assert_eq!(exit, Some(78), "{stderr}");
    assert!(
        stderr.contains("batch-sise") && stderr.contains("batch-size"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The bridge's own HTTP endpoints, as GET PATH -> (status, body).
fn get(port: u16, path: &str) -> (u16, String) {
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

/// /healthz answers while the process runs; /readyz follows the sink: 200 while
/// rounds work, 503 with a reason once the last one that worked is older than
/// --ready-after, 200 again when the sink is back; a standby is not ready.
#[test]
fn readiness_follows_a_sink_outage() {
    let db = TestDb::new("ready");
    let receiver = Receiver::start();
    let metrics = free_port();
    let addr = format!("127.0.0.1:{metrics}");
    let mut bridge = Bridge::egress(
        &db,
        "ready",
        &receiver.url(),
        &["--metrics-addr", &addr, "--ready-after", "2"],
        &[],
    );
    wait_until("ready", Duration::from_secs(20), || {
        get(metrics, "/readyz").0 == 200
    });
    assert_eq!(get(metrics, "/healthz").0, 200);
    // A standby under the same name is alive and not ready.
    let standby_metrics = free_port();
    let standby_addr = format!("127.0.0.1:{standby_metrics}");
    let mut standby = Bridge::egress(
        &db,
        "ready",
        &receiver.url(),
        &["--metrics-addr", &standby_addr],
        &[],
    );
    wait_until("the standby's endpoints", Duration::from_secs(20), || {
        get(standby_metrics, "/healthz").0 == 200
    });
    let (code, body) = get(standby_metrics, "/readyz");
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("standing by"), "{body}");
    standby.terminate();
    // The sink goes away while rows wait.
    receiver.status.store(503, Ordering::Relaxed);
    let mut c = db.client();
    insert(&mut c, 1, 1);
    wait_until(
        "not ready during the outage",
        Duration::from_secs(20),
        || get(metrics, "/readyz").0 == 503,
    );
    let (_, body) = get(metrics, "/readyz");
    let reason: serde_json::Value = serde_json::from_str(body.trim()).expect("a JSON reason");
    assert_eq!(reason["ready"], false);
    assert!(reason["reason"].as_str().unwrap().contains("503"), "{body}");
    assert_eq!(get(metrics, "/healthz").0, 200, "alive all the same");
    receiver.status.store(200, Ordering::Relaxed);
    wait_until("ready again", Duration::from_secs(30), || {
        get(metrics, "/readyz").0 == 200
    });
    bridge.terminate();
}

/// The lag metrics come from the database every round: during a 200,000-row
/// catch-up a scrape is within 10% (and a batch) of consumer_status's pending
/// count; with the sink away they show the rows waiting and their age, and the
/// retry counter moves; the progress line gives what remains and an ETA.
#[test]
fn lag_metrics_follow_the_backlog_and_an_outage() {
    let db = TestDb::new("lagm");
    bulk(&db, 1, 1, 100_000);
    bulk(&db, 2, 1, 100_000);
    let metrics = free_port();
    let addr = format!("127.0.0.1:{metrics}");
    let receiver = Receiver::start();
    let mut bridge = Bridge::egress(
        &db,
        "lagm",
        &receiver.url(),
        &["--metrics-addr", &addr, "--batch-size", "500"],
        &[],
    );
    let mut compared = 0;
    let started = Instant::now();
    while lag(&db, "lagm") > 20_000 && started.elapsed() < Duration::from_secs(120) {
        let scraped = metric(&try_scrape(metrics), "envelopes_bridge_lag_rows");
        let pending = lag(&db, "lagm") as f64;
        if scraped > 0.0 {
            let slack = pending * 0.1 + 2000.0;
            assert!(
                (scraped - pending).abs() <= slack,
                "lag_rows {scraped} against {pending} pending"
            );
            compared += 1;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    assert!(compared >= 3, "the backlog was scraped {compared} times");
    wait_until("the backlog drained", Duration::from_secs(120), || {
        lag(&db, "lagm") == 0
    });
    wait_until("lag 0 when idle", Duration::from_secs(10), || {
        metric(&try_scrape(metrics), "envelopes_bridge_lag_rows") == 0.0
    });
    // The sink away while rows wait.
    receiver.status.store(503, Ordering::Relaxed);
    let retried_before = metric(&try_scrape(metrics), "envelopes_bridge_retried_total");
    bulk(&db, 3, 1, 50);
    std::thread::sleep(Duration::from_secs(7));
    let text = try_scrape(metrics);
    assert_eq!(metric(&text, "envelopes_bridge_lag_rows"), 50.0, "{text}");
    assert!(
        metric(&text, "envelopes_bridge_lag_seconds") >= 5.0,
        "{text}"
    );
    assert!(metric(&text, "envelopes_bridge_retried_total") > retried_before);
    receiver.status.store(200, Ordering::Relaxed);
    wait_until("delivery after the outage", Duration::from_secs(30), || {
        lag(&db, "lagm") == 0
    });
    bridge.terminate();
    let log = bridge.log_text();
    assert!(
        log.contains("remaining=") && log.contains("eta_seconds="),
        "no progress line with remaining and ETA"
    );
}

/// Every "watch it with" command of the README's sink table, run as shown against
/// the bus: each shows the rows' dedup ids.
#[test]
fn the_readme_watch_commands_show_the_rows() {
    let db = TestDb::new("watch");
    let mut c = db.client();
    for seq in 1..=3 {
        insert(&mut c, 4, seq);
    }
    let expect = |out: &str, what: &str| {
        for id in ["4:1", "4:2", "4:3"] {
            assert!(out.contains(id), "{what} does not show {id}: {out}");
        }
    };
    let run = |program: &str, args: &[&str]| -> String {
        let out = Command::new(program).args(args).output().expect(program);
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    // JSONL: tail PATH | jq .id
    let path = std::env::temp_dir().join(format!("{}.jsonl", unique("watch")));
    let mut bridge = Bridge::egress(
        &db,
        "w_jsonl",
        &format!("jsonl:{}", path.display()),
        &[],
        &[],
    );
    wait_until("jsonl", Duration::from_secs(20), || {
        lag(&db, "w_jsonl") == 0
    });
    bridge.terminate();
    let out = run(
        "sh",
        &["-c", &format!("tail -n 10 {} | jq .id", path.display())],
    );
    expect(&out, "tail | jq .id");
    // NATS and RabbitMQ: envelopes-bridge watch, started before the bridge
    // (RabbitMQ with --format json, and a durable queue of the user's own for
    // `rabbitmqctl list_queues`).
    let prefix = unique("wn");
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(declare_durable_queue(&amqp_url(), &prefix));
    for (bus, sink, extra) in [
        ("nats", nats_url(), vec![]),
        (
            "amqp",
            amqp_url(),
            vec!["--amqp-exchange".to_owned(), prefix.clone()],
        ),
    ] {
        let mut args = vec![
            "watch".to_owned(),
            sink.clone(),
            "--subject-prefix".into(),
            prefix.clone(),
            "--count".into(),
            "3".into(),
        ];
        args.extend(extra.iter().cloned());
        let watcher = bridge_command(&args.iter().map(String::as_str).collect::<Vec<_>>())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_secs(2));
        let name = format!("w_{bus}");
        let mut bargs = vec!["--subject-prefix", prefix.as_str()];
        let stream = prefix.to_uppercase();
        match bus {
            "nats" => bargs.extend(["--nats-stream", stream.as_str()]),
            _ => bargs.extend(["--amqp-exchange", prefix.as_str(), "--format", "json"]),
        }
        let mut bridge = Bridge::egress(&db, &name, &sink, &bargs, &[]);
        let out = watcher.wait_with_output().unwrap();
        bridge.terminate();
        expect(
            &String::from_utf8_lossy(&out.stdout),
            &format!("envelopes-bridge watch {bus}"),
        );
        if bus == "nats" {
            rt.block_on(delete_stream(&nats_url(), &stream));
        }
    }
    // rabbitmqctl list_queues name messages: the user's queue holds the three.
    wait_until("rabbitmqctl list_queues", Duration::from_secs(20), || {
        run("rabbitmqctl", &["list_queues", "-q", "name", "messages"])
            .lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == [prefix.as_str(), "3"])
    });
    // ... each body a JSON object (--format json), with its id.
    let bodies: Vec<serde_json::Value> = rt.block_on(async {
        use lapin::options::BasicGetOptions;
        let (connection, channel) = connect_amqp(&amqp_url()).await;
        let mut bodies = Vec::new();
        while let Some(m) = channel
            .basic_get(prefix.as_str().into(), BasicGetOptions { no_ack: true })
            .await
            .unwrap()
        {
            bodies.push(serde_json::from_slice(&m.delivery.data).expect("a JSON body"));
        }
        let _ = channel
            .queue_delete(prefix.as_str().into(), Default::default())
            .await;
        let _ = channel
            .exchange_delete(prefix.as_str().into(), Default::default())
            .await;
        let _ = connection.close(200, "done".into()).await;
        bodies
    });
    assert_eq!(bodies.len(), 3);
    expect(&format!("{bodies:?}"), "AMQP --format json bodies");
    // Redis: redis-cli XREAD, readable with --format json.
    let key = unique("wr");
    let mut bridge = Bridge::egress(
        &db,
        "w_redis",
        &redis_url(),
        &["--redis-stream", &key, "--format", "json"],
        &[],
    );
    wait_until("redis", Duration::from_secs(20), || {
        lag(&db, "w_redis") == 0
    });
    bridge.terminate();
    let out = run("redis-cli", &["XREAD", "COUNT", "10", "STREAMS", &key, "0"]);
    expect(&out, "redis-cli XREAD");
    assert!(
        out.contains("\"originator_envelope\""),
        "--format json is readable: {out}"
    );
    let _ = run("redis-cli", &["DEL", &key]);
    // MQTT: mosquitto_sub -V mqttv5 -t 'PREFIX/#' -F '%P %t', subscribed first.
    let mqtt_prefix = unique("wm");
    let port = mqtt_url().rsplit(':').next().unwrap().to_owned();
    let sub = Command::new("mosquitto_sub")
        .args([
            "-p",
            &port,
            "-V",
            "mqttv5",
            "-q",
            "1",
            "-t",
            &format!("{mqtt_prefix}/#"),
            "-F",
            "%P %t",
            "-C",
            "3",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // A second one prints the payloads: readable with --format json.
    let payloads = Command::new("mosquitto_sub")
        .args([
            "-p",
            &port,
            "-V",
            "mqttv5",
            "-q",
            "1",
            "-t",
            &format!("{mqtt_prefix}/#"),
            "-F",
            "%p",
            "-C",
            "3",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(1));
    let mut bridge = Bridge::egress(
        &db,
        "w_mqtt",
        &mqtt_url(),
        &["--subject-prefix", &mqtt_prefix, "--format", "json"],
        &[],
    );
    let out = sub.wait_with_output().unwrap();
    let payloads = payloads.wait_with_output().unwrap();
    bridge.terminate();
    expect(
        &String::from_utf8_lossy(&out.stdout),
        "mosquitto_sub -F '%P %t'",
    );
    let payloads = String::from_utf8_lossy(&payloads.stdout).into_owned();
    expect(&payloads, "mosquitto_sub -F '%p' with --format json");
    for line in payloads.lines() {
        let v: serde_json::Value = serde_json::from_str(line).expect("a JSON payload");
        assert!(v["originator_envelope"].is_string(), "{line}");
    }
    let _ = std::fs::remove_file(&path);
}

/// The small things: ENVELOPES_LOG_JSON=1 is taken, a log file gets no colour
/// codes, --sink's help names every sink, ingress's help only its own options,
/// and ingress by default reads only the envelope subjects of a stream egress
/// also writes outbox rows to (none of them dead-lettered as malformed).
#[test]
fn papercuts() {
    let db = TestDb::new("paper");
    let mut c = db.client();
    insert(&mut c, 1, 1);
    c.execute("SELECT envelopes.publish('note.created', '\\x01')", &[])
        .unwrap();
    let path = std::env::temp_dir().join(format!("{}.jsonl", unique("paper")));
    let mut bridge = Bridge::egress(
        &db,
        "paper",
        &format!("jsonl:{}", path.display()),
        &[],
        &[("ENVELOPES_LOG_JSON", "1")],
    );
    wait_until("delivery", Duration::from_secs(20), || {
        lag(&db, "paper") == 0
    });
    bridge.terminate();
    let log = bridge.log_text();
    assert!(
        log.lines().next().is_some_and(|l| l.starts_with('{')),
        "JSON log lines: {log}"
    );
    let help = String::from_utf8_lossy(
        &bridge_command(&["egress", "--help"])
            .output()
            .unwrap()
            .stdout,
    )
    .into_owned();
    assert!(
        help.contains("amqp://") && help.contains("http(s)://"),
        "{help}"
    );
    let help = String::from_utf8_lossy(
        &bridge_command(&["ingress", "--help"])
            .output()
            .unwrap()
            .stdout,
    )
    .into_owned();
    for egress_only in [
        "--webhook-secret",
        "--mqtt-client-id",
        "--redis-stream",
        "--amqp-exchange",
        "--batch-bytes",
    ] {
        assert!(
            !help.contains(egress_only),
            "ingress --help shows {egress_only}"
        );
    }
    // Egress writes envelopes and outbox rows into one stream; ingress reads it.
    let prefix = unique("pc");
    let stream = prefix.to_uppercase();
    let mut egress = Bridge::egress(
        &db,
        "feeder",
        &nats_url(),
        &["--subject-prefix", &prefix, "--nats-stream", &stream],
        &[],
    );
    wait_until("the stream fed", Duration::from_secs(20), || {
        lag(&db, "feeder") == 0
    });
    egress.terminate();
    // That bridge logged in the plain format, to a file: no colour codes (on
    // 99719e7 every level and field name came wrapped in them).
    let plain = egress.log_text();
    assert!(
        plain.contains("egress connected") && !plain.trim_start().starts_with('{'),
        "a plain-text log: {plain}"
    );
    assert!(
        !plain.contains('\x1b'),
        "colour codes in a log file: {plain:?}"
    );
    let target = TestDb::new("paper_in");
    let dlq = unique("pcdlq");
    let log = std::env::temp_dir().join(format!("{}.log", unique("pcin")));
    let mut ingress = Bridge {
        child: bridge_command(&[
            "ingress",
            "--database-url",
            &target.url(),
            "--name",
            "in",
            "--source",
            &nats_url(),
            "--nats-stream",
            &stream,
            "--subject-prefix",
            &prefix,
            "--dead-letter-subject",
            &dlq,
        ])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap(),
        log,
    };
    wait_until("the envelope stored", Duration::from_secs(20), || {
        target.int8("SELECT count(*) FROM envelopes.gateway_envelopes_meta") == 1
    });
    std::thread::sleep(Duration::from_secs(1));
    ingress.terminate();
    let text = ingress.log_text();
    assert!(
        !text.contains("malformed"),
        "the outbox row was taken for a malformed envelope: {text}"
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(delete_stream(&nats_url(), &stream));
    let ids: BTreeSet<String> = std::fs::read_to_string(&path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["id"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(ids.len(), 2);
    let _ = std::fs::remove_file(&path);
}

/// The unit file shipped for running the bridge under systemd is valid as
/// `systemd-analyze verify` sees it (skipped where that is missing).
#[test]
fn the_systemd_unit_verifies() {
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("systemd-analyze not found: skipped");
        return;
    }
    let unit = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/packaging/envelopes-bridge@.service"
    ))
    .unwrap();
    let dir = std::env::temp_dir().join(unique("unit"));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("envelopes-bridge@test.service");
    std::fs::write(
        &path,
        unit.replace("/usr/bin/envelopes-bridge", &bridge_binary()),
    )
    .unwrap();
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(&path)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success() && text.trim().is_empty(), "{text}");
    assert!(unit.contains("RestartPreventExitStatus=78"));
    let _ = std::fs::remove_dir_all(&dir);
}
