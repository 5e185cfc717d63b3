//! The buses of the end-to-end tests as their own clients see them: a webhook
//! receiver, an MQTT subscriber, Redis XRANGE, AMQP queues, and private
//! instances of each bus for the tests that stop or reconfigure one.

#![allow(dead_code)]

use super::*;
use std::io::{BufRead, BufReader, Read, Write};
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

pub fn amqp_url() -> String {
    std::env::var("ENVELOPES_TEST_AMQP")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

/// How a [`Receiver`] answers a request: status, extra headers, body.
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Answer {
    pub fn status(status: u16) -> Answer {
        Answer {
            status,
            headers: Vec::new(),
            body: String::new(),
        }
    }
}

/// Decides the answer from the request's method, path and body.
pub type Policy = dyn Fn(&str, &str, &[u8]) -> Answer + Send + Sync;

/// A webhook receiver on a free port: records every request's method, path, body
/// and headers, and answers as its policy says. The default policy answers with
/// the status `status` holds (with `Retry-After: 1` for 503 and a body for 400).
pub struct Receiver {
    pub port: u16,
    pub requests: Arc<Mutex<Vec<Request>>>,
    pub status: Arc<AtomicU16>,
    pub stop: Arc<AtomicBool>,
}

#[derive(Clone)]
pub struct Request {
    pub method: String,
    pub path: String,
    pub body: Vec<u8>,
    pub signature: Option<String>,
    pub idempotency_key: Option<String>,
    pub answered: u16,
}

impl Receiver {
    pub fn start() -> Receiver {
        Receiver::start_on(0)
    }

    /// The same on a given port (0: any free one).
    pub fn start_on(port: u16) -> Receiver {
        let status = Arc::new(AtomicU16::new(200));
        let current = status.clone();
        let policy: Arc<Policy> = Arc::new(move |_: &str, _: &str, _: &[u8]| {
            let status = current.load(Ordering::Relaxed);
            Answer {
                status,
                headers: if status == 503 {
                    vec![("Retry-After".into(), "1".into())]
                } else {
                    Vec::new()
                },
                body: if status == 400 {
                    "bad batch".into()
                } else {
                    String::new()
                },
            }
        });
        Receiver::start_with(port, status, policy)
    }

    /// A receiver on a free port answering as `policy` says.
    pub fn with_policy(
        policy: impl Fn(&str, &str, &[u8]) -> Answer + Send + Sync + 'static,
    ) -> Receiver {
        Receiver::start_with(0, Arc::new(AtomicU16::new(200)), Arc::new(policy))
    }

    fn start_with(port: u16, status: Arc<AtomicU16>, policy: Arc<Policy>) -> Receiver {
        let listener = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        {
            let (requests, stop) = (requests.clone(), stop.clone());
            thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((stream, _)) => {
                            let (requests, policy, stop) =
                                (requests.clone(), policy.clone(), stop.clone());
                            thread::spawn(move || serve(stream, &requests, &*policy, &stop));
                        }
                        Err(_) => thread::sleep(Duration::from_millis(5)),
                    }
                }
            });
        }
        Receiver {
            port,
            requests,
            status,
            stop,
        }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/hook", self.port)
    }

    pub fn requests(&self) -> Vec<Request> {
        self.requests.lock().unwrap().clone()
    }

    /// Dedup ids of the batches POSTed and answered 2xx, with repeats.
    pub fn acknowledged_ids(&self) -> Vec<String> {
        self.requests()
            .iter()
            .filter(|r| (200..300).contains(&r.answered) && r.method == "POST")
            .flat_map(|r| {
                serde_json::from_slice::<Vec<serde_json::Value>>(&r.body)
                    .expect("a JSON array")
                    .into_iter()
                    .filter_map(|v| v["id"].as_str().map(str::to_owned))
                    .collect::<Vec<_>>()
            })
            .collect()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// One HTTP/1.1 connection: requests with a Content-Length body, keep-alive;
/// once the receiver is stopped, a request gets the connection closed instead of
/// an answer.
fn serve(
    stream: std::net::TcpStream,
    requests: &Mutex<Vec<Request>>,
    policy: &Policy,
    stop: &AtomicBool,
) {
    stream.set_nonblocking(false).unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut writer = stream;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let mut parts = line.split_whitespace();
        let method = parts.next().unwrap_or("").to_owned();
        let path = parts.next().unwrap_or("").to_owned();
        let mut length = 0usize;
        let (mut signature, mut key) = (None, None);
        loop {
            let mut header = String::new();
            if reader.read_line(&mut header).unwrap_or(0) == 0 {
                return;
            }
            let header = header.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':') {
                let value = value.trim().to_owned();
                match name.to_ascii_lowercase().as_str() {
                    "content-length" => length = value.parse().unwrap_or(0),
                    "x-envelopes-signature" => signature = Some(value),
                    "idempotency-key" => key = Some(value),
                    _ => {}
                }
            }
        }
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let answer = policy(&method, &path, &body);
        requests.lock().unwrap().push(Request {
            method,
            path,
            body,
            signature,
            idempotency_key: key,
            answered: answer.status,
        });
        let mut head = format!("HTTP/1.1 {} X\r\n", answer.status);
        for (name, value) in &answer.headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        let response = format!(
            "{head}Content-Length: {}\r\n\r\n{}",
            answer.body.len(),
            answer.body
        );
        if writer.write_all(response.as_bytes()).is_err() {
            return;
        }
    }
}

/// Subscribes to `PREFIX/#` at QoS 1 and collects the `id` user property of
/// every message. A `persistent` subscriber keeps its session at the broker
/// (clean start off, an hour's expiry), so a broker that keeps sessions on disk
/// queues what is published for it across the broker's own restart; its client
/// reconnects by itself.
pub fn mqtt_subscribe(url: &str, prefix: &str, persistent: bool) -> Arc<Mutex<Vec<String>>> {
    use rumqttc::v5::mqttbytes::v5::Packet;
    use rumqttc::v5::mqttbytes::QoS;
    use rumqttc::v5::{Client, Event, MqttOptions};
    let hostport = url.trim_start_matches("mqtt://");
    let (host, port) = hostport.rsplit_once(':').unwrap();
    let mut options = MqttOptions::new(unique("sub"), host, port.parse().unwrap());
    options.set_keep_alive(Duration::from_secs(30));
    if persistent {
        options.set_clean_start(false);
        options.set_session_expiry_interval(Some(3600));
    }
    let (client, mut connection) = Client::new(options, 1000);
    client
        .subscribe(format!("{prefix}/#"), QoS::AtLeastOnce)
        .unwrap();
    let ids = Arc::new(Mutex::new(Vec::new()));
    let collected = ids.clone();
    let subscribed = Arc::new(AtomicBool::new(false));
    let seen = subscribed.clone();
    thread::spawn(move || {
        let _client = client;
        for event in connection.iter() {
            match event {
                Ok(Event::Incoming(Packet::SubAck(_))) => seen.store(true, Ordering::Relaxed),
                Ok(Event::Incoming(Packet::Publish(p))) => {
                    let id = p.properties.as_ref().and_then(|props| {
                        props
                            .user_properties
                            .iter()
                            .find(|(k, _)| k == "id")
                            .map(|(_, v)| v.clone())
                    });
                    if let Some(id) = id {
                        collected.lock().unwrap().push(id);
                    }
                }
                Ok(_) => {}
                Err(_) => thread::sleep(Duration::from_millis(100)),
            }
        }
    });
    wait_until("the MQTT subscription", Duration::from_secs(10), || {
        subscribed.load(Ordering::Relaxed)
    });
    ids
}

/// The `id` field of every entry of a Redis stream, read with XRANGE.
pub fn redis_ids(runtime: &tokio::runtime::Runtime, url: &str, key: &str) -> Vec<String> {
    let client = redis::Client::open(url).unwrap();
    runtime.block_on(async move {
        let mut c = client.get_multiplexed_async_connection().await.unwrap();
        let entries: Vec<(String, Vec<(String, redis::Value)>)> = redis::cmd("XRANGE")
            .arg(key)
            .arg("-")
            .arg("+")
            .query_async(&mut c)
            .await
            .unwrap();
        entries
            .into_iter()
            .filter_map(|(_, fields)| {
                fields
                    .into_iter()
                    .find(|(k, _)| k == "id")
                    .and_then(|(_, v)| redis::from_redis_value::<String>(v).ok())
            })
            .collect()
    })
}

/// Stops a child with SIGTERM (a clean shutdown) and reaps it.
pub fn terminate(child: &mut std::process::Child) {
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let _ = child.wait();
}

/// A durable topic exchange and a durable queue of the same name bound to it for
/// every routing key under that name.
pub async fn declare_bound_queue(channel: &lapin::Channel, name: &str) {
    use lapin::options::*;
    use lapin::types::FieldTable;
    let durable = ExchangeDeclareOptions {
        durable: true,
        ..Default::default()
    };
    channel
        .exchange_declare(
            name.into(),
            lapin::ExchangeKind::Topic,
            durable,
            FieldTable::default(),
        )
        .await
        .unwrap();
    let durable = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    channel
        .queue_declare(name.into(), durable, FieldTable::default())
        .await
        .unwrap();
    channel
        .queue_bind(
            name.into(),
            name.into(),
            format!("{name}.#").as_str().into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
}

/// Every message in the queue, taken with basic.get: the `message_id` of each,
/// each checked to be persistent.
pub async fn take_ids(channel: &lapin::Channel, queue: &str) -> Vec<String> {
    use lapin::options::BasicGetOptions;
    let mut ids = Vec::new();
    while let Some(message) = channel
        .basic_get(queue.into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
    {
        let props = &message.delivery.properties;
        assert_eq!(props.delivery_mode(), &Some(2), "persistent");
        ids.push(props.message_id().as_ref().unwrap().to_string());
    }
    ids
}

pub async fn connect_amqp(url: &str) -> (lapin::Connection, lapin::Channel) {
    let connection = lapin::Connection::connect(url, lapin::ConnectionProperties::default())
        .await
        .expect("connect to RabbitMQ");
    let channel = connection.create_channel().await.unwrap();
    (connection, channel)
}

pub async fn declare_durable_queue(url: &str, name: &str) {
    let (connection, channel) = connect_amqp(url).await;
    declare_bound_queue(&channel, name).await;
    let _ = connection.close(200, "declared".into()).await;
}

pub async fn drain_queue(url: &str, queue: &str) -> Vec<String> {
    let (connection, channel) = connect_amqp(url).await;
    let ids = take_ids(&channel, queue).await;
    let _ = connection.close(200, "read".into()).await;
    ids
}

/// A private redis-server on its own port (no persistence), with extra
/// command-line settings; killed on drop.
pub struct PrivateRedis {
    pub port: u16,
    extra: Vec<String>,
    child: std::process::Child,
}

impl PrivateRedis {
    pub fn start(extra: &[&str]) -> PrivateRedis {
        let port = free_port();
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        let child = spawn_redis(port, &extra);
        PrivateRedis { port, extra, child }
    }

    /// Kills the server (SIGKILL).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts the server again on the same port with the same settings (and
    /// no data: it keeps none).
    pub fn start_again(&mut self) {
        self.child = spawn_redis(self.port, &self.extra);
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Runs redis-cli against it.
    pub fn cli(&self, args: &[&str]) {
        let status = std::process::Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(args)
            .stdout(std::process::Stdio::null())
            .status()
            .expect("redis-cli");
        assert!(status.success(), "redis-cli {args:?}");
    }
}

fn spawn_redis(port: u16, extra: &[String]) -> std::process::Child {
    let child = std::process::Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .args(extra)
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("start redis-server");
    wait_for_port(port);
    child
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A private mosquitto on its own port with extra configuration lines, which a
/// SIGHUP makes it read again (`reconfigure`); stopped on drop.
pub struct PrivateMosquitto {
    pub port: u16,
    pub dir: std::path::PathBuf,
    child: std::process::Child,
}

impl PrivateMosquitto {
    pub fn start(extra: &str) -> PrivateMosquitto {
        let port = free_port();
        let dir = std::env::temp_dir().join(unique("mosquitto"));
        std::fs::create_dir_all(&dir).unwrap();
        write_mosquitto_conf(&dir, port, extra);
        let child = spawn_mosquitto(&dir, port);
        PrivateMosquitto { port, dir, child }
    }

    /// Kills the broker (SIGKILL: gone without a word to its clients).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts the broker again on the same port with the same configuration.
    pub fn start_again(&mut self) {
        self.child = spawn_mosquitto(&self.dir, self.port);
    }

    pub fn url(&self) -> String {
        format!("mqtt://127.0.0.1:{}", self.port)
    }

    /// Writes a file next to the configuration (an ACL file) and returns its path.
    pub fn file(&self, name: &str, text: &str) -> String {
        let path = self.dir.join(name);
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    }

    /// Replaces the extra configuration lines and has the broker read them again.
    pub fn reconfigure(&self, extra: &str) {
        write_mosquitto_conf(&self.dir, self.port, extra);
        let _ = std::process::Command::new("kill")
            .args(["-HUP", &self.child.id().to_string()])
            .status();
        thread::sleep(Duration::from_millis(500));
    }
}

fn spawn_mosquitto(dir: &std::path::Path, port: u16) -> std::process::Child {
    let child = std::process::Command::new("mosquitto")
        .arg("-c")
        .arg(dir.join("mosquitto.conf"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start mosquitto");
    wait_for_port(port);
    child
}

fn write_mosquitto_conf(dir: &std::path::Path, port: u16, extra: &str) {
    std::fs::write(
        dir.join("mosquitto.conf"),
        format!("listener {port} 127.0.0.1\nallow_anonymous true\nuser root\n{extra}\n"),
    )
    .unwrap();
}

impl Drop for PrivateMosquitto {
    fn drop(&mut self) {
        terminate(&mut self.child);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A RabbitMQ node of the test's own: own node name, AMQP and distribution
/// ports, database, log and configuration files, no plugins. Takes several
/// seconds to start; stopped on drop.
pub struct PrivateRabbit {
    pub port: u16,
    dist: u16,
    node: String,
    dir: std::path::PathBuf,
    child: Option<std::process::Child>,
}

impl PrivateRabbit {
    /// Starts a node with these `rabbitmq.conf` lines (besides its listener).
    pub fn start(conf: &str) -> PrivateRabbit {
        let port = free_port();
        let dist = free_port();
        let dir = std::env::temp_dir().join(unique("rabbit"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("plugins"), "[].\n").unwrap();
        std::fs::write(dir.join("rabbitmq-env.conf"), "").unwrap();
        std::fs::write(
            dir.join("rabbitmq.conf"),
            format!(
                "listeners.tcp.default = 127.0.0.1:{port}\nloopback_users.guest = true\n{conf}\n"
            ),
        )
        .unwrap();
        let node = format!("{}@localhost", unique("refuse"));
        let mut rabbit = PrivateRabbit {
            port,
            dist,
            node,
            dir,
            child: None,
        };
        rabbit.spawn();
        rabbit
    }

    fn spawn(&mut self) {
        let child = self
            .command("/usr/lib/rabbitmq/bin/rabbitmq-server")
            .env("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1")
            .env("RABBITMQ_NODE_PORT", self.port.to_string())
            .env("RABBITMQ_DIST_PORT", self.dist.to_string())
            .env("RABBITMQ_MNESIA_BASE", self.dir.join("mnesia"))
            .env("RABBITMQ_LOG_BASE", self.dir.join("log"))
            .env("RABBITMQ_ENABLED_PLUGINS_FILE", self.dir.join("plugins"))
            .env("RABBITMQ_CONFIG_FILE", self.dir.join("rabbitmq.conf"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start rabbitmq-server");
        self.child = Some(child);
        let port = self.port;
        wait_until(
            "the private RabbitMQ node",
            Duration::from_secs(120),
            || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok(),
        );
    }

    /// Stops the node (rabbitmqctl stop: its connections close at once).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = self
                .command("/usr/lib/rabbitmq/bin/rabbitmqctl")
                .args(["-n", &self.node, "stop"])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status();
            terminate(&mut child);
        }
    }

    /// Starts the node again, on the same ports and data.
    pub fn start_again(&mut self) {
        self.spawn();
    }

    fn command(&self, program: &str) -> std::process::Command {
        let mut cmd = std::process::Command::new(program);
        cmd.current_dir(&self.dir)
            .env("HOME", &self.dir)
            .env("RABBITMQ_CONF_ENV_FILE", self.dir.join("rabbitmq-env.conf"))
            .env("RABBITMQ_NODENAME", &self.node);
        cmd
    }

    pub fn url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.port)
    }

    /// Evaluates an Erlang expression on the node (`rabbitmqctl eval`).
    pub fn eval(&self, expression: &str) {
        let status = self
            .command("/usr/lib/rabbitmq/bin/rabbitmqctl")
            .args(["-n", &self.node, "eval", expression])
            .stdout(std::process::Stdio::null())
            .status()
            .expect("rabbitmqctl");
        assert!(status.success(), "rabbitmqctl eval {expression}");
    }
}

impl Drop for PrivateRabbit {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
