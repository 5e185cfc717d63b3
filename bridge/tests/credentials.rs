//! Authenticated connections: Postgres with a password over TLS, NATS with a user
//! and password, Redis with a password, MQTT with a username and password — and
//! no password ever in the bridge's log, whether the connection works or not.

mod common;

use common::*;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn(program: &str, args: &[&str]) -> Server {
    Server(
        Command::new(program)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("start {program}: {e}")),
    )
}

fn jsonl_count(path: &std::path::Path) -> usize {
    std::fs::read_to_string(path)
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

fn seed(db: &TestDb, rows: i64) {
    let mut c = db.client();
    for seq in 1..=rows {
        c.query_one(
            "SELECT envelopes.insert_gateway_envelope(1, $1, '\\x01', '\\x02')",
            &[&seq],
        )
        .unwrap();
    }
}

fn assert_no_secret(bridge: &Bridge, secret: &str) {
    let log = bridge.log_text();
    assert!(!log.is_empty(), "the bridge logged nothing");
    assert!(
        !log.contains(secret),
        "the password appears in the log:\n{log}"
    );
}

/// The bridge logs in as a least-privilege consumer role with a password, over
/// TLS (plain connections for that role are rejected by the server), verifying
/// the server certificate against its CA.
#[test]
fn postgres_with_a_password_over_tls() {
    let ca = std::env::var("ENVELOPES_TEST_PG_CA")
        .expect("ENVELOPES_TEST_PG_CA: scripts/test.sh configures the test cluster for TLS");
    let db = TestDb::new("tls");
    let secret = format!("pw-{}", unique("s"));
    let mut admin = db.client();
    admin
        .batch_execute(&format!(
            "DO $$ BEGIN
                 IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'envelopes_tls') THEN
                     CREATE ROLE envelopes_tls LOGIN;
                 END IF;
             END $$;
             ALTER ROLE envelopes_tls PASSWORD '{secret}';
             SELECT envelopes.grant_consumer('envelopes_tls');"
        ))
        .unwrap();
    seed(&db, 5);
    let plain = db.url();
    let (_, rest) = plain.split_once('@').unwrap();
    let url = format!("postgres://envelopes_tls:{secret}@{rest}?sslmode=require");
    let path = std::env::temp_dir().join(format!("{}.jsonl", unique("tls")));
    let mut bridge = Bridge::egress_with_url(
        &url,
        "tls",
        &format!("jsonl:{}", path.display()),
        &["--database-ca", &ca],
        &[],
    );
    wait_until("rows over TLS", Duration::from_secs(20), || {
        jsonl_count(&path) == 5
    });
    let ssl: bool = db
        .client()
        .query_one(
            "SELECT bool_and(s.ssl) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid)
              WHERE a.usename = 'envelopes_tls'",
            &[],
        )
        .unwrap()
        .get(0);
    assert!(ssl, "the bridge's session is not encrypted");
    bridge.terminate();
    assert_no_secret(&bridge, &secret);

    // Without TLS the server refuses the role: a configuration error before the
    // bridge ever worked, so it ends (78) saying why, still quietly.
    let url = format!("postgres://envelopes_tls:{secret}@{rest}?sslmode=disable");
    let mut bridge = Bridge::egress_with_url(&url, "tls", "stdout", &[], &[]);
    assert_eq!(bridge.exit_code_within(Duration::from_secs(10)), Some(78));
    assert!(
        bridge.log_text().contains("SQLSTATE 28"),
        "{}",
        bridge.log_text()
    );
    assert_no_secret(&bridge, &secret);
}

#[test]
fn nats_with_user_and_password() {
    let port = free_port();
    let store = std::env::temp_dir().join(unique("natsauth"));
    let secret = format!("pw{}", fastrand::u64(..));
    let _nats = spawn(
        "/usr/sbin/nats-server",
        &[
            "-a",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-js",
            "-sd",
            store.to_str().unwrap(),
            "--user",
            "bridge",
            "--pass",
            &secret,
        ],
    );
    wait_for_port(port);
    let db = TestDb::new("natsauth");
    seed(&db, 3);
    let url = format!("nats://127.0.0.1:{port}");
    let egress = |password: &str| {
        Bridge::egress(
            &db,
            "natsauth",
            &url,
            &[
                "--nats-user",
                "bridge",
                "--nats-password",
                password,
                "--nats-stream",
                "AUTH",
            ],
            &[],
        )
    };
    let mut bridge = egress(&secret);
    wait_until("delivery with credentials", Duration::from_secs(20), || {
        lag(&db, "natsauth") == 0
    });
    bridge.terminate();
    assert_no_secret(&bridge, &secret);

    // A wrong password: refused before the bridge ever worked, so it ends (78)
    // saying why; nothing counts as delivered and neither password is logged.
    seed_more(&db, 4);
    let wrong = format!("{secret}x");
    let mut bridge = egress(&wrong);
    assert_eq!(bridge.exit_code_within(Duration::from_secs(10)), Some(78));
    assert!(lag(&db, "natsauth") > 0);
    assert!(
        bridge.log_text().contains("authorization violation"),
        "{}",
        bridge.log_text()
    );
    assert_no_secret(&bridge, &secret);
    let _ = std::fs::remove_dir_all(store);
}

fn seed_more(db: &TestDb, seq: i64) {
    db.client()
        .query_one(
            "SELECT envelopes.insert_gateway_envelope(1, $1, '\\x01', '\\x02')",
            &[&seq],
        )
        .unwrap();
}

#[test]
fn redis_with_a_password() {
    let port = free_port();
    let secret = format!("pw{}", fastrand::u64(..));
    let _redis = spawn(
        "redis-server",
        &[
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--requirepass",
            &secret,
        ],
    );
    wait_for_port(port);
    let db = TestDb::new("redisauth");
    seed(&db, 3);
    let url = format!("redis://:{secret}@127.0.0.1:{port}");
    let mut bridge = Bridge::egress(&db, "redisauth", &url, &["--redis-stream", "auth"], &[]);
    wait_until("delivery with a password", Duration::from_secs(20), || {
        lag(&db, "redisauth") == 0
    });
    bridge.terminate();
    assert_no_secret(&bridge, &secret);
}

#[test]
fn mqtt_with_username_and_password() {
    let port = free_port();
    let secret = format!("pw{}", fastrand::u64(..));
    let dir = std::env::temp_dir().join(unique("mqttauth"));
    std::fs::create_dir_all(&dir).unwrap();
    let passwords = dir.join("passwd");
    let status = Command::new("mosquitto_passwd")
        .args(["-c", "-b", passwords.to_str().unwrap(), "bridge", &secret])
        .status()
        .unwrap();
    assert!(status.success());
    let config = dir.join("mosquitto.conf");
    std::fs::write(
        &config,
        format!(
            "listener {port} 127.0.0.1\nallow_anonymous false\npassword_file {}\n",
            passwords.display()
        ),
    )
    .unwrap();
    let _mosquitto = spawn("mosquitto", &["-c", config.to_str().unwrap()]);
    wait_for_port(port);
    let db = TestDb::new("mqttauth");
    seed(&db, 3);
    let url = format!("mqtt://bridge:{secret}@127.0.0.1:{port}");
    let mut bridge = Bridge::egress(&db, "mqttauth", &url, &[], &[]);
    wait_until("delivery with credentials", Duration::from_secs(20), || {
        lag(&db, "mqttauth") == 0
    });
    bridge.terminate();
    assert_no_secret(&bridge, &secret);

    // Anonymous is refused: nothing is acknowledged.
    seed_more(&db, 4);
    let mut bridge = Bridge::egress(
        &db,
        "mqttauth",
        &format!("mqtt://127.0.0.1:{port}"),
        &[],
        &[],
    );
    std::thread::sleep(Duration::from_millis(1500));
    bridge.terminate();
    assert!(lag(&db, "mqttauth") > 0);
    let _ = std::fs::remove_dir_all(dir);
}
