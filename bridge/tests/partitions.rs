//! Network partitions between real hosts: the primary, its synchronous
//! standby, the bridge and three NATS nodes (a JetStream cluster, the stream
//! replicated three times) each in a network namespace of its own (`ip netns`), joined by veth pairs to a Linux bridge in a "switch"
//! namespace; the test's writers and its checker sit in the test's own
//! namespace on one more port of that switch, in a private /24. A bounded,
//! self-stopping schedule cuts and heals links (routes to `blackhole` on both
//! ends: packets vanish, no connection is refused) — bridge↔primary,
//! bridge↔NATS, one NATS node from everything, primary↔standby — and degrades links with `tc netem` (delay
//! and loss; `tc tbf`, a slow link, where the kernel has no netem); then
//! the checker counts what the writers were acknowledged, what the store holds
//! and what a JetStream consumer receives: lost = 0 and phantom = 0.
//!
//! Needs root (namespaces); without it the test says so and passes vacuously.
//! Every namespace, link and process it makes is removed on drop.

mod common;

use common::checker::{check, table, total, Item};
use common::*;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn pg_bin() -> String {
    std::env::var("PG_BIN").unwrap_or_else(|_| "/usr/lib/postgresql/15/bin".into())
}

/// Runs a command, panicking with its output when it fails.
fn run(program: &str, args: &[&str]) {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The hosts of the test, their namespaces and addresses.
struct Net {
    prefix: String,
    subnet: String,
    hosts: Vec<&'static str>,
    children: Vec<Child>,
    dir: PathBuf,
}

const HOSTS: [&str; 6] = ["pg1", "pg2", "br", "n1", "n2", "n3"];

impl Net {
    /// `None` where namespaces cannot be made (not root).
    fn start() -> Option<Net> {
        // Unique per Net, so that the tests of this file can run side by side.
        static NETS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NETS.fetch_add(1, Ordering::Relaxed);
        let id = std::process::id() % 100_000;
        let prefix = format!("pe{id}{}", (b'a' + (n % 26) as u8) as char);
        let probe = format!("{prefix}probe");
        if Command::new("ip")
            .args(["netns", "add", &probe])
            .stderr(Stdio::null())
            .status()
            .map(|s| !s.success())
            .unwrap_or(true)
        {
            return None;
        }
        run("ip", &["netns", "del", &probe]);
        let base = PathBuf::from(
            std::env::var("ENVELOPES_TMP").unwrap_or_else(|_| "/var/tmp/pg_envelopes".into()),
        );
        let dir = base.join(unique("bt_partitions_"));
        std::fs::create_dir_all(&dir).unwrap();
        run("chown", &["postgres:postgres", dir.to_str().unwrap()]);
        let net = Net {
            subnet: format!("10.{}.{}", 213 + n % 40, id % 250),
            prefix,
            hosts: HOSTS.to_vec(),
            children: Vec::new(),
            dir,
        };
        let sw = net.ns("sw");
        run("ip", &["netns", "add", &sw]);
        run("ip", &["-n", &sw, "link", "add", "br0", "type", "bridge"]);
        run("ip", &["-n", &sw, "link", "set", "br0", "up"]);
        // Each host: a veth whose one end is eth0 in the host, the other a
        // port of the switch.
        for (i, host) in HOSTS.iter().enumerate() {
            let ns = net.ns(host);
            run("ip", &["netns", "add", &ns]);
            run("ip", &["-n", &ns, "link", "set", "lo", "up"]);
            let outer = format!("{}{}", net.prefix, i);
            run(
                "ip",
                &[
                    "link", "add", &outer, "type", "veth", "peer", "name", "eth0", "netns", &ns,
                ],
            );
            run("ip", &["link", "set", &outer, "netns", &sw]);
            run(
                "ip",
                &["-n", &sw, "link", "set", &outer, "master", "br0", "up"],
            );
            run(
                "ip",
                &[
                    "-n",
                    &ns,
                    "addr",
                    "add",
                    &format!("{}/24", net.addr(host)),
                    "dev",
                    "eth0",
                ],
            );
            run("ip", &["-n", &ns, "link", "set", "eth0", "up"]);
        }
        // The test's own port on the switch (writers, checker).
        let outer = format!("{}t", net.prefix);
        let inner = format!("{}d", net.prefix);
        run(
            "ip",
            &[
                "link", "add", &outer, "type", "veth", "peer", "name", &inner,
            ],
        );
        run("ip", &["link", "set", &outer, "netns", &sw]);
        run(
            "ip",
            &["-n", &sw, "link", "set", &outer, "master", "br0", "up"],
        );
        run(
            "ip",
            &[
                "addr",
                "add",
                &format!("{}.1/24", net.subnet),
                "dev",
                &inner,
            ],
        );
        run("ip", &["link", "set", &inner, "up"]);
        Some(net)
    }

    fn ns(&self, host: &str) -> String {
        format!("{}{host}", self.prefix)
    }

    fn addr(&self, host: &str) -> String {
        let i = HOSTS.iter().position(|h| *h == host).unwrap_or(0);
        format!("{}.{}", self.subnet, 10 + i)
    }

    /// A command run inside `host`'s namespace.
    fn command(&self, host: &str, program: &str) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.ns(host), program]);
        cmd
    }

    /// Cuts the link between two hosts both ways: each drops what goes to the other.
    fn cut(&self, a: &str, b: &str) {
        for (from, to) in [(a, b), (b, a)] {
            run(
                "ip",
                &[
                    "-n",
                    &self.ns(from),
                    "route",
                    "add",
                    "blackhole",
                    &format!("{}/32", self.addr(to)),
                ],
            );
        }
    }

    fn heal(&self, a: &str, b: &str) {
        for (from, to) in [(a, b), (b, a)] {
            run(
                "ip",
                &[
                    "-n",
                    &self.ns(from),
                    "route",
                    "del",
                    "blackhole",
                    &format!("{}/32", self.addr(to)),
                ],
            );
        }
    }

    /// Degrades `host`'s interface: delay and loss with `tc netem` (40 ms ±10 ms,
    /// 5 % loss) where the kernel has it, else (no sch_netem, as on the machine
    /// these tests were written on) a slow link with `tc tbf` (512 kbit/s,
    /// packets queued up to 500 ms, dropped beyond). Returns which.
    fn degrade(&self, host: &str) -> &'static str {
        let ns = self.ns(host);
        let netem = Command::new("tc")
            .args(["-n", &ns, "qdisc", "add", "dev", "eth0", "root", "netem"])
            .args(["delay", "40ms", "10ms", "loss", "5%"])
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if netem {
            return "netem delay 40ms 10ms loss 5%";
        }
        run(
            "tc",
            &[
                "-n", &ns, "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", "512kbit",
                "burst", "16kbit", "latency", "500ms",
            ],
        );
        "tbf rate 512kbit latency 500ms (no netem in this kernel)"
    }

    fn restore(&self, host: &str) {
        run(
            "tc",
            &["-n", &self.ns(host), "qdisc", "del", "dev", "eth0", "root"],
        );
    }

    /// A Postgres server in `host`, listening on its address (trust from the
    /// subnet, replication too), with `settings`.
    fn postgres(&mut self, host: &str, data: &std::path::Path, settings: &[&str]) {
        let conf = data.join("postgresql.conf");
        let mut text = std::fs::read_to_string(&conf).unwrap();
        text.push_str(&format!(
            "listen_addresses = '{}'\nport = 5432\nunix_socket_directories = '{}'\n\
             max_connections = 50\nfsync = off\nwal_level = replica\nmax_wal_senders = 5\n",
            self.addr(host),
            data.parent().unwrap().display()
        ));
        for s in settings {
            text.push_str(s);
            text.push('\n');
        }
        std::fs::write(&conf, text).unwrap();
        let hba = data.join("pg_hba.conf");
        let mut text = std::fs::read_to_string(&hba).unwrap();
        text.push_str(&format!(
            "host all all {0}.0/24 trust\nhost replication all {0}.0/24 trust\n",
            self.subnet
        ));
        std::fs::write(&hba, text).unwrap();
        let log = data.parent().unwrap().join("server.log");
        let status = self
            .command(host, "runuser")
            .args(["-u", "postgres", "--", &format!("{}/pg_ctl", pg_bin())])
            .args(["-D", data.to_str().unwrap(), "-l", log.to_str().unwrap()])
            .args(["-w", "-t", "60", "start"])
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(status.success(), "pg_ctl start in {host}");
    }

    fn conninfo(&self, host: &str, db: &str) -> String {
        format!(
            "host={} port=5432 user=postgres dbname={db} connect_timeout=5",
            self.addr(host)
        )
    }

    fn spawn(&mut self, cmd: &mut Command) -> usize {
        self.children
            .push(cmd.spawn().expect("spawn in a namespace"));
        self.children.len() - 1
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        for host in ["pg1", "pg2"] {
            let data = self.dir.join(host).join("data");
            if data.join("postmaster.pid").exists() {
                let _ = Command::new("runuser")
                    .args(["-u", "postgres", "--", &format!("{}/pg_ctl", pg_bin())])
                    .args([
                        "-D",
                        data.to_str().unwrap(),
                        "-m",
                        "immediate",
                        "-w",
                        "stop",
                    ])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status();
            }
        }
        let _ = Command::new("ip")
            .args(["link", "del", &format!("{}d", self.prefix)])
            .stderr(Stdio::null())
            .status();
        for host in self.hosts.iter().chain(["sw"].iter()) {
            let _ = Command::new("ip")
                .args(["netns", "del", &self.ns(host)])
                .stderr(Stdio::null())
                .status();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

const DB: &str = "partitions";

/// Writers of two originators from the test's namespace, reconnecting and
/// retrying (the insert is idempotent) until stopped.
fn writers(
    conninfo: String,
    stop: Arc<AtomicBool>,
    acks: Arc<Mutex<Vec<Item>>>,
) -> Vec<std::thread::JoinHandle<()>> {
    [201, 202]
        .into_iter()
        .map(|node: i32| {
            let (conninfo, stop, acks) = (conninfo.clone(), stop.clone(), acks.clone());
            std::thread::spawn(move || {
                let mut client = None;
                let mut seq = 1i64;
                while !stop.load(Ordering::Relaxed) {
                    if client.is_none() {
                        client = postgres::Client::connect(&conninfo, postgres::NoTls).ok();
                        if client.is_none() {
                            std::thread::sleep(Duration::from_millis(200));
                            continue;
                        }
                    }
                    let Some(c) = client.as_mut() else { continue };
                    let bytes = format!("{node}:{seq}:partitioned").into_bytes();
                    match c.execute(
                        "SELECT envelopes.insert_gateway_envelope($1, $2, '\\x03'::bytea, $3)",
                        &[&node, &seq, &bytes],
                    ) {
                        Ok(_) => {
                            acks.lock().unwrap().push(Item {
                                key: node.to_string(),
                                seq,
                                id: format!("{node}:{seq}"),
                                bytes,
                            });
                            seq += 1;
                            std::thread::sleep(Duration::from_millis(10));
                        }
                        Err(_) => client = None,
                    }
                }
            })
        })
        .collect()
}

#[test]
fn partitions_and_a_lossy_network_lose_nothing_and_forward_no_phantom() {
    let Some(mut net) = Net::start() else {
        eprintln!("partitions: cannot make network namespaces here (not root?): skipped");
        return;
    };
    // The primary, its database, the standby (a base backup taken from the
    // standby's own host), synchronous.
    let pg1 = net.dir.join("pg1");
    let pg2 = net.dir.join("pg2");
    for dir in [&pg1, &pg2] {
        std::fs::create_dir_all(dir).unwrap();
        run("chown", &["postgres:postgres", dir.to_str().unwrap()]);
    }
    let initdb = format!("{}/initdb", pg_bin());
    run(
        "runuser",
        &[
            "-u",
            "postgres",
            "--",
            &initdb,
            "-D",
            pg1.join("data").to_str().unwrap(),
            "--auth=trust",
            "-U",
            "postgres",
            "-E",
            "UTF8",
            "--locale=C.UTF-8",
        ],
    );
    net.postgres("pg1", &pg1.join("data"), &[]);
    let mut admin =
        postgres::Client::connect(&net.conninfo("pg1", "postgres"), postgres::NoTls).unwrap();
    admin
        .batch_execute(&format!("CREATE DATABASE {DB}"))
        .unwrap();
    postgres::Client::connect(&net.conninfo("pg1", DB), postgres::NoTls)
        .unwrap()
        .batch_execute("CREATE EXTENSION pg_envelopes")
        .unwrap();
    let status = net
        .command("pg2", "runuser")
        .args([
            "-u",
            "postgres",
            "--",
            &format!("{}/pg_basebackup", pg_bin()),
        ])
        .args([
            "-h",
            &net.addr("pg1"),
            "-U",
            "postgres",
            "-D",
            pg2.join("data").to_str().unwrap(),
        ])
        .args(["-R", "-X", "stream", "-c", "fast"])
        .status()
        .unwrap();
    assert!(status.success(), "pg_basebackup");
    std::fs::write(
        pg2.join("data/postgresql.auto.conf"),
        format!(
            "primary_conninfo = 'host={} port=5432 user=postgres application_name=s1'\n",
            net.addr("pg1")
        ),
    )
    .unwrap();
    net.postgres("pg2", &pg2.join("data"), &["hot_standby = on"]);
    admin
        .batch_execute("ALTER SYSTEM SET synchronous_standby_names = 's1'")
        .unwrap();
    admin.batch_execute("SELECT pg_reload_conf()").unwrap();
    wait_until("the synchronous standby", Duration::from_secs(30), || {
        admin
            .query_one(
                "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'",
                &[],
            )
            .map(|r| r.get::<_, i64>(0) == 1)
            .unwrap_or(false)
    });

    // Three NATS nodes, a JetStream cluster, each in its host; the bridge in
    // its own, forwarding in the default mode (standby-flush, since
    // synchronous_standby_names is set) to a stream of three replicas.
    let nodes = ["n1", "n2", "n3"];
    let routes = nodes
        .iter()
        .map(|n| format!("nats://{}:6222", net.addr(n)))
        .collect::<Vec<_>>()
        .join(",");
    for node in nodes {
        let store = net.dir.join(node);
        std::fs::create_dir_all(&store).unwrap();
        let addr = net.addr(node);
        let binary = std::env::var("ENVELOPES_TEST_NATS_SERVER")
            .unwrap_or_else(|_| "/usr/sbin/nats-server".into());
        let mut cmd = net.command(node, &binary);
        cmd.args([
            "-a",
            &addr,
            "-p",
            "4222",
            "-js",
            "-sd",
            store.to_str().unwrap(),
        ])
        .args(["-n", node, "--cluster_name", "partitions"])
        .args([
            "--cluster",
            &format!("nats://{addr}:6222"),
            "--routes",
            &routes,
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
        net.spawn(&mut cmd);
    }
    for node in nodes {
        let addr = net.addr(node);
        wait_until("NATS", Duration::from_secs(20), || {
            std::net::TcpStream::connect((addr.as_str(), 4222)).is_ok()
        });
    }
    let sink = nodes
        .iter()
        .map(|n| format!("nats://{}:4222", net.addr(n)))
        .collect::<Vec<_>>()
        .join(",");
    let nats_url = format!("nats://{}:4222", net.addr("n1"));
    let prefix = unique("part");
    let stream = prefix.to_uppercase();
    let log = net.dir.join("bridge.log");
    let url = format!("postgres://postgres@{}:5432/{DB}", net.addr("pg1"));
    let mut cmd = net.command("br", &bridge_binary());
    cmd.args([
        "egress",
        "--database-url",
        &url,
        "--name",
        "partitioned",
        "--register",
    ])
    .args([
        "--sink",
        &sink,
        "--nats-replicas",
        "3",
        "--nats-stream",
        &stream,
        "--subject-prefix",
        &prefix,
    ])
    .args(["--format", "json", "--poll-interval-ms", "100"])
    .env_remove("RUST_BACKTRACE")
    .stdout(Stdio::null())
    .stderr(std::fs::File::create(&log).unwrap());
    net.spawn(&mut cmd);

    let stop = Arc::new(AtomicBool::new(false));
    let acks: Arc<Mutex<Vec<Item>>> = Default::default();
    let threads = writers(net.conninfo("pg1", DB), stop.clone(), acks.clone());

    // The schedule: each fault for a few seconds, healed before the next.
    let hold = Duration::from_secs(4);
    let started = Instant::now();
    std::thread::sleep(Duration::from_secs(2));
    net.cut("br", "pg1");
    std::thread::sleep(hold);
    net.heal("br", "pg1");
    for node in nodes {
        net.cut("br", node);
    }
    std::thread::sleep(hold);
    for node in nodes {
        net.heal("br", node);
    }
    // One NATS node isolated from everything else (the stream keeps a quorum).
    for other in ["br", "n1", "n2"] {
        net.cut("n3", other);
    }
    std::thread::sleep(hold);
    for other in ["br", "n1", "n2"] {
        net.heal("n3", other);
    }
    net.cut("pg1", "pg2");
    std::thread::sleep(hold);
    net.heal("pg1", "pg2");
    let degraded = net.degrade("pg1");
    net.degrade("br");
    println!("partitions: degraded links with {degraded}");
    std::thread::sleep(hold);
    net.restore("pg1");
    net.restore("br");
    std::thread::sleep(Duration::from_secs(2));
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        let _ = t.join();
    }
    assert!(
        started.elapsed() < Duration::from_secs(120),
        "the schedule is bounded"
    );
    let acknowledged = acks.lock().unwrap().clone();

    // Drained: everything in the store on the bus.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let store_items = || -> Vec<Item> {
        postgres::Client::connect(&net.conninfo("pg1", DB), postgres::NoTls)
            .unwrap()
            .query(
                "SELECT originator_node_id, originator_sequence_id, originator_envelope
                   FROM envelopes.gateway_envelopes_view",
                &[],
            )
            .unwrap()
            .iter()
            .map(|r| {
                let (node, seq): (i32, i64) = (r.get(0), r.get(1));
                Item {
                    key: node.to_string(),
                    seq,
                    id: format!("{node}:{seq}"),
                    bytes: r.get(2),
                }
            })
            .collect()
    };
    let on_bus = || -> Vec<Item> {
        runtime
            .block_on(read_stream(&nats_url, &stream))
            .iter()
            .filter_map(|(_, p)| serde_json::from_slice::<serde_json::Value>(p).ok())
            .filter_map(|v| {
                let node = v["originator_node_id"].as_i64()?;
                let seq = v["originator_sequence_id"].as_i64()?;
                let hex = v["originator_envelope"].as_str()?;
                let bytes = (0..hex.len())
                    .step_by(2)
                    .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
                    .collect::<Option<Vec<u8>>>()?;
                Some(Item {
                    key: node.to_string(),
                    seq,
                    id: format!("{node}:{seq}"),
                    bytes,
                })
            })
            .collect()
    };
    let text = || std::fs::read_to_string(&log).unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let ids: std::collections::BTreeSet<String> = on_bus().into_iter().map(|i| i.id).collect();
        if store_items().iter().all(|i| ids.contains(&i.id)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the bus never caught up; bridge log:\n{}",
            text()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let counts = check(&acknowledged, &store_items(), &on_bus());
    println!(
        "{}",
        table(
            "partitions, JetStream (a consumer with async-nats):",
            &counts
        )
    );
    let t = total(&counts);
    assert_eq!(
        (t.lost, t.phantom, t.order_violations),
        (0, 0, 0),
        "{counts:?}"
    );
    assert!(t.acknowledged > 100, "{counts:?}");
    // Whether the bridge held a batch back while the standby was cut off
    // depends on whether it read one then (commits wait, invisible, while the
    // standby is away); say it either way.
    println!(
        "bridge held a batch back for the standby: {}",
        text().contains("holding the batch back")
    );
}

/// The active bridge's metric `name` over HTTP at `addr:port` (0 while it does
/// not answer).
fn metric_at(addr: &str, port: u16, name: &str) -> f64 {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect_timeout(
        &format!("{addr}:{port}").parse().unwrap(),
        Duration::from_millis(500),
    ) else {
        return 0.0;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
    let _ = s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    metric(&text, name)
}

/// A network cut between the active bridge and Postgres (blackhole routes both
/// ways: packets vanish, nothing is refused). The bridge sets
/// `idle_session_timeout`, `tcp_user_timeout` and keepalives on its own
/// session (`--session-timeout 5` here), so the server ends the cut-off
/// session and frees the lease: the standby, on another host, takes over
/// within seconds. Nothing is lost. (Before, the README's server-side
/// keepalives did not end the session within a 60 s cut: data unacknowledged
/// on the socket stops keepalives.)
#[test]
fn a_network_cut_between_the_active_bridge_and_postgres_frees_its_lease() {
    let Some(mut net) = Net::start() else {
        eprintln!("partitions: cannot make network namespaces here (not root?): skipped");
        return;
    };
    let pg1 = net.dir.join("pg1");
    std::fs::create_dir_all(&pg1).unwrap();
    run("chown", &["postgres:postgres", pg1.to_str().unwrap()]);
    run(
        "runuser",
        &[
            "-u",
            "postgres",
            "--",
            &format!("{}/initdb", pg_bin()),
            "-D",
            pg1.join("data").to_str().unwrap(),
            "--auth=trust",
            "-U",
            "postgres",
            "-E",
            "UTF8",
            "--locale=C.UTF-8",
        ],
    );
    net.postgres("pg1", &pg1.join("data"), &[]);
    postgres::Client::connect(&net.conninfo("pg1", "postgres"), postgres::NoTls)
        .unwrap()
        .batch_execute(&format!("CREATE DATABASE {DB}"))
        .unwrap();
    postgres::Client::connect(&net.conninfo("pg1", DB), postgres::NoTls)
        .unwrap()
        .batch_execute("CREATE EXTENSION pg_envelopes")
        .unwrap();
    let url = format!("postgres://postgres@{}:5432/{DB}", net.addr("pg1"));
    // The active bridge in "br", the standby in "n1" (another host), each
    // writing JSON lines to a file of its own.
    let start = |net: &mut Net, host: &str, file: &std::path::Path| {
        let log = net.dir.join(format!("bridge-{host}.log"));
        let mut cmd = net.command(host, &bridge_binary());
        cmd.args([
            "egress",
            "--database-url",
            &url,
            "--name",
            "cut",
            "--register",
        ])
        .args(["--sink", &format!("jsonl:{}", file.display())])
        .args(["--poll-interval-ms", "100"])
        .args(["--metrics-addr", &format!("{}:9187", net.addr(host))]);
        if std::env::var_os("ENVELOPES_TEST_BRIDGE_BIN").is_none() {
            cmd.args(["--session-timeout", "5"]);
        }
        cmd.env_remove("RUST_BACKTRACE")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        net.spawn(&mut cmd);
        log
    };
    let (fa, fb) = (net.dir.join("a.jsonl"), net.dir.join("b.jsonl"));
    let log_a = start(&mut net, "br", &fa);
    let (addr_a, addr_b) = (net.addr("br"), net.addr("n1"));
    wait_until("the first bridge active", Duration::from_secs(30), || {
        metric_at(&addr_a, 9187, "envelopes_bridge_active") == 1.0
    });
    let log_b = start(&mut net, "n1", &fb);
    wait_until("the standby's metrics", Duration::from_secs(30), || {
        std::net::TcpStream::connect((addr_b.as_str(), 9187)).is_ok()
    });

    let stop = Arc::new(AtomicBool::new(false));
    let acks: Arc<Mutex<Vec<Item>>> = Default::default();
    let threads = writers(net.conninfo("pg1", DB), stop.clone(), acks.clone());
    std::thread::sleep(Duration::from_secs(2));
    net.cut("br", "pg1");
    let cut = Instant::now();
    let mut taken_over = None;
    while cut.elapsed() < Duration::from_secs(40) {
        if metric_at(&addr_b, 9187, "envelopes_bridge_active") == 1.0 {
            taken_over = Some(cut.elapsed());
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(2));
    net.heal("br", "pg1");
    std::thread::sleep(Duration::from_secs(3));
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    let mut c = postgres::Client::connect(&net.conninfo("pg1", DB), postgres::NoTls).unwrap();
    wait_until("the standby to drain", Duration::from_secs(60), || {
        c.query_one(
            "SELECT COALESCE(envelopes_pending, 0) FROM envelopes.consumer_status
              WHERE consumer = 'cut'",
            &[],
        )
        .map(|r| r.get::<_, i64>(0) == 0)
        .unwrap_or(false)
    });
    let mut delivered = Vec::new();
    for file in [&fa, &fb] {
        for line in std::fs::read_to_string(file).unwrap_or_default().lines() {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            delivered.push(Item {
                key: v["originator_node_id"].to_string(),
                seq: v["originator_sequence_id"].as_i64().unwrap_or(-1),
                id: v["id"].as_str().unwrap_or_default().to_owned(),
                bytes: Vec::new(),
            });
        }
    }
    let acknowledged: Vec<Item> = acks
        .lock()
        .unwrap()
        .iter()
        .map(|i| Item {
            bytes: Vec::new(),
            ..i.clone()
        })
        .collect();
    let counts = check(&acknowledged, &acknowledged, &delivered);
    let all = total(&counts);
    println!(
        "{}\ntaken over {taken_over:?} after the cut",
        table("network cut bridge-postgres", &counts)
    );
    let (log_a, log_b) = (
        std::fs::read_to_string(log_a).unwrap_or_default(),
        std::fs::read_to_string(log_b).unwrap_or_default(),
    );
    assert!(
        taken_over.is_some_and(|t| t < Duration::from_secs(15)),
        "the standby did not take over within 15 s of the cut ({taken_over:?}):\n{log_a}\n{log_b}"
    );
    assert_eq!(all.lost, 0, "{}", table("network cut", &counts));
    assert!(all.acknowledged > 300, "too little was written");
}
